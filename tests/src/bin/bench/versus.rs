//! Section 6: our allocator side by side with a deliberately naive one
//! (and, with `--before DIR`, with an earlier build of this project), on
//! host processes sharing one store.
//!
//! Every contender is a Spin manifest served by `metal-ipam-host up`:
//!
//! - **ours**: the repository's `spin.toml`;
//! - **naive**: `tests/bench/naive/spin.toml`, the real `pools` component
//!   plus [`metal-ipam-bench-naive`](../../../bench/naive/src/lib.rs) behind
//!   `POST /v1/claims`: `get` the pool record, take the lowest free address,
//!   `set` the record and the binding. No compare-and-swap, so overlapping
//!   requests hand out the same address; the "duplicates" column counts
//!   them. It is the speed of doing nothing extra;
//! - **before** (optional): `DIR/spin.toml` of a checkout built with
//!   `cargo build-wasm`, e.g. a `git worktree` of the commit before a
//!   change, measured in the same run on the same machine.
//!
//! For each backend (a fresh SQLite file; a fresh Redis database with Spin
//! 3.6's swap reporting, when a Redis is available) and each contender, two
//! host processes start on the same store. Each concurrency level gets its
//! own pool (a /20) and N new claims: concurrency 1 on one process,
//! concurrency 8 and 32 split evenly over both (the multi-replica case).
//! Clients retry a `503` after [`RETRY_503_AFTER`] and give up on a claim
//! after [`MAX_503`] of them (counted as failed). Meanwhile a sampler reads
//! the pool record from the store (a third client of it, every
//! [`SAMPLE_EVERY`]) and keeps its largest size and intent count.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use metal_ipam_host::kv::{KvBackend, KvStores, RedisSwap};
use metal_ipam_host::test_redis::TestRedis;
use metal_ipam_tests::client::HttpClient;
use metal_ipam_tests::harness::{claim_json, pool_json, HostProcess, TempDir};
use metal_ipam_tests::schema::repo_root;
use serde_json::{json, Value};

use crate::{f1, f2, percentile, r3, Table, MAX_503_PER_CLAIM as MAX_503, NS, RETRY_503_AFTER};

/// How often the sampler reads the pool record.
const SAMPLE_EVERY: Duration = Duration::from_millis(2);
/// Concurrency levels of the comparison.
pub const LEVELS: [usize; 3] = [1, 8, 32];
/// Prefix length of each run's pool (4,094 allocatable addresses).
const PREFIX: u8 = 20;

/// An application under comparison.
pub struct Contender {
    /// `ours`, `naive` or `before`.
    pub label: &'static str,
    /// Its Spin manifest.
    pub manifest: PathBuf,
}

impl Contender {
    /// Ours, the naive allocator and, given a checkout, the earlier build.
    ///
    /// # Errors
    /// If `before` has no `spin.toml` or the naive component is not built.
    pub fn all(before: Option<&Path>) -> Result<Vec<Contender>> {
        let root = repo_root();
        let naive = root.join("tests/bench/naive/spin.toml");
        let naive_wasm = root.join("target/wasm32-wasip2/release/metal_ipam_bench_naive.wasm");
        if !naive_wasm.exists() {
            bail!(
                "{} is missing: build it with `cargo build-wasm-all`",
                naive_wasm.display()
            );
        }
        let mut out = vec![
            Contender {
                label: "ours",
                manifest: root.join("spin.toml"),
            },
            Contender {
                label: "naive",
                manifest: naive,
            },
        ];
        if let Some(dir) = before {
            let manifest = dir.join("spin.toml");
            if !manifest.exists() {
                bail!("--before {}: no spin.toml there", dir.display());
            }
            out.push(Contender {
                label: "before",
                manifest,
            });
        }
        Ok(out)
    }
}

/// A store shared by the host processes of one contender.
enum Shared {
    /// A fresh SQLite file (Spin's default backend).
    Sqlite(TempDir),
    /// A fresh Redis database, Spin 3.6's Redis backend (every swap
    /// reported as failed; the component reads it back).
    Redis { url: String, config: TempDir },
}

