//! Registration: a pool's spec into the store ([`put_pool`],
//! [`put_pool_with`], the provisioned twins), its views and counts, and
//! its removal ([`delete_pool`]).

use serde_json::{json, Value};

use std::collections::BTreeMap;

use crate::error::Known;
use crate::error::{Error, Result};
use crate::ipam::alloc::{Counts, Intent, IntentKind, PoolState};
use crate::ipam::claim::Claim;
use crate::ipam::holders;
use crate::ipam::index::{self, Held};
use crate::ipam::pool::{PoolId, PoolObject, ValidatedPool};
use crate::ipam::store::{self, ClaimRecord, Loaded, Next, PoolRecord};
use crate::kv::{keys, Ctx, Decision};
use crate::ports::kv::KvStore;

use super::recovery::repair;
use super::within_deadline;

/// A pool with its counts, ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolView {
    /// The registered object.
    pub object: PoolObject,
    /// Its address counts.
    pub counts: Counts,
}

impl PoolView {
    /// Pool `l` with its counts as of `now`.
    pub fn of(l: &Loaded, now: u64) -> PoolView {
        PoolView {
            object: l.object.clone(),
            counts: l.state.counts_at(&l.pool, now),
        }
    }

    /// The object with `status.ipAddresses` (counts saturate at
    /// [`MAX_COUNT`], the largest Kubernetes integer, as everywhere).
    pub fn to_json(&self) -> Value {
        self.object.to_json(Some(json!({
            "ipAddresses": {
                "total": count(self.counts.total),
                "used": count(self.counts.used),
                "free": count(self.counts.free),
                "outOfRange": count(self.counts.out_of_range),
            }
        })))
    }
}

/// The largest count reported anywhere (status, metrics, the browser
/// view): 9223372036854775807 (2^63 − 1), the largest Kubernetes integer.
/// An IPv6 pool's size passes it from a /65 of addresses on.
pub const MAX_COUNT: i64 = i64::MAX;

/// A count as reported: saturating at [`MAX_COUNT`].
///
/// ```
/// use metal_ipam_core::ipam::ops::{count, MAX_COUNT};
/// assert_eq!(count(5), 5);
/// assert_eq!(count(1 << 64), MAX_COUNT);
/// ```
pub fn count(v: u128) -> i64 {
    i64::try_from(v).unwrap_or(MAX_COUNT)
}

/// Whether [`put_pool`] created or changed the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The pool did not exist (or was deleted) and now does.
    Created,
    /// The spec or metadata changed.
    Updated,
    /// Identical to what was stored; nothing written.
    Unchanged,
}

/// Registers or updates a pool.
///
/// The spec is validated before any store operation. An update keeps every
/// allocation; cooling addresses that fall outside the new spec are
/// forgotten.
///
/// # Idempotency
/// Putting the same object twice writes once ([`PutOutcome::Unchanged`]).
///
/// # Errors
/// 422 for an invalid spec; 409 `AllocatedAddressesDropped` naming bound
/// addresses the new spec would no longer contain; 503 on store failure or
/// persistent contention.
pub fn put_pool<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: PoolObject,
) -> Result<(PutOutcome, PoolView)> {
    put_pool_with(ctx, object, &[])
}

/// An address the Kubernetes API says a claim holds (an `IPAddress`
/// object), to be recorded when a pool is registered (see
/// [`put_pool_with`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Adoption {
    /// The claim, as far as the `IPAddress` tells it.
    pub claim: Claim,
    /// Its address.
    pub address: std::net::IpAddr,
}

/// Reason of the refusal to register a VRF-backed pool before its Metal
/// resources are provisioned.
pub const METAL_NOT_PROVISIONED: &str = "MetalNotProvisioned";

