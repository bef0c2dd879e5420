//! The steps behind each route, generic over the key-value port.
//!
//! Each step is one short, idempotent sequence of key-value operations
//! (counts in `kv-schema/README.md`). Function crates parse the request,
//! call one step through [`crate::http::api`] and render the result.

use serde_json::{json, Value};

use std::collections::BTreeMap;

use crate::error::Known;
use crate::error::{Error, Result};
use crate::ipam::alloc::{
    write_stamp, AllocRequest, Counts, Intent, IntentKind, KeySeen, PoolState, FLUSH_AT,
    MAX_INTENTS, TAKEOVER_AFTER_SECONDS, WRITE_DEADLINE_SECONDS,
};
use crate::ipam::claim::Claim;
use crate::ipam::holders::{self, Flush};
use crate::ipam::index::{self, Held};
use crate::ipam::pool::{PoolId, PoolKind, PoolObject, ValidatedPool};
use crate::ipam::store::{self, ClaimRecord, Loaded, Next, PoolRecord};
use crate::kv::{keys, Ctx, Step};
use crate::ports::kv::KvStore;

/// Result of [`allocate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// The binding (stored under `claim/<ns>/<name>`).
    pub record: ClaimRecord,
    /// `true` if the address was bound by this call, `false` if the claim
    /// already had it.
    pub created: bool,
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

/// What the binding path decided: the follow-up write, the answer, and
/// when this request took the intent it now owes (for the deadline).
type BindOutcome = (FollowUp, Allocated, u64);

/// What a bind asks for.
#[derive(Debug, Clone, Copy)]
enum BindTarget {
    /// The lowest free address (or the requested or pre-allocated one).
    Allocate,
    /// Exactly this address, as the claim's `IPAddress` says.
    Adopt(std::net::IpAddr),
}

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

/// Binds an address to `claim` and stores the binding.
///
/// Operations (no contention): `cas_read` of the pool record, one
/// `get_many` of the claim key and the keys of the pool's pending intents,
/// `cas_swap` of the pool record (+ one read-back `get` when the backend's
/// swaps are not exact), `set` of the claim key: four on Spin's SQLite
/// store, five elsewhere. A claim that is already bound costs two.
///
/// # Idempotency
/// The same claim (namespace, name, uid) gets the same address whether it
/// is posted again later, concurrently, or after a crash between the pool
/// write and the claim write (the pool's `Bind` intent stays until the
/// binding is seen): there is no time or size window.
///
/// # Errors
/// - 404 `PoolNotFound` if the pool is not registered;
/// - 409 `PoolExhausted`, `AddressInUse`, `AddressNotInPool`,
///   `AddressReserved`, `PreAllocationMismatch` (see [`crate::ipam::alloc::PoolError`]);
/// - 409 `ClaimUidConflict` if the name is bound (or being bound) for
///   another uid (release it first), `ClaimPoolConflict` if bound in
///   another pool;
/// - 503 `ClaimReleasing` while a release of the same claim is being
///   written, `StepTooSlow`, `Contention`, or a store failure: retry.
pub fn allocate<K: KvStore>(ctx: &Ctx<'_, K>, claim: &Claim) -> Result<Allocated> {
    allocate_counting(ctx, claim, None).map(|(a, _)| a)
}

/// [`allocate`], whose request flushes the pool's confirmed bindings to
/// their holder pages when its decision leaves at least `flush_at` of them
/// ([`allocate`] uses [`FLUSH_AT`]). For tests and tools that want the
/// flush at once (the interleaving checker races it with everything
/// else).
///
/// # Errors
/// As [`allocate`].
pub fn allocate_flushing_at<K: KvStore>(
    ctx: &Ctx<'_, K>,
    claim: &Claim,
    flush_at: usize,
) -> Result<Allocated> {
    allocate_with(ctx, claim, None, flush_at).map(|(a, _)| a)
}

/// [`allocate`], counting the request as `count_as` (its request
/// signature, `observe::counters`) in the pool record's own write when it
/// binds a new address: the count costs no operation. Returns whether it
/// was counted there (only a new binding is; an answer from an existing
/// binding writes nothing and is not).
///
/// # Errors
/// As [`allocate`].
pub fn allocate_counting<K: KvStore>(
    ctx: &Ctx<'_, K>,
    claim: &Claim,
    count_as: Option<&str>,
) -> Result<(Allocated, bool)> {
    allocate_with(ctx, claim, count_as, FLUSH_AT)
}

fn allocate_with<K: KvStore>(
    ctx: &Ctx<'_, K>,
    claim: &Claim,
    count_as: Option<&str>,
    flush_at: usize,
) -> Result<(Allocated, bool)> {
    match bind(ctx, claim, BindTarget::Allocate, None, count_as, flush_at)? {
        Bound::Done(a) => {
            let counted = count_as.is_some() && a.created;
            Ok((*a, counted))
        }
        Bound::NeedsGrant(_) => Err(Error::internal("an allocation asked for a grant")),
    }
}

/// Records that `claim` holds `address` because its `IPAddress` object says
/// so (the store lost the binding, or the cluster was moved): the same
/// protocol as [`allocate`], for a given address, which may lie outside the
/// current spec (then counted in `outOfRange`) or be cooling down.
///
/// # Idempotency
/// A binding that already says `address` is returned unchanged
/// (`created: false`).
///
/// # Errors
/// 409 `AddressMismatch` when the store binds (or is binding) the claim to
/// another address; 409 `ClaimUidConflict`/`ClaimPoolConflict` as
/// [`allocate`]; 409 `AddressNotInPool` for another family; 404
/// `PoolNotFound`; 503 as [`allocate`].
pub fn adopt<K: KvStore>(
    ctx: &Ctx<'_, K>,
    claim: &Claim,
    address: std::net::IpAddr,
) -> Result<Allocated> {
    match bind(ctx, claim, BindTarget::Adopt(address), None, None, FLUSH_AT)? {
        Bound::Done(a) => Ok(*a),
        Bound::NeedsGrant(held) => {
            // Outside the pool's spec: the pool index must grant the
            // address first (no other pool of the space may hold it).
            let grant = index::reserve(ctx, &claim.pool, &held)?;
            let out = bind(
                ctx,
                claim,
                BindTarget::Adopt(address),
                Some(&grant),
                None,
                FLUSH_AT,
            );
            let _ = index::settle(ctx, &claim.pool, Some(&grant.token));
            match out? {
                Bound::Done(a) => Ok(*a),
                Bound::NeedsGrant(_) => Err(Error::internal(
                    "an adoption asked for a second grant of the pool index",
                )),
            }
        }
    }
}

/// What [`bind`] came to.
enum Bound {
    /// Bound (or answered).
    Done(Box<Allocated>),
    /// An adoption outside the pool's allocatable set: the pool index must
    /// grant these addresses first.
    NeedsGrant(Held),
}

fn address_mismatch(claim: &Claim, bound: &str, address: std::net::IpAddr) -> Error {
    Error::conflict(
        "AddressMismatch",
        format!(
            "claim {} is bound to {bound} but its IPAddress says {address}",
            claim.id.display()
        ),
    )
}

