//! The browser view's data (JSON), read from the store; nothing here
//! writes.
//!
//! - [`overview`]: every pool with its counts (one read per pool, through
//!   [`ops::list_pools`]), the Metal poll cursor, the last reconcile run.
//!   Never reads a claim binding.
//! - [`pool`]: one pool's addresses and their holders, free ranges,
//!   cooling addresses and, for a VRF-backed pool, its Metal resources.
//!   The holders of the addresses shown (at most [`MAX_ADDRESS_ROWS`]) are
//!   read through the holder index (`ipam::holders`): the pool record,
//!   then one read per holder page those addresses span. Never a listing,
//!   never a read per claim.
//! - [`machines`]: the machines of the observation summary (as fresh as
//!   the last reconcile run).
//! - [`search`]: an address (one read per pool, through the pool index,
//!   and one holder page per pool that has it in use), a claim by its full
//!   `namespace/name` (one read of its binding) or a machine name (the
//!   summary); at most [`MAX_RESULTS`] results.
//!
//! The machine holding an address is known only from the summary's
//! per-VLAN addresses; the owner of a plain CAPI claim is not in the store
//! (`machine` is then `null`, shown as "—").

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::ip::Family;
use crate::ipam::alloc::Holder;
use crate::ipam::holders;
use crate::ipam::ops::{self, PoolView};
use crate::ipam::pool::PoolId;
use crate::ipam::store::{self, Loaded};
use crate::kv::Ctx;
use crate::observe::summary::{self, Summary};
use crate::ports::kv::KvStore;
use crate::provision::{plan, poll, record};

/// Most address rows a pool page lists (the counts cover them all).
pub const MAX_ADDRESS_ROWS: usize = 1000;

/// Most free ranges a pool page lists.
pub const MAX_FREE_RANGES: usize = 200;

/// Most search results.
pub const MAX_RESULTS: usize = 50;

/// Longest search query, in bytes (after percent-decoding).
pub const MAX_QUERY: usize = 400;

/// A count as a JSON number, saturating at [`ops::MAX_COUNT`] as the
/// status and the metrics do (an IPv6 pool's size may pass it).
fn count(v: u128) -> i64 {
    ops::count(v)
}

/// `used / total` in percent, one decimal.
fn percent(used: u128, total: u128) -> f64 {
    if total == 0 {
        return 0.0;
    }
    // Precision loss is fine for a percentage.
    #[allow(clippy::cast_precision_loss)]
    let p = used as f64 * 100.0 / total as f64;
    (p * 10.0).round() / 10.0
}

/// The pool's id as the page names it: `ns/name`, or `name` for a global
/// pool.
/// The page's id of a pool: `ns/name` or `name`, with a leading `+` for a
/// prefix pool (no Kubernetes name starts with `+`).
fn pool_ref(id: &PoolId) -> String {
    let shape = if id.kind.is_prefix() { "+" } else { "" };
    match &id.namespace {
        Some(ns) => format!("{shape}{ns}/{}", id.name),
        None => format!("{shape}{}", id.name),
    }
}

