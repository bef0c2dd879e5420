//! The bench's naive allocator (`tests/bench/naive`) keeps answering like
//! ours, so section 6 of the bench compares protocols and nothing else:
//! the same manifest shape, auth, claim parser, pool record and
//! `IPAddress` answer. Its raciness is what the bench counts
//! ("duplicates"); here, one request at a time, it must be plainly right.

use metal_ipam_tests::harness::{claim_json, pool_json, App};
use metal_ipam_tests::schema::repo_root;

fn naive() -> App {
    let wasm = repo_root().join("target/wasm32-wasip2/release/metal_ipam_bench_naive.wasm");
    assert!(
        wasm.exists(),
        "{} is missing: run `cargo build-wasm-all` (tests/run does)",
        wasm.display()
    );
    App::from_manifest(&repo_root().join("tests/bench/naive/spin.toml"))
}

#[tokio::test]
async fn the_naive_allocator_answers_like_ours_one_request_at_a_time() {
    let (naive, ours) = (naive(), App::new());
    for app in [&naive, &ours] {
        let pool = pool_json("ns", "p", &["10.9.0.0/30"], 30);
        assert_eq!(
            app.call("PUT", "/v1/pools/ns/p", Some(&pool)).await.status,
            201
        );
    }
    for (i, want) in ["10.9.0.1", "10.9.0.2"].into_iter().enumerate() {
        let claim = claim_json("ns", &format!("c{i}"), &format!("u{i}"), "p");
        let a = naive.call("POST", "/v1/claims", Some(&claim)).await;
        let b = ours.call("POST", "/v1/claims", Some(&claim)).await;
        assert_eq!((a.status, b.status), (201, 201), "{} / {}", a.body, b.body);
        assert_eq!(a.body["spec"]["address"], want);
        assert_eq!(a.body, b.body, "the same IPAddress");
    }
    let full = naive
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("ns", "c2", "u2", "p")),
        )
        .await;
    assert_eq!(full.status, 409, "{}", full.body);
    let unauthenticated = naive
        .call_with(
            "POST",
            "/v1/claims",
            Some(&claim_json("ns", "c3", "u3", "p")),
            None,
        )
        .await;
    assert_eq!(unauthenticated.status, 401);
    // What makes it naive: no check for an existing binding.
    let again = naive
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("ns", "c0", "u0", "p")),
        )
        .await;
    assert_eq!(
        again.status, 409,
        "a repeat takes a new address (none left): {}",
        again.body
    );
}
