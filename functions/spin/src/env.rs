//! [`Env`] for a Spin component: wall clock, randomness and retry backoff
//! from the Rust standard library (on `wasm32-wasip2` these are
//! `wasi:clocks` and `wasi:random`).

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metal_ipam_core::ports::Env;

/// Backoff before retry 1; doubled per attempt up to attempt 6.
pub const BACKOFF_BASE: Duration = Duration::from_millis(1);

/// Longest single backoff.
pub const BACKOFF_CAP: Duration = Duration::from_millis(50);

/// The delay before retry `attempt` of a contended update, given a random
/// value for the jitter.
///
/// The nominal delay is `BACKOFF_BASE · 2^min(attempt, 6)`; the result is
/// uniformly spread over `[nominal/2, 3·nominal/2)` (so concurrent writers
/// that collided once do not collide again in lockstep) and capped at
/// [`BACKOFF_CAP`]. With the core's 64 attempts the total wait stays under
/// about three seconds.
///
/// # Examples
/// ```
/// use metal_ipam_spin::{backoff, BACKOFF_CAP};
/// use std::time::Duration;
/// assert_eq!(backoff(1, 0), Duration::from_millis(1));
/// assert!(backoff(1, u64::MAX) < Duration::from_millis(3));
/// assert!(backoff(40, u64::MAX) <= BACKOFF_CAP);
/// ```
pub fn backoff(attempt: u32, random: u64) -> Duration {
    // Microseconds; 1 000 · 2^6 = 64 000 fits any integer type used here.
    let nominal = (BACKOFF_BASE.as_micros() as u64) << attempt.min(6);
    let jittered = nominal / 2 + random % nominal.max(1);
    Duration::from_micros(jittered).min(BACKOFF_CAP)
}

/// Time, randomness and waiting for the core, from `std`.
///
/// Randomness comes from a [`RandomState`], which `std` seeds per instance
/// from the host (`wasi:random/insecure-seed` on `wasm32-wasip2`), hashing
/// a per-instance counter and the current time in nanoseconds with
/// SipHash. It is not cryptographic and need not be: it feeds writer tokens
/// (which must only differ between concurrent writers) and jitter.
#[derive(Debug)]
pub struct SpinEnv {
    seed: RandomState,
    counter: Cell<u64>,
}

impl SpinEnv {
    /// A fresh environment with its own random seed.
    pub fn new() -> Self {
        SpinEnv {
            seed: RandomState::new(),
            counter: Cell::new(0),
        }
    }
}

impl Default for SpinEnv {
    fn default() -> Self {
        Self::new()
    }
}

/// Time since the Unix epoch (zero if the clock is before it).
fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Unix time in milliseconds, for log lines.
pub(crate) fn unix_millis() -> u64 {
    u64::try_from(since_epoch().as_millis()).unwrap_or(u64::MAX)
}

impl Env for SpinEnv {
    fn now(&self) -> u64 {
        since_epoch().as_secs()
    }

    fn random_u64(&self) -> u64 {
        let n = self.counter.get().wrapping_add(1);
        self.counter.set(n);
        let mut h = self.seed.build_hasher();
        h.write_u64(n);
        h.write_u128(since_epoch().as_nanos());
        h.finish()
    }

    /// Sleeps [`backoff`]`(attempt, random)` through `std::thread::sleep`,
    /// i.e. `wasi:clocks/monotonic-clock` plus `wasi:io/poll` on wasip2; the
    /// host is free to run other requests meanwhile.
    fn pause(&self, attempt: u32) {
        std::thread::sleep(backoff(attempt, self.random_u64()));
    }

    fn now_ms(&self) -> u64 {
        unix_millis()
    }

    /// Sleeps through `std::thread::sleep`, as [`SpinEnv::pause`] does.
    fn sleep_ms(&self, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn backoff_grows_then_caps() {
        for attempt in 0..100 {
            let nominal = Duration::from_millis(1 << attempt.min(6));
            for random in [0, 1, 499, 12_345, u64::MAX / 3, u64::MAX] {
                let d = backoff(attempt, random);
                assert!(
                    d >= (nominal / 2).min(BACKOFF_CAP),
                    "{attempt} {random} {d:?}"
                );
                assert!(d < nominal * 3 / 2, "{attempt} {random} {d:?}");
                assert!(d <= BACKOFF_CAP, "{attempt} {random} {d:?}");
            }
        }
        assert_eq!(backoff(1, 0), Duration::from_millis(1));
        assert_eq!(backoff(3, 0), Duration::from_millis(4));
        assert_eq!(backoff(6, 0), Duration::from_millis(32));
        assert_eq!(backoff(60, u64::MAX), BACKOFF_CAP);
    }

    #[test]
    fn backoff_jitter_spreads() {
        let delays: HashSet<Duration> = (0..1000).map(|r| backoff(4, r * 7919)).collect();
        assert!(delays.len() > 100, "{}", delays.len());
    }

    #[test]
    fn total_backoff_over_all_attempts_is_bounded() {
        let total: Duration = (1..=metal_ipam_core::kv::MAX_CAS_ATTEMPTS)
            .map(|a| backoff(a, u64::MAX))
            .sum();
        assert!(total <= Duration::from_secs(4), "{total:?}");
    }

    #[test]
    fn random_values_differ_within_and_across_envs() {
        let a = SpinEnv::new();
        let b = SpinEnv::new();
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            assert!(seen.insert(a.random_u64()));
            assert!(seen.insert(b.random_u64()));
        }
    }

    #[test]
    fn now_is_plausible_and_pause_is_short() {
        let env = SpinEnv::new();
        assert!(env.now() > 1_700_000_000);
        let t = std::time::Instant::now();
        env.pause(1);
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
