//! The phoenixNAP calls for backed pools (`provision::pnap_pools`) against
//! a scripted transport: which requests each call makes, in which order,
//! with which bodies; adoption by id, by VLAN and in the wrong location;
//! private and public creations (the public one with its block); a lost
//! answer or a refusal under a name metal-ipam took reported as an unknown
//! outcome (not one someone else took); duplicates found by name and
//! metal-ipam's description (networks) or description (blocks), the
//! younger deleted; an assigned block detached before it is deleted;
//! members and a member that is gone.

use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::pnap::auth::Credentials;
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::provision::pnap_pools::{
    adopt_block, adopt_network, attach_block, block_cidr, create_block, create_private_network,
    create_public_network, delete_block, delete_network, find_block, find_network, fit_name,
    members, network_cidr, remove_member, NetworkKind, NETWORK_DESCRIPTION,
};
use metal_ipam_core::testing::{Reply, ScriptedHttp, TestEnv};
use metal_ipam_core::ErrorKind;
use serde_json::{json, Value};

const TOKEN: &str = "POST /auth/realms/BMC/protocol/openid-connect/token";
const TAG: &str = "metal-ipam-team-a-pool-b-1a2b3c4d";
const PRIVATE: &str = "/networks/v1/private-networks";
const PUBLIC: &str = "/networks/v1/public-networks";
const BLOCKS: &str = "/ips/v1/ip-blocks";

fn cfg() -> PnapConfig {
    PnapConfig {
        api_url: "http://pnap.test".into(),
        token_url: "http://auth.pnap.test/auth/realms/BMC/protocol/openid-connect/token".into(),
        credentials: Credentials {
            client_id: "metal-ipam".into(),
            client_secret: "s".into(),
        },
        // Short waits: no retry in these scripts waits long.
        retry: RetryPolicy::default(),
    }
}

