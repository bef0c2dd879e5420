//! The outbound HTTP port: how core code reaches the Kubernetes API,
//! Equinix Metal and the other components (service chaining) without
//! knowing it runs in Spin.
//!
//! Every request carries a [`Deadline`] (a request extension the clients
//! set): how long the whole call may take, connecting included, and how
//! long connecting may. The shells pass it on as `wasi:http` request
//! options and check its absolute end on every wait, so no call outlasts
//! it whatever the peer does, and the leases that assume bounded calls
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
    /// No whole answer within the [`Deadline`] (connecting, the answer's
    /// head, or its body). The request may have been processed.
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

/// How long one request may take, in milliseconds, from the moment the
/// transport starts it: the whole call — connecting (TCP and TLS),
/// sending, the answer's head and its whole body — ends within
/// `total_ms`, whatever the peer does (a slow connect, a slow first byte,
/// a body that trickles or never ends). Set by the clients as a request
/// extension ([`Deadline::set`]); a transport reads it with
/// [`Deadline::of`] and applies it twice:
///
/// - as the runtime's per-phase timeouts ([`Deadline::timeouts`], which
///   add up to no more than `total_ms`), so the runtime itself drops a
///   peer that stalls in one phase;
/// - as an absolute end, `total_ms` after the call started, that it checks
///   on every wait (the answer, each chunk of the body, the request body's
///   writes) and past which it gives up with [`TransportKind::Timeout`]:
///   per-phase timeouts alone do not bound a body that trickles one byte
///   just before each between-bytes timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// Connecting (TCP and TLS), at most; [`Deadline::timeouts`] gives it
    /// at most half of `total_ms`.
    pub connect_ms: u64,
    /// The whole call, connecting included.
    pub total_ms: u64,
}

/// The runtime's timeouts of one request (`wasi:http` request options),
/// derived from its [`Deadline`] by [`Deadline::timeouts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting (TCP, and TLS where the runtime bounds it).
    pub connect_ms: u64,
    /// The answer's first byte. Spin counts it from the request's start
    /// (connecting included), wasmtime's default sender from the end of
    /// connecting: either way the head arrives within `total_ms`.
    pub first_byte_ms: u64,
    /// Any one gap between chunks of the body.
    pub between_bytes_ms: u64,
}

impl Deadline {
    /// What a transport applies to a request that carries no deadline
    /// (every client sets one; this is the backstop).
    pub const FALLBACK: Deadline = Deadline {
        connect_ms: 5_000,
        total_ms: 30_000,
    };

    /// For a request to another component (Spin service chaining): the
    /// step it runs bounds its own calls and rounds, and the caller stops
    /// waiting after 150 s. Spin serves chained requests in-process and
    /// does not apply request options to them; the caller's own check of
    /// the absolute end (see [`Deadline`]) bounds them all the same.
    pub const CHAINED: Deadline = Deadline {
        connect_ms: 3_000,
        total_ms: 150_000,
    };

    /// The runtime's per-phase timeouts: connecting within `connect_ms`
    /// but at most half the total, then the first byte and any one gap of
    /// the body within what is left, so that connecting plus either phase
    /// never passes `total_ms`. (Only the transport's own check of the
    /// absolute end bounds the sum of a body's gaps.)
    ///
    /// ```
    /// use metal_ipam_core::ports::http::{Deadline, Timeouts};
    /// let t = Deadline { connect_ms: 3_000, total_ms: 10_000 }.timeouts();
    /// assert_eq!(t, Timeouts { connect_ms: 3_000, first_byte_ms: 7_000, between_bytes_ms: 7_000 });
    /// let t = Deadline { connect_ms: 3_000, total_ms: 1_000 }.timeouts();
    /// assert_eq!(t, Timeouts { connect_ms: 500, first_byte_ms: 500, between_bytes_ms: 500 });
    /// ```
    pub fn timeouts(self) -> Timeouts {
        let connect_ms = self.connect_ms.min(self.total_ms / 2);
        let rest = self.total_ms - connect_ms;
        Timeouts {
            connect_ms,
            first_byte_ms: rest,
            between_bytes_ms: rest,
        }
    }

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
    /// let d = Deadline { connect_ms: 1_000, total_ms: 2_000 };
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
/// request's [`Deadline`] as request options and its absolute end checked
/// on every wait) and scripted fakes in tests.
pub trait HttpClient {
    /// Sends `req`; returns within its [`Deadline`]'s `total_ms`.
    ///
    /// # Errors
    /// [`TransportError`] when no response was received; any HTTP status,
    /// including 4xx and 5xx, is an `Ok` response.
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError>;
}
