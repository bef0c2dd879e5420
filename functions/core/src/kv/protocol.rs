//! The compare-and-swap protocol of a pool record, and the key layout it relies on.
//!
//! The full description, with the invariants and the reasoning about each
//! backend's quirks, is `kv-schema/README.md`; this module is its code.
//!
//! # Keys
//! | Key | Value | Written by |
//! |---|---|---|
//! | `pool/ns/<namespace>/<name>` | [`PoolRecord`] (or, for an instant while a pool is first created, a zero counter) | pools, allocate, release |
//! | `pool/global/<name>` | [`PoolRecord`] | pools, allocate, release |
//! | `pool-init/ns/<namespace>/<name>`, `pool-init/global/<name>` | counter (creation guard) | pools |
//! | `claim/<namespace>/<name>` | [`crate::kv::ClaimRecord`] | the owner of the pool's intent for it: allocate (set), release (delete) |
//!
//! # Protocol
//! Every change to a pool — registration, update, deletion, allocation,
//! release — is one read-modify-write of its record with
//! [`KvStore::cas_read`] / [`KvStore::cas_swap`], retried on conflict. The
//! claim-key writes a decision owes are intents in the record
//! ([`crate::ipam::alloc::Intent`], [`crate::ipam::ops`]). Two rules make the swap
//! exact on Spin's real backends:
//! 1. **Never swap on an absent key** (Spin's SQLite backend upserts it, so
//!    two creators would both "win"). A pool key is first brought into
//!    existence with `increment(key, 0)` by the one request that won the
//!    creation guard counter; the swap then replaces that zero counter.
//!    Pool keys are never deleted afterwards (deletion leaves a tombstone
//!    record), so every later swap is on an existing key.
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
use crate::ipam::pool::PoolId;
use crate::kv::keys;
use crate::kv::records::{Loaded, Next, PoolRecord, SwapCheck};
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

/// What a read-modify-write callback decided.
#[derive(Debug)]
pub enum Step<T> {
    /// Nothing to write; return `T`.
    Done(T),
    /// Write `Next`, then return `T`.
    Write(Box<Next>, T),
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

enum Base {
    Absent,
    Placeholder(SwapCheck),
    Record {
        rev: u64,
        swap_check: SwapCheck,
        writers: Vec<String>,
    },
}

/// Reads a pool record without starting a swap (one `get`).
///
/// # Errors
/// Store failures (503) and unreadable records (500).
pub fn read_pool<K: KvStore>(kv: &K, id: &PoolId) -> Result<Option<Loaded>> {
    match kv.get(&keys::pool(id))? {
        None => Ok(None),
        Some(b) if kv::is_zero_counter(&b) => Ok(None),
        Some(b) => PoolRecord::decode(&b)?.load(id),
    }
}

/// One read-modify-write of a pool record, retried on conflict.
///
/// `decide` sees the current pool (`None` if absent or deleted) and returns
/// [`Step::Done`] (nothing to write) or [`Step::Write`]. It runs after the
/// pool has been read for this attempt and before the swap, so anything it
/// reads from the store is at least as recent as the pool it sees. It may be
/// called several times (once per attempt); it may read but must not write.
///
/// # Guarantees
/// When this returns `Ok` after a `Write`, the written record is the pool's
/// current record as of the swap: no concurrent writer's change was lost.
///
/// # Errors
/// Whatever `decide` returns; 503 `Contention` after
/// [`MAX_CAS_ATTEMPTS`]; store failures.
pub fn update_pool<K: KvStore, T>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    mut decide: impl FnMut(Option<&Loaded>) -> Result<Step<T>>,
) -> Result<T> {
    let key = keys::pool(id);
    for attempt in 0..MAX_CAS_ATTEMPTS {
        if attempt > 0 {
            ctx.env.pause(attempt);
        }
        let (cas, current) = ctx.kv.cas_read(&key)?;
        let (base, loaded) = match current.as_deref() {
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
                let rec = PoolRecord::decode(b)?;
                let loaded = rec.load(id)?;
                (
                    Base::Record {
                        rev: rec.rev,
                        swap_check: rec.swap_check,
                        writers: rec.writers_after(),
                    },
                    loaded,
                )
            }
        };
        let (next, out) = match decide(loaded.as_ref())? {
            Step::Done(out) => return Ok(out),
            Step::Write(next, out) => (next, out),
        };
        let (rev, check, writers) = match base {
            Base::Absent => {
                ensure_pool_key(ctx, id, &key)?;
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
        let writer = format!("{:016x}", ctx.env.random_u64());
        let mut record = PoolRecord::build(&next, rev, writer.clone(), check);
        record.recent_writers = writers;
        let bytes = record.encode();
        let reported = ctx.kv.cas_swap(cas, &bytes)?;
        let written = match (check, reported) {
            (SwapCheck::Exact, Swap::Reported) => true,
            (SwapCheck::Exact, Swap::Failed) => false,
            // A store whose answer cannot be trusted either way: Redis may
            // report an aborted swap as success, and Spin 3.6's Redis
            // backend reports every swap as failed (its `UNWATCH <key>` is
            // refused after the EXEC). The read-back decides.
            (SwapCheck::Verify, _) => landed(ctx.kv.get(&key)?.as_deref(), &writer)?,
        };
        if written {
            return Ok(out);
        }
    }
    Err(Error::transient(
        "Contention",
        format!(
            "pool {} is being changed by too many requests at once; retry",
            id.display()
        ),
    ))
}

/// Whether a read-back shows the write of `writer`: the record it wrote, or
/// a newer one that still lists it among its recent writers. Anything else
/// means the swap was silently aborted (Redis) and nothing was written.
fn landed(read: Option<&[u8]>, writer: &str) -> Result<bool> {
    match read {
        Some(b) if !kv::is_zero_counter(b) => Ok(PoolRecord::decode(b)?.written_by(writer)),
        _ => Ok(false),
    }
}

/// Brings an absent pool key into existence as a zero counter, so the
/// following swap is on an existing key.
///
/// Only the winner of the creation guard (the request whose
/// `increment(pool-init-key, 1)` returned 1) ever increments the pool key:
/// a later `increment` could meet a record that the winner has swapped in
/// meanwhile, which Spin's SQLite host answers with a panic. A loser
/// returns and its caller re-reads after a pause, until the winner's key
/// shows up (or answers 503 `Contention` after [`MAX_CAS_ATTEMPTS`]).
fn ensure_pool_key<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId, key: &str) -> Result<()> {
    if ctx.kv.increment(&keys::pool_init(id), 1)? != 1 {
        return Ok(());
    }
    ctx.kv.increment(key, 0)?;
    Ok(())
}
