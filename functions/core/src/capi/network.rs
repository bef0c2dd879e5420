//! A machine's Layer2 / Hybrid networking, the Kubernetes side: which
//! profile a machine opted into, its device, the profile's VLANs resolved
//! in Metal, its per-VLAN claims, then the plan (`dryRun`), the apply, the
//! release, or the node's OS configuration ([`crate::network`] does the
//! work). [`sync_machine`](super::machine::sync_machine) is the one entry that converges one Machine
//! (events, reconcile and the Metal poll call it).
//!
//! # Opting in
//! The CAPI `Machine` (or its infrastructure machine, a CAPP
//! `PacketMachine` named by `spec.infrastructureRef`) carries the
//! annotation [`PROFILE_ANNOTATION`] naming a `MetalNetworkProfile` of its
//! namespace (the Machine's own wins). The device is the one
//! `spec.providerID` names (`equinixmetal://<uuid>`), on the Machine or else
//! the infrastructure machine. The annotation's value and the
//! infrastructure machine's name are checked as Kubernetes names before
//! they go into a path (422 naming the field otherwise).
//!
//! # Opting out, and what does not release
//! Only an explicit opt-out releases a machine's network (the device back
//! to Layer3 without VLANs, then its claims deleted, their addresses
//! released through the allocator):
//! - the annotation removed: the next sync releases and forgets the
//!   device's apply record;
//! - `DELETE /v1/machines/{ns}/{name}/network` ([`release_machine`]): the
//!   release is recorded in the device's apply record (`released`, with the
//!   annotation the Machine had), so events, reconcile and the poll leave
//!   the device alone ([`Synced::ReleasedByOperator`](super::machine::Synced::ReleasedByOperator), no Metal call) until
//!   the annotation changes (another profile: applied again) or is removed
//!   (the record is forgotten), or `POST …/network` asks to apply again.
//!   (A Machine without a device yet has nothing applied: DELETE only
//!   deletes its claims, which the next sync re-creates while the
//!   annotation stays; remove the annotation to opt out.)
//!
//! A profile that is gone (deleted behind the webhook's back, or the
//! annotation naming one that does not exist) releases nothing: the
//! network and the claims stay as they are and each sync answers 404
//! `ProfileNotFound` for the machine. The webhook refuses deleting a profile
//! that Machines use (see [`crate::admission`]). A device that is gone
//! counts as released: its apply record is forgotten and the Machine's
//! claims deleted ([`Synced::DeviceGone`](super::machine::Synced::DeviceGone)).
//!
//! # Per-VLAN claims
//! Every pool address of the profile (a VLAN's `addresses[].pool`, an
//! elastic IP) is one `IPAddressClaim` owned by the Machine, identified by
//! what it is for, not by its place in a list: the port, the VLAN (its
//! UUID, its number and the profile's metro, or the VRF-backed pool whose
//! VLAN it is) and the pool (an elastic IP: the port, the pool and its
//! ordinal among the port's elastic IPs from that pool). That identity's
//! hash is the claim's label [`SLOT_LABEL`] and the tail of its name
//! (`<machine>-<port>-vlan-<hash>`, `<machine>-<port>-elastic-<hash>`);
//! [`MACHINE_LABEL`] names the machine, so one labelled list finds them.
//! So a VLAN inserted before another changes nothing for the other; a slot
//! whose pool changed is another identity (a new claim; the old one is
//! deleted); a dropped VLAN's claim is deleted. Claims that no longer match
//! the profile are deleted once the apply converged (the device no longer
//! carries what they were for) or, for a machine without a device, at
//! once. The node's configuration ([`netconfig`]) renders only the
//! addresses of claims of the profile's current slots whose `IPAddress`
//! comes from the slot's pool; the others are pending.
//!
//! **Upgrade from list-index names** (`<machine>-<port>-vlan-<j>`,
//! `<machine>-<port>-elastic-<k>`): when a machine has no labelled claim
//! yet, the namespace's claims are listed once and each of the machine's
//! old claims whose index and pool still match a slot of the profile is
//! adopted (labelled: its address is kept); the others are deleted with the
//! stale ones. (A profile that no longer has any pool address finds no
//! old claim this way; those are deleted by the release, or with the
//! Machine.)
//!
//! # VLANs
//! `id` is used as is; `vxlan` is looked up in the profile's metro (`GET
//! /projects/{id}/virtual-networks?metro=`, by number **and** metro); `pool`
//! is the VLAN the VRF-backed pool holds (its provisioning record).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{json, Value};

use super::device::{device_in, device_of, provider_of};
use super::objects::MachineObject;
use crate::cloud::{Cloud, DeviceView, Segment};
use crate::error::{Error, ErrorKind, Known, Result};
use crate::ipam::claim::{PoolRef, CLUSTER_NAME_LABEL};
use crate::ipam::ops;
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::Resource as MetalResource;
use crate::kube::object::{metadata, Object, ObjectMeta, OwnerReference};
use crate::kube::{self, names, Kube, KubeError};
use crate::kv::Ctx;
use crate::network::apply::{self, Report};
use crate::network::batch::VlanBatches;
use crate::network::network_data;
use crate::network::node::{node_network, Pending, Slot};
use crate::network::plan::{Desired, Observed, Step};
use crate::network::profile::{bonds, PoolName, Profile, VlanRef};
use crate::network::render::{render, Format};
use crate::observe::summary::{MachineRow, PortRow};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::provision::step::read_progress;

pub use crate::network::profile::PROFILE_ANNOTATION;
/// Label on a profile's claims: the machine they are for (its name, or
/// `h-<hash>` for a name longer than a label value may be).
pub const MACHINE_LABEL: &str = "ipam.metal-ipam.dev/network-machine";
/// Label on a profile's claims: the hash of the slot's identity.
pub const SLOT_LABEL: &str = "ipam.metal-ipam.dev/network-slot";
/// Annotation on a profile's claims: the slot's identity, for people.
pub const SLOT_ANNOTATION: &str = "ipam.metal-ipam.dev/network-slot";

