//! The CAPI IPAM contract end to end: the real components on the test host,
//! events in, and a fake Kubernetes API server (schema-validating every
//! write against CAPI's and our CRDs, with resourceVersion conflicts,
//! finalizers, the status subresource and pagination) on the other side.

use metal_ipam_tests::fake_kube::{FakeKube, Recorded, IPAM_GROUP, METAL_GROUP};
use metal_ipam_tests::harness::{App, Resp, Runtime, TOKEN};
use metal_ipam_tests::in_cluster::{self, PoolKind as InClusterKind};
use metal_ipam_tests::kube::Kube;
use metal_ipam_tests::real_kube::ControlPlane;
use metal_ipam_tests::real_spin::SpinBin;
use serde_json::{json, Value};

const EVENTS_TOKEN: &str = "events-token-for-tests";
const CLAIM_FINALIZER: &str = "ipam.metal-ipam.dev/release-address";
const ADDRESS_FINALIZER: &str = "ipam.metal-ipam.dev/protect-address";
const POOL_FINALIZER: &str = "ipam.metal-ipam.dev/protect-pool";

struct World {
    kube: Kube,
    app: App,
    runtime: Runtime,
}

impl World {
    /// The test host and FakeKube.
    async fn new() -> World {
        let kube = Kube::Fake(FakeKube::start().await);
        let app = app_on(Runtime::Host, &kube).await.expect("the host");
        World {
            kube,
            app,
            runtime: Runtime::Host,
        }
    }

    /// The test host and FakeKube, or real Spin (`SPIN_BIN`) on `runtime`'s
    /// store and the real API server (`KUBEBUILDER_ASSETS`): `None` when
    /// either was not given.
    async fn on(runtime: Runtime) -> Option<World> {
        if runtime == Runtime::Host {
            return Some(World::new().await);
        }
        SpinBin::from_env()?;
        let cp = ControlPlane::get()?;
        let kube = Kube::Real(tokio::task::block_in_place(|| cp.session()));
        let app = app_on(runtime, &kube).await?;
        Some(World { kube, app, runtime })
    }

    /// Another instance of the application on the same API server with an
    /// empty store of its own (a lost store, a new replica).
    async fn fresh_app(&self) -> App {
        app_on(self.runtime, &self.kube)
            .await
            .expect("started before")
    }

    async fn event(&self, ev: Value) -> Resp {
        self.app.call("POST", "/v1/events", Some(&ev)).await
    }

    /// A plain watch event for the object as currently stored.
    async fn touch(&self, plural: &str, ns: Option<&str>, name: &str) -> Resp {
        let group = if plural.contains("metal") {
            METAL_GROUP
        } else {
            IPAM_GROUP
        };
        let obj = self
            .kube
            .get(group, plural, ns, name)
            .expect("object exists");
        self.event(json!({"type": "MODIFIED", "object": obj})).await
    }

    async fn reconcile(&self) -> Resp {
        self.app.call("POST", "/v1/reconcile", None).await
    }

    fn claim(&self, ns: &str, name: &str) -> Option<Value> {
        self.kube.get(IPAM_GROUP, "ipaddressclaims", Some(ns), name)
    }

    fn address(&self, ns: &str, name: &str) -> Option<Value> {
        self.kube.get(IPAM_GROUP, "ipaddresses", Some(ns), name)
    }

    fn assert_schema_clean(&self) {
        assert_eq!(
            self.kube.schema_violations(),
            Vec::<String>::new(),
            "every write validates against the CRDs"
        );
        assert_eq!(
            self.kube.forbidden(),
            Vec::<String>::new(),
            "every request is allowed by deploy/rbac.yaml"
        );
    }
}

async fn app_on(runtime: Runtime, kube: &Kube) -> Option<App> {
    let vars = [
        ("k8s_api_url", kube.base_url()),
        ("k8s_token", kube.token().to_string()),
        ("events_token", EVENTS_TOKEN.to_string()),
    ];
    App::on(runtime, &vars, &kube.client_tls()).await
}

fn pool(ns: &str, name: &str, addresses: &[&str]) -> Value {
    json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"addresses": addresses, "prefix": 24, "gateway": "10.9.0.1"}})
}

fn claim(ns: &str, name: &str, pool: &str) -> Value {
    json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
           "metadata": {"name": name, "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
           "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": pool}}})
}

fn cluster(ns: &str, name: &str, paused: bool) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
           "metadata": {"name": name, "namespace": ns}, "spec": {"paused": paused}})
}