/// [`put_pool`], and when the pool is new to the store, records
/// `adoptions` in the same write, so no allocation can hand out an adopted
/// address in between. Then writes each adopted claim's binding (unless
/// one exists). Adoptions of another family than the pool's are skipped.
///
/// # Idempotency
/// As [`put_pool`]; adoptions only apply when the pool is created.
///
/// # Errors
/// As [`put_pool`]; 409 [`METAL_NOT_PROVISIONED`] for a VRF-backed pool.
pub fn put_pool_with<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: PoolObject,
    adoptions: &[Adoption],
) -> Result<(PutOutcome, PoolView)> {
    if let Some(metal) = &object.spec.metal {
        // Its addresses must not be handed out before its Metal resources
        // exist: the provisioning step registers it. (A broken section is
        // still a 422 first.)
        metal.validate()?;
        return Err(Error::conflict(
            METAL_NOT_PROVISIONED,
            "a VRF-backed pool (spec.metal) is registered by the provision step once its Metal resources exist",
        )
        .with_field("spec.metal"));
    }
    register(ctx, object, adoptions, None)
}

/// Registers a VRF-backed pool whose Metal resources exist, with the
/// addresses of its block `net/cidr` (see
/// [`crate::ipam::pool::PoolSpec::with_block`]): what the provision step
/// calls once the gateway is active. A pool without `spec.metal` is
/// registered as [`put_pool_with`] would.
///
/// `may` is asked inside every compare-and-swap decision on the pool
/// record, after the record was read and before the swap
/// (`provision::transitions::may_register`: the pool is not being torn
/// down). A teardown records that it started before it deletes the pool from the store with
/// [`delete_provisioned_pool`], whose write always lands: so a
/// registration either swaps before that write (which then deletes it) or
/// its swap fails and its retry is refused (see `kv-schema/README.md`).
///
/// # Idempotency
/// As [`put_pool`].
///
/// # Errors
/// As [`put_pool`], and 422 when the spec's addresses, prefix or gateway
/// disagree with the block; `may`'s refusal.
pub fn put_provisioned_pool<K: KvStore>(
    ctx: &Ctx<'_, K>,
    mut object: PoolObject,
    block: (std::net::IpAddr, u8),
    adoptions: &[Adoption],
    may: &dyn Fn() -> Result<()>,
) -> Result<(PutOutcome, PoolView)> {
    object.spec = object.spec.with_block(block.0, block.1)?;
    register(ctx, object, adoptions, Some(may))
}

/// 409 `PoolInUse` unless pool `id`'s record `l` has no address bound.
fn unbound(id: &PoolId, l: &Loaded) -> Result<()> {
    let c = l.state.counts(&l.pool);
    let bound = c.used + c.out_of_range;
    if bound > 0 {
        return Err(Error::conflict(
            "PoolInUse",
            format!(
                "pool {} still has {bound} allocated address(es); release their claims first",
                id.display()
            ),
        ));
    }
    Ok(())
}

/// Deletes a VRF-backed pool from the store at the start of its teardown:
/// as [`delete_pool`], but the swap always happens, a tombstone even over a
/// tombstone or an absent key, so that a registration whose decision read
/// the pool before it fails its swap (see [`put_provisioned_pool`]).
///
/// # Idempotency
/// Each call writes a tombstone; the pool stays deleted.
///
/// # Errors
/// 409 `PoolInUse` while addresses are bound; 503 on store failure.
pub fn delete_provisioned_pool<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<()> {
    let pages = store::update_pool(ctx, id, |current| {
        let next = match current {
            Some(l) => {
                unbound(id, l)?;
                Next::tombstone(l)
            }
            // (Over a tombstone: one that still lists pages, after a
            // deletion that crashed before deleting them, stops listing
            // them; they belong to a deleted incarnation, which no reader
            // asks about.)
            None => Next {
                pool: None,
                state: PoolState::default(),
            },
        };
        let h = &next.state.holders;
        let pages = (h.incarnation.clone(), h.pages.clone());
        Ok(Decision::Write(Box::new(next), pages))
    })?;
    let _ = holders::sweep_pages(ctx, id, &pages.0, &pages.1);
    let _ = index::settle(ctx, id, None);
    Ok(())
}

/// What [`register`] decided: the answer, the adopted claims' bindings it
/// owes (key, record), and when it took their intents.
type Registered = ((PutOutcome, PoolView), Vec<(String, ClaimRecord)>, u64);

/// What a registration will hold: the new spec's allocatable set and the
/// adoptions' addresses (a new pool records them even outside its spec),
/// in addresses.
fn registration_held(pool: &ValidatedPool, adoptions: &[Adoption]) -> Held {
    let mut values = pool.allocatable.clone();
    for a in adoptions {
        if let Some(v) = pool.value_of(a.address) {
            values.insert(v);
        }
    }
    Held {
        family: pool.family,
        set: pool.addresses_of(&values),
    }
}

