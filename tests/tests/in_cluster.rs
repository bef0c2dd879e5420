//! The emulation of the in-cluster IPAM provider (`metal_ipam_tests::
//! in_cluster`) against its own code's behaviour: lowest free address, the
//! reserved and gateway addresses, objects as it writes them, idempotent
//! passes, the deletion order, the reuse grace period, pause, prefix and
//! global pools — on FakeKube, and the core of it on the real API server
//! (`KUBEBUILDER_ASSETS`; skipped without it, failing under `CI`).

use metal_ipam_tests::fake_kube::{FakeKube, CLUSTER_GROUP, IPAM_GROUP};
use metal_ipam_tests::in_cluster::{
    bound_claim, claim, ip_address, ip_pool_status, pool, InCluster, PoolKind, Write,
    PROTECT_ADDRESS_FINALIZER, PROTECT_POOL_FINALIZER, RELEASE_ADDRESS_FINALIZER,
};
use metal_ipam_tests::kube::Kube;
use metal_ipam_tests::real_kube::ControlPlane;
use serde_json::{json, Value};

const NS: &str = "default";

async fn fake() -> Kube {
    Kube::Fake(FakeKube::start().await)
}

fn addr_of(kube: &Kube, ns: &str, name: &str) -> Option<String> {
    kube.get(IPAM_GROUP, "ipaddresses", Some(ns), name)
        .map(|a| a["spec"]["address"].as_str().unwrap_or("").to_owned())
}

fn k(name: &str) -> String {
    format!("{NS}/{name}")
}

fn ip_pool(kube: &Kube, name: &str, spec: Value) -> Value {
    kube.create(pool(PoolKind::InClusterIPPool, NS, name, spec))
}

fn claims(kube: &Kube, names: &[&str], pool_name: &str) {
    for n in names {
        kube.create(claim(NS, n, PoolKind::InClusterIPPool, pool_name, None));
    }
}

#[tokio::test]
async fn lowest_free_address_skipping_network_excluded_and_gateway() {
    let kube = fake().await;
    ip_pool(
        &kube,
        "p",
        json!({"addresses": ["10.0.0.0/29"], "prefix": 24, "gateway": "10.0.0.1",
               "excludedAddresses": ["10.0.0.3"]}),
    );
    claims(&kube, &["a1", "a2", "a3", "a4", "a5", "a6"], "p");
    let pass = InCluster::new(&kube).reconcile();
    // .0 is the /24's network address, .1 the gateway, .3 excluded; the
    // /24's broadcast (.255) is outside the pool.
    assert_eq!(
        pass.created(),
        ["10.0.0.2", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7"]
    );
    assert_eq!(pass.skipped, [(k("a6"), "no address available".to_owned())]);
    // The unserved claim still got the finalizer (the patch helper).
    let a6 = kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "a6")
        .unwrap();
    assert_eq!(
        a6["metadata"]["finalizers"],
        json!([RELEASE_ADDRESS_FINALIZER])
    );
    assert!(a6.pointer("/status/addressRef").is_none());

    // A released address is the lowest free one again: in the pass that
    // releases a2's address, a6 (after it in namespace/name order) gets it.
    kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "a2");
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(pass.created(), ["10.0.0.4"]);
    assert_eq!(addr_of(&kube, NS, "a2"), None);
    assert_eq!(addr_of(&kube, NS, "a6").as_deref(), Some("10.0.0.4"));
    claims(&kube, &["a7"], "p");
    let pass = InCluster::new(&kube).settle(3);
    assert_eq!(pass.created(), Vec::<String>::new());
    assert_eq!(pass.skipped, [(k("a7"), "no address available".to_owned())]);
}

