//! The pool admission webhook: every deny reason, the allows around them,
//! and malformed reviews. Pools "in the store" are `Loaded` values built
//! from a pool object, its validated spec and an allocation state made with
//! the allocator; one test runs the same checks over a real key-value store.

use metal_ipam_core::admission::{
    evaluate, review, KvPools, PoolLookup, Reviewed, SKIP_DELETE_VALIDATION_ANNOTATION,
};
use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::ops;
use metal_ipam_core::ipam::pool::{PoolId, PoolObject};
use metal_ipam_core::ipam::store::Loaded;
use metal_ipam_core::testing::{Backend, World};
use serde_json::{json, Value};

fn pool_json(id: &PoolId, spec: Value) -> Value {
    let mut metadata = json!({"name": id.name, "uid": format!("uid-{}", id.name),
        "resourceVersion": "12", "generation": 1});
    if let Some(ns) = &id.namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": id.kind.kind_name(),
        "metadata": metadata, "spec": spec})
}

fn spec(addresses: &[&str], prefix: u8) -> Value {
    json!({"addresses": addresses, "prefix": prefix})
}

/// A stored pool with the first `bound` free addresses allocated.
fn stored(id: &PoolId, spec: Value, bound: usize) -> Loaded {
    let object = PoolObject::parse(id, &pool_json(id, spec)).unwrap();
    metal_ipam_core::testing::stored_pool(object, bound, 100, 3)
}

/// An `AdmissionReview` as the API server sends it.
fn request(
    op: &str,
    id: &PoolId,
    object: Option<Value>,
    old: Option<Value>,
    dry_run: bool,
) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": id.kind.kind_name()},
            "resource": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1",
                "resource": id.kind.resource().plural},
            "requestKind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": id.kind.kind_name()},
            "name": id.name,
            "namespace": id.namespace.clone().unwrap_or_default(),
            "operation": op,
            "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
    .to_string()
    .into_bytes()
}

fn create(id: &PoolId, spec: Value) -> Vec<u8> {
    request("CREATE", id, Some(pool_json(id, spec)), None, false)
}

fn update(id: &PoolId, old: Value, new: Value) -> Vec<u8> {
    request(
        "UPDATE",
        id,
        Some(pool_json(id, new)),
        Some(pool_json(id, old)),
        false,
    )
}

fn delete(id: &PoolId, old: Value) -> Vec<u8> {
    request("DELETE", id, None, Some(old), false)
}

fn run(body: &[u8], pools: &Vec<Loaded>) -> Reviewed {
    evaluate(body, pools).unwrap()
}

fn denied(r: &Reviewed) -> (u16, &'static str, &str) {
    let d = r.denial.as_ref().expect("denied");
    (d.code, d.reason, d.message.as_str())
}

fn ns(n: &str, p: &str) -> PoolId {
    PoolId::namespaced(n, p)
}

// ---------------------------------------------------------------- allow

#[test]
fn a_valid_new_pool_is_allowed_with_the_exact_response_shape() {
    let id = ns("team-a", "nodes");
    let resp = review(&create(&id, spec(&["10.0.0.0/24"], 24)), &Vec::new()).unwrap();
    assert_eq!(
        resp,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": true}})
    );
}

#[test]
fn other_kinds_groups_and_operations_are_allowed_unchecked() {
    let id = ns("team-a", "nodes");
    let mut body: Value = serde_json::from_slice(&create(&id, spec(&["nonsense"], 99))).unwrap();
    for (group, kind) in [
        ("ipam.cluster.x-k8s.io", "InClusterIPPool"),
        ("other.example", "MetalIPPool"),
        ("", "ConfigMap"),
    ] {
        body["request"]["kind"] = json!({"group": group, "version": "v1", "kind": kind});
        let r = run(body.to_string().as_bytes(), &Vec::new());
        assert!(r.allowed(), "{group}/{kind}");
        assert_eq!((r.outcome, r.pool), ("ignored", None));
    }
    let r = run(
        &request("CONNECT", &id, None, None, false),
        &vec![stored(&id, spec(&["10.0.0.0/24"], 24), 3)],
    );
    assert!(r.allowed());
    assert_eq!(r.outcome, "ignored");
}

// ---------------------------------------------------------------- invalid objects

