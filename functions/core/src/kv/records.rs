//! The parts of the stored envelope every compare-and-swap record shares:
//! the schema version rule, the writer tokens a read-back looks for, and
//! whether a record's swaps are read back. The records themselves live with
//! their domain (`ipam::store`, `provision`, `network::apply`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Current version of every record's schema (`"v"`).
pub const RECORD_VERSION: u32 = 1;

/// How many earlier writers' tokens a pool record keeps besides its own
/// (`recentWriters`). A read-back that finds the reader's token among them
/// knows its swap landed and was overwritten since, rather than aborted.
pub const RECENT_WRITERS: usize = 31;

/// Whether swaps on a pool record are read back (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SwapCheck {
    /// The backend's swaps are exact (Spin's SQLite store).
    Exact,
    /// Read back after every reported swap.
    Verify,
}

/// Decodes a JSON record and checks its schema version (`what` names it
/// in the message).
///
/// # Errors
/// 500 for bytes that do not parse or carry another version.
pub fn decode_versioned<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
    version: impl Fn(&T) -> u32,
) -> Result<T> {
    let rec: T = serde_json::from_slice(bytes)
        .map_err(|e| Error::unreadable(format!("unreadable {what} record: {e}")))?;
    let v = version(&rec);
    if v != RECORD_VERSION {
        return Err(Error::unreadable(format!(
            "{what} record has schema version {v}, this build reads {RECORD_VERSION}"
        )));
    }
    Ok(rec)
}

/// Whether `token` is `writer` or among `recent` (a record's envelope).
pub fn written_by(writer: &str, recent: &[String], token: &str) -> bool {
    writer == token || recent.iter().any(|w| w == token)
}

/// The `recentWriters` of the record that replaces one written by
/// `writer` after `recent`: `writer` appended, the oldest dropped beyond
/// [`RECENT_WRITERS`].
pub fn writers_after(writer: &str, recent: &[String]) -> Vec<String> {
    let mut w = recent.to_vec();
    w.push(writer.to_string());
    let excess = w.len().saturating_sub(RECENT_WRITERS);
    w.drain(..excess);
    w
}
