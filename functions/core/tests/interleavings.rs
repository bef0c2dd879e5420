//! The deterministic interleaving checker over the `KvStore` port.
//!
//! Two or three concurrent operations — allocate X, a duplicate of it,
//! release X, adopt X from its `IPAddress`, allocate another claim Y, a pool
//! update, a pool creation, and an allocation of Z whose request then
//! flushes the confirmed bindings to the holder pages (`ipam::holders`, at
//! once instead of past 32) — run under a scheduler that makes every KV
//! operation a yield point and may crash any operation before any of its KV
//! operations. Each backend's real compare-and-swap semantics apply
//! ([`Backend::SpinSqlite`]: a swap after an absent read is an upsert;
//! [`Backend::Redis`]: a conflicting swap is silently aborted and reported
//! as success; [`Backend::RedisSpin36`]: every swap is reported as failed,
//! applied or not, and `get_many` fails). Pairs are enumerated exhaustively; triples are sampled with
//! PCT. After each schedule the store is checked:
//!
//! - no address is held by two bindings;
//! - every binding's address is used in its pool and not cooling down;
//! - the same claim (name, uid) was answered one address throughout, and
//!   its binding (if any) says that address;
//! - without a crash, the pool's `used` count equals the bindings (no leak);
//! - every live binding's address resolves to that binding's claim through
//!   the pool's intents, its confirmed bindings (`recent`) and its holder
//!   pages (`ipam::holders::holders_of`), after the schedule and again
//!   after the retries and the fill;
//! - retrying each crashed allocation succeeds with the address already
//!   answered, a crashed registration succeeds when retried (a creation
//!   guard won by a request that crashed before making the key does not
//!   wedge the pool), and filling the pool afterwards hands out no held
//!   address.
//!
//! The number of schedules explored is printed.

#[path = "interleavings/sched.rs"]
mod sched;

use std::collections::BTreeMap;

use metal_ipam_core::ipam::alloc::IntentKind;
use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::holders;
use metal_ipam_core::ipam::ops;
use metal_ipam_core::ipam::pool::{PoolId, PoolKind, PoolObject};
use metal_ipam_core::ipam::store::{self, ClaimRecord};
use metal_ipam_core::kv::protocol::GUARD_STALL_S;
use metal_ipam_core::kv::{keys, Ctx};
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::ports::Env;
use metal_ipam_core::provision::assign::MetalAssignmentClosed;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::{json, Value};

use sched::{Chooser, Dfs, Pct, SchedEnv};

const NS: &str = "ns";
const POOL: &str = "p";

/// Which kind of pool the schedules run on: the same protocol, counting in
/// addresses or in sub-prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A `MetalIPPool` of 10.0.0.1–10.0.0.4 (grown: to .5).
    Address,
    /// A `MetalPrefixPool` of 10.0.0.0/28 handing out /30s: four
    /// sub-prefixes (grown: a fifth, 10.0.0.16/30).
    Prefix,
}

impl Shape {
    fn kind(self) -> &'static str {
        match self {
            Shape::Address => "MetalIPPool",
            Shape::Prefix => "MetalPrefixPool",
        }
    }

    fn pool_id(self) -> PoolId {
        match self {
            Shape::Address => PoolId::namespaced(NS, POOL),
            Shape::Prefix => PoolId::of(PoolKind::NamespacedPrefix, NS, POOL),
        }
    }

    /// What X gets first.
    fn first(self) -> &'static str {
        match self {
            Shape::Address => "10.0.0.1",
            Shape::Prefix => "10.0.0.0",
        }
    }

    fn spec(self, grown: bool) -> Value {
        match (self, grown) {
            (Shape::Address, false) => json!({"addresses": ["10.0.0.1-10.0.0.4"], "prefix": 24}),
            (Shape::Address, true) => json!({"addresses": ["10.0.0.1-10.0.0.5"], "prefix": 24}),
            (Shape::Prefix, false) => {
                json!({"prefixes": ["10.0.0.0/28"], "allocationPrefixLength": 30})
            }
            (Shape::Prefix, true) => json!({"prefixes": ["10.0.0.0/28", "10.0.0.16/30"],
                "allocationPrefixLength": 30}),
        }
    }
}

