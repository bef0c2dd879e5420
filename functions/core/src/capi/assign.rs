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
//! poll retries it when a device becomes active. A device of the other
//! cloud than the pool's (a phoenixNAP server for a Metal pool, a Metal
//! device for a phoenixNAP one) is `InvalidDevice`, as is a provider ID of
//! no known form.
//!
//! A phoenixNAP pool's claim made by a machine's network profile (labelled
//! [`MACHINE_LABEL`]) is not assigned here: the profile's apply joins the
//! server to the network with it ([`crate::network::memberships`]), so
//! the server's memberships have one writer.
//!
//! # Ordering with release
//! [`ASSIGNMENT_FINALIZER`] is added to the claim before any assignment is
//! made (the API server refuses new finalizers on an object being deleted,
//! so none is added once deletion began). The IPAM release step waits
//! while the claim holds it ([`crate::capi::reconcile_claim`] answers
//! `waiting` with `metalAssignment`); this step removes the assignment,
//! closes the claim's record ([`crate::provision::assign::ClaimAssignment::close`]: no
//! assignment is made for that uid after) and only then removes the
//! finalizer. For a claim deleted without its finalizers, release waits
//! on the record instead.

use serde_json::json;

pub use super::device::DEVICE_ANNOTATION;
use super::device::{resolve_device, DeviceRef};
use super::network::MACHINE_LABEL;
use super::objects::{paused, ClusterObject};
use super::ClaimAnswer;
use crate::cloud::CloudKind;
use crate::error::Result;
use crate::ipam::claim::ClaimObject;
use crate::ipam::ops;
use crate::ipam::store::ClaimRecord;
use crate::kube::conditions::{with_condition, Ready};
use crate::kube::{self, Kube, Resource};
use crate::kv::Ctx;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::provision::assign::{self, AssignState, ClaimAssignment, Labels, UnassignState, Want};
use crate::provision::clouds::PickCloud;
use crate::reconcile::{
    self, Cleanup, Condition, Handler, Order, Reason, Reconciled, StepResult, Verdict,
};

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
pub fn sync_claim_assignment<K: KvStore, H: HttpClient + ?Sized, C: PickCloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    cloud: &C,
    ns: &str,
    name: &str,
) -> Result<Reconciled> {
    reconcile::run(&mut Assignment {
        ctx,
        kube,
        cloud,
        ns,
        name,
        now: 0,
    })
}

fn unassigned(state: UnassignState, what: &str) -> Reconciled {
    match state {
        UnassignState::Done { deleted: Some(id) } => Reconciled::new(
            StepResult::Released,
            format!("{what}: Metal assignment {id} removed"),
        ),
        UnassignState::Done { deleted: None } => Reconciled::new(
            StepResult::Released,
            format!("{what}: nothing assigned in Metal"),
        ),
        UnassignState::InProgress(s) => Reconciled::new(
            StepResult::Waiting,
            format!("{what}: an assignment is in progress; removing it after"),
        )
        .retry_after(s),
    }
}

/// One claim's Metal assignment on the kit.
///
/// Order: [`Order::DeletionFirst`] — a deleting claim's assignment is
/// removed even while paused (the address is not released before). The
/// finalizer [`ASSIGNMENT_FINALIZER`] is added only once the claim has a
/// device (before the assignment); the cleanup runs with or without it
/// (someone may have removed it: the record still holds the assignment).
/// Verdicts: the `MetalAssigned` condition (`Assigned`, `DeviceUnknown`,
/// `DeviceNotFound`, `DeviceDeleted`, `DeviceNotActive`: `waiting`;
/// `AssignmentRefused`, `InvalidDevice`: `failed`), or none while an
/// assignment is in progress or closed.
struct Assignment<'r, 'a, K: KvStore, H: HttpClient + ?Sized, C: PickCloud + ?Sized> {
    ctx: &'r Ctx<'a, K>,
    kube: &'r Kube<'a, H>,
    cloud: &'r C,
    ns: &'r str,
    name: &'r str,
    /// The clock when the claim was read (the condition's time).
    now: u64,
}

/// What the gates before acting found (filled by [`Handler::paused`]).
#[derive(Default)]
struct Gates {
    /// The claim's binding and the labels of its assignment.
    bound: Option<(ClaimRecord, Labels)>,
    /// The claim's device.
    device: Option<DeviceRef>,
    /// The cloud of the claim's pool.
    cloud: CloudKind,
}

