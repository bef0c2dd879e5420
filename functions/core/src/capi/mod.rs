//! The Cluster API IPAM contract: claim and pool reconciliation against the
//! Kubernetes API, on top of the allocation steps.
//!
//! Each function reads the object fresh from the API server (an event is
//! only a hint: it may be stale, duplicated, reordered or forged), decides,
//! and writes back with optimistic concurrency (`resourceVersion` in every
//! patch that replaces a list; a 409 re-reads and retries). Every function
//! is idempotent: run twice on the same state, the second run writes
//! nothing.
//!
//! # Claim lifecycle ([`reconcile_claim`])
//! 1. Not ours (`spec.poolRef` group/kind) → ignored.
//! 2. Paused → no writes: the claim's `cluster.x-k8s.io/paused`
//!    annotation; its Cluster (`spec.clusterName`, else the
//!    `cluster.x-k8s.io/cluster-name` label) with `spec.paused` or that
//!    annotation; the pool's annotation. A live claim whose Cluster does not
//!    exist waits; a deleting one proceeds (the Cluster may be gone first).
//! 3. Deleting and holding our finalizer: release the address, remove our
//!    finalizer from the `IPAddress` and delete it, then remove the claim's
//!    finalizer.
//! 4. Live: add our finalizer; allocate (or, when an `IPAddress` already
//!    exists, adopt its address); create the `IPAddress` named after the
//!    claim (owner references to claim and pool, protection finalizer,
//!    cluster-name label, `poolRef` equal to the claim's) or complete the
//!    metadata of an existing one; an `IPAddress` being deleted while its
//!    claim lives loses our finalizer and is re-created identically; set
//!    `status.addressRef` and `Ready=True` through `/status`. Failures set
//!    `Ready=False` with `PoolNotReady`, `PoolExhausted` or
//!    `AllocationFailed`.
//! 5. The claim no longer exists: release any binding and clean up an
//!    orphaned `IPAddress`.
//!
//! # Pool lifecycle ([`sync_pool`])
//! Registers the pool's spec in the store (adopting existing `IPAddress`
//! objects of the pool when the store does not know it yet), keeps our
//! finalizer on it while addresses are allocated, and writes
//! `status.ipAddresses` and a `Ready` condition.

pub mod assign;
pub mod device;
pub mod network;
pub mod objects;
pub mod poll;
pub mod reconcile;
pub mod vrf;

use std::net::IpAddr;

use std::cell::RefCell;
use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::error::{Error, ErrorKind, Result};
use crate::ipam::claim::{Claim, ClaimObject, IpAddressObject, CLUSTER_NAME_LABEL};
use crate::ipam::ops::{self, Adoption};
use crate::ipam::pool::{PoolId, PoolKind, PoolObject};
use crate::kube::conditions::{with_ready, Ready};
use crate::kube::meta::{add_finalizer, remove_finalizer, retrying, rfc3339};
use crate::kube::object::{Meta, Object, ObjectMeta, OwnerReference, WithJson};
use crate::kube::{self, Kube, Resource};
use crate::kv::Ctx;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;

/// Finalizer on claims: released by metal-ipam before the claim goes.
pub const CLAIM_FINALIZER: &str = "ipam.metal-ipam.dev/release-address";
/// Finalizer on IPAddresses: protects them while their claim lives.
pub const ADDRESS_FINALIZER: &str = "ipam.metal-ipam.dev/protect-address";
/// Finalizer on pools: kept while addresses are allocated from them.
pub const POOL_FINALIZER: &str = "ipam.metal-ipam.dev/protect-pool";
pub use objects::PAUSED_ANNOTATION;
use objects::{paused, ClusterObject, PoolResource};
/// Reason of `Ready=True` on a bound claim (the contract defines none).
pub const REASON_ALLOCATED: &str = "AddressAllocated";

