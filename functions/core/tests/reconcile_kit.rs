//! The reconcile kit's lifecycle, checked on scripted API answers: each
//! test names one path through the skeleton and the exact requests it
//! makes, in order (a request out of order fails the test).

use metal_ipam_core::capi::{self, StepResult};
use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::kube::{Kube, KubeConfig};
use metal_ipam_core::testing::{Backend, Reply, ScriptedHttp, World};
use serde_json::{json, Value};

const CLAIMS: &str = "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/ns/ipaddressclaims";
const ADDRESSES: &str = "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/ns/ipaddresses";
const POOLS: &str = "/apis/ipam.metal-ipam.dev/v1alpha1/namespaces/ns/metalippools";
const CLAIM_FINALIZER: &str = "ipam.metal-ipam.dev/release-address";
const POOL_FINALIZER: &str = "ipam.metal-ipam.dev/protect-pool";

fn cfg() -> KubeConfig {
    KubeConfig {
        base_url: "https://kube.test".into(),
        token: "t".into(),
    }
}

fn claim(extra_meta: Value) -> Value {
    let mut meta = json!({"name": "c", "namespace": "ns", "uid": "u-1", "resourceVersion": "7"});
    for (k, v) in extra_meta.as_object().unwrap() {
        meta[k] = v.clone();
    }
    json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
           "metadata": meta,
           "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "p"}}})
}

fn pool(extra_meta: Value) -> Value {
    let mut meta = json!({"name": "p", "namespace": "ns", "uid": "p-1", "resourceVersion": "3"});
    for (k, v) in extra_meta.as_object().unwrap() {
        meta[k] = v.clone();
    }
    json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool", "metadata": meta,
           "spec": {"addresses": ["10.0.0.0/24"], "prefix": 24}})
}

fn requests(http: &ScriptedHttp) -> Vec<String> {
    http.sent()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s.method,
                s.uri.trim_start_matches("https://kube.test")
            )
        })
        .collect()
}

/// Pause first (claims): a paused claim being deleted is left alone — one
/// read, no write, the finalizer kept.
#[test]
fn a_paused_deleting_claim_is_left_alone() {
    let http = ScriptedHttp::new(vec![(
        &format!("GET {CLAIMS}/c"),
        Reply::json(
            200,
            claim(json!({"deletionTimestamp": "2026-01-01T00:00:00Z",
                          "finalizers": [CLAIM_FINALIZER],
                          "annotations": {"cluster.x-k8s.io/paused": ""}})),
        ),
    )]);
    let (w, cfg) = (World::new(Backend::SpinSqlite, 1000), cfg());
    let ctx = w.ctx();
    let kube = Kube::new(&http, &cfg);
    let out = capi::reconcile_claim(&ctx, &kube, "ns", "c").unwrap();
    assert_eq!((out.result, out.kube_calls), (StepResult::Paused, 1));
    http.assert_done();
}

/// Deleting with our finalizer: cleanup (nothing bound, no IPAddress),
/// then the finalizer comes off, last.
#[test]
fn a_deleting_claim_is_cleaned_up_then_its_finalizer_removed() {
    let deleting = claim(json!({"deletionTimestamp": "2026-01-01T00:00:00Z",
                                "finalizers": [CLAIM_FINALIZER, "other/keep"]}));
    let mut after = deleting.clone();
    after["metadata"]["finalizers"] = json!(["other/keep"]);
    let http = ScriptedHttp::new(vec![
        (&format!("GET {CLAIMS}/c"), Reply::json(200, deleting)),
        (&format!("GET {POOLS}/p"), Reply::status(404)),
        (&format!("GET {ADDRESSES}/c"), Reply::status(404)),
        (
            &format!("PATCH {CLAIMS}/c?fieldValidation=Strict"),
            Reply::json(200, after),
        ),
    ]);
    let (w, cfg) = (World::new(Backend::SpinSqlite, 1000), cfg());
    let ctx = w.ctx();
    let kube = Kube::new(&http, &cfg);
    let out = capi::reconcile_claim(&ctx, &kube, "ns", "c").unwrap();
    assert_eq!((out.result, out.kube_calls), (StepResult::Released, 4));
    http.assert_done();
    let patch = http.sent()[3].json();
    assert_eq!(patch["metadata"]["finalizers"], json!(["other/keep"]));
    assert_eq!(patch["metadata"]["resourceVersion"], "7");
}

