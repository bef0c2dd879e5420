//! A phoenixNAP server's networks applied by
//! `metal_ipam_core::network::memberships` through the real client against
//! `PnapSim` (every request and answer checked against the vendored specs),
//! the day-2 cases: a join whose answer is lost is followed on the server,
//! not repeated; a refused join is reported with phoenixNAP's words and
//! kept in the record; a server deleted mid-apply is forgotten; another
//! instance holding the lease makes this one wait without a call; the
//! release leaves only what the apply joined; hundreds of applies and
//! releases on an injected clock leave a record that does not grow.

use std::collections::BTreeSet;
use std::sync::Arc;

use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::cloud::Cloud;
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::network::apply::{self, ApplyPhase, ApplyReport, DeviceRecord, HISTORY};
use metal_ipam_core::network::memberships::{apply_members, Wanted};
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::pnap::model::PrivateNetworkCreate;
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::ports::Env;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use metal_ipam_core::Result;
use metal_ipam_tests::metal_sim::BlockingHttp;
use metal_ipam_tests::pnap_sim::{Fault, PnapSim};

const S1: &str = "60473a6115e34466c9f8f083";
const S2: &str = "60473a6115e34466c9f8f084";
const JOIN: &str = "serversServerIdPrivateNetworksPost";

/// The simulator with S1 and S2 in PHX and private networks
/// `10.0.0.0/24` and `10.1.0.0/24`; the store and the clock every
/// invocation shares (each invocation takes a fresh token).
struct World {
    sim: PnapSim,
    kv: Arc<MemKv>,
    env: Arc<TestEnv>,
    nets: [String; 2],
}

impl World {
    async fn new() -> World {
        let sim = PnapSim::start().await;
        sim.add_server(S1, "node-1", "PHX");
        sim.add_server(S2, "node-2", "PHX");
        let mut w = World {
            sim,
            kv: Arc::new(MemKv::new(Backend::SpinSqlite)),
            env: Arc::new(TestEnv::at(10_000)),
            nets: [String::new(), String::new()],
        };
        for (i, cidr) in ["10.0.0.0/24", "10.1.0.0/24"].into_iter().enumerate() {
            let id = w
                .with(move |p, _| {
                    p.create_private_network(&PrivateNetworkCreate {
                        name: format!("net {i}"),
                        description: None,
                        location: "PHX".into(),
                        vlan_id: None,
                        cidr: Some(cidr.into()),
                    })
                    .map(|n| n.id)
                })
                .await
                .expect("the network");
            w.nets[i] = id;
        }
        w.sim.settle();
        w
    }

    /// Runs `f` with a client and the shared store on a blocking thread.
    async fn with<T, F>(&self, f: F) -> T
    where
        T: Send + 'static,
        F: for<'a> FnOnce(&Pnap<'a, BlockingHttp, TestEnv>, &Ctx<'a, MemKv>) -> T + Send + 'static,
    {
        let cfg: PnapConfig = self.sim.config(RetryPolicy::default());
        let (kv, env) = (self.kv.clone(), self.env.clone());
        tokio::task::spawn_blocking(move || {
            let http = BlockingHttp::new();
            let pnap = Pnap::new(&http, &cfg, &*env);
            let ctx = Ctx::auto(&*kv, &*env);
            f(&pnap, &ctx)
        })
        .await
        .expect("the task")
    }

    /// One invocation of the apply on `server`.
    async fn apply(&self, server: &'static str, wanted: Vec<Wanted>) -> Result<ApplyReport> {
        self.with(move |p, ctx| {
            apply_members(ctx, p as &dyn Cloud, server, &wanted, false).map(Option::unwrap)
        })
        .await
    }

    /// Invocations until converged (at most `n`), the clock a poll
    /// interval on between them; the writes made.
    async fn converge(&self, server: &'static str, wanted: &[Wanted], n: usize) -> usize {
        let from = self.sim.requests().len();
        for _ in 0..n {
            let r = self.apply(server, wanted.to_vec()).await.expect("apply");
            if r.phase == ApplyPhase::Converged {
                return self.writes_since(from);
            }
            self.env.set_now(self.env.now() + apply::POLL_S);
        }
        panic!("not converged after {n} invocations");
    }

    fn writes_since(&self, from: usize) -> usize {
        self.sim.requests()[from..]
            .iter()
            .filter(|r| r.method != "GET" && r.operation.as_deref() != Some("token"))
            .count()
    }

    /// `server`'s memberships: (network, IPs).
    fn on(&self, server: &str) -> Vec<(String, Vec<String>)> {
        let mut m: Vec<_> = self
            .sim
            .memberships()
            .into_iter()
            .filter(|m| m.server_id == server)
            .map(|m| (m.network_id, m.ips))
            .collect();
        m.sort();
        m
    }

