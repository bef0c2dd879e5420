//! The component host: [`HostBuilder`] loads a manifest, compiles and
//! pre-instantiates its components; [`Host`] handles requests in-process
//! ([`Host::handle`]) or over HTTP ([`Host::serve`]).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Store};
use wasmtime_wasi::WasiCtx;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::body::HyperIncomingBody;
use wasmtime_wasi_http::{WasiBody, WasiHttpCtx, WasiHttpView};

use crate::bindings::{self, InstanceState, KvInstance};
use crate::kv::{KvBackend, KvOpCounts, KvStores, RedisSwap};
use crate::manifest::AppManifest;
use crate::outbound::{
    is_service_chaining_host, parse_service_chaining_target, AllowedHostsConfig,
};
use crate::outbound_hooks::{add_outgoing_handler_to_linker, OutboundHooks};
use crate::routing::{spin_headers, Route, RouteMatch, Router};
use crate::runtime_config::RuntimeConfig;
use crate::variables::{AppVariables, ComponentVariables};

/// Name of the response header carrying the number of key-value operations
/// the request made (a test-host addition; Spin sends no such header).
pub const KV_OPS_HEADER: &str = "x-kv-ops";
/// Name of the response header carrying the per-operation detail, e.g.
/// `get=1,cas.current=1,cas.swap=1` (a test-host addition).
pub const KV_OPS_DETAIL_HEADER: &str = "x-kv-ops-detail";

/// Name of the response header carrying the total number of key-value
/// operations made by the service chaining requests of the request (all of
/// them, nested ones included). Present only when the request made chained
/// requests. A test-host addition.
pub const KV_OPS_CHAINED_HEADER: &str = "x-kv-ops-chained";

/// Name of the response header carrying the linear memory, in bytes, that
/// the component instance which handled the request asked for: the sum of
/// the sizes of its memories at their largest, a refused growth counted
/// too (see [`RequestOutcome::guest_memory`]). A test-host addition.
pub const GUEST_MEMORY_HEADER: &str = "x-guest-memory-bytes";

/// A [`ResourceLimiter`] that limits nothing and records the linear memory
/// a component instance asks for (initial sizes and every `memory.grow`).
#[derive(Debug, Default)]
pub(crate) struct MemoryRecorder(Arc<AtomicU64>);

impl ResourceLimiter for MemoryRecorder {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let more = desired.saturating_sub(current) as u64;
        self.0.fetch_add(more, Ordering::Relaxed);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        _desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

/// The client address reported (`spin-client-addr`) to a component handling
/// a service chaining request, as in Spin
/// (`spin@v3.6.x:crates/trigger-http/src/outbound_http.rs`,
/// `CHAINED_CLIENT_ADDR`).
pub const CHAINED_CLIENT_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

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
    redis_swap: Option<RedisSwap>,
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
            redis_swap: None,
        }
    }

    /// Loads only these components, like `spin up --component-id`
    /// (selective deployment): triggers of other components are dropped,
    /// so their routes answer 404. May be called repeatedly; ids must exist
    /// in the manifest. As in Spin, [`HostBuilder::build`] then fails if a
    /// retained component's `allowed_outbound_hosts` names a service
    /// chaining target that is not retained, or `*.spin.internal`.
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

    /// How every Redis store of the runtime config reports its swaps
    /// (default [`RedisSwap::Spin36`], exactly as Spin 3.6; see
    /// [`crate::kv`]). A backend given with [`HostBuilder::kv`] keeps its
    /// own setting. The command line's `--redis-swap`.
    pub fn redis_swap(mut self, swap: RedisSwap) -> Self {
        self.redis_swap = Some(swap);
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
            validate_service_chaining_for_components(&manifest, retain)?;
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
        let mut stores = runtime_config.key_value_stores.clone();
        if let Some(mode) = self.redis_swap {
            for (_, backend) in &mut stores {
                if let KvBackend::Redis { swap, .. } = backend {
                    *swap = mode;
                }
            }
        }
        let kv = KvStores::with_labels(default_backend, stores);

        let engine = shared_engine()?;
        let mut linker: Linker<InstanceState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
        add_http_to_linker(&mut linker).map_err(anyhow::Error::from)?;
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
                clock_offset: Arc::new(AtomicU64::new(0)),
            }),
        })
    }
}

/// The wall clock components read: the system's, plus the host's offset
/// ([`Host::advance_clock`]). Only `wasi:clocks/wall-clock` moves; the
/// monotonic clock (timeouts, waits) is the system's.
struct OffsetClock(Arc<AtomicU64>);

