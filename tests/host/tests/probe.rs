//! End-to-end tests through a real component: the probe
//! (`tests/host/probe`, build it with
//! `cargo build --target wasm32-wasip2 --release -p metal-ipam-host-probe`).

mod common;

use common::{kv_uri, start_fake_upstream, write_probe_manifest, TempDir};
use metal_ipam_host::{Host, HostBuilder, KvBackend, KvOpCounts, RequestOutcome};
use serde_json::{json, Value};

struct Fixture {
    _dir: TempDir,
    dir_path: std::path::PathBuf,
    host: Host,
}

fn builder(dir: &TempDir, upstream: &str) -> HostBuilder {
    let manifest = write_probe_manifest(dir.path(), upstream);
    HostBuilder::new(manifest)
        .use_process_env(false)
        .kv(KvBackend::SqliteFile(dir.join("default.db")))
        .runtime_config_file(dir.join("runtime-config.toml"))
        .variable("secret_token", "s3cr3t")
}

fn fixture(upstream: &str) -> Fixture {
    let dir = TempDir::new("probe");
    let host = builder(&dir, upstream).build().expect("build host");
    Fixture {
        dir_path: dir.path().to_path_buf(),
        _dir: dir,
        host,
    }
}

async fn get(host: &Host, uri: &str) -> RequestOutcome {
    let req = http::Request::get(uri).body(Vec::new()).unwrap();
    host.handle(req).await.expect("handle")
}

fn body_json(o: &RequestOutcome) -> Value {
    serde_json::from_slice(o.response.body()).unwrap_or_else(|e| {
        panic!(
            "body is not JSON ({e}): {:?}",
            String::from_utf8_lossy(o.response.body())
        )
    })
}

/// Runs KV ops and returns (per-op results, counts, status).
async fn kv(host: &Host, ops: &[&str]) -> (Vec<Value>, KvOpCounts) {
    let o = get(host, &kv_uri(ops)).await;
    assert_eq!(
        o.response.status(),
        200,
        "{:?}",
        String::from_utf8_lossy(o.response.body())
    );
    let Value::Array(results) = body_json(&o) else {
        panic!("not an array")
    };
    (results, o.kv_ops)
}

fn ok(v: &Value) -> &Value {
    v.get("ok").unwrap_or_else(|| panic!("op failed: {v}"))
}

fn utf8(v: &Value) -> Option<&str> {
    v.get("utf8").and_then(|s| s.as_str())
}

#[tokio::test]
async fn variables_are_scoped_and_templated() {
    let f = fixture("127.0.0.1:9");
    let var = |name: &'static str| {
        let host = f.host.clone();
        async move { body_json(&get(&host, &format!("/probe/var?name={name}")).await) }
    };
    assert_eq!(var("token").await, json!({ "ok": "Bearer s3cr3t" }));
    assert_eq!(var("greeting").await, json!({ "ok": "hello, world" }));
    // An application variable not listed for the component is undefined.
    let v = var("secret_token").await;
    assert!(
        v["err"]
            .as_str()
            .unwrap()
            .contains("Undefined(\"no variable for \\\"probe\\\".\\\"secret_token\\\"\")"),
        "{v}"
    );
    let v = var("Not-Valid").await;
    assert!(v["err"].as_str().unwrap().contains("InvalidName("), "{v}");
    // The bare component has no variables at all.
    let v = body_json(&get(&f.host, "/bare/var?name=token").await);
    assert!(v["err"].as_str().unwrap().contains("Undefined("), "{v}");
}

