//! Typed requests and responses of the Equinix Metal API calls metal-ipam
//! makes, field names as in the last published spec (`metalv1`,
//! equinix-sdk-go @06c3ecf5).
//!
//! Responses read leniently: every field is optional or defaulted and
//! unknown fields are ignored, because the API adds fields and omits nested
//! objects it was not asked to `include` (those come back as `{"href"}`).
//! Requests carry exactly the fields the spec defines and skip absent ones.
//!
//! Unlike the Kubernetes views (`kube::object`), these derive `serde`: the
//! Metal components parse some twenty types, where the derive's fixed cost
//! is paid once and hand-written readers would be the larger code.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A link to another resource (`{"href": …}`), the form a nested object
/// takes when it was not included.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Href {
    /// The resource's path, e.g. `/metal/v1/vrfs/<uuid>`.
    #[serde(default)]
    pub href: String,
}

impl Href {
    /// The last path segment: the id of the linked resource.
    ///
    /// ```
    /// use metal_ipam_core::metal::model::Href;
    /// let h = Href { href: "/metal/v1/virtual-networks/0b1e".into() };
    /// assert_eq!(h.id(), "0b1e");
    /// ```
    pub fn id(&self) -> &str {
        self.href.rsplit('/').next().unwrap_or_default()
    }
}

/// A nested resource: its `id` (when included or when the API sends it
/// anyway) and its `href`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    /// `id`, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `href`, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
}

impl Ref {
    /// The id, from `id` or else from the last segment of `href`.
    ///
    /// ```
    /// use metal_ipam_core::metal::model::Ref;
    /// let r: Ref = serde_json::from_str(r#"{"href": "/metal/v1/vrfs/v-1"}"#).unwrap();
    /// assert_eq!(r.id(), Some("v-1"));
    /// ```
    pub fn id(&self) -> Option<&str> {
        self.id
            .as_deref()
            .or_else(|| self.href.as_deref()?.rsplit('/').next())
            .filter(|s| !s.is_empty())
    }
}

/// Pagination of a list response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Meta {
    /// The page this response is.
    pub current_page: Option<u32>,
    /// The last page.
    pub last_page: Option<u32>,
    /// Items over all pages.
    pub total: Option<u64>,
}

impl Meta {
    /// Whether another page follows (`last_page > current_page`).
    pub fn has_next(&self) -> bool {
        matches!((self.current_page, self.last_page), (Some(c), Some(l)) if l > c)
    }
}

/// An error body: one of `error` and `errors` is set. The body is not
/// guaranteed (an intermediary may answer without it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ErrorBody {
    /// A single message.
    pub error: Option<String>,
    /// Several messages.
    pub errors: Vec<String>,
}

impl ErrorBody {
    /// Every message, `error` first.
    pub fn messages(&self) -> Vec<String> {
        self.error.iter().chain(&self.errors).cloned().collect()
    }
}

/// A metro, as embedded in resources.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Metro {
    /// UUID.
    pub id: Option<String>,
    /// Code, e.g. `da` (lower case in answers).
    pub code: Option<String>,
}

/// A VRF.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Vrf {
    /// UUID.
    pub id: String,
    /// Name.
    pub name: String,
    /// Description.
    pub description: Option<String>,
    /// Local ASN.
    pub local_asn: Option<u64>,
    /// The CIDRs reservations may be made in.
    pub ip_ranges: Vec<String>,
    /// Metro.
    pub metro: Option<Metro>,
    /// Tags.
    pub tags: Vec<String>,
}

/// `POST /projects/{id}/vrfs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VrfCreateInput {
    /// Name (required).
    pub name: String,
    /// Metro code or UUID (required; codes are sent lower-cased).
    pub metro: String,
    /// Description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// IPv4 /8–/29 and IPv6 /59–/64 ranges.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_ranges: Vec<String>,
    /// Local ASN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_asn: Option<u64>,
    /// Tags.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// A `vrf` IP reservation: a block inside one of its VRF's `ip_ranges`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct VrfIpReservation {
    /// UUID.
    pub id: String,
    /// First address of the block.
    pub network: Option<String>,
    /// Prefix length.
    pub cidr: Option<u8>,
    /// 4 or 6.
    pub address_family: Option<u8>,
    /// Gateway address (the first usable one).
    pub gateway: Option<String>,
    /// `pending`, `created`, `denied`.
    pub state: Option<String>,
    /// The VRF (an object or a link).
    pub vrf: Ref,
    /// The Metal Gateway using this block, when there is one.
    pub metal_gateway: Option<MetalGatewayLite>,
    /// Free text.
    pub details: Option<String>,
    /// Arbitrary JSON metadata.
    pub customdata: Option<Map<String, Value>>,
    /// Tags.
    pub tags: Vec<String>,
}

