//! The interleaving checker over the network apply record
//! (`net/device/<uuid>`): the store decisions of an apply invocation
//! (`take_lease`, `record_step`, `set_batch`, `finish`, `release_lease`,
//! `read`) run by two or three instances at once, every KV operation a
//! yield point, a crash possible before any of them, on each backend's real
//! compare-and-swap semantics (see `interleavings.rs`).
//!
//! An instance runs the algorithm of `apply::apply` and its `rounds` on one
//! device whose plan is three steps on `bond0` (convert to layer 2, a batch
//! assigning a VLAN, the native VLAN): take the lease (refused: answer in
//! progress); then, each round, read the record; poll the running step if
//! there is one (a batch by its id; else the port's state) and `finish` it
//! once its effect shows; else plan (the first step whose effect does not
//! show), `record_step`, check its own clock against the lease it took
//! (`Holder::may_call`), make the call, and `set_batch` with the batch id
//! Metal answered; at the end, `release_lease`. Every write but the
//! lease's own is fenced (the record must name the instance as the lease's
//! owner, unexpired by its clock); a fenced instance stops and answers in
//! progress. Metal is a ledger of the
//! calls made: a call's effect shows at once (a batch completes at once), so
//! the planner, which is pure, plans exactly the steps not in the ledger. A
//! crash before the KV operation that follows a call is a crash after Metal
//! acted and before the store recorded its answer. Every instance has a
//! clock of its own (its `Env`), so a schedule may also run an instance that
//! starts after another one's lease while that one still runs.
//!
//! A schedule starts from an idle record (a previous apply released its
//! lease), from a stale one (a crashed instance's expired lease and its
//! running batch, made, whose answer was lost), or from an empty store,
//! where the first `take_lease` creates the record (sampled with PCT only:
//! every schedule of the creation race is far too many). Pairs are
//! enumerated exhaustively with up to one crash: from a stale record on
//! every backend; from an idle one, the whole plan on SQLite's semantics
//! and its last two steps (the batch, the native VLAN) on Redis's, whose
//! read-backs multiply the schedules. On Spin 3.6 Redis's, whose swaps are
//! read back as Redis's are (so its schedules are Redis's), the idle pair
//! runs those two steps without a crash and the whole plan under PCT with
//! one. Triples are sampled with PCT. While the lease is honoured, a
//! retrying instance is not scheduled while another can run (see
//! [`ApplyEnv`]).
//!
//! Not modelled: Metal's errors (a 422, a lost answer that is not a crash,
//! a failed batch), an effect that shows late or never after a call (the
//! step is then re-planned after `RUNNING_S` by design, so a second call is
//! the protocol's answer, not a violation), and the rounds' time budget
//! (every clock is fixed).
//!
//! Invariants, checked at every lease taken and every call made (not only
//! at the end):
//! - two instances never both pass `take_lease` with overlapping leases;
//! - a call is made only by the lease's holder, within its lease by the
//!   caller's clock, with more than `CALL_S` of it left (the call ends
//!   inside the lease);
//! - a call is made only after `record_step` recorded it (as running, for an
//!   asynchronous step; in the history, for the native VLAN), so a crash
//!   after the call leaves it to be polled;
//! - no plan step is called twice;
//! - without a crash, the record ends with no lease, no running step, and
//!   the history is the plan; some instance answered converged, none failed;
//! - recovery: once the leases passed, fresh invocations (later still, when
//!   a running step never shows, past `RUNNING_S`) converge: every step
//!   called exactly once, no lease, no running step; a further invocation
//!   makes no call.
//!
//! One more set of schedules has an instance outlive its lease: it stalls
//! (a paused process, a slow store operation) and another instance starts
//! after its lease ended. Its clock jumps past its lease at the moment the
//! later instance makes its first store operation (before that, nothing
//! tells the two apart from a schedule where the stall came later), at
//! whatever store operation it is: inside a compare-and-swap, between a
//! swap and its read-back, between two rounds. The only assumption is the
//! one the lead's timeouts make true: nothing stalls between the last
//! check before a call (`may_call`, no store operation) and the end of the
//! call (bounded by the 10 s request budget, `CALL_S`). There the same
//! invariants hold, all of them: no call outside the lease (checked at the
//! call against the record and the caller's clock, with `CALL_S` to spare),
//! no step called twice; the stalled instance stops at its next write or
//! call (the number of schedules where it was fenced is printed).
//!
//! Two mutations (calling Metal before `record_step`; going on when
//! `take_lease` refuses) are run too: the checker must catch them.
//!
//! The number of schedules explored is printed.

#[path = "interleavings/apply_kit.rs"]
mod apply_kit;
#[path = "interleavings/sched.rs"]
mod sched;

use std::sync::Mutex;

