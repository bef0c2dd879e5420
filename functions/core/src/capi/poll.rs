//! The Metal event poll, the Kubernetes side: the devices Metal's events
//! name (or, on a resync, every device the store knows) are handled —
//! claims on a device that became active get their assignments, claims on
//! a deleted device are told and their Machine's network released, the
//! Machine on an active device has its network profile applied — in
//! bounded work per call, on top of the claim assignment step
//! ([`super::assign`]) and the machine network step ([`super::network`]).
//!
//! # Progress, whatever one object does
//! The event cursor and the devices still to handle are
//! [`crate::provision::poll`]'s record: events are *ingested* first (the
//! cursor moves past every event read, its devices become pending), then
//! pending devices are handled oldest first within [`MAX_POLL_CLAIMS`]
//! claim steps, [`MAX_POLL_MACHINES`] machine steps and [`POLL_TIME_S`]
//! seconds per call (a device is handled whole; a first device with more
//! claims than the budget is still handled), and leave `pending` once
//! handled. A claim or a machine that fails is reported (its step writes
//! its condition, the report lists it) and retried by the reconcile run,
//! which syncs every claim in a VRF-backed pool and every opted-in Machine:
//! a failure never holds the cursor or the other devices. The Machines
//! list failing stops the call (the devices not handled stay pending).
//!
//! # A device Metal does not answer
//! Device reads have their own retry budget ([`DEVICE_READ_MS`]), so a
//! device Metal keeps failing costs a call that long, not the client's
//! whole budget. A device whose read fails stays pending with its failures
//! counted and its next read put off ([`crate::provision::poll::backoff_s`]:
//! 1, 2, 4, 8 then 15 minutes); the call goes on with the next device, and
//! the calls in between leave it alone. The report names it, why, and when
//! it is read again (`deviceFailures`, then `backingOff`); `obs/poll` keeps
//! how many devices fail and since when the oldest pending device waits,
//! for the metrics and the alert. What is not about one device stops the
//! call at once, charging no device: a TLS failure, a request the runtime
//! refuses, a refused token (the answer is that error: a certificate
//! problem is not "retry"); and [`DOWN_AFTER`] device reads failing in a
//! row with none answered in the call means Metal is failing device reads
//! altogether: the call stops (503 `MetalUnavailable`) instead of spending
//! its time device by device (those devices back off like any other: two
//! bad devices at the head of `pending` never hold the rest). Metal not
//! answering the event read fails the call before any device.
//!
//! # Idempotency
//! Handling a device twice (two pollers at once, a crash before `done`)
//! changes nothing the first did not: the steps are exactly-once.

use serde_json::{json, Value};

use super::assign::sync_claim_assignment;
use super::device::{cloud_device_of, device_cloud};
use super::machine::{sync_machine, Synced};
use super::network::{delete_claims, Deps};
use super::objects::MachineObject;
use crate::cloud::{Cloud, CloudError, CloudKind};
use crate::error::Error;
use crate::error::Result;
use crate::kube::{self, Kube};
use crate::kv::Ctx;
use crate::network::batch::VlanBatches;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::provision::assign::{self as record, Assignment};
use crate::provision::poll::{self, Failed, PendingDevice};

/// Claim steps one call runs at most (the rest wait for the next call).
pub const MAX_POLL_CLAIMS: usize = 50;

/// Machine network steps one call runs at most.
pub const MAX_POLL_MACHINES: usize = 10;

/// Seconds after which a call starts no more work: every call to Metal or
/// the API server is bounded too, so a call ends soon after, within the
/// CronJob's `--max-time` (`deploy/metal-poll-cronjob.yaml`); a client that
/// gave up earlier loses nothing (the record is written by compare-and-swap
/// as the call goes).
pub const POLL_TIME_S: u64 = 30;

/// The retry budget of one device read, in milliseconds (the client's
/// default is 10 s): a device Metal keeps failing costs a call this long,
/// plus the last attempt's floor, before the call moves on.
pub const DEVICE_READ_MS: u64 = 3_000;

/// Device reads failing in a row, with none answered in the call, after
/// which the call stops: Metal is failing device reads, not one device.
pub const DOWN_AFTER: usize = 2;

/// A device whose reads fail, as the report names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFailure {
    /// The device.
    pub device: String,
    /// Why its last read failed (the error's reason and message).
    pub error: String,
    /// Its reads that failed in a row.
    pub failures: u32,
    /// Unix seconds before which no call reads it again.
    pub retry_at: u64,
}

