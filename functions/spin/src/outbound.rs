//! Outbound HTTP with timeouts: one request on
//! `wasi:http/outgoing-handler` with the request's
//! [`Deadline`] as `request-options` (connect, first-byte and between-bytes
//! timeouts), blocking until the whole answer is read.
//!
//! spin-sdk's `http::send` passes no options, and then Spin waits up to its
//! own default (600 s) for a peer that never answers; here every request
//! is bounded. Spin applies the options to requests it sends out (checked
//! on Spin 3.6.3 and 4.0.2 by the slow-answer tests); service chaining is
//! served in-process and bounded by the chained step's own calls.
//!
//! The runtime's `error-code` becomes a [`TransportKind`], so callers can
//! tell a timeout (the request may have been processed) from a TLS failure
//! or a refused connection (nothing was sent).

use metal_ipam_core::ports::http::{headers, Deadline, TransportError, TransportKind};
use spin_sdk::wit::wasi::http0_2_0::outgoing_handler;
use spin_sdk::wit::wasi::http0_2_0::types::{
    self as wasi_http, ErrorCode, Fields, IncomingBody, IncomingResponse, Method, OutgoingBody,
    OutgoingRequest, RequestOptions, Scheme,
};
use wasi::io::streams::StreamError;

/// Bytes written or read per stream call.
const CHUNK: u64 = 64 * 1024;

/// What an `error-code` says about the request.
fn kind_of(code: &ErrorCode) -> TransportKind {
    match code {
        ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout => TransportKind::Timeout,
        ErrorCode::TlsProtocolError
        | ErrorCode::TlsCertificateError
        | ErrorCode::TlsAlertReceived(_) => TransportKind::Tls,
        ErrorCode::DnsTimeout
        | ErrorCode::DnsError(_)
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DestinationIpProhibited
        | ErrorCode::DestinationIpUnroutable
        | ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionTimeout => TransportKind::Unreachable,
        ErrorCode::HttpRequestDenied
        | ErrorCode::HttpRequestUriInvalid
        | ErrorCode::HttpRequestMethodInvalid
        | ErrorCode::ConfigurationError => TransportKind::Denied,
        _ => TransportKind::Dropped,
    }
}

fn failed(code: &ErrorCode) -> TransportError {
    TransportError::new(kind_of(code), format!("{code:?}"))
}

/// A stream error as a transport error: the runtime's code when it has one.
fn stream_failed(e: StreamError, what: &str) -> TransportError {
    match e {
        StreamError::LastOperationFailed(err) => match wasi_http::http_error_code(&err) {
            Some(code) => failed(&code),
            None => TransportError::new(
                TransportKind::Dropped,
                format!("{what}: {}", err.to_debug_string()),
            ),
        },
        StreamError::Closed => {
            TransportError::new(TransportKind::Dropped, format!("{what}: stream closed"))
        }
    }
}

fn nanos(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

fn invalid(what: String) -> TransportError {
    TransportError::new(TransportKind::Denied, what)
}

/// Sends `req` and reads the whole answer (see the module docs).
///
/// # Errors
/// [`TransportError`] when no complete answer arrived within the deadline.
pub fn send(req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
    let deadline = Deadline::of(&req);
    let (parts, body) = req.into_parts();
    let request = outgoing_request(&parts)?;
    let options = request_options(deadline);
    let outgoing = request
        .body()
        .map_err(|()| invalid("request body already taken".into()))?;
    let future = outgoing_handler::handle(request, options).map_err(|c| failed(&c))?;
    {
        let stream = outgoing
            .write()
            .map_err(|()| invalid("request body stream".into()))?;
        for chunk in body.chunks(CHUNK as usize) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| stream_failed(e, "writing the request body"))?;
        }
    }
    OutgoingBody::finish(outgoing, None).map_err(|c| failed(&c))?;
    let response = loop {
        match future.get() {
            Some(Ok(Ok(r))) => break r,
            Some(Ok(Err(code))) => return Err(failed(&code)),
            Some(Err(())) => {
                return Err(TransportError::new(
                    TransportKind::Dropped,
                    "the response was already taken",
                ))
            }
            None => future.subscribe().block(),
        }
    };
    read_response(response)
}

/// The outgoing request of `parts`: its headers, method and target.
///
/// # Errors
/// [`TransportKind::Denied`] for headers or a target the runtime refuses.
fn outgoing_request(parts: &http::request::Parts) -> Result<OutgoingRequest, TransportError> {
    let headers: Vec<(String, Vec<u8>)> = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
        .collect();
    let fields =
        Fields::from_list(&headers).map_err(|e| invalid(format!("request headers: {e:?}")))?;
    let request = OutgoingRequest::new(fields);
    let method = match parts.method.as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        "DELETE" => Method::Delete,
        "HEAD" => Method::Head,
        other => Method::Other(other.to_string()),
    };
    let uri = &parts.uri;
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") | None => Scheme::Https,
        Some(other) => Scheme::Other(other.to_string()),
    };
    let set = request
        .set_method(&method)
        .and_then(|()| request.set_scheme(Some(&scheme)))
        .and_then(|()| request.set_authority(uri.authority().map(|a| a.as_str())))
        .and_then(|()| request.set_path_with_query(uri.path_and_query().map(|p| p.as_str())));
    set.map_err(|()| invalid(format!("request target {uri} not accepted")))?;
    Ok(request)
}

/// The deadline's timeouts; `None` when the runtime refuses one (the
/// request then goes without them, and its transport's own bound
/// applies).
fn request_options(deadline: Deadline) -> Option<RequestOptions> {
    let options = RequestOptions::new();
    let timeouts = options
        .set_connect_timeout(Some(nanos(deadline.connect_ms)))
        .and_then(|()| options.set_first_byte_timeout(Some(nanos(deadline.response_ms))))
        .and_then(|()| options.set_between_bytes_timeout(Some(nanos(deadline.response_ms))));
    timeouts.is_ok().then_some(options)
}

/// The whole answer: status, headers and body read to its end.
///
/// # Errors
/// [`TransportKind::Dropped`] when the body breaks off or the answer is
/// not HTTP.
fn read_response(response: IncomingResponse) -> Result<http::Response<Vec<u8>>, TransportError> {
    let mut builder = http::Response::builder().status(response.status());
    // Only the headers the core reads, by their constant names: parsing
    // arbitrary names would link `http`'s name parser into every component.
    for (name, value) in response.headers().entries() {
        if let Some(n) = headers::READ
            .iter()
            .find(|n| n.as_str().eq_ignore_ascii_case(&name))
        {
            builder = builder.header(n.clone(), value);
        }
    }
    let incoming = response
        .consume()
        .map_err(|()| invalid("response body already taken".into()))?;
    let mut bytes = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| invalid("response body stream".into()))?;
        loop {
            match stream.blocking_read(CHUNK) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(e) => return Err(stream_failed(e, "reading the response body")),
            }
        }
    }
    drop(IncomingBody::finish(incoming));
    builder.body(bytes).map_err(|e| {
        TransportError::new(
            TransportKind::Dropped,
            format!("an answer that is not HTTP: {e}"),
        )
    })
}
