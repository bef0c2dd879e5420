//! Who holds a pool's values, without listing the store: the holder
//! index. Its two parts and the rules that keep them exact are argued in
//! `kv-schema/README.md` ("Holder pages"); in short:
//!
//! - **In the pool record** ([`crate::ipam::alloc::Holders`]): a `Bind`
//!   intent names the claim a value is being bound to; when a decision sees
//!   its binding written it moves to `recent` (claim, value, cluster, and
//!   the holder order [`write_stamp`] of that write) instead of being
//!   forgotten; a release decision drops the claim's `recent` entry.
//! - **Holder pages** (`holders/<pool key suffix>/<incarnation>/<page>`,
//!   [`crate::ipam::store::HolderPage`]): value → holder for 256 values of
//!   one incarnation of the pool (its record created or rebuilt),
//!   written by a **flush** ([`flush_owed`], [`flush_holders`]): the request
//!   whose decision left [`FLUSH_AT`](crate::ipam::alloc::FLUSH_AT) or more `recent` entries writes them
//!   to their pages after its own claim write, keeping per value the entry
//!   with the higher stamp, then removes exactly those entries from
//!   `recent` in one more swap of the pool record.
//!
//! A reader ([`holders_of`]) resolves a held value (used, not cooling) to
//! its `Bind` intent, else to the newer of its `recent` entry and its page
//! entry. A page entry outlives its binding (it is only dropped when a
//! later write of the page finds it stale); readers never ask for a value
//! that is not held, and a later binding of the value has a higher stamp.
//!
//! A record written before the pages (or rebuilt by a repair) is not
//! `indexed`: [`index_holders`] lists the claim keys once, writes the
//! bindings it finds to the pages, and marks it indexed. Pages go with
//! their pool ([`sweep_pages`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::error::{Known, Result};
use crate::ip::RangeSet;
use crate::ipam::alloc::{page_of, write_stamp, Holder, IntentKind, PoolState, Recent};
use crate::ipam::pool::{PoolId, ValidatedPool};
use crate::ipam::store::{
    self, ClaimRecord, HolderPage, HolderPageRecord, Loaded, Next, PageEntry,
};
use crate::kv::protocol::{forget_record, replace_unreadable, update_record};
use crate::kv::{keys, Ctx, Decision, SwapCheck};
use crate::ports::kv::KvStore;

/// A flush: the `recent` entries to write to their pages, with what the
/// pool record said when they were taken (to drop stale page entries).
#[derive(Debug, Clone)]
pub struct Flush {
    id: PoolId,
    pool: ValidatedPool,
    exact: bool,
    incarnation: String,
    entries: Vec<Recent>,
    used: RangeSet,
    cooling: BTreeSet<u128>,
    /// Every entry with a stamp up to this one was confirmed (or listed)
    /// no later than the state `used` and `cooling` describe.
    limit: u64,
}

impl Flush {
    /// The flush that pool `l`'s `state`, as of the record's revision
    /// `rev`, owes when it holds at least `at_least` `recent` entries.
    pub fn owed(l: &Loaded, state: &PoolState, rev: u64, at_least: usize) -> Option<Flush> {
        if state.holders.recent.len() < at_least.max(1) {
            return None;
        }
        Some(Flush::of(l, state, rev, state.holders.recent.clone()))
    }

    fn of(l: &Loaded, state: &PoolState, rev: u64, entries: Vec<Recent>) -> Flush {
        Flush {
            id: l.object.id.clone(),
            pool: l.pool.clone(),
            exact: l.exact,
            incarnation: state.holders.page_incarnation().to_string(),
            entries,
            used: state.used.clone(),
            cooling: state.cooling.iter().map(|c| c.address).collect(),
            limit: write_stamp(rev),
        }
    }

    /// Whether page entry `e` for `address` can no longer name a holder:
    /// confirmed no later than this flush's state, whose value it found
    /// free or cooling (so released since; a later binding of it has a
    /// higher stamp).
    fn stale(&self, address: &str, e: &PageEntry) -> bool {
        if e.stamp > self.limit {
            return false;
        }
        match address
            .parse::<IpAddr>()
            .ok()
            .and_then(|ip| self.pool.value_of(ip))
        {
            Some(v) => !self.used.contains(v) || self.cooling.contains(&v),
            None => true,
        }
    }

