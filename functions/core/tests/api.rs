//! Every route's HTTP behaviour, natively: authentication, routing, methods,
//! bodies, statuses and error bodies. The same handlers run inside the
//! components; tests/ runs them again through the real .wasm files.

use metal_ipam_core::http::api::{self, ApiRequest, ApiResponse};
use metal_ipam_core::testing::{allocate, claims, pools, Backend, RouteFn, World};
use serde_json::{json, Value};

const TOKEN: &str = "t0ken-for-tests";

type Handler = RouteFn;

/// The HTTP calls the tests make, authenticated unless said otherwise.
trait Calls {
    /// The world the calls run in.
    fn base(&self) -> &World;

    fn call(&self, h: Handler, method: &str, path: &str, body: Option<Value>) -> ApiResponse {
        self.call_auth(h, method, path, body, Some(&format!("Bearer {TOKEN}")))
    }

    fn call_auth(
        &self,
        h: Handler,
        method: &str,
        path: &str,
        body: Option<Value>,
        auth: Option<&str>,
    ) -> ApiResponse {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        self.send(h, method, path, auth, &bytes)
    }

    /// Sends raw body bytes (e.g. malformed JSON) with the right token.
    fn call_raw(&self, h: Handler, method: &str, path: &str, body: &str) -> ApiResponse {
        self.send(
            h,
            method,
            path,
            Some(&format!("Bearer {TOKEN}")),
            body.as_bytes(),
        )
    }

    fn send(
        &self,
        h: Handler,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: &[u8],
    ) -> ApiResponse {
        self.base().request((h, TOKEN), (method, path), auth, body)
    }
}

impl Calls for World {
    fn base(&self) -> &World {
        self
    }
}

fn pool(name: &str, addresses: &[&str]) -> Value {
    json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
           "metadata": {"name": name, "namespace": "team-a"},
           "spec": {"addresses": addresses, "prefix": 24, "gateway": "10.20.0.1"}})
}

fn claim(name: &str, uid: &str, pool: &str) -> Value {
    json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
           "metadata": {"name": name, "namespace": "team-a", "uid": uid},
           "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": pool}}})
}

fn reason(r: &ApiResponse) -> &str {
    r.body
        .as_ref()
        .and_then(|b| b["reason"].as_str())
        .unwrap_or("")
}

#[test]
fn every_route_requires_the_bearer_token() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let cases: [(Handler, &str, &str); 6] = [
        (pools, "GET", "/v1/pools"),
        (pools, "PUT", "/v1/pools/team-a/p"),
        (pools, "GET", "/v1/global-pools/g"),
        (allocate, "POST", "/v1/claims"),
        (claims, "GET", "/v1/claims/team-a/m"),
        (claims, "DELETE", "/v1/claims/team-a/m"),
    ];
    for (h, m, p) in cases {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Basic dXNlcjpwYXNz"),
            Some(TOKEN),
        ] {
            let r = w.call_auth(h, m, p, Some(pool("p", &["10.20.0.0/24"])), auth);
            assert_eq!(r.status, 401, "{m} {p} with {auth:?}");
            assert_eq!(reason(&r), "Unauthorized");
            assert!(r.headers.iter().any(|(k, _)| *k == "www-authenticate"));
            assert!(!r.body.as_ref().unwrap().to_string().contains(TOKEN));
        }
    }
    assert!(
        w.kv.dump().is_empty(),
        "nothing was written by unauthenticated requests"
    );
    // Unknown paths under a component's prefix also need the token first.
    assert_eq!(
        w.call_auth(pools, "GET", "/v1/pools/a/b/c", None, None)
            .status,
        401
    );
    assert_eq!(w.call(pools, "GET", "/v1/pools/a/b/c", None).status, 404);
}