#[test]
fn invalid_specs_are_denied_with_the_field_path() {
    let id = ns("team-a", "nodes");
    for (s, message) in [
        (
            spec(&["10.0.0.0/24", "10.0.1.5"], 24),
            "spec.addresses[1]: \"10.0.1.5\" is outside 10.0.0.0/24, the subnet of the first address and spec.prefix",
        ),
        (
            spec(&["10.0.0.0/24", "2001:db8::1"], 24),
            "spec.addresses[1]: is IPv6 but the pool is IPv4: a pool holds one family",
        ),
        (json!({"addresses": ["10.0.0.1"]}), "spec.prefix: is required"),
        (
            json!({"addresses": ["10.0.0.0/24"], "prefix": 24, "gateway": "10.0.0.300"}),
            "spec.gateway: \"10.0.0.300\" is not an IP address",
        ),
    ] {
        let r = run(&create(&id, s.clone()), &Vec::new());
        assert_eq!(denied(&r), (422, "Invalid", message), "{s}");
        let resp = r.to_json();
        assert_eq!(resp["response"]["allowed"], false);
        assert_eq!(resp["response"]["status"]["code"], 422);
        assert_eq!(resp["response"]["status"]["status"], "Failure");
        assert_eq!(resp["response"]["status"]["message"], message);
    }
}

#[test]
fn envelope_mismatches_are_denied() {
    let id = ns("team-a", "nodes");
    let mut obj = pool_json(&id, spec(&["10.0.0.0/24"], 24));
    obj["metadata"]["name"] = json!("other");
    let r = run(&request("CREATE", &id, Some(obj), None, false), &Vec::new());
    assert_eq!(denied(&r).1, "Invalid");
    assert_eq!(r.denial.unwrap().field.as_deref(), Some("metadata.name"));

    let g = PoolId::global("edge");
    let mut obj = pool_json(&g, spec(&["10.0.0.0/24"], 24));
    obj["metadata"]["namespace"] = json!("team-a");
    let r = run(&request("CREATE", &g, Some(obj), None, false), &Vec::new());
    assert_eq!(
        r.denial.unwrap().field.as_deref(),
        Some("metadata.namespace")
    );

    let mut obj = pool_json(&id, spec(&["10.0.0.0/24"], 24));
    obj["apiVersion"] = json!("ipam.metal-ipam.dev/v1beta9");
    let r = run(&request("CREATE", &id, Some(obj), None, false), &Vec::new());
    assert_eq!(r.denial.unwrap().field.as_deref(), Some("apiVersion"));
}

// ---------------------------------------------------------------- overlap

#[test]
fn global_and_namespaced_pools_must_not_overlap_either_way() {
    let nodes = ns("team-a", "nodes");
    let edge = PoolId::global("edge");
    let store = vec![stored(&nodes, spec(&["10.0.0.0/24"], 24), 0)];
    let r = run(&create(&edge, spec(&["10.0.0.200-10.0.0.210"], 24)), &store);
    assert_eq!(
        denied(&r),
        (
            422,
            "PoolOverlap",
            "spec.addresses: GlobalMetalIPPool edge would share 10.0.0.200 and 10 more addresses with \
             MetalIPPool team-a/nodes (a GlobalMetalIPPool serves every namespace); both could hand out the same address"
        )
    );

    let store = vec![stored(&edge, spec(&["10.0.0.200-10.0.0.210"], 24), 0)];
    let r = run(&create(&nodes, spec(&["10.0.0.0/24"], 24)), &store);
    assert_eq!(
        denied(&r),
        (
            422,
            "PoolOverlap",
            "spec.addresses: MetalIPPool team-a/nodes would share 10.0.0.200 and 10 more addresses with \
             GlobalMetalIPPool edge, which serves every namespace; both could hand out the same address"
        )
    );
    // Two global pools overlap too.
    let r = run(
        &create(&PoolId::global("edge2"), spec(&["10.0.0.210"], 32)),
        &store,
    );
    assert_eq!(denied(&r).1, "PoolOverlap");
}

#[test]
fn namespaced_pools_overlap_unsafely_only_within_a_namespace() {
    let a = ns("team-a", "nodes");
    let store = vec![stored(&a, spec(&["10.0.0.0/24"], 24), 5)];
    let r = run(
        &create(&ns("team-a", "more"), spec(&["10.0.0.7"], 32)),
        &store,
    );
    assert_eq!(
        denied(&r),
        (
            422,
            "PoolOverlap",
            "spec.addresses: MetalIPPool team-a/more would share 10.0.0.7 with MetalIPPool team-a/nodes \
             of the same namespace; both could hand out the same address"
        )
    );
    // The same addresses in another namespace: allowed, with a warning.
    let r = run(
        &create(&ns("team-b", "nodes"), spec(&["10.0.0.0/24"], 24)),
        &store,
    );
    assert!(r.allowed(), "{:?}", r.denial);
    assert_eq!(
        r.warnings,
        vec![
            "shares 10.0.0.1 and 253 more addresses with MetalIPPool team-a/nodes of another namespace: \
             safe only on separate networks"
                .to_string()
        ]
    );
    assert_eq!(r.to_json()["response"]["warnings"][0], json!(r.warnings[0]));
}

