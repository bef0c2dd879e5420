//! What the provisioning checkers share (`interleavings_provision.rs` over
//! Metal, `interleavings_provision_pnap.rs` over phoenixNAP): the pool and
//! its incarnations, the clock, the progress record read without
//! scheduling, the store watched at every write, a cloud creation as a
//! request in flight, and the exploration plans over the three backends.
//!
//! Included with `#[path]` next to `sched.rs`; each checker uses a part.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Mutex;

use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::ipam::vrf::Resource;
use metal_ipam_core::kv::protocol::CasRecord;
use metal_ipam_core::kv::{keys, Ctx};
use metal_ipam_core::ports::http::{HttpClient, TransportError, TransportKind};
use metal_ipam_core::ports::kv::{KvError, KvStore, Swap};
use metal_ipam_core::ports::Env;
use metal_ipam_core::provision::plan::{Progress, INTENT_LEASE_S};
use metal_ipam_core::provision::record::ProgressRecord;
use metal_ipam_core::testing::{Backend, MemKv};

use super::sched::{Chooser, Dfs, Pct};

pub const NOW: u64 = 10_000;
pub const LATER: u64 = NOW + INTENT_LEASE_S;
pub const BACKENDS: [Backend; 3] = [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36];
/// The uid of the pool being deleted, and of its re-creation.
pub const U1: &str = "u-1";
pub const U2: &str = "u-2";

/// What a check concludes: a violation, described.
pub type Verdict = std::result::Result<(), String>;

pub fn pool() -> PoolId {
    PoolId::namespaced("ns", "p")
}

pub fn ctx<'a, K: KvStore>(kv: &'a K, env: &'a dyn Env) -> Ctx<'a, K> {
    Ctx::auto(kv, env)
}

/// The record as stored, read without scheduling.
pub fn stored(kv: &MemKv) -> Option<Progress> {
    kv.get(&keys::metal_pool(&pool()))
        .unwrap()
        .filter(|b| b.len() > 8 || !b.iter().all(|c| *c == 0))
        .and_then(|b| ProgressRecord::decode(&b).ok())
        .and_then(|r| r.progress().ok())
}

/// Whether the record is stuck behind a crashed creation-guard winner (the
/// documented known limit of every record: nothing is created then).
pub fn stuck(kv: &MemKv) -> bool {
    let id = pool();
    kv.get(&keys::metal_pool(&id)).unwrap().is_none()
        && kv.get(&keys::metal_pool_init(&id)).unwrap().is_some()
}

/// The cloud as one instance reaches it: a creation (an API `POST`; not a
/// token request) is a request in flight, a yield point (a `get` of a key
/// nothing else uses, through the instance's scheduled store) before the
/// cloud applies it, so other instances may run meanwhile; a crash there
/// is a request lost before it arrived.
pub struct InFlight<'a, H: HttpClient + ?Sized, K: KvStore> {
    pub ledger: &'a H,
    pub kv: &'a K,
}

impl<H: HttpClient + ?Sized, K: KvStore> HttpClient for InFlight<'_, H, K> {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        if req.method() == http::Method::POST && !req.uri().path().ends_with("/token") {
            self.kv
                .get("checker/metal-in-flight")
                .map_err(|e| TransportError::new(TransportKind::Unreachable, e.to_string()))?;
        }
        self.ledger.send(req)
    }
}

/// The uid a cloud resource (by id) was created for, as the ledger knows
/// it; `None` for one it does not know or made for no uid.
pub type OwnerOf<'a> = &'a (dyn Fn(&str) -> Option<String> + Sync);

/// A store that checks the record's invariants after every write: the
/// retired uids only grow, no live record belongs to a retired uid, and a
/// live record holds only resources created for its uid.
pub struct Watched<'a> {
    pub inner: &'a MemKv,
    pub violations: &'a Mutex<Vec<String>>,
    pub retired: Mutex<BTreeSet<String>>,
    pub owner_of: OwnerOf<'a>,
}

impl<'a> Watched<'a> {
    /// Watches `inner` from its current record on.
    pub fn new(
        inner: &'a MemKv,
        violations: &'a Mutex<Vec<String>>,
        owner_of: OwnerOf<'a>,
    ) -> Self {
        Watched {
            inner,
            violations,
            retired: Mutex::new(
                stored(inner)
                    .map(|p| p.retired.into_iter().collect())
                    .unwrap_or_default(),
            ),
            owner_of,
        }
    }