fn not_found(reason: &'static str, msg: String) -> Error {
    Error::new(ErrorKind::NotFound, reason, msg)
}

/// The Machine `ns/name` and its infrastructure machine (a `PacketMachine`
/// named by `spec.infrastructureRef`), if they exist.
///
/// # Errors
/// 422 when `spec.infrastructureRef.name` is not a Kubernetes name; API
/// server errors.
pub(super) fn machine_and_infra<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<Option<(MachineObject, Option<MachineObject>)>> {
    let Some(machine): Option<MachineObject> = kube.get_as(&kube::MACHINES, Some(ns), name)? else {
        return Ok(None);
    };
    let infra = match &machine.infrastructure {
        Some((kind, iname)) if kind == "PacketMachine" => {
            names::check_subdomain(iname).map_err(|m| {
                Error::invalid(
                    "spec.infrastructureRef.name",
                    format!("Machine {ns}/{name}: spec.infrastructureRef.name {iname:?} is not a valid name: {m}"),
                )
            })?;
            kube.get_as(&kube::PACKET_MACHINES, Some(ns), iname)?
        }
        _ => None,
    };
    Ok(Some((machine, infra)))
}

/// The profile annotation of the Machine, else of its infrastructure
/// machine, checked as a name.
pub(super) fn annotation_of(
    ns: &str,
    name: &str,
    machine: &MachineObject,
    infra: Option<&MachineObject>,
) -> Result<Option<String>> {
    let Some(value) = machine
        .metadata
        .annotation(PROFILE_ANNOTATION)
        .or_else(|| infra.and_then(|i| i.metadata.annotation(PROFILE_ANNOTATION)))
    else {
        return Ok(None);
    };
    names::check_subdomain(value).map_err(|m| {
        Error::invalid(
            format!("metadata.annotations[{PROFILE_ANNOTATION}]"),
            format!("Machine {ns}/{name}: annotation {PROFILE_ANNOTATION} {value:?} is not a valid profile name: {m}"),
        )
    })?;
    Ok(Some(value.to_string()))
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

/// Reads the machine, its opted-in profile and its device.
///
/// # Errors
/// 404 `MachineNotFound`, `ProfileNotFound`; 409 `NoNetworkProfile` when
/// neither the Machine nor its infrastructure machine carries the
/// annotation; 422 for a profile that does not validate, a provider ID
/// that is not Metal's, an annotation or infrastructure reference that is
/// not a name; API server errors.
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
    let profile_name = annotation_of(ns, name, &machine, infra.as_ref())?.ok_or_else(|| {
        Error::conflict(
            Known::NoNetworkProfile.as_str(),
            format!("Machine {ns}/{name} has no {PROFILE_ANNOTATION} annotation (nor its infrastructure machine)"),
        )
    })?;
    let device = device_in(&machine, infra.as_ref())?;
    network_of(kube, ns, &machine, profile_name, device, None)
}

/// The profile `profile_name` read and checked, for a Machine already read
/// (`device`: where its network is, for the message of a missing profile).
pub(super) fn network_of<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    machine: &MachineObject,
    profile_name: String,
    device: Option<String>,
    applied: Option<&str>,
) -> Result<MachineNetwork> {
    let name = &machine.metadata.name;
    let object = kube
        .get(&kube::NETWORK_PROFILES, Some(ns), &profile_name)?
        .ok_or_else(|| {
            let kept = match applied {
                Some(d) => format!(
                    "; the network of device {d} is left as it is (remove the annotation or DELETE /v1/machines/{ns}/{name}/network to release it)"
                ),
                None => String::new(),
            };
            not_found(
                "ProfileNotFound",
                format!("MetalNetworkProfile {ns}/{profile_name} of Machine {ns}/{name} does not exist{kept}"),
            )
        })?;
    let profile = Profile::from_json(object.get("spec").unwrap_or(&Value::Null))?;
    profile.validate()?;
    Ok(MachineNetwork {
        profile_name,
        profile,
        device,
        uid: machine.metadata.uid.clone().unwrap_or_default(),
        cluster: machine.cluster.clone(),
    })
}

// ---------------------------------------------------------------------------
// Per-VLAN claims
// ---------------------------------------------------------------------------

/// FNV-1a, 64 bits: a short stable hash of a slot's identity (names and
/// labels; not a security boundary).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// [`MACHINE_LABEL`]'s value for machine `name`.
///
/// ```
/// use metal_ipam_core::capi::network::machine_label;
/// assert_eq!(machine_label("md-0-x7f"), "md-0-x7f");
/// assert!(machine_label(&"m".repeat(64)).starts_with("h-"));
/// ```
pub fn machine_label(name: &str) -> String {
    // A DNS subdomain of at most 63 characters is a valid label value.
    if name.len() <= 63 {
        name.to_string()
    } else {
        format!("h-{:016x}", fnv(name))
    }
}

fn pool_ident(p: &PoolName) -> String {
    format!("{}/{}", p.kind.as_deref().unwrap_or("MetalIPPool"), p.name)
}

fn vlan_ident(r: &VlanRef, metro: &str) -> String {
    match (&r.id, r.vxlan, &r.pool) {
        (Some(id), _, _) => format!("id:{}", id.to_ascii_lowercase()),
        (_, Some(n), _) => format!("vxlan:{metro}/{n}"),
        (_, _, Some(p)) => format!("pool:{}", pool_ident(p)),
        _ => "?".into(),
    }
}

