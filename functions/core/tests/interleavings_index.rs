//! The interleaving checker over the pool index (`ipam::index`): pools of
//! one address space registering, updating and deleting at once, every KV
//! operation a yield point, a crash possible before any of them, on each
//! backend's real compare-and-swap semantics (see `interleavings.rs`).
//!
//! The pools: `ns/a` (10.0.0.0/29), `ns/b` (10.0.0.4/30, inside `a`'s
//! range), the global `g` (10.0.0.6/31, inside both) and `other/c`
//! (10.0.0.0/29 in another namespace: another address space, so it may
//! share `a`'s addresses). `a` shrunk is 10.0.0.0/30 (no longer sharing
//! with `b`).
//!
//! Invariants, checked **after every write** to the store (a watched
//! store), not only at the end:
//! - no two live pools of one address space hold a common address (what a
//!   pool holds: its allocatable set and its used addresses,
//!   `index::held_by`);
//! - every live pool's holdings are inside its index entry (`held` and its
//!   grants in flight): the invariant the overlap decision rests on.
//!
//! After each schedule: two overlapping registrations never both answered
//! `Ok`; then recovery — the clock passes the grants' expiry, every
//! operation that did not answer is run again, and the reconcile's `tidy`
//! runs — after which the index lists exactly the live pools, each with
//! exactly what its record holds, and a pool refused for an overlap
//! registers once the other is deleted.
//!
//! The counts are printed.

#[path = "interleavings/sched.rs"]
mod sched;

use std::sync::Mutex;

use metal_ipam_core::ipam::alloc::{PoolState, TAKEOVER_AFTER_SECONDS};
use metal_ipam_core::ipam::index::{self, Held};
use metal_ipam_core::ipam::ops::{self, Found};
use metal_ipam_core::ipam::pool::{PoolId, PoolKind, PoolObject};
use metal_ipam_core::ipam::store::{self, Next};
use metal_ipam_core::kv::protocol::GUARD_STALL_S;
use metal_ipam_core::kv::Decision;
use metal_ipam_core::kv::{keys, Ctx};
use metal_ipam_core::ports::kv::{KvError, KvStore, Swap};
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::json;

use sched::{Chooser, Dfs, Pct, SchedEnv};

const NOW: u64 = 10_000;
const BACKENDS: [Backend; 3] = [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36];

/// The pools of the checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum P {
    A,
    B,
    G,
    C,
}

impl P {
    const ALL: [P; 4] = [P::A, P::B, P::G, P::C];

    fn id(self) -> PoolId {
        match self {
            P::A => PoolId::namespaced("ns", "a"),
            P::B => PoolId::namespaced("ns", "b"),
            P::G => PoolId::of(PoolKind::Global, "", "g"),
            P::C => PoolId::namespaced("other", "c"),
        }
    }

    fn object(self, shrunk: bool) -> PoolObject {
        let id = self.id();
        let addresses = match (self, shrunk) {
            (P::A, false) | (P::C, _) => "10.0.0.0/29",
            (P::A, true) => "10.0.0.0/30",
            (P::B, _) => "10.0.0.4/30",
            (P::G, _) => "10.0.0.6/31",
        };
        let kind = id.kind.kind_name();
        let mut meta = json!({"name": id.name});
        if let Some(ns) = &id.namespace {
            meta["namespace"] = json!(ns);
        }
        PoolObject::parse(
            &id,
            &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": kind,
                    "metadata": meta,
                    "spec": {"addresses": [addresses], "prefix": 24,
                             "allocateReservedIPAddresses": true}}),
        )
        .unwrap()
    }
}

/// What one request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `PUT` of the pool.
    Put(P),
    /// `PUT` of `a` shrunk.
    ShrinkA,
    /// `DELETE` of the pool.
    Delete(P),
    /// A mutation: the pool record written without asking the index (the
    /// registration as it was before the index held addresses).
    NaivePut(P),
    /// The reconcile's removal of tombstones due (`index::collect`).
    Collect,
}

fn ctx<'a, K: KvStore>(kv: &'a K, env: &'a SchedEnv) -> Ctx<'a, K> {
    Ctx::auto(kv, env)
}

