//! VRF-backed pools end to end, natively: the pool sync of the `provision`
//! step (`capi::vrf::sync_vrf_pool`) against the fake Kubernetes API and the
//! Metal simulator, sharing one in-memory store with each backend's real
//! semantics. Provisioning in order and exactly once (also with the same
//! event three times at once on two instances, and with a crash after a
//! creation), addresses from the block with the gateway's address, teardown
//! by policy; no request breaks the Metal spec or a CRD.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metal_ipam_core::capi::vrf::sync_vrf_pool;
use metal_ipam_core::capi::{self, StepResult};
use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::kube::{Kube, KubeConfig};
use metal_ipam_core::kv::{Ctx, SwapPolicy};
use metal_ipam_core::metal::client::{Metal, MetalConfig};
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use metal_ipam_tests::fake_kube::{FakeKube, IPAM_GROUP, METAL_GROUP};
use metal_ipam_tests::metal_sim::{BlockingHttp, Fault, MetalSim, SimConfig};
use serde_json::{json, Value};

const NS: &str = "team-a";

/// Seeds of the instances' random streams (each run its own).
static NEXT_SEED: AtomicU64 = AtomicU64::new(1);
const POOL: &str = "vrf";

struct World {
    kube: FakeKube,
    sim: MetalSim,
    kv: Arc<MemKv>,
}

impl World {
    async fn new(backend: Backend) -> World {
        let sim = MetalSim::start_with(SimConfig {
            gateway_reads: Some(2),
            ..SimConfig::default()
        })
        .await
        .unwrap();
        World {
            kube: FakeKube::start().await,
            sim,
            kv: Arc::new(MemKv::new(backend)),
        }
    }

    fn configs(&self) -> (KubeConfig, MetalConfig) {
        (
            KubeConfig {
                base_url: self.kube.base_url(),
                token: self.kube.token().to_string(),
            },
            self.sim.metal_config(RetryPolicy {
                budget_ms: 2_000,
                base_ms: 10,
                cap_ms: 100,
            }),
        )
    }

    /// One run of the step, as one instance would (its own clock and
    /// tokens, the shared store), off the runtime's workers.
    fn spawn_sync(
        &self,
        now: u64,
    ) -> tokio::task::JoinHandle<metal_ipam_core::error::Result<capi::Outcome>> {
        let (kcfg, mcfg) = self.configs();
        let kv = self.kv.clone();
        tokio::task::spawn_blocking(move || {
            let http = BlockingHttp::new();
            // Each run is an instance of its own: its own tokens.
            let env = TestEnv::seeded(now, NEXT_SEED.fetch_add(1, Ordering::SeqCst));
            let ctx = Ctx {
                kv: kv.as_ref(),
                env: &env,
                swap_policy: SwapPolicy::Auto,
            };
            let kube = Kube::new(&http, &kcfg);
            let metal = Metal::new(&http, &mcfg, &env);
            sync_vrf_pool(&ctx, &kube, &metal, &PoolId::namespaced(NS, POOL))
        })
    }

    async fn sync(&self, now: u64) -> capi::Outcome {
        self.spawn_sync(now).await.unwrap().unwrap()
    }

    /// Runs the step until it is no longer waiting (at most `n` times).
    async fn sync_until_settled(&self, n: usize) -> (capi::Outcome, usize) {
        for i in 1..=n {
            let o = self.sync(10_000 + i as u64).await;
            if o.result != StepResult::Waiting {
                return (o, i);
            }
        }
        panic!("still waiting after {n} runs");
    }

    fn pool(&self) -> Option<Value> {
        self.kube.get(METAL_GROUP, "metalippools", Some(NS), POOL)
    }

    fn assert_clean(&self) {
        assert_eq!(self.sim.violations(), Vec::<String>::new(), "Metal spec");
        assert_eq!(self.sim.answer_violations(), Vec::<String>::new());
        assert_eq!(self.kube.schema_violations(), Vec::<String>::new(), "CRDs");
    }

    /// The stored progress record validates against its JSON Schema.
    fn assert_progress_record_valid(&self) {
        use metal_ipam_core::ports::kv::KvStore;
        let key = metal_ipam_core::kv::keys::metal_pool(&PoolId::namespaced(NS, POOL));
        let bytes = self.kv.get(&key).unwrap().expect("a progress record");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        let path = metal_ipam_tests::schema::repo_root()
            .join("kv-schema/metal-progress-record.schema.json");
        let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        metal_ipam_tests::schema::validate(&schema, &v).unwrap_or_else(|e| panic!("{e:?}\n{v:#}"));
    }

