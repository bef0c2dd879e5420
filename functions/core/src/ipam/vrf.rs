//! VRF-backed pools: the optional `spec.metal` section of a pool, which
//! names the Equinix Metal resources behind it.
//!
//! A VRF-backed pool hands out the addresses of a Metal VRF IP reservation
//! (its block), routed through a Metal Gateway on a VLAN. Each of the four
//! resources is **adopted** (named by `id`; a VLAN also by `vxlan` in the
//! metro) or **created** (the default), and has a `deletionPolicy`:
//! `Delete` (the default for what metal-ipam creates) or `Retain` (the
//! default for what it adopts). The pool's `addresses`, `prefix` and
//! `gateway` may be left out: they are then the block, its length and the
//! block's first address, where Metal puts the gateway.
//!
//! The policies must be ones Metal can carry out: Metal refuses to delete a
//! reservation or a VLAN that a Metal Gateway still uses, and a VRF that
//! still has reservations, so a retained gateway needs a retained
//! reservation and VLAN, and a retained reservation a retained VRF
//! ([`MetalSpec::validate`] refuses the rest, naming the field).
//!
//! A resource's section (with the metro) is what its creation or adoption
//! was decided from: the provision step records it with the resource
//! ([`MetalSpec::section`]), and a later `spec.metal` that differs there
//! ([`MetalSpec::changed_field`]) cannot be applied: the webhook refuses it
//! on `UPDATE` and the step answers `Ready=False` naming the field. The
//! deletion policy is part of the section: decided once, when the resource
//! is created or adopted.
//!
//! This module checks the section and derives the block; it knows nothing
//! of the Metal API (see `crate::metal`), the store or Kubernetes.
//!
//! ```yaml
//! spec:
//!   metal:
//!     metro: da
//!     vrf: {name: cluster-a, ipRanges: [10.10.0.0/16], localASN: 65000}
//!     reservation: {network: 10.10.1.0, cidr: 24}
//!     vlan: {vxlan: 1010}        # adopt VLAN 1010 of metro da
//!     gateway: {}                # create (the default)
//! ```

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::ip::Family;

/// What happens to a Metal resource when its pool is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum DeletionPolicy {
    /// Delete it (the default for resources metal-ipam created).
    Delete,
    /// Leave it (the default for adopted resources).
    Retain,
}

impl DeletionPolicy {
    pub(crate) fn name(self) -> &'static str {
        match self {
            DeletionPolicy::Delete => "Delete",
            DeletionPolicy::Retain => "Retain",
        }
    }
}

/// `spec.metal.vrf`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VrfSpec {
    /// Adopt this VRF.
    pub id: Option<String>,
    /// Name of a created VRF (default: the pool's name).
    pub name: Option<String>,
    /// `ip_ranges` of a created VRF.
    #[serde(default, deserialize_with = "null_default")]
    pub ip_ranges: Vec<String>,
    /// `local_asn` of a created VRF.
    #[serde(rename = "localASN")]
    pub local_asn: Option<u32>,
    /// Explicit deletion policy.
    pub deletion_policy: Option<DeletionPolicy>,
}

/// `spec.metal.reservation`: the VRF IP reservation that is the block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReservationSpec {
    /// Adopt this reservation.
    pub id: Option<String>,
    /// First address of a created block.
    pub network: Option<String>,
    /// Prefix length of a created block (IPv4 22–29, IPv6 64).
    pub cidr: Option<u8>,
    /// Explicit deletion policy.
    pub deletion_policy: Option<DeletionPolicy>,
}

/// `spec.metal.vlan`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VlanSpec {
    /// Adopt this VLAN.
    pub id: Option<String>,
    /// Adopt the VLAN with this number in the metro.
    pub vxlan: Option<u16>,
    /// Explicit deletion policy.
    pub deletion_policy: Option<DeletionPolicy>,
}

/// `spec.metal.gateway`: the Metal Gateway of the block on the VLAN.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewaySpec {
    /// Adopt this gateway.
    pub id: Option<String>,
    /// Explicit deletion policy.
    pub deletion_policy: Option<DeletionPolicy>,
}