fn family_name(f: Family) -> &'static str {
    match f {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// One pool's row: id, kind, family, VRF-backed, counts, utilisation.
fn pool_row(v: &PoolView, family: Option<Family>) -> Value {
    let id = &v.object.id;
    let c = &v.counts;
    json!({
        "id": pool_ref(id),
        "namespace": id.namespace,
        "name": id.name,
        "kind": id.kind.kind_name(),
        "family": family.map(family_name),
        "vrfBacked": v.object.spec.metal.is_some(),
        "total": count(c.total),
        "used": count(c.used),
        "free": count(c.free),
        "outOfRange": count(c.out_of_range),
        "cooling": count(c.cooling),
        "utilisation": percent(c.used, c.total),
    })
}

/// The overview: pools (with counts), the Metal poll cursor and the last
/// reconcile run.
///
/// ```json
/// {"pools": [{"id": "ns/p", "namespace": "ns", "name": "p", "kind": "MetalIPPool",
///   "family": "IPv4", "vrfBacked": false, "total": 10, "used": 2, "free": 8,
///   "outOfRange": 0, "cooling": 0, "utilisation": 20.0}],
///  "poll": null | {"last": "…", "gen": 3, "pending": 0},
///  "reconcile": null | {"at": 1700000000, "durationMs": 12, "errors": 0,
///   "machines": 2, "waiting": [...], "assignments": {...}},
///  "now": 1700000100}
/// ```
///
/// # Errors
/// The store failed (503) or a record is unreadable (500).
pub fn overview<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Value> {
    let listing = ops::list_pools(ctx.kv, None, ctx.env.now())?;
    let pools: Vec<Value> = listing
        .pools
        .iter()
        .map(|v| pool_row(v, v.object.spec.validate().ok().map(|p| p.family)))
        .collect();
    let unreadable: Vec<Value> = listing
        .unreadable
        .iter()
        .map(|(id, why)| {
            json!({"id": pool_ref(id), "kind": id.kind.kind_name(), "namespace": id.namespace,
                   "name": id.name, "error": why})
        })
        .collect();
    let poll = poll::read(ctx.kv, crate::cloud::CloudKind::Metal)?
        .map(|c| json!({"last": c.last, "gen": c.gen, "pending": c.pending.len()}));
    let reconcile = summary::read(ctx.kv)?.map(|s| {
        json!({
            "at": s.at,
            "durationMs": s.duration_ms,
            "errors": s.errors,
            "machines": s.machines.len() + s.machines_omitted as usize,
            "waiting": s.waiting,
            "assignments": s.assignments,
        })
    });
    Ok(json!({
        "pools": pools,
        "unreadable": unreadable,
        "poll": poll,
        "reconcile": reconcile,
        "now": ctx.env.now(),
    }))
}

/// Machine addresses from the summary: address (without prefix) →
/// `ns/name` of the machine.
fn machine_addresses(s: Option<&Summary>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for m in s.map(|s| s.machines.as_slice()).unwrap_or_default() {
        for a in m.addresses.values() {
            let ip = a.split('/').next().unwrap_or(a);
            out.insert(ip.to_string(), format!("{}/{}", m.namespace, m.name));
        }
    }
    out
}

/// A value of loaded pool `l` as text: the address, or for a prefix pool
/// the sub-prefix `net/len`.
fn value_text(l: &store::Loaded, v: u128) -> String {
    if l.object.id.kind.is_prefix() {
        format!("{}/{}", l.pool.ip(v), l.pool.prefix)
    } else {
        l.pool.ip(v).to_string()
    }
}

/// A range as text: `a` or `a-b` (sub-prefixes: `net/len` or
/// `net/len-net/len`).
fn range_text(l: &store::Loaded, (a, b): (u128, u128)) -> String {
    if a == b {
        value_text(l, a)
    } else {
        format!("{}-{}", value_text(l, a), value_text(l, b))
    }
}

/// A held Metal resource: id, created or adopted.
fn held(h: Option<&plan::Held>) -> Value {
    h.map_or(Value::Null, |h| json!({"id": h.id, "created": h.created}))
}

/// A VRF-backed pool's Metal resources and phase, from its progress
/// record.
fn metal<K: KvStore>(kv: &K, id: &PoolId) -> Result<Value> {
    let Some(p) = record::read_state(kv, id)? else {
        return Ok(
            json!({"phase": "not started", "vrf": null, "reservation": null,
            "vlan": null, "gateway": null, "gatewayState": null}),
        );
    };
    let gateway_ready =
        p.gateway.is_some() && matches!(p.gateway_state.as_deref(), Some("ready" | "active"));
    let phase = if p.deleted {
        "deleted".to_string()
    } else if p.deleting {
        "deleting".to_string()
    } else if let Some(i) = &p.intent {
        format!("creating {}", format!("{:?}", i.resource).to_lowercase())
    } else if gateway_ready {
        "ready".to_string()
    } else {
        "provisioning".to_string()
    };
    Ok(json!({
        "phase": phase,
        "vrf": held(p.vrf.as_ref()),
        "reservation": held(p.reservation.as_ref()),
        "vlan": held(p.vlan.as_ref()),
        "gateway": held(p.gateway.as_ref()),
        "gatewayState": p.gateway_state,
    }))
}

/// One pool: its row, spec, addresses with holders, free ranges, cooling
/// addresses and (VRF-backed) Metal resources; `None` when the pool is not
/// in the store. The holders of the rows shown come from the holder index
/// ([`holders::holders_of`]): one read per holder page they span.
///
/// `addresses[]`: `{"address", "state": "bound"|"cooling"|"pending",
/// "inRange", "claim", "cluster", "ipAddress", "machine", "until"}`
/// (at most [`MAX_ADDRESS_ROWS`]; `pending`: in use with no holder known,
/// an allocation whose binding is not written yet, or a leak);
/// `free[]`: ranges `a` or `a-b` (at most [`MAX_FREE_RANGES`]);
/// `holdersIndexed`: `false` while the pool's bindings made before the
/// holder pages are not indexed yet (their rows show no claim until the
/// migration, [`holders::index_holders`], ran); `holderPagesUnreadable`:
/// pages that did not load (their rows show no claim).
///
/// # Errors
/// The store failed (503) or a record is unreadable (500).
pub fn pool<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<Option<Value>> {
    let Some(l) = store::read_pool(ctx.kv, id)? else {
        return Ok(None);
    };
    let now = ctx.env.now();
    // Cooling ends by the clock: what a write would expire is free here.
    let mut l = l;
    l.state.expire(now);
    let view = PoolView::of(&l, now);
    let summary = summary::read(ctx.kv)?;
    let machines = machine_addresses(summary.as_ref());
    let cooling: BTreeMap<u128, u64> = l
        .state
        .cooling
        .iter()
        .map(|c| (c.address, c.until))
        .collect();
    let (shown, omitted) = shown_values(&l);
    let (rows, unreadable) = address_rows(ctx, &l, shown, &cooling, &machines)?;
    let mut free = l.pool.allocatable.clone();
    free.subtract(&l.state.used);
    let free_ranges: Vec<String> = free
        .ranges()
        .iter()
        .take(MAX_FREE_RANGES)
        .map(|&r| range_text(&l, r))
        .collect();
    let cooling_rows: Vec<Value> = l
        .state
        .cooling
        .iter()
        .map(|c| json!({"address": value_text(&l, c.address), "until": c.until}))
        .collect();
    let spec = &l.object.spec;
    let metal = if spec.metal.is_some() {
        metal(ctx.kv, id)?
    } else {
        Value::Null
    };
    Ok(Some(json!({
        "pool": pool_row(&view, Some(l.pool.family)),
        "spec": {
            "addresses": spec.addresses,
            "excludedAddresses": spec.excluded_addresses,
            "prefix": l.pool.prefix,
            "gateway": l.pool.gateway.map(|g| g.to_string()),
            "graceSeconds": l.pool.grace_seconds,
        },
        "addresses": rows,
        "addressesOmitted": count(omitted),
        "holdersIndexed": l.state.holders.indexed,
        "holderPagesUnreadable": unreadable,
        "free": free_ranges,
        "freeRangesOmitted": free.ranges().len().saturating_sub(MAX_FREE_RANGES),
        "cooling": cooling_rows,
        "metal": metal,
        "machinesAsOf": summary.as_ref().map(|s| s.at),
        "now": ctx.env.now(),
    })))
}

/// The address rows a pool's page shows: the first [`MAX_ADDRESS_ROWS`]
/// used values, and how many more are used.
fn shown_values(l: &Loaded) -> (Vec<u128>, u128) {
    let mut shown: Vec<u128> = Vec::new();
    let mut omitted: u128 = 0;
    for &(a, b) in l.state.used.ranges() {
        let n = b - a + 1;
        let room = MAX_ADDRESS_ROWS.saturating_sub(shown.len()) as u128;
        if room < n {
            omitted += n - room;
        }
        shown.extend((a..=b).take(usize::try_from(room.min(n)).unwrap_or(0)));
    }
    (shown, omitted)
}

/// The rows of `shown` values (state, holder, machine), with the count of
/// holder pages that did not load.
///
/// # Errors
/// Store failures.
fn address_rows<K: KvStore>(
    ctx: &Ctx<'_, K>,
    l: &Loaded,
    shown: Vec<u128>,
    cooling: &BTreeMap<u128, u64>,
    machines: &BTreeMap<String, String>,
) -> Result<(Vec<Value>, usize)> {
    let held: Vec<u128> = shown
        .iter()
        .copied()
        .filter(|v| !cooling.contains_key(v))
        .collect();
    let found = holders::holders_of(ctx.kv, l, &held)?;
    let mut rows = Vec::new();
    for v in shown {
        let address = value_text(l, v);
        let until = cooling.get(&v);
        let holder = if until.is_some() {
            None
        } else {
            found.by_value.get(&v)
        };
        let state = if until.is_some() {
            "cooling"
        } else if holder.is_some() || !l.state.holders.indexed {
            "bound"
        } else {
            "pending"
        };
        rows.push(json!({
            "address": address,
            "state": state,
            "inRange": l.pool.allocatable.contains(v),
            "claim": holder.map(|h| h.claim.clone()),
            "cluster": holder.and_then(|h| h.cluster.clone()),
            "ipAddress": holder.map(|h| h.claim.clone()),
            "machine": machines.get(&address),
            "until": until,
        }));
    }
    Ok((rows, found.unreadable.len()))
}

/// The machines of the last reconcile run: `{"asOf": null | unix seconds,
/// "machines": [MachineRow…], "omitted": n}` (`asOf` null: no reconcile run
/// yet).
///
/// # Errors
/// The store failed (503).
pub fn machines<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Value> {
    Ok(match summary::read(ctx.kv)? {
        Some(s) => json!({
            "asOf": s.at,
            "machines": s.machines,
            "omitted": s.machines_omitted,
        }),
        None => json!({"asOf": null, "machines": [], "omitted": 0}),
    })
}

/// Decodes `application/x-www-form-urlencoded` text (`+` is a space).
fn form_decode(s: &str) -> Result<String> {
    let s = s.replace('+', " ");
    percent_encoding::percent_decode_str(&s)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| Error::invalid("q", "the query is not UTF-8"))
}