/// What a contract step concluded: `result` in its answer, and the key
/// of the counts in a full reconcile's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StepResult {
    /// The claim has its address (`IPAddress` and status written).
    Bound,
    /// The claim's address was released.
    Released,
    /// The object does not exist (or holds nothing of ours): nothing to do.
    Absent,
    /// The object is not ours (another pool kind or group).
    Ignored,
    /// The claim or its cluster is paused.
    Paused,
    /// Not possible yet (pool not ready or exhausted, cluster missing, pool
    /// still in use); the status says why, and a later event or reconcile
    /// retries.
    Waiting,
    /// The request cannot succeed as it is (status says why).
    Failed,
    /// The pool's spec was stored and its status written.
    Synced,
    /// The pool was removed from the store.
    Deleted,
    /// The pool left Kubernetes with addresses allocated: kept in the store.
    Kept,
}

impl StepResult {
    /// The lower-case name used in answers, reports and logs.
    ///
    /// ```
    /// use metal_ipam_core::capi::StepResult;
    /// assert_eq!(StepResult::Bound.as_str(), "bound");
    /// assert_eq!(StepResult::Kept.as_str(), "kept");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            StepResult::Bound => "bound",
            StepResult::Released => "released",
            StepResult::Absent => "absent",
            StepResult::Ignored => "ignored",
            StepResult::Paused => "paused",
            StepResult::Waiting => "waiting",
            StepResult::Failed => "failed",
            StepResult::Synced => "synced",
            StepResult::Deleted => "deleted",
            StepResult::Kept => "kept",
        }
    }
}

/// What a reconciliation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What the step concluded.
    pub result: StepResult,
    /// The address involved, if any.
    pub address: Option<String>,
    /// Human explanation.
    pub message: String,
    /// Requests sent to the API server.
    pub kube_calls: u32,
    /// Seconds after which running the step again is worthwhile, when it
    /// is waiting on something that takes time (Metal provisioning).
    pub retry_after: Option<u64>,
    /// The claim is in a VRF-backed pool: its Metal assignment is the
    /// `assign` step's (run it after this one; a `waiting` release runs
    /// again after it).
    pub metal_assignment: bool,
}

impl Outcome {
    fn new(result: StepResult, message: impl Into<String>) -> Outcome {
        Outcome {
            result,
            address: None,
            message: message.into(),
            kube_calls: 0,
            retry_after: None,
            metal_assignment: false,
        }
    }

    fn metal(mut self, yes: bool) -> Outcome {
        self.metal_assignment = yes;
        self
    }

    fn retry_after(mut self, seconds: u64) -> Outcome {
        self.retry_after = Some(seconds);
        self
    }

    fn with_address(mut self, a: impl Into<String>) -> Outcome {
        self.address = Some(a.into());
        self
    }

    /// As JSON (for responses and reports).
    pub fn to_json(&self) -> Value {
        let mut v = json!({"result": self.result.as_str(), "message": self.message, "kubeCalls": self.kube_calls});
        if let Some(a) = &self.address {
            v["address"] = a.clone().into();
        }
        if let Some(s) = self.retry_after {
            v["retryAfter"] = s.into();
        }
        if self.metal_assignment {
            v["metalAssignment"] = true.into();
        }
        v
    }
}

/// Objects listed once by a full reconciliation, so that reconciling each
/// claim does not GET what the lists already returned. Used for the first
/// attempt only: a 409 (a stale object) makes the retry read fresh.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Claims by (namespace, name).
    pub claims: BTreeMap<(String, String), WithJson<ClaimObject>>,
    /// IPAddresses by (namespace, name).
    pub addresses: BTreeMap<(String, String), IpAddressObject>,
    /// Pools by id.
    pub pools: BTreeMap<PoolId, PoolResource>,
    /// Clusters looked up so far by (namespace, name), `None` = absent.
    clusters: RefCell<BTreeMap<(String, String), Option<ClusterObject>>>,
}

impl Snapshot {
    /// A snapshot from listed claims, IPAddresses and pools.
    pub fn new(
        claims: Vec<WithJson<ClaimObject>>,
        addresses: Vec<IpAddressObject>,
        pools: BTreeMap<PoolId, PoolResource>,
    ) -> Snapshot {
        fn key(m: &ObjectMeta) -> (String, String) {
            (m.namespace.clone().unwrap_or_default(), m.name.clone())
        }
        Snapshot {
            claims: claims.into_iter().map(|o| (key(o.meta()), o)).collect(),
            addresses: addresses.into_iter().map(|o| (key(o.meta()), o)).collect(),
            pools,
            clusters: RefCell::default(),
        }
    }
}

