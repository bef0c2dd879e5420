//! A year in minutes (issue 26): an installation's life on an injected
//! clock — 10,950 pools made and deleted, 43,800 allocations and as many
//! releases, 109,500 requests of varied shapes counted — and nothing that
//! a request reads grows with history: the pool index follows the pools
//! alive, a scrape and a listing read what is alive, an allocation costs
//! four key-value operations, the request signatures stay as many as the
//! shapes, and the store's keys follow what is alive (a deleted pool's
//! tombstone is collected a day later). The simulation is `metal_ipam_tests::soak`; the bench program
//! `soak` prints the same samples with timings.

use metal_ipam_tests::soak::{self, Config, Sample};

fn steady(samples: &[Sample]) -> &[Sample] {
    // From the day the first pools reached the end of their life.
    let from = samples
        .iter()
        .position(|s| s.day > Config::TEST.pool_life_days)
        .unwrap_or(0);
    &samples[from..]
}

#[test]
fn a_year_of_churn_leaves_every_read_flat() {
    let samples = soak::run(Config::TEST, |s| {
        println!(
            "day {:>3}: {:>4} pools alive ({:>5} made), index {:>3} entries {:>6} B, scrape {:>4} kv, list {:>4} kv, allocation median {} kv, {} signatures, {:>5} store keys",
            s.day, s.live_pools, s.pools_made, s.index_entries, s.index_bytes, s.scrape_kv,
            s.list_kv, s.alloc_kv_median, s.signatures, s.store_keys
        );
    });
    let last = samples.last().unwrap();
    assert_eq!(last.pools_made, 365 * 30);
    for s in &samples {
        assert_eq!(
            s.index_entries, s.live_pools,
            "day {}: the index lists the pools alive",
            s.day
        );
        assert_eq!(
            s.alloc_kv_median, 4,
            "day {}: an allocation costs four operations",
            s.day
        );
        assert!(
            s.signatures <= 8,
            "day {}: {} signatures for 8 shapes",
            s.day,
            s.signatures
        );
    }
    let steady = steady(&samples);
    let first = steady.first().unwrap();
    for s in steady {
        assert_eq!(s.live_pools, first.live_pools, "day {}", s.day);
        assert_eq!(s.scrape_kv, first.scrape_kv, "day {}: scrape reads", s.day);
        assert_eq!(s.list_kv, first.list_kv, "day {}: listing reads", s.day);
        let (lo, hi) = (
            first.index_bytes.min(s.index_bytes),
            first.index_bytes.max(s.index_bytes),
        );
        assert!(
            hi <= lo + lo / 10,
            "day {}: the index went from {} to {} bytes",
            s.day,
            first.index_bytes,
            s.index_bytes
        );
        let (lo, hi) = (
            first.store_keys.min(s.store_keys),
            first.store_keys.max(s.store_keys),
        );
        assert!(
            hi <= lo + lo / 10,
            "day {}: the store went from {} to {} keys",
            s.day,
            first.store_keys,
            s.store_keys
        );
    }
    // Reads follow what is alive: a scrape is a read per live pool, one
    // per registered signature and per call or conflict counter (the
    // varied requests touch at most 19: 5 components × 2 Kubernetes
    // classes, 4 Metal operations, 5 conflict counters) and 6 more; a
    // listing the index plus a read each.
    assert_eq!(last.list_kv as usize, 1 + last.live_pools);
    assert!(
        (last.scrape_kv as usize) <= last.live_pools + last.signatures + 19 + 6,
        "{}",
        last.scrape_kv
    );
}
