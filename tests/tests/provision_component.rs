//! The `provision` component on the test host, from the real `.wasm` files:
//! a VRF-backed pool's events go through `events` to `provision` by service
//! chaining; the step answers 202 while Metal works (and `events` 503 with
//! `Retry-After`, so the forwarder delivers again), then the pool is ready
//! and hands out addresses; only `provision` reaches Metal. Every test runs
//! on real Spin too when `SPIN_BIN` is given (`spin_sqlite::`,
//! `spin_redis::`), against FakeKube and the Metal simulator.

use metal_ipam_tests::fake_kube::{FakeKube, METAL_GROUP};
use metal_ipam_tests::harness::{given, App, Runtime};
use metal_ipam_tests::metal_sim::{Fault, MetalSim, SimConfig};
use metal_ipam_tests::vrf_world::metal_app_on;
use serde_json::{json, Value};

fn pool() -> Value {
    json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
        "metadata": {"name": "vrf", "namespace": "team-a"},
        "spec": {"metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
            "reservation": {"network": "10.10.1.0", "cidr": 29}}}
    })
}

/// A simulator whose new gateways turn active after `reads` reads.
async fn sim(reads: u32) -> MetalSim {
    MetalSim::start_with(SimConfig {
        gateway_reads: Some(reads),
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

async fn a_vrf_pool_event_is_provisioned_through_the_components(runtime: Runtime) {
    let kube = FakeKube::start().await;
    let sim = sim(1).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    kube.create(pool());

    let mut last = None;
    for _ in 0..6 {
        let obj = kube
            .get(METAL_GROUP, "metalippools", Some("team-a"), "vrf")
            .unwrap();
        let r = app
            .call(
                "POST",
                "/v1/events",
                Some(&json!({"type": "MODIFIED", "object": obj})),
            )
            .await;
        let steps: Vec<&str> = r.body["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["step"].as_str().unwrap())
            .collect();
        assert_eq!(steps, ["pools", "provision"], "{:#}", r.body);
        if r.status == 200 {
            last = Some(r);
            break;
        }
        // Still working on Metal: 503 with the step's Retry-After.
        assert_eq!(r.status, 503, "{:#}", r.body);
        assert!(r.headers.get("retry-after").is_some());
        assert_eq!(r.body["steps"][1]["status"], 202);
    }
    let r = last.expect("ready within six deliveries");
    assert_eq!(
        r.body["steps"][1]["result"]["result"], "synced",
        "{:#}",
        r.body
    );
    // The pools step leaves a VRF-backed pool to provision.
    assert_eq!(r.body["steps"][0]["result"]["result"], "ignored");
    assert_eq!((sim.vrfs().len(), sim.gateways().len()), (1, 1));
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert_eq!(kube.schema_violations(), Vec::<String>::new());

    // The pool hands out the block's addresses through the plain API too.
    let got = app
        .call(
            "POST",
            "/v1/claims",
            Some(&json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
                "metadata": {"name": "m-0", "namespace": "team-a", "uid": "u-0"},
                "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "vrf"}}})),
        )
        .await;
    assert_eq!(got.status, 201, "{:#}", got.body);
    assert_eq!(got.body["spec"]["gateway"], "10.10.1.1");
}

async fn without_metal_configured_a_vrf_pool_fails_loudly_and_nothing_else_does(runtime: Runtime) {
    let kube = FakeKube::start().await;
    kube.create(pool());
    // No Metal variables: a VRF-backed pool cannot be provisioned; the
    // forwarder is told to retry (502), the reason is in the step result.
    let vars = [
        ("k8s_api_url", kube.base_url()),
        ("k8s_token", kube.token().to_string()),
    ];
    let app = App::on(runtime, &vars, &[]).await.expect("given");
    let obj = kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "vrf")
        .unwrap();
    let r = app
        .call(
            "POST",
            "/v1/events",
            Some(&json!({"type": "MODIFIED", "object": obj})),
        )
        .await;
    assert_eq!(r.status, 502, "{:#}", r.body);
    assert_eq!(r.body["steps"][1]["status"], 500);
    assert_eq!(r.body["steps"][1]["result"]["reason"], "MetalNotConfigured");
    // The chained routes are not public.
    for path in [
        "/v1/capi/metal/pools/team-a/vrf",
        "/v1/capi/metal/claims/team-a/m-0",
    ] {
        assert_eq!(app.call("POST", path, None).await.status, 404, "{path}");
    }
    // Nothing to poll without Metal: the CronJob's run succeeds, saying so.
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(
        (r.status, &r.body["result"]),
        (200, &json!("skipped")),
        "{:#}",
        r.body
    );
}

async fn the_reconcile_run_drives_a_vrf_pool_to_ready_without_events(runtime: Runtime) {
    let kube = FakeKube::start().await;
    let sim = sim(2).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    kube.create(pool());
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = app.call("POST", "/v1/reconcile", None).await;
        assert_eq!(r.status, 200, "{:#}", r.body);
        let p = &r.body["provision"][0];
        assert_eq!(p["pool"], "team-a/vrf");
        statuses.push(p["status"].as_u64().unwrap());
        if p["result"] == "synced" {
            break;
        }
    }
    assert_eq!(statuses.first(), Some(&202), "{statuses:?}");
    assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
    let obj = kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "vrf")
        .unwrap();
    assert_eq!(obj["status"]["metal"]["gateway"]["state"], "active");
    assert_eq!(sim.vrfs().len(), 1);
    assert_eq!(sim.violations(), Vec::<String>::new());
}

async fn the_public_route_advances_a_vrf_pool_and_names_where_to_poll(runtime: Runtime) {
    let kube = FakeKube::start().await;
    let sim = sim(1).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    kube.create(pool());
    let path = "/v1/metal/pools/team-a/vrf";
    assert_eq!(app.call_with("POST", path, None, None).await.status, 401);
    assert_eq!(app.call("GET", path, None).await.status, 405);
    let first = app.call("POST", path, None).await;
    assert_eq!(first.status, 202, "{:#}", first.body);
    assert_eq!(first.headers["location"], path);
    assert!(first.headers.get("retry-after").is_some());
    assert_eq!(first.body["result"], "waiting");
    let mut last = first;
    for _ in 0..4 {
        last = app.call("POST", path, None).await;
        if last.status == 200 {
            break;
        }
    }
    assert_eq!(
        (last.status, last.body["result"].as_str()),
        (200, Some("synced")),
        "{:#}",
        last.body
    );
    assert!(last.headers.get("location").is_none());
    assert_eq!(sim.violations(), Vec::<String>::new());
}

/// A claim in a VRF-backed pool through the real components: `events`
/// forwards it to `allocate`, which binds it and names the assign step;
/// `assign` assigns the address to the claim's device in Metal. On
/// deletion, `release` waits, `assign` removes the assignment, `release`
/// runs again and frees the address. The poll and the public claim route
/// answer with the API token only.
async fn a_claims_metal_assignment_follows_it_through_the_components(runtime: Runtime) {
    let kube = FakeKube::start().await;
    let sim = sim(1).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    kube.create(pool());
    let path = "/v1/metal/pools/team-a/vrf";
    for _ in 0..4 {
        if app.call("POST", path, None).await.status == 200 {
            break;
        }
    }
    let device = "6f1d2c3b-4a59-4e68-8f70-9a8b7c6d5e4f";
    sim.add_device(device, "da", 2);
    let claim = kube.create(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": "m-0", "namespace": "team-a",
            "annotations": {"ipam.metal-ipam.dev/device": format!("equinixmetal://{device}")}},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "vrf"}}
    }));
    let steps = |r: &metal_ipam_tests::harness::Resp| -> Vec<String> {
        r.body["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{} {}",
                    s["step"].as_str().unwrap(),
                    s["result"]["result"].as_str().unwrap_or("?")
                )
            })
            .collect()
    };
    let r = app
        .call(
            "POST",
            "/v1/events",
            Some(&json!({"type": "ADDED", "object": claim})),
        )
        .await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(steps(&r), ["allocate bound", "assign bound"]);
    let a = sim.assignments();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].address, "10.10.1.2");

    // The public claim route is the same step: converged, no Metal call.
    sim.clear_requests();
    let claim_path = "/v1/metal/claims/team-a/m-0";
    assert_eq!(
        app.call_with("POST", claim_path, None, None).await.status,
        401
    );
    let r = app.call("POST", claim_path, None).await;
    assert_eq!(
        (r.status, r.body["result"].as_str()),
        (200, Some("bound")),
        "{:#}",
        r.body
    );
    assert!(sim.requests().is_empty());

    // Deleted: release waits for the assignment to go, then frees.
    kube.delete(
        metal_ipam_tests::fake_kube::IPAM_GROUP,
        "ipaddressclaims",
        Some("team-a"),
        "m-0",
    );
    let r = app
        .call(
            "POST",
            "/v1/events",
            Some(&json!({"type": "DELETED", "object": claim})),
        )
        .await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(
        steps(&r),
        ["release waiting", "assign released", "release released"]
    );
    assert!(sim.assignments().is_empty());

    // The poll: its cursor moves over the events so far; the API token only.
    assert_eq!(
        app.call_with("POST", "/v1/metal/poll", None, None)
            .await
            .status,
        401
    );
    assert_eq!(app.call("GET", "/v1/metal/poll", None).await.status, 405);
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert!(r.body["events"].as_u64().unwrap() > 0);
    let r = app.call("POST", "/v1/metal/poll", None).await;
    assert_eq!(
        (r.status, &r.body["events"]),
        (200, &json!(0)),
        "{:#}",
        r.body
    );
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert_eq!(kube.schema_violations(), Vec::<String>::new());
}