#[tokio::test]
async fn network_broadcast_and_gateway_are_never_handed_out() {
    let kube = fake().await;
    // A /30: .0 network, .3 broadcast, .1 gateway: only .2 is left.
    ip_pool(
        &kube,
        "tiny",
        json!({"addresses": ["192.168.7.0/30"], "prefix": 30, "gateway": "192.168.7.1"}),
    );
    claims(&kube, &["c1", "c2"], "tiny");
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(pass.created(), ["192.168.7.2"]);
    assert_eq!(pass.skipped, [(k("c2"), "no address available".to_owned())]);

    // With allocateReservedIPAddresses the network and broadcast addresses
    // are handed out (the gateway still never is).
    ip_pool(
        &kube,
        "all",
        json!({"addresses": ["192.168.8.0/30"], "prefix": 30, "gateway": "192.168.8.1",
               "allocateReservedIPAddresses": true}),
    );
    claims(&kube, &["d1", "d2", "d3", "d4"], "all");
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(
        pass.created(),
        ["192.168.8.0", "192.168.8.2", "192.168.8.3"]
    );

    // IPv6: the subnet's first (anycast) address is reserved, no broadcast.
    ip_pool(
        &kube,
        "v6",
        json!({"addresses": ["fd00:10::/126"], "prefix": 64}),
    );
    claims(&kube, &["e1", "e2", "e3", "e4"], "v6");
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(pass.created(), ["fd00:10::1", "fd00:10::2", "fd00:10::3"]);
}

#[tokio::test]
async fn objects_are_written_as_the_provider_writes_them() {
    let kube = fake().await;
    let p = ip_pool(
        &kube,
        "p",
        json!({"addresses": ["10.1.0.10-10.1.0.20"], "prefix": 24, "gateway": "10.1.0.1"}),
    );
    // The claim names its Cluster by label; without the Cluster the
    // provider would skip it ("cluster not found").
    kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                       "metadata": {"name": "wl1", "namespace": NS}, "spec": {}}),
    );
    let c = kube.create(claim(NS, "m1", PoolKind::InClusterIPPool, "p", Some("wl1")));
    InCluster::new(&kube).reconcile();

    let a = kube.get(IPAM_GROUP, "ipaddresses", Some(NS), "m1").unwrap();
    assert_eq!(a["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
    assert_eq!(
        a["spec"],
        json!({"address": "10.1.0.10", "prefix": 24, "gateway": "10.1.0.1",
               "claimRef": {"name": "m1"},
               "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}})
    );
    assert_eq!(
        a["metadata"]["ownerReferences"],
        json!([
            {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim", "name": "m1",
             "uid": c["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true},
            {"apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool", "name": "p",
             "uid": p["metadata"]["uid"], "controller": false, "blockOwnerDeletion": true},
        ])
    );
    assert_eq!(
        a["metadata"]["finalizers"],
        json!([PROTECT_ADDRESS_FINALIZER])
    );
    assert_eq!(
        a["metadata"]["labels"],
        json!({"cluster.x-k8s.io/cluster-name": "wl1"})
    );
    // The builder gives the same object.
    let built = ip_address(&c, &p, "10.1.0.10", 24, Some("10.1.0.1"));
    for field in [
        "/spec",
        "/metadata/ownerReferences",
        "/metadata/finalizers",
        "/metadata/labels",
    ] {
        assert_eq!(a.pointer(field), built.pointer(field), "{field}");
    }

    let claim_now = kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "m1")
        .unwrap();
    assert_eq!(
        claim_now["metadata"]["finalizers"],
        json!([RELEASE_ADDRESS_FINALIZER])
    );
    // v1.1.x: addressRef only, no conditions.
    assert_eq!(claim_now["status"], json!({"addressRef": {"name": "m1"}}));
    assert_eq!(bound_claim(&c, "m1")["status"], claim_now["status"]);

    let p_now = kube
        .get(IPAM_GROUP, "inclusterippools", Some(NS), "p")
        .unwrap();
    assert_eq!(
        p_now["metadata"]["finalizers"],
        json!([PROTECT_POOL_FINALIZER])
    );
    // 11 addresses, the gateway outside them; one used.
    assert_eq!(p_now["status"], ip_pool_status(11, 1, 10, 0));
}

#[tokio::test]
async fn a_second_pass_writes_nothing() {
    let kube = fake().await;
    ip_pool(
        &kube,
        "p",
        json!({"addresses": ["10.2.0.0/24"], "prefix": 24}),
    );
    claims(&kube, &["x1", "x2", "x3"], "p");
    let first = InCluster::new(&kube).reconcile();
    assert_eq!(first.created(), ["10.2.0.1", "10.2.0.2", "10.2.0.3"]);
    let second = InCluster::new(&kube).reconcile();
    assert_eq!(second, Default::default(), "{second:?}");
    // Also after a deletion has been processed.
    kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "x2");
    assert!(!InCluster::new(&kube).reconcile().writes.is_empty());
    assert_eq!(InCluster::new(&kube).reconcile(), Default::default());
}

#[tokio::test]
async fn deletion_removes_the_address_finalizer_then_the_address_then_the_claim_finalizer() {
    let kube = fake().await;
    ip_pool(
        &kube,
        "p",
        json!({"addresses": ["10.3.0.0/24"], "prefix": 24}),
    );
    claims(&kube, &["d1"], "p");
    InCluster::new(&kube).reconcile();
    kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "d1");
    // Still there: held by the finalizer, and its address by its own.
    assert!(kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "d1")
        .is_some());
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(
        pass.writes,
        [
            Write::AddressFinalizerRemoved { key: k("d1") },
            Write::AddressDeleted { key: k("d1") },
            Write::ClaimFinalizerRemoved { key: k("d1") },
            Write::PoolUpdated {
                kind: PoolKind::InClusterIPPool,
                key: k("p")
            },
        ]
    );
    assert!(kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "d1")
        .is_none());
    assert!(kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "d1")
        .is_none());
    let p = kube
        .get(IPAM_GROUP, "inclusterippools", Some(NS), "p")
        .unwrap();
    assert_eq!(p["status"]["ipAddresses"]["used"], 0);
}