/// One pool address of a profile: which port and slot, from which pool,
/// and its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSlot<'a> {
    /// The port.
    pub port: &'a str,
    /// The slot on the port (its place in the profile's lists).
    pub slot: Slot,
    /// The pool the address comes from.
    pub pool: &'a PoolName,
    /// What it is for (port, VLAN or elastic IP, pool), for people.
    pub identity: String,
    /// The identity's hash: [`SLOT_LABEL`] and the tail of the claim's name.
    pub key: String,
}

impl PoolSlot<'_> {
    /// The claim's name for machine `machine`.
    pub fn claim_name(&self, machine: &str) -> String {
        let what = match self.slot {
            Slot::Vlan(_) => "vlan",
            Slot::Elastic(_) => "elastic",
        };
        format!("{machine}-{}-{what}-{}", self.port, self.key)
    }

    /// The claim's name before claims were identified (by list index).
    fn legacy_name(&self, machine: &str) -> String {
        match self.slot {
            Slot::Vlan(j) => format!("{machine}-{}-vlan-{j}", self.port),
            Slot::Elastic(k) => format!("{machine}-{}-elastic-{k}", self.port),
        }
    }
}

/// Every pool address of the profile, one claim each (see the module
/// docs for the identity).
///
/// ```
/// use metal_ipam_core::capi::network::pool_slots;
/// use metal_ipam_core::network::profile::Profile;
/// let p = |vlans: serde_json::Value| Profile::from_json(&serde_json::json!(
///     {"metro": "da", "ports": [{"name": "bond0", "vlans": vlans}]})).unwrap();
/// let a = p(serde_json::json!([{"vxlan": 1011, "addresses": [{"pool": {"name": "nodes"}}]}]));
/// let b = p(serde_json::json!([{"vxlan": 1010}, {"vxlan": 1011, "addresses": [{"pool": {"name": "nodes"}}]}]));
/// let c = p(serde_json::json!([{"vxlan": 1011, "addresses": [{"pool": {"name": "stor"}}]}]));
/// let key = |p: &Profile| pool_slots(p)[0].key.clone();
/// assert_eq!(key(&a), key(&b), "a VLAN inserted before it changes nothing");
/// assert_ne!(key(&a), key(&c), "another pool is another claim");
/// assert_eq!(pool_slots(&a)[0].claim_name("m-0"), format!("m-0-bond0-vlan-{}", key(&a)));
/// ```
pub fn pool_slots(profile: &Profile) -> Vec<PoolSlot<'_>> {
    let metro = profile
        .metro
        .as_deref()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let mut out = Vec::new();
    for port in &profile.ports {
        for (j, v) in port.vlans.iter().enumerate() {
            if let Some(pool) = v.addresses.iter().find_map(|a| a.pool.as_ref()) {
                let identity = format!(
                    "{} vlan {} pool {}",
                    port.name,
                    vlan_ident(&v.vlan(), &metro),
                    pool_ident(pool)
                );
                out.push((port.name.as_str(), Slot::Vlan(j), pool, identity));
            }
        }
        for (k, e) in port.elastic_ips.iter().enumerate() {
            let ordinal = port.elastic_ips[..k]
                .iter()
                .filter(|x| x.pool == e.pool)
                .count();
            let identity = format!(
                "{} elastic-ip pool {} #{ordinal}",
                port.name,
                pool_ident(&e.pool)
            );
            out.push((port.name.as_str(), Slot::Elastic(k), &e.pool, identity));
        }
    }
    out.into_iter()
        .map(|(port, slot, pool, identity)| PoolSlot {
            port,
            slot,
            pool,
            key: format!("{:010x}", fnv(&identity) >> 24),
            identity,
        })
        .collect()
}

/// A claim as the network step reads it.
#[derive(Debug, Clone, Default, PartialEq)]
struct NetClaim {
    metadata: ObjectMeta,
    /// `spec.poolRef` (kind, name).
    pool: (String, String),
}

impl Object for NetClaim {
    fn from_json(v: &Value) -> Self {
        let s = |p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        NetClaim {
            metadata: metadata(v),
            pool: (s("/spec/poolRef/kind"), s("/spec/poolRef/name")),
        }
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

impl NetClaim {
    fn of_machine(&self, machine: &str) -> bool {
        self.metadata
            .owner_references
            .iter()
            .any(|r| r.kind == "Machine" && r.name == machine)
    }

    fn is_from(&self, p: &PoolName) -> bool {
        let kind = p.kind.as_deref().unwrap_or("MetalIPPool");
        self.pool.0 == kind && self.pool.1 == p.name
    }
}

/// The machine's labelled claims (one list of its namespace's claims with
/// [`MACHINE_LABEL`]), owned by a Machine of that name.
fn labelled_claims<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<Vec<NetClaim>> {
    let selector = format!("{MACHINE_LABEL}={}", machine_label(name));
    Ok(kube
        .list_as_selected::<NetClaim>(&kube::CLAIMS, Some(ns), Some(&selector))?
        .into_iter()
        .filter(|c| c.of_machine(name))
        .collect())
}

/// Whether a claim name is one of `machine`'s profile claims by its name
/// (both namings: `<machine>-<port>-vlan-…`, `<machine>-<port>-elastic-…`).
fn named_for(claim: &str, machine: &str) -> bool {
    claim.strip_prefix(machine).is_some_and(|rest| {
        rest.starts_with('-') && (rest.contains("-vlan-") || rest.contains("-elastic-"))
    })
}

/// The live claims of every Machine, grouped once so that finding a
/// Machine's claims costs a lookup, not a pass over every claim: by
/// (namespace, machine label value) and by (namespace, the machine name
/// [`named_for`] would accept). A claim is in the first map once and in
/// the second once per `-` before its `-vlan-`/`-elastic-` part.
#[derive(Default)]
struct ClaimsOfMachines<'c> {
    by_label: BTreeMap<(&'c str, &'c str), Vec<&'c ObjectMeta>>,
    by_name: BTreeMap<(&'c str, &'c str), Vec<&'c ObjectMeta>>,
}

impl<'c> ClaimsOfMachines<'c> {
    fn new(claims: &[&'c ObjectMeta]) -> Self {
        let mut out = ClaimsOfMachines::default();
        for &c in claims.iter().filter(|c| !c.deleting()) {
            let ns = c.namespace.as_deref().unwrap_or_default();
            if let Some(l) = c.label(MACHINE_LABEL) {
                out.by_label.entry((ns, l)).or_default().push(c);
            }
            for (i, _) in c.name.match_indices('-') {
                let machine = &c.name[..i];
                if named_for(&c.name, machine) {
                    out.by_name.entry((ns, machine)).or_default().push(c);
                }
            }
        }
        out
    }

    /// Machine `ns/name`'s claims: its label's, then those named for it
    /// without the label, each once.
    fn of(&self, ns: &str, name: &str) -> Vec<&'c ObjectMeta> {
        let label = machine_label(name);
        let mut out: Vec<&'c ObjectMeta> = self
            .by_label
            .get(&(ns, label.as_str()))
            .cloned()
            .unwrap_or_default();
        for c in self.by_name.get(&(ns, name)).into_iter().flatten() {
            if c.label(MACHINE_LABEL) != Some(label.as_str()) {
                out.push(c);
            }
        }
        out
    }
}

/// What [`ensure_claims`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// Claims created.
    pub created: usize,
    /// Claims under the old naming adopted (labelled; addresses kept).
    pub adopted: usize,
    /// Claims that no longer match the profile (to delete once allowed).
    pub stale: Vec<String>,
}

