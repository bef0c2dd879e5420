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
    // P + V + S + 5: 2 pools, no VRF, 3 signatures (metrics 200, pools
    // 201, allocate 201); the 401s were answered before the store was
    // opened (`pools` has no read token, so the shell refuses it there).
    assert_eq!(ops, 2.0 + 3.0 + 5.0, "{text}");
}