/// Runs `f` on a client over `script` (a token request first), then checks
/// every scripted request was made; returns `f`'s result and the requests
/// after the token's as `METHOD path?query` with their JSON bodies.
fn run<T>(
    script: Vec<(String, Reply)>,
    f: impl FnOnce(&Pnap<'_, ScriptedHttp, TestEnv>) -> T,
) -> (T, Vec<(String, Value)>) {
    let token = Reply::json(
        200,
        json!({"access_token": "t", "token_type": "Bearer", "expires_in": 3600}),
    );
    let mut all: Vec<(&str, Reply)> = vec![(TOKEN, token)];
    all.extend(script.iter().map(|(r, reply)| (r.as_str(), reply.clone())));
    let http = ScriptedHttp::new(all);
    let (cfg, env) = (cfg(), TestEnv::at(1_000));
    let out = f(&Pnap::new(&http, &cfg, &env));
    http.assert_done();
    let sent = http
        .sent()
        .into_iter()
        .skip(1)
        .map(|s| {
            let path = s.uri.trim_start_matches("http://pnap.test").to_owned();
            (format!("{} {path}", s.method), s.json())
        })
        .collect();
    (out, sent)
}

fn step(request: &str, reply: Reply) -> (String, Reply) {
    (request.to_owned(), reply)
}

fn lines(sent: &[(String, Value)]) -> Vec<&str> {
    sent.iter().map(|(l, _)| l.as_str()).collect()
}

/// A private network metal-ipam created (its description).
fn private(id: &str, name: &str, vlan: u16, location: &str, created: &str) -> Value {
    json!({"id": id, "name": name, "description": NETWORK_DESCRIPTION, "vlanId": vlan,
        "type": "PRIVATE", "location": location, "locationDefault": false,
        "cidr": "10.0.0.0/24", "servers": [], "memberships": [], "status": "READY",
        "createdOn": created})
}

/// A network someone else created under the same name.
fn foreign(mut network: Value) -> Value {
    network["description"] = json!("made by hand");
    network
}

fn public(id: &str, name: &str, vlan: u16, blocks: Value, members: Value) -> Value {
    json!({"id": id, "name": name, "description": NETWORK_DESCRIPTION, "vlanId": vlan,
        "location": "PHX", "ipBlocks": blocks, "memberships": members, "status": "READY",
        "createdOn": "2025-01-01T00:00:00.000Z"})
}

fn block(id: &str, description: &str, created: &str, assigned: Option<(&str, &str)>) -> Value {
    let mut b = json!({"id": id, "location": "PHX", "cidrBlockSize": "/29",
        "cidr": "198.18.0.0/29", "ipVersion": "V4", "status": "unassigned",
        "description": description, "createdOn": created});
    if let Some((to, kind)) = assigned {
        b["status"] = json!("assigned");
        b["assignedResourceId"] = json!(to);
        b["assignedResourceType"] = json!(kind);
    }
    b
}

// -- adoption -----------------------------------------------------------------------

#[test]
fn a_network_is_adopted_by_id_or_by_vlan_in_its_location() {
    let (got, sent) = run(
        vec![
            step(
                &format!("GET {PRIVATE}/n1"),
                Reply::json(200, private("n1", "x", 10, "PHX", "2025-01-01T00:00:00Z")),
            ),
            step(
                &format!("GET {PUBLIC}?location=PHX"),
                Reply::json(
                    200,
                    json!([
                        public("p1", "a", 20, json!([]), json!([])),
                        public("p2", "b", 21, json!([]), json!([]))
                    ]),
                ),
            ),
        ],
        |p| {
            (
                adopt_network(p, NetworkKind::Private, "PHX", Some("n1"), None).unwrap(),
                adopt_network(p, NetworkKind::Public, "PHX", None, Some(21)).unwrap(),
            )
        },
    );
    assert_eq!(got, ("n1".to_owned(), "p2".to_owned()));
    assert_eq!(
        lines(&sent),
        [
            "GET /networks/v1/private-networks/n1",
            "GET /networks/v1/public-networks?location=PHX"
        ]
    );
}

#[test]
fn adoption_refusals_name_the_field() {
    let (errors, _) = run(
        vec![
            step(
                &format!("GET {PRIVATE}/n1"),
                Reply::json(200, private("n1", "x", 10, "ASH", "2025-01-01T00:00:00Z")),
            ),
            step(
                &format!("GET {PRIVATE}/gone"),
                Reply::json(404, json!({"message": "not found"})),
            ),
            step(
                &format!("GET {PRIVATE}?location=PHX"),
                Reply::json(
                    200,
                    json!([private("n2", "x", 11, "PHX", "2025-01-01T00:00:00Z")]),
                ),
            ),
            step(
                &format!("GET {PRIVATE}/n2"),
                Reply::json(200, private("n2", "x", 11, "PHX", "2025-01-01T00:00:00Z")),
            ),
            step(
                &format!("GET {BLOCKS}/b1"),
                Reply::json(200, block("b1", "x", "2025-01-01T00:00:00Z", None)),
            ),
            step(
                &format!("GET {BLOCKS}/b2"),
                Reply::json(404, json!({"message": "IP block not found"})),
            ),
        ],
        |p| {
            let private = NetworkKind::Private;
            vec![
                adopt_network(p, private, "PHX", Some("n1"), None).unwrap_err(),
                adopt_network(p, private, "PHX", Some("gone"), None).unwrap_err(),
                adopt_network(p, private, "PHX", None, Some(12)).unwrap_err(),
                adopt_network(p, private, "PHX", Some("n2"), Some(12)).unwrap_err(),
                adopt_network(p, private, "PHX", None, None).unwrap_err(),
                adopt_block(p, "SGP", "b1").unwrap_err(),
                adopt_block(p, "PHX", "b2").unwrap_err(),
            ]
        },
    );
    let fields: Vec<(u16, &str)> = errors
        .iter()
        .map(|e| (e.status(), e.field().unwrap_or("")))
        .collect();
    assert_eq!(
        fields,
        [
            (422, "spec.phoenixnap.location"),
            (422, "spec.phoenixnap.privateNetwork.id"),
            (422, "spec.phoenixnap.privateNetwork.vlanId"),
            (422, "spec.phoenixnap.privateNetwork.vlanId"),
            (422, "spec.phoenixnap.privateNetwork"),
            (422, "spec.phoenixnap.location"),
            (422, "spec.phoenixnap.ipBlock.id"),
        ]
    );
    assert!(errors[0].message().contains("ASH"), "{}", errors[0]);
    assert!(errors[2].message().contains("VLAN 12"), "{}", errors[2]);
}

#[test]
fn a_block_on_a_server_and_a_private_network_without_a_range_are_not_adopted() {
    let mut rangeless = private("n1", "x", 10, "PHX", "2025-01-01T00:00:00Z");
    rangeless.as_object_mut().unwrap().remove("cidr");
    let (errors, _) = run(
        vec![
            step(&format!("GET {PRIVATE}/n1"), Reply::json(200, rangeless)),
            step(
                &format!("GET {BLOCKS}/b1"),
                Reply::json(
                    200,
                    block("b1", "x", "2025-01-01T00:00:00Z", Some(("s1", "server"))),
                ),
            ),
        ],
        |p| {
            [
                adopt_network(p, NetworkKind::Private, "PHX", Some("n1"), None).unwrap_err(),
                adopt_block(p, "PHX", "b1").unwrap_err(),
            ]
        },
    );
    assert_eq!(errors[0].field(), Some("spec.phoenixnap.privateNetwork.id"));
    assert!(errors[0].message().contains("no IP range"), "{}", errors[0]);
    assert_eq!(errors[1].field(), Some("spec.phoenixnap.ipBlock.id"));
    assert!(errors[1].message().contains("server s1"), "{}", errors[1]);
}

// -- creation -------------------------------------------------------------------------

#[test]
fn private_and_public_networks_and_blocks_are_created_with_the_fitted_tag() {
    let long_tag = format!("metal-ipam-ns_x-{}-1a2b3c4d", "p".repeat(120));
    let (ids, sent) = run(
        vec![
            step(
                &format!("POST {PRIVATE}"),
                Reply::json(201, private("n1", TAG, 100, "PHX", "2025-01-01T00:00:00Z")),
            ),
            step(
                &format!("POST {BLOCKS}"),
                Reply::json(201, block("b1", TAG, "2025-01-01T00:00:00Z", None)),
            ),
            step(
                &format!("POST {PUBLIC}"),
                Reply::json(
                    201,
                    public(
                        "p1",
                        TAG,
                        101,
                        json!([{"id": "b1", "cidr": "198.18.0.0/29", "usedIpsCount": "0"}]),
                        json!([]),
                    ),
                ),
            ),
        ],
        |p| {
            (
                create_private_network(p, "PHX", TAG, "10.0.0.0/24", Some(100)).unwrap(),
                create_block(p, "PHX", 29, TAG).unwrap(),
                create_public_network(p, "PHX", &long_tag, None, "b1").unwrap(),
            )
        },
    );
    assert_eq!(ids, ("n1".into(), "b1".into(), "p1".into()));
    assert_eq!(
        lines(&sent),
        [
            "POST /networks/v1/private-networks",
            "POST /ips/v1/ip-blocks",
            "POST /networks/v1/public-networks"
        ]
    );
    assert_eq!(
        sent[0].1,
        json!({"name": TAG, "description": NETWORK_DESCRIPTION, "location": "PHX",
            "vlanId": 100, "cidr": "10.0.0.0/24"})
    );
    assert_eq!(
        sent[1].1,
        json!({"location": "PHX", "cidrBlockSize": "/29", "description": TAG})
    );
    let name = fit_name(&long_tag);
    assert_eq!(name.len(), 100);
    assert!(!name.contains('_'));
    assert_eq!(
        sent[2].1,
        json!({"name": name, "description": NETWORK_DESCRIPTION, "location": "PHX",
            "ipBlocks": [{"id": "b1"}]})
    );
}

#[test]
fn a_lost_answer_is_an_unknown_outcome_and_the_post_is_not_repeated() {
    let (errors, sent) = run(
        vec![
            step(
                &format!("POST {PRIVATE}"),
                Reply::json(502, json!({"message": "bad gateway"})),
            ),
            step(&format!("POST {PUBLIC}"), Reply::dropped()),
            step(
                &format!("POST {BLOCKS}"),
                Reply::json(503, json!({"message": "unavailable"})),
            ),
        ],
        |p| {
            [
                create_private_network(p, "PHX", TAG, "10.0.0.0/24", None).unwrap_err(),
                create_public_network(p, "PHX", TAG, None, "b1").unwrap_err(),
                create_block(p, "PHX", 29, TAG).unwrap_err(),
            ]
        },
    );
    for e in &errors {
        assert!(e.outcome_unknown, "{e:?}");
        assert_eq!(e.error.reason(), "PnapOutcomeUnknown", "{e:?}");
        assert_eq!(e.error.kind(), ErrorKind::Transient);
    }
    assert_eq!(sent.len(), 3, "no POST repeated: {:?}", lines(&sent));
}

#[test]
fn a_refusal_under_a_taken_name_is_an_unknown_outcome_and_another_is_not() {
    let refused = || {
        Reply::json(
            400,
            json!({"message": "Validation failed", "validationErrors": ["name taken"]}),
        )
    };
    let (errors, sent) = run(
        vec![
            step(&format!("POST {PRIVATE}"), refused()),
            step(
                &format!("GET {PRIVATE}?location=PHX"),
                Reply::json(
                    200,
                    json!([private("n1", TAG, 10, "PHX", "2025-01-01T00:00:00Z")]),
                ),
            ),
            step(&format!("POST {PRIVATE}"), refused()),
            // Taken by a network someone else named alike: a refusal.
            step(
                &format!("GET {PRIVATE}?location=PHX"),
                Reply::json(
                    200,
                    json!([foreign(private(
                        "n0",
                        TAG,
                        10,
                        "PHX",
                        "2025-01-01T00:00:00Z"
                    ))]),
                ),
            ),
        ],
        |p| {
            [
                create_private_network(p, "PHX", TAG, "10.0.0.0/24", None).unwrap_err(),
                create_private_network(p, "PHX", TAG, "10.1.0.0/24", None).unwrap_err(),
            ]
        },
    );
    assert!(errors[0].outcome_unknown, "{:?}", errors[0]);
    assert!(!errors[1].outcome_unknown, "{:?}", errors[1]);
    assert_eq!(errors[1].error.reason(), "PnapRefused");
    assert_eq!(errors[1].error.status(), 409);
    assert!(
        errors[1].error.detail().unwrap().contains("name taken"),
        "{:?}",
        errors[1]
    );
    assert_eq!(sent.len(), 4);
}

// -- lookups and duplicates --------------------------------------------------------------

#[test]
fn find_keeps_the_oldest_network_and_deletes_the_younger() {
    // The younger has the smaller id: `createdOn` decides, not the id.
    let (found, sent) = run(
        vec![
            step(
                &format!("GET {PRIVATE}?location=PHX"),
                Reply::json(
                    200,
                    json!([
                        private("a-young", TAG, 11, "PHX", "2025-01-01T00:00:30.5Z"),
                        private("other", "another pool", 12, "PHX", "2025-01-01T00:00:00Z"),
                        foreign(private("hand", TAG, 13, "PHX", "2025-01-01T00:00:00Z")),
                        private("z-old", TAG, 10, "PHX", "2025-01-01T00:00:30Z"),
                    ]),
                ),
            ),
            step(&format!("DELETE {PRIVATE}/a-young"), Reply::status(204)),
            step(
                &format!("GET {PUBLIC}?location=PHX"),
                Reply::json(200, json!([])),
            ),
        ],
        |p| {
            (
                find_network(p, NetworkKind::Private, "PHX", TAG).unwrap(),
                find_network(p, NetworkKind::Public, "PHX", TAG).unwrap(),
            )
        },
    );
    assert_eq!(found, (Some("z-old".into()), None));
    assert_eq!(
        lines(&sent),
        [
            "GET /networks/v1/private-networks?location=PHX",
            "DELETE /networks/v1/private-networks/a-young",
            "GET /networks/v1/public-networks?location=PHX"
        ]
    );
}

#[test]
fn find_keeps_the_oldest_block_and_detaches_the_younger_before_deleting_it() {
    let (found, sent) = run(
        vec![
            step(
                &format!("GET {BLOCKS}"),
                Reply::json(
                    200,
                    json!([
                        block("b-old", TAG, "2025-01-01T00:00:00Z", None),
                        block("b-other", "someone else's", "2024-01-01T00:00:00Z", None),
                        block(
                            "b-young",
                            TAG,
                            "2025-01-02T00:00:00Z",
                            Some(("p9", "network"))
                        ),
                    ]),
                ),
            ),
            step(
                &format!("GET {BLOCKS}/b-young"),
                Reply::json(
                    200,
                    block(
                        "b-young",
                        TAG,
                        "2025-01-02T00:00:00Z",
                        Some(("p9", "network")),
                    ),
                ),
            ),
            step(
                &format!("DELETE {PUBLIC}/p9/ip-blocks/b-young"),
                Reply::json(
                    202,
                    json!("The IP block is being removed from the network."),
                ),
            ),
            step(
                &format!("DELETE {BLOCKS}/b-young"),
                Reply::json(200, json!({"result": "deleted", "ipBlockId": "b-young"})),
            ),
        ],
        |p| find_block(p, "PHX", TAG).unwrap(),
    );
    assert_eq!(found.as_deref(), Some("b-old"));
    assert_eq!(
        lines(&sent),
        [
            "GET /ips/v1/ip-blocks",
            "GET /ips/v1/ip-blocks/b-young",
            "DELETE /networks/v1/public-networks/p9/ip-blocks/b-young",
            "DELETE /ips/v1/ip-blocks/b-young"
        ]
    );
}

// -- blocks on networks -------------------------------------------------------------------

#[test]
fn attaching_reads_first_and_an_attached_block_is_done() {
    let attached = json!([{"id": "b1", "cidr": "198.18.0.0/29", "usedIpsCount": "0"}]);
    let (_, sent) = run(
        vec![
            step(
                &format!("GET {PUBLIC}/p1"),
                Reply::json(200, public("p1", TAG, 20, json!([]), json!([]))),
            ),
            step(
                &format!("POST {PUBLIC}/p1/ip-blocks"),
                Reply::json(
                    202,
                    json!({"id": "b1", "cidr": "198.18.0.0/29", "usedIpsCount": "0"}),
                ),
            ),
            step(
                &format!("GET {PUBLIC}/p1"),
                Reply::json(200, public("p1", TAG, 20, attached.clone(), json!([]))),
            ),
            // A refusal re-read: the block is there after all (a lost
            // answer of an earlier attach).
            step(
                &format!("GET {PUBLIC}/p1"),
                Reply::json(200, public("p1", TAG, 20, json!([]), json!([]))),
            ),
            step(
                &format!("POST {PUBLIC}/p1/ip-blocks"),
                Reply::json(409, json!({"message": "IP block b1 is already assigned"})),
            ),
            step(
                &format!("GET {PUBLIC}/p1"),
                Reply::json(200, public("p1", TAG, 20, attached, json!([]))),
            ),
            step(
                &format!("GET {PUBLIC}/gone"),
                Reply::json(404, json!({"message": "not found"})),
            ),
        ],
        |p| {
            attach_block(p, "p1", "b1").unwrap();
            attach_block(p, "p1", "b1").unwrap();
            attach_block(p, "p1", "b1").unwrap();
            let e = attach_block(p, "gone", "b1").unwrap_err();
            assert_eq!((e.status(), e.reason()), (409, "PnapNetworkGone"));
        },
    );
    assert_eq!(sent[1].1, json!({"id": "b1"}));
    assert_eq!(sent.len(), 7);
}

#[test]
fn an_assigned_block_is_detached_before_it_is_deleted_and_a_gone_one_is_false() {
    let (got, sent) = run(
        vec![
            step(
                &format!("GET {BLOCKS}/b1"),
                Reply::json(
                    200,
                    block("b1", TAG, "2025-01-01T00:00:00Z", Some(("p1", "network"))),
                ),
            ),
            step(
                &format!("DELETE {PUBLIC}/p1/ip-blocks/b1"),
                Reply::json(
                    202,
                    json!("The IP block is being removed from the network."),
                ),
            ),
            step(
                &format!("DELETE {BLOCKS}/b1"),
                Reply::json(200, json!({"result": "deleted", "ipBlockId": "b1"})),
            ),
            step(
                &format!("GET {BLOCKS}/b2"),
                Reply::json(404, json!({"message": "not found"})),
            ),
            step(
                &format!("GET {BLOCKS}/b3"),
                Reply::json(
                    200,
                    block("b3", TAG, "2025-01-01T00:00:00Z", Some(("s1", "server"))),
                ),
            ),
        ],
        |p| {
            (
                delete_block(p, "b1").unwrap(),
                delete_block(p, "b2").unwrap(),
                delete_block(p, "b3").unwrap_err().reason(),
            )
        },
    );
    assert_eq!(got, (true, false, "PnapBlockOnServer"));
    assert_eq!(
        lines(&sent)[..3],
        [
            "GET /ips/v1/ip-blocks/b1",
            "DELETE /networks/v1/public-networks/p1/ip-blocks/b1",
            "DELETE /ips/v1/ip-blocks/b1"
        ]
    );
}

// -- ranges, members, deletion ------------------------------------------------------------

#[test]
fn ranges_are_read_and_gone_resources_are_conflicts() {
    let attached = json!([{"id": "b1", "cidr": "198.18.0.8/29", "usedIpsCount": "0"}]);
    let (got, _) = run(
        vec![
            step(
                &format!("GET {PRIVATE}/n1"),
                Reply::json(200, private("n1", TAG, 10, "PHX", "2025-01-01T00:00:00Z")),
            ),
            step(
                &format!("GET {PUBLIC}/p1"),
                Reply::json(200, public("p1", TAG, 20, attached, json!([]))),
            ),
            step(
                &format!("GET {BLOCKS}/b1"),
                Reply::json(200, block("b1", TAG, "2025-01-01T00:00:00Z", None)),
            ),
            step(
                &format!("GET {PRIVATE}/gone"),
                Reply::json(404, json!({"message": "not found"})),
            ),
            step(
                &format!("GET {BLOCKS}/gone"),
                Reply::json(404, json!({"message": "not found"})),
            ),
        ],
        |p| {
            (
                network_cidr(p, NetworkKind::Private, "n1").unwrap(),
                network_cidr(p, NetworkKind::Public, "p1").unwrap(),
                block_cidr(p, "b1").unwrap(),
                network_cidr(p, NetworkKind::Private, "gone")
                    .unwrap_err()
                    .reason(),
                block_cidr(p, "gone").unwrap_err().reason(),
            )
        },
    );
    assert_eq!(
        got,
        (
            ("10.0.0.0".parse().unwrap(), 24),
            ("198.18.0.8".parse().unwrap(), 29),
            ("198.18.0.0".parse().unwrap(), 29),
            "PnapNetworkGone",
            "PnapBlockGone"
        )
    );
}

#[test]
fn members_are_the_servers_and_a_gone_member_is_done() {
    let memberships = json!([
        {"resourceId": "s1", "resourceType": "server", "ips": ["198.18.0.2"]},
        {"resourceId": "v1", "resourceType": "virtual", "ips": []},
    ]);
    let (got, sent) = run(
        vec![
            step(
                &format!("GET {PUBLIC}/p1"),
                Reply::json(200, public("p1", TAG, 20, json!([]), memberships)),
            ),
            step(
                "DELETE /bmc/v1/servers/s1/network-configuration/public-network-configuration/public-networks/p1",
                Reply::json(202, json!("The server is being removed from the network.")),
            ),
            step(
                "DELETE /bmc/v1/servers/gone/network-configuration/private-network-configuration/private-networks/n1",
                Reply::json(404, json!({"message": "Server gone not found"})),
            ),
            step(
                "DELETE /bmc/v1/servers/s2/network-configuration/private-network-configuration/private-networks/n1",
                Reply::json(409, json!({"message": "in progress"})),
            ),
            step(
                &format!("GET {PRIVATE}/n9"),
                Reply::json(404, json!({"message": "not found"})),
            ),
        ],
        |p| {
            let m = members(p, NetworkKind::Public, "p1").unwrap();
            remove_member(p, NetworkKind::Public, "s1", "p1").unwrap();
            remove_member(p, NetworkKind::Private, "gone", "n1").unwrap();
            let busy = remove_member(p, NetworkKind::Private, "s2", "n1").unwrap_err();
            let none = members(p, NetworkKind::Private, "n9").unwrap();
            (m, busy.status(), busy.reason(), none)
        },
    );
    assert_eq!(got, (vec!["s1".to_owned()], 503, "PnapUnavailable", vec![]));
    assert_eq!(sent.len(), 5);
}

#[test]
fn a_network_with_members_is_refused_and_a_gone_one_is_false() {
    let (got, _) = run(
        vec![
            step(
                &format!("DELETE {PUBLIC}/p1"),
                Reply::json(409, json!({"message": "Public network p1 has members"})),
            ),
            step(
                &format!("DELETE {PRIVATE}/n1"),
                Reply::json(404, json!({"message": "not found"})),
            ),
            step(&format!("DELETE {PRIVATE}/n2"), Reply::status(204)),
        ],
        |p| {
            let e = delete_network(p, NetworkKind::Public, "p1").unwrap_err();
            (
                e.status(),
                e.reason(),
                delete_network(p, NetworkKind::Private, "n1").unwrap(),
                delete_network(p, NetworkKind::Private, "n2").unwrap(),
            )
        },
    );
    assert_eq!(got, (409, "PnapRefused", false, true));
}
