//! The app as SpinKube receives it: `spin registry push` of the repository's
//! `spin.toml` with the release `.wasm` files already built (no `--build`)
//! to a real OCI registry (Debian's `docker-registry`, started here on a
//! free loopback port), the artifact read back and checked against the
//! files on disk, then `spin up --from <reference>` pulling it from that
//! registry and serving the smoke test: a pool, a claim, its release.
//!
//! Runs on the Spin CLI named by `SPIN_BIN` (`.ci/run`: 3.6.3 in
//! `tests/run`, 4.0.2 in its Spin 4 step, which selects `spin_sqlite::`).
//! Without `SPIN_BIN` it returns at once; without `docker-registry` it
//! skips with a note, and fails under CI (`CI` set). docs/publish.md says
//! what a user runs to publish their own.

use std::time::Instant;

use metal_ipam_tests::harness::{claim_json, pool_json, require_wasm, App, Runtime, TempDir};
use metal_ipam_tests::oci_registry::{check_spin_artifact, require_registry_program, Registry};
use metal_ipam_tests::real_spin::{AppSource, SpinBin};
use metal_ipam_tests::schema::repo_root;
use serde_json::json;

/// The repository the app is pushed to, as in docs/publish.md.
const REPOSITORY: &str = "metal-ipam";

mod spin_sqlite {
    /// On Spin's SQLite store, as the other real-Spin tests run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn pushed_app_serves_from_registry() {
        super::pushed_app_serves_from_registry().await;
    }
}

async fn pushed_app_serves_from_registry() {
    let Some(bin) = SpinBin::from_env() else {
        return;
    };
    let Some(program) = require_registry_program() else {
        return;
    };
    require_wasm();
    let registry = Registry::start(&program)
        .await
        .unwrap_or_else(|e| panic!("the registry: {e:#}"));
    let manifest = repo_root().join("spin.toml");
    let app: toml::Table = toml::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    let tag = app["application"]["version"].as_str().expect("app version");
    let reference = format!("{}/{REPOSITORY}:{tag}", registry.host);

    // Push what is on disk: plain HTTP needs --insecure on 3.x and 4.x.
    let push_cache = TempDir::new("push");
    let started = Instant::now();
    let pushed = bin
        .registry_push(&manifest, &reference, true, push_cache.path())
        .unwrap_or_else(|e| panic!("{e:#}\n{}", registry.log_tail()));
    let push_time = started.elapsed();

    // The artifact is the build: every .wasm layer and the locked app's
    // component digests are the files spin.toml names.
    let artifact = check_spin_artifact(&registry, REPOSITORY, tag, &manifest)
        .await
        .unwrap_or_else(|e| panic!("{} pushed {reference}: {e:#}", bin.version));
    assert_eq!(
        artifact.manifest_digest, pushed,
        "the digest Spin reported is the manifest the registry serves"
    );
    assert_eq!(artifact.components.len(), 15, "{:?}", artifact.components);
    // The check can fail: the same artifact against a spin.toml whose
    // healthz names another file is refused.
    let other = TempDir::new("other-build");
    let release = repo_root().join("target/wasm32-wasip2/release/");
    let text = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace(
            "\"target/wasm32-wasip2/release/",
            &format!("\"{}", release.display()),
        )
        .replace("fn_healthz.wasm", "fn_ui.wasm");
    std::fs::write(other.path().join("spin.toml"), text).unwrap();
    let refused = check_spin_artifact(&registry, REPOSITORY, tag, &other.path().join("spin.toml"))
        .await
        .expect_err("a build that is not the pushed one");
    assert!(
        format!("{refused:#}").contains("not the files on disk"),
        "{refused:#}"
    );

    // Serve it from the registry, pinned by digest as a SpinApp would be.
    let pinned = format!("{}/{REPOSITORY}@{pushed}", registry.host);
    let started = Instant::now();
    let app = App::on_from(
        Runtime::SpinSqlite,
        &AppSource::Registry {
            reference: pinned.clone(),
            insecure: true,
        },
        &[],
        &[],
    )
    .await
    .expect("SPIN_BIN is set");
    let up_time = started.elapsed();
    eprintln!(
        "{}: registry push {:.2} s ({} components, {} KB of .wasm); first spin up --from {pinned}: serving in {:.2} s",
        bin.version,
        push_time.as_secs_f64(),
        artifact.components.len(),
        artifact.wasm_bytes / 1024,
        up_time.as_secs_f64()
    );
    // What Spin runs came from the registry: its pull cache holds every
    // component's .wasm by digest.
    let pulled = app.spin().expect("real Spin").registry_cache();
    for (id, digest) in &artifact.components {
        assert!(
            pulled.join("registry/wasm").join(digest).is_file(),
            "component {id}: {digest} not pulled into {}",
            pulled.display()
        );
    }

    // The smoke test: a pool, a claim, its release.
    let r = app
        .call(
            "PUT",
            "/v1/pools/team-a/p",
            Some(&pool_json("team-a", "p", &["10.30.0.10-10.30.0.11"], 24)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let claim = claim_json("team-a", "m-0", "uid-0", "p");
    let r = app.call("POST", "/v1/claims", Some(&claim)).await;
    assert_eq!(
        (r.status, r.body["spec"]["address"].as_str()),
        (201, Some("10.30.0.10")),
        "{}",
        r.body
    );
    assert_eq!(r.body["kind"], "IPAddress");
    let pool = app.call("GET", "/v1/pools/team-a/p", None).await;
    assert_eq!(pool.body["status"]["ipAddresses"]["used"], json!(1));
    let r = app.call("DELETE", "/v1/claims/team-a/m-0", None).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let r = app.call("GET", "/v1/claims/team-a/m-0", None).await;
    assert_eq!((r.status, r.reason()), (404, "ClaimNotFound"));
    let pool = app.call("GET", "/v1/pools/team-a/p", None).await;
    assert_eq!(pool.body["status"]["ipAddresses"]["used"], json!(0));
    drop(app);
    drop(registry);
}
