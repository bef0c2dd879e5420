//! The validating admission webhook for the pool kinds
//! (`POST /v1/admission/pools`) and network profiles
//! (`POST /v1/admission/network-profiles`; rules in `profile.rs`:
//! the profile's per-port rules, a VLAN named by pool must be a
//! VRF-backed pool's in the profile's metro, and a profile Machines use is
//! not deleted).
//!
//! Kubernetes sends an `AdmissionReview` (`admission.k8s.io/v1`) for every
//! create, update and delete of a `MetalIPPool` or `GlobalMetalIPPool`;
//! [`review()`] answers it from the pools registered in the key-value store
//! (through [`PoolLookup`]), so a bad pool is refused by `kubectl apply`
//! instead of failing later in the events route.
//!
//! The `AdmissionReview` envelope (reading, request fields, the response)
//! is [`mod@review`], shared with the webhooks to come; this module holds the
//! pool rules.
//!
//! # Rules
//! Requests whose `request.kind` is not `MetalIPPool` or `GlobalMetalIPPool`
//! of group `ipam.metal-ipam.dev` are allowed without checks, as are
//! operations other than `CREATE`, `UPDATE` and `DELETE`. Dry-run requests
//! (`request.dryRun`) are checked exactly like the others (the webhook has no
//! side effects). Otherwise:
//!
//! **CREATE and UPDATE**
//! 1. An `UPDATE` whose `spec` equals the old object's `spec` is allowed
//!    without further checks: label, annotation, finalizer and owner changes
//!    (including adding the skip annotation below) are never blocked.
//! 2. The object must be a valid pool, by the same rules as
//!    `PUT /v1/pools/…` ([`PoolObject::parse`] with the id from
//!    `request.name` / `request.namespace`, or the object's metadata when
//!    those are empty, then [`crate::ipam::pool::PoolSpec::validate`], which
//!    for a VRF-backed pool checks `spec.metal` and takes the addresses of a
//!    block to be created). Denied with code 422, the reason of the error
//!    (`Invalid`) and `field: message`. A VRF-backed pool whose addresses
//!    are those of an adopted reservation is allowed with a warning after
//!    this rule: its block is known only once it is read from Metal.
//! 3. If the store already holds this pool, the new spec must keep every
//!    bound address, as [`crate::ipam::ops::put_pool`] requires
//!    ([`crate::ipam::alloc::PoolState::dropped_by`]). Denied with 422
//!    `AllocatedAddressesDropped` naming up to ten of them.
//!
//!    On `UPDATE` of a VRF-backed pool whose Metal provisioning has started
//!    (its progress record, of this object's uid, holds a resource or a
//!    creation in progress), `spec.metal` may change only in the sections
//!    of resources not yet created or adopted: a held resource's section
//!    (its deletion policy included: decided once) and the metro are what
//!    it was made from, and removing `spec.metal` would orphan the
//!    resources. Denied with 422 `MetalSpecChanged` naming the first
//!    changed field (this rule runs before rule 2's early answer for an
//!    adopted reservation). The provision step refuses the same change when
//!    the webhook is bypassed.
//!    (Rule 2 also refuses deletion policies Metal cannot carry out: a
//!    retained gateway with a reservation or VLAN to delete, a retained
//!    reservation with a VRF to delete, naming the retained resource's
//!    `deletionPolicy`.)
//! 4. **No unsafe overlap.** Two pools overlap unsafely when both could hand
//!    the same address to claims of the same namespace: they are of the same
//!    family and their allocatable sets
//!    ([`crate::ipam::pool::ValidatedPool::allocatable`]: addresses − exclusions −
//!    reserved addresses) intersect, and
//!    - both are `MetalIPPool`s of the same namespace, or
//!    - either is a `GlobalMetalIPPool` (it serves every namespace).
//!
//!    Two `MetalIPPool`s of different namespaces may share addresses (each
//!    serves only its namespace, e.g. separate networks); the response then
//!    carries a warning. So does a pool that hands out the gateway of a pool
//!    it would otherwise overlap with (at most three warnings are listed). An IPv4 and an IPv6 pool never overlap, and a pool
//!    never conflicts with its own stored version (same kind, namespace and
//!    name). Denied with 422 `PoolOverlap`, naming the other pool and one
//!    shared address.
//!
//! **DELETE**
//! 5. A pool with bound addresses (`status.ipAddresses.used + outOfRange >
//!    0`) cannot be deleted: denied with 403 `PoolInUse`, unless the old
//!    object carries the annotation [`SKIP_DELETE_VALIDATION_ANNOTATION`]
//!    (any value). That is the escape hatch for `clusterctl move`, which
//!    deletes the pools from the source cluster after re-creating them in
//!    the target (the in-cluster provider has the same annotation in its own
//!    group). A pool the store does not know is deleted freely.
//! 6. A VRF-backed pool whose VLAN a `MetalNetworkProfile` still puts on
//!    machines (a VLAN named by the pool, resolved in the profile's
//!    namespace as the network step does, or by the VLAN's id) cannot be
//!    deleted: denied with 403 `PoolVlanInUse` naming the profiles, unless
//!    the skip annotation is set. This needs the API server
//!    ([`ProfileLookup`], given to [`evaluate_with`]); without one the
//!    deletion is allowed with a warning, and the provision step's teardown
//!    waits for the profiles anyway.
//!
//! # Response
//! `{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
//! "response": {"uid": <request.uid>, "allowed": …}}`, plus, when denied,
//! `"status": {"status": "Failure", "code": 403|422, "reason": …,
//! "message": …, "details": {"causes": [{"field", "message"}]}}` (causes only
//! when a field is known), and `"warnings": […]` when there are any.

mod profile;
pub mod review;

pub use profile::{MachineLookup, NoMachines};
pub use review::{Denial, REVIEW_API_VERSION};

