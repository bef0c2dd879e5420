//! Applying a plan to a device through Metal's port API: observe, plan,
//! execute one step, poll it to the end, repeat — resumable across
//! invocations, one writer per device at a time.
//!
//! The device's progress is one [`ApplyRecord`] under `net/device/<uuid>`
//! (the compare-and-swap protocol of [`crate::kv::protocol`]):
//! - a **lease** (`owner`, `until`): an invocation works on the device only
//!   after its swap took the lease (none, expired, or its own); another
//!   instance answers "in progress" (ask again within [`POLL_S`]). The lease is
//!   longer than an invocation ([`LEASE_S`]) and released at its end; a
//!   crashed holder's lease simply expires (no sleep anywhere);
//! - the **running** step: a Metal call whose effect shows later (a VLAN
//!   batch, `queued` → `completed`; a bond/disbond/convert, seen on a
//!   later read of the port). It is recorded *before* the call, so an
//!   instance that stops after the call leaves it to be polled, not
//!   repeated; a running step whose effect never shows is re-planned after
//!   [`RUNNING_S`];
//! - the **history** of the steps issued (the last [`HISTORY`]), which is
//!   how "the plan that `dryRun` shows is what apply does" is checked;
//! - the operator's **release** (`DELETE …/network`, see
//!   [`crate::capi::network`]): while it stands, an apply of the profile
//!   ([`apply_profile`]) does not take the lease, so nothing but the
//!   release itself works on the device.
//!
//! # The lease is fenced
//! Every write of the holder ([`DeviceRecord::record_step`], [`DeviceRecord::set_batch`], [`DeviceRecord::finish`])
//! checks, inside its compare-and-swap, that the record still names the
//! caller's token as the lease's owner and that the lease has not ended by
//! the caller's clock; a step is recorded only with at least [`CALL_S`]
//! seconds of the lease left, and right before the Metal call the holder
//! checks its own clock against the end of the lease it took (no store
//! operation in between). A holder that lost the lease (another instance
//! took it after it ended: the holder stalled) fails that check, makes no
//! call, and answers in progress. The arithmetic that makes a call end
//! inside the lease: the lease lasts [`LEASE_S`] (120 s); an invocation
//! starts no round after half of it (60 s); a step is recorded only with
//! more than [`CALL_S`] (10 s) left, and every Metal request (a chained
//! VLAN step included) is bounded by the client's 10 s budget, so a call
//! that starts ends by `until` at the latest. What the lease cannot
//! exclude is a holder that stalls *between* its last check and its call
//! for longer than the margin (a paused process): no store operation
//! separates them, and Metal takes no fencing token.
//!
//! VLAN batches are made and polled through a [`VlanBatches`]: in the
//! `network` component, the `attach-vlan` and `detach-vlan` steps (their
//! own components, reached by service chaining); the record and the lease
//! stay here, with the one writer.
//!
//! Nothing else is stored: each round re-reads the device and re-plans
//! ([`super::plan::plan`] is pure), so a converged device plans nothing and
//! makes no mutating call, and a device changed behind our back is planned
//! from what it is. A device found gone (404) is forgotten: its record
//! (lease and running step with it) is deleted.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::batch::{BatchError, BatchOp, Direction, VlanBatches};
use super::changes::MemberStep;
use super::plan::{plan, Action, Desired, Observed, PortStep};
use super::profile::Mode;
use crate::cloud::{missing, Capability, Cloud, CloudError, ModeChange, NicModes, Operation};
use crate::error::{Error, ErrorKind, Known, Result};
use crate::kv::lease::{self, Slot};
use crate::kv::protocol::{read_record, update_record, Decision, Enveloped, StateRecord};
use crate::kv::registry::{Index, RegistryId};
use crate::kv::{keys, Ctx};
use crate::ports::kv::KvStore;

/// Schema version of the apply record.
pub const APPLY_VERSION: u32 = 1;
/// How long a lease excludes other instances, in seconds: twice the time
/// an invocation may spend issuing steps (it stops starting new
/// rounds after half of it), so a slow holder never overlaps the next.
pub const LEASE_S: u64 = 120;
/// The longest a Metal call may take, in seconds (the client's request
/// budget; a chained VLAN step is one such request): a step is recorded,
/// and its call made, only with more than this left of the lease.
pub const CALL_S: u64 = 10;
/// How long a running step may show no effect before it is planned again.
pub const RUNNING_S: u64 = 600;
/// Steps kept in the history.
pub const HISTORY: usize = 64;
/// Rounds (a poll or a call each) one invocation makes at most.
pub const MAX_ROUNDS: u32 = 16;

/// What a call that ran out of rounds waits for (asked again after 1 s).
pub(super) const MORE_STEPS: &str = "more steps";
/// Seconds to wait before polling a running step again.
pub const POLL_S: u64 = 5;

/// A step as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepRecord {
    /// Port name.
    pub port: String,
    /// Port UUID.
    pub port_id: String,
    /// [`Action::name`].
    pub action: String,
    /// VLANs of a batch, or the native VLAN.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vlans: Vec<String>,
    /// `bulk` of a bond/disbond.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bulk: bool,
    /// The addresses of a membership change
    /// ([`super::memberships`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

