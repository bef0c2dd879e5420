//! Provisioning of a VRF-backed pool against a scripted Metal API: the
//! requests in order, resumption after a lost answer, exclusion of a second
//! instance, adoption errors, and teardown by policy. Every scenario runs on
//! Spin's SQLite semantics and on Spin 3.6's Redis semantics.

use metal_ipam_core::error::ErrorKind;
use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
use metal_ipam_core::metal::client::{Metal, MetalConfig};
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::provision::plan::{Decided, INTENT_LEASE_S};
use metal_ipam_core::provision::record::read_state;
use metal_ipam_core::provision::step::{deprovision, provision, ProvisionPhase};
use metal_ipam_core::provision::target::Target;
use metal_ipam_core::provision::transitions::{may_register, Begun, PoolRecord};
use metal_ipam_core::testing::{Backend, Reply, ScriptedHttp, TestEnv, World};
use serde_json::{json, Value};

const TAG: &str = "metal-ipam.dev/pool-uid=u-1";
const UUID: &str = "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11";
const BACKENDS: [Backend; 2] = [Backend::SpinSqlite, Backend::RedisSpin36];

fn cfg() -> MetalConfig {
    MetalConfig {
        base_url: "http://metal.test/metal/v1".into(),
        token: "t".into(),
        project_id: "p1".into(),
        retry: RetryPolicy::default(),
    }
}

fn spec(v: Value) -> MetalSpec {
    let s = MetalSpec::from_json(&v).unwrap();
    s.validate().unwrap();
    s
}

fn created_spec() -> MetalSpec {
    spec(json!({"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
        "reservation": {"network": "10.10.1.0", "cidr": 29}}))
}

fn id() -> PoolId {
    PoolId::namespaced("team-a", "vrf")
}

fn created(kind: &str, id: &str) -> Reply {
    let body = match kind {
        "vrf" => json!({"id": id, "name": "vrf", "tags": [TAG]}),
        "ips" => {
            json!({"id": id, "type": "vrf", "vrf": {"id": "v1"}, "network": "10.10.1.0", "cidr": 29, "tags": [TAG]})
        }
        "vlan" => json!({"id": id, "vxlan": 1000, "metro_code": "da", "tags": [TAG]}),
        _ => {
            json!({"id": id, "state": "ready", "ip_reservation": {"id": "r1"}, "virtual_network": {"id": "n1"}})
        }
    };
    Reply::json(201, body)
}

fn gateway(state: &str) -> Reply {
    Reply::json(
        200,
        json!({"id": "g1", "state": state, "ip_reservation": {"id": "r1"}, "virtual_network": {"id": "n1"}}),
    )
}

fn block() -> Reply {
    Reply::json(
        200,
        json!({"id": "r1", "type": "vrf", "vrf": {"id": "v1"}, "network": "10.10.1.0", "cidr": 29}),
    )
}

