//! The Metal simulator driven by the real Metal client
//! (`metal_ipam_core::metal::client::Metal`) over HTTP: the provisioning
//! flow and its teardown, each documented rule's 422, the spec check,
//! authentication, pagination, eventual states and every fault kind.
//!
//! The client blocks, so it runs in `spawn_blocking` on a virtual-clock
//! [`TestEnv`] (retries "sleep" without waiting) while the simulator runs
//! on the test's multi-threaded runtime.

use std::time::{Duration, Instant};

use http::Method;
use metal_ipam_core::metal::client::{Metal, MetalError};
use metal_ipam_core::metal::model::{
    IpAddress, IpAssignmentInput, VirtualNetworkCreateInput, VrfCreateInput,
    VrfIpReservationCreateInput, VrfMetalGatewayCreateInput,
};
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::testing::TestEnv;
use metal_ipam_tests::metal_sim::{
    BlockingHttp, Fault, GatewayState, MetalSim, SimConfig, MAX_VRFS,
};
use serde_json::{json, Value};

const DEVICE: &str = "6f0b7f4e-3c1d-4b8a-9e2f-0a1b2c3d4e5f";
const DEVICE_SV: &str = "1c9e2a7b-5d3f-4e6a-8b0c-9d8e7f6a5b4c";

type Client<'a> = Metal<'a, BlockingHttp, TestEnv>;

fn policy() -> RetryPolicy {
    RetryPolicy {
        budget_ms: 10_000,
        base_ms: 100,
        cap_ms: 1_000,
    }
}

/// Runs `f` with a client of `sim` on a blocking thread (virtual clock).
async fn with_metal<T, F>(sim: &MetalSim, f: F) -> T
where
    T: Send + 'static,
    F: for<'a> FnOnce(&Client<'a>, &TestEnv) -> T + Send + 'static,
{
    with_http(sim, BlockingHttp::new(), f).await
}

async fn with_http<T, F>(sim: &MetalSim, http: BlockingHttp, f: F) -> T
where
    T: Send + 'static,
    F: for<'a> FnOnce(&Client<'a>, &TestEnv) -> T + Send + 'static,
{
    let cfg = sim.metal_config(policy());
    tokio::task::spawn_blocking(move || {
        let env = TestEnv::at(1_800_000_000);
        let metal = Metal::new(&http, &cfg, &env);
        f(&metal, &env)
    })
    .await
    .expect("the client thread panicked")
}

/// Neither our requests nor the simulator's answers broke the spec.
fn assert_clean(sim: &MetalSim) {
    assert_eq!(sim.violations(), Vec::<String>::new(), "request violations");
    assert_eq!(
        sim.answer_violations(),
        Vec::<String>::new(),
        "the simulator's answers break the spec"
    );
}

fn vrf_input(name: &str, metro: &str, ranges: &[&str]) -> VrfCreateInput {
    VrfCreateInput {
        name: name.into(),
        metro: metro.into(),
        ip_ranges: ranges.iter().map(|r| (*r).to_owned()).collect(),
        tags: vec![format!("metal-ipam:{name}")],
        ..VrfCreateInput::default()
    }
}

fn block(vrf_id: &str, network: &str, cidr: u8) -> VrfIpReservationCreateInput {
    VrfIpReservationCreateInput {
        kind: "vrf",
        vrf_id: vrf_id.into(),
        network: network.into(),
        cidr,
        ..VrfIpReservationCreateInput::default()
    }
}

fn vlan(metro: &str, vxlan: Option<u16>) -> VirtualNetworkCreateInput {
    VirtualNetworkCreateInput {
        metro: metro.into(),
        vxlan,
        ..VirtualNetworkCreateInput::default()
    }
}