impl StepRecord {
    /// As stored.
    pub fn of(s: &PortStep) -> StepRecord {
        let (vlans, bulk) = match &s.action {
            Action::Assign(v) | Action::Unassign(v) => (v.clone(), false),
            Action::SetNative(v) => (vec![v.clone()], false),
            Action::Bond { bulk } | Action::Disbond { bulk } => (Vec::new(), *bulk),
            _ => (Vec::new(), false),
        };
        StepRecord {
            port: s.port.clone(),
            port_id: s.port_id.clone(),
            action: s.action.name().to_string(),
            vlans,
            bulk,
            addresses: Vec::new(),
        }
    }
}

/// The lease ([`crate::kv::lease`], stored as `owner` and `until`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The holding invocation's token.
    pub owner: String,
    /// Unix seconds it ends at.
    pub until: u64,
}

impl lease::Lease for Lease {
    fn holder(&self) -> &str {
        &self.owner
    }
    fn ends(&self) -> u64 {
        self.until
    }
}

/// A step whose effect is awaited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Running {
    /// The step.
    pub step: StepRecord,
    /// The batch, for VLAN steps (once Metal answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// Unix seconds it was recorded.
    pub at: u64,
}

/// The operator's release of the device's network (`DELETE …/network`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Released {
    /// The profile annotation the Machine carried when it was released
    /// (`None`: none): the release stands while the annotation is the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Unix seconds it was asked.
    pub at: u64,
    /// Whether it is done: the device back to Layer3 without VLANs and the
    /// Machine's claims deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
}

/// What the record holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplyState {
    /// The lease, while an invocation works on the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// The step whose effect is awaited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<Running>,
    /// The steps issued, oldest first (the last [`HISTORY`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<StepRecord>,
    /// The last failure Metal reported (a failed or refused batch, a
    /// refused mode change: its messages), until a step succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// The operator's release, while it stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<Released>,
    /// The segments the membership apply joined ([`super::memberships`]):
    /// the only ones it leaves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joined: Vec<String>,
}

impl ApplyState {
    /// Whether `token` holds the lease at `now`.
    pub fn held_by(&self, token: &str, now: u64) -> bool {
        self.lease.held_by(token, now)
    }
}

/// The value of a `net/device/<uuid>` key: the envelope and the
/// [`ApplyState`].
pub type ApplyRecord = Enveloped<ApplyState>;

impl StateRecord for ApplyState {
    type Id = str;
    const VERSION: u32 = APPLY_VERSION;
    const WHAT: &'static str = "network apply record";

    fn key(device: &str) -> String {
        crate::kv::keys::net_device(device)
    }
    fn guard_key(device: &str) -> String {
        crate::kv::keys::net_device_init(device)
    }
    fn describe(device: &str) -> String {
        format!("the network of device {device}")
    }
}

/// The record of `device` (one `get`).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn read<K: KvStore>(kv: &K, device: &str) -> Result<ApplyState> {
    Ok(read_record::<K, ApplyRecord>(kv, device)?.unwrap_or_default())
}

/// The record of `device`, or `None` when it has none (one `get`).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn read_existing<K: KvStore>(kv: &K, device: &str) -> Result<Option<ApplyState>> {
    read_record::<K, ApplyRecord>(kv, device)
}

/// The devices with an apply record: the index the poll and reconcile
/// read instead of listing the store (`net-device-index`, a
/// [`crate::kv::registry::Index`]). A device is listed before its record
/// is created ([`change`]) and unlisted once the record is forgotten
/// ([`DeviceRecord::forget`]).
pub const DEVICES: Index = Index {
    id: RegistryId {
        key: keys::NET_DEVICE_INDEX,
        guard: keys::NET_DEVICE_INDEX_INIT,
    },
    member_of: device_of_key,
};

fn device_of_key(key: &str) -> Option<String> {
    keys::parse_net_device(key).map(str::to_string)
}

/// The apply record of one device: a handle naming the store and the
/// device, whose methods are the record's transitions (each one
/// read-modify-write of the record; the lease holder's fenced).
pub struct DeviceRecord<'a, 'k, K: KvStore> {
    ctx: &'a Ctx<'k, K>,
    device: &'a str,
}

impl<'a, 'k, K: KvStore> DeviceRecord<'a, 'k, K> {
    /// The record of `device` in `ctx`'s store.
    pub fn new(ctx: &'a Ctx<'k, K>, device: &'a str) -> Self {
        DeviceRecord { ctx, device }
    }

    /// One read-modify-write of the device's record. A write that would
    /// create the record is made only once the device is in [`DEVICES`], and
    /// checked there again once it landed (the index's rule 1).
    fn change<T>(
        &self,
        mut f: impl FnMut(&ApplyState) -> Result<Option<(ApplyState, T)>>,
        unchanged: impl Fn(&ApplyState) -> T,
    ) -> Result<T> {
        let mut listed = false;
        loop {
            let mut created = false;
            let out = update_record::<K, ApplyRecord, Option<T>>(self.ctx, self.device, |cur| {
                created = cur.is_none();
                let state = cur.cloned().unwrap_or_default();
                match f(&state)? {
                    Some(_) if created && !listed => Ok(Decision::Done(None)),
                    Some((next, out)) => Ok(Decision::Write(Box::new(next), Some(out))),
                    None => Ok(Decision::Done(Some(unchanged(&state)))),
                }
            })?;
            match out {
                Some(out) => {
                    if listed && created {
                        DEVICES.ensure(self.ctx, self.device)?;
                    }
                    return Ok(out);
                }
                None => {
                    DEVICES.ensure(self.ctx, self.device)?;
                    listed = true;
                }
            }
        }
    }

