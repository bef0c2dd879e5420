//! Running the real components: an in-process [`App`] on the test host, and
//! [`HostProcess`] for separate host processes sharing one store.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use metal_ipam_host::kv::{KvBackend, KvStore, KvStores};
use metal_ipam_host::test_redis::TestRedis;
use metal_ipam_host::{Host, HostBuilder};
use serde_json::Value;

use crate::real_spin::{AppSource, ClientTls, SpinApp, SpinBin, SpinStore};
use crate::schema::repo_root;

/// The API token every test app is started with.
pub const TOKEN: &str = "component-test-token-0f3a";

/// The components built by `cargo build-wasm`: all fifteen of
/// `spin.toml` (`metal_ipam_core::routes::Component::ALL`), by the names
/// of their `.wasm` files.
pub const COMPONENTS: [&str; 15] = [
    "healthz",
    "pools",
    "allocate",
    "release",
    "events",
    "admission",
    "reconcile",
    "provision",
    "assign",
    "network",
    "attach_vlan",
    "detach_vlan",
    "poll",
    "metrics",
    "ui",
];

/// Path of a component's release build.
pub fn wasm_path(component: &str) -> PathBuf {
    repo_root().join(format!("target/wasm32-wasip2/release/fn_{component}.wasm"))
}

/// Panics with the command to run when a component has not been built.
pub fn require_wasm() {
    for c in COMPONENTS {
        let p = wasm_path(c);
        assert!(
            p.exists(),
            "{} is missing: build the components first with `cargo build-wasm` (tests/run does)",
            p.display()
        );
    }
}

/// A unique scratch directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates it.
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "metal-ipam-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A response, decoded.
#[derive(Debug, Clone)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Body as JSON (`Null` when empty or not JSON).
    pub body: Value,
    /// Raw headers.
    pub headers: http::HeaderMap,
    /// Key-value operations the request made (from the test host).
    pub kv_ops: u64,
    /// The body's bytes as sent.
    pub raw: Vec<u8>,
}

impl Resp {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// `body.reason` of an error body.
    pub fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or("")
    }
}

/// Where a test runs the application: the in-process test host, or real
/// Spin (`SPIN_BIN`) on one of its key-value backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// The wasmtime test host in-process (`metal_ipam_host`), in-memory
    /// store with Spin's SQLite semantics.
    Host,
    /// `spin up` on Spin's SQLite store (a file of the test's own).
    SpinSqlite,
    /// `spin up` on Spin's Redis store (a database of its own on the test
    /// Redis server).
    SpinRedis,
}

impl Runtime {
    /// A short name for messages (`host`, `spin-3.6.3/sqlite`, …).
    pub fn name(self) -> String {
        let spin = || SpinBin::from_env().map_or("spin".into(), |b| format!("spin-{}", b.number()));
        match self {
            Runtime::Host => "host".into(),
            Runtime::SpinSqlite => format!("{}/sqlite", spin()),
            Runtime::SpinRedis => format!("{}/redis", spin()),
        }
    }
}

enum Engine {
    Host(Host),
    Spin(Box<SpinApp>),
}

/// The application from `spin.toml`: loaded in-process on the test host,
/// or served by real `spin up` ([`App::on`]). Requests, answers and the
/// store look the same either way, except that only the test host counts
/// key-value operations ([`App::counts_kv_ops`]).
pub struct App {
    engine: Engine,
    runtime: Runtime,
    /// The `default` store as the test sees it (for inspection and
    /// seeding); for the host, its own stores.
    stores: KvStores,
    _redis: Option<TestRedis>,
    _dir: Option<TempDir>,
}

impl App {
    /// Loads spin.toml with an in-memory store.
    pub fn new() -> App {
        Self::with_backend(KvBackend::Memory, None)
    }

    /// Loads spin.toml with a SQLite file in a fresh temp dir.
    pub fn sqlite() -> App {
        let dir = TempDir::new("app");
        let file = dir.path().join("kv.db");
        Self::with_backend(KvBackend::SqliteFile(file), Some(dir))
    }

    fn with_backend(kv: KvBackend, dir: Option<TempDir>) -> App {
        Self::configured(kv, dir, &[])
    }

    /// Loads spin.toml with an in-memory store and extra variables (e.g.
    /// `k8s_api_url` and `k8s_token` of a fake API server).
    pub fn with_variables(vars: &[(&str, &str)]) -> App {
        Self::configured(KvBackend::Memory, None, vars)
    }