use std::net::IpAddr;

use serde_json::{Map, Value};

use crate::error::{Error, Known, Result};
use crate::ip::from_u128;
use crate::ipam::index::{self, Held};
use crate::ipam::ops;
use crate::ipam::pool::{self, PoolId, PoolKind, PoolObject};
use crate::ipam::store::{self, Loaded};
use crate::ipam::vrf::Resource;
use crate::kube::names;
use crate::kube::Kube;
use crate::kv::keys;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::provision::plan::{owner, Owner, Progress};
use crate::provision::record::read_state;

/// Annotation that lets a pool with bound addresses be deleted (for
/// `clusterctl move`).
pub const SKIP_DELETE_VALIDATION_ANNOTATION: &str =
    "ipam.metal-ipam.dev/skip-validate-delete-webhook";
/// At most this many overlap warnings are listed in one response.
const MAX_WARNINGS: usize = 3;
/// At most this many dropped addresses are named in a denial.
const MAX_DROPPED_LISTED: usize = 10;

/// A read-only view of the registered pools.
pub trait PoolLookup {
    /// The pool `id`, or `None` if it is not registered (or deleted).
    ///
    /// # Errors
    /// Store failures (503) or unreadable records (500).
    fn get(&self, id: &PoolId) -> Result<Option<Loaded>>;

    /// Every registered pool, in any order.
    ///
    /// # Errors
    /// Store failures (503) or unreadable records (500).
    fn all(&self) -> Result<Vec<Loaded>>;

    /// The Metal progress record of pool `id` as stored (a tombstone
    /// included), for the `spec.metal` rule on `UPDATE`; `None` when there
    /// is none (or the lookup has no store).
    ///
    /// # Errors
    /// Store failures (503) or unreadable records (500).
    fn metal_progress(&self, _id: &PoolId) -> Result<Option<Progress>> {
        Ok(None)
    }

    /// The pool objects the API server holds, of every pool kind (those
    /// not registered in the store yet included: two pools applied at once
    /// are both there before either is registered); empty when the lookup
    /// has no API server.
    ///
    /// # Errors
    /// The API server's errors.
    fn api_pools(&self) -> Result<Vec<PoolObject>> {
        Ok(Vec::new())
    }

    /// A registration in flight in the store's pool index that `held`
    /// would overlap within `id`'s address space: the other pool and one
    /// shared address; `None` when the lookup has no store.
    ///
    /// # Errors
    /// Store failures (503) or an unreadable index (500).
    fn pending_conflict(&self, _id: &PoolId, _held: &Held) -> Result<Option<(PoolId, IpAddr)>> {
        Ok(None)
    }
}

/// Who puts a VRF-backed pool's VLAN on machines (rule 6): an API server
/// view the webhook is given when it can read `MetalNetworkProfile`s.
pub trait ProfileLookup {
    /// The profiles (`namespace/name`, sorted) that use pool `id`'s VLAN.
    ///
    /// # Errors
    /// The API server's and the store's errors.
    fn vlan_users(&self, id: &PoolId) -> Result<Vec<String>>;
}

/// The webhook's view of the profiles (rule 6 of [`crate::admission`]):
/// the pool's recorded VLAN from the store, the profiles from the API
/// server ([`crate::capi::vrf::vlan_users`]).
pub struct KubeProfiles<'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The store (the progress record).
    pub kv: &'a K,
    /// The API server.
    pub kube: &'a Kube<'a, H>,
}

impl<K: KvStore, H: HttpClient + ?Sized> ProfileLookup for KubeProfiles<'_, K, H> {
    fn vlan_users(&self, id: &PoolId) -> Result<Vec<String>> {
        let p = read_state(self.kv, id)?.filter(|p| !p.deleted);
        let vlan = p
            .as_ref()
            .and_then(|p| p.vlan.as_ref())
            .map(|h| h.id.clone());
        crate::capi::vrf::vlan_users(self.kube, id, vlan.as_deref())
    }
}

/// A fixed set of pools (tests, snapshots).
impl PoolLookup for Vec<Loaded> {
    fn get(&self, id: &PoolId) -> Result<Option<Loaded>> {
        Ok(self.iter().find(|l| &l.object.id == id).cloned())
    }

    fn all(&self) -> Result<Vec<Loaded>> {
        Ok(self.clone())
    }
}

/// The pools registered in a key-value store: `get` is one `get`, `all`
/// reads the pool index and each pool it lists (1 + P `get`s for P pools
/// alive: never a listing of the store; a pool whose record does not load
/// is left out).
#[derive(Debug, Clone, Copy)]
pub struct KvPools<'a, K: KvStore>(pub &'a K);

impl<K: KvStore> PoolLookup for KvPools<'_, K> {
    fn get(&self, id: &PoolId) -> Result<Option<Loaded>> {
        store::read_pool(self.0, id)
    }

    fn all(&self) -> Result<Vec<Loaded>> {
        let mut out = Vec::new();
        let ids = match index::read(self.0)? {
            Some(i) => i.ids(),
            // A store written before the pool index (every registration
            // creates it): read-only here, so its keys are listed.
            None => self
                .0
                .list_keys()?
                .iter()
                .filter_map(|k| keys::parse_pool::<PoolId>(k))
                .collect(),
        };
        for id in ids {
            if let ops::Found::Live(l) = ops::find_pool(self.0, &id)? {
                out.push(*l);
            }
        }
        Ok(out)
    }

    fn metal_progress(&self, id: &PoolId) -> Result<Option<Progress>> {
        read_state(self.0, id)
    }

    fn pending_conflict(&self, id: &PoolId, held: &Held) -> Result<Option<(PoolId, IpAddr)>> {
        let Some(idx) = index::read(self.0)? else {
            return Ok(None);
        };
        Ok(idx
            .conflict(id, held)?
            .map(|(other, first, _)| (other, first)))
    }
}

