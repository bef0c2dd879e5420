//! The node's network configuration (`network::render`): golden files per
//! scenario and format, the netplan and cloud-init YAML parsed back and
//! checked, every shell script through `shellcheck -s sh`, hostile values
//! left out rather than injected, and each mode's `network_data.json`
//! through real cloud-init (`convert_net_json`, then its netplan renderer),
//! compared with our netplan form.
//!
//! Golden files: `tests/golden/netconfig/<scenario>.<netplan.yaml|ifupdown|
//! cloud-init.yaml|sh|network-data.json>`. `UPDATE_GOLDEN=1 cargo test
//! --test netconfig` rewrites them (then review the diff). Without
//! shellcheck or a python3 with cloud-init those checks are skipped with a
//! notice; under `CI` they fail.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use metal_ipam_core::network::render::{
    render, Format, Link, NodeNetwork, Route, IFUPDOWN_PATH, MODULES_LOAD_PATH, NETPLAN_PATH,
};
use serde_norway::Value;

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

fn link(name: &str, vlan: Option<(&str, u16)>, addresses: &[&str]) -> Link {
    Link {
        name: name.into(),
        vlan: vlan.map(|(p, id)| (p.into(), id)),
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        routes: vec![],
        mtu: None,
    }
}

fn route(to: &str, via: &str) -> Route {
    Route {
        to: to.into(),
        via: via.into(),
    }
}

/// Hybrid-bonded: two tagged VLANs on Metal's bond0, one routed to a VRF
/// range via its Metal Gateway, one with jumbo frames.
fn hybrid_bonded() -> NodeNetwork {
    let mut storage = link("bond0.1010", Some(("bond0", 1010)), &["192.168.10.5/24"]);
    storage.routes = vec![route("10.10.0.0/16", "192.168.10.1")];
    let mut backend = link("bond0.1011", Some(("bond0", 1011)), &["192.168.11.5/24"]);
    backend.mtu = Some(9000);
    NodeNetwork {
        links: vec![storage, backend],
    }
}

/// Hybrid (unbonded): eth1 out of the bond, one VLAN, untagged.
fn hybrid() -> NodeNetwork {
    let mut eth1 = link("eth1", None, &["192.168.20.5/24"]);
    eth1.routes = vec![route("10.20.0.0/16", "192.168.20.1")];
    NodeNetwork { links: vec![eth1] }
}

/// Layer2-bonded: the native VLAN untagged on bond0, another one tagged.
fn layer2_bonded_native() -> NodeNetwork {
    let native = link("bond0", None, &["192.168.30.5/24"]);
    let mut tagged = link("bond0.1012", Some(("bond0", 1012)), &["192.168.12.5/24"]);
    tagged.routes = vec![route("10.12.0.0/16", "192.168.12.1")];
    tagged.mtu = Some(9000);
    NodeNetwork {
        links: vec![native, tagged],
    }
}

/// Layer2-individual: a tagged VLAN on each port, one of them IPv6.
fn layer2_individual() -> NodeNetwork {
    let eth0 = link("eth0.1010", Some(("eth0", 1010)), &["192.168.10.6/24"]);
    let mut eth1 = link("eth1.1011", Some(("eth1", 1011)), &["fd00:1011::6/64"]);
    eth1.routes = vec![route("fd00:1000::/48", "fd00:1011::1")];
    NodeNetwork {
        links: vec![eth0, eth1],
    }
}

/// Hybrid-bonded with two elastic IPs (one IPv6) on the loopback.
fn hybrid_bonded_elastic() -> NodeNetwork {
    let vlan = link("bond0.1010", Some(("bond0", 1010)), &["192.168.10.5/24"]);
    let lo = link("lo", None, &["10.10.1.5/32", "fd00:10::5/128"]);
    NodeNetwork {
        links: vec![vlan, lo],
    }
}

fn scenarios() -> Vec<(&'static str, NodeNetwork)> {
    vec![
        ("hybrid-bonded", hybrid_bonded()),
        ("hybrid-bonded-elastic", hybrid_bonded_elastic()),
        ("hybrid", hybrid()),
        ("layer2-bonded-native", layer2_bonded_native()),
        ("layer2-individual", layer2_individual()),
        ("empty", NodeNetwork::default()),
    ]
}

const FORMATS: [(Format, &str); 4] = [
    (Format::Netplan, "netplan.yaml"),
    (Format::Ifupdown, "ifupdown"),
    (Format::CloudInit, "cloud-init.yaml"),
    (Format::Shell, "sh"),
];

// ---------------------------------------------------------------------------
// Golden files
// ---------------------------------------------------------------------------

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/netconfig")
}