#[test]
fn only_allocatable_addresses_count() {
    let a = ns("team-a", "nodes");
    let store = vec![stored(
        &a,
        json!({"addresses": ["10.0.0.0/24"], "prefix": 24, "gateway": "10.0.0.1",
            "excludedAddresses": ["10.0.0.128/25"]}),
        0,
    )];
    // Excluded from the other pool: no overlap.
    let r = run(
        &create(&ns("team-a", "upper"), spec(&["10.0.0.128-10.0.0.250"], 24)),
        &store,
    );
    assert!(r.allowed(), "{:?}", r.denial);
    assert!(r.warnings.is_empty());
    // The other pool's network address (never handed out there) is no
    // overlap either; its gateway is not, but is worth a warning.
    let r = run(
        &create(&ns("team-a", "router"), spec(&["10.0.0.0-10.0.0.1"], 31)),
        &store,
    );
    assert!(r.allowed(), "{:?}", r.denial);
    assert_eq!(
        r.warnings,
        vec!["hands out 10.0.0.1, the gateway of MetalIPPool team-a/nodes".to_string()]
    );
}

#[test]
fn ipv4_and_ipv6_pools_never_overlap() {
    // ::a00:0/120 has the same integer values as 10.0.0.0/24.
    let store = vec![stored(
        &PoolId::global("v6"),
        spec(&["::a00:0/120"], 120),
        3,
    )];
    let r = run(
        &create(&ns("team-a", "v4"), spec(&["10.0.0.0/24"], 24)),
        &store,
    );
    assert!(r.allowed(), "{:?}", r.denial);
    assert!(r.warnings.is_empty());
    let store = vec![stored(&PoolId::global("v4"), spec(&["10.0.0.0/24"], 24), 0)];
    let r = run(
        &create(&ns("team-a", "v6"), spec(&["::a00:0/120"], 120)),
        &store,
    );
    assert!(r.allowed(), "{:?}", r.denial);
    // Same family, same values: denied.
    let r = run(
        &create(&ns("team-a", "v6"), spec(&["10.0.0.0/24"], 24)),
        &store,
    );
    assert!(!r.allowed());
}

#[test]
fn updating_a_pool_does_not_conflict_with_itself() {
    let id = PoolId::global("edge");
    let old = spec(&["10.0.0.0/25"], 24);
    let store = vec![stored(&id, old.clone(), 4)];
    let r = run(&update(&id, old, spec(&["10.0.0.0/24"], 24)), &store);
    assert!(r.allowed(), "{:?}", r.denial);
    assert_eq!((r.outcome, r.pool), ("allowed", Some(id)));
    assert!(r.warnings.is_empty());
}

// ---------------------------------------------------------------- dropped addresses

#[test]
fn an_update_that_drops_bound_addresses_is_denied() {
    let id = ns("team-a", "nodes");
    let old = spec(&["10.0.0.0/24"], 24);
    let store = vec![stored(&id, old.clone(), 3)]; // .1, .2, .3 bound
    let r = run(
        &update(&id, old.clone(), spec(&["10.0.0.3-10.0.0.100"], 24)),
        &store,
    );
    assert_eq!(
        denied(&r),
        (
            422,
            "AllocatedAddressesDropped",
            "spec: the change would drop 2 allocated address(es) from MetalIPPool team-a/nodes: \
             10.0.0.1, 10.0.0.2; delete their IPAddressClaims first"
        )
    );
    // Excluding a bound address drops it too.
    let r = run(
        &update(
            &id,
            old.clone(),
            json!({"addresses": ["10.0.0.0/24"], "prefix": 24, "excludedAddresses": ["10.0.0.2"]}),
        ),
        &store,
    );
    assert_eq!(denied(&r).1, "AllocatedAddressesDropped");
    // Shrinking around the bound addresses is fine.
    let r = run(&update(&id, old, spec(&["10.0.0.1-10.0.0.3"], 24)), &store);
    assert!(r.allowed(), "{:?}", r.denial);
    // A CREATE over a pool the store still holds is checked the same way
    // (the pools route would refuse it otherwise).
    let r = run(&create(&id, spec(&["10.0.0.128/25"], 24)), &store);
    assert_eq!(denied(&r).1, "AllocatedAddressesDropped");
}

