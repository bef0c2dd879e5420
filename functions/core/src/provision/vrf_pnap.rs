//! phoenixNAP as the cloud of pools backed by it (`spec.phoenixnap`): the
//! [`VrfCloud`] calls of the provisioning driver, each one call of
//! [`super::pnap_pools`]. The network takes the segment's place in the
//! record ([`Resource::Vlan`]) and a public network's IP block the
//! block's ([`Resource::Reservation`]); phoenixNAP has no VRFs and no
//! gateways to create (a public block's gateway is phoenixNAP's own), so
//! the plan never asks for them ([`crate::ipam::backing::Backing::chain`]).
//!
//! A created network is named, and a created block described, by the
//! pool's tag: that is how a creation whose
//! answer was lost is found instead of repeated.

use std::net::IpAddr;

use super::plan::Progress;
use super::pnap_pools::{self as pools, NetworkKind};
use super::target::Target;
use super::vrf_cloud::{CreateError, VrfCloud};
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::vrf::Resource;
use crate::pnap::client::Pnap;
use crate::ports::http::HttpClient;
use crate::ports::Env;

/// The name of the network created for `t`: the pool's tag (unique per
/// pool incarnation, so a lost creation is found as this pool's).
fn network_name(t: &Target<'_>) -> String {
    t.tag()
}

/// A resource phoenixNAP does not have: the plan never asks for one.
fn none_such(r: Resource) -> Error {
    Error::new(
        ErrorKind::Internal,
        "PnapNoSuchResource",
        format!("phoenixNAP has no {} to provision", r.field()),
    )
}

fn not_created(error: Error) -> CreateError {
    CreateError {
        error,
        outcome_unknown: false,
    }
}

/// phoenixNAP: private networks, public networks and their IP blocks.
impl<H: HttpClient + ?Sized, E: Env + ?Sized> VrfCloud for Pnap<'_, H, E> {
    /// The adopted network (by id, or by VLAN in the location; a public
    /// one gets the pool's block attached unless it has it), or the
    /// adopted block.
    fn adopt(&self, t: &Target<'_>, progress: &Progress, r: Resource) -> Result<String> {
        let s = t.pnap()?;
        match r {
            Resource::Vlan => {
                let n = s.network();
                let id =
                    pools::adopt_network(self, s.kind(), &s.location, n.id.as_deref(), n.vlan_id)?;
                if s.kind() == NetworkKind::Public {
                    pools::attach_block(self, &id, &progress.held_id(Resource::Reservation)?)?;
                }
                Ok(id)
            }
            Resource::Reservation => {
                let id = s.block_spec().id.unwrap_or_default();
                pools::adopt_block(self, &s.location, &id)
            }
            other => Err(none_such(other)),
        }
    }

    fn create(
        &self,
        t: &Target<'_>,
        progress: &Progress,
        r: Resource,
    ) -> std::result::Result<String, CreateError> {
        let s = t.pnap().map_err(not_created)?;
        match r {
            Resource::Vlan => {
                let n = s.network();
                let name = network_name(t);
                match s.kind() {
                    NetworkKind::Private => pools::create_private_network(
                        self,
                        &s.location,
                        &name,
                        n.cidr.as_deref().unwrap_or_default(),
                        n.vlan_id,
                    ),
                    NetworkKind::Public => {
                        let block = progress
                            .held_id(Resource::Reservation)
                            .map_err(not_created)?;
                        pools::create_public_network(self, &s.location, &name, n.vlan_id, &block)
                    }
                }
            }
            Resource::Reservation => {
                let size = s.block_spec().cidr_block_size.unwrap_or_default();
                pools::create_block(self, &s.location, size, &t.tag())
            }
            other => Err(not_created(none_such(other))),
        }
    }

    fn find_created(
        &self,
        t: &Target<'_>,
        _progress: &Progress,
        r: Resource,
    ) -> Result<Option<String>> {
        let s = t.pnap()?;
        match r {
            Resource::Vlan => pools::find_network(self, s.kind(), &s.location, &network_name(t)),
            Resource::Reservation => pools::find_block(self, &s.location, &t.tag()),
            other => Err(none_such(other)),
        }
    }

    fn delete(&self, t: &Target<'_>, r: Resource, id: &str) -> Result<bool> {
        let s = t.pnap()?;
        match r {
            Resource::Vlan => pools::delete_network(self, s.kind(), id),
            Resource::Reservation => pools::delete_block(self, id),
            other => Err(none_such(other)),
        }
    }

    /// A private network's range, or a public pool's block.
    fn block(&self, t: &Target<'_>, progress: &Progress) -> Result<(IpAddr, u8)> {
        let s = t.pnap()?;
        match s.kind() {
            NetworkKind::Private => pools::network_cidr(
                self,
                NetworkKind::Private,
                &progress.held_id(Resource::Vlan)?,
            ),
            NetworkKind::Public => {
                pools::block_cidr(self, &progress.held_id(Resource::Reservation)?)
            }
        }
    }

    fn gateway_state(&self, _id: &str) -> Result<Option<String>> {
        Err(none_such(Resource::Gateway))
    }

    fn gateway_gone(&self, _id: &str) -> Result<bool> {
        Err(none_such(Resource::Gateway))
    }

    /// The servers that are members of the network.
    fn vlan_ports(&self, t: &Target<'_>, network: &str) -> Result<Vec<String>> {
        pools::members(self, t.pnap()?.kind(), network)
    }

    /// The server leaves the network.
    fn unassign_port(&self, t: &Target<'_>, server: &str, network: &str) -> Result<()> {
        pools::remove_member(self, t.pnap()?.kind(), server, network)
    }
}
