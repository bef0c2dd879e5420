//! Which Metal device an object is on: a provider ID read as a device id
//! ([`device_of`]), a Machine's device ([`device_in`]) and a claim's
//! ([`resolve_device`]). The assignment step ([`super::assign`]), the
//! machine network step ([`super::network`]) and the Metal poll
//! ([`super::poll`]) use it; it imports none of them.
//!
//! # A claim's device
//! The annotation [`DEVICE_ANNOTATION`] on the claim (`equinixmetal://<uuid>`
//! or a bare uuid) wins; otherwise the claim's owners are followed: a CAPI
//! `Machine` or a CAPP `PacketMachine` whose `spec.providerID` is
//! `equinixmetal://<uuid>` (the owner's uid must match the reference, so a
//! re-created machine of the same name is not mistaken for it).

use super::objects::MachineObject;
use crate::error::{Error, Result};
use crate::ipam::claim::ClaimObject;
use crate::kube::{self, Kube, Resource};
use crate::ports::http::HttpClient;

/// Annotation on a claim naming its device (`equinixmetal://<uuid>` or
/// the uuid), for claims whose owners do not lead to one.
pub const DEVICE_ANNOTATION: &str = "ipam.metal-ipam.dev/device";

/// The device id a provider ID names: `equinixmetal://<uuid>` or a bare
/// uuid (what CAPP and the cloud controller write).
///
/// ```
/// use metal_ipam_core::capi::device::device_of;
/// assert_eq!(device_of("equinixmetal://9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"),
///     Some("9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"));
/// assert_eq!(device_of("9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"), Some("9f1c2a4e-7b3d-4c55-9e0a-1b2c3d4e5f60"));
/// assert_eq!(device_of("aws:///us-east-1a/i-0abc"), None);
/// assert_eq!(device_of("equinixmetal://"), None);
/// assert_eq!(device_of("equinixmetal://../x"), None);
/// ```
pub fn device_of(provider_id: &str) -> Option<&str> {
    let id = provider_id
        .strip_prefix("equinixmetal://")
        .unwrap_or(provider_id);
    let ok =
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    ok.then_some(id)
}

/// The provider ID of the Machine, else of its infrastructure machine.
pub fn provider_of<'a>(
    machine: &'a MachineObject,
    infra: Option<&'a MachineObject>,
) -> Option<&'a str> {
    machine
        .provider_id
        .as_deref()
        .or_else(|| infra.and_then(|i| i.provider_id.as_deref()))
}

/// The device the provider ID of the Machine (else of its infrastructure
/// machine) names, if it has one.
///
/// # Errors
/// 422 for a provider ID that is not Metal's.
pub fn device_in(machine: &MachineObject, infra: Option<&MachineObject>) -> Result<Option<String>> {
    match provider_of(machine, infra) {
        None => Ok(None),
        Some(p) => Ok(Some(device_of(p).map(str::to_string).ok_or_else(|| {
            Error::invalid(
                "spec.providerID",
                format!("{p:?} is not equinixmetal://<uuid>"),
            )
        })?)),
    }
}

/// Where a claim's device comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    /// The device's id.
    Known(String),
    /// No annotation, and no owner with a provider ID yet.
    Unknown,
    /// The annotation or an owner's provider ID is not Metal's (why).
    Invalid(String),
}

fn machine_resource(api_version: &str, kind: &str) -> Option<&'static Resource> {
    let group = api_version.split('/').next().unwrap_or_default();
    match (group, kind) {
        ("cluster.x-k8s.io", "Machine") => Some(&kube::MACHINES),
        ("infrastructure.cluster.x-k8s.io", "PacketMachine") => Some(&kube::PACKET_MACHINES),
        _ => None,
    }
}

/// The claim's device (see the module docs): one GET per machine owner
/// followed, none when the annotation names it.
///
/// # Errors
/// API server errors.
pub fn resolve_device<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    claim: &ClaimObject,
) -> Result<DeviceRef> {
    let m = &claim.metadata;
    if let Some(a) = m.annotation(DEVICE_ANNOTATION) {
        return Ok(match device_of(a) {
            Some(d) => DeviceRef::Known(d.to_string()),
            None => DeviceRef::Invalid(format!(
                "annotation {DEVICE_ANNOTATION} is {a:?}, not equinixmetal://<uuid>"
            )),
        });
    }
    for owner in &m.owner_references {
        let Some(r) = machine_resource(&owner.api_version, &owner.kind) else {
            continue;
        };
        // A name from an object goes into an API path only once it is a
        // valid Kubernetes name.
        if let Err(e) = crate::kube::names::check_subdomain(&owner.name) {
            return Ok(DeviceRef::Invalid(format!(
                "owner {} {:?} is not a valid name: {e}",
                owner.kind, owner.name
            )));
        }
        let machine: Option<MachineObject> = kube.get_as(r, m.namespace.as_deref(), &owner.name)?;
        let Some(machine) = machine.filter(|o| o.metadata.uid.as_deref() == Some(&owner.uid))
        else {
            continue;
        };
        let Some(p) = machine.provider_id.as_deref() else {
            continue;
        };
        return Ok(match device_of(p) {
            Some(d) => DeviceRef::Known(d.to_string()),
            None => DeviceRef::Invalid(format!(
                "{} {} has spec.providerID {p:?}, not equinixmetal://<uuid>",
                owner.kind, owner.name
            )),
        });
    }
    Ok(DeviceRef::Unknown)
}
