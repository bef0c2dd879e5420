//! The request pipeline every function component runs: [`serve`] (written
//! by [`component!`](crate::component)).
//!
//! 1. [`RequestParts`]: the request head (method, path, query, headers);
//!    the body is not read yet; a route that needs no credential (the
//!    browser view's page and files) is answered from it at once
//!    ([`dispatch::public`]);
//! 2. [`admit`], from the head alone: [`AppConfig::load`] (`api_token`
//!    required; the optional `kv_swap_check`, `events_token`, `read_token`,
//!    `k8s_api_url`, `k8s_token`, and `metal_api_url`, `metal_token`,
//!    `metal_project_id`; unreadable or invalid → 500), the one
//!    authentication by the route's policy ([`dispatch::authenticate`]; no
//!    accepted credential → 401; deferred until the body is read when the
//!    events token may travel in it) and the declared size
//!    (`Content-Length` over [`MAX_BODY`] → 413);
//! 3. [`read_body`]: the body, chunk by chunk, given up with 413 as soon as
//!    it passes [`MAX_BODY`] (a body without `Content-Length`, e.g.
//!    chunked, is never buffered past the limit either);
//! 4. [`dispatch_admitted`]: the `default` store when the component has
//!    one ([`SpinKv`]; failure → 500 if not granted/configured, 503 if the
//!    backend failed), wrapped in [`CountingKv`]; the Kubernetes client
//!    when configured; the Metal client when configured (only the
//!    components that call Metal declare its variables: `provision`,
//!    `assign`, `poll`, `network`, `attach-vlan`, `detach-vlan`); outbound
//!    HTTP ([`SpinHttp`], every request with its deadline); then the core's
//!    component entry ([`metal_ipam_core::http::dispatch`]: 404, 405, the
//!    route's handler);
//! 5. [`render`] to a Spin response written to the response outparam, and
//!    one JSON log line on stdout.
//!
//! Steps 1–4 are [`pipeline`], generic over store, variables, body stream
//! and transport, so that it runs natively in tests. Every answer of steps
//! 2–3 is rendered by the core ([`ApiResponse::from_error`]), like any
//! other error.

use std::io::Write;
use std::time::Instant;

use futures::{Stream, StreamExt};
use metal_ipam_core::http::api::{ApiResponse, MAX_BODY};
use metal_ipam_core::http::auth::Tokens;
use metal_ipam_core::http::dispatch::{self, Admitted, Entry, PublicRoutes, Services};
use metal_ipam_core::kube::{Kube, KubeConfig};
use metal_ipam_core::kv::{Ctx, SwapPolicy};
use metal_ipam_core::metal::client::{Metal, MetalConfig, BASE_PATH};
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::observe::counters::{self, Tally};
use metal_ipam_core::pnap::auth::{Credentials, TOKEN_PATH};
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::ports::http::{HttpClient, TransportError};
use metal_ipam_core::ports::kv::{CountingKv, KvError, KvStore, OpCounts};
use metal_ipam_core::ports::Env;
use metal_ipam_core::routes::Component;
use metal_ipam_core::Error;
use spin_sdk::http::{Fields, IncomingRequest, OutgoingResponse, Response, ResponseOutparam};
use spin_sdk::variables;

use crate::env::{unix_millis, SpinEnv};
use crate::http::{
    render, spin_variable, variable_problem, RequestParts, SetupError, VAR_API_TOKEN,
    VAR_KV_SWAP_CHECK,
};
use crate::kv::SpinKv;

/// Variable: the token accepted on `/v1/events` besides the API token.
pub const VAR_EVENTS_TOKEN: &str = "events_token";
/// Variable: the token accepted besides the API token on the read-only
/// routes (`/v1/metrics`, `/ui/api/…`); only `metrics` and `ui` declare it.
pub const VAR_READ_TOKEN: &str = "read_token";
/// Variable: the Kubernetes API base URL.
pub const VAR_K8S_API_URL: &str = "k8s_api_url";
/// Variable: the Kubernetes bearer token (a ServiceAccount token).
pub const VAR_K8S_TOKEN: &str = "k8s_token";
/// Variable: the Equinix Metal API server, `scheme://host[:port]` (the
/// client adds [`BASE_PATH`]); only the components that call Metal
/// (`provision`, `assign`, `poll`, `network`, `attach-vlan`, `detach-vlan`)
/// declare the Metal variables.
pub const VAR_METAL_API_URL: &str = "metal_api_url";
/// Variable: the Equinix Metal API token (a secret).
pub const VAR_METAL_TOKEN: &str = "metal_token";
/// Variable: the Equinix Metal project of the VRF-backed pools.
pub const VAR_METAL_PROJECT_ID: &str = "metal_project_id";
/// Variable: the phoenixNAP API server, `scheme://host[:port]` (the
/// client adds each API's base path); only the components that call the
/// clouds declare the phoenixNAP variables.
pub const VAR_PNAP_API_URL: &str = "pnap_api_url";
/// Variable: phoenixNAP's authentication server, `scheme://host[:port]`
/// (the token endpoint's path [`TOKEN_PATH`] is added).
pub const VAR_PNAP_AUTH_URL: &str = "pnap_auth_url";
/// Variable: the phoenixNAP OAuth client id.
pub const VAR_PNAP_CLIENT_ID: &str = "pnap_client_id";
/// Variable: the phoenixNAP OAuth client secret (a secret).
pub const VAR_PNAP_CLIENT_SECRET: &str = "pnap_client_secret";

/// Outbound HTTP on `wasi:http/outgoing-handler`, blocking, never longer
/// than the request's [`Deadline`]: its timeouts as request options
/// (which Spin applies to every request it sends out, not to service
/// chaining, which it serves in-process), and its absolute end checked on
/// every wait (`outbound`). Subject to the component's
/// `allowed_outbound_hosts`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpinHttp;

impl HttpClient for SpinHttp {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        crate::outbound::send(req)
    }
}

/// All variables a component may have; optional ones are empty when the
/// component does not declare them.
#[derive(Clone, PartialEq, Eq)]
pub struct AppConfig {
    /// `api_token` (required, non-empty), without surrounding whitespace.
    pub api_token: String,
    /// `events_token` (optional), without surrounding whitespace.
    pub events_token: String,
    /// `read_token` (optional), without surrounding whitespace.
    pub read_token: String,
    /// `kv_swap_check` (optional, `auto`).
    pub swap_policy: SwapPolicy,
    /// Kubernetes access, when both `k8s_api_url` and `k8s_token` are set.
    pub kube: Option<KubeConfig>,
    /// Equinix Metal access, when `metal_api_url`, `metal_token` and
    /// `metal_project_id` are all set.
    pub metal: Option<MetalConfig>,
    /// phoenixNAP access, when `pnap_api_url`, `pnap_auth_url`,
    /// `pnap_client_id` and `pnap_client_secret` are all set.
    pub pnap: Option<PnapConfig>,
}

