//! `/v1/events` payloads of every forwarder, as fixtures built from what
//! the forwarders send (Knative ApiServerSource binary and structured mode,
//! Resource and Reference mode; Argo Events resource events and the Sensor
//! shape; plain Kubernetes watch events), and the 400s for malformed ones.

use metal_ipam_core::events::{
    parse, presented_token, Action, Format, ObjectEvent, ObjectKind, Outcome, Parsed,
};
use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::pool::PoolKind;
use serde_json::{json, Value};

const SOURCE: &str = "https://10.96.0.1:443";

/// A claim as the API server returns it (Resource mode carries all of it).
fn claim(version: &str) -> Value {
    json!({
        "apiVersion": format!("ipam.cluster.x-k8s.io/{version}"),
        "kind": "IPAddressClaim",
        "metadata": {
            "name": "worker-0", "namespace": "team-a", "uid": "6a1f0c2e-1111-4e0b-9d52-7f2f6b1e9a10",
            "resourceVersion": "48213", "generation": 1,
            "creationTimestamp": "2026-09-01T10:00:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
            "finalizers": ["ipam.metal-ipam.dev/release-address"],
            "managedFields": [{"manager": "capi", "operation": "Update", "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
        },
        "spec": {"clusterName": "c1",
            "poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "nodes"}},
        "status": {}
    })
}

fn global_pool() -> Value {
    json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
        "metadata": {"name": "edge", "uid": "e1", "resourceVersion": "7"},
        "spec": {"addresses": ["192.0.2.0/24"], "prefix": 24}
    })
}

fn headers(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let owned: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name: &str| {
        owned
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// The headers Knative's ApiServerSource adapter sends in binary mode.
fn knative_headers(ce_type: &str, kind: &str, api_version: &str, name: &str, ns: &str) -> Headers {
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
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string(),
        ),
    ];
    if !ns.is_empty() {
        h.push(("ce-namespace", ns.to_string()));
    }
    h.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Header name/value pairs.
type Headers = Vec<(String, String)>;

fn lookup(h: &[(String, String)]) -> impl Fn(&str) -> Option<String> + '_ {
    move |name: &str| h.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

fn no_headers(_: &str) -> Option<String> {
    None
}

fn object_event(p: Parsed) -> ObjectEvent {
    match p.outcome {
        Outcome::Object(ev) => ev,
        other => panic!("expected an object event, got {other:?}"),
    }
}

fn ignored(p: Parsed) -> (Format, String) {
    match p.outcome {
        Outcome::Ignored { format, reason } => (format, reason),
        other => panic!("expected an ignored event, got {other:?}"),
    }
}

fn plain(body: &Value) -> metal_ipam_core::Result<Parsed> {
    parse(
        Some("application/json"),
        &no_headers,
        body.to_string().as_bytes(),
    )
}

// ---------------------------------------------------------------- Knative

#[test]
fn knative_binary_resource_mode_claim_add() {
    let h = knative_headers(
        "dev.knative.apiserver.resource.add",
        "IPAddressClaim",
        "ipam.cluster.x-k8s.io/v1beta2",
        "worker-0",
        "team-a",
    );
    let body = claim("v1beta2");
    let p = parse(
        Some("application/json"),
        &lookup(&h),
        body.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(p.token, None);
    let ev = object_event(p);
    assert_eq!(
        ev,
        ObjectEvent {
            kind: ObjectKind::Claim,
            action: Action::Upsert,
            namespace: Some("team-a".into()),
            name: "worker-0".into(),
            api_version: "ipam.cluster.x-k8s.io/v1beta2".into(),
            object: Some(body),
            format: Format::KnativeBinary,
            id: Some("0c9a7b5e-2f4d-4f7a-b2a4-0d6c3f1e8b21".into()),
        }
    );
    // The object is the claim, ready for the allocate step.
    let c = Claim::parse(ev.object.as_ref().unwrap()).unwrap();
    assert_eq!(c.id.display(), "team-a/worker-0");
}

#[test]
fn knative_binary_update_and_delete_map_to_actions() {
    for (t, action) in [
        ("dev.knative.apiserver.resource.update", Action::Upsert),
        ("dev.knative.apiserver.resource.delete", Action::Delete),
    ] {
        let h = knative_headers(
            t,
            "IPAddressClaim",
            "ipam.cluster.x-k8s.io/v1beta2",
            "worker-0",
            "team-a",
        );
        let ev = object_event(
            parse(
                Some("application/json"),
                &lookup(&h),
                claim("v1beta2").to_string().as_bytes(),
            )
            .unwrap(),
        );
        assert_eq!(ev.action, action, "{t}");
    }
}

#[test]
fn knative_binary_cluster_scoped_pool_without_namespace_header() {
    let h = knative_headers(
        "dev.knative.apiserver.resource.update",
        "GlobalMetalIPPool",
        "ipam.metal-ipam.dev/v1alpha1",
        "edge",
        "",
    );
    let ev = object_event(
        parse(
            Some("application/json"),
            &lookup(&h),
            global_pool().to_string().as_bytes(),
        )
        .unwrap(),
    );
    assert_eq!(ev.kind, ObjectKind::Pool(PoolKind::Global));
    assert_eq!((ev.namespace, ev.name.as_str()), (None, "edge"));
}

#[test]
fn knative_reference_mode_binary_and_structured() {
    let reference = json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "name": "worker-0", "namespace": "team-a"});
    let h = knative_headers(
        "dev.knative.apiserver.ref.delete",
        "IPAddressClaim",
        "ipam.cluster.x-k8s.io/v1beta2",
        "worker-0",
        "team-a",
    );
    let ev = object_event(
        parse(
            Some("application/json"),
            &lookup(&h),
            reference.to_string().as_bytes(),
        )
        .unwrap(),
    );
    assert_eq!(
        (ev.kind, ev.action, ev.object.clone(), ev.display()),
        (
            ObjectKind::Claim,
            Action::Delete,
            None,
            "team-a/worker-0".to_string()
        )
    );

    let structured = json!({"specversion": "1.0", "type": "dev.knative.apiserver.ref.add",
        "source": SOURCE, "id": "r-1", "datacontenttype": "application/json",
        "data": {"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
            "name": "nodes", "namespace": "team-a"}});
    let ev = object_event(
        parse(
            Some("application/cloudevents+json"),
            &no_headers,
            structured.to_string().as_bytes(),
        )
        .unwrap(),
    );
    assert_eq!(
        (ev.kind, ev.action, ev.format, ev.id.as_deref()),
        (
            ObjectKind::Pool(PoolKind::Namespaced),
            Action::Upsert,
            Format::KnativeStructured,
            Some("r-1")
        )
    );
    assert_eq!(ev.object, None);
}

fn structured_event(ce_type: &str, data: Value) -> Value {
    json!({
        "specversion": "1.0", "type": ce_type, "source": SOURCE,
        "id": "5d3c1c0a-8f0e-4d8e-9d3b-2f4e1c7a9b00", "time": "2026-09-01T10:00:01Z",
        "subject": "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/team-a/ipaddressclaims/worker-0",
        "datacontenttype": "application/json",
        "kind": "IPAddressClaim", "apiversion": "ipam.cluster.x-k8s.io/v1beta2",
        "name": "worker-0", "namespace": "team-a",
        "data": data
    })
}

#[test]
fn knative_structured_resource_mode() {
    let body = structured_event("dev.knative.apiserver.resource.update", claim("v1beta2"));
    let p = parse(
        Some("application/cloudevents+json; charset=UTF-8"),
        &no_headers,
        body.to_string().as_bytes(),
    )
    .unwrap();
    let ev = object_event(p);
    assert_eq!(
        (ev.kind, ev.action, ev.format),
        (ObjectKind::Claim, Action::Upsert, Format::KnativeStructured)
    );
    assert_eq!(
        ev.id.as_deref(),
        Some("5d3c1c0a-8f0e-4d8e-9d3b-2f4e1c7a9b00")
    );
    assert_eq!(ev.object, Some(claim("v1beta2")));
}

#[test]
fn knative_structured_data_base64() {
    // base64 of the compact JSON of a small claim reference object.
    let data = r#"{"apiVersion":"ipam.cluster.x-k8s.io/v1beta2","kind":"IPAddressClaim","metadata":{"name":"w","namespace":"n"}}"#;
    let encoded = "eyJhcGlWZXJzaW9uIjoiaXBhbS5jbHVzdGVyLngtazhzLmlvL3YxYmV0YTIiLCJraW5kIjoiSVBBZGRyZXNzQ2xhaW0iLCJtZXRhZGF0YSI6eyJuYW1lIjoidyIsIm5hbWVzcGFjZSI6Im4ifX0=";
    let body = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.add",
        "source": SOURCE, "id": "b64", "data_base64": encoded});
    let ev = object_event(
        parse(
            Some("application/cloudevents+json"),
            &no_headers,
            body.to_string().as_bytes(),
        )
        .unwrap(),
    );
    assert_eq!(ev.object, Some(serde_json::from_str(data).unwrap()));
    assert_eq!(ev.display(), "n/w");

    let both = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.add",
        "source": SOURCE, "id": "b64", "data_base64": encoded, "data": {}});
    let not_b64 = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.add",
        "source": SOURCE, "id": "b64", "data_base64": "not base64!"});
    let not_json = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.add",
        "source": SOURCE, "id": "b64", "data_base64": "bm90IGpzb24="});
    for (b, reason) in [
        (both, "MalformedEvent"),
        (not_b64, "MalformedEvent"),
        (not_json, "MalformedJSON"),
    ] {
        let e = parse(
            Some("application/cloudevents+json"),
            &no_headers,
            b.to_string().as_bytes(),
        )
        .unwrap_err();
        assert_eq!((e.status(), e.reason()), (400, reason), "{b}: {e}");
    }
}