fn bind<K: KvStore>(
    ctx: &Ctx<'_, K>,
    claim: &Claim,
    target: BindTarget,
    grant: Option<&index::Reservation>,
    count_as: Option<&str>,
    flush_at: usize,
) -> Result<Bound> {
    let ckey = keys::claim(&claim.id.namespace, &claim.id.name);
    let cname = claim.id.display();
    let me = ctx.env.token();
    let mut needs: Option<Held> = None;
    let mut owed: Option<(Flush, bool)> = None;
    let decided = store::update_pool(ctx, &claim.pool, |current| {
        needs = None;
        owed = None;
        let Some(l) = current else {
            // No pool: a binding left from it still answers (two reads).
            if let Some(record) = binding_of(ctx.kv, &ckey, claim)? {
                return Ok(Step::Done(Some((
                    FollowUp::None,
                    Allocated {
                        record,
                        created: false,
                    },
                    0,
                ))));
            }
            return Err(pool_not_found(claim));
        };
        if let BindTarget::Adopt(ip) = target {
            if let Some(v) = l.pool.value_of(ip) {
                if !l.pool.allocatable.contains(v) && !l.state.used.contains(v) {
                    match grant {
                        None => {
                            let held = Held {
                                family: l.pool.family,
                                set: l
                                    .pool
                                    .addresses_of(&crate::ip::RangeSet::from_ranges([(v, v)])),
                            };
                            needs = Some(held);
                            return Ok(Step::Done(None));
                        }
                        Some(g) => g.check(ctx.env.now())?,
                    }
                }
            }
        }
        Ok(
            match bind_decide(ctx, claim, target, l, (&cname, &ckey), &me, count_as)? {
                Step::Done(o) => Step::Done(Some(o)),
                Step::Write(next, o) => {
                    owed = flush_of(l, &next.state, flush_at);
                    Step::Write(next, Some(o))
                }
            },
        )
    })?;
    if let Some(held) = needs {
        return Ok(Bound::NeedsGrant(held));
    }
    let Some((follow, answer, taken_at)) = decided else {
        return Err(Error::internal("a bind decided nothing"));
    };
    if let FollowUp::Set(record) = &follow {
        within_deadline(ctx, taken_at)?;
        ctx.kv.set(&ckey, &record.encode())?;
    }
    pay(ctx, owed);
    Ok(Bound::Done(Box::new(answer)))
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

/// What one attempt of [`bind`] decides on: the claim, what it asks for,
/// the pool as read, and this request's token and clock.
struct BindCtx<'a> {
    claim: &'a Claim,
    target: BindTarget,
    l: &'a Loaded,
    cname: &'a str,
    me: &'a str,
    now: u64,
    /// The request's signature, counted in the write of a new binding.
    count_as: Option<&'a str>,
}

impl BindCtx<'_> {
    /// Writes `state` back with the pool as read, answering `out`.
    fn write(&self, state: PoolState, out: BindOutcome) -> Step<BindOutcome, Next> {
        Step::Write(
            Box::new(Next {
                pool: Some((self.l.object.clone(), self.l.pool.clone())),
                state,
            }),
            out,
        )
    }
}

/// The pure-ish decision of [`bind`] for one attempt (it reads the claim
/// keys, writes nothing): a live binding answers (1), else an intent about
/// the claim decides or is cleared (2), else a new binding (3).
fn bind_decide<K: KvStore>(
    ctx: &Ctx<'_, K>,
    claim: &Claim,
    target: BindTarget,
    l: &Loaded,
    (cname, ckey): (&str, &str),
    me: &str,
    count_as: Option<&str>,
) -> Result<Step<BindOutcome, Next>> {
    let b = BindCtx {
        claim,
        target,
        l,
        cname,
        me,
        now: ctx.env.now(),
        count_as,
    };
    let (mine, seen) = read_claims(ctx.kv, l, cname, ckey)?;
    let mut state = l.state.clone();
    // Intents seen done are dropped by whatever this decision writes (a
    // confirmed binding becomes a `recent` holder, stamped with that
    // write's revision).
    state.confirm(&seen, write_stamp(l.rev + 1));
    // 1. A live binding answers.
    if let Some(record) = mine
        .as_ref()
        .filter(|r| !state.is_unbinding(cname, &r.token))
    {
        return bind_live(&b, record).map(Step::Done);
    }
    // 2. An intent about this claim.
    if let Some(intent) = state.intent(cname).cloned() {
        if let Some(step) = bind_over_intent(&b, &mut state, &intent)? {
            return Ok(step);
        }
    }
    // 3. A new binding.
    bind_new(ctx, &b, state)
}

/// Step 1 of [`bind_decide`]: the claim's live binding is the answer.
/// Nothing of ours to write: confirmed intents wait for the next decision
/// that writes anyway (an answer costs two reads).
fn bind_live(b: &BindCtx<'_>, record: &ClaimRecord) -> Result<BindOutcome> {
    check_same_claim(record, b.claim)?;
    if let BindTarget::Adopt(ip) = b.target {
        if record.address != ip.to_string() {
            return Err(address_mismatch(b.claim, &record.address, ip));
        }
    }
    let out = Allocated {
        record: record.clone(),
        created: false,
    };
    Ok((FollowUp::None, out, 0))
}

/// Step 2 of [`bind_decide`]: an intent about this claim. Its own live
/// `Bind` answers (or is taken over once stale); another uid's or an
/// `Unbind` refuses while live; a stale one is cleared from `state` and
/// `None` lets a new binding be made.
fn bind_over_intent(
    b: &BindCtx<'_>,
    state: &mut PoolState,
    intent: &Intent,
) -> Result<Option<Step<BindOutcome, Next>>> {
    let (claim, l) = (b.claim, b.l);
    let old = stale(intent, b.now);
    match intent.kind {
        IntentKind::Bind if intent.uid == claim.id.uid => {
            if let BindTarget::Adopt(ip) = b.target {
                if l.pool.value_of(ip) != Some(intent.address) {
                    let bound = l.pool.ip(intent.address).to_string();
                    return Err(address_mismatch(claim, &bound, ip));
                }
            }
            let record = ClaimRecord::new(
                claim,
                l.pool.ip(intent.address),
                &l.pool,
                l.object.uid(),
                &intent.token,
            );
            let out = Allocated {
                record: record.clone(),
                created: false,
            };
            if !old {
                // Its owner is writing the binding: same answer, no write.
                return Ok(Some(Step::Done((FollowUp::None, out, 0))));
            }
            // Its owner gave up (crash or deadline): take it over.
            if let Some(i) = state.intents.iter_mut().find(|i| i.claim == b.cname) {
                i.owner = b.me.to_string();
                i.at = b.now;
            }
            let follow = FollowUp::Set(Box::new(record));
            Ok(Some(b.write(state.clone(), (follow, out, b.now))))
        }
        IntentKind::Bind => {
            if !old {
                return Err(Error::conflict(
                    "ClaimUidConflict",
                    format!(
                        "claim {} is being bound for uid {}; release it before re-creating the claim",
                        claim.id.display(),
                        intent.uid
                    ),
                ));
            }
            // Its owner gave up and its binding never appeared: that
            // allocation is over; free its address, then bind ours.
            state.take_intent(b.cname);
            state.release(intent.address, l.pool.grace_seconds, b.now);
            Ok(None)
        }
        IntentKind::Unbind => {
            if !old {
                return Err(Error::transient(
                    "ClaimReleasing",
                    format!(
                        "claim {} is being released; retry in a moment",
                        claim.id.display()
                    ),
                ));
            }
            // Its owner gave up: our binding replaces the one it was
            // removing (its address is already freed).
            state.take_intent(b.cname);
            Ok(None)
        }
    }
}

