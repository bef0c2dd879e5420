//! The compare-and-swap protocol of any [`CasRecord`] (the pool record,
//! the Metal records, a device's network record).
//!
//! The full description, with the invariants and the reasoning about each
//! backend's quirks, is `kv-schema/README.md`; this module is its code.
//! The keys are [`crate::kv::keys`]'s.
//!
//! # Protocol
//! Every change to a record is one read-modify-write with
//! [`KvStore::cas_read`] / [`KvStore::cas_swap`], retried on conflict. (For
//! a pool, the claim-key writes a decision owes are intents in its record:
//! `ipam::alloc::Intent`, `ipam::ops`.) Two rules make the swap
//! exact on Spin's real backends:
//! 1. **Never swap on an absent key** (Spin's SQLite backend upserts it, so
//!    two creators would both "win"). A record key is first brought into
//!    existence with `increment(key, 0)` by the one request that won the
//!    creation guard counter (or, if that winner crashed before making it,
//!    by a loser at least [`GUARD_STALL_S`] after the stall was first seen:
//!    `take_over_creation`); the swap then replaces that zero counter.
//!    Record keys are never deleted while in use (deletion leaves a
//!    tombstone, or [`forget_record`] removes key and guard together), so
//!    every later swap is on an existing key.
//! 2. **Read back whenever the backend's answer cannot be trusted.** Each
//!    written record carries a fresh random `writer` token and the 31
//!    before it, so a read-back tells a landed swap (its token is there,
//!    possibly under newer writes) from an aborted one, whatever the
//!    backend reported (Redis may report an abort as success; Spin 3.6's
//!    Redis backend reports every swap as failed). The zero counter's
//!    encoding tells the backends apart at creation: eight zero bytes is
//!    Spin's SQLite store, whose swaps are exact, so its records are marked
//!    `swapCheck: exact` and skip the read-back; anything else is marked
//!    `verify`. The `kv_swap_check = "always"` variable forces the read-back.

use crate::error::{Error, Result};
use crate::kv::keys;
use crate::kv::records::{writers_after, written_by, SwapCheck};
use crate::ports::kv::{self, KvStore, Swap};
use crate::ports::Env;

/// How many times a read-modify-write is attempted before giving up with a
/// 503 (`Contention`).
pub const MAX_CAS_ATTEMPTS: u32 = 64;

/// The operator's choice (`kv_swap_check` variable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapPolicy {
    /// Read back unless the record says the backend's swaps are exact.
    Auto,
    /// Always read back.
    Always,
}

impl SwapPolicy {
    /// Parses the variable: `auto` or `always`.
    ///
    /// # Errors
    /// 500 naming the bad value (a deployment mistake, not a client error).
    pub fn parse(s: &str) -> Result<SwapPolicy> {
        match s.trim() {
            "" | "auto" => Ok(SwapPolicy::Auto),
            "always" => Ok(SwapPolicy::Always),
            other => Err(Error::internal(format!(
                "variable kv_swap_check is {other:?}; expected \"auto\" or \"always\""
            ))),
        }
    }
}

/// What a read-modify-write callback decided (`N`: what the record type
/// builds from, [`CasRecord::Next`]).
#[derive(Debug)]
pub enum Decision<T, N> {
    /// Nothing to write; return `T`.
    Done(T),
    /// Write `N`, then return `T`.
    Write(Box<N>, T),
}

/// The envelope every compare-and-swap record carries besides its content:
/// what the protocol reads and writes, whatever the record holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Incremented by every write (1 for the first).
    pub rev: u64,
    /// Random token of this write.
    pub writer: String,
    /// Tokens of the writers before it, newest last, at most
    /// [`crate::kv::RECENT_WRITERS`].
    pub recent_writers: Vec<String>,
    /// Whether swaps on this record are read back.
    pub swap_check: SwapCheck,
}

