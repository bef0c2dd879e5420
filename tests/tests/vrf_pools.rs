//! VRF-backed pools end to end, natively: the pool sync of the `provision`
//! step (`capi::vrf::sync_vrf_pool`) against the fake Kubernetes API and the
//! Metal simulator, sharing one in-memory store with each backend's real
//! semantics. Provisioning in order and exactly once (also with the same
//! event three times at once on two instances, and with a crash after a
//! creation), addresses from the block with the gateway's address, teardown
//! by policy; no request breaks the Metal spec or a CRD.

use metal_ipam_core::capi::{self, StepResult};
use metal_ipam_core::kube::Kube;
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::testing::{Backend, TestEnv};
use metal_ipam_tests::fake_kube::{IPAM_GROUP, METAL_GROUP};
use metal_ipam_tests::metal_sim::{BlockingHttp, Fault};
use metal_ipam_tests::vrf_world::{claim, pool_object, World, NS, POOL};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vrf_pool_is_provisioned_in_order_hands_out_its_block_and_is_torn_down() {
    let w = World::new(Backend::SpinSqlite).await;
    w.kube.create(pool_object());

    let (o, runs) = w.sync_until_settled(6).await;
    assert_eq!(o.result, StepResult::Synced, "{o:?}");
    assert!(runs >= 2, "the gateway is ready before it is active");
    // Metal calls to provision from nothing: the four creations, the
    // gateway's reads until it is active (2 `ready` reads, then `active`),
    // and one read of the block.
    let count = |m: &str| w.sim.requests().iter().filter(|r| r.method == m).count();
    assert_eq!(
        (count("POST"), count("GET"), count("DELETE")),
        (4, 2 + 1 + 1, 0)
    );
    w.assert_one_of_each();
    w.assert_record_valid(
        &metal_ipam_core::kv::keys::metal_pool(&metal_ipam_core::ipam::pool::PoolId::namespaced(
            NS, POOL,
        )),
        "metal-progress-record.schema.json",
    );
    // Created in dependency order, each with the pool's tag.
    let creates: Vec<String> = w
        .sim
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .filter_map(|r| r.operation.clone())
        .collect();
    assert_eq!(
        creates,
        [
            "createVrf",
            "requestIPReservation",
            "createVirtualNetwork",
            "createMetalGateway"
        ]
    );
    let uid = w.pool().unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(w.sim.vrfs()[0].tags.iter().any(|t| t.ends_with(&uid)));

    // Status: Ready, the resources and the counts of a /29 (.0, .7 and the
    // gateway .1 are not handed out).
    let pool = w.pool().unwrap();
    let ready = pool["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["status"], "True", "{pool:#}");
    assert_eq!(pool["status"]["metal"]["gateway"]["state"], "active");
    assert_eq!(
        pool["status"]["metal"]["reservation"]["block"],
        "10.10.1.0/29"
    );
    assert_eq!(pool["status"]["ipAddresses"]["total"], 5);

    // A claim gets an address of the block, with the Metal Gateway's
    // address as its gateway.
    w.kube.create(claim("m-0"));
    let (kcfg, _) = w.configs();
    let kv = w.kv.clone();
    let out = tokio::task::spawn_blocking(move || {
        let http = BlockingHttp::new();
        let env = TestEnv::at(20_000);
        let ctx = Ctx::auto(kv.as_ref(), &env);
        capi::reconcile_claim(&ctx, &Kube::new(&http, &kcfg), NS, "m-0")
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(out.result, StepResult::Bound, "{out:?}");
    let ip = w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "m-0")
        .unwrap();
    assert_eq!(ip["spec"]["address"], "10.10.1.2");
    assert_eq!(ip["spec"]["gateway"], "10.10.1.1");
    assert_eq!(ip["spec"]["prefix"], 29);

    // The next run writes the new counts (1 used); the one after that is
    // converged and writes nothing anywhere.
    assert_eq!(w.sync(29_999).await.result, StepResult::Synced);
    assert_eq!(w.pool().unwrap()["status"]["ipAddresses"]["used"], 1);
    w.sim.clear_requests();
    let before = w.kube.resource_version();
    assert_eq!(w.sync(30_000).await.result, StepResult::Synced);
    assert!(
        w.sim.requests().iter().all(|r| r.method == "GET"),
        "no Metal write"
    );
    assert_eq!(
        w.sim.requests().len(),
        1,
        "a converged run reads the block, nothing else"
    );
    assert_eq!(w.kube.resource_version(), before, "no Kubernetes write");

    // A device's bond still carries the pool's VLAN (left behind by
    // whatever attached it): teardown unassigns it before deleting the VLAN.
    let device = w
        .sim
        .add_device("0c7e5d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6", "da", 2);
    let bond = device.port("bond0").unwrap().id.clone();
    w.sim.assign_vlan(&bond, &w.sim.vlans()[0].id);

    // Deleting the pool waits while an address is allocated …
    w.kube.delete(METAL_GROUP, "metalippools", Some(NS), POOL);
    assert_eq!(w.sync(30_001).await.result, StepResult::Waiting);
    assert_eq!(w.sim.vrfs().len(), 1, "nothing torn down while in use");
    // … then tears everything down in order and lets the object go.
    let kv = w.kv.clone();
    let (kcfg, _) = w.configs();
    tokio::task::spawn_blocking(move || {
        let http = BlockingHttp::new();
        let env = TestEnv::at(30_002);
        let ctx = Ctx::auto(kv.as_ref(), &env);
        let kube = Kube::new(&http, &kcfg);
        kube.delete(&metal_ipam_core::kube::CLAIMS, Some(NS), "m-0")
            .unwrap();
        capi::reconcile_claim(&ctx, &kube, NS, "m-0").unwrap()
    })
    .await
    .unwrap();
    w.kube.collect_garbage();
    let (o, _) = w.sync_until_settled(8).await;
    assert_eq!(o.result, StepResult::Deleted, "{o:?}");
    assert!(w.pool().is_none(), "the finalizer was removed");
    w.assert_record_valid(
        &metal_ipam_core::kv::keys::metal_pool(&metal_ipam_core::ipam::pool::PoolId::namespaced(
            NS, POOL,
        )),
        "metal-progress-record.schema.json",
    ); // the tombstone
    assert!(w.sim.vrfs().is_empty() && w.sim.reservations().is_empty());
    assert!(w.sim.vlans().is_empty() && w.sim.gateways().is_empty());
    let deletes: Vec<String> = w
        .sim
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE")
        .filter_map(|r| r.operation.clone())
        .collect();
    assert_eq!(
        deletes,
        [
            "deleteMetalGateway",
            "deleteIPAddress",
            "deleteVirtualNetwork",
            "deleteVrf"
        ]
    );
    let unassigned: Vec<String> = w
        .sim
        .requests()
        .iter()
        .filter(|r| r.operation.as_deref() == Some("unassignPort"))
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(unassigned, [format!("/metal/v1/ports/{bond}/unassign")]);
    assert!(w.sim.devices()[0].port("bond0").unwrap().vlans.is_empty());
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_event_three_times_at_once_on_two_instances_creates_each_resource_once() {
    for backend in [Backend::SpinSqlite, Backend::RedisSpin36] {
        let w = World::new(backend).await;
        w.kube.create(pool_object());
        // Three concurrent runs, then runs until settled: later runs find
        // what the first ones created, or wait for their intents.
        let runs: Vec<_> = (0..3).map(|i| w.spawn_sync(10_000 + i)).collect();
        let mut outs = Vec::new();
        for r in runs {
            outs.push(r.await.unwrap().unwrap());
        }
        assert!(
            outs.iter()
                .all(|o| matches!(o.result, StepResult::Waiting | StepResult::Synced)),
            "{outs:?}"
        );
        // Past any intent's lease.
        let mut now = 10_200;
        let mut done = false;
        for _ in 0..10 {
            let o = w.sync(now).await;
            now += 130;
            if o.result == StepResult::Synced {
                done = true;
                break;
            }
        }
        assert!(done, "{backend:?}: not ready");
        let trace: Vec<String> = w
            .sim
            .requests()
            .iter()
            .map(|r| format!("{} {:?} {:?}", r.line(), r.query, r.status))
            .collect();
        w.assert_one_of_each();
        assert_eq!(w.sim.applied("createVrf"), 1, "{backend:?}: {trace:#?}");
        assert_eq!(w.sim.applied("createMetalGateway"), 1, "{backend:?}");
        w.assert_clean();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_creation_whose_answer_is_lost_is_found_not_repeated() {
    let w = World::new(Backend::RedisSpin36).await;
    w.kube.create(pool_object());
    // The VLAN is created but the connection drops before the answer.
    w.sim
        .inject("POST", "createVirtualNetwork", Fault::CrashAfter, 1);
    let (o, _) = w.sync_until_settled(8).await;
    assert_eq!(o.result, StepResult::Synced, "{o:?}");
    w.assert_one_of_each();
    assert_eq!(
        w.sim.count("createVirtualNetwork"),
        1,
        "one POST, found by its tag"
    );
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fault_on_any_metal_write_converges_without_a_duplicate() {
    let writes = [
        "createVrf",
        "requestIPReservation",
        "createVirtualNetwork",
        "createMetalGateway",
    ];
    let faults = [
        Fault::CrashAfter,
        Fault::Status(503),
        Fault::Drop,
        Fault::RateLimit { retry_after_s: 1 },
    ];
    let mut validated = 0;
    for op in writes {
        for fault in &faults {
            let w = World::new(Backend::RedisSpin36).await;
            w.kube.create(pool_object());
            w.sim.inject("POST", op, fault.clone(), 1);
            // Runs a forwarder would make (each after the Retry-After the
            // last asked for, at least past an intent's lease).
            let mut now = 10_000;
            let mut synced = false;
            for _ in 0..12 {
                // A 503 (Metal unavailable, or a creation's outcome unknown)
                // is an answer the forwarder retries.
                match w.spawn_sync(now).await.unwrap() {
                    Ok(o) if o.result == StepResult::Synced => {
                        synced = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => assert_eq!(e.status(), 503, "{op} with {fault:?}: {e}"),
                }
                now += 130;
            }
            assert!(synced, "{op} with {fault:?}: not ready");
            w.assert_one_of_each();
            assert_eq!(
                w.sim.pending_faults(),
                0,
                "{op} with {fault:?}: the fault was hit"
            );
            w.assert_clean();
            validated += w.sim.requests().len();
        }
    }
    // How many requests the simulator checked against the spec, all valid.
    println!("{validated} Metal requests validated against the spec, 0 violations");
}

/// Counts of the VRFs, reservations, VLANs and gateways in Metal.
fn in_metal(w: &World) -> (usize, usize, usize, usize) {
    (
        w.sim.vrfs().len(),
        w.sim.reservations().len(),
        w.sim.vlans().len(),
        w.sim.gateways().len(),
    )
}

/// Waits until the simulator has taken every injected fault (the request
/// that takes it is then in flight): observed, not timed.
async fn until_faults_taken(w: &World) {
    for _ in 0..3_000 {
        if w.sim.pending_faults() == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the injected fault was never taken");
}

/// Finding 6 of issue 17, with the clock injected: instance A's VLAN
/// creation is in flight (its intent recorded at 10 000) when the pool is
/// deleted. Instance B's teardown at 10 010 waits out the live intent
/// (retry after the lease's remaining 110 s) and deletes nothing; once A's
/// creation is recorded, teardown (by either instance) deletes everything,
/// A's included, and A creates nothing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn teardown_waits_out_a_live_creation_intent_then_deletes_what_it_made() {
    for backend in [Backend::SpinSqlite, Backend::RedisSpin36] {
        let w = World::new(backend).await;
        w.kube.create(pool_object());
        w.sim
            .inject("POST", "createVirtualNetwork", Fault::Latency(1_500), 1);
        let a = w.spawn_sync(10_000);
        until_faults_taken(&w).await;
        w.kube.delete(METAL_GROUP, "metalippools", Some(NS), POOL);
        let b = w.sync(10_010).await;
        assert_eq!(b.result, StepResult::Waiting, "{backend:?}: {b:?}");
        assert_eq!(b.retry_after, Some(110), "{backend:?}: {b:?}");
        assert_eq!(
            in_metal(&w),
            (1, 1, 0, 0),
            "{backend:?}: nothing deleted yet"
        );
        // A's creation lands and is recorded; A creates nothing more (it
        // may run the teardown itself, having read the pool again once its
        // status write met the deletion).
        let a = a.await.unwrap();
        assert!(
            matches!(&a, Ok(o) if matches!(o.result, StepResult::Failed | StepResult::Deleted)),
            "{backend:?}: {a:?}"
        );
        let (o, _) = w.sync_until_settled(6).await;
        assert!(
            matches!(o.result, StepResult::Deleted | StepResult::Absent),
            "{backend:?}: {o:?}"
        );
        assert!(w.pool().is_none());
        assert_eq!(in_metal(&w), (0, 0, 0, 0), "{backend:?}: left in Metal");
        assert_eq!(w.sim.applied("createVrf"), 1, "{backend:?}");
        w.assert_clean();
    }
}

/// Finding 6 of issue 17: a creation that outlives its intent's lease
/// (Metal answers after the teardown already looked for it, found nothing
/// and finished) is refused its recording on the tombstone; its creator
/// deletes what it made, a duplicate for a pool that is gone, and creates
/// nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_creation_recorded_after_the_tombstone_is_refused_and_deleted_by_its_creator() {
    for backend in [Backend::SpinSqlite, Backend::RedisSpin36] {
        let w = World::new(backend).await;
        w.kube.create(pool_object());
        w.sim
            .inject("POST", "createVirtualNetwork", Fault::Latency(1_500), 1);
        let a = w.spawn_sync(10_000);
        until_faults_taken(&w).await;
        w.kube.delete(METAL_GROUP, "metalippools", Some(NS), POOL);
        // Past the lease: the teardown looks for the VLAN by its tag (not
        // there yet), forgets the intent and tears the rest down.
        let b = w.sync(10_000 + 130).await;
        assert_eq!(b.result, StepResult::Deleted, "{backend:?}: {b:?}");
        assert!(w.pool().is_none());
        let _ = a.await.unwrap();
        assert_eq!(in_metal(&w), (0, 0, 0, 0), "{backend:?}: left in Metal");
        assert_eq!(w.sim.applied("createVirtualNetwork"), 1, "{backend:?}");
        assert_eq!(w.sim.applied("deleteVirtualNetwork"), 1, "{backend:?}");
        assert_eq!(w.sim.applied("createVrf"), 1, "{backend:?}");
        w.assert_clean();
    }
}

/// The golden progress records (`kv-schema/examples/metal-progress*.json`)
/// are what the schema says.
#[test]
fn the_progress_record_examples_validate_against_the_schema() {
    let dir = metal_ipam_tests::schema::repo_root().join("kv-schema");
    let schema: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("metal-progress-record.schema.json")).unwrap(),
    )
    .unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(dir.join("examples")).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("metal-progress") {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        metal_ipam_tests::schema::validate(&schema, &v).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        n += 1;
    }
    assert!(n >= 2, "{n} examples");
}

/// A VRF-backed prefix pool: the reservation is the prefix it delegates
/// from. It is provisioned like an address pool (VRF, reservation, VLAN,
/// gateway, in order); its sub-prefixes are the block's, minus the one
/// holding Metal's gateway; a claim gets a sub-prefix with the gateway,
/// and no Metal IP assignment (Metal assigns addresses, not routed
/// sub-prefixes). A block that cannot be split (an IPv6 VRF reservation is
/// a /64, and the pool asks for /64s) is refused before Metal is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vrf_backed_prefix_pool_splits_its_block() {
    use metal_ipam_core::capi::vrf::sync_vrf_pool;
    use metal_ipam_core::ipam::pool::{PoolId, PoolKind};
    let w = World::new(Backend::SpinSqlite).await;
    w.kube.create(serde_json::json!({
        "apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalPrefixPool",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {"allocationPrefixLength": 29,
                 "metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"], "localASN": 65000},
                           "reservation": {"network": "10.10.2.0", "cidr": 26}}}
    }));
    let id = PoolId::of(PoolKind::NamespacedPrefix, NS, POOL);
    let mut settled = None;
    for i in 1..=8u64 {
        let id = id.clone();
        let o = w
            .spawn(10_000 + i, move |r| {
                sync_vrf_pool(r.ctx, r.kube, r.metal, &id)
            })
            .await
            .unwrap()
            .unwrap();
        if o.result != StepResult::Waiting {
            settled = Some(o);
            break;
        }
    }
    assert_eq!(settled.expect("settled").result, StepResult::Synced);
    w.assert_one_of_each();
    let pool = w
        .kube
        .get(METAL_GROUP, "metalprefixpools", Some(NS), POOL)
        .unwrap();
    assert_eq!(
        pool["status"]["metal"]["reservation"]["block"],
        "10.10.2.0/26"
    );
    // Eight /29s, the first holding the gateway 10.10.2.1.
    assert_eq!(pool["status"]["ipAddresses"]["total"], 7, "{pool:#}");

    let mut c = claim("m-0");
    c["spec"]["poolRef"]["kind"] = serde_json::json!("MetalPrefixPool");
    w.kube.create(c);
    let out = w
        .spawn(20_000, |r| capi::reconcile_claim(r.ctx, r.kube, NS, "m-0"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.result, StepResult::Bound, "{out:?}");
    assert!(
        !capi::ClaimAnswer::metal_assignment(&out),
        "no Metal IP assignment for a sub-prefix"
    );
    let ip = w
        .kube
        .get(IPAM_GROUP, "ipaddresses", Some(NS), "m-0")
        .unwrap();
    assert_eq!(
        (
            ip["spec"]["address"].clone(),
            ip["spec"]["prefix"].clone(),
            ip["spec"]["gateway"].clone()
        ),
        (
            serde_json::json!("10.10.2.8"),
            serde_json::json!(29),
            serde_json::json!("10.10.2.1")
        )
    );
    w.assert_clean();

    // IPv6: Metal's VRF reservations are /64s; /64s of it cannot be split.
    let spec = serde_json::json!({"metal": {"metro": "da",
        "vrf": {"ipRanges": ["2001:db8:5::/60"], "localASN": 65000},
        "reservation": {"network": "2001:db8:5:1::", "cidr": 64}}});
    let e = metal_ipam_core::ipam::pool::PoolSpec::from_json_as(PoolKind::NamespacedPrefix, &spec)
        .unwrap()
        .validate()
        .unwrap_err();
    assert_eq!(e.field(), Some("spec.allocationPrefixLength"), "{e}");
    let mut longer = spec;
    longer["allocationPrefixLength"] = serde_json::json!(80);
    let p =
        metal_ipam_core::ipam::pool::PoolSpec::from_json_as(PoolKind::NamespacedPrefix, &longer)
            .unwrap()
            .validate()
            .unwrap();
    assert_eq!(p.total(), 65_535, "2^16 /80s but the gateway's");
}
