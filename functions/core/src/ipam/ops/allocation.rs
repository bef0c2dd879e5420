//! Allocation: binding an address to a claim ([`allocate`], [`adopt`]),
//! the pool write deciding it and the claim write it obliges.

use crate::error::{Error, Result};
use crate::ipam::alloc::{
    write_stamp, AllocRequest, Intent, IntentKind, PoolState, FLUSH_AT, MAX_INTENTS,
};
use crate::ipam::claim::Claim;
use crate::ipam::holders::Flush;
use crate::ipam::index::{self, Held};
use crate::ipam::store::{self, ClaimRecord, Loaded, Next};
use crate::kv::{keys, Ctx, Decision};
use crate::ports::kv::KvStore;

use super::{flush_of, pay, read_claims, stale, within_deadline, FollowUp};

/// Result of [`allocate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// The binding (stored under `claim/<ns>/<name>`).
    pub record: ClaimRecord,
    /// `true` if the address was bound by this call, `false` if the claim
    /// already had it.
    pub created: bool,
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
                return Ok(Decision::Done(Some((
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
                            return Ok(Decision::Done(None));
                        }
                        Some(g) => g.check(ctx.env.now())?,
                    }
                }
            }
        }
        Ok(
            match bind_decide(ctx, claim, target, l, (&cname, &ckey), &me, count_as)? {
                Decision::Done(o) => Decision::Done(Some(o)),
                Decision::Write(next, o) => {
                    owed = flush_of(l, &next.state, flush_at);
                    Decision::Write(next, Some(o))
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
    fn write(&self, state: PoolState, out: BindOutcome) -> Decision<BindOutcome, Next> {
        Decision::Write(
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
) -> Result<Decision<BindOutcome, Next>> {
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
        return bind_live(&b, record).map(Decision::Done);
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

/// Decision 1 of [`bind_decide`]: the claim's live binding is the answer.
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

/// Decision 2 of [`bind_decide`]: an intent about this claim. Its own live
/// `Bind` answers (or is taken over once stale); another uid's or an
/// `Unbind` refuses while live; a stale one is cleared from `state` and
/// `None` lets a new binding be made.
fn bind_over_intent(
    b: &BindCtx<'_>,
    state: &mut PoolState,
    intent: &Intent,
) -> Result<Option<Decision<BindOutcome, Next>>> {
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
                return Ok(Some(Decision::Done((FollowUp::None, out, 0))));
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

/// Decision 3 of [`bind_decide`]: a new binding under a fresh `Bind` intent
/// owned by this request.
fn bind_new<K: KvStore>(
    ctx: &Ctx<'_, K>,
    b: &BindCtx<'_>,
    mut state: PoolState,
) -> Result<Decision<BindOutcome, Next>> {
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