impl Shared {
    fn label(&self) -> &'static str {
        match self {
            Shared::Sqlite(_) => "sqlite",
            Shared::Redis { .. } => "redis",
        }
    }

    fn host_args(&self) -> Vec<OsString> {
        match self {
            Shared::Sqlite(dir) => vec!["--kv-file".into(), dir.path().join("kv.db").into()],
            Shared::Redis { config, .. } => vec![
                "--runtime-config-file".into(),
                config.path().join("runtime-config.toml").into(),
                "--redis-swap".into(),
                "spin-3.6".into(),
            ],
        }
    }

    fn backend(&self) -> KvBackend {
        match self {
            Shared::Sqlite(dir) => KvBackend::SqliteFile(dir.path().join("kv.db")),
            Shared::Redis { url, .. } => KvBackend::Redis {
                url: url.clone(),
                swap: RedisSwap::Spin36,
            },
        }
    }
}

/// One row: a contender at one concurrency on one backend.
pub struct Row {
    /// `sqlite` or `redis`.
    pub backend: &'static str,
    /// The contender's label.
    pub contender: &'static str,
    /// Client tasks.
    pub concurrency: usize,
    /// Host processes the clients were spread over.
    pub processes: usize,
    /// Claims answered `201` (or `200`).
    pub allocated: usize,
    /// Claims given up after [`MAX_503`] `503`s.
    pub failed: usize,
    /// Wall time of the run.
    pub wall: Duration,
    /// Sorted latencies of the allocated claims (incl. their 503 retries).
    pub latencies: Vec<Duration>,
    /// Mean key-value operations per allocated claim (`x-kv-ops`, summed
    /// over retries).
    pub ops_mean: f64,
    /// `503` answers in all.
    pub rejected: u64,
    /// Claims beyond the first that were handed an address already given
    /// to another claim in this run.
    pub duplicates: usize,
    /// Largest pool record the sampler saw, in bytes, and its intents.
    pub record_max: (usize, usize),
    /// The record after the run, in bytes.
    pub record_end: usize,
}

impl Row {
    /// Allocations per second.
    pub fn per_s(&self) -> f64 {
        self.allocated as f64 / self.wall.as_secs_f64()
    }

    /// Latency percentile in ms.
    pub fn p(&self, q: f64) -> f64 {
        percentile(&self.latencies, q)
    }

    fn json(&self) -> Value {
        json!({
            "backend": self.backend,
            "allocator": self.contender,
            "concurrency": self.concurrency,
            "processes": self.processes,
            "allocated": self.allocated,
            "failed": self.failed,
            "per_s": r3(self.per_s()),
            "p50_ms": r3(self.p(50.0)),
            "p99_ms": r3(self.p(99.0)),
            "kv_ops_mean": r3(self.ops_mean),
            "rejected_503": self.rejected,
            "duplicates": self.duplicates,
            "record_max_bytes": self.record_max.0,
            "record_max_intents": self.record_max.1,
            "record_end_bytes": self.record_end,
        })
    }
}

/// Runs every contender on every available backend at [`LEVELS`].
///
/// # Errors
/// A host that does not start, a refused pool, an unexpected answer.
pub async fn run(n: usize, contenders: &[Contender]) -> Result<Vec<Row>> {
    let redis = TestRedis::get("bench");
    if redis.is_none() {
        eprintln!("6. no Redis (METAL_IPAM_TEST_REDIS_URL unset, no redis-server on PATH): SQLite rows only");
    }
    let mut rows = Vec::new();
    for (i, c) in contenders.iter().enumerate() {
        let mut shared = vec![Shared::Sqlite(TempDir::new("bench-versus"))];
        if let Some(r) = &redis {
            let db = 1 + u8::try_from(i).context("too many contenders")?;
            let url = r.fresh_db(db);
            let config = TempDir::new("bench-versus-redis");
            std::fs::write(
                config.path().join("runtime-config.toml"),
                format!("[key_value_store.default]\ntype = \"redis\"\nurl = \"{url}\"\n"),
            )
            .context("writing the runtime config")?;
            shared.push(Shared::Redis { url, config });
        }
        for s in &shared {
            rows.extend(contender_rows(n, c, s).await?);
        }
    }
    rows.sort_by_key(|r| (r.backend, r.concurrency));
    Ok(rows)
}

