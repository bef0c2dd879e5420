//! The phoenixNAP simulator driven by the real core client (`Pnap` over
//! `BlockingHttp`): authentication, each resource's rules, asynchronous
//! memberships and block attachments, the audit log, and every fault,
//! with every request and answer checked against the vendored specs.

use http::Method;
use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::cloud::CloudError;
use metal_ipam_core::pnap::auth::Credentials;
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::pnap::model::{
    IpBlockCreate, PrivateNetworkCreate, PublicNetworkCreate, ServerPrivateNetwork,
    ServerPublicNetwork,
};
use metal_ipam_core::ports::http::HttpClient;
use metal_ipam_core::testing::TestEnv;
use metal_ipam_tests::metal_sim::BlockingHttp;
use metal_ipam_tests::pnap_sim::{
    rfc3339_ms, Fault, MembershipStatus, PnapSim, DEFAULT_START_MS, TOKEN_ROUTE,
};
use serde_json::{json, Value};

const S1: &str = "60473a6115e34466c9f8f083";
const S2: &str = "60473a6115e34466c9f8f084";

type Client<'a> = Pnap<'a, BlockingHttp, TestEnv>;

/// Runs `f` with a fresh client (its own token cache) on a blocking thread.
async fn with<T, F>(cfg: PnapConfig, f: F) -> T
where
    T: Send + 'static,
    F: for<'a> FnOnce(&Client<'a>) -> T + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let (http, env) = (BlockingHttp::new(), TestEnv::at(1_000));
        f(&Pnap::new(&http, &cfg, &env))
    })
    .await
    .expect("the client task")
}

fn cfg(sim: &PnapSim) -> PnapConfig {
    sim.config(RetryPolicy::default())
}

fn assert_clean(sim: &PnapSim) {
    assert_eq!(sim.violations(), Vec::<String>::new(), "request violations");
    assert_eq!(
        sim.answer_violations(),
        Vec::<String>::new(),
        "answer violations"
    );
}

fn private(name: &str, cidr: Option<&str>) -> PrivateNetworkCreate {
    PrivateNetworkCreate {
        name: name.into(),
        description: None,
        location: "PHX".into(),
        vlan_id: None,
        cidr: cidr.map(Into::into),
    }
}

fn join_private(network: &str, ips: &[&str]) -> ServerPrivateNetwork {
    ServerPrivateNetwork {
        id: network.into(),
        ips: ips.iter().map(|s| (*s).to_owned()).collect(),
        dhcp: None,
        status_description: None,
    }
}

fn join_public(network: &str, ips: &[&str]) -> ServerPublicNetwork {
    ServerPublicNetwork {
        id: network.into(),
        ips: ips.iter().map(|s| (*s).to_owned()).collect(),
        status_description: None,
    }
}

fn status_of(r: &Result<impl std::fmt::Debug, CloudError>) -> Option<u16> {
    r.as_ref().err().and_then(CloudError::status)
}

fn messages(e: &CloudError) -> String {
    match e {
        CloudError::Api { messages, .. } => messages.join(" | "),
        other => format!("{other:?}"),
    }
}

fn membership_status(c: &Client<'_>, server: &str, network: &str) -> Option<String> {
    let s = c.server(server).unwrap().expect("the server exists");
    let private = s
        .network_configuration
        .private_network_configuration
        .unwrap_or_default()
        .private_networks;
    let public = s
        .network_configuration
        .public_network_configuration
        .unwrap_or_default()
        .public_networks;
    private
        .into_iter()
        .map(|m| (m.id, m.status_description))
        .chain(public.into_iter().map(|m| (m.id, m.status_description)))
        .find(|(id, _)| id == network)
        .and_then(|(_, s)| s)
}

