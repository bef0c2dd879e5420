//! The error every cloud's client answers with: [`CloudError`], what
//! happened on the wire (an API status and its messages, a budget spent, an
//! outcome unknown, a body that did not parse, a transport refusal).
//! Serialised into the attach and detach steps' answers as it is.

/// What went wrong calling the cloud's API. Serialisable (tagged by
/// `kind`), so a step run by another component (the attach and detach
/// steps) hands back exactly what happened. Transport-level, so every
/// HTTP cloud's client answers with it; which reasons it maps to is the
/// implementation's (Metal's: `MetalNotFound`, `MetalRefused`, ….).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum CloudError {
    /// The API answered with an error status (4xx but 429, or 5xx on a
    /// request that would not be retried).
    Api {
        /// HTTP status.
        status: u16,
        /// `METHOD path` of the request.
        request: String,
        /// `error` / `errors` of the body, when it had one.
        messages: Vec<String>,
    },
    /// Rate limited or unavailable past the request's time budget.
    Unavailable {
        /// Seconds until a retry is worthwhile.
        retry_after_s: u64,
        /// What happened last.
        detail: String,
    },
    /// A request that is not safe to repeat got no answer or a 5xx: it may
    /// or may not have taken effect.
    OutcomeUnknown {
        /// What happened.
        detail: String,
    },
    /// A success whose body is not what the spec promises.
    Malformed {
        /// What did not parse.
        detail: String,
    },
    /// The TLS connection to the cloud failed (an untrusted or invalid
    /// certificate, a protocol error): nothing was sent, and retrying does
    /// not help until the configuration changes.
    Tls {
        /// What the transport said.
        detail: String,
    },
    /// The runtime refused the request (`allowed_outbound_hosts`, a bad
    /// API URL): nothing was sent.
    Denied {
        /// What the transport said.
        detail: String,
    },
}

impl CloudError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            CloudError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether an API error's messages contain `text` (case-insensitive):
    /// how the 422s that mean "already so" are recognised. Such a 422
    /// counts as success only once a re-read confirms the state.
    ///
    /// ```
    /// use metal_ipam_core::cloud::CloudError;
    /// let e = CloudError::Api { status: 422, request: "POST /ports/p/unassign".into(),
    ///     messages: vec!["Virtual network 1001 not assigned".into()] };
    /// assert!(e.says(422, "not assigned"));
    /// assert!(!e.says(404, "not assigned"));
    /// ```
    pub fn says(&self, status: u16, text: &str) -> bool {
        let text = text.to_ascii_lowercase();
        matches!(self, CloudError::Api { status: s, messages, .. }
            if *s == status && messages.iter().any(|m| m.to_ascii_lowercase().contains(&text)))
    }
}

impl std::fmt::Display for CloudError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloudError::Api {
                status,
                request,
                messages,
            } => write!(f, "{request}: {status} {}", messages.join("; ")),
            CloudError::Unavailable {
                retry_after_s,
                detail,
            } => write!(f, "{detail} (retry in {retry_after_s} s)"),
            CloudError::OutcomeUnknown { detail }
            | CloudError::Malformed { detail }
            | CloudError::Tls { detail }
            | CloudError::Denied { detail } => f.write_str(detail),
        }
    }
}
