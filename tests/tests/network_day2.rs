//! Day-2 operations on a machine's network, through the real components
//! (the `.wasm` files on the test host, or real Spin when `SPIN_BIN` is
//! given) against the fake Kubernetes API and the Metal simulator (issue
//! 17): a profile edit moves a VLAN's address to another pool and drops a
//! VLAN (the per-VLAN claims follow); Machines converge without Machine
//! events (reconcile, profile and `PacketMachine` events); the webhook
//! refuses deleting a profile in use; `DELETE …/network` sticks; a deleted
//! profile leaves the network as it is; a mode change Metal refuses is a
//! definite failure; names from annotations and references are checked;
//! an apply on a vanished device forgets it.

use metal_ipam_tests::fake_kube::{FakeKube, CLUSTER_GROUP, INFRA_GROUP, IPAM_GROUP, METAL_GROUP};
use metal_ipam_tests::harness::{given, App, Resp, Runtime};
use metal_ipam_tests::metal_sim::{Fault, MetalSim, SimConfig};
use metal_ipam_tests::vrf_world::metal_app_on;
use serde_json::{json, Value};

const DEV: &str = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a";
const DEV2: &str = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a";
const NS: &str = "team-a";
const NET: &str = "/v1/machines/team-a/m-0/network";
const CFG: &str = "/v1/machines/team-a/m-0/netconfig?format=shell";

struct World {
    kube: FakeKube,
    sim: MetalSim,
    app: App,
}

/// The profile `l2` with these VLANs on `bond0` (layer 2, VLAN 1010 native).
fn profile(name: &str, vlans: Value) -> Value {
    json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalNetworkProfile",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"metro": "da", "ports": [{"name": "bond0", "layer2": true,
            "vlans": vlans, "nativeVLAN": {"vxlan": 1010}}]}
    })
}

fn vlans_from(pool: &str) -> Value {
    json!([{"vxlan": 1010, "addresses": [{"static": "192.168.10.5/24"}]},
           {"vxlan": 1011, "addresses": [{"pool": {"name": pool}}]}])
}

async fn setup(runtime: Runtime) -> Option<World> {
    given(runtime).await?;
    let kube = FakeKube::start().await;
    let sim = MetalSim::start_with(SimConfig::default()).await.unwrap();
    sim.add_device(DEV, "da", 2);
    sim.add_device(DEV2, "da", 2);
    sim.create_vlans("da", &[1010, 1011, 1012]).await;
    let app = metal_app_on(runtime, &kube, &sim).await?;
    kube.create(profile("l2", vlans_from("nodes")));
    kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c", "namespace": NS}, "spec": {}}),
    );
    for (name, net) in [("nodes", "192.168.11"), ("stor", "192.168.12")] {
        let pool = kube.create(json!({
            "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"addresses": [format!("{net}.10-{net}.20")], "prefix": 24,
                     "gateway": format!("{net}.1")}
        }));
        let r = app
            .call(
                "POST",
                "/v1/events",
                Some(&json!({"type": "ADDED", "object": pool})),
            )
            .await;
        assert_eq!(r.status, 200, "{:#}", r.body);
    }
    kube.create(machine("m-0", Some("l2"), DEV));
    Some(World { kube, sim, app })
}

fn machine(name: &str, profile: Option<&str>, device: &str) -> Value {
    let mut m = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterName": "c", "providerID": format!("equinixmetal://{device}")}
    });
    if let Some(p) = profile {
        m["metadata"]["annotations"] = json!({"ipam.metal-ipam.dev/network-profile": p});
    }
    m
}

impl World {
    /// `method path` until it answers 200 (202s while steps run).
    async fn converge(&self, method: &str, path: &str) -> Resp {
        for _ in 0..30 {
            let r = self.app.call(method, path, None).await;
            if r.status != 202 {
                assert_eq!(r.status, 200, "{method} {path}: {:#}", r.body);
                return r;
            }
        }
        panic!("{method} {path} did not converge");
    }