    /// A write of the lease's holder, fenced ([`lease::fence`]): inside the
    /// compare-and-swap, `token` must hold the lease on `device` at `at()`
    /// (read on each attempt); then `f` edits a copy of the record and says
    /// whether to write it.
    ///
    /// # Errors
    /// 409 `LeaseLost` when `token` does not hold the lease; store errors;
    /// 503 `Contention`.
    fn fenced(
        &self,
        token: &str,
        at: impl Fn() -> u64,
        mut f: impl FnMut(&mut ApplyState) -> bool,
    ) -> Result<()> {
        self.change(
            |s| {
                lease::fence(&s.lease, token, at(), &format!("device {}", self.device))?;
                let mut n = s.clone();
                Ok(f(&mut n).then_some((n, ())))
            },
            |_| (),
        )
    }

    /// Forgets a deleted device's record (its creation guard and any noted
    /// creation stall too: `kv::protocol::forget_record`), then unlists it
    /// from [`DEVICES`] (unless a record came back meanwhile): nothing of the
    /// device is left to apply to or poll. An instance that was working on
    /// the device when it went stops at its next read of the device (404
    /// `DeviceNotFound`); its last swap may write the record back, lease
    /// released, which is harmless (a device id never comes back) and costs
    /// one key, unlisted (nothing reads it again).
    ///
    /// # Idempotency
    /// Deleting absent keys changes nothing.
    ///
    /// # Errors
    /// Store errors.
    pub fn forget(&self) -> Result<()> {
        crate::kv::protocol::forget_record::<K, ApplyRecord>(self.ctx.kv, self.device)?;
        DEVICES.unlist(self.ctx, self.device, || {
            Ok(read_existing(self.ctx.kv, self.device)?.is_some())
        })?;
        Ok(())
    }

