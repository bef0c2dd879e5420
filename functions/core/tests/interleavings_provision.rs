//! The interleaving checker over the Metal progress record: creation and
//! teardown of a VRF-backed pool's Metal resources by several instances at
//! once, every KV operation a yield point, a crash possible before any of
//! them (so also between a Metal call and the KV operation after it), on
//! each backend's real compare-and-swap semantics (see `interleavings.rs`).
//!
//! The instances run the step's real code: [`provision`] and
//! [`deprovision`] (`provision::step`), against Metal as a ledger (an
//! [`HttpClient`] answering the VRF calls the steps make: create, list by
//! tag, delete). The pool's spec creates its VRF and adopts a reservation
//! Metal does not have, so a provisioning instance stops (422) after the
//! VRF: each schedule is about the VRF's creation racing its teardown. The
//! registration of a pool in the store is checked racing its deletion too
//! (`put_provisioned_pool` against `begin_teardown` and
//! `delete_provisioned_pool`, as `capi::vrf` runs them).
//!
//! Every instance runs at the same instant (within any intent's lease, as
//! concurrent deliveries do), so a teardown meeting a creation in flight
//! waits for it. One set of schedules breaks that assumption on purpose: a
//! teardown after the lease while the creation is still running.
//!
//! Invariants, checked at every store write and every Metal creation:
//! - the record's retired uids only grow, and no live record belongs to a
//!   retired uid: a tombstone is never replaced for its uid;
//! - nothing is created in Metal for a uid once its tombstone is written;
//! - a live record holds only resources created for its uid (a new uid
//!   gets a new record).
//!
//! And after each schedule, once recovery ran (after the lease: the
//! deleted pool's teardown to its tombstone, the live pool's provisioning
//! to its VRF):
//! - nothing created for a deleted pool is left in Metal (its VRF's
//!   decision is `Delete`);
//! - a live pool holds exactly one VRF, created for it, the recorded one;
//! - without a crash, a teardown that answered `Gone` left nothing, and no
//!   instance failed but as the step may (the 422 of the missing
//!   reservation, `MetalTearingDown`, `MetalPoolDeleted`).
//!
//! The number of schedules explored is printed.

#[path = "interleavings/provision_kit.rs"]
mod provision_kit;
#[path = "interleavings/sched.rs"]
mod sched;

use std::collections::BTreeSet;
use std::sync::Mutex;

use metal_ipam_core::error::Error;
use metal_ipam_core::ipam::ops;
use metal_ipam_core::ipam::pool::PoolObject;
use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
use metal_ipam_core::kv::{keys, Ctx};
use metal_ipam_core::metal::client::{Metal, MetalConfig};
use metal_ipam_core::metal::retry::RetryPolicy;
use metal_ipam_core::ports::http::{HttpClient, TransportError};
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::ports::Env;
use metal_ipam_core::provision::plan::{Decided, Progress, INTENT_LEASE_S};
use metal_ipam_core::provision::record::ProgressRecord;
use metal_ipam_core::provision::step::{deprovision, provision, ProvisionPhase};
use metal_ipam_core::provision::target::{tag_for, Target};
use metal_ipam_core::provision::transitions::{may_register, PoolRecord};
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::{json, Value};

use provision_kit::{
    caught, ctx, pct, pool, stored, stuck, Explore, InFlight, Verdict, Watched, BACKENDS, LATER,
    NOW, PAIR, U1, U2, WIDE,
};
use sched::{Chooser, Pct, SchedEnv};

/// The pool's spec: the VRF created, the reservation adopted (Metal has
/// none, so provisioning stops after the VRF).
fn spec() -> MetalSpec {
    let mut s = MetalSpec {
        metro: "da".into(),
        ..MetalSpec::default()
    };
    s.vrf.ip_ranges = vec!["10.10.0.0/16".into()];
    s.reservation.id = Some("8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11".into());
    s
}

fn config() -> MetalConfig {
    MetalConfig {
        base_url: "http://metal.test/metal/v1".into(),
        token: "t".into(),
        project_id: "p1".into(),
        retry: RetryPolicy::default(),
    }
}

