//! The phoenixNAP objects metal-ipam reads and the bodies it sends, as the
//! vendored specifications name them (`tests/fixtures/phoenixnap-openapi/`;
//! `functions/core/tests/pnap_model.rs` checks every field name against
//! them). Only the fields metal-ipam uses are modelled; answers may carry
//! more, which are ignored.
//!
//! Where the specifications are inconsistent the model is lenient:
//! `Server.privateIpAddresses` is required there but a public-only server
//! cannot have one, so it defaults to empty; an audit [`Event`] carries no
//! resource, so it is a hint that something changed at its time, not which
//! server.

use serde::{Deserialize, Serialize};

/// A private network (`networkapi`: `PrivateNetwork`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateNetwork {
    /// Its identifier.
    pub id: String,
    /// Its friendly name (unique per account).
    pub name: String,
    /// Its description (metal-ipam's marker of a network it created).
    #[serde(default)]
    pub description: Option<String>,
    /// The VLAN.
    pub vlan_id: u16,
    /// The location, e.g. `PHX`.
    pub location: String,
    /// The network's range, e.g. `10.0.0.0/24` (absent on a network
    /// created without one).
    #[serde(default)]
    pub cidr: Option<String>,
    /// `BUSY`, `READY`, `DELETING`, ….
    pub status: String,
    /// The servers and their IPs on it.
    #[serde(default)]
    pub memberships: Vec<NetworkMembership>,
    /// When it was created (RFC 3339; required by the specification, read
    /// leniently): the oldest of duplicates is kept.
    #[serde(default)]
    pub created_on: Option<String>,
}

/// Creating a private network (`PrivateNetworkCreate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateNetworkCreate {
    /// The friendly name (unique): what a lost answer is looked up by.
    pub name: String,
    /// A description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The location.
    pub location: String,
    /// The VLAN, if chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<u16>,
    /// The range, e.g. `10.0.0.0/24`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
}

/// A resource on a network with its IPs (`NetworkMembership`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkMembership {
    /// The member's identifier (a server's id).
    pub resource_id: String,
    /// `server`, ….
    pub resource_type: String,
    /// Its IPs on the network.
    #[serde(default)]
    pub ips: Vec<String>,
}

/// A public network (`PublicNetwork`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicNetwork {
    /// Its identifier.
    pub id: String,
    /// Its friendly name (unique per account).
    pub name: String,
    /// Its description (metal-ipam's marker of a network it created).
    #[serde(default)]
    pub description: Option<String>,
    /// The VLAN.
    pub vlan_id: u16,
    /// The location.
    pub location: String,
    /// `BUSY`, `READY`, ….
    pub status: String,
    /// The IP blocks attached to it.
    #[serde(default)]
    pub ip_blocks: Vec<PublicNetworkIpBlock>,
    /// The servers and their IPs on it.
    #[serde(default)]
    pub memberships: Vec<NetworkMembership>,
    /// When it was created (RFC 3339; required by the specification, read
    /// leniently).
    #[serde(default)]
    pub created_on: Option<String>,
}

/// Creating a public network (`PublicNetworkCreate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicNetworkCreate {
    /// The friendly name (unique).
    pub name: String,
    /// A description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The location.
    pub location: String,
    /// The VLAN, if chosen (2–4094).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<u16>,
    /// Blocks to attach at creation.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<PublicNetworkIpBlockCreate>,
}

/// An IP block on a public network (`PublicNetworkIpBlock`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicNetworkIpBlock {
    /// The block's identifier.
    pub id: String,
    /// Its CIDR.
    pub cidr: String,
}

/// Attaching an IP block to a public network
/// (`PublicNetworkIpBlockCreate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublicNetworkIpBlockCreate {
    /// The block's identifier.
    pub id: String,
}

