//! The machine network as a handler on the reconcile kit: one Machine's
//! port networking converged from the profile it opted into
//! ([`super::network`] holds the machinery: claims, apply, release).
//!
//! Order: [`Order::DeletionFirst`], and Machines carry no finalizer of
//! ours: a deleting Machine is left to go (its claims are owned by it; its
//! device is released by the Metal poll once deleted). There is no pause
//! gate: a Machine's network follows its profile while its Cluster is
//! paused, as before the kit (a paused Cluster's devices are still the
//! operator's to release with `DELETE …/network`). The step's answer is
//! [`Synced`]; it writes no condition.

use super::device::device_in;
use super::network::{
    annotation_of, apply_on_device, delete_stale, ensure_claims, machine_and_infra, network_of,
    release_device, Deps, OnDevice,
};
use super::objects::MachineObject;
use crate::error::Result;
use crate::kube::{self, Kube, Resource};
use crate::network::apply::{self, ApplyPhase, ApplyReport, ApplyState};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::reconcile::{self, Cleanup, Condition, Handler, Order, Reconciled, StepResult, Verdict};

/// What [`sync_machine`] did with a Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Synced {
    /// The Machine is gone, or going (its claims go with it, its device
    /// is released by the Metal poll once deleted): nothing to do.
    Absent,
    /// No profile, and nothing of ours on its device: nothing to do.
    Ignored,
    /// A profile but no device yet: its claims made; the Metal poll (or
    /// the next sync) applies it once the device is active.
    WaitingForDevice,
    /// The profile applied (converged or in progress).
    Applied(ApplyReport),
    /// The annotation removed from a machine whose device we configured,
    /// or the operator's release not done yet: released (`None` once
    /// done, with the claims deleted).
    Released(Option<ApplyReport>, usize),
    /// The operator released the device (`DELETE …/network`) and the
    /// annotation is as it was then: left alone, no Metal call.
    ReleasedByOperator,
    /// The device is gone: its record forgotten, the Machine's claims
    /// deleted (how many).
    DeviceGone(usize),
}

impl Synced {
    /// `absent`, `ignored`, `waiting-for-device`, `converged`,
    /// `in-progress`, `releasing`, `released`, `released-by-operator` or
    /// `device-gone` (bodies, logs, reports).
    pub fn result(&self) -> &'static str {
        match self {
            Synced::Absent => "absent",
            Synced::Ignored => "ignored",
            Synced::WaitingForDevice => "waiting-for-device",
            Synced::Applied(r) => r.phase.name(),
            Synced::Released(Some(_), _) => "releasing",
            Synced::Released(None, _) => "released",
            Synced::ReleasedByOperator => "released-by-operator",
            Synced::DeviceGone(_) => "device-gone",
        }
    }

    /// The apply's report, when one ran.
    pub fn report(&self) -> Option<&ApplyReport> {
        match self {
            Synced::Applied(r) | Synced::Released(Some(r), _) => Some(r),
            _ => None,
        }
    }

    /// Claims deleted, by a release or for a device that is gone.
    pub fn claims_deleted(&self) -> Option<usize> {
        match self {
            Synced::Released(_, n) | Synced::DeviceGone(n) => Some(*n),
            _ => None,
        }
    }

    /// The kit's outcome for it (logs; the answer is the [`Synced`]).
    fn outcome(&self) -> Reconciled {
        let result = match self {
            Synced::Absent => StepResult::Absent,
            Synced::Ignored => StepResult::Ignored,
            Synced::WaitingForDevice => StepResult::Waiting,
            Synced::Applied(r) if r.phase == ApplyPhase::Converged => StepResult::Synced,
            Synced::Applied(_) | Synced::Released(Some(_), _) => StepResult::Waiting,
            Synced::Released(None, _) => StepResult::Released,
            Synced::ReleasedByOperator => StepResult::Kept,
            Synced::DeviceGone(_) => StepResult::Deleted,
        };
        Reconciled::new(result, self.result())
    }
}