#[tokio::test]
async fn variable_precedence_reaches_the_component() {
    let dir = TempDir::new("probe-vars");
    let host = builder(&dir, "127.0.0.1:9")
        .env_var("SPIN_VARIABLE_GREETING", "from-env")
        .build()
        .unwrap();
    assert_eq!(
        body_json(&get(&host, "/probe/var?name=greeting").await),
        json!({ "ok": "from-env, world" })
    );
    let host = builder(&dir, "127.0.0.1:9")
        .env_var("SPIN_VARIABLE_GREETING", "from-env")
        .variable("greeting", "from-cli")
        .build()
        .unwrap();
    assert_eq!(
        body_json(&get(&host, "/probe/var?name=greeting").await),
        json!({ "ok": "from-cli, world" })
    );

    let err = HostBuilder::new(dir.join("spin.toml"))
        .use_process_env(false)
        .kv(KvBackend::Memory)
        .build()
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("secret_token") && msg.contains("SPIN_VARIABLE_SECRET_TOKEN"),
        "{msg}"
    );
}

#[tokio::test]
async fn spin_headers_reach_the_component() {
    let f = fixture("127.0.0.1:9");
    let req = http::Request::get("http://example.test:8080/items/42/headers?x=1&y=%20")
        .header("x-custom", "kept")
        .body(Vec::new())
        .unwrap();
    let o = f.host.handle(req).await.unwrap();
    assert_eq!(o.component.as_deref(), Some("probe"));
    let h = body_json(&o);
    assert_eq!(
        h["spin-full-url"],
        "http://example.test:8080/items/42/headers?x=1&y=%20"
    );
    assert_eq!(h["spin-path-info"], "/headers");
    assert_eq!(h["spin-matched-route"], "/items/:id/...");
    assert_eq!(h["spin-raw-component-route"], "/items/:id/...");
    assert_eq!(h["spin-component-route"], "/items/:id");
    assert_eq!(h["spin-base-path"], "/");
    assert_eq!(h["spin-client-addr"], "127.0.0.1:0");
    assert_eq!(h["spin-path-match-id"], "42");
    assert_eq!(h["x-custom"], "kept");

    let o = get(&f.host, "/nothing/here").await;
    assert_eq!(o.response.status(), 404);
    assert_eq!(o.component, None);
    assert_eq!(o.response.headers()["x-kv-ops"], "0");
    let o = get(&f.host, "/.well-known/spin/health").await;
    assert_eq!(o.response.body(), b"OK");
}

#[tokio::test]
async fn kv_basic_ops_and_counting() {
    let f = fixture("127.0.0.1:9");
    let (r, counts) = kv(
        &f.host,
        &[
            "open:spin:default",
            "set:a:1",
            "get:a",
            "exists:a",
            "keys",
            "open:wasi:default",
            "wset:b:2",
            "wget:b",
            "wlist",
            "getmany:a,b,missing",
            "setmany:c=3,d=4",
            "delmany:c,d",
            "delete:a",
            "wexists:a",
            "wdelete:b",
        ],
    )
    .await;
    assert_eq!(utf8(ok(&r[2])), Some("1"));
    assert_eq!(ok(&r[3]), &json!(true));
    assert_eq!(ok(&r[4]), &json!(["a"]));
    assert_eq!(utf8(ok(&r[7])), Some("2"));
    assert_eq!(ok(&r[8]), &json!({ "keys": ["a", "b"], "cursor": null }));
    // get-many omits absent keys (Spin's SQLite backend).
    assert_eq!(ok(&r[9]).as_array().unwrap().len(), 2);
    assert_eq!(ok(&r[13]), &json!(false));
    assert_eq!(
        counts,
        KvOpCounts {
            get: 2,
            set: 2,
            delete: 2,
            exists: 2,
            get_keys: 2,
            get_many: 1,
            set_many: 1,
            delete_many: 1,
            ..Default::default()
        }
    );
    // The headers agree with the in-process counts.
    let o = get(&f.host, &kv_uri(&["open:spin:default", "get:x", "get:y"])).await;
    assert_eq!(o.response.headers()["x-kv-ops"], "2");
    assert_eq!(o.response.headers()["x-kv-ops-detail"], "get=2");
    // A cursor is an error, as on Spin.
    let (r, _) = kv(&f.host, &["open:wasi:default", "wlistc:abc"]).await;
    assert!(
        r[1]["err"]
            .as_str()
            .unwrap()
            .contains("cursor not supported"),
        "{}",
        r[1]
    );
}

