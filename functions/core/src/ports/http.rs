//! The outbound HTTP port: how core code reaches the Kubernetes API (and,
//! later, Equinix Metal) without knowing it runs in Spin.

use std::fmt;

/// A transport failure: the request did not produce an HTTP response
/// (connection refused, TLS failure, denied by `allowed_outbound_hosts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportError(pub String);

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "outbound request failed: {}", self.0)
    }
}

impl std::error::Error for TransportError {}

/// Sends one HTTP request and returns the whole response.
///
/// Implementations: `metal-ipam-spin`'s `SpinHttp` (spin-sdk outbound HTTP)
/// and scripted fakes in tests.
pub trait HttpClient {
    /// Sends `req`.
    ///
    /// # Errors
    /// [`TransportError`] when no response was received; any HTTP status,
    /// including 4xx and 5xx, is an `Ok` response.
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError>;
}
