//! The Spin-facing pieces of the request pipeline ([`crate::serve`]):
//! [`RequestParts`], the head of a Spin request, [`SetupError`] for failures before
//! the core runs, [`render`] back to a Spin response, and [`spin_variable`].
//! No variable value, token or backend message ever reaches a response or
//! the log.

use std::fmt;

use metal_ipam_core::http::api::{ApiRequest, ApiResponse};
use metal_ipam_core::ports::kv::KvError;
use metal_ipam_core::{Error, ErrorKind};
use spin_sdk::http::{IncomingRequest, Response};
use spin_sdk::variables;

/// Variable holding the bearer token (spin.toml `[variables]`).
pub const VAR_API_TOKEN: &str = "api_token";

/// Variable holding the swap read-back policy: `auto` or `always`.
pub const VAR_KV_SWAP_CHECK: &str = "kv_swap_check";

/// The head of an HTTP request (everything but the body), owned so that an
/// [`ApiRequest`] can borrow it next to the body, which is read later (or
/// never: see [`crate::admit`]).
#[derive(Clone, PartialEq, Eq)]
pub struct RequestParts {
    /// Method, upper case (`Method::Other` values are upper-cased too).
    pub method: String,
    /// The URI path, percent-encoding untouched; empty if the URI did not
    /// parse (the core then answers 404 `NoSuchRoute`).
    pub path: String,
    /// The query string without `?`, possibly empty.
    pub query: String,
    /// The `Authorization` header, if present and valid UTF-8.
    pub authorization: Option<String>,
    /// Every header whose value is valid UTF-8, names in lower case, in the
    /// order received (Spin refuses a request with a header that is not).
    pub headers: Vec<(String, String)>,
}

impl fmt::Debug for RequestParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestParts")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("query", &self.query)
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "headers",
                &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RequestParts {
    /// The parts of a request with `method`, `path_with_query` (the
    /// request target, e.g. `/v1/pools/ns/p?dryRun=1`; an absolute URL is
    /// accepted too) and `headers`.
    ///
    /// The path is the full path of the request URI, which Spin passes
    /// unchanged: the same as the `spin-full-url` header's path, whereas
    /// `spin-path-info` would be relative to the matched route (`/ns/name`
    /// under `/v1/pools/...`) and is not used.
    pub fn new(
        method: &str,
        path_with_query: &str,
        headers: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Self {
        let uri = http::Uri::try_from(path_with_query).ok();
        let headers: Vec<(String, String)> = headers
            .into_iter()
            .filter_map(|(n, v)| Some((n.to_ascii_lowercase(), String::from_utf8(v).ok()?)))
            .collect();
        let mut parts = RequestParts {
            method: method.to_ascii_uppercase(),
            path: uri
                .as_ref()
                .map(|u| u.path().to_string())
                .unwrap_or_default(),
            query: uri
                .as_ref()
                .and_then(|u| u.query())
                .unwrap_or_default()
                .to_string(),
            authorization: None,
            headers,
        };
        parts.authorization = parts.header("authorization").map(str::to_string);
        parts
    }

    /// The head of a Spin request; its body is left unread.
    pub fn from_incoming(req: &IncomingRequest) -> Self {
        Self::new(
            &req.method().to_string(),
            &req.path_with_query().unwrap_or_default(),
            req.headers().entries(),
        )
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `Content-Length` the client declared, if any (and a number).
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.trim().parse().ok()
    }

    /// The core's view of the request, with `body`.
    pub fn api_request<'a>(&'a self, body: &'a [u8]) -> ApiRequest<'a> {
        ApiRequest {
            method: &self.method,
            path: &self.path,
            query: &self.query,
            authorization: self.authorization.as_deref(),
            body,
            headers: &self.headers,
        }
    }
}

/// What went wrong reading a variable, in words that never include the
/// host's message (which may quote a value).
pub fn variable_problem(e: &variables::Error) -> &'static str {
    match e {
        variables::Error::Undefined(_) => "is not defined",
        variables::Error::InvalidName(_) => "has an invalid name",
        variables::Error::Provider(_) => "could not be read from its provider",
        variables::Error::Other(_) => "could not be read",
    }
}

/// Reads a Spin variable (`fermyon:spin/variables`).
///
/// # Errors
/// The host's error: undefined, invalid name, provider failure.
pub fn spin_variable(name: &str) -> Result<String, variables::Error> {
    variables::get(name)
}

/// A failure before the core handler could run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupError {
    /// A variable could not be read (500).
    Variable {
        /// The variable's name.
        name: &'static str,
        /// What went wrong, without the host's message.
        problem: &'static str,
    },
    /// `kv_swap_check` holds an unknown value (500; the value is not echoed).
    InvalidSwapCheck,
    /// The key-value store could not be opened (500 if not granted or not
    /// configured, 503 if the backend failed).
    Store(KvError),
}

impl SetupError {
    /// The error as the core's [`Error`]: kind (hence status), reason and a
    /// message that names the problem but never a value or backend message.
    pub fn to_error(&self) -> Error {
        match self {
            SetupError::Variable { name, problem } => Error::new(
                ErrorKind::Internal,
                if *name == VAR_API_TOKEN {
                    "AuthNotConfigured"
                } else {
                    "InvalidConfiguration"
                },
                format!("the {name} variable {problem}"),
            ),
            SetupError::InvalidSwapCheck => Error::new(
                ErrorKind::Internal,
                "InvalidConfiguration",
                format!("the {VAR_KV_SWAP_CHECK} variable must be \"auto\" or \"always\""),
            ),
            // The same mapping as a store error in the middle of a step:
            // misconfiguration is a 500, a backend failure a 503; the
            // backend's text goes to the log only.
            SetupError::Store(e) => Error::from(e.clone()),
        }
    }

    /// The response, rendered by the core like any other error. The route
    /// is left empty (routing happens in the core, which did not run).
    pub fn response(&self) -> ApiResponse {
        ApiResponse::from_error(&self.to_error(), "")
    }
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_error().fmt(f)
    }
}

impl std::error::Error for SetupError {}

/// Renders an [`ApiResponse`]: its status and headers, and its text body
/// with its content type, or else its JSON body with `content-type:
/// application/json` when it has one.
pub fn render(resp: &ApiResponse) -> Response {
    let mut b = Response::builder();
    b.status(resp.status);
    for (name, value) in &resp.headers {
        b.header(*name, value.as_str());
    }
    match (&resp.text, &resp.body) {
        (Some((content_type, text)), _) => {
            b.header("content-type", *content_type);
            b.body(text.clone());
        }
        (None, Some(body)) => {
            b.header("content-type", "application/json");
            b.body(body.to_string());
        }
        (None, None) => {
            b.body(Vec::new());
        }
    }
    b.build()
}
