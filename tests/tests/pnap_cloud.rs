//! phoenixNAP behind the cloud seam: `metal_ipam_core::pnap::client::Pnap`
//! used as `&dyn metal_ipam_core::cloud::Cloud` against `PnapSim` (over
//! `BlockingHttp`), every request and answer checked against the vendored
//! specs: servers as devices with one NIC, private and public networks as
//! segments, memberships as operations followed over the simulator's
//! reads, IPs on memberships as assigned addresses (joined, added by
//! PATCH, removed, left), the audit log as hints, and the faults a
//! caller meets (a lost answer, a server deleted mid-step).

use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::cloud::{AssignedAddress, Cloud, CloudError, CloudEvent, Operation};
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::pnap::model::{IpBlockCreate, PrivateNetworkCreate, PublicNetworkCreate};
use metal_ipam_core::testing::TestEnv;
use metal_ipam_tests::metal_sim::BlockingHttp;
use metal_ipam_tests::pnap_sim::{rfc3339_ms, Fault, PnapSim, DEFAULT_START_MS};
use serde_json::Map;

const S1: &str = "60473a6115e34466c9f8f083";
const S2: &str = "60473a6115e34466c9f8f084";

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

/// Runs `f` with a fresh client seen only as a [`Cloud`].
async fn cloud<T, F>(sim: &PnapSim, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(&dyn Cloud) -> T + Send + 'static,
{
    with(sim, move |p| f(p as &dyn Cloud)).await
}

fn assert_clean(sim: &PnapSim) {
    assert_eq!(sim.violations(), Vec::<String>::new(), "request violations");
    assert_eq!(
        sim.answer_violations(),
        Vec::<String>::new(),
        "answer violations"
    );
}

/// `METHOD path` of the writes the simulator received since `from`.
fn writes_since(sim: &PnapSim, from: usize) -> Vec<String> {
    sim.requests()[from..]
        .iter()
        .filter(|r| r.method != "GET" && r.operation.as_deref() != Some("token"))
        .map(|r| r.method.clone())
        .collect()
}

struct Networks {
    private: String,
    public: String,
}

/// A private network `10.0.0.0/24` and a public network with an assigned
/// `/29` block (`198.18.0.0/29`: gateway `.1`, hosts `.2`–`.6`), both in
/// PHX.
async fn networks(sim: &PnapSim) -> Networks {
    let (private, public) = with(sim, |p| {
        let private = p
            .create_private_network(&PrivateNetworkCreate {
                name: "pool a".into(),
                description: None,
                location: "PHX".into(),
                vlan_id: None,
                cidr: Some("10.0.0.0/24".into()),
            })
            .unwrap();
        let block = p
            .create_ip_block(&IpBlockCreate {
                location: "PHX".into(),
                cidr_block_size: "/29".into(),
                description: None,
            })
            .unwrap();
        let public = p
            .create_public_network(&PublicNetworkCreate {
                name: "public a".into(),
                description: None,
                location: "PHX".into(),
                vlan_id: None,
                ip_blocks: Vec::new(),
            })
            .unwrap();
        p.attach_ip_block(&public.id, &block.id).unwrap();
        assert_eq!(block.cidr, "198.18.0.0/29");
        (private.id, public.id)
    })
    .await;
    sim.settle();
    Networks { private, public }
}

fn no_labels() -> Map<String, serde_json::Value> {
    Map::new()
}

fn address_id(server: &str, kind: &str, network: &str, ip: &str) -> String {
    format!("{server}/{kind}/{network}/{ip}")
}

// -- devices -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_is_a_device_with_one_nic_carrying_its_networks() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    sim.add_server_in_state("60473a6115e34466c9f8f085", "node-3", "PHX", "deleting");
    let nets = networks(&sim).await;
    let (private, public) = (nets.private.clone(), nets.public.clone());
    cloud(&sim, move |c| {
        c.assign_address(S1, "10.0.0.10/24", no_labels()).unwrap();
        c.assign_address(S1, "198.18.0.2/29", no_labels()).unwrap();
    })
    .await;
    sim.settle();
    sim.delete_server(S2);
    let (device, nics, deleted, deleted_nics, deleting) = cloud(&sim, |c| {
        (
            c.device(S1).unwrap(),
            c.device_nics(S1).unwrap(),
            c.device(S2).unwrap(),
            c.device_nics(S2).unwrap(),
            c.device("60473a6115e34466c9f8f085").unwrap().unwrap(),
        )
    })
    .await;
    let device = device.expect("S1 exists");
    assert_eq!(device.id, S1);
    assert_eq!(device.state.as_deref(), Some("powered-on"));
    assert!(device.active && !device.gone);
    assert_eq!(device.nics.len(), 1, "one NIC per server");
    assert_eq!(device.nics[0].id, S1, "the NIC's id is the server's");
    assert_eq!(device.nics[0].segments, [private, public]);
    let mut addresses: Vec<(String, bool)> = device
        .addresses
        .iter()
        .map(|a| (a.address.clone().unwrap(), a.public.unwrap()))
        .collect();
    addresses.sort();
    assert_eq!(
        addresses,
        [("10.0.0.10".into(), false), ("198.18.0.2".into(), true)]
    );
    assert_eq!(nics.expect("S1 exists"), device);
    assert_eq!((deleted, deleted_nics), (None, None), "a deleted server");
    assert!(deleting.gone && !deleting.active, "deleting is gone");
    assert_clean(&sim);
}