impl DeviceFailure {
    fn of(p: &PendingDevice) -> DeviceFailure {
        DeviceFailure {
            device: p.device.clone(),
            error: p.error.clone().unwrap_or_default(),
            failures: p.failures,
            retry_at: p.retry_at,
        }
    }

    fn to_json(&self) -> Value {
        json!({"device": self.device, "error": self.error, "failures": self.failures,
               "retryAt": self.retry_at})
    }
}

/// What one poll did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Events newer than the cursor read (and ingested) by this call.
    pub events: usize,
    /// The cursor was not found among the events: every known device was
    /// made pending.
    pub resync: bool,
    /// Devices read (handled).
    pub devices: usize,
    /// Claims whose device was deleted.
    pub device_deleted: Vec<String>,
    /// Claims re-run, with their result.
    pub synced: Vec<(String, &'static str)>,
    /// The cursor after this call: the newest event ingested.
    pub cursor: Option<String>,
    /// Devices still pending after this call (call again).
    pub pending: usize,
    /// More work waits: devices pending, or claims waiting for a device
    /// still to recheck.
    pub more: bool,
    /// Failures on single claims and machines (the cursor moved anyway;
    /// the reconcile run retries them).
    pub errors: Vec<String>,
    /// Machines on handled devices: their network step's result.
    pub network: Vec<(String, &'static str)>,
    /// Per-VLAN claims deleted for Machines whose device was deleted.
    pub network_claims_deleted: usize,
    /// Devices whose read failed in this call (also in `errors`), with
    /// when they are read again.
    pub device_failures: Vec<DeviceFailure>,
    /// Devices this call left alone: their reads failed before and their
    /// backoff has not ended.
    pub backing_off: Vec<DeviceFailure>,
}

impl PollReport {
    /// As JSON (the answer of `POST /v1/metal/poll`).
    pub fn to_json(&self) -> Value {
        let synced: Vec<Value> = self
            .synced
            .iter()
            .map(|(c, r)| json!({"claim": c, "result": r}))
            .collect();
        json!({"events": self.events, "resync": self.resync, "devices": self.devices,
               "deviceDeleted": self.device_deleted, "synced": synced,
               "cursor": self.cursor, "pending": self.pending, "more": self.more,
               "errors": self.errors,
               "network": self.network.iter().map(|(m, p)| json!({"machine": m, "phase": p})).collect::<Vec<_>>(),
               "networkClaimsDeleted": self.network_claims_deleted,
               "deviceFailures": self.device_failures.iter().map(DeviceFailure::to_json).collect::<Vec<_>>(),
               "backingOff": self.backing_off.iter().map(DeviceFailure::to_json).collect::<Vec<_>>()})
    }
}

/// Every device the store knows: those of open assignment records and of
/// machines' apply records (what a resync rechecks, deleted ones included).
fn known_devices<K: KvStore>(
    ctx: &Ctx<'_, K>,
    kind: CloudKind,
    records: &[((String, String), Assignment)],
) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for (_, r) in records {
        if let Some(d) = r.device.as_ref().filter(|_| !r.closed) {
            if !out.contains(d) {
                out.push(d.clone());
            }
        }
    }
    // The devices with a machine network of this cloud.
    for d in crate::network::apply::devices(ctx)? {
        if device_cloud(&d) == kind && !out.contains(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

/// The reason of a cloud that answers no device read.
fn unavailable_reason(cloud: &str) -> &'static str {
    if cloud == CloudKind::Phoenixnap.name() {
        "PnapUnavailable"
    } else {
        "MetalUnavailable"
    }
}

/// A claim waiting for its assignment: nothing assigned, not refused, not
/// closed, no instance at work.
fn waiting(r: &Assignment, now: u64) -> bool {
    !r.closed && r.assignment.is_none() && r.refused.is_none() && !r.live_intent(now)
}

/// The Machines, listed at most once per call.
struct Machines<'k, 'a, H: HttpClient + ?Sized> {
    kube: &'k Kube<'a, H>,
    listed: Option<Vec<MachineObject>>,
}

impl<H: HttpClient + ?Sized> Machines<'_, '_, H> {
    /// The (namespace, name, uid) of the Machines on `device`.
    fn on(&mut self, device: &str) -> Result<Vec<(String, String, String)>> {
        if self.listed.is_none() {
            self.listed = Some(self.kube.list_as(&kube::MACHINES, None)?);
        }
        Ok(self
            .listed
            .iter()
            .flatten()
            .filter(|m| {
                let named = m.provider_id.as_deref().and_then(cloud_device_of);
                named.map(|(_, d)| d) == Some(device)
            })
            .map(|m| {
                (
                    m.metadata.namespace.clone().unwrap_or_default(),
                    m.metadata.name.clone(),
                    m.metadata.uid.clone().unwrap_or_default(),
                )
            })
            .collect())
    }
}

/// One machine network step's result, as the report names it (`None`:
/// nothing of ours).
fn synced_name(s: &Synced) -> Option<&'static str> {
    match s {
        Synced::Ignored => None,
        other => Some(other.result()),
    }
}

/// One call's work: the steps it runs, what it reports, the budgets left.
struct Run<'r, 'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The store, the API server, the polled cloud, the VLAN steps.
    deps: Deps<'r, 'a, K, H>,
    /// The cloud polled.
    cloud: &'r dyn Cloud,
    report: PollReport,
    machines: Machines<'r, 'a, H>,
    started: u64,
    claims_left: usize,
    machines_left: usize,
    /// Devices whose read failed in this call.
    failed: Vec<Failed>,
    /// Device reads failed since the last one answered.
    in_a_row: usize,
    /// A device read was answered in this call.
    answered: bool,
    /// Why the call stopped early, when it did (the poll's answer).
    stopped: Option<Error>,
}

