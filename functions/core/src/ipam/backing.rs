//! What backs a pool in a cloud: `spec.metal` (an Equinix Metal VRF, block,
//! VLAN and gateway, [`super::vrf`]) or `spec.phoenixnap` (a phoenixNAP
//! network and, for a public one, its IP block, [`super::pnap`]).
//! [`Backing`] is the one view the provisioning plan and the pool's
//! validation read: which resources the pool holds and in which order they
//! are created and torn down, what was decided for each, and where the
//! pool's block and gateway come from.
//!
//! The resources are roles ([`Resource`]): a routing domain (Metal's VRF),
//! an address block (Metal's reservation, phoenixNAP's IP block), a
//! layer-2 segment (Metal's VLAN, phoenixNAP's network) and a gateway
//! (Metal's). A backing holds the roles its cloud has.

use std::net::IpAddr;

use serde_json::Value;

use super::pnap::PnapSpec;
use super::vrf::{DeletionPolicy, MetalSpec, Resource};
use crate::cloud::CloudKind;
use crate::error::Result;

/// A pool's backing, borrowed from its spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing<'a> {
    /// `spec.metal`.
    Metal(&'a MetalSpec),
    /// `spec.phoenixnap`.
    Pnap(&'a PnapSpec),
}

/// A pool's backing, owned (a copy of the spec's section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackingSpec {
    /// `spec.metal`.
    Metal(MetalSpec),
    /// `spec.phoenixnap`.
    Pnap(PnapSpec),
}

impl BackingSpec {
    /// The borrowed view.
    pub fn as_backing(&self) -> Backing<'_> {
        match self {
            BackingSpec::Metal(m) => Backing::Metal(m),
            BackingSpec::Pnap(p) => Backing::Pnap(p),
        }
    }
}

impl<'a> From<&'a BackingSpec> for Backing<'a> {
    fn from(s: &'a BackingSpec) -> Self {
        s.as_backing()
    }
}

impl<'a> From<&'a MetalSpec> for Backing<'a> {
    fn from(s: &'a MetalSpec) -> Self {
        Backing::Metal(s)
    }
}

impl<'a> From<&'a PnapSpec> for Backing<'a> {
    fn from(s: &'a PnapSpec) -> Self {
        Backing::Pnap(s)
    }
}

/// Metal's teardown order: the gateway (gone before its reservation can be
/// deleted), the reservation, the VLAN (once no port uses it), the VRF.
const METAL_TEARDOWN: [Resource; 4] = [
    Resource::Gateway,
    Resource::Reservation,
    Resource::Vlan,
    Resource::Vrf,
];

impl<'a> Backing<'a> {
    /// An owned copy.
    pub fn to_owned_spec(self) -> BackingSpec {
        match self {
            Backing::Metal(m) => BackingSpec::Metal(m.clone()),
            Backing::Pnap(p) => BackingSpec::Pnap(p.clone()),
        }
    }

