//! The node's **whole** network configuration as OpenStack
//! `network_data.json` (the config-drive / OpenStack metadata format
//! cloud-init's ConfigDrive and OpenStack datasources read): the device's
//! physical ports, its bonds with their members, Metal's Layer3 addresses,
//! and the links metal-ipam adds ([`NodeNetwork`]). Owns the [`Host`] (what
//! the device is: ports, MACs, bonds, Layer3 addresses, resolvers), how it
//! is read from the profile and a Metal device ([`host`]), and the JSON
//! ([`render`]). Pure: no I/O.
//!
//! # Unlike the other formats
//! netplan, ifupdown, cloud-init user data and the shell script only
//! **add** links to what Metal's provisioning configured. A datasource's
//! `network_data.json` **replaces** the node's network configuration:
//! cloud-init converts it to its network config v1 and renders that as
//! the whole netplan / ENI / networkd configuration. So everything the
//! node needs is rendered, per bond mode (from the profile, as applied to
//! the device's ports):
//!
//! | mode | links | networks |
//! |---|---|---|
//! | `layer3` | `phy` per port, `bond` of both | Metal's Layer3 addresses on the bond |
//! | `hybrid-bonded` | the same, `vlan` links on the bond | Layer3 on the bond, pool / static addresses on the VLANs |
//! | `hybrid` | `phy` per port, `bond` of the first member only | Layer3 on the bond, VLAN addresses on the second member (untagged) or its `vlan` links |
//! | `layer2-bonded` | `phy` per port, `bond` of both, `vlan` links on it | the native VLAN's addresses on the bond, the others on their `vlan` links; no Layer3 (Metal does not route it) |
//! | `layer2-individual` | `phy` per port, no bond (an empty `bond` link before a later bond: see Names), `vlan` links on the ports | VLAN addresses only; no Layer3 |
//!
//! Links: `phy` (`id` Metal's port name, `ethernet_mac_address`); `bond`
//! (`bond_links`, `bond_mode` `802.3ad`, `bond_miimon` `100`,
//! `bond_xmit_hash_policy` `layer3+4`, as Metal's LACP bonds; **no MAC**:
//! cloud-init copies a bond's parameters, its MAC among them, onto its
//! members, and its netplan renderer then matches every member by that one
//! MAC, so only the first member would be found; the node's bonding picks
//! the bond's MAC); `vlan` (`vlan_link`, `vlan_id`, `vlan_mac_address`: the
//! parent's MAC, a bond's first member's; cloud-init requires the field). A
//! link's MTU goes in `mtu`. Networks: `ipv4` / `ipv6` static, `ip_address`
//! alone, `netmask` dotted (IPv6 as a full mask, e.g.
//! `ffff:ffff:ffff:ffff::`, which cloud-init reads), `routes` as `network`
//! / `netmask` / `gateway`, `link` the link's `id`. A VLAN's routes go on
//! its first address of their family. Metal's Layer3 routes are Metal's
//! conventions: the public IPv4 and IPv6 addresses carry the default route
//! via their gateway, the private IPv4 address `10.0.0.0/8` via its
//! gateway. Elastic IPs (the [`ELASTIC_LINK`] link of the other formats) go
//! on the Layer3 bond as `/32` / `/128`: `network_data.json` has no
//! loopback link, and Metal routes them to the bond. `services`: one `dns`
//! entry per resolver of [`Host`]; a profile names none, so it is an empty
//! list and the node's resolvers come from elsewhere (the image, or user
//! data).
//!
//! # Names
//! What cloud-init's converter (`convert_net_json`, checked with Debian's
//! cloud-init 22.4.2; upstream's names bonds the same way) calls each link: a
//! `phy` link, the node's own interface with its MAC (the links carry no
//! `name`: not in OpenStack's schema); the n-th `bond` link of `links`
//! (from 0) `bond<n>`, whatever its `id` or `name`; a `vlan` link
//! `<its parent's name>.<vlan_id>`. So the `bond` links are Metal's
//! bonds in Metal's order, `id` their Metal names, and a Metal bond that
//! is none on the node (`layer2-individual`) before one that is stays in
//! its place as an **empty bond** (`bond_links` `[]`, Metal's bond
//! parameters, no MAC, nothing on it): with bond0 in `layer2-individual`
//! and bond1 bonded (4-port devices), the links are `bond0` (empty) and
//! `bond1`, and cloud-init's `bond1` is Metal's bond1 with its VLANs
//! `bond1.<vlan_id>`, as in the other formats. The node then has a
//! `bond0` without members, addresses or carrier.
//!
//! # What it cannot know
//! - The MACs, before the device exists or while Metal does not report
//!   one: cloud-init matches `phy` links by MAC, so a port without one is
//!   an error (409 `MacUnknown`, naming the port), never a guess.
//! - Metal's Layer3 addresses of a device not provisioned yet: they are
//!   what the device lists (`management` addresses); none, none rendered.
//! - The resolvers (above).
//!
//! # Values
//! As in [`super::render`]: links, addresses and routes are checked and
//! rendered from their parsed form; what fails is left out and listed in
//! the top-level `metal_ipam_skipped` array (JSON has no comments;
//! cloud-init ignores unknown top-level keys), so is a link whose parent
//! is not a link of the device.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{json, Map, Value};