    /// Delivers a watch event about `object` until the events route stops
    /// asking for it again; the last answer.
    async fn deliver(&self, object: &Value) -> Resp {
        for _ in 0..30 {
            let r = self
                .app
                .call(
                    "POST",
                    "/v1/events",
                    Some(&json!({"type": "MODIFIED", "object": object})),
                )
                .await;
            if r.status != 503 {
                return r;
            }
        }
        panic!("the event about {object} was never done");
    }

    fn machine(&self, name: &str) -> Value {
        self.kube
            .get(CLUSTER_GROUP, "machines", Some(NS), name)
            .expect("the Machine")
    }

    /// The claims owned by Machine `name`, live ones (no deletion
    /// requested) and deleting ones.
    fn claims_of(&self, name: &str) -> (Vec<Value>, Vec<Value>) {
        self.kube
            .list(IPAM_GROUP, "ipaddressclaims")
            .into_iter()
            .filter(|c| {
                c["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|o| {
                        o.iter()
                            .any(|r| r["kind"] == "Machine" && r["name"] == name)
                    })
            })
            .partition(|c| c["metadata"]["deletionTimestamp"].is_null())
    }

    /// Binds `claim` through the allocator (its event).
    async fn bind(&self, claim: &Value) {
        let r = self
            .app
            .call(
                "POST",
                "/v1/events",
                Some(&json!({"type": "ADDED", "object": claim})),
            )
            .await;
        assert_eq!(r.body["stepResult"]["result"], "bound", "{:#}", r.body);
    }

    async fn netconfig(&self) -> (String, String) {
        let r = self.app.call("GET", CFG, None).await;
        assert_eq!(r.status, 200, "{:#}", r.body);
        (
            r.text(),
            r.headers["x-metal-ipam-pending"].to_str().unwrap().into(),
        )
    }

    fn bond(&self, device: &str) -> metal_ipam_tests::metal_sim::Port {
        self.sim
            .device(device)
            .unwrap()
            .port("bond0")
            .unwrap()
            .clone()
    }

    fn metal_writes(&self) -> Vec<String> {
        self.sim
            .requests()
            .iter()
            .filter(|q| q.method != "GET")
            .map(|q| q.line())
            .collect()
    }
}

/// Finding 1: a VLAN slot whose pool changed gets a new claim on the new
/// pool and the old claim is deleted; inserting a VLAN before it keeps its
/// claim; dropping the VLAN deletes its claim; netconfig renders only
/// addresses of the profile's pools.
async fn per_vlan_claims_follow_the_profile(w: World) {
    w.converge("POST", NET).await;
    let (live, _) = w.claims_of("m-0");
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(live[0]["spec"]["poolRef"]["name"], "nodes");
    w.bind(&live[0]).await;
    let (text, pending) = w.netconfig().await;
    assert!(text.contains("192.168.11.10/24 dev bond0.1011"), "{text}");
    assert_eq!(pending, "0");

    // VLAN 1011's address now from `stor`.
    let mut p = w
        .kube
        .get(METAL_GROUP, "metalnetworkprofiles", Some(NS), "l2")
        .unwrap();
    p["spec"]["ports"][0]["vlans"] = vlans_from("stor");
    w.kube.put(p.clone());
    w.converge("POST", NET).await;
    let (live, deleting) = w.claims_of("m-0");
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(live[0]["spec"]["poolRef"]["name"], "stor", "{live:#?}");
    let gone = w.kube.list(IPAM_GROUP, "ipaddressclaims").iter().all(|c| {
        c["spec"]["poolRef"]["name"] != "nodes" || !c["metadata"]["deletionTimestamp"].is_null()
    });
    assert!(gone, "the `nodes` claim is deleted: {deleting:#?}");
    // Until the new claim is bound, its address is pending and the old
    // pool's address is not rendered.
    let (text, pending) = w.netconfig().await;
    assert!(!text.contains("192.168.11.10"), "{text}");
    assert_eq!(pending, "1");
    w.bind(&live[0]).await;
    let (text, pending) = w.netconfig().await;
    assert!(text.contains("192.168.12.10/24 dev bond0.1011"), "{text}");
    assert_eq!(pending, "0");
    let stor_claim = live[0]["metadata"]["name"].clone();

    // A VLAN inserted before it: its claim stays.
    p["spec"]["ports"][0]["vlans"] = json!([{"vxlan": 1012, "addresses": [{"static": "192.168.13.5/24"}]},
        {"vxlan": 1010, "addresses": [{"static": "192.168.10.5/24"}]},
        {"vxlan": 1011, "addresses": [{"pool": {"name": "stor"}}]}]);
    w.kube.put(p.clone());
    w.converge("POST", NET).await;
    let (live, _) = w.claims_of("m-0");
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(live[0]["metadata"]["name"], stor_claim);
    assert_eq!(w.bond(DEV).vlans.len(), 3);

    // VLAN 1011 dropped: its claim is deleted, once the device no longer
    // carries it.
    p["spec"]["ports"][0]["vlans"] = json!([{"vxlan": 1012, "addresses": [{"static": "192.168.13.5/24"}]},
        {"vxlan": 1010, "addresses": [{"static": "192.168.10.5/24"}]}]);
    w.kube.put(p);
    w.converge("POST", NET).await;
    let (live, _) = w.claims_of("m-0");
    assert!(live.is_empty(), "{live:#?}");
    assert_eq!(w.bond(DEV).vlans.len(), 2);
    assert_eq!(w.sim.violations(), Vec::<String>::new());
    assert_eq!(w.kube.schema_violations(), Vec::<String>::new());
}