    /// The spec's path (`spec.metal`, `spec.phoenixnap`).
    pub fn path(self) -> &'static str {
        match self {
            Backing::Metal(_) => "spec.metal",
            Backing::Pnap(_) => "spec.phoenixnap",
        }
    }

    /// The cloud.
    pub fn kind(self) -> CloudKind {
        match self {
            Backing::Metal(_) => CloudKind::Metal,
            Backing::Pnap(_) => CloudKind::Phoenixnap,
        }
    }

    /// The cloud's name, for messages.
    pub fn cloud(self) -> &'static str {
        match self {
            Backing::Metal(_) => "Metal",
            Backing::Pnap(_) => "phoenixNAP",
        }
    }

    /// Metal's spec, if that is the backing.
    pub fn metal(self) -> Option<&'a MetalSpec> {
        match self {
            Backing::Metal(m) => Some(m),
            Backing::Pnap(_) => None,
        }
    }

    /// phoenixNAP's spec, if that is the backing.
    pub fn pnap(self) -> Option<&'a PnapSpec> {
        match self {
            Backing::Pnap(p) => Some(p),
            Backing::Metal(_) => None,
        }
    }

    /// The resources held, in creation order.
    ///
    /// ```
    /// use metal_ipam_core::ipam::backing::Backing;
    /// use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
    /// assert_eq!(Backing::from(&MetalSpec::default()).chain(), &Resource::ALL);
    /// ```
    pub fn chain(self) -> &'static [Resource] {
        match self {
            Backing::Metal(_) => &Resource::ALL,
            Backing::Pnap(p) => p.chain(),
        }
    }

    /// The order resources are torn down in.
    pub fn teardown_order(self) -> &'static [Resource] {
        match self {
            Backing::Metal(_) => &METAL_TEARDOWN,
            Backing::Pnap(p) => p.teardown_order(),
        }
    }

    /// What `r` is made on: the cloud refuses to delete a resource while one
    /// made on it exists (Metal: a reservation in a VRF, a gateway on a
    /// reservation and a VLAN; phoenixNAP: nothing, a network's deletion
    /// frees its blocks and a block is detached before deletion).
    pub fn made_on(self, r: Resource) -> &'static [Resource] {
        match (self, r) {
            (Backing::Pnap(_), _) | (_, Resource::Vrf | Resource::Vlan) => &[],
            (_, Resource::Reservation) => &[Resource::Vrf],
            (_, Resource::Gateway) => &[Resource::Reservation, Resource::Vlan],
        }
    }

    /// Whether the pool ends with a gateway whose state is awaited.
    pub fn awaits_gateway(self) -> bool {
        self.chain().contains(&Resource::Gateway)
    }

    /// Whether the cloud puts a gateway at the block's first usable
    /// address (Metal; a phoenixNAP public block), which the pool then does
    /// not hand out. A phoenixNAP private network has none.
    pub fn gateway_in_block(self) -> bool {
        match self {
            Backing::Metal(_) => true,
            Backing::Pnap(p) => p.kind() == super::pnap::NetworkKind::Public,
        }
    }

    /// The field of `r` under the spec (`vrf`, `privateNetwork`, …).
    pub fn field(self, r: Resource) -> &'static str {
        match self {
            Backing::Metal(_) => r.field(),
            Backing::Pnap(p) => p.field(r),
        }
    }

    /// The full path of `r`'s section (`spec.metal.vrf`).
    pub fn field_path(self, r: Resource) -> String {
        format!("{}.{}", self.path(), self.field(r))
    }

    /// Whether `r` is adopted.
    pub fn adopted(self, r: Resource) -> bool {
        match self {
            Backing::Metal(m) => m.adopted(r),
            Backing::Pnap(p) => p.adopted(r),
        }
    }

    /// What happens to `r` when the pool goes.
    pub fn deletion(self, r: Resource) -> DeletionPolicy {
        match self {
            Backing::Metal(m) => m.deletion(r),
            Backing::Pnap(p) => p.deletion(r),
        }
    }

    /// The `deletionPolicy` the spec sets for `r`, if any.
    pub fn explicit_deletion(self, r: Resource) -> Option<DeletionPolicy> {
        match self {
            Backing::Metal(m) => m.explicit_deletion(r),
            Backing::Pnap(p) => p.explicit_deletion(r),
        }
    }

    /// What `r`'s creation or adoption is decided from.
    pub fn section(self, r: Resource) -> Value {
        match self {
            Backing::Metal(m) => m.section(r),
            Backing::Pnap(p) => p.section(r),
        }
    }

    /// The first field that differs from what `r` was decided from.
    pub fn changed_field(self, r: Resource, recorded: &Value) -> Option<String> {
        match self {
            Backing::Metal(m) => m.changed_field(r, recorded),
            Backing::Pnap(p) => p.changed_field(r, recorded),
        }
    }

    /// The block when it is known from the spec alone.
    pub fn block(self) -> Option<(IpAddr, u8)> {
        match self {
            Backing::Metal(m) => m.block(),
            Backing::Pnap(p) => p.block(),
        }
    }

    /// Checks the section's rules.
    ///
    /// # Errors
    /// 422 naming the first offending field.
    pub fn validate(self) -> Result<()> {
        match self {
            Backing::Metal(m) => m.validate(),
            Backing::Pnap(p) => p.validate(),
        }
    }

    /// The section as JSON.
    pub fn to_json(self) -> Value {
        match self {
            Backing::Metal(m) => m.to_json(),
            Backing::Pnap(p) => p.to_json(),
        }
    }
}