#[test]
fn pool_routes_round_trip() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let r = w.call(
        pools,
        "PUT",
        "/v1/pools/team-a/p",
        Some(pool("p", &["10.20.0.0/24"])),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(
        r.body.as_ref().unwrap()["status"]["ipAddresses"],
        json!({"total": 253, "used": 0, "free": 253, "outOfRange": 0})
    );
    assert_eq!(
        w.call(
            pools,
            "PUT",
            "/v1/pools/team-a/p",
            Some(pool("p", &["10.20.0.0/24"]))
        )
        .status,
        200
    );
    let r = w.call(pools, "GET", "/v1/pools/team-a/p", None);
    assert_eq!((r.status, r.outcome), (200, "read"));
    assert_eq!(r.body.as_ref().unwrap()["spec"]["gateway"], "10.20.0.1");
    let global = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "GlobalMetalIPPool",
        "metadata": {"name": "g"}, "spec": {"addresses": ["2001:db8::/64"], "prefix": 64}});
    assert_eq!(
        w.call(pools, "PUT", "/v1/global-pools/g", Some(global))
            .status,
        201
    );
    let list = w.call(pools, "GET", "/v1/pools", None);
    let items = list.body.as_ref().unwrap()["items"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(items.len(), 2);
    let g = w.call(pools, "GET", "/v1/global-pools/g", None);
    // 2^64 - 1 addresses: saturated at the largest Kubernetes integer.
    assert_eq!(
        g.body.as_ref().unwrap()["status"]["ipAddresses"]["total"],
        json!(i64::MAX)
    );
    let globals = w.call(pools, "GET", "/v1/global-pools", None);
    assert_eq!(
        globals.body.as_ref().unwrap()["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        w.call(pools, "DELETE", "/v1/global-pools/g", None).status,
        204
    );
    assert_eq!(
        w.call(pools, "DELETE", "/v1/global-pools/g", None).status,
        204,
        "idempotent"
    );
    let r = w.call(pools, "GET", "/v1/global-pools/g", None);
    assert_eq!((r.status, reason(&r)), (404, "PoolNotFound"));
    let r = w.call(pools, "POST", "/v1/pools/team-a/p", None);
    assert_eq!(r.status, 405);
    assert!(r
        .headers
        .iter()
        .any(|(k, v)| *k == "allow" && v.contains("PUT")));
    assert_eq!(w.call(pools, "DELETE", "/v1/pools", None).status, 405);
}

#[test]
fn bad_pool_input_gets_a_clear_4xx_and_changes_nothing() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let before = w.kv.dump();
    let cases = [
        (Some(json!("not an object")), 400, "MalformedRequest"),
        (Some(pool("q", &["10.20.0.0/24"])), 422, "Invalid"),
        (Some(pool("p", &[])), 422, "Invalid"),
        (
            Some(pool("p", &["10.20.0.0/24", "10.21.0.5"])),
            422,
            "Invalid",
        ),
    ];
    for (body, status, why) in cases {
        let r = w.call(pools, "PUT", "/v1/pools/team-a/p", body);
        assert_eq!((r.status, reason(&r)), (status, why), "{:?}", r.body);
        assert!(r.body.as_ref().unwrap()["message"].as_str().unwrap().len() > 5);
    }
    let raw = w.call_raw(pools, "PUT", "/v1/pools/team-a/p", "{\"apiVersion\": ");
    assert_eq!((raw.status, reason(&raw)), (400, "MalformedJSON"));
    let r = w.call(
        pools,
        "PUT",
        "/v1/pools/Team_A/p",
        Some(pool("p", &["10.20.0.0/24"])),
    );
    assert_eq!(r.status, 400);
    let r = w.call(
        pools,
        "PUT",
        "/v1/pools/team-a/p",
        Some(pool("p", &["10.20.0.0/24", "10.21.0.5"])),
    );
    assert_eq!(r.body.as_ref().unwrap()["field"], "spec.addresses[1]");
    assert_eq!(w.kv.dump(), before, "no key was written");
}