/// Where a claim reconciliation reads objects: the API server, or a
/// snapshot taken by a full reconciliation.
struct Reader<'s, 'k, 'a, H: HttpClient + ?Sized> {
    kube: &'k Kube<'a, H>,
    snap: Option<&'s Snapshot>,
}

impl<H: HttpClient + ?Sized> Reader<'_, '_, '_, H> {
    fn key(ns: &str, name: &str) -> (String, String) {
        (ns.to_string(), name.to_string())
    }

    fn claim(&self, ns: &str, name: &str) -> Result<Option<WithJson<ClaimObject>>> {
        match self.snap {
            Some(s) => Ok(s.claims.get(&Self::key(ns, name)).cloned()),
            None => Ok(self.kube.get_as(&kube::CLAIMS, Some(ns), name)?),
        }
    }

    fn address(&self, ns: &str, name: &str) -> Result<Option<IpAddressObject>> {
        match self.snap {
            Some(s) => Ok(s.addresses.get(&Self::key(ns, name)).cloned()),
            None => Ok(self.kube.get_as(&kube::IP_ADDRESSES, Some(ns), name)?),
        }
    }

    fn pool(&self, id: &PoolId) -> Result<Option<PoolResource>> {
        match self.snap {
            Some(s) => Ok(s.pools.get(id).cloned()),
            None => {
                Ok(self
                    .kube
                    .get_as(resource_of(id.kind), id.namespace.as_deref(), &id.name)?)
            }
        }
    }

    fn cluster(&self, ns: &str, name: &str) -> Result<Option<ClusterObject>> {
        let Some(s) = self.snap else {
            return Ok(self.kube.get_as(&kube::CLUSTERS, Some(ns), name)?);
        };
        if let Some(c) = s.clusters.borrow().get(&Self::key(ns, name)) {
            return Ok(c.clone());
        }
        let c: Option<ClusterObject> = self.kube.get_as(&kube::CLUSTERS, Some(ns), name)?;
        s.clusters
            .borrow_mut()
            .insert(Self::key(ns, name), c.clone());
        Ok(c)
    }
}

fn resource_of(kind: PoolKind) -> &'static Resource {
    match kind {
        PoolKind::Namespaced => &kube::METAL_IP_POOLS,
        PoolKind::Global => &kube::GLOBAL_METAL_IP_POOLS,
    }
}

/// Writes the claim's status (`addressRef` when bound, `Ready`, and the
/// deprecated v1beta1 condition list) if it differs; returns whether it wrote.
fn write_claim_status<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    claim: &ClaimObject,
    address_ref: Option<&str>,
    cond: Ready<'_>,
) -> Result<bool> {
    let m = &claim.metadata;
    let (conditions, cond_changed) = with_ready(&claim.status.conditions, cond, m.generation);
    let Ready {
        status: ready,
        reason,
        message,
        now,
    } = cond;
    let current_ref = claim.status.address_ref.as_ref().map(|r| r.name.as_str());
    let ref_changed = address_ref.is_some() && current_ref != address_ref;
    if !cond_changed && !ref_changed {
        return Ok(false);
    }
    // The deprecated v1beta1 conditions: status, reason, message,
    // lastTransitionTime, and a severity when not True.
    let mut old = json!({"type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": rfc3339(now)});
    if !ready {
        old["severity"] = "Warning".into();
        old["reason"] = reason.into();
        old["message"] = message.into();
    }
    let mut st = Map::new();
    st.insert("conditions".into(), Value::Array(conditions));
    st.insert(
        "deprecated".into(),
        json!({"v1beta1": {"conditions": [old]}}),
    );
    if let Some(a) = address_ref {
        st.insert("addressRef".into(), json!({"name": a}));
    }
    let patch = json!({"metadata": {"resourceVersion": m.resource_version_json()}, "status": Value::Object(st)});
    kube.merge_patch(&kube::CLAIMS, m.namespace.as_deref(), &m.name, true, &patch)?;
    Ok(true)
}

