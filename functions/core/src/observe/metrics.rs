//! The Prometheus exposition (text format 0.0.4) of `GET /v1/metrics`:
//! [`scrape`] reads a bounded set of keys and renders every family.
//!
//! What a scrape reads, and nothing else (no `list_keys`, no claim, no
//! machine): the pool index (1 `get`), each indexed pool's record (1
//! `get` per pool) and, for a VRF-backed pool or an indexed pool without a
//! live record (a VRF-backed pool being provisioned, a deleted pool), its
//! Metal progress record (1 `get`), the summary (1), the poll observation (1),
//! the signature registry (1), each signature's counter (1
//! `increment(key, 0)` each), the counter registry (1), each call or
//! conflict counter (1 each) and `obs/dropped` (1): **P + V + S + C + 6**
//! operations for P indexed pools, V of them VRF-backed or without a live
//! record, S signatures and C call and conflict counters (both bounded by
//! the build, not by traffic: [`counters`]), whatever the number of
//! claims, machines or requests. A store written before the pool index
//! costs one listing, once.
//!
//! The encoder is hand-written (families, HELP/TYPE once each, label and
//! help escaping): the `prometheus` crate would bring a registry, atomics
//! and protobuf-shaped types for a few hundred lines of text, and every
//! component's wasm links the core.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::error::Result;
use crate::ip::Family;
use crate::ipam::pool::PoolId;
use crate::ipam::store::Loaded;
use crate::ipam::{index, ops};
use crate::kv::{read_record, Ctx};
use crate::observe::counters::{self, CLASSES, METAL_OPS};
use crate::observe::summary;
use crate::ports::kv::{CountingKv, KvStore};
use crate::provision::plan::Progress;
use crate::provision::record::ProgressRecord;

/// The exposition's content type (text format 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric family being built: its samples are kept together, so each
/// family is rendered once, HELP and TYPE first.
struct FamilyText {
    kind: &'static str,
    help: &'static str,
    samples: Vec<(String, String)>,
}

/// An exposition under construction: families in the order first named.
#[derive(Default)]
pub struct Exposition {
    order: Vec<&'static str>,
    families: BTreeMap<&'static str, FamilyText>,
}

/// `\` → `\\`, `"` → `\"`, newline → `\n` (label values).
///
/// ```
/// use metal_ipam_core::observe::metrics::escape_label;
/// assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
/// ```
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

impl Exposition {
    /// Declares family `name` (`gauge` or `counter`) with its help text;
    /// a family declared twice keeps its first declaration.
    pub fn family(&mut self, name: &'static str, kind: &'static str, help: &'static str) {
        if !self.families.contains_key(name) {
            self.order.push(name);
            self.families.insert(
                name,
                FamilyText {
                    kind,
                    help,
                    samples: Vec::new(),
                },
            );
        }
    }

    /// Adds a sample of family `name` (declared first, else ignored).
    pub fn sample(&mut self, name: &'static str, labels: &[(&str, &str)], value: impl ToString) {
        let Some(f) = self.families.get_mut(name) else {
            debug_assert!(false, "undeclared family {name}");
            return;
        };
        let labels = if labels.is_empty() {
            String::new()
        } else {
            let inner: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            format!("{{{}}}", inner.join(","))
        };
        f.samples.push((labels, value.to_string()));
    }

    /// The text: each family's HELP and TYPE lines, then its samples.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for name in &self.order {
            let f = &self.families[name];
            let _ = writeln!(out, "# HELP {name} {}", escape_help(f.help));
            let _ = writeln!(out, "# TYPE {name} {}", f.kind);
            for (labels, value) in &f.samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        }
        out
    }
}

const GAUGE: &str = "gauge";
const COUNTER: &str = "counter";

/// Seconds as a sample value (`1.5`, `0`).
fn seconds(ms: u64) -> String {
    format!("{}", ms as f64 / 1000.0)
}

/// The exposition: pools, VRF-backed pools' Metal resources, the last
/// reconcile's summary, the poll cursor, the request counters and the
/// scrape's own cost (see the module docs for what it reads).
///
/// # Errors
/// Store failures (503), an unreadable pool index or registry (500).
pub fn scrape<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<String> {
    let kv = CountingKv::new(ctx.kv);
    let counted = Ctx {
        kv: &kv,
        env: ctx.env,
        swap_policy: ctx.swap_policy,
    };
    let mut x = Exposition::default();
    let (pools, in_records) = pools(&counted, &mut x)?;
    summary_families(&kv, &mut x)?;
    poll_families(&kv, ctx.env.now(), &mut x)?;
    counter_families(&kv, &in_records, &mut x)?;
    x.family(
        "metal_ipam_scrape_kv_operations",
        GAUGE,
        "Key-value operations this scrape made.",
    );
    x.sample("metal_ipam_scrape_kv_operations", &[], kv.counts().total());
    x.family(
        "metal_ipam_scrape_pools",
        GAUGE,
        "Pools this scrape reported (live records in the pool index).",
    );
    x.sample("metal_ipam_scrape_pools", &[], pools);
    Ok(x.render())
}

