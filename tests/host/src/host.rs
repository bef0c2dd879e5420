//! The component host: [`HostBuilder`] loads a manifest, compiles and
//! pre-instantiates its components; [`Host`] handles requests in-process
//! ([`Host::handle`]) or over HTTP ([`Host::serve`]).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::WasiCtx;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::body::HyperIncomingBody;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpView};

use crate::bindings::{self, InstanceState, KvInstance};
use crate::kv::{KvBackend, KvOpCounts, KvStores};
use crate::manifest::AppManifest;
use crate::outbound::AllowedHostsConfig;
use crate::outbound_hooks::OutboundHooks;
use crate::routing::{spin_headers, Router};
use crate::runtime_config::RuntimeConfig;
use crate::variables::{AppVariables, ComponentVariables};

/// Name of the response header carrying the number of key-value operations
/// the request made (a test-host addition; Spin sends no such header).
pub const KV_OPS_HEADER: &str = "x-kv-ops";
/// Name of the response header carrying the per-operation detail, e.g.
/// `get=1,cas.current=1,cas.swap=1` (a test-host addition).
pub const KV_OPS_DETAIL_HEADER: &str = "x-kv-ops-detail";

/// The client address reported (`spin-client-addr`) for in-process requests.
pub const IN_PROCESS_CLIENT_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// Configures and builds a [`Host`].
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// use metal_ipam_host::{HostBuilder, KvBackend};
/// let host = HostBuilder::new("/work/main/spin.toml")
///     .kv(KvBackend::Memory)
///     .variable("api_token", "secret")
///     .build()?;
/// let req = http::Request::get("/healthz").body(Vec::new())?;
/// let outcome = host.handle(req).await?;
/// assert_eq!(outcome.response.status(), 200);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct HostBuilder {
    manifest_path: PathBuf,
    kv: Option<KvBackend>,
    variables: Vec<(String, String)>,
    use_process_env: bool,
    env_overrides: Vec<(String, String)>,
    runtime_config: Option<PathBuf>,
    retain: Option<Vec<String>>,
}

impl HostBuilder {
    /// Starts from the manifest at `manifest_path` (a `spin.toml`).
    pub fn new(manifest_path: impl Into<PathBuf>) -> Self {
        HostBuilder {
            manifest_path: manifest_path.into(),
            kv: None,
            variables: Vec::new(),
            use_process_env: true,
            env_overrides: Vec::new(),
            runtime_config: None,
            retain: None,
        }
    }

