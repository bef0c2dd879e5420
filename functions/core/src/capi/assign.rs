//! Per-claim Metal IP assignments, the Kubernetes side: which device a
//! claim's address goes to, the claim's finalizer and `MetalAssigned`
//! condition. The Metal event poll, which syncs every open claim on the
//! devices its events name and rechecks claims waiting for a device, is
//! [`super::poll`].
//!
//! # The device
//! [`super::device::resolve_device`]: the claim's annotation
//! [`DEVICE_ANNOTATION`], else its machine owners' provider ID. No device
//! yet: the claim stays bound, `MetalAssigned=False DeviceUnknown`, and the
//! poll retries it when a device becomes active.
//!
//! # Ordering with release
//! [`ASSIGNMENT_FINALIZER`] is added to the claim before any assignment is
//! made (the API server refuses new finalizers on an object being deleted,
//! so none is added once deletion began). The IPAM release step waits
//! while the claim holds it ([`crate::capi::reconcile_claim`] answers
//! `waiting` with `metalAssignment`); this step removes the assignment,
//! closes the claim's record ([`crate::provision::assign::close`]: no
//! assignment is made for that uid after) and only then removes the
//! finalizer. For a claim deleted without its finalizers, release waits
//! on the record instead.

use serde_json::json;

pub use super::device::DEVICE_ANNOTATION;
use super::device::{resolve_device, DeviceRef};
use super::objects::{paused, ClusterObject};
use super::{Outcome, StepResult};
use crate::error::Result;
use crate::ipam::claim::ClaimObject;
use crate::ipam::ops;
use crate::kube::conditions::{with_condition, Ready};
use crate::kube::meta::{add_finalizer, remove_finalizer, retrying};
use crate::kube::{self, Kube};
use crate::kv::{ClaimRecord, Ctx};
use crate::metal::client::Metal;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::ports::Env;
use crate::provision::assign::{self, AssignState, Labels, UnassignState, Want};

/// Finalizer on claims in VRF-backed pools: held while the claim's address
/// may be assigned to a device in Metal.
pub const ASSIGNMENT_FINALIZER: &str = "ipam.metal-ipam.dev/metal-assignment";

/// The condition type on claims saying whether the address is assigned to
/// the device in Metal.
pub const CONDITION: &str = "MetalAssigned";

/// Writes the claim's `MetalAssigned` condition if it differs.
fn write_condition<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    claim: &ClaimObject,
    cond: Ready<'_>,
) -> Result<bool> {
    let m = &claim.metadata;
    let (conditions, changed) =
        with_condition(&claim.status.conditions, CONDITION, cond, m.generation);
    if !changed {
        return Ok(false);
    }
    let patch = json!({"metadata": {"resourceVersion": m.resource_version_json()},
                       "status": {"conditions": conditions}});
    kube.merge_patch(&kube::CLAIMS, m.namespace.as_deref(), &m.name, true, &patch)?;
    Ok(true)
}

/// Assigns the address of claim `ns/name` to its device in Metal, or
/// removes the assignment when the claim is going (see the module docs).
///
/// # Idempotency
/// Any number of invocations, concurrent or after a crash between any two
/// operations: one assignment at most per claim ([`assign::assign`]); a
/// converged claim costs no Metal call and no Kubernetes write.
///
/// # Errors
/// 503 for an unavailable API server, store or Metal (the next invocation
/// resumes); 500 for credentials or RBAC. Metal refusing the assignment is
/// not an error: the claim's condition says it (`failed`).
pub fn sync_claim_assignment<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    ns: &str,
    name: &str,
) -> Result<Outcome> {
    let before = kube.calls();
    let mut out = retrying(|| sync_once(ctx, kube, metal, ns, name))?;
    out.kube_calls = kube.calls() - before;
    Ok(out)
}

fn unassigned(state: UnassignState, what: &str) -> Outcome {
    match state {
        UnassignState::Done { deleted: Some(id) } => Outcome::new(
            StepResult::Released,
            format!("{what}: Metal assignment {id} removed"),
        ),
        UnassignState::Done { deleted: None } => Outcome::new(
            StepResult::Released,
            format!("{what}: nothing assigned in Metal"),
        ),
        UnassignState::InProgress(s) => Outcome::new(
            StepResult::Waiting,
            format!("{what}: an assignment is in progress; removing it after"),
        )
        .retry_after(s),
    }
}

fn sync_once<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    ns: &str,
    name: &str,
) -> Result<Outcome> {
    let claim: Option<ClaimObject> = kube.get_as(&kube::CLAIMS, Some(ns), name)?;
    let Some(claim) = claim else {
        return gone(ctx, metal, ns, name);
    };
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if claim.metadata.deleting() {
        return cleanup(ctx, kube, metal, &claim, (ns, name, &uid));
    }
    if paused(&claim) {
        return Ok(Outcome::new(StepResult::Paused, "the claim is paused"));
    }
    let Some(binding) = ops::get_claim(ctx.kv, ns, name)?.filter(|b| b.uid == uid) else {
        return Ok(Outcome::new(
            StepResult::Waiting,
            "the claim is not bound yet",
        ));
    };
    let pool_id = binding.pool_id(ns)?;
    let vrf_backed =
        ops::get_pool(ctx.kv, &pool_id)?.is_some_and(|p| p.object.spec.metal.is_some());
    if !vrf_backed {
        return Ok(Outcome::new(
            StepResult::Ignored,
            format!("pool {} is not VRF-backed", pool_id.display()),
        ));
    }
    if let Some(cluster) = &binding.cluster_name {
        let c: Option<ClusterObject> = kube.get_as(&kube::CLUSTERS, Some(ns), cluster)?;
        if c.is_some_and(|c| c.is_paused()) {
            return Ok(Outcome::new(
                StepResult::Paused,
                format!("Cluster {ns}/{cluster} is paused"),
            ));
        }
    }
    let labels = Labels {
        namespace: ns.to_string(),
        name: name.to_string(),
        uid,
        pool: format!("{} {}", pool_id.kind.kind_name(), pool_id.display()),
        cluster: binding.cluster_name.clone(),
    };
    act(ctx, kube, metal, claim, &binding, labels)
}

