//! The takeover of the in-cluster IPAM provider's pools and the hand-back,
//! end to end: objects exactly as the in-cluster provider writes them
//! (`metal_ipam_tests::in_cluster`, its emulation), the real components,
//! and FakeKube or — given `SPIN_BIN` and `KUBEBUILDER_ASSETS` — real Spin
//! against the real API server with the in-cluster provider's CRDs and an
//! `apps/v1` Deployment standing for its controller.
//!
//! What must hold (docs/takeover.md): no address changes and none is held
//! twice across a takeover and a hand-back; a claim created before the
//! switch, and one mid-deletion at the moment of the switch, are served in
//! the contract's order; nothing is written for the kind while the
//! in-cluster provider's Deployment has replicas or before the takeover.

use std::collections::BTreeMap;

use metal_ipam_tests::fake_kube::{FakeKube, IPAM_GROUP};
use metal_ipam_tests::harness::{App, Resp, Runtime};
use metal_ipam_tests::in_cluster::{self, InCluster, PoolKind as IcKind};
use metal_ipam_tests::kube::Kube;
use metal_ipam_tests::real_kube::ControlPlane;
use metal_ipam_tests::real_spin::SpinBin;
use serde_json::{json, Value};

const EVENTS_TOKEN: &str = "events-token-for-tests";
const NS: &str = "team-a";
const DEPLOYMENT_NS: &str = "capi-ipam-in-cluster-system";
const DEPLOYMENT: &str = "capi-ipam-in-cluster-controller-manager";
const TAKEOVER: &str = "/v1/takeover/InClusterIPPool";

struct World {
    kube: Kube,
    app: App,
    runtime: Runtime,
}

async fn world(runtime: Runtime) -> Option<World> {
    let kube = if runtime == Runtime::Host {
        Kube::Fake(FakeKube::start().await)
    } else {
        SpinBin::from_env()?;
        let cp = ControlPlane::get()?;
        Kube::Real(tokio::task::block_in_place(|| cp.session()))
    };
    let vars = [
        ("k8s_api_url", kube.base_url()),
        ("k8s_token", kube.token().to_string()),
        ("events_token", EVENTS_TOKEN.to_string()),
    ];
    let app = App::on(runtime, &vars, &kube.client_tls()).await?;
    Some(World { kube, app, runtime })
}

impl World {
    async fn call(&self, method: &str, path: &str) -> Resp {
        self.app.call(method, path, None).await
    }

    /// A watch event for the object as stored.
    async fn touch(&self, plural: &str, ns: Option<&str>, name: &str) -> Resp {
        let obj = self.kube.get(IPAM_GROUP, plural, ns, name).expect("exists");
        let ev = json!({"type": "MODIFIED", "object": obj});
        self.app.call("POST", "/v1/events", Some(&ev)).await
    }

    fn claim(&self, name: &str) -> Option<Value> {
        self.kube.get(IPAM_GROUP, "ipaddressclaims", Some(NS), name)
    }

    /// Every `IPAddress`: claim name → address.
    fn addresses(&self) -> BTreeMap<String, String> {
        let all = self.kube.list(IPAM_GROUP, "ipaddresses");
        let mut out = BTreeMap::new();
        for a in &all {
            let name = a["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            out.insert(
                name,
                a["spec"]["address"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
        let mut seen: Vec<&String> = out.values().collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), out.len(), "no address is held twice: {out:?}");
        out
    }

    /// [`World::addresses`] of the pools of one kind.
    fn addresses_of(&self, kind: &str) -> BTreeMap<String, String> {
        let all = self.addresses();
        self.kube
            .list(IPAM_GROUP, "ipaddresses")
            .iter()
            .filter(|a| a["spec"]["poolRef"]["kind"] == kind)
            .filter_map(|a| a["metadata"]["name"].as_str())
            .map(|n| (n.to_string(), all[n].clone()))
            .collect()
    }

    /// The in-cluster provider's controller at `replicas` (desired; the
    /// real API server runs no Deployment controller, so none run).
    fn deployment(&self, replicas: u32) {
        // FakeKube serves no Deployments: its 404 reads as "not installed",
        // which the fence lets through.
        if !self.kube.is_real() {
            return;
        }
        let cp = ControlPlane::get().expect("a real API server");
        cp.ensure_namespace(DEPLOYMENT_NS);
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": DEPLOYMENT, "namespace": DEPLOYMENT_NS},
            "spec": {"replicas": replicas,
                "selector": {"matchLabels": {"control-plane": "controller-manager"}},
                "template": {"metadata": {"labels": {"control-plane": "controller-manager"}},
                    "spec": {"containers": [{"name": "manager", "image": "in-cluster:v1.1.0"}]}}}});
        let r = cp.apply(&d).expect("the Deployment applied");
        assert!(r.is_success(), "{} {}", r.status, r.message());
    }
}