async fn contender_rows(n: usize, c: &Contender, shared: &Shared) -> Result<Vec<Row>> {
    let args = shared.host_args();
    let hosts = [
        HostProcess::start_manifest(&c.manifest, &args)
            .with_context(|| format!("starting {} on {}", c.label, shared.label()))?,
        HostProcess::start_manifest(&c.manifest, &args)
            .with_context(|| format!("starting {} on {}", c.label, shared.label()))?,
    ];
    let urls: Vec<String> = hosts.iter().map(|h| h.base_url.clone()).collect();
    let client = HttpClient::new();
    let stores = KvStores::new(shared.backend());
    let allowed = ["default".to_string()].into();
    let store = stores
        .open(&allowed, "default")
        .await
        .map_err(|e| anyhow::anyhow!("opening the shared store: {e:?}"))?;
    let store = Arc::new(store);

    // Instantiate every component on both hosts before measuring.
    register(&client, &urls[0], "vs-warmup", "10.209.0.0/24", 24).await?;
    for (k, url) in urls.iter().enumerate() {
        for j in 0..10 {
            allocate(&client, url, "vs-warmup", k * 10 + j).await?;
        }
    }

    let mut rows = Vec::new();
    for (level, &conc) in LEVELS.iter().enumerate() {
        eprintln!(
            "6. {} on {}: {n} claims at concurrency {conc}",
            c.label,
            shared.label()
        );
        let pool = format!("vs-c{conc}");
        let cidr = format!("10.{}.0.0/{PREFIX}", 210 + level);
        register(&client, &urls[0], &pool, &cidr, PREFIX).await?;
        let processes = if conc == 1 { 1 } else { 2 };
        let key = format!("pool/ns/{NS}/{pool}");
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (store, stop, key) = (store.clone(), stop.clone(), key.clone());
            tokio::spawn(async move {
                let mut max = (0usize, 0usize);
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Some(bytes)) = store.get(&key).await {
                        max = max.max((bytes.len(), intents(&bytes)));
                    }
                    tokio::time::sleep(SAMPLE_EVERY).await;
                }
                max
            })
        };
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..conc {
            let url = urls[t % processes].clone();
            let (client, next, pool) = (client.clone(), next.clone(), pool.clone());
            tasks.push(tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, anyhow::Error>(done);
                    }
                    done.push(allocate(&client, &url, &pool, i).await?);
                }
            }));
        }
        let mut results = Vec::with_capacity(n);
        for t in tasks {
            results.extend(t.await.context("a client task panicked")??);
        }
        let wall = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        let sampled = sampler.await.context("the sampler panicked")?;
        let end = store
            .get(&key)
            .await
            .map_err(|e| anyhow::anyhow!("reading {key}: {e:?}"))?
            .map_or(0, |b| b.len());

        let mut holders: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &results {
            if let Some(a) = &r.address {
                *holders.entry(a.as_str()).or_default() += 1;
            }
        }
        let allocated: Vec<&Outcome> = results.iter().filter(|r| r.address.is_some()).collect();
        let mut latencies: Vec<Duration> = allocated.iter().map(|r| r.latency).collect();
        latencies.sort();
        let ops: u64 = allocated.iter().map(|r| r.ops).sum();
        rows.push(Row {
            backend: shared.label(),
            contender: c.label,
            concurrency: conc,
            processes,
            allocated: allocated.len(),
            failed: results.len() - allocated.len(),
            wall,
            ops_mean: ops as f64 / allocated.len().max(1) as f64,
            latencies,
            rejected: results.iter().map(|r| u64::from(r.rejected)).sum(),
            duplicates: holders.values().map(|h| h - 1).sum(),
            record_max: sampled.max((end, 0)),
            record_end: end,
        });
    }
    Ok(rows)
}

/// Number of intents in a pool record (0 when it has none or is not ours).
fn intents(bytes: &[u8]) -> usize {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| v["state"]["intents"].as_array().map(Vec::len))
        .unwrap_or(0)
}

async fn register(
    client: &HttpClient,
    url: &str,
    pool: &str,
    cidr: &str,
    prefix: u8,
) -> Result<()> {
    let r = client
        .call(
            "PUT",
            &format!("{url}/v1/pools/{NS}/{pool}"),
            Some(&pool_json(NS, pool, &[cidr], prefix)),
        )
        .await?;
    // 200 too: the build before issue 6 answers it for a new pool on Redis
    // (Spin 3.6 reports its swap as failed, and its read-back finds it).
    if !matches!(r.status, 200 | 201) {
        bail!("registering {NS}/{pool}: {} {}", r.status, r.body);
    }
    Ok(())
}

