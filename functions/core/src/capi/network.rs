//! A machine's Layer2 / Hybrid networking, the Kubernetes side: which
//! profile a machine opted into, its device, the profile's VLANs resolved
//! in Metal, then the plan (`dryRun`), the apply, or the node's OS
//! configuration ([`crate::network`] does the work).
//!
//! # Opting in
//! The CAPI `Machine` (or its infrastructure machine, a CAPP
//! `PacketMachine` named by `spec.infrastructureRef`) carries the
//! annotation [`PROFILE_ANNOTATION`] naming a `MetalNetworkProfile` of its
//! namespace. The device is the one `spec.providerID` names
//! (`equinixmetal://<uuid>`), on the Machine or else the infrastructure
//! machine.
//!
//! # VLANs
//! `id` is used as is; `vxlan` is looked up in the profile's metro (`GET
//! /projects/{id}/virtual-networks?metro=`, by number **and** metro); `pool`
//! is the VLAN the VRF-backed pool holds (its provisioning record).

use serde_json::{json, Value};

use super::assign::device_of;
use super::objects::MachineObject;
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::pool::{PoolId, PoolKind};
use crate::ipam::vrf::Resource as MetalResource;
use crate::kube::{self, Kube};
use crate::kv::Ctx;
use crate::metal::client::Metal;
use crate::network::apply::{self, Report};
use crate::network::batch::VlanBatches;
use crate::network::node::{node_network, Pending, Slot};
use crate::network::plan::{Desired, Observed, Step};
use crate::network::profile::{PoolName, Profile, VlanRef};
use crate::network::render::{render, Format};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::ports::Env;
use crate::provision::step::read_progress;

/// Annotation on a Machine (or its infrastructure machine) naming its
/// `MetalNetworkProfile`.
pub const PROFILE_ANNOTATION: &str = "ipam.metal-ipam.dev/network-profile";

/// The Machine `ns/name` and its infrastructure machine (a `PacketMachine`
/// named by `spec.infrastructureRef`), if they exist.
fn machine_and_infra<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<Option<(MachineObject, Option<MachineObject>)>> {
    let Some(machine): Option<MachineObject> = kube.get_as(&kube::MACHINES, Some(ns), name)? else {
        return Ok(None);
    };
    let infra = match &machine.infrastructure {
        Some((kind, iname)) if kind == "PacketMachine" => {
            kube.get_as(&kube::PACKET_MACHINES, Some(ns), iname)?
        }
        _ => None,
    };
    Ok(Some((machine, infra)))
}

/// What a machine's networking needs: its profile and its device.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineNetwork {
    /// The profile's name.
    pub profile_name: String,
    /// The profile.
    pub profile: Profile,
    /// The device, once the machine has a provider ID.
    pub device: Option<String>,
    /// The Machine's uid (owner of its per-VLAN claims).
    pub uid: String,
    /// The Machine's cluster.
    pub cluster: Option<String>,
}

fn not_found(reason: &'static str, msg: String) -> Error {
    Error::new(ErrorKind::NotFound, reason, msg)
}

/// Reads the machine, its opted-in profile and its device.
///
/// # Errors
/// 404 `MachineNotFound`, `ProfileNotFound`; 409 `NoNetworkProfile` when
/// neither the Machine nor its infrastructure machine carries the
/// annotation; 422 for a profile that does not validate or a provider ID
/// that is not Metal's; API server errors.
pub fn read_machine<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<MachineNetwork> {
    let (machine, infra) = machine_and_infra(kube, ns, name)?.ok_or_else(|| {
        not_found(
            "MachineNotFound",
            format!("Machine {ns}/{name} does not exist"),
        )
    })?;
    network_of(kube, ns, name, &machine, infra.as_ref())
}