#[test]
fn metadata_only_updates_are_never_blocked() {
    let id = ns("team-a", "nodes");
    let s = spec(&["10.0.0.0/24"], 24);
    // Even if the store has since gained an overlapping global pool.
    let store = vec![
        stored(&id, s.clone(), 2),
        stored(&PoolId::global("edge"), spec(&["10.0.0.0/24"], 24), 0),
    ];
    let mut new = pool_json(&id, s.clone());
    new["metadata"]["annotations"] = json!({SKIP_DELETE_VALIDATION_ANNOTATION: "true"});
    new["metadata"]["finalizers"] = json!(["x"]);
    let body = request("UPDATE", &id, Some(new), Some(pool_json(&id, s)), false);
    let r = run(&body, &store);
    assert!(r.allowed());
    assert_eq!(r.outcome, "spec-unchanged");
}

// ---------------------------------------------------------------- delete

#[test]
fn deleting_a_pool_with_bound_addresses_is_denied_unless_annotated() {
    let id = ns("team-a", "nodes");
    let s = spec(&["10.0.0.0/24"], 24);
    let store = vec![stored(&id, s.clone(), 2)];
    let r = run(&delete(&id, pool_json(&id, s.clone())), &store);
    assert_eq!(
        denied(&r),
        (
            403,
            "PoolInUse",
            "MetalIPPool team-a/nodes still has 2 allocated address(es); delete their IPAddressClaims first, \
             or, to move the pool with clusterctl move, annotate it ipam.metal-ipam.dev/skip-validate-delete-webhook"
        )
    );
    assert_eq!(r.to_json()["response"]["status"]["code"], 403);

    for value in ["true", ""] {
        let mut old = pool_json(&id, s.clone());
        old["metadata"]["annotations"] = json!({SKIP_DELETE_VALIDATION_ANNOTATION: value});
        let r = run(&delete(&id, old), &store);
        assert!(r.allowed());
        assert_eq!(r.outcome, "skip-annotation");
        assert_eq!(r.warnings.len(), 1);
    }
}

#[test]
fn deleting_an_idle_or_unknown_pool_is_allowed() {
    let id = PoolId::global("edge");
    let s = spec(&["10.0.0.0/24"], 24);
    // Bound then released with a grace period: cooling addresses are not bound.
    let mut l = stored(&id, s.clone(), 1);
    let addr = l.pool.allocatable.first().unwrap();
    assert!(l.state.release(addr, 60, 100));
    let store = vec![l];
    let r = run(&delete(&id, pool_json(&id, s.clone())), &store);
    assert!(r.allowed(), "{:?}", r.denial);
    assert_eq!(r.outcome, "allowed");
    let r = run(&delete(&id, pool_json(&id, s)), &Vec::new());
    assert!(r.allowed());
}

#[test]
fn out_of_range_addresses_count_as_bound() {
    let id = ns("team-a", "nodes");
    let mut l = stored(&id, spec(&["10.0.0.0/24"], 24), 0);
    // An address bound under an older spec, outside the current one.
    l.state.used.insert(0x0a00_0105);
    let r = run(
        &delete(&id, pool_json(&id, spec(&["10.0.0.0/24"], 24))),
        &vec![l],
    );
    assert_eq!(denied(&r).0, 403);
}

// ---------------------------------------------------------------- dry run

#[test]
fn dry_run_requests_are_validated_the_same_way() {
    let id = ns("team-a", "nodes");
    let s = spec(&["10.0.0.0/24"], 24);
    let store = vec![stored(&id, s.clone(), 2)];
    let r = run(
        &request("DELETE", &id, None, Some(pool_json(&id, s.clone())), true),
        &store,
    );
    assert!(r.dry_run);
    assert_eq!(denied(&r).1, "PoolInUse");
    let r = run(
        &request(
            "CREATE",
            &ns("team-a", "x"),
            Some(pool_json(&ns("team-a", "x"), s)),
            None,
            true,
        ),
        &store,
    );
    assert!(r.dry_run);
    assert_eq!(denied(&r).1, "PoolOverlap");
}

// ---------------------------------------------------------------- malformed

