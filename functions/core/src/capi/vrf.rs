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
//! on the pool record (`provision::step::may_register`), so it can never
//! re-register a pool whose teardown started (see `kv-schema/README.md`).
//!
//! A pool without `spec.metal` is not this step's (`ignored`), unless its
//! Metal resources exist: `spec.metal` was removed (the webhook refuses
//! that), which is `Ready=False MetalSpecChanged`.

use serde_json::{json, Map, Value};

use super::objects::{paused, PoolResource};
use super::{resource_of, write_pool_status, Outcome, StepResult, POOL_FINALIZER};
use crate::admission::ProfileLookup;
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::ops;
use crate::ipam::pool::PoolKind;
use crate::ipam::pool::{PoolId, PoolObject};
use crate::ipam::vrf::Resource;
use crate::kube::conditions::Ready;
use crate::kube::meta::{add_finalizer, remove_finalizer, retrying};
use crate::kube::object::{Meta, Object, WithJson};
use crate::kube::{Kube, Resource as KubeResource, NETWORK_PROFILES};
use crate::kv::Ctx;
use crate::metal::client::Metal;
use crate::network::profile::{PoolName, Profile};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::ports::Env;
use crate::provision::plan::{owner, Owner, Progress};
use crate::provision::step::{self, Begun, Phase, Target};

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
pub fn sync_vrf_pool<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    id: &PoolId,
) -> Result<Outcome> {
    let before = kube.calls();
    let mut out = retrying(|| sync_once(ctx, kube, metal, id))?;
    out.kube_calls = kube.calls() - before;
    Ok(out)
}

/// The pool object being synced, and what every status write needs.
struct Pool<'o> {
    id: &'o PoolId,
    r: &'static KubeResource,
    o: &'o WithJson<PoolResource>,
    now: u64,
}

impl Pool<'_> {
    /// Writes `status` (`fields` beside `Ready`) if it differs.
    fn status<H: HttpClient + ?Sized>(
        &self,
        kube: &Kube<'_, H>,
        fields: Option<Map<String, Value>>,
        cond: Ready<'_>,
    ) -> Result<bool> {
        write_pool_status(kube, self.r, &self.o.typed, fields, cond)
    }

    /// `Ready=False reason` with `msg`, and the step `failed`.
    fn failed<H: HttpClient + ?Sized>(
        &self,
        kube: &Kube<'_, H>,
        reason: &str,
        msg: &str,
        out: String,
    ) -> Result<Outcome> {
        self.status(kube, None, Ready::no(reason, msg, self.now))?;
        Ok(Outcome::new(StepResult::Failed, out))
    }

    /// `Ready=False reason` with `status.metal` from `progress`, and the
    /// step `waiting`, to run again after `retry_after_s`.
    fn waiting<H: HttpClient + ?Sized>(
        &self,
        kube: &Kube<'_, H>,
        progress: &Progress,
        reason: &str,
        msg: String,
        retry_after_s: u64,
    ) -> Result<Outcome> {
        let cond = Ready::no(reason, &msg, self.now);
        self.status(kube, Some(metal_status(progress, None)), cond)?;
        Ok(Outcome::new(StepResult::Waiting, msg).retry_after(retry_after_s))
    }
}

fn sync_once<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    id: &PoolId,
) -> Result<Outcome> {
    let r = resource_of(id.kind);
    let Some(o) = kube.get_as::<WithJson<PoolResource>>(r, id.namespace.as_deref(), &id.name)?
    else {
        return Ok(Outcome::new(
            StepResult::Absent,
            format!("pool {} does not exist", id.display()),
        ));
    };
    let now = ctx.env.now();
    let pool = Pool { id, r, o: &o, now };
    let deleting = o.meta().deleting();
    let object = match PoolObject::parse(id, &o.json) {
        Ok(p) => p,
        Err(e) if deleting => return Ok(Outcome::new(StepResult::Failed, e.to_string())),
        Err(e) => return pool.failed(kube, "InvalidSpec", &e.to_string(), e.to_string()),
    };
    let Some(spec) = object.spec.metal.clone() else {
        return no_spec_metal(ctx, kube, &pool);
    };
    let target = Target::new(
        id,
        &spec,
        o.meta().uid.as_deref(),
        o.meta().label(crate::ipam::claim::CLUSTER_NAME_LABEL),
    );
    if deleting {
        return teardown(ctx, kube, metal, &pool, &target);
    }
    if paused(&o) {
        return Ok(Outcome::new(
            StepResult::Paused,
            format!("pool {} is paused", id.display()),
        ));
    }
    // The section's rules, deletion policies Metal can carry out included:
    // checked before anything is created (the webhook may be bypassed).
    if let Err(e) = spec.validate() {
        return pool.failed(kube, "InvalidSpec", &e.to_string(), e.to_string());
    }
    let o = add_finalizer(kube, r, &o, POOL_FINALIZER)?;
    provision(ctx, kube, metal, &Pool { o: &o, ..pool }, object, &target)
}