/// Any other IP reservation (`public_ipv4`, `private_ipv4`, `global_ipv4`,
/// `public_ipv6`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct IpReservation {
    /// UUID.
    pub id: String,
    /// The reservation type.
    #[serde(rename = "type")]
    pub kind: String,
    /// First address of the block.
    pub network: Option<String>,
    /// Prefix length.
    pub cidr: Option<u8>,
    /// `pending`, `created`, `denied`.
    pub state: Option<String>,
    /// Tags.
    pub tags: Vec<String>,
}

/// An address assigned to a device (`POST /devices/{id}/ips`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct IpAssignment {
    /// UUID (what `DELETE /ips/{id}` takes to unassign).
    pub id: String,
    /// The address.
    pub address: Option<String>,
    /// Prefix length.
    pub cidr: Option<u8>,
    /// The device it is assigned to.
    pub assigned_to: Option<Href>,
    /// The reservation it comes from.
    pub parent_block: Option<ParentBlock>,
    /// Whether it is a management address.
    pub management: Option<bool>,
}

/// The block an assignment comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ParentBlock {
    /// Network address.
    pub network: Option<String>,
    /// Prefix length.
    pub cidr: Option<u8>,
    /// Link to the reservation.
    pub href: Option<String>,
}

/// What `GET|PATCH /ips/{id}` and `GET /projects/{id}/ips` answer: a
/// `oneOf` the spec does not discriminate, told apart here by `type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpAddress {
    /// `type: vrf`.
    Vrf(VrfIpReservation),
    /// `type: public_ipv4 | private_ipv4 | global_ipv4 | public_ipv6`.
    Reservation(IpReservation),
    /// `type: IPAssignment`, or no type and an `assigned_to`.
    Assignment(IpAssignment),
}

impl<'de> Deserialize<'de> for IpAddress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let v = Value::deserialize(d)?;
        let kind = v.get("type").and_then(Value::as_str);
        let parsed = match kind {
            Some("vrf") => VrfIpReservation::deserialize(&v).map(IpAddress::Vrf),
            Some("IPAssignment") => IpAssignment::deserialize(&v).map(IpAddress::Assignment),
            None if v.get("assigned_to").is_some() => {
                IpAssignment::deserialize(&v).map(IpAddress::Assignment)
            }
            Some(_) => IpReservation::deserialize(&v).map(IpAddress::Reservation),
            None => return Err(D::Error::custom("an IP address without a type")),
        };
        parsed.map_err(D::Error::custom)
    }
}

/// `POST /projects/{id}/ips` for a VRF block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VrfIpReservationCreateInput {
    /// Always `vrf`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The VRF.
    pub vrf_id: String,
    /// First address of the block.
    pub network: String,
    /// Prefix length (IPv4 22–29, IPv6 64).
    pub cidr: u8,
    /// Free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
    /// Metadata mapping the block to its CAPI objects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customdata: Option<Map<String, Value>>,
    /// Tags.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// `POST /devices/{id}/ips`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IpAssignmentInput {
    /// The address in CIDR form, from one of the project's reservations.
    pub address: String,
    /// Metadata mapping the assignment to its claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customdata: Option<Map<String, Value>>,
}

/// A VLAN.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct VirtualNetwork {
    /// UUID.
    pub id: String,
    /// The VLAN number (unique per project and metro only).
    pub vxlan: Option<u16>,
    /// Metro code, lower case.
    pub metro_code: Option<String>,
    /// Metro.
    pub metro: Option<Metro>,
    /// Description.
    pub description: Option<String>,
    /// Tags.
    pub tags: Vec<String>,
    /// Gateways on it.
    pub metal_gateways: Vec<MetalGatewayLite>,
    /// Devices with ports on it (objects with `include=instances`).
    pub instances: Vec<Device>,
}

impl VirtualNetwork {
    /// The metro code, from `metro_code` or the embedded metro, lower case.
    pub fn metro(&self) -> Option<String> {
        self.metro_code
            .as_deref()
            .or_else(|| self.metro.as_ref()?.code.as_deref())
            .map(str::to_ascii_lowercase)
    }

    /// Whether this is VLAN `vxlan` of `metro` (a lower-case code): a
    /// number is unique per project and metro only, so both are checked.
    pub fn is(&self, vxlan: u16, metro: &str) -> bool {
        self.vxlan == Some(vxlan) && self.metro().as_deref() == Some(metro)
    }
}