/// A claim whose spec cannot be served: its condition is written on the
/// live object, and nothing else happens (no finalizer).
#[test]
fn an_invalid_live_claim_gets_its_condition_and_nothing_else() {
    let mut bad = claim(json!({}));
    bad["spec"]["poolRef"] = json!({"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool"});
    let http = ScriptedHttp::new(vec![
        (&format!("GET {CLAIMS}/c"), Reply::json(200, bad.clone())),
        (
            &format!("PATCH {CLAIMS}/c/status?fieldValidation=Strict"),
            Reply::json(200, bad),
        ),
    ]);
    let (w, cfg) = (World::new(Backend::SpinSqlite, 1000), cfg());
    let ctx = w.ctx();
    let kube = Kube::new(&http, &cfg);
    let out = capi::reconcile_claim(&ctx, &kube, "ns", "c").unwrap();
    assert_eq!((out.result, out.kube_calls), (StepResult::Failed, 2));
    let status = &http.sent()[1].json()["status"];
    assert_eq!(status["conditions"][0]["reason"], "AllocationFailed");
    assert_eq!(status["conditions"][0]["status"], "False");
    http.assert_done();
}

/// Deletion first (pools): a paused pool being deleted is still removed
/// from the store and loses its finalizer.
#[test]
fn a_paused_deleting_pool_is_still_deleted() {
    let deleting = pool(json!({"deletionTimestamp": "2026-01-01T00:00:00Z",
                               "finalizers": [POOL_FINALIZER],
                               "annotations": {"cluster.x-k8s.io/paused": ""}}));
    let http = ScriptedHttp::new(vec![
        (&format!("GET {POOLS}/p"), Reply::json(200, deleting)),
        (
            &format!("PATCH {POOLS}/p?fieldValidation=Strict"),
            Reply::status(404),
        ),
    ]);
    let (w, cfg) = (World::new(Backend::SpinSqlite, 1000), cfg());
    let ctx = w.ctx();
    let kube = Kube::new(&http, &cfg);
    let out = capi::sync_pool(&ctx, &kube, &PoolId::namespaced("ns", "p")).unwrap();
    assert_eq!((out.result, out.kube_calls), (StepResult::Deleted, 2));
    http.assert_done();
}

/// A 409 re-reads and runs the lifecycle again; every request of every
/// attempt is counted.
#[test]
fn a_conflict_reruns_the_lifecycle_and_every_call_is_counted() {
    let live = pool(json!({}));
    let mut held = live.clone();
    held["metadata"]["finalizers"] = json!([POOL_FINALIZER]);
    held["metadata"]["resourceVersion"] = "4".into();
    let http = ScriptedHttp::new(vec![
        (&format!("GET {POOLS}/p"), Reply::json(200, live.clone())),
        (
            &format!("PATCH {POOLS}/p?fieldValidation=Strict"),
            Reply::status(409),
        ),
        (&format!("GET {POOLS}/p"), Reply::json(200, live)),
        (
            &format!("PATCH {POOLS}/p?fieldValidation=Strict"),
            Reply::json(200, held.clone()),
        ),
        (
            &format!("GET {ADDRESSES}?limit=250"),
            Reply::json(200, json!({"items": [], "metadata": {}})),
        ),
        (
            &format!("PATCH {POOLS}/p/status?fieldValidation=Strict"),
            Reply::json(200, held),
        ),
    ]);
    let (w, cfg) = (World::new(Backend::SpinSqlite, 1000), cfg());
    let ctx = w.ctx();
    let kube = Kube::new(&http, &cfg);
    let out = capi::sync_pool(&ctx, &kube, &PoolId::namespaced("ns", "p")).unwrap();
    assert_eq!((out.result, out.kube_calls), (StepResult::Synced, 6));
    let status = &http.sent()[5].json()["status"];
    assert_eq!(status["conditions"][0]["reason"], "PoolReady");
    assert_eq!(status["ipAddresses"]["total"], 254);
    http.assert_done();
    assert_eq!(requests(&http).len(), 6);
}
