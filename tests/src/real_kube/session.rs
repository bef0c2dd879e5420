//! [`Session`]: one test's exclusive use of the shared control plane, with
//! FakeKube's seeding and inspection calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use super::audit::{self, SaRequest};
use super::http::{blocking, Reply};
use super::kinds::{self, Kind};
use super::ControlPlane;
use crate::fake_kube::{ApiError, DeleteOutcome, Recorded};

/// How long the wipe at the start of a session may take.
const WIPE_DEADLINE: Duration = Duration::from_secs(60);

/// How long the audit event of a marker may take to appear.
const FENCE_DEADLINE: Duration = Duration::from_secs(10);

/// How often [`Session::put`] retries on a 409 `Conflict` (someone else
/// wrote in between).
const PUT_ATTEMPTS: usize = 10;

/// Exclusive use of the shared [`ControlPlane`] by one test, from
/// [`ControlPlane::session`] until dropped.
///
/// On creation every object of the installed kinds (claims, addresses,
/// pools, network profiles, Clusters, Machines, PacketMachines) is removed
/// in all namespaces — finalizers stripped with a merge patch, deleted,
/// waited for until the lists are empty — and recording starts afresh.
/// Namespaces stay.
///
/// The methods mirror [`FakeKube`](crate::fake_kube::FakeKube)'s, with the
/// same signatures, so a test body can run on either. They are synchronous
/// and go through HTTP as the admin (not recorded: the audit policy logs
/// only the ServiceAccount), and work from plain threads and from inside a
/// tokio runtime (on a multi-thread one they wait in `block_in_place`; on a
/// `current_thread` one they block the thread, which is fine as the server
/// is another process).
///
/// Recording ([`requests`](Self::requests) and friends) reads the API
/// server's audit log behind a fence; see `audit.rs`.
pub struct Session {
    cp: &'static ControlPlane,
    /// The audit log offset where this session began.
    opened_at: u64,
    /// Where [`requests`](Self::requests) starts reading (moved by
    /// [`clear_requests`](Self::clear_requests)).
    requests_from: Mutex<u64>,
    /// Exclusive use: released when the session is dropped.
    _permit: OwnedSemaphorePermit,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("base_url", &self.cp.base_url())
            .finish()
    }
}

/// The error for a failed call, from the API server's `Status`.
fn api_error(reply: &Reply) -> ApiError {
    ApiError {
        code: reply.status,
        reason: reply
            .body
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        message: reply.message(),
        details: reply
            .body
            .get("details")
            .cloned()
            .unwrap_or_else(|| json!({})),
        violation: reply.status == 422,
    }
}

fn bad_request(message: String) -> ApiError {
    ApiError {
        code: 400,
        reason: "BadRequest".to_owned(),
        message,
        details: json!({}),
        violation: false,
    }
}

fn meta<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn resource(group: &str, plural: &str) -> &'static Kind {
    kinds::by_plural(group, plural)
        .unwrap_or_else(|| panic!("real_kube installs no resource {plural}.{group}"))
}

fn kind_of(obj: &Value) -> Result<&'static Kind, ApiError> {
    kinds::by_object(obj).ok_or_else(|| {
        bad_request(format!(
            "real_kube installs no kind {:?} in apiVersion {:?}",
            obj.get("kind").and_then(Value::as_str).unwrap_or(""),
            obj.get("apiVersion").and_then(Value::as_str).unwrap_or("")
        ))
    })
}

/// The namespace (for a namespaced kind) and name of an object to write.
fn object_key(kind: &Kind, obj: &Value) -> Result<(Option<String>, String), ApiError> {
    let namespace = if kind.namespaced {
        match meta(obj, "namespace") {
            Some(ns) if !ns.is_empty() => Some(ns.to_owned()),
            _ => {
                return Err(bad_request(format!(
                    "a {} needs metadata.namespace",
                    kind.kind
                )))
            }
        }
    } else {
        None
    };
    Ok((namespace, meta(obj, "name").unwrap_or("").to_owned()))
}

fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