use super::node::ELASTIC_LINK;
use super::profile::{bonds, Mode, Profile};
use super::render::{check, valid_ifname, Checked, NodeNetwork};
use crate::cloud::DeviceView;
use crate::error::{Error, Result};

/// Metal's bond mode: LACP.
pub const BOND_MODE: &str = "802.3ad";
/// Metal's bond transmit hash policy.
pub const BOND_XMIT_HASH_POLICY: &str = "layer3+4";
/// The MII link monitoring interval of Metal's bonds (ms).
pub const BOND_MIIMON: u32 = 100;

/// What the node is, beyond the links metal-ipam adds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// The physical ports, in order.
    pub ports: Vec<PhysicalPort>,
    /// The bonds the node runs, in Metal's order (`bond0` before `bond1`;
    /// a bond in `layer2-individual` mode is none).
    pub bonds: Vec<Bond>,
    /// Metal's Layer3 addresses, each on its link (a bond).
    pub layer3: Vec<Layer3Address>,
    /// DNS resolvers (`services`).
    pub nameservers: Vec<IpAddr>,
}

/// A physical port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysicalPort {
    /// Metal's name: `eth0`, `eth1`, ….
    pub name: String,
    /// Its MAC address, once Metal reports it.
    pub mac: Option<String>,
}

/// A bond and its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bond {
    /// `bond0`, `bond1`.
    pub name: String,
    /// Its members (physical ports), first the one whose MAC its VLANs
    /// take.
    pub members: Vec<String>,
}

/// One of Metal's Layer3 addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer3Address {
    /// The link it is on (`bond0`).
    pub link: String,
    /// The address and its prefix length.
    pub address: IpNet,
    /// Routes via its gateway: `(destination, gateway)`.
    pub routes: Vec<(IpNet, IpAddr)>,
}

