//! Full reconciliation: converge the store and the Kubernetes API both ways.
//!
//! Event forwarders drop events (Knative sends none for objects that
//! existed before it started; every forwarder gives up after a few
//! retries), so `POST /v1/reconcile` runs periodically (a CronJob). It:
//! 1. lists every pool (paginated; the in-cluster provider's kinds only
//!    while taken over, `capi::takeover`) and syncs it — a pool the store does not
//!    know (first install, store lost, `clusterctl move`) is registered
//!    together with the addresses its existing `IPAddress` objects hold, so
//!    no address already handed out changes;
//! 2. lists every claim and reconciles each (allocates for unbound claims,
//!    re-creates missing `IPAddress` objects, finishes deletions);
//! 3. releases bindings whose claim no longer exists (or was re-created
//!    with another uid) after re-reading that claim, in pools that came from
//!    Kubernetes (pools registered only through the HTTP API are left
//!    alone), and never while an `IPAddress` holds the address;
//! 4. reclaims leaked addresses: used in a pool record but held by no
//!    binding, no intent and no `IPAddress` (left by versions before
//!    intents, or by a store edited by hand);
//!
//!    steps 3 and 4 look only at each pool's *candidates* (addresses in
//!    use, not cooling, held by no `IPAddress`: none in the usual CAPI
//!    state) and find their holders through the holder index
//!    (`ipam::holders`), never by listing the store; a pool written before
//!    the index is indexed first (`ipam::holders::index_holders`, one
//!    listing of the claim keys, once per pool);
//! 5. lists the Machines to sync: every one opted into a network profile,
//!    or on a device with our apply record (the `reconcile` component
//!    forwards each to the `network` step, which converges it); and deletes
//!    the profile claims of Machines that are neither
//!    ([`crate::capi::network::machines_to_sync`]).
//!
//! It reports what it changed; errors on single objects are collected and
//! reported without stopping the run.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::capi::objects::PoolResource;
use crate::capi::{self, ClaimAnswer, Reconciled};
use crate::error::{Known, Result};
use crate::ip::{from_u128, to_u128};
use crate::ipam::claim::{ClaimObject, IpAddressObject};
use crate::ipam::holders;
use crate::ipam::ops;
use crate::ipam::pool::{PoolId, PoolKind};
use crate::ipam::store::{self, ClaimRecord, Loaded, Next};
use crate::kube::object::{Meta, Object, WithJson};
use crate::kube::{self, Kube};
use crate::kv::{keys, Ctx, Decision};
use crate::observe::summary::{self, PoolName, Summary, Waiting};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;

/// What a full reconciliation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Pool outcomes by result (`synced`, `failed`, …).
    pub pools: BTreeMap<String, u32>,
    /// Claim outcomes by result (`bound`, `waiting`, …).
    pub claims: BTreeMap<String, u32>,
    /// Bindings released because their claim is gone.
    pub bindings_released: u32,
    /// Leaked addresses returned to their pool.
    pub leaks_reclaimed: u32,
    /// Pool index entries removed by the tidy (their pool was gone: a
    /// deletion whose settle did not run, a grant that was never used).
    pub index_entries_removed: usize,
    /// Tombstones of pools deleted a day ago or more, removed with their
    /// creation guards.
    pub tombstones_removed: usize,
    /// Per-object errors (`kind ns/name: message`).
    pub errors: Vec<String>,
    /// Requests sent to the API server.
    pub kube_calls: u32,
    /// VRF-backed pools (`spec.metal`) found: the `provision` step syncs
    /// them (the `reconcile` component forwards each to it).
    pub vrf_pools: Vec<PoolId>,
    /// Claims in VRF-backed pools: the `assign` step keeps their Metal
    /// assignments (the `reconcile` component forwards each to it).
    pub metal_claims: Vec<(String, String)>,
    /// Machines whose network the `network` step converges (the
    /// `reconcile` component forwards each to it).
    pub machines: Vec<(String, String)>,
    /// Profile claims deleted of Machines no longer opted in.
    pub network_claims_deleted: u32,
    /// Claims left waiting or failed, by their pool (`poolRef` kind,
    /// namespace — empty for a cluster-wide kind — and name) and the reason
    /// of their `Ready=False` condition: the observation summary's
    /// `waiting` (`observe::summary`).
    pub waiting: BTreeMap<(String, String, String, String), u32>,
    /// The Machines to sync as the observation summary lists them (the
    /// `reconcile` component fills in each one's phase from the network
    /// step's answer).
    pub machine_rows: Vec<summary::MachineRow>,
}