fn ready(o: &Value) -> (String, String) {
    let c = o["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or(Value::Null);
    (
        c["status"].as_str().unwrap_or("").to_string(),
        c["reason"].as_str().unwrap_or("").to_string(),
    )
}

fn finalizers(o: &Value) -> Vec<String> {
    o["metadata"]["finalizers"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// Creates the pool and a claim in the fake API and delivers both events.
async fn setup(w: &World, addresses: &[&str]) {
    w.kube.create(cluster("team-a", "c1", false));
    let p = w.kube.create(pool("team-a", "nodes", addresses));
    let r = w.event(json!({"type": "ADDED", "object": p})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["stepResult"]["result"], "synced", "{}", r.body);
}

async fn a_claim_event_binds_an_address_by_the_contract(w: World) {
    setup(&w, &["10.9.0.30-10.9.0.40", "10.9.0.20-10.9.0.29"]).await;
    let pool_obj = w
        .kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "nodes")
        .unwrap();
    assert!(finalizers(&pool_obj).contains(&POOL_FINALIZER.to_string()));
    assert_eq!(pool_obj["status"]["ipAddresses"]["total"], 21);
    assert_eq!(ready(&pool_obj).0, "True");

    let c = w.kube.create(claim("team-a", "m-0", "nodes"));
    w.kube.clear_requests();
    let r = w.event(json!({"type": "ADDED", "object": c})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["step"], "allocate");
    assert_eq!(r.body["stepResult"]["result"], "bound", "{}", r.body);

    // Writes in the contract's order: finalizer, IPAddress, status.
    let writes: Vec<String> = w.kube.writes().iter().map(Recorded::line).collect();
    assert_eq!(
        writes,
        [
            "PATCH /apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/team-a/ipaddressclaims/m-0",
            "POST /apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/team-a/ipaddresses",
            "PATCH /apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/team-a/ipaddressclaims/m-0/status",
        ]
    );
    let claim_obj = w.claim("team-a", "m-0").unwrap();
    assert_eq!(finalizers(&claim_obj), [CLAIM_FINALIZER]);
    assert_eq!(claim_obj["status"]["addressRef"]["name"], "m-0");
    assert_eq!(
        ready(&claim_obj),
        ("True".into(), "AddressAllocated".into())
    );
    assert_eq!(
        claim_obj["status"]["deprecated"]["v1beta1"]["conditions"][0]["status"],
        "True"
    );

    let ip = w.address("team-a", "m-0").unwrap();
    assert_eq!(
        ip["spec"]["address"], "10.9.0.20",
        "lowest address whatever the order of addresses"
    );
    assert_eq!(ip["spec"]["prefix"], 24);
    assert_eq!(ip["spec"]["gateway"], "10.9.0.1");
    assert_eq!(ip["spec"]["poolRef"], claim_obj["spec"]["poolRef"]);
    assert_eq!(ip["spec"]["claimRef"]["name"], "m-0");
    assert_eq!(finalizers(&ip), [ADDRESS_FINALIZER]);
    assert_eq!(
        ip["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"],
        "c1"
    );
    let owners = ip["metadata"]["ownerReferences"].as_array().unwrap();
    let claim_ref = owners
        .iter()
        .find(|o| o["kind"] == "IPAddressClaim")
        .unwrap();
    assert_eq!(
        (
            claim_ref["uid"].clone(),
            claim_ref["controller"].clone(),
            claim_ref["blockOwnerDeletion"].clone()
        ),
        (
            claim_obj["metadata"]["uid"].clone(),
            json!(true),
            json!(true)
        )
    );
    let pool_ref = owners.iter().find(|o| o["kind"] == "MetalIPPool").unwrap();
    assert_eq!(
        (
            pool_ref["uid"].clone(),
            pool_ref["controller"].clone(),
            pool_ref["blockOwnerDeletion"].clone()
        ),
        (
            pool_obj["metadata"]["uid"].clone(),
            json!(false),
            json!(true)
        )
    );

    // The same event again, and a stale copy of it: no write at all.
    w.kube.clear_requests();
    w.event(json!({"type": "ADDED", "object": c})).await;
    w.event(json!({"type": "MODIFIED", "object": c})).await;
    assert!(
        w.kube.writes().is_empty(),
        "idempotent: {:?}",
        w.kube.writes()
    );
    w.assert_schema_clean();
}

async fn every_event_format_is_understood(w: World) {
    setup(&w, &["10.9.0.10-10.9.0.19"]).await;
    let c1 = w.kube.create(claim("team-a", "binary", "nodes"));
    let c2 = w.kube.create(claim("team-a", "structured", "nodes"));
    // Only a reference reaches the sink in Reference mode; the object is in the API.
    w.kube.create(claim("team-a", "reference", "nodes"));
    let c4 = w.kube.create(claim("team-a", "argo", "nodes"));
    // Knative binary mode, authenticated by the ce extension (no header).
    let req = http::Request::builder()
        .method("POST")
        .uri("/v1/events")
        .header("content-type", "application/json")
        .header("ce-specversion", "1.0")
        .header("ce-type", "dev.knative.apiserver.resource.add")
        .header("ce-id", "e1")
        .header("ce-source", "https://10.96.0.1:443")
        .header("ce-metalipamtoken", EVENTS_TOKEN)
        .body(serde_json::to_vec(&c1).unwrap())
        .unwrap();
    let r = w.app.send(req).await;
    assert_eq!(
        (r.status, r.body["stepResult"]["result"].as_str()),
        (200, Some("bound")),
        "{}",
        r.body
    );
    assert!(
        !r.headers.keys().any(|k| k.as_str().starts_with("ce-")),
        "no reply event"
    );
    // Structured mode with the events token as a bearer token.
    let structured = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.update", "id": "e2",
        "source": "https://10.96.0.1:443", "datacontenttype": "application/json", "data": c2});
    let req = http::Request::builder()
        .method("POST")
        .uri("/v1/events")
        .header("content-type", "application/cloudevents+json")
        .header("authorization", format!("Bearer {EVENTS_TOKEN}"))
        .body(serde_json::to_vec(&structured).unwrap())
        .unwrap();
    let r = w.app.send(req).await;
    assert_eq!(
        (r.status, r.body["stepResult"]["result"].as_str()),
        (200, Some("bound")),
        "{}",
        r.body
    );
    // Reference mode: only a reference; the step fetches the object.
    let reference = json!({"specversion": "1.0", "type": "dev.knative.apiserver.ref.add", "id": "e3",
        "source": "https://10.96.0.1:443", "data": {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim", "name": "reference", "namespace": "team-a"}});
    let r = w.app.call("POST", "/v1/events", Some(&reference)).await;
    assert_eq!(
        (r.status, r.body["stepResult"]["result"].as_str()),
        (200, Some("bound")),
        "{}",
        r.body
    );
    // Argo Events resource payload.
    let r = w
        .event(
            json!({"type": "ADD", "body": c4, "oldBody": null, "group": "ipam.cluster.x-k8s.io",
        "version": "v1beta2", "resource": "ipaddressclaims"}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["stepResult"]["result"].as_str()),
        (200, Some("bound")),
        "{}",
        r.body
    );
    for n in ["binary", "structured", "reference", "argo"] {
        assert!(w.address("team-a", n).is_some(), "{n} got its IPAddress");
    }
    // A v1beta1 view of a claim (as a v1beta1 watch would send it): the step
    // reads the claim at v1beta2 from the API server, which converts.
    w.kube.create(claim("team-a", "old-api", "nodes"));
    let r = w
        .event(
            json!({"type": "ADDED", "object": {"apiVersion": "ipam.cluster.x-k8s.io/v1beta1",
            "kind": "IPAddressClaim", "metadata": {"name": "old-api", "namespace": "team-a"},
            "spec": {"poolRef": {"kind": "MetalIPPool", "name": "nodes"}}}}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["stepResult"]["result"].as_str()),
        (200, Some("bound")),
        "{}",
        r.body
    );
    assert_eq!(
        w.address("team-a", "old-api").unwrap()["apiVersion"],
        "ipam.cluster.x-k8s.io/v1beta2"
    );
    // Unknown kinds and types are acknowledged and ignored; malformed is 400.
    let r = w.event(json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "y"}}})).await;
    assert_eq!(
        (r.status, r.body["result"].as_str()),
        (200, Some("ignored"))
    );
    let r = w.event(json!({"type": "BOOKMARK", "object": {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim", "metadata": {"resourceVersion": "5"}}})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let bad = http::Request::builder()
        .method("POST")
        .uri("/v1/events")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(b"{not json".to_vec())
        .unwrap();
    assert_eq!(w.app.send(bad).await.status, 400);
    // Wrong token, by header or extension: 401 and nothing forwarded.
    let wrong = http::Request::builder()
        .method("POST")
        .uri("/v1/events")
        .header("ce-specversion", "1.0")
        .header("ce-type", "dev.knative.apiserver.resource.add")
        .header("ce-id", "e9")
        .header("ce-source", "s")
        .header("ce-metalipamtoken", "nope")
        .body(serde_json::to_vec(&c1).unwrap())
        .unwrap();
    assert_eq!(w.app.send(wrong).await.status, 401);
    w.assert_schema_clean();
}

async fn exhaustion_then_release_lets_the_waiting_claim_progress(w: World) {
    setup(&w, &["10.9.0.50-10.9.0.51"]).await;
    for n in ["a", "b", "c"] {
        let c = w.kube.create(claim("team-a", n, "nodes"));
        w.event(json!({"type": "ADDED", "object": c})).await;
    }
    let waiting = w.claim("team-a", "c").unwrap();
    assert_eq!(ready(&waiting), ("False".into(), "PoolExhausted".into()));
    assert!(waiting["status"].get("addressRef").is_none());
    assert!(w.address("team-a", "c").is_none());
    // A full reconcile sees it waiting, and the metrics say so (from the
    // observation summary the run wrote).
    let r = w.reconcile().await;
    assert_eq!(r.status, 200, "{}", r.text());
    let text = w.app.call("GET", "/v1/metrics", None).await.text();
    let waiting_series = text
        .lines()
        .find(|l| {
            l.starts_with("metal_ipam_pool_claims_waiting{")
                && l.contains("namespace=\"team-a\"")
                && l.contains("name=\"nodes\"")
                && l.contains("reason=\"PoolExhausted\"")
        })
        .unwrap_or_else(|| panic!("no waiting claims in:\n{text}"));
    assert!(waiting_series.ends_with(" 1"), "{waiting_series}");
    assert!(
        text.contains("\nmetal_ipam_reconcile_last_run_timestamp_seconds "),
        "{text}"
    );
    // Delete claim a: the deletion event releases it and removes both finalizers.
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some("team-a"), "a");
    w.kube.clear_requests();
    let r = w.touch("ipaddressclaims", Some("team-a"), "a").await;
    assert_eq!(r.body["step"], "release", "{}", r.body);
    // The contract's deletion order: the IPAddress's finalizer, the
    // IPAddress, then the claim's finalizer (the address was released in the
    // store before any of these).
    let writes: Vec<String> = w.kube.writes().iter().map(Recorded::line).collect();
    assert_eq!(
        writes,
        [
            "PATCH /apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/team-a/ipaddresses/a",
            "DELETE /apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/team-a/ipaddresses/a",
            "PATCH /apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/team-a/ipaddressclaims/a",
        ]
    );
    assert!(
        w.claim("team-a", "a").is_none(),
        "claim finalizer removed, claim gone"
    );
    assert!(w.address("team-a", "a").is_none(), "IPAddress deleted");
    // The next event (or reconcile) for c binds the freed address.
    w.touch("ipaddressclaims", Some("team-a"), "c").await;
    assert_eq!(
        w.address("team-a", "c").unwrap()["spec"]["address"],
        "10.9.0.50"
    );
    assert_eq!(ready(&w.claim("team-a", "c").unwrap()).0, "True");
    w.assert_schema_clean();
}

async fn paused_cluster_or_pool_means_no_writes(w: World) {
    setup(&w, &["10.9.0.60-10.9.0.69"]).await;
    w.kube.create(cluster("team-a", "frozen", true));
    let mut c = claim("team-a", "p-0", "nodes");
    c["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!("frozen");
    let c = w.kube.create(c);
    w.kube.clear_requests();
    let r = w.event(json!({"type": "ADDED", "object": c})).await;
    assert_eq!(r.body["stepResult"]["result"], "paused", "{}", r.body);
    assert!(w.kube.writes().is_empty());
    // Paused pool (annotation), synced into the store by its event.
    let mut p = w
        .kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "nodes")
        .unwrap();
    w.event(json!({"type": "MODIFIED", "object": p.clone()}))
        .await;
    p["metadata"]["annotations"] = json!({"cluster.x-k8s.io/paused": ""});
    let p = w.kube.put(p);
    w.event(json!({"type": "MODIFIED", "object": p})).await;
    let c2 = w.kube.create(claim("team-a", "p-1", "nodes"));
    w.kube.clear_requests();
    let r = w.event(json!({"type": "ADDED", "object": c2})).await;
    assert_eq!(r.body["stepResult"]["result"], "paused", "{}", r.body);
    assert!(w.kube.writes().is_empty(), "{:?}", w.kube.writes());
    // A live claim whose Cluster does not exist waits, without writes.
    let mut c3 = claim("team-a", "p-2", "nodes");
    c3["spec"]["clusterName"] = json!("ghost");
    let c3 = w.kube.create(c3);
    w.kube.clear_requests();
    let r = w.event(json!({"type": "ADDED", "object": c3})).await;
    assert_eq!(r.body["stepResult"]["result"], "waiting", "{}", r.body);
    assert!(w.kube.writes().is_empty());
}

async fn an_existing_address_gets_its_metadata_and_a_deleted_one_comes_back(w: World) {
    setup(&w, &["10.9.0.70-10.9.0.79"]).await;
    let c = w.kube.create(claim("team-a", "m", "nodes"));
    w.event(json!({"type": "ADDED", "object": c})).await;
    let before = w.address("team-a", "m").unwrap();
    // Strip finalizers, owner references and labels (someone edited it).
    let mut stripped = before.clone();
    stripped["metadata"]["finalizers"] = json!([]);
    stripped["metadata"]["ownerReferences"] = json!([]);
    stripped["metadata"]["labels"] = json!({});
    w.kube.put(stripped);
    let r = w.touch("ipaddresses", Some("team-a"), "m").await;
    assert_eq!(r.body["step"], "allocate", "{}", r.body);
    let fixed = w.address("team-a", "m").unwrap();
    assert_eq!(finalizers(&fixed), [ADDRESS_FINALIZER]);
    assert_eq!(
        fixed["metadata"]["ownerReferences"],
        before["metadata"]["ownerReferences"]
    );
    assert_eq!(fixed["metadata"]["labels"], before["metadata"]["labels"]);
    // Delete it while the claim lives: it is re-created identically.
    w.kube
        .delete(IPAM_GROUP, "ipaddresses", Some("team-a"), "m");
    let deleting = w.address("team-a", "m").unwrap();
    w.event(json!({"type": "MODIFIED", "object": deleting}))
        .await;
    let again = w.address("team-a", "m").unwrap();
    assert!(again["metadata"].get("deletionTimestamp").is_none());
    assert_ne!(
        again["metadata"]["uid"], before["metadata"]["uid"],
        "a new object"
    );
    assert_eq!(again["spec"], before["spec"]);
    assert_eq!(
        again["metadata"]["ownerReferences"],
        before["metadata"]["ownerReferences"]
    );
    assert_eq!(finalizers(&again), [ADDRESS_FINALIZER]);
    w.assert_schema_clean();
}

async fn same_named_pools_in_two_namespaces_are_independent(w: World) {
    for ns in ["team-a", "team-b"] {
        w.kube.create(cluster(ns, "c1", false));
        let p = w.kube.create(pool(ns, "nodes", &["10.9.0.80-10.9.0.89"]));
        w.event(json!({"type": "ADDED", "object": p})).await;
        let c = w.kube.create(claim(ns, "m", "nodes"));
        w.event(json!({"type": "ADDED", "object": c})).await;
    }
    for ns in ["team-a", "team-b"] {
        assert_eq!(
            w.address(ns, "m").unwrap()["spec"]["address"],
            "10.9.0.80",
            "{ns}"
        );
    }
    w.assert_schema_clean();
}

async fn duplicated_and_reordered_events_reach_the_same_state(w: World) {
    setup(&w, &["10.9.0.90-10.9.0.99"]).await;
    let created: Vec<Value> = (0..4)
        .map(|i| w.kube.create(claim("team-a", &format!("r-{i}"), "nodes")))
        .collect();
    // Deliver in reverse, twice, with a delete of r-1 before its add.
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some("team-a"), "r-1");
    w.event(json!({"type": "DELETED", "object": created[1]}))
        .await;
    for ev in created.iter().rev().chain(created.iter()) {
        let r = w.event(json!({"type": "ADDED", "object": ev})).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let mut got: Vec<(String, String)> = ["r-0", "r-2", "r-3"]
        .iter()
        .map(|n| {
            (
                n.to_string(),
                w.address("team-a", n).unwrap()["spec"]["address"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    got.sort();
    let addrs: std::collections::BTreeSet<&String> = got.iter().map(|(_, a)| a).collect();
    assert_eq!(addrs.len(), 3, "distinct addresses: {got:?}");
    assert!(
        w.address("team-a", "r-1").is_none(),
        "a deleted claim gets nothing"
    );
    // A reconcile afterwards only refreshes the pool's counts (no IPAddress
    // events were delivered here); a second one changes nothing.
    w.kube.clear_requests();
    let r = w.reconcile().await;
    assert_eq!(r.status, 200, "{}", r.body);
    let writes: Vec<String> = w
        .kube
        .writes()
        .iter()
        .map(Recorded::line)
        .filter(|l| !l.ends_with("/status"))
        .collect();
    assert!(
        writes.is_empty(),
        "the first reconcile writes only status: {writes:?}"
    );
    w.kube.clear_requests();
    let r = w.reconcile().await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(w.kube.writes().is_empty(), "{:?}", w.kube.writes());
    w.assert_schema_clean();
}

async fn reconcile_from_an_empty_store_rebuilds_the_same_allocations(w: World) {
    setup(&w, &["10.9.0.100-10.9.0.120"]).await;
    for i in 0..6 {
        let c = w.kube.create(claim("team-a", &format!("m-{i}"), "nodes"));
        w.event(json!({"type": "ADDED", "object": c})).await;
    }
    // Free a low address so that a naive rebuild would hand it out again.
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some("team-a"), "m-0");
    w.touch("ipaddressclaims", Some("team-a"), "m-0").await;
    let before: Vec<Value> = (1..6)
        .map(|i| w.address("team-a", &format!("m-{i}")).unwrap()["spec"].clone())
        .collect();
    // A claim that arrived while nobody listened (no event).
    w.kube.create(claim("team-a", "late", "nodes"));

    // The store is lost: a fresh app on the same API server, small pages.
    if !w.kube.is_real() {
        w.kube.fake().set_list_page_size(2);
    }
    let fresh = w.fresh_app().await;
    let r = fresh.call("POST", "/v1/reconcile", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["errors"], json!([]), "{}", r.body);
    for i in 1..6 {
        assert_eq!(
            w.address("team-a", &format!("m-{i}")).unwrap()["spec"],
            before[i - 1],
            "m-{i} kept its address"
        );
    }
    let late = w
        .address("team-a", "late")
        .expect("the missed claim was allocated");
    let taken: Vec<&Value> = before.iter().map(|s| &s["address"]).collect();
    assert!(
        !taken.contains(&&late["spec"]["address"]),
        "no address handed out twice"
    );
    assert_eq!(late["spec"]["address"], "10.9.0.100", "the lowest free one");
    // The rebuilt store answers like the old one.
    let got = fresh.call("GET", "/v1/claims/team-a/m-3", None).await;
    assert_eq!(got.body["spec"]["address"], before[2]["address"]);
    let again = fresh.call("POST", "/v1/reconcile", None).await;
    assert_eq!(again.body["claims"]["bound"], 6, "{}", again.body);
    // In steady state a reconcile reads lists, not objects one by one: with
    // pages of 2, about 3 pages of claims and of IPAddresses, one of each
    // of the four pool kinds, the pool itself, the one Cluster, and one
    // list of Machines and one of PacketMachines (the machines to sync);
    // reading each claim, Cluster, pool and IPAddress again would take
    // over 30.
    let calls = again.body["kubeCalls"].as_u64().unwrap();
    assert!(
        calls <= 16,
        "{calls} API calls for 6 bound claims: {}",
        again.body
    );
    w.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_and_api_errors_are_retried_or_reported() {
    let w = World::new().await;
    setup(&w, &["10.9.0.130-10.9.0.139"]).await;
    let c = w.kube.create(claim("team-a", "m", "nodes"));
    // A concurrent writer makes our first finalizer patch stale.
    w.kube
        .fake()
        .fail_next("PATCH", "/ipaddressclaims/m", 1, 409);
    let r = w.event(json!({"type": "ADDED", "object": c.clone()})).await;
    assert_eq!(r.body["stepResult"]["result"], "bound", "{}", r.body);
    // An unavailable API server: the event is answered 5xx so the forwarder retries.
    let c2 = w.kube.create(claim("team-a", "m2", "nodes"));
    w.kube
        .fake()
        .fail_next("GET", "/ipaddressclaims/m2", 1, 503);
    let r = w
        .event(json!({"type": "ADDED", "object": c2.clone()}))
        .await;
    assert!(r.status >= 500, "{} {}", r.status, r.body);
    assert!(r.headers.contains_key("retry-after"));
    let r = w.event(json!({"type": "ADDED", "object": c2})).await;
    assert_eq!(r.body["stepResult"]["result"], "bound", "{}", r.body);
    w.assert_schema_clean();
}

async fn pool_deletion_waits_for_its_addresses(w: World) {
    setup(&w, &["10.9.0.140-10.9.0.149"]).await;
    let c = w.kube.create(claim("team-a", "m", "nodes"));
    w.event(json!({"type": "ADDED", "object": c})).await;
    w.kube
        .delete(METAL_GROUP, "metalippools", Some("team-a"), "nodes");
    let r = w.touch("metalippools", Some("team-a"), "nodes").await;
    assert_eq!(r.body["stepResult"]["result"], "waiting", "{}", r.body);
    let p = w
        .kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "nodes")
        .expect("kept by its finalizer");
    assert_eq!(ready(&p), ("False".into(), "PoolInUse".into()));
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some("team-a"), "m");
    w.touch("ipaddressclaims", Some("team-a"), "m").await;
    w.touch("metalippools", Some("team-a"), "nodes").await;
    assert!(
        w.kube
            .get(METAL_GROUP, "metalippools", Some("team-a"), "nodes")
            .is_none(),
        "finalizer removed once empty"
    );
    w.assert_schema_clean();
}

/// Issue 26, finding 1: two overlapping `MetalIPPool`s applied together
/// (`kubectl apply -f dir/`, a GitOps sync: both stored before either's
/// event reached the store) were both admitted and both registered; 23
/// claims later 8 addresses were held by two `IPAddress`es. Now the webhook
/// sees the API server's pools, and when both were admitted anyway (their
/// reviews at the same instant, or no webhook) the pool index refuses the
/// second registration and its object says so.
async fn overlapping_pools_applied_together_never_share_an_address(w: World) {
    w.kube.create(cluster("team-a", "c1", false));
    let a = w
        .kube
        .create(pool("team-a", "wide", &["10.9.0.2-10.9.0.40"]));
    let b = w
        .kube
        .create(pool("team-a", "narrow", &["10.9.0.20-10.9.0.60"]));
    // The webhook, asked about the second pool before either reached the
    // store, sees the first in the API server.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "r1", "operation": "CREATE", "namespace": "team-a", "name": "narrow",
            "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": "MetalIPPool"},
            "resource": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "resource": "metalippools"},
            "object": b.clone(), "dryRun": false}});
    let r = w
        .app
        .call("POST", "/v1/admission/pools", Some(&review))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["response"]["allowed"], false, "{}", r.body);
    assert_eq!(r.body["response"]["status"]["reason"], "PoolOverlap");
    // Both were admitted anyway: their events register one of them.
    w.event(json!({"type": "ADDED", "object": a})).await;
    w.event(json!({"type": "ADDED", "object": b})).await;
    let narrow = w
        .kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "narrow")
        .unwrap();
    assert_eq!(
        ready(&narrow),
        ("False".into(), "PoolOverlap".into()),
        "{narrow:#}"
    );
    // 23 claims over both: one address, one holder.
    for i in 0..23 {
        let pool = if i % 2 == 0 { "wide" } else { "narrow" };
        let c = w.kube.create(claim("team-a", &format!("o-{i:02}"), pool));
        w.event(json!({"type": "ADDED", "object": c})).await;
    }
    let mut holders = std::collections::BTreeMap::new();
    for i in 0..23 {
        if let Some(a) = w.address("team-a", &format!("o-{i:02}")) {
            let ip = a["spec"]["address"].as_str().unwrap().to_string();
            if let Some(other) = holders.insert(ip.clone(), i) {
                panic!("{ip} is held by o-{other:02} and o-{i:02}");
            }
        }
    }
    assert_eq!(holders.len(), 12, "the claims of the registered pool");
    // Once the first pool is gone, the second registers.
    for i in (0..23).step_by(2) {
        w.kube.delete(
            IPAM_GROUP,
            "ipaddressclaims",
            Some("team-a"),
            &format!("o-{i:02}"),
        );
        w.touch("ipaddressclaims", Some("team-a"), &format!("o-{i:02}"))
            .await;
    }
    w.kube
        .delete(METAL_GROUP, "metalippools", Some("team-a"), "wide");
    w.touch("metalippools", Some("team-a"), "wide").await;
    let r = w.touch("metalippools", Some("team-a"), "narrow").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let narrow = w
        .kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "narrow")
        .unwrap();
    assert_eq!(ready(&narrow).0, "True", "{narrow:#}");
    w.assert_schema_clean();
}