fn finalizers(o: &Value) -> Vec<String> {
    o["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A cluster as the in-cluster provider left it: pool `nodes` with three
/// bound claims (the lowest free addresses), then `c-1` deleted by its
/// consumer (mid-deletion: its finalizer holds it).
fn in_cluster_state(w: &World) {
    w.kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "prod", "namespace": NS}, "spec": {"paused": false}}),
    );
    w.kube.create(in_cluster::pool(
        IcKind::InClusterIPPool,
        NS,
        "nodes",
        json!({"addresses": ["10.50.0.10-10.50.0.20"], "prefix": 24, "gateway": "10.50.0.1"}),
    ));
    for c in ["c-0", "c-1", "c-2"] {
        w.kube.create(in_cluster::claim(
            NS,
            c,
            IcKind::InClusterIPPool,
            "nodes",
            Some("prod"),
        ));
    }
    InCluster::new(&w.kube).settle(5);
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "c-1");
    assert!(w.claim("c-1").is_some(), "held by ReleaseAddress");
}

async fn takeover_and_hand_back_change_no_address(w: World) {
    in_cluster_state(&w);
    let before = w.addresses();
    assert_eq!(before.len(), 3, "{before:?}");

    // Before any takeover: a new claim on the pool is not ours.
    w.kube.create(in_cluster::claim(
        NS,
        "c-3",
        IcKind::InClusterIPPool,
        "nodes",
        Some("prod"),
    ));
    let r = w.touch("ipaddressclaims", Some(NS), "c-3").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        finalizers(&w.claim("c-3").unwrap()).is_empty(),
        "nothing written"
    );

    // The fence: refused while the in-cluster controller has replicas.
    if w.kube.is_real() {
        w.deployment(1);
        let r = w.call("POST", TAKEOVER).await;
        assert_eq!(
            (r.status, r.body["reason"].as_str()),
            (409, Some("InClusterProviderActive")),
            "{}",
            r.body
        );
        assert!(
            r.body["message"]
                .as_str()
                .unwrap_or_default()
                .contains(DEPLOYMENT),
            "{}",
            r.body
        );
        let shown = w.call("GET", TAKEOVER).await;
        assert_eq!(shown.body["state"], "not-taken-over", "{}", shown.body);
    }
    w.deployment(0);

    // The takeover: the store is built from the pool and its IPAddresses.
    let r = w.call("POST", TAKEOVER).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "serving", "{}", r.body);
    assert_eq!(
        r.body["pools"],
        json!([format!("{NS}/nodes")]),
        "{}",
        r.body
    );
    assert_eq!(r.body["addresses"], 3, "{}", r.body);
    let again = w.call("POST", TAKEOVER).await;
    assert_eq!(
        (again.status, &again.body["state"]),
        (200, &json!("serving")),
        "idempotent"
    );

    // The claim mid-deletion at the switch: released in the contract's
    // order (its IPAddress goes, then the claim's finalizer).
    let r = w.touch("ipaddressclaims", Some(NS), "c-1").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "c-1")
        .is_none());
    assert!(w.claim("c-1").is_none(), "its finalizer removed last");

    // A claim created before the switch, served now: metal-ipam's Ready
    // condition, the in-cluster provider's finalizers.
    let r = w.touch("ipaddressclaims", Some(NS), "c-3").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let c3 = w.claim("c-3").unwrap();
    assert_eq!(finalizers(&c3), vec![in_cluster::RELEASE_ADDRESS_FINALIZER]);
    assert_eq!(c3["status"]["addressRef"]["name"], "c-3");
    let ready = c3["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["status"], "True", "{c3}");
    let a3 = w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "c-3")
        .unwrap();
    assert_eq!(finalizers(&a3), vec![in_cluster::PROTECT_ADDRESS_FINALIZER]);
    assert_eq!(a3["spec"]["poolRef"]["kind"], "InClusterIPPool");
    assert_eq!(
        a3["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"],
        "prod"
    );
    let owners: Vec<(&str, bool)> = a3["metadata"]["ownerReferences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap(),
                o["controller"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        owners,
        vec![("IPAddressClaim", true), ("InClusterIPPool", false)]
    );

    // Pool status in the in-cluster schema (no conditions).
    let r = w.touch("inclusterippools", Some(NS), "nodes").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let pool = w
        .kube
        .get(IPAM_GROUP, "inclusterippools", Some(NS), "nodes")
        .unwrap();
    assert_eq!(pool["status"]["ipAddresses"]["used"], 3, "{pool}");
    assert!(pool["status"].get("conditions").is_none(), "{pool}");
    assert_eq!(finalizers(&pool), vec![in_cluster::PROTECT_POOL_FINALIZER]);

    let during = w.addresses();
    for c in ["c-0", "c-2"] {
        assert_eq!(during[c], before[c], "{c} keeps its address");
    }

    // The hand-back: the first call stops serving and asks to be called
    // again after the quiet period (steps that read `serving` finish).
    let r = w.call("DELETE", TAKEOVER).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["state"], "returning", "{}", r.body);
    assert_eq!(r.body["retryAfterSeconds"], 120, "{}", r.body);
    let r = w.call("DELETE", TAKEOVER).await;
    assert_eq!(
        (r.status, &r.body["state"]),
        (202, &json!("returning")),
        "still quiet"
    );
    assert_eq!(w.addresses(), during, "a hand-back writes no IPAddress");
    w.kube.create(in_cluster::claim(
        NS,
        "c-4",
        IcKind::InClusterIPPool,
        "nodes",
        Some("prod"),
    ));
    let r = w.touch("ipaddressclaims", Some(NS), "c-4").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        finalizers(&w.claim("c-4").unwrap()).is_empty(),
        "not served after the hand-back"
    );

    // After the quiet period the store forgets the kind (on the test host,
    // whose clock the test moves; real Spin keeps real time and the kind
    // stays `returning`, which serves nothing as well).
    if w.runtime == Runtime::Host {
        w.app.host().advance_clock(121);
        let r = w.call("DELETE", TAKEOVER).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.body["pools"],
            json!([format!("{NS}/nodes")]),
            "{}",
            r.body
        );
        assert_eq!(r.body["state"], "not-taken-over", "{}", r.body);
    }

    // The in-cluster provider resumes: nothing renumbered, nothing twice.
    w.deployment(1);
    InCluster::new(&w.kube).settle(5);
    let after = w.addresses();
    for (c, a) in &during {
        assert_eq!(
            after.get(c),
            Some(a),
            "{c} keeps its address across the hand-back"
        );
    }
    assert!(after.contains_key("c-4"), "{after:?}");
    let r = w.call("GET", TAKEOVER).await;
    let state = if w.runtime == Runtime::Host {
        "not-taken-over"
    } else {
        "returning"
    };
    assert_eq!(r.body["state"], state, "{}", r.body);
}

