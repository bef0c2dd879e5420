//! The allocator: pure state transitions of one pool's allocation state.
//!
//! [`PoolState`] is what the pool record in the key-value store holds
//! besides the spec: the set of addresses that are not free (bound to a
//! claim, being bound, or cooling down after release), the cooling-down
//! addresses with the time they become free again, and the **intents**: the
//! claim-key writes that a decision taken in this record still owes
//! (`Bind`: write the claim's binding; `Unbind`: remove it).
//!
//! Everything here is deterministic and I/O-free: the key-value protocol in
//! [`crate::kv`] and [`crate::ipam::ops`] loads a state, applies one
//! transition and writes it back atomically, so the allocator's guarantees
//! are those of these functions. Why intents make the two-key protocol
//! exact is argued in `kv-schema/README.md`.
//!
//! A confirmed `Bind` intent is not forgotten: it moves to
//! [`Holders::recent`], the bindings not yet written to the pool's holder
//! pages (`ipam::store::HolderPage`), so a reader finds who holds an
//! address without listing the store ([`PoolState::holder_in_record`], and
//! `ipam::ops::holders_of` for the pages). Why that is exact is argued in
//! `kv-schema/README.md` ("Holder pages").
//!
//! # Guarantees (checked by the model-based property tests)
//! 1. An address is handed out only if it is allocatable (in the pool, not
//!    excluded, not reserved) and not in `used`: no address is bound twice.
//! 2. A claim without a pre-allocation or requested address gets the lowest
//!    such address that is not pre-allocated to another claim.
//! 3. A released address is not handed out again before `until`.
//! 4. [`PoolError::Exhausted`] exactly when no address is available.
//! 5. An intent stays until the claim key is seen in its target state
//!    ([`PoolState::confirm`]) or another request takes it over after
//!    [`TAKEOVER_AFTER_SECONDS`]: there is no size or time window in which a
//!    retried claim could lose the address it was answered.

use crate::error::{Error, ErrorKind};
use crate::ip::RangeSet;
use crate::ipam::pool::ValidatedPool;

/// A request that owns an intent writes the claim key within this many
/// seconds of the pool write that gave it the intent, or not at all (it
/// answers 503 and its retry finds the intent).
pub const WRITE_DEADLINE_SECONDS: u64 = 15;

/// An intent whose claim key is still not in its target state this long
/// after its owner took it may be taken over by another request (its owner
/// has either written by then, or given up by [`WRITE_DEADLINE_SECONDS`]).
pub const TAKEOVER_AFTER_SECONDS: u64 = 120;

/// At most this many intents per pool: a pool whose claim-key writes lag
/// this far behind answers 503 `Contention` to new allocations.
pub const MAX_INTENTS: usize = 256;

/// An address waiting out the pool's reuse grace period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cooling {
    /// The released address.
    pub address: u128,
    /// Unix time (seconds) from which it may be handed out again.
    pub until: u64,
}

/// What an [`Intent`] owes the claim key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentKind {
    /// Write the binding with this token (the address is in `used`).
    Bind,
    /// Remove the binding with this token (the address is already freed or
    /// cooling).
    Unbind,
}

/// A claim-key write owed by a decision taken in the pool record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// Bind or unbind.
    pub kind: IntentKind,
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The claim's uid.
    pub uid: String,
    /// The address bound (or released).
    pub address: u128,
    /// The binding's token: identifies this allocation in the claim key.
    pub token: String,
    /// Writer token of the request that must perform the write.
    pub owner: String,
    /// Unix seconds when `owner` took the intent.
    pub at: u64,
}

/// What a claim key was seen to hold, for [`PoolState::confirm`]: the
/// binding's token, or `None` when the key is absent.
pub type SeenToken<'a> = Option<&'a str>;

/// What a claim key was seen to hold, for [`PoolState::confirm`]: the
/// binding's token and the claim's cluster (kept with its holder).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySeen {
    /// The binding's token.
    pub token: String,
    /// The claim's cluster name, if the binding has one.
    pub cluster: Option<String>,
}