impl<K: KvStore, H: HttpClient + ?Sized, C: PickCloud + ?Sized> Assignment<'_, '_, K, H, C> {
    /// The gates after the claim's own pause: bound (else `waiting`), in a
    /// VRF-backed pool (else `ignored`), its Cluster not paused; then the
    /// device resolved.
    fn gates(&self, uid: &str, claim: &ClaimObject, g: &mut Gates) -> Result<Option<Reconciled>> {
        let (ns, kv) = (self.ns, self.ctx.kv);
        let Some(binding) = ops::get_claim(kv, ns, self.name)?.filter(|b| b.uid == uid) else {
            let msg = "the claim is not bound yet";
            return Ok(Some(Reconciled::new(StepResult::Waiting, msg)));
        };
        let pool_id = binding.pool_id(ns)?;
        let pool = ops::get_pool(kv, &pool_id, 0)?;
        let Some(cloud) = pool.and_then(|p| p.object.spec.backing().map(|b| b.kind())) else {
            let msg = format!("pool {} is not backed by a cloud", pool_id.display());
            return Ok(Some(Reconciled::new(StepResult::Ignored, msg)));
        };
        g.cloud = cloud;
        // A server's network profile puts its claims' addresses on the
        // server's memberships itself (one writer per server).
        if cloud == CloudKind::Phoenixnap && claim.metadata.label(MACHINE_LABEL).is_some() {
            let msg = "a network profile's claim: the machine's network apply puts its address on the server";
            return Ok(Some(Reconciled::new(StepResult::Ignored, msg)));
        }
        if let Some(cluster) = &binding.cluster_name {
            let c: Option<ClusterObject> = self.kube.get_as(&kube::CLUSTERS, Some(ns), cluster)?;
            if c.is_some_and(|c| c.is_paused()) {
                let msg = format!("Cluster {ns}/{cluster} is paused");
                return Ok(Some(Reconciled::new(StepResult::Paused, msg)));
            }
        }
        let labels = Labels {
            namespace: ns.to_string(),
            name: self.name.to_string(),
            uid: uid.to_string(),
            pool: format!("{} {}", pool_id.kind.kind_name(), pool_id.display()),
            cluster: binding.cluster_name.clone(),
        };
        // The address is read before the device is looked for.
        binding.ip()?;
        g.bound = Some((binding, labels));
        g.device = Some(resolve_device(self.kube, claim)?);
        Ok(None)
    }
}