    fn record(&self, server: &str) -> Option<apply::ApplyState> {
        apply::read_existing(&*self.kv, server).unwrap()
    }

    fn assert_clean(&self) {
        assert_eq!(self.sim.violations(), Vec::<String>::new());
        assert_eq!(self.sim.answer_violations(), Vec::<String>::new());
    }
}

fn wanted(net: &str, ips: &[&str]) -> Wanted {
    Wanted {
        segment: net.to_string(),
        addresses: ips.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_join_answer_is_followed_on_the_server_not_repeated() {
    let w = World::new().await;
    w.sim.inject("POST", JOIN, Fault::CrashAfter, 1);
    let want = vec![wanted(&w.nets[0], &["10.0.0.10"])];
    let e = w.apply(S1, want.clone()).await.unwrap_err();
    assert_eq!(e.status(), 503, "{e:?}");
    // Recorded before the call: the join is running, its network owned.
    let rec = w.record(S1).unwrap();
    assert_eq!(rec.running.unwrap().step.action, "join-network");
    assert_eq!(rec.joined, [w.nets[0].clone()]);
    w.converge(S1, &want, 10).await;
    assert_eq!(w.sim.count(JOIN), 1, "the join is not repeated");
    assert_eq!(w.on(S1), [(w.nets[0].clone(), vec!["10.0.0.10".into()])]);
    let rec = w.record(S1).unwrap();
    assert!(rec.running.is_none() && rec.lease.is_none(), "{rec:?}");
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_join_is_reported_with_phoenixnaps_words_and_kept() {
    let w = World::new().await;
    // S2 holds 10.0.0.10 already.
    w.converge(S2, &[wanted(&w.nets[0], &["10.0.0.10"])], 10)
        .await;
    let e = w
        .apply(S1, vec![wanted(&w.nets[0], &["10.0.0.10"])])
        .await
        .unwrap_err();
    assert_eq!(
        (e.status(), e.reason()),
        (409, "MembershipRefused"),
        "{e:?}"
    );
    assert!(e.message().contains(&w.nets[0]), "{}", e.message());
    let rec = w.record(S1).unwrap();
    assert!(rec.failed.is_some() && rec.running.is_none(), "{rec:?}");
    assert!(w.on(S1).is_empty());
    // Another address: the next apply joins, and the failure is cleared.
    w.converge(S1, &[wanted(&w.nets[0], &["10.0.0.11"])], 10)
        .await;
    assert_eq!(w.record(S1).unwrap().failed, None);
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_refused_because_another_writer_joined_first_is_not_the_applys() {
    let w = World::new().await;
    // The apply's join waits in the simulator; meanwhile another writer
    // (a person, another tool) puts the server on the network.
    w.sim.inject("POST", JOIN, Fault::Latency(1_500), 1);
    let want = vec![wanted(&w.nets[0], &["10.0.0.10"])];
    let net = w.nets[0].clone();
    let other = async {
        // The fault is taken when the apply's join arrives.
        while w.sim.pending_faults() > 0 {
            tokio::task::yield_now().await;
        }
        w.with(move |p, _| {
            metal_ipam_core::cloud::Memberships::join(p, S1, &net, &["10.0.0.10".to_string()])
        })
        .await
    };
    let (applied, joined) = tokio::join!(w.apply(S1, want.clone()), other);
    joined.expect("the other writer's join");
    assert!(applied.is_ok(), "the refusal is read as done: {applied:?}");
    let rec = w.record(S1).unwrap();
    assert!(rec.joined.is_empty(), "not the apply's: {rec:?}");
    w.converge(S1, &want, 10).await;
    // The release leaves it alone.
    assert_eq!(w.converge(S1, &[], 5).await, 0);
    assert_eq!(w.on(S1), [(w.nets[0].clone(), vec!["10.0.0.10".into()])]);
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_deleted_mid_apply_is_forgotten() {
    let w = World::new().await;
    w.sim
        .inject("POST", JOIN, Fault::DeleteServerBefore(S1.into()), 1);
    let want = vec![wanted(&w.nets[0], &["10.0.0.10"])];
    let e = w.apply(S1, want.clone()).await.unwrap_err();
    assert_eq!(e.status(), 404, "{e:?}");
    let e = w.apply(S1, want).await.unwrap_err();
    assert_eq!(e.reason(), "DeviceNotFound", "{e:?}");
    assert!(w.record(S1).is_none(), "the record is forgotten");
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_holding_the_lease_makes_this_one_wait_without_a_call() {
    let w = World::new().await;
    let now = w.env.now();
    let (kv, env) = (w.kv.clone(), w.env.clone());
    tokio::task::spawn_blocking(move || {
        let ctx = Ctx::auto(&*kv, &*env);
        assert_eq!(
            DeviceRecord::new(&ctx, S1)
                .take_lease("other", now)
                .unwrap(),
            None
        );
    })
    .await
    .unwrap();
    let from = w.sim.requests().len();
    let r = w
        .apply(S1, vec![wanted(&w.nets[0], &["10.0.0.10"])])
        .await
        .unwrap();
    assert!(
        matches!(&r.phase, ApplyPhase::InProgress { waiting, .. } if waiting.contains("another instance")),
        "{r:?}"
    );
    assert_eq!(w.writes_since(from), 0);
    assert!(w.on(S1).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_leaves_only_what_the_apply_joined_and_an_edit_moves_addresses() {
    let w = World::new().await;
    // The server's own network, joined before any profile (not the apply's).
    let own = w.nets[1].clone();
    w.with(move |p, _| {
        metal_ipam_core::cloud::Memberships::join(p, S1, &own, &["10.1.0.9".to_string()])
    })
    .await
    .unwrap();
    w.sim.settle();
    // The profile: the first network, and the own one with its address.
    let want = vec![
        wanted(&w.nets[0], &["10.0.0.10"]),
        wanted(&w.nets[1], &["10.1.0.9"]),
    ];
    assert_eq!(w.converge(S1, &want, 10).await, 1, "one join");
    assert_eq!(w.record(S1).unwrap().joined, [w.nets[0].clone()]);
    // The record, and the example of one, follow the record's JSON Schema.
    let kv_schema = metal_ipam_tests::schema::repo_root().join("kv-schema");
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(kv_schema.join(f)).unwrap()).unwrap()
    };
    let key = metal_ipam_core::kv::keys::net_device(S1);
    let rec: serde_json::Value = serde_json::from_slice(&w.kv.get(&key).unwrap().unwrap()).unwrap();
    let schema = read("net-device-record.schema.json");
    for v in [rec, read("examples/net-device-phoenixnap.json")] {
        metal_ipam_tests::schema::validate(&schema, &v).unwrap_or_else(|e| panic!("{e:?}\n{v:#}"));
    }
    // Edited: another address on the first network: one PATCH.
    let edited = vec![wanted(&w.nets[0], &["10.0.0.12", "10.0.0.13"])];
    assert_eq!(w.converge(S1, &edited, 10).await, 1, "one address change");
    assert_eq!(
        w.on(S1),
        [
            (
                w.nets[0].clone(),
                vec!["10.0.0.12".into(), "10.0.0.13".into()]
            ),
            (w.nets[1].clone(), vec!["10.1.0.9".into()]),
        ]
    );
    // Released: the first network left; the server's own stays.
    assert_eq!(w.converge(S1, &[], 10).await, 1, "one leave");
    assert_eq!(w.on(S1), [(w.nets[1].clone(), vec!["10.1.0.9".into()])]);
    assert!(w.record(S1).unwrap().joined.is_empty());
    // Released again: nothing to do.
    assert_eq!(w.converge(S1, &[], 2).await, 0);
    w.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn months_of_applies_and_releases_leave_a_record_that_does_not_grow() {
    let w = World::new().await;
    w.sim.set_membership_reads(0);
    let mut sizes = Vec::new();
    for day in 0..150u32 {
        // Addresses of one length, so equal histories are equal in size.
        let ip = format!("10.0.0.{}", 100 + day % 100);
        w.converge(S1, &[wanted(&w.nets[0], &[ip.as_str()])], 5)
            .await;
        w.converge(S1, &[], 5).await;
        w.env.set_now(w.env.now() + 86_400);
        let rec = w.record(S1).unwrap();
        assert!(
            rec.history.len() <= HISTORY && rec.joined.is_empty(),
            "{rec:?}"
        );
        let key = metal_ipam_core::kv::keys::net_device(S1);
        sizes.push(w.kv.get(&key).unwrap().unwrap().len());
    }
    // Once the history is full, the record's size stays put (but for the
    // digits of its clock and revision counters).
    let full = &sizes[HISTORY..];
    assert!(
        full.iter().all(|s| s.abs_diff(full[0]) <= 8),
        "{:?}",
        &sizes[HISTORY..]
    );
    assert!(w.on(S1).is_empty());
    let keys: Vec<String> = w.kv.dump().into_keys().collect();
    assert!(keys.len() <= 4, "{keys:?}");
    w.assert_clean();
}