use metal_ipam_core::error::{Error, Result};
use metal_ipam_core::kv::Ctx;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use metal_ipam_core::network::apply::{
    self, Holder, StepRecord, CALL_S, LEASE_S, MAX_ROUNDS, RUNNING_S,
};
use metal_ipam_core::network::plan::{Action, PortStep};
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::ports::Env;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};

use apply_kit::{every_dfs, ApplyEnv, Resumes, LATER, NOW};
use sched::{Chooser, Pct, SchedEnv};

const DEVICE: &str = "d1";
const PORT_ID: &str = "7c1c4f9e-port-bond0";
const VLAN: &str = "5a1f0e2d-vlan-1000";
/// The instance number of the crashed invocation of [`Start::Stale`].
const GHOST: usize = 99;

/// PCT schedules per backend: pairs from an empty store (and from an idle
/// record on Spin 3.6 Redis); triples from each start; pairs with an
/// instance outliving its lease, from each start and crash budget.
const PAIR_SEEDS: u64 = 150;
const TRIPLE_SEEDS: u64 = 60;
const EXPIRY_SEEDS: u64 = 200;

const BACKENDS: [Backend; 3] = [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36];

/// What a check concludes: a violation, described.
type Verdict = std::result::Result<(), String>;

/// The device's plan: convert to layer 2, assign a VLAN (a batch), set it
/// native; its last `steps` steps.
fn plan(steps: usize) -> Vec<PortStep> {
    let step = |action| PortStep {
        port: "bond0".into(),
        port_id: PORT_ID.into(),
        action,
    };
    let all = [
        step(Action::ConvertLayer2),
        step(Action::Assign(vec![VLAN.into()])),
        step(Action::SetNative(VLAN.into())),
    ];
    all[all.len() - steps..].to_vec()
}

/// One Metal call.
#[derive(Debug, Clone)]
struct Call {
    step: usize,
    by: usize,
}

/// A lease an instance took.
#[derive(Debug, Clone)]
struct Grant {
    by: usize,
    from: u64,
    /// The instance still works under it (not yet releasing it; a crashed
    /// holder's lease stands until it ends).
    active: bool,
}

/// Metal, as far as the protocol can tell: the calls made on the device's
/// port, and what the checker saw at each lease taken and call made.
struct Metal {
    plan: Vec<PortStep>,
    calls: Mutex<Vec<Call>>,
    grants: Mutex<Vec<Grant>>,
    violations: Mutex<Vec<String>>,
}

impl Metal {
    fn new(steps: usize) -> Metal {
        Metal {
            plan: plan(steps),
            calls: Mutex::default(),
            grants: Mutex::default(),
            violations: Mutex::default(),
        }
    }
    fn records(&self) -> Vec<StepRecord> {
        self.plan.iter().map(StepRecord::of).collect()
    }
    /// Whether every step was called (at least once).
    fn all_called(&self) -> bool {
        (0..self.plan.len()).all(|i| self.in_effect(i))
    }
    fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }
    fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    fn called(&self, step: usize) -> usize {
        self.calls().iter().filter(|c| c.step == step).count()
    }
    /// Whether plan step `step`'s effect shows on the port.
    fn in_effect(&self, step: usize) -> bool {
        self.called(step) > 0
    }
    /// Whether the effect of a recorded step shows (a re-read of the port).
    fn shows(&self, rec: &StepRecord) -> bool {
        self.plan
            .iter()
            .map(StepRecord::of)
            .position(|r| r == *rec)
            .is_some_and(|i| self.in_effect(i))
    }

    /// Instance `by` passed `take_lease` at `now`.
    fn granted(&self, by: usize, now: u64) {
        let mut grants = self.grants.lock().unwrap();
        for g in grants.iter().filter(|g| g.active && g.by != by) {
            if g.from < now + LEASE_S && now < g.from + LEASE_S {
                self.violation(format!(
                    "leases overlap: #{by} took one at {now}, #{} holds the one taken at {}",
                    g.by, g.from
                ));
            }
        }
        grants.push(Grant {
            by,
            from: now,
            active: true,
        });
    }
    /// Instance `by` stops working under its lease (before it releases it).
    fn releasing(&self, by: usize) {
        for g in self.grants.lock().unwrap().iter_mut() {
            if g.by == by {
                g.active = false;
            }
        }
    }

    /// Instance `by` (lease token `token`, clock `now`) makes plan step
    /// `step`'s call; the batch id Metal answers, for a batch. `kv` is the
    /// store itself (read without a yield point: only this thread runs).
    fn call(&self, kv: &MemKv, by: usize, token: &str, now: u64, step: usize) -> Option<String> {
        let s = &self.plan[step];
        let rec = StepRecord::of(s);
        let state = apply::read(kv, DEVICE).expect("the record reads");
        match &state.lease {
            Some(l) if l.owner == token && now + CALL_S < l.until => {}
            l => self.violation(format!(
                "step {step} called by #{by} at {now} without holding the lease to the call's end (lease {l:?})"
            )),
        }
        let recorded = match &s.action {
            Action::SetNative(_) | Action::RemoveNative => state.history.last() == Some(&rec),
            _ => state.running.as_ref().is_some_and(|r| r.step == rec),
        };
        if !recorded {
            self.violation(format!(
                "step {step} called by #{by} before it was recorded (running {:?})",
                state.running
            ));
        }
        let mut calls = self.calls.lock().unwrap();
        if let Some(first) = calls.iter().find(|c| c.step == step) {
            self.violation(format!(
                "step {step} called twice: by #{} and by #{by}",
                first.by
            ));
        }
        calls.push(Call { step, by });
        matches!(s.action, Action::Assign(_) | Action::Unassign(_))
            .then(|| format!("batch-{}", calls.len()))
    }
}

