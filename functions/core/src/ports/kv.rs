//! The key-value port: the store operations metal-ipam uses, as a trait.
//!
//! The Spin adapter (`metal-ipam-spin`) implements it on
//! `wasi:keyvalue@0.2.0-draft2`; the `testing` module implements it in memory
//! with each real backend's quirks. The trait mirrors what Spin's backends
//! actually offer, no more:
//!
//! - [`KvStore::increment`] is atomic everywhere and creates an absent key;
//!   the stored encoding differs (SQLite: 8-byte little-endian, Redis:
//!   decimal text), so a counter key is never read with `get`.
//! - [`KvStore::cas_read`] / [`KvStore::cas_swap`] are exact on Spin's
//!   SQLite backend **only for a key that exists** (an absent key is
//!   upserted, so two "create if absent" swaps both succeed), and on Redis a
//!   swap aborted by a concurrent write may be **reported as success**. The
//!   protocol in [`crate::kv`] is built so neither quirk can lose or
//!   duplicate an allocation.

use std::fmt;

/// A store failure. All are transient from the API's point of view except
/// a misconfigured store (`AccessDenied`, `NoSuchStore`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// The component may not open the store (spin.toml `key_value_stores`).
    AccessDenied,
    /// The store label is not configured.
    NoSuchStore,
    /// Any backend error (I/O, connection, …).
    Other(String),
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::AccessDenied => f.write_str("access to the key-value store was denied"),
            KvError::NoSuchStore => f.write_str("the key-value store is not configured"),
            KvError::Other(m) => write!(f, "key-value store error: {m}"),
        }
    }
}

impl std::error::Error for KvError {}

impl From<KvError> for crate::Error {
    fn from(e: KvError) -> Self {
        match e {
            // A deployment mistake (spin.toml `key_value_stores`, runtime
            // config), not something a retry fixes.
            KvError::AccessDenied | KvError::NoSuchStore => crate::Error::new(
                crate::ErrorKind::Internal,
                "StoreMisconfigured",
                "the key-value store is not available to this component",
            )
            .with_detail(e.to_string()),
            // The backend's text may name hosts or paths: logs only.
            KvError::Other(_) => crate::Error::transient(
                "StoreUnavailable",
                "the key-value store is unavailable; retry later",
            )
            .with_detail(e.to_string()),
        }
    }
}

/// What a backend reported for a compare-and-swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swap {
    /// Reported as written. Exact on SQLite for an existing key; on Redis it
    /// may be a silently aborted swap, hence the read-back in
    /// [`crate::kv`].
    Reported,
    /// The value changed since `cas_read`; nothing was written.
    Failed,
}

/// The key-value operations metal-ipam relies on (one store).
///
/// Each call is one "KV operation" for the cost bound in
/// `kv-schema/README.md`.
pub trait KvStore {
    /// A compare-and-swap handle remembering the value `cas_read` saw.
    type Cas;

    /// Reads `key`.
    ///
    /// # Errors
    /// Backend failure.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError>;

    /// Writes `key` unconditionally.
    ///
    /// # Errors
    /// Backend failure.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError>;

    /// Deletes `key`; deleting an absent key succeeds.
    ///
    /// # Errors
    /// Backend failure.
    fn delete(&self, key: &str) -> Result<(), KvError>;

    /// Reads several keys in one operation (`wasi:keyvalue/batch`
    /// `get-many`), in the order asked; absent keys are `None`. Not atomic:
    /// each key is read at some instant during the call.
    ///
    /// # Errors
    /// Backend failure.
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError>;

    /// Lists every key of the store (not used on allocation paths).
    ///
    /// # Errors
    /// Backend failure.
    fn list_keys(&self) -> Result<Vec<String>, KvError>;

    /// Atomically adds `delta` to the counter at `key` (absent = 0) and
    /// returns the new value.
    ///
    /// # Errors
    /// Backend failure, or (Redis) a key that holds a non-counter value. On
    /// Spin's SQLite backend such a key makes the host panic instead, so
    /// callers never increment a key that may hold anything but a counter.
    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError>;

    /// Starts a compare-and-swap on `key` and returns the current value.
    ///
    /// # Errors
    /// Backend failure.
    fn cas_read(&self, key: &str) -> Result<(Self::Cas, Option<Vec<u8>>), KvError>;

    /// Writes `value` if the key still holds what `cas_read` returned.
    ///
    /// # Errors
    /// Backend failure.
    fn cas_swap(&self, cas: Self::Cas, value: &[u8]) -> Result<Swap, KvError>;