impl ReconcileReport {
    /// As JSON, the body of `POST /v1/reconcile`.
    pub fn to_json(&self) -> Value {
        json!({
            "pools": self.pools,
            "claims": self.claims,
            "bindingsReleased": self.bindings_released,
            "leaksReclaimed": self.leaks_reclaimed,
            "indexEntriesRemoved": self.index_entries_removed,
            "tombstonesRemoved": self.tombstones_removed,
            "networkClaimsDeleted": self.network_claims_deleted,
            "errors": self.errors,
            "kubeCalls": self.kube_calls,
        })
    }

    /// The observation summary of this run (`observe::summary`), ended at
    /// `now` after `duration_ms`: the claims waiting, the Machines with the
    /// phase the network step answered for each (`network`: the
    /// `{"machine", "status", "result"}` entries of the run's answer; a
    /// Machine without an answer, or with an error status, is `error`),
    /// and the open Metal assignment records by state (read through their
    /// index, `provision::assign::list_open`, which unlists closed ones).
    ///
    /// # Errors
    /// The store failed reading the assignment records.
    pub fn summary<K: KvStore>(
        &self,
        ctx: &Ctx<'_, K>,
        network: &[Value],
        now: u64,
        duration_ms: u64,
    ) -> Result<Summary> {
        let mut assignments: BTreeMap<String, u32> = BTreeMap::new();
        for (_, a) in crate::provision::assign::list_open(ctx)? {
            *assignments
                .entry(a.state_name(now).to_string())
                .or_default() += 1;
        }
        let answers: BTreeMap<&str, &Value> = network
            .iter()
            .filter_map(|e| Some((e["machine"].as_str()?, e)))
            .collect();
        let mut machines = self.machine_rows.clone();
        for row in &mut machines {
            let answer = answers.get(format!("{}/{}", row.namespace, row.name).as_str());
            let ok = answer.is_some_and(|a| a["status"].as_u64().is_some_and(|s| s < 400));
            row.phase = match answer.and_then(|a| a["result"].as_str()) {
                Some(r) if ok => r.to_string(),
                _ => "error".to_string(),
            };
            if !ok && row.error.is_none() {
                row.error = answer
                    .and_then(|a| a["reason"].as_str())
                    .map(str::to_string)
                    .or_else(|| Some("no answer from the network step".to_string()));
            }
        }
        let omitted = machines.len().saturating_sub(summary::MAX_MACHINES);
        machines.truncate(summary::MAX_MACHINES);
        Ok(Summary {
            v: summary::SUMMARY_VERSION,
            at: now,
            duration_ms,
            errors: u32::try_from(self.errors.len()).unwrap_or(u32::MAX),
            waiting: self
                .waiting
                .iter()
                .map(|((kind, namespace, name, reason), n)| Waiting {
                    pool: PoolName {
                        kind: kind.clone(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                    },
                    reason: reason.clone(),
                    count: *n,
                })
                .collect(),
            machines,
            machines_omitted: u32::try_from(omitted).unwrap_or(u32::MAX),
            assignments,
        })
    }

    fn count(map: &mut BTreeMap<String, u32>, o: &Reconciled) {
        *map.entry(o.result.as_str().to_string()).or_default() += 1;
    }
}

/// Runs a full reconciliation (see the module docs).
///
/// # Idempotency
/// A second run right after the first changes nothing and reports only
/// steady-state outcomes (`synced`, `bound`, …).
///
/// # Errors
/// Only when the API server cannot be listed at all (503/500) or the store
/// fails; errors on single objects go into [`ReconcileReport::errors`].
pub fn reconcile_all<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
) -> Result<ReconcileReport> {
    let before = kube.calls();
    let mut report = ReconcileReport::default();
    let pool_objects = sync_pools(ctx, kube, &mut report)?;
    let claims = reconcile_claims(ctx, kube, pool_objects, &mut report)?;
    // Pools that came from Kubernetes carry its uid; pools registered
    // through the plain HTTP API do not, and their bindings are not ours to
    // judge against the API server.
    // The pool index against the records (what crashes left: an entry of
    // a deleted pool, an expired grant, a finished teardown's listing).
    let provisioning = |id: &PoolId| -> Result<bool> {
        Ok(crate::provision::record::read_state(ctx.kv, id)?.is_some_and(|p| !p.deleted))
    };
    match crate::ipam::index::tidy(ctx, &provisioning) {
        Ok(t) => report.index_entries_removed += t.removed,
        Err(e) => report.errors.push(format!("pool index: {e}")),
    }
    // Tombstones of pools deleted a day ago or more go.
    match crate::ipam::index::collect(ctx) {
        Ok(c) => report.tombstones_removed += c.removed,
        Err(e) => report.errors.push(format!("pool index: {e}")),
    }
    let listing = ops::list_pools(ctx.kv, None, ctx.env.now())?;
    for (id, why) in &listing.unreadable {
        report.errors.push(format!(
            "pool {}: {why} (PUT or re-apply the pool to rebuild it)",
            id.display()
        ));
    }
    let pools = listing.pools;
    let managed: BTreeSet<PoolId> = pools
        .iter()
        .filter(|v| v.object.uid().is_some())
        .map(|v| v.object.id.clone())
        .collect();
    let loaded = indexed_pools(ctx, &pools, &mut report);
    release_stale(ctx, kube, &managed, &claims, &loaded, &mut report);
    let mut in_use = claims.in_use;
    for l in &loaded {
        let id = l.object.id.clone();
        let holding = in_use.remove(&id).unwrap_or_default();
        match reclaim_leaks(ctx, &id, &holding) {
            Ok(n) => report.leaks_reclaimed += n,
            Err(e) => report.errors.push(format!("pool {}: {e}", id.display())),
        }
    }
    // Claims of VRF-backed pools whose open assignment record their index
    // misses (a crash in a race, an older build's record): listed again.
    if let Err(e) = crate::provision::assign::relist(ctx, &report.metal_claims) {
        report.errors.push(format!("Metal assignment index: {e}"));
    }
    // Machines: those to sync, from the claims listed above.
    let listed = claims.snapshot.claims.values().map(|c| c.meta());
    match capi::network::machines_to_sync(ctx, kube, listed) {
        Ok(m) => {
            report.machines = m.machines;
            report.machine_rows = m.rows;
            report.network_claims_deleted = u32::try_from(m.claims_deleted).unwrap_or(u32::MAX);
        }
        Err(e) => report.errors.push(format!("Machines (network): {e}")),
    }
    report.kube_calls = kube.calls() - before;
    Ok(report)
}

