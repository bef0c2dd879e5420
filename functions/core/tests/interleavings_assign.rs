//! The interleaving checker over the per-claim Metal assignment record: the
//! store decisions of the assign and unassign steps (`prepare`, `begin`,
//! `recorded`, `withdraw`, `close`, `cleared`, `take_over`) run by two or
//! three instances at once, every KV operation a yield point, a crash
//! possible before any of them, on each backend's real compare-and-swap
//! semantics (see `interleavings.rs`).
//!
//! Metal is a ledger of assignments: an assigner "posts" (appends its own
//! id) only when its intent was granted, as `assign::assign` does once the
//! device reads active; a crash before its next KV operation is a crash
//! after Metal assigned and before the store recorded it. An unassigner
//! runs `assign::unassign` for the claim being deleted: it deletes the
//! recorded assignment from the ledger and closes the record, or answers
//! "in progress" while a live intent stands. Every instance works on the
//! same claim (one uid, one address, one device) within the intent's lease,
//! as concurrent deliveries do. A schedule starts from a record already
//! prepared with the device (the claim was seen before its device was
//! known), or from an empty store, where the first `prepare` or `close`
//! creates the record (sampled with PCT only: every schedule of the
//! creation race is far too many). Pairs (two assigners; an assigner and
//! an unassigner) are enumerated exhaustively with up to one crash; the
//! triple (two assigners and an unassigner) is sampled with PCT.
//!
//! Invariants:
//! - never two assignments in the ledger at once (checked at every post,
//!   not only at the end);
//! - once an unassigner saw the record closed, nothing is posted any more;
//!   an unassigner that answered done leaves no assignment behind;
//! - without a crash, the ledger holds exactly the recorded assignment and
//!   no intent is left (and with assigners only, there is one);
//! - recovery, as the steps run it once the lease has passed: for a claim
//!   being deleted, unassign (take over a stale intent, delete what the
//!   device has) ends closed with an empty ledger and a late assigner posts
//!   nothing; otherwise assign (take over a stale intent, adopt what the
//!   device has, else post) ends with exactly one assignment, the recorded
//!   one, and a further assign makes no call.
//!
//! One more set of schedules breaks the lease's assumption on purpose: an
//! instance still running when another starts after its lease (its `POST`
//! outlasted the lease). There the first two invariants may fail for a
//! moment (a duplicate, a post after the close), and only the late
//! `recorded` refusal (rule 4) undoes it: without a crash, the others must
//! still hold.
//!
//! A releaser (`assign::release`, what every path that releases a binding
//! calls: the plain API, the claim step, reconcile) runs against an
//! assigner and an unassigner too: the binding lives in a VRF-backed pool,
//! and its address may go back to the pool only once nothing is, or will
//! be, assigned (checked at every post: nothing is posted after a release
//! answered; and at the end: a released address has no assignment).
//!
//! Two mutations of the steps (posting without an intent, answering done
//! over a live intent) are run too, and a third of the release guard
//! (releasing without it): the checker must catch them.
//!
//! The number of schedules explored is printed.

#[path = "interleavings/sched.rs"]
mod sched;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use metal_ipam_core::error::{Error, Result};
use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::ops;
use metal_ipam_core::ipam::pool::{PoolId, PoolObject};
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::provision::assign::{self, ClaimAssignment, Closing, Want};
use metal_ipam_core::provision::plan::INTENT_LEASE_S;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::json;

use sched::{Chooser, Dfs, Pct, SchedEnv};

const NOW: u64 = 1_000;
const LATER: u64 = NOW + INTENT_LEASE_S;
const NS: &str = "ns";
const NAME: &str = "m";
const UID: &str = "u1";

/// PCT schedules per backend of a pair from an empty store, and of the
/// triple from each start.
const PAIR_SEEDS: u64 = 200;
const TRIPLE_SEEDS: u64 = 150;

const BACKENDS: [Backend; 3] = [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36];