fn perform<K: KvStore>(op: Op, kv: &K, env: &SchedEnv) -> Result<(), String> {
    let c = ctx(kv, env);
    match op {
        Op::Put(p) => ops::put_pool(&c, p.object(false)).map(|_| ()),
        Op::ShrinkA => ops::put_pool(&c, P::A.object(true)).map(|_| ()),
        Op::Delete(p) => ops::delete_pool(&c, &p.id()).map(|_| ()),
        Op::Collect => index::collect(&c).map(|_| ()),
        Op::NaivePut(p) => {
            let o = p.object(false);
            let v = o.spec.validate().unwrap();
            store::update_pool(&c, &p.id(), |_| {
                Ok(Decision::Write(
                    Box::new(Next {
                        pool: Some((o.clone(), v.clone())),
                        state: PoolState::default(),
                    }),
                    (),
                ))
            })
        }
    }
    .map_err(|e| e.reason().to_string())
}

/// What pool `p` holds now, if live.
fn holds(kv: &MemKv, p: P) -> Option<Held> {
    match ops::find_pool(kv, &p.id()).unwrap() {
        Found::Live(l) => Some(index::held_by(&l)),
        Found::Absent => None,
        Found::Unreadable(why) => panic!("{p:?} unreadable: {why}"),
    }
}

/// The invariants of the module docs, on the store as it is.
fn violations(kv: &MemKv) -> Vec<String> {
    let mut out = Vec::new();
    let live: Vec<(P, Held)> = P::ALL
        .iter()
        .filter_map(|&p| holds(kv, p).map(|h| (p, h)))
        .collect();
    for (i, (p, hp)) in live.iter().enumerate() {
        for (q, hq) in &live[i + 1..] {
            if index::same_space(&p.id(), &q.id()) && !hp.set.intersection(&hq.set).is_empty() {
                out.push(format!("{p:?} and {q:?} are live and share addresses"));
            }
        }
    }
    let idx = index::read(kv).unwrap().unwrap_or_default();
    for (p, h) in &live {
        // The entry as the overlap decision sees it: held and grants.
        let mut claimed = Held::empty(h.family);
        match idx.pools.get(&keys::pool(&p.id())) {
            None => out.push(format!("{p:?} is live without an index entry")),
            Some(e) => {
                let parts = e
                    .held
                    .iter()
                    .flatten()
                    .chain(e.pending.iter().flat_map(|g| g.held.iter()));
                for s in parts {
                    let (_, a, b) = metal_ipam_core::ipam::pool::parse_entry(s).unwrap();
                    claimed.set.insert_range(a, b);
                }
                let mut outside = h.set.clone();
                outside.subtract(&claimed.set);
                if !outside.is_empty() {
                    out.push(format!(
                        "{p:?} holds {:?} outside its index entry {e:?}",
                        outside.ranges()
                    ));
                }
            }
        }
    }
    out
}

/// A store that checks the invariants after every write.
struct Watched<'a> {
    inner: &'a MemKv,
    found: &'a Mutex<Vec<String>>,
}

impl Watched<'_> {
    fn after_write(&self, what: &str) {
        let v = violations(self.inner);
        if !v.is_empty() {
            let mut f = self.found.lock().unwrap();
            if f.is_empty() {
                let snap: String = self
                    .inner
                    .dump()
                    .into_iter()
                    .filter(|(k, _)| k == "pool-index" || k == "pool/ns/ns/a")
                    .map(|(k, v)| format!("\n    {k} = {}", String::from_utf8_lossy(&v)))
                    .collect();
                f.push(format!("{} (after {what}; then:{snap})", v.join("; ")));
            }
        }
    }
}

impl KvStore for Watched<'_> {
    type Cas = <MemKv as KvStore>::Cas;
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.get(key)
    }
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.inner.get_many(keys)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        let r = self.inner.set(key, value);
        self.after_write(&format!("set {key}"));
        r
    }
    fn delete(&self, key: &str) -> Result<(), KvError> {
        let r = self.inner.delete(key);
        self.after_write(&format!("delete {key}"));
        r
    }
    fn list_keys(&self) -> Result<Vec<String>, KvError> {
        self.inner.list_keys()
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        let r = self.inner.increment(key, delta);
        self.after_write(&format!("increment {key}"));
        r
    }
    fn cas_read(&self, key: &str) -> Result<(Self::Cas, Option<Vec<u8>>), KvError> {
        self.inner.cas_read(key)
    }
    fn cas_swap(&self, cas: Self::Cas, value: &[u8]) -> Result<Swap, KvError> {
        let r = self.inner.cas_swap(cas, value);
        self.after_write(&format!("swap {:?}", r.as_ref().ok()));
        r
    }
}

