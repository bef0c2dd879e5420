//! phoenixNAP as a `Cloud` (`pnap::cloud`) against a scripted transport:
//! the requests each seam call makes, in order, and what it reads back —
//! servers as devices, memberships as operations, IPs on memberships as
//! assigned addresses (joined, added, removed, left), the audit log as
//! hints, and the refusals of what phoenixNAP cannot do.

use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::cloud::{Capability, Cloud, CloudError};
use metal_ipam_core::pnap::auth::Credentials;
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::testing::{Reply, ScriptedHttp, TestEnv};
use serde_json::{json, Map, Value};

const TOKEN: &str = "POST /auth/realms/BMC/protocol/openid-connect/token";
const JOIN_PRIVATE: &str =
    "POST /bmc/v1/servers/s1/network-configuration/private-network-configuration/private-networks";
const JOIN_PUBLIC: &str =
    "POST /bmc/v1/servers/s1/network-configuration/public-network-configuration/public-networks";

fn cfg() -> PnapConfig {
    PnapConfig {
        api_url: "http://pnap.test".into(),
        token_url: "http://pnap.test/auth/realms/BMC/protocol/openid-connect/token".into(),
        credentials: Credentials {
            client_id: "id".into(),
            client_secret: "secret".into(),
        },
        retry: RetryPolicy::default(),
    }
}

