//! The `IPAddressClaim` handler on the reconcile kit: allocate, write the
//! `IPAddress` and the claim's status; release on deletion (see
//! [`crate::capi`] for the contract's steps).
//!
//! Order: [`Order::PauseFirst`] — the contract leaves a paused claim alone,
//! deleting or not (its cluster may be being moved).

use std::net::IpAddr;

use serde_json::{json, Map, Value};

use super::objects::{paused, PoolResource};
use super::takeover::{self, Finalizers};
use super::{ClaimAnswer, Reader, Snapshot, ADDRESS_FINALIZER};
use crate::error::{Error, ErrorKind, Known, Result};
use crate::ipam::claim::{Claim, ClaimObject, IpAddressObject};
use crate::ipam::ops;
use crate::kube::conditions::{with_ready, Ready};
use crate::kube::meta::{remove_finalizer, rfc3339};
use crate::kube::object::WithJson;
use crate::kube::{self, Kube, Resource};
use crate::kv::Ctx;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::reconcile::{
    self, Cleanup, Condition, Handler, Order, Reason, Reconciled, StepResult, Verdict,
};

/// One claim's reconciliation: `ns/name`, read from the API server or,
/// on the first attempt, from a full reconcile's snapshot.
pub struct ClaimHandler<'c, 'k, 'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The store and environment.
    pub ctx: &'c Ctx<'c, K>,
    /// The API server.
    pub kube: &'k Kube<'a, H>,
    /// The claim's namespace.
    pub ns: &'c str,
    /// The claim's name.
    pub name: &'c str,
    /// A full reconcile's lists, read on the first attempt.
    pub snapshot: Option<&'c mut Snapshot>,
    /// Whether this attempt may read from the snapshot (set by
    /// [`Handler::read`]).
    pub first: bool,
    /// The finalizers of the claim's pool kind (set by [`Handler::parse`]:
    /// the in-cluster provider's on a taken-over kind, ours otherwise).
    pub finalizers: Finalizers,
    /// When the takeover gate said `serving`, on a taken-over kind (set by
    /// [`Handler::parse`]): the allocation must follow within
    /// [`takeover::GATE_FRESH_SECONDS`] (a hand-back counts on it).
    pub gated_at: Option<u64>,
}

/// What the handler works with: the claim as parsed,
/// and its pool's object once the pause check has read it.
pub struct Parsed {
    claim: Claim,
    pool: Option<PoolResource>,
}

impl<K: KvStore, H: HttpClient + ?Sized> ClaimHandler<'_, '_, '_, K, H> {
    fn reader(&mut self) -> Reader<'_, '_, '_, H> {
        let snap = if self.first {
            self.snapshot.as_deref_mut()
        } else {
            None
        };
        Reader {
            kube: self.kube,
            snap,
        }
    }
}