/// Reconciles one `IPAddressClaim` per the CAPI IPAM contract (see the
/// module docs for the steps).
///
/// # Idempotency
/// Safe to run any number of times, concurrently with itself for the same
/// claim (optimistic concurrency on every write) and with stale, duplicated
/// or reordered events: the outcome depends only on the current objects.
///
/// # Errors
/// 503 for an unavailable API server or store, or persistent conflicts;
/// 500 for credentials/RBAC problems or objects the API server rejects.
/// Allocation failures are not errors: they become the claim's `Ready=False`
/// condition and the outcome `waiting` / `failed`.
pub fn reconcile_claim<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<Outcome> {
    reconcile_claim_in(ctx, kube, ns, name, None)
}

/// [`reconcile_claim`] reading first from `snapshot` (a full
/// reconciliation's lists); retries after a conflict read fresh.
///
/// # Errors
/// As [`reconcile_claim`].
pub fn reconcile_claim_in<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    snapshot: Option<&Snapshot>,
) -> Result<Outcome> {
    let before = kube.calls();
    let mut first = true;
    let mut out = retrying(|| {
        let snap = if first { snapshot } else { None };
        first = false;
        reconcile_claim_once(ctx, &Reader { kube, snap }, ns, name)
    })?;
    out.kube_calls = kube.calls() - before;
    Ok(out)
}