/// `spec.metal`: the Metal resources behind a VRF-backed pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetalSpec {
    /// Metro code (VRF, VLAN, gateway and devices share it).
    pub metro: String,
    /// The VRF.
    pub vrf: VrfSpec,
    /// The block.
    pub reservation: ReservationSpec,
    /// The VLAN.
    pub vlan: VlanSpec,
    /// The gateway.
    pub gateway: GatewaySpec,
}

/// The four resources, in dependency (creation) order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// The VRF.
    Vrf,
    /// The VRF IP reservation (the block).
    Reservation,
    /// The VLAN.
    Vlan,
    /// The Metal Gateway.
    Gateway,
}

impl Resource {
    /// Creation order; teardown runs it backwards (gateway first).
    pub const ALL: [Resource; 4] = [
        Resource::Vrf,
        Resource::Reservation,
        Resource::Vlan,
        Resource::Gateway,
    ];

    /// The field under `spec.metal`.
    pub fn field(self) -> &'static str {
        match self {
            Resource::Vrf => "vrf",
            Resource::Reservation => "reservation",
            Resource::Vlan => "vlan",
            Resource::Gateway => "gateway",
        }
    }
}

impl MetalSpec {
    /// Whether `r` is adopted (named by id, or a VLAN by number).
    pub fn adopted(&self, r: Resource) -> bool {
        match r {
            Resource::Vrf => self.vrf.id.is_some(),
            Resource::Reservation => self.reservation.id.is_some(),
            Resource::Vlan => self.vlan.id.is_some() || self.vlan.vxlan.is_some(),
            Resource::Gateway => self.gateway.id.is_some(),
        }
    }

    /// What happens to `r` when the pool goes: the explicit policy, else
    /// `Retain` when adopted and `Delete` when created.
    ///
    /// ```
    /// use metal_ipam_core::ipam::vrf::{DeletionPolicy, MetalSpec, Resource};
    /// let mut m = MetalSpec::default();
    /// m.vrf.id = Some("8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11".into());
    /// assert_eq!(m.deletion(Resource::Vrf), DeletionPolicy::Retain);
    /// assert_eq!(m.deletion(Resource::Gateway), DeletionPolicy::Delete);
    /// ```
    pub fn deletion(&self, r: Resource) -> DeletionPolicy {
        self.explicit_deletion(r).unwrap_or(if self.adopted(r) {
            DeletionPolicy::Retain
        } else {
            DeletionPolicy::Delete
        })
    }

    /// The `deletionPolicy` the spec sets for `r`, if any.
    pub fn explicit_deletion(&self, r: Resource) -> Option<DeletionPolicy> {
        match r {
            Resource::Vrf => self.vrf.deletion_policy,
            Resource::Reservation => self.reservation.deletion_policy,
            Resource::Vlan => self.vlan.deletion_policy,
            Resource::Gateway => self.gateway.deletion_policy,
        }
    }

    /// What the creation or adoption of `r` is decided from: its section
    /// of [`MetalSpec::to_json`] (deletion policy included), with the
    /// `metro` the resources share. Recorded with the resource.
    ///
    /// ```
    /// use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
    /// let m = MetalSpec::from_json(&serde_json::json!({"metro": "da",
    ///     "vlan": {"vxlan": 1010, "deletionPolicy": "Delete"}})).unwrap();
    /// assert_eq!(m.section(Resource::Vlan),
    ///     serde_json::json!({"metro": "da", "vxlan": 1010, "deletionPolicy": "Delete"}));
    /// ```
    pub fn section(&self, r: Resource) -> Value {
        let mut m = match self.to_json().get(r.field()) {
            Some(Value::Object(o)) => o.clone(),
            _ => Map::new(),
        };
        m.insert("metro".into(), self.metro.clone().into());
        Value::Object(m)
    }

