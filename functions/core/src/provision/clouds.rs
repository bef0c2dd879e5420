//! The clouds a component can call ([`Clouds`]), and which one serves what:
//! a pool's resources by its backing (`spec.metal` or `spec.phoenixnap`), a
//! claim's assignment by its pool's (then by the cloud its record names), a
//! device by the cloud its provider ID names. A component built without a
//! cloud's credentials answers 500 naming the variables to set when that
//! cloud is asked for.

use std::net::IpAddr;

use super::plan::Progress;
use super::target::Target;
use super::vrf_cloud::{CreateError, VrfCloud};
use crate::cloud::{Cloud, CloudKind};
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::vrf::Resource;

/// A bare-metal cloud as the pool and claim steps use it: the seam
/// ([`Cloud`]) and the pool resources ([`VrfCloud`]).
pub trait BareMetal: Cloud + VrfCloud {}

impl<T: Cloud + VrfCloud + ?Sized> BareMetal for T {}

/// The clouds a component has credentials for.
#[derive(Clone, Copy, Default)]
pub struct Clouds<'a> {
    /// Equinix Metal (`metal_token` and `metal_project_id` set).
    pub metal: Option<&'a dyn BareMetal>,
    /// phoenixNAP (`pnap_client_id` and `pnap_client_secret` set).
    pub pnap: Option<&'a dyn BareMetal>,
}

impl std::fmt::Debug for Clouds<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clouds")
            .field("metal", &self.metal.is_some())
            .field("pnap", &self.pnap.is_some())
            .finish()
    }
}

/// The error of a cloud the component has no credentials for.
///
/// ```
/// use metal_ipam_core::cloud::CloudKind;
/// use metal_ipam_core::provision::clouds::not_configured;
/// assert_eq!(not_configured(CloudKind::Phoenixnap).reason(), "PnapNotConfigured");
/// ```
pub fn not_configured(kind: CloudKind) -> Error {
    match kind {
        CloudKind::Metal => Error::new(
            ErrorKind::Internal,
            "MetalNotConfigured",
            "Equinix Metal is not configured (variables metal_token and metal_project_id)",
        ),
        CloudKind::Phoenixnap => Error::new(
            ErrorKind::Internal,
            "PnapNotConfigured",
            "phoenixNAP is not configured (variables pnap_client_id and pnap_client_secret)",
        ),
    }
}

impl<'a> Clouds<'a> {
    /// Only Metal.
    pub fn metal(metal: &'a dyn BareMetal) -> Clouds<'a> {
        Clouds {
            metal: Some(metal),
            pnap: None,
        }
    }

    /// Whether no cloud is configured.
    pub fn is_empty(&self) -> bool {
        self.metal.is_none() && self.pnap.is_none()
    }

    /// The cloud `kind`.
    ///
    /// # Errors
    /// 500 `MetalNotConfigured` / `PnapNotConfigured` ([`not_configured`]).
    pub fn get(&self, kind: CloudKind) -> Result<&'a dyn BareMetal> {
        match kind {
            CloudKind::Metal => self.metal,
            CloudKind::Phoenixnap => self.pnap,
        }
        .ok_or_else(|| not_configured(kind))
    }

    /// The configured clouds, Metal first.
    pub fn configured(&self) -> Vec<(CloudKind, &'a dyn BareMetal)> {
        [
            (CloudKind::Metal, self.metal),
            (CloudKind::Phoenixnap, self.pnap),
        ]
        .into_iter()
        .filter_map(|(k, c)| c.map(|c| (k, c)))
        .collect()
    }

    /// The cloud of `t`'s backing.
    fn of(&self, t: &Target<'_>) -> Result<&'a dyn BareMetal> {
        self.get(t.spec.kind())
    }
}

/// A pool's resources, in the cloud of its backing.
impl VrfCloud for Clouds<'_> {
    fn adopt(&self, t: &Target<'_>, progress: &Progress, r: Resource) -> Result<String> {
        self.of(t)?.adopt(t, progress, r)
    }

    fn create(
        &self,
        t: &Target<'_>,
        progress: &Progress,
        r: Resource,
    ) -> std::result::Result<String, CreateError> {
        let cloud = self.of(t).map_err(|error| CreateError {
            error,
            outcome_unknown: false,
        })?;
        cloud.create(t, progress, r)
    }

    fn find_created(
        &self,
        t: &Target<'_>,
        progress: &Progress,
        r: Resource,
    ) -> Result<Option<String>> {
        self.of(t)?.find_created(t, progress, r)
    }

    fn delete(&self, t: &Target<'_>, r: Resource, id: &str) -> Result<bool> {
        self.of(t)?.delete(t, r, id)
    }

    fn block(&self, t: &Target<'_>, progress: &Progress) -> Result<(IpAddr, u8)> {
        self.of(t)?.block(t, progress)
    }

    /// Gateways are Metal's.
    fn gateway_state(&self, id: &str) -> Result<Option<String>> {
        self.get(CloudKind::Metal)?.gateway_state(id)
    }

    /// Gateways are Metal's.
    fn gateway_gone(&self, id: &str) -> Result<bool> {
        self.get(CloudKind::Metal)?.gateway_gone(id)
    }

    fn vlan_ports(&self, t: &Target<'_>, vlan: &str) -> Result<Vec<String>> {
        self.of(t)?.vlan_ports(t, vlan)
    }

    fn unassign_port(&self, t: &Target<'_>, port: &str, vlan: &str) -> Result<()> {
        self.of(t)?.unassign_port(t, port, vlan)
    }
}

/// Where a claim's assignment is made: the cloud of a kind, from a set of
/// clouds ([`Clouds`]) or a single one (any [`Cloud`], which answers for
/// its own kind only).
pub trait PickCloud {
    /// The cloud of `kind`.
    ///
    /// # Errors
    /// 500 naming the variables of a cloud that is not configured
    /// ([`not_configured`]).
    fn pick(&self, kind: CloudKind) -> Result<&dyn Cloud>;
}

impl PickCloud for Clouds<'_> {
    fn pick(&self, kind: CloudKind) -> Result<&dyn Cloud> {
        let c: &dyn BareMetal = self.get(kind)?;
        Ok(c)
    }
}

impl<T: Cloud> PickCloud for T {
    fn pick(&self, kind: CloudKind) -> Result<&dyn Cloud> {
        if self.name() == kind.name() {
            Ok(self)
        } else {
            Err(not_configured(kind))
        }
    }
}

impl PickCloud for dyn Cloud + '_ {
    fn pick(&self, kind: CloudKind) -> Result<&dyn Cloud> {
        if self.name() == kind.name() {
            Ok(self)
        } else {
            Err(not_configured(kind))
        }
    }
}
