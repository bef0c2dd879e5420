//! Component tests: the real .wasm files from `cargo build-wasm`, routed by
//! the real spin.toml, on the wasmtime test host with Spin's SQLite
//! key-value semantics. Every route: happy paths, auth failures, bad input,
//! the contract's error statuses, and the key-value cost of allocation.
//!
//! The tests listed in `on_every_runtime!` run on real Spin too when
//! `SPIN_BIN` names a Spin CLI (modules `spin_sqlite` and `spin_redis`):
//! the same `spin.toml` and `.wasm` files under `spin up`, on Spin's SQLite
//! and Redis stores. Key-value counts and guest memory are the test host's
//! measurements and are checked there only.

use std::collections::BTreeSet;

use metal_ipam_tests::harness::{claim_json, pool_json, App, Runtime, TOKEN};
use metal_ipam_tests::real_spin::processes_in_group;
use metal_ipam_tests::schema::{self, capi_crds_dir, load_crd};
use serde_json::{json, Value};

fn capi_crd(file: &str) -> schema::Crd {
    load_crd(capi_crds_dir().join(file)).expect("CAPI CRD")
}

fn assert_valid_ip_address(obj: &Value) {
    let crd = capi_crd("cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddresses.yaml");
    if let Err(errs) = crd.validate(obj) {
        panic!("IPAddress does not validate against CAPI's CRD: {errs:?}\n{obj:#}");
    }
}

async fn healthz_needs_no_token_and_everything_else_does(app: App) {
    let r = app.call_with("GET", "/healthz", None, None).await;
    assert_eq!((r.status, r.body.clone()), (200, json!({"status": "ok"})));
    app.assert_kv_ops(&r, 0, "a probe never touches the store");
    let routes = [
        ("GET", "/v1/pools"),
        ("GET", "/v1/global-pools"),
        ("PUT", "/v1/pools/ns/p"),
        ("GET", "/v1/pools/ns/p"),
        ("DELETE", "/v1/pools/ns/p"),
        ("PUT", "/v1/global-pools/g"),
        ("POST", "/v1/claims"),
        ("GET", "/v1/claims/ns/c"),
        ("DELETE", "/v1/claims/ns/c"),
    ];
    for (m, p) in routes {
        for auth in [
            None,
            Some("Bearer not-the-token".to_string()),
            Some(format!("Basic {TOKEN}")),
        ] {
            let r = app
                .call_with(
                    m,
                    p,
                    Some(&pool_json("ns", "p", &["10.0.0.1"], 24)),
                    auth.as_deref(),
                )
                .await;
            assert_eq!(r.status, 401, "{m} {p} with {auth:?}");
            assert_eq!(r.reason(), "Unauthorized");
            assert!(r.headers.contains_key("www-authenticate"));
            app.assert_kv_ops(&r, 0, "rejected before touching the store");
        }
    }
    let store = app.store().await;
    assert!(store.get_keys().await.unwrap().is_empty());
}

