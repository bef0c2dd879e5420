//! Repair: a pool record that does not load, rebuilt from the claim
//! bindings that name the pool and the `IPAddress` objects adopted.

use crate::error::Result;
use crate::ipam::alloc::{Intent, IntentKind, PoolState};
use crate::ipam::holders;
use crate::ipam::index::{self, Held};
use crate::ipam::pool::{PoolObject, ValidatedPool};
use crate::ipam::store::{self, ClaimRecord, Next};
use crate::kv::{keys, Ctx};
use crate::ports::kv::KvStore;

use super::registration::{listed_of_pool, register};
use super::{within_deadline, Adoption, PoolView, PutOutcome};

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
pub(super) fn repair<K: KvStore>(
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
    let (mut state, missing) = rebuilt_state(ctx, pool, &bound, adoptions);
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
        let (st, bindings) = bind_missing(ctx, (&object, pool), &state, &missing, (&me, now));
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

/// The rebuilt record's state: a new holder incarnation whose used values
/// are those of the claim bindings that name the pool (`bound`), then of
/// the adopted claims the store has no binding for, each value to the
/// first that names it; with those adoptions (bound by the repair's
/// write).
fn rebuilt_state<'a, K: KvStore>(
    ctx: &Ctx<'_, K>,
    pool: &ValidatedPool,
    bound: &[(String, String, ClaimRecord)],
    adoptions: &'a [Adoption],
) -> (PoolState, Vec<&'a Adoption>) {
    let mut state = PoolState::default();
    state.holders.incarnation = ctx.env.token();
    let mut owners: Vec<String> = Vec::new();
    for (ns, name, record) in bound {
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
    (state, missing)
}

/// Inside the repair's write: `state` with a `Bind` intent (owner `me`,
/// at `now`) for each adoption in `missing`, and the bindings to write
/// after it.
fn bind_missing<K: KvStore>(
    ctx: &Ctx<'_, K>,
    (object, pool): (&PoolObject, &ValidatedPool),
    state: &PoolState,
    missing: &[&Adoption],
    (me, now): (&str, u64),
) -> (PoolState, Vec<(String, ClaimRecord)>) {
    let mut st = state.clone();
    let mut bindings = Vec::new();
    for a in missing {
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
            owner: me.to_string(),
            at: now,
        });
    }
    (st, bindings)
}