/// The node as the profile, applied to `device`, makes it: the device's
/// Ethernet ports with their MACs (as Metal reports them; `None` when it
/// does not), the bonds that stay bonds with their bonded members, and,
/// on `bond0` in `layer3`, `hybrid-bonded` or `hybrid` mode, the device's
/// management addresses with Metal's routes (see the module docs).
/// `nameservers` are passed through.
///
/// ```
/// use metal_ipam_core::metal::model::Device;
/// use metal_ipam_core::network::network_data::host;
/// use metal_ipam_core::network::profile::Profile;
///
/// let profile = Profile::from_json(&serde_json::json!({"metro": "da", "ports": [
///     {"name": "eth1", "bonded": false, "vlans": [{"vxlan": 1010}]}]})).unwrap();
/// let device: Device = serde_json::from_value(serde_json::json!({"id": "d", "network_ports": [
///     {"id": "p0", "name": "bond0", "type": "NetworkBondPort"},
///     {"id": "p1", "name": "eth0", "type": "NetworkPort", "data": {"mac": "AA:BB:CC:00:00:01"}},
///     {"id": "p2", "name": "eth1", "type": "NetworkPort", "data": {"mac": "aa:bb:cc:00:00:02"}}],
///   "ip_addresses": [{"address": "147.75.1.3", "cidr": 31, "gateway": "147.75.1.2",
///     "address_family": 4, "public": true, "management": true}]})).unwrap();
/// // Metal's device, as the seam sees it.
/// let h = host(&profile, &device.into(), vec![]);
/// // hybrid: eth1 out of the bond.
/// assert_eq!(h.bonds[0].members, ["eth0"]);
/// assert_eq!(h.ports[0].mac.as_deref(), Some("aa:bb:cc:00:00:01"));
/// assert_eq!(h.layer3[0].address.to_string(), "147.75.1.3/31");
/// assert_eq!(h.layer3[0].routes[0].0.to_string(), "0.0.0.0/0");
/// ```
pub fn host(profile: &Profile, device: &DeviceView, nameservers: Vec<IpAddr>) -> Host {
    let ports: Vec<PhysicalPort> = device
        .nics
        .iter()
        .filter(|p| !p.bond)
        .filter_map(|p| {
            let name = p.name.as_deref()?;
            name.starts_with("eth").then(|| PhysicalPort {
                name: name.to_string(),
                mac: p.mac.as_deref().map(str::to_ascii_lowercase),
            })
        })
        .collect();
    let profile = profile.on_device(ports.len());
    let modes = profile.modes();
    let mut out = Host {
        ports,
        nameservers,
        ..Host::default()
    };
    for (bond, members) in bonds(profile.eth_ports()) {
        let mode = modes.get(bond).copied().unwrap_or(Mode::Layer3);
        let members: Vec<String> = members
            .into_iter()
            .filter(|m| out.ports.iter().any(|p| p.name == *m) && profile.flags(m).bonded)
            .map(str::to_string)
            .collect();
        if mode == Mode::Layer2Individual || members.is_empty() {
            continue;
        }
        out.bonds.push(Bond {
            name: bond.to_string(),
            members,
        });
        if bond == "bond0" && matches!(mode, Mode::Layer3 | Mode::HybridBonded | Mode::Hybrid) {
            out.layer3 = layer3_of(device, bond);
        }
    }
    out
}

/// The device's management addresses on `link`, with Metal's routes.
fn layer3_of(device: &DeviceView, link: &str) -> Vec<Layer3Address> {
    device
        .addresses
        .iter()
        .filter(|a| a.management == Some(true))
        .filter_map(|a| {
            let address: IpAddr = a.address.as_deref()?.parse().ok()?;
            let address = IpNet::new(address, a.cidr?).ok()?;
            let gateway = a.gateway.as_deref().and_then(|g| g.parse::<IpAddr>().ok());
            let to = match (address, a.public.unwrap_or(false)) {
                (IpNet::V4(_), true) => "0.0.0.0/0",
                (IpNet::V4(_), false) => "10.0.0.0/8",
                (IpNet::V6(_), _) => "::/0",
            };
            let routes = gateway
                .filter(|g| g.is_ipv4() == address.addr().is_ipv4())
                .and_then(|g| Some((to.parse().ok()?, g)))
                .into_iter()
                .collect();
            Some(Layer3Address {
                link: link.to_string(),
                address,
                routes,
            })
        })
        .collect()
}

/// A MAC as `aa:bb:cc:dd:ee:ff`, if `s` is one.
fn mac(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split(':').collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then(|| s.to_ascii_lowercase())
}

/// A network's netmask: dotted for IPv4, a full mask for IPv6.
fn netmask(net: &IpNet) -> String {
    net.netmask().to_string()
}

fn route_json(to: &IpNet, via: &IpAddr) -> Value {
    json!({"network": to.network().to_string(), "netmask": netmask(to), "gateway": via.to_string()})
}

/// `n` of a bond named `bond<n>` (as cloud-init writes it: no sign, no
/// leading zero).
fn bond_number(name: &str) -> Option<usize> {
    let n: usize = name.strip_prefix("bond")?.parse().ok()?;
    (format!("bond{n}") == name).then_some(n)
}

