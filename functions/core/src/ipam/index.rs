//! The pool index (`pool-index`): one record naming every live pool and
//! the addresses each may hold. It is where the overlap rule is decided —
//! **no address is held by two pools that serve one namespace** — and how
//! pools are listed without listing the store. It shrinks when pools go:
//! its size follows the pools alive, never the pools ever made.
//!
//! # The rule
//! Two pools share an *address space* when a claim of one namespace could
//! be served by both: both serve the same namespace (`MetalIPPool`s and
//! `MetalPrefixPool`s of one namespace), or either is global (it serves
//! every namespace). Pools of two namespaces are separate spaces (separate
//! networks: each serves only its own namespace's claims) and may share
//! addresses. Within a space, no address (a prefix pool's sub-prefixes
//! count as every address they cover) is held by two pools: what a pool
//! may hold is its allocatable set and every address its record has in
//! use (cooling and out-of-range ones included), [`held_by`].
//!
//! # The protocol
//! Each entry holds `held`, a superset of what the pool's record holds,
//! and `pending`: registrations in flight, each with the addresses it will
//! write, its token and when it was granted. Invariant: **for every pool
//! record, what it holds is inside its entry's `held` ∪ `pending`**, and
//! no two entries of one space intersect. Every change goes through
//! [`update_record`] on this one record, so two registrations are ordered
//! by its compare-and-swap:
//!
//! 1. [`reserve`] (before a registration writes the pool record): refuses
//!    `PoolOverlap` when another entry of the space intersects what the
//!    pool will hold, else adds a pending grant.
//! 2. The registration writes the pool record only within
//!    [`WRITE_DEADLINE_SECONDS`] of its grant (checked before every swap);
//!    after [`TAKEOVER_AFTER_SECONDS`] a grant has expired.
//! 3. [`settle`] (after the pool write, a deletion, or to repair):
//!    reads the pool record *inside its decision* and sets `held` to what
//!    it holds, dropping its own grant and expired ones; an entry whose
//!    record is gone and that has no grant left is removed.
//!
//! Why it holds: `held` only grows in a decision of this record, and it
//! only shrinks to what the pool record holds as read inside a decision,
//! after the index was read. A pool record grows only through a
//! registration (or an adoption outside its spec), which first adds a
//! grant here — a write that fails any concurrent decision's swap, so no
//! decision can shrink `held` below a record that is about to grow. A
//! grant that expired can no longer be written (its writer passed its
//! deadline), so dropping it after reading the record is exact. Crashes
//! leave a grant (expires), or a `held` larger than the record (repaired
//! by the next decision that looks at the entry: a conflict, a settle, a
//! tidy by the reconcile). Checked by `tests/interleavings_index.rs`;
//! argued in `kv-schema/README.md` ("The pool index").
//!
//! A store indexed by an earlier build (a set of pool keys, no addresses)
//! is read as entries whose `held` is unknown; the next write of the index
//! reads those pools' records once and fills them in.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Known, Result};
use crate::ip::{from_u128, Family, RangeSet};
use crate::ipam::alloc::{TAKEOVER_AFTER_SECONDS, WRITE_DEADLINE_SECONDS};
use crate::ipam::pool::{parse_entry, PoolId};
use crate::ipam::store::{self, Loaded};
use crate::kv::keys;
use crate::kv::protocol::{
    read_record, update_record, Content, Ctx, Decision, Envelope, Enveloped,
};
use crate::kv::records::SwapCheck;
use crate::ports::kv::KvStore;

/// Schema version of the index this build writes. Version 1 (a registry:
/// the set of pool keys, `kv::registry`) is read and rewritten as 2.
pub const INDEX_VERSION: u32 = 2;

/// Most pools the index holds at once (live pools and deleted ones whose
/// entry was not settled yet); a registration past it is refused
/// (`TooManyPools`). Churn alone cannot reach it: entries go with their
/// pools.
pub const MAX_POOLS: usize = 10_000;

/// Addresses of one family (a pool holds one family).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The family.
    pub family: Family,
    /// The addresses.
    pub set: RangeSet,
}