/// The scenarios that run on every runtime: the test host with FakeKube,
/// and, given `SPIN_BIN` and `KUBEBUILDER_ASSETS`, real Spin (SQLite and
/// Redis stores) against the real API server with the ServiceAccount token
/// of `deploy/rbac.yaml`. The others inject faults or control paging and
/// the clock, which only FakeKube and the host can.
async fn world(runtime: Runtime) -> Option<World> {
    World::on(runtime).await
}

metal_ipam_tests::on_every_runtime!(
    world: a_claim_event_binds_an_address_by_the_contract,
    every_event_format_is_understood,
    exhaustion_then_release_lets_the_waiting_claim_progress,
    paused_cluster_or_pool_means_no_writes,
    an_existing_address_gets_its_metadata_and_a_deleted_one_comes_back,
    same_named_pools_in_two_namespaces_are_independent,
    duplicated_and_reordered_events_reach_the_same_state,
    reconcile_from_an_empty_store_rebuilds_the_same_allocations,
    pool_deletion_waits_for_its_addresses,
    the_code_uses_exactly_the_permissions_rbac_grants,
    an_event_cannot_release_a_claim_made_through_the_http_api,
    prefix_pools_hand_out_sub_prefixes_by_the_contract,
    overlapping_pools_applied_together_never_share_an_address,
);