/// A record kept under the compare-and-swap protocol of this module:
/// created once through a creation guard (never a swap on an absent key),
/// never deleted (a tombstone instead), every swap tagged with a writer
/// token and read back where the backend's answer cannot be trusted. The
/// pool record, the Metal records and a device's network record are.
pub trait CasRecord: Sized {
    /// What identifies one record of this type (e.g. a pool id).
    type Id: ?Sized;
    /// What a decision sees: the content, loaded and checked.
    type View;
    /// What a decision asks to write.
    type Next;

    /// The record's key.
    fn key(id: &Self::Id) -> String;
    /// Its creation guard counter's key.
    fn guard_key(id: &Self::Id) -> String;
    /// `what` in a 503 `Contention` message, e.g. `pool team-a/nodes`.
    fn describe(id: &Self::Id) -> String;
    /// Decodes stored bytes.
    ///
    /// # Errors
    /// 500 for bytes that are not a record this build reads.
    fn decode(bytes: &[u8]) -> Result<Self>;
    /// Encodes for storage.
    fn encode(&self) -> Vec<u8>;
    /// The envelope of a stored record.
    fn envelope(&self) -> Envelope;
    /// The content, or `None` for a tombstone.
    ///
    /// # Errors
    /// 500 when the stored content does not load.
    fn view(&self, id: &Self::Id) -> Result<Option<Self::View>>;
    /// The record that replaces the current one.
    fn build(next: &Self::Next, envelope: Envelope) -> Self;
}

/// The content of a record kept in an [`Enveloped`]: its key family, its
/// schema version and how it is named in messages.
pub trait StateRecord: Clone + serde::Serialize + serde::de::DeserializeOwned {
    /// What identifies one record (e.g. a claim's namespace and name).
    type Id: ?Sized;
    /// Schema version this build reads and writes.
    const VERSION: u32;
    /// The record's name in error messages, e.g. `Metal assignment record`.
    const WHAT: &'static str;
    /// The record's key.
    fn key(id: &Self::Id) -> String;
    /// Its creation guard counter's key.
    fn guard_key(id: &Self::Id) -> String;
    /// `what` in a 503 `Contention` message.
    fn describe(id: &Self::Id) -> String;
}

/// A compare-and-swap record whose content `S` sits under `state` next to
/// the envelope: `{"v", "rev", "writer", "recentWriters", "swapCheck",
/// "state"}`: the one stored form of every record kept with this protocol.
/// A tombstone, where a record has one, is content (`S` says what is left).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(bound(
    serialize = "S: serde::Serialize",
    deserialize = "S: serde::de::DeserializeOwned"
))]
pub struct Enveloped<S> {
    /// Schema version, [`Content::VERSION`] of `S`.
    pub v: u32,
    /// Incremented by every write.
    pub rev: u64,
    /// Random token of the last writer.
    pub writer: String,
    /// Tokens of the writers before it, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_writers: Vec<String>,
    /// Whether swaps on this record are read back.
    pub swap_check: SwapCheck,
    /// The content.
    pub state: S,
}

/// What an [`Enveloped`] record holds, in general: its key family, its
/// schema version and name, what a decision sees of it ([`Content::View`])
/// and what a decision asks to write ([`Content::Next`]). A
/// [`StateRecord`] is the simple case, seen and written as it is stored.
pub trait Content: Sized + serde::Serialize + serde::de::DeserializeOwned {
    /// What identifies one record.
    type Id: ?Sized;
    /// What a decision sees: the content, loaded and checked.
    type View;
    /// What a decision asks to write.
    type Next;
    /// Schema version this build writes (`"v"`).
    const VERSION: u32;
    /// The record's name in error messages, e.g. `pool record`.
    const WHAT: &'static str;
    /// The record's key.
    fn key(id: &Self::Id) -> String;
    /// Its creation guard counter's key.
    fn guard_key(id: &Self::Id) -> String;
    /// `what` in a 503 `Contention` message.
    fn describe(id: &Self::Id) -> String;
    /// What a decision sees (`None` for a tombstone); `envelope` is the
    /// stored record's.
    ///
    /// # Errors
    /// 500 when the stored content does not load.
    fn view(&self, id: &Self::Id, envelope: &Envelope) -> Result<Option<Self::View>>;
    /// The content that replaces the current one.
    fn build(next: &Self::Next) -> Self;
    /// A record in a format an earlier build wrote, read into the envelope
    /// (`None` when `bytes` are not one: the default, for records that
    /// never had another format). Writes always write the envelope, so the
    /// next write of a record migrates it.
    fn legacy(_bytes: &[u8]) -> Option<Result<Enveloped<Self>>> {
        None
    }
}

