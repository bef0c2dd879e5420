//! The node's OS network configuration for Layer2 / Hybrid ports: what a
//! node must configure itself (Metal has no DHCP, and the metadata service
//! does not tell VLANs), rendered as netplan, ifupdown, cloud-init or a
//! shell script (and, with the device, OpenStack `network_data.json`:
//! [`super::network_data`]), from a [`NodeNetwork`] (resolved from the
//! applied state, or from the profile and the claims before the device
//! exists).
//!
//! Only the links metal-ipam adds are rendered (but for network data): VLAN sub-interfaces
//! (`bond0.<vxlan>`, `eth1.<vxlan>`) and untagged addresses on a port that
//! carries one VLAN untagged (a layer2 port with a single VLAN, or the
//! native VLAN). The bond and the Layer3 addresses Metal's provisioning
//! wrote are left alone. Pure: no I/O.
//!
//! # Formats
//! - [`Format::Netplan`]: one file for [`NETPLAN_PATH`] (`vlans:` with `id`,
//!   `link`, `addresses`, `routes`, `mtu`; untagged ports under
//!   `ethernets:` / `bonds:`).
//! - [`Format::Ifupdown`]: stanzas for [`IFUPDOWN_PATH`] (one `iface`
//!   stanza per address, `vlan-raw-device`, routes as `post-up ip route
//!   replace … || true` and `pre-down ip route del … || true`). Needs
//!   `source /etc/network/interfaces.d/*` in `/etc/network/interfaces`
//!   (Debian's default).
//! - [`Format::CloudInit`]: a `#cloud-config` document writing the netplan
//!   file (mode `0600`, as netplan wants) and [`MODULES_LOAD_PATH`], then
//!   `runcmd: [[modprobe, 8021q], [netplan, apply]]` (exec form: no shell).
//! - [`Format::Shell`]: `#!/bin/sh`, `set -eu`, idempotent `ip` commands
//!   (`ip link show X || ip link add …`, `ip addr replace`, `ip link set …
//!   up`, `ip route replace`); loads `8021q` and persists it in
//!   [`MODULES_LOAD_PATH`].
//!
//! - [`Format::NetworkData`]: OpenStack `network_data.json`, the node's
//!   **whole** configuration (a datasource's replaces what Metal's
//!   provisioning wrote), so it needs the device too: rendered by
//!   [`super::network_data::render`] from a [`NodeNetwork`] and a
//!   [`super::network_data::Host`]; [`render`] knows no device and leaves
//!   every link out.
//!
//! `8021q` is loaded (and, for cloud-init and shell, persisted) only when
//! a tagged link is rendered; ifupdown loads it in the VLAN's `pre-up`.
//! An empty [`NodeNetwork`] renders a valid document that changes nothing.
//!
//! # Netplan: the VLAN's parent
//! Netplan's `link:` is the netplan ID of another definition, and netplan
//! refuses a VLAN whose link is defined in no file
//! (`ena: interface 'en1' is not defined`: netplan's own test,
//! `tests/generator/test_errors.py::test_vlan_unknown_link`). All
//! `/{lib,etc,run}/netplan/*.yaml` files form one configuration: later
//! files add to earlier ones, mappings are merged key by key, scalars
//! overridden, sequences appended (`netplan-generate(8)`, "Handling
//! multiple files"), and redefining an ID under another device type is an
//! error (`Updated definition 'id0' changes device type`).
//!
//! So the parent is declared under its own type with an **empty mapping**:
//! `bonds: {bond0: {}}` for a bond (a name starting with `bond`),
//! `ethernets: {eth1: {}}` otherwise. Merged with the definition Metal's
//! provisioning wrote (cloud-init's `50-cloud-init.yaml`), it sets and
//! overrides nothing: the bond, its members and its Layer3 addresses stay
//! Metal's. Declaring `bond0` under `ethernets:` would be a type clash;
//! repeating its `interfaces:` or `parameters:` would re-define Metal's
//! bond. An untagged port's addresses, routes and MTU go in the same entry
//! and are appended to Metal's by the merge.
//!
//! **Limitation**: this only holds when the image's own network
//! configuration is netplan. On an image whose bond is configured by
//! ifupdown (or NetworkManager without netplan), the empty `bond0: {}`
//! would be netplan's only definition of the bond: netplan would hand a
//! member-less, address-less `bond0` to systemd-networkd (a bond without
//! `interfaces` is valid netplan: netplan's
//! `tests/generator/test_bonds.py::test_bond_empty` renders it to a
//! `bond.netdev` and a `.network`), which then manages (and may clear)
//! Metal's bond. Use [`Format::Ifupdown`] or
//! [`Format::Shell`] on such images.
//!
//! # Not done here
//! - Taking a port out of the OS bond (hybrid: `eth1`; layer2-individual:
//!   `eth0` and `eth1`): Metal takes it out on the switch side, the image's
//!   bond configuration still lists it. That edits Metal's bond, which this
//!   module never does.
//! - Repairing an existing link of the right name but another parent or
//!   tag: the shell form only creates a missing one.
//! - Raising the parent's MTU: a VLAN's MTU cannot exceed its parent's,
//!   and the parent is Metal's (a larger MTU fails: the script stops, `set
//!   -e`).
//! - Checking that a route's gateway is on-link (inside one of the link's
//!   networks): the kernel refuses it when it is not.
//!
//! # Values
//! Values are validated upstream; rendering still re-checks each one and
//! renders it from its parsed form (an [`IpNet`], an [`IpAddr`], a `u16`),
//! so nothing from the input reaches a document as raw text but interface
//! names, and those are limited to `[A-Za-z0-9_.-]`, 1 to 15 bytes (Linux's
//! `IFNAMSIZ`), not starting with `-` or `.`. A link, address or route that
//! fails is left out with a `# metal-ipam: skipped …` comment naming its
//! index and the reason (never the value). Shell arguments are quoted when
//! they are not plain, YAML strings are double-quoted when they would not
//! read back as the same string. Output is deterministic: input order.