impl wasmtime_wasi::HostWallClock for OffsetClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        let real = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        real + Duration::from_secs(self.0.load(Ordering::Relaxed))
    }
}

/// `wasi:http/types` from wasmtime-wasi-http, and its
/// `wasi:http/outgoing-handler` with Spin's trap for service chaining to a
/// component without an HTTP trigger.
fn add_http_to_linker(linker: &mut Linker<InstanceState>) -> wasmtime::Result<()> {
    use wasmtime_wasi_http::p2::bindings::{self as http_bindings, LinkOptions};
    add_outgoing_handler_to_linker(linker)?;
    let options = LinkOptions::default();
    http_bindings::http::types::add_to_linker::<_, wasmtime_wasi_http::WasiHttp>(
        linker,
        &options.into(),
        |s: &mut InstanceState| s.http(),
    )?;
    Ok(())
}

/// Spin's check for `spin up --component-id` (selective deployment): a
/// retained component may not chain to a component that is not retained,
/// nor use wildcard chaining. Templated entries are ignored, as in Spin
/// (`spin@v3.6.x:crates/factor-outbound-networking/src/allowed_hosts.rs`,
/// `validate_service_chaining_for_components`). `manifest.http_triggers`
/// must already be reduced to the retained components.
fn validate_service_chaining_for_components(
    manifest: &AppManifest,
    retained: &[String],
) -> anyhow::Result<()> {
    for trigger in &manifest.http_triggers {
        let Some(component) = manifest.component(&trigger.component) else {
            continue;
        };
        if !retained.contains(&component.id) {
            continue;
        }
        for entry in &component.allowed_outbound_hosts {
            let Ok(uri) = entry.parse::<http::Uri>() else {
                continue;
            };
            let Some(target) = parse_service_chaining_target(&uri) else {
                continue;
            };
            if retained.contains(&target) {
                continue;
            }
            if target == "*" {
                bail!(
                    "Selected component '{}' cannot use wildcard service chaining: allowed_outbound_hosts = [\"http://*.spin.internal\"]",
                    component.id
                );
            }
            bail!(
                "Selected component '{}' cannot use service chaining to unselected component: allowed_outbound_hosts = [\"http://{target}.spin.internal\"]",
                component.id
            );
        }
    }
    Ok(())
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
    /// Seconds added to the wall clock components read.
    clock_offset: Arc<AtomicU64>,
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
    /// The key-value operations made by the component that handled the
    /// request (not those of its service chaining requests, see
    /// [`RequestOutcome::chained`]).
    pub kv_ops: KvOpCounts,
    /// The component that handled the request (`None` for a 404 or a
    /// `/.well-known/spin/` route).
    pub component: Option<String>,
    /// The service chaining requests made while handling the request, by
    /// the component and (nested) by the components it chained to, in the
    /// order they completed (so a nested call is listed before the call
    /// that made it). Their key-value operations are not in
    /// [`RequestOutcome::kv_ops`].
    pub chained: Vec<ChainedCall>,
    /// The linear memory, in bytes, the instance of the component that
    /// handled the request asked for, at its largest (also in the
    /// [`GUEST_MEMORY_HEADER`] header); `None` when no component ran.
    /// Memory of chained requests is not included.
    pub guest_memory: Option<u64>,
}

impl RequestOutcome {
    /// The key-value operations of the request and of all its chained
    /// requests.
    pub fn total_kv_ops(&self) -> KvOpCounts {
        let mut total = self.kv_ops;
        for call in &self.chained {
            total.add(&call.kv_ops);
        }
        total
    }

    /// The chained requests made to `component`.
    pub fn chained_to<'a>(&'a self, component: &'a str) -> impl Iterator<Item = &'a ChainedCall> {
        self.chained
            .iter()
            .filter(move |c| c.component == component)
    }
}

