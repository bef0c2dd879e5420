//! A year in minutes: an installation's life simulated on the pure core,
//! with an injected clock, to show that nothing it accumulates grows with
//! history.
//!
//! Every simulated day pools are created (each in one of a few namespaces,
//! some with a reuse grace period, some prefix pools), claims allocated in
//! them, some released, pools older than their lifetime emptied and
//! deleted; a scrape, a listing, the reconcile's tidy of the pool index and
//! requests of many shapes (statuses, reasons, Kubernetes and Metal call
//! counts, conflicts) recorded by the request counters. The store is the
//! core's in-memory [`MemKv`] with Spin SQLite's semantics; every operation
//! is the real code (`ipam::ops`, `ipam::index`, `observe::metrics`,
//! `observe::counters`).
//!
//! Sampled on simulated days: pools alive, pool index entries and bytes,
//! the key-value reads of one scrape and one listing, the key-value
//! operations of the day's allocations (median), the registered request
//! signatures, the store's keys. [`run`] returns the samples; the soak test
//! (`tests/tests/soak.rs`) asserts they stay flat, the bench program
//! (`cargo run --release -p metal-ipam-tests --bin soak`) prints them with
//! the scrape's wall time.

use std::time::Instant;

use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::index;
use metal_ipam_core::ipam::ops;
use metal_ipam_core::ipam::pool::{PoolId, PoolKind, PoolObject};
use metal_ipam_core::kv::{keys, Ctx};
use metal_ipam_core::observe::{counters, metrics};
use metal_ipam_core::ports::kv::{CountingKv, KvStore};
use metal_ipam_core::ports::Env;
use metal_ipam_core::provision::assign::MetalAssignmentClosed;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::json;

/// The shape of a simulated life.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Simulated days.
    pub days: u64,
    /// Pools created each day.
    pub pools_per_day: u64,
    /// Days a pool lives before it is emptied and deleted.
    pub pool_life_days: u64,
    /// Claims allocated in each new pool.
    pub claims_per_pool: u64,
    /// Requests of varied shapes recorded by the counters each day.
    pub requests_per_day: u64,
    /// A sample every this many days.
    pub sample_every: u64,
}

impl Config {
    /// What the soak test runs: a year, 30 pools a day (10,950 pools made
    /// and deleted), four claims each, 300 counted requests a day.
    pub const TEST: Config = Config {
        days: 365,
        pools_per_day: 30,
        pool_life_days: 7,
        claims_per_pool: 4,
        requests_per_day: 300,
        sample_every: 30,
    };
}

/// One sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// The simulated day.
    pub day: u64,
    /// Pools alive.
    pub live_pools: usize,
    /// Pools made so far.
    pub pools_made: u64,
    /// Requests recorded so far (allocations, releases, pool writes and
    /// the varied requests).
    pub requests: u64,
    /// Entries in the pool index.
    pub index_entries: usize,
    /// The pool index's stored size in bytes.
    pub index_bytes: usize,
    /// Key-value operations of one scrape.
    pub scrape_kv: u32,
    /// Wall time of that scrape, in milliseconds (not asserted on).
    pub scrape_ms: f64,
    /// Key-value operations of one `GET /v1/pools` listing.
    pub list_kv: u32,
    /// Median key-value operations of the day's allocations.
    pub alloc_kv_median: u32,
    /// Request signatures registered.
    pub signatures: usize,
    /// Keys in the store (the tombstones of pools deleted within the last
    /// day included: older ones are collected).
    pub store_keys: usize,
}

fn ctx<'a, K: KvStore>(kv: &'a K, env: &'a TestEnv) -> Ctx<'a, K> {
    Ctx::auto(kv, env)
}

/// Pool number `n`: its id, object and kind (every fifth a prefix pool,
/// every third with a 60 s grace period), in one of four namespaces, with
/// its own /28 (or /26 split into /30s).
fn pool(n: u64) -> (PoolId, PoolObject) {
    let ns = format!("team-{}", n % 4);
    let name = format!("p{n}");
    let (b, c) = ((n >> 8) & 0xff, n & 0xff);
    let prefix = n.is_multiple_of(5);
    let grace = if n.is_multiple_of(3) { 60 } else { 0 };
    let (kind, body) = if prefix {
        (
            PoolKind::NamespacedPrefix,
            json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalPrefixPool",
                   "metadata": {"name": name, "namespace": ns},
                   "spec": {"prefixes": [format!("10.{b}.{c}.0/26")], "allocationPrefixLength": 30,
                            "addressReuseGracePeriodSeconds": grace}}),
        )
    } else {
        (
            PoolKind::Namespaced,
            json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
                   "metadata": {"name": name, "namespace": ns},
                   "spec": {"addresses": [format!("10.{b}.{c}.0/28")], "prefix": 28,
                            "addressReuseGracePeriodSeconds": grace}}),
        )
    };
    let id = PoolId::of(kind, &ns, &name);
    let object = PoolObject::parse(&id, &body).expect("pool");
    (id, object)
}

fn claim(id: &PoolId, name: &str, uid: &str) -> Claim {
    Claim::parse(&json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": id.namespace.clone().unwrap_or_default(), "uid": uid},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": id.kind.kind_name(), "name": id.name}}
    }))
    .expect("claim")
}