/// [`read_machine`] for a Machine and infrastructure machine already read.
fn network_of<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    machine: &MachineObject,
    infra: Option<&MachineObject>,
) -> Result<MachineNetwork> {
    let annotation = machine
        .metadata
        .annotation(PROFILE_ANNOTATION)
        .or_else(|| infra.and_then(|i| i.metadata.annotation(PROFILE_ANNOTATION)))
        .map(str::to_string)
        .ok_or_else(|| {
            Error::conflict(
                "NoNetworkProfile",
                format!("Machine {ns}/{name} has no {PROFILE_ANNOTATION} annotation (nor its infrastructure machine)"),
            )
        })?;
    let device = match provider_of(machine, infra) {
        None => None,
        Some(p) => Some(device_of(p).map(str::to_string).ok_or_else(|| {
            Error::invalid(
                "spec.providerID",
                format!("{p:?} is not equinixmetal://<uuid>"),
            )
        })?),
    };
    let object = kube
        .get(&kube::NETWORK_PROFILES, Some(ns), &annotation)?
        .ok_or_else(|| {
            not_found(
                "ProfileNotFound",
                format!("MetalNetworkProfile {ns}/{annotation} does not exist"),
            )
        })?;
    let profile = Profile::from_json(object.get("spec").unwrap_or(&Value::Null))?;
    profile.validate()?;
    Ok(MachineNetwork {
        profile_name: annotation,
        profile,
        device,
        uid: machine.metadata.uid.clone().unwrap_or_default(),
        cluster: machine.cluster.clone(),
    })
}

/// What a released machine had: its uid and device (the profile may be
/// gone: releasing does not need it).
fn read_device<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<Option<(String, Option<String>)>> {
    let Some((machine, infra)) = machine_and_infra(kube, ns, name)? else {
        return Ok(None);
    };
    let device = provider_of(&machine, infra.as_ref())
        .and_then(device_of)
        .map(str::to_string);
    Ok(Some((machine.metadata.uid.unwrap_or_default(), device)))
}

/// The provider ID of the Machine, else of its infrastructure machine.
fn provider_of<'a>(
    machine: &'a MachineObject,
    infra: Option<&'a MachineObject>,
) -> Option<&'a str> {
    machine
        .provider_id
        .as_deref()
        .or_else(|| infra.and_then(|i| i.provider_id.as_deref()))
}

/// Releases a machine's networking (its profile removed, or the machine
/// leaving): the device goes back to Layer3 without VLANs (the same apply,
/// towards [`Desired::teardown`]), then the machine's per-VLAN claims are
/// deleted, so their addresses are released through the allocator. A
/// machine that is gone has nothing left to release here: its claims go
/// with it (owner references) and its device with it.
///
/// # Idempotency
/// As the apply: a released device makes no mutating call; deleting
/// claims already gone changes nothing.
///
/// # Errors
/// As [`apply_machine`].
pub fn release_machine<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    batches: &dyn VlanBatches,
    ns: &str,
    name: &str,
) -> Result<(Option<Report>, usize)> {
    let Some((uid, device)) = read_device(kube, ns, name)? else {
        return Ok((None, 0));
    };
    let report = match &device {
        Some(d) => match apply::observe_device(metal, d)? {
            Some(observed) => {
                let r = apply::apply(ctx, metal, batches, d, &Desired::teardown(&observed))?;
                if r.phase != apply::Phase::Converged {
                    return Ok((Some(r), 0));
                }
                Some(r)
            }
            None => None,
        },
        None => None,
    };
    Ok((report, delete_claims(kube, ns, name, &uid)?))
}

/// Deletes the claims the machine's profile made ([`claim_for`]: owned by
/// the Machine `uid`, named after it), so their addresses are released
/// through the allocator; returns how many. A profile's claims are found
/// by name, not from the profile, which may be gone.
///
/// # Errors
/// API server errors.
pub fn delete_claims<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<usize> {
    let claims: Vec<crate::kube::object::Meta> = kube.list_as(&kube::CLAIMS, Some(ns))?;
    let mut deleted = 0;
    for c in claims {
        let m = &c.metadata;
        let ours = m.owned_by(uid)
            && m.name.strip_prefix(name).is_some_and(|rest| {
                rest.starts_with('-') && (rest.contains("-vlan-") || rest.contains("-elastic-"))
            });
        if ours && !m.deleting() {
            kube.delete(&kube::CLAIMS, Some(ns), &m.name)?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// The profile's VLANs, resolved: (reference, UUID, number).
type Resolved = Vec<(VlanRef, String, u16)>;

fn resolve_vlans<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    ns: &str,
    profile: &Profile,
) -> Result<Resolved> {
    let mut out: Resolved = Vec::new();
    let metro = profile
        .metro
        .as_deref()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let mut metro_vlans: Option<Vec<crate::metal::model::VirtualNetwork>> = None;
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
            (Some(id), _, _) => metal.get_vlan(id)?,
            (_, Some(n), _) => {
                // The metro's VLANs, listed once for every number.
                if metro_vlans.is_none() {
                    metro_vlans = Some(metal.list_vlans(&metro)?);
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
                    Some(h) => metal.get_vlan(&h.id)?,
                    None => None,
                }
            }
            _ => None,
        };
        let Some(v) = vlan else {
            return Err(not_found(
                "VlanNotFound",
                format!("the VLAN {} does not exist in Metal (yet)", describe(&r)),
            ));
        };
        let n = v
            .vxlan
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
    match p.kind.as_deref() {
        Some("GlobalMetalIPPool") => PoolId::global(&p.name),
        _ => PoolId::of(PoolKind::Namespaced, ns, &p.name),
    }
}

fn desired<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    ns: &str,
    m: &MachineNetwork,
    device: &str,
) -> Result<(Desired, Observed)> {
    let resolved = resolve_vlans(ctx, metal, ns, &m.profile)?;
    let observed = apply::observe(metal, device)?;
    let lookup = |r: &VlanRef| {
        resolved
            .iter()
            .find(|(x, _, _)| x == r)
            .map(|(_, id, _)| id.clone())
    };
    let desired = Desired::from_profile(&m.profile, observed.eth_ports(), &lookup)?;
    Ok((desired, observed))
}