/// What a check concludes: a violation, described.
type Verdict = std::result::Result<(), String>;

/// The claim's address: the first of the pool's block, bound by
/// [`bind`].
const ADDRESS: &str = "10.10.1.2";

fn want() -> Want {
    Want {
        uid: UID.into(),
        address: ADDRESS.parse().unwrap(),
        device: Some("d1".into()),
        cloud: Default::default(),
    }
}

/// A VRF-backed pool with the claim bound in it (what every schedule
/// starts from: the assign step runs only for bound claims).
fn bind<K: KvStore>(c: &Ctx<'_, K>) {
    let id = PoolId::namespaced(NS, "vrf");
    let object = PoolObject::parse(
        &id,
        &json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
            "metadata": {"name": "vrf", "namespace": NS, "uid": "pool-uid"},
            "spec": {"metal": {"metro": "da", "vrf": {"ipRanges": ["10.10.0.0/16"]},
                "reservation": {"network": "10.10.1.0", "cidr": 29}}}}),
    )
    .unwrap();
    ops::put_provisioned_pool(c, object, ("10.10.1.0".parse().unwrap(), 29), &[], &|| {
        Ok(())
    })
    .unwrap();
    let claim = Claim::parse(&json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": NAME, "namespace": NS, "uid": UID},
        "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "vrf"}}
    }))
    .unwrap();
    let a = ops::allocate(c, &claim).unwrap();
    assert_eq!(a.record.address, ADDRESS);
}

/// Whether the claim's binding is still there.
fn bound<K: KvStore>(kv: &K) -> bool {
    ops::get_claim(kv, NS, NAME).unwrap().is_some()
}

/// A guard that lets everything through: the mutation.
struct NoGuard;

impl ops::ReleaseGuard for NoGuard {
    fn may_release<K: KvStore>(&self, _: &K, _: &str, _: &str, _: &str) -> Result<()> {
        Ok(())
    }
}

/// The release step, as every release path runs it.
fn releaser<K: KvStore>(c: &Ctx<'_, K>, ledger: &Ledger, guarded: bool) -> Result<Answer> {
    let r = if guarded {
        assign::release(c, NS, NAME, Some(UID))
    } else {
        ops::release(c, NS, NAME, Some(UID), &NoGuard)
    };
    match r {
        Ok(Some(_)) => {
            ledger.released_seen.store(true, Ordering::SeqCst);
            Ok(Answer::Released)
        }
        Ok(None) => Ok(Answer::Released),
        Err(e) if e.reason() == "MetalAssignmentHeld" => Ok(Answer::Held),
        Err(e) => Err(e),
    }
}

/// Metal, as far as the protocol can tell: the device's assignments, by
/// id, and what the checker saw happen to them.
#[derive(Default)]
struct Ledger {
    live: Mutex<Vec<String>>,
    /// An unassigner saw `close` answer `Closed`.
    closed_seen: AtomicBool,
    /// A releaser released the binding.
    released_seen: AtomicBool,
    violations: Mutex<Vec<String>>,
}

impl Ledger {
    /// `POST /devices/d1/ips`: a new assignment.
    fn post(&self, id: &str) {
        let mut live = self.live.lock().unwrap();
        live.push(id.to_string());
        let mut v = self.violations.lock().unwrap();
        if live.len() > 1 {
            v.push(format!("two assignments at once: {live:?}"));
        }
        if self.closed_seen.load(Ordering::SeqCst) {
            v.push(format!("{id} posted after the record was seen closed"));
        }
        if self.released_seen.load(Ordering::SeqCst) {
            v.push(format!("{id} posted after the address was released"));
        }
    }
    /// `DELETE /ips/{id}` (nothing when already gone).
    fn delete(&self, id: &str) {
        self.live.lock().unwrap().retain(|a| a != id);
    }
    /// The device's assignments of the claim's address.
    fn all(&self) -> Vec<String> {
        self.live.lock().unwrap().clone()
    }
    fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }
}