impl Session {
    pub(super) fn open(cp: &'static ControlPlane, permit: OwnedSemaphorePermit) -> Session {
        // From here on, dropping the session (also by a panic) releases it.
        let mut session = Session {
            cp,
            _permit: permit,
            opened_at: 0,
            requests_from: Mutex::new(0),
        };
        let dead = cp.dead_processes();
        if !dead.is_empty() {
            panic!("real_kube: the control plane is broken:{dead}");
        }
        session.wipe();
        let (_, end) = session.fence(cp.audit_offset());
        session.opened_at = end;
        *session.lock_from() = end;
        session
    }

    fn lock_from(&self) -> std::sync::MutexGuard<'_, u64> {
        self.requests_from.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes every object of every installed kind.
    fn wipe(&self) {
        let started = Instant::now();
        loop {
            let mut left = Vec::new();
            for kind in kinds::kinds() {
                for item in self.list_kind(kind) {
                    let name = meta(&item, "name").unwrap_or("");
                    let path = kind.path(meta(&item, "namespace"), Some(name));
                    left.push(path.clone());
                    if has_finalizers(&item) {
                        let patch = json!({"metadata": {"finalizers": null}});
                        let reply = self.cp.admin("PATCH", &path, Some(&patch));
                        if !(reply.is_success() || reply.status == 404) {
                            panic!(
                                "real_kube: removing the finalizers of {path}: {}",
                                api_error(&reply)
                            );
                        }
                    }
                    if meta(&item, "deletionTimestamp").is_none() {
                        let reply = self.cp.admin("DELETE", &path, None);
                        if !(reply.is_success() || reply.status == 404) {
                            panic!("real_kube: deleting {path}: {}", api_error(&reply));
                        }
                    }
                }
            }
            if left.is_empty() {
                return;
            }
            if started.elapsed() > WIPE_DEADLINE {
                panic!(
                    "real_kube: objects still there {WIPE_DEADLINE:?} into the wipe: {}",
                    left.join(", ")
                );
            }
            blocking(|| std::thread::sleep(Duration::from_millis(20)));
        }
    }