/// The values of one holder page: a page holds the values `page << 8` to
/// `(page << 8) + 255`, in the pool's units (addresses, or a prefix pool's
/// sub-prefix numbers).
pub const HOLDER_PAGE_BITS: u32 = 8;

/// The page a value's holder is written to.
///
/// ```
/// use metal_ipam_core::ipam::alloc::page_of;
/// assert_eq!(page_of(0x0a00_00ff), 0x0a_0000);
/// assert_eq!(page_of(0x0a00_0100), 0x0a_0001);
/// ```
pub fn page_of(value: u128) -> u128 {
    value >> HOLDER_PAGE_BITS
}

/// A decision that leaves at least this many [`Holders::recent`] entries
/// has the request that made it write them to their pages after its own
/// claim write (`ipam::ops`): one allocation in this many pays the flush.
pub const FLUSH_AT: usize = 32;

/// At most this many [`Holders::recent`] entries: past it, a confirmed
/// `Bind` intent stays an intent (whose number [`MAX_INTENTS`] bounds)
/// until a flush makes room, so the record never grows with its holders.
pub const MAX_RECENT: usize = 256;

/// A binding confirmed in the pool record (its `Bind` intent was seen
/// written) and not yet known to be in its holder page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The bound value.
    pub address: u128,
    /// The claim's cluster name.
    pub cluster: Option<String>,
    /// The holder order ([`write_stamp`]): a higher stamp for the same
    /// value is a later binding.
    pub stamp: u64,
}

/// Who holds the pool's values, as far as the record knows (see the
/// module docs): the part of the holder index that lives in the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// Every binding of the pool is in its intents, `recent` or its holder
    /// pages. `false` for a record written before the pages existed (or
    /// rebuilt by a repair) until `ipam::ops::index_holders` (one listing)
    /// has written the older bindings to the pages.
    pub indexed: bool,
    /// The pool's incarnation: a random token set when the record is
    /// created (or rebuilt); its holder pages are keyed by it, so the
    /// pages of an earlier incarnation (a deleted or lost record) are never
    /// read or written for this one. Empty in a record written before the
    /// pages ([`Holders::page_incarnation`]).
    pub incarnation: String,
    /// Confirmed bindings not yet written to their pages, oldest first.
    pub recent: Vec<Recent>,
    /// The pages ([`page_of`]) that may hold entries: every page is listed
    /// here before it is first written, so a deletion deletes them all.
    pub pages: RangeSet,
}

/// The incarnation the holder pages of a record written before them are
/// keyed by (its `incarnation` is empty).
pub const LEGACY_INCARNATION: &str = "legacy";

impl Holders {
    /// The incarnation this record's holder pages are keyed by.
    pub fn page_incarnation(&self) -> &str {
        if self.incarnation.is_empty() {
            LEGACY_INCARNATION
        } else {
            &self.incarnation
        }
    }
}

/// The holder order of what the write of revision `rev` of a pool record
/// confirms: `2 × rev`. Revisions only grow within an incarnation, so a
/// later binding of a value always has a higher stamp; the odd stamps in
/// between (`2 × rev + 1`) are the migration's, which lists the bindings
/// after reading revision `rev` (`ipam::ops::index_holders`).
///
/// ```
/// use metal_ipam_core::ipam::alloc::write_stamp;
/// assert!(write_stamp(7) < write_stamp(7) + 1 && write_stamp(7) + 1 < write_stamp(8));
/// ```
pub fn write_stamp(rev: u64) -> u64 {
    rev.saturating_mul(2)
}

/// Who holds a value, as a reader resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The claim's cluster, when known (an intent does not carry it).
    pub cluster: Option<String>,
    /// The holder order of the entry; `None` for a `Bind` intent, which
    /// is newer than every entry.
    pub stamp: Option<u64>,
}

