//! The Metal simulator's port state machine over HTTP: every transition of
//! the conversion table (notes §4.2) there and back, the refusals and
//! no-op 422s, frozen devices, 4-port devices, the read-counted asynchrony
//! of mode changes, VLAN assignment batches and native VLANs. Every
//! request and answer is checked against the spec (0 violations).
//!
//! Requests go through the real Metal client's raw `send` on a blocking
//! thread; the simulator's seeding and inspection methods are called from
//! the same thread (they only take a mutex).

use std::sync::Arc;

use http::Method;
use metal_ipam_core::metal::client::{Metal, MetalError};
use metal_ipam_core::metal::model::VirtualNetworkCreateInput;
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::testing::TestEnv;
use metal_ipam_tests::metal_sim::{BatchState, BlockingHttp, Device, Fault, MetalSim, SimConfig};
use serde_json::{json, Value};

const DEVICE: &str = "6f0b7f4e-3c1d-4b8a-9e2f-0a1b2c3d4e5f";
const OTHER: &str = "1c9e2a7b-5d3f-4e6a-8b0c-9d8e7f6a5b4c";

const FROZEN: &str = "This device's network is frozen";
const BUSY: &str = "Another operation is in progress on port";

type Reply = Result<Value, (u16, String)>;

/// The client and the simulator, as a test step sees them.
struct Api<'a> {
    m: &'a Metal<'a, BlockingHttp, TestEnv>,
    sim: &'a MetalSim,
}