impl Held {
    /// Nothing, of `family`.
    pub fn empty(family: Family) -> Held {
        Held {
            family,
            set: RangeSet::new(),
        }
    }

    fn to_entries(&self) -> Vec<String> {
        self.set
            .ranges()
            .iter()
            .map(|&(a, b)| {
                if a == b {
                    from_u128(self.family, a).to_string()
                } else {
                    format!(
                        "{}-{}",
                        from_u128(self.family, a),
                        from_u128(self.family, b)
                    )
                }
            })
            .collect()
    }

    fn from_entries(entries: &[String]) -> Result<Option<Held>> {
        let mut out: Option<Held> = None;
        for e in entries {
            let (f, a, b) =
                parse_entry(e).map_err(|m| Error::internal(format!("pool index entry: {m}")))?;
            let h = out.get_or_insert_with(|| Held::empty(f));
            if h.family != f {
                return Err(Error::internal(
                    "pool index entry mixes IPv4 and IPv6".to_string(),
                ));
            }
            h.set.insert_range(a, b);
        }
        Ok(out)
    }

    fn union(&mut self, other: &Held) {
        if other.family == self.family {
            self.set.union_with(&other.set);
        }
    }

    fn first_shared(&self, other: &Held) -> Option<(u128, u128)> {
        if self.family != other.family {
            return None;
        }
        let shared = self.set.intersection(&other.set);
        shared.first().map(|f| (f, shared.len()))
    }
}

/// What pool `l` may hold: its allocatable set and every value its record
/// has in use (cooling and out-of-range values included), in addresses.
pub fn held_by(l: &Loaded) -> Held {
    let mut values = l.pool.allocatable.clone();
    values.union_with(&l.state.used);
    Held {
        family: l.pool.family,
        set: l.pool.addresses_of(&values),
    }
}

/// A registration in flight: what it will write, granted at `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Grant {
    /// Identifies the registration.
    pub token: String,
    /// Unix seconds of the grant.
    pub at: u64,
    /// Addresses (`a` or `a-b`) the registration may write.
    pub held: Vec<String>,
}

/// One pool's entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// Addresses (`a` or `a-b`) the pool's record may hold; `None` when not
    /// known yet (an index an earlier build wrote), until the next write
    /// of the index reads the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Vec<String>>,
    /// Registrations in flight, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<Grant>,
    /// Listed for its Metal provisioning (a VRF-backed pool before its
    /// registration and during its teardown): kept while it holds nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metal: bool,
    /// The requests its pool's record had counted when the entry was made
    /// (`ipam::alloc::PoolState::counted`; a pool re-created over its
    /// tombstone goes on from its counts): what the record counted since
    /// is `counted − base`, folded into [`Index::retired`] when the entry
    /// goes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub base: Counted,
}

/// Requests counted in pool records, by request signature.
pub type Counted = BTreeMap<String, u64>;

/// The index's content: pool record key → entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Index {
    /// Every pool entry, by pool record key.
    #[serde(default)]
    pub pools: BTreeMap<String, Entry>,
    /// What the records of pools whose entries went had counted since
    /// their entries were made: with each live entry's `counted − base`,
    /// the requests ever counted in pool records ([`Index::counted`]),
    /// which never decreases.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retired: Counted,
    /// Deleted pools whose tombstone is still stored: record key → Unix
    /// seconds since when. The reconcile's [`collect`] removes a tombstone
    /// (and its creation guard) once it is [`TOMBSTONE_KEEP_S`] old and no
    /// registration of the pool stands, so the store holds no key of a pool
    /// deleted long ago.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tombstones: BTreeMap<String, u64>,
    /// Tombstones being removed (record key → since when): no registration
    /// of such a pool is granted until the removal ends.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub collecting: BTreeMap<String, u64>,
}

/// How long a deleted pool's tombstone is kept before [`collect`] removes
/// it: a day, far past any request's life (the protocol's timing
/// assumption is two minutes), so no request that read the live record
/// is still about to act on it.
pub const TOMBSTONE_KEEP_S: u64 = 86_400;

