//! Every network mode transition of a Machine's device, end to end through
//! the `network` component on the test host (the real `.wasm` files),
//! against the fake Kubernetes API and the Metal simulator's port state
//! machine:
//! - a 2-port device walks an Eulerian circuit of the complete digraph on
//!   the five modes (layer3, hybrid-bonded, hybrid, layer2-bonded,
//!   layer2-individual): each of the 20 ordered pairs once, the Machine's
//!   profile annotation switched from one to the next;
//! - the two bonds of a 4-port device take their own modes, through a few
//!   transitions per bond (the profile switched by annotation, then edited
//!   in place);
//! - `DELETE` tears either device down to layer3 without VLANs (from
//!   layer2-individual with a native VLAN; from two bonds in two modes,
//!   with the profile object already gone);
//! - two POSTs at once on one device: one holds the lease (a proxy in
//!   front of the simulator holds its first Metal write until the other
//!   has answered, so the overlap is certain, without sleeping), the other
//!   answers 202 in progress; both converge by re-POSTing, at once, and
//!   every Metal mutating call is made once; then two callers racing from
//!   the start, likewise.
//!
//! For each transition: `?dryRun=true` answers the plan and the modes
//! without a Metal write; POSTs (202 with `Retry-After` and `Location`
//! while a step runs) converge to 200 having issued exactly the plan, and
//! the Metal calls the simulator received are that plan, one call per step;
//! the simulator's ports are in the wanted modes with the wanted VLANs and
//! native VLANs; a further POST makes no mutating Metal call. The simulator
//! reports no spec violation. Only the public network route is driven:
//! whichever component makes the Metal calls, they are observed at the
//! simulator. `--nocapture` prints, per transition, the Metal calls made.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use metal_ipam_tests::fake_kube::{FakeKube, CLUSTER_GROUP, METAL_GROUP};
use metal_ipam_tests::harness::{App, Resp};
use metal_ipam_tests::metal_sim::{MetalSim, Recorded, SimConfig};
use metal_ipam_tests::vrf_world::metal_app;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

const DEV: &str = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a";
const NS: &str = "team-a";
const MACHINE: &str = "m-0";
const PATH: &str = "/v1/machines/team-a/m-0/network";
const ANNOTATION: &str = "ipam.metal-ipam.dev/network-profile";
/// POSTs (or DELETEs) one transition may take before it counts as stuck.
const MAX_CALLS: usize = 40;

/// The five modes, the order of the circuit's vertices (layer3, the mode
/// a device is created in, first).
const MODES: [&str; 5] = [
    "layer3",
    "hybrid-bonded",
    "hybrid",
    "layer2-bonded",
    "layer2-individual",
];

/// A profile per mode of a 2-port device (bond0 = eth0 + eth1), with
/// VLANs on every port that can carry them and native VLANs where Metal
/// has them.
fn two_port_profile(mode: &str) -> Value {
    match mode {
        "layer3" => json!({"metro": "da"}),
        "hybrid-bonded" => json!({"metro": "da", "ports": [
            {"name": "bond0", "vlans": [{"vxlan": 1010}, {"vxlan": 1011}]}]}),
        "hybrid" => json!({"metro": "da", "ports": [
            {"name": "eth1", "bonded": false, "vlans": [{"vxlan": 1012}]}]}),
        "layer2-bonded" => json!({"metro": "da", "ports": [{"name": "bond0", "layer2": true,
            "vlans": [{"vxlan": 1010}, {"vxlan": 1011}, {"vxlan": 1012}], "nativeVLAN": {"vxlan": 1011}}]}),
        "layer2-individual" => json!({"metro": "da", "ports": [
            {"name": "bond0", "layer2": true, "bonded": false},
            {"name": "eth0", "vlans": [{"vxlan": 1010}]},
            {"name": "eth1", "vlans": [{"vxlan": 1011}, {"vxlan": 1013}], "nativeVLAN": {"vxlan": 1013}}]}),
        other => panic!("no mode {other}"),
    }
}

/// An Eulerian circuit of the complete digraph on the five modes, from and
/// back to layer3: for each stride k in 1..=4 the cycle 0 → k → 2k → … → 0
/// (mod 5; 5 is prime, so each is a 5-cycle), whose edges are exactly the
/// pairs (i, i + k). The four cycles share vertex 0 and together hold each
/// of the 20 ordered pairs once.
fn circuit() -> Vec<(usize, usize)> {
    let n = MODES.len();
    (1..n)
        .flat_map(|k| (0..n).map(move |i| ((i * k) % n, ((i + 1) * k) % n)))
        .collect()
}

