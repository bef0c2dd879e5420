//! Two host processes, one SQLite store file, more than a thousand claims
//! at once (plus duplicates) split across them: every claim is answered,
//! no address is handed out twice, duplicates get the same address.
//!
//! This is the multi-replica situation (several SpinKube pods on one
//! store) with Spin's SQLite semantics, including its compare-and-swap
//! upsert on absent keys.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

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
    let mut statuses = [ra.unwrap().status, rb.unwrap().status];
    statuses.sort();
    assert_eq!(
        statuses,
        [200, 201],
        "one instance created the pool, the other found it"
    );

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
        let (client, sem) = (client.clone(), sem.clone());
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
                    "m-{i}: {} {}",
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
    eprintln!(
        "{} requests, {created} created, {retried} retries after 503",
        CLAIMS + DUPLICATES
    );
    assert_eq!(by_claim.len(), CLAIMS, "every claim answered");
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    for (i, addrs) in &by_claim {
        assert_eq!(
            addrs.len(),
            1,
            "both posts of m-{i} got one address: {addrs:?}"
        );
        let addr = addrs.iter().next().unwrap().clone();
        if let Some(j) = owner.insert(addr.clone(), *i) {
            panic!("{addr} handed to m-{j} and m-{i}");
        }
    }
    assert_eq!(
        created, CLAIMS,
        "exactly one 201 per claim; duplicates got 200"
    );
    // Both instances see the same, complete state.
    for base in [&a.base_url, &b.base_url] {
        let r = client
            .call("GET", &format!("{base}/v1/pools/load/p"), None)
            .await
            .unwrap();
        assert_eq!(
            r.body["status"]["ipAddresses"]["used"], CLAIMS as u64,
            "{base}"
        );
        for i in [0, CLAIMS / 2, CLAIMS - 1] {
            let r = client
                .call("GET", &format!("{base}/v1/claims/load/m-{i}"), None)
                .await
                .unwrap();
            let want = by_claim[&i].iter().next().unwrap();
            assert_eq!(r.body["spec"]["address"].as_str(), Some(want.as_str()));
        }
    }
    // Lowest-first under contention: exactly the lowest CLAIMS addresses.
    let want: BTreeSet<String> = (1..=CLAIMS as u32)
        .map(|k| std::net::Ipv4Addr::from(0x0a40_0000 + k).to_string())
        .collect();
    assert_eq!(owner.keys().cloned().collect::<BTreeSet<_>>(), want);
}