async fn pools_register_read_list_update_delete(app: App) {
    let body = json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
        "metadata": {"name": "nodes", "namespace": "team-a"},
        "spec": {"addresses": ["10.10.0.0/24"], "prefix": 24, "gateway": "10.10.0.1"}
    });
    let r = app.call("PUT", "/v1/pools/team-a/nodes", Some(&body)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        r.body["status"]["ipAddresses"],
        json!({"total": 253, "used": 0, "free": 253, "outOfRange": 0})
    );
    let pool_crd =
        load_crd(schema::repo_root().join("deploy/crds/ipam.metal-ipam.dev_metalippools.yaml"))
            .unwrap();
    pool_crd
        .validate(&r.body)
        .unwrap_or_else(|e| panic!("pool response does not match our CRD: {e:?}"));
    assert_eq!(
        app.call("PUT", "/v1/pools/team-a/nodes", Some(&body))
            .await
            .status,
        200
    );
    let r = app.call("GET", "/v1/pools/team-a/nodes", None).await;
    assert_eq!(r.status, 200);
    app.assert_counted_kv_ops(&r, 1, "a pool read is one get");
    let global = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
        "metadata": {"name": "v6"}, "spec": {"addresses": ["2001:db8:7::/64"], "prefix": 64}});
    let r = app.call("PUT", "/v1/global-pools/v6", Some(&global)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let gcrd = load_crd(
        schema::repo_root().join("deploy/crds/ipam.metal-ipam.dev_globalmetalippools.yaml"),
    )
    .unwrap();
    gcrd.validate(&r.body).unwrap_or_else(|e| panic!("{e:?}"));
    let list = app.call("GET", "/v1/pools", None).await;
    let names: BTreeSet<String> = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["nodes".to_string(), "v6".to_string()].into());
    assert_eq!(
        app.call("GET", "/v1/global-pools", None).await.body["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        app.call("DELETE", "/v1/global-pools/v6", None).await.status,
        204
    );
    let r = app.call("GET", "/v1/global-pools/v6", None).await;
    assert_eq!((r.status, r.reason()), (404, "PoolNotFound"));
    let r = app.call("PATCH", "/v1/pools/team-a/nodes", None).await;
    assert_eq!(r.status, 405);
}

async fn bad_input_is_a_clear_4xx_and_changes_nothing(app: App) {
    let store = app.store().await;
    let raw = |body: &'static str| {
        http::Request::builder()
            .method("PUT")
            .uri("/v1/pools/team-a/p")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(body.as_bytes().to_vec())
            .unwrap()
    };
    let r = app.send(raw("{\"apiVersion\": ")).await;
    assert_eq!((r.status, r.reason()), (400, "MalformedJSON"));
    let mut bad = pool_json("team-a", "p", &["10.0.0.0/24", "10.0.9.1"], 24);
    let r = app.call("PUT", "/v1/pools/team-a/p", Some(&bad)).await;
    assert_eq!(
        (r.status, r.body["field"].as_str()),
        (422, Some("spec.addresses[1]"))
    );
    bad["spec"]["prefix"] = json!(40);
    let r = app.call("PUT", "/v1/pools/team-a/p", Some(&bad)).await;
    assert_eq!(r.status, 422);
    let r = app
        .call(
            "PUT",
            "/v1/pools/team-a/p",
            Some(&pool_json("team-a", "other", &["10.0.0.1"], 24)),
        )
        .await;
    assert_eq!(
        (r.status, r.body["field"].as_str()),
        (422, Some("metadata.name"))
    );
    let r = app
        .call(
            "POST",
            "/v1/claims",
            Some(&json!({"kind": "IPAddressClaim"})),
        )
        .await;
    assert_eq!(r.status, 422);
    let written: Vec<String> = store
        .get_keys()
        .await
        .unwrap()
        .into_iter()
        // The request counters (observe::counters) count rejections too.
        .filter(|k| !k.starts_with("obs/") && !k.starts_with("obs-init/"))
        .collect();
    assert!(written.is_empty(), "no key written by rejected requests");
    assert!(
        r.body["message"].as_str().unwrap().len() > 5,
        "a human message: {}",
        r.body
    );
}