use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

/// The format of [`render`]'s output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Netplan YAML (`network: {version: 2, …}`), for `/etc/netplan/`.
    Netplan,
    /// ifupdown stanzas, for `/etc/network/interfaces.d/`.
    Ifupdown,
    /// A cloud-init `#cloud-config` document (`write_files` and `runcmd`).
    CloudInit,
    /// A POSIX shell script with `ip` commands, idempotent.
    Shell,
    /// OpenStack `network_data.json`: the node's **whole** configuration,
    /// which needs what the device is ([`super::network_data`]). `render`
    /// knows no device: it renders an empty device, on which every link is
    /// left out; render with [`super::network_data::render`].
    NetworkData,
}

/// A route on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination network, e.g. `10.10.0.0/16`.
    pub to: String,
    /// Next hop, e.g. the Metal Gateway's address `10.10.1.1`.
    pub via: String,
}

/// One link the node configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface name: `bond0.1010`, `eth1.1011`, or the port itself
    /// (`eth1`, `bond0`) for an untagged VLAN.
    pub name: String,
    /// For a VLAN sub-interface: its parent (`bond0`, `eth1`) and tag (the
    /// VLAN's vxlan). `None`: untagged on the port `name`.
    pub vlan: Option<(String, u16)>,
    /// Addresses with their prefix length, e.g. `192.168.10.5/24`.
    pub addresses: Vec<String>,
    /// Routes (to the VRF's ranges via the Metal Gateway's address).
    pub routes: Vec<Route>,
    /// MTU, when not the default.
    pub mtu: Option<u32>,
}

/// What a node configures: its links, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeNetwork {
    /// The links (VLAN sub-interfaces and untagged ports).
    pub links: Vec<Link>,
}

/// Where [`Format::Netplan`]'s output goes (and where
/// [`Format::CloudInit`] writes it): after cloud-init's
/// `50-cloud-init.yaml`, so it is merged onto Metal's definitions.
pub const NETPLAN_PATH: &str = "/etc/netplan/60-metal-ipam.yaml";