    /// Loads only these components, like `spin up --component-id`
    /// (selective deployment): triggers of other components are dropped,
    /// so their routes answer 404. May be called repeatedly; ids must exist
    /// in the manifest.
    pub fn retain_components<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.retain
            .get_or_insert_with(Vec::new)
            .extend(ids.into_iter().map(Into::into));
        self
    }

    /// Backend of the `default` key-value store. Without this, the default
    /// store is `<manifest dir>/.spin/sqlite_key_value.db`, as with
    /// `spin up` (or what the runtime config defines for `default`).
    pub fn kv(mut self, backend: KvBackend) -> Self {
        self.kv = Some(backend);
        self
    }

    /// Sets an application variable (highest precedence, like
    /// `spin up --variable name=value`). The last value for a name wins.
    pub fn variable(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.variables.push((name.into(), value.into()));
        self
    }

    /// Whether `SPIN_VARIABLE_*` variables of the process environment are
    /// read (default: true). Tests that must not depend on the caller's
    /// environment can turn this off and use [`HostBuilder::env_var`].
    pub fn use_process_env(mut self, yes: bool) -> Self {
        self.use_process_env = yes;
        self
    }

    /// Pretends the environment variable `name` (e.g.
    /// `SPIN_VARIABLE_API_TOKEN`) is set to `value`; overrides the process
    /// environment.
    pub fn env_var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env_overrides.push((name.into(), value.into()));
        self
    }

    /// Uses a runtime configuration file (`[key_value_store.<label>]`
    /// sections, see [`RuntimeConfig`]).
    pub fn runtime_config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.runtime_config = Some(path.into());
        self
    }

    /// Loads the manifest, resolves variables, configures key-value stores,
    /// and compiles and pre-instantiates every component that has an HTTP
    /// trigger. Compiled components are cached per process (by path, size
    /// and modification time), so building many hosts is cheap.
    pub fn build(self) -> anyhow::Result<Host> {
        let mut manifest = AppManifest::from_file(&self.manifest_path)?;
        if let Some(retain) = &self.retain {
            for id in retain {
                if manifest.component(id).is_none() {
                    bail!(
                        "cannot retain component {id:?}: it is not defined in {}",
                        manifest.path.display()
                    );
                }
            }
            manifest
                .http_triggers
                .retain(|t| retain.contains(&t.component));
        }

        let overrides = self.env_overrides.clone();
        let use_env = self.use_process_env;
        let env = move |name: &str| {
            if let Some((_, v)) = overrides.iter().rev().find(|(n, _)| n == name) {
                return Some(v.clone());
            }
            if use_env {
                std::env::var(name).ok()
            } else {
                None
            }
        };
        let variables = AppVariables::resolve(&manifest, &self.variables, env)?;

        let runtime_config = match &self.runtime_config {
            Some(p) => RuntimeConfig::from_file(p)?,
            None => RuntimeConfig::default(),
        };
        if self.kv.is_some() && runtime_config.store("default").is_some() {
            bail!("the default key-value store is configured twice: by the host options (--kv-file/--kv-memory) and by [key_value_store.default] in the runtime config");
        }
        let default_backend = self.kv.clone().unwrap_or_else(|| {
            KvBackend::SqliteFile(manifest.dir.join(".spin").join("sqlite_key_value.db"))
        });
        let kv = KvStores::with_labels(default_backend, runtime_config.key_value_stores.clone());

        let engine = shared_engine()?;
        let mut linker: Linker<InstanceState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(anyhow::Error::from)?;
        bindings::add_to_linker(&mut linker).map_err(anyhow::Error::from)?;

        let router = Router::build(&manifest.http_triggers)?;

        let mut components = HashMap::new();
        for def in manifest.triggered_components() {
            for label in &def.key_value_stores {
                if !kv.is_defined(label) {
                    bail!(
                        "unknown key_value_stores label {label:?} for component {:?}: labels other than \"default\" must be defined in the runtime config file ([key_value_store.{label}])",
                        def.id
                    );
                }
            }
            let component = load_component(&engine, &manifest, &def.id, &def.source)?;
            let instance_pre = linker
                .instantiate_pre(&component)
                .map_err(anyhow::Error::from)
                .with_context(|| {
                    format!(
                        "component {:?} imports something this host does not provide",
                        def.id
                    )
                })?;
            let pre = ProxyPre::new(instance_pre)
                .map_err(anyhow::Error::from)
                .with_context(|| {
                    format!(
                        "component {:?} does not export wasi:http/incoming-handler@0.2.x",
                        def.id
                    )
                })?;
            let comp_vars = ComponentVariables::resolve(&def.id, &def.variables, &variables)?;
            let allowed_hosts =
                AllowedHostsConfig::resolve(&def.allowed_outbound_hosts, &variables)
                    .with_context(|| format!("allowed_outbound_hosts of component {:?}", def.id))?;
            components.insert(
                def.id.clone(),
                Arc::new(ComponentRuntime {
                    id: Arc::from(def.id.as_str()),
                    pre,
                    allowed_kv: Arc::new(def.key_value_stores.iter().cloned().collect()),
                    variables: Arc::new(comp_vars),
                    allowed_hosts: Arc::new(allowed_hosts),
                    environment: def.environment.clone(),
                }),
            );
        }

        Ok(Host {
            inner: Arc::new(HostInner {
                manifest,
                engine,
                router,
                components,
                kv,
                variables,
            }),
        })
    }
}

/// One engine for the whole process, so compiled components can be shared.
fn shared_engine() -> anyhow::Result<Engine> {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    if let Some(e) = ENGINE.get() {
        return Ok(e.clone());
    }
    let mut config = Config::new();
    config.wasm_component_model(true);
    let engine = Engine::new(&config).map_err(anyhow::Error::from)?;
    Ok(ENGINE.get_or_init(|| engine).clone())
}

type ComponentCacheKey = (PathBuf, u64, Option<SystemTime>);