impl<S: StateRecord> Content for S {
    type Id = <S as StateRecord>::Id;
    type View = S;
    type Next = S;
    const VERSION: u32 = <S as StateRecord>::VERSION;
    const WHAT: &'static str = <S as StateRecord>::WHAT;
    fn key(id: &Self::Id) -> String {
        <S as StateRecord>::key(id)
    }
    fn guard_key(id: &Self::Id) -> String {
        <S as StateRecord>::guard_key(id)
    }
    fn describe(id: &Self::Id) -> String {
        <S as StateRecord>::describe(id)
    }
    fn view(&self, _: &Self::Id, _: &Envelope) -> Result<Option<S>> {
        Ok(Some(self.clone()))
    }
    fn build(next: &S) -> Self {
        next.clone()
    }
}

impl<S: Content> CasRecord for Enveloped<S> {
    type Id = S::Id;
    type View = S::View;
    type Next = S::Next;

    fn key(id: &S::Id) -> String {
        S::key(id)
    }
    fn guard_key(id: &S::Id) -> String {
        S::guard_key(id)
    }
    fn describe(id: &S::Id) -> String {
        S::describe(id)
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        let rec: Enveloped<S> = match serde_json::from_slice(bytes) {
            Ok(rec) => rec,
            Err(e) => {
                return S::legacy(bytes).unwrap_or_else(|| {
                    Err(Error::unreadable(format!("unreadable {}: {e}", S::WHAT)))
                })
            }
        };
        if rec.v != S::VERSION {
            return Err(Error::unreadable(format!(
                "{} has schema version {}, this build reads {}",
                S::WHAT,
                rec.v,
                S::VERSION
            )));
        }
        Ok(rec)
    }
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
    fn envelope(&self) -> Envelope {
        Envelope {
            rev: self.rev,
            writer: self.writer.clone(),
            recent_writers: self.recent_writers.clone(),
            swap_check: self.swap_check,
        }
    }
    fn view(&self, id: &S::Id) -> Result<Option<S::View>> {
        self.state.view(id, &self.envelope())
    }
    fn build(next: &S::Next, e: Envelope) -> Self {
        Enveloped::wrap(S::build(next), e)
    }
}

impl<S: Content> Enveloped<S> {
    /// `state` in the envelope `e`, at this build's version.
    pub fn wrap(state: S, e: Envelope) -> Self {
        Enveloped {
            v: S::VERSION,
            rev: e.rev,
            writer: e.writer,
            recent_writers: e.recent_writers,
            swap_check: e.swap_check,
            state,
        }
    }
}

/// Everything a step needs: the store, the environment and the swap policy.
pub struct Ctx<'a, K: KvStore> {
    /// The key-value store.
    pub kv: &'a K,
    /// Time, randomness, waiting.
    pub env: &'a dyn Env,
    /// The `kv_swap_check` policy.
    pub swap_policy: SwapPolicy,
}

impl<'a, K: KvStore> Ctx<'a, K> {
    /// The store and environment with [`SwapPolicy::Auto`] (swaps checked
    /// as the backend needs: what every component and test uses unless
    /// `kv_swap_check` says otherwise).
    pub fn auto(kv: &'a K, env: &'a dyn Env) -> Self {
        Ctx {
            kv,
            env,
            swap_policy: SwapPolicy::Auto,
        }
    }
}

enum Base {
    Absent,
    Placeholder(SwapCheck),
    Record {
        rev: u64,
        swap_check: SwapCheck,
        writers: Vec<String>,
    },
}