/// A `bond` link of Metal's LACP bond `name` over `members`, without a
/// MAC (see the module docs).
fn bond_json(name: &str, members: &[String]) -> Value {
    json!({
        "id": name, "type": "bond", "bond_links": members,
        "bond_mode": BOND_MODE, "bond_miimon": BOND_MIIMON,
        "bond_xmit_hash_policy": BOND_XMIT_HASH_POLICY,
    })
}

/// The links and networks as they are built.
struct Doc {
    links: Vec<Value>,
    /// `(link id, its MAC)` of every link so far.
    macs: Vec<(String, String)>,
    networks: Vec<Value>,
    skipped: Vec<String>,
}

impl Doc {
    fn has_link(&self, id: &str) -> bool {
        self.macs.iter().any(|(l, _)| l == id)
    }

    fn mac_of(&self, id: &str) -> Option<&str> {
        self.macs
            .iter()
            .find(|(l, _)| l == id)
            .map(|(_, m)| m.as_str())
    }

    /// An `ipv4` / `ipv6` network of `address` on `link`, with `routes`.
    fn network(&mut self, link: &str, address: &IpNet, routes: &[(IpNet, IpAddr)]) {
        let id = format!("network{}", self.networks.len());
        self.networks.push(json!({
            "id": id,
            "link": link,
            "type": if address.addr().is_ipv4() { "ipv4" } else { "ipv6" },
            "ip_address": address.addr().to_string(),
            "netmask": netmask(address),
            "routes": routes.iter().map(|(to, via)| route_json(to, via)).collect::<Vec<_>>(),
        }));
    }

    /// Sets `mtu` on the link `id`.
    fn set_mtu(&mut self, id: &str, mtu: u32) {
        if let Some(l) = self.links.iter_mut().find(|l| l["id"] == id) {
            l["mtu"] = json!(mtu);
        }
    }
}

/// `net` on `host` as OpenStack `network_data.json` (see the module docs):
/// pretty-printed, keys sorted, input order, a final newline.
///
/// ```
/// use metal_ipam_core::network::network_data::{render, Bond, Host, PhysicalPort};
/// use metal_ipam_core::network::render::{Link, NodeNetwork};
///
/// let host = Host {
///     ports: vec![
///         PhysicalPort { name: "eth0".into(), mac: Some("aa:bb:cc:00:00:01".into()) },
///         PhysicalPort { name: "eth1".into(), mac: Some("aa:bb:cc:00:00:02".into()) },
///     ],
///     bonds: vec![Bond { name: "bond0".into(), members: vec!["eth0".into(), "eth1".into()] }],
///     ..Host::default()
/// };
/// let net = NodeNetwork { links: vec![Link {
///     name: "bond0.1010".into(), vlan: Some(("bond0".into(), 1010)),
///     addresses: vec!["192.168.10.5/24".into()], routes: vec![], mtu: None }] };
/// let doc: serde_json::Value = serde_json::from_str(&render(&net, &host).unwrap()).unwrap();
/// assert_eq!(doc["links"][2]["bond_mode"], "802.3ad");
/// assert_eq!(doc["links"][3]["vlan_link"], "bond0");
/// assert_eq!(doc["links"][3]["vlan_mac_address"], "aa:bb:cc:00:00:01");
/// assert_eq!(doc["networks"][0]["netmask"], "255.255.255.0");
/// assert_eq!(doc["services"], serde_json::json!([]));
///
/// // A port whose MAC is not known: refused, naming it.
/// let mut unknown = host.clone();
/// unknown.ports[1].mac = None;
/// let e = render(&net, &unknown).unwrap_err();
/// assert_eq!((e.status(), e.reason()), (409, "MacUnknown"));
/// ```
///
/// # Errors
/// 409 `MacUnknown` naming the first port of `host` whose MAC is not known
/// (or not a MAC); 422 naming a port whose name is not an interface name,
/// a bond not named `bond<n>` in order (n above the bonds' before it,
/// below the number of ports: cloud-init names bonds by their order, see
/// the module docs) or named as a port, or a bond without members or with
/// one that is not a port.
pub fn render(net: &NodeNetwork, host: &Host) -> Result<String> {
    let mut doc = Doc {
        links: Vec::new(),
        macs: Vec::new(),
        networks: Vec::new(),
        skipped: Vec::new(),
    };
    doc.ports(host)?;
    doc.bonds(host)?;
    for a in &host.layer3 {
        if doc.has_link(&a.link) {
            doc.network(&a.link, &a.address, &a.routes);
        } else {
            doc.skipped
                .push(format!("a Layer3 address: {} is not a link", a.link));
        }
    }
    let members: Vec<&str> = host
        .bonds
        .iter()
        .flat_map(|b| b.members.iter().map(String::as_str))
        .collect();
    let checks = check(net);
    doc.skipped.extend(checks.skipped.iter().cloned());
    for link in &checks.links {
        if let Some(on) = doc.link_of(link, host, &members) {
            doc.addresses(link, &on);
        }
    }
    Ok(doc.finish(host))
}

