//! The interleaving checker over the Metal progress record: the store
//! decisions of the provision step (`claim_intent`, `record_created`,
//! `withdraw_intent`) run by two or three instances at once, every KV
//! operation a yield point, a crash possible before any of them, on each
//! backend's real compare-and-swap semantics (see `interleavings.rs`).
//!
//! Metal is a ledger of created resources: an instance "creates" (appends
//! its own id) only when its intent was recorded, as the step does; a
//! crash before its next KV operation is a crash after Metal created the
//! resource and before the store recorded it. Each instance handles the
//! same pool event within the intent's lease, as concurrent deliveries do.
//!
//! After each schedule:
//! - at most one resource was created (never two, whatever the schedule);
//! - without a crash exactly one was, and it is the one recorded, with no
//!   intent left;
//! - recovery, as the step runs it once the lease has passed (look for an
//!   unrecorded creation by tag, else withdraw the intent and create),
//!   ends with exactly one resource, the recorded one.
//!
//! The number of schedules explored is printed.

#[path = "interleavings/sched.rs"]
mod sched;

use std::sync::Mutex;

use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
use metal_ipam_core::kv::{Ctx, SwapPolicy};
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::ports::Env;
use metal_ipam_core::provision::plan::{self, Action, INTENT_LEASE_S};
use metal_ipam_core::provision::step::{
    claim_intent, read_progress, record_created, withdraw_intent,
};
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};

use sched::{Chooser, Dfs, Pct, SchedEnv};

const NOW: u64 = 1_000;

fn pool() -> PoolId {
    PoolId::namespaced("ns", "p")
}

/// Metal, as far as the protocol can tell: the resources created, by id.
#[derive(Default)]
struct Ledger(Mutex<Vec<String>>);

