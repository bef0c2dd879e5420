//! The request pipeline every function component runs: [`serve_component`].
//!
//! 1. [`RequestParts`]: method, path, query and `Authorization` from the
//!    Spin request;
//! 2. [`AppConfig::load`]: `api_token` (required) and the optional
//!    `kv_swap_check`, `events_token`, `k8s_api_url`, `k8s_token`
//!    (unreadable or invalid → 500);
//! 3. the `default` store when the component has one ([`SpinKv`]; failure →
//!    500 if not granted/configured, 503 if the backend failed), wrapped in
//!    [`CountingKv`]; the Kubernetes client when configured; outbound HTTP
//!    ([`SpinHttp`]);
//! 4. the core's component entry ([`metal_ipam_core::components`]);
//! 5. [`render`] to a Spin response, and one JSON log line on stdout.
//!
//! Steps 2–4 are [`dispatch_component`], generic over store, variables and
//! transport, so that it runs natively in tests.

use std::io::Write;
use std::time::Instant;

use metal_ipam_core::api::{ApiRequest, ApiResponse};
use metal_ipam_core::components::Services;
use metal_ipam_core::kube::{Kube, KubeConfig};
use metal_ipam_core::kv::{CountingKv, KvError, KvStore, OpCounts};
use metal_ipam_core::outbound::{HttpClient, TransportError};
use metal_ipam_core::store::{Ctx, Env, SwapPolicy};
use spin_sdk::http::{Request, Response};
use spin_sdk::variables;

use crate::env::{unix_millis, SpinEnv};
use crate::http::{
    render, spin_variable, variable_problem, RequestParts, SetupError, VAR_API_TOKEN,
    VAR_KV_SWAP_CHECK,
};
use crate::kv::SpinKv;

/// Variable: the token accepted on `/v1/events` besides the API token.
pub const VAR_EVENTS_TOKEN: &str = "events_token";
/// Variable: the Kubernetes API base URL.
pub const VAR_K8S_API_URL: &str = "k8s_api_url";
/// Variable: the Kubernetes bearer token (a ServiceAccount token).
pub const VAR_K8S_TOKEN: &str = "k8s_token";

/// Outbound HTTP through spin-sdk (`wasi:http/outgoing-handler`), blocking
/// on Spin's executor. Subject to the component's `allowed_outbound_hosts`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpinHttp;

impl HttpClient for SpinHttp {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        spin_sdk::http::run(spin_sdk::http::send::<_, http::Response<Vec<u8>>>(req))
            .map_err(|e| TransportError(e.to_string()))
    }
}

/// All variables a component may have; optional ones are empty when the
/// component does not declare them.
#[derive(Clone, PartialEq, Eq)]
pub struct AppConfig {
    /// `api_token` (required).
    pub api_token: String,
    /// `events_token` (optional).
    pub events_token: String,
    /// `kv_swap_check` (optional, `auto`).
    pub swap_policy: SwapPolicy,
    /// Kubernetes access, when both `k8s_api_url` and `k8s_token` are set.
    pub kube: Option<KubeConfig>,
}

impl std::fmt::Debug for AppConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppConfig")
            .field("swap_policy", &self.swap_policy)
            .field("kube", &self.kube)
            .finish_non_exhaustive()
    }
}

impl AppConfig {
    /// Reads the configuration through `get`.
    ///
    /// # Errors
    /// A missing `api_token`, an unreadable variable, or a bad
    /// `kv_swap_check`, as [`SetupError`].
    pub fn load(
        get: impl Fn(&str) -> Result<String, variables::Error>,
    ) -> Result<AppConfig, SetupError> {
        let optional = |name: &'static str| match get(name) {
            Ok(v) => Ok(v),
            Err(variables::Error::Undefined(_)) => Ok(String::new()),
            Err(e) => Err(SetupError::Variable {
                name,
                problem: variable_problem(&e),
            }),
        };
        let api_token = get(VAR_API_TOKEN).map_err(|e| SetupError::Variable {
            name: VAR_API_TOKEN,
            problem: variable_problem(&e),
        })?;
        let swap_policy = SwapPolicy::parse(&optional(VAR_KV_SWAP_CHECK)?)
            .map_err(|_| SetupError::InvalidSwapCheck)?;
        let url = optional(VAR_K8S_API_URL)?;
        let token = optional(VAR_K8S_TOKEN)?;
        let kube = (!url.trim().is_empty() && !token.trim().is_empty()).then(|| KubeConfig {
            base_url: url.trim().trim_end_matches('/').to_string(),
            token: token.trim().to_string(),
        });
        Ok(AppConfig {
            api_token,
            events_token: optional(VAR_EVENTS_TOKEN)?,
            swap_policy,
            kube,
        })
    }
}