/// Step 3 of [`bind_decide`]: a new binding under a fresh `Bind` intent
/// owned by this request.
fn bind_new<K: KvStore>(
    ctx: &Ctx<'_, K>,
    b: &BindCtx<'_>,
    mut state: PoolState,
) -> Result<Step<BindOutcome, Next>> {
    let (claim, l) = (b.claim, b.l);
    if state.intents.len() >= MAX_INTENTS {
        return Err(Error::transient(
            "Contention",
            format!(
                "pool {} has {MAX_INTENTS} claim writes in flight; retry",
                claim.pool.display()
            ),
        ));
    }
    let (address, ip) = new_address(b, &mut state)?;
    if let Some(sig) = b.count_as {
        state.count(sig);
    }
    let tok = ctx.env.token();
    let record = ClaimRecord::new(claim, ip, &l.pool, l.object.uid(), &tok);
    state.intents.push(Intent {
        kind: IntentKind::Bind,
        claim: b.cname.to_string(),
        uid: claim.id.uid.clone(),
        address,
        token: tok,
        owner: b.me.to_string(),
        at: b.now,
    });
    let out = Allocated {
        record: record.clone(),
        created: true,
    };
    Ok(b.write(state, (FollowUp::Set(Box::new(record)), out, b.now)))
}

/// The address a new binding takes, marked used in `state`: the
/// allocator's choice (or the requested one), or the adopted one unless
/// another claim holds it.
fn new_address(b: &BindCtx<'_>, state: &mut PoolState) -> Result<(u128, std::net::IpAddr)> {
    let (claim, l) = (b.claim, b.l);
    match b.target {
        BindTarget::Allocate => {
            if let Some(len) = claim.requested_len.filter(|len| *len != l.pool.prefix) {
                return Err(Error::conflict(
                    "AddressNotInPool",
                    format!(
                        "the claim requests a /{len}, but pool {} hands out /{}",
                        claim.pool.display(),
                        l.pool.prefix
                    ),
                ));
            }
            let requested = match claim.requested {
                None => None,
                Some(ip) => Some(l.pool.value_of(ip).ok_or_else(|| other_family(ip, claim))?),
            };
            let req = AllocRequest {
                claim: b.cname,
                claim_name: &claim.id.name,
                uid: &claim.id.uid,
                requested,
            };
            let a = state
                .allocate(&l.pool, &req, b.now)
                .map_err(|e| e.into_error(&l.pool, &claim.pool.display()))?;
            Ok((a, l.pool.ip(a)))
        }
        BindTarget::Adopt(ip) => {
            let v = l.pool.value_of(ip).ok_or_else(|| other_family(ip, claim))?;
            if state.used.contains(v) && !state.is_cooling(v) {
                // Held by another claim's binding or intent: the store has
                // given it to someone else, and an address has one owner.
                return Err(Error::conflict(
                    "AddressInUse",
                    format!(
                        "{ip} in pool {} is held by another claim; claim {} cannot adopt it",
                        claim.pool.display(),
                        claim.id.display()
                    ),
                ));
            }
            state.adopt(v);
            Ok((v, ip))
        }
    }
}

/// The binding stored at `ckey`, if any, after checking it belongs to this
/// claim (same uid, same pool).
fn binding_of<K: KvStore>(kv: &K, ckey: &str, claim: &Claim) -> Result<Option<ClaimRecord>> {
    let Some(bytes) = kv.get(ckey)? else {
        return Ok(None);
    };
    let record = ClaimRecord::decode(&bytes)?;
    check_same_claim(&record, claim)?;
    Ok(Some(record))
}

fn pool_not_found(claim: &Claim) -> Error {
    Error::not_found(
        "PoolNotFound",
        format!(
            "{} {} is not registered",
            claim.pool.kind.kind_name(),
            claim.pool.display()
        ),
    )
}

fn other_family(ip: std::net::IpAddr, claim: &Claim) -> Error {
    let what = if claim.pool.kind.is_prefix() {
        "is not the network address of a sub-prefix of"
    } else {
        "is not of the family of"
    };
    Error::conflict(
        "AddressNotInPool",
        format!("{ip} {what} pool {}", claim.pool.display()),
    )
}

fn check_same_claim(record: &ClaimRecord, claim: &Claim) -> Result<()> {
    if record.uid != claim.id.uid {
        return Err(Error::conflict(
            "ClaimUidConflict",
            format!(
                "claim {} is bound to {} for uid {}; release it before re-creating the claim",
                claim.id.display(),
                record.address,
                record.uid
            ),
        ));
    }
    if record.pool_ref.to_pool_ref() != claim.pool_ref {
        return Err(Error::conflict(
            "ClaimPoolConflict",
            format!(
                "claim {} is bound to {} in pool {}; a claim's pool cannot change",
                claim.id.display(),
                record.address,
                record.pool_ref.name
            ),
        ));
    }
    Ok(())
}

/// The binding of claim `namespace/name`, if any (one `get`).
///
/// # Errors
/// Store failures (503), unreadable record (500).
pub fn get_claim<K: KvStore>(kv: &K, namespace: &str, name: &str) -> Result<Option<ClaimRecord>> {
    kv.get(&keys::claim(namespace, name))?
        .map(|b| ClaimRecord::decode(&b))
        .transpose()
}

/// What must hold before an address of a VRF-backed pool goes back to the
/// pool, beyond its binding: checked inside [`release`]'s decision, so no
/// path releases around it. The one implementation is
/// `provision::assign::MetalAssignmentClosed` (the claim's Metal assignment
/// record is closed for the binding's uid: nothing is assigned to a device
/// and nothing will be), which lives with the record it reads (this module
/// may not import `provision`).
pub trait ReleaseGuard {
    /// Whether the binding of claim `ns/name` for `uid`, in a VRF-backed
    /// pool, may be released now. Called inside the pool's
    /// compare-and-swap decision, after the pool record was read: it may
    /// read the store, never write it.
    ///
    /// # Errors
    /// Why not (a 409 the caller may act on: close the record and retry, or
    /// wait for the assignment's removal); store errors.
    fn may_release<K: KvStore>(&self, kv: &K, ns: &str, name: &str, uid: &str) -> Result<()>;

    /// Whether the binding of claim `ns/name` for `uid` may go when its
    /// pool's record does not load (whether the pool is VRF-backed is not
    /// known): only what is known to hold the address refuses. The
    /// default agrees.
    ///
    /// # Errors
    /// Why not; store errors.
    fn may_release_blind<K: KvStore>(
        &self,
        _kv: &K,
        _ns: &str,
        _name: &str,
        _uid: &str,
    ) -> Result<()> {
        Ok(())
    }
}

