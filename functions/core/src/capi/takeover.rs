//! Taking over the in-cluster IPAM provider's pools, and handing them back.
//!
//! Owns the takeover record of a kind (`takeover/<Kind>`), the fence that
//! keeps a claim from being served by both providers, the import of a
//! kind's pools with the `IPAddress` objects the in-cluster provider wrote,
//! and the hand-back that forgets them again. docs/takeover.md is the
//! operator's procedure.
//!
//! # The fence
//! metal-ipam serves claims of a taken-over kind only while
//! 1. the kind's record says `serving` (written by `POST /v1/takeover/{kind}`
//!    after the import, removed by `DELETE`), and
//! 2. the in-cluster provider's Deployment (named in the record) has no
//!    replica, desired or running (`spec.replicas` and `status.replicas`
//!    both 0, or the Deployment does not exist).
//!
//! Both are checked before anything is written for a claim or a pool of
//! the kind (one `get` of the record, one `GET` of the Deployment); a
//! Deployment with replicas refuses with 409 `InClusterProviderActive`
//! naming it. While taken over, claims and their `IPAddress`es keep the
//! in-cluster provider's finalizers ([`Finalizers::of`]), ownerReferences
//! and labels, and pools their status in its schema, so a hand-back needs
//! no rewrite: the in-cluster provider derives its state from the
//! `IPAddress` objects alone.
//!
//! # The record
//! One key per kind, written whole (`set`) by the takeover routes only,
//! read by every claim and pool step of the kind. The states are
//! `importing` (pools being imported, nothing served), `serving` and
//! `returning` (a hand-back under way, nothing served); the key's absence
//! is "not taken over". Why a plain write suffices is argued in
//! kv-schema/README.md ("Takeover records").

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{Error, ErrorKind, Known, Result};
use crate::ipam::alloc::{IntentKind, TAKEOVER_AFTER_SECONDS, WRITE_DEADLINE_SECONDS};
use crate::ipam::claim::Claim;
use crate::ipam::ops;
use crate::ipam::pool::{PoolId, PoolKind};
use crate::ipam::store::{self, ClaimRecord};
use crate::kube::object::{metadata, Object, ObjectMeta};
use crate::kube::{self, Kube};
use crate::kv::{keys, Ctx};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;

use super::{objects::PoolResource, Reconciled};

/// The in-cluster provider's claim finalizer.
pub const IN_CLUSTER_CLAIM_FINALIZER: &str = "ipam.cluster.x-k8s.io/ReleaseAddress";
/// The in-cluster provider's `IPAddress` finalizer.
pub const IN_CLUSTER_ADDRESS_FINALIZER: &str = "ipam.cluster.x-k8s.io/ProtectAddress";
/// The in-cluster provider's pool finalizer.
pub const IN_CLUSTER_POOL_FINALIZER: &str = "ipam.cluster.x-k8s.io/ProtectPool";
/// Where clusterctl installs the in-cluster provider's controller.
pub const DEFAULT_DEPLOYMENT_NAMESPACE: &str = "capi-ipam-in-cluster-system";
/// The in-cluster provider's controller Deployment.
pub const DEFAULT_DEPLOYMENT_NAME: &str = "capi-ipam-in-cluster-controller-manager";

/// The finalizers a pool kind's objects carry: ours on our kinds, the
/// in-cluster provider's on its kinds (so either provider can finish what
/// the other started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finalizers {
    /// On a claim, released before it goes.
    pub claim: &'static str,
    /// On an `IPAddress`, kept while its claim lives.
    pub address: &'static str,
    /// On a pool, kept while addresses are allocated from it.
    pub pool: &'static str,
}

