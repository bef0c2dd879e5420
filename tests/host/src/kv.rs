//! Key-value storage with the semantics of Spin 3.6's backends, quirks
//! included: the default SQLite backend
//! (`spin@v3.6.3:crates/key-value-spin/src/store.rs`), the Redis backend
//! (`crates/key-value-redis/src/store.rs`), and the label allow-list of
//! `crates/factor-key-value`.
//!
//! # SQLite ([`KvBackend::SqliteFile`], [`KvBackend::Memory`])
//!
//! Both are SQLite databases with Spin's table layout:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS spin_key_value (
//!     store TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
//!     PRIMARY KEY (store, key))
//! ```
//!
//! (the memory backend is an in-memory SQLite database, exactly as Spin's
//! `DatabaseLocation::InMemory`), so a file written by this host can be read
//! by Spin and vice versa.
//!
//! Semantics reproduced from Spin:
//! - `get_keys`/`list-keys` return every key of the store label;
//! - `get_many` returns only the keys that exist (absent keys are omitted,
//!   not returned as `none`), in an unspecified order;
//! - `increment` runs in one transaction: read, decode exactly 8 bytes as a
//!   little-endian `i64` (absent = 0), add, upsert, return the new value. A
//!   present value that is not 8 bytes long makes Spin panic host-side
//!   (`expect("incorrect length")`); here it is [`KvError::Trap`], which the
//!   component host turns into a trap of that request (HTTP 500), and
//!   nothing is written;
//! - compare-and-swap: [`KvStore::new_cas`] reads nothing;
//!   [`KvCas::current`] reads and remembers the value; [`KvCas::swap`] with
//!   a remembered `Some(old)` runs `UPDATE ... WHERE value = old` (exactly one
//!   row changed = success, otherwise `CasFailed`); with a remembered `None`
//!   (because the key was absent, **or because `current` was never called**)
//!   it runs an upsert, so two concurrent "create if absent" swaps both
//!   succeed, the last write winning.
//!
//! Several processes may share one SQLite file: every operation is a single
//! statement or one short transaction, write transactions are `BEGIN
//! IMMEDIATE` (so read-modify-write never deadlocks between processes), the
//! busy timeout is 5 s, and no data is cached in-process. Within a process
//! each store manager uses one connection behind a mutex, as Spin does.
//!
//! # Redis ([`KvBackend::Redis`], runtime config `type = "redis"`)
//!
//! The same `redis` crate line as Spin 3.6 (0.32) making the same calls, so
//! the replies are Spin's:
//! - one multiplexed connection per configured store, opened on first use;
//!   `get`/`set`/`delete`/`exists` are `GET`/`SET`/`DEL`/`EXISTS`;
//! - **the store label is ignored**: every label configured with one URL
//!   shares the database's keyspace, and `get_keys` is `KEYS *` over the
//!   whole database;
//! - `increment` is `INCRBY`: values are **decimal text** (`"42"`, not
//!   SQLite's 8 little-endian bytes); a value that is not a decimal `i64`
//!   is Redis's error ("value is not an integer or out of range"), an
//!   ordinary [`KvError::Other`], not a trap;
//! - `get_many` sends `KEYS <key>...` (Spin's code calls `keys`, not
//!   `MGET`) and reads the matching names as key/value pairs: with two or
//!   more keys Redis refuses the arity ([`KvError::Other`]); with one key
//!   that matches nothing the answer is `[]`; with one key that matches a
//!   name redis-rs panics parsing the odd-length reply — a panic of Spin's
//!   host, so [`KvError::Trap`] here (the request traps). Reproduced, not
//!   fixed. `set_many` is `MSET`, `delete_many` is `DEL`;
//! - compare-and-swap: every handle gets **its own new connection**
//!   (Spin's `new_compare_and_swap`; [`KvStore::open_cas`] connects at once,
//!   [`KvStore::new_cas`] on first use); `current` is `WATCH key` + `GET
//!   key`; `swap` is `MULTI` / `SET` / `EXEC`, read into `()`, then
//!   `UNWATCH`. Two quirks follow, both reproduced on purpose:
//!   1. an `EXEC` aborted by the `WATCH` replies nil, which redis-rs reads
//!      as `Ok(())`: **an aborted swap reads as a success**;
//!   2. Spin 3.6 sends `UNWATCH <key>`, but `UNWATCH` takes no argument:
//!      Redis (and Valkey) answer "wrong number of arguments", and Spin
//!      maps that error to `CasFailed`. So on Spin 3.6 **every swap is
//!      reported as `cas-failed`**, whether its `SET` was applied or
//!      aborted, and the guest gets a fresh handle (new connection, `WATCH`
//!      + `GET`) as for any failed swap. Quirk 1 is masked by quirk 2.
//!
//!   [`RedisSwap`] selects between the two: [`RedisSwap::Spin36`] (the
//!   default, what Spin 3.6 does) and [`RedisSwap::ExecReply`] (Spin's code
//!   with a plain `UNWATCH`: every swap, applied or aborted, is reported as
//!   a success — the behaviour a fixed Spin would have, where a guest must
//!   read back to know).
//!
//! TLS URLs (`rediss://`) are refused: the crate is built without TLS.
//!
//! Deviations: Spin's 128 MiB per-read result limit is not enforced; Spin
//! opens SQLite with rusqlite's default 5 s busy timeout too, but uses
//! deferred transactions (it never shares a file between processes).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

