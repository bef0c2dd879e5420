//! The profile on the device: its VLANs resolved to the cloud's segments,
//! the plan (`dryRun`), the apply and the release, through the
//! [`Cloud`] seam. A Metal device's ports are applied by
//! [`crate::network::apply`]; a phoenixNAP server's networks, with the
//! addresses of the machine's claims and the profile's static ones, by
//! [`crate::network::memberships`] (which waits until every claim of the
//! profile has its address: a server joins a network with its addresses).

use serde_json::{json, Value};

use super::claims::{delete_claims, delete_stale, ensure_claims};
use super::netconfig::bound_addresses;
use super::{machine_and_infra, not_found, read_machine, Deps, MachineNetwork, PROFILE_ANNOTATION};
use crate::capi::device::{device_cloud, device_in};
use crate::cloud::{Cloud, CloudKind, Segment};
use crate::error::{Error, Result};
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::Resource as MetalResource;
use crate::kv::Ctx;
use crate::network::apply::{self, ApplyReport};
use crate::network::memberships::{self, MemberStep, Wanted};
use crate::network::node::Slot;
use crate::network::plan::{Desired, Observed, PortStep};
use crate::network::profile::{PoolName, Profile, VlanRef};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::provision::record::read_progress;

/// The profile's VLANs, resolved: (reference, UUID, number).
type Resolved = Vec<(VlanRef, String, u16)>;

pub(super) fn resolve_vlans<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    ns: &str,
    profile: &Profile,
) -> Result<Resolved> {
    let mut out: Resolved = Vec::new();
    // Metal's metro or phoenixNAP's location: where numbers are looked up.
    let metro = profile
        .metro
        .as_deref()
        .or(profile.location.as_deref())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let mut metro_vlans: Option<Vec<Segment>> = None;
    let refs = profile.ports.iter().flat_map(|p| {
        p.vlans
            .iter()
            .map(|v| v.vlan())
            .chain(p.native_vlan.clone())
    });
    for r in refs {
        if out.iter().any(|(x, _, _)| *x == r) {
            continue;
        }
        let vlan = match (&r.id, r.vxlan, &r.pool) {
            (Some(id), _, _) => cloud.segment(id)?,
            (_, Some(n), _) => {
                // The metro's VLANs, listed once for every number.
                if metro_vlans.is_none() {
                    metro_vlans = Some(cloud.segments(&metro)?);
                }
                metro_vlans
                    .iter()
                    .flatten()
                    .find(|v| v.is(n, &metro))
                    .cloned()
            }
            (_, _, Some(p)) => {
                let progress = read_progress(ctx, &pool_id(p, ns))?;
                match progress.held(MetalResource::Vlan) {
                    Some(h) => cloud.segment(&h.id)?,
                    None => None,
                }
            }
            _ => None,
        };
        let Some(v) = vlan else {
            return Err(not_found(
                "VlanNotFound",
                format!(
                    "the VLAN {} does not exist in {} (yet)",
                    describe(&r),
                    cloud.name()
                ),
            ));
        };
        let n = v
            .vlan
            .ok_or_else(|| Error::internal(format!("VLAN {} has no vxlan", v.id)))?;
        out.push((r, v.id, n));
    }
    Ok(out)
}

fn describe(r: &VlanRef) -> String {
    match (&r.id, r.vxlan, &r.pool) {
        (Some(id), _, _) => id.clone(),
        (_, Some(n), _) => format!("vxlan {n}"),
        (_, _, Some(p)) => format!("of pool {}", p.name),
        _ => "?".into(),
    }
}

fn pool_id(p: &PoolName, ns: &str) -> PoolId {
    p.id(ns)
}

/// The desired state of the device's ports, from the profile and what
/// `observed` shows.
fn desired_on<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    ns: &str,
    m: &MachineNetwork,
    observed: &Observed,
) -> Result<Desired> {
    let resolved = resolve_vlans(ctx, cloud, ns, &m.profile)?;
    let lookup = |r: &VlanRef| {
        resolved
            .iter()
            .find(|(x, _, _)| x == r)
            .map(|(_, id, _)| id.clone())
    };
    Desired::from_profile(&m.profile, observed.eth_ports(), &lookup)
}

