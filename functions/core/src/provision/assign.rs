//! Per-claim Metal IP assignments: the address a claim holds in a
//! VRF-backed pool, assigned to the claim's device (`POST
//! /devices/{id}/ips`, a `/32` or `/128`), and unassigned (`DELETE
//! /ips/{id}`) before the address is released.
//!
//! One [`AssignmentRecord`] per claim under `metal/claim/<ns>/<name>`, next
//! to its binding, kept with the compare-and-swap protocol of
//! [`crate::kv::protocol`]. The rules that make an assignment exactly-once
//! (argued in `kv-schema/README.md`, checked by the interleaving checker):
//!
//! 1. A `POST` happens only under an intent won by compare-and-swap
//!    ([`ClaimAssignment::begin`]): no assignment recorded, no intent younger than
//!    [`INTENT_LEASE_S`], the record not closed.
//! 2. An intent older than the lease means its owner crashed or lost the
//!    answer after it may have assigned: the step reads the device's
//!    assignments and adopts the one with the claim's address before it
//!    posts again ([`ClaimAssignment::take_over`]).
//! 3. [`ClaimAssignment::close`] (the claim is going) succeeds only when no assignment is
//!    recorded and no live intent stands; once closed, no intent is granted
//!    to that claim uid again, so an assignment can never be made for an
//!    address after its release began.
//! 4. [`ClaimAssignment::recorded`] refuses to record into a closed record or over another
//!    assignment: the step then deletes what it just made (a late
//!    duplicate).
//!
//! May import what [`super`] may.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::clouds::PickCloud;
use super::plan::INTENT_LEASE_S;
use crate::cloud::{Cloud, CloudError, CloudKind};
use crate::error::{Error, ErrorKind, Known, Result};
use crate::ip::Family;
use crate::ipam::ops;
use crate::ipam::store::ClaimRecord;
use crate::kv::keys;
use crate::kv::lease::{self, Lease as _, Slot};
use crate::kv::protocol::{read_record, update_record, Decision, Enveloped, StateRecord};
use crate::kv::registry::{Index, RegistryId};
use crate::kv::Ctx;
use crate::ports::kv::KvStore;

/// Schema version of the assignment record.
pub const ASSIGNMENT_VERSION: u32 = 1;

/// A claim, as the assignment record is keyed: (namespace, name).
pub type ClaimKey = (String, String);

/// Seconds after which an intent whose `POST` lost its answer (and whose
/// assignment its instance did not find on the device at once) may be
/// taken over: past the request's deadline (the 10 s budget), so the lost
/// request is no longer in flight on our side, and far below the
/// [`INTENT_LEASE_S`] a crashed instance's intent waits out.
pub const LOST_ANSWER_S: u64 = 15;

/// A creation intent, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignIntent {
    /// The assigning instance's token.
    pub token: String,
    /// Unix seconds when it was recorded (or its answer was lost).
    pub at: u64,
    /// Its `POST` got no answer and the assignment was not on the device
    /// right after: the intent ends [`LOST_ANSWER_S`] after `at`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

impl AssignIntent {
    /// `token`'s intent at `now` (a fresh lease).
    fn new(token: &str, now: u64) -> AssignIntent {
        AssignIntent {
            token: token.to_string(),
            at: now,
            lost: false,
        }
    }
}

/// The intent is the record's [`lease::Lease`]: it ends [`INTENT_LEASE_S`]
/// after `at`, or [`LOST_ANSWER_S`] once its answer was lost.
impl lease::Lease for AssignIntent {
    fn holder(&self) -> &str {
        &self.token
    }
    fn ends(&self) -> u64 {
        let lease = if self.lost {
            LOST_ANSWER_S
        } else {
            INTENT_LEASE_S
        };
        self.at.saturating_add(lease)
    }
}

/// The value of a `metal/claim/…` key: the envelope and an [`Assignment`].
pub type AssignmentRecord = Enveloped<Assignment>;

/// What the record holds for one claim incarnation (its uid).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assignment {
    /// The claim's uid.
    pub uid: String,
    /// The cloud the assignment is made in (left out for Metal, the
    /// default of records written before there were two).
    #[serde(default, skip_serializing_if = "CloudKind::is_metal")]
    pub cloud: CloudKind,
    /// The claim's address, in the form Metal takes (`10.0.0.5/32`).
    pub address: String,
    /// The claim's device, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The Metal assignment's id, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<String>,
    /// The assignment in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<AssignIntent>,
    /// Metal refused the assignment (its message); not retried until the
    /// device or the address changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The device was deleted (its assignments went with it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub device_gone: bool,
    /// The claim is going: nothing is assigned for this uid any more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closed: bool,
}