/// Converges one Machine's network (the one entry events, reconcile and
/// the Metal poll use): applies its profile; leaves alone a device the
/// operator released (`DELETE …/network`) while the annotation is as it
/// was; releases the network when the annotation was removed from a
/// machine whose device carries our apply record; keeps the network as it
/// is when the profile is missing (an error naming it); treats a device
/// that is gone as released. See [`super::network`]'s docs.
///
/// # Idempotency
/// As [`super::network::apply_machine`] and
/// [`super::network::release_machine`]; a Machine without a profile costs
/// one read of it (and its infrastructure machine), one store read when it
/// has a device, and no Metal call. A 409 from the API server runs the
/// whole step again (the kit's rule).
///
/// # Errors
/// Per machine, for the caller to report without stopping: 404
/// `ProfileNotFound` (the network is left as it is), `VlanNotFound`; 422
/// for an annotation, infrastructure reference or provider ID that is not
/// valid, or a profile that does not validate; 409 `NetworkFrozen`,
/// `VlanBatchFailed`, `VlanBatchRefused`, `PortChangeRefused`; Metal, store
/// and API server errors.
pub fn sync_machine<K: KvStore, H: HttpClient + ?Sized>(
    deps: Deps<'_, '_, K, H>,
    ns: &str,
    name: &str,
) -> Result<Synced> {
    let mut h = MachineHandler {
        deps,
        ns,
        name,
        infra: None,
        synced: None,
    };
    reconcile::run(&mut h)?;
    Ok(h.synced.take().unwrap_or(Synced::Absent))
}

/// One Machine's network on the kit.
struct MachineHandler<'r, 'a, K: KvStore, H: HttpClient + ?Sized> {
    deps: Deps<'r, 'a, K, H>,
    ns: &'r str,
    name: &'r str,
    /// The infrastructure machine read with the Machine.
    infra: Option<MachineObject>,
    /// The step's answer, kept by the last attempt.
    synced: Option<Synced>,
}

/// The Machine as read: its opted-in profile, its device and the device's
/// apply record.
struct Seen {
    annotation: Option<String>,
    device: Option<String>,
    record: Option<ApplyState>,
}

impl<K: KvStore, H: HttpClient + ?Sized> MachineHandler<'_, '_, K, H> {
    fn answer(&mut self, s: Synced) -> Verdict<()> {
        let out = s.outcome();
        self.synced = Some(s);
        Verdict::answer(out)
    }

    fn uid(o: &MachineObject) -> &str {
        o.metadata.uid.as_deref().unwrap_or_default()
    }

    /// Opted out: release what we configured, then forget the record.
    fn opted_out(&self, o: &MachineObject, seen: Seen) -> Result<Synced> {
        let (Some(d), Some(rec)) = (&seen.device, seen.record) else {
            return Ok(Synced::Ignored);
        };
        if rec.released.as_ref().is_some_and(|r| r.done) {
            apply::DeviceRecord::new(self.deps.ctx, d).forget()?;
            return Ok(Synced::Ignored);
        }
        let who = (self.ns, self.name, Self::uid(o));
        let (report, deleted) = release_device(&self.deps, who, d)?;
        if report
            .as_ref()
            .is_some_and(|r| r.phase != ApplyPhase::Converged)
        {
            return Ok(Synced::Released(report, deleted));
        }
        apply::DeviceRecord::new(self.deps.ctx, d).forget()?;
        Ok(Synced::Released(None, deleted))
    }

    /// The operator's release (`DELETE …/network`) stands for the
    /// annotation it was made under: carried on until done, then kept.
    /// `None` when there is none or the annotation changed (withdrawn).
    fn operator_release(
        &self,
        o: &MachineObject,
        profile: &str,
        seen: &Seen,
    ) -> Result<Option<Synced>> {
        let released = seen.record.as_ref().and_then(|r| r.released.as_ref());
        let (Some(d), Some(released)) = (&seen.device, released) else {
            return Ok(None);
        };
        if released.profile.as_deref() != Some(profile) {
            apply::DeviceRecord::new(self.deps.ctx, d).clear_released()?;
            return Ok(None);
        }
        if released.done {
            return Ok(Some(Synced::ReleasedByOperator));
        }
        let who = (self.ns, self.name, Self::uid(o));
        let (report, deleted) = release_device(&self.deps, who, d)?;
        Ok(Some(match report {
            Some(r) if r.phase == ApplyPhase::Converged => {
                apply::DeviceRecord::new(self.deps.ctx, d).release_done()?;
                Synced::Released(None, deleted)
            }
            Some(r) => Synced::Released(Some(r), deleted),
            None => Synced::DeviceGone(deleted),
        }))
    }