impl<K: KvStore, H: HttpClient + ?Sized> Run<'_, '_, K, H> {
    fn out_of_time(&self) -> bool {
        self.deps.ctx.env.now() >= self.started.saturating_add(POLL_TIME_S)
    }

    /// The claim step for `ns/name`, its result or error reported.
    fn sync(&mut self, ns: &str, name: &str) {
        match sync_claim_assignment(self.deps.ctx, self.deps.kube, self.cloud, ns, name) {
            Ok(o) => self
                .report
                .synced
                .push((format!("{ns}/{name}"), o.result.as_str())),
            Err(e) => self.report.errors.push(format!("claim {ns}/{name}: {e}")),
        }
    }

    /// The machine network step for `ns/name`, its result or error reported.
    fn sync_net(&mut self, ns: &str, name: &str) {
        let r = &mut self.report;
        match sync_machine(self.deps, ns, name) {
            Ok(s) => {
                if let Some(n) = synced_name(&s) {
                    r.network.push((format!("{ns}/{name}"), n));
                }
                r.network_claims_deleted += s.claims_deleted().unwrap_or(0);
            }
            Err(e) => r.errors.push(format!("Machine {ns}/{name} (network): {e}")),
        }
    }

    /// Handles the pending devices oldest first within the budgets,
    /// leaving alone those backing off; returns those handled. A device
    /// read that fails is noted (`failed`) and the next device read; stops
    /// when the Machines list fails, on a failure that is not about one
    /// device, or after [`DOWN_AFTER`] failures in a row with no read
    /// answered (`stopped`).
    fn devices(
        &mut self,
        pending: &[PendingDevice],
        records: &[((String, String), Assignment)],
    ) -> Result<Vec<PendingDevice>> {
        let mut handled: Vec<PendingDevice> = Vec::new();
        for p in pending {
            if self.out_of_time() || self.stopped.is_some() {
                break;
            }
            if p.backing_off(self.deps.ctx.env.now()) {
                self.report.backing_off.push(DeviceFailure::of(p));
                continue;
            }
            let d = p.device.as_str();
            // Every open record on the device: on one that went, each is
            // told; on an active one, each is synced (a converged claim costs
            // no Metal call, and one whose answer or condition write was
            // lost is repaired by the next event of its device).
            let claims: Vec<(String, String)> = records
                .iter()
                .filter(|(_, r)| r.device.as_deref() == Some(d) && !r.closed)
                .map(|(k, _)| k.clone())
                .collect();
            let on = match self.machines.on(d) {
                Ok(m) => m,
                Err(e) => {
                    self.report.errors.push(format!("Machines: {e}"));
                    break;
                }
            };
            let fits = claims.len() <= self.claims_left && on.len() <= self.machines_left;
            if !fits && !handled.is_empty() {
                break;
            }
            let device = match self.cloud.device_within(d, DEVICE_READ_MS) {
                Ok(x) => {
                    self.answered = true;
                    self.in_a_row = 0;
                    x
                }
                Err(e) => {
                    self.read_failed(p, e);
                    continue;
                }
            };
            self.report.devices += 1;
            if device.as_ref().is_none_or(|x| x.gone) {
                self.gone(d, &claims, &on)?;
            } else if device.as_ref().is_some_and(|x| x.active) {
                for (ns, name) in &claims {
                    self.sync(ns, name);
                }
                for (ns, name, _) in &on {
                    self.sync_net(ns, name);
                }
            }
            // Not active yet: its next change of state is an event of its own.
            self.claims_left = self.claims_left.saturating_sub(claims.len());
            self.machines_left = self.machines_left.saturating_sub(on.len());
            handled.push(p.clone());
        }
        Ok(handled)
    }