/// The pools of the store ([`KvPools`]) and of the API server: what the
/// webhook checks a pool against, so two pools applied together (both in
/// the API server, neither in the store yet) or a store that lost its
/// pools still see each other.
pub struct KubePools<'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The store.
    pub kv: &'a K,
    /// The API server.
    pub kube: &'a Kube<'a, H>,
}

impl<K: KvStore, H: HttpClient + ?Sized> PoolLookup for KubePools<'_, K, H> {
    fn get(&self, id: &PoolId) -> Result<Option<Loaded>> {
        KvPools(self.kv).get(id)
    }

    fn all(&self) -> Result<Vec<Loaded>> {
        KvPools(self.kv).all()
    }

    fn metal_progress(&self, id: &PoolId) -> Result<Option<Progress>> {
        KvPools(self.kv).metal_progress(id)
    }

    fn api_pools(&self) -> Result<Vec<PoolObject>> {
        let mut out = Vec::new();
        for kind in PoolKind::ALL {
            for v in self.kube.list(kind.resource(), None)? {
                let meta = v.get("metadata");
                let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str);
                let ns = meta
                    .and_then(|m| m.get("namespace"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let Some(name) = name.filter(|n| !n.is_empty()) else {
                    continue;
                };
                // An object that does not parse is its own webhook's
                // business (it was admitted before this rule, or bypassed
                // it): it cannot hand out addresses either.
                if let Ok(o) = PoolObject::parse(&PoolId::of(kind, ns, name), &v) {
                    out.push(o);
                }
            }
        }
        Ok(out)
    }

    fn pending_conflict(&self, id: &PoolId, held: &Held) -> Result<Option<(PoolId, IpAddr)>> {
        KvPools(self.kv).pending_conflict(id, held)
    }
}

/// The decision on one review, with what a log line needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Reviewed {
    /// `request.uid`, echoed in the response.
    pub uid: String,
    /// `request.operation`: `CREATE`, `UPDATE`, `DELETE`, `CONNECT`.
    pub operation: String,
    /// The pool reviewed; `None` for other kinds or an unidentifiable object.
    pub pool: Option<PoolId>,
    /// `request.dryRun` (checked the same way).
    pub dry_run: bool,
    /// `None` when allowed.
    pub denial: Option<Denial>,
    /// `response.warnings`.
    pub warnings: Vec<String>,
    /// For logs: `allowed`, `denied`, `ignored` (not our kind or operation),
    /// `spec-unchanged` (rule 1) or `skip-annotation` (rule 5).
    pub outcome: &'static str,
}

impl Reviewed {
    /// Whether the request is allowed.
    pub fn allowed(&self) -> bool {
        self.denial.is_none()
    }

    /// The `AdmissionReview` response.
    pub fn to_json(&self) -> Value {
        review::response(&self.uid, self.denial.as_ref(), &self.warnings)
    }

    fn deny(&mut self, d: Denial) {
        self.denial = Some(d);
        self.outcome = "denied";
    }
}

/// Answers an `AdmissionReview` body: the response JSON (see the module
/// docs for the rules).
///
/// # Errors
/// 400 `MalformedRequest` for a body that is not an `admission.k8s.io/v1`
/// `AdmissionReview` with `request.uid`, `request.kind` and
/// `request.operation` (and, for a pool, `request.object` on CREATE/UPDATE,
/// the name and a `MetalIPPool`'s namespace on DELETE);
/// the lookup's errors (503, 500). Kubernetes then applies the webhook's
/// `failurePolicy`.
///
/// # Examples
/// ```
/// use metal_ipam_core::admission::review;
/// use metal_ipam_core::ipam::store::Loaded;
/// let body = serde_json::json!({
///     "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
///     "request": {"uid": "705ab4f5", "operation": "CREATE", "namespace": "team-a", "name": "nodes",
///         "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": "MetalIPPool"},
///         "object": {"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
///             "metadata": {"name": "nodes", "namespace": "team-a"},
///             "spec": {"addresses": ["10.0.0.0/24"], "prefix": 33}}}});
/// let no_pools: Vec<Loaded> = Vec::new();
/// let resp = review(body.to_string().as_bytes(), &no_pools).unwrap();
/// assert_eq!(resp["response"]["uid"], "705ab4f5");
/// assert_eq!(resp["response"]["allowed"], false);
/// assert_eq!(resp["response"]["status"]["code"], 422);
/// assert_eq!(resp["response"]["status"]["message"], "spec.prefix: must be at most 32 for IPv4");
/// ```
pub fn review(body: &[u8], pools: &dyn PoolLookup) -> Result<Value> {
    evaluate(body, pools).map(|r| r.to_json())
}

/// Like [`review()`], but returns the decision itself (for logging). A
/// profile's deletion cannot be checked here (no Machines to look up: the
/// review fails); [`evaluate_with`] can.
///
/// # Errors
/// As [`review()`].
pub fn evaluate(body: &[u8], pools: &dyn PoolLookup) -> Result<Reviewed> {
    evaluate_with(body, pools, &NoMachines, None)
}