impl Finalizers {
    /// The finalizers of `kind`'s objects.
    ///
    /// ```
    /// use metal_ipam_core::capi::takeover::Finalizers;
    /// use metal_ipam_core::ipam::pool::PoolKind;
    /// assert_eq!(Finalizers::of(PoolKind::Global).claim, "ipam.metal-ipam.dev/release-address");
    /// assert_eq!(Finalizers::of(PoolKind::InCluster).address, "ipam.cluster.x-k8s.io/ProtectAddress");
    /// ```
    pub fn of(kind: PoolKind) -> Finalizers {
        if kind.is_in_cluster() {
            Finalizers {
                claim: IN_CLUSTER_CLAIM_FINALIZER,
                address: IN_CLUSTER_ADDRESS_FINALIZER,
                pool: IN_CLUSTER_POOL_FINALIZER,
            }
        } else {
            Finalizers {
                claim: super::CLAIM_FINALIZER,
                address: super::ADDRESS_FINALIZER,
                pool: super::POOL_FINALIZER,
            }
        }
    }
}

/// Where a takeover stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The kind's pools are being imported; nothing is served yet.
    Importing,
    /// metal-ipam serves the kind's claims and pools.
    Serving,
    /// A hand-back is under way; nothing is served.
    Returning,
}

/// The in-cluster provider's controller, whose replicas fence a takeover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl Default for DeploymentRef {
    fn default() -> Self {
        DeploymentRef {
            namespace: DEFAULT_DEPLOYMENT_NAMESPACE.into(),
            name: DEFAULT_DEPLOYMENT_NAME.into(),
        }
    }
}

impl DeploymentRef {
    /// `namespace/name`.
    pub fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A kind's takeover record, as stored at `takeover/<Kind>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TakeoverRecord {
    /// The kind's name (`InClusterIPPool`, …).
    pub kind: String,
    /// Where it stands.
    pub state: State,
    /// Unix seconds of the last state change.
    pub since: u64,
    /// The Deployment that must stay at zero replicas.
    pub deployment: DeploymentRef,
}

impl TakeoverRecord {
    /// As the routes answer it.
    pub fn to_json(&self) -> Value {
        json!({"kind": self.kind, "state": self.state, "since": self.since,
            "deployment": self.deployment.display()})
    }
}

/// The record of `kind`, if any.
///
/// # Errors
/// Store failures (503); a record that does not load (500, naming its key).
pub fn record<K: KvStore>(kv: &K, kind: PoolKind) -> Result<Option<TakeoverRecord>> {
    let key = keys::takeover(kind.kind_name());
    let Some(bytes) = kv.get(&key)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::internal(format!("{key} does not load: {e}")))
}

fn write<K: KvStore>(ctx: &Ctx<'_, K>, rec: &mut TakeoverRecord, state: State) -> Result<()> {
    rec.state = state;
    rec.since = ctx.env.now();
    let bytes = serde_json::to_vec(rec).map_err(|e| Error::internal(e.to_string()))?;
    ctx.kv.set(&keys::takeover(&rec.kind), &bytes)?;
    Ok(())
}

/// A `Deployment` as the fence reads it: desired and running replicas.
struct Deployment {
    metadata: ObjectMeta,
    desired: i64,
    running: i64,
}

impl Object for Deployment {
    fn from_json(v: &Value) -> Self {
        let int = |p: &str| v.pointer(p).and_then(Value::as_i64);
        Deployment {
            metadata: metadata(v),
            // The API server defaults an absent spec.replicas to 1.
            desired: int("/spec/replicas").unwrap_or(1),
            running: int("/status/replicas").unwrap_or(0),
        }
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// The fence: `Ok` when the in-cluster provider's Deployment has no
/// replica, desired or running (or does not exist).
///
/// # Errors
/// 409 `InClusterProviderActive` naming the Deployment and its replicas;
/// API server errors.
pub fn check_fence<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    kind: PoolKind,
    d: &DeploymentRef,
) -> Result<()> {
    let found: Option<Deployment> = kube.get_as(&kube::DEPLOYMENTS, Some(&d.namespace), &d.name)?;
    match found {
        Some(dep) if dep.desired > 0 || dep.running > 0 => Err(Error::conflict(
            Known::InClusterProviderActive.as_str(),
            format!(
                "the in-cluster provider's Deployment {} has {} desired and {} running replicas: metal-ipam serves {} pools only while it is scaled to 0 (kubectl -n {} scale deployment {} --replicas=0), or hand the kind back (DELETE /v1/takeover/{})",
                d.display(), dep.desired, dep.running, kind.kind_name(), d.namespace, d.name, kind.kind_name()
            ),
        )),
        _ => Ok(()),
    }
}

/// Whether metal-ipam serves objects of `kind` now: always for our kinds;
/// for the in-cluster provider's, only while taken over (`serving`, or
/// `importing` when `importing_too`: the import's own pool syncs) and
/// fenced.
///
/// # Errors
/// 409 `InClusterProviderActive` when taken over but the in-cluster
/// provider runs; store and API server errors.
pub fn serves<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    kind: PoolKind,
    importing_too: bool,
) -> Result<bool> {
    if !kind.is_in_cluster() {
        return Ok(true);
    }
    let Some(rec) = record(ctx.kv, kind)? else {
        return Ok(false);
    };
    let live = rec.state == State::Serving || (importing_too && rec.state == State::Importing);
    if live {
        check_fence(kube, kind, &rec.deployment)?;
    }
    Ok(live)
}

