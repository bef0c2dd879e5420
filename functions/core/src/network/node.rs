//! What a node configures, from its profile: the links of
//! [`super::render::NodeNetwork`], tagged or untagged as Metal delivers
//! each VLAN, with the node's addresses. Needs no device: the profile, the
//! VLAN numbers and the addresses (static, or the claims' once allocated)
//! are enough, so the configuration can go into user data before the
//! server exists. Pure.
//!
//! # Tagged or untagged
//! From Metal's mode notes (§4.2): on a Layer3 bond (hybrid-bonded) every
//! VLAN is tagged, `bond0.<vxlan>`. On any other port carrying VLANs (an
//! unbonded member in hybrid or layer2-individual, a layer2 bond) a single
//! VLAN arrives untagged, on the port itself; with two or more, the native
//! VLAN is untagged and the others tagged, `<port>.<vxlan>`.

use super::profile::{PoolName, PortSpec, Profile, VlanRef};
use super::render::{Link, NodeNetwork, Route};
use crate::error::{Error, Result};

/// An address the node should have but that is not known yet (its claim
/// is not bound): the link and the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The link it goes on.
    pub link: String,
    /// The pool it comes from.
    pub pool: String,
}

/// Which of a port's addresses from a pool: of its VLAN `j`, or its
/// elastic IP `k`. Each is one claim per machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The pool address of the port's VLAN `j`.
    Vlan(usize),
    /// The port's elastic IP `k`.
    Elastic(usize),
}

/// The link elastic IPs go on: the loopback. Metal routes an elastic IP to
/// the device's Layer3 bond; on `lo` it is the node's own address without
/// touching the `bond0` configuration Metal's metadata provides.
pub const ELASTIC_LINK: &str = "lo";

/// The node's links for `profile`.
///
/// `vxlan_of` gives a VLAN's number (looked up by the caller: `vxlan`
/// itself, the UUID's VLAN, the pool's VLAN); `address_of(port, slot,
/// pool)` gives the address with prefix allocated to this node for that
/// VLAN or elastic IP, if any. Elastic IPs go on [`ELASTIC_LINK`], last. Addresses not allocated yet are left out and listed
/// as [`Pending`].
///
/// # Errors
/// 422 naming the VLAN whose number is unknown.
pub fn node_network(
    profile: &Profile,
    vxlan_of: &dyn Fn(&VlanRef) -> Option<u16>,
    address_of: &dyn Fn(&str, Slot, &PoolName) -> Option<String>,
) -> Result<(NodeNetwork, Vec<Pending>)> {
    let mut links = Vec::new();
    let mut pending = Vec::new();
    for (i, port) in profile.ports.iter().enumerate() {
        if !port.vlans.is_empty() {
            vlan_links(
                profile,
                i,
                port,
                vxlan_of,
                address_of,
                &mut links,
                &mut pending,
            )?;
        }
    }
    links.extend(elastic_link(profile, address_of, &mut pending));
    Ok((NodeNetwork { links }, pending))
}

/// The links of port `i`'s VLANs, appended to `links`: untagged on the
/// port itself when it has one VLAN or it is the native one (never on a
/// Layer3 bond), else `port.vxlan`; addresses not allocated yet go to
/// `pending`.
///
/// # Errors
/// 422 naming the VLAN whose number is unknown.
fn vlan_links(
    profile: &Profile,
    i: usize,
    port: &PortSpec,
    vxlan_of: &dyn Fn(&VlanRef) -> Option<u16>,
    address_of: &dyn Fn(&str, Slot, &PoolName) -> Option<String>,
    links: &mut Vec<Link>,
    pending: &mut Vec<Pending>,
) -> Result<()> {
    let flags = profile.flags(&port.name);
    let layer3_bond = port.name.starts_with("bond") && !flags.layer2;
    let native = match &port.native_vlan {
        Some(n) => Some(vxlan_of(n).ok_or_else(|| {
            Error::invalid(
                format!("spec.ports[{i}].nativeVLAN"),
                "the VLAN's number is not known",
            )
        })?),
        None => None,
    };
    let single = port.vlans.len() == 1;
    for (j, v) in port.vlans.iter().enumerate() {
        let vxlan = vxlan_of(&v.vlan()).ok_or_else(|| {
            Error::invalid(
                format!("spec.ports[{i}].vlans[{j}]"),
                "the VLAN's number is not known",
            )
        })?;
        let untagged = !layer3_bond && (single || native == Some(vxlan));
        let name = if untagged {
            port.name.clone()
        } else {
            format!("{}.{vxlan}", port.name)
        };
        let mut addresses = Vec::new();
        for a in &v.addresses {
            match (&a.fixed, &a.pool) {
                (Some(s), _) => addresses.push(s.clone()),
                (None, Some(pool)) => match address_of(&port.name, Slot::Vlan(j), pool) {
                    Some(addr) => addresses.push(addr),
                    None => pending.push(Pending {
                        link: name.clone(),
                        pool: pool.name.clone(),
                    }),
                },
                (None, None) => {}
            }
        }
        links.push(Link {
            vlan: (!untagged).then(|| (port.name.clone(), vxlan)),
            name,
            addresses,
            routes: v
                .routes
                .iter()
                .map(|r| Route {
                    to: r.to.clone(),
                    via: r.via.clone(),
                })
                .collect(),
            mtu: v.mtu,
        });
    }
    Ok(())
}