/// The `Ready` condition of pool `team-a/<name>`: (status, reason, message).
fn ready_of(kube: &FakeKube, name: &str) -> (String, String, String) {
    let obj = kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), name)
        .expect("the pool");
    let c = obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_else(|| panic!("no Ready condition: {obj:#}"));
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

/// Calls the pool's step until it answers without `Retry-After` (at most
/// `n` times); the last answer.
async fn settle(app: &App, path: &str, n: usize) -> metal_ipam_tests::harness::Resp {
    for _ in 0..n {
        let r = app.call("POST", path, None).await;
        if r.headers.get("retry-after").is_none() {
            return r;
        }
    }
    panic!("{path}: still in progress after {n} calls");
}

/// Waits until `cond` holds (the condition is checked every 10 ms, for at
/// most 30 s): what another task does is observed, not timed.
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..3_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

fn nothing_left(sim: &MetalSim) -> (usize, usize, usize, usize) {
    (
        sim.vrfs().len(),
        sim.reservations().len(),
        sim.vlans().len(),
        sim.gateways().len(),
    )
}

/// Finding 6 of issue 17: one instance's VLAN creation is in flight (held
/// 2 s by Metal) when the pool is deleted and another instance runs its
/// teardown. The teardown waits for that creation instead of declaring the
/// pool gone under it; the creation is recorded, then torn down with the
/// rest (by whichever instance runs next): nothing is left in Metal, and
/// the creating instance makes nothing more. A pool re-created under the same name with another block gets a
/// fresh record and its own resources.
async fn a_pool_deleted_while_a_creation_is_in_flight_leaks_nothing_and_its_name_is_reused(
    runtime: Runtime,
) {
    let kube = FakeKube::start().await;
    let sim = sim(1).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    kube.create(pool());
    let path = "/v1/metal/pools/team-a/vrf";
    sim.inject("POST", "createVirtualNetwork", Fault::Latency(2_000), 1);
    let creating = app.call("POST", path, None);
    let tearing_down = async {
        // The creation has reached Metal (its fault was taken) …
        until("the VLAN's creation reaches Metal", || {
            sim.pending_faults() == 0
        })
        .await;
        // … when the pool is deleted and the other instance runs.
        kube.delete(METAL_GROUP, "metalippools", Some("team-a"), "vrf");
        app.call("POST", path, None).await
    };
    let (first, during) = tokio::join!(creating, tearing_down);
    // The teardown did not finish under the creation in flight.
    assert_eq!(during.status, 202, "{:#}", during.body);
    assert!(during.headers.get("retry-after").is_some());
    // The creating instance recorded its VLAN and went no further (the
    // pool is being deleted; it may have run the teardown itself, having
    // read the pool again).
    assert!(
        matches!(first.body["result"].as_str(), Some("failed" | "deleted")),
        "{:#}",
        first.body
    );
    // Then the teardown completes, and nothing is left.
    let last = settle(&app, path, 10).await;
    assert!(
        matches!(last.body["result"].as_str(), Some("deleted" | "absent")),
        "{:#}",
        last.body
    );
    assert!(kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "vrf")
        .is_none());
    assert_eq!(nothing_left(&sim), (0, 0, 0, 0), "left in Metal");
    assert_eq!(sim.applied("createVirtualNetwork"), 1);
    assert_eq!(
        sim.applied("createVrf"),
        1,
        "nothing created after the teardown"
    );

    // The same name again, with another block: its own resources.
    let mut again = pool();
    again["spec"]["metal"]["reservation"]["network"] = json!("10.10.2.0");
    kube.create(again);
    let r = settle(&app, path, 10).await;
    assert_eq!(
        (r.status, r.body["result"].as_str()),
        (200, Some("synced")),
        "{:#}",
        r.body
    );
    let obj = kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "vrf")
        .unwrap();
    assert_eq!(
        obj["status"]["metal"]["reservation"]["block"],
        "10.10.2.0/29"
    );
    assert_eq!(nothing_left(&sim), (1, 1, 1, 1));
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert_eq!(kube.schema_violations(), Vec::<String>::new());
}

