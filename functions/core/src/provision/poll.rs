//! The Metal event poller's record: which project events have been read,
//! and which devices they named still wait to be handled. Metal has no
//! webhooks, so `POST /v1/metal/poll` (run by a CronJob) reads the events
//! after the cursor and handles the devices they concern
//! (`crate::capi::poll`).
//!
//! One [`CursorRecord`] under `metal/poll`, kept with the compare-and-swap
//! protocol. Reading events and handling devices are decoupled, so the
//! cursor always makes progress whatever one device, claim or machine does:
//!
//! 1. **Ingest** ([`ingest`]): the events newer than the cursor are read
//!    (newest first, page by page back to the cursor, at most
//!    [`MAX_EVENT_PAGES`]); in one swap the cursor moves to the newest of
//!    them and the devices they name join `pending`, each with the
//!    ingest's generation. A cursor not found within those pages (the
//!    first poll, a poller that was off for long, events expired) is a
//!    **resync**: every device the store knows (claims' assignment records
//!    and machines' apply records) joins `pending`, so a device deleted
//!    meanwhile is still seen, and the claims waiting for a device are
//!    rechecked. The cursor moves only from the value the poller read: two
//!    pollers at once never move it backwards, and the one that lost reads
//!    the other's `pending`.
//! 2. **Work**: the caller handles pending devices, oldest first, within
//!    its budget; a failure on one claim or machine is reported on that
//!    object and retried by the next reconcile, never by holding anything
//!    here.
//! 3. **Done** ([`done`]): the handled devices leave `pending`, but only
//!    with the generation the caller took: a device named again by events
//!    ingested meanwhile (by another poller) stays, so no event is lost.
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

/// Pages of events read per call at most, looking for the cursor (with
/// the client's page size, 250: 5,000 events). A cursor further back is
/// treated as lost: a resync.
pub const MAX_EVENT_PAGES: u32 = 20;

/// A device waiting to be handled, and the ingest that named it last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingDevice {
    /// The device's id.
    pub device: String,
    /// The generation of the last ingest that named it.
    pub gen: u64,
}

/// What the record holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cursor {
    /// The newest event read (and ingested).
    pub last: String,
    /// Incremented by every ingest.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gen: u64,
    /// Devices named by ingested events and not handled yet, in the order
    /// they were first named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingDevice>,
    /// The claims waiting for a device (their owner had no provider ID)
    /// are to be rechecked: set by a resync and by an ingest that named a
    /// device, cleared once a call rechecked them all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recheck_unplaced: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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

/// The record, `None` before the first poll (one `get`).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn read<K: KvStore>(kv: &K) -> Result<Option<Cursor>> {
    read_record::<K, CursorRecord>(kv, &())
}

/// What [`ingest`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ingested {
    /// Events newer than the cursor that this call read.
    pub events: usize,
    /// The cursor was not found: every known device was made pending.
    pub resync: bool,
    /// The record after the ingest (this call's, or another poller's).
    pub cursor: Cursor,
}

/// Reads the events after the cursor and records them: the cursor moves to
/// the newest, the devices they name (and on a resync every device in
/// `known`) join `pending`. `known` is asked only on a resync.
///
/// # Idempotency
/// Ingesting again adds the same devices once (a later generation); a
/// poller that lost the race to move the cursor writes nothing.
///
/// # Errors
/// Store errors; Metal unavailable (nothing was written: the next call
/// reads the same events).
pub fn ingest<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    known: impl FnOnce() -> Result<Vec<String>>,
) -> Result<Ingested> {
    let from = read(ctx.kv)?;
    let last = from.as_ref().map(|c| c.last.clone());
    let (events, found) = metal.project_events_after(last.as_deref(), MAX_EVENT_PAGES)?;
    let resync = last.is_none() || !found;
    let Some(newest) = events.first().map(|e| e.id.clone()) else {
        return Ok(Ingested {
            cursor: from.unwrap_or_default(),
            ..Ingested::default()
        });
    };
    // Oldest first, each device once.
    let mut named: Vec<String> = Vec::new();
    for e in events.iter().rev() {
        for d in e.devices() {
            if !named.iter().any(|x| x == d) {
                named.push(d.to_string());
            }
        }
    }
    if resync {
        for d in known()? {
            if !named.contains(&d) {
                named.push(d);
            }
        }
    }
    let count = events.len();
    let cursor = update_record::<K, CursorRecord, Cursor>(ctx, &(), |cur| {
        if cur.map(|c| &c.last) != last.as_ref() {
            // Another poller ingested meanwhile: its record stands.
            return Ok(Step::Done(cur.cloned().unwrap_or_default()));
        }
        let mut next = cur.cloned().unwrap_or_default();
        next.gen += 1;
        next.last = newest.clone();
        for d in &named {
            match next.pending.iter_mut().find(|p| &p.device == d) {
                Some(p) => p.gen = next.gen,
                None => next.pending.push(PendingDevice {
                    device: d.clone(),
                    gen: next.gen,
                }),
            }
        }
        next.recheck_unplaced |= resync || !named.is_empty();
        Ok(Step::Write(Box::new(next.clone()), next))
    })?;
    Ok(Ingested {
        events: count,
        resync,
        cursor,
    })
}

/// Takes `handled` (devices with the generation the caller took them at)
/// out of `pending`, unless a later ingest named them again, and clears
/// `recheck_unplaced` when `unplaced_done` (the caller rechecked every claim
/// waiting for a device, after reading the record that asked for it).
/// Returns the record afterwards.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn done<K: KvStore>(
    ctx: &Ctx<'_, K>,
    handled: &[PendingDevice],
    unplaced_done: Option<u64>,
) -> Result<Cursor> {
    update_record::<K, CursorRecord, Cursor>(ctx, &(), |cur| {
        let Some(cur) = cur else {
            return Ok(Step::Done(Cursor::default()));
        };
        let mut next = cur.clone();
        next.pending.retain(|p| !handled.contains(p));
        // Only if no ingest asked for another recheck since.
        if unplaced_done == Some(cur.gen) {
            next.recheck_unplaced = false;
        }
        if next == *cur {
            return Ok(Step::Done(next));
        }
        Ok(Step::Write(Box::new(next.clone()), next))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Backend, MemKv, TestEnv};

    fn pending(device: &str, gen: u64) -> PendingDevice {
        PendingDevice {
            device: device.into(),
            gen,
        }
    }

    #[test]
    fn a_device_named_again_meanwhile_stays_pending() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::seeded(100, 3);
            let ctx = Ctx {
                kv: &kv,
                env: &env,
                swap_policy: crate::kv::SwapPolicy::Auto,
            };
            update_record::<_, CursorRecord, ()>(&ctx, &(), |_| {
                Ok(Step::Write(
                    Box::new(Cursor {
                        last: "e2".into(),
                        gen: 3,
                        pending: vec![pending("d1", 2), pending("d2", 3)],
                        recheck_unplaced: true,
                    }),
                    (),
                ))
            })
            .unwrap();
            // A poller took d1 at gen 1 (stale) and d2 at gen 3.
            let after = done(&ctx, &[pending("d1", 1), pending("d2", 3)], Some(2)).unwrap();
            assert_eq!(after.pending, vec![pending("d1", 2)], "{backend:?}");
            assert!(after.recheck_unplaced, "a later ingest asked again");
            let after = done(&ctx, &[pending("d1", 2)], Some(3)).unwrap();
            assert!(after.pending.is_empty() && !after.recheck_unplaced);
            assert_eq!(read(&kv).unwrap().unwrap().last, "e2");
        }
    }
}
