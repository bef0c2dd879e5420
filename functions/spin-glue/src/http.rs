//! The request pipeline shared by every function component.
//!
//! [`serve`] is the whole of a component's handler:
//! 1. [`RequestParts`]: method, path, query and `Authorization` from the
//!    Spin request;
//! 2. [`Config::load`]: the `api_token` and `kv_swap_check` variables
//!    (missing or invalid → 500);
//! 3. [`SpinKv::open_default`] (failure → 503), wrapped in [`CountingKv`];
//! 4. the core handler ([`metal_ipam_core::api`]);
//! 5. [`render`] to a Spin response, and one JSON log line on stdout.
//!
//! Steps 2–4 are [`dispatch`], generic over the store and the variable
//! source so that it runs natively in tests. No variable value, token or
//! backend message ever reaches a response or the log.

use std::fmt;
use std::io::Write;
use std::time::Instant;

use metal_ipam_core::api::{ApiRequest, ApiResponse};
use metal_ipam_core::kv::{CountingKv, KvError, KvStore, OpCounts};
use metal_ipam_core::store::{Ctx, Env, SwapPolicy};
use metal_ipam_core::{Error, ErrorKind};
use spin_sdk::http::{Request, Response};
use spin_sdk::variables;

use crate::env::{unix_millis, SpinEnv};
use crate::kv::SpinKv;

/// Variable holding the bearer token (spin.toml `[variables]`).
pub const VAR_API_TOKEN: &str = "api_token";

/// Variable holding the swap read-back policy: `auto` or `always`.
pub const VAR_KV_SWAP_CHECK: &str = "kv_swap_check";

/// The parts of an HTTP request the core looks at, owned so that an
/// [`ApiRequest`] can borrow them next to the request body.
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
            .finish()
    }
}

impl RequestParts {
    /// Extracts the parts from a Spin request.
    ///
    /// The path is the full path of the request URI, which Spin passes
    /// unchanged: the same as the `spin-full-url` header's path, whereas
    /// `spin-path-info` would be relative to the matched route (`/ns/name`
    /// under `/v1/pools/...`) and is not used.
    pub fn from_request(req: &Request) -> Self {
        RequestParts {
            method: req.method().to_string().to_ascii_uppercase(),
            path: req.path().to_string(),
            query: req.query().to_string(),
            authorization: req
                .header("authorization")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        }
    }

    /// The core's view of the request, with `body`.
    pub fn api_request<'a>(&'a self, body: &'a [u8]) -> ApiRequest<'a> {
        ApiRequest {
            method: &self.method,
            path: &self.path,
            query: &self.query,
            authorization: self.authorization.as_deref(),
            body,
        }
    }
}

/// The component's configuration, read from Spin variables per request.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// The bearer token clients must present (checked by the core; an empty
    /// one makes the core refuse every request).
    pub api_token: String,
    /// The `kv_swap_check` policy.
    pub swap_policy: SwapPolicy,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("api_token", &"<redacted>")
            .field("swap_policy", &self.swap_policy)
            .finish()
    }
}

