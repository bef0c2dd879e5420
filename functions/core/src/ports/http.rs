//! The outbound HTTP port: how core code reaches the Kubernetes API,
//! Equinix Metal and the other components (service chaining) without
//! knowing it runs in Spin.
//!
//! Every request carries a [`Deadline`] (a request extension the clients
//! set): how long connecting and waiting for the answer may take. The
//! shells pass it on as `wasi:http` request options, so no call waits on a
//! peer that never answers, and the leases that assume bounded calls
//! (`kv-schema/README.md`) hold.

use std::fmt;

/// The header names metal-ipam sends and reads, as constants, so that no
/// name is parsed at run time (`http`'s parser of arbitrary names is
/// ≈ 17 KB of every component's wasm).
pub mod headers {
    use http::header::HeaderName;

    pub use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};

    /// Metal's API token.
    pub const X_AUTH_TOKEN: HeaderName = HeaderName::from_static("x-auth-token");
    /// Metal's rate-limit reset (seconds).
    pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
    /// A deprecation notice (RFC 9745).
    pub const DEPRECATION: HeaderName = HeaderName::from_static("deprecation");
    /// A sunset notice (RFC 8594).
    pub const SUNSET: HeaderName = HeaderName::from_static("sunset");

    /// The response headers the core reads. A shell passes these on and
    /// may drop any other (nothing in the core reads them).
    pub const READ: [HeaderName; 5] = [
        CONTENT_TYPE,
        RETRY_AFTER,
        X_RATELIMIT_RESET,
        DEPRECATION,
        SUNSET,
    ];
}

/// Why a request produced no HTTP response. Decides what the caller does:
/// retry, look before repeating a POST, or stop and say what is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// No answer within the [`Deadline`] (connecting, or waiting for the
    /// response or its body). The request may have been processed.
    Timeout,
    /// The TLS handshake failed: an untrusted or invalid certificate, a
    /// protocol or alert error. Nothing was sent; retrying does not help.
    Tls,
    /// The peer could not be reached (DNS, connection refused or
    /// unroutable). Nothing was sent.
    Unreachable,
    /// The runtime refused the request (`allowed_outbound_hosts`, a
    /// malformed URL): a deployment mistake, nothing was sent.
    Denied,
    /// The connection broke after the request may have been sent (reset,
    /// closed, protocol error, incomplete answer).
    Dropped,
}

impl TransportKind {
    /// Whether the request certainly never reached the peer (so repeating
    /// even a POST cannot duplicate its effect).
    pub fn not_sent(self) -> bool {
        matches!(
            self,
            TransportKind::Tls | TransportKind::Unreachable | TransportKind::Denied
        )
    }

    /// A short name for messages (`timeout`, `tls`, …).
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Timeout => "timeout",
            TransportKind::Tls => "tls",
            TransportKind::Unreachable => "unreachable",
            TransportKind::Denied => "denied",
            TransportKind::Dropped => "dropped",
        }
    }
}

/// A transport failure: the request did not produce an HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportError {
    /// What kind of failure.
    pub kind: TransportKind,
    /// What the transport said (for the log, never a response body).
    pub detail: String,
}

impl TransportError {
    /// A failure of `kind`.
    pub fn new(kind: TransportKind, detail: impl Into<String>) -> TransportError {
        TransportError {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "outbound request failed ({}): {}",
            self.kind.name(),
            self.detail
        )
    }
}

impl std::error::Error for TransportError {}

/// How long one request may take, in milliseconds: to connect, and then
/// for the answer (its first byte, and between any two chunks of its
/// body). Set by the clients as a request extension ([`Deadline::set`]);
/// a transport reads it with [`Deadline::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// Connecting (TCP and TLS).
    pub connect_ms: u64,
    /// The first byte of the answer, and each gap in its body.
    pub response_ms: u64,
}

impl Deadline {
    /// What a transport applies to a request that carries no deadline
    /// (every client sets one; this is the backstop).
    pub const FALLBACK: Deadline = Deadline {
        connect_ms: 5_000,
        response_ms: 30_000,
    };

    /// For a request to another component (Spin service chaining): the
    /// step it runs bounds its own calls and rounds. Spin serves chained
    /// requests in-process and does not apply request options to them, so
    /// this bounds a chained call only where the runtime applies it; the
    /// step's own bounded calls are what bound it everywhere.
    pub const CHAINED: Deadline = Deadline {
        connect_ms: 3_000,
        response_ms: 150_000,
    };

    /// The deadline `req` carries, else [`Deadline::FALLBACK`].
    pub fn of<B>(req: &http::Request<B>) -> Deadline {
        req.extensions()
            .get::<Deadline>()
            .copied()
            .unwrap_or(Deadline::FALLBACK)
    }

    /// Whether `req` carries a deadline (tests assert every request does).
    pub fn is_set<B>(req: &http::Request<B>) -> bool {
        req.extensions().get::<Deadline>().is_some()
    }

    /// Attaches this deadline to `req`.
    ///
    /// ```
    /// use metal_ipam_core::ports::http::Deadline;
    /// let mut req = http::Request::new(Vec::<u8>::new());
    /// assert_eq!(Deadline::of(&req), Deadline::FALLBACK);
    /// let d = Deadline { connect_ms: 1_000, response_ms: 2_000 };
    /// d.set(&mut req);
    /// assert_eq!(Deadline::of(&req), d);
    /// ```
    pub fn set<B>(self, req: &mut http::Request<B>) {
        req.extensions_mut().insert(self);
    }
}

/// Sends one HTTP request and returns the whole response.
///
/// Implementations: `metal-ipam-spin`'s `SpinHttp` (`wasi:http` with the
/// request's [`Deadline`] as request options) and scripted fakes in tests.
pub trait HttpClient {
    /// Sends `req`, waiting no longer than its [`Deadline`].
    ///
    /// # Errors
    /// [`TransportError`] when no response was received; any HTTP status,
    /// including 4xx and 5xx, is an `Ok` response.
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError>;
}
