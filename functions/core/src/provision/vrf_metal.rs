//! Equinix Metal as a [`VrfCloud`]: VRFs, VRF IP reservations, VLANs
//! (virtual networks) and Metal Gateways, through [`Metal`]'s calls. An
//! adopted resource is checked to fit the pool (its metro, its VRF, not
//! another pool's tag); a created one carries the pool's tags.

use std::net::IpAddr;

use super::plan::Progress;
use super::target::Target;
use super::vrf_cloud::{CreateError, VrfCloud};
use crate::error::{Error, Result};
use crate::ipam::vrf::{MetalSpec, Resource};
use crate::metal::client::{Metal, MetalError};
use crate::metal::model::{
    IpAddress, VirtualNetworkCreateInput, VrfCreateInput, VrfIpReservationCreateInput,
    VrfMetalGatewayCreateInput,
};
use crate::ports::http::HttpClient;
use crate::ports::Env;

impl From<MetalError> for CreateError {
    fn from(e: MetalError) -> Self {
        CreateError {
            outcome_unknown: matches!(e, MetalError::OutcomeUnknown { .. }),
            error: e.into(),
        }
    }
}

/// Equinix Metal: VRFs, VRF IP reservations, VLANs (virtual networks) and
/// Metal Gateways.
impl<H: HttpClient + ?Sized, E: Env + ?Sized> VrfCloud for Metal<'_, H, E> {
    fn adopt(&self, t: &Target<'_>, progress: &Progress, r: Resource) -> Result<String> {
        adopt(self, t, t.metal()?, progress, r)
    }

    fn create(
        &self,
        t: &Target<'_>,
        progress: &Progress,
        r: Resource,
    ) -> std::result::Result<String, CreateError> {
        let s = t.metal().map_err(|error| CreateError {
            error,
            outcome_unknown: false,
        })?;
        Ok(create(self, t, s, progress, r)?)
    }

    fn find_created(
        &self,
        t: &Target<'_>,
        progress: &Progress,
        r: Resource,
    ) -> Result<Option<String>> {
        find_created(self, t, t.metal()?, progress, r)
    }

    fn delete(&self, _t: &Target<'_>, r: Resource, id: &str) -> Result<bool> {
        delete(self, r, id)
    }

    fn block(&self, _t: &Target<'_>, progress: &Progress) -> Result<(IpAddr, u8)> {
        block_of(self, progress)
    }

    fn gateway_state(&self, id: &str) -> Result<Option<String>> {
        Ok(self.get_gateway(id)?.map(|g| g.state.unwrap_or_default()))
    }

    /// Gone: a 404, or the 403 a deleted gateway may answer.
    fn gateway_gone(&self, id: &str) -> Result<bool> {
        match self.get_gateway(id) {
            Ok(None) => Ok(true),
            Err(e) if e.status() == Some(403) => Ok(true),
            Ok(Some(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    fn vlan_ports(&self, _t: &Target<'_>, vlan: &str) -> Result<Vec<String>> {
        Ok(Metal::vlan_ports(self, vlan)?)
    }

    fn unassign_port(&self, _t: &Target<'_>, port: &str, vlan: &str) -> Result<()> {
        match Metal::unassign_port(self, port, vlan) {
            Ok(_) => Ok(()),
            Err(e) if e.status() == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn field(r: Resource, f: &str) -> String {
    format!("spec.metal.{}.{f}", r.field())
}

/// Reads an adopted resource and checks it fits the pool.
///
/// # Errors
/// 422 naming the `spec.metal` field whose resource is missing or does
/// not fit; 500 when a resource it depends on is not recorded; Metal's.
fn adopt<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    s: &MetalSpec,
    progress: &Progress,
    r: Resource,
) -> Result<String> {
    let invalid = |what: String| Error::invalid(field(r, "id"), what);
    match r {
        Resource::Vrf => adopt_vrf(metal, t, s),
        Resource::Reservation => {
            let id = s.reservation.id.clone().unwrap_or_default();
            let vrf = progress.held_id(Resource::Vrf)?;
            match metal.get_ip(&id)? {
                Some(IpAddress::Vrf(res)) if t.belongs_elsewhere(&res.tags) => Err(invalid(
                    format!("reservation {id} was created for another metal-ipam pool"),
                )),
                Some(IpAddress::Vrf(res)) if res.vrf.id() == Some(vrf.as_str()) => Ok(res.id),
                Some(IpAddress::Vrf(_)) => Err(invalid(format!(
                    "reservation {id} belongs to another VRF than {vrf}"
                ))),
                Some(_) => Err(invalid(format!("{id} is not a VRF IP reservation"))),
                None => Err(invalid(format!("reservation {id} does not exist"))),
            }
        }
        Resource::Vlan => adopt_vlan(metal, t, s),
        Resource::Gateway => {
            let id = s.gateway.id.clone().unwrap_or_default();
            let gw = metal
                .get_gateway(&id)?
                .ok_or_else(|| invalid(format!("Metal Gateway {id} does not exist")))?;
            let res = progress.held_id(Resource::Reservation)?;
            let vlan = progress.held_id(Resource::Vlan)?;
            let on = |x: &Option<crate::metal::model::Ref>, want: &str| {
                x.as_ref().and_then(|r| r.id()) == Some(want)
            };
            if !on(&gw.ip_reservation, &res) || !on(&gw.virtual_network, &vlan) {
                return Err(invalid(format!(
                    "Metal Gateway {id} does not serve reservation {res} on VLAN {vlan}"
                )));
            }
            Ok(gw.id)
        }
    }
}

/// The adopted VRF: it exists, in the pool's metro, not another pool's.
fn adopt_vrf<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    s: &MetalSpec,
) -> Result<String> {
    let metro = s.metro.to_ascii_lowercase();
    let invalid = |what: String| Error::invalid(field(Resource::Vrf, "id"), what);
    let id = s.vrf.id.clone().unwrap_or_default();
    let vrf = metal
        .get_vrf(&id)?
        .ok_or_else(|| invalid(format!("VRF {id} does not exist in the project")))?;
    let vrf_metro = vrf
        .metro
        .and_then(|m| m.code)
        .map(|c| c.to_ascii_lowercase());
    if vrf_metro.as_deref().is_some_and(|m| m != metro) {
        return Err(invalid(format!(
            "VRF {id} is in metro {}, not {metro}",
            vrf_metro.unwrap_or_default()
        )));
    }
    if t.belongs_elsewhere(&vrf.tags) {
        return Err(invalid(format!(
            "VRF {id} was created for another metal-ipam pool"
        )));
    }
    Ok(vrf.id)
}

/// The adopted VLAN (by id, or by VXLAN in the pool's metro): it exists,
/// is not another pool's, and is in the pool's metro.
fn adopt_vlan<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    s: &MetalSpec,
) -> Result<String> {
    let metro = s.metro.to_ascii_lowercase();
    let invalid = |f: &str, what: String| Error::invalid(field(Resource::Vlan, f), what);
    let vlan = match (&s.vlan.id, s.vlan.vxlan) {
        (Some(id), _) => metal.get_vlan(id)?,
        (None, Some(vxlan)) => metal.find_vlan(vxlan, &metro)?,
        (None, None) => None,
    };
    let vlan = vlan.ok_or_else(|| {
        let (f, what) = match (&s.vlan.id, s.vlan.vxlan) {
            (Some(id), _) => ("id", format!("VLAN {id} does not exist")),
            (None, Some(v)) => ("vxlan", format!("no VLAN {v} in metro {metro}")),
            _ => ("id", "no VLAN named".to_string()),
        };
        invalid(f, what)
    })?;
    if t.belongs_elsewhere(&vlan.tags) {
        return Err(invalid(
            "id",
            format!("VLAN {} was created for another metal-ipam pool", vlan.id),
        ));
    }
    if vlan.metro().is_some_and(|m| m != metro) {
        return Err(invalid(
            "id",
            format!(
                "VLAN {} is in metro {}, not {metro}",
                vlan.id,
                vlan.metro().unwrap_or_default()
            ),
        ));
    }
    Ok(vlan.id)
}

/// Creates `r` with the pool's tag; returns its id.
fn create<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    s: &MetalSpec,
    progress: &Progress,
    r: Resource,
) -> std::result::Result<String, MetalError> {
    let about = format!("metal-ipam pool {}", t.id.display());
    let missing = |what: &str| MetalError::Malformed {
        detail: format!("the {what} is not recorded yet"),
    };
    let id_of = |r: Resource| progress.held(r).map(|h| h.id.clone());
    match r {
        Resource::Vrf => metal
            .create_vrf(&VrfCreateInput {
                name: s.vrf.name.clone().unwrap_or_else(|| t.id.name.clone()),
                metro: s.metro.clone(),
                description: Some(about),
                ip_ranges: s.vrf.ip_ranges.clone(),
                local_asn: s.vrf.local_asn.map(u64::from),
                tags: t.tags(),
            })
            .map(|v| v.id),
        Resource::Reservation => metal
            .create_vrf_reservation(&VrfIpReservationCreateInput {
                kind: "vrf",
                vrf_id: id_of(Resource::Vrf).ok_or_else(|| missing("VRF"))?,
                network: s.reservation.network.clone().unwrap_or_default(),
                cidr: s.reservation.cidr.unwrap_or_default(),
                details: Some(about),
                customdata: Some(t.customdata()),
                tags: t.tags(),
            })
            .map(|r| r.id),
        Resource::Vlan => metal
            .create_vlan(&VirtualNetworkCreateInput {
                metro: s.metro.clone(),
                vxlan: None,
                description: Some(about),
                tags: t.tags(),
            })
            .map(|v| v.id),
        Resource::Gateway => metal
            .create_vrf_gateway(&VrfMetalGatewayCreateInput {
                virtual_network_id: id_of(Resource::Vlan).ok_or_else(|| missing("VLAN"))?,
                ip_reservation_id: id_of(Resource::Reservation)
                    .ok_or_else(|| missing("reservation"))?,
            })
            .map(|g| g.id),
    }
}

/// Looks for `r` created for this pool (by tag; a gateway by its
/// reservation). Duplicates, which only a creation outliving its intent's
/// lease can leave, are deleted, the oldest id kept.
fn find_created<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    s: &MetalSpec,
    progress: &Progress,
    r: Resource,
) -> Result<Option<String>> {
    let metro = s.metro.to_ascii_lowercase();
    let tag = t.tag();
    let tagged = |tags: &[String]| tags.contains(&tag);
    let mut ids: Vec<String> = match r {
        Resource::Vrf => metal
            .list_vrfs(Some(&metro))?
            .into_iter()
            .filter(|v| tagged(&v.tags))
            .map(|v| v.id)
            .collect(),
        Resource::Reservation => metal
            .list_ips(&["vrf"])?
            .into_iter()
            .filter_map(|ip| match ip {
                IpAddress::Vrf(r) if tagged(&r.tags) => Some(r.id),
                _ => None,
            })
            .collect(),
        Resource::Vlan => metal
            .list_vlans(&metro)?
            .into_iter()
            .filter(|v| tagged(&v.tags))
            .map(|v| v.id)
            .collect(),
        Resource::Gateway => {
            let res = progress.held_id(Resource::Reservation)?;
            metal
                .list_gateways()?
                .into_iter()
                .filter(|g| g.ip_reservation.as_ref().and_then(|r| r.id()) == Some(res.as_str()))
                .map(|g| g.id)
                .collect()
        }
    };
    ids.sort();
    let Some(keep) = ids.first().cloned() else {
        return Ok(None);
    };
    for extra in &ids[1..] {
        delete(metal, r, extra)?;
    }
    Ok(Some(keep))
}

fn delete<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    r: Resource,
    id: &str,
) -> Result<bool> {
    Ok(match r {
        Resource::Vrf => metal.delete_vrf(id)?,
        Resource::Reservation => metal.delete_ip(id)?,
        Resource::Vlan => metal.delete_vlan(id)?,
        Resource::Gateway => metal.delete_gateway(id)?,
    })
}

/// The block of the recorded reservation, read from Metal.
fn block_of<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    progress: &Progress,
) -> Result<(IpAddr, u8)> {
    let id = progress.held_id(Resource::Reservation)?;
    match metal.get_ip(&id)? {
        Some(IpAddress::Vrf(r)) => {
            let net = r.network.as_deref().and_then(|n| n.parse().ok());
            match (net, r.cidr) {
                (Some(net), Some(cidr)) => Ok((net, cidr)),
                _ => Err(Error::internal(format!(
                    "reservation {id} has no network/cidr"
                ))),
            }
        }
        _ => Err(Error::conflict(
            "MetalReservationGone",
            format!("the pool's reservation {id} is gone from Metal"),
        )),
    }
}