fn ctx<'a, K: KvStore>(kv: &'a K, env: &'a ApplyEnv<'a>) -> Ctx<'a, K> {
    Ctx::auto(kv, env)
}

/// What an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// An apply at `NOW`.
    Instance,
    /// An apply at `NOW` that stalls: its clock jumps to `LATER` (its lease
    /// ended) when an [`Role::AfterLease`] instance first runs.
    Stalls,
    /// An apply at `LATER`, when the lease of an instance at `NOW` ended
    /// (that one may still be running: it stalled).
    AfterLease,
    /// Mutation: makes each step's call before `record_step`.
    CallFirst,
    /// Mutation: goes on when `take_lease` refuses.
    IgnoreLease,
    /// Mutation: a [`Role::Stalls`] that calls without checking its clock
    /// against its lease after `record_step`.
    StallsUnfenced,
}

impl Role {
    fn now(self) -> u64 {
        match self {
            Role::AfterLease => LATER,
            _ => NOW,
        }
    }
}

/// What an instance answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Converged,
    /// Another instance holds the lease (seconds left).
    Busy(u64),
    /// A step is running and its effect does not show yet.
    Polling,
    /// `MAX_ROUNDS` rounds were not enough.
    MoreSteps,
    /// Its lease ended or passed on: it stopped (fenced).
    Fenced,
    Failed(&'static str),
}

/// Where a schedule starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// No record: the first `take_lease` creates it.
    Empty,
    /// The record exists, with no lease (a previous apply released it).
    Idle,
    /// A crashed instance's lease, expired at `NOW`, and its running batch
    /// (step 1): made, its answer lost (no batch id recorded).
    Stale,
}

/// `apply::apply`: the lease, the rounds, the release (the instance's
/// clock is its `Env`'s).
fn invocation<K: KvStore>(
    c: &Ctx<'_, K>,
    kv: &MemKv,
    metal: &Metal,
    role: Role,
    n: usize,
) -> Result<Answer> {
    let token = c.env.token();
    let now = c.env.now();
    if let Some(left) = apply::DeviceRecord::new(c, DEVICE).take_lease(&token, now)? {
        if role != Role::IgnoreLease {
            return Ok(Answer::Busy(left));
        }
    }
    metal.granted(n, now);
    let holder = Holder {
        token: &token,
        until: now + LEASE_S,
    };
    let out = match rounds(c, kv, metal, role, n, &holder, now) {
        Err(e) if e.reason() == "LeaseLost" => Ok(Answer::Fenced),
        other => other,
    };
    // A crashed instance's lease stands (it expires); any other stops
    // working here.
    if !matches!(&out, Err(e) if crashed(e)) {
        metal.releasing(n);
    }
    apply::DeviceRecord::new(c, DEVICE).release_lease(&token)?;
    out
}

/// `apply::rounds` with Metal as the ledger.
fn rounds<K: KvStore>(
    c: &Ctx<'_, K>,
    kv: &MemKv,
    metal: &Metal,
    role: Role,
    n: usize,
    holder: &Holder<'_>,
    started: u64,
) -> Result<Answer> {
    let plan = &metal.plan;
    let token = holder.token;
    for _ in 0..MAX_ROUNDS {
        let now = c.env.now();
        if now >= started + LEASE_S / 2 {
            break;
        }
        let state = apply::read(c.kv, DEVICE)?;
        if let Some(r) = &state.running {
            // A batch step: its batch by id (Metal's complete at once), or,
            // without an id, the port's unfinished batch (none); anything
            // else (and a batch step without a batch), a re-read of the
            // port.
            let done = match (&r.batch, r.step.action.ends_with("-vlans")) {
                (Some(_), true) => true,
                _ => metal.shows(&r.step),
            };
            if !done && now < r.at.saturating_add(RUNNING_S) {
                return Ok(Answer::Polling);
            }
            apply::DeviceRecord::new(c, DEVICE).finish(token, None)?;
            continue;
        }
        let Some(next) = (0..plan.len()).find(|&i| !metal.in_effect(i)) else {
            return Ok(Answer::Converged);
        };
        let batch = if role == Role::CallFirst {
            let batch = metal.call(kv, n, token, c.env.now(), next);
            apply::DeviceRecord::new(c, DEVICE).record_step(token, &plan[next], c.env.now())?;
            batch
        } else {
            apply::DeviceRecord::new(c, DEVICE).record_step(token, &plan[next], c.env.now())?;
            // The fence's last check, on the instance's own clock; no store
            // operation (no yield point) until the call is made.
            if role != Role::StallsUnfenced && !holder.may_call(c.env.now()) {
                return Ok(Answer::Fenced);
            }
            metal.call(kv, n, token, c.env.now(), next)
        };
        if let Some(b) = batch {
            apply::DeviceRecord::new(c, DEVICE).set_batch(
                token,
                &StepRecord::of(&plan[next]),
                &b,
            )?;
        }
    }
    Ok(Answer::MoreSteps)
}