impl Doc {
    /// The physical ports, each a `phy` link by its MAC.
    fn ports(&mut self, host: &Host) -> Result<()> {
        for (i, p) in host.ports.iter().enumerate() {
            if !valid_ifname(&p.name) {
                return Err(Error::invalid(
                    format!("host.ports[{i}]"),
                    "not an interface name",
                ));
            }
            let Some(m) = p.mac.as_deref().and_then(mac) else {
                return Err(Error::conflict(
                    "MacUnknown",
                    format!(
                        "the MAC address of port {} is not known (Metal reports it once the device exists): \
                         network_data.json's phy links are matched by MAC; use format=netplan, ifupdown, \
                         cloud-init or shell meanwhile",
                        p.name
                    ),
                ));
            };
            self.links
                .push(json!({"id": p.name, "type": "phy", "ethernet_mac_address": m}));
            self.macs.push((p.name.clone(), m));
        }
        Ok(())
    }

    /// The bonds, numbered as cloud-init numbers them.
    fn bonds(&mut self, host: &Host) -> Result<()> {
        // cloud-init names the n-th bond link `bond<n>`, whatever its `id`:
        // Metal's bonds that are none on the node (layer2-individual) before
        // one that is keep their places as empty bonds.
        let mut bond_links = 0;
        for (i, b) in host.bonds.iter().enumerate() {
            let n = bond_number(&b.name)
                .filter(|n| (bond_links..host.ports.len()).contains(n) && !self.has_link(&b.name))
                .ok_or_else(|| {
                    Error::invalid(
                        format!("host.bonds[{i}].name"),
                        "not bond<n> with n above the bonds' before it and below the number of ports \
                         (cloud-init numbers bonds in order), or the name of a port",
                    )
                })?;
            let first = b
                .members
                .first()
                .and_then(|m| self.mac_of(m))
                .map(str::to_string);
            let (Some(first), true) = (first, b.members.iter().all(|m| self.has_link(m))) else {
                return Err(Error::invalid(
                    format!("host.bonds[{i}].members"),
                    "none, or one that is not a port",
                ));
            };
            for empty in bond_links..n {
                self.links.push(bond_json(&format!("bond{empty}"), &[]));
            }
            self.links.push(bond_json(&b.name, &b.members));
            // A VLAN on the bond names its first member's MAC.
            self.macs.push((b.name.clone(), first));
            bond_links = n + 1;
        }
        Ok(())
    }