async fn claims_allocate_read_release_with_contract_objects(app: App) {
    let mut pool = pool_json("team-a", "p", &["10.20.0.12", "10.20.0.10-10.20.0.11"], 24);
    pool["spec"]["gateway"] = json!("10.20.0.1");
    assert_eq!(
        app.call("PUT", "/v1/pools/team-a/p", Some(&pool))
            .await
            .status,
        201
    );
    let claim = claim_json("team-a", "m-0", "uid-0", "p");
    let r = app.call("POST", "/v1/claims", Some(&claim)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    // The allocation counts itself in its pool record's write: no
    // operation of its own for the request counter.
    app.assert_kv_ops(&r, 4, "allocation cost on Spin's SQLite semantics");
    assert_eq!(
        r.body["spec"]["address"], "10.20.0.10",
        "lowest address, whatever the order of addresses"
    );
    assert_eq!(r.body["spec"]["poolRef"], claim["spec"]["poolRef"]);
    assert_eq!(r.body["metadata"]["ownerReferences"][0]["uid"], "uid-0");
    assert_valid_ip_address(&r.body);
    let again = app.call("POST", "/v1/claims", Some(&claim)).await;
    assert_eq!((again.status, &again.body), (200, &r.body));
    let got = app.call("GET", "/v1/claims/team-a/m-0", None).await;
    assert_eq!((got.status, &got.body), (200, &r.body));
    app.assert_counted_kv_ops(&got, 1, "a claim read is one get");
    // v1beta1 claims get v1beta1 addresses, valid against that version.
    let mut old = claim_json("team-a", "m-1", "uid-1", "p");
    old["apiVersion"] = json!("ipam.cluster.x-k8s.io/v1beta1");
    let r1 = app.call("POST", "/v1/claims", Some(&old)).await;
    assert_eq!(
        (r1.status, r1.body["apiVersion"].as_str()),
        (201, Some("ipam.cluster.x-k8s.io/v1beta1"))
    );
    assert_valid_ip_address(&r1.body);
    assert_eq!(r1.body["spec"]["address"], "10.20.0.11");
    let r2 = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", "m-2", "uid-2", "p")),
        )
        .await;
    assert_eq!(r2.body["spec"]["address"], "10.20.0.12");
    // Exhausted.
    let r = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", "m-3", "uid-3", "p")),
        )
        .await;
    assert_eq!((r.status, r.reason()), (409, "PoolExhausted"));
    assert!(r.body["message"].as_str().unwrap().contains("team-a/p"));
    // Shrinking below an allocated address and deleting in use are refused.
    let shrunk = pool_json("team-a", "p", &["10.20.0.10-10.20.0.11"], 24);
    let r = app.call("PUT", "/v1/pools/team-a/p", Some(&shrunk)).await;
    assert_eq!((r.status, r.reason()), (409, "AllocatedAddressesDropped"));
    assert!(r.body["message"].as_str().unwrap().contains("10.20.0.12"));
    let r = app.call("DELETE", "/v1/pools/team-a/p", None).await;
    assert_eq!((r.status, r.reason()), (409, "PoolInUse"));
    // Release (twice, and an unknown claim), then the waiting claim proceeds.
    let r = app.call("DELETE", "/v1/claims/team-a/m-0", None).await;
    // get, cas_read, get_many (the binding again, after the pool), cas_swap,
    // delete: kv-schema/README.md.
    assert_eq!(r.status, 204);
    // The release counts itself in its pool record's write.
    app.assert_kv_ops(&r, 5, "a release");
    assert_eq!(
        app.call("DELETE", "/v1/claims/team-a/m-0", None)
            .await
            .status,
        204
    );
    assert_eq!(
        app.call("DELETE", "/v1/claims/team-a/nobody", None)
            .await
            .status,
        204
    );
    let r = app.call("GET", "/v1/claims/team-a/m-0", None).await;
    assert_eq!((r.status, r.reason()), (404, "ClaimNotFound"));
    let r = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", "m-3", "uid-3", "p")),
        )
        .await;
    assert_eq!(
        (r.status, r.body["spec"]["address"].as_str()),
        (201, Some("10.20.0.10"))
    );
    let status =
        app.call("GET", "/v1/pools/team-a/p", None).await.body["status"]["ipAddresses"].clone();
    assert_eq!(
        status,
        json!({"total": 3, "used": 3, "free": 0, "outOfRange": 0})
    );
}