mod redis_store;

use redis_store::{RedisCas, RedisManager, RedisStore};

/// Where a key-value store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvBackend {
    /// A SQLite file with Spin's table layout (created if missing, along
    /// with its parent directory).
    SqliteFile(PathBuf),
    /// A private in-memory SQLite database, lost when the host is dropped.
    Memory,
    /// A Redis (or Valkey) database, as Spin's `type = "redis"` store (see
    /// the module docs).
    Redis {
        /// `redis://[user:password@]host[:port][/db]` (or
        /// `redis+unix:///path`).
        url: String,
        /// How swaps are reported.
        swap: RedisSwap,
    },
}

impl KvBackend {
    /// A Redis backend with Spin 3.6's swap reporting
    /// ([`RedisSwap::Spin36`]).
    pub fn redis(url: impl Into<String>) -> Self {
        KvBackend::Redis {
            url: url.into(),
            swap: RedisSwap::Spin36,
        }
    }
}

impl fmt::Display for KvBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvBackend::SqliteFile(p) => write!(f, "{:?}", p.display().to_string()),
            KvBackend::Memory => f.write_str("a temporary in-memory store"),
            // As Spin's summary: the address only (never a password).
            KvBackend::Redis { url, swap } => {
                match url.parse::<::redis::ConnectionInfo>() {
                    Ok(info) => write!(f, "Redis at {}", info.addr)?,
                    Err(_) => f.write_str("Redis (unparsable URL)")?,
                }
                if *swap == RedisSwap::ExecReply {
                    f.write_str(" (swaps reported by their EXEC reply)")?;
                }
                Ok(())
            }
        }
    }
}

/// How the Redis backend reports a compare-and-swap (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RedisSwap {
    /// Exactly Spin 3.6: `UNWATCH <key>` is refused by Redis, so every swap
    /// is reported as `cas-failed`, applied or not.
    #[default]
    Spin36,
    /// Spin 3.6's code with a valid `UNWATCH`: the `EXEC` reply decides, and
    /// a nil reply (the `WATCH` aborted the transaction) reads as success,
    /// so every swap is reported as a success, applied or not.
    ExecReply,
}

impl RedisSwap {
    /// The command-line name (`spin-3.6`, `exec-reply`).
    pub fn name(self) -> &'static str {
        match self {
            RedisSwap::Spin36 => "spin-3.6",
            RedisSwap::ExecReply => "exec-reply",
        }
    }

    /// Parses a command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "spin-3.6" => Some(RedisSwap::Spin36),
            "exec-reply" => Some(RedisSwap::ExecReply),
            _ => None,
        }
    }
}

