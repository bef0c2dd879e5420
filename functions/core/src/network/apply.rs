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
//!   how "the plan that `dryRun` shows is what apply does" is checked.
//!
//! VLAN batches are made and polled through a [`VlanBatches`]: in the
//! `network` component, the `attach-vlan` and `detach-vlan` steps (their
//! own components, reached by service chaining); the record and the lease
//! stay here, with the one writer.
//!
//! Nothing else is stored: each round re-reads the device and re-plans
//! ([`super::plan::plan`] is pure), so a converged device plans nothing and
//! makes no mutating call, and a device changed behind our back is planned
//! from what it is.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::batch::{BatchOp, Direction, VlanBatches};
use super::plan::{plan, Action, Desired, Observed, Step};
use super::profile::Mode;
use crate::error::{Error, ErrorKind, Result};
use crate::kv::protocol::{read_record, update_record, Enveloped, StateRecord, Step as KvStep};
use crate::kv::Ctx;
use crate::metal::client::{Metal, MetalError, PortChange};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::ports::Env;

/// Schema version of the apply record.
pub const APPLY_VERSION: u32 = 1;
/// How long a lease excludes other instances, in seconds: twice the time
/// an invocation may spend issuing steps (it stops starting new
/// rounds after half of it), so a slow holder never overlaps the next.
pub const LEASE_S: u64 = 120;
/// How long a running step may show no effect before it is planned again.
pub const RUNNING_S: u64 = 600;
/// Steps kept in the history.
pub const HISTORY: usize = 64;
/// Rounds (a poll or a call each) one invocation makes at most.
pub const MAX_ROUNDS: u32 = 16;
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
}

impl StepRecord {
    /// As stored.
    pub fn of(s: &Step) -> StepRecord {
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
        }
    }
}

/// The lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The holding invocation's token.
    pub owner: String,
    /// Unix seconds it ends at.
    pub until: u64,
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
    /// The last batch failure (Metal's messages), until a step succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// The value of a `net/device/<uuid>` key: the envelope and the
/// [`ApplyState`].
pub type ApplyRecord = Enveloped<ApplyState>;

impl StateRecord for ApplyState {
    type Id = str;
    const VERSION: u32 = APPLY_VERSION;
    const WHAT: &'static str = "network apply record";