/// `POST /projects/{id}/virtual-networks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VirtualNetworkCreateInput {
    /// Metro code (sent lower-cased).
    pub metro: String,
    /// VLAN number 2–3999; omitted: the next free one in 1000–1999.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vxlan: Option<u16>,
    /// Description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Tags.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// A Metal Gateway (either variant: the VRF one has `vrf` set).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct MetalGateway {
    /// UUID.
    pub id: String,
    /// `ready`, `active`, `deleting`.
    pub state: Option<String>,
    /// The reservation it serves.
    pub ip_reservation: Option<Ref>,
    /// The VLAN it is on.
    pub virtual_network: Option<Ref>,
    /// The VRF, on a VRF gateway.
    pub vrf: Option<Ref>,
}

/// A gateway as embedded in reservations and VLANs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct MetalGatewayLite {
    /// UUID.
    pub id: Option<String>,
    /// `ready`, `active`, `deleting`.
    pub state: Option<String>,
    /// e.g. `10.1.2.1/27`.
    pub gateway_address: Option<String>,
    /// The VLAN number.
    pub vlan: Option<u16>,
}

/// `POST /projects/{project_id}/metal-gateways` for a VRF block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VrfMetalGatewayCreateInput {
    /// The VLAN.
    pub virtual_network_id: String,
    /// The VRF reservation (in the VLAN's metro).
    pub ip_reservation_id: String,
}

/// A device (server), as far as metal-ipam reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Device {
    /// UUID.
    pub id: String,
    /// `queued`, `provisioning`, `active`, `deprovisioning`, `deleted`, ….
    pub state: Option<String>,
    /// Hostname.
    pub hostname: Option<String>,
    /// Metro.
    pub metro: Option<Metro>,
    /// Its ports (with `include=network_ports` or nested in an include).
    pub network_ports: Vec<Port>,
    /// Mode changes (bond, disbond, convert) are refused while set.
    pub network_frozen: Option<bool>,
    /// Its addresses: Metal's management (Layer3) ones and those assigned
    /// to it.
    pub ip_addresses: Vec<DeviceIp>,
}

/// An address of a device as `GET /devices/{id}` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct DeviceIp {
    /// The address.
    pub address: Option<String>,
    /// Prefix length.
    pub cidr: Option<u8>,
    /// The gateway (management addresses).
    pub gateway: Option<String>,
    /// 4 or 6.
    pub address_family: Option<u8>,
    /// Public (else private).
    pub public: Option<bool>,
    /// One of the addresses Metal gave the device at provisioning.
    pub management: Option<bool>,
}

/// A device port: its bond state, mode and VLANs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Port {
    /// UUID.
    pub id: String,
    /// `bond0`, `eth1`, ….
    pub name: Option<String>,
    /// `NetworkBondPort` or `NetworkPort`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `bonded` (and the MAC).
    pub data: PortData,
    /// On bond ports: `layer3`, `hybrid-bonded`, `hybrid`, `layer2-bonded`,
    /// `layer2-individual`.
    pub network_type: Option<String>,
    /// The VLANs assigned to it (links, or objects when included).
    pub virtual_networks: Vec<Ref>,
    /// The VLAN carried untagged, if any.
    pub native_virtual_network: Option<Ref>,
}

/// `Port.data`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PortData {
    /// In its bond (for a bond port: bonded at all).
    pub bonded: Option<bool>,
    /// MAC address.
    pub mac: Option<String>,
}

/// A VLAN assignment batch (`POST /ports/{id}/vlan-assignments/batches`):
/// asynchronous, `queued` → `in_progress` → `completed` | `failed`. The
/// cloud-neutral [`crate::cloud::Operation`], whose shape is Metal's.
pub type VlanBatch = crate::cloud::Operation;

/// One change of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VlanBatchItem {
    /// The VLAN (UUID or vxlan).
    pub vlan: String,
    /// `assigned` or `unassigned`.
    pub state: &'static str,
}

/// `POST /ports/{id}/vlan-assignments/batches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VlanBatchInput {
    /// The changes (never empty).
    pub vlan_assignments: Vec<VlanBatchItem>,
}

/// `POST /ports/{id}/unassign` (and `assign`): the VLAN by UUID or vxlan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PortAssignInput {
    /// The VLAN's UUID (or vxlan).
    pub vnid: String,
}

impl Device {
    /// Whether the device is `active` (addresses can be assigned to it).
    pub fn active(&self) -> bool {
        self.state.as_deref() == Some("active")
    }