const POOL_GAUGES: [(&str, &str); 7] = [
    (
        "metal_ipam_pool_capacity",
        "Allocatable addresses (a prefix pool: sub-prefixes) in the pool's current spec, as status.ipAddresses.total (saturating at 2^63-1).",
    ),
    (
        "metal_ipam_pool_used",
        "Addresses (a prefix pool: sub-prefixes) bound to claims inside the pool's spec, as status.ipAddresses.used.",
    ),
    (
        "metal_ipam_pool_free",
        "Allocatable addresses (a prefix pool: sub-prefixes) neither bound nor in their reuse grace period at scrape time, as status.ipAddresses.free.",
    ),
    (
        "metal_ipam_pool_cooling",
        "Released addresses (a prefix pool: sub-prefixes) still in their reuse grace period at scrape time.",
    ),
    (
        "metal_ipam_pool_out_of_range",
        "Addresses (a prefix pool: sub-prefixes) bound to claims outside the pool's current spec, as status.ipAddresses.outOfRange.",
    ),
    (
        "metal_ipam_pool_ready",
        "1 when the pool serves claims: a live, valid record (and for a VRF-backed pool, its Metal resources ready), else 0.",
    ),
    (
        "metal_ipam_pool_exhausted",
        "1 when the pool has no free address, else 0.",
    ),
];

/// Phase of a VRF-backed pool's Metal resources, from its progress record.
fn phase_of(p: &Progress) -> &'static str {
    let all = p.vrf.is_some() && p.reservation.is_some() && p.vlan.is_some() && p.gateway.is_some();
    if p.deleted {
        "deleted"
    } else if p.deleting {
        "deleting"
    } else if all && p.gateway_state.as_deref() == Some("active") {
        "ready"
    } else {
        "provisioning"
    }
}

/// State of one Metal resource of a progress record.
fn resource_state(p: &Progress, field: &str) -> String {
    let held = match field {
        "vrf" => &p.vrf,
        "reservation" => &p.reservation,
        "vlan" => &p.vlan,
        _ => &p.gateway,
    };
    match held {
        Some(_) if p.deleting || p.deleted => "deleting".into(),
        Some(_) if field == "gateway" => p.gateway_state.clone().unwrap_or_else(|| "held".into()),
        Some(_) => "held".into(),
        None if p
            .intent
            .as_ref()
            .is_some_and(|i| i.resource.field() == field) =>
        {
            "creating".into()
        }
        None => "absent".into(),
    }
}

/// The pool families; returns how many pools were reported, and the
/// requests counted in pool records (`ipam::index::Index::counted`: the
/// allocations and releases that counted themselves in their pool's
/// write), from the same reads.
fn pools<K: KvStore>(ctx: &Ctx<'_, K>, x: &mut Exposition) -> Result<(usize, index::Counted)> {
    pool_families(x);
    let idx = match index::read(ctx.kv)? {
        Some(i) => i,
        None => {
            // A store written before the pool index: built once from one
            // listing.
            index::create_from_listing(ctx)?;
            index::read(ctx.kv)?.unwrap_or_default()
        }
    };
    x.sample("metal_ipam_pool_index_entries", &[], idx.size().entries);
    x.sample("metal_ipam_pool_index_capacity", &[], index::MAX_POOLS);
    let now = ctx.env.now();
    let mut n = 0;
    let mut records = BTreeMap::new();
    for id in idx.ids() {
        let (found, counted) = ops::find_pool_counted(ctx.kv, &id)?;
        records.insert(crate::kv::keys::pool(&id), counted);
        let l = match found {
            ops::Found::Live(l) => l,
            ops::Found::Unreadable(_) => {
                // Skipped and reported: one bad record hides nothing else.
                let ns = id.namespace.clone().unwrap_or_default();
                x.sample(
                    "metal_ipam_pool_record_unreadable",
                    &[
                        ("namespace", ns.as_str()),
                        ("name", id.name.as_str()),
                        ("kind", id.kind.kind_name()),
                    ],
                    1,
                );
                continue;
            }
            ops::Found::Absent => {
                // Not registered (yet, or any more): a VRF-backed pool
                // being provisioned has only its Metal progress.
                if let Some(p) = read_record::<_, ProgressRecord>(ctx.kv, &id)? {
                    if !p.deleted {
                        metal_samples(x, &id, &p);
                    }
                }
                continue;
            }
        };
        n += 1;
        live_pool_samples(ctx, x, &id, &l, now)?;
    }
    Ok((n, idx.counted(&records)))
}

