//! The pool contract for VRF-backed pools (`spec.metal`): their Metal
//! resources are provisioned before the pool is registered, and torn down
//! after it is deleted from the store.
//!
//! [`sync_vrf_pool`] is the step the `provision` component runs for a pool
//! object:
//! 1. Gone from Kubernetes: nothing to do (its finalizer kept it until its
//!    resources were torn down).
//! 2. Deleting: mark the teardown in the progress record (from then on
//!    nothing is created or registered for the pool), remove it from the
//!    store (refused while addresses are allocated: `Ready=False
//!    PoolInUse`), wait while a `MetalNetworkProfile` still puts the pool's
//!    VLAN on machines (`Ready=False PoolVlanInUse` naming the profiles:
//!    tearing the gateway or the VLAN down would cut their network), tear
//!    its Metal resources down (by the deletion decisions recorded when they
//!    were created or adopted, over as many invocations as Metal's
//!    asynchrony needs), then remove our finalizer.
//! 3. Otherwise: add our finalizer, provision (adopt or create, in order,
//!    exactly once), and once every resource exists and the gateway is
//!    active, register the pool with its block's addresses and write
//!    `Ready=True`. Until then `Ready=False MetalProvisioning` says what it
//!    waits for. `status.metal` lists the resources' ids and the gateway's
//!    state either way. An invalid `spec.metal` (deletion policies Metal
//!    cannot carry out included) is `Ready=False InvalidSpec` before
//!    anything is created, and one changed where the resources cannot follow
//!    is `Ready=False MetalSpecChanged`, both naming the field, with no Metal
//!    write.
//!
//! The registration reads the progress record inside its compare-and-swap
//! on the pool record (`provision::transitions::may_register`), so it can never
//! re-register a pool whose teardown started (see `kv-schema/README.md`).
//!
//! A pool without `spec.metal` is not this step's (`ignored`), unless its
//! Metal resources exist: `spec.metal` was removed (the webhook refuses
//! that), which is `Ready=False MetalSpecChanged`.

use serde_json::{json, Map, Value};

use super::objects::{paused, PoolResource};
use super::{write_pool_status, POOL_FINALIZER};
use crate::error::{Error, ErrorKind, Known, Result};
use crate::ipam::backing::{Backing, BackingSpec};
use crate::ipam::ops;
use crate::ipam::pool::{PoolId, PoolObject};
use crate::ipam::vrf::Resource;
use crate::kube::conditions::Ready;
use crate::kube::object::{Meta, Object, WithJson};
use crate::kube::{Kube, Resource as KubeResource, NETWORK_PROFILES};
use crate::kv::Ctx;
use crate::network::profile::{PoolName, Profile};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::provision::plan::{owner, Owner, Progress};
use crate::provision::record::{read_progress, read_state};
use crate::provision::step::{self, ProvisionPhase};
use crate::provision::target::Target;
use crate::provision::transitions::{may_register, Begun, PoolRecord};
use crate::provision::vrf_cloud::VrfCloud;
use crate::reconcile::{
    self, Cleanup, Condition, Handler, Order, Reason, Reconciled, StepResult, Verdict,
};

/// Reason of `Ready=False` while Metal resources are being provisioned.
pub const REASON_PROVISIONING: &str = "MetalProvisioning";

/// Reason of `Ready=False` while a deleted pool's teardown waits for the
/// profiles that use its VLAN.
pub const REASON_VLAN_IN_USE: &str = "PoolVlanInUse";

/// Seconds after which a teardown waiting for profiles looks again.
pub const VLAN_IN_USE_RETRY_S: u64 = 30;

/// Reconciles one VRF-backed pool object (see the module docs).
///
/// # Idempotency
/// Safe to run any number of times and concurrently on several instances:
/// Metal resources are created at most once (see [`crate::provision`]) and
/// every Kubernetes write is guarded by `resourceVersion`. Once ready, a run
/// makes no Metal or Kubernetes write.
///
/// # Errors
/// 503 while Metal, the API server or the store is unavailable, or a
/// creation's outcome is unknown (the next run looks for it first); 500 for
/// credentials problems. An invalid `spec.metal`, an adopted resource that
/// does not fit, and Metal's refusals go to the pool's `Ready=False`
/// condition instead (`failed`).
pub fn sync_vrf_pool<K: KvStore, H: HttpClient + ?Sized, C: VrfCloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    cloud: &C,
    id: &PoolId,
) -> Result<Reconciled> {
    reconcile::run(&mut VrfPool {
        ctx,
        kube,
        cloud,
        id,
        now: 0,
    })
}