/// The claim is gone without our finalizer's help: remove what the record
/// holds.
fn gone<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    ns: &str,
    name: &str,
) -> Result<Outcome> {
    Ok(match assign::read(ctx.kv, ns, name)? {
        Some(rec) if !rec.closed => unassigned(
            assign::unassign(ctx, metal, ns, name, &rec.uid)?,
            "the claim no longer exists",
        ),
        _ => Outcome::new(StepResult::Absent, "the claim does not exist"),
    })
}

/// The claim is being deleted: with or without our finalizer (someone may
/// have removed it), the address is not released while the record holds
/// an assignment; the finalizer goes once the assignment is removed.
fn cleanup<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    claim: &ClaimObject,
    (ns, name, uid): (&str, &str, &str),
) -> Result<Outcome> {
    let state = assign::unassign(ctx, metal, ns, name, uid)?;
    let held = claim.metadata.has_finalizer(ASSIGNMENT_FINALIZER);
    if matches!(state, UnassignState::Done { .. }) && held {
        remove_finalizer(kube, &kube::CLAIMS, claim, ASSIGNMENT_FINALIZER)?;
    }
    Ok(unassigned(state, "the claim is being deleted"))
}

/// The live, bound claim of a VRF-backed pool: its device resolved, the
/// finalizer added before any assignment, the assignment made (or the
/// record prepared while no device is known), the condition written.
fn act<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    claim: ClaimObject,
    binding: &ClaimRecord,
    labels: Labels,
) -> Result<Outcome> {
    let now = ctx.env.now();
    let address = binding.ip()?;
    let device = match resolve_device(kube, &claim)? {
        DeviceRef::Known(d) => Some(d),
        DeviceRef::Unknown => None,
        DeviceRef::Invalid(msg) => {
            write_condition(kube, &claim, Ready::no("InvalidDevice", &msg, now))?;
            return Ok(Outcome::new(StepResult::Failed, msg).with_address(&binding.address));
        }
    };
    let want = Want {
        uid: labels.uid.clone(),
        address,
        device: device.clone(),
    };
    let claim = match &device {
        Some(_) => add_finalizer(kube, &kube::CLAIMS, &claim, ASSIGNMENT_FINALIZER)?,
        None => claim,
    };
    let state = match &device {
        Some(_) => assign::assign(ctx, metal, &want, &labels)?,
        None => {
            assign::prepare(ctx, &labels.namespace, &labels.name, &want)?;
            AssignState::DeviceUnknown
        }
    };
    conclude(
        kube,
        &claim,
        &state,
        (&binding.address, device.as_deref()),
        now,
    )
}

/// The condition for `state` written (when it has one), and the step's
/// outcome.
fn conclude<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    claim: &ClaimObject,
    state: &AssignState,
    (address, device): (&str, Option<&str>),
    now: u64,
) -> Result<Outcome> {
    let (cond, out) = verdict(state, address, device);
    if let Some((reason, ok)) = cond {
        let c = Ready {
            status: ok,
            reason,
            message: &out.message,
            now,
        };
        write_condition(kube, claim, c)?;
    }
    Ok(out.with_address(address))
}

/// What an assignment state means: the `MetalAssigned` condition's reason
/// and status (none for a passing state), and the step's outcome, whose
/// message is the condition's.
fn verdict(
    state: &AssignState,
    address: &str,
    device: Option<&str>,
) -> (Option<(&'static str, bool)>, Outcome) {
    let device = device.unwrap_or("?");
    let waiting = |reason, msg: String| {
        (
            Some((reason, false)),
            Outcome::new(StepResult::Waiting, msg),
        )
    };
    match state {
        AssignState::Assigned(id) => (
            Some(("Assigned", true)),
            Outcome::new(
                StepResult::Bound,
                format!("{address} is assigned to device {device} (Metal assignment {id})"),
            ),
        ),
        AssignState::DeviceUnknown => waiting(
            "DeviceUnknown",
            format!("no device yet: waiting for the owning machine's spec.providerID or the {DEVICE_ANNOTATION} annotation"),
        ),
        AssignState::DeviceGone(d) => waiting(
            "DeviceNotFound",
            format!("device {d} does not exist in Metal"),
        ),
        AssignState::DeviceDeleted(d) => waiting(
            "DeviceDeleted",
            format!("device {d} was deleted; its assignment went with it (the claim is assigned again once it names another device)"),
        ),
        AssignState::DeviceNotActive(s) => waiting(
            "DeviceNotActive",
            format!("device {device} is {s}; the assignment is made when it is active"),
        ),
        AssignState::Refused(m) => (
            Some(("AssignmentRefused", false)),
            Outcome::new(StepResult::Failed, format!("Metal refused the assignment: {m}")),
        ),
        AssignState::InProgress(s) => (
            None,
            Outcome::new(StepResult::Waiting, "an assignment is in progress").retry_after(*s),
        ),
        AssignState::Closed => (
            None,
            Outcome::new(
                StepResult::Waiting,
                "the claim's assignment was closed (the claim is going)",
            ),
        ),
    }
}
