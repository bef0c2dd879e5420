//! HTTP(S) to the control plane, and the bridge from synchronous test code
//! to async I/O.
//!
//! Every call runs on a small tokio runtime of this module's own (two
//! workers, never shut down), so it works the same from a plain thread,
//! from a `current_thread` runtime and from a multi-thread runtime's worker
//! (where the waiting goes through [`tokio::task::block_in_place`], so the
//! caller's other tasks keep running). Each request opens a fresh
//! connection: no pool to go stale between tests, and a request is bounded
//! by [`REQUEST_TIMEOUT`] from connect to the last body byte.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

/// The bound on one request, connect to last body byte.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// An answer from the API server (or etcd).
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// The body: its JSON if it parses, `Null` if empty, else a JSON string
    /// holding the (lossily decoded) text.
    pub body: Value,
}

impl Reply {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// `Status.message` of an error answer, else the body as text.
    pub fn message(&self) -> String {
        match self.body.get("message").and_then(Value::as_str) {
            Some(m) => m.to_owned(),
            None => match &self.body {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        }
    }
}

pub(crate) fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("real-kube-io")
            .enable_all()
            .build()
            .expect("real_kube: building its tokio runtime")
    })
}

/// Runs `f`, which blocks the thread, without starving a multi-thread tokio
/// runtime the caller may be on (`block_in_place`); on a plain thread or a
/// `current_thread` runtime it simply runs `f`.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Runs `fut` on this module's runtime and waits for its output, from any
/// thread (see the module docs). A panic in `fut` is resumed here.
pub(crate) fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let task = runtime().spawn(fut);
    runtime().spawn(async move {
        let _ = tx.send(task.await);
    });
    match blocking(move || rx.recv()) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(Err(e)) => panic!("real_kube: I/O task failed: {e}"),
        Err(_) => panic!("real_kube: I/O runtime went away"),
    }
}

/// One request to be sent.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: String,
    /// Path and query, e.g. `/api/v1/namespaces?limit=1`.
    pub path: String,
    pub token: Option<String>,
    pub content_type: Option<&'static str>,
    pub body: Option<Vec<u8>>,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            method: method.to_owned(),
            path: path.to_owned(),
            token: None,
            content_type: None,
            body: None,
        }
    }

    pub fn token(mut self, token: &str) -> Request {
        self.token = Some(token.to_owned());
        self
    }

    /// A JSON body (`application/json`).
    pub fn json(self, body: &Value) -> Request {
        self.body_of_type("application/json", body)
    }

    /// A JSON body with another content type (a merge patch).
    pub fn body_of_type(mut self, content_type: &'static str, body: &Value) -> Request {
        self.content_type = Some(content_type);
        self.body = Some(serde_json::to_vec(body).expect("a JSON value serialises"));
        self
    }
}

/// Connects to `addr` (TLS when `tls` is given) and sends one request.
#[derive(Clone)]
pub(crate) struct Client {
    addr: SocketAddr,
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Client {
    /// Plain HTTP (etcd's health endpoint).
    pub fn plain(addr: SocketAddr) -> Client {
        Client { addr, tls: None }
    }

    /// HTTPS trusting only the CA certificates in the PEM file `ca_file`.
    pub fn tls(addr: SocketAddr, ca_file: &Path) -> Result<Client, String> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_file)
            .map_err(|e| format!("reading {}: {e}", ca_file.display()))?
        {
            let cert = cert.map_err(|e| format!("parsing {}: {e}", ca_file.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("CA certificate in {}: {e}", ca_file.display()))?;
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS config: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Client {
            addr,
            tls: Some(TlsConnector::from(Arc::new(config))),
        })
    }

    /// Sends `req` on a fresh connection, within [`REQUEST_TIMEOUT`].
    pub async fn send(&self, req: Request) -> Result<Reply, String> {
        let what = format!("{} {}", req.method, req.path);
        match tokio::time::timeout(REQUEST_TIMEOUT, self.send_unbounded(req)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(format!("{what}: {e}")),
            Err(_) => Err(format!("{what}: no answer within {REQUEST_TIMEOUT:?}")),
        }
    }

    async fn send_unbounded(&self, req: Request) -> Result<Reply, String> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.addr))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => exchange(tcp, self.addr, req).await,
            Some(tls) => {
                let name = ServerName::IpAddress(self.addr.ip().into());
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS handshake with {}: {e}", self.addr))?;
                exchange(stream, self.addr, req).await
            }
        }
    }
}

async fn exchange<S>(stream: S, addr: SocketAddr, req: Request) -> Result<Reply, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    let conn = tokio::spawn(conn);
    let mut builder = http::Request::builder()
        .method(req.method.as_str())
        .uri(req.path.as_str())
        .header(http::header::HOST, addr.to_string())
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::USER_AGENT, "metal-ipam-tests/real_kube");
    if let Some(token) = &req.token {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if let Some(ct) = req.content_type {
        builder = builder.header(http::header::CONTENT_TYPE, ct);
    }
    let request = builder
        .body(Full::new(Bytes::from(req.body.unwrap_or_default())))
        .map_err(|e| format!("building the request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("sending: {e}"))?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
        .to_bytes();
    drop(sender);
    conn.abort();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Ok(Reply { status, body })
}