/// Registers or updates a pool (after `may`, the caller's gate, agrees);
/// a new pool takes `adoptions` over under `Bind` intents of this request,
/// whose bindings it then writes.
///
/// An identical object answers [`PutOutcome::Unchanged`] from one read.
/// Otherwise the pool index grants the addresses first
/// ([`index::reserve`]: the overlap rule), the pool record is written
/// within the grant's deadline, and the index is settled to what the
/// record holds ([`index::settle`]), whatever the write's outcome. A
/// record that does not load is rebuilt ([`repair`]).
pub(super) fn register<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: PoolObject,
    adoptions: &[Adoption],
    may: Option<&dyn Fn() -> Result<()>>,
) -> Result<(PutOutcome, PoolView)> {
    let pool = object.spec.validate()?;
    let id = object.id.clone();
    let now = ctx.env.now();
    match store::read_pool_or_pages(ctx.kv, &id) {
        Ok((Some(l), _)) if l.object == object => {
            if let Some(may) = may {
                may()?;
            }
            return Ok((PutOutcome::Unchanged, PoolView::of(&l, now)));
        }
        Ok((_, (inc, pages))) => {
            // A tombstone that still lists the deleted pool's holder pages
            // (its deletion crashed before deleting them): they go first.
            holders::sweep_pages(ctx, &id, &inc, &pages)?;
        }
        Err(e) if e.is(Known::UnreadableRecord) => {
            return repair(ctx, object, &pool, adoptions, may);
        }
        Err(e) => return Err(e),
    }
    let grant = index::reserve(ctx, &id, &registration_held(&pool, adoptions))?;
    let me = ctx.env.token();
    let written = store::update_pool(ctx, &id, |current| {
        if let Some(may) = may {
            may()?;
        }
        let now = ctx.env.now();
        grant.check(now)?;
        match current {
            None => {
                // Over a tombstone (or nothing): the requests its record
                // counted go on (one `get`, read after the record).
                let carried = store::read_counted(ctx.kv, &id)?.unwrap_or_default();
                Ok(register_new(
                    ctx, &object, &pool, adoptions, &me, now, carried,
                ))
            }
            Some(l) => register_update(&object, &pool, l, now),
        }
    });
    // The grant is settled whatever the write did (a failed one leaves the
    // entry as it was); a settle that fails leaves the grant to expire,
    // which is safe, so the registration's own answer stands.
    let _ = index::settle(ctx, &id, Some(&grant.token));
    let (result, bindings, taken_at) = written?;
    // The adopted claims' bindings: this request owns their Bind intents.
    for (key, record) in &bindings {
        within_deadline(ctx, taken_at)?;
        ctx.kv.set(key, &record.encode())?;
    }
    Ok(result)
}

/// Every claim binding naming pool `id`: `(namespace, name, binding)`
/// (one listing of the store's keys, then a `get` per claim binding). For
/// the repair of an unreadable pool record only.
///
/// # Errors
/// Store failures (503); an unreadable binding is skipped.
pub fn bindings_of_pool<K: KvStore>(
    kv: &K,
    id: &PoolId,
) -> Result<Vec<(String, String, ClaimRecord)>> {
    Ok(listed_of_pool(kv, id)?.0)
}

/// A claim binding as listed: `(namespace, name, binding)`.
type Listed = Vec<(String, String, ClaimRecord)>;

/// [`bindings_of_pool`], and the keys the listing found.
pub(super) fn listed_of_pool<K: KvStore>(kv: &K, id: &PoolId) -> Result<(Listed, Vec<String>)> {
    let mut out = Vec::new();
    let keys_listed = kv.list_keys()?;
    for key in &keys_listed {
        let Some((ns, name)) = keys::parse_claim(key) else {
            continue;
        };
        let Some(bytes) = kv.get(key)? else { continue };
        let Ok(record) = ClaimRecord::decode(&bytes) else {
            continue;
        };
        if record.pool_id(ns).ok().as_ref() == Some(id) {
            out.push((ns.to_string(), name.to_string(), record));
        }
    }
    Ok((out, keys_listed))
}

