//! # metal-ipam bench
//!
//! A program (not a test) that prints figures; nothing here asserts on
//! timing. Build the components first, then run it with the optimised
//! native profile:
//!
//! ```text
//! cargo build-wasm-all && cargo build --profile host-release -p metal-ipam-host \
//!   && cargo run --profile host-release -p metal-ipam-tests --bin bench [-- --quick]
//! ```
//!
//! (`--help` lists the options; section 6 starts `metal-ipam-host`
//! processes, hence the second build.)
//!
//! Every request goes through the real `spin.toml` and the real `.wasm`
//! components on the in-process wasmtime test host ([`App`] from the
//! harness: [`metal_ipam_host::Host::handle`], no sockets). The key-value
//! operation counts come from [`metal_ipam_host::RequestOutcome::kv_ops`].
//!
//! ## What is measured
//!
//! 1. **Component sizes**: bytes of the `fn_*.wasm` release build of every
//!    component in [`COMPONENTS`] (healthz, pools, allocate, release and
//!    the others the harness knows).
//! 2. **Allocation throughput on SQLite**: a fresh SQLite key-value file in
//!    a temp dir (Spin's default backend: one connection, every write its
//!    own transaction), one IPv4 /16 pool (`10.200.0.0/16`, prefix 16), and
//!    N new claims (`POST /v1/claims`, N = 2000, 300 with `--quick`) at
//!    concurrency 1 and 8. Concurrency C means C tokio tasks on the
//!    multi-threaded runtime, each calling `Host::handle` in a loop, taking
//!    the next claim from a shared counter. Latency is per allocation, from
//!    the first request to the `201`; a `503 Contention` (the component gave
//!    up after 64 compare-and-swap attempts) is retried by the bench after
//!    10 ms, counted, and its time and key-value operations are charged to
//!    that allocation. Each run has its own app and store file, so every
//!    run starts with an empty pool; a few warm-up requests on another pool
//!    run first.
//! 3. **Cost versus fill**: one pool filled through the host to ~99 %
//!    (the /16, 65,534 allocatable addresses; a /20, 4,094 addresses, with
//!    `--quick`). At ~1 % and at ~99 % a sample of allocations runs at
//!    concurrency 1 (uncontended: the protocol's own cost); the fill in
//!    between runs at concurrency 8 and its rate is reported on its own,
//!    with the latency of its last allocations (just below 99 %). Reported:
//!    key-value operations per allocation (min/mean/max and the mean by
//!    kind), latency percentiles, and the pool record's size in bytes,
//!    disjoint used ranges and intents (claim writes in flight), read
//!    directly from the store through `Host::kv_stores()` at each level.
//! 4. **Raw key-value rate** (no wasm): the host's `KvStore` API on the same
//!    kind of SQLite file, and on the in-memory backend for comparison —
//!    `set` of a 32-byte value (distinct keys), `get` of those keys,
//!    `increment` of one counter, and compare-and-swap pairs
//!    (`current` + a conditional `swap` on an existing key) — sequentially
//!    from one task, a few thousand operations each.
//! 5. **Allocation throughput in memory**: the runs of (2) on
//!    `KvBackend::Memory` (an in-memory SQLite database: no file I/O), to
//!    separate the wasm and host cost from SQLite's file cost.
//!
//! 6. **Ours versus a naive allocator** (and an earlier build with
//!    `--before DIR`): two host processes per store, SQLite and Redis,
//!    concurrency 1, 8 and 32, throughput ratios, duplicates handed out
//!    and the largest pool record during each burst; see [`versus`].
//! 8. **The metrics scrape**: 100 pools (20 with `--quick`) with two
//!    claims each on a SQLite file, then 200 scrapes of `GET /v1/metrics`:
//!    latency percentiles and key-value operations; see [`scrape`].
//! 7. **The Metal poll**: 30 devices (10 with `--quick`) with two claims
//!    each turn active in one window of events, then are deleted; each
//!    `POST /v1/metal/poll` timed, with its claims and its Kubernetes and
//!    Metal requests; see [`poll`].
//! 9. **The phoenixNAP poll**: 30 servers (10 with `--quick`) in PHX with
//!    two claims each on a pool backed by a private network; after the
//!    first poll set the cursor, a quiet poll (no new events: one audit
//!    log read) and the polls after one server was deleted (every known
//!    server re-read within the poll's budget until `more` is false):
//!    polls, time, phoenixNAP and Kubernetes requests, claims marked
//!    `DeviceDeleted` and servers re-read per second, the counts checked;
//!    see [`pnap_poll`].
//!
//! The SQLite files live in the system temp dir (`TMPDIR`). With Spin's
//! default settings every write is its own durable transaction, so on a
//! disk-backed temp dir the fsync rate, which section 4 shows, bounds
//! every SQLite figure and the 65k fill's duration; on a tmpfs
//! (`TMPDIR=/dev/shm`) syncing is free and what remains is SQLite's CPU
//! cost.
//!
//! The components' request logs go to the host's stderr (as with
//! `spin up`), and so does the bench's progress; add `2>/dev/null` (or
//! `2>bench.log`) to keep the terminal readable.
//!
//! Everything is printed as plain aligned tables, then one line of JSON
//! (the last line of stdout) with the same figures, for scripts.