fn reconcile_claim_once<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    reader: &Reader<'_, '_, '_, H>,
    ns: &str,
    name: &str,
) -> Result<Outcome> {
    let kube = reader.kube;
    let Some(read) = reader.claim(ns, name)? else {
        // Only bindings in pools that came from Kubernetes are judged
        // against the API server: a claim made through the plain HTTP API
        // is released only through the HTTP API (the events token must not
        // reach it).
        let released = match ops::get_claim(ctx.kv, ns, name)? {
            Some(b) if b.pool_uid.is_some() => {
                match crate::provision::assign::release(ctx, ns, name, Some(&b.uid)) {
                    Err(e) if e.reason() == "MetalAssignmentHeld" => {
                        return Ok(Outcome::new(
                            StepResult::Waiting,
                            "the claim does not exist; its Metal assignment is removed first (assign step)",
                        )
                        .metal(true))
                    }
                    r => r?,
                }
            }
            Some(_) => {
                return Ok(Outcome::new(StepResult::Absent,
                    "the claim does not exist; its binding was made through the HTTP API and is left alone",
                ))
            }
            None => None,
        };
        cleanup_orphan_address(kube, ns, name)?;
        return Ok(match released {
            Some(r) => Outcome::new(StepResult::Released, "the claim no longer exists")
                .with_address(r.address),
            None => Outcome::new(StepResult::Absent, "the claim does not exist"),
        });
    };
    let WithJson {
        typed: claim_obj,
        json,
    } = read;
    let claim = match Claim::parse(&json) {
        Ok(c) => c,
        Err(e) if e.reason() == "UnsupportedPoolRef" => {
            return Ok(Outcome::new(
                StepResult::Ignored,
                "spec.poolRef is not served by metal-ipam",
            ))
        }
        Err(e) => {
            if !claim_obj.metadata.deleting() {
                let message = e.to_string();
                let cond = Ready::no("AllocationFailed", &message, ctx.env.now());
                write_claim_status(kube, &claim_obj, None, cond)?;
            }
            return Ok(Outcome::new(StepResult::Failed, e.to_string()));
        }
    };
    let deleting = claim_obj.metadata.deleting();
    if paused(&claim_obj) {
        return Ok(Outcome::new(StepResult::Paused, "the claim is paused"));
    }
    if let Some(cluster) = &claim.cluster_name {
        match reader.cluster(ns, cluster)? {
            None if !deleting => {
                return Ok(Outcome::new(
                    StepResult::Waiting,
                    format!("Cluster {ns}/{cluster} does not exist"),
                ));
            }
            Some(c) if c.is_paused() => {
                return Ok(Outcome::new(
                    StepResult::Paused,
                    format!("Cluster {ns}/{cluster} is paused"),
                ));
            }
            _ => {}
        }
    }
    // The pool's pause annotation is read from the API server (the store's
    // copy may lag behind); a pool registered only through the HTTP API has
    // no object there and is never paused.
    let pool_obj = reader.pool(&claim.pool)?;
    if pool_obj.as_ref().is_some_and(paused) {
        return Ok(Outcome::new(
            StepResult::Paused,
            format!("pool {} is paused", claim.pool.display()),
        ));
    }
    if deleting {
        return finalize_claim(ctx, kube, &claim, &claim_obj);
    }
    let claim_obj = add_finalizer(kube, &kube::CLAIMS, &claim_obj, CLAIM_FINALIZER)?;
    let now = ctx.env.now();
    // An IPAddress being deleted while its claim lives: let it go, then
    // re-create it identically below.
    let mut ip = reader.address(ns, name)?;
    if let Some(o) = &ip {
        if o.metadata.deleting() && o.metadata.owned_by(&claim.id.uid) {
            remove_finalizer(kube, &kube::IP_ADDRESSES, o, ADDRESS_FINALIZER)?;
            ip = kube.get_as(&kube::IP_ADDRESSES, Some(ns), name)?;
            if ip.as_ref().is_some_and(|o| o.metadata.deleting()) {
                return Err(Error::transient(
                    "KubeConflict",
                    "the IPAddress is still being deleted",
                ));
            }
        }
    }
    let existing: Option<IpAddr> = ip
        .as_ref()
        .filter(|o| o.spec.pool_ref.as_ref() == Some(&claim.pool_ref))
        .and_then(|o| o.spec.ip());
    let allocated = match existing {
        Some(a) => ops::adopt(ctx, &claim, a),
        None => ops::allocate(ctx, &claim),
    };
    let record = match allocated {
        Ok(a) => a.record,
        Err(e) if e.kind() == ErrorKind::Transient || e.kind() == ErrorKind::Internal => {
            return Err(e)
        }
        Err(e) => {
            let reason = match (e.kind(), e.reason()) {
                (ErrorKind::NotFound, _) => "PoolNotReady",
                (ErrorKind::Exhausted, _) => "PoolExhausted",
                _ => "AllocationFailed",
            };
            write_claim_status(kube, &claim_obj, None, Ready::no(reason, e.message(), now))?;
            let result = if reason == "AllocationFailed" {
                StepResult::Failed
            } else {
                StepResult::Waiting
            };
            return Ok(Outcome::new(result, format!("{reason}: {}", e.message())));
        }
    };
    let mut desired = record.to_ip_address(ns, name)?;
    desired["metadata"]["finalizers"] = json!([ADDRESS_FINALIZER]);
    match ip {
        None => {
            kube.create(&kube::IP_ADDRESSES, Some(ns), &desired)?;
        }
        Some(o) => {
            let want = IpAddressObject::from_json(&desired);
            if o.spec.address != record.address || o.spec.pool_ref != want.spec.pool_ref {
                let msg = format!(
                    "IPAddress {ns}/{name} exists with {} in another pool or with another address than the claim's {}",
                    if o.spec.address.is_empty() { "?" } else { &o.spec.address },
                    record.address
                );
                let cond = Ready::no("AllocationFailed", &msg, now);
                write_claim_status(kube, &claim_obj, None, cond)?;
                return Ok(Outcome::new(StepResult::Failed, msg));
            }
            complete_address_metadata(kube, &o, &want)?;
        }
    }
    write_claim_status(
        kube,
        &claim_obj,
        Some(name),
        Ready::yes(REASON_ALLOCATED, now),
    )?;
    Ok(Outcome::new(
        StepResult::Bound,
        format!("{ns}/{name} has {}", record.address),
    )
    .with_address(record.address)
    .metal(pool_obj.is_some_and(|p| p.vrf_backed)))
}