    fn assert_one_of_each(&self) {
        assert_eq!(self.sim.vrfs().len(), 1, "VRFs");
        assert_eq!(self.sim.reservations().len(), 1, "reservations");
        assert_eq!(self.sim.vlans().len(), 1, "VLANs");
        assert_eq!(self.sim.gateways().len(), 1, "gateways");
    }
}

fn pool_object() -> Value {
    json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {"metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"], "localASN": 65000},
            "reservation": {"network": "10.10.1.0", "cidr": 29}}}
    })
}

fn claim(name: &str) -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": POOL}}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vrf_pool_is_provisioned_in_order_hands_out_its_block_and_is_torn_down() {
    let w = World::new(Backend::SpinSqlite).await;
    w.kube.create(pool_object());

    let (o, runs) = w.sync_until_settled(6).await;
    assert_eq!(o.result, StepResult::Synced, "{o:?}");
    assert!(runs >= 2, "the gateway is ready before it is active");
    // Metal calls to provision from nothing: the four creations, the
    // gateway's reads until it is active (2 `ready` reads, then `active`),
    // and one read of the block.
    let count = |m: &str| w.sim.requests().iter().filter(|r| r.method == m).count();
    assert_eq!(
        (count("POST"), count("GET"), count("DELETE")),
        (4, 2 + 1 + 1, 0)
    );
    w.assert_one_of_each();
    w.assert_progress_record_valid();
    // Created in dependency order, each with the pool's tag.
    let creates: Vec<String> = w
        .sim
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .filter_map(|r| r.operation.clone())
        .collect();
    assert_eq!(
        creates,
        [
            "createVrf",
            "requestIPReservation",
            "createVirtualNetwork",
            "createMetalGateway"
        ]
    );
    let uid = w.pool().unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(w.sim.vrfs()[0].tags.iter().any(|t| t.ends_with(&uid)));

    // Status: Ready, the resources and the counts of a /29 (.0, .7 and the
    // gateway .1 are not handed out).
    let pool = w.pool().unwrap();
    let ready = pool["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["status"], "True", "{pool:#}");
    assert_eq!(pool["status"]["metal"]["gateway"]["state"], "active");
    assert_eq!(
        pool["status"]["metal"]["reservation"]["block"],
        "10.10.1.0/29"
    );
    assert_eq!(pool["status"]["ipAddresses"]["total"], 5);

    // A claim gets an address of the block, with the Metal Gateway's
    // address as its gateway.
    w.kube.create(claim("m-0"));
    let (kcfg, _) = w.configs();
    let kv = w.kv.clone();
    let out = tokio::task::spawn_blocking(move || {
        let http = BlockingHttp::new();
        let env = TestEnv::at(20_000);
        let ctx = Ctx {
            kv: kv.as_ref(),
            env: &env,
            swap_policy: SwapPolicy::Auto,
        };
        capi::reconcile_claim(&ctx, &Kube::new(&http, &kcfg), NS, "m-0")
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(out.result, StepResult::Bound, "{out:?}");
    let ip = w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "m-0")
        .unwrap();
    assert_eq!(ip["spec"]["address"], "10.10.1.2");
    assert_eq!(ip["spec"]["gateway"], "10.10.1.1");
    assert_eq!(ip["spec"]["prefix"], 29);

    // The next run writes the new counts (1 used); the one after that is
    // converged and writes nothing anywhere.
    assert_eq!(w.sync(29_999).await.result, StepResult::Synced);
    assert_eq!(w.pool().unwrap()["status"]["ipAddresses"]["used"], 1);
    w.sim.clear_requests();
    let before = w.kube.resource_version();
    assert_eq!(w.sync(30_000).await.result, StepResult::Synced);
    assert!(
        w.sim.requests().iter().all(|r| r.method == "GET"),
        "no Metal write"
    );
    assert_eq!(
        w.sim.requests().len(),
        1,
        "a converged run reads the block, nothing else"
    );
    assert_eq!(w.kube.resource_version(), before, "no Kubernetes write");

    // Deleting the pool waits while an address is allocated …
    w.kube.delete(METAL_GROUP, "metalippools", Some(NS), POOL);
    assert_eq!(w.sync(30_001).await.result, StepResult::Waiting);
    assert_eq!(w.sim.vrfs().len(), 1, "nothing torn down while in use");
    // … then tears everything down in order and lets the object go.
    let kv = w.kv.clone();
    let (kcfg, _) = w.configs();
    tokio::task::spawn_blocking(move || {
        let http = BlockingHttp::new();
        let env = TestEnv::at(30_002);
        let ctx = Ctx {
            kv: kv.as_ref(),
            env: &env,
            swap_policy: SwapPolicy::Auto,
        };
        let kube = Kube::new(&http, &kcfg);
        kube.delete(&metal_ipam_core::kube::CLAIMS, Some(NS), "m-0")
            .unwrap();
        capi::reconcile_claim(&ctx, &kube, NS, "m-0").unwrap()
    })
    .await
    .unwrap();
    w.kube.collect_garbage();
    let (o, _) = w.sync_until_settled(8).await;
    assert_eq!(o.result, StepResult::Deleted, "{o:?}");
    assert!(w.pool().is_none(), "the finalizer was removed");
    w.assert_progress_record_valid(); // the tombstone
    assert!(w.sim.vrfs().is_empty() && w.sim.reservations().is_empty());
    assert!(w.sim.vlans().is_empty() && w.sim.gateways().is_empty());
    let deletes: Vec<String> = w
        .sim
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE")
        .filter_map(|r| r.operation.clone())
        .collect();
    assert_eq!(
        deletes,
        [
            "deleteMetalGateway",
            "deleteIPAddress",
            "deleteVirtualNetwork",
            "deleteVrf"
        ]
    );
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_event_three_times_at_once_on_two_instances_creates_each_resource_once() {
    for backend in [Backend::SpinSqlite, Backend::RedisSpin36] {
        let w = World::new(backend).await;
        w.kube.create(pool_object());
        // Three concurrent runs, then runs until settled: later runs find
        // what the first ones created, or wait for their intents.
        let runs: Vec<_> = (0..3).map(|i| w.spawn_sync(10_000 + i)).collect();
        let mut outs = Vec::new();
        for r in runs {
            outs.push(r.await.unwrap().unwrap());
        }
        assert!(
            outs.iter()
                .all(|o| matches!(o.result, StepResult::Waiting | StepResult::Synced)),
            "{outs:?}"
        );
        // Past any intent's lease.
        let mut now = 10_200;
        let mut done = false;
        for _ in 0..10 {
            let o = w.sync(now).await;
            now += 130;
            if o.result == StepResult::Synced {
                done = true;
                break;
            }
        }
        assert!(done, "{backend:?}: not ready");
        let trace: Vec<String> = w
            .sim
            .requests()
            .iter()
            .map(|r| format!("{} {:?} {:?}", r.line(), r.query, r.status))
            .collect();
        w.assert_one_of_each();
        assert_eq!(w.sim.applied("createVrf"), 1, "{backend:?}: {trace:#?}");
        assert_eq!(w.sim.applied("createMetalGateway"), 1, "{backend:?}");
        w.assert_clean();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_creation_whose_answer_is_lost_is_found_not_repeated() {
    let w = World::new(Backend::RedisSpin36).await;
    w.kube.create(pool_object());
    // The VLAN is created but the connection drops before the answer.
    w.sim
        .inject("POST", "createVirtualNetwork", Fault::CrashAfter, 1);
    let (o, _) = w.sync_until_settled(8).await;
    assert_eq!(o.result, StepResult::Synced, "{o:?}");
    w.assert_one_of_each();
    assert_eq!(
        w.sim.count("createVirtualNetwork"),
        1,
        "one POST, found by its tag"
    );
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fault_on_any_metal_write_converges_without_a_duplicate() {
    let writes = [
        "createVrf",
        "requestIPReservation",
        "createVirtualNetwork",
        "createMetalGateway",
    ];
    let faults = [
        Fault::CrashAfter,
        Fault::Status(503),
        Fault::Drop,
        Fault::RateLimit { retry_after_s: 1 },
    ];
    let mut validated = 0;
    for op in writes {
        for fault in &faults {
            let w = World::new(Backend::RedisSpin36).await;
            w.kube.create(pool_object());
            w.sim.inject("POST", op, fault.clone(), 1);
            // Runs a forwarder would make (each after the Retry-After the
            // last asked for, at least past an intent's lease).
            let mut now = 10_000;
            let mut synced = false;
            for _ in 0..12 {
                // A 503 (Metal unavailable, or a creation's outcome unknown)
                // is an answer the forwarder retries.
                match w.spawn_sync(now).await.unwrap() {
                    Ok(o) if o.result == StepResult::Synced => {
                        synced = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => assert_eq!(e.status(), 503, "{op} with {fault:?}: {e}"),
                }
                now += 130;
            }
            assert!(synced, "{op} with {fault:?}: not ready");
            w.assert_one_of_each();
            assert_eq!(
                w.sim.pending_faults(),
                0,
                "{op} with {fault:?}: the fault was hit"
            );
            w.assert_clean();
            validated += w.sim.requests().len();
        }
    }
    // How many requests the simulator checked against the spec, all valid.
    println!("{validated} Metal requests validated against the spec, 0 violations");
}
