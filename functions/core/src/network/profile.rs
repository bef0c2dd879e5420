//! The network profile: a machine's desired Layer2 / Hybrid networking,
//! **per port** (netplan-inspired), and the rules that make it something
//! Metal can do. No device-wide network type: each bond's mode is derived
//! from its ports ([`Profile::modes`]), and impossible combinations are
//! refused naming the field ([`Profile::validate`]).
//!
//! ```yaml
//! spec:
//!   metro: da
//!   ports:
//!   - name: bond0             # stays Layer3: Metal's addresses, and
//!     elasticIPs:             # a /32 of a VRF-backed pool assigned to the device
//!     - pool: {name: vrf}
//!   - name: eth1              # eth1 out of the bond, two VLANs: hybrid
//!     bonded: false
//!     vlans:
//!     - vxlan: 1010
//!       addresses: [{pool: {name: storage}}]     # a claim per machine and VLAN
//!     - pool: {name: vrf}     # the VLAN of a VRF-backed pool
//!       addresses: [{static: 10.10.1.5/29}]
//!     nativeVLAN: {vxlan: 1010}
//! ```
//!
//! Ports: `bond0` (`eth0` + `eth1` on 2-port devices; `eth0` + `eth2` on
//! 4-port ones) and `bond1` (`eth1` + `eth3`, 4-port devices); a port not
//! named keeps its defaults (bonded, Layer3, no VLANs).

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::cloud::CloudKind;
use crate::error::{Error, Result};
use crate::ipam::pool::{PoolId, PoolKind};
use crate::ipam::vrf::is_uuid;
use crate::kube::names;

/// The kind of the namespaced profile object.
pub const KIND: &str = "MetalNetworkProfile";

/// Annotation on a Machine (or its infrastructure machine) naming its
/// `MetalNetworkProfile` (see [`crate::capi::network`]).
pub const PROFILE_ANNOTATION: &str = "ipam.metal-ipam.dev/network-profile";

/// Largest MTU Metal carries on a VLAN.
pub const MAX_MTU: u32 = 9000;
/// Smallest MTU accepted (IPv6's minimum).
pub const MIN_MTU: u32 = 1280;

/// A port's network mode as Metal names it (on bond ports:
/// `network_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Bonded, Layer3, no VLANs.
    Layer3,
    /// Bonded, Layer3, tagged VLANs on the bond.
    HybridBonded,
    /// Layer3 on the bond, its second member out of the bond carrying VLANs.
    Hybrid,
    /// Layer2 on the bond, bonded.
    Layer2Bonded,
    /// Layer2, every member on its own.
    Layer2Individual,
}

impl Mode {
    /// Metal's name: `layer3`, `hybrid-bonded`, `hybrid`, `layer2-bonded`,
    /// `layer2-individual`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Layer3 => "layer3",
            Mode::HybridBonded => "hybrid-bonded",
            Mode::Hybrid => "hybrid",
            Mode::Layer2Bonded => "layer2-bonded",
            Mode::Layer2Individual => "layer2-individual",
        }
    }

    /// Parses Metal's name.
    pub fn parse(s: &str) -> Option<Mode> {
        [
            Mode::Layer3,
            Mode::HybridBonded,
            Mode::Hybrid,
            Mode::Layer2Bonded,
            Mode::Layer2Individual,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
    }
}

/// A pool named by a profile (our kinds; namespaced by default).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolName {
    /// `MetalIPPool` (default) or `GlobalMetalIPPool`.
    #[serde(default)]
    pub kind: Option<String>,
    /// The pool's name.
    pub name: String,
}

impl PoolName {
    /// The pool it names, for a profile in `namespace`.
    pub fn id(&self, namespace: &str) -> PoolId {
        match self.kind.as_deref() {
            Some("GlobalMetalIPPool") => PoolId::global(&self.name),
            _ => PoolId::of(PoolKind::Namespaced, namespace, &self.name),
        }
    }
}

/// Which VLAN: by UUID, by number in the profile's metro, or the VLAN of a
/// VRF-backed pool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VlanRef {
    /// The VLAN's UUID.
    #[serde(default)]
    pub id: Option<String>,
    /// The VLAN number (in `spec.metro`).
    #[serde(default)]
    pub vxlan: Option<u16>,
    /// The VLAN of this VRF-backed pool.
    #[serde(default)]
    pub pool: Option<PoolName>,
}

