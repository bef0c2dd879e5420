//! What the apply checkers share (`interleavings_apply.rs` over the port
//! apply, `interleavings_members.rs` over the membership apply): the
//! instances' clocks and environment, the store as an instance started
//! after a stalled one's lease sees it, and the exhaustive enumeration.
//!
//! Included with `#[path]` next to `sched.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use metal_ipam_core::network::apply::LEASE_S;
use metal_ipam_core::ports::kv::{KvError, KvStore, Swap};
use metal_ipam_core::ports::Env;

use super::sched::{self, Dfs, SchedEnv};

/// When a schedule's instances start.
pub const NOW: u64 = 10_000;
/// When a lease taken at [`NOW`] has ended.
pub const LATER: u64 = NOW + LEASE_S;

/// The checkers' environment ([`SchedEnv`]: randomness shared by every
/// instance of a schedule, so tokens differ), with a clock of the
/// instance's own, and where while every
/// instance honours the lease, an instance retrying a swap is not scheduled
/// while another can run from its first retry on (not its third). There
/// the only retries are `take_lease`'s (its swap lost to the one that took
/// the lease, or the record's creation), and the retry reads the lease
/// held (as a first read does) or, once the holder is done, free: the
/// schedules pruned differ from those kept only by where the loser's
/// operations that change nothing fall, and they are most of them (on
/// Redis, a cube of the holder's operations).
pub struct ApplyEnv<'a> {
    pub env: &'a SchedEnv,
    pub defer_from: u32,
    pub clock: &'a AtomicU64,
}

impl Env for ApplyEnv<'_> {
    fn now(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }
    fn random_u64(&self) -> u64 {
        self.env.random_u64()
    }
    fn pause(&self, attempt: u32) {
        if attempt >= self.defer_from {
            sched::pause_here();
        } else {
            self.env.pause(attempt);
        }
    }
    fn sleep_ms(&self, ms: u64) {
        self.env.sleep_ms(ms);
    }
}

/// The store as the instance started after a stalled one's lease sees it:
/// after its first operation (the moment it first runs), the stalled
/// instance's clock is past that lease, whichever operation it is paused
/// at.
pub struct Resumes<'a, K: KvStore> {
    pub inner: &'a K,
    pub stalled: &'a AtomicU64,
}

impl<K: KvStore> Resumes<'_, K> {
    fn after<T>(&self, r: T) -> T {
        self.stalled.fetch_max(LATER, Ordering::SeqCst);
        r
    }
}

impl<K: KvStore> KvStore for Resumes<'_, K> {
    type Cas = K::Cas;

    fn get(&self, key: &str) -> std::result::Result<Option<Vec<u8>>, KvError> {
        self.after(self.inner.get(key))
    }
    fn get_many(&self, keys: &[String]) -> std::result::Result<Vec<Option<Vec<u8>>>, KvError> {
        self.after(self.inner.get_many(keys))
    }
    fn set(&self, key: &str, value: &[u8]) -> std::result::Result<(), KvError> {
        self.after(self.inner.set(key, value))
    }
    fn delete(&self, key: &str) -> std::result::Result<(), KvError> {
        self.after(self.inner.delete(key))
    }
    fn list_keys(&self) -> std::result::Result<Vec<String>, KvError> {
        self.after(self.inner.list_keys())
    }
    fn increment(&self, key: &str, delta: i64) -> std::result::Result<i64, KvError> {
        self.after(self.inner.increment(key, delta))
    }
    fn cas_read(&self, key: &str) -> std::result::Result<(Self::Cas, Option<Vec<u8>>), KvError> {
        self.after(self.inner.cas_read(key))
    }
    fn cas_swap(&self, cas: Self::Cas, value: &[u8]) -> std::result::Result<Swap, KvError> {
        self.after(self.inner.cas_swap(cas, value))
    }
}

/// Runs `one` on every schedule a fresh [`Dfs`] enumerates, until a
/// violation satisfies `stop` (the others are passed over: a mutation's
/// run looks for its own): the number of schedules run, or that violation
/// and its schedule's number.
pub fn every_dfs(
    mut one: impl FnMut(&mut Dfs) -> Result<(), String>,
    stop: impl Fn(&str) -> bool,
) -> Result<usize, (String, usize)> {
    let mut dfs = Dfs::default();
    dfs.start();
    let mut n = 0;
    loop {
        n += 1;
        if let Err(v) = one(&mut dfs) {
            if stop(&v) {
                return Err((v, n));
            }
        }
        if !dfs.next_schedule() {
            return Ok(n);
        }
    }
}
