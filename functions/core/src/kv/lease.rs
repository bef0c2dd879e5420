//! The fenced lease: one holder at a time for a piece of work that
//! outlives one compare-and-swap (a Metal creation, an assignment, a
//! device's apply), kept inside the record the work is about.
//!
//! A lease is a small value embedded in a record (an `Option` of it: none
//! is free) that says who holds it (a token) and when it ends (Unix
//! seconds); each record keeps its own field names ([`Lease`] is the
//! trait its lease value implements), so the stored JSON does not change.
//! Every operation here is pure, meant to run inside the record's
//! compare-and-swap decision ([`crate::kv::update_record`]): the swap
//! makes it exclusive, the clock makes a crashed holder's lease end.
//!
//! - [`Slot::begin`]: taken only when no lease stands at all (an ended
//!   one must be settled first: its work may have happened).
//! - [`Slot::acquire`]: taken when free, ended, or the caller's own
//!   (renewed).
//! - [`Slot::take_over`]: taken only over a lease that ended.
//! - [`Slot::release`]: cleared by its holder.
//! - [`fence`]: a holder's write checks, in its own swap, that it still
//!   holds the lease by its clock; after a take-over the stale holder's
//!   check fails (409 `LeaseLost`) and its write does not land.
//!
//! May import [`crate::error`] only.

use crate::error::{Error, Known, Result};

/// A lease as a record stores it: its holder and when it ends.
pub trait Lease {
    /// The holder's token.
    fn holder(&self) -> &str;
    /// Unix seconds it ends at: it excludes others while `now < ends()`.
    fn ends(&self) -> u64;

    /// Whether it still excludes others at `now`.
    fn live(&self, now: u64) -> bool {
        now < self.ends()
    }

    /// Seconds left at `now` (0 once ended).
    fn left(&self, now: u64) -> u64 {
        self.ends().saturating_sub(now)
    }
}

/// The operations on a record's lease field (an `Option`: `None` is free).
pub trait Slot<L: Lease> {
    /// Whether a lease stands that has not ended at `now`.
    fn live(&self, now: u64) -> bool;
    /// Whether `token` holds a lease that has not ended at `now`.
    fn held_by(&self, token: &str, now: u64) -> bool;
    /// Sets `lease` when none stands (ended or not): the start of work that
    /// must happen at most once. Returns whether it did.
    fn begin(&mut self, lease: L) -> bool;
    /// Sets `lease` when none stands, the standing one ended at `now`, or it
    /// is `lease`'s holder's (renewed). Returns whether it did.
    fn acquire(&mut self, lease: L, now: u64) -> bool;
    /// Sets `lease` over one that ended at `now` (its holder crashed or
    /// lost the answer). Returns whether it did.
    fn take_over(&mut self, lease: L, now: u64) -> bool;
    /// Clears the lease if `token` holds it (ended or not). Returns whether
    /// it did.
    fn release(&mut self, token: &str) -> bool;
}

impl<L: Lease> Slot<L> for Option<L> {
    fn live(&self, now: u64) -> bool {
        self.as_ref().is_some_and(|l| l.live(now))
    }

    fn held_by(&self, token: &str, now: u64) -> bool {
        self.as_ref()
            .is_some_and(|l| l.holder() == token && l.live(now))
    }

    fn begin(&mut self, lease: L) -> bool {
        if self.is_some() {
            return false;
        }
        *self = Some(lease);
        true
    }

    fn acquire(&mut self, lease: L, now: u64) -> bool {
        if self
            .as_ref()
            .is_some_and(|l| l.holder() != lease.holder() && l.live(now))
        {
            return false;
        }
        *self = Some(lease);
        true
    }

    fn take_over(&mut self, lease: L, now: u64) -> bool {
        if self.as_ref().is_none_or(|l| l.live(now)) {
            return false;
        }
        *self = Some(lease);
        true
    }

    fn release(&mut self, token: &str) -> bool {
        if self.as_ref().is_none_or(|l| l.holder() != token) {
            return false;
        }
        *self = None;
        true
    }
}

/// The fence a holder's write passes inside its compare-and-swap: `token`
/// holds `lease` at `now`.
///
/// # Errors
/// 409 `LeaseLost` ("the lease on `what` ended or passed to another
/// instance") when it does not: the write must not land.
pub fn fence<L: Lease>(lease: &Option<L>, token: &str, now: u64, what: &str) -> Result<()> {
    if lease.held_by(token, now) {
        return Ok(());
    }
    Err(lost(what))
}

/// 409 `LeaseLost`: the lease on `what` is no longer the caller's (what
/// [`fence`] answers, and a holder's own last check before a call that
/// must end inside its lease).
pub fn lost(what: &str) -> Error {
    Error::conflict(
        Known::LeaseLost.as_str(),
        format!("the lease on {what} ended or passed to another instance"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct L(&'static str, u64);

    impl Lease for L {
        fn holder(&self) -> &str {
            self.0
        }
        fn ends(&self) -> u64 {
            self.1
        }
    }

    #[test]
    fn begin_wants_none_acquire_renews_or_replaces_an_ended_one() {
        let mut s: Option<L> = None;
        assert!(s.begin(L("a", 10)));
        assert!(!s.begin(L("b", 20)));
        assert!(!s.acquire(L("b", 20), 9));
        assert!(s.acquire(L("a", 30), 9), "its holder renews it");
        assert!(s.acquire(L("b", 40), 30), "ended: anyone takes it");
        assert_eq!(s, Some(L("b", 40)));
        assert!(s.live(39) && !s.live(40));
        assert_eq!(s.as_ref().map(|l| l.left(35)), Some(5));
    }

    #[test]
    fn a_take_over_needs_an_ended_lease_and_fences_the_old_holder_out() {
        let mut s = Some(L("a", 10));
        assert!(!s.take_over(L("b", 20), 9));
        assert!(fence(&s, "a", 9, "x").is_ok());
        assert!(s.take_over(L("b", 20), 10));
        let lost = fence(&s, "a", 10, "device d").unwrap_err();
        assert!(lost.is(Known::LeaseLost));
        assert!(lost.message().contains("the lease on device d ended"));
        assert!(!None::<L>.take_over(L("b", 20), 0), "nothing to take over");
        assert!(!s.release("a"));
        assert!(s.release("b"));
        assert_eq!(s, None);
    }
}
