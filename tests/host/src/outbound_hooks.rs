//! The `wasi:http` outbound hook: enforces a component's
//! `allowed_outbound_hosts` and sends allowed requests with
//! wasmtime-wasi-http's default sender (plain HTTP, or HTTPS verified
//! against the webpki roots).
//!
//! A denied request fails with `ErrorCode::HttpRequestDenied`, as on Spin.
//! Deviation: Spin rejects it in `outgoing-handler.handle` itself; here the
//! error surfaces when the guest awaits the `future-incoming-response`
//! (spin-sdk's `send` reports both the same way).

use std::sync::Arc;

use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::outbound::AllowedHostsConfig;

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

/// Per-instance outbound HTTP policy.
pub(crate) struct OutboundHooks {
    pub component_id: Arc<str>,
    pub allowed: Arc<AllowedHostsConfig>,
}

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        if !self.allowed.allows_uri(request.uri()) {
            let uri = request.uri().clone();
            eprintln!(
                "warning: component {:?} tried to make an HTTP request to non-allowed host {:?}: add it to allowed_outbound_hosts (e.g. \"{}://{}\") to allow it",
                self.component_id,
                uri.authority().map(|a| a.as_str()).unwrap_or("<none>"),
                uri.scheme_str().unwrap_or("https"),
                uri.authority().map(|a| a.as_str()).unwrap_or("host"),
            );
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        _ = fut;
        Box::new(async move {
            use http_body_util::BodyExt;
            let (res, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                res.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
            ))
        })
    }
}