impl Assignment {
    /// The record's state in one word, for the metrics and the browser
    /// view: `closed`, `device-gone`, `refused`, `assigned`, `assigning`
    /// (an intent stands at `now`), `waiting-for-device` or `pending`.
    ///
    /// ```
    /// use metal_ipam_core::provision::assign::Assignment;
    /// let mut a = Assignment { uid: "u".into(), address: "10.0.0.5/32".into(), ..Default::default() };
    /// assert_eq!(a.state_name(0), "waiting-for-device");
    /// a.device = Some("d".into());
    /// assert_eq!(a.state_name(0), "pending");
    /// a.assignment = Some("as-1".into());
    /// assert_eq!(a.state_name(0), "assigned");
    /// ```
    pub fn state_name(&self, now: u64) -> &'static str {
        if self.closed {
            "closed"
        } else if self.device_gone {
            "device-gone"
        } else if self.refused.is_some() {
            "refused"
        } else if self.assignment.is_some() {
            "assigned"
        } else if self.live_intent(now) {
            "assigning"
        } else if self.device.is_none() {
            "waiting-for-device"
        } else {
            "pending"
        }
    }

    /// Whether an intent stands that has not ended at `now` (its lease, or
    /// [`LOST_ANSWER_S`] after its answer was lost).
    pub fn live_intent(&self, now: u64) -> bool {
        self.intent.live(now)
    }

    /// Seconds until the intent ends (at least 1), when it is live.
    fn intent_left(&self, now: u64) -> u64 {
        self.intent.as_ref().map_or(1, |i| i.left(now).max(1))
    }

    /// Whether something may still exist in Metal for this record: an
    /// assignment recorded, or an intent (live or not) whose outcome is
    /// unknown.
    pub fn holds(&self) -> bool {
        self.assignment.is_some() || self.intent.is_some()
    }
}

impl StateRecord for Assignment {
    type Id = ClaimKey;
    const VERSION: u32 = ASSIGNMENT_VERSION;
    const WHAT: &'static str = "Metal assignment record";

    fn key((ns, name): &ClaimKey) -> String {
        keys::metal_claim(ns, name)
    }
    fn guard_key((ns, name): &ClaimKey) -> String {
        keys::metal_claim_init(ns, name)
    }
    fn describe((ns, name): &ClaimKey) -> String {
        format!("the Metal assignment of claim {ns}/{name}")
    }
}

fn key(ns: &str, name: &str) -> ClaimKey {
    (ns.to_string(), name.to_string())
}

/// The record of claim `ns/name`, if any (one `get`).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn read<K: KvStore>(kv: &K, ns: &str, name: &str) -> Result<Option<Assignment>> {
    read_record::<K, AssignmentRecord>(kv, &key(ns, name))
}

/// The address in the form Metal assigns it: a single address (`/32`,
/// `/128`).
///
/// ```
/// use metal_ipam_core::provision::assign::single;
/// assert_eq!(single("10.0.0.5".parse().unwrap()), "10.0.0.5/32");
/// assert_eq!(single("2001:db8::5".parse().unwrap()), "2001:db8::5/128");
/// ```
pub fn single(ip: IpAddr) -> String {
    format!("{ip}/{}", Family::of(ip).bits())
}

/// What the claim wants assigned: its uid, address and device (when
/// known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The claim's uid.
    pub uid: String,
    /// Its bound address.
    pub address: IpAddr,
    /// Its device, once known.
    pub device: Option<String>,
    /// The cloud of its pool (and so of its device).
    pub cloud: CloudKind,
}

/// The claims whose assignment record is open: the index the poll and
/// reconcile read instead of listing the store (`metal-claim-index`, a
/// [`crate::kv::registry::Index`] of `<namespace>/<name>`). A claim is
/// listed before [`ClaimAssignment::prepare`] creates its record or reopens a closed one;
/// readers ([`list_open`]) unlist the claims whose record they find
/// closed or gone, so the index follows the claims alive, not history.
pub const CLAIMS: Index = Index {
    id: RegistryId {
        key: keys::METAL_CLAIM_INDEX,
        guard: keys::METAL_CLAIM_INDEX_INIT,
    },
    member_of: claim_of_key,
};

fn claim_of_key(key: &str) -> Option<String> {
    keys::parse_metal_claim(key).map(|(ns, name)| member(ns, name))
}

/// A claim as [`CLAIMS`] lists it.
fn member(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Whether a record is alive for [`CLAIMS`]: there, and not closed.
fn open(r: Option<&Assignment>) -> bool {
    r.is_some_and(|r| !r.closed)
}

/// What [`ClaimAssignment::prepare`] writes over `cur`, if anything.
fn prepared(cur: Option<&Assignment>, want: &Want, address: &str) -> Option<Assignment> {
    let fresh = Assignment {
        uid: want.uid.clone(),
        cloud: want.cloud,
        address: address.to_string(),
        device: want.device.clone(),
        ..Assignment::default()
    };
    match cur {
        None => Some(fresh),
        Some(c) if c.uid != want.uid => (!c.holds()).then_some(fresh),
        Some(c) if c.closed => None,
        Some(c) if (c.address != address || c.cloud != want.cloud) && !c.holds() => Some(fresh),
        Some(c) if want.device.is_some() && c.device != want.device && !c.holds() => {
            let mut n = c.clone();
            n.device = want.device.clone();
            n.refused = None;
            n.device_gone = false;
            Some(n)
        }
        Some(_) => None,
    }
}

/// Whether [`ClaimAssignment::close`] closed the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closing {
    /// Closed (now or before): nothing is or will be assigned for the uid.
    Closed,
    /// Something may still exist in Metal: the record as it stands.
    Holds(Assignment),
}

/// The assignment record of claim `ns/name`: a handle naming the store
/// and the claim, whose methods are the record's transitions (each one
/// compare-and-swap, [`crate::kv::protocol::update_record`]).
pub struct ClaimAssignment<'a, 'k, K: KvStore> {
    ctx: &'a Ctx<'k, K>,
    ns: &'a str,
    name: &'a str,
}

impl<'a, 'k, K: KvStore> ClaimAssignment<'a, 'k, K> {
    /// The record of claim `ns/name` in `ctx`'s store.
    pub fn new(ctx: &'a Ctx<'k, K>, ns: &'a str, name: &'a str) -> Self {
        ClaimAssignment { ctx, ns, name }
    }

