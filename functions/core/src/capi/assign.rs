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
use crate::kv::Ctx;
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
        // Gone without our finalizer's help: remove what the record holds.
        return Ok(match assign::read(ctx.kv, ns, name)? {
            Some(rec) if !rec.closed => unassigned(
                assign::unassign(ctx, metal, ns, name, &rec.uid)?,
                "the claim no longer exists",
            ),
            _ => Outcome::new(StepResult::Absent, "the claim does not exist"),
        });
    };
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if claim.metadata.deleting() {
        // With or without our finalizer (someone may have removed it): the
        // address is not released while the record holds an assignment.
        let state = assign::unassign(ctx, metal, ns, name, &uid)?;
        if matches!(state, UnassignState::Done { .. })
            && claim.metadata.has_finalizer(ASSIGNMENT_FINALIZER)
        {
            remove_finalizer(kube, &kube::CLAIMS, &claim, ASSIGNMENT_FINALIZER)?;
        }
        return Ok(unassigned(state, "the claim is being deleted"));
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
    let now = ctx.env.now();
    let address = binding.ip()?;
    let device = match resolve_device(kube, &claim)? {
        DeviceRef::Known(d) => Some(d),
        DeviceRef::Unknown => None,
        DeviceRef::Invalid(msg) => {
            write_condition(kube, &claim, Ready::no("InvalidDevice", &msg, now))?;
            return Ok(Outcome::new(StepResult::Failed, msg).with_address(binding.address));
        }
    };
    let want = Want {
        uid: uid.clone(),
        address,
        device: device.clone(),
    };
    let labels = Labels {
        namespace: ns.to_string(),
        name: name.to_string(),
        uid,
        pool: format!("{} {}", pool_id.kind.kind_name(), pool_id.display()),
        cluster: binding.cluster_name.clone(),
    };
    let claim = if device.is_some() {
        add_finalizer(kube, &kube::CLAIMS, &claim, ASSIGNMENT_FINALIZER)?
    } else {
        claim
    };
    let state = if device.is_some() {
        assign::assign(ctx, metal, &want, &labels)?
    } else {
        assign::prepare(ctx, ns, name, &want)?;
        AssignState::DeviceUnknown
    };
    let with = |o: Outcome| o.with_address(binding.address.clone());
    let (cond, out) = match &state {
        AssignState::Assigned(id) => {
            let msg = format!(
                "{} is assigned to device {} (Metal assignment {id})",
                binding.address,
                device.as_deref().unwrap_or("?")
            );
            let out = Outcome::new(StepResult::Bound, msg.clone());
            (Some(("Assigned", true, msg)), out)
        }
        AssignState::DeviceUnknown => {
            let msg = format!("no device yet: waiting for the owning machine's spec.providerID or the {DEVICE_ANNOTATION} annotation");
            (
                Some(("DeviceUnknown", false, msg.clone())),
                Outcome::new(StepResult::Waiting, msg),
            )
        }
        AssignState::DeviceGone(d) => {
            let msg = format!("device {d} does not exist in Metal");
            (
                Some(("DeviceNotFound", false, msg.clone())),
                Outcome::new(StepResult::Waiting, msg),
            )
        }
        AssignState::DeviceDeleted(d) => {
            let msg = format!(
                "device {d} was deleted; its assignment went with it (the claim is assigned again once it names another device)"
            );
            (
                Some(("DeviceDeleted", false, msg.clone())),
                Outcome::new(StepResult::Waiting, msg),
            )
        }
        AssignState::DeviceNotActive(s) => {
            let msg = format!(
                "device {} is {s}; the assignment is made when it is active",
                device.as_deref().unwrap_or("?")
            );
            (
                Some(("DeviceNotActive", false, msg.clone())),
                Outcome::new(StepResult::Waiting, msg),
            )
        }
        AssignState::Refused(m) => {
            let msg = format!("Metal refused the assignment: {m}");
            (
                Some(("AssignmentRefused", false, msg.clone())),
                Outcome::new(StepResult::Failed, msg),
            )
        }
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
    };
    if let Some((reason, ok, msg)) = cond {
        let c = Ready {
            status: ok,
            reason,
            message: &msg,
            now,
        };
        write_condition(kube, &claim, c)?;
    }
    Ok(with(out))
}