/// A scheduled crash (the only store failure of these schedules).
fn crashed(e: &Error) -> bool {
    e.reason() == "StoreUnavailable"
}

fn answer(r: Result<Answer>) -> Answer {
    r.unwrap_or_else(|e| Answer::Failed(e.reason()))
}

/// Whether the record can never be created: its creation-guard winner
/// crashed between the guard and the key (the documented known limit of
/// every record; an operator deletes the `net-init/…` key).
fn stuck(kv: &MemKv) -> bool {
    kv.get(&format!("net/device/{DEVICE}")).unwrap().is_none()
        && kv
            .get(&format!("net-init/device/{DEVICE}"))
            .unwrap()
            .is_some()
}

/// Recovery, single-threaded, once every lease of the schedule passed:
/// invocations until converged, each later than the last (past
/// `RUNNING_S` when a running step never shows); then one more, which must
/// make no call. Every step must end called exactly once.
fn recover(kv: &MemKv, rand: &SchedEnv, metal: &Metal, roles: &[Role]) -> Verdict {
    let clock = AtomicU64::new(roles.iter().map(|r| r.now()).max().unwrap_or(NOW) + LEASE_S);
    let env = ApplyEnv {
        env: rand,
        defer_from: 1,
        clock: &clock,
    };
    let c = ctx(kv, &env);
    let mut last = Answer::MoreSteps;
    for k in 0..4 {
        last = answer(invocation(&c, kv, metal, Role::Instance, 100 + k));
        match last {
            Answer::Converged => break,
            Answer::Busy(left) => {
                clock.fetch_add(left, Ordering::SeqCst);
            }
            Answer::Polling => {
                clock.fetch_add(RUNNING_S, Ordering::SeqCst);
            }
            Answer::MoreSteps | Answer::Fenced => {}
            Answer::Failed(_) => break,
        }
    }
    let rec = apply::read(kv, DEVICE).map_err(|e| e.to_string())?;
    let counts: Vec<usize> = (0..metal.plan.len()).map(|i| metal.called(i)).collect();
    let once = counts.iter().all(|&n| n == 1);
    if last != Answer::Converged || !once || rec.lease.is_some() || rec.running.is_some() {
        return Err(format!(
            "after recovery: answered {last:?}, calls per step {counts:?}, record {rec:?}"
        ));
    }
    let before = metal.calls().len();
    let again = answer(invocation(&c, kv, metal, Role::Instance, 200));
    if again != Answer::Converged || metal.calls().len() != before {
        return Err(format!(
            "a further apply answered {again:?}, calls {:?}",
            metal.calls()
        ));
    }
    Ok(())
}

/// Checks a schedule's end.
fn check(
    kv: &MemKv,
    rand: &SchedEnv,
    metal: &Metal,
    roles: &[Role],
    answers: &[Answer],
    crashed: bool,
) -> Verdict {
    let seen = metal.violations();
    if !seen.is_empty() {
        return Err(seen.join("; "));
    }
    if stuck(kv) {
        // Nobody could take a lease, so nobody called.
        return match metal.calls().as_slice() {
            [] => Ok(()),
            all => Err(format!("called {all:?} without a record")),
        };
    }
    if !crashed {
        let rec = apply::read(kv, DEVICE).map_err(|e| e.to_string())?;
        let failed = answers.iter().any(|a| matches!(a, Answer::Failed(_)));
        // A stalled instance fenced between recording a step and calling
        // it leaves the step running, uncalled: the next holder polls it
        // and plans it again after `RUNNING_S` (recovery below). Without a
        // stall, the schedule itself ends converged.
        let done = roles
            .iter()
            .any(|r| matches!(r, Role::Stalls | Role::StallsUnfenced))
            || (answers.contains(&Answer::Converged)
                && metal.all_called()
                && rec.history == metal.records()
                && rec.running.is_none());
        if failed || !done || rec.lease.is_some() {
            return Err(format!(
                "without a crash: answers {answers:?}, calls {:?}, record {rec:?}",
                metal.calls()
            ));
        }
    }
    recover(kv, rand, metal, roles)?;
    match metal.violations().as_slice() {
        [] => Ok(()),
        v => Err(format!("in recovery: {}", v.join("; "))),
    }
}