    /// Records the operator's release of `device` (`profile`: the Machine's
    /// profile annotation, if any), not done yet. A release already recorded
    /// for the same annotation is kept as it is (done or not).
    ///
    /// # Idempotency
    /// Asking again changes nothing.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn mark_released(&self, profile: Option<&str>, now: u64) -> Result<()> {
        self.change(
            |s| {
                if s.released
                    .as_ref()
                    .is_some_and(|r| r.profile.as_deref() == profile)
                {
                    return Ok(None);
                }
                let mut n = s.clone();
                n.released = Some(Released {
                    profile: profile.map(str::to_string),
                    at: now,
                    done: false,
                });
                Ok(Some((n, ())))
            },
            |_| (),
        )
    }

    /// Marks the operator's release of `device` done (if one stands).
    ///
    /// # Idempotency
    /// No write when there is none or it is done already.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn release_done(&self) -> Result<()> {
        self.change(
            |s| {
                let mut n = s.clone();
                match n.released.as_mut() {
                    Some(r) if !r.done => {
                        r.done = true;
                        Ok(Some((n, ())))
                    }
                    _ => Ok(None),
                }
            },
            |_| (),
        )
    }

    /// Withdraws the operator's release of `device` (an explicit apply, or the
    /// Machine's annotation changed): the profile may be applied again.
    ///
    /// # Idempotency
    /// No write when there is none.
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn clear_released(&self) -> Result<()> {
        self.change(
            |s| {
                if s.released.is_none() {
                    return Ok(None);
                }
                let mut n = s.clone();
                n.released = None;
                Ok(Some((n, ())))
            },
            |_| (),
        )
    }

    fn lease_for(&self, token: &str, now: u64, honour_release: bool) -> Result<Taken> {
        self.change(
            |s| {
                if honour_release && s.released.is_some() {
                    return Ok(None);
                }
                let mut n = s.clone();
                let mine = Lease {
                    owner: token.to_string(),
                    until: now + LEASE_S,
                };
                Ok(n.lease.acquire(mine, now).then_some((n, Taken::Held)))
            },
            // A holder releases the lease when its invocation ends (well
            // before `until`): worth asking again after a poll interval.
            |s| match &s.lease {
                _ if honour_release && s.released.is_some() => Taken::Released,
                Some(l) => Taken::Busy(l.until.saturating_sub(now).clamp(1, POLL_S)),
                None => Taken::Busy(1),
            },
        )
    }

    /// Takes the lease for `token` at `now` (until `now + LEASE_S`):
    /// `Ok(None)` when taken, `Ok(Some(s))` when another holds it, `s` the
    /// seconds worth waiting (the lease's time left, at most [`POLL_S`]: a
    /// holder releases it as its invocation ends).
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn take_lease(&self, token: &str, now: u64) -> Result<Option<u64>> {
        Ok(match self.lease_for(token, now, false)? {
            Taken::Held => None,
            Taken::Busy(s) => Some(s),
            Taken::Released => Some(POLL_S),
        })
    }

    /// Releases `token`'s lease (if it still holds it).
    ///
    /// # Errors
    /// Store errors; 503 `Contention`.
    pub fn release_lease(&self, token: &str) -> Result<()> {
        self.change(
            |s| {
                let mut n = s.clone();
                Ok(n.lease.release(token).then_some((n, ())))
            },
            |_| (),
        )
    }

    /// Records the batch id of `step`, if `step` is still the running step
    /// (no write when it is recorded already, or when another step runs: an
    /// instance that outlived its lease must not lend its batch to a later
    /// step). Only the lease's holder (`token`, by the clock) writes.
    ///
    /// # Errors
    /// 409 `LeaseLost` when `token` no longer holds the lease; store errors;
    /// 503 `Contention`.
    pub fn set_batch(&self, token: &str, step: &StepRecord, id: &str) -> Result<()> {
        self.fenced(
            token,
            || self.ctx.env.now(),
            |n| {
                let Some(r) = n.running.as_mut() else {
                    return false;
                };
                if r.step != *step || r.batch.as_deref() == Some(id) {
                    return false;
                }
                r.batch = Some(id.to_string());
                true
            },
        )
    }

    /// Clears the running step (recording Metal's failure, if any). Only the
    /// lease's holder (`token`, by the clock) writes.
    ///
    /// # Errors
    /// 409 `LeaseLost` when `token` no longer holds the lease; store errors;
    /// 503 `Contention`.
    pub fn finish(&self, token: &str, failed: Option<String>) -> Result<()> {
        self.fenced(
            token,
            || self.ctx.env.now(),
            |n| {
                n.running = None;
                n.failed = failed.clone();
                true
            },
        )
    }

    /// Records `step` in the history and, when its effect shows only later
    /// (everything but the native VLAN calls), as the running step: what an
    /// invocation writes *before* making the step's Metal call. Only the
    /// lease's holder (`token`) writes, and only with more than [`CALL_S`]
    /// seconds of its lease left at `now`. Returns whether the step was
    /// recorded as running.
    ///
    /// # Errors
    /// 409 `LeaseLost` when `token` does not hold the lease for that long;
    /// store errors; 503 `Contention`.
    pub fn record_step(&self, token: &str, step: &PortStep, now: u64) -> Result<bool> {
        let rec = StepRecord::of(step);
        let is_async = !matches!(step.action, Action::SetNative(_) | Action::RemoveNative);
        self.fenced(
            token,
            || now + CALL_S,
            |n| {
                if is_async {
                    n.running = Some(Running {
                        step: rec.clone(),
                        batch: None,
                        at: now,
                    });
                }
                n.history.push(rec.clone());
                let excess = n.history.len().saturating_sub(HISTORY);
                n.history.drain(..excess);
                true
            },
        )?;
        Ok(is_async)
    }

    /// Records a membership change ([`super::memberships`]) as the running
    /// step and in the history, with the segments the apply owns after it
    /// (`joined`), in one write: what an invocation writes *before* the
    /// call. Fenced as [`DeviceRecord::record_step`].
    ///
    /// # Errors
    /// 409 `LeaseLost` when `token` does not hold the lease for that long;
    /// store errors; 503 `Contention`.
    pub fn record_change(
        &self,
        token: &str,
        rec: &StepRecord,
        joined: &[String],
        now: u64,
    ) -> Result<()> {
        self.fenced(
            token,
            || now + CALL_S,
            |n| {
                n.running = Some(Running {
                    step: rec.clone(),
                    batch: None,
                    at: now,
                });
                n.joined = joined.to_vec();
                n.history.push(rec.clone());
                let excess = n.history.len().saturating_sub(HISTORY);
                n.history.drain(..excess);
                true
            },
        )
    }

    /// Sets the segments the membership apply owns (those it left are
    /// dropped). Only the lease's holder writes.
    ///
    /// # Errors
    /// 409 `LeaseLost`; store errors; 503 `Contention`.
    pub fn set_joined(&self, token: &str, joined: &[String]) -> Result<()> {
        self.fenced(
            token,
            || self.ctx.env.now(),
            |n| {
                if n.joined == joined {
                    return false;
                }
                n.joined = joined.to_vec();
                true
            },
        )
    }
}

/// The error of a holder whose lease on `device` ended.
pub fn lease_lost(device: &str) -> Error {
    lease::lost(&format!("device {device}"))
}

/// Whether an error is [`lease::lost`]'s.
fn is_lease_lost(e: &Error) -> bool {
    e.is(Known::LeaseLost)
}

/// Every device with an apply record, and the record: [`DEVICES`]' members
/// (one `get`), then one `get` per member; a member whose record is gone
/// (a forget that stopped half-way, or a creation that never landed) is
/// unlisted. Reads no other key, and lists the store only once, on a store
/// written before the index.
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn records<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Vec<(String, ApplyState)>> {
    let mut out = Vec::new();
    for device in DEVICES.members(ctx)? {
        match read_existing(ctx.kv, &device)? {
            Some(state) => out.push((device, state)),
            None => {
                DEVICES.unlist(ctx, &device, || {
                    Ok(read_existing(ctx.kv, &device)?.is_some())
                })?;
            }
        }
    }
    Ok(out)
}

/// The devices with an apply record ([`records`]).
///
/// # Errors
/// As [`records`].
pub fn devices<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Vec<String>> {
    Ok(records(ctx)?.into_iter().map(|(d, _)| d).collect())
}