fn ctx<'a, K: KvStore>(kv: &'a K, env: &'a SchedEnv) -> Ctx<'a, K> {
    Ctx::auto(kv, env)
}

/// What an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// `assign::assign`, from `prepare` on (the device reads active).
    Assigner,
    /// `assign::unassign` (the claim is being deleted).
    Unassigner,
    /// An assigner that starts after the lease of an intent recorded by
    /// another instance that is still running (it overran its lease).
    AssignerAfterLease,
    /// An unassigner likewise.
    UnassignerAfterLease,
    /// Mutation: an assigner that posts without winning an intent.
    AssignerWithoutIntent,
    /// Mutation: an unassigner that answers done over a live intent.
    UnassignerIgnoringIntent,
    /// The guarded release of the claim's binding (`assign::release`).
    Releaser,
    /// Mutation: a release that does not ask the guard.
    ReleaserWithoutGuard,
}

impl Role {
    fn unassigns(self) -> bool {
        matches!(
            self,
            Role::Unassigner | Role::UnassignerAfterLease | Role::UnassignerIgnoringIntent
        )
    }
    fn releases(self) -> bool {
        matches!(self, Role::Releaser | Role::ReleaserWithoutGuard)
    }
    fn after_lease(self) -> bool {
        matches!(self, Role::AssignerAfterLease | Role::UnassignerAfterLease)
    }
}

/// What an instance answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Assigned(String),
    Closed,
    InProgress,
    Refused(String),
    Done(Option<String>),
    Released,
    Held,
    Failed(&'static str),
}

/// Where a schedule starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// No record: the first `prepare` (or `close`) creates it.
    Empty,
    /// The record exists with the device, nothing assigned.
    Prepared,
}

/// The assign step once the device reads active, as `assign::assign` and
/// its `record_or_undo` run it (`now` explicit, so that recovery runs the
/// same code later).
fn assigner<K: KvStore>(
    c: &Ctx<'_, K>,
    ledger: &Ledger,
    id: &str,
    now: u64,
    with_intent: bool,
) -> Result<Answer> {
    let rec = ClaimAssignment::new(c, NS, NAME).prepare(&want())?;
    if rec.closed {
        return Ok(Answer::Closed);
    }
    if let Some(a) = rec.assignment {
        return Ok(Answer::Assigned(a));
    }
    if let Some(m) = rec.refused {
        return Ok(Answer::Refused(m));
    }
    if with_intent && rec.live_intent(now) {
        return Ok(Answer::InProgress);
    }
    let token = c.env.token();
    if !with_intent {
        // The mutation: straight to the post.
    } else if rec.intent.is_some() {
        // Rule 2: look for what the crashed attempt may have made.
        if !ClaimAssignment::new(c, NS, NAME).take_over(UID, &token, now)? {
            return Ok(Answer::InProgress);
        }
        if let Some(found) = ledger.all().first() {
            return record_or_undo(c, ledger, &token, found);
        }
    } else if !ClaimAssignment::new(c, NS, NAME).begin(UID, &token, now)? {
        return Ok(Answer::InProgress);
    }
    ledger.post(id);
    record_or_undo(c, ledger, &token, id)
}

fn record_or_undo<K: KvStore>(
    c: &Ctx<'_, K>,
    ledger: &Ledger,
    token: &str,
    id: &str,
) -> Result<Answer> {
    if ClaimAssignment::new(c, NS, NAME).recorded(UID, token, id)? {
        return Ok(Answer::Assigned(id.to_string()));
    }
    // Rule 4: a late duplicate, or the claim is going.
    ledger.delete(id);
    ClaimAssignment::new(c, NS, NAME).withdraw(token, None)?;
    Ok(match assign::read(c.kv, NS, NAME)? {
        Some(r) if r.uid == UID && !r.closed => match r.assignment {
            Some(a) => Answer::Assigned(a),
            None => Answer::InProgress,
        },
        _ => Answer::Closed,
    })
}

