//! Outbound HTTP within a deadline: one request on
//! `wasi:http/outgoing-handler`, blocking until the whole answer is read,
//! and never longer than the request's [`Deadline`] allows.
//!
//! Two bounds, both from the [`Deadline`]:
//! - the runtime's `request-options` ([`Deadline::timeouts`]: connect,
//!   first-byte and between-bytes timeouts that add up to no more than the
//!   total). spin-sdk's `http::send` passes none, and then Spin waits up to
//!   its own default (600 s) for a peer that never answers. Spin applies
//!   them to requests it sends out, not to service chaining (served
//!   in-process);
//! - the call's absolute end, `total_ms` after [`send`] started, on the
//!   monotonic clock: every wait (the request body's writes, the answer,
//!   each chunk of its body) polls the stream or the future together with
//!   a timer for that end, and gives up with [`TransportKind::Timeout`]
//!   once it passes. This is what bounds a body that trickles one byte
//!   just before each between-bytes timeout, a TLS handshake the runtime
//!   does not time, and a chained request. Giving up drops the request's
//!   resources, and with them the runtime's work on it.
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
use wasi::clocks::monotonic_clock::{self, Instant};
use wasi::io::poll::{self, Pollable};
use wasi::io::streams::{InputStream, OutputStream, StreamError};

/// Bytes read per stream call.
const CHUNK: u64 = 64 * 1024;

/// The absolute end of one call on the monotonic clock, and its total (for
/// the message).
#[derive(Debug, Clone, Copy)]
struct End {
    at: Instant,
    total_ms: u64,
}

impl End {
    /// `deadline.total_ms` from now.
    fn of(deadline: Deadline) -> End {
        End {
            at: monotonic_clock::now().saturating_add(nanos(deadline.total_ms)),
            total_ms: deadline.total_ms,
        }
    }

    /// The timeout, naming the phase it cut.
    fn passed(self, what: &str) -> TransportError {
        TransportError::new(
            TransportKind::Timeout,
            format!(
                "{what}: no whole answer within the request's deadline of {} ms",
                self.total_ms
            ),
        )
    }

    /// Whether the end has passed.
    fn is_past(self) -> bool {
        monotonic_clock::now() >= self.at
    }

    /// Waits until `ready` is ready or the end passes, whichever is first.
    ///
    /// # Errors
    /// [`TransportKind::Timeout`] when the end came first.
    fn wait(self, ready: &Pollable, what: &str) -> Result<(), TransportError> {
        if self.is_past() {
            return Err(self.passed(what));
        }
        let timer = monotonic_clock::subscribe_instant(self.at);
        let woke = poll::poll(&[ready, &timer]);
        if woke.contains(&0) {
            Ok(())
        } else {
            Err(self.passed(what))
        }
    }
}

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
    let end = End::of(deadline);
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
        write_all(&stream, &body, end)?;
    }
    OutgoingBody::finish(outgoing, None).map_err(|c| failed(&c))?;
    let response = {
        let ready = future.subscribe();
        loop {
            match future.get() {
                Some(Ok(Ok(r))) => break r,
                Some(Ok(Err(code))) => return Err(failed(&code)),
                Some(Err(())) => {
                    return Err(TransportError::new(
                        TransportKind::Dropped,
                        "the response was already taken",
                    ))
                }
                None => end.wait(&ready, "waiting for the answer")?,
            }
        }
    };
    read_response(response, end)
}

/// Writes the request body, each wait for the stream bounded by `end`. An
/// empty body is not written to (nor flushed): the runtime may already have
/// closed the stream of a request without a body.
///
/// # Errors
/// [`TransportKind::Timeout`] past `end`; what the stream reports.
fn write_all(stream: &OutputStream, body: &[u8], end: End) -> Result<(), TransportError> {
    const WHAT: &str = "writing the request body";
    if body.is_empty() {
        return Ok(());
    }
    let ready = stream.subscribe();
    let mut rest = body;
    while !rest.is_empty() {
        let room = stream.check_write().map_err(|e| stream_failed(e, WHAT))?;
        if room == 0 {
            end.wait(&ready, WHAT)?;
            continue;
        }
        let n = rest.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        stream
            .write(&rest[..n])
            .map_err(|e| stream_failed(e, WHAT))?;
        rest = &rest[n..];
    }
    // The flush is done when the stream takes writes again. Every byte was
    // handed over: a stream the runtime closed meanwhile is not an error of
    // its own (the answer says what became of the request).
    match stream.flush() {
        Err(StreamError::Closed) => return Ok(()),
        r => r.map_err(|e| stream_failed(e, WHAT))?,
    }
    loop {
        match stream.check_write() {
            Ok(0) => end.wait(&ready, WHAT)?,
            Ok(_) | Err(StreamError::Closed) => return Ok(()),
            Err(e) => return Err(stream_failed(e, WHAT)),
        }
    }
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

/// The deadline's per-phase timeouts ([`Deadline::timeouts`]); `None`
/// when the runtime refuses one (the request then goes without them: the
/// absolute end still bounds it).
fn request_options(deadline: Deadline) -> Option<RequestOptions> {
    let t = deadline.timeouts();
    let options = RequestOptions::new();
    let timeouts = options
        .set_connect_timeout(Some(nanos(t.connect_ms)))
        .and_then(|()| options.set_first_byte_timeout(Some(nanos(t.first_byte_ms))))
        .and_then(|()| options.set_between_bytes_timeout(Some(nanos(t.between_bytes_ms))));
    timeouts.is_ok().then_some(options)
}

/// The whole answer: status, headers and body read to its end, by `end`.
///
/// # Errors
/// [`TransportKind::Timeout`] when the body has not ended by `end`;
/// [`TransportKind::Dropped`] when it breaks off or the answer is not
/// HTTP.
fn read_response(
    response: IncomingResponse,
    end: End,
) -> Result<http::Response<Vec<u8>>, TransportError> {
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
    let bytes = {
        let stream = incoming
            .stream()
            .map_err(|()| invalid("response body stream".into()))?;
        read_all(&stream, end)?
    };
    drop(IncomingBody::finish(incoming));
    builder.body(bytes).map_err(|e| {
        TransportError::new(
            TransportKind::Dropped,
            format!("an answer that is not HTTP: {e}"),
        )
    })
}

/// Reads a body to its end by `end`: each wait for the next chunk is
/// bounded by it, and so is a body that never stops coming (checked after
/// every chunk).
///
/// # Errors
/// [`TransportKind::Timeout`] past `end`; what the stream reports.
fn read_all(stream: &InputStream, end: End) -> Result<Vec<u8>, TransportError> {
    const WHAT: &str = "reading the response body";
    let ready = stream.subscribe();
    let mut bytes = Vec::new();
    loop {
        match stream.read(CHUNK) {
            Ok(chunk) if chunk.is_empty() => end.wait(&ready, WHAT)?,
            Ok(chunk) => {
                bytes.extend_from_slice(&chunk);
                if end.is_past() {
                    return Err(end.passed(WHAT));
                }
            }
            Err(StreamError::Closed) => return Ok(bytes),
            Err(e) => return Err(stream_failed(e, WHAT)),
        }
    }
}