/// Makes the machine's claims match the profile: creates the claim of
/// every pool address of the profile that has none, owned by the Machine
/// (garbage-collected with it, so its address is released through the
/// allocator) and labelled with its cluster, the machine and the slot;
/// adopts claims of the old naming that still match; returns the claims
/// that no longer match, for [`delete_stale`]. Names are checked before
/// anything is created.
///
/// # Idempotency
/// A second call creates nothing and finds the same stale claims.
///
/// # Errors
/// 422 for a claim name that is not a valid Kubernetes name (a machine
/// name near the length limit); API server errors.
pub fn ensure_claims<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    m: &MachineNetwork,
) -> Result<Claims> {
    let slots = pool_slots(&m.profile);
    for s in &slots {
        let claim = s.claim_name(name);
        names::check_subdomain(&claim)
            .map_err(|e| Error::invalid("metadata.name", format!("claim {claim}: {e}")))?;
    }
    let mut out = Claims::default();
    let mut have = labelled_claims(kube, ns, name)?;
    // Upgrade: no labelled claim yet, but the profile has pool addresses:
    // the machine's claims of the old naming, once.
    if have.is_empty() && !slots.is_empty() {
        let legacy: Vec<NetClaim> = kube
            .list_as::<NetClaim>(&kube::CLAIMS, Some(ns))?
            .into_iter()
            .filter(|c| c.of_machine(name) && named_for(&c.metadata.name, name))
            .filter(|c| c.metadata.label(SLOT_LABEL).is_none() && !c.metadata.deleting())
            .collect();
        for c in legacy {
            let slot = slots
                .iter()
                .find(|s| s.legacy_name(name) == c.metadata.name && c.is_from(s.pool));
            match slot {
                Some(s) => {
                    let patch = json!({"metadata": {
                        "labels": {MACHINE_LABEL: machine_label(name), SLOT_LABEL: s.key},
                        "annotations": {SLOT_ANNOTATION: s.identity}}});
                    let labelled =
                        kube.merge_patch(&kube::CLAIMS, Some(ns), &c.metadata.name, false, &patch)?;
                    have.push(NetClaim::from_json(&labelled));
                    out.adopted += 1;
                }
                None => out.stale.push(c.metadata.name.clone()),
            }
        }
    }
    let keys: BTreeSet<&str> = slots.iter().map(|s| s.key.as_str()).collect();
    for c in &have {
        let current = c
            .metadata
            .label(SLOT_LABEL)
            .is_some_and(|k| keys.contains(k));
        if !current && !c.metadata.deleting() {
            out.stale.push(c.metadata.name.clone());
        }
    }
    for s in &slots {
        if have
            .iter()
            .any(|c| c.metadata.label(SLOT_LABEL) == Some(s.key.as_str()))
        {
            // Ours already (or still going: created again once gone).
            continue;
        }
        let object = NewClaim::for_slot(s, ns, name, m);
        match kube.create(&kube::CLAIMS, Some(ns), &object.to_json()) {
            Ok(_) => out.created += 1,
            Err(KubeError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// A per-VLAN `IPAddressClaim` as created: labelled with its machine and
/// slot, owned (controller) by the Machine, its `poolRef` the slot's pool.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewClaim {
    api_version: String,
    kind: &'static str,
    metadata: NewClaimMeta,
    spec: NewClaimSpec,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewClaimMeta {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner_references: Vec<OwnerReference>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewClaimSpec {
    pool_ref: PoolRef,
}

impl NewClaim {
    fn for_slot(s: &PoolSlot<'_>, ns: &str, machine: &str, m: &MachineNetwork) -> NewClaim {
        let mut labels = BTreeMap::from([
            (MACHINE_LABEL.to_string(), machine_label(machine)),
            (SLOT_LABEL.to_string(), s.key.clone()),
        ]);
        if let Some(c) = &m.cluster {
            labels.insert(CLUSTER_NAME_LABEL.to_string(), c.clone());
        }
        let owner = OwnerReference::owner(
            &kube::MACHINES.api_version(),
            "Machine",
            machine,
            &m.uid,
            true,
        );
        NewClaim {
            api_version: kube::CLAIMS.api_version(),
            kind: "IPAddressClaim",
            metadata: NewClaimMeta {
                name: s.claim_name(machine),
                namespace: ns.to_string(),
                labels,
                annotations: BTreeMap::from([(SLOT_ANNOTATION.to_string(), s.identity.clone())]),
                owner_references: vec![owner],
            },
            spec: NewClaimSpec {
                pool_ref: PoolRef {
                    api_group: Some(crate::ipam::pool::GROUP.to_string()),
                    kind: s.pool.kind.as_deref().unwrap_or("MetalIPPool").to_string(),
                    name: s.pool.name.clone(),
                },
            },
        }
    }

    fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Deletes claims [`ensure_claims`] found stale (their addresses are
/// released through the allocator); returns how many were still there.
///
/// # Errors
/// API server errors.
pub fn delete_stale<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    stale: &[String],
) -> Result<usize> {
    let mut deleted = 0;
    for c in stale {
        if kube.delete(&kube::CLAIMS, Some(ns), c)? {
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Deletes every claim the profile made for the machine (owned by the
/// Machine `uid`, labelled for it or named after it under either naming),
/// so their addresses are released through the allocator; returns how
/// many. A profile's claims are found without the profile, which may be
/// gone. (One list of the namespace's claims.)
///
/// # Idempotency
/// Claims already deleting are left alone: a second call deletes nothing.
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
    let label = machine_label(name);
    let mut deleted = 0;
    for c in claims {
        let m = &c.metadata;
        let ours = m.owned_by(uid)
            && (m.label(MACHINE_LABEL) == Some(label.as_str()) || named_for(&m.name, name));
        if ours && !m.deleting() {
            kube.delete(&kube::CLAIMS, Some(ns), &m.name)?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Each slot's claim, if it has one: by label, or (before any claim is
/// labelled) by its old name, owned by the Machine and from the slot's
/// pool. Reads only.
fn claims_of_slots<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    slots: &[PoolSlot<'_>],
) -> Result<Vec<Option<String>>> {
    let have = labelled_claims(kube, ns, name)?;
    let mut out = Vec::new();
    for s in slots {
        let labelled = have.iter().find(|c| {
            c.metadata.label(SLOT_LABEL) == Some(s.key.as_str()) && !c.metadata.deleting()
        });
        let found = match labelled {
            Some(c) => Some(c.metadata.name.clone()),
            None if have.is_empty() => {
                let old = s.legacy_name(name);
                kube.get_as::<NetClaim>(&kube::CLAIMS, Some(ns), &old)?
                    .filter(|c| c.of_machine(name) && c.is_from(s.pool) && !c.metadata.deleting())
                    .map(|_| old)
            }
            None => None,
        };
        out.push(found);
    }
    Ok(out)
}

/// The address with prefix of claim `claim`'s `IPAddress`, once bound, if
/// it comes from `pool`.
fn bound_address<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    claim: &str,
    pool: &PoolName,
) -> Result<Option<String>> {
    let Some(v) = kube.get(&kube::IP_ADDRESSES, Some(ns), claim)? else {
        return Ok(None);
    };
    let kind = v.pointer("/spec/poolRef/kind").and_then(Value::as_str);
    let pool_name = v.pointer("/spec/poolRef/name").and_then(Value::as_str);
    if kind != Some(pool.kind.as_deref().unwrap_or("MetalIPPool"))
        || pool_name != Some(pool.name.as_str())
    {
        return Ok(None);
    }
    let address = v.pointer("/spec/address").and_then(Value::as_str);
    let prefix = v.pointer("/spec/prefix").and_then(Value::as_u64);
    Ok(address.zip(prefix).map(|(a, p)| format!("{a}/{p}")))
}

// ---------------------------------------------------------------------------
// VLANs, plan, apply
// ---------------------------------------------------------------------------

/// The profile's VLANs, resolved: (reference, UUID, number).
type Resolved = Vec<(VlanRef, String, u16)>;

fn resolve_vlans<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    ns: &str,
    profile: &Profile,
) -> Result<Resolved> {
    let mut out: Resolved = Vec::new();
    let metro = profile
        .metro
        .as_deref()
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
                format!("the VLAN {} does not exist in Metal (yet)", describe(&r)),
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
/// `DeviceNotFound`, `VlanNotFound`; Metal errors.
pub fn plan_machine<K: KvStore, H: HttpClient + ?Sized, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    cloud: &C,
    ns: &str,
    name: &str,
) -> Result<Value> {
    let m = read_machine(kube, ns, name)?;
    let device = device_or_conflict(&m, ns, name)?;
    let observed = apply::observe(cloud, &device)?;
    let desired = desired_on(ctx, cloud, ns, &m, &observed)?;
    let steps = crate::network::plan::plan(&observed, &desired)?;
    Ok(
        json!({"machine": format!("{ns}/{name}"), "profile": m.profile_name, "device": device,
              "modes": m.profile.on_device(observed.eth_ports()).modes().iter().map(|(b, md)| (b.to_string(), Value::from(md.as_str()))).collect::<serde_json::Map<_, _>>(),
              "plan": steps.iter().map(Step::to_json).collect::<Vec<_>>()}),
    )
}

/// What applying a profile to a device came to.
pub(super) enum OnDevice {
    /// The apply ran (converged or in progress).
    Applied(Report),
    /// The operator released the device meanwhile (nothing called).
    Released,
    /// The device is gone: record forgotten, claims deleted (how many).
    Gone(usize),
}

/// The claims, then the profile applied to the device, then (once
/// converged) the stale claims deleted. A device found gone is forgotten
/// and the machine's claims deleted.
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_on_device<K: KvStore, H: HttpClient + ?Sized, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    cloud: &C,
    batches: &dyn VlanBatches,
    ns: &str,
    name: &str,
    m: &MachineNetwork,
    device: &str,
) -> Result<OnDevice> {
    let Some(observed) = apply::observe_device(cloud, device)? else {
        apply::forget(ctx, device)?;
        return Ok(OnDevice::Gone(delete_claims(kube, ns, name, &m.uid)?));
    };
    // The per-VLAN claims first: their addresses are allocated while the
    // device is on its way.
    let claims = ensure_claims(kube, ns, name, m)?;
    let desired = desired_on(ctx, cloud, ns, m, &observed)?;
    let Some(report) = apply::apply_profile(ctx, cloud, batches, device, &desired)? else {
        return Ok(OnDevice::Released);
    };
    if report.phase == apply::Phase::Converged {
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
pub fn apply_machine<K: KvStore, H: HttpClient + ?Sized, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    cloud: &C,
    batches: &dyn VlanBatches,
    ns: &str,
    name: &str,
) -> Result<(Report, String)> {
    let m = read_machine(kube, ns, name)?;
    let device = device_or_conflict(&m, ns, name)?;
    apply::clear_released(ctx, &device)?;
    match apply_on_device(ctx, kube, cloud, batches, ns, name, &m, &device)? {
        OnDevice::Applied(r) => Ok((r, device)),
        OnDevice::Released => Ok((
            Report {
                phase: apply::Phase::InProgress {
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
pub(super) fn release_device<K: KvStore, H: HttpClient + ?Sized, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    cloud: &C,
    batches: &dyn VlanBatches,
    (ns, name, uid): (&str, &str, &str),
    device: &str,
) -> Result<(Option<Report>, usize)> {
    let Some(observed) = apply::observe_device(cloud, device)? else {
        apply::forget(ctx, device)?;
        return Ok((None, delete_claims(kube, ns, name, uid)?));
    };
    let r = apply::apply(ctx, cloud, batches, device, &Desired::teardown(&observed))?;
    if r.phase != apply::Phase::Converged {
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
pub fn release_machine<K: KvStore, H: HttpClient + ?Sized, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    cloud: &C,
    batches: &dyn VlanBatches,
    ns: &str,
    name: &str,
) -> Result<(Option<Report>, usize)> {
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
    apply::mark_released(ctx, &device, profile, ctx.env.now())?;
    let (report, deleted) = release_device(ctx, kube, cloud, batches, (ns, name, &uid), &device)?;
    if report
        .as_ref()
        .is_some_and(|r| r.phase == apply::Phase::Converged)
    {
        apply::release_done(ctx, &device)?;
    }
    Ok((report, deleted))
}

// ---------------------------------------------------------------------------
// Which Machines
// ---------------------------------------------------------------------------

/// Every object of a kind; none when the API server does not serve it (a
/// cluster without CAPI's Machines or CAPP's `PacketMachine`s).
fn list_or_none<H: HttpClient + ?Sized, T: Object>(
    kube: &Kube<'_, H>,
    r: &kube::Resource,
    ns: Option<&str>,
) -> Result<Vec<T>> {
    match kube.list_as(r, ns) {
        Ok(v) => Ok(v),
        Err(KubeError::NotFound(_)) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// A Machine, the profile annotation it is opted in by (its own, else its
/// `PacketMachine`'s; unchecked) and its device.
struct Listed {
    machine: MachineObject,
    profile: Option<String>,
    device: Option<String>,
}

/// The Machines of a namespace (or of all, `None`), not deleting, as
/// [`Listed`]. Two lists (Machines, `PacketMachine`s; a cluster without
/// CAPP's kind has none).
fn machines_with_profiles<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: Option<&str>,
) -> Result<Vec<Listed>> {
    let machines: Vec<MachineObject> = list_or_none(kube, &kube::MACHINES, ns)?;
    let infra: Vec<MachineObject> = list_or_none(kube, &kube::PACKET_MACHINES, ns)?;
    let mut out = Vec::new();
    for m in machines {
        if m.metadata.deleting() {
            continue;
        }
        let pm = match &m.infrastructure {
            Some((kind, iname)) if kind == "PacketMachine" => infra.iter().find(|i| {
                i.metadata.name == *iname && i.metadata.namespace == m.metadata.namespace
            }),
            _ => None,
        };
        let profile = m
            .metadata
            .annotation(PROFILE_ANNOTATION)
            .or_else(|| pm.and_then(|i| i.metadata.annotation(PROFILE_ANNOTATION)))
            .map(str::to_string);
        let device = provider_of(&m, pm).and_then(device_of).map(str::to_string);
        out.push(Listed {
            machine: m,
            profile,
            device,
        });
    }
    Ok(out)
}

/// The Machines of namespace `ns` that use profile `profile` (their
/// annotation, or their `PacketMachine`'s, names it), sorted: what a
/// profile's event is routed to, and what keeps the webhook from deleting
/// it.
///
/// # Errors
/// API server errors.
pub fn machines_using<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    profile: &str,
) -> Result<Vec<String>> {
    let mut out: Vec<String> = machines_with_profiles(kube, Some(ns))?
        .into_iter()
        .filter(|l| l.profile.as_deref() == Some(profile))
        .map(|l| l.machine.metadata.name)
        .collect();
    out.sort();
    Ok(out)
}

/// The Machines of namespace `ns` whose `spec.infrastructureRef` is the
/// `PacketMachine` `pm` (what its event is routed to). One list.
///
/// # Errors
/// API server errors.
pub fn machines_of_packet_machine<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    pm: &str,
) -> Result<Vec<String>> {
    let machines: Vec<MachineObject> = list_or_none(kube, &kube::MACHINES, Some(ns))?;
    let mut out: Vec<String> = machines
        .into_iter()
        .filter(|m| {
            m.infrastructure
                .as_ref()
                .is_some_and(|(k, n)| k == "PacketMachine" && n == pm)
        })
        .map(|m| m.metadata.name)
        .collect();
    out.sort();
    Ok(out)
}

/// What [`machines_to_sync`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToSync {
    /// `(namespace, name)` of every Machine to sync: opted in, or on a
    /// device with our apply record (a release to finish, or to remember).
    pub machines: Vec<(String, String)>,
    /// Claims deleted of Machines that are not opted in and whose device
    /// has no record of ours (claims made while a Machine waited for its
    /// device, then its annotation removed).
    pub claims_deleted: usize,
    /// The Machines to sync as the observation summary lists them, in the
    /// order of `machines` (phase left empty: the network step's answer
    /// gives it); each profile is read once per run.
    pub rows: Vec<MachineRow>,
}

/// The Machines a full reconciliation syncs (see [`ToSync`]), from two
/// lists (Machines, `PacketMachine`s) and the devices with an apply record
/// (`network::apply::devices`: their index); `claims` are
/// the claims the reconciliation listed, whose profile claims of Machines
/// that are neither opted in nor applied to are deleted here.
///
/// # Idempotency
/// Claims already deleting are left alone.
///
/// # Errors
/// API server and store errors.
pub fn machines_to_sync<'c, K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    claims: impl Iterator<Item = &'c ObjectMeta>,
) -> Result<ToSync> {
    let machines = machines_with_profiles(kube, None)?;
    let recorded: BTreeSet<String> = apply::devices(ctx)?.into_iter().collect();
    let claims: Vec<&ObjectMeta> = claims.collect();
    let grouped = ClaimsOfMachines::new(&claims);
    let mut out = ToSync::default();
    let mut idle: Vec<(String, String, String)> = Vec::new();
    let mut profiles = BTreeMap::new();
    for Listed {
        machine: m,
        profile,
        device,
    } in &machines
    {
        let ns = m.metadata.namespace.clone().unwrap_or_default();
        let name = m.metadata.name.clone();
        if profile.is_some() || device.as_ref().is_some_and(|d| recorded.contains(d)) {
            let row = machine_row(ctx, kube, &mut profiles, (m, profile, device), &grouped);
            out.rows.push(row);
            out.machines.push((ns, name));
        } else if let Some(uid) = &m.metadata.uid {
            idle.push((ns, name, uid.clone()));
        }
    }
    // The idle Machines' own claims (owned by them), deleted once each, in
    // the order listed.
    let mut orphans: BTreeSet<(&str, &str)> = BTreeSet::new();
    for (ns, name, uid) in &idle {
        for c in grouped.of(ns, name).into_iter().filter(|c| c.owned_by(uid)) {
            orphans.insert((ns.as_str(), c.name.as_str()));
        }
    }
    for c in claims {
        let ns = c.namespace.as_deref().unwrap_or_default();
        if orphans.contains(&(ns, c.name.as_str()))
            && kube.delete(&kube::CLAIMS, Some(ns), &c.name)?
        {
            out.claims_deleted += 1;
        }
    }
    Ok(out)
}

/// A Machine to sync as the observation summary lists it: its profile's
/// bonds with their modes and VLANs (each profile read once per run,
/// `profiles`) and the addresses its per-VLAN claims are bound to.
fn machine_row<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    profiles: &mut BTreeMap<(String, String), std::result::Result<Profile, String>>,
    (m, profile, device): (&MachineObject, &Option<String>, &Option<String>),
    claims: &ClaimsOfMachines<'_>,
) -> MachineRow {
    let ns = m.metadata.namespace.clone().unwrap_or_default();
    let name = m.metadata.name.clone();
    let mut row = MachineRow {
        namespace: ns.clone(),
        name: name.clone(),
        cluster: m.cluster.clone(),
        profile: profile.clone(),
        device: device.clone(),
        phase: String::new(),
        ports: Vec::new(),
        addresses: BTreeMap::new(),
        error: None,
    };
    if let Some(p) = profile {
        let read = profiles.entry((ns.clone(), p.clone())).or_insert_with(|| {
            let object = kube
                .get(&kube::NETWORK_PROFILES, Some(&ns), p)
                .map_err(|e| Error::from(e).to_string())?
                .ok_or_else(|| format!("MetalNetworkProfile {ns}/{p} does not exist"))?;
            Profile::from_json(object.get("spec").unwrap_or(&Value::Null))
                .map_err(|e| e.to_string())
        });
        match read {
            Ok(profile) => row.ports = port_rows(profile),
            Err(e) => row.error = Some(e.clone()),
        }
    }
    for c in claims.of(&ns, &name) {
        if let Ok(Some(b)) = ops::get_claim(ctx.kv, &ns, &c.name) {
            row.addresses
                .insert(c.name.clone(), format!("{}/{}", b.address, b.prefix));
        }
    }
    row
}

/// A profile's bonds with their modes and the VLANs on each bond and its
/// members.
fn port_rows(profile: &Profile) -> Vec<PortRow> {
    let modes = profile.modes();
    bonds(profile.eth_ports())
        .into_iter()
        .map(|(bond, members)| {
            let vlans = std::iter::once(bond)
                .chain(members)
                .filter_map(|p| profile.port(p))
                .flat_map(|p| &p.vlans)
                .map(|v| match (v.vxlan, &v.pool, &v.id) {
                    (Some(n), _, _) => n.to_string(),
                    (None, Some(pool), _) => format!("pool {}", pool.name),
                    (None, None, Some(id)) => format!("id {id}"),
                    (None, None, None) => "?".to_string(),
                })
                .collect();
            PortRow {
                port: bond.to_string(),
                mode: modes.get(bond).map_or("layer3", |m| m.as_str()).to_string(),
                vlans,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The node's configuration
// ---------------------------------------------------------------------------

/// The node's OS network configuration in `format`, from the profile (no
/// device needed), and the addresses still pending.
///
/// Addresses from pools are those of the machine's claims of the profile's
/// current slots (see the module docs) whose `IPAddress` comes from the
/// slot's pool; any other slot is listed as pending.
///
/// # Errors
/// As [`read_machine`]; 404 `VlanNotFound`; Metal errors.
pub fn netconfig<K: KvStore, H: HttpClient + ?Sized, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    cloud: &C,
    ns: &str,
    name: &str,
    format: Format,
) -> Result<(String, Vec<Pending>)> {
    let m = read_machine(kube, ns, name)?;
    let resolved = resolve_vlans(ctx, cloud, ns, &m.profile)?;
    let vxlan_of = |r: &VlanRef| resolved.iter().find(|(x, _, _)| x == r).map(|(_, _, n)| *n);
    // The claims' addresses, read once (the callback cannot fail).
    let slots = pool_slots(&m.profile);
    let claims = claims_of_slots(kube, ns, name, &slots)?;
    let mut bound: Vec<(String, Slot, String)> = Vec::new();
    for (s, claim) in slots.iter().zip(claims) {
        let Some(claim) = claim else { continue };
        if let Some(a) = bound_address(kube, ns, &claim, s.pool)? {
            bound.push((s.port.to_string(), s.slot, a));
        }
    }
    let address_of = |port: &str, slot: Slot, _: &PoolName| {
        bound
            .iter()
            .find(|(p, s, _)| p == port && *s == slot)
            .map(|(_, _, a)| a.clone())
    };
    let (net, pending) = node_network(&m.profile, &vxlan_of, &address_of)?;
    if format == Format::NetworkData {
        return Ok((network_data_of(cloud, &m, ns, name, &net)?, pending));
    }
    Ok((render(&net, format), pending))
}

/// `network_data.json` for the machine's device: its ports, MACs and
/// Layer3 addresses as Metal reports them ([`network_data::host`]).
///
/// # Errors
/// 409 `DeviceUnknown` (no device yet: no MACs), `MacUnknown`; 404
/// `DeviceNotFound`; Metal errors.
fn network_data_of<C: Cloud + ?Sized>(
    cloud: &C,
    m: &MachineNetwork,
    ns: &str,
    name: &str,
    net: &crate::network::render::NodeNetwork,
) -> Result<String> {
    let id = m.device.clone().ok_or_else(|| {
        Error::conflict(
            "DeviceUnknown",
            format!(
                "Machine {ns}/{name} has no device yet (spec.providerID): network_data.json needs its ports' MAC addresses; use format=netplan, ifupdown, cloud-init or shell meanwhile"
            ),
        )
    })?;
    let device: DeviceView = cloud
        .device_nics(&id)?
        .ok_or_else(|| not_found("DeviceNotFound", format!("device {id} does not exist")))?;
    network_data::render(net, &network_data::host(&m.profile, &device, Vec::new()))
}

/// `format=` of the netconfig route.
///
/// ```
/// use metal_ipam_core::capi::network::format_of;
/// use metal_ipam_core::network::render::Format;
/// assert_eq!(format_of("format=ifupdown").unwrap(), Format::Ifupdown);
/// assert_eq!(format_of("").unwrap(), Format::Netplan);
/// assert_eq!(format_of("format=network-data").unwrap(), Format::NetworkData);
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
        "network-data" => Ok(Format::NetworkData),
        other => Err(Error::malformed(format!(
            "format {other:?}: use netplan, ifupdown, cloud-init, shell or network-data"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn meta(ns: &str, name: &str, label: Option<&str>, deleting: bool) -> ObjectMeta {
        let mut m = json!({"name": name, "namespace": ns});
        if let Some(l) = label {
            m["labels"] = json!({MACHINE_LABEL: l});
        }
        if deleting {
            m["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        ObjectMeta::from_json(&m)
    }

    proptest! {
        /// The grouped claims of a Machine are exactly those the one-pass
        /// filter (the definition) finds: live, same namespace, labelled
        /// for it or named for it.
        #[test]
        fn grouped_claims_are_the_filtered_ones(
            claims in prop::collection::vec((
                prop::sample::select(vec!["a", "b"]),
                prop::sample::select(vec!["m", "m-1", "m-1-vlan-0", "m-vlan-2", "m-1-elastic-0",
                    "m-vlan-1-vlan-2", "x-vlan-0", "m1-vlan-0", "m-"]),
                prop::option::of(prop::sample::select(vec!["m", "m-1", "x"])),
                prop::bool::weighted(0.2),
            ), 0..12),
        ) {
            let metas: Vec<ObjectMeta> = claims
                .iter()
                .map(|(ns, name, label, del)| meta(ns, name, *label, *del))
                .collect();
            let refs: Vec<&ObjectMeta> = metas.iter().collect();
            let grouped = ClaimsOfMachines::new(&refs);
            for ns in ["a", "b"] {
                for machine in ["m", "m-1", "x", "m1", "m-vlan-1"] {
                    let label = machine_label(machine);
                    let want: BTreeSet<*const ObjectMeta> = refs
                        .iter()
                        .filter(|c| {
                            c.namespace.as_deref() == Some(ns)
                                && !c.deleting()
                                && (c.label(MACHINE_LABEL) == Some(label.as_str())
                                    || named_for(&c.name, machine))
                        })
                        .map(|c| *c as *const ObjectMeta)
                        .collect();
                    let got: Vec<*const ObjectMeta> = grouped
                        .of(ns, machine)
                        .into_iter()
                        .map(|c| c as *const ObjectMeta)
                        .collect();
                    prop_assert_eq!(got.len(), want.len(), "each once: {} {}", ns, machine);
                    prop_assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want);
                }
            }
        }
    }
}