#[test]
fn malformed_reviews_are_400() {
    let id = ns("team-a", "nodes");
    let good: Value = serde_json::from_slice(&create(&id, spec(&["10.0.0.0/24"], 24))).unwrap();
    type Mutation = Box<dyn Fn(&mut Value)>;
    let cases: Vec<Mutation> = vec![
        Box::new(|v| *v = json!([1])),
        Box::new(|v| v["apiVersion"] = json!("admission.k8s.io/v1beta1")),
        Box::new(|v| v["kind"] = json!("Review")),
        Box::new(|v| {
            v.as_object_mut().unwrap().remove("request");
        }),
        Box::new(|v| {
            v["request"].as_object_mut().unwrap().remove("uid");
        }),
        Box::new(|v| v["request"]["uid"] = json!("")),
        Box::new(|v| {
            v["request"].as_object_mut().unwrap().remove("kind");
        }),
        Box::new(|v| {
            v["request"].as_object_mut().unwrap().remove("operation");
        }),
        Box::new(|v| v["request"]["object"] = json!(null)),
    ];
    for mutate in cases {
        let mut v = good.clone();
        mutate(&mut v);
        let e = review(v.to_string().as_bytes(), &Vec::new()).unwrap_err();
        assert_eq!(e.status(), 400, "{v}: {e}");
    }
    for body in [&b"not json"[..], b"", b"{\"apiVersion\":"] {
        assert_eq!(review(body, &Vec::new()).unwrap_err().status(), 400);
    }
}

#[test]
fn a_delete_must_name_its_pool() {
    let id = ns("team-a", "nodes");
    let store = vec![stored(&id, spec(&["10.0.0.0/24"], 24), 1)];
    let mut v: Value = serde_json::from_slice(&request("DELETE", &id, None, None, false)).unwrap();
    v["request"]["namespace"] = json!("");
    let e = review(v.to_string().as_bytes(), &store).unwrap_err();
    assert_eq!((e.status(), e.field()), (400, Some("request.namespace")));
    v["request"]["name"] = json!("");
    let e = review(v.to_string().as_bytes(), &store).unwrap_err();
    assert_eq!((e.status(), e.field()), (400, Some("request.name")));
    // Without oldObject, the request's name and namespace are enough.
    let r = run(&request("DELETE", &id, None, None, false), &store);
    assert_eq!(denied(&r).1, "PoolInUse");
    // A name that could never have been registered has nothing to protect.
    v["request"]["name"] = json!("Not_A_Name");
    v["request"]["namespace"] = json!("team-a");
    assert!(run(v.to_string().as_bytes(), &store).allowed());
}

// ---------------------------------------------------------------- over the store

#[test]
fn kv_pools_reads_what_the_pools_route_registered() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let ctx = w.ctx();
    let a = ns("team-a", "nodes");
    let edge = PoolId::global("edge");
    for (id, s) in [
        (&a, spec(&["10.0.0.0/24"], 24)),
        (&edge, spec(&["192.0.2.0/24"], 24)),
    ] {
        ops::put_pool(&ctx, PoolObject::parse(id, &pool_json(id, s)).unwrap()).unwrap();
    }
    let claim = Claim::parse(&json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": "m-0", "namespace": "team-a", "uid": "u0"},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "nodes"}}
    }))
    .unwrap();
    ops::allocate(&ctx, &claim).unwrap();
    ops::delete_pool(&ctx, &edge).unwrap(); // a tombstone is not a pool

    let pools = KvPools(&w.kv);
    assert_eq!(pools.all().unwrap().len(), 1);
    assert!(pools.get(&edge).unwrap().is_none());

    let r = evaluate(
        &delete(&a, pool_json(&a, spec(&["10.0.0.0/24"], 24))),
        &pools,
    )
    .unwrap();
    assert_eq!(denied(&r).1, "PoolInUse");
    let r = evaluate(&create(&edge, spec(&["10.0.0.0/24"], 24)), &pools).unwrap();
    assert_eq!(denied(&r).1, "PoolOverlap");
    let r = evaluate(
        &update(&a, spec(&["10.0.0.0/24"], 24), spec(&["10.0.0.100/30"], 24)),
        &pools,
    )
    .unwrap();
    assert_eq!(denied(&r).1, "AllocatedAddressesDropped");
    let r = evaluate(&create(&edge, spec(&["192.0.2.0/24"], 24)), &pools).unwrap();
    assert!(r.allowed());
}

// ---------------------------------------------------------------- VRF pools

