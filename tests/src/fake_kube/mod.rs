//! `FakeKube`: an in-process fake Kubernetes API server on loopback, for
//! tests of code that creates `IPAddress`es, patches claim finalizers and
//! status, and lists objects.
//!
//! It speaks HTTP/1 JSON on `127.0.0.1:<ephemeral>` with the real API paths
//! and implements the parts of API-server behaviour an IPAM provider relies
//! on, so a test fails where a real cluster would refuse the request.
//!
//! ```no_run
//! # async fn demo() {
//! use metal_ipam_tests::fake_kube::{FakeKube, IPAM_GROUP};
//! use serde_json::json;
//!
//! let kube = FakeKube::start().await;
//! kube.create(json!({
//!     "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
//!     "metadata": {"name": "web-0", "namespace": "default"},
//!     "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "p"}}
//! }));
//! // … point the code under test at kube.base_url() with kube.token() …
//! assert!(kube.schema_violations().is_empty());
//! let claim = kube.get(IPAM_GROUP, "ipaddressclaims", Some("default"), "web-0").unwrap();
//! # let _ = claim;
//! # }
//! ```
//!
//! The server runs as a task on the caller's tokio runtime. Code under test
//! that blocks a thread on its HTTP calls needs a multi-threaded runtime
//! (`#[tokio::test(flavor = "multi_thread")]`) or its own thread, or the
//! server never gets to answer. The seeding and inspection methods are
//! synchronous and safe to call from async code (they only take a mutex).
//!
//! # Resources
//!
//! | group/version | plural | scope | status subresource | schema |
//! | --- | --- | --- | --- | --- |
//! | `ipam.cluster.x-k8s.io/v1beta2` | `ipaddressclaims` | namespaced | yes | CAPI CRD (tests/fixtures/crds) |
//! | `ipam.cluster.x-k8s.io/v1beta2` | `ipaddresses` | namespaced | no | CAPI CRD (tests/fixtures/crds) |
//! | `ipam.metal-ipam.dev/v1alpha1` | `metalippools` | namespaced | yes | deploy/crds |
//! | `ipam.metal-ipam.dev/v1alpha1` | `globalmetalippools` | cluster | yes | deploy/crds |
//! | `ipam.metal-ipam.dev/v1alpha1` | `metalprefixpools` | namespaced | yes | deploy/crds |
//! | `ipam.metal-ipam.dev/v1alpha1` | `globalmetalprefixpools` | cluster | yes | deploy/crds |
//! | `ipam.cluster.x-k8s.io/v1alpha2` | `inclusterippools`, `inclusterprefixpools` | namespaced | yes | in-cluster provider CRDs (tests/fixtures/crds) |
//! | `ipam.cluster.x-k8s.io/v1alpha2` | `globalinclusterippools`, `globalinclusterprefixpools` | cluster | yes | in-cluster provider CRDs (tests/fixtures/crds) |
//! | `cluster.x-k8s.io/v1beta2` | `clusters` | namespaced | yes | none: any object |
//!
//! Only v1beta2 of the CAPI IPAM kinds is served. A real API server also
//! serves v1alpha1 and v1beta1 and converts between them; our code always
//! uses v1beta2, so other versions answer 404 here.
//!
//! Paths: `/apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}[/status]]`
//! and `/apis/{group}/{version}/{plural}[/{name}[/status]]` (cluster-scoped
//! kinds, and the all-namespaces LIST of namespaced kinds). Every request
//! needs `Authorization: Bearer <token()>`, else 401.
//!
//! # Emulated
//!
//! * **GET** (404 `NotFound`) and **LIST** with `limit`/`continue` (each
//!   paged LIST reads a consistent snapshot taken at its first page, so
//!   objects created meanwhile do not show up in later pages), a
//!   well-formed but unknown or expired token answers 410 `Expired`, a
//!   malformed one 400; `labelSelector` (`=`, `==`, `!=`, `in`, `notin`,
//!   exists, `!`not-exists) and `fieldSelector` on `metadata.name` and
//!   `metadata.namespace`; `metadata.resourceVersion`, `continue` and
//!   `remainingItemCount` (without selectors) in the list. Items are ordered
//!   by namespace, then name. [`FakeKube::set_list_page_size`] caps pages
//!   below the client's `limit` (a server may return fewer items than
//!   `limit`); a LIST without `limit` is never paged, as on a real server.
//! * **POST**: 409 `AlreadyExists`; sets `uid`, `resourceVersion` (one
//!   global counter), `creationTimestamp` and `generation: 1`, honours
//!   `generateName`, drops `status` for kinds with a status subresource and
//!   any `deletionTimestamp`; a body namespace other than the path's is 400;
//!   `apiVersion`/`kind` must match the path (400); a `resourceVersion` in
//!   the body is 500, as etcd3 storage answers.
//! * **PUT**: `metadata.resourceVersion` is required (422) and must be
//!   current (409 `Conflict`); on the main resource `status` changes are
//!   ignored, on `/status` only `status` is taken; `generation` bumps when
//!   anything outside `metadata` (and outside `status` when it is a
//!   subresource) changes; `uid` is immutable (422), `creationTimestamp` and
//!   `deletionTimestamp` silently keep their values, and a
//!   `deletionTimestamp` cannot be set by an update (422). A write that
//!   changes nothing does not bump `resourceVersion`.
//! * **PATCH** `application/merge-patch+json` (RFC 7386) and
//!   `application/json-patch+json` (RFC 6902: add, remove, replace, move,
//!   copy, test), on the object and on `/status`; the patch applies to the
//!   stored object and the result goes through PUT's rules, so a
//!   `metadata.resourceVersion` in a merge patch is a precondition (409).
//!   A JSON patch that does not apply (failed `test`, missing path) is 422;
//!   strategic merge patch and server-side apply are 415, as is any other
//!   type.
//! * **DELETE**: with finalizers the object gets `deletionTimestamp`,
//!   `deletionGracePeriodSeconds: 0` and a `generation` bump, and is
//!   returned (200); without, it is removed and a `Success` `Status` is
//!   returned. `preconditions.uid`/`resourceVersion` in the DeleteOptions
//!   body (409 on mismatch); `propagationPolicy` `Background` (default) or
//!   `Orphan`. Once deleting, new finalizers are forbidden (422) and an
//!   update that leaves no finalizers removes the object.
//! * **Garbage collection**, synchronously when an object is removed: each
//!   object whose `ownerReferences` name its uid is deleted (honouring its
//!   finalizers) if none of its owners exists any more; if other owners
//!   still exist, only the dangling references are removed — as the real
//!   collector does (an `IPAddress` owned by a claim *and* a pool survives
//!   the claim while the pool exists). [`FakeKube::collect_garbage`] runs a
//!   full pass, for objects created with owners that never existed.
//! * **Validation** (422 `Invalid` with `details.causes`): the CRD schema
//!   of the served version (unknown fields are errors, as with
//!   `fieldValidation=Strict`; a real server's default would prune them with
//!   a warning, so writes that do not ask for Strict are listed by
//!   [`FakeKube::lax_writes`]), plus object metadata: name (DNS subdomain), namespace,
//!   label keys and values, annotations, finalizer names, owner references
//!   (`apiVersion`, `kind`, `name`, `uid` required, at most one
//!   controller). These failures are also kept in
//!   [`FakeKube::schema_violations`].
//! * **Errors** are `Status` objects with `reason` and `details` as the API
//!   server builds them.
//!
//! # Not emulated
//!
//! Watches (`watch=true` is 400), `dryRun` (400), server-side apply and
//! strategic merge patch (415), foreground deletion (400),
//! deletecollection (405), version conversion, defaulting, CEL rules
//! (`x-kubernetes-validations`), admission webhooks (such as CAPI's
//! immutable claim spec), `managedFields`, `resourceVersion` semantics on
//! GET/LIST requests (always the latest state), discovery, namespaces as
//! objects (any namespace exists), and protobuf/YAML bodies.

