//! Applying network profiles to devices end to end, natively, against the
//! Metal simulator's port state machine: every mode of a 2-port device and
//! back, per-bond modes on a 4-port device, the plan `dryRun` shows is the
//! steps apply issues, a converged device makes no mutating call, two
//! concurrent applies (one holds the device, the other waits) converge,
//! a crash after any Metal call converges, a failed batch is reported and
//! then retried, a frozen device refuses mode changes, a VLAN step that
//! never reached Metal leaves nothing running. 0 spec violations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metal_ipam_core::kv::Ctx;
use metal_ipam_core::metal::client::Metal;
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::network::apply::{self, ApplyPhase, ApplyReport, Step, POLL_S};
use metal_ipam_core::network::batch::Direct;
use metal_ipam_core::network::plan::{Desired, PortStep};
use metal_ipam_core::network::profile::{Mode, Profile, VlanRef};
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use metal_ipam_tests::metal_sim::{BlockingHttp, Fault, MetalSim, SimConfig};
use serde_json::{json, Value};

const DEV: &str = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a";
static SEED: AtomicU64 = AtomicU64::new(1);

struct World {
    sim: MetalSim,
    kv: Arc<MemKv>,
    /// vxlan → VLAN UUID.
    vlans: Vec<(u16, String)>,
    now: AtomicU64,
}

impl World {
    async fn new(eth_ports: usize) -> World {
        let sim = MetalSim::start_with(SimConfig::default()).await.unwrap();
        sim.add_device(DEV, "da", eth_ports);
        let vlans = sim
            .create_vlans("da", &[1010, 1011, 1012, 1013])
            .await
            .into_iter()
            .collect();
        sim.clear_requests();
        World {
            sim,
            kv: Arc::new(MemKv::new(Backend::RedisSpin36)),
            vlans,
            now: AtomicU64::new(10_000),
        }
    }

    fn desired(&self, spec: Value, eth: usize) -> Desired {
        let p = Profile::from_json(&spec).unwrap();
        p.validate().unwrap();
        let vlans = self.vlans.clone();
        let resolve = move |r: &VlanRef| {
            vlans
                .iter()
                .find(|(n, _)| Some(*n) == r.vxlan)
                .map(|(_, id)| id.clone())
        };
        Desired::from_profile(&p, eth, &resolve).unwrap()
    }

    /// One invocation at the world's clock (advanced by `POLL_S` after).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Ctx<'_, MemKv>, &Metal<'_, BlockingHttp, TestEnv>) -> T + Send + 'static,
    ) -> T {
        let now = self.now.fetch_add(POLL_S, Ordering::SeqCst);
        let cfg = self.sim.metal_config(RetryPolicy {
            budget_ms: 2_000,
            base_ms: 10,
            cap_ms: 100,
        });
        let kv = self.kv.clone();
        tokio::task::spawn_blocking(move || {
            let http = BlockingHttp::new();
            let env = TestEnv::seeded(now, SEED.fetch_add(1, Ordering::SeqCst));
            let ctx = Ctx::auto(kv.as_ref(), &env);
            let metal = Metal::new(&http, &cfg, &env);
            f(&ctx, &metal)
        })
        .await
        .unwrap()
    }

    async fn dry_run(&self, d: &Desired) -> Vec<PortStep> {
        let d = d.clone();
        self.run(move |_, m| apply::observe_and_plan(m, DEV, &d).unwrap())
            .await
    }

    async fn apply_once(&self, d: &Desired) -> metal_ipam_core::Result<ApplyReport> {
        let d = d.clone();
        self.run(move |ctx, m| apply::apply(ctx, m, &Direct(m), DEV, &d))
            .await
    }

    /// Applies until converged; returns the steps issued, in order.
    async fn converge(&self, d: &Desired) -> Vec<PortStep> {
        let mut issued = Vec::new();
        for _ in 0..40 {
            let r = self.apply_once(d).await.unwrap();
            issued.extend(r.issued.into_iter().filter_map(Step::port));
            if r.phase == ApplyPhase::Converged {
                return issued;
            }
        }
        panic!("not converged after 40 invocations");
    }

    fn mode(&self, bond: &str) -> String {
        let d = self.sim.device(DEV).unwrap();
        let b = d.port(bond).unwrap();
        let members: Vec<_> = d
            .ports
            .iter()
            .filter(|p| p.bond.as_deref() == Some(bond))
            .collect();
        let m = if b.layer2 {
            if b.bonded {
                Mode::Layer2Bonded
            } else {
                Mode::Layer2Individual
            }
        } else if members.iter().any(|p| !p.bonded) {
            Mode::Hybrid
        } else if !b.vlans.is_empty() {
            Mode::HybridBonded
        } else {
            Mode::Layer3
        };
        m.as_str().to_string()
    }

    fn writes(&self) -> usize {
        self.sim
            .requests()
            .iter()
            .filter(|r| r.method != "GET")
            .count()
    }

    fn assert_clean(&self) {
        assert_eq!(self.sim.violations(), Vec::<String>::new());
        assert_eq!(self.sim.answer_violations(), Vec::<String>::new());
    }
}