    /// Loads another manifest (e.g. the bench's naive allocator,
    /// `tests/bench/naive/spin.toml`) with an in-memory store.
    pub fn from_manifest(manifest: &Path) -> App {
        let host = HostBuilder::new(manifest.to_path_buf())
            .kv(KvBackend::Memory)
            .use_process_env(false)
            .variable("api_token", TOKEN)
            .build()
            .unwrap_or_else(|e| panic!("{} loads on the test host: {e:#}", manifest.display()));
        App::hosted(host, None)
    }

    fn hosted(host: Host, dir: Option<TempDir>) -> App {
        App {
            stores: host.kv_stores().clone(),
            engine: Engine::Host(host),
            runtime: Runtime::Host,
            _redis: None,
            _dir: dir,
        }
    }

    fn configured(kv: KvBackend, dir: Option<TempDir>, vars: &[(&str, &str)]) -> App {
        require_wasm();
        let mut b = HostBuilder::new(repo_root().join("spin.toml"))
            .kv(kv)
            .use_process_env(false)
            .variable("api_token", TOKEN);
        for (k, v) in vars {
            b = b.variable(*k, *v);
        }
        let host = b.build().expect("spin.toml loads on the test host");
        App::hosted(host, dir)
    }

    /// The application on `runtime` with these variables (and the
    /// `[[client_tls]]` blocks `tls`, which only real Spin reads), or `None`
    /// when that runtime was not given (`SPIN_BIN` unset, or no Redis for
    /// [`Runtime::SpinRedis`]).
    ///
    /// # Panics
    /// When the runtime was given but does not start.
    pub async fn on(runtime: Runtime, vars: &[(&str, String)], tls: &[ClientTls]) -> Option<App> {
        if runtime == Runtime::Host {
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            return Some(App::with_variables(&vars));
        }
        require_wasm();
        App::on_from(runtime, &AppSource::repo(), vars, tls).await
    }

    /// [`App::on`] of another [`AppSource`] (e.g. the app as pushed to an
    /// OCI registry), on real Spin only; `None` when that runtime was not
    /// given.
    ///
    /// # Panics
    /// When `runtime` is [`Runtime::Host`] (the test host loads local
    /// manifests only), or the runtime was given but does not start.
    pub async fn on_from(
        runtime: Runtime,
        source: &AppSource,
        vars: &[(&str, String)],
        tls: &[ClientTls],
    ) -> Option<App> {
        assert!(
            runtime != Runtime::Host,
            "the test host loads local manifests only"
        );
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let bin = SpinBin::from_env()?;
        let dir = TempDir::new("spin");
        let (store, backend, redis) = if runtime == Runtime::SpinSqlite {
            let file = dir.path().join("kv.db");
            (
                SpinStore::Sqlite(file.clone()),
                KvBackend::SqliteFile(file),
                None,
            )
        } else {
            let redis = TestRedis::get(&runtime.name())?;
            let url = redis.fresh_db(spin_redis_db());
            (
                SpinStore::Redis(url.clone()),
                KvBackend::redis(url),
                Some(redis),
            )
        };
        let spin = SpinApp::start_from(bin, source, dir, store, &vars, tls)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", runtime.name()));
        Some(App {
            engine: Engine::Spin(Box::new(spin)),
            runtime,
            stores: KvStores::new(backend),
            _redis: redis,
            _dir: None,
        })
    }

    /// `http://127.0.0.1:<port>` of a `spin up` app (what an outside
    /// client, e.g. Prometheus, connects to); `None` on the in-process host.
    pub fn base_url(&self) -> Option<&str> {
        match &self.engine {
            Engine::Host(_) => None,
            Engine::Spin(s) => Some(&s.base_url),
        }
    }

    /// Whether [`Resp::kv_ops`] is counted: only the test host counts
    /// key-value operations (Spin sends no such header), so the cost
    /// assertions are the host's.
    pub fn counts_kv_ops(&self) -> bool {
        matches!(self.engine, Engine::Host(_))
    }

    /// Asserts that `r` made `n` key-value operations, where they are
    /// counted (the test host); on real Spin it checks nothing, since Spin
    /// reports no counts.
    #[track_caller]
    pub fn assert_kv_ops(&self, r: &Resp, n: u64, what: &str) {
        if self.counts_kv_ops() {
            assert_eq!(r.kv_ops, n, "{what}");
        }
    }

    /// Asserts that `r` made `n` key-value operations besides its request
    /// counting (`observe::counters`: one `increment`, and at a power of two
    /// of its signature's count the registry's `cas_read`, plus a
    /// `cas_swap` the first time: 1 to 3 more on the test host, whose
    /// swaps are exact), where they are counted.
    #[track_caller]
    pub fn assert_counted_kv_ops(&self, r: &Resp, n: u64, what: &str) {
        if self.counts_kv_ops() {
            assert!(
                (n + 1..=n + 3).contains(&r.kv_ops),
                "{what}: {} operations, expected {n} + 1..=3 for the request counter",
                r.kv_ops
            );
        }
    }

