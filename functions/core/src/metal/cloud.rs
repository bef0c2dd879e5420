//! Equinix Metal as a [`Cloud`]: the trait's calls on [`Metal`]'s, and
//! Metal's objects as the seam's views. A VLAN is a [`Segment`], a port a
//! [`Nic`], a VLAN batch an [`Operation`], a device's IP assignment an
//! [`AssignedAddress`]. Metal has every capability of
//! [`Capabilities`]; port modes are its [`NicModes`].
//!
//! The requests are the client's, unchanged: this module only maps.

use serde_json::{Map, Value};

use super::client::Metal;
use super::model::{Device, Event, IpAssignment, IpAssignmentInput, VirtualNetwork};
use super::model::{VlanBatchInput, VlanBatchItem};
use crate::cloud::{
    AssignedAddress, Capabilities, Capability, Cloud, CloudEvent, CloudResult, DeviceAddress,
    DeviceView, ModeChange, Nic, NicModes, Operation, Segment,
};
use crate::ports::http::HttpClient;
use crate::ports::Env;

/// What Metal can do: everything the seam names.
pub const CAPABILITIES: Capabilities = Capabilities::of(&[
    Capability::NicModes,
    Capability::Bonding,
    Capability::NativeSegment,
    Capability::VrfPools,
    Capability::Gateways,
    Capability::BatchAttach,
    Capability::ChosenAddresses,
]);

impl From<&Device> for DeviceView {
    fn from(d: &Device) -> Self {
        DeviceView {
            id: d.id.clone(),
            state: d.state.clone(),
            active: d.active(),
            gone: d.gone(),
            frozen: d.network_frozen.unwrap_or(false),
            nics: d
                .network_ports
                .iter()
                .map(|p| Nic {
                    id: p.id.clone(),
                    name: p.name.clone(),
                    bond: p.kind.as_deref() == Some("NetworkBondPort"),
                    bonded: p.data.bonded,
                    mac: p.data.mac.clone(),
                    mode: p.network_type.clone(),
                    segments: p
                        .virtual_networks
                        .iter()
                        .filter_map(|r| r.id().map(str::to_string))
                        .collect(),
                    native: p
                        .native_virtual_network
                        .as_ref()
                        .and_then(|r| r.id().map(str::to_string)),
                })
                .collect(),
            addresses: d
                .ip_addresses
                .iter()
                .map(|a| DeviceAddress {
                    address: a.address.clone(),
                    cidr: a.cidr,
                    gateway: a.gateway.clone(),
                    public: a.public,
                    management: a.management,
                })
                .collect(),
        }
    }
}

impl From<Device> for DeviceView {
    fn from(d: Device) -> Self {
        DeviceView::from(&d)
    }
}

impl From<VirtualNetwork> for Segment {
    fn from(v: VirtualNetwork) -> Self {
        Segment {
            location: v.metro(),
            id: v.id,
            vlan: v.vxlan,
        }
    }
}

impl From<IpAssignment> for AssignedAddress {
    fn from(a: IpAssignment) -> Self {
        AssignedAddress {
            id: a.id,
            address: a.address,
        }
    }
}

impl From<Event> for CloudEvent {
    fn from(e: Event) -> Self {
        CloudEvent {
            devices: e.devices().into_iter().map(str::to_string).collect(),
            id: e.id,
        }
    }
}

impl<H: HttpClient + ?Sized, E: Env + ?Sized> NicModes for Metal<'_, H, E> {
    fn change_mode(&self, nic: &str, change: ModeChange) -> CloudResult<()> {
        self.port_mode(nic, change)
    }

    fn set_native(&self, nic: &str, segment: &str) -> CloudResult<()> {
        self.set_native_vlan(nic, segment)
    }

    fn remove_native(&self, nic: &str) -> CloudResult<()> {
        self.remove_native_vlan(nic)
    }
}

impl<H: HttpClient + ?Sized, E: Env + ?Sized> Cloud for Metal<'_, H, E> {
    /// Metal's reasons (`MetalNotFound`, `MetalForbidden`, …).
    fn error(&self, e: crate::cloud::CloudError) -> crate::error::Error {
        e.into()
    }

    fn name(&self) -> &'static str {
        "Metal"
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn device(&self, id: &str) -> CloudResult<Option<DeviceView>> {
        Ok(self.get_device(id)?.map(DeviceView::from))
    }

    fn device_within(&self, id: &str, budget_ms: u64) -> CloudResult<Option<DeviceView>> {
        let mut cfg = self.config().clone();
        cfg.retry.budget_ms = budget_ms.min(cfg.retry.budget_ms);
        let reader = self.with_config(&cfg);
        Ok(reader.get_device(id)?.map(DeviceView::from))
    }

    fn device_nics(&self, id: &str) -> CloudResult<Option<DeviceView>> {
        Ok(self.device_ports(id)?.map(DeviceView::from))
    }

    fn segment(&self, id: &str) -> CloudResult<Option<Segment>> {
        Ok(self.get_vlan(id)?.map(Segment::from))
    }

    fn segments(&self, location: &str) -> CloudResult<Vec<Segment>> {
        Ok(self
            .list_vlans(location)?
            .into_iter()
            .map(Segment::from)
            .collect())
    }

    fn change_segments(
        &self,
        nic: &str,
        attach: bool,
        segments: &[String],
    ) -> CloudResult<Operation> {
        let state = if attach { "assigned" } else { "unassigned" };
        let input = VlanBatchInput {
            vlan_assignments: segments
                .iter()
                .map(|v| VlanBatchItem {
                    vlan: v.clone(),
                    state,
                })
                .collect(),
        };
        self.create_vlan_batch(nic, &input)
    }

    fn operation(&self, nic: &str, id: &str) -> CloudResult<Option<Operation>> {
        self.get_vlan_batch(nic, id)
    }

    fn unfinished_operation(&self, nic: &str) -> CloudResult<Option<Operation>> {
        Ok(self
            .list_vlan_batches(nic)?
            .into_iter()
            .find(|b| !b.finished()))
    }

    fn addresses(&self, device: &str) -> CloudResult<Vec<AssignedAddress>> {
        Ok(self
            .device_ips(device)?
            .into_iter()
            .map(AssignedAddress::from)
            .collect())
    }

    fn assign_address(
        &self,
        device: &str,
        address: &str,
        labels: Map<String, Value>,
    ) -> CloudResult<AssignedAddress> {
        let input = IpAssignmentInput {
            address: address.to_string(),
            customdata: Some(labels),
        };
        self.assign_ip(device, &input).map(AssignedAddress::from)
    }

    fn unassign_address(&self, id: &str) -> CloudResult<bool> {
        self.delete_ip(id)
    }

    fn events_after(
        &self,
        after: Option<&str>,
        pages: u32,
    ) -> CloudResult<(Vec<CloudEvent>, bool)> {
        let (events, found) = self.project_events_after(after, pages)?;
        Ok((events.into_iter().map(CloudEvent::from).collect(), found))
    }

    fn nic_modes(&self) -> Option<&dyn NicModes> {
        Some(self)
    }
}