/// One VRF-backed pool's reconciliation on the kit.
///
/// Order: [`Order::DeletionFirst`] — a deleted pool is torn down even while
/// paused (its Metal resources are billable). Finalizer:
/// [`POOL_FINALIZER`]; a deleting pool without it is not ours to tear
/// down. Verdicts: `Ready=True PoolReady`; `Ready=False` with
/// `InvalidSpec`, `MetalSpecChanged`, Metal's refusals (`failed`),
/// `MetalProvisioning`, `PoolInUse`, `PoolVlanInUse`, `MetalTearingDown`
/// (`waiting`); `status.metal` beside them once resources are recorded.
struct VrfPool<'r, 'a, K: KvStore, H: HttpClient + ?Sized, C: VrfCloud + ?Sized> {
    ctx: &'r Ctx<'a, K>,
    kube: &'r Kube<'a, H>,
    cloud: &'r C,
    id: &'r PoolId,
    /// The clock when the object was read (the conditions' time).
    now: u64,
}

/// A pool object with `spec.metal`, parsed.
struct Parsed {
    object: PoolObject,
    spec: BackingSpec,
    /// Why `spec.metal` breaks the section's rules (deletion policies
    /// Metal can carry out included): refused before anything is created,
    /// even the finalizer (the webhook may be bypassed).
    invalid: Option<String>,
}

/// `status` fields beside the condition (`metal`, `ipAddresses`).
type Fields = Option<Map<String, Value>>;

impl<K: KvStore, H: HttpClient + ?Sized, C: VrfCloud + ?Sized> VrfPool<'_, '_, K, H, C> {
    fn target<'p>(&'p self, o: &WithJson<PoolResource>, spec: &'p BackingSpec) -> Target<'p> {
        let m = o.meta();
        let cluster = m.label(crate::ipam::claim::CLUSTER_NAME_LABEL);
        Target::new(self.id, spec, m.uid.as_deref(), cluster)
    }

    /// Without `spec.metal`: not this step's (`ignored`), unless its Metal
    /// resources exist (`spec.metal` removed behind the webhook's back):
    /// `MetalSpecChanged` rather than orphaning them silently.
    fn no_spec_metal(&self, o: &WithJson<PoolResource>) -> Result<Verdict<Fields>> {
        let meta = o.meta();
        let held = || -> Result<bool> {
            let cur = read_state(self.ctx.kv, self.id)?;
            Ok(
                matches!(owner(cur.as_ref(), meta.uid.as_deref()), Owner::Mine)
                    && cur.as_ref().is_some_and(Progress::holds_anything),
            )
        };
        if !meta.deleting() && held()? {
            let e = Error::new(
                ErrorKind::Invalid,
                "MetalSpecChanged",
                "cannot be removed: the pool's Metal resources exist (delete the pool to tear them down)",
            )
            .with_field("spec.metal");
            return Ok(Verdict::not_ready(
                Reason::Other(e.reason()),
                e.to_string(),
                None,
            ));
        }
        let id = self.id.display();
        let msg = format!("pool {id} is not VRF-backed (no spec.metal)");
        Ok(Verdict::just(StepResult::Ignored, msg))
    }
}

