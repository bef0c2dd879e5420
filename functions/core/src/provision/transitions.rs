//! The transitions of a pool's progress record: every store decision the
//! driver ([`super::step`]) makes, each one compare-and-swap on the record
//! ([`crate::kv::update_record`]) that first checks whose the record is
//! ([`super::plan::owner`]), so no write for an incarnation lands on its
//! tombstone or on another incarnation's record.
//!
//! They are methods on [`PoolRecord`], a handle naming the store, the pool
//! and the incarnation (uid) the caller works for. A creation intent is the
//! record's lease ([`crate::kv::lease`]): [`PoolRecord::claim_intent`]
//! begins it, [`PoolRecord::withdraw_intent`] releases it, and recording
//! the created resource clears it. Public for the interleaving checker
//! (`functions/core/tests/interleavings_provision.rs`), which runs them as
//! the driver does.

use super::plan::{owner, Decided, Held, Intent, Owner, Progress};
use super::record::{read_state, ProgressRecord};
use crate::error::{Error, Result};
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::Resource;
use crate::kv::lease::Slot;
use crate::kv::protocol::{update_record, Decision};
use crate::kv::Ctx;
use crate::ports::kv::KvStore;

/// The progress record of one pool, as incarnation `uid` works on it.
pub struct PoolRecord<'a, 'k, K: KvStore> {
    ctx: &'a Ctx<'k, K>,
    id: &'a PoolId,
    uid: Option<&'a str>,
}

/// How the teardown of a pool starts ([`PoolRecord::begin_teardown`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begun {
    /// Nothing is (or is any longer) recorded for the pool: its tombstone
    /// names its uid.
    Gone,
    /// The record is being torn down.
    Tearing,
}

/// `cur` as `uid`'s record to write on, if it is (a record that names no
/// uid gets `uid`; a free one starts fresh when `fresh`); `None` when a
/// write for `uid` must not land on it.
fn mine(cur: Option<&Progress>, uid: Option<&str>, fresh: bool) -> Option<Progress> {
    match owner(cur, uid) {
        Owner::Mine => {
            let mut p = cur.cloned().unwrap_or_default();
            if p.uid.is_none() {
                p.uid = uid.map(str::to_string);
            }
            Some(p)
        }
        Owner::Free if fresh => Some(Progress::fresh(cur, uid)),
        _ => None,
    }
}

/// `cur` as `uid`'s record where `r` may still be taken: `uid`'s (or a free
/// one, started fresh), not being torn down, holding no `r`.
fn open_for(cur: Option<&Progress>, uid: Option<&str>, r: Resource) -> Option<Progress> {
    mine(cur, uid, true).filter(|p| !p.deleting && p.held(r).is_none())
}

/// `cur` if it is the record being torn down for `owner` and holds `r` as
/// `rid`.
fn tearing(
    cur: Option<&Progress>,
    owner: Option<&str>,
    r: Resource,
    rid: &str,
) -> Option<Progress> {
    cur.filter(|p| !p.deleted && p.deleting && p.uid.as_deref() == owner)
        .filter(|p| p.held(r).map(|h| h.id.as_str()) == Some(rid))
        .cloned()
}

impl<'a, 'k, K: KvStore> PoolRecord<'a, 'k, K> {
    /// The record of pool `id` as incarnation `uid` (`None`: a pool that
    /// did not come from Kubernetes, or a record that names no uid) works
    /// on it.
    pub fn new(ctx: &'a Ctx<'k, K>, id: &'a PoolId, uid: Option<&'a str>) -> Self {
        PoolRecord { ctx, id, uid }
    }

    /// One compare-and-swap on the record (retried): `f` sees the current
    /// record (a tombstone included) and returns what to write, if
    /// anything, and what to answer.
    fn change<T>(
        &self,
        mut f: impl FnMut(Option<&Progress>) -> (Option<Progress>, T),
    ) -> Result<T> {
        update_record::<K, ProgressRecord, T>(self.ctx, self.id, |cur| match f(cur) {
            (Some(next), out) => Ok(Decision::Write(Box::new(next), out)),
            (None, out) => Ok(Decision::Done(out)),
        })
    }