async fn claim_errors_map_to_contract_statuses(app: App) {
    app.call(
        "PUT",
        "/v1/pools/team-a/p",
        Some(&pool_json("team-a", "p", &["10.30.0.0/24"], 24)),
    )
    .await;
    let mut foreign = claim_json("team-a", "m", "u", "p");
    foreign["spec"]["poolRef"] =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"});
    let r = app.call("POST", "/v1/claims", Some(&foreign)).await;
    assert_eq!((r.status, r.reason()), (422, "UnsupportedPoolRef"));
    let r = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", "m", "u", "missing")),
        )
        .await;
    assert_eq!((r.status, r.reason()), (404, "PoolNotFound"));
    let r = app
        .send(
            http::Request::builder()
                .method("POST")
                .uri("/v1/claims")
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(b"not json".to_vec())
                .unwrap(),
        )
        .await;
    assert_eq!((r.status, r.reason()), (400, "MalformedJSON"));
    let mut want = claim_json("team-a", "m", "u", "p");
    want["metadata"]["annotations"] =
        json!({"ipam.metal-ipam.dev/requested-address": "10.30.0.200"});
    let r = app.call("POST", "/v1/claims", Some(&want)).await;
    assert_eq!(
        (r.status, r.body["spec"]["address"].as_str()),
        (201, Some("10.30.0.200"))
    );
    let mut clash = claim_json("team-a", "n", "u2", "p");
    clash["metadata"]["annotations"] =
        json!({"ipam.metal-ipam.dev/requested-address": "10.30.0.200"});
    let r = app.call("POST", "/v1/claims", Some(&clash)).await;
    assert_eq!((r.status, r.reason()), (409, "AddressInUse"));
    let r = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", "m", "u-new", "p")),
        )
        .await;
    assert_eq!((r.status, r.reason()), (409, "ClaimUidConflict"));
}

async fn app(runtime: Runtime) -> Option<App> {
    App::on(runtime, &[], &[]).await
}

metal_ipam_tests::on_every_runtime!(
    app: healthz_needs_no_token_and_everything_else_does,
    pools_register_read_list_update_delete,
    bad_input_is_a_clear_4xx_and_changes_nothing,
    claims_allocate_read_release_with_contract_objects,
    claim_errors_map_to_contract_statuses,
    stored_records_match_the_kv_schema,
);

/// `spin up` serves from a child process that outlives a killed parent:
/// dropping the app must stop both, or every test leaves a Spin behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_spin_app_stops_every_process_it_started() {
    let Some(app) = App::on(Runtime::SpinSqlite, &[], &[]).await else {
        return;
    };
    let group = app.spin_process_group().expect("real Spin");
    let before = processes_in_group(group);
    assert!(before >= 2, "spin up and its trigger process: {before}");
    drop(app);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while processes_in_group(group) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} processes of group {group} still run",
            processes_in_group(group)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn kv_operations_per_allocation_stay_within_the_bound_at_low_and_high_fill() {
    let app = App::new();
    // A /22: 1022 allocatable addresses; fill to over 99 %, measuring as we go.
    app.call(
        "PUT",
        "/v1/pools/fill/p",
        Some(&pool_json("fill", "p", &["10.40.0.0/22"], 22)),
    )
    .await;
    let total = 1022;
    let mut low = Vec::new();
    let mut high = Vec::new();
    let mut flushes = Vec::new();
    for i in 0..total {
        let r = app
            .call(
                "POST",
                "/v1/claims",
                Some(&claim_json(
                    "fill",
                    &format!("m-{i}"),
                    &format!("u{i}"),
                    "p",
                )),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        // The allocation counts itself in its pool record's write (no
        // operation for the request counter); one decision in 32 flushes the
        // pool's confirmed holders to their holder page (kv-schema/README.md,
        // "Holder pages"): those are set apart.
        let ops = r.kv_ops;
        if ops > 4 {
            flushes.push((i, ops));
            continue;
        }
        if i < 10 {
            low.push(ops);
        }
        if i >= total * 99 / 100 {
            high.push(ops);
        }
    }
    assert!(
        low.iter().chain(&high).all(|&n| n <= 4),
        "ops per allocation: low {low:?} high {high:?}"
    );
    // At most one allocation in 32 pays a flush: 8 operations, 11 when it
    // creates its page (the creation guard), 13 when its entries span an
    // existing page and a new one.
    assert!(
        flushes.len() as u64 <= total / 32 + 1 && flushes.iter().all(|&(_, n)| n <= 13),
        "flushing allocations: {flushes:?}"
    );
    assert_eq!(
        low.iter().min(),
        high.iter().min(),
        "cost independent of fill"
    );
    let r = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("fill", "one-more", "u", "p")),
        )
        .await;
    assert_eq!(r.reason(), "PoolExhausted");
}

