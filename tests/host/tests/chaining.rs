//! Service chaining (`http://<component-id>.spin.internal/...`) through
//! the probe component (`tests/host/probe`, build it with
//! `cargo build --target wasm32-wasip2 --release -p metal-ipam-host-probe`).

mod common;

use common::{enc, probe_wasm, TempDir};
use metal_ipam_host::{
    ChainedCall, Host, HostBuilder, KvBackend, KvOpCounts, RequestOutcome, KV_OPS_CHAINED_HEADER,
};
use serde_json::{json, Value};

/// `caller` (routed, may chain to a few named targets, store `default`),
/// `callee` (private route only, store `default`, a variable), `wild`
/// (routed, may chain to any component, no store), `denied` (routed, no
/// outbound hosts) and `lonely` (no trigger at all). All run the probe.
fn write_manifest(dir: &TempDir) -> std::path::PathBuf {
    let manifest = format!(
        r#"spin_manifest_version = 2
[application]
name = "chain-app"

[variables]
greeting = {{ default = "hi" }}

[[trigger.http]]
route = "/probe/..."
component = "caller"

[[trigger.http]]
route = {{ private = true }}
component = "callee"

[[trigger.http]]
route = "/wild/..."
component = "wild"

[[trigger.http]]
route = "/denied/..."
component = "denied"

[component.caller]
source = "{wasm}"
key_value_stores = ["default"]
allowed_outbound_hosts = [
    "http://callee.spin.internal",
    "http://wild.spin.internal",
    "http://nope.spin.internal",
    "http://lonely.spin.internal",
]

[component.callee]
source = "{wasm}"
key_value_stores = ["default"]
[component.callee.variables]
who = "callee says {{{{ greeting }}}}"

[component.wild]
source = "{wasm}"
allowed_outbound_hosts = ["http://*.spin.internal"]

[component.denied]
source = "{wasm}"

[component.lonely]
source = "{wasm}"
"#,
        wasm = probe_wasm().display()
    );
    let path = dir.join("spin.toml");
    std::fs::write(&path, manifest).expect("write manifest");
    path
}

fn builder(dir: &TempDir) -> HostBuilder {
    HostBuilder::new(write_manifest(dir))
        .use_process_env(false)
        .kv(KvBackend::SqliteFile(dir.join("kv.db")))
}

fn fixture() -> (TempDir, Host) {
    let dir = TempDir::new("chain");
    let host = builder(&dir).build().expect("build host");
    (dir, host)
}

async fn get(host: &Host, uri: &str) -> RequestOutcome {
    let req = http::Request::get(uri).body(Vec::new()).unwrap();
    host.handle(req).await.expect("handle")
}

fn body_json(o: &RequestOutcome) -> Value {
    serde_json::from_slice(o.response.body()).unwrap_or_else(|e| {
        panic!(
            "body is not JSON ({e}): status {}, {:?}",
            o.response.status(),
            String::from_utf8_lossy(o.response.body())
        )
    })
}

/// `/<prefix>/http?url=<url>` plus extra query parameters.
fn via(prefix: &str, url: &str, extra: &str) -> String {
    format!("/{prefix}/http?url={}{extra}", enc(url))
}

/// Runs a probe `http` request and returns the outcome, the status the
/// probe got and the body it got, parsed as JSON.
async fn chain(host: &Host, uri: &str) -> (RequestOutcome, u64, Value) {
    let o = get(host, uri).await;
    assert_eq!(o.response.status(), 200, "{}", body_json(&o));
    let v = body_json(&o);
    let status = v["status"]
        .as_u64()
        .unwrap_or_else(|| panic!("no status: {v}"));
    let inner = serde_json::from_str(v["body"].as_str().unwrap()).expect("inner body is JSON");
    (o, status, inner)
}

