//! Per-claim Metal IP assignments end to end, natively: a claim in a
//! VRF-backed pool is bound by the IPAM step, then the assign step assigns
//! its address to the device its owner names (`POST /devices/{id}/ips`),
//! and on deletion removes the assignment before the address is released.
//! Exactly once under concurrent runs and after a crash or any fault; a
//! device that is not there yet is waited for and the Metal event poll
//! completes the assignment; a refused assignment shows on the claim and
//! keeps the address. Against the fake Kubernetes API and the Metal
//! simulator, every request checked against the CRDs and the Metal spec.

use metal_ipam_core::capi::assign::{
    sync_claim_assignment, ASSIGNMENT_FINALIZER, CONDITION, DEVICE_ANNOTATION,
};
use metal_ipam_core::capi::poll::poll;
use metal_ipam_core::capi::{self, ClaimAnswer, Reconciled, StepResult};
use metal_ipam_core::cloud::CloudKind;
use metal_ipam_core::error::Result;
use metal_ipam_core::kv::keys;
use metal_ipam_core::network::batch::Direct;
use metal_ipam_core::provision::plan::INTENT_LEASE_S;
use metal_ipam_core::testing::Backend;
use metal_ipam_tests::fake_kube::{CLUSTER_GROUP, INFRA_GROUP, IPAM_GROUP};
use metal_ipam_tests::metal_sim::Fault;
use metal_ipam_tests::vrf_world::{claim, pool_object, World, NS};
use serde_json::{json, Value};

const DEVICE: &str = "6f1d2c3b-4a59-4e68-8f70-9a8b7c6d5e4f";

async fn ready(backend: Backend) -> World {
    let w = World::new(backend).await;
    w.kube.create(pool_object());
    let (o, _) = w.sync_until_settled(6).await;
    assert_eq!(o.result, StepResult::Synced, "{o:?}");
    w
}

/// A `PacketMachine` named `name` (with `providerID` when given); returns
/// its uid.
fn packet_machine(w: &World, name: &str, provider_id: Option<&str>) -> String {
    let mut spec = json!({});
    if let Some(p) = provider_id {
        spec["providerID"] = p.into();
    }
    let o = w.kube.create(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "PacketMachine",
        "metadata": {"name": name, "namespace": NS}, "spec": spec
    }));
    o["metadata"]["uid"].as_str().unwrap().to_string()
}

/// A claim owned by `kind`/`name` (uid `uid`).
fn owned_claim(w: &World, name: &str, api_version: &str, kind: &str, owner: &str, uid: &str) {
    let mut c = claim(name);
    c["metadata"]["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind,
        "name": owner, "uid": uid, "controller": true}]);
    w.kube.create(c);
}

async fn reconcile(w: &World, name: &str, now: u64) -> Reconciled {
    let name = name.to_string();
    w.spawn(now, move |r| {
        capi::reconcile_claim(r.ctx, r.kube, NS, &name)
    })
    .await
    .unwrap()
    .unwrap()
}

async fn try_assign(w: &World, name: &str, now: u64) -> Result<Reconciled> {
    let name = name.to_string();
    w.spawn(now, move |r| {
        sync_claim_assignment(r.ctx, r.kube, r.metal, NS, &name)
    })
    .await
    .unwrap()
}

async fn assign(w: &World, name: &str, now: u64) -> Reconciled {
    try_assign(w, name, now).await.unwrap()
}

fn claim_object(w: &World, name: &str) -> Option<Value> {
    w.kube.get(IPAM_GROUP, "ipaddressclaims", Some(NS), name)
}

