//! Lookups: one pool, the pool index's ids, every pool listed, and any
//! stored record decoded for the browser view.

use crate::error::Known;
use crate::error::Result;
use crate::ipam::index::{self};
use crate::ipam::pool::{PoolId, PoolKind};
use crate::ipam::store::{self, Loaded, PoolRecord};
use crate::kv::{keys, Ctx};
use crate::ports::kv::KvStore;

use super::PoolView;

/// Reads one pool (one `get`), its counts as of `now` (cooling
/// addresses whose grace period ended count as free).
///
/// # Errors
/// Store failures (503), unreadable record (500 `UnreadableRecord`).
pub fn get_pool<K: KvStore>(kv: &K, id: &PoolId, now: u64) -> Result<Option<PoolView>> {
    Ok(store::read_pool(kv, id)?
        .as_ref()
        .map(|l| PoolView::of(l, now)))
}

/// A pool's record as a reader finds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// Absent, or deleted.
    Absent,
    /// Registered.
    Live(Box<Loaded>),
    /// The record does not load: the message says why. A `PUT` of the
    /// pool rebuilds it; a `DELETE` deletes it when no claim holds one of
    /// its addresses.
    Unreadable(String),
}

/// [`find_pool`], with the requests its record counted (a tombstone's
/// included; `None` when absent or unreadable): what the metrics read of
/// each indexed pool, in the same one `get`.
///
/// # Errors
/// Store failures (503).
pub fn find_pool_counted<K: KvStore>(
    kv: &K,
    id: &PoolId,
) -> Result<(Found, Option<index::Counted>)> {
    let Some(bytes) = kv
        .get(&keys::pool(id))?
        .filter(|b| !crate::ports::kv::is_zero_counter(b))
    else {
        return Ok((Found::Absent, None));
    };
    let loaded = PoolRecord::decode(&bytes).and_then(|r| r.load(id).map(|l| (l, r.state.counted)));
    match loaded {
        Ok((None, c)) => Ok((Found::Absent, Some(c))),
        Ok((Some(l), c)) => Ok((Found::Live(Box::new(l)), Some(c))),
        Err(e) if e.is(Known::UnreadableRecord) => {
            Ok((Found::Unreadable(e.message().to_string()), None))
        }
        Err(e) => Err(e),
    }
}

/// Reads pool `id` (one `get`), telling an unreadable record apart.
///
/// # Errors
/// Store failures (503).
pub fn find_pool<K: KvStore>(kv: &K, id: &PoolId) -> Result<Found> {
    match store::read_pool(kv, id) {
        Ok(None) => Ok(Found::Absent),
        Ok(Some(l)) => Ok(Found::Live(Box::new(l))),
        Err(e) if e.is(Known::UnreadableRecord) => Ok(Found::Unreadable(e.message().to_string())),
        Err(e) => Err(e),
    }
}

/// The ids of the pools the index lists (deleted ones whose entry is not
/// settled yet included), sorted; `None` when the store has no index yet
/// (one `get`).
///
/// # Errors
/// Store failures (503), an unreadable index (500).
pub fn indexed_pools<K: KvStore>(kv: &K) -> Result<Option<Vec<PoolId>>> {
    Ok(index::read(kv)?.map(|i| i.ids()))
}

/// [`indexed_pools`], creating the index first when it does not exist
/// (one listing of the store, once per store: [`index::create_from_listing`]).
///
/// # Errors
/// Store failures (503), an unreadable index (500).
pub fn pool_ids<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Vec<PoolId>> {
    if let Some(ids) = indexed_pools(ctx.kv)? {
        return Ok(ids);
    }
    index::create_from_listing(ctx)?;
    Ok(indexed_pools(ctx.kv)?.unwrap_or_default())
}

/// What a listing found: the pools, and those whose record does not load
/// (skipped, each with why), so one bad record hides nothing else.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// The registered pools, sorted by key.
    pub pools: Vec<PoolView>,
    /// Pools whose record does not load.
    pub unreadable: Vec<(PoolId, String)>,
}

/// Lists pools, sorted by key; `kind` restricts to one kind; counts as of
/// `now`. Reads the pool index, then each pool (deleted ones skipped;
/// unreadable ones reported, not fatal); without an index (a store written
/// before it), lists the store's keys instead, without writing.
///
/// # Errors
/// Store failures (503), an unreadable index (500).
pub fn list_pools<K: KvStore>(kv: &K, kind: Option<PoolKind>, now: u64) -> Result<Listing> {
    let ids = match indexed_pools(kv)? {
        Some(ids) => ids,
        None => {
            let mut ids: Vec<PoolId> = kv
                .list_keys()?
                .iter()
                .filter_map(|k| keys::parse_pool::<PoolId>(k))
                .collect();
            ids.sort();
            ids
        }
    };
    read_pools(kv, ids, kind, now)
}

/// [`list_pools`], creating the index when it does not exist
/// ([`pool_ids`]).
///
/// # Errors
/// As [`list_pools`].
pub fn list_pools_in<K: KvStore>(ctx: &Ctx<'_, K>, kind: Option<PoolKind>) -> Result<Listing> {
    let ids = pool_ids(ctx)?;
    read_pools(ctx.kv, ids, kind, ctx.env.now())
}

fn read_pools<K: KvStore>(
    kv: &K,
    ids: Vec<PoolId>,
    kind: Option<PoolKind>,
    now: u64,
) -> Result<Listing> {
    let mut out = Listing::default();
    for id in ids
        .into_iter()
        .filter(|id| kind.is_none_or(|k| id.kind == k))
    {
        match find_pool(kv, &id)? {
            Found::Absent => {}
            Found::Live(l) => out.pools.push(PoolView::of(&l, now)),
            Found::Unreadable(why) => out.unreadable.push((id, why)),
        }
    }
    Ok(out)
}