/// Finding 7 of issue 17: `gateway: Retain` with a reservation metal-ipam
/// creates (so deletes) is a teardown Metal refuses (a reservation with a
/// gateway cannot be deleted). Even when the webhook is bypassed, the step
/// refuses it before creating anything, naming the field.
async fn a_deletion_policy_metal_cannot_honour_is_refused_before_anything_is_created(
    runtime: Runtime,
) {
    let kube = FakeKube::start().await;
    let sim = sim(1).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    let mut p = pool();
    p["spec"]["metal"]["gateway"] = json!({"deletionPolicy": "Retain"});
    kube.create(p);
    let r = app.call("POST", "/v1/metal/pools/team-a/vrf", None).await;
    assert_eq!(
        (r.status, r.body["result"].as_str()),
        (200, Some("failed")),
        "{:#}",
        r.body
    );
    let (status, _, message) = ready_of(&kube, "vrf");
    assert_eq!(status, "False");
    assert!(
        message.contains("spec.metal.gateway.deletionPolicy"),
        "{message}"
    );
    assert!(sim.requests().is_empty(), "no Metal call");
    assert_eq!(nothing_left(&sim), (0, 0, 0, 0));
}

/// Finding 7 of issue 17: the deletion policy is decided when a resource is
/// adopted or created. An adopted VRF edited to `deletionPolicy: Delete`
/// after provisioning: the step refuses the edit (Ready=False naming the
/// field) and changes nothing in Metal; deleting the pool keeps the
/// adopted VRF.
async fn an_edit_of_spec_metal_after_provisioning_is_refused_and_the_adopted_vrf_is_kept(
    runtime: Runtime,
) {
    let kube = FakeKube::start().await;
    let sim = sim(1).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    // A VRF of the project's own, not metal-ipam's.
    let cfg = sim.metal_config(metal_ipam_core::metal::retry::RetryPolicy::default());
    let vrf = tokio::task::spawn_blocking(move || {
        let http = metal_ipam_tests::metal_sim::BlockingHttp::new();
        let env = metal_ipam_core::testing::TestEnv::at(0);
        metal_ipam_core::metal::client::Metal::new(&http, &cfg, &env)
            .create_vrf(&metal_ipam_core::metal::model::VrfCreateInput {
                name: "shared".into(),
                metro: "da".into(),
                description: None,
                ip_ranges: vec!["10.10.0.0/16".into()],
                local_asn: None,
                tags: vec![],
            })
            .unwrap()
            .id
    })
    .await
    .unwrap();
    let mut p = pool();
    p["spec"]["metal"]["vrf"] = json!({"id": vrf});
    kube.create(p);
    let path = "/v1/metal/pools/team-a/vrf";
    let r = settle(&app, path, 6).await;
    assert_eq!(r.body["result"], "synced", "{:#}", r.body);

    let mut edited = kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "vrf")
        .unwrap();
    edited["spec"]["metal"]["vrf"]["deletionPolicy"] = json!("Delete");
    kube.put(edited);
    sim.clear_requests();
    let r = app.call("POST", path, None).await;
    assert_eq!(r.body["result"], "failed", "{:#}", r.body);
    let (status, _, message) = ready_of(&kube, "vrf");
    assert_eq!(status, "False");
    assert!(
        message.contains("spec.metal.vrf.deletionPolicy"),
        "{message}"
    );
    assert!(
        sim.requests().iter().all(|r| r.method == "GET"),
        "no Metal write"
    );

    kube.delete(METAL_GROUP, "metalippools", Some("team-a"), "vrf");
    let r = settle(&app, path, 10).await;
    assert_eq!(r.body["result"], "deleted", "{:#}", r.body);
    let left: Vec<String> = sim.vrfs().iter().map(|v| v.id.clone()).collect();
    assert_eq!(left, [vrf], "the adopted VRF is kept");
    assert_eq!(
        (
            sim.reservations().len(),
            sim.vlans().len(),
            sim.gateways().len()
        ),
        (0, 0, 0)
    );
    assert_eq!(sim.violations(), Vec::<String>::new());
}

