//! The steps behind each route, generic over the key-value port.
//!
//! Each step is one short, idempotent sequence of key-value operations
//! (counts in `kv-schema/README.md`). Function crates parse the request,
//! call one step through [`crate::api`] and render the result.

use serde_json::{json, Value};

use crate::alloc::{AllocRequest, Allocation, Counts, PoolState};
use crate::claim::Claim;
use crate::error::{Error, Result};
use crate::kv::KvStore;
use crate::pool::{PoolId, PoolKind, PoolObject};
use crate::store::{self, addr_in_family, keys, ClaimRecord, Ctx, Loaded, Next, PoolRecord, Step};

/// Result of [`allocate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// The binding (stored under `claim/<ns>/<name>`).
    pub record: ClaimRecord,
    /// `true` if the address was bound by this call, `false` if the claim
    /// already had it.
    pub created: bool,
}

/// Binds an address to `claim` and stores the binding.
///
/// Operations (no contention): `cas_read` of the pool record, `get` of the
/// claim key, `cas_swap` of the pool record (+ one read-back `get` when the
/// backend's swaps are not exact), `set` of the claim key: four on Spin's
/// SQLite store, five elsewhere. A claim that is already bound costs two
/// (`cas_read`, `get`).
///
/// # Idempotency
/// The same claim (namespace, name, uid) gets the same address whether it
/// is posted again later, concurrently, or after a crash between the pool
/// write and the claim write (the pool's journal remembers it; see
/// [`crate::alloc::JOURNAL_MIN`] for how long).
///
/// # Errors
/// - 404 `PoolNotFound` if the pool is not registered;
/// - 409 `PoolExhausted`, `AddressInUse`, `AddressNotInPool`,
///   `AddressReserved`, `PreAllocationMismatch` (see [`crate::alloc::PoolError`]);
/// - 409 `ClaimUidConflict` if the name is bound for another uid (release
///   it first), `ClaimPoolConflict` if bound in another pool;
/// - 503 on store failures or persistent contention.
pub fn allocate<K: KvStore>(ctx: &Ctx<'_, K>, claim: &Claim) -> Result<Allocated> {
    let ckey = keys::claim(&claim.id.namespace, &claim.id.name);
    let now = ctx.env.now();
    let claim_key = claim.id.display();
    // The claim key is read after the pool on every attempt: a duplicate
    // post that raced this one either finds the other's binding here, finds
    // it in the pool's journal, or fails the swap and retries.
    let (allocation, record) = store::update_pool(ctx, &claim.pool, |current| {
        if let Some(record) = binding_of(ctx.kv, &ckey, claim)? {
            return Ok(Step::Done((None, record)));
        }
        let Some(l) = current else {
            return Err(pool_not_found(claim));
        };
        let requested = match claim.requested {
            None => None,
            Some(ip) => Some(addr_in_family(&l.pool, ip).ok_or_else(|| other_family(ip, claim))?),
        };
        let req = AllocRequest {
            claim: &claim_key,
            claim_name: &claim.id.name,
            uid: &claim.id.uid,
            requested,
        };
        let mut state = l.state.clone();
        let result = state.allocate(&l.pool, &req, now);
        let allocation = result.map_err(|e| e.into_error(&l.pool, &claim.pool.display()))?;
        let record = ClaimRecord::new(
            claim,
            l.pool.ip(allocation.address()),
            &l.pool,
            l.object.uid(),
        );
        Ok(match allocation {
            Allocation::Existing(_) => Step::Done((Some(allocation), record)),
            Allocation::New(_) => Step::Write(
                Box::new(Next {
                    pool: Some((l.object.clone(), l.pool.clone())),
                    state,
                }),
                (Some(allocation), record),
            ),
        })
    })?;
    match allocation {
        // Bound before this request: nothing to write.
        None => Ok(Allocated {
            record,
            created: false,
        }),
        Some(a) => {
            ctx.kv.set(&ckey, &record.encode())?;
            Ok(Allocated {
                record,
                created: matches!(a, Allocation::New(_)),
            })
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
    Error::conflict(
        "AddressNotInPool",
        format!("{ip} is not of the family of pool {}", claim.pool.display()),
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

/// Releases the address of claim `namespace/name`.
///
/// With `uid`, only a binding of that uid is released (a late delete event
/// for an old incarnation leaves a re-created claim alone).
///
/// Operations: `get` + `delete` of the claim key, then `cas_read` +
/// `cas_swap` (+ read-back) of the pool record. The claim key goes first:
/// a crash in between leaves the address allocated without a binding (a
/// leak that reconciliation reclaims), never an address freed while a
/// binding still points at it.
///
/// # Idempotency
/// Releasing an unknown or already released claim succeeds and changes
/// nothing. Returns the binding that was released, if any.
///
/// # Errors
/// Store failures (503), unreadable records (500).
pub fn release<K: KvStore>(
    ctx: &Ctx<'_, K>,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<Option<ClaimRecord>> {
    let ckey = keys::claim(namespace, name);
    let Some(bytes) = ctx.kv.get(&ckey)? else {
        return Ok(None);
    };
    let record = ClaimRecord::decode(&bytes)?;
    if uid.is_some_and(|u| u != record.uid) {
        return Ok(None);
    }
    ctx.kv.delete(&ckey)?;
    let pool_id = record.pool_id(namespace)?;
    let ip = record.ip()?;
    let now = ctx.env.now();
    let claim_key = format!("{namespace}/{name}");
    store::update_pool(ctx, &pool_id, |current| {
        let Some(l) = current else {
            return Ok(Step::Done(())); // pool gone: nothing left to free
        };
        let Some(address) = addr_in_family(&l.pool, ip) else {
            return Ok(Step::Done(()));
        };
        let mut state = l.state.clone();
        if state.release(&claim_key, &record.uid, address, l.pool.grace_seconds, now) {
            Ok(Step::Write(
                Box::new(Next {
                    pool: Some((l.object.clone(), l.pool.clone())),
                    state,
                }),
                (),
            ))
        } else {
            Ok(Step::Done(()))
        }
    })?;
    Ok(Some(record))
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
    fn of(l: &Loaded) -> PoolView {
        PoolView {
            object: l.object.clone(),
            counts: l.state.counts(&l.pool),
        }
    }

    /// The object with `status.ipAddresses` (counts saturate at
    /// 9223372036854775807, the largest Kubernetes integer).
    pub fn to_json(&self) -> Value {
        let cap = |v: u128| -> i64 { i64::try_from(v).unwrap_or(i64::MAX) };
        self.object.to_json(Some(json!({
            "ipAddresses": {
                "total": cap(self.counts.total),
                "used": cap(self.counts.used),
                "free": cap(self.counts.free),
                "outOfRange": cap(self.counts.out_of_range),
            }
        })))
    }
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

/// [`put_pool`], and when the pool is new to the store, records
/// `adoptions` in the same write, so no allocation can hand out an adopted
/// address in between. Then writes each adopted claim's binding (unless
/// one exists). Adoptions of another family than the pool's are skipped.
///
/// # Idempotency
/// As [`put_pool`]; adoptions only apply when the pool is created.
///
/// # Errors
/// As [`put_pool`].
pub fn put_pool_with<K: KvStore>(
    ctx: &Ctx<'_, K>,
    object: PoolObject,
    adoptions: &[Adoption],
) -> Result<(PutOutcome, PoolView)> {
    let pool = object.spec.validate()?;
    let id = object.id.clone();
    let now = ctx.env.now();
    let result = store::update_pool(ctx, &id, |current| {
        let Some(l) = current else {
            let mut state = PoolState::default();
            for a in adoptions {
                if let Some(v) = addr_in_family(&pool, a.address) {
                    state.adopt(&a.claim.id.display(), &a.claim.id.uid, v, now);
                }
            }
            let view = PoolView {
                object: object.clone(),
                counts: state.counts(&pool),
            };
            return Ok(Step::Write(
                Box::new(Next {
                    pool: Some((object.clone(), pool.clone())),
                    state,
                }),
                (PutOutcome::Created, view),
            ));
        };
        let (dropped, n) = l.state.dropped_by(&pool, 10);
        if n > 0 {
            let list: Vec<String> = dropped.iter().map(|&a| pool_ip(&l.pool, a)).collect();
            return Err(Error::conflict(
                "AllocatedAddressesDropped",
                format!(
                    "the update would drop {n} allocated address(es) from pool {}: {}{}; release them first",
                    id.display(),
                    list.join(", "),
                    if n > list.len() as u128 { ", …" } else { "" }
                ),
            ));
        }
        let mut state = l.state.clone();
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
            counts: state.counts(&pool),
        };
        if object == l.object && state == l.state {
            return Ok(Step::Done((PutOutcome::Unchanged, view)));
        }
        Ok(Step::Write(
            Box::new(Next {
                pool: Some((object.clone(), pool.clone())),
                state,
            }),
            (PutOutcome::Updated, view),
        ))
    })?;
    if result.0 == PutOutcome::Created {
        for a in adoptions
            .iter()
            .filter(|a| addr_in_family(&pool, a.address).is_some())
        {
            let key = keys::claim(&a.claim.id.namespace, &a.claim.id.name);
            if ctx.kv.get(&key)?.is_none() {
                let rec = ClaimRecord::new(&a.claim, a.address, &pool, object.uid());
                ctx.kv.set(&key, &rec.encode())?;
            }
        }
    }
    Ok(result)
}

/// Records that `claim` holds `address` because its `IPAddress` object says
/// so (the store lost the binding, or the cluster was moved).
///
/// # Idempotency
/// A binding that already says `address` is returned unchanged
/// (`created: false`).
///
/// # Errors
/// 409 `AddressMismatch` when the store binds the claim to another address;
/// 409 `ClaimUidConflict`/`ClaimPoolConflict` as [`allocate`]; 409
/// `AddressNotInPool` for another family; 404 `PoolNotFound`; 503 on store
/// failures.
pub fn adopt<K: KvStore>(
    ctx: &Ctx<'_, K>,
    claim: &Claim,
    address: std::net::IpAddr,
) -> Result<Allocated> {
    let ckey = keys::claim(&claim.id.namespace, &claim.id.name);
    let now = ctx.env.now();
    let claim_key = claim.id.display();
    let (changed, record) = store::update_pool(ctx, &claim.pool, |current| {
        if let Some(record) = binding_of(ctx.kv, &ckey, claim)? {
            if record.address != address.to_string() {
                return Err(Error::conflict(
                    "AddressMismatch",
                    format!(
                        "claim {} is bound to {} but its IPAddress says {address}",
                        claim.id.display(),
                        record.address
                    ),
                ));
            }
            return Ok(Step::Done((false, record)));
        }
        let Some(l) = current else {
            return Err(pool_not_found(claim));
        };
        let v = addr_in_family(&l.pool, address).ok_or_else(|| other_family(address, claim))?;
        let mut state = l.state.clone();
        let record = ClaimRecord::new(claim, address, &l.pool, l.object.uid());
        if state.adopt(&claim_key, &claim.id.uid, v, now) {
            Ok(Step::Write(
                Box::new(Next {
                    pool: Some((l.object.clone(), l.pool.clone())),
                    state,
                }),
                (true, record),
            ))
        } else {
            Ok(Step::Done((true, record)))
        }
    })?;
    if changed {
        ctx.kv.set(&ckey, &record.encode())?;
    }
    Ok(Allocated {
        record,
        created: changed,
    })
}

fn pool_ip(pool: &crate::pool::ValidatedPool, a: u128) -> String {
    pool.ip(a).to_string()
}

/// Reads one pool (one `get`).
///
/// # Errors
/// Store failures (503), unreadable record (500).
pub fn get_pool<K: KvStore>(kv: &K, id: &PoolId) -> Result<Option<PoolView>> {
    Ok(store::read_pool(kv, id)?.as_ref().map(PoolView::of))
}

/// Lists pools, sorted by key; `kind` restricts to one kind. Lists every
/// key of the store once (never used on allocation paths).
///
/// # Errors
/// Store failures (503), unreadable records (500).
pub fn list_pools<K: KvStore>(kv: &K, kind: Option<PoolKind>) -> Result<Vec<PoolView>> {
    let mut ids: Vec<PoolId> = kv
        .list_keys()?
        .iter()
        .filter_map(|k| keys::parse_pool(k))
        .filter(|id| kind.is_none_or(|k| id.kind == k))
        .collect();
    ids.sort();
    let mut out = Vec::new();
    for id in ids {
        if let Some(v) = get_pool(kv, &id)? {
            out.push(v);
        }
    }
    Ok(out)
}

/// Deletes a pool that has no bound address.
///
/// The record becomes a tombstone (the key stays; see [`crate::store`]).
///
/// # Idempotency
/// Deleting an unknown or deleted pool succeeds; returns whether a pool was
/// deleted by this call.
///
/// # Errors
/// 409 `PoolInUse` while addresses are bound; 503 on store failure.
pub fn delete_pool<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<bool> {
    store::update_pool(ctx, id, |current| {
        let Some(l) = current else {
            return Ok(Step::Done(false));
        };
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
        Ok(Step::Write(
            Box::new(Next {
                pool: None,
                state: PoolState::default(),
            }),
            true,
        ))
    })
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