#[test]
fn everything_is_created_in_order_and_a_converged_run_writes_nothing() {
    for b in BACKENDS {
        let w = World::new(b, 10_000);
        let spec = created_spec();
        let pool = id();
        let t = Target::new(&pool, &spec, Some("u-1"), None);
        let http = ScriptedHttp::new(vec![
            ("POST /projects/p1/vrfs", created("vrf", "v1")),
            ("POST /projects/p1/ips", created("ips", "r1")),
            ("POST /projects/p1/virtual-networks", created("vlan", "n1")),
            ("POST /projects/p1/metal-gateways", created("gw", "g1")),
            (
                "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                gateway("ready"),
            ),
        ]);
        let (cfg, menv) = (cfg(), TestEnv::at(0));
        let metal = Metal::new(&http, &cfg, &menv);
        let r = provision(&w.ctx(), &metal, &t).unwrap();
        assert_eq!(
            r.phase,
            ProvisionPhase::InProgress {
                waiting: "the Metal Gateway is ready".into(),
                retry_after_s: 5
            },
            "{b:?}"
        );
        assert_eq!(r.done.len(), 4, "{:?}", r.done);
        http.assert_done();
        // The VRF went out with the pool's tag, the block as specified.
        let sent = http.sent();
        assert_eq!(
            sent[0].json()["tags"],
            json!([TAG, "metal-ipam.dev/pool-name=MetalIPPool/team-a/vrf"])
        );
        // The block names its pool in customdata.
        assert_eq!(
            sent[1].json()["customdata"],
            json!({"metal-ipam.dev": {"pool": {"kind": "MetalIPPool", "namespace": "team-a", "name": "vrf", "uid": "u-1"}}})
        );
        assert_eq!(sent[1].json()["vrf_id"], "v1");
        assert_eq!(
            (
                sent[1].json()["network"].clone(),
                sent[1].json()["cidr"].clone()
            ),
            (json!("10.10.1.0"), json!(29))
        );
        assert_eq!(
            sent[3].json(),
            json!({"virtual_network_id": "n1", "ip_reservation_id": "r1"})
        );

        // Next invocation: the gateway is active; the block is read.
        let http = ScriptedHttp::new(vec![
            (
                "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                gateway("active"),
            ),
            ("GET /ips/r1", block()),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        let r = provision(&w.ctx(), &metal, &t).unwrap();
        assert_eq!(
            r.phase,
            ProvisionPhase::Ready {
                block: ("10.10.1.0".parse().unwrap(), 29)
            }
        );
        http.assert_done();

        // Converged: one read, no Metal write, no store write.
        let before = w.kv.dump();
        let http = ScriptedHttp::new(vec![("GET /ips/r1", block())]);
        let metal = Metal::new(&http, &cfg, &menv);
        let r = provision(&w.ctx(), &metal, &t).unwrap();
        assert!(matches!(r.phase, ProvisionPhase::Ready { .. }));
        assert!(r.done.is_empty());
        assert_eq!(w.kv.dump(), before);
        http.assert_done();
    }
}

#[test]
fn a_lost_answer_is_found_by_tag_not_created_again() {
    for b in BACKENDS {
        let w = World::new(b, 10_000);
        let spec = created_spec();
        let pool = id();
        let t = Target::new(&pool, &spec, Some("u-1"), None);
        let (cfg, menv) = (cfg(), TestEnv::at(0));
        // The POST took effect but its answer was lost, and the VRF is not
        // listed yet: 503, and the intent stays.
        let http = ScriptedHttp::new(vec![
            ("POST /projects/p1/vrfs", Reply::dropped()),
            (
                "GET /projects/p1/vrfs?metro=da",
                Reply::json(200, json!({"vrfs": []})),
            ),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        let e = provision(&w.ctx(), &metal, &t).unwrap_err();
        assert_eq!(
            (e.kind(), e.reason()),
            (ErrorKind::Transient, "MetalOutcomeUnknown")
        );
        http.assert_done();

        // Within the lease, another invocation waits and calls nothing.
        let http = ScriptedHttp::new(vec![]);
        let metal = Metal::new(&http, &cfg, &menv);
        w.env.set_now(10_000 + INTENT_LEASE_S - 1);
        let r = provision(&w.ctx(), &metal, &t).unwrap();
        assert!(
            matches!(
                r.phase,
                ProvisionPhase::InProgress {
                    retry_after_s: 1,
                    ..
                }
            ),
            "{:?}",
            r.phase
        );
        assert!(http.sent().is_empty());

        // After it, the VRF is looked for by tag (it landed meanwhile) and
        // recorded; provisioning goes on with the reservation.
        w.env.set_now(10_000 + INTENT_LEASE_S);
        let http = ScriptedHttp::new(vec![
            (
                "GET /projects/p1/vrfs?metro=da",
                Reply::json(
                    200,
                    json!({"vrfs": [{"id": "other", "tags": ["x"]}, {"id": "v1", "tags": [TAG]}]}),
                ),
            ),
            (
                "POST /projects/p1/ips",
                Reply::status(422).header("content-type", "application/json"),
            ),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        let e = provision(&w.ctx(), &metal, &t).unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::Conflict,
            "Metal refused the block: {e}"
        );
        http.assert_done();
        let posts = http.sent().iter().filter(|r| r.method == "POST").count();
        assert_eq!(posts, 1, "no second VRF");
    }
}

#[test]
fn a_second_instance_waits_while_the_first_creates() {
    for b in BACKENDS {
        let w = World::new(b, 10_000);
        let spec = created_spec();
        let pool = id();
        let t = Target::new(&pool, &spec, Some("u-1"), None);
        // Instance A recorded its intent for the VRF (and is creating it).
        assert!(PoolRecord::new(&w.ctx(), &id(), Some("u-1"))
            .claim_intent(
                Resource::Vrf,
                "a",
                10_000,
                &Decided::of(&spec, Resource::Vrf)
            )
            .unwrap());
        let http = ScriptedHttp::new(vec![]);
        let (cfg, menv) = (cfg(), TestEnv::at(0));
        let metal = Metal::new(&http, &cfg, &menv);
        let r = provision(&w.ctx(), &metal, &t).unwrap();
        assert_eq!(
            r.phase,
            ProvisionPhase::InProgress {
                waiting: "another instance is creating the vrf".into(),
                retry_after_s: INTENT_LEASE_S
            }
        );
        assert!(http.sent().is_empty(), "{b:?}: no Metal call");
    }
}

#[test]
fn an_adopted_resource_that_does_not_exist_names_its_field() {
    let w = World::new(Backend::SpinSqlite, 10_000);
    let spec = spec(
        json!({"metro": "da", "vrf": {"id": UUID}, "reservation": {"id": UUID},
        "vlan": {"vxlan": 1010}}),
    );
    let pool = id();
    let t = Target::new(&pool, &spec, Some("u-1"), None);
    let (cfg, menv) = (cfg(), TestEnv::at(0));
    let http = ScriptedHttp::new(vec![
        (
            "GET /vrfs/8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11",
            Reply::json(200, json!({"id": UUID, "metro": {"code": "da"}})),
        ),
        (
            "GET /ips/8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11",
            Reply::json(200, json!({"id": UUID, "type": "vrf", "vrf": {"id": UUID}})),
        ),
        (
            "GET /projects/p1/virtual-networks?metro=da",
            Reply::json(
                200,
                json!({"virtual_networks": [{"id": "n9", "vxlan": 1010, "metro_code": "sv"}]}),
            ),
        ),
    ]);
    let metal = Metal::new(&http, &cfg, &menv);
    let e = provision(&w.ctx(), &metal, &t).unwrap_err();
    assert_eq!(
        (e.status(), e.field()),
        (422, Some("spec.metal.vlan.vxlan")),
        "{e}"
    );
    assert!(e.message().contains("no VLAN 1010 in metro da"), "{e}");
    http.assert_done();
}

#[test]
fn teardown_deletes_what_was_created_keeps_what_was_adopted_in_order() {
    for b in BACKENDS {
        let w = World::new(b, 10_000);
        let spec = spec(json!({"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
            "reservation": {"network": "10.10.1.0", "cidr": 29}, "vlan": {"vxlan": 1000}}));
        let pool = id();
        let t = Target::new(&pool, &spec, Some("u-1"), None);
        let (cfg, menv) = (cfg(), TestEnv::at(0));
        let http = ScriptedHttp::new(vec![
            ("POST /projects/p1/vrfs", created("vrf", "v1")),
            ("POST /projects/p1/ips", created("ips", "r1")),
            (
                "GET /projects/p1/virtual-networks?metro=da",
                Reply::json(
                    200,
                    json!({"virtual_networks": [{"id": "n1", "vxlan": 1000, "metro_code": "da"}]}),
                ),
            ),
            ("POST /projects/p1/metal-gateways", created("gw", "g1")),
            (
                "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                gateway("active"),
            ),
            ("GET /ips/r1", block()),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        assert!(matches!(
            provision(&w.ctx(), &metal, &t).unwrap().phase,
            ProvisionPhase::Ready { .. }
        ));
        http.assert_done();

        let http = ScriptedHttp::new(vec![
            (
                "DELETE /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                Reply::json(202, json!({"id": "g1", "state": "deleting"})),
            ),
            (
                "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                gateway("deleting"),
            ),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        let r = deprovision(&w.ctx(), &metal, &t).unwrap();
        assert!(
            matches!(r.phase, ProvisionPhase::InProgress { .. }),
            "{:?}",
            r.phase
        );
        http.assert_done();

        let http = ScriptedHttp::new(vec![
            (
                "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                Reply::json(404, json!({"error": "Not found"})),
            ),
            ("DELETE /ips/r1", Reply::status(204)),
            ("DELETE /vrfs/v1", Reply::status(204)),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        let r = deprovision(&w.ctx(), &metal, &t).unwrap();
        assert_eq!(r.phase, ProvisionPhase::Gone);
        assert!(r.done.iter().any(|d| d == "kept vlan n1"), "{:?}", r.done);
        http.assert_done();

        // Gone: nothing is called or written again.
        let before = w.kv.dump();
        let http = ScriptedHttp::new(vec![]);
        let metal = Metal::new(&http, &cfg, &menv);
        assert_eq!(
            deprovision(&w.ctx(), &metal, &t).unwrap().phase,
            ProvisionPhase::Gone
        );
        assert_eq!(w.kv.dump(), before);
    }
}

#[test]
fn a_resource_created_for_another_pool_is_never_adopted() {
    let w = World::new(Backend::SpinSqlite, 10_000);
    let spec = spec(json!({"metro": "da", "vrf": {"id": UUID}, "reservation": {"id": UUID}}));
    let pool = id();
    let t = Target::new(&pool, &spec, Some("u-1"), Some("web"));
    let (cfg, menv) = (cfg(), TestEnv::at(0));
    let http = ScriptedHttp::new(vec![(
        "GET /vrfs/8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11",
        Reply::json(
            200,
            json!({"id": UUID, "metro": {"code": "da"}, "tags": ["metal-ipam.dev/pool-uid=someone-else"]}),
        ),
    )]);
    let metal = Metal::new(&http, &cfg, &menv);
    let e = provision(&w.ctx(), &metal, &t).unwrap_err();
    assert_eq!(
        (e.status(), e.field()),
        (422, Some("spec.metal.vrf.id")),
        "{e}"
    );
    assert!(e.message().contains("another metal-ipam pool"), "{e}");
    http.assert_done();
    // Our own tags name the cluster too.
    assert!(t
        .tags()
        .contains(&"cluster.x-k8s.io/cluster-name=web".to_string()));
}

fn adopted_vrf_spec(policy: Option<&str>) -> MetalSpec {
    let mut vrf = json!({"id": UUID});
    if let Some(p) = policy {
        vrf["deletionPolicy"] = json!(p);
    }
    let v = json!({"metro": "da", "vrf": vrf, "reservation": {"network": "10.10.1.0", "cidr": 29}});
    MetalSpec::from_json(&v).unwrap()
}

/// Provisions the adopted-VRF spec from nothing (scripted Metal).
fn provision_adopted(w: &World, t: &Target<'_>) {
    let http = ScriptedHttp::new(vec![
        (
            "GET /vrfs/8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11",
            Reply::json(200, json!({"id": UUID, "metro": {"code": "da"}})),
        ),
        ("POST /projects/p1/ips", created("ips", "r1")),
        ("POST /projects/p1/virtual-networks", created("vlan", "n1")),
        ("POST /projects/p1/metal-gateways", created("gw", "g1")),
        (
            "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
            gateway("active"),
        ),
        ("GET /ips/r1", block()),
    ]);
    let (cfg, menv) = (cfg(), TestEnv::at(0));
    let metal = Metal::new(&http, &cfg, &menv);
    assert!(matches!(
        provision(&w.ctx(), &metal, t).unwrap().phase,
        ProvisionPhase::Ready { .. }
    ));
    http.assert_done();
}

/// Tears down after provision_adopted: the gateway (already gone on its
/// first read), the reservation, the VLAN; the VRF is kept.
fn teardown_keeping_the_vrf(w: &World, t: &Target<'_>) -> Vec<String> {
    let http = ScriptedHttp::new(vec![
        (
            "DELETE /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
            Reply::json(202, json!({"id": "g1", "state": "deleting"})),
        ),
        (
            "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
            Reply::json(404, json!({"error": "Not found"})),
        ),
        ("DELETE /ips/r1", Reply::status(204)),
        (
            "GET /virtual-networks/n1?include=instances",
            Reply::json(200, json!({"id": "n1", "vxlan": 1000, "instances": []})),
        ),
        ("DELETE /virtual-networks/n1", Reply::status(204)),
    ]);
    let (cfg, menv) = (cfg(), TestEnv::at(0));
    let metal = Metal::new(&http, &cfg, &menv);
    let r = deprovision(&w.ctx(), &metal, t).unwrap();
    assert_eq!(r.phase, ProvisionPhase::Gone);
    http.assert_done();
    r.done
}

/// Finding 7 of issue 17: the deletion policy is decided when a resource is
/// adopted, not read from the spec at teardown: an adopted VRF is kept even
/// when the spec says `Delete` by then (or no longer adopts it at all).
#[test]
fn teardown_keeps_an_adopted_vrf_whatever_the_spec_says_by_then() {
    for b in BACKENDS {
        for edited in [
            adopted_vrf_spec(Some("Delete")),
            created_spec(), // the VRF no longer adopted
        ] {
            let w = World::new(b, 10_000);
            let pool = id();
            let spec = adopted_vrf_spec(None);
            provision_adopted(&w, &Target::new(&pool, &spec, Some("u-1"), None));
            let t = Target::new(&pool, &edited, Some("u-1"), None);
            let done = teardown_keeping_the_vrf(&w, &t);
            assert!(
                done.iter().any(|d| d == &format!("kept vrf {UUID}")),
                "{b:?}: {done:?}"
            );
        }
    }
}

/// Finding 7 of issue 17: a `spec.metal` that changed where a resource
/// exists is refused (422 naming the field), with no Metal call and no
/// store write; reverted, it converges again.
#[test]
fn a_spec_metal_edit_after_provisioning_is_refused_naming_the_field() {
    let w = World::new(Backend::SpinSqlite, 10_000);
    let pool = id();
    let spec = adopted_vrf_spec(None);
    provision_adopted(&w, &Target::new(&pool, &spec, Some("u-1"), None));
    let before = w.kv.dump();
    let (cfg, menv) = (cfg(), TestEnv::at(0));
    for (edited, field) in [
        (
            adopted_vrf_spec(Some("Delete")),
            "spec.metal.vrf.deletionPolicy",
        ),
        (
            {
                let mut s = adopted_vrf_spec(None);
                s.reservation.cidr = Some(28);
                s
            },
            "spec.metal.reservation.cidr",
        ),
        (
            {
                let mut s = adopted_vrf_spec(None);
                s.metro = "sv".into();
                s
            },
            "spec.metal.metro",
        ),
    ] {
        let http = ScriptedHttp::new(vec![]);
        let metal = Metal::new(&http, &cfg, &menv);
        let t = Target::new(&pool, &edited, Some("u-1"), None);
        let e = provision(&w.ctx(), &metal, &t).unwrap_err();
        assert_eq!(
            (e.status(), e.reason(), e.field()),
            (422, "MetalSpecChanged", Some(field)),
            "{e}"
        );
        assert!(http.sent().is_empty());
        assert_eq!(w.kv.dump(), before, "nothing written");
    }
    let http = ScriptedHttp::new(vec![("GET /ips/r1", block())]);
    let metal = Metal::new(&http, &cfg, &menv);
    let t = Target::new(&pool, &spec, Some("u-1"), None);
    assert!(matches!(
        provision(&w.ctx(), &metal, &t).unwrap().phase,
        ProvisionPhase::Ready { .. }
    ));
}

/// Finding 6 of issue 17: a tombstone is final. Once uid u-1's teardown is
/// complete, no write for u-1 lands (an intent, a creation, an adoption);
/// the creator of a late resource is told to delete it. A new incarnation
/// (u-2) starts a fresh record over the tombstone, which still refuses
/// u-1.
#[test]
fn a_tombstone_is_final_for_its_uid_and_a_new_uid_starts_fresh() {
    for b in BACKENDS {
        let w = World::new(b, 10_000);
        let pool = id();
        let spec = adopted_vrf_spec(None);
        provision_adopted(&w, &Target::new(&pool, &spec, Some("u-1"), None));
        teardown_keeping_the_vrf(&w, &Target::new(&pool, &spec, Some("u-1"), None));
        let gone = read_state(&w.kv, &pool).unwrap().unwrap();
        assert!(gone.deleted && gone.retired == ["u-1"], "{b:?}: {gone:?}");
        let c = w.ctx();
        let d = Decided::of(&spec, Resource::Vrf);
        assert!(!PoolRecord::new(&c, &pool, Some("u-1"))
            .claim_intent(Resource::Vrf, "late", 1, &d)
            .unwrap());
        assert!(!PoolRecord::new(&c, &pool, Some("u-1"))
            .record_created(Resource::Vrf, "v9", &d)
            .unwrap());
        assert!(!PoolRecord::new(&c, &pool, Some("u-1"))
            .record_adopted(Resource::Vrf, "v9", &d)
            .unwrap());
        assert!(!PoolRecord::new(&c, &pool, Some("u-1"))
            .withdraw_intent(Resource::Vrf, "late")
            .unwrap());
        assert_eq!(
            PoolRecord::new(&c, &pool, Some("u-1"))
                .begin_teardown()
                .unwrap(),
            Begun::Gone
        );
        assert!(may_register(&w.kv, &pool, Some("u-1")).is_err());
        assert_eq!(read_state(&w.kv, &pool).unwrap().unwrap(), gone, "{b:?}");
        // A pool of the same name, another uid: a fresh record.
        assert!(PoolRecord::new(&c, &pool, Some("u-2"))
            .claim_intent(Resource::Vrf, "t2", 5, &d)
            .unwrap());
        let fresh = read_state(&w.kv, &pool).unwrap().unwrap();
        assert_eq!(fresh.uid.as_deref(), Some("u-2"));
        assert_eq!(fresh.retired, ["u-1"]);
        assert!(!fresh.deleted && fresh.intent.is_some());
        assert!(!PoolRecord::new(&c, &pool, Some("u-1"))
            .record_created(Resource::Vrf, "v9", &d)
            .unwrap());
        assert!(PoolRecord::new(&c, &pool, Some("u-2"))
            .record_created(Resource::Vrf, "v2", &d)
            .unwrap());
    }
}

/// Finding 6 of issue 17: teardown waits out a live creation intent (in
/// progress, retry after the rest of its lease, no Metal call), then looks
/// for the resource by tag before it writes the tombstone.
#[test]
fn teardown_waits_out_a_live_intent_then_looks_for_its_resource() {
    for b in BACKENDS {
        let w = World::new(b, 10_000);
        let spec = created_spec();
        let pool = id();
        let t = Target::new(&pool, &spec, Some("u-1"), None);
        let d = Decided::of(&spec, Resource::Vrf);
        assert!(PoolRecord::new(&w.ctx(), &pool, Some("u-1"))
            .claim_intent(Resource::Vrf, "a", 10_000, &d)
            .unwrap());
        let (cfg, menv) = (cfg(), TestEnv::at(0));
        w.env.set_now(10_010);
        let http = ScriptedHttp::new(vec![]);
        let metal = Metal::new(&http, &cfg, &menv);
        let r = deprovision(&w.ctx(), &metal, &t).unwrap();
        assert_eq!(
            r.phase,
            ProvisionPhase::InProgress {
                waiting: "another instance is creating the vrf: it is torn down once recorded"
                    .into(),
                retry_after_s: INTENT_LEASE_S - 10
            },
            "{b:?}"
        );
        assert!(http.sent().is_empty());
        // The creator, still at it, records what it made: accepted, to be
        // torn down with the rest.
        assert!(PoolRecord::new(&w.ctx(), &pool, Some("u-1"))
            .record_created(Resource::Vrf, "v1", &d)
            .unwrap());
        // Had it not, after the lease the teardown looks by tag.
        let w = World::new(b, 10_000);
        assert!(PoolRecord::new(&w.ctx(), &pool, Some("u-1"))
            .claim_intent(Resource::Vrf, "a", 10_000, &d)
            .unwrap());
        w.env.set_now(10_000 + INTENT_LEASE_S);
        let http = ScriptedHttp::new(vec![
            (
                "GET /projects/p1/vrfs?metro=da",
                Reply::json(200, json!({"vrfs": [{"id": "v1", "tags": [TAG]}]})),
            ),
            ("DELETE /vrfs/v1", Reply::status(204)),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        assert_eq!(
            deprovision(&w.ctx(), &metal, &t).unwrap().phase,
            ProvisionPhase::Gone
        );
        http.assert_done();
        // The creator's late answer is refused: it deletes its own.
        assert!(!PoolRecord::new(&w.ctx(), &pool, Some("u-1"))
            .record_created(Resource::Vrf, "v1", &d)
            .unwrap());
    }
}

/// The leftover record of an earlier incarnation (deleted without its
/// teardown: its finalizer removed by hand) is torn down by its own
/// decisions and tag before the new incarnation creates anything.
#[test]
fn an_earlier_incarnations_leftovers_are_torn_down_before_anything_is_created() {
    let w = World::new(Backend::RedisSpin36, 10_000);
    let pool = id();
    let spec = created_spec();
    let d = Decided::of(&spec, Resource::Vrf);
    let c = w.ctx();
    assert!(PoolRecord::new(&c, &pool, Some("u-0"))
        .claim_intent(Resource::Vrf, "a", 1, &d)
        .unwrap());
    assert!(PoolRecord::new(&c, &pool, Some("u-0"))
        .record_created(Resource::Vrf, "v0", &d)
        .unwrap());
    let t = Target::new(&pool, &spec, Some("u-1"), None);
    let http = ScriptedHttp::new(vec![
        ("DELETE /vrfs/v0", Reply::status(204)),
        ("POST /projects/p1/vrfs", created("vrf", "v1")),
        ("POST /projects/p1/ips", created("ips", "r1")),
        ("POST /projects/p1/virtual-networks", created("vlan", "n1")),
        ("POST /projects/p1/metal-gateways", created("gw", "g1")),
        (
            "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
            gateway("ready"),
        ),
    ]);
    let (cfg, menv) = (cfg(), TestEnv::at(0));
    let metal = Metal::new(&http, &cfg, &menv);
    let r = provision(&c, &metal, &t).unwrap();
    assert!(
        matches!(r.phase, ProvisionPhase::InProgress { .. }),
        "{r:?}"
    );
    http.assert_done();
    let p = read_state(&w.kv, &pool).unwrap().unwrap();
    assert_eq!(p.uid.as_deref(), Some("u-1"));
    assert_eq!(p.retired, ["u-0"]);
    assert_eq!(p.vrf.unwrap().id, "v1");
}

/// Nothing waits on a thing that is gone: resources deleted behind
/// metal-ipam's back count as deleted (a gateway, reservation, VLAN or VRF
/// answering 404 to its deletion or read), and a port that vanished while
/// its VLAN was being unassigned counts as unassigned.
#[test]
fn teardown_counts_what_is_already_gone_as_deleted() {
    for b in BACKENDS {
        let w = World::new(b, 10_000);
        let spec = created_spec();
        let pool = id();
        let t = Target::new(&pool, &spec, Some("u-1"), None);
        let (cfg, menv) = (cfg(), TestEnv::at(0));
        let http = ScriptedHttp::new(vec![
            ("POST /projects/p1/vrfs", created("vrf", "v1")),
            ("POST /projects/p1/ips", created("ips", "r1")),
            ("POST /projects/p1/virtual-networks", created("vlan", "n1")),
            ("POST /projects/p1/metal-gateways", created("gw", "g1")),
            (
                "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                gateway("active"),
            ),
            ("GET /ips/r1", block()),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        assert!(matches!(
            provision(&w.ctx(), &metal, &t).unwrap().phase,
            ProvisionPhase::Ready { .. }
        ));
        let gone = || Reply::json(404, json!({"error": "Not found"}));
        let http = ScriptedHttp::new(vec![
            (
                "DELETE /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                gone(),
            ),
            (
                "GET /metal-gateways/g1?include=ip_reservation%2Cvirtual_network%2Cvrf",
                Reply::json(
                    403,
                    json!({"errors": ["Access denied for the current authentication token"]}),
                ),
            ),
            ("DELETE /ips/r1", gone()),
            (
                "GET /virtual-networks/n1?include=instances",
                Reply::json(
                    200,
                    json!({"id": "n1", "vxlan": 1000, "instances": [{"id": "d1",
                        "network_ports": [{"id": "p1", "name": "bond0",
                            "virtual_networks": [{"id": "n1", "href": "/metal/v1/virtual-networks/n1"}]}]}]}),
                ),
            ),
            // The device went meanwhile.
            ("POST /ports/p1/unassign", gone()),
            ("GET /virtual-networks/n1?include=instances", gone()),
            ("DELETE /virtual-networks/n1", gone()),
            ("DELETE /vrfs/v1", gone()),
        ]);
        let metal = Metal::new(&http, &cfg, &menv);
        let r = deprovision(&w.ctx(), &metal, &t).unwrap();
        assert_eq!(r.phase, ProvisionPhase::Gone, "{b:?}: {:?}", r.done);
        http.assert_done();
    }
}
