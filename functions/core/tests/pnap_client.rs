//! The phoenixNAP client against a scripted transport: the token fetched
//! once and sent on every request, refreshed once on a 401, the
//! credentials refused clearly; retries after `Retry-After`, a POST never
//! repeated after a 5xx; error bodies; no secret in any error.

use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::cloud::CloudError;
use metal_ipam_core::pnap::auth::Credentials;
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::pnap::model::{PrivateNetworkCreate, ServerPrivateNetwork};
use metal_ipam_core::ports::Env;
use metal_ipam_core::testing::{Reply, ScriptedHttp, TestEnv};
use serde_json::json;

const TOKEN_PATH: &str = "POST /auth/realms/BMC/protocol/openid-connect/token";
const SECRET: &str = "client-secret-9f2";

fn cfg() -> PnapConfig {
    PnapConfig {
        api_url: "http://pnap.test".into(),
        token_url: "http://auth.pnap.test/auth/realms/BMC/protocol/openid-connect/token".into(),
        credentials: Credentials {
            client_id: "metal-ipam".into(),
            client_secret: SECRET.into(),
        },
        retry: RetryPolicy::default(),
    }
}

fn token(value: &str, expires_in: u64) -> Reply {
    Reply::json(
        200,
        json!({"access_token": value, "token_type": "Bearer", "expires_in": expires_in}),
    )
}

fn network(id: &str) -> serde_json::Value {
    json!({"id": id, "name": "n", "vlanId": 10, "type": "PRIVATE", "location": "PHX",
        "locationDefault": false, "cidr": "10.0.0.0/24", "servers": [], "memberships": [],
        "status": "READY", "createdOn": "2026-12-01T00:00:00Z"})
}

#[test]
fn one_token_serves_every_request_until_it_nears_expiry() {
    let http = ScriptedHttp::new(vec![
        (TOKEN_PATH, token("tok-1", 3600)),
        (
            "GET /networks/v1/private-networks/a",
            Reply::json(200, network("a")),
        ),
        (
            "GET /networks/v1/private-networks?location=PHX",
            Reply::json(200, json!([network("a")])),
        ),
        (TOKEN_PATH, token("tok-2", 3600)),
        (
            "GET /networks/v1/private-networks/a",
            Reply::json(200, network("a")),
        ),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let pnap = Pnap::new(&http, &cfg, &env);
    assert_eq!(pnap.private_network("a").unwrap().unwrap().vlan_id, 10);
    assert_eq!(pnap.private_networks(Some("PHX")).unwrap().len(), 1);
    env.set_now(1_000 + 3_600 - 59);
    assert!(pnap.private_network("a").unwrap().is_some());
    http.assert_done();
    let sent = http.sent();
    let auth: Vec<String> = sent
        .iter()
        .map(|r| r.header("authorization").unwrap())
        .collect();
    assert!(auth[0].starts_with("Basic "));
    assert_eq!(sent[0].body, b"grant_type=client_credentials");
    assert_eq!(
        sent[0].header("content-type").as_deref(),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(auth[1], "Bearer tok-1");
    assert_eq!(auth[2], "Bearer tok-1");
    assert_eq!(auth[4], "Bearer tok-2");
    assert_eq!(pnap.calls(), 5);
}

#[test]
fn a_401_refreshes_the_token_once_then_is_the_answer() {
    let http = ScriptedHttp::new(vec![
        (TOKEN_PATH, token("old", 3600)),
        (
            "GET /bmc/v1/servers/s1",
            Reply::json(401, json!({"message": "expired"})),
        ),
        (TOKEN_PATH, token("new", 3600)),
        (
            "GET /bmc/v1/servers/s1",
            Reply::json(401, json!({"message": "Unauthorized"})),
        ),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(0));
    let pnap = Pnap::new(&http, &cfg, &env);
    let e = pnap.server("s1").unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    assert!(e.says(401, "unauthorized"));
    http.assert_done();
    let sent = http.sent();
    assert_eq!(
        sent[3].header("authorization").as_deref(),
        Some("Bearer new")
    );
}

#[test]
fn refused_credentials_are_named_and_the_secret_is_not() {
    let http = ScriptedHttp::new(vec![(
        TOKEN_PATH,
        Reply::json(
            401,
            json!({"error": "invalid_client", "error_description": "Invalid client credentials"}),
        ),
    )]);
    let (cfg, env) = (cfg(), TestEnv::at(0));
    let pnap = Pnap::new(&http, &cfg, &env);
    let e = pnap.private_networks(None).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("client id and secret") && text.contains("invalid_client"),
        "{text}"
    );
    assert!(!text.contains(SECRET) && !format!("{cfg:?}").contains(SECRET));
}

#[test]
fn rate_limits_wait_and_a_create_is_never_repeated_after_a_5xx() {
    let http = ScriptedHttp::new(vec![
        (TOKEN_PATH, token("t", 3600)),
        (
            "GET /networks/v1/private-networks/a",
            Reply::json(429, json!({"message": "slow down"})).header("retry-after", "2"),
        ),
        (
            "GET /networks/v1/private-networks/a",
            Reply::json(200, network("a")),
        ),
        (
            "POST /networks/v1/private-networks",
            Reply::json(502, json!({"message": "bad gateway"})),
        ),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(0));
    let pnap = Pnap::new(&http, &cfg, &env);
    let before = env.now_ms();
    assert!(pnap.private_network("a").unwrap().is_some());
    assert_eq!(
        env.now_ms() - before,
        2_000,
        "waited Retry-After on the injected clock"
    );
    let e = pnap
        .create_private_network(&PrivateNetworkCreate {
            name: "metal-ipam pool a".into(),
            description: None,
            location: "PHX".into(),
            vlan_id: None,
            cidr: Some("10.0.0.0/24".into()),
        })
        .unwrap_err();
    assert!(matches!(e, CloudError::OutcomeUnknown { .. }), "{e}");
    http.assert_done();
}

#[test]
fn errors_carry_the_validation_messages_and_404s_read_as_absent() {
    let http = ScriptedHttp::new(vec![
        (TOKEN_PATH, token("t", 3600)),
        ("GET /bmc/v1/servers/gone", Reply::json(404, json!({"message": "not found"}))),
        (
            "POST /bmc/v1/servers/s1/network-configuration/private-network-configuration/private-networks",
            Reply::json(400, json!({"message": "Validation failed", "validationErrors": ["ips: 10.9.0.1 is outside the network's range"]})),
        ),
        (
            "DELETE /bmc/v1/servers/s1/network-configuration/private-network-configuration/private-networks/n1",
            Reply::json(404, json!({"message": "not a member"})),
        ),
    ]);
    let (cfg, env) = (cfg(), TestEnv::at(0));
    let pnap = Pnap::new(&http, &cfg, &env);
    assert!(pnap.server("gone").unwrap().is_none());
    let e = pnap
        .join_private_network(
            "s1",
            &ServerPrivateNetwork {
                id: "n1".into(),
                ips: vec!["10.9.0.1".into()],
                dhcp: Some(false),
                status_description: None,
            },
        )
        .unwrap_err();
    assert!(e.says(400, "outside the network's range"), "{e}");
    assert_eq!(
        http.sent()[2].json(),
        json!({"id": "n1", "ips": ["10.9.0.1"], "dhcp": false})
    );
    assert!(!pnap.leave_private_network("s1", "n1").unwrap());
    http.assert_done();
}
