//! The phoenixNAP calls for backed pools (`metal_ipam_core::provision::
//! pnap_pools`) through the real `Pnap` client against `PnapSim` (over
//! `BlockingHttp`), every request and answer checked against the vendored
//! specs: private and public networks and IP blocks created, found,
//! adopted, read and deleted; a public network created with its block;
//! a creation whose answer was lost found exactly once (and a creation
//! repeated without looking refused under the taken name, then found; a
//! network someone else named alike neither found nor taken for ours);
//! duplicates deleted, the oldest kept; members taken off, and a network
//! not deleted while any server is still a member.

use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::pnap::model::{
    PrivateNetworkCreate, ServerPrivateNetwork, ServerPublicNetwork,
};
use metal_ipam_core::provision::pnap_pools::{
    adopt_block, adopt_network, attach_block, block_cidr, create_block, create_private_network,
    create_public_network, delete_block, delete_network, find_block, find_network, fit_name,
    members, network_cidr, remove_member, NetworkKind,
};
use metal_ipam_core::testing::TestEnv;
use metal_ipam_tests::metal_sim::BlockingHttp;
use metal_ipam_tests::pnap_sim::{Fault, PnapSim};

const S1: &str = "60473a6115e34466c9f8f083";
const S2: &str = "60473a6115e34466c9f8f084";
const TAG: &str = "metal-ipam-team-a-pool-b-1a2b3c4d";

type Client<'a> = Pnap<'a, BlockingHttp, TestEnv>;

/// Runs `f` with a fresh client on a blocking thread.
async fn with<T, F>(sim: &PnapSim, f: F) -> T
where
    T: Send + 'static,
    F: for<'a> FnOnce(&Client<'a>) -> T + Send + 'static,
{
    let cfg: PnapConfig = sim.config(RetryPolicy::default());
    tokio::task::spawn_blocking(move || {
        let (http, env) = (BlockingHttp::new(), TestEnv::at(1_000));
        f(&Pnap::new(&http, &cfg, &env))
    })
    .await
    .expect("the client task")
}

fn assert_clean(sim: &PnapSim) {
    assert_eq!(sim.violations(), Vec::<String>::new(), "request violations");
    assert_eq!(
        sim.answer_violations(),
        Vec::<String>::new(),
        "answer violations"
    );
}

fn join_private(network: &str, ip: &str) -> ServerPrivateNetwork {
    ServerPrivateNetwork {
        id: network.into(),
        ips: vec![ip.into()],
        dhcp: Some(false),
        status_description: None,
    }
}

fn join_public(network: &str, ip: &str) -> ServerPublicNetwork {
    ServerPublicNetwork {
        id: network.into(),
        ips: vec![ip.into()],
        status_description: None,
    }
}

// -- private networks -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_network_is_created_found_adopted_read_and_deleted() {
    let sim = PnapSim::start().await;
    let long_tag = format!("metal-ipam-ns_a-{}-1a2b3c4d", "p".repeat(120));
    let (id, long_id) = with(&sim, move |p| {
        let id = create_private_network(p, "PHX", TAG, "10.20.0.0/24", Some(300)).unwrap();
        let long_id = create_private_network(p, "PHX", &long_tag, "10.21.0.0/24", None).unwrap();
        assert_eq!(
            find_network(p, NetworkKind::Private, "PHX", &long_tag).unwrap(),
            Some(long_id.clone())
        );
        (id, long_id)
    })
    .await;
    let nets = sim.private_networks();
    assert_eq!(nets[0].name, TAG);
    assert_eq!(nets[1].name.len(), 100, "fitted: {}", nets[1].name);
    assert_eq!(nets[1].name, fit_name(&nets[1].name));
    let n = id.clone();
    let (found, elsewhere, by_id, by_vlan, cidr) = with(&sim, move |p| {
        (
            find_network(p, NetworkKind::Private, "PHX", TAG).unwrap(),
            find_network(p, NetworkKind::Private, "ASH", TAG).unwrap(),
            adopt_network(p, NetworkKind::Private, "PHX", Some(&n), None).unwrap(),
            adopt_network(p, NetworkKind::Private, "PHX", None, Some(300)).unwrap(),
            network_cidr(p, NetworkKind::Private, &n).unwrap(),
        )
    })
    .await;
    assert_eq!(found.as_deref(), Some(id.as_str()));
    assert_eq!(elsewhere, None);
    assert_eq!((by_id, by_vlan), (id.clone(), id.clone()));
    assert_eq!(cidr, ("10.20.0.0".parse().unwrap(), 24));

    let n = id.clone();
    let (wrong_place, no_vlan, deleted, again, found, gone) = with(&sim, move |p| {
        let wrong_place =
            adopt_network(p, NetworkKind::Private, "ASH", Some(&n), None).unwrap_err();
        let no_vlan = adopt_network(p, NetworkKind::Private, "PHX", None, Some(301)).unwrap_err();
        (
            wrong_place.field().map(str::to_owned),
            no_vlan.field().map(str::to_owned),
            delete_network(p, NetworkKind::Private, &n).unwrap(),
            delete_network(p, NetworkKind::Private, &n).unwrap(),
            find_network(p, NetworkKind::Private, "PHX", TAG).unwrap(),
            network_cidr(p, NetworkKind::Private, &n)
                .unwrap_err()
                .reason(),
        )
    })
    .await;
    assert_eq!(wrong_place.as_deref(), Some("spec.phoenixnap.location"));
    assert_eq!(
        no_vlan.as_deref(),
        Some("spec.phoenixnap.privateNetwork.vlanId")
    );
    assert!(deleted && !again, "deleted, then already gone");
    assert_eq!(found, None);
    assert_eq!(gone, "PnapNetworkGone");
    assert_eq!(
        sim.private_networks()
            .into_iter()
            .map(|n| n.id)
            .collect::<Vec<_>>(),
        [long_id]
    );
    assert_clean(&sim);
}