/// [`evaluate`], with the Machines a profile's deletion is checked against
/// and a view of the network profiles for rule 6 (`None`: not checked,
/// allowed with a warning).
///
/// # Errors
/// As [`review()`]; the machine and profile lookups' errors.
pub fn evaluate_with(
    body: &[u8],
    pools: &dyn PoolLookup,
    machines: &dyn MachineLookup,
    profiles: Option<&dyn ProfileLookup>,
) -> Result<Reviewed> {
    let v = review::read(body)?;
    let request = review::Request::parse(&v)?;
    let (req, uid, operation, kind) =
        (request.fields, request.uid, request.operation, request.kind);
    let mut out = Reviewed {
        uid: uid.to_string(),
        operation: operation.to_string(),
        pool: None,
        dry_run: request.dry_run,
        denial: None,
        warnings: Vec::new(),
        outcome: "ignored",
    };
    if kind.group == pool::GROUP && kind.kind == crate::network::profile::KIND {
        match operation {
            "CREATE" | "UPDATE" => profile::check_write(req, pools, &mut out)?,
            "DELETE" => profile::check_delete(req, machines, &mut out)?,
            _ => {}
        }
        return Ok(out);
    }
    // Our kinds only: the in-cluster provider's pools have its webhook.
    let pool_kind = PoolKind::of_group(kind.group, kind.kind).filter(|k| !k.is_in_cluster());
    let Some(pool_kind) = pool_kind else {
        return Ok(out);
    };
    match operation {
        "CREATE" | "UPDATE" => check_write(pool_kind, req, pools, &mut out)?,
        "DELETE" => check_delete(pool_kind, req, pools, profiles, &mut out)?,
        _ => {}
    }
    Ok(out)
}

fn nonempty<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    m.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Why [`pool_id`] found no id.
enum NoId {
    /// The name (or a namespaced pool's namespace) is given nowhere; the
    /// field path (`metadata.name` or `metadata.namespace`).
    Missing(&'static str),
    /// It is given but not a valid Kubernetes name (422, with field).
    Invalid(Error),
}

impl NoId {
    fn into_error(self) -> Error {
        match self {
            NoId::Missing(field) => Error::invalid(field, "is required"),
            NoId::Invalid(e) => e,
        }
    }
}

/// The id from `request.name`/`request.namespace`, or else the object's
/// metadata.
fn pool_id(
    kind: PoolKind,
    req: &Map<String, Value>,
    meta: Option<&Map<String, Value>>,
) -> std::result::Result<PoolId, NoId> {
    let name = nonempty(req, "name")
        .or_else(|| meta.and_then(|m| nonempty(m, "name")))
        .ok_or(NoId::Missing("metadata.name"))?;
    names::check_subdomain(name).map_err(|m| NoId::Invalid(Error::invalid("metadata.name", m)))?;
    if kind.is_global() {
        return Ok(PoolId::of(kind, "", name));
    }
    let ns = nonempty(req, "namespace")
        .or_else(|| meta.and_then(|m| nonempty(m, "namespace")))
        .ok_or(NoId::Missing("metadata.namespace"))?;
    names::check_label(ns).map_err(|m| NoId::Invalid(Error::invalid("metadata.namespace", m)))?;
    Ok(PoolId::of(kind, ns, name))
}

fn describe(id: &PoolId) -> String {
    match &id.namespace {
        Some(ns) => format!("{} {ns}/{}", id.kind.kind_name(), id.name),
        None => format!("{} {}", id.kind.kind_name(), id.name),
    }
}

/// `request.object`, which a write must carry.
///
/// # Errors
/// 400 (naming `request.object`) when it is missing or not an object.
fn request_object<'r>(req: &'r Map<String, Value>, operation: &str) -> Result<&'r Value> {
    req.get("object").filter(|o| o.is_object()).ok_or_else(|| {
        Error::malformed(format!("request.object is required for {operation}"))
            .with_field("request.object")
    })
}

/// Rules 1–4 on a `CREATE` or `UPDATE`: the object names a pool, its spec
/// parses and validates, an update keeps its Metal resources' spec and
/// its allocated addresses, and it overlaps no pool it could share
/// addresses with (other overlaps and gateway clashes are warnings).
fn check_write(
    kind: PoolKind,
    req: &Map<String, Value>,
    pools: &dyn PoolLookup,
    out: &mut Reviewed,
) -> Result<()> {
    let object = request_object(req, &out.operation)?;
    let meta = object.get("metadata").and_then(Value::as_object);
    let id = match pool_id(kind, req, meta) {
        Ok(id) => id,
        Err(e) => {
            out.deny(Denial::from_error(422, &e.into_error()));
            return Ok(());
        }
    };
    out.pool = Some(id.clone());
    if out.operation == "UPDATE" && spec_unchanged(req, object) {
        out.outcome = "spec-unchanged";
        return Ok(());
    }
    let object_parsed = match PoolObject::parse(&id, object) {
        Ok(o) => o,
        Err(e) => {
            out.deny(Denial::from_error(422, &e));
            return Ok(());
        }
    };
    if out.operation == "UPDATE" {
        let uid = meta.and_then(|m| nonempty(m, "uid"));
        if let Some(d) = metal_change(&object_parsed, uid, pools.metal_progress(&id)?) {
            out.deny(d);
            return Ok(());
        }
    }
    let pool = match object_parsed.spec.validate() {
        Ok(p) => p,
        Err(e) if e.is(Known::MetalBlockUnknown) => {
            // The Metal section is valid; the addresses are those of an
            // adopted reservation, checked when it is read from Metal.
            out.warnings = vec![format!(
                "{}: its addresses are checked against the other pools once its Metal reservation is read",
                describe(&id)
            )];
            out.outcome = "allowed";
            return Ok(());
        }
        Err(e) => {
            out.deny(Denial::from_error(422, &e));
            return Ok(());
        }
    };
    let verdict = match dropped_addresses(&id, &pool, pools)? {
        Some(d) => Err(d),
        None => others(pools).and_then(|o| match overlaps(&id, &pool, o) {
            Ok(w) => Ok(pending(&id, &pool, pools)?.map_or(Ok(w), Err)),
            Err(d) => Ok(Err(d)),
        })?,
    };
    match verdict {
        Ok(warnings) => {
            out.warnings = warnings;
            out.outcome = "allowed";
        }
        Err(d) => out.deny(d),
    }
    Ok(())
}

