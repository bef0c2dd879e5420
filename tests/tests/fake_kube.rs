//! FakeKube over real HTTP: every emulated API-server behaviour, checked
//! with concrete values so that a regression in the fake fails here.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use metal_ipam_tests::fake_kube::{
    DeleteOutcome, FakeKube, CLUSTER_GROUP, IPAM_GROUP, METAL_GROUP,
};
use serde_json::{json, Value};

const NS: &str = "default";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

// ---------------------------------------------------------------------------
// A small client
// ---------------------------------------------------------------------------

/// A response: status, headers, JSON body (`Null` if empty).
struct Reply {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or("")
    }
}

struct Api {
    kube: FakeKube,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl Api {
    async fn start() -> Api {
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(5))
            .build_http();
        Api {
            kube: FakeKube::start().await,
            http,
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
        token: Option<&str>,
    ) -> Reply {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.kube.base_url()));
        if let Some(token) = token {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let bytes = body
            .map(|b| serde_json::to_vec(b).unwrap())
            .unwrap_or_default();
        let resp = self
            .http
            .request(req.body(Full::new(Bytes::from(bytes))).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let raw = resp.into_body().collect().await.unwrap().to_bytes();
        let body = if raw.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&raw).expect("FakeKube answers JSON")
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        ct: Option<&str>,
        body: Option<&Value>,
    ) -> Reply {
        self.send(method, path, ct, body, Some(self.kube.token()))
            .await
    }

    async fn get(&self, path: &str) -> Reply {
        self.call("GET", path, None, None).await
    }

    async fn post(&self, path: &str, body: &Value) -> Reply {
        self.call("POST", path, Some("application/json"), Some(body))
            .await
    }

    async fn put(&self, path: &str, body: &Value) -> Reply {
        self.call("PUT", path, Some("application/json"), Some(body))
            .await
    }

    async fn patch(&self, path: &str, ct: &str, body: &Value) -> Reply {
        self.call("PATCH", path, Some(ct), Some(body)).await
    }

    async fn delete(&self, path: &str, options: Option<&Value>) -> Reply {
        let ct = options.map(|_| "application/json");
        self.call("DELETE", path, ct, options).await
    }
}

// ---------------------------------------------------------------------------
// Objects and paths
// ---------------------------------------------------------------------------

fn claims() -> String {
    FakeKube::path(IPAM_GROUP, "ipaddressclaims", Some(NS), None)
}

fn claim_path(name: &str) -> String {
    FakeKube::path(IPAM_GROUP, "ipaddressclaims", Some(NS), Some(name))
}

fn addresses() -> String {
    FakeKube::path(IPAM_GROUP, "ipaddresses", Some(NS), None)
}

fn address_path(name: &str) -> String {
    FakeKube::path(IPAM_GROUP, "ipaddresses", Some(NS), Some(name))
}

fn pool_ref() -> Value {
    json!({"apiGroup": METAL_GROUP, "kind": "MetalIPPool", "name": "web-v4"})
}

fn claim(name: &str) -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": "web"}},
        "spec": {"clusterName": "web", "poolRef": pool_ref()}
    })
}

fn pool(name: &str) -> Value {
    json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1",
        "kind": "MetalIPPool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"addresses": ["192.0.2.10-192.0.2.99"], "prefix": 24, "gateway": "192.0.2.1"}
    })
}

fn owner(obj: &Value, controller: bool) -> Value {
    json!({
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": true
    })
}

fn address(name: &str, ip: &str, owners: &[Value]) -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddress",
        "metadata": {"name": name, "namespace": NS, "ownerReferences": owners},
        "spec": {"address": ip, "prefix": 24, "gateway": "192.0.2.1",
                 "claimRef": {"name": name}, "poolRef": pool_ref()}
    })
}

fn ready(reason: &str) -> Value {
    json!({"type": "Ready", "status": "True", "reason": reason, "message": "",
           "lastTransitionTime": "2026-11-29T18:17:07Z"})
}

fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion is a string")
        .parse()
        .expect("resourceVersion is numeric here")
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

// ---------------------------------------------------------------------------
// Authentication, routing
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn requests_need_the_bearer_token() {
    let api = Api::start().await;
    for token in [None, Some("wrong"), Some("")] {
        let r = api.send("GET", &claims(), None, None, token).await;
        assert_eq!(r.status, 401, "{token:?}");
        assert_eq!(
            r.body,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "Unauthorized", "reason": "Unauthorized", "details": {}, "code": 401})
        );
    }
    assert!(
        api.kube.requests().is_empty(),
        "unauthenticated requests are not recorded"
    );
    let r = api.get(&claims()).await;
    assert_eq!(r.status, 200);
    assert_eq!(api.kube.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_paths_versions_and_methods() {
    let api = Api::start().await;
    for path in [
        "/apis/ipam.cluster.x-k8s.io/v1beta1/namespaces/default/ipaddressclaims",
        "/apis/ipam.cluster.x-k8s.io/v1beta2/ipaddressclaims/x",
        "/apis/ipam.metal-ipam.dev/v1alpha1/namespaces/default/globalmetalippools",
        "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/default/ipaddresses/a/status",
        "/api/v1/namespaces/default/pods",
    ] {
        let r = api.get(path).await;
        assert_eq!((r.status, r.reason()), (404, "NotFound"), "{path}");
        assert_eq!(
            r.body["message"],
            "the server could not find the requested resource"
        );
    }
    // deletecollection, and POST to the all-namespaces path.
    let r = api.delete(&claims(), None).await;
    assert_eq!((r.status, r.reason()), (405, "MethodNotAllowed"));
    let all = FakeKube::path(IPAM_GROUP, "ipaddressclaims", None, None);
    assert_eq!(all, "/apis/ipam.cluster.x-k8s.io/v1beta2/ipaddressclaims");
    let r = api.post(&all, &claim("c")).await;
    assert_eq!(r.status, 405);
    let r = api.get(&format!("{}?watch=true", claims())).await;
    assert_eq!(r.status, 400);
    assert!(r.body["message"].as_str().unwrap().contains("watch"));
    let statuses: Vec<u16> = api.kube.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [404, 404, 404, 404, 404, 405, 405, 400]);
}

