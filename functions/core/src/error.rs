//! The one error type of metal-ipam and its mapping to HTTP.
//!
//! Every failure a step can report is an [`Error`]: a [`ErrorKind`] that
//! decides the HTTP status (in [`ErrorKind::status`], the only place that
//! does), a machine-readable `reason` (CamelCase, stable, part of the API),
//! a human `message`, and optionally the `field` path of the offending input.

use std::fmt;

/// What kind of failure an [`Error`] is; decides the HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request could not be parsed at all (malformed JSON, bad path). 400.
    Malformed,
    /// The request parsed but is semantically invalid (bad spec, wrong kind). 422.
    Invalid,
    /// Missing or wrong credentials. 401.
    Unauthorized,
    /// The addressed object does not exist. 404.
    NotFound,
    /// The route exists but not for this method. 405.
    MethodNotAllowed,
    /// The request conflicts with the current state (in use, bound elsewhere). 409.
    Conflict,
    /// The pool has no address left for this claim. 409.
    Exhausted,
    /// The request body is larger than the service accepts
    /// ([`crate::MAX_BODY`]). 413.
    PayloadTooLarge,
    /// A temporary condition (store error, contention); retrying may succeed. 503.
    Transient,
    /// A bug or an impossible state. 500.
    Internal,
}

impl ErrorKind {
    /// The HTTP status code for this kind: the single mapping used by every
    /// component.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ErrorKind;
    /// assert_eq!(ErrorKind::Exhausted.status(), 409);
    /// assert_eq!(ErrorKind::Invalid.status(), 422);
    /// assert_eq!(ErrorKind::PayloadTooLarge.status(), 413);
    /// assert_eq!(ErrorKind::Transient.status(), 503);
    /// ```
    pub const fn status(self) -> u16 {
        match self {
            ErrorKind::Malformed => 400,
            ErrorKind::Unauthorized => 401,
            ErrorKind::NotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::Conflict | ErrorKind::Exhausted => 409,
            ErrorKind::PayloadTooLarge => 413,
            ErrorKind::Invalid => 422,
            ErrorKind::Internal => 500,
            ErrorKind::Transient => 503,
        }
    }
}

/// The reasons code decides on (not only reports): created and matched
/// through this enum ([`Error::is`], [`Known::as_str`]), so a control-flow
/// decision never compares a string spelled twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// A pool cannot go: addresses are allocated from it. 409.
    PoolInUse,
    /// A claim's `poolRef` names a kind or group metal-ipam does not serve. 422.
    UnsupportedPoolRef,
    /// A Machine names no network profile. 404.
    NoNetworkProfile,
    /// An address cannot be released: its Metal assignment exists. 409.
    MetalAssignmentHeld,
    /// The object changed since it was read (409): re-read and retry.
    KubeConflict,
    /// The object vanished between a read and a write (404).
    KubeNotFound,
    /// A network apply's lease ended or passed to another instance. 409.
    LeaseLost,
    /// A claim's Metal assignment record is not closed for its uid. 409.
    MetalAssignmentOpen,
    /// A VRF-backed pool's addresses come from a reservation not read yet. 422.
    MetalBlockUnknown,
    /// A stored record does not load (cut short, corrupt, or written by a
    /// newer build). 500.
    UnreadableRecord,
    /// A pool would share addresses with another pool of its address
    /// space. 409 (422 from the webhook).
    PoolOverlap,
    /// A taken-over kind's in-cluster provider has replicas (the fence). 409.
    InClusterProviderActive,
    /// A takeover was asked for during a hand-back of the kind. 409.
    HandBackInProgress,
    /// A takeover could not import every pool of the kind. 409.
    TakeoverIncomplete,
    /// A hand-back was asked for while released addresses cool down. 409.
    AddressesCooling,
}

impl Known {
    /// The stable reason string.
    ///
    /// ```
    /// use metal_ipam_core::error::Known;
    /// assert_eq!(Known::PoolInUse.as_str(), "PoolInUse");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Known::PoolInUse => "PoolInUse",
            Known::UnsupportedPoolRef => "UnsupportedPoolRef",
            Known::NoNetworkProfile => "NoNetworkProfile",
            Known::MetalAssignmentHeld => "MetalAssignmentHeld",
            Known::KubeConflict => "KubeConflict",
            Known::KubeNotFound => "KubeNotFound",
            Known::LeaseLost => "LeaseLost",
            Known::MetalAssignmentOpen => "MetalAssignmentOpen",
            Known::MetalBlockUnknown => "MetalBlockUnknown",
            Known::UnreadableRecord => "UnreadableRecord",
            Known::PoolOverlap => "PoolOverlap",
            Known::InClusterProviderActive => "InClusterProviderActive",
            Known::HandBackInProgress => "HandBackInProgress",
            Known::TakeoverIncomplete => "TakeoverIncomplete",
            Known::AddressesCooling => "AddressesCooling",
        }
    }
}

