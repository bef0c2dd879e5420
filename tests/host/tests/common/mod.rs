//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "metal-ipam-host-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The workspace root (`/work/main`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                workspace_root().join(d)
            }
        }
        None => workspace_root().join("target"),
    }
}

/// Path of a release wasm32-wasip2 artifact, or a panic explaining how to
/// build it.
pub fn wasm_artifact(file: &str, build_hint: &str) -> PathBuf {
    let path = target_dir().join("wasm32-wasip2/release").join(file);
    if !path.exists() {
        panic!(
            "{} not found. Build it first, from {}:\n    {build_hint}",
            path.display(),
            workspace_root().display()
        );
    }
    path
}

/// The probe component (tests/host/probe).
pub fn probe_wasm() -> PathBuf {
    wasm_artifact(
        "metal_ipam_host_probe.wasm",
        "cargo build --target wasm32-wasip2 --release -p metal-ipam-host-probe   (or: cargo build-wasm)",
    )
}

/// Writes a manifest running the probe into `dir` and returns its path.
///
/// Components: `probe` (stores `default` and `extra`, may call
/// `http://{{ upstream }}`, variables `token`, `greeting`), and `bare`
/// (the same wasm with no stores, hosts or variables).
pub fn write_probe_manifest(dir: &Path, upstream: &str) -> PathBuf {
    let wasm = probe_wasm();
    let manifest = format!(
        r#"spin_manifest_version = 2
[application]
name = "probe-app"
version = "9.9.9"

[variables]
secret_token = {{ required = true, secret = true }}
greeting = {{ default = "hello" }}
upstream = {{ default = "{upstream}" }}

[[trigger.http]]
route = "/probe/..."
component = "probe"

[[trigger.http]]
route = "/items/:id/..."
component = "probe"

[[trigger.http]]
route = "/bare/..."
component = "bare"

[component.probe]
source = "{wasm}"
key_value_stores = ["default", "extra"]
allowed_outbound_hosts = ["http://{{{{ upstream }}}}"]
[component.probe.variables]
token = "Bearer {{{{ secret_token }}}}"
greeting = "{{{{ greeting }}}}, world"

[component.bare]
source = "{wasm}"
"#,
        wasm = wasm.display()
    );
    let path = dir.join("spin.toml");
    std::fs::write(&path, manifest).expect("write manifest");
    std::fs::write(
        dir.join("runtime-config.toml"),
        "[key_value_store.extra]\ntype = \"spin\"\npath = \"extra.db\"\n",
    )
    .expect("write runtime config");
    path
}

/// Percent-encodes a query value.
pub fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `/probe/kv?do=op1&do=op2...`
pub fn kv_uri(ops: &[&str]) -> String {
    let q: Vec<String> = ops.iter().map(|o| format!("do={}", enc(o))).collect();
    format!("/probe/kv?{}", q.join("&"))
}

/// Starts a loopback HTTP/1 server answering `pong <path>` to everything.
pub async fn start_fake_upstream() -> SocketAddr {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake upstream");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let body = format!("pong {}", req.uri().path());
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from(body),
                        )))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Sends a GET over TCP with a fresh connection and returns status,
/// headers and body.
pub async fn http_get(addr: SocketAddr, path_and_query: &str) -> (u16, http::HeaderMap, Vec<u8>) {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::get(path_and_query)
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("send");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    (status, headers, body)
}