// ---------------------------------------------------------------------------
// Create and get
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn create_sets_server_fields_and_drops_status() {
    let api = Api::start().await;
    let mut body = claim("web-cp-0");
    body["status"] = json!({"addressRef": {"name": "sneaky"}});
    let r = api.post(&claims(), &body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let created = r.body;
    let m = &created["metadata"];
    let uid = m["uid"].as_str().unwrap();
    assert_eq!(uid.len(), 36, "{uid}");
    assert_eq!(uid.as_bytes()[14], b'4', "a v4-style uuid: {uid}");
    assert_eq!(m["resourceVersion"], "1");
    assert_eq!(m["generation"], 1);
    assert_eq!(m["namespace"], NS);
    let ts = m["creationTimestamp"].as_str().unwrap();
    assert!(
        ts.len() == 20 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
        "{ts}"
    );
    assert!(
        created.get("status").is_none(),
        "status is a subresource: {created}"
    );
    assert_eq!(created["spec"], body["spec"]);

    let got = api.get(&claim_path("web-cp-0")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, created);
    assert_eq!(
        api.kube
            .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "web-cp-0"),
        Some(created.clone())
    );

    // A second object gets the next resourceVersion and another uid.
    let other = api.post(&claims(), &claim("web-cp-1")).await.body;
    assert_eq!(other["metadata"]["resourceVersion"], "2");
    assert_ne!(other["metadata"]["uid"], created["metadata"]["uid"]);

    // IPAddress has no status subresource: its (schema-less) status is an unknown field.
    let mut addr = address("web-cp-0", "192.0.2.10", &[]);
    addr["status"] = json!({"x": 1});
    let r = api.post(&addresses(), &addr).await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.body["details"]["causes"][0]["field"], "status");
}

#[tokio::test(flavor = "multi_thread")]
async fn create_conflicts_and_bad_requests() {
    let api = Api::start().await;
    assert_eq!(api.post(&claims(), &claim("a")).await.status, 201);
    let r = api.post(&claims(), &claim("a")).await;
    assert_eq!(r.status, 409);
    assert_eq!(
        r.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "ipaddressclaims.ipam.cluster.x-k8s.io \"a\" already exists",
               "reason": "AlreadyExists",
               "details": {"name": "a", "group": "ipam.cluster.x-k8s.io", "kind": "ipaddressclaims"},
               "code": 409})
    );

    let r = api.get(&claim_path("missing")).await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.body["message"],
        "ipaddressclaims.ipam.cluster.x-k8s.io \"missing\" not found"
    );
    assert_eq!(r.body["details"]["name"], "missing");

    // Namespace in the body must match the path.
    let mut elsewhere = claim("b");
    elsewhere["metadata"]["namespace"] = json!("other");
    let r = api.post(&claims(), &elsewhere).await;
    assert_eq!((r.status, r.reason()), (400, "BadRequest"));
    assert!(r.body["message"].as_str().unwrap().contains("namespace"));
    // Without a namespace in the body, the path's is taken.
    let mut no_ns = claim("b");
    no_ns["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    let r = api.post(&claims(), &no_ns).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body["metadata"]["namespace"], NS);

    // apiVersion must be the served one of the path.
    let mut old = claim("c");
    old["apiVersion"] = json!("ipam.cluster.x-k8s.io/v1beta1");
    let r = api.post(&claims(), &old).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "the API version in the data (ipam.cluster.x-k8s.io/v1beta1) does not match the expected API version (ipam.cluster.x-k8s.io/v1beta2)"
    );
    // A resourceVersion on create is refused, as etcd3 storage does.
    let mut with_rv = claim("c");
    with_rv["metadata"]["resourceVersion"] = json!("7");
    let r = api.post(&claims(), &with_rv).await;
    assert_eq!((r.status, r.reason()), (500, "InternalError"));
    // generateName.
    let mut generated = claim("");
    generated["metadata"]["generateName"] = json!("gen-");
    let r = api.post(&claims(), &generated).await;
    assert_eq!(r.status, 201);
    let name = r.body["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    // Not JSON.
    let r = api
        .send(
            "POST",
            &claims(),
            Some("application/json"),
            None,
            Some(api.kube.token()),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(api.kube.list(IPAM_GROUP, "ipaddressclaims").len(), 3);
    assert!(api.kube.schema_violations().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_scoped_pools_and_clusters() {
    let api = Api::start().await;
    let globals = FakeKube::path(METAL_GROUP, "globalmetalippools", Some("ignored"), None);
    assert_eq!(
        globals,
        "/apis/ipam.metal-ipam.dev/v1alpha1/globalmetalippools"
    );
    let body = json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
        "metadata": {"name": "shared-v6"},
        "spec": {"addresses": ["2001:db8:0:10::/64"], "prefix": 64, "gateway": "2001:db8:0:10::1"}
    });
    let r = api.post(&globals, &body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(r.body["metadata"].get("namespace").is_none());
    let r = api.get(&format!("{globals}/shared-v6")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["spec"]["prefix"], 64);
    assert!(api
        .kube
        .get(METAL_GROUP, "globalmetalippools", None, "shared-v6")
        .is_some());

    // Clusters have no CRD here: anything goes, but the basics are required.
    let clusters = FakeKube::path(CLUSTER_GROUP, "clusters", Some(NS), None);
    let cluster = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                         "metadata": {"name": "web"}, "spec": {"paused": true, "whatever": [1]}});
    let r = api.post(&clusters, &cluster).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["spec"]["whatever"], json!([1]));
    let r = api
        .post(
            &clusters,
            &json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {}}),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.body["details"]["causes"][0]["field"], "metadata.name");
    let r = api
        .post(&clusters, &json!({"metadata": {"name": "x"}}))
        .await;
    assert_eq!(r.status, 400);
}