#[test]
fn a_vrf_pool_is_not_registered_before_its_metal_resources_exist() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let before = w.kv.dump();
    let mut body = pool("p", &[]);
    body["spec"] = json!({"metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
        "reservation": {"network": "10.10.1.0", "cidr": 29}}});
    let r = w.call(pools, "PUT", "/v1/pools/team-a/p", Some(body.clone()));
    assert_eq!(
        (r.status, reason(&r)),
        (409, "MetalNotProvisioned"),
        "{:?}",
        r.body
    );
    assert_eq!(r.body.as_ref().unwrap()["field"], "spec.metal");
    // A broken Metal section is a 422 naming the field, before that.
    body["spec"]["metal"]["reservation"]["cidr"] = json!(30);
    let r = w.call(pools, "PUT", "/v1/pools/team-a/p", Some(body));
    assert_eq!((r.status, reason(&r)), (422, "Invalid"));
    assert_eq!(
        r.body.as_ref().unwrap()["field"],
        "spec.metal.reservation.cidr"
    );
    assert_eq!(w.kv.dump(), before, "no key was written");
}

#[test]
fn claims_allocate_read_release() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    w.call(
        pools,
        "PUT",
        "/v1/pools/team-a/p",
        Some(pool("p", &["10.20.0.10-10.20.0.11"])),
    );
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(claim("m-0", "u0", "p")),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let a = r.body.clone().unwrap();
    assert_eq!(a["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
    assert_eq!(a["kind"], "IPAddress");
    assert_eq!(a["metadata"]["name"], "m-0");
    assert_eq!(a["spec"]["address"], "10.20.0.10");
    assert_eq!(a["spec"]["prefix"], 24);
    assert_eq!(a["spec"]["gateway"], "10.20.0.1");
    assert_eq!(a["spec"]["claimRef"]["name"], "m-0");
    assert_eq!(
        a["spec"]["poolRef"],
        claim("m-0", "u0", "p")["spec"]["poolRef"]
    );
    assert!(r
        .headers
        .contains(&("location", "/v1/claims/team-a/m-0".to_string())));
    let again = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(claim("m-0", "u0", "p")),
    );
    assert_eq!(
        (again.status, again.body.clone().unwrap()),
        (200, a.clone())
    );
    let got = w.call(claims, "GET", "/v1/claims/team-a/m-0", None);
    assert_eq!((got.status, got.body.unwrap()), (200, a));
    // v1beta1 claims are answered in v1beta1.
    let mut old = claim("m-1", "u1", "p");
    old["apiVersion"] = json!("ipam.cluster.x-k8s.io/v1beta1");
    let r = w.call(allocate, "POST", "/v1/claims", Some(old));
    assert_eq!(
        r.body.unwrap()["apiVersion"],
        "ipam.cluster.x-k8s.io/v1beta1"
    );
    // Exhausted.
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(claim("m-2", "u2", "p")),
    );
    assert_eq!((r.status, reason(&r)), (409, "PoolExhausted"));
    assert_eq!(
        r.objects.iter().find(|(k, _)| *k == "pool").unwrap().1,
        "team-a/p"
    );
    // Release, twice, then the waiting claim gets the address.
    assert_eq!(
        w.call(claims, "DELETE", "/v1/claims/team-a/m-0", None)
            .status,
        204
    );
    assert_eq!(
        w.call(claims, "DELETE", "/v1/claims/team-a/m-0", None)
            .status,
        204
    );
    assert_eq!(
        w.call(claims, "DELETE", "/v1/claims/team-a/never", None)
            .status,
        204
    );
    let r = w.call(claims, "GET", "/v1/claims/team-a/m-0", None);
    assert_eq!((r.status, reason(&r)), (404, "ClaimNotFound"));
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(claim("m-2", "u2", "p")),
    );
    assert_eq!(
        (r.status, r.body.unwrap()["spec"]["address"].clone()),
        (201, json!("10.20.0.10"))
    );
    // Deleting the pool while in use is refused.
    let r = w.call(pools, "DELETE", "/v1/pools/team-a/p", None);
    assert_eq!((r.status, reason(&r)), (409, "PoolInUse"));
    // A stale delete for another uid is a no-op.
    assert_eq!(
        w.call(claims, "DELETE", "/v1/claims/team-a/m-2?uid=old", None)
            .status,
        204
    );
    assert_eq!(
        w.call(claims, "GET", "/v1/claims/team-a/m-2", None).status,
        200
    );
    assert_eq!(
        w.call(claims, "PUT", "/v1/claims/team-a/m-2", None).status,
        405
    );
    assert_eq!(w.call(allocate, "GET", "/v1/claims", None).status, 405);
}