#[test]
fn golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let dir = golden_dir();
    if update {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut mismatches = Vec::new();
    for (scenario, net) in scenarios() {
        for (format, ext) in FORMATS {
            let path = dir.join(format!("{scenario}.{ext}"));
            let got = render(&net, format);
            assert_eq!(
                got,
                render(&net, format),
                "{scenario}.{ext}: not deterministic"
            );
            if update {
                std::fs::write(&path, &got).unwrap();
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(want) if want == got => {}
                Ok(want) => mismatches.push(format!(
                    "{}: differs\n--- want\n{want}--- got\n{got}",
                    path.display()
                )),
                Err(e) => mismatches.push(format!("{}: {e}", path.display())),
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "golden files differ (UPDATE_GOLDEN=1 rewrites them):\n{}",
        mismatches.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Netplan, parsed back
// ---------------------------------------------------------------------------

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).unwrap_or_else(|e| panic!("not YAML: {e}\n{text}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a sequence: {v:?}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn is_empty_mapping(v: &Value) -> bool {
    v.as_mapping().is_some_and(|m| m.is_empty())
}

#[test]
fn netplan_hybrid_bonded() {
    let doc = yaml(&render(&hybrid_bonded(), Format::Netplan));
    let network = &doc["network"];
    assert_eq!(network["version"].as_u64(), Some(2));
    // The parent: declared as a bond, empty (merged with Metal's own bond0).
    assert!(is_empty_mapping(&network["bonds"]["bond0"]));
    assert!(network.get("ethernets").is_none());
    let vlans = network["vlans"].as_mapping().unwrap();
    assert_eq!(vlans.len(), 2);
    let v = &network["vlans"]["bond0.1010"];
    assert_eq!(v["id"].as_u64(), Some(1010));
    assert_eq!(v["link"].as_str(), Some("bond0"));
    assert_eq!(strings(&v["addresses"]), ["192.168.10.5/24"]);
    assert_eq!(v["routes"][0]["to"].as_str(), Some("10.10.0.0/16"));
    assert_eq!(v["routes"][0]["via"].as_str(), Some("192.168.10.1"));
    assert!(v.get("mtu").is_none());
    let v = &network["vlans"]["bond0.1011"];
    assert_eq!(v["id"].as_u64(), Some(1011));
    assert_eq!(v["link"].as_str(), Some("bond0"));
    assert_eq!(v["mtu"].as_u64(), Some(9000));
    assert!(v.get("routes").is_none());
}

#[test]
fn netplan_hybrid_untagged_port() {
    let doc = yaml(&render(&hybrid(), Format::Netplan));
    let network = &doc["network"];
    assert_eq!(network["version"].as_u64(), Some(2));
    let eth1 = &network["ethernets"]["eth1"];
    assert_eq!(strings(&eth1["addresses"]), ["192.168.20.5/24"]);
    assert_eq!(eth1["routes"][0]["via"].as_str(), Some("192.168.20.1"));
    assert!(network.get("vlans").is_none());
    assert!(network.get("bonds").is_none());
}

#[test]
fn netplan_layer2_bonded_native() {
    let doc = yaml(&render(&layer2_bonded_native(), Format::Netplan));
    let network = &doc["network"];
    // The native VLAN's address on the bond: the parent entry carries it,
    // declared once.
    let bond0 = &network["bonds"]["bond0"];
    assert_eq!(strings(&bond0["addresses"]), ["192.168.30.5/24"]);
    assert!(bond0.get("interfaces").is_none() && bond0.get("parameters").is_none());
    let v = &network["vlans"]["bond0.1012"];
    assert_eq!(v["id"].as_u64(), Some(1012));
    assert_eq!(v["link"].as_str(), Some("bond0"));
    assert_eq!(v["mtu"].as_u64(), Some(9000));
}

#[test]
fn netplan_layer2_individual() {
    let doc = yaml(&render(&layer2_individual(), Format::Netplan));
    let network = &doc["network"];
    assert!(is_empty_mapping(&network["ethernets"]["eth0"]));
    assert!(is_empty_mapping(&network["ethernets"]["eth1"]));
    assert!(network.get("bonds").is_none());
    let v = &network["vlans"]["eth1.1011"];
    assert_eq!(v["id"].as_u64(), Some(1011));
    assert_eq!(v["link"].as_str(), Some("eth1"));
    assert_eq!(strings(&v["addresses"]), ["fd00:1011::6/64"]);
    assert_eq!(v["routes"][0]["to"].as_str(), Some("fd00:1000::/48"));
    assert_eq!(v["routes"][0]["via"].as_str(), Some("fd00:1011::1"));
    assert_eq!(network["vlans"]["eth0.1010"]["link"].as_str(), Some("eth0"));
}

#[test]
fn netplan_empty_is_a_noop_document() {
    let doc = yaml(&render(&NodeNetwork::default(), Format::Netplan));
    let network = doc["network"].as_mapping().unwrap();
    assert_eq!(network.len(), 1);
    assert_eq!(doc["network"]["version"].as_u64(), Some(2));
}

// ---------------------------------------------------------------------------
// Cloud-init, parsed back
// ---------------------------------------------------------------------------

fn runcmd(doc: &Value) -> Vec<Vec<String>> {
    doc["runcmd"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(strings)
        .collect()
}

#[test]
fn cloud_init_documents() {
    for (scenario, net) in scenarios() {
        let text = render(&net, Format::CloudInit);
        assert_eq!(text.lines().next(), Some("#cloud-config"), "{scenario}");
        let doc = yaml(&text);
        let tagged = net.links.iter().any(|l| l.vlan.is_some());
        if net.links.is_empty() {
            assert!(is_empty_mapping(&doc), "{scenario}: {doc:?}");
            continue;
        }
        let files = doc["write_files"].as_sequence().unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
        let mut want = vec![];
        if tagged {
            want.push(MODULES_LOAD_PATH);
        }
        want.push(NETPLAN_PATH);
        assert_eq!(paths, want, "{scenario}");
        let netplan_file = files.last().unwrap();
        assert_eq!(netplan_file["permissions"].as_str(), Some("0600"));
        // The file is exactly the netplan rendering.
        assert_eq!(
            netplan_file["content"].as_str(),
            Some(render(&net, Format::Netplan).as_str()),
            "{scenario}"
        );
        if tagged {
            assert_eq!(files[0]["content"].as_str(), Some("8021q\n"));
        }
        let mut want: Vec<Vec<String>> = vec![];
        if tagged {
            want.push(vec!["modprobe".into(), "8021q".into()]);
        }
        want.push(vec!["netplan".into(), "apply".into()]);
        assert_eq!(runcmd(&doc), want, "{scenario}");
    }
}

// ---------------------------------------------------------------------------
// Shell
// ---------------------------------------------------------------------------

/// Runs `shellcheck -s sh` on `script`. `None` when the binary is missing
/// (and CI is not set: in CI a missing shellcheck fails the test).
fn shellcheck(script: &str) -> Option<(bool, String)> {
    let child = Command::new("shellcheck")
        .args(["-s", "sh", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none(),
                "shellcheck is not installed, and CI is set: install it"
            );
            eprintln!("notice: shellcheck not found; skipping the shell script check");
            return None;
        }
        Err(e) => panic!("shellcheck: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), report))
}

fn assert_shellcheck_clean(name: &str, script: &str) {
    if let Some((ok, report)) = shellcheck(script) {
        assert!(ok, "{name}: shellcheck:\n{report}\n{script}");
    }
}

#[test]
fn shell_scripts_pass_shellcheck() {
    for (scenario, net) in scenarios() {
        let script = render(&net, Format::Shell);
        assert!(script.starts_with("#!/bin/sh\n"), "{scenario}");
        assert!(script.contains("\nset -eu\n"), "{scenario}");
        assert_shellcheck_clean(scenario, &script);
    }
}

#[test]
fn shell_is_idempotent_by_construction() {
    let script = render(&hybrid_bonded(), Format::Shell);
    for line in script
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        // Every command either checks first, replaces, or is harmless to
        // repeat; nothing uses `ip addr add` / `ip route add`.
        assert!(
            !line.contains("ip addr add") && !line.contains("ip route add"),
            "{line}"
        );
        if line.contains("ip link add") {
            assert!(line.starts_with("ip link show "), "{line}");
        }
    }
    assert!(script.contains("modprobe 8021q\n"));
    assert!(script.contains(&format!("echo 8021q > {MODULES_LOAD_PATH}\n")));
    // Untagged only: no VLAN module.
    let script = render(&hybrid(), Format::Shell);
    assert!(!script.contains("8021q"));
    assert!(!script.contains("ip link add"));
}

// ---------------------------------------------------------------------------
// ifupdown
// ---------------------------------------------------------------------------

#[test]
fn ifupdown_dual_stack_routes_follow_their_family() {
    let mut l = link(
        "bond0.1020",
        Some(("bond0", 1020)),
        &["192.168.20.5/24", "fd00:20::5/64"],
    );
    l.routes = vec![
        route("fd00::/48", "fd00:20::1"),
        route("10.20.0.0/16", "192.168.20.1"),
    ];
    l.mtu = Some(1500);
    let text = render(&NodeNetwork { links: vec![l] }, Format::Ifupdown);
    let inet = text.find("iface bond0.1020 inet static").unwrap();
    let inet6 = text.find("iface bond0.1020 inet6 static").unwrap();
    let v4_route = text.find("post-up ip route replace 10.20.0.0/16").unwrap();
    let v6_route = text.find("post-up ip route replace fd00::/48").unwrap();
    assert!(inet < v4_route && v4_route < inet6, "{text}");
    assert!(inet6 < v6_route, "{text}");
    assert_eq!(text.matches("auto bond0.1020\n").count(), 1);
    assert_eq!(text.matches("    mtu 1500\n").count(), 1);
    assert_eq!(text.matches("    pre-up modprobe 8021q\n").count(), 1);
}

#[test]
fn ifupdown_link_without_address_is_manual() {
    let l = link("eth1.1030", Some(("eth1", 1030)), &[]);
    let text = render(&NodeNetwork { links: vec![l] }, Format::Ifupdown);
    assert!(
        text.contains(
            "iface eth1.1030 inet manual\n    pre-up modprobe 8021q\n    vlan-raw-device eth1\n"
        ),
        "{text}"
    );
}

#[test]
fn paths() {
    assert_eq!(Format::Netplan.path(), Some(NETPLAN_PATH));
    assert_eq!(Format::Ifupdown.path(), Some(IFUPDOWN_PATH));
    assert_eq!(Format::CloudInit.path(), None);
    assert_eq!(Format::Shell.path(), None);
}

// ---------------------------------------------------------------------------
// Hostile values: left out, never injected
// ---------------------------------------------------------------------------

fn hostile() -> NodeNetwork {
    let mut ok = link("bond0.1010", Some(("bond0", 1010)), &["192.168.10.5/24"]);
    ok.addresses.push("192.168.10.6/24\nauto evil".into());
    ok.addresses.push("192.168.10.7".into()); // no prefix length
    ok.routes = vec![
        route("10.10.0.0/16", "192.168.10.1; reboot"),
        route("10.11.0.0/16'$(reboot)'", "192.168.10.1"),
        route("10.12.0.0/16", "fd00::1"), // families differ
        route("10.13.0.0/16", "192.168.10.1"),
    ];
    NodeNetwork {
        links: vec![
            ok,
            link("eth1; reboot", None, &["192.168.20.5/24"]),
            link("bond0.1011", Some(("bond0\n  evil: 1", 1011)), &[]),
            link("bond0.4095", Some(("bond0", 4095)), &[]),
            link("bond0.1010", Some(("bond0", 1010)), &["192.168.10.9/24"]),
            link("waytoolonginterfacename", None, &[]),
            link("-eth2", None, &[]),
            link("bond0.1010.5", Some(("bond0.1010", 5)), &[]),
            link("eth1", Some(("eth1", 7)), &[]),
        ],
    }
}

#[test]
fn hostile_values_are_left_out() {
    let net = hostile();
    for (format, ext) in FORMATS {
        let text = render(&net, format);
        for needle in [
            "reboot",
            "evil",
            "192.168.10.6",
            "192.168.10.7",
            "192.168.10.9",
            "10.11.0.0",
            "10.12.0.0",
            "waytoolong",
            "-eth2",
            "id 4095",
            "id: 4095",
            "id 5",
            "id: 5",
            "link: bond0.1010",
            "auto bond0.1010.5",
            "id 7",
            "id: 7",
        ] {
            assert!(
                !text.contains(needle),
                "{ext}: {needle:?} rendered:\n{text}"
            );
        }
        // What is valid is still there; what is not is reported by index.
        assert!(text.contains("192.168.10.5/24"), "{ext}:\n{text}");
        assert!(text.contains("10.13.0.0/16"), "{ext}:\n{text}");
        for note in [
            "# metal-ipam: skipped links[0] (bond0.1010): addresses[1] is not an IP address with a prefix length",
            "# metal-ipam: skipped links[0] (bond0.1010): addresses[2] is not an IP address with a prefix length",
            "# metal-ipam: skipped links[0] (bond0.1010): routes[0] is not a network via an IP address",
            "# metal-ipam: skipped links[0] (bond0.1010): routes[1] is not a network via an IP address",
            "# metal-ipam: skipped links[0] (bond0.1010): routes[2] mixes IPv4 and IPv6",
            "# metal-ipam: skipped links[1]: not a valid interface name",
            "# metal-ipam: skipped links[2] (bond0.1011): parent is not a valid interface name",
            "# metal-ipam: skipped links[3] (bond0.4095): VLAN tag not in 1..=4094",
            "# metal-ipam: skipped links[4] (bond0.1010): a link of that name comes earlier",
            "# metal-ipam: skipped links[5]: not a valid interface name",
            "# metal-ipam: skipped links[6]: not a valid interface name",
            "# metal-ipam: skipped links[8] (eth1): is its own parent",
            "# metal-ipam: skipped bond0.1010.5: its parent bond0.1010 is itself a VLAN sub-interface",
        ] {
            assert!(text.contains(note), "{ext}: missing {note:?}:\n{text}");
        }
    }
    let netplan = yaml(&render(&net, Format::Netplan));
    assert_eq!(netplan["network"]["vlans"].as_mapping().unwrap().len(), 1);
    let cloud = render(&net, Format::CloudInit);
    assert!(cloud.starts_with("#cloud-config\n"));
    yaml(&cloud);
    assert_shellcheck_clean("hostile", &render(&net, Format::Shell));
}

#[test]
fn yaml_quotes_what_would_not_read_back_as_a_string() {
    // Names Linux accepts but YAML would read as a number or a boolean.
    let net = NodeNetwork {
        links: vec![
            link("1010", Some(("on", 1010)), &["10.0.0.5/24"]),
            link("yes", None, &["10.0.1.5/24"]),
        ],
    };
    let text = render(&net, Format::Netplan);
    let doc = yaml(&text);
    let network = &doc["network"];
    assert_eq!(
        network["vlans"]["1010"]["link"].as_str(),
        Some("on"),
        "{text}"
    );
    assert!(is_empty_mapping(&network["ethernets"]["on"]), "{text}");
    assert_eq!(
        strings(&network["ethernets"]["yes"]["addresses"]),
        ["10.0.1.5/24"]
    );
    let cloud = yaml(&render(&net, Format::CloudInit));
    assert_eq!(
        cloud["write_files"][1]["content"].as_str(),
        Some(text.as_str())
    );
}
// ---------------------------------------------------------------------------
// OpenStack network_data.json: golden files, and what real cloud-init
// makes of them
// ---------------------------------------------------------------------------

mod network_data {
    use super::*;
    use metal_ipam_core::cloud::DeviceView;
    use metal_ipam_core::metal::model::Device;
    use metal_ipam_core::network::network_data::{
        host, render as render_nd, Bond, Host, Layer3Address, PhysicalPort,
    };
    use metal_ipam_core::network::node::{node_network, Slot};
    use metal_ipam_core::network::profile::{bonds, Mode, Profile};
    use serde_json::{json, Value as Json};
    use std::collections::BTreeMap;

    /// The MACs of eth0–eth3 (2-port scenarios use the first two).
    const MACS: [&str; 4] = [
        "aa:bb:cc:00:00:01",
        "aa:bb:cc:00:00:02",
        "aa:bb:cc:00:00:03",
        "aa:bb:cc:00:00:04",
    ];

    fn ports() -> Vec<PhysicalPort> {
        vec![
            PhysicalPort {
                name: "eth0".into(),
                mac: Some(MACS[0].into()),
            },
            PhysicalPort {
                name: "eth1".into(),
                mac: Some(MACS[1].into()),
            },
        ]
    }

    fn bond0(members: &[&str]) -> Vec<Bond> {
        vec![Bond {
            name: "bond0".into(),
            members: members.iter().map(|m| m.to_string()).collect(),
        }]
    }

    /// Metal's management addresses on bond0 (documentation ranges), with
    /// Metal's routes.
    fn layer3() -> Vec<Layer3Address> {
        let a = |address: &str, to: &str, via: &str| Layer3Address {
            link: "bond0".into(),
            address: address.parse().unwrap(),
            routes: vec![(to.parse().unwrap(), via.parse().unwrap())],
        };
        vec![
            a("198.51.100.3/31", "0.0.0.0/0", "198.51.100.2"),
            a("2001:db8:c500::3/127", "::/0", "2001:db8:c500::2"),
            a("10.70.12.3/31", "10.0.0.0/8", "10.70.12.2"),
        ]
    }

    /// Every bond mode Metal has on a 2-port device: the scenario (the
    /// other formats' name where they have one), the links metal-ipam
    /// adds, the device.
    fn two_port_scenarios() -> Vec<(String, NodeNetwork, Host)> {
        let l3 = |members: &[&str]| Host {
            ports: ports(),
            bonds: bond0(members),
            layer3: layer3(),
            nameservers: vec![],
        };
        let l2 = |members: &[&str]| Host {
            ports: ports(),
            bonds: bond0(members),
            ..Host::default()
        };
        vec![
            ("layer3", NodeNetwork::default(), l3(&["eth0", "eth1"])),
            ("hybrid-bonded", hybrid_bonded(), l3(&["eth0", "eth1"])),
            (
                "hybrid-bonded-elastic",
                hybrid_bonded_elastic(),
                l3(&["eth0", "eth1"]),
            ),
            ("hybrid", hybrid(), l3(&["eth0"])),
            (
                "layer2-bonded-native",
                layer2_bonded_native(),
                l2(&["eth0", "eth1"]),
            ),
            ("layer2-individual", layer2_individual(), l2(&[])),
        ]
        .into_iter()
        .map(|(s, n, mut h)| {
            h.bonds.retain(|b| !b.members.is_empty());
            (s.to_string(), n, h)
        })
        .collect()
    }

    const MODES: [Mode; 5] = [
        Mode::Layer3,
        Mode::HybridBonded,
        Mode::Hybrid,
        Mode::Layer2Bonded,
        Mode::Layer2Individual,
    ];

    /// A 4-port device as Metal reports it (bond0 = eth0 + eth2, bond1 =
    /// eth1 + eth3), with its management addresses.
    fn four_port_device() -> DeviceView {
        let mut ports = vec![
            json!({"id": "b0", "name": "bond0", "type": "NetworkBondPort"}),
            json!({"id": "b1", "name": "bond1", "type": "NetworkBondPort"}),
        ];
        for (i, mac) in MACS.iter().enumerate() {
            ports.push(json!({"id": format!("p{i}"), "name": format!("eth{i}"),
                "type": "NetworkPort", "data": {"mac": mac.to_ascii_uppercase()}}));
        }
        serde_json::from_value(json!({"id": "d4", "network_ports": ports, "ip_addresses": [
            {"address": "198.51.100.3", "cidr": 31, "gateway": "198.51.100.2",
             "address_family": 4, "public": true, "management": true},
            {"address": "2001:db8:c500::3", "cidr": 127, "gateway": "2001:db8:c500::2",
             "address_family": 6, "public": true, "management": true},
            {"address": "10.70.12.3", "cidr": 31, "gateway": "10.70.12.2",
             "address_family": 4, "public": false, "management": true}]}))
        .map(|d: Device| DeviceView::from(d))
        .unwrap()
    }

    /// A VLAN `vxlan` of a profile with a static address (IPv4 or IPv6),
    /// a route of its own (IPv4) or jumbo frames (IPv6).
    fn vlan(vxlan: u16, v6: bool) -> Json {
        let n = vxlan - 1000;
        if v6 {
            json!({"vxlan": vxlan, "addresses": [{"static": format!("fd00:{vxlan}::5/64")}],
                   "mtu": 9000})
        } else {
            json!({"vxlan": vxlan, "addresses": [{"static": format!("192.168.{n}.5/24")}],
                   "routes": [{"to": format!("172.16.{n}.0/24"),
                               "via": format!("192.168.{n}.1")}]})
        }
    }

    /// The profile entries that put bond `b` of a 4-port device in `mode`:
    /// its VLANs are `1b01`…`1b03` (tagged or untagged as Metal delivers
    /// them; no native VLAN, which Metal does not offer on 4-port devices).
    fn entries(b: usize, mode: Mode) -> Vec<Json> {
        let (bond, members) = bonds(4)[b].clone();
        let v = |k: u16| 1000 + 100 * (b as u16 + 1) + k;
        match mode {
            // bond0 keeps Metal's addresses; an elastic IP on it too.
            Mode::Layer3 if b == 0 => {
                vec![json!({"name": bond, "elasticIPs": [{"pool": {"name": "vrf"}}]})]
            }
            Mode::Layer3 => vec![],
            Mode::HybridBonded => {
                vec![json!({"name": bond, "vlans": [vlan(v(1), false), vlan(v(2), true)]})]
            }
            Mode::Hybrid => {
                vec![json!({"name": members[1], "bonded": false, "vlans": [vlan(v(1), false)]})]
            }
            Mode::Layer2Bonded => vec![
                json!({"name": bond, "layer2": true, "vlans": [vlan(v(1), false), vlan(v(2), true)]}),
            ],
            Mode::Layer2Individual => vec![
                json!({"name": bond, "layer2": true, "bonded": false}),
                json!({"name": members[0], "vlans": [vlan(v(1), false)]}),
                json!({"name": members[1], "vlans": [vlan(v(2), false), vlan(v(3), true)]}),
            ],
        }
    }

    /// One 4-port scenario: the profile with bond0 in `m0` and bond1 in
    /// `m1`, applied to [`four_port_device`] as the netconfig route does
    /// (`node_network` for the links, `host` for the device).
    fn four_port(m0: Mode, m1: Mode) -> (String, NodeNetwork, Host) {
        let name = format!("4port-bond0-{}-bond1-{}", m0.as_str(), m1.as_str());
        let mut ports = entries(0, m0);
        ports.extend(entries(1, m1));
        let profile = Profile::from_json(&json!({"metro": "da", "ports": ports}))
            .unwrap()
            .on_device(4);
        profile
            .validate()
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let modes = profile.modes();
        assert_eq!((modes["bond0"], modes["bond1"]), (m0, m1), "{name}");
        let (net, pending) = node_network(&profile, &|r| r.vxlan, &|_, slot, _| match slot {
            Slot::Elastic(_) => Some("10.10.1.5/32".into()),
            Slot::Vlan(_) => None,
        })
        .unwrap();
        assert!(pending.is_empty(), "{name}: {pending:?}");
        let host = host(&profile, &four_port_device(), vec![]);
        (name, net, host)
    }

    /// Every combination of the two bonds' modes on a 4-port device.
    fn four_port_scenarios() -> Vec<(String, NodeNetwork, Host)> {
        MODES
            .iter()
            .flat_map(|&m0| MODES.iter().map(move |&m1| four_port(m0, m1)))
            .collect()
    }

    fn scenarios() -> Vec<(String, NodeNetwork, Host)> {
        let mut all = two_port_scenarios();
        all.extend(four_port_scenarios());
        all
    }

    #[test]
    fn golden_network_data() {
        let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
        let mut mismatches = Vec::new();
        for (scenario, net, host) in scenarios() {
            let path = golden_dir().join(format!("{scenario}.network-data.json"));
            let got = render_nd(&net, &host).unwrap();
            assert_eq!(got, render_nd(&net, &host).unwrap(), "{scenario}");
            let doc: Json = serde_json::from_str(&got).unwrap();
            assert!(doc.get("metal_ipam_skipped").is_none(), "{scenario}: {got}");
            if update {
                std::fs::write(&path, &got).unwrap();
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(want) if want == got => {}
                Ok(want) => mismatches.push(format!(
                    "{}: differs\n--- want\n{want}--- got\n{got}",
                    path.display()
                )),
                Err(e) => mismatches.push(format!("{}: {e}", path.display())),
            }
        }
        assert!(
            mismatches.is_empty(),
            "golden files differ (UPDATE_GOLDEN=1 rewrites them):\n{}",
            mismatches.join("\n")
        );
    }

    /// The 4-port scenarios' devices are what `host` makes of the profile:
    /// bonds in Metal's order with their bonded members, Metal's Layer3
    /// addresses on bond0 in the modes that keep them.
    #[test]
    fn four_port_hosts() {
        for m0 in MODES {
            for m1 in MODES {
                let (scenario, _, h) = four_port(m0, m1);
                let mut want: Vec<(String, Vec<String>)> = Vec::new();
                for (b, mode) in [m0, m1].into_iter().enumerate() {
                    let (bond, members) = bonds(4)[b].clone();
                    let members: Vec<String> = match mode {
                        Mode::Layer2Individual => continue,
                        Mode::Hybrid => vec![members[0].to_string()],
                        _ => members.iter().map(|m| m.to_string()).collect(),
                    };
                    want.push((bond.to_string(), members));
                }
                let have: Vec<(String, Vec<String>)> = h
                    .bonds
                    .iter()
                    .map(|b| (b.name.clone(), b.members.clone()))
                    .collect();
                assert_eq!(have, want, "{scenario}");
                let l3 = matches!(m0, Mode::Layer3 | Mode::HybridBonded | Mode::Hybrid);
                assert_eq!(h.layer3.len(), if l3 { 3 } else { 0 }, "{scenario}");
                assert!(h.layer3.iter().all(|a| a.link == "bond0"), "{scenario}");
                assert_eq!(h.ports.len(), 4, "{scenario}");
            }
        }
    }

    #[test]
    fn render_without_a_host_leaves_every_link_out() {
        let doc: Json =
            serde_json::from_str(&render(&hybrid_bonded(), Format::NetworkData)).unwrap();
        assert_eq!(doc["links"], serde_json::json!([]));
        assert_eq!(doc["metal_ipam_skipped"].as_array().unwrap().len(), 2);
        assert_eq!(Format::NetworkData.path(), None);
    }

    // -- Real cloud-init ----------------------------------------------------

    /// Converts each `network_data.json` of the list on stdin as a
    /// ConfigDrive would (`known_macs`: the node's MAC → interface name,
    /// argv[1]), then renders the result as netplan: a list of
    /// `{"v1": <network config v1>, "netplan": "<yaml>"}` or
    /// `{"error": "<what cloud-init raised>"}`. The renderer is given
    /// netplan's features (none) rather than asking an installed `netplan
    /// info` for them: the only one it consults, `ipv6-mtu`, applies to a
    /// network's `mtu`, which we never set.
    const CONVERT: &str = r#"
import json, sys, traceback
from cloudinit.sources.helpers.openstack import convert_net_json
from cloudinit.net.network_state import parse_net_config_data
from cloudinit.net import netplan
macs = json.loads(sys.argv[1])
out = []
for nd in json.load(sys.stdin):
    try:
        v1 = convert_net_json(nd, known_macs=macs)
        state = parse_net_config_data(v1)
        r = netplan.Renderer({"netplan_path": "/nonexistent/50-cloud-init.yaml",
                              "postcmds": False, "features": []})
        out.append({"v1": v1, "netplan": r._render_content(state)})
    except Exception:
        out.append({"error": traceback.format_exc()})
print(json.dumps(out))
"#;

    /// A Python that imports cloud-init: `$CLOUD_INIT_PYTHON`, `python3`
    /// or Debian's `/usr/bin/python3` (a pyenv `python3` first on the PATH
    /// does not see Debian's packages). `None` when there is none (and CI
    /// is not set: in CI that fails the test).
    fn cloud_init_python() -> Option<String> {
        let candidates = std::env::var("CLOUD_INIT_PYTHON")
            .into_iter()
            .chain(["python3".to_string(), "/usr/bin/python3".to_string()]);
        for py in candidates {
            let ok = Command::new(&py)
                .args(["-c", "import cloudinit.sources.helpers.openstack"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Some(py);
            }
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with cloud-init is not installed, and CI is set: install it \
             (apt-get install -y --no-install-recommends cloud-init)"
        );
        eprintln!("notice: python3 with cloud-init not found; skipping the cloud-init check");
        None
    }

    /// Each of `docs` through cloud-init (one Python process for all), on
    /// a node whose ports eth0–eth3 have [`MACS`].
    fn convert_all(py: &str, docs: &[String]) -> Vec<Json> {
        let macs: BTreeMap<&str, String> = MACS
            .iter()
            .enumerate()
            .map(|(i, m)| (*m, format!("eth{i}")))
            .collect();
        let docs: Vec<Json> = docs
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let mut child = Command::new(py)
            .args(["-c", CONVERT, &serde_json::to_string(&macs).unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(serde_json::to_string(&docs).unwrap().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "cloud-init's converter did not run:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<Json> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got.len(), docs.len());
        for (g, d) in got.iter().zip(&docs) {
            assert!(
                g.get("error").is_none(),
                "cloud-init refused it:\n{}\n{d:#}",
                g["error"].as_str().unwrap_or_default()
            );
        }
        got
    }

    fn convert(py: &str, network_data: &str) -> Json {
        convert_all(py, &[network_data.to_string()]).remove(0)
    }

    /// One interface as netplan says it: `(link, id)` for a VLAN, its
    /// addresses, routes `(to, via)`, MTU, the MAC it is matched by (a
    /// port) and its members (a bond).
    #[derive(Debug, Default, PartialEq)]
    struct Iface {
        vlan: Option<(String, u64)>,
        addresses: Vec<String>,
        routes: Vec<(String, String)>,
        mtu: Option<u64>,
        matched_by: Option<String>,
        members: Vec<String>,
    }

    /// Every interface of a netplan document, by name.
    fn interfaces(netplan: &str) -> BTreeMap<String, Iface> {
        let doc = yaml(netplan);
        let mut out = BTreeMap::new();
        for section in ["ethernets", "bonds", "vlans"] {
            let Some(m) = doc["network"].get(section).and_then(Value::as_mapping) else {
                continue;
            };
            for (name, v) in m {
                let iface = Iface {
                    vlan: v.get("id").map(|id| {
                        (
                            v["link"].as_str().unwrap().to_string(),
                            id.as_u64().unwrap(),
                        )
                    }),
                    addresses: v.get("addresses").map(strings).unwrap_or_default(),
                    routes: v
                        .get("routes")
                        .and_then(Value::as_sequence)
                        .into_iter()
                        .flatten()
                        .map(|r| {
                            (
                                r["to"].as_str().unwrap().to_string(),
                                r["via"].as_str().unwrap().to_string(),
                            )
                        })
                        .collect(),
                    mtu: v.get("mtu").and_then(Value::as_u64),
                    matched_by: v
                        .get("match")
                        .and_then(|m| m.get("macaddress"))
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    members: v.get("interfaces").map(strings).unwrap_or_default(),
                };
                out.insert(name.as_str().unwrap().to_string(), iface);
            }
        }
        out
    }

    /// The number in a bond name `bond<n>`.
    fn bond_number(name: &str) -> usize {
        name.strip_prefix("bond")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not bond<n>"))
    }

    /// For every mode on 2-port devices and every pair of modes on 4-port
    /// ones: cloud-init accepts the golden network_data.json, and what it
    /// makes of it carries what our netplan form says (same VLAN names,
    /// ids and parents, addresses, routes, MTUs; the elastic IPs, on `lo`
    /// there, on the Layer3 bond here), plus the device itself: each port
    /// found by its own MAC, each bond under Metal's name (`bond1` stays
    /// `bond1` whatever bond0 is) with its members in Metal's LACP mode,
    /// Metal's Layer3 addresses and routes on bond0.
    #[test]
    fn cloud_init_accepts_network_data() {
        let Some(py) = cloud_init_python() else {
            return;
        };
        let all = scenarios();
        let texts: Vec<String> = all
            .iter()
            .map(|(scenario, _, _)| {
                std::fs::read_to_string(golden_dir().join(format!("{scenario}.network-data.json")))
                    .unwrap_or_else(|e| panic!("{scenario}: {e} (UPDATE_GOLDEN=1 writes it)"))
            })
            .collect();
        let converted = convert_all(&py, &texts);
        // Every scenario checked, the failures reported together.
        let failed: Vec<String> = all
            .iter()
            .zip(converted)
            .filter_map(|((scenario, net, host), got)| {
                std::panic::catch_unwind(|| check_conversion(scenario, net, host, &got))
                    .err()
                    .map(|e| {
                        let why = e
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        format!("{scenario}: {}", why.lines().next().unwrap_or_default())
                    })
            })
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {} scenarios differ through cloud-init:\n{}",
            failed.len(),
            all.len(),
            failed.join("\n")
        );
    }

    fn check_conversion(scenario: &str, net: &NodeNetwork, host: &Host, got: &Json) {
        let config = got["v1"]["config"].as_array().unwrap();
        let by_name = |n: &str| config.iter().find(|c| c["name"] == n);
        let theirs = interfaces(got["netplan"].as_str().unwrap());

        // The bonds under Metal's names, with their members; any other
        // bond cloud-init has is an empty placeholder numbered below one
        // of ours (it holds a name: cloud-init numbers bonds in order).
        let bonds: Vec<&Json> = config.iter().filter(|c| c["type"] == "bond").collect();
        let last = host.bonds.iter().map(|b| bond_number(&b.name)).max();
        let names: Vec<&str> = bonds.iter().filter_map(|b| b["name"].as_str()).collect();
        let members: Vec<&Json> = bonds.iter().map(|b| &b["bond_interfaces"]).collect();
        assert_eq!(
            names.len(),
            last.map_or(0, |n| n + 1),
            "{scenario}: cloud-init's bonds {names:?} of {members:?}, Metal's {:?}",
            host.bonds
        );
        for b in &bonds {
            let name = b["name"].as_str().unwrap();
            let have = &theirs[name];
            match host.bonds.iter().find(|w| w.name == name) {
                Some(want) => {
                    assert_eq!(b["bond_interfaces"], json!(want.members), "{scenario}");
                    assert_eq!(have.members, want.members, "{scenario}: {name}");
                    assert_eq!(b["params"]["bond_mode"], "802.3ad", "{scenario}");
                    assert_eq!(
                        b["params"]["bond_xmit_hash_policy"], "layer3+4",
                        "{scenario}"
                    );
                }
                None => {
                    assert_eq!(b["bond_interfaces"], json!([]), "{scenario}: {name}");
                    assert!(
                        have.members.is_empty() && have.addresses.is_empty(),
                        "{scenario}: {name}: {have:?}"
                    );
                    assert!(
                        theirs
                            .values()
                            .all(|i| i.vlan.as_ref().is_none_or(|(parent, _)| parent != name)),
                        "{scenario}: a VLAN on the placeholder {name}"
                    );
                }
            }
        }

        // The ports, each by its own MAC (a bond's MAC, which cloud-init
        // copies onto its members, would have netplan match a member by
        // another port's MAC).
        for p in &host.ports {
            let mac = p.mac.as_deref().unwrap();
            let c = by_name(&p.name).unwrap_or_else(|| panic!("{scenario}: no {}", p.name));
            assert_eq!(
                (c["type"].as_str(), c["mac_address"].as_str()),
                (Some("physical"), Some(mac)),
                "{scenario}"
            );
            assert_eq!(
                theirs[&p.name].matched_by.as_deref(),
                Some(mac),
                "{scenario}: netplan matches {} by another port's MAC",
                p.name
            );
        }

        // cloud-init's netplan against ours.
        let ours = interfaces(&render(net, Format::Netplan));
        for (name, want) in &ours {
            let on = if name == "lo" { "bond0" } else { name.as_str() };
            let have = theirs
                .get(on)
                .unwrap_or_else(|| panic!("{scenario}: cloud-init has no {on}: {theirs:?}"));
            assert_eq!(have.vlan, want.vlan, "{scenario}: {name}");
            for a in &want.addresses {
                assert!(
                    have.addresses.contains(a),
                    "{scenario}: {name}: {a} {have:?}"
                );
            }
            for r in &want.routes {
                assert!(
                    have.routes.contains(r),
                    "{scenario}: {name}: {r:?} {have:?}"
                );
            }
            if want.mtu.is_some() {
                assert_eq!(have.mtu, want.mtu, "{scenario}: {name}");
            }
        }
        // No more VLANs than ours.
        let vlans = |m: &BTreeMap<String, Iface>| {
            m.iter()
                .filter(|(_, i)| i.vlan.is_some())
                .map(|(n, i)| (n.clone(), i.vlan.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(vlans(&theirs), vlans(&ours), "{scenario}");
        // Metal's Layer3 addresses and routes, on the bond.
        for a in &host.layer3 {
            let have = &theirs[&a.link];
            assert!(
                have.addresses.contains(&a.address.to_string()),
                "{scenario}: {have:?}"
            );
            for (to, via) in &a.routes {
                assert!(
                    have.routes.contains(&(to.to_string(), via.to_string())),
                    "{scenario}: {have:?}"
                );
            }
        }
        if host.layer3.is_empty() {
            assert!(
                theirs
                    .values()
                    .all(|i| !i.addresses.iter().any(|a| a.starts_with("198.51.100."))),
                "{scenario}"
            );
        }
    }

    /// Issue 26, finding 10: on a 4-port device with bond0 in
    /// layer2-individual (eth0 and eth2 on their own) and bond1 bonded,
    /// cloud-init names Metal's bond1 `bond1`, its VLANs `bond1.<id>`,
    /// with eth1 and eth3 in it; the VLANs of eth0 and eth2 stay on them.
    #[test]
    fn cloud_init_names_bond1_bond1_when_bond0_is_individual() {
        let Some(py) = cloud_init_python() else {
            return;
        };
        for m1 in [Mode::Layer2Bonded, Mode::HybridBonded, Mode::Layer3] {
            let (scenario, net, host) = four_port(Mode::Layer2Individual, m1);
            let got = convert(&py, &render_nd(&net, &host).unwrap());
            let theirs = interfaces(got["netplan"].as_str().unwrap());
            let bond = |n: &str| {
                theirs.get(n).unwrap_or_else(|| {
                    panic!("{scenario}: cloud-init has no {n}: {:?}", theirs.keys())
                })
            };
            assert_eq!(bond("bond1").members, ["eth1", "eth3"], "{scenario}");
            assert!(bond("bond0").members.is_empty(), "{scenario}");
            for (name, parent) in [
                ("eth0", "eth0"),
                ("eth2.1102", "eth2"),
                ("eth2.1103", "eth2"),
            ] {
                assert_eq!(
                    theirs[name].vlan.as_ref().map(|(p, _)| p.as_str()),
                    (name != parent).then_some(parent),
                    "{scenario}: {name}"
                );
            }
            assert_eq!(theirs["eth0"].addresses, ["192.168.101.5/24"], "{scenario}");
            if m1 != Mode::Layer3 {
                assert_eq!(
                    theirs["bond1.1201"].vlan,
                    Some(("bond1".to_string(), 1201)),
                    "{scenario}: {theirs:?}"
                );
                assert!(!theirs.contains_key("bond0.1201"), "{scenario}");
            }
        }
    }

    /// Resolvers become cloud-init's nameservers.
    #[test]
    fn cloud_init_reads_the_resolvers() {
        let Some(py) = cloud_init_python() else {
            return;
        };
        let (_, net, mut host) = scenarios().remove(0);
        host.nameservers = vec!["192.0.2.53".parse().unwrap()];
        let got = convert(&py, &render_nd(&net, &host).unwrap());
        let config = got["v1"]["config"].as_array().unwrap();
        assert!(config
            .iter()
            .any(|c| c["type"] == "nameserver" && c["address"] == "192.0.2.53"));
        assert!(got["netplan"].as_str().unwrap().contains("192.0.2.53"));
    }
}