    /// The first field of `spec.metal` whose value differs from what `r`
    /// was decided from (`recorded`, a [`MetalSpec::section`]): its path
    /// (`spec.metal.metro`, `spec.metal.vrf.ipRanges`, …), or `None` when
    /// nothing differs.
    ///
    /// ```
    /// use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
    /// let was = MetalSpec::from_json(&serde_json::json!({"metro": "da", "vrf": {"id": "x"}})).unwrap();
    /// let mut now = was.clone();
    /// assert_eq!(now.changed_field(Resource::Vrf, &was.section(Resource::Vrf)), None);
    /// now.vrf.deletion_policy = Some(metal_ipam_core::ipam::vrf::DeletionPolicy::Delete);
    /// assert_eq!(now.changed_field(Resource::Vrf, &was.section(Resource::Vrf)).as_deref(),
    ///     Some("spec.metal.vrf.deletionPolicy"));
    /// ```
    pub fn changed_field(&self, r: Resource, recorded: &Value) -> Option<String> {
        first_changed_key(&self.section(r), recorded, "metro").map(|k| match k.as_str() {
            "metro" => "spec.metal.metro".to_string(),
            k => format!("spec.metal.{}.{k}", r.field()),
        })
    }

    /// The block of a reservation to be created: its network address and
    /// prefix length (`None` for an adopted one, known only from Metal).
    pub fn block(&self) -> Option<(IpAddr, u8)> {
        let net = self.reservation.network.as_deref()?.trim().parse().ok()?;
        Some((net, self.reservation.cidr?))
    }

    /// Parses `spec.metal`.
    ///
    /// # Errors
    /// 422 naming the field: a wrong type or an unknown field.
    pub fn from_json(v: &Value) -> Result<MetalSpec> {
        parse_at::<MetalIn>(v, "spec.metal")?.checked()
    }

    /// The section as JSON (CRD field names, absent fields omitted; empty
    /// resource sections kept, so a round trip is exact).
    pub fn to_json(&self) -> Value {
        fn put<T: Into<Value> + Clone>(m: &mut Map<String, Value>, k: &str, v: &Option<T>) {
            if let Some(v) = v {
                m.insert(k.into(), v.clone().into());
            }
        }
        let policy = |m: &mut Map<String, Value>, p: Option<DeletionPolicy>| {
            put(m, "deletionPolicy", &p.map(|p| p.name()));
        };
        let mut vrf = Map::new();
        put(&mut vrf, "id", &self.vrf.id);
        put(&mut vrf, "name", &self.vrf.name);
        if !self.vrf.ip_ranges.is_empty() {
            vrf.insert("ipRanges".into(), self.vrf.ip_ranges.clone().into());
        }
        put(&mut vrf, "localASN", &self.vrf.local_asn);
        policy(&mut vrf, self.vrf.deletion_policy);
        let mut res = Map::new();
        put(&mut res, "id", &self.reservation.id);
        put(&mut res, "network", &self.reservation.network);
        put(&mut res, "cidr", &self.reservation.cidr);
        policy(&mut res, self.reservation.deletion_policy);
        let mut vlan = Map::new();
        put(&mut vlan, "id", &self.vlan.id);
        put(&mut vlan, "vxlan", &self.vlan.vxlan);
        policy(&mut vlan, self.vlan.deletion_policy);
        let mut gw = Map::new();
        put(&mut gw, "id", &self.gateway.id);
        policy(&mut gw, self.gateway.deletion_policy);
        let mut m = Map::new();
        m.insert("metro".into(), self.metro.clone().into());
        m.insert("vrf".into(), Value::Object(vrf));
        m.insert("reservation".into(), Value::Object(res));
        m.insert("vlan".into(), Value::Object(vlan));
        m.insert("gateway".into(), Value::Object(gw));
        Value::Object(m)
    }