/// Where a schedule starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Nothing stored.
    Empty,
    /// Every pool registered once and deleted (tombstones, an empty index):
    /// registrations skip the records' creation, so every schedule of a
    /// pair can be explored.
    Deleted,
    /// `a` registered (so the index exists).
    WithA,
    /// `a` registered, the others registered once and deleted.
    WithADeleted,
    /// `a` registered once and deleted, and the schedule runs a day later:
    /// its tombstone is due for collection.
    DeletedLongAgo,
}

impl Start {
    /// The schedule's clock.
    fn now(self) -> u64 {
        match self {
            Start::DeletedLongAgo => NOW + index::TOMBSTONE_KEEP_S,
            _ => NOW,
        }
    }
}

fn setup(kv: &MemKv, start: Start) {
    // Tokens of its own (a seed apart from the schedule's), as two
    // requests' random tokens are.
    let env = SchedEnv(TestEnv::seeded(NOW - 1, 7));
    let c = ctx(kv, &env);
    if start == Start::DeletedLongAgo {
        // One due tombstone, the one its registration races for.
        ops::put_pool(&c, P::A.object(false)).unwrap();
        ops::delete_pool(&c, &P::A.id()).unwrap();
    }
    if matches!(start, Start::Deleted | Start::WithADeleted) {
        for p in P::ALL {
            ops::put_pool(&c, p.object(false)).unwrap();
            ops::delete_pool(&c, &p.id()).unwrap();
        }
    }
    if matches!(start, Start::WithA | Start::WithADeleted) {
        ops::put_pool(&c, P::A.object(false)).unwrap();
    }
}

/// Whether two operations are registrations of pools that share an
/// address space and an address (so at most one may succeed, unless a
/// shrink or a deletion made room).
fn exclusive(a: Op, b: Op) -> bool {
    match (a, b) {
        (Op::Put(p) | Op::NaivePut(p), Op::Put(q) | Op::NaivePut(q)) if p != q => {
            let (hp, hq) = (p.object(false), q.object(false));
            let (vp, vq) = (hp.spec.validate().unwrap(), hq.spec.validate().unwrap());
            index::same_space(&p.id(), &q.id())
                && !vp.allocatable.intersection(&vq.allocatable).is_empty()
        }
        _ => false,
    }
}