/// The `q` parameter of a query string, percent-decoded and trimmed.
///
/// # Errors
/// 422 when absent, empty, longer than [`MAX_QUERY`] bytes or not UTF-8.
pub fn query_param(query: &str) -> Result<String> {
    let raw = query
        .split('&')
        .find_map(|p| p.strip_prefix("q="))
        .unwrap_or("");
    // Bound the work before decoding (a decoded byte takes at most 3).
    if raw.len() > 3 * MAX_QUERY {
        return Err(Error::invalid(
            "q",
            format!("the query is longer than {MAX_QUERY} bytes"),
        ));
    }
    let q = form_decode(raw)?;
    let q = q.trim();
    if q.is_empty() {
        return Err(Error::invalid(
            "q",
            "the query is empty: give an address, a claim or a machine name",
        ));
    }
    if q.len() > MAX_QUERY {
        return Err(Error::invalid(
            "q",
            format!("the query is longer than {MAX_QUERY} bytes"),
        ));
    }
    Ok(q.to_string())
}

/// What an address is in one pool.
fn address_result(
    l: &store::Loaded,
    v: u128,
    holder: Option<&Holder>,
) -> Option<(&'static str, Option<u64>)> {
    let until = l
        .state
        .cooling
        .iter()
        .find(|c| c.address == v)
        .map(|c| c.until);
    if until.is_some() {
        return Some(("cooling", until));
    }
    if l.state.used.contains(v) {
        let known = holder.is_some() || !l.state.holders.indexed;
        return Some((if known { "bound" } else { "pending" }, None));
    }
    if l.pool.allocatable.contains(v) {
        return Some(("free", None));
    }
    if l.pool.configured.contains(v) {
        return Some(("excluded", None));
    }
    None
}