/// The answer of a step on an object of a kind metal-ipam does not serve
/// now.
pub fn not_served(kind: PoolKind, what: &str) -> Reconciled {
    Reconciled::new(
        crate::reconcile::StepResult::Ignored,
        format!(
            "{what}: {} pools are the in-cluster provider's (not taken over: POST /v1/takeover/{})",
            kind.kind_name(),
            kind.kind_name()
        ),
    )
}

/// What a takeover or a hand-back did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TakeoverReport {
    /// The record after the step (`None`: not taken over).
    pub record: Option<TakeoverRecord>,
    /// Pools imported (takeover) or forgotten (hand-back), by id.
    pub pools: Vec<String>,
    /// Bindings imported or forgotten.
    pub addresses: usize,
    /// Pools that could not be imported, each with why.
    pub errors: Vec<String>,
}

impl TakeoverReport {
    /// As the routes answer it.
    pub fn to_json(&self, kind: PoolKind) -> Value {
        let state = self
            .record
            .as_ref()
            .map_or(json!("not-taken-over"), |r| json!(r.state));
        json!({
            "kind": kind.kind_name(),
            "state": state,
            "record": self.record.as_ref().map(TakeoverRecord::to_json),
            "pools": self.pools,
            "addresses": self.addresses,
            "errors": self.errors,
        })
    }
}

/// Takes `kind` over: checks the fence, forgets what an earlier,
/// unfinished takeover left in the store, imports every pool of the kind
/// with the addresses its `IPAddress` objects hold (each stays with its
/// claim), then serves the kind.
///
/// # Idempotency
/// A kind already `serving` is answered as it is (nothing re-imported:
/// claims are being served from the store); an `importing` one is imported
/// again from scratch.
///
/// # Errors
/// 409 `InClusterProviderActive` (nothing written); 409 `TakeoverIncomplete`
/// when a pool could not be imported (the kind stays `importing`, nothing
/// served; the answer lists each pool and why); 409 `HandBackInProgress`
/// during a hand-back; store and API server errors.
pub fn take_over<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    kind: PoolKind,
    deployment: DeploymentRef,
) -> Result<TakeoverReport> {
    let existing = record(ctx.kv, kind)?;
    let deployment = match &existing {
        Some(r) if r.state == State::Returning => {
            return Err(Error::conflict(
                Known::HandBackInProgress.as_str(),
                format!(
                    "{} is being handed back: finish with DELETE /v1/takeover/{} first",
                    kind.kind_name(),
                    kind.kind_name()
                ),
            ))
        }
        Some(r) if r.state == State::Serving => {
            check_fence(kube, kind, &r.deployment)?;
            return Ok(TakeoverReport {
                record: existing,
                ..TakeoverReport::default()
            });
        }
        Some(r) => r.deployment.clone(),
        None => deployment,
    };
    check_fence(kube, kind, &deployment)?;
    let mut rec = TakeoverRecord {
        kind: kind.kind_name().to_string(),
        state: State::Importing,
        since: 0,
        deployment,
    };
    write(ctx, &mut rec, State::Importing)?;
    let mut report = TakeoverReport::default();
    // What an earlier import left: rebuilt from the objects, not trusted.
    forget_pools(ctx, kind, &mut TakeoverReport::default())?;
    for p in kube.list_as::<PoolResource>(kind.resource(), None)? {
        let m = &p.metadata;
        if m.name.is_empty() {
            continue;
        }
        let id = PoolId::of(kind, m.namespace.as_deref().unwrap_or_default(), &m.name);
        match super::sync_pool(ctx, kube, &id) {
            Ok(o) if o.result == crate::reconcile::StepResult::Synced => {
                report.addresses += ops::get_pool(ctx.kv, &id, ctx.env.now())?
                    .map_or(0, |v| usize::try_from(v.counts.used).unwrap_or(usize::MAX));
                report.pools.push(id.display());
            }
            Ok(o) => report
                .errors
                .push(format!("{}: {}", id.display(), o.message)),
            Err(e) => report.errors.push(format!("{}: {e}", id.display())),
        }
    }
    if !report.errors.is_empty() {
        return Err(Error::conflict(
            Known::TakeoverIncomplete.as_str(),
            format!(
                "{} stays importing (nothing served) because pools could not be imported: {}",
                kind.kind_name(),
                report.errors.join("; ")
            ),
        ));
    }
    write(ctx, &mut rec, State::Serving)?;
    report.record = Some(rec);
    Ok(report)
}