/// The devices with a step running (a batch or a mode change awaited):
/// what the Metal poll continues, so an apply left at 202 advances without
/// anyone POSTing again ([`records`]: one read of the index and one per
/// device record).
///
/// # Errors
/// As [`records`].
pub fn running_devices<K: KvStore>(ctx: &Ctx<'_, K>) -> Result<Vec<String>> {
    Ok(records(ctx)?
        .into_iter()
        .filter(|(_, s)| s.running.is_some())
        .map(|(d, _)| d)
        .collect())
}

/// What [`DeviceRecord::take_lease`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// The caller holds the lease now.
    Held,
    /// Another instance holds it: seconds worth waiting.
    Busy(u64),
    /// The operator released the device (only when asked to honour it).
    Released,
}

/// Where an apply stands after an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyPhase {
    /// The device is as desired: nothing left to do.
    Converged,
    /// A step is running, or another instance holds the device: run again
    /// after the seconds given.
    InProgress {
        /// What is awaited.
        waiting: String,
        /// Seconds until running again is worthwhile.
        retry_after: u64,
    },
}

impl ApplyPhase {
    /// `converged` or `in-progress` (bodies and log outcomes).
    pub fn name(&self) -> &'static str {
        match self {
            ApplyPhase::Converged => "converged",
            ApplyPhase::InProgress { .. } => "in-progress",
        }
    }

    /// Seconds after which running again is worthwhile; `None` when
    /// converged.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApplyPhase::Converged => None,
            ApplyPhase::InProgress { retry_after, .. } => Some(*retry_after),
        }
    }
}

/// A step of an apply: a port call (Metal) or a membership change
/// (phoenixNAP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A port call.
    Port(PortStep),
    /// A membership change.
    Member(MemberStep),
}

impl Step {
    /// As JSON (what `dryRun` answers).
    pub fn to_json(&self) -> Value {
        match self {
            Step::Port(p) => p.to_json(),
            Step::Member(m) => m.to_json(),
        }
    }

    /// The port call, if it is one.
    pub fn port(self) -> Option<PortStep> {
        match self {
            Step::Port(p) => Some(p),
            Step::Member(_) => None,
        }
    }
}

/// What an invocation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    /// Where it stands.
    pub phase: ApplyPhase,
    /// The plan from the last observation (what is left).
    pub remaining: Vec<Step>,
    /// The steps this invocation issued.
    pub issued: Vec<Step>,
}

impl ApplyReport {
    /// As JSON (`phase`, `remaining`, `issued`).
    pub fn to_json(&self) -> Value {
        let mut v = json!({"phase": self.phase.name(),
            "remaining": self.remaining.iter().map(Step::to_json).collect::<Vec<_>>(),
            "issued": self.issued.iter().map(Step::to_json).collect::<Vec<_>>()});
        if let ApplyPhase::InProgress {
            waiting,
            retry_after,
        } = &self.phase
        {
            v["waiting"] = waiting.clone().into();
            v["retryAfter"] = (*retry_after).into();
        }
        v
    }

    fn waiting(waiting: &str, retry_after: u64) -> ApplyReport {
        ApplyReport::in_progress(waiting.into(), retry_after, Vec::new(), Vec::new())
    }

    /// In progress: `waiting` for what, asked again after `retry_after`
    /// seconds.
    pub(super) fn in_progress(
        waiting: String,
        retry_after: u64,
        remaining: Vec<Step>,
        issued: Vec<Step>,
    ) -> ApplyReport {
        ApplyReport {
            phase: ApplyPhase::InProgress {
                waiting,
                retry_after,
            },
            remaining,
            issued,
        }
    }
}

/// The device's ports as the cloud reports them (one
/// [`Cloud::device_nics`]: on Metal `GET /devices/{id}` with its ports);
/// `None` when the device does not exist.
///
/// # Errors
/// The cloud's errors; 500 for a port without a name.
pub fn observe_device<C: Cloud + ?Sized>(cloud: &C, device: &str) -> Result<Option<Observed>> {
    cloud
        .device_nics(device)?
        .map(|d| Observed::from_device(&d))
        .transpose()
}

/// The error of a device that does not exist in Metal.
pub fn device_not_found(device: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        "DeviceNotFound",
        format!("device {device} does not exist in Metal"),
    )
}

/// [`observe_device`], for a device that must exist.
///
/// # Errors
/// 404 `DeviceNotFound`; as [`observe_device`].
pub fn observe<C: Cloud + ?Sized>(cloud: &C, device: &str) -> Result<Observed> {
    observe_device(cloud, device)?.ok_or_else(|| device_not_found(device))
}

/// Observes the device and plans (no writes): what `dryRun` answers.
///
/// # Errors
/// 404 `DeviceNotFound`; 409 `NetworkFrozen`; Metal errors.
pub fn observe_and_plan<C: Cloud + ?Sized>(
    cloud: &C,
    device: &str,
    desired: &Desired,
) -> Result<Vec<PortStep>> {
    plan(&observe(cloud, device)?, desired)
}

/// The batch step a recorded action runs through (`None`: not a batch).
fn direction(action: &str) -> Option<Direction> {
    match action {
        "assign-vlans" => Some(Direction::Attach),
        "unassign-vlans" => Some(Direction::Detach),
        _ => None,
    }
}