    /// Told by the protocol (`kv::protocol::update_record`) that a swap did
    /// not land: reported `Failed` on a record whose swaps are exact, or
    /// not found on read-back. Not a store operation: a store ignores it,
    /// [`CountingKv`] counts it (the request counters' CAS conflicts).
    fn note_conflict(&self) {}
}

/// A borrowed store is a store (so a caller can wrap one it was lent, e.g.
/// in a [`CountingKv`]).
impl<K: KvStore> KvStore for &K {
    type Cas = K::Cas;
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        (**self).get(key)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        (**self).set(key, value)
    }
    fn delete(&self, key: &str) -> Result<(), KvError> {
        (**self).delete(key)
    }
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        (**self).get_many(keys)
    }
    fn list_keys(&self) -> Result<Vec<String>, KvError> {
        (**self).list_keys()
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        (**self).increment(key, delta)
    }
    fn cas_read(&self, key: &str) -> Result<(Self::Cas, Option<Vec<u8>>), KvError> {
        (**self).cas_read(key)
    }
    fn cas_swap(&self, cas: Self::Cas, value: &[u8]) -> Result<Swap, KvError> {
        (**self).cas_swap(cas, value)
    }
    fn note_conflict(&self) {
        (**self).note_conflict();
    }
}

/// Whether `bytes` is what `increment(key, 0)` leaves in an absent key:
/// eight zero bytes (Spin's SQLite encoding) or `"0"` (Redis's).
pub fn is_zero_counter(bytes: &[u8]) -> bool {
    bytes == [0u8; 8] || bytes == b"0"
}

/// Counts of key-value operations by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// `get` calls.
    pub get: u32,
    /// `get_many` calls (one operation each, whatever the number of keys).
    pub get_many: u32,
    /// `set` calls.
    pub set: u32,
    /// `delete` calls.
    pub delete: u32,
    /// `list_keys` calls.
    pub list_keys: u32,
    /// `increment` calls.
    pub increment: u32,
    /// `cas_read` calls.
    pub cas_read: u32,
    /// `cas_swap` calls.
    pub cas_swap: u32,
}

impl OpCounts {
    /// All operations together.
    pub fn total(&self) -> u32 {
        self.get
            + self.get_many
            + self.set
            + self.delete
            + self.list_keys
            + self.increment
            + self.cas_read
            + self.cas_swap
    }
}

/// Wraps a store and counts every operation (for the per-request log line
/// and for tests).
pub struct CountingKv<K> {
    inner: K,
    counts: std::cell::Cell<OpCounts>,
    conflicts: std::cell::Cell<u32>,
}

impl<K> CountingKv<K> {
    /// Wraps `inner` with zeroed counters.
    pub fn new(inner: K) -> Self {
        CountingKv {
            inner,
            counts: std::cell::Cell::new(OpCounts::default()),
            conflicts: std::cell::Cell::new(0),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> OpCounts {
        self.counts.get()
    }

    /// Swaps that did not land so far ([`KvStore::note_conflict`]).
    pub fn conflicts(&self) -> u32 {
        self.conflicts.get()
    }

    /// The wrapped store.
    pub fn inner(&self) -> &K {
        &self.inner
    }

    fn bump(&self, f: impl FnOnce(&mut OpCounts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }
}

impl<K: KvStore> KvStore for CountingKv<K> {
    type Cas = K::Cas;

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        self.bump(|c| c.get += 1);
        self.inner.get(key)
    }

    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.bump(|c| c.get_many += 1);
        self.inner.get_many(keys)
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        self.bump(|c| c.set += 1);
        self.inner.set(key, value)
    }

    fn delete(&self, key: &str) -> Result<(), KvError> {
        self.bump(|c| c.delete += 1);
        self.inner.delete(key)
    }

    fn list_keys(&self) -> Result<Vec<String>, KvError> {
        self.bump(|c| c.list_keys += 1);
        self.inner.list_keys()
    }

    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        self.bump(|c| c.increment += 1);
        self.inner.increment(key, delta)
    }

    fn cas_read(&self, key: &str) -> Result<(Self::Cas, Option<Vec<u8>>), KvError> {
        self.bump(|c| c.cas_read += 1);
        self.inner.cas_read(key)
    }

    fn cas_swap(&self, cas: Self::Cas, value: &[u8]) -> Result<Swap, KvError> {
        self.bump(|c| c.cas_swap += 1);
        self.inner.cas_swap(cas, value)
    }

    fn note_conflict(&self) {
        self.conflicts.set(self.conflicts.get() + 1);
        self.inner.note_conflict();
    }
}