#[tokio::test]
async fn cas_semantics_through_wasm() {
    let f = fixture("127.0.0.1:9");
    // Two create-if-absent swaps on an absent key both succeed (upsert).
    let (r, counts) = kv(
        &f.host,
        &[
            "open:wasi:default",
            "cas:lease:a",
            "cas:lease:b",
            "wget:lease",
        ],
    )
    .await;
    assert_eq!(ok(&r[1]), &json!({ "swapped": true, "seen": null }));
    assert_eq!(
        ok(&r[2]),
        &json!({ "swapped": true, "seen": { "utf8": "a", "len": 1 } })
    );
    assert_eq!(utf8(ok(&r[3])), Some("b"));
    assert_eq!((counts.cas_current, counts.cas_swap), (2, 2));
    // Blind swap (no current) overwrites.
    let (r, counts) = kv(
        &f.host,
        &["open:wasi:default", "blindcas:lease:c", "wget:lease"],
    )
    .await;
    assert_eq!(ok(&r[1])["swapped"], true);
    assert_eq!(utf8(ok(&r[2])), Some("c"));
    assert_eq!((counts.cas_current, counts.cas_swap), (0, 1));
    // A value changed between current and swap: cas-failed with a fresh
    // handle that has already read the new value; the retry succeeds.
    let (r, counts) = kv(
        &f.host,
        &[
            "open:wasi:default",
            "casrace:lease:intruder:mine",
            "wget:lease",
        ],
    )
    .await;
    assert_eq!(
        ok(&r[1]),
        &json!({
            "first_swap": "cas-failed",
            "seen": { "utf8": "c", "len": 1 },
            "fresh_seen": { "utf8": "intruder", "len": 8 },
            "retry": "succeeded"
        })
    );
    assert_eq!(utf8(ok(&r[2])), Some("mine"));
    assert_eq!(
        counts,
        KvOpCounts {
            set: 1,
            get: 1,
            cas_current: 2,
            cas_swap: 2,
            ..Default::default()
        }
    );
}

#[tokio::test]
async fn increment_encoding_and_trap() {
    let f = fixture("127.0.0.1:9");
    let (r, _) = kv(
        &f.host,
        &["open:wasi:default", "incr:n:1", "incr:n:41", "wget:n"],
    )
    .await;
    assert_eq!(ok(&r[1]), &json!(1));
    assert_eq!(ok(&r[2]), &json!(42));
    // 42 as an 8-byte little-endian i64.
    assert_eq!(
        ok(&r[3]),
        &json!({ "utf8": "*\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}", "len": 8 })
    );

    // A non-8-byte value: Spin panics host-side; here the request traps (500)
    // and nothing is written.
    kv(&f.host, &["open:spin:default", "set:bad:abc"]).await;
    let o = get(&f.host, &kv_uri(&["open:wasi:default", "incr:bad:1"])).await;
    assert_eq!(o.response.status(), 500);
    assert!(o.response.body().is_empty());
    assert_eq!(o.kv_ops.increment, 1);
    assert_eq!(o.response.headers()["x-kv-ops-detail"], "increment=1");
    let store = f
        .host
        .kv_stores()
        .open(&["default".to_string()].into_iter().collect(), "default")
        .await
        .unwrap();
    assert_eq!(store.get("bad").await.unwrap(), Some(b"abc".to_vec()));
    // The host keeps serving.
    let (r, _) = kv(&f.host, &["open:wasi:default", "incr:n:1"]).await;
    assert_eq!(ok(&r[1]), &json!(43));
}