/// [`register`]'s decision for a pool not yet stored: its adoptions, one
/// address per claim (the first `IPAddress` wins), each under a `Bind`
/// intent owned by `me`. A new record is indexed from the start (no
/// binding exists before it), under a fresh incarnation (its holder pages
/// are its own).
fn register_new<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: &PoolObject,
    pool: &ValidatedPool,
    adoptions: &[Adoption],
    me: &str,
    now: u64,
    counted: BTreeMap<String, u64>,
) -> Decision<Registered, Next> {
    let mut state = PoolState {
        counted,
        ..PoolState::default()
    };
    state.holders.indexed = true;
    state.holders.incarnation = ctx.env.token();
    let mut bindings = Vec::new();
    for a in adoptions {
        let cname = a.claim.id.display();
        let Some(v) = pool.value_of(a.address) else {
            continue;
        };
        if state.intent(&cname).is_some() {
            continue; // one address per claim: the first IPAddress wins
        }
        state.adopt(v);
        let tok = ctx.env.token();
        bindings.push((
            keys::claim(&a.claim.id.namespace, &a.claim.id.name),
            ClaimRecord::new(&a.claim, a.address, pool, object.uid(), &tok),
        ));
        state.intents.push(Intent {
            kind: IntentKind::Bind,
            claim: cname,
            uid: a.claim.id.uid.clone(),
            address: v,
            token: tok,
            owner: me.to_string(),
            at: now,
        });
    }
    let view = PoolView {
        object: object.clone(),
        counts: state.counts(pool),
    };
    Decision::Write(
        Box::new(Next {
            pool: Some((object.clone(), pool.clone())),
            state,
        }),
        ((PutOutcome::Created, view), bindings, now),
    )
}

/// [`register`]'s decision for a stored pool: refused when the new spec
/// would drop allocated addresses; cooling addresses outside it are freed;
/// nothing written when nothing changed.
///
/// (A prefix pool whose allocation length changes, only possible with
/// nothing bound or cooling, keeps its holder pages: an entry left from the
/// old length is older than any binding at the new one, and a later write
/// of its page drops it.)
fn register_update(
    object: &PoolObject,
    pool: &ValidatedPool,
    l: &Loaded,
    now: u64,
) -> Result<Decision<Registered, Next>> {
    let (dropped, n) = l.state.dropped_by(&l.pool, pool, 10);
    if n > 0 {
        let list: Vec<String> = dropped.iter().map(|&a| pool_ip(&l.pool, a)).collect();
        return Err(Error::conflict(
            "AllocatedAddressesDropped",
            format!(
                "the update would drop {n} allocated address(es) from pool {}: {}{}; release them first",
                object.id.display(),
                list.join(", "),
                if n > list.len() as u128 { ", …" } else { "" }
            ),
        ));
    }
    let mut state = l.state.clone();
    state.expire(now);
    if l.pool.shift != pool.shift {
        // A sub-prefix cooling at one length has no counterpart at another:
        // freeing it would hand it out before its grace period ended.
        if let Some(last) = state.cooling.iter().map(|c| c.until).max() {
            return Err(Error::conflict(
                "CoolingAddressesDropped",
                format!(
                    "pool {}'s allocation length cannot change while {} released sub-prefix(es) are in their reuse grace period; retry after {}",
                    object.id.display(),
                    state.cooling.len(),
                    crate::kube::meta::rfc3339(last),
                ),
            ));
        }
    }
    let outside: Vec<u128> = state
        .cooling
        .iter()
        .map(|c| c.address)
        .filter(|a| !pool.allocatable.contains(*a))
        .collect();
    for a in outside {
        state.cooling.retain(|c| c.address != a);
        state.used.remove(a);
    }
    let view = PoolView {
        object: object.clone(),
        counts: state.counts(pool),
    };
    if *object == l.object && state == l.state {
        return Ok(Decision::Done((
            (PutOutcome::Unchanged, view),
            Vec::new(),
            0,
        )));
    }
    Ok(Decision::Write(
        Box::new(Next {
            pool: Some((object.clone(), pool.clone())),
            state,
        }),
        ((PutOutcome::Updated, view), Vec::new(), 0),
    ))
}