/// Whether an `UPDATE` leaves `spec` as it was (an `oldObject` with the
/// same `spec`, both present).
fn spec_unchanged(req: &Map<String, Value>, object: &Value) -> bool {
    let old_spec = req
        .get("oldObject")
        .filter(|o| o.is_object())
        .map(|o| o.get("spec"));
    old_spec.is_some_and(|s| s.is_some() && s == object.get("spec"))
}

/// Rule 3: the denial of a change that drops addresses the registered
/// pool `id` has allocated, if any.
///
/// # Errors
/// The lookup's.
fn dropped_addresses(
    id: &PoolId,
    pool: &pool::ValidatedPool,
    pools: &dyn PoolLookup,
) -> Result<Option<Denial>> {
    let Some(stored) = pools.get(id)? else {
        return Ok(None);
    };
    let (dropped, n) = stored
        .state
        .dropped_by(&stored.pool, pool, MAX_DROPPED_LISTED);
    if n == 0 {
        return Ok(None);
    }
    let list: Vec<String> = dropped
        .iter()
        .map(|&a| stored.pool.ip(a).to_string())
        .collect();
    Ok(Some(Denial {
        code: 422,
        reason: "AllocatedAddressesDropped",
        message: format!(
            "spec: the change would drop {n} allocated address(es) from {}: {}{}; delete their IPAddressClaims first",
            describe(id),
            list.join(", "),
            if n > list.len() as u128 { ", …" } else { "" }
        ),
        field: Some("spec".into()),
    }))
}

/// Every other pool rule 4 compares with: the store's, then the API
/// server's that the store does not hold (their spec as the API server has
/// it; a VRF-backed pool whose block is not known yet is left out: its
/// addresses are checked when it registers).
///
/// # Errors
/// The lookup's.
fn others(pools: &dyn PoolLookup) -> Result<Vec<Loaded>> {
    let mut out = pools.all()?;
    for o in pools.api_pools()? {
        if out.iter().any(|l| l.object.id == o.id) {
            continue;
        }
        if let Ok(pool) = o.spec.validate() {
            out.push(Loaded {
                object: o,
                pool,
                state: crate::ipam::alloc::PoolState::default(),
                rev: 0,
                exact: false,
            });
        }
    }
    Ok(out)
}

/// Rule 4 against registrations in flight (the store's pool index): the
/// denial, if any.
///
/// # Errors
/// The lookup's.
fn pending(
    id: &PoolId,
    pool: &pool::ValidatedPool,
    pools: &dyn PoolLookup,
) -> Result<Option<Denial>> {
    let held = Held {
        family: pool.family,
        set: pool.addresses_of(&pool.allocatable),
    };
    Ok(pools.pending_conflict(id, &held)?.map(|(other, first)| Denial {
        code: 422,
        reason: "PoolOverlap",
        message: format!(
            "{}: {} would share {first} with {}, which the store's pool index holds for it (registered, or being registered); both could hand out the same address",
            list_field(id),
            describe(id),
            describe(&other)
        ),
        field: Some(list_field(id).into()),
    }))
}

/// Rule 4 against every other pool of the family, in id order: the first
/// overlap with a pool that can serve the same namespace denies; the
/// others' overlaps and gateway clashes are warnings (at most
/// `MAX_WARNINGS`, then a count).
fn overlaps(
    id: &PoolId,
    pool: &pool::ValidatedPool,
    mut others: Vec<Loaded>,
) -> std::result::Result<Vec<String>, Denial> {
    others.sort_by(|a, b| a.object.id.cmp(&b.object.id));
    let mut warnings = Vec::new();
    for other in &others {
        let oid = &other.object.id;
        if oid == id || other.pool.family != pool.family {
            continue;
        }
        let why = same_scope(id, oid);
        // In addresses: either pool may hand out sub-prefixes; what the
        // other holds outside its spec counts too.
        let shared = pool
            .addresses_of(&pool.allocatable)
            .intersection(&index::held_by(other).set);
        let Some(first) = shared.first() else {
            if why.is_some() {
                // Not an overlap, but a likely mistake: one pool hands out
                // the other's gateway.
                warnings.extend(gateway_clashes(pool, other));
            }
            continue;
        };
        let more = match shared.len() - 1 {
            0 => String::new(),
            1 => " and 1 more address".to_string(),
            n => format!(" and {n} more addresses"),
        };
        match why {
            Some(why) => {
                return Err(Denial {
                    code: 422,
                    reason: "PoolOverlap",
                    message: format!(
                        "{}: {} would share {}{more} with {why}; both could hand out the same address",
                        list_field(id),
                        describe(id),
                        from_u128(pool.family, first)
                    ),
                    field: Some(list_field(id).into()),
                });
            }
            None => warnings.push(format!(
                "shares {}{more} with {} of another namespace: safe only on separate networks",
                from_u128(pool.family, first),
                describe(oid)
            )),
        }
    }
    if warnings.len() > MAX_WARNINGS {
        let n = warnings.len() - MAX_WARNINGS;
        warnings.truncate(MAX_WARNINGS);
        warnings.push(format!("and {n} more warning(s) about other pools"));
    }
    Ok(warnings)
}

/// Why pools `id` and `oid` can hand out addresses to the same namespace
/// (a phrase naming `oid`), or `None` when they cannot.
fn same_scope(id: &PoolId, oid: &PoolId) -> Option<String> {
    if oid.kind.is_global() {
        Some(format!("{}, which serves every namespace", describe(oid)))
    } else if id.kind.is_global() {
        Some(format!(
            "{} (a {} serves every namespace)",
            describe(oid),
            id.kind.kind_name()
        ))
    } else if oid.namespace == id.namespace {
        Some(format!("{} of the same namespace", describe(oid)))
    } else {
        None
    }
}