    fn key(&self) -> ClaimKey {
        key(self.ns, self.name)
    }

    /// Applies `change` to the record (one compare-and-swap, retried);
    /// `change` returns `None` to write nothing, else what it concluded.
    fn change<T>(
        &self,
        mut f: impl FnMut(Option<&Assignment>) -> Option<(Assignment, T)>,
        unchanged: impl Fn(Option<&Assignment>) -> T,
    ) -> Result<T> {
        update_record::<K, AssignmentRecord, T>(self.ctx, &self.key(), |cur| match f(cur) {
            Some((next, out)) => Ok(Decision::Write(Box::new(next), out)),
            None => Ok(Decision::Done(unchanged(cur))),
        })
    }

    /// One compare-and-swap on the record, if there is one: `f` edits a copy
    /// and says whether to write it. Returns whether it wrote.
    fn edit(&self, mut f: impl FnMut(&mut Assignment) -> bool) -> Result<bool> {
        self.change(
            |cur| {
                let mut n = cur?.clone();
                f(&mut n).then_some((n, true))
            },
            |_| false,
        )
    }

    /// Brings the record in line with `want` and returns it: created for a
    /// new claim, the device noted when it becomes known or changes (which
    /// clears a refusal), left alone when nothing differs. A record of another
    /// claim incarnation (another uid) that still holds an assignment is
    /// returned unchanged: the step removes that first. A write that creates
    /// the record or reopens a closed one is made only once the claim is in
    /// [`CLAIMS`], and checked there again once it landed (the index's rule 1).
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn prepare(&self, want: &Want) -> Result<Assignment> {
        let address = single(want.address);
        let m = member(self.ns, self.name);
        let mut listed = false;
        loop {
            let mut opens = false;
            let got = update_record::<K, AssignmentRecord, Option<Assignment>>(
                self.ctx,
                &self.key(),
                |cur| {
                    let next = prepared(cur, want, &address);
                    opens = next.is_some() && !open(cur);
                    match next {
                        Some(_) if opens && !listed => Ok(Decision::Done(None)),
                        Some(n) => Ok(Decision::Write(Box::new(n.clone()), Some(n))),
                        None => Ok(Decision::Done(Some(cur.cloned().unwrap_or_default()))),
                    }
                },
            )?;
            match got {
                Some(rec) => {
                    if listed && opens {
                        CLAIMS.ensure(self.ctx, &m)?;
                    }
                    return Ok(rec);
                }
                None => {
                    CLAIMS.ensure(self.ctx, &m)?;
                    listed = true;
                }
            }
        }
    }

    /// Records an assignment intent for `uid` by `token` at `now`: the one
    /// compare-and-swap that makes a `POST` exclusive. Granted only when the
    /// record is this uid's, open, holds no assignment, no intent stands
    /// ([`lease::Slot::begin`]) and Metal has not refused. Returns whether it
    /// was granted.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn begin(&self, uid: &str, token: &str, now: u64) -> Result<bool> {
        self.start(uid, token, now, |c, intent| {
            let open = !c.closed && c.assignment.is_none() && c.refused.is_none();
            open && c.intent.begin(intent)
        })
    }

    /// Takes over an intent older than the lease (its owner crashed or lost
    /// the answer, [`lease::Slot::take_over`]): replaces it by `token`'s, so
    /// that one instance looks for what the old owner may have made. Returns
    /// whether it did.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn take_over(&self, uid: &str, token: &str, now: u64) -> Result<bool> {
        self.start(uid, token, now, |c, intent| c.intent.take_over(intent, now))
    }

    /// [`Self::begin`] and [`Self::take_over`]: on the record of claim `ns/name` for
    /// `uid`, `take` sets `token`'s intent at `now` on a copy, or refuses.
    fn start(
        &self,
        uid: &str,
        token: &str,
        now: u64,
        take: impl Fn(&mut Assignment, AssignIntent) -> bool,
    ) -> Result<bool> {
        self.edit(|n| n.uid == uid && take(n, AssignIntent::new(token, now)))
    }

    /// Records assignment `id` for `uid`, clearing `token`'s intent. Refused
    /// (returns `false`) when the record is closed, belongs to another uid,
    /// already holds another assignment, or its device was deleted meanwhile:
    /// `id` is then a duplicate (or gone) for the caller to delete.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn recorded(&self, uid: &str, token: &str, id: &str) -> Result<bool> {
        self.change(
            |cur| {
                let c = cur?;
                if c.uid != uid
                    || c.closed
                    || c.device_gone
                    || c.assignment.as_deref().is_some_and(|a| a != id)
                {
                    return None;
                }
                if c.assignment.as_deref() == Some(id) && c.intent.is_none() {
                    return None;
                }
                let mut n = c.clone();
                n.assignment = Some(id.to_string());
                if n.intent.as_ref().is_some_and(|i| i.token == token) {
                    n.intent = None;
                }
                n.refused = None;
                n.device_gone = false;
                Some((n, true))
            },
            |cur| cur.is_some_and(|c| c.uid == uid && c.assignment.as_deref() == Some(id)),
        )
    }

    /// Ends `token`'s intent: nothing was assigned (`refused` = Metal's
    /// message when it refused). Returns whether the intent was still
    /// `token`'s.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn withdraw(&self, token: &str, refused: Option<&str>) -> Result<bool> {
        self.edit(|n| {
            let withdrawn = n.intent.release(token);
            n.refused = refused.map(str::to_string);
            withdrawn
        })
    }

    /// Marks `token`'s intent as having lost its answer at `now`: another
    /// invocation may take it over [`LOST_ANSWER_S`] later (rule 2), instead
    /// of after the whole lease. Returns whether the intent was still
    /// `token`'s.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn mark_lost(&self, token: &str, now: u64) -> Result<bool> {
        self.edit(|n| match &n.intent {
            Some(i) if i.token == token && !i.lost => {
                n.intent = Some(AssignIntent {
                    lost: true,
                    ..AssignIntent::new(token, now)
                });
                true
            }
            _ => false,
        })
    }

    /// Forgets assignment `id` of `uid` (it was deleted, or went with its
    /// device: `device_gone`). Returns whether it was recorded.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn cleared(&self, uid: &str, id: &str, device_gone: bool) -> Result<bool> {
        self.edit(|n| {
            if n.uid != uid || n.assignment.as_deref() != Some(id) {
                return false;
            }
            n.assignment = None;
            n.device_gone = device_gone;
            true
        })
    }

    /// Closes the record for `uid` (creating it closed when absent), unless
    /// it holds an assignment or an intent. A record of another uid that
    /// holds nothing is replaced by the closed one; one that holds something
    /// is left alone (it is another incarnation's, released by its own
    /// claim's steps) and reported closed for `uid`.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn close(&self, uid: &str) -> Result<Closing> {
        self.change(
            |cur| {
                let closed = |c: Option<&Assignment>| {
                    let mut n = c.cloned().unwrap_or_default();
                    n.uid = uid.to_string();
                    n.closed = true;
                    n.intent = None;
                    Some((n, Closing::Closed))
                };
                match cur {
                    None => closed(None),
                    Some(c) if c.uid != uid => {
                        if c.holds() {
                            None
                        } else {
                            closed(None)
                        }
                    }
                    Some(c) if c.closed => None,
                    Some(c) if c.holds() => None,
                    Some(c) => closed(Some(c)),
                }
            },
            |cur| match cur {
                Some(c) if c.uid == uid && c.holds() && !c.closed => Closing::Holds(c.clone()),
                _ => Closing::Closed,
            },
        )
    }

    /// Notes that `device` was deleted for the claim's record: its assignment
    /// went with it (Metal unassigns a deleted device's addresses), and so did
    /// whatever an attempt in progress may have made (an intent is cleared
    /// too: nothing waits on a device that is gone; a late answer of that
    /// attempt is refused by [`Self::recorded`]). Returns whether the record named
    /// that device and changed.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn device_deleted(&self, device: &str) -> Result<bool> {
        self.change(
            |cur| {
                let c = cur?;
                if c.device.as_deref() != Some(device) || (c.device_gone && c.intent.is_none()) {
                    return None;
                }
                let mut n = c.clone();
                n.assignment = None;
                n.intent = None;
                n.device_gone = true;
                Some((n, true))
            },
            |_| false,
        )
    }
}