/// Prepares `start` (for [`Start::Stale`], the state a crashed apply
/// left: the steps before the batch done, the batch recorded running and
/// made, its answer lost, the lease expired at `NOW`).
fn setup(kv: &MemKv, rand: &SchedEnv, metal: &Metal, start: Start) {
    let then = match start {
        Start::Stale => NOW - LEASE_S,
        _ => NOW,
    };
    let clock = AtomicU64::new(then);
    let env = ApplyEnv {
        env: rand,
        defer_from: 1,
        clock: &clock,
    };
    let c = ctx(kv, &env);
    match start {
        Start::Empty => {}
        Start::Idle => {
            let token = env.token();
            assert_eq!(
                apply::DeviceRecord::new(&c, DEVICE)
                    .take_lease(&token, NOW)
                    .unwrap(),
                None
            );
            apply::DeviceRecord::new(&c, DEVICE)
                .release_lease(&token)
                .unwrap();
        }
        Start::Stale => {
            let token = env.token();
            assert_eq!(
                apply::DeviceRecord::new(&c, DEVICE)
                    .take_lease(&token, then)
                    .unwrap(),
                None
            );
            for (step, s) in metal.plan.iter().enumerate() {
                apply::DeviceRecord::new(&c, DEVICE)
                    .record_step(&token, s, then)
                    .unwrap();
                metal.calls.lock().unwrap().push(Call { step, by: GHOST });
                if matches!(s.action, Action::Assign(_)) {
                    break;
                }
                apply::DeviceRecord::new(&c, DEVICE)
                    .finish(&token, None)
                    .unwrap();
            }
        }
    }
}

/// How a schedule went, beyond its verdict.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    /// An instance stopped because its lease ended or passed on.
    fenced: bool,
}

fn one_schedule(
    backend: Backend,
    start: Start,
    steps: usize,
    roles: &[Role],
    chooser: &mut dyn Chooser,
    crashes: usize,
) -> std::result::Result<Seen, String> {
    let kv = MemKv::new(backend);
    let honoured = !roles
        .iter()
        .any(|r| matches!(r, Role::Stalls | Role::StallsUnfenced | Role::IgnoreLease));
    let rand = SchedEnv(TestEnv::at(NOW));
    let metal = Metal::new(steps);
    setup(&kv, &rand, &metal, start);
    let clocks: Vec<AtomicU64> = roles.iter().map(|r| AtomicU64::new(r.now())).collect();
    // The clock a later instance's first operation moves past the stalled
    // instance's lease.
    let stalled = roles
        .iter()
        .position(|r| matches!(r, Role::Stalls | Role::StallsUnfenced))
        .map(|i| &clocks[i]);
    let fenced = AtomicUsize::new(0);
    let fns: Vec<_> = roles
        .iter()
        .enumerate()
        .map(|(n, &role)| {
            let (raw, rand, metal, clock, fenced) = (&kv, &rand, &metal, &clocks[n], &fenced);
            move |k: &sched::SchedKv<'_, MemKv>| {
                let env = ApplyEnv {
                    env: rand,
                    defer_from: if honoured { 1 } else { 3 },
                    clock,
                };
                let a = match (role, stalled) {
                    (Role::AfterLease, Some(stalled)) => {
                        let kv = Resumes { inner: k, stalled };
                        answer(invocation(&ctx(&kv, &env), raw, metal, role, n))
                    }
                    _ => answer(invocation(&ctx(k, &env), raw, metal, role, n)),
                };
                if a == Answer::Fenced {
                    fenced.fetch_add(1, Ordering::SeqCst);
                }
                a
            }
        })
        .collect();
    let (answers, trace) = sched::run(&kv, fns, chooser, crashes, 2_000);
    check(&kv, &rand, &metal, roles, &answers, trace.crashed).map_err(|v| {
        format!(
            "{backend:?}, {start:?}, {steps} steps, {roles:?}: {v}\nanswers: {answers:?}, crashed: {}",
            trace.crashed
        )
    })?;
    Ok(Seen {
        fenced: fenced.load(Ordering::SeqCst) > 0,
    })
}

/// Schedules explored, and how many had an instance fenced.
#[derive(Debug, Default)]
struct Tally {
    schedules: usize,
    fenced: usize,
}

impl Tally {
    fn add(&mut self, seen: Seen) {
        self.schedules += 1;
        self.fenced += usize::from(seen.fenced);
    }
}