/// Reads a record's content without starting a swap (one `get`): `None`
/// when absent, still the creation placeholder, or a tombstone.
///
/// # Errors
/// Store failures (503) and unreadable records (500).
pub fn read_record<K: KvStore, R: CasRecord>(kv: &K, id: &R::Id) -> Result<Option<R::View>> {
    match kv.get(&R::key(id))? {
        None => Ok(None),
        Some(b) if kv::is_zero_counter(&b) => Ok(None),
        Some(b) => R::decode(&b)?.view(id),
    }
}

/// One read-modify-write of a record, retried on conflict.
///
/// `decide` sees the current content (`None` if absent or a tombstone) and
/// returns [`Decision::Done`] (nothing to write) or [`Decision::Write`]. It runs
/// after the record has been read for this attempt and before the swap, so
/// anything it reads from the store is at least as recent as the record it
/// sees. It may be called several times (once per attempt); it may read but
/// must not write.
///
/// # Guarantees
/// When this returns `Ok` after a `Write`, the written record is the
/// current record as of the swap: no concurrent writer's change was lost.
/// An absent key is brought into existence only by the creation guard's
/// winner, or after that winner crashed by a loser once the stall is
/// [`GUARD_STALL_S`] old (rule 1 of the module docs), so no swap ever runs
/// on an absent key, and a crash between the guard and the key never
/// wedges the record.
///
/// # Errors
/// Whatever `decide` returns; 503 `Contention` after
/// [`MAX_CAS_ATTEMPTS`]; store failures.
pub fn update_record<K: KvStore, R: CasRecord, T>(
    ctx: &Ctx<'_, K>,
    id: &R::Id,
    mut decide: impl FnMut(Option<&R::View>) -> Result<Decision<T, R::Next>>,
) -> Result<T> {
    let key = R::key(id);
    let mut guard = Guard::default();
    for attempt in 0..MAX_CAS_ATTEMPTS {
        if attempt > 0 {
            ctx.env.pause(attempt);
        }
        let (cas, current) = ctx.kv.cas_read(&key)?;
        let (base, view) = read_base::<R>(current.as_deref(), id)?;
        let (next, out) = match decide(view.as_ref())? {
            Decision::Done(out) => return Ok(out),
            Decision::Write(next, out) => (next, out),
        };
        let (rev, check, writers) = match base {
            Base::Absent => {
                guard.bring_into_existence::<K, R>(ctx, id, &key)?;
                continue;
            }
            Base::Placeholder(check) => (1, check, Vec::new()),
            Base::Record {
                rev,
                swap_check,
                writers,
            } => (rev + 1, swap_check, writers),
        };
        let check = match ctx.swap_policy {
            SwapPolicy::Always => SwapCheck::Verify,
            SwapPolicy::Auto => check,
        };
        let writer = ctx.env.token();
        let record = R::build(
            &next,
            Envelope {
                rev,
                writer: writer.clone(),
                recent_writers: writers,
                swap_check: check,
            },
        );
        let reported = ctx.kv.cas_swap(cas, &record.encode())?;
        let written = match (check, reported) {
            (SwapCheck::Exact, Swap::Reported) => true,
            (SwapCheck::Exact, Swap::Failed) => false,
            // A store whose answer cannot be trusted either way: Redis may
            // report an aborted swap as success, and Spin 3.6's Redis
            // backend reports every swap as failed (its `UNWATCH <key>` is
            // refused after the EXEC). The read-back decides.
            (SwapCheck::Verify, _) => landed::<R>(ctx.kv.get(&key)?.as_deref(), &writer)?,
        };
        if written {
            return Ok(out);
        }
        ctx.kv.note_conflict();
    }
    Err(Error::transient(
        "Contention",
        format!(
            "{} is being changed by too many requests at once; retry",
            R::describe(id)
        ),
    ))
}