/// Allocation state of one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Addresses that are not free: bound, being bound, or cooling down.
    pub used: RangeSet,
    /// The cooling-down subset of `used`, oldest first.
    pub cooling: Vec<Cooling>,
    /// Claim-key writes still owed, oldest first.
    pub intents: Vec<Intent>,
    /// Who holds the values: the confirmed bindings not yet in the
    /// holder pages, and the pages.
    pub holders: Holders,
    /// Requests whose success a write of this record counted, by their
    /// request signature (`observe::counters`): an allocation or a release
    /// counts itself in the very swap that decides it, so it costs no
    /// operation of its own. Monotonic over the record key's life (a
    /// tombstone keeps them, a re-created pool goes on from them).
    pub counted: std::collections::BTreeMap<String, u64>,
}

impl PoolState {
    /// Counts one request of `signature` in this record's next write.
    pub fn count(&mut self, signature: &str) {
        *self.counted.entry(signature.to_string()).or_default() += 1;
    }
}

/// What a claim asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocRequest<'a> {
    /// `namespace/name` of the claim.
    pub claim: &'a str,
    /// Name of the claim (pre-allocations are keyed by it).
    pub claim_name: &'a str,
    /// The claim's uid.
    pub uid: &'a str,
    /// A specific address asked for, if any.
    pub requested: Option<u128>,
}

/// Why an allocation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolError {
    /// No address is available (some may be cooling down).
    Exhausted {
        /// How many released addresses are still cooling down.
        cooling: usize,
    },
    /// The requested or pre-allocated address is bound to another claim.
    InUse(u128),
    /// The requested address is not an allocatable address of the pool.
    NotInPool(u128),
    /// The requested address is pre-allocated to another claim.
    Reserved(u128),
    /// The requested address differs from the claim's pre-allocation.
    PreAllocationMismatch {
        /// The pre-allocated address.
        pre_allocated: u128,
    },
}

impl PoolError {
    /// Converts to the API error, rendering addresses with `pool`'s family.
    pub fn into_error(self, pool: &ValidatedPool, pool_name: &str) -> Error {
        match self {
            PoolError::Exhausted { cooling } => Error::new(
                ErrorKind::Exhausted,
                "PoolExhausted",
                if cooling > 0 {
                    format!("pool {pool_name} has no free address ({cooling} released addresses are still in their reuse grace period)")
                } else {
                    format!("pool {pool_name} has no free address")
                },
            ),
            PoolError::InUse(a) => Error::conflict(
                "AddressInUse",
                format!("{} in pool {pool_name} is bound to another claim or cooling down after release", pool.ip(a)),
            ),
            PoolError::NotInPool(a) => Error::conflict(
                "AddressNotInPool",
                format!("{} is not an allocatable address of pool {pool_name}", pool.ip(a)),
            ),
            PoolError::Reserved(a) => Error::conflict(
                "AddressReserved",
                format!("{} is pre-allocated to another claim in pool {pool_name}", pool.ip(a)),
            ),
            PoolError::PreAllocationMismatch { pre_allocated } => Error::conflict(
                "PreAllocationMismatch",
                format!("the claim is pre-allocated {} in pool {pool_name} and cannot request another address", pool.ip(pre_allocated)),
            ),
        }
    }
}

/// Address counts of a pool, as reported in `status.ipAddresses`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Allocatable addresses in the current spec.
    pub total: u128,
    /// Bound addresses inside the current spec.
    pub used: u128,
    /// Allocatable addresses neither bound nor cooling down.
    pub free: u128,
    /// Bound addresses outside the current spec.
    pub out_of_range: u128,
    /// Released addresses still in their grace period.
    pub cooling: u128,
}

impl PoolState {
    /// Frees cooling addresses whose grace period is over at `now`.
    /// Returns whether anything changed.
    pub fn expire(&mut self, now: u64) -> bool {
        let before = self.cooling.len();
        let used = &mut self.used;
        self.cooling.retain(|c| {
            if c.until <= now {
                used.remove(c.address);
                false
            } else {
                true
            }
        });
        before != self.cooling.len()
    }

    fn cooling_set(&self) -> RangeSet {
        RangeSet::from_ranges(self.cooling.iter().map(|c| (c.address, c.address)))
    }

    /// Whether `a` is cooling down after a release.
    pub fn is_cooling(&self, a: u128) -> bool {
        self.cooling.iter().any(|c| c.address == a)
    }