    /// A read of `p`'s device failed with `e`: a failure about the device
    /// is noted (it backs off) and the call goes on, unless it is the
    /// [`DOWN_AFTER`]th in a row with no read answered (noted too, and the
    /// call stops); one about Metal or its configuration stops the call
    /// and notes nothing.
    fn read_failed(&mut self, p: &PendingDevice, e: CloudError) {
        let not_the_device = matches!(e, CloudError::Tls { .. } | CloudError::Denied { .. })
            || matches!(e.status(), Some(401 | 403));
        let e = self.cloud.error(e);
        if not_the_device {
            self.stopped = Some(e);
            return;
        }
        // The reason and message, and what Metal answered (the request
        // and its status: no secret).
        let text = match e.detail() {
            Some(d) => format!("{e} ({d})"),
            None => e.to_string(),
        };
        self.report
            .errors
            .push(format!("device {}: {text}", p.device));
        self.failed.push(Failed {
            pending: p.clone(),
            error: text,
        });
        self.in_a_row += 1;
        if self.in_a_row >= DOWN_AFTER && !self.answered {
            let devices: Vec<&str> = self
                .failed
                .iter()
                .map(|f| f.pending.device.as_str())
                .collect();
            self.stopped = Some(
                Error::transient(
                    unavailable_reason(self.cloud.name()),
                    format!(
                        "{} failed the reads of devices {} in a row and answered none in this call: the poll stopped (the devices back off; the others wait for the next call)",
                        self.cloud.name(),
                        devices.join(", ")
                    ),
                )
                .with_detail(e.to_string()),
            );
        }
    }

    /// Device `d` is gone: its claims told (and synced: the condition says
    /// `DeviceDeleted`, a deleting claim finishes its release), its
    /// Machines' per-VLAN claims deleted, its apply record forgotten.
    fn gone(
        &mut self,
        d: &str,
        claims: &[(String, String)],
        on: &[(String, String, String)],
    ) -> Result<()> {
        for (ns, name) in claims {
            match record::ClaimAssignment::new(self.deps.ctx, ns, name).device_deleted(d) {
                Ok(true) => self.report.device_deleted.push(format!("{ns}/{name}")),
                Ok(false) => {}
                Err(e) => {
                    self.report.errors.push(format!("claim {ns}/{name}: {e}"));
                    continue;
                }
            }
            self.sync(ns, name);
        }
        for (ns, name, uid) in on {
            let r = &mut self.report;
            match delete_claims(self.deps.kube, ns, name, uid) {
                Ok(n) => {
                    r.network.push((format!("{ns}/{name}"), "released"));
                    r.network_claims_deleted += n;
                }
                Err(e) => r.errors.push(format!("Machine {ns}/{name} (network): {e}")),
            }
        }
        crate::network::apply::DeviceRecord::new(self.deps.ctx, d).forget()
    }

    /// Claims whose owner had no provider ID yet, rechecked after a device
    /// was named (theirs may be it), in rotating order when they are more
    /// than the budget left; `Some(gen)` when every one was.
    fn unplaced(&mut self, records: &[((String, String), Assignment)], gen: u64) -> Option<u64> {
        let now = self.deps.ctx.env.now();
        let unplaced: Vec<&(String, String)> = records
            .iter()
            .filter(|(_, r)| r.device.is_none() && waiting(r, now))
            .map(|(k, _)| k)
            .collect();
        let n = unplaced.len();
        let take = n.min(self.claims_left);
        let start = if n == 0 {
            0
        } else {
            (gen as usize).wrapping_mul(self.claims_left.max(1)) % n
        };
        for i in 0..take {
            let (ns, name) = unplaced[(start + i) % n];
            self.sync(ns, name);
        }
        (take == n).then_some(gen)
    }

    /// Applies left with a step running continue here (their device had no
    /// event of its own), within the machines' budget.
    fn running_applies(&mut self, handled: &[PendingDevice], kind: CloudKind) -> Result<()> {
        let running = crate::network::apply::running_devices(self.deps.ctx)?;
        for d in running {
            // This cloud's devices only (the other cloud's poll has them).
            if device_cloud(&d) != kind {
                continue;
            }
            if self.machines_left == 0 || handled.iter().any(|p| p.device == d) {
                continue;
            }
            let on = match self.machines.on(&d) {
                Ok(m) => m,
                Err(e) => {
                    self.report.errors.push(format!("Machines: {e}"));
                    break;
                }
            };
            for (ns, name, _) in on.into_iter().take(self.machines_left) {
                self.machines_left -= 1;
                self.sync_net(&ns, &name);
            }
        }
        Ok(())
    }
}

