//! The allocator: pure state transitions of one pool's allocation state.
//!
//! [`PoolState`] is what the pool record in the key-value store holds
//! besides the spec: the set of addresses that are not free (bound to a
//! claim or cooling down after release), the cooling-down addresses with the
//! time they become free again, and a short journal of recent allocations
//! that makes a retried or duplicated claim find the address it already got.
//!
//! Everything here is deterministic and I/O-free: the key-value protocol in
//! [`crate::store`] loads a state, applies one transition and writes it back
//! atomically, so the allocator's guarantees are those of these functions.
//!
//! # Guarantees (checked by the model-based property tests)
//! 1. An address is handed out only if it is allocatable (in the pool, not
//!    excluded, not reserved) and not in `used`: no address is bound twice.
//! 2. A claim without a pre-allocation or requested address gets the lowest
//!    such address that is not pre-allocated to another claim.
//! 3. `allocate` for a claim found in the journal returns the same address
//!    and changes nothing.
//! 4. A released address is not handed out again before `until`.
//! 5. [`PoolError::Exhausted`] exactly when no address is available.

use std::collections::VecDeque;

use crate::addr::RangeSet;
use crate::error::{Error, ErrorKind};
use crate::pool::ValidatedPool;

/// The journal always keeps at least this many recent allocations.
///
/// A claim retried after a crash (between writing the pool record and
/// writing the claim binding), or posted twice at once, gets the address it
/// already has as long as its journal entry is still there: at least
/// [`JOURNAL_MIN`] allocations, and every allocation younger than
/// [`JOURNAL_KEEP_SECONDS`], up to [`JOURNAL_MAX`].
pub const JOURNAL_MIN: usize = 64;
/// Entries younger than this many seconds are kept beyond [`JOURNAL_MIN`].
pub const JOURNAL_KEEP_SECONDS: u64 = 5;
/// Hard cap on journal entries (bounds the record size under bursts).
pub const JOURNAL_MAX: usize = 512;

/// An address waiting out the pool's reuse grace period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cooling {
    /// The released address.
    pub address: u128,
    /// Unix time (seconds) from which it may be handed out again.
    pub until: u64,
}

/// One recent allocation: which claim (and incarnation) got which address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The claim's uid.
    pub uid: String,
    /// The address it got.
    pub address: u128,
    /// Unix seconds of the allocation.
    pub at: u64,
}

/// Allocation state of one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Addresses that are not free: bound to a claim or cooling down.
    pub used: RangeSet,
    /// The cooling-down subset of `used`, oldest first.
    pub cooling: Vec<Cooling>,
    /// Recent allocations, oldest first (see [`JOURNAL_MIN`]).
    pub journal: VecDeque<JournalEntry>,
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

/// Result of a successful [`PoolState::allocate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// A newly bound address (the state changed).
    New(u128),
    /// The claim already had this address (the state is unchanged).
    Existing(u128),
}

impl Allocation {
    /// The address either way.
    pub fn address(self) -> u128 {
        match self {
            Allocation::New(a) | Allocation::Existing(a) => a,
        }
    }
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

    fn is_cooling(&self, a: u128) -> bool {
        self.cooling.iter().any(|c| c.address == a)
    }

    /// The address of `claim`/`uid` in the journal, if it is still bound.
    pub fn journal_lookup(&self, claim: &str, uid: &str) -> Option<u128> {
        self.journal
            .iter()
            .rev()
            .find(|e| e.claim == claim && e.uid == uid)
            .map(|e| e.address)
            .filter(|a| self.used.contains(*a) && !self.is_cooling(*a))
    }