    fn check(&self, key: &str) {
        if key != keys::metal_pool(&pool()) {
            return;
        }
        let Some(p) = stored(self.inner) else {
            return;
        };
        let mut found = Vec::new();
        let mut seen = self.retired.lock().unwrap();
        for u in seen.iter() {
            if !p.retired.contains(u) {
                found.push(format!("the tombstone of {u} was replaced: {p:?}"));
            }
        }
        seen.extend(p.retired.iter().cloned());
        if !p.deleted {
            if let Some(u) = &p.uid {
                if seen.contains(u) {
                    found.push(format!("a live record for the retired {u}: {p:?}"));
                }
            }
            for r in Resource::ALL {
                if let Some(h) = p.held(r) {
                    let of = (self.owner_of)(&h.id);
                    if of != p.uid {
                        found.push(format!(
                            "a record of {:?} holds {} {} made for {of:?}",
                            p.uid,
                            r.field(),
                            h.id
                        ));
                    }
                }
            }
        }
        self.violations.lock().unwrap().extend(found);
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
        self.check(key);
        r
    }
    fn delete(&self, key: &str) -> Result<(), KvError> {
        let r = self.inner.delete(key);
        self.check(key);
        r
    }
    fn list_keys(&self) -> Result<Vec<String>, KvError> {
        self.inner.list_keys()
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        let r = self.inner.increment(key, delta);
        self.check(key);
        r
    }
    fn cas_read(&self, key: &str) -> Result<(Self::Cas, Option<Vec<u8>>), KvError> {
        self.inner.cas_read(key)
    }
    fn cas_swap(&self, cas: Self::Cas, value: &[u8]) -> Result<Swap, KvError> {
        let r = self.inner.cas_swap(cas, value);
        self.check(&keys::metal_pool(&pool()));
        r
    }
}

/// How a backend's schedules are explored.
#[derive(Debug, Clone, Copy)]
pub enum Explore {
    /// Every schedule, with up to this many crashes.
    Every(usize),
    /// This many PCT schedules, with up to one crash.
    Pct(u64),
}

/// The exploration of a pair on each backend: every schedule with a crash
/// on SQLite's semantics; on Redis's, every schedule without a crash and
/// PCT with one (its read-backs multiply the schedules); Spin 3.6's Redis
/// reads every swap back as Redis's does (its reported outcome is never
/// used), so its schedules are Redis's: PCT with a crash.
pub const PAIR: [(Backend, Explore); 4] = [
    (Backend::SpinSqlite, Explore::Every(1)),
    (Backend::Redis, Explore::Every(0)),
    (Backend::Redis, Explore::Pct(300)),
    (Backend::RedisSpin36, Explore::Pct(300)),
];

/// The exploration of the pairs whose two instances both work all the way
/// (a crashed creation to find, racing): every schedule without a crash on
/// SQLite's semantics, PCT with a crash on each backend.
pub const WIDE: [(Backend, Explore); 4] = [
    (Backend::SpinSqlite, Explore::Every(0)),
    (Backend::SpinSqlite, Explore::Pct(300)),
    (Backend::Redis, Explore::Pct(300)),
    (Backend::RedisSpin36, Explore::Pct(300)),
];

/// PCT only, on every backend.
pub fn pct(seeds: u64) -> [(Backend, Explore); 3] {
    BACKENDS.map(|b| (b, Explore::Pct(seeds)))
}

/// Explores the schedules `one` runs (a backend, a chooser, the crashes
/// allowed) as `plan` says, printing `what` and the count per backend;
/// returns the number of schedules. Panics at the first violation.
pub fn explore(
    what: &str,
    plan: &[(Backend, Explore)],
    mut one: impl FnMut(Backend, &mut dyn Chooser, usize) -> Verdict,
) -> usize {
    let mut total = 0;
    for &(backend, how) in plan {
        let mut n = 0;
        match how {
            Explore::Every(crashes) => {
                let mut dfs = Dfs::default();
                dfs.start();
                loop {
                    n += 1;
                    if let Err(v) = one(backend, &mut dfs, crashes) {
                        panic!("{v}\nschedule #{n}");
                    }
                    if !dfs.next_schedule() {
                        break;
                    }
                }
            }
            Explore::Pct(seeds) => {
                for seed in 0..seeds {
                    n += 1;
                    let mut pct = Pct::new(seed, 3, 60);
                    if let Err(v) = one(backend, &mut pct, 1) {
                        panic!("{v}\nPCT seed {seed}");
                    }
                }
            }
        }
        println!("{what}, {backend:?} {how:?}: {n} schedules");
        total += n;
    }
    total
}

/// Runs DFS schedules until `bad` finds a violation; whether it did.
pub fn caught(mut bad: impl FnMut(&mut Dfs) -> Verdict) -> bool {
    let mut dfs = Dfs::default();
    dfs.start();
    loop {
        if bad(&mut dfs).is_err() {
            return true;
        }
        if !dfs.next_schedule() {
            return false;
        }
    }
}