/// Where [`Format::Ifupdown`]'s output goes.
pub const IFUPDOWN_PATH: &str = "/etc/network/interfaces.d/metal-ipam";

/// The file that loads `8021q` at boot (systemd's `modules-load.d`).
pub const MODULES_LOAD_PATH: &str = "/etc/modules-load.d/8021q.conf";

/// The kernel module for 802.1Q VLAN sub-interfaces.
const VLAN_MODULE: &str = "8021q";

/// Linux's `IFNAMSIZ` less the NUL: the longest interface name.
const MAX_IFNAME: usize = 15;

impl Format {
    /// The file this format's output is meant for: [`NETPLAN_PATH`],
    /// [`IFUPDOWN_PATH`]; `None` for cloud-init (user data), shell (a
    /// script to run) and network data (a datasource's, e.g. a config
    /// drive's `openstack/latest/network_data.json`).
    pub fn path(self) -> Option<&'static str> {
        match self {
            Format::Netplan => Some(NETPLAN_PATH),
            Format::Ifupdown => Some(IFUPDOWN_PATH),
            Format::CloudInit | Format::Shell | Format::NetworkData => None,
        }
    }
}

/// Renders `net` in `format` (see the module docs for each format, and for
/// how the VLANs' parent is declared in netplan).
///
/// ```
/// use metal_ipam_core::network::render::{render, Format, Link, NodeNetwork, Route};
///
/// let net = NodeNetwork {
///     links: vec![Link {
///         name: "bond0.1010".into(),
///         vlan: Some(("bond0".into(), 1010)),
///         addresses: vec!["192.168.10.5/24".into()],
///         routes: vec![Route { to: "10.10.0.0/16".into(), via: "192.168.10.1".into() }],
///         mtu: None,
///     }],
/// };
/// let script = render(&net, Format::Shell);
/// assert!(script.starts_with("#!/bin/sh\n"));
/// assert!(script.contains(
///     "ip link show bond0.1010 >/dev/null 2>&1 || \
///      ip link add link bond0 name bond0.1010 type vlan id 1010\n"
/// ));
/// assert!(script.contains("ip route replace 10.10.0.0/16 via 192.168.10.1 dev bond0.1010\n"));
///
/// let netplan = render(&net, Format::Netplan);
/// assert!(netplan.contains("  bonds:\n    bond0: {}\n"));
/// assert!(netplan.contains("      id: 1010\n      link: bond0\n"));
///
/// // Nothing to configure: a valid document that changes nothing.
/// assert!(render(&NodeNetwork::default(), Format::Netplan).ends_with("network:\n  version: 2\n"));
/// ```
pub fn render(net: &NodeNetwork, format: Format) -> String {
    let checked = check(net);
    match format {
        Format::Netplan => netplan(&checked),
        Format::Ifupdown => ifupdown(&checked),
        Format::CloudInit => cloud_init(&checked),
        Format::Shell => shell(&checked),
        Format::NetworkData => without_host(&checked),
    }
}

/// `network_data.json` without the device: no port, so every link is left
/// out and listed as skipped (what `network_data::render` does with an
/// empty host; rendering with the device is `network_data`'s, which builds
/// on this module, so this one does not call it).
fn without_host(net: &Checks<'_>) -> String {
    let skipped: Vec<String> = net
        .links
        .iter()
        .map(|l| format!("{}: the device's ports are not known", l.name))
        .chain(net.skipped.iter().cloned())
        .collect();
    let mut doc = serde_json::json!({"links": [], "networks": [], "services": []});
    if !skipped.is_empty() {
        doc["metal_ipam_skipped"] = skipped.into();
    }
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

// ---------------------------------------------------------------------------
// Checked values
// ---------------------------------------------------------------------------

/// A link whose every rendered value was parsed back.
pub(super) struct Checked<'a> {
    pub(super) name: &'a str,
    pub(super) vlan: Option<(&'a str, u16)>,
    pub(super) addresses: Vec<IpNet>,
    pub(super) routes: Vec<(IpNet, IpAddr)>,
    pub(super) mtu: Option<u32>,
}

/// The links to render, and what was left out (comments without values).
pub(super) struct Checks<'a> {
    pub(super) links: Vec<Checked<'a>>,
    pub(super) skipped: Vec<String>,
}