/// The uid a resource was created for, from its tags.
fn uid_of(tags: &[String]) -> Option<String> {
    tags.iter()
        .find_map(|t| t.strip_prefix("metal-ipam.dev/pool-uid="))
        .map(str::to_string)
}

/// Metal's VRFs, created and deleted.
#[derive(Debug, Clone)]
struct Vrf {
    id: String,
    tags: Vec<String>,
    alive: bool,
}

/// Metal as a ledger of VRFs, answering the requests the steps make; and
/// the watcher of the invariants checked as they happen.
struct Ledger<'a> {
    vrfs: Mutex<Vec<Vrf>>,
    kv: &'a MemKv,
    violations: &'a Mutex<Vec<String>>,
}

impl Ledger<'_> {
    fn alive(&self) -> Vec<Vrf> {
        self.vrfs
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v.alive)
            .cloned()
            .collect()
    }

    fn reply(status: u16, body: Option<Value>) -> http::Response<Vec<u8>> {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(bytes)
            .unwrap()
    }
}

impl HttpClient for Ledger<'_> {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        let path = req.uri().path().trim_start_matches("/metal/v1").to_string();
        let method = req.method().as_str().to_string();
        let mut vrfs = self.vrfs.lock().unwrap();
        Ok(match (method.as_str(), path.as_str()) {
            ("POST", "/projects/p1/vrfs") => {
                let body: Value = serde_json::from_slice(req.body()).unwrap();
                let tags: Vec<String> = serde_json::from_value(body["tags"].clone()).unwrap();
                let uid = uid_of(&tags);
                // Nothing is created for a uid once its tombstone is written.
                if let (Some(u), Some(p)) = (&uid, stored(self.kv)) {
                    if p.retired.contains(u) {
                        self.violations
                            .lock()
                            .unwrap()
                            .push(format!("a VRF created for {u} after its tombstone"));
                    }
                }
                let id = format!("vrf-{}", vrfs.len());
                vrfs.push(Vrf {
                    id: id.clone(),
                    tags: tags.clone(),
                    alive: true,
                });
                Self::reply(201, Some(json!({"id": id, "name": "p", "tags": tags})))
            }
            ("GET", "/projects/p1/vrfs") => {
                let list: Vec<Value> = vrfs
                    .iter()
                    .filter(|v| v.alive)
                    .map(|v| json!({"id": v.id, "tags": v.tags}))
                    .collect();
                Self::reply(200, Some(json!({ "vrfs": list })))
            }
            ("DELETE", p) if p.starts_with("/vrfs/") => {
                let id = &p["/vrfs/".len()..];
                match vrfs.iter_mut().find(|v| v.id == id && v.alive) {
                    Some(v) => {
                        v.alive = false;
                        Self::reply(204, None)
                    }
                    None => Self::reply(404, Some(json!({"error": "Not found"}))),
                }
            }
            // The adopted reservation does not exist.
            ("GET", p) if p.starts_with("/ips/") => {
                Self::reply(404, Some(json!({"error": "Not found"})))
            }
            _ => panic!("unexpected Metal request {method} {path}"),
        })
    }
}