/// The release guard of VRF-backed pools ([`ops::ReleaseGuard`]): a
/// binding goes back to its pool only when the claim's assignment record
/// is closed for the binding's uid (rule 3: nothing is assigned, and
/// nothing will be for that uid). Refuses with 409
/// `MetalAssignmentHeld` while an assignment (or an attempt whose outcome
/// is unknown) stands, and with 409 `MetalAssignmentOpen` when the record
/// is merely not closed yet ([`release`] then closes it and retries).
#[derive(Debug, Clone, Copy, Default)]
pub struct MetalAssignmentClosed;

/// 409 `MetalAssignmentHeld`: what holds the address in Metal.
fn held(ns: &str, name: &str, rec: &Assignment) -> Error {
    let what = match (&rec.assignment, &rec.device) {
        (Some(id), Some(d)) => format!("is assigned to device {d} in Metal (assignment {id})"),
        (Some(id), None) => format!("is assigned in Metal (assignment {id})"),
        (None, Some(d)) => format!("may be being assigned to device {d} in Metal"),
        (None, None) => "may be being assigned in Metal".to_string(),
    };
    Error::conflict(
        "MetalAssignmentHeld",
        format!(
            "the address {} of claim {ns}/{name} {what}: it goes back to the pool once the assign step removed the assignment (delete the IPAddressClaim, or POST /v1/metal/claims/{ns}/{name})",
            rec.address
        ),
    )
}

impl ops::ReleaseGuard for MetalAssignmentClosed {
    fn may_release<K: KvStore>(&self, kv: &K, ns: &str, name: &str, uid: &str) -> Result<()> {
        match read(kv, ns, name)? {
            Some(r) if r.uid == uid && r.closed => Ok(()),
            Some(r) if r.uid == uid && r.holds() => Err(held(ns, name, &r)),
            _ => Err(Error::conflict(
                Known::MetalAssignmentOpen.as_str(),
                format!(
                    "the Metal assignment record of claim {ns}/{name} is not closed for uid {uid}"
                ),
            )),
        }
    }

    fn may_release_blind<K: KvStore>(&self, kv: &K, ns: &str, name: &str, uid: &str) -> Result<()> {
        match read(kv, ns, name)? {
            Some(r) if r.uid == uid && r.holds() => Err(held(ns, name, &r)),
            _ => Ok(()),
        }
    }
}

