//! A VRF-backed pool's world for native end-to-end tests: the fake
//! Kubernetes API, the Metal simulator and one in-memory store with a
//! backend's real semantics, and the steps run as instances would (each
//! run its own clock and tokens, off the runtime's workers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metal_ipam_core::capi::vrf::sync_vrf_pool;
use metal_ipam_core::capi::{self, StepResult};
use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::kube::{Kube, KubeConfig};
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::metal::client::{Metal, MetalConfig};
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::{json, Value};

use crate::fake_kube::{FakeKube, METAL_GROUP};
use crate::metal_sim::{BlockingHttp, MetalSim, SimConfig};

/// The namespace of the pool and its claims.
pub const NS: &str = "team-a";
/// The pool's name.
pub const POOL: &str = "vrf";

/// Seeds of the instances' random streams (each run its own).
static NEXT_SEED: AtomicU64 = AtomicU64::new(1);

/// What one run of a step has: the store, its clock, Kubernetes, Metal.
pub struct Run<'a> {
    /// The store and the instance's environment.
    pub ctx: &'a Ctx<'a, MemKv>,
    /// The Kubernetes client.
    pub kube: &'a Kube<'a, BlockingHttp>,
    /// The Metal client.
    pub metal: &'a Metal<'a, BlockingHttp, TestEnv>,
}

impl<'a> Run<'a> {
    /// The machine network's context on this run, with `batches` as its
    /// VLAN steps.
    pub fn deps<'r>(
        &'r self,
        batches: &'r dyn metal_ipam_core::network::batch::VlanBatches,
    ) -> metal_ipam_core::capi::network::Deps<'r, 'a, MemKv, BlockingHttp> {
        metal_ipam_core::capi::network::Deps {
            ctx: self.ctx,
            kube: self.kube,
            metal: Some(self.metal),
            pnap: None,
            batches,
        }
    }
}

/// The fake API server, the simulator and the shared store.
pub struct World {
    /// The fake Kubernetes API.
    pub kube: FakeKube,
    /// The Metal simulator.
    pub sim: MetalSim,
    /// The store every instance shares.
    pub kv: Arc<MemKv>,
}

