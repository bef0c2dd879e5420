//! A real Kubernetes control plane for tests: etcd, kube-apiserver and (if
//! present) kube-controller-manager, started once per test process the way
//! controller-runtime's envtest does it, from the binaries in the directory
//! named by `KUBEBUILDER_ASSETS`.
//!
//! This module owns starting those processes, installing the project's
//! CRDs and RBAC, minting the ServiceAccount's token, and the [`Session`]s
//! through which one test at a time uses the server with the same seeding
//! and inspection calls as [`FakeKube`](crate::fake_kube::FakeKube).
//!
//! ```no_run
//! use metal_ipam_tests::fake_kube::IPAM_GROUP;
//! use metal_ipam_tests::real_kube::ControlPlane;
//! use serde_json::json;
//!
//! let Some(cp) = ControlPlane::get() else {
//!     return; // KUBEBUILDER_ASSETS is not set: skip.
//! };
//! let kube = cp.session(); // exclusive; wipes the previous test's objects
//! kube.create(json!({
//!     "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
//!     "metadata": {"name": "web-0", "namespace": "default"},
//!     "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "p"}}
//! }));
//! // … point the code under test at cp.base_url() with cp.sa_token(),
//! // trusting cp.ca_file() …
//! assert!(kube.schema_violations().is_empty());
//! assert!(kube.forbidden().is_empty());
//! let claim = kube.get(IPAM_GROUP, "ipaddressclaims", Some("default"), "web-0");
//! # let _ = claim;
//! ```
//!
//! # What runs
//!
//! Everything lives in one directory `<temp>/metal-ipam-kube-<pid>-<n>`:
//! certificates, etcd's data, each process's log
//! (`etcd.log`, `kube-apiserver.log`, `kube-controller-manager.log`), the
//! audit policy and log, and an admin kubeconfig (`admin.kubeconfig`, for
//! `kubectl --kubeconfig` when debugging). The processes die with the test
//! process (see `process.rs`); etcd's data is removed at exit, the logs are
//! kept until a later run finds the process gone.
//!
//! * **Certificates** (the `openssl` CLI): an ECDSA P-256 CA, the API
//!   server's and the webhook endpoint's serving certificates (SANs
//!   `IP:127.0.0.1`, `DNS:localhost`), an RSA service-account signing key
//!   pair.
//! * **The admission webhook's endpoint** (`webhook.rs`): HTTPS on a
//!   loopback port reserved at start, in front of a Spin app once
//!   [`ControlPlane::install_artifact_webhook`] routes it there (what the
//!   artifact's Ingress is in a cluster); the API server's
//!   `--admission-control-config-file` makes it send `Bearer`
//!   [`crate::harness::TOKEN`] to that `host:port` and nowhere else, as
//!   `deploy/admission-config.example.yaml` describes.
//! * **Authentication**: a static token file with the admin token (user
//!   `admin`, group `system:masters`) and one for the controller manager
//!   (user `kube-controller-manager`, also `system:masters`, so its calls do
//!   not look like the admin's); ServiceAccount tokens.
//!   `--authorization-mode=RBAC`.
//! * **etcd** on two free loopback ports, with `--unsafe-no-fsync` when it
//!   accepts it (Debian's 3.4.23 does, though its `--help` does not list
//!   it) and a 100 ms election timeout (a single member elects itself after
//!   one: ready in milliseconds instead of about a second).
//! * **kube-apiserver** on a free port, HTTPS only; ready when `/readyz`
//!   answers `ok` (deadline 120 s).
//! * **CRDs** (see `kinds.rs`; metal-ipam's own from the clusterctl
//!   artifact `deploy/clusterctl/ipam-components.yaml`, substituted with
//!   [`sample_value`](crate::clusterctl::sample_value)s, the others from
//!   `tests/fixtures/crds/` and `kinds.rs`), each waited for until
//!   `Established`, then **kube-controller-manager** with only the garbage
//!   collector (before: it would notice kinds created later only on its 30 s
//!   rediscovery), then the artifact's Namespace and RBAC (ServiceAccounts,
//!   the token Secret, ClusterRoles and bindings: what `clusterctl init`
//!   installs, from the same file), and a
//!   TokenRequest for the ServiceAccount `metal-ipam` (24 h). The garbage
//!   collector syncs its informers in the background (about 1.4 s); no
//!   scenario waits for it (the app deletes what it owns itself).
//!
//! The Secret of type `kubernetes.io/service-account-token` of the RBAC is
//! created like the rest; nothing fills in its `data.token` (the token
//! controller does not run), which nothing here needs: the tests use the
//! TokenRequest token.
//!
//! # How it differs from FakeKube
//!
//! It is the real thing: watches, server-side apply, strategic merge patch,
//! CEL validation, defaulting, version conversion, field pruning (unknown
//! fields are dropped with a warning, not refused, unless the client asks
//! for `fieldValidation=Strict`). Namespaces are real objects: the
//! [`Session`] seeding calls create the namespace of what they create
//! ([`ControlPlane::ensure_namespace`]), but the code under test cannot
//! write into a namespace nobody created. Garbage collection is
//! asynchronous and happens only if kube-controller-manager runs; and it is
//! the real collector: an object whose `ownerReferences` name a
//! uid that does not exist (a made-up owner) is deleted within
//! milliseconds, where FakeKube waits for
//! [`collect_garbage`](crate::fake_kube::FakeKube::collect_garbage).
//! Recording comes from the audit log, so a request refused by RBAC (403)
//! has no body, and `content_type` is never known. There is no fault
//! injection, no paging control, and no global resourceVersion that only
//! the test's writes bump (the API server's own leases bump etcd's
//! revision every few seconds).