// ---------------------------------------------------------------------------
// LIST
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn list_pages_read_a_consistent_snapshot() {
    let api = Api::start().await;
    for name in ["c-1", "c-2", "c-3", "c-4", "c-5"] {
        api.kube.create(claim(name));
    }
    let mut elsewhere = claim("c-0");
    elsewhere["metadata"]["namespace"] = json!("other");
    api.kube.create(elsewhere);

    // Unpaged: everything in the namespace, in name order.
    let r = api.get(&claims()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["kind"], "IPAddressClaimList");
    assert_eq!(r.body["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
    assert_eq!(r.body["metadata"]["resourceVersion"], "6");
    assert!(r.body["metadata"].get("continue").is_none());
    assert_eq!(names(&r.body), ["c-1", "c-2", "c-3", "c-4", "c-5"]);

    // The client asks for 100 but the server pages by 2.
    api.kube.set_list_page_size(2);
    let page1 = api.get(&format!("{}?limit=100", claims())).await.body;
    assert_eq!(names(&page1), ["c-1", "c-2"]);
    assert_eq!(page1["metadata"]["remainingItemCount"], 3);
    let token = page1["metadata"]["continue"].as_str().unwrap().to_owned();

    // Writes after the first page do not show in later pages.
    api.kube.create(claim("c-2a"));
    api.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "c-4");
    let page2 = api
        .get(&format!("{}?limit=100&continue={token}", claims()))
        .await
        .body;
    assert_eq!(names(&page2), ["c-3", "c-4"]);
    assert_eq!(page2["metadata"]["resourceVersion"], "6");
    let token2 = page2["metadata"]["continue"].as_str().unwrap();
    let page3 = api
        .get(&format!("{}?limit=100&continue={token2}", claims()))
        .await
        .body;
    assert_eq!(names(&page3), ["c-5"]);
    assert!(page3["metadata"].get("continue").is_none());

    // A fresh list sees the writes; the client's own smaller limit wins.
    let fresh = api.get(&format!("{}?limit=1", claims())).await.body;
    assert_eq!(names(&fresh), ["c-1"]);
    assert_eq!(fresh["metadata"]["resourceVersion"], "8");
    assert_eq!(fresh["metadata"]["remainingItemCount"], 4);
    api.kube.set_list_page_size(0);
    let all = api.get(&format!("{}?limit=500", claims())).await.body;
    assert_eq!(names(&all), ["c-1", "c-2", "c-2a", "c-3", "c-5"]);

    // All namespaces, ordered by namespace then name.
    let every = api
        .get(&FakeKube::path(IPAM_GROUP, "ipaddressclaims", None, None))
        .await
        .body;
    assert_eq!(names(&every), ["c-1", "c-2", "c-2a", "c-3", "c-5", "c-0"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_and_bad_continue_tokens() {
    let api = Api::start().await;
    for name in ["a", "b", "c"] {
        api.kube.create(claim(name));
    }
    let page = api.get(&format!("{}?limit=1", claims())).await.body;
    let token = page["metadata"]["continue"].as_str().unwrap().to_owned();

    // The token belongs to this list only.
    let r = api
        .get(&format!("{}?limit=1&continue={token}", addresses()))
        .await;
    assert_eq!(r.status, 400);

    api.kube.expire_continue_tokens();
    let r = api
        .get(&format!("{}?limit=1&continue={token}", claims()))
        .await;
    assert_eq!(r.status, 410);
    assert_eq!(r.reason(), "Expired");
    assert_eq!(r.body["code"], 410);
    assert_eq!(r.body["status"], "Failure");

    let r = api
        .get(&format!("{}?limit=1&continue=garbage!", claims()))
        .await;
    assert_eq!((r.status, r.reason()), (400, "BadRequest"));
    let r = api.get(&format!("{}?limit=ten", claims())).await;
    assert_eq!(r.status, 400);

    // Starting over works.
    let again = api.get(&format!("{}?limit=2", claims())).await.body;
    assert_eq!(names(&again), ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn label_and_field_selectors() {
    let api = Api::start().await;
    for (name, cluster) in [("a", "web"), ("b", "db"), ("c", "web"), ("d", "web")] {
        let mut c = claim(name);
        c["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": cluster});
        if name == "d" {
            c["metadata"]["labels"]["tier"] = json!("cp");
        }
        api.kube.create(c);
    }
    let sel = |q: &str| format!("{}?{q}", claims());
    let r = api
        .get(&sel("labelSelector=cluster.x-k8s.io%2Fcluster-name%3Dweb"))
        .await;
    assert_eq!(names(&r.body), ["a", "c", "d"]);
    let r = api
        .get(&sel(
            "labelSelector=cluster.x-k8s.io/cluster-name%3Dweb,tier",
        ))
        .await;
    assert_eq!(names(&r.body), ["d"]);
    let r = api
        .get(&sel("labelSelector=cluster.x-k8s.io/cluster-name!%3Dweb"))
        .await;
    assert_eq!(names(&r.body), ["b"]);
    let r = api
        .get(&sel(
            "labelSelector=cluster.x-k8s.io/cluster-name+in+(db,web),!tier",
        ))
        .await;
    assert_eq!(names(&r.body), ["a", "b", "c"]);
    let r = api.get(&sel("fieldSelector=metadata.name%3Dc")).await;
    assert_eq!(names(&r.body), ["c"]);
    let r = api.get(&sel("fieldSelector=spec.clusterName%3Dweb")).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "field label not supported: spec.clusterName"
    );
    let r = api.get(&sel("labelSelector=a%3Db%3Dc")).await;
    assert_eq!(r.status, 400);

    // Selectors with paging: pages are filled with matching items; no
    // remainingItemCount with a selector.
    let p1 = api
        .get(&sel(
            "limit=2&labelSelector=cluster.x-k8s.io/cluster-name%3Dweb",
        ))
        .await
        .body;
    assert_eq!(names(&p1), ["a", "c"]);
    assert!(p1["metadata"].get("remainingItemCount").is_none());
    let token = p1["metadata"]["continue"].as_str().unwrap();
    let p2 = api
        .get(&sel(&format!(
            "limit=2&labelSelector=cluster.x-k8s.io/cluster-name%3Dweb&continue={token}"
        )))
        .await
        .body;
    assert_eq!(names(&p2), ["d"]);
    assert!(p2["metadata"].get("continue").is_none());
}

// ---------------------------------------------------------------------------
// PUT and PATCH
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn put_needs_the_current_resource_version() {
    let api = Api::start().await;
    let created = api.post(&claims(), &claim("a")).await.body;
    let path = claim_path("a");

    let mut edit = created.clone();
    edit["spec"]["clusterName"] = json!("web2");
    let mut stale = edit.clone();
    stale["metadata"]["resourceVersion"] = json!("0");
    let r = api.put(&path, &stale).await;
    assert_eq!((r.status, r.reason()), (409, "Conflict"));
    assert_eq!(
        r.body["message"],
        "Operation cannot be fulfilled on ipaddressclaims.ipam.cluster.x-k8s.io \"a\": \
         the object has been modified; please apply your changes to the latest version and try again"
    );
    let mut unconditional = edit.clone();
    unconditional["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let r = api.put(&path, &unconditional).await;
    assert_eq!((r.status, r.reason()), (422, "Invalid"));
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "metadata.resourceVersion"
    );
    assert!(
        api.kube.schema_violations().is_empty(),
        "not a schema violation"
    );

    // A spec change bumps generation and resourceVersion.
    let r = api.put(&path, &edit).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let updated = r.body;
    assert_eq!(updated["spec"]["clusterName"], "web2");
    assert_eq!(updated["metadata"]["generation"], 2);
    assert_eq!(rv(&updated), rv(&created) + 1);
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
    // The old version now conflicts.
    assert_eq!(api.put(&path, &edit).await.status, 409);

    // A metadata-only change does not bump generation.
    let mut labelled = updated.clone();
    labelled["metadata"]["labels"]["x"] = json!("y");
    let r = api.put(&path, &labelled).await.body;
    assert_eq!(r["metadata"]["generation"], 2);
    assert_eq!(rv(&r), rv(&updated) + 1);
    // A no-op write does not bump resourceVersion.
    let again = api.put(&path, &r).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, r);
    assert_eq!(api.kube.resource_version(), rv(&r));

    // uid is immutable, creationTimestamp silently kept, name must match.
    let mut bad_uid = r.clone();
    bad_uid["metadata"]["uid"] = json!("00000000-0000-4000-8000-000000000000");
    let res = api.put(&path, &bad_uid).await;
    assert_eq!(res.status, 422);
    assert_eq!(res.body["details"]["causes"][0]["field"], "metadata.uid");
    let mut old_ts = r.clone();
    old_ts["metadata"]["creationTimestamp"] = json!("2000-01-01T00:00:00Z");
    old_ts["metadata"]["labels"]["x"] = json!("z");
    let res = api.put(&path, &old_ts).await;
    assert_eq!(res.status, 200);
    assert_eq!(
        res.body["metadata"]["creationTimestamp"],
        created["metadata"]["creationTimestamp"]
    );
    let res = api.put(&claim_path("b"), &old_ts).await;
    assert_eq!(res.status, 400);
    let mut ghost = claim("ghost");
    ghost["metadata"]["resourceVersion"] = json!("1");
    assert_eq!(api.put(&claim_path("ghost"), &ghost).await.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn merge_patch_resource_version_is_a_precondition() {
    let api = Api::start().await;
    let created = api.kube.create(claim("a"));
    let path = claim_path("a");
    let finalizer = json!({"metadata": {"finalizers": ["ipam.metal-ipam.dev/release"]}});

    let mut stale = finalizer.clone();
    stale["metadata"]["resourceVersion"] = json!("999");
    let r = api.patch(&path, MERGE, &stale).await;
    assert_eq!((r.status, r.reason()), (409, "Conflict"));
    assert!(api
        .kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "a")
        .unwrap()["metadata"]
        .get("finalizers")
        .is_none());

    let mut current = finalizer.clone();
    current["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    let r = api.patch(&path, MERGE, &current).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["metadata"]["finalizers"],
        json!(["ipam.metal-ipam.dev/release"])
    );
    assert_eq!(r.body["metadata"]["generation"], 1);
    // The same precondition is now stale.
    assert_eq!(api.patch(&path, MERGE, &current).await.status, 409);
    // Without a resourceVersion the patch applies to whatever is stored.
    let r = api
        .patch(
            &path,
            MERGE,
            &json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": null}}}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(r.body["metadata"]
        .get("labels")
        .unwrap()
        .as_object()
        .unwrap()
        .is_empty());
    // A patch that breaks the schema is refused.
    let r = api
        .patch(
            &path,
            MERGE,
            &json!({"spec": {"poolRef": {"kind": "bad kind"}}}),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(api.kube.schema_violations().len(), 1);
    assert_eq!(
        api.patch(&claim_path("nope"), MERGE, &finalizer)
            .await
            .status,
        404
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn json_patch_and_patch_types() {
    let api = Api::start().await;
    let created = api.kube.create(claim("a"));
    let path = claim_path("a");
    let ops = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": created["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/metadata/finalizers", "value": ["ipam.metal-ipam.dev/release"]}
    ]);
    let r = api.patch(&path, JSON_PATCH, &ops).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["metadata"]["finalizers"],
        json!(["ipam.metal-ipam.dev/release"])
    );
    // The same test op now fails: 422, nothing written.
    let before = api.kube.resource_version();
    let r = api.patch(&path, JSON_PATCH, &ops).await;
    assert_eq!((r.status, r.reason()), (422, "Invalid"));
    assert!(r.body["message"].as_str().unwrap().contains("test failed"));
    assert_eq!(api.kube.resource_version(), before);
    let r = api
        .patch(
            &path,
            JSON_PATCH,
            &json!([{"op": "remove", "path": "/metadata/annotations"}]),
        )
        .await;
    assert_eq!(r.status, 422);
    let r = api
        .patch(
            &path,
            JSON_PATCH,
            &json!([{"op": "replace", "path": "/metadata/finalizers/0", "value": "x.io/y"}]),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["metadata"]["finalizers"], json!(["x.io/y"]));
    let r = api.patch(&path, JSON_PATCH, &json!({"op": "add"})).await;
    assert_eq!(r.status, 400);

    for ct in [
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "text/plain",
    ] {
        let r = api.patch(&path, ct, &json!({})).await;
        assert_eq!(
            (r.status, r.reason()),
            (415, "UnsupportedMediaType"),
            "{ct}"
        );
    }
    let r = api.call("PATCH", &path, None, Some(&json!({}))).await;
    assert_eq!(r.status, 415);
    // Parameters on the media type are fine.
    let r = api
        .patch(
            &path,
            "application/merge-patch+json; charset=utf-8",
            &json!({"metadata": {"annotations": {"a": "b"}}}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(api.kube.schema_violations().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn status_is_a_subresource_both_ways() {
    let api = Api::start().await;
    let created = api.kube.create(claim("a"));
    let path = claim_path("a");
    let status_path = format!("{path}/status");
    let status = json!({"addressRef": {"name": "a"}, "conditions": [ready("AddressAllocated")]});

    // Status through the main resource is ignored…
    let mut with_status = created.clone();
    with_status["status"] = status.clone();
    let r = api.put(&path, &with_status).await;
    assert_eq!(r.status, 200);
    assert!(r.body.get("status").is_none());
    assert_eq!(
        rv(&r.body),
        rv(&created),
        "nothing changed, nothing written"
    );
    let r = api.patch(&path, MERGE, &json!({"status": status})).await;
    assert_eq!(r.status, 200);
    assert!(r.body.get("status").is_none());

    // …and only status is taken on /status.
    let r = api
        .patch(
            &status_path,
            MERGE,
            &json!({"metadata": {"labels": {"new": "label"}}, "spec": {"clusterName": "other"},
                    "status": status}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], status);
    assert_eq!(r.body["spec"]["clusterName"], "web");
    assert!(r.body["metadata"]["labels"].get("new").is_none());
    assert_eq!(
        r.body["metadata"]["generation"], 1,
        "status does not bump generation"
    );
    let after_status = r.body;

    // Spec changes through the main resource keep the status.
    let r = api
        .patch(&path, MERGE, &json!({"spec": {"clusterName": "web2"}}))
        .await;
    assert_eq!(r.body["status"], status);
    assert_eq!(r.body["metadata"]["generation"], 2);

    // PUT /status with a stale resourceVersion conflicts; a current one works.
    let mut put = after_status.clone();
    put["status"]["addressRef"]["name"] = json!("b");
    assert_eq!(api.put(&status_path, &put).await.status, 409);
    put["metadata"]["resourceVersion"] = r.body["metadata"]["resourceVersion"].clone();
    put["spec"]["clusterName"] = json!("ignored");
    let r = api.put(&status_path, &put).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"]["addressRef"]["name"], "b");
    assert_eq!(r.body["spec"]["clusterName"], "web2");
    // GET /status returns the whole object.
    let got = api.get(&status_path).await;
    assert_eq!(got.body, r.body);

    // Status is validated: a condition without a reason.
    let mut bad = ready("X");
    bad.as_object_mut().unwrap().remove("reason");
    let r = api
        .patch(
            &status_path,
            MERGE,
            &json!({"status": {"conditions": [bad]}}),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "status.conditions[0].reason"
    );
    assert_eq!(
        r.body["details"]["causes"][0]["reason"],
        "FieldValueRequired"
    );
    let violations = api.kube.schema_violations();
    assert_eq!(violations.len(), 1);
    assert!(
        violations[0].starts_with(&format!("PATCH {status_path}: ")),
        "{violations:?}"
    );

    // Pools have a status subresource too.
    api.kube.create(pool("web-v4"));
    let pool_status =
        FakeKube::path(METAL_GROUP, "metalippools", Some(NS), Some("web-v4")) + "/status";
    let r = api
        .patch(&pool_status, MERGE, &json!({"status": {"ipAddresses": {"total": 90, "used": 0, "free": 90, "outOfRange": 0}}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"]["ipAddresses"]["free"], 90);
}

// ---------------------------------------------------------------------------
// DELETE, finalizers, garbage collection
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn finalizers_hold_deletion_until_removed() {
    let api = Api::start().await;
    let mut c = claim("a");
    c["metadata"]["finalizers"] = json!(["ipam.metal-ipam.dev/release"]);
    let created = api.kube.create(c);
    let path = claim_path("a");

    // Preconditions.
    let r = api
        .delete(
            &path,
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1",
                                    "preconditions": {"uid": "not-the-uid"}})),
        )
        .await;
    assert_eq!((r.status, r.reason()), (409, "Conflict"));
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("Precondition failed: UID"));
    let r = api
        .delete(
            &path,
            Some(&json!({"preconditions": {"resourceVersion": "12345"}})),
        )
        .await;
    assert_eq!(r.status, 409);

    let r = api
        .delete(&path, Some(&json!({"preconditions": {"uid": created["metadata"]["uid"],
                                                      "resourceVersion": created["metadata"]["resourceVersion"]}})))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let deleting = r.body;
    assert_eq!(
        deleting["kind"], "IPAddressClaim",
        "the object, not a Status"
    );
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(deleting["metadata"]["deletionGracePeriodSeconds"], 0);
    assert_eq!(deleting["metadata"]["generation"], 2);
    assert_eq!(rv(&deleting), rv(&created) + 1);
    assert_eq!(api.get(&path).await.body, deleting);

    // Deleting again changes nothing.
    let r = api.delete(&path, None).await;
    assert_eq!((r.status, rv(&r.body)), (200, rv(&deleting)));

    // No new finalizers while deleting; the deletionTimestamp cannot be changed.
    let r = api
        .patch(
            &path,
            MERGE,
            &json!({"metadata": {"finalizers": ["ipam.metal-ipam.dev/release", "x.io/more"]}}),
        )
        .await;
    assert_eq!((r.status, r.reason()), (422, "Invalid"));
    assert_eq!(
        r.body["details"]["causes"][0]["reason"],
        "FieldValueForbidden"
    );
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("no new finalizers"));
    let r = api
        .patch(&path, MERGE, &json!({"metadata": {"deletionTimestamp": "2000-01-01T00:00:00Z", "labels": {"k": "v"}}}))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body["metadata"]["deletionTimestamp"],
        deleting["metadata"]["deletionTimestamp"]
    );
    // Status can still be written while deleting.
    let r = api
        .patch(
            &format!("{path}/status"),
            MERGE,
            &json!({"status": {"addressRef": {"name": "a"}}}),
        )
        .await;
    assert_eq!(r.status, 200);

    // Removing the last finalizer removes the object.
    let r = api
        .patch(&path, MERGE, &json!({"metadata": {"finalizers": null}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body["metadata"].get("finalizers").is_none());
    assert_eq!(api.get(&path).await.status, 404);
    assert!(api
        .kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "a")
        .is_none());
    assert!(api.kube.schema_violations().is_empty());

    // A deletionTimestamp cannot be set by an update.
    let plain = api.kube.create(claim("b"));
    let mut forged = plain.clone();
    forged["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    assert_eq!(api.put(&claim_path("b"), &forged).await.status, 422);

    // Without finalizers DELETE removes at once and answers a Success Status.
    let r = api.delete(&claim_path("b"), None).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
               "details": {"name": "b", "group": "ipam.cluster.x-k8s.io", "kind": "ipaddressclaims",
                           "uid": plain["metadata"]["uid"]}})
    );
    assert_eq!(api.delete(&claim_path("b"), None).await.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_collection_follows_owner_references() {
    let api = Api::start().await;
    let pool = api.kube.create(pool("web-v4"));
    let claim_a = api.kube.create(claim("a"));
    let claim_b = api.kube.create(claim("b"));
    // a: owned by its claim and the pool (as the contract wants).
    api.kube.create(address(
        "a",
        "192.0.2.10",
        &[owner(&claim_a, true), owner(&pool, false)],
    ));
    // b: owned only by its claim, with a protecting finalizer.
    let mut addr_b = address("b", "192.0.2.11", &[owner(&claim_b, true)]);
    addr_b["metadata"]["finalizers"] = json!(["ipam.cluster.x-k8s.io/protect-address"]);
    api.kube.create(addr_b);

    // Claim a goes: its address survives (the pool still owns it), minus the dangling reference.
    let before = api
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "a")
        .unwrap();
    assert_eq!(api.delete(&claim_path("a"), None).await.status, 200);
    let a = api.get(&address_path("a")).await.body;
    assert_eq!(
        a["metadata"]["ownerReferences"],
        json!([owner(&pool, false)])
    );
    assert!(rv(&a) > rv(&before));

    // Claim b goes: its address is deleted, but held by its finalizer.
    assert_eq!(api.delete(&claim_path("b"), None).await.status, 200);
    let b = api.get(&address_path("b")).await.body;
    assert!(b["metadata"]["deletionTimestamp"].is_string(), "{b}");
    let r = api
        .patch(
            &address_path("b"),
            JSON_PATCH,
            &json!([{"op": "remove", "path": "/metadata/finalizers"}]),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(api.get(&address_path("b")).await.status, 404);

    // The pool goes: its last dependent goes with it.
    assert_eq!(
        api.delete(
            &FakeKube::path(METAL_GROUP, "metalippools", Some(NS), Some("web-v4")),
            None
        )
        .await
        .status,
        200
    );
    assert_eq!(api.get(&address_path("a")).await.status, 404);
    assert!(api.kube.list(IPAM_GROUP, "ipaddresses").is_empty());

    // Chains: Cluster → claim → address, collected transitively.
    let cluster = api.kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                                          "metadata": {"name": "web", "namespace": NS}}),
    );
    let mut c = claim("c");
    c["metadata"]["ownerReferences"] = json!([owner(&cluster, false)]);
    let c = api.kube.create(c);
    api.kube
        .create(address("c", "192.0.2.12", &[owner(&c, true)]));
    let r = api
        .delete(
            &FakeKube::path(CLUSTER_GROUP, "clusters", Some(NS), Some("web")),
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(api.kube.list(IPAM_GROUP, "ipaddressclaims").is_empty());
    assert!(api.kube.list(IPAM_GROUP, "ipaddresses").is_empty());

    // Orphan: the dependent stays and loses its reference.
    let d = api.kube.create(claim("d"));
    api.kube
        .create(address("d", "192.0.2.13", &[owner(&d, true)]));
    let r = api
        .delete(
            &claim_path("d"),
            Some(&json!({"propagationPolicy": "Orphan"})),
        )
        .await;
    assert_eq!(r.status, 200);
    let orphan = api
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "d")
        .unwrap();
    assert_eq!(orphan["metadata"]["ownerReferences"], json!([]));
    let r = api
        .delete(
            &address_path("d"),
            Some(&json!({"propagationPolicy": "Foreground"})),
        )
        .await;
    assert_eq!(r.status, 400);

    // Owners that never existed are collected by a full pass.
    api.kube.create(address(
        "e",
        "192.0.2.14",
        &[json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "name": "e", "uid": "11111111-1111-4111-8111-111111111111"})],
    ));
    assert!(api
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "e")
        .is_some());
    api.kube.collect_garbage();
    assert!(api
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "e")
        .is_none());
    assert!(api
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "d")
        .is_some());
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn invalid_objects_are_refused_and_logged() {
    let api = Api::start().await;
    let mut bad = address("a", "192.0.2.10", &[]);
    bad["spec"]["prefix"] = json!(200);
    bad["spec"]["poolRef"]
        .as_object_mut()
        .unwrap()
        .remove("apiGroup");
    let r = api.post(&addresses(), &bad).await;
    assert_eq!((r.status, r.reason()), (422, "Invalid"));
    assert_eq!(r.body["details"]["kind"], "IPAddress");
    assert_eq!(r.body["details"]["group"], "ipam.cluster.x-k8s.io");
    assert_eq!(r.body["details"]["name"], "a");
    let fields: Vec<&str> = r.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["spec.poolRef.apiGroup", "spec.prefix"]);
    let message = r.body["message"].as_str().unwrap();
    assert!(
        message.starts_with("IPAddress.ipam.cluster.x-k8s.io \"a\" is invalid: ["),
        "{message}"
    );
    assert!(api
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "a")
        .is_none());

    let violations = api.kube.schema_violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].starts_with(&format!("POST {}: ", addresses())));
    assert!(
        violations[0].contains("spec.prefix") && violations[0].contains("spec.poolRef.apiGroup")
    );

    // Unknown fields, bad names and metadata.
    let mut typo = address("b", "192.0.2.11", &[]);
    typo["spec"]["gatway"] = json!("192.0.2.1");
    let r = api.post(&addresses(), &typo).await;
    assert_eq!(r.body["details"]["causes"][0]["field"], "spec.gatway");
    assert_eq!(
        r.body["details"]["causes"][0]["reason"],
        "FieldValueUnknown"
    );
    let r = api
        .post(&addresses(), &address("Bad_Name", "192.0.2.12", &[]))
        .await;
    assert_eq!(r.body["details"]["causes"][0]["field"], "metadata.name");
    let mut label = address("c", "192.0.2.13", &[]);
    label["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": "not a value"});
    assert_eq!(api.post(&addresses(), &label).await.status, 422);
    let no_uid = address(
        "d",
        "192.0.2.14",
        &[json!({"apiVersion": "v1", "kind": "X", "name": "x"})],
    );
    let r = api.post(&addresses(), &no_uid).await;
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "metadata.ownerReferences[0].uid"
    );
    let two_controllers = address(
        "e",
        "192.0.2.15",
        &[
            json!({"apiVersion": "v1", "kind": "X", "name": "x", "uid": "1", "controller": true}),
            json!({"apiVersion": "v1", "kind": "X", "name": "y", "uid": "2", "controller": true}),
        ],
    );
    assert_eq!(api.post(&addresses(), &two_controllers).await.status, 422);
    let mut finalizer = address("f", "192.0.2.16", &[]);
    finalizer["metadata"]["finalizers"] = json!(["not a finalizer"]);
    assert_eq!(api.post(&addresses(), &finalizer).await.status, 422);
    assert_eq!(api.kube.schema_violations().len(), 7);

    // The seeding API validates too, without logging.
    let err = api.kube.try_create(bad).unwrap_err();
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert_eq!(api.kube.schema_violations().len(), 7);
    // A valid address goes through.
    assert_eq!(
        api.post(&addresses(), &address("ok", "192.0.2.17", &[]))
            .await
            .status,
        201
    );
}