/// Decision 1: every pool listed and synced; the listed objects by id.
fn sync_pools<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    report: &mut ReconcileReport,
) -> Result<BTreeMap<PoolId, PoolResource>> {
    let mut pool_objects: BTreeMap<PoolId, PoolResource> = BTreeMap::new();
    // The in-cluster provider's kinds only while taken over (their CRDs
    // need not even exist otherwise).
    let mut kinds = PoolKind::ALL.to_vec();
    for kind in PoolKind::IN_CLUSTER {
        match capi::takeover::record(ctx.kv, kind) {
            Ok(Some(r)) if r.state == capi::takeover::State::Serving => kinds.push(kind),
            Ok(_) => {}
            Err(e) => report
                .errors
                .push(format!("takeover of {}: {e}", kind.kind_name())),
        }
    }
    for kind in kinds {
        for p in kube.list_as::<PoolResource>(kind.resource(), None)? {
            let m = &p.metadata;
            if m.name.is_empty() {
                continue;
            }
            let id = capi::pool_id_of(kind, m.namespace.as_deref(), &m.name);
            if p.vrf_backed {
                report.vrf_pools.push(id.clone());
            }
            match capi::sync_pool(ctx, kube, &id) {
                Ok(o) => ReconcileReport::count(&mut report.pools, &o),
                Err(e) => report
                    .errors
                    .push(format!("{} {}: {e}", kind.kind_name(), id.display())),
            }
            pool_objects.insert(id, p);
        }
    }
    Ok(pool_objects)
}