#[test]
fn claim_errors() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    w.call(
        pools,
        "PUT",
        "/v1/pools/team-a/p",
        Some(pool("p", &["10.20.0.0/24"])),
    );
    let mut foreign = claim("m", "u", "p");
    foreign["spec"]["poolRef"] =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"});
    let r = w.call(allocate, "POST", "/v1/claims", Some(foreign));
    assert_eq!((r.status, reason(&r)), (422, "UnsupportedPoolRef"));
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(claim("m", "u", "nope")),
    );
    assert_eq!((r.status, reason(&r)), (404, "PoolNotFound"));
    let r = w.call_raw(allocate, "POST", "/v1/claims", "{{{");
    assert_eq!((r.status, reason(&r)), (400, "MalformedJSON"));
    let r = w.call_raw(allocate, "POST", "/v1/claims", "");
    assert_eq!(r.status, 400);
    let mut req = claim("m", "u", "p");
    req["metadata"]["annotations"] = json!({"ipam.metal-ipam.dev/requested-address": "10.20.0.77"});
    let r = w.call(allocate, "POST", "/v1/claims", Some(req));
    assert_eq!(r.body.unwrap()["spec"]["address"], "10.20.0.77");
    let mut taken = claim("m2", "u2", "p");
    taken["metadata"]["annotations"] =
        json!({"ipam.metal-ipam.dev/requested-address": "10.20.0.77"});
    let r = w.call(allocate, "POST", "/v1/claims", Some(taken.clone()));
    assert_eq!((r.status, reason(&r)), (409, "AddressInUse"));
    taken["metadata"]["annotations"] =
        json!({"ipam.metal-ipam.dev/requested-address": "10.99.0.1"});
    let r = w.call(allocate, "POST", "/v1/claims", Some(taken));
    assert_eq!((r.status, reason(&r)), (409, "AddressNotInPool"));
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(claim("m", "u", "other")),
    );
    assert_eq!((r.status, reason(&r)), (409, "ClaimPoolConflict"));
}

#[test]
fn log_lines_are_json_with_objects_and_no_secrets() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    w.call(
        pools,
        "PUT",
        "/v1/pools/team-a/p",
        Some(pool("p", &["10.20.0.0/24"])),
    );
    let auth = format!("Bearer {TOKEN}");
    let body = claim("m-0", "u0", "p").to_string();
    let req = ApiRequest {
        method: "POST",
        path: "/v1/claims",
        query: "",
        authorization: Some(&auth),
        body: body.as_bytes(),
        headers: &[],
    };
    let ctx = w.ctx();
    let r = allocate(&ctx, TOKEN, &req);
    let line = r.log_line("allocate", &req, 1, 2.5, w.kv.counts());
    assert!(!line.contains(TOKEN) && !line.contains('\n'));
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["route"], "/v1/claims");
    assert_eq!(v["outcome"], "allocated");
    assert_eq!(
        v["objects"],
        json!({"claim": "team-a/m-0", "pool": "team-a/p", "address": "10.20.0.2"})
    );
    assert_eq!(v["duration_ms"], 2.5);
    assert!(v["kv_ops"].as_u64().unwrap() > 0);
    assert_eq!(v["level"], "info");
    // Levels: 5xx error, 4xx warn; a step still working on Metal (503 so
    // that the forwarder delivers again) is expected, so info.
    let level = |status: u16, outcome: &'static str| {
        let mut r = api::ApiResponse::success(status, None, "/v1/events", outcome);
        r.status = status;
        let line = r.log_line("events", &req, 1, 1.0, Default::default());
        serde_json::from_str::<Value>(&line).unwrap()["level"].clone()
    };
    assert_eq!(level(503, "step-failed"), "error");
    assert_eq!(level(404, "not-found"), "warn");
    assert_eq!(level(503, "step-in-progress"), "info");
}