    fn key(device: &str) -> String {
        format!("net/device/{device}")
    }
    fn guard_key(device: &str) -> String {
        format!("net-init/device/{device}")
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

fn change<K: KvStore, T>(
    ctx: &Ctx<'_, K>,
    device: &str,
    mut f: impl FnMut(&ApplyState) -> Option<(ApplyState, T)>,
    unchanged: impl Fn(&ApplyState) -> T,
) -> Result<T> {
    update_record::<K, ApplyRecord, T>(ctx, device, |cur| {
        let cur = cur.cloned().unwrap_or_default();
        match f(&cur) {
            Some((next, out)) => Ok(KvStep::Write(Box::new(next), out)),
            None => Ok(KvStep::Done(unchanged(&cur))),
        }
    })
}

/// Whether `device` has an apply record (it was applied to, and not
/// forgotten).
///
/// # Errors
/// Store errors.
pub fn has_record<K: KvStore>(kv: &K, device: &str) -> Result<bool> {
    Ok(kv.get(&ApplyState::key(device))?.is_some())
}

/// The devices with a step running (a batch or a mode change awaited):
/// what the Metal poll continues, so an apply left at 202 advances without
/// anyone POSTing again. One key listing and one read per device record.
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn running_devices<K: KvStore>(kv: &K) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for k in kv.list_keys()? {
        let Some(device) = k.strip_prefix("net/device/") else {
            continue;
        };
        if read(kv, device)?.running.is_some() {
            out.push(device.to_string());
        }
    }
    Ok(out)
}

/// Forgets a deleted device's record (and its creation guard): nothing of
/// the device is left to apply to or poll. An instance that was working on
/// the device when it went stops at its next read of the device (404
/// `DeviceNotFound`); its last swap may write the record back, lease
/// released, which is harmless (a device id never comes back) and costs
/// one key.
///
/// # Idempotency
/// Deleting absent keys changes nothing.
///
/// # Errors
/// Store errors.
pub fn forget<K: KvStore>(kv: &K, device: &str) -> Result<()> {
    kv.delete(&ApplyState::key(device))?;
    kv.delete(&ApplyState::guard_key(device))?;
    Ok(())
}

/// Takes the lease for `token` at `now`: `Ok(None)` when taken, `Ok(Some(s))`
/// when another holds it, `s` the seconds worth waiting (the lease's time
/// left, at most [`POLL_S`]: a holder releases it as its invocation ends).
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn take_lease<K: KvStore>(
    ctx: &Ctx<'_, K>,
    device: &str,
    token: &str,
    now: u64,
) -> Result<Option<u64>> {
    change(
        ctx,
        device,
        |s| match &s.lease {
            Some(l) if l.owner != token && now < l.until => None,
            _ => {
                let mut n = s.clone();
                n.lease = Some(Lease {
                    owner: token.to_string(),
                    until: now + LEASE_S,
                });
                Some((n, None))
            }
        },
        // A holder releases the lease when its invocation ends (well
        // before `until`): worth asking again after a poll interval.
        |s| {
            s.lease
                .as_ref()
                .map(|l| l.until.saturating_sub(now).clamp(1, POLL_S))
        },
    )
}

/// Releases `token`'s lease (if it still holds it).
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn release_lease<K: KvStore>(ctx: &Ctx<'_, K>, device: &str, token: &str) -> Result<()> {
    change(
        ctx,
        device,
        |s| match &s.lease {
            Some(l) if l.owner == token => {
                let mut n = s.clone();
                n.lease = None;
                Some((n, ()))
            }
            _ => None,
        },
        |_| (),
    )
}

/// Where an apply stands after an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
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

impl Phase {
    /// `converged` or `in-progress` (bodies and log outcomes).
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Converged => "converged",
            Phase::InProgress { .. } => "in-progress",
        }
    }

    /// Seconds after which running again is worthwhile; `None` when
    /// converged.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Phase::Converged => None,
            Phase::InProgress { retry_after, .. } => Some(*retry_after),
        }
    }
}

/// What an invocation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Where it stands.
    pub phase: Phase,
    /// The plan from the last observation (what is left).
    pub remaining: Vec<Step>,
    /// The steps this invocation issued.
    pub issued: Vec<Step>,
}

impl Report {
    /// As JSON (`phase`, `remaining`, `issued`).
    pub fn to_json(&self) -> Value {
        let mut v = json!({"phase": self.phase.name(),
            "remaining": self.remaining.iter().map(Step::to_json).collect::<Vec<_>>(),
            "issued": self.issued.iter().map(Step::to_json).collect::<Vec<_>>()});
        if let Phase::InProgress {
            waiting,
            retry_after,
        } = &self.phase
        {
            v["waiting"] = waiting.clone().into();
            v["retryAfter"] = (*retry_after).into();
        }
        v
    }
}

/// The device's ports as Metal reports them (one `GET /devices/{id}`
/// with its ports); `None` when the device does not exist.
///
/// # Errors
/// Metal errors; 500 for a port without a name.
pub fn observe_device<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    device: &str,
) -> Result<Option<Observed>> {
    metal
        .device_ports(device)?
        .map(|d| Observed::from_device(&d))
        .transpose()
}

/// [`observe_device`], for a device that must exist.
///
/// # Errors
/// 404 `DeviceNotFound`; as [`observe_device`].
pub fn observe<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    device: &str,
) -> Result<Observed> {
    observe_device(metal, device)?.ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            "DeviceNotFound",
            format!("device {device} does not exist in Metal"),
        )
    })
}