/// Prefix pools by the contract: a pool event syncs its status in
/// sub-prefixes; claims naming a `MetalPrefixPool` or a
/// `GlobalMetalPrefixPool` get an `IPAddress` whose `address` is the
/// sub-prefix's network address and `prefix` the allocation length; a
/// claim of an address pool of the same name is another pool's; a lost
/// store is rebuilt from the `IPAddress` objects with the same sub-prefixes
/// and the lowest free one goes to a claim missed meanwhile; a deleted
/// claim frees its sub-prefix.
async fn prefix_pools_hand_out_sub_prefixes_by_the_contract(w: World) {
    setup(&w, &["10.9.0.30-10.9.0.40"]).await;
    let pods = w
        .kube
        .create(json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1",
        "kind": "MetalPrefixPool", "metadata": {"name": "nodes", "namespace": "team-a"},
        "spec": {"prefixes": ["fd00:9::/60"], "excludedPrefixes": ["fd00:9:0:1::/64"]}}));
    let r = w.event(json!({"type": "ADDED", "object": pods})).await;
    assert_eq!(r.body["stepResult"]["result"], "synced", "{}", r.body);
    let routed = w
        .kube
        .create(json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1",
        "kind": "GlobalMetalPrefixPool", "metadata": {"name": "routed"},
        "spec": {"prefixes": ["10.96.0.0/26"], "allocationPrefixLength": 28,
                 "gateway": "10.96.0.1"}}));
    let r = w.event(json!({"type": "ADDED", "object": routed})).await;
    assert_eq!(r.body["stepResult"]["result"], "synced", "{}", r.body);
    let pool_obj = w
        .kube
        .get(METAL_GROUP, "metalprefixpools", Some("team-a"), "nodes")
        .unwrap();
    assert_eq!(pool_obj["status"]["ipAddresses"]["total"], 15);
    assert!(finalizers(&pool_obj).contains(&POOL_FINALIZER.to_string()));

    let prefix_claim = |name: &str, kind: &str, pool: &str| {
        let mut c = claim("team-a", name, pool);
        c["spec"]["poolRef"]["kind"] = json!(kind);
        c
    };
    for (name, kind, pool) in [
        ("p-0", "MetalPrefixPool", "nodes"),
        ("p-1", "MetalPrefixPool", "nodes"),
        ("p-2", "MetalPrefixPool", "nodes"),
        ("a-0", "MetalIPPool", "nodes"),
        ("r-0", "GlobalMetalPrefixPool", "routed"),
    ] {
        let c = w.kube.create(prefix_claim(name, kind, pool));
        let r = w.event(json!({"type": "ADDED", "object": c})).await;
        assert_eq!(
            r.body["stepResult"]["result"], "bound",
            "{name}: {}",
            r.body
        );
    }
    let spec = |name: &str| w.address("team-a", name).unwrap()["spec"].clone();
    assert_eq!(
        (
            spec("p-0")["address"].clone(),
            spec("p-0")["prefix"].clone()
        ),
        (json!("fd00:9::"), json!(64))
    );
    assert_eq!(
        spec("p-1")["address"],
        "fd00:9:0:2::",
        "the excluded /64 is skipped"
    );
    assert_eq!(spec("p-2")["address"], "fd00:9:0:3::");
    assert_eq!(
        spec("a-0")["address"],
        "10.9.0.30",
        "the address pool of the same name"
    );
    assert_eq!(
        (
            spec("r-0")["address"].clone(),
            spec("r-0")["prefix"].clone(),
            spec("r-0")["gateway"].clone()
        ),
        (json!("10.96.0.0"), json!(28), json!("10.96.0.1"))
    );
    assert_eq!(spec("p-0")["poolRef"]["kind"], "MetalPrefixPool");
    let ip = w.address("team-a", "p-0").unwrap();
    let owners = ip["metadata"]["ownerReferences"].as_array().unwrap();
    assert!(owners.iter().any(|o| o["kind"] == "MetalPrefixPool"));
    w.touch("metalprefixpools", Some("team-a"), "nodes").await;
    let pool_obj = w
        .kube
        .get(METAL_GROUP, "metalprefixpools", Some("team-a"), "nodes")
        .unwrap();
    assert_eq!(pool_obj["status"]["ipAddresses"]["used"], 3, "{pool_obj}");

    // Free p-0; a claim arrives with no event; the store is lost.
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some("team-a"), "p-0");
    w.touch("ipaddressclaims", Some("team-a"), "p-0").await;
    assert!(w.address("team-a", "p-0").is_none());
    w.kube
        .create(prefix_claim("late", "MetalPrefixPool", "nodes"));
    let fresh = w.fresh_app().await;
    let r = fresh.call("POST", "/v1/reconcile", None).await;
    assert_eq!(r.body["errors"], json!([]), "{}", r.body);
    assert_eq!(spec("p-1")["address"], "fd00:9:0:2::", "kept");
    assert_eq!(spec("p-2")["address"], "fd00:9:0:3::", "kept");
    assert_eq!(spec("r-0")["address"], "10.96.0.0", "kept");
    assert_eq!(
        spec("late")["address"],
        "fd00:9::",
        "the lowest free sub-prefix"
    );
    let got = fresh
        .call("GET", "/v1/prefix-pools/team-a/nodes", None)
        .await;
    assert_eq!(got.body["status"]["ipAddresses"]["used"], 3, "{}", got.body);
    w.assert_schema_clean();
}

