//! (being written) The browser view's data.

use serde_json::{json, Value};

use crate::error::Result;
use crate::ipam::pool::PoolId;
use crate::kv::Ctx;
use crate::ports::kv::KvStore;

/// The overview.
///
/// # Errors
/// The store failed.
pub fn overview<K: KvStore>(_ctx: &Ctx<'_, K>) -> Result<Value> {
    Ok(json!({}))
}

/// One pool.
///
/// # Errors
/// The store failed.
pub fn pool<K: KvStore>(_ctx: &Ctx<'_, K>, _id: &PoolId) -> Result<Option<Value>> {
    Ok(None)
}

/// The machines.
///
/// # Errors
/// The store failed.
pub fn machines<K: KvStore>(_ctx: &Ctx<'_, K>) -> Result<Value> {
    Ok(json!({}))
}

/// Search.
///
/// # Errors
/// The store failed.
pub fn search<K: KvStore>(_ctx: &Ctx<'_, K>, _query: &str) -> Result<Value> {
    Ok(json!({}))
}