fn device_or_conflict(m: &MachineNetwork, ns: &str, name: &str) -> Result<String> {
    m.device.clone().ok_or_else(|| {
        Error::conflict(
            "DeviceUnknown",
            format!("Machine {ns}/{name} has no device yet (spec.providerID)"),
        )
    })
}

/// The name of the claim for the address of machine `machine` on VLAN
/// `j` of `port` (an `IPAddressClaim`, and so its `IPAddress`).
///
/// ```
/// use metal_ipam_core::capi::network::claim_name;
/// assert_eq!(claim_name("md-0-x7f", "bond0", 1), "md-0-x7f-bond0-vlan-1");
/// ```
pub fn claim_name(machine: &str, port: &str, j: usize) -> String {
    claim_for(machine, port, Slot::Vlan(j))
}

/// The name of the claim for `slot` of `port` of machine `machine`: a
/// VLAN's address ([`claim_name`]) or an elastic IP
/// (`<machine>-<port>-elastic-<k>`); [`delete_claims`] finds them by these
/// names.
///
/// ```
/// use metal_ipam_core::capi::network::claim_for;
/// use metal_ipam_core::network::node::Slot;
/// assert_eq!(claim_for("md-0-x7f", "bond0", Slot::Elastic(0)), "md-0-x7f-bond0-elastic-0");
/// ```
pub fn claim_for(machine: &str, port: &str, slot: Slot) -> String {
    match slot {
        Slot::Vlan(j) => format!("{machine}-{port}-vlan-{j}"),
        Slot::Elastic(k) => format!("{machine}-{port}-elastic-{k}"),
    }
}

/// Every pool address of the profile: its port, slot and pool (one claim
/// each).
fn pool_slots(profile: &Profile) -> Vec<(&str, Slot, &PoolName)> {
    let mut out = Vec::new();
    for port in &profile.ports {
        for (j, v) in port.vlans.iter().enumerate() {
            if let Some(pool) = v.addresses.iter().find_map(|a| a.pool.as_ref()) {
                out.push((port.name.as_str(), Slot::Vlan(j), pool));
            }
        }
        for (k, e) in port.elastic_ips.iter().enumerate() {
            out.push((port.name.as_str(), Slot::Elastic(k), &e.pool));
        }
    }
    out
}