#[tokio::test]
async fn the_reuse_grace_period_holds_the_release() {
    let kube = fake().await;
    ip_pool(
        &kube,
        "p",
        json!({"addresses": ["10.4.0.0/24"], "prefix": 24, "addressReuseGracePeriodSeconds": 600}),
    );
    claims(&kube, &["g1"], "p");
    InCluster::new(&kube).reconcile();
    kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "g1");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let held = InCluster::new(&kube).at(now).reconcile();
    assert!(held.writes.is_empty(), "{held:?}");
    assert_eq!(held.skipped.len(), 1);
    assert!(
        held.skipped[0].1.starts_with("reuse grace period"),
        "{held:?}"
    );
    // A new claim meanwhile does not get the held address.
    claims(&kube, &["g2"], "p");
    InCluster::new(&kube).at(now).reconcile();
    assert_eq!(addr_of(&kube, NS, "g1").as_deref(), Some("10.4.0.1"));
    assert_eq!(addr_of(&kube, NS, "g2").as_deref(), Some("10.4.0.2"));
    // Past deletionTimestamp + 600 s it goes.
    let released = InCluster::new(&kube).at(now + 700).reconcile();
    assert!(
        released
            .writes
            .contains(&Write::AddressDeleted { key: k("g1") }),
        "{released:?}"
    );
    assert!(kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "g1")
        .is_none());
}

#[tokio::test]
async fn pause_is_respected_and_a_missing_cluster_does_not_block_deletion() {
    let kube = fake().await;
    ip_pool(
        &kube,
        "p",
        json!({"addresses": ["10.5.0.0/24"], "prefix": 24}),
    );
    let mut paused = claim(NS, "paused", PoolKind::InClusterIPPool, "p", None);
    paused["metadata"]["annotations"] = json!({"cluster.x-k8s.io/paused": ""});
    kube.create(paused);
    kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                       "metadata": {"name": "wl", "namespace": NS}, "spec": {"paused": true}}),
    );
    kube.create(claim(
        NS,
        "in-paused-cluster",
        PoolKind::InClusterIPPool,
        "p",
        Some("wl"),
    ));
    kube.create(claim(
        NS,
        "no-cluster",
        PoolKind::InClusterIPPool,
        "p",
        Some("gone"),
    ));
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(pass.created(), Vec::<String>::new());
    let mut why: Vec<_> = pass
        .skipped
        .iter()
        .map(|(c, w)| format!("{c}: {w}"))
        .collect();
    why.sort();
    assert_eq!(
        why,
        [
            "default/in-paused-cluster: cluster paused",
            "default/no-cluster: cluster not found",
            "default/paused: claim paused",
        ]
    );
    // Unpaused, the claim is served; its cluster then disappears and the
    // claim's deletion still goes through.
    let mut c = kube.get(CLUSTER_GROUP, "clusters", Some(NS), "wl").unwrap();
    c["spec"]["paused"] = json!(false);
    kube.put(c);
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(pass.created(), ["10.5.0.1"]);
    kube.delete(CLUSTER_GROUP, "clusters", Some(NS), "wl");
    kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "in-paused-cluster");
    InCluster::new(&kube).reconcile();
    assert!(kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "in-paused-cluster")
        .is_none());
    assert_eq!(addr_of(&kube, NS, "in-paused-cluster"), None);
}