/// Releases the address of claim `namespace/name`.
///
/// With `uid`, only a binding of that uid is released (a late delete event
/// for an old incarnation leaves a re-created claim alone). In a VRF-backed
/// pool, `guard` must agree first ([`ReleaseGuard`]): an address still
/// assigned to a device in Metal never goes back to the pool.
///
/// Operations: `get` of the claim key (it names the pool), then
/// `cas_read` of the pool record, one `get_many` of the claim key and the
/// keys of the pool's intents, `cas_swap` (+ read-back) of the pool record,
/// and `delete` of the claim key: five on Spin's SQLite store, six
/// elsewhere. The pool write is the decision: it frees the address only
/// while the binding read after it is live, and records an `Unbind` intent
/// (so a concurrent or repeated release finds the release already
/// decided and frees nothing, and a new binding of the same claim waits);
/// the claim key is removed after it.
///
/// # Idempotency
/// Releasing an unknown or already released claim succeeds and changes
/// nothing. Returns the binding that was released, if any.
///
/// # Errors
/// Store failures and `StepTooSlow` (503), unreadable records (500);
/// what `guard` refuses with (409).
pub fn release<K: KvStore, G: ReleaseGuard>(
    ctx: &Ctx<'_, K>,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    guard: &G,
) -> Result<Option<ClaimRecord>> {
    release_counting(ctx, (namespace, name), uid, guard, None).map(|(r, _)| r)
}

/// [`release`], counting the request as `count_as` (its request
/// signature) in the pool record's own write when that write frees the
/// address: the count costs no operation. Returns whether it was counted
/// there.
///
/// # Errors
/// As [`release`].
pub fn release_counting<K: KvStore, G: ReleaseGuard>(
    ctx: &Ctx<'_, K>,
    (namespace, name): (&str, &str),
    uid: Option<&str>,
    guard: &G,
    count_as: Option<&str>,
) -> Result<(Option<ClaimRecord>, bool)> {
    let mut counted = false;
    let ckey = keys::claim(namespace, name);
    let cname = format!("{namespace}/{name}");
    let Some(bytes) = ctx.kv.get(&ckey)? else {
        return Ok((None, false));
    };
    let first = ClaimRecord::decode(&bytes)?;
    if uid.is_some_and(|u| u != first.uid) {
        return Ok((None, false));
    }
    let pool_id = first.pool_id(namespace)?;
    let me = ctx.env.token();
    let mut owed: Option<(Flush, bool)> = None;
    let decided = store::update_pool(ctx, &pool_id, |current| {
        owed = None;
        counted = false;
        type Out = (FollowUp, Option<ClaimRecord>, u64);
        let step = (|| -> Result<Step<Out, Next>> {
            let now = ctx.env.now();
            let Some(l) = current else {
                // The pool is gone; only the key is left to remove.
                return Ok(Step::Done((FollowUp::Delete, Some(first.clone()), now)));
            };
            let (mine, seen) = read_claims(ctx.kv, l, &cname, &ckey)?;
            let mut state = l.state.clone();
            state.confirm(&seen, write_stamp(l.rev + 1));
            let write = |state: PoolState, out| {
                Step::Write(
                    Box::new(Next {
                        pool: Some((l.object.clone(), l.pool.clone())),
                        state,
                    }),
                    out,
                )
            };
            let Some(record) = mine else {
                return Ok(Step::Done((FollowUp::None, None, 0)));
            };
            if uid.is_some_and(|u| u != record.uid) || record.pool_id(namespace)? != pool_id {
                return Ok(Step::Done((FollowUp::None, None, 0)));
            }
            if l.object.spec.metal.is_some() {
                guard.may_release(ctx.kv, namespace, name, &record.uid)?;
            }
            if let Some(i) = state.intents.iter_mut().find(|i| {
                i.kind == IntentKind::Unbind && i.claim == cname && i.token == record.token
            }) {
                // Already released by another request; take its key removal
                // over only when its owner gave up.
                if !stale(i, now) {
                    return Ok(Step::Done((FollowUp::None, Some(record), 0)));
                }
                i.owner = me.clone();
                i.at = now;
                return Ok(write(state, (FollowUp::Delete, Some(record), now)));
            }
            if let Some(address) = l.pool.value_of(record.ip()?) {
                if let Some(sig) = count_as {
                    state.count(sig);
                    counted = true;
                }
                state.release(address, l.pool.grace_seconds, now);
                state.take_intent(&cname);
                state.forget_holder(&cname);
                state.intents.push(Intent {
                    kind: IntentKind::Unbind,
                    claim: cname.clone(),
                    uid: record.uid.clone(),
                    address,
                    token: record.token.clone(),
                    owner: me.clone(),
                    at: now,
                });
            }
            Ok(write(state, (FollowUp::Delete, Some(record), now)))
        })()?;
        if let (Some(l), Step::Write(next, _)) = (current, &step) {
            owed = flush_of(l, &next.state, FLUSH_AT);
        }
        Ok(step)
    });
    let (follow, released, taken_at) = match decided {
        Err(e) if e.is(Known::UnreadableRecord) => {
            // The pool's record does not load, so no decision on it can be
            // made (every allocation in it fails too): the binding goes
            // alone. The address is free in the record a PUT rebuilds from
            // the bindings left (its grace period is lost with the record).
            guard.may_release_blind(ctx.kv, namespace, name, &first.uid)?;
            (FollowUp::Delete, Some(first), ctx.env.now())
        }
        other => other?,
    };
    if let FollowUp::Delete = follow {
        within_deadline(ctx, taken_at)?;
        ctx.kv.delete(&ckey)?;
    }
    pay(ctx, owed);
    Ok((released, counted))
}

/// A pool with its counts, ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolView {
    /// The registered object.
    pub object: PoolObject,
    /// Its address counts.
    pub counts: Counts,
}

impl PoolView {
    /// Pool `l` with its counts as of `now`.
    pub fn of(l: &Loaded, now: u64) -> PoolView {
        PoolView {
            object: l.object.clone(),
            counts: l.state.counts_at(&l.pool, now),
        }
    }

    /// The object with `status.ipAddresses` (counts saturate at
    /// [`MAX_COUNT`], the largest Kubernetes integer, as everywhere).
    pub fn to_json(&self) -> Value {
        self.object.to_json(Some(json!({
            "ipAddresses": {
                "total": count(self.counts.total),
                "used": count(self.counts.used),
                "free": count(self.counts.free),
                "outOfRange": count(self.counts.out_of_range),
            }
        })))
    }
}

/// The largest count reported anywhere (status, metrics, the browser
/// view): 9223372036854775807 (2^63 − 1), the largest Kubernetes integer.
/// An IPv6 pool's size passes it from a /65 of addresses on.
pub const MAX_COUNT: i64 = i64::MAX;

/// A count as reported: saturating at [`MAX_COUNT`].
///
/// ```
/// use metal_ipam_core::ipam::ops::{count, MAX_COUNT};
/// assert_eq!(count(5), 5);
/// assert_eq!(count(1 << 64), MAX_COUNT);
/// ```
pub fn count(v: u128) -> i64 {
    i64::try_from(v).unwrap_or(MAX_COUNT)
}