/// The stored index.
pub type IndexRecord = Enveloped<Index>;

/// The index's content as version 1 stored it (`kv::registry`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Members {
    #[serde(default)]
    members: std::collections::BTreeSet<String>,
}

impl Content for Index {
    type Id = ();
    type View = Index;
    type Next = Index;
    const VERSION: u32 = INDEX_VERSION;
    const WHAT: &'static str = "pool index";
    fn key(_: &()) -> String {
        keys::POOL_INDEX.to_string()
    }
    fn guard_key(_: &()) -> String {
        keys::POOL_INDEX_INIT.to_string()
    }
    fn describe(_: &()) -> String {
        "the pool index".to_string()
    }
    fn view(&self, _: &(), _: &Envelope) -> Result<Option<Index>> {
        Ok(Some(self.clone()))
    }
    fn build(next: &Index) -> Self {
        next.clone()
    }
    /// A version 1 index (the set of pool keys): every pool key becomes an
    /// entry whose `held` is not known yet.
    fn legacy(bytes: &[u8]) -> Option<Result<IndexRecord>> {
        let old: Enveloped<Members> = serde_json::from_slice(bytes).ok()?;
        if old.v != 1 {
            return None;
        }
        let pools = old
            .state
            .members
            .into_iter()
            .filter(|k| keys::parse_pool::<PoolId>(k).is_some())
            .map(|k| (k, Entry::default()))
            .collect();
        let e = Envelope {
            rev: old.rev,
            writer: old.writer,
            recent_writers: old.recent_writers,
            swap_check: old.swap_check,
        };
        Some(Ok(Enveloped::wrap(
            Index {
                pools,
                ..Index::default()
            },
            e,
        )))
    }
}

impl Index {
    /// The pools it lists, sorted (whether or not their record is live).
    pub fn ids(&self) -> Vec<PoolId> {
        let mut ids: Vec<PoolId> = self
            .pools
            .keys()
            .filter_map(|k| keys::parse_pool::<PoolId>(k))
            .collect();
        ids.sort();
        ids
    }

    /// Entry `key`'s `held` alone (`None` when absent or not known).
    fn held_of(&self, key: &str) -> Result<Option<Held>> {
        match self.pools.get(key).and_then(|e| e.held.as_deref()) {
            Some(h) => Held::from_entries(h),
            None => Ok(None),
        }
    }

    /// What entry `key` may hold: `held` ∪ every grant (`None` when `held`
    /// is not known).
    fn claimed(&self, key: &str) -> Result<Option<Held>> {
        let Some(e) = self.pools.get(key) else {
            return Ok(None);
        };
        let Some(held) = &e.held else { return Ok(None) };
        let mut out = Held::from_entries(held)?;
        for g in &e.pending {
            if let Some(h) = Held::from_entries(&g.held)? {
                match &mut out {
                    Some(o) => o.union(&h),
                    None => out = Some(h),
                }
            }
        }
        Ok(out)
    }

    /// The first entry of `id`'s address space, other than `id`'s own,
    /// that `held` intersects: `(key, first shared address, how many
    /// shared)`. Pure: what the webhook asks of a snapshot. Entries whose
    /// `held` is not known are skipped.
    ///
    /// # Errors
    /// 500 for an entry that does not parse.
    pub fn conflict(&self, id: &PoolId, held: &Held) -> Result<Option<(PoolId, IpAddr, u128)>> {
        let me = keys::pool(id);
        for key in self.pools.keys() {
            if *key == me {
                continue;
            }
            let Some(other) = keys::parse_pool::<PoolId>(key) else {
                continue;
            };
            if !same_space(id, &other) {
                continue;
            }
            if let Some(c) = self.claimed(key)? {
                if let Some((first, n)) = held.first_shared(&c) {
                    return Ok(Some((other, from_u128(held.family, first), n)));
                }
            }
        }
        Ok(None)
    }
}

