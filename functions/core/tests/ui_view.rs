//! The browser view's data (`observe::view`) on the in-memory store:
//! overview counts, a pool's holders, free ranges and cooling addresses,
//! the machines of the summary, search by address, claim and machine,
//! and bad queries.

use std::collections::BTreeMap;

use metal_ipam_core::http::api::ApiResponse;
use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::observe::summary::{self, MachineRow, PortRow, Summary, SUMMARY_VERSION};
use metal_ipam_core::observe::view;
use metal_ipam_core::testing::{allocate, claims, pools, Backend, RouteFn, World};
use serde_json::{json, Value};

const TOKEN: &str = "t0ken-for-tests";

type Handler = RouteFn;

/// The calls the tests make: routes, and pools and claims put through them.
trait Calls {
    /// The world the calls run in.
    fn base(&self) -> &World;

    fn call(&self, h: Handler, method: &str, path: &str, body: Option<Value>) -> ApiResponse {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let auth = format!("Bearer {TOKEN}");
        let r = self
            .base()
            .request((h, TOKEN), (method, path), Some(&auth), &bytes);
        assert!(r.status < 300, "{method} {path}: {} {:?}", r.status, r.body);
        r
    }

    fn pool(&self, ns: &str, name: &str, addresses: &[&str], grace: u32) {
        self.call(
            pools,
            "PUT",
            &format!("/v1/pools/{ns}/{name}"),
            Some(
                json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"addresses": addresses, "prefix": 24, "gateway": "10.20.0.1",
                         "addressReuseGracePeriodSeconds": grace}}),
            ),
        );
    }

    fn claim(&self, ns: &str, name: &str, pool: &str, kind: &str, cluster: &str) -> String {
        let r = self.call(
            allocate,
            "POST",
            "/v1/claims",
            Some(json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
                "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
                "spec": {"clusterName": cluster,
                         "poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": kind, "name": pool}}})),
        );
        r.body.unwrap()["spec"]["address"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

impl Calls for World {
    fn base(&self) -> &World {
        self
    }
}

/// team-a/nodes: 10.20.0.10-19 (10), three claims, one released into a
/// 600 s grace period; global edge: 10.30.0.1-4, one claim from team-b;
/// the summary has one machine holding 10.20.0.11.
fn seeded() -> World {
    let w = World::new(Backend::SpinSqlite, 1_000);
    w.pool("team-a", "nodes", &["10.20.0.10-10.20.0.19"], 600);
    w.call(
        pools,
        "PUT",
        "/v1/global-pools/edge",
        Some(
            json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
            "metadata": {"name": "edge"},
            "spec": {"addresses": ["10.30.0.1-10.30.0.4"], "prefix": 24}}),
        ),
    );
    assert_eq!(
        w.claim("team-a", "cp-0", "nodes", "MetalIPPool", "prod"),
        "10.20.0.10"
    );
    assert_eq!(
        w.claim("team-a", "cp-1", "nodes", "MetalIPPool", "prod"),
        "10.20.0.11"
    );
    assert_eq!(
        w.claim("team-a", "gone", "nodes", "MetalIPPool", "prod"),
        "10.20.0.12"
    );
    w.call(claims, "DELETE", "/v1/claims/team-a/gone", None);
    assert_eq!(
        w.claim("team-b", "lb-0", "edge", "GlobalMetalIPPool", "edge-1"),
        "10.30.0.1"
    );
    summary::write(
        &w.kv,
        &Summary {
            v: SUMMARY_VERSION,
            at: 900,
            machines: vec![MachineRow {
                namespace: "team-a".into(),
                name: "worker-7".into(),
                cluster: Some("prod".into()),
                profile: Some("hybrid".into()),
                device: Some("dev-1".into()),
                phase: "converged".into(),
                ports: vec![PortRow {
                    port: "bond0".into(),
                    mode: "hybrid".into(),
                    vlans: vec!["1001".into()],
                }],
                addresses: BTreeMap::from([("1001".into(), "10.20.0.11/24".into())]),
                error: None,
            }],
            ..Summary::default()
        },
    )
    .unwrap();
    w
}

