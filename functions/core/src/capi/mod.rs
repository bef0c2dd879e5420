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
pub mod claim;
pub mod device;
pub mod machine;
pub mod network;
pub mod objects;
pub mod poll;
pub mod pool;
pub mod reconcile;
pub mod takeover;
pub mod vrf;

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::error::Result;
use crate::ipam::claim::{Claim, ClaimObject, IpAddressObject};
use crate::ipam::ops::Adoption;
use crate::ipam::pool::{PoolId, PoolKind};
use crate::kube::conditions::{with_ready, Ready};
use crate::kube::object::{Meta, Object, ObjectMeta, WithJson};
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
use objects::{ClusterObject, PoolResource};
/// Reason of `Ready=True` on a bound claim (the contract defines none).
pub const REASON_ALLOCATED: &str = "AddressAllocated";

pub use crate::reconcile::{Reconciled, StepResult};

/// The claim handler's members of the step's answer: the address involved
/// and whether the claim's Metal assignment follows (the `assign` step;
/// a `waiting` release runs again after it). Written and read on the
/// kit's [`Reconciled`] (the claim handler's and the assignment's) as `address` and `metalAssignment`.
pub trait ClaimAnswer: Sized {
    /// With the address involved.
    fn with_address(self, a: impl Into<String>) -> Self;
    /// With `metalAssignment` set when `yes` (absent otherwise).
    fn metal(self, yes: bool) -> Self;
    /// The address involved, if any.
    fn address(&self) -> Option<&str>;
    /// The claim is in a VRF-backed pool: its Metal assignment is the
    /// `assign` step's.
    fn metal_assignment(&self) -> bool;
}

impl ClaimAnswer for Reconciled {
    fn with_address(self, a: impl Into<String>) -> Self {
        self.with_detail("address", a.into())
    }
    fn metal(self, yes: bool) -> Self {
        if yes {
            self.with_detail("metalAssignment", true)
        } else {
            self
        }
    }
    fn address(&self) -> Option<&str> {
        self.detail.get("address").and_then(Value::as_str)
    }
    fn metal_assignment(&self) -> bool {
        self.detail.get("metalAssignment") == Some(&Value::Bool(true))
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
    clusters: BTreeMap<(String, String), Option<ClusterObject>>,
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
            clusters: BTreeMap::new(),
        }
    }
}

/// Where a claim reconciliation reads objects: the API server, or a
/// snapshot taken by a full reconciliation.
struct Reader<'s, 'k, 'a, H: HttpClient + ?Sized> {
    kube: &'k Kube<'a, H>,
    snap: Option<&'s mut Snapshot>,
}

impl<H: HttpClient + ?Sized> Reader<'_, '_, '_, H> {
    fn key(ns: &str, name: &str) -> (String, String) {
        (ns.to_string(), name.to_string())
    }

    fn claim(&self, ns: &str, name: &str) -> Result<Option<WithJson<ClaimObject>>> {
        match self.snap.as_deref() {
            Some(s) => Ok(s.claims.get(&Self::key(ns, name)).cloned()),
            None => Ok(self.kube.get_as(&kube::CLAIMS, Some(ns), name)?),
        }
    }

    fn address(&self, ns: &str, name: &str) -> Result<Option<IpAddressObject>> {
        match self.snap.as_deref() {
            Some(s) => Ok(s.addresses.get(&Self::key(ns, name)).cloned()),
            None => Ok(self.kube.get_as(&kube::IP_ADDRESSES, Some(ns), name)?),
        }
    }

    fn pool(&self, id: &PoolId) -> Result<Option<PoolResource>> {
        match self.snap.as_deref() {
            Some(s) => Ok(s.pools.get(id).cloned()),
            None => Ok(self
                .kube
                .get_as(id.kind.resource(), id.namespace.as_deref(), &id.name)?),
        }
    }

    fn cluster(&mut self, ns: &str, name: &str) -> Result<Option<ClusterObject>> {
        let Some(s) = self.snap.as_deref_mut() else {
            return Ok(self.kube.get_as(&kube::CLUSTERS, Some(ns), name)?);
        };
        if let Some(c) = s.clusters.get(&Self::key(ns, name)) {
            return Ok(c.clone());
        }
        let c: Option<ClusterObject> = self.kube.get_as(&kube::CLUSTERS, Some(ns), name)?;
        s.clusters.insert(Self::key(ns, name), c.clone());
        Ok(c)
    }
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
) -> Result<Reconciled> {
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
    snapshot: Option<&mut Snapshot>,
) -> Result<Reconciled> {
    crate::reconcile::run(&mut claim::ClaimHandler {
        ctx,
        kube,
        ns,
        name,
        snapshot,
        first: true,
        finalizers: takeover::Finalizers::of(PoolKind::Namespaced),
        gated_at: None,
    })
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
) -> Result<Reconciled> {
    crate::reconcile::run(&mut pool::PoolHandler { ctx, kube, id })
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
        "phoenixnap" => o.status.phoenixnap.as_ref(),
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

/// Writes an in-cluster provider's pool's status in its schema (only
/// `ipAddresses`: it has no conditions) if it differs; returns whether it
/// wrote.
fn write_in_cluster_pool_status<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    r: &Resource,
    o: &PoolResource,
    fields: Option<Map<String, Value>>,
) -> Result<bool> {
    let m = &o.metadata;
    let Some(st) = fields else { return Ok(false) };
    let changed = st
        .get("ipAddresses")
        .is_some_and(|v| o.status.ip_addresses.as_ref() != Some(v));
    if !changed {
        return Ok(false);
    }
    let patch = json!({"metadata": {"resourceVersion": m.resource_version_json()}, "status": st});
    kube.merge_patch(r, m.namespace.as_deref(), &m.name, true, &patch)?;
    Ok(true)
}

/// Which pool a pool object's API path names.
pub fn pool_id_of(kind: PoolKind, ns: Option<&str>, name: &str) -> PoolId {
    PoolId::of(kind, ns.unwrap_or_default(), name)
}
