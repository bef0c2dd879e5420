//! A structured fuzzer for every parser that reads request bytes.
//!
//! Each [`Target`] generates requests by mutating valid seed documents
//! ([`seeds`]: claims, pool objects, AdmissionReviews, watch, Argo and
//! CloudEvents payloads) with structural mutations ([`mutate`]: dropped,
//! duplicated, renamed and retyped members, swapped subtrees, deep nesting,
//! huge numbers, odd IP strings and names, long lists) and byte-level
//! damage (truncation, invalid UTF-8, lone surrogates, duplicate keys,
//! random bytes), plus generated methods, path segments, query strings,
//! `Authorization` and CloudEvents headers, and runs them through the
//! component entry points and the parsers behind them ([`targets`]).
//!
//! Everything is deterministic: input `i` of a target is generated from its
//! own seed, [`case_seed`]`(seed, target, i)`, so a run is reproducible
//! whatever the number of threads, and one input can be replayed alone
//! ([`replay`]). Every input runs under [`std::panic::catch_unwind`]; a
//! panic is recorded with the case seed, the message and the whole input
//! (body in hex) in a [`PanicReport`].
//!
//! The `fuzz` binary runs it at scale; `tests/fuzz_smoke.rs` runs a short,
//! fixed run in CI.

pub mod mutate;
pub mod rng;
pub mod seeds;
pub mod targets;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;
use std::time::{Duration, Instant};

pub use seeds::Seeds;
pub use targets::{target, Component, Input, Outcome, Target, World, TARGETS};

use rng::{splitmix64, Rng};

/// The API token the components are configured with.
pub const API_TOKEN: &str = "fuzz-api-token-7c1e";
/// The events token the components are configured with.
pub const EVENTS_TOKEN: &str = "fuzz-events-token-42aa";
/// The clock of every input (Unix seconds).
pub const NOW: u64 = 1_700_000_000;
/// At most this many panics are kept, with their inputs, per target.
pub const MAX_PANICS_KEPT: usize = 5;

/// The seed of input `iteration` of `target` in a run seeded with `seed`.
pub fn case_seed(seed: u64, target: &str, iteration: u64) -> u64 {
    // FNV-1a of the name: stable across Rust versions, unlike `Hash`.
    let name = target.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    splitmix64(splitmix64(seed ^ name).wrapping_add(iteration))
}

/// A panic caught while running one input.
#[derive(Debug, Clone)]
pub struct PanicReport {
    /// The target.
    pub target: &'static str,
    /// The run's seed.
    pub seed: u64,
    /// The input's index in the run.
    pub iteration: u64,
    /// The input's own seed (`--case`).
    pub case: u64,
    /// The panic message with its location.
    pub message: String,
    /// The input ([`Input::describe`]).
    pub input: String,
}

impl PanicReport {
    /// A multi-line report with the command that replays the input.
    pub fn describe(&self) -> String {
        format!(
            "PANIC in target {} (seed {}, input #{}, case {:#018x})\n{}\nreplay: cargo run --profile host-release -p metal-ipam-tests --bin fuzz -- --target {} --case {:#018x}\ninput:\n{}",
            self.target,
            self.seed,
            self.iteration,
            self.case,
            self.message,
            self.target,
            self.case,
            self.input
        )
    }
}

/// What running one target produced.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The target's name.
    pub target: &'static str,
    /// Inputs run.
    pub inputs: u64,
    /// Inputs accepted (2xx, not an admission denial).
    pub accepted: u64,
    /// Inputs refused (every other answer).
    pub refused: u64,
    /// Answers with a 5xx status (among the refused).
    pub server_errors: u64,
    /// Count of each distinct outcome label ([`Outcome::label`]).
    pub outcomes: BTreeMap<String, u64>,
    /// Number of panics.
    pub panics: u64,
    /// The first [`MAX_PANICS_KEPT`] panics.
    pub panic_reports: Vec<PanicReport>,
    /// Wall time.
    pub elapsed: Duration,
    /// The slowest input: its time and case seed.
    pub slowest: (Duration, u64),
}