/// What the claim lists showed.
struct Listed {
    /// The lists, as the claims' first attempts read them.
    snapshot: capi::Snapshot,
    /// (namespace, name, uid) of every live claim.
    live: BTreeSet<(String, String, String)>,
    /// Addresses that `IPAddress` objects hold, by pool: reconcile never
    /// frees one of them (neither as a stale binding nor as a leak).
    in_use: BTreeMap<PoolId, BTreeSet<u128>>,
}

/// Decision 2: every claim listed and reconciled (one list of claims and one
/// of `IPAddress`es serve every claim's first attempt; a conflict makes
/// that claim's retry read fresh).
fn reconcile_claims<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    pool_objects: BTreeMap<PoolId, PoolResource>,
    report: &mut ReconcileReport,
) -> Result<Listed> {
    let claims: Vec<WithJson<ClaimObject>> = kube.list_as(&kube::CLAIMS, None)?;
    let addresses: Vec<IpAddressObject> = kube.list_as(&kube::IP_ADDRESSES, None)?;
    let mut live: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut names = Vec::new();
    for c in &claims {
        let m = c.meta();
        let (Some(ns), Some(uid)) = (m.namespace.clone(), m.uid.clone()) else {
            continue;
        };
        if m.name.is_empty() {
            continue;
        }
        live.insert((ns.clone(), m.name.clone(), uid));
        names.push((ns, m.name.clone()));
    }
    let mut in_use: BTreeMap<PoolId, BTreeSet<u128>> = BTreeMap::new();
    for a in &addresses {
        if let Some((id, v)) = ip_address_of(a) {
            in_use.entry(id).or_default().insert(v);
        }
    }
    let pool_refs: BTreeMap<(String, String), (String, String)> = claims
        .iter()
        .map(|c| {
            let m = c.meta();
            let r = &c.json["spec"]["poolRef"];
            let field = |f: &str| r[f].as_str().unwrap_or_default().to_string();
            let key = (m.namespace.clone().unwrap_or_default(), m.name.clone());
            (key, (field("kind"), field("name")))
        })
        .collect();
    let mut snapshot = capi::Snapshot::new(claims, addresses, pool_objects);
    for (ns, name) in names {
        match capi::reconcile_claim_in(ctx, kube, &ns, &name, Some(&mut snapshot)) {
            Ok(o) => {
                ReconcileReport::count(&mut report.claims, &o);
                if let (Some(reason), Some((kind, pool))) =
                    (o.reason, pool_refs.get(&(ns.clone(), name.clone())))
                {
                    let pool_ns = match PoolKind::from_kind_name(kind) {
                        Some(k) if k.is_global() => String::new(),
                        _ => ns.clone(),
                    };
                    let key = (kind.clone(), pool_ns, pool.clone(), reason.to_string());
                    *report.waiting.entry(key).or_default() += 1;
                }
                if o.metal_assignment() {
                    report.metal_claims.push((ns.clone(), name.clone()));
                }
            }
            Err(e) => report
                .errors
                .push(format!("IPAddressClaim {ns}/{name}: {e}")),
        }
    }
    Ok(Listed {
        snapshot,
        live,
        in_use,
    })
}

/// The pools as their records say (one `get` each), every one indexed by
/// the holder index: those that are not yet (written before it, or
/// repaired) are indexed first, together ([`holders::index_holders`]: one
/// listing of the claim keys, once per pool). A pool that could not be
/// read or indexed is reported and left out of steps 3 and 4 this run.
fn indexed_pools<K: KvStore>(
    ctx: &Ctx<'_, K>,
    pools: &[ops::PoolView],
    report: &mut ReconcileReport,
) -> Vec<Loaded> {
    let read = |id: &PoolId, report: &mut ReconcileReport| match store::read_pool(ctx.kv, id) {
        Ok(l) => l,
        Err(e) => {
            report.errors.push(format!("pool {}: {e}", id.display()));
            None
        }
    };
    let mut loaded = Vec::new();
    let mut todo = Vec::new();
    for v in pools {
        match read(&v.object.id, report) {
            Some(l) if l.state.holders.indexed => loaded.push(l),
            Some(l) => todo.push(l.object.id),
            None => {}
        }
    }
    if todo.is_empty() {
        return loaded;
    }
    if let Err(e) = holders::index_holders(ctx, &todo) {
        report.errors.push(format!("holder index: {e}"));
    }
    for id in todo {
        match read(&id, report) {
            Some(l) if l.state.holders.indexed => loaded.push(l),
            Some(_) => report.errors.push(format!(
                "pool {}: its holders are not indexed yet; its stale bindings and leaks wait for the next run",
                id.display()
            )),
            None => {}
        }
    }
    loaded
}