impl<K: KvStore, H: HttpClient + ?Sized> Handler<H> for ClaimHandler<'_, '_, '_, K, H> {
    type Object = WithJson<ClaimObject>;
    type Parsed = Parsed;
    /// The `addressRef` to write with `Ready=True`.
    type Status = Option<String>;
    const ORDER: Order = Order::PauseFirst;
    const NOUN: &'static str = "claim";
    const CLEANUP_NEEDS_FINALIZER: bool = true;

    fn kube(&self) -> &Kube<'_, H> {
        self.kube
    }
    fn resource(&self) -> &'static Resource {
        &kube::CLAIMS
    }
    fn finalizer(&self) -> Option<&'static str> {
        Some(self.finalizers.claim)
    }

    fn read(&mut self, first: bool) -> Result<Option<Self::Object>> {
        self.first = first;
        let (ns, name) = (self.ns, self.name);
        self.reader().claim(ns, name)
    }

    fn gone(&mut self) -> Result<Reconciled> {
        gone(self.ctx, self.kube, self.ns, self.name)
    }

    fn parse(&mut self, o: &Self::Object) -> Result<Result<Parsed, Verdict<Self::Status>>> {
        Ok(match Claim::parse(&o.json) {
            // The in-cluster provider's pools are served only while taken
            // over and fenced (capi::takeover); nothing is written before.
            Ok(claim) if !takeover::serves(self.ctx, self.kube, claim.pool.kind, false)? => Err(
                Verdict::answer(takeover::not_served(claim.pool.kind, "claim")),
            ),
            Ok(claim) => {
                self.finalizers = Finalizers::of(claim.pool.kind);
                self.gated_at = claim.pool.kind.is_in_cluster().then(|| self.ctx.env.now());
                Ok(Parsed { claim, pool: None })
            }
            Err(e) if e.is(Known::UnsupportedPoolRef) => Err(Verdict::just(
                StepResult::Ignored,
                "spec.poolRef is not served by metal-ipam",
            )),
            Err(e) => Err(Verdict::not_ready(
                Reason::AllocationFailed,
                e.to_string(),
                None,
            )),
        })
    }

    fn paused(&mut self, o: &Self::Object, p: &mut Parsed) -> Result<Option<Reconciled>> {
        if paused(&o.typed) {
            return Ok(Some(Reconciled::new(
                StepResult::Paused,
                "the claim is paused",
            )));
        }
        let ns = self.ns;
        if let Some(cluster) = &p.claim.cluster_name {
            match self.reader().cluster(ns, cluster)? {
                // A deleting claim proceeds: its Cluster may be gone first.
                None if !o.typed.metadata.deleting() => {
                    return Ok(Some(Reconciled::new(
                        StepResult::Waiting,
                        format!("Cluster {ns}/{cluster} does not exist"),
                    )))
                }
                Some(c) if c.is_paused() => {
                    return Ok(Some(Reconciled::new(
                        StepResult::Paused,
                        format!("Cluster {ns}/{cluster} is paused"),
                    )))
                }
                _ => {}
            }
        }
        // The pool's pause annotation is read from the API server (the
        // store's copy may lag behind); a pool registered only through the
        // HTTP API has no object there and is never paused.
        p.pool = self.reader().pool(&p.claim.pool)?;
        Ok(p.pool.as_ref().is_some_and(paused).then(|| {
            Reconciled::new(
                StepResult::Paused,
                format!("pool {} is paused", p.claim.pool.display()),
            )
        }))
    }

    fn cleanup(&mut self, o: &Self::Object, p: &Parsed) -> Result<Cleanup<Self::Status>> {
        finalize(
            self.ctx,
            self.kube,
            &p.claim,
            &o.typed,
            self.finalizers.address,
        )
    }

    fn apply(&mut self, _o: &Self::Object, p: Parsed) -> Result<Verdict<Self::Status>> {
        bind(self, p)
    }

    fn write_status(
        &mut self,
        o: &Self::Object,
        c: &Condition,
        s: &Option<String>,
    ) -> Result<bool> {
        let ready = Ready {
            status: c.ok,
            reason: c.reason.as_str(),
            message: &c.message,
            now: self.ctx.env.now(),
        };
        write_claim_status(self.kube, &o.typed, s.as_deref(), ready)
    }
}

/// The claim does not exist: release its binding (when it came from
/// Kubernetes) and clean up an orphaned `IPAddress`.
fn gone<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<Reconciled> {
    // Only bindings in pools that came from Kubernetes are judged against
    // the API server: a claim made through the plain HTTP API is released
    // only through the HTTP API (the events token must not reach it).
    let released = match ops::get_claim(ctx.kv, ns, name)? {
        Some(b) if b.pool_uid.is_some() => {
            match crate::provision::assign::release(ctx, ns, name, Some(&b.uid)) {
                Err(e) if e.is(Known::MetalAssignmentHeld) => return Ok(Reconciled::new(
                    StepResult::Waiting,
                    "the claim does not exist; its Metal assignment is removed first (assign step)",
                )
                .metal(true)),
                r => r?,
            }
        }
        Some(_) => return Ok(Reconciled::new(
            StepResult::Absent,
            "the claim does not exist; its binding was made through the HTTP API and is left alone",
        )),
        None => None,
    };
    cleanup_orphan_address(kube, ns, name, released.is_some())?;
    Ok(match released {
        Some(r) => Reconciled::new(StepResult::Released, "the claim no longer exists")
            .with_address(r.address),
        None => Reconciled::new(StepResult::Absent, "the claim does not exist"),
    })
}