/// Whether the effect of `step` shows on `observed` (how a step without a
/// batch id, or a call Metal answered 422, is confirmed: by re-reading).
fn effect_shows(step: &StepRecord, observed: &Observed) -> bool {
    let port = observed.ports.iter().find(|p| p.id == step.port_id);
    let Some(port) = port else { return false };
    let layer2 = matches!(port.mode, Some(Mode::Layer2Bonded | Mode::Layer2Individual));
    match step.action.as_str() {
        "bond" => port.bonded,
        "disbond" => !port.bonded,
        "convert-layer2" => layer2,
        "convert-layer3" => !layer2,
        "assign-vlans" => step.vlans.iter().all(|v| port.vlans.contains(v)),
        "unassign-vlans" => step.vlans.iter().all(|v| !port.vlans.contains(v)),
        "set-native-vlan" => port.native.as_ref() == step.vlans.first(),
        "remove-native-vlan" => port.native.is_none(),
        _ => false,
    }
}

/// Applies `desired` to `device`: up to [`MAX_ROUNDS`] rounds of polling
/// the running step or issuing the next one (see the module docs), whether
/// or not the operator released the device (the release itself runs
/// through here; an apply of the profile is [`apply_profile`]).
///
/// # Idempotency
/// Any number of invocations, concurrent (one holds the lease, the others
/// answer in progress) or after a crash between any two operations,
/// converge to the desired state; a converged device costs one read and
/// no mutating call.
///
/// # Errors
/// 404 `DeviceNotFound` (the device's record is forgotten); 409
/// `NetworkFrozen`; 409 `VlanBatchFailed`, `VlanBatchRefused` (a 422 on
/// its creation) or `PortChangeRefused` (a 422 on a mode change whose
/// effect a re-read does not show) with Metal's messages, kept in the
/// record's `failed` (the next invocation plans again); 500
/// `VlanStepFailed` when a VLAN step's component failed without reaching
/// Metal; Metal unavailable (503; the running step stays recorded); store
/// errors.
pub fn apply<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    batches: &dyn VlanBatches,
    device: &str,
    desired: &Desired,
) -> Result<ApplyReport> {
    run(ctx, cloud, batches, device, desired, false).map(|r| r.unwrap_or_else(released_report))
}

/// [`apply`] for a profile: `None` when the operator released the device
/// (the lease is not taken, nothing is called).
///
/// # Idempotency
/// As [`apply`].
///
/// # Errors
/// As [`apply`].
pub fn apply_profile<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    batches: &dyn VlanBatches,
    device: &str,
    desired: &Desired,
) -> Result<Option<ApplyReport>> {
    run(ctx, cloud, batches, device, desired, true)
}

fn released_report() -> ApplyReport {
    ApplyReport::waiting("the operator released this device", POLL_S)
}

fn run<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    batches: &dyn VlanBatches,
    device: &str,
    desired: &Desired,
    honour_release: bool,
) -> Result<Option<ApplyReport>> {
    under_lease(ctx, device, honour_release, |holder, started| {
        rounds(ctx, cloud, batches, device, desired, holder, started)
    })
}

/// Runs `work` (given the lease and when it was taken) under the device's
/// lease: taken first (in progress when another instance holds it; `None`
/// when `honour_release` and the operator released the device), released
/// after, whatever happened (a crash leaves it to expire). A `work` that
/// finds its lease lost answers in progress.
///
/// # Errors
/// `work`'s; store errors.
pub(crate) fn under_lease<K: KvStore>(
    ctx: &Ctx<'_, K>,
    device: &str,
    honour_release: bool,
    work: impl FnOnce(&Holder<'_>, u64) -> Result<ApplyReport>,
) -> Result<Option<ApplyReport>> {
    let record = DeviceRecord::new(ctx, device);
    let token = ctx.env.token();
    let now = ctx.env.now();
    match record.lease_for(&token, now, honour_release)? {
        Taken::Held => {}
        Taken::Busy(left) => {
            return Ok(Some(ApplyReport::waiting(
                "another instance is applying to this device",
                left,
            )))
        }
        Taken::Released => return Ok(None),
    }
    // The record is alive and ours for now: listed, whatever happened to
    // its member (a crash half-way through a forget racing its
    // re-creation, a record written back after a forget, or written by an
    // older build): one `get` when it is.
    DEVICES.ensure(ctx, device)?;
    let holder = Holder {
        token: &token,
        until: now + LEASE_S,
    };
    let out = match work(&holder, now) {
        // The lease passed on (this instance stalled): the new holder
        // goes on; nothing was called outside the lease.
        Err(e) if is_lease_lost(&e) => Ok(ApplyReport::waiting(
            "the lease passed to another instance",
            POLL_S,
        )),
        other => other,
    };
    // Released whatever happened; a crash leaves it to expire.
    record.release_lease(&token)?;
    out.map(Some)
}

/// The lease an invocation took: its token and when it ends.
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    /// The lease's owner token.
    pub token: &'a str,
    /// Unix seconds it ends at.
    pub until: u64,
}

impl Holder<'_> {
    /// Whether a call started at `now` ends inside the lease: more than
    /// [`CALL_S`] left. Checked right before each Metal call, on the
    /// holder's own clock (no store operation).
    pub fn may_call(&self, now: u64) -> bool {
        now + CALL_S < self.until
    }
}