/// (group, resource, verb) of a recorded request, as RBAC sees it.
fn permission_of(r: &Recorded) -> (String, String, String) {
    let parts: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    // apis/{group}/{version}/[namespaces/{ns}/]{plural}[/{name}[/status]]
    let rest = if parts.get(3) == Some(&"namespaces") {
        &parts[5..]
    } else {
        &parts[3..]
    };
    let resource = match rest {
        [plural, _, "status"] => format!("{plural}/status"),
        [plural, ..] => plural.to_string(),
        [] => String::new(),
    };
    let verb = match (r.method.as_str(), rest.len()) {
        ("GET", 1) => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", _) => "delete",
        (m, _) => panic!("unexpected method {m}"),
    };
    (parts[1].to_string(), resource, verb.to_string())
}

async fn the_code_uses_exactly_the_permissions_rbac_grants(w: World) {
    use std::collections::BTreeSet;
    setup(&w, &["10.9.0.150-10.9.0.151"]).await;
    // A full life: bind, exhaust, repair an address, delete, reconcile, delete the pool.
    for n in ["a", "b", "c"] {
        let c = w.kube.create(claim("team-a", n, "nodes"));
        w.event(json!({"type": "ADDED", "object": c})).await;
    }
    w.kube
        .delete(IPAM_GROUP, "ipaddresses", Some("team-a"), "a");
    w.touch("ipaddresses", Some("team-a"), "a").await;
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some("team-a"), "b");
    w.touch("ipaddressclaims", Some("team-a"), "b").await;
    w.reconcile().await;
    let fresh = w.fresh_app().await;
    fresh.call("POST", "/v1/reconcile", None).await;
    for n in ["a", "c"] {
        w.kube
            .delete(IPAM_GROUP, "ipaddressclaims", Some("team-a"), n);
        w.touch("ipaddressclaims", Some("team-a"), n).await;
    }
    w.kube
        .delete(METAL_GROUP, "metalippools", Some("team-a"), "nodes");
    w.touch("metalippools", Some("team-a"), "nodes").await;
    // And a global pool's life.
    let g = w.kube.create(
        json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
        "metadata": {"name": "edge"}, "spec": {"addresses": ["2001:db8:9::/64"], "prefix": 64}}),
    );
    let r = w.event(json!({"type": "ADDED", "object": g})).await;
    assert_eq!(r.body["stepResult"]["result"], "synced", "{}", r.body);
    w.kube
        .delete(METAL_GROUP, "globalmetalippools", None, "edge");
    w.touch("globalmetalippools", None, "edge").await;
    assert!(w
        .kube
        .get(METAL_GROUP, "globalmetalippools", None, "edge")
        .is_none());
    // And a prefix pool of each scope: registered, then deleted.
    for (kind, plural, ns) in [
        ("MetalPrefixPool", "metalprefixpools", Some("team-a")),
        ("GlobalMetalPrefixPool", "globalmetalprefixpools", None),
    ] {
        let mut p = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": kind,
            "metadata": {"name": "pods"}, "spec": {"prefixes": ["fd00:77::/56"]}});
        if let Some(ns) = ns {
            p["metadata"]["namespace"] = json!(ns);
        }
        let p = w.kube.create(p);
        let r = w.event(json!({"type": "ADDED", "object": p})).await;
        assert_eq!(r.body["stepResult"]["result"], "synced", "{}", r.body);
        w.kube.delete(METAL_GROUP, plural, ns, "pods");
        w.touch(plural, ns, "pods").await;
        assert!(w.kube.get(METAL_GROUP, plural, ns, "pods").is_none());
    }
    // And the takeover of each in-cluster pool kind: the fence reads the
    // in-cluster provider's Deployment (absent here), the import lists the
    // kind's pools, the pool step keeps its finalizer and writes its status.
    // (Distinct addresses: the overlap rule holds across the kinds.)
    for (i, kind) in InClusterKind::ALL.into_iter().enumerate() {
        let ns = (!kind.is_global()).then_some("team-a");
        let mut p = in_cluster::pool(
            kind,
            ns.unwrap_or(""),
            "imported",
            if kind.is_prefix() {
                json!({"prefixes": [format!("fd00:78:{i}::/62")], "allocationPrefixLength": 64})
            } else {
                json!({"addresses": [format!("10.78.{i}.10-10.78.{i}.12")], "prefix": 24})
            },
        );
        p["metadata"]["finalizers"] = json!([]);
        w.kube.create(p);
        let r = w
            .app
            .call("POST", &format!("/v1/takeover/{}", kind.kind()), None)
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let r = w.touch(kind.plural(), ns, "imported").await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let used: BTreeSet<(String, String, String)> =
        w.kube.requests().iter().map(permission_of).collect();
    let granted: BTreeSet<(String, String, String)> = metal_ipam_core::kube::USED_PERMISSIONS
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    let beyond: Vec<_> = used.difference(&granted).collect();
    assert!(
        beyond.is_empty(),
        "requests beyond USED_PERMISSIONS (and so beyond RBAC): {beyond:?}"
    );
    // Reading the owners of claims in VRF-backed pools is the assign
    // step's (tests/metal_assignments.rs shows those reads; a BMCMachine
    // owner's, functions/core/src/capi/device.rs), and reading
    // machines and network profiles and creating per-VLAN claims the
    // network step's (tests/network_component.rs).
    let unused: Vec<_> = granted
        .difference(&used)
        .filter(|(_, r, v)| {
            let metal_steps_only = matches!(
                r.as_str(),
                "machines" | "packetmachines" | "bmcmachines" | "metalnetworkprofiles"
            ) || (r == "ipaddressclaims"
                && (v == "create" || v == "delete"));
            !metal_steps_only
        })
        .collect();
    assert!(
        unused.is_empty(),
        "USED_PERMISSIONS lists permissions the code never used here: {unused:?}"
    );
    w.assert_schema_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_address_is_reused_only_after_the_grace_period() {
    let w = World::new().await;
    w.kube.create(cluster("team-a", "c1", false));
    let mut p = pool("team-a", "graceful", &["10.9.0.160-10.9.0.161"]);
    p["spec"]["addressReuseGracePeriodSeconds"] = json!(2);
    let p = w.kube.create(p);
    w.event(json!({"type": "ADDED", "object": p})).await;
    let a = w.kube.create(claim("team-a", "a", "graceful"));
    w.event(json!({"type": "ADDED", "object": a})).await;
    assert_eq!(
        w.address("team-a", "a").unwrap()["spec"]["address"],
        "10.9.0.160"
    );
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some("team-a"), "a");
    w.touch("ipaddressclaims", Some("team-a"), "a").await;
    assert!(w.claim("team-a", "a").is_none() && w.address("team-a", "a").is_none());
    // Right after the release .160 is cooling down: the next claim gets .161.
    let b = w.kube.create(claim("team-a", "b", "graceful"));
    w.event(json!({"type": "ADDED", "object": b})).await;
    assert_eq!(
        w.address("team-a", "b").unwrap()["spec"]["address"],
        "10.9.0.161"
    );
    let c = w.kube.create(claim("team-a", "c", "graceful"));
    w.event(json!({"type": "ADDED", "object": c.clone()})).await;
    assert_eq!(
        ready(&w.claim("team-a", "c").unwrap()),
        ("False".into(), "PoolExhausted".into())
    );
    // After the grace period the next event for c gets the released address.
    tokio::time::sleep(std::time::Duration::from_millis(3100)).await;
    w.touch("ipaddressclaims", Some("team-a"), "c").await;
    assert_eq!(
        w.address("team-a", "c").unwrap()["spec"]["address"],
        "10.9.0.160"
    );
    assert_eq!(ready(&w.claim("team-a", "c").unwrap()).0, "True");
    w.assert_schema_clean();
}

