//! The Metal event poller's cursor: which project events have been
//! handled. Metal has no webhooks, so `POST /v1/metal/poll` (run by a
//! CronJob) reads the events after the cursor, handles the devices they
//! concern, and only then advances the cursor.
//!
//! The cursor is the id of the newest handled event, one [`CursorRecord`]
//! under `metal/poll` kept with the compare-and-swap protocol. It moves
//! only from the value the poller started from ([`advance`]): two pollers
//! at once never move it backwards, and a poller that stops after handling
//! but before advancing leaves the events to be handled again (handling is
//! idempotent). Work per call is bounded by [`MAX_EVENTS`].
//!
//! Event types are not part of the spec; a poller reads the device an
//! event names (its `relationships`) rather than trusting the type.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::kv::keys;
use crate::kv::protocol::{read_record, update_record, Enveloped, StateRecord, Step};
use crate::kv::Ctx;
use crate::metal::client::Metal;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::ports::Env;

/// Schema version of the cursor record.
pub const CURSOR_VERSION: u32 = 1;

/// Events handled per call at most (the oldest first); the rest wait for
/// the next call.
pub const MAX_EVENTS: usize = 200;

/// Pages of events read per call at most, looking for the cursor.
pub const MAX_EVENT_PAGES: u32 = 4;

/// The cursor: the newest handled event's id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    /// The newest handled event's id.
    pub last: String,
}

/// The value of the `metal/poll` key: the envelope and the [`Cursor`].
pub type CursorRecord = Enveloped<Cursor>;

impl StateRecord for Cursor {
    type Id = ();
    const VERSION: u32 = CURSOR_VERSION;
    const WHAT: &'static str = "Metal event cursor";

    fn key(_: &()) -> String {
        keys::METAL_POLL.to_string()
    }
    fn guard_key(_: &()) -> String {
        keys::METAL_POLL_INIT.to_string()
    }
    fn describe(_: &()) -> String {
        "the Metal event cursor".to_string()
    }
}

/// The cursor: the newest handled event's id, `None` before the first
/// poll (one `get`).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn cursor<K: KvStore>(kv: &K) -> Result<Option<String>> {
    Ok(read_record::<K, CursorRecord>(kv, &())?.map(|c| c.last))
}

/// What one call has to handle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The cursor the call started from.
    pub from: Option<String>,
    /// Events newer than the cursor handled by this call (at most
    /// [`MAX_EVENTS`]).
    pub events: usize,
    /// The devices they concern, each once, in the order first seen
    /// (oldest event first).
    pub devices: Vec<String>,
    /// The newest event of the batch: where the cursor goes once handled.
    pub to: Option<String>,
    /// More events wait beyond this batch.
    pub more: bool,
    /// The cursor was not found among the events read (the first poll, or
    /// events were missed): the caller should also recheck every claim
    /// waiting on a device.
    pub resync: bool,
}

/// Reads the events after the cursor (newest first from Metal, handled
/// oldest first) and returns the batch to handle.
///
/// # Errors
/// Store errors; Metal unavailable.
pub fn next_batch<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
) -> Result<Batch> {
    let from = cursor(ctx.kv)?;
    let (mut events, found) = metal.project_events_after(from.as_deref(), MAX_EVENT_PAGES)?;
    events.reverse();
    let more = events.len() > MAX_EVENTS;
    events.truncate(MAX_EVENTS);
    let mut devices: Vec<String> = Vec::new();
    for e in &events {
        for d in e.devices() {
            if !devices.iter().any(|x| x == d) {
                devices.push(d.to_string());
            }
        }
    }
    Ok(Batch {
        resync: from.is_none() || !found,
        from,
        events: events.len(),
        devices,
        to: events.last().map(|e| e.id.clone()),
        more,
    })
}

/// Moves the cursor from `from` to `to` (the batch handled), unless
/// another poller moved it meanwhile. Returns whether it moved.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn advance<K: KvStore>(ctx: &Ctx<'_, K>, from: Option<&str>, to: &str) -> Result<bool> {
    update_record::<K, CursorRecord, bool>(ctx, &(), |cur| {
        if cur.map(|c| c.last.as_str()) != from || from == Some(to) {
            return Ok(Step::Done(false));
        }
        Ok(Step::Write(
            Box::new(Cursor {
                last: to.to_string(),
            }),
            true,
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Backend, MemKv, TestEnv};

    #[test]
    fn the_cursor_moves_only_from_where_the_poller_started() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::seeded(100, 3);
            let ctx = Ctx {
                kv: &kv,
                env: &env,
                swap_policy: crate::kv::SwapPolicy::Auto,
            };
            assert_eq!(cursor(&kv).unwrap(), None);
            assert!(advance(&ctx, None, "e2").unwrap());
            assert_eq!(cursor(&kv).unwrap().as_deref(), Some("e2"));
            // A poller that started before that move does not undo it.
            assert!(!advance(&ctx, None, "e1").unwrap());
            assert!(!advance(&ctx, Some("e2"), "e2").unwrap());
            assert!(advance(&ctx, Some("e2"), "e5").unwrap());
            assert_eq!(cursor(&kv).unwrap().as_deref(), Some("e5"), "{backend:?}");
        }
    }
}
