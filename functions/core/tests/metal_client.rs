//! The Metal client against a scripted transport: the requests it sends
//! (method, path, query, headers, body) in order, retries within the time
//! budget on a virtual clock, pagination, the `oneOf` answers and errors.

use metal_ipam_core::error::ErrorKind;
use metal_ipam_core::metal::client::{Metal, MetalConfig, MetalError, CONNECT_MS};
use metal_ipam_core::metal::model::{
    IpAddress, VirtualNetworkCreateInput, VrfCreateInput, VrfIpReservationCreateInput,
};
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::ports::http::{Deadline, TransportKind};
use metal_ipam_core::ports::Env;
use metal_ipam_core::testing::{Reply, ScriptedHttp, TestEnv};
use serde_json::json;

const BASE: &str = "http://metal.test/metal/v1";

fn cfg() -> MetalConfig {
    MetalConfig {
        base_url: BASE.into(),
        token: "s3cr3t-token".into(),
        project_id: "p1".into(),
        retry: RetryPolicy::default(),
    }
}

#[test]
fn every_request_is_authenticated_and_json() {
    let http = ScriptedHttp::new(vec![
        (
            "POST /projects/p1/vrfs",
            Reply::json(201, json!({"id": "v1", "name": "n"})),
        ),
        (
            "GET /vrfs/v1",
            Reply::json(200, json!({"id": "v1", "name": "n"})),
        ),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let metal = Metal::new(&http, &cfg, &env);
    let vrf = metal
        .create_vrf(&VrfCreateInput {
            name: "n".into(),
            metro: "DA".into(),
            ip_ranges: vec!["10.0.0.0/16".into()],
            ..VrfCreateInput::default()
        })
        .unwrap();
    assert_eq!(vrf.id, "v1");
    assert_eq!(metal.get_vrf("v1").unwrap().unwrap().name, "n");
    let sent = http.sent();
    assert_eq!(sent.len(), 2);
    for r in &sent {
        assert_eq!(r.header("x-auth-token").as_deref(), Some("s3cr3t-token"));
        assert_eq!(r.header("accept").as_deref(), Some("application/json"));
    }
    assert_eq!(sent[0].uri, format!("{BASE}/projects/p1/vrfs"));
    assert_eq!(
        sent[0].header("content-type").as_deref(),
        Some("application/json")
    );
    // The metro code goes out lower-cased.
    assert_eq!(
        sent[0].json(),
        json!({"name": "n", "metro": "da", "ip_ranges": ["10.0.0.0/16"]})
    );
    assert_eq!(sent[1].header("content-type"), None);
    assert!(
        !format!("{cfg:?}").contains("s3cr3t"),
        "the token is redacted"
    );
    http.assert_done();
}

#[test]
fn a_429_is_retried_after_what_the_server_asks_for() {
    let http = ScriptedHttp::new(vec![
        (
            "POST /projects/p1/virtual-networks",
            Reply::status(429).header("retry-after", "3"),
        ),
        (
            "POST /projects/p1/virtual-networks",
            Reply::status(429).header("x-ratelimit-reset", "1002"),
        ),
        (
            "POST /projects/p1/virtual-networks",
            Reply::json(201, json!({"id": "n1", "vxlan": 1000, "metro_code": "da"})),
        ),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let metal = Metal::new(&http, &cfg, &env);
    let vlan = metal
        .create_vlan(&VirtualNetworkCreateInput {
            metro: "da".into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(vlan.vxlan, Some(1000));
    // 3 s from Retry-After; then X-RateLimit-Reset (t = 1002) had already
    // passed at t = 1003, which still waits a second.
    assert_eq!(env.slept_ms(), vec![3_000, 1_000]);
    assert_eq!(metal.calls(), 3);
    http.assert_done();
}

#[test]
fn a_post_is_not_repeated_when_its_outcome_is_unknown() {
    for reply in [Reply::status(500), Reply::status(503), Reply::dropped()] {
        let http = ScriptedHttp::new(vec![("POST /projects/p1/ips", reply)]);
        let (cfg, env) = (cfg(), TestEnv::at(1_000));
        let metal = Metal::new(&http, &cfg, &env);
        let e = metal
            .create_vrf_reservation(&VrfIpReservationCreateInput {
                kind: "vrf",
                vrf_id: "v1".into(),
                network: "10.0.0.0".into(),
                cidr: 29,
                ..Default::default()
            })
            .unwrap_err();
        assert!(matches!(e, MetalError::OutcomeUnknown { .. }), "{e:?}");
        let mapped = metal_ipam_core::error::Error::from(e);
        assert_eq!(mapped.kind(), ErrorKind::Transient);
        assert_eq!(mapped.reason(), "MetalOutcomeUnknown");
        assert!(env.slept_ms().is_empty());
        http.assert_done();
    }
}

#[test]
fn reads_are_retried_with_backoff_until_the_budget_is_spent() {
    let mut script = Vec::new();
    for _ in 0..20 {
        script.push(("GET /vrfs/v1", Reply::status(503)));
    }
    let http = ScriptedHttp::new(script);
    let cfg = MetalConfig {
        retry: RetryPolicy {
            budget_ms: 2_000,
            base_ms: 100,
            cap_ms: 1_000,
        },
        ..cfg()
    };
    let env = TestEnv::at(1_000);
    let metal = Metal::new(&http, &cfg, &env);
    let e = metal.get_vrf("v1").unwrap_err();
    let MetalError::Unavailable { retry_after_s, .. } = e else {
        panic!("{e:?}")
    };
    assert!(retry_after_s >= 1);
    let waits = env.slept_ms();
    assert!(waits.iter().sum::<u64>() <= 2_000, "{waits:?}");
    assert!(waits.len() >= 3, "backoff grows: {waits:?}");
    assert_eq!(metal.calls() as usize, waits.len() + 1);
    // Reads recover when the server does.
    let http = ScriptedHttp::new(vec![
        ("GET /vrfs/v1", Reply::dropped()),
        ("GET /vrfs/v1", Reply::status(502)),
        ("GET /vrfs/v1", Reply::json(200, json!({"id": "v1"}))),
    ]);
    let env = TestEnv::at(1_000);
    let metal = Metal::new(&http, &cfg, &env);
    assert_eq!(metal.get_vrf("v1").unwrap().unwrap().id, "v1");
    assert_eq!(env.slept_ms().len(), 2);
    http.assert_done();
}

#[test]
fn lists_follow_every_page_and_tell_reservations_apart() {
    let page = |n: u32, items: serde_json::Value| {
        Reply::json(
            200,
            json!({"ip_addresses": items, "meta": {"current_page": n, "last_page": 2, "total": 3}}),
        )
    };
    let http = ScriptedHttp::new(vec![
        (
            "GET /projects/p1/ips?types=vrf&page=1&per_page=250",
            page(
                1,
                json!([{"id": "r1", "type": "vrf", "vrf": {"id": "v1"}, "network": "10.0.0.0", "cidr": 29},
                       {"id": "r2", "type": "public_ipv4"}]),
            ),
        ),
        (
            "GET /projects/p1/ips?types=vrf&page=2&per_page=250",
            page(
                2,
                json!([{"id": "r3", "type": "vrf", "vrf": {"href": "/metal/v1/vrfs/v2"}}]),
            ),
        ),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let metal = Metal::new(&http, &cfg, &env);
    let ips = metal.list_ips(&["vrf"]).unwrap();
    let vrfs: Vec<(&str, Option<&str>)> = ips
        .iter()
        .filter_map(|ip| match ip {
            IpAddress::Vrf(r) => Some((r.id.as_str(), r.vrf.id())),
            _ => None,
        })
        .collect();
    assert_eq!(vrfs, [("r1", Some("v1")), ("r3", Some("v2"))]);
    assert_eq!(ips.len(), 3);
    http.assert_done();
}

#[test]
fn a_vlan_is_found_by_number_and_metro() {
    let http = ScriptedHttp::new(vec![(
        "GET /projects/p1/virtual-networks?metro=da",
        Reply::json(
            200,
            json!({"virtual_networks": [
                {"id": "other-metro", "vxlan": 1001, "metro_code": "sv"},
                {"id": "other-number", "vxlan": 1002, "metro_code": "da"},
                {"id": "it", "vxlan": 1001, "metro": {"code": "DA"}}
            ]}),
        ),
    )]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let metal = Metal::new(&http, &cfg, &env);
    assert_eq!(metal.find_vlan(1001, "DA").unwrap().unwrap().id, "it");
    http.assert_done();
}

#[test]
fn errors_carry_the_api_messages_and_map_to_statuses() {
    let http = ScriptedHttp::new(vec![
        (
            "DELETE /ips/r1",
            Reply::json(
                422,
                json!({"errors": ["IP Reservation \"10.0.0.0/29\" error: Cannot delete with associated metal gateway"]}),
            ),
        ),
        (
            "DELETE /ips/r2",
            Reply::json(404, json!({"error": "Not found"})),
        ),
        (
            "GET /vrfs/v9",
            Reply::json(404, json!({"error": "Not found"})),
        ),
        (
            "GET /vrfs/v1",
            Reply::json(401, json!({"error": "Invalid authentication token"})),
        ),
        ("GET /vrfs/v2", Reply::raw(200, b"<html>proxy</html>")),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let metal = Metal::new(&http, &cfg, &env);
    let e = metal.delete_ip("r1").unwrap_err();
    assert!(e.says(422, "associated metal gateway"), "{e}");
    assert_eq!(
        metal_ipam_core::error::Error::from(e).kind(),
        ErrorKind::Conflict
    );
    assert!(!metal.delete_ip("r2").unwrap(), "already gone");
    assert_eq!(metal.get_vrf("v9").unwrap(), None);
    let e = metal_ipam_core::error::Error::from(metal.get_vrf("v1").unwrap_err());
    assert_eq!(
        (e.kind(), e.reason()),
        (ErrorKind::Internal, "MetalForbidden")
    );
    assert!(matches!(
        metal.get_vrf("v2").unwrap_err(),
        MetalError::Malformed { .. }
    ));
    http.assert_done();
}

#[test]
fn deprecation_and_sunset_headers_are_noted_once() {
    let reply = || {
        Reply::json(200, json!({"vrfs": []}))
            .header("deprecation", "true")
            .header("sunset", "Tue, 30 Jun 2026 00:00:00 GMT")
    };
    let http = ScriptedHttp::new(vec![
        ("GET /projects/p1/vrfs", reply()),
        ("GET /projects/p1/vrfs", reply()),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let metal = Metal::new(&http, &cfg, &env);
    metal.list_vrfs(None).unwrap();
    metal.list_vrfs(None).unwrap();
    assert_eq!(
        metal.notices(),
        ["deprecation: true", "sunset: Tue, 30 Jun 2026 00:00:00 GMT"]
    );
    assert_eq!(env.now(), 1_000, "no waiting");
}

#[test]
fn every_attempt_is_bounded_by_what_is_left_of_the_budget() {
    let http = ScriptedHttp::new(vec![
        ("GET /vrfs/v1", Reply::failed(TransportKind::Timeout)),
        ("GET /vrfs/v1", Reply::status(503)),
        ("GET /vrfs/v1", Reply::json(200, json!({"id": "v1"}))),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let metal = Metal::new(&http, &cfg, &env);
    assert_eq!(metal.get_vrf("v1").unwrap().unwrap().id, "v1");
    let sent = http.sent();
    let budget = cfg.retry.budget_ms;
    assert_eq!(
        sent[0].deadline,
        Deadline {
            connect_ms: CONNECT_MS,
            total_ms: budget
        }
    );
    // Each later attempt may only use what the waits before it left.
    let waited: Vec<u64> = env.slept_ms();
    assert_eq!(sent[1].deadline.total_ms, budget - waited[0]);
    assert_eq!(sent[2].deadline.total_ms, budget - waited[0] - waited[1]);
    assert!(sent.iter().all(|s| s.deadline.connect_ms <= CONNECT_MS));
}

#[test]
fn a_timed_out_post_is_an_unknown_outcome_and_one_never_sent_is_retried() {
    let input = VrfIpReservationCreateInput {
        kind: "vrf",
        vrf_id: "v1".into(),
        network: "10.0.0.0".into(),
        cidr: 29,
        ..Default::default()
    };
    // A timeout: Metal may have processed it, so it is never repeated.
    let http = ScriptedHttp::new(vec![(
        "POST /projects/p1/ips",
        Reply::failed(TransportKind::Timeout),
    )]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let metal = Metal::new(&http, &cfg, &env);
    let e = metal.create_vrf_reservation(&input).unwrap_err();
    assert!(matches!(e, MetalError::OutcomeUnknown { .. }), "{e:?}");
    http.assert_done();
    // A refused connection sent nothing: the POST is retried.
    let http = ScriptedHttp::new(vec![
        (
            "POST /projects/p1/ips",
            Reply::failed(TransportKind::Unreachable),
        ),
        (
            "POST /projects/p1/ips",
            Reply::json(201, json!({"id": "r1", "type": "vrf", "vrf": {"id": "v1"}})),
        ),
    ]);
    let env = TestEnv::at(1_000);
    let metal = Metal::new(&http, &cfg, &env);
    assert_eq!(metal.create_vrf_reservation(&input).unwrap().id, "r1");
    assert_eq!(env.slept_ms().len(), 1);
    http.assert_done();
}

#[test]
fn a_tls_failure_or_a_denied_request_is_a_definite_error_not_a_retry() {
    for (kind, reason) in [
        (TransportKind::Tls, "MetalTlsFailed"),
        (TransportKind::Denied, "MetalDenied"),
    ] {
        let http = ScriptedHttp::new(vec![("GET /vrfs/v1", Reply::failed(kind))]);
        let (cfg, env) = (cfg(), TestEnv::at(1_000));
        let metal = Metal::new(&http, &cfg, &env);
        let e = metal_ipam_core::error::Error::from(metal.get_vrf("v1").unwrap_err());
        assert_eq!((e.status(), e.reason()), (500, reason), "{kind:?}");
        assert!(!e.message().contains("retry;"), "{}", e.message());
        assert!(env.slept_ms().is_empty(), "not retried");
        http.assert_done();
    }
}