fn pool_obj(shape: Shape, spec: Value) -> PoolObject {
    PoolObject::parse(
        &shape.pool_id(),
        &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": shape.kind(),
                "metadata": {"name": POOL, "namespace": NS, "uid": "pool-uid"}, "spec": spec}),
    )
    .unwrap()
}

fn small_pool(shape: Shape) -> PoolObject {
    pool_obj(shape, shape.spec(false))
}

fn grown_pool(shape: Shape) -> PoolObject {
    pool_obj(shape, shape.spec(true))
}

fn claim(shape: Shape, name: &str, uid: &str) -> Claim {
    Claim::parse(&json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": shape.kind(), "name": POOL}}
    }))
    .unwrap()
}

fn ctx<'a, K: KvStore>(kv: &'a K, env: &'a SchedEnv) -> Ctx<'a, K> {
    Ctx::auto(kv, env)
}

/// Where a schedule starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The pool exists and is empty.
    Empty,
    /// The pool exists and X (uid `u1`) holds 10.0.0.1.
    Bound,
    /// X holds 10.0.0.1 and is in its holder page (confirmed, flushed); W
    /// (uid `uw`) holds the next value, its `Bind` intent still open: the
    /// next decision confirms W, and an `AllocZ` flushes it.
    Paged,
    /// The pool does not exist yet.
    NoPool,
}

/// One concurrent operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Allocate X (uid `u1`); a second `AllocX` is its duplicate.
    AllocX,
    /// Allocate Y (uid `uy`).
    AllocY,
    /// Release X (uid `u1`).
    ReleaseX,
    /// Adopt X at 10.0.0.1, as its `IPAddress` says.
    AdoptX,
    /// Register the pool (creates it when absent, grows it when present).
    PutPool,
    /// Allocate Z (uid `uz`); its request then flushes the pool's
    /// confirmed bindings to their holder pages (threshold 1).
    AllocZ,
}

const OPS: [Op; 6] = [
    Op::AllocX,
    Op::AllocY,
    Op::ReleaseX,
    Op::AdoptX,
    Op::PutPool,
    Op::AllocZ,
];

/// What an operation answered: the address for X or Y, or an error reason.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Address(String, String),
    Released(Option<String>),
    Pool,
    Err(String),
}

fn perform<K: KvStore>(shape: Shape, op: Op, kv: &K, env: &SchedEnv) -> Answer {
    let c = ctx(kv, env);
    let r = match op {
        Op::AllocX => ops::allocate(&c, &claim(shape, "x", "u1"))
            .map(|a| Answer::Address("x".into(), a.record.address)),
        Op::AllocY => ops::allocate(&c, &claim(shape, "y", "uy"))
            .map(|a| Answer::Address("y".into(), a.record.address)),
        Op::AllocZ => ops::allocate_flushing_at(&c, &claim(shape, "z", "uz"), 1)
            .map(|a| Answer::Address("z".into(), a.record.address)),
        Op::AdoptX => ops::adopt(&c, &claim(shape, "x", "u1"), shape.first().parse().unwrap())
            .map(|a| Answer::Address("x".into(), a.record.address)),
        Op::ReleaseX => ops::release(&c, NS, "x", Some("u1"), &MetalAssignmentClosed)
            .map(|r| Answer::Released(r.map(|r| r.address))),
        Op::PutPool => ops::put_pool(&c, grown_pool(shape)).map(|_| Answer::Pool),
    };
    r.unwrap_or_else(|e| Answer::Err(e.reason().to_string()))
}