/// The shapes requests take: (component, route, status, outcome, reason).
/// Their outbound call and conflict counts vary too ([`varied_calls`]),
/// but those are counted, not keyed: they make no signatures of their own.
const SHAPES: [(&str, &str, u16, &str, &str); 8] = [
    ("allocate", "/v1/claims", 201, "allocated", "-"),
    ("allocate", "/v1/claims", 409, "error", "PoolExhausted"),
    ("allocate", "/v1/claims", 503, "error", "Contention"),
    (
        "release",
        "/v1/claims/{namespace}/{name}",
        204,
        "released",
        "-",
    ),
    ("reconcile", "/v1/reconcile", 200, "reconciled", "-"),
    ("poll", "/v1/metal/poll", 200, "polled", "-"),
    ("poll", "/v1/metal/poll", 503, "error", "MetalUnavailable"),
    (
        "pools",
        "/v1/pools/{namespace}/{name}",
        409,
        "error",
        "PoolOverlap",
    ),
];

/// The outbound calls of request `i`: counts that differ from request to
/// request (as the number of objects a reconcile touches does).
fn varied_calls(i: u64) -> counters::Calls {
    let mut calls = counters::Calls::default();
    calls.kube[0] = (i % 13) as u32;
    calls.kube[2] = (i % 3) as u32;
    if i.is_multiple_of(5) {
        calls
            .metal
            .insert(((i % 4) as usize, 0), (i % 7) as u32 + 1);
    }
    calls
}

/// Counts request `i` as the shell does.
fn record_varied<K: KvStore>(c: &Ctx<'_, K>, i: u64) -> metal_ipam_core::Result<()> {
    let (component, route, status, outcome, reason) = SHAPES[(i % 8) as usize];
    let calls = varied_calls(i);
    counters::record_request(
        c,
        &counters::Request {
            component,
            route,
            status,
            outcome,
            reason,
            conflicts: (i % 4) as u32,
            calls: &calls,
            signature_counted: false,
        },
    )
}

/// Runs `cfg`, calling `each` with every sample as it is taken; returns
/// them all.
///
/// # Panics
/// When an operation the simulation expects to succeed fails (a bug the
/// soak found).
pub fn run(cfg: Config, mut each: impl FnMut(&Sample)) -> Vec<Sample> {
    let kv = MemKv::new(Backend::SpinSqlite);
    let env = TestEnv::at(1_700_000_000);
    let c = ctx(&kv, &env);
    let mut live: std::collections::VecDeque<(u64, u64)> = Default::default(); // (pool n, day made)
    let mut made = 0u64;
    let mut requests = 0u64;
    let mut samples = Vec::new();
    let mut alloc_ops: Vec<u32> = Vec::new();
    for day in 0..cfg.days {
        let day_start = 1_700_000_000 + day * 86_400;
        env.set_now(day_start);
        // Pools past their life: claims released, then the pool deleted.
        while live
            .front()
            .is_some_and(|&(_, d)| d + cfg.pool_life_days <= day)
        {
            let (n, _) = live.pop_front().expect("a pool");
            let (id, _) = pool(n);
            for k in 0..cfg.claims_per_pool {
                ops::release(
                    &c,
                    id.namespace.as_deref().unwrap_or_default(),
                    &format!("c{n}-{k}"),
                    None,
                    &MetalAssignmentClosed,
                )
                .expect("release");
                requests += 1;
            }
            // Past any grace period, then gone.
            env.set_now(env.now() + 61);
            assert!(ops::delete_pool(&c, &id).expect("delete"), "pool {n}");
            requests += 1;
        }
        // New pools and their claims.
        for _ in 0..cfg.pools_per_day {
            let n = made;
            made += 1;
            let (id, object) = pool(n);
            ops::put_pool(&c, object).expect("register");
            requests += 1;
            for k in 0..cfg.claims_per_pool {
                let counting = CountingKv::new(&kv);
                let cc = ctx(&counting, &env);
                ops::allocate(&cc, &claim(&id, &format!("c{n}-{k}"), &format!("u{n}-{k}")))
                    .expect("allocate");
                alloc_ops.push(counting.counts().total());
                requests += 1;
            }
            live.push_back((n, day));
        }
        // Requests of every shape, counted as the shell counts them.
        for i in 0..cfg.requests_per_day {
            record_varied(&c, day * cfg.requests_per_day + i).expect("record");
            requests += 1;
        }
        // The reconcile's tidy of the index and collection of tombstones.
        index::tidy(&c, &|_| Ok(false)).expect("tidy");
        index::collect(&c).expect("collect");
        if day % cfg.sample_every == 0 || day + 1 == cfg.days {
            let counting = CountingKv::new(&kv);
            let cc = ctx(&counting, &env);
            let t = Instant::now();
            metrics::scrape(&cc).expect("scrape");
            let scrape_ms = t.elapsed().as_secs_f64() * 1000.0;
            let scrape_kv = counting.counts().total();
            let counting = CountingKv::new(&kv);
            let listing = ops::list_pools(&counting, None, env.now()).expect("list");
            let list_kv = counting.counts().total();
            alloc_ops.sort_unstable();
            let median = alloc_ops.get(alloc_ops.len() / 2).copied().unwrap_or(0);
            alloc_ops.clear();
            let idx = index::read(&kv).expect("index").unwrap_or_default();
            let signatures = metal_ipam_core::kv::registry::read(&kv, &counters::REGISTRY)
                .expect("registry")
                .map_or(0, |m| m.len());
            let s = Sample {
                day,
                live_pools: listing.pools.len(),
                pools_made: made,
                requests,
                index_entries: idx.size().entries,
                index_bytes: kv
                    .get(keys::POOL_INDEX)
                    .expect("get")
                    .map_or(0, |b| b.len()),
                scrape_kv,
                scrape_ms,
                list_kv,
                alloc_kv_median: median,
                signatures,
                store_keys: kv.dump().len(),
            };
            each(&s);
            samples.push(s);
        }
    }
    samples
}
