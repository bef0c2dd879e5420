//! Release: a claim's address back to its pool ([`release`]), behind
//! the [`ReleaseGuard`] a VRF-backed pool's Metal assignment keeps.

use crate::error::Known;
use crate::error::Result;
use crate::ipam::alloc::{write_stamp, Intent, IntentKind, PoolState, FLUSH_AT};
use crate::ipam::holders::Flush;
use crate::ipam::pool::PoolId;
use crate::ipam::store::Loaded;
use crate::ipam::store::{self, ClaimRecord, Next};
use crate::kv::{keys, Ctx, Decision};
use crate::ports::kv::KvStore;

use super::{flush_of, pay, read_claims, stale, within_deadline, FollowUp};

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
    let Some(bytes) = ctx.kv.get(&ckey)? else {
        return Ok((None, false));
    };
    let first = ClaimRecord::decode(&bytes)?;
    if uid.is_some_and(|u| u != first.uid) {
        return Ok((None, false));
    }
    let r = ReleaseCtx {
        ctx,
        namespace,
        name,
        cname: format!("{namespace}/{name}"),
        ckey: ckey.clone(),
        uid,
        guard,
        count_as,
        pool_id: first.pool_id(namespace)?,
        me: ctx.env.token(),
    };
    let mut owed: Option<(Flush, bool)> = None;
    let decided = store::update_pool(ctx, &r.pool_id, |current| {
        owed = None;
        counted = false;
        let Some(l) = current else {
            // The pool is gone; only the key is left to remove.
            let now = ctx.env.now();
            return Ok(Decision::Done((FollowUp::Delete, Some(first.clone()), now)));
        };
        let step = release_decide(&r, l, &mut counted)?;
        if let Decision::Write(next, _) = &step {
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

/// What a release decided: the claim-key write it owes, the binding it
/// released, and when it took the `Unbind` intent (for the deadline).
type ReleaseOut = (FollowUp, Option<ClaimRecord>, u64);

/// What one release works with, beside the pool record it decides on.
struct ReleaseCtx<'a, 'c, K: KvStore, G: ReleaseGuard> {
    ctx: &'a Ctx<'c, K>,
    namespace: &'a str,
    name: &'a str,
    /// `namespace/name`.
    cname: String,
    /// The claim key.
    ckey: String,
    uid: Option<&'a str>,
    guard: &'a G,
    count_as: Option<&'a str>,
    /// The pool the binding names.
    pool_id: PoolId,
    /// This request's writer token.
    me: String,
}

/// The release's decision on pool record `l` (inside its
/// compare-and-swap): nothing (no live binding of this claim and uid),
/// taking over another request's stale `Unbind`, or freeing the address
/// under a new `Unbind` intent. Sets `counted` when the write counts the
/// request.
///
/// # Errors
/// Store failures; what the guard refuses with.
fn release_decide<K: KvStore, G: ReleaseGuard>(
    r: &ReleaseCtx<'_, '_, K, G>,
    l: &Loaded,
    counted: &mut bool,
) -> Result<Decision<ReleaseOut, Next>> {
    let now = r.ctx.env.now();
    let (mine, seen) = read_claims(r.ctx.kv, l, &r.cname, &r.ckey)?;
    let mut state = l.state.clone();
    state.confirm(&seen, write_stamp(l.rev + 1));
    let write = |state: PoolState, out| {
        Decision::Write(
            Box::new(Next {
                pool: Some((l.object.clone(), l.pool.clone())),
                state,
            }),
            out,
        )
    };
    let Some(record) = mine else {
        return Ok(Decision::Done((FollowUp::None, None, 0)));
    };
    if r.uid.is_some_and(|u| u != record.uid) || record.pool_id(r.namespace)? != r.pool_id {
        return Ok(Decision::Done((FollowUp::None, None, 0)));
    }
    if l.object.spec.metal.is_some() {
        r.guard
            .may_release(r.ctx.kv, r.namespace, r.name, &record.uid)?;
    }
    if let Some(i) = state
        .intents
        .iter_mut()
        .find(|i| i.kind == IntentKind::Unbind && i.claim == r.cname && i.token == record.token)
    {
        // Already released by another request; take its key removal
        // over only when its owner gave up.
        if !stale(i, now) {
            return Ok(Decision::Done((FollowUp::None, Some(record), 0)));
        }
        i.owner = r.me.clone();
        i.at = now;
        return Ok(write(state, (FollowUp::Delete, Some(record), now)));
    }
    if let Some(address) = l.pool.value_of(record.ip()?) {
        if let Some(sig) = r.count_as {
            state.count(sig);
            *counted = true;
        }
        state.release(address, l.pool.grace_seconds, now);
        state.take_intent(&r.cname);
        state.forget_holder(&r.cname);
        state.intents.push(Intent {
            kind: IntentKind::Unbind,
            claim: r.cname.clone(),
            uid: record.uid.clone(),
            address,
            token: record.token.clone(),
            owner: r.me.clone(),
            at: now,
        });
    }
    Ok(write(state, (FollowUp::Delete, Some(record), now)))
}