/// The unassign step, as `assign::unassign` runs it.
fn unassigner<K: KvStore>(
    c: &Ctx<'_, K>,
    ledger: &Ledger,
    now: u64,
    wait_for_intent: bool,
) -> Result<Answer> {
    let mut deleted = None;
    for _ in 0..4 {
        let rec = match ClaimAssignment::new(c, NS, NAME).close(UID)? {
            Closing::Closed => {
                ledger.closed_seen.store(true, Ordering::SeqCst);
                return Ok(Answer::Done(deleted));
            }
            Closing::Holds(rec) => rec,
        };
        if let Some(id) = &rec.assignment {
            ledger.delete(id);
            ClaimAssignment::new(c, NS, NAME).cleared(UID, id, false)?;
            deleted = Some(id.clone());
            continue;
        }
        if rec.live_intent(now) {
            return Ok(if wait_for_intent {
                Answer::InProgress
            } else {
                Answer::Done(deleted)
            });
        }
        let token = c.env.token();
        if !ClaimAssignment::new(c, NS, NAME).take_over(UID, &token, now)? {
            continue;
        }
        if let Some(found) = ledger.all().first().cloned() {
            ledger.delete(&found);
            deleted = Some(found);
        }
        ClaimAssignment::new(c, NS, NAME).withdraw(&token, None)?;
    }
    Ok(Answer::Failed("Contention"))
}

fn answer(r: Result<Answer>) -> Answer {
    r.unwrap_or_else(|e: Error| Answer::Failed(e.reason()))
}

/// One instance handling the claim at `NOW` (or `LATER`).
fn instance<K: KvStore>(kv: &K, env: &SchedEnv, ledger: &Ledger, role: Role, n: usize) -> Answer {
    let c = ctx(kv, env);
    let id = format!("ip-{n}");
    answer(match role {
        Role::Assigner => assigner(&c, ledger, &id, NOW, true),
        Role::AssignerWithoutIntent => assigner(&c, ledger, &id, NOW, false),
        Role::AssignerAfterLease => assigner(&c, ledger, &id, LATER, true),
        Role::Unassigner => unassigner(&c, ledger, NOW, true),
        Role::UnassignerAfterLease => unassigner(&c, ledger, LATER, true),
        Role::UnassignerIgnoringIntent => unassigner(&c, ledger, NOW, false),
        Role::Releaser => releaser(&c, ledger, true),
        Role::ReleaserWithoutGuard => releaser(&c, ledger, false),
    })
}