/// Creates the `IPAddressClaim` of every pool address of the profile that
/// does not exist yet, owned by the Machine (garbage-collected with it, so
/// its address is released through the allocator) and labelled with its
/// cluster. Returns how many it created.
///
/// # Errors
/// 422 for a claim name that is not a valid Kubernetes name (a machine
/// name near the length limit); API server errors.
pub fn ensure_claims<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    m: &MachineNetwork,
) -> Result<usize> {
    let mut created = 0;
    for (port, slot, pool) in pool_slots(&m.profile) {
        let claim = claim_for(name, port, slot);
        crate::kube::names::check_subdomain(&claim)
            .map_err(|e| Error::invalid("metadata.name", format!("claim {claim}: {e}")))?;
        if kube.get(&kube::CLAIMS, Some(ns), &claim)?.is_some() {
            continue;
        }
        let mut meta = json!({"name": claim, "namespace": ns,
            "ownerReferences": [{"apiVersion": kube::MACHINES.api_version(), "kind": "Machine",
                "name": name, "uid": m.uid, "controller": true, "blockOwnerDeletion": true}]});
        if let Some(c) = &m.cluster {
            meta["labels"] = json!({ crate::ipam::claim::CLUSTER_NAME_LABEL: c });
        }
        let object = json!({"apiVersion": kube::CLAIMS.api_version(), "kind": "IPAddressClaim",
            "metadata": meta,
            "spec": {"poolRef": {"apiGroup": crate::ipam::pool::GROUP,
                "kind": pool.kind.as_deref().unwrap_or("MetalIPPool"), "name": pool.name}}});
        match kube.create(&kube::CLAIMS, Some(ns), &object) {
            Ok(_) => created += 1,
            Err(crate::kube::KubeError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(created)
}

/// The address with prefix of claim `claim`'s `IPAddress`, once bound.
fn bound_address<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    claim: &str,
) -> Result<Option<String>> {
    let Some(v) = kube.get(&kube::IP_ADDRESSES, Some(ns), claim)? else {
        return Ok(None);
    };
    let address = v.pointer("/spec/address").and_then(Value::as_str);
    let prefix = v.pointer("/spec/prefix").and_then(Value::as_u64);
    Ok(address.zip(prefix).map(|(a, p)| format!("{a}/{p}")))
}

/// The plan for the machine's device, changing nothing (`dryRun`).
///
/// # Errors
/// As [`read_machine`]; 409 `DeviceUnknown`, `NetworkFrozen`; 404
/// `DeviceNotFound`, `VlanNotFound`; Metal errors.
pub fn plan_machine<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    ns: &str,
    name: &str,
) -> Result<Value> {
    let m = read_machine(kube, ns, name)?;
    let device = device_or_conflict(&m, ns, name)?;
    let (desired, observed) = desired(ctx, metal, ns, &m, &device)?;
    let steps = crate::network::plan::plan(&observed, &desired)?;
    Ok(
        json!({"machine": format!("{ns}/{name}"), "profile": m.profile_name, "device": device,
              "modes": m.profile.on_device(observed.eth_ports()).modes().iter().map(|(b, md)| (b.to_string(), Value::from(md.as_str()))).collect::<serde_json::Map<_, _>>(),
              "plan": steps.iter().map(Step::to_json).collect::<Vec<_>>()}),
    )
}

/// Applies the machine's profile to its device (see
/// [`crate::network::apply::apply`]; VLAN batches through `batches`).
///
/// # Idempotency
/// As [`crate::network::apply::apply`]: a converged device makes no
/// mutating call.
///
/// # Errors
/// As [`plan_machine`]; 409 `VlanBatchFailed`.
pub fn apply_machine<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    batches: &dyn VlanBatches,
    ns: &str,
    name: &str,
) -> Result<(Report, String)> {
    let m = read_machine(kube, ns, name)?;
    apply_network(ctx, kube, metal, batches, ns, name, &m)
}

/// [`apply_machine`] for a machine already read.
fn apply_network<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    batches: &dyn VlanBatches,
    ns: &str,
    name: &str,
    m: &MachineNetwork,
) -> Result<(Report, String)> {
    // The per-VLAN claims first: their addresses are allocated while the
    // device is still on its way.
    ensure_claims(kube, ns, name, m)?;
    let device = device_or_conflict(m, ns, name)?;
    let (desired, _) = desired(ctx, metal, ns, m, &device)?;
    Ok((
        apply::apply(ctx, metal, batches, &device, &desired)?,
        device,
    ))
}

/// What [`sync_machine`] did with a Machine's event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Synced {
    /// The Machine is gone, or going (its claims go with it, its device
    /// is released by the Metal poll once deleted): nothing to do.
    Absent,
    /// No profile, and nothing of ours on its device: nothing to do.
    Ignored,
    /// A profile but no device yet: the Metal poll applies it once the
    /// device is active.
    WaitingForDevice,
    /// The profile applied (converged or in progress).
    Applied(Report),
    /// The profile removed (annotation gone, or the profile object
    /// deleted) from a machine whose device we configured: released
    /// (`None` once done, with the claims deleted).
    Released(Option<Report>, usize),
}