/// Whether [`put_pool`] created or changed the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The pool did not exist (or was deleted) and now does.
    Created,
    /// The spec or metadata changed.
    Updated,
    /// Identical to what was stored; nothing written.
    Unchanged,
}

/// Registers or updates a pool.
///
/// The spec is validated before any store operation. An update keeps every
/// allocation; cooling addresses that fall outside the new spec are
/// forgotten.
///
/// # Idempotency
/// Putting the same object twice writes once ([`PutOutcome::Unchanged`]).
///
/// # Errors
/// 422 for an invalid spec; 409 `AllocatedAddressesDropped` naming bound
/// addresses the new spec would no longer contain; 503 on store failure or
/// persistent contention.
pub fn put_pool<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: PoolObject,
) -> Result<(PutOutcome, PoolView)> {
    put_pool_with(ctx, object, &[])
}

/// An address the Kubernetes API says a claim holds (an `IPAddress`
/// object), to be recorded when a pool is registered (see
/// [`put_pool_with`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Adoption {
    /// The claim, as far as the `IPAddress` tells it.
    pub claim: Claim,
    /// Its address.
    pub address: std::net::IpAddr,
}

/// Reason of the refusal to register a VRF-backed pool before its Metal
/// resources are provisioned.
pub const METAL_NOT_PROVISIONED: &str = "MetalNotProvisioned";

/// [`put_pool`], and when the pool is new to the store, records
/// `adoptions` in the same write, so no allocation can hand out an adopted
/// address in between. Then writes each adopted claim's binding (unless
/// one exists). Adoptions of another family than the pool's are skipped.
///
/// # Idempotency
/// As [`put_pool`]; adoptions only apply when the pool is created.
///
/// # Errors
/// As [`put_pool`]; 409 [`METAL_NOT_PROVISIONED`] for a VRF-backed pool.
pub fn put_pool_with<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: PoolObject,
    adoptions: &[Adoption],
) -> Result<(PutOutcome, PoolView)> {
    if let Some(metal) = &object.spec.metal {
        // Its addresses must not be handed out before its Metal resources
        // exist: the provisioning step registers it. (A broken section is
        // still a 422 first.)
        metal.validate()?;
        return Err(Error::conflict(
            METAL_NOT_PROVISIONED,
            "a VRF-backed pool (spec.metal) is registered by the provision step once its Metal resources exist",
        )
        .with_field("spec.metal"));
    }
    register(ctx, object, adoptions, None)
}

/// Registers a VRF-backed pool whose Metal resources exist, with the
/// addresses of its block `net/cidr` (see
/// [`crate::ipam::pool::PoolSpec::with_block`]): what the provision step
/// calls once the gateway is active. A pool without `spec.metal` is
/// registered as [`put_pool_with`] would.
///
/// `may` is asked inside every compare-and-swap decision on the pool
/// record, after the record was read and before the swap
/// (`provision::transitions::may_register`: the pool is not being torn
/// down). A teardown
/// records that it started before it deletes the pool from the store with
/// [`delete_provisioned_pool`], whose write always lands: so a
/// registration either swaps before that write (which then deletes it) or
/// its swap fails and its retry is refused (see `kv-schema/README.md`).
///
/// # Idempotency
/// As [`put_pool`].
///
/// # Errors
/// As [`put_pool`], and 422 when the spec's addresses, prefix or gateway
/// disagree with the block; `may`'s refusal.
pub fn put_provisioned_pool<K: KvStore>(
    ctx: &Ctx<'_, K>,
    mut object: PoolObject,
    block: (std::net::IpAddr, u8),
    adoptions: &[Adoption],
    may: &dyn Fn() -> Result<()>,
) -> Result<(PutOutcome, PoolView)> {
    object.spec = object.spec.with_block(block.0, block.1)?;
    register(ctx, object, adoptions, Some(may))
}

/// 409 `PoolInUse` unless pool `id`'s record `l` has no address bound.
fn unbound(id: &PoolId, l: &Loaded) -> Result<()> {
    let c = l.state.counts(&l.pool);
    let bound = c.used + c.out_of_range;
    if bound > 0 {
        return Err(Error::conflict(
            "PoolInUse",
            format!(
                "pool {} still has {bound} allocated address(es); release their claims first",
                id.display()
            ),
        ));
    }
    Ok(())
}

/// Deletes a VRF-backed pool from the store at the start of its teardown:
/// as [`delete_pool`], but the swap always happens, a tombstone even over a
/// tombstone or an absent key, so that a registration whose decision read
/// the pool before it fails its swap (see [`put_provisioned_pool`]).
///
/// # Idempotency
/// Each call writes a tombstone; the pool stays deleted.
///
/// # Errors
/// 409 `PoolInUse` while addresses are bound; 503 on store failure.
pub fn delete_provisioned_pool<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<()> {
    let pages = store::update_pool(ctx, id, |current| {
        let next = match current {
            Some(l) => {
                unbound(id, l)?;
                Next::tombstone(l)
            }
            // (Over a tombstone: one that still lists pages, after a
            // deletion that crashed before deleting them, stops listing
            // them; they belong to a deleted incarnation, which no reader
            // asks about.)
            None => Next {
                pool: None,
                state: PoolState::default(),
            },
        };
        let h = &next.state.holders;
        let pages = (h.incarnation.clone(), h.pages.clone());
        Ok(Step::Write(Box::new(next), pages))
    })?;
    let _ = holders::sweep_pages(ctx, id, &pages.0, &pages.1);
    let _ = index::settle(ctx, id, None);
    Ok(())
}

/// What [`register`] decided: the answer, the adopted claims' bindings it
/// owes (key, record), and when it took their intents.
type Registered = ((PutOutcome, PoolView), Vec<(String, ClaimRecord)>, u64);

/// What a registration will hold: the new spec's allocatable set and the
/// adoptions' addresses (a new pool records them even outside its spec),
/// in addresses.
fn registration_held(pool: &ValidatedPool, adoptions: &[Adoption]) -> Held {
    let mut values = pool.allocatable.clone();
    for a in adoptions {
        if let Some(v) = pool.value_of(a.address) {
            values.insert(v);
        }
    }
    Held {
        family: pool.family,
        set: pool.addresses_of(&values),
    }
}