mod pnap_poll;
mod poll;
mod scrape;
mod versus;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use metal_ipam_host::kv::KvStore;
use metal_ipam_host::KvOpCounts;
use metal_ipam_tests::harness::{claim_json, pool_json, wasm_path, App, COMPONENTS, TOKEN};
use serde_json::{json, Value};

/// Namespace of every bench pool and claim.
const NS: &str = "bench";
/// The pool of the throughput runs.
const POOL_CIDR: &str = "10.200.0.0/16";
/// Its prefix length.
const POOL_PREFIX: u8 = 16;
/// The pool filled to 99 % with `--quick`.
const QUICK_FILL_CIDR: &str = "10.200.0.0/20";
/// Its prefix length.
const QUICK_FILL_PREFIX: u8 = 20;
/// Pause before the bench re-posts a claim answered `503 Contention`.
const RETRY_503_AFTER: Duration = Duration::from_millis(10);
/// A claim answered 503 more often than this aborts the bench.
const MAX_503_PER_CLAIM: u32 = 50;

const USAGE: &str = "usage: bench [--quick] [--versus-only] [--poll-only] [--scrape-only] [--pnap-poll-only] [--only LIST] [--before DIR]

--quick           smaller numbers (N=300, a /20 for the fill, 200 claims per comparison row), for a smoke run
--versus-only     only section 6 (ours versus the naive allocator)
--poll-only       only section 7 (the Metal poll)
--scrape-only     only section 8 (the metrics scrape)
--pnap-poll-only  only section 9 (the phoenixNAP poll)
--only LIST       section 6's allocators, comma-separated: ours, naive, before (default: all)
--before DIR      also run the build in DIR (its spin.toml and target/, e.g. a git worktree
                  of an earlier commit after `cargo build-wasm` there) in section 6";

/// Sizes of one bench run.
#[derive(Debug, Clone)]
struct Config {
    quick: bool,
    /// A checkout of an earlier build (`--before DIR`) for section 6.
    before: Option<PathBuf>,
    /// Run section 6 only (`--versus-only`).
    versus_only: bool,
    /// Run section 7 only (`--poll-only`).
    poll_only: bool,
    /// Run section 8 only (`--scrape-only`).
    scrape_only: bool,
    /// Run section 9 only (`--pnap-poll-only`).
    pnap_poll_only: bool,
    /// Section 6's allocators (`--only ours,naive`; all when empty).
    only: Vec<String>,
    /// Claims per row of section 6.
    versus_n: usize,
    /// Allocations per throughput run.
    n: usize,
    /// Allocations per concurrency-1 sample at a fill level.
    sample: usize,
    /// Allocations of the concurrency-8 fill whose latency is reported as
    /// "just below 99 %".
    fill_tail: usize,
    /// Operations per raw key-value measurement.
    raw_ops: usize,
    fill_cidr: &'static str,
    fill_prefix: u8,
}

impl Config {
    fn from_args() -> Result<Config> {
        let mut quick = false;
        let mut before = None;
        let mut versus_only = false;
        let mut poll_only = false;
        let mut scrape_only = false;
        let mut pnap_poll_only = false;
        let mut only = Vec::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => quick = true,
                "--versus-only" => versus_only = true,
                "--poll-only" => poll_only = true,
                "--scrape-only" => scrape_only = true,
                "--pnap-poll-only" => pnap_poll_only = true,
                "--only" => {
                    only = args
                        .next()
                        .context("--only needs a list: ours,naive,before")?
                        .split(',')
                        .map(str::to_string)
                        .collect()
                }
                "--before" => {
                    before = Some(PathBuf::from(
                        args.next().context("--before needs a directory")?,
                    ))
                }
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?}\n{USAGE}"),
            }
        }
        Ok(if quick {
            Config {
                quick,
                before,
                versus_only,
                poll_only,
                scrape_only,
                pnap_poll_only,
                only: only.clone(),
                versus_n: 200,
                n: 300,
                sample: 30,
                fill_tail: 100,
                raw_ops: 500,
                fill_cidr: QUICK_FILL_CIDR,
                fill_prefix: QUICK_FILL_PREFIX,
            }
        } else {
            Config {
                quick,
                before,
                versus_only,
                poll_only,
                scrape_only,
                pnap_poll_only,
                only,
                versus_n: 1000,
                n: 2000,
                sample: 200,
                fill_tail: 1000,
                raw_ops: 3000,
                fill_cidr: POOL_CIDR,
                fill_prefix: POOL_PREFIX,
            }
        })
    }
}

