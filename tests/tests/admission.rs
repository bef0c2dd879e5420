//! The validating webhook through the real `admission` component: one test
//! per deny reason, and the allowed cases next to them.

use metal_ipam_tests::harness::{claim_json, pool_json, App, Runtime};
use serde_json::{json, Value};

fn review(op: &str, object: Option<Value>, old: Option<Value>) -> Value {
    let src = object
        .as_ref()
        .or(old.as_ref())
        .cloned()
        .unwrap_or(Value::Null);
    let kind = src["kind"].as_str().unwrap_or("MetalIPPool").to_string();
    let plural = if kind == "GlobalMetalIPPool" {
        "globalmetalippools"
    } else {
        "metalippools"
    };
    let mut req = json!({
        "uid": format!("uid-{op}-{}", src["metadata"]["name"].as_str().unwrap_or("x")),
        "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": kind},
        "resource": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "resource": plural},
        "name": src["metadata"]["name"],
        "operation": op,
        "userInfo": {"username": "admin"},
        "object": object,
        "oldObject": old,
        "dryRun": false,
    });
    if let Some(ns) = src["metadata"]["namespace"].as_str() {
        req["namespace"] = ns.into();
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
}

async fn decide(app: &App, r: Value) -> (bool, Value) {
    let resp = app.call("POST", "/v1/admission/pools", Some(&r)).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(resp.body["response"]["uid"], r["request"]["uid"]);
    (
        resp.body["response"]["allowed"].as_bool().unwrap(),
        resp.body["response"].clone(),
    )
}

async fn the_webhook_allows_good_pools_and_denies_each_unsafe_change(app: App) {
    let a = pool_json("team-a", "a", &["10.1.0.10-10.1.0.20"], 24);
    let (ok, _) = decide(&app, review("CREATE", Some(a.clone()), None)).await;
    assert!(ok, "a valid new pool is allowed");

    // Invalid spec: denied naming the field.
    let bad = pool_json("team-a", "bad", &["10.1.0.0/24", "nope"], 24);
    let (ok, resp) = decide(&app, review("CREATE", Some(bad), None)).await;
    assert!(!ok);
    assert!(
        resp["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.addresses[1]"),
        "{resp}"
    );

    // Register a for real (the webhook judges against the store).
    assert_eq!(
        app.call("PUT", "/v1/pools/team-a/a", Some(&a)).await.status,
        201
    );
    // Overlap in the same namespace: denied; in another namespace: allowed.
    let b = pool_json("team-a", "b", &["10.1.0.15-10.1.0.30"], 24);
    let (ok, resp) = decide(&app, review("CREATE", Some(b), None)).await;
    assert!(!ok);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("team-a/a") && msg.contains("10.1.0.15"),
        "{msg}"
    );
    let other_ns = pool_json("team-b", "b", &["10.1.0.15-10.1.0.30"], 24);
    let (ok, _) = decide(&app, review("CREATE", Some(other_ns), None)).await;
    assert!(
        ok,
        "namespaced pools of different namespaces serve different claims"
    );
    // A global pool overlapping anything: denied.
    let g = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
        "metadata": {"name": "g"}, "spec": {"addresses": ["10.1.0.0/24"], "prefix": 24}});
    let (ok, _) = decide(&app, review("CREATE", Some(g), None)).await;
    assert!(!ok);

    // Allocate .10 and .11, then try to drop .11.
    for n in ["m0", "m1"] {
        app.call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", n, &format!("u-{n}"), "a")),
        )
        .await;
    }
    let shrunk = pool_json("team-a", "a", &["10.1.0.10", "10.1.0.12-10.1.0.20"], 24);
    let (ok, resp) = decide(&app, review("UPDATE", Some(shrunk), Some(a.clone()))).await;
    assert!(!ok);
    assert!(
        resp["status"]["message"]
            .as_str()
            .unwrap()
            .contains("10.1.0.11"),
        "{resp}"
    );
    let grown = pool_json("team-a", "a", &["10.1.0.10-10.1.0.40"], 24);
    let (ok, _) = decide(&app, review("UPDATE", Some(grown), Some(a.clone()))).await;
    assert!(ok, "growing keeps every allocation");

    // Deleting while in use: denied, unless the clusterctl-move annotation is set.
    let (ok, resp) = decide(&app, review("DELETE", None, Some(a.clone()))).await;
    assert!(!ok);
    assert_eq!(resp["status"]["code"], 403);
    let mut moving = a.clone();
    moving["metadata"]["annotations"] =
        json!({"ipam.metal-ipam.dev/skip-validate-delete-webhook": ""});
    let (ok, _) = decide(&app, review("DELETE", None, Some(moving))).await;
    assert!(ok);
    // Once released, deletion is allowed.
    for n in ["m0", "m1"] {
        app.call("DELETE", &format!("/v1/claims/team-a/{n}"), None)
            .await;
    }
    let (ok, _) = decide(&app, review("DELETE", None, Some(a))).await;
    assert!(ok);
}

async fn the_webhook_needs_the_token_and_a_well_formed_review(app: App) {
    let r = app
        .call_with("POST", "/v1/admission/pools", Some(&json!({})), None)
        .await;
    assert_eq!(r.status, 401);
    let r = app
        .call(
            "POST",
            "/v1/admission/pools",
            Some(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r = app.call("GET", "/v1/admission/pools", None).await;
    assert_eq!(r.status, 405);
    // Other kinds are not ours to judge.
    let mut cm = review(
        "CREATE",
        Some(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "y"}}),
        ),
        None,
    );
    cm["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    cm["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "configmaps"});
    let (ok, _) = decide(&app, cm).await;
    assert!(ok);
}

/// Both tests on every runtime: the test host, and real Spin (SQLite and
/// Redis stores) when `SPIN_BIN` is given.
async fn app(runtime: Runtime) -> Option<App> {
    App::on(runtime, &[], &[]).await
}

metal_ipam_tests::on_every_runtime!(
    app: the_webhook_allows_good_pools_and_denies_each_unsafe_change,
    the_webhook_needs_the_token_and_a_well_formed_review,
);