impl Checks<'_> {
    fn any_tagged(&self) -> bool {
        self.links.iter().any(|l| l.vlan.is_some())
    }
}

/// A name Linux accepts and no format needs to escape.
pub(super) fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IFNAME
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A route's destination: a network, or one address (a host route).
fn parse_destination(to: &str) -> Option<IpNet> {
    to.parse::<IpNet>()
        .ok()
        .or_else(|| to.parse::<IpAddr>().ok().map(IpNet::from))
}

/// The links of `net` that can be rendered, in order, and a line for each
/// link, address or route left out and why.
pub(super) fn check(net: &NodeNetwork) -> Checks<'_> {
    let mut skipped = Vec::new();
    let mut links: Vec<Checked<'_>> = Vec::new();
    for (i, link) in net.links.iter().enumerate() {
        let name = link.name.as_str();
        if !valid_ifname(name) {
            skipped.push(format!("links[{i}]: not a valid interface name"));
            continue;
        }
        let vlan = match checked_vlan(link) {
            Ok(vlan) => vlan,
            Err(why) => {
                skipped.push(format!("links[{i}] ({name}): {why}"));
                continue;
            }
        };
        if links.iter().any(|l| l.name == name) {
            skipped.push(format!(
                "links[{i}] ({name}): a link of that name comes earlier"
            ));
            continue;
        }
        let at = format!("links[{i}] ({name})");
        links.push(Checked {
            name,
            vlan,
            addresses: checked_addresses(&at, link, &mut skipped),
            routes: checked_routes(&at, link, &mut skipped),
            mtu: link.mtu,
        });
    }
    Checks {
        links: without_nested_vlans(links, &mut skipped),
        skipped,
    }
}

/// A link's VLAN `(parent, tag)`, if any, or why it cannot be rendered.
fn checked_vlan(link: &Link) -> Result<Option<(&str, u16)>, &'static str> {
    let Some((parent, id)) = &link.vlan else {
        return Ok(None);
    };
    if !valid_ifname(parent) {
        return Err("parent is not a valid interface name");
    }
    if !(1..=4094).contains(id) {
        return Err("VLAN tag not in 1..=4094");
    }
    if *parent == link.name {
        return Err("is its own parent");
    }
    Ok(Some((parent.as_str(), *id)))
}

/// A link's addresses that parse as `address/prefix`; the others are
/// listed in `skipped` under `at`.
fn checked_addresses(at: &str, link: &Link, skipped: &mut Vec<String>) -> Vec<IpNet> {
    let mut addresses = Vec::new();
    for (j, address) in link.addresses.iter().enumerate() {
        match address.parse::<IpNet>() {
            Ok(net) => addresses.push(net),
            Err(_) => skipped.push(format!(
                "{at}: addresses[{j}] is not an IP address with a prefix length"
            )),
        }
    }
    addresses
}

/// A link's routes that are a destination via an address of the same
/// family; the others are listed in `skipped` under `at`.
fn checked_routes(at: &str, link: &Link, skipped: &mut Vec<String>) -> Vec<(IpNet, IpAddr)> {
    let mut routes = Vec::new();
    for (j, route) in link.routes.iter().enumerate() {
        match (parse_destination(&route.to), route.via.parse::<IpAddr>()) {
            (Some(to), Ok(via)) if to.addr().is_ipv4() == via.is_ipv4() => routes.push((to, via)),
            (Some(_), Ok(_)) => skipped.push(format!("{at}: routes[{j}] mixes IPv4 and IPv6")),
            _ => skipped.push(format!(
                "{at}: routes[{j}] is not a network via an IP address"
            )),
        }
    }
    routes
}