/// Every schedule of `roles` from `start` on `backend` with up to `crashes`
/// crashes, until one's violation satisfies `stop`: the number run, or that
/// violation and its number.
fn explore_dfs(
    backend: Backend,
    start: Start,
    steps: usize,
    roles: &[Role],
    crashes: usize,
    stop: impl Fn(&str) -> bool,
) -> std::result::Result<usize, (String, usize)> {
    explore_dfs_tallied(
        backend,
        start,
        steps,
        roles,
        crashes,
        stop,
        &mut Tally::default(),
    )
}

/// [`explore_dfs`], counting into `tally`.
fn explore_dfs_tallied(
    backend: Backend,
    start: Start,
    steps: usize,
    roles: &[Role],
    crashes: usize,
    stop: impl Fn(&str) -> bool,
    tally: &mut Tally,
) -> std::result::Result<usize, (String, usize)> {
    every_dfs(
        |dfs| one_schedule(backend, start, steps, roles, dfs, crashes).map(|seen| tally.add(seen)),
        stop,
    )
}

/// Every schedule of `roles` from `start` with a plan of `steps` steps on
/// each of `backends` with up to `crashes` crashes: the number run.
fn every_schedule(
    start: Start,
    steps: usize,
    roles: &[Role],
    backends: &[Backend],
    crashes: usize,
) -> usize {
    let mut every = 0;
    for &backend in backends {
        match explore_dfs(backend, start, steps, roles, crashes, |_| true) {
            Ok(n) => every += n,
            Err((v, n)) => panic!("{v}\nschedule #{}", every + n),
        }
    }
    every
}

/// PCT samples (`seeds` per backend, `depth` change points) of `roles`
/// from `start` with the whole plan and up to `crashes` crashes, on each of
/// `backends`.
fn sampled(
    start: Start,
    roles: &[Role],
    backends: &[Backend],
    seeds: u64,
    depth: usize,
    crashes: usize,
) -> Tally {
    let mut tally = Tally::default();
    for &backend in backends {
        for seed in 0..seeds {
            let mut pct = Pct::new(seed, depth, 40);
            match one_schedule(backend, start, 3, roles, &mut pct, crashes) {
                Ok(seen) => tally.add(seen),
                Err(v) => panic!("{v}\nPCT seed {seed}"),
            }
        }
    }
    tally
}

const PAIR: [Role; 2] = [Role::Instance, Role::Instance];

/// Two applies at once (the same request twice, or the apply and the
/// `poll`) from an idle record, every schedule with up to one crash: the
/// whole plan on SQLite's semantics; on Spin 3.6 Redis's, the last two
/// steps (the batch and the native VLAN) without a crash, and PCT samples
/// of the whole plan with one (its swaps are all read back, as Redis's
/// are: the schedules are the same as Redis's, run with a crash below).
#[test]
fn two_applies_from_an_idle_record_under_every_schedule() {
    let sqlite = every_schedule(Start::Idle, 3, &PAIR, &[Backend::SpinSqlite], 1);
    let spin36 = every_schedule(Start::Idle, 2, &PAIR, &[Backend::RedisSpin36], 0);
    let pct = sampled(
        Start::Idle,
        &PAIR,
        &[Backend::RedisSpin36],
        PAIR_SEEDS,
        2,
        1,
    );
    println!(
        "apply interleavings: two applies from an idle record: {sqlite} schedules on SQLite (up to one crash), {spin36} on Spin 3.6 Redis (no crash), {} more under PCT there (up to one crash)",
        pct.schedules
    );
    assert!(
        sqlite > 1_000 && spin36 > 500,
        "{sqlite} + {spin36} schedules"
    );
}

/// Two applies from an idle record on Redis's semantics, every schedule
/// with up to one crash, the last two steps of the plan (the read-backs of
/// a loser's failed swap make many more schedules than on SQLite).
#[test]
fn two_applies_from_an_idle_record_on_redis_under_every_schedule() {
    let every = every_schedule(Start::Idle, 2, &PAIR, &[Backend::Redis], 1);
    println!(
        "apply interleavings: two applies from an idle record: {every} schedules on Redis (up to one crash)"
    );
    assert!(every > 10_000, "{every} schedules");
}

/// Two applies taking over a crashed one's expired lease and its running
/// batch whose answer was lost: every schedule, up to one crash, on every
/// backend.
#[test]
fn two_applies_after_a_crashed_one_under_every_schedule() {
    let every = every_schedule(Start::Stale, 3, &PAIR, &BACKENDS, 1);
    println!(
        "apply interleavings: {every} schedules of two applies after a crashed one (up to one crash)"
    );
    assert!(every > 5_000, "{every} schedules");
}