/// The status and messages of an API error (panics on anything else).
fn api_error<T: std::fmt::Debug>(r: Result<T, MetalError>) -> (u16, String) {
    match r {
        Err(MetalError::Api {
            status, messages, ..
        }) => (status, messages.join("; ")),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn assert_refused<T: std::fmt::Debug>(r: Result<T, MetalError>, text: &str) {
    let (status, messages) = api_error(r);
    assert_eq!(status, 422, "{messages}");
    assert!(
        messages.to_lowercase().contains(&text.to_lowercase()),
        "{messages:?} does not say {text:?}"
    );
}

// ---------------------------------------------------------------------------
// The provisioning flow
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn the_full_flow_creates_and_tears_down_in_order() {
    let sim = MetalSim::start().await;
    let device = sim.add_device(DEVICE, "da", 2);
    assert_eq!(
        device
            .ports
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        ["bond0", "eth0", "eth1"]
    );

    let (vrf, reservation, vlan_, gateway) = with_metal(&sim, |m, _| {
        let vrf = m
            .create_vrf(&vrf_input("pool-a", "DA", &["10.10.0.0/16"]))
            .unwrap();
        assert_eq!(vrf.metro.as_ref().unwrap().code.as_deref(), Some("da"));
        assert_eq!(vrf.ip_ranges, ["10.10.0.0/16"]);
        let mut input = block(&vrf.id, "10.10.1.0", 29);
        input.tags = vec!["metal-ipam:pool-a".into()];
        input.customdata = Some(
            json!({"pool": "default/pool-a"})
                .as_object()
                .unwrap()
                .clone(),
        );
        let r = m.create_vrf_reservation(&input).unwrap();
        assert_eq!(r.state.as_deref(), Some("created"));
        assert_eq!(r.gateway.as_deref(), Some("10.10.1.1"));
        assert_eq!(
            (r.network.as_deref(), r.cidr),
            (Some("10.10.1.0"), Some(29))
        );
        assert_eq!(r.vrf.id(), Some(vrf.id.as_str()));
        assert_eq!(r.address_family, Some(4));
        let v = m.create_vlan(&vlan("da", None)).unwrap();
        assert_eq!(v.vxlan, Some(1000));
        assert_eq!(v.metro_code.as_deref(), Some("da"));
        assert_eq!(
            v.metro.as_ref().unwrap().id.as_deref(),
            Some("108b2cfb-246b-45e3-885a-bf3e82fce1a0")
        );
        let g = m
            .create_vrf_gateway(&VrfMetalGatewayCreateInput {
                virtual_network_id: v.id.clone(),
                ip_reservation_id: r.id.clone(),
            })
            .unwrap();
        assert_eq!(g.state.as_deref(), Some("ready"));
        (vrf, r, v, g)
    })
    .await;
    assert_eq!(sim.gateways()[0].state, GatewayState::Ready);

    // ready → active after one read; the answers carry the included objects.
    let (gw_id, vrf_id, res_id, vlan_id) = (
        gateway.id.clone(),
        vrf.id.clone(),
        reservation.id.clone(),
        vlan_.id.clone(),
    );
    let assignment = with_metal(&sim, move |m, _| {
        let mut states = Vec::new();
        let active = loop {
            let g = m.get_gateway(&gw_id).unwrap().expect("the gateway exists");
            states.push(g.state.clone().unwrap());
            if g.state.as_deref() == Some("active") {
                break g;
            }
            assert!(states.len() < 5, "{states:?}");
        };
        assert_eq!(states, ["ready", "active"]);
        let vrf_ref = active.vrf.as_ref().unwrap();
        assert_eq!(vrf_ref.id.as_deref(), Some(vrf_id.as_str()));
        assert_eq!(
            active.ip_reservation.as_ref().unwrap().id.as_deref(),
            Some(res_id.as_str())
        );
        assert_eq!(
            active.virtual_network.as_ref().unwrap().id.as_deref(),
            Some(vlan_id.as_str())
        );
        let listed = m.list_gateways().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].state.as_deref(), Some("active"));

        // The reservation shows its gateway.
        let Some(IpAddress::Vrf(r)) = m.get_ip(&res_id).unwrap() else {
            panic!("not a VRF reservation")
        };
        let lite = r.metal_gateway.unwrap();
        assert_eq!(lite.id.as_deref(), Some(gw_id.as_str()));
        assert_eq!(lite.gateway_address.as_deref(), Some("10.10.1.1/29"));
        assert_eq!(lite.vlan, Some(1000));

        // An address of the block goes to the device, once.
        let a = m
            .assign_ip(
                DEVICE,
                &IpAssignmentInput {
                    address: "10.10.1.5/29".into(),
                    customdata: None,
                },
            )
            .unwrap();
        assert_eq!(a.address.as_deref(), Some("10.10.1.5"));
        assert_eq!(a.cidr, Some(29));
        assert_eq!(a.assigned_to.as_ref().unwrap().id(), DEVICE);
        let parent = a.parent_block.as_ref().unwrap();
        assert_eq!(parent.network.as_deref(), Some("10.10.1.0"));
        assert_eq!(
            parent.href.as_deref(),
            Some(format!("/metal/v1/ips/{res_id}").as_str())
        );
        assert_refused(
            m.assign_ip(
                DEVICE,
                &IpAssignmentInput {
                    address: "10.10.1.5".into(),
                    customdata: None,
                },
            ),
            "already assigned",
        );
        assert_refused(
            m.assign_ip(
                DEVICE,
                &IpAssignmentInput {
                    address: "10.10.2.5".into(),
                    customdata: None,
                },
            ),
            "not within any IP reservation",
        );
        let on_device = m.device_ips(DEVICE).unwrap();
        assert_eq!(on_device.len(), 1);
        assert_eq!(on_device[0].id, a.id);
        assert!(
            matches!(m.get_ip(&a.id).unwrap(), Some(IpAddress::Assignment(ref x)) if x.id == a.id)
        );
        a
    })
    .await;
    assert_eq!(sim.assignments().len(), 1);
    assert_eq!(sim.gateways()[0].state, GatewayState::Active);

    // Teardown: assignment, gateway (until 404), reservation, VLAN, VRF.
    let (gw_id, res_id, vlan_id, vrf_id) = (
        gateway.id.clone(),
        reservation.id.clone(),
        vlan_.id.clone(),
        vrf.id.clone(),
    );
    let events = with_metal(&sim, move |m, _| {
        assert!(m.delete_ip(&assignment.id).unwrap());
        assert!(m.device_ips(DEVICE).unwrap().is_empty());
        assert!(m.delete_gateway(&gw_id).unwrap());
        // While deleting, the reservation and the VLAN are still in use.
        assert_refused(
            m.delete_ip(&res_id),
            "Cannot delete with associated metal gateway",
        );
        assert_refused(m.delete_vlan(&vlan_id), "metal gateway");
        let mut states = Vec::new();
        while let Some(g) = live_gateway(m, &gw_id) {
            states.push(g.state.unwrap());
            assert!(states.len() < 5, "{states:?}");
        }
        assert_eq!(states, ["deleting"]);
        assert!(!m.delete_gateway(&gw_id).unwrap(), "already gone: 404");
        assert!(m.delete_ip(&res_id).unwrap());
        assert!(m.get_ip(&res_id).unwrap().is_none());
        assert!(m.delete_vlan(&vlan_id).unwrap());
        assert!(m.delete_vrf(&vrf_id).unwrap());
        assert!(m.get_vrf(&vrf_id).unwrap().is_none());
        m.project_events(10).unwrap()
    })
    .await;
    assert!(sim.vrfs().is_empty() && sim.reservations().is_empty());
    assert!(sim.vlans().is_empty() && sim.gateways().is_empty());
    assert!(sim.assignments().is_empty());

    // Events, newest first, one per change.
    let kinds: Vec<&str> = events
        .iter()
        .rev()
        .filter_map(|e| e.kind.as_deref())
        .collect();
    assert_eq!(
        kinds,
        [
            "vrf.created",
            "ip_reservation.created",
            "virtual_network.created",
            "metal_gateway.created",
            "ip_assignment.created",
            "ip_assignment.deleted",
            "metal_gateway.deleted",
            "ip_reservation.deleted",
            "virtual_network.deleted",
            "vrf.deleted",
        ]
    );
    let created = events.last().unwrap();
    assert_eq!(created.relationships[0].id(), vrf.id);
    assert!(created.body.as_deref().unwrap().contains("pool-a"));
    assert_eq!(sim.count("createVrf"), 1);
    assert_eq!(sim.applied("createMetalGateway"), 1);
    assert_clean(&sim);
}