#[test]
fn a_vrf_pool_is_checked_as_the_block_it_will_hand_out() {
    const UUID: &str = "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11";
    let id = ns("team-a", "vrf");
    let created = json!({"metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
        "reservation": {"network": "10.10.1.0", "cidr": 24}}});
    let r = run(&create(&id, created.clone()), &Vec::new());
    assert!(r.allowed(), "{:?}", r.denial);
    assert!(r.warnings.is_empty());

    // The block overlaps a pool of the same namespace: the addresses it
    // will hand out are checked like any pool's.
    let other = stored(&ns("team-a", "nodes"), spec(&["10.10.1.0/25"], 24), 0);
    let r = run(&create(&id, created), &vec![other]);
    let (code, reason, message) = denied(&r);
    assert_eq!((code, reason), (422, "PoolOverlap"), "{message}");

    // A Metal rule, named by field.
    let bad = json!({"metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
        "reservation": {"network": "10.20.1.0", "cidr": 24}}});
    let r = run(&create(&id, bad), &Vec::new());
    let (code, _, message) = denied(&r);
    assert_eq!(code, 422);
    assert!(
        message.starts_with("spec.metal.reservation.network:"),
        "{message}"
    );

    // An adopted block is known only once read from Metal: allowed, with
    // a warning that its overlap is checked then.
    let adopted =
        json!({"metal": {"metro": "da", "vrf": {"id": UUID}, "reservation": {"id": UUID}}});
    let r = run(&create(&id, adopted), &Vec::new());
    assert!(r.allowed(), "{:?}", r.denial);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
}

// -- network profiles ---------------------------------------------------------

/// A review of a `MetalNetworkProfile` in `team-a`.
fn profile_request(op: &str, spec: Value, old: Option<Value>) -> Vec<u8> {
    let object = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalNetworkProfile",
        "metadata": {"name": "l2", "namespace": "team-a"}, "spec": spec});
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "operation": op, "name": "l2", "namespace": "team-a",
            "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": "MetalNetworkProfile"},
            "object": object,
            "oldObject": old.map(|s| json!({"metadata": {"name": "l2", "namespace": "team-a"}, "spec": s})),
        }
    })
    .to_string()
    .into_bytes()
}

fn vrf_pool(ns: &str, name: &str, metro: &str) -> Loaded {
    stored(
        &PoolId::namespaced(ns, name),
        json!({"metal": {"metro": metro, "vrf": {"ipRanges": ["10.10.0.0/16"]},
            "reservation": {"network": "10.10.1.0", "cidr": 29}}}),
        0,
    )
}