/// Recovery after the lease, single-threaded, as the steps run it: for a
/// claim being deleted, unassign until done; otherwise assign until
/// assigned.
fn recover(kv: &MemKv, env: &SchedEnv, ledger: &Ledger, unassigning: bool) -> Verdict {
    // The store's clock too (a creation stalled by a crashed guard winner
    // is taken over a minute after it was noted).
    env.0.set_now(LATER);
    let c = ctx(kv, env);
    let closed = assign::read(kv, NS, NAME)
        .map_err(|e| e.to_string())?
        .is_some_and(|r| r.closed);
    if unassigning || closed {
        let mut last = Answer::InProgress;
        for _ in 0..3 {
            last = answer(unassigner(&c, ledger, LATER, true));
            if matches!(last, Answer::Done(_)) {
                break;
            }
        }
        let rec = assign::read(kv, NS, NAME).map_err(|e| e.to_string())?;
        let clean = rec
            .as_ref()
            .is_some_and(|r| r.closed && !r.holds() && r.uid == UID);
        if !matches!(last, Answer::Done(_)) || !clean || !ledger.all().is_empty() {
            return Err(format!(
                "after unassign recovery: answered {last:?}, ledger {:?}, record {rec:?}",
                ledger.all()
            ));
        }
        let late = answer(assigner(&c, ledger, "ip-late", LATER, true));
        if late != Answer::Closed || !ledger.all().is_empty() {
            return Err(format!(
                "an assigner after the close answered {late:?}, ledger {:?}",
                ledger.all()
            ));
        }
        return Ok(());
    }
    let mut last = Answer::InProgress;
    for _ in 0..3 {
        last = answer(assigner(&c, ledger, "ip-recovery", LATER, true));
        if matches!(last, Answer::Assigned(_)) {
            break;
        }
    }
    let rec = assign::read(kv, NS, NAME).map_err(|e| e.to_string())?;
    let held = rec.as_ref().and_then(|r| r.assignment.clone());
    let all = ledger.all();
    if all.len() != 1
        || held.as_ref() != all.first()
        || last != Answer::Assigned(all[0].clone())
        || rec.as_ref().is_some_and(|r| r.intent.is_some())
    {
        return Err(format!(
            "after assign recovery: answered {last:?}, ledger {all:?}, record {rec:?}"
        ));
    }
    let again = answer(assigner(&c, ledger, "ip-again", LATER, true));
    if again != last || ledger.all() != all {
        return Err(format!(
            "a further assign answered {again:?}, ledger {:?}",
            ledger.all()
        ));
    }
    Ok(())
}

fn check(
    kv: &MemKv,
    env: &SchedEnv,
    ledger: &Ledger,
    roles: &[Role],
    answers: &[Answer],
    crashed: bool,
) -> Verdict {
    // An instance that overruns its lease may post while another one,
    // after the lease, posts or closes: a transient duplicate, or a post
    // after the close, that the late `recorded` refusal undoes (rule 4).
    let lease_kept = !roles.iter().any(|r| r.after_lease());
    let seen = ledger.violations();
    if lease_kept && !seen.is_empty() {
        return Err(seen.join("; "));
    }
    let all = ledger.all();
    if answers.iter().any(|a| matches!(a, Answer::Done(_))) && !all.is_empty() {
        return Err(format!("an unassigner answered done, ledger {all:?}"));
    }
    // A released address: nothing may be assigned now, and recovery
    // closes the record (a late assigner posts nothing).
    let released = roles.iter().any(|r| r.releases()) && !bound(kv);
    let unassigning = roles.iter().any(|r| r.unassigns()) || released;
    if !crashed {
        let rec = assign::read(kv, NS, NAME).map_err(|e| e.to_string())?;
        let held: Vec<String> = rec.iter().filter_map(|r| r.assignment.clone()).collect();
        let intent = rec.as_ref().and_then(|r| r.intent.clone());
        let failed = answers.iter().any(|a| matches!(a, Answer::Failed(_)));
        if held != all || intent.is_some() || failed || (!unassigning && all.len() != 1) {
            // (Unless a release went first: then nothing was assigned.)
            return Err(format!("without a crash: ledger {all:?}, record {rec:?}"));
        }
    }
    if released && !all.is_empty() {
        return Err(format!("the address was released while assigned: {all:?}"));
    }
    recover(kv, env, ledger, unassigning)?;
    match &ledger.violations()[seen.len()..] {
        [] => Ok(()),
        v => Err(format!("in recovery: {}", v.join("; "))),
    }
}

fn one_schedule(
    backend: Backend,
    start: Start,
    roles: &[Role],
    chooser: &mut dyn Chooser,
    crashes: usize,
) -> Verdict {
    let kv = MemKv::new(backend);
    let env = SchedEnv(TestEnv::at(NOW));
    let ledger = Ledger::default();
    bind(&ctx(&kv, &env));
    if start == Start::Prepared {
        ClaimAssignment::new(&ctx(&kv, &env), NS, NAME)
            .prepare(&want())
            .unwrap();
    }
    let fns: Vec<_> = roles
        .iter()
        .enumerate()
        .map(|(n, &role)| {
            let (env, ledger) = (&env, &ledger);
            move |k: &sched::SchedKv<'_, MemKv>| instance(k, env, ledger, role, n)
        })
        .collect();
    let (answers, trace) = sched::run(&kv, fns, chooser, crashes, 2_000);
    check(&kv, &env, &ledger, roles, &answers, trace.crashed).map_err(|v| {
        format!(
            "{backend:?}, {start:?}, {roles:?}: {v}\nanswers: {answers:?}, crashed: {}",
            trace.crashed
        )
    })
}