/// The pool families' `HELP` and `TYPE` lines.
fn pool_families(x: &mut Exposition) {
    for (name, help) in POOL_GAUGES {
        x.family(name, GAUGE, help);
    }
    x.family(
        "metal_ipam_metal_resource",
        GAUGE,
        "1 for each Metal resource (vrf, reservation, vlan, gateway) of a VRF-backed pool, labelled with its state.",
    );
    x.family(
        "metal_ipam_metal_pool_phase",
        GAUGE,
        "1 for a VRF-backed pool's Metal provisioning phase (provisioning, ready, deleting, deleted).",
    );
    x.family(
        "metal_ipam_pool_record_unreadable",
        GAUGE,
        "1 for each pool whose stored record does not load (cut short, corrupt, or from a newer build): it is skipped everywhere else until a PUT (or re-applying the pool object) rebuilds it or a DELETE removes it.",
    );
    x.family(
        "metal_ipam_pool_index_entries",
        GAUGE,
        "Entries in the pool index: pools alive, plus pools being provisioned or deleted (bounded by what is alive).",
    );
    x.family(
        "metal_ipam_pool_index_capacity",
        GAUGE,
        "Most entries the pool index holds; a new pool past it is refused (TooManyPools).",
    );
}

/// A registered pool's gauges (and its Metal progress when VRF-backed).
fn live_pool_samples<K: KvStore>(
    ctx: &Ctx<'_, K>,
    x: &mut Exposition,
    id: &PoolId,
    l: &Loaded,
    now: u64,
) -> Result<()> {
    let c = l.state.counts_at(&l.pool, now);
    let vrf = l.object.spec.metal.is_some();
    let progress = if vrf {
        read_record::<_, ProgressRecord>(ctx.kv, id)?
    } else {
        None
    };
    let ready = !vrf || progress.as_ref().is_some_and(|p| phase_of(p) == "ready");
    let ns = id.namespace.clone().unwrap_or_default();
    let kind = id.kind.kind_name();
    let family = match l.pool.family {
        Family::V4 => "ipv4",
        Family::V6 => "ipv6",
    };
    let labels = [
        ("namespace", ns.as_str()),
        ("name", id.name.as_str()),
        ("kind", kind),
        ("family", family),
        ("vrf", if vrf { "true" } else { "false" }),
    ];
    let values = [
        ops::count(c.total),
        ops::count(c.used),
        ops::count(c.free),
        ops::count(c.cooling),
        ops::count(c.out_of_range),
        i64::from(ready),
        i64::from(c.free == 0),
    ];
    for ((name, _), v) in POOL_GAUGES.iter().zip(values) {
        x.sample(name, &labels, v);
    }
    if let Some(p) = &progress {
        metal_samples(x, id, p);
    }
    Ok(())
}

fn metal_samples(x: &mut Exposition, id: &PoolId, p: &Progress) {
    let ns = id.namespace.clone().unwrap_or_default();
    let kind = id.kind.kind_name();
    for resource in ["vrf", "reservation", "vlan", "gateway"] {
        let state = resource_state(p, resource);
        x.sample(
            "metal_ipam_metal_resource",
            &[
                ("namespace", &ns),
                ("name", &id.name),
                ("kind", kind),
                ("resource", resource),
                ("state", &state),
            ],
            1,
        );
    }
    x.sample(
        "metal_ipam_metal_pool_phase",
        &[
            ("namespace", &ns),
            ("name", &id.name),
            ("kind", kind),
            ("phase", phase_of(p)),
        ],
        1,
    );
}