    /// The link `link`'s addresses go on (a VLAN link added for a tagged
    /// one); `None`, noted as skipped, when there is none.
    fn link_of(&mut self, link: &Checked<'_>, host: &Host, members: &[&str]) -> Option<String> {
        match link.vlan {
            Some((parent, id)) => {
                let Some(m) = self.mac_of(parent).map(str::to_string) else {
                    self.skipped.push(format!(
                        "{}: its parent {parent} is not a port or bond of the device",
                        link.name
                    ));
                    return None;
                };
                if members.contains(&parent) {
                    self.skipped.push(format!(
                        "{}: its parent {parent} is a bond member",
                        link.name
                    ));
                    return None;
                }
                self.links.push(json!({
                    "id": link.name, "type": "vlan", "vlan_link": parent,
                    "vlan_id": id, "vlan_mac_address": m,
                }));
                self.macs.push((link.name.to_string(), m));
                Some(link.name.to_string())
            }
            None if link.name == ELASTIC_LINK => {
                let l3 = host.layer3.first().map(|a| a.link.clone());
                if l3.is_none() {
                    self.skipped.push(format!(
                        "{}: elastic IPs need a Layer3 bond with addresses",
                        link.name
                    ));
                }
                l3
            }
            None if !self.has_link(link.name) || members.contains(&link.name) => {
                self.skipped.push(format!(
                    "{}: not a port or bond of the device (or a bond member)",
                    link.name
                ));
                None
            }
            None => Some(link.name.to_string()),
        }
    }

    /// `link`'s MTU, addresses and routes on link `on`.
    fn addresses(&mut self, link: &Checked<'_>, on: &str) {
        if let Some(mtu) = link.mtu {
            self.set_mtu(on, mtu);
        }
        let mut routes_left: Vec<(IpNet, IpAddr)> = link.routes.clone();
        for a in &link.addresses {
            let (mine, rest): (Vec<_>, Vec<_>) = routes_left
                .into_iter()
                .partition(|(_, via)| via.is_ipv4() == a.addr().is_ipv4());
            routes_left = rest;
            self.network(on, a, &mine);
        }
        for (j, _) in routes_left.iter().enumerate() {
            self.skipped.push(format!(
                "{}: a route ({j} left) has no address of its family on the link",
                link.name
            ));
        }
    }