/// Every schedule of `roles` from `start` on `backend` with up to `crashes`
/// crashes: the number run, or the first violation and its number.
fn explore_dfs(
    backend: Backend,
    start: Start,
    roles: &[Role],
    crashes: usize,
) -> std::result::Result<usize, (String, usize)> {
    let mut dfs = Dfs::default();
    dfs.start();
    let mut n = 0;
    loop {
        n += 1;
        if let Err(v) = one_schedule(backend, start, roles, &mut dfs, crashes) {
            return Err((v, n));
        }
        if !dfs.next_schedule() {
            return Ok(n);
        }
    }
}

/// Every schedule of `roles` from a prepared record with up to one crash,
/// then PCT samples of them from an empty store (every schedule of the
/// record's creation race, the losers spinning on its guard, is far too
/// many), on every backend: the numbers of schedules run.
fn pairs(roles: &[Role]) -> (usize, usize) {
    let (mut every, mut sampled) = (0, 0);
    for backend in BACKENDS {
        match explore_dfs(backend, Start::Prepared, roles, 1) {
            Ok(n) => every += n,
            Err((v, n)) => panic!("{v}\nschedule #{}", every + n),
        }
        for seed in 0..PAIR_SEEDS {
            sampled += 1;
            let mut pct = Pct::new(seed, 2, 30);
            if let Err(v) = one_schedule(backend, Start::Empty, roles, &mut pct, 1) {
                panic!("{v}\nPCT seed {seed}");
            }
        }
    }
    (every, sampled)
}

/// Two assigners (the same event twice at once), every schedule, up to one
/// crash, on every backend.
#[test]
fn two_assigners_assign_once_under_every_schedule() {
    let (every, sampled) = pairs(&[Role::Assigner, Role::Assigner]);
    println!(
        "assign interleavings: {every} schedules of two assigners, {sampled} more under PCT from an empty store"
    );
    assert!(every > 1_000, "{every} schedules");
}

/// An assigner and an unassigner (the claim deleted while it is being
/// assigned), every schedule, up to one crash, on every backend.
#[test]
fn an_assigner_and_an_unassigner_leave_nothing_under_every_schedule() {
    let (every, sampled) = pairs(&[Role::Assigner, Role::Unassigner]);
    println!(
        "assign interleavings: {every} schedules of an assigner and an unassigner, {sampled} more under PCT from an empty store"
    );
    assert!(every > 1_000, "{every} schedules");
}

/// A release racing an assigner or an unassigner (a claim's binding
/// released while its address is being assigned or unassigned), every
/// schedule, up to one crash, on every backend.
#[test]
fn a_release_never_frees_an_assigned_address_under_every_schedule() {
    let mut total = (0, 0);
    for roles in [
        [Role::Assigner, Role::Releaser],
        [Role::Unassigner, Role::Releaser],
    ] {
        let (every, sampled) = pairs(&roles);
        total.0 += every;
        total.1 += sampled;
    }
    println!(
        "assign interleavings: {} schedules of a release with an assigner or an unassigner, {} more under PCT from an empty store",
        total.0, total.1
    );
    assert!(total.0 > 1_000, "{} schedules", total.0);
}