/// How long a hand-back waits, after it stopped serving the kind, before it
/// forgets the kind's pools: a claim step that read `serving` before has
/// made its pool decision by then (it decides within
/// [`GATE_FRESH_SECONDS`] of its read, or not at all).
pub const QUIET_SECONDS: u64 = TAKEOVER_AFTER_SECONDS;

/// How long after reading `serving` a claim step may still make its pool
/// decision; a slower one answers 503 and its retry reads the record again.
pub const GATE_FRESH_SECONDS: u64 = WRITE_DEADLINE_SECONDS;

/// Hands `kind` back, in two calls: the first stops serving it (the record
/// says `returning`) and answers when to call again; once
/// [`QUIET_SECONDS`] have passed, the next forgets the kind's pools and
/// their bindings in the store (nothing is written to Kubernetes: the
/// `IPAddress` objects, with the in-cluster provider's finalizers, are its
/// state) and removes the record. The in-cluster provider may be scaled up
/// after that answer. Forgetting frees no address to anyone: nothing
/// allocates in the kind's pools any more.
///
/// # Idempotency
/// A kind not taken over is answered as it is; a hand-back cut short
/// (`returning`) is finished by the next call.
///
/// # Errors
/// 409 `AddressesCooling` while a released address of the kind's pools is
/// in its reuse grace period (the in-cluster provider would not know it;
/// the message says until when); 503 `HandBackRetry` while an allocation
/// cut short must be finished first; store errors.
pub fn hand_back<K: KvStore>(ctx: &Ctx<'_, K>, kind: PoolKind) -> Result<TakeoverReport> {
    let Some(mut rec) = record(ctx.kv, kind)? else {
        return Ok(TakeoverReport::default());
    };
    let now = ctx.env.now();
    cooling_until(ctx, kind, now)?;
    if rec.state != State::Returning {
        write(ctx, &mut rec, State::Returning)?;
    }
    if now < rec.since + QUIET_SECONDS {
        return Ok(TakeoverReport {
            record: Some(rec),
            ..TakeoverReport::default()
        });
    }
    let mut report = TakeoverReport::default();
    forget_pools(ctx, kind, &mut report)?;
    ctx.kv.delete(&keys::takeover(kind.kind_name()))?;
    Ok(report)
}

/// Refuses while a released address of `kind`'s pools is cooling.
fn cooling_until<K: KvStore>(ctx: &Ctx<'_, K>, kind: PoolKind, now: u64) -> Result<()> {
    let mut until = None;
    for v in ops::list_pools_in(ctx, Some(kind))?.pools {
        if let Some(l) = store::read_pool(ctx.kv, &v.object.id)? {
            let last = l
                .state
                .cooling
                .iter()
                .map(|c| c.until)
                .filter(|u| *u > now)
                .max();
            until = until.max(last);
        }
    }
    match until {
        None => Ok(()),
        Some(until) => Err(Error::conflict(
            Known::AddressesCooling.as_str(),
            format!(
                "released addresses of {} pools are in their reuse grace period until {} (unix seconds): the in-cluster provider would hand them out at once; hand back after that",
                kind.kind_name(),
                until
            ),
        )),
    }
}