/// The live claim: allocate (or adopt the address of its existing
/// `IPAddress`), create or complete the `IPAddress`, answer bound.
fn bind<K: KvStore, H: HttpClient + ?Sized>(
    h: &mut ClaimHandler<'_, '_, '_, K, H>,
    p: Parsed,
) -> Result<Verdict<Option<String>>> {
    let (kube, ns, name) = (h.kube, h.ns, h.name);
    let claim = p.claim;
    let Some(ip) = live_address(h, &claim)? else {
        return Err(Error::transient(
            Known::KubeConflict.as_str(),
            "the IPAddress is still being deleted",
        ));
    };
    let existing: Option<IpAddr> = ip
        .as_ref()
        .filter(|o| o.spec.pool_ref.as_ref() == Some(&claim.pool_ref))
        .and_then(|o| o.spec.ip());
    if h.gated_at
        .is_some_and(|t| h.ctx.env.now().saturating_sub(t) > takeover::GATE_FRESH_SECONDS)
    {
        return Err(Error::transient(
            "StepTooSlow",
            "this step took too long since it read its kind's takeover record; retry",
        ));
    }
    let allocated = match existing {
        Some(a) => ops::adopt(h.ctx, &claim, a),
        None => ops::allocate(h.ctx, &claim),
    };
    let record = match allocated {
        Ok(a) => a.record,
        Err(e) if !reconcile::is_verdict(e.kind()) => return Err(e),
        Err(e) => {
            let reason = match e.kind() {
                ErrorKind::NotFound => Reason::PoolNotReady,
                ErrorKind::Exhausted => Reason::PoolExhausted,
                _ => Reason::AllocationFailed,
            };
            let message = format!("{}: {}", reason.as_str(), e.message());
            return Ok(Verdict::not_ready(reason, e.message(), None)
                .map_outcome(|o| Reconciled { message, ..o }));
        }
    };
    let finalizer = h.finalizers.address;
    let want = record.to_ip_address(ns, name)?.with_finalizer(finalizer);
    match ip {
        None => {
            kube.create(&kube::IP_ADDRESSES, Some(ns), &want.to_json())?;
        }
        Some(o) => {
            if want.conflicts_with(&o) {
                let msg = format!(
                    "IPAddress {ns}/{name} exists with {} in another pool or with another address than the claim's {}",
                    if o.spec.address.is_empty() { "?" } else { &o.spec.address },
                    record.address
                );
                return Ok(Verdict::not_ready(Reason::AllocationFailed, msg, None));
            }
            if let Some(patch) = want.metadata_patch(&o, finalizer) {
                let m = &o.metadata;
                let ns = m.namespace.as_deref();
                kube.merge_patch(&kube::IP_ADDRESSES, ns, &m.name, false, &patch.to_json())?;
            }
        }
    }
    // A VRF-backed address pool's addresses are assigned to the claim's
    // device on Metal (assign step); a prefix pool's sub-prefixes are not:
    // Metal assigns addresses, and the node routes its sub-prefix itself
    // (docs/prefix-pools.md).
    let vrf_backed = p.pool.is_some_and(|p| p.vrf_backed) && !claim.pool.kind.is_prefix();
    let out = Reconciled::new(
        StepResult::Bound,
        format!("{ns}/{name} has {}", record.address),
    )
    .with_address(record.address)
    .metal(vrf_backed);
    Ok(Verdict::ready(
        Reason::AddressAllocated,
        Some(name.to_string()),
        out,
    ))
}

/// The claim's `IPAddress` as it should be worked on: an `IPAddress` being
/// deleted while its claim lives loses our finalizer first (it is then
/// re-created identically). `None` when it is still going after that.
fn live_address<K: KvStore, H: HttpClient + ?Sized>(
    h: &mut ClaimHandler<'_, '_, '_, K, H>,
    claim: &Claim,
) -> Result<Option<Option<IpAddressObject>>> {
    let (kube, ns, name) = (h.kube, h.ns, h.name);
    let mut ip = h.reader().address(ns, name)?;
    if let Some(o) = &ip {
        if o.metadata.deleting() && o.metadata.owned_by(&claim.id.uid) {
            remove_finalizer(kube, &kube::IP_ADDRESSES, o, h.finalizers.address)?;
            ip = kube.get_as(&kube::IP_ADDRESSES, Some(ns), name)?;
            if ip.as_ref().is_some_and(|o| o.metadata.deleting()) {
                return Ok(None);
            }
        }
    }
    Ok(Some(ip))
}