/// Search: an address (exact; which pool has it in range or bound, which
/// claim holds it, cooling or free: one read per pool through the pool
/// index, and one holder page per pool that has it in use), a claim by
/// its full `namespace/name` (case-insensitive; one read of its binding:
/// claims are not listed) or a machine (`ns/name` substring, from the
/// summary). `query` is the request's query string; its `q` parameter is
/// the search.
///
/// `{"query", "results": [{"type": "address"|"claim"|"machine", …}],
/// "truncated"}`, at most [`MAX_RESULTS`] results.
///
/// # Errors
/// 422 for a bad query ([`query_param`]); the store failed (503).
pub fn search<K: KvStore>(ctx: &Ctx<'_, K>, query: &str) -> Result<Value> {
    let q = query_param(query)?;
    let needle = q.to_lowercase();
    let summary = summary::read(ctx.kv)?;
    let machine_of = machine_addresses(summary.as_ref());
    let mut results = Results::default();
    if let Ok(ip) = q.parse::<IpAddr>() {
        address_results(ctx, ip, &machine_of, &mut results)?;
    }
    if let Some((ns, name)) = claim_name(&needle) {
        if let Some(r) = ops::get_claim(ctx.kv, ns, name)? {
            results.push(json!({
                "type": "claim",
                "claim": format!("{ns}/{name}"),
                "address": r.address,
                "pool": r.pool_id(ns).ok().as_ref().map(pool_ref),
                "poolKind": r.pool_ref.kind,
                "cluster": r.cluster_name,
                "machine": machine_of.get(&r.address),
            }));
        }
    }
    for m in summary
        .as_ref()
        .map(|s| s.machines.as_slice())
        .unwrap_or_default()
    {
        let full = format!("{}/{}", m.namespace, m.name);
        let has_address = m
            .addresses
            .values()
            .any(|a| a.split('/').next() == Some(q.as_str()));
        if full.to_lowercase().contains(&needle) || has_address {
            results.push(json!({
                "type": "machine",
                "machine": full,
                "cluster": m.cluster,
                "device": m.device,
                "phase": m.phase,
                "addresses": m.addresses,
            }));
        }
    }
    let Results { results, truncated } = results;
    Ok(json!({"query": q, "results": results, "truncated": truncated}))
}