impl World {
    /// A world whose new gateways turn active after two reads.
    pub async fn new(backend: Backend) -> World {
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

    /// The clients' configurations (a short Metal retry budget).
    pub fn configs(&self) -> (KubeConfig, MetalConfig) {
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

    /// Runs `f` as one instance at `now` (its own clock and tokens, the
    /// shared store), off the runtime's workers.
    pub fn spawn<T: Send + 'static>(
        &self,
        now: u64,
        f: impl FnOnce(&Run<'_>) -> T + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        let (kcfg, mcfg) = self.configs();
        let kv = self.kv.clone();
        tokio::task::spawn_blocking(move || {
            let http = BlockingHttp::new();
            let env = TestEnv::seeded(now, NEXT_SEED.fetch_add(1, Ordering::SeqCst));
            let ctx = Ctx::auto(kv.as_ref(), &env);
            let kube = Kube::new(&http, &kcfg);
            let metal = Metal::new(&http, &mcfg, &env);
            f(&Run {
                ctx: &ctx,
                kube: &kube,
                metal: &metal,
            })
        })
    }

    /// One run of the pool's provision step.
    pub fn spawn_sync(
        &self,
        now: u64,
    ) -> tokio::task::JoinHandle<metal_ipam_core::error::Result<capi::Reconciled>> {
        self.spawn(now, |r| {
            sync_vrf_pool(r.ctx, r.kube, r.metal, &PoolId::namespaced(NS, POOL))
        })
    }

    /// One run of the pool's provision step, which must succeed.
    pub async fn sync(&self, now: u64) -> capi::Reconciled {
        self.spawn_sync(now).await.unwrap().unwrap()
    }

    /// Runs the step until it is no longer waiting (at most `n` times).
    pub async fn sync_until_settled(&self, n: usize) -> (capi::Reconciled, usize) {
        for i in 1..=n {
            let o = self.sync(10_000 + i as u64).await;
            if o.result != StepResult::Waiting {
                return (o, i);
            }
        }
        panic!("still waiting after {n} runs");
    }

    /// The pool object.
    pub fn pool(&self) -> Option<Value> {
        self.kube.get(METAL_GROUP, "metalippools", Some(NS), POOL)
    }

    /// No request broke the Metal spec or a CRD, and no answer the spec.
    pub fn assert_clean(&self) {
        assert_eq!(self.sim.violations(), Vec::<String>::new(), "Metal spec");
        assert_eq!(self.sim.answer_violations(), Vec::<String>::new());
        assert_eq!(self.kube.schema_violations(), Vec::<String>::new(), "CRDs");
    }

    /// The stored record under `key` validates against `schema` (a file in
    /// `kv-schema/`).
    pub fn assert_record_valid(&self, key: &str, schema: &str) {
        use metal_ipam_core::ports::kv::KvStore;
        let bytes = self.kv.get(key).unwrap().expect("a record");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        let path = crate::schema::repo_root().join("kv-schema").join(schema);
        let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        crate::schema::validate(&schema, &v).unwrap_or_else(|e| panic!("{e:?}\n{v:#}"));
    }

    /// Exactly one VRF, reservation, VLAN and gateway exist.
    pub fn assert_one_of_each(&self) {
        assert_eq!(self.sim.vrfs().len(), 1, "VRFs");
        assert_eq!(self.sim.reservations().len(), 1, "reservations");
        assert_eq!(self.sim.vlans().len(), 1, "VLANs");
        assert_eq!(self.sim.gateways().len(), 1, "gateways");
    }
}

/// The application on the test host, talking to `kube` and to `sim` as
/// Metal.
pub fn metal_app(kube: &FakeKube, sim: &MetalSim) -> crate::harness::App {
    let vars = metal_vars(kube, sim);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    crate::harness::App::with_variables(&vars)
}

/// [`metal_app`] on `runtime` (real Spin when given; `None` when not).
pub async fn metal_app_on(
    runtime: crate::harness::Runtime,
    kube: &FakeKube,
    sim: &MetalSim,
) -> Option<crate::harness::App> {
    crate::harness::App::on(runtime, &metal_vars(kube, sim), &[]).await
}

/// The variables that point the app at `kube` and at `sim`.
fn metal_vars(kube: &FakeKube, sim: &MetalSim) -> [(&'static str, String); 5] {
    [
        ("k8s_api_url", kube.base_url()),
        ("k8s_token", kube.token().to_string()),
        ("metal_api_url", format!("http://{}", sim.addr())),
        ("metal_token", sim.token().to_string()),
        ("metal_project_id", sim.project_id().to_string()),
    ]
}

/// The VRF-backed pool: a /29 of 10.10.0.0/16 in metro `da`.
pub fn pool_object() -> Value {
    json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {"metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"], "localASN": 65000},
            "reservation": {"network": "10.10.1.0", "cidr": 29}}}
    })
}

/// A claim on the pool.
pub fn claim(name: &str) -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": POOL}}
    })
}

/// Device `n`'s id in the simulator.
pub fn device(n: usize) -> String {
    format!("6f1d2c3b-4a59-4e68-8f70-{n:012x}")
}

/// Claim `m-<n>` on device `n` (a `PacketMachine` names it), bound and
/// assigned by the claim step and the assignment step at `now`.
///
/// # Panics
/// When either step fails or the claim is not bound.
pub async fn assigned(w: &World, n: usize, now: u64) {
    w.sim.add_device(&device(n), "da", 2);
    let pm = w.kube.create(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "PacketMachine",
        "metadata": {"name": format!("pm-{n}"), "namespace": NS},
        "spec": {"providerID": format!("equinixmetal://{}", device(n))}
    }));
    let mut c = claim(&format!("m-{n}"));
    c["metadata"]["ownerReferences"] = json!([{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "PacketMachine", "name": pm["metadata"]["name"], "uid": pm["metadata"]["uid"],
        "controller": true}]);
    w.kube.create(c);
    let name = format!("m-{n}");
    let o = w
        .spawn(now, move |r| {
            capi::reconcile_claim(r.ctx, r.kube, NS, &name)?;
            capi::assign::sync_claim_assignment(r.ctx, r.kube, r.metal, NS, &name)
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(o.result, StepResult::Bound, "{o:?}");
}