/// Finishes the `Bind` intents pool `id`'s record holds: an allocation
/// whose request gave up after its pool write (crash, deadline) is taken
/// over as the claim's own retry would (`ops::allocate`, which writes the
/// binding), so that the release after it finds the binding. A live one
/// (its request still working) asks to be called again.
///
/// # Errors
/// 503 `HandBackRetry` while an allocation in the pool is in flight; store
/// errors.
fn finish_binds<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<()> {
    let Some(l) = store::read_pool(ctx.kv, id).ok().flatten() else {
        return Ok(());
    };
    let now = ctx.env.now();
    for i in l
        .state
        .intents
        .iter()
        .filter(|i| i.kind == IntentKind::Bind)
    {
        let Some((ns, name)) = i.claim.split_once('/') else {
            continue;
        };
        // Done: its binding is written (the intent stays in the record until
        // a later decision confirms it).
        let written = ctx.kv.get(&keys::claim(ns, name))?;
        if written
            .and_then(|b| ClaimRecord::decode(&b).ok())
            .is_some_and(|b| b.token == i.token)
        {
            continue;
        }
        if now.saturating_sub(i.at) < TAKEOVER_AFTER_SECONDS {
            return Err(Error::new(
                ErrorKind::Transient,
                "HandBackRetry",
                format!(
                    "an allocation for {} in pool {} is in flight: call again in {TAKEOVER_AFTER_SECONDS} s",
                    i.claim,
                    id.display()
                ),
            ));
        }
        let claim = Claim::parse(&json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
            "metadata": {"namespace": ns, "name": name, "uid": i.uid},
            "spec": {"poolRef": {"apiGroup": id.kind.group(), "kind": id.kind.kind_name(), "name": id.name}},
        }))?;
        ops::allocate(ctx, &claim)?;
    }
    Ok(())
}

/// Forgets every pool of `kind` in the store: each binding released, then
/// the pool deleted (a tombstone), through the allocator's own steps, then
/// any binding key still naming it (left by a release cut short) deleted.
/// Two listings of the store's keys per pool: a hand-back is an operator's
/// rare step.
fn forget_pools<K: KvStore>(
    ctx: &Ctx<'_, K>,
    kind: PoolKind,
    report: &mut TakeoverReport,
) -> Result<()> {
    let listing = ops::list_pools_in(ctx, Some(kind))?;
    let ids = listing
        .pools
        .iter()
        .map(|v| v.object.id.clone())
        .chain(listing.unreadable.iter().map(|(id, _)| id.clone()));
    for id in ids {
        finish_binds(ctx, &id)?;
        for (ns, name, b) in ops::bindings_of_pool(ctx.kv, &id)? {
            if crate::provision::assign::release(ctx, &ns, &name, Some(&b.uid))?.is_some() {
                report.addresses += 1;
            }
        }
        match ops::delete_pool(ctx, &id) {
            Ok(_) => {
                // A release whose request crashed after its pool write
                // leaves its binding key for the intent's owner, which is
                // gone; the tombstone ends the pool's intents, so the key
                // goes here (no request can bind in a deleted pool, and a
                // new takeover waits for this hand-back to finish).
                for (ns, name, _) in ops::bindings_of_pool(ctx.kv, &id)? {
                    ctx.kv.delete(&keys::claim(&ns, &name))?;
                }
                report.pools.push(id.display());
            }
            // A claim bound between the listing and the deletion (the
            // kind was serving until just now): the next call finishes.
            Err(e) if e.is(Known::PoolInUse) => {
                return Err(Error::new(
                    ErrorKind::Transient,
                    "HandBackRetry",
                    format!(
                        "pool {} still has bindings ({}): call again",
                        id.display(),
                        e.message()
                    ),
                ))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