/// Checks a Redis URL the way the host will use it (without connecting):
/// Spin's `parse_redis_url`, then the client's own parsing, which also
/// refuses TLS (not built in).
///
/// # Errors
/// A message naming what is wrong.
pub fn check_redis_url(url: &str) -> Result<(), String> {
    if ::redis::parse_redis_url(url).is_none() {
        return Err(format!(
            "invalid Redis URL {:?} (expected redis://host[:port][/db])",
            redact(url)
        ));
    }
    ::redis::Client::open(url)
        .map(drop)
        .map_err(|e| format!("unusable Redis URL {:?}: {e}", redact(url)))
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match ::redis::parse_redis_url(url) {
        Some(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// A key-value error as a component sees it (the union of
/// `fermyon:spin/key-value`'s and `wasi:keyvalue/store`'s error cases), plus
/// [`KvError::Trap`] for the cases where Spin's host panics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// The label is allowed but not defined (cannot happen after startup
    /// validation, kept for completeness).
    NoSuchStore,
    /// The component may not open this label.
    AccessDenied,
    /// A backend error (SQLite error text).
    Other(String),
    /// Spin would panic host-side here; the request traps.
    Trap(String),
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::NoSuchStore => f.write_str("no such store"),
            KvError::AccessDenied => f.write_str("access denied"),
            KvError::Other(m) => write!(f, "{m}"),
            KvError::Trap(m) => write!(f, "host panic (emulated as a trap): {m}"),
        }
    }
}

impl std::error::Error for KvError {}

fn other(err: impl fmt::Debug) -> KvError {
    KvError::Other(format!("{err:?}"))
}

/// The error of [`KvCas::swap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwapError {
    /// The value changed since `current` (no row updated).
    CasFailed,
    /// A backend error.
    Other(String),
}

impl fmt::Display for SwapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SwapError::CasFailed => f.write_str("failed to update 1 row"),
            SwapError::Other(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for SwapError {}

/// The SQLite busy timeout applied to every connection.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS spin_key_value (
                           store TEXT NOT NULL,
                           key   TEXT NOT NULL,
                           value BLOB NOT NULL,

                           PRIMARY KEY (store, key)
                        )";

const UPSERT: &str = "INSERT INTO spin_key_value (store, key, value) VALUES ($1, $2, $3)
                     ON CONFLICT(store, key) DO UPDATE SET value=$3";

const SELECT_VALUE: &str = "SELECT value FROM spin_key_value WHERE store=$1 AND key=$2";

/// Number of keys per statement in the batch operations.
const BATCH_CHUNK: usize = 500;

type Conn = Arc<Mutex<Connection>>;

/// One backing database (Spin's `KeyValueSqlite` / `KeyValueRedis` store
/// manager): opened lazily on first use, one connection shared by every
/// store opened from it.
struct StoreManager {
    backend: KvBackend,
    connection: OnceLock<Conn>,
    redis: Option<RedisManager>,
}

impl StoreManager {
    fn new(backend: KvBackend) -> Self {
        let redis = match &backend {
            KvBackend::Redis { url, .. } => Some(RedisManager::new(url)),
            _ => None,
        };
        StoreManager {
            backend,
            connection: OnceLock::new(),
            redis,
        }
    }

    fn connection(&self) -> Result<Conn, KvError> {
        if let Some(c) = self.connection.get() {
            return Ok(c.clone());
        }
        let new = Arc::new(Mutex::new(open_connection(&self.backend)?));
        Ok(self.connection.get_or_init(|| new).clone())
    }
}

fn open_connection(backend: &KvBackend) -> Result<Connection, KvError> {
    let conn = match backend {
        KvBackend::Memory => Connection::open_in_memory().map_err(other)?,
        KvBackend::Redis { .. } => return Err(KvError::Other("not a SQLite backend".to_string())),
        KvBackend::SqliteFile(path) => {
            if let Some(parent) = path.parent() {
                if !parent.as_os_str().is_empty() {
                    std::fs::create_dir_all(parent).map_err(|e| {
                        KvError::Other(format!("cannot create directory {}: {e}", parent.display()))
                    })?;
                }
            }
            Connection::open(path)
                .map_err(|e| KvError::Other(format!("cannot open {}: {e}", path.display())))?
        }
    };
    conn.busy_timeout(BUSY_TIMEOUT).map_err(other)?;
    conn.execute(CREATE_TABLE, []).map_err(other)?;
    Ok(conn)
}