fn load_component(
    engine: &Engine,
    manifest: &AppManifest,
    id: &str,
    source: &Path,
) -> anyhow::Result<Component> {
    static CACHE: OnceLock<Mutex<HashMap<ComponentCacheKey, Component>>> = OnceLock::new();
    let meta = match std::fs::metadata(source) {
        Ok(m) => m,
        Err(e) => {
            let hint = match manifest.component(id).and_then(|c| c.build.as_ref()) {
                Some(b) => format!(
                    "build it first: run `{}` in {} (or pass --build to `metal-ipam-host up`)",
                    b.commands.join(" && "),
                    manifest.dir.display()
                ),
                None => "build it first".to_string(),
            };
            bail!(
                "component {id:?}: cannot read source {}: {e}; {hint}",
                source.display()
            );
        }
    };
    let canonical = std::fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf());
    let key = (canonical, meta.len(), meta.modified().ok());
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(c) = lock(cache).get(&key) {
        return Ok(c.clone());
    }
    let component = Component::from_file(engine, source)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("component {id:?}: cannot compile {}", source.display()))?;
    lock(cache).insert(key, component.clone());
    Ok(component)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

struct ComponentRuntime {
    id: Arc<str>,
    pre: ProxyPre<InstanceState>,
    allowed_kv: Arc<HashSet<String>>,
    variables: Arc<ComponentVariables>,
    allowed_hosts: Arc<AllowedHostsConfig>,
    environment: Vec<(String, String)>,
}

struct HostInner {
    manifest: AppManifest,
    engine: Engine,
    router: Router,
    components: HashMap<String, Arc<ComponentRuntime>>,
    kv: KvStores,
    variables: AppVariables,
}

/// A loaded application, ready to handle requests. Cheap to clone and to
/// use from many tasks at once: the engine, linker and pre-instantiated
/// components are shared, and every request gets a fresh component
/// instance, as on Spin.
#[derive(Clone)]
pub struct Host {
    inner: Arc<HostInner>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("manifest", &self.inner.manifest.path)
            .field(
                "components",
                &self.inner.components.keys().collect::<Vec<_>>(),
            )
            .field("kv", &self.inner.kv)
            .finish()
    }
}

/// The result of one in-process request.
#[derive(Debug)]
pub struct RequestOutcome {
    /// The response, fully buffered, including the `x-kv-ops` and
    /// `x-kv-ops-detail` headers.
    pub response: Response<Vec<u8>>,
    /// The key-value operations the request made.
    pub kv_ops: KvOpCounts,
    /// The component that handled the request (`None` for a 404 or a
    /// `/.well-known/spin/` route).
    pub component: Option<String>,
}

impl Host {
    /// Shorthand for `HostBuilder::new(manifest_path)`.
    pub fn builder(manifest_path: impl Into<PathBuf>) -> HostBuilder {
        HostBuilder::new(manifest_path)
    }

    /// The loaded manifest.
    pub fn manifest(&self) -> &AppManifest {
        &self.inner.manifest
    }

    /// The router built from the manifest's HTTP triggers.
    pub fn router(&self) -> &Router {
        &self.inner.router
    }

    /// The application's key-value stores (for direct inspection in tests).
    pub fn kv_stores(&self) -> &KvStores {
        &self.inner.kv
    }

    /// The resolved application variables.
    pub fn variables(&self) -> &AppVariables {
        &self.inner.variables
    }

    /// Handles one request in-process, without a socket. The request's URI
    /// may be a bare path (`/healthz`); when it has no authority and no
    /// `Host` header, `Host: localhost` is assumed (Spin would refuse such
    /// a request). `spin-client-addr` is [`IN_PROCESS_CLIENT_ADDR`].
    pub async fn handle(&self, req: Request<Vec<u8>>) -> anyhow::Result<RequestOutcome> {
        self.handle_from(req, IN_PROCESS_CLIENT_ADDR).await
    }

    /// Like [`Host::handle`], reporting `client_addr` as the client address.
    pub async fn handle_from(
        &self,
        req: Request<Vec<u8>>,
        client_addr: SocketAddr,
    ) -> anyhow::Result<RequestOutcome> {
        let (mut parts, body) = req.into_parts();
        if parts.uri.authority().is_none() && !parts.headers.contains_key(http::header::HOST) {
            parts
                .headers
                .insert(http::header::HOST, HeaderValue::from_static("localhost"));
        }
        let body = Full::new(Bytes::from(body))
            .map_err(
                |never: std::convert::Infallible| -> wasmtime_wasi_http::Error { match never {} },
            )
            .boxed_unsync();
        self.dispatch(Request::from_parts(parts, body), client_addr)
            .await
    }

