//! Spin 3.6's Redis key-value backend (`type = "redis"`), call for call:
//! `spin@v3.6.3:crates/key-value-redis/src/store.rs` on the same `redis`
//! crate line (0.32) and the same commands, so every reply — and every
//! quirk — is the one Spin's host gets. See the parent module's docs for
//! the resulting semantics.

use std::sync::Arc;

use ::redis::aio::ConnectionManager;
use ::redis::{AsyncCommands, Client, RedisError};
use tokio::sync::OnceCell;

use super::{other, KvError, RedisSwap, SwapError};

async fn connect(url: &str) -> Result<ConnectionManager, RedisError> {
    Client::open(url)?.get_connection_manager().await
}

/// One `[key_value_store.<label>]` of type `redis` (Spin's `KeyValueRedis`):
/// one multiplexed connection, opened on first use and shared by every
/// store opened from it.
pub(super) struct RedisManager {
    url: String,
    connection: OnceCell<ConnectionManager>,
}

impl RedisManager {
    pub(super) fn new(url: &str) -> Self {
        RedisManager {
            url: url.to_string(),
            connection: OnceCell::new(),
        }
    }

    /// Spin's `StoreManager::get` then `Store::after_open`: connect once,
    /// then a `PING` whose failure is ignored (the connection manager
    /// reconnects in the background).
    pub(super) async fn open(&self, swap: RedisSwap) -> Result<RedisStore, KvError> {
        let connection = self
            .connection
            .get_or_try_init(|| connect(&self.url))
            .await
            .map_err(other)?
            .clone();
        let _ = connection.clone().ping::<()>().await;
        Ok(RedisStore {
            connection,
            url: self.url.clone(),
            swap,
        })
    }
}

/// An open Redis store. The store label plays no part: every label on one
/// URL shares the database's keyspace.
#[derive(Clone)]
pub(super) struct RedisStore {
    connection: ConnectionManager,
    url: String,
    swap: RedisSwap,
}

impl RedisStore {
    fn conn(&self) -> ConnectionManager {
        self.connection.clone()
    }

    pub(super) async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        self.conn()
            .get::<_, Option<Vec<u8>>>(key)
            .await
            .map_err(other)
    }

    pub(super) async fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        self.conn().set::<_, _, ()>(key, value).await.map_err(other)
    }

    pub(super) async fn delete(&self, key: &str) -> Result<(), KvError> {
        self.conn().del::<_, ()>(key).await.map_err(other)
    }

    pub(super) async fn exists(&self, key: &str) -> Result<bool, KvError> {
        self.conn().exists::<_, bool>(key).await.map_err(other)
    }

    /// `KEYS *`: every key of the database, whatever the label.
    pub(super) async fn get_keys(&self) -> Result<Vec<String>, KvError> {
        self.conn().keys::<_, Vec<String>>("*").await.map_err(other)
    }

    /// Spin sends `KEYS <key>...` here (not `MGET`) and reads the reply as
    /// key/value pairs; reproduced (see the module docs). An odd number of
    /// matching names makes redis-rs panic in that parse
    /// (`unreachable!()` in its tuple chunking), a panic of Spin's host:
    /// that case is [`KvError::Trap`] here, checked before parsing.
    pub(super) async fn get_many(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<(String, Option<Vec<u8>>)>, KvError> {
        let reply: ::redis::Value = self.conn().keys(keys).await.map_err(other)?;
        if let ::redis::Value::Array(items) = &reply {
            if items.len() % 2 == 1 {
                return Err(KvError::Trap(format!(
                    "get_many: Spin's Redis backend sends KEYS and redis-rs panics reading its {}-name reply as key/value pairs",
                    items.len()
                )));
            }
        }
        ::redis::from_owned_redis_value(reply).map_err(other)
    }

    pub(super) async fn set_many(&self, key_values: Vec<(String, Vec<u8>)>) -> Result<(), KvError> {
        self.conn()
            .mset::<_, _, ()>(&key_values)
            .await
            .map_err(other)
    }

    pub(super) async fn delete_many(&self, keys: Vec<String>) -> Result<(), KvError> {
        self.conn().del::<_, ()>(keys).await.map_err(other)
    }

    /// `INCRBY key delta` (decimal text; a value that is not an integer is
    /// Redis's error, returned as [`KvError::Other`]).
    pub(super) async fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        self.conn()
            .incr::<_, _, i64>(key, delta)
            .await
            .map_err(other)
    }

    /// A CAS handle whose own connection is opened lazily (on the first
    /// `current` or `swap`); [`RedisCas::connect`] opens it now, as Spin
    /// does in `new_compare_and_swap`.
    pub(super) fn new_cas(&self, key: &str) -> RedisCas {
        RedisCas {
            url: self.url.clone(),
            swap: self.swap,
            key: key.to_string(),
            connection: Arc::new(OnceCell::new()),
        }
    }
}

/// A compare-and-swap on its own connection (Redis transactions are per
/// connection). Clones share the connection, so a `WATCH` made through one
/// clone holds for the others.
#[derive(Clone)]
pub(super) struct RedisCas {
    url: String,
    swap: RedisSwap,
    key: String,
    connection: Arc<OnceCell<ConnectionManager>>,
}

impl RedisCas {
    async fn conn(&self) -> Result<ConnectionManager, RedisError> {
        Ok(self
            .connection
            .get_or_try_init(|| connect(&self.url))
            .await?
            .clone())
    }

    /// Opens the handle's connection.
    pub(super) async fn connect(&self) -> Result<(), KvError> {
        self.conn().await.map(drop).map_err(other)
    }

    /// `WATCH key`, then `GET key`.
    pub(super) async fn current(&self) -> Result<Option<Vec<u8>>, KvError> {
        let mut conn = self.conn().await.map_err(other)?;
        ::redis::cmd("WATCH")
            .arg(&self.key)
            .exec_async(&mut conn)
            .await
            .map_err(other)?;
        conn.get::<_, Option<Vec<u8>>>(&self.key)
            .await
            .map_err(other)
    }

    /// `MULTI; SET key value; EXEC` read into `()`, then `UNWATCH`:
    ///
    /// - the EXEC reply of a transaction aborted by the `WATCH` is nil,
    ///   which redis-rs turns into `Ok(())`: an aborted swap *reads* as a
    ///   success;
    /// - [`RedisSwap::Spin36`] sends `UNWATCH key`, as Spin 3.6 does.
    ///   `UNWATCH` takes no argument, so Redis answers "wrong number of
    ///   arguments" and the swap is reported as `CasFailed` — every swap,
    ///   whether the `SET` was applied or aborted;
    /// - [`RedisSwap::ExecReply`] sends a plain `UNWATCH`, so the EXEC
    ///   reading above decides: applied or aborted, the swap is reported
    ///   as a success;
    /// - an EXEC error (e.g. the connection broke) is `CasFailed`, as in
    ///   Spin.
    pub(super) async fn swap(&self, value: Vec<u8>) -> Result<(), SwapError> {
        let mut conn = self
            .conn()
            .await
            .map_err(|e| SwapError::Other(format!("{e:?}")))?;
        let exec: Result<(), RedisError> = ::redis::pipe()
            .atomic()
            .set(&self.key, value)
            .query_async(&mut conn)
            .await;
        let mut unwatch = ::redis::cmd("UNWATCH");
        if self.swap == RedisSwap::Spin36 {
            unwatch.arg(&self.key);
        }
        unwatch
            .exec_async(&mut conn)
            .await
            .map_err(|_| SwapError::CasFailed)?;
        exec.map_err(|_| SwapError::CasFailed)
    }
}