/// Runs `f` with the locked connection on tokio's blocking pool (SQLite
/// may wait up to the busy timeout for another process).
async fn with_conn<T, E>(
    conn: &Conn,
    f: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
) -> Result<T, E>
where
    T: Send + 'static,
    E: Send + 'static + From<String>,
{
    let conn = conn.clone();
    let joined = tokio::task::spawn_blocking(move || {
        let mut guard = match conn.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    })
    .await;
    match joined {
        Ok(r) => r,
        Err(e) => Err(E::from(format!("key-value task failed: {e}"))),
    }
}

impl From<String> for KvError {
    fn from(m: String) -> Self {
        KvError::Other(m)
    }
}

impl From<String> for SwapError {
    fn from(m: String) -> Self {
        SwapError::Other(m)
    }
}

/// The set of key-value stores of an application: label to backing
/// database. The `default` label always exists.
#[derive(Clone)]
pub struct KvStores {
    managers: Arc<BTreeMap<String, Arc<StoreManager>>>,
}

impl fmt::Debug for KvStores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.managers
                    .iter()
                    .map(|(k, v)| (k, v.backend.to_string())),
            )
            .finish()
    }
}

impl KvStores {
    /// Stores with only the `default` label, backed by `default`.
    pub fn new(default: KvBackend) -> Self {
        let mut managers = BTreeMap::new();
        managers.insert("default".to_string(), Arc::new(StoreManager::new(default)));
        KvStores {
            managers: Arc::new(managers),
        }
    }

    /// Stores with the given labels. `default` is added with
    /// `default_backend` unless `labels` defines it.
    pub fn with_labels(
        default_backend: KvBackend,
        labels: impl IntoIterator<Item = (String, KvBackend)>,
    ) -> Self {
        let mut managers = BTreeMap::new();
        for (label, backend) in labels {
            managers.insert(label, Arc::new(StoreManager::new(backend)));
        }
        managers
            .entry("default".to_string())
            .or_insert_with(|| Arc::new(StoreManager::new(default_backend)));
        KvStores {
            managers: Arc::new(managers),
        }
    }

    /// Whether `label` is defined.
    pub fn is_defined(&self, label: &str) -> bool {
        self.managers.contains_key(label)
    }

    /// The backend of `label`, if defined.
    pub fn backend(&self, label: &str) -> Option<&KvBackend> {
        self.managers.get(label).map(|m| &m.backend)
    }

    /// The defined labels, sorted.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.managers.keys().map(|k| k.as_str())
    }

    /// Opens `label` for a component allowed to use `allowed` labels:
    /// `AccessDenied` if the label is not allowed, `NoSuchStore` if it is not
    /// defined (Spin checks in that order).
    pub async fn open(&self, allowed: &HashSet<String>, label: &str) -> Result<KvStore, KvError> {
        if !allowed.contains(label) {
            return Err(KvError::AccessDenied);
        }
        let manager = self
            .managers
            .get(label)
            .ok_or(KvError::NoSuchStore)?
            .clone();
        let backend = match (&manager.redis, &manager.backend) {
            (Some(redis), KvBackend::Redis { swap, .. }) => {
                Backend::Redis(redis.open(*swap).await?)
            }
            _ => Backend::Sqlite(
                tokio::task::spawn_blocking(move || manager.connection())
                    .await
                    .map_err(|e| KvError::Other(format!("key-value task failed: {e}")))??,
            ),
        };
        Ok(KvStore {
            label: label.to_string(),
            backend,
        })
    }
}

#[derive(Clone)]
enum Backend {
    Sqlite(Conn),
    Redis(RedisStore),
}

/// An open store: one label of one backing database.
#[derive(Clone)]
pub struct KvStore {
    label: String,
    backend: Backend,
}

impl fmt::Debug for KvStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvStore")
            .field("label", &self.label)
            .finish()
    }
}