/// Whether pools `a` and `b` could serve a claim of one namespace (the
/// overlap rule's scope; see the module docs).
///
/// ```
/// use metal_ipam_core::ipam::{index::same_space, pool::{PoolId, PoolKind}};
/// let a = PoolId::namespaced("team-a", "nodes");
/// assert!(same_space(&a, &PoolId::of(PoolKind::NamespacedPrefix, "team-a", "pods")));
/// assert!(same_space(&a, &PoolId::global("shared")));
/// assert!(!same_space(&a, &PoolId::namespaced("team-b", "nodes")));
/// ```
pub fn same_space(a: &PoolId, b: &PoolId) -> bool {
    a.kind.is_global() || b.kind.is_global() || a.namespace == b.namespace
}

/// Reads the index (one `get`); `None` when it was never written.
///
/// # Errors
/// Store failures (503), an unreadable index (500).
pub fn read<K: KvStore>(kv: &K) -> Result<Option<Index>> {
    read_record::<K, IndexRecord>(kv, &())
}

/// The store's swap kind as the index's envelope records it (its creation
/// told the backends apart, `kv::protocol`); `Verify` when there is no
/// index. For a record rebuilt over unreadable bytes, whose own envelope is
/// lost.
///
/// # Errors
/// Store failures (503), an unreadable index (500).
pub fn swap_check<K: KvStore>(kv: &K) -> Result<SwapCheck> {
    use crate::kv::protocol::CasRecord;
    match kv.get(keys::POOL_INDEX)? {
        Some(b) if !crate::ports::kv::is_zero_counter(&b) => {
            Ok(IndexRecord::decode(&b)?.envelope().swap_check)
        }
        _ => Ok(SwapCheck::Verify),
    }
}

/// What a pool's record was seen to hold, read inside a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Absent, the creation placeholder, or a tombstone (with what it
    /// counted, and whether a tombstone is stored).
    Gone(Counted, bool),
    /// A live pool holding these addresses, and what its record counted.
    Holds(Held, Counted),
    /// The record does not load (corrupt, or written by a newer build).
    Unreadable(String),
}

impl Seen {
    fn counted(&self) -> Option<&Counted> {
        match self {
            Seen::Gone(c, _) | Seen::Holds(_, c) => Some(c),
            Seen::Unreadable(_) => None,
        }
    }
}

/// Reads pool `id`'s record (one `get`).
///
/// # Errors
/// Store failures (503); an unreadable record is [`Seen::Unreadable`].
pub fn look<K: KvStore>(kv: &K, id: &PoolId) -> Result<Seen> {
    let Some(bytes) = kv
        .get(&keys::pool(id))?
        .filter(|b| !crate::ports::kv::is_zero_counter(b))
    else {
        return Ok(Seen::Gone(Counted::new(), false));
    };
    let loaded =
        store::PoolRecord::decode(&bytes).and_then(|r| r.load(id).map(|l| (l, r.state.counted)));
    match loaded {
        Ok((None, counted)) => Ok(Seen::Gone(counted, true)),
        Ok((Some(l), counted)) => Ok(Seen::Holds(held_by(&l), counted)),
        Err(e) if e.is(Known::UnreadableRecord) => Ok(Seen::Unreadable(e.message().to_string())),
        Err(e) => Err(e),
    }
}

/// Whether grant `g` expired at `now`: its writer is past its deadline and
/// can no longer write (see [`TAKEOVER_AFTER_SECONDS`]).
fn expired(g: &Grant, now: u64) -> bool {
    now.saturating_sub(g.at) >= TAKEOVER_AFTER_SECONDS
}