/// Metal calls of one transition (or teardown), for the printed table.
struct Row {
    label: String,
    steps: usize,
    calls: usize,
    writes: usize,
    reads: usize,
    dry_run_reads: usize,
    converged_reads: usize,
}

fn print_table(title: &str, rows: &[Row]) {
    let w = rows
        .iter()
        .map(|r| r.label.chars().count())
        .max()
        .unwrap_or(10);
    let line = |label: &str, n: [String; 6]| {
        let pad = w.saturating_sub(label.chars().count());
        println!(
            "{label}{:pad$} {:>5} {:>5} {:>6} {:>5} {:>7} {:>9}",
            "", n[0], n[1], n[2], n[3], n[4], n[5]
        );
    };
    println!("\n{title}");
    line(
        "transition",
        ["steps", "calls", "writes", "reads", "dry-run", "converged"].map(String::from),
    );
    for r in rows {
        line(
            &r.label,
            [
                r.steps,
                r.calls,
                r.writes,
                r.reads,
                r.dry_run_reads,
                r.converged_reads,
            ]
            .map(|n| n.to_string()),
        );
    }
    let sum = |f: fn(&Row) -> usize| rows.iter().map(f).sum::<usize>().to_string();
    line(
        "total",
        [
            sum(|r| r.steps),
            sum(|r| r.calls),
            sum(|r| r.writes),
            sum(|r| r.reads),
            sum(|r| r.dry_run_reads),
            sum(|r| r.converged_reads),
        ],
    );
    println!(
        "steps: planned; calls: POSTs (DELETEs) on the route until 200; writes, reads: the Metal \
         requests of those calls; dry-run, converged: Metal reads of the dry run and of one more POST"
    );
}

// ---------------------------------------------------------------------------
// The world: fake Kubernetes, the simulator, the app
// ---------------------------------------------------------------------------

/// Builds apps one at a time: the first build compiles the components
/// (the host caches them per process), and the tests running alongside
/// reuse them instead of compiling them again at the same time.
fn one_build_at_a_time(build: impl FnOnce() -> App) -> App {
    static BUILD: Mutex<()> = Mutex::new(());
    let _one = BUILD.lock().unwrap_or_else(PoisonError::into_inner);
    build()
}

struct World {
    kube: FakeKube,
    sim: MetalSim,
    app: App,
    /// VLAN UUID → vxlan.
    vxlan_of: BTreeMap<String, u16>,
}