/// The handler a component passes to [`serve_component`].
pub type ComponentHandler<K, H> = fn(
    &Services<'_, CountingKv<K>, H>,
    &ApiRequest<'_>,
    Option<&str>,
    &dyn Fn(&str) -> Option<String>,
) -> ApiResponse;

/// Configuration, store, clients and handler for one request, independent
/// of Spin (so it runs natively in tests). Returns the response and the
/// key-value operations made.
#[allow(clippy::too_many_arguments)]
pub fn dispatch_component<K: KvStore, H: HttpClient>(
    req: &ApiRequest<'_>,
    content_type: Option<&str>,
    header: &dyn Fn(&str) -> Option<String>,
    vars: impl Fn(&str) -> Result<String, variables::Error>,
    open: Option<&dyn Fn() -> Result<K, KvError>>,
    env: &dyn Env,
    http: &H,
    handler: ComponentHandler<K, H>,
) -> (ApiResponse, OpCounts) {
    let config = match AppConfig::load(vars) {
        Ok(c) => c,
        Err(e) => return (e.response(), OpCounts::default()),
    };
    let kv = match open.map(|o| o()) {
        None => None,
        Some(Ok(kv)) => Some(CountingKv::new(kv)),
        Some(Err(e)) => return (SetupError::Store(e).response(), OpCounts::default()),
    };
    let ctx = kv.as_ref().map(|kv| Ctx {
        kv,
        env,
        swap_policy: config.swap_policy,
    });
    let kube = config.kube.as_ref().map(|cfg| Kube::new(http, cfg));
    let services = Services {
        ctx: ctx.as_ref(),
        kube: kube.as_ref(),
        http,
        api_token: &config.api_token,
        events_token: &config.events_token,
    };
    let resp = handler(&services, req, content_type, header);
    (resp, kv.map(|k| k.counts()).unwrap_or_default())
}

