//! The steps behind each route, generic over the key-value port.
//!
//! Each step is one short, idempotent sequence of key-value operations
//! (counts in `kv-schema/README.md`). Function crates parse the request,
//! call one step through [`crate::http::api`] and render the result.
//!
//! A file per concept: `allocation` (bind an address to a claim),
//! `release`, `registration` (a pool's spec in, its views, its removal),
//! `recovery` (a pool record that does not load, rebuilt) and `lookup`
//! (find and list pools, decode records). Their items are all here; what
//! they share (reading a pool's claim keys, the write deadline, the
//! follow-up write and the flush a decision owes) is this file's.

mod allocation;
mod lookup;
mod recovery;
mod registration;
mod release;

pub use allocation::*;
pub use lookup::*;
pub use registration::*;
pub use release::*;

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::ipam::alloc::{
    Intent, KeySeen, PoolState, TAKEOVER_AFTER_SECONDS, WRITE_DEADLINE_SECONDS,
};
use crate::ipam::holders::{self, Flush};
use crate::ipam::store::{ClaimRecord, Loaded};
use crate::kv::{keys, Ctx};
use crate::ports::kv::KvStore;

/// Splits `namespace/name`.
fn claim_key_of(claim: &str) -> Option<String> {
    let (ns, name) = claim.split_once('/')?;
    Some(keys::claim(ns, name))
}

/// What [`read_claims`] saw: the claim's binding, and what each intent's
/// claim key held (its token and cluster; `None` when absent), by
/// `namespace/name`.
type Seen = (Option<ClaimRecord>, BTreeMap<String, Option<KeySeen>>);

/// Reads the claim key `ckey` and the claim keys of every intent in the
/// pool `l`: returns the claim's binding (if any) and what each intent's
/// key holds (for [`PoolState::confirm`]). One `get_many` on Spin's SQLite
/// store; one `get` per key elsewhere (Spin 3.6's Redis `get_many` is
/// broken).
///
/// Called after the pool record was read, so what it sees is at least as
/// recent as that record.
fn read_claims<K: KvStore>(kv: &K, l: &Loaded, cname: &str, ckey: &str) -> Result<Seen> {
    let state = &l.state;
    let mut names: Vec<String> = vec![cname.to_string()];
    for i in &state.intents {
        if !names.contains(&i.claim) {
            names.push(i.claim.clone());
        }
    }
    let keys_read: Vec<String> = names
        .iter()
        .map(|n| {
            if n == cname {
                ckey.to_string()
            } else {
                claim_key_of(n).unwrap_or_default()
            }
        })
        .collect();
    let values = if l.exact {
        kv.get_many(&keys_read)?
    } else {
        keys_read
            .iter()
            .map(|k| kv.get(k))
            .collect::<std::result::Result<Vec<_>, _>>()?
    };
    let mut mine = None;
    let mut seen = BTreeMap::new();
    for (name, value) in names.into_iter().zip(values) {
        let record = value.map(|b| ClaimRecord::decode(&b)).transpose()?;
        if name == cname {
            mine = record.clone();
        }
        seen.insert(
            name,
            record.map(|r| KeySeen {
                token: r.token,
                cluster: r.cluster_name,
            }),
        );
    }
    Ok((mine, seen))
}

/// Fails with 503 when this request's intent is older than the write
/// deadline: it must not write the claim key any more (another request may
/// take the intent over after [`TAKEOVER_AFTER_SECONDS`]); its retry finds
/// the intent.
fn within_deadline<K: KvStore>(ctx: &Ctx<'_, K>, taken_at: u64) -> Result<()> {
    if ctx.env.now().saturating_sub(taken_at) > WRITE_DEADLINE_SECONDS {
        return Err(Error::transient(
            "StepTooSlow",
            "this request took too long between its pool write and its claim write; retry",
        ));
    }
    Ok(())
}

/// Whether `intent` may be taken over at `now`.
fn stale(intent: &Intent, now: u64) -> bool {
    now.saturating_sub(intent.at) >= TAKEOVER_AFTER_SECONDS
}

/// A claim-key write that a successful pool write obliges this request to
/// perform (see [`crate::ipam::alloc::Intent`]).
#[derive(Debug)]
enum FollowUp {
    /// Nothing to write.
    None,
    /// Write this binding.
    Set(Box<ClaimRecord>),
    /// Remove the binding.
    Delete,
}

/// The flush a decision on pool `l` that writes `state` owes (see
/// [`holders`]): when it leaves `at` ([`FLUSH_AT`]) or more confirmed
/// bindings in `recent`, with whether the pool is indexed.
fn flush_of(l: &Loaded, state: &PoolState, at: usize) -> Option<(Flush, bool)> {
    Flush::owed(l, state, l.rev + 1, at).map(|f| (f, state.holders.indexed))
}

/// Performs the flush a request owes, after its own claim write. Its
/// failure is not the request's: the entries stay in `recent` and the
/// next request past [`FLUSH_AT`] flushes them.
fn pay<K: KvStore>(ctx: &Ctx<'_, K>, owed: Option<(Flush, bool)>) {
    if let Some((f, indexed)) = owed {
        let _ = holders::flush_owed(ctx, &f, indexed);
    }
}