/// Releases the binding of claim `ns/name` (for `uid`, or whatever uid it
/// has), honouring the Metal assignment: in a VRF-backed pool the claim's
/// assignment record is closed first ([`ClaimAssignment::close`]: no assignment is ever made
/// for that uid afterwards), and an address still assigned to a device is
/// not released. The one way bindings are released, on every path (the
/// HTTP API, the claim step, reconcile).
///
/// # Idempotency
/// As [`ops::release`]: an unknown or released claim changes nothing.
///
/// # Errors
/// 409 `MetalAssignmentHeld` while the address is assigned in Metal (or an
/// attempt to assign it may have succeeded); as [`ops::release`].
pub fn release<K: KvStore>(
    ctx: &Ctx<'_, K>,
    ns: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<Option<ClaimRecord>> {
    release_counting(ctx, ns, name, uid, None).map(|(r, _)| r)
}

/// [`release`], counting the request as `count_as` (its request
/// signature) in the pool record's own write when that write frees the
/// address ([`ops::release_counting`]); returns whether it was counted
/// there.
///
/// # Errors
/// As [`release`].
pub fn release_counting<K: KvStore>(
    ctx: &Ctx<'_, K>,
    ns: &str,
    name: &str,
    uid: Option<&str>,
    count_as: Option<&str>,
) -> Result<(Option<ClaimRecord>, bool)> {
    match ops::release_counting(ctx, (ns, name), uid, &MetalAssignmentClosed, count_as) {
        Err(e) if e.is(Known::MetalAssignmentOpen) => {}
        other => return other,
    }
    let Some(binding) = ops::get_claim(ctx.kv, ns, name)? else {
        return Ok((None, false));
    };
    if uid.is_some_and(|u| u != binding.uid) {
        return Ok((None, false));
    }
    match ClaimAssignment::new(ctx, ns, name).close(&binding.uid)? {
        Closing::Closed => ops::release_counting(
            ctx,
            (ns, name),
            Some(&binding.uid),
            &MetalAssignmentClosed,
            count_as,
        ),
        Closing::Holds(rec) => Err(held(ns, name, &rec)),
    }
}

/// Where a claim's assignment stands after [`assign`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignState {
    /// Assigned: the Metal assignment's id.
    Assigned(String),
    /// The device is not known yet (no provider ID): waits for it.
    DeviceUnknown,
    /// The device does not exist (never did, or was deleted).
    DeviceGone(String),
    /// The device was deleted (the poll saw it): the assignment went with
    /// it; nothing is assigned until the claim names another device.
    DeviceDeleted(String),
    /// The device exists but is not active (its state).
    DeviceNotActive(String),
    /// Metal refused the assignment (its message).
    Refused(String),
    /// Another instance is assigning; try again after the seconds given.
    InProgress(u64),
    /// The claim is going: nothing is assigned any more.
    Closed,
}

/// Where a claim's unassignment stands after [`unassign`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnassignState {
    /// Nothing is assigned and the record is closed: the address may be
    /// released.
    Done {
        /// The assignment deleted by this call, if any.
        deleted: Option<String>,
    },
    /// Another instance is assigning; try again after the seconds given.
    InProgress(u64),
}

/// The customdata of a claim's assignment: the claim (namespace, name,
/// uid), its pool and cluster, under `metal-ipam.dev`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's uid.
    pub uid: String,
    /// The pool, as `Kind namespace/name`.
    pub pool: String,
    /// The cluster, when known.
    pub cluster: Option<String>,
}

impl Labels {
    /// As customdata.
    pub fn customdata(&self) -> Map<String, Value> {
        let mut claim = Map::new();
        claim.insert("kind".into(), "IPAddressClaim".into());
        claim.insert("namespace".into(), self.namespace.clone().into());
        claim.insert("name".into(), self.name.clone().into());
        claim.insert("uid".into(), self.uid.clone().into());
        let mut m = Map::new();
        m.insert("claim".into(), claim.into());
        m.insert("pool".into(), self.pool.clone().into());
        if let Some(c) = &self.cluster {
            m.insert("cluster".into(), c.clone().into());
        }
        let mut out = Map::new();
        out.insert("metal-ipam.dev".into(), m.into());
        out
    }
}

/// The id of `device`'s assignment of `address`, if it has one. A device
/// that no longer exists has none (Metal unassigned its addresses with it).
fn find_on_device<C: Cloud + ?Sized>(
    cloud: &C,
    device: &str,
    address: &str,
) -> Result<Option<String>> {
    let (ip, _) = address.split_once('/').unwrap_or((address, ""));
    let ip: Option<IpAddr> = ip.parse().ok();
    let assigned = match cloud.addresses(device) {
        Ok(a) => a,
        Err(e) if e.status() == Some(404) => return Ok(None),
        Err(e) => return Err(cloud.error(e)),
    };
    Ok(assigned
        .into_iter()
        .find(|a| a.address.as_deref().and_then(|s| s.parse().ok()) == ip && ip.is_some())
        .map(|a| a.id))
}