/// The claim's `MetalAssigned` condition: (status, reason).
fn condition(w: &World, name: &str) -> (String, String) {
    let c = claim_object(w, name).expect("the claim");
    let cond = c["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION))
        .unwrap_or_else(|| panic!("no {CONDITION} condition: {c:#}"));
    (
        cond["status"].as_str().unwrap().to_string(),
        cond["reason"].as_str().unwrap().to_string(),
    )
}

fn writes(w: &World) -> usize {
    w.sim
        .requests()
        .iter()
        .filter(|r| r.method != "GET")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claims_assignment_appears_and_disappears_with_it() {
    let w = ready(Backend::SpinSqlite).await;
    w.sim.add_device(DEVICE, "da", 2);
    let uid = packet_machine(&w, "pm-0", Some(&format!("equinixmetal://{DEVICE}")));
    owned_claim(
        &w,
        "m-0",
        "infrastructure.cluster.x-k8s.io/v1beta1",
        "PacketMachine",
        "pm-0",
        &uid,
    );

    // The IPAM step binds it and says the assign step comes next.
    let o = reconcile(&w, "m-0", 20_000).await;
    assert_eq!(o.result, StepResult::Bound, "{o:?}");
    assert!(o.metal_assignment());
    w.sim.clear_requests();
    let o = assign(&w, "m-0", 20_001).await;
    assert_eq!(o.result, StepResult::Bound, "{o:?}");
    // Metal calls per claim: the device read, the assignment.
    let ops: Vec<String> = w
        .sim
        .requests()
        .iter()
        .filter_map(|r| r.operation.clone())
        .collect();
    assert_eq!(ops, ["findDeviceById", "createIPAssignment"]);
    let a = w.sim.assignments();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].address.as_str(), a[0].cidr), ("10.10.1.2", 32));
    assert_eq!(a[0].device_id, DEVICE);
    let meta = &a[0].customdata["metal-ipam.dev"];
    assert_eq!(meta["claim"]["name"], "m-0");
    assert_eq!(meta["claim"]["namespace"], NS);
    assert_eq!(
        meta["claim"]["uid"],
        claim_object(&w, "m-0").unwrap()["metadata"]["uid"]
    );
    assert_eq!(meta["pool"], "MetalIPPool team-a/vrf");
    assert_eq!(condition(&w, "m-0"), ("True".into(), "Assigned".into()));
    let c = claim_object(&w, "m-0").unwrap();
    assert!(c["metadata"]["finalizers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == ASSIGNMENT_FINALIZER));
    w.assert_record_valid(
        &keys::metal_claim(NS, "m-0"),
        "metal-assignment-record.schema.json",
    );

    // Converged: no Metal call at all, no Kubernetes write.
    w.sim.clear_requests();
    let rv = w.kube.resource_version();
    assert_eq!(assign(&w, "m-0", 20_002).await.result, StepResult::Bound);
    assert_eq!(
        w.sim.requests().len(),
        0,
        "a converged run calls Metal 0 times"
    );
    assert_eq!(w.kube.resource_version(), rv);

    // Deletion: the release waits for the assign step, which removes the
    // assignment first; then the address is released.
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "m-0");
    let o = reconcile(&w, "m-0", 20_003).await;
    assert_eq!(
        (o.result, o.metal_assignment()),
        (StepResult::Waiting, true),
        "{o:?}"
    );
    assert_eq!(w.sim.assignments().len(), 1, "nothing released yet");
    let o = assign(&w, "m-0", 20_004).await;
    assert_eq!(o.result, StepResult::Released, "{o:?}");
    assert!(w.sim.assignments().is_empty());
    let o = reconcile(&w, "m-0", 20_005).await;
    assert_eq!(o.result, StepResult::Released, "{o:?}");
    assert!(claim_object(&w, "m-0").is_none());
    // Once more, for a late event: nothing to do, no Metal call.
    w.sim.clear_requests();
    assert_eq!(assign(&w, "m-0", 20_006).await.result, StepResult::Absent);
    assert_eq!(w.sim.requests().len(), 0);
    w.assert_clean();

    // The owner was read (a permission RBAC grants for this step only).
    assert!(w.kube.requests().iter().any(|r| r.method == "GET"
        && r.path.contains(&format!(
            "/apis/{INFRA_GROUP}/v1beta1/namespaces/{NS}/packetmachines/pm-0"
        ))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_runs_at_once_on_two_instances_assign_once() {
    for backend in [Backend::SpinSqlite, Backend::RedisSpin36] {
        let w = ready(backend).await;
        w.sim.add_device(DEVICE, "da", 2);
        // The device named by an annotation this time.
        let mut c = claim("m-0");
        c["metadata"]["annotations"] = json!({DEVICE_ANNOTATION: DEVICE});
        w.kube.create(c);
        assert_eq!(reconcile(&w, "m-0", 20_000).await.result, StepResult::Bound);
        let runs: Vec<_> = (0..3)
            .map(|i| {
                w.spawn(20_001 + i % 2, |r| {
                    sync_claim_assignment(r.ctx, r.kube, r.metal, NS, "m-0")
                })
            })
            .collect();
        for r in runs {
            let o = r.await.unwrap().unwrap();
            assert!(
                matches!(o.result, StepResult::Bound | StepResult::Waiting),
                "{o:?}"
            );
        }
        assert_eq!(w.sim.applied("createIPAssignment"), 1, "{backend:?}");
        assert_eq!(assign(&w, "m-0", 20_010).await.result, StepResult::Bound);
        assert_eq!(w.sim.assignments().len(), 1);
        w.assert_clean();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fault_on_any_metal_call_converges_with_one_assignment() {
    let faults = [
        Fault::CrashAfter,
        Fault::Status(503),
        Fault::Drop,
        Fault::RateLimit { retry_after_s: 1 },
    ];
    let mut validated = 0;
    for (method, op) in [("POST", "createIPAssignment"), ("GET", "findDeviceById")] {
        for fault in &faults {
            if method == "GET" && *fault == Fault::CrashAfter {
                continue;
            }
            let w = ready(Backend::RedisSpin36).await;
            w.sim.add_device(DEVICE, "da", 2);
            let mut c = claim("m-0");
            c["metadata"]["annotations"] =
                json!({DEVICE_ANNOTATION: format!("equinixmetal://{DEVICE}")});
            w.kube.create(c);
            reconcile(&w, "m-0", 20_000).await;
            w.sim.inject(method, op, fault.clone(), 1);
            let mut now = 20_001;
            let mut bound = false;
            for _ in 0..6 {
                match try_assign(&w, "m-0", now).await {
                    Ok(o) if o.result == StepResult::Bound => {
                        bound = true;
                        break;
                    }
                    Ok(o) => assert_eq!(o.result, StepResult::Waiting, "{op} {fault:?}: {o:?}"),
                    Err(e) => assert_eq!(e.status(), 503, "{op} {fault:?}: {e}"),
                }
                // The next delivery, past an intent's lease.
                now += INTENT_LEASE_S + 1;
            }
            assert!(bound, "{op} with {fault:?}: not assigned");
            assert_eq!(w.sim.assignments().len(), 1, "{op} with {fault:?}");
            assert_eq!(w.sim.pending_faults(), 0, "{op} with {fault:?}: hit");
            // And it goes away with the claim, fault or not.
            w.kube
                .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "m-0");
            assert_eq!(
                assign(&w, "m-0", now + 1).await.result,
                StepResult::Released
            );
            assert!(w.sim.assignments().is_empty());
            w.assert_clean();
            validated += w.sim.requests().len();
        }
    }
    println!("{validated} Metal requests validated against the spec, 0 violations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_waits_for_its_device_and_the_poll_assigns_it() {
    let w = ready(Backend::SpinSqlite).await;
    // A Machine without a provider ID yet.
    let machine = w.kube.create(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m-a", "namespace": NS}, "spec": {"clusterName": "c"}
    }));
    let uid = machine["metadata"]["uid"].as_str().unwrap().to_string();
    owned_claim(
        &w,
        "m-0",
        "cluster.x-k8s.io/v1beta2",
        "Machine",
        "m-a",
        &uid,
    );
    assert_eq!(reconcile(&w, "m-0", 20_000).await.result, StepResult::Bound);
    let o = assign(&w, "m-0", 20_001).await;
    assert_eq!(o.result, StepResult::Waiting, "{o:?}");
    assert_eq!(
        condition(&w, "m-0"),
        ("False".into(), "DeviceUnknown".into())
    );
    assert!(w
        .sim
        .requests()
        .iter()
        .all(|r| r.operation.as_deref() != Some("createIPAssignment")));

    // The machine gets its device, still provisioning: the first poll
    // rechecks every waiting claim.
    w.sim.add_device_in_state(DEVICE, "da", 2, "provisioning");
    let mut m = w
        .kube
        .get(CLUSTER_GROUP, "machines", Some(NS), "m-a")
        .unwrap();
    m["spec"]["providerID"] = format!("equinixmetal://{DEVICE}").into();
    w.kube.put(m);
    let p = w
        .spawn(20_002, |r| {
            poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.synced, [("team-a/m-0".to_string(), "waiting")], "{p:?}");
    assert_eq!(
        condition(&w, "m-0"),
        ("False".into(), "DeviceNotActive".into())
    );
    assert!(w.kube.requests().iter().any(|r| r.method == "GET"
        && r.path.ends_with(&format!(
            "/apis/{CLUSTER_GROUP}/v1beta2/namespaces/{NS}/machines/m-a"
        ))));

    // Active: the event names the device, the poll assigns.
    w.sim.set_device_state(DEVICE, "active");
    let p = w
        .spawn(20_003, |r| {
            poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.synced, [("team-a/m-0".to_string(), "bound")], "{p:?}");
    assert_eq!(p.events, 1);
    assert_eq!(w.sim.assignments().len(), 1);
    assert_eq!(condition(&w, "m-0"), ("True".into(), "Assigned".into()));

    // The assignment's own event names no device; after it, nothing new:
    // one read of the events, nothing else.
    let p = w
        .spawn(20_004, |r| {
            poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((p.events, p.devices, p.synced.len()), (1, 0, 0), "{p:?}");
    w.sim.clear_requests();
    let p = w
        .spawn(20_004, |r| {
            poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((p.events, p.devices, p.synced.len()), (0, 0, 0), "{p:?}");
    let ops: Vec<String> = w
        .sim
        .requests()
        .iter()
        .filter_map(|r| r.operation.clone())
        .collect();
    assert_eq!(ops, ["findProjectEvents"]);
    w.assert_record_valid(keys::METAL_POLL, "metal-poll-cursor.schema.json");

    // The device is deleted (its assignment with it): a poll that fails
    // to read the device moves the cursor past the event anyway, keeps the
    // device pending and says so (its read put off: nothing more to do
    // before then); the next one at that time handles it.
    w.sim.delete_device(DEVICE);
    w.sim
        .inject("GET", "findDeviceById", Fault::Status(500), 1_000);
    let failed = w
        .spawn(20_005, |r| {
            poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (failed.events, failed.pending, failed.more),
        (1, 1, false),
        "{failed:?}"
    );
    assert_eq!(failed.errors.len(), 1, "{failed:?}");
    assert!(failed.device_deleted.is_empty());
    w.sim.clear_faults();
    let retry_at = failed.device_failures[0].retry_at;
    let p = w
        .spawn(retry_at, |r| {
            poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.device_deleted, ["team-a/m-0"], "{p:?}");
    assert_eq!(
        condition(&w, "m-0"),
        ("False".into(), "DeviceDeleted".into())
    );
    // The claim is still bound; its deletion needs no Metal call.
    w.sim.clear_requests();
    w.kube
        .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "m-0");
    assert_eq!(
        reconcile(&w, "m-0", retry_at + 1).await.result,
        StepResult::Waiting
    );
    assert_eq!(
        assign(&w, "m-0", retry_at + 2).await.result,
        StepResult::Released
    );
    assert_eq!(
        reconcile(&w, "m-0", retry_at + 3).await.result,
        StepResult::Released
    );
    assert_eq!(writes(&w), 0, "nothing to delete in Metal");
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_assignment_shows_on_the_claim_and_keeps_the_address() {
    let w = ready(Backend::SpinSqlite).await;
    // A device in another metro than the reservation: Metal refuses.
    w.sim.add_device(DEVICE, "sv", 2);
    let uid = packet_machine(&w, "pm-0", Some(DEVICE));
    owned_claim(
        &w,
        "m-0",
        "infrastructure.cluster.x-k8s.io/v1beta1",
        "PacketMachine",
        "pm-0",
        &uid,
    );
    reconcile(&w, "m-0", 20_000).await;
    let o = assign(&w, "m-0", 20_001).await;
    assert_eq!(o.result, StepResult::Failed, "{o:?}");
    assert!(o.message.contains("is in da"), "{o:?}");
    assert_eq!(
        condition(&w, "m-0"),
        ("False".into(), "AssignmentRefused".into())
    );
    // Not retried on every event, and the address stays the claim's.
    w.sim.clear_requests();
    assert_eq!(assign(&w, "m-0", 20_002).await.result, StepResult::Failed);
    assert_eq!(writes(&w), 0);
    let ip = w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "m-0")
        .unwrap();
    w.kube.create(claim("m-1"));
    reconcile(&w, "m-1", 20_003).await;
    let other = w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "m-1")
        .unwrap();
    assert_ne!(ip["spec"]["address"], other["spec"]["address"]);
    // A provider ID that is not Metal's is an error on the claim, and
    // nothing is asked of Metal.
    let uid = packet_machine(&w, "pm-x", Some("aws:///us-east-1a/i-0abc"));
    owned_claim(
        &w,
        "m-2",
        "infrastructure.cluster.x-k8s.io/v1beta1",
        "PacketMachine",
        "pm-x",
        &uid,
    );
    reconcile(&w, "m-2", 20_004).await;
    w.sim.clear_requests();
    let o = assign(&w, "m-2", 20_005).await;
    assert_eq!(o.result, StepResult::Failed, "{o:?}");
    assert_eq!(
        condition(&w, "m-2"),
        ("False".into(), "InvalidDevice".into())
    );
    assert_eq!(w.sim.requests().len(), 0);
    w.assert_clean();
}

/// The poll stopped before each of its KV operations in turn (the store
/// fails from then on, as an instance that crashed there): the next polls
/// converge to exactly one assignment, whatever Metal calls the stopped one
/// had made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poll_stopped_before_any_kv_operation_converges() {
    let mut stopped_at = 0;
    for n in 0.. {
        let w = ready(Backend::RedisSpin36).await;
        w.sim.add_device_in_state(DEVICE, "da", 2, "provisioning");
        let mut c = claim("m-0");
        c["metadata"]["annotations"] = json!({DEVICE_ANNOTATION: DEVICE});
        w.kube.create(c);
        reconcile(&w, "m-0", 20_000).await;
        assert_eq!(assign(&w, "m-0", 20_001).await.result, StepResult::Waiting);
        w.spawn(20_002, |r| {
            poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
        })
        .await
        .unwrap()
        .unwrap();
        w.sim.set_device_state(DEVICE, "active");
        w.kv.fail_after(Some(n));
        let first = w
            .spawn(20_003, |r| {
                poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
            })
            .await
            .unwrap();
        w.kv.fail_after(None);
        // The next runs of the CronJob, past an intent's lease.
        let mut now = 20_003 + INTENT_LEASE_S + 1;
        for _ in 0..2 {
            w.spawn(now, |r| {
                poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
            })
            .await
            .unwrap()
            .unwrap();
            now += 60;
        }
        assert_eq!(w.sim.assignments().len(), 1, "stopped before KV op {n}");
        assert_eq!(
            w.sim.applied("createIPAssignment"),
            1,
            "stopped before KV op {n}"
        );
        assert_eq!(
            condition(&w, "m-0"),
            ("True".into(), "Assigned".into()),
            "{n}"
        );
        w.assert_clean();
        // Failures on single claims are in the report, not an error.
        if matches!(&first, Ok(p) if p.errors.is_empty()) {
            stopped_at = n;
            break;
        }
    }
    // How many stopping points there were: every KV operation of a poll
    // that assigns one claim.
    println!("the poll was stopped before each of its first {stopped_at} KV operations");
    assert!(stopped_at > 5, "{stopped_at}");
}

/// The removal of a deleted claim's assignment stopped before each of its
/// KV operations in turn: the next runs remove it, then the address is
/// released; never released while assigned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removal_stopped_before_any_kv_operation_converges() {
    let mut stopped_at = 0;
    for n in 0.. {
        let w = ready(Backend::SpinSqlite).await;
        w.sim.add_device(DEVICE, "da", 2);
        let mut c = claim("m-0");
        c["metadata"]["annotations"] = json!({DEVICE_ANNOTATION: DEVICE});
        w.kube.create(c);
        reconcile(&w, "m-0", 20_000).await;
        assert_eq!(assign(&w, "m-0", 20_001).await.result, StepResult::Bound);
        w.kube
            .delete(IPAM_GROUP, "ipaddressclaims", Some(NS), "m-0");
        w.kv.fail_after(Some(n));
        let first = try_assign(&w, "m-0", 20_002).await;
        w.kv.fail_after(None);
        // The release may run at any time: it waits while anything may be
        // assigned.
        let o = reconcile(&w, "m-0", 20_003).await;
        if !w.sim.assignments().is_empty() {
            assert_eq!(
                o.result,
                StepResult::Waiting,
                "{n}: released while assigned"
            );
        }
        let mut now = 20_003 + INTENT_LEASE_S + 1;
        for _ in 0..2 {
            assign(&w, "m-0", now).await;
            reconcile(&w, "m-0", now + 1).await;
            now += 60;
        }
        assert!(w.sim.assignments().is_empty(), "{n}");
        assert!(claim_object(&w, "m-0").is_none(), "{n}: the claim is gone");
        w.assert_clean();
        if first.is_ok() {
            stopped_at = n;
            break;
        }
    }
    println!("the removal was stopped before each of its first {stopped_at} KV operations");
    assert!(stopped_at > 2, "{stopped_at}");
}

/// An elastic IP in a machine's network profile: the apply creates its
/// claim on the VRF-backed pool, owned by the Machine; the IPAM step binds
/// it and the assign step assigns the address to the Machine's device, as
/// for any claim of the pool; the node's configuration puts it on the
/// loopback as a `/32`; releasing the machine's network deletes the claim,
/// and the assignment goes before the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_elastic_ip_of_a_profile_is_claimed_assigned_and_rendered() {
    use metal_ipam_core::capi::network::{apply_machine, netconfig, release_machine};
    use metal_ipam_core::network::render::Format;
    let w = ready(Backend::SpinSqlite).await;
    w.sim.add_device(DEVICE, "da", 2);
    w.kube.create(json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalNetworkProfile",
        "metadata": {"name": "eip", "namespace": NS},
        "spec": {"ports": [{"name": "bond0", "elasticIPs": [{"pool": {"name": "vrf"}}]}]}
    }));
    w.kube.create(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c", "namespace": NS}, "spec": {}}),
    );
    w.kube.create(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m-0", "namespace": NS,
            "annotations": {"ipam.metal-ipam.dev/network-profile": "eip"}},
        "spec": {"clusterName": "c", "providerID": format!("equinixmetal://{DEVICE}")}
    }));
    w.sim.clear_requests();
    let (report, device) = w
        .spawn(20_000, |r| {
            apply_machine(r.deps(&Direct(r.metal)), NS, "m-0")
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(device, DEVICE);
    assert!(report.issued.is_empty(), "layer3 already: no port call");
    assert_eq!(writes(&w), 0);
    // The claim is named after the elastic IP's identity (port, pool).
    let claims = w.kube.list(IPAM_GROUP, "ipaddressclaims");
    let claim = claims
        .iter()
        .find(|c| c["metadata"]["labels"]["ipam.metal-ipam.dev/network-machine"] == "m-0")
        .expect("the elastic IP's claim")
        .clone();
    let eip = claim["metadata"]["name"].as_str().unwrap().to_string();
    assert!(eip.starts_with("m-0-bond0-elastic-"), "{eip}");
    assert_eq!(claim["metadata"]["ownerReferences"][0]["kind"], "Machine");
    assert_eq!(claim["spec"]["poolRef"]["name"], "vrf");

    let o = reconcile(&w, &eip, 20_001).await;
    assert_eq!((o.result, o.metal_assignment()), (StepResult::Bound, true));
    let o = assign(&w, &eip, 20_002).await;
    assert_eq!(o.result, StepResult::Bound, "{o:?}");
    let a = w.sim.assignments();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].device_id.as_str(), a[0].cidr), (DEVICE, 32));
    let address = a[0].address.clone();

    let (text, pending) = w
        .spawn(20_003, |r| {
            netconfig(r.deps(&Direct(r.metal)), NS, "m-0", Format::Shell)
        })
        .await
        .unwrap()
        .unwrap();
    assert!(pending.is_empty());
    assert!(
        text.contains(&format!("ip addr replace {address}/32 dev lo")),
        "{text}"
    );

    let (_, deleted) = w
        .spawn(20_004, |r| {
            release_machine(r.deps(&Direct(r.metal)), NS, "m-0")
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(
        reconcile(&w, &eip, 20_005).await.result,
        StepResult::Waiting,
        "the address waits for its assignment to go"
    );
    assert_eq!(assign(&w, &eip, 20_006).await.result, StepResult::Released);
    assert!(w.sim.assignments().is_empty());
    assert_eq!(
        reconcile(&w, &eip, 20_007).await.result,
        StepResult::Released
    );
    w.assert_clean();
}

/// The poll, run as an instance would at `now`.
async fn poll_at(w: &World, now: u64) -> metal_ipam_core::capi::poll::PollReport {
    w.spawn(now, |r| {
        poll(r.ctx, r.kube, CloudKind::Metal, r.metal, &Direct(r.metal))
    })
    .await
    .unwrap()
    .unwrap()
}

/// Finding 5: claims whose assignment answer was lost (dropped, 503, or
/// applied and the connection closed), then their device deleted, then
/// the claims deleted. Nothing waits on the device that is gone: with the
/// poll having seen the deletion, each claim is released at once; without
/// it, within the lost answer's wait (`LOST_ANSWER_S`), well inside the
/// lease; the addresses go back to the pool and no assignment is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_device_vanished_after_a_lost_answer_finishes_its_deletion() {
    for (polled, backend) in [(true, Backend::SpinSqlite), (false, Backend::RedisSpin36)] {
        let w = ready(backend).await;
        w.sim.add_device(DEVICE, "da", 2);
        let faults = [Fault::Drop, Fault::Status(503), Fault::CrashAfter];
        let names: Vec<String> = (0..faults.len()).map(|i| format!("m-{i}")).collect();
        for (name, fault) in names.iter().zip(&faults) {
            let mut c = claim(name);
            c["metadata"]["annotations"] = json!({DEVICE_ANNOTATION: DEVICE});
            w.kube.create(c);
            assert_eq!(reconcile(&w, name, 20_000).await.result, StepResult::Bound);
            w.sim.inject("POST", "createIPAssignment", fault.clone(), 1);
            let _ = try_assign(&w, name, 20_001).await;
        }
        // The device goes, with whatever was assigned to it.
        w.sim.delete_device(DEVICE);
        if polled {
            let p = poll_at(&w, 20_002).await;
            assert_eq!(p.device_deleted.len(), names.len(), "{p:?}");
        }
        for name in &names {
            w.kube.delete(IPAM_GROUP, "ipaddressclaims", Some(NS), name);
        }
        // The deletion, as the event and its redeliveries run it: release
        // (waiting), assign (removes), release again; the clock moving as
        // the forwarder's retries do, one second at a time.
        let mut now = 20_003;
        let deadline = now + metal_ipam_core::provision::assign::LOST_ANSWER_S + 2;
        loop {
            for name in &names {
                if claim_object(&w, name).is_none() {
                    continue;
                }
                let _ = w
                    .spawn(now, {
                        let name = name.clone();
                        move |r| capi::reconcile_claim(r.ctx, r.kube, NS, &name)
                    })
                    .await
                    .unwrap();
                let _ = try_assign(&w, name, now).await;
                let _ = w
                    .spawn(now, {
                        let name = name.clone();
                        move |r| capi::reconcile_claim(r.ctx, r.kube, NS, &name)
                    })
                    .await
                    .unwrap();
            }
            if names.iter().all(|n| claim_object(&w, n).is_none()) {
                break;
            }
            now += 1;
            assert!(
                now <= deadline,
                "polled {polled}: still there at {}: {:?}",
                now - 20_003,
                names
                    .iter()
                    .filter(|n| claim_object(&w, n).is_some())
                    .collect::<Vec<_>>()
            );
        }
        if polled {
            assert_eq!(now, 20_003, "at once once the poll saw the deletion");
        }
        println!(
            "deleting claims whose device vanished after a lost answer finished after {} s ({})",
            now - 20_003,
            if polled {
                "the poll saw the deletion"
            } else {
                "no poll"
            }
        );
        assert!(w.sim.assignments().is_empty());
        for name in &names {
            assert!(
                metal_ipam_core::ipam::ops::get_claim(&*w.kv, NS, name)
                    .unwrap()
                    .is_none(),
                "{name}'s address released"
            );
        }
        w.assert_clean();
    }
}

/// A lost answer is recovered by the next delivery after `LOST_ANSWER_S`,
/// not after the whole intent lease: the step looks on the device at once
/// and, finding nothing, lets the attempt end early.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_answer_is_recovered_after_a_short_wait_not_the_lease() {
    let w = ready(Backend::SpinSqlite).await;
    w.sim.add_device(DEVICE, "da", 2);
    let mut c = claim("m-0");
    c["metadata"]["annotations"] = json!({DEVICE_ANNOTATION: DEVICE});
    w.kube.create(c);
    reconcile(&w, "m-0", 20_000).await;
    w.sim.inject("POST", "createIPAssignment", Fault::Drop, 1);
    let e = try_assign(&w, "m-0", 20_001).await.unwrap_err();
    assert_eq!(e.reason(), "MetalOutcomeUnknown");
    let lost = metal_ipam_core::provision::assign::LOST_ANSWER_S;
    let o = assign(&w, "m-0", 20_001 + lost - 1).await;
    assert_eq!(o.result, StepResult::Waiting, "{o:?}");
    assert_eq!(o.retry_after, Some(1));
    let o = assign(&w, "m-0", 20_001 + lost).await;
    assert_eq!(o.result, StepResult::Bound, "{o:?}");
    assert!(lost < INTENT_LEASE_S / 4);
    assert_eq!(w.sim.assignments().len(), 1);
    w.assert_clean();
}