/// The report completed with what the cursor shows after the call: the
/// failed devices with their backoff, what is pending, whether more is due.
fn finish_report(
    mut report: PollReport,
    failed: &[Failed],
    after: &poll::Cursor,
    end: u64,
) -> PollReport {
    for f in failed {
        let p = after.pending.iter().find(|p| p.device == f.pending.device);
        report.device_failures.push(DeviceFailure {
            device: f.pending.device.clone(),
            error: f.error.clone(),
            failures: p.map_or(0, |p| p.failures),
            retry_at: p.map_or(0, |p| p.retry_at),
        });
    }
    report.pending = after.pending.len();
    report.more = after.pending.iter().any(|p| !p.backing_off(end)) || after.recheck_unplaced;
    report
}

/// Handles the Metal events after the cursor (see the module docs).
///
/// # Idempotency
/// Any number of calls, concurrent or after a crash between any two
/// operations: handling a device twice changes nothing the first did not.
///
/// # Errors
/// Store errors; Metal unavailable for the events (nothing is lost: the
/// events are read again); a device read failing in a way that is not
/// about the device (TLS, refused request or token: that error) or
/// [`DOWN_AFTER`] of them in a row with none answered (503
/// `MetalUnavailable`), after what the call handled was recorded.
/// Failures of single claims, machines, device reads and the Machines list
/// are in the report instead (the devices not handled stay pending).
pub fn poll<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    kind: CloudKind,
    cloud: &dyn Cloud,
    batches: &dyn VlanBatches,
) -> Result<PollReport> {
    // The assignment records are listed once per call, and only when there
    // is work for them: on a resync (every known device), or once devices
    // are due or claims waiting for a device are to be rechecked.
    let mut listed = None;
    // The claims whose assignment is in this cloud.
    let open = || -> Result<Vec<_>> {
        let mut r = record::list_open(ctx)?;
        r.retain(|(_, a)| a.cloud == kind);
        Ok(r)
    };
    let ingested = poll::ingest(ctx, kind, cloud, || {
        let r = open()?;
        let known = known_devices(ctx, kind, &r);
        listed = Some(r);
        known
    })?;
    let cur = ingested.cursor;
    let now = ctx.env.now();
    let due = cur.pending.iter().any(|p| !p.backing_off(now));
    let records = match listed {
        Some(r) => r,
        None if !due && !cur.recheck_unplaced => Vec::new(),
        None => open()?,
    };
    let mut run = Run {
        deps: Deps {
            ctx,
            kube,
            metal: (kind == CloudKind::Metal).then_some(cloud),
            pnap: (kind == CloudKind::Phoenixnap).then_some(cloud),
            batches,
        },
        cloud,
        report: PollReport {
            events: ingested.events,
            resync: ingested.resync,
            cursor: (!cur.last.is_empty()).then(|| cur.last.clone()),
            ..PollReport::default()
        },
        machines: Machines { kube, listed: None },
        started: now,
        claims_left: MAX_POLL_CLAIMS,
        machines_left: MAX_POLL_MACHINES,
        failed: Vec::new(),
        in_a_row: 0,
        answered: false,
        stopped: None,
    };
    let handled = run.devices(&cur.pending, &records)?;
    let mut unplaced_done = None;
    if cur.recheck_unplaced && !run.out_of_time() && run.stopped.is_none() {
        unplaced_done = run.unplaced(&records, cur.gen);
    }
    let metal = kind == CloudKind::Metal;
    if run.machines_left > 0 && !run.out_of_time() && run.stopped.is_none() {
        run.running_applies(&handled, kind)?;
    }
    let end = ctx.env.now();
    let after = poll::done(ctx, kind, &handled, &run.failed, unplaced_done, end)?;
    let report = finish_report(run.report, &run.failed, &after, end);
    // The metrics' poll summary is Metal's poll.
    if metal {
        crate::observe::summary::record_poll(
            ctx.kv,
            end,
            &crate::observe::summary::PollCall {
                succeeded: run.stopped.is_none(),
                events: report.events as u64,
                pending: &after.pending,
                errors: report.errors.len() as u64,
            },
        )?;
    }
    match run.stopped {
        Some(e) => Err(e),
        None => Ok(report),
    }
}