/// Finding 5 of issue 6: before, an event naming a claim that Kubernetes
/// does not have released its binding whatever its pool, so the events
/// token could release claims made through the plain HTTP API. Now a
/// binding is judged against the API server only when its pool came from
/// Kubernetes.
async fn an_event_cannot_release_a_claim_made_through_the_http_api(w: World) {
    let r = w
        .app
        .call(
            "PUT",
            "/v1/pools/team-a/manual",
            Some(
                &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
                "metadata": {"name": "manual", "namespace": "team-a"},
                "spec": {"addresses": ["10.7.0.10-10.7.0.20"], "prefix": 24}}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let c = json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": "by-hand", "namespace": "team-a", "uid": "u-by-hand"},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "manual"}}});
    let r = w.app.call("POST", "/v1/claims", Some(&c)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    // An event about a claim of that name, which the API server does not
    // have, sent with the events token.
    let r = w
        .app
        .call_with(
            "POST",
            "/v1/events",
            Some(&json!({"type": "DELETED", "object": c})),
            Some(&format!("Bearer {EVENTS_TOKEN}")),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["stepResult"]["result"], "absent", "{}", r.body);
    let got = w.app.call("GET", "/v1/claims/team-a/by-hand", None).await;
    assert_eq!(got.status, 200, "the binding stays: {}", got.body);
    assert_eq!(got.body["spec"]["address"], "10.7.0.10");
    // Through the HTTP API it is released as before.
    let r = w
        .app
        .call("DELETE", "/v1/claims/team-a/by-hand", None)
        .await;
    assert_eq!(r.status, 204, "{}", r.body);
}

/// The leak reclaim frees an address the pool holds but nothing explains
/// (no binding, no intent, no `IPAddress`), and only that one: the healthy
/// claim, whose `IPAddress` is listed, keeps its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_reclaims_a_leaked_address_and_nothing_else() {
    let w = World::new().await;
    setup(&w, &["10.9.0.100-10.9.0.120"]).await;
    // leak-0 first: ok-0's allocation then sees leak-0's binding written
    // and drops its intent, so nothing in the record explains the address
    // once the binding is gone.
    for name in ["leak-0", "ok-0"] {
        let c = w.kube.create(claim("team-a", name, "nodes"));
        let r = w.event(json!({"type": "ADDED", "object": c})).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let kept = w.address("team-a", "ok-0").expect("bound")["spec"]["address"].clone();
    // The leak: the binding is lost from the store and neither the claim
    // nor its IPAddress is listed.
    w.app
        .store()
        .await
        .delete("claim/team-a/leak-0")
        .await
        .unwrap();
    w.kube.fake().hide_from_lists("team-a", "leak-0");
    let r = w.reconcile().await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["leaksReclaimed"], 1, "{}", r.body);
    let got = w.app.call("GET", "/v1/claims/team-a/ok-0", None).await;
    assert_eq!(got.body["spec"]["address"], kept, "{}", got.body);
    // A second reconcile finds nothing more.
    let r = w.reconcile().await;
    assert_eq!(r.body["leaksReclaimed"], 0, "{}", r.body);
}

/// Finding 1 of issue 6: reconcile built its set of live claims from one
/// list and released every binding not in it, so a claim created and bound
/// after the list was taken (an event on another replica) lost its binding
/// while its IPAddress stayed, and its address went to the next claim. Now
/// a binding missing from the list is released only after re-reading its
/// claim, and never while an IPAddress holds its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_never_frees_a_claim_bound_after_its_list() {
    let w = World::new().await;
    setup(&w, &["10.9.0.100-10.9.0.120"]).await;
    let c = w.kube.create(claim("team-a", "late-0", "nodes"));
    let r = w.event(json!({"type": "ADDED", "object": c})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let address = w.address("team-a", "late-0").expect("bound")["spec"]["address"].clone();
    // The claim and its IPAddress came after reconcile's lists.
    w.kube.fake().hide_from_lists("team-a", "late-0");
    let r = w.reconcile().await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["bindingsReleased"], 0, "{}", r.body);
    assert_eq!(r.body["leaksReclaimed"], 0, "{}", r.body);
    let got = w.app.call("GET", "/v1/claims/team-a/late-0", None).await;
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(got.body["spec"]["address"], address);
    // The next claim does not get its address.
    let next = w.kube.create(claim("team-a", "next-0", "nodes"));
    w.event(json!({"type": "ADDED", "object": next})).await;
    assert_ne!(
        w.address("team-a", "next-0").expect("bound")["spec"]["address"],
        address
    );
    w.assert_schema_clean();
}