fn device_or_conflict(m: &MachineNetwork, ns: &str, name: &str) -> Result<String> {
    m.device.clone().ok_or_else(|| {
        Error::conflict(
            "DeviceUnknown",
            format!("Machine {ns}/{name} has no device yet (spec.providerID)"),
        )
    })
}

/// The plan for the machine's device, changing nothing (`dryRun`).
///
/// # Errors
/// As [`read_machine`]; 409 `DeviceUnknown`, `NetworkFrozen`; 404
/// `DeviceNotFound`, `VlanNotFound`; the cloud's errors.
pub fn plan_machine<K: KvStore, H: HttpClient + ?Sized>(
    deps: Deps<'_, '_, K, H>,
    ns: &str,
    name: &str,
) -> Result<Value> {
    let Deps { ctx, kube, .. } = deps;
    let m = read_machine(kube, ns, name)?;
    let device = device_or_conflict(&m, ns, name)?;
    let cloud = deps.cloud_of(&device)?;
    let head =
        json!({"machine": format!("{ns}/{name}"), "profile": m.profile_name, "device": device});
    if device_cloud(&device) == CloudKind::Phoenixnap {
        let mut v = head;
        match wanted_members(&deps, cloud, (ns, name), &m)? {
            Ok(wanted) => {
                let steps = memberships::plan_members(ctx, cloud, &device, &wanted)?;
                v["plan"] = steps.iter().map(MemberStep::to_json).collect();
            }
            Err(pending) => {
                v["plan"] = json!([]);
                v["waiting"] = pending.into();
            }
        }
        return Ok(v);
    }
    let observed = apply::observe(cloud, &device)?;
    let desired = desired_on(ctx, cloud, ns, &m, &observed)?;
    let steps = crate::network::plan::plan(&observed, &desired)?;
    let mut v = head;
    v["modes"] = m
        .profile
        .on_device(observed.eth_ports())
        .modes()
        .iter()
        .map(|(b, md)| (b.to_string(), Value::from(md.as_str())))
        .collect::<serde_json::Map<_, _>>()
        .into();
    v["plan"] = steps.iter().map(PortStep::to_json).collect();
    Ok(v)
}

/// A phoenixNAP server's networks as the profile wants them: each VLAN's
/// network with its static addresses and its claims' addresses; `Err` with
/// what is awaited while a claim of the profile has no address yet.
///
/// # Errors
/// As [`resolve_vlans`]; API server errors.
fn wanted_members<K: KvStore, H: HttpClient + ?Sized>(
    deps: &Deps<'_, '_, K, H>,
    cloud: &dyn Cloud,
    (ns, name): (&str, &str),
    m: &MachineNetwork,
) -> Result<std::result::Result<Vec<Wanted>, String>> {
    let resolved = resolve_vlans(deps.ctx, cloud, ns, &m.profile)?;
    let bound = bound_addresses(deps.kube, ns, name, &m.profile)?;
    let plain = |a: &str| a.split_once('/').map_or(a, |(ip, _)| ip).to_string();
    let mut wanted: Vec<Wanted> = Vec::new();
    let mut pending = 0;
    for port in &m.profile.ports {
        for (j, v) in port.vlans.iter().enumerate() {
            let Some((_, id, _)) = resolved.iter().find(|(x, _, _)| *x == v.vlan()) else {
                continue;
            };
            let mut addresses = std::collections::BTreeSet::new();
            for a in &v.addresses {
                match (&a.fixed, &a.pool) {
                    (Some(s), _) => {
                        addresses.insert(plain(s));
                    }
                    (None, Some(_)) => {
                        let found = bound
                            .iter()
                            .find(|(p, s, _)| *p == port.name && *s == Slot::Vlan(j));
                        match found {
                            Some((_, _, a)) => {
                                addresses.insert(plain(a));
                            }
                            None => pending += 1,
                        }
                    }
                    (None, None) => {}
                }
            }
            wanted.push(Wanted {
                segment: id.clone(),
                addresses,
            });
        }
    }
    if pending > 0 {
        return Ok(Err(format!(
            "the addresses of {pending} claim(s) of the profile (the server joins a network with its addresses)"
        )));
    }
    Ok(Ok(wanted))
}

/// What applying a profile to a device came to.
pub(in crate::capi) enum OnDevice {
    /// The apply ran (converged or in progress).
    Applied(ApplyReport),
    /// The operator released the device meanwhile (nothing called).
    Released,
    /// The device is gone: record forgotten, claims deleted (how many).
    Gone(usize),
}