    /// The in-process test host.
    ///
    /// # Panics
    /// When the application runs on real Spin.
    pub fn host(&self) -> &Host {
        match &self.engine {
            Engine::Host(h) => h,
            Engine::Spin(_) => panic!("{} has no in-process host", self.runtime.name()),
        }
    }

    /// Sends a request with the right bearer token.
    pub async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Resp {
        self.call_with(method, path, body, Some(&format!("Bearer {TOKEN}")))
            .await
    }

    /// Sends a request with the given `Authorization` header (or none).
    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        auth: Option<&str>,
    ) -> Resp {
        let mut b = http::Request::builder().method(method).uri(path);
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        let bytes = match body {
            Some(v) => {
                b = b.header("content-type", "application/json");
                serde_json::to_vec(v).expect("json")
            }
            None => Vec::new(),
        };
        if matches!(self.engine, Engine::Spin(_)) {
            // What a client on the network sends; in-process requests keep
            // the header out so that the component sees a streamed body.
            b = b.header("content-length", bytes.len());
        }
        self.send(b.body(bytes).expect("request")).await
    }

    /// Sends a raw request.
    pub async fn send(&self, req: http::Request<Vec<u8>>) -> Resp {
        let (parts, body, kv_ops) = match &self.engine {
            Engine::Host(host) => {
                let out = host
                    .handle(req)
                    .await
                    .expect("the host handles the request");
                let kv = out.kv_ops.total();
                let (parts, body) = out.response.into_parts();
                (parts, body, kv)
            }
            Engine::Spin(spin) => {
                let out = spin
                    .send(req)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e:#}", self.runtime.name()));
                (out.parts, out.body.to_vec(), 0)
            }
        };
        Resp {
            status: parts.status.as_u16(),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            headers: parts.headers,
            kv_ops,
            raw: body,
        }
    }

    /// The `default` store, for inspection and seeding: the host's own, or
    /// the file or Redis database Spin uses, opened with the test host's
    /// implementation of the same backend.
    pub async fn store(&self) -> KvStore {
        let allowed: HashSet<String> = ["default".to_string()].into();
        self.stores
            .open(&allowed, "default")
            .await
            .expect("default store")
    }

    /// The `spin up` process behind a real-Spin app (`None` on the host).
    pub fn spin(&self) -> Option<&SpinApp> {
        match &self.engine {
            Engine::Host(_) => None,
            Engine::Spin(s) => Some(s),
        }
    }

    /// Real Spin's process group (`None` on the host).
    pub fn spin_process_group(&self) -> Option<u32> {
        match &self.engine {
            Engine::Host(_) => None,
            Engine::Spin(s) => Some(s.process_group()),
        }
    }
}

/// `runtime` if it was given (the test host always is; real Spin when
/// `SPIN_BIN` names one), for tests that build their [`App`] themselves
/// with [`App::on`] and take this as their `on_every_runtime!` setup.
pub async fn given(runtime: Runtime) -> Option<Runtime> {
    match runtime {
        Runtime::Host => Some(runtime),
        Runtime::SpinSqlite | Runtime::SpinRedis => SpinBin::from_env().map(|_| runtime),
    }
}

/// A database number of the test Redis server for one real-Spin test:
/// 16 and up, so they never meet the host tests' fixed numbers (1–15), one
/// per test in a test process. The server needs `--databases 64` (as
/// `.ci/run` and the private server start it).
fn spin_redis_db() -> u8 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    16 + (n % 48) as u8
}

impl Default for App {
    fn default() -> Self {
        App::new()
    }
}

/// A `metal-ipam-host up` process serving spin.toml on an ephemeral port.
pub struct HostProcess {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base_url: String,
}

impl HostProcess {
    /// Path of the host binary built alongside the tests (which run from
    /// `target/<profile>/deps/`) or a program (`target/<profile>/`, the
    /// bench).
    pub fn binary() -> PathBuf {
        let exe = std::env::current_exe().expect("current exe");
        let name = format!("metal-ipam-host{}", std::env::consts::EXE_SUFFIX);
        let dir = exe.parent().expect("target dir");
        let beside = dir.join(&name);
        if beside.exists() || dir.file_name().is_none_or(|d| d != "deps") {
            return beside;
        }
        // target/<profile>/deps/<test> → target/<profile>/metal-ipam-host
        dir.parent().expect("profile dir").join(name)
    }