/// The prefix pool CRDs on the real API server (`KUBEBUILDER_ASSETS`;
/// skipped without it): `allocationPrefixLength` defaults to 64, and the
/// CEL rule refuses an IPv4 pool handing out more than /32 (an IPv4 pool
/// left at the default, too), before any webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_api_server_applies_the_prefix_pool_crd_rules() {
    let Some(cp) = ControlPlane::get() else {
        eprintln!("skipped: KUBEBUILDER_ASSETS is not set");
        return;
    };
    let s = tokio::task::block_in_place(|| cp.session());
    let pool = |name: &str, spec: Value| {
        json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalPrefixPool",
               "metadata": {"name": name}, "spec": spec})
    };
    let v6 = s.create(pool("crd-v6", json!({"prefixes": ["fd00:42::/48"]})));
    assert_eq!(v6["spec"]["allocationPrefixLength"], 64, "defaulted");
    let v4 = s.create(pool(
        "crd-v4",
        json!({"prefixes": ["10.42.0.0/24"], "allocationPrefixLength": 28}),
    ));
    assert_eq!(v4["spec"]["allocationPrefixLength"], 28);
    for (name, spec) in [
        (
            "crd-v4-long",
            json!({"prefixes": ["10.42.1.0/24"], "allocationPrefixLength": 64}),
        ),
        ("crd-v4-default", json!({"prefixes": ["10.42.2.0/24"]})),
    ] {
        let e = s.try_create(pool(name, spec)).unwrap_err();
        assert_eq!(e.code, 422, "{e:?}");
        assert!(
            e.message
                .contains("allocationPrefixLength must be at most 32 for IPv4 prefixes"),
            "{e:?}"
        );
    }
    let e = s
        .try_create(pool("crd-none", json!({"allocationPrefixLength": 64})))
        .unwrap_err();
    assert_eq!(e.code, 422, "prefixes or metal: {e:?}");
}