#[test]
fn network_profiles_are_checked_by_their_rules_and_against_vrf_pools() {
    let pools = vec![
        vrf_pool("team-a", "vrf-da", "da"),
        vrf_pool("team-a", "vrf-sv", "sv"),
        stored(
            &PoolId::namespaced("team-a", "pnap-phx"),
            json!({"phoenixnap": {"location": "PHX", "privateNetwork": {"cidr": "10.20.0.0/24"}}}),
            0,
        ),
        stored(
            &PoolId::namespaced("team-a", "plain"),
            spec(&["192.168.0.0/24"], 24),
            0,
        ),
    ];
    let on_bond = |pool: &str| {
        json!({"metro": "da", "ports": [{"name": "bond0", "vlans": [{"pool": {"name": pool},
            "addresses": [{"pool": {"name": pool}}]}]}]})
    };
    let decide = |body: Vec<u8>| evaluate(&body, &pools).unwrap();
    // A VRF pool's VLAN in the profile's metro: allowed.
    let r = decide(profile_request("CREATE", on_bond("vrf-da"), None));
    assert!(r.allowed(), "{r:?}");
    assert!(r.warnings.is_empty());
    // In another metro, or a pool without a VLAN: denied, naming the field.
    for (pool, says) in [
        ("vrf-sv", "metro sv"),
        ("plain", "not backed by a cloud"),
        ("pnap-phx", "backed by phoenixNAP"),
    ] {
        let r = decide(profile_request("CREATE", on_bond(pool), None));
        let d = r.denial.expect("denied");
        assert_eq!(d.code, 422);
        assert!(
            d.message.starts_with("spec.ports[0].vlans[0].pool: "),
            "{}",
            d.message
        );
        assert!(d.message.contains(says), "{}", d.message);
    }
    // A pool not registered yet: allowed with a warning.
    let r = decide(profile_request("CREATE", on_bond("later"), None));
    assert!(r.allowed());
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    // Elastic IPs come from a VRF-backed pool too.
    let elastic = |pool: &str| json!({"metro": "da", "ports": [{"name": "bond0", "elasticIPs": [{"pool": {"name": pool}}]}]});
    assert!(decide(profile_request("CREATE", elastic("vrf-da"), None)).allowed());
    let r = decide(profile_request("CREATE", elastic("plain"), None));
    let d = r.denial.expect("denied");
    assert!(
        d.message.starts_with(
            "spec.ports[0].elasticIPs[0].pool: pool team-a/plain is not backed by a cloud"
        ),
        "{}",
        d.message
    );
    let r = decide(profile_request("CREATE", elastic("later"), None));
    assert!(r.allowed());
    assert!(
        r.warnings[0].contains("its elastic IPs are checked"),
        "{:?}",
        r.warnings
    );
    // A phoenixNAP profile (spec.location): its networks are phoenixNAP
    // pools' in its location; a Metal pool, or another location, is denied.
    let on_network = |pool: &str, location: &str| {
        json!({"location": location, "ports": [{"name": "bond0", "vlans": [{"pool": {"name": pool},
            "addresses": [{"pool": {"name": pool}}]}]}]})
    };
    assert!(decide(profile_request(
        "CREATE",
        on_network("pnap-phx", "PHX"),
        None
    ))
    .allowed());
    for (pool, location, says) in [
        ("pnap-phx", "ASH", "location PHX"),
        ("vrf-da", "PHX", "backed by Metal"),
    ] {
        let r = decide(profile_request("CREATE", on_network(pool, location), None));
        let d = r.denial.expect("denied");
        assert!(
            d.message.starts_with("spec.ports[0].vlans[0].pool: "),
            "{}",
            d.message
        );
        assert!(d.message.contains(says), "{}", d.message);
    }
    // Port modes on phoenixNAP: denied, naming the field.
    let r = decide(profile_request(
        "CREATE",
        json!({"location": "PHX", "ports": [{"name": "bond0", "layer2": true}]}),
        None,
    ));
    let d = r.denial.expect("denied");
    assert!(
        d.message.starts_with("spec.ports[0].layer2: "),
        "{}",
        d.message
    );
    // Elastic IPs come from Metal's VRF-backed pools only.
    let r = decide(profile_request("CREATE", elastic("pnap-phx"), None));
    let d = r.denial.expect("denied");
    assert!(
        d.message.contains("elastic IPs come from a VRF-backed"),
        "{}",
        d.message
    );
    // The port rules: layer2 on an eth port.
    let r = decide(profile_request(
        "UPDATE",
        json!({"ports": [{"name": "eth1", "layer2": true}]}),
        Some(json!({})),
    ));
    let d = r.denial.expect("denied");
    assert_eq!((d.code, d.reason), (422, "Invalid"));
    assert!(
        d.message.starts_with("spec.ports[0].layer2: "),
        "{}",
        d.message
    );
    // An unchanged spec passes without checks.
    let bad = json!({"ports": [{"name": "eth1", "layer2": true}]});
    let r = decide(profile_request("UPDATE", bad.clone(), Some(bad.clone())));
    assert_eq!((r.allowed(), r.outcome), (true, "spec-unchanged"));
}

/// Machines using a profile, for the DELETE check.
struct Using(Vec<&'static str>);

impl metal_ipam_core::admission::MachineLookup for Using {
    fn using(&self, ns: &str, profile: &str) -> metal_ipam_core::error::Result<Vec<String>> {
        assert_eq!((ns, profile), ("team-a", "l2"));
        Ok(self.0.iter().map(|m| m.to_string()).collect())
    }
}

/// A profile Machines use is not deleted (403 naming them) unless it
/// carries the skip annotation; one nobody uses is; without the Machines
/// (no Kubernetes access) the review fails rather than allow it.
#[test]
fn a_profile_in_use_is_not_deleted() {
    use metal_ipam_core::admission::evaluate_with;
    let no_pools: Vec<Loaded> = Vec::new();
    let delete = |annotations: Value| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "DELETE", "name": "l2", "namespace": "team-a",
                "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": "MetalNetworkProfile"},
                "oldObject": {"metadata": {"name": "l2", "namespace": "team-a", "annotations": annotations},
                    "spec": {}}}})
        .to_string()
        .into_bytes()
    };
    let r = evaluate_with(
        &delete(json!({})),
        &no_pools,
        &Using(vec!["m-0", "m-1"]),
        None,
    )
    .unwrap();
    let d = r.denial.expect("denied");
    assert_eq!((d.code, d.reason), (403, "ProfileInUse"));
    assert!(
        d.message.contains("team-a/m-0, team-a/m-1"),
        "{}",
        d.message
    );
    let many: Vec<&'static str> = vec!["m"; 12];
    let d = evaluate_with(&delete(json!({})), &no_pools, &Using(many), None)
        .unwrap()
        .denial
        .unwrap();
    assert!(d.message.contains("and 2 more"), "{}", d.message);
    let skip = json!({"ipam.metal-ipam.dev/skip-validate-delete-webhook": ""});
    let r = evaluate_with(&delete(skip), &no_pools, &Using(vec!["m-0"]), None).unwrap();
    assert_eq!((r.allowed(), r.outcome), (true, "skip-annotation"));
    assert_eq!(r.warnings.len(), 1);
    let r = evaluate_with(&delete(json!({})), &no_pools, &Using(vec![]), None).unwrap();
    assert!(r.allowed());
    let e = evaluate(&delete(json!({})), &no_pools).unwrap_err();
    assert_eq!((e.status(), e.reason()), (500, "KubeNotConfigured"));
}