/// What one instance does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// The provision step for incarnation `uid`.
    Provision(&'static str),
    /// The teardown of incarnation `uid` (its object is deleting).
    Teardown(&'static str),
    /// A mutation: the VRF's creation as the step did before issue 17 (its
    /// writes start from an empty record over a tombstone, and ignore
    /// whose the record is and whether it is being torn down). The checker
    /// must catch it.
    Reviving(&'static str),
}

/// The store a schedule starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// U1's record, holding nothing yet.
    Empty,
    /// U1's record holding its VRF.
    Held,
    /// U1's record with a crashed creator's intent, whose VRF Metal made
    /// (its answer lost), recorded at `NOW - lease`.
    StaleIntent,
    /// U1's record holding its VRF, its teardown started (U1 is deleted;
    /// U2 is its re-creation).
    Deleting,
}

fn decided() -> Decided {
    Decided::of(&spec(), Resource::Vrf)
}

/// Prepares `start` in `kv`, Metal's ledger in `vrfs`.
fn prepare(kv: &MemKv, vrfs: &Mutex<Vec<Vrf>>, start: Start) {
    let env = TestEnv::at(NOW - INTENT_LEASE_S);
    let c = ctx(kv, &env);
    let id = pool();
    // The pool is listed in the pool index from the start, so the step's
    // listing is one read (a yield point) and writes nothing there: the
    // index's own races are `interleavings_index.rs`'s.
    metal_ipam_core::ipam::index::list_metal(&c, &id).unwrap();
    let tags = vec![tag_for(&id, Some(U1))];
    assert!(PoolRecord::new(&c, &id, Some(U1))
        .claim_intent(Resource::Vrf, "ghost", NOW - INTENT_LEASE_S, &decided())
        .unwrap());
    if start == Start::Empty {
        PoolRecord::new(&c, &id, Some(U1))
            .withdraw_intent(Resource::Vrf, "ghost")
            .unwrap();
        return;
    }
    vrfs.lock().unwrap().push(Vrf {
        id: "vrf-ghost".into(),
        tags,
        alive: true,
    });
    if start == Start::StaleIntent {
        return;
    }
    assert!(PoolRecord::new(&c, &id, Some(U1))
        .record_created(Resource::Vrf, "vrf-ghost", &decided())
        .unwrap());
    if start == Start::Deleting {
        PoolRecord::new(&c, &id, Some(U1)).begin_teardown().unwrap();
    }
}

/// Whether an instance's error is one the step may answer here.
fn expected(e: &Error) -> bool {
    // A crash is the store failing under the instance.
    matches!(
        e.reason(),
        "Invalid"
            | "MetalTearingDown"
            | "MetalPoolDeleted"
            | "StoreUnavailable"
            | "MetalOutcomeUnknown"
    )
}

/// Runs `op` on `kv` at `env`'s time, Metal being `ledger`.
fn run_op<K: KvStore>(kv: &K, env: &dyn Env, ledger: &Ledger<'_>, op: Op) -> String {
    let spec = spec();
    let id = pool();
    let cfg = config();
    let http = InFlight { ledger, kv };
    let metal: Metal<'_, InFlight<'_, Ledger<'_>, K>, dyn Env + '_> = Metal::new(&http, &cfg, env);
    let c = ctx(kv, env);
    match op {
        Op::Provision(u) => {
            let t = Target::new(&id, &spec, Some(u), None);
            match provision(&c, &metal, &t) {
                Ok(p) => format!("provision {u}: {:?}", p.phase),
                Err(e) if expected(&e) => format!("provision {u}: {}", e.reason()),
                Err(e) => format!("UNEXPECTED provision {u}: {e}"),
            }
        }
        Op::Teardown(u) => {
            let t = Target::new(&id, &spec, Some(u), None);
            match deprovision(&c, &metal, &t) {
                Ok(p) => format!("teardown {u}: {:?}", p.phase),
                Err(e) if expected(&e) => format!("teardown {u}: {}", e.reason()),
                Err(e) => format!("UNEXPECTED teardown {u}: {e}"),
            }
        }
        Op::Reviving(u) => {
            let t = Target::new(&id, &spec, Some(u), None);
            match reviving_creator(&c, &metal, &t) {
                Ok(done) => format!("reviving {u}: {done}"),
                Err(e) => format!("reviving {u}: {}", e.reason()),
            }
        }
    }
}

/// The record as the step before issue 17 read it for a decision: a
/// tombstone as no record at all.
fn revived(cur: Option<&Progress>) -> Progress {
    cur.filter(|p| !p.deleted).cloned().unwrap_or_default()
}

/// The mutation [`Op::Reviving`]: intent, creation, recording, each write
/// reviving a tombstone.
fn reviving_creator<K: KvStore, H: HttpClient + ?Sized>(
    c: &Ctx<'_, K>,
    metal: &Metal<'_, H, dyn Env + '_>,
    t: &Target<'_>,
) -> metal_ipam_core::error::Result<String> {
    use metal_ipam_core::kv::protocol::{update_record, Decision};
    use metal_ipam_core::provision::plan::{Held, Intent};
    let now = c.env.now();
    let won = update_record::<K, ProgressRecord, bool>(c, t.id, |cur| {
        let mut p = revived(cur);
        if p.vrf.is_some() || p.intent.is_some() {
            return Ok(Decision::Done(false));
        }
        p.intent = Some(Intent {
            resource: Resource::Vrf,
            token: "mutant".into(),
            at: now,
            decided: Some(decided()),
        });
        Ok(Decision::Write(Box::new(p), true))
    })?;
    if !won {
        return Ok("another creates".into());
    }
    let vrf = metal
        .create_vrf(&metal_ipam_core::metal::model::VrfCreateInput {
            name: "p".into(),
            metro: "da".into(),
            description: None,
            ip_ranges: vec![],
            local_asn: None,
            tags: t.tags(),
        })
        .map_err(Error::from)?;
    update_record::<K, ProgressRecord, ()>(c, t.id, |cur| {
        let mut p = revived(cur);
        if p.vrf.is_some() {
            return Ok(Decision::Done(()));
        }
        p.set(
            Resource::Vrf,
            Some(Held {
                id: vrf.id.clone(),
                created: true,
                decided: Some(decided()),
            }),
        );
        Ok(Decision::Write(Box::new(p), ()))
    })?;
    Ok(format!("created {}", vrf.id))
}

/// Recovery after the lease, single-threaded: the deleted incarnation's
/// teardown to its tombstone, the live one's provisioning to its VRF; then
/// the end-state invariants. `kv` is the watched store; `raw` the same,
/// unwatched.
fn recover_and_check(
    kv: &Watched<'_>,
    raw: &MemKv,
    ledger: &Ledger<'_>,
    ops: &[Op],
    answers: &[String],
    relaxed: bool,
) -> Verdict {
    let env = TestEnv::at(LATER + 1);
    let cfg = config();
    let http = InFlight { ledger, kv };
    let metal: Metal<'_, InFlight<'_, Ledger<'_>, Watched<'_>>, dyn Env + '_> =
        Metal::new(&http, &cfg, &env as &dyn Env);
    if let Some(a) = answers.iter().find(|a| a.starts_with("UNEXPECTED")) {
        return Err(a.clone());
    }
    let deleted: BTreeSet<&str> = ops
        .iter()
        .filter_map(|o| match o {
            Op::Teardown(u) => Some(*u),
            _ => None,
        })
        .collect();
    let live: BTreeSet<&str> = ops
        .iter()
        .filter_map(|o| match o {
            Op::Provision(u) | Op::Reviving(u) if !deleted.contains(u) => Some(*u),
            _ => None,
        })
        .collect();
    // A teardown that answered Gone left nothing of its uid, and nothing
    // was made for it since.
    for a in answers.iter().filter(|_| !relaxed) {
        if let Some(u) = deleted.iter().find(|u| a == &format!("teardown {u}: Gone")) {
            let left: Vec<_> = ledger
                .alive()
                .into_iter()
                .filter(|v| uid_of(&v.tags).as_deref() == Some(u))
                .collect();
            if !left.is_empty() {
                return Err(format!("teardown of {u} answered Gone, left {left:?}"));
            }
        }
    }
    if stuck(raw) {
        return if ledger.alive().iter().all(|v| v.id == "vrf-ghost") {
            Ok(())
        } else {
            Err(format!("created {:?} without a record", ledger.alive()))
        };
    }
    let (id, spec) = (pool(), spec());
    for round in 0..8 {
        let mut settled = true;
        for u in &deleted {
            let t = Target::new(&id, &spec, Some(u), None);
            match deprovision(&ctx(kv, &env), &metal, &t).map(|r| r.phase) {
                Ok(ProvisionPhase::Gone) => {}
                Ok(_) => settled = false,
                Err(e) => return Err(format!("recovery, teardown {u} (round {round}): {e}")),
            }
        }
        for u in &live {
            let t = Target::new(&id, &spec, Some(u), None);
            match provision(&ctx(kv, &env), &metal, &t) {
                // The missing reservation: the VRF is done.
                Err(e) if e.reason() == "Invalid" => {}
                Ok(_) => settled = false,
                Err(e) => return Err(format!("recovery, provision {u} (round {round}): {e}")),
            }
        }
        if settled {
            break;
        }
    }
    let p = stored(raw);
    for u in &deleted {
        let left: Vec<_> = ledger
            .alive()
            .into_iter()
            .filter(|v| uid_of(&v.tags).as_deref() == Some(u))
            .collect();
        if !left.is_empty() {
            return Err(format!(
                "LEAK after recovery, {u}'s {left:?} left in Metal; record {p:?}"
            ));
        }
        if !p.as_ref().is_some_and(|p| p.retired.iter().any(|r| r == u)) {
            return Err(format!("after recovery, {u} not retired: {p:?}"));
        }
    }
    for u in &live {
        let mine: Vec<_> = ledger
            .alive()
            .into_iter()
            .filter(|v| uid_of(&v.tags).as_deref() == Some(u))
            .collect();
        let held = p
            .as_ref()
            .filter(|p| !p.deleted && p.uid.as_deref() == Some(u))
            .and_then(|p| p.vrf.clone())
            .map(|h| h.id);
        if mine.len() != 1 || held.as_ref() != Some(&mine[0].id) {
            return Err(format!(
                "after recovery, {u} has {mine:?} in Metal, recorded {held:?}; record {p:?}"
            ));
        }
    }
    Ok(())
}

/// Runs one schedule of `ops` from `start` (the later ones at `late` when
/// given: past the lease while the first still runs).
/// What a schedule that breaks the lease assumption showed.
#[derive(Debug, Default, Clone, Copy)]
struct Broken {
    /// A VRF was created for a uid after its tombstone.
    late_creation: bool,
    /// A VRF of the deleted pool was left in Metal (only after a crash).
    leaked: bool,
}

fn one_schedule(
    backend: Backend,
    start: Start,
    ops: &[Op],
    late: Option<u64>,
    chooser: &mut dyn Chooser,
    crashes: usize,
) -> Verdict {
    one_schedule_seen(backend, start, ops, late, chooser, crashes, false).map(|_| ())
}

/// [`one_schedule`]; `relaxed` (a schedule breaking the lease assumption)
/// counts creations after the tombstone, and leaks after a crash, instead
/// of failing on them.
fn one_schedule_seen(
    backend: Backend,
    start: Start,
    ops: &[Op],
    late: Option<u64>,
    chooser: &mut dyn Chooser,
    crashes: usize,
    relaxed: bool,
) -> std::result::Result<Broken, String> {
    let mut broken = Broken::default();
    let kv = MemKv::new(backend);
    let violations = Mutex::new(Vec::new());
    let vrfs = Mutex::new(Vec::new());
    prepare(&kv, &vrfs, start);
    let ledger = Ledger {
        vrfs,
        kv: &kv,
        violations: &violations,
    };
    let owner_of = |id: &str| {
        let vrfs = ledger.vrfs.lock().unwrap();
        vrfs.iter()
            .find(|v| v.id == id)
            .and_then(|v| uid_of(&v.tags))
    };
    let watched = Watched::new(&kv, &violations, &owner_of);
    let envs: Vec<SchedEnv> = (0..ops.len())
        .map(|i| {
            let at = if i > 0 { late.unwrap_or(NOW) } else { NOW };
            SchedEnv(TestEnv::seeded(at, i as u64 + 1))
        })
        .collect();
    let fns: Vec<_> = ops
        .iter()
        .zip(&envs)
        .map(|(op, env)| {
            let (ledger, op) = (&ledger, *op);
            move |k: &sched::SchedKv<'_, Watched<'_>>| run_op(k, env, ledger, op)
        })
        .collect();
    let (answers, trace) = sched::run(&watched, fns, chooser, crashes, 4_000);
    let take = |broken: &mut Broken| {
        let mut v = violations.lock().unwrap();
        if relaxed {
            let before = v.len();
            v.retain(|m| !m.contains("after its tombstone"));
            broken.late_creation |= v.len() != before;
        }
        v.clone()
    };
    let v = take(&mut broken);
    if !v.is_empty() {
        return Err(format!(
            "{backend:?} from {start:?}, {ops:?}: {v:?}\nanswers: {answers:?}"
        ));
    }
    match recover_and_check(&watched, &kv, &ledger, ops, &answers, relaxed) {
        Ok(()) => {}
        Err(e) if relaxed && trace.crashed && e.starts_with("LEAK") => broken.leaked = true,
        Err(e) => {
            return Err(format!(
                "{backend:?} from {start:?}, {ops:?}: {e}\nanswers: {answers:?}"
            ))
        }
    }
    let v = take(&mut broken);
    if !v.is_empty() {
        return Err(format!(
            "{backend:?} from {start:?}, {ops:?}, in recovery: {v:?}"
        ));
    }
    Ok(broken)
}

/// Explores `ops` from `start` as `plan` says; returns the number of
/// schedules.
fn explore(start: Start, ops: &[Op], late: Option<u64>, plan: &[(Backend, Explore)]) -> usize {
    provision_kit::explore(
        &format!("provision interleavings: {ops:?} from {start:?}"),
        plan,
        |backend, chooser, crashes| one_schedule(backend, start, ops, late, chooser, crashes),
    )
}

use Op::{Provision, Teardown};

/// Two deliveries of the same pool event: the VRF is created once.
#[test]
fn two_instances_create_the_vrf_once() {
    assert!(explore(Start::Empty, &[Provision(U1), Provision(U1)], None, &PAIR) > 1_000);
}

/// A creation racing the pool's teardown (create ∥ delete): the teardown
/// waits for the creation, then tears it down; nothing is left, nothing is
/// created after the tombstone.
#[test]
fn a_creation_racing_the_teardown_leaves_nothing() {
    assert!(explore(Start::Empty, &[Provision(U1), Teardown(U1)], None, &PAIR) > 1_000);
}

/// Two teardowns at once (delete ∥ delete) of a pool holding its VRF:
/// sampled on every backend. Each teardown also goes through the pool
/// index (its Metal entry unlisted, its deletion settled), which puts every
/// schedule of two of them out of reach (over 300 s on SQLite alone
/// without a crash); the index's own races are `interleavings_index.rs`'s.
#[test]
fn two_teardowns_delete_everything_once() {
    let plan = [
        (Backend::SpinSqlite, Explore::Pct(1500)),
        (Backend::Redis, Explore::Pct(300)),
        (Backend::RedisSpin36, Explore::Pct(300)),
    ];
    assert!(explore(Start::Held, &[Teardown(U1), Teardown(U1)], None, &plan) > 1_000);
}

/// A crashed creator's intent (its VRF made, the answer lost): a
/// provisioning and a teardown after its lease.
#[test]
fn a_crashed_creation_is_found_by_a_teardown_racing_a_provision() {
    assert!(
        explore(
            Start::StaleIntent,
            &[Provision(U1), Teardown(U1)],
            None,
            &WIDE
        ) > 1_000
    );
}

/// The pool re-created (a new uid) while a stale instance still tears the
/// old one down, and three instances at once: sampled.
#[test]
fn a_re_created_pool_and_triples_under_pct_schedules() {
    explore(
        Start::Deleting,
        &[Provision(U2), Teardown(U1)],
        None,
        &pct(200),
    );
    explore(Start::Held, &[Provision(U2), Teardown(U1)], None, &pct(200));
    explore(
        Start::Empty,
        &[Provision(U1), Teardown(U1), Teardown(U1)],
        None,
        &pct(100),
    );
    explore(
        Start::Empty,
        &[Provision(U1), Provision(U1), Teardown(U1)],
        None,
        &pct(100),
    );
}

/// The pool object registered by the provision step (its block is known).
fn pool_object() -> PoolObject {
    PoolObject::parse(
        &pool(),
        &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
            "metadata": {"name": "p", "namespace": "ns", "uid": U1},
            "spec": {"metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
                "reservation": {"network": "10.10.1.0", "cidr": 29}}}}),
    )
    .unwrap()
}