#[test]
fn structured_body_without_the_cloudevents_content_type_is_still_structured() {
    let body = structured_event("dev.knative.apiserver.resource.add", claim("v1beta2"));
    for ct in [Some("application/json"), None] {
        let ev = object_event(parse(ct, &no_headers, body.to_string().as_bytes()).unwrap());
        assert_eq!(ev.format, Format::KnativeStructured);
    }
}

#[test]
fn unknown_cloudevent_types_are_ignored() {
    let h = headers(&[
        ("ce-specversion", "1.0"),
        ("ce-type", "dev.knative.sources.ping"),
        ("ce-id", "p1"),
        ("ce-source", "/apis/v1/namespaces/default/pingsources/tick"),
    ]);
    let (format, reason) = ignored(parse(Some("application/json"), &h, b"{\"x\":1}").unwrap());
    assert_eq!(format, Format::KnativeBinary);
    assert!(reason.contains("dev.knative.sources.ping"), "{reason}");
    // Not even the data is needed for an ignored type.
    let body = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.patch",
        "source": SOURCE, "id": "x"});
    let (format, _) = ignored(
        parse(
            Some("application/cloudevents+json"),
            &no_headers,
            body.to_string().as_bytes(),
        )
        .unwrap(),
    );
    assert_eq!(format, Format::KnativeStructured);
}