impl KvStore {
    /// The store label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The value of `key`, if present.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.get(key).await,
        };
        let (label, key) = (self.label.clone(), key.to_string());
        with_conn(conn, move |c| {
            c.prepare_cached(SELECT_VALUE)
                .map_err(other)?
                .query_row([&label, &key], |row| row.get::<_, Vec<u8>>(0))
                .optional()
                .map_err(other)
        })
        .await
    }

    /// Sets `key` to `value` (upsert).
    pub async fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.set(key, value).await,
        };
        let (label, key, value) = (self.label.clone(), key.to_string(), value.to_vec());
        with_conn(conn, move |c| {
            c.prepare_cached(UPSERT)
                .map_err(other)?
                .execute(rusqlite::params![label, key, value])
                .map(drop)
                .map_err(other)
        })
        .await
    }

    /// Deletes `key` (no error if absent).
    pub async fn delete(&self, key: &str) -> Result<(), KvError> {
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.delete(key).await,
        };
        let (label, key) = (self.label.clone(), key.to_string());
        with_conn(conn, move |c| {
            c.prepare_cached("DELETE FROM spin_key_value WHERE store=$1 AND key=$2")
                .map_err(other)?
                .execute([&label, &key])
                .map(drop)
                .map_err(other)
        })
        .await
    }

    /// Whether `key` exists.
    pub async fn exists(&self, key: &str) -> Result<bool, KvError> {
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.exists(key).await,
        };
        let (label, key) = (self.label.clone(), key.to_string());
        with_conn(conn, move |c| {
            c.prepare_cached("SELECT 1 FROM spin_key_value WHERE store=$1 AND key=$2 LIMIT 1")
                .map_err(other)?
                .exists([&label, &key])
                .map_err(other)
        })
        .await
    }

    /// All keys of the store label (on Redis: of the whole database,
    /// `KEYS *`).
    pub async fn get_keys(&self) -> Result<Vec<String>, KvError> {
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.get_keys().await,
        };
        let label = self.label.clone();
        with_conn(conn, move |c| {
            let mut stmt = c
                .prepare_cached("SELECT key FROM spin_key_value WHERE store=$1")
                .map_err(other)?;
            let rows = stmt
                .query_map([&label], |row| row.get::<_, String>(0))
                .map_err(other)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(other)
        })
        .await
    }

    /// The existing keys among `keys` with their values (absent keys are
    /// omitted, as in Spin's SQLite backend). On Redis, Spin's `KEYS` call
    /// and its failures (see the module docs).
    pub async fn get_many(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<(String, Option<Vec<u8>>)>, KvError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.get_many(keys).await,
        };
        let label = self.label.clone();
        with_conn(conn, move |c| {
            let mut out = Vec::new();
            for chunk in keys.chunks(BATCH_CHUNK) {
                let sql = format!(
                    "SELECT key, value FROM spin_key_value WHERE store=? AND key IN ({})",
                    placeholders(chunk.len())
                );
                let mut stmt = c.prepare_cached(&sql).map_err(other)?;
                let params = std::iter::once(&label).chain(chunk.iter());
                let rows = stmt
                    .query_map(rusqlite::params_from_iter(params), |row| {
                        Ok((row.get::<_, String>(0)?, Some(row.get::<_, Vec<u8>>(1)?)))
                    })
                    .map_err(other)?;
                for row in rows {
                    out.push(row.map_err(other)?);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Sets several keys in one transaction.
    pub async fn set_many(&self, key_values: Vec<(String, Vec<u8>)>) -> Result<(), KvError> {
        if key_values.is_empty() {
            return Ok(());
        }
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.set_many(key_values).await,
        };
        let label = self.label.clone();
        with_conn(conn, move |c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(other)?;
            for (key, value) in key_values {
                tx.prepare_cached(UPSERT)
                    .map_err(other)?
                    .execute(rusqlite::params![label, key, value])
                    .map_err(other)?;
            }
            tx.commit().map_err(other)
        })
        .await
    }

    /// Deletes several keys.
    pub async fn delete_many(&self, keys: Vec<String>) -> Result<(), KvError> {
        if keys.is_empty() {
            return Ok(());
        }
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.delete_many(keys).await,
        };
        let label = self.label.clone();
        with_conn(conn, move |c| {
            for chunk in keys.chunks(BATCH_CHUNK) {
                let sql = format!(
                    "DELETE FROM spin_key_value WHERE store=? AND key IN ({})",
                    placeholders(chunk.len())
                );
                let params = std::iter::once(&label).chain(chunk.iter());
                c.prepare_cached(&sql)
                    .map_err(other)?
                    .execute(rusqlite::params_from_iter(params))
                    .map_err(other)?;
            }
            Ok(())
        })
        .await
    }

    /// Atomically adds `delta` to the 8-byte little-endian `i64` at `key`
    /// (absent = 0) and returns the new value. A present value of another
    /// length is [`KvError::Trap`] and nothing is written. Overflow wraps
    /// (Spin's release build does not check it either). On Redis:
    /// `INCRBY` on decimal text, whose errors (not an integer, overflow)
    /// are [`KvError::Other`].
    pub async fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(r) => return r.increment(key, delta).await,
        };
        let (label, key) = (self.label.clone(), key.to_string());
        with_conn(conn, move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(other)?;
            let value: Option<Vec<u8>> = tx
                .prepare_cached(SELECT_VALUE)
                .map_err(other)?
                .query_row([&label, &key], |row| row.get(0))
                .optional()
                .map_err(other)?;
            let current = match value {
                None => 0,
                Some(v) => match <[u8; 8]>::try_from(v.as_slice()) {
                    Ok(bytes) => i64::from_le_bytes(bytes),
                    Err(_) => {
                        // Dropping `tx` rolls back: nothing is written.
                        return Err(KvError::Trap(format!(
                            "incorrect length: increment of key {key:?} in store {label:?} found a {}-byte value, Spin's SQLite backend panics on anything but 8 bytes",
                            v.len()
                        )));
                    }
                },
            };
            let new_value = current.wrapping_add(delta);
            tx.prepare_cached(UPSERT)
                .map_err(other)?
                .execute(rusqlite::params![label, key, new_value.to_le_bytes().to_vec()])
                .map_err(other)?;
            tx.commit().map_err(other)?;
            Ok(new_value)
        })
        .await
    }

    /// A compare-and-swap handle for `key`; reads nothing. On Redis its
    /// own connection is opened on first use (see [`KvStore::open_cas`]).
    pub fn new_cas(&self, key: &str) -> KvCas {
        let redis = match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Redis(r) => Some(r.new_cas(key)),
        };
        KvCas {
            store: self.clone(),
            key: key.to_string(),
            value: None,
            redis,
        }
    }

    /// A compare-and-swap handle for `key`, as the component host's
    /// `cas.new` makes it: on Redis its own connection is opened now (an
    /// error here is a store error of `cas.new`, as in Spin); on SQLite
    /// this is [`KvStore::new_cas`].
    pub async fn open_cas(&self, key: &str) -> Result<KvCas, KvError> {
        let cas = self.new_cas(key);
        if let Some(r) = &cas.redis {
            r.connect().await?;
        }
        Ok(cas)
    }
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(",")
}