async fn stored_records_match_the_kv_schema(app: App) {
    let mut pool = pool_json("team-a", "p", &["10.50.0.0/28"], 28);
    pool["spec"]["addressReuseGracePeriodSeconds"] = json!(60);
    app.call("PUT", "/v1/pools/team-a/p", Some(&pool)).await;
    for i in 0..3 {
        app.call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", &format!("m{i}"), "u", "p")),
        )
        .await;
    }
    app.call("DELETE", "/v1/claims/team-a/m1", None).await;
    app.call("PUT", "/v1/global-pools/g", Some(&json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1",
        "kind": "GlobalMetalIPPool", "metadata": {"name": "g"}, "spec": {"addresses": ["10.60.0.1"], "prefix": 24}}))).await;
    app.call("DELETE", "/v1/global-pools/g", None).await;
    let dir = schema::repo_root().join("kv-schema");
    let pool_schema: Value =
        serde_json::from_slice(&std::fs::read(dir.join("pool-record.schema.json")).unwrap())
            .unwrap();
    let claim_schema: Value =
        serde_json::from_slice(&std::fs::read(dir.join("claim-record.schema.json")).unwrap())
            .unwrap();
    let registry_schema: Value =
        serde_json::from_slice(&std::fs::read(dir.join("registry-record.schema.json")).unwrap())
            .unwrap();
    let index_schema: Value =
        serde_json::from_slice(&std::fs::read(dir.join("pool-index.schema.json")).unwrap())
            .unwrap();
    let store = app.store().await;
    let mut seen = BTreeSet::new();
    for key in store.get_keys().await.unwrap() {
        let prefix = key.split('/').next().unwrap().to_string();
        seen.insert(prefix.clone());
        let bytes = store.get(&key).await.unwrap().unwrap();
        let schema = match prefix.as_str() {
            "pool" => &pool_schema,
            "claim" => &claim_schema,
            "pool-init" | "pool-index-init" | "obs-init" => continue, // counters
            "obs" if key.starts_with("obs/req/") => continue,         // request counters
            // call and conflict counters
            "obs" if metal_ipam_core::kv::keys::parse_obs_counter(&key).is_some() => continue,
            "pool-index" => &index_schema,
            "obs" if key == "obs/signatures" || key == "obs/counters" => &registry_schema,
            other => panic!("undocumented key {key} ({other})"),
        };
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        schema::validate(schema, &v).unwrap_or_else(|e| panic!("{key}: {e:?}\n{v:#}"));
    }
    assert_eq!(
        seen,
        [
            "claim",
            "obs",
            "obs-init",
            "pool",
            "pool-index",
            "pool-index-init",
            "pool-init"
        ]
        .map(String::from)
        .into()
    );
}