// ---------------------------------------------------------------- tables

/// A plain text table: first column left-aligned, the others right-aligned.
struct Table {
    title: String,
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    fn print(&self) {
        let cols = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        // A column is right-aligned unless it is the first or holds text.
        let left: Vec<bool> = (0..cols)
            .map(|i| {
                i == 0
                    || self
                        .rows
                        .iter()
                        .filter_map(|r| r.get(i))
                        .any(|c| !c.is_empty() && !is_numeric(c))
            })
            .collect();
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = cells.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    out.push_str("  ");
                }
                if left[i] {
                    out.push_str(&format!("{cell:<w$}"));
                } else {
                    out.push_str(&format!("{cell:>w$}"));
                }
            }
            out.trim_end().to_string()
        };
        println!("{}", self.title);
        println!("{}", "=".repeat(self.title.chars().count()));
        println!("{}", line(&self.headers));
        let total: usize = widths.iter().sum::<usize>() + 2 * (cols.saturating_sub(1));
        println!("{}", "-".repeat(total));
        for row in &self.rows {
            println!("{}", line(row));
        }
        for note in &self.notes {
            println!("  {note}");
        }
        println!();
    }
}

fn is_numeric(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | ',' | '-' | '%' | ' '))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn f1(x: f64) -> String {
    format!("{x:.1}")
}

fn f2(x: f64) -> String {
    format!("{x:.2}")
}

/// Rounds to 3 decimals for the JSON summary.
fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

// ------------------------------------------------------------ allocation

/// One allocation as the bench saw it.
#[derive(Debug, Clone, Copy)]
struct Alloc {
    /// Claim index.
    index: usize,
    /// First request to the `201`, including any 503 retries.
    latency: Duration,
    /// Key-value operations of every request this allocation took.
    ops: KvOpCounts,
    /// `503 Contention` answers before the `201`.
    rejected: u32,
}

/// A set of allocations made at one concurrency.
struct Run {
    allocs: Vec<Alloc>,
    wall: Duration,
}

/// Figures of a set of allocations.
#[derive(Debug, Clone)]
struct Stats {
    n: usize,
    per_s: Option<f64>,
    wall_s: Option<f64>,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    ops_min: u64,
    ops_mean: f64,
    ops_max: u64,
    /// Mean per allocation, by operation kind (non-zero kinds only).
    ops_by_kind: Vec<(&'static str, f64)>,
    rejected: u64,
}

/// Nearest-rank percentile of sorted latencies, in ms.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    ms(sorted[rank.clamp(1, sorted.len()) - 1])
}

impl Stats {
    /// Figures of `allocs`; `wall` gives the rate (only meaningful for a
    /// whole run).
    fn of(allocs: &[Alloc], wall: Option<Duration>) -> Stats {
        let mut lat: Vec<Duration> = allocs.iter().map(|a| a.latency).collect();
        lat.sort();
        let totals: Vec<u64> = allocs.iter().map(|a| a.ops.total()).collect();
        let mut sum = KvOpCounts::default();
        for a in allocs {
            sum.add(&a.ops);
        }
        let n = allocs.len();
        let per = |x: u64| if n == 0 { 0.0 } else { x as f64 / n as f64 };
        Stats {
            n,
            per_s: wall.map(|w| n as f64 / w.as_secs_f64()),
            wall_s: wall.map(|w| w.as_secs_f64()),
            p50: percentile(&lat, 50.0),
            p90: percentile(&lat, 90.0),
            p99: percentile(&lat, 99.0),
            max: lat.last().copied().map(ms).unwrap_or(0.0),
            ops_min: totals.iter().copied().min().unwrap_or(0),
            ops_mean: per(totals.iter().sum()),
            ops_max: totals.iter().copied().max().unwrap_or(0),
            ops_by_kind: sum
                .entries()
                .into_iter()
                .filter(|(_, c)| *c > 0)
                .map(|(k, c)| (k, per(c)))
                .collect(),
            rejected: allocs.iter().map(|a| u64::from(a.rejected)).sum(),
        }
    }