/// Finding 10: nobody sends a Machine event; reconcile applies the profile
/// (forwarding each opted-in Machine to the network step).
async fn reconcile_applies_profiles_without_machine_events(w: World) {
    let mut answers = Vec::new();
    for _ in 0..30 {
        let r = w.app.call("POST", "/v1/reconcile", None).await;
        answers.push(r.body["network"].clone());
        let bond = w.bond(DEV);
        if bond.layer2 && bond.vlans.len() == 2 && bond.native_vlan.is_some() {
            assert_eq!(r.status, 200, "{:#}", r.body);
            break;
        }
    }
    let bond = w.bond(DEV);
    assert!(
        bond.layer2 && bond.vlans.len() == 2 && bond.native_vlan.is_some(),
        "reconcile applied the profile: {answers:#?}"
    );
    // Converged: a reconcile makes no Metal write.
    w.sim.clear_requests();
    let r = w.app.call("POST", "/v1/reconcile", None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(
        r.body["network"][0]["machine"], "team-a/m-0",
        "{:#}",
        r.body
    );
    assert_eq!(w.metal_writes(), Vec::<String>::new());
    // The run's observation: the metrics count the machine as converged in
    // its profile's mode, and the browser view lists it.
    let text = w.app.call("GET", "/v1/metrics", None).await.text();
    assert!(
        text.lines()
            .any(|l| l == "metal_ipam_machines{phase=\"converged\",mode=\"layer2-bonded\"} 1"),
        "{text}"
    );
    let view = w.app.call("GET", "/ui/api/machines", None).await;
    assert_eq!(view.status, 200, "{}", view.text());
    let rows = view.body["machines"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let m0 = rows
        .iter()
        .find(|m| m["name"] == "m-0")
        .unwrap_or_else(|| panic!("m-0 in {:#}", view.body));
    assert_eq!(m0["phase"], "converged", "{m0:#}");
    assert_eq!(m0["ports"][0]["mode"], "layer2-bonded", "{m0:#}");
    assert_eq!(
        m0["ports"][0]["vlans"].as_array().map(Vec::len),
        Some(2),
        "{m0:#}"
    );
    // What one sync of a converged machine costs.
    w.sim.clear_requests();
    w.kube.clear_requests();
    let r = w.deliver(&w.machine("m-0")).await;
    assert_eq!(r.body["stepResult"]["result"], "converged", "{:#}", r.body);
    let metal: Vec<String> = w.sim.requests().iter().map(|q| q.line()).collect();
    let kube: Vec<String> = w.kube.requests().iter().map(|q| q.line()).collect();
    println!(
        "a converged machine's sync: {} Kubernetes requests {kube:?}, {} Metal requests {metal:?}",
        kube.len(),
        metal.len()
    );
    assert!(
        metal.iter().all(|l| l.starts_with("GET")) && metal.len() <= 3,
        "{metal:?}"
    );
    assert!(
        kube.iter().all(|l| l.starts_with("GET")) && kube.len() <= 3,
        "{kube:?}"
    );
    assert_eq!(w.sim.violations(), Vec::<String>::new());
}

/// Finding 10: a profile event reaches every Machine using the profile; a
/// `PacketMachine` event reaches its Machine (here opted in by the
/// `PacketMachine`'s annotation).
async fn profile_and_packet_machine_events_reach_their_machines(w: World) {
    w.converge("POST", NET).await;
    // m-1 on DEV2, opted in through its PacketMachine.
    w.kube.create(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "PacketMachine",
        "metadata": {"name": "pm-1", "namespace": NS,
            "annotations": {"ipam.metal-ipam.dev/network-profile": "l2"}},
        "spec": {"providerID": format!("equinixmetal://{DEV2}")}
    }));
    let mut m1 = machine("m-1", None, DEV2);
    m1["spec"].as_object_mut().unwrap().remove("providerID");
    m1["spec"]["infrastructureRef"] = json!({"apiGroup": "infrastructure.cluster.x-k8s.io",
        "kind": "PacketMachine", "name": "pm-1"});
    w.kube.create(m1);
    let pm = w
        .kube
        .get(INFRA_GROUP, "packetmachines", Some(NS), "pm-1")
        .unwrap();
    let r = w.deliver(&pm).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    let bond = w.bond(DEV2);
    assert!(bond.layer2 && bond.vlans.len() == 2, "{:#}", r.body);

    // The profile edited: a third VLAN. Its event reaches both machines.
    let mut p = w
        .kube
        .get(METAL_GROUP, "metalnetworkprofiles", Some(NS), "l2")
        .unwrap();
    p["spec"]["ports"][0]["vlans"]
        .as_array_mut()
        .unwrap()
        .push(json!({"vxlan": 1012}));
    let p = w.kube.put(p);
    let r = w.deliver(&p).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(w.bond(DEV).vlans.len(), 3, "{:#}", r.body);
    assert_eq!(w.bond(DEV2).vlans.len(), 3, "{:#}", r.body);
    assert_eq!(w.sim.violations(), Vec::<String>::new());
}