/// Replaces a record whose stored bytes do not load (cut short, corrupt:
/// `UnreadableRecord`) with the record `build` makes: the repair path,
/// when every ordinary read-modify-write of the record fails. One
/// `cas_read`; if the bytes still do not load, `build` decides and its
/// record is swapped in over them, at revision 1 with no recent writers
/// (the lost ones are unknown) and `swap_check` (the store's kind, e.g.
/// another record's: the lost record's is unknown), read back when that
/// says so. A concurrent writer read the bad bytes too and could only
/// fail; a concurrent repair is ordered by the swap. Returns `None`, with
/// nothing written, when the record is absent or loads by the time it is
/// read (someone repaired it): the caller goes the ordinary way.
///
/// # Errors
/// `build`'s; 503 `Contention` after [`MAX_CAS_ATTEMPTS`]; store failures;
/// errors other than `UnreadableRecord` of the stored record.
pub fn replace_unreadable<K: KvStore, R: CasRecord, T>(
    ctx: &Ctx<'_, K>,
    id: &R::Id,
    swap_check: SwapCheck,
    mut build: impl FnMut() -> Result<(R::Next, T)>,
) -> Result<Option<T>> {
    let key = R::key(id);
    for attempt in 0..MAX_CAS_ATTEMPTS {
        if attempt > 0 {
            ctx.env.pause(attempt);
        }
        let (cas, current) = ctx.kv.cas_read(&key)?;
        let Some(bytes) = current.filter(|b| !kv::is_zero_counter(b)) else {
            return Ok(None);
        };
        match R::decode(&bytes).and_then(|r| r.view(id).map(|_| ())) {
            Ok(()) => return Ok(None),
            Err(e) if e.is(crate::error::Known::UnreadableRecord) => {}
            Err(e) => return Err(e),
        }
        let (next, out) = build()?;
        let writer = ctx.env.token();
        let check = match ctx.swap_policy {
            SwapPolicy::Always => SwapCheck::Verify,
            SwapPolicy::Auto => swap_check,
        };
        let record = R::build(
            &next,
            Envelope {
                rev: 1,
                writer: writer.clone(),
                recent_writers: Vec::new(),
                swap_check: check,
            },
        );
        let reported = ctx.kv.cas_swap(cas, &record.encode())?;
        let written = match (check, reported) {
            (SwapCheck::Exact, Swap::Reported) => true,
            (SwapCheck::Exact, Swap::Failed) => false,
            (SwapCheck::Verify, _) => landed::<R>(ctx.kv.get(&key)?.as_deref(), &writer)?,
        };
        if written {
            return Ok(Some(out));
        }
        ctx.kv.note_conflict();
    }
    Err(Error::transient(
        "Contention",
        format!(
            "{} is being changed by too many requests at once; retry",
            R::describe(id)
        ),
    ))
}

/// What an attempt read: the base its write builds on, and the content a
/// decision sees (`None` when absent, the creation placeholder, or a
/// tombstone).
fn read_base<R: CasRecord>(current: Option<&[u8]>, id: &R::Id) -> Result<(Base, Option<R::View>)> {
    Ok(match current {
        None => (Base::Absent, None),
        Some(b) if kv::is_zero_counter(b) => {
            let check = if b.len() == 8 {
                SwapCheck::Exact
            } else {
                SwapCheck::Verify
            };
            (Base::Placeholder(check), None)
        }
        Some(b) => {
            let rec = R::decode(b)?;
            let view = rec.view(id)?;
            let e = rec.envelope();
            (
                Base::Record {
                    rev: e.rev,
                    swap_check: e.swap_check,
                    writers: writers_after(&e.writer, &e.recent_writers),
                },
                view,
            )
        }
    })
}

/// Whether this request asked for a record's creation guard, and won it
/// (rule 1).
#[derive(Default)]
struct Guard {
    asked: bool,
    won: bool,
}

impl Guard {
    /// For a write that found the key absent: asks for the creation guard
    /// once per request; the winner makes the key (the zero counter the
    /// next attempt swaps), a loser notes the stall or takes a crashed
    /// winner's creation over ([`take_over_creation`]).
    fn bring_into_existence<K: KvStore, R: CasRecord>(
        &mut self,
        ctx: &Ctx<'_, K>,
        id: &R::Id,
        key: &str,
    ) -> Result<()> {
        if !self.asked {
            self.asked = true;
            self.won = ctx.kv.increment(&R::guard_key(id), 1)? == 1;
            if !self.won {
                // Once per request: note the stall, or take the creation
                // over from a winner that crashed.
                take_over_creation(ctx, key)?;
            }
        }
        if self.won {
            ctx.kv.increment(key, 0)?;
        }
        Ok(())
    }
}

