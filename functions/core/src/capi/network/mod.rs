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
//! they go into a path (422 naming the field otherwise). A provider ID
//! naming a phoenixNAP server (`bmc://servers/<id>`, `phoenixnap://<id>`)
//! puts the machine on phoenixNAP: its profile is checked for that cloud
//! ([`Profile::validate_for`]) and its networks are applied as the server's
//! memberships ([`crate::network::memberships`]); on phoenixNAP the
//! annotation goes on the Machine (a `BMCMachine` is not read for it).
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
//!
//! # Files
//! This file reads the machine (its profile, its device); `claims`: the
//! slots and their per-VLAN claims; `on_device`: VLANs resolved through
//! the [`crate::cloud::Cloud`] seam, the plan, the apply and the release;
//! `machines`: which Machines a change concerns or the reconcile syncs;
//! `netconfig`: the node's configuration.

use serde_json::Value;

use super::device::{device_cloud, device_in};
use super::objects::MachineObject;
use crate::cloud::{Cloud, CloudKind};
use crate::error::{Error, ErrorKind, Known, Result};
use crate::kube::{self, names, Kube};
use crate::kv::Ctx;
use crate::network::batch::VlanBatches;
use crate::network::profile::Profile;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::provision::clouds::not_configured;

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
/// of no known form, an annotation or infrastructure reference that is
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
    match &device {
        Some(d) => profile.validate_for(device_cloud(d))?,
        None => profile.validate()?,
    }
    Ok(MachineNetwork {
        profile_name,
        profile,
        device,
        uid: machine.metadata.uid.clone().unwrap_or_default(),
        cluster: machine.cluster.clone(),
    })
}

mod claims;
mod machines;
mod netconfig;
mod on_device;

pub use claims::{
    delete_claims, delete_stale, ensure_claims, machine_label, pool_slots, Claims, PoolSlot,
};
pub use machines::{machines_of_packet_machine, machines_to_sync, machines_using, ToSync};
pub use netconfig::{format_of, netconfig};
/// What the machine network's steps use: the store, the API server, the
/// clouds configured (a machine's device decides which one serves it) and
/// the VLAN batch steps (the context passed as one).
pub struct Deps<'r, 'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The store and the clock.
    pub ctx: &'r Ctx<'a, K>,
    /// The API server.
    pub kube: &'r Kube<'a, H>,
    /// Equinix Metal, when configured.
    pub metal: Option<&'r dyn Cloud>,
    /// phoenixNAP, when configured.
    pub pnap: Option<&'r dyn Cloud>,
    /// The VLAN batch steps (Metal's).
    pub batches: &'r dyn VlanBatches,
}

impl<'r, K: KvStore, H: HttpClient + ?Sized> Deps<'r, '_, K, H> {
    /// The cloud of device `device` (by its id's form).
    ///
    /// # Errors
    /// 500 `MetalNotConfigured` / `PnapNotConfigured` when the component
    /// has no credentials for it.
    pub fn cloud_of(&self, device: &str) -> Result<&'r dyn Cloud> {
        let kind = device_cloud(device);
        match kind {
            CloudKind::Metal => self.metal,
            CloudKind::Phoenixnap => self.pnap,
        }
        .ok_or_else(|| not_configured(kind))
    }
}

// References only: copied freely, whatever the store or client.
impl<K: KvStore, H: HttpClient + ?Sized> Clone for Deps<'_, '_, K, H> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K: KvStore, H: HttpClient + ?Sized> Copy for Deps<'_, '_, K, H> {}

pub use on_device::{apply_machine, plan_machine, release_machine};
pub(super) use on_device::{apply_on_device, release_device, OnDevice};
