//! Machine networking on phoenixNAP end to end through the app
//! (`pnap_world`: the fake Kubernetes API, the phoenixNAP simulator, the app
//! on the test host and on real Spin with SQLite and Redis when `SPIN_BIN`
//! is given; and again on real Spin against the real API server,
//! `real_kube::spin_sqlite::` and `real_kube::spin_redis::`, when
//! `KUBEBUILDER_ASSETS` is given too, every request also allowed by
//! `deploy/rbac.yaml`). A Machine on a phoenixNAP server opts into a profile naming
//! two networks, a private and a public one, each the network of a pool,
//! with an address from that pool: the apply waits for the claims'
//! addresses, then joins the server to both networks with them, one change
//! at a time, followed to `assigned`; a converged apply makes no change; the
//! node's configuration renders the two tagged VLANs; the profile edited
//! (the public network dropped) leaves that network and deletes its claim;
//! the release leaves the rest and deletes the claims. Port modes on
//! phoenixNAP are refused naming the field. Every request spec-valid, and
//! the phoenixNAP requests per apply counted exactly.

use metal_ipam_tests::fake_kube::IPAM_GROUP;
use metal_ipam_tests::pnap_world::{
    on_fake, on_real, pool_object, steps, World, LOCATION, NS, SERVERS,
};
use serde_json::{json, Value};

const PATH: &str = "/v1/machines/team-a/m-0/network";

fn profile(vlans: Value) -> Value {
    json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalNetworkProfile",
        "metadata": {"name": "nets", "namespace": NS},
        "spec": {"location": LOCATION, "ports": [{"name": "bond0", "vlans": vlans}]}
    })
}

fn both() -> Value {
    json!([
        {"pool": {"name": "priv"}, "addresses": [{"pool": {"name": "priv"}}]},
        {"pool": {"name": "pub"}, "addresses": [{"pool": {"name": "pub"}}]}
    ])
}

/// Two provisioned pools (a created private network, a public network
/// with an ordered /29), the profile, a Cluster and Machine `m-0` on the
/// first server.
async fn seeded(w: World) -> World {
    w.kube.create(pool_object(
        "priv",
        json!({"location": LOCATION, "privateNetwork": {"cidr": "10.20.0.0/24"}}),
    ));
    w.kube.create(pool_object(
        "pub",
        json!({"location": LOCATION, "publicNetwork": {}, "ipBlock": {"cidrBlockSize": 29}}),
    ));
    w.provision("priv").await;
    w.provision("pub").await;
    w.kube.create(profile(both()));
    w.kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c", "namespace": NS}, "spec": {}}),
    );
    w.kube.create(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m-0", "namespace": NS,
            "annotations": {"ipam.metal-ipam.dev/network-profile": "nets"}},
        "spec": {"clusterName": "c", "providerID": format!("phoenixnap://{}", SERVERS[0])}
    }));
    w
}

/// The profile's spec replaced by `spec` (an edit).
fn set_spec(w: &World, spec: Value) {
    let mut p = w
        .kube
        .get(
            "ipam.metal-ipam.dev",
            "metalnetworkprofiles",
            Some(NS),
            "nets",
        )
        .expect("the profile");
    p["spec"] = spec;
    w.kube.put(p);
}

/// The claims the profile made for m-0.
fn profile_claims(w: &World) -> Vec<Value> {
    w.kube
        .list(IPAM_GROUP, "ipaddressclaims")
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["ipam.metal-ipam.dev/network-machine"] == "m-0")
        .collect()
}

/// m-0's claims being deleted delivered (`MODIFIED`): the release step
/// frees their addresses and removes its finalizer; they are gone after.
async fn finish_deletions(w: &World) -> usize {
    let who = w.who();
    let deleting: Vec<Value> = profile_claims(w)
        .into_iter()
        .filter(|c| c["metadata"].get("deletionTimestamp").is_some())
        .collect();
    for c in &deleting {
        let r = w.event("MODIFIED", c).await;
        assert_eq!(r.status, 200, "{who}: {:#}", r.body);
        let name = c["metadata"]["name"].as_str().unwrap();
        assert!(w.claim_obj(name).is_none(), "{who}: {name} still there");
    }
    deleting.len()
}