    /// Page `cur` with this flush's `entries` merged in (the higher stamp
    /// wins) and stale entries dropped; `None` when nothing changes.
    fn merge(&self, cur: Option<&HolderPage>, entries: &[&Recent]) -> Option<HolderPage> {
        let mut next = cur.cloned().unwrap_or_default();
        next.entries.retain(|a, e| !self.stale(a, e));
        for r in entries {
            let a = self.pool.ip(r.address).to_string();
            if next.entries.get(&a).is_none_or(|e| e.stamp < r.stamp) {
                next.entries.insert(
                    a,
                    PageEntry {
                        claim: r.claim.clone(),
                        cluster: r.cluster.clone(),
                        stamp: r.stamp,
                    },
                );
            }
        }
        (cur != Some(&next)).then_some(next)
    }

    fn by_page(&self) -> BTreeMap<u128, Vec<&Recent>> {
        let mut out: BTreeMap<u128, Vec<&Recent>> = BTreeMap::new();
        for r in &self.entries {
            out.entry(page_of(r.address)).or_default().push(r);
        }
        out
    }
}

/// Writes page `page` of the flush (one read-modify-write of the page,
/// kept with the protocol: creation guard, read-back). `replace`: a page
/// that does not load is replaced by what this flush knows (the
/// migration's, whose entries are every binding of the page); otherwise
/// it is left as it is. Returns whether the page was written (or had
/// nothing to change).
fn write_page<K: KvStore>(
    ctx: &Ctx<'_, K>,
    f: &Flush,
    page: u128,
    entries: &[&Recent],
    replace: bool,
) -> Result<bool> {
    let pid = (f.id.clone(), f.incarnation.clone(), page);
    let out = update_record::<K, HolderPageRecord, ()>(ctx, &pid, |cur| {
        Ok(match f.merge(cur, entries) {
            None => Decision::Done(()),
            Some(next) => Decision::Write(Box::new(next), ()),
        })
    });
    match out {
        Ok(()) => Ok(true),
        Err(e) if e.is(Known::UnreadableRecord) => {
            if !replace {
                return Ok(false);
            }
            let check = if f.exact {
                SwapCheck::Exact
            } else {
                SwapCheck::Verify
            };
            replace_unreadable::<K, HolderPageRecord, ()>(ctx, &pid, check, || {
                let fresh = f.merge(None, entries).unwrap_or_default();
                Ok((fresh, ()))
            })?;
            // Replaced, or readable again (someone's repair): once more
            // the ordinary way.
            write_page(ctx, f, page, entries, false)
        }
        Err(e) => Err(e),
    }
}

/// What [`run_flush`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Entries that left `recent`.
    pub removed: usize,
    /// A page did not load: its entries stay in `recent`, and the pool is
    /// marked not indexed (so [`index_holders`] rebuilds the page).
    pub lost: bool,
}

/// Runs flush `f`: its entries into their pages, then one swap of the pool
/// record removing exactly the entries written (an entry whose page does
/// not load stays, and the pool is marked not indexed, so that
/// [`index_holders`] rebuilds that page).
///
/// # Idempotency
/// A flush repeated, or two at once, write the same entries (the higher
/// stamp wins per value); removing an entry already removed changes
/// nothing. A crash leaves entries both in `recent` and in a page, or only
/// in `recent`: never in neither.
///
/// # Errors
/// Store failures and `Contention` (503); 500 for an unreadable pool
/// record.
pub fn run_flush<K: KvStore>(ctx: &Ctx<'_, K>, f: &Flush) -> Result<Flushed> {
    let mut written: Vec<&Recent> = Vec::new();
    let mut lost = false;
    for (page, entries) in f.by_page() {
        if write_page(ctx, f, page, &entries, false)? {
            written.extend(entries);
        } else {
            lost = true;
        }
    }
    let removed = store::update_pool(ctx, &f.id, |cur| {
        let Some(l) = cur else {
            return Ok(Decision::Done(0));
        };
        if l.state.holders.page_incarnation() != f.incarnation {
            return Ok(Decision::Done(0));
        }
        let mut state = l.state.clone();
        let before = state.holders.recent.len();
        state.holders.recent.retain(|r| !written.contains(&r));
        let n = before - state.holders.recent.len();
        if lost {
            state.holders.indexed = false;
        }
        if state == l.state {
            return Ok(Decision::Done(0));
        }
        Ok(Decision::Write(
            Box::new(Next {
                pool: Some((l.object.clone(), l.pool.clone())),
                state,
            }),
            n,
        ))
    })?;
    Ok(Flushed { removed, lost })
}