#[test]
fn overview_lists_every_pool_with_its_counts() {
    let w = seeded();
    let o = view::overview(&w.ctx()).unwrap();
    let pools = o["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2, "{o:#}");
    let nodes = pools.iter().find(|p| p["id"] == "team-a/nodes").unwrap();
    assert_eq!(
        (&nodes["kind"], &nodes["family"], &nodes["vrfBacked"]),
        (&json!("MetalIPPool"), &json!("IPv4"), &json!(false))
    );
    assert_eq!(
        (
            nodes["total"].as_u64(),
            nodes["used"].as_u64(),
            nodes["free"].as_u64(),
            nodes["cooling"].as_u64()
        ),
        (Some(10), Some(2), Some(7), Some(1))
    );
    assert_eq!(nodes["utilisation"], json!(20.0));
    let edge = pools.iter().find(|p| p["id"] == "edge").unwrap();
    assert_eq!(
        (
            edge["namespace"].clone(),
            edge["used"].as_u64(),
            edge["total"].as_u64()
        ),
        (Value::Null, Some(1), Some(4))
    );
    assert_eq!(edge["kind"], "GlobalMetalIPPool");
    assert_eq!(o["reconcile"]["at"], 900);
    assert_eq!(o["reconcile"]["machines"], 1);
    assert_eq!(o["poll"], Value::Null, "no poll yet");
}

#[test]
fn overview_of_an_empty_store() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let o = view::overview(&w.ctx()).unwrap();
    assert_eq!(
        (o["pools"].clone(), o["reconcile"].clone()),
        (json!([]), Value::Null)
    );
    let m = view::machines(&w.ctx()).unwrap();
    assert_eq!(
        m,
        json!({"asOf": null, "machines": [], "omitted": 0}),
        "no reconcile run yet"
    );
}

#[test]
fn pool_detail_shows_holders_free_ranges_and_cooling() {
    let w = seeded();
    let d = view::pool(&w.ctx(), &PoolId::namespaced("team-a", "nodes"))
        .unwrap()
        .unwrap();
    let rows = d["addresses"].as_array().unwrap();
    let row = |a: &str| {
        rows.iter()
            .find(|r| r["address"] == a)
            .unwrap_or_else(|| panic!("{a} in {d:#}"))
    };
    assert_eq!(rows.len(), 3, "two bound, one cooling: {d:#}");
    assert_eq!(row("10.20.0.10")["state"], "bound");
    assert_eq!(row("10.20.0.10")["claim"], "team-a/cp-0");
    assert_eq!(row("10.20.0.10")["ipAddress"], "team-a/cp-0");
    assert_eq!(row("10.20.0.10")["cluster"], "prod");
    assert_eq!(
        row("10.20.0.10")["machine"],
        Value::Null,
        "a plain claim's machine is not stored"
    );
    assert_eq!(
        row("10.20.0.11")["machine"],
        "team-a/worker-7",
        "known from the summary"
    );
    assert_eq!(row("10.20.0.12")["state"], "cooling");
    assert_eq!(row("10.20.0.12")["claim"], Value::Null);
    assert_eq!(row("10.20.0.12")["until"], 1_600);
    assert_eq!(d["free"], json!(["10.20.0.13-10.20.0.19"]));
    assert_eq!(
        d["cooling"],
        json!([{"address": "10.20.0.12", "until": 1_600}])
    );
    assert_eq!(d["metal"], Value::Null, "not VRF-backed");
    assert_eq!(d["pool"]["used"], 2);
    assert_eq!(d["spec"]["gateway"], "10.20.0.1");

    let g = view::pool(&w.ctx(), &PoolId::global("edge"))
        .unwrap()
        .unwrap();
    assert_eq!(
        g["addresses"][0]["claim"], "team-b/lb-0",
        "a global pool's holders from every namespace"
    );
    assert_eq!(g["free"], json!(["10.30.0.2-10.30.0.4"]));
    assert!(view::pool(&w.ctx(), &PoolId::namespaced("team-a", "none"))
        .unwrap()
        .is_none());
}

#[test]
fn search_by_address_claim_and_machine() {
    let w = seeded();
    let s = view::search(&w.ctx(), "q=10.20.0.10").unwrap();
    let r = s["results"].as_array().unwrap();
    assert_eq!(r.len(), 1, "{s:#}");
    assert_eq!(
        (&r[0]["type"], &r[0]["pool"], &r[0]["state"], &r[0]["claim"]),
        (
            &json!("address"),
            &json!("team-a/nodes"),
            &json!("bound"),
            &json!("team-a/cp-0")
        )
    );
    let s = view::search(&w.ctx(), "q=10.20.0.12").unwrap();
    assert_eq!(
        (
            s["results"][0]["state"].clone(),
            s["results"][0]["until"].clone()
        ),
        (json!("cooling"), json!(1_600))
    );
    let s = view::search(&w.ctx(), "q=10.20.0.15").unwrap();
    assert_eq!(s["results"][0]["state"], "free");
    let s = view::search(&w.ctx(), "q=10.99.0.1").unwrap();
    assert_eq!(s["results"], json!([]), "in no pool");

    // 10.20.0.11: the address in its pool, and the machine that has it.
    let s = view::search(&w.ctx(), "q=10.20.0.11").unwrap();
    let types: Vec<&str> = s["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["address", "machine"], "{s:#}");
    assert_eq!(s["results"][0]["machine"], "team-a/worker-7");

    // A claim by its full name (case-insensitive): one read of its
    // binding. Claims are not listed, so a part of a name finds none.
    let s = view::search(&w.ctx(), "q=Team-A%2FCP-1").unwrap();
    let claims: Vec<&str> = s["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["claim"].as_str().unwrap())
        .collect();
    assert_eq!(claims, ["team-a/cp-1"], "{s:#}");
    assert_eq!(s["results"][0]["pool"], "team-a/nodes");
    assert_eq!(s["results"][0]["address"], "10.20.0.11");
    assert_eq!(s["results"][0]["machine"], "team-a/worker-7");
    let s = view::search(&w.ctx(), "q=team-b/lb-0").unwrap();
    assert_eq!(s["results"][0]["pool"], "edge");
    assert_eq!(s["results"][0]["cluster"], "edge-1");
    for q in ["q=CP-", "q=team-a/gone", "q=team-a/none"] {
        let s = view::search(&w.ctx(), q).unwrap();
        assert_eq!(s["results"], json!([]), "{q}: {s:#}");
    }

    let s = view::search(&w.ctx(), "q=worker").unwrap();
    assert_eq!(s["results"][0]["type"], "machine");
    assert_eq!(s["results"][0]["machine"], "team-a/worker-7");
    assert_eq!(s["query"], "worker");
}

#[test]
fn search_results_are_bounded() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let machines = (0..view::MAX_RESULTS + 5)
        .map(|i| MachineRow {
            namespace: "ns".into(),
            name: format!("worker-{i}"),
            cluster: None,
            profile: None,
            device: None,
            phase: "converged".into(),
            ports: Vec::new(),
            addresses: BTreeMap::new(),
            error: None,
        })
        .collect();
    summary::write(
        &w.kv,
        &Summary {
            v: SUMMARY_VERSION,
            at: 900,
            machines,
            ..Summary::default()
        },
    )
    .unwrap();
    let s = view::search(&w.ctx(), "q=worker-").unwrap();
    assert_eq!(s["results"].as_array().unwrap().len(), view::MAX_RESULTS);
    assert_eq!(s["truncated"], true);
}

#[test]
fn bad_queries_are_422() {
    let w = seeded();
    let long = format!("q={}", "a".repeat(view::MAX_QUERY + 1));
    for q in ["", "q=", "x=1", "q=%20%20", "q=%C3%28", long.as_str()] {
        let e = view::search(&w.ctx(), q).unwrap_err();
        assert_eq!(e.status(), 422, "{q:?}: {e:?}");
    }
    assert!(view::search(&w.ctx(), &format!("q={}", "a".repeat(view::MAX_QUERY))).is_ok());
}

/// A prefix pool in the view: its id is marked `+` (the page picks the
/// prefix routes by it), its rows and free ranges are sub-prefixes
/// (`net/len`), and searching any address inside a bound sub-prefix finds
/// its holder.
#[test]
fn a_prefix_pool_shows_sub_prefixes_and_is_found_by_an_inner_address() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    w.call(
        pools,
        "PUT",
        "/v1/prefix-pools/team-a/pods",
        Some(
            json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalPrefixPool",
            "metadata": {"name": "pods", "namespace": "team-a"},
            "spec": {"prefixes": ["fd00:7::/61"]}}),
        ),
    );
    let mut c = json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": "n-0", "namespace": "team-a", "uid": "u0"},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalPrefixPool", "name": "pods"}}});
    w.call(allocate, "POST", "/v1/claims", Some(c.clone()));
    c["metadata"]["name"] = json!("n-1");
    w.call(allocate, "POST", "/v1/claims", Some(c));
    let o = view::overview(&w.ctx()).unwrap();
    let row = &o["pools"][0];
    assert_eq!(
        (row["id"].clone(), row["kind"].clone()),
        (json!("+team-a/pods"), json!("MetalPrefixPool"))
    );
    assert_eq!(
        (row["total"].clone(), row["used"].clone()),
        (json!(8), json!(2))
    );
    let id = PoolId::of(
        metal_ipam_core::ipam::pool::PoolKind::NamespacedPrefix,
        "team-a",
        "pods",
    );
    let d = view::pool(&w.ctx(), &id).unwrap().unwrap();
    assert_eq!(d["addresses"][1]["address"], "fd00:7:0:1::/64");
    assert_eq!(d["addresses"][1]["claim"], "team-a/n-1");
    assert_eq!(d["free"], json!(["fd00:7:0:2::/64-fd00:7:0:7::/64"]));
    let found = view::search(&w.ctx(), "q=fd00:7:0:1::abcd").unwrap();
    let hit = found["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["type"] == "address")
        .unwrap_or_else(|| panic!("{found:#}"))
        .clone();
    assert_eq!(
        (hit["claim"].clone(), hit["pool"].clone()),
        (json!("team-a/n-1"), json!("+team-a/pods"))
    );
}