fn pool_ip(pool: &crate::ipam::pool::ValidatedPool, a: u128) -> String {
    pool.ip(a).to_string()
}

/// Deletes a pool that has no bound address.
///
/// The record becomes a tombstone (the key stays; see [`crate::kv`]), then
/// the pool index lets its addresses go ([`index::settle`]). A record that
/// does not load is deleted when no claim binding names the pool (one
/// listing of the store: [`bindings_of_pool`]), and refused with
/// `PoolInUse` naming them otherwise.
///
/// # Idempotency
/// Deleting an unknown or deleted pool succeeds; returns whether a pool was
/// deleted by this call.
///
/// # Errors
/// 409 `PoolInUse` while addresses are bound; 503 on store failure.
pub fn delete_pool<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<bool> {
    let (deleted, pages) = match store::update_pool(ctx, id, |current| {
        let Some(l) = current else {
            return Ok(Decision::Done((false, None)));
        };
        unbound(id, l)?;
        let next = Next::tombstone(l);
        let h = &next.state.holders;
        let pages = (h.incarnation.clone(), h.pages.clone());
        Ok(Decision::Write(Box::new(next), (true, Some(pages))))
    }) {
        Err(e) if e.is(Known::UnreadableRecord) => delete_unreadable(ctx, id)?,
        other => other?,
    };
    // The pool's holder pages go with it. Its tombstone lists them until
    // they are deleted, so a deletion that crashed before (no live pool
    // now) is finished here (one more `get`), or by the next
    // registration's deletion.
    let (inc, pages) = match pages {
        Some(p) => p,
        None => store::read_pool_or_pages(ctx.kv, id)
            .map(|(_, p)| p)
            .unwrap_or_default(),
    };
    let _ = holders::sweep_pages(ctx, id, &inc, &pages);
    // A settle that fails leaves the entry larger than the pool, which is
    // safe; the next settle or the reconcile's tidy repairs it.
    let _ = index::settle(ctx, id, None);
    Ok(deleted)
}

/// [`delete_pool`] of a record that does not load.
fn delete_unreadable<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
) -> Result<(bool, Option<(String, crate::ip::RangeSet)>)> {
    let (bound, listed) = listed_of_pool(ctx.kv, id)?;
    if !bound.is_empty() {
        let names: Vec<String> = bound
            .iter()
            .take(10)
            .map(|(ns, n, r)| format!("{ns}/{n} ({})", r.address))
            .collect();
        return Err(Error::conflict(
            Known::PoolInUse.as_str(),
            format!(
                "pool {}'s record does not load, and {} claim(s) hold its addresses: {}{}; PUT the pool to rebuild its record, or release them first",
                id.display(),
                bound.len(),
                names.join(", "),
                if bound.len() > names.len() { ", …" } else { "" }
            ),
        ));
    }
    let swap_check = index::swap_check(ctx.kv)?;
    // Its holder pages (whatever their incarnation) go with it.
    holders::forget_listed_pages(ctx.kv, &listed, id)?;
    let done = store::replace_unreadable_pool(ctx, id, swap_check, || {
        Ok((
            Next {
                pool: None,
                state: PoolState::default(),
            },
            (),
        ))
    })?;
    match done {
        Some(()) => Ok((true, Some(Default::default()))),
        // Readable again (repaired meanwhile): delete it the ordinary way.
        None => Ok((delete_pool(ctx, id)?, Some(Default::default()))),
    }
}

/// Decodes any record found in the store, for diagnostics and golden tests.
///
/// # Errors
/// 500 if it is neither a pool nor a claim record.
pub fn decode_any(key: &str, bytes: &[u8]) -> Result<Value> {
    if key.starts_with(keys::POOL_PREFIX) {
        let r = PoolRecord::decode(bytes)?;
        return serde_json::to_value(r).map_err(|e| Error::internal(e.to_string()));
    }
    if key.starts_with(keys::CLAIM_PREFIX) {
        let r = ClaimRecord::decode(bytes)?;
        return serde_json::to_value(r).map_err(|e| Error::internal(e.to_string()));
    }
    Err(Error::internal(format!("{key} holds no record")))
}