#[tokio::test]
async fn prefix_pools_hand_out_the_first_free_aligned_sub_prefix() {
    let kube = fake().await;
    kube.create(pool(
        PoolKind::InClusterPrefixPool,
        NS,
        "pp",
        json!({"prefixes": ["fd00:1::/62"], "allocationPrefixLength": 64,
               "excludedPrefixes": ["fd00:1::/64"], "gateway": "fd00:1::1"}),
    ));
    for n in ["n1", "n2", "n3", "n4"] {
        kube.create(claim(NS, n, PoolKind::InClusterPrefixPool, "pp", None));
    }
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(
        pass.created(),
        ["fd00:1:0:1::", "fd00:1:0:2::", "fd00:1:0:3::"]
    );
    assert_eq!(pass.skipped, [(k("n4"), "no address available".to_owned())]);
    let a = kube.get(IPAM_GROUP, "ipaddresses", Some(NS), "n1").unwrap();
    assert_eq!(a["spec"]["prefix"], 64);
    // The gateway is carried, never blocks.
    assert_eq!(a["spec"]["gateway"], "fd00:1::1");
    let p = kube
        .get(IPAM_GROUP, "inclusterprefixpools", Some(NS), "pp")
        .unwrap();
    assert_eq!(p["status"], ip_pool_status(3, 3, 0, 0));
}

#[tokio::test]
async fn a_global_pool_is_shared_across_namespaces() {
    let kube = fake().await;
    kube.create(pool(
        PoolKind::GlobalInClusterIPPool,
        "",
        "g",
        json!({"addresses": ["10.6.0.10-10.6.0.19"], "prefix": 24}),
    ));
    kube.create(claim(
        "ns-a",
        "m",
        PoolKind::GlobalInClusterIPPool,
        "g",
        None,
    ));
    kube.create(claim(
        "ns-b",
        "m",
        PoolKind::GlobalInClusterIPPool,
        "g",
        None,
    ));
    let pass = InCluster::new(&kube).reconcile();
    assert_eq!(pass.created(), ["10.6.0.10", "10.6.0.11"]);
    let p = kube
        .get(IPAM_GROUP, "globalinclusterippools", None, "g")
        .unwrap();
    assert_eq!(p["status"], ip_pool_status(10, 2, 8, 0));
    assert!(p["metadata"].get("namespace").is_none());
    // Kinds not emulated are left alone.
    kube.create(claim(
        "ns-c",
        "m",
        PoolKind::GlobalInClusterIPPool,
        "g",
        None,
    ));
    let pass = InCluster::new(&kube)
        .kinds(&[PoolKind::InClusterIPPool])
        .reconcile();
    assert_eq!(pass, Default::default());
}

#[tokio::test(flavor = "multi_thread")]
async fn on_the_real_api_server() {
    let Some(cp) = ControlPlane::get() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "KUBEBUILDER_ASSETS is required in CI"
        );
        eprintln!("KUBEBUILDER_ASSETS not set: skipping the real API server run");
        return;
    };
    tokio::task::block_in_place(|| {
        let kube = Kube::Real(cp.session());
        ip_pool(
            &kube,
            "p",
            json!({"addresses": ["10.7.0.0/29"], "prefix": 29, "gateway": "10.7.0.1"}),
        );
        claims(&kube, &["r1", "r2"], "p");
        let first = InCluster::new(&kube).reconcile();
        assert_eq!(first.created(), ["10.7.0.2", "10.7.0.3"]);
        assert_eq!(InCluster::new(&kube).reconcile(), Default::default());
        let p = kube
            .get(IPAM_GROUP, "inclusterippools", Some(NS), "p")
            .unwrap();
        assert_eq!(p["status"], ip_pool_status(7, 2, 5, 0));
        kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "r1");
        let pass = InCluster::new(&kube).reconcile();
        assert_eq!(
            pass.writes[..3],
            [
                Write::AddressFinalizerRemoved { key: k("r1") },
                Write::AddressDeleted { key: k("r1") },
                Write::ClaimFinalizerRemoved { key: k("r1") },
            ]
        );
        assert!(kube
            .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "r1")
            .is_none());
        assert_eq!(addr_of(&kube, NS, "r1"), None);
        assert_eq!(addr_of(&kube, NS, "r2").as_deref(), Some("10.7.0.3"));
    });
}