/// A claim moved to another device (its annotation changed): its
/// assignment on the old device is removed and it is assigned to the new
/// one, as its condition says.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_moved_to_another_device_follows_it() {
    const OTHER: &str = "7a2e3d4c-5b6a-4f79-8081-92a3b4c5d6e7";
    let w = ready(Backend::Redis).await;
    w.sim.add_device(DEVICE, "da", 2);
    w.sim.add_device(OTHER, "da", 2);
    let mut c = claim("m-0");
    c["metadata"]["annotations"] = json!({DEVICE_ANNOTATION: DEVICE});
    w.kube.create(c);
    reconcile(&w, "m-0", 20_000).await;
    assert_eq!(assign(&w, "m-0", 20_001).await.result, StepResult::Bound);
    let mut c = claim_object(&w, "m-0").unwrap();
    c["metadata"]["annotations"] = json!({DEVICE_ANNOTATION: OTHER});
    w.kube.put(c);
    let o = assign(&w, "m-0", 20_002).await;
    assert_eq!(o.result, StepResult::Bound, "{o:?}");
    assert!(o.message.contains(OTHER), "{o:?}");
    let a = w.sim.assignments();
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].device_id, OTHER);
    w.assert_clean();
}

/// A name read from an object (an owner reference) goes into an API path
/// only once it is a valid Kubernetes name: otherwise the claim says why
/// (`InvalidDevice`) and nothing is requested with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_with_an_invalid_name_is_reported_not_requested() {
    let w = ready(Backend::SpinSqlite).await;
    owned_claim(
        &w,
        "m-0",
        "infrastructure.cluster.x-k8s.io/v1beta1",
        "PacketMachine",
        "pm-0/../../secrets",
        "u-owner",
    );
    reconcile(&w, "m-0", 20_000).await;
    w.kube.clear_requests();
    let o = assign(&w, "m-0", 20_001).await;
    assert_eq!(o.result, StepResult::Failed, "{o:?}");
    assert_eq!(
        condition(&w, "m-0"),
        ("False".into(), "InvalidDevice".into())
    );
    assert!(
        w.kube
            .requests()
            .iter()
            .all(|r| !r.path.contains("secrets")),
        "{:?}",
        w.kube.requests()
    );
}