// ---------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn vrf_reservations_must_fit_their_vrf() {
    let sim = MetalSim::start().await;
    with_metal(&sim, |m, _| {
        let vrf = m
            .create_vrf(&vrf_input(
                "fit",
                "da",
                &["10.20.0.0/16", "2001:db8:100::/59"],
            ))
            .unwrap();
        let other = m
            .create_vrf(&vrf_input("other", "da", &["10.30.0.0/16"]))
            .unwrap();
        assert_refused(
            m.create_vrf_reservation(&block(&vrf.id, "10.21.0.0", 29)),
            "not within any IP range",
        );
        // A block of another VRF's range is outside this one.
        assert_refused(
            m.create_vrf_reservation(&block(&vrf.id, "10.30.0.0", 29)),
            "not within any IP range",
        );
        for cidr in [21, 30, 32] {
            assert_refused(
                m.create_vrf_reservation(&block(&vrf.id, "10.20.0.0", cidr)),
                "subnet size",
            );
        }
        assert_refused(
            m.create_vrf_reservation(&block(&vrf.id, "2001:db8:100::", 63)),
            "subnet size",
        );
        assert_refused(
            m.create_vrf_reservation(&block(&vrf.id, "10.20.0.4", 29)),
            "not a network address",
        );
        m.create_vrf_reservation(&block(&vrf.id, "10.20.0.0", 22))
            .unwrap();
        assert_refused(
            m.create_vrf_reservation(&block(&vrf.id, "10.20.3.0", 29)),
            "overlaps",
        );
        // The same block in another VRF is no overlap.
        m.create_vrf_reservation(&block(&other.id, "10.30.0.0", 29))
            .unwrap();
        let v6 = m
            .create_vrf_reservation(&block(&vrf.id, "2001:db8:100::", 64))
            .unwrap();
        assert_eq!((v6.address_family, v6.cidr), (Some(6), Some(64)));
        assert_eq!(v6.gateway.as_deref(), Some("2001:db8:100::1"));
        assert_refused(
            m.create_vrf_reservation(&block(&vrf.id, "2001:db8:100:1::", 64)),
            "only one",
        );
        // Ranges outside the allowed sizes cannot make a VRF at all.
        assert_refused(
            m.create_vrf(&vrf_input("big", "da", &["10.0.0.0/7"])),
            "invalid size",
        );
        assert_refused(
            m.create_vrf(&vrf_input("v6", "da", &["2001:db8::/58"])),
            "invalid size",
        );
        assert_refused(m.create_vrf(&vrf_input("nowhere", "zz", &[])), "metro");
    })
    .await;
    assert_eq!(sim.reservations().len(), 3);
    assert_eq!(sim.vrfs().len(), 2);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_project_has_at_most_eight_vrfs() {
    let sim = MetalSim::start().await;
    with_metal(&sim, |m, _| {
        for i in 0..MAX_VRFS {
            m.create_vrf(&vrf_input(&format!("v{i}"), "sv", &[]))
                .unwrap();
        }
        assert_refused(m.create_vrf(&vrf_input("ninth", "sv", &[])), "limit");
        assert_eq!(m.list_vrfs(Some("SV")).unwrap().len(), MAX_VRFS);
        assert!(m.list_vrfs(Some("da")).unwrap().is_empty());
    })
    .await;
    assert_eq!(sim.vrfs().len(), 8);
    assert_eq!(sim.count("createVrf"), 9);
    assert_eq!(sim.applied("createVrf"), 8);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn vlans_on_ports_and_gateways_in_use_cannot_be_deleted() {
    let sim = MetalSim::start().await;
    let device = sim.add_device(DEVICE, "da", 2);
    let bond0 = device.port("bond0").unwrap().id.clone();
    let v = with_metal(&sim, |m, _| m.create_vlan(&vlan("da", Some(1234))).unwrap()).await;
    sim.assign_vlan(&bond0, &v.id);

    let (vlan_id, port) = (v.id.clone(), bond0.clone());
    with_metal(&sim, move |m, _| {
        assert_refused(
            m.delete_vlan(&vlan_id),
            "Cannot delete Virtual Network when port is assigned",
        );
        // The VLAN shows its instance; the port its VLAN.
        let (_, body) = m
            .send(Method::GET, &format!("/ports/{port}"), &[], None)
            .unwrap();
        let p: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(p["network_type"], "hybrid-bonded");
        assert_eq!(
            p["virtual_networks"][0]["href"],
            format!("/metal/v1/virtual-networks/{vlan_id}")
        );
        // Unassigning over HTTP frees it; a second unassign is a 422.
        let unassign = |vnid: &str| {
            m.send(
                Method::POST,
                &format!("/ports/{port}/unassign"),
                &[],
                Some(&json!({ "vnid": vnid })),
            )
        };
        let (status, body) = unassign("1234").unwrap();
        assert_eq!(status, 200);
        let p: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(p["network_type"], "layer3");
        assert_refused(unassign(&vlan_id), "Virtual network 1234 not assigned");
        assert!(m.delete_vlan(&vlan_id).unwrap());
        assert!(m.get_vlan(&vlan_id).unwrap().is_none());
    })
    .await;
    assert!(sim.vlans().is_empty());
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn vxlan_numbers_are_unique_per_project_and_metro() {
    let sim = MetalSim::start().await;
    with_metal(&sim, |m, _| {
        let da = m.create_vlan(&vlan("da", Some(1234))).unwrap();
        assert_refused(m.create_vlan(&vlan("DA", Some(1234))), "already in use");
        let sv = m.create_vlan(&vlan("sv", Some(1234))).unwrap();
        assert_ne!(da.id, sv.id);
        assert_eq!(m.find_vlan(1234, "SV").unwrap().unwrap().id, sv.id);
        assert_eq!(m.find_vlan(1234, "da").unwrap().unwrap().id, da.id);
        assert!(m.find_vlan(1234, "ny").unwrap().is_none());
        // Omitted: the next free number from 1000.
        assert_eq!(m.create_vlan(&vlan("da", None)).unwrap().vxlan, Some(1000));
        assert_eq!(m.create_vlan(&vlan("da", None)).unwrap().vxlan, Some(1001));
        assert_eq!(m.create_vlan(&vlan("sv", None)).unwrap().vxlan, Some(1000));
        for bad in [1, 4000] {
            assert_refused(m.create_vlan(&vlan("da", Some(bad))), "out of range");
        }
        assert_eq!(m.list_vlans("da").unwrap().len(), 3);
    })
    .await;
    assert_eq!(sim.vlans().len(), 5);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn gateways_need_a_free_reservation_in_the_vlans_metro() {
    let sim = MetalSim::start().await;
    with_metal(&sim, |m, _| {
        let vrf = m
            .create_vrf(&vrf_input(
                "gw",
                "da",
                &["10.40.0.0/16", "2001:db8:200::/60"],
            ))
            .unwrap();
        let r1 = m
            .create_vrf_reservation(&block(&vrf.id, "10.40.0.0", 29))
            .unwrap();
        let v6a = m
            .create_vrf_reservation(&block(&vrf.id, "2001:db8:200::", 64))
            .unwrap();
        let da = m.create_vlan(&vlan("da", None)).unwrap();
        let sv = m.create_vlan(&vlan("sv", None)).unwrap();
        let gw = |vlan: &str, r: &str| {
            m.create_vrf_gateway(&VrfMetalGatewayCreateInput {
                virtual_network_id: vlan.into(),
                ip_reservation_id: r.into(),
            })
        };
        assert_refused(gw(&sv.id, &r1.id), "same metro");
        gw(&da.id, &r1.id).unwrap();
        assert_refused(gw(&da.id, &r1.id), "already has a metal gateway");
        gw(&da.id, &v6a.id).unwrap();
        assert_eq!(m.list_gateways().unwrap().len(), 2);
    })
    .await;
    assert_eq!(sim.gateways().len(), 2);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_a_vrf_range_deletes_its_reservations_and_gateways() {
    let sim = MetalSim::start().await;
    let device = sim.add_device(DEVICE, "da", 2);
    let kept = with_metal(&sim, |m, _| {
        let vrf = m
            .create_vrf(&vrf_input("drop", "da", &["10.50.0.0/24", "10.60.0.0/24"]))
            .unwrap();
        let doomed = m
            .create_vrf_reservation(&block(&vrf.id, "10.50.0.0", 29))
            .unwrap();
        let kept = m
            .create_vrf_reservation(&block(&vrf.id, "10.60.0.0", 29))
            .unwrap();
        let v = m.create_vlan(&vlan("da", None)).unwrap();
        m.create_vrf_gateway(&VrfMetalGatewayCreateInput {
            virtual_network_id: v.id.clone(),
            ip_reservation_id: doomed.id.clone(),
        })
        .unwrap();
        m.assign_ip(
            DEVICE,
            &IpAssignmentInput {
                address: "10.50.0.3".into(),
                customdata: None,
            },
        )
        .unwrap();
        let (status, body) = m
            .send(
                Method::PUT,
                &format!("/vrfs/{}", vrf.id),
                &[],
                Some(&json!({ "ip_ranges": ["10.60.0.0/24"], "description": "only 60" })),
            )
            .unwrap();
        assert_eq!(status, 200);
        let updated: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(updated["ip_ranges"], json!(["10.60.0.0/24"]));
        assert_eq!(updated["description"], "only 60");
        assert!(m.get_ip(&doomed.id).unwrap().is_none());
        assert!(m.list_gateways().unwrap().is_empty());
        assert!(m.device_ips(DEVICE).unwrap().is_empty());
        // The VLAN is free again.
        assert!(m.delete_vlan(&v.id).unwrap());
        // Leaving `ip_ranges` out keeps them.
        m.send(
            Method::PUT,
            &format!("/vrfs/{}", vrf.id),
            &[],
            Some(&json!({ "name": "renamed" })),
        )
        .unwrap();
        assert_eq!(
            m.get_vrf(&vrf.id).unwrap().unwrap().ip_ranges,
            ["10.60.0.0/24"]
        );
        kept.id
    })
    .await;
    assert_eq!(
        sim.reservations()
            .iter()
            .map(|r| r.id.clone())
            .collect::<Vec<_>>(),
        [kept]
    );
    assert!(sim.gateways().is_empty() && sim.assignments().is_empty());
    assert_eq!(device.ports.len(), 3);
    let kinds: Vec<String> = sim.events().into_iter().map(|e| e.kind).collect();
    for k in [
        "metal_gateway.deleted",
        "ip_assignment.deleted",
        "ip_reservation.deleted",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} not in {kinds:?}");
    }
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn assignments_stay_in_the_devices_metro_and_public_blocks_are_minimal() {
    let sim = MetalSim::start().await;
    sim.add_device(DEVICE_SV, "sv", 2);
    with_metal(&sim, |m, _| {
        let vrf = m
            .create_vrf(&vrf_input("da", "da", &["10.70.0.0/24"]))
            .unwrap();
        m.create_vrf_reservation(&block(&vrf.id, "10.70.0.0", 29))
            .unwrap();
        assert_refused(
            m.assign_ip(
                DEVICE_SV,
                &IpAssignmentInput {
                    address: "10.70.0.2".into(),
                    customdata: None,
                },
            ),
            "is in da",
        );
        assert_eq!(
            api_error(m.device_ips("0e0e0e0e-0e0e-4e0e-8e0e-0e0e0e0e0e0e")).0,
            404
        );
    })
    .await;

    let project = sim.project_id().to_owned();
    with_metal(&sim, move |m, _| {
        let path = format!("/projects/{project}/ips");
        let (status, body) = m
            .send(
                Method::POST,
                &path,
                &[],
                Some(&json!({"type": "public_ipv4", "quantity": 8, "metro": "sv", "tags": ["t"]})),
            )
            .unwrap();
        assert_eq!(status, 201);
        let r: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (r["cidr"].as_u64(), r["public"].as_bool()),
            (Some(29), Some(true))
        );
        assert_eq!(r["network"], "198.18.0.0");
        let a = m
            .assign_ip(
                DEVICE_SV,
                &IpAssignmentInput {
                    address: "198.18.0.3/32".into(),
                    customdata: None,
                },
            )
            .unwrap();
        assert_eq!(a.cidr, Some(32));
        let listed = m.list_ips(&["public_ipv4"]).unwrap();
        assert!(
            matches!(listed.as_slice(), [IpAddress::Reservation(p)] if p.kind == "public_ipv4")
        );
        assert!(m.list_ips(&["vrf", "private_ipv4"]).unwrap().len() == 1);
        assert_eq!(m.list_ips(&[]).unwrap().len(), 2);
        assert_refused(
            m.send(
                Method::POST,
                &path,
                &[],
                Some(&json!({"type": "private_ipv4", "quantity": 8})),
            ),
            "not emulated",
        );
        assert_refused(
            m.send(
                Method::POST,
                &path,
                &[],
                Some(&json!({"type": "public_ipv4", "quantity": 6, "metro": "sv"})),
            ),
            "power of two",
        );
    })
    .await;
    assert_clean(&sim);
}

// ---------------------------------------------------------------------------
// Device lifecycle
// ---------------------------------------------------------------------------

/// `GET /devices/{id}`: the answer's JSON, or the error status.
fn get_device(m: &Client<'_>, id: &str) -> Result<Value, u16> {
    match m.send(Method::GET, &format!("/devices/{id}"), &[], None) {
        Ok((_, body)) => Ok(serde_json::from_slice(&body).unwrap()),
        Err(e) => Err(api_error::<()>(Err(e)).0),
    }
}

fn assign(m: &Client<'_>, device: &str, address: &str) -> Result<String, MetalError> {
    m.assign_ip(
        device,
        &IpAssignmentInput {
            address: address.into(),
            customdata: None,
        },
    )
    .map(|a| a.id)
}

#[tokio::test(flavor = "multi_thread")]
async fn devices_move_through_states_and_their_deletion_unassigns_their_addresses() {
    const OTHER: &str = "3a4b5c6d-7e8f-4a0b-9c1d-2e3f4a5b6c7d";
    let sim = MetalSim::start().await;
    let device = sim.add_device_in_state(DEVICE, "da", 2, "provisioning");
    assert_eq!(device.state, "provisioning");
    assert_eq!(sim.add_device(OTHER, "da", 2).state, "active");
    let device_href = format!("/metal/v1/devices/{DEVICE}");

    // A provisioning device answers so; addresses of a VRF block go to it
    // and to the other device.
    let (mine, theirs) = with_metal(&sim, |m, _| {
        let d = get_device(m, DEVICE).unwrap();
        assert_eq!(d["state"], "provisioning");
        assert_eq!(get_device(m, OTHER).unwrap()["state"], "active");
        let vrf = m
            .create_vrf(&vrf_input("life", "da", &["10.90.0.0/24"]))
            .unwrap();
        m.create_vrf_reservation(&block(&vrf.id, "10.90.0.0", 29))
            .unwrap();
        let mine = assign(m, DEVICE, "10.90.0.2").unwrap();
        let theirs = assign(m, OTHER, "10.90.0.3").unwrap();
        assert_eq!(
            get_device(m, DEVICE).unwrap()["ip_addresses"][0]["id"],
            mine
        );
        (mine, theirs)
    })
    .await;
    let seeded = sim.events().len();

    // provisioning → active: the GET and the newest event say so.
    assert_eq!(sim.set_device_state(DEVICE, "active").state, "active");
    assert_eq!(sim.events().len(), seeded + 1);
    let href = device_href.clone();
    with_metal(&sim, move |m, _| {
        assert_eq!(get_device(m, DEVICE).unwrap()["state"], "active");
        let events = m.project_events(1).unwrap();
        let newest = &events[0];
        assert_eq!(newest.kind.as_deref(), Some("instance.state_changed"));
        assert_eq!(
            newest.body.as_deref(),
            Some(format!("Device {DEVICE} is now active").as_str())
        );
        assert!(
            newest.relationships.iter().any(|r| r.href == href),
            "{newest:?}"
        );
        assert_eq!(events[1].kind.as_deref(), Some("ip_assignment.created"));
    })
    .await;

    // Changes within the same second are listed newest first all the same.
    for state in ["powering_off", "inactive", "powering_on", "active"] {
        sim.set_device_state(DEVICE, state);
    }
    let events = with_metal(&sim, |m, _| m.project_events(1).unwrap()).await;
    let bodies: Vec<&str> = events[..5]
        .iter()
        .filter_map(|e| e.body.as_deref())
        .map(|b| b.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(
        bodies,
        [
            "active",
            "powering_on",
            "inactive",
            "powering_off",
            "active"
        ]
    );
    assert!(events
        .windows(2)
        .all(|w| w[0].created_at >= w[1].created_at));

    // Deletion: the device, its ports and its address are gone; the other
    // device's address and the reservation stay.
    let removed = sim.delete_device(DEVICE);
    assert_eq!(
        removed.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
        [mine.as_str()]
    );
    assert_eq!(removed[0].address, "10.90.0.2");
    let left: Vec<String> = sim.assignments().into_iter().map(|a| a.id).collect();
    assert_eq!(left, std::slice::from_ref(&theirs));
    assert_eq!(sim.devices().len(), 1);
    assert_eq!(sim.reservations().len(), 1);
    let port = device.ports[1].id.clone();
    let href = device_href.clone();
    with_metal(&sim, move |m, _| {
        assert_eq!(get_device(m, DEVICE), Err(404));
        assert_eq!(api_error(assign(m, DEVICE, "10.90.0.4")).0, 404);
        assert_eq!(api_error(m.device_ips(DEVICE)).0, 404);
        assert_eq!(
            api_error(m.send(Method::GET, &format!("/ports/{port}"), &[], None)).0,
            404
        );
        assert!(m.get_ip(&mine).unwrap().is_none());
        assert_eq!(m.device_ips(OTHER).unwrap()[0].id, theirs);
        // The address is free again.
        assign(m, OTHER, "10.90.0.2").unwrap();
        let events = m.project_events(1).unwrap();
        assert_eq!(events[1].kind.as_deref(), Some("instance.deleted"));
        assert!(events[1].relationships.iter().any(|r| r.href == href));
        assert_eq!(events[0].kind.as_deref(), Some("ip_assignment.created"));
    })
    .await;
    // One event for the deletion, none per unassigned address.
    let kinds: Vec<String> = sim.events().into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "ip_assignment.deleted")
            .count(),
        0
    );
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
#[should_panic(expected = "not a device state")]
async fn device_states_outside_the_spec_are_refused() {
    let sim = MetalSim::start().await;
    sim.add_device(DEVICE, "da", 2);
    sim.set_device_state(DEVICE, "running");
}

// ---------------------------------------------------------------------------
// The spec check and authentication
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn requests_that_break_the_spec_are_refused_and_counted() {
    let sim = MetalSim::start().await;
    let project = sim.project_id().to_owned();
    let answers = with_metal(&sim, move |m, _| {
        let vrfs = format!("/projects/{project}/vrfs");
        let ips = format!("/projects/{project}/ips");
        let post =
            |path: &str, body: Value| api_error(m.send(Method::POST, path, &[], Some(&body)));
        let vrf = m
            .create_vrf(&vrf_input("ok", "da", &["10.80.0.0/16"]))
            .unwrap();
        vec![
            // A field of the wrong type.
            post(
                &ips,
                json!({"type": "vrf", "vrf_id": vrf.id, "network": "10.80.0.0", "cidr": "29"}),
            ),
            // A required field missing.
            post(&vrfs, json!({"metro": "da"})),
            // An unknown field (the spec's alias `vrf` for `vrf_id`).
            post(
                &ips,
                json!({"type": "vrf", "vrf": vrf.id, "network": "10.80.0.0", "cidr": 29}),
            ),
            // Ids that are not UUIDs, in the body and in the path.
            post(
                &ips,
                json!({"type": "vrf", "vrf_id": "v1", "network": "10.80.0.0", "cidr": 29}),
            ),
            api_error(m.send(Method::GET, "/vrfs/v1", &[], None)),
            // An unknown query parameter.
            api_error(m.send(Method::GET, &vrfs, &[("page", "1".into())], None)),
            // A query value of the wrong type.
            api_error(m.send(Method::GET, &ips, &[("per_page", "lots".into())], None)),
            // An enum value the spec does not list.
            api_error(m.send(Method::GET, &ips, &[("types", "vrf6".into())], None)),
            // A path the spec does not have, a method it does not allow.
            api_error(m.send(Method::GET, "/vrfs", &[], None)),
            api_error(m.send(
                Method::PATCH,
                &format!("/vrfs/{}", vrf.id),
                &[],
                Some(&json!({})),
            )),
            // A body where the operation takes none.
            api_error(m.send(
                Method::DELETE,
                &format!("/vrfs/{}", vrf.id),
                &[],
                Some(&json!({})),
            )),
        ]
    })
    .await;
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses,
        [422, 422, 422, 422, 422, 422, 422, 422, 404, 404, 422]
    );
    let says = |i: usize, text: &str| {
        assert!(
            answers[i].1.contains(text),
            "answer {i}: {:?} lacks {text:?}",
            answers[i].1
        );
    };
    says(0, "\"29\" is not of type \"integer\"");
    says(1, "\"name\" is a required property");
    says(2, "'vrf' was unexpected");
    says(3, "\"v1\" is not a \"uuid\"");
    says(4, "path parameter id: \"v1\" is not a \"uuid\"");
    says(5, "query parameter \"page\" is not declared");
    says(6, "query parameter per_page");
    says(7, "vrf6");
    says(8, "no path matching /vrfs");
    says(9, "no PATCH");
    says(10, "takes no request body");
    // One violation per refused request.
    let violations = sim.violations();
    assert_eq!(violations.len(), answers.len(), "{violations:#?}");
    assert!(
        violations[0].starts_with("POST /metal/v1/projects/"),
        "{violations:?}"
    );
    // Nothing was created by the refused requests, and the VRF survived the
    // DELETE with a body.
    assert_eq!(sim.vrfs().len(), 1);
    assert!(sim.reservations().is_empty());
    assert!(
        sim.answer_violations().is_empty(),
        "{:?}",
        sim.answer_violations()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_without_the_token_are_unauthorized() {
    let sim = MetalSim::start().await;
    let mut cfg = sim.metal_config(policy());
    cfg.token = "not-the-token".into();
    let (status, messages) = tokio::task::spawn_blocking(move || {
        let (http, env) = (BlockingHttp::new(), TestEnv::at(1_000));
        api_error(Metal::new(&http, &cfg, &env).list_vrfs(None))
    })
    .await
    .unwrap();
    assert_eq!(status, 401);
    assert!(messages.contains("authentication"), "{messages}");
    let requests = sim.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].status, Some(401));
    assert_eq!(sim.count("findVrfs"), 0);
    assert_clean(&sim);
}

// ---------------------------------------------------------------------------
// Pagination and eventual states
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn lists_span_pages() {
    let sim = MetalSim::start_with(SimConfig {
        max_per_page: Some(2),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let (ips, events) = with_metal(&sim, |m, _| {
        let vrf = m
            .create_vrf(&vrf_input("pages", "ny", &["10.90.0.0/24"]))
            .unwrap();
        for i in 0..5 {
            m.create_vrf_reservation(&block(&vrf.id, &format!("10.90.0.{}", i * 8), 29))
                .unwrap();
        }
        (m.list_ips(&["vrf"]).unwrap(), m.project_events(2).unwrap())
    })
    .await;
    let networks: Vec<String> = ips
        .iter()
        .map(|ip| match ip {
            IpAddress::Vrf(r) => r.network.clone().unwrap(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        networks,
        [
            "10.90.0.0",
            "10.90.0.8",
            "10.90.0.16",
            "10.90.0.24",
            "10.90.0.32"
        ]
    );
    // Six events (a VRF, five reservations), two pages of two asked for.
    assert_eq!(events.len(), 4);
    assert_eq!(events[0].kind.as_deref(), Some("ip_reservation.created"));
    let pages: Vec<String> = sim
        .requests()
        .iter()
        .filter(|r| r.operation.as_deref() == Some("findIPReservations"))
        .map(|r| r.query.clone().unwrap())
        .collect();
    assert_eq!(
        pages,
        [
            "types=vrf&page=1&per_page=250",
            "types=vrf&page=2&per_page=250",
            "types=vrf&page=3&per_page=250",
        ]
    );
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn gateways_settle_after_the_configured_number_of_reads() {
    let sim = MetalSim::start_with(SimConfig {
        gateway_reads: Some(3),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let (gw1, gw2) = with_metal(&sim, |m, _| {
        let vrf = m
            .create_vrf(&vrf_input("slow", "da", &["10.95.0.0/24"]))
            .unwrap();
        let v = m.create_vlan(&vlan("da", None)).unwrap();
        let mk = |net: &str| {
            let r = m.create_vrf_reservation(&block(&vrf.id, net, 29)).unwrap();
            m.create_vrf_gateway(&VrfMetalGatewayCreateInput {
                virtual_network_id: v.id.clone(),
                ip_reservation_id: r.id,
            })
            .unwrap()
            .id
        };
        let (gw1, gw2) = (mk("10.95.0.0"), mk("10.95.0.8"));
        let states: Vec<String> = (0..4)
            .map(|_| m.get_gateway(&gw1).unwrap().unwrap().state.unwrap())
            .collect();
        assert_eq!(states, ["ready", "ready", "ready", "active"]);
        m.delete_gateway(&gw1).unwrap();
        let mut seen = Vec::new();
        while let Some(g) = live_gateway(m, &gw1) {
            seen.push(g.state.unwrap());
            assert!(seen.len() < 10);
        }
        assert_eq!(seen, ["deleting", "deleting", "deleting"]);
        (gw1, gw2)
    })
    .await;
    assert!(sim.gateways().iter().all(|g| g.id != gw1));
    let g2 = sim.gateways().into_iter().find(|g| g.id == gw2).unwrap();
    assert_eq!((g2.state, g2.reads_left), (GatewayState::Ready, 3));
    sim.settle();
    assert_eq!(sim.gateways()[0].state, GatewayState::Active);
    assert_clean(&sim);
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_429_is_retried_after_the_servers_retry_after() {
    let sim = MetalSim::start().await;
    sim.inject(
        "POST",
        "createVrf",
        Fault::RateLimit { retry_after_s: 2 },
        2,
    );
    let slept = with_metal(&sim, |m, env| {
        m.create_vrf(&vrf_input("limited", "da", &[])).unwrap();
        assert_eq!(m.calls(), 3);
        env.slept_ms()
    })
    .await;
    assert_eq!(slept, [2_000, 2_000]);
    assert_eq!((sim.count("createVrf"), sim.applied("createVrf")), (3, 1));
    assert_eq!(sim.vrfs().len(), 1);
    let statuses: Vec<Option<u16>> = sim.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Some(429), Some(429), Some(201)]);
    assert_eq!(sim.pending_faults(), 0);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_retried_for_reads_and_unknown_for_posts() {
    let sim = MetalSim::start().await;
    let vrf = with_metal(&sim, |m, _| {
        m.create_vrf(&vrf_input("e", "da", &[])).unwrap()
    })
    .await;
    sim.inject("GET", "/vrfs/{id}", Fault::Status(503), 1);
    sim.inject(
        "*",
        "/projects/{id}/virtual-networks",
        Fault::Status(500),
        1,
    );
    let id = vrf.id.clone();
    with_metal(&sim, move |m, env| {
        assert_eq!(m.get_vrf(&id).unwrap().unwrap().id, id);
        assert_eq!(env.slept_ms().len(), 1);
        let e = m.create_vlan(&vlan("da", None)).unwrap_err();
        assert!(matches!(e, MetalError::OutcomeUnknown { .. }), "{e:?}");
    })
    .await;
    assert_eq!(sim.count("findVrfById"), 2);
    assert_eq!(
        (
            sim.count("createVirtualNetwork"),
            sim.applied("createVirtualNetwork")
        ),
        (1, 0)
    );
    assert!(
        sim.vlans().is_empty(),
        "a 500 before applying created nothing"
    );
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn latency_delays_answers_and_a_client_timeout_retries_reads() {
    let sim = MetalSim::start().await;
    sim.inject("GET", "findVrfs", Fault::Latency(150), 1);
    let elapsed = with_metal(&sim, |m, _| {
        let start = Instant::now();
        assert!(m.list_vrfs(None).unwrap().is_empty());
        start.elapsed()
    })
    .await;
    assert!(elapsed >= Duration::from_millis(150), "{elapsed:?}");

    // Slower than the client waits: the read times out and is sent again.
    sim.inject("GET", "findVrfs", Fault::Latency(5_000), 1);
    let http = BlockingHttp::with_timeout(Duration::from_millis(1_000));
    let (calls, elapsed) = with_http(&sim, http, |m, _| {
        let start = Instant::now();
        assert!(m.list_vrfs(None).unwrap().is_empty());
        (m.calls(), start.elapsed())
    })
    .await;
    assert_eq!(calls, 2);
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    assert_eq!(sim.count("findVrfs"), 3);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_connection_is_retried_for_reads_and_unknown_for_posts() {
    let sim = MetalSim::start().await;
    sim.inject("GET", "findVrfs", Fault::Drop, 2);
    sim.inject("POST", "createVrf", Fault::Drop, 1);
    with_metal(&sim, |m, env| {
        assert!(m.list_vrfs(Some("da")).unwrap().is_empty());
        assert_eq!(env.slept_ms().len(), 2);
        let e = m.create_vrf(&vrf_input("dropped", "da", &[])).unwrap_err();
        assert!(matches!(e, MetalError::OutcomeUnknown { .. }), "{e:?}");
    })
    .await;
    assert!(sim.vrfs().is_empty(), "a dropped request is not applied");
    assert_eq!((sim.count("findVrfs"), sim.applied("findVrfs")), (3, 1));
    let dropped = sim
        .requests()
        .iter()
        .filter(|r| r.status.is_none() && r.fault == Some(Fault::Drop))
        .count();
    assert_eq!(dropped, 3);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_after_a_post_leaves_the_resource_behind() {
    let sim = MetalSim::start().await;
    sim.inject("POST", "/projects/{id}/vrfs", Fault::CrashAfter, 1);
    let found = with_metal(&sim, |m, _| {
        let e = m
            .create_vrf(&vrf_input("crashed", "da", &["10.99.0.0/24"]))
            .unwrap_err();
        assert!(matches!(e, MetalError::OutcomeUnknown { .. }), "{e:?}");
        assert_eq!(m.calls(), 1, "a POST is never repeated");
        // The client looks it up by tag before creating it again.
        m.list_vrfs(Some("da"))
            .unwrap()
            .into_iter()
            .find(|v| v.tags.iter().any(|t| t == "metal-ipam:crashed"))
    })
    .await;
    let found = found.expect("the VRF exists although the client never heard");
    assert_eq!(sim.vrfs().len(), 1);
    assert_eq!(sim.vrfs()[0].id, found.id);
    assert_eq!((sim.count("createVrf"), sim.applied("createVrf")), (1, 1));
    let crashed = &sim.requests()[0];
    assert_eq!(
        (crashed.status, crashed.fault.clone()),
        (None, Some(Fault::CrashAfter))
    );
    assert_clean(&sim);
}

/// A gateway as a GET answers it; `None` once deleted, which Metal (and the
/// simulator) answers with 403, not 404.
fn live_gateway<H, E>(
    m: &metal_ipam_core::metal::client::Metal<'_, H, E>,
    id: &str,
) -> Option<metal_ipam_core::metal::model::MetalGateway>
where
    H: metal_ipam_core::ports::http::HttpClient + ?Sized,
    E: metal_ipam_core::ports::Env + ?Sized,
{
    match m.get_gateway(id) {
        Ok(g) => {
            assert!(g.is_some(), "a deleted gateway answers 403, not 404");
            g
        }
        Err(e) if e.status() == Some(403) => None,
        Err(e) => panic!("{e}"),
    }
}