fn setup(shape: Shape, kv: &MemKv, env: &SchedEnv, start: Start) {
    let c = ctx(kv, env);
    // A registration goes through the pool index (grant, pool write,
    // settle): its yield points are part of every schedule here; the
    // index's own races and crashes are `interleavings_index.rs`'s.
    match start {
        Start::NoPool => {}
        Start::Empty => {
            ops::put_pool(&c, small_pool(shape)).unwrap();
        }
        Start::Bound => {
            ops::put_pool(&c, small_pool(shape)).unwrap();
            let a = ops::allocate(&c, &claim(shape, "x", "u1")).unwrap();
            assert_eq!(a.record.address, shape.first());
        }
        Start::Paged => {
            ops::put_pool(&c, small_pool(shape)).unwrap();
            let a = ops::allocate(&c, &claim(shape, "x", "u1")).unwrap();
            assert_eq!(a.record.address, shape.first());
            // W's decision confirms X, and its request flushes X to its page.
            ops::allocate_flushing_at(&c, &claim(shape, "w", "uw"), 1).unwrap();
            let l = store::read_pool(kv, &shape.pool_id()).unwrap().unwrap();
            assert!(l.state.holders.recent.is_empty() && l.state.intents.len() == 1);
        }
    }
}

/// Every live binding's address resolves to that binding's claim through
/// the holder index (intents, `recent`, pages), and the pool is indexed.
fn holders_resolve(shape: Shape, kv: &MemKv, phase: &str) -> Result<(), String> {
    let Some(l) = store::read_pool(kv, &shape.pool_id()).unwrap() else {
        return Ok(());
    };
    if !l.state.holders.indexed {
        return Err(format!("{phase}: the pool is not indexed"));
    }
    for (name, rec) in bindings(shape, kv) {
        let v = l.pool.value_of(rec.ip().unwrap()).unwrap();
        let found = holders::holders_of(kv, &l, &[v]).map_err(|e| e.to_string())?;
        let want = format!("{NS}/{name}");
        match found.by_value.get(&v) {
            Some(h) if h.claim == want => {}
            other => {
                return Err(format!(
                    "{phase}: {} is bound to {want} but resolves to {other:?}",
                    rec.address
                ))
            }
        }
    }
    Ok(())
}

/// The store's content, readable.
fn dump(kv: &MemKv) -> String {
    kv.dump()
        .into_iter()
        .map(|(k, v)| format!("\n  {k} = {}", String::from_utf8_lossy(&v)))
        .collect()
}

/// Every live binding in the store (claim name → record): a binding whose
/// release is decided (an `Unbind` intent in the pool) is dead even while
/// its key still holds it.
fn bindings(shape: Shape, kv: &MemKv) -> BTreeMap<String, ClaimRecord> {
    let state = store::read_pool(kv, &shape.pool_id())
        .unwrap()
        .map(|l| l.state)
        .unwrap_or_default();
    kv.dump()
        .into_iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix(keys::CLAIM_PREFIX)?.strip_prefix("ns/")?;
            let rec = ClaimRecord::decode(&v).unwrap();
            (!state.is_unbinding(&format!("{NS}/{name}"), &rec.token))
                .then(|| (name.to_string(), rec))
        })
        .collect()
}