    /// Records a creation intent for `r` by `token` at `now`, with what was
    /// decided for it: the one compare-and-swap that makes a creation
    /// exclusive (the intent's lease begins: [`Slot::begin`]). Granted only
    /// on `uid`'s record (or a free one, which starts fresh) that is not
    /// being torn down, holds no `r` and no other intent. Returns whether it
    /// was recorded (this instance may create `r`).
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn claim_intent(
        &self,
        r: Resource,
        token: &str,
        now: u64,
        decided: &Decided,
    ) -> Result<bool> {
        self.change(|cur| {
            let Some(mut p) = open_for(cur, self.uid, r) else {
                return (None, false);
            };
            let intent = Intent {
                resource: r,
                token: token.to_string(),
                at: now,
                decided: Some(decided.clone()),
            };
            match p.intent.begin(intent) {
                true => (Some(p), true),
                false => (None, false),
            }
        })
    }

    /// Records `found` as the `r` metal-ipam created for `uid`, with its
    /// decision, clearing an intent for `r`. Accepted on `uid`'s record,
    /// teardown or not (a creation that landed while the teardown waited
    /// is torn down with the rest), unless another `r` is recorded.
    /// Refused (`false`) on a tombstone, a free record or another
    /// incarnation's: the caller deletes `found`, a duplicate or a resource
    /// of a pool that is gone.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn record_created(&self, r: Resource, found: &str, decided: &Decided) -> Result<bool> {
        self.change(|cur| {
            let Some(mut p) = mine(cur, self.uid, false) else {
                return (None, false);
            };
            match p.held(r) {
                Some(h) if h.id != found => (None, false),
                Some(_) if p.intent.as_ref().is_some_and(|i| i.resource == r) => {
                    p.intent = None;
                    (Some(p), true)
                }
                Some(_) => (None, true),
                None => {
                    p.set(r, Some(held(found, true, decided)));
                    (Some(p), true)
                }
            }
        })
    }

    /// Records the adopted `found` as `uid`'s `r`, with its decision.
    /// Refused (`false`) when the record is not `uid`'s (a free one starts
    /// fresh), is being torn down, or already holds an `r`.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn record_adopted(&self, r: Resource, found: &str, decided: &Decided) -> Result<bool> {
        self.change(|cur| match open_for(cur, self.uid, r) {
            Some(mut p) => {
                p.set(r, Some(held(found, false, decided)));
                (Some(p), true)
            }
            None => (None, false),
        })
    }

    /// Clears `token`'s intent for `r` on `uid`'s record, if it still
    /// stands (nothing was created, or nothing was found: the intent's
    /// lease is released, [`Slot::release`]). Returns whether it did.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn withdraw_intent(&self, r: Resource, token: &str) -> Result<bool> {
        self.change(|cur| {
            let Some(mut p) = mine(cur, self.uid, false) else {
                return (None, false);
            };
            if p.intent.as_ref().is_some_and(|i| i.resource == r) && p.intent.release(token) {
                return (Some(p), true);
            }
            (None, false)
        })
    }

    /// Records the gateway `gw`'s state as read (`None`: gone behind our
    /// back, so forgotten and created again), on `uid`'s record while it is
    /// not torn down and still holds `gw`.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn record_gateway(&self, gw: &str, state: Option<String>) -> Result<bool> {
        self.change(|cur| {
            let Some(mut p) = mine(cur, self.uid, false) else {
                return (None, false);
            };
            if p.deleting || p.gateway.as_ref().map(|g| g.id.as_str()) != Some(gw) {
                return (None, false);
            }
            match &state {
                None => {
                    p.gateway = None;
                    p.gateway_state = None;
                }
                Some(s) if p.gateway_state.as_ref() == Some(s) => return (None, false),
                Some(s) => p.gateway_state = Some(s.clone()),
            }
            (Some(p), true)
        })
    }

    /// Starts the teardown of incarnation `uid`: its record, or a free one,
    /// or the leftover of an earlier incarnation, is marked `deleting`
    /// (nothing is created for it any more); with nothing recorded, the
    /// tombstone retiring `uid` is written at once, so that no creation for
    /// `uid` can start after the pool is gone. A record already deleting or
    /// retired is left as it is.
    ///
    /// # Idempotency
    /// Writes at most once per teardown.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn begin_teardown(&self) -> Result<Begun> {
        let uid = self.uid;
        self.change(|cur| match owner(cur, uid) {
            Owner::Retired => (None, Begun::Gone),
            Owner::Free => {
                let base = cur.cloned().unwrap_or_default();
                let retire: Vec<String> = uid.map(str::to_string).into_iter().collect();
                (Some(base.tombstone(&retire)), Begun::Gone)
            }
            Owner::Mine | Owner::Other(_) => {
                let mut p = cur.cloned().unwrap_or_default();
                if p.deleting && (p.uid.is_some() || uid.is_none()) {
                    return (None, Begun::Tearing);
                }
                if p.uid.is_none() {
                    p.uid = uid.map(str::to_string);
                }
                p.deleting = true;
                (Some(p), Begun::Tearing)
            }
        })
    }

    /// Marks the leftover record of an earlier incarnation `deleting` so
    /// that `uid`'s provisioning can tear it down first. Returns whether
    /// the record is (now) such a leftover being torn down.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn begin_replacing(&self) -> Result<bool> {
        self.change(|cur| match owner(cur, self.uid) {
            Owner::Other(_) => {
                let mut p = cur.cloned().unwrap_or_default();
                if p.deleting {
                    return (None, true);
                }
                p.deleting = true;
                (Some(p), true)
            }
            _ => (None, false),
        })
    }

    /// Records that `r` (id `rid`) was deleted from the record being torn
    /// down for `uid` (a gateway: its deletion requested, awaited next).
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn record_deleted(&self, r: Resource, rid: &str) -> Result<bool> {
        self.change(|cur| {
            let Some(mut p) = tearing(cur, self.uid, r, rid) else {
                return (None, false);
            };
            if r == Resource::Gateway {
                if p.gateway_state.as_deref() == Some("deleting") {
                    return (None, true);
                }
                p.gateway_state = Some("deleting".into());
            } else {
                p.set(r, None);
            }
            (Some(p), true)
        })
    }

    /// Forgets `r` (id `rid`) on the record being torn down for `uid`,
    /// without touching it in Metal (a gateway: also once it is gone).
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn record_released(&self, r: Resource, rid: &str) -> Result<bool> {
        self.change(|cur| {
            let Some(mut p) = tearing(cur, self.uid, r, rid) else {
                return (None, false);
            };
            p.set(r, None);
            if r == Resource::Gateway {
                p.gateway_state = None;
            }
            (Some(p), true)
        })
    }

    /// Completes the teardown of `uid`'s record: once it holds nothing and
    /// no intent stands, writes the tombstone retiring `retire` (the last
    /// names it). Returns whether the record is (now) that tombstone.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn finish_teardown(&self, retire: &[String]) -> Result<bool> {
        self.change(|cur| {
            if let Some(p) = cur.filter(|p| p.deleted) {
                let all = retire.iter().all(|u| p.retired.contains(u));
                return (None, all);
            }
            let torn = cur.filter(|p| !p.deleted && p.deleting && p.uid.as_deref() == self.uid);
            match torn {
                Some(p) if !p.holds_anything() => (Some(p.tombstone(retire)), true),
                _ => (None, false),
            }
        })
    }
}

fn held(found: &str, created: bool, decided: &Decided) -> Held {
    Held {
        id: found.to_string(),
        created,
        decided: Some(decided.clone()),
    }
}

/// Whether pool `id`'s incarnation `uid` may be registered in the store:
/// its record is live and not being torn down. Read (one `get`) inside the
/// registration's compare-and-swap decision on the pool record (see
/// `kv-schema/README.md`): a teardown marks the record `deleting` before
/// it deletes the pool from the store, so a registration either lands
/// before that deletion (which then removes it) or reads `deleting` and is
/// refused.
///
/// # Errors
/// 409 `MetalTearingDown` when it may not; store errors.
pub fn may_register<K: KvStore>(kv: &K, id: &PoolId, uid: Option<&str>) -> Result<()> {
    let cur = read_state(kv, id)?;
    match owner(cur.as_ref(), uid) {
        Owner::Mine if cur.as_ref().is_some_and(|p| !p.deleting) => Ok(()),
        _ => Err(Error::conflict(
            "MetalTearingDown",
            format!(
                "pool {} is being deleted (or its Metal resources are not its own): it is not registered again",
                id.display()
            ),
        )),
    }
}
