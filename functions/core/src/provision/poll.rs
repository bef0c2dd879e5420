//! The Metal event poller's record: which project events have been read,
//! and which devices they named still wait to be handled. Metal has no
//! webhooks, so `POST /v1/metal/poll` (run by a CronJob) reads the events
//! after the cursor and handles the devices they concern
//! (`crate::capi::poll`).
//!
//! One [`CursorRecord`] per cloud (Metal's under `metal/poll`,
//! phoenixNAP's audit log under `metal/poll-phoenixnap`), kept with the
//! compare-and-swap protocol. Reading events and handling devices are decoupled, so the
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
//!    A device whose read failed stays, its failures counted and its next
//!    read put off ([`failed`], exponential from [`BACKOFF_BASE_S`] up to
//!    [`BACKOFF_CAP_S`], on the caller's clock): the calls in between
//!    leave it alone and work on the others.
//!
//! Event types are not part of the spec; a poller reads the device an
//! event names (its `relationships`) rather than trusting the type.

use serde::{Deserialize, Serialize};

use crate::cloud::{Cloud, CloudKind};
use crate::error::Result;
use crate::kv::keys;
use crate::kv::protocol::{read_record, update_record, Decision, Enveloped, StateRecord};
use crate::kv::Ctx;
use crate::ports::kv::KvStore;

/// Schema version of the cursor record.
pub const CURSOR_VERSION: u32 = 1;

/// Pages of events read per call at most, looking for the cursor (with
/// the client's page size, 250: 5,000 events). A cursor further back is
/// treated as lost: a resync.
pub const MAX_EVENT_PAGES: u32 = 20;

/// Seconds a device's reads are put off after its first failure (one
/// poll interval); doubled by each failure in a row, up to
/// [`BACKOFF_CAP_S`].
pub const BACKOFF_BASE_S: u64 = 60;

/// The longest a device's reads are put off after failures (15 minutes):
/// a device Metal answers again is handled at most this long after.
pub const BACKOFF_CAP_S: u64 = 900;

/// Longest stored message of a device's last failure, in bytes.
pub const MAX_ERROR_LEN: usize = 300;

/// Seconds a device's reads are put off after `failures` failures in a
/// row (at least 1).
///
/// ```
/// use metal_ipam_core::provision::poll::backoff_s;
/// assert_eq!(backoff_s(1), 60);
/// assert_eq!(backoff_s(3), 240);
/// assert_eq!(backoff_s(5), 900);
/// assert_eq!(backoff_s(60), 900);
/// ```
pub fn backoff_s(failures: u32) -> u64 {
    let doublings = failures.saturating_sub(1).min(16);
    BACKOFF_BASE_S
        .saturating_mul(1 << doublings)
        .min(BACKOFF_CAP_S)
}