/// Assigns the claim's address to its device, exactly once (the module's
/// rules), and records the assignment's id.
///
/// Metal calls: none when the record already holds the assignment;
/// otherwise a read of the device, then the `POST` (and, after a crashed
/// or lost attempt, a read of the device's assignments first).
///
/// # Idempotency
/// Any number of invocations, concurrent or after a crash between any two
/// operations, make at most one assignment; once assigned, an invocation
/// makes no Metal call.
///
/// # Errors
/// Store errors; Metal unavailable (503, nothing lost: the next invocation
/// resumes); 503 `MetalOutcomeUnknown` when the `POST`'s answer was lost
/// (the next invocation after the lease looks for it before posting again).
pub fn assign<K: KvStore, C: PickCloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    clouds: &C,
    want: &Want,
    labels: &Labels,
) -> Result<AssignState> {
    let cloud = clouds.pick(want.cloud)?;
    let (ns, name) = (labels.namespace.as_str(), labels.name.as_str());
    let record = ClaimAssignment::new(ctx, ns, name);
    let mut rec = record.prepare(want)?;
    if rec.uid != want.uid {
        // An earlier incarnation of the claim still holds an assignment:
        // remove it first.
        let old = rec.uid.clone();
        if let UnassignState::InProgress(s) = unassign(ctx, clouds, ns, name, &old)? {
            return Ok(AssignState::InProgress(s));
        }
        rec = record.prepare(want)?;
    }
    if rec.closed {
        return Ok(AssignState::Closed);
    }
    if want.device.is_some() && rec.device != want.device && rec.holds() {
        // The claim moved to another device: what it holds on the old one
        // goes first, then the record follows the claim.
        if let Cleared::InProgress(s) = clear_held(ctx, cloud, ns, name, &rec)? {
            return Ok(AssignState::InProgress(s));
        }
        rec = record.prepare(want)?;
        if rec.device != want.device {
            return Ok(AssignState::InProgress(1));
        }
    }
    if let Some(id) = &rec.assignment {
        return Ok(AssignState::Assigned(id.clone()));
    }
    let Some(device) = rec.device.clone() else {
        return Ok(AssignState::DeviceUnknown);
    };
    if rec.device_gone {
        return Ok(AssignState::DeviceDeleted(device));
    }
    if let Some(m) = &rec.refused {
        return Ok(AssignState::Refused(m.clone()));
    }
    let now = ctx.env.now();
    if rec.live_intent(now) {
        return Ok(AssignState::InProgress(rec.intent_left(now)));
    }
    if let Some(state) = device_unready(cloud, &device)? {
        return Ok(state);
    }
    let token = ctx.env.token();
    if rec.intent.is_some() {
        // Rule 2: look for what the crashed attempt may have made.
        if !record.take_over(&want.uid, &token, now)? {
            return Ok(AssignState::InProgress(1));
        }
        if let Some(id) = find_on_device(cloud, &device, &rec.address)? {
            return record_or_undo(ctx, cloud, labels, &want.uid, &token, &id);
        }
    } else if !record.begin(&want.uid, &token, now)? {
        return Ok(AssignState::InProgress(1));
    }
    post(ctx, cloud, labels, &want.uid, &token, &device, &rec.address)
}

/// Why the address cannot go on `device` now (gone, or not active), if
/// so.
///
/// # Errors
/// Metal's.
fn device_unready<C: Cloud + ?Sized>(cloud: &C, device: &str) -> Result<Option<AssignState>> {
    Ok(match cloud.device(device).map_err(|e| cloud.error(e))? {
        None => Some(AssignState::DeviceGone(device.to_string())),
        Some(d) if d.gone => Some(AssignState::DeviceGone(device.to_string())),
        Some(d) if !d.active => Some(AssignState::DeviceNotActive(
            d.state.unwrap_or_else(|| "unknown".into()),
        )),
        Some(_) => None,
    })
}

/// The `POST` of `address` to `device` under the intent `token` holds,
/// and what its answer means: recorded; a 422 counted as done only when
/// the device shows the address, else a refusal (recorded); a lost answer
/// looked for at once, else marked so the next invocation looks first.
///
/// # Errors
/// Metal's (503 `MetalOutcomeUnknown` for a lost answer); store errors.
fn post<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    labels: &Labels,
    uid: &str,
    token: &str,
    device: &str,
    address: &str,
) -> Result<AssignState> {
    let (ns, name) = (labels.namespace.as_str(), labels.name.as_str());
    let record = ClaimAssignment::new(ctx, ns, name);
    match cloud.assign_address(device, address, labels.customdata()) {
        Ok(a) => record_or_undo(ctx, cloud, labels, uid, token, &a.id),
        Err(e @ CloudError::Api { status: 422, .. }) => {
            // "Already assigned" counts only after re-reading the device.
            if let Some(id) = find_on_device(cloud, device, address)? {
                return record_or_undo(ctx, cloud, labels, uid, token, &id);
            }
            let message = e.to_string();
            record.withdraw(token, Some(&message))?;
            Ok(AssignState::Refused(message))
        }
        Err(e @ CloudError::OutcomeUnknown { .. }) => {
            // The answer was lost: look at once. Not there (yet): the
            // intent ends LOST_ANSWER_S from now rather than after the
            // lease; the next invocation then looks again before posting.
            if let Ok(Some(id)) = find_on_device(cloud, device, address) {
                return record_or_undo(ctx, cloud, labels, uid, token, &id);
            }
            record.mark_lost(token, ctx.env.now())?;
            Err(cloud.error(e))
        }
        Err(e) => {
            record.withdraw(token, None)?;
            Err(cloud.error(e))
        }
    }
}

fn record_or_undo<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    labels: &Labels,
    uid: &str,
    token: &str,
    id: &str,
) -> Result<AssignState> {
    let (ns, name) = (labels.namespace.as_str(), labels.name.as_str());
    let record = ClaimAssignment::new(ctx, ns, name);
    if record.recorded(uid, token, id)? {
        return Ok(AssignState::Assigned(id.to_string()));
    }
    // Rule 4: the claim is going (or another assignment is recorded): this
    // one must not stay.
    cloud.unassign_address(id).map_err(|e| cloud.error(e))?;
    record.withdraw(token, None)?;
    match read(ctx.kv, ns, name)? {
        Some(c) if c.uid == uid && !c.closed => match c.assignment {
            Some(a) => Ok(AssignState::Assigned(a)),
            None => Ok(AssignState::InProgress(1)),
        },
        _ => Ok(AssignState::Closed),
    }
}