/// The pool half of finding 12 of issue 17: a profile still puts the pool's
/// VLAN on a machine's bond (with a static address). The pool webhook
/// refuses its deletion, naming the profile; deleted anyway, the pool
/// waits, naming the profile, and tears nothing down (the gateway stays, the
/// VLAN stays on the port); once the profile is gone, teardown runs.
async fn pool_teardown_waits_while_a_profile_uses_its_vlan(runtime: Runtime) {
    let kube = FakeKube::start().await;
    let sim = sim(1).await;
    let app = metal_app_on(runtime, &kube, &sim).await.expect("given");
    kube.create(pool());
    let path = "/v1/metal/pools/team-a/vrf";
    assert_eq!(settle(&app, path, 6).await.body["result"], "synced");
    kube.create(json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalNetworkProfile",
        "metadata": {"name": "storage", "namespace": "team-a"},
        "spec": {"metro": "da", "ports": [{"name": "bond0", "layer2": true,
            "vlans": [{"pool": {"name": "vrf"}, "addresses": [{"static": "10.10.1.5/29"}]}]}]}
    }));
    let device = sim.add_device("0c7e5d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6", "da", 2);
    let bond = device.port("bond0").unwrap().id.clone();
    let vlan = sim.vlans()[0].id.clone();
    sim.assign_vlan(&bond, &vlan);

    // The pool webhook refuses the delete, naming the profile (it reads the
    // profiles from the API server and the pool's VLAN from the store).
    let object = kube
        .get(METAL_GROUP, "metalippools", Some("team-a"), "vrf")
        .unwrap();
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "DELETE", "namespace": "team-a", "name": "vrf",
            "kind": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "kind": "MetalIPPool"},
            "resource": {"group": "ipam.metal-ipam.dev", "version": "v1alpha1", "resource": "metalippools"},
            "oldObject": object, "object": null}});
    let r = app.call("POST", "/v1/admission/pools", Some(&review)).await;
    assert_eq!(r.status, 200, "{:#}", r.body);
    let resp = &r.body["response"];
    assert_eq!(resp["allowed"], false, "{:#}", r.body);
    assert_eq!(resp["status"]["code"], 403, "{:#}", r.body);
    let msg = resp["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("team-a/storage"), "{msg}");

    // Deleted anyway (the webhook bypassed): the teardown waits.
    kube.delete(METAL_GROUP, "metalippools", Some("team-a"), "vrf");
    let r = app.call("POST", path, None).await;
    assert_eq!(r.status, 202, "{:#}", r.body);
    let (status, reason, message) = ready_of(&kube, "vrf");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PoolVlanInUse")
    );
    assert!(message.contains("team-a/storage"), "{message}");
    assert_eq!(nothing_left(&sim), (1, 1, 1, 1), "nothing torn down");
    assert_eq!(sim.devices()[0].port("bond0").unwrap().vlans, [vlan]);

    // The profile goes: teardown runs (the port, which no profile of ours
    // names any more, is unassigned in Metal's order).
    kube.delete(
        METAL_GROUP,
        "metalnetworkprofiles",
        Some("team-a"),
        "storage",
    );
    let r = settle(&app, path, 10).await;
    assert_eq!(r.body["result"], "deleted", "{:#}", r.body);
    assert_eq!(nothing_left(&sim), (0, 0, 0, 0));
    assert!(sim.devices()[0].port("bond0").unwrap().vlans.is_empty());
    assert_eq!(sim.violations(), Vec::<String>::new());
}

metal_ipam_tests::on_every_runtime!(
    given: a_vrf_pool_event_is_provisioned_through_the_components,
    without_metal_configured_a_vrf_pool_fails_loudly_and_nothing_else_does,
    the_reconcile_run_drives_a_vrf_pool_to_ready_without_events,
    the_public_route_advances_a_vrf_pool_and_names_where_to_poll,
    a_claims_metal_assignment_follows_it_through_the_components,
    a_pool_deleted_while_a_creation_is_in_flight_leaks_nothing_and_its_name_is_reused,
    a_deletion_policy_metal_cannot_honour_is_refused_before_anything_is_created,
    an_edit_of_spec_metal_after_provisioning_is_refused_and_the_adopted_vrf_is_kept,
    pool_teardown_waits_while_a_profile_uses_its_vlan,
);