impl World {
    /// A device with `eth` Ethernet ports, the VLANs `vxlans` in metro da,
    /// the Machine of the device (no profile yet), and the app.
    async fn new(eth: usize, vxlans: &[u16]) -> World {
        let kube = FakeKube::start().await;
        let sim = MetalSim::start_with(SimConfig::default()).await.unwrap();
        sim.add_device(DEV, "da", eth);
        let vxlan_of = sim
            .create_vlans("da", vxlans)
            .await
            .into_iter()
            .map(|(n, id)| (id, n))
            .collect();
        let app = one_build_at_a_time(|| metal_app(&kube, &sim));
        kube.create(
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c", "namespace": NS}, "spec": {}}),
        );
        kube.create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": MACHINE, "namespace": NS},
            "spec": {"clusterName": "c", "providerID": format!("equinixmetal://{DEV}")}
        }));
        World {
            kube,
            sim,
            app,
            vxlan_of,
        }
    }

    fn profile_object(name: &str, spec: &Value) -> Value {
        json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalNetworkProfile",
            "metadata": {"name": name, "namespace": NS}, "spec": spec})
    }

    fn create_profile(&self, name: &str, spec: &Value) {
        self.kube.create(Self::profile_object(name, spec));
    }

    /// Replaces the profile object's spec in place.
    fn edit_profile(&self, name: &str, spec: &Value) {
        let mut p = self
            .kube
            .get(METAL_GROUP, "metalnetworkprofiles", Some(NS), name)
            .expect("the profile");
        p["spec"] = spec.clone();
        self.kube.put(p);
    }

    /// Points the Machine's annotation at profile `name`.
    fn opt_into(&self, name: &str) {
        let mut m = self
            .kube
            .get(CLUSTER_GROUP, "machines", Some(NS), MACHINE)
            .expect("the Machine");
        m["metadata"]["annotations"] = json!({ ANNOTATION: name });
        self.kube.put(m);
    }

    fn writes(requests: &[Recorded]) -> Vec<&Recorded> {
        requests.iter().filter(|q| q.method != "GET").collect()
    }

    /// `?dryRun=true`: 200 with `modes` as given and a plan; no Metal
    /// write. Returns the plan and the Metal reads it made.
    async fn dry_run(&self, label: &str, modes: &[(&str, &str)]) -> (Vec<Value>, usize) {
        self.sim.clear_requests();
        let r = self
            .app
            .call("POST", &format!("{PATH}?dryRun=true"), None)
            .await;
        assert_eq!(r.status, 200, "{label}: dry run {:#}", r.body);
        let want: serde_json::Map<String, Value> = modes
            .iter()
            .map(|(b, m)| (b.to_string(), json!(m)))
            .collect();
        assert_eq!(
            r.body["modes"],
            Value::Object(want),
            "{label}: {:#}",
            r.body
        );
        let requests = self.sim.requests();
        assert!(
            Self::writes(&requests).is_empty(),
            "{label}: the dry run wrote to Metal: {:?}",
            requests.iter().map(Recorded::line).collect::<Vec<_>>()
        );
        (
            r.body["plan"].as_array().expect("a plan").clone(),
            requests.len(),
        )
    }

    /// `method` on the route until it answers 200 (202s in between, each
    /// with `Retry-After` and `Location`); returns the steps issued, in
    /// order, the last answer and the number of calls.
    async fn converge(&self, label: &str, method: &str) -> (Vec<Value>, Resp, usize) {
        let mut issued = Vec::new();
        for n in 1..=MAX_CALLS {
            let r = self.app.call(method, PATH, None).await;
            issued.extend(r.body["issued"].as_array().cloned().unwrap_or_default());
            if r.status == 200 {
                assert_eq!(r.body["phase"], "converged", "{label}: {:#}", r.body);
                return (issued, r, n);
            }
            check_in_progress(label, &r);
        }
        panic!("{label}: not converged after {MAX_CALLS} {method}s");
    }

    /// One more POST: 200 converged, nothing issued or remaining, no
    /// mutating Metal call. Returns the Metal reads it made.
    async fn assert_converged(&self, label: &str) -> usize {
        self.sim.clear_requests();
        let r = self.app.call("POST", PATH, None).await;
        assert_eq!(
            (r.status, &r.body["phase"]),
            (200, &json!("converged")),
            "{label}: {:#}",
            r.body
        );
        assert_eq!(r.body["issued"], json!([]), "{label}");
        assert_eq!(r.body["remaining"], json!([]), "{label}");
        let requests = self.sim.requests();
        let writes = Self::writes(&requests);
        assert!(
            writes.is_empty(),
            "{label}: a converged POST wrote: {:?}",
            writes.iter().map(|q| q.line()).collect::<Vec<_>>()
        );
        requests.len()
    }

    /// The Metal mutating calls recorded are exactly `steps`, one call per
    /// step in order, each answered 2xx.
    fn assert_calls_are(&self, label: &str, steps: &[Value], requests: &[Recorded]) {
        let writes = Self::writes(requests);
        for w in &writes {
            assert!(
                w.status.is_some_and(|s| (200..300).contains(&s)),
                "{label}: {} answered {:?}",
                w.line(),
                w.status
            );
        }
        let made: Vec<String> = writes.iter().map(|w| describe_call(w)).collect();
        let planned: Vec<String> = steps.iter().map(describe_step).collect();
        assert_eq!(made, planned, "{label}: the Metal calls are not the steps");
    }

    /// The simulator's device: each bond in its mode, each port's VLANs
    /// and native VLAN and each member's bonding as `spec` says (a port it
    /// does not name: bonded, without VLANs).
    fn assert_device(&self, label: &str, spec: &Value, modes: &[(&str, &str)]) {
        let d = self.sim.device(DEV).expect("the device");
        for (bond, mode) in modes {
            assert_eq!(d.network_type(bond), Some(*mode), "{label}: {bond}'s mode");
        }
        let named = |name: &str| -> Option<&Value> {
            spec["ports"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        };
        let vx = |id: &String| self.vxlan_of[id];
        for p in &d.ports {
            let want = named(&p.name);
            let want_vlans: BTreeSet<u16> = want
                .and_then(|w| w["vlans"].as_array())
                .map(|vs| {
                    vs.iter()
                        .map(|v| v["vxlan"].as_u64().unwrap() as u16)
                        .collect()
                })
                .unwrap_or_default();
            let have: BTreeSet<u16> = p.vlans.iter().map(vx).collect();
            assert_eq!(have, want_vlans, "{label}: {}'s VLANs", p.name);
            let want_native = want
                .and_then(|w| w["nativeVLAN"]["vxlan"].as_u64())
                .map(|n| n as u16);
            assert_eq!(
                p.native_vlan.as_ref().map(vx),
                want_native,
                "{label}: {}'s native VLAN",
                p.name
            );
            if let Some(bond) = &p.bond {
                let want_bonded = want
                    .and_then(|w| w["bonded"].as_bool())
                    .or_else(|| named(bond).and_then(|b| b["bonded"].as_bool()))
                    .unwrap_or(true);
                assert_eq!(p.bonded, want_bonded, "{label}: {} bonded", p.name);
            }
        }
    }

    /// The whole transition to `spec` (already opted into): dry run (with
    /// bond, disbond or convert steps exactly when `mode_changes`), converge, the calls made are the plan, the device is as wanted, a
    /// further POST writes nothing.
    async fn transition(
        &self,
        label: &str,
        spec: &Value,
        modes: &[(&str, &str)],
        mode_changes: bool,
    ) -> Row {
        let (planned, dry_run_reads) = self.dry_run(label, modes).await;
        assert!(!planned.is_empty(), "{label}: nothing planned");
        let port_mode_calls = planned.iter().any(|s| {
            let a = s["action"].as_str().unwrap_or("");
            a.starts_with("convert") || a.ends_with("bond")
        });
        assert_eq!(
            port_mode_calls, mode_changes,
            "{label}: bond, disbond or convert calls exactly when a port's mode changes: {planned:#?}"
        );
        self.sim.clear_requests();
        let (issued, _, calls) = self.converge(label, "POST").await;
        let requests = self.sim.requests();
        assert_eq!(
            issued, planned,
            "{label}: apply did not do the dry-run plan"
        );
        self.assert_calls_are(label, &planned, &requests);
        self.assert_device(label, spec, modes);
        let converged_reads = self.assert_converged(label).await;
        let writes = Self::writes(&requests).len();
        Row {
            label: label.to_string(),
            steps: planned.len(),
            calls,
            writes,
            reads: requests.len() - writes,
            dry_run_reads,
            converged_reads,
        }
    }

    /// DELETE until released: every port bonded, layer3, without VLANs;
    /// the calls made are the steps issued; once more writes nothing.
    async fn teardown(&self, label: &str, bonds: &[&str]) -> Row {
        self.sim.clear_requests();
        let (issued, last, calls) = self.converge(label, "DELETE").await;
        let requests = self.sim.requests();
        assert!(!issued.is_empty(), "{label}: nothing to tear down");
        self.assert_calls_are(label, &issued, &requests);
        assert_eq!(last.body["claimsDeleted"], 0, "{label}: {:#}", last.body);
        let layer3: Vec<(&str, &str)> = bonds.iter().map(|b| (*b, "layer3")).collect();
        self.assert_device(label, &json!({}), &layer3);
        let d = self.sim.device(DEV).unwrap();
        assert!(
            d.ports
                .iter()
                .all(|p| p.bonded && !p.layer2 && p.vlans.is_empty() && p.native_vlan.is_none()),
            "{label}: {d:#?}"
        );
        assert_eq!(self.sim.pending_port_changes(), 0, "{label}");
        self.sim.clear_requests();
        let r = self.app.call("DELETE", PATH, None).await;
        assert_eq!(
            (r.status, &r.body["phase"], &r.body["issued"]),
            (200, &json!("converged"), &json!([])),
            "{label}: {:#}",
            r.body
        );
        let again = self.sim.requests();
        assert!(Self::writes(&again).is_empty(), "{label}: released twice");
        let writes = Self::writes(&requests).len();
        Row {
            label: label.to_string(),
            steps: issued.len(),
            calls,
            writes,
            reads: requests.len() - writes,
            dry_run_reads: 0,
            converged_reads: again.len(),
        }
    }

    /// No request broke the Metal spec, no answer did, no write a CRD.
    fn assert_clean(&self) {
        assert_eq!(self.sim.violations(), Vec::<String>::new(), "Metal spec");
        assert_eq!(self.sim.answer_violations(), Vec::<String>::new());
        assert_eq!(self.kube.schema_violations(), Vec::<String>::new(), "CRDs");
    }
}