/// `links` without VLANs on VLANs (802.1Q in 802.1Q is not a Metal thing:
/// the inner one is left out rather than rendered half-way), each listed
/// in `skipped`.
fn without_nested_vlans<'a>(
    links: Vec<Checked<'a>>,
    skipped: &mut Vec<String>,
) -> Vec<Checked<'a>> {
    let tagged: Vec<&str> = links
        .iter()
        .filter(|l| l.vlan.is_some())
        .map(|l| l.name)
        .collect();
    let mut kept = Vec::with_capacity(links.len());
    for link in links {
        match link.vlan {
            Some((parent, _)) if tagged.contains(&parent) => {
                skipped.push(format!(
                    "{}: its parent {parent} is itself a VLAN sub-interface",
                    link.name
                ));
            }
            _ => kept.push(link),
        }
    }
    kept
}

/// A bond port (`bond0`, `bond1`): declared under netplan's `bonds:`.
fn is_bond(name: &str) -> bool {
    name.starts_with("bond")
}

/// The comment lines for what was left out.
fn skipped_comments(out: &mut String, checks: &Checks<'_>) {
    for s in &checks.skipped {
        let _ = writeln!(out, "# metal-ipam: skipped {s}");
    }
}

// ---------------------------------------------------------------------------
// YAML (netplan, cloud-init)
// ---------------------------------------------------------------------------

/// `s` as a YAML scalar that reads back as the same string: plain when it
/// is a word that no YAML 1.1 / 1.2 resolver turns into anything else
/// (starts with a letter or `/`, only `[A-Za-z0-9_./-]`, not a boolean or
/// null word), double-quoted (JSON escaping, a subset of YAML's)
/// otherwise.
fn yaml_str(s: &str) -> String {
    const WORDS: [&str; 11] = [
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf",
    ];
    let plain = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-'))
        && !WORDS.iter().any(|w| s.eq_ignore_ascii_case(w));
    if plain {
        s.to_string()
    } else {
        serde_json::Value::String(s.to_string()).to_string()
    }
}

/// The body of a netplan device (addresses, routes, mtu) at `indent`;
/// `{}` after the key when there is nothing.
fn yaml_device(
    out: &mut String,
    indent: usize,
    key: &str,
    vlan: Option<(&str, u16)>,
    link: Option<&Checked<'_>>,
) {
    let pad = " ".repeat(indent);
    let empty = vlan.is_none()
        && link.is_none_or(|l| l.addresses.is_empty() && l.routes.is_empty() && l.mtu.is_none());
    if empty {
        let _ = writeln!(out, "{pad}{}: {{}}", yaml_str(key));
        return;
    }
    let _ = writeln!(out, "{pad}{}:", yaml_str(key));
    let pad = " ".repeat(indent + 2);
    if let Some((parent, id)) = vlan {
        let _ = writeln!(out, "{pad}id: {id}");
        let _ = writeln!(out, "{pad}link: {}", yaml_str(parent));
    }
    let Some(link) = link else { return };
    if !link.addresses.is_empty() {
        let _ = writeln!(out, "{pad}addresses:");
        for a in &link.addresses {
            let _ = writeln!(out, "{pad}  - {}", yaml_str(&a.to_string()));
        }
    }
    if !link.routes.is_empty() {
        let _ = writeln!(out, "{pad}routes:");
        for (to, via) in &link.routes {
            let _ = writeln!(out, "{pad}  - to: {}", yaml_str(&to.to_string()));
            let _ = writeln!(out, "{pad}    via: {}", yaml_str(&via.to_string()));
        }
    }
    if let Some(mtu) = link.mtu {
        let _ = writeln!(out, "{pad}mtu: {mtu}");
    }
}