/// Brings entry `key` up to date with its record, read now (one `get`):
/// `held` becomes what the record holds, `drop` (a grant's token) and
/// expired grants are removed, and an entry with nothing left whose
/// record is gone is removed. An unreadable record keeps what the entry
/// had (its expired grants folded into `held`): nothing is given up that
/// cannot be checked.
fn refresh<K: KvStore>(
    kv: &K,
    index: &mut Index,
    key: &str,
    drop: Option<&str>,
    now: u64,
) -> Result<()> {
    let Some(id) = keys::parse_pool::<PoolId>(key) else {
        index.pools.remove(key);
        return Ok(());
    };
    let seen = look(kv, &id)?;
    if !matches!(seen, Seen::Gone(_, true)) {
        index.tombstones.remove(key);
    }
    let existed = index.pools.contains_key(key);
    let entry = index.pools.entry(key.to_string()).or_default();
    if !existed {
        // A new entry starts from what the record counted so far.
        entry.base = seen.counted().cloned().unwrap_or_default();
    }
    let (gone, live): (Vec<Grant>, Vec<Grant>) = std::mem::take(&mut entry.pending)
        .into_iter()
        .partition(|g| Some(g.token.as_str()) == drop || expired(g, now));
    entry.pending = live;
    match &seen {
        Seen::Gone(..) => entry.held = Some(Vec::new()),
        Seen::Holds(h, _) => entry.held = Some(h.to_entries()),
        Seen::Unreadable(_) => {
            let mut all = entry
                .held
                .as_deref()
                .map(Held::from_entries)
                .transpose()?
                .flatten();
            for g in &gone {
                if let Some(h) = Held::from_entries(&g.held)? {
                    match &mut all {
                        Some(a) => a.union(&h),
                        None => all = Some(h),
                    }
                }
            }
            entry.held = Some(all.map(|a| a.to_entries()).unwrap_or_default());
        }
    }
    if entry.pending.is_empty() && !entry.metal && entry.held.as_ref().is_some_and(Vec::is_empty) {
        // Gone: what its record counted since the entry was made is kept,
        // and its tombstone is listed for collection.
        if let Seen::Gone(_, true) = seen {
            index.tombstones.entry(key.to_string()).or_insert(now);
        }
        if let Some(e) = index.pools.remove(key) {
            if let Some(counted) = seen.counted() {
                for (sig, n) in counted {
                    let since = n.saturating_sub(e.base.get(sig).copied().unwrap_or(0));
                    if since > 0 {
                        *index.retired.entry(sig.clone()).or_default() += since;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Refreshes every entry whose `held` is unknown or that has an expired
/// grant (one `get` each; none in the steady state).
fn refresh_stale<K: KvStore>(kv: &K, index: &mut Index, now: u64) -> Result<()> {
    let stale: Vec<String> = index
        .pools
        .iter()
        .filter(|(_, e)| e.held.is_none() || e.pending.iter().any(|g| expired(g, now)))
        .map(|(k, _)| k.clone())
        .collect();
    for key in stale {
        refresh(kv, index, &key, None, now)?;
    }
    Ok(())
}

/// A grant of [`reserve`]: the registration owns it until it settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The grant's token (for [`settle`]).
    pub token: String,
    /// When it was granted: the registration must write the pool record
    /// within [`WRITE_DEADLINE_SECONDS`] of it ([`Reservation::check`]).
    pub at: u64,
}

impl Reservation {
    /// 503 `StepTooSlow` when the grant is older than the write deadline:
    /// the registration must not write the pool record any more (the grant
    /// may be dropped after [`TAKEOVER_AFTER_SECONDS`]).
    ///
    /// # Errors
    /// As described.
    pub fn check(&self, now: u64) -> Result<()> {
        if now.saturating_sub(self.at) > WRITE_DEADLINE_SECONDS {
            return Err(Error::transient(
                "StepTooSlow",
                "this registration took too long between its pool index grant and its pool write; retry",
            ));
        }
        Ok(())
    }
}

/// The 409 of an overlap.
fn overlap_error(id: &PoolId, other: &PoolId, first: IpAddr, n: u128, pending: bool) -> Error {
    let more = match n.saturating_sub(1) {
        0 => String::new(),
        1 => " and 1 more address".to_string(),
        m => format!(" and {m} more addresses"),
    };
    let why = if other.kind.is_global() {
        "which serves every namespace"
    } else if id.kind.is_global() {
        "and a global pool serves every namespace"
    } else {
        "of the same namespace"
    };
    let when = if pending {
        " (its registration is in progress)"
    } else {
        ""
    };
    Error::conflict(
        "PoolOverlap",
        format!(
            "pool {} would share {first}{more} with {} {} {why}{when}; both could hand out the same address",
            id.display(),
            other.kind.kind_name(),
            other.display(),
        ),
    )
}

/// Grants pool `id` the right to hold `held` in its record: refused with
/// 409 `PoolOverlap` when a pool of its address space holds (or is being
/// registered with) any of it, and 409 `TooManyPools` when a new entry
/// would pass [`MAX_POOLS`]. One read-modify-write of the index (a `get`
/// of a pool's record inside the decision for each entry it must check
/// against its record: a new entry's own pool, a conflicting entry, an
/// entry with an expired grant).
///
/// # Idempotency
/// Each call adds a grant; an unused grant expires after
/// [`TAKEOVER_AFTER_SECONDS`] and is dropped by the next write.
///
/// # Errors
/// The refusals above; store failures and `Contention` (503); 500 for an
/// unreadable index.
pub fn reserve<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId, held: &Held) -> Result<Reservation> {
    let key = keys::pool(id);
    let token = ctx.env.token();
    update_record::<K, IndexRecord, Reservation>(ctx, &(), |seen| {
        let now = ctx.env.now();
        let mut next = seen.cloned().unwrap_or_default();
        if next.collecting.contains_key(&key) {
            return Err(Error::transient(
                "PoolBeingCollected",
                format!(
                    "the tombstone of the deleted pool {} is being removed from the store; retry in a moment",
                    id.display()
                ),
            ));
        }
        next.tombstones.remove(&key);
        refresh_stale(ctx.kv, &mut next, now)?;
        if !next.pools.contains_key(&key) {
            if next.pools.len() >= MAX_POOLS {
                return Err(too_many());
            }
            refresh(ctx.kv, &mut next, &key, None, now)?;
        }
        // Entries that conflict are checked against their record first (a
        // crash may have left one larger than its pool).
        let mut checked = Vec::new();
        while let Some((other, _, _)) = next.conflict(id, held)? {
            let okey = keys::pool(&other);
            if checked.contains(&okey) {
                break;
            }
            refresh(ctx.kv, &mut next, &okey, None, now)?;
            checked.push(okey);
        }
        if let Some((other, first, n)) = next.conflict(id, held)? {
            let pending = next
                .held_of(&keys::pool(&other))?
                .is_none_or(|h| held.first_shared(&h).is_none());
            return Err(overlap_error(id, &other, first, n, pending));
        }
        let entry = next.pools.entry(key.clone()).or_default();
        entry.pending.push(Grant {
            token: token.clone(),
            at: now,
            held: held.to_entries(),
        });
        Ok(Decision::Write(
            Box::new(next),
            Reservation {
                token: token.clone(),
                at: now,
            },
        ))
    })
}

/// Brings pool `id`'s entry up to date with its record (read inside the
/// decision): `held` becomes what the record holds, the grant `token` (if
/// any) and expired grants are dropped, and the entry goes when its pool
/// is gone and no grant is left. What a registration calls after its pool
/// write (or its failure), and a deletion after its tombstone. Writes only
/// when something changed: `cas_read`, one `get`, and `cas_swap` when it
/// writes.
///
/// # Idempotency
/// Settling twice is settling once.
///
/// # Errors
/// Store failures and `Contention` (503); 500 for an unreadable index.
pub fn settle<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId, token: Option<&str>) -> Result<()> {
    let key = keys::pool(id);
    update_record::<K, IndexRecord, ()>(ctx, &(), |seen| {
        let now = ctx.env.now();
        let before = seen.cloned();
        let mut next = before.clone().unwrap_or_default();
        if next.collecting.contains_key(&key) {
            // Its tombstone is being removed: nothing of it to settle.
            return Ok(Decision::Done(()));
        }
        refresh(ctx.kv, &mut next, &key, token, now)?;
        if before.as_ref() == Some(&next) || (before.is_none() && next == Index::default()) {
            return Ok(Decision::Done(()));
        }
        Ok(Decision::Write(Box::new(next), ()))
    })
}

/// Lists pool `id` for its Metal provisioning (see [`Entry::metal`]), so
/// the metrics and the browser view see a VRF-backed pool before it is
/// registered. One `cas_read` when it is listed already.
///
/// # Idempotency
/// Listing twice is listing once.
///
/// # Errors
/// 409 `TooManyPools` past [`MAX_POOLS`]; store failures and `Contention`
/// (503).
pub fn list_metal<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<()> {
    mark_metal(ctx, id, true)
}

/// Withdraws [`list_metal`] once the pool's teardown is complete; the
/// entry goes when its pool holds nothing either.
///
/// # Idempotency
/// As [`list_metal`].
///
/// # Errors
/// Store failures and `Contention` (503).
pub fn unlist_metal<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<()> {
    mark_metal(ctx, id, false)
}

fn mark_metal<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId, on: bool) -> Result<()> {
    let key = keys::pool(id);
    update_record::<K, IndexRecord, ()>(ctx, &(), |seen| {
        let now = ctx.env.now();
        let current = seen.and_then(|i| i.pools.get(&key));
        if current.map_or(!on, |e| e.metal == on) {
            return Ok(Decision::Done(()));
        }
        let mut next = seen.cloned().unwrap_or_default();
        if on && current.is_none() && next.pools.len() >= MAX_POOLS {
            return Err(too_many());
        }
        if current.is_none() {
            refresh(ctx.kv, &mut next, &key, None, now)?;
        }
        next.pools.entry(key.clone()).or_default().metal = on;
        if !on {
            refresh(ctx.kv, &mut next, &key, None, now)?;
        }
        Ok(Decision::Write(Box::new(next), ()))
    })
}

fn too_many() -> Error {
    Error::conflict(
        "TooManyPools",
        format!("the pool index holds {MAX_POOLS} pools, the most it holds; delete a pool first"),
    )
}

/// What [`tidy`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tidied {
    /// Entries looked at.
    pub entries: usize,
    /// Entries removed (their pool was gone).
    pub removed: usize,
}

/// Brings every entry up to date with its record (one `get` per pool, one
/// write when anything changed): the reconcile's repair of what crashes
/// left (an entry whose pool's deletion did not settle, a grant whose
/// registration never wrote). `provisioning` says whether a pool listed
/// for its Metal provisioning still is (its progress record is live);
/// one that is not any more is withdrawn. Never run on a request path.
///
/// # Errors
/// Store failures and `Contention` (503); 500 for an unreadable index;
/// `provisioning`'s.
pub fn tidy<K: KvStore>(
    ctx: &Ctx<'_, K>,
    provisioning: &dyn Fn(&PoolId) -> Result<bool>,
) -> Result<Tidied> {
    update_record::<K, IndexRecord, Tidied>(ctx, &(), |seen| {
        let Some(before) = seen else {
            return Ok(Decision::Done(Tidied::default()));
        };
        let now = ctx.env.now();
        let mut next = before.clone();
        let keys: Vec<String> = next.pools.keys().cloned().collect();
        for key in &keys {
            if let Some(e) = next.pools.get_mut(key) {
                if e.metal {
                    let id = keys::parse_pool::<PoolId>(key);
                    e.metal = match id {
                        Some(id) => provisioning(&id)?,
                        None => false,
                    };
                }
            }
            refresh(ctx.kv, &mut next, key, None, now)?;
        }
        let out = Tidied {
            entries: keys.len(),
            removed: keys.len() - next.pools.len(),
        };
        if next == *before {
            return Ok(Decision::Done(out));
        }
        Ok(Decision::Write(Box::new(next), out))
    })
}

/// What [`collect`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Collected {
    /// Tombstones removed (each with its creation guard).
    pub removed: usize,
}