impl<K: KvStore, H: HttpClient + ?Sized, C: VrfCloud + ?Sized> Handler<H>
    for VrfPool<'_, '_, K, H, C>
{
    type Object = WithJson<PoolResource>;
    type Parsed = Parsed;
    type Status = Fields;
    const ORDER: Order = Order::DeletionFirst;
    const NOUN: &'static str = "pool";
    const CLEANUP_NEEDS_FINALIZER: bool = true;

    fn kube(&self) -> &Kube<'_, H> {
        self.kube
    }
    fn resource(&self) -> &'static KubeResource {
        self.id.kind.resource()
    }
    fn finalizer(&self) -> Option<&'static str> {
        Some(POOL_FINALIZER)
    }

    fn read(&mut self, _first: bool) -> Result<Option<Self::Object>> {
        self.now = self.ctx.env.now();
        let (r, id) = (self.resource(), self.id);
        Ok(self.kube.get_as(r, id.namespace.as_deref(), &id.name)?)
    }

    fn gone(&mut self) -> Result<Reconciled> {
        // Its finalizer kept it until its resources were torn down.
        let msg = format!("pool {} does not exist", self.id.display());
        Ok(Reconciled::new(StepResult::Absent, msg))
    }

    fn parse(&mut self, o: &Self::Object) -> Result<Result<Parsed, Verdict<Fields>>> {
        let object = match PoolObject::parse(self.id, &o.json) {
            Ok(p) => p,
            Err(e) => {
                return Ok(Err(Verdict::not_ready(
                    Reason::InvalidSpec,
                    e.to_string(),
                    None,
                )))
            }
        };
        let Some(spec) = object.spec.backing().map(Backing::to_owned_spec) else {
            return self.no_spec_metal(o).map(Err);
        };
        let invalid = spec.as_backing().validate().err().map(|e| e.to_string());
        Ok(Ok(Parsed {
            object,
            spec,
            invalid,
        }))
    }

    fn paused(&mut self, o: &Self::Object, _: &mut Parsed) -> Result<Option<Reconciled>> {
        let msg = || format!("pool {} is paused", self.id.display());
        Ok(paused(o).then(|| Reconciled::new(StepResult::Paused, msg())))
    }

    fn cleanup(&mut self, o: &Self::Object, p: &Parsed) -> Result<Cleanup<Fields>> {
        teardown(self, &self.target(o, &p.spec))
    }

    fn keeps_finalizer(&self, _: &Self::Object, p: &Parsed) -> bool {
        p.invalid.is_none()
    }

    fn apply(&mut self, o: &Self::Object, p: Parsed) -> Result<Verdict<Fields>> {
        if let Some(e) = p.invalid {
            return Ok(Verdict::not_ready(Reason::InvalidSpec, e, None));
        }
        provision(self, &self.target(o, &p.spec), p.object)
    }

    fn write_status(&mut self, o: &Self::Object, c: &Condition, s: &Fields) -> Result<bool> {
        let ready = Ready {
            status: c.ok,
            reason: c.reason.as_str(),
            message: &c.message,
            now: self.now,
        };
        write_pool_status(self.kube, self.resource(), &o.typed, s.clone(), ready)
    }
}

/// `Ready=False reason` with `status.metal` from `progress`: the step
/// waits `retry_after_s`.
fn waiting(
    backing: Backing<'_>,
    progress: &Progress,
    reason: Reason,
    msg: String,
    retry_after_s: u64,
) -> Verdict<Fields> {
    let fields = Some(backing_status(backing, progress, None));
    Verdict::not_ready(reason, msg, fields).map_outcome(|o| o.retry_after(retry_after_s))
}

/// The deleting pool, finalizer held: teardown marked, store deletion,
/// profiles waited for, Metal teardown (see the module docs, step 2).
fn teardown<K: KvStore, H: HttpClient + ?Sized, C: VrfCloud + ?Sized>(
    h: &VrfPool<'_, '_, K, H, C>,
    target: &Target,
) -> Result<Cleanup<Fields>> {
    let (ctx, id) = (h.ctx, h.id);
    let deleted = |more: String| {
        let msg = format!(
            "pool {} and its Metal resources deleted{more}",
            id.display()
        );
        Ok(Cleanup::Done(Reconciled::new(StepResult::Deleted, msg)))
    };
    // From here on nothing is created or registered for the pool.
    if PoolRecord::new(ctx, id, target.uid.as_deref()).begin_teardown()? == Begun::Gone {
        // Torn down already (the store deletion came before it).
        return deleted(String::new());
    }
    if let Err(e) = ops::delete_provisioned_pool(ctx, id) {
        if e.is(Known::PoolInUse) {
            let v = Verdict::not_ready(Reason::PoolInUse, e.message(), None);
            return Ok(Cleanup::Pending(v));
        }
        return Err(e);
    }
    if let Some(v) = vlan_in_use(h, target)? {
        return Ok(Cleanup::Pending(v));
    }
    let report = step::deprovision(ctx, h.cloud, target)?;
    match report.phase {
        ProvisionPhase::Gone => deleted(format!(" ({})", report.done.join(", "))),
        ProvisionPhase::InProgress {
            waiting: w,
            retry_after_s,
        } => {
            let v = waiting(
                target.spec,
                &report.progress,
                Reason::MetalTearingDown,
                w,
                retry_after_s,
            );
            Ok(Cleanup::Pending(v))
        }
        ProvisionPhase::Ready { .. } => unreachable!("teardown never reports ready"),
    }
}