/// Observes the device and plans (no writes): what `dryRun` answers.
///
/// # Errors
/// 404 `DeviceNotFound`; 409 `NetworkFrozen`; Metal errors.
pub fn observe_and_plan<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    device: &str,
    desired: &Desired,
) -> Result<Vec<Step>> {
    plan(&observe(metal, device)?, desired)
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
/// the running step or issuing the next one (see the module docs).
///
/// # Idempotency
/// Any number of invocations, concurrent (one holds the lease, the others
/// answer in progress) or after a crash between any two operations,
/// converge to the desired state; a converged device costs one read and
/// no mutating call.
///
/// # Errors
/// 404 `DeviceNotFound`; 409 `NetworkFrozen`; 409 `VlanBatchFailed` or
/// `VlanBatchRefused` (a 422 on its creation) with Metal's messages (the
/// next invocation plans again); Metal unavailable
/// (503; the running step stays recorded); store errors.
pub fn apply<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    batches: &dyn VlanBatches,
    device: &str,
    desired: &Desired,
) -> Result<Report> {
    let token = ctx.env.token();
    if let Some(left) = take_lease(ctx, device, &token, ctx.env.now())? {
        return Ok(Report {
            phase: Phase::InProgress {
                waiting: "another instance is applying to this device".into(),
                retry_after: left,
            },
            remaining: Vec::new(),
            issued: Vec::new(),
        });
    }
    let out = rounds(ctx, metal, batches, device, desired);
    // Released whatever happened; a crash leaves it to expire.
    release_lease(ctx, device, &token)?;
    out
}

fn rounds<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    batches: &dyn VlanBatches,
    device: &str,
    desired: &Desired,
) -> Result<Report> {
    let mut issued = Vec::new();
    let started = ctx.env.now();
    for _ in 0..MAX_ROUNDS {
        let now = ctx.env.now();
        if now >= started + LEASE_S / 2 {
            break;
        }
        let state = read(ctx.kv, device)?;
        let observed = observe(metal, device)?;
        if let Some(r) = &state.running {
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
                        set_batch(ctx, device, &r.step, id)?;
                    }
                    found
                }
                (None, None) => None,
            };
            let done = match (&batch_id, dir) {
                (Some(b), Some(dir)) => {
                    let get = BatchOp::Get { batch: b.clone() };
                    let batch = batches.run(dir, &r.step.port_id, &get)?;
                    match batch {
                        Some(b) if b.state.as_deref() == Some("failed") => {
                            let msg = b.error_messages.join("; ");
                            finish(ctx, device, Some(msg.clone()))?;
                            return Err(Error::conflict(
                                "VlanBatchFailed",
                                format!("the VLAN batch on {} failed: {msg}", r.step.port),
                            ));
                        }
                        Some(b) => b.finished(),
                        None => true,
                    }
                }
                _ => effect_shows(&r.step, &observed),
            };
            if !done && now < r.at.saturating_add(RUNNING_S) {
                let remaining = plan(&observed, desired)?;
                return Ok(Report {
                    phase: Phase::InProgress {
                        waiting: format!("{} on {}", r.step.action, r.step.port),
                        retry_after: POLL_S,
                    },
                    remaining,
                    issued,
                });
            }
            finish(ctx, device, None)?;
            continue;
        }
        let steps = plan(&observed, desired)?;
        let Some(next) = steps.first().cloned() else {
            return Ok(Report {
                phase: Phase::Converged,
                remaining: steps,
                issued,
            });
        };
        issue(ctx, metal, batches, device, &next, now)?;
        issued.push(next);
    }
    let remaining = match observe_device(metal, device)? {
        Some(o) => plan(&o, desired)?,
        None => Vec::new(),
    };
    Ok(Report {
        phase: Phase::InProgress {
            waiting: "more steps".into(),
            retry_after: 1,
        },
        remaining,
        issued,
    })
}

/// Records the batch id of `step`, if `step` is still the running step
/// (no write when it is recorded already, or when another step runs: an
/// instance that outlived its lease must not lend its batch to a later
/// step).
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn set_batch<K: KvStore>(
    ctx: &Ctx<'_, K>,
    device: &str,
    step: &StepRecord,
    id: &str,
) -> Result<()> {
    change(
        ctx,
        device,
        |s| {
            let mut n = s.clone();
            let r = n.running.as_mut()?;
            if r.step != *step || r.batch.as_deref() == Some(id) {
                return None;
            }
            r.batch = Some(id.to_string());
            Some((n, ()))
        },
        |_| (),
    )
}