impl Config {
    /// Reads the configuration through `get` ([`spin_variable`] in a
    /// component).
    ///
    /// # Errors
    /// [`SetupError::Variable`] when a variable cannot be read,
    /// [`SetupError::InvalidSwapCheck`] when `kv_swap_check` is neither
    /// `auto` nor `always` (nor empty, which means `auto`).
    pub fn load(
        get: impl Fn(&str) -> Result<String, variables::Error>,
    ) -> Result<Config, SetupError> {
        let read = |name: &'static str| {
            get(name).map_err(|e| SetupError::Variable {
                name,
                problem: match e {
                    variables::Error::Undefined(_) => "is not defined",
                    variables::Error::InvalidName(_) => "has an invalid name",
                    variables::Error::Provider(_) => "could not be read from its provider",
                    variables::Error::Other(_) => "could not be read",
                },
            })
        };
        let api_token = read(VAR_API_TOKEN)?;
        let swap_policy = SwapPolicy::parse(&read(VAR_KV_SWAP_CHECK)?)
            .map_err(|_| SetupError::InvalidSwapCheck)?;
        Ok(Config {
            api_token,
            swap_policy,
        })
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

/// Configuration, store and handler for one request: everything of
/// [`serve`] between parsing and rendering, independent of Spin.
///
/// Returns the response and the key-value operations the handler made
/// (zero when setup failed).
pub fn dispatch<K, H>(
    req: &ApiRequest<'_>,
    vars: impl Fn(&str) -> Result<String, variables::Error>,
    open: impl FnOnce() -> Result<K, KvError>,
    env: &dyn Env,
    handler: H,
) -> (ApiResponse, OpCounts)
where
    K: KvStore,
    H: FnOnce(&Ctx<'_, CountingKv<K>>, &str, &ApiRequest<'_>) -> ApiResponse,
{
    let config = match Config::load(vars) {
        Ok(c) => c,
        Err(e) => return (e.response(), OpCounts::default()),
    };
    let kv = match open() {
        Ok(kv) => CountingKv::new(kv),
        Err(e) => return (SetupError::Store(e).response(), OpCounts::default()),
    };
    let ctx = Ctx {
        kv: &kv,
        env,
        swap_policy: config.swap_policy,
    };
    let resp = handler(&ctx, &config.api_token, req);
    (resp, kv.counts())
}

/// Renders an [`ApiResponse`]: its status and headers, and its JSON body
/// with `content-type: application/json` when it has one.
pub fn render(resp: &ApiResponse) -> Response {
    let mut b = Response::builder();
    b.status(resp.status);
    for (name, value) in &resp.headers {
        b.header(*name, value.as_str());
    }
    match &resp.body {
        Some(body) => {
            b.header("content-type", "application/json");
            b.body(body.to_string());
        }
        None => {
            b.body(Vec::new());
        }
    }
    b.build()
}

/// Serves one request of `component` with a core handler; the body of every
/// function's `#[http_component]`.
///
/// Writes exactly one JSON line ([`ApiResponse::log_line`]) to stdout; a
/// failing stdout is ignored rather than failing the request.
///
/// # Examples
/// ```no_run
/// use spin_sdk::http::{Request, Response};
///
/// #[spin_sdk::http_component]
/// fn handle(req: Request) -> Response {
///     metal_ipam_spin::serve("pools", req, metal_ipam_core::api::pools)
/// }
/// # fn main() {}
/// ```
pub fn serve<H>(component: &str, req: Request, handler: H) -> Response
where
    H: FnOnce(&Ctx<'_, CountingKv<SpinKv>>, &str, &ApiRequest<'_>) -> ApiResponse,
{
    let started = Instant::now();
    let parts = RequestParts::from_request(&req);
    let api = parts.api_request(req.body());
    let env = SpinEnv::new();
    let (resp, ops) = dispatch(&api, spin_variable, SpinKv::open_default, &env, handler);
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let line = resp.log_line(component, &api, unix_millis(), duration_ms, ops);
    let _ = writeln!(std::io::stdout().lock(), "{line}");
    render(&resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    use metal_ipam_core::api;
    use metal_ipam_core::kv::Swap;
    use metal_ipam_core::testing::{Backend, MemCas, MemKv, TestEnv};
    use serde_json::{json, Value};
    use spin_sdk::http::Method;

    const TOKEN: &str = "s3cret-t0ken";

    /// Lets several dispatches share one in-memory store.
    struct Shared<'a>(&'a MemKv);

    impl KvStore for Shared<'_> {
        type Cas = MemCas;
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
            self.0.get(key)
        }
        fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
            self.0.set(key, value)
        }
        fn delete(&self, key: &str) -> Result<(), KvError> {
            self.0.delete(key)
        }
        fn list_keys(&self) -> Result<Vec<String>, KvError> {
            self.0.list_keys()
        }
        fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
            self.0.increment(key, delta)
        }
        fn cas_read(&self, key: &str) -> Result<(MemCas, Option<Vec<u8>>), KvError> {
            self.0.cas_read(key)
        }
        fn cas_swap(&self, cas: MemCas, value: &[u8]) -> Result<Swap, KvError> {
            self.0.cas_swap(cas, value)
        }
    }

    fn vars(swap: Option<&'static str>) -> impl Fn(&str) -> Result<String, variables::Error> {
        move |name| match (name, swap) {
            (VAR_API_TOKEN, _) => Ok(TOKEN.to_string()),
            (VAR_KV_SWAP_CHECK, Some(v)) => Ok(v.to_string()),
            (other, _) => Err(variables::Error::Undefined(format!("{other} is undefined"))),
        }
    }

    fn request(method: Method, uri: &str, auth: Option<&str>, body: &str) -> Request {
        let mut b = Request::builder();
        b.method(method).uri(uri).body(body.to_string());
        if let Some(a) = auth {
            b.header("Authorization", a);
        }
        b.build()
    }

    /// One request through parsing, dispatch, rendering and the log line.
    fn run(kv: &MemKv, req: &Request) -> (Response, String, OpCounts) {
        let parts = RequestParts::from_request(req);
        let api = parts.api_request(req.body());
        let env = TestEnv::at(1_700_000_000);
        let (resp, ops) = dispatch(
            &api,
            vars(Some("auto")),
            || Ok(Shared(kv)),
            &env,
            api::pools,
        );
        let line = resp.log_line("pools", &api, 1, 0.5, ops);
        (render(&resp), line, ops)
    }

    fn json_body(r: &Response) -> Value {
        serde_json::from_slice(r.body()).unwrap_or(Value::Null)
    }

    fn header<'a>(r: &'a Response, name: &str) -> Option<&'a str> {
        r.header(name).and_then(|v| v.as_str())
    }

    #[test]
    fn request_parts_from_a_full_url() {
        let req = request(
            Method::Put,
            "http://127.0.0.1:3000/v1/pools/ns/p?dryRun=1&x=%2F",
            Some("Bearer abc"),
            "{}",
        );
        let parts = RequestParts::from_request(&req);
        assert_eq!(parts.method, "PUT");
        assert_eq!(parts.path, "/v1/pools/ns/p");
        assert_eq!(parts.query, "dryRun=1&x=%2F");
        assert_eq!(parts.authorization.as_deref(), Some("Bearer abc"));
        let api = parts.api_request(req.body());
        assert_eq!(api.body, b"{}");
        assert_eq!(api.authorization, Some("Bearer abc"));
    }

    #[test]
    fn request_parts_from_an_origin_form_uri() {
        let req = request(Method::Delete, "/v1/claims/ns/m-0?uid=u-1", None, "");
        let parts = RequestParts::from_request(&req);
        assert_eq!(parts.method, "DELETE");
        assert_eq!(parts.path, "/v1/claims/ns/m-0");
        assert_eq!(parts.query, "uid=u-1");
        assert_eq!(parts.authorization, None);
        let parts = RequestParts::from_request(&request(Method::Get, "/v1/pools", None, ""));
        assert_eq!(
            (parts.path.as_str(), parts.query.as_str()),
            ("/v1/pools", "")
        );
    }

    #[test]
    fn other_methods_are_upper_cased() {
        let req = request(Method::Other("purge".into()), "/v1/pools", None, "");
        assert_eq!(RequestParts::from_request(&req).method, "PURGE");
        let req = request(Method::Patch, "/v1/pools", None, "");
        assert_eq!(RequestParts::from_request(&req).method, "PATCH");
    }

    #[test]
    fn debug_output_redacts_credentials() {
        let parts = RequestParts::from_request(&request(Method::Get, "/", Some("Bearer abc"), ""));
        assert!(!format!("{parts:?}").contains("abc"));
        let config = Config::load(vars(Some("auto"))).unwrap();
        assert!(!format!("{config:?}").contains(TOKEN));
    }

    #[test]
    fn config_reads_both_variables() {
        let c = Config::load(vars(Some("auto"))).unwrap();
        assert_eq!(
            (c.api_token.as_str(), c.swap_policy),
            (TOKEN, SwapPolicy::Auto)
        );
        let c = Config::load(vars(Some("always"))).unwrap();
        assert_eq!(c.swap_policy, SwapPolicy::Always);
        let c = Config::load(vars(Some(""))).unwrap();
        assert_eq!(c.swap_policy, SwapPolicy::Auto);
    }

    #[test]
    fn config_errors_name_the_variable_but_never_a_value() {
        let e = Config::load(vars(None)).unwrap_err();
        assert_eq!(
            e,
            SetupError::Variable {
                name: VAR_KV_SWAP_CHECK,
                problem: "is not defined"
            }
        );
        let r = e.response();
        assert_eq!((r.status, r.reason), (500, Some("InvalidConfiguration")));
        assert!(!r.body.unwrap().to_string().contains("is undefined"));

        let e = Config::load(vars(Some("sometimes-s3cret"))).unwrap_err();
        assert_eq!(e, SetupError::InvalidSwapCheck);
        let r = e.response();
        assert_eq!(r.status, 500);
        assert!(!r.body.unwrap().to_string().contains("sometimes"));

        let e = Config::load(|_| Err(variables::Error::Provider("vault said: tok=xyz".into())))
            .unwrap_err();
        let r = e.response();
        assert_eq!((r.status, r.reason), (500, Some("AuthNotConfigured")));
        let body = r.body.unwrap();
        assert!(!body.to_string().contains("xyz"));
        assert_eq!(
            body["message"],
            "the api_token variable could not be read from its provider"
        );
    }

    #[test]
    fn store_open_errors_map_like_core_store_errors_without_backend_messages() {
        for (e, status, reason) in [
            (KvError::AccessDenied, 500, "StoreMisconfigured"),
            (KvError::NoSuchStore, 500, "StoreMisconfigured"),
            (
                KvError::Other("redis://:pw@host".into()),
                503,
                "StoreUnavailable",
            ),
        ] {
            let r = SetupError::Store(e).response();
            assert_eq!((r.status, r.reason), (status, Some(reason)));
            let body = r.body.clone().unwrap().to_string();
            assert!(!body.contains("pw@"), "{body}");
            let rendered = render(&r);
            assert_eq!(*rendered.status(), status);
            assert_eq!(header(&rendered, "content-type"), Some("application/json"));
            if status == 503 {
                assert_eq!(header(&rendered, "retry-after"), Some("1"));
                // The backend's text is kept for the log line only.
                assert_eq!(
                    r.detail.as_deref(),
                    Some("key-value store error: redis://:pw@host")
                );
            }
        }
    }

    #[test]
    fn render_sets_json_content_type_only_with_a_body() {
        let r = SetupError::InvalidSwapCheck.response();
        let out = render(&r);
        assert_eq!(*out.status(), 500);
        assert_eq!(header(&out, "content-type"), Some("application/json"));
        assert_eq!(json_body(&out), r.body.unwrap());

        let empty = ApiResponse {
            status: 204,
            body: None,
            headers: vec![("location", "/x".to_string())],
            route: "/v1/claims/{namespace}/{name}",
            outcome: "released",
            reason: None,
            objects: Vec::new(),
            detail: None,
        };
        let out = render(&empty);
        assert_eq!(*out.status(), 204);
        assert_eq!(header(&out, "content-type"), None);
        assert_eq!(header(&out, "location"), Some("/x"));
        assert!(out.body().is_empty());
    }

    #[test]
    fn setup_failures_skip_the_store_and_the_handler() {
        let opened = Cell::new(false);
        let called = Cell::new(false);
        let env = TestEnv::at(0);
        let parts = RequestParts::from_request(&request(Method::Get, "/v1/pools", None, ""));
        let (r, ops) = dispatch(
            &parts.api_request(b""),
            vars(None),
            || {
                opened.set(true);
                Ok(MemKv::new(Backend::SpinSqlite))
            },
            &env,
            |_: &Ctx<'_, CountingKv<MemKv>>, _: &str, _: &ApiRequest<'_>| {
                called.set(true);
                SetupError::InvalidSwapCheck.response()
            },
        );
        assert_eq!((r.status, ops.total()), (500, 0));
        assert!(!opened.get() && !called.get());

        let (r, ops) = dispatch(
            &parts.api_request(b""),
            vars(Some("auto")),
            || Err::<MemKv, _>(KvError::NoSuchStore),
            &env,
            |_: &Ctx<'_, CountingKv<MemKv>>, _: &str, _: &ApiRequest<'_>| {
                called.set(true);
                SetupError::InvalidSwapCheck.response()
            },
        );
        // An unconfigured store is a deployment mistake: 500, like the core.
        assert_eq!(
            (r.status, r.reason, ops.total()),
            (500, Some("StoreMisconfigured"), 0)
        );
        assert!(!called.get());
    }

    #[test]
    fn dispatch_passes_token_policy_and_counts_to_the_handler() {
        let env = TestEnv::at(0);
        let parts = RequestParts::from_request(&request(Method::Get, "/v1/pools", None, ""));
        let (r, ops) = dispatch(
            &parts.api_request(b""),
            vars(Some("always")),
            || Ok(MemKv::new(Backend::Redis)),
            &env,
            |ctx: &Ctx<'_, CountingKv<MemKv>>, token: &str, req: &ApiRequest<'_>| {
                assert_eq!(token, TOKEN);
                assert_eq!(ctx.swap_policy, SwapPolicy::Always);
                assert_eq!(req.path, "/v1/pools");
                let _ = ctx.kv.get("a");
                let _ = ctx.kv.increment("b", 1);
                SetupError::InvalidSwapCheck.response()
            },
        );
        assert_eq!(r.status, 500);
        assert_eq!((ops.get, ops.increment, ops.total()), (1, 1, 2));
    }

    #[test]
    fn a_pool_round_trip_through_the_pipeline() {
        let kv = MemKv::new(Backend::SpinSqlite);
        let bearer = format!("Bearer {TOKEN}");
        let pool = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"addresses": ["10.1.0.0/24"], "prefix": 24}});

        let (r, line, _) = run(
            &kv,
            &request(
                Method::Put,
                "http://h/v1/pools/ns/p",
                Some(&bearer),
                &pool.to_string(),
            ),
        );
        assert_eq!(*r.status(), 201, "{}", String::from_utf8_lossy(r.body()));
        assert_eq!(header(&r, "content-type"), Some("application/json"));
        let log: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (log["status"].as_u64(), log["method"].as_str()),
            (Some(201), Some("PUT"))
        );
        assert!(log["kv_ops"].as_u64().unwrap_or(0) > 0);

        let (r, _, ops) = run(&kv, &request(Method::Get, "/v1/pools", Some(&bearer), ""));
        assert_eq!(*r.status(), 200);
        assert_eq!(json_body(&r)["items"].as_array().map(Vec::len), Some(1));
        assert!(ops.list_keys >= 1);

        let (r, line, ops) = run(
            &kv,
            &request(Method::Get, "/v1/pools", Some("Bearer wrong"), ""),
        );
        assert_eq!(*r.status(), 401);
        assert!(header(&r, "www-authenticate").is_some());
        assert_eq!(ops.total(), 0);
        for text in [line.as_str(), &String::from_utf8_lossy(r.body())] {
            assert!(!text.contains(TOKEN) && !text.contains("wrong"), "{text}");
        }

        let (r, _, _) = run(
            &kv,
            &request(Method::Delete, "/v1/pools/ns/p", Some(&bearer), ""),
        );
        assert_eq!(*r.status(), 204);
        assert_eq!(header(&r, "content-type"), None);
        assert!(r.body().is_empty());
    }
}