fn one_schedule(
    backend: Backend,
    start: Start,
    ops_run: &[Op],
    chooser: &mut dyn Chooser,
    crashes: usize,
) -> Result<(), String> {
    let kv = MemKv::new(backend);
    setup(&kv, start);
    let env = SchedEnv(TestEnv::at(start.now()));
    let found = Mutex::new(Vec::new());
    let watched = Watched {
        inner: &kv,
        found: &found,
    };
    let fns: Vec<_> = ops_run
        .iter()
        .map(|&op| {
            let env = &env;
            move |k: &sched::SchedKv<'_, Watched<'_>>| perform(op, k, env)
        })
        .collect();
    let (answers, trace) = sched::run(&watched, fns, chooser, crashes, 4_000);
    let dump = || {
        kv.dump()
            .into_iter()
            .filter(|(k, _)| k.starts_with("pool"))
            .map(|(k, v)| format!("\n  {k} = {}", String::from_utf8_lossy(&v)))
            .collect::<String>()
    };
    let fail = |what: String| {
        Err(format!(
            "{backend:?} from {start:?}, ops {ops_run:?}: {what}\nanswers: {answers:?}, crashed: {}\nstore:{}",
            trace.crashed,
            dump()
        ))
    };
    if let Some(v) = found.lock().unwrap().first() {
        return fail(format!("during the schedule: {v}"));
    }
    for (i, a) in ops_run.iter().enumerate() {
        for (j, b) in ops_run.iter().enumerate().skip(i + 1) {
            if exclusive(*a, *b) && answers[i].is_ok() && answers[j].is_ok() {
                return fail(format!("{a:?} and {b:?} both answered Ok"));
            }
        }
        match &answers[i] {
            Err(e)
                if !trace.crashed
                    && e != "PoolOverlap"
                    && e != "Contention"
                    && e != "PoolBeingCollected" =>
            {
                return fail(format!("{a:?} failed without a crash: {e}"));
            }
            _ => {}
        }
    }
    // A registration that answered Ok is never undone by anything but a
    // deletion of its own pool: not by the collection of its tombstone.
    for (op, a) in ops_run.iter().zip(&answers) {
        if let (Op::Put(p), Ok(())) = (op, a) {
            if !ops_run.contains(&Op::Delete(*p)) && holds(&kv, *p).is_none() {
                return fail(format!("{p:?} answered Ok and is not live"));
            }
        }
    }
    // Recovery: past the grants' expiry (and a creation guard's stall),
    // everything that did not answer runs again, then the reconcile tidies.
    let later = SchedEnv(TestEnv::seeded(
        start.now() + TAKEOVER_AFTER_SECONDS + GUARD_STALL_S,
        9,
    ));
    let c = ctx(&kv, &later);
    // A collection that did not finish is finished first: the reconcile's
    // next run (until then its keys answer `PoolBeingCollected`, 503).
    let mut order: Vec<_> = ops_run.iter().zip(&answers).collect();
    order.sort_by_key(|(op, _)| !matches!(op, Op::Collect));
    for (op, a) in order {
        if a.as_ref().is_err_and(|e| e != "PoolOverlap") {
            let mut again = perform(*op, &kv, &later);
            if again.as_ref().is_err_and(|e| e != "PoolOverlap") {
                // A crashed guard winner is taken over on the second try.
                later
                    .0
                    .set_now(start.now() + TAKEOVER_AFTER_SECONDS + 3 * GUARD_STALL_S);
                again = perform(*op, &kv, &later);
            }
            if again.as_ref().is_err_and(|e| e != "PoolOverlap") {
                return fail(format!("{op:?} run again failed: {again:?}"));
            }
        }
    }
    index::tidy(&c, &|_| Ok(false)).map_err(|e| e.to_string())?;
    if let Some(v) = violations(&kv).first() {
        return fail(format!("after recovery: {v}"));
    }
    let idx = index::read(&kv).unwrap().unwrap_or_default();
    for p in P::ALL {
        let entry = idx.pools.get(&keys::pool(&p.id()));
        match (holds(&kv, p), entry) {
            (None, Some(e)) => return fail(format!("{p:?} is gone but indexed: {e:?}")),
            (Some(h), Some(e)) => {
                let want: Vec<String> = index_entries(&h);
                if e.held.as_ref() != Some(&want) || !e.pending.is_empty() {
                    return fail(format!("{p:?}'s entry {e:?} is not exactly {want:?}"));
                }
            }
            _ => {}
        }
    }
    // Liveness: a pool refused for an overlap registers once the pools it
    // overlapped are deleted.
    for op in ops_run {
        if let Op::Put(p) = op {
            if holds(&kv, *p).is_none() {
                for q in P::ALL {
                    if q != *p && index::same_space(&p.id(), &q.id()) {
                        ops::delete_pool(&c, &q.id()).map_err(|e| e.to_string())?;
                    }
                }
                if let Err(e) = ops::put_pool(&c, p.object(false)) {
                    return fail(format!("{p:?} cannot register once alone: {e}"));
                }
            }
        }
    }
    Ok(())
}

/// `h` as an index entry stores it.
fn index_entries(h: &Held) -> Vec<String> {
    h.set
        .ranges()
        .iter()
        .map(|&(a, b)| {
            let f = |v| metal_ipam_core::ip::from_u128(h.family, v).to_string();
            if a == b {
                f(a)
            } else {
                format!("{}-{}", f(a), f(b))
            }
        })
        .collect()
}

fn explore_dfs(backend: Backend, start: Start, ops_run: &[Op], crashes: usize) -> usize {
    let mut dfs = Dfs::default();
    dfs.start();
    let mut n = 0;
    loop {
        n += 1;
        if let Err(v) = one_schedule(backend, start, ops_run, &mut dfs, crashes) {
            panic!("{v}\nschedule #{n}");
        }
        if !dfs.next_schedule() {
            return n;
        }
    }
}

fn explore_pct(backend: Backend, start: Start, ops_run: &[Op], seeds: u64) -> usize {
    for seed in 0..seeds {
        let mut pct = Pct::new(seed, 3, 40);
        if let Err(v) = one_schedule(backend, start, ops_run, &mut pct, 1) {
            panic!("{v}\nPCT seed {seed}");
        }
    }
    usize::try_from(seeds).unwrap_or(usize::MAX)
}