// -- segments ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_and_public_networks_are_segments_of_their_location() {
    let sim = PnapSim::start().await;
    let nets = networks(&sim).await;
    with(&sim, |p| {
        p.create_private_network(&PrivateNetworkCreate {
            name: "elsewhere".into(),
            description: None,
            location: "ASH".into(),
            vlan_id: Some(300),
            cidr: Some("10.0.0.0/24".into()),
        })
        .unwrap();
    })
    .await;
    let (private, public) = (nets.private.clone(), nets.public.clone());
    let (phx, ash, sea, one_private, one_public, unknown) = cloud(&sim, move |c| {
        (
            c.segments("phx").unwrap(),
            c.segments("ASH").unwrap(),
            c.segments("sea").unwrap(),
            c.segment(&private).unwrap(),
            c.segment(&public).unwrap(),
            c.segment("60473a6115e34466c9f8f0ff").unwrap(),
        )
    })
    .await;
    let view = |s: &metal_ipam_core::cloud::Segment| {
        (s.id.clone(), s.vlan, s.location.clone().unwrap_or_default())
    };
    assert_eq!(
        phx.iter().map(view).collect::<Vec<_>>(),
        [
            (nets.private.clone(), Some(100), "phx".to_owned()),
            (nets.public.clone(), Some(101), "phx".to_owned()),
        ]
    );
    assert_eq!(ash.len(), 1);
    assert!(ash[0].is(300, "ash"), "{ash:?}");
    assert!(sea.is_empty());
    assert!(one_private.unwrap().is(100, "phx"));
    let one_public = one_public.unwrap();
    assert_eq!(one_public.id, nets.public);
    assert!(one_public.is(101, "phx"));
    assert_eq!(unknown, None);
    assert_clean(&sim);
}

