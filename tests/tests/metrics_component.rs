//! The `metrics` component on the real `.wasm` (the test host, spin.toml):
//! its tokens, its content type, and its values after allocations made
//! through the plain HTTP API.

use metal_ipam_tests::harness::{claim_json, pool_json, App, TOKEN};

const READ: &str = "metrics-read-token-5e1c";

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_need_a_token_and_count_what_the_api_did() {
    let app = App::with_variables(&[("read_token", READ)]);
    let r = app.call_with("GET", "/v1/metrics", None, None).await;
    assert_eq!(r.status, 401, "{}", r.text());
    for token in [TOKEN, READ] {
        let r = app
            .call_with("GET", "/v1/metrics", None, Some(&format!("Bearer {token}")))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.headers["content-type"],
            "text/plain; version=0.0.4; charset=utf-8"
        );
    }
    // The read token opens nothing else.
    let r = app
        .call_with("GET", "/v1/pools", None, Some(&format!("Bearer {READ}")))
        .await;
    assert_eq!(r.status, 401);

    for (i, name) in ["a", "b"].iter().enumerate() {
        let cidr = format!("10.{}.0.0/24", 60 + i);
        let r = app
            .call(
                "PUT",
                &format!("/v1/pools/ns/{name}"),
                Some(&pool_json("ns", name, &[&cidr], 24)),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    for n in 0..3 {
        let pool = if n == 0 { "a" } else { "b" };
        let r = app
            .call(
                "POST",
                "/v1/claims",
                Some(&claim_json("ns", &format!("c{n}"), &format!("u{n}"), pool)),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = app.call("GET", "/v1/metrics", None).await;
    let text = r.text();
    let used = |p: &str| {
        sample(
            &text,
            &format!("metal_ipam_pool_used{{namespace=\"ns\",name=\"{p}\",kind=\"MetalIPPool\",family=\"ipv4\",vrf=\"false\"}}"),
        )
    };
    assert_eq!(used("a"), Some(1.0), "{text}");
    assert_eq!(used("b"), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, "metal_ipam_allocations_total"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "metal_ipam_requests_total{component=\"allocate\",route=\"/v1/claims\",status=\"201\"}"
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "metal_ipam_requests_total{component=\"metrics\",route=\"/v1/metrics\",status=\"200\"}"
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "metal_ipam_scrape_pools"),
        Some(2.0),
        "{text}"
    );
    let ops = sample(&text, "metal_ipam_scrape_kv_operations").unwrap();
    // P + V + S + C + 6: 2 pools, no VRF, 2 registered signatures
    // (metrics 200, pools 201: the allocations count themselves in their
    // pool records, read with the pools), no call or conflict counter; the
    // 401s were answered before the store was opened (`pools` has no read
    // token, so the shell refuses it there).
    assert_eq!(ops, 2.0 + 2.0 + 0.0 + 6.0, "{text}");
}

/// The registered request signatures, read from the store (the registry
/// record `obs/signatures`).
async fn signatures(app: &App) -> Vec<String> {
    let store = app.store().await;
    let Some(bytes) = store.get("obs/signatures").await.unwrap() else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["state"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect()
}

/// Issue 26 finding 3: a reconcile's Kubernetes calls grow with the
/// objects (one LIST page per object here), so a signature holding exact
/// call counts made a new one per run. Counted by bounded keys instead,
/// the registered signatures and the scrape's KV reads stay flat while the
/// Kubernetes call counter grows by exactly the calls made.
#[tokio::test]
async fn reconcile_over_growing_object_counts_keeps_signatures_and_scrape_cost_flat() {
    use metal_ipam_tests::fake_kube::FakeKube;
    use serde_json::json;

    let kube = FakeKube::start().await;
    kube.set_list_page_size(1);
    let url = kube.base_url();
    let app = App::with_variables(&[("k8s_api_url", url.as_str()), ("k8s_token", kube.token())]);
    kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": "team-a"}, "spec": {"paused": false}}),
    );
    kube.create(
        json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
        "metadata": {"name": "nodes", "namespace": "team-a"},
        "spec": {"addresses": ["10.9.0.10-10.9.0.90"], "prefix": 24, "gateway": "10.9.0.1"}}),
    );
    let mut rows = Vec::new();
    let mut total = 0;
    for i in 0..8 {
        kube.create(json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
            "metadata": {"name": format!("m-{i}"), "namespace": "team-a",
                         "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "nodes"}}}));
        kube.clear_requests();
        let r = app.call("POST", "/v1/reconcile", None).await;
        assert_eq!(r.status, 200, "{}", r.text());
        // The reconcile's own calls (its chained steps count theirs).
        let calls = kube.requests().len();
        total += calls;
        let text = app.call("GET", "/v1/metrics", None).await.text();
        let ops = sample(&text, "metal_ipam_scrape_kv_operations").unwrap();
        rows.push((i, calls, signatures(&app).await.len(), ops));
        // Every Kubernetes call counted, exactly (by whichever component,
        // whatever its answer).
        let counted: f64 = text
            .lines()
            .filter(|l| l.starts_with("metal_ipam_kube_calls_total{"))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
            .sum();
        assert_eq!(counted, total as f64, "{text}");
    }
    println!("run, Kubernetes calls (all components), signatures, scrape KV ops: {rows:?}");
    let calls: Vec<usize> = rows.iter().map(|r| r.1).collect();
    assert!(
        calls[1..].windows(2).all(|w| w[1] > w[0]),
        "each run makes more calls than the one before: {calls:?}"
    );
    // Runs 2.. see only tuples seen before (run 1 brings the chained
    // steps' first answers and this scrape's own signature).
    let flat = &rows[2..];
    assert!(
        flat.iter().all(|r| (r.2, r.3) == (flat[0].2, flat[0].3)),
        "signatures and scrape KV reads must not grow with the calls: {rows:?}"
    );
}
