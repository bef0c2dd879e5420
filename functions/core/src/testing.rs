//! In-memory test doubles (feature `testing`): a key-value store that
//! reproduces each real Spin backend's quirks, with operation counting and
//! fault injection, and a deterministic [`Env`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::ports::kv::{KvError, KvStore, OpCounts, Swap};
use crate::ports::Env;

/// Which real backend [`MemKv`] imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Spin's default SQLite store: a swap after `current() == None` is an
    /// upsert; counters are 8-byte little-endian; incrementing anything else
    /// is a host panic (reported here as an error and recorded).
    SpinSqlite,
    /// Redis with the transaction's reply read as Spin's code intends: a
    /// swap whose key changed since `current()` is reported as success
    /// without writing; counters are decimal text; `get_many` fails (Spin
    /// sends it as a `KEYS` command).
    Redis,
    /// Spin 3.6's Redis store as it really behaves: its `UNWATCH <key>`
    /// after the EXEC is refused, so every swap is reported as failed,
    /// whether it was applied or aborted; otherwise as [`Backend::Redis`].
    RedisSpin36,
    /// An ideal store: exact swaps, including on absent keys.
    Exact,
}

/// Handle returned by [`MemKv::cas_read`].
#[derive(Debug, Clone)]
pub struct MemCas {
    key: String,
    seen: Option<Vec<u8>>,
}

#[derive(Default)]
struct Inner {
    map: BTreeMap<String, Vec<u8>>,
    counts: OpCounts,
    fail_after: Option<u32>,
    ops_seen: u32,
    increment_panics: u32,
    silent_aborts: u32,
}

/// An in-memory store shared by every clone-by-reference user (wrap it in
/// an `Arc` to share it between threads).
pub struct MemKv {
    backend: Backend,
    inner: Mutex<Inner>,
}

