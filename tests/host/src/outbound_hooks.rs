//! Outbound `wasi:http`: enforces a component's `allowed_outbound_hosts`,
//! handles service chaining (`http://<component-id>.spin.internal/...`)
//! in-process, and sends every other allowed request with
//! wasmtime-wasi-http's default sender (plain HTTP, or HTTPS verified
//! against the webpki roots).
//!
//! What Spin 3.6 does, and so this host:
//! - The `allowed_outbound_hosts` check comes first, for chained requests
//!   too; a denied request fails with `ErrorCode::HttpRequestDenied` when
//!   the guest awaits the response (Spin checks in the spawned send task,
//!   `spin@v3.6.x:crates/factor-outbound-http/src/wasi.rs`,
//!   `RequestSender::prepare_request`).
//! - An allowed request whose host is `<id>.spin.internal` is then
//!   intercepted (`crates/trigger-http/src/outbound_http.rs`) and handed to
//!   the HTTP trigger as a synthetic `/...` match for component `<id>`
//!   (`HttpServer::handle_trigger_route`); see `Host::run_chained`.
//! - Request options (`connect-timeout`, `first-byte-timeout`,
//!   `between-bytes-timeout`, each 600 s when not given) apply to requests
//!   sent out, not to chained ones. As in Spin
//!   (`spin@v3.6.x:crates/factor-outbound-http/src/wasi.rs`,
//!   `RequestSender::send_request`), the connect timeout bounds the TCP
//!   connect, the first-byte timeout the whole wait for the answer's head
//!   (connecting and the TLS handshake included), and the between-bytes
//!   timeout each gap of the body; nothing bounds a body's total time.
//! - If `<id>` has no HTTP trigger (or does not exist), the trigger fails
//!   with "unknown routing destination" and the interceptor turns that into
//!   a **trap** of the calling instance (`HttpError::trap`), not an error
//!   code. Deviation: wasmtime-wasi-http 48's send hook cannot trap, so this
//!   host traps in `outgoing-handler.handle` (see
//!   `add_outgoing_handler_to_linker`) instead of in
//!   `future-incoming-response.get`; either way the caller's instance dies
//!   before it sees a result, and its request gets a 500.

use std::sync::{Arc, Mutex};

use wasmtime::component::Resource;
use wasmtime_wasi_http::p2::bindings::http::{outgoing_handler, types as http_types};
use wasmtime_wasi_http::p2::types::HostOutgoingRequest;
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks, WasiHttpView,
};

use crate::bindings::InstanceState;
use crate::host::{ChainedCall, Host};
use crate::outbound::{parse_service_chaining_target, AllowedHostsConfig};

/// What Spin waits when a request option is not given.
const SPIN_DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

type SendFuture = Box<
    dyn std::future::Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

/// Per-instance outbound HTTP policy and service chaining context.
pub(crate) struct OutboundHooks {
    /// The component making the requests.
    pub component_id: Arc<str>,
    /// Its resolved `allowed_outbound_hosts`.
    pub allowed: Arc<AllowedHostsConfig>,
    /// The application, to run chained requests in.
    pub host: Host,
    /// Where chained calls of the whole top-level request are recorded.
    pub chain_log: Arc<Mutex<Vec<ChainedCall>>>,
}

impl OutboundHooks {
    fn warn_denied(&self, uri: &http::Uri) {
        eprintln!(
            "warning: component {:?} tried to make an HTTP request to non-allowed host {:?}: add it to allowed_outbound_hosts (e.g. \"{}://{}\") to allow it",
            self.component_id,
            uri.authority().map(|a| a.as_str()).unwrap_or("<none>"),
            uri.scheme_str().unwrap_or("https"),
            uri.authority().map(|a| a.as_str()).unwrap_or("host"),
        );
    }

    /// For a request the guest is about to send: the message of the trap
    /// Spin raises when the request is an allowed service chaining request
    /// to a component without an HTTP trigger (`None` otherwise).
    fn unroutable_chaining_target(&self, req: &HostOutgoingRequest) -> Option<String> {
        let authority = req.authority.as_deref()?;
        // The URL as wasmtime-wasi-http will build it (a missing scheme
        // defaults to https there too).
        let scheme = match &req.scheme {
            None | Some(http_types::Scheme::Https) => "https",
            Some(http_types::Scheme::Http) => "http",
            Some(http_types::Scheme::Other(s)) => s.as_str(),
        };
        let uri: http::Uri = format!("{scheme}://{authority}/").parse().ok()?;
        let target = parse_service_chaining_target(&uri)?;
        if !self.allowed.allows_uri(&uri) || self.host.is_routable_component(&target) {
            return None;
        }
        Some(format!("unknown routing destination '{target}'"))
    }
}

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        _ = fut;
        if !self.allowed.allows_uri(request.uri()) {
            self.warn_denied(request.uri());
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        if let Some(target) = parse_service_chaining_target(request.uri()) {
            let host = self.host.clone();
            let caller = self.component_id.clone();
            let log = self.chain_log.clone();
            return Box::new(async move {
                let response = host.run_chained(caller, &target, request, log).await?;
                Ok((
                    response,
                    Box::new(async { Ok(()) })
                        as Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
                ))
            });
        }
        Box::new(async move {
            use http_body_util::BodyExt;
            // As Spin: the first-byte timeout bounds the whole wait for the
            // answer's head, connecting and the TLS handshake included
            // (wasmtime-wasi-http's sender alone starts it after the
            // handshake and leaves the handshake untimed).
            let first_byte = options
                .and_then(|o| o.first_byte_timeout)
                .unwrap_or(SPIN_DEFAULT_TIMEOUT);
            let send = wasmtime_wasi_http::default_send_request(request, options);
            let (res, io) = tokio::time::timeout(first_byte, send)
                .await
                .map_err(|_| HttpError::ConnectionReadTimeout)??;
            Ok((
                res.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
            ))
        })
    }
}

/// `wasi:http/outgoing-handler@0.2.x` `handle`, as wasmtime-wasi-http
/// implements it, except that an allowed service chaining request to a
/// component without an HTTP trigger traps the caller, as in Spin (see the
/// module docs). Defined by hand because the generated `add_to_linker`
/// would need every `wasi:http/types` trait on a wrapper type.
pub(crate) fn add_outgoing_handler_to_linker(
    linker: &mut wasmtime::component::Linker<InstanceState>,
) -> wasmtime::Result<()> {
    let mut inst = linker.instance(OUTGOING_HANDLER)?;
    inst.func_wrap(
        "handle",
        |mut store: wasmtime::StoreContextMut<'_, InstanceState>,
         (request, options): (
            Resource<HostOutgoingRequest>,
            Option<Resource<RequestOptions>>,
        )| {
            let state = store.data_mut();
            let trap = match state.table.get(&request) {
                Ok(req) => state.hooks.unroutable_chaining_target(req),
                Err(_) => None, // wasmtime-wasi-http reports the bad handle
            };
            if let Some(message) = trap {
                return Err(wasmtime::Error::msg(message));
            }
            let mut view = state.http();
            let result = match outgoing_handler::Host::handle(&mut view, request, options) {
                Ok(future) => Ok(future),
                Err(e) => Err(http_types::Host::convert_error_code(&mut view, e)?),
            };
            Ok((result,))
        },
    )
}

/// The instance name wasmtime-wasi-http 48 defines (`wasi:http@0.2.12`);
/// guests importing any `0.2.x` are linked to it by semver.
const OUTGOING_HANDLER: &str = "wasi:http/outgoing-handler@0.2.12";
