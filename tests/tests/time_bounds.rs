//! Every outbound call ends within the budget the docs state, connect
//! included, whatever the peer does (issue 26, finding 11), through the
//! real components (the `.wasm` files and `spin.toml`, on the test host and,
//! with `SPIN_BIN`, on real Spin's SQLite store).
//!
//! The peer is a local TCP server of this file that, per connection,
//! either says nothing at all (a peer that never answers, or never
//! finishes a TLS handshake), or answers a head at once and then trickles
//! the body one byte at a time, each byte just under the between-bytes
//! timeout the shell sets, so that no per-phase timeout ever fires. The
//! Kubernetes API (`POST /v1/reconcile`) and Equinix Metal (the event poll,
//! `POST /v1/metal/poll`) are pointed at it; each step makes one request
//! there before it fails, which must end within its 10 s, the step answer
//! 503 saying which peer failed, and the peer see its connection closed
//! (the runtime's work on the call ends with it). (A step that makes
//! several requests takes at most their sum.)
//! The arithmetic (phases, retries, waits) is tested natively in
//! `functions/core/tests/time_bounds.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metal_ipam_core::kube::DEADLINE;
use metal_ipam_tests::fake_kube::FakeKube;
use metal_ipam_tests::harness::{given, App, Resp, Runtime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Real Spin on SQLite and the test host; the Redis store adds nothing to
/// what these tests look at.
async fn not_redis(runtime: Runtime) -> Option<Runtime> {
    if runtime == Runtime::SpinRedis {
        return None;
    }
    given(runtime).await
}

/// The budget of a Kubernetes request and of a Metal request (the docs'
/// 10 s, connect included).
const BUDGET: Duration = Duration::from_millis(DEADLINE.total_ms);

/// What a step may add to its one bounded call: the component's start,
/// its store and its other (local, fast) calls. Far below what an
/// unbounded call takes here (the trickle lasts [`TRICKLE_BYTES`] gaps).
const SLACK: Duration = Duration::from_secs(2);

/// How the peer treats each connection.
#[derive(Debug, Clone, Copy)]
enum Peer {
    /// Accepts, reads whatever comes and never writes a byte: no answer
    /// (plain HTTP), no TLS handshake (HTTPS).
    Silent,
    /// Answers a head at once (`200`, a `content-length` of 1,000), then
    /// one byte of the body every `gap`, [`TRICKLE_BYTES`] bytes at most,
    /// then closes.
    Trickle {
        /// The gap between two bytes.
        gap: Duration,
    },
}

/// Bytes a trickling peer sends at most: its answer lasts this many gaps
/// (30 s with a 6 s gap), three times the budget.
const TRICKLE_BYTES: u32 = 5;

/// A local TCP server behaving as a [`Peer`]; stops on drop.
struct Server {
    port: u16,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    closed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(peer: Peer) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(Notify::new());
        let (a, o, c) = (accepted.clone(), open.clone(), closed.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                a.fetch_add(1, Ordering::SeqCst);
                o.fetch_add(1, Ordering::SeqCst);
                let (o, c) = (o.clone(), c.clone());
                tokio::spawn(async move {
                    serve(conn, peer).await;
                    o.fetch_sub(1, Ordering::SeqCst);
                    c.notify_waiters();
                });
            }
        });
        Server {
            port,
            accepted,
            open,
            closed,
            task,
        }
    }

    /// Connections accepted so far.
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Waits until the client closed every connection, at most `within`;
    /// whether it did.
    async fn all_closed(&self, within: Duration) -> bool {
        tokio::time::timeout(within, async {
            loop {
                let notified = self.closed.notified();
                if self.open.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }
}

/// Serves one connection as `peer` until the client closes it (or a
/// trickle ends).
async fn serve(mut conn: TcpStream, peer: Peer) {
    let mut buf = vec![0u8; 16 * 1024];
    match peer {
        Peer::Silent => while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {},
        Peer::Trickle { gap } => {
            // The request's head (its body, if any, is read along).
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf).await {
                    Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
                    _ => return,
                }
            }
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n";
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            for _ in 0..TRICKLE_BYTES {
                // Until the next byte is due, watch for the client closing.
                tokio::select! {
                    () = tokio::time::sleep(gap) => {}
                    r = conn.read(&mut buf) => if !matches!(r, Ok(n) if n > 0) { return },
                }
                if conn.write_all(b" ").await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A trickle just under the between-bytes timeout the shell sets for a
/// 10 s request (7 s: [`metal_ipam_core::ports::http::Deadline::timeouts`]).
fn trickle() -> Peer {
    let between = DEADLINE.timeouts().between_bytes_ms;
    Peer::Trickle {
        gap: Duration::from_millis(between - 1_000),
    }
}

/// Calls `POST /v1/reconcile` with the Kubernetes API at `url`: its first
/// request (a list) meets the peer. Returns the answer and how long it
/// took.
async fn reconcile_against(runtime: Runtime, url: String) -> (Resp, Duration) {
    let vars = [("k8s_api_url", url), ("k8s_token", "t".to_string())];
    let app = App::on(runtime, &vars, &[]).await.expect("given");
    let started = Instant::now();
    let r = app.call("POST", "/v1/reconcile", None).await;
    (r, started.elapsed())
}

fn assert_within_budget(runtime: Runtime, what: &str, took: Duration) {
    eprintln!("{}: {what} answered after {took:?}", runtime.name());
    assert!(
        took < BUDGET + SLACK,
        "{}: {what} answered after {took:?}, past the {BUDGET:?} budget",
        runtime.name()
    );
}

/// An API server that accepts the connection and never answers: the
/// request ends within its 10 s, and the step answers 503 (retry).
async fn a_kubernetes_api_that_never_answers_is_cut_off(runtime: Runtime) {
    let peer = Server::start(Peer::Silent).await;
    let (r, took) = reconcile_against(runtime, format!("http://127.0.0.1:{}", peer.port)).await;
    assert_eq!(
        (r.status, r.reason()),
        (503, "KubeUnavailable"),
        "{}: {:#}",
        runtime.name(),
        r.body
    );
    assert_within_budget(runtime, "a silent API server", took);
    assert!(peer.accepted() >= 1, "the peer was reached");
    assert!(peer.all_closed(SLACK).await, "the connection was dropped");
}

/// An API server that answers a head and then trickles its body, each
/// byte just under the between-bytes timeout: no per-phase timeout fires,
/// and the request still ends within its 10 s.
async fn a_kubernetes_api_that_trickles_its_body_is_cut_off(runtime: Runtime) {
    let peer = Server::start(trickle()).await;
    let (r, took) = reconcile_against(runtime, format!("http://127.0.0.1:{}", peer.port)).await;
    assert_eq!(
        (r.status, r.reason()),
        (503, "KubeUnavailable"),
        "{}: {:#}",
        runtime.name(),
        r.body
    );
    assert_within_budget(runtime, "a trickling API server", took);
    assert!(
        took >= BUDGET - Duration::from_millis(500),
        "{}: cut at the request's end, not before: {took:?}",
        runtime.name()
    );
    assert!(peer.all_closed(SLACK).await, "the connection was dropped");
}

/// An HTTPS API server that accepts TCP and never answers the TLS
/// handshake: connecting is part of the budget.
async fn a_tls_handshake_that_never_ends_is_cut_off(runtime: Runtime) {
    let peer = Server::start(Peer::Silent).await;
    let (r, took) = reconcile_against(runtime, format!("https://127.0.0.1:{}", peer.port)).await;
    assert_eq!(r.status, 503, "{}: {:#}", runtime.name(), r.body);
    assert_within_budget(runtime, "a silent TLS handshake", took);
    assert!(peer.all_closed(SLACK).await, "the connection was dropped");
}

/// Runs the Metal event poll (`POST /v1/metal/poll`) with Equinix Metal at
/// `peer` (the Kubernetes API is FakeKube): its first Metal request (the
/// project's events) meets the peer, and a failed read ends the poll.
/// Returns the answer and how long it took.
async fn poll_against(runtime: Runtime, peer: &Server) -> (Resp, Duration) {
    let kube = FakeKube::start().await;
    let vars = [
        ("k8s_api_url", kube.base_url()),
        ("k8s_token", kube.token().to_string()),
        ("metal_api_url", format!("http://127.0.0.1:{}", peer.port)),
        ("metal_token", "metal-token".to_string()),
        (
            "metal_project_id",
            "5f2c7a8e-1b3d-4e6f-9a0b-1c2d3e4f5a6b".to_string(),
        ),
    ];
    let app = App::on(runtime, &vars, &[]).await.expect("given");
    let started = Instant::now();
    let r = app.call("POST", "/v1/metal/poll", None).await;
    (r, started.elapsed())
}

/// A Metal API that never answers: the request, its retries included
/// (a read is retried while the budget allows), ends within its 10 s.
async fn a_metal_api_that_never_answers_is_cut_off(runtime: Runtime) {
    let peer = Server::start(Peer::Silent).await;
    let (r, took) = poll_against(runtime, &peer).await;
    assert_eq!(
        (r.status, r.reason()),
        (503, "MetalUnavailable"),
        "{}: {:#}",
        runtime.name(),
        r.body
    );
    assert_within_budget(runtime, "a silent Metal API", took);
    assert!(
        peer.accepted() >= 2,
        "the read was retried within the budget"
    );
    assert!(peer.all_closed(SLACK).await, "the connections were dropped");
}

/// A Metal API that trickles its answer's body just under the
/// between-bytes timeout: the request ends within its 10 s budget.
async fn a_metal_api_that_trickles_its_body_is_cut_off(runtime: Runtime) {
    let peer = Server::start(trickle()).await;
    let (r, took) = poll_against(runtime, &peer).await;
    assert_eq!(
        (r.status, r.reason()),
        (503, "MetalUnavailable"),
        "{}: {:#}",
        runtime.name(),
        r.body
    );
    assert_within_budget(runtime, "a trickling Metal API", took);
    assert!(peer.all_closed(SLACK).await, "the connections were dropped");
}

metal_ipam_tests::on_every_runtime!(
    not_redis: a_kubernetes_api_that_never_answers_is_cut_off,
    a_kubernetes_api_that_trickles_its_body_is_cut_off,
    a_tls_handshake_that_never_ends_is_cut_off,
    a_metal_api_that_never_answers_is_cut_off,
    a_metal_api_that_trickles_its_body_is_cut_off,
);