#![warn(missing_docs)]

mod audit;
mod http;
mod kinds;
mod process;
mod session;
mod webhook;

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub use http::Reply;
pub use session::Session;

use http::{block_on, blocking, Client, Request};
use process::Proc;

/// The environment variable naming the directory with `kube-apiserver`,
/// `etcd` and optionally `kube-controller-manager`, as envtest reads it.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// How long the API server may take to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(120);

/// How long smaller steps (etcd's health, CRDs established) may take.
const STEP_DEADLINE: Duration = Duration::from_secs(60);

/// The namespace and name of the project's ServiceAccount (deploy/rbac.yaml).
const SA_NAMESPACE: &str = "metal-ipam-system";
const SA_NAME: &str = "metal-ipam";

/// The shared control plane of this test process; see the module docs.
pub struct ControlPlane {
    dir: PathBuf,
    addr: SocketAddr,
    ca_file: PathBuf,
    audit_log: PathBuf,
    admin_token: String,
    sa_token: String,
    version: String,
    /// kube-controller-manager's log, if it runs.
    gc_log: Option<PathBuf>,
    client: Client,
    procs: Mutex<Vec<Proc>>,
    namespaces: Mutex<HashSet<String>>,
    /// One permit: the open [`Session`] holds it.
    sessions: Arc<tokio::sync::Semaphore>,
    /// The audit log offset past the latest fence's marker: every line
    /// before it is older than any later fence.
    audit_offset: AtomicU64,
    /// The HTTPS endpoint the API server calls the admission webhook on.
    webhook: webhook::Endpoint,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("base_url", &self.base_url())
            .field("dir", &self.dir)
            .field("version", &self.version)
            .field("garbage_collector", &self.gc_log.is_some())
            .finish()
    }
}