/// A compare-and-swap operation on one key (Spin's SQLite or Redis
/// `CompareAndSwap`). Clones share a Redis handle's connection (and so its
/// `WATCH`).
#[derive(Clone)]
pub struct KvCas {
    store: KvStore,
    key: String,
    /// SQLite: what `current` saw.
    value: Option<Vec<u8>>,
    /// Redis: the handle's own connection.
    redis: Option<RedisCas>,
}

impl fmt::Debug for KvCas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvCas")
            .field("store", &self.store)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl KvCas {
    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The store the key belongs to.
    pub fn store(&self) -> &KvStore {
        &self.store
    }

    /// Reads the current value and remembers it for [`KvCas::swap`] (on
    /// Redis: `WATCH key` + `GET key`).
    pub async fn current(&mut self) -> Result<Option<Vec<u8>>, KvError> {
        if let Some(r) = &self.redis {
            return r.current().await;
        }
        let value = self.store.get(&self.key).await?;
        self.value.clone_from(&value);
        Ok(value)
    }

    /// Swaps in `value`. SQLite: a conditional `UPDATE` if `current` saw a
    /// value, an unconditional upsert otherwise. Redis: `MULTI`/`SET`/`EXEC`
    /// then `UNWATCH`, reported per [`RedisSwap`] (see the module docs).
    pub async fn swap(&self, value: Vec<u8>) -> Result<(), SwapError> {
        if let Some(r) = &self.redis {
            return r.swap(value).await;
        }
        let conn = match &self.store.backend {
            Backend::Sqlite(c) => c,
            Backend::Redis(_) => return Err(SwapError::Other("no Redis handle".to_string())),
        };
        let (label, key, old) = (
            self.store.label.clone(),
            self.key.clone(),
            self.value.clone(),
        );
        let swap_err = |e: rusqlite::Error| SwapError::Other(format!("{e:?}"));
        let rows = with_conn(conn, move |c| match old {
            Some(old) => c
                .prepare_cached(
                    "UPDATE spin_key_value SET value=:new_value WHERE store=:name and key=:key and value=:old_value",
                )
                .map_err(swap_err)?
                .execute(rusqlite::named_params! {
                    ":name": label,
                    ":key": key,
                    ":old_value": old,
                    ":new_value": value,
                })
                .map_err(swap_err),
            None => {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(swap_err)?;
                let rows = tx
                    .prepare_cached(UPSERT)
                    .map_err(swap_err)?
                    .execute(rusqlite::params![label, key, value])
                    .map_err(swap_err)?;
                tx.commit().map_err(swap_err)?;
                Ok(rows)
            }
        })
        .await?;
        if rows == 1 {
            Ok(())
        } else {
            Err(SwapError::CasFailed)
        }
    }
}