// -- authentication ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_cached_refreshed_after_expiry_and_bad_credentials_are_refused() {
    let sim = PnapSim::start().await;
    let c = cfg(&sim);
    let n = with(c.clone(), |p| {
        p.private_networks(None).unwrap();
        p.private_networks(Some("PHX")).unwrap().len()
    })
    .await;
    assert_eq!(n, 0);
    assert_eq!(sim.tokens_issued(), 1, "one token for two requests");

    // The token expires on the simulator's clock; the client's clock does
    // not know: a 401, one fresh token, the request again.
    sim.advance(3_600_001);
    let calls = with(c.clone(), |p| {
        p.private_networks(None).unwrap();
        // Reusing this client: its cached token is now expired too.
        p.calls()
    })
    .await;
    assert_eq!(calls, 2, "a token and the request");
    sim.revoke_tokens();
    let calls = with(c.clone(), |p| {
        p.private_networks(None).unwrap();
        p.private_networks(None).unwrap();
        p.calls()
    })
    .await;
    assert_eq!(calls, 3, "token, request, request");
    assert_eq!(sim.tokens_issued(), 3);

    // Bad credentials: 401 invalid_client, an error naming no secret.
    let mut bad = c.clone();
    bad.credentials = Credentials {
        client_id: sim.client_id().into(),
        client_secret: "wrong".into(),
    };
    let err = with(bad, |p| p.private_networks(None)).await.unwrap_err();
    assert_eq!(err.status(), Some(401));
    assert!(messages(&err).contains("invalid_client"), "{err:?}");
    assert!(!format!("{err:?}").contains("wrong"));

    // A request with a token the simulator never issued: 401 {"message"}.
    let url = format!("{}/networks/v1/private-networks", sim.api_url());
    let resp = tokio::task::spawn_blocking(move || {
        let req = http::Request::get(url)
            .header("authorization", "Bearer not-a-token")
            .body(Vec::new())
            .unwrap();
        BlockingHttp::new().send(req).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(resp.status(), 401);
    let body: Value = serde_json::from_slice(resp.body()).unwrap();
    assert!(body["message"].is_string(), "{body}");
    assert_clean(&sim);
}

// -- private networks ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_networks_enforce_names_vlans_ranges_and_members() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    let results = with(cfg(&sim), |p| {
        let a = p.create_private_network(&private("pool a", Some("10.0.0.0/24")));
        let dup_name = p.create_private_network(&private("pool a", Some("10.1.0.0/24")));
        let overlap = p.create_private_network(&private("pool b", Some("10.0.0.128/25")));
        let not_network = p.create_private_network(&private("pool c", Some("10.2.0.1/24")));
        let public_range = p.create_private_network(&private("pool d", Some("8.8.8.0/24")));
        let no_cidr = p.create_private_network(&private("pool e", None));
        let mut elsewhere = private("pool f", Some("10.0.0.0/24"));
        elsewhere.location = "ASH".into();
        let other_location = p.create_private_network(&elsewhere);
        let mut vlan = private("pool g", Some("10.3.0.0/24"));
        vlan.vlan_id = Some(100);
        let vlan_taken = p.create_private_network(&vlan);
        let mut mars = private("pool h", Some("10.4.0.0/24"));
        mars.location = "MARS".into();
        let bad_location = p.create_private_network(&mars);
        (
            a,
            [
                status_of(&dup_name),
                status_of(&overlap),
                status_of(&not_network),
                status_of(&public_range),
                status_of(&no_cidr),
                status_of(&vlan_taken),
                status_of(&bad_location),
            ],
            other_location,
            p.private_networks(Some("ASH")).unwrap().len(),
        )
    })
    .await;
    let (a, refused, other, in_ash) = results;
    let a = a.unwrap();
    assert_eq!((a.status.as_str(), a.vlan_id), ("READY", 100));
    assert_eq!(a.cidr.as_deref(), Some("10.0.0.0/24"));
    assert_eq!(refused, [Some(400); 7]);
    assert_eq!(other.unwrap().vlan_id, 100, "VLANs are per location");
    assert_eq!(in_ash, 1);

    // A member blocks the delete; once it has left, the delete goes.
    let id = a.id.clone();
    let (refused, message, after_leave, gone, again) = with(cfg(&sim), move |p| {
        p.join_private_network(S1, &join_private(&id, &["10.0.0.10"]))
            .unwrap();
        let refused = p.delete_private_network(&id).unwrap_err();
        p.leave_private_network(S1, &id).unwrap();
        let still = p.delete_private_network(&id).map_err(|e| e.status());
        p.server(S1).unwrap();
        let gone = p.delete_private_network(&id).unwrap();
        let again = p.delete_private_network(&id).unwrap();
        (refused.status(), messages(&refused), still, gone, again)
    })
    .await;
    assert_eq!(refused, Some(400));
    assert!(message.contains("has members"), "{message}");
    assert_eq!(after_leave, Err(Some(400)), "leaving takes a read");
    assert!(gone);
    assert!(!again, "a second delete finds nothing (404)");
    assert_clean(&sim);
}