/// A metal-ipam error: kind, stable reason, message and optional field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    reason: &'static str,
    message: String,
    field: Option<String>,
    detail: Option<String>,
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Builds an error of `kind` with a stable `reason` and a human `message`.
    pub fn new(kind: ErrorKind, reason: &'static str, message: impl Into<String>) -> Self {
        Error {
            kind,
            reason,
            message: message.into(),
            field: None,
            detail: None,
        }
    }

    /// A 400: the body or path could not be parsed.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Malformed, "MalformedRequest", message)
    }

    /// A 422 about `field` (a path such as `spec.addresses[2]`).
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, "Invalid", message).with_field(field)
    }

    /// A 404 with the given reason.
    pub fn not_found(reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, reason, message)
    }

    /// A 409 with the given reason.
    pub fn conflict(reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, reason, message)
    }

    /// A 413 `PayloadTooLarge`: the request body is larger than `limit`
    /// bytes.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::Error;
    /// let e = Error::payload_too_large(1024);
    /// assert_eq!((e.status(), e.reason()), (413, "PayloadTooLarge"));
    /// assert_eq!(e.message(), "the request body is larger than 1024 bytes");
    /// ```
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            ErrorKind::PayloadTooLarge,
            "PayloadTooLarge",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// A 503: retry later.
    pub fn transient(reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, reason, message)
    }

    /// A 500: something that should not happen.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, "InternalError", message)
    }

    /// A 500 [`Known::UnreadableRecord`]: a stored record does not load.
    pub fn unreadable(message: impl Into<String>) -> Self {
        Self::new(
            ErrorKind::Internal,
            Known::UnreadableRecord.as_str(),
            message,
        )
    }

    /// Attaches the path of the offending field.
    #[must_use]
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Attaches an operator-facing detail (e.g. a backend's error text). It
    /// goes to the log line, never into the response body.
    #[must_use]
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// The operator-facing detail, if any (see [`Error::with_detail`]).
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// Prefixes the field path, e.g. `addresses[1]` under `spec` becomes
    /// `spec.addresses[1]`.
    #[must_use]
    pub fn under(mut self, parent: &str) -> Self {
        self.field = Some(match self.field.take() {
            Some(f) if f.starts_with('[') => format!("{parent}{f}"),
            Some(f) => format!("{parent}.{f}"),
            None => parent.to_string(),
        });
        self
    }

    /// The kind, which decides the HTTP status.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether this error has the [`Known`] reason `k`.
    pub fn is(&self, k: Known) -> bool {
        self.reason == k.as_str()
    }

    /// The stable machine-readable reason, e.g. `PoolExhausted`.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The offending field path, if the error is about one.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// HTTP status for this error (see [`ErrorKind::status`]).
    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// The JSON error body every route returns:
    /// `{"reason": ..., "message": ..., "field": ...}` (`field` only when set).
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::Error;
    /// let e = Error::invalid("spec.prefix", "must be at most 32 for IPv4");
    /// assert_eq!(
    ///     e.body(),
    ///     serde_json::json!({"reason": "Invalid", "message": "must be at most 32 for IPv4", "field": "spec.prefix"})
    /// );
    /// ```
    pub fn body(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "reason": self.reason, "message": self.message });
        if let Some(f) = &self.field {
            v["field"] = serde_json::Value::String(f.clone());
        }
        v
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} ({field}): {}", self.reason, self.message),
            None => write!(f, "{}: {}", self.reason, self.message),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_to_a_distinct_purposeful_status() {
        let kinds = [
            (ErrorKind::Malformed, 400),
            (ErrorKind::Unauthorized, 401),
            (ErrorKind::NotFound, 404),
            (ErrorKind::MethodNotAllowed, 405),
            (ErrorKind::Conflict, 409),
            (ErrorKind::Exhausted, 409),
            (ErrorKind::PayloadTooLarge, 413),
            (ErrorKind::Invalid, 422),
            (ErrorKind::Internal, 500),
            (ErrorKind::Transient, 503),
        ];
        for (k, s) in kinds {
            assert_eq!(k.status(), s, "{k:?}");
        }
    }

    #[test]
    fn under_builds_field_paths() {
        let e = Error::invalid("[2]", "bad")
            .under("addresses")
            .under("spec");
        assert_eq!(e.field(), Some("spec.addresses[2]"));
        let e = Error::malformed("x").under("spec");
        assert_eq!(e.field(), Some("spec"));
    }

    #[test]
    fn display_includes_reason_field_and_message() {
        let e = Error::invalid("spec.prefix", "too long");
        assert_eq!(e.to_string(), "Invalid (spec.prefix): too long");
    }
}