/// A 202 of the route: in progress, `Retry-After` and `Location` set.
fn check_in_progress(label: &str, r: &Resp) {
    assert_eq!(r.status, 202, "{label}: {:#}", r.body);
    assert_eq!(r.body["phase"], "in-progress", "{label}: {:#}", r.body);
    assert_eq!(r.headers["location"], PATH, "{label}");
    let retry: u64 = r.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry >= 1, "{label}: Retry-After {retry}");
}

/// A planned step as the Metal call that makes it.
fn describe_step(s: &Value) -> String {
    let port = s["portId"].as_str().expect("portId");
    let vlans = |v: &Value| -> Vec<String> {
        let mut ids: Vec<String> = v
            .as_array()
            .expect("vlans")
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    match s["action"].as_str().expect("action") {
        "assign-vlans" => format!("batch {port} assigned {:?}", vlans(&s["vlans"])),
        "unassign-vlans" => format!("batch {port} unassigned {:?}", vlans(&s["vlans"])),
        "set-native-vlan" => format!("native {port} {}", s["vlan"].as_str().unwrap()),
        "remove-native-vlan" => format!("remove-native {port}"),
        "bond" => format!("bond {port} bulk={}", s["bulk"]),
        "disbond" => format!("disbond {port} bulk={}", s["bulk"]),
        "convert-layer2" => format!("layer2 {port}"),
        "convert-layer3" => format!("layer3 {port}"),
        other => panic!("unknown action {other}"),
    }
}

/// A mutating Metal request, described as [`describe_step`] does.
fn describe_call(q: &Recorded) -> String {
    let port = q
        .path
        .split('/')
        .skip_while(|s| *s != "ports")
        .nth(1)
        .unwrap_or("?");
    let query = q.query.clone().unwrap_or_default();
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .map(str::to_string)
    };
    match q.operation.as_deref() {
        Some("createPortVlanAssignmentBatch") => {
            let items = q.body.as_ref().expect("a batch body")["vlan_assignments"]
                .as_array()
                .expect("vlan_assignments")
                .clone();
            let states: BTreeSet<&str> =
                items.iter().map(|i| i["state"].as_str().unwrap()).collect();
            assert_eq!(states.len(), 1, "one kind of change per batch: {items:?}");
            let mut ids: Vec<String> = items
                .iter()
                .map(|i| i["vlan"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            format!("batch {port} {} {ids:?}", states.first().unwrap())
        }
        Some("assignNativeVlan") => format!("native {port} {}", param("vnid").unwrap_or_default()),
        Some("deleteNativeVlan") => format!("remove-native {port}"),
        Some("bondPort") => format!(
            "bond {port} bulk={}",
            param("bulk_enable").unwrap_or("false".into())
        ),
        Some("disbondPort") => format!(
            "disbond {port} bulk={}",
            param("bulk_disable").unwrap_or("false".into())
        ),
        Some("convertLayer2") => format!("layer2 {port}"),
        Some("convertLayer3") => format!("layer3 {port}"),
        _ => format!("unexpected {}", q.line()),
    }
}

// ---------------------------------------------------------------------------
// 2-port device: all 20 ordered pairs of modes, then DELETE
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ordered_pair_of_modes_on_a_two_port_device_then_teardown() {
    let started = Instant::now();
    let w = World::new(2, &[1010, 1011, 1012, 1013]).await;
    for m in MODES {
        w.create_profile(m, &two_port_profile(m));
    }
    let mut rows = Vec::new();

    // Opted into layer3, which the device is in: converged at once.
    w.opt_into("layer3");
    let (plan, _) = w.dry_run("layer3", &[("bond0", "layer3")]).await;
    assert_eq!(plan, Vec::<Value>::new());
    w.sim.clear_requests();
    let (issued, _, calls) = w.converge("layer3", "POST").await;
    assert_eq!((issued.len(), calls), (0, 1));
    assert!(World::writes(&w.sim.requests()).is_empty());

    let edges = circuit();
    let distinct: BTreeSet<(usize, usize)> = edges.iter().copied().collect();
    assert_eq!(
        (edges.len(), distinct.len()),
        (20, 20),
        "each ordered pair once"
    );
    assert!(distinct.iter().all(|(a, b)| a != b));
    let mut at = 0;
    for (from, to) in edges {
        assert_eq!(from, at, "a circuit: each edge starts where the last ended");
        let label = format!("{} → {}", MODES[from], MODES[to]);
        w.opt_into(MODES[to]);
        // layer3 ↔ hybrid-bonded is VLANs only (both are a bonded Layer3
        // bond); every other pair changes a port's mode.
        let vlans_only = from + to == 1;
        rows.push(
            w.transition(
                &label,
                &two_port_profile(MODES[to]),
                &[("bond0", MODES[to])],
                !vlans_only,
            )
            .await,
        );
        at = to;
    }
    assert_eq!(at, 0, "back at layer3");

    // Teardown from the richest mode: native VLAN, VLANs on both members.
    w.opt_into("layer2-individual");
    rows.push(
        w.transition(
            "layer3 → layer2-individual (before DELETE)",
            &two_port_profile("layer2-individual"),
            &[("bond0", "layer2-individual")],
            true,
        )
        .await,
    );
    rows.push(
        w.teardown("DELETE from layer2-individual", &["bond0"])
            .await,
    );
    w.assert_clean();
    print_table(
        &format!(
            "2-port device: 20 ordered pairs + teardown, {:.1} s",
            started.elapsed().as_secs_f64()
        ),
        &rows,
    );
}

// ---------------------------------------------------------------------------
// 4-port device: each bond its own mode
// ---------------------------------------------------------------------------

/// Profiles of a 4-port device (bond0 = eth0 + eth2, bond1 = eth1 + eth3),
/// each with the modes of bond0 and bond1; no VLAN on two ports.
fn four_port_profiles() -> Vec<(Value, [&'static str; 2])> {
    vec![
        (
            json!({"metro": "da", "ports": [
                {"name": "bond0", "layer2": true, "vlans": [{"vxlan": 1010}]},
                {"name": "eth3", "bonded": false, "vlans": [{"vxlan": 1011}, {"vxlan": 1012}]}]}),
            ["layer2-bonded", "hybrid"],
        ),
        (
            json!({"metro": "da", "ports": [
                {"name": "eth2", "bonded": false, "vlans": [{"vxlan": 1010}]},
                {"name": "bond1", "layer2": true, "bonded": false},
                {"name": "eth1", "vlans": [{"vxlan": 1011}]},
                {"name": "eth3", "vlans": [{"vxlan": 1012}, {"vxlan": 1013}], "nativeVLAN": {"vxlan": 1013}}]}),
            ["hybrid", "layer2-individual"],
        ),
        (
            json!({"metro": "da", "ports": [
                {"name": "bond0", "layer2": true, "bonded": false},
                {"name": "eth0", "vlans": [{"vxlan": 1010}, {"vxlan": 1014}], "nativeVLAN": {"vxlan": 1010}},
                {"name": "eth2", "vlans": [{"vxlan": 1015}]},
                {"name": "bond1", "vlans": [{"vxlan": 1011}, {"vxlan": 1012}]}]}),
            ["layer2-individual", "hybrid-bonded"],
        ),
        (
            json!({"metro": "da", "ports": [
                {"name": "bond0", "layer2": true,
                 "vlans": [{"vxlan": 1010}, {"vxlan": 1014}], "nativeVLAN": {"vxlan": 1014}},
                {"name": "bond1"}]}),
            ["layer2-bonded", "layer3"],
        ),
    ]
}

/// Edited in place into the profile of the last of [`four_port_profiles`]:
/// both bonds change mode, then each keeps its mode and changes VLANs.
fn four_port_edits() -> Vec<(Value, [&'static str; 2], bool)> {
    vec![
        (
            json!({"metro": "da", "ports": [
                {"name": "bond0", "vlans": [{"vxlan": 1013}]},
                {"name": "bond1", "layer2": true,
                 "vlans": [{"vxlan": 1011}, {"vxlan": 1012}, {"vxlan": 1015}], "nativeVLAN": {"vxlan": 1015}}]}),
            ["hybrid-bonded", "layer2-bonded"],
            true,
        ),
        (
            json!({"metro": "da", "ports": [
                {"name": "bond0", "vlans": [{"vxlan": 1013}, {"vxlan": 1014}]},
                {"name": "bond1", "layer2": true,
                 "vlans": [{"vxlan": 1011}, {"vxlan": 1012}, {"vxlan": 1015}], "nativeVLAN": {"vxlan": 1011}}]}),
            ["hybrid-bonded", "layer2-bonded"],
            false,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bonds_of_a_four_port_device_take_their_own_modes_then_teardown() {
    let started = Instant::now();
    let w = World::new(4, &[1010, 1011, 1012, 1013, 1014, 1015]).await;
    let mut rows = Vec::new();
    let mut from = ["layer3", "layer3"];
    let profiles = four_port_profiles();
    for (i, (spec, modes)) in profiles.iter().enumerate() {
        let name = format!("p{i}");
        w.create_profile(&name, spec);
        w.opt_into(&name);
        let label = format!("{}/{} → {}/{}", from[0], from[1], modes[0], modes[1]);
        rows.push(
            w.transition(
                &label,
                spec,
                &[("bond0", modes[0]), ("bond1", modes[1])],
                true,
            )
            .await,
        );
        from = *modes;
    }
    // The opted-into profile edited in place.
    let last = format!("p{}", profiles.len() - 1);
    for (spec, modes, mode_changes) in four_port_edits() {
        w.edit_profile(&last, &spec);
        let label = format!(
            "{}/{} → {}/{} (edited{})",
            from[0],
            from[1],
            modes[0],
            modes[1],
            if mode_changes { "" } else { ", VLANs only" }
        );
        rows.push(
            w.transition(
                &label,
                &spec,
                &[("bond0", modes[0]), ("bond1", modes[1])],
                mode_changes,
            )
            .await,
        );
        from = modes;
    }
    // Released with the profile already gone: releasing does not need it.
    assert!(w
        .kube
        .delete(METAL_GROUP, "metalnetworkprofiles", Some(NS), &last)
        .is_some());
    let r = w.app.call("POST", PATH, None).await;
    assert_eq!(r.reason(), "ProfileNotFound", "{:#}", r.body);
    rows.push(
        w.teardown(
            &format!("DELETE from {}/{}", from[0], from[1]),
            &["bond0", "bond1"],
        )
        .await,
    );
    w.assert_clean();
    print_table(
        &format!(
            "4-port device: per-bond modes + teardown, {:.1} s",
            started.elapsed().as_secs_f64()
        ),
        &rows,
    );
}

// ---------------------------------------------------------------------------
// Two applies at once
// ---------------------------------------------------------------------------

/// Holds the first mutating request it forwards (once armed) until
/// opened, so that a second apply runs while the first holds the lease.
struct Gate {
    armed: AtomicBool,
    held: Notify,
    open: watch::Sender<bool>,
}

/// A proxy to the simulator at `target` that forwards everything, holding
/// the first mutating request while `gate` is armed.
async fn gated_proxy(target: SocketAddr, gate: Arc<Gate>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (client, gate) = (client.clone(), gate.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<Incoming>| {
                    forward(client.clone(), target, gate.clone(), req)
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

async fn forward(
    client: Client<HttpConnector, Full<Bytes>>,
    target: SocketAddr,
    gate: Arc<Gate>,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if parts.method != http::Method::GET && gate.armed.swap(false, Ordering::SeqCst) {
        gate.held.notify_one();
        let mut open = gate.open.subscribe();
        // Bounded, so that a broken test fails rather than hangs.
        let _ = tokio::time::timeout(Duration::from_secs(60), open.wait_for(|o| *o)).await;
    }
    let uri = format!(
        "http://{target}{}",
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut b = hyper::Request::builder().method(parts.method).uri(uri);
    for (k, v) in &parts.headers {
        if k != http::header::HOST {
            b = b.header(k, v);
        }
    }
    let answer = match client.request(b.body(Full::new(body)).unwrap()).await {
        Ok(resp) => {
            let (p, b) = resp.into_parts();
            let bytes = b.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            hyper::Response::from_parts(p, Full::new(bytes))
        }
        Err(e) => hyper::Response::builder()
            .status(502)
            .body(Full::new(Bytes::from(e.to_string())))
            .unwrap(),
    };
    Ok(answer)
}

/// POSTs until converged (while another caller does the same); the steps
/// issued and what each 202 was waiting for.
async fn post_until_converged(app: &App, label: &str) -> (Vec<Value>, Vec<String>) {
    let mut issued = Vec::new();
    let mut waits = Vec::new();
    for _ in 0..2 * MAX_CALLS {
        let r = app.call("POST", PATH, None).await;
        issued.extend(r.body["issued"].as_array().cloned().unwrap_or_default());
        if r.status == 200 {
            assert_eq!(r.body["phase"], "converged", "{label}: {:#}", r.body);
            return (issued, waits);
        }
        check_in_progress(label, &r);
        waits.push(r.body["waiting"].as_str().unwrap_or("").to_string());
    }
    panic!("{label}: not converged after {} POSTs", 2 * MAX_CALLS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_applies_at_once_one_holds_the_lease_both_converge() {
    let started = Instant::now();
    let (open, _) = watch::channel(false);
    let gate = Arc::new(Gate {
        armed: AtomicBool::new(false),
        held: Notify::new(),
        open,
    });
    let w = World::new(2, &[1010, 1011, 1012, 1013]).await;
    let proxy = gated_proxy(w.sim.addr(), gate.clone()).await;
    let app = one_build_at_a_time(|| {
        App::with_variables(&[
            ("k8s_api_url", &w.kube.base_url()),
            ("k8s_token", w.kube.token()),
            ("metal_api_url", &format!("http://{proxy}")),
            ("metal_token", w.sim.token()),
            ("metal_project_id", w.sim.project_id()),
        ])
    });
    let mut rows = Vec::new();

    // layer3 → layer2-individual: convert, disbond, two batches, a native
    // VLAN.
    w.create_profile("l2i", &two_port_profile("layer2-individual"));
    w.opt_into("l2i");
    let (planned, _) = w.dry_run("plan", &[("bond0", "layer2-individual")]).await;
    assert!(planned.len() >= 4, "{planned:#?}");
    w.sim.clear_requests();
    gate.armed.store(true, Ordering::SeqCst);
    let (a, b) = tokio::join!(app.call("POST", PATH, None), async {
        // B starts once A, holding the lease, is inside its first Metal
        // write; A goes on once B has answered.
        tokio::time::timeout(Duration::from_secs(60), gate.held.notified())
            .await
            .expect("A reached its first Metal write");
        let b = app.call("POST", PATH, None).await;
        gate.open.send_replace(true);
        b
    });
    check_in_progress("B", &b);
    assert!(
        b.body["waiting"]
            .as_str()
            .is_some_and(|s| s.contains("another instance")),
        "B waits for A's lease: {:#}",
        b.body
    );
    assert_eq!(b.body["issued"], json!([]), "B issued nothing");
    let wait: u64 = b.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        (1..=metal_ipam_core::network::apply::POLL_S).contains(&wait),
        "B is told to ask again within a poll interval (A releases the lease as its call ends), not after the whole lease: {wait}"
    );
    assert_eq!(a.status, 202, "A made its first step: {:#}", a.body);
    let mut issued: Vec<Value> = a.body["issued"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        issued.first(),
        planned.first(),
        "A issued the first step of the plan"
    );
    // Both go on POSTing, at once, until converged.
    let ((ia, wa), (ib, wb)) = tokio::join!(
        post_until_converged(&app, "A"),
        post_until_converged(&app, "B")
    );
    // A's and B's first POSTs, the 202s, the two 200s.
    let calls = 2 + wa.len() + wb.len() + 2;
    let lease_waits = wa
        .iter()
        .chain(&wb)
        .filter(|s| s.contains("another instance"))
        .count();
    let mut both: Vec<Value> = ia.into_iter().chain(ib).collect();
    issued.append(&mut both);
    // Every step once (the two callers interleave, so compare as sets with
    // multiplicity), and Metal received exactly the plan, in order.
    let key = |v: &Value| v.to_string();
    let mut got: Vec<String> = issued.iter().map(key).collect();
    let mut want: Vec<String> = planned.iter().map(key).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "each step issued once");
    let requests = w.sim.requests();
    w.assert_calls_are("concurrent", &planned, &requests);
    w.assert_device(
        "concurrent",
        &two_port_profile("layer2-individual"),
        &[("bond0", "layer2-individual")],
    );
    w.assert_converged("concurrent").await;
    let writes = World::writes(&requests).len();
    rows.push(Row {
        label: format!("layer3 → layer2-individual, 2 at once ({lease_waits} more lease waits)"),
        steps: planned.len(),
        calls,
        writes,
        reads: requests.len() - writes,
        dry_run_reads: 0,
        converged_reads: 0,
    });

    // And back to layer3 without a gate: two callers racing from the first
    // POST on; still each step once.
    w.create_profile("l3", &two_port_profile("layer3"));
    w.opt_into("l3");
    let (planned, _) = w.dry_run("back", &[("bond0", "layer3")]).await;
    w.sim.clear_requests();
    let ((ia, wa), (ib, wb)) = tokio::join!(
        post_until_converged(&app, "A back"),
        post_until_converged(&app, "B back")
    );
    let mut got: Vec<String> = ia.iter().chain(&ib).map(key).collect();
    let mut want: Vec<String> = planned.iter().map(key).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "back: each step issued once");
    let requests = w.sim.requests();
    w.assert_calls_are("back", &planned, &requests);
    w.assert_device("back", &json!({}), &[("bond0", "layer3")]);
    w.assert_converged("back").await;
    let writes = World::writes(&requests).len();
    let lease_waits = wa
        .iter()
        .chain(&wb)
        .filter(|s| s.contains("another instance"))
        .count();
    rows.push(Row {
        label: format!("layer2-individual → layer3, 2 racing ({lease_waits} lease waits)"),
        steps: planned.len(),
        calls: wa.len() + wb.len() + 2,
        writes,
        reads: requests.len() - writes,
        dry_run_reads: 0,
        converged_reads: 0,
    });
    w.assert_clean();
    print_table(
        &format!(
            "2-port device, two applies at once, {:.1} s",
            started.elapsed().as_secs_f64()
        ),
        &rows,
    );
}