/// A pool without `spec.metal`: not this step's (`ignored`), unless its
/// Metal resources exist (`spec.metal` removed behind the webhook's back):
/// `Ready=False MetalSpecChanged` rather than orphaning them silently.
fn no_spec_metal<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    pool: &Pool<'_>,
) -> Result<Outcome> {
    let meta = pool.o.meta();
    let held = || -> Result<bool> {
        let cur = step::read_state(ctx.kv, pool.id)?;
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
        return pool.failed(kube, e.reason(), &e.to_string(), e.to_string());
    }
    Ok(Outcome::new(
        StepResult::Ignored,
        format!(
            "pool {} is not VRF-backed (no spec.metal)",
            pool.id.display()
        ),
    ))
}

/// The deleting pool: teardown marked, store deletion, profiles waited
/// for, Metal teardown, finalizer removed (see the module docs, step 2).
fn teardown<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    pool: &Pool<'_>,
    target: &Target,
) -> Result<Outcome> {
    let (id, o) = (pool.id, pool.o);
    if !o.meta().has_finalizer(POOL_FINALIZER) {
        return Ok(Outcome::new(
            StepResult::Absent,
            "the pool is being deleted and holds no metal-ipam finalizer",
        ));
    }
    // From here on nothing is created or registered for the pool.
    if step::begin_teardown(ctx, id, target.uid.as_deref())? == Begun::Gone {
        // Torn down already (the store deletion came before it).
        remove_finalizer(kube, pool.r, o, POOL_FINALIZER)?;
        return Ok(Outcome::new(
            StepResult::Deleted,
            format!("pool {} and its Metal resources deleted", id.display()),
        ));
    }
    if let Err(e) = ops::delete_provisioned_pool(ctx, id) {
        if e.reason() == "PoolInUse" {
            let cond = Ready::no("PoolInUse", e.message(), pool.now);
            pool.status(kube, None, cond)?;
            return Ok(Outcome::new(StepResult::Waiting, e.message().to_string()));
        }
        return Err(e);
    }
    if let Some(waiting) = vlan_in_use(ctx, kube, metal, pool)? {
        return Ok(waiting);
    }
    let report = step::deprovision(ctx, metal, target)?;
    match report.phase {
        Phase::Gone => {
            remove_finalizer(kube, pool.r, o, POOL_FINALIZER)?;
            Ok(Outcome::new(
                StepResult::Deleted,
                format!(
                    "pool {} and its Metal resources deleted ({})",
                    id.display(),
                    report.done.join(", ")
                ),
            ))
        }
        Phase::InProgress {
            waiting,
            retry_after_s,
        } => pool.waiting(
            kube,
            &report.progress,
            "MetalTearingDown",
            waiting,
            retry_after_s,
        ),
        Phase::Ready { .. } => unreachable!("teardown never reports ready"),
    }
}