/// What one claim got.
struct Outcome {
    /// The address, `None` when given up.
    address: Option<String>,
    latency: Duration,
    ops: u64,
    rejected: u32,
}

async fn allocate(client: &HttpClient, url: &str, pool: &str, i: usize) -> Result<Outcome> {
    let name = format!("{pool}-{i}");
    let claim = claim_json(NS, &name, &format!("uid-{name}"), pool);
    let start = Instant::now();
    let (mut ops, mut rejected) = (0, 0);
    loop {
        let r = client
            .call("POST", &format!("{url}/v1/claims"), Some(&claim))
            .await?;
        ops += r.kv_ops.unwrap_or(0);
        match r.status {
            // 200 too: on Redis the build before issue 6 reads its own
            // swap back and answers "already bound" for a new claim.
            200 | 201 => {
                let address = r.body["spec"]["address"]
                    .as_str()
                    .with_context(|| format!("{name}: no spec.address in {}", r.body))?;
                return Ok(Outcome {
                    address: Some(address.to_string()),
                    latency: start.elapsed(),
                    ops,
                    rejected,
                });
            }
            503 if rejected < MAX_503 => {
                rejected += 1;
                tokio::time::sleep(RETRY_503_AFTER).await;
            }
            503 => {
                return Ok(Outcome {
                    address: None,
                    latency: start.elapsed(),
                    ops,
                    rejected,
                })
            }
            s => bail!("{NS}/{name}: expected 200 or 201, got {s}: {}", r.body),
        }
    }
}

/// Prints the comparison and the derived ratios; returns them as JSON.
pub fn print(n: usize, rows: &[Row]) -> Value {
    let mut t = Table::new(
        format!(
            "6. Ours versus a naive allocator: {n} new claims per row, one /{PREFIX} pool each"
        ),
        &[
            "backend",
            "allocator",
            "conc",
            "hosts",
            "allocs/s",
            "vs naive",
            "p50 ms",
            "p99 ms",
            "ops/alloc",
            "503s",
            "failed",
            "duplicates",
            "record max B",
            "max intents",
        ],
    );
    let naive_rate = |r: &Row| {
        rows.iter()
            .find(|x| {
                x.backend == r.backend && x.concurrency == r.concurrency && x.contender == "naive"
            })
            .map(Row::per_s)
    };
    let mut ratios = Vec::new();
    for r in rows {
        let ratio = naive_rate(r).map(|nr| r.per_s() / nr);
        if r.contender != "naive" {
            if let Some(x) = ratio {
                ratios.push(json!({"backend": r.backend, "allocator": r.contender,
                    "concurrency": r.concurrency, "ratio_to_naive": r3(x)}));
            }
        }
        t.row(vec![
            r.backend.to_string(),
            r.contender.to_string(),
            r.concurrency.to_string(),
            r.processes.to_string(),
            f1(r.per_s()),
            ratio.map(f2).unwrap_or_else(|| "-".into()),
            f2(r.p(50.0)),
            f2(r.p(99.0)),
            f2(r.ops_mean),
            r.rejected.to_string(),
            r.failed.to_string(),
            r.duplicates.to_string(),
            r.record_max.0.to_string(),
            r.record_max.1.to_string(),
        ]);
    }
    t.note("hosts: metal-ipam-host processes sharing the store (clients alternate between them); redis = Spin 3.6's swap reporting");
    t.note("duplicates: claims handed an address another claim of the run already had (the naive allocator's price)");
    t.note("record max: the largest pool record a sampler read during the run (bytes, and its intents)");
    let mut contention = Vec::new();
    for r in rows.iter().filter(|r| r.concurrency == 8) {
        if let Some(solo) = rows
            .iter()
            .find(|x| x.backend == r.backend && x.contender == r.contender && x.concurrency == 1)
        {
            let x = r.p(99.0) / solo.p(99.0);
            t.note(format!(
                "{} {}: p99 at concurrency 8 / p99 at concurrency 1 = {:.2}",
                r.backend, r.contender, x
            ));
            contention.push(
                json!({"backend": r.backend, "allocator": r.contender, "p99_c8_over_c1": r3(x)}),
            );
        }
    }
    t.print();
    json!({
        "n": n,
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "ratios": ratios,
        "contention": contention,
    })
}
