//! phoenixNAP-backed pools end to end through the app (`pnap_world`): the
//! fake Kubernetes API, the phoenixNAP simulator seeded with servers in PHX,
//! and the app on the test host and on real Spin (SQLite and Redis, when
//! `SPIN_BIN` is given) with only the phoenixNAP variables; and again on
//! real Spin against the real API server (`real_kube::spin_sqlite::` and
//! `real_kube::spin_redis::`, when `KUBEBUILDER_ASSETS` is given too,
//! every request also allowed by `deploy/rbac.yaml`). A private
//! network created for a pool, claims' addresses put on their servers'
//! memberships (two on one server: one membership with both), a claim
//! deleted (its IP off the membership, the last one's server off the
//! network, then the address released), teardown leaving nothing; a public
//! network with an ordered block; a lost answer on the network's creation;
//! the poll telling a deleted server's claims; a server phoenixNAP never
//! answers for among others, holding none of them.
//! Every request spec-valid, and the phoenixNAP requests per pool
//! provisioning and per claim assignment counted exactly.

use metal_ipam_tests::fake_kube::IPAM_GROUP;
use metal_ipam_tests::pnap_sim::{Fault, MembershipStatus, TOKEN_ROUTE};
use metal_ipam_tests::pnap_world::{
    on_fake, on_real, pool_object, steps, World, LOCATION, NS, SERVERS,
};
use serde_json::{json, Value};

fn private_pool() -> Value {
    pool_object(
        "priv",
        json!({"location": LOCATION, "privateNetwork": {"cidr": "10.20.0.0/24"}}),
    )
}

/// Token requests from `from` on.
fn tokens_since(w: &World, from: usize) -> usize {
    w.sim.requests()[from..]
        .iter()
        .filter(|r| r.operation.as_deref() == Some(TOKEN_ROUTE))
        .count()
}

/// Server `s`'s memberships: (network, IPs, status).
fn memberships_of(w: &World, s: &str) -> Vec<(String, Vec<String>, MembershipStatus)> {
    w.sim
        .memberships()
        .into_iter()
        .filter(|m| m.server_id == s)
        .map(|m| (m.network_id, m.ips, m.status))
        .collect()
}

/// The store's keys but the request counters' (`obs…`).
async fn records(w: &World) -> Vec<String> {
    let store = w.app.store().await;
    let mut keys: Vec<String> = store
        .get_keys()
        .await
        .unwrap()
        .into_iter()
        .filter(|k| !k.starts_with("obs"))
        .collect();
    keys.sort();
    keys
}

