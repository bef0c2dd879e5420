//! Two host processes, one store, more than a thousand claims at once
//! (plus duplicates) split across them: every claim is answered, no
//! address is handed out twice, duplicates get the same address.
//!
//! This is the multi-replica situation (several SpinKube pods on one
//! store), run on each shared backend the host has:
//! - one SQLite file, with Spin's SQLite semantics, including its
//!   compare-and-swap upsert on absent keys;
//! - one Redis database (what a multi-replica deployment uses), with
//!   Spin 3.6's Redis backend exactly (`--redis-swap spin-3.6`: every swap
//!   is reported as cas-failed, applied or not) and with the EXEC reply
//!   deciding (`--redis-swap exec-reply`: every swap is reported as a
//!   success, even one the WATCH aborted). Redis comes from
//!   `METAL_IPAM_TEST_REDIS_URL` (`.ci/run` starts one) or a private
//!   `redis-server`; without either the Redis cases print
//!   `skipped: no redis-server`, and fail under `CI=true`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use metal_ipam_host::test_redis::TestRedis;
use metal_ipam_tests::client::HttpClient;
use metal_ipam_tests::harness::{claim_json, pool_json, HostProcess, TempDir};
use tokio::sync::Semaphore;

const CLAIMS: usize = 1000;
const DUPLICATES: usize = 200;
const IN_FLIGHT: usize = 48;
const MAX_RETRIES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_one_store_thousand_claims() {
    let dir = TempDir::new("concurrency");
    let db = dir.path().join("shared.db");
    let a = HostProcess::start(&db).expect("host A");
    let b = HostProcess::start(&db).expect("host B");
    thousand_claims("sqlite", &a, &b).await;
}

/// Two host processes on one Redis database, Spin 3.6's Redis backend
/// exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_one_redis_thousand_claims_spin_3_6() {
    let Some(redis) = TestRedis::get("two_instances_one_redis_thousand_claims_spin_3_6") else {
        return;
    };
    on_redis(&redis, 11, "spin-3.6").await;
}

/// Two host processes on one Redis database, swaps reported by their EXEC
/// reply (an aborted swap reads as a success).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_one_redis_thousand_claims_exec_reply() {
    let Some(redis) = TestRedis::get("two_instances_one_redis_thousand_claims_exec_reply") else {
        return;
    };
    on_redis(&redis, 12, "exec-reply").await;
}

async fn on_redis(redis: &TestRedis, db: u8, swap: &str) {
    let url = redis.fresh_db(db);
    let dir = TempDir::new("concurrency-redis");
    let config = dir.path().join("runtime-config.toml");
    std::fs::write(
        &config,
        format!("[key_value_store.default]\ntype = \"redis\"\nurl = \"{url}\"\n"),
    )
    .expect("write runtime config");
    let extra = ["--redis-swap", swap];
    let a = HostProcess::start_with_runtime_config(&config, &extra).expect("host A");
    let b = HostProcess::start_with_runtime_config(&config, &extra).expect("host B");
    thousand_claims(&format!("redis {swap}"), &a, &b).await;
}