impl Api<'_> {
    fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Reply {
        match self.m.send(method, path, query, body.as_ref()) {
            Ok((_, bytes)) if bytes.is_empty() => Ok(Value::Null),
            Ok((_, bytes)) => Ok(serde_json::from_slice(&bytes).expect("a JSON answer")),
            Err(MetalError::Api {
                status, messages, ..
            }) => Err((status, messages.join("; "))),
            Err(e) => panic!("{path}: {e:?}"),
        }
    }

    fn get(&self, path: &str) -> Value {
        self.call(Method::GET, path, &[], None)
            .unwrap_or_else(|e| panic!("GET {path}: {e:?}"))
    }

    fn port(&self, id: &str) -> Value {
        self.get(&format!("/ports/{id}"))
    }

    fn network_type(&self, bond: &str) -> String {
        self.port(bond)["network_type"].as_str().unwrap().to_owned()
    }

    fn bonded(&self, id: &str) -> bool {
        self.port(id)["data"]["bonded"].as_bool().unwrap()
    }

    fn device(&self, id: &str) -> Value {
        self.get(&format!("/devices/{id}"))
    }

    fn vlan(&self, vxlan: u16) -> String {
        self.m
            .create_vlan(&VirtualNetworkCreateInput {
                metro: "da".into(),
                vxlan: Some(vxlan),
                ..VirtualNetworkCreateInput::default()
            })
            .unwrap()
            .id
    }

    fn assign(&self, port: &str, vxlan: u16) -> Reply {
        let body = json!({ "vnid": vxlan.to_string() });
        self.call(
            Method::POST,
            &format!("/ports/{port}/assign"),
            &[],
            Some(body),
        )
    }

    fn unassign(&self, port: &str, vxlan: u16) -> Reply {
        let body = json!({ "vnid": vxlan.to_string() });
        self.call(
            Method::POST,
            &format!("/ports/{port}/unassign"),
            &[],
            Some(body),
        )
    }

    fn bond(&self, port: &str, bulk: bool) -> Reply {
        let q = [("bulk_enable", bulk.to_string())];
        self.call(Method::POST, &format!("/ports/{port}/bond"), &q, None)
    }

    fn disbond(&self, port: &str, bulk: bool) -> Reply {
        let q = [("bulk_disable", bulk.to_string())];
        self.call(Method::POST, &format!("/ports/{port}/disbond"), &q, None)
    }

    fn to_layer2(&self, port: &str) -> Reply {
        let path = format!("/ports/{port}/convert/layer-2");
        self.call(Method::POST, &path, &[], Some(json!({})))
    }

    fn to_layer3(&self, port: &str, body: Option<Value>) -> Reply {
        let path = format!("/ports/{port}/convert/layer-3");
        self.call(Method::POST, &path, &[], body)
    }

    fn native(&self, port: &str, vxlan: u16) -> Reply {
        let q = [("vnid", vxlan.to_string())];
        self.call(
            Method::POST,
            &format!("/ports/{port}/native-vlan"),
            &q,
            None,
        )
    }

    fn delete_native(&self, port: &str) -> Reply {
        self.call(
            Method::DELETE,
            &format!("/ports/{port}/native-vlan"),
            &[],
            None,
        )
    }

    fn batch(&self, port: &str, entries: Value) -> Reply {
        let path = format!("/ports/{port}/vlan-assignments/batches");
        let body = json!({ "vlan_assignments": entries });
        self.call(Method::POST, &path, &[], Some(body))
    }

    fn batch_state(&self, port: &str, id: &str) -> Value {
        self.get(&format!("/ports/{port}/vlan-assignments/batches/{id}"))
    }

    /// The VLAN numbers on a port, in order.
    fn vlans_on(&self, port: &str) -> Vec<u64> {
        let list = self.get(&format!("/ports/{port}/vlan-assignments"));
        list["vlan_assignments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["vlan"].as_u64().unwrap())
            .collect()
    }

    /// The device's management addresses.
    fn management_ips(&self, device: &str) -> Vec<String> {
        self.device(device)["ip_addresses"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["management"] == true)
            .map(|a| a["address"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// Port ids by name.
fn port_id(d: &Device, name: &str) -> String {
    d.port(name).unwrap().id.clone()
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        budget_ms: 10_000,
        base_ms: 100,
        cap_ms: 1_000,
    }
}

async fn start(cfg: SimConfig) -> Arc<MetalSim> {
    Arc::new(MetalSim::start_with(cfg).await.unwrap())
}

/// Immediate mode changes and batches (for the transition tests).
fn immediate() -> SimConfig {
    SimConfig {
        port_reads: Some(0),
        batch_reads: Some(0),
        ..SimConfig::default()
    }
}

/// Runs `f` on a blocking thread with a client of `sim`, then checks that
/// neither the requests nor the answers broke the spec.
async fn run<T, F>(sim: &Arc<MetalSim>, f: F) -> T
where
    T: Send + 'static,
    F: for<'a> FnOnce(&Api<'a>) -> T + Send + 'static,
{
    let sim2 = Arc::clone(sim);
    let out = tokio::task::spawn_blocking(move || {
        let (http, env) = (BlockingHttp::new(), TestEnv::at(1_800_000_000));
        let cfg = sim2.metal_config(policy());
        let m = Metal::new(&http, &cfg, &env);
        f(&Api { m: &m, sim: &sim2 })
    })
    .await
    .expect("the client thread panicked");
    assert_eq!(sim.violations(), Vec::<String>::new(), "request violations");
    assert_eq!(
        sim.answer_violations(),
        Vec::<String>::new(),
        "the simulator's answers break the spec"
    );
    out
}

#[track_caller]
fn refused(r: Reply, text: &str) {
    match r {
        Err((status, messages)) => {
            assert_eq!(status, 422, "{messages}");
            assert!(
                messages.contains(text),
                "{messages:?} does not say {text:?}"
            );
        }
        Ok(v) => panic!("expected a 422 saying {text:?}, got {v}"),
    }
}

// ---------------------------------------------------------------------------
// The conversion table (2-port device: bond0 = eth0 + eth1)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn every_transition_of_the_table_there_and_back() {
    let sim = start(immediate()).await;
    let d = sim.add_device(DEVICE, "da", 2);
    assert_eq!(
        d.ports.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["bond0", "eth0", "eth1"]
    );
    let mgmt = sim.add_management_ips(DEVICE);
    assert_eq!(mgmt.len(), 3);
    let (bond0, eth0, eth1) = (
        port_id(&d, "bond0"),
        port_id(&d, "eth0"),
        port_id(&d, "eth1"),
    );
    run(&sim, move |api| {
        api.vlan(1010);
        api.vlan(1020);
        assert_eq!(api.network_type(&bond0), "layer3");
        assert_eq!(api.management_ips(DEVICE).len(), 3);
        let eth = api.port(&eth1);
        assert_eq!(eth["bond"]["name"], "bond0");
        assert_eq!(eth["data"]["bonded"], true);

        // layer3 → hybrid-bonded and back: VLANs on bond0.
        let p = api.assign(&bond0, 1010).unwrap();
        assert_eq!(p["network_type"], "hybrid-bonded");
        assert_eq!(
            api.unassign(&bond0, 1010).unwrap()["network_type"],
            "layer3"
        );

        // layer3 → hybrid: eth1 out of the bond, then its VLAN; and back.
        let p = api.disbond(&eth1, false).unwrap();
        assert_eq!(p["data"]["bonded"], false);
        assert_eq!(api.network_type(&bond0), "hybrid");
        assert!(api.bonded(&bond0) && api.bonded(&eth0));
        api.assign(&eth1, 1010).unwrap();
        assert_eq!(api.vlans_on(&eth1), [1010]);
        assert_eq!(api.network_type(&bond0), "hybrid");
        assert_eq!(
            api.management_ips(DEVICE).len(),
            3,
            "hybrid keeps the L3 IPs"
        );
        api.unassign(&eth1, 1010).unwrap();
        assert_eq!(api.bond(&eth1, false).unwrap()["data"]["bonded"], true);
        assert_eq!(api.network_type(&bond0), "layer3");

        // layer3 → layer2-bonded: the management IPs go; and back with new ones.
        let p = api.to_layer2(&bond0).unwrap();
        assert_eq!(p["network_type"], "layer2-bonded");
        assert!(api.management_ips(DEVICE).is_empty());
        assert!(api.sim.assignments().is_empty());
        api.assign(&bond0, 1010).unwrap();
        assert_eq!(api.network_type(&bond0), "layer2-bonded");
        api.unassign(&bond0, 1010).unwrap();
        let request = json!({ "request_ips": [
            { "address_family": 4, "public": true },
            { "address_family": 4, "public": false },
            { "address_family": 6, "public": true },
        ]});
        let p = api.to_layer3(&bond0, Some(request)).unwrap();
        assert_eq!(p["network_type"], "layer3");
        let fresh = api.management_ips(DEVICE);
        assert_eq!(fresh.len(), 3);
        assert!(fresh
            .iter()
            .all(|a| !mgmt.iter().any(|old| &old.address == a)));
        let ips = api.get(&format!("/devices/{DEVICE}/ips"));
        let kinds: Vec<(u64, bool)> = ips["ip_addresses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["address_family"].as_u64().unwrap(), a["public"] == true))
            .collect();
        assert_eq!(kinds, [(4, true), (4, false), (6, true)]);

        // layer3 → layer2-individual (convert, then disbond the bond) and back
        // (unassign, bond, convert with the default request_ips).
        api.to_layer2(&bond0).unwrap();
        let p = api.disbond(&bond0, true).unwrap();
        assert_eq!(p["network_type"], "layer2-individual");
        assert_eq!(p["data"]["bonded"], false);
        assert!(!api.bonded(&eth0) && !api.bonded(&eth1));
        api.assign(&eth0, 1010).unwrap();
        api.assign(&eth1, 1020).unwrap();
        refused(
            api.bond(&bond0, false),
            "Port eth0 has virtual networks assigned",
        );
        api.unassign(&eth0, 1010).unwrap();
        api.unassign(&eth1, 1020).unwrap();
        assert_eq!(
            api.bond(&bond0, false).unwrap()["network_type"],
            "layer2-bonded"
        );
        assert_eq!(
            api.to_layer3(&bond0, None).unwrap()["network_type"],
            "layer3"
        );
        assert_eq!(api.management_ips(DEVICE).len(), 3);

        // layer2-bonded → layer2-individual (VLANs off the bond first) and
        // layer2-individual → layer2-bonded one member at a time.
        api.to_layer2(&bond0).unwrap();
        api.assign(&bond0, 1010).unwrap();
        refused(
            api.disbond(&bond0, false),
            "Port bond0 has virtual networks assigned: unassign them before disbonding it",
        );
        api.unassign(&bond0, 1010).unwrap();
        api.disbond(&bond0, false).unwrap();
        assert_eq!(api.network_type(&bond0), "layer2-individual");
        api.assign(&eth0, 1010).unwrap();
        api.unassign(&eth0, 1010).unwrap();
        api.bond(&eth0, false).unwrap();
        assert_eq!(api.network_type(&bond0), "layer2-individual");
        assert!(api.bonded(&bond0), "a bond with a bonded member is up");
        api.bond(&eth1, false).unwrap();
        assert_eq!(api.network_type(&bond0), "layer2-bonded");
        // And back to layer3 for good.
        api.to_layer3(&bond0, None).unwrap();
        assert_eq!(api.network_type(&bond0), "layer3");

        // Every change is a port.* event naming the device.
        let events = api
            .call(
                Method::GET,
                &format!("/devices/{DEVICE}/events"),
                &[("per_page", "100".into())],
                None,
            )
            .unwrap();
        let kinds: Vec<&str> = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds.first(), Some(&"port.converted_to_layer3"));
        assert_eq!(kinds.len(), 13, "{kinds:?}");
        assert!(kinds.iter().all(|k| k.starts_with("port.")), "{kinds:?}");
        assert_eq!(kinds.iter().filter(|k| **k == "port.disbonded").count(), 3);
        let first = &events["events"][0];
        let rel: Vec<&str> = first["relationships"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["href"].as_str().unwrap())
            .collect();
        assert!(rel.contains(&format!("/metal/v1/devices/{DEVICE}").as_str()));
        assert!(first["body"]
            .as_str()
            .unwrap()
            .ends_with("bond0 is now layer3"));
    })
    .await;
    let d = sim.device(DEVICE).unwrap();
    assert!(d
        .ports
        .iter()
        .all(|p| p.bonded && !p.layer2 && p.vlans.is_empty()));
}

#[tokio::test(flavor = "multi_thread")]
async fn hybrid_to_layer2_bonded_is_refused() {
    let sim = start(immediate()).await;
    let d = sim.add_device(DEVICE, "da", 2);
    let (bond0, eth1) = (port_id(&d, "bond0"), port_id(&d, "eth1"));
    run(&sim, move |api| {
        api.disbond(&eth1, false).unwrap();
        assert_eq!(api.network_type(&bond0), "hybrid");
        refused(
            api.to_layer2(&bond0),
            "bond0 is already configured for Layer 2",
        );
        // Through layer3 it works.
        api.bond(&eth1, false).unwrap();
        assert_eq!(
            api.to_layer2(&bond0).unwrap()["network_type"],
            "layer2-bonded"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// Refusals and the no-op 422s
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn no_ops_and_broken_rules_are_refused() {
    let sim = start(immediate()).await;
    let d = sim.add_device(DEVICE, "da", 2);
    sim.add_management_ips(DEVICE);
    let bare = sim.add_device(OTHER, "da", 2);
    let (bond0, eth0, eth1) = (
        port_id(&d, "bond0"),
        port_id(&d, "eth0"),
        port_id(&d, "eth1"),
    );
    let other_bond = port_id(&bare, "bond0");
    run(&sim, move |api| {
        api.vlan(1010);
        api.vlan(1020);
        // convert/layer-3 of a layer3 port: one message per requested kind.
        let (status, text) = api.to_layer3(&bond0, None).unwrap_err();
        assert_eq!(status, 422);
        assert_eq!(
            text,
            "The port already has a public IPv4 assignment; \
             The port already has a private IPv4 assignment; \
             The port already has a public IPv6 assignment"
        );
        let only_private = json!({ "request_ips": [{ "address_family": 4, "public": false }] });
        refused(
            api.to_layer3(&bond0, Some(only_private)),
            "The port already has a private IPv4 assignment",
        );
        // A layer3 bond without management addresses.
        refused(
            api.to_layer3(&other_bond, None),
            "bond0 is already configured for Layer 3",
        );
        // Bond a bonded port, disbond an unbonded one.
        refused(api.bond(&eth1, false), "Port eth1 is already bonded");
        refused(api.bond(&bond0, false), "Port bond0 is already bonded");
        // Layer 3: the bond cannot be disbonded, nor its last member.
        refused(
            api.disbond(&bond0, false),
            "bond0 is a Layer 3 bond port and cannot be disbonded",
        );
        refused(api.disbond(&eth1, true), "bond0 is a Layer 3 bond port");
        api.disbond(&eth1, false).unwrap();
        refused(api.disbond(&eth1, false), "Port eth1 is already disbonded");
        refused(
            api.disbond(&eth0, false),
            "Port eth0 is the last bonded port of bond0, which is in Layer 3",
        );
        // VLANs: on a bonded eth port no; assign twice, unassign absent.
        refused(
            api.assign(&eth0, 1010),
            "Port eth0 is bonded: disbond it before assigning virtual networks",
        );
        api.assign(&eth1, 1010).unwrap();
        refused(
            api.assign(&eth1, 1010),
            "Virtual network 1010 already assigned",
        );
        refused(
            api.unassign(&eth1, 1020),
            "Virtual network 1020 not assigned",
        );
        refused(api.assign(&eth1, 3333), "Virtual network 3333 not found");
        // Bonding needs the port's VLANs gone.
        refused(
            api.bond(&eth1, false),
            "Port eth1 has virtual networks assigned: unassign them before bonding it",
        );
        api.unassign(&eth1, 1010).unwrap();
        api.bond(&eth1, false).unwrap();
        // Layer 2 only on bond ports; twice is refused.
        refused(api.to_layer2(&eth0), "Port eth0 is not a bond port");
        refused(api.to_layer3(&eth0, None), "Port eth0 is not a bond port");
        api.to_layer2(&bond0).unwrap();
        refused(
            api.to_layer2(&bond0),
            "bond0 is already configured for Layer 2",
        );
        // convert/layer-3 while VLANs are on the bond or a member.
        api.assign(&bond0, 1010).unwrap();
        refused(
            api.to_layer3(&bond0, None),
            "VLANs must first be unassigned from bond0 and its ports before converting to Layer 3",
        );
        api.unassign(&bond0, 1010).unwrap();
        api.disbond(&bond0, false).unwrap();
        refused(api.disbond(&bond0, true), "Port bond0 is already disbonded");
        refused(
            api.assign(&bond0, 1010),
            "Port bond0 is not bonded: assign virtual networks to its ethernet ports",
        );
        api.assign(&eth0, 1010).unwrap();
        refused(
            api.to_layer3(&bond0, None),
            "VLANs must first be unassigned",
        );
        api.unassign(&eth0, 1010).unwrap();
        refused(
            api.to_layer3(&bond0, None),
            "bond0 must be bonded (all its ports) before converting to Layer 3",
        );
        // request_ips that cannot be.
        api.bond(&bond0, true).unwrap();
        let private_v6 = json!({ "request_ips": [{ "address_family": 6, "public": false }] });
        refused(api.to_layer3(&bond0, Some(private_v6)), "private IPv6");
        let twice = json!({ "request_ips": [
            { "address_family": 4, "public": true }, { "address_family": 4, "public": true },
        ]});
        refused(
            api.to_layer3(&bond0, Some(twice)),
            "public IPv4 is requested twice",
        );
        let v5 = json!({ "request_ips": [{ "address_family": 5, "public": true }] });
        refused(
            api.to_layer3(&bond0, Some(v5)),
            "address_family must be 4 or 6",
        );
        // Only private IPv4 asked: only that comes back.
        let private = json!({ "request_ips": [{ "address_family": 4, "public": false }] });
        api.to_layer3(&bond0, Some(private)).unwrap();
        assert_eq!(api.management_ips(DEVICE).len(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_device_refuses_mode_changes_only() {
    let sim = start(immediate()).await;
    let d = sim.add_device(DEVICE, "da", 2);
    let (bond0, eth1) = (port_id(&d, "bond0"), port_id(&d, "eth1"));
    assert!(sim.set_network_frozen(DEVICE, true).network_frozen);
    let (b, e) = (bond0.clone(), eth1.clone());
    run(&sim, move |api| {
        api.vlan(1010);
        assert_eq!(api.device(DEVICE)["network_frozen"], true);
        refused(api.disbond(&e, false), FROZEN);
        refused(api.bond(&e, false), FROZEN);
        refused(api.to_layer2(&b), FROZEN);
        refused(api.to_layer3(&b, None), FROZEN);
        // VLANs still move.
        assert_eq!(
            api.assign(&b, 1010).unwrap()["network_type"],
            "hybrid-bonded"
        );
        api.unassign(&b, 1010).unwrap();
    })
    .await;
    assert!(!sim.set_network_frozen(DEVICE, false).network_frozen);
    run(&sim, move |api| {
        assert_eq!(api.device(DEVICE)["network_frozen"], false);
        api.disbond(&eth1, false).unwrap();
        assert_eq!(api.network_type(&bond0), "hybrid");
    })
    .await;
}

// ---------------------------------------------------------------------------
// 4-port devices
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn four_port_bonds_change_independently() {
    let sim = start(immediate()).await;
    let d = sim.add_device(DEVICE, "da", 4);
    assert_eq!(
        d.ports.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["bond0", "bond1", "eth0", "eth1", "eth2", "eth3"]
    );
    let bonds: Vec<(&str, Option<&str>)> = d
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.bond.as_deref()))
        .collect();
    assert_eq!(
        bonds,
        [
            ("bond0", None),
            ("bond1", None),
            ("eth0", Some("bond0")),
            ("eth1", Some("bond1")),
            ("eth2", Some("bond0")),
            ("eth3", Some("bond1")),
        ]
    );
    let ids: Vec<String> = ["bond0", "bond1", "eth0", "eth1", "eth2", "eth3"]
        .iter()
        .map(|n| port_id(&d, n))
        .collect();
    run(&sim, move |api| {
        let [bond0, bond1, _eth0, eth1, eth2, eth3] = &ids[..] else {
            unreachable!()
        };
        api.vlan(1010);
        api.vlan(1020);
        assert_eq!(api.port(eth2)["bond"]["name"], "bond0");
        assert_eq!(api.port(eth3)["bond"]["id"], bond1.as_str());
        // bond1 to layer2-individual, bond0 stays layer3.
        api.to_layer2(bond1).unwrap();
        api.disbond(bond1, false).unwrap();
        assert_eq!(api.network_type(bond1), "layer2-individual");
        assert_eq!(api.network_type(bond0), "layer3");
        assert!(!api.bonded(eth1) && !api.bonded(eth3) && api.bonded(eth2));
        api.assign(eth1, 1010).unwrap();
        api.assign(eth3, 1020).unwrap();
        // bond0 to hybrid by its own member eth2.
        refused(api.disbond(eth1, false), "Port eth1 is already disbonded");
        api.disbond(eth2, false).unwrap();
        api.assign(eth2, 1020).unwrap();
        assert_eq!(api.network_type(bond0), "hybrid");
        assert_eq!(api.network_type(bond1), "layer2-individual");
        let types: Vec<Value> = api.device(DEVICE)["network_ports"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "NetworkBondPort")
            .map(|p| p["network_type"].clone())
            .collect();
        assert_eq!(types, [json!("hybrid"), json!("layer2-individual")]);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Asynchrony
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn mode_changes_show_after_the_configured_reads() {
    let sim = start(SimConfig::default()).await;
    let d = sim.add_device(DEVICE, "da", 2);
    let (bond0, eth1) = (port_id(&d, "bond0"), port_id(&d, "eth1"));
    let s = Arc::clone(&sim);
    run(&sim, move |api| {
        api.vlan(1010);
        // The POST answers the port as it was; so does the next read.
        assert_eq!(api.disbond(&eth1, false).unwrap()["data"]["bonded"], true);
        assert_eq!(s.pending_port_changes(), 1);
        // One operation per bond at a time, VLAN operations included.
        refused(api.bond(&eth1, false), BUSY);
        refused(api.to_layer2(&bond0), BUSY);
        refused(api.assign(&eth1, 1010), BUSY);
        assert!(api.bonded(&eth1), "first read: still bonded");
        assert!(!api.bonded(&eth1), "second read: disbonded");
        assert_eq!(s.pending_port_changes(), 0);
        assert_eq!(api.network_type(&bond0), "hybrid");
        api.bond(&eth1, false).unwrap();
        // A device read counts as a read of its ports.
        assert_eq!(
            api.device(DEVICE)["network_ports"][2]["data"]["bonded"],
            false
        );
        assert_eq!(
            api.device(DEVICE)["network_ports"][2]["data"]["bonded"],
            true
        );

        // Three reads, then settle() ends the wait.
        s.set_port_reads(3);
        assert_eq!(api.to_layer2(&bond0).unwrap()["network_type"], "layer3");
        for _ in 0..2 {
            assert_eq!(api.network_type(&bond0), "layer3");
        }
        s.settle();
        assert_eq!(s.pending_port_changes(), 0);
        assert_eq!(api.network_type(&bond0), "layer2-bonded");
    })
    .await;
}

// ---------------------------------------------------------------------------
// VLAN assignment batches
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn batches_queue_run_and_complete_or_fail() {
    let sim = start(SimConfig {
        port_reads: Some(0),
        ..SimConfig::default()
    })
    .await;
    let d = sim.add_device(DEVICE, "da", 2);
    let (bond0, eth1) = (port_id(&d, "bond0"), port_id(&d, "eth1"));
    let s = Arc::clone(&sim);
    run(&sim, move |api| {
        let v1010 = api.vlan(1010);
        api.vlan(1020);
        api.vlan(1030);
        // Empty: refused at once.
        refused(
            api.batch(&bond0, json!([])),
            "A batch needs at least one VLAN assignment",
        );
        refused(
            api.batch(&bond0, json!([{ "vlan": "1010" }, { "vlan": v1010 }])),
            "Virtual network 1010 is given more than once",
        );
        refused(
            api.batch(&eth1, json!([{ "vlan": "1010", "state": "assigned" }])),
            "Port eth1 is bonded",
        );

        // queued → in_progress → completed; the VLANs apply at completion.
        let b = api
            .batch(
                &bond0,
                json!([
                    { "vlan": "1010", "state": "assigned" },
                    { "vlan": "1020", "state": "assigned" },
                ]),
            )
            .unwrap();
        assert_eq!(b["state"], "queued");
        assert_eq!(b["quantity"], 2);
        let id = b["id"].as_str().unwrap().to_owned();
        // Nothing else on the port (or its bond) meanwhile.
        refused(api.assign(&bond0, 1030), BUSY);
        refused(api.batch(&bond0, json!([{ "vlan": "1030" }])), BUSY);
        refused(api.to_layer2(&bond0), BUSY);
        refused(api.disbond(&eth1, false), BUSY);
        assert_eq!(api.batch_state(&bond0, &id)["state"], "queued");
        assert!(api.vlans_on(&bond0).is_empty());
        // The second read answers `in_progress` and finishes it.
        assert_eq!(api.batch_state(&bond0, &id)["state"], "in_progress");
        let done = api.batch_state(&bond0, &id);
        assert_eq!(done["state"], "completed");
        assert_eq!(done["error_messages"], json!([]));
        assert_eq!(api.vlans_on(&bond0), [1010, 1020]);
        assert_eq!(api.network_type(&bond0), "hybrid-bonded");
        // Assignments have ids; one can be read alone.
        let list = api.get(&format!("/ports/{bond0}/vlan-assignments"));
        let a = &list["vlan_assignments"][1];
        assert_eq!(a["state"], "assigned");
        let aid = a["id"].as_str().unwrap();
        let one = api.get(&format!("/ports/{bond0}/vlan-assignments/{aid}"));
        assert_eq!(one["vlan"], 1020);

        // An injected failure: failed, its message, nothing changed. A batch
        // refused with a 422 does not use it up.
        s.fail_next_batch(&bond0, "the switch refused the change");
        refused(api.batch(&bond0, json!([])), "at least one");
        let b = api
            .batch(&bond0, json!([{ "vlan": "1010", "state": "unassigned" }]))
            .unwrap();
        let id = b["id"].as_str().unwrap().to_owned();
        // While in progress, the VLAN being removed shows `unassigning`.
        api.batch_state(&bond0, &id);
        let list = api.get(&format!("/ports/{bond0}/vlan-assignments"));
        assert_eq!(list["vlan_assignments"][0]["state"], "unassigning");
        api.batch_state(&bond0, &id);
        let failed = api.batch_state(&bond0, &id);
        assert_eq!(failed["state"], "failed");
        assert_eq!(
            failed["error_messages"],
            json!(["the switch refused the change"])
        );
        assert_eq!(api.vlans_on(&bond0), [1010, 1020]);

        // A batch at odds with the port fails as a whole, with every reason.
        let b = api
            .batch(
                &bond0,
                json!([
                    { "vlan": "1030", "state": "unassigned" },
                    { "vlan": "1020", "state": "assigned" },
                    { "vlan": "1010", "state": "unassigned" },
                ]),
            )
            .unwrap();
        let id = b["id"].as_str().unwrap().to_owned();
        s.settle();
        let failed = api.batch_state(&bond0, &id);
        assert_eq!(failed["state"], "failed");
        assert_eq!(
            failed["error_messages"],
            json!([
                "Virtual network 1030 not assigned",
                "Virtual network 1020 already assigned"
            ])
        );
        assert_eq!(api.vlans_on(&bond0), [1010, 1020]);

        // The port's batch list, oldest first; `include=port` embeds it.
        let all = api.get(&format!("/ports/{bond0}/vlan-assignments/batches"));
        let states: Vec<&str> = all["batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["state"].as_str().unwrap())
            .collect();
        assert_eq!(states, ["completed", "failed", "failed"]);
        let with_port = api
            .call(
                Method::GET,
                &format!("/ports/{bond0}/vlan-assignments/batches/{id}"),
                &[("include", "port".into())],
                None,
            )
            .unwrap();
        assert_eq!(with_port["port"]["name"], "bond0");

        // Removing them in one batch, settled.
        let b = api
            .batch(
                &bond0,
                json!([
                    { "vlan": "1010", "state": "unassigned" },
                    { "vlan": "1020", "state": "unassigned" },
                ]),
            )
            .unwrap();
        s.settle();
        let id = b["id"].as_str().unwrap();
        assert_eq!(api.batch_state(&bond0, id)["state"], "completed");
        assert_eq!(api.network_type(&bond0), "layer3");
    })
    .await;
    let states: Vec<BatchState> = sim.batches().iter().map(|b| b.state).collect();
    assert_eq!(
        states,
        [
            BatchState::Completed,
            BatchState::Failed,
            BatchState::Failed,
            BatchState::Completed
        ]
    );
}

// ---------------------------------------------------------------------------
// Native VLANs
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn native_vlan_rules() {
    let sim = start(immediate()).await;
    let d = sim.add_device(DEVICE, "da", 2);
    let (bond0, eth1) = (port_id(&d, "bond0"), port_id(&d, "eth1"));
    run(&sim, move |api| {
        let v1010 = api.vlan(1010);
        api.vlan(1020);
        // Not in hybrid-bonded (a Layer 3 bond).
        api.assign(&bond0, 1010).unwrap();
        api.assign(&bond0, 1020).unwrap();
        refused(
            api.native(&bond0, 1010),
            "A native VLAN is not supported on the Layer 3 bond port bond0",
        );
        api.unassign(&bond0, 1010).unwrap();
        api.unassign(&bond0, 1020).unwrap();
        // layer2-bonded: needs the VLAN on the port and two VLANs.
        api.to_layer2(&bond0).unwrap();
        refused(api.delete_native(&bond0), "Port bond0 has no native VLAN");
        refused(
            api.native(&bond0, 1010),
            "Virtual network 1010 must be assigned to the port before it can be its native VLAN",
        );
        api.assign(&bond0, 1010).unwrap();
        refused(
            api.native(&bond0, 1010),
            "A native VLAN needs at least 2 virtual networks on the port",
        );
        api.assign(&bond0, 1020).unwrap();
        let p = api.native(&bond0, 1010).unwrap();
        assert_eq!(
            p["native_virtual_network"]["href"],
            format!("/metal/v1/virtual-networks/{v1010}")
        );
        refused(
            api.native(&bond0, 1010),
            "Virtual network 1010 is already the native VLAN of the port",
        );
        let list = api.get(&format!("/ports/{bond0}/vlan-assignments"));
        let natives: Vec<bool> = list["vlan_assignments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["native"] == true)
            .collect();
        assert_eq!(natives, [true, false]);
        // Another native replaces it; DELETE removes it.
        api.native(&bond0, 1020).unwrap();
        let p = api.delete_native(&bond0).unwrap();
        assert!(p.get("native_virtual_network").is_none());
        // Unassigning the native VLAN clears it.
        api.native(&bond0, 1020).unwrap();
        let p = api.unassign(&bond0, 1020).unwrap();
        assert!(p.get("native_virtual_network").is_none());
        api.unassign(&bond0, 1010).unwrap();
        api.to_layer3(&bond0, None).unwrap();

        // hybrid: a native VLAN on eth1, set by a batch.
        api.disbond(&eth1, false).unwrap();
        refused(
            api.batch(
                &eth1,
                json!([{ "vlan": "1010", "state": "unassigned", "native": true }]),
            ),
            "only an assigned VLAN can be native",
        );
        refused(
            api.batch(&bond0, json!([{ "vlan": "1010", "native": true }])),
            "not supported on the Layer 3 bond port bond0",
        );
        // One VLAN only: the batch fails (the rule is checked at completion).
        let b = api
            .batch(&eth1, json!([{ "vlan": "1010", "native": true }]))
            .unwrap();
        assert_eq!(b["state"], "failed");
        assert_eq!(
            b["error_messages"],
            json!(["A native VLAN needs at least 2 virtual networks on the port"])
        );
        let b = api
            .batch(
                &eth1,
                json!([{ "vlan": "1010", "native": true }, { "vlan": "1020" }]),
            )
            .unwrap();
        assert_eq!(b["state"], "completed");
        let p = api.port(&eth1);
        assert_eq!(
            p["native_virtual_network"]["href"],
            format!("/metal/v1/virtual-networks/{v1010}")
        );
        assert_eq!(api.network_type(&bond0), "hybrid");
    })
    .await;
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn port_operations_honour_injected_faults() {
    let sim = start(immediate()).await;
    let d = sim.add_device(DEVICE, "da", 2);
    let (bond0, eth1) = (port_id(&d, "bond0"), port_id(&d, "eth1"));
    sim.inject("POST", "disbondPort", Fault::Status(503), 1);
    sim.inject("*", "convertLayer2", Fault::CrashAfter, 1);
    sim.inject(
        "POST",
        "createPortVlanAssignmentBatch",
        Fault::Status(500),
        1,
    );
    run(&sim, move |api| {
        api.vlan(1010);
        // A 5xx on a POST: not applied, and the client cannot tell.
        let path = format!("/ports/{eth1}/disbond");
        assert!(matches!(
            api.m.send(Method::POST, &path, &[], None),
            Err(MetalError::OutcomeUnknown { .. })
        ));
        assert!(api.bonded(&eth1));
        // Applied, then the connection dropped.
        let path = format!("/ports/{bond0}/convert/layer-2");
        assert!(api
            .m
            .send(Method::POST, &path, &[], Some(&json!({})))
            .is_err());
        assert_eq!(api.network_type(&bond0), "layer2-bonded");
        let path = format!("/ports/{bond0}/vlan-assignments/batches");
        let body = json!({ "vlan_assignments": [{ "vlan": "1010" }] });
        assert!(api.m.send(Method::POST, &path, &[], Some(&body)).is_err());
        assert!(api.sim.batches().is_empty());
    })
    .await;
    assert_eq!(sim.count("disbondPort"), 1);
    assert_eq!(sim.applied("disbondPort"), 0);
    assert_eq!(sim.applied("convertLayer2"), 1);
    assert_eq!(sim.pending_faults(), 0);
}