    /// Routes and runs one request (the common path of [`Host::handle`] and
    /// the HTTP server).
    pub(crate) async fn dispatch(
        &self,
        req: Request<HyperIncomingBody>,
        client_addr: SocketAddr,
    ) -> anyhow::Result<RequestOutcome> {
        let path = req.uri().path().to_string();

        if let Some(well_known) = path.strip_prefix("/.well-known/spin/") {
            let response = match well_known {
                "health" => simple_response(StatusCode::OK, b"OK".to_vec(), None),
                "info" => {
                    let info = serde_json::json!({
                        "name": self.inner.manifest.name,
                        "version": self.inner.manifest.version,
                        "bindle_version": null,
                        "oci_image_digest": null,
                    });
                    simple_response(
                        StatusCode::OK,
                        serde_json::to_vec_pretty(&info)?,
                        Some("application/json"),
                    )
                }
                _ => simple_response(StatusCode::NOT_FOUND, Vec::new(), None),
            };
            return Ok(finish(response, KvOpCounts::default(), None));
        }

        let Some(route_match) = self.inner.router.route(&path) else {
            return Ok(finish(
                simple_response(StatusCode::NOT_FOUND, Vec::new(), None),
                KvOpCounts::default(),
                None,
            ));
        };
        let component = self
            .inner
            .components
            .get(route_match.component_id())
            .ok_or_else(|| anyhow!("unknown component {:?}", route_match.component_id()))?
            .clone();

        // Spin passes header values to the component as strings and fails the
        // request (500) on one that is not UTF-8.
        if let Some((name, _)) = req.headers().iter().find(|(_, v)| v.to_str().is_err()) {
            eprintln!("Error processing request: request header {name} is not valid UTF-8");
            return Ok(finish(
                simple_response(StatusCode::INTERNAL_SERVER_ERROR, Vec::new(), None),
                KvOpCounts::default(),
                Some(component.id.to_string()),
            ));
        }
        let req = prepare_request(req, &route_match, client_addr)?;
        let counts = Arc::new(Mutex::new(KvOpCounts::default()));
        let response = match self.run_component(&component, req, counts.clone()).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!(
                    "Error processing request for component {:?}: {e:?}",
                    component.id
                );
                simple_response(StatusCode::INTERNAL_SERVER_ERROR, Vec::new(), None)
            }
        };
        let kv_ops = *lock(&counts);
        Ok(finish(response, kv_ops, Some(component.id.to_string())))
    }

    async fn run_component(
        &self,
        component: &ComponentRuntime,
        req: Request<HyperIncomingBody>,
        counts: Arc<Mutex<KvOpCounts>>,
    ) -> anyhow::Result<Response<Vec<u8>>> {
        let mut wasi = WasiCtx::builder();
        wasi.stdout(std::io::stderr())
            .stderr(std::io::stderr())
            .envs(&component.environment);
        let state = InstanceState {
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            hooks: OutboundHooks {
                component_id: component.id.clone(),
                allowed: component.allowed_hosts.clone(),
            },
            kv: KvInstance {
                allowed: component.allowed_kv.clone(),
                stores: self.inner.kv.clone(),
                counts,
            },
            variables: component.variables.clone(),
        };
        let mut store = Store::new(&self.inner.engine, state);
        let incoming = store
            .data_mut()
            .http()
            .new_incoming_request(Scheme::Http, req)
            .map_err(anyhow::Error::from)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let outparam = store
            .data_mut()
            .http()
            .new_response_outparam(tx)
            .map_err(anyhow::Error::from)?;
        let pre = component.pre.clone();

        let task = tokio::spawn(async move {
            let proxy = pre.instantiate_async(&mut store).await?;
            proxy
                .wasi_http_incoming_handler()
                .call_handle(&mut store, incoming, outparam)
                .await
        });

        match rx.await {
            Ok(Ok(response)) => {
                let (parts, body) = response.into_parts();
                let collected = body.collect().await;
                let guest = task.await;
                let body = match collected {
                    Ok(c) => c.to_bytes().to_vec(),
                    Err(e) => {
                        let guest_err = match guest {
                            Ok(Err(g)) => format!(": {:?}", anyhow::Error::from(g)),
                            Err(j) => format!(": guest task: {j}"),
                            Ok(Ok(())) => String::new(),
                        };
                        bail!("guest failed while sending the response body: {e:?}{guest_err}");
                    }
                };
                match guest {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!(
                        "Component {:?} error after response started: {:?}",
                        component.id,
                        anyhow::Error::from(e)
                    ),
                    Err(e) => eprintln!(
                        "Component {:?} task failed after response started: {e}",
                        component.id
                    ),
                }
                Ok(Response::from_parts(parts, body))
            }
            Ok(Err(code)) => {
                let guest = task.await;
                if let Ok(Err(e)) = guest {
                    return Err(anyhow::Error::from(e)
                        .context(format!("guest failed to produce a response ({code:?})")));
                }
                bail!("guest failed to produce a response: {code:?}")
            }
            Err(_) => {
                match task.await {
                    Ok(Err(e)) => {
                        return Err(anyhow::Error::from(e).context("guest invocation failed"))
                    }
                    Err(e) => bail!("guest invocation panicked: {e}"),
                    Ok(Ok(())) => {}
                }
                bail!("guest failed to produce a response prior to returning")
            }
        }
    }

    /// Starts an HTTP/1 server on `addr` (use port 0 for an ephemeral
    /// port) serving this host. Returns once the socket is bound.
    pub async fn serve(&self, addr: SocketAddr) -> anyhow::Result<ServerHandle> {
        crate::server::serve(self.clone(), addr).await
    }
}

