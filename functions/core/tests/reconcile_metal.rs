//! The Metal-side handlers on the reconcile kit, checked on scripted API
//! answers: each test names one lifecycle path and the exact requests it
//! makes, in order (a request out of order fails the test).

use metal_ipam_core::capi::{assign, machine, vrf, StepResult};
use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::kube::{Kube, KubeConfig};
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::metal::client::{Metal, MetalConfig};
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::network::batch::Direct;
use metal_ipam_core::testing::{Backend, MemKv, Reply, ScriptedHttp, TestEnv};
use serde_json::{json, Value};

const POOLS: &str = "/apis/ipam.metal-ipam.dev/v1alpha1/namespaces/ns/metalippools";
const POOL_FINALIZER: &str = "ipam.metal-ipam.dev/protect-pool";

fn kube_cfg() -> KubeConfig {
    KubeConfig {
        base_url: "https://kube.test".into(),
        token: "t".into(),
    }
}

fn metal_cfg() -> MetalConfig {
    MetalConfig {
        base_url: "https://metal.test".into(),
        token: "t".into(),
        project_id: "project".into(),
        retry: RetryPolicy::default(),
    }
}

/// A VRF-backed pool object with `metro` and `extra_meta`.
fn vrf_pool(metro: &str, extra_meta: Value) -> Value {
    let mut meta = json!({"name": "p", "namespace": "ns", "uid": "p-1", "resourceVersion": "3"});
    for (k, v) in extra_meta.as_object().unwrap() {
        meta[k] = v.clone();
    }
    json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool", "metadata": meta,
           "spec": {"metal": {"metro": metro, "vrf": {"ipRanges": ["10.10.0.0/16"], "localASN": 65000},
                              "reservation": {"network": "10.10.1.0", "cidr": 29}}}})
}

/// Runs the VRF-backed pool step for `ns/p` against `http`.
fn sync_vrf(http: &ScriptedHttp) -> metal_ipam_core::capi::Reconciled {
    let (kv, env, cfg) = (
        MemKv::new(Backend::SpinSqlite),
        TestEnv::at(1000),
        kube_cfg(),
    );
    let ctx = Ctx::auto(&kv, &env);
    let kube = Kube::new(http, &cfg);
    let mcfg = metal_cfg();
    let metal = Metal::new(http, &mcfg, &env);
    vrf::sync_vrf_pool(&ctx, &kube, &metal, &PoolId::namespaced("ns", "p")).unwrap()
}

/// Deletion first: a paused VRF-backed pool being deleted, nothing
/// recorded for it, is torn down at once and loses our finalizer (only
/// ours), last.
#[test]
fn a_paused_deleting_vrf_pool_with_nothing_recorded_loses_its_finalizer() {
    let deleting = vrf_pool(
        "da",
        json!({"deletionTimestamp": "2026-01-01T00:00:00Z",
               "finalizers": [POOL_FINALIZER, "other/keep"],
               "annotations": {"cluster.x-k8s.io/paused": ""}}),
    );
    let http = ScriptedHttp::new(vec![
        (&format!("GET {POOLS}/p"), Reply::json(200, deleting)),
        (
            &format!("PATCH {POOLS}/p?fieldValidation=Strict"),
            Reply::status(404),
        ),
    ]);
    let out = sync_vrf(&http);
    assert_eq!((out.result, out.kube_calls), (StepResult::Deleted, 2));
    http.assert_done();
    let patch = http.sent()[1].json();
    assert_eq!(patch["metadata"]["finalizers"], json!(["other/keep"]));
}

/// A live pool whose `spec.metal` breaks the rules: `Ready=False
/// InvalidSpec` and nothing else — no finalizer, no Metal call.
#[test]
fn an_invalid_spec_metal_gets_its_condition_and_no_finalizer() {
    let bad = vrf_pool("dal", json!({}));
    let http = ScriptedHttp::new(vec![
        (&format!("GET {POOLS}/p"), Reply::json(200, bad.clone())),
        (
            &format!("PATCH {POOLS}/p/status?fieldValidation=Strict"),
            Reply::json(200, bad),
        ),
    ]);
    let out = sync_vrf(&http);
    assert_eq!((out.result, out.kube_calls), (StepResult::Failed, 2));
    let status = &http.sent()[1].json()["status"];
    assert_eq!(status["conditions"][0]["reason"], "InvalidSpec");
    assert_eq!(status["conditions"][0]["status"], "False");
    http.assert_done();
}

const CLAIMS: &str = "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/ns/ipaddressclaims";