impl<K: KvStore, H: HttpClient + ?Sized, C: PickCloud + ?Sized> Handler<H>
    for Assignment<'_, '_, K, H, C>
{
    type Object = ClaimObject;
    type Parsed = Gates;
    type Status = ();
    const ORDER: Order = Order::DeletionFirst;
    const NOUN: &'static str = "claim";
    const CLEANUP_NEEDS_FINALIZER: bool = false;

    fn kube(&self) -> &Kube<'_, H> {
        self.kube
    }
    fn resource(&self) -> &'static Resource {
        &kube::CLAIMS
    }
    fn finalizer(&self) -> Option<&'static str> {
        Some(ASSIGNMENT_FINALIZER)
    }

    fn read(&mut self, _first: bool) -> Result<Option<ClaimObject>> {
        self.now = self.ctx.env.now();
        Ok(self.kube.get_as(&kube::CLAIMS, Some(self.ns), self.name)?)
    }

    /// Gone without our finalizer's help: remove what the record holds.
    fn gone(&mut self) -> Result<Reconciled> {
        let (ctx, ns, name) = (self.ctx, self.ns, self.name);
        Ok(match assign::read(ctx.kv, ns, name)? {
            Some(rec) if !rec.closed => unassigned(
                assign::unassign(ctx, self.cloud, ns, name, &rec.uid)?,
                "the claim no longer exists",
            ),
            _ => Reconciled::new(StepResult::Absent, "the claim does not exist"),
        })
    }

    fn parse(&mut self, _: &ClaimObject) -> Result<Result<Gates, Verdict<()>>> {
        Ok(Ok(Gates::default()))
    }

    fn paused(&mut self, o: &ClaimObject, g: &mut Gates) -> Result<Option<Reconciled>> {
        if paused(o) {
            return Ok(Some(Reconciled::new(
                StepResult::Paused,
                "the claim is paused",
            )));
        }
        self.gates(o.metadata.uid.as_deref().unwrap_or_default(), o, g)
    }

    /// The address is not released while the record holds an assignment.
    fn cleanup(&mut self, o: &ClaimObject, _: &Gates) -> Result<Cleanup<()>> {
        let uid = o.metadata.uid.as_deref().unwrap_or_default();
        let state = assign::unassign(self.ctx, self.cloud, self.ns, self.name, uid)?;
        let done = matches!(state, UnassignState::Done { .. });
        let out = unassigned(state, "the claim is being deleted");
        Ok(if done {
            Cleanup::Done(out)
        } else {
            Cleanup::Pending(Verdict::answer(out))
        })
    }

    fn keeps_finalizer(&self, _: &ClaimObject, g: &Gates) -> bool {
        g.device
            .as_ref()
            .is_some_and(|d| matches!(d.for_cloud(g.cloud), Ok(Some(_))))
    }

    fn apply(&mut self, _: &ClaimObject, g: Gates) -> Result<Verdict<()>> {
        let (Some((binding, labels)), Some(device)) = (g.bound, g.device) else {
            unreachable!("the gates passed: bound, device resolved");
        };
        let address = binding.address.as_str();
        // A device of another cloud than the pool's is refused.
        let device = match device.for_cloud(g.cloud) {
            Ok(d) => d.map(str::to_string),
            Err(e) => {
                let msg = e.message().to_string();
                let out = Reconciled::new(StepResult::Failed, msg.clone()).with_address(address);
                return Ok(condition("InvalidDevice", false, msg, out));
            }
        };
        let want = Want {
            uid: labels.uid.clone(),
            address: binding.ip()?,
            device: device.clone(),
            cloud: g.cloud,
        };
        let state = match &device {
            Some(_) => assign::assign(self.ctx, self.cloud, &want, &labels)?,
            None => {
                ClaimAssignment::new(self.ctx, self.ns, self.name).prepare(&want)?;
                AssignState::DeviceUnknown
            }
        };
        Ok(verdict(&state, address, device.as_deref()))
    }

    fn write_status(&mut self, o: &ClaimObject, c: &Condition, _: &()) -> Result<bool> {
        let ready = Ready {
            status: c.ok,
            reason: c.reason.as_str(),
            message: &c.message,
            now: self.now,
        };
        write_condition(self.kube, o, ready)
    }
}

/// The `MetalAssigned` condition `reason` (`ok`) with `message`, and `out`.
fn condition(reason: &'static str, ok: bool, message: String, out: Reconciled) -> Verdict<()> {
    let c = Condition {
        ok,
        reason: Reason::Other(reason),
        message,
    };
    Verdict {
        status: Some((c, ())),
        outcome: out,
    }
}

/// What an assignment state means: the `MetalAssigned` condition (none
/// for a passing state) and the step's outcome, whose message is the
/// condition's, with the address.
fn verdict(state: &AssignState, address: &str, device: Option<&str>) -> Verdict<()> {
    let (cond, out) = table(state, address, device);
    let out = out.with_address(address);
    match cond {
        Some((reason, ok)) => condition(reason, ok, out.message.clone(), out),
        None => Verdict::answer(out),
    }
}

/// The table behind [`verdict`]: the condition's reason and status, and
/// the outcome.
fn table(
    state: &AssignState,
    address: &str,
    device: Option<&str>,
) -> (Option<(&'static str, bool)>, Reconciled) {
    let device = device.unwrap_or("?");
    let waiting = |reason, msg: String| {
        (
            Some((reason, false)),
            Reconciled::new(StepResult::Waiting, msg),
        )
    };
    match state {
        AssignState::Assigned(id) => (
            Some(("Assigned", true)),
            Reconciled::new(
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
            Reconciled::new(StepResult::Failed, format!("Metal refused the assignment: {m}")),
        ),
        AssignState::InProgress(s) => (
            None,
            Reconciled::new(StepResult::Waiting, "an assignment is in progress").retry_after(*s),
        ),
        AssignState::Closed => (
            None,
            Reconciled::new(
                StepResult::Waiting,
                "the claim's assignment was closed (the claim is going)",
            ),
        ),
    }
}