// -- addresses -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_are_ips_of_memberships_joined_patched_and_left() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    let nets = networks(&sim).await;
    let (private, public) = (nets.private.clone(), nets.public.clone());

    // Joins the private network with the address.
    let start = sim.requests().len();
    let first = cloud(&sim, |c| c.assign_address(S1, "10.0.0.10/24", no_labels()))
        .await
        .unwrap();
    assert_eq!(
        first,
        AssignedAddress {
            id: address_id(S1, "private", &private, "10.0.0.10"),
            address: Some("10.0.0.10".into()),
        }
    );
    assert_eq!(writes_since(&sim, start), ["POST"]);
    let m = &sim.memberships()[0];
    assert_eq!(
        (m.network_id.as_str(), &m.ips[..]),
        (private.as_str(), &["10.0.0.10".to_owned()][..])
    );

    // A second address is added to the membership (PATCH); one already
    // there is not written again.
    let start = sim.requests().len();
    let (second, again) = cloud(&sim, |c| {
        (
            c.assign_address(S1, "10.0.0.11/24", no_labels()),
            c.assign_address(S1, "10.0.0.11", no_labels()),
        )
    })
    .await;
    let second = second.unwrap();
    assert_eq!(second.id, address_id(S1, "private", &private, "10.0.0.11"));
    assert_eq!(again.unwrap(), second, "idempotent");
    assert_eq!(writes_since(&sim, start), ["PATCH"]);
    assert_eq!(sim.memberships()[0].ips, ["10.0.0.10", "10.0.0.11"]);

    // An address of an attached block joins the public network.
    let start = sim.requests().len();
    let third = cloud(&sim, |c| c.assign_address(S1, "198.18.0.2/29", no_labels()))
        .await
        .unwrap();
    assert_eq!(third.id, address_id(S1, "public", &public, "198.18.0.2"));
    assert_eq!(writes_since(&sim, start), ["POST"]);

    // An address no network of the server's location holds: 422 naming the
    // location, nothing sent.
    let start = sim.requests().len();
    let refused = cloud(&sim, |c| c.assign_address(S1, "10.9.9.9/24", no_labels()))
        .await
        .unwrap_err();
    match &refused {
        CloudError::Api {
            status: 422,
            messages,
            ..
        } => assert!(messages.join(" ").contains("PHX"), "{messages:?}"),
        other => panic!("expected a 422, got {other:?}"),
    }
    assert!(writes_since(&sim, start).is_empty());

    let listed = cloud(&sim, |c| c.addresses(S1)).await.unwrap();
    assert_eq!(listed, [first.clone(), second.clone(), third.clone()]);

    // Removing one address PATCHes the rest; the last one leaves, and is
    // not removed until the server has left (the IP is held meanwhile).
    let start = sim.requests().len();
    let (id1, id2, id3) = (first.id.clone(), second.id.clone(), third.id.clone());
    let removed = cloud(&sim, move |c| {
        let unavailable = |r: Result<bool, CloudError>| match r {
            Err(CloudError::Unavailable { .. }) => "unavailable".to_string(),
            other => format!("{other:?}"),
        };
        [
            format!("{:?}", c.unassign_address(&id1)),
            unavailable(c.unassign_address(&id2)),
            unavailable(c.unassign_address(&id3)),
        ]
    })
    .await;
    assert_eq!(removed, ["Ok(true)", "unavailable", "unavailable"]);
    assert_eq!(writes_since(&sim, start), ["PATCH", "DELETE", "DELETE"]);
    sim.settle();
    assert!(sim.memberships().is_empty(), "{:?}", sim.memberships());

    // Gone: false, nothing sent.
    let start = sim.requests().len();
    let (id2, id3) = (second.id.clone(), third.id.clone());
    let (again, listed) = cloud(&sim, move |c| {
        (
            [
                c.unassign_address(&id2).unwrap(),
                c.unassign_address(&id3).unwrap(),
            ],
            c.addresses(S1).unwrap(),
        )
    })
    .await;
    assert_eq!(again, [false, false]);
    assert!(listed.is_empty());
    assert!(writes_since(&sim, start).is_empty());
    let names: Vec<String> = sim.events().into_iter().map(|e| e.name).collect();
    assert_eq!(
        names[names.len() - 6..],
        [
            "API.AddServerPrivateNetwork",
            "API.UpdateServerPrivateNetwork",
            "API.AddServerPublicNetwork",
            "API.UpdateServerPrivateNetwork",
            "API.RemoveServerPrivateNetwork",
            "API.RemoveServerPublicNetwork",
        ]
    );
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phoenixnaps_refusals_of_a_membership_write_are_the_seams() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    let nets = networks(&sim).await;
    // An address another server holds: phoenixNAP answers 400; at the seam
    // that is a refusal in the current state (422), which the assignment
    // rules re-read before they believe it.
    let (taken, public_taken) = cloud(&sim, |c| {
        c.assign_address(S2, "10.0.0.20/24", no_labels()).unwrap();
        c.assign_address(S2, "198.18.0.3/29", no_labels()).unwrap();
        (
            c.assign_address(S1, "10.0.0.20/24", no_labels()),
            c.assign_address(S1, "198.18.0.3/29", no_labels()),
        )
    })
    .await;
    for refused in [taken.unwrap_err(), public_taken.unwrap_err()] {
        match &refused {
            CloudError::Api {
                status: 422,
                messages,
                ..
            } => assert!(messages.join(" ").contains("already used"), "{messages:?}"),
            other => panic!("expected a 422, got {other:?}"),
        }
    }
    sim.settle();

    // A second address while the join is still in progress: phoenixNAP
    // refuses the PATCH (409); at the seam that is "not now" (retry), not
    // a refusal; once assigned, the address is added.
    sim.set_membership_reads(2);
    let (early, later) = cloud(&sim, |c| {
        c.assign_address(S1, "10.0.0.10/24", no_labels()).unwrap();
        let early = c.assign_address(S1, "10.0.0.11/24", no_labels());
        let later = c.assign_address(S1, "10.0.0.11/24", no_labels());
        (early, later)
    })
    .await;
    assert!(
        matches!(early, Err(CloudError::Unavailable { .. })),
        "{early:?}"
    );
    assert_eq!(
        later.unwrap().id,
        address_id(S1, "private", &nets.private, "10.0.0.11")
    );
    let s1 = sim
        .memberships()
        .into_iter()
        .find(|m| m.server_id == S1)
        .unwrap();
    assert_eq!(s1.ips, ["10.0.0.10", "10.0.0.11"]);
    assert_clean(&sim);
}