/// Removes the tombstones of pools deleted more than
/// [`TOMBSTONE_KEEP_S`] ago, with their creation guards, so the store keeps
/// no key of a pool deleted long ago (the reconcile runs it). Three steps
/// per batch: one write of the index moves the due tombstones (of pools
/// with no entry: no registration stands) to `collecting`, where
/// [`reserve`] refuses them; then each one's guard and record key are
/// deleted (the guard first: a registration after that finds the key
/// absent and creates it through a fresh guard); then one write of the
/// index forgets them. A crash leaves them in `collecting`, and the next
/// run deletes (again) and forgets them. Why no write is lost: only a
/// registration writes over a tombstone (every other decision on a
/// tombstone writes nothing), and a registration is granted by the index
/// first; a grant made before the move is an entry, which the move skips,
/// and one asked after it is refused until the removal ends.
///
/// # Idempotency
/// Deleting an absent key changes nothing; a second run finishes a first.
///
/// # Errors
/// Store failures and `Contention` (503).
pub fn collect<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Collected> {
    let due: Vec<String> = update_record::<K, IndexRecord, Vec<String>>(ctx, &(), |seen| {
        let Some(before) = seen else {
            return Ok(Decision::Done(Vec::new()));
        };
        let now = ctx.env.now();
        let mut next = before.clone();
        let moving: Vec<String> = next
            .tombstones
            .iter()
            .filter(|(k, at)| {
                now.saturating_sub(**at) >= TOMBSTONE_KEEP_S && !next.pools.contains_key(*k)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &moving {
            next.tombstones.remove(k);
            next.collecting.insert(k.clone(), now);
        }
        let all: Vec<String> = next.collecting.keys().cloned().collect();
        if moving.is_empty() {
            return Ok(Decision::Done(all));
        }
        Ok(Decision::Write(Box::new(next), all))
    })?;
    if due.is_empty() {
        return Ok(Collected::default());
    }
    for key in &due {
        if let Some(id) = keys::parse_pool::<PoolId>(key) {
            ctx.kv.delete(&keys::pool_init(&id))?;
            ctx.kv.delete(key)?;
        }
    }
    update_record::<K, IndexRecord, ()>(ctx, &(), |seen| {
        let Some(before) = seen else {
            return Ok(Decision::Done(()));
        };
        let mut next = before.clone();
        for k in &due {
            next.collecting.remove(k);
        }
        if next == *before {
            return Ok(Decision::Done(()));
        }
        Ok(Decision::Write(Box::new(next), ()))
    })?;
    Ok(Collected { removed: due.len() })
}

/// Creates the index of a store written before any index existed, from
/// one listing of its keys (once per store): each pool key found becomes
/// an entry whose `held` the next write fills in.
///
/// # Errors
/// Store failures and `Contention` (503).
pub fn create_from_listing<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<()> {
    let listed: Vec<String> = ctx
        .kv
        .list_keys()?
        .into_iter()
        .filter(|k| keys::parse_pool::<PoolId>(k).is_some())
        .collect();
    update_record::<K, IndexRecord, ()>(ctx, &(), |seen| {
        if seen.is_some() {
            return Ok(Decision::Done(()));
        }
        let pools = listed
            .iter()
            .map(|k| (k.clone(), Entry::default()))
            .collect();
        Ok(Decision::Write(
            Box::new(Index {
                pools,
                ..Index::default()
            }),
            (),
        ))
    })
}

/// The index's size, for the metrics: entries and bytes as stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Size {
    /// Entries (pools).
    pub entries: usize,
    /// Grants in flight.
    pub pending: usize,
}

impl Index {
    /// The requests ever counted in pool records, by signature: what the
    /// entries that went retired, plus, for each entry, what its record
    /// counted since the entry was made (`records`: each entry's record's
    /// counts, a tombstone's included; `None` for a record that is absent
    /// or does not load). Never decreases from one reading to the next:
    /// an entry goes in the same write that retires what its record
    /// counted, and a record's counts only grow.
    pub fn counted(&self, records: &BTreeMap<String, Option<Counted>>) -> Counted {
        let mut out = self.retired.clone();
        for (key, e) in &self.pools {
            let Some(Some(c)) = records.get(key) else {
                continue;
            };
            for (sig, n) in c {
                let since = n.saturating_sub(e.base.get(sig).copied().unwrap_or(0));
                if since > 0 {
                    *out.entry(sig.clone()).or_default() += since;
                }
            }
        }
        out
    }

    /// Its size.
    pub fn size(&self) -> Size {
        Size {
            entries: self.pools.len(),
            pending: self.pools.values().map(|e| e.pending.len()).sum(),
        }
    }
}