/// Counts of key-value data operations made by one request.
///
/// Counted: `get`, `set`, `delete`, `exists`, `get-keys`/`list-keys`,
/// `get-many`, `set-many`, `delete-many`, `increment`, `cas.current`,
/// `cas.swap` — every call the component makes, whatever its outcome. Not
/// counted: opening a store, `cas.new`, resource drops, and the internal
/// re-read Spin performs to build the fresh handle of a failed swap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvOpCounts {
    /// `get` (both interfaces).
    pub get: u64,
    /// `set` (both interfaces).
    pub set: u64,
    /// `delete` (both interfaces).
    pub delete: u64,
    /// `exists` (both interfaces).
    pub exists: u64,
    /// `fermyon:spin/key-value` `get-keys` and `wasi:keyvalue` `list-keys`.
    pub get_keys: u64,
    /// `wasi:keyvalue/batch.get-many`.
    pub get_many: u64,
    /// `wasi:keyvalue/batch.set-many`.
    pub set_many: u64,
    /// `wasi:keyvalue/batch.delete-many`.
    pub delete_many: u64,
    /// `wasi:keyvalue/atomics.increment`.
    pub increment: u64,
    /// `wasi:keyvalue/atomics` `cas.current`.
    pub cas_current: u64,
    /// `wasi:keyvalue/atomics.swap`.
    pub cas_swap: u64,
}

impl KvOpCounts {
    /// The total number of operations.
    pub fn total(&self) -> u64 {
        self.entries().iter().map(|(_, n)| n).sum()
    }