/// Checks the store after a schedule; `Err` describes the violation.
fn check(
    shape: Shape,
    kv: &MemKv,
    env: &SchedEnv,
    ops: &[Op],
    answers: &[Answer],
    crashed: bool,
) -> Result<(), String> {
    let c = ctx(kv, env);
    let id = shape.pool_id();
    // Same claim, same address: every answer for X agrees.
    let mut x_addr: Option<String> = None;
    for a in answers {
        if let Answer::Address(who, addr) = a {
            if who == "x" {
                if let Some(prev) = &x_addr {
                    if prev != addr {
                        return Err(format!("X was answered {prev} and {addr}"));
                    }
                }
                x_addr = Some(addr.clone());
            }
        }
    }
    let released = answers
        .iter()
        .any(|a| matches!(a, Answer::Released(Some(_))));
    let check_store = |phase: &str| -> Result<(), String> {
        let b = bindings(shape, kv);
        let view = ops::get_pool(kv, &id, 0).map_err(|e| e.to_string())?;
        let mut held: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, rec) in &b {
            if let Some(other) = held.insert(&rec.address, name) {
                return Err(format!(
                    "{phase}: {} is held by {other} and {name}",
                    rec.address
                ));
            }
        }
        if let Some(view) = &view {
            let loaded = store::read_pool(kv, &id).unwrap().unwrap();
            let state = loaded.state;
            let cooling: Vec<u128> = state.cooling.iter().map(|c| c.address).collect();
            // Every used address is held: by a live binding, or by a Bind
            // intent whose binding is still to be written, or cooling down.
            let mut explained: std::collections::BTreeSet<u128> = b
                .values()
                .map(|r| loaded.pool.value_of(r.ip().unwrap()).unwrap())
                .collect();
            for a in &explained {
                if !state.used.contains(*a) || cooling.contains(a) {
                    return Err(format!(
                        "{phase}: a live binding holds {a:#x}, which is not used"
                    ));
                }
            }
            for i in &state.intents {
                if i.kind == IntentKind::Bind {
                    explained.insert(i.address);
                }
            }
            explained.extend(cooling.iter().copied());
            let leaks: Vec<u128> = state
                .used
                .iter()
                .filter(|a| !explained.contains(a))
                .collect();
            if !leaks.is_empty() {
                return Err(format!("{phase}: used but held by nothing: {leaks:x?}"));
            }
            let used = view.counts.used + view.counts.out_of_range;
            if (b.len() as u128) > used {
                return Err(format!(
                    "{phase}: {} bindings but the pool counts {used} used",
                    b.len()
                ));
            }
        } else if !b.is_empty() {
            return Err(format!("{phase}: bindings without a pool: {b:?}"));
        }
        Ok(())
    };
    check_store("after the schedule")?;
    holders_resolve(shape, kv, "after the schedule")?;
    // X's binding agrees with what X was answered (unless X was released
    // after being answered, or re-bound by adoption of the same address).
    if let (Some(addr), Some(rec)) = (&x_addr, bindings(shape, kv).get("x")) {
        if &rec.address != addr && !released {
            return Err(format!(
                "X was answered {addr} but is bound to {}",
                rec.address
            ));
        }
    }
    // Retry what crashed: an allocation retried gets what it was answered.
    if crashed {
        for (op, ans) in ops.iter().zip(answers) {
            if matches!(ans, Answer::Err(_))
                && matches!(op, Op::AllocX | Op::AllocY | Op::AllocZ | Op::PutPool)
            {
                let mut again = perform(shape, *op, kv, env);
                // Nothing a crash leaves behind wedges the pool: a crashed
                // registration (its creation guard won, its key never made,
                // say) succeeds when retried, at the latest by a retry a
                // minute after the stall was noted.
                if *op == Op::PutPool {
                    for _ in 0..2 {
                        if again == Answer::Pool {
                            break;
                        }
                        env.0.set_now(env.0.now() + GUARD_STALL_S);
                        again = perform(shape, *op, kv, env);
                    }
                    if again != Answer::Pool {
                        return Err(format!(
                            "the crashed registration, retried, answered {again:?}"
                        ));
                    }
                }
                if let (Answer::Address(w, a), Some(prev)) = (&again, &x_addr) {
                    if w == "x" && a != prev && !released {
                        return Err(format!("X retried got {a}, was answered {prev}"));
                    }
                }
            }
        }
    }
    // Fill the pool with fresh claims: no address any binding holds may be
    // handed out again.
    if ops::get_pool(kv, &id, 0).ok().flatten().is_some() {
        for i in 0..6 {
            let _ = ops::allocate(&c, &claim(shape, &format!("fill{i}"), &format!("f{i}")));
        }
        check_store("after filling the pool")?;
        // Everything confirmed so far goes to the pages too (a page whose
        // creation guard a crashed flush won is taken over a minute after
        // the stall was noted, as every record's).
        let mut flushed = holders::flush_holders(&c, &id);
        for _ in 0..2 {
            if flushed.is_ok() {
                break;
            }
            env.0.set_now(env.0.now() + GUARD_STALL_S);
            flushed = holders::flush_holders(&c, &id);
        }
        flushed.map_err(|e| format!("the recovery's flush: {e}"))?;
        holders_resolve(shape, kv, "after the recovery and a flush")?;
    }
    holders_resolve(shape, kv, "after the recovery")?;
    Ok(())
}

