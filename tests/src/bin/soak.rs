//! # metal-ipam soak bench: a year in minutes
//!
//! A program (not a test) that prints figures; nothing here asserts. It
//! runs `metal_ipam_tests::soak` (an installation's life on the pure core,
//! an injected clock, Spin SQLite's key-value semantics in memory) and
//! prints, against simulated days, the pools alive and made, the pool
//! index's entries and bytes, one scrape's key-value reads and wall time,
//! one listing's reads, the median key-value operations per allocation,
//! the registered request signatures and the store's keys:
//!
//! ```text
//! cargo run --release -p metal-ipam-tests --bin soak [-- --days N --pools-per-day N --requests-per-day N]
//! ```
//!
//! The soak test (`tests/tests/soak.rs`) runs the same simulation with
//! `Config::TEST` and asserts the counts stay flat.

use metal_ipam_tests::soak::{self, Config};

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help") {
        println!("usage: soak [--days N] [--pools-per-day N] [--pool-life-days N] [--claims-per-pool N] [--requests-per-day N] [--sample-every N]");
        return;
    }
    let d = Config::TEST;
    let cfg = Config {
        days: arg(&args, "--days", d.days),
        pools_per_day: arg(&args, "--pools-per-day", 100),
        pool_life_days: arg(&args, "--pool-life-days", d.pool_life_days),
        claims_per_pool: arg(&args, "--claims-per-pool", d.claims_per_pool),
        requests_per_day: arg(&args, "--requests-per-day", 1_000),
        sample_every: arg(&args, "--sample-every", d.sample_every),
    };
    println!("soak: {cfg:?}");
    println!(
        "{:>5} {:>6} {:>7} {:>9} {:>7} {:>8} {:>9} {:>9} {:>7} {:>10} {:>5} {:>10}",
        "day",
        "alive",
        "made",
        "requests",
        "index",
        "index B",
        "scrape kv",
        "scrape ms",
        "list kv",
        "alloc kv",
        "sigs",
        "store keys"
    );
    let t = std::time::Instant::now();
    let samples = soak::run(cfg, |s| {
        println!(
            "{:>5} {:>6} {:>7} {:>9} {:>7} {:>8} {:>9} {:>9.2} {:>7} {:>10} {:>5} {:>10}",
            s.day,
            s.live_pools,
            s.pools_made,
            s.requests,
            s.index_entries,
            s.index_bytes,
            s.scrape_kv,
            s.scrape_ms,
            s.list_kv,
            s.alloc_kv_median,
            s.signatures,
            s.store_keys
        );
    });
    let last = samples.last().expect("a sample");
    println!(
        "{} simulated days, {} pools made, {} requests in {:.1} s",
        last.day + 1,
        last.pools_made,
        last.requests,
        t.elapsed().as_secs_f64()
    );
}