/// Serves one request of `component`: the body of an `#[http_component]`
/// for components built on [`Services`]. `with_store` says whether the
/// component has the `default` key-value store in spin.toml.
///
/// # Examples
/// ```no_run
/// use spin_sdk::http::{Request, Response};
///
/// #[spin_sdk::http_component]
/// fn handle(req: Request) -> Response {
///     metal_ipam_spin::serve_component("pools", req, true, metal_ipam_core::components::pools)
/// }
/// # fn main() {}
/// ```
pub fn serve_component(
    component: &str,
    req: Request,
    with_store: bool,
    handler: ComponentHandler<SpinKv, SpinHttp>,
) -> Response {
    let started = Instant::now();
    let parts = RequestParts::from_request(&req);
    let api = parts.api_request(req.body());
    let content_type = req
        .header("content-type")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let header = |name: &str| {
        req.header(name)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let env = SpinEnv::new();
    let open = || SpinKv::open_default();
    let (resp, ops) = dispatch_component(
        &api,
        content_type.as_deref(),
        &header,
        spin_variable,
        if with_store { Some(&open) } else { None },
        &env,
        &SpinHttp,
        handler,
    );
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let line = resp.log_line(component, &api, unix_millis(), duration_ms, ops);
    let _ = writeln!(std::io::stdout().lock(), "{line}");
    render(&resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    use metal_ipam_core::components;
    use metal_ipam_core::kv::Swap;
    use metal_ipam_core::testing::{Backend, MemCas, MemKv, TestEnv};
    use serde_json::{json, Value};
    use spin_sdk::http::Method;

    const TOKEN: &str = "s3cret-t0ken";

    /// No outbound HTTP: every request fails as if denied.
    struct NoHttp;
    impl HttpClient for NoHttp {
        fn send(
            &self,
            _: http::Request<Vec<u8>>,
        ) -> Result<http::Response<Vec<u8>>, TransportError> {
            Err(TransportError("denied".into()))
        }
    }

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

    /// Variables: the token, optionally `kv_swap_check`, optionally the
    /// Kubernetes pair; everything else undefined.
    fn vars(
        swap: Option<&'static str>,
        k8s: bool,
    ) -> impl Fn(&str) -> Result<String, variables::Error> {
        move |name: &str| match (name, swap) {
            (VAR_API_TOKEN, _) => Ok(TOKEN.to_string()),
            (VAR_KV_SWAP_CHECK, Some(v)) => Ok(v.to_string()),
            (VAR_K8S_API_URL, _) if k8s => Ok("http://127.0.0.1:1/".into()),
            (VAR_K8S_TOKEN, _) if k8s => Ok("kt".into()),
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
        let open = || Ok(Shared(kv));
        let (resp, ops) = dispatch_component(
            &api,
            None,
            &|_| None,
            vars(Some("auto"), false),
            Some(&open),
            &env,
            &NoHttp,
            components::pools,
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
        let config = AppConfig::load(vars(Some("auto"), true)).unwrap();
        let debug = format!("{config:?}");
        assert!(
            !debug.contains(TOKEN) && !debug.contains("\"kt\""),
            "{debug}"
        );
    }

    #[test]
    fn config_reads_every_variable_and_optional_ones_may_be_undeclared() {
        let c = AppConfig::load(vars(Some("auto"), false)).unwrap();
        assert_eq!(
            (c.api_token.as_str(), c.swap_policy),
            (TOKEN, SwapPolicy::Auto)
        );
        assert_eq!((c.events_token.as_str(), c.kube.is_none()), ("", true));
        let c = AppConfig::load(vars(Some("always"), false)).unwrap();
        assert_eq!(c.swap_policy, SwapPolicy::Always);
        let c = AppConfig::load(vars(Some(""), false)).unwrap();
        assert_eq!(c.swap_policy, SwapPolicy::Auto);
        // kv_swap_check is optional: a component without it means `auto`.
        let c = AppConfig::load(vars(None, false)).unwrap();
        assert_eq!(c.swap_policy, SwapPolicy::Auto);
        let c = AppConfig::load(vars(None, true)).unwrap();
        assert_eq!(c.kube.unwrap().base_url, "http://127.0.0.1:1");
    }

    #[test]
    fn config_errors_name_the_variable_but_never_a_value() {
        let missing = AppConfig::load(|n: &str| Err(variables::Error::Undefined(n.into())));
        assert_eq!(
            missing.unwrap_err(),
            SetupError::Variable {
                name: VAR_API_TOKEN,
                problem: "is not defined"
            }
        );

        let e = AppConfig::load(vars(Some("sometimes-s3cret"), false)).unwrap_err();
        assert_eq!(e, SetupError::InvalidSwapCheck);
        let r = e.response();
        assert_eq!(r.status, 500);
        assert!(!r.body.unwrap().to_string().contains("sometimes"));

        let e = AppConfig::load(|_| Err(variables::Error::Provider("vault said: tok=xyz".into())))
            .unwrap_err();
        let r = e.response();
        assert_eq!((r.status, r.reason), (500, Some("AuthNotConfigured")));
        let body = r.body.unwrap();
        assert!(!body.to_string().contains("xyz"));
        assert_eq!(
            body["message"],
            "the api_token variable could not be read from its provider"
        );

        let e = AppConfig::load(|n: &str| match n {
            VAR_API_TOKEN => Ok(TOKEN.into()),
            _ => Err(variables::Error::Provider("vault said: k=v".into())),
        })
        .unwrap_err();
        let r = e.response();
        assert_eq!((r.status, r.reason), (500, Some("InvalidConfiguration")));
        assert!(!r.body.unwrap().to_string().contains("k=v"));
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

    fn must_not_run(
        _: &Services<'_, CountingKv<MemKv>, NoHttp>,
        _: &ApiRequest<'_>,
        _: Option<&str>,
        _: &dyn Fn(&str) -> Option<String>,
    ) -> ApiResponse {
        panic!("the handler ran although setup failed")
    }

    #[test]
    fn setup_failures_skip_the_store_and_the_handler() {
        let opened = Cell::new(false);
        let env = TestEnv::at(0);
        let parts = RequestParts::from_request(&request(Method::Get, "/v1/pools", None, ""));
        let api = parts.api_request(b"");
        let open = || {
            opened.set(true);
            Ok(MemKv::new(Backend::SpinSqlite))
        };
        let (r, ops) = dispatch_component(
            &api,
            None,
            &|_| None,
            vars(Some("bogus"), false),
            Some(&open),
            &env,
            &NoHttp,
            must_not_run,
        );
        assert_eq!((r.status, ops.total()), (500, 0));
        assert!(!opened.get());

        let broken = || Err::<MemKv, _>(KvError::NoSuchStore);
        let (r, ops) = dispatch_component(
            &api,
            None,
            &|_| None,
            vars(Some("auto"), false),
            Some(&broken),
            &env,
            &NoHttp,
            must_not_run,
        );
        // An unconfigured store is a deployment mistake: 500, like the core.
        assert_eq!(
            (r.status, r.reason, ops.total()),
            (500, Some("StoreMisconfigured"), 0)
        );
    }

    fn inspecting(
        s: &Services<'_, CountingKv<MemKv>, NoHttp>,
        req: &ApiRequest<'_>,
        _: Option<&str>,
        _: &dyn Fn(&str) -> Option<String>,
    ) -> ApiResponse {
        assert_eq!(s.api_token, TOKEN);
        let ctx = s.ctx.expect("a store");
        assert_eq!(ctx.swap_policy, SwapPolicy::Always);
        assert!(
            s.kube.is_some(),
            "the Kubernetes client is built from k8s_api_url and k8s_token"
        );
        assert_eq!(req.path, "/v1/pools");
        let _ = ctx.kv.get("a");
        let _ = ctx.kv.increment("b", 1);
        SetupError::InvalidSwapCheck.response()
    }

    #[test]
    fn dispatch_passes_token_policy_clients_and_counts_to_the_handler() {
        let env = TestEnv::at(0);
        let parts = RequestParts::from_request(&request(Method::Get, "/v1/pools", None, ""));
        let open = || Ok(MemKv::new(Backend::Redis));
        let (r, ops) = dispatch_component(
            &parts.api_request(b""),
            None,
            &|_| None,
            vars(Some("always"), true),
            Some(&open),
            &env,
            &NoHttp,
            inspecting,
        );
        assert_eq!(r.status, 500);
        assert_eq!((ops.get, ops.increment, ops.total()), (1, 1, 2));
    }

    #[test]
    fn a_component_without_store_or_kube_says_so() {
        let env = TestEnv::at(0);
        let req = ApiRequest {
            method: "POST",
            path: "/v1/reconcile",
            query: "",
            authorization: Some("Bearer s3cret-t0ken"),
            body: b"",
        };
        let (r, ops) = dispatch_component::<MemKv, NoHttp>(
            &req,
            None,
            &|_| None,
            vars(None, false),
            None,
            &env,
            &NoHttp,
            components::reconcile,
        );
        assert_eq!(
            (r.status, r.reason, ops.total()),
            (500, Some("StoreMisconfigured"), 0)
        );
        let open = || Ok(MemKv::new(Backend::SpinSqlite));
        let (r, _) = dispatch_component::<MemKv, NoHttp>(
            &req,
            None,
            &|_| None,
            vars(None, false),
            Some(&open),
            &env,
            &NoHttp,
            components::reconcile,
        );
        assert_eq!((r.status, r.reason), (500, Some("KubeNotConfigured")));
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