    fn by_kind(&self) -> String {
        self.ops_by_kind
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn json(&self) -> Value {
        json!({
            "n": self.n,
            "per_s": self.per_s.map(r3),
            "wall_s": self.wall_s.map(r3),
            "p50_ms": r3(self.p50),
            "p90_ms": r3(self.p90),
            "p99_ms": r3(self.p99),
            "max_ms": r3(self.max),
            "kv_ops": {
                "min": self.ops_min,
                "mean": r3(self.ops_mean),
                "max": self.ops_max,
                "by_kind": self.ops_by_kind.iter().map(|(k, v)| (k.to_string(), json!(r3(*v)))).collect::<serde_json::Map<_, _>>(),
            },
            "rejected_503": self.rejected,
        })
    }
}

/// Claim names are unique across pools: a claim's pool cannot change.
fn claim_name(pool: &str, index: usize) -> String {
    format!("{pool}-{index}")
}

/// Posts claim `index` of `pool` until it is allocated (`201`).
async fn allocate_one(app: &App, pool: &str, index: usize) -> Result<Alloc> {
    let body = serde_json::to_vec(&claim_json(
        NS,
        &claim_name(pool, index),
        &format!("uid-{pool}-{index}"),
        pool,
    ))
    .context("encoding a claim")?;
    let start = Instant::now();
    let mut ops = KvOpCounts::default();
    let mut rejected = 0;
    loop {
        let req = http::Request::post("/v1/claims")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(body.clone())
            .context("building a claim request")?;
        let out = app.host().handle(req).await.with_context(|| {
            format!("the host failed on claim {NS}/{}", claim_name(pool, index))
        })?;
        ops.add(&out.kv_ops);
        match out.response.status().as_u16() {
            201 => {
                return Ok(Alloc {
                    index,
                    latency: start.elapsed(),
                    ops,
                    rejected,
                })
            }
            503 if rejected < MAX_503_PER_CLAIM => {
                rejected += 1;
                tokio::time::sleep(RETRY_503_AFTER).await;
            }
            status => bail!(
                "claim {NS}/{} in pool {pool}: expected 201, got {status}: {}",
                claim_name(pool, index),
                String::from_utf8_lossy(out.response.body())
            ),
        }
    }
}

/// Allocates claims `range` of `pool` with `concurrency` tasks.
async fn allocate_range(
    app: &Arc<App>,
    pool: &str,
    range: std::ops::Range<usize>,
    concurrency: usize,
) -> Result<Run> {
    let next = Arc::new(AtomicUsize::new(range.start));
    let end = range.end;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (app, next, pool) = (app.clone(), next.clone(), pool.to_string());
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, anyhow::Error>(done);
                }
                done.push(allocate_one(&app, &pool, i).await?);
            }
        }));
    }
    let mut allocs = Vec::with_capacity(range.len());
    for t in tasks {
        allocs.extend(t.await.context("an allocation task panicked")??);
    }
    let wall = start.elapsed();
    allocs.sort_by_key(|a| a.index);
    Ok(Run { allocs, wall })
}

/// Registers `name` as a namespaced pool; returns its allocatable total.
async fn register_pool(app: &App, name: &str, cidr: &str, prefix: u8) -> Result<u64> {
    let r = app
        .call(
            "PUT",
            &format!("/v1/pools/{NS}/{name}"),
            Some(&pool_json(NS, name, &[cidr], prefix)),
        )
        .await;
    if r.status != 201 {
        bail!(
            "registering pool {NS}/{name} ({cidr}): expected 201, got {}: {}",
            r.status,
            r.body
        );
    }
    r.body["status"]["ipAddresses"]["total"]
        .as_u64()
        .with_context(|| {
            format!(
                "pool {NS}/{name}: no status.ipAddresses.total in {}",
                r.body
            )
        })
}

/// A fresh app with `pool` registered and a few warm-up allocations made
/// on another pool (instantiation and first-call costs out of the way).
async fn fresh_app(memory: bool, pool: &str, cidr: &str, prefix: u8) -> Result<(Arc<App>, u64)> {
    let app = Arc::new(if memory { App::new() } else { App::sqlite() });
    register_pool(&app, "warmup", "10.201.0.0/24", 24).await?;
    allocate_range(&app, "warmup", 0..20, 2).await?;
    let total = register_pool(&app, pool, cidr, prefix).await?;
    Ok((app, total))
}

/// The pool record of `pool`: its size and shape.
#[derive(Debug, Clone)]
struct RecordInfo {
    bytes: usize,
    used_ranges: usize,
    intents: usize,
}

async fn pool_record(app: &App, pool: &str) -> Result<RecordInfo> {
    let store = app.store().await;
    let key = format!("pool/ns/{NS}/{pool}");
    let bytes = store
        .get(&key)
        .await
        .with_context(|| format!("reading {key}"))?
        .with_context(|| format!("{key} is missing from the store"))?;
    let v: Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{key} is not a JSON record"))?;
    let len = |field: &str| v[field].as_array().map(Vec::len).unwrap_or(0);
    Ok(RecordInfo {
        bytes: bytes.len(),
        used_ranges: len("used"),
        intents: len("intents"),
    })
}