#[test]
fn unknown_kinds_are_ignored_in_every_format() {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "default"}});
    // metal3's pools: no group of ours (the in-cluster provider's pools
    // are classified: served during a takeover).
    let in_cluster = json!({"apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "x", "namespace": "default"}});
    let (f, reason) = ignored(plain(&json!({"type": "ADDED", "object": cm})).unwrap());
    assert_eq!(f, Format::Watch);
    assert_eq!(reason, "ConfigMap of v1 is not handled");
    let h = knative_headers(
        "dev.knative.apiserver.resource.add",
        "IPPool",
        "ipam.metal3.io/v1alpha1",
        "x",
        "default",
    );
    let (f, _) = ignored(
        parse(
            Some("application/json"),
            &lookup(&h),
            in_cluster.to_string().as_bytes(),
        )
        .unwrap(),
    );
    assert_eq!(f, Format::KnativeBinary);
    let (f, _) = ignored(
        plain(&json!({"type": "ADD", "body": {"apiVersion": "apps/v1", "kind": "Deployment"}}))
            .unwrap(),
    );
    assert_eq!(f, Format::ArgoEvents);
}

#[test]
fn v1beta1_claims_and_v1alpha1_addresses_are_accepted() {
    let h = knative_headers(
        "dev.knative.apiserver.resource.add",
        "IPAddressClaim",
        "ipam.cluster.x-k8s.io/v1beta1",
        "worker-0",
        "team-a",
    );
    let ev = object_event(
        parse(
            Some("application/json"),
            &lookup(&h),
            claim("v1beta1").to_string().as_bytes(),
        )
        .unwrap(),
    );
    assert_eq!(
        (ev.kind, ev.api_version.as_str()),
        (ObjectKind::Claim, "ipam.cluster.x-k8s.io/v1beta1")
    );
    assert!(Claim::parse(ev.object.as_ref().unwrap()).is_ok());

    let addr = json!({"apiVersion": "ipam.cluster.x-k8s.io/v1alpha1", "kind": "IPAddress",
        "metadata": {"name": "worker-0", "namespace": "team-a"},
        "spec": {"address": "10.0.0.5", "prefix": 24, "claimRef": {"name": "worker-0"},
            "poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "nodes"}}});
    let ev = object_event(plain(&json!({"type": "DELETED", "object": addr})).unwrap());
    assert_eq!(
        (ev.kind, ev.action),
        (ObjectKind::IpAddress, Action::Delete)
    );
}

#[test]
fn knative_malformed_events_are_400() {
    let base = knative_headers(
        "dev.knative.apiserver.resource.add",
        "IPAddressClaim",
        "ipam.cluster.x-k8s.io/v1beta2",
        "worker-0",
        "team-a",
    );
    let without =
        |name: &str| -> Headers { base.iter().filter(|(k, _)| k != name).cloned().collect() };
    let with = |name: &str, v: &str| -> Headers {
        let mut h = without(name);
        h.push((name.to_string(), v.to_string()));
        h
    };
    let body = claim("v1beta2").to_string();
    let cases: Vec<(Headers, &str, Option<&str>)> = vec![
        (without("ce-type"), body.as_str(), Some("ce-type")),
        (without("ce-id"), body.as_str(), Some("ce-id")),
        (without("ce-source"), body.as_str(), Some("ce-source")),
        (
            with("ce-specversion", "0.3"),
            body.as_str(),
            Some("ce-specversion"),
        ),
        (with("ce-type", ""), body.as_str(), Some("ce-type")),
        (base.clone(), "{not json", None),
        (base.clone(), "", Some("data")),
        (base.clone(), "[1]", Some("data")),
        (with("ce-name", "worker-1"), body.as_str(), Some("ce-name")),
        (
            with("ce-namespace", "team-b"),
            body.as_str(),
            Some("ce-namespace"),
        ),
        (with("ce-kind", "IPAddress"), body.as_str(), Some("ce-kind")),
        (
            with("ce-metalipamtoken", "%zz"),
            body.as_str(),
            Some("ce-metalipamtoken"),
        ),
    ];
    for (h, body, field) in cases {
        let e = parse(Some("application/json"), &lookup(&h), body.as_bytes()).unwrap_err();
        assert_eq!(e.status(), 400, "{body}: {e}");
        assert_eq!(e.field(), field, "{e}");
    }
}

#[test]
fn missing_ce_type_with_ce_specversion_is_400() {
    let h = headers(&[
        ("ce-specversion", "1.0"),
        ("ce-id", "1"),
        ("ce-source", SOURCE),
    ]);
    let e = parse(
        Some("application/json"),
        &h,
        claim("v1beta2").to_string().as_bytes(),
    )
    .unwrap_err();
    assert_eq!(
        (e.status(), e.reason(), e.field()),
        (400, "MalformedEvent", Some("ce-type"))
    );
}

#[test]
fn structured_malformed_events_are_400() {
    let no_data = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.add",
        "source": SOURCE, "id": "1"});
    let null_data = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.add",
        "source": SOURCE, "id": "1", "data": null});
    let no_type =
        json!({"specversion": "1.0", "source": SOURCE, "id": "1", "data": claim("v1beta2")});
    let no_specversion = json!({"type": "dev.knative.apiserver.resource.add", "source": SOURCE, "id": "1", "data": {}});
    let numeric_id = json!({"specversion": "1.0", "type": "dev.knative.apiserver.resource.add",
        "source": SOURCE, "id": 7, "data": claim("v1beta2")});
    let no_name = {
        let mut c = claim("v1beta2");
        c["metadata"].as_object_mut().unwrap().remove("name");
        structured_event("dev.knative.apiserver.resource.add", c)
    };
    for (body, field) in [
        (no_data, Some("data")),
        (null_data, Some("data")),
        (no_type, Some("type")),
        (no_specversion, Some("specversion")),
        (numeric_id, Some("id")),
        (no_name, Some("data.metadata.name")),
    ] {
        let e = parse(
            Some("application/cloudevents+json"),
            &no_headers,
            body.to_string().as_bytes(),
        )
        .unwrap_err();
        assert_eq!(e.status(), 400, "{body}: {e}");
        assert_eq!(e.field(), field, "{body}: {e}");
    }
    let e = parse(Some("application/cloudevents+json"), &no_headers, b"{oops").unwrap_err();
    assert_eq!((e.status(), e.reason()), (400, "MalformedJSON"));
    let e = parse(
        Some("application/cloudevents-batch+json"),
        &no_headers,
        b"[]",
    )
    .unwrap_err();
    assert_eq!(e.status(), 400);
}

