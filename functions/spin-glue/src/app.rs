//! The pipeline of components that may talk to the Kubernetes API or chain
//! to other components: [`serve_component`].
//!
//! Compared with [`crate::serve`] it reads the optional variables too
//! (`events_token`, `k8s_api_url`, `k8s_token`), opens the store only when
//! the component has one, and gives the core outbound HTTP ([`SpinHttp`]).

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
use crate::http::{render, spin_variable, RequestParts, SetupError, VAR_API_TOKEN};
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
            Err(_) => Err(SetupError::Variable {
                name,
                problem: "could not be read",
            }),
        };
        let api_token = get(VAR_API_TOKEN).map_err(|_| SetupError::Variable {
            name: VAR_API_TOKEN,
            problem: "is not defined",
        })?;
        let swap_policy = SwapPolicy::parse(&optional(crate::http::VAR_KV_SWAP_CHECK)?)
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
    use metal_ipam_core::testing::{Backend, MemKv, TestEnv};

    struct NoHttp;
    impl HttpClient for NoHttp {
        fn send(
            &self,
            _: http::Request<Vec<u8>>,
        ) -> Result<http::Response<Vec<u8>>, TransportError> {
            Err(TransportError("denied".into()))
        }
    }

    fn vars(k8s: bool) -> impl Fn(&str) -> Result<String, variables::Error> {
        move |name: &str| match name {
            "api_token" => Ok("tok".into()),
            "k8s_api_url" if k8s => Ok("http://127.0.0.1:1/".into()),
            "k8s_token" if k8s => Ok("kt".into()),
            other => Err(variables::Error::Undefined(other.into())),
        }
    }

    #[test]
    fn optional_variables_may_be_undeclared() {
        let c = AppConfig::load(vars(false)).unwrap();
        assert_eq!((c.events_token.as_str(), c.kube.is_none()), ("", true));
        let c = AppConfig::load(vars(true)).unwrap();
        assert_eq!(c.kube.unwrap().base_url, "http://127.0.0.1:1");
        let missing = AppConfig::load(|n: &str| Err(variables::Error::Undefined(n.into())));
        assert!(matches!(
            missing,
            Err(SetupError::Variable {
                name: "api_token",
                ..
            })
        ));
    }

    #[test]
    fn a_component_without_store_or_kube_says_so() {
        let env = TestEnv::at(0);
        let req = ApiRequest {
            method: "POST",
            path: "/v1/reconcile",
            query: "",
            authorization: Some("Bearer tok"),
            body: b"",
        };
        let (r, ops) = dispatch_component::<MemKv, NoHttp>(
            &req,
            None,
            &|_| None,
            vars(false),
            None,
            &env,
            &NoHttp,
            metal_ipam_core::components::reconcile_entry,
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
            vars(false),
            Some(&open),
            &env,
            &NoHttp,
            metal_ipam_core::components::reconcile_entry,
        );
        assert_eq!((r.status, r.reason), (500, Some("KubeNotConfigured")));
    }
}