// -- memberships -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_memberships_check_ips_and_settle_over_reads() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    sim.add_server("60473a6115e34466c9f8f085", "node-3", "ASH");
    let net = with(cfg(&sim), |p| {
        p.create_private_network(&private("pool a", Some("10.0.0.0/24")))
            .unwrap()
    })
    .await;
    let id = net.id.clone();
    let out = with(cfg(&sim), move |p| {
        let joined = p
            .join_private_network(
                S1,
                &join_private(&id, &["10.0.0.10", "10.0.0.20 - 10.0.0.21"]),
            )
            .unwrap();
        let read1 = membership_status(p, S1, &id);
        let read2 = membership_status(p, S1, &id);
        let taken = p.join_private_network(S2, &join_private(&id, &["10.0.0.21"]));
        let outside = p.join_private_network(S2, &join_private(&id, &["10.0.1.5"]));
        let broadcast = p.join_private_network(S2, &join_private(&id, &["10.0.0.255"]));
        let twice = p.join_private_network(S1, &join_private(&id, &["10.0.0.30"]));
        let other_location = p.join_private_network(
            "60473a6115e34466c9f8f085",
            &join_private(&id, &["10.0.0.40"]),
        );
        let no_server = p.join_private_network("60473a6115e34466c9f8f0ff", &join_private(&id, &[]));
        // No ips: the next free address.
        let next = p.join_private_network(S2, &join_private(&id, &[])).unwrap();
        let network = p.private_network(&id).unwrap().unwrap();
        (
            joined,
            read1,
            read2,
            [
                status_of(&taken),
                status_of(&outside),
                status_of(&broadcast),
                status_of(&twice),
                status_of(&other_location),
            ],
            status_of(&no_server),
            next,
            network,
        )
    })
    .await;
    let (joined, read1, read2, refused, no_server, next, network) = out;
    assert_eq!(joined.status_description.as_deref(), Some("in-progress"));
    assert_eq!(read1.as_deref(), Some("in-progress"), "first read");
    assert_eq!(read2.as_deref(), Some("assigned"), "second read");
    assert_eq!(refused, [Some(400); 5]);
    assert_eq!(no_server, Some(404));
    assert_eq!(next.ips, ["10.0.0.1"]);
    assert_eq!(network.status, "BUSY", "node-2 is still joining");
    assert_eq!(network.memberships.len(), 2);
    sim.settle();
    let s1 = sim
        .memberships()
        .into_iter()
        .find(|m| m.server_id == S1)
        .unwrap();
    assert_eq!(s1.addresses.len(), 3);
    assert_eq!(s1.status, MembershipStatus::Assigned);

    // The server lists the assigned IPs; a server being deleted cannot join.
    let server = with(cfg(&sim), |p| p.server(S1).unwrap().unwrap()).await;
    assert_eq!(
        server.private_ip_addresses,
        ["10.0.0.10", "10.0.0.20", "10.0.0.21"]
    );
    sim.set_server_status(S2, "deleting");
    let id = net.id.clone();
    let refused = with(cfg(&sim), move |p| p.leave_private_network(S2, &id)).await;
    assert!(refused.unwrap(), "leaving is allowed whatever the status");
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_blocks_attach_asynchronously_and_public_memberships_use_them() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    let out = with(cfg(&sim), |p| {
        let block = p
            .create_ip_block(&IpBlockCreate {
                location: "PHX".into(),
                cidr_block_size: "/29".into(),
                description: Some("metal-ipam pool x".into()),
            })
            .unwrap();
        let too_big = p.create_ip_block(&IpBlockCreate {
            location: "PHX".into(),
            cidr_block_size: "/24".into(),
            description: None,
        });
        let net = p
            .create_public_network(&PublicNetworkCreate {
                name: "public a".into(),
                description: None,
                location: "PHX".into(),
                vlan_id: None,
                ip_blocks: Vec::new(),
            })
            .unwrap();
        let attached = p.attach_ip_block(&net.id, &block.id).unwrap();
        let again = p.attach_ip_block(&net.id, &block.id);
        // Not usable before the attachment is done.
        let early = p.join_public_network(S1, &join_public(&net.id, &["198.18.0.2"]));
        // The read the attachment takes (it answers `assigning`), then done.
        let block_then = p.ip_block(&block.id).unwrap().unwrap();
        let block_now = p.ip_block(&block.id).unwrap().unwrap();
        let gateway = p.join_public_network(S1, &join_public(&net.id, &["198.18.0.1"]));
        let outside = p.join_public_network(S1, &join_public(&net.id, &["198.18.0.9"]));
        let none = p.join_public_network(S1, &join_public(&net.id, &[]));
        let joined = p
            .join_public_network(S1, &join_public(&net.id, &["198.18.0.2"]))
            .unwrap();
        let taken = p.join_public_network(S2, &join_public(&net.id, &["198.18.0.2"]));
        let delete_assigned = p.delete_ip_block(&block.id);
        let detach_used = p.detach_ip_block(&net.id, &block.id);
        let network = p.public_network(&net.id).unwrap().unwrap();
        (
            block,
            status_of(&too_big),
            attached,
            status_of(&again),
            block_then.status,
            status_of(&early),
            block_now,
            [status_of(&gateway), status_of(&outside), status_of(&none)],
            joined,
            status_of(&taken),
            status_of(&delete_assigned),
            status_of(&detach_used),
            network,
        )
    })
    .await;
    let (
        block,
        too_big,
        attached,
        again,
        then,
        early,
        now,
        refused,
        joined,
        taken,
        del,
        detach,
        network,
    ) = out;
    assert!(block.cidr.starts_with("198.18."), "{}", block.cidr);
    assert_eq!((block.status.as_str(), too_big), ("unassigned", Some(400)));
    assert_eq!(attached.cidr, block.cidr);
    assert_eq!(again, Some(409));
    assert_eq!((then.as_str(), early), ("assigning", Some(400)));
    assert_eq!(now.status, "assigned");
    assert_eq!(
        now.assigned_resource_id.as_deref(),
        Some(network.id.as_str())
    );
    assert_eq!(refused, [Some(400); 3]);
    assert_eq!(joined.status_description.as_deref(), Some("in-progress"));
    assert_eq!((taken, del, detach), (Some(400), Some(400), Some(409)));
    assert_eq!(network.ip_blocks.len(), 1);
    assert_eq!(network.memberships[0].ips, ["198.18.0.2"]);

    // Leave, detach, delete: nothing left behind.
    let (net, blk) = (network.id.clone(), block.id.clone());
    let left = with(cfg(&sim), move |p| {
        p.leave_public_network(S1, &net).unwrap();
        let busy = p.delete_public_network(&net).map_err(|e| e.status());
        p.server(S1).unwrap();
        let detached = p.detach_ip_block(&net, &blk).unwrap();
        let block_deleted = p.delete_ip_block(&blk).unwrap();
        let net_deleted = p.delete_public_network(&net).unwrap();
        (busy, detached, block_deleted, net_deleted)
    })
    .await;
    assert_eq!(left, (Err(Some(400)), true, true, true));
    assert!(sim.ip_blocks().is_empty() && sim.public_networks().is_empty());
    assert!(sim.memberships().is_empty());
    assert_clean(&sim);
}