/// The ports netplan must know: untagged links with their configuration,
/// VLAN parents with none; first appearance order.
fn ports<'c, 'a>(checks: &'c Checks<'a>) -> Vec<(&'a str, Option<&'c Checked<'a>>)> {
    let mut ports: Vec<(&'a str, Option<&'c Checked<'a>>)> = Vec::new();
    for link in &checks.links {
        let (name, config) = match link.vlan {
            None => (link.name, Some(link)),
            Some((parent, _)) => (parent, None),
        };
        match ports.iter_mut().find(|(n, _)| *n == name) {
            Some(port) => {
                if config.is_some() {
                    port.1 = config;
                }
            }
            None => ports.push((name, config)),
        }
    }
    ports
}

fn netplan(checks: &Checks<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Generated by metal-ipam: Layer2 / Hybrid VLANs ({NETPLAN_PATH})."
    );
    let ports = ports(checks);
    if ports.iter().any(|(_, config)| config.is_none()) {
        out.push_str(
            "# A port declared `{}` is only named as its VLANs' link: netplan merges it\n\
             # with the definition Metal's provisioning wrote, and it sets nothing.\n",
        );
    }
    skipped_comments(&mut out, checks);
    out.push_str("network:\n  version: 2\n");
    for (section, bonds) in [("ethernets", false), ("bonds", true)] {
        let mut members = ports
            .iter()
            .filter(|(name, _)| is_bond(name) == bonds)
            .peekable();
        if members.peek().is_none() {
            continue;
        }
        let _ = writeln!(out, "  {section}:");
        for (name, config) in members {
            yaml_device(&mut out, 4, name, None, *config);
        }
    }
    if checks.any_tagged() {
        out.push_str("  vlans:\n");
        for link in checks.links.iter().filter(|l| l.vlan.is_some()) {
            yaml_device(&mut out, 4, link.name, link.vlan, Some(link));
        }
    }
    out
}

fn cloud_init(checks: &Checks<'_>) -> String {
    let mut out = String::from("#cloud-config\n");
    out.push_str("# Generated by metal-ipam: Layer2 / Hybrid VLANs.\n");
    if checks.links.is_empty() {
        skipped_comments(&mut out, checks);
        out.push_str("{}\n");
        return out;
    }
    let tagged = checks.any_tagged();
    out.push_str("write_files:\n");
    if tagged {
        let _ = writeln!(out, "  - path: {}", yaml_str(MODULES_LOAD_PATH));
        out.push_str("    permissions: \"0644\"\n");
        out.push_str("    content: |\n");
        let _ = writeln!(out, "      {VLAN_MODULE}");
    }
    let _ = writeln!(out, "  - path: {}", yaml_str(NETPLAN_PATH));
    out.push_str("    permissions: \"0600\"\n");
    out.push_str("    content: |\n");
    for line in netplan(checks).lines() {
        let _ = writeln!(out, "      {line}");
    }
    out.push_str("runcmd:\n");
    if tagged {
        let _ = writeln!(out, "  - [modprobe, {}]", yaml_str(VLAN_MODULE));
    }
    out.push_str("  - [netplan, apply]\n");
    out
}

// ---------------------------------------------------------------------------
// Shell (the script, and ifupdown's `post-up` / `pre-down` commands)
// ---------------------------------------------------------------------------