    /// Writes a marker and reads the audit log from `from` up to it (see
    /// `audit.rs`). Returns the ServiceAccount's requests in between and
    /// the offset past the marker.
    fn fence(&self, from: u64) -> (Vec<SaRequest>, u64) {
        static MARKERS: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "audit-marker-{}-{}",
            std::process::id(),
            MARKERS.fetch_add(1, Ordering::Relaxed)
        );
        let reply = self.cp.admin("GET", &audit::marker_path(&name), None);
        if reply.status != 404 {
            panic!(
                "real_kube: the audit marker {name} answered {} {}",
                reply.status,
                reply.message()
            );
        }
        let log = self.cp.audit_log();
        let (requests, end) =
            blocking(|| audit::read_until_marker(log, from, &name, FENCE_DEADLINE))
                .unwrap_or_else(|e| panic!("real_kube: {e}{}", self.cp.dead_processes()));
        self.cp.set_audit_offset(end);
        (requests, end)
    }

    fn list_kind(&self, kind: &Kind) -> Vec<Value> {
        let path = kind.path(None, None);
        let reply = self.cp.admin("GET", &path, None);
        if !reply.is_success() {
            panic!("real_kube: listing {path}: {}", api_error(&reply));
        }
        let mut items = match reply.body.get("items") {
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        };
        items.sort_by(|a, b| {
            let key = |o: &Value| {
                (
                    meta(o, "namespace").unwrap_or("").to_owned(),
                    meta(o, "name").unwrap_or("").to_owned(),
                )
            };
            key(a).cmp(&key(b))
        });
        items
    }

    // -- the server ---------------------------------------------------------

    /// [`ControlPlane::base_url`]: `https://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        self.cp.base_url()
    }

    /// The ServiceAccount's token ([`ControlPlane::sa_token`]), the one to
    /// give the code under test (FakeKube's `token()`).
    pub fn token(&self) -> &str {
        self.cp.sa_token()
    }

    /// [`ControlPlane::ca_file`].
    pub fn ca_file(&self) -> &std::path::Path {
        self.cp.ca_file()
    }

    // -- seeding and inspection ---------------------------------------------

    /// Creates an object (POST as the admin; the kind from
    /// `apiVersion`/`kind`, the namespace from `metadata.namespace`, which
    /// is created first if need be). The server drops `status` for kinds
    /// with a status subresource, as FakeKube does. Returns the stored
    /// object.
    ///
    /// # Panics
    /// If the create fails, with the API server's message.
    pub fn create(&self, obj: Value) -> Value {
        self.try_create(obj)
            .unwrap_or_else(|e| panic!("real_kube Session::create: {e}"))
    }

    /// [`create`](Self::create), returning the API error instead of
    /// panicking.
    pub fn try_create(&self, obj: Value) -> Result<Value, ApiError> {
        let kind = kind_of(&obj)?;
        let (namespace, _) = object_key(kind, &obj)?;
        if let Some(ns) = &namespace {
            self.cp.ensure_namespace(ns);
        }
        let reply = self
            .cp
            .admin("POST", &kind.path(namespace.as_deref(), None), Some(&obj));
        if reply.is_success() {
            Ok(reply.body)
        } else {
            Err(api_error(&reply))
        }
    }

    /// The stored object, if any. `namespace` is ignored for cluster-scoped
    /// kinds.
    ///
    /// # Panics
    /// If `plural.group` is not an installed kind, or the GET fails other
    /// than with 404.
    pub fn get(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let path = resource(group, plural).path(namespace, Some(name));
        let reply = self.cp.admin("GET", &path, None);
        match reply.status {
            200 => Some(reply.body),
            404 => None,
            _ => panic!("real_kube: GET {path}: {}", api_error(&reply)),
        }
    }

    /// Overwrites a stored object with `obj`, spec, metadata and status
    /// alike, without a resourceVersion precondition, as FakeKube's `put`:
    /// GETs the current resourceVersion, PUTs the object with it, and for a
    /// kind with a status subresource PUTs `obj`'s `status` to `/status`
    /// (no `status` in `obj` clears it); a 409 `Conflict` (a write in
    /// between) starts over. If the object is being deleted and the PUT
    /// leaves no finalizers, the server removes it and its last state is
    /// returned. Returns the stored state.
    ///
    /// # Panics
    /// If the write fails; see [`try_put`](Self::try_put).
    pub fn put(&self, obj: Value) -> Value {
        self.try_put(obj)
            .unwrap_or_else(|e| panic!("real_kube Session::put: {e}"))
    }

    /// [`put`](Self::put), returning the API error (404 if the object does
    /// not exist) instead of panicking.
    pub fn try_put(&self, obj: Value) -> Result<Value, ApiError> {
        let kind = kind_of(&obj)?;
        let (namespace, name) = object_key(kind, &obj)?;
        let path = kind.path(namespace.as_deref(), Some(&name));
        let mut last = None;
        for _ in 0..PUT_ATTEMPTS {
            let current = self.cp.admin("GET", &path, None);
            if !current.is_success() {
                return Err(api_error(&current));
            }
            let mut body = obj.clone();
            body["metadata"]["resourceVersion"] =
                current.body["metadata"]["resourceVersion"].clone();
            let reply = self.cp.admin("PUT", &path, Some(&body));
            if reply.status == 409 {
                last = Some(api_error(&reply));
                continue;
            }
            if !reply.is_success() {
                return Err(api_error(&reply));
            }
            if !kind.status {
                return Ok(reply.body);
            }
            let stored = reply.body;
            let mut with_status = stored.clone();
            match (with_status.as_object_mut(), obj.get("status")) {
                (Some(o), Some(status)) => {
                    o.insert("status".to_owned(), status.clone());
                }
                (Some(o), None) => {
                    o.remove("status");
                }
                (None, _) => return Ok(stored),
            }
            if with_status == stored {
                return Ok(stored);
            }
            let reply = self
                .cp
                .admin("PUT", &format!("{path}/status"), Some(&with_status));
            match reply.status {
                409 => last = Some(api_error(&reply)),
                // The PUT removed the last finalizer of a deleting object.
                404 => return Ok(stored),
                _ if reply.is_success() => return Ok(reply.body),
                _ => return Err(api_error(&reply)),
            }
        }
        Err(last.expect("a conflict was seen"))
    }

    /// Deletes an object as a DELETE without options (finalizers honoured;
    /// dependents go when the garbage collector gets to them, which is
    /// asynchronous). `None` if it did not exist. `Finalizing` if the
    /// answer still has finalizers (it stays, with `deletionTimestamp`);
    /// `Removed` holds the state read just before the DELETE.
    ///
    /// # Panics
    /// If `plural.group` is not an installed kind, or the DELETE fails other
    /// than with 404.
    pub fn delete(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<DeleteOutcome> {
        let path = resource(group, plural).path(namespace, Some(name));
        self.try_delete(group, plural, namespace, name)
            .unwrap_or_else(|e| panic!("real_kube: DELETE {path}: {e}"))
    }

    /// [`delete`](Self::delete), returning the API error (an admission
    /// webhook's denial, say) instead of panicking.
    ///
    /// # Panics
    /// If `plural.group` is not an installed kind.
    pub fn try_delete(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DeleteOutcome>, ApiError> {
        // A custom resource removed at once is answered with a `Status`
        // (`Success`), not its last state as FakeKube returns it: that comes
        // from a GET just before.
        let Some(last) = self.get(group, plural, namespace, name) else {
            return Ok(None);
        };
        let path = resource(group, plural).path(namespace, Some(name));
        let reply = self.cp.admin("DELETE", &path, None);
        match reply.status {
            404 => Ok(None),
            _ if reply.is_success() => Ok(Some(if has_finalizers(&reply.body) {
                DeleteOutcome::Finalizing(reply.body)
            } else if reply.body.get("kind").and_then(Value::as_str) == Some("Status") {
                DeleteOutcome::Removed(last)
            } else {
                DeleteOutcome::Removed(reply.body)
            })),
            _ => Err(api_error(&reply)),
        }
    }

    /// Every object of a kind, in all namespaces, ordered by namespace and
    /// name.
    ///
    /// # Panics
    /// If `plural.group` is not an installed kind, or the LIST fails.
    pub fn list(&self, group: &str, plural: &str) -> Vec<Value> {
        self.list_kind(resource(group, plural))
    }

    // -- recording ----------------------------------------------------------

    /// Every request of the ServiceAccount since the session began or
    /// [`clear_requests`](Self::clear_requests), in the order the API server
    /// completed them, as FakeKube records them: method from the audit verb,
    /// path and query from the request URI, body from the logged request
    /// object (none for a request refused before its body was read, such as
    /// a 403), status from the response, `content_type` always `None`.
    ///
    /// # Panics
    /// If the audit log cannot be read or the fence's marker does not
    /// appear within 10 s.
    pub fn requests(&self) -> Vec<Recorded> {
        let from = *self.lock_from();
        self.fence(from).0.into_iter().map(|r| r.recorded).collect()
    }

    /// The requests that could change state (see [`Recorded::is_write`]).
    pub fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect()
    }

    /// Forgets the recorded requests: [`requests`](Self::requests) starts
    /// after everything the ServiceAccount did until now.
    pub fn clear_requests(&self) {
        let from = *self.lock_from();
        let (_, end) = self.fence(from);
        *self.lock_from() = end;
    }

    /// The ServiceAccount's writes answered 422 (schema, CEL rule or
    /// metadata validation) since the session began, as
    /// `"METHOD path: message"`. Not reset by
    /// [`clear_requests`](Self::clear_requests), as in FakeKube.
    pub fn schema_violations(&self) -> Vec<String> {
        self.fence(self.opened_at)
            .0
            .iter()
            .filter(|r| r.recorded.status == 422 && r.recorded.is_write())
            .map(SaRequest::describe)
            .collect()
    }

    /// The ServiceAccount's requests answered 403 (RBAC) since the session
    /// began, as `"METHOD path: message"`: a permission deploy/rbac.yaml
    /// lacks.
    pub fn forbidden(&self) -> Vec<String> {
        self.fence(self.opened_at)
            .0
            .iter()
            .filter(|r| r.recorded.status == 403)
            .map(SaRequest::describe)
            .collect()
    }
}
