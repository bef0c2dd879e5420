//! Valid seed documents of every request format, shaped like those in the
//! tests (`functions/core/tests/*.rs`) and like what the API server and the
//! event forwarders send. The fuzzer mutates these.

use serde_json::{json, Value};

use super::mutate::base64;
use super::EVENTS_TOKEN;

/// The CloudEvents `source` Knative's ApiServerSource sends.
pub const SOURCE: &str = "https://10.96.0.1:443";

/// Every seed, by format.
#[derive(Debug, Clone)]
pub struct Seeds {
    /// `IPAddressClaim`s for `POST /v1/claims`.
    pub claims: Vec<Value>,
    /// Pool objects for `PUT /v1/pools/…` and `/v1/global-pools/…`.
    pub pools: Vec<Value>,
    /// `AdmissionReview`s for `POST /v1/admission/pools`.
    pub reviews: Vec<Value>,
    /// Kubernetes watch events.
    pub watch: Vec<Value>,
    /// Argo Events resource events.
    pub argo: Vec<Value>,
    /// Structured-mode CloudEvents.
    pub structured: Vec<Value>,
    /// Binary-mode CloudEvents: headers and the body document.
    pub binary: Vec<(Vec<(String, String)>, Value)>,
    /// Every document above, as donors of subtrees.
    pub donors: Vec<Value>,
}

/// An `IPAddressClaim`.
pub fn claim(version: &str, ns: &str, name: &str, uid: &str, kind: &str, pool: &str) -> Value {
    json!({
        "apiVersion": format!("ipam.cluster.x-k8s.io/{version}"),
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": kind, "name": pool}}
    })
}

/// A claim of `team-a` asking for `address` of pool `nodes`.
fn requested(name: &str, address: &str) -> Value {
    let mut c = claim(
        "v1beta2",
        "team-a",
        name,
        &format!("u-{name}"),
        "MetalIPPool",
        "nodes",
    );
    c["metadata"]["annotations"] = json!({"ipam.metal-ipam.dev/requested-address": address});
    c
}

/// A claim as the API server returns it.
fn full_claim() -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {
            "name": "worker-0", "namespace": "team-a", "uid": "6a1f0c2e-1111-4e0b-9d52-7f2f6b1e9a10",
            "resourceVersion": "48213", "generation": 1,
            "creationTimestamp": "2026-09-01T10:00:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
            "annotations": {"ipam.metal-ipam.dev/requested-address": "10.20.0.77"},
            "finalizers": ["ipam.metal-ipam.dev/release-address"],
            "managedFields": [{"manager": "capi", "operation": "Update",
                "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {}}}]
        },
        "spec": {"clusterName": "c1",
            "poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "nodes"}},
        "status": {}
    })
}

/// A pool object.
pub fn pool(ns: Option<&str>, name: &str, spec: Value) -> Value {
    let (kind, metadata) = match ns {
        Some(ns) => ("MetalIPPool", json!({"name": name, "namespace": ns})),
        None => ("GlobalMetalIPPool", json!({"name": name})),
    };
    json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": kind,
        "metadata": metadata, "spec": spec})
}

/// The spec of the stored pool `team-a/nodes`.
pub fn nodes_spec() -> Value {
    json!({"addresses": ["10.20.0.0/24"], "prefix": 24, "gateway": "10.20.0.1",
        "excludedAddresses": ["10.20.0.200-10.20.0.250"],
        "addressReuseGracePeriodSeconds": 300,
        "preAllocations": {"worker-pre": "10.20.0.20"}})
}

fn with_k8s_metadata(mut obj: Value, uid: &str) -> Value {
    obj["metadata"]["uid"] = json!(uid);
    obj["metadata"]["resourceVersion"] = json!("12");
    obj["metadata"]["generation"] = json!(1);
    obj["metadata"]["finalizers"] = json!(["ipam.metal-ipam.dev/protect-pool"]);
    obj
}