    /// Chooses an address for the claim in `req` and marks it used.
    ///
    /// Expired cooling entries are freed first. Then, in order: a claim
    /// with a pre-allocation gets that address (even while it cools down
    /// after the same claim name released it); a requested address is
    /// granted if allocatable, not pre-allocated to another claim and free;
    /// otherwise the lowest free allocatable address that is not
    /// pre-allocated is bound. Whether the claim already holds an address
    /// (a binding or an intent) is the caller's question, answered before.
    ///
    /// # Errors
    /// [`PoolError`] as documented on its variants; the state is unchanged
    /// except for expired cooling entries.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ipam::alloc::{PoolState, AllocRequest};
    /// use metal_ipam_core::ipam::pool::{PoolShape, PoolSpec};
    /// let pool = PoolSpec { addresses: vec!["10.0.0.10-10.0.0.12".into()], shape: PoolShape::addresses(24), ..Default::default() }
    ///     .validate().unwrap();
    /// let mut st = PoolState::default();
    /// let req = AllocRequest { claim: "ns/a", claim_name: "a", uid: "u1", requested: None };
    /// assert_eq!(st.allocate(&pool, &req, 0), Ok(0x0a00_000a));
    /// assert_eq!(st.allocate(&pool, &req, 0), Ok(0x0a00_000b), "the caller checks for an existing binding");
    /// ```
    pub fn allocate(
        &mut self,
        pool: &ValidatedPool,
        req: &AllocRequest<'_>,
        now: u64,
    ) -> Result<u128, PoolError> {
        self.expire(now);
        let address = if let Some(&p) = pool.pre_allocations.get(req.claim_name) {
            if let Some(r) = req.requested {
                if r != p {
                    return Err(PoolError::PreAllocationMismatch { pre_allocated: p });
                }
            }
            if self.used.contains(p) {
                if !self.is_cooling(p) {
                    return Err(PoolError::InUse(p));
                }
                // Released by an earlier claim of the same name: the grace
                // period protects other hosts, not the address's owner.
                self.cooling.retain(|c| c.address != p);
                self.used.remove(p);
            }
            p
        } else if let Some(r) = req.requested {
            if !pool.allocatable.contains(r) {
                return Err(PoolError::NotInPool(r));
            }
            if pool.pre_allocated.contains(r) {
                return Err(PoolError::Reserved(r));
            }
            if self.used.contains(r) {
                return Err(PoolError::InUse(r));
            }
            r
        } else {
            let mut taken = self.used.clone();
            taken.union_with(&pool.pre_allocated);
            pool.allocatable
                .first_not_in(&taken)
                .ok_or(PoolError::Exhausted {
                    cooling: self.cooling.len(),
                })?
        };
        self.used.insert(address);
        Ok(address)
    }

    /// Marks `address` used because the Kubernetes API says a claim holds
    /// it (an existing `IPAddress` object), whether or not the address is
    /// allocatable under the current spec, cooling down or already used.
    /// This is how state is rebuilt after a store loss or a `clusterctl
    /// move` without changing any address already handed out.
    ///
    /// # Idempotency
    /// Returns whether the state changed; a second call changes nothing.
    pub fn adopt(&mut self, address: u128) -> bool {
        let was_cooling = self.is_cooling(address);
        self.cooling.retain(|c| c.address != address);
        let newly_used = !self.used.contains(address);
        self.used.insert(address);
        was_cooling || newly_used
    }

    /// Releases `address`, whose owner the caller has established.
    ///
    /// With a grace period the address cools down until `now + grace`,
    /// otherwise it is free at once.
    ///
    /// # Idempotency
    /// Releasing an address that is free or already cooling changes nothing
    /// and returns `false`.
    pub fn release(&mut self, address: u128, grace: u64, now: u64) -> bool {
        if !self.used.contains(address) || self.is_cooling(address) {
            return false;
        }
        if grace == 0 {
            self.used.remove(address);
        } else {
            self.cooling.push(Cooling {
                address,
                until: now.saturating_add(grace),
            });
        }
        true
    }