/// Runs `ops` once from `start` under `chooser` and checks the result;
/// `Err` describes a violation with everything needed to understand it.
fn one_schedule(
    shape: Shape,
    backend: Backend,
    start: Start,
    ops: &[Op],
    chooser: &mut dyn Chooser,
    crashes: usize,
) -> Result<(), String> {
    let kv = MemKv::new(backend);
    let env = SchedEnv(TestEnv::at(1_000));
    setup(shape, &kv, &env, start);
    let fns: Vec<_> = ops
        .iter()
        .map(|&op| {
            let env = &env;
            move |k: &sched::SchedKv<'_, MemKv>| perform(shape, op, k, env)
        })
        .collect();
    let (answers, trace) = sched::run(&kv, fns, chooser, crashes, 2_000);
    check(shape, &kv, &env, ops, &answers, trace.crashed).map_err(|v| {
        format!(
            "{shape:?} pool, {backend:?} from {start:?}, ops {ops:?}: {v}\nanswers: {answers:?}\nstore: {}",
            dump(&kv)
        )
    })
}

fn explore_dfs(shape: Shape, backend: Backend, start: Start, ops: &[Op], crashes: usize) -> usize {
    let mut dfs = Dfs::default();
    dfs.start();
    let mut n = 0;
    loop {
        n += 1;
        if let Err(v) = one_schedule(shape, backend, start, ops, &mut dfs, crashes) {
            panic!("{v}\nschedule #{n}");
        }
        if !dfs.next_schedule() {
            break;
        }
    }
    n
}

fn explore_pct(
    shape: Shape,
    backend: Backend,
    start: Start,
    ops: &[Op],
    seeds: std::ops::Range<u64>,
) -> usize {
    let mut n = 0;
    for seed in seeds {
        n += 1;
        let mut pct = Pct::new(seed, 3, 30);
        if let Err(v) = one_schedule(shape, backend, start, ops, &mut pct, 1) {
            panic!("{v}\nPCT seed {seed}");
        }
    }
    n
}

fn starts_for(ops: &[Op]) -> Vec<Start> {
    let mut starts = vec![Start::Empty, Start::Bound];
    if ops.contains(&Op::PutPool) {
        starts.insert(0, Start::NoPool);
    }
    if ops.contains(&Op::AllocZ) {
        // A flush with a holder to confirm and write, into an existing page.
        starts.push(Start::Paged);
    }
    starts
}

/// Whether a pair is sampled rather than explored exhaustively: a
/// registration goes through the pool index as well as the pool record
/// (grant, pool write, settle: eight operations on SQLite, more with a
/// read-back or a creation), which puts every schedule of a pair with it
/// out of reach on the backends that read back, from an empty store, and
/// for two registrations. Those are sampled with PCT; a registration
/// against each other operation on SQLite's semantics from a registered
/// pool is still explored exhaustively. The index's own races are
/// `interleavings_index.rs`'s.
fn registration_sampled(backend: Backend, start: Start, ops: &[Op]) -> bool {
    let puts = ops.iter().filter(|&&o| o == Op::PutPool).count();
    puts == 2 || (puts == 1 && (backend != Backend::SpinSqlite || start == Start::NoPool))
}

/// Whether a pair with a flushing allocation (`AllocZ`: its decision, its
/// claim write, then a holder page's read-modify-write and one more swap
/// of the pool record) is sampled rather than explored exhaustively: every
/// schedule of such a pair is explored on SQLite's semantics from the
/// state with a holder page (`Paged`: the flush confirms, merges into an
/// existing page and removes), against every operation but a registration
/// (about 70,000 schedules); the other backends and starts are sampled
/// with PCT (the page protocol's read-back is the generic record
/// protocol's, checked by `protocol.rs` on every backend).
fn flush_sampled(backend: Backend, start: Start, ops: &[Op]) -> bool {
    ops.contains(&Op::AllocZ)
        && (backend != Backend::SpinSqlite || start != Start::Paged || ops.contains(&Op::PutPool))
}