/// The claims, then the profile applied to the device, then (once
/// converged) the stale claims deleted. A device found gone is forgotten
/// and the machine's claims deleted.
pub(in crate::capi) fn apply_on_device<K: KvStore, H: HttpClient + ?Sized>(
    deps: &Deps<'_, '_, K, H>,
    (ns, name): (&str, &str),
    m: &MachineNetwork,
    device: &str,
) -> Result<OnDevice> {
    let (ctx, kube, cloud) = (deps.ctx, deps.kube, deps.cloud_of(device)?);
    if device_cloud(device) == CloudKind::Phoenixnap {
        return members_on_server(deps, (ns, name), m, device, cloud);
    }
    let Some(observed) = apply::observe_device(cloud, device)? else {
        apply::DeviceRecord::new(ctx, device).forget()?;
        return Ok(OnDevice::Gone(delete_claims(kube, ns, name, &m.uid)?));
    };
    // The per-VLAN claims first: their addresses are allocated while the
    // device is on its way.
    let claims = ensure_claims(kube, ns, name, m)?;
    let desired = desired_on(ctx, cloud, ns, m, &observed)?;
    let Some(report) = apply::apply_profile(ctx, cloud, deps.batches, device, &desired)? else {
        return Ok(OnDevice::Released);
    };
    if report.phase == apply::ApplyPhase::Converged {
        delete_stale(kube, ns, &claims.stale)?;
    }
    Ok(OnDevice::Applied(report))
}

/// [`apply_on_device`] on a phoenixNAP server: the claims, then (once
/// every one has its address) the networks joined with their addresses,
/// then (once converged) the stale claims deleted.
fn members_on_server<K: KvStore, H: HttpClient + ?Sized>(
    deps: &Deps<'_, '_, K, H>,
    (ns, name): (&str, &str),
    m: &MachineNetwork,
    device: &str,
    cloud: &dyn Cloud,
) -> Result<OnDevice> {
    let (ctx, kube) = (deps.ctx, deps.kube);
    if memberships::observe_members(cloud, device)?.is_none() {
        apply::DeviceRecord::new(ctx, device).forget()?;
        return Ok(OnDevice::Gone(delete_claims(kube, ns, name, &m.uid)?));
    }
    let claims = ensure_claims(kube, ns, name, m)?;
    let wanted = match wanted_members(deps, cloud, (ns, name), m)? {
        Ok(w) => w,
        Err(waiting) => {
            return Ok(OnDevice::Applied(ApplyReport {
                phase: apply::ApplyPhase::InProgress {
                    waiting,
                    retry_after: apply::POLL_S,
                },
                remaining: Vec::new(),
                issued: Vec::new(),
            }))
        }
    };
    let Some(report) = memberships::apply_members(ctx, cloud, device, &wanted, true)? else {
        return Ok(OnDevice::Released);
    };
    if report.phase == apply::ApplyPhase::Converged {
        delete_stale(kube, ns, &claims.stale)?;
    }
    Ok(OnDevice::Applied(report))
}

/// Applies the machine's profile to its device (see
/// [`crate::network::apply::apply`]; VLAN batches through `batches`): what
/// `POST …/network` asks, explicitly, so it withdraws an operator's
/// release of the device first. (Events, reconcile and the poll use
/// [`sync_machine`](super::machine::sync_machine), which honours that release.)
///
/// # Idempotency
/// As [`crate::network::apply::apply`]: a converged device makes no
/// mutating call.
///
/// # Errors
/// As [`plan_machine`] (a device that is gone: 404 `DeviceNotFound`, its
/// record forgotten and the machine's claims deleted); 409
/// `VlanBatchFailed`, `VlanBatchRefused`, `PortChangeRefused`.
pub fn apply_machine<K: KvStore, H: HttpClient + ?Sized>(
    deps: Deps<'_, '_, K, H>,
    ns: &str,
    name: &str,
) -> Result<(ApplyReport, String)> {
    let Deps { ctx, kube, .. } = deps;
    let m = read_machine(kube, ns, name)?;
    let device = device_or_conflict(&m, ns, name)?;
    apply::DeviceRecord::new(ctx, &device).clear_released()?;
    match apply_on_device(&deps, (ns, name), &m, &device)? {
        OnDevice::Applied(r) => Ok((r, device)),
        OnDevice::Released => Ok((
            ApplyReport {
                phase: apply::ApplyPhase::InProgress {
                    waiting: "the operator released this device meanwhile".into(),
                    retry_after: apply::POLL_S,
                },
                remaining: Vec::new(),
                issued: Vec::new(),
            },
            device,
        )),
        OnDevice::Gone(_) => Err(apply::device_not_found(&device)),
    }
}