/// Two applies creating the record (every schedule of the creation race,
/// the loser spinning on its guard, is far too many), sampled with PCT.
#[test]
fn two_applies_from_an_empty_store_under_pct_schedules() {
    let pct = sampled(Start::Empty, &PAIR, &BACKENDS, PAIR_SEEDS, 2, 1);
    println!(
        "apply interleavings: {} PCT schedules of two applies from an empty store",
        pct.schedules
    );
}

/// Three applies at once, sampled with PCT from every start.
#[test]
fn three_applies_under_pct_schedules() {
    let roles = [Role::Instance; 3];
    let mut total = 0;
    for start in [Start::Empty, Start::Idle, Start::Stale] {
        total += sampled(start, &roles, &BACKENDS, TRIPLE_SEEDS, 3, 1).schedules;
    }
    println!("apply interleavings: {total} PCT schedules of three applies");
}

/// An apply that outlives its lease (it stalls; another starts after its
/// lease ended): every schedule with up to one crash on SQLite's semantics
/// from a crashed apply's record (the whole plan), and PCT samples of the
/// whole plan from both starts, with and without a crash, on every
/// backend: no call outside the lease, no step called twice, recovery
/// converges with every step called exactly once. (Run once each, too
/// long for every run of the suite, all passed: every schedule with up to
/// one crash on SQLite from an idle record, whole plan, 124,158, and on
/// Redis from a crashed apply's record, two steps, 189,849; without a
/// crash, two steps, on Redis and on Spin 3.6 Redis from a crashed apply's
/// record, 29,773 each, and on Redis from an idle record, 96,250.)
#[test]
fn an_apply_that_outlives_its_lease_never_calls_outside_it() {
    let roles = [Role::Stalls, Role::AfterLease];
    let dfs = |backend, start, steps, crashes| {
        let mut t = Tally::default();
        if let Err((v, n)) =
            explore_dfs_tallied(backend, start, steps, &roles, crashes, |_| true, &mut t)
        {
            panic!("{v}\nschedule #{n}");
        }
        t
    };
    let every = dfs(Backend::SpinSqlite, Start::Stale, 3, 1);
    let mut pct = Tally::default();
    for start in [Start::Idle, Start::Stale] {
        for crashes in [0, 1] {
            let t = sampled(start, &roles, &BACKENDS, EXPIRY_SEEDS, 3, crashes);
            pct.schedules += t.schedules;
            pct.fenced += t.fenced;
        }
    }
    println!(
        "apply interleavings: an apply outliving its lease: {} schedules (every one, up to one crash; the stalled apply fenced in {}), {} more under PCT (fenced in {}); no call outside the lease, no step called twice",
        every.schedules, every.fenced, pct.schedules, pct.fenced
    );
    assert!(
        every.fenced > 0 && pct.fenced > 0,
        "no schedule fenced the stalled apply"
    );
}

/// A holder whose lease passed on, or ended by its own clock, writes
/// nothing: `record_step`, `set_batch` and `finish` answer `LeaseLost`
/// and leave the record as the new holder has it.
#[test]
fn a_holder_that_lost_its_lease_writes_nothing() {
    let kv = MemKv::new(Backend::SpinSqlite);
    let rand = SchedEnv(TestEnv::at(NOW));
    let (a_clock, b_clock) = (AtomicU64::new(NOW), AtomicU64::new(LATER));
    let a_env = ApplyEnv {
        env: &rand,
        defer_from: 1,
        clock: &a_clock,
    };
    let b_env = ApplyEnv {
        env: &rand,
        defer_from: 1,
        clock: &b_clock,
    };
    let (a, b) = (ctx(&kv, &a_env), ctx(&kv, &b_env));
    let (ta, tb) = ("token-a", "token-b");
    let steps = plan(3);
    assert_eq!(
        apply::DeviceRecord::new(&a, DEVICE)
            .take_lease(ta, NOW)
            .unwrap(),
        None
    );
    assert!(apply::DeviceRecord::new(&a, DEVICE)
        .record_step(ta, &steps[1], NOW)
        .unwrap());
    // Its own lease, ended by its own clock.
    a_clock.store(LATER, Ordering::SeqCst);
    let rec = StepRecord::of(&steps[1]);
    let lost = |r: Result<()>| assert_eq!(r.unwrap_err().reason(), "LeaseLost");
    lost(apply::DeviceRecord::new(&a, DEVICE).set_batch(ta, &rec, "b-1"));
    lost(apply::DeviceRecord::new(&a, DEVICE).finish(ta, None));
    lost(
        apply::DeviceRecord::new(&a, DEVICE)
            .record_step(ta, &steps[2], LATER)
            .map(|_| ()),
    );
    // Within its lease but too close to its end for a call.
    a_clock.store(NOW, Ordering::SeqCst);
    lost(
        apply::DeviceRecord::new(&a, DEVICE)
            .record_step(ta, &steps[2], LATER - CALL_S)
            .map(|_| ()),
    );
    // Passed on: B took it after it ended.
    assert_eq!(
        apply::DeviceRecord::new(&b, DEVICE)
            .take_lease(tb, LATER)
            .unwrap(),
        None
    );
    let before = apply::read(&kv, DEVICE).unwrap();
    lost(apply::DeviceRecord::new(&a, DEVICE).set_batch(ta, &rec, "b-1"));
    lost(apply::DeviceRecord::new(&a, DEVICE).finish(ta, None));
    lost(
        apply::DeviceRecord::new(&a, DEVICE)
            .record_step(ta, &steps[2], NOW)
            .map(|_| ()),
    );
    assert_eq!(apply::read(&kv, DEVICE).unwrap(), before);
    apply::DeviceRecord::new(&a, DEVICE)
        .release_lease(ta)
        .unwrap();
    assert_eq!(
        apply::read(&kv, DEVICE).unwrap(),
        before,
        "A cannot release B's lease"
    );
    // B writes.
    apply::DeviceRecord::new(&b, DEVICE)
        .finish(tb, None)
        .unwrap();
    assert_eq!(apply::read(&kv, DEVICE).unwrap().running, None);
}