/// Where one address of a VLAN comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressSpec {
    /// One of our pools: a claim per machine and VLAN.
    #[serde(default)]
    pub pool: Option<PoolName>,
    /// A fixed address with its prefix length (`192.168.10.5/24`).
    #[serde(default, rename = "static")]
    pub fixed: Option<String>,
}

/// A route the node adds on a VLAN.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Destination network.
    pub to: String,
    /// Next hop.
    pub via: String,
}

/// One VLAN of a port, with its addresses. (Its first three fields are
/// [`VlanRef`]'s, repeated rather than `#[serde(flatten)]`ed: serde's
/// `deny_unknown_fields` does not work through `flatten`.)
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VlanSpec {
    /// The VLAN's UUID.
    #[serde(default)]
    pub id: Option<String>,
    /// The VLAN number (in `spec.metro`).
    #[serde(default)]
    pub vxlan: Option<u16>,
    /// The VLAN of this VRF-backed pool.
    #[serde(default)]
    pub pool: Option<PoolName>,
    /// Its addresses on this node.
    #[serde(default)]
    pub addresses: Vec<AddressSpec>,
    /// Routes through it.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// Its MTU on the node.
    #[serde(default)]
    pub mtu: Option<u32>,
}

impl VlanSpec {
    /// Which VLAN this is.
    pub fn vlan(&self) -> VlanRef {
        VlanRef {
            id: self.id.clone(),
            vxlan: self.vxlan,
            pool: self.pool.clone(),
        }
    }
}

/// An elastic IP of the machine: one address (`/32`, `/128`) from a
/// VRF-backed pool, assigned to the device in Metal (the assign step, as
/// for any claim of such a pool) and routed to it. Machine-scoped: Metal
/// binds it to `bond0` (or `eth0`) in Layer3 and hybrid modes only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticIpSpec {
    /// The pool (VRF-backed) it comes from: a claim per machine and entry.
    pub pool: PoolName,
}

/// One port's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortSpec {
    /// `bond0`, `bond1`, `eth0`…`eth3`.
    pub name: String,
    /// In its bond (default `true`).
    #[serde(default)]
    pub bonded: Option<bool>,
    /// Layer2 (bond ports only; default `false`).
    #[serde(default)]
    pub layer2: Option<bool>,
    /// Its VLANs.
    #[serde(default)]
    pub vlans: Vec<VlanSpec>,
    /// The VLAN carried untagged (one of `vlans`, which must be two or
    /// more).
    #[serde(default, rename = "nativeVLAN")]
    pub native_vlan: Option<VlanRef>,
    /// Elastic IPs (`bond0` or `eth0`, in Layer3 or hybrid modes).
    #[serde(default, rename = "elasticIPs")]
    pub elastic_ips: Vec<ElasticIpSpec>,
}

/// `spec` of a network profile.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Profile {
    /// The metro of VLANs named by number (lower-case code): a Metal
    /// profile.
    #[serde(default)]
    pub metro: Option<String>,
    /// The location of networks named by number (`vxlan`: the network's
    /// `vlanId`), a phoenixNAP location code (`PHX`): a phoenixNAP
    /// profile ([`Profile::validate_for`]).
    #[serde(default)]
    pub location: Option<String>,
    /// The ports described; others keep their defaults.
    #[serde(default)]
    pub ports: Vec<PortSpec>,
    /// The device's Ethernet ports, once known ([`Profile::on_device`]):
    /// they decide the bonds' members, not the port names the profile
    /// happens to use.
    #[serde(skip)]
    device_ports: Option<usize>,
}

/// A bond and its members on a device with `eth_ports` ports (2 or 4).
///
/// ```
/// use metal_ipam_core::network::profile::bonds;
/// assert_eq!(bonds(2), vec![("bond0", vec!["eth0", "eth1"])]);
/// assert_eq!(bonds(4), vec![("bond0", vec!["eth0", "eth2"]), ("bond1", vec!["eth1", "eth3"])]);
/// ```
pub fn bonds(eth_ports: usize) -> Vec<(&'static str, Vec<&'static str>)> {
    if eth_ports >= 4 {
        vec![
            ("bond0", vec!["eth0", "eth2"]),
            ("bond1", vec!["eth1", "eth3"]),
        ]
    } else {
        vec![("bond0", vec!["eth0", "eth1"])]
    }
}