fn profile_review(op: &str, old: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": op, "namespace": NS, "name": "l2",
            "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": "MetalNetworkProfile"},
            "resource": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "resource": "metalnetworkprofiles"},
            "oldObject": old, "object": null}})
}

/// Finding 12 (the profile half) and 10: deleting a profile that Machines
/// use is refused naming them, unless the profile carries the skip
/// annotation.
async fn the_webhook_refuses_deleting_a_profile_in_use(w: World) {
    let p = w
        .kube
        .get(METAL_GROUP, "metalnetworkprofiles", Some(NS), "l2")
        .unwrap();
    let r = w
        .app
        .call(
            "POST",
            "/v1/admission/network-profiles",
            Some(&profile_review("DELETE", p.clone())),
        )
        .await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    let resp = &r.body["response"];
    assert_eq!(resp["allowed"], false, "{r:#?}");
    let msg = resp["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("team-a/m-0"), "{msg}");
    assert_eq!(resp["status"]["code"], 403);

    let mut skip = p.clone();
    skip["metadata"]["annotations"] =
        json!({"ipam.metal-ipam.dev/skip-validate-delete-webhook": "true"});
    let r = w
        .app
        .call(
            "POST",
            "/v1/admission/network-profiles",
            Some(&profile_review("DELETE", skip)),
        )
        .await;
    assert_eq!(r.body["response"]["allowed"], true, "{:#}", r.body);

    // A profile nobody uses is deleted freely.
    let mut m = w.machine("m-0");
    m["metadata"]["annotations"] = json!({});
    w.kube.put(m);
    let r = w
        .app
        .call(
            "POST",
            "/v1/admission/network-profiles",
            Some(&profile_review("DELETE", p)),
        )
        .await;
    assert_eq!(r.body["response"]["allowed"], true, "{:#}", r.body);
}

/// Finding 11: after `DELETE …/network`, Machine events and reconcile leave
/// the device alone while the annotation stays as it was; an explicit POST
/// applies again; so does a changed annotation.
async fn delete_network_sticks(w: World) {
    w.converge("POST", NET).await;
    let r = w.converge("DELETE", NET).await;
    assert_eq!(r.body["claimsDeleted"], 1, "{:#}", r.body);
    let released = |w: &World| {
        let b = w.bond(DEV);
        !b.layer2 && b.vlans.is_empty()
    };
    assert!(released(&w));
    // The release is recorded; the record, and the example of one, follow
    // the record's JSON Schema.
    let key = format!("net/device/{DEV}");
    let rec: Value =
        serde_json::from_slice(&w.app.store().await.get(&key).await.unwrap().unwrap()).unwrap();
    assert_eq!(rec["state"]["released"]["profile"], "l2", "{rec:#}");
    assert_eq!(rec["state"]["released"]["done"], true, "{rec:#}");
    let kv_schema = metal_ipam_tests::schema::repo_root().join("kv-schema");
    let read = |f: &str| -> Value {
        serde_json::from_slice(&std::fs::read(kv_schema.join(f)).unwrap()).unwrap()
    };
    let schema = read("net-device-record.schema.json");
    for v in [rec, read("examples/net-device-released.json")] {
        metal_ipam_tests::schema::validate(&schema, &v).unwrap_or_else(|e| panic!("{e:?}\n{v:#}"));
    }
    w.sim.clear_requests();
    let r = w.deliver(&w.machine("m-0")).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(
        r.body["stepResult"]["result"], "released-by-operator",
        "{:#}",
        r.body
    );
    let r = w.app.call("POST", "/v1/reconcile", None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert!(released(&w), "reconcile put the profile back");
    assert_eq!(w.metal_writes(), Vec::<String>::new());
    assert!(w.claims_of("m-0").0.is_empty(), "no claim re-created");

    // An explicit POST applies it again.
    w.converge("POST", NET).await;
    assert!(w.bond(DEV).layer2);
    let r = w.deliver(&w.machine("m-0")).await;
    assert_eq!(r.body["stepResult"]["result"], "converged", "{:#}", r.body);

    // Released again, then the annotation names another profile: applied.
    w.converge("DELETE", NET).await;
    assert!(released(&w));
    w.kube.create(profile("l2b", vlans_from("stor")));
    let mut m = w.machine("m-0");
    m["metadata"]["annotations"] = json!({"ipam.metal-ipam.dev/network-profile": "l2b"});
    w.kube.put(m);
    let r = w.deliver(&w.machine("m-0")).await;
    assert_eq!(r.body["stepResult"]["result"], "converged", "{:#}", r.body);
    assert!(w.bond(DEV).layer2);
    assert_eq!(w.sim.violations(), Vec::<String>::new());
}

/// Finding 12: a profile deleted behind the webhook's back (or renamed)
/// leaves the network and the claims as they are; each Machine event
/// reports it, with a clear reason.
async fn a_deleted_profile_leaves_the_network_as_it_is(w: World) {
    w.converge("POST", NET).await;
    w.kube
        .delete(METAL_GROUP, "metalnetworkprofiles", Some(NS), "l2");
    w.sim.clear_requests();
    let r = w.deliver(&w.machine("m-0")).await;
    assert_eq!(r.body["stepStatus"], 404, "{:#}", r.body);
    assert_eq!(
        r.body["stepResult"]["reason"], "ProfileNotFound",
        "{:#}",
        r.body
    );
    let msg = r.body["stepResult"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("l2") && msg.contains("left as it is"), "{msg}");
    let b = w.bond(DEV);
    assert!(b.layer2 && b.vlans.len() == 2, "the network is kept");
    assert_eq!(w.claims_of("m-0").0.len(), 1, "the claim is kept");
    assert_eq!(w.metal_writes(), Vec::<String>::new());
    let key = format!("net/device/{DEV}");
    assert!(w.app.store().await.get(&key).await.unwrap().is_some());
}

/// Finding 13: a mode change Metal refuses (422) whose effect a re-read
/// does not show is a definite failure with Metal's message (409, kept in
/// the apply record), not a step running forever.
async fn a_refused_mode_change_is_a_definite_failure(w: World) {
    w.sim.inject("POST", "convertLayer2", Fault::Status(422), 1);
    let mut answers = Vec::new();
    for _ in 0..5 {
        let r = w.app.call("POST", NET, None).await;
        answers.push((r.status, r.body["reason"].clone()));
        if r.status != 202 {
            assert_eq!(
                (r.status, r.reason()),
                (409, "PortChangeRefused"),
                "{:#}",
                r.body
            );
            assert!(
                r.body["message"]
                    .as_str()
                    .unwrap()
                    .contains("injected fault: 422"),
                "{:#}",
                r.body
            );
            break;
        }
    }
    assert_ne!(answers.last().map(|a| a.0), Some(202), "{answers:?}");
    let key = format!("net/device/{DEV}");
    let rec: Value =
        serde_json::from_slice(&w.app.store().await.get(&key).await.unwrap().unwrap()).unwrap();
    assert!(rec["state"]["running"].is_null(), "{rec:#}");
    assert!(
        rec["state"]["failed"]
            .as_str()
            .unwrap()
            .contains("injected fault"),
        "{rec:#}"
    );
    // The next POST plans it again, and Metal accepts it this time.
    w.converge("POST", NET).await;
    assert!(w.bond(DEV).layer2);
}

/// Finding 13: names from the profile annotation and from
/// `spec.infrastructureRef` are checked before they go into API paths.
async fn names_from_annotations_and_references_are_checked(w: World) {
    let mut m = machine("bad-0", Some("../../../../api/v1/secrets"), DEV2);
    w.kube.create(m.clone());
    let r = w
        .app
        .call("POST", "/v1/machines/team-a/bad-0/network", None)
        .await;
    assert_eq!(r.status, 422, "{:#}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("ipam.metal-ipam.dev/network-profile"),
        "{:#}",
        r.body
    );
    m["metadata"]["name"] = json!("bad-1");
    m["metadata"]["annotations"] = json!({});
    m["spec"]["infrastructureRef"] = json!({"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "PacketMachine", "name": "x/../y"});
    w.kube.create(m);
    let r = w
        .app
        .call("POST", "/v1/machines/team-a/bad-1/network", None)
        .await;
    assert_eq!(r.status, 422, "{:#}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("infrastructureRef"),
        "{:#}",
        r.body
    );
    assert!(w
        .kube
        .requests()
        .iter()
        .all(|q| !q.line().contains("..") && !q.line().contains("secrets")));
}

/// A machine whose device vanished: the apply forgets the device's record
/// (no lease, no running step left behind) and answers 404 DeviceNotFound.
async fn an_apply_on_a_vanished_device_forgets_it(w: World) {
    let r = w.app.call("POST", NET, None).await;
    assert_eq!(r.status, 202, "{:#}", r.body);
    let key = format!("net/device/{DEV}");
    let store = w.app.store().await;
    assert!(store.get(&key).await.unwrap().is_some());
    w.sim.delete_device(DEV);
    let r = w.app.call("POST", NET, None).await;
    assert_eq!(
        (r.status, r.reason()),
        (404, "DeviceNotFound"),
        "{:#}",
        r.body
    );
    assert!(
        store.get(&key).await.unwrap().is_none(),
        "the record is forgotten"
    );
}

metal_ipam_tests::on_every_runtime!(
    setup: per_vlan_claims_follow_the_profile,
    reconcile_applies_profiles_without_machine_events,
    profile_and_packet_machine_events_reach_their_machines,
    the_webhook_refuses_deleting_a_profile_in_use,
    delete_network_sticks,
    a_deleted_profile_leaves_the_network_as_it_is,
    a_refused_mode_change_is_a_definite_failure,
    names_from_annotations_and_references_are_checked,
    an_apply_on_a_vanished_device_forgets_it,
);