/// The global and prefix kinds through the same switch and back: a
/// `GlobalInClusterIPPool` serving two namespaces and an
/// `InClusterPrefixPool` handing out IPv6 /64s, each with claims the
/// in-cluster provider bound, taken over, a new claim served next to them,
/// handed back and resumed by the in-cluster provider.
async fn global_and_prefix_kinds_keep_every_address(w: World) {
    w.deployment(0);
    let cases = [
        (
            IcKind::GlobalInClusterIPPool,
            None,
            json!({"addresses": ["10.51.0.10-10.51.0.19"], "prefix": 24, "gateway": "10.51.0.1"}),
            [("ns-a", "g-0"), ("ns-b", "g-1"), ("ns-b", "g-2")],
        ),
        (
            IcKind::InClusterPrefixPool,
            Some(NS),
            json!({"prefixes": ["fd00:51::/61"], "allocationPrefixLength": 64,
                   "excludedPrefixes": ["fd00:51::/64"]}),
            [(NS, "p-0"), (NS, "p-1"), (NS, "p-2")],
        ),
    ];
    for (kind, pool_ns, spec, claims) in cases {
        let kind_name = kind.kind();
        w.kube.create(in_cluster::pool(
            kind,
            pool_ns.unwrap_or(""),
            "shared",
            spec,
        ));
        for (ns, name) in &claims[..2] {
            w.kube
                .create(in_cluster::claim(ns, name, kind, "shared", None));
        }
        InCluster::new(&w.kube).kinds(&[kind]).settle(5);
        let before = w.addresses_of(kind_name);
        assert_eq!(before.len(), 2, "{kind_name}: {before:?}");

        let path = format!("/v1/takeover/{kind_name}");
        let r = w.call("POST", &path).await;
        assert_eq!(r.status, 200, "{kind_name}: {}", r.body);
        assert_eq!(r.body["addresses"], 2, "{kind_name}: {}", r.body);

        // A claim made now is served by metal-ipam, next to the imported
        // ones (w.addresses() asserts no address is held twice).
        let (ns, name) = claims[2];
        w.kube
            .create(in_cluster::claim(ns, name, kind, "shared", None));
        let r = w.touch("ipaddressclaims", Some(ns), name).await;
        assert_eq!(r.status, 200, "{kind_name}: {}", r.body);
        let during = w.addresses_of(kind_name);
        assert_eq!(during.len(), 3, "{kind_name}: {during:?}");
        for (c, a) in &before {
            assert_eq!(&during[c], a, "{kind_name}: {c} keeps its address");
        }
        let new = w
            .kube
            .get(IPAM_GROUP, "ipaddresses", Some(ns), name)
            .expect("the new claim's IPAddress");
        assert_eq!(new["spec"]["poolRef"]["kind"], kind_name);
        if kind.is_prefix() {
            assert_eq!(new["spec"]["prefix"], 64, "{new}");
            assert_eq!(new["spec"]["address"], "fd00:51:0:3::", "{new}");
        } else {
            assert_eq!(new["spec"]["address"], "10.51.0.12", "{new}");
        }
        assert_eq!(
            finalizers(
                &w.kube
                    .get(IPAM_GROUP, "ipaddressclaims", Some(ns), name)
                    .unwrap()
            ),
            vec![in_cluster::RELEASE_ADDRESS_FINALIZER]
        );

        // The pool's status in the in-cluster schema.
        let r = w.touch(kind.plural(), pool_ns, "shared").await;
        assert_eq!(r.status, 200, "{kind_name}: {}", r.body);
        let pool = w
            .kube
            .get(IPAM_GROUP, kind.plural(), pool_ns, "shared")
            .unwrap();
        assert_eq!(pool["status"]["ipAddresses"]["used"], 3, "{pool}");

        // Handed back; the in-cluster provider resumes with the same
        // addresses (and serves a claim of its own without collision).
        let r = w.call("DELETE", &path).await;
        assert_eq!((r.status, &r.body["state"]), (202, &json!("returning")));
        if w.runtime == Runtime::Host {
            w.app.host().advance_clock(121);
            let r = w.call("DELETE", &path).await;
            assert_eq!(r.status, 200, "{kind_name}: {}", r.body);
        }
        w.kube.create(in_cluster::claim(
            claims[0].0,
            &format!("{name}-late"),
            kind,
            "shared",
            None,
        ));
        InCluster::new(&w.kube).kinds(&[kind]).settle(5);
        let after = w.addresses_of(kind_name);
        for (c, a) in &during {
            assert_eq!(
                after.get(c),
                Some(a),
                "{kind_name}: {c} across the hand-back"
            );
        }
        assert_eq!(after.len(), 4, "{kind_name}: {after:?}");
    }
}

metal_ipam_tests::on_every_runtime!(
    world: takeover_and_hand_back_change_no_address,
    global_and_prefix_kinds_keep_every_address,
);