/// Removes claim `uid`'s assignment (if any) and closes its record, so
/// that its address may be released; an assignment attempt whose outcome
/// is unknown is looked for on the device first.
///
/// # Idempotency
/// Any number of invocations; after the first that answers `Done`, the
/// others make no Metal call.
///
/// # Errors
/// Store errors; Metal unavailable (503; the next invocation resumes).
pub fn unassign<K: KvStore, C: PickCloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    clouds: &C,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<UnassignState> {
    let record = ClaimAssignment::new(ctx, ns, name);
    let mut deleted = None;
    for _ in 0..4 {
        let rec = match record.close(uid)? {
            Closing::Closed => return Ok(UnassignState::Done { deleted }),
            Closing::Holds(rec) => rec,
        };
        match clear_held(ctx, clouds.pick(rec.cloud)?, ns, name, &rec)? {
            Cleared::Deleted(Some(id)) => deleted = Some(id),
            Cleared::Deleted(None) => {}
            Cleared::InProgress(s) => return Ok(UnassignState::InProgress(s)),
        }
    }
    Err(Error::new(
        ErrorKind::Transient,
        "Contention",
        format!("the Metal assignment of claim {ns}/{name} keeps changing"),
    ))
}

/// What [`clear_held`] did.
enum Cleared {
    /// What the record held is gone from Metal and the record (the
    /// assignment deleted, if one was found).
    Deleted(Option<String>),
    /// An attempt is in progress: try again after the seconds given.
    InProgress(u64),
}

/// Removes what `rec` holds on its device: the recorded assignment, or,
/// for an intent that ended, whatever its attempt made (looked for on the
/// device; a device that is gone has nothing). A live intent is waited for.
fn clear_held<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    ns: &str,
    name: &str,
    rec: &Assignment,
) -> Result<Cleared> {
    let record = ClaimAssignment::new(ctx, ns, name);
    let now = ctx.env.now();
    if let Some(id) = &rec.assignment {
        cloud.unassign_address(id).map_err(|e| cloud.error(e))?;
        record.cleared(&rec.uid, id, false)?;
        return Ok(Cleared::Deleted(Some(id.clone())));
    }
    if rec.live_intent(now) {
        return Ok(Cleared::InProgress(rec.intent_left(now)));
    }
    // An intent that ended: whatever it made is on the device.
    let token = ctx.env.token();
    if !record.take_over(&rec.uid, &token, now)? {
        return Ok(Cleared::Deleted(None));
    }
    let mut deleted = None;
    if let Some(device) = &rec.device {
        if let Some(id) = find_on_device(cloud, device, &rec.address)? {
            cloud.unassign_address(&id).map_err(|e| cloud.error(e))?;
            deleted = Some(id);
        }
    }
    record.withdraw(&token, None)?;
    Ok(Cleared::Deleted(deleted))
}

/// Every claim whose assignment record is open: (namespace, name) and the
/// record, in key order. Reads [`CLAIMS`] (one `get`) and each listed
/// record (one `get` each: Spin 3.6's Redis `get_many` is broken); a
/// claim whose record is closed or gone is unlisted (rule 2 of the index:
/// a few more operations, once). Never lists the store but once, on a
/// store written before the index.
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn list_open<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Vec<(ClaimKey, Assignment)>> {
    let mut out = Vec::new();
    for m in CLAIMS.members(ctx)? {
        let Some((ns, name)) = m.split_once('/') else {
            continue;
        };
        match read(ctx.kv, ns, name)? {
            Some(rec) if !rec.closed => out.push((key(ns, name), rec)),
            _ => {
                CLAIMS.unlist(ctx, &m, || Ok(open(read(ctx.kv, ns, name)?.as_ref())))?;
            }
        }
    }
    Ok(out)
}