/// The checker catches a release that does not ask the guard (the address
/// freed while it is assigned).
#[test]
fn the_checker_catches_a_release_without_the_guard() {
    let roles = [Role::Assigner, Role::ReleaserWithoutGuard];
    match explore_dfs(Backend::SpinSqlite, Start::Prepared, &roles, 0) {
        Ok(n) => panic!("{n} schedules of the mutation passed"),
        Err((v, n)) => {
            assert!(v.contains("released"), "{v}");
            println!("assign interleavings: a release without the guard caught at schedule #{n}");
        }
    }
}

/// Two assigners and an unassigner, sampled with PCT.
#[test]
fn two_assigners_and_an_unassigner_under_pct_schedules() {
    let roles = [Role::Assigner, Role::Assigner, Role::Unassigner];
    let mut total = 0;
    for backend in BACKENDS {
        for start in [Start::Empty, Start::Prepared] {
            for seed in 0..TRIPLE_SEEDS {
                total += 1;
                let mut pct = Pct::new(seed, 3, 30);
                if let Err(v) = one_schedule(backend, start, &roles, &mut pct, 1) {
                    panic!("{v}\nPCT seed {seed}");
                }
            }
        }
    }
    println!("assign interleavings: {total} PCT schedules of two assigners and an unassigner");
}

/// An instance that overruns its lease (its `POST` outlasts it) while an
/// assigner or an unassigner starts after the lease, without crashes (a
/// crash of the late instance between its post and its refused `recorded`
/// would leak: the lease is an assumption of the protocol, not something
/// it can check): every schedule on every backend, except the unassigner
/// on Redis's semantics, whose read-backs make far too many (sampled with
/// PCT). The late `recorded` refusal (rule 4) is exercised here only.
#[test]
fn an_instance_past_its_lease_is_undone_under_every_schedule() {
    let (mut every, mut sampled) = (0, 0);
    for backend in BACKENDS {
        for roles in [
            [Role::Assigner, Role::AssignerAfterLease],
            [Role::Assigner, Role::UnassignerAfterLease],
        ] {
            if backend != Backend::SpinSqlite && roles[1] == Role::UnassignerAfterLease {
                for seed in 0..PAIR_SEEDS {
                    sampled += 1;
                    let mut pct = Pct::new(seed, 2, 30);
                    if let Err(v) = one_schedule(backend, Start::Prepared, &roles, &mut pct, 0) {
                        panic!("{v}\nPCT seed {seed}");
                    }
                }
                continue;
            }
            match explore_dfs(backend, Start::Prepared, &roles, 0) {
                Ok(n) => every += n,
                Err((v, n)) => panic!("{v}\nschedule #{}", every + n),
            }
        }
    }
    println!(
        "assign interleavings: {every} schedules with an instance past its lease, {sampled} more under PCT"
    );
    assert!(every > 1_000, "{every} schedules");
}

/// The checker catches an assigner that posts without an intent (two
/// assignments at once, even when the loser then deletes its duplicate).
#[test]
fn the_checker_catches_a_post_without_an_intent() {
    let roles = [Role::AssignerWithoutIntent, Role::AssignerWithoutIntent];
    match explore_dfs(Backend::SpinSqlite, Start::Prepared, &roles, 0) {
        Ok(n) => panic!("{n} schedules of the mutation passed"),
        Err((v, n)) => {
            assert!(v.contains("two assignments at once"), "{v}");
            println!("assign interleavings: a post without an intent caught at schedule #{n}");
        }
    }
}

/// The checker catches an unassigner that answers done over a live intent
/// (the assignment in progress would stay after the address is released).
#[test]
fn the_checker_catches_an_unassign_done_over_a_live_intent() {
    let roles = [Role::Assigner, Role::UnassignerIgnoringIntent];
    match explore_dfs(Backend::SpinSqlite, Start::Prepared, &roles, 0) {
        Ok(n) => panic!("{n} schedules of the mutation passed"),
        Err((v, n)) => {
            assert!(v.contains("answered done"), "{v}");
            println!("assign interleavings: done over a live intent caught at schedule #{n}");
        }
    }
}