/// The script, after the token request every client starts with.
fn script(rest: Vec<(&'static str, Reply)>) -> ScriptedHttp {
    let mut all = vec![(
        TOKEN,
        Reply::json(
            200,
            json!({"access_token": "t", "token_type": "Bearer", "expires_in": 3600}),
        ),
    )];
    all.extend(rest);
    ScriptedHttp::new(all)
}

fn server(status: &str, private: Value, public: Value) -> Reply {
    Reply::json(
        200,
        json!({"id": "s1", "status": status, "hostname": "node-1", "location": "PHX",
            "privateIpAddresses": ["10.0.0.11"], "publicIpAddresses": ["198.51.100.2"],
            "networkConfiguration": {
                "privateNetworkConfiguration": {"privateNetworks": private},
                "publicNetworkConfiguration": {"publicNetworks": public}}}),
    )
}

fn private_networks() -> Reply {
    Reply::json(
        200,
        json!([{"id": "n-other", "name": "other", "vlanId": 11, "type": "PRIVATE", "location": "PHX",
                "locationDefault": false, "cidr": "10.1.0.0/24", "servers": [], "memberships": [],
                "status": "READY", "createdOn": "2026-12-01T00:00:00Z"},
               {"id": "n1", "name": "pool", "vlanId": 10, "type": "PRIVATE", "location": "PHX",
                "locationDefault": false, "cidr": "10.0.0.0/24", "servers": [], "memberships": [],
                "status": "READY", "createdOn": "2026-12-01T00:00:00Z"}]),
    )
}

fn public_networks() -> Reply {
    Reply::json(
        200,
        json!([{"id": "p1", "name": "public", "vlanId": 20, "location": "PHX", "status": "READY",
                "ipBlocks": [{"id": "b1", "cidr": "198.51.100.0/29", "usedIpsCount": "1"}],
                "memberships": [], "createdOn": "2026-12-01T00:00:00Z"}]),
    )
}

fn run<T>(http: &ScriptedHttp, f: impl FnOnce(&dyn Cloud) -> T) -> T {
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let pnap = Pnap::new(http, &cfg, &env);
    let out = f(&pnap);
    http.assert_done();
    out
}

#[test]
fn servers_are_devices_with_one_nic_carrying_their_networks() {
    let http = script(vec![
        (
            "GET /bmc/v1/servers/s1",
            server(
                "powered-on",
                json!([{"id": "n1", "ips": ["10.0.0.5"], "statusDescription": "assigned"}]),
                json!([{"id": "p1", "ips": ["198.51.100.3"], "statusDescription": "in-progress"}]),
            ),
        ),
        (
            "GET /bmc/v1/servers/s2",
            Reply::json(404, json!({"message": "Server not found"})),
        ),
        (
            "GET /bmc/v1/servers/s1",
            server("deleting", json!([]), json!([])),
        ),
    ]);
    run(&http, |cloud| {
        let d = cloud.device_nics("s1").unwrap().unwrap();
        assert!(d.active && !d.gone);
        assert_eq!(d.nics.len(), 1);
        assert_eq!(d.nics[0].id, "s1");
        assert_eq!(d.nics[0].segments, ["n1", "p1"]);
        assert!(d.addresses.iter().all(|a| a.management == Some(true)));
        assert!(cloud.device("s2").unwrap().is_none());
        let going = cloud.device("s1").unwrap().unwrap();
        assert!(going.gone && !going.active);
    });
}

#[test]
fn an_address_joins_its_network_or_is_added_to_the_membership() {
    let http = script(vec![
        // Not yet on n1: join it with the address.
        ("GET /bmc/v1/servers/s1", server("powered-on", json!([]), json!([]))),
        ("GET /networks/v1/private-networks?location=PHX", private_networks()),
        (
            JOIN_PRIVATE,
            Reply::json(202, json!({"id": "n1", "ips": ["10.0.0.5"], "dhcp": false, "statusDescription": "in-progress"})),
        ),
        // On n1 with another address: the list grows.
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([{"id": "n1", "ips": ["10.0.0.5"], "statusDescription": "assigned"}]), json!([])),
        ),
        ("GET /networks/v1/private-networks?location=PHX", private_networks()),
        ("PATCH /bmc/v1/servers/s1/network-configuration/private-network-configuration/private-networks/n1",
            Reply::json(200, json!({"id": "n1", "ips": ["10.0.0.5", "10.0.0.6"]}))),
        // Already there (a lost answer's retry): nothing written.
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([{"id": "n1", "ips": ["10.0.0.5", "10.0.0.6"]}]), json!([])),
        ),
        ("GET /networks/v1/private-networks?location=PHX", private_networks()),
        // A public address: the network whose block holds it.
        ("GET /bmc/v1/servers/s1", server("powered-on", json!([]), json!([]))),
        ("GET /networks/v1/private-networks?location=PHX", private_networks()),
        ("GET /networks/v1/public-networks?location=PHX", public_networks()),
        (
            JOIN_PUBLIC,
            Reply::json(202, json!({"id": "p1", "ips": ["198.51.100.4"], "statusDescription": "in-progress"})),
        ),
    ]);
    run(&http, |cloud| {
        let a = cloud
            .assign_address("s1", "10.0.0.5/24", Map::new())
            .unwrap();
        assert_eq!(a.id, "s1/private/n1/10.0.0.5");
        let b = cloud.assign_address("s1", "10.0.0.6", Map::new()).unwrap();
        assert_eq!(b.address.as_deref(), Some("10.0.0.6"));
        let again = cloud.assign_address("s1", "10.0.0.6", Map::new()).unwrap();
        assert_eq!(again, b);
        let p = cloud
            .assign_address("s1", "198.51.100.4", Map::new())
            .unwrap();
        assert_eq!(p.id, "s1/public/p1/198.51.100.4");
    });
    let sent = http.sent();
    assert_eq!(
        sent[3].json(),
        json!({"id": "n1", "ips": ["10.0.0.5"], "dhcp": false})
    );
    assert_eq!(sent[6].json(), json!({"ips": ["10.0.0.5", "10.0.0.6"]}));
    assert_eq!(
        sent[12].json(),
        json!({"id": "p1", "ips": ["198.51.100.4"]})
    );
}

#[test]
fn an_address_no_network_holds_is_refused_naming_the_location() {
    let http = script(vec![
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([]), json!([])),
        ),
        (
            "GET /networks/v1/private-networks?location=PHX",
            private_networks(),
        ),
        (
            "GET /networks/v1/public-networks?location=PHX",
            public_networks(),
        ),
    ]);
    run(&http, |cloud| {
        let e = cloud
            .assign_address("s1", "192.0.2.9", Map::new())
            .unwrap_err();
        assert!(
            e.says(422, "no private or public network of PHX holds 192.0.2.9"),
            "{e}"
        );
        assert!(cloud.assign_address("s1", "not-an-ip", Map::new()).is_err());
    });
}