impl MemKv {
    /// An empty store imitating `backend`.
    pub fn new(backend: Backend) -> Self {
        MemKv {
            backend,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts of operations since creation or the last [`MemKv::reset_counts`].
    pub fn counts(&self) -> OpCounts {
        self.lock().counts
    }

    /// Zeroes the counters.
    pub fn reset_counts(&self) {
        self.lock().counts = OpCounts::default();
    }

    /// Makes every operation after the next `n` fail, as if the request
    /// died there (`None` lifts it).
    pub fn fail_after(&self, n: Option<u32>) {
        let mut i = self.lock();
        i.fail_after = n;
        i.ops_seen = 0;
    }

    /// How many increments hit a non-counter value (a host panic on Spin's
    /// SQLite store). Tests assert this stays zero.
    pub fn increment_panics(&self) -> u32 {
        self.lock().increment_panics
    }

    /// How many swaps were reported as success without writing (Redis).
    pub fn silent_aborts(&self) -> u32 {
        self.lock().silent_aborts
    }

    /// A copy of every key and value.
    pub fn dump(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock().map.clone()
    }

    /// Replaces the whole content (for golden-data tests).
    pub fn load(&self, map: BTreeMap<String, Vec<u8>>) {
        self.lock().map = map;
    }

    fn op(
        &self,
        count: impl FnOnce(&mut OpCounts),
    ) -> Result<std::sync::MutexGuard<'_, Inner>, KvError> {
        let mut i = self.lock();
        count(&mut i.counts);
        i.ops_seen += 1;
        if let Some(n) = i.fail_after {
            if i.ops_seen > n {
                return Err(KvError::Other("injected fault".into()));
            }
        }
        Ok(i)
    }

    fn decode_counter(&self, v: &[u8]) -> Option<i64> {
        match self.backend {
            Backend::SpinSqlite | Backend::Exact => {
                <[u8; 8]>::try_from(v).ok().map(i64::from_le_bytes)
            }
            Backend::Redis | Backend::RedisSpin36 => std::str::from_utf8(v).ok()?.parse().ok(),
        }
    }

    fn encode_counter(&self, n: i64) -> Vec<u8> {
        match self.backend {
            Backend::SpinSqlite | Backend::Exact => n.to_le_bytes().to_vec(),
            Backend::Redis | Backend::RedisSpin36 => n.to_string().into_bytes(),
        }
    }
}

impl KvStore for MemKv {
    type Cas = MemCas;

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let i = self.op(|c| c.get += 1)?;
        Ok(i.map.get(key).cloned())
    }

    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let i = self.op(|c| c.get_many += 1)?;
        if matches!(self.backend, Backend::Redis | Backend::RedisSpin36) {
            return Err(KvError::Other(
                "ERR wrong number of arguments for 'keys' command".into(),
            ));
        }
        Ok(keys.iter().map(|k| i.map.get(k).cloned()).collect())
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        let mut i = self.op(|c| c.set += 1)?;
        i.map.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), KvError> {
        let mut i = self.op(|c| c.delete += 1)?;
        i.map.remove(key);
        Ok(())
    }

    fn list_keys(&self) -> Result<Vec<String>, KvError> {
        let i = self.op(|c| c.list_keys += 1)?;
        Ok(i.map.keys().cloned().collect())
    }

    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        let mut i = self.op(|c| c.increment += 1)?;
        let current = match i.map.get(key) {
            None => 0,
            Some(v) => match self.decode_counter(v) {
                Some(n) => n,
                None => {
                    if matches!(self.backend, Backend::SpinSqlite | Backend::Exact) {
                        i.increment_panics += 1;
                        return Err(KvError::Other(
                            "host panic: incorrect length (increment of a non-counter)".into(),
                        ));
                    }
                    return Err(KvError::Other(
                        "ERR value is not an integer or out of range".into(),
                    ));
                }
            },
        };
        let n = current.wrapping_add(delta);
        let enc = self.encode_counter(n);
        i.map.insert(key.to_string(), enc);
        Ok(n)
    }

    fn cas_read(&self, key: &str) -> Result<(MemCas, Option<Vec<u8>>), KvError> {
        let i = self.op(|c| c.cas_read += 1)?;
        let seen = i.map.get(key).cloned();
        Ok((
            MemCas {
                key: key.to_string(),
                seen: seen.clone(),
            },
            seen,
        ))
    }

    fn cas_swap(&self, cas: MemCas, value: &[u8]) -> Result<Swap, KvError> {
        let mut i = self.op(|c| c.cas_swap += 1)?;
        let now = i.map.get(&cas.key).cloned();
        let unchanged = now == cas.seen;
        match self.backend {
            Backend::SpinSqlite if cas.seen.is_none() => {
                i.map.insert(cas.key, value.to_vec()); // upsert
                Ok(Swap::Reported)
            }
            Backend::Redis if !unchanged => {
                i.silent_aborts += 1;
                Ok(Swap::Reported) // WATCH aborted the EXEC, reported as Ok
            }
            Backend::RedisSpin36 => {
                if unchanged {
                    i.map.insert(cas.key, value.to_vec());
                } else {
                    i.silent_aborts += 1;
                }
                Ok(Swap::Failed) // the UNWATCH error, applied or not
            }
            _ if unchanged => {
                i.map.insert(cas.key, value.to_vec());
                Ok(Swap::Reported)
            }
            _ => Ok(Swap::Failed),
        }
    }
}

/// A deterministic [`Env`]: settable clock, counter-based randomness, no
/// waiting.
#[derive(Debug, Default)]
pub struct TestEnv {
    now: AtomicU64,
    seq: AtomicU64,
}

impl TestEnv {
    /// Clock at `now` seconds.
    pub fn at(now: u64) -> Self {
        TestEnv {
            now: AtomicU64::new(now),
            seq: AtomicU64::new(0),
        }
    }

    /// Moves the clock.
    pub fn set_now(&self, now: u64) {
        self.now.store(now, Ordering::SeqCst);
    }
}

impl Env for TestEnv {
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn random_u64(&self) -> u64 {
        // Distinct per call, like real randomness would be (with certainty).
        self.seq
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ 0x5bd1_e995
    }

    fn pause(&self, _attempt: u32) {
        std::thread::yield_now();
    }
}