/// A mutation of the registration race.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    /// As `capi::vrf` runs it.
    None,
    /// The registration does not read the progress record.
    NoGate,
    /// The deletion is the plain one, writing nothing over no pool.
    PlainDelete,
}

fn register<K: KvStore>(kv: &K, env: &dyn Env) -> String {
    register_as(kv, env, Mutation::None)
}

fn register_as<K: KvStore>(kv: &K, env: &dyn Env, m: Mutation) -> String {
    let c = ctx(kv, env);
    let id = pool();
    let may = || {
        if m == Mutation::NoGate {
            return Ok(());
        }
        may_register(kv, &id, Some(U1))
    };
    let block = ("10.10.1.0".parse().unwrap(), 29);
    match ops::put_provisioned_pool(&c, pool_object(), block, &[], &may) {
        Ok((o, _)) => format!("registered: {o:?}"),
        Err(e) => format!("refused: {}", e.reason()),
    }
}

/// The start of a teardown as `capi::vrf` runs it: mark it, then delete the
/// pool from the store.
fn unregister<K: KvStore>(kv: &K, env: &dyn Env) -> String {
    unregister_as(kv, env, Mutation::None)
}

fn unregister_as<K: KvStore>(kv: &K, env: &dyn Env, m: Mutation) -> String {
    let c = ctx(kv, env);
    let id = pool();
    let step = PoolRecord::new(&c, &id, Some(U1))
        .begin_teardown()
        .and_then(|_| {
            if m == Mutation::PlainDelete {
                return ops::delete_pool(&c, &id).map(|_| ());
            }
            ops::delete_provisioned_pool(&c, &id)
        });
    match step {
        Ok(()) => "deleted".into(),
        Err(e) => format!("failed: {}", e.reason()),
    }
}