fn profiles() -> Vec<(&'static str, Value)> {
    vec![
        (
            "hybrid-bonded",
            json!({"metro": "da", "ports": [{"name": "bond0", "vlans": [{"vxlan": 1010}, {"vxlan": 1011}]}]}),
        ),
        (
            "hybrid",
            json!({"metro": "da", "ports": [{"name": "eth1", "bonded": false, "vlans": [{"vxlan": 1012}]}]}),
        ),
        (
            "layer2-bonded",
            json!({"metro": "da", "ports": [{"name": "bond0", "layer2": true,
                "vlans": [{"vxlan": 1010}, {"vxlan": 1011}, {"vxlan": 1012}], "nativeVLAN": {"vxlan": 1011}}]}),
        ),
        (
            "layer2-individual",
            json!({"metro": "da", "ports": [{"name": "bond0", "layer2": true, "bonded": false},
                {"name": "eth0", "vlans": [{"vxlan": 1010}]},
                {"name": "eth1", "vlans": [{"vxlan": 1011}, {"vxlan": 1013}], "nativeVLAN": {"vxlan": 1013}}]}),
        ),
        ("layer3", json!({})),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_mode_of_a_two_port_device_and_back() {
    let w = World::new(2).await;
    let mut figures = Vec::new();
    // layer3 → each mode → layer3, and the tour through all of them.
    let mut tour: Vec<(&str, Value)> = Vec::new();
    for (name, spec) in profiles() {
        tour.push((name, spec));
        tour.push(("layer3", json!({})));
    }
    tour.extend(profiles());
    let mut from = "layer3".to_string();
    for (name, spec) in tour {
        let d = w.desired(spec, 2);
        let planned = w.dry_run(&d).await;
        w.sim.clear_requests();
        let issued = w.converge(&d).await;
        assert_eq!(
            issued, planned,
            "{from} → {name}: apply did not do the dry-run plan"
        );
        assert_eq!(w.mode("bond0"), name, "{from} → {name}");
        let calls = w.sim.requests().len();
        let writes = w.writes();
        // Converged: one read, no mutating call.
        w.sim.clear_requests();
        let r = w.apply_once(&d).await.unwrap();
        assert_eq!((r.phase, r.issued.len()), (ApplyPhase::Converged, 0));
        assert_eq!(w.writes(), 0, "{name}: a converged re-run wrote");
        assert_eq!(
            w.sim.requests().len(),
            1,
            "{name}: a converged re-run reads once"
        );
        figures.push(format!(
            "{from} → {name}: {} steps, {writes} writes, {calls} calls",
            planned.len()
        ));
        from = name.to_string();
    }
    w.assert_clean();
    // The stored progress record validates against its JSON Schema.
    {
        use metal_ipam_core::ports::kv::KvStore;
        let bytes = w.kv.get(&format!("net/device/{DEV}")).unwrap().unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        let path =
            metal_ipam_tests::schema::repo_root().join("kv-schema/net-device-record.schema.json");
        let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        metal_ipam_tests::schema::validate(&schema, &v).unwrap_or_else(|e| panic!("{e:?}\n{v:#}"));
        assert!(!v["state"]["history"].as_array().unwrap().is_empty());
    }
    for f in figures {
        println!("{f}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bonds_of_a_four_port_device_take_their_own_modes() {
    let w = World::new(4).await;
    let d = w.desired(
        json!({"metro": "da", "ports": [
            {"name": "bond0", "layer2": true, "vlans": [{"vxlan": 1010}]},
            {"name": "eth3", "bonded": false, "vlans": [{"vxlan": 1011}, {"vxlan": 1012}]}]}),
        4,
    );
    let planned = w.dry_run(&d).await;
    assert_eq!(w.converge(&d).await, planned);
    assert_eq!(w.mode("bond0"), "layer2-bonded");
    assert_eq!(w.mode("bond1"), "hybrid");
    // And back.
    let back = w.desired(json!({}), 4);
    w.converge(&back).await;
    assert_eq!(
        (w.mode("bond0").as_str(), w.mode("bond1").as_str()),
        ("layer3", "layer3")
    );
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn k_vlans_on_a_port_are_one_batch() {
    let w = World::new(2).await;
    let d = w.desired(
        json!({"metro": "da", "ports": [{"name": "bond0",
            "vlans": [{"vxlan": 1010}, {"vxlan": 1011}, {"vxlan": 1012}, {"vxlan": 1013}]}]}),
        2,
    );
    w.converge(&d).await;
    assert_eq!(w.sim.count("createPortVlanAssignmentBatch"), 1);
    assert_eq!(w.writes(), 1, "4 VLANs: one batch, then polls");
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_applies_at_once_one_holds_the_device_both_converge() {
    let w = Arc::new(World::new(2).await);
    let d = w.desired(profiles()[3].1.clone(), 2);
    let planned = w.dry_run(&d).await;
    let (a, b) = tokio::join!(w.apply_once(&d), w.apply_once(&d));
    let (a, b) = (a.unwrap(), b.unwrap());
    let waited = [&a, &b]
        .iter()
        .filter(|r| matches!(&r.phase, ApplyPhase::InProgress { waiting, .. } if waiting.contains("another instance")))
        .count();
    assert!(waited <= 1, "{a:?} {b:?}");
    let mut issued: Vec<PortStep> = a
        .issued
        .into_iter()
        .chain(b.issued)
        .filter_map(Step::port)
        .collect();
    issued.extend(w.converge(&d).await);
    assert_eq!(issued, planned, "each step issued once");
    assert_eq!(w.mode("bond0"), "layer2-individual");
    w.assert_clean();
}

/// From the `start`th profile (`None`: layer3 as created) to the
/// `target`th, with `fault` on the first `method op`: applies (past a
/// crashed holder's lease each time) until converged; checks the mode, that
/// the fault was hit and the spec held; returns the requests validated.
async fn converges_despite(
    start: Option<usize>,
    target: Value,
    mode: &str,
    (method, op): (&str, &str),
    fault: Fault,
) -> usize {
    let w = World::new(2).await;
    if let Some(i) = start {
        w.converge(&w.desired(profiles()[i].1.clone(), 2)).await;
    }
    let d = w.desired(target, 2);
    w.sim.inject(method, op, fault.clone(), 1);
    let mut converged = false;
    for _ in 0..40 {
        match w.apply_once(&d).await {
            Ok(r) if r.phase == ApplyPhase::Converged => {
                converged = true;
                break;
            }
            Ok(_) => {}
            Err(e) => assert_eq!(e.status(), 503, "{op} {fault:?}: {e}"),
        }
        w.now.fetch_add(apply::LEASE_S, Ordering::SeqCst);
    }
    assert!(converged, "{op} with {fault:?}");
    assert_eq!(w.mode("bond0"), mode, "{op} {fault:?}");
    assert_eq!(
        w.sim.pending_faults(),
        0,
        "{op} {fault:?}: the fault was hit"
    );
    w.assert_clean();
    w.sim.requests().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_after_any_metal_call_converges() {
    // On the way to layer2-individual, and back to layer3 (removing a
    // native VLAN, converting to layer3, bonding).
    let cases = [
        (None, 3, "POST", "createPortVlanAssignmentBatch"),
        (None, 3, "POST", "convertLayer2"),
        (None, 3, "POST", "disbondPort"),
        (None, 3, "POST", "assignNativeVlan"),
        (Some(2), 4, "DELETE", "deleteNativeVlan"),
        (Some(2), 4, "POST", "convertLayer3"),
        (Some(3), 4, "POST", "bondPort"),
    ];
    let mut validated = 0;
    for (start, target, method, op) in cases {
        let (mode, spec) = profiles()[target].clone();
        for fault in [Fault::CrashAfter, Fault::Status(503), Fault::Drop] {
            validated += converges_despite(start, spec.clone(), mode, (method, op), fault).await;
        }
    }
    println!("{validated} Metal requests validated against the spec, 0 violations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_batch_is_reported_then_retried_and_a_frozen_device_refuses_mode_changes() {
    let w = World::new(2).await;
    let d = w.desired(profiles()[0].1.clone(), 2);
    let bond = w.sim.device(DEV).unwrap().port("bond0").unwrap().id.clone();
    w.sim
        .fail_next_batch(&bond, "VLAN 1010 is not available on this switch");
    let mut failed = None;
    for _ in 0..10 {
        match w.apply_once(&d).await {
            Err(e) => {
                failed = Some(e);
                break;
            }
            Ok(r) => assert_ne!(r.phase, ApplyPhase::Converged),
        }
    }
    let e = failed.expect("the batch failure is reported");
    assert_eq!((e.status(), e.reason()), (409, "VlanBatchFailed"));
    assert!(e.message().contains("not available on this switch"), "{e}");
    w.converge(&d).await;
    assert_eq!(w.mode("bond0"), "hybrid-bonded");

    // A batch Metal refuses (422) whose VLANs a re-read does not show: reported
    // at once with Metal's message, nothing left running; the next apply
    // plans it again.
    let back = w.desired(json!({}), 2);
    w.sim.inject(
        "POST",
        "createPortVlanAssignmentBatch",
        Fault::Status(422),
        1,
    );
    let e = w.apply_once(&back).await.unwrap_err();
    assert_eq!((e.status(), e.reason()), (409, "VlanBatchRefused"), "{e}");
    assert!(e.message().contains("bond0"), "{e}");
    w.converge(&back).await;
    assert_eq!(w.mode("bond0"), "layer3");

    w.sim.set_network_frozen(DEV, true);
    let l2 = w.desired(profiles()[2].1.clone(), 2);
    let e = w.apply_once(&l2).await.unwrap_err();
    assert_eq!((e.status(), e.reason()), (409, "NetworkFrozen"));
    w.assert_clean();
}

/// A VLAN step that answers its own error (it never reached Metal: not
/// configured, a token it refuses, a request it cannot read) is a definite
/// failure naming it: nothing is left running, the record keeps the
/// message, and the next apply plans the batch again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vlan_step_that_did_not_reach_metal_leaves_nothing_running() {
    use metal_ipam_core::network::batch::{BatchError, BatchOp, Direction, VlanBatches};
    use metal_ipam_core::Error;

    /// Refuses every create, as a step without Metal configured does.
    struct Unconfigured;
    impl VlanBatches for Unconfigured {
        fn run(
            &self,
            _: Direction,
            _: &str,
            op: &BatchOp,
        ) -> Result<Option<metal_ipam_core::metal::model::VlanBatch>, BatchError> {
            assert!(matches!(op, BatchOp::Create { .. }), "{op:?}");
            Err(BatchError::Step(Error::new(
                metal_ipam_core::ErrorKind::Internal,
                "VlanStepFailed",
                "attach-vlan answered 500 MetalNotConfigured: Equinix Metal is not configured",
            )))
        }
    }
    let w = World::new(2).await;
    let d = w.desired(profiles()[0].1.clone(), 2);
    let e = w
        .run(move |ctx, m| apply::apply(ctx, m, &Unconfigured, DEV, &d))
        .await
        .unwrap_err();
    assert_eq!((e.status(), e.reason()), (500, "VlanStepFailed"), "{e}");
    let rec = w.run(|ctx, _| apply::read(ctx.kv, DEV).unwrap()).await;
    assert_eq!(rec.running, None, "nothing left running");
    assert!(rec.failed.unwrap().contains("MetalNotConfigured"));
    assert!(rec.lease.is_none());
    // With the step working again, the next apply makes the batch.
    let d = w.desired(profiles()[0].1.clone(), 2);
    w.converge(&d).await;
    assert_eq!(w.mode("bond0"), "hybrid-bonded");
    w.assert_clean();
}