/// What a decision's request owes after its claim write: the flush of
/// `f`, then, for a pool that is not indexed (`indexed`: as the decision
/// wrote it), its migration ([`index_holders`]: one listing, once per
/// pool). Errors are the caller's to ignore: what is not flushed stays in
/// `recent` for the next request past [`FLUSH_AT`](crate::ipam::alloc::FLUSH_AT).
///
/// # Errors
/// As [`run_flush`] and [`index_holders`].
pub fn flush_owed<K: KvStore>(ctx: &Ctx<'_, K>, f: &Flush, indexed: bool) -> Result<()> {
    let done = run_flush(ctx, f)?;
    if !indexed || done.lost {
        index_holders(ctx, std::slice::from_ref(&f.id))?;
    }
    Ok(())
}

/// Flushes pool `id`'s `recent` entries now, however few (one `get` of the
/// pool record, then as [`run_flush`]). What a caller with time to spare
/// may do (the interleaving checker races it with everything else);
/// allocations flush by themselves past [`FLUSH_AT`](crate::ipam::alloc::FLUSH_AT).
///
/// # Errors
/// As [`run_flush`].
pub fn flush_holders<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<usize> {
    let Some(l) = store::read_pool(ctx.kv, id)? else {
        return Ok(0);
    };
    match Flush::owed(&l, &l.state, l.rev, 1) {
        Some(f) => Ok(run_flush(ctx, &f)?.removed),
        None => Ok(0),
    }
}

/// What a reader found about some values of a pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holdings {
    /// The holder of each value that has one.
    pub by_value: BTreeMap<u128, Holder>,
    /// Pages that did not load (page, why): their values' holders are
    /// unknown.
    pub unreadable: Vec<(u128, String)>,
}

/// The holders of `values` of pool `l` (loaded): a `Bind` intent for the
/// value, else the newer of its `recent` entry and its page entry (one
/// `get` per page of `values` that the record lists). Whether a value is
/// held at all (used, not cooling) is the caller's question: a page entry
/// may outlive its binding. In a pool that is not `indexed`, bindings made
/// before the pages have no entry yet.
///
/// # Errors
/// Store failures (503); a page that does not load is reported in
/// [`Holdings::unreadable`], not fatal.
pub fn holders_of<K: KvStore>(kv: &K, l: &Loaded, values: &[u128]) -> Result<Holdings> {
    let st = &l.state;
    let bound: BTreeMap<u128, &str> = st
        .intents
        .iter()
        .filter(|i| i.kind == IntentKind::Bind)
        .map(|i| (i.address, i.claim.as_str()))
        .collect();
    let mut recent: BTreeMap<u128, &Recent> = BTreeMap::new();
    for r in &st.holders.recent {
        if recent.get(&r.address).is_none_or(|e| e.stamp < r.stamp) {
            recent.insert(r.address, r);
        }
    }
    let mut out = Holdings::default();
    let mut pages: BTreeMap<u128, Vec<u128>> = BTreeMap::new();
    for &v in values {
        if let Some(claim) = bound.get(&v) {
            out.by_value.insert(
                v,
                Holder {
                    claim: (*claim).to_string(),
                    cluster: None,
                    stamp: None,
                },
            );
        } else if st.holders.pages.contains(page_of(v)) {
            pages.entry(page_of(v)).or_default().push(v);
        } else if let Some(r) = recent.get(&v) {
            out.by_value.insert(v, holder(r));
        }
    }
    let inc = st.holders.page_incarnation();
    for (page, vs) in pages {
        let found = match store::read_page(kv, &l.object.id, inc, page) {
            Ok(p) => p,
            Err(e) if e.is(Known::UnreadableRecord) => {
                out.unreadable.push((page, e.message().to_string()));
                None
            }
            Err(e) => return Err(e),
        };
        for v in vs {
            let in_page = found
                .as_ref()
                .and_then(|p| p.entries.get(&l.pool.ip(v).to_string()));
            let best = match (recent.get(&v), in_page) {
                (Some(r), Some(e)) if e.stamp > r.stamp => Some(page_holder(e)),
                (Some(r), _) => Some(holder(r)),
                (None, Some(e)) => Some(page_holder(e)),
                (None, None) => None,
            };
            if let Some(h) = best {
                out.by_value.insert(v, h);
            }
        }
    }
    Ok(out)
}