/// Each of m-0's claims delivered (`ADDED`): bound by the allocator; the
/// chained assign step leaves them to the apply.
async fn bind_claims(w: &World) -> Vec<(String, String)> {
    let who = w.who();
    let mut out = Vec::new();
    for c in profile_claims(w) {
        let r = w.event("ADDED", &c).await;
        let s = steps(&r);
        assert_eq!(
            s.first().map(String::as_str),
            Some("allocate bound"),
            "{who}: {:#}",
            r.body
        );
        assert!(s.iter().any(|x| x == "assign ignored"), "{who}: {s:?}");
        let name = c["metadata"]["name"].as_str().unwrap().to_string();
        let pool = c["spec"]["poolRef"]["name"].as_str().unwrap().to_string();
        out.push((pool, w.address(&name)));
    }
    out.sort();
    out
}

/// POSTs (or DELETEs) the machine's network until 200; the answers' issued
/// steps (`action network`) and the calls made.
async fn settle(w: &World, method: &str) -> (Value, Vec<String>, usize) {
    let who = w.who();
    let mut issued = Vec::new();
    for i in 1..=20 {
        let r = w.app.call(method, PATH, None).await;
        for s in r.body["issued"].as_array().into_iter().flatten() {
            issued.push(format!(
                "{} {}",
                s["action"].as_str().unwrap(),
                s["network"].as_str().unwrap()
            ));
        }
        if r.status == 200 {
            return (r.body, issued, i);
        }
        assert_eq!(r.status, 202, "{who}: {:#}", r.body);
        assert!(r.headers.get("retry-after").is_some(), "{who}");
    }
    panic!("{who}: {method} {PATH} still in progress");
}

/// m-0's server's memberships: (network, IPs, status), sorted.
fn memberships(w: &World) -> Vec<(String, Vec<String>, String)> {
    let mut m: Vec<_> = w
        .sim
        .memberships()
        .into_iter()
        .filter(|m| m.server_id == SERVERS[0])
        .map(|m| (m.network_id, m.ips, format!("{:?}", m.status)))
        .collect();
    m.sort();
    m
}