async fn a_private_network_pool_assigns_releases_and_is_torn_down(w: World) {
    let who = w.who();
    w.kube.create(private_pool());

    // 1. The network is created (one POST, one read of it), in one call.
    let m = w.mark();
    let calls = w.provision("priv").await;
    assert_eq!(
        (calls, tokens_since(&w, m), w.calls_since(m)),
        (
            1,
            1,
            vec![
                "POST privateNetworksPost".to_string(),
                "GET privateNetworksNetworkIdGet".into()
            ]
        ),
        "{who}"
    );
    let pool = w.pool("priv").unwrap();
    assert_eq!(World::condition(&pool, "Ready").0, "True", "{pool:#}");
    let nets = w.sim.private_networks();
    assert_eq!(nets.len(), 1, "{who}: {nets:?}");
    assert_eq!(nets[0].cidr.as_deref(), Some("10.20.0.0/24"));
    assert_eq!(nets[0].location, LOCATION);
    let uid = pool["metadata"]["uid"].as_str().unwrap();
    assert_eq!(
        nets[0].name,
        format!("metal-ipam.dev-pool-uid-{uid}"),
        "the pool's tag"
    );
    assert_eq!(
        pool["status"]["phoenixnap"]["privateNetwork"]["id"],
        json!(nets[0].id)
    );
    assert_eq!(pool["status"]["ipAddresses"]["total"], 254);
    let net = nets[0].id.clone();

    // 2. Three claims, two on one server: each address on its server's
    // membership of the network.
    // Per claim: the server read twice (device, then its networks), the
    // private networks listed (which holds the address), one write: a
    // join (POST) or the membership's IPs (PATCH); one token.
    for (c, s, write) in [
        ("m-0", 0, "POST serversServerIdPrivateNetworksPost"),
        ("m-1", 0, "PATCH serversServerIdPrivateNetworksPatch"),
        ("m-2", 1, "POST serversServerIdPrivateNetworksPost"),
    ] {
        // The claim's event chains the assign step (its pool is backed by
        // a cloud): the address is put on the server during the delivery;
        // the assign step called again then finds it converged.
        let m = w.mark();
        w.claim(c, "priv", SERVERS[s]).await;
        let calls = w.assign(c).await;
        let reads = [
            "GET serversServerIdGet",
            "GET serversServerIdGet",
            "GET privateNetworksGet",
        ];
        let mut want: Vec<String> = reads.iter().map(|r| r.to_string()).collect();
        want.push(write.into());
        assert_eq!(
            (calls, tokens_since(&w, m), w.calls_since(m)),
            (1, 1, want),
            "{who}: {c}"
        );
        let claim = w.claim_obj(c).unwrap();
        assert_eq!(
            World::condition(&claim, "MetalAssigned"),
            ("True".into(), "Assigned".into()),
            "{who}: {claim:#}"
        );
    }
    let (a0, a1, a2) = (w.address("m-0"), w.address("m-1"), w.address("m-2"));
    assert_eq!([&a0, &a1, &a2], ["10.20.0.1", "10.20.0.2", "10.20.0.3"]);
    let s0 = memberships_of(&w, SERVERS[0]);
    assert_eq!(s0.len(), 1, "{who}: one membership: {s0:?}");
    assert_eq!((&s0[0].0, &s0[0].1), (&net, &vec![a0.clone(), a1.clone()]));
    let s1 = memberships_of(&w, SERVERS[1]);
    assert_eq!((&s1[0].0, &s1[0].1), (&net, &vec![a2.clone()]));
    w.sim.settle();

    // 3. A claim deleted: its IP leaves the membership, then the address
    // is released.
    let m = w.mark();
    let answers = w.delete_claim("m-1", 3).await;
    assert_eq!(
        answers.iter().map(steps).collect::<Vec<_>>(),
        [["release waiting", "assign released", "release released"]],
        "{who}"
    );
    assert_eq!(
        w.calls_since(m),
        [
            "GET serversServerIdGet",
            "PATCH serversServerIdPrivateNetworksPatch"
        ]
    );
    assert_eq!(
        memberships_of(&w, SERVERS[0])[0].1,
        std::slice::from_ref(&a0)
    );
    assert!(w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "m-1")
        .is_none());
    // The last IP: the server leaves the network, and the address is not
    // released until it has left.
    let m = w.mark();
    let answers = w.delete_claim("m-2", 4).await;
    // The leave is accepted (503: the address is held while the server
    // leaves), the server read while it leaves, then it has left.
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 503, 200], "{who}");
    assert_eq!(
        steps(answers.last().unwrap()),
        ["release waiting", "assign released", "release released"]
    );
    assert_eq!(
        w.calls_since(m),
        [
            "GET serversServerIdGet",
            "DELETE deletePrivateNetwork",
            "GET serversServerIdGet",
            "GET serversServerIdGet"
        ],
        "{who}"
    );
    assert!(memberships_of(&w, SERVERS[1]).is_empty());
    assert!(w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "m-2")
        .is_none());
    // The freed addresses are handed out again and put on another server.
    for c in ["m-3", "m-4"] {
        w.claim(c, "priv", SERVERS[2]).await;
        w.assign(c).await;
    }
    let mut again = vec![w.address("m-3"), w.address("m-4")];
    again.sort();
    assert_eq!(again, [a1.clone(), a2.clone()]);
    assert_eq!(memberships_of(&w, SERVERS[2])[0].1.len(), 2);

    // 5. Teardown: the claims go, then the pool; the network is deleted.
    for c in ["m-0", "m-3", "m-4"] {
        w.delete_claim(c, 4).await;
    }
    assert!(
        w.sim.memberships().is_empty(),
        "{who}: {:?}",
        w.sim.memberships()
    );
    w.kube.delete(
        metal_ipam_tests::fake_kube::METAL_GROUP,
        "metalippools",
        Some(NS),
        "priv",
    );
    let m = w.mark();
    let (r, calls) = w.settle(&World::pool_path("priv"), 6).await;
    assert_eq!(r.body["result"], "deleted", "{who}: {:#}", r.body);
    assert_eq!(
        (calls, w.calls_since(m)),
        (
            1,
            vec![
                "GET privateNetworksNetworkIdGet".to_string(),
                "DELETE privateNetworksNetworkIdDelete".into()
            ]
        ),
        "{who}"
    );
    assert!(w.pool("priv").is_none());
    assert!(w.sim.private_networks().is_empty());
    assert!(w.sim.public_networks().is_empty() && w.sim.ip_blocks().is_empty());
    assert!(w.sim.memberships().is_empty());
    assert_api_empty(&w);
    assert_tombstones(&w, "priv", &["m-0", "m-1", "m-2", "m-3", "m-4"]).await;
    w.assert_clean();
}