/// A teardown waiting while `MetalNetworkProfile`s put the pool's VLAN on
/// machines (`PoolVlanInUse` naming them); `None` when none does.
fn vlan_in_use<K: KvStore, H: HttpClient + ?Sized, C: VrfCloud + ?Sized>(
    h: &VrfPool<'_, '_, K, H, C>,
    target: &Target<'_>,
) -> Result<Option<Verdict<Fields>>> {
    let progress = read_progress(h.ctx, h.id)?;
    let vlan = progress.vlan.as_ref().map(|h| h.id.as_str());
    let users = vlan_users(h.kube, h.id, vlan)?;
    if users.is_empty() {
        return Ok(None);
    }
    let ports = match vlan {
        Some(v) => h.cloud.vlan_ports(target, v)?,
        None => Vec::new(),
    };
    let msg = format!(
        "the pool's VLAN is still used by MetalNetworkProfile {} (on {} port(s){}): \
         nothing is torn down until no profile uses it",
        users.join(", "),
        ports.len(),
        if ports.is_empty() {
            String::new()
        } else {
            format!(": {}", ports.join(", "))
        }
    );
    let reason = Reason::PoolVlanInUse;
    Ok(Some(waiting(
        target.spec,
        &progress,
        reason,
        msg,
        VLAN_IN_USE_RETRY_S,
    )))
}

/// The live pool, finalizer held: provision (adopt or create, one recorded
/// action per round), then register once ready (see the module docs,
/// step 3). Metal's refusals and a resource that does not fit are
/// verdicts naming them.
fn provision<K: KvStore, H: HttpClient + ?Sized, C: VrfCloud + ?Sized>(
    h: &VrfPool<'_, '_, K, H, C>,
    target: &Target,
    object: PoolObject,
) -> Result<Verdict<Fields>> {
    let report = match step::provision(h.ctx, h.cloud, target) {
        Ok(r) => r,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::Invalid | ErrorKind::Conflict | ErrorKind::NotFound
            ) =>
        {
            return Ok(Verdict::not_ready(
                Reason::Other(e.reason()),
                e.to_string(),
                None,
            ));
        }
        Err(e) => return Err(e),
    };
    match report.phase {
        ProvisionPhase::Ready { block } => {
            let uid = target.uid.as_deref();
            register(h, object, (block, uid), target.spec, &report.progress)
        }
        ProvisionPhase::InProgress {
            waiting: w,
            retry_after_s,
        } => Ok(waiting(
            target.spec,
            &report.progress,
            Reason::MetalProvisioning,
            w,
            retry_after_s,
        )),
        ProvisionPhase::Gone => unreachable!("provisioning never reports gone"),
    }
}