// -- public networks and blocks ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_network_is_created_with_its_block_and_both_are_deleted() {
    let sim = PnapSim::start().await;
    let (block, network) = with(&sim, |p| {
        let block = create_block(p, "PHX", 29, TAG).unwrap();
        assert_eq!(find_block(p, "PHX", TAG).unwrap(), Some(block.clone()));
        assert_eq!(adopt_block(p, "PHX", &block).unwrap(), block);
        let network = create_public_network(p, "PHX", TAG, None, &block).unwrap();
        (block, network)
    })
    .await;
    let b = &sim.ip_blocks()[0];
    assert_eq!(b.description.as_deref(), Some(TAG));
    assert_eq!(b.assigned_resource_id.as_deref(), Some(network.as_str()));
    assert_eq!(sim.public_networks()[0].name, TAG);
    let attaches = sim.applied("publicNetworksNetworkIdIpBlocksPost");

    let (b, n) = (block.clone(), network.clone());
    let (found, ranges, adopted_elsewhere) = with(&sim, move |p| {
        attach_block(p, &n, &b).unwrap();
        (
            find_network(p, NetworkKind::Public, "PHX", TAG).unwrap(),
            (
                network_cidr(p, NetworkKind::Public, &n).unwrap(),
                block_cidr(p, &b).unwrap(),
            ),
            adopt_block(p, "ASH", &b)
                .unwrap_err()
                .field()
                .map(str::to_owned),
        )
    })
    .await;
    assert_eq!(
        sim.applied("publicNetworksNetworkIdIpBlocksPost"),
        attaches,
        "attached at creation: nothing sent"
    );
    assert_eq!(found.as_deref(), Some(network.as_str()));
    let block_range = ("198.18.0.0".parse().unwrap(), 29);
    assert_eq!(ranges, (block_range, block_range));
    assert_eq!(
        adopted_elsewhere.as_deref(),
        Some("spec.phoenixnap.location")
    );

    // The network goes first (its block freed), then the block.
    let (b, n) = (block.clone(), network.clone());
    let (freed, deleted, again, gone) = with(&sim, move |p| {
        assert!(delete_network(p, NetworkKind::Public, &n).unwrap());
        let freed = p.ip_block(&b).unwrap().unwrap().assigned_resource_id;
        (
            freed,
            delete_block(p, &b).unwrap(),
            delete_block(p, &b).unwrap(),
            block_cidr(p, &b).unwrap_err().reason(),
        )
    })
    .await;
    assert_eq!(freed, None);
    assert!(deleted && !again);
    assert_eq!(gone, "PnapBlockGone");
    assert!(sim.ip_blocks().is_empty() && sim.public_networks().is_empty());
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_is_attached_once_and_detached_before_it_is_deleted() {
    let sim = PnapSim::start().await;
    let (network, second) = with(&sim, |p| {
        let first = create_block(p, "PHX", 29, TAG).unwrap();
        let network = create_public_network(p, "PHX", TAG, Some(700), &first).unwrap();
        let second = create_block(p, "PHX", 30, "metal-ipam-team-a-pool-c-5e6f7a8b").unwrap();
        attach_block(p, &network, &second).unwrap();
        attach_block(p, &network, &second).unwrap();
        (network, second)
    })
    .await;
    assert_eq!(sim.applied("publicNetworksNetworkIdIpBlocksPost"), 1);
    let on_network = |sim: &PnapSim| {
        sim.ip_blocks()
            .into_iter()
            .filter(|b| b.assigned_resource_id.as_deref() == Some(network.as_str()))
            .count()
    };
    assert_eq!(on_network(&sim), 2);
    let s = second.clone();
    assert!(with(&sim, move |p| delete_block(p, &s).unwrap()).await);
    assert_eq!(on_network(&sim), 1);
    let detach = sim
        .requests()
        .iter()
        .position(|r| {
            r.operation.as_deref() == Some("publicNetworksNetworkIdIpBlocksIpBlockIdDelete")
        })
        .expect("detached");
    let delete = sim
        .requests()
        .iter()
        .position(|r| r.operation.as_deref() == Some("ipBlocksIpBlockIdDelete"))
        .expect("deleted");
    assert!(detach < delete);
    assert_clean(&sim);
}