impl std::fmt::Debug for AppConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppConfig")
            .field("swap_policy", &self.swap_policy)
            .field("kube", &self.kube)
            .field("metal", &self.metal)
            .field("pnap", &self.pnap)
            .finish_non_exhaustive()
    }
}

impl AppConfig {
    /// Reads the configuration through `get`.
    ///
    /// Tokens are trimmed, as the presented bearer token is: a Secret
    /// written with a trailing newline (`echo token > file`) still matches.
    ///
    /// # Errors
    /// A missing or empty (after trimming) `api_token`, an unreadable
    /// variable, or a bad `kv_swap_check`, as [`SetupError`].
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
        let api_token = api_token.trim();
        if api_token.is_empty() {
            return Err(SetupError::Variable {
                name: VAR_API_TOKEN,
                problem: "is empty",
            });
        }
        let swap_policy = SwapPolicy::parse(&optional(VAR_KV_SWAP_CHECK)?)
            .map_err(|_| SetupError::InvalidSwapCheck)?;
        let url = optional(VAR_K8S_API_URL)?;
        let token = optional(VAR_K8S_TOKEN)?;
        let kube = (!url.trim().is_empty() && !token.trim().is_empty()).then(|| KubeConfig {
            base_url: url.trim().trim_end_matches('/').to_string(),
            token: token.trim().to_string(),
        });
        let (url, token, project) = (
            optional(VAR_METAL_API_URL)?,
            optional(VAR_METAL_TOKEN)?,
            optional(VAR_METAL_PROJECT_ID)?,
        );
        let metal = [&url, &token, &project]
            .iter()
            .all(|v| !v.trim().is_empty())
            .then(|| MetalConfig {
                base_url: format!("{}{BASE_PATH}", url.trim().trim_end_matches('/')),
                token: token.trim().to_string(),
                project_id: project.trim().to_string(),
                retry: RetryPolicy::default(),
            });
        let (api, auth, id, secret) = (
            optional(VAR_PNAP_API_URL)?,
            optional(VAR_PNAP_AUTH_URL)?,
            optional(VAR_PNAP_CLIENT_ID)?,
            optional(VAR_PNAP_CLIENT_SECRET)?,
        );
        let pnap = [&api, &auth, &id, &secret]
            .iter()
            .all(|v| !v.trim().is_empty())
            .then(|| PnapConfig {
                api_url: api.trim().trim_end_matches('/').to_string(),
                token_url: format!("{}{TOKEN_PATH}", auth.trim().trim_end_matches('/')),
                credentials: Credentials {
                    client_id: id.trim().to_string(),
                    client_secret: secret.trim().to_string(),
                },
                retry: RetryPolicy::default(),
            });
        Ok(AppConfig {
            api_token: api_token.to_string(),
            events_token: optional(VAR_EVENTS_TOKEN)?.trim().to_string(),
            read_token: optional(VAR_READ_TOKEN)?.trim().to_string(),
            swap_policy,
            kube,
            metal,
            pnap,
        })
    }
}

/// A component's entry (the core's, [`metal_ipam_core::http::dispatch`]),
/// as the pipeline calls it.
pub type ComponentHandler<K, H> = Entry<CountingKv<K>, Tally<H>>;

/// What a shell serves: the component whose routes' policies
/// authenticate its requests, its name in log lines and counters (the
/// component's, but for the bench's baseline), its entry and the handler
/// of its routes that need no credential, if it has any.
pub struct Serving<K: KvStore, H: HttpClient> {
    /// The component of the route table.
    pub component: Component,
    /// Its name in log lines and counters.
    pub name: &'static str,
    /// Its entry.
    pub handler: ComponentHandler<K, H>,
    /// Its public routes' handler (`ui`'s page and files).
    pub public: Option<PublicRoutes>,
}

impl<K: KvStore, H: HttpClient> Serving<K, H> {
    /// `component` with its own name and `handler`, no public routes.
    pub fn new(component: Component, handler: ComponentHandler<K, H>) -> Self {
        Serving {
            component,
            name: component.name(),
            handler,
            public: None,
        }
    }

    /// With `public` answering the routes that need no credential.
    pub fn with_public(self, public: PublicRoutes) -> Self {
        Serving {
            public: Some(public),
            ..self
        }
    }
}

/// The configured tokens.
fn tokens(config: &AppConfig) -> Tokens<'_> {
    Tokens {
        api: &config.api_token,
        read: &config.read_token,
        events: &config.events_token,
    }
}

/// What can be decided from the request head alone, before any byte of
/// the body is read: the configuration, the credential and the declared
/// size. Returns the configuration and the request's admission (`None`
/// when its credential may be in the body: see below), or the answer
/// (rendered by the core, boxed: it is large) that ends the request with
/// its body unread:
///
/// - 500 when the configuration cannot be loaded ([`SetupError`]);
/// - 401 `Unauthorized` without a credential the route's policy accepts
///   ([`dispatch::authenticate`], the one check); except when the
///   credential may travel in the body (the events token, in the
///   CloudEvents attribute `metalipamtoken`: [`dispatch::credential_in_body`]),
///   where the body is read, within the limit, and the check made then;
/// - 413 `PayloadTooLarge` when `Content-Length` exceeds [`MAX_BODY`].
///
/// # Errors
/// The response that answers the request.
pub fn admit(
    component: Component,
    parts: &RequestParts,
    vars: impl Fn(&str) -> Result<String, variables::Error>,
) -> Result<(AppConfig, Option<Admitted>), Box<ApiResponse>> {
    let config = AppConfig::load(vars).map_err(|e| e.response())?;
    let head = parts.api_request(&[]);
    let admitted = match dispatch::credential_in_body(component, &tokens(&config), head.path) {
        true => None,
        false => Some(dispatch::authenticate(component, &tokens(&config), &head)?),
    };
    if parts.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(Box::new(ApiResponse::from_error(
            &Error::payload_too_large(MAX_BODY),
            "",
        )));
    }
    Ok((config, admitted))
}