/// One service chaining request (`http://<component>.spin.internal/...`),
/// as recorded in [`RequestOutcome::chained`]. A test-host addition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainedCall {
    /// The component that made the request.
    pub caller: String,
    /// The component that handled it (the `<component>` of the host name).
    pub component: String,
    /// The request method.
    pub method: http::Method,
    /// The request path (without the query).
    pub path: String,
    /// The query string, if any (without the `?`).
    pub query: Option<String>,
    /// The status the caller received (500 when the callee failed).
    pub status: u16,
    /// The key-value operations the callee made (not including those of
    /// requests it chained to in turn, which have their own entries).
    pub kv_ops: KvOpCounts,
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

    /// Moves the wall clock every component of this host reads forward by
    /// `seconds` (an injected clock for tests: a grace period, a lease or
    /// months of life pass without waiting). Spin has no such thing: tests
    /// that use it run on this host only.
    pub fn advance_clock(&self, seconds: u64) {
        self.inner
            .clock_offset
            .fetch_add(seconds, Ordering::Relaxed);
    }

    /// Seconds [`Host::advance_clock`] added so far.
    pub fn clock_offset(&self) -> u64 {
        self.inner.clock_offset.load(Ordering::Relaxed)
    }

    /// Handles one request in-process, without a socket. The request's URI
    /// may be a bare path (`/healthz`); when it has no authority and no
    /// `Host` header, `Host: localhost` is assumed (Spin would refuse such
    /// a request). `spin-client-addr` is [`IN_PROCESS_CLIENT_ADDR`]. A
    /// `Host: <id>.spin.internal` header is removed, as Spin does, so a
    /// bare-path request with one fails. Service chaining requests the
    /// components make are run in-process too and listed in
    /// [`RequestOutcome::chained`].
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
        mut req: Request<HyperIncomingBody>,
        client_addr: SocketAddr,
    ) -> anyhow::Result<RequestOutcome> {
        // Spin's strip_forbidden_headers: a client cannot pose as a chained
        // request with `Host: <id>.spin.internal`; without a Host header
        // (and an origin-form URI) the request then fails below.
        if let Some(host) = req.headers().get(http::header::HOST) {
            if host.to_str().is_ok_and(is_service_chaining_host) {
                req.headers_mut().remove(http::header::HOST);
            }
        }
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
            return Ok(finish(response, KvOpCounts::default(), None, Vec::new()));
        }

        let Some(route_match) = self.inner.router.route(&path) else {
            return Ok(finish(
                simple_response(StatusCode::NOT_FOUND, Vec::new(), None),
                KvOpCounts::default(),
                None,
                Vec::new(),
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
                Vec::new(),
            ));
        }
        let req = prepare_request(req, &route_match, client_addr)?;
        let counts = Arc::new(Mutex::new(KvOpCounts::default()));
        let chain_log = Arc::new(Mutex::new(Vec::new()));
        let memory = Arc::new(AtomicU64::new(0));
        let response = match self
            .run_component(
                &component,
                req,
                counts.clone(),
                chain_log.clone(),
                memory.clone(),
            )
            .await
        {
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
        let chained = std::mem::take(&mut *lock(&chain_log));
        let mut outcome = finish(response, kv_ops, Some(component.id.to_string()), chained);
        let bytes = memory.load(Ordering::Relaxed);
        outcome.guest_memory = Some(bytes);
        outcome.response.headers_mut().insert(
            HeaderName::from_static(GUEST_MEMORY_HEADER),
            HeaderValue::from(bytes),
        );
        Ok(outcome)
    }

    /// Whether `component_id` can be the target of a service chaining
    /// request: it has an HTTP trigger (a private one will do) and was not
    /// left out by [`HostBuilder::retain_components`].
    pub(crate) fn is_routable_component(&self, component_id: &str) -> bool {
        self.inner.components.contains_key(component_id)
    }

    /// Runs a service chaining request of `caller` to `target`, the way
    /// Spin's HTTP trigger does (`spin@v3.6.x:crates/trigger-http`,
    /// `OutboundHttpInterceptor::intercept` then
    /// `HttpServer::handle_trigger_route` with `RouteMatch::synthetic`):
    /// in-process, in a fresh instance of `target` with its own key-value
    /// stores, variables and outbound permissions. The request keeps its
    /// method, path, query, headers and body, minus the `Host` header (Spin
    /// removes it from every outbound request), gets the `http` scheme and
    /// the `spin-*` headers of a `/...` match (path info = the whole path,
    /// full URL on `localhost`, client `0.0.0.0:0`). A failure of the
    /// callee is a 500 response to the caller. The call is recorded in
    /// `log`, with the callee's own key-value counts.
    pub(crate) async fn run_chained(
        &self,
        caller: Arc<str>,
        target: &str,
        req: Request<WasiBody>,
        log: Arc<Mutex<Vec<ChainedCall>>>,
    ) -> Result<Response<WasiBody>, wasmtime_wasi_http::Error> {
        let Some(component) = self.inner.components.get(target).cloned() else {
            // Normally trapped earlier, in outgoing-handler.handle.
            return Err(wasmtime_wasi_http::Error::InternalError(Some(format!(
                "unknown routing destination '{target}'"
            ))));
        };
        let (mut parts, body) = req.into_parts();
        let method = parts.method.clone();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().map(str::to_string);
        parts.headers.remove(http::header::HOST);

        let counts = Arc::new(Mutex::new(KvOpCounts::default()));
        let response = match prepare_chained_request(&mut parts, &component.id) {
            Err(e) => {
                eprintln!(
                    "Error processing request for component {:?}: {e:#}",
                    component.id
                );
                simple_response(StatusCode::INTERNAL_SERVER_ERROR, Vec::new(), None)
            }
            Ok(()) => {
                let req = Request::from_parts(parts, body);
                match self
                    .run_component(&component, req, counts.clone(), log.clone(), Arc::default())
                    .await
                {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!(
                            "Error processing request for component {:?}: {e:?}",
                            component.id
                        );
                        simple_response(StatusCode::INTERNAL_SERVER_ERROR, Vec::new(), None)
                    }
                }
            }
        };
        let kv_ops = *lock(&counts);
        lock(&log).push(ChainedCall {
            caller: caller.to_string(),
            component: component.id.to_string(),
            method,
            path,
            query,
            status: response.status().as_u16(),
            kv_ops,
        });
        Ok(response.map(|b| {
            Full::new(Bytes::from(b))
                .map_err(
                    |never: std::convert::Infallible| -> wasmtime_wasi_http::Error {
                        match never {}
                    },
                )
                .boxed_unsync()
        }))
    }

    async fn run_component(
        &self,
        component: &ComponentRuntime,
        req: Request<HyperIncomingBody>,
        counts: Arc<Mutex<KvOpCounts>>,
        chain_log: Arc<Mutex<Vec<ChainedCall>>>,
        memory: Arc<AtomicU64>,
    ) -> anyhow::Result<Response<Vec<u8>>> {
        let mut wasi = WasiCtx::builder();
        wasi.stdout(std::io::stderr())
            .stderr(std::io::stderr())
            .envs(&component.environment)
            .wall_clock(OffsetClock(self.inner.clock_offset.clone()));
        let state = InstanceState {
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            hooks: OutboundHooks {
                component_id: component.id.clone(),
                allowed: component.allowed_hosts.clone(),
                host: self.clone(),
                chain_log,
            },
            kv: KvInstance {
                allowed: component.allowed_kv.clone(),
                stores: self.inner.kv.clone(),
                counts,
            },
            variables: component.variables.clone(),
            memory: MemoryRecorder(memory),
        };
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|s| &mut s.memory);
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
    chained: Vec<ChainedCall>,
) -> RequestOutcome {
    let headers = response.headers_mut();
    headers.insert(
        HeaderName::from_static(KV_OPS_HEADER),
        HeaderValue::from(kv_ops.total()),
    );
    if let Ok(v) = HeaderValue::from_str(&kv_ops.to_string()) {
        headers.insert(HeaderName::from_static(KV_OPS_DETAIL_HEADER), v);
    }
    if !chained.is_empty() {
        let total: u64 = chained.iter().map(|c| c.kv_ops.total()).sum();
        headers.insert(
            HeaderName::from_static(KV_OPS_CHAINED_HEADER),
            HeaderValue::from(total),
        );
    }
    RequestOutcome {
        response,
        kv_ops,
        component,
        chained,
        guest_memory: None,
    }
}