#[test]
fn phoenixnaps_refusals_are_the_seams_422_and_a_changing_membership_is_not_now() {
    let http = script(vec![
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([]), json!([])),
        ),
        (
            "GET /networks/v1/private-networks?location=PHX",
            private_networks(),
        ),
        (
            JOIN_PRIVATE,
            Reply::json(
                400,
                json!({"message": "10.0.0.5 is already used by server s2"}),
            ),
        ),
        (
            "GET /bmc/v1/servers/s1",
            server(
                "powered-on",
                json!([{"id": "n1", "ips": ["10.0.0.6"], "statusDescription": "in-progress"}]),
                json!([]),
            ),
        ),
        (
            "GET /networks/v1/private-networks?location=PHX",
            private_networks(),
        ),
        (
            "PATCH /bmc/v1/servers/s1/network-configuration/private-network-configuration/private-networks/n1",
            Reply::json(409, json!({"message": "the membership is in progress"})),
        ),
    ]);
    run(&http, |cloud| {
        let taken = cloud
            .assign_address("s1", "10.0.0.5", Map::new())
            .unwrap_err();
        assert!(taken.says(422, "already used by server s2"), "{taken:?}");
        let busy = cloud
            .assign_address("s1", "10.0.0.5", Map::new())
            .unwrap_err();
        assert!(
            matches!(
                busy,
                CloudError::Unavailable {
                    retry_after_s: 5,
                    ..
                }
            ),
            "{busy:?}"
        );
    });
}

#[test]
fn unassigning_removes_the_ip_and_leaves_with_the_last_one() {
    let http = script(vec![
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([{"id": "n1", "ips": ["10.0.0.5", "10.0.0.6"]}]), json!([])),
        ),
        ("PATCH /bmc/v1/servers/s1/network-configuration/private-network-configuration/private-networks/n1",
            Reply::json(200, json!({"id": "n1", "ips": ["10.0.0.6"]}))),
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([{"id": "n1", "ips": ["10.0.0.6"]}]), json!([])),
        ),
        ("DELETE /bmc/v1/servers/s1/network-configuration/private-network-configuration/private-networks/n1",
            Reply::json(202, json!("The server is being removed from the specified private network."))),
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([{"id": "n1", "ips": ["10.0.0.6"], "statusDescription": "in-progress"}]), json!([])),
        ),
        ("GET /bmc/v1/servers/s1", server("powered-on", json!([]), json!([]))),
        ("GET /bmc/v1/servers/gone", Reply::json(404, json!({"message": "not found"}))),
    ]);
    run(&http, |cloud| {
        assert!(cloud.unassign_address("s1/private/n1/10.0.0.5").unwrap());
        // The leave is accepted: the IP is held until the server has left.
        let leaving = |r| matches!(r, Err(CloudError::Unavailable { .. }));
        assert!(leaving(cloud.unassign_address("s1/private/n1/10.0.0.6")));
        assert!(leaving(cloud.unassign_address("s1/private/n1/10.0.0.6")));
        assert!(!cloud.unassign_address("s1/private/n1/10.0.0.6").unwrap());
        assert!(!cloud.unassign_address("gone/private/n1/10.0.0.6").unwrap());
        assert!(!cloud.unassign_address("malformed").unwrap());
    });
    assert_eq!(http.sent()[2].json(), json!({"ips": ["10.0.0.6"]}));
}