/// The deleting claim (holding our finalizer): its Metal assignment goes
/// first, then the address, then the `IPAddress`.
fn finalize<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    claim: &Claim,
    claim_obj: &ClaimObject,
    address_finalizer: &str,
) -> Result<Cleanup<Option<String>>> {
    let ns = claim.id.namespace.as_str();
    let name = claim.id.name.as_str();
    if claim_obj
        .metadata
        .has_finalizer(super::assign::ASSIGNMENT_FINALIZER)
    {
        return Ok(Cleanup::Pending(Verdict::answer(
            Reconciled::new(
                StepResult::Waiting,
                "the claim's Metal assignment is removed first (assign step)",
            )
            .metal(true),
        )));
    }
    let released = match crate::provision::assign::release(ctx, ns, name, Some(&claim.id.uid)) {
        // Deleted without the assignment finalizer while the record still
        // holds an assignment: the assign step removes it first.
        Err(e) if e.is(Known::MetalAssignmentHeld) => {
            let out = Reconciled::new(StepResult::Waiting, e.message().to_string()).metal(true);
            return Ok(Cleanup::Pending(Verdict::answer(out)));
        }
        r => r?,
    };
    let ip: Option<IpAddressObject> = kube.get_as(&kube::IP_ADDRESSES, Some(ns), name)?;
    if let Some(ip) = ip {
        if ip.metadata.owned_by(&claim.id.uid) || ip.metadata.has_finalizer(address_finalizer) {
            release_address_object(kube, &ip, address_finalizer)?;
        }
    }
    let mut out = Reconciled::new(StepResult::Released, format!("{ns}/{name} released"));
    if let Some(r) = released {
        out = out.with_address(r.address);
    }
    Ok(Cleanup::Done(out))
}

/// The `IPAddress` of a claim that no longer exists: ours (our finalizer)
/// goes; one with the in-cluster provider's finalizer goes only when this
/// step released its binding (`released`: its kind is taken over and the
/// address was ours to serve), otherwise it is the in-cluster provider's.
fn cleanup_orphan_address<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    released: bool,
) -> Result<()> {
    let ip: Option<IpAddressObject> = kube.get_as(&kube::IP_ADDRESSES, Some(ns), name)?;
    let Some(ip) = ip else { return Ok(()) };
    if ip.metadata.has_finalizer(ADDRESS_FINALIZER) {
        return release_address_object(kube, &ip, ADDRESS_FINALIZER);
    }
    let theirs = takeover::IN_CLUSTER_ADDRESS_FINALIZER;
    if released && ip.metadata.has_finalizer(theirs) {
        return release_address_object(kube, &ip, theirs);
    }
    Ok(())
}

/// Removes `finalizer` (ours, or the in-cluster provider's on a taken-over
/// kind) from an `IPAddress` and deletes it unless it is already going.
pub(super) fn release_address_object<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ip: &IpAddressObject,
    finalizer: &str,
) -> Result<()> {
    let remaining = remove_finalizer(kube, &kube::IP_ADDRESSES, ip, finalizer)?;
    if remaining.is_some_and(|o| !o.metadata.deleting()) {
        let m = &ip.metadata;
        kube.delete(&kube::IP_ADDRESSES, m.namespace.as_deref(), &m.name)?;
    }
    Ok(())
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
    let current_ref = claim.status.address_ref.as_ref().map(|r| r.name.as_str());
    let ref_changed = address_ref.is_some() && current_ref != address_ref;
    if !cond_changed && !ref_changed {
        return Ok(false);
    }
    let mut st = Map::new();
    st.insert("conditions".into(), Value::Array(conditions));
    st.insert(
        "deprecated".into(),
        json!({"v1beta1": {"conditions": [v1beta1_ready(cond)]}}),
    );
    if let Some(a) = address_ref {
        st.insert("addressRef".into(), json!({"name": a}));
    }
    let patch = json!({"metadata": {"resourceVersion": m.resource_version_json()}, "status": Value::Object(st)});
    kube.merge_patch(&kube::CLAIMS, m.namespace.as_deref(), &m.name, true, &patch)?;
    Ok(true)
}

/// The deprecated v1beta1 `Ready` condition: status, reason, message,
/// lastTransitionTime, and a severity when not True.
fn v1beta1_ready(c: Ready<'_>) -> Value {
    let mut old = json!({"type": "Ready", "status": if c.status { "True" } else { "False" }, "lastTransitionTime": rfc3339(c.now)});
    if !c.status {
        old["severity"] = "Warning".into();
        old["reason"] = c.reason.into();
        old["message"] = c.message.into();
    }
    old
}