#![warn(missing_docs)]

mod error;
mod patch;
mod server;
mod store;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use error::ApiError;

use server::Shared;
pub(crate) use store::IN_CLUSTER_CRDS;
use store::{by_object, by_plural, meta_str, DeleteOptions, Fault, ResourceType, State, Write};

/// `ipam.cluster.x-k8s.io`: `ipaddressclaims`, `ipaddresses` (v1beta2).
pub const IPAM_GROUP: &str = "ipam.cluster.x-k8s.io";
/// `ipam.metal-ipam.dev`: `metalippools`, `globalmetalippools` (v1alpha1).
pub const METAL_GROUP: &str = "ipam.metal-ipam.dev";
/// `cluster.x-k8s.io`: `clusters` (v1beta2).
pub const CLUSTER_GROUP: &str = "cluster.x-k8s.io";
/// API group of infrastructure machines (CAPP's `PacketMachine`).
pub const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";

/// One request FakeKube answered (after authentication).
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`, ….
    pub method: String,
    /// The URL path, e.g.
    /// `/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/default/ipaddresses`.
    pub path: String,
    /// The raw (still percent-encoded) query string, if any.
    pub query: Option<String>,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body: `None` if empty, its JSON if it parses, else a JSON string
    /// holding the (lossily decoded) text.
    pub body: Option<Value>,
    /// The HTTP status FakeKube answered with.
    pub status: u16,
}

impl Recorded {
    /// Whether the request could change state (anything but GET, HEAD,
    /// OPTIONS).
    pub fn is_write(&self) -> bool {
        !matches!(self.method.as_str(), "GET" | "HEAD" | "OPTIONS")
    }

    /// `"METHOD path"`, handy for asserting request order.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// What a delete did.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    /// The object is gone; this was its last state.
    Removed(Value),
    /// The object has finalizers and stays, with `deletionTimestamp` set,
    /// until they are removed.
    Finalizing(Value),
}

impl DeleteOutcome {
    /// The object, removed or still finalizing.
    pub fn object(&self) -> &Value {
        match self {
            DeleteOutcome::Removed(obj) | DeleteOutcome::Finalizing(obj) => obj,
        }
    }
}

/// A running fake API server; dropping it stops the server.
///
/// The inspection and seeding methods are synchronous and take effect
/// immediately; they do not go through HTTP, so they are neither recorded
/// nor subject to injected faults.
pub struct FakeKube {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for FakeKube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeKube")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn resource(group: &str, plural: &str) -> &'static ResourceType {
    by_plural(group, plural)
        .unwrap_or_else(|| panic!("FakeKube serves no resource {plural}.{group}"))
}

/// The namespace and name of an object for the seeding methods.
fn object_key(rt: &ResourceType, obj: &Value) -> Result<(Option<String>, String), ApiError> {
    let namespace = if rt.namespaced {
        let ns = meta_str(obj, "namespace");
        if ns.is_empty() {
            return Err(ApiError::bad_request(format!(
                "a {} needs metadata.namespace",
                rt.kind
            )));
        }
        Some(ns.to_owned())
    } else {
        None
    };
    Ok((namespace, meta_str(obj, "name").to_owned()))
}

impl FakeKube {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime.
    ///
    /// # Panics
    /// If the CRDs cannot be loaded (tests/fixtures/crds or deploy/crds
    /// missing) or the port cannot be bound.
    pub async fn start() -> FakeKube {
        // Load the CRDs before serving, so a missing file fails here.
        let _ = store::resource_types();
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("bound address");
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u16(addr.port());
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new()),
            token: format!("fake-kube-{:016x}", hasher.finish()),
        });
        let server = tokio::spawn(server::serve(listener, Arc::clone(&shared)));
        FakeKube {
            shared,
            addr,
            server,
        }
    }

    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bearer token every request must carry.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The API path of a collection (`name: None`) or an object, e.g.
    /// `path(IPAM_GROUP, "ipaddresses", Some("default"), Some("a"))` is
    /// `/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/default/ipaddresses/a`.
    /// `namespace` is ignored for cluster-scoped kinds; `None` for a
    /// namespaced kind gives the all-namespaces path.
    ///
    /// # Panics
    /// If FakeKube does not serve `plural.group`.
    pub fn path(group: &str, plural: &str, namespace: Option<&str>, name: Option<&str>) -> String {
        let rt = resource(group, plural);
        let mut path = format!("/apis/{}/{}", rt.group, rt.version);
        if let (true, Some(ns)) = (rt.namespaced, namespace) {
            path.push_str(&format!("/namespaces/{ns}"));
        }
        path.push('/');
        path.push_str(&rt.plural);
        if let Some(name) = name {
            path.push('/');
            path.push_str(name);
        }
        path
    }

    // -- seeding and inspection ---------------------------------------------

    /// Creates an object as a POST would (server fields set, `status`
    /// dropped for kinds with a status subresource, validated); the kind
    /// comes from `apiVersion`/`kind`, the namespace from
    /// `metadata.namespace`. Returns the stored object.
    ///
    /// # Panics
    /// If the create fails; see [`try_create`](Self::try_create).
    pub fn create(&self, obj: Value) -> Value {
        self.try_create(obj)
            .unwrap_or_else(|e| panic!("FakeKube::create: {e}"))
    }

    /// [`create`](Self::create), returning the API error instead of
    /// panicking.
    pub fn try_create(&self, obj: Value) -> Result<Value, ApiError> {
        let rt = by_object(&obj)?;
        let (namespace, _) = object_key(rt, &obj)?;
        self.shared.lock().create(rt, namespace.as_deref(), obj)
    }

    /// The stored object, if any. `namespace` is ignored for cluster-scoped
    /// kinds.
    ///
    /// # Panics
    /// If FakeKube does not serve `plural.group`.
    pub fn get(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        self.shared
            .lock()
            .get(resource(group, plural), namespace, name)
    }

    /// Overwrites a stored object with `obj`, spec, metadata and status
    /// alike, without a resourceVersion precondition; `uid`,
    /// `creationTimestamp` and `deletionTimestamp` keep their values,
    /// `generation` bumps on a spec change and `resourceVersion` bumps. The
    /// object is validated; if it is being deleted, new finalizers are
    /// refused and removing the last one removes the object. Returns the
    /// stored (or last) state.
    ///
    /// # Panics
    /// If the write fails; see [`try_put`](Self::try_put).
    pub fn put(&self, obj: Value) -> Value {
        self.try_put(obj)
            .unwrap_or_else(|e| panic!("FakeKube::put: {e}"))
    }

    /// [`put`](Self::put), returning the API error (404 if the object does
    /// not exist) instead of panicking.
    pub fn try_put(&self, obj: Value) -> Result<Value, ApiError> {
        let rt = by_object(&obj)?;
        let (namespace, name) = object_key(rt, &obj)?;
        self.shared
            .lock()
            .update(rt, namespace.as_deref(), &name, obj, Write::Direct)
    }

    /// Deletes an object as a DELETE without options would (finalizers
    /// honoured, dependents garbage-collected). `None` if it did not exist.
    ///
    /// # Panics
    /// If FakeKube does not serve `plural.group`.
    pub fn delete(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<DeleteOutcome> {
        self.shared
            .lock()
            .delete(
                resource(group, plural),
                namespace,
                name,
                &DeleteOptions::default(),
            )
            .ok()
    }

    /// Every stored object of a kind, in all namespaces, ordered by
    /// namespace and name.
    ///
    /// # Panics
    /// If FakeKube does not serve `plural.group`.
    pub fn list(&self, group: &str, plural: &str) -> Vec<Value> {
        self.shared.lock().scope(resource(group, plural), None)
    }

    /// Runs a full garbage-collector pass: objects none of whose owners
    /// exist are deleted, dangling owner references of the others removed.
    pub fn collect_garbage(&self) {
        self.shared.lock().collect_garbage();
    }

    /// The latest resourceVersion handed out (0 before any write).
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version()
    }

    // -- recording ----------------------------------------------------------

    /// Every authenticated request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// The requests that could change state (see [`Recorded::is_write`]).
    pub fn writes(&self) -> Vec<Recorded> {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.is_write())
            .cloned()
            .collect()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// Every HTTP write refused because the object failed validation (CRD
    /// schema or metadata), as `"METHOD path: message"`. Such writes were
    /// answered 422.
    pub fn schema_violations(&self) -> Vec<String> {
        self.shared.lock().violations.clone()
    }

    /// Every HTTP write (POST, PUT, PATCH) that did not ask for
    /// `fieldValidation=Strict`, as `"METHOD path: …"`. FakeKube refuses
    /// unknown fields either way; a real API server refuses them only when
    /// asked, and otherwise drops them with nothing but a `Warning` header,
    /// so a client that passes here without asking could lose fields there.
    pub fn lax_writes(&self) -> Vec<String> {
        self.shared.lock().lax_writes.clone()
    }

    // -- fault injection and paging -----------------------------------------

    fn add_fault(&self, method: &str, path_contains: &str, times: usize, status: u16, after: bool) {
        assert!(
            (400..600).contains(&status),
            "an injected fault needs a 4xx or 5xx status, got {status}"
        );
        if times == 0 {
            return;
        }
        self.shared.lock().faults.push(Fault {
            method: method.to_owned(),
            path_contains: path_contains.to_owned(),
            remaining: times,
            status,
            after_apply: after,
        });
    }

    /// Makes the next `times` requests whose method is `method` (`"*"` for
    /// any) and whose path contains `path_contains` fail with `status`
    /// before doing anything. The answer is a `Status` with the reason a
    /// real server gives for that code (409 `Conflict`, 429
    /// `TooManyRequests` with `Retry-After: 1`, 500 `InternalError`, 503
    /// `ServiceUnavailable`, …). Faults are matched in the order they were
    /// added; the failed requests are recorded.
    ///
    /// # Panics
    /// If `status` is not 4xx or 5xx.
    pub fn fail_next(&self, method: &str, path_contains: &str, times: usize, status: u16) {
        self.add_fault(method, path_contains, times, status, false);
    }

    /// Like [`fail_next`](Self::fail_next), but the request is carried out
    /// first and only its response is replaced: the write happened, the
    /// client sees an error (a lost response, a timeout after commit).
    ///
    /// # Panics
    /// If `status` is not 4xx or 5xx.
    pub fn fail_next_after_apply(
        &self,
        method: &str,
        path_contains: &str,
        times: usize,
        status: u16,
    ) {
        self.add_fault(method, path_contains, times, status, true);
    }

    /// Leaves the objects named `namespace/name` (of any kind) out of every
    /// LIST from now on, while GET still finds them: a list taken just
    /// before they were created, as a client racing a creation sees it.
    pub fn hide_from_lists(&self, namespace: &str, name: &str) {
        self.shared
            .lock()
            .hidden
            .push((namespace.to_string(), name.to_string()));
    }

    /// Caps every page of a LIST that has a `limit` at `n` items, whatever
    /// the limit; 0 removes the cap.
    pub fn set_list_page_size(&self, n: usize) {
        self.shared.lock().page_size = (n > 0).then_some(n);
    }

    /// Expires every continue token handed out so far: continuing one now
    /// answers 410 `Expired`, as after an etcd compaction.
    pub fn expire_continue_tokens(&self) {
        self.shared.lock().expire_snapshots();
    }
}