    /// `(name, count)` for every operation kind, in a fixed order. Names are
    /// those of the `x-kv-ops-detail` header.
    pub fn entries(&self) -> [(&'static str, u64); 11] {
        [
            ("get", self.get),
            ("set", self.set),
            ("delete", self.delete),
            ("exists", self.exists),
            ("get-keys", self.get_keys),
            ("get-many", self.get_many),
            ("set-many", self.set_many),
            ("delete-many", self.delete_many),
            ("increment", self.increment),
            ("cas.current", self.cas_current),
            ("cas.swap", self.cas_swap),
        ]
    }

    /// Adds another count to this one.
    pub fn add(&mut self, other: &KvOpCounts) {
        self.get += other.get;
        self.set += other.set;
        self.delete += other.delete;
        self.exists += other.exists;
        self.get_keys += other.get_keys;
        self.get_many += other.get_many;
        self.set_many += other.set_many;
        self.delete_many += other.delete_many;
        self.increment += other.increment;
        self.cas_current += other.cas_current;
        self.cas_swap += other.cas_swap;
    }

    /// Parses the value of an `x-kv-ops-detail` header.
    pub fn parse_detail(detail: &str) -> Option<KvOpCounts> {
        let mut c = KvOpCounts::default();
        for item in detail.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, n) = item.split_once('=')?;
            let n: u64 = n.parse().ok()?;
            let slot = match name {
                "get" => &mut c.get,
                "set" => &mut c.set,
                "delete" => &mut c.delete,
                "exists" => &mut c.exists,
                "get-keys" => &mut c.get_keys,
                "get-many" => &mut c.get_many,
                "set-many" => &mut c.set_many,
                "delete-many" => &mut c.delete_many,
                "increment" => &mut c.increment,
                "cas.current" => &mut c.cas_current,
                "cas.swap" => &mut c.cas_swap,
                _ => return None,
            };
            *slot += n;
        }
        Some(c)
    }
}

/// The `x-kv-ops-detail` form: non-zero counts as `name=n`, comma-separated,
/// in a fixed order (empty when there were none).
impl fmt::Display for KvOpCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, n) in self.entries() {
            if n == 0 {
                continue;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{name}={n}")?;
        }
        Ok(())
    }
}

/// Resolves a runtime-config store path against the runtime config file's
/// directory, as Spin does.
pub(crate) fn resolve_store_path(base: &Path, path: &str) -> PathBuf {
    base.join(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(labels: &[&str]) -> HashSet<String> {
        labels.iter().map(|s| s.to_string()).collect()
    }

    async fn default_store(backend: KvBackend) -> KvStore {
        KvStores::new(backend)
            .open(&allowed(&["default"]), "default")
            .await
            .unwrap()
    }

    #[test]
    fn counts_display_and_parse() {
        let c = KvOpCounts {
            get: 2,
            cas_current: 1,
            cas_swap: 1,
            ..Default::default()
        };
        assert_eq!(c.to_string(), "get=2,cas.current=1,cas.swap=1");
        assert_eq!(c.total(), 4);
        assert_eq!(KvOpCounts::parse_detail(&c.to_string()), Some(c));
        assert_eq!(KvOpCounts::default().to_string(), "");
        assert_eq!(KvOpCounts::parse_detail(""), Some(KvOpCounts::default()));
        assert_eq!(KvOpCounts::parse_detail("bogus=1"), None);
    }

    #[tokio::test]
    async fn basic_ops_memory() {
        let s = default_store(KvBackend::Memory).await;
        assert_eq!(s.get("a").await.unwrap(), None);
        assert!(!s.exists("a").await.unwrap());
        s.set("a", b"1").await.unwrap();
        s.set("a", b"2").await.unwrap();
        assert_eq!(s.get("a").await.unwrap(), Some(b"2".to_vec()));
        assert!(s.exists("a").await.unwrap());
        s.set_many(vec![
            ("b".into(), b"x".to_vec()),
            ("c".into(), b"y".to_vec()),
        ])
        .await
        .unwrap();
        let mut keys = s.get_keys().await.unwrap();
        keys.sort();
        assert_eq!(keys, vec!["a", "b", "c"]);
        let mut many = s
            .get_many(vec!["a".into(), "zz".into(), "c".into()])
            .await
            .unwrap();
        many.sort();
        assert_eq!(
            many,
            vec![
                ("a".into(), Some(b"2".to_vec())),
                ("c".into(), Some(b"y".to_vec()))
            ]
        );
        s.delete_many(vec!["a".into(), "b".into(), "nope".into()])
            .await
            .unwrap();
        s.delete("c").await.unwrap();
        s.delete("c").await.unwrap();
        assert!(s.get_keys().await.unwrap().is_empty());
    }
}