/// The Redis backend through a real component: Spin 3.6's replies (decimal
/// counters, swaps reported per mode, labels sharing one keyspace) and the
/// same `x-kv-ops` counting as on SQLite.
#[tokio::test]
async fn redis_backend_through_wasm_and_its_kv_op_counts() {
    use metal_ipam_host::test_redis::TestRedis;
    use metal_ipam_host::RedisSwap;
    let Some(redis) = TestRedis::get("redis_backend_through_wasm_and_its_kv_op_counts") else {
        return;
    };
    for mode in [RedisSwap::Spin36, RedisSwap::ExecReply] {
        let url = redis.fresh_db(10);
        let dir = TempDir::new("probe-redis");
        let manifest = write_probe_manifest(dir.path(), "127.0.0.1:9");
        // Both labels on one URL: one keyspace, as on Spin.
        std::fs::write(
            dir.join("runtime-config.toml"),
            format!(
                "[key_value_store.default]\ntype = \"redis\"\nurl = \"{url}\"\n\n[key_value_store.extra]\ntype = \"redis\"\nurl = \"{url}\"\n"
            ),
        )
        .unwrap();
        let host = HostBuilder::new(manifest)
            .use_process_env(false)
            .runtime_config_file(dir.join("runtime-config.toml"))
            .redis_swap(mode)
            .variable("secret_token", "s3cr3t")
            .build()
            .expect("build host");
        let o = get(
            &host,
            &kv_uri(&[
                "open:wasi:default",
                "wset:a:1",
                "wget:a",
                "incr:n:5",
                "wget:n",
                "cas:a:2",
                "wget:a",
                "casrace:a:intruder:mine",
                "wget:a",
                "open:wasi:extra",
                "wget:a",
            ]),
        )
        .await;
        assert_eq!(o.response.status(), 200, "{mode:?}");
        let Value::Array(r) = body_json(&o) else {
            panic!("not an array")
        };
        assert_eq!(utf8(ok(&r[2])), Some("1"));
        assert_eq!(ok(&r[3]), &json!(5));
        assert_eq!(utf8(ok(&r[4])), Some("5"), "INCRBY keeps decimal text");
        assert_eq!(utf8(ok(&r[6])), Some("2"), "the uncontended swap applied");
        let seen = |s: &str| json!({ "utf8": s, "len": s.len() });
        match mode {
            RedisSwap::Spin36 => {
                assert_eq!(ok(&r[5]), &json!({ "swapped": false, "seen": seen("1") }));
                assert_eq!(
                    ok(&r[7]),
                    &json!({
                        "first_swap": "cas-failed",
                        "seen": seen("2"),
                        "fresh_seen": seen("intruder"),
                        "retry": "cas-failed"
                    })
                );
                assert_eq!(utf8(ok(&r[8])), Some("mine"), "the retry applied");
            }
            RedisSwap::ExecReply => {
                assert_eq!(ok(&r[5]), &json!({ "swapped": true, "seen": seen("1") }));
                assert_eq!(
                    ok(&r[7]),
                    &json!({ "first_swap": "succeeded", "seen": seen("2") }),
                    "the aborted swap reads as a success"
                );
                assert_eq!(utf8(ok(&r[8])), Some("intruder"), "nothing applied");
            }
        }
        assert_eq!(r[10], r[8], "label extra shares the keyspace");
        let (cas_ops, total) = match mode {
            RedisSwap::Spin36 => (3, 14),
            RedisSwap::ExecReply => (2, 12),
        };
        assert_eq!(
            o.kv_ops,
            KvOpCounts {
                get: 5,
                set: 2,
                increment: 1,
                cas_current: cas_ops,
                cas_swap: cas_ops,
                ..Default::default()
            },
            "{mode:?}"
        );
        assert_eq!(o.response.headers()["x-kv-ops"], total.to_string().as_str());
        assert_eq!(
            o.response.headers()["x-kv-ops-detail"],
            format!("get=5,set=2,increment=1,cas.current={cas_ops},cas.swap={cas_ops}").as_str()
        );
    }
}