/// An `AdmissionReview` as the API server sends it.
fn review(
    op: &str,
    ns: Option<&str>,
    name: &str,
    object: Option<Value>,
    old: Option<Value>,
) -> Value {
    let kind = if ns.is_some() {
        "MetalIPPool"
    } else {
        "GlobalMetalIPPool"
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1",
                "resource": if ns.is_some() { "metalippools" } else { "globalmetalippools" }},
            "name": name,
            "namespace": ns.unwrap_or(""),
            "operation": op,
            "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

fn ip_address() -> Value {
    json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
        "metadata": {"name": "worker-bound", "namespace": "team-a",
            "ownerReferences": [{"apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
                "kind": "IPAddressClaim", "name": "worker-bound", "uid": "u-bound", "controller": true}]},
        "spec": {"address": "10.20.0.2", "prefix": 24, "gateway": "10.20.0.1",
            "claimRef": {"name": "worker-bound"},
            "poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "nodes"}}})
}

fn reference(api_version: &str, kind: &str, ns: Option<&str>, name: &str) -> Value {
    let mut r = json!({"apiVersion": api_version, "kind": kind, "name": name});
    if let Some(ns) = ns {
        r["namespace"] = json!(ns);
    }
    r
}

fn structured(ce_type: &str, data: Option<Value>, token: bool) -> Value {
    let mut e = json!({
        "specversion": "1.0", "type": ce_type, "source": SOURCE,
        "id": "5d3c1c0a-8f0e-4d8e-9d3b-2f4e1c7a9b00", "time": "2026-09-01T10:00:01Z",
        "subject": "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/team-a/ipaddressclaims/worker-0",
        "datacontenttype": "application/json"
    });
    if let Some(d) = data {
        for (attr, member) in [
            ("kind", "kind"),
            ("apiversion", "apiVersion"),
            ("name", "name"),
            ("namespace", "namespace"),
        ] {
            let v = d
                .get(member)
                .or_else(|| d.get("metadata").and_then(|m| m.get(member)));
            if let Some(v) = v {
                e[attr] = v.clone();
            }
        }
        e["data"] = d;
    }
    if token {
        e["metalipamtoken"] = json!(EVENTS_TOKEN);
    }
    e
}

fn binary_headers(
    ce_type: &str,
    kind: &str,
    api_version: &str,
    ns: &str,
    name: &str,
) -> Vec<(String, String)> {
    let mut h = vec![
        ("ce-specversion", "1.0".to_string()),
        ("ce-id", "0c9a7b5e-2f4d-4f7a-b2a4-0d6c3f1e8b21".to_string()),
        ("ce-time", "2026-09-01T10:00:01.123Z".to_string()),
        ("ce-type", ce_type.to_string()),
        ("ce-source", SOURCE.to_string()),
        (
            "ce-subject",
            format!("/apis/{api_version}/namespaces/{ns}/ipaddressclaims/{name}"),
        ),
        ("ce-kind", kind.to_string()),
        ("ce-apiversion", api_version.to_string()),
        ("ce-name", name.to_string()),
        ("ce-metalipamtoken", EVENTS_TOKEN.to_string()),
    ];
    if !ns.is_empty() {
        h.push(("ce-namespace", ns.to_string()));
    }
    h.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

impl Seeds {
    /// Builds every seed.
    pub fn new() -> Seeds {
        let claims = vec![
            {
                let mut c = claim(
                    "v1beta2",
                    "team-a",
                    "worker-0",
                    "u-0",
                    "MetalIPPool",
                    "nodes",
                );
                c["spec"]["clusterName"] = json!("c1");
                c["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": "c1"});
                c
            },
            claim(
                "v1beta1",
                "team-a",
                "worker-1",
                "u-1",
                "MetalIPPool",
                "nodes",
            ),
            {
                let mut c = claim(
                    "v1beta1",
                    "team-a",
                    "worker-2",
                    "u-2",
                    "MetalIPPool",
                    "nodes",
                );
                c["spec"]["poolRef"]
                    .as_object_mut()
                    .map(|m| m.remove("apiGroup"));
                c
            },
            claim(
                "v1beta2",
                "team-b",
                "edge-1",
                "u-e1",
                "GlobalMetalIPPool",
                "edge",
            ),
            claim(
                "v1beta2",
                "team-b",
                "v6-0",
                "u-v6",
                "GlobalMetalIPPool",
                "v6",
            ),
            {
                let mut c = claim(
                    "v1beta2",
                    "team-a",
                    "worker-3",
                    "u-3",
                    "MetalIPPool",
                    "nodes",
                );
                c["metadata"]["annotations"] =
                    json!({"ipam.metal-ipam.dev/requested-address": "10.20.0.50"});
                c
            },
            requested("worker-5", "10.20.0.2"),
            requested("worker-6", "10.20.0.1"),
            requested("worker-7", "10.99.0.1"),
            requested("worker-8", "10.20.0.20"),
            requested("worker-pre", "10.20.0.21"),
            claim(
                "v1beta2",
                "team-a",
                "worker-bound",
                "u-bound",
                "MetalIPPool",
                "nodes",
            ),
            claim(
                "v1beta2",
                "team-a",
                "worker-bound",
                "u-other",
                "MetalIPPool",
                "nodes",
            ),
            claim(
                "v1beta2",
                "team-a",
                "worker-pre",
                "u-pre",
                "MetalIPPool",
                "nodes",
            ),
            claim("v1beta2", "team-a", "tiny-9", "u-t9", "MetalIPPool", "tiny"),
            claim(
                "v1beta2",
                "team-a",
                "worker-4",
                "u-4",
                "MetalIPPool",
                "missing",
            ),
            full_claim(),
        ];
        let pools = vec![
            pool(Some("team-a"), "nodes", nodes_spec()),
            pool(
                Some("team-a"),
                "fresh",
                json!({"addresses": ["10.40.0.10-10.40.0.99", "10.40.0.128/26"], "prefix": 24,
                    "gateway": "10.40.0.1", "excludedAddresses": ["10.40.0.50-10.40.0.59"],
                    "addressReuseGracePeriodSeconds": 60,
                    "preAllocations": {"fresh-cp-0": "10.40.0.20"}}),
            ),
            pool(
                Some("team-a"),
                "nodes",
                json!({"addresses": ["10.20.0.100-10.20.0.150"], "prefix": 24}),
            ),
            pool(
                Some("team-a"),
                "small",
                json!({"addresses": ["10.50.0.0/31"], "prefix": 31,
                    "allocateReservedIPAddresses": true}),
            ),
            pool(
                None,
                "edge",
                json!({"addresses": ["192.0.2.0/24"], "prefix": 24, "gateway": "192.0.2.1"}),
            ),
            pool(
                None,
                "v6-new",
                json!({"addresses": ["2001:db8:1::/64"], "prefix": 64, "gateway": "2001:db8:1::1",
                    "excludedAddresses": ["2001:db8:1::10-2001:db8:1::ff"]}),
            ),
            with_k8s_metadata(
                pool(
                    Some("team-c"),
                    "k8s",
                    json!({"addresses": ["10.60.0.0/28", "10.60.0.32"], "prefix": 26}),
                ),
                "uid-k8s",
            ),
        ];
        let nodes = with_k8s_metadata(pool(Some("team-a"), "nodes", nodes_spec()), "uid-nodes");
        let mut nodes_skip = nodes.clone();
        nodes_skip["metadata"]["annotations"] =
            json!({"ipam.metal-ipam.dev/skip-validate-delete-webhook": "true"});
        let new_pool = with_k8s_metadata(
            pool(
                Some("team-a"),
                "new",
                json!({"addresses": ["10.41.0.0/24"], "prefix": 24}),
            ),
            "uid-new",
        );
        let clash = pool(
            Some("team-a"),
            "clash",
            json!({"addresses": ["10.20.0.0/25"], "prefix": 24}),
        );
        let global_clash = pool(
            None,
            "wide",
            json!({"addresses": ["10.20.0.64/26"], "prefix": 24}),
        );
        let shrunk = pool(
            Some("team-a"),
            "nodes",
            json!({"addresses": ["10.20.0.100/30"], "prefix": 24}),
        );
        let mut dry = review(
            "CREATE",
            Some("team-a"),
            "new",
            Some(new_pool.clone()),
            None,
        );
        dry["request"]["dryRun"] = json!(true);
        let mut config_map = review("CREATE", Some("team-a"), "cm", None, None);
        config_map["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
        let reviews = vec![
            review(
                "CREATE",
                Some("team-a"),
                "new",
                Some(new_pool.clone()),
                None,
            ),
            review("CREATE", Some("team-a"), "clash", Some(clash), None),
            review("CREATE", None, "wide", Some(global_clash), None),
            review(
                "UPDATE",
                Some("team-a"),
                "nodes",
                Some(nodes.clone()),
                Some(nodes.clone()),
            ),
            review(
                "UPDATE",
                Some("team-a"),
                "nodes",
                Some(shrunk),
                Some(nodes.clone()),
            ),
            review("DELETE", Some("team-a"), "nodes", None, Some(nodes.clone())),
            review("DELETE", Some("team-a"), "nodes", None, Some(nodes_skip)),
            review("DELETE", Some("team-a"), "new", None, Some(new_pool)),
            review("CONNECT", Some("team-a"), "nodes", None, None),
            dry,
            config_map,
        ];
        let deleting = {
            let mut c = full_claim();
            c["metadata"]["deletionTimestamp"] = json!("2026-09-01T11:00:00Z");
            c
        };
        let objects = [
            full_claim(),
            deleting,
            ip_address(),
            with_k8s_metadata(pool(Some("team-a"), "nodes", nodes_spec()), "uid-nodes"),
            pool(
                None,
                "edge",
                json!({"addresses": ["192.0.2.0/24"], "prefix": 24}),
            ),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}),
        ];
        let mut watch = Vec::new();
        let mut argo = Vec::new();
        for (i, o) in objects.iter().enumerate() {
            let t = ["ADDED", "MODIFIED", "DELETED"][i % 3];
            watch.push(json!({"type": t, "object": o}));
            let t = ["ADD", "UPDATE", "DELETE"][i % 3];
            argo.push(json!({"type": t, "body": o, "oldBody": o,
                "group": "ipam.cluster.x-k8s.io", "version": "v1beta2", "resource": "ipaddressclaims"}));
        }
        watch.push(
            json!({"type": "BOOKMARK", "object": {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddressClaim", "metadata": {"resourceVersion": "48213",
            "annotations": {"k8s.io/initial-events-end": "true"}}}}),
        );
        watch.push(json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}}));
        argo.push(json!({"type": "add", "object": full_claim()}));
        let claim_ref = reference(
            "ipam.cluster.x-k8s.io/v1beta2",
            "IPAddressClaim",
            Some("team-a"),
            "worker-0",
        );
        let pool_ref = reference(
            "ipam.metal-ipam.dev/v1alpha1",
            "GlobalMetalIPPool",
            None,
            "edge",
        );
        let mut structured_seeds = vec![
            structured(
                "dev.knative.apiserver.resource.add",
                Some(full_claim()),
                true,
            ),
            structured(
                "dev.knative.apiserver.resource.update",
                Some(ip_address()),
                false,
            ),
            structured(
                "dev.knative.apiserver.resource.delete",
                Some(objects[3].clone()),
                true,
            ),
            structured(
                "dev.knative.apiserver.ref.add",
                Some(claim_ref.clone()),
                true,
            ),
            structured(
                "dev.knative.apiserver.ref.delete",
                Some(pool_ref.clone()),
                false,
            ),
            structured("dev.knative.sources.ping", None, true),
        ];
        let mut b64 = structured("dev.knative.apiserver.resource.add", None, true);
        b64["data_base64"] = json!(base64(full_claim().to_string().as_bytes()));
        structured_seeds.push(b64);
        let binary = vec![
            (
                binary_headers(
                    "dev.knative.apiserver.resource.add",
                    "IPAddressClaim",
                    "ipam.cluster.x-k8s.io/v1beta2",
                    "team-a",
                    "worker-0",
                ),
                full_claim(),
            ),
            (
                binary_headers(
                    "dev.knative.apiserver.resource.delete",
                    "IPAddress",
                    "ipam.cluster.x-k8s.io/v1beta2",
                    "team-a",
                    "worker-bound",
                ),
                ip_address(),
            ),
            (
                binary_headers(
                    "dev.knative.apiserver.ref.update",
                    "IPAddressClaim",
                    "ipam.cluster.x-k8s.io/v1beta2",
                    "team-a",
                    "worker-0",
                ),
                claim_ref,
            ),
            (
                binary_headers(
                    "dev.knative.apiserver.ref.add",
                    "GlobalMetalIPPool",
                    "ipam.metal-ipam.dev/v1alpha1",
                    "",
                    "edge",
                ),
                pool_ref,
            ),
        ];
        let mut donors = Vec::new();
        donors.extend(claims.iter().cloned());
        donors.extend(pools.iter().cloned());
        donors.extend(reviews.iter().cloned());
        donors.extend(watch.iter().cloned());
        donors.extend(argo.iter().cloned());
        donors.extend(structured_seeds.iter().cloned());
        donors.extend(binary.iter().map(|(_, b)| b.clone()));
        Seeds {
            claims,
            pools,
            reviews,
            watch,
            argo,
            structured: structured_seeds,
            binary,
            donors,
        }
    }
}

impl Default for Seeds {
    fn default() -> Self {
        Seeds::new()
    }
}