// ---------------------------------------------------------------- tokens

#[test]
fn token_from_binary_header_and_structured_attribute() {
    let mut h = knative_headers(
        "dev.knative.apiserver.resource.add",
        "IPAddressClaim",
        "ipam.cluster.x-k8s.io/v1beta2",
        "worker-0",
        "team-a",
    );
    // Percent-encoded per the CloudEvents HTTP binding.
    h.push(("ce-metalipamtoken".into(), "s3%25cret".into()));
    let body = claim("v1beta2").to_string();
    let p = parse(Some("application/json"), &lookup(&h), body.as_bytes()).unwrap();
    assert_eq!(p.token.as_deref(), Some("s3%cret"));
    assert!(!format!("{p:?}").contains("s3%cret"));
    assert_eq!(
        presented_token(Some("application/json"), &lookup(&h), body.as_bytes()).as_deref(),
        Some("s3%cret")
    );

    let mut s = structured_event("dev.knative.apiserver.resource.add", claim("v1beta2"));
    s["metalipamtoken"] = json!("tok-2");
    let bytes = s.to_string();
    let p = parse(
        Some("application/cloudevents+json"),
        &no_headers,
        bytes.as_bytes(),
    )
    .unwrap();
    assert_eq!(p.token.as_deref(), Some("tok-2"));
    assert_eq!(
        presented_token(
            Some("application/cloudevents+json"),
            &no_headers,
            bytes.as_bytes()
        )
        .as_deref(),
        Some("tok-2")
    );
    // The token is read even when the rest of the event is malformed, so the
    // caller can authenticate first.
    let broken = json!({"specversion": "1.0", "metalipamtoken": "tok-3"}).to_string();
    assert!(parse(
        Some("application/cloudevents+json"),
        &no_headers,
        broken.as_bytes()
    )
    .is_err());
    assert_eq!(
        presented_token(
            Some("application/cloudevents+json"),
            &no_headers,
            broken.as_bytes()
        )
        .as_deref(),
        Some("tok-3")
    );
    // Ignored events carry their token too.
    let ping = json!({"specversion": "1.0", "type": "dev.knative.sources.ping", "source": "s",
        "id": "1", "metalipamtoken": "tok-4"});
    let p = parse(
        Some("application/cloudevents+json"),
        &no_headers,
        ping.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(p.token.as_deref(), Some("tok-4"));
    // Plain JSON has no token, even a member of that name.
    let w =
        json!({"type": "ADDED", "object": claim("v1beta2"), "metalipamtoken": "no"}).to_string();
    assert_eq!(
        plain(&serde_json::from_str(&w).unwrap()).unwrap().token,
        None
    );
    assert_eq!(
        presented_token(Some("application/json"), &no_headers, w.as_bytes()),
        None
    );
}

// ---------------------------------------------------------------- Argo Events

#[test]
fn argo_resource_event_with_old_body() {
    let mut old = claim("v1beta2");
    old["metadata"]["resourceVersion"] = json!("48200");
    let body = json!({
        "type": "UPDATE",
        "body": claim("v1beta2"),
        "oldBody": old,
        "group": "ipam.cluster.x-k8s.io", "version": "v1beta2", "resource": "ipaddressclaims",
        "metadata": {"team": "a"}
    });
    let ev = object_event(plain(&body).unwrap());
    assert_eq!(
        (ev.kind, ev.action, ev.format, ev.id),
        (ObjectKind::Claim, Action::Upsert, Format::ArgoEvents, None)
    );
    assert_eq!(ev.object, Some(claim("v1beta2")), "body, not oldBody");

    let del = json!({"type": "DELETE", "body": global_pool(), "oldBody": null,
        "group": "ipam.metal-ipam.dev", "version": "v1alpha1", "resource": "globalmetalippools"});
    let ev = object_event(plain(&del).unwrap());
    assert_eq!(
        (ev.kind, ev.action),
        (ObjectKind::Pool(PoolKind::Global), Action::Delete)
    );
}

#[test]
fn argo_sensor_shape_with_lower_case_type() {
    let ev = object_event(plain(&json!({"type": "add", "object": claim("v1beta2")})).unwrap());
    assert_eq!((ev.action, ev.format), (Action::Upsert, Format::ArgoEvents));
}

// ---------------------------------------------------------------- watch events

#[test]
fn watch_added_and_deleted() {
    let ev = object_event(plain(&json!({"type": "ADDED", "object": claim("v1beta2")})).unwrap());
    assert_eq!(
        (ev.action, ev.format, ev.display()),
        (Action::Upsert, Format::Watch, "team-a/worker-0".to_string())
    );
    let ev = object_event(plain(&json!({"type": "DELETED", "body": claim("v1beta2")})).unwrap());
    assert_eq!((ev.action, ev.format), (Action::Delete, Format::Watch));
}

#[test]
fn watch_bookmark_and_error_are_ignored() {
    let bookmark = json!({"type": "BOOKMARK", "object": {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim", "metadata": {"resourceVersion": "48213",
        "annotations": {"k8s.io/initial-events-end": "true"}}}});
    let (f, reason) = ignored(plain(&bookmark).unwrap());
    assert_eq!(f, Format::Watch);
    assert!(reason.contains("BOOKMARK"), "{reason}");
    let error = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
        "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}});
    assert_eq!(ignored(plain(&error).unwrap()).0, Format::Watch);
}