#[test]
fn manifest_grants_each_component_only_what_it_needs() {
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(schema::repo_root().join("spin.toml")).unwrap())
            .unwrap();
    let list = |c: &toml::Value, key: &str| -> Vec<String> {
        c.get(key)
            .and_then(|v| v.as_array())
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let vars = |c: &toml::Value| -> Vec<String> {
        let mut v: Vec<String> = c
            .get("variables")
            .and_then(|v| v.as_table())
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let comps = manifest["component"].as_table().unwrap();
    let mut seen = Vec::new();
    for (id, c) in comps {
        seen.push(id.clone());
        let (stores, hosts, vars) = (
            list(c, "key_value_stores"),
            list(c, "allowed_outbound_hosts"),
            vars(c),
        );
        let k8s = vec!["{{ k8s_api_url }}".to_string()];
        let (want_stores, want_hosts, want_vars): (Vec<&str>, Vec<String>, Vec<&str>) =
            match id.as_str() {
                "healthz" => (vec![], vec![], vec![]),
                "pools" | "allocate" | "release" => (
                    vec!["default"],
                    k8s,
                    vec!["api_token", "k8s_api_url", "k8s_token", "kv_swap_check"],
                ),
                // Also drives the provision step of VRF-backed pools, the
                // assign step of their claims and the network step of
                // opted-in Machines.
                "reconcile" => (
                    vec!["default"],
                    vec![
                        k8s[0].clone(),
                        "http://provision.spin.internal".to_string(),
                        "http://assign.spin.internal".to_string(),
                        "http://network.spin.internal".to_string(),
                    ],
                    vec!["api_token", "k8s_api_url", "k8s_token", "kv_swap_check"],
                ),
                "events" => (
                    vec![],
                    [
                        "allocate",
                        "release",
                        "pools",
                        "provision",
                        "assign",
                        "network",
                    ]
                    .iter()
                    .map(|c| format!("http://{c}.spin.internal"))
                    .collect(),
                    vec!["api_token", "events_token"],
                ),
                // Reads pools; lists the Machines of a profile being
                // deleted.
                "admission" => (
                    vec!["default"],
                    k8s.clone(),
                    vec!["api_token", "k8s_api_url", "k8s_token"],
                ),
                // The VLAN batch steps: Metal only (token, host), no store,
                // no Kubernetes.
                "attach-vlan" | "detach-vlan" => (
                    vec![],
                    vec!["{{ metal_api_url }}".to_string()],
                    vec![
                        "api_token",
                        "metal_api_url",
                        "metal_project_id",
                        "metal_token",
                    ],
                ),
                // With the batch steps, the only components with the Metal
                // token and Metal host; network and poll chain to the batch
                // steps. They also hold phoenixNAP's client credentials
                // and hosts (pools, claims, server networks, the poll).
                "provision" | "assign" | "poll" | "network" => {
                    let chains = matches!(id.as_str(), "poll" | "network");
                    let mut hosts = vec![
                        "{{ k8s_api_url }}",
                        "{{ metal_api_url }}",
                        "{{ pnap_api_url }}",
                        "{{ pnap_auth_url }}",
                    ];
                    if chains {
                        hosts.extend([
                            "http://attach-vlan.spin.internal",
                            "http://detach-vlan.spin.internal",
                        ]);
                    }
                    let vars = vec![
                        "api_token",
                        "k8s_api_url",
                        "k8s_token",
                        "kv_swap_check",
                        "metal_api_url",
                        "metal_project_id",
                        "metal_token",
                        "pnap_api_url",
                        "pnap_auth_url",
                        "pnap_client_id",
                        "pnap_client_secret",
                    ];
                    (
                        vec!["default"],
                        hosts.into_iter().map(str::to_string).collect(),
                        vars,
                    )
                }
                // Read-only views: the store only (they count their own
                // requests and may create the pool index), no outbound
                // host, the read token beside the API token.
                "metrics" | "ui" => (
                    vec!["default"],
                    vec![],
                    vec!["api_token", "kv_swap_check", "read_token"],
                ),
                other => panic!("unexpected component {other}"),
            };
        assert_eq!(stores, want_stores, "{id}: key_value_stores");
        assert_eq!(hosts, want_hosts, "{id}: allowed_outbound_hosts");
        assert_eq!(vars, want_vars, "{id}: variables");
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "admission",
            "allocate",
            "assign",
            "attach-vlan",
            "detach-vlan",
            "events",
            "healthz",
            "metrics",
            "network",
            "poll",
            "pools",
            "provision",
            "reconcile",
            "release",
            "ui"
        ]
    );
    for secret in [
        "api_token",
        "events_token",
        "k8s_token",
        "metal_token",
        "pnap_client_secret",
        "read_token",
    ] {
        assert!(
            manifest["variables"][secret]["secret"].as_bool().unwrap(),
            "{secret} is secret"
        );
    }
}