/// The spec field listing a pool's addresses: `spec.prefixes` for a
/// prefix pool.
fn list_field(id: &PoolId) -> &'static str {
    if id.kind.is_prefix() {
        "spec.prefixes"
    } else {
        "spec.addresses"
    }
}

/// Whether `pool` hands out `g` (in an address or a sub-prefix).
fn hands_out(pool: &pool::ValidatedPool, g: IpAddr) -> bool {
    pool.value_containing(g)
        .is_some_and(|v| pool.allocatable.contains(v))
}

/// The warnings for `pool` handing out `other`'s gateway and the reverse.
fn gateway_clashes(pool: &pool::ValidatedPool, other: &Loaded) -> Vec<String> {
    let oid = &other.object.id;
    let mut warnings = Vec::new();
    let theirs = other.pool.gateway.filter(|g| hands_out(pool, *g));
    let ours = pool.gateway.filter(|g| hands_out(&other.pool, *g));
    if let Some(g) = theirs {
        warnings.push(format!("hands out {g}, the gateway of {}", describe(oid)));
    }
    if let Some(g) = ours {
        warnings.push(format!(
            "its gateway {g} is handed out by {}",
            describe(oid)
        ));
    }
    warnings
}

/// Rule 3's `spec.metal` part: the denial of a change the provisioned
/// resources cannot follow, if any. `progress` is the pool's record; only
/// a record of this object's uid (or one that names none) counts.
fn metal_change(
    object: &PoolObject,
    uid: Option<&str>,
    progress: Option<Progress>,
) -> Option<Denial> {
    let p = progress?;
    if !matches!(owner(Some(&p), uid), Owner::Mine) || !p.holds_anything() {
        return None;
    }
    let deny = |field: String, message: String| Denial {
        code: 422,
        reason: "MetalSpecChanged",
        message: format!("{field}: {message}"),
        field: Some(field),
    };
    let Some(spec) = &object.spec.metal else {
        return Some(deny(
            "spec.metal".into(),
            "cannot be removed: the pool's Metal resources exist (delete the pool to tear them down)"
                .into(),
        ));
    };
    for r in Resource::ALL {
        let decided = p.held(r).and_then(|h| h.decided.as_ref()).or(p
            .intent
            .as_ref()
            .filter(|i| i.resource == r)
            .and_then(|i| i.decided.as_ref()));
        let Some(d) = decided else { continue };
        if let Some(field) = spec.changed_field(r, &d.spec) {
            let how = match p.held(r) {
                Some(h) if h.created => "was created",
                Some(_) => "was adopted",
                None => "is being created",
            };
            return Some(deny(
                field,
                format!(
                    "cannot change: the pool's {} {how} from the previous value (a deletion policy is decided then too); revert it, or create a new pool",
                    r.field()
                ),
            ));
        }
    }
    None
}

/// Rules 5 and 6 on a `DELETE`: unless annotated to skip, a pool with
/// bound addresses, or whose VLAN profiles still use, stays.
fn check_delete(
    kind: PoolKind,
    req: &Map<String, Value>,
    pools: &dyn PoolLookup,
    profiles: Option<&dyn ProfileLookup>,
    out: &mut Reviewed,
) -> Result<()> {
    let old = req.get("oldObject").and_then(Value::as_object);
    let meta = old
        .and_then(|o| o.get("metadata"))
        .and_then(Value::as_object);
    let id = match pool_id(kind, req, meta) {
        Ok(id) => id,
        // The API server always names the object of a DELETE.
        Err(NoId::Missing(field)) => {
            let field = field.replace("metadata.", "request.");
            return Err(
                Error::malformed(format!("{field} is required for DELETE")).with_field(field)
            );
        }
        // A name we would never have registered: nothing to protect.
        Err(_) => {
            out.outcome = "allowed";
            return Ok(());
        }
    };
    out.pool = Some(id.clone());
    if has_skip_annotation(meta) {
        out.outcome = "skip-annotation";
        out.warnings.push(format!(
            "deletion not checked for allocated addresses: {SKIP_DELETE_VALIDATION_ANNOTATION} is set"
        ));
        return Ok(());
    }
    out.outcome = "allowed";
    if let Some(d) = addresses_in_use(&id, pools)? {
        out.deny(d);
        return Ok(());
    }
    check_vlan_users(&id, old, pools, profiles, out)
}

/// Whether the object carries [`SKIP_DELETE_VALIDATION_ANNOTATION`].
fn has_skip_annotation(meta: Option<&Map<String, Value>>) -> bool {
    meta.and_then(|m| m.get("annotations"))
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(SKIP_DELETE_VALIDATION_ANNOTATION))
}

/// Rule 5: the denial of deleting pool `id` while it has bound addresses.
///
/// # Errors
/// The lookup's.
fn addresses_in_use(id: &PoolId, pools: &dyn PoolLookup) -> Result<Option<Denial>> {
    let Some(stored) = pools.get(id)? else {
        return Ok(None);
    };
    let c = stored.state.counts(&stored.pool);
    let bound = c.used.saturating_add(c.out_of_range);
    if bound == 0 {
        return Ok(None);
    }
    Ok(Some(Denial {
        code: 403,
        reason: "PoolInUse",
        message: format!(
            "{} still has {bound} allocated address(es); delete their IPAddressClaims first, \
             or, to move the pool with clusterctl move, annotate it {SKIP_DELETE_VALIDATION_ANNOTATION}",
            describe(id)
        ),
        field: None,
    }))
}