#[tokio::test]
async fn store_labels_are_allow_listed() {
    let f = fixture("127.0.0.1:9");
    let (r, _) = kv(
        &f.host,
        &[
            "open:spin:extra",
            "set:k:x",
            "open:wasi:extra",
            "wget:k",
            "open:spin:other",
            "open:wasi:other",
        ],
    )
    .await;
    assert_eq!(utf8(ok(&r[3])), Some("x"));
    assert_eq!(r[4]["err"], "access-denied");
    assert_eq!(r[5]["err"], "access-denied");
    // The extra label lives in the runtime-config file, not in the default file.
    assert!(f.dir_path.join("extra.db").exists());
    let (r, _) = kv(&f.host, &["open:spin:default", "get:k"]).await;
    assert_eq!(ok(&r[1]), &Value::Null);
    // A component without key_value_stores may open nothing.
    let o = get(
        &f.host,
        &kv_uri(&["open:spin:default", "open:wasi:default"]).replace("/probe/", "/bare/"),
    )
    .await;
    let Value::Array(r) = body_json(&o) else {
        panic!()
    };
    assert_eq!(r[0]["err"], "access-denied");
    assert_eq!(r[1]["err"], "access-denied");
}

#[tokio::test]
async fn undefined_store_label_is_a_startup_error() {
    let dir = TempDir::new("probe-label");
    let manifest = write_probe_manifest(dir.path(), "127.0.0.1:9");
    // Without the runtime config, label "extra" is undefined.
    let err = HostBuilder::new(manifest)
        .use_process_env(false)
        .kv(KvBackend::Memory)
        .variable("secret_token", "x")
        .build()
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("unknown key_value_stores label \"extra\""),
        "{err:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_http_is_restricted_to_allowed_hosts() {
    let upstream = start_fake_upstream().await;
    let other = start_fake_upstream().await;
    let f = fixture(&upstream.to_string());

    let o = get(
        &f.host,
        &format!(
            "/probe/http?url={}",
            common::enc(&format!("http://{upstream}/ping"))
        ),
    )
    .await;
    assert_eq!(
        body_json(&o),
        json!({ "status": 200, "body": "pong /ping" })
    );

    // Another port on the same host is not allowed.
    let o = get(
        &f.host,
        &format!(
            "/probe/http?url={}",
            common::enc(&format!("http://{other}/ping"))
        ),
    )
    .await;
    let v = body_json(&o);
    assert!(
        v["err"].as_str().unwrap().contains("HttpRequestDenied"),
        "{v}"
    );

    // The bare component has no allowed hosts at all.
    let o = get(
        &f.host,
        &format!(
            "/bare/http?url={}",
            common::enc(&format!("http://{upstream}/ping"))
        ),
    )
    .await;
    let v = body_json(&o);
    assert!(
        v["err"].as_str().unwrap().contains("HttpRequestDenied"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_over_tcp_and_shuts_down() {
    let f = fixture("127.0.0.1:9");
    let server = f.host.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = server.local_addr();
    let (status, headers, body) = common::http_get(addr, "/items/7/headers").await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-kv-ops"], "0");
    let h: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(h["spin-full-url"], format!("http://{addr}/items/7/headers"));
    assert_eq!(h["spin-path-match-id"], "7");
    assert!(h["spin-client-addr"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));

    let (status, headers, _) =
        common::http_get(addr, &kv_uri(&["open:wasi:default", "incr:c:5"])).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-kv-ops-detail"], "increment=1");

    server.shutdown().await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed after shutdown"
    );
}

/// Many concurrent requests on one host: every request gets its own
/// instance and its own counts; increments are not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_share_the_host() {
    let f = fixture("127.0.0.1:9");
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let host = f.host.clone();
        tasks.push(tokio::spawn(async move {
            let (r, counts) = kv(
                &host,
                &["open:wasi:default", "incr:shared:1", "wget:shared"],
            )
            .await;
            assert_eq!(
                counts,
                KvOpCounts {
                    increment: 1,
                    get: 1,
                    ..Default::default()
                }
            );
            r[1]["ok"].as_i64().unwrap()
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap());
    }
    seen.sort();
    assert_eq!(seen, (1..=32).collect::<Vec<_>>());
}