/// PCT schedules per case (`METAL_IPAM_PCT_SCHEDULES`, default 300).
fn per_case() -> u64 {
    std::env::var("METAL_IPAM_PCT_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Two overlapping pools of one namespace registering at once (as
/// `kubectl apply -f dir/` or a GitOps sync does): never both.
#[test]
fn two_overlapping_registrations_never_both_succeed() {
    let pair = [Op::Put(P::A), Op::Put(P::B)];
    let every = explore_dfs(Backend::SpinSqlite, Start::Deleted, &pair, 0);
    let mut sampled = 0;
    for backend in BACKENDS {
        for start in [Start::Empty, Start::Deleted] {
            sampled += explore_pct(backend, start, &pair, per_case());
        }
        // The same registration twice (a duplicated event).
        sampled += explore_pct(
            backend,
            Start::Deleted,
            &[Op::Put(P::A), Op::Put(P::A)],
            per_case(),
        );
    }
    println!(
        "index interleavings: {every} schedules of two overlapping registrations (SQLite, no crash, every schedule, over tombstones) and {sampled} PCT schedules with up to one crash on 3 backends (from an empty store and over tombstones)"
    );
}

/// A registration racing the deletion, or the shrinking, of the pool it
/// overlaps: it succeeds only once the other no longer holds the
/// addresses.
#[test]
fn a_registration_racing_a_deletion_or_a_shrink() {
    let mut every = 0;
    let mut sampled = 0;
    every += explore_dfs(
        Backend::SpinSqlite,
        Start::WithADeleted,
        &[Op::Put(P::B), Op::Delete(P::A)],
        1,
    );
    for ops_run in [
        [Op::Put(P::B), Op::Delete(P::A)],
        [Op::Put(P::B), Op::ShrinkA],
    ] {
        for backend in BACKENDS {
            for start in [Start::WithA, Start::WithADeleted] {
                sampled += explore_pct(backend, start, &ops_run, per_case());
            }
        }
    }
    println!(
        "index interleavings: {every} schedules of a registration against a deletion or a shrink (SQLite, up to one crash, every schedule) and {sampled} PCT schedules on 3 backends"
    );
}

/// The collection of tombstones racing a registration of a pool whose
/// tombstone is due: the registration waits (`PoolBeingCollected`) or
/// wins, and a registration that answered `Ok` is never undone.
#[test]
fn a_registration_racing_the_collection_of_its_tombstone() {
    let pair = [Op::Put(P::A), Op::Collect];
    let every = explore_dfs(Backend::SpinSqlite, Start::DeletedLongAgo, &pair, 1);
    let mut sampled = 0;
    for backend in BACKENDS {
        sampled += explore_pct(backend, Start::DeletedLongAgo, &pair, per_case());
        sampled += explore_pct(
            backend,
            Start::DeletedLongAgo,
            &[Op::Put(P::A), Op::Collect, Op::Put(P::A)],
            per_case(),
        );
    }
    println!(
        "index interleavings: {every} schedules of a registration against the collection of its tombstone (SQLite, up to one crash, every schedule) and {sampled} PCT schedules on 3 backends"
    );
}

/// Triples across scopes: a global pool overlapping both, and a pool of
/// another namespace that may share `a`'s addresses.
#[test]
fn triples_across_address_spaces_sampled() {
    let mut sampled = 0;
    for ops_run in [
        [Op::Put(P::A), Op::Put(P::B), Op::Put(P::G)],
        [Op::Put(P::A), Op::Put(P::C), Op::Delete(P::A)],
        [Op::Put(P::B), Op::Put(P::G), Op::Delete(P::A)],
    ] {
        for backend in BACKENDS {
            sampled += explore_pct(backend, Start::WithA, &ops_run, per_case());
        }
    }
    sampled += explore_pct(
        Backend::SpinSqlite,
        Start::Empty,
        &[Op::Put(P::A), Op::Put(P::C), Op::Put(P::G)],
        per_case(),
    );
    println!("index interleavings: {sampled} PCT schedules of triples, up to one crash");
}

/// The checker catches a registration that skips the index (a mutation:
/// the pool record written as the code did before the index held
/// addresses): some schedule of it against an ordinary registration leaves
/// two live pools sharing addresses.
#[test]
fn a_registration_without_the_grant_is_caught() {
    let pair = [Op::Put(P::A), Op::NaivePut(P::B)];
    let mut dfs = Dfs::default();
    dfs.start();
    let mut n = 0;
    loop {
        n += 1;
        if let Err(v) = one_schedule(Backend::SpinSqlite, Start::Deleted, &pair, &mut dfs, 0) {
            assert!(v.contains("share addresses"), "{v}");
            println!("index interleavings: the mutation is caught at schedule #{n}");
            return;
        }
        assert!(
            dfs.next_schedule(),
            "the mutation was not caught in {n} schedules"
        );
    }
}