/// A teardown waiting while `MetalNetworkProfile`s put the pool's VLAN on
/// machines (`Ready=False PoolVlanInUse` naming them); `None` when none
/// does.
fn vlan_in_use<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    pool: &Pool<'_>,
) -> Result<Option<Outcome>> {
    let progress = step::read_progress(ctx, pool.id)?;
    let vlan = progress.vlan.as_ref().map(|h| h.id.as_str());
    let users = vlan_users(kube, pool.id, vlan)?;
    if users.is_empty() {
        return Ok(None);
    }
    let ports = match vlan {
        Some(v) => metal.vlan_ports(v)?,
        None => Vec::new(),
    };
    let waiting = format!(
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
    pool.waiting(
        kube,
        &progress,
        REASON_VLAN_IN_USE,
        waiting,
        VLAN_IN_USE_RETRY_S,
    )
    .map(Some)
}

/// The live pool, finalizer held: provision (adopt or create, one recorded
/// action per round), then register once ready (see the module docs,
/// step 3). Metal's refusals and a resource that does not fit are
/// `Ready=False` naming them.
fn provision<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    pool: &Pool<'_>,
    object: PoolObject,
    target: &Target,
) -> Result<Outcome> {
    let report = match step::provision(ctx, metal, target) {
        Ok(r) => r,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::Invalid | ErrorKind::Conflict | ErrorKind::NotFound
            ) =>
        {
            return pool.failed(kube, e.reason(), &e.to_string(), e.to_string());
        }
        Err(e) => return Err(e),
    };
    match report.phase {
        Phase::Ready { block } => {
            let uid = target.uid.as_deref();
            register(ctx, kube, pool, object, (block, uid), &report.progress)
        }
        Phase::InProgress {
            waiting,
            retry_after_s,
        } => pool.waiting(
            kube,
            &report.progress,
            REASON_PROVISIONING,
            waiting,
            retry_after_s,
        ),
        Phase::Gone => unreachable!("provisioning never reports gone"),
    }
}

/// Every resource exists and the gateway is active: the pool registered
/// with `block`'s addresses (adopting its `IPAddress`es when the store
/// does not know it), under the registration gate for the incarnation
/// `uid`, and `Ready=True`.
fn register<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    pool: &Pool<'_>,
    object: PoolObject,
    (block, uid): ((std::net::IpAddr, u8), Option<&str>),
    progress: &Progress,
) -> Result<Outcome> {
    let id = pool.id;
    let adoptions = if ops::get_pool(ctx.kv, id)?.is_none() {
        super::adoptions_for(kube, id)?
    } else {
        Vec::new()
    };
    let cidr = format!("{}/{}", block.0, block.1);
    let may = || step::may_register(ctx.kv, id, uid);
    match ops::put_provisioned_pool(ctx, object, block, &adoptions, &may) {
        Ok((_, view)) => {
            let counts = view.to_json()["status"]["ipAddresses"].clone();
            let mut st = metal_status(progress, Some(&cidr));
            st.insert("ipAddresses".into(), counts);
            pool.status(kube, Some(st), Ready::yes("PoolReady", pool.now))?;
            Ok(Outcome::new(
                StepResult::Synced,
                format!("pool {} is ready on {cidr}", id.display()),
            ))
        }
        Err(e) if matches!(e.kind(), ErrorKind::Invalid | ErrorKind::Conflict) => {
            pool.failed(kube, e.reason(), e.message(), e.to_string())
        }
        Err(e) => Err(e),
    }
}

/// `status.metal` from the recorded progress (and the block, once read).
fn metal_status(p: &Progress, block: Option<&str>) -> Map<String, Value> {
    let mut m = Map::new();
    for r in Resource::ALL {
        if let Some(h) = p.held(r) {
            let mut e = json!({"id": h.id, "created": h.created});
            if r == Resource::Gateway {
                if let Some(s) = &p.gateway_state {
                    e["state"] = s.clone().into();
                }
            }
            if let (Resource::Reservation, Some(b)) = (r, block) {
                e["block"] = b.into();
            }
            m.insert(r.field().into(), e);
        }
    }
    let mut st = Map::new();
    st.insert("metal".into(), Value::Object(m));
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
    let resolves = |p: &PoolName, ns: &str| -> bool {
        let named = match p.kind.as_deref() {
            Some("GlobalMetalIPPool") => PoolId::global(&p.name),
            _ => PoolId::of(PoolKind::Namespaced, ns, &p.name),
        };
        named == *id
    };
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

/// The webhook's view of the profiles (rule 6 of [`crate::admission`]):
/// the pool's recorded VLAN from the store, the profiles from the API
/// server ([`vlan_users`]).
pub struct KubeProfiles<'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The store (the progress record).
    pub kv: &'a K,
    /// The API server.
    pub kube: &'a Kube<'a, H>,
}

impl<K: KvStore, H: HttpClient + ?Sized> ProfileLookup for KubeProfiles<'_, K, H> {
    fn vlan_users(&self, id: &PoolId) -> Result<Vec<String>> {
        let p = step::read_state(self.kv, id)?.filter(|p| !p.deleted);
        let vlan = p
            .as_ref()
            .and_then(|p| p.vlan.as_ref())
            .map(|h| h.id.clone());
        vlan_users(self.kube, id, vlan.as_deref())
    }
}