/// Reads a body from `chunks`, keeping at most `limit` bytes: as soon as
/// the next chunk would take it past `limit`, the read stops (the rest is
/// never pulled) and the answer is 413.
///
/// # Errors
/// 413 `PayloadTooLarge` past `limit`; 400 `MalformedRequest` when the
/// stream fails (the stream's error goes to the log line only).
pub async fn read_body<S, E>(chunks: S, limit: usize) -> Result<Vec<u8>, Error>
where
    S: Stream<Item = Result<Vec<u8>, E>>,
    E: std::fmt::Debug,
{
    let mut chunks = std::pin::pin!(chunks);
    let mut body = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            Error::malformed("the request body could not be read")
                .with_detail(format!("reading the request body: {e:?}"))
        })?;
        if chunk.len() > limit - body.len() {
            return Err(Error::payload_too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// One request whose body has been read, independent of Spin (so it runs
/// natively in tests): [`dispatch::authenticate`], then
/// [`dispatch_admitted`]. Returns the response and the key-value
/// operations made (none for a refused request).
pub fn dispatch_component<K: KvStore, H: HttpClient + Clone>(
    serving: &Serving<K, H>,
    parts: &RequestParts,
    body: &[u8],
    config: &AppConfig,
    open: Option<&dyn Fn() -> Result<K, KvError>>,
    env: &dyn Env,
    http: &H,
) -> (ApiResponse, OpCounts) {
    let req = parts.api_request(body);
    match dispatch::authenticate(serving.component, &tokens(config), &req) {
        Ok(admitted) => {
            let at = Admission {
                parts,
                body,
                config,
            };
            dispatch_admitted(serving, &at, admitted, open, env, http)
        }
        Err(r) => (*r, OpCounts::default()),
    }
}

/// An admitted request's parts, body and configuration.
pub struct Admission<'a> {
    /// The request head.
    pub parts: &'a RequestParts,
    /// Its body.
    pub body: &'a [u8],
    /// The configuration.
    pub config: &'a AppConfig,
}

/// Store, clients and handler for one authenticated request whose body
/// has been read. Returns the response and the key-value operations made.
///
/// The clients send through a [`Tally`] of `http`; when the component has
/// a store, the request is then counted (`record_request`, below),
/// included in the returned counts.
pub fn dispatch_admitted<K: KvStore, H: HttpClient + Clone>(
    serving: &Serving<K, H>,
    at: &Admission<'_>,
    admitted: Admitted,
    open: Option<&dyn Fn() -> Result<K, KvError>>,
    env: &dyn Env,
    http: &H,
) -> (ApiResponse, OpCounts) {
    let config = at.config;
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
    let tally = Tally::new(
        http.clone(),
        config.kube.as_ref().map(|c| c.base_url.as_str()),
        config.metal.as_ref().map(|c| c.base_url.as_str()),
    );
    let kube = config.kube.as_ref().map(|cfg| Kube::new(&tally, cfg));
    let metal = config
        .metal
        .as_ref()
        .map(|cfg| Metal::new(&tally, cfg, env));
    let pnap = config.pnap.as_ref().map(|cfg| Pnap::new(&tally, cfg, env));
    let services = Services {
        ctx: ctx.as_ref(),
        kube: kube.as_ref(),
        http: &tally,
        api_token: &config.api_token,
        events_token: &config.events_token,
        read_token: &config.read_token,
        metal: metal.as_ref(),
        pnap: pnap.as_ref(),
    };
    let mut resp = (serving.handler)(&services, &at.parts.api_request(at.body), admitted);
    if let Some(ctx) = ctx.as_ref() {
        record_request(ctx, serving.name, &mut resp, &tally);
    }
    (resp, kv.map(|k| k.counts()).unwrap_or_default())
}

/// Counts one answered request of `component` (the one place the shell
/// does): its signature, unless the answer says the handler counted it
/// ([`ApiResponse::counted`]), and its Kubernetes and Metal calls (from
/// `tally`) and compare-and-swap conflicts (from the store's
/// [`CountingKv`]), by [`counters::record_request`]: one `increment` for a
/// request without calls or conflicts, one more per distinct call or
/// conflict counter it touched, and a registry read when a count passes
/// a power of two. A counting failure does not change the answer: it goes
/// to the log line's detail.
fn record_request<K: KvStore, H>(
    ctx: &Ctx<'_, CountingKv<K>>,
    component: &str,
    resp: &mut ApiResponse,
    tally: &Tally<H>,
) {
    let calls = tally.calls();
    let request = counters::Request {
        component,
        route: resp.route,
        status: resp.status,
        outcome: resp.outcome,
        reason: resp.reason.unwrap_or(""),
        conflicts: ctx.kv.conflicts(),
        calls: &calls,
        signature_counted: resp.counted,
    };
    if let Err(e) = counters::record_request(ctx, &request) {
        let note = format!("request not counted: {}", e.reason());
        resp.detail = Some(match resp.detail.take() {
            Some(d) => format!("{d}; {note}"),
            None => note,
        });
    }
}

/// Steps 2–4 of the pipeline: a route that needs no credential is
/// answered first ([`dispatch::public`]: no variables, no store, its body
/// never read); then [`admit`], then [`read_body`] on the stream `body`
/// returns (called only when the request is admitted, so a refused
/// request's body is never read), the authentication a credential in the
/// body waited for, then [`dispatch_admitted`].
pub async fn pipeline<K, H, S, E>(
    serving: &Serving<K, H>,
    parts: &RequestParts,
    body: impl FnOnce() -> S,
    vars: impl Fn(&str) -> Result<String, variables::Error>,
    open: Option<&dyn Fn() -> Result<K, KvError>>,
    (env, http): (&dyn Env, &H),
) -> (ApiResponse, OpCounts)
where
    K: KvStore,
    H: HttpClient + Clone,
    S: Stream<Item = Result<Vec<u8>, E>>,
    E: std::fmt::Debug,
{
    let refused = |r: ApiResponse| (r, OpCounts::default());
    let head = parts.api_request(&[]);
    let public = serving
        .public
        .and_then(|p| dispatch::public(serving.component, &head, p));
    if let Some(r) = public {
        return refused(r);
    }
    let (config, admitted) = match admit(serving.component, parts, vars) {
        Ok(c) => c,
        Err(resp) => return refused(*resp),
    };
    let body = match read_body(body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return refused(ApiResponse::from_error(&e, "")),
    };
    let admitted = match admitted {
        Some(a) => a,
        None => {
            let req = parts.api_request(&body);
            match dispatch::authenticate(serving.component, &tokens(&config), &req) {
                Ok(a) => a,
                Err(r) => return refused(*r),
            }
        }
    };
    let at = Admission {
        parts,
        body: &body,
        config: &config,
    };
    dispatch_admitted(serving, &at, admitted, open, env, http)
}

/// Serves one request of what `serving` says: the body of the
/// `#[http_component]` of every component ([`component!`] writes it).
///
/// Takes the request as a stream ([`IncomingRequest`]) so that nothing is
/// buffered before [`admit`] has looked at the head, and the body is read
/// by [`read_body`], within [`MAX_BODY`].
pub async fn serve(
    serving: &Serving<SpinKv, SpinHttp>,
    req: IncomingRequest,
    response_out: ResponseOutparam,
) {
    let started = Instant::now();
    let parts = RequestParts::from_incoming(&req);
    let env = SpinEnv::new();
    let open = || SpinKv::open_default();
    let (resp, ops) = pipeline(
        serving,
        &parts,
        move || req.into_body_stream(),
        spin_variable,
        if serving.component.has_store() {
            Some(&open)
        } else {
            None
        },
        (&env, &SpinHttp),
    )
    .await;
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let line = resp.log_line(
        serving.name,
        &parts.api_request(&[]),
        unix_millis(),
        duration_ms,
        ops,
    );
    let _ = writeln!(std::io::stdout().lock(), "{line}");
    respond(response_out, render(&resp)).await;
}

/// A component's `wasi:http/incoming-handler` entry point, in one line:
/// `metal_ipam_spin::component!(Pools, pools);` names the component (a
/// [`Component`] variant) and its entry (a function of
/// [`metal_ipam_core::http::dispatch`]); `component!(Ui, ui, ui_files)`
/// names the handler of its routes that need no credential too.
#[macro_export]
macro_rules! component {
    ($component:ident, $entry:ident) => {
        $crate::component!(@serve $component, $entry, None);
    };
    ($component:ident, $entry:ident, $public:ident) => {
        $crate::component!(
            @serve $component,
            $entry,
            Some(::metal_ipam_core::http::dispatch::$public)
        );
    };
    (@serve $component:ident, $entry:ident, $public:expr) => {
        /// The component's `wasi:http/incoming-handler` entry point
        /// (streaming: the body is read by the glue, within the limit,
        /// once the head passed).
        #[::spin_sdk::http_component]
        async fn handle(
            req: ::spin_sdk::http::IncomingRequest,
            out: ::spin_sdk::http::ResponseOutparam,
        ) {
            let component = ::metal_ipam_core::routes::Component::$component;
            let serving = $crate::Serving {
                component,
                name: component.name(),
                handler: ::metal_ipam_core::http::dispatch::$entry,
                public: $public,
            };
            $crate::serve(&serving, req, out).await
        }
    };
}

/// Writes `resp` to the response outparam.
async fn respond(out: ResponseOutparam, resp: Response) {
    let headers: Vec<(String, Vec<u8>)> = resp
        .headers()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
    let fields = Fields::from_list(&headers).unwrap_or_else(|e| {
        eprintln!("invalid response header: {e:?}");
        Fields::new()
    });
    let outgoing = OutgoingResponse::new(fields);
    if outgoing.set_status_code(*resp.status()).is_err() {
        eprintln!("invalid response status {}", resp.status());
    }
    if let Err(e) = out.set_with_body(outgoing, resp.into_body()).await {
        eprintln!("could not send the response: {e:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::convert::Infallible;

    use futures::executor::block_on;
    use futures::stream;

    use metal_ipam_core::http::api::ApiRequest;
    use metal_ipam_core::ports::kv::Swap;
    use metal_ipam_core::testing::{Backend, MemCas, MemKv, TestEnv};
    use serde_json::{json, Value};

    const TOKEN: &str = "s3cret-t0ken";

    /// No outbound HTTP: every request fails as if denied.
    #[derive(Clone, Copy)]
    struct NoHttp;
    impl HttpClient for NoHttp {
        fn send(
            &self,
            _: http::Request<Vec<u8>>,
        ) -> Result<http::Response<Vec<u8>>, TransportError> {
            Err(TransportError::new(
                metal_ipam_core::ports::http::TransportKind::Denied,
                "denied",
            ))
        }
    }

    /// Lets several dispatches share one in-memory store.
    struct Shared<'a>(&'a MemKv);

    impl KvStore for Shared<'_> {
        type Cas = MemCas;
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
            self.0.get(key)
        }
        fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
            self.0.get_many(keys)
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

    /// A request: its head (with `Content-Length` when `body` is not
    /// empty) and its body.
    struct Req {
        parts: RequestParts,
        body: Vec<u8>,
    }

    fn request(method: &str, uri: &str, auth: Option<&str>, body: &str) -> Req {
        let mut headers = Vec::new();
        if let Some(a) = auth {
            headers.push(("Authorization".to_string(), a.as_bytes().to_vec()));
        }
        if !body.is_empty() {
            headers.push((
                "content-length".to_string(),
                body.len().to_string().into_bytes(),
            ));
        }
        Req {
            parts: RequestParts::new(method, uri, headers),
            body: body.as_bytes().to_vec(),
        }
    }

    /// `body` as a stream of 16 KiB chunks (the size spin-sdk reads), and a
    /// counter of the chunks pulled from it.
    fn chunks<'a>(
        body: &'a [u8],
        pulled: &'a Cell<usize>,
    ) -> impl Stream<Item = Result<Vec<u8>, Infallible>> + 'a {
        stream::iter(body.chunks(16 * 1024)).map(move |c| {
            pulled.set(pulled.get() + 1);
            Ok(c.to_vec())
        })
    }

    /// One request through the whole pipeline (admission, body, dispatch),
    /// rendering and the log line, with variables `vars`. Also says how many
    /// body chunks were read.
    fn run_with(
        kv: &MemKv,
        req: &Req,
        vars: impl Fn(&str) -> Result<String, variables::Error>,
        component: Component,
    ) -> (Response, String, OpCounts, usize) {
        let env = TestEnv::at(1_700_000_000);
        let open = || Ok(Shared(kv));
        let pulled = Cell::new(0);
        let serving = Serving {
            component,
            name: "pools",
            handler: dispatch::entry(component),
            public: dispatch::public_routes(component),
        };
        let (resp, ops) = block_on(pipeline(
            &serving,
            &req.parts,
            || chunks(&req.body, &pulled),
            vars,
            Some(&open),
            (&env, &NoHttp),
        ));
        let line = resp.log_line("pools", &req.parts.api_request(&[]), 1, 0.5, ops);
        (render(&resp), line, ops, pulled.get())
    }

    /// [`pipeline`] on `req` with a store from `open`: the response, the
    /// key-value operations and the number of body chunks read.
    fn pipe<K: KvStore>(
        (component, req): (Component, &Req),
        vars: impl Fn(&str) -> Result<String, variables::Error>,
        open: Option<&dyn Fn() -> Result<K, KvError>>,
        handler: ComponentHandler<K, NoHttp>,
    ) -> (ApiResponse, OpCounts, usize) {
        let env = TestEnv::at(0);
        let pulled = Cell::new(0);
        let serving = Serving {
            component,
            name: "test",
            handler,
            public: None,
        };
        let (r, ops) = block_on(pipeline(
            &serving,
            &req.parts,
            || chunks(&req.body, &pulled),
            vars,
            open,
            (&env, &NoHttp),
        ));
        (r, ops, pulled.get())
    }

    /// A component's public routes (the browser view's page and files)
    /// are answered before admission: no token, no store opened, no body
    /// read; its other routes still need the token, and a public route's
    /// answer is logged by the same pipeline as any other.
    #[test]
    fn public_routes_need_no_token_and_nothing_else() {
        let opened = Cell::new(0);
        let kv = MemKv::new(Backend::SpinSqlite);
        let open = || {
            opened.set(opened.get() + 1);
            Ok(Shared(&kv))
        };
        let run = |req: &Req| {
            let env = TestEnv::at(0);
            let pulled = Cell::new(0);
            let (r, ops) = block_on(pipeline(
                &Serving::new(Component::Ui, dispatch::ui).with_public(dispatch::ui_files),
                &req.parts,
                || chunks(&req.body, &pulled),
                vars(Some("auto"), false),
                Some(&open),
                (&env, &NoHttp),
            ));
            (r, ops, pulled.get())
        };
        for path in ["http://h/ui", "http://h/ui/app.js", "http://h/ui/app.css"] {
            let (r, ops, pulled) = run(&request("GET", path, None, "ignored body"));
            assert_eq!(r.status, 200, "{path}: {:?}", r.body);
            assert_eq!((ops.total(), pulled), (0, 0), "{path}");
            let line = r.log_line(
                "ui",
                &request("GET", path, None, "").parts.api_request(&[]),
                1,
                0.1,
                ops,
            );
            assert!(line.contains("\"outcome\":\"served\""), "{line}");
        }
        assert_eq!(opened.get(), 0, "the store is never opened for the page");
        // A file that is not there: 404, still without a token.
        let (r, _, _) = run(&request("GET", "http://h/ui/secrets.json", None, ""));
        assert_eq!(r.status, 404);
        // The data routes: 401 without the token, 200 with it.
        let (r, _, _) = run(&request("GET", "http://h/ui/api/overview", None, ""));
        assert_eq!(r.status, 401);
        assert_eq!(opened.get(), 0);
        let bearer = format!("Bearer {TOKEN}");
        let (r, _, _) = run(&request(
            "GET",
            "http://h/ui/api/overview",
            Some(&bearer),
            "",
        ));
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(opened.get(), 1);
    }

    /// One request to `pools` through the whole pipeline.
    fn run(kv: &MemKv, req: &Req) -> (Response, String, OpCounts) {
        let (r, line, ops, _) = run_with(kv, req, vars(Some("auto"), false), Component::Pools);
        (r, line, ops)
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
            "PUT",
            "http://127.0.0.1:3000/v1/pools/ns/p?dryRun=1&x=%2F",
            Some("Bearer abc"),
            "{}",
        );
        let parts = &req.parts;
        assert_eq!(parts.method, "PUT");
        assert_eq!(parts.path, "/v1/pools/ns/p");
        assert_eq!(parts.query, "dryRun=1&x=%2F");
        assert_eq!(parts.authorization.as_deref(), Some("Bearer abc"));
        let api = parts.api_request(&req.body);
        assert_eq!(api.body, b"{}");
        assert_eq!(api.authorization, Some("Bearer abc"));
    }

    #[test]
    fn request_parts_from_an_origin_form_uri() {
        let parts = request("DELETE", "/v1/claims/ns/m-0?uid=u-1", None, "").parts;
        assert_eq!(parts.method, "DELETE");
        assert_eq!(parts.path, "/v1/claims/ns/m-0");
        assert_eq!(parts.query, "uid=u-1");
        assert_eq!(parts.authorization, None);
        let parts = request("GET", "/v1/pools", None, "").parts;
        assert_eq!(
            (parts.path.as_str(), parts.query.as_str()),
            ("/v1/pools", "")
        );
    }

    #[test]
    fn other_methods_are_upper_cased() {
        assert_eq!(
            request("purge", "/v1/pools", None, "").parts.method,
            "PURGE"
        );
        assert_eq!(
            request("Patch", "/v1/pools", None, "").parts.method,
            "PATCH"
        );
    }

    #[test]
    fn debug_output_redacts_credentials() {
        let parts = request("GET", "/", Some("Bearer abc"), "").parts;
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
    fn metal_is_configured_only_with_url_token_and_project() {
        let metal = |url: &str, token: &str, project: &str| {
            let (url, token, project) = (url.to_string(), token.to_string(), project.to_string());
            AppConfig::load(move |n: &str| match n {
                VAR_API_TOKEN => Ok(TOKEN.into()),
                VAR_METAL_API_URL => Ok(url.clone()),
                VAR_METAL_TOKEN => Ok(token.clone()),
                VAR_METAL_PROJECT_ID => Ok(project.clone()),
                other => Err(variables::Error::Undefined(other.into())),
            })
            .unwrap()
            .metal
        };
        let m = metal("http://127.0.0.1:9/", " mt\n", "p1").unwrap();
        assert_eq!(m.base_url, "http://127.0.0.1:9/metal/v1");
        assert_eq!((m.token.as_str(), m.project_id.as_str()), ("mt", "p1"));
        assert!(!format!("{m:?}").contains("mt\""), "the token is redacted");
        assert_eq!(metal("http://127.0.0.1:9", "", "p1"), None);
        assert_eq!(metal("http://127.0.0.1:9", "mt", " "), None);
        // A component that declares none of them (every one but provision).
        assert!(AppConfig::load(vars(Some("auto"), true))
            .unwrap()
            .metal
            .is_none());
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
            text: None,
            counted: false,
        };
        let out = render(&empty);
        assert_eq!(*out.status(), 204);
        assert_eq!(header(&out, "content-type"), None);
        assert_eq!(header(&out, "location"), Some("/x"));
        assert!(out.body().is_empty());
    }

    fn must_not_run(
        _: &Services<'_, CountingKv<MemKv>, Tally<NoHttp>>,
        _: &ApiRequest<'_>,
        _: Admitted,
    ) -> ApiResponse {
        panic!("the handler ran although setup failed")
    }

    #[test]
    fn setup_failures_skip_the_body_the_store_and_the_handler() {
        let opened = Cell::new(false);
        let req = request("GET", "/v1/pools", Some(&format!("Bearer {TOKEN}")), "{}");
        let open = || {
            opened.set(true);
            Ok(MemKv::new(Backend::SpinSqlite))
        };
        let (r, ops, pulled) = pipe(
            (Component::Pools, &req),
            vars(Some("bogus"), false),
            Some(&open),
            must_not_run,
        );
        assert_eq!((r.status, ops.total(), pulled), (500, 0, 0));
        assert!(!opened.get());

        let broken = || Err::<MemKv, _>(KvError::NoSuchStore);
        let (r, ops, _) = pipe(
            (Component::Pools, &req),
            vars(Some("auto"), false),
            Some(&broken),
            must_not_run,
        );
        // An unconfigured store is a deployment mistake: 500, like the core.
        assert_eq!(
            (r.status, r.reason, ops.total()),
            (500, Some("StoreMisconfigured"), 0)
        );
    }

    fn inspecting(
        s: &Services<'_, CountingKv<MemKv>, Tally<NoHttp>>,
        req: &ApiRequest<'_>,
        _: Admitted,
    ) -> ApiResponse {
        assert_eq!(s.api_token, TOKEN);
        let ctx = s.ctx.expect("a store");
        assert_eq!(ctx.swap_policy, SwapPolicy::Always);
        assert!(
            s.kube.is_some(),
            "the Kubernetes client is built from k8s_api_url and k8s_token"
        );
        assert_eq!(req.path, "/v1/pools");
        assert_eq!(req.body, b"{}");
        assert_eq!(req.content_type(), Some("application/json"));
        assert_eq!(req.header("CE-Type"), Some("t"));
        let _ = ctx.kv.get("a");
        let _ = ctx.kv.increment("b", 1);
        SetupError::InvalidSwapCheck.response()
    }

    #[test]
    fn dispatch_passes_token_policy_clients_headers_and_counts_to_the_handler() {
        let mut req = request("GET", "/v1/pools", Some(&format!("Bearer {TOKEN}")), "{}");
        req.parts
            .headers
            .push(("content-type".into(), "application/json".into()));
        req.parts.headers.push(("ce-type".into(), "t".into()));
        let open = || Ok(MemKv::new(Backend::Redis));
        let (r, ops, _) = pipe(
            (Component::Pools, &req),
            vars(Some("always"), true),
            Some(&open),
            inspecting,
        );
        assert_eq!(r.status, 500);
        // The handler's get and increment, then the request's counting:
        // its counter's increment, and (its first occurrence) the
        // registry's creation (guard and key increments, cas_read,
        // cas_read, cas_swap, read-back get).
        assert_eq!((ops.get, ops.increment, ops.total()), (2, 4, 9));
    }

    #[test]
    fn a_component_without_store_or_kube_says_so() {
        let req = request("POST", "/v1/reconcile", Some("Bearer s3cret-t0ken"), "");
        let (r, ops, _) = pipe::<MemKv>(
            (Component::Reconcile, &req),
            vars(None, false),
            None,
            dispatch::reconcile,
        );
        assert_eq!(
            (r.status, r.reason, ops.total()),
            (500, Some("StoreMisconfigured"), 0)
        );
        let open = || Ok(MemKv::new(Backend::SpinSqlite));
        let (r, _, _) = pipe(
            (Component::Reconcile, &req),
            vars(None, false),
            Some(&open),
            dispatch::reconcile,
        );
        assert_eq!((r.status, r.reason), (500, Some("KubeNotConfigured")));
    }

    #[test]
    fn the_vlan_batch_steps_refuse_bad_requests_before_calling_metal() {
        let metal_vars = |name: &str| match name {
            VAR_API_TOKEN => Ok(TOKEN.to_string()),
            VAR_METAL_API_URL => Ok("http://127.0.0.1:9".to_string()),
            VAR_METAL_TOKEN => Ok("mt".to_string()),
            VAR_METAL_PROJECT_ID => Ok("p1".to_string()),
            other => Err(variables::Error::Undefined(other.to_string())),
        };
        let port = "/v1/metal/ports/3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a/vlan-batches";
        let vlan = "4a3b2c1d-0e9f-4a8b-8c7d-6e5f4a3b2c1d";
        let bearer = Some("Bearer s3cret-t0ken");
        let create = format!(r#"{{"op":"create","vlans":["{vlan}"]}}"#);
        let cases: Vec<(Req, u16, &str)> = vec![
            (request("POST", port, None, &create), 401, "Unauthorized"),
            (request("GET", port, bearer, ""), 405, "MethodNotAllowed"),
            (
                request("POST", "/v1/metal/ports/x/vlan-batches", bearer, &create),
                400,
                "InvalidBatch",
            ),
            (
                request("POST", port, bearer, r#"{"op":"create","vlans":[]}"#),
                400,
                "InvalidBatch",
            ),
            (
                request("POST", port, bearer, r#"{"op":"create","vlans":["1001"]}"#),
                400,
                "InvalidBatch",
            ),
            (
                request("POST", port, bearer, r#"{"op":"drop"}"#),
                400,
                "InvalidBatch",
            ),
            (request("POST", port, bearer, "{"), 400, "MalformedJSON"),
        ];
        let vlan: [(Component, ComponentHandler<MemKv, NoHttp>); 2] = [
            (Component::AttachVlan, dispatch::attach_vlan),
            (Component::DetachVlan, dispatch::detach_vlan),
        ];
        for (component, handler) in vlan {
            for (req, status, reason) in &cases {
                let (r, ops, _) = pipe::<MemKv>((component, req), metal_vars, None, handler);
                assert_eq!(
                    (r.status, r.reason.unwrap_or("")),
                    (*status, *reason),
                    "{} {:?}",
                    req.parts.method,
                    String::from_utf8_lossy(&req.body)
                );
                assert_eq!(ops.total(), 0, "no store");
            }
            // A good request gets as far as the outbound call (denied here:
            // no outbound HTTP) and answers the transport error under `metal`.
            let (r, _, _) = pipe::<MemKv>(
                (component, &request("POST", port, bearer, &create)),
                metal_vars,
                None,
                handler,
            );
            assert_eq!(r.reason, Some("MetalDenied"), "{:?}", r.body);
            assert_eq!(r.body.as_ref().unwrap()["metal"]["kind"], "denied");
        }
    }

    /// Variables with `api_token` and `events_token` as given.
    fn tokens(
        api: &'static str,
        events: &'static str,
    ) -> impl Fn(&str) -> Result<String, variables::Error> {
        move |name: &str| match name {
            VAR_API_TOKEN => Ok(api.to_string()),
            VAR_EVENTS_TOKEN => Ok(events.to_string()),
            other => Err(variables::Error::Undefined(other.to_string())),
        }
    }

    /// A component that has the events token (so the shell lets a request
    /// without the API token through) still authenticates before it
    /// routes, before its store and before its clients: every component,
    /// on its routes and on paths under them that are not routes.
    #[test]
    fn every_component_authenticates_before_routing_or_anything_else() {
        let handlers: [(&str, ComponentHandler<MemKv, NoHttp>, &[&str]); 11] = [
            (
                "provision",
                dispatch::provision,
                &[
                    "/v1/metal/pools/a/b",
                    "/v1/metal/pools/a/b/c",
                    "/v1/metal/x",
                ],
            ),
            (
                "assign",
                dispatch::assign,
                &["/v1/metal/claims/a/b", "/v1/metal/claims/a"],
            ),
            (
                "poll",
                dispatch::poll,
                &["/v1/metal/poll", "/v1/metal/poll/x"],
            ),
            (
                "network",
                dispatch::network,
                &[
                    "/v1/machines/a/b/network",
                    "/v1/machines/a",
                    "/v1/machines/a/b/x",
                ],
            ),
            (
                "attach-vlan",
                dispatch::attach_vlan,
                &["/v1/metal/ports/p/vlan-batches", "/v1/x"],
            ),
            (
                "detach-vlan",
                dispatch::detach_vlan,
                &["/v1/metal/ports/p/vlan-batches", "/v1/x"],
            ),
            (
                "pools",
                dispatch::pools,
                &["/v1/pools/a/b", "/v1/pools/a/b/c/d", "/v1/capi/pools/a/b"],
            ),
            (
                "allocate",
                dispatch::allocate,
                &["/v1/claims", "/v1/claims/x"],
            ),
            (
                "release",
                dispatch::release,
                &["/v1/claims/a/b", "/v1/claims/a/b/c"],
            ),
            (
                "admission",
                dispatch::admission,
                &["/v1/admission/pools", "/v1/admission/x"],
            ),
            (
                "reconcile",
                dispatch::reconcile,
                &["/v1/reconcile", "/v1/reconcile/x"],
            ),
        ];
        for (component, handler, paths) in handlers {
            for path in paths {
                for auth in [None, Some("Bearer ev-token"), Some("Bearer nope")] {
                    // No store either: authentication comes before it.
                    let req = request("POST", path, auth, "{}");
                    let served = *Component::ALL
                        .iter()
                        .find(|c| c.name() == component)
                        .unwrap();
                    let (r, ops, _) =
                        pipe::<MemKv>((served, &req), tokens(TOKEN, "ev-token"), None, handler);
                    assert_eq!(
                        (r.status, r.reason),
                        (401, Some("Unauthorized")),
                        "{component} POST {path} with {auth:?}"
                    );
                    assert_eq!(ops.total(), 0);
                }
            }
        }
    }

    #[test]
    fn tokens_are_trimmed_like_the_presented_one() {
        // A Secret written with `echo`: the token ends with a newline.
        let kv = MemKv::new(Backend::SpinSqlite);
        let req = request("GET", "/v1/pools", Some("Bearer dev-token"), "");
        let (r, _, _, _) = run_with(&kv, &req, tokens("dev-token\n", ""), Component::Pools);
        assert_eq!(*r.status(), 200, "{}", String::from_utf8_lossy(r.body()));
        let (r, _, _, _) = run_with(&kv, &req, tokens(" dev-token\r\n", ""), Component::Pools);
        assert_eq!(*r.status(), 200);
        let c = AppConfig::load(tokens("a\n", "\tev-token \n")).unwrap();
        assert_eq!(
            (c.api_token.as_str(), c.events_token.as_str()),
            ("a", "ev-token")
        );

        // Only whitespace is no token: a setup error, as a missing one.
        let e = AppConfig::load(tokens(" \n", "")).unwrap_err();
        assert_eq!(
            e,
            SetupError::Variable {
                name: VAR_API_TOKEN,
                problem: "is empty"
            }
        );
        let (r, _, _, pulled) = run_with(&kv, &req, tokens("\n", ""), Component::Pools);
        assert_eq!((*r.status(), pulled), (500, 0));
        let body = json_body(&r);
        assert_eq!(body["reason"], "AuthNotConfigured");
        assert_eq!(body["message"], "the api_token variable is empty");
    }

    /// A body of `n` bytes of JSON whitespace.
    fn big(n: usize) -> String {
        " ".repeat(n)
    }

    #[test]
    fn unauthenticated_requests_are_refused_before_the_body_is_read() {
        let kv = MemKv::new(Backend::SpinSqlite);
        let body = big(3 * MAX_BODY);
        for auth in [None, Some("Bearer wrong"), Some("Basic s3cret-t0ken")] {
            for with_length in [true, false] {
                let mut req = request("PUT", "/v1/pools/ns/p", auth, &body);
                if !with_length {
                    req.parts.headers.retain(|(n, _)| n != "content-length");
                }
                let (r, line, ops, pulled) =
                    run_with(&kv, &req, vars(None, false), Component::Pools);
                assert_eq!((*r.status(), pulled, ops.total()), (401, 0, 0), "{auth:?}");
                assert_eq!(json_body(&r)["reason"], "Unauthorized");
                assert!(header(&r, "www-authenticate").is_some());
                let log: Value = serde_json::from_str(&line).unwrap();
                assert_eq!(log["reason"], "Unauthorized");
            }
        }
    }

    #[test]
    fn a_declared_length_over_the_limit_is_refused_before_the_body_is_read() {
        let kv = MemKv::new(Backend::SpinSqlite);
        let bearer = format!("Bearer {TOKEN}");
        let req = request("PUT", "/v1/pools/ns/p", Some(&bearer), &big(MAX_BODY + 1));
        let (r, line, ops, pulled) = run_with(&kv, &req, vars(None, false), Component::Pools);
        assert_eq!((*r.status(), pulled, ops.total()), (413, 0, 0));
        assert_eq!(header(&r, "content-type"), Some("application/json"));
        assert_eq!(
            json_body(&r),
            json!({"reason": "PayloadTooLarge",
                   "message": format!("the request body is larger than {MAX_BODY} bytes")})
        );
        let log: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (log["status"].as_u64(), log["reason"].as_str()),
            (Some(413), Some("PayloadTooLarge"))
        );

        // A declared length is believed only up to the limit: a body longer
        // than it said is cut off at the limit too.
        let mut lying = request("PUT", "/v1/pools/ns/p", Some(&bearer), &big(4 * MAX_BODY));
        for h in &mut lying.parts.headers {
            if h.0 == "content-length" {
                h.1 = "10".into();
            }
        }
        let (r, _, _, pulled) = run_with(&kv, &lying, vars(None, false), Component::Pools);
        assert_eq!(*r.status(), 413);
        assert!(pulled <= MAX_BODY / (16 * 1024) + 1, "{pulled} chunks read");
    }

    #[test]
    fn a_body_without_length_is_read_only_up_to_the_limit() {
        let kv = MemKv::new(Backend::SpinSqlite);
        let bearer = format!("Bearer {TOKEN}");
        let unsized_request = |n: usize| {
            let mut req = request("PUT", "/v1/pools/ns/p", Some(&bearer), &big(n));
            req.parts.headers.retain(|(n, _)| n != "content-length");
            req
        };
        let (r, _, ops, pulled) = run_with(
            &kv,
            &unsized_request(16 * MAX_BODY),
            vars(None, false),
            Component::Pools,
        );
        assert_eq!((*r.status(), ops.total()), (413, 0));
        assert_eq!(json_body(&r)["reason"], "PayloadTooLarge");
        // 64 chunks make the limit; the 65th passes it and ends the read.
        assert_eq!(pulled, MAX_BODY / (16 * 1024) + 1);

        // Exactly the limit is accepted (and then is no JSON: 400).
        let (r, _, _, _) = run_with(
            &kv,
            &unsized_request(MAX_BODY),
            vars(None, false),
            Component::Pools,
        );
        assert_eq!(*r.status(), 400);
        assert_eq!(json_body(&r)["reason"], "MalformedRequest");
    }

    #[test]
    fn read_body_stops_at_the_first_chunk_past_the_limit() {
        let pulled = Cell::new(0);
        let body = vec![b'x'; 100];
        let r = block_on(read_body(chunks(&body, &pulled), 100)).unwrap();
        assert_eq!(r.len(), 100);
        let three = [Ok(vec![1u8; 40]), Ok(vec![2u8; 40]), Ok(vec![3u8; 40])];
        let taken = Cell::new(0);
        let s = stream::iter(three)
            .inspect(|_: &Result<Vec<u8>, Infallible>| taken.set(taken.get() + 1));
        let e = block_on(read_body(s, 79)).unwrap_err();
        assert_eq!(
            (e.status(), e.reason(), taken.get()),
            (413, "PayloadTooLarge", 2)
        );
        let failing = stream::iter([Ok(vec![1u8]), Err("connection reset")]);
        let e = block_on(read_body(failing, 10)).unwrap_err();
        assert_eq!((e.status(), e.reason()), (400, "MalformedRequest"));
        assert!(e.detail().unwrap_or("").contains("connection reset"));
    }

    #[test]
    fn with_an_events_token_the_body_may_carry_the_credential() {
        // A structured-mode CloudEvent carries the events token in its body
        // (Knative's ApiServerSource cannot send headers): the body is read,
        // within the limit, and the core decides.
        let kv = MemKv::new(Backend::SpinSqlite);
        let ce = json!({"specversion": "1.0", "id": "1", "source": "s",
            "type": "dev.knative.apiserver.resource.add", "metalipamtoken": "wrong",
            "data": {}});
        let mut req = request("POST", "/v1/events", None, &ce.to_string());
        req.parts
            .headers
            .push(("content-type".into(), "application/cloudevents+json".into()));
        let (r, _, _, pulled) = run_with(&kv, &req, tokens(TOKEN, "ev"), Component::Events);
        assert_eq!((*r.status(), pulled), (401, 1));
        // Without an events token, only the header counts: not read.
        let (r, _, _, pulled) = run_with(&kv, &req, tokens(TOKEN, ""), Component::Events);
        assert_eq!((*r.status(), pulled), (401, 0));
        // The declared size is still checked first.
        let mut req = request("POST", "/v1/events", None, &big(MAX_BODY + 1));
        req.parts
            .headers
            .push(("content-type".into(), "application/cloudevents+json".into()));
        let (r, _, _, pulled) = run_with(&kv, &req, tokens(TOKEN, "ev"), Component::Events);
        assert_eq!((*r.status(), pulled), (413, 0));
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
                "PUT",
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

        let (r, _, ops) = run(&kv, &request("GET", "/v1/pools", Some(&bearer), ""));
        assert_eq!(*r.status(), 200);
        assert_eq!(json_body(&r)["items"].as_array().map(Vec::len), Some(1));
        // Listed from the pool index, never by listing the store.
        assert_eq!(ops.list_keys, 0);

        let (r, line, ops) = run(&kv, &request("GET", "/v1/pools", Some("Bearer wrong"), ""));
        assert_eq!(*r.status(), 401);
        assert!(header(&r, "www-authenticate").is_some());
        assert_eq!(ops.total(), 0);
        for text in [line.as_str(), &String::from_utf8_lossy(r.body())] {
            assert!(!text.contains(TOKEN) && !text.contains("wrong"), "{text}");
        }

        let (r, _, _) = run(&kv, &request("DELETE", "/v1/pools/ns/p", Some(&bearer), ""));
        assert_eq!(*r.status(), 204);
        assert_eq!(header(&r, "content-type"), None);
        assert!(r.body().is_empty());
    }
}