/// Adds what an existing IPAddress lacks: our finalizer, the owner
/// references, the cluster-name label (one guarded patch, or none).
fn complete_address_metadata<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    o: &IpAddressObject,
    desired: &IpAddressObject,
) -> Result<()> {
    let m = &o.metadata;
    let mut patch = Map::new();
    if !m.has_finalizer(ADDRESS_FINALIZER) {
        let mut fs = m.finalizers.clone();
        fs.push(ADDRESS_FINALIZER.to_string());
        patch.insert("finalizers".into(), json!(fs));
    }
    let mut refs = m.owner_references.clone();
    let mut refs_changed = false;
    for want in &desired.metadata.owner_references {
        match refs.iter_mut().find(|r| r.uid == want.uid) {
            Some(r) if r == want => {}
            Some(r) => {
                *r = want.clone();
                refs_changed = true;
            }
            None => {
                refs.push(want.clone());
                refs_changed = true;
            }
        }
    }
    if refs_changed {
        patch.insert(
            "ownerReferences".into(),
            refs.iter().map(OwnerReference::to_json).collect(),
        );
    }
    if let Some(c) = desired.metadata.label(CLUSTER_NAME_LABEL) {
        if m.label(CLUSTER_NAME_LABEL) != Some(c) {
            patch.insert("labels".into(), json!({ CLUSTER_NAME_LABEL: c }));
        }
    }
    if patch.is_empty() {
        return Ok(());
    }
    patch.insert("resourceVersion".into(), m.resource_version_json());
    kube.merge_patch(
        &kube::IP_ADDRESSES,
        m.namespace.as_deref(),
        &m.name,
        false,
        &json!({"metadata": patch}),
    )?;
    Ok(())
}

fn finalize_claim<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    claim: &Claim,
    claim_obj: &ClaimObject,
) -> Result<Outcome> {
    let ns = claim.id.namespace.as_str();
    let name = claim.id.name.as_str();
    if !claim_obj.metadata.has_finalizer(CLAIM_FINALIZER) {
        return Ok(Outcome::new(
            StepResult::Absent,
            "the claim is being deleted and holds no metal-ipam finalizer",
        ));
    }
    if claim_obj
        .metadata
        .has_finalizer(assign::ASSIGNMENT_FINALIZER)
    {
        return Ok(Outcome::new(
            StepResult::Waiting,
            "the claim's Metal assignment is removed first (assign step)",
        )
        .metal(true));
    }
    let released = match crate::provision::assign::release(ctx, ns, name, Some(&claim.id.uid)) {
        // Deleted without the assignment finalizer while the record still
        // holds an assignment: the assign step removes it first.
        Err(e) if e.reason() == "MetalAssignmentHeld" => {
            return Ok(Outcome::new(StepResult::Waiting, e.message().to_string()).metal(true))
        }
        r => r?,
    };
    let ip: Option<IpAddressObject> = kube.get_as(&kube::IP_ADDRESSES, Some(ns), name)?;
    if let Some(ip) = ip {
        if ip.metadata.owned_by(&claim.id.uid) || ip.metadata.has_finalizer(ADDRESS_FINALIZER) {
            release_address_object(kube, &ip)?;
        }
    }
    remove_finalizer(kube, &kube::CLAIMS, claim_obj, CLAIM_FINALIZER)?;
    let mut out = Outcome::new(StepResult::Released, format!("{ns}/{name} released"));
    if let Some(r) = released {
        out = out.with_address(r.address);
    }
    Ok(out)
}

fn cleanup_orphan_address<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<()> {
    let ip: Option<IpAddressObject> = kube.get_as(&kube::IP_ADDRESSES, Some(ns), name)?;
    match ip {
        Some(ip) if ip.metadata.has_finalizer(ADDRESS_FINALIZER) => {
            release_address_object(kube, &ip)
        }
        _ => Ok(()),
    }
}

/// Removes our finalizer from an `IPAddress` and deletes it unless it is
/// already going.
fn release_address_object<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ip: &IpAddressObject,
) -> Result<()> {
    let remaining = remove_finalizer(kube, &kube::IP_ADDRESSES, ip, ADDRESS_FINALIZER)?;
    if remaining.is_some_and(|o| !o.metadata.deleting()) {
        let m = &ip.metadata;
        kube.delete(&kube::IP_ADDRESSES, m.namespace.as_deref(), &m.name)?;
    }
    Ok(())
}