/// Nothing of the pool's left on the API server: no claim (each one's
/// finalizer removed by its release), no IPAddress, no pool.
fn assert_api_empty(w: &World) {
    let who = w.who();
    for (group, plural) in [
        (IPAM_GROUP, "ipaddressclaims"),
        (IPAM_GROUP, "ipaddresses"),
        (metal_ipam_tests::fake_kube::METAL_GROUP, "metalippools"),
    ] {
        assert_eq!(
            w.kube.list(group, plural),
            Vec::<Value>::new(),
            "{who}: {plural}"
        );
    }
}

/// What the store keeps of a pool and its claims once all are gone: the
/// pool's tombstones and each claim's closed assignment record (and the
/// indexes, empty of them).
async fn assert_tombstones(w: &World, pool: &str, claims: &[&str]) {
    let who = w.who();
    let store = w.app.store().await;
    let mut want = vec![
        "metal-claim-index".to_string(),
        "metal-claim-index-init".into(),
        format!("metal-init/pool/ns/{NS}/{pool}"),
        format!("metal/pool/ns/{NS}/{pool}"),
        "pool-index".into(),
        "pool-index-init".into(),
        format!("pool-init/ns/{NS}/{pool}"),
        format!("pool/ns/{NS}/{pool}"),
    ];
    for c in claims {
        want.push(format!("metal-init/claim/{NS}/{c}"));
        want.push(format!("metal/claim/{NS}/{c}"));
    }
    want.sort();
    assert_eq!(records(w).await, want, "{who}");
    let state = |k: String| {
        let store = &store;
        async move {
            let bytes = store.get(&k).await.unwrap().unwrap();
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            v["state"].clone()
        }
    };
    // The pool's records are tombstones, the claims' records closed.
    for k in [
        format!("pool/ns/{NS}/{pool}"),
        format!("metal/pool/ns/{NS}/{pool}"),
    ] {
        assert_eq!(state(k.clone()).await["deleted"], true, "{who}: {k}");
    }
    assert_eq!(
        state("pool-index".into()).await["pools"],
        json!({}),
        "{who}"
    );
    for c in claims {
        let k = format!("metal/claim/{NS}/{c}");
        assert_eq!(state(k.clone()).await["closed"], true, "{who}: {k}");
    }
}