/// The desired flags of one port, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFlags {
    /// In its bond.
    pub bonded: bool,
    /// Layer2 (bond ports).
    pub layer2: bool,
}

impl Profile {
    /// Parses a profile's `spec`.
    ///
    /// # Errors
    /// 422 naming the field: a wrong type or an unknown field.
    pub fn from_json(spec: &Value) -> Result<Profile> {
        serde_path_to_error::deserialize(spec).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "spec".to_string()
            } else {
                format!("spec.{path}")
            };
            Error::invalid(field, e.into_inner().to_string())
        })
    }

    /// The profile as it applies to a device with `eth_ports` Ethernet
    /// ports (on a 4-port device `eth1` is `bond1`'s, not `bond0`'s); check
    /// it again with [`Profile::validate`].
    pub fn on_device(&self, eth_ports: usize) -> Profile {
        Profile {
            device_ports: Some(eth_ports),
            ..self.clone()
        }
    }

    /// The number of Ethernet ports: the device's when known
    /// ([`Profile::on_device`]), else what the profile implies: 4 when it
    /// names `bond1`, `eth2` or `eth3`, else 2.
    pub fn eth_ports(&self) -> usize {
        if let Some(n) = self.device_ports {
            return n;
        }
        let four = self
            .ports
            .iter()
            .any(|p| matches!(p.name.as_str(), "bond1" | "eth2" | "eth3"));
        if four {
            4
        } else {
            2
        }
    }

    /// The port named `name`, if described.
    pub fn port(&self, name: &str) -> Option<&PortSpec> {
        self.ports.iter().find(|p| p.name == name)
    }

    /// The flags of port `name` (a member's `bonded` defaults to its
    /// bond's).
    pub fn flags(&self, name: &str) -> PortFlags {
        let bond = bonds(self.eth_ports())
            .into_iter()
            .find(|(_, members)| members.contains(&name))
            .map(|(b, _)| b);
        let own = self.port(name);
        let bond_bonded = bond
            .and_then(|b| self.port(b))
            .and_then(|p| p.bonded)
            .unwrap_or(true);
        PortFlags {
            bonded: own.and_then(|p| p.bonded).unwrap_or(if bond.is_some() {
                bond_bonded
            } else {
                true
            }),
            layer2: own.and_then(|p| p.layer2).unwrap_or(false),
        }
    }

    fn has_vlans(&self, name: &str) -> bool {
        self.port(name).is_some_and(|p| !p.vlans.is_empty())
    }

    /// Each bond's mode, derived from its ports (after [`Profile::validate`]).
    pub fn modes(&self) -> BTreeMap<&'static str, Mode> {
        bonds(self.eth_ports())
            .into_iter()
            .map(|(bond, members)| {
                let b = self.flags(bond);
                let mode = if b.layer2 {
                    if b.bonded {
                        Mode::Layer2Bonded
                    } else {
                        Mode::Layer2Individual
                    }
                } else if members.iter().any(|m| !self.flags(m).bonded) {
                    Mode::Hybrid
                } else if self.has_vlans(bond) {
                    Mode::HybridBonded
                } else {
                    Mode::Layer3
                };
                (bond, mode)
            })
            .collect()
    }

    /// Checks what Metal can do and what the node can be told:
    /// - port names are `bond0`, `bond1`, `eth0`–`eth3`, each once;
    /// - `layer2` only on bond ports;
    /// - a Layer3 bond stays bonded, and so does its first member (it
    ///   carries the Layer3 addresses); only the second member may leave it
    ///   (hybrid);
    /// - a layer2 bond's members follow it (all bonded or all individual);
    /// - VLANs go where traffic is: on a bonded bond port, on an unbonded
    ///   member; never on a bonded member or an unbonded bond; in hybrid
    ///   mode not on the bond;
    /// - a native VLAN is one of the port's VLANs, which are two or more,
    ///   and not on a Layer3 bond (hybrid-bonded tags every VLAN);
    /// - each VLAN is named one way (`id` UUID, `vxlan` 2–3999 with
    ///   `spec.metro`, or `pool`), once per port;
    /// - each address is a pool or a static `address/prefix`; routes are
    ///   `network` via `address` of one family; MTU 1280–9000;
    /// - elastic IPs only on `bond0` or `eth0`, with `bond0` in Layer3 or
    ///   hybrid mode (Metal routes them to the Layer3 bond).
    ///
    /// # Errors
    /// 422 naming the first offending field.
    pub fn validate(&self) -> Result<()> {
        if self.metro.is_some() && self.location.is_some() {
            return Err(Error::invalid(
                "spec.location",
                "a profile is for one cloud: spec.metro (Metal) or spec.location (phoenixNAP), not both",
            ));
        }
        if self.location.is_some() {
            return self.validate_for(CloudKind::Phoenixnap);
        }
        if let Some(m) = &self.metro {
            if m.len() != 2 || !m.chars().all(|c| c.is_ascii_lowercase()) {
                return Err(Error::invalid(
                    "spec.metro",
                    format!("{m:?} is not a lower-case metro code (e.g. \"da\")"),
                ));
            }
        }
        let groups = bonds(self.eth_ports());
        let mut seen: Vec<&str> = Vec::new();
        for (i, p) in self.ports.iter().enumerate() {
            let name = p.name.as_str();
            let known = groups
                .iter()
                .any(|(b, members)| *b == name || members.contains(&name));
            if !known {
                return Err(Error::invalid(
                    format!("spec.ports[{i}].name"),
                    format!(
                        "{name:?} is not a port of a {}-port device (bond0, bond1, eth0–eth3)",
                        self.eth_ports()
                    ),
                ));
            }
            if seen.contains(&name) {
                return Err(Error::invalid(
                    format!("spec.ports[{i}].name"),
                    format!("{name} is described twice"),
                ));
            }
            seen.push(name);
            self.check_port(i, p)?;
        }
        for (bond, members) in &groups {
            self.check_bonding(bond, members)?;
            self.check_bond_vlans(bond, members)?;
        }
        Ok(())
    }

    /// The rules of [`Profile::validate`] for a device on `cloud`. On Metal
    /// the profile names no `spec.location`. On phoenixNAP a server's
    /// networks are tagged on `bond0`, which phoenixNAP configures:
    /// - `spec.location` is a location code (three capital letters), and
    ///   `spec.metro` is refused;
    /// - only `bond0` is described, and neither `bonded: false` nor
    ///   `layer2: true` (phoenixNAP has no bonds to convert and no port
    ///   modes), nor a `nativeVLAN` (every network is tagged), nor
    ///   `elasticIPs` (routed from Metal VRFs: phoenixNAP has none; a
    ///   public network's pool address goes in `vlans[].addresses`);
    /// - a network named by `id` is a phoenixNAP id (24 lower-case hex digits), by
    ///   `vxlan` its `vlanId` in `spec.location`, or by `pool` a
    ///   phoenixNAP-backed pool's network; addresses and routes as on
    ///   Metal.
    ///
    /// ```
    /// use metal_ipam_core::cloud::CloudKind;
    /// use metal_ipam_core::network::profile::Profile;
    /// let p = |spec: serde_json::Value| Profile::from_json(&spec).unwrap();
    /// let ok = p(serde_json::json!({"location": "PHX", "ports": [{"name": "bond0", "vlans": [
    ///     {"pool": {"name": "storage"}, "addresses": [{"pool": {"name": "storage"}}]},
    ///     {"id": "60473a6115e34466c9f8f083", "addresses": [{"static": "10.3.0.5/24"}]}]}]}));
    /// ok.validate().unwrap();
    /// let e = p(serde_json::json!({"location": "PHX", "ports": [{"name": "bond0", "layer2": true}]}))
    ///     .validate().unwrap_err();
    /// assert_eq!((e.status(), e.field()), (422, Some("spec.ports[0].layer2")));
    /// let metal = p(serde_json::json!({"ports": [{"name": "eth1", "bonded": false}]}));
    /// let e = metal.validate_for(CloudKind::Phoenixnap).unwrap_err();
    /// assert_eq!(e.field(), Some("spec.ports[0].name"));
    /// ```
    ///
    /// # Errors
    /// 422 naming the first offending field.
    pub fn validate_for(&self, cloud: CloudKind) -> Result<()> {
        match cloud {
            CloudKind::Metal => {
                if self.location.is_some() {
                    return Err(Error::invalid(
                        "spec.location",
                        "spec.location names a phoenixNAP location; this machine's device is on Metal (spec.metro)",
                    ));
                }
                self.validate()
            }
            CloudKind::Phoenixnap => self.validate_phoenixnap(),
        }
    }

    fn validate_phoenixnap(&self) -> Result<()> {
        const WHY: &str = "on phoenixNAP";
        if self.metro.is_some() {
            return Err(Error::invalid(
                "spec.metro",
                "spec.metro names a Metal metro; a phoenixNAP server's networks are in spec.location (e.g. \"PHX\")",
            ));
        }
        if let Some(l) = &self.location {
            if l.len() != 3 || !l.chars().all(|c| c.is_ascii_uppercase()) {
                return Err(Error::invalid(
                    "spec.location",
                    format!("{l:?} is not a phoenixNAP location code (three capital letters, e.g. \"PHX\")"),
                ));
            }
        }
        let mut seen = false;
        for (i, p) in self.ports.iter().enumerate() {
            let f = |k: &str| format!("spec.ports[{i}].{k}");
            let refuse = if p.name != "bond0" {
                Some((f("name"), format!("{WHY} a server's networks are tagged on bond0, which phoenixNAP configures: there is no {:?} to describe", p.name)))
            } else if seen {
                Some((f("name"), "bond0 is described twice".to_string()))
            } else if p.bonded == Some(false) {
                Some((
                    f("bonded"),
                    format!("{WHY} there are no bonds to convert: bond0 stays bonded"),
                ))
            } else if p.layer2 == Some(true) {
                Some((f("layer2"), format!("{WHY} there are no port modes (Layer2, hybrid): networks are tagged on bond0")))
            } else if p.native_vlan.is_some() {
                Some((
                    f("nativeVLAN"),
                    format!("{WHY} every network is tagged: there is no native VLAN"),
                ))
            } else if !p.elastic_ips.is_empty() {
                Some((f("elasticIPs"), format!("elastic IPs are routed from Metal VRFs; {WHY} there are none: a public network's pool address goes in vlans[].addresses")))
            } else {
                None
            };
            if let Some((field, msg)) = refuse {
                return Err(Error::invalid(field, msg));
            }
            seen = true;
            self.check_vlans(i, p, true)?;
        }
        Ok(())
    }

    /// Port `i`'s own rules: `layer2` only on a bond, its VLANs, its
    /// elastic IPs' pools and where elastic IPs may go.
    fn check_port(&self, i: usize, p: &PortSpec) -> Result<()> {
        let f = |k: &str| format!("spec.ports[{i}].{k}");
        let name = p.name.as_str();
        if p.layer2.is_some() && !name.starts_with("bond") {
            return Err(Error::invalid(
                f("layer2"),
                "layer2 is set on bond ports only (a member follows its bond)",
            ));
        }
        self.check_vlans(i, p, false)?;
        for (k, e) in p.elastic_ips.iter().enumerate() {
            check_pool(&e.pool, &f(&format!("elasticIPs[{k}].pool")))?;
        }
        if p.elastic_ips.is_empty() {
            return Ok(());
        }
        let mode = self.modes()["bond0"];
        let refuse = if !matches!(name, "bond0" | "eth0") {
            Some(format!(
                "elastic IPs are bound to bond0 or eth0, not {name}"
            ))
        } else if matches!(mode, Mode::Layer2Bonded | Mode::Layer2Individual) {
            Some(format!(
                "elastic IPs need bond0 in Layer3 or hybrid mode; it is {}",
                mode.as_str()
            ))
        } else {
            None
        };
        match refuse {
            Some(msg) => Err(Error::invalid(f("elasticIPs"), msg)),
            None => Ok(()),
        }
    }

    /// The field `k` of port `name`'s entry (entry 0 when it has none).
    fn port_field(&self, name: &str, k: &str) -> String {
        let i = self.ports.iter().position(|p| p.name == name).unwrap_or(0);
        format!("spec.ports[{i}].{k}")
    }

    /// A bond's bonding rules: a Layer3 bond and its first member stay
    /// bonded; a layer2 bond's members follow it.
    fn check_bonding(&self, bond: &str, members: &[&str]) -> Result<()> {
        let b = self.flags(bond);
        if !b.layer2 {
            if !b.bonded {
                return Err(Error::invalid(
                    self.port_field(bond, "bonded"),
                    format!("a Layer3 {bond} cannot be unbonded (set layer2: true for layer2-individual)"),
                ));
            }
            if !self.flags(members[0]).bonded {
                return Err(Error::invalid(
                    self.port_field(members[0], "bonded"),
                    format!("{} carries {bond}'s Layer3 addresses and stays bonded; only {} may leave the bond (hybrid)", members[0], members[1]),
                ));
            }
        } else if members.iter().any(|m| self.flags(m).bonded != b.bonded) {
            let m = members
                .iter()
                .find(|m| self.flags(m).bonded != b.bonded)
                .unwrap_or(&members[0]);
            return Err(Error::invalid(
                self.port_field(m, "bonded"),
                format!(
                    "the members of a layer2 {bond} are all bonded or all individual, as {bond} is"
                ),
            ));
        }
        Ok(())
    }

    /// Where a bond's and its members' VLANs may go: on a bonded bond
    /// (not in hybrid mode) or an unbonded member; a native VLAN not on a
    /// Layer3 bond.
    fn check_bond_vlans(&self, bond: &str, members: &[&str]) -> Result<()> {
        let mode = self.modes()[bond];
        for port in std::iter::once(bond).chain(members.iter().copied()) {
            let flags = self.flags(port);
            let Some(spec) = self.port(port) else {
                continue;
            };
            if spec.vlans.is_empty() {
                continue;
            }
            let is_bond = port == bond;
            let refuse = match (is_bond, flags.bonded) {
                (true, false) => Some(format!("{port} is not bonded: VLANs go on its members")),
                (false, true) => Some(format!("{port} is in {bond}: its VLANs go on {bond}")),
                (true, true) if mode == Mode::Hybrid => Some(format!(
                    "in hybrid mode {bond} stays Layer3 without VLANs; they go on the unbonded member"
                )),
                _ => None,
            };
            if let Some(msg) = refuse {
                return Err(Error::invalid(self.port_field(port, "vlans"), msg));
            }
            if spec.native_vlan.is_some() && is_bond && !flags.layer2 {
                return Err(Error::invalid(
                    self.port_field(port, "nativeVLAN"),
                    "hybrid-bonded tags every VLAN: no native VLAN on a Layer3 bond",
                ));
            }
        }
        Ok(())
    }

    /// Port `i`'s VLANs (`pnap`: phoenixNAP's networks) and their
    /// addresses, routes and MTUs.
    fn check_vlans(&self, i: usize, p: &PortSpec, pnap: bool) -> Result<()> {
        let mut named: Vec<String> = Vec::new();
        for (j, v) in p.vlans.iter().enumerate() {
            let field = format!("spec.ports[{i}].vlans[{j}]");
            let key = self.check_ref(&v.vlan(), &field, pnap)?;
            if named.contains(&key) {
                return Err(Error::invalid(
                    field,
                    format!("VLAN {key} is named twice on {}", p.name),
                ));
            }
            named.push(key);
            if let Some(m) = v.mtu {
                if !(MIN_MTU..=MAX_MTU).contains(&m) {
                    return Err(Error::invalid(
                        format!("{field}.mtu"),
                        format!("{m} is outside {MIN_MTU}–{MAX_MTU}"),
                    ));
                }
            }
            for (k, a) in v.addresses.iter().enumerate() {
                let af = format!("{field}.addresses[{k}]");
                match (&a.pool, &a.fixed) {
                    (Some(pool), None) => check_pool(pool, &format!("{af}.pool"))?,
                    (None, Some(s)) => {
                        s.parse::<IpNet>().map_err(|_| {
                            Error::invalid(
                                format!("{af}.static"),
                                format!("{s:?} is not address/prefix"),
                            )
                        })?;
                    }
                    _ => return Err(Error::invalid(af, "give exactly one of pool or static")),
                }
            }
            for (k, r) in v.routes.iter().enumerate() {
                let rf = format!("{field}.routes[{k}]");
                let to: IpNet = r.to.parse().map_err(|_| {
                    Error::invalid(format!("{rf}.to"), format!("{:?} is not a network", r.to))
                })?;
                let via: std::net::IpAddr = r.via.parse().map_err(|_| {
                    Error::invalid(
                        format!("{rf}.via"),
                        format!("{:?} is not an address", r.via),
                    )
                })?;
                if to.addr().is_ipv4() != via.is_ipv4() {
                    return Err(Error::invalid(
                        format!("{rf}.via"),
                        "the next hop is not of the destination's family",
                    ));
                }
            }
        }
        if let Some(n) = &p.native_vlan {
            let field = format!("spec.ports[{i}].nativeVLAN");
            let key = self.check_ref(n, &field, pnap)?;
            if !named.contains(&key) {
                return Err(Error::invalid(
                    field,
                    format!("VLAN {key} is not among {}'s VLANs", p.name),
                ));
            }
            if named.len() < 2 {
                return Err(Error::invalid(
                    field,
                    "a native VLAN needs two or more VLANs on the port (a single VLAN is untagged anyway)",
                ));
            }
        }
        Ok(())
    }

    /// Checks a VLAN reference (`pnap`: a phoenixNAP network); returns a
    /// key naming it (`id:…`, `vxlan:…`, `pool:…`).
    fn check_ref(&self, v: &VlanRef, field: &str, pnap: bool) -> Result<String> {
        match (&v.id, v.vxlan, &v.pool) {
            (Some(id), None, None) => {
                let (ok, what) = if pnap {
                    (
                        is_pnap_id(id),
                        "a phoenixNAP network id (24 lower-case hex digits)",
                    )
                } else {
                    (is_uuid(id), "a UUID")
                };
                if !ok {
                    return Err(Error::invalid(
                        format!("{field}.id"),
                        format!("{id:?} is not {what}"),
                    ));
                }
                Ok(format!("id:{}", id.to_ascii_lowercase()))
            }
            (None, Some(n), None) => {
                let (max, place, needs) = if pnap {
                    (
                        4094,
                        &self.location,
                        "spec.location (numbers are unique per location only)",
                    )
                } else {
                    (
                        3999,
                        &self.metro,
                        "spec.metro (numbers are unique per metro only)",
                    )
                };
                if !(2..=max).contains(&n) {
                    return Err(Error::invalid(
                        format!("{field}.vxlan"),
                        format!("{n} is outside 2–{max}"),
                    ));
                }
                if place.is_none() {
                    return Err(Error::invalid(
                        format!("{field}.vxlan"),
                        format!("a VLAN named by number needs {needs}"),
                    ));
                }
                Ok(format!("vxlan:{n}"))
            }
            (None, None, Some(p)) => {
                check_pool(p, &format!("{field}.pool"))?;
                Ok(format!(
                    "pool:{}/{}",
                    p.kind.as_deref().unwrap_or("MetalIPPool"),
                    p.name
                ))
            }
            _ => Err(Error::invalid(
                field,
                "name the VLAN exactly one way: id, vxlan or pool",
            )),
        }
    }

    /// Every pool the profile names (VLANs and addresses), each once.
    pub fn pools(&self) -> Vec<&PoolName> {
        let mut out: Vec<&PoolName> = Vec::new();
        for p in &self.ports {
            for v in &p.vlans {
                let names = v
                    .pool
                    .iter()
                    .chain(v.addresses.iter().filter_map(|a| a.pool.as_ref()));
                for n in names {
                    if !out.contains(&n) {
                        out.push(n);
                    }
                }
            }
        }
        out
    }
}

/// Whether `id` has the form of a phoenixNAP id (24 lower-case hex digits).
pub fn is_pnap_id(id: &str) -> bool {
    id.len() == 24
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn check_pool(p: &PoolName, field: &str) -> Result<()> {
    if let Some(k) = &p.kind {
        if PoolKind::from_kind_name(k).is_some_and(PoolKind::is_prefix) {
            // A VLAN interface needs a host address of the VLAN's subnet;
            // a prefix pool hands out networks, and Metal routes none of
            // them to a VLAN (docs/prefix-pools.md, "Network profiles").
            return Err(Error::invalid(
                format!("{field}.kind"),
                format!("{k:?} hands out sub-prefixes, not host addresses: a VLAN's address comes from a MetalIPPool or GlobalMetalIPPool"),
            ));
        }
        if k != "MetalIPPool" && k != "GlobalMetalIPPool" {
            return Err(Error::invalid(
                format!("{field}.kind"),
                format!("{k:?} is not MetalIPPool or GlobalMetalIPPool"),
            ));
        }
    }
    names::check_subdomain(&p.name).map_err(|m| Error::invalid(format!("{field}.name"), m))
}