/// Rule 6: a VRF-backed pool (as the old object says; without one, as its
/// Metal progress record says) whose VLAN profiles still use is denied;
/// without a profile view, a warning says it was not checked.
///
/// # Errors
/// The lookups'.
fn check_vlan_users(
    id: &PoolId,
    old: Option<&Map<String, Value>>,
    pools: &dyn PoolLookup,
    profiles: Option<&dyn ProfileLookup>,
    out: &mut Reviewed,
) -> Result<()> {
    let vrf_backed = match old.and_then(|o| o.get("spec")) {
        Some(spec) => spec.get("metal").is_some_and(|m| !m.is_null()),
        None => pools.metal_progress(id)?.is_some_and(|p| !p.deleted),
    };
    if !vrf_backed {
        return Ok(());
    }
    let Some(profiles) = profiles else {
        out.warnings.push(format!(
            "not checked whether a MetalNetworkProfile still uses the VLAN of {} (the webhook cannot read them); \
             its teardown waits until none does",
            describe(id)
        ));
        return Ok(());
    };
    let users = profiles.vlan_users(id)?;
    if !users.is_empty() {
        out.deny(Denial {
            code: 403,
            reason: "PoolVlanInUse",
            message: format!(
                "{} has its VLAN on machines through MetalNetworkProfile {}; remove the pool from those profiles first, \
                 or, to move the pool with clusterctl move, annotate it {SKIP_DELETE_VALIDATION_ANNOTATION}",
                describe(id),
                users.join(", ")
            ),
            field: None,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    fn loaded(id: PoolId, addresses: &[&str], prefix: u8, bound: usize) -> Loaded {
        let mut obj = json!({"apiVersion": pool::API_VERSION, "kind": id.kind.kind_name(),
            "metadata": {"name": id.name},
            "spec": {"addresses": addresses, "prefix": prefix}});
        if let Some(ns) = &id.namespace {
            obj["metadata"]["namespace"] = json!(ns);
        }
        crate::testing::stored_pool(PoolObject::parse(&id, &obj).unwrap(), bound, 0, 1)
    }

    fn create(id: &PoolId, addresses: &[&str], prefix: u8) -> Vec<u8> {
        let mut obj = json!({"apiVersion": pool::API_VERSION, "kind": id.kind.kind_name(),
            "metadata": {"name": id.name},
            "spec": {"addresses": addresses, "prefix": prefix}});
        if let Some(ns) = &id.namespace {
            obj["metadata"]["namespace"] = json!(ns);
        }
        json!({"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "name": id.name,
                "namespace": id.namespace.clone().unwrap_or_default(),
                "kind": {"group": pool::GROUP, "version": pool::VERSION, "kind": id.kind.kind_name()},
                "object": obj}})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn denial_json_has_kubernetes_status_shape() {
        let d = Denial::from_error(422, &Error::invalid("spec.prefix", "too long"));
        assert_eq!(
            d.status(),
            json!({"status": "Failure", "code": 422, "reason": "Invalid",
                "message": "spec.prefix: too long",
                "details": {"causes": [{"field": "spec.prefix", "message": "spec.prefix: too long"}]}})
        );
    }

    #[test]
    fn the_name_can_come_from_object_metadata() {
        let id = PoolId::namespaced("a", "p");
        let mut body: Value = serde_json::from_slice(&create(&id, &["10.0.0.0/24"], 24)).unwrap();
        body["request"]["name"] = json!("");
        body["request"]["namespace"] = json!("");
        let r = evaluate(body.to_string().as_bytes(), &Vec::new()).unwrap();
        assert_eq!((r.outcome, r.pool), ("allowed", Some(id)));
    }

    #[test]
    fn more_than_three_shared_pools_are_summarised() {
        let id = PoolId::namespaced("a", "p");
        let pools: Vec<Loaded> = (0..5)
            .map(|i| {
                loaded(
                    PoolId::namespaced(&format!("n{i}"), "q"),
                    &["10.0.0.0/24"],
                    24,
                    0,
                )
            })
            .collect();
        let r = evaluate(&create(&id, &["10.0.0.0/24"], 24), &pools).unwrap();
        assert!(r.allowed());
        assert_eq!(r.warnings.len(), 4, "{:?}", r.warnings);
        assert_eq!(r.warnings[3], "and 2 more warning(s) about other pools");
        assert_eq!(
            r.warnings[0],
            "shares 10.0.0.1 and 253 more addresses with MetalIPPool n0/q of another namespace: safe only on separate networks"
        );
    }

    /// The pools of a test, and the Metal progress of pool `ns/vrf`.
    struct Stored(Option<Progress>);

    impl PoolLookup for Stored {
        fn get(&self, _: &PoolId) -> Result<Option<Loaded>> {
            Ok(None)
        }
        fn all(&self) -> Result<Vec<Loaded>> {
            Ok(Vec::new())
        }
        fn metal_progress(&self, _: &PoolId) -> Result<Option<Progress>> {
            Ok(self.0.clone())
        }
    }

    struct Users(Vec<String>);

    impl ProfileLookup for Users {
        fn vlan_users(&self, _: &PoolId) -> Result<Vec<String>> {
            Ok(self.0.clone())
        }
    }

    const VRF_UUID: &str = "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11";

    fn vrf_pool(metal: Value) -> Value {
        json!({"apiVersion": pool::API_VERSION, "kind": "MetalIPPool",
            "metadata": {"name": "vrf", "namespace": "ns", "uid": "u-1"},
            "spec": {"metal": metal}})
    }

    fn metal() -> Value {
        json!({"metro": "da", "vrf": {"id": VRF_UUID},
            "reservation": {"network": "10.10.1.0", "cidr": 29}})
    }

    fn review_of(op: &str, old: Option<Value>, new: Option<Value>) -> Vec<u8> {
        let mut req = json!({"uid": "r-1", "operation": op, "name": "vrf", "namespace": "ns",
            "kind": {"group": pool::GROUP, "version": pool::VERSION, "kind": "MetalIPPool"}});
        if let Some(o) = old {
            req["oldObject"] = o;
        }
        if let Some(n) = new {
            req["object"] = n;
        }
        json!({"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "request": req})
            .to_string()
            .into_bytes()
    }

    /// The progress of `ns/vrf` once its VRF was adopted from `metal()`.
    fn adopted() -> Progress {
        use crate::ipam::vrf::MetalSpec;
        use crate::provision::plan::{Decided, Held};
        let spec = MetalSpec::from_json(&metal()).unwrap();
        Progress {
            uid: Some("u-1".into()),
            vrf: Some(Held {
                id: VRF_UUID.into(),
                created: false,
                decided: Some(Decided::of(&spec, Resource::Vrf)),
            }),
            ..Progress::default()
        }
    }

    #[test]
    fn a_spec_metal_change_where_resources_exist_is_denied_naming_the_field() {
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut m = metal();
            f(&mut m);
            review_of("UPDATE", Some(vrf_pool(metal())), Some(vrf_pool(m)))
        };
        let stored = Stored(Some(adopted()));
        for (f, field) in [
            (
                &(|m: &mut Value| m["vrf"]["deletionPolicy"] = json!("Delete"))
                    as &dyn Fn(&mut Value),
                "spec.metal.vrf.deletionPolicy",
            ),
            (
                &|m: &mut Value| m["metro"] = json!("sv"),
                "spec.metal.metro",
            ),
            (
                &|m: &mut Value| m["vrf"] = json!({"ipRanges": ["10.10.0.0/16"]}),
                "spec.metal.vrf.id",
            ),
        ] {
            let r = evaluate(&edit(f), &stored).unwrap();
            let d = r.denial.expect(field);
            assert_eq!(
                (d.code, d.reason, d.field.as_deref()),
                (422, "MetalSpecChanged", Some(field)),
                "{}",
                d.message
            );
        }
        // A section whose resource does not exist yet may still change.
        let r = evaluate(&edit(&|m| m["reservation"]["cidr"] = json!(28)), &stored).unwrap();
        assert!(r.allowed(), "{:?}", r.denial);
        // Removing spec.metal would orphan the VRF.
        let mut plain = vrf_pool(metal());
        plain["spec"] = json!({"addresses": ["10.0.0.0/24"], "prefix": 24});
        let r = evaluate(
            &review_of("UPDATE", Some(vrf_pool(metal())), Some(plain)),
            &stored,
        )
        .unwrap();
        assert_eq!(r.denial.unwrap().field.as_deref(), Some("spec.metal"));
        // Another incarnation's record (or none) decides nothing for this one.
        let mut other = adopted();
        other.uid = Some("u-0".into());
        for stored in [Stored(Some(other)), Stored(None)] {
            let r = evaluate(
                &edit(&|m| m["vrf"]["deletionPolicy"] = json!("Delete")),
                &stored,
            )
            .unwrap();
            assert!(r.allowed(), "{:?}", r.denial);
        }
    }

    #[test]
    fn deletion_policies_metal_cannot_carry_out_are_denied_on_create() {
        let mut m = json!({"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
            "reservation": {"network": "10.10.1.0", "cidr": 29}, "gateway": {"deletionPolicy": "Retain"}});
        let r = evaluate(
            &review_of("CREATE", None, Some(vrf_pool(m.clone()))),
            &Stored(None),
        )
        .unwrap();
        let d = r.denial.unwrap();
        assert_eq!(
            (d.code, d.field.as_deref()),
            (422, Some("spec.metal.gateway.deletionPolicy"))
        );
        m["reservation"]["deletionPolicy"] = json!("Retain");
        m["vlan"] = json!({"deletionPolicy": "Retain"});
        m["vrf"]["deletionPolicy"] = json!("Retain");
        let r = evaluate(&review_of("CREATE", None, Some(vrf_pool(m))), &Stored(None)).unwrap();
        assert!(r.allowed(), "{:?}", r.denial);
    }

    #[test]
    fn deleting_a_pool_whose_vlan_profiles_use_is_denied_naming_them() {
        let del = |old: Value| review_of("DELETE", Some(old), None);
        let users = Users(vec!["team-a/storage".into(), "team-b/edge".into()]);
        let r = evaluate_with(
            &del(vrf_pool(metal())),
            &Stored(None),
            &NoMachines,
            Some(&users),
        )
        .unwrap();
        let d = r.denial.unwrap();
        assert_eq!((d.code, d.reason), (403, "PoolVlanInUse"));
        assert!(
            d.message.contains("team-a/storage, team-b/edge"),
            "{}",
            d.message
        );
        // The skip annotation lets it go (clusterctl move).
        let mut skip = vrf_pool(metal());
        skip["metadata"]["annotations"] = json!({SKIP_DELETE_VALIDATION_ANNOTATION: ""});
        assert!(
            evaluate_with(&del(skip), &Stored(None), &NoMachines, Some(&users))
                .unwrap()
                .allowed()
        );
        // Nobody uses it.
        assert!(evaluate_with(
            &del(vrf_pool(metal())),
            &Stored(None),
            &NoMachines,
            Some(&Users(vec![]))
        )
        .unwrap()
        .allowed());
        // A pool without spec.metal has no VLAN: not asked.
        let mut plain = vrf_pool(metal());
        plain["spec"] = json!({"addresses": ["10.0.0.0/24"], "prefix": 24});
        assert!(
            evaluate_with(&del(plain), &Stored(None), &NoMachines, Some(&users))
                .unwrap()
                .allowed()
        );
        // Without an API server view: allowed, with a warning.
        let r = evaluate(&del(vrf_pool(metal())), &Stored(None)).unwrap();
        assert!(r.allowed());
        assert!(r.warnings[0].contains("not checked"), "{:?}", r.warnings);
    }
}