/// A search's results: at most [`MAX_RESULTS`], and whether more were
/// found.
#[derive(Default)]
struct Results {
    results: Vec<Value>,
    truncated: bool,
}

impl Results {
    fn push(&mut self, v: Value) {
        if self.results.len() < MAX_RESULTS {
            self.results.push(v);
        } else {
            self.truncated = true;
        }
    }
}

/// The search for an address: in every pool, the address (or, in a
/// prefix pool, the sub-prefix containing it) that is used or cooling.
///
/// # Errors
/// Store failures.
fn address_results<K: KvStore>(
    ctx: &Ctx<'_, K>,
    ip: IpAddr,
    machine_of: &BTreeMap<String, String>,
    results: &mut Results,
) -> Result<()> {
    let wanted = ip.to_string();
    let ids = match ops::indexed_pools(ctx.kv)? {
        Some(ids) => ids,
        // A store written before the pool index: as the overview does.
        None => ops::list_pools(ctx.kv, None, ctx.env.now())?
            .pools
            .into_iter()
            .map(|v| v.object.id)
            .collect(),
    };
    for id in ids {
        let ops::Found::Live(l) = ops::find_pool(ctx.kv, &id)? else {
            continue;
        };
        let mut l = *l;
        l.state.expire(ctx.env.now());
        // In a prefix pool, the sub-prefix containing the address.
        let Some(a) = l.pool.value_containing(ip) else {
            continue;
        };
        let found = if l.state.used.contains(a) && !l.state.is_cooling(a) {
            holders::holders_of(ctx.kv, &l, &[a])?
        } else {
            holders::Holdings::default()
        };
        let holder = found.by_value.get(&a);
        if let Some((state, until)) = address_result(&l, a, holder) {
            results.push(json!({
                "type": "address",
                "address": wanted,
                "pool": pool_ref(&id),
                "poolKind": id.kind.kind_name(),
                "state": state,
                "until": until,
                "claim": holder.map(|h| h.claim.clone()),
                "cluster": holder.and_then(|h| h.cluster.clone()),
                "machine": machine_of.get(&wanted),
            }));
        }
    }
    Ok(())
}

/// The claim a (lower-cased) query names, when it has the shape
/// `namespace/name` of valid Kubernetes names: what the search reads
/// directly (one `get`; claims are never listed).
fn claim_name(q: &str) -> Option<(&str, &str)> {
    let (ns, name) = q.split_once('/')?;
    let valid = crate::kube::names::check_label(ns).is_ok()
        && crate::kube::names::check_subdomain(name).is_ok();
    valid.then_some((ns, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_is_bounded_and_decoded() {
        assert_eq!(query_param("q=10.0.0.1").unwrap(), "10.0.0.1");
        assert_eq!(query_param("x=1&q=team-a%2Fm+0").unwrap(), "team-a/m 0");
        for bad in ["", "q=", "q=+", "q=%FF"] {
            assert_eq!(query_param(bad).unwrap_err().status(), 422, "{bad}");
        }
        assert_eq!(
            query_param(&format!("q={}", "a".repeat(MAX_QUERY)))
                .unwrap()
                .len(),
            MAX_QUERY
        );
        assert_eq!(
            query_param(&format!("q={}", "a".repeat(MAX_QUERY + 1)))
                .unwrap_err()
                .status(),
            422
        );
    }

    #[test]
    fn percent_rounds() {
        assert!((percent(1, 3) - 33.3).abs() < 1e-9);
        assert!(percent(0, 0).abs() < 1e-9);
    }
}