// ------------------------------------------------------------- sections

fn wasm_sizes() -> Result<BTreeMap<String, u64>> {
    let mut sizes = BTreeMap::new();
    let mut t = Table::new("1. Component sizes", &["component", "bytes", "KiB"]);
    for c in COMPONENTS {
        let p = wasm_path(c);
        let len = std::fs::metadata(&p)
            .with_context(|| {
                format!(
                    "{} is missing: build the components first with `cargo build-wasm`",
                    p.display()
                )
            })?
            .len();
        t.row(vec![
            format!("fn_{c}.wasm"),
            len.to_string(),
            f1(len as f64 / 1024.0),
        ]);
        sizes.insert(format!("fn_{c}"), len);
    }
    let total: u64 = sizes.values().sum();
    t.row(vec![
        "total".into(),
        total.to_string(),
        f1(total as f64 / 1024.0),
    ]);
    t.note("target/wasm32-wasip2/release (opt-level \"s\", LTO, stripped)");
    t.print();
    Ok(sizes)
}

fn stats_row(label: &str, s: &Stats) -> Vec<String> {
    vec![
        label.to_string(),
        s.n.to_string(),
        s.per_s.map(f1).unwrap_or_else(|| "-".into()),
        f2(s.p50),
        f2(s.p90),
        f2(s.p99),
        f2(s.max),
        f2(s.ops_mean),
        s.rejected.to_string(),
    ]
}

const STATS_HEADERS: [&str; 9] = [
    "run",
    "allocs",
    "allocs/s",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "max ms",
    "ops/alloc",
    "503s",
];

/// Throughput runs: each on a fresh app and an empty /16.
async fn throughput(cfg: &Config, memory: bool, concurrencies: &[usize]) -> Result<Vec<Stats>> {
    let mut out = Vec::new();
    for &c in concurrencies {
        let (app, _) = fresh_app(memory, "p16", POOL_CIDR, POOL_PREFIX).await?;
        let run = allocate_range(&app, "p16", 0..cfg.n, c).await?;
        out.push(Stats::of(&run.allocs, Some(run.wall)));
    }
    Ok(out)
}

fn print_throughput(title: &str, backend: &str, concurrencies: &[usize], stats: &[Stats]) {
    let mut t = Table::new(title, &STATS_HEADERS);
    for (c, s) in concurrencies.iter().zip(stats) {
        t.row(stats_row(&format!("{backend}, concurrency {c}"), s));
    }
    t.note(format!(
        "new claims (POST /v1/claims) into an empty {POOL_CIDR} pool; latency per allocation incl. any 503 retry; ops/alloc = mean key-value operations"
    ));
    t.print();
}

/// The fill to ~99 %: samples at ~1 % and ~99 %, the concurrency-8 fill in
/// between.
struct Fill {
    total: u64,
    records: Vec<(String, usize, RecordInfo)>,
    low: Stats,
    low_range: std::ops::Range<usize>,
    fill: Stats,
    fill_range: std::ops::Range<usize>,
    fill_tail: Stats,
    tail_range: std::ops::Range<usize>,
    high: Stats,
    high_range: std::ops::Range<usize>,
}

async fn fill(cfg: &Config) -> Result<Fill> {
    let (app, total) = fresh_app(false, "fill", cfg.fill_cidr, cfg.fill_prefix).await?;
    let total_us = usize::try_from(total).context("pool size")?;
    let low_at = total_us / 100;
    let high_at = total_us * 99 / 100;
    let sample = cfg.sample.min(total_us - high_at - 2);
    if low_at + sample > high_at {
        bail!("pool {} too small for the fill", cfg.fill_cidr);
    }
    let mut records = vec![("empty".to_string(), 0, pool_record(&app, "fill").await?)];

    eprintln!("fill: to ~1 % ({low_at} claims, concurrency 8)");
    allocate_range(&app, "fill", 0..low_at, 8).await?;
    let low_range = low_at..low_at + sample;
    records.push(("~1 %".into(), low_at, pool_record(&app, "fill").await?));
    let low = allocate_range(&app, "fill", low_range.clone(), 1).await?;

    let fill_range = low_range.end..high_at;
    eprintln!(
        "fill: {} claims at concurrency 8 up to ~99 % ({high_at} of {total})",
        fill_range.len()
    );
    let fill_run = allocate_range(&app, "fill", fill_range.clone(), 8).await?;
    let tail_range = high_at.saturating_sub(cfg.fill_tail).max(fill_range.start)..high_at;
    let tail: Vec<Alloc> = fill_run
        .allocs
        .iter()
        .filter(|a| tail_range.contains(&a.index))
        .copied()
        .collect();
    records.push(("~99 %".into(), high_at, pool_record(&app, "fill").await?));

    let high_range = high_at..high_at + sample;
    let high = allocate_range(&app, "fill", high_range.clone(), 1).await?;
    records.push((
        "after the 99 % sample".into(),
        high_range.end,
        pool_record(&app, "fill").await?,
    ));

    Ok(Fill {
        total,
        records,
        low: Stats::of(&low.allocs, Some(low.wall)),
        low_range,
        fill: Stats::of(&fill_run.allocs, Some(fill_run.wall)),
        fill_range,
        fill_tail: Stats::of(&tail, None),
        tail_range,
        high: Stats::of(&high.allocs, Some(high.wall)),
        high_range,
    })
}