/// The request preparation of a chained request: `http` scheme (the
/// authority stays `<id>.spin.internal`), header values must be UTF-8 (a
/// 500 otherwise, as for routed requests) and the `spin-*` headers of the
/// synthetic `/...` match are appended. There is no Host header, so the
/// full URL is on `localhost`, as in Spin's `prepare_request_headers`.
fn prepare_chained_request(
    parts: &mut http::request::Parts,
    component_id: &str,
) -> anyhow::Result<()> {
    if let Some((name, _)) = parts.headers.iter().find(|(_, v)| v.to_str().is_err()) {
        bail!("request header {name} is not valid UTF-8");
    }
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".to_string());
    let authority = parts
        .uri
        .authority()
        .cloned()
        .context("chained request without an authority")?;
    parts.uri = http::Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path_and_query.as_str())
        .build()
        .context("cannot build the request URI")?;
    let route = Route::synthetic(component_id);
    let route_match = RouteMatch::synthetic(&route, parts.uri.path());
    for (name, value) in spin_headers(
        &route_match,
        "http",
        "localhost",
        &path_and_query,
        CHAINED_CLIENT_ADDR,
    ) {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) else {
            continue;
        };
        parts.headers.append(name, value);
    }
    Ok(())
}

/// Spin's request preparation: absolute URI (`http` scheme, authority from
/// the URI or the `Host` header, which must agree), original headers kept
/// and the `spin-*` headers appended.
fn prepare_request(
    req: Request<HyperIncomingBody>,
    route_match: &RouteMatch<'_>,
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