/// Reconciles one pool object: registers its spec (adopting existing
/// `IPAddress` objects when the store does not know the pool), keeps our
/// finalizer while addresses are allocated, and writes its status.
///
/// # Idempotency
/// As [`reconcile_claim`].
///
/// # Errors
/// As [`reconcile_claim`]. An invalid spec or an update dropping allocated
/// addresses is reported in the pool's `Ready=False` condition.
pub fn sync_pool<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    id: &PoolId,
) -> Result<Outcome> {
    let before = kube.calls();
    let mut out = retrying(|| sync_pool_once(ctx, kube, id))?;
    out.kube_calls = kube.calls() - before;
    Ok(out)
}

fn sync_pool_once<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    id: &PoolId,
) -> Result<Outcome> {
    let r = resource_of(id.kind);
    let ns = id.namespace.as_deref();
    let now = ctx.env.now();
    let read: Option<WithJson<PoolResource>> = kube.get_as(r, ns, &id.name)?;
    let Some(o) = read else {
        return match ops::delete_pool(ctx, id) {
            Ok(true) => Ok(Outcome::new(StepResult::Deleted, format!("pool {} no longer exists", id.display()))),
            Ok(false) => Ok(Outcome::new(StepResult::Absent, format!("pool {} does not exist", id.display()))),
            Err(e) if e.reason() == "PoolInUse" => Ok(Outcome::new(StepResult::Kept, format!("pool {} was removed from Kubernetes while addresses are allocated; kept in the store: {}", id.display(), e.message()))),
            Err(e) => Err(e),
        };
    };
    if o.typed.vrf_backed {
        // Registered, synced and deleted by the provision step, after its
        // Metal resources (capi::vrf).
        return Ok(Outcome::new(
            StepResult::Ignored,
            format!(
                "pool {} is VRF-backed: the provision step syncs it",
                id.display()
            ),
        ));
    }
    if o.meta().deleting() {
        return match ops::delete_pool(ctx, id) {
            Ok(_) => {
                remove_finalizer(kube, r, &o, POOL_FINALIZER)?;
                Ok(Outcome::new(
                    StepResult::Deleted,
                    format!("pool {} deleted", id.display()),
                ))
            }
            Err(e) if e.reason() == "PoolInUse" => {
                write_pool_status(
                    kube,
                    r,
                    &o.typed,
                    None,
                    Ready::no("PoolInUse", e.message(), now),
                )?;
                Ok(Outcome::new(StepResult::Waiting, e.message().to_string()))
            }
            Err(e) => Err(e),
        };
    }
    if paused(&o) {
        return Ok(Outcome::new(
            StepResult::Paused,
            format!("pool {} is paused", id.display()),
        ));
    }
    let o = add_finalizer(kube, r, &o, POOL_FINALIZER)?;
    let object = match PoolObject::parse(id, &o.json) {
        Ok(p) => p,
        Err(e) => {
            let message = e.to_string();
            write_pool_status(
                kube,
                r,
                &o.typed,
                None,
                Ready::no("InvalidSpec", &message, now),
            )?;
            return Ok(Outcome::new(StepResult::Failed, e.to_string()));
        }
    };
    let adoptions = if ops::get_pool(ctx.kv, id)?.is_none() {
        adoptions_for(kube, id)?
    } else {
        Vec::new()
    };
    match ops::put_pool_with(ctx, object, &adoptions) {
        Ok((_, view)) => {
            let counts = view.to_json()["status"]["ipAddresses"].clone();
            write_pool_status(
                kube,
                r,
                &o.typed,
                Some(Map::from_iter([("ipAddresses".to_string(), counts)])),
                Ready::yes("PoolReady", now),
            )?;
            Ok(Outcome::new(
                StepResult::Synced,
                format!(
                    "pool {} registered ({} adopted)",
                    id.display(),
                    adoptions.len()
                ),
            ))
        }
        Err(e) if e.kind() == ErrorKind::Conflict || e.kind() == ErrorKind::Invalid => {
            write_pool_status(
                kube,
                r,
                &o.typed,
                None,
                Ready::no(e.reason(), e.message(), now),
            )?;
            Ok(Outcome::new(StepResult::Failed, e.to_string()))
        }
        Err(e) => Err(e),
    }
}

