//! What a cloud offering VRF-backed pools must do: the resources (a VRF,
//! an IP reservation in it, a VLAN, a gateway joining them) that the
//! provisioning driver ([`super::step`]) brings into existence and tears
//! down, one at a time. [`VrfCloud`] is that extension of a bare-metal
//! cloud, beyond what every cloud provides; Equinix Metal implements it
//! ([`super::vrf_metal`]), and a cloud that cannot offer VRFs does not (its
//! pools cannot be VRF-backed).
//!
//! Every call reads or makes one resource; the driver records each result
//! before the next call, so the calls keep no state. Created resources
//! carry the pool's tag (a gateway, which has no tags, is found by its
//! reservation): that is how a creation whose answer was lost is found
//! instead of repeated.

use std::net::IpAddr;

use super::plan::Progress;
use super::target::Target;
use crate::error::{Error, Result};
use crate::ipam::vrf::Resource;

/// A creation that did not answer with the resource's id.
#[derive(Debug)]
pub struct CreateError {
    /// What to answer.
    pub error: Error,
    /// The request may or may not have taken effect (its answer was lost):
    /// look for the resource before creating it again. Otherwise nothing
    /// was created (refused, rate limited).
    pub outcome_unknown: bool,
}

/// What a cloud offering VRF-backed pools must do, one resource
/// ([`Resource`]: VRF, reservation, VLAN, gateway) at a time; `progress` is
/// what the pool's record holds (the resources `r` is made on).
pub trait VrfCloud {
    /// Reads the adopted `r` (named in the pool's spec) and checks it fits
    /// the pool; its id.
    ///
    /// # Errors
    /// 422 naming the `spec.metal` field whose resource is missing or does
    /// not fit; 500 when a resource it depends on is not recorded; the
    /// cloud's.
    fn adopt(&self, t: &Target<'_>, progress: &Progress, r: Resource) -> Result<String>;

    /// Creates `r` with the pool's tags; its id.
    ///
    /// # Errors
    /// [`CreateError`]: the cloud's, saying whether the outcome is unknown.
    fn create(
        &self,
        t: &Target<'_>,
        progress: &Progress,
        r: Resource,
    ) -> std::result::Result<String, CreateError>;

    /// Looks for `r` created for this pool (by tag; a gateway by its
    /// reservation). Duplicates, which only a creation outliving its
    /// intent's lease can leave, are deleted, the oldest id kept.
    ///
    /// # Errors
    /// The cloud's.
    fn find_created(
        &self,
        t: &Target<'_>,
        progress: &Progress,
        r: Resource,
    ) -> Result<Option<String>>;

    /// Deletes `r` `id`; `false` when it was already gone.
    ///
    /// # Errors
    /// The cloud's.
    fn delete(&self, t: &Target<'_>, r: Resource, id: &str) -> Result<bool>;

    /// The block of the recorded reservation: network address and prefix
    /// length.
    ///
    /// # Errors
    /// 409 `MetalReservationGone`; 500 for a reservation without a block;
    /// the cloud's.
    fn block(&self, t: &Target<'_>, progress: &Progress) -> Result<(IpAddr, u8)>;

    /// The gateway's state (`None`: it does not exist).
    ///
    /// # Errors
    /// The cloud's.
    fn gateway_state(&self, id: &str) -> Result<Option<String>>;

    /// Whether a deleted gateway is gone.
    ///
    /// # Errors
    /// The cloud's.
    fn gateway_gone(&self, id: &str) -> Result<bool>;

    /// The ports that still carry VLAN `vlan`.
    ///
    /// # Errors
    /// The cloud's.
    fn vlan_ports(&self, t: &Target<'_>, vlan: &str) -> Result<Vec<String>>;

    /// Takes VLAN `vlan` off `port` (a port gone meanwhile counts as done).
    ///
    /// # Errors
    /// The cloud's.
    fn unassign_port(&self, t: &Target<'_>, port: &str, vlan: &str) -> Result<()>;
}
