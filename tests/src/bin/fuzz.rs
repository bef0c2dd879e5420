//! # metal-ipam fuzz
//!
//! Runs the structured fuzzer of [`metal_ipam_tests::fuzz`] over every
//! parser that reads request bytes, through the component entry points of
//! the pure core (no wasm, no host):
//!
//! ```text
//! cargo run --profile host-release -p metal-ipam-tests --bin fuzz -- --iterations 1000000
//! ```
//!
//! Options:
//! - `--iterations N`: inputs per target (default 100000);
//! - `--seed N`: the run's seed (default 1; decimal or `0x…`);
//! - `--target NAME`: only this target (repeatable, or comma-separated);
//! - `--jobs N`: threads per target (default 1; the inputs do not depend on it);
//! - `--case SEED`: regenerate and run one input of the one `--target`
//!   (the case seed a panic report prints) and show it;
//! - `--outcomes`: list every distinct outcome with its count;
//! - `--list`: list the targets.
//!
//! Prints one line per target (inputs, accepted, refused, distinct
//! outcomes, 5xx answers, time, rate, slowest input, panics) and a total.
//! Exits 1 if any input panicked, after printing each panic with its seed,
//! its input (the body in hex) and the command that replays it.

use std::process::ExitCode;
use std::time::Instant;

use metal_ipam_tests::fuzz::{self, Report, Target, TARGETS};

struct Args {
    iterations: u64,
    seed: u64,
    targets: Vec<&'static Target>,
    jobs: usize,
    case: Option<u64>,
    outcomes: bool,
    list: bool,
}

fn number(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.replace('_', "").parse(),
    };
    r.map_err(|e| format!("{s:?} is not a number: {e}"))
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        iterations: 100_000,
        seed: 1,
        targets: Vec::new(),
        jobs: 1,
        case: None,
        outcomes: false,
        list: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--iterations" => a.iterations = number(&value()?)?,
            "--seed" => a.seed = number(&value()?)?,
            "--jobs" => a.jobs = number(&value()?)?.clamp(1, 64) as usize,
            "--case" => a.case = Some(number(&value()?)?),
            "--target" => {
                for name in value()?.split(',') {
                    let t = fuzz::target(name).ok_or_else(|| {
                        let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
                        format!("unknown target {name:?}; targets: {}", names.join(", "))
                    })?;
                    a.targets.push(t);
                }
            }
            "--outcomes" => a.outcomes = true,
            "--list" => a.list = true,
            "-h" | "--help" => {
                return Err(
                    "usage: fuzz [--iterations N] [--seed N] [--target NAME]... \
                            [--jobs N] [--case SEED] [--outcomes] [--list]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if a.targets.is_empty() {
        a.targets = TARGETS.iter().collect();
    }
    Ok(a)
}

fn print_outcomes(r: &Report) {
    let mut v: Vec<(&String, &u64)> = r.outcomes.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (label, n) in v {
        println!("    {n:>9}  {label}");
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.list {
        for t in TARGETS {
            println!("{:<10} {}", t.name, t.about);
        }
        return ExitCode::SUCCESS;
    }
    if let Some(case) = args.case {
        let [t] = args.targets.as_slice() else {
            eprintln!("--case needs exactly one --target");
            return ExitCode::from(2);
        };
        let (input, result) = fuzz::replay(t, case);
        println!("{}", input.describe());
        println!("body (text): {}", String::from_utf8_lossy(&input.body));
        return match result {
            Ok(o) => {
                println!(
                    "outcome: {} ({})",
                    o.label,
                    if o.accepted { "accepted" } else { "refused" }
                );
                ExitCode::SUCCESS
            }
            Err(message) => {
                println!("PANIC: {message}");
                ExitCode::FAILURE
            }
        };
    }
    println!(
        "metal-ipam fuzz: seed {}, {} inputs per target, {} target(s), {} job(s)",
        args.seed,
        args.iterations,
        args.targets.len(),
        args.jobs
    );
    let started = Instant::now();
    let mut total_inputs = 0;
    let mut total_panics = 0;
    let mut reports = Vec::new();
    for &t in &args.targets {
        let r = fuzz::run_target(t, args.seed, args.iterations, args.jobs);
        println!("{}", r.line());
        if args.outcomes {
            print_outcomes(&r);
        }
        total_inputs += r.inputs;
        total_panics += r.panics;
        reports.push(r);
    }
    for r in &reports {
        for p in &r.panic_reports {
            println!("\n{}", p.describe());
        }
    }
    println!(
        "total: {} inputs, {} targets, {:.1} s, {} panics",
        total_inputs,
        args.targets.len(),
        started.elapsed().as_secs_f64(),
        total_panics
    );
    if total_panics > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