/// Whether a read-back shows the write of `writer`: the record it wrote, or
/// a newer one that still lists it among its recent writers. Anything else
/// means the swap was silently aborted (Redis) and nothing was written.
fn landed<R: CasRecord>(read: Option<&[u8]>, writer: &str) -> Result<bool> {
    match read {
        Some(b) if !kv::is_zero_counter(b) => {
            let e = R::decode(b)?.envelope();
            Ok(written_by(&e.writer, &e.recent_writers, writer))
        }
        _ => Ok(false),
    }
}

/// How long a record's creation may stall between its guard and its key
/// before a loser takes it over, in seconds. The guard's winner makes the
/// key with its very next store operation, so a key still absent a minute
/// after a loser first saw it means the winner crashed between the two.
pub const GUARD_STALL_S: u64 = 60;

/// For a request that lost the creation guard and found the key absent:
/// records when the stall was first seen (`guard-stall/<key>`), or, once
/// that is [`GUARD_STALL_S`] old and a read finds the key still absent,
/// makes the zero counter itself and forgets the stall. Without this, a
/// winner that crashed between its two increments would wedge the record:
/// every later request loses the guard too.
///
/// Why a minute: a loser's `increment` of the key could meet a record that
/// a winner which was only stalled swapped in meanwhile, which Spin's
/// SQLite host answers with a panic while holding the store's lock (every
/// later store operation of that process then fails). A winner would have
/// to stall a minute between two consecutive store operations and wake in
/// the moment between this read and this increment; on Redis the same
/// meeting is an error that changes nothing.
fn take_over_creation<K: KvStore>(ctx: &Ctx<'_, K>, key: &str) -> Result<()> {
    let stall = keys::guard_stall(key);
    let now = ctx.env.now();
    let since = ctx
        .kv
        .get(&stall)?
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match since {
        None => ctx.kv.set(&stall, now.to_string().as_bytes())?,
        Some(at) if now >= at.saturating_add(GUARD_STALL_S) => {
            if ctx.kv.get(key)?.is_none() {
                ctx.kv.increment(key, 0)?;
            }
            ctx.kv.delete(&stall)?;
        }
        Some(_) => {}
    }
    Ok(())
}