/// The apply's loop under the lease: up to [`MAX_ROUNDS`] rounds (within
/// half the lease) of waiting out the running step or issuing the plan's
/// next one; the report says what was issued and what remains.
fn rounds<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    batches: &dyn VlanBatches,
    device: &str,
    desired: &Desired,
    holder: &Holder<'_>,
    started: u64,
) -> Result<ApplyReport> {
    let record = DeviceRecord::new(ctx, device);
    let mut issued = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let now = ctx.env.now();
        if now >= started + LEASE_S / 2 {
            break;
        }
        let state = read(ctx.kv, device)?;
        let observed = match observe_device(cloud, device)? {
            Some(o) => o,
            None => {
                // Gone: nothing of it is left to apply to or poll.
                record.forget()?;
                return Err(device_not_found(device));
            }
        };
        if let Some(r) = &state.running {
            let done = running_done(ctx, batches, device, holder, r, &observed)?;
            if !done && now < r.at.saturating_add(RUNNING_S) {
                let waiting = format!("{} on {}", r.step.action, r.step.port);
                let remaining = ports(plan(&observed, desired)?);
                return Ok(ApplyReport::in_progress(waiting, POLL_S, remaining, issued));
            }
            record.finish(holder.token, None)?;
            continue;
        }
        let steps = plan(&observed, desired)?;
        let Some(next) = steps.first().cloned() else {
            return Ok(ApplyReport {
                phase: ApplyPhase::Converged,
                remaining: ports(steps),
                issued,
            });
        };
        issue(ctx, cloud, batches, device, &next, holder)?;
        issued.push(Step::Port(next));
    }
    let remaining = match observe_device(cloud, device)? {
        Some(o) => ports(plan(&o, desired)?),
        None => Vec::new(),
    };
    Ok(ApplyReport::in_progress(
        MORE_STEPS.into(),
        1,
        remaining,
        issued,
    ))
}

fn ports(steps: Vec<PortStep>) -> Vec<Step> {
    steps.into_iter().map(Step::Port).collect()
}

/// Whether the running step `r` is over: its batch finished or is gone,
/// or (a port change, or a batch never found) its effect shows in
/// `observed`.
///
/// # Errors
/// 409 `VlanBatchFailed` (recorded) when Metal failed the batch; the
/// batch calls' and the store's errors.
fn running_done<K: KvStore>(
    ctx: &Ctx<'_, K>,
    batches: &dyn VlanBatches,
    device: &str,
    holder: &Holder<'_>,
    r: &Running,
    observed: &Observed,
) -> Result<bool> {
    let record = DeviceRecord::new(ctx, device);
    let dir = direction(&r.step.action);
    let batch_id = match (&r.batch, dir) {
        (Some(b), _) => Some(b.clone()),
        // A batch whose creation's answer was lost: the port's
        // unfinished batch is the one (one at a time per port).
        (None, Some(dir)) => {
            let found = batches
                .run(dir, &r.step.port_id, &BatchOp::Find {})?
                .map(|b| b.id);
            if let Some(id) = &found {
                record.set_batch(holder.token, &r.step, id)?;
            }
            found
        }
        (None, None) => None,
    };
    let (Some(b), Some(dir)) = (&batch_id, dir) else {
        return Ok(effect_shows(&r.step, observed));
    };
    let get = BatchOp::Get { batch: b.clone() };
    match batches.run(dir, &r.step.port_id, &get)? {
        Some(b) if b.state.as_deref() == Some("failed") => {
            let msg = b.error_messages.join("; ");
            record.finish(holder.token, Some(msg.clone()))?;
            Err(Error::conflict(
                "VlanBatchFailed",
                format!("the VLAN batch on {} failed: {msg}", r.step.port),
            ))
        }
        Some(b) => Ok(b.finished()),
        None => Ok(true),
    }
}

/// Makes `step`'s Metal call: a VLAN batch created (answered), or a port
/// change (no batch).
///
/// # Errors
/// As [`VlanBatches::run`]; a port call's error as [`BatchError::Cloud`].
fn call<C: Cloud + ?Sized>(
    cloud: &C,
    batches: &dyn VlanBatches,
    step: &PortStep,
) -> std::result::Result<Option<Operation>, BatchError> {
    let id = step.port_id.as_str();
    let create = |dir: Direction, vlans: &[String]| {
        let op = BatchOp::Create {
            vlans: vlans.to_vec(),
        };
        batches.run(dir, id, &op)
    };
    let modes = || nic_modes(cloud, step).map_err(BatchError::Step);
    let mode = |change: ModeChange| {
        modes()?
            .change_mode(id, change)
            .map(|_| None)
            .map_err(BatchError::Cloud)
    };
    match &step.action {
        Action::Assign(v) => create(Direction::Attach, v),
        Action::Unassign(v) => create(Direction::Detach, v),
        Action::Disbond { bulk } => mode(ModeChange::Disbond { bulk: *bulk }),
        Action::Bond { bulk } => mode(ModeChange::Bond { bulk: *bulk }),
        Action::ConvertLayer2 => mode(ModeChange::ConvertLayer2),
        Action::ConvertLayer3 => mode(ModeChange::ConvertLayer3),
        Action::SetNative(v) => modes()?
            .set_native(id, v)
            .map(|_| None)
            .map_err(BatchError::Cloud),
        Action::RemoveNative => modes()?
            .remove_native(id)
            .map(|_| None)
            .map_err(BatchError::Cloud),
    }
}