    /// Checks the section's rules:
    /// - `metro` is a two-letter metro code;
    /// - each resource is either adopted (`id`, a UUID; a VLAN also by
    ///   `vxlan`, 2–3999) or described for creation, not both;
    /// - a created VRF has `ipRanges` (IPv4 /8–/29, IPv6 /59–/64, network
    ///   addresses); a created block has `network` and `cidr` (IPv4 22–29,
    ///   IPv6 64), is aligned, and lies in one of a created VRF's ranges;
    /// - an adopted reservation belongs to an existing VRF, so the VRF is
    ///   adopted too; an adopted gateway serves an existing reservation on
    ///   an existing VLAN, so both are adopted too;
    /// - the deletion policies are a teardown Metal can carry out: a
    ///   retained gateway with a retained reservation and VLAN, a retained
    ///   reservation with a retained VRF.
    ///
    /// # Errors
    /// 422 naming the first offending field.
    pub fn validate(&self) -> Result<()> {
        let m = self.metro.trim();
        if m.len() != 2 || !m.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(Error::invalid(
                "spec.metal.metro",
                format!(
                    "{:?} is not a metro code (two letters, e.g. \"da\")",
                    self.metro
                ),
            ));
        }
        for (r, id) in [
            (Resource::Vrf, &self.vrf.id),
            (Resource::Reservation, &self.reservation.id),
            (Resource::Vlan, &self.vlan.id),
            (Resource::Gateway, &self.gateway.id),
        ] {
            if let Some(id) = id {
                if !is_uuid(id) {
                    return Err(Error::invalid(
                        format!("spec.metal.{}.id", r.field()),
                        format!("{id:?} is not a UUID"),
                    ));
                }
            }
        }
        self.check_vrf()?;
        self.check_reservation()?;
        self.check_vlan_and_gateway()?;
        self.teardown_possible()
    }

    /// `spec.metal.vrf`: adopted or described for creation, its ranges.
    fn check_vrf(&self) -> Result<()> {
        if self.vrf.id.is_some() {
            for (set, f) in [
                (self.vrf.name.is_some(), "name"),
                (!self.vrf.ip_ranges.is_empty(), "ipRanges"),
                (self.vrf.local_asn.is_some(), "localASN"),
            ] {
                if set {
                    return Err(adopt_or_create("vrf", f));
                }
            }
        } else {
            if self.vrf.ip_ranges.is_empty() {
                return Err(Error::invalid(
                    "spec.metal.vrf.ipRanges",
                    "is required to create a VRF (or set spec.metal.vrf.id to adopt one)",
                ));
            }
            for (i, r) in self.vrf.ip_ranges.iter().enumerate() {
                let field = format!("spec.metal.vrf.ipRanges[{i}]");
                let range = parse_cidr(r, &field)?;
                let len = range.prefix_len();
                let ok = match range {
                    IpNet::V4(_) => (8..=29).contains(&len),
                    IpNet::V6(_) => (59..=64).contains(&len),
                };
                if !ok {
                    return Err(Error::invalid(
                        field,
                        format!("{r:?}: a VRF range is IPv4 /8–/29 or IPv6 /59–/64"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `spec.metal.reservation`: adopted in an adopted VRF, or a created
    /// block that is aligned and inside a created VRF's ranges.
    fn check_reservation(&self) -> Result<()> {
        if self.reservation.id.is_some() {
            for (set, f) in [
                (self.reservation.network.is_some(), "network"),
                (self.reservation.cidr.is_some(), "cidr"),
            ] {
                if set {
                    return Err(adopt_or_create("reservation", f));
                }
            }
            if self.vrf.id.is_none() {
                return Err(Error::invalid(
                    "spec.metal.reservation.id",
                    "an adopted reservation belongs to an existing VRF: adopt that VRF too (spec.metal.vrf.id)",
                ));
            }
        } else {
            let Some(network) = self.reservation.network.as_deref() else {
                return Err(Error::invalid(
                    "spec.metal.reservation.network",
                    "is required to create the block (or set spec.metal.reservation.id to adopt one)",
                ));
            };
            let Some(cidr) = self.reservation.cidr else {
                return Err(Error::invalid(
                    "spec.metal.reservation.cidr",
                    "is required to create the block",
                ));
            };
            let field = "spec.metal.reservation.network";
            let net: IpAddr = network
                .trim()
                .parse()
                .map_err(|_| Error::invalid(field, format!("{network:?} is not an IP address")))?;
            let ok = match Family::of(net) {
                Family::V4 => (22..=29).contains(&cidr),
                Family::V6 => cidr == 64,
            };
            if !ok {
                return Err(Error::invalid(
                    "spec.metal.reservation.cidr",
                    format!("{cidr}: a VRF block is IPv4 /22–/29 or IPv6 /64"),
                ));
            }
            let block = IpNet::new(net, cidr)
                .ok()
                .filter(|b| b.network() == net)
                .ok_or_else(|| {
                    Error::invalid(
                        field,
                        format!("{net} is not the first address of a /{cidr}"),
                    )
                })?;
            if self.vrf.id.is_none() {
                let inside = self
                    .vrf
                    .ip_ranges
                    .iter()
                    .any(|r| parse_cidr(r, "").is_ok_and(|range| range.contains(&block)));
                if !inside {
                    return Err(Error::invalid(
                        field,
                        format!("{net}/{cidr} is not inside any of spec.metal.vrf.ipRanges"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `spec.metal.vlan` and `spec.metal.gateway`.
    fn check_vlan_and_gateway(&self) -> Result<()> {
        // VLAN.
        if self.vlan.id.is_some() && self.vlan.vxlan.is_some() {
            return Err(Error::invalid(
                "spec.metal.vlan.vxlan",
                "set either id or vxlan to adopt a VLAN, not both",
            ));
        }
        if let Some(v) = self.vlan.vxlan {
            if !(2..=3999).contains(&v) {
                return Err(Error::invalid(
                    "spec.metal.vlan.vxlan",
                    format!("{v}: a VLAN number is 2–3999"),
                ));
            }
        }
        // Gateway.
        if self.gateway.id.is_some()
            && !(self.adopted(Resource::Reservation) && self.adopted(Resource::Vlan))
        {
            return Err(Error::invalid(
                "spec.metal.gateway.id",
                "an adopted gateway serves an existing reservation on an existing VLAN: adopt both too",
            ));
        }
        Ok(())
    }

    /// Whether Metal can carry out the deletion policies: a gateway that
    /// stays keeps its reservation and its VLAN from being deleted (Metal
    /// answers 422 "Cannot delete with associated metal gateway"), a
    /// reservation that stays keeps its VRF (Metal refuses to delete a VRF
    /// with reservations). Otherwise teardown would be refused by Metal on
    /// every attempt.
    ///
    /// # Errors
    /// 422 naming the `deletionPolicy` of the resource that stays.
    fn teardown_possible(&self) -> Result<()> {
        let keeps = |r: Resource| self.deletion(r) == DeletionPolicy::Retain;
        let how = |r: Resource| {
            if self.adopted(r) {
                "adopted"
            } else {
                "created"
            }
        };
        let refuse = |kept: Resource, dep: Resource, why: &str| {
            Err(Error::invalid(
                format!("spec.metal.{}.deletionPolicy", kept.field()),
                format!(
                    "the {kept} is retained but the {dep} ({}) would be deleted, and {why}: \
                     set spec.metal.{dep}.deletionPolicy to Retain too, or let the {kept} be deleted",
                    how(dep),
                    kept = kept.field(),
                    dep = dep.field(),
                ),
            ))
        };
        if keeps(Resource::Gateway) {
            for dep in [Resource::Reservation, Resource::Vlan] {
                if !keeps(dep) {
                    return refuse(
                        Resource::Gateway,
                        dep,
                        "Metal refuses to delete it while the gateway uses it",
                    );
                }
            }
        }
        if keeps(Resource::Reservation) && !keeps(Resource::Vrf) {
            return refuse(
                Resource::Reservation,
                Resource::Vrf,
                "Metal refuses to delete a VRF that still has IP reservations",
            );
        }
        Ok(())
    }
}

fn adopt_or_create(resource: &str, field: &str) -> Error {
    Error::invalid(
        format!("spec.metal.{resource}.{field}"),
        format!(
            "describes a {resource} to create, but spec.metal.{resource}.id adopts one: set either"
        ),
    )
}

/// `spec.metal` as read: the metro is required but checked here, so that
/// its absence names `spec.metal.metro`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetalIn {
    metro: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    vrf: VrfSpec,
    #[serde(default, deserialize_with = "null_default")]
    reservation: ReservationSpec,
    #[serde(default, deserialize_with = "null_default")]
    vlan: VlanSpec,
    #[serde(default, deserialize_with = "null_default")]
    gateway: GatewaySpec,
}

impl MetalIn {
    /// The spec, with the checks the types leave: the metro is given, the
    /// numbers are in range.
    pub(crate) fn checked(self) -> Result<MetalSpec> {
        let metro = self
            .metro
            .ok_or_else(|| Error::invalid("spec.metal.metro", "is required"))?;
        at_most("spec.metal.reservation.cidr", self.reservation.cidr, 128)?;
        at_most("spec.metal.vlan.vxlan", self.vlan.vxlan, 4095)?;
        Ok(MetalSpec {
            metro,
            vrf: self.vrf,
            reservation: self.reservation,
            vlan: self.vlan,
            gateway: self.gateway,
        })
    }
}

/// The first key whose value differs between two recorded sections (JSON
/// objects; anything else reads as empty): `shared`, the key every
/// resource's section carries (the metro, the location), first, then the
/// others by name. What both clouds' `changed_field` read.
pub(crate) fn first_changed_key(now: &Value, was: &Value, shared: &str) -> Option<String> {
    let empty = Map::new();
    let (now, was) = (
        now.as_object().unwrap_or(&empty),
        was.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<&String> = now.keys().chain(was.keys()).collect();
    keys.sort_by_key(|k| (k.as_str() != shared, k.as_str()));
    keys.dedup();
    keys.into_iter()
        .find(|k| now.get(*k) != was.get(*k))
        .cloned()
}

fn at_most<T: Into<u64>>(field: &str, v: Option<T>, max: u64) -> Result<()> {
    match v.map(Into::into) {
        Some(n) if n > max => Err(Error::invalid(
            field,
            format!("must be an integer from 0 to {max}"),
        )),
        _ => Ok(()),
    }
}

/// A field that may be absent or `null`: its default then.
pub(crate) fn null_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Deserialises `v`, the object at `root` (`spec`, `spec.metal`): a
/// type error or an unknown field is a 422 naming its path under `root`.
///
/// # Errors
/// 422 `Invalid` with the path, e.g. `spec.metal.vrf.ipRanges[0]`.
pub(crate) fn parse_at<'a, T: Deserialize<'a>>(v: &'a Value, root: &str) -> Result<T> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            root.to_string()
        } else {
            format!("{root}.{path}")
        };
        Error::invalid(field, e.into_inner().to_string())
    })
}

/// `network/length` with the host bits zero.
fn parse_cidr(s: &str, field: &str) -> Result<IpNet> {
    let net: IpNet = s
        .trim()
        .parse()
        .map_err(|_| Error::invalid(field, format!("{s:?} is not a CIDR (network/length)")))?;
    if net.addr() != net.network() {
        return Err(Error::invalid(
            field,
            format!(
                "{s:?}: {} is not the first address of a /{}",
                net.addr(),
                net.prefix_len()
            ),
        ));
    }
    Ok(net)
}

/// `8-4-4-4-12` hexadecimal digits.
pub(crate) fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UUID: &str = "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11";

    fn created() -> Value {
        json!({
            "metro": "da",
            "vrf": {"name": "a", "ipRanges": ["10.10.0.0/16", "fd00:1::/64"], "localASN": 65000},
            "reservation": {"network": "10.10.1.0", "cidr": 24},
            "vlan": {},
            "gateway": {}
        })
    }

    #[test]
    fn a_section_round_trips_exactly() {
        for v in [
            created(),
            json!({"metro": "sv", "vrf": {"id": UUID},
                   "reservation": {"id": UUID}, "vlan": {"vxlan": 1010},
                   "gateway": {"id": UUID, "deletionPolicy": "Delete"}}),
        ] {
            let m = MetalSpec::from_json(&v).unwrap();
            m.validate().unwrap();
            assert_eq!(m.to_json(), v);
        }
    }

    #[test]
    fn deletion_defaults_follow_ownership() {
        let m = MetalSpec::from_json(
            &json!({"metro": "sv", "vrf": {"id": UUID, "deletionPolicy": "Delete"},
            "reservation": {"id": UUID}, "vlan": {"vxlan": 1010}}),
        )
        .unwrap();
        assert_eq!(
            m.deletion(Resource::Vrf),
            DeletionPolicy::Delete,
            "explicit"
        );
        assert_eq!(m.deletion(Resource::Reservation), DeletionPolicy::Retain);
        assert_eq!(m.deletion(Resource::Vlan), DeletionPolicy::Retain);
        assert_eq!(m.deletion(Resource::Gateway), DeletionPolicy::Delete);
        let c = MetalSpec::from_json(&created()).unwrap();
        assert!(Resource::ALL
            .iter()
            .all(|r| c.deletion(*r) == DeletionPolicy::Delete));
        assert_eq!(c.block(), Some(("10.10.1.0".parse().unwrap(), 24)));
    }

    #[test]
    fn each_rule_names_its_field() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"metro": "dallas"}), "spec.metal.metro"),
            (json!({"vrf": {"id": "nope"}}), "spec.metal.vrf.id"),
            (
                json!({"vrf": {"id": UUID, "name": "x"}}),
                "spec.metal.vrf.name",
            ),
            (json!({"vrf": {"ipRanges": []}}), "spec.metal.vrf.ipRanges"),
            (
                json!({"vrf": {"ipRanges": ["10.0.0.0/30"]}}),
                "spec.metal.vrf.ipRanges[0]",
            ),
            (
                json!({"vrf": {"ipRanges": ["10.0.0.1/16"]}}),
                "spec.metal.vrf.ipRanges[0]",
            ),
            (
                json!({"reservation": {"cidr": 30}}),
                "spec.metal.reservation.cidr",
            ),
            (
                json!({"reservation": {"network": "10.10.1.1"}}),
                "spec.metal.reservation.network",
            ),
            (
                json!({"reservation": {"network": "10.11.0.0"}}),
                "spec.metal.reservation.network",
            ),
            (
                json!({"reservation": {"network": "fd00:1::", "cidr": 60}}),
                "spec.metal.reservation.cidr",
            ),
            (
                json!({"reservation": {"id": UUID, "network": null, "cidr": null}}),
                "spec.metal.reservation.id",
            ),
            (
                json!({"vlan": {"id": UUID, "vxlan": 5}}),
                "spec.metal.vlan.vxlan",
            ),
            (json!({"vlan": {"vxlan": 4000}}), "spec.metal.vlan.vxlan"),
            (json!({"gateway": {"id": UUID}}), "spec.metal.gateway.id"),
        ];
        for (patch, field) in cases {
            let mut v = created();
            for (k, p) in patch.as_object().unwrap() {
                match (v.get_mut(k), p) {
                    (Some(Value::Object(o)), Value::Object(p)) => {
                        for (pk, pv) in p {
                            o.insert(pk.clone(), pv.clone());
                        }
                    }
                    _ => v[k] = p.clone(),
                }
            }
            let e = MetalSpec::from_json(&v)
                .and_then(|m| m.validate())
                .expect_err(field);
            assert_eq!(e.field(), Some(field), "{patch}: {e}");
            assert_eq!(e.status(), 422);
        }
    }

    #[test]
    fn deletion_policies_metal_cannot_carry_out_are_refused_naming_the_field() {
        let adopted = json!({"metro": "da", "vrf": {"id": UUID}, "reservation": {"id": UUID},
            "vlan": {"vxlan": 1010}, "gateway": {"id": UUID}});
        let cases: Vec<(Value, Value, Option<&str>)> = vec![
            // A retained gateway keeps its reservation and VLAN.
            (
                created(),
                json!({"gateway": {"deletionPolicy": "Retain"}}),
                Some("spec.metal.gateway.deletionPolicy"),
            ),
            (
                created(),
                json!({"gateway": {"deletionPolicy": "Retain"},
                       "reservation": {"deletionPolicy": "Retain"}}),
                Some("spec.metal.gateway.deletionPolicy"),
            ),
            // A retained reservation keeps its VRF.
            (
                created(),
                json!({"reservation": {"deletionPolicy": "Retain"}}),
                Some("spec.metal.reservation.deletionPolicy"),
            ),
            (
                adopted.clone(),
                json!({"vrf": {"deletionPolicy": "Delete"}}),
                Some("spec.metal.reservation.deletionPolicy"),
            ),
            (
                adopted.clone(),
                json!({"reservation": {"deletionPolicy": "Delete"}}),
                Some("spec.metal.gateway.deletionPolicy"),
            ),
            // What Metal can do.
            (
                created(),
                json!({"gateway": {"deletionPolicy": "Retain"},
                       "reservation": {"deletionPolicy": "Retain"},
                       "vlan": {"deletionPolicy": "Retain"},
                       "vrf": {"deletionPolicy": "Retain"}}),
                None,
            ),
            (
                created(),
                json!({"vrf": {"deletionPolicy": "Retain"}}),
                None,
            ),
            (
                adopted.clone(),
                json!({"gateway": {"deletionPolicy": "Delete"}}),
                None,
            ),
            (adopted, json!({}), None),
        ];
        for (base, patch, field) in cases {
            let mut v = base.clone();
            for (k, p) in patch.as_object().unwrap() {
                for (pk, pv) in p.as_object().unwrap() {
                    v[k][pk] = pv.clone();
                }
            }
            let got = MetalSpec::from_json(&v).unwrap().validate();
            match field {
                Some(f) => {
                    let e = got.expect_err(f);
                    assert_eq!(e.field(), Some(f), "{patch}: {e}");
                    assert!(e.message().contains("Retain too"), "{e}");
                }
                None => assert!(got.is_ok(), "{patch}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_changed_section_names_its_first_changed_field_the_metro_first() {
        let was = MetalSpec::from_json(&created()).unwrap();
        let rec = was.section(Resource::Vrf);
        assert_eq!(was.changed_field(Resource::Vrf, &rec), None);
        let mut now = was.clone();
        now.vrf.ip_ranges.push("10.20.0.0/16".into());
        now.metro = "sv".into();
        assert_eq!(
            now.changed_field(Resource::Vrf, &rec).as_deref(),
            Some("spec.metal.metro")
        );
        now.metro = "da".into();
        assert_eq!(
            now.changed_field(Resource::Vrf, &rec).as_deref(),
            Some("spec.metal.vrf.ipRanges")
        );
        // Another resource's section is not this one's business.
        assert_eq!(
            now.changed_field(Resource::Vlan, &was.section(Resource::Vlan)),
            None
        );
        // A field set where none was, or removed.
        let mut now = was.clone();
        now.vlan.deletion_policy = Some(DeletionPolicy::Retain);
        assert_eq!(
            now.changed_field(Resource::Vlan, &was.section(Resource::Vlan))
                .as_deref(),
            Some("spec.metal.vlan.deletionPolicy")
        );
        assert_eq!(
            was.changed_field(Resource::Vlan, &now.section(Resource::Vlan))
                .as_deref(),
            Some("spec.metal.vlan.deletionPolicy")
        );
    }

    #[test]
    fn types_and_unknown_fields_are_refused_with_their_path() {
        for (v, field) in [
            (json!({"metro": 1}), "spec.metal.metro"),
            (json!({"vrf": []}), "spec.metal.vrf"),
            (json!({"vrf": {"colour": "red"}}), "spec.metal.vrf.colour"),
            (json!({"vrf": {"localASN": -1}}), "spec.metal.vrf.localASN"),
            (
                json!({"vrf": {"ipRanges": [1]}}),
                "spec.metal.vrf.ipRanges[0]",
            ),
            (
                json!({"vlan": {"deletionPolicy": "Orphan"}}),
                "spec.metal.vlan.deletionPolicy",
            ),
            (json!({"extra": true}), "spec.metal.extra"),
        ] {
            let mut base = created();
            for (k, p) in v.as_object().unwrap() {
                base[k] = p.clone();
            }
            let e = MetalSpec::from_json(&base).expect_err(field);
            assert_eq!(e.field(), Some(field), "{v}: {e}");
        }
        let e = MetalSpec::from_json(&json!({})).unwrap_err();
        assert_eq!(e.field(), Some("spec.metal.metro"));
    }
}
