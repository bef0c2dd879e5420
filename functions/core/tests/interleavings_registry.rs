//! The interleaving checker over a registry (`kv::registry`, the add-only
//! set the request signatures and the pool index are kept in): two or three
//! adders at once, every KV operation a yield point, a crash possible before
//! any of them, on each backend's real compare-and-swap semantics (see
//! `interleavings.rs`).
//!
//! Invariants:
//! - every add that returned `Ok` is in the set afterwards (no add is lost
//!   to another's write), and nothing else is;
//! - a crashed add, run again, is in the set (the registry never wedges:
//!   a crash between the creation guard and the key is taken over after
//!   the stall time).
//!
//! From an existing registry every schedule is enumerated (pairs, up to
//! one crash); from an empty store (the creation race) schedules are
//! sampled with PCT. The counts are printed.

#[path = "interleavings/sched.rs"]
mod sched;

use metal_ipam_core::kv::protocol::GUARD_STALL_S;
use metal_ipam_core::kv::registry::{self, Added, RegistryId};
use metal_ipam_core::kv::{Ctx, SwapPolicy};
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};

use sched::{Chooser, Dfs, Pct, SchedEnv};

const NOW: u64 = 1_000;
const BACKENDS: [Backend; 3] = [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36];
const ID: RegistryId = RegistryId {
    key: "obs/signatures",
    guard: "obs-init/signatures",
};

fn ctx<'a, K: KvStore>(kv: &'a K, env: &'a SchedEnv) -> Ctx<'a, K> {
    Ctx {
        kv,
        env,
        swap_policy: SwapPolicy::Auto,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The registry exists with one member.
    Existing,
    /// Nothing stored.
    Empty,
}

fn member(n: usize) -> String {
    format!("m{n}")
}

fn one_schedule(
    backend: Backend,
    start: Start,
    adders: usize,
    chooser: &mut dyn Chooser,
    crashes: usize,
) -> Result<(), String> {
    let kv = MemKv::new(backend);
    let env = SchedEnv(TestEnv::at(NOW));
    if start == Start::Existing {
        registry::add(&ctx(&kv, &env), &ID, &["seed"], 100).unwrap();
    }
    let fns: Vec<_> = (0..adders)
        .map(|n| {
            let env = &env;
            move |k: &sched::SchedKv<'_, MemKv>| {
                registry::add(&ctx(k, env), &ID, &[&member(n)], 100)
            }
        })
        .collect();
    let (answers, trace) = sched::run(&kv, fns, chooser, crashes, 2_000);
    let seen = registry::read(&kv, &ID).unwrap().unwrap_or_default();
    let fail = |what: String| {
        Err(format!(
            "{backend:?}, {start:?}: {what}\nanswers: {answers:?}, crashed: {}, set: {seen:?}",
            trace.crashed
        ))
    };
    for (n, a) in answers.iter().enumerate() {
        match a {
            Ok(Added::Added | Added::Present) if !seen.contains(&member(n)) => {
                return fail(format!("add {n} answered Ok and is missing"))
            }
            Ok(Added::Full) => return fail(format!("add {n} found the registry full")),
            Err(e) if !trace.crashed && e.reason() != "Contention" => {
                return fail(format!("add {n} failed without a crash: {e}"))
            }
            _ => {}
        }
    }
    let expected = (0..adders)
        .map(member)
        .chain((start == Start::Existing).then(|| "seed".to_string()));
    for m in seen.iter() {
        if !expected.clone().any(|e| &e == m) {
            return fail(format!("{m} was never added"));
        }
    }
    // Recovery: every add that did not answer Ok is run again, after the
    // creation stall time (a crashed guard winner is taken over).
    env.0.set_now(NOW + GUARD_STALL_S);
    for (n, a) in answers.iter().enumerate() {
        if a.is_err() {
            // The first retry after a stall notes it; the next takes over.
            let mut out = registry::add(&ctx(&kv, &env), &ID, &[&member(n)], 100);
            if out.is_err() {
                env.0.set_now(NOW + 2 * GUARD_STALL_S);
                out = registry::add(&ctx(&kv, &env), &ID, &[&member(n)], 100);
            }
            if out.is_err() {
                return fail(format!("add {n} again failed: {out:?}"));
            }
        }
    }
    let after = registry::read(&kv, &ID).unwrap().unwrap_or_default();
    for n in 0..adders {
        if !after.contains(&member(n)) {
            return fail(format!("{} missing after recovery", member(n)));
        }
    }
    Ok(())
}

fn explore_dfs(backend: Backend, start: Start, adders: usize, crashes: usize) -> usize {
    let mut dfs = Dfs::default();
    dfs.start();
    let mut n = 0;
    loop {
        n += 1;
        if let Err(v) = one_schedule(backend, start, adders, &mut dfs, crashes) {
            panic!("{v}\nschedule #{n}");
        }
        if !dfs.next_schedule() {
            return n;
        }
    }
}

#[test]
fn two_adders_lose_nothing_under_every_schedule() {
    let mut every = 0;
    for backend in BACKENDS {
        every += explore_dfs(backend, Start::Existing, 2, 1);
    }
    println!("registry interleavings: {every} schedules of two adders on an existing registry, up to one crash, 3 backends");
    assert!(every > 100, "{every}");
}

#[test]
fn adders_racing_to_create_the_registry_lose_nothing_sampled() {
    let mut sampled = 0;
    for backend in BACKENDS {
        for adders in [2, 3] {
            for seed in 0..300 {
                sampled += 1;
                let mut pct = Pct::new(seed, 2, 40);
                if let Err(v) = one_schedule(backend, Start::Empty, adders, &mut pct, 1) {
                    panic!("{v}\nPCT seed {seed}");
                }
            }
        }
    }
    println!("registry interleavings: {sampled} PCT schedules of two or three adders creating the registry, up to one crash, 3 backends");
}

#[test]
fn two_adders_creating_the_registry_without_crash_under_every_schedule() {
    let mut every = 0;
    for backend in BACKENDS {
        every += explore_dfs(backend, Start::Empty, 2, 0);
    }
    println!("registry interleavings: {every} schedules of two adders creating the registry, no crash, 3 backends");
}
