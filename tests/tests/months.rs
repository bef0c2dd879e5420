//! Issue 26 ("months, not minutes"), through the real components: one
//! address, one holder across every pool; cooling that ends by the clock on
//! every read path; the pool index bounded by the pools alive; one
//! unreadable record that harms nothing else and is repaired by `PUT` or
//! `DELETE`; sizes that agree between the status, the metrics and the
//! browser view.
//!
//! Each test failed on the code before its fix (the commit that added it
//! says how). The tests in `on_every_runtime!` run on real Spin too when
//! `SPIN_BIN` is given; those that move the clock or count key-value
//! operations run on the test host, whose wall clock tests can advance
//! (`Host::advance_clock`).

use metal_ipam_tests::harness::{claim_json, pool_json, App, Runtime};
use serde_json::{json, Value};

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn prefix_pool(ns: &str, name: &str, prefixes: &[&str], len: u8) -> Value {
    json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalPrefixPool",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"prefixes": prefixes, "allocationPrefixLength": len}})
}

fn global_pool(name: &str, addresses: &[&str]) -> Value {
    json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
           "metadata": {"name": name}, "spec": {"addresses": addresses, "prefix": 24}})
}

/// Finding 1: `PUT /v1/pools/ovl/a` 10.0.0.0/24 then `ovl/b`
/// 10.0.0.128/25 were both 201, and filling both handed 127 addresses to
/// two claims. Now the second is 409 `PoolOverlap`, naming the first, and
/// changes nothing; so are overlaps between prefix pools, across kinds and
/// with a global pool. Pools of two namespaces are two address spaces.
async fn overlapping_pools_are_refused_in_one_address_space(app: App) {
    let r = app
        .call(
            "PUT",
            "/v1/pools/ovl/a",
            Some(&pool_json("ovl", "a", &["10.0.0.0/24"], 24)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = app
        .call(
            "PUT",
            "/v1/pools/ovl/b",
            Some(&pool_json("ovl", "b", &["10.0.0.128/25"], 24)),
        )
        .await;
    assert_eq!((r.status, r.reason()), (409, "PoolOverlap"), "{}", r.text());
    assert!(r.text().contains("ovl/a"), "{}", r.text());
    let r = app.call("GET", "/v1/pools/ovl/b", None).await;
    assert_eq!(r.status, 404, "a refused pool is not registered");
    // Across kinds: a prefix pool over the address pool's range.
    let r = app
        .call(
            "PUT",
            "/v1/prefix-pools/ovl/pp",
            Some(&prefix_pool("ovl", "pp", &["10.0.0.0/26"], 28)),
        )
        .await;
    assert_eq!((r.status, r.reason()), (409, "PoolOverlap"), "{}", r.text());
    // Two prefix pools.
    for (name, cidr, want) in [("p1", "fd00:1::/48", 201), ("p2", "fd00:1:0:80::/57", 409)] {
        let r = app
            .call(
                "PUT",
                &format!("/v1/prefix-pools/ovl/{name}"),
                Some(&prefix_pool("ovl", name, &[cidr], 64)),
            )
            .await;
        assert_eq!(r.status, want, "{name}: {}", r.text());
    }
    // A global pool serves every namespace: it overlaps them all.
    let r = app
        .call(
            "PUT",
            "/v1/global-pools/g",
            Some(&global_pool("g", &["10.0.0.200-10.0.0.210"])),
        )
        .await;
    assert_eq!((r.status, r.reason()), (409, "PoolOverlap"), "{}", r.text());
    // Another namespace is another address space (separate networks).
    let r = app
        .call(
            "PUT",
            "/v1/pools/other/a",
            Some(&pool_json("other", "a", &["10.0.0.0/24"], 24)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // Shrinking a makes room for b.
    let r = app
        .call(
            "PUT",
            "/v1/pools/ovl/a",
            Some(&pool_json("ovl", "a", &["10.0.0.0/25"], 24)),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = app
        .call(
            "PUT",
            "/v1/pools/ovl/b",
            Some(&pool_json("ovl", "b", &["10.0.0.128/25"], 24)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // Fill both: no address is handed out twice in the namespace.
    let mut seen = std::collections::BTreeSet::new();
    for pool in ["a", "b"] {
        for i in 0.. {
            let r = app
                .call(
                    "POST",
                    "/v1/claims",
                    Some(&claim_json(
                        "ovl",
                        &format!("{pool}-c-{i:03}"),
                        &format!("u{pool}{i}"),
                        pool,
                    )),
                )
                .await;
            if r.status == 409 {
                assert_eq!(r.reason(), "PoolExhausted", "{}", r.text());
                break;
            }
            assert_eq!(r.status, 201, "{}", r.text());
            let a = r.body["spec"]["address"].as_str().unwrap().to_string();
            assert!(seen.insert(a.clone()), "{a} handed out twice");
        }
    }
    assert_eq!(
        seen.len(),
        254,
        "10.0.0.1-127 and 10.0.0.128-254 (prefix 24: .0 and .255 are reserved)"
    );
}

/// Finding 5: one pool record cut short in the store took `GET
/// /v1/pools`, `/v1/metrics` and `/ui/api/overview` down (500), and `PUT`,
/// `DELETE` and its claims' release answered 500. Now it is skipped and
/// reported, its claims are released, and `PUT` rebuilds it from the
/// bindings that name it without losing what they hold.
async fn an_unreadable_pool_record_harms_nothing_else_and_put_repairs_it(app: App) {
    for (name, cidr) in [("good", "10.1.0.0/29"), ("bad", "10.2.0.0/29")] {
        let r = app
            .call(
                "PUT",
                &format!("/v1/pools/team/{name}"),
                Some(&pool_json("team", name, &[cidr], 29)),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let mut held = Vec::new();
    for i in 0..3 {
        let r = app
            .call(
                "POST",
                "/v1/claims",
                Some(&claim_json(
                    "team",
                    &format!("c{i}"),
                    &format!("u{i}"),
                    "bad",
                )),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
        held.push(r.body["spec"]["address"].as_str().unwrap().to_string());
    }
    // Cut the record short, as a torn write or a bad restore would.
    let store = app.store().await;
    let key = "pool/ns/team/bad";
    let bytes = store.get(key).await.unwrap().unwrap();
    store.set(key, &bytes[..bytes.len() / 2]).await.unwrap();

    let r = app.call("GET", "/v1/pools", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let names: Vec<&str> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["good"]);
    assert_eq!(r.body["unreadable"][0]["name"], "bad", "{}", r.text());
    let r = app.call("GET", "/v1/metrics", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        sample(
            &r.text(),
            "metal_ipam_pool_record_unreadable{namespace=\"team\",name=\"bad\",kind=\"MetalIPPool\"}"
        ),
        Some(1.0),
        "{}",
        r.text()
    );
    assert!(r
        .text()
        .contains("metal_ipam_pool_capacity{namespace=\"team\",name=\"good\""));
    let r = app.call("GET", "/ui/api/overview", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body["unreadable"][0]["name"], "bad", "{}", r.text());
    // Another pool is still served.
    let r = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team", "g0", "ug", "good")),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // A claim of the bad pool can be released.
    let r = app.call("DELETE", "/v1/claims/team/c2", None).await;
    assert_eq!(r.status, 204, "{}", r.text());
    // DELETE refuses while claims hold its addresses, naming them.
    let r = app.call("DELETE", "/v1/pools/team/bad", None).await;
    assert_eq!((r.status, r.reason()), (409, "PoolInUse"), "{}", r.text());
    assert!(r.text().contains("team/c0"), "{}", r.text());
    // PUT rebuilds it from the bindings left: c0 and c1 keep their
    // addresses, c2's is free again.
    let r = app
        .call(
            "PUT",
            "/v1/pools/team/bad",
            Some(&pool_json("team", "bad", &["10.2.0.0/29"], 29)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.body["status"]["ipAddresses"]["used"], 2, "{}", r.text());
    let r = app.call("GET", "/v1/pools", None).await;
    assert!(r.body.get("unreadable").is_none(), "{}", r.text());
    for (i, a) in held.iter().enumerate().take(2) {
        let r = app
            .call("GET", &format!("/v1/claims/team/c{i}"), None)
            .await;
        assert_eq!(r.body["spec"]["address"], a.as_str(), "{}", r.text());
    }
    let r = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team", "c3", "u3", "bad")),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.body["spec"]["address"],
        held[2].as_str(),
        "the released address, lowest free"
    );
}

async fn app(runtime: Runtime) -> Option<App> {
    App::on(runtime, &[], &[]).await
}

metal_ipam_tests::on_every_runtime!(
    app: overlapping_pools_are_refused_in_one_address_space,
    an_unreadable_pool_record_harms_nothing_else_and_put_repairs_it,
);

/// Finding 5, the other repair: `DELETE` of an unreadable pool nobody
/// holds an address of deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_pool_without_claims_is_deleted() {
    let app = App::new();
    let r = app
        .call(
            "PUT",
            "/v1/pools/team/bad",
            Some(&pool_json("team", "bad", &["10.2.0.0/29"], 29)),
        )
        .await;
    assert_eq!(r.status, 201);
    let store = app.store().await;
    store
        .set("pool/ns/team/bad", b"{\"v\":2,\"rev\"")
        .await
        .unwrap();
    let r = app.call("GET", "/v1/pools/team/bad", None).await;
    assert_eq!(
        (r.status, r.reason()),
        (500, "UnreadableRecord"),
        "{}",
        r.text()
    );
    let r = app.call("DELETE", "/v1/pools/team/bad", None).await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = app.call("GET", "/v1/pools", None).await;
    assert_eq!(r.body["items"], json!([]), "{}", r.text());
    assert!(r.body.get("unreadable").is_none(), "{}", r.text());
    // Its addresses are free for another pool of the namespace.
    let r = app
        .call(
            "PUT",
            "/v1/pools/team/new",
            Some(&pool_json("team", "new", &["10.2.0.0/29"], 29)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
}

/// What the status, the metrics and the view say of pool `team/five`:
/// (status free, metrics free, metrics cooling, metrics exhausted, view
/// free, view cooling rows).
async fn five(app: &App) -> (i64, f64, f64, f64, i64, usize) {
    let pool = app.call("GET", "/v1/pools/team/five", None).await;
    let metrics = app.call("GET", "/v1/metrics", None).await.text();
    let view = app.call("GET", "/ui/api/pools/team/five", None).await;
    let labels =
        "{namespace=\"team\",name=\"five\",kind=\"MetalIPPool\",family=\"ipv4\",vrf=\"false\"}";
    (
        pool.body["status"]["ipAddresses"]["free"].as_i64().unwrap(),
        sample(&metrics, &format!("metal_ipam_pool_free{labels}")).unwrap(),
        sample(&metrics, &format!("metal_ipam_pool_cooling{labels}")).unwrap(),
        sample(&metrics, &format!("metal_ipam_pool_exhausted{labels}")).unwrap(),
        view.body["pool"]["free"].as_i64().unwrap(),
        view.body["cooling"].as_array().unwrap().len(),
    )
}

/// A scrape's key-value operations and its pool index entries.
async fn scrape_reads(app: &App) -> (u64, f64) {
    let r = app.call("GET", "/v1/metrics", None).await;
    (
        r.kv_ops,
        sample(&r.text(), "metal_ipam_pool_index_entries").unwrap(),
    )
}

/// Finding 2: a pool of 5 with a 2 s grace period, 5 allocated and 5
/// released, still said free 0 (status, metrics, exhausted 1) and the view
/// listed "reusable from" times in the past 4 s later, until the next
/// allocation. Time is now read on every read path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooling_ends_by_the_clock_on_every_read_path() {
    let app = App::new();
    let mut p = pool_json("team", "five", &["10.3.0.1-10.3.0.5"], 24);
    p["spec"]["addressReuseGracePeriodSeconds"] = json!(2);
    let r = app.call("PUT", "/v1/pools/team/five", Some(&p)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    for i in 0..5 {
        let r = app
            .call(
                "POST",
                "/v1/claims",
                Some(&claim_json("team", &format!("c{i}"), "u", "five")),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    for i in 0..5 {
        let r = app
            .call("DELETE", &format!("/v1/claims/team/c{i}"), None)
            .await;
        assert_eq!(r.status, 204, "{}", r.text());
    }
    assert_eq!(
        five(&app).await,
        (0, 0.0, 5.0, 1.0, 0, 5),
        "right after the releases"
    );
    app.host().advance_clock(4);
    assert_eq!(
        five(&app).await,
        (5, 5.0, 0.0, 0.0, 5, 0),
        "4 s later, no allocation since"
    );
}

/// Finding 4: 9,999 create/delete cycles with no pool alive left the index
/// listing them all: a new name was refused `TooManyPools`, the scrape and
/// the listing read every one. The index now shrinks with its pools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_index_follows_the_pools_alive_not_the_pools_ever_made() {
    const CYCLES: usize = 2_000;
    let app = App::new();
    let r = app
        .call(
            "PUT",
            "/v1/pools/keep/p",
            Some(&pool_json("keep", "p", &["10.4.0.0/24"], 24)),
        )
        .await;
    assert_eq!(r.status, 201);
    let (before, entries) = scrape_reads(&app).await;
    assert_eq!(entries, 1.0);
    for i in 0..CYCLES {
        let path = format!("/v1/pools/churn/p{i}");
        let r = app
            .call(
                "PUT",
                &path,
                Some(&pool_json("churn", &format!("p{i}"), &["10.5.0.0/24"], 24)),
            )
            .await;
        assert_eq!(r.status, 201, "cycle {i}: {}", r.text());
        let r = app.call("DELETE", &path, None).await;
        assert_eq!(r.status, 204, "cycle {i}: {}", r.text());
    }
    let (after, entries) = scrape_reads(&app).await;
    assert_eq!(entries, 1.0, "only the live pool is indexed");
    assert!(
        after <= before + 2,
        "a scrape read {before} keys before {CYCLES} cycles and {after} after"
    );
    let r = app.call("GET", "/v1/pools", None).await;
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    app.assert_counted_kv_ops(&r, 2, "listing one pool: the index and its record");
    let r = app
        .call(
            "PUT",
            "/v1/pools/churn/new",
            Some(&pool_json("churn", "new", &["10.5.0.0/24"], 24)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Finding 6: a /64 pool's status said 9223372036854775807 while the
/// metrics and the view said 18446744073709551615. Every count now
/// saturates at the largest Kubernetes integer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_pool_reports_one_size_everywhere() {
    let app = App::new();
    let body = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
        "metadata": {"name": "v6", "namespace": "team"},
        "spec": {"addresses": ["fd00:6::/64"], "prefix": 64}});
    let r = app.call("PUT", "/v1/pools/team/v6", Some(&body)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let status = r.body["status"]["ipAddresses"]["total"].as_i64().unwrap();
    assert_eq!(status, i64::MAX);
    let metrics = app.call("GET", "/v1/metrics", None).await.text();
    let capacity = sample(
        &metrics,
        "metal_ipam_pool_capacity{namespace=\"team\",name=\"v6\",kind=\"MetalIPPool\",family=\"ipv6\",vrf=\"false\"}",
    )
    .unwrap();
    #[allow(clippy::cast_precision_loss)]
    let want = status as f64;
    assert!((capacity - want).abs() < 1.0, "{capacity} vs {status}");
    let view = app.call("GET", "/ui/api/overview", None).await;
    assert_eq!(
        view.body["pools"][0]["total"].as_i64(),
        Some(status),
        "{}",
        view.text()
    );
}

/// Finding 6 (review): changing a prefix pool's allocation length freed
/// its cooling sub-prefixes at once. It is refused while any cools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_change_waits_for_cooling_sub_prefixes() {
    let app = App::new();
    let mut p = prefix_pool("team", "pods", &["fd00:7::/56"], 64);
    p["spec"]["addressReuseGracePeriodSeconds"] = json!(60);
    let r = app
        .call("PUT", "/v1/prefix-pools/team/pods", Some(&p))
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let mut c = claim_json("team", "c", "u", "pods");
    c["spec"]["poolRef"]["kind"] = json!("MetalPrefixPool");
    let r = app.call("POST", "/v1/claims", Some(&c)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = app.call("DELETE", "/v1/claims/team/c", None).await;
    assert_eq!(r.status, 204);
    p["spec"]["allocationPrefixLength"] = json!(60);
    let r = app
        .call("PUT", "/v1/prefix-pools/team/pods", Some(&p))
        .await;
    assert_eq!(
        (r.status, r.reason()),
        (409, "CoolingAddressesDropped"),
        "{}",
        r.text()
    );
    app.host().advance_clock(61);
    let r = app
        .call("PUT", "/v1/prefix-pools/team/pods", Some(&p))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}