fn strings(ips: &[&str]) -> Vec<String> {
    ips.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_patches_replace_the_ips_of_an_assigned_membership_by_the_join_rules() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    let net = with(cfg(&sim), |p| {
        p.create_private_network(&private("pool a", Some("10.0.0.0/24")))
            .unwrap()
    })
    .await;
    let id = net.id.clone();
    let (in_progress, refused, not_member, no_server) = with(cfg(&sim), move |p| {
        p.join_private_network(S1, &join_private(&id, &["10.0.0.10"]))
            .unwrap();
        // Still joining: its IPs cannot be updated yet.
        let in_progress = p.update_private_ips(S1, &id, &strings(&["10.0.0.11"]));
        p.join_private_network(S2, &join_private(&id, &["10.0.0.20"]))
            .unwrap();
        p.server(S1).unwrap();
        p.server(S2).unwrap();
        let refused = [
            &[][..],
            &["10.0.0.20"][..],
            &["10.0.1.5"][..],
            &["10.0.0.0"][..],
            &["10.0.0.255"][..],
            &["10.0.0.11", "10.0.0.11"][..],
            &["not an ip"][..],
        ]
        .map(|ips| status_of(&p.update_private_ips(S1, &id, &strings(ips))));
        let not_member =
            p.update_private_ips(S1, "60473a6115e34466c9f8f0aa", &strings(&["10.0.0.12"]));
        let no_server =
            p.update_private_ips("60473a6115e34466c9f8f0ff", &id, &strings(&["10.0.0.12"]));
        (
            status_of(&in_progress),
            refused,
            status_of(&not_member),
            status_of(&no_server),
        )
    })
    .await;
    assert_eq!(in_progress, Some(409));
    assert_eq!(refused, [Some(400); 7]);
    assert_eq!((not_member, no_server), (Some(404), Some(404)));
    let events_before = sim.events().len();

    // Adding an IP keeps the membership assigned, at once (no reads).
    let id = net.id.clone();
    let (added, server, moved, s2) = with(cfg(&sim), move |p| {
        let added = p
            .update_private_ips(S1, &id, &strings(&["10.0.0.10", "10.0.0.11"]))
            .unwrap();
        let server = p.server(S1).unwrap().unwrap();
        // The server's own IPs count as free; the one it drops is free for
        // another server.
        p.update_private_ips(S1, &id, &strings(&["10.0.0.11", "10.0.0.30 - 10.0.0.31"]))
            .unwrap();
        let moved = p
            .update_private_ips(S2, &id, &strings(&["10.0.0.20", "10.0.0.10"]))
            .unwrap();
        let s2 = p.server(S2).unwrap().unwrap();
        (added, server, moved, s2)
    })
    .await;
    assert_eq!(added.ips, ["10.0.0.10", "10.0.0.11"]);
    assert_eq!(added.status_description.as_deref(), Some("assigned"));
    assert_eq!(added.dhcp, Some(false));
    assert_eq!(server.private_ip_addresses, ["10.0.0.10", "10.0.0.11"]);
    assert_eq!(
        server
            .network_configuration
            .private_network_configuration
            .unwrap()
            .private_networks[0]
            .status_description
            .as_deref(),
        Some("assigned")
    );
    assert_eq!(moved.ips, ["10.0.0.20", "10.0.0.10"]);
    assert_eq!(s2.private_ip_addresses, ["10.0.0.20", "10.0.0.10"]);
    let s1 = sim
        .memberships()
        .into_iter()
        .find(|m| m.server_id == S1)
        .unwrap();
    assert_eq!(s1.addresses.len(), 3, "10.0.0.11 and the range of two");

    // Public: IPs of an assigned block of the network, not its gateway.
    let (block_net, refused, added, ranged) = with(cfg(&sim), |p| {
        let block = p
            .create_ip_block(&IpBlockCreate {
                location: "PHX".into(),
                cidr_block_size: "/29".into(),
                description: None,
            })
            .unwrap();
        let net = p
            .create_public_network(&PublicNetworkCreate {
                name: "public a".into(),
                description: None,
                location: "PHX".into(),
                vlan_id: None,
                ip_blocks: Vec::new(),
            })
            .unwrap();
        p.attach_ip_block(&net.id, &block.id).unwrap();
        p.public_network(&net.id).unwrap();
        p.join_public_network(S1, &join_public(&net.id, &["198.18.0.2"]))
            .unwrap();
        p.join_public_network(S2, &join_public(&net.id, &["198.18.0.6"]))
            .unwrap();
        p.server(S1).unwrap();
        p.server(S2).unwrap();
        let refused = [
            &[][..],
            &["198.18.0.1"][..],
            &["198.18.0.7"][..],
            &["198.18.0.9"][..],
            &["198.18.0.6"][..],
        ]
        .map(|ips| status_of(&p.update_public_ips(S1, &net.id, &strings(ips))));
        let added = p
            .update_public_ips(S1, &net.id, &strings(&["198.18.0.2", "198.18.0.3"]))
            .unwrap();
        let ranged = p
            .update_public_ips(S1, &net.id, &strings(&["198.18.0.2 - 198.18.0.4"]))
            .unwrap();
        (net.id, refused, added, ranged)
    })
    .await;
    assert_eq!(refused, [Some(400); 5]);
    assert_eq!(added.ips, ["198.18.0.2", "198.18.0.3"]);
    assert_eq!(added.status_description.as_deref(), Some("assigned"));
    assert_eq!(ranged.ips, ["198.18.0.2 - 198.18.0.4"]);
    let s1 = sim
        .memberships()
        .into_iter()
        .find(|m| m.server_id == S1 && m.network_id == block_net)
        .unwrap();
    assert_eq!(s1.addresses.len(), 3);
    assert_eq!(s1.status, MembershipStatus::Assigned);

    // Leaving: no update meanwhile.
    let net = block_net.clone();
    let leaving = with(cfg(&sim), move |p| {
        p.leave_public_network(S2, &net).unwrap();
        p.update_public_ips(S2, &net, &strings(&["198.18.0.5"]))
    })
    .await;
    assert_eq!(status_of(&leaving), Some(409));

    // Each applied PATCH is in the log; refused ones are not.
    let names: Vec<String> = sim.events()[events_before..]
        .iter()
        .map(|e| e.name.clone())
        .collect();
    let count = |n: &str| names.iter().filter(|x| *x == n).count();
    assert_eq!(count("API.UpdateServerPrivateNetwork"), 3);
    assert_eq!(count("API.UpdateServerPublicNetwork"), 2);
    let patch = sim
        .events()
        .into_iter()
        .find(|e| e.name == "API.UpdateServerPublicNetwork")
        .unwrap();
    assert_eq!(patch.verb, "PATCH");
    assert!(patch
        .uri
        .ends_with(&format!("/public-networks/{block_net}")));
    assert_clean(&sim);
}