impl Report {
    fn merge(&mut self, other: Report) {
        self.inputs += other.inputs;
        self.accepted += other.accepted;
        self.refused += other.refused;
        self.server_errors += other.server_errors;
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
        self.panics += other.panics;
        self.panic_reports.extend(other.panic_reports);
        self.panic_reports.sort_by_key(|p| p.iteration);
        self.panic_reports.truncate(MAX_PANICS_KEPT);
        if other.slowest.0 > self.slowest.0 {
            self.slowest = other.slowest;
        }
    }

    /// One summary line.
    pub fn line(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        format!(
            "{:<10} {:>9} inputs  {:>9} accepted  {:>9} refused  {:>3} outcomes  {:>6} 5xx  {:>7.1} s  {:>7.0}/s  slowest {:>6.2} ms (case {:#x})  {} panics",
            self.target,
            self.inputs,
            self.accepted,
            self.refused,
            self.outcomes.len(),
            self.server_errors,
            secs,
            self.inputs as f64 / secs.max(1e-9),
            self.slowest.0.as_secs_f64() * 1000.0,
            self.slowest.1,
            self.panics
        )
    }
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that records the message of a panic on a
/// thread inside [`catch`] instead of printing it; other panics go to the
/// previous hook.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(Cell::get) {
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(info.to_string()));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err(message with location)`.
///
/// # Errors
/// The panic's message.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    CAPTURING.with(|c| c.set(true));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    CAPTURING.with(|c| c.set(false));
    r.map_err(|payload| {
        LAST_PANIC
            .with(|p| p.borrow_mut().take())
            .unwrap_or_else(|| {
                payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic with a non-string payload".to_string())
            })
    })
}

/// Generates input `case` of `target` and runs it.
fn run_case(
    world: &World,
    seeds: &Seeds,
    target: &Target,
    case: u64,
) -> (Input, Result<Outcome, String>) {
    let mut rng = Rng::new(case);
    let input = (target.generate)(&mut rng, seeds);
    let result = catch(|| world.run(target, &input));
    (input, result)
}

/// Regenerates and runs one input from its case seed (`--case`).
pub fn replay(target: &Target, case: u64) -> (Input, Result<Outcome, String>) {
    run_case(&World::new(), &Seeds::new(), target, case)
}

/// Runs inputs `offset`, `offset + stride`, … below `iterations`.
fn run_slice(
    target: &'static Target,
    seed: u64,
    iterations: u64,
    offset: u64,
    stride: u64,
) -> Report {
    let world = World::new();
    let seeds = Seeds::new();
    let mut report = Report {
        target: target.name,
        ..Report::default()
    };
    let mut i = offset;
    while i < iterations {
        let case = case_seed(seed, target.name, i);
        let started = Instant::now();
        let (input, result) = run_case(&world, &seeds, target, case);
        let took = started.elapsed();
        if took > report.slowest.0 {
            report.slowest = (took, case);
        }
        report.inputs += 1;
        match result {
            Ok(o) => {
                if o.accepted {
                    report.accepted += 1;
                } else {
                    report.refused += 1;
                }
                if o.label
                    .split(' ')
                    .nth(1)
                    .is_some_and(|s| s.starts_with('5'))
                {
                    report.server_errors += 1;
                }
                *report.outcomes.entry(o.label).or_default() += 1;
            }
            Err(message) => {
                report.panics += 1;
                *report.outcomes.entry("PANIC".to_string()).or_default() += 1;
                if report.panic_reports.len() < MAX_PANICS_KEPT {
                    report.panic_reports.push(PanicReport {
                        target: target.name,
                        seed,
                        iteration: i,
                        case,
                        message,
                        input: input.describe(),
                    });
                }
            }
        }
        i += stride;
    }
    report
}

/// Runs `iterations` inputs of `target` on `jobs` threads (each with its
/// own store); the inputs, and so the counts, do not depend on `jobs`.
pub fn run_target(target: &'static Target, seed: u64, iterations: u64, jobs: usize) -> Report {
    let started = Instant::now();
    let jobs = jobs.max(1) as u64;
    let mut report = if jobs == 1 {
        run_slice(target, seed, iterations, 0, 1)
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..jobs)
                .map(|j| s.spawn(move || run_slice(target, seed, iterations, j, jobs)))
                .collect();
            let mut total = Report {
                target: target.name,
                ..Report::default()
            };
            for h in handles {
                total.merge(h.join().expect("a fuzz thread died outside catch_unwind"));
            }
            total
        })
    };
    report.elapsed = started.elapsed();
    report
}