/// The families read from the summary the last full reconcile wrote.
fn summary_families<K: KvStore>(kv: &K, x: &mut Exposition) -> Result<()> {
    let s = summary::read(kv)?;
    x.family(
        "metal_ipam_pool_claims_waiting",
        GAUGE,
        "Claims of a pool waiting for an address, by their Ready=False reason (as of the last reconcile).",
    );
    x.family(
        "metal_ipam_machines",
        GAUGE,
        "Machines opted into a network profile, by phase and by the network mode of their ports: each machine counts once, under its ports' mode, mixed when its ports are in different modes, none without ports (as of the last reconcile).",
    );
    x.family(
        "metal_ipam_metal_assignments",
        GAUGE,
        "Claims' open Metal IP assignment records by state (as of the last reconcile).",
    );
    x.family(
        "metal_ipam_reconcile_last_run_timestamp_seconds",
        GAUGE,
        "Unix time when the last full reconcile ended.",
    );
    x.family(
        "metal_ipam_reconcile_errors",
        GAUGE,
        "Errors the last full reconcile reported.",
    );
    x.family(
        "metal_ipam_reconcile_duration_seconds",
        GAUGE,
        "Duration of the last full reconcile.",
    );
    let Some(s) = s else {
        return Ok(());
    };
    for w in &s.waiting {
        x.sample(
            "metal_ipam_pool_claims_waiting",
            &[
                ("namespace", &w.pool.namespace),
                ("name", &w.pool.name),
                ("kind", &w.pool.kind),
                ("reason", &w.reason),
            ],
            w.count,
        );
    }
    let mut machines: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for m in &s.machines {
        let mut modes: Vec<&str> = m.ports.iter().map(|p| p.mode.as_str()).collect();
        modes.sort_unstable();
        modes.dedup();
        let mode = match modes.as_slice() {
            [] => "none",
            [one] => one,
            _ => "mixed",
        };
        *machines.entry((m.phase.as_str(), mode)).or_default() += 1;
    }
    for ((phase, mode), n) in machines {
        x.sample(
            "metal_ipam_machines",
            &[("phase", phase), ("mode", mode)],
            n,
        );
    }
    for (state, n) in &s.assignments {
        x.sample("metal_ipam_metal_assignments", &[("state", state)], n);
    }
    x.sample("metal_ipam_reconcile_last_run_timestamp_seconds", &[], s.at);
    x.sample("metal_ipam_reconcile_errors", &[], s.errors);
    x.sample(
        "metal_ipam_reconcile_duration_seconds",
        &[],
        seconds(s.duration_ms),
    );
    Ok(())
}

/// The poll families, from the poll observation (`obs/poll`, written by
/// each poll call that read events, [`super::summary::PollSeen`]); none
/// before the first.
fn poll_families<K: KvStore>(kv: &K, now: u64, x: &mut Exposition) -> Result<()> {
    x.family(
        "metal_ipam_poll_last_success_timestamp_seconds",
        GAUGE,
        "Unix time of the Metal event poll's last successful run.",
    );
    x.family(
        "metal_ipam_poll_cursor_age_seconds",
        GAUGE,
        "Seconds since a poll last moved the event cursor (ingested events).",
    );
    x.family(
        "metal_ipam_poll_events_behind",
        GAUGE,
        "Devices named by ingested Metal events and not handled yet after the last poll.",
    );
    x.family(
        "metal_ipam_poll_devices_failing",
        GAUGE,
        "Devices pending after the last poll whose reads keep failing (each backs off).",
    );
    x.family(
        "metal_ipam_poll_oldest_pending_seconds",
        GAUGE,
        "Seconds the oldest device pending after the last poll has waited since Metal's events first named it (0: none pending).",
    );
    let Some(seen) = super::summary::read_poll(kv)? else {
        return Ok(());
    };
    if seen.at > 0 {
        x.sample(
            "metal_ipam_poll_last_success_timestamp_seconds",
            &[],
            seen.at,
        );
    }
    if seen.cursor_moved_at > 0 {
        x.sample(
            "metal_ipam_poll_cursor_age_seconds",
            &[],
            now.saturating_sub(seen.cursor_moved_at),
        );
    }
    x.sample("metal_ipam_poll_events_behind", &[], seen.pending);
    x.sample("metal_ipam_poll_devices_failing", &[], seen.failing);
    let oldest = match seen.oldest_pending_since {
        0 => 0,
        since => now.saturating_sub(since),
    };
    x.sample("metal_ipam_poll_oldest_pending_seconds", &[], oldest);
    Ok(())
}

/// The request, call and conflict counters ([`counters::read_all`]),
/// with the requests counted in pool records (`in_records`: allocations
/// and releases that counted themselves in their pool's write), and the
/// registries' size against their caps.
fn counter_families<K: KvStore>(
    kv: &K,
    in_records: &index::Counted,
    x: &mut Exposition,
) -> Result<()> {
    let mut t = counters::read_all(kv)?;
    for (text, n) in in_records {
        t.add_signature(text, *n);
    }
    request_families(&t, x);
    call_families(&t, x);
    Ok(())
}