/// Issue 26, finding 9: the browser view's pool page and search and the
/// reconcile's stale-binding release listed the whole store (`KEYS *` on
/// Redis) on every call. With 3,000 unrelated keys in the store and 40
/// claims (past the holder index's flush), none of them lists a key, and
/// each still finds every holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_are_found_without_listing_the_store() {
    let w = World::new().await;
    setup(&w, &["10.9.0.100-10.9.0.160"]).await;
    let mut by_claim = std::collections::BTreeMap::new();
    for i in 0..40 {
        let name = format!("c-{i}");
        let c = w.kube.create(claim("team-a", &name, "nodes"));
        let r = w.event(json!({"type": "ADDED", "object": c})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let a = w.address("team-a", &name).expect("bound")["spec"]["address"]
            .as_str()
            .unwrap()
            .to_string();
        by_claim.insert(format!("team-a/{name}"), a);
    }
    let store = w.app.store().await;
    for i in 0..3000 {
        store
            .set(&format!("unrelated/{i:05}"), b"{}")
            .await
            .expect("seed");
    }
    let lists = |r: &Resp| {
        r.headers
            .get("x-kv-ops-detail")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    // The pool page names every holder.
    let r = w.app.call("GET", "/ui/api/pools/team-a/nodes", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!lists(&r).contains("get-keys"), "{}", lists(&r));
    let shown: std::collections::BTreeMap<String, String> = r.body["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["claim"].as_str().unwrap_or("-").to_string(),
                row["address"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(shown, by_claim, "every address with its claim");
    assert!(r.kv_ops <= 6, "pool page: {} ({})", r.kv_ops, lists(&r));
    // The search, by address and by claim.
    let a7 = &by_claim["team-a/c-7"];
    let r = w
        .app
        .call("GET", &format!("/ui/api/search?q={a7}"), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!lists(&r).contains("get-keys"), "{}", lists(&r));
    assert_eq!(r.body["results"][0]["claim"], "team-a/c-7", "{}", r.body);
    let r = w.app.call("GET", "/ui/api/search?q=team-a/c-9", None).await;
    assert!(!lists(&r).contains("get-keys"), "{}", lists(&r));
    assert_eq!(
        r.body["results"][0]["address"],
        by_claim["team-a/c-9"].as_str()
    );
    // A first reconcile creates the Metal record indexes of this new store
    // (one listing each, once per store: kv-schema/README.md, "Registries").
    let r = w.reconcile().await;
    assert_eq!(r.status, 200, "{}", r.body);
    // A claim and its IPAddress gone without an event: the reconcile
    // releases the binding, reading only the holders of its candidates.
    for plural in ["ipaddresses", "ipaddressclaims"] {
        let mut o = w
            .kube
            .get(IPAM_GROUP, plural, Some("team-a"), "c-3")
            .expect("exists");
        o["metadata"]["finalizers"] = json!([]);
        w.kube.put(o);
        w.kube.delete(IPAM_GROUP, plural, Some("team-a"), "c-3");
    }
    assert!(w.claim("team-a", "c-3").is_none());
    let r = w.reconcile().await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!lists(&r).contains("get-keys"), "{}", lists(&r));
    assert_eq!(r.body["bindingsReleased"], 1, "{}", r.body);
    assert_eq!(r.body["leaksReclaimed"], 0, "{}", r.body);
    let got = w.app.call("GET", "/v1/claims/team-a/c-3", None).await;
    assert_eq!(got.status, 404, "{}", got.body);
    let got = w.app.call("GET", "/v1/claims/team-a/c-4", None).await;
    assert_eq!(got.body["spec"]["address"], by_claim["team-a/c-4"].as_str());
    w.assert_schema_clean();
}