    /// The intent about `claim`, if any (at most one exists per claim).
    pub fn intent(&self, claim: &str) -> Option<&Intent> {
        self.intents.iter().find(|i| i.claim == claim)
    }

    /// Removes the intent about `claim`; returns it.
    pub fn take_intent(&mut self, claim: &str) -> Option<Intent> {
        let i = self.intents.iter().position(|i| i.claim == claim)?;
        Some(self.intents.remove(i))
    }

    /// Whether the binding of `claim` with `token` is being removed (an
    /// `Unbind` intent): such a binding is dead even while its key still
    /// holds it.
    pub fn is_unbinding(&self, claim: &str, token: &str) -> bool {
        self.intents
            .iter()
            .any(|i| i.kind == IntentKind::Unbind && i.claim == claim && i.token == token)
    }

    /// Drops every intent whose claim key was seen in its target state:
    /// `Bind` when the key holds its token, `Unbind` when it does not.
    /// `seen` maps `namespace/name` to what its key held, for the keys that
    /// were read after this state was; intents about other claims stay. A
    /// confirmed `Bind` becomes a [`Holders::recent`] entry stamped
    /// `stamp` (the [`write_stamp`] of the write that will carry this
    /// state), its page listed in [`Holders::pages`]; while `recent` is
    /// full ([`MAX_RECENT`]) it stays an intent instead. Returns whether
    /// anything was dropped.
    ///
    /// # Examples
    /// ```
    /// use std::collections::BTreeMap;
    /// use metal_ipam_core::ipam::alloc::{Intent, IntentKind, KeySeen, PoolState};
    /// let mut st = PoolState::default();
    /// st.intents.push(Intent { kind: IntentKind::Bind, claim: "ns/a".into(), uid: "u".into(),
    ///     address: 1, token: "t1".into(), owner: "w".into(), at: 0 });
    /// let mut seen = BTreeMap::new();
    /// seen.insert("ns/a".to_string(), None);
    /// assert!(!st.confirm(&seen, 10), "the binding is not written yet");
    /// seen.insert("ns/a".to_string(), Some(KeySeen { token: "t1".into(), cluster: None }));
    /// assert!(st.confirm(&seen, 10));
    /// assert!(st.intents.is_empty());
    /// assert_eq!(st.holder_in_record(1).unwrap().claim, "ns/a", "its holder is known");
    /// ```
    pub fn confirm(
        &mut self,
        seen: &std::collections::BTreeMap<String, Option<KeySeen>>,
        stamp: u64,
    ) -> bool {
        let before = self.intents.len();
        let mut kept = Vec::with_capacity(self.intents.len());
        for i in std::mem::take(&mut self.intents) {
            let Some(key) = seen.get(&i.claim) else {
                kept.push(i);
                continue;
            };
            let holds = key.as_ref().is_some_and(|k| k.token == i.token);
            match i.kind {
                IntentKind::Bind if holds => {
                    if self.holders.recent.len() >= MAX_RECENT {
                        kept.push(i);
                        continue;
                    }
                    self.holders.pages.insert(page_of(i.address));
                    self.holders.recent.push(Recent {
                        claim: i.claim,
                        address: i.address,
                        cluster: key.as_ref().and_then(|k| k.cluster.clone()),
                        stamp,
                    });
                }
                IntentKind::Unbind if !holds => {}
                _ => kept.push(i),
            }
        }
        self.intents = kept;
        before != self.intents.len()
    }

    /// Forgets the [`Holders::recent`] entries of `claim`: what a release
    /// decision does (the value is freed or cooling, so no reader asks for
    /// its holder, and a later binding of it is confirmed afresh).
    pub fn forget_holder(&mut self, claim: &str) {
        self.holders.recent.retain(|r| r.claim != claim);
    }