fn pct(n: usize, total: u64) -> String {
    format!("{:.2}", n as f64 * 100.0 / total as f64)
}

fn print_fill(cfg: &Config, f: &Fill) {
    let range_pct =
        |r: &std::ops::Range<usize>| format!("{}-{} %", pct(r.start, f.total), pct(r.end, f.total));
    let pool = if cfg.quick {
        format!("{} (--quick: a /20 instead of the /16)", cfg.fill_cidr)
    } else {
        cfg.fill_cidr.to_string()
    };
    let title = format!(
        "3. Cost versus fill: pool {pool}, {} allocatable addresses, SQLite file",
        f.total
    );
    let mut t = Table::new(
        title,
        &[
            "allocations",
            "fill",
            "concurrency",
            "allocs",
            "ops min",
            "ops mean",
            "ops max",
            "503s",
            "mean ops by kind",
        ],
    );
    let rows: [(&str, &std::ops::Range<usize>, &Stats, usize); 4] = [
        ("sample at ~1 %", &f.low_range, &f.low, 1),
        ("fill ~1 % to ~99 %", &f.fill_range, &f.fill, 8),
        ("  its last allocations", &f.tail_range, &f.fill_tail, 8),
        ("sample at ~99 %", &f.high_range, &f.high, 1),
    ];
    for (label, r, s, c) in rows {
        t.row(vec![
            label.to_string(),
            range_pct(r),
            c.to_string(),
            s.n.to_string(),
            s.ops_min.to_string(),
            f2(s.ops_mean),
            s.ops_max.to_string(),
            s.rejected.to_string(),
            s.by_kind(),
        ]);
    }
    t.note(
        "key-value operations per allocation (RequestOutcome.kv_ops, summed over any 503 retries)",
    );
    t.note("at concurrency 1 the cost is the protocol's own; at concurrency 8 lost compare-and-swaps add cas.current + get + cas.swap per retry");
    t.print();

    let mut t = Table::new("3b. Latency and rate versus fill", &STATS_HEADERS);
    t.row(stats_row(
        &format!("sample at ~1 %, c=1 ({})", range_pct(&f.low_range)),
        &f.low,
    ));
    t.row(stats_row(
        &format!("fill, c=8 ({})", range_pct(&f.fill_range)),
        &f.fill,
    ));
    t.row(stats_row(
        &format!(
            "  last {} of the fill ({})",
            f.fill_tail.n,
            range_pct(&f.tail_range)
        ),
        &f.fill_tail,
    ));
    t.row(stats_row(
        &format!("sample at ~99 %, c=1 ({})", range_pct(&f.high_range)),
        &f.high,
    ));
    t.note("allocs/s of the fill row is the rate of the whole concurrency-8 fill; no rate for a slice of it");
    t.note(format!(
        "latency at ~99 % / at ~1 % fill, concurrency 1: p50 {:.2}, p99 {:.2}",
        f.high.p50 / f.low.p50,
        f.high.p99 / f.low.p99
    ));
    t.print();

    let mut t = Table::new(
        "3c. Pool record size (read through Host::kv_stores())",
        &[
            "point",
            "allocated",
            "fill",
            "record bytes",
            "used ranges",
            "intents",
        ],
    );
    for (label, at, r) in &f.records {
        t.row(vec![
            label.clone(),
            at.to_string(),
            format!("{} %", pct(*at, f.total)),
            r.bytes.to_string(),
            r.used_ranges.to_string(),
            r.intents.to_string(),
        ]);
    }
    t.note("lowest-free-first allocation keeps the used addresses in one merged range, so the fill itself costs nothing;");
    t.note("intents are the claim writes in flight (dropped by the next decision that sees them written), so the size does not grow with the number of allocated addresses");
    t.print();
}

