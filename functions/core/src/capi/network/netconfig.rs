//! The node's configuration: the profile rendered in a format (netplan,
//! ifupdown, cloud-init, shell, OpenStack `network_data.json`), with the
//! addresses of the machine's claims and those still pending.

use super::claims::{bound_address, claims_of_slots, pool_slots};
use super::on_device::resolve_vlans;
use super::Deps;
use super::{not_found, read_machine, MachineNetwork};
use crate::capi::device::device_cloud;
use crate::cloud::{Cloud, CloudKind, DeviceView};
use crate::error::{Error, Result};
use crate::kube::Kube;
use crate::network::network_data;
use crate::network::node::{node_network, Pending, Slot};
use crate::network::profile::Profile;
use crate::network::profile::{PoolName, VlanRef};
use crate::network::render::{render, Format};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::provision::clouds::not_configured;

/// The node's OS network configuration in `format`, from the profile (no
/// device needed), and the addresses still pending.
///
/// Addresses from pools are those of the machine's claims of the profile's
/// current slots (see the module docs) whose `IPAddress` comes from the
/// slot's pool; any other slot is listed as pending.
///
/// # Errors
/// As [`read_machine`]; 404 `VlanNotFound`; Metal errors.
pub fn netconfig<K: KvStore, H: HttpClient + ?Sized>(
    deps: Deps<'_, '_, K, H>,
    ns: &str,
    name: &str,
    format: Format,
) -> Result<(String, Vec<Pending>)> {
    let Deps { ctx, kube, .. } = deps;
    let m = read_machine(kube, ns, name)?;
    let cloud = match &m.device {
        Some(d) => deps.cloud_of(d)?,
        None => profile_cloud(&deps, &m)?,
    };
    let resolved = resolve_vlans(ctx, cloud, ns, &m.profile)?;
    let vxlan_of = |r: &VlanRef| resolved.iter().find(|(x, _, _)| x == r).map(|(_, _, n)| *n);
    // The claims' addresses, read once (the callback cannot fail).
    let bound = bound_addresses(kube, ns, name, &m.profile)?;
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

/// The cloud of a machine without a device yet, by its profile: a
/// phoenixNAP one names `spec.location`.
fn profile_cloud<'r, K: KvStore, H: HttpClient + ?Sized>(
    deps: &Deps<'r, '_, K, H>,
    m: &MachineNetwork,
) -> Result<&'r dyn Cloud> {
    let kind = if m.profile.location.is_some() {
        CloudKind::Phoenixnap
    } else {
        CloudKind::Metal
    };
    match kind {
        CloudKind::Metal => deps.metal,
        CloudKind::Phoenixnap => deps.pnap,
    }
    .ok_or_else(|| not_configured(kind))
}

/// The addresses of the machine's claims for the profile's current slots
/// whose `IPAddress` comes from the slot's pool: (port, slot,
/// `address/prefix`).
///
/// # Errors
/// API server errors.
pub(super) fn bound_addresses<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    profile: &Profile,
) -> Result<Vec<(String, Slot, String)>> {
    let slots = pool_slots(profile);
    let claims = claims_of_slots(kube, ns, name, &slots)?;
    let mut bound = Vec::new();
    for (s, claim) in slots.iter().zip(claims) {
        let Some(claim) = claim else { continue };
        if let Some(a) = bound_address(kube, ns, &claim, s.pool)? {
            bound.push((s.port.to_string(), s.slot, a));
        }
    }
    Ok(bound)
}

/// `network_data.json` for the machine's device: its ports, MACs and
/// Layer3 addresses as Metal reports them ([`network_data::host`]).
///
/// # Errors
/// 409 `DeviceUnknown` (no device yet: no MACs), `MacUnknown` (and for a
/// phoenixNAP server, whose MACs its API does not report); 404
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
    if device_cloud(&id) == CloudKind::Phoenixnap {
        return Err(Error::conflict(
            "MacUnknown",
            format!("network_data.json needs the ports' MAC addresses, which phoenixNAP does not report for server {id}; use format=netplan, ifupdown, cloud-init or shell"),
        ));
    }
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