    /// The holder of `value` as far as this record knows: a `Bind` intent
    /// for it, else its newest [`Holders::recent`] entry. A reader compares
    /// the latter with the value's page entry and keeps the higher stamp
    /// (`ipam::ops::holders_of`). Whether the value is held at all (used,
    /// not cooling) is the caller's question.
    pub fn holder_in_record(&self, value: u128) -> Option<Holder> {
        if let Some(i) = self
            .intents
            .iter()
            .find(|i| i.kind == IntentKind::Bind && i.address == value)
        {
            return Some(Holder {
                claim: i.claim.clone(),
                cluster: None,
                stamp: None,
            });
        }
        self.holders
            .recent
            .iter()
            .filter(|r| r.address == value)
            .max_by_key(|r| r.stamp)
            .map(|r| Holder {
                claim: r.claim.clone(),
                cluster: r.cluster.clone(),
                stamp: Some(r.stamp),
            })
    }

    /// Bound values of `old_pool` (this state's pool) that would fall
    /// outside `new_pool`'s allocatable set (an update dropping them is
    /// refused). A prefix pool whose allocation length changes drops every
    /// bound sub-prefix: its values would mean other sub-prefixes. At most
    /// `limit` are returned, as values of `old_pool`.
    pub fn dropped_by(
        &self,
        old_pool: &ValidatedPool,
        new_pool: &ValidatedPool,
        limit: usize,
    ) -> (Vec<u128>, u128) {
        let mut bound = self.used.clone();
        bound.subtract(&self.cooling_set());
        let mut outside = bound;
        if old_pool.shift == new_pool.shift {
            outside.subtract(&new_pool.allocatable);
        }
        (outside.iter().take(limit).collect(), outside.len())
    }

    /// [`PoolState::counts`] as of `now`: addresses whose grace period
    /// ended count as free, whether or not a write has expired them yet
    /// (what every read path reports).
    ///
    /// ```
    /// use metal_ipam_core::ipam::alloc::{PoolState, AllocRequest};
    /// use metal_ipam_core::ipam::pool::{PoolShape, PoolSpec};
    /// let pool = PoolSpec { addresses: vec!["10.0.0.0/30".into()], shape: PoolShape::addresses(30),
    ///     address_reuse_grace_period_seconds: 2, ..Default::default() }.validate().unwrap();
    /// let mut st = PoolState::default();
    /// let a = st.allocate(&pool, &AllocRequest { claim: "ns/a", claim_name: "a", uid: "u", requested: None }, 0).unwrap();
    /// st.release(a, 2, 10);
    /// assert_eq!((st.counts_at(&pool, 11).free, st.counts_at(&pool, 11).cooling), (1, 1));
    /// assert_eq!((st.counts_at(&pool, 12).free, st.counts_at(&pool, 12).cooling), (2, 0));
    /// ```
    pub fn counts_at(&self, pool: &ValidatedPool, now: u64) -> Counts {
        if self.cooling.iter().all(|c| c.until > now) {
            return self.counts(pool);
        }
        let mut st = self.clone();
        st.expire(now);
        st.counts(pool)
    }

    /// Counts for `status.ipAddresses`, as stored (cooling entries count as
    /// cooling until a write expires them; readers use
    /// [`PoolState::counts_at`]).
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ipam::alloc::{PoolState, AllocRequest};
    /// use metal_ipam_core::ipam::pool::{PoolShape, PoolSpec};
    /// let pool = PoolSpec { addresses: vec!["10.0.0.0/30".into()], shape: PoolShape::addresses(30), ..Default::default() }
    ///     .validate().unwrap();
    /// let mut st = PoolState::default();
    /// st.allocate(&pool, &AllocRequest { claim: "ns/a", claim_name: "a", uid: "u", requested: None }, 0).unwrap();
    /// let c = st.counts(&pool);
    /// assert_eq!((c.total, c.used, c.free, c.out_of_range), (2, 1, 1, 0));
    /// ```
    pub fn counts(&self, pool: &ValidatedPool) -> Counts {
        let cooling = self.cooling_set();
        let mut bound = self.used.clone();
        bound.subtract(&cooling);
        let used = bound.intersection(&pool.allocatable).len();
        let out_of_range = bound.len() - used;
        let mut free = pool.allocatable.clone();
        free.subtract(&self.used);
        Counts {
            total: pool.allocatable.len(),
            used,
            free: free.len(),
            out_of_range,
            cooling: cooling.intersection(&pool.allocatable).len(),
        }
    }
}