/// Whether a pair is sampled with PCT rather than explored exhaustively.
fn sampled(backend: Backend, start: Start, ops: &[Op]) -> bool {
    registration_sampled(backend, start, ops) || flush_sampled(backend, start, ops)
}

/// Every pair of operations (with repetition: a duplicate), from every
/// start, on both quirky backends, with up to one crash: exhaustive (pairs
/// with a registration or a flush partly sampled: [`sampled`]).
#[test]
fn every_pair_under_every_schedule() {
    let mut total = 0;
    let mut n_sampled = 0;
    for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
        for (i, &a) in OPS.iter().enumerate() {
            for &b in &OPS[i..] {
                let ops = [a, b];
                for start in starts_for(&ops) {
                    if sampled(backend, start, &ops) {
                        n_sampled += explore_pct(Shape::Address, backend, start, &ops, 0..300);
                    } else {
                        total += explore_dfs(Shape::Address, backend, start, &ops, 1);
                    }
                }
            }
        }
    }
    println!("interleavings: {total} schedules of pairs explored exhaustively, and {n_sampled} PCT schedules of pairs with a registration or a flush");
    // The exact number is deterministic; a drop means the checker stopped
    // exploring what it did (e.g. an operation no longer reaches the store).
    assert!(total > 100_000, "{total} schedules");
}

/// Triples, sampled with PCT (the number of schedules per triple is set by
/// `METAL_IPAM_PCT_SCHEDULES`, default 200).
#[test]
fn triples_under_pct_schedules() {
    let per: u64 = std::env::var("METAL_IPAM_PCT_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut total = 0;
    let mut seed = 0;
    for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
        for (i, &a) in OPS.iter().enumerate() {
            for (j, &b) in OPS.iter().enumerate().skip(i) {
                for &c in &OPS[j..] {
                    let ops = [a, b, c];
                    for start in starts_for(&ops) {
                        total +=
                            explore_pct(Shape::Address, backend, start, &ops, seed..seed + per);
                        seed += per;
                    }
                }
            }
        }
    }
    println!("interleavings: {total} PCT schedules of triples explored");
    let mut combos = 0;
    for (i, &a) in OPS.iter().enumerate() {
        for (j, &b) in OPS.iter().enumerate().skip(i) {
            for &c in &OPS[j..] {
                combos += starts_for(&[a, b, c]).len() as u64;
            }
        }
    }
    assert_eq!(
        total as u64,
        3 * combos * per,
        "every triple from every start on every backend"
    );
}

/// Prefix pools run the same protocol in other units: every pair of
/// operations on a `MetalPrefixPool` (/30s of a /28), from every start, on
/// the backends whose swaps lie in opposite ways (Spin's SQLite upsert and
/// Spin 3.6's Redis), with up to one crash: exhaustive. (The Redis
/// backend's silent abort and the triples are the address pool's run
/// above: the unit conversion is at the record's edges, not in the
/// protocol.)
#[test]
fn every_pair_under_every_schedule_on_a_prefix_pool() {
    let mut total = 0;
    for backend in [Backend::SpinSqlite, Backend::RedisSpin36] {
        for (i, &a) in OPS.iter().enumerate() {
            for &b in &OPS[i..] {
                let ops = [a, b];
                for start in starts_for(&ops) {
                    // The flush is the same code on a prefix pool: sampled.
                    if sampled(backend, start, &ops) || ops.contains(&Op::AllocZ) {
                        total += explore_pct(Shape::Prefix, backend, start, &ops, 0..150);
                    } else {
                        total += explore_dfs(Shape::Prefix, backend, start, &ops, 1);
                    }
                }
            }
        }
    }
    println!("interleavings: {total} schedules of pairs on a prefix pool explored exhaustively");
    assert!(total > 50_000, "{total} schedules");
}