/// Scenario 6: a public network with an ordered block: the block, the network
/// with it attached; a claim's address on its server's public membership;
/// teardown deletes the network, then the block.
async fn a_public_network_pool_orders_its_block_and_is_torn_down(w: World) {
    let who = w.who();
    w.kube.create(pool_object(
        "pub",
        json!({"location": LOCATION, "publicNetwork": {}, "ipBlock": {"cidrBlockSize": 29}}),
    ));
    let m = w.mark();
    let calls = w.provision("pub").await;
    // The block ordered, the network created with it, the block read
    // until it is assigned (once, here); one token.
    assert_eq!(
        (calls, tokens_since(&w, m), w.calls_since(m)),
        (
            1,
            1,
            vec![
                "POST ipBlocksPost".to_string(),
                "POST publicNetworksPost".into(),
                "GET ipBlocksIpBlockIdGet".into()
            ]
        ),
        "{who}"
    );
    let (blocks, nets) = (w.sim.ip_blocks(), w.sim.public_networks());
    assert_eq!(
        (blocks.len(), nets.len()),
        (1, 1),
        "{who}: {blocks:?} {nets:?}"
    );
    assert_eq!(
        blocks[0].assigned_resource_id.as_deref(),
        Some(nets[0].id.as_str())
    );
    assert_eq!(blocks[0].cidr_block_size, "/29");
    let pool = w.pool("pub").unwrap();
    assert_eq!(World::condition(&pool, "Ready").0, "True", "{pool:#}");

    let m = w.mark();
    w.claim("m-0", "pub", SERVERS[0]).await;
    let calls = w.assign("m-0").await;
    // A public address: the private networks, then the public ones, are
    // looked through for its range.
    assert_eq!(
        (calls, tokens_since(&w, m), w.calls_since(m)),
        (
            1,
            1,
            vec![
                "GET serversServerIdGet".to_string(),
                "GET serversServerIdGet".into(),
                "GET privateNetworksGet".into(),
                "GET publicNetworksGet".into(),
                "POST serversServerIdPublicNetworksPost".into()
            ]
        ),
        "{who}"
    );
    let ip = w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "m-0")
        .unwrap();
    assert_eq!(
        (
            &ip["spec"]["address"],
            &ip["spec"]["gateway"],
            &ip["spec"]["prefix"]
        ),
        (&json!("198.18.0.2"), &json!("198.18.0.1"), &json!(29)),
        "{who}"
    );
    let a0 = w.address("m-0");
    let s0 = memberships_of(&w, SERVERS[0]);
    assert_eq!(
        (&s0[0].0, &s0[0].1),
        (&nets[0].id, &vec![a0.clone()]),
        "{who}"
    );

    w.delete_claim("m-0", 4).await;
    assert!(
        w.sim.memberships().is_empty(),
        "{who}: {:?}",
        w.sim.memberships()
    );
    w.kube.delete(
        metal_ipam_tests::fake_kube::METAL_GROUP,
        "metalippools",
        Some(NS),
        "pub",
    );
    let m = w.mark();
    let (r, calls) = w.settle(&World::pool_path("pub"), 6).await;
    assert_eq!(r.body["result"], "deleted", "{who}: {:#}", r.body);
    // The network first (its block freed), then the block.
    assert_eq!(
        (calls, w.calls_since(m)),
        (
            1,
            vec![
                "GET publicNetworksNetworkIdGet".to_string(),
                "DELETE publicNetworksNetworkIdDelete".into(),
                "GET ipBlocksIpBlockIdGet".into(),
                "DELETE ipBlocksIpBlockIdDelete".into()
            ]
        ),
        "{who}"
    );
    assert!(w.sim.public_networks().is_empty() && w.sim.ip_blocks().is_empty());
    assert!(w.sim.private_networks().is_empty() && w.sim.memberships().is_empty());
    assert_api_empty(&w);
    assert_tombstones(&w, "pub", &["m-0"]).await;
    w.assert_clean();
}

/// Scenario 7: the network's creation applied but its answer lost: the step runs
/// again and finds it (by the pool's tag); exactly one network.
async fn a_lost_answer_on_the_networks_creation_is_found_not_repeated(w: World) {
    let who = w.who();
    w.kube.create(private_pool());
    w.sim
        .inject("POST", "privateNetworksPost", Fault::CrashAfter, 1);
    let path = World::pool_path("priv");
    let mut answers = Vec::new();
    for _ in 0..6 {
        let r = w.app.call("POST", &path, None).await;
        answers.push((r.status, r.body["result"].clone(), r.body["reason"].clone()));
        if r.status == 200 {
            break;
        }
    }
    assert_eq!(answers.last().unwrap().1, "synced", "{who}: {answers:?}");
    // In one call: the POST whose answer was lost, the network found by
    // its name, then read.
    assert_eq!(answers.len(), 1, "{who}: {answers:?}");
    assert_eq!(
        w.calls_since(0),
        [
            "POST privateNetworksPost",
            "GET privateNetworksGet",
            "GET privateNetworksNetworkIdGet"
        ],
        "{who}"
    );
    assert_eq!(w.sim.pending_faults(), 0);
    assert_eq!(w.sim.private_networks().len(), 1, "{who}");
    assert_eq!(
        w.sim.count("privateNetworksPost"),
        1,
        "{who}: one POST, found by its name"
    );
    w.assert_clean();
}