// ---------------------------------------------------------------------------
// Faults, recording
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn injected_faults() {
    let api = Api::start().await;
    api.kube.fail_next("POST", "/ipaddresses", 2, 409);
    api.kube.fail_next("*", "/ipaddressclaims/a", 1, 429);
    let body = address("a", "192.0.2.10", &[]);
    let r = api.post(&addresses(), &body).await;
    assert_eq!((r.status, r.reason()), (409, "Conflict"));
    assert_eq!(api.post(&addresses(), &body).await.status, 409);
    assert!(
        api.kube.list(IPAM_GROUP, "ipaddresses").is_empty(),
        "failed before applying"
    );
    // Other methods and paths are untouched by the first fault.
    assert_eq!(api.get(&addresses()).await.status, 200);
    assert_eq!(api.post(&addresses(), &body).await.status, 201);

    let r = api.get(&claim_path("a")).await;
    assert_eq!((r.status, r.reason()), (429, "TooManyRequests"));
    assert_eq!(r.headers.get("retry-after").unwrap(), "1");
    assert_eq!(r.body["details"]["retryAfterSeconds"], 1);
    assert_eq!(api.get(&claim_path("a")).await.status, 404, "only once");

    // A fault after applying: the write happened, the client saw a 500.
    api.kube
        .fail_next_after_apply("POST", "/ipaddressclaims", 1, 500);
    let r = api.post(&claims(), &claim("a")).await;
    assert_eq!((r.status, r.reason()), (500, "InternalError"));
    assert!(api
        .kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "a")
        .is_some());
    let r = api.post(&claims(), &claim("a")).await;
    assert_eq!(r.reason(), "AlreadyExists");

    api.kube.fail_next("PATCH", "/status", 1, 503);
    let r = api
        .patch(
            &format!("{}/status", claim_path("a")),
            MERGE,
            &json!({"status": {"addressRef": {"name": "a"}}}),
        )
        .await;
    assert_eq!((r.status, r.reason()), (503, "ServiceUnavailable"));
    assert!(api
        .kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "a")
        .unwrap()
        .get("status")
        .is_none());

    let statuses: Vec<u16> = api.kube.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [409, 409, 200, 201, 429, 404, 500, 409, 503]);
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_are_recorded_in_order() {
    let api = Api::start().await;
    let c = api.kube.create(claim("web-cp-0"));
    let path = claim_path("web-cp-0");
    // What a reconcile does: finalizer, IPAddress, status.
    let finalizer = json!({"metadata": {"finalizers": ["ipam.metal-ipam.dev/release"],
                                        "resourceVersion": c["metadata"]["resourceVersion"]}});
    assert_eq!(api.get(&path).await.status, 200);
    assert_eq!(api.patch(&path, MERGE, &finalizer).await.status, 200);
    let addr = address("web-cp-0", "192.0.2.10", &[owner(&c, true)]);
    assert_eq!(api.post(&addresses(), &addr).await.status, 201);
    let status = json!({"status": {"addressRef": {"name": "web-cp-0"}, "conditions": [ready("AddressAllocated")]}});
    assert_eq!(
        api.patch(&format!("{path}/status"), MERGE, &status)
            .await
            .status,
        200
    );
    let q = format!("{}?limit=10&labelSelector=a%3Db", addresses());
    assert_eq!(api.get(&q).await.status, 200);

    let requests = api.kube.requests();
    let lines: Vec<String> = requests.iter().map(|r| r.line()).collect();
    assert_eq!(
        lines,
        [
            format!("GET {path}"),
            format!("PATCH {path}"),
            format!("POST {}", addresses()),
            format!("PATCH {path}/status"),
            format!("GET {}", addresses()),
        ]
    );
    assert_eq!(requests[1].content_type.as_deref(), Some(MERGE));
    assert_eq!(requests[1].body.as_ref(), Some(&finalizer));
    assert_eq!(requests[2].body.as_ref(), Some(&addr));
    assert_eq!(requests[2].status, 201);
    assert_eq!(requests[0].body, None);
    assert_eq!(requests[0].query, None);
    assert_eq!(
        requests[4].query.as_deref(),
        Some("limit=10&labelSelector=a%3Db")
    );
    let writes: Vec<String> = api.kube.writes().iter().map(|r| r.method.clone()).collect();
    assert_eq!(writes, ["PATCH", "POST", "PATCH"]);

    // The stored objects are what the requests made.
    let stored = api
        .kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "web-cp-0")
        .unwrap();
    assert_eq!(stored["status"]["addressRef"]["name"], "web-cp-0");
    assert_eq!(
        stored["metadata"]["finalizers"],
        json!(["ipam.metal-ipam.dev/release"])
    );
    assert!(api.kube.schema_violations().is_empty());

    api.kube.clear_requests();
    assert!(api.kube.requests().is_empty());
    api.get(&path).await;
    assert_eq!(api.kube.requests().len(), 1);
}