// -- operations ----------------------------------------------------------------------

fn state(op: &Option<Operation>) -> Option<String> {
    op.as_ref().and_then(|o| o.state.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_and_leaving_a_network_are_operations_followed_over_reads() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    let nets = networks(&sim).await;
    sim.set_membership_reads(2);
    let net = nets.private.clone();

    // Join: in progress for two reads of the server, then completed.
    let n = net.clone();
    let (started, followed, unfinished) = cloud(&sim, move |c| {
        let started = c
            .change_segments(S1, true, std::slice::from_ref(&n))
            .unwrap();
        let unfinished = c.unfinished_operation(S1).unwrap();
        let followed = [
            state(&c.operation(S1, &started.id).unwrap()),
            state(&c.operation(S1, &started.id).unwrap()),
        ];
        (
            started,
            followed,
            [unfinished, c.unfinished_operation(S1).unwrap()],
        )
    })
    .await;
    assert_eq!(started.id, format!("join:{net}"));
    assert_eq!(started.state.as_deref(), Some("in_progress"));
    let [during, after] = unfinished;
    let during = during.expect("the join is unfinished");
    assert_eq!(during.state.as_deref(), Some("in_progress"));
    assert_eq!(
        followed,
        [Some("in_progress".into()), Some("completed".into())]
    );
    assert_eq!(after, None, "nothing unfinished once assigned");
    // Without chosen IPs phoenixNAP took the next free one.
    assert_eq!(sim.memberships()[0].ips, ["10.0.0.1"]);

    // Leave: the same way, and the unfinished operation found meanwhile
    // (a lost answer's lookup) also ends completed.
    let n = net.clone();
    let (started, found, followed, found_followed) = cloud(&sim, move |c| {
        let started = c
            .change_segments(S1, false, std::slice::from_ref(&n))
            .unwrap();
        let found = c.unfinished_operation(S1).unwrap().expect("the leave");
        let followed = [
            state(&c.operation(S1, &started.id).unwrap()),
            state(&c.operation(S1, &started.id).unwrap()),
        ];
        let found_followed = c.operation(S1, &found.id).unwrap();
        (started, found, followed, found_followed)
    })
    .await;
    assert_eq!(started.id, format!("leave:{net}"));
    assert_eq!(found.state.as_deref(), Some("in_progress"));
    assert_eq!(
        followed,
        [Some("in_progress".into()), Some("completed".into())]
    );
    let found_followed = found_followed.expect("the found operation");
    assert_eq!(
        found_followed.state.as_deref(),
        Some("completed"),
        "{found_followed:?}"
    );
    assert!(sim.memberships().is_empty());

    // Two networks in one call: refused before any request.
    let start = sim.requests().len();
    let (private, public) = (nets.private.clone(), nets.public.clone());
    let refused = cloud(&sim, move |c| {
        c.change_segments(S1, true, &[private, public])
    })
    .await
    .unwrap_err();
    assert_eq!(refused.status(), Some(422), "{refused:?}");
    assert_eq!(sim.requests().len(), start, "no request at all");

    // A public network takes no join without IPs (the seam passes none;
    // an open point of issue 29): phoenixNAP's 400, the seam's 422.
    let public = nets.public.clone();
    let refused = cloud(&sim, move |c| c.change_segments(S1, true, &[public]))
        .await
        .unwrap_err();
    assert!(refused.says(422, "at least 1 ip"), "{refused:?}");

    // An unknown operation id, a network never joined.
    let n = net.clone();
    let (unknown, never) = cloud(&sim, move |c| {
        (
            c.operation(S1, "rename:x").unwrap(),
            c.operation(S1, &format!("join:{n}")).unwrap(),
        )
    })
    .await;
    assert_eq!(unknown, None);
    assert_eq!(never.unwrap().state.as_deref(), Some("failed"));
    assert_clean(&sim);
}

// -- events --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_is_read_as_hints_after_a_timestamp_cursor() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    let nets = networks(&sim).await;
    let t0 = rfc3339_ms(DEFAULT_START_MS);

    // No cursor: the newest event, "not found" (resync).
    let (events, found) = cloud(&sim, |c| c.events_after(None, 1)).await.unwrap();
    assert_eq!(
        events,
        [CloudEvent {
            id: t0.clone(),
            devices: Vec::new()
        }]
    );
    assert!(!found);

    // Two writes later: both, newest first, "not found".
    sim.advance(1_000);
    let private = nets.private.clone();
    cloud(&sim, move |c| {
        c.assign_address(S1, "10.0.0.10/24", no_labels()).unwrap();
    })
    .await;
    sim.advance(1_000);
    cloud(&sim, move |c| {
        c.assign_address(S1, "10.0.0.11/24", no_labels()).unwrap();
    })
    .await;
    let (t1, t2) = (
        rfc3339_ms(DEFAULT_START_MS + 1_000),
        rfc3339_ms(DEFAULT_START_MS + 2_000),
    );
    let cursor = t0.clone();
    let (events, found) = cloud(&sim, move |c| c.events_after(Some(&cursor), 1))
        .await
        .unwrap();
    let ids: Vec<String> = events.into_iter().map(|e| e.id).collect();
    assert_eq!(ids, [t2.clone(), t1]);
    assert!(!found);

    // Nothing new: empty, found.
    let cursor = t2.clone();
    let (events, found) = cloud(&sim, move |c| c.events_after(Some(&cursor), 1))
        .await
        .unwrap();
    assert!(events.is_empty());
    assert!(found);
    assert!(sim.memberships().iter().all(|m| m.network_id == private));
    assert_clean(&sim);
}