fn holder(r: &Recent) -> Holder {
    Holder {
        claim: r.claim.clone(),
        cluster: r.cluster.clone(),
        stamp: Some(r.stamp),
    }
}

fn page_holder(e: &PageEntry) -> Holder {
    Holder {
        claim: e.claim.clone(),
        cluster: e.cluster.clone(),
        stamp: Some(e.stamp),
    }
}

/// Writes the bindings of pools that are not `indexed` (records written
/// before the holder pages, or rebuilt by a repair) to their pages: the
/// one-time migration. Each pool is read first (revision `r`); then the
/// claim keys are listed once for all of them (one `list_keys`, then a
/// `get` per claim key of the pools' namespaces, every namespace for a
/// global pool); per pool, one swap lists the pages it will write, the
/// pages are written with the stamp `2r + 1` (after every confirmation the
/// read saw, before every later one: the listing came after the read), and
/// one swap marks it indexed, unless its incarnation changed meanwhile.
/// A binding whose release the read record had decided (an `Unbind`
/// intent for its token) is left out. Returns the pools indexed.
///
/// # Idempotency
/// A pool already indexed is skipped; a crash leaves it not indexed, and
/// the next call does it again (its entries are merged by stamp).
///
/// # Errors
/// Store failures and `Contention` (503); 500 for an unreadable pool
/// record.
pub fn index_holders<K: KvStore>(ctx: &Ctx<'_, K>, ids: &[PoolId]) -> Result<usize> {
    let mut todo: BTreeMap<PoolId, Loaded> = BTreeMap::new();
    for id in ids {
        if let Some(l) = store::read_pool(ctx.kv, id)? {
            if !l.state.holders.indexed {
                todo.insert(id.clone(), l);
            }
        }
    }
    if todo.is_empty() {
        return Ok(0);
    }
    let any_global = todo.keys().any(|id| id.namespace.is_none());
    let namespaces: BTreeSet<&str> = todo
        .keys()
        .filter_map(|id| id.namespace.as_deref())
        .collect();
    let mut found: BTreeMap<PoolId, Vec<(String, ClaimRecord)>> = BTreeMap::new();
    for key in ctx.kv.list_keys()? {
        let Some((ns, name)) = keys::parse_claim(&key) else {
            continue;
        };
        if !any_global && !namespaces.contains(ns) {
            continue;
        }
        let Some(bytes) = ctx.kv.get(&key)? else {
            continue;
        };
        let Ok(record) = ClaimRecord::decode(&bytes) else {
            continue;
        };
        let Ok(pool) = record.pool_id(ns) else {
            continue;
        };
        if todo.contains_key(&pool) {
            found
                .entry(pool)
                .or_default()
                .push((format!("{ns}/{name}"), record));
        }
    }
    let mut n = 0;
    for (id, l) in &todo {
        if index_pool(ctx, l, found.get(id).map_or(&[], Vec::as_slice))? {
            n += 1;
        }
    }
    Ok(n)
}