/// Clears the running step (recording a batch failure, if any).
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn finish<K: KvStore>(ctx: &Ctx<'_, K>, device: &str, failed: Option<String>) -> Result<()> {
    change(
        ctx,
        device,
        |s| {
            let mut n = s.clone();
            n.running = None;
            n.failed = failed.clone();
            Some((n, ()))
        },
        |_| (),
    )
}

/// Records `step` in the history and, when its effect shows only later
/// (everything but the native VLAN calls), as the running step: what an
/// invocation writes *before* making the step's Metal call. Returns whether
/// the step was recorded as running.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn record_step<K: KvStore>(
    ctx: &Ctx<'_, K>,
    device: &str,
    step: &Step,
    now: u64,
) -> Result<bool> {
    let rec = StepRecord::of(step);
    let is_async = !matches!(step.action, Action::SetNative(_) | Action::RemoveNative);
    change(
        ctx,
        device,
        |s| {
            let mut n = s.clone();
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
            Some((n, ()))
        },
        |_| (),
    )?;
    Ok(is_async)
}

/// Records `step` ([`record_step`]), then makes its call.
fn issue<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    batches: &dyn VlanBatches,
    device: &str,
    step: &Step,
    now: u64,
) -> Result<()> {
    let rec = StepRecord::of(step);
    let is_async = record_step(ctx, device, step, now)?;
    let id = step.port_id.as_str();
    let create = |dir: Direction, vlans: &[String]| {
        let op = BatchOp::Create {
            vlans: vlans.to_vec(),
        };
        batches.run(dir, id, &op)
    };
    let answer = match &step.action {
        Action::Assign(v) => create(Direction::Attach, v),
        Action::Unassign(v) => create(Direction::Detach, v),
        Action::Disbond { bulk } => metal
            .port_mode(id, PortChange::Disbond { bulk: *bulk })
            .map(|_| None),
        Action::Bond { bulk } => metal
            .port_mode(id, PortChange::Bond { bulk: *bulk })
            .map(|_| None),
        Action::ConvertLayer2 => metal.port_mode(id, PortChange::ConvertLayer2).map(|_| None),
        Action::ConvertLayer3 => metal.port_mode(id, PortChange::ConvertLayer3).map(|_| None),
        Action::SetNative(v) => metal.set_native_vlan(id, v).map(|_| None),
        Action::RemoveNative => metal.remove_native_vlan(id).map(|_| None),
    };
    match answer {
        Ok(Some(b)) => set_batch(ctx, device, &rec, &b.id),
        Ok(None) => Ok(()),
        // A refused batch: done if a re-read shows its VLANs (a no-op),
        // else reported with Metal's messages (nothing is running; the
        // next invocation plans again).
        Err(MetalError::Api {
            status: 422,
            messages,
            ..
        }) if matches!(step.action, Action::Assign(_) | Action::Unassign(_)) => {
            let shows = observe_device(metal, device)?.is_some_and(|o| effect_shows(&rec, &o));
            if shows {
                finish(ctx, device, None)
            } else {
                let msg = messages.join("; ");
                finish(ctx, device, Some(msg.clone()))?;
                Err(Error::conflict(
                    "VlanBatchRefused",
                    format!("Metal refused the VLAN batch on {}: {msg}", step.port),
                ))
            }
        }
        // A 422 on a mode change may be a no-op trap ("already …") or an
        // operation already under way: the step is polled by re-reading the
        // port (and re-planned if its effect never shows); a native VLAN
        // change counts only if a re-read shows it.
        Err(MetalError::Api { status: 422, .. }) if is_async => Ok(()),
        Err(e @ MetalError::Api { status: 422, .. }) => {
            let shows = observe_device(metal, device)?.is_some_and(|o| effect_shows(&rec, &o));
            if shows {
                Ok(())
            } else {
                Err(e.into())
            }
        }
        Err(e) => {
            if !matches!(e, MetalError::OutcomeUnknown { .. }) {
                finish(ctx, device, None)?;
            }
            Err(e.into())
        }
    }
}