// -- audit log -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_records_every_write_on_the_simulators_clock() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    let id = with(cfg(&sim), |p| {
        p.create_private_network(&private("pool a", Some("10.0.0.0/24")))
            .unwrap()
            .id
    })
    .await;
    sim.advance(1_000);
    let id2 = id.clone();
    with(cfg(&sim), move |p| {
        p.join_private_network(S1, &join_private(&id2, &["10.0.0.5"]))
            .unwrap();
        // Refused writes and reads record nothing.
        p.create_private_network(&private("pool a", Some("10.9.0.0/24")))
            .unwrap_err();
        p.private_networks(None).unwrap();
    })
    .await;
    sim.advance(1_000);
    sim.delete_server(S1);
    let events = sim.events();
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "API.CreatePrivateNetwork",
            "API.AddServerPrivateNetwork",
            "API.DeleteServer"
        ]
    );
    assert_eq!(events[0].timestamp, rfc3339_ms(DEFAULT_START_MS));
    assert_eq!(events[2].timestamp, rfc3339_ms(DEFAULT_START_MS + 2_000));

    let from = rfc3339_ms(DEFAULT_START_MS + 1_000);
    let get = |q: Vec<(&'static str, String)>| {
        let c = cfg(&sim);
        with(c, move |p| {
            let (status, body) = p.send(Method::GET, "/audit/v1/events", &q, None).unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            let names: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["name"].as_str().unwrap().to_owned())
                .collect();
            (status, names)
        })
    };
    let (_, since) = get(vec![("from", from.clone())]).await;
    assert_eq!(since, ["API.AddServerPrivateNetwork", "API.DeleteServer"]);
    let (_, until) = get(vec![("to", from.clone())]).await;
    assert_eq!(
        until,
        ["API.CreatePrivateNetwork", "API.AddServerPrivateNetwork"]
    );
    let (_, desc) = get(vec![("order", "DESC".into()), ("limit", "1".into())]).await;
    assert_eq!(desc, ["API.DeleteServer"]);
    let (_, deletes) = get(vec![("verb", "DELETE".into())]).await;
    assert_eq!(deletes, ["API.DeleteServer"]);
    let (_, by_uri) = get(vec![("uri", "/networks/v1/private-networks".into())]).await;
    assert_eq!(by_uri, ["API.CreatePrivateNetwork"]);
    let (_, nobody) = get(vec![("username", "someone-else".into())]).await;
    assert!(nobody.is_empty());

    // The client's poll: a truncated (206) answer reads like a 200.
    sim.set_events_cap(Some(2));
    let (status, capped) = get(vec![]).await;
    assert_eq!((status, capped.len()), (206, 2));
    sim.set_events_cap(Some(1));
    let polled = with(cfg(&sim), move |p| p.events(&from).unwrap()).await;
    assert_eq!(polled.len(), 1);
    assert_eq!(
        polled[0].name.as_deref(),
        Some("API.AddServerPrivateNetwork")
    );
    assert_clean(&sim);
}