/// The [`ELASTIC_LINK`] with every elastic IP allocated so far (each as
/// the address alone), `None` when there is none; the others go to
/// `pending`.
fn elastic_link(
    profile: &Profile,
    address_of: &dyn Fn(&str, Slot, &PoolName) -> Option<String>,
    pending: &mut Vec<Pending>,
) -> Option<Link> {
    let mut elastic = Vec::new();
    for port in &profile.ports {
        for (k, e) in port.elastic_ips.iter().enumerate() {
            match address_of(&port.name, Slot::Elastic(k), &e.pool) {
                // The address alone (`/32`, `/128`): it is routed to the
                // device, not on a subnet of the node's.
                Some(addr) => elastic.push(match addr.parse::<ipnet::IpNet>() {
                    Ok(n) => ipnet::IpNet::from(n.addr()).to_string(),
                    Err(_) => addr,
                }),
                None => pending.push(Pending {
                    link: ELASTIC_LINK.to_string(),
                    pool: e.pool.name.clone(),
                }),
            }
        }
    }
    (!elastic.is_empty()).then(|| Link {
        name: ELASTIC_LINK.to_string(),
        vlan: None,
        addresses: elastic,
        routes: Vec::new(),
        mtu: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A link as the tests compare it: name, (parent, tag), addresses.
    type Row = (String, Option<(String, u16)>, Vec<String>);

    fn links(spec: serde_json::Value) -> Vec<Row> {
        let p = Profile::from_json(&spec).unwrap();
        p.validate().unwrap();
        let vx = |r: &VlanRef| r.vxlan.or(r.pool.as_ref().map(|_| 1099));
        let addr = |port: &str, slot: Slot, _: &PoolName| match slot {
            Slot::Vlan(j) => Some(format!("192.168.{j}.{}/24", port.len())),
            Slot::Elastic(k) => Some(format!("10.10.1.{}/29", k + 2)),
        };
        let (net, pending) = node_network(&p, &vx, &addr).unwrap();
        assert!(pending.is_empty());
        net.links
            .into_iter()
            .map(|l| (l.name, l.vlan, l.addresses))
            .collect()
    }

    #[test]
    fn vlans_are_tagged_as_metal_delivers_them() {
        // hybrid-bonded: always tagged, even a single VLAN.
        assert_eq!(
            links(json!({"metro": "da", "ports": [{"name": "bond0", "vlans": [{"vxlan": 1010}]}]})),
            [("bond0.1010".into(), Some(("bond0".into(), 1010)), vec![])]
        );
        // hybrid: one VLAN on eth1, untagged.
        assert_eq!(
            links(
                json!({"metro": "da", "ports": [{"name": "eth1", "bonded": false,
                "vlans": [{"vxlan": 1010, "addresses": [{"static": "192.168.5.2/24"}]}]}]})
            ),
            [("eth1".into(), None, vec!["192.168.5.2/24".into()])]
        );
        // layer2-bonded with a native VLAN: it untagged, the other tagged.
        assert_eq!(
            links(
                json!({"metro": "da", "ports": [{"name": "bond0", "layer2": true,
                "vlans": [{"vxlan": 1010}, {"pool": {"name": "vrf"}, "addresses": [{"pool": {"name": "vrf"}}]}],
                "nativeVLAN": {"vxlan": 1010}}]})
            ),
            [
                ("bond0".into(), None, vec![]),
                (
                    "bond0.1099".into(),
                    Some(("bond0".into(), 1099)),
                    vec!["192.168.1.5/24".into()]
                )
            ]
        );
        // Elastic IPs: on the loopback, after the VLANs.
        assert_eq!(
            links(json!({"metro": "da", "ports": [{"name": "bond0",
                "elasticIPs": [{"pool": {"name": "vrf"}}, {"pool": {"name": "vrf"}}],
                "vlans": [{"vxlan": 1010}]}]})),
            [
                ("bond0.1010".into(), Some(("bond0".into(), 1010)), vec![]),
                (
                    "lo".into(),
                    None,
                    vec!["10.10.1.2/32".into(), "10.10.1.3/32".into()]
                )
            ]
        );
        // layer2-individual: two VLANs without a native VLAN, both tagged.
        assert_eq!(
            links(
                json!({"metro": "da", "ports": [{"name": "bond0", "layer2": true, "bonded": false},
                {"name": "eth0", "vlans": [{"vxlan": 1010}, {"vxlan": 1011}]}]})
            ),
            [
                ("eth0.1010".into(), Some(("eth0".into(), 1010)), vec![]),
                ("eth0.1011".into(), Some(("eth0".into(), 1011)), vec![])
            ]
        );
    }

    #[test]
    fn addresses_not_allocated_yet_are_pending() {
        let p = Profile::from_json(&json!({"metro": "da", "ports": [{"name": "bond0",
            "elasticIPs": [{"pool": {"name": "vrf"}}],
            "vlans": [{"vxlan": 1010, "addresses": [{"pool": {"name": "nodes"}}, {"static": "10.9.0.5/24"}]}]}]}))
        .unwrap();
        let (net, pending) = node_network(
            &p,
            &|r: &VlanRef| r.vxlan,
            &|_: &str, _: Slot, _: &PoolName| None,
        )
        .unwrap();
        assert_eq!(net.links[0].addresses, ["10.9.0.5/24"]);
        assert_eq!(net.links.len(), 1, "no lo link without an elastic IP");
        assert_eq!(
            pending,
            [
                Pending {
                    link: "bond0.1010".into(),
                    pool: "nodes".into()
                },
                Pending {
                    link: "lo".into(),
                    pool: "vrf".into()
                }
            ]
        );
        // A VLAN whose number is unknown names its field.
        let e = node_network(
            &p,
            &|_: &VlanRef| None,
            &|_: &str, _: Slot, _: &PoolName| None,
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("spec.ports[0].vlans[0]"));
    }
}