/// The scenario: a pool registered concurrently on both hosts, then
/// [`CLAIMS`] claims and [`DUPLICATES`] re-posts of some of them, spread
/// over both hosts, [`IN_FLIGHT`] at a time.
async fn thousand_claims(backend: &str, a: &HostProcess, b: &HostProcess) {
    let started = std::time::Instant::now();
    let client = HttpClient::new();

    // Register the pool concurrently on both instances: exactly one creates.
    let pool = pool_json("load", "p", &["10.64.0.0/21"], 21);
    let (url_a, url_b) = (
        format!("{}/v1/pools/load/p", a.base_url),
        format!("{}/v1/pools/load/p", b.base_url),
    );
    let (ra, rb) = tokio::join!(
        client.call("PUT", &url_a, Some(&pool)),
        client.call("PUT", &url_b, Some(&pool))
    );
    let mut pool_statuses = [ra.unwrap().status, rb.unwrap().status];
    pool_statuses.sort();

    // Claims 0..CLAIMS, and DUPLICATES of them posted again to the other instance.
    let mut jobs: Vec<(usize, bool)> = (0..CLAIMS).map(|i| (i, false)).collect();
    jobs.extend((0..DUPLICATES).map(|k| (k * (CLAIMS / DUPLICATES), true)));
    // Interleave duplicates with originals so they really race.
    jobs.sort_by_key(|&(i, dup)| (i / 10, dup));
    let sem = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = Vec::new();
    for (i, dup) in jobs {
        let url = if (i % 2 == 0) ^ dup {
            &a.base_url
        } else {
            &b.base_url
        };
        let url = format!("{url}/v1/claims");
        let (client, sem, backend) = (client.clone(), sem.clone(), backend.to_string());
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire().await.unwrap();
            let claim = claim_json("load", &format!("m-{i}"), &format!("uid-{i}"), "p");
            let mut retries = 0;
            loop {
                let r = client
                    .call("POST", &url, Some(&claim))
                    .await
                    .expect("answered");
                if r.status == 503 && retries < MAX_RETRIES {
                    // Retry-After: 1 — a real forwarder would retry too.
                    retries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
                assert!(
                    r.status == 201 || r.status == 200,
                    "{backend}: m-{i}: {} {}",
                    r.status,
                    r.body
                );
                let addr = r.body["spec"]["address"].as_str().unwrap().to_string();
                return (i, dup, addr, r.status, retries);
            }
        }));
    }
    let mut by_claim: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    let mut created = 0;
    let mut retried = 0;
    for t in tasks {
        let (i, _dup, addr, status, retries) = t.await.expect("task");
        by_claim.entry(i).or_default().insert(addr);
        created += usize::from(status == 201);
        retried += retries;
    }
    // Every check runs and every failure is reported, so one run shows
    // the whole picture (the checks are those of the original test).
    let mut failures: Vec<String> = Vec::new();
    let distinct: BTreeSet<&String> = by_claim.values().flatten().collect();
    let split = by_claim.values().filter(|a| a.len() > 1).count();
    eprintln!(
        "{backend}: pool PUT statuses {pool_statuses:?}; {} claim requests in {:.1} s: {created} created (201), {} found (200), {retried} retries after 503, {} distinct addresses, {split} claims answered with two addresses",
        CLAIMS + DUPLICATES,
        started.elapsed().as_secs_f64(),
        CLAIMS + DUPLICATES - created,
        distinct.len()
    );
    if pool_statuses != [200, 201] {
        failures.push(format!(
            "one instance created the pool (201), the other found it (200): got {pool_statuses:?}"
        ));
    }
    if by_claim.len() != CLAIMS {
        failures.push(format!(
            "every claim answered: {} of {CLAIMS}",
            by_claim.len()
        ));
    }
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    for (i, addrs) in &by_claim {
        if addrs.len() != 1 {
            failures.push(format!("both posts of m-{i} got one address: {addrs:?}"));
        }
        for addr in addrs {
            if let Some(j) = owner.insert(addr.clone(), *i) {
                if j != *i {
                    failures.push(format!("{addr} handed to m-{j} and m-{i}"));
                }
            }
        }
    }
    if created != CLAIMS {
        failures.push(format!(
            "exactly one 201 per claim, duplicates got 200: {created} created for {CLAIMS} claims"
        ));
    }
    // Both instances see the same, complete state.
    for base in [&a.base_url, &b.base_url] {
        let r = client
            .call("GET", &format!("{base}/v1/pools/load/p"), None)
            .await
            .unwrap();
        let used = &r.body["status"]["ipAddresses"]["used"];
        if *used != CLAIMS as u64 {
            failures.push(format!("{base}: pool used = {used}, want {CLAIMS}"));
        }
        for i in [0, CLAIMS / 2, CLAIMS - 1] {
            let r = client
                .call("GET", &format!("{base}/v1/claims/load/m-{i}"), None)
                .await
                .unwrap();
            let got = r.body["spec"]["address"].as_str().map(str::to_string);
            let want = by_claim.get(&i).and_then(|a| a.iter().next()).cloned();
            if got != want {
                failures.push(format!(
                    "{base}: m-{i} reads back as {got:?}, was answered {want:?}"
                ));
            }
        }
    }
    // Lowest-first under contention: exactly the lowest CLAIMS addresses.
    let want: BTreeSet<String> = (1..=CLAIMS as u32)
        .map(|k| std::net::Ipv4Addr::from(0x0a40_0000 + k).to_string())
        .collect();
    let got: BTreeSet<String> = owner.keys().cloned().collect();
    if got != want {
        failures.push(format!(
            "the lowest {CLAIMS} addresses: {} handed out beyond them, {} of them unused",
            got.difference(&want).count(),
            want.difference(&got).count()
        ));
    }
    assert!(
        failures.is_empty(),
        "{backend}: {} check(s) failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}