    /// The profile applied: its claims made, and on a device the apply.
    fn converge(&self, o: &MachineObject, profile: String, seen: Seen) -> Result<Synced> {
        let (ns, name) = (self.ns, self.name);
        let applied = seen
            .record
            .is_some()
            .then_some(seen.device.as_deref())
            .flatten();
        let m = network_of(self.deps.kube, ns, o, profile, seen.device.clone(), applied)?;
        let Some(d) = &seen.device else {
            let claims = ensure_claims(self.deps.kube, ns, name, &m)?;
            delete_stale(self.deps.kube, ns, &claims.stale)?;
            return Ok(Synced::WaitingForDevice);
        };
        let on = apply_on_device(&self.deps, (ns, name), &m, d)?;
        Ok(match on {
            OnDevice::Applied(r) => Synced::Applied(r),
            OnDevice::Released => Synced::ReleasedByOperator,
            OnDevice::Gone(n) => Synced::DeviceGone(n),
        })
    }
}

impl<K: KvStore, H: HttpClient + ?Sized> Handler<H> for MachineHandler<'_, '_, K, H> {
    type Object = MachineObject;
    type Parsed = Seen;
    type Status = ();
    const ORDER: Order = Order::DeletionFirst;
    const NOUN: &'static str = "machine";
    const CLEANUP_NEEDS_FINALIZER: bool = true;

    fn kube(&self) -> &Kube<'_, H> {
        self.deps.kube
    }
    fn resource(&self) -> &'static Resource {
        &kube::MACHINES
    }
    fn finalizer(&self) -> Option<&'static str> {
        None
    }

    fn read(&mut self, _first: bool) -> Result<Option<MachineObject>> {
        let read = machine_and_infra(self.deps.kube, self.ns, self.name)?;
        let (machine, infra) = read.unzip();
        self.infra = infra.flatten();
        Ok(machine)
    }

    fn gone(&mut self) -> Result<Reconciled> {
        Ok(self.answer(Synced::Absent).outcome)
    }

    /// A deleting Machine is not parsed (nothing of it is checked): it is
    /// [`Synced::Absent`].
    fn parse(&mut self, o: &MachineObject) -> Result<Result<Seen, Verdict<()>>> {
        if o.metadata.deleting() {
            return Ok(Err(self.answer(Synced::Absent)));
        }
        let infra = self.infra.as_ref();
        let annotation = annotation_of(self.ns, self.name, o, infra)?;
        let device = device_in(o, infra)?;
        let record = match &device {
            Some(d) => apply::read_existing(self.deps.ctx.kv, d)?,
            None => None,
        };
        Ok(Ok(Seen {
            annotation,
            device,
            record,
        }))
    }

    fn paused(&mut self, _: &MachineObject, _: &mut Seen) -> Result<Option<Reconciled>> {
        Ok(None)
    }

    fn cleanup(&mut self, _: &MachineObject, _: &Seen) -> Result<Cleanup<()>> {
        unreachable!("Machines hold no finalizer of ours: the kit never cleans one up")
    }

    fn apply(&mut self, o: &MachineObject, mut seen: Seen) -> Result<Verdict<()>> {
        let Some(profile) = seen.annotation.take() else {
            return Ok(self.answer(self.opted_out(o, seen)?));
        };
        if let Some(s) = self.operator_release(o, &profile, &seen)? {
            return Ok(self.answer(s));
        }
        Ok(self.answer(self.converge(o, profile, seen)?))
    }

    fn write_status(&mut self, _: &MachineObject, _: &Condition, _: &()) -> Result<bool> {
        Ok(false)
    }
}