/// [`index_holders`] of one pool `l` (as read before the listing), whose
/// bindings the listing found are `bound`.
fn index_pool<K: KvStore>(
    ctx: &Ctx<'_, K>,
    l: &Loaded,
    bound: &[(String, ClaimRecord)],
) -> Result<bool> {
    let id = &l.object.id;
    let inc = l.state.holders.page_incarnation().to_string();
    let releasing: BTreeSet<(&str, &str)> = l
        .state
        .intents
        .iter()
        .filter(|i| i.kind == IntentKind::Unbind)
        .map(|i| (i.claim.as_str(), i.token.as_str()))
        .collect();
    let entries: Vec<Recent> = bound
        .iter()
        .filter(|(claim, r)| !releasing.contains(&(claim.as_str(), r.token.as_str())))
        .filter_map(|(claim, r)| {
            let v = r.ip().ok().and_then(|ip| l.pool.value_of(ip))?;
            Some(Recent {
                claim: claim.clone(),
                address: v,
                cluster: r.cluster_name.clone(),
                stamp: write_stamp(l.rev) + 1,
            })
        })
        .collect();
    let pages = RangeSet::from_ranges(
        entries
            .iter()
            .map(|e| (page_of(e.address), page_of(e.address))),
    );
    fn mine<'a>(cur: Option<&'a Loaded>, inc: &str) -> Option<&'a Loaded> {
        cur.filter(|c| c.state.holders.page_incarnation() == inc && !c.state.holders.indexed)
    }
    let go = store::update_pool(ctx, id, |cur| {
        let Some(c) = mine(cur, &inc) else {
            return Ok(Decision::Done(false));
        };
        let mut state = c.state.clone();
        state.holders.pages.union_with(&pages);
        if state == c.state {
            return Ok(Decision::Done(true));
        }
        Ok(Decision::Write(
            Box::new(Next {
                pool: Some((c.object.clone(), c.pool.clone())),
                state,
            }),
            true,
        ))
    })?;
    if !go {
        return Ok(false);
    }
    let f = Flush::of(l, &l.state, l.rev, entries);
    let mut complete = true;
    for (page, entries) in f.by_page() {
        complete &= write_page(ctx, &f, page, &entries, true)?;
    }
    if !complete {
        return Ok(false);
    }
    store::update_pool(ctx, id, |cur| {
        let Some(c) = mine(cur, &inc) else {
            return Ok(Decision::Done(false));
        };
        let mut state = c.state.clone();
        state.holders.indexed = true;
        Ok(Decision::Write(
            Box::new(Next {
                pool: Some((c.object.clone(), c.pool.clone())),
                state,
            }),
            true,
        ))
    })
}

/// Deletes the holder pages `pages` of incarnation `inc` of pool `id`,
/// which its tombstone lists (a pool deletion, or a registration over the
/// tombstone of one that crashed before deleting them), then drops them
/// from the tombstone's list (one swap, only while the record is a
/// tombstone listing them). Each page: its key, its creation guard and any
/// stall note.
///
/// # Idempotency
/// Deleting what is gone changes nothing; a crash leaves the pages still
/// listed, for the next deletion or registration of the pool.
///
/// # Errors
/// Store failures and `Contention` (503).
pub fn sweep_pages<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    inc: &str,
    pages: &RangeSet,
) -> Result<()> {
    if pages.is_empty() {
        return Ok(());
    }
    for page in pages.iter() {
        forget_record::<K, HolderPageRecord>(ctx.kv, &(id.clone(), inc.to_string(), page))?;
    }
    store::update_pool(ctx, id, |cur| {
        if cur.is_some() {
            return Ok(Decision::Done(()));
        }
        let (live, (listed_inc, listed)) = store::read_pool_or_pages(ctx.kv, id)?;
        if live.is_some() || listed_inc != inc {
            return Ok(Decision::Done(()));
        }
        let mut left = listed.clone();
        left.subtract(pages);
        if left == listed {
            return Ok(Decision::Done(()));
        }
        let mut state = PoolState::default();
        state.holders.incarnation = listed_inc;
        state.holders.pages = left;
        Ok(Decision::Write(Box::new(Next { pool: None, state }), ()))
    })
}

/// Deletes every holder page of pool `id` among `keys` (a listing of the
/// store), whatever its incarnation: what a repair, which lists the store
/// anyway, does before it writes a new incarnation over a record it
/// cannot read (their entries belong to the lost one).
///
/// # Errors
/// Store failures (503).
pub fn forget_listed_pages<K: KvStore>(kv: &K, keys: &[String], id: &PoolId) -> Result<usize> {
    let prefix = keys::holders_of_pool(id);
    let mut n = 0;
    for k in keys.iter().filter(|k| k.starts_with(&prefix)) {
        if let Some((pool, inc, page)) = keys::parse_holders::<PoolId>(k) {
            if pool == *id {
                forget_record::<K, HolderPageRecord>(kv, &(pool, inc, page))?;
                n += 1;
            }
        }
    }
    Ok(n)
}
