//! (being written) The Prometheus exposition.

use crate::error::Result;
use crate::kv::Ctx;
use crate::ports::kv::KvStore;

/// The exposition's content type (text format 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition.
///
/// # Errors
/// The store failed.
pub fn scrape<K: KvStore>(_ctx: &Ctx<'_, K>) -> Result<String> {
    Ok(String::new())
}