    /// Starts a host on `kv_file` and waits until it serves.
    ///
    /// # Errors
    /// If the binary is missing or the host does not come up in 60 s.
    pub fn start(kv_file: &Path) -> Result<HostProcess> {
        let mut kv = vec![std::ffi::OsString::from("--kv-file")];
        kv.push(kv_file.as_os_str().to_owned());
        Self::start_with_args(&kv)
    }

    /// Starts a host whose stores come from the runtime config file
    /// `runtime_config` (e.g. `[key_value_store.default]` with
    /// `type = "redis"`), plus `extra` host options (e.g.
    /// `["--redis-swap", "exec-reply"]`), and waits until it serves.
    ///
    /// # Errors
    /// As [`HostProcess::start`].
    pub fn start_with_runtime_config(runtime_config: &Path, extra: &[&str]) -> Result<HostProcess> {
        let mut args = vec![
            std::ffi::OsString::from("--runtime-config-file"),
            runtime_config.as_os_str().to_owned(),
        ];
        args.extend(extra.iter().map(std::ffi::OsString::from));
        Self::start_with_args(&args)
    }

    /// Starts `metal-ipam-host up` on spin.toml with these extra options
    /// (after `--from` and `--listen`) and waits until it serves.
    ///
    /// # Errors
    /// As [`HostProcess::start`].
    pub fn start_with_args(args: &[std::ffi::OsString]) -> Result<HostProcess> {
        require_wasm();
        Self::start_manifest(&repo_root().join("spin.toml"), args)
    }

    /// Starts `metal-ipam-host up` on another manifest (the bench runs a
    /// naive allocator's and an earlier build's side by side with ours)
    /// with these extra options, and waits until it serves.
    ///
    /// # Errors
    /// As [`HostProcess::start`].
    pub fn start_manifest(manifest: &Path, args: &[std::ffi::OsString]) -> Result<HostProcess> {
        let bin = Self::binary();
        if !bin.exists() {
            bail!("{} is missing: run `cargo build -p metal-ipam-host` (cargo test --workspace builds it)", bin.display());
        }
        let port = free_port()?;
        let child = Command::new(&bin)
            .args(["up", "--from"])
            .arg(manifest)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("SPIN_VARIABLE_API_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut p = HostProcess {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(p);
            }
            if let Some(status) = p.child.try_wait()? {
                bail!("host exited during startup: {status}");
            }
            if Instant::now() > deadline {
                bail!("host did not listen on {port} within 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port: bind `127.0.0.1:0`, read the port, drop the
/// listener. Another process could take it before the child binds it; the
/// child then fails to start, with the reason in its log.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The last `lines` lines of a log file, for a failure message (read from
/// its last 64 KiB).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("(cannot read {}: {e})", path.display()),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A pool object for tests.
pub fn pool_json(namespace: &str, name: &str, addresses: &[&str], prefix: u8) -> Value {
    serde_json::json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1",
        "kind": "MetalIPPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"addresses": addresses, "prefix": prefix}
    })
}

/// An `IPAddressClaim` v1beta2 for tests.
pub fn claim_json(namespace: &str, name: &str, uid: &str, pool: &str) -> Value {
    serde_json::json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": pool}}
    })
}

/// Declares each listed test — an `async fn name(x: T)` of the calling
/// module — once per [`Runtime`]: in modules `host`, `spin_sqlite` and
/// `spin_redis`, a `#[tokio::test]` that gets its `x` from
/// `setup(runtime).await` (an `Option<T>`). Where a runtime was not given
/// (`SPIN_BIN` unset), `setup` answers `None` and the test returns at once;
/// `tests/run` says in one line which runtimes it was given.
///
/// ```text
/// async fn app(runtime: Runtime) -> Option<App> { App::on(runtime, &[], &[]).await }
/// async fn pools_answer(app: App) { assert_eq!(app.call("GET", "/v1/pools", None).await.status, 200) }
/// metal_ipam_tests::on_every_runtime!(app: pools_answer);
/// ```
#[macro_export]
macro_rules! on_every_runtime {
    ($setup:ident: $($name:ident),+ $(,)?) => {
        $crate::on_every_runtime!(@one host, Host, $setup: $($name),+);
        $crate::on_every_runtime!(@one spin_sqlite, SpinSqlite, $setup: $($name),+);
        $crate::on_every_runtime!(@one spin_redis, SpinRedis, $setup: $($name),+);
    };
    (@one $module:ident, $runtime:ident, $setup:ident: $($name:ident),+) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if let Some(x) = super::$setup($crate::harness::Runtime::$runtime).await {
                        super::$name(x).await;
                    }
                }
            )+
        }
    };
}