// -- lost answers and duplicates -----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_whose_answer_was_lost_is_found_exactly_once() {
    let sim = PnapSim::start().await;
    sim.inject("POST", "privateNetworksPost", Fault::CrashAfter, 1);
    sim.inject("POST", "publicNetworksPost", Fault::StatusAfter(502), 1);
    sim.inject("POST", "ipBlocksPost", Fault::CrashAfter, 1);
    let out = with(&sim, |p| {
        let private = create_private_network(p, "PHX", TAG, "10.0.0.0/24", None).unwrap_err();
        let block = create_block(p, "PHX", 29, TAG).unwrap_err();
        let found_block = find_block(p, "PHX", TAG).unwrap().expect("the block");
        let public = create_public_network(p, "PHX", TAG, None, &found_block).unwrap_err();
        // A second instance that did not look: refused under the taken
        // name, which is an unknown outcome too.
        let repeated = create_private_network(p, "PHX", TAG, "10.0.0.0/24", None).unwrap_err();
        (
            [
                private.outcome_unknown,
                block.outcome_unknown,
                public.outcome_unknown,
                repeated.outcome_unknown,
            ],
            repeated.error.reason(),
            find_network(p, NetworkKind::Private, "PHX", TAG).unwrap(),
            find_network(p, NetworkKind::Public, "PHX", TAG).unwrap(),
            found_block,
        )
    })
    .await;
    let (unknown, reason, private, public, block) = out;
    assert_eq!(unknown, [true; 4]);
    assert_eq!(reason, "PnapRefused");
    assert_eq!(sim.private_networks().len(), 1);
    assert_eq!(private, Some(sim.private_networks()[0].id.clone()));
    assert_eq!(sim.public_networks().len(), 1);
    assert_eq!(public, Some(sim.public_networks()[0].id.clone()));
    assert_eq!(sim.ip_blocks().len(), 1);
    assert_eq!(block, sim.ip_blocks()[0].id);
    assert_eq!(
        sim.ip_blocks()[0].assigned_resource_id,
        public,
        "created with the block"
    );
    assert_eq!(sim.count("privateNetworksPost"), 2, "each POST sent once");
    assert_eq!(sim.count("publicNetworksPost"), 1);
    assert_eq!(sim.count("ipBlocksPost"), 1);
    assert_eq!(sim.pending_faults(), 0);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_deleted_and_the_oldest_kept() {
    let sim = PnapSim::start().await;
    // Duplicates only a creation outliving its intent's lease leaves: one
    // created, the clock moves, another of the same tag.
    let first_block = with(&sim, |p| create_block(p, "PHX", 29, TAG).unwrap()).await;
    sim.allow_duplicate_names(true);
    let first_net = with(&sim, |p| {
        create_private_network(p, "PHX", TAG, "10.0.0.0/24", None).unwrap()
    })
    .await;
    sim.advance(60_000);
    let (second_block, second_net) = with(&sim, |p| {
        let b = create_block(p, "PHX", 29, TAG).unwrap();
        // The younger block is even attached: it is detached, then deleted.
        create_public_network(p, "PHX", "someone else", None, &b).unwrap();
        let n = create_private_network(p, "PHX", TAG, "10.1.0.0/24", None).unwrap();
        (b, n)
    })
    .await;
    assert_ne!(first_block, second_block);
    assert_ne!(first_net, second_net);
    let (block, net) = with(&sim, |p| {
        (
            find_block(p, "PHX", TAG).unwrap(),
            find_network(p, NetworkKind::Private, "PHX", TAG).unwrap(),
        )
    })
    .await;
    assert_eq!(block, Some(first_block.clone()));
    assert_eq!(net, Some(first_net.clone()));
    let blocks: Vec<String> = sim.ip_blocks().into_iter().map(|b| b.id).collect();
    assert_eq!(blocks, [first_block]);
    let nets: Vec<String> = sim.private_networks().into_iter().map(|n| n.id).collect();
    assert_eq!(nets, [first_net]);
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_someone_else_named_alike_is_not_taken_for_ours() {
    let sim = PnapSim::start().await;
    let (refused, found) = with(&sim, |p| {
        p.create_private_network(&PrivateNetworkCreate {
            name: TAG.into(),
            description: Some("made by hand".into()),
            location: "PHX".into(),
            vlan_id: None,
            cidr: Some("10.9.0.0/24".into()),
        })
        .unwrap();
        let refused = create_private_network(p, "PHX", TAG, "10.0.0.0/24", None).unwrap_err();
        (
            (refused.outcome_unknown, refused.error.reason()),
            find_network(p, NetworkKind::Private, "PHX", TAG).unwrap(),
        )
    })
    .await;
    assert_eq!(refused, (false, "PnapRefused"), "a refusal, not ours");
    assert_eq!(found, None);
    assert_eq!(sim.private_networks().len(), 1, "theirs is left alone");
    assert_clean(&sim);
}

// -- members --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_network_goes_only_once_its_members_have_left() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    let net = with(&sim, |p| {
        let net = create_private_network(p, "PHX", TAG, "10.0.0.0/24", None).unwrap();
        p.join_private_network(S1, &join_private(&net, "10.0.0.10"))
            .unwrap();
        p.join_private_network(S2, &join_private(&net, "10.0.0.11"))
            .unwrap();
        net
    })
    .await;
    sim.settle();
    let n = net.clone();
    let (listed, refused, leaving, still_refused) = with(&sim, move |p| {
        let listed = members(p, NetworkKind::Private, &n).unwrap();
        let refused = delete_network(p, NetworkKind::Private, &n).unwrap_err();
        for s in &listed {
            remove_member(p, NetworkKind::Private, s, &n).unwrap();
        }
        let leaving = members(p, NetworkKind::Private, &n).unwrap();
        let still = delete_network(p, NetworkKind::Private, &n).unwrap_err();
        (
            listed,
            (refused.status(), refused.reason()),
            leaving,
            still.reason(),
        )
    })
    .await;
    assert_eq!(listed, [S1, S2]);
    assert_eq!(refused, (409, "PnapRefused"));
    assert_eq!(leaving, [S1, S2], "leaving members are still members");
    assert_eq!(still_refused, "PnapRefused");
    // One leaves as phoenixNAP finishes; the other server is deleted.
    sim.delete_server(S2);
    let n = net.clone();
    let (left, deleted) = with(&sim, move |p| {
        // The server is gone: done.
        remove_member(p, NetworkKind::Private, S2, &n).unwrap();
        p.server(S1).unwrap();
        let left = members(p, NetworkKind::Private, &n).unwrap();
        (left, delete_network(p, NetworkKind::Private, &n).unwrap())
    })
    .await;
    assert!(left.is_empty(), "{left:?}");
    assert!(deleted);
    assert!(sim.private_networks().is_empty());
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_network_and_its_block_go_only_once_its_members_have_left() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    let (block, net) = with(&sim, |p| {
        let block = create_block(p, "PHX", 29, TAG).unwrap();
        let net = create_public_network(p, "PHX", TAG, None, &block).unwrap();
        (block, net)
    })
    .await;
    sim.settle();
    let (b, n) = (block.clone(), net.clone());
    let (listed, block_refused, net_refused) = with(&sim, move |p| {
        p.join_public_network(S1, &join_public(&n, "198.18.0.2"))
            .unwrap();
        let listed = members(p, NetworkKind::Public, &n).unwrap();
        let block_refused = delete_block(p, &b).unwrap_err();
        let net_refused = delete_network(p, NetworkKind::Public, &n).unwrap_err();
        (listed, block_refused.reason(), net_refused.reason())
    })
    .await;
    assert_eq!(listed, [S1]);
    assert_eq!(
        block_refused, "PnapRefused",
        "the detach is refused while a member holds an IP of the block"
    );
    assert_eq!(net_refused, "PnapRefused");
    assert_eq!(
        sim.ip_blocks()[0].assigned_resource_id.as_deref(),
        Some(net.as_str())
    );
    let (b, n) = (block.clone(), net.clone());
    let (left, block_deleted, net_deleted) = with(&sim, move |p| {
        remove_member(p, NetworkKind::Public, S1, &n).unwrap();
        // Leaving again while it leaves is accepted.
        remove_member(p, NetworkKind::Public, S1, &n).unwrap();
        p.server(S1).unwrap();
        let left = members(p, NetworkKind::Public, &n).unwrap();
        // A server no longer a member: done.
        remove_member(p, NetworkKind::Public, S1, &n).unwrap();
        (
            left,
            delete_block(p, &b).unwrap(),
            delete_network(p, NetworkKind::Public, &n).unwrap(),
        )
    })
    .await;
    assert!(left.is_empty(), "{left:?}");
    assert!(block_deleted && net_deleted);
    assert!(sim.ip_blocks().is_empty() && sim.public_networks().is_empty());
    assert_clean(&sim);
}