#[test]
fn a_provisioned_vrf_pool_hands_out_its_block() {
    use metal_ipam_core::ipam::ops;
    use metal_ipam_core::ipam::pool::{PoolId, PoolObject};
    let w = World::new(Backend::SpinSqlite, 1_000);
    let ctx = w.ctx();
    let id = PoolId::namespaced("team-a", "p");
    let mut body = pool("p", &[]);
    // An adopted block: its addresses are known only from Metal.
    body["spec"] = json!({"metal": {"metro": "da",
        "vrf": {"id": "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11"},
        "reservation": {"id": "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b12"}}});
    let object = PoolObject::parse(&id, &body).unwrap();
    let block = ("10.10.1.0".parse().unwrap(), 29);
    // (The provision step's gate, its pool not being torn down, always
    // allows here.)
    let may = || Ok(());
    let (_, view) = ops::put_provisioned_pool(&ctx, object.clone(), block, &[], &may).unwrap();
    // .0, .7 and the gateway .1 are not handed out.
    assert_eq!(view.counts.total, 5);
    let stored = w.call(pools, "GET", "/v1/pools/team-a/p", None);
    let spec = &stored.body.as_ref().unwrap()["spec"];
    assert_eq!(spec["addresses"], json!(["10.10.1.0/29"]));
    assert_eq!(spec["gateway"], "10.10.1.1");
    // Registering again is a no-op; a block that disagrees with a given
    // prefix is refused.
    let (again, _) = ops::put_provisioned_pool(&ctx, object.clone(), block, &[], &may).unwrap();
    assert_eq!(again, ops::PutOutcome::Unchanged);
    let mut fixed = object;
    fixed.spec.shape = metal_ipam_core::ipam::pool::PoolShape::addresses(24);
    let e = ops::put_provisioned_pool(&ctx, fixed, block, &[], &may).unwrap_err();
    assert_eq!(e.field(), Some("spec.prefix"));
}

fn prefix_pool(kind: &str, spec: Value) -> Value {
    let mut p = json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": kind,
           "metadata": {"name": "pods"}, "spec": spec});
    if kind == "MetalPrefixPool" {
        p["metadata"]["namespace"] = json!("team-a");
    }
    p
}

fn prefix_claim(name: &str, kind: &str, annotations: Option<Value>) -> Value {
    let mut c = claim(name, &format!("u-{name}"), "pods");
    c["spec"]["poolRef"]["kind"] = json!(kind);
    if let Some(a) = annotations {
        c["metadata"]["annotations"] = a;
    }
    c
}