pub use crate::server::ServerHandle;

fn simple_response(
    status: StatusCode,
    body: Vec<u8>,
    content_type: Option<&'static str>,
) -> Response<Vec<u8>> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    if let Some(ct) = content_type {
        r.headers_mut()
            .insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    r
}

fn finish(
    mut response: Response<Vec<u8>>,
    kv_ops: KvOpCounts,
    component: Option<String>,
) -> RequestOutcome {
    let headers = response.headers_mut();
    headers.insert(
        HeaderName::from_static(KV_OPS_HEADER),
        HeaderValue::from(kv_ops.total()),
    );
    if let Ok(v) = HeaderValue::from_str(&kv_ops.to_string()) {
        headers.insert(HeaderName::from_static(KV_OPS_DETAIL_HEADER), v);
    }
    RequestOutcome {
        response,
        kv_ops,
        component,
    }
}

/// Spin's request preparation: absolute URI (`http` scheme, authority from
/// the URI or the `Host` header, which must agree), original headers kept
/// and the `spin-*` headers appended.
fn prepare_request(
    req: Request<HyperIncomingBody>,
    route_match: &crate::routing::RouteMatch<'_>,
    client_addr: SocketAddr,
) -> anyhow::Result<Request<HyperIncomingBody>> {
    let (mut parts, body) = req.into_parts();
    let header_authority = match parts.headers.get(http::header::HOST) {
        Some(h) => Some(
            h.to_str()
                .context("'Host' header is not valid UTF-8")?
                .parse::<http::uri::Authority>()
                .context("'Host' header contains an invalid authority")?,
        ),
        None => None,
    };
    let authority = match (header_authority, parts.uri.authority().cloned()) {
        (None, None) => bail!("no 'Host' header present in request"),
        (Some(a), None) | (None, Some(a)) => a,
        (Some(a), Some(b)) => {
            if a != b {
                bail!("authority in 'Host' header does not match authority in URI");
            }
            a
        }
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".to_string());
    parts.uri = http::Uri::builder()
        .scheme("http")
        .authority(authority.clone())
        .path_and_query(path_and_query.as_str())
        .build()
        .context("cannot build the request URI")?;

    for (name, value) in spin_headers(
        route_match,
        "http",
        authority.as_str(),
        &path_and_query,
        client_addr,
    ) {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) else {
            continue;
        };
        parts.headers.append(name, value);
    }
    Ok(Request::from_parts(parts, body))
}

/// How long [`ServerHandle::shutdown`] waits for in-flight requests.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