/// Registers or updates a pool (after `may`, the caller's gate, agrees);
/// a new pool takes `adoptions` over under `Bind` intents of this request,
/// whose bindings it then writes.
///
/// An identical object answers [`PutOutcome::Unchanged`] from one read.
/// Otherwise the pool index grants the addresses first
/// ([`index::reserve`]: the overlap rule), the pool record is written
/// within the grant's deadline, and the index is settled to what the
/// record holds ([`index::settle`]), whatever the write's outcome. A
/// record that does not load is rebuilt ([`repair`]).
fn register<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: PoolObject,
    adoptions: &[Adoption],
    may: Option<&dyn Fn() -> Result<()>>,
) -> Result<(PutOutcome, PoolView)> {
    let pool = object.spec.validate()?;
    let id = object.id.clone();
    let now = ctx.env.now();
    match store::read_pool_or_pages(ctx.kv, &id) {
        Ok((Some(l), _)) if l.object == object => {
            if let Some(may) = may {
                may()?;
            }
            return Ok((PutOutcome::Unchanged, PoolView::of(&l, now)));
        }
        Ok((_, (inc, pages))) => {
            // A tombstone that still lists the deleted pool's holder pages
            // (its deletion crashed before deleting them): they go first.
            holders::sweep_pages(ctx, &id, &inc, &pages)?;
        }
        Err(e) if e.is(Known::UnreadableRecord) => {
            return repair(ctx, object, &pool, adoptions, may);
        }
        Err(e) => return Err(e),
    }
    let grant = index::reserve(ctx, &id, &registration_held(&pool, adoptions))?;
    let me = ctx.env.token();
    let written = store::update_pool(ctx, &id, |current| {
        if let Some(may) = may {
            may()?;
        }
        let now = ctx.env.now();
        grant.check(now)?;
        match current {
            None => {
                // Over a tombstone (or nothing): the requests its record
                // counted go on (one `get`, read after the record).
                let carried = store::read_counted(ctx.kv, &id)?.unwrap_or_default();
                Ok(register_new(
                    ctx, &object, &pool, adoptions, &me, now, carried,
                ))
            }
            Some(l) => register_update(&object, &pool, l, now),
        }
    });
    // The grant is settled whatever the write did (a failed one leaves the
    // entry as it was); a settle that fails leaves the grant to expire,
    // which is safe, so the registration's own answer stands.
    let _ = index::settle(ctx, &id, Some(&grant.token));
    let (result, bindings, taken_at) = written?;
    // The adopted claims' bindings: this request owns their Bind intents.
    for (key, record) in &bindings {
        within_deadline(ctx, taken_at)?;
        ctx.kv.set(key, &record.encode())?;
    }
    Ok(result)
}

/// Rebuilds pool `object`'s record, which does not load (`why`): its
/// allocation state is made from the claim bindings that name the pool
/// (one listing of the store's keys, then a read per claim binding: the
/// one request path that lists the store, and only for a record that
/// cannot be read) and `adoptions` (the `IPAddress` objects, in
/// Kubernetes mode); an address two of them name goes to the first.
/// Cooling addresses and intents the lost record held are gone: a claim
/// whose binding was not written yet retries and is bound afresh. The
/// index grants what the rebuilt record holds first, as any registration.
///
/// # Errors
/// As [`register`]; 409 `PoolOverlap` when the rebuilt pool would overlap
/// another.
fn repair<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: PoolObject,
    pool: &ValidatedPool,
    adoptions: &[Adoption],
    may: Option<&dyn Fn() -> Result<()>>,
) -> Result<(PutOutcome, PoolView)> {
    let id = object.id.clone();
    let (bound, listed) = listed_of_pool(ctx.kv, &id)?;
    // The rebuilt record is a new holder incarnation, not indexed: its
    // bindings are written to its pages by the migration that follows. The
    // lost incarnation's pages go first (nothing of a record that does not
    // load writes them).
    holders::forget_listed_pages(ctx.kv, &listed, &id)?;
    let mut state = PoolState::default();
    state.holders.incarnation = ctx.env.token();
    let mut owners: Vec<String> = Vec::new();
    for (ns, name, record) in &bound {
        let Some(v) = record.ip().ok().and_then(|ip| pool.value_of(ip)) else {
            continue;
        };
        if !state.used.contains(v) {
            state.used.insert(v);
            owners.push(format!("{ns}/{name}"));
        }
    }
    // Adopted claims the store has no binding for: bound here, their
    // bindings written after the swap under this request's intents.
    let mut missing = Vec::new();
    for a in adoptions {
        let cname = a.claim.id.display();
        let Some(v) = pool.value_of(a.address) else {
            continue;
        };
        if !owners.contains(&cname) && !state.used.contains(v) {
            state.used.insert(v);
            owners.push(cname);
            missing.push(a);
        }
    }
    let mut held_values = pool.allocatable.clone();
    held_values.union_with(&state.used);
    let held = Held {
        family: pool.family,
        set: pool.addresses_of(&held_values),
    };
    let grant = index::reserve(ctx, &id, &held)?;
    let swap_check = index::swap_check(ctx.kv)?;
    // What the lost record had counted is lost with it: the rebuilt one
    // starts from what its index entry was made with (nothing counted
    // since), so the total the metrics report does not go back.
    state.counted = index::read(ctx.kv)?
        .and_then(|i| i.pools.get(&keys::pool(&id)).map(|e| e.base.clone()))
        .unwrap_or_default();
    let me = ctx.env.token();
    let written = store::replace_unreadable_pool(ctx, &id, swap_check, || {
        if let Some(may) = may {
            may()?;
        }
        let now = ctx.env.now();
        grant.check(now)?;
        let mut st = state.clone();
        let mut bindings = Vec::new();
        for a in &missing {
            let Some(v) = pool.value_of(a.address) else {
                continue;
            };
            let tok = ctx.env.token();
            bindings.push((
                keys::claim(&a.claim.id.namespace, &a.claim.id.name),
                ClaimRecord::new(&a.claim, a.address, pool, object.uid(), &tok),
            ));
            st.intents.push(Intent {
                kind: IntentKind::Bind,
                claim: a.claim.id.display(),
                uid: a.claim.id.uid.clone(),
                address: v,
                token: tok,
                owner: me.clone(),
                at: now,
            });
        }
        let next = Next {
            pool: Some((object.clone(), pool.clone())),
            state: st.clone(),
        };
        Ok((next, (st, bindings, now)))
    });
    let _ = index::settle(ctx, &id, Some(&grant.token));
    let Some((st, bindings, taken_at)) = written? else {
        // Readable again (someone else's repair landed first): register
        // over it the ordinary way.
        return register(ctx, object, adoptions, may);
    };
    for (key, record) in &bindings {
        within_deadline(ctx, taken_at)?;
        ctx.kv.set(key, &record.encode())?;
    }
    // Its holders, from one more listing (the repair path lists anyway);
    // a failure leaves the pool not indexed for the reconcile or the next
    // flush to finish.
    let _ = holders::index_holders(ctx, std::slice::from_ref(&id));
    let view = PoolView {
        object,
        counts: st.counts(pool),
    };
    Ok((PutOutcome::Created, view))
}

/// Every claim binding naming pool `id`: `(namespace, name, binding)`
/// (one listing of the store's keys, then a `get` per claim binding). For
/// the repair of an unreadable pool record only.
///
/// # Errors
/// Store failures (503); an unreadable binding is skipped.
pub fn bindings_of_pool<K: KvStore>(
    kv: &K,
    id: &PoolId,
) -> Result<Vec<(String, String, ClaimRecord)>> {
    Ok(listed_of_pool(kv, id)?.0)
}

/// A claim binding as listed: `(namespace, name, binding)`.
type Listed = Vec<(String, String, ClaimRecord)>;

