//! End-to-end: the project's own spin.toml, GET /healthz through the real
//! `fn-healthz` component (build the components with `cargo build-wasm`).

mod common;

use common::workspace_root;
use metal_ipam_host::{HostBuilder, KvBackend};

fn project_host() -> metal_ipam_host::Host {
    // Fail early with a build hint if the components are missing.
    for file in [
        "fn_healthz.wasm",
        "fn_pools.wasm",
        "fn_allocate.wasm",
        "fn_release.wasm",
    ] {
        common::wasm_artifact(file, "cargo build-wasm");
    }
    HostBuilder::new(workspace_root().join("spin.toml"))
        .use_process_env(false)
        .kv(KvBackend::Memory)
        .variable("api_token", "test-token")
        .build()
        .expect("the project's spin.toml loads")
}

#[tokio::test]
async fn healthz_in_process() {
    let host = project_host();
    let req = http::Request::get("/healthz").body(Vec::new()).unwrap();
    let outcome = host.handle(req).await.unwrap();
    assert_eq!(outcome.response.status(), 200);
    assert_eq!(outcome.component.as_deref(), Some("healthz"));
    assert_eq!(
        outcome.response.headers()["content-type"],
        "application/json"
    );
    let body: serde_json::Value = serde_json::from_slice(outcome.response.body()).unwrap();
    assert_eq!(body["status"], "ok");
    assert_eq!(outcome.kv_ops.total(), 0);
    assert_eq!(outcome.response.headers()["x-kv-ops"], "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_over_http() {
    let host = project_host();
    let server = host.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (status, headers, body) = common::http_get(server.local_addr(), "/healthz").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["x-kv-ops"], "0");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["status"], "ok");
    let (status, _, _) = common::http_get(server.local_addr(), "/no/such/route").await;
    assert_eq!(status, 404);
    server.shutdown().await.unwrap();
}

#[test]
fn selective_deployment_keeps_only_named_components() {
    common::wasm_artifact("fn_healthz.wasm", "cargo build-wasm -p fn-healthz");
    let host = HostBuilder::new(workspace_root().join("spin.toml"))
        .use_process_env(false)
        .kv(KvBackend::Memory)
        .variable("api_token", "t")
        .retain_components(["healthz"])
        .build()
        .unwrap();
    let routes: Vec<&str> = host
        .router()
        .routes()
        .iter()
        .map(|r| r.raw_route())
        .collect();
    assert_eq!(routes, vec!["/healthz"]);
    let err = HostBuilder::new(workspace_root().join("spin.toml"))
        .retain_components(["nope"])
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("nope"));
}