/// A device waiting to be handled, the ingest that named it last, and its
/// reads that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingDevice {
    /// The device's id.
    pub device: String,
    /// The generation of the last ingest that named it.
    pub gen: u64,
    /// Unix seconds it was first named (kept while it stays pending; 0 in
    /// a record written before this field).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub since: u64,
    /// Reads of the device that failed in a row.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub failures: u32,
    /// Unix seconds before which no call reads it again (after a failure).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_at: u64,
    /// Why its last read failed (the error's reason and message, at most
    /// [`MAX_ERROR_LEN`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PendingDevice {
    /// A device first named at `now` by the ingest of generation `gen`.
    pub fn new(device: &str, gen: u64, now: u64) -> PendingDevice {
        PendingDevice {
            device: device.to_string(),
            gen,
            since: now,
            failures: 0,
            retry_at: 0,
            error: None,
        }
    }

    /// Whether its reads are put off at `now` (a failure's backoff).
    pub fn backing_off(&self, now: u64) -> bool {
        now < self.retry_at
    }

    /// Whether this is the same naming as `other`: device and generation.
    fn same(&self, other: &PendingDevice) -> bool {
        self.device == other.device && self.gen == other.gen
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
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

/// One cursor per cloud: Metal's under `metal/poll`, phoenixNAP's under
/// `metal/poll-phoenixnap`.
impl StateRecord for Cursor {
    type Id = CloudKind;
    const VERSION: u32 = CURSOR_VERSION;
    const WHAT: &'static str = "event cursor";

    fn key(kind: &CloudKind) -> String {
        match kind {
            CloudKind::Metal => keys::METAL_POLL,
            CloudKind::Phoenixnap => keys::PNAP_POLL,
        }
        .to_string()
    }
    fn guard_key(kind: &CloudKind) -> String {
        match kind {
            CloudKind::Metal => keys::METAL_POLL_INIT,
            CloudKind::Phoenixnap => keys::PNAP_POLL_INIT,
        }
        .to_string()
    }
    fn describe(kind: &CloudKind) -> String {
        format!("the {} event cursor", kind.name())
    }
}

/// The record, `None` before the first poll (one `get`).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn read<K: KvStore>(kv: &K, kind: CloudKind) -> Result<Option<Cursor>> {
    read_record::<K, CursorRecord>(kv, &kind)
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
pub fn ingest<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kind: CloudKind,
    cloud: &C,
    known: impl FnOnce() -> Result<Vec<String>>,
) -> Result<Ingested> {
    let from = read(ctx.kv, kind)?;
    let last = from.as_ref().map(|c| c.last.clone());
    let (events, found) = cloud
        .events_after(last.as_deref(), MAX_EVENT_PAGES)
        .map_err(|e| cloud.error(e))?;
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
        for d in &e.devices {
            if !named.iter().any(|x| x == d) {
                named.push(d.clone());
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
    let now = ctx.env.now();
    let cursor = update_record::<K, CursorRecord, Cursor>(ctx, &kind, |cur| {
        if cur.map(|c| &c.last) != last.as_ref() {
            // Another poller ingested meanwhile: its record stands.
            return Ok(Decision::Done(cur.cloned().unwrap_or_default()));
        }
        let mut next = cur.cloned().unwrap_or_default();
        next.gen += 1;
        next.last = newest.clone();
        for d in &named {
            // Named again: a newer generation; its failures and backoff
            // stay (they are about the device, not the event).
            match next.pending.iter_mut().find(|p| &p.device == d) {
                Some(p) => {
                    p.gen = next.gen;
                    if p.since == 0 {
                        p.since = now;
                    }
                }
                None => next.pending.push(PendingDevice::new(d, next.gen, now)),
            }
        }
        next.recheck_unplaced |= resync || !named.is_empty();
        Ok(Decision::Write(Box::new(next.clone()), next))
    })?;
    Ok(Ingested {
        events: count,
        resync,
        cursor,
    })
}

/// A device whose read failed in a call: the device as the call took it,
/// and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    /// The device, with the generation the call took it at.
    pub pending: PendingDevice,
    /// The error (its reason and message).
    pub error: String,
}

/// Takes `handled` (devices with the generation the caller took them at)
/// out of `pending`, unless a later ingest named them again (then only
/// their failures are cleared: the read succeeded); counts a failure for
/// each of `failed` still pending (whatever its generation), putting its
/// next read off by [`backoff_s`] from `now`; and clears
/// `recheck_unplaced` when `unplaced_done` (the caller rechecked every
/// claim waiting for a device, after reading the record that asked for
/// it). Returns the record afterwards.
///
/// # Idempotency
/// A device leaves `pending` once; a failure is counted once per call.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn done<K: KvStore>(
    ctx: &Ctx<'_, K>,
    kind: CloudKind,
    handled: &[PendingDevice],
    failed: &[Failed],
    unplaced_done: Option<u64>,
    now: u64,
) -> Result<Cursor> {
    update_record::<K, CursorRecord, Cursor>(ctx, &kind, |cur| {
        let Some(cur) = cur else {
            return Ok(Decision::Done(Cursor::default()));
        };
        let mut next = cur.clone();
        next.pending.retain(|p| !handled.iter().any(|h| h.same(p)));
        for p in &mut next.pending {
            if handled.iter().any(|h| h.device == p.device) {
                p.failures = 0;
                p.retry_at = 0;
                p.error = None;
            }
            if let Some(f) = failed.iter().find(|f| f.pending.device == p.device) {
                p.failures = p.failures.saturating_add(1);
                p.retry_at = now.saturating_add(backoff_s(p.failures));
                p.error = Some(truncate(&f.error));
            }
        }
        // Only if no ingest asked for another recheck since.
        if unplaced_done == Some(cur.gen) {
            next.recheck_unplaced = false;
        }
        if next == *cur {
            return Ok(Decision::Done(next));
        }
        Ok(Decision::Write(Box::new(next.clone()), next))
    })
}