/// [`bindings_of_pool`], and the keys the listing found.
fn listed_of_pool<K: KvStore>(kv: &K, id: &PoolId) -> Result<(Listed, Vec<String>)> {
    let mut out = Vec::new();
    let keys_listed = kv.list_keys()?;
    for key in &keys_listed {
        let Some((ns, name)) = keys::parse_claim(key) else {
            continue;
        };
        let Some(bytes) = kv.get(key)? else { continue };
        let Ok(record) = ClaimRecord::decode(&bytes) else {
            continue;
        };
        if record.pool_id(ns).ok().as_ref() == Some(id) {
            out.push((ns.to_string(), name.to_string(), record));
        }
    }
    Ok((out, keys_listed))
}

/// [`register`]'s decision for a pool not yet stored: its adoptions, one
/// address per claim (the first `IPAddress` wins), each under a `Bind`
/// intent owned by `me`. A new record is indexed from the start (no
/// binding exists before it), under a fresh incarnation (its holder pages
/// are its own).
fn register_new<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: &PoolObject,
    pool: &ValidatedPool,
    adoptions: &[Adoption],
    me: &str,
    now: u64,
    counted: BTreeMap<String, u64>,
) -> Step<Registered, Next> {
    let mut state = PoolState {
        counted,
        ..PoolState::default()
    };
    state.holders.indexed = true;
    state.holders.incarnation = ctx.env.token();
    let mut bindings = Vec::new();
    for a in adoptions {
        let cname = a.claim.id.display();
        let Some(v) = pool.value_of(a.address) else {
            continue;
        };
        if state.intent(&cname).is_some() {
            continue; // one address per claim: the first IPAddress wins
        }
        state.adopt(v);
        let tok = ctx.env.token();
        bindings.push((
            keys::claim(&a.claim.id.namespace, &a.claim.id.name),
            ClaimRecord::new(&a.claim, a.address, pool, object.uid(), &tok),
        ));
        state.intents.push(Intent {
            kind: IntentKind::Bind,
            claim: cname,
            uid: a.claim.id.uid.clone(),
            address: v,
            token: tok,
            owner: me.to_string(),
            at: now,
        });
    }
    let view = PoolView {
        object: object.clone(),
        counts: state.counts(pool),
    };
    Step::Write(
        Box::new(Next {
            pool: Some((object.clone(), pool.clone())),
            state,
        }),
        ((PutOutcome::Created, view), bindings, now),
    )
}

/// [`register`]'s decision for a stored pool: refused when the new spec
/// would drop allocated addresses; cooling addresses outside it are freed;
/// nothing written when nothing changed.
///
/// (A prefix pool whose allocation length changes, only possible with
/// nothing bound or cooling, keeps its holder pages: an entry left from the
/// old length is older than any binding at the new one, and a later write
/// of its page drops it.)
fn register_update(
    object: &PoolObject,
    pool: &ValidatedPool,
    l: &Loaded,
    now: u64,
) -> Result<Step<Registered, Next>> {
    let (dropped, n) = l.state.dropped_by(&l.pool, pool, 10);
    if n > 0 {
        let list: Vec<String> = dropped.iter().map(|&a| pool_ip(&l.pool, a)).collect();
        return Err(Error::conflict(
            "AllocatedAddressesDropped",
            format!(
                "the update would drop {n} allocated address(es) from pool {}: {}{}; release them first",
                object.id.display(),
                list.join(", "),
                if n > list.len() as u128 { ", …" } else { "" }
            ),
        ));
    }
    let mut state = l.state.clone();
    state.expire(now);
    if l.pool.shift != pool.shift {
        // A sub-prefix cooling at one length has no counterpart at another:
        // freeing it would hand it out before its grace period ended.
        if let Some(last) = state.cooling.iter().map(|c| c.until).max() {
            return Err(Error::conflict(
                "CoolingAddressesDropped",
                format!(
                    "pool {}'s allocation length cannot change while {} released sub-prefix(es) are in their reuse grace period; retry after {}",
                    object.id.display(),
                    state.cooling.len(),
                    crate::kube::meta::rfc3339(last),
                ),
            ));
        }
    }
    let outside: Vec<u128> = state
        .cooling
        .iter()
        .map(|c| c.address)
        .filter(|a| !pool.allocatable.contains(*a))
        .collect();
    for a in outside {
        state.cooling.retain(|c| c.address != a);
        state.used.remove(a);
    }
    let view = PoolView {
        object: object.clone(),
        counts: state.counts(pool),
    };
    if *object == l.object && state == l.state {
        return Ok(Step::Done(((PutOutcome::Unchanged, view), Vec::new(), 0)));
    }
    Ok(Step::Write(
        Box::new(Next {
            pool: Some((object.clone(), pool.clone())),
            state,
        }),
        ((PutOutcome::Updated, view), Vec::new(), 0),
    ))
}

fn pool_ip(pool: &crate::ipam::pool::ValidatedPool, a: u128) -> String {
    pool.ip(a).to_string()
}

/// Reads one pool (one `get`), its counts as of `now` (cooling
/// addresses whose grace period ended count as free).
///
/// # Errors
/// Store failures (503), unreadable record (500 `UnreadableRecord`).
pub fn get_pool<K: KvStore>(kv: &K, id: &PoolId, now: u64) -> Result<Option<PoolView>> {
    Ok(store::read_pool(kv, id)?
        .as_ref()
        .map(|l| PoolView::of(l, now)))
}

/// A pool's record as a reader finds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// Absent, or deleted.
    Absent,
    /// Registered.
    Live(Box<Loaded>),
    /// The record does not load: the message says why. A `PUT` of the
    /// pool rebuilds it; a `DELETE` deletes it when no claim holds one of
    /// its addresses.
    Unreadable(String),
}

/// [`find_pool`], with the requests its record counted (a tombstone's
/// included; `None` when absent or unreadable): what the metrics read of
/// each indexed pool, in the same one `get`.
///
/// # Errors
/// Store failures (503).
pub fn find_pool_counted<K: KvStore>(
    kv: &K,
    id: &PoolId,
) -> Result<(Found, Option<index::Counted>)> {
    let Some(bytes) = kv
        .get(&keys::pool(id))?
        .filter(|b| !crate::ports::kv::is_zero_counter(b))
    else {
        return Ok((Found::Absent, None));
    };
    let loaded = PoolRecord::decode(&bytes).and_then(|r| r.load(id).map(|l| (l, r.state.counted)));
    match loaded {
        Ok((None, c)) => Ok((Found::Absent, Some(c))),
        Ok((Some(l), c)) => Ok((Found::Live(Box::new(l)), Some(c))),
        Err(e) if e.is(Known::UnreadableRecord) => {
            Ok((Found::Unreadable(e.message().to_string()), None))
        }
        Err(e) => Err(e),
    }
}

/// Reads pool `id` (one `get`), telling an unreadable record apart.
///
/// # Errors
/// Store failures (503).
pub fn find_pool<K: KvStore>(kv: &K, id: &PoolId) -> Result<Found> {
    match store::read_pool(kv, id) {
        Ok(None) => Ok(Found::Absent),
        Ok(Some(l)) => Ok(Found::Live(Box::new(l))),
        Err(e) if e.is(Known::UnreadableRecord) => Ok(Found::Unreadable(e.message().to_string())),
        Err(e) => Err(e),
    }
}