// -- faults --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_join_answer_is_unknown_and_found_by_the_address_lookup() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    let nets = networks(&sim).await;
    sim.inject(
        "POST",
        "serversServerIdPrivateNetworksPost",
        Fault::CrashAfter,
        1,
    );
    let lost = cloud(&sim, |c| c.assign_address(S1, "10.0.0.10/24", no_labels()))
        .await
        .unwrap_err();
    assert!(
        matches!(lost, CloudError::OutcomeUnknown { .. }),
        "{lost:?}"
    );
    assert_eq!(
        sim.count("serversServerIdPrivateNetworksPost"),
        1,
        "a join is not repeated"
    );
    let listed = cloud(&sim, |c| c.addresses(S1)).await.unwrap();
    assert_eq!(
        listed,
        [AssignedAddress {
            id: address_id(S1, "private", &nets.private, "10.0.0.10"),
            address: Some("10.0.0.10".into()),
        }]
    );
    assert_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_deleted_mid_assign_is_an_error_not_a_panic() {
    let sim = PnapSim::start().await;
    sim.add_server(S1, "node-1", "PHX");
    sim.add_server(S2, "node-2", "PHX");
    networks(&sim).await;
    // Deleted between the server's read and the join.
    sim.inject(
        "POST",
        "serversServerIdPrivateNetworksPost",
        Fault::DeleteServerBefore(S1.into()),
        1,
    );
    // Deleted between the server's read and the PATCH of a second address.
    let first = cloud(&sim, |c| c.assign_address(S2, "10.0.0.20/24", no_labels()))
        .await
        .unwrap();
    sim.settle();
    sim.inject(
        "PATCH",
        "serversServerIdPrivateNetworksPatch",
        Fault::DeleteServerBefore(S2.into()),
        1,
    );
    let id = first.id.clone();
    let (join, patch, after) = cloud(&sim, move |c| {
        (
            c.assign_address(S1, "10.0.0.10/24", no_labels()),
            c.assign_address(S2, "10.0.0.21/24", no_labels()),
            (
                c.assign_address(S1, "10.0.0.12/24", no_labels())
                    .map_err(|e| e.status()),
                c.addresses(S1).map_err(|e| e.status()),
                c.unassign_address(&id),
                c.device(S2),
            ),
        )
    })
    .await;
    assert_eq!(join.unwrap_err().status(), Some(404));
    assert_eq!(patch.unwrap_err().status(), Some(404));
    let (assign, listed, unassigned, device) = after;
    assert_eq!(assign, Err(Some(404)), "a gone server");
    assert_eq!(listed, Err(Some(404)));
    assert!(!unassigned.unwrap(), "its addresses went with it");
    assert_eq!(device.unwrap(), None);
    assert!(sim.memberships().is_empty());
    assert_clean(&sim);
}