/// One instance of the registration race.
type Instance<'a> = Box<dyn FnOnce(&sched::SchedKv<'_, MemKv>) -> String + Send + 'a>;

/// One schedule of a registration racing the start of a teardown, the pool
/// registered already or not.
fn one_registration(backend: Backend, registered: bool, chooser: &mut dyn Chooser) -> Verdict {
    one_registration_as(backend, registered, chooser, Mutation::None)
}

fn one_registration_as(
    backend: Backend,
    registered: bool,
    chooser: &mut dyn Chooser,
    m: Mutation,
) -> Verdict {
    let kv = MemKv::new(backend);
    let vrfs = Mutex::new(Vec::new());
    prepare(&kv, &vrfs, Start::Held);
    let env = SchedEnv(TestEnv::seeded(NOW, 7));
    if registered {
        assert!(register(&kv, &env).starts_with("registered"));
    }
    let fns: Vec<Instance<'_>> = vec![
        Box::new(|k| register_as(k, &env, m)),
        Box::new(|k| unregister_as(k, &env, m)),
    ];
    let (answers, _) = sched::run(&kv, fns, chooser, 1, 2_000);
    let live = ops::get_pool(&kv, &pool(), 0).map_err(|e| e.to_string())?;
    // Once the deletion returned, no registration is left (none landed
    // after it).
    if answers[1] == "deleted" && live.is_some() {
        return Err(format!(
            "{backend:?}: registered after the deletion: {answers:?}"
        ));
    }
    // Recovery: the teardown's start again, then nothing registers.
    if stuck(&kv) {
        return Ok(());
    }
    let pool_stuck = kv.get(&keys::pool(&pool())).unwrap().is_none()
        && kv.get(&keys::pool_init(&pool())).unwrap().is_some();
    if pool_stuck {
        return Ok(()); // a crashed creation-guard winner: nothing registers
    }
    let again = unregister(&kv, &env);
    let late = register(&kv, &env);
    if again != "deleted"
        || !late.starts_with("refused")
        || ops::get_pool(&kv, &pool(), 0).unwrap().is_some()
    {
        return Err(format!(
            "{backend:?}: after recovery {again}, {late}: {answers:?}"
        ));
    }
    Ok(())
}