/// Releases the device's network: the device back to Layer3 without VLANs
/// (the same apply, towards [`Desired::teardown`]), then the machine's
/// claims deleted. `(report, claims deleted)`: `report` is `None` when the
/// device is gone; in progress while a step runs (no claim deleted yet).
pub(in crate::capi) fn release_device<K: KvStore, H: HttpClient + ?Sized>(
    deps: &Deps<'_, '_, K, H>,
    (ns, name, uid): (&str, &str, &str),
    device: &str,
) -> Result<(Option<ApplyReport>, usize)> {
    let (ctx, kube, cloud) = (deps.ctx, deps.kube, deps.cloud_of(device)?);
    if device_cloud(device) == CloudKind::Phoenixnap {
        // Every network the apply joined left, then the claims deleted
        // (their addresses released once no server holds them).
        let r = match memberships::apply_members(ctx, cloud, device, &[], false) {
            Err(e) if e.reason() == "DeviceNotFound" => None,
            other => other?,
        };
        let Some(r) = r else {
            return Ok((None, delete_claims(kube, ns, name, uid)?));
        };
        if r.phase != apply::ApplyPhase::Converged {
            return Ok((Some(r), 0));
        }
        return Ok((Some(r), delete_claims(kube, ns, name, uid)?));
    }
    let Some(observed) = apply::observe_device(cloud, device)? else {
        apply::DeviceRecord::new(ctx, device).forget()?;
        return Ok((None, delete_claims(kube, ns, name, uid)?));
    };
    let r = apply::apply(
        ctx,
        cloud,
        deps.batches,
        device,
        &Desired::teardown(&observed),
    )?;
    if r.phase != apply::ApplyPhase::Converged {
        return Ok((Some(r), 0));
    }
    Ok((Some(r), delete_claims(kube, ns, name, uid)?))
}

/// Releases a machine's networking at the operator's request (`DELETE
/// …/network`): records the release in the device's apply record (so
/// nothing re-applies the profile while the annotation stays as it is; see
/// the module docs), brings the device back to Layer3 without VLANs, then
/// deletes the machine's claims (their addresses released through the
/// allocator) and marks the release done. A machine that is gone has
/// nothing left to release here (its claims go with it); one without a
/// device has only its claims deleted.
///
/// # Idempotency
/// As the apply: a released device makes no mutating call; deleting
/// claims already gone changes nothing.
///
/// # Errors
/// As [`apply_machine`] (a device that is gone is released: its record
/// forgotten and the claims deleted).
pub fn release_machine<K: KvStore, H: HttpClient + ?Sized>(
    deps: Deps<'_, '_, K, H>,
    ns: &str,
    name: &str,
) -> Result<(Option<ApplyReport>, usize)> {
    let Deps { ctx, kube, .. } = deps;
    let Some((machine, infra)) = machine_and_infra(kube, ns, name)? else {
        return Ok((None, 0));
    };
    let uid = machine.metadata.uid.clone().unwrap_or_default();
    let Some(device) = device_in(&machine, infra.as_ref())? else {
        return Ok((None, delete_claims(kube, ns, name, &uid)?));
    };
    // The annotation as it is (not checked: a bad one is released too).
    let profile = machine.metadata.annotation(PROFILE_ANNOTATION).or_else(|| {
        infra
            .as_ref()
            .and_then(|i| i.metadata.annotation(PROFILE_ANNOTATION))
    });
    apply::DeviceRecord::new(ctx, &device).mark_released(profile, ctx.env.now())?;
    let (report, deleted) = release_device(&deps, (ns, name, &uid), &device)?;
    if report
        .as_ref()
        .is_some_and(|r| r.phase == apply::ApplyPhase::Converged)
    {
        apply::DeviceRecord::new(ctx, &device).release_done()?;
    }
    Ok((report, deleted))
}