/// Prefix pools through the HTTP API: registration with the prefix pool's
/// fields, a sub-prefix per claim rendered as the in-cluster provider does
/// (`address` the network address, `prefix` the allocation length),
/// pre-allocations and requested prefixes, counts in sub-prefixes,
/// exhaustion, the shrink and length change refused while in use, and the
/// kinds kept apart (a `MetalIPPool` of the same name is another pool).
#[test]
fn prefix_pools_hand_out_sub_prefixes() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let spec = json!({"prefixes": ["fd00:10::/60"], "excludedPrefixes": ["fd00:10:0:1::5"],
                      "gateway": "fd00:10::1", "preAllocations": {"m-9": "fd00:10:0:7::/64"}});
    let r = w.call(
        pools,
        "PUT",
        "/v1/prefix-pools/team-a/pods",
        Some(prefix_pool("MetalPrefixPool", spec.clone())),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let body = r.body.unwrap();
    assert_eq!(body["spec"]["allocationPrefixLength"], 64);
    // 16 /64s, one excluded (it holds fd00:10:0:1::5).
    assert_eq!(body["status"]["ipAddresses"]["total"], 15);
    // The same name as an address pool is another object.
    let r = w.call(pools, "GET", "/v1/pools/team-a/pods", None);
    assert_eq!(r.status, 404);
    let kind = "MetalPrefixPool";
    let mut got = Vec::new();
    for name in ["m-0", "m-1", "m-2"] {
        let r = w.call(
            allocate,
            "POST",
            "/v1/claims",
            Some(prefix_claim(name, kind, None)),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        let a = r.body.unwrap();
        assert_eq!(a["spec"]["prefix"], 64);
        assert_eq!(a["spec"]["gateway"], "fd00:10::1");
        assert_eq!(a["spec"]["poolRef"]["kind"], kind);
        got.push(a["spec"]["address"].as_str().unwrap().to_string());
    }
    // The lowest free sub-prefixes, skipping the excluded :1::/64.
    assert_eq!(got, ["fd00:10::", "fd00:10:0:2::", "fd00:10:0:3::"]);
    // A pre-allocated claim gets its own; a requested prefix is honoured,
    // and one of another length is refused with a clear reason.
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(prefix_claim("m-9", kind, None)),
    );
    assert_eq!(r.body.unwrap()["spec"]["address"], "fd00:10:0:7::");
    let asks = |p: &str| Some(json!({"ipam.metal-ipam.dev/requested-prefix": p}));
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(prefix_claim("m-5", kind, asks("fd00:10:0:a::/64"))),
    );
    assert_eq!(r.body.unwrap()["spec"]["address"], "fd00:10:0:a::");
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(prefix_claim("m-6", kind, asks("fd00:10::/56"))),
    );
    assert_eq!((r.status, reason(&r)), (409, "AddressNotInPool"));
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(prefix_claim("m-6", kind, asks("fd00:10:0:b::1/64"))),
    );
    assert_eq!(r.status, 422, "host bits set: {:?}", r.body);
    // On an address pool the annotation is refused, not ignored.
    let mut wrong = prefix_claim("m-7", "MetalIPPool", asks("fd00:10:0:b::/64"));
    wrong["spec"]["poolRef"]["name"] = json!("other");
    let r = w.call(allocate, "POST", "/v1/claims", Some(wrong));
    assert_eq!(r.status, 422);
    let r = w.call(pools, "GET", "/v1/prefix-pools/team-a/pods", None);
    let counts = r.body.unwrap()["status"]["ipAddresses"].clone();
    assert_eq!(
        (counts["used"].clone(), counts["free"].clone()),
        (json!(5), json!(10))
    );
    // Changing the allocation length while sub-prefixes are bound would
    // give their values other meanings: refused, nothing changed.
    let mut longer = spec.clone();
    longer["allocationPrefixLength"] = json!(80);
    longer.as_object_mut().unwrap().remove("preAllocations");
    let r = w.call(
        pools,
        "PUT",
        "/v1/prefix-pools/team-a/pods",
        Some(prefix_pool("MetalPrefixPool", longer)),
    );
    assert_eq!((r.status, reason(&r)), (409, "AllocatedAddressesDropped"));
    // Shrinking below a bound sub-prefix: refused too.
    let mut shrunk = spec.clone();
    shrunk["prefixes"] = json!(["fd00:10::/63"]);
    shrunk.as_object_mut().unwrap().remove("preAllocations");
    let r = w.call(
        pools,
        "PUT",
        "/v1/prefix-pools/team-a/pods",
        Some(prefix_pool("MetalPrefixPool", shrunk)),
    );
    assert_eq!((r.status, reason(&r)), (409, "AllocatedAddressesDropped"));
    // Release frees the sub-prefix for the next claim.
    let r = w.call(claims, "DELETE", "/v1/claims/team-a/m-1", None);
    assert!(r.status < 300, "{:?}", r.body);
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(prefix_claim("m-3", kind, None)),
    );
    assert_eq!(r.body.unwrap()["spec"]["address"], "fd00:10:0:2::");
    // Lists: the kind's own route, and `/v1/pools` with every kind.
    let r = w.call(pools, "GET", "/v1/prefix-pools", None);
    assert_eq!(r.body.unwrap()["items"].as_array().unwrap().len(), 1);
    let r = w.call(pools, "GET", "/v1/global-prefix-pools", None);
    assert_eq!(r.body.unwrap()["items"].as_array().unwrap().len(), 0);
}