/// Bounded input (issue 6, finding 7): a request body is never buffered
/// past `MAX_BODY`. In-process requests carry no `Content-Length` unless a
/// test sets one, so without it the body reaches the component the way a
/// chunked body does. The test host reports the linear memory the
/// component instance asked for (`x-guest-memory-bytes`).
mod bounded_input {
    use super::*;
    use metal_ipam_core::http::api::MAX_BODY;
    use metal_ipam_host::GUEST_MEMORY_HEADER;
    use metal_ipam_tests::harness::Resp;

    const MIB: usize = 1 << 20;

    use super::app;
    metal_ipam_tests::on_every_runtime!(
        app: an_unauthenticated_64_mib_post_is_refused_without_reading_it,
        a_declared_length_over_the_limit_is_413_before_the_body_is_read,
        a_body_without_length_over_the_limit_is_413_and_read_only_to_the_limit,
        a_pool_with_too_many_entries_is_422_naming_the_field,
    );

    fn request(
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: Vec<u8>,
        content_length: bool,
    ) -> http::Request<Vec<u8>> {
        let mut b = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json");
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        if content_length {
            b = b.header("content-length", body.len());
        }
        b.body(body).expect("request")
    }

    /// The linear memory the instance asked for: the test host reports it,
    /// Spin does not (`None`).
    fn guest_memory(app: &App, r: &Resp) -> Option<usize> {
        app.counts_kv_ops().then(|| {
            r.headers
                .get(GUEST_MEMORY_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .expect("the test host reports the guest's memory")
        })
    }

    /// What an instance of `path`'s component asks for on a small
    /// authenticated request: the baseline the big requests are held to.
    async fn baseline(app: &App, method: &str, path: &str) -> Option<usize> {
        let body = serde_json::to_vec(&json!({})).unwrap();
        let r = app
            .send(request(
                method,
                path,
                Some(&format!("Bearer {TOKEN}")),
                body,
                true,
            ))
            .await;
        guest_memory(app, &r)
    }

    /// At most the body limit (plus one read chunk and the copy the JSON
    /// parser may make) over what a small request costs.
    fn assert_bounded(app: &App, r: &Resp, base: Option<usize>, what: &str) {
        let (Some(used), Some(base)) = (guest_memory(app, r), base) else {
            return;
        };
        assert!(
            used <= base + 2 * MAX_BODY + MIB,
            "{what}: the component asked for {used} bytes of memory (a small request: {base})"
        );
    }

    async fn an_unauthenticated_64_mib_post_is_refused_without_reading_it(app: App) {
        for (method, path) in [
            ("POST", "/v1/claims"),
            ("PUT", "/v1/pools/ns/p"),
            ("POST", "/v1/events"),
            ("POST", "/v1/admission/pools"),
            ("POST", "/v1/reconcile"),
        ] {
            let base = baseline(&app, method, path).await;
            for content_length in [true, false] {
                for auth in [None, Some("Bearer not-the-token")] {
                    let r = app
                        .send(request(
                            method,
                            path,
                            auth,
                            vec![b' '; 64 * MIB],
                            content_length,
                        ))
                        .await;
                    let what = format!("{method} {path} {auth:?} content-length: {content_length}");
                    assert!(
                        r.status == 401 || r.status == 413,
                        "{what}: {} {}",
                        r.status,
                        r.body
                    );
                    app.assert_kv_ops(&r, 0, &what);
                    assert_bounded(&app, &r, base, &what);
                }
            }
        }
    }

    async fn a_declared_length_over_the_limit_is_413_before_the_body_is_read(app: App) {
        let base = baseline(&app, "PUT", "/v1/pools/ns/p").await;
        let bearer = format!("Bearer {TOKEN}");
        for size in [MAX_BODY + 1, 64 * MIB] {
            let r = app
                .send(request(
                    "PUT",
                    "/v1/pools/ns/p",
                    Some(&bearer),
                    vec![b' '; size],
                    true,
                ))
                .await;
            assert_eq!(r.status, 413, "{size} bytes: {}", r.body);
            assert_eq!(
                r.body,
                json!({"reason": "PayloadTooLarge",
                       "message": format!("the request body is larger than {MAX_BODY} bytes")})
            );
            app.assert_kv_ops(&r, 0, "refused before the store");
            // Refused from the head: the body never entered the guest.
            if let (Some(used), Some(base)) = (guest_memory(&app, &r), base) {
                assert!(used <= base + MIB, "{used} bytes (a small request: {base})");
            }
        }
        // Up to the limit is fine (a pool spec padded with whitespace).
        let mut body = serde_json::to_vec(&pool_json("ns", "p", &["10.9.0.0/24"], 24)).unwrap();
        body.resize(MAX_BODY, b' ');
        let r = app
            .send(request("PUT", "/v1/pools/ns/p", Some(&bearer), body, true))
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
    }

    async fn a_body_without_length_over_the_limit_is_413_and_read_only_to_the_limit(app: App) {
        let bearer = format!("Bearer {TOKEN}");
        for (method, path) in [
            ("PUT", "/v1/pools/ns/p"),
            ("POST", "/v1/claims"),
            ("POST", "/v1/events"),
            ("POST", "/v1/admission/pools"),
        ] {
            let base = baseline(&app, method, path).await;
            for size in [MAX_BODY + 1, 64 * MIB] {
                let r = app
                    .send(request(
                        method,
                        path,
                        Some(&bearer),
                        vec![b' '; size],
                        false,
                    ))
                    .await;
                let what = format!("{method} {path}, {size} bytes");
                assert_eq!(r.status, 413, "{what}: {}", r.body);
                assert_eq!(r.reason(), "PayloadTooLarge", "{what}");
                app.assert_kv_ops(&r, 0, &what);
                assert_bounded(&app, &r, base, &what);
            }
        }
        // Exactly the limit, without a length, is read and handled.
        let mut body = serde_json::to_vec(&pool_json("ns", "q", &["10.9.1.0/24"], 24)).unwrap();
        body.resize(MAX_BODY, b'\n');
        let r = app
            .send(request("PUT", "/v1/pools/ns/q", Some(&bearer), body, false))
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
    }

    async fn a_pool_with_too_many_entries_is_422_naming_the_field(app: App) {
        let max = metal_ipam_core::ipam::pool::MAX_ENTRIES;
        let ips: Vec<String> = (0..=max)
            .map(|i| format!("10.8.{}.{}", i / 256, i % 256))
            .collect();
        let refs: Vec<&str> = ips.iter().map(String::as_str).collect();
        let r = app
            .call(
                "PUT",
                "/v1/pools/ns/big",
                Some(&pool_json("ns", "big", &refs, 16)),
            )
            .await;
        assert_eq!(
            (r.status, r.reason()),
            (422, "Invalid"),
            "{}",
            r.body["message"]
        );
        assert_eq!(r.body["field"], "spec.addresses");
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .contains(&max.to_string()),
            "{}",
            r.body
        );
        let r = app
            .call(
                "PUT",
                "/v1/pools/ns/big",
                Some(&pool_json("ns", "big", &refs[..max], 16)),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        assert_eq!(r.body["status"]["ipAddresses"]["total"], max - 1);
    }
}