/// A registration (the pool ready) racing its teardown's start: the pool is
/// never left registered once the teardown deleted it. Sampled with PCT on
/// every backend: the registration's grant and settle in the pool index
/// put every schedule out of reach (over 10 minutes on SQLite alone); the
/// index's own races are `interleavings_index.rs`'s.
#[test]
fn a_registration_never_outlives_the_teardowns_deletion_under_pct_schedules() {
    let mut total = 0;
    for backend in BACKENDS {
        let seeds = if backend == Backend::SpinSqlite {
            1500
        } else {
            400
        };
        for registered in [false, true] {
            for seed in 0..seeds {
                total += 1;
                let mut pct = Pct::new(seed, 3, 60);
                if let Err(v) = one_registration(backend, registered, &mut pct) {
                    panic!("{v}\nPCT seed {seed}");
                }
            }
        }
    }
    println!("provision interleavings: {total} PCT schedules of a registration racing a teardown");
    assert!(total > 100);
}

/// The lease assumption broken on purpose: the teardown runs after the
/// creation's lease while the creation is still in flight. It finds
/// nothing, withdraws the intent and writes the tombstone; the creation
/// that lands after is refused its recording and deleted by its creator.
/// Creations after the tombstone happen (the assumption is what excludes
/// them); a VRF is left in Metal only when the creator crashes between its
/// creation and its deletion. Sampled with PCT on each backend, without a
/// crash and with one; counts printed.
#[test]
fn a_creation_outliving_its_lease_is_deleted_by_its_creator_unless_it_crashes() {
    let ops = [Provision(U1), Teardown(U1)];
    let mut seen = [0usize; 3];
    let count = |seen: &mut [usize; 3], r: std::result::Result<Broken, String>, what: &str| match r
    {
        Ok(b) => {
            seen[0] += 1;
            seen[1] += usize::from(b.late_creation);
            seen[2] += usize::from(b.leaked);
        }
        Err(v) => panic!("{v}\n{what}"),
    };
    // Sampled on every backend, without a crash (nothing may be left) and
    // with one.
    for crashes in [0, 1] {
        for backend in BACKENDS {
            for seed in 0..200 {
                let mut pct = Pct::new(seed, 3, 60);
                let r = one_schedule_seen(
                    backend,
                    Start::Empty,
                    &ops,
                    Some(LATER + 1),
                    &mut pct,
                    crashes,
                    true,
                );
                count(&mut seen, r, &format!("{backend:?} PCT seed {seed}"));
            }
        }
        if crashes == 0 {
            assert_eq!(seen[2], 0, "no leak without a crash");
        }
    }
    println!(
        "provision interleavings: {} schedules with the lease broken: {} created after the tombstone, {} left a VRF (after a crash)",
        seen[0], seen[1], seen[2]
    );
    assert!(seen[1] > 0, "the broken assumption was exercised");
}

/// The checker catches the bugs it is for: the step's writes as they were
/// before issue 17 (a tombstone revived), and a registration or a deletion
/// without the linearisation (no read of the progress record in the
/// registration's decision; a deletion that writes nothing over a pool
/// already deleted or never registered).
#[test]
fn mutations_are_caught() {
    assert!(
        caught(|d| one_schedule(
            Backend::SpinSqlite,
            Start::Empty,
            &[Op::Reviving(U1), Teardown(U1)],
            Some(LATER + 1),
            d,
            0
        )),
        "a revived tombstone"
    );
    for mutation in [Mutation::NoGate, Mutation::PlainDelete] {
        let found = caught(|d| one_registration_as(Backend::SpinSqlite, false, d, mutation));
        assert!(found, "{mutation:?}");
    }
}
