//! The HTTP/1 server behind [`crate::Host::serve`].

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::host::{Host, SHUTDOWN_GRACE};

/// A running server started by [`Host::serve`].
///
/// Dropping the handle does not stop the server; call
/// [`ServerHandle::shutdown`].
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ServerHandle {
    /// The address the server is bound to (with the actual port when port
    /// 0 was requested).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://<local_addr>`, handy for building request URLs.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.local_addr)
    }

    /// Stops accepting connections, lets in-flight requests finish (up to
    /// [`SHUTDOWN_GRACE`]), closes idle keep-alive connections and waits
    /// for the server task to end.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        self.task.await.context("server task failed")
    }
}

pub(crate) async fn serve(host: Host, addr: SocketAddr) -> anyhow::Result<ServerHandle> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("unable to listen on {addr}"))?;
    let local_addr = listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(accept_loop(host, listener, stop_rx));
    Ok(ServerHandle {
        local_addr,
        stop,
        task,
    })
}

async fn accept_loop(host: Host, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let host = Arc::new(host);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => {
                let (stream, client_addr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        eprintln!("warning: accept failed: {e}");
                        continue;
                    }
                };
                let host = host.clone();
                let mut conn_stop = stop.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req: hyper::Request<Incoming>| {
                        let host = host.clone();
                        async move { handle(&host, req, client_addr).await }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    tokio::select! {
                        res = conn.as_mut() => {
                            if let Err(e) = res {
                                if !e.is_incomplete_message() {
                                    eprintln!("warning: error serving connection from {client_addr}: {e}");
                                }
                            }
                        }
                        _ = conn_stop.changed() => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
                // Reap finished connections so the set does not grow forever.
                while connections.try_join_next().is_some() {}
            }
        }
    }
    drop(listener);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        eprintln!(
            "warning: in-flight requests still running after {SHUTDOWN_GRACE:?}; aborting them"
        );
        connections.abort_all();
    }
}

async fn handle(
    host: &Host,
    req: hyper::Request<Incoming>,
    client_addr: SocketAddr,
) -> anyhow::Result<hyper::Response<Full<Bytes>>> {
    let req = req.map(|b: Incoming| b.map_err(wasmtime_wasi_http::Error::from).boxed_unsync());
    // An error here (no or conflicting Host) closes the connection, as Spin does.
    let outcome = host.dispatch(req, client_addr).await?;
    Ok(outcome.response.map(|b| Full::new(Bytes::from(b))))
}