    /// The document, as text.
    fn finish(self, host: &Host) -> String {
        let mut out = Map::new();
        out.insert("links".into(), Value::Array(self.links));
        out.insert("networks".into(), Value::Array(self.networks));
        out.insert(
            "services".into(),
            host.nameservers
                .iter()
                .map(|n| json!({"type": "dns", "address": n.to_string()}))
                .collect(),
        );
        if !self.skipped.is_empty() {
            out.insert("metal_ipam_skipped".into(), json!(self.skipped));
        }
        let mut text = serde_json::to_string_pretty(&Value::Object(out)).unwrap_or_default();
        text.push('\n');
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::render::{Link, Route};

    fn port(name: &str, n: u8) -> PhysicalPort {
        PhysicalPort {
            name: name.into(),
            mac: Some(format!("aa:bb:cc:00:00:{n:02x}")),
        }
    }

    fn bonded() -> Host {
        Host {
            ports: vec![port("eth0", 1), port("eth1", 2)],
            bonds: vec![Bond {
                name: "bond0".into(),
                members: vec!["eth0".into(), "eth1".into()],
            }],
            ..Host::default()
        }
    }

    fn doc(net: &NodeNetwork, host: &Host) -> Value {
        serde_json::from_str(&render(net, host).unwrap()).unwrap()
    }

    #[test]
    fn routes_go_on_the_first_address_of_their_family() {
        let net = NodeNetwork {
            links: vec![Link {
                name: "bond0.1020".into(),
                vlan: Some(("bond0".into(), 1020)),
                addresses: vec!["192.168.20.5/24".into(), "fd00:20::5/64".into()],
                routes: vec![
                    Route {
                        to: "fd00::/48".into(),
                        via: "fd00:20::1".into(),
                    },
                    Route {
                        to: "10.20.0.0/16".into(),
                        via: "192.168.20.1".into(),
                    },
                ],
                mtu: Some(9000),
            }],
        };
        let d = doc(&net, &bonded());
        let n = &d["networks"];
        assert_eq!(n[0]["routes"][0]["network"], "10.20.0.0");
        assert_eq!(n[0]["routes"][0]["netmask"], "255.255.0.0");
        assert_eq!(n[1]["type"], "ipv6");
        assert_eq!(n[1]["netmask"], "ffff:ffff:ffff:ffff::");
        assert_eq!(n[1]["routes"][0]["netmask"], "ffff:ffff:ffff::");
        assert_eq!(d["links"][3]["mtu"], 9000);
        assert!(d.get("metal_ipam_skipped").is_none());
    }

    #[test]
    fn what_does_not_fit_the_device_is_left_out_and_listed() {
        let net = NodeNetwork {
            links: vec![
                Link {
                    name: "eth3.7".into(),
                    vlan: Some(("eth3".into(), 7)),
                    addresses: vec![],
                    routes: vec![],
                    mtu: None,
                },
                Link {
                    name: "eth1".into(),
                    vlan: None,
                    addresses: vec!["10.0.0.5/24".into()],
                    routes: vec![],
                    mtu: None,
                },
                Link {
                    name: "lo".into(),
                    vlan: None,
                    addresses: vec!["10.10.1.5/32".into()],
                    routes: vec![],
                    mtu: None,
                },
            ],
        };
        let d = doc(&net, &bonded());
        assert_eq!(d["links"].as_array().unwrap().len(), 3);
        assert_eq!(d["networks"], json!([]));
        let skipped = d["metal_ipam_skipped"].as_array().unwrap();
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(skipped[0].as_str().unwrap().contains("eth3"));
    }

    /// Issue 26, finding 10 (fails before this change: bond1 was the only
    /// bond link, which cloud-init names `bond0`).
    #[test]
    fn bond1_is_the_second_bond_link_when_bond0_is_none() {
        let h = Host {
            ports: (0..4).map(|i| port(&format!("eth{i}"), i + 1)).collect(),
            bonds: vec![Bond {
                name: "bond1".into(),
                members: vec!["eth1".into(), "eth3".into()],
            }],
            ..Host::default()
        };
        let vlan = |parent: &str, id: u16| Link {
            name: format!("{parent}.{id}"),
            vlan: Some((parent.into(), id)),
            addresses: vec![],
            routes: vec![],
            mtu: None,
        };
        let net = NodeNetwork {
            links: vec![vlan("bond1", 1201), vlan("eth0", 1101), vlan("bond0", 1102)],
        };
        let d = doc(&net, &h);
        let links = d["links"].as_array().unwrap();
        let bonds: Vec<&Value> = links.iter().filter(|l| l["type"] == "bond").collect();
        // cloud-init names the n-th bond link bond<n>.
        assert_eq!(bonds.len(), 2, "{d:#}");
        assert_eq!(
            (&bonds[0]["id"], &bonds[0]["bond_links"]),
            (&json!("bond0"), &json!([]))
        );
        assert!(bonds[0].get("ethernet_mac_address").is_none());
        assert_eq!(bonds[1]["id"], "bond1");
        assert_eq!(bonds[1]["bond_links"], json!(["eth1", "eth3"]));
        let vlans: Vec<&Value> = links.iter().filter(|l| l["type"] == "vlan").collect();
        assert_eq!(vlans.len(), 2, "{d:#}");
        assert_eq!(vlans[0]["vlan_link"], "bond1");
        assert_eq!(vlans[1]["vlan_link"], "eth0");
        // Nothing goes on the empty bond0.
        let skipped = d["metal_ipam_skipped"].as_array().unwrap();
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].as_str().unwrap().starts_with("bond0.1102"));
    }

    /// A bond carries no MAC: cloud-init copies a bond's parameters, its
    /// MAC among them, onto its members, and its netplan then matches the
    /// second member by the first one's MAC. A VLAN on the bond still
    /// names the first member's (cloud-init requires one).
    #[test]
    fn bonds_carry_no_mac() {
        let net = NodeNetwork {
            links: vec![Link {
                name: "bond0.1010".into(),
                vlan: Some(("bond0".into(), 1010)),
                addresses: vec![],
                routes: vec![],
                mtu: None,
            }],
        };
        let d = doc(&net, &bonded());
        let links = d["links"].as_array().unwrap();
        assert_eq!(links[2]["type"], "bond");
        assert!(links[2].get("ethernet_mac_address").is_none(), "{d:#}");
        assert_eq!(links[3]["vlan_mac_address"], "aa:bb:cc:00:00:01");
    }

    #[test]
    fn bonds_are_bond_n_in_order() {
        let four = |bonds: &[&str]| Host {
            ports: (0..4).map(|i| port(&format!("eth{i}"), i + 1)).collect(),
            bonds: bonds
                .iter()
                .map(|b| Bond {
                    name: b.to_string(),
                    members: vec!["eth1".into()],
                })
                .collect(),
            ..Host::default()
        };
        for bad in [
            &["bond1", "bond0"][..],
            &["bond0", "bond0"],
            &["bond01"],
            &["bond4"],
            &["team0"],
            &["bond-1"],
        ] {
            let e = render(&NodeNetwork::default(), &four(bad)).unwrap_err();
            let field = format!("host.bonds[{}].name", bad.len() - 1);
            assert_eq!(
                (e.status(), e.field()),
                (422, Some(field.as_str())),
                "{bad:?}"
            );
        }
        let mut named_as_a_port = four(&["bond0"]);
        named_as_a_port.ports[0].name = "bond0".into();
        let e = render(&NodeNetwork::default(), &named_as_a_port).unwrap_err();
        assert_eq!(e.field(), Some("host.bonds[0].name"));
        let d = doc(&NodeNetwork::default(), &four(&["bond3"]));
        let ids: Vec<&Value> = d["links"].as_array().unwrap()[4..]
            .iter()
            .map(|l| &l["id"])
            .collect();
        assert_eq!(ids, ["bond0", "bond1", "bond2", "bond3"]);
    }

    #[test]
    fn hostile_names_and_macs_are_refused() {
        let mut h = bonded();
        h.ports[0].mac = Some("aa:bb:cc:00:00:01\", \"x".into());
        assert_eq!(
            render(&NodeNetwork::default(), &h).unwrap_err().status(),
            409
        );
        let mut h = bonded();
        h.ports[0].name = "eth0\"".into();
        assert_eq!(
            render(&NodeNetwork::default(), &h).unwrap_err().status(),
            422
        );
        let mut h = bonded();
        h.bonds[0].members.push("eth9".into());
        assert_eq!(
            render(&NodeNetwork::default(), &h).unwrap_err().status(),
            422
        );
    }

    #[test]
    fn host_by_mode() {
        use crate::cloud::DeviceView;
        use crate::metal::model::Device;
        let device: Device = serde_json::from_value(json!({"id": "d", "network_ports": [
            {"id": "b", "name": "bond0", "type": "NetworkBondPort"},
            {"id": "0", "name": "eth0", "type": "NetworkPort", "data": {"mac": "aa:bb:cc:00:00:01"}},
            {"id": "1", "name": "eth1", "type": "NetworkPort"}],
            "ip_addresses": [
              {"address": "10.1.2.3", "cidr": 31, "gateway": "10.1.2.2", "address_family": 4, "public": false, "management": true},
              {"address": "2001:db8::3", "cidr": 127, "gateway": "2001:db8::2", "address_family": 6, "public": true, "management": true},
              {"address": "147.0.0.9", "cidr": 32, "address_family": 4, "public": true, "management": false}]}))
        .unwrap();
        let device = DeviceView::from(device);
        let p = |v: Value| Profile::from_json(&v).unwrap();
        let h = host(&p(json!({"ports": []})), &device, vec![]);
        assert_eq!(h.bonds[0].members, ["eth0", "eth1"]);
        assert_eq!(h.ports[1].mac, None);
        assert_eq!(h.layer3.len(), 2, "management addresses only");
        assert_eq!(h.layer3[0].routes[0].0.to_string(), "10.0.0.0/8");
        assert_eq!(h.layer3[1].routes[0].0.to_string(), "::/0");
        let h = host(
            &p(json!({"ports": [{"name": "bond0", "layer2": true}]})),
            &device,
            vec![],
        );
        assert_eq!(h.bonds.len(), 1);
        assert!(h.layer3.is_empty(), "layer2: Metal does not route Layer3");
        let h = host(
            &p(json!({"ports": [{"name": "bond0", "layer2": true, "bonded": false}]})),
            &device,
            vec![],
        );
        assert!(h.bonds.is_empty() && h.layer3.is_empty());
        assert_eq!(h.ports.len(), 2);
    }
}