impl ControlPlane {
    /// The control plane of this test process, started on first use (3–10 s).
    ///
    /// `None` if `KUBEBUILDER_ASSETS` is unset or empty (the caller skips
    /// its real-server test), without any output.
    ///
    /// Safe to call from any thread, also from inside a tokio runtime (the
    /// start blocks through `block_in_place` on a multi-thread one).
    ///
    /// # Panics
    /// If `KUBEBUILDER_ASSETS` is set but a binary is missing or a step of
    /// the start fails; the message names the step and carries the tail of
    /// the failing process's log. Every later call panics with the same
    /// message, without trying again.
    pub fn get() -> Option<&'static ControlPlane> {
        let assets = std::env::var_os(ASSETS_ENV).filter(|v| !v.is_empty())?;
        static CONTROL_PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        let started = blocking(|| CONTROL_PLANE.get_or_init(|| start(PathBuf::from(assets))));
        match started {
            Ok(cp) => Some(cp),
            Err(e) => panic!("real_kube: starting the control plane ({ASSETS_ENV}): {e}"),
        }
    }

    /// `https://127.0.0.1:<port>`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The API server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA certificate (PEM) that signed the API server's certificate:
    /// the only root a client should trust.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// A token of the ServiceAccount `metal-ipam` in `metal-ipam-system`
    /// (valid 24 h), with exactly the RBAC that the clusterctl artifact
    /// (generated from deploy/rbac.yaml) grants.
    pub fn sa_token(&self) -> &str {
        &self.sa_token
    }

    /// The API server's `gitVersion`, e.g. `v1.36.2`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The API server's audit log (JSON lines; see [`Session::requests`]).
    pub fn audit_log(&self) -> &Path {
        &self.audit_log
    }

    /// Sends `method path` (path and query) with `token` and an optional
    /// JSON body (`application/json`, or `application/merge-patch+json`
    /// for PATCH), on a fresh TLS connection trusting only our CA, bounded
    /// to 30 s. Works from any thread, also inside a tokio runtime.
    ///
    /// # Errors
    /// Connection, TLS or timeout failures; any HTTP status is an `Ok`.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        let mut req = Request::new(method, path).token(token);
        if let Some(body) = body {
            req = if method == "PATCH" {
                req.body_of_type("application/merge-patch+json", body)
            } else {
                req.json(body)
            };
        }
        let client = self.client.clone();
        block_on(async move { client.send(req).await })
    }

    /// [`request`](Self::request) with the admin token; panics on a
    /// connection failure (with the API server's log if it has exited).
    pub(crate) fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> Reply {
        self.request(method, path, &self.admin_token, body)
            .unwrap_or_else(|e| panic!("real_kube: {e}{}", self.dead_processes()))
    }

    /// Creates namespace `ns` unless it exists (idempotent; cached).
    ///
    /// # Panics
    /// If the API server refuses it (other than `AlreadyExists`).
    pub fn ensure_namespace(&self, ns: &str) {
        if self.lock_namespaces().contains(ns) {
            return;
        }
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        let reply = self.admin("POST", "/api/v1/namespaces", Some(&body));
        if !(reply.is_success() || reply.status == 409) {
            panic!(
                "real_kube: creating namespace {ns}: {} {}",
                reply.status,
                reply.message()
            );
        }
        self.lock_namespaces().insert(ns.to_owned());
    }

    fn lock_namespaces(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.namespaces.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Server-side applies `obj` as the admin (field manager
    /// `metal-ipam-tests`, conflicts forced): creates it or updates it to
    /// this content, as `kubectl apply --server-side` and clusterctl do.
    /// The collection is found as in [`collection_path`].
    ///
    /// # Errors
    /// An object without apiVersion, kind or name, or a connection failure;
    /// any HTTP status is an `Ok`.
    pub fn apply(&self, obj: &Value) -> Result<Reply, String> {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("an object without metadata.name: {obj}"))?;
        let path = format!(
            "{}/{name}?fieldManager=metal-ipam-tests&force=true",
            collection_path(obj)?
        );
        let req = Request::new("PATCH", &path)
            .token(&self.admin_token)
            .body_of_type("application/apply-patch+yaml", obj);
        let client = self.client.clone();
        block_on(async move { client.send(req).await })
    }

    /// Creates (or server-side applies) a CustomResourceDefinition as the
    /// admin and waits until it is `Established` (deadline 60 s).
    ///
    /// # Errors
    /// If the API server refuses it or it is not established in time.
    pub fn install_crd(&self, crd: &Value) -> Result<(), String> {
        let reply = self.apply(crd)?;
        if !reply.is_success() {
            return Err(format!(
                "{}: {} {}",
                describe(crd),
                reply.status,
                reply.message()
            ));
        }
        let name = crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
        let started = Instant::now();
        loop {
            let reply = self.admin("GET", &path, None);
            if established(&reply.body) {
                return Ok(());
            }
            if started.elapsed() > STEP_DEADLINE {
                return Err(format!(
                    "CRD {name}: not Established within {STEP_DEADLINE:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Exclusive use of the control plane by the calling test until the
    /// [`Session`] is dropped: waits for any other session to end, then
    /// removes every object of the installed kinds and starts recording
    /// afresh. Callable from a plain thread or from inside a tokio runtime
    /// (not from two tasks of one `current_thread` runtime: blocking its
    /// only thread while the other task holds the session would never end).
    ///
    /// # Panics
    /// If a process of the control plane has exited, or the wipe fails.
    pub fn session(&'static self) -> Session {
        let sessions = Arc::clone(&self.sessions);
        let permit = block_on(async move { sessions.acquire_owned().await });
        session::Session::open(self, permit.expect("the session semaphore is never closed"))
    }

    /// An empty string if all processes run, else which ones exited, with
    /// the tails of their logs.
    pub(crate) fn dead_processes(&self) -> String {
        let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for p in procs.iter_mut() {
            if let Some(status) = p.exited() {
                out.push('\n');
                out.push_str(&p.failure(&format!("{} has exited ({status})", p.name)));
            }
        }
        out
    }

    pub(crate) fn audit_offset(&self) -> u64 {
        self.audit_offset.load(Ordering::SeqCst)
    }

    pub(crate) fn set_audit_offset(&self, end: u64) {
        self.audit_offset.fetch_max(end, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// The admission webhook of the clusterctl artifact
// ---------------------------------------------------------------------------

impl ControlPlane {
    /// Installs the clusterctl artifact's `ValidatingWebhookConfiguration`
    /// as `clusterctl init` would with only the required variables set (so
    /// every default stands: `failurePolicy: Fail`), its host the
    /// control plane's webhook endpoint (`127.0.0.1:<port>`, HTTPS with a
    /// certificate of the control plane's CA, put into each webhook's
    /// `caBundle` as cert-manager's cainjector would), and routes that
    /// endpoint to the Spin app at `app` (`http://127.0.0.1:<port>`). The
    /// API server then calls the app for every pool and profile write,
    /// sending `Bearer` [`crate::harness::TOKEN`].
    ///
    /// Hold the returned guard while the webhook is wanted and drop it
    /// before the [`Session`] (it deletes the configuration: a session's
    /// wipe deletes pools, which the webhook may refuse).
    ///
    /// # Errors
    /// If `app` is not an `http://` address, the artifact cannot be read or
    /// substituted, or the API server refuses the configuration.
    pub fn install_artifact_webhook(&'static self, app: &str) -> Result<ArtifactWebhook, String> {
        let app: SocketAddr = app
            .strip_prefix("http://")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("not an http://address:port: {app}"))?;
        let mut config = artifact_webhook_configuration(&self.webhook.host())?;
        let ca = std::fs::read(&self.ca_file)
            .map_err(|e| format!("reading {}: {e}", self.ca_file.display()))?;
        let ca = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, ca);
        for hook in config["webhooks"].as_array_mut().into_iter().flatten() {
            hook["clientConfig"]["caBundle"] = json!(ca);
        }
        self.webhook.route_to(Some(app));
        let reply = self.apply(&config)?;
        if !reply.is_success() {
            self.webhook.route_to(None);
            return Err(format!(
                "{}: {} {}",
                describe(&config),
                reply.status,
                reply.message()
            ));
        }
        Ok(ArtifactWebhook {
            cp: self,
            app,
            config: reply.body,
        })
    }
}

/// The artifact's `ValidatingWebhookConfiguration`, substituted as
/// `clusterctl init` does for a user who set only the required variables
/// (the webhook's host `host`, sample values for the others).
fn artifact_webhook_configuration(host: &str) -> Result<Value, String> {
    use crate::clusterctl;
    let values = [(clusterctl::WEBHOOK_HOST.name, host.to_owned())].into();
    clusterctl::components_with_defaults(&crate::schema::repo_root(), &values)
        .map_err(|e| format!("the clusterctl artifact: {e:#}"))?
        .into_iter()
        .find(|o| o["kind"] == "ValidatingWebhookConfiguration")
        .ok_or_else(|| "the clusterctl artifact has no ValidatingWebhookConfiguration".to_owned())
}

/// The artifact's webhook configuration, installed by
/// [`ControlPlane::install_artifact_webhook`]; dropping it deletes the
/// configuration and routes the endpoint nowhere.
#[derive(Debug)]
pub struct ArtifactWebhook {
    cp: &'static ControlPlane,
    app: SocketAddr,
    config: Value,
}

impl ArtifactWebhook {
    /// The configuration as the API server stored it.
    pub fn configuration(&self) -> &Value {
        &self.config
    }

    /// Whether the endpoint reaches the app: `false` makes the webhook a
    /// call that fails (the TLS handshake succeeds, then the connection
    /// closes), as when every replica is down.
    pub fn reach_app(&self, reach: bool) {
        self.cp.webhook.route_to(reach.then_some(self.app));
    }
}

impl Drop for ArtifactWebhook {
    fn drop(&mut self) {
        let name = self.config["metadata"]["name"].as_str().unwrap_or_default();
        let path =
            format!("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}");
        let _ = self.cp.request("DELETE", &path, &self.cp.admin_token, None);
        self.cp.webhook.route_to(None);
    }
}

// ---------------------------------------------------------------------------
// Start
// ---------------------------------------------------------------------------

/// A random hex token.
fn random_token() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let a = h.finish();
    h.write_u64(a);
    format!("{a:016x}{:016x}", h.finish())
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

fn binary(assets: &Path, name: &str) -> Option<PathBuf> {
    let path = assets.join(name);
    path.is_file().then_some(path)
}

fn required_binary(assets: &Path, name: &str) -> Result<PathBuf, String> {
    binary(assets, name).ok_or_else(|| {
        format!(
            "{ASSETS_ENV}={}: no {name} binary in it (it needs kube-apiserver and etcd, \
             optionally kube-controller-manager)",
            assets.display()
        )
    })
}

/// Polls `ready` every 50 ms until it answers `Ok(true)`, `proc` exits or
/// `deadline` passes.
fn wait_for(
    proc: &mut Proc,
    what: &str,
    deadline: Duration,
    mut ready: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        match ready() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = e,
        }
        if let Some(status) = proc.exited() {
            return Err(proc.failure(&format!(
                "{} exited ({status}) while waiting for {what}",
                proc.name
            )));
        }
        if started.elapsed() > deadline {
            let last = if last.is_empty() {
                String::new()
            } else {
                format!(" (last error: {last})")
            };
            return Err(proc.failure(&format!("{what}: not within {deadline:?}{last}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kubeconfig(server: &str, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: real-kube\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
         users:\n\
         - name: user\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: real-kube\n  context:\n    cluster: real-kube\n    user: user\n\
         current-context: real-kube\n",
        ca.display()
    )
}

/// The collection path to POST an object of deploy/ to: core kinds under
/// `/api/v1`, others under `/apis/<apiVersion>`, the plural being the
/// lower-cased kind plus `s` (`es` after an `s`, `ies` for a final `y`):
/// right for every kind of deploy/ and its clusterctl artifacts (Namespace,
/// ServiceAccount, Secret, ClusterRole, Ingress, NetworkPolicy, SpinApp, …);
/// a kind it gets wrong fails loudly with 404.
fn collection_path(obj: &Value) -> Result<String, String> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version.is_empty() || kind.is_empty() {
        return Err(format!("an object without apiVersion or kind: {obj}"));
    }
    let prefix = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    let namespace = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map_or_else(String::new, |ns| format!("/namespaces/{ns}"));
    let kind = kind.to_ascii_lowercase();
    let plural = if kind.ends_with('s') {
        format!("{kind}es")
    } else if let Some(stem) = kind.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{kind}s")
    };
    Ok(format!("{prefix}{namespace}/{plural}"))
}

/// `Kind name`, for messages.
fn describe(obj: &Value) -> String {
    format!(
        "{} {}",
        obj.get("kind").and_then(Value::as_str).unwrap_or("?"),
        obj.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?")
    )
}

/// Whether a CRD's status says `Established`.
fn established(crd: &Value) -> bool {
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Established")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// The kinds of the clusterctl artifact the control plane installs at
/// start (besides its CRDs): the namespace and the RBAC.
const ARTIFACT_START_KINDS: &[&str] = &[
    "Namespace",
    "ServiceAccount",
    "Secret",
    "ClusterRole",
    "ClusterRoleBinding",
];

fn start(assets: PathBuf) -> Result<ControlPlane, String> {
    let apiserver_bin = required_binary(&assets, "kube-apiserver")?;
    let etcd_bin = required_binary(&assets, "etcd")?;
    let kcm_bin = binary(&assets, "kube-controller-manager");

    let dir = process::make_temp_dir()?;
    let in_dir = |what: String| format!("{what} (in {})", dir.display());
    let arg = |name: &str, path: &Path| format!("--{name}={}", path.display());
    let mut procs = Vec::new();

    // etcd, which makes the certificates while it starts.
    let etcd_port = process::free_port()?;
    let peer_port = process::free_port()?;
    let data_dir = dir.join("etcd");
    process::remove_at_exit(data_dir.clone());
    let mut etcd_args = vec![
        arg("data-dir", &data_dir),
        format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
        format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
        format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
        "--logger=zap".to_owned(),
        // A single member elects itself after one election timeout: 100 ms
        // instead of the default 1 s.
        "--heartbeat-interval=20".to_owned(),
        "--election-timeout=100".to_owned(),
    ];
    // Not in 3.4's --help, but accepted: ask the binary itself.
    let no_fsync = std::process::Command::new(&etcd_bin)
        .args(["--unsafe-no-fsync", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if no_fsync {
        etcd_args.push("--unsafe-no-fsync".to_owned());
    }
    let mut etcd = Proc::spawn("etcd", &etcd_bin, &etcd_args, &dir, dir.join("etcd.log"))?;
    process::make_certificates(&dir).map_err(in_dir)?;
    let webhook = webhook::Endpoint::start(&dir)?;
    let admission_config = webhook.write_admission_config(&dir, crate::harness::TOKEN)?;
    let admin_token = random_token();
    let kcm_token = random_token();
    write(
        &dir.join("tokens.csv"),
        &format!(
            "{admin_token},{},admin,\"system:masters\"\n\
             {kcm_token},kube-controller-manager,kube-controller-manager,\"system:masters\"\n",
            audit::ADMIN_USERNAME
        ),
    )?;
    let audit_policy = dir.join("audit-policy.yaml");
    write(&audit_policy, audit::POLICY)?;
    let audit_log = dir.join("audit.log");
    let etcd_client = Client::plain(SocketAddr::from((Ipv4Addr::LOCALHOST, etcd_port)));
    wait_for(&mut etcd, "etcd's /health", STEP_DEADLINE, || {
        let c = etcd_client.clone();
        let reply = block_on(async move { c.send(Request::new("GET", "/health")).await })?;
        Ok(reply.status == 200 && reply.body.get("health").and_then(Value::as_str) == Some("true"))
    })?;
    procs.push(etcd);

    // kube-apiserver
    let port = process::free_port()?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let apiserver_args = vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        "--advertise-address=127.0.0.1".to_owned(),
        // Loopback is not a valid Endpoints address: without this it logs
        // an error every 10 s trying to publish itself as `kubernetes`.
        "--endpoint-reconciler-type=none".to_owned(),
        arg("cert-dir", &dir.join("certs")),
        arg("tls-cert-file", &dir.join("apiserver.crt")),
        arg("tls-private-key-file", &dir.join("apiserver.key")),
        arg("token-auth-file", &dir.join("tokens.csv")),
        "--authorization-mode=RBAC".to_owned(),
        "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
        arg("service-account-key-file", &dir.join("sa.pub")),
        arg("service-account-signing-key-file", &dir.join("sa.key")),
        "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        arg("audit-policy-file", &audit_policy),
        arg("audit-log-path", &audit_log),
        "--audit-log-mode=blocking".to_owned(),
        "--audit-log-format=json".to_owned(),
        arg("admission-control-config-file", &admission_config),
    ];
    let mut apiserver = Proc::spawn(
        "kube-apiserver",
        &apiserver_bin,
        &apiserver_args,
        &dir,
        dir.join("kube-apiserver.log"),
    )?;
    let ca_file = dir.join("ca.crt");
    let client = Client::tls(addr, &ca_file)?;
    let send = |req: Request| {
        let c = client.clone();
        block_on(async move { c.send(req).await })
    };
    wait_for(
        &mut apiserver,
        "kube-apiserver's /readyz",
        READY_DEADLINE,
        || {
            let reply = send(Request::new("GET", "/readyz").token(&admin_token))?;
            Ok(reply.status == 200)
        },
    )?;
    let admin = |method: &str, path: &str, body: Option<&Value>| {
        let mut req = Request::new(method, path).token(&admin_token);
        if let Some(body) = body {
            req = req.json(body);
        }
        send(req)
    };
    let reply = admin("GET", "/version", None).map_err(|e| apiserver.failure(&e))?;
    let version = reply
        .body
        .get("gitVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("GET /version: no gitVersion in {}", reply.body))?
        .to_owned();

    // The clusterctl artifact, substituted with sample values: metal-ipam's
    // CRDs, namespace and RBAC come from it, as `clusterctl init` installs
    // them.
    let artifact = crate::clusterctl::substituted_components(
        &crate::schema::repo_root(),
        &std::collections::BTreeMap::new(),
    )
    .map_err(|e| format!("the clusterctl artifact: {e:#}"))?;
    let artifact_crds: Vec<&Value> = artifact
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    let ours: HashSet<String> = kinds::kinds()
        .iter()
        .filter(|k| k.group == crate::fake_kube::METAL_GROUP)
        .map(kinds::Kind::crd_name)
        .collect();
    let from_artifact: HashSet<String> = artifact_crds
        .iter()
        .filter_map(|c| c.pointer("/metadata/name").and_then(Value::as_str))
        .map(str::to_owned)
        .collect();
    if ours != from_artifact {
        return Err(format!(
            "the clusterctl artifact's CRDs {from_artifact:?} are not deploy/crds/ {ours:?}: \
             run deploy/clusterctl/generate"
        ));
    }

    // CRDs, established before the garbage collector starts.
    let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let others = kinds::kinds()
        .iter()
        .filter(|k| k.group != crate::fake_kube::METAL_GROUP)
        .map(|k| &k.crd);
    for crd in others.chain(artifact_crds.iter().copied()) {
        let reply = admin("POST", crd_path, Some(crd))?;
        if !reply.is_success() {
            return Err(format!(
                "installing CRD {}: {} {}",
                describe(crd),
                reply.status,
                reply.message()
            ));
        }
    }
    for kind in kinds::kinds() {
        let path = format!("{crd_path}/{}", kind.crd_name());
        wait_for(
            &mut apiserver,
            &format!("CRD {} Established", kind.crd_name()),
            STEP_DEADLINE,
            || {
                let reply = admin("GET", &path, None)?;
                Ok(established(&reply.body))
            },
        )?;
    }

    // kube-controller-manager (garbage collector only).
    let server = format!("https://{addr}");
    let admin_kubeconfig = dir.join("admin.kubeconfig");
    write(
        &admin_kubeconfig,
        &kubeconfig(&server, &ca_file, &admin_token),
    )?;
    let kcm = match &kcm_bin {
        None => None,
        Some(bin) => {
            let config = dir.join("kube-controller-manager.kubeconfig");
            write(&config, &kubeconfig(&server, &ca_file, &kcm_token))?;
            let args = vec![
                arg("kubeconfig", &config),
                "--controllers=garbagecollector".to_owned(),
                "--leader-elect=false".to_owned(),
                "--secure-port=0".to_owned(),
            ];
            Some(Proc::spawn(
                "kube-controller-manager",
                bin,
                &args,
                &dir,
                dir.join("kube-controller-manager.log"),
            )?)
        }
    };

    // The artifact's namespace and RBAC, in the file's order (the
    // ServiceAccount before its token Secret).
    let start_objects = artifact.iter().filter(|o| {
        o["kind"]
            .as_str()
            .is_some_and(|k| ARTIFACT_START_KINDS.contains(&k))
    });
    for doc in start_objects {
        let reply = admin("POST", &collection_path(doc)?, Some(doc))?;
        if !reply.is_success() {
            return Err(format!(
                "{}/ipam-components.yaml: creating {}: {} {}",
                crate::clusterctl::ARTIFACT_DIR,
                describe(doc),
                reply.status,
                reply.message()
            ));
        }
    }
    let token_request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 86_400},
    });
    let reply = admin(
        "POST",
        &format!("/api/v1/namespaces/{SA_NAMESPACE}/serviceaccounts/{SA_NAME}/token"),
        Some(&token_request),
    )?;
    let sa_token = reply
        .body
        .pointer("/status/token")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            format!(
                "TokenRequest for {SA_NAMESPACE}/{SA_NAME}: {} {}",
                reply.status,
                reply.message()
            )
        })?
        .to_owned();

    // Not waited for: its informers sync in the background.
    let gc_log = kcm.as_ref().map(|p| p.log.clone());
    procs.push(apiserver);
    procs.extend(kcm);

    let mut namespaces = HashSet::new();
    namespaces.insert(SA_NAMESPACE.to_owned());
    namespaces.insert("default".to_owned());
    Ok(ControlPlane {
        addr,
        ca_file,
        audit_log,
        admin_token,
        sa_token,
        version,
        gc_log,
        client,
        procs: Mutex::new(procs),
        namespaces: Mutex::new(namespaces),
        sessions: Arc::new(tokio::sync::Semaphore::new(1)),
        audit_offset: AtomicU64::new(0),
        webhook,
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_objects_go_to_their_collections() {
        let cases = [
            (
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}),
                "/api/v1/namespaces",
            ),
            (
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "a", "namespace": "x"}}),
                "/api/v1/namespaces/x/serviceaccounts",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a", "namespace": "x"}}),
                "/api/v1/namespaces/x/secrets",
            ),
            (
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "a"}}),
                "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            ),
            (
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "a"}}),
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            ),
        ];
        for (obj, path) in cases {
            assert_eq!(collection_path(&obj).unwrap(), path);
        }
        for (kind, plural) in [
            ("Ingress", "ingresses"),
            ("NetworkPolicy", "networkpolicies"),
            ("SpinApp", "spinapps"),
        ] {
            let obj = json!({"apiVersion": "a.b/v1", "kind": kind, "metadata": {"name": "n"}});
            assert_eq!(
                collection_path(&obj).unwrap(),
                format!("/apis/a.b/v1/{plural}")
            );
        }
        assert!(collection_path(&json!({"kind": "X"})).is_err());
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(random_token(), random_token());
        assert_eq!(random_token().len(), 32);
    }

    #[test]
    fn unset_assets_mean_no_control_plane() {
        // Only meaningful where the variable is unset; the crate's own test
        // run does not set it.
        if std::env::var_os(ASSETS_ENV).is_none_or(|v| v.is_empty()) {
            assert!(ControlPlane::get().is_none());
        }
    }
}
