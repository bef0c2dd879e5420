//! Section 8: the metrics scrape. `pools` pools on a SQLite file (each with
//! two allocations), then `GET /v1/metrics` `n` times through the real
//! `metrics` component on the in-process host: latency percentiles and
//! the key-value operations of each scrape (the host's count, and the
//! exposition's own `metal_ipam_scrape_kv_operations`). Target: under
//! 100 ms per scrape at 100 pools.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use metal_ipam_tests::harness::{claim_json, pool_json, App, TOKEN};
use serde_json::{json, Value};

use super::{f1, ms, percentile, Table};

/// What the scrapes cost.
pub struct Scrapes {
    pools: usize,
    latencies: Vec<Duration>,
    kv_ops: Vec<u64>,
    reported_ops: f64,
    bytes: usize,
}

/// Registers `pools` pools with two claims each, then scrapes `n` times.
pub async fn run(pools: usize, n: usize) -> Result<Scrapes> {
    let app = App::sqlite();
    for p in 0..pools {
        let name = format!("s{p}");
        let cidr = format!("10.{}.{}.0/24", 100 + p / 256, p % 256);
        let r = app
            .call(
                "PUT",
                &format!("/v1/pools/bench/{name}"),
                Some(&pool_json("bench", &name, &[&cidr], 24)),
            )
            .await;
        ensure!(r.status == 201, "pool {name}: {} {}", r.status, r.body);
        for c in 0..2 {
            let claim = format!("{name}-{c}");
            let r = app
                .call(
                    "POST",
                    "/v1/claims",
                    Some(&claim_json("bench", &claim, &format!("u-{claim}"), &name)),
                )
                .await;
            ensure!(r.status == 201, "claim {claim}: {} {}", r.status, r.body);
        }
    }
    let mut out = Scrapes {
        pools,
        latencies: Vec::with_capacity(n),
        kv_ops: Vec::with_capacity(n),
        reported_ops: 0.0,
        bytes: 0,
    };
    for _ in 0..n {
        let req = http::Request::get("/v1/metrics")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Vec::new())
            .context("building a scrape")?;
        let t = Instant::now();
        let r = app
            .host()
            .handle(req)
            .await
            .context("the host failed a scrape")?;
        out.latencies.push(t.elapsed());
        ensure!(
            r.response.status() == 200,
            "scrape answered {}",
            r.response.status()
        );
        out.kv_ops.push(r.kv_ops.total());
        let text = String::from_utf8_lossy(r.response.body());
        out.bytes = text.len();
        out.reported_ops = text
            .lines()
            .find_map(|l| l.strip_prefix("metal_ipam_scrape_kv_operations "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
    }
    out.latencies.sort();
    Ok(out)
}

/// Prints the table; returns the figures as JSON.
pub fn print(s: &Scrapes) -> Value {
    let (p50, p90, p99, max) = (
        percentile(&s.latencies, 50.0),
        percentile(&s.latencies, 90.0),
        percentile(&s.latencies, 99.0),
        s.latencies.last().map_or(0.0, |d| ms(*d)),
    );
    let mut t = Table::new(
        "8. Metrics scrape (GET /v1/metrics, SQLite file)",
        &[
            "pools",
            "scrapes",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "kv ops (host)",
            "kv ops (reported)",
            "bytes",
        ],
    );
    let ops_max = s.kv_ops.iter().max().copied().unwrap_or(0);
    let ops_min = s.kv_ops.iter().min().copied().unwrap_or(0);
    t.row(vec![
        s.pools.to_string(),
        s.latencies.len().to_string(),
        f1(p50),
        f1(p90),
        f1(p99),
        f1(max),
        if ops_min == ops_max {
            ops_min.to_string()
        } else {
            format!("{ops_min}-{ops_max}")
        },
        format!("{}", s.reported_ops),
        s.bytes.to_string(),
    ]);
    t.note("host kv ops = the scrape's reads (P + V + S + 5) plus the counting of the scrape request itself (1, more at powers of two); target p99 < 100 ms");
    t.print();
    json!({"pools": s.pools, "scrapes": s.latencies.len(), "p50_ms": p50, "p90_ms": p90,
           "p99_ms": p99, "max_ms": max, "kv_ops_min": ops_min, "kv_ops_max": ops_max,
           "reported_ops": s.reported_ops, "bytes": s.bytes})
}