    /// Whether the device is gone or going (`deprovisioning`, `deleted`).
    pub fn gone(&self) -> bool {
        matches!(self.state.as_deref(), Some("deprovisioning" | "deleted"))
    }
}

/// An event (devices, projects): polled, since Metal has no webhooks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Event {
    /// UUID.
    pub id: String,
    /// e.g. `instance.deleted`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Message.
    pub body: Option<String>,
    /// RFC 3339 time.
    pub created_at: Option<String>,
    /// The resources it concerns.
    pub relationships: Vec<Href>,
}

impl Event {
    /// The ids of the devices it concerns (its `relationships` that are
    /// `…/devices/<id>`). Event types are not part of the spec, so a poller
    /// reads the device rather than trusting the type.
    ///
    /// ```
    /// use metal_ipam_core::metal::model::{Event, Href};
    /// let e = Event { relationships: vec![
    ///     Href { href: "/metal/v1/devices/d-1".into() },
    ///     Href { href: "/metal/v1/projects/p-1".into() }], ..Default::default() };
    /// assert_eq!(e.devices(), vec!["d-1"]);
    /// ```
    pub fn devices(&self) -> Vec<&str> {
        self.relationships
            .iter()
            .filter_map(|h| {
                let mut it = h.href.rsplit('/');
                let id = it.next()?;
                (it.next() == Some("devices") && !id.is_empty()).then_some(id)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ip_addresses_are_told_apart_by_type() {
        let vrf: IpAddress = serde_json::from_value(json!({
            "id": "r1", "type": "vrf", "network": "10.0.0.0", "cidr": 29,
            "vrf": {"href": "/metal/v1/vrfs/v1"}, "metal_gateway": {"id": "g1", "state": "active"}
        }))
        .unwrap();
        let IpAddress::Vrf(r) = vrf else {
            panic!("not a VRF reservation: {vrf:?}")
        };
        assert_eq!((r.vrf.id(), r.cidr), (Some("v1"), Some(29)));
        assert_eq!(r.metal_gateway.unwrap().state.as_deref(), Some("active"));

        let public: IpAddress =
            serde_json::from_value(json!({"id": "r2", "type": "public_ipv4", "cidr": 31})).unwrap();
        assert!(matches!(public, IpAddress::Reservation(ref r) if r.kind == "public_ipv4"));

        let assigned: IpAddress = serde_json::from_value(
            json!({"id": "a1", "type": "IPAssignment", "address": "10.0.0.5", "assigned_to": {"href": "/metal/v1/devices/d1"}}),
        )
        .unwrap();
        assert!(
            matches!(assigned, IpAddress::Assignment(ref a) if a.assigned_to.as_ref().unwrap().id() == "d1")
        );
        let untyped: IpAddress = serde_json::from_value(
            json!({"id": "a2", "address": "10.0.0.6", "assigned_to": {"href": "/metal/v1/devices/d2"}}),
        )
        .unwrap();
        assert!(matches!(untyped, IpAddress::Assignment(_)));
        assert!(serde_json::from_value::<IpAddress>(json!({"id": "x"})).is_err());
    }

    #[test]
    fn requests_carry_only_what_is_set() {
        let v = serde_json::to_value(VrfCreateInput {
            name: "n".into(),
            metro: "da".into(),
            ..VrfCreateInput::default()
        })
        .unwrap();
        assert_eq!(v, json!({"name": "n", "metro": "da"}));
        let v = serde_json::to_value(VrfIpReservationCreateInput {
            kind: "vrf",
            vrf_id: "v".into(),
            network: "10.0.0.0".into(),
            cidr: 29,
            tags: vec!["t".into()],
            ..VrfIpReservationCreateInput::default()
        })
        .unwrap();
        assert_eq!(
            v,
            json!({"type": "vrf", "vrf_id": "v", "network": "10.0.0.0", "cidr": 29, "tags": ["t"]})
        );
    }

    #[test]
    fn lists_and_errors_read_leniently() {
        let m: Meta = serde_json::from_value(
            json!({"current_page": 1, "last_page": 3, "next": {"href": "x"}}),
        )
        .unwrap();
        assert!(m.has_next());
        assert!(!Meta::default().has_next());
        let e: ErrorBody = serde_json::from_value(json!({"errors": ["a", "b"]})).unwrap();
        assert_eq!(e.messages(), ["a", "b"]);
        let vn: VirtualNetwork = serde_json::from_value(
            json!({"id": "n1", "vxlan": 1001, "metro": {"code": "DA"}, "unknown": true}),
        )
        .unwrap();
        assert_eq!((vn.vxlan, vn.metro().as_deref()), (Some(1001), Some("da")));
    }
}