/// An IP block (`ipapi`: `IpBlock`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpBlock {
    /// Its identifier.
    pub id: String,
    /// The location.
    pub location: String,
    /// The size, e.g. `/29`.
    pub cidr_block_size: String,
    /// Its CIDR.
    pub cidr: String,
    /// `creating`, `assigning`, `error assigning`, `assigned`,
    /// `unassigning`, `error unassigning`, `unassigned`.
    pub status: String,
    /// What it is assigned to (a public network's or server's id).
    #[serde(default)]
    pub assigned_resource_id: Option<String>,
    /// The kind of resource it is assigned to (`server` for a block on a
    /// server; anything else is taken for a public network).
    #[serde(default)]
    pub assigned_resource_type: Option<String>,
    /// The description (metal-ipam's marker of a block it ordered).
    #[serde(default)]
    pub description: Option<String>,
    /// When it was ordered (RFC 3339).
    #[serde(default)]
    pub created_on: Option<String>,
}

/// Ordering an IP block (`IpBlockCreate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IpBlockCreate {
    /// The location.
    pub location: String,
    /// The size, e.g. `/29`.
    pub cidr_block_size: String,
    /// What a lost answer is looked up by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A server (`bmcapi`: `Server`), the fields metal-ipam reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Server {
    /// Its identifier.
    pub id: String,
    /// `creating`, `powered-on`, `powered-off`, `rebooting`, `resetting`,
    /// `deleting`, ….
    pub status: String,
    /// Its hostname.
    pub hostname: String,
    /// The location.
    pub location: String,
    /// Private IPs (required by the specification, absent in practice on
    /// a public-only server).
    #[serde(default)]
    pub private_ip_addresses: Vec<String>,
    /// Public IPs.
    #[serde(default)]
    pub public_ip_addresses: Vec<String>,
    /// Its networks.
    #[serde(default)]
    pub network_configuration: NetworkConfiguration,
}

/// A server's networks (`NetworkConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfiguration {
    /// The default gateway.
    #[serde(default)]
    pub gateway_address: Option<String>,
    /// Its private networks.
    #[serde(default)]
    pub private_network_configuration: Option<PrivateNetworkConfiguration>,
    /// Its public networks.
    #[serde(default)]
    pub public_network_configuration: Option<PublicNetworkConfiguration>,
}

/// A server's private networks (`PrivateNetworkConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateNetworkConfiguration {
    /// `USE_OR_CREATE_DEFAULT`, `USER_DEFINED`, `NONE`.
    #[serde(default)]
    pub configuration_type: Option<String>,
    /// The memberships.
    #[serde(default)]
    pub private_networks: Vec<ServerPrivateNetwork>,
}

/// A server's public networks (`PublicNetworkConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicNetworkConfiguration {
    /// The memberships.
    #[serde(default)]
    pub public_networks: Vec<ServerPublicNetwork>,
}

/// A server's membership of a private network (`ServerPrivateNetwork`),
/// read and sent: joining sends `id` and `ips` (and `dhcp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerPrivateNetwork {
    /// The network's identifier.
    pub id: String,
    /// The server's IPs on it (chosen inside the network's range). Read
    /// back, an entry may be a range (`10.0.0.11 - 10.0.0.15`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// Whether the IPs come from DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp: Option<bool>,
    /// `in-progress`, `assigned`, `error` (read only).
    #[serde(default, skip_serializing)]
    pub status_description: Option<String>,
}

/// A server's membership of a public network (`ServerPublicNetwork`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerPublicNetwork {
    /// The network's identifier.
    pub id: String,
    /// The server's IPs on it (from the network's blocks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// `in-progress`, `assigned`, `error` (read only).
    #[serde(default, skip_serializing)]
    pub status_description: Option<String>,
}

/// New IPs of a server on a network it is a member of
/// (`ServerNetworkUpdate`; without `force`, never empty: leave the network
/// instead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerNetworkUpdate {
    /// Every IP the server keeps on the network.
    pub ips: Vec<String>,
}

/// An error answer (`Error`, the same in every API).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// What went wrong.
    pub message: String,
    /// Per-field problems.
    #[serde(default)]
    pub validation_errors: Vec<String>,
}

impl ErrorBody {
    /// The message and the validation errors, as [`crate::cloud::CloudError`]
    /// carries them.
    pub fn messages(self) -> Vec<String> {
        std::iter::once(self.message)
            .chain(self.validation_errors)
            .collect()
    }
}

/// An audit log entry (`auditapi`: `Event`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// What happened, e.g. `API.CreateServer` (optional in the
    /// specification).
    #[serde(default)]
    pub name: Option<String>,
    /// When (RFC 3339).
    pub timestamp: String,
}