/// The IPAddress objects of `id` (as adoptions), read from the API server.
pub(crate) fn adoptions_for<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    id: &PoolId,
) -> Result<Vec<Adoption>> {
    let items: Vec<IpAddressObject> = kube.list_as(&kube::IP_ADDRESSES, id.namespace.as_deref())?;
    let mut out = Vec::new();
    for ip in items {
        let ns = ip.metadata.namespace.as_deref().unwrap_or_default();
        if ip.spec.our_pool(ns).as_ref() != Some(id) {
            continue;
        }
        if let Some(a) = adoption_of(kube, &ip)? {
            out.push(a);
        }
    }
    Ok(out)
}

/// The claim an IPAddress belongs to, as an adoption (the claim's uid comes
/// from the controller owner reference, else from the claim itself).
pub(crate) fn adoption_of<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ip: &IpAddressObject,
) -> Result<Option<Adoption>> {
    let Some(ns) = ip.metadata.namespace.as_deref() else {
        return Ok(None);
    };
    let Some(claim_name) = ip.spec.claim_ref.as_ref().map(|r| r.name.as_str()) else {
        return Ok(None);
    };
    let Some(address) = ip.spec.ip() else {
        return Ok(None);
    };
    let owner_uid = ip
        .metadata
        .owner_references
        .iter()
        .find(|r| r.kind == "IPAddressClaim")
        .map(|r| r.uid.clone());
    let uid = match owner_uid {
        Some(u) => u,
        None => {
            let claim: Option<Meta> = kube.get_as(&kube::CLAIMS, Some(ns), claim_name)?;
            match claim.and_then(|c| c.metadata.uid) {
                Some(u) => u,
                None => return Ok(None),
            }
        }
    };
    // The claim as the IPAddress describes it, checked by the same parser
    // as every claim.
    let claim_json = json!({
        "apiVersion": kube::CLAIMS.api_version(),
        "kind": "IPAddressClaim",
        "metadata": {"name": claim_name, "namespace": ns, "uid": uid, "labels": ip.metadata.labels},
        "spec": {"poolRef": ip.spec.pool_ref.as_ref().map(|p| p.to_json())}
    });
    Ok(Claim::parse(&claim_json)
        .ok()
        .map(|claim| Adoption { claim, address }))
}

/// Writes a pool's `status`: the `Ready` condition and, when given, other
/// fields (`ipAddresses`, a VRF-backed pool's `metal`), if anything
/// differs from what the object shows; returns whether it wrote.
fn write_pool_status<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    r: &Resource,
    o: &PoolResource,
    fields: Option<Map<String, Value>>,
    cond: Ready<'_>,
) -> Result<bool> {
    let m = &o.metadata;
    let (conditions, cond_changed) = with_ready(&o.status.conditions, cond, m.generation);
    let mut st = fields.unwrap_or_default();
    let current = |k: &str| match k {
        "ipAddresses" => o.status.ip_addresses.as_ref(),
        "metal" => o.status.metal.as_ref(),
        _ => None,
    };
    let fields_changed = st.iter().any(|(k, v)| current(k) != Some(v));
    if !cond_changed && !fields_changed {
        return Ok(false);
    }
    st.insert("conditions".into(), Value::Array(conditions));
    let patch = json!({"metadata": {"resourceVersion": m.resource_version_json()}, "status": st});
    kube.merge_patch(r, m.namespace.as_deref(), &m.name, true, &patch)?;
    Ok(true)
}

/// Which pool a pool object's API path names.
pub fn pool_id_of(kind: PoolKind, ns: Option<&str>, name: &str) -> PoolId {
    match ns {
        Some(ns) => PoolId::of(kind, ns, name),
        None => PoolId::global(name),
    }
}