// -- faults ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_xx_before_the_write_is_retried_only_where_repeating_is_safe() {
    let sim = PnapSim::start().await;
    sim.inject("POST", "privateNetworksPost", Fault::Status(503), 1);
    let err = with(cfg(&sim), |p| {
        p.create_private_network(&private("pool a", Some("10.0.0.0/24")))
    })
    .await
    .unwrap_err();
    assert!(matches!(err, CloudError::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(
        sim.count("privateNetworksPost"),
        1,
        "a POST is not repeated"
    );
    assert!(sim.private_networks().is_empty(), "nothing was applied");

    let net = with(cfg(&sim), |p| {
        p.create_private_network(&private("pool a", Some("10.0.0.0/24")))
            .unwrap()
    })
    .await;
    sim.inject(
        "DELETE",
        "/private-networks/{privateNetworkId}",
        Fault::Status(500),
        2,
    );
    let deleted = with(cfg(&sim), move |p| p.delete_private_network(&net.id)).await;
    assert!(deleted.unwrap());
    assert_eq!(sim.count("privateNetworksNetworkIdDelete"), 3);
    assert_eq!(sim.applied("privateNetworksNetworkIdDelete"), 1);

    // The token endpoint too: a 503 there is retried.
    let tokens = sim.count(TOKEN_ROUTE);
    sim.inject("POST", TOKEN_ROUTE, Fault::Status(503), 1);
    with(cfg(&sim), |p| p.ip_blocks().unwrap()).await;
    assert_eq!(sim.count(TOKEN_ROUTE), tokens + 2, "the 503, then a token");
    assert_eq!(sim.applied(TOKEN_ROUTE), tokens + 1);
    assert_eq!(sim.pending_faults(), 0);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_applied_without_a_heard_answer_is_found_by_a_lookup() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    // 5xx after the write: applied, the client hears a failure.
    sim.inject("POST", "privateNetworksPost", Fault::StatusAfter(502), 1);
    let err = with(cfg(&sim), |p| {
        p.create_private_network(&private("pool a", Some("10.0.0.0/24")))
    })
    .await
    .unwrap_err();
    assert!(matches!(err, CloudError::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(sim.applied("privateNetworksPost"), 1);
    let found = with(cfg(&sim), |p| {
        p.private_networks(Some("PHX"))
            .unwrap()
            .into_iter()
            .find(|n| n.name == "pool a")
    })
    .await
    .expect("the lost create is found by its name");

    // Dropped answer after the write: the join took effect.
    sim.inject(
        "POST",
        "serversServerIdPrivateNetworksPost",
        Fault::CrashAfter,
        1,
    );
    let id = found.id.clone();
    let (err, status) = with(cfg(&sim), move |p| {
        let err = p
            .join_private_network(S1, &join_private(&id, &["10.0.0.7"]))
            .unwrap_err();
        (err, membership_status(p, S1, &id))
    })
    .await;
    assert!(matches!(err, CloudError::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(status.as_deref(), Some("in-progress"));
    assert_eq!(sim.count("serversServerIdPrivateNetworksPost"), 1);

    // Dropped before the write, on a read: retried, applied once.
    sim.inject("GET", "serversServerIdGet", Fault::Drop, 1);
    let server = with(cfg(&sim), |p| p.server(S1).unwrap()).await;
    assert!(server.is_some());
    assert_eq!(
        (
            sim.count("serversServerIdGet"),
            sim.applied("serversServerIdGet")
        ),
        (3, 2)
    );
    assert_eq!(sim.events().len(), 2, "both applied writes are in the log");
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_and_slow_answers_are_waited_out() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.inject(
        "GET",
        "/servers/{serverId}",
        Fault::RateLimit { retry_after_s: 3 },
        1,
    );
    let c = cfg(&sim);
    let (found, slept) = tokio::task::spawn_blocking(move || {
        let (http, env) = (BlockingHttp::new(), TestEnv::at(1_000));
        let found = Pnap::new(&http, &c, &env).server(S1).unwrap().is_some();
        (found, env.slept_ms())
    })
    .await
    .unwrap();
    assert!(found);
    assert_eq!(slept, [3_000], "the client waited what Retry-After asked");
    let rec = sim.requests();
    let limited = rec.iter().find(|r| r.status == Some(429)).unwrap();
    assert_eq!(limited.fault, Some(Fault::RateLimit { retry_after_s: 3 }));

    // An answer slower than the client's timeout: the GET is sent again.
    sim.inject("GET", "serversGet", Fault::Latency(2_500), 1);
    let c = cfg(&sim);
    let n = tokio::task::spawn_blocking(move || {
        let http = BlockingHttp::with_timeout(std::time::Duration::from_millis(1_000));
        let env = TestEnv::at(1_000);
        let p = Pnap::new(&http, &c, &env);
        p.send(Method::GET, "/bmc/v1/servers", &[], None)
            .map(|(s, _)| s)
    })
    .await
    .unwrap();
    assert_eq!(n.unwrap(), 200);
    assert_eq!(sim.count("serversGet"), 2);
    // A slow answer within the timeout is simply slow.
    sim.inject("GET", "serversGet", Fault::Latency(50), 1);
    with(cfg(&sim), |p| {
        p.send(Method::GET, "/bmc/v1/servers", &[], None).unwrap()
    })
    .await;
    assert_eq!(sim.count("serversGet"), 3);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_deleted_mid_step_takes_its_memberships_with_it() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    let net = with(cfg(&sim), |p| {
        p.create_private_network(&private("pool a", Some("10.0.0.0/24")))
            .unwrap()
    })
    .await;
    // Deleted just before the join: the step meets a 404.
    sim.inject(
        "POST",
        "serversServerIdPrivateNetworksPost",
        Fault::DeleteServerBefore(S1.into()),
        1,
    );
    // Deleted just after the join was accepted: the 202 is heard, but the
    // server and its membership are gone.
    sim.inject(
        "POST",
        "serversServerIdPrivateNetworksPost",
        Fault::DeleteServerAfter(S2.into()),
        1,
    );
    let id = net.id.clone();
    let (before, after, s2, network) = with(cfg(&sim), move |p| {
        let before = p.join_private_network(S1, &join_private(&id, &["10.0.0.5"]));
        let after = p.join_private_network(S2, &join_private(&id, &["10.0.0.6"]));
        let s2 = p.server(S2).unwrap();
        let network = p.private_network(&id).unwrap().unwrap();
        (status_of(&before), after, s2, network)
    })
    .await;
    assert_eq!(before, Some(404));
    assert_eq!(
        after.unwrap().status_description.as_deref(),
        Some("in-progress")
    );
    assert!(s2.is_none());
    assert!(network.memberships.is_empty());
    assert!(sim.servers().is_empty() && sim.memberships().is_empty());
    let deletes = sim
        .events()
        .iter()
        .filter(|e| e.name == "API.DeleteServer")
        .count();
    assert_eq!(deletes, 2);
    // The address is free again, and the network can go.
    let id = net.id.clone();
    assert!(with(cfg(&sim), move |p| p.delete_private_network(&id))
        .await
        .unwrap());
    assert_clean(&sim);
}

// -- the spec check itself ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_break_the_specs_are_refused_and_recorded() {
    let sim = PnapSim::start().await;
    let out = with(cfg(&sim), |p| {
        let unknown_field = p.send(
            Method::POST,
            "/networks/v1/private-networks",
            &[],
            Some(&json!({ "name": "pool a", "location": "PHX", "cidr": "10.0.0.0/24", "vlan": 5 })),
        );
        let bad_type = p.send(
            Method::POST,
            "/ips/v1/ip-blocks",
            &[],
            Some(&json!({ "location": "PHX", "cidrBlockSize": 29 })),
        );
        let bad_query = p.send(
            Method::GET,
            "/audit/v1/events",
            &[("since", "x".into())],
            None,
        );
        let bad_date = p.send(
            Method::GET,
            "/audit/v1/events",
            &[("from", "yesterday".into())],
            None,
        );
        let no_path = p.send(Method::GET, "/networks/v1/vrfs", &[], None);
        let not_emulated = p.send(Method::GET, "/bmc/v1/ssh-keys", &[], None);
        [
            unknown_field.map(|r| r.0).map_err(|e| e.status()),
            bad_type.map(|r| r.0).map_err(|e| e.status()),
            bad_query.map(|r| r.0).map_err(|e| e.status()),
            bad_date.map(|r| r.0).map_err(|e| e.status()),
            no_path.map(|r| r.0).map_err(|e| e.status()),
        ]
        .into_iter()
        .chain([not_emulated.map(|r| r.0).map_err(|_| None)])
        .collect::<Vec<_>>()
    })
    .await;
    assert_eq!(
        out,
        [
            Err(Some(400)),
            Err(Some(400)),
            Err(Some(400)),
            Err(Some(400)),
            Err(Some(404)),
            Err(None),
        ]
    );
    // A GET answered 501 is retried as any 5xx; each answer was the 501.
    let ssh: Vec<Option<u16>> = sim
        .requests()
        .iter()
        .filter(|r| r.path == "/bmc/v1/ssh-keys")
        .map(|r| r.status)
        .collect();
    assert!(
        !ssh.is_empty() && ssh.iter().all(|s| *s == Some(501)),
        "{ssh:?}"
    );
    let v = sim.violations();
    assert_eq!(v.len(), 5, "{v:#?}");
    assert!(v[0].contains("vlan"), "{}", v[0]);
    assert!(sim.private_networks().is_empty() && sim.ip_blocks().is_empty());
    assert!(sim.events().is_empty(), "refused writes are not in the log");
    assert_eq!(sim.answer_violations(), Vec::<String>::new());
}

// -- names, descriptions, creation times, members and blocks as pools read them ------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_follow_the_spec_s_pattern_and_are_unique_unless_allowed_twice() {
    let sim = PnapSim::start().await;
    let out = with(cfg(&sim), |p| {
        let underscore = p.create_private_network(&private("pool_a", Some("10.0.0.0/24")));
        let long = p.create_private_network(&private(&"a".repeat(101), Some("10.0.0.0/24")));
        let digits = p.create_private_network(&private("1234", Some("10.0.0.0/24")));
        let description = p.create_ip_block(&IpBlockCreate {
            location: "PHX".into(),
            cidr_block_size: "/29".into(),
            description: Some("d".repeat(251)),
        });
        [
            status_of(&underscore),
            status_of(&long),
            status_of(&digits),
            status_of(&description),
        ]
    })
    .await;
    assert_eq!(out, [Some(400); 4]);
    let v = sim.violations();
    assert_eq!(v.len(), 4, "{v:#?}");
    assert!(sim.private_networks().is_empty() && sim.ip_blocks().is_empty());

    // A fresh simulator: names taken twice only when allowed, each network
    // with its description and creation time.
    let sim = PnapSim::start().await;
    let first_at = sim.now_ms();
    let (first, refused) = with(cfg(&sim), |p| {
        let mut a = private("metal-ipam-ns-pool-1a2b3c4d", Some("10.0.0.0/24"));
        a.description = Some("made by a test".into());
        let first = p.create_private_network(&a).unwrap();
        a.cidr = Some("10.1.0.0/24".into());
        (first, status_of(&p.create_private_network(&a)))
    })
    .await;
    assert_eq!(refused, Some(400));
    sim.advance(1_500);
    sim.allow_duplicate_names(true);
    let (second, listed) = with(cfg(&sim), |p| {
        let mut a = private("metal-ipam-ns-pool-1a2b3c4d", Some("10.1.0.0/24"));
        a.description = Some("made by a test".into());
        let second = p.create_private_network(&a).unwrap();
        let public = PublicNetworkCreate {
            name: "twice".into(),
            description: None,
            location: "PHX".into(),
            vlan_id: None,
            ip_blocks: Vec::new(),
        };
        p.create_public_network(&public).unwrap();
        p.create_public_network(&public).unwrap();
        (second, p.private_networks(Some("PHX")).unwrap())
    })
    .await;
    assert_eq!(first.created_on, Some(rfc3339_ms(first_at)));
    assert_eq!(second.created_on, Some(rfc3339_ms(first_at + 1_500)));
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|n| n.name == first.name));
    assert_eq!(sim.public_networks().len(), 2);
    let kept = sim.private_networks();
    assert_eq!(kept[0].description.as_deref(), Some("made by a test"));
    sim.allow_duplicate_names(false);
    let third = with(cfg(&sim), |p| {
        status_of(
            &p.create_private_network(&private("metal-ipam-ns-pool-1a2b3c4d", Some("10.2.0.0/24"))),
        )
    })
    .await;
    assert_eq!(third, Some(400));
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networks_list_members_in_every_state_and_blocks_name_their_network() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    let created_at = rfc3339_ms(sim.now_ms());
    let (private_id, public_id, block_id, read) = with(cfg(&sim), |p| {
        let n = p
            .create_private_network(&private("pool a", Some("10.0.0.0/24")))
            .unwrap();
        let b = p
            .create_ip_block(&IpBlockCreate {
                location: "PHX".into(),
                cidr_block_size: "/29".into(),
                description: Some("metal-ipam-ns-pool-1a2b3c4d".into()),
            })
            .unwrap();
        let pubnet = p
            .create_public_network(&PublicNetworkCreate {
                name: "public a".into(),
                description: None,
                location: "PHX".into(),
                vlan_id: None,
                ip_blocks: vec![metal_ipam_core::pnap::model::PublicNetworkIpBlockCreate {
                    id: b.id.clone(),
                }],
            })
            .unwrap();
        let read = p.ip_block(&b.id).unwrap().unwrap();
        (n.id, pubnet.id, b.id, read)
    })
    .await;
    assert_eq!(
        read.assigned_resource_id.as_deref(),
        Some(public_id.as_str())
    );
    assert_eq!(read.assigned_resource_type.as_deref(), Some("network"));
    assert_eq!(read.created_on.as_deref(), Some(created_at.as_str()));
    assert_eq!(
        read.description.as_deref(),
        Some("metal-ipam-ns-pool-1a2b3c4d")
    );
    sim.settle();

    // Joining, assigned and leaving members are all listed.
    let (pn, pu) = (private_id.clone(), public_id.clone());
    let states = with(cfg(&sim), move |p| {
        let members = |p: &Client<'_>| -> (Vec<String>, Vec<String>) {
            let ids = |m: Vec<metal_ipam_core::pnap::model::NetworkMembership>| {
                m.into_iter().map(|m| m.resource_id).collect::<Vec<_>>()
            };
            (
                ids(p.private_network(&pn).unwrap().unwrap().memberships),
                ids(p.public_network(&pu).unwrap().unwrap().memberships),
            )
        };
        p.join_private_network(S1, &join_private(&pn, &["10.0.0.10"]))
            .unwrap();
        p.join_public_network(S2, &join_public(&pu, &["198.18.0.2"]))
            .unwrap();
        let joining = members(p);
        p.server(S1).unwrap();
        p.server(S2).unwrap();
        let assigned = members(p);
        p.leave_private_network(S1, &pn).unwrap();
        let leaving = members(p);
        p.server(S1).unwrap();
        let left = members(p);
        (joining, assigned, leaving, left)
    })
    .await;
    let both = (vec![S1.to_owned()], vec![S2.to_owned()]);
    assert_eq!(states.0, both, "joining");
    assert_eq!(states.1, both, "assigned");
    assert_eq!(states.2, both, "leaving");
    assert_eq!(states.3, (vec![], vec![S2.to_owned()]), "left");

    // Detached, the block names no network; a deleted public network frees
    // its blocks without deleting them.
    let (pu, b) = (public_id.clone(), block_id.clone());
    let (detach_refused, detached, reattached, freed) = with(cfg(&sim), move |p| {
        let refused = status_of(&p.detach_ip_block(&pu, &b));
        p.leave_public_network(S2, &pu).unwrap();
        p.server(S2).unwrap();
        p.detach_ip_block(&pu, &b).unwrap();
        let detached = p.ip_block(&b).unwrap().unwrap();
        p.attach_ip_block(&pu, &b).unwrap();
        let reattached = p.ip_block(&b).unwrap().unwrap();
        p.delete_public_network(&pu).unwrap();
        (
            refused,
            detached,
            reattached,
            p.ip_block(&b).unwrap().unwrap(),
        )
    })
    .await;
    assert_eq!(detach_refused, Some(409), "members hold IPs of the block");
    assert_eq!(
        (
            detached.status.as_str(),
            detached.assigned_resource_id,
            detached.assigned_resource_type
        ),
        ("unassigned", None, None)
    );
    assert_eq!(reattached.assigned_resource_id, Some(public_id));
    assert_eq!(
        (freed.status.as_str(), freed.assigned_resource_id),
        ("unassigned", None)
    );
    assert_clean(&sim);
}
