//! A short run of the structured fuzzer (`src/fuzz`, the `fuzz` binary) in
//! CI: every target, a fixed seed and a thousand inputs each, in the
//! debug build (overflow checks on). No input may panic or get a 5xx from
//! a parser target, and each target must produce accepted and refused
//! inputs and several distinct outcomes, so the test fails if the
//! generator degenerates (everything malformed, or nothing mutated).

use metal_ipam_tests::fuzz::rng::Rng;
use metal_ipam_tests::fuzz::{self, Input, Seeds, Target, World, TARGETS};

/// Inputs per target: a few seconds in a debug build.
const ITERATIONS: u64 = 1_000;

#[test]
fn every_target_runs_without_panics_and_keeps_its_variety() {
    let mut failures = Vec::new();
    for t in TARGETS {
        let r = fuzz::run_target(t, 0x5eed, ITERATIONS, 1);
        println!("{}", r.line());
        for p in &r.panic_reports {
            failures.push(p.describe());
        }
        assert_eq!(r.inputs, ITERATIONS, "{}", t.name);
        assert!(
            r.accepted >= ITERATIONS / 20,
            "{}: only {} of {} inputs accepted: the generator breaks everything\n{:#?}",
            t.name,
            r.accepted,
            r.inputs,
            r.outcomes
        );
        assert!(
            r.refused >= ITERATIONS / 5,
            "{}: only {} of {} inputs refused: the generator mutates too little\n{:#?}",
            t.name,
            r.refused,
            r.inputs,
            r.outcomes
        );
        // Bad input is the client's fault: a 5xx from a parser target
        // would be a bug (`routes` also reaches the reconcile and
        // Kubernetes steps, whose failures may be 5xx by design).
        if t.name != "routes" {
            assert_eq!(
                r.server_errors, 0,
                "{}: 5xx answers to generated input\n{:#?}",
                t.name, r.outcomes
            );
        }
        assert!(
            r.outcomes.len() >= 8,
            "{}: only {} distinct outcomes\n{:#?}",
            t.name,
            r.outcomes.len(),
            r.outcomes
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn inputs_are_reproducible_from_their_case_seed() {
    for t in TARGETS {
        for i in 0..20 {
            let case = fuzz::case_seed(7, t.name, i);
            let (a, ra) = fuzz::replay(t, case);
            let (b, rb) = fuzz::replay(t, case);
            assert_eq!(a.describe(), b.describe(), "{}", t.name);
            assert_eq!(ra, rb, "{}", t.name);
        }
    }
}

#[test]
fn a_panic_is_caught_and_reported_with_its_message() {
    let r = fuzz::catch(|| -> u32 { panic!("boom {}", 42) });
    let message = r.unwrap_err();
    assert!(message.contains("boom 42"), "{message}");
    assert!(message.contains("fuzz_smoke.rs"), "{message}");
    assert_eq!(fuzz::catch(|| 5), Ok(5));
}

fn claim_input(rng: &mut Rng, seeds: &Seeds) -> Input {
    (fuzz::target("claim").expect("the claim target").generate)(rng, seeds)
}

fn planted_panic(_: &World, input: &Input) {
    if input.body.len().is_multiple_of(2) {
        panic!("planted panic on a {}-byte body", input.body.len());
    }
}

/// A target whose parser panics on every even-sized body.
static PANICKY: Target = Target {
    name: "panicky",
    about: "the claim inputs, and a parser that panics on even-sized bodies",
    generate: claim_input,
    direct: planted_panic,
};

#[test]
fn panics_are_counted_reported_and_replayable() {
    let r = fuzz::run_target(&PANICKY, 3, 200, 2);
    assert_eq!(r.inputs, 200);
    assert!(r.panics > 50 && r.panics < 150, "{} panics", r.panics);
    assert_eq!(r.outcomes["PANIC"], r.panics);
    assert_eq!(r.panic_reports.len(), fuzz::MAX_PANICS_KEPT);
    let p = &r.panic_reports[0];
    let text = p.describe();
    assert!(text.contains("planted panic on a"), "{text}");
    assert!(
        text.contains(&format!("--target panicky --case {:#018x}", p.case)),
        "{text}"
    );
    assert!(
        text.contains("body (") && text.contains(" bytes, hex): "),
        "{text}"
    );
    let (input, result) = fuzz::replay(&PANICKY, p.case);
    assert_eq!(input.describe(), p.input);
    assert!(result.unwrap_err().contains("planted panic"));
}