/// The ids of the pools the index lists (deleted ones whose entry is not
/// settled yet included), sorted; `None` when the store has no index yet
/// (one `get`).
///
/// # Errors
/// Store failures (503), an unreadable index (500).
pub fn indexed_pools<K: KvStore>(kv: &K) -> Result<Option<Vec<PoolId>>> {
    Ok(index::read(kv)?.map(|i| i.ids()))
}

/// [`indexed_pools`], creating the index first when it does not exist
/// (one listing of the store, once per store: [`index::create_from_listing`]).
///
/// # Errors
/// Store failures (503), an unreadable index (500).
pub fn pool_ids<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Vec<PoolId>> {
    if let Some(ids) = indexed_pools(ctx.kv)? {
        return Ok(ids);
    }
    index::create_from_listing(ctx)?;
    Ok(indexed_pools(ctx.kv)?.unwrap_or_default())
}

/// What a listing found: the pools, and those whose record does not load
/// (skipped, each with why), so one bad record hides nothing else.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// The registered pools, sorted by key.
    pub pools: Vec<PoolView>,
    /// Pools whose record does not load.
    pub unreadable: Vec<(PoolId, String)>,
}

/// Lists pools, sorted by key; `kind` restricts to one kind; counts as of
/// `now`. Reads the pool index, then each pool (deleted ones skipped;
/// unreadable ones reported, not fatal); without an index (a store written
/// before it), lists the store's keys instead, without writing.
///
/// # Errors
/// Store failures (503), an unreadable index (500).
pub fn list_pools<K: KvStore>(kv: &K, kind: Option<PoolKind>, now: u64) -> Result<Listing> {
    let ids = match indexed_pools(kv)? {
        Some(ids) => ids,
        None => {
            let mut ids: Vec<PoolId> = kv
                .list_keys()?
                .iter()
                .filter_map(|k| keys::parse_pool::<PoolId>(k))
                .collect();
            ids.sort();
            ids
        }
    };
    read_pools(kv, ids, kind, now)
}

/// [`list_pools`], creating the index when it does not exist
/// ([`pool_ids`]).
///
/// # Errors
/// As [`list_pools`].
pub fn list_pools_in<K: KvStore>(ctx: &Ctx<'_, K>, kind: Option<PoolKind>) -> Result<Listing> {
    let ids = pool_ids(ctx)?;
    read_pools(ctx.kv, ids, kind, ctx.env.now())
}

fn read_pools<K: KvStore>(
    kv: &K,
    ids: Vec<PoolId>,
    kind: Option<PoolKind>,
    now: u64,
) -> Result<Listing> {
    let mut out = Listing::default();
    for id in ids
        .into_iter()
        .filter(|id| kind.is_none_or(|k| id.kind == k))
    {
        match find_pool(kv, &id)? {
            Found::Absent => {}
            Found::Live(l) => out.pools.push(PoolView::of(&l, now)),
            Found::Unreadable(why) => out.unreadable.push((id, why)),
        }
    }
    Ok(out)
}

/// Deletes a pool that has no bound address.
///
/// The record becomes a tombstone (the key stays; see [`crate::kv`]), then
/// the pool index lets its addresses go ([`index::settle`]). A record that
/// does not load is deleted when no claim binding names the pool (one
/// listing of the store: [`bindings_of_pool`]), and refused with
/// `PoolInUse` naming them otherwise.
///
/// # Idempotency
/// Deleting an unknown or deleted pool succeeds; returns whether a pool was
/// deleted by this call.
///
/// # Errors
/// 409 `PoolInUse` while addresses are bound; 503 on store failure.
pub fn delete_pool<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<bool> {
    let (deleted, pages) = match store::update_pool(ctx, id, |current| {
        let Some(l) = current else {
            return Ok(Step::Done((false, None)));
        };
        unbound(id, l)?;
        let next = Next::tombstone(l);
        let h = &next.state.holders;
        let pages = (h.incarnation.clone(), h.pages.clone());
        Ok(Step::Write(Box::new(next), (true, Some(pages))))
    }) {
        Err(e) if e.is(Known::UnreadableRecord) => delete_unreadable(ctx, id)?,
        other => other?,
    };
    // The pool's holder pages go with it. Its tombstone lists them until
    // they are deleted, so a deletion that crashed before (no live pool
    // now) is finished here (one more `get`), or by the next
    // registration's deletion.
    let (inc, pages) = match pages {
        Some(p) => p,
        None => store::read_pool_or_pages(ctx.kv, id)
            .map(|(_, p)| p)
            .unwrap_or_default(),
    };
    let _ = holders::sweep_pages(ctx, id, &inc, &pages);
    // A settle that fails leaves the entry larger than the pool, which is
    // safe; the next settle or the reconcile's tidy repairs it.
    let _ = index::settle(ctx, id, None);
    Ok(deleted)
}

/// [`delete_pool`] of a record that does not load.
fn delete_unreadable<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
) -> Result<(bool, Option<(String, crate::ip::RangeSet)>)> {
    let (bound, listed) = listed_of_pool(ctx.kv, id)?;
    if !bound.is_empty() {
        let names: Vec<String> = bound
            .iter()
            .take(10)
            .map(|(ns, n, r)| format!("{ns}/{n} ({})", r.address))
            .collect();
        return Err(Error::conflict(
            Known::PoolInUse.as_str(),
            format!(
                "pool {}'s record does not load, and {} claim(s) hold its addresses: {}{}; PUT the pool to rebuild its record, or release them first",
                id.display(),
                bound.len(),
                names.join(", "),
                if bound.len() > names.len() { ", …" } else { "" }
            ),
        ));
    }
    let swap_check = index::swap_check(ctx.kv)?;
    // Its holder pages (whatever their incarnation) go with it.
    holders::forget_listed_pages(ctx.kv, &listed, id)?;
    let done = store::replace_unreadable_pool(ctx, id, swap_check, || {
        Ok((
            Next {
                pool: None,
                state: PoolState::default(),
            },
            (),
        ))
    })?;
    match done {
        Some(()) => Ok((true, Some(Default::default()))),
        // Readable again (repaired meanwhile): delete it the ordinary way.
        None => Ok((delete_pool(ctx, id)?, Some(Default::default()))),
    }
}

/// Decodes any record found in the store, for diagnostics and golden tests.
///
/// # Errors
/// 500 if it is neither a pool nor a claim record.
pub fn decode_any(key: &str, bytes: &[u8]) -> Result<Value> {
    if key.starts_with(keys::POOL_PREFIX) {
        let r = PoolRecord::decode(bytes)?;
        return serde_json::to_value(r).map_err(|e| Error::internal(e.to_string()));
    }
    if key.starts_with(keys::CLAIM_PREFIX) {
        let r = ClaimRecord::decode(bytes)?;
        return serde_json::to_value(r).map_err(|e| Error::internal(e.to_string()));
    }
    Err(Error::internal(format!("{key} holds no record")))
}