/// An IPv4 global prefix pool fills up and says so; bad specs are refused
/// with the field named, before anything is stored.
#[test]
fn ipv4_global_prefix_pools_and_their_validation() {
    let w = World::new(Backend::SpinSqlite, 1_000);
    let g = "GlobalMetalPrefixPool";
    let r = w.call(
        pools,
        "PUT",
        "/v1/global-prefix-pools/pods",
        Some(prefix_pool(
            g,
            json!({"prefixes": ["10.20.0.0/26"], "allocationPrefixLength": 28}),
        )),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let mut got = Vec::new();
    for i in 0..4 {
        let r = w.call(
            allocate,
            "POST",
            "/v1/claims",
            Some(prefix_claim(&format!("r-{i}"), g, None)),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        got.push(
            r.body.unwrap()["spec"]["address"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(got, ["10.20.0.0", "10.20.0.16", "10.20.0.32", "10.20.0.48"]);
    let r = w.call(
        allocate,
        "POST",
        "/v1/claims",
        Some(prefix_claim("r-4", g, None)),
    );
    assert_eq!(reason(&r), "PoolExhausted");
    for (spec, field) in [
        (
            json!({"prefixes": ["10.20.0.1/26"], "allocationPrefixLength": 28}),
            "spec.prefixes[0]",
        ),
        (
            json!({"prefixes": ["10.30.0.0/26"]}),
            "spec.allocationPrefixLength",
        ),
        (
            json!({"prefixes": ["10.30.0.0/26"], "allocationPrefixLength": 24}),
            "spec.prefixes[0]",
        ),
        (
            json!({"prefixes": ["10.30.0.0/26", "fd00::/64"], "allocationPrefixLength": 28}),
            "spec.prefixes[1]",
        ),
        (json!({"allocationPrefixLength": 28}), "spec.prefixes"),
        (
            json!({"prefixes": ["10.30.0.0/26"], "allocationPrefixLength": 28, "addresses": []}),
            "spec.addresses",
        ),
        (
            json!({"prefixes": ["10.30.0.0/26"], "allocationPrefixLength": 28,
                "preAllocations": {"a": "10.30.0.8/28"}}),
            "spec.preAllocations.a",
        ),
    ] {
        let r = w.call(
            pools,
            "PUT",
            "/v1/global-prefix-pools/other",
            Some({
                let mut p = prefix_pool(g, spec.clone());
                p["metadata"]["name"] = json!("other");
                p
            }),
        );
        assert_eq!(r.status, 422, "{spec}: {:?}", r.body);
        assert_eq!(
            r.body.as_ref().unwrap()["field"].as_str(),
            Some(field),
            "{spec}: {:?}",
            r.body
        );
    }
    let r = w.call(pools, "GET", "/v1/global-prefix-pools/other", None);
    assert_eq!(r.status, 404);
}