/// The capability `step` needs beyond the seam: a mode or native-VLAN
/// step's (VLAN batches need none).
fn capability_of(action: &Action) -> Option<Capability> {
    match action {
        Action::Assign(_) | Action::Unassign(_) => None,
        Action::SetNative(_) | Action::RemoveNative => Some(Capability::NativeSegment),
        Action::Disbond { .. } | Action::Bond { .. } => Some(Capability::Bonding),
        Action::ConvertLayer2 | Action::ConvertLayer3 => Some(Capability::NicModes),
    }
}

/// The cloud's NIC modes for `step` (a mode or native-VLAN step).
///
/// # Errors
/// 422 `CapabilityMissing` naming the capability, when the cloud lacks
/// the one the step needs or has no NIC modes at all.
fn nic_modes<'c, C: Cloud + ?Sized>(cloud: &'c C, step: &PortStep) -> Result<&'c dyn NicModes> {
    let need = capability_of(&step.action).unwrap_or(Capability::NicModes);
    let what = format!("{} on {}", step.action.name(), step.port);
    cloud.capabilities().require(cloud.name(), need, &what)?;
    cloud
        .nic_modes()
        .ok_or_else(|| missing(cloud.name(), Capability::NicModes, &what))
}

/// The 409 for Metal refusing `step` with `msg`: `VlanBatchRefused` or
/// `PortChangeRefused`.
fn refused(step: &PortStep, msg: &str) -> Error {
    let (reason, what) = match &step.action {
        Action::Assign(_) | Action::Unassign(_) => ("VlanBatchRefused", "the VLAN batch"),
        _ => ("PortChangeRefused", step.action.name()),
    };
    Error::conflict(
        reason,
        format!("Metal refused {what} on {}: {msg}", step.port),
    )
}

/// Records `step` ([`DeviceRecord::record_step`]), then makes its call, if the lease
/// still leaves time for it.
fn issue<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    batches: &dyn VlanBatches,
    device: &str,
    step: &PortStep,
    holder: &Holder<'_>,
) -> Result<()> {
    let record = DeviceRecord::new(ctx, device);
    // A step the cloud cannot make is refused before it is recorded.
    if capability_of(&step.action).is_some() {
        nic_modes(cloud, step)?;
    }
    let rec = StepRecord::of(step);
    let is_async = record.record_step(holder.token, step, ctx.env.now())?;
    // The fence's last check, on this instance's own clock: the call must
    // end inside the lease.
    if !holder.may_call(ctx.env.now()) {
        return Err(lease::lost(&format!("device {device}")));
    }
    let token = holder.token;
    match call(cloud, batches, step) {
        Ok(Some(b)) => record.set_batch(token, &rec, &b.id),
        Ok(None) => Ok(()),
        // A 422: done if a re-read shows the step's effect (Metal's no-op
        // traps, "already …"), else a refusal, reported with Metal's
        // messages and kept in the record (nothing is running; the next
        // invocation plans again).
        Err(BatchError::Cloud(e @ CloudError::Api { status: 422, .. })) => {
            let shows = observe_device(cloud, device)?.is_some_and(|o| effect_shows(&rec, &o));
            if shows {
                return if is_async {
                    record.finish(token, None)
                } else {
                    Ok(())
                };
            }
            let CloudError::Api { messages, .. } = &e else {
                return Err(e.into());
            };
            let msg = messages.join("; ");
            record.finish(token, Some(msg.clone()))?;
            Err(refused(step, &msg))
        }
        // The step's component failed before reaching Metal: nothing was
        // made.
        Err(BatchError::Step(e)) => {
            record.finish(token, Some(e.message().to_string()))?;
            Err(e)
        }
        Err(BatchError::Cloud(e)) => {
            if is_async && !matches!(e, CloudError::OutcomeUnknown { .. }) {
                record.finish(token, None)?;
            }
            Err(e.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Backend, MemKv, TestEnv};

    #[test]
    fn apply_records_are_listed_while_they_exist() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::seeded(100, 6);
            let ctx = Ctx::auto(&kv, &env);
            let listed = || {
                DEVICES
                    .members(&ctx)
                    .unwrap()
                    .into_iter()
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                DeviceRecord::new(&ctx, "d1").take_lease("t", 100).unwrap(),
                None
            );
            assert_eq!(
                DeviceRecord::new(&ctx, "d2").take_lease("t", 100).unwrap(),
                None
            );
            assert_eq!(listed(), ["d1", "d2"], "{backend:?}");
            // Writes to an existing record touch no index.
            kv.reset_counts();
            DeviceRecord::new(&ctx, "d1").release_lease("t").unwrap();
            assert_eq!(kv.counts().list_keys, 0);
            assert_eq!(listed(), ["d1", "d2"]);
            DeviceRecord::new(&ctx, "d1").forget().unwrap();
            assert_eq!(listed(), ["d2"]);
            // A member whose record is gone (a forget stopped half-way) is
            // dropped by the next listing.
            DEVICES.ensure(&ctx, "d3").unwrap();
            assert_eq!(devices(&ctx).unwrap(), ["d2"]);
            assert_eq!(listed(), ["d2"]);
            assert!(running_devices(&ctx).unwrap().is_empty());
        }
    }
}