/// Every resource exists and the gateway is active: the pool registered
/// with `block`'s addresses (adopting its `IPAddress`es when the store
/// does not know it), under the registration gate for the incarnation
/// `uid`, and `Ready=True`.
fn register<K: KvStore, H: HttpClient + ?Sized, C: VrfCloud + ?Sized>(
    h: &VrfPool<'_, '_, K, H, C>,
    object: PoolObject,
    (block, uid): ((std::net::IpAddr, u8), Option<&str>),
    backing: Backing<'_>,
    progress: &Progress,
) -> Result<Verdict<Fields>> {
    let (ctx, id) = (h.ctx, h.id);
    let adoptions = if !matches!(ops::find_pool(ctx.kv, id)?, ops::Found::Live(_)) {
        super::adoptions_for(h.kube, id)?
    } else {
        Vec::new()
    };
    let cidr = format!("{}/{}", block.0, block.1);
    let may = || may_register(ctx.kv, id, uid);
    match ops::put_provisioned_pool(ctx, object, block, &adoptions, &may) {
        Ok((_, view)) => {
            let counts = view.to_json()["status"]["ipAddresses"].clone();
            let mut st = backing_status(backing, progress, Some(&cidr));
            st.insert("ipAddresses".into(), counts);
            let msg = format!("pool {} is ready on {cidr}", id.display());
            let out = Reconciled::new(StepResult::Synced, msg);
            Ok(Verdict::ready(Reason::PoolReady, Some(st), out))
        }
        Err(e) if matches!(e.kind(), ErrorKind::Invalid | ErrorKind::Conflict) => {
            let out = Reconciled::new(StepResult::Failed, e.to_string());
            let v = Verdict::not_ready(Reason::Other(e.reason()), e.message(), None);
            Ok(v.map_outcome(|_| out))
        }
        Err(e) => Err(e),
    }
}

/// `status.metal` from the recorded progress (and the block, once read).
/// `status.metal` (or `status.phoenixnap`): each held resource's id and
/// whether metal-ipam created it, under its spec field; the gateway's state;
/// the block on the resource that is it (Metal's reservation, phoenixNAP's
/// IP block, else its private network).
fn backing_status(b: Backing<'_>, p: &Progress, block: Option<&str>) -> Map<String, Value> {
    let mut m = Map::new();
    let block_on = if b.chain().contains(&Resource::Reservation) {
        Resource::Reservation
    } else {
        Resource::Vlan
    };
    for &r in b.chain() {
        if let Some(h) = p.held(r) {
            let mut e = json!({"id": h.id, "created": h.created});
            if r == Resource::Gateway {
                if let Some(s) = &p.gateway_state {
                    e["state"] = s.clone().into();
                }
            }
            if let Some(cidr) = block.filter(|_| r == block_on) {
                e["block"] = cidr.into();
            }
            m.insert(b.field(r).into(), e);
        }
    }
    let key = match b {
        Backing::Metal(_) => "metal",
        Backing::Pnap(_) => "phoenixnap",
    };
    let mut st = Map::new();
    st.insert(key.into(), Value::Object(m));
    st
}

/// The `MetalNetworkProfile`s (`namespace/name`, sorted) that put pool
/// `id`'s VLAN on machines: a VLAN (or native VLAN) named by the pool,
/// resolved in the profile's namespace as the network step does (a
/// `GlobalMetalIPPool` by kind), or by the VLAN's id `vlan`. One list of
/// every namespace's profiles; a profile that does not parse names nothing.
///
/// # Errors
/// The API server's errors.
pub fn vlan_users<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    id: &PoolId,
    vlan: Option<&str>,
) -> Result<Vec<String>> {
    let resolves = |p: &PoolName, ns: &str| -> bool { p.id(ns) == *id };
    let mut users = Vec::new();
    for o in kube.list_as::<WithJson<Meta>>(&NETWORK_PROFILES, None)? {
        let ns = o.meta().namespace.clone().unwrap_or_default();
        let spec = o.json.get("spec").cloned().unwrap_or(Value::Null);
        let Ok(profile) = Profile::from_json(&spec) else {
            continue;
        };
        let uses = profile.ports.iter().any(|port| {
            let refs = port
                .vlans
                .iter()
                .map(|v| (v.id.as_deref(), v.pool.as_ref()))
                .chain(
                    port.native_vlan
                        .iter()
                        .map(|v| (v.id.as_deref(), v.pool.as_ref())),
                );
            refs.into_iter().any(|(vid, pool)| {
                pool.is_some_and(|p| resolves(p, &ns)) || (vid.is_some() && vid == vlan)
            })
        });
        if uses {
            users.push(format!("{ns}/{}", o.meta().name));
        }
    }
    users.sort();
    Ok(users)
}