/// The checker catches a call made before `record_step`.
#[test]
fn the_checker_catches_a_call_before_its_record() {
    let roles = [Role::CallFirst, Role::Instance];
    match explore_dfs(Backend::SpinSqlite, Start::Idle, 3, &roles, 1, |_| true) {
        Ok(n) => panic!("{n} schedules of the mutation passed"),
        Err((v, n)) => {
            assert!(v.contains("before it was recorded"), "{v}");
            println!("apply interleavings: a call before its record caught at schedule #{n}");
        }
    }
}

/// The checker catches applies that go on when `take_lease` refuses: the
/// overlapping leases. (Neither calls a step twice any more: the one whose
/// lease was overwritten is fenced at its next write.)
#[test]
fn the_checker_catches_an_apply_ignoring_the_lease() {
    let roles = [Role::IgnoreLease, Role::IgnoreLease];
    match explore_dfs(Backend::SpinSqlite, Start::Idle, 3, &roles, 0, |v| {
        v.contains("leases overlap")
    }) {
        Ok(n) => panic!("{n} schedules of the mutation passed"),
        Err((v, n)) => println!(
            "apply interleavings: ignoring the lease caught (leases overlap) at schedule #{n}: {}",
            v.lines().next().unwrap_or_default()
        ),
    }
}

/// The checker catches a stalled apply that calls without checking its
/// clock after `record_step`: a call outside its lease. (Only where a swap
/// is read back, Redis's: on SQLite nothing separates the swap from the
/// call.)
#[test]
fn the_checker_catches_a_call_without_the_last_check() {
    let roles = [Role::StallsUnfenced, Role::AfterLease];
    match explore_dfs(Backend::Redis, Start::Idle, 3, &roles, 0, |v| {
        v.contains("without holding the lease")
    }) {
        Ok(n) => panic!("{n} schedules of the mutation passed"),
        Err((_, n)) => println!(
            "apply interleavings: a call without the last check caught (outside the lease) at schedule #{n}"
        ),
    }
}

/// `set_batch` attaches a batch id only to the step that made the batch:
/// an instance that outlived its lease and answers late cannot make a
/// later batch step look finished (one batch step in the plan above cannot
/// show it, so it is checked here directly).
#[test]
fn a_late_batch_id_is_not_lent_to_a_later_step() {
    let kv = MemKv::new(Backend::SpinSqlite);
    let env = TestEnv::at(NOW);
    let c = Ctx::auto(&kv, &env);
    let step = |action| PortStep {
        port: "bond0".into(),
        port_id: PORT_ID.into(),
        action,
    };
    let detach = step(Action::Unassign(vec![VLAN.into()]));
    let attach = step(Action::Assign(vec![VLAN.into()]));
    let token = "holder";
    assert_eq!(
        apply::DeviceRecord::new(&c, DEVICE)
            .take_lease(token, NOW)
            .unwrap(),
        None
    );
    assert!(apply::DeviceRecord::new(&c, DEVICE)
        .record_step(token, &attach, NOW)
        .unwrap());
    // The late answer of the detach batch.
    apply::DeviceRecord::new(&c, DEVICE)
        .set_batch(token, &StepRecord::of(&detach), "b-detach")
        .unwrap();
    let running = apply::read(&kv, DEVICE).unwrap().running.unwrap();
    assert_eq!(
        (running.step, running.batch),
        (StepRecord::of(&attach), None)
    );
    apply::DeviceRecord::new(&c, DEVICE)
        .set_batch(token, &StepRecord::of(&attach), "b-attach")
        .unwrap();
    let running = apply::read(&kv, DEVICE).unwrap().running.unwrap();
    assert_eq!(running.batch.as_deref(), Some("b-attach"));
}