/// `s` as one shell word: bare when only `[A-Za-z0-9_./:@%+=,-]` (and not
/// empty), single-quoted otherwise.
fn sh_quote(s: &str) -> String {
    let bare = !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'_' | b'.' | b'/' | b':' | b'@' | b'%' | b'+' | b'=' | b',' | b'-'
                )
        });
    if bare {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `ip route <verb> TO via VIA dev NAME`.
fn ip_route(verb: &str, to: &IpNet, via: &IpAddr, dev: &str) -> String {
    format!(
        "ip route {verb} {} via {} dev {}",
        sh_quote(&to.to_string()),
        sh_quote(&via.to_string()),
        sh_quote(dev)
    )
}

fn shell(checks: &Checks<'_>) -> String {
    let mut out = String::from("#!/bin/sh\n");
    out.push_str(
        "# Generated by metal-ipam: Layer2 / Hybrid VLANs. Idempotent: safe to run again.\n",
    );
    skipped_comments(&mut out, checks);
    out.push_str("set -eu\n");
    if checks.any_tagged() {
        out.push_str("\n# 802.1Q VLAN sub-interfaces: load the module now and at every boot.\n");
        let _ = writeln!(out, "modprobe {VLAN_MODULE}");
        let dir = MODULES_LOAD_PATH.rsplit_once('/').map_or("/", |(d, _)| d);
        let _ = writeln!(out, "mkdir -p {}", sh_quote(dir));
        let _ = writeln!(out, "echo {VLAN_MODULE} > {}", sh_quote(MODULES_LOAD_PATH));
    }
    for link in &checks.links {
        let dev = sh_quote(link.name);
        out.push('\n');
        match link.vlan {
            Some((parent, id)) => {
                let _ = writeln!(out, "# {}: VLAN {id} on {parent}.", link.name);
                let _ = writeln!(
                    out,
                    "ip link show {dev} >/dev/null 2>&1 || ip link add link {} name {dev} type vlan id {id}",
                    sh_quote(parent)
                );
            }
            None => {
                let _ = writeln!(out, "# {}: untagged.", link.name);
            }
        }
        match link.mtu {
            Some(mtu) => {
                let _ = writeln!(out, "ip link set dev {dev} mtu {mtu} up");
            }
            None => {
                let _ = writeln!(out, "ip link set dev {dev} up");
            }
        }
        for address in &link.addresses {
            let _ = writeln!(
                out,
                "ip addr replace {} dev {dev}",
                sh_quote(&address.to_string())
            );
        }
        for (to, via) in &link.routes {
            let _ = writeln!(out, "{}", ip_route("replace", to, via, link.name));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// ifupdown
// ---------------------------------------------------------------------------

fn ifupdown(checks: &Checks<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Generated by metal-ipam: Layer2 / Hybrid VLANs ({IFUPDOWN_PATH})."
    );
    out.push_str(
        "# Read through `source /etc/network/interfaces.d/*` in /etc/network/interfaces.\n",
    );
    skipped_comments(&mut out, checks);
    for link in &checks.links {
        ifupdown_link(&mut out, link);
    }
    out
}

/// One `auto` line and a stanza per address (`inet` / `inet6 static`), or
/// one `inet manual` stanza when there is none. The first stanza carries
/// `pre-up modprobe 8021q` and the MTU; a route goes in the first stanza
/// of its family (its gateway is on-link once that address is up), or the
/// last one.
fn ifupdown_link(out: &mut String, link: &Checked<'_>) {
    let name = link.name;
    let _ = writeln!(out, "\nauto {name}");
    // (family, method, address)
    let stanzas: Vec<(&str, &str, Option<&IpNet>)> = if link.addresses.is_empty() {
        vec![("inet", "manual", None)]
    } else {
        link.addresses
            .iter()
            .map(|a| {
                (
                    if a.addr().is_ipv4() { "inet" } else { "inet6" },
                    "static",
                    Some(a),
                )
            })
            .collect()
    };
    let route_stanza = |via: &IpAddr| {
        let family = if via.is_ipv4() { "inet" } else { "inet6" };
        stanzas
            .iter()
            .position(|(f, _, a)| *f == family && a.is_some())
            .unwrap_or(stanzas.len() - 1)
    };
    for (k, (family, method, address)) in stanzas.iter().enumerate() {
        if k > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "iface {name} {family} {method}");
        if k == 0 && link.vlan.is_some() {
            let _ = writeln!(out, "    pre-up modprobe {VLAN_MODULE}");
        }
        if let Some((parent, _)) = link.vlan {
            let _ = writeln!(out, "    vlan-raw-device {parent}");
        }
        if let Some(address) = address {
            let _ = writeln!(out, "    address {address}");
        }
        if k == 0 {
            if let Some(mtu) = link.mtu {
                let _ = writeln!(out, "    mtu {mtu}");
            }
        }
        for (to, via) in link.routes.iter().filter(|(_, via)| route_stanza(via) == k) {
            let _ = writeln!(
                out,
                "    post-up {} || true",
                ip_route("replace", to, via, name)
            );
            let _ = writeln!(
                out,
                "    pre-down {} || true",
                ip_route("del", to, via, name)
            );
        }
    }
}