impl Ledger {
    fn create(&self, id: String) {
        self.0.lock().unwrap().push(id);
    }
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

fn ctx<'a, K: KvStore>(kv: &'a K, env: &'a SchedEnv) -> Ctx<'a, K> {
    Ctx {
        kv,
        env,
        swap_policy: SwapPolicy::Auto,
    }
}

/// One instance handling the event: the step's Create round for the VRF.
/// Returns what it did, for the report.
fn instance<K: KvStore>(kv: &K, env: &SchedEnv, ledger: &Ledger, n: usize) -> String {
    let c = ctx(kv, env);
    let id = pool();
    let progress = match read_progress(&c, &id) {
        Ok(p) => p,
        Err(e) => return format!("read failed: {}", e.reason()),
    };
    if plan::next(&MetalSpec::default(), &progress, NOW) != Action::Create(Resource::Vrf) {
        return "nothing to create".into();
    }
    let me = env.token();
    match claim_intent(&c, &id, Resource::Vrf, &me, NOW) {
        Ok(true) => {}
        Ok(false) => return "another instance creates".into(),
        Err(e) => return format!("intent failed: {}", e.reason()),
    }
    let created = format!("vrf-{n}");
    ledger.create(created.clone());
    match record_created(&c, &id, Resource::Vrf, &created) {
        Ok(true) => format!("created {created}"),
        Ok(false) => format!("duplicate {created}"),
        Err(e) => format!("record failed: {}", e.reason()),
    }
}

/// Recovery after the lease, single-threaded, as the step runs it: look
/// for an unrecorded creation (by tag: here, the ledger), record it, else
/// withdraw the stale intent and create. Returns `false` when the record
/// cannot be created at all: its creation-guard winner crashed between the
/// guard and the key (the documented known limit of every record; an
/// operator deletes the `metal-init/…` key).
fn recover(kv: &MemKv, env: &SchedEnv, ledger: &Ledger) -> Result<bool, String> {
    let c = ctx(kv, env);
    let id = pool();
    let later = NOW + INTENT_LEASE_S;
    let stuck = |e: metal_ipam_core::error::Error| -> Result<bool, String> {
        let key = metal_ipam_core::kv::keys::metal_pool(&id);
        let guard = metal_ipam_core::kv::keys::metal_pool_init(&id);
        if e.reason() == "Contention"
            && kv.get(&key).unwrap().is_none()
            && kv.get(&guard).unwrap().is_some()
        {
            Ok(false)
        } else {
            Err(format!("recovery: {e}"))
        }
    };
    for _ in 0..5 {
        let p = read_progress(&c, &id).map_err(|e| e.to_string())?;
        let step = match plan::next(&MetalSpec::default(), &p, later) {
            Action::FindCreated(Resource::Vrf) => match ledger.all().first() {
                Some(found) => record_created(&c, &id, Resource::Vrf, found).map(|_| ()),
                None => {
                    let token = p.intent.unwrap().token;
                    withdraw_intent(&c, &id, Resource::Vrf, &token).map(|_| ())
                }
            },
            Action::Create(Resource::Vrf) => {
                let me = env.token();
                match claim_intent(&c, &id, Resource::Vrf, &me, later) {
                    Ok(true) => {
                        ledger.create("vrf-recovery".into());
                        record_created(&c, &id, Resource::Vrf, "vrf-recovery").map(|_| ())
                    }
                    Ok(false) => return Err("recovery lost its own intent".into()),
                    Err(e) => Err(e),
                }
            }
            // The VRF is recorded: what comes next is another resource's.
            _ => return Ok(true),
        };
        if let Err(e) = step {
            return stuck(e);
        }
    }
    Err("recovery did not settle".into())
}

fn check(kv: &MemKv, env: &SchedEnv, ledger: &Ledger, crashed: bool) -> Result<(), String> {
    let created = ledger.all();
    if created.len() > 1 {
        return Err(format!("two VRFs created: {created:?}"));
    }
    let c = ctx(kv, env);
    let p = read_progress(&c, &pool()).map_err(|e| e.to_string())?;
    if !crashed {
        let held = p.vrf.as_ref().map(|h| h.id.clone());
        if created.len() != 1 || held.as_ref() != created.first() || p.intent.is_some() {
            return Err(format!(
                "without a crash: created {created:?}, recorded {held:?}, intent {:?}",
                p.intent
            ));
        }
    }
    if !recover(kv, env, ledger)? {
        // Nobody could have recorded an intent, so nobody created.
        return if ledger.all().is_empty() {
            Ok(())
        } else {
            Err(format!("created {:?} without a record", ledger.all()))
        };
    }
    let created = ledger.all();
    let p = read_progress(&c, &pool()).map_err(|e| e.to_string())?;
    let held = p.vrf.as_ref().map(|h| h.id.clone());
    if created.len() != 1 || held.as_ref() != created.first() {
        return Err(format!(
            "after recovery: created {created:?}, recorded {held:?}"
        ));
    }
    Ok(())
}

fn one_schedule(
    backend: Backend,
    instances: usize,
    chooser: &mut dyn Chooser,
    crashes: usize,
) -> Result<(), String> {
    let kv = MemKv::new(backend);
    let env = SchedEnv(TestEnv::at(NOW));
    let ledger = Ledger::default();
    let fns: Vec<_> = (0..instances)
        .map(|n| {
            let (env, ledger) = (&env, &ledger);
            move |k: &sched::SchedKv<'_, MemKv>| instance(k, env, ledger, n)
        })
        .collect();
    let (answers, trace) = sched::run(&kv, fns, chooser, crashes, 2_000);
    check(&kv, &env, &ledger, trace.crashed)
        .map_err(|v| format!("{backend:?}, {instances} instances: {v}\nanswers: {answers:?}"))
}

/// Two instances, every schedule, up to one crash, on every backend.
#[test]
fn two_instances_create_the_vrf_once_under_every_schedule() {
    let mut total = 0;
    for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
        let mut dfs = Dfs::default();
        dfs.start();
        loop {
            total += 1;
            if let Err(v) = one_schedule(backend, 2, &mut dfs, 1) {
                panic!("{v}\nschedule #{total}");
            }
            if !dfs.next_schedule() {
                break;
            }
        }
    }
    println!("provision interleavings: {total} schedules of two instances");
    assert!(total > 100, "{total} schedules");
}

/// Three instances (the same event three times at once), sampled with PCT.
#[test]
fn three_instances_create_the_vrf_once_under_pct_schedules() {
    let mut total = 0;
    for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
        for seed in 0..300 {
            total += 1;
            let mut pct = Pct::new(seed, 3, 30);
            if let Err(v) = one_schedule(backend, 3, &mut pct, 1) {
                panic!("{v}\nPCT seed {seed}");
            }
        }
    }
    println!("provision interleavings: {total} PCT schedules of three instances");
}