// ---------------------------------------------------------------------------
// The seeding API
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn seeding_api_has_the_same_semantics() {
    let api = Api::start().await;
    let kube = &api.kube;
    let created = kube.create(claim("a"));
    assert_eq!(kube.resource_version(), 1);
    assert_eq!(created["metadata"]["generation"], 1);
    let err = kube.try_create(claim("a")).unwrap_err();
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(err.status()["code"], 409);
    let mut no_ns = claim("x");
    no_ns["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    assert_eq!(kube.try_create(no_ns).unwrap_err().code, 400);
    let unknown =
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS}});
    assert_eq!(kube.try_create(unknown).unwrap_err().code, 400);

    // put: a direct overwrite, status included, no precondition.
    let mut edit = created.clone();
    edit["metadata"]["resourceVersion"] = json!("stale");
    edit["metadata"]["uid"] = json!("ignored");
    edit["status"] = json!({"addressRef": {"name": "a"}});
    let put = kube.put(edit);
    assert_eq!(put["status"]["addressRef"]["name"], "a");
    assert_eq!(put["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(put["metadata"]["generation"], 1);
    assert_eq!(rv(&put), 2);
    assert_eq!(api.get(&claim_path("a")).await.body, put);
    assert_eq!(kube.try_put(claim("ghost")).unwrap_err().code, 404);
    let mut invalid = put.clone();
    invalid["spec"]["poolRef"]["kind"] = json!("");
    assert_eq!(kube.try_put(invalid).unwrap_err().code, 422);

    // delete honours finalizers.
    let mut held = put.clone();
    held["metadata"]["finalizers"] = json!(["ipam.metal-ipam.dev/release"]);
    kube.put(held);
    let outcome = kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "a")
        .unwrap();
    let DeleteOutcome::Finalizing(obj) = &outcome else {
        panic!("{outcome:?}")
    };
    assert!(obj["metadata"]["deletionTimestamp"].is_string());
    let mut more = obj.clone();
    more["metadata"]["finalizers"] = json!(["ipam.metal-ipam.dev/release", "x.io/y"]);
    assert_eq!(kube.try_put(more).unwrap_err().code, 422);
    let mut done = obj.clone();
    done["metadata"]["finalizers"] = json!([]);
    kube.put(done);
    assert!(kube
        .get(IPAM_GROUP, "ipaddressclaims", Some(NS), "a")
        .is_none());
    let outcome = kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "a");
    assert_eq!(outcome, None);

    kube.create(claim("b"));
    let outcome = kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "b")
        .unwrap();
    assert!(matches!(outcome, DeleteOutcome::Removed(_)));
    assert_eq!(outcome.object()["metadata"]["name"], "b");
    assert!(kube.list(IPAM_GROUP, "ipaddressclaims").is_empty());
    // Seeding is not recorded: only the one GET above is.
    let lines: Vec<String> = kube.requests().iter().map(|r| r.line()).collect();
    assert_eq!(lines, [format!("GET {}", claim_path("a"))]);
}

/// A write that does not ask for `fieldValidation=Strict` is listed: a
/// real API server would prune the unknown fields FakeKube refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_without_strict_field_validation_are_listed() {
    let api = Api::start().await;
    let strict = format!("{}?fieldValidation=Strict", addresses());
    let r = api.post(&strict, &address("a", "192.0.2.10", &[])).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(api.kube.lax_writes().is_empty());
    let r = api
        .post(&addresses(), &address("b", "192.0.2.11", &[]))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let lax = api.kube.lax_writes();
    assert_eq!(lax.len(), 1, "{lax:?}");
    assert!(
        lax[0].starts_with(&format!("POST {}: ", addresses())),
        "{lax:?}"
    );
    // Reads are not writes.
    api.send("GET", &addresses(), None, None, Some(api.kube.token()))
        .await;
    assert_eq!(api.kube.lax_writes().len(), 1);
}