/// Syncs a Machine after an event about it: applies its profile, or
/// releases its networking when the profile was removed (the annotation
/// dropped or the profile object deleted) and its device carries our
/// apply record. Once a release has converged the record is forgotten, so
/// later events about the Machine change nothing.
///
/// # Idempotency
/// As [`apply_machine`] and [`release_machine`]; an event about a Machine
/// without a profile and without our record makes no Metal call.
///
/// # Errors
/// As [`apply_machine`] (but a missing device or profile is an outcome,
/// not an error).
pub fn sync_machine<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    batches: &dyn VlanBatches,
    ns: &str,
    name: &str,
) -> Result<Synced> {
    let Some((machine, infra)) = machine_and_infra(kube, ns, name)? else {
        return Ok(Synced::Absent);
    };
    if machine.metadata.deleting() {
        return Ok(Synced::Absent);
    }
    match network_of(kube, ns, name, &machine, infra.as_ref()) {
        Ok(m) if m.device.is_none() => {
            ensure_claims(kube, ns, name, &m)?;
            Ok(Synced::WaitingForDevice)
        }
        Ok(m) => Ok(Synced::Applied(
            apply_network(ctx, kube, metal, batches, ns, name, &m)?.0,
        )),
        Err(e) if matches!(e.reason(), "NoNetworkProfile" | "ProfileNotFound") => {
            let device = provider_of(&machine, infra.as_ref())
                .and_then(device_of)
                .map(str::to_string);
            let ours = match &device {
                Some(d) => apply::has_record(ctx.kv, d)?,
                None => false,
            };
            if !ours {
                return Ok(Synced::Ignored);
            }
            let (report, deleted) = release_machine(ctx, kube, metal, batches, ns, name)?;
            let done = report
                .as_ref()
                .is_none_or(|r| r.phase == apply::Phase::Converged);
            if !done {
                return Ok(Synced::Released(report, deleted));
            }
            if let Some(d) = &device {
                apply::forget(ctx.kv, d)?;
            }
            Ok(Synced::Released(None, deleted))
        }
        Err(e) => Err(e),
    }
}

/// The node's OS network configuration in `format`, from the profile (no
/// device needed), and the addresses still pending.
///
/// Addresses from pools are those of the machine's per-VLAN claims
/// ([`claim_name`], created by the apply); a claim not bound yet is
/// listed as pending.
///
/// # Errors
/// As [`read_machine`]; 404 `VlanNotFound`; Metal errors.
pub fn netconfig<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &Metal<'_, H, E>,
    ns: &str,
    name: &str,
    format: Format,
) -> Result<(String, Vec<Pending>)> {
    let m = read_machine(kube, ns, name)?;
    let resolved = resolve_vlans(ctx, metal, ns, &m.profile)?;
    let vxlan_of = |r: &VlanRef| resolved.iter().find(|(x, _, _)| x == r).map(|(_, _, n)| *n);
    // The claims' addresses, read once (the callback cannot fail).
    let mut bound: Vec<(String, Slot, String)> = Vec::new();
    for (port, slot, _) in pool_slots(&m.profile) {
        if let Some(a) = bound_address(kube, ns, &claim_for(name, port, slot))? {
            bound.push((port.to_string(), slot, a));
        }
    }
    let address_of = |port: &str, slot: Slot, _: &PoolName| {
        bound
            .iter()
            .find(|(p, s, _)| p == port && *s == slot)
            .map(|(_, _, a)| a.clone())
    };
    let (net, pending) = node_network(&m.profile, &vxlan_of, &address_of)?;
    Ok((render(&net, format), pending))
}

/// `format=` of the netconfig route.
///
/// ```
/// use metal_ipam_core::capi::network::format_of;
/// use metal_ipam_core::network::render::Format;
/// assert_eq!(format_of("format=ifupdown").unwrap(), Format::Ifupdown);
/// assert_eq!(format_of("").unwrap(), Format::Netplan);
/// assert_eq!(format_of("format=yaml").unwrap_err().status(), 400);
/// ```
///
/// # Errors
/// 400 naming the accepted formats.
pub fn format_of(query: &str) -> Result<Format> {
    let value = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("format="))
        .unwrap_or("netplan");
    match value {
        "netplan" => Ok(Format::Netplan),
        "ifupdown" => Ok(Format::Ifupdown),
        "cloud-init" => Ok(Format::CloudInit),
        "shell" => Ok(Format::Shell),
        other => Err(Error::malformed(format!(
            "format {other:?}: use netplan, ifupdown, cloud-init or shell"
        ))),
    }
}