fn denied(o: &RequestOutcome) -> bool {
    let v = body_json(o);
    v["err"]
        .as_str()
        .is_some_and(|e| e.contains("HttpRequestDenied"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_request_reaches_a_private_component() {
    let (_dir, host) = fixture();
    let target = "http://callee.spin.internal/deep/echo?a=1&b=two";
    let (o, status, seen) = chain(
        &host,
        &via(
            "probe",
            target,
            "&method=POST&body=hello&header=x-test:42&header=content-type:text/plain",
        ),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(o.component.as_deref(), Some("caller"));

    // Method, path, query, headers and body pass through.
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["uri"], target);
    assert_eq!(seen["path"], "/deep/echo");
    assert_eq!(seen["query"], "a=1&b=two");
    assert_eq!(seen["body"], "hello");
    let h = &seen["headers"];
    assert_eq!(h["x-test"], "42");
    assert_eq!(h["content-type"], "text/plain");
    // Spin removes Host from outbound requests, so the full URL is on
    // localhost; the match is the synthetic `/...` one.
    assert!(h.get("host").is_none(), "{h}");
    assert_eq!(h["spin-full-url"], "http://localhost/deep/echo?a=1&b=two");
    assert_eq!(h["spin-path-info"], "/deep/echo");
    assert_eq!(h["spin-matched-route"], "/...");
    assert_eq!(h["spin-raw-component-route"], "/...");
    assert_eq!(h["spin-component-route"], "");
    assert_eq!(h["spin-base-path"], "/");
    assert_eq!(h["spin-client-addr"], "0.0.0.0:0");

    assert_eq!(
        o.chained,
        vec![ChainedCall {
            caller: "caller".into(),
            component: "callee".into(),
            method: http::Method::POST,
            path: "/deep/echo".into(),
            query: Some("a=1&b=two".into()),
            status: 200,
            kv_ops: KvOpCounts::default(),
        }]
    );
    assert_eq!(o.response.headers()[KV_OPS_CHAINED_HEADER], "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_component_is_not_routable_from_outside() {
    let (_dir, host) = fixture();
    for path in ["/", "/echo", "/callee/echo", "/deep/echo"] {
        let o = get(&host, path).await;
        assert_eq!(o.response.status(), 404, "{path}");
        assert_eq!(o.component, None);
        assert!(o.chained.is_empty());
        assert!(o.response.headers().get(KV_OPS_CHAINED_HEADER).is_none());
    }
    // A client cannot pose as a chained request: Spin strips a
    // `*.spin.internal` Host header, and without a Host the request fails.
    let req = http::Request::get("/probe/echo")
        .header("host", "callee.spin.internal")
        .body(Vec::new())
        .unwrap();
    let err = host.handle(req).await.unwrap_err();
    assert!(format!("{err:#}").contains("no 'Host' header"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callee_kv_ops_are_counted_separately() {
    let (_dir, host) = fixture();
    let target = format!(
        "http://callee.spin.internal/kv?do={}&do={}&do={}&do={}",
        enc("open:wasi:default"),
        enc("wget:k"),
        enc("wset:k:callee"),
        enc("incr:n:1"),
    );
    let (o, status, seen) = chain(
        &host,
        &via(
            "probe",
            &target,
            &format!(
                "&do={}&do={}",
                enc("open:wasi:default"),
                enc("wset:k:caller")
            ),
        ),
    )
    .await;
    assert_eq!(status, 200);
    // The callee shares the `default` store and saw the caller's write.
    assert_eq!(seen[1]["ok"]["utf8"], "caller", "{seen}");
    assert_eq!(seen[3]["ok"], 1, "{seen}");

    assert_eq!(
        o.kv_ops,
        KvOpCounts {
            set: 1,
            ..Default::default()
        }
    );
    assert_eq!(o.chained.len(), 1);
    assert_eq!(
        o.chained[0].kv_ops,
        KvOpCounts {
            get: 1,
            set: 1,
            increment: 1,
            ..Default::default()
        }
    );
    assert_eq!(o.total_kv_ops().total(), 4);
    assert_eq!(o.chained_to("callee").count(), 1);
    let headers = o.response.headers();
    assert_eq!(headers["x-kv-ops"], "1");
    assert_eq!(headers["x-kv-ops-detail"], "set=1");
    assert_eq!(headers[KV_OPS_CHAINED_HEADER], "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callee_runs_with_its_own_permissions_and_variables() {
    let (_dir, host) = fixture();

    // `wild` has no key-value store; the callee it chains to does.
    let target = format!(
        "http://callee.spin.internal/kv?do={}&do={}",
        enc("open:wasi:default"),
        enc("wset:mine:1")
    );
    let o = get(
        &host,
        &via(
            "wild",
            &target,
            &format!("&do={}", enc("open:wasi:default")),
        ),
    )
    .await;
    let v = body_json(&o);
    assert_eq!(v["kv"][0]["err"], "access-denied", "{v}");
    let inner: Value = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
    assert_eq!(inner[1]["ok"], true, "{inner}");
    assert_eq!(o.kv_ops.total(), 0);
    assert_eq!(o.chained[0].kv_ops.set, 1);

    // Component variables are the callee's.
    let (_, _, seen) = chain(
        &host,
        &via("probe", "http://callee.spin.internal/var?name=who", ""),
    )
    .await;
    assert_eq!(seen, json!({ "ok": "callee says hi" }));
    let o = get(&host, "/probe/var?name=who").await;
    assert!(body_json(&o)["err"].is_string(), "the caller has no `who`");

    // The callee's own allowed_outbound_hosts (none) apply to its requests.
    let nested = format!(
        "http://callee.spin.internal/http?url={}",
        enc("http://callee.spin.internal/echo")
    );
    let (o, status, seen) = chain(&host, &via("probe", &nested, "")).await;
    assert_eq!(status, 200);
    assert!(
        seen["err"].as_str().unwrap().contains("HttpRequestDenied"),
        "{seen}"
    );
    assert_eq!(o.chained.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaining_must_be_allowed() {
    let (_dir, host) = fixture();
    // No allowed_outbound_hosts at all.
    let o = get(
        &host,
        &via("denied", "http://callee.spin.internal/echo", ""),
    )
    .await;
    assert!(denied(&o), "{}", body_json(&o));
    assert!(o.chained.is_empty());
    // Scheme and port are part of the allowed entry.
    for url in [
        "https://callee.spin.internal/echo",
        "http://callee.spin.internal:8080/echo",
        // Not allowed: denied before the (unknown) target matters.
        "http://release.spin.internal/echo",
    ] {
        let o = get(&host, &via("probe", url, "")).await;
        assert!(denied(&o), "{url}: {}", body_json(&o));
        assert!(o.chained.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_or_untriggered_target_traps_the_caller() {
    let (_dir, host) = fixture();
    for uri in [
        // Allowed, but no such component.
        via("probe", "http://nope.spin.internal/echo", ""),
        // Allowed, a component, but without an HTTP trigger.
        via("probe", "http://lonely.spin.internal/echo", ""),
        via("wild", "http://nope.spin.internal/echo", ""),
        // Allowed (hosts match lower-cased) but ids are case-sensitive.
        via("wild", "http://Callee.spin.internal/echo", ""),
    ] {
        let o = get(&host, &uri).await;
        assert_eq!(o.response.status(), 500, "{uri}");
        assert!(o.response.body().is_empty(), "{uri}");
        assert!(
            matches!(o.component.as_deref(), Some("caller" | "wild")),
            "{uri}"
        );
        assert!(o.chained.is_empty(), "{uri}");
    }
    // The host is fine afterwards.
    let (_, status, _) = chain(&host, &via("wild", "http://callee.spin.internal/echo", "")).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_chaining_and_public_targets() {
    let (_dir, host) = fixture();
    // caller -> wild (a public component, chained to by id) -> callee.
    let inner = "http://callee.spin.internal/echo";
    let middle = format!("http://wild.spin.internal/wild/http?url={}", enc(inner));
    let (o, status, seen) = chain(&host, &via("probe", &middle, "")).await;
    assert_eq!(status, 200);
    assert_eq!(seen["status"], 200, "{seen}");
    let calls: Vec<(&str, &str, &str)> = o
        .chained
        .iter()
        .map(|c| (c.caller.as_str(), c.component.as_str(), c.path.as_str()))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("wild", "callee", "/echo"),
            ("caller", "wild", "/wild/http"),
        ],
        "completion order: the nested call first"
    );

    // A public target sees the chained form of the URL: the path info is
    // the whole path, not relative to its `/wild/...` route.
    let (_, _, chained) = chain(
        &host,
        &via("probe", "http://wild.spin.internal/wild/x/headers", ""),
    )
    .await;
    let routed = body_json(&get(&host, "/wild/x/headers").await);
    assert_eq!(chained["spin-path-info"], "/wild/x/headers");
    assert_eq!(chained["spin-matched-route"], "/...");
    assert_eq!(routed["spin-path-info"], "/x/headers");
    assert_eq!(routed["spin-matched-route"], "/wild/...");
    assert_eq!(routed["spin-full-url"], "http://localhost/wild/x/headers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_chained_calls() {
    let (_dir, host) = fixture();
    let target = format!(
        "http://callee.spin.internal/kv?do={}&do={}",
        enc("open:wasi:default"),
        enc("incr:fan:1")
    );

    // One request, eight chained calls in flight at once.
    let query: Vec<String> = (0..8).map(|_| format!("url={}", enc(&target))).collect();
    let o = get(&host, &format!("/probe/fanout?{}", query.join("&"))).await;
    assert_eq!(o.response.status(), 200);
    let Value::Array(results) = body_json(&o) else {
        panic!("not an array")
    };
    let mut seen: Vec<i64> = results
        .iter()
        .map(|r| {
            assert_eq!(r["status"], 200, "{r}");
            let inner: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
            inner[1]["ok"].as_i64().unwrap()
        })
        .collect();
    seen.sort();
    assert_eq!(seen, (1..=8).collect::<Vec<_>>());
    assert_eq!(o.chained.len(), 8);
    assert!(o
        .chained
        .iter()
        .all(|c| c.kv_ops.increment == 1 && c.kv_ops.total() == 1));
    assert_eq!(o.kv_ops.total(), 0);
    assert_eq!(o.response.headers()[KV_OPS_CHAINED_HEADER], "8");

    // Sixteen requests at once, each chaining once: every outcome has
    // exactly its own chained call.
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let host = host.clone();
        let uri = via("probe", &target, "");
        tasks.push(tokio::spawn(async move {
            let (o, status, seen) = chain(&host, &uri).await;
            assert_eq!(status, 200);
            assert_eq!(o.chained.len(), 1);
            assert_eq!(o.chained[0].kv_ops.increment, 1);
            seen[1]["ok"].as_i64().unwrap()
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap());
    }
    seen.sort();
    assert_eq!(seen, (9..=24).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_counts_over_tcp() {
    let (_dir, host) = fixture();
    let server = host.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let target = format!(
        "http://callee.spin.internal/kv?do={}&do={}",
        enc("open:wasi:default"),
        enc("wset:t:1")
    );
    let (status, headers, body) = common::http_get(
        server.local_addr(),
        &via(
            "probe",
            &target,
            &format!("&do={}", enc("open:wasi:default")),
        ),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["x-kv-ops"], "0");
    assert_eq!(headers[KV_OPS_CHAINED_HEADER], "1");
    server.shutdown().await.unwrap();
}

#[test]
fn selective_deployment_checks_chaining_targets() {
    let dir = TempDir::new("chain-retain");
    let err = builder(&dir)
        .retain_components(["caller"])
        .build()
        .unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        "Selected component 'caller' cannot use service chaining to unselected component: allowed_outbound_hosts = [\"http://callee.spin.internal\"]"
    );
    let err = builder(&dir)
        .retain_components(["wild", "callee"])
        .build()
        .unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        "Selected component 'wild' cannot use wildcard service chaining: allowed_outbound_hosts = [\"http://*.spin.internal\"]"
    );
    assert!(builder(&dir)
        .retain_components(["callee", "denied"])
        .build()
        .is_ok());
}