async fn a_profile_puts_a_server_on_two_networks_with_pool_addresses(w: World) {
    let w = seeded(w).await;
    let who = w.who();
    let private = w.sim.private_networks()[0].clone();
    let public = w.sim.public_networks()[0].clone();

    // Nothing to plan until the claims have their addresses.
    let r = w
        .app
        .call("POST", &format!("{PATH}?dryRun=true"), None)
        .await;
    assert_eq!(r.status, 200, "{who}: {:#}", r.body);
    assert_eq!(r.body["plan"], json!([]), "{who}: {:#}", r.body);
    assert!(
        r.body["waiting"].as_str().unwrap().contains("2 claim"),
        "{who}: {:#}",
        r.body
    );

    // The first apply makes the claims and waits for their addresses.
    let r = w.app.call("POST", PATH, None).await;
    assert_eq!(r.status, 202, "{who}: {:#}", r.body);
    assert!(
        r.body["waiting"].as_str().unwrap().contains("claim"),
        "{who}: {:#}",
        r.body
    );
    assert_eq!(profile_claims(&w).len(), 2, "{who}");
    assert!(
        memberships(&w).is_empty(),
        "{who}: nothing joined without addresses"
    );
    let bound = bind_claims(&w).await;
    let (priv_ip, pub_ip) = (bound[0].1.clone(), bound[1].1.clone());
    assert!(priv_ip.starts_with("10.20.0."), "{who}: {bound:?}");

    // The plan, then the apply doing exactly it: a join per network.
    let r = w
        .app
        .call("POST", &format!("{PATH}?dryRun=true"), None)
        .await;
    let planned: Vec<String> = r.body["plan"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s["action"].as_str().unwrap(),
                s["network"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        planned,
        [
            format!("join-network {}", private.id),
            format!("join-network {}", public.id)
        ],
        "{who}"
    );
    let m = w.mark();
    let (body, issued, calls) = settle(&w, "POST").await;
    assert_eq!(body["phase"], "converged", "{who}: {body:#}");
    assert_eq!(issued, planned, "{who}: the apply did the dry-run plan");
    let mut want = vec![
        (
            private.id.clone(),
            vec![priv_ip.clone()],
            "Assigned".to_string(),
        ),
        (
            public.id.clone(),
            vec![pub_ip.clone()],
            "Assigned".to_string(),
        ),
    ];
    want.sort();
    assert_eq!(memberships(&w), want, "{who}");
    let posts = w
        .calls_since(m)
        .iter()
        .filter(|c| c.starts_with("POST"))
        .count();
    assert_eq!(
        posts,
        2,
        "{who}: one join per network: {:?}",
        w.calls_since(m)
    );
    // Counted: over the 3 calls, 22 reads (each call: the server, the
    // networks resolved, the server per round; a join looks its network
    // up) and the 2 joins.
    assert_eq!(
        (calls, w.calls_since(m).len()),
        (3, 24),
        "{who}: {:?}",
        w.calls_since(m)
    );

    // Converged: no change made.
    let m = w.mark();
    let (body, issued, _) = settle(&w, "POST").await;
    assert_eq!(
        (body["phase"].as_str(), issued.len()),
        (Some("converged"), 0),
        "{who}"
    );
    // Converged: the server, the two networks resolved (a public one is
    // looked for among the private ones first), the server in the round.
    assert_eq!(
        w.calls_since(m),
        [
            "GET serversServerIdGet",
            "GET privateNetworksNetworkIdGet",
            "GET privateNetworksNetworkIdGet",
            "GET publicNetworksNetworkIdGet",
            "GET serversServerIdGet"
        ],
        "{who}"
    );
    assert!(
        w.calls_since(m).iter().all(|c| c.starts_with("GET")),
        "{who}: {:?}",
        w.calls_since(m)
    );

    // The node's configuration: both networks tagged on bond0.
    let r = w
        .app
        .call(
            "GET",
            "/v1/machines/team-a/m-0/netconfig?format=netplan",
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{who}: {:#}", r.body);
    let text = String::from_utf8_lossy(&r.raw).to_string();
    for (vlan, ip) in [(private.vlan_id, &priv_ip), (public.vlan_id, &pub_ip)] {
        assert!(text.contains(&format!("bond0.{vlan}")), "{who}: {text}");
        assert!(text.contains(ip.as_str()), "{who}: {text}");
    }
    assert_eq!(r.headers["x-metal-ipam-pending"], "0", "{who}");

    // network_data.json needs the ports' MACs, which phoenixNAP does not
    // report: a clear 409, not a guess.
    let r = w
        .app
        .call(
            "GET",
            "/v1/machines/team-a/m-0/netconfig?format=network-data",
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (409, Some("MacUnknown")),
        "{who}: {:#}",
        r.body
    );

    // Edited: the public network dropped → left, its claim deleted.
    set_spec(
        &w,
        json!({"location": LOCATION, "ports": [{"name": "bond0", "vlans": [both()[0].clone()]}]}),
    );
    let (body, issued, _) = settle(&w, "POST").await;
    assert_eq!(body["phase"], "converged", "{who}: {body:#}");
    assert_eq!(issued, [format!("leave-network {}", public.id)], "{who}");
    assert_eq!(memberships(&w).len(), 1, "{who}: {:?}", memberships(&w));
    assert_eq!(
        finish_deletions(&w).await,
        1,
        "{who}: the public address's claim deleted"
    );
    assert_eq!(profile_claims(&w).len(), 1, "{who}");

    // Released: the server leaves the private network, then the claims go.
    let (body, issued, _) = settle(&w, "DELETE").await;
    assert_eq!(
        issued,
        [format!("leave-network {}", private.id)],
        "{who}: {body:#}"
    );
    assert_eq!(body["claimsDeleted"], 1, "{who}: {body:#}");
    assert!(memberships(&w).is_empty(), "{who}: {:?}", memberships(&w));
    assert_eq!(finish_deletions(&w).await, 1, "{who}");
    assert!(profile_claims(&w).is_empty(), "{who}");
    // The server's other networks were never the apply's: untouched
    // (the simulator seeds none), and the pools' networks still exist.
    assert_eq!(w.sim.private_networks().len(), 1, "{who}");
    w.assert_clean();
}

/// The server deleted in phoenixNAP: the poll (its audit log names a
/// change) re-reads the servers with a machine network, finds it gone, and
/// releases the machine's network: its claims deleted, its record
/// forgotten.
async fn the_poll_releases_the_network_of_a_deleted_server(w: World) {
    let w = seeded(w).await;
    let who = w.who();
    w.app.call("POST", PATH, None).await;
    bind_claims(&w).await;
    let (body, _, _) = settle(&w, "POST").await;
    assert_eq!(body["phase"], "converged", "{who}: {body:#}");
    // The first poll sets the cursor (a resync of the known servers).
    let r = w.app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.status, 200, "{who}: {:#}", r.body);
    w.sim.advance(1_000);
    w.sim.delete_server(SERVERS[0]);
    let mut released = 0;
    for _ in 0..5 {
        let r = w.app.call("POST", "/v1/metal/poll", None).await;
        assert_eq!(r.status, 200, "{who}: {:#}", r.body);
        let p = &r.body["phoenixnap"];
        released += p["networkClaimsDeleted"].as_u64().unwrap_or(0);
        if p["more"] != true {
            break;
        }
    }
    assert_eq!(released, 2, "{who}");
    assert_eq!(finish_deletions(&w).await, 2, "{who}");
    assert!(profile_claims(&w).is_empty(), "{who}");
    let store = w.app.store().await;
    let key = format!("net/device/{}", SERVERS[0]);
    assert!(
        store.get(&key).await.unwrap().is_none(),
        "{who}: record forgotten"
    );
    w.assert_clean();
}

/// Port modes, bonds and native VLANs are Metal's: on a phoenixNAP server
/// the apply refuses them naming the field, and changes nothing.
async fn metal_only_fields_are_refused_naming_them(w: World) {
    let w = seeded(w).await;
    let who = w.who();
    for (port, field) in [
        (
            json!({"name": "bond0", "layer2": true}),
            "spec.ports[0].layer2",
        ),
        (
            json!({"name": "eth1", "bonded": false}),
            "spec.ports[0].name",
        ),
        (
            json!({"name": "bond0", "elasticIPs": [{"pool": {"name": "pub"}}]}),
            "spec.ports[0].elasticIPs",
        ),
    ] {
        set_spec(&w, json!({"ports": [port]}));
        let m = w.mark();
        let r = w.app.call("POST", PATH, None).await;
        assert_eq!(r.status, 422, "{who}: {:#}", r.body);
        assert_eq!(r.body["field"], field, "{who}: {:#}", r.body);
        assert!(
            r.body["message"].as_str().unwrap().contains("phoenixNAP"),
            "{who}: {:#}",
            r.body
        );
        assert!(
            w.calls_since(m).iter().all(|c| c.starts_with("GET")),
            "{who}"
        );
    }
    assert!(memberships(&w).is_empty(), "{who}");
    assert!(profile_claims(&w).is_empty(), "{who}");
    w.assert_clean();
}

metal_ipam_tests::on_every_runtime!(
    on_fake: a_profile_puts_a_server_on_two_networks_with_pool_addresses,
    the_poll_releases_the_network_of_a_deleted_server,
    metal_only_fields_are_refused_naming_them,
);

metal_ipam_tests::on_real_kube!(
    on_real: a_profile_puts_a_server_on_two_networks_with_pool_addresses,
    the_poll_releases_the_network_of_a_deleted_server,
    metal_only_fields_are_refused_naming_them,
);