/// Scenario 4: the poll: a server deleted in phoenixNAP; the poll marks its claims
/// (`MetalAssigned=False DeviceDeleted`, their records device-gone) and
/// releases nothing.
async fn the_poll_marks_the_claims_of_a_deleted_server(w: World) {
    let who = w.who();
    w.kube.create(private_pool());
    w.provision("priv").await;
    for (c, s) in [("m-0", 0), ("m-1", 0), ("m-2", 1)] {
        w.claim(c, "priv", SERVERS[s]).await;
        w.assign(c).await;
    }
    // The first poll sets the cursor (a resync of the known servers).
    let r = w.app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.status, 200, "{who}: {:#}", r.body);
    assert_eq!(r.body["phoenixnap"]["resync"], true, "{who}: {:#}", r.body);
    // A second later (the audit log's `from` is inclusive: an event of the
    // cursor's own instant is not news), the server is deleted.
    w.sim.advance(1_000);
    w.sim.delete_server(SERVERS[0]);
    let mut polls = 0;
    loop {
        polls += 1;
        let r = w.app.call("POST", "/v1/metal/poll", None).await;
        assert_eq!(r.status, 200, "{who}: {:#}", r.body);
        for k in [
            "events",
            "resync",
            "devices",
            "deviceDeleted",
            "synced",
            "cursor",
            "pending",
            "more",
            "errors",
        ] {
            assert!(
                r.body["phoenixnap"].get(k).is_some(),
                "{who}: {k}: {:#}",
                r.body
            );
        }
        if r.body["phoenixnap"]["more"] != true || polls == 5 {
            break;
        }
    }
    let store = w.app.store().await;
    for c in ["m-0", "m-1", "m-2"] {
        let claim = w.claim_obj(c).unwrap();
        let rec = store
            .get(&format!("metal/claim/{NS}/{c}"))
            .await
            .unwrap()
            .unwrap();
        let rec: Value = serde_json::from_slice(&rec).unwrap();
        let on_deleted = c != "m-2";
        let want = if on_deleted {
            ("False", "DeviceDeleted")
        } else {
            ("True", "Assigned")
        };
        let got = World::condition(&claim, "MetalAssigned");
        assert_eq!((got.0.as_str(), got.1.as_str()), want, "{who}: {c}");
        assert_eq!(
            rec["state"]["deviceGone"] == true,
            on_deleted,
            "{who}: {c}: {rec}"
        );
        assert!(
            w.kube.get(IPAM_GROUP, "ipaddresses", Some(NS), c).is_some(),
            "{who}: {c} released"
        );
    }
    // The other server keeps its address.
    assert_eq!(memberships_of(&w, SERVERS[1])[0].1, [w.address("m-2")]);
    w.assert_clean();
}