#[test]
fn memberships_are_operations_read_from_the_server() {
    let http = script(vec![
        (
            "GET /bmc/v1/servers/s1",
            server(
                "powered-on",
                json!([{"id": "n1", "ips": ["10.0.0.5"], "statusDescription": "in-progress"}]),
                json!([]),
            ),
        ),
        (
            "GET /bmc/v1/servers/s1",
            server(
                "powered-on",
                json!([{"id": "n1", "ips": ["10.0.0.5"], "statusDescription": "in-progress"}]),
                json!([]),
            ),
        ),
        (
            "GET /bmc/v1/servers/s1",
            server(
                "powered-on",
                json!([{"id": "n1", "ips": ["10.0.0.5"], "statusDescription": "assigned"}]),
                json!([]),
            ),
        ),
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([]), json!([])),
        ),
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([]), json!([])),
        ),
        (
            "GET /bmc/v1/servers/s1",
            server("powered-on", json!([]), json!([])),
        ),
    ]);
    run(&http, |cloud| {
        // An unfinished membership may be joining or leaving (both read
        // `in-progress`): the operation found says neither.
        let running = cloud.unfinished_operation("s1").unwrap().unwrap();
        assert_eq!(
            (running.id.as_str(), running.state.as_deref()),
            ("change:n1", Some("in_progress"))
        );
        assert_eq!(
            cloud
                .operation("s1", "join:n1")
                .unwrap()
                .unwrap()
                .state
                .as_deref(),
            Some("in_progress")
        );
        assert!(cloud
            .operation("s1", "join:n1")
            .unwrap()
            .unwrap()
            .finished());
        assert_eq!(
            cloud
                .operation("s1", "leave:n1")
                .unwrap()
                .unwrap()
                .state
                .as_deref(),
            Some("completed")
        );
        let failed = cloud.operation("s1", "join:n1").unwrap().unwrap();
        assert_eq!(failed.state.as_deref(), Some("failed"));
        // The found one is done once the membership is gone (a leave).
        let done = cloud.operation("s1", "change:n1").unwrap().unwrap();
        assert_eq!(done.state.as_deref(), Some("completed"));
        assert!(cloud.operation("s1", "bogus").unwrap().is_none());
    });
}

#[test]
fn what_phoenixnap_cannot_do_is_refused_before_any_request() {
    let http = ScriptedHttp::new(vec![]);
    run(&http, |cloud| {
        let e = cloud
            .change_segments("s1", true, &["n1".into(), "n2".into()])
            .unwrap_err();
        assert!(e.says(422, "one network per call"), "{e}");
        for c in [
            Capability::NicModes,
            Capability::Bonding,
            Capability::NativeSegment,
            Capability::VrfPools,
            Capability::Gateways,
            Capability::BatchAttach,
        ] {
            let refused = cloud
                .capabilities()
                .require(cloud.name(), c, "a profile")
                .unwrap_err();
            assert!(refused.to_string().contains("phoenixNAP"), "{refused}");
        }
        assert!(cloud.capabilities().has(Capability::ChosenAddresses));
        assert!(cloud.nic_modes().is_none());
    });
}

#[test]
fn the_audit_log_is_a_hint_that_makes_the_poll_reread_its_servers() {
    let ev = |t: &str| json!({"name": "API.Event", "timestamp": t, "userInfo": {"accountId": "a", "username": "u"}});
    let http = script(vec![
        (
            "GET /audit/v1/events?limit=1&order=DESC",
            Reply::json(200, json!([ev("2026-12-06T10:00:00.000Z")])),
        ),
        (
            "GET /audit/v1/events?from=2026-12-06T10%3A00%3A00.000Z&limit=1000&order=ASC",
            Reply::json(
                200,
                json!([
                    ev("2026-12-06T10:00:00.000Z"),
                    ev("2026-12-06T10:00:01.000Z"),
                    ev("2026-12-06T10:00:02.500Z")
                ]),
            ),
        ),
        (
            "GET /audit/v1/events?from=2026-12-06T10%3A00%3A02.500Z&limit=1000&order=ASC",
            Reply::json(200, json!([ev("2026-12-06T10:00:02.500Z")])),
        ),
    ]);
    run(&http, |cloud| {
        let (first, found) = cloud.events_after(None, 10).unwrap();
        assert!(!found, "no cursor: resync");
        assert_eq!(first[0].id, "2026-12-06T10:00:00.000Z");
        let (events, found) = cloud.events_after(Some(&first[0].id), 10).unwrap();
        assert!(!found, "new events name no server: resync");
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(
            ids,
            ["2026-12-06T10:00:02.500Z", "2026-12-06T10:00:01.000Z"],
            "newest first"
        );
        assert!(events.iter().all(|e| e.devices.is_empty()));
        let (none, found) = cloud.events_after(Some(ids[0]), 10).unwrap();
        assert!(none.is_empty() && found, "nothing new: nothing to re-read");
    });
}