/// Lists those of `claims` whose record is open and which [`CLAIMS`]
/// misses (a crash half-way through a race between a reader's unlisting
/// and the record's reopening, or a record written by an older build): the
/// full reconcile's repair, over the claims of VRF-backed pools it synced.
/// One `get` of the index, then one per claim it misses.
///
/// # Idempotency
/// Listing again changes nothing.
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn relist<K: KvStore>(ctx: &Ctx<'_, K>, claims: &[ClaimKey]) -> Result<usize> {
    let listed = CLAIMS.members(ctx)?;
    let mut n = 0;
    for (ns, name) in claims {
        let m = member(ns, name);
        if !listed.contains(&m) && open(read(ctx.kv, ns, name)?.as_ref()) {
            CLAIMS.ensure(ctx, &m)?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Backend, MemKv, TestEnv};

    #[test]
    fn an_intent_is_granted_once_and_a_closed_record_grants_none() {
        let kv = MemKv::new(Backend::SpinSqlite);
        let env = TestEnv::seeded(100, 1);
        let ctx = Ctx::auto(&kv, &env);
        let want = Want {
            uid: "u1".into(),
            address: "10.0.0.5".parse().unwrap(),
            device: Some("d1".into()),
            cloud: Default::default(),
        };
        let rec = ClaimAssignment::new(&ctx, "a", "m").prepare(&want).unwrap();
        assert_eq!(rec.address, "10.0.0.5/32");
        assert!(ClaimAssignment::new(&ctx, "a", "m")
            .begin("u1", "t1", 100)
            .unwrap());
        assert!(!ClaimAssignment::new(&ctx, "a", "m")
            .begin("u1", "t2", 100)
            .unwrap());
        assert!(matches!(
            ClaimAssignment::new(&ctx, "a", "m").close("u1").unwrap(),
            Closing::Holds(_)
        ));
        assert!(ClaimAssignment::new(&ctx, "a", "m")
            .recorded("u1", "t1", "ip-1")
            .unwrap());
        assert!(!ClaimAssignment::new(&ctx, "a", "m")
            .recorded("u1", "t2", "ip-2")
            .unwrap());
        assert!(ClaimAssignment::new(&ctx, "a", "m")
            .cleared("u1", "ip-1", false)
            .unwrap());
        assert_eq!(
            ClaimAssignment::new(&ctx, "a", "m").close("u1").unwrap(),
            Closing::Closed
        );
        assert!(!ClaimAssignment::new(&ctx, "a", "m")
            .begin("u1", "t3", 100)
            .unwrap());
        assert!(!ClaimAssignment::new(&ctx, "a", "m")
            .recorded("u1", "t3", "ip-3")
            .unwrap());
        // A new incarnation of the claim starts afresh.
        let again = Want {
            uid: "u2".into(),
            ..want
        };
        assert!(
            !ClaimAssignment::new(&ctx, "a", "m")
                .prepare(&again)
                .unwrap()
                .closed
        );
        assert!(ClaimAssignment::new(&ctx, "a", "m")
            .begin("u2", "t4", 100)
            .unwrap());
    }

    #[test]
    fn an_expired_intent_is_taken_over_by_one() {
        let kv = MemKv::new(Backend::Redis);
        let env = TestEnv::seeded(100, 2);
        let ctx = Ctx::auto(&kv, &env);
        let want = Want {
            uid: "u1".into(),
            address: "2001:db8::5".parse().unwrap(),
            device: Some("d1".into()),
            cloud: Default::default(),
        };
        ClaimAssignment::new(&ctx, "a", "m").prepare(&want).unwrap();
        assert!(ClaimAssignment::new(&ctx, "a", "m")
            .begin("u1", "t1", 100)
            .unwrap());
        assert!(!ClaimAssignment::new(&ctx, "a", "m")
            .take_over("u1", "t2", 100 + INTENT_LEASE_S - 1)
            .unwrap());
        assert!(ClaimAssignment::new(&ctx, "a", "m")
            .take_over("u1", "t2", 100 + INTENT_LEASE_S)
            .unwrap());
        assert!(!ClaimAssignment::new(&ctx, "a", "m")
            .take_over("u1", "t3", 100 + INTENT_LEASE_S)
            .unwrap());
        assert!(!ClaimAssignment::new(&ctx, "a", "m")
            .withdraw("t1", None)
            .unwrap());
        assert!(ClaimAssignment::new(&ctx, "a", "m")
            .withdraw("t2", Some("no"))
            .unwrap());
        assert_eq!(
            read(&kv, "a", "m").unwrap().unwrap().refused.as_deref(),
            Some("no")
        );
        // A refusal is not retried until the device changes.
        assert!(!ClaimAssignment::new(&ctx, "a", "m")
            .begin("u1", "t4", 500)
            .unwrap());
        let moved = Want {
            device: Some("d2".into()),
            cloud: Default::default(),
            ..want
        };
        assert_eq!(
            ClaimAssignment::new(&ctx, "a", "m")
                .prepare(&moved)
                .unwrap()
                .refused,
            None
        );
        assert!(ClaimAssignment::new(&ctx, "a", "m")
            .begin("u1", "t4", 500)
            .unwrap());
    }

    #[test]
    fn open_records_are_listed_and_closed_ones_leave_the_index() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::seeded(100, 5);
            let ctx = Ctx::auto(&kv, &env);
            let members = || {
                CLAIMS
                    .members(&ctx)
                    .unwrap()
                    .into_iter()
                    .collect::<Vec<_>>()
            };
            let want = |uid: &str| Want {
                uid: uid.into(),
                address: "10.0.0.5".parse().unwrap(),
                device: Some("d1".into()),
                cloud: Default::default(),
            };
            ClaimAssignment::new(&ctx, "a", "m")
                .prepare(&want("u1"))
                .unwrap();
            ClaimAssignment::new(&ctx, "a", "n")
                .prepare(&want("u9"))
                .unwrap();
            assert_eq!(members(), ["a/m", "a/n"], "{backend:?}");
            kv.reset_counts();
            ClaimAssignment::new(&ctx, "a", "m")
                .prepare(&want("u1"))
                .unwrap();
            assert_eq!(
                kv.counts().total(),
                1,
                "an open record's step reads no index"
            );
            assert_eq!(
                ClaimAssignment::new(&ctx, "a", "m").close("u1").unwrap(),
                Closing::Closed
            );
            // The next listing reads it closed and unlists it.
            let open: Vec<ClaimKey> = list_open(&ctx)
                .unwrap()
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            assert_eq!(open, [key("a", "n")]);
            assert_eq!(members(), ["a/n"]);
            // A new incarnation reopens it: listed before.
            assert!(
                !ClaimAssignment::new(&ctx, "a", "m")
                    .prepare(&want("u2"))
                    .unwrap()
                    .closed
            );
            assert_eq!(members(), ["a/m", "a/n"]);
            // Lost from the index (an older build's record): the reconcile's
            // repair lists it again, and only it.
            crate::kv::registry::remove(&ctx, &CLAIMS.id, &["a/m"]).unwrap();
            let claims = [key("a", "m"), key("a", "n"), key("a", "none")];
            assert_eq!(relist(&ctx, &claims).unwrap(), 1);
            assert_eq!(members(), ["a/m", "a/n"]);
        }
    }
}