#[test]
fn plain_malformed_events_are_400() {
    let e = parse(Some("application/json"), &no_headers, b"{\"type\": ").unwrap_err();
    assert_eq!((e.status(), e.reason()), (400, "MalformedJSON"));
    let e = parse(None, &no_headers, b"").unwrap_err();
    assert_eq!(e.status(), 400);
    let mut c = claim("v1beta2");
    c.as_object_mut().unwrap().remove("metadata");
    let e = plain(&json!({"type": "MODIFIED", "object": c})).unwrap_err();
    assert_eq!((e.status(), e.field()), (400, Some("object.metadata")));
    let mut c = claim("v1beta2");
    c["metadata"]["name"] = json!("worker_0");
    let e = plain(&json!({"type": "MODIFIED", "object": c})).unwrap_err();
    assert_eq!((e.status(), e.field()), (400, Some("object.metadata.name")));
}

#[test]
fn a_vrf_backed_pool_event_also_goes_to_the_provision_step() {
    use metal_ipam_core::events::route::route_event;
    use metal_ipam_core::events::{Action, Format, ObjectEvent, ObjectKind};
    let ev = |object: Option<serde_json::Value>, kind| ObjectEvent {
        kind: ObjectKind::Pool(kind),
        action: Action::Upsert,
        namespace: Some("ns".into()),
        name: "p".into(),
        api_version: "ipam.metal-ipam.dev/v1alpha1".into(),
        object,
        format: Format::Watch,
        id: None,
    };
    let metal = serde_json::json!({"spec": {"metal": {"metro": "da"}}});
    assert_eq!(
        route_event(&ev(Some(metal.clone()), PoolKind::Namespaced)),
        vec![
            ("pools", "/v1/capi/pools/ns/p".to_string()),
            ("provision", "/v1/capi/metal/pools/ns/p".to_string())
        ]
    );
    assert_eq!(
        route_event(&ev(Some(metal), PoolKind::Global)),
        vec![
            ("pools", "/v1/capi/global-pools/p".to_string()),
            ("provision", "/v1/capi/metal/global-pools/p".to_string())
        ]
    );
    // Without spec.metal (or without an object), only the pools step.
    let plain = serde_json::json!({"spec": {"addresses": ["10.0.0.0/24"], "prefix": 24}});
    for object in [Some(plain), None] {
        assert_eq!(
            route_event(&ev(object, PoolKind::Namespaced)),
            vec![("pools", "/v1/capi/pools/ns/p".to_string())]
        );
    }
}

#[test]
fn a_machine_event_goes_to_the_network_step() {
    use metal_ipam_core::events::route::route_event;
    use metal_ipam_core::events::ObjectKind;
    let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "md-0-x7f", "namespace": "team-a"}});
    for t in ["ADDED", "MODIFIED", "DELETED"] {
        let ev = object_event(plain(&json!({"type": t, "object": machine})).unwrap());
        assert_eq!(ev.kind, ObjectKind::Machine);
        assert_eq!(
            route_event(&ev),
            vec![(
                "network",
                "/v1/capi/machines/team-a/md-0-x7f/network".to_string()
            )],
            "{t}: the step re-reads the Machine"
        );
    }
    // Another group's Machine (e.g. a Metal3 one) is not ours.
    let other = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Machine",
        "metadata": {"name": "m", "namespace": "team-a"}});
    let (_, reason) = ignored(plain(&json!({"type": "ADDED", "object": other})).unwrap());
    assert!(reason.contains("Machine"), "{reason}");
    // A Machine needs a namespace.
    let mut bare = machine.clone();
    bare["metadata"] = json!({"name": "m"});
    assert_eq!(
        plain(&json!({"type": "ADDED", "object": bare}))
            .unwrap_err()
            .status(),
        400
    );
}