/// Raw key-value rate, in operations per second, by operation.
struct Raw {
    label: &'static str,
    rows: Vec<(&'static str, usize, Duration)>,
}

async fn raw_kv(label: &'static str, store: &KvStore, ops: usize) -> Result<Raw> {
    let value = [0x5au8; 32];
    let keys: Vec<String> = (0..ops).map(|i| format!("bench-raw/k{i:06}")).collect();
    let mut rows = Vec::new();

    let t = Instant::now();
    for k in &keys {
        store.set(k, &value).await.context("raw set")?;
    }
    rows.push(("set (32 B, distinct keys)", ops, t.elapsed()));

    let t = Instant::now();
    for k in &keys {
        store
            .get(k)
            .await
            .context("raw get")?
            .context("raw get: a key just set is missing")?;
    }
    rows.push(("get", ops, t.elapsed()));

    let t = Instant::now();
    for _ in 0..ops {
        store
            .increment("bench-raw/counter", 1)
            .await
            .context("raw increment")?;
    }
    rows.push(("increment", ops, t.elapsed()));

    store
        .set("bench-raw/cas", b"v-start")
        .await
        .context("raw cas seed")?;
    let t = Instant::now();
    for i in 0..ops {
        let mut cas = store.new_cas("bench-raw/cas");
        cas.current().await.context("raw cas current")?;
        cas.swap(format!("v-{i}").into_bytes())
            .await
            .context("raw cas swap (no one else writes this key)")?;
    }
    rows.push(("cas pair (current + swap)", ops, t.elapsed()));
    Ok(Raw { label, rows })
}

fn print_raw(raws: &[Raw], cfg: &Config) {
    let mut headers = vec!["operation".to_string(), "ops".to_string()];
    for r in raws {
        headers.push(format!("{} ops/s", r.label));
        headers.push(format!("{} us/op", r.label));
    }
    let hdr: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut t = Table::new(
        "4. Raw key-value rate through the host's KvStore API (no wasm)",
        &hdr,
    );
    if let Some(first) = raws.first() {
        for (i, (name, n, _)) in first.rows.iter().enumerate() {
            let mut row = vec![name.to_string(), n.to_string()];
            for r in raws {
                let d = r.rows[i].2;
                row.push(f1(*n as f64 / d.as_secs_f64()));
                row.push(f1(d.as_secs_f64() * 1e6 / *n as f64));
            }
            t.row(row);
        }
    }
    t.note(format!(
        "sequential, one task, {} operations each; a cas pair counts as one (two store operations); every write is its own SQLite transaction",
        cfg.raw_ops
    ));
    t.print();
}

fn raw_json(r: &Raw) -> Value {
    let keys = ["set", "get", "increment", "cas_pair"];
    let map: serde_json::Map<String, Value> = keys
        .iter()
        .zip(&r.rows)
        .map(|(k, (_, n, d))| (format!("{k}_per_s"), json!(r3(*n as f64 / d.as_secs_f64()))))
        .collect();
    Value::Object(map)
}

// ------------------------------------------------------------------ main

#[tokio::main]
async fn main() -> Result<()> {
    let cfg = Config::from_args()?;
    let started = Instant::now();
    println!(
        "metal-ipam bench{}: {} CPU(s), {} build, in-process wasmtime host (metal-ipam-host)",
        if cfg.quick { " --quick" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if cfg!(debug_assertions) {
            "DEBUG (figures not representative; use --profile host-release)"
        } else {
            "optimised"
        }
    );
    println!(
        "N = {} allocations per throughput run; samples of {} at each fill level; {} raw key-value operations each",
        cfg.n, cfg.sample, cfg.raw_ops
    );
    println!(
        "SQLite files in {} (set TMPDIR to move them: every write is an fsync'd transaction, so the disk sets the pace)\n",
        std::env::temp_dir().display()
    );

    let mut contenders = versus::Contender::all(cfg.before.as_deref())?;
    if !cfg.only.is_empty() {
        contenders.retain(|c| cfg.only.iter().any(|o| o == c.label));
    }
    if cfg.poll_only {
        let devices = if cfg.quick { 10 } else { 30 };
        let phases = poll::run(devices).await?;
        let summary = poll::print(devices, &phases);
        println!(
            "{}",
            json!({"bench": "metal-ipam", "quick": cfg.quick, "poll": summary})
        );
        return Ok(());
    }
    let pnap_servers = if cfg.quick { 10 } else { 30 };
    if cfg.pnap_poll_only {
        let f = pnap_poll::run(pnap_servers).await?;
        let summary = pnap_poll::print(&f);
        println!(
            "{}",
            json!({"bench": "metal-ipam", "quick": cfg.quick, "pnap_poll": summary})
        );
        return Ok(());
    }
    let scrape_pools = if cfg.quick { 20 } else { 100 };
    if cfg.scrape_only {
        let s = scrape::run(scrape_pools, 200).await?;
        let summary = scrape::print(&s);
        println!(
            "{}",
            json!({"bench": "metal-ipam", "quick": cfg.quick, "scrape": summary})
        );
        return Ok(());
    }
    if cfg.versus_only {
        let rows = versus::run(cfg.versus_n, &contenders).await?;
        let summary = versus::print(cfg.versus_n, &rows);
        println!(
            "{}",
            json!({"bench": "metal-ipam", "quick": cfg.quick, "versus": summary})
        );
        return Ok(());
    }

    let sizes = wasm_sizes()?;

    // Compile the components once (cached for the whole process) and time it.
    let t = Instant::now();
    drop(App::new());
    let compile = t.elapsed();
    eprintln!(
        "components compiled in {:.2} s; measuring…",
        compile.as_secs_f64()
    );

    let conc = [1, 8];
    eprintln!("2. throughput on SQLite");
    let sqlite = throughput(&cfg, false, &conc).await?;
    print_throughput(
        "2. Allocation throughput, SQLite file (temp dir)",
        "sqlite",
        &conc,
        &sqlite,
    );

    eprintln!("3. fill");
    let fill = fill(&cfg).await?;
    print_fill(&cfg, &fill);

    eprintln!("4. raw key-value");
    let sqlite_app = App::sqlite();
    let raw_file = raw_kv("sqlite", &sqlite_app.store().await, cfg.raw_ops).await?;
    let mem_app = App::new();
    let raw_mem = raw_kv("memory", &mem_app.store().await, cfg.raw_ops).await?;
    let raws = [raw_file, raw_mem];
    print_raw(&raws, &cfg);

    eprintln!("5. throughput in memory");
    let memory = throughput(&cfg, true, &conc).await?;
    let mut t = Table::new(
        "5. Allocation throughput, SQLite vs in-memory backend",
        &STATS_HEADERS,
    );
    for (c, s) in conc.iter().zip(&sqlite) {
        t.row(stats_row(&format!("sqlite file, concurrency {c}"), s));
    }
    for (c, s) in conc.iter().zip(&memory) {
        t.row(stats_row(&format!("memory, concurrency {c}"), s));
    }
    t.note("memory = KvBackend::Memory (in-memory SQLite, no file I/O): what is left is wasm instantiation, the component and the host");
    t.print();

    eprintln!("6. ours versus naive");
    let rows = versus::run(cfg.versus_n, &contenders).await?;
    let versus = versus::print(cfg.versus_n, &rows);

    eprintln!("7. Metal poll");
    let devices = if cfg.quick { 10 } else { 30 };
    let phases = poll::run(devices).await?;
    let poll_json = poll::print(devices, &phases);

    eprintln!("8. metrics scrape");
    let scrape_json = scrape::print(&scrape::run(scrape_pools, 200).await?);

    eprintln!("9. phoenixNAP poll");
    let pnap_poll_json = pnap_poll::print(&pnap_poll::run(pnap_servers).await?);

    let total = started.elapsed();
    println!(
        "total {:.1} s (component compile {:.2} s)",
        total.as_secs_f64(),
        compile.as_secs_f64()
    );
    let record_json: Vec<Value> = fill
        .records
        .iter()
        .map(|(label, at, r)| {
            json!({"point": label, "allocated": at, "bytes": r.bytes,
                   "used_ranges": r.used_ranges, "intents": r.intents})
        })
        .collect();
    let summary = json!({
        "bench": "metal-ipam",
        "quick": cfg.quick,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "wasm_bytes": sizes,
        "alloc": {
            "pool": POOL_CIDR,
            "n": cfg.n,
            "sqlite_c1": sqlite[0].json(),
            "sqlite_c8": sqlite[1].json(),
            "memory_c1": memory[0].json(),
            "memory_c8": memory[1].json(),
        },
        "fill": {
            "pool": cfg.fill_cidr,
            "total": fill.total,
            "sample_1pct_c1": fill.low.json(),
            "fill_c8": fill.fill.json(),
            "fill_c8_tail": fill.fill_tail.json(),
            "sample_99pct_c1": fill.high.json(),
            "records": record_json,
        },
        "raw_kv": {
            "ops": cfg.raw_ops,
            "sqlite": raw_json(&raws[0]),
            "memory": raw_json(&raws[1]),
        },
        "versus": versus,
        "poll": poll_json,
        "scrape": scrape_json,
        "pnap_poll": pnap_poll_json,
        "compile_s": r3(compile.as_secs_f64()),
        "total_s": r3(total.as_secs_f64()),
    });
    println!("{summary}");
    Ok(())
}