/// Forgets a record, its creation guard and any noted stall (for records
/// that are deleted rather than tombstoned, e.g. a deleted device's network
/// record): the next creation starts afresh.
///
/// # Errors
/// Store errors.
pub fn forget_record<K: KvStore, R: CasRecord>(kv: &K, id: &R::Id) -> Result<()> {
    let key = R::key(id);
    kv.delete(&key)?;
    kv.delete(&R::guard_key(id))?;
    kv.delete(&keys::guard_stall(&key))?;
    Ok(())
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    //! [`update_record`] on a record type that is not a pool: the protocol
    //! is generic (Metal and port state will use it), so it is checked on a
    //! minimal record too, on every backend's semantics. The pool instance
    //! is checked far more thoroughly by `tests/protocol.rs` and the
    //! interleaving checker.
    use super::*;
    use crate::testing::{Backend, MemKv, TestEnv};
    use serde::{Deserialize, Serialize};

    /// A counter under the protocol: `n` is the content, `None` a tombstone.
    #[derive(Debug, Serialize, Deserialize)]
    struct Counter {
        rev: u64,
        writer: String,
        recent: Vec<String>,
        check: SwapCheck,
        n: Option<u64>,
    }

    impl CasRecord for Counter {
        type Id = str;
        type View = u64;
        type Next = Option<u64>;
        fn key(id: &str) -> String {
            format!("counter/{id}")
        }
        fn guard_key(id: &str) -> String {
            format!("counter-init/{id}")
        }
        fn describe(id: &str) -> String {
            format!("counter {id}")
        }
        fn decode(bytes: &[u8]) -> Result<Self> {
            serde_json::from_slice(bytes).map_err(|e| Error::internal(e.to_string()))
        }
        fn encode(&self) -> Vec<u8> {
            serde_json::to_vec(self).unwrap_or_default()
        }
        fn envelope(&self) -> Envelope {
            Envelope {
                rev: self.rev,
                writer: self.writer.clone(),
                recent_writers: self.recent.clone(),
                swap_check: self.check,
            }
        }
        fn view(&self, _: &str) -> Result<Option<u64>> {
            Ok(self.n)
        }
        fn build(next: &Option<u64>, e: Envelope) -> Self {
            Counter {
                rev: e.rev,
                writer: e.writer,
                recent: e.recent_writers,
                check: e.swap_check,
                n: *next,
            }
        }
    }

    fn add(ctx: &Ctx<'_, MemKv>, id: &str, by: u64) -> u64 {
        update_record::<_, Counter, _>(ctx, id, |seen| {
            let n = seen.copied().unwrap_or(0) + by;
            Ok(Decision::Write(Box::new(Some(n)), n))
        })
        .expect("update")
    }

    #[test]
    fn a_guard_winner_that_crashed_before_making_the_key_does_not_wedge_the_record() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = Ctx::auto(&kv, &env);
            // The winner took the guard and crashed before its next step:
            // a request notes the stall (and answers 503), and one a minute
            // later takes the creation over.
            assert_eq!(kv.increment("counter-init/a", 1).unwrap(), 1);
            let stalled = update_record::<_, Counter, _>(&ctx, "a", |_| {
                Ok(Decision::Write(Box::new(Some(4)), ()))
            })
            .unwrap_err();
            assert_eq!(stalled.reason(), "Contention", "{backend:?}");
            env.set_now(1_000 + GUARD_STALL_S - 1);
            assert!(update_record::<_, Counter, _>(&ctx, "a", |_| {
                Ok(Decision::Write(Box::new(Some(4)), ()))
            })
            .is_err());
            env.set_now(1_000 + GUARD_STALL_S);
            assert_eq!(add(&ctx, "a", 4), 4, "{backend:?}");
            assert_eq!(add(&ctx, "a", 1), 5, "{backend:?}");
            // Nothing left of the stall; the key was made once.
            assert_eq!(kv.get(&keys::guard_stall("counter/a")).unwrap(), None);
            assert_eq!(kv.increment_panics(), 0);
        }
    }

    #[test]
    fn a_record_of_another_type_is_created_once_and_updated_exactly_once_per_call() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = Ctx::auto(&kv, &env);
            assert_eq!(add(&ctx, "a", 1), 1, "{backend:?}");
            assert_eq!(add(&ctx, "a", 2), 3, "{backend:?}");
            assert_eq!(add(&ctx, "b", 5), 5, "{backend:?}");
            let stored = Counter::decode(&kv.get("counter/a").unwrap().unwrap()).unwrap();
            assert_eq!((stored.n, stored.rev), (Some(3), 2), "{backend:?}");
            assert_eq!(stored.recent.len(), 1, "the first writer is remembered");
            let expected = if backend == Backend::SpinSqlite {
                SwapCheck::Exact
            } else {
                SwapCheck::Verify
            };
            assert_eq!(stored.check, expected, "{backend:?}");
            // The guard was won once per key.
            assert_eq!(kv.increment("counter-init/a", 0).unwrap(), 1, "{backend:?}");
            // A decision that writes nothing leaves the record as it is.
            let seen =
                update_record::<_, Counter, _>(&ctx, "a", |seen| Ok(Decision::Done(seen.copied())))
                    .unwrap();
            assert_eq!(seen, Some(3));
            let again = Counter::decode(&kv.get("counter/a").unwrap().unwrap()).unwrap();
            assert_eq!(again.rev, 2, "{backend:?}");
        }
    }
}