/// Deletion first: a paused claim being deleted, nothing assigned for it,
/// loses the assignment finalizer (only ours), last.
#[test]
fn a_paused_deleting_claim_with_nothing_assigned_loses_its_assignment_finalizer() {
    let deleting = json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                     "deletionTimestamp": "2026-01-01T00:00:00Z",
                     "finalizers": [assign::ASSIGNMENT_FINALIZER, "other/keep"],
                     "annotations": {"cluster.x-k8s.io/paused": ""}},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "p"}}});
    let http = ScriptedHttp::new(vec![
        (&format!("GET {CLAIMS}/c"), Reply::json(200, deleting)),
        (
            &format!("PATCH {CLAIMS}/c?fieldValidation=Strict"),
            Reply::status(404),
        ),
    ]);
    let (kv, env, cfg) = (
        MemKv::new(Backend::SpinSqlite),
        TestEnv::at(1000),
        kube_cfg(),
    );
    let ctx = Ctx::auto(&kv, &env);
    let kube = Kube::new(&http, &cfg);
    let mcfg = metal_cfg();
    let metal = Metal::new(&http, &mcfg, &env);
    let out = assign::sync_claim_assignment(&ctx, &kube, &metal, "ns", "c").unwrap();
    assert_eq!((out.result, out.kube_calls), (StepResult::Released, 2));
    http.assert_done();
    let patch = http.sent()[1].json();
    assert_eq!(patch["metadata"]["finalizers"], json!(["other/keep"]));
}

const MACHINES: &str = "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines";
const PROFILES: &str = "/apis/ipam.metal-ipam.dev/v1alpha1/namespaces/ns/metalnetworkprofiles";
const PROFILE: &str = "ipam.metal-ipam.dev/network-profile";

/// A Machine `ns/m` with `extra_meta` and `spec`.
fn machine(extra_meta: Value, spec: Value) -> Value {
    let mut meta = json!({"name": "m", "namespace": "ns", "uid": "m-1", "resourceVersion": "7"});
    for (k, v) in extra_meta.as_object().unwrap() {
        meta[k] = v.clone();
    }
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": meta,
           "spec": spec})
}

/// Runs the machine network step for `ns/m` against `http`, on `kv`.
fn sync_net(http: &ScriptedHttp, kv: &MemKv) -> metal_ipam_core::Result<machine::Synced> {
    let (env, cfg, mcfg) = (TestEnv::at(1000), kube_cfg(), metal_cfg());
    let ctx = Ctx::auto(kv, &env);
    let kube = Kube::new(http, &cfg);
    let metal = Metal::new(http, &mcfg, &env);
    let deps = metal_ipam_core::capi::network::Deps {
        ctx: &ctx,
        kube: &kube,
        metal: Some(&metal),
        pnap: None,
        batches: &Direct(&metal),
    };
    machine::sync_machine(deps, "ns", "m")
}

/// Deletion first, no finalizer of ours: a deleting Machine is absent at
/// once, even with an annotation that is not a name (nothing is parsed,
/// the store is not read).
#[test]
fn a_deleting_machine_is_absent_without_being_parsed() {
    let deleting = machine(
        json!({"deletionTimestamp": "2026-01-01T00:00:00Z",
               "annotations": {PROFILE: "Not A Name"}}),
        json!({"providerID": "equinixmetal://d-1"}),
    );
    let http = ScriptedHttp::new(vec![(
        &format!("GET {MACHINES}/m"),
        Reply::json(200, deleting),
    )]);
    let kv = MemKv::new(Backend::SpinSqlite);
    assert_eq!(sync_net(&http, &kv).unwrap(), machine::Synced::Absent);
    http.assert_done();
    let none = metal_ipam_core::ports::kv::OpCounts::default();
    assert_eq!(
        kv.counts(),
        none,
        "a deleting Machine costs no store operation"
    );
}

/// A live Machine that opted into nothing and has no device: ignored after
/// one read, no finalizer added, no Metal call.
#[test]
fn a_machine_without_a_profile_or_device_is_ignored_after_one_read() {
    let live = machine(json!({}), json!({}));
    let http = ScriptedHttp::new(vec![(&format!("GET {MACHINES}/m"), Reply::json(200, live))]);
    let kv = MemKv::new(Backend::SpinSqlite);
    assert_eq!(sync_net(&http, &kv).unwrap(), machine::Synced::Ignored);
    http.assert_done();
}

/// A Machine naming a profile that does not exist: 404 `ProfileNotFound`
/// naming it, and nothing written (no claim, no finalizer).
#[test]
fn a_missing_profile_is_an_error_naming_it_and_nothing_is_written() {
    let live = machine(json!({"annotations": {PROFILE: "web"}}), json!({}));
    let http = ScriptedHttp::new(vec![
        (&format!("GET {MACHINES}/m"), Reply::json(200, live)),
        (&format!("GET {PROFILES}/web"), Reply::status(404)),
    ]);
    let kv = MemKv::new(Backend::SpinSqlite);
    let e = sync_net(&http, &kv).unwrap_err();
    assert_eq!((e.status(), e.reason()), (404, "ProfileNotFound"));
    assert!(e.to_string().contains("MetalNetworkProfile ns/web"), "{e}");
    http.assert_done();
}