fn prefix(ns_: Option<&str>, name: &str) -> PoolId {
    use metal_ipam_core::ipam::pool::PoolKind;
    match ns_ {
        Some(n) => PoolId::of(PoolKind::NamespacedPrefix, n, name),
        None => PoolId::of(PoolKind::GlobalPrefix, "", name),
    }
}

/// Prefix pools are checked against pools of every kind, in addresses: a
/// sub-prefix overlapping another pool's addresses is an overlap, either
/// way round; a prefix pool's invalid spec names the prefix pool's field;
/// shrinking it below a bound sub-prefix, changing its allocation length
/// while in use, and deleting it while in use are denied.
#[test]
fn prefix_pools_follow_the_same_rules_in_addresses() {
    let nodes = ns("team-a", "nodes");
    let pods = prefix(Some("team-a"), "pods");
    let pspec = |p: &[&str], len: u8| json!({"prefixes": p, "allocationPrefixLength": len});
    // The address pool 10.0.0.200–210 lies in the /28 10.0.0.192/28.
    let store = vec![stored(&nodes, spec(&["10.0.0.200-10.0.0.210"], 24), 0)];
    let r = run(&create(&pods, pspec(&["10.0.0.128/25"], 28)), &store);
    assert_eq!(
        denied(&r),
        (
            422,
            "PoolOverlap",
            "spec.prefixes: MetalPrefixPool team-a/pods would share 10.0.0.200 and 10 more addresses with \
             MetalIPPool team-a/nodes of the same namespace; both could hand out the same address"
        )
    );
    // The reverse: an address pool created over a prefix pool.
    let store = vec![stored(&pods, pspec(&["10.0.0.128/25"], 28), 0)];
    let r = run(
        &create(&nodes, spec(&["10.0.0.200-10.0.0.210"], 24)),
        &store,
    );
    assert_eq!(denied(&r).1, "PoolOverlap");
    // A global prefix pool against a namespaced one.
    let r = run(
        &create(&prefix(None, "edge"), pspec(&["10.0.0.0/24"], 26)),
        &store,
    );
    assert_eq!(denied(&r).1, "PoolOverlap");
    // Disjoint: allowed.
    let r = run(
        &create(&prefix(None, "edge"), pspec(&["10.0.1.0/24"], 26)),
        &store,
    );
    assert!(r.allowed(), "{:?}", r.to_json());
    // Invalid: the field is the prefix pool's.
    let r = run(&create(&pods, pspec(&["10.0.0.129/25"], 28)), &[].to_vec());
    assert_eq!(denied(&r).0, 422);
    assert!(
        denied(&r).2.starts_with("spec.prefixes[0]"),
        "{}",
        denied(&r).2
    );
    // In use: two /28s bound.
    let s = pspec(&["10.0.0.128/25"], 28);
    let store = vec![stored(&pods, s.clone(), 2)];
    let r = run(
        &update(&pods, s.clone(), pspec(&["10.0.0.160/27"], 28)),
        &store,
    );
    assert_eq!(denied(&r).1, "AllocatedAddressesDropped");
    let r = run(
        &update(&pods, s.clone(), pspec(&["10.0.0.128/25"], 29)),
        &store,
    );
    assert_eq!(denied(&r).1, "AllocatedAddressesDropped");
    // Growing keeps them: allowed.
    let r = run(
        &update(&pods, s.clone(), pspec(&["10.0.0.0/24"], 28)),
        &store,
    );
    assert!(r.allowed(), "{:?}", r.to_json());
    let r = run(&delete(&pods, pool_json(&pods, s)), &store);
    assert_eq!(denied(&r).1, "PoolInUse");
}