/// `text` cut to at most [`MAX_ERROR_LEN`] bytes, on a character boundary.
fn truncate(text: &str) -> String {
    if text.len() <= MAX_ERROR_LEN {
        return text.to_string();
    }
    let mut end = MAX_ERROR_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Backend, MemKv, TestEnv};

    fn pending(device: &str, gen: u64) -> PendingDevice {
        PendingDevice::new(device, gen, 0)
    }

    fn ctx<'a>(kv: &'a MemKv, env: &'a TestEnv) -> Ctx<'a, MemKv> {
        Ctx::auto(kv, env)
    }

    fn stored(ctx: &Ctx<'_, MemKv>, c: Cursor) {
        update_record::<_, CursorRecord, ()>(ctx, &CloudKind::Metal, |_| {
            Ok(Decision::Write(Box::new(c.clone()), ()))
        })
        .unwrap();
    }

    #[test]
    fn a_device_named_again_meanwhile_stays_pending() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::seeded(100, 3);
            let ctx = ctx(&kv, &env);
            stored(
                &ctx,
                Cursor {
                    last: "e2".into(),
                    gen: 3,
                    pending: vec![pending("d1", 2), pending("d2", 3)],
                    recheck_unplaced: true,
                },
            );
            // A poller took d1 at gen 1 (stale) and d2 at gen 3.
            let after = done(
                &ctx,
                CloudKind::Metal,
                &[pending("d1", 1), pending("d2", 3)],
                &[],
                Some(2),
                100,
            )
            .unwrap();
            assert_eq!(after.pending, vec![pending("d1", 2)], "{backend:?}");
            assert!(after.recheck_unplaced, "a later ingest asked again");
            let after = done(
                &ctx,
                CloudKind::Metal,
                &[pending("d1", 2)],
                &[],
                Some(3),
                100,
            )
            .unwrap();
            assert!(after.pending.is_empty() && !after.recheck_unplaced);
            assert_eq!(read(&kv, CloudKind::Metal).unwrap().unwrap().last, "e2");
        }
    }

    #[test]
    fn a_failing_device_backs_off_and_keeps_its_place_until_a_read_succeeds() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::seeded(1_000, 4);
            let ctx = ctx(&kv, &env);
            stored(
                &ctx,
                Cursor {
                    last: "e1".into(),
                    gen: 2,
                    pending: vec![
                        PendingDevice::new("bad", 1, 900),
                        PendingDevice::new("ok", 2, 950),
                    ],
                    recheck_unplaced: false,
                },
            );
            let fail = |p: PendingDevice| Failed {
                pending: p,
                error: "MetalUnavailable: GET /devices/bad: 500".into(),
            };
            let bad = PendingDevice::new("bad", 1, 900);
            let after = done(
                &ctx,
                CloudKind::Metal,
                &[PendingDevice::new("ok", 2, 950)],
                &[fail(bad.clone())],
                None,
                1_000,
            )
            .unwrap();
            assert_eq!(after.pending.len(), 1, "{backend:?}");
            let p = &after.pending[0];
            assert_eq!((p.failures, p.retry_at, p.since), (1, 1_060, 900));
            assert!(p.backing_off(1_059) && !p.backing_off(1_060));
            assert!(p.error.as_deref().unwrap().contains("500"));
            // Failing again doubles the wait; a later ingest's naming
            // keeps the count (it is about the device).
            let after = done(
                &ctx,
                CloudKind::Metal,
                &[],
                &[fail(bad.clone())],
                None,
                1_060,
            )
            .unwrap();
            assert_eq!(
                (after.pending[0].failures, after.pending[0].retry_at),
                (2, 1_180)
            );
            // A read that succeeds but was taken at an older generation:
            // the device stays (named again), its failures are cleared.
            update_record::<_, CursorRecord, ()>(&ctx, &CloudKind::Metal, |c| {
                let mut c = c.cloned().unwrap();
                c.pending[0].gen = 3;
                Ok(Decision::Write(Box::new(c), ()))
            })
            .unwrap();
            let after = done(
                &ctx,
                CloudKind::Metal,
                std::slice::from_ref(&bad),
                &[],
                None,
                1_200,
            )
            .unwrap();
            let p = &after.pending[0];
            assert_eq!(
                (p.gen, p.failures, p.retry_at, p.error.as_deref()),
                (3, 0, 0, None)
            );
            let after = done(
                &ctx,
                CloudKind::Metal,
                &[PendingDevice { gen: 3, ..bad }],
                &[],
                None,
                1_200,
            )
            .unwrap();
            assert!(after.pending.is_empty());
        }
    }

    #[test]
    fn the_backoff_grows_to_its_cap_and_long_errors_are_cut() {
        let waits: Vec<u64> = (1..=7).map(backoff_s).collect();
        assert_eq!(waits, [60, 120, 240, 480, 900, 900, 900]);
        assert_eq!(backoff_s(u32::MAX), BACKOFF_CAP_S);
        let long = "é".repeat(400);
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_ERROR_LEN + "…".len() && cut.ends_with('…'));
    }
}