/// Scenario 5: one server among several that phoenixNAP never answers for,
/// and one deleted. The poll tells the deleted server's claims in its first
/// call, names the silent server (why, and when it is read again) within
/// one server read's budget, and leaves it alone in the next call; a claim
/// on a healthy server is assigned meanwhile; a claim on the silent server
/// answers 503 within the step's budget, keeps its address, and is
/// assigned once phoenixNAP answers again.
async fn one_silent_server_among_others_holds_no_other(w: World) {
    let who = w.who();
    let (silent, doomed, healthy) = (SERVERS[0], SERVERS[1], SERVERS[2]);
    w.kube.create(private_pool());
    w.provision("priv").await;
    for (c, s) in [("m-0", silent), ("m-1", doomed), ("m-2", healthy)] {
        w.claim(c, "priv", s).await;
        w.assign(c).await;
    }
    // The first poll sets the cursor (a resync of the known servers).
    for _ in 0..3 {
        let r = w.app.call("POST", "/v1/metal/poll", None).await;
        assert_eq!(r.status, 200, "{who}: {:#}", r.body);
        if r.body["phoenixnap"]["more"] != true {
            break;
        }
    }
    w.sim.advance(1_000);
    w.sim.delete_server(doomed);
    // Every read of the silent server waits a minute before answering.
    let path = format!("/bmc/v1/servers/{silent}");
    w.sim
        .inject("GET", &path, Fault::Latency(60_000), usize::MAX);
    let reads = |w: &World| {
        w.sim
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == path)
            .count()
    };
    let started = std::time::Instant::now();
    let first = w.app.call("POST", "/v1/metal/poll", None).await;
    let took = started.elapsed();
    let p = &first.body["phoenixnap"];
    assert_eq!(
        p["deviceDeleted"],
        json!([format!("{NS}/m-1")]),
        "{who}: the deleted server's claim told in the first call: {:#}",
        first.body
    );
    let failures = p["deviceFailures"].as_array().expect("deviceFailures");
    assert_eq!(failures.len(), 1, "{who}: {:#}", first.body);
    assert_eq!(failures[0]["device"], json!(silent), "{who}");
    let error = failures[0]["error"].as_str().unwrap();
    assert!(error.contains("PnapUnavailable"), "{who}: {error}");
    assert!(failures[0]["retryAt"].as_u64().unwrap() > 0, "{who}");
    assert_eq!(first.status, 500, "{who}: {:#}", first.body);
    // One server read's budget (3 s, and the last attempt's floor), not
    // the client's 10 s, nor the simulator's minute.
    assert!(
        took < std::time::Duration::from_secs(6),
        "{who}: answered after {took:?}"
    );
    let first_reads = reads(&w);
    assert!((1..=3).contains(&first_reads), "{who}: {first_reads} reads");
    // The next call leaves it alone while it backs off.
    let second = w.app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(second.status, 200, "{who}: {:#}", second.body);
    assert_eq!(
        second.body["phoenixnap"]["backingOff"][0]["device"],
        json!(silent),
        "{who}: {:#}",
        second.body
    );
    assert_eq!(reads(&w), first_reads, "{who}: read while it backs off");
    for (c, want) in [
        ("m-0", ("True", "Assigned")),
        ("m-1", ("False", "DeviceDeleted")),
        ("m-2", ("True", "Assigned")),
    ] {
        let got = World::condition(&w.claim_obj(c).unwrap(), "MetalAssigned");
        assert_eq!((got.0.as_str(), got.1.as_str()), want, "{who}: {c}");
    }
    // A claim on the healthy server is assigned meanwhile.
    w.claim("m-3", "priv", healthy).await;
    w.assign("m-3").await;
    assert_eq!(
        w.ips_on(healthy, &w.sim.private_networks()[0].id)
            .map(|ips| ips.len()),
        Some(2),
        "{who}"
    );
    // A claim on the silent server: bound, its assignment answers 503
    // within the step's budget, and says why on the claim.
    w.claim("m-4", "priv", silent).await;
    let started = std::time::Instant::now();
    let r = w.app.call("POST", &World::claim_path("m-4"), None).await;
    let took = started.elapsed();
    assert_eq!(r.status, 503, "{who}: {:#}", r.body);
    assert!(r.headers.get("retry-after").is_some(), "{who}");
    assert!(
        took < std::time::Duration::from_secs(15),
        "{who}: answered after {took:?}"
    );
    let claim = w.claim_obj("m-4").unwrap();
    assert!(
        claim["status"]["addressRef"]["name"].is_string(),
        "{who}: the address kept: {claim:#}"
    );
    // phoenixNAP answers again: assigned once.
    w.sim.clear_faults();
    w.assign("m-4").await;
    assert_eq!(
        World::condition(&w.claim_obj("m-4").unwrap(), "MetalAssigned"),
        ("True".into(), "Assigned".into()),
        "{who}"
    );
    let on_silent = w.ips_on(silent, &w.sim.private_networks()[0].id).unwrap();
    assert_eq!(on_silent, [w.address("m-0"), w.address("m-4")], "{who}");
    w.assert_clean();
}

metal_ipam_tests::on_every_runtime!(
    on_fake: a_private_network_pool_assigns_releases_and_is_torn_down,
    a_public_network_pool_orders_its_block_and_is_torn_down,
    a_lost_answer_on_the_networks_creation_is_found_not_repeated,
    the_poll_marks_the_claims_of_a_deleted_server,
    one_silent_server_among_others_holds_no_other,
);

metal_ipam_tests::on_real_kube!(
    on_real: a_private_network_pool_assigns_releases_and_is_torn_down,
    a_public_network_pool_orders_its_block_and_is_torn_down,
    a_lost_answer_on_the_networks_creation_is_found_not_repeated,
    the_poll_marks_the_claims_of_a_deleted_server,
    one_silent_server_among_others_holds_no_other,
);