/// The values of pool `l` that may hold a stale binding or a leak: in use,
/// not cooling, held by no `IPAddress` object (`in_use`, addresses), and,
/// with `skip_intents`, not an intent's. (Ranges of over 2^20 values are
/// not walked: a pool with such a range bound and no `IPAddress` for it
/// would be a corrupt store, not a leak to walk.)
fn candidates(l: &Loaded, in_use: Option<&BTreeSet<u128>>, skip_intents: bool) -> Vec<u128> {
    let in_use: BTreeSet<u128> = in_use
        .into_iter()
        .flatten()
        .filter_map(|a| l.pool.value_of(from_u128(l.pool.family, *a)))
        .collect();
    let cooling: BTreeSet<u128> = l.state.cooling.iter().map(|c| c.address).collect();
    let intents: BTreeSet<u128> = if skip_intents {
        l.state.intents.iter().map(|i| i.address).collect()
    } else {
        BTreeSet::new()
    };
    l.state
        .used
        .ranges()
        .iter()
        .filter(|&&(a, b)| b - a <= 1 << 20)
        .flat_map(|&(a, b)| a..=b)
        .filter(|v| !cooling.contains(v) && !intents.contains(v) && !in_use.contains(v))
        .collect()
}

/// Decision 3: bindings without a live claim released, in `managed` pools,
/// unless an `IPAddress` holds the address. Only each pool's candidates
/// ([`candidates`]; none when every binding has its `IPAddress`) are
/// looked at: their holders from the holder index (a `get` per holder page
/// they span), then each holder's binding (one `get`: its uid, and that it
/// still binds that address). (What bindings hold is read again by the
/// leak reclaim, after each pool record.)
fn release_stale<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    managed: &BTreeSet<PoolId>,
    listed: &Listed,
    loaded: &[Loaded],
    report: &mut ReconcileReport,
) {
    for l in loaded.iter().filter(|l| managed.contains(&l.object.id)) {
        let id = &l.object.id;
        let values = candidates(l, listed.in_use.get(id), false);
        if values.is_empty() {
            continue;
        }
        let found = match holders::holders_of(ctx.kv, l, &values) {
            Ok(f) => f,
            Err(e) => {
                report.errors.push(format!("pool {}: {e}", id.display()));
                continue;
            }
        };
        for (v, h) in &found.by_value {
            let Some((ns, name)) = h.claim.split_once('/') else {
                continue;
            };
            let rec = match ops::get_claim(ctx.kv, ns, name) {
                Ok(Some(rec)) => rec,
                Ok(None) => continue,
                Err(e) => {
                    report.errors.push(format!("binding {ns}/{name}: {e}"));
                    continue;
                }
            };
            let binds_it = rec.pool_id(ns).ok().as_ref() == Some(id)
                && rec.ip().ok().and_then(|ip| l.pool.value_of(ip)) == Some(*v);
            let live = listed
                .live
                .contains(&(ns.to_string(), name.to_string(), rec.uid.clone()));
            if binds_it && !live {
                release_binding(ctx, kube, (ns, name), &rec.uid, report);
            }
        }
    }
}

/// The binding of `ns/name` (claim `uid`) released, after re-reading the
/// claim: the claim list is a snapshot, and a claim created (and bound by
/// an event on another replica) since then is not in it.
fn release_binding<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    (ns, name): (&str, &str),
    uid: &str,
    report: &mut ReconcileReport,
) {
    match kube.get_as::<Meta>(&kube::CLAIMS, Some(ns), name) {
        Ok(Some(c)) if c.metadata.uid.as_deref() == Some(uid) => return,
        Ok(_) => {}
        Err(e) => {
            let e = crate::error::Error::from(e);
            report.errors.push(format!("binding {ns}/{name}: {e}"));
            return;
        }
    }
    match crate::provision::assign::release(ctx, ns, name, Some(uid)) {
        Ok(Some(_)) => report.bindings_released += 1,
        Ok(None) => {}
        // Still assigned to a device in Metal: the assign step removes that
        // first (forwarded by the `reconcile` component); the next run
        // releases the binding.
        Err(e) if e.is(Known::MetalAssignmentHeld) => {
            report.metal_claims.push((ns.to_string(), name.to_string()));
        }
        Err(e) => report.errors.push(format!("binding {ns}/{name}: {e}")),
    }
}