/// What the components answered: requests by route and status,
/// allocations, releases, compare-and-swap conflicts, contention.
fn request_families(t: &counters::Totals, x: &mut Exposition) {
    x.family(
        "metal_ipam_requests_total",
        COUNTER,
        "Requests answered by components with a store, by component, route template and status (route other: counted without their own signature).",
    );
    for ((component, route, status), n) in &t.requests {
        let status = status.to_string();
        x.sample(
            "metal_ipam_requests_total",
            &[
                ("component", component),
                ("route", route),
                ("status", &status),
            ],
            n,
        );
    }
    x.family(
        "metal_ipam_allocations_total",
        COUNTER,
        "Addresses allocated by the plain HTTP API (answers with outcome allocated).",
    );
    x.sample("metal_ipam_allocations_total", &[], t.allocations);
    x.family(
        "metal_ipam_releases_total",
        COUNTER,
        "Addresses released (answers with outcome released, machine releases excluded).",
    );
    x.sample("metal_ipam_releases_total", &[], t.releases);
    x.family(
        "metal_ipam_kv_cas_conflicts_total",
        COUNTER,
        "Compare-and-swap writes that did not land (another writer came first), by component.",
    );
    for (component, n) in &t.conflicts {
        x.sample(
            "metal_ipam_kv_cas_conflicts_total",
            &[("component", component)],
            n,
        );
    }
    x.family(
        "metal_ipam_contention_answers_total",
        COUNTER,
        "Answers 503 Contention (a record changed by too many requests at once), by component.",
    );
    for (component, n) in &t.contention {
        x.sample(
            "metal_ipam_contention_answers_total",
            &[("component", component)],
            n,
        );
    }
}

/// The calls made (Metal, Kubernetes), the requests counted without a
/// signature of their own, and the registries' sizes.
fn call_families(t: &counters::Totals, x: &mut Exposition) {
    x.family(
        "metal_ipam_metal_calls_total",
        COUNTER,
        "Equinix Metal API calls by operation (method and path template) and status class (error: no response).",
    );
    for ((op, class), n) in &t.metal {
        x.sample(
            "metal_ipam_metal_calls_total",
            &[("operation", METAL_OPS[*op]), ("class", CLASSES[*class])],
            n,
        );
    }
    x.family(
        "metal_ipam_kube_calls_total",
        COUNTER,
        "Kubernetes API calls by component and status class (error: no response).",
    );
    for ((component, class), n) in &t.kube {
        x.sample(
            "metal_ipam_kube_calls_total",
            &[("component", component), ("class", CLASSES[*class])],
            n,
        );
    }
    x.family(
        "metal_ipam_metrics_unregistered_requests_total",
        COUNTER,
        "Requests not counted under their own signature: in metal_ipam_requests_total under route other (the signature registry was full), or, from an earlier build, not counted there at all.",
    );
    x.sample(
        "metal_ipam_metrics_unregistered_requests_total",
        &[],
        t.unregistered,
    );
    x.family(
        "metal_ipam_registry_entries",
        GAUGE,
        "Members of a registry record (signatures: request signatures; counters: call and conflict counter keys).",
    );
    x.family(
        "metal_ipam_registry_capacity",
        GAUGE,
        "The cap of a registry record (signatures: for a request's own signature; the overflow signatures have a reserve beyond it).",
    );
    for (registry, entries, cap) in [
        ("signatures", t.signatures, counters::MAX_SIGNATURES),
        ("counters", t.counters, counters::COUNTER_KEYS),
    ] {
        x.sample(
            "metal_ipam_registry_entries",
            &[("registry", registry)],
            entries,
        );
        x.sample(
            "metal_ipam_registry_capacity",
            &[("registry", registry)],
            cap,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_and_type_once_and_samples_together() {
        let mut x = Exposition::default();
        x.family("a_total", COUNTER, "A help\\with \"quotes\"\nand lines.");
        x.family("b", GAUGE, "B.");
        x.sample("a_total", &[("l", "x\"y")], 1);
        x.sample("b", &[], 2);
        x.sample("a_total", &[("l", "p\\q\nr")], 3);
        x.family("a_total", GAUGE, "ignored");
        let text = x.render();
        assert_eq!(
            text,
            "# HELP a_total A help\\\\with \"quotes\"\\nand lines.\n\
             # TYPE a_total counter\n\
             a_total{l=\"x\\\"y\"} 1\n\
             a_total{l=\"p\\\\q\\nr\"} 3\n\
             # HELP b B.\n\
             # TYPE b gauge\n\
             b 2\n"
        );
        assert_eq!(text.matches("# TYPE a_total").count(), 1);
    }

    #[test]
    fn seconds_are_decimal() {
        assert_eq!(seconds(1500), "1.5");
        assert_eq!(seconds(0), "0");
    }
}