    /// Binds an address to the claim in `req`.
    ///
    /// Expired cooling entries are freed first. Then, in order: a claim
    /// found in the journal gets its address back ([`Allocation::Existing`]);
    /// a claim with a pre-allocation gets that address (even while it cools
    /// down after the same claim name released it); a requested address is
    /// granted if allocatable, not pre-allocated to another claim and free;
    /// otherwise the lowest free allocatable address that is not
    /// pre-allocated is bound.
    ///
    /// # Errors
    /// [`PoolError`] as documented on its variants; the state is unchanged
    /// except for expired cooling entries.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::alloc::{PoolState, AllocRequest, Allocation};
    /// use metal_ipam_core::pool::PoolSpec;
    /// let pool = PoolSpec { addresses: vec!["10.0.0.10-10.0.0.12".into()], prefix: 24, ..Default::default() }
    ///     .validate().unwrap();
    /// let mut st = PoolState::default();
    /// let req = AllocRequest { claim: "ns/a", claim_name: "a", uid: "u1", requested: None };
    /// assert_eq!(st.allocate(&pool, &req, 0), Ok(Allocation::New(0x0a00_000a)));
    /// assert_eq!(st.allocate(&pool, &req, 0), Ok(Allocation::Existing(0x0a00_000a)));
    /// ```
    pub fn allocate(
        &mut self,
        pool: &ValidatedPool,
        req: &AllocRequest<'_>,
        now: u64,
    ) -> Result<Allocation, PoolError> {
        self.expire(now);
        if let Some(a) = self.journal_lookup(req.claim, req.uid) {
            return Ok(Allocation::Existing(a));
        }
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
        self.journal.push_back(JournalEntry {
            claim: req.claim.to_string(),
            uid: req.uid.to_string(),
            address,
            at: now,
        });
        while self.journal.len() > JOURNAL_MAX
            || (self.journal.len() > JOURNAL_MIN
                && self
                    .journal
                    .front()
                    .is_some_and(|e| e.at.saturating_add(JOURNAL_KEEP_SECONDS) < now))
        {
            self.journal.pop_front();
        }
        Ok(Allocation::New(address))
    }

    /// Binds `address` to `claim`/`uid` because the Kubernetes API says so
    /// (an existing `IPAddress` object), whether or not the address is
    /// allocatable under the current spec or already marked used. This is
    /// how state is rebuilt after a store loss or a `clusterctl move`
    /// without changing any address already handed out.
    ///
    /// # Idempotency
    /// Adopting the same binding twice changes nothing the second time;
    /// returns whether the state changed.
    pub fn adopt(&mut self, claim: &str, uid: &str, address: u128, now: u64) -> bool {
        let was_cooling = self.is_cooling(address);
        self.cooling.retain(|c| c.address != address);
        let journaled = self
            .journal
            .iter()
            .any(|e| e.claim == claim && e.uid == uid && e.address == address);
        let newly_used = !self.used.contains(address);
        self.used.insert(address);
        if !journaled {
            self.journal.push_back(JournalEntry {
                claim: claim.to_string(),
                uid: uid.to_string(),
                address,
                at: now,
            });
            while self.journal.len() > JOURNAL_MAX {
                self.journal.pop_front();
            }
        }
        was_cooling || newly_used || !journaled
    }

    /// Releases `address`, bound to `claim`/`uid`.
    ///
    /// With a grace period the address cools down until `now + grace`,
    /// otherwise it is free at once. The claim's journal entries go.
    ///
    /// # Idempotency
    /// Releasing an address that is free or already cooling changes nothing
    /// and returns `false`.
    pub fn release(&mut self, claim: &str, uid: &str, address: u128, grace: u64, now: u64) -> bool {
        let before = self.journal.len();
        self.journal.retain(|e| !(e.claim == claim && e.uid == uid));
        let journal_changed = before != self.journal.len();
        if !self.used.contains(address) || self.is_cooling(address) {
            return journal_changed;
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

    /// Bound addresses that would fall outside `new_pool`'s allocatable set
    /// (an update dropping them is refused). At most `limit` are returned.
    pub fn dropped_by(&self, new_pool: &ValidatedPool, limit: usize) -> (Vec<u128>, u128) {
        let mut bound = self.used.clone();
        bound.subtract(&self.cooling_set());
        let mut outside = bound;
        outside.subtract(&new_pool.allocatable);
        (outside.iter().take(limit).collect(), outside.len())
    }

    /// Counts for `status.ipAddresses`.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::alloc::{PoolState, AllocRequest};
    /// use metal_ipam_core::pool::PoolSpec;
    /// let pool = PoolSpec { addresses: vec!["10.0.0.0/30".into()], prefix: 30, ..Default::default() }
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