/// The pool and address an `IPAddress` object holds, when it is one of ours.
fn ip_address_of(a: &IpAddressObject) -> Option<(PoolId, u128)> {
    let ns = a.metadata.namespace.as_deref().unwrap_or_default();
    Some((a.spec.our_pool(ns)?, to_u128(a.spec.ip()?)))
}

/// Frees addresses bound in `id`'s record that neither a binding nor an
/// intent nor an `IPAddress` object (`in_use`) holds, and that are not
/// cooling down.
///
/// Inside the swap's decision, after the pool record: the candidates'
/// holders from the holder index ([`holders::holders_of`]: a `get` per
/// holder page they span), then the bindings of the claims it names (one
/// `get_many` on Spin's SQLite store, a `get` each elsewhere); a candidate
/// is a leak when no holder is named or the named claim's binding does not
/// bind it. Exact because the index is: a binding live when the record was
/// read is its `Bind` intent's (not a candidate), or in `recent`, or in its
/// page (written before it left `recent`); a later binding of the value
/// changes the record and fails the swap. A pool not indexed, or with a
/// holder page that does not load, is left alone (its holders are not all
/// known). No key is listed.
fn reclaim_leaks<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    in_use: &BTreeSet<u128>,
) -> Result<u32> {
    store::update_pool(ctx, id, |current| {
        let Some(l) = current else {
            return Ok(Decision::Done(0));
        };
        if !l.state.holders.indexed {
            return Ok(Decision::Done(0));
        }
        let candidates = candidates(l, Some(in_use), true);
        // The usual case under CAPI (every binding has its `IPAddress`):
        // nothing to check, so no key is read.
        if candidates.is_empty() {
            return Ok(Decision::Done(0));
        }
        let found = holders::holders_of(ctx.kv, l, &candidates)?;
        if let Some((page, why)) = found.unreadable.first() {
            return Err(crate::error::Error::unreadable(format!(
                "holder page {page} of pool {} does not load ({why}); its leaks wait for its repair",
                id.display()
            )));
        }
        let named: Vec<(u128, &str)> = found
            .by_value
            .iter()
            .map(|(v, h)| (*v, h.claim.as_str()))
            .collect();
        let claim_keys: Vec<String> = named
            .iter()
            .filter_map(|(_, c)| c.split_once('/').map(|(ns, n)| keys::claim(ns, n)))
            .collect();
        let values = if l.exact {
            ctx.kv.get_many(&claim_keys)?
        } else {
            claim_keys
                .iter()
                .map(|k| ctx.kv.get(k))
                .collect::<std::result::Result<Vec<_>, _>>()?
        };
        let mut bound = BTreeSet::new();
        for ((v, claim), value) in named.iter().zip(values) {
            let Some(bytes) = value else { continue };
            let Ok(rec) = ClaimRecord::decode(&bytes) else {
                continue;
            };
            let ns = claim.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
            let binds_it = rec.pool_id(ns).ok().as_ref() == Some(id)
                && rec.ip().ok().and_then(|ip| l.pool.value_of(ip)) == Some(*v)
                && !l.state.is_unbinding(claim, &rec.token);
            if binds_it {
                bound.insert(*v);
            }
        }
        let mut state = l.state.clone();
        let mut n = 0;
        for v in candidates.into_iter().filter(|v| !bound.contains(v)) {
            state.used.remove(v);
            state.holders.recent.retain(|r| r.address != v);
            n += 1;
        }
        if n == 0 {
            return Ok(Decision::Done(0));
        }
        Ok(Decision::Write(
            Box::new(Next {
                pool: Some((l.object.clone(), l.pool.clone())),
                state,
            }),
            n,
        ))
    })
}
