//! phoenixNAP-backed pools: the optional `spec.phoenixnap` section of a
//! pool, which names the phoenixNAP Bare Metal Cloud network behind it.
//!
//! A pool is backed by **one** network of one location:
//! - a **private network** (`privateNetwork`): its CIDR is the pool's
//!   block. Adopted by `id`, or by `vlanId` in the location (without
//!   `cidr`); or created with `cidr` (and `vlanId` if a given VLAN is
//!   wanted, else phoenixNAP picks one). A private network has no gateway
//!   of phoenixNAP's: the pool's `gateway` is whatever the spec says.
//! - a **public network** (`publicNetwork`) with an **IP block**
//!   (`ipBlock`): the block is the pool's. The network is adopted by `id` or
//!   by `vlanId`, or created (the default) with the block attached; the
//!   block is adopted by `id` or ordered by size (`cidrBlockSize`, IPv4
//!   /28–/31, the sizes phoenixNAP sells) and attached to the network. phoenixNAP's gateway is the
//!   block's first usable address, as on Metal.
//!
//! Each resource has a `deletionPolicy` as on Metal (`Delete` the default
//! for what metal-ipam creates, `Retain` for what it adopts). phoenixNAP
//! deletes a public network only once no server is a member, and frees its
//! blocks with it; a block is detached from its network before it is
//! deleted: every combination of policies can be carried out.
//!
//! In the provisioning record the network takes the VLAN's place and the
//! block the reservation's ([`Resource::Vlan`], [`Resource::Reservation`]):
//! the roles of a layer-2 segment and an address block. This module checks
//! the section; it knows nothing of the API (`crate::pnap`), the store or
//! Kubernetes.
//!
//! ```yaml
//! spec:
//!   phoenixnap:
//!     location: PHX
//!     privateNetwork: {cidr: 10.20.0.0/24, vlanId: 210}   # create
//! ---
//! spec:
//!   phoenixnap:
//!     location: ASH
//!     publicNetwork: {}                  # create
//!     ipBlock: {cidrBlockSize: 28}       # order a /28
//! ```

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::vrf::{first_changed_key, null_default, parse_at, DeletionPolicy, Resource};
use crate::error::{Error, Result};

/// `spec.phoenixnap.privateNetwork` or `spec.phoenixnap.publicNetwork`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkSpec {
    /// Adopt this network.
    pub id: Option<String>,
    /// Adopt the network with this VLAN in the location (a private one only
    /// without `cidr`); with `cidr`, the VLAN of the created network.
    pub vlan_id: Option<u16>,
    /// The range of a private network to create.
    pub cidr: Option<String>,
    /// Explicit deletion policy.
    pub deletion_policy: Option<DeletionPolicy>,
}

/// `spec.phoenixnap.ipBlock`: the public block behind the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IpBlockSpec {
    /// Adopt this block.
    pub id: Option<String>,
    /// Prefix length of a block to order (IPv4 28–31: phoenixNAP's sizes;
    /// a larger block is ordered through its support and adopted).
    pub cidr_block_size: Option<u8>,
    /// Explicit deletion policy.
    pub deletion_policy: Option<DeletionPolicy>,
}

/// Which kind of network backs the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetworkKind {
    /// A private network: its CIDR is the block.
    Private,
    /// A public network with an IP block.
    Public,
}

impl NetworkKind {
    /// The field under `spec.phoenixnap`.
    pub fn field(self) -> &'static str {
        match self {
            NetworkKind::Private => "privateNetwork",
            NetworkKind::Public => "publicNetwork",
        }
    }

    /// `private` or `public`, for messages.
    pub fn name(self) -> &'static str {
        match self {
            NetworkKind::Private => "private",
            NetworkKind::Public => "public",
        }
    }
}

/// `spec.phoenixnap`: the phoenixNAP resources behind a pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PnapSpec {
    /// Location code (`PHX`, `ASH`, …): the network's and the servers'.
    pub location: String,
    /// A private network.
    pub private_network: Option<NetworkSpec>,
    /// A public network.
    pub public_network: Option<NetworkSpec>,
    /// The public network's block.
    pub ip_block: Option<IpBlockSpec>,
}

/// What each pool shape holds, in creation order.
const PRIVATE_CHAIN: [Resource; 1] = [Resource::Vlan];
const PUBLIC_CHAIN: [Resource; 2] = [Resource::Reservation, Resource::Vlan];
/// Teardown order of a public pool: the network (freeing its block), then
/// the block.
const PUBLIC_TEARDOWN: [Resource; 2] = [Resource::Vlan, Resource::Reservation];

impl PnapSpec {
    /// The network kind (a spec that passed [`PnapSpec::validate`] has
    /// exactly one).
    pub fn kind(&self) -> NetworkKind {
        if self.public_network.is_some() {
            NetworkKind::Public
        } else {
            NetworkKind::Private
        }
    }

    /// The network's section.
    pub fn network(&self) -> NetworkSpec {
        match self.kind() {
            NetworkKind::Private => self.private_network.clone(),
            NetworkKind::Public => self.public_network.clone(),
        }
        .unwrap_or_default()
    }

    /// The block's section (empty for a private pool).
    pub fn block_spec(&self) -> IpBlockSpec {
        self.ip_block.clone().unwrap_or_default()
    }

    /// The resources the pool holds, in creation order: the network of a
    /// private pool; the block then the network of a public one.
    ///
    /// ```
    /// use metal_ipam_core::ipam::pnap::PnapSpec;
    /// use metal_ipam_core::ipam::vrf::Resource;
    /// let s = PnapSpec::from_json(&serde_json::json!({"location": "PHX",
    ///     "publicNetwork": {}, "ipBlock": {"cidrBlockSize": 29}})).unwrap();
    /// assert_eq!(s.chain(), &[Resource::Reservation, Resource::Vlan]);
    /// ```
    pub fn chain(&self) -> &'static [Resource] {
        match self.kind() {
            NetworkKind::Private => &PRIVATE_CHAIN,
            NetworkKind::Public => &PUBLIC_CHAIN,
        }
    }

    /// Teardown order: the network before its block.
    pub fn teardown_order(&self) -> &'static [Resource] {
        match self.kind() {
            NetworkKind::Private => &PRIVATE_CHAIN,
            NetworkKind::Public => &PUBLIC_TEARDOWN,
        }
    }

    /// The field under `spec.phoenixnap` of `r` (the network or the block).
    pub fn field(&self, r: Resource) -> &'static str {
        match r {
            Resource::Reservation => "ipBlock",
            _ => self.kind().field(),
        }
    }

    /// Whether `r` is adopted (named by id, a network also by VLAN).
    pub fn adopted(&self, r: Resource) -> bool {
        match r {
            Resource::Reservation => self.block_spec().id.is_some(),
            _ => {
                let n = self.network();
                n.id.is_some() || (n.vlan_id.is_some() && n.cidr.is_none())
            }
        }
    }

    /// The `deletionPolicy` the spec sets for `r`, if any.
    pub fn explicit_deletion(&self, r: Resource) -> Option<DeletionPolicy> {
        match r {
            Resource::Reservation => self.block_spec().deletion_policy,
            _ => self.network().deletion_policy,
        }
    }

    /// What happens to `r` when the pool goes: the explicit policy, else
    /// `Retain` when adopted and `Delete` when created.
    pub fn deletion(&self, r: Resource) -> DeletionPolicy {
        self.explicit_deletion(r).unwrap_or(if self.adopted(r) {
            DeletionPolicy::Retain
        } else {
            DeletionPolicy::Delete
        })
    }

    /// What the creation or adoption of `r` is decided from: its section of
    /// [`PnapSpec::to_json`] with the location. Recorded with the resource.
    pub fn section(&self, r: Resource) -> Value {
        let mut m = match self.to_json().get(self.field(r)) {
            Some(Value::Object(o)) => o.clone(),
            _ => Map::new(),
        };
        m.insert("location".into(), self.location.clone().into());
        Value::Object(m)
    }

    /// The first field of `spec.phoenixnap` that differs from what `r` was
    /// decided from (`recorded`, a [`PnapSpec::section`]).
    ///
    /// ```
    /// use metal_ipam_core::ipam::pnap::PnapSpec;
    /// use metal_ipam_core::ipam::vrf::Resource;
    /// let was = PnapSpec::from_json(&serde_json::json!({"location": "PHX",
    ///     "privateNetwork": {"cidr": "10.20.0.0/24"}})).unwrap();
    /// let now = PnapSpec::from_json(&serde_json::json!({"location": "PHX",
    ///     "privateNetwork": {"cidr": "10.21.0.0/24"}})).unwrap();
    /// assert_eq!(now.changed_field(Resource::Vlan, &was.section(Resource::Vlan)).as_deref(),
    ///     Some("spec.phoenixnap.privateNetwork.cidr"));
    /// ```
    pub fn changed_field(&self, r: Resource, recorded: &Value) -> Option<String> {
        first_changed_key(&self.section(r), recorded, "location").map(|k| match k.as_str() {
            "location" => "spec.phoenixnap.location".to_string(),
            k => format!("spec.phoenixnap.{}.{k}", self.field(r)),
        })
    }

    /// The block known before provisioning: a created private network's
    /// CIDR (`None` otherwise: read from phoenixNAP when provisioned).
    pub fn block(&self) -> Option<(IpAddr, u8)> {
        if self.kind() != NetworkKind::Private {
            return None;
        }
        let net: IpNet = self.network().cidr?.trim().parse().ok()?;
        Some((net.network(), net.prefix_len()))
    }

    /// Parses `spec.phoenixnap`.
    ///
    /// # Errors
    /// 422 naming the field: a wrong type or an unknown field.
    pub fn from_json(v: &Value) -> Result<PnapSpec> {
        parse_at::<PnapIn>(v, "spec.phoenixnap")?.checked()
    }

    /// The section as JSON (CRD field names, absent fields omitted).
    pub fn to_json(&self) -> Value {
        fn put<T: Into<Value> + Clone>(m: &mut Map<String, Value>, k: &str, v: &Option<T>) {
            if let Some(v) = v {
                m.insert(k.into(), v.clone().into());
            }
        }
        let policy = |p: Option<DeletionPolicy>| p.map(DeletionPolicy::name);
        let network = |n: &NetworkSpec| {
            let mut m = Map::new();
            put(&mut m, "id", &n.id);
            put(&mut m, "vlanId", &n.vlan_id);
            put(&mut m, "cidr", &n.cidr);
            put(&mut m, "deletionPolicy", &policy(n.deletion_policy));
            Value::Object(m)
        };
        let mut m = Map::new();
        m.insert("location".into(), self.location.clone().into());
        if let Some(n) = &self.private_network {
            m.insert("privateNetwork".into(), network(n));
        }
        if let Some(n) = &self.public_network {
            m.insert("publicNetwork".into(), network(n));
        }
        if let Some(b) = &self.ip_block {
            let mut o = Map::new();
            put(&mut o, "id", &b.id);
            put(&mut o, "cidrBlockSize", &b.cidr_block_size);
            put(&mut o, "deletionPolicy", &policy(b.deletion_policy));
            m.insert("ipBlock".into(), Value::Object(o));
        }
        Value::Object(m)
    }

    /// Checks the section's rules:
    /// - `location` is a phoenixNAP location code (three capital letters);
    /// - exactly one of `privateNetwork` and `publicNetwork`; `ipBlock` with
    ///   a public network only, and required there;
    /// - a network is adopted (`id`, or `vlanId` — a private one without
    ///   `cidr`) or described for creation, not both; `vlanId` is 2–4094;
    ///   a created private network's `cidr` is an aligned private IPv4
    ///   range (/8–/30); a public network has no `cidr`;
    /// - a block is adopted (`id`) or ordered (`cidrBlockSize` 28–31), not
    ///   both;
    /// - ids are phoenixNAP's (hex, 24 digits in the specs' examples: 1–64
    ///   letters and digits accepted).
    ///
    /// # Errors
    /// 422 naming the first offending field.
    ///
    /// ```
    /// use metal_ipam_core::ipam::pnap::PnapSpec;
    /// let bad = PnapSpec::from_json(&serde_json::json!({"location": "PHX",
    ///     "privateNetwork": {"cidr": "10.20.0.1/24"}})).unwrap();
    /// assert_eq!(bad.validate().unwrap_err().field(),
    ///     Some("spec.phoenixnap.privateNetwork.cidr"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        let l = self.location.trim();
        if l.len() != 3 || !l.chars().all(|c| c.is_ascii_uppercase()) {
            return Err(Error::invalid(
                "spec.phoenixnap.location",
                format!(
                    "{:?} is not a phoenixNAP location code (three capital letters, e.g. \"PHX\")",
                    self.location
                ),
            ));
        }
        let kind = match (&self.private_network, &self.public_network) {
            (Some(_), None) => NetworkKind::Private,
            (None, Some(_)) => NetworkKind::Public,
            (Some(_), Some(_)) => return Err(Error::invalid(
                "spec.phoenixnap.publicNetwork",
                "a pool is backed by one network: set privateNetwork or publicNetwork, not both",
            )),
            (None, None) => {
                return Err(Error::invalid(
                    "spec.phoenixnap",
                    "names no network: set privateNetwork or publicNetwork",
                ))
            }
        };
        let f = |k: &str| format!("spec.phoenixnap.{}.{k}", kind.field());
        let n = self.network();
        if let Some(id) = &n.id {
            check_id(id, &f("id"))?;
            for (set, k) in [(n.vlan_id.is_some(), "vlanId"), (n.cidr.is_some(), "cidr")] {
                if set {
                    return Err(Error::invalid(
                        f(k),
                        format!(
                            "describes a network to find or create, but {} adopts one: set either",
                            f("id")
                        ),
                    ));
                }
            }
        }
        if let Some(v) = n.vlan_id {
            if !(2..=4094).contains(&v) {
                return Err(Error::invalid(
                    f("vlanId"),
                    format!("{v}: a VLAN id is 2–4094"),
                ));
            }
        }
        match kind {
            NetworkKind::Private => {
                if self.ip_block.is_some() {
                    return Err(Error::invalid(
                        "spec.phoenixnap.ipBlock",
                        "IP blocks belong to public networks: a private network's block is its cidr",
                    ));
                }
                if n.id.is_none() && n.vlan_id.is_none() && n.cidr.is_none() {
                    return Err(Error::invalid(
                        f("cidr"),
                        "is required to create a private network (or set id or vlanId to adopt one)",
                    ));
                }
                if let Some(c) = &n.cidr {
                    check_private_cidr(c, &f("cidr"))?;
                }
            }
            NetworkKind::Public => {
                if n.cidr.is_some() {
                    return Err(Error::invalid(
                        f("cidr"),
                        "a public network's addresses are its IP block's: set spec.phoenixnap.ipBlock",
                    ));
                }
                let Some(b) = &self.ip_block else {
                    return Err(Error::invalid(
                        "spec.phoenixnap.ipBlock",
                        "is required with a public network: set id to adopt a block or cidrBlockSize to order one",
                    ));
                };
                match (&b.id, b.cidr_block_size) {
                    (Some(_), Some(_)) => {
                        return Err(Error::invalid(
                            "spec.phoenixnap.ipBlock.cidrBlockSize",
                            "describes a block to order, but spec.phoenixnap.ipBlock.id adopts one: set either",
                        ))
                    }
                    (Some(id), None) => check_id(id, "spec.phoenixnap.ipBlock.id")?,
                    (None, Some(s)) if (28..=31).contains(&s) => {}
                    (None, Some(s)) => {
                        return Err(Error::invalid(
                            "spec.phoenixnap.ipBlock.cidrBlockSize",
                            format!("{s}: phoenixNAP sells IPv4 blocks of /28 to /31 (order a larger one through its support and adopt it by id)"),
                        ))
                    }
                    (None, None) => {
                        return Err(Error::invalid(
                            "spec.phoenixnap.ipBlock.cidrBlockSize",
                            "is required to order a block (or set spec.phoenixnap.ipBlock.id to adopt one)",
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}

/// A phoenixNAP id: 1–64 ASCII letters and digits.
fn check_id(id: &str, field: &str) -> Result<()> {
    let ok = (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("{id:?} is not a phoenixNAP id"),
        ))
    }
}

/// An aligned private IPv4 range, /8–/30.
fn check_private_cidr(c: &str, field: &str) -> Result<()> {
    let net: IpNet = c
        .trim()
        .parse()
        .map_err(|_| Error::invalid(field, format!("{c:?} is not a CIDR (network/length)")))?;
    let IpNet::V4(v4) = net else {
        return Err(Error::invalid(
            field,
            format!("{c:?}: a private network is IPv4"),
        ));
    };
    if v4.addr() != v4.network() {
        return Err(Error::invalid(
            field,
            format!(
                "{} is not the first address of a /{}",
                v4.addr(),
                v4.prefix_len()
            ),
        ));
    }
    if !(8..=30).contains(&v4.prefix_len()) || !v4.addr().is_private() {
        return Err(Error::invalid(
            field,
            format!("{c:?}: a private network is a /8–/30 inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"),
        ));
    }
    Ok(())
}

/// `spec.phoenixnap` as read: the location is required but checked here,
/// so that its absence names `spec.phoenixnap.location`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct PnapIn {
    location: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    private_network: Option<NetworkSpec>,
    #[serde(default, deserialize_with = "null_default")]
    public_network: Option<NetworkSpec>,
    #[serde(default, deserialize_with = "null_default")]
    ip_block: Option<IpBlockSpec>,
}

impl PnapIn {
    /// The spec, with the location given.
    pub(crate) fn checked(self) -> Result<PnapSpec> {
        let location = self
            .location
            .ok_or_else(|| Error::invalid("spec.phoenixnap.location", "is required"))?;
        Ok(PnapSpec {
            location,
            private_network: self.private_network,
            public_network: self.public_network,
            ip_block: self.ip_block,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(v: Value) -> Option<String> {
        match PnapSpec::from_json(&v).and_then(|s| s.validate()) {
            Ok(()) => None,
            Err(e) => Some(e.field().unwrap_or_default().to_string()),
        }
    }

    #[test]
    fn valid_shapes_pass() {
        for v in [
            json!({"location": "PHX", "privateNetwork": {"cidr": "10.20.0.0/24"}}),
            json!({"location": "PHX", "privateNetwork": {"cidr": "10.20.0.0/24", "vlanId": 20}}),
            json!({"location": "PHX", "privateNetwork": {"vlanId": 20}}),
            json!({"location": "PHX", "privateNetwork": {"id": "60473a6115e34466c9f8f083"}}),
            json!({"location": "ASH", "publicNetwork": {}, "ipBlock": {"cidrBlockSize": 29}}),
            json!({"location": "ASH", "publicNetwork": {"vlanId": 30}, "ipBlock": {"id": "6047127fed34ecc3ba8402d2"}}),
        ] {
            assert_eq!(field(v.clone()), None, "{v}");
        }
    }

    #[test]
    fn each_fault_names_its_field() {
        let cases = [
            (
                json!({"privateNetwork": {"cidr": "10.0.0.0/24"}}),
                "spec.phoenixnap.location",
            ),
            (
                json!({"location": "phx", "privateNetwork": {"cidr": "10.0.0.0/24"}}),
                "spec.phoenixnap.location",
            ),
            (json!({"location": "PHX"}), "spec.phoenixnap"),
            (
                json!({"location": "PHX", "privateNetwork": {}, "publicNetwork": {}}),
                "spec.phoenixnap.publicNetwork",
            ),
            (
                json!({"location": "PHX", "privateNetwork": {}}),
                "spec.phoenixnap.privateNetwork.cidr",
            ),
            (
                json!({"location": "PHX", "privateNetwork": {"cidr": "8.8.8.0/24"}}),
                "spec.phoenixnap.privateNetwork.cidr",
            ),
            (
                json!({"location": "PHX", "privateNetwork": {"cidr": "10.0.0.0/31"}}),
                "spec.phoenixnap.privateNetwork.cidr",
            ),
            (
                json!({"location": "PHX", "privateNetwork": {"id": "x/y"}}),
                "spec.phoenixnap.privateNetwork.id",
            ),
            (
                json!({"location": "PHX", "privateNetwork": {"id": "a1", "cidr": "10.0.0.0/24"}}),
                "spec.phoenixnap.privateNetwork.cidr",
            ),
            (
                json!({"location": "PHX", "privateNetwork": {"vlanId": 1}}),
                "spec.phoenixnap.privateNetwork.vlanId",
            ),
            (
                json!({"location": "PHX", "privateNetwork": {"vlanId": 5, "name": "x"}}),
                "spec.phoenixnap.privateNetwork.name",
            ),
            (
                json!({"location": "PHX", "privateNetwork": {"cidr": "10.0.0.0/24"}, "ipBlock": {"cidrBlockSize": 29}}),
                "spec.phoenixnap.ipBlock",
            ),
            (
                json!({"location": "PHX", "publicNetwork": {}}),
                "spec.phoenixnap.ipBlock",
            ),
            (
                json!({"location": "PHX", "publicNetwork": {"cidr": "10.0.0.0/24"}, "ipBlock": {"cidrBlockSize": 29}}),
                "spec.phoenixnap.publicNetwork.cidr",
            ),
            (
                json!({"location": "PHX", "publicNetwork": {}, "ipBlock": {"cidrBlockSize": 27}}),
                "spec.phoenixnap.ipBlock.cidrBlockSize",
            ),
            (
                json!({"location": "PHX", "publicNetwork": {}, "ipBlock": {}}),
                "spec.phoenixnap.ipBlock.cidrBlockSize",
            ),
            (
                json!({"location": "PHX", "publicNetwork": {}, "ipBlock": {"id": "a", "cidrBlockSize": 29}}),
                "spec.phoenixnap.ipBlock.cidrBlockSize",
            ),
            (
                json!({"location": "PHX", "publicNetwork": {"mtu": 9000}, "ipBlock": {"id": "a"}}),
                "spec.phoenixnap.publicNetwork.mtu",
            ),
        ];
        for (v, f) in cases {
            assert_eq!(field(v.clone()).as_deref(), Some(f), "{v}");
        }
    }

    #[test]
    fn adoption_and_policies_follow_the_fields() {
        let s = PnapSpec::from_json(&json!({"location": "PHX", "privateNetwork": {"vlanId": 20}}))
            .unwrap();
        assert!(s.adopted(Resource::Vlan));
        assert_eq!(s.deletion(Resource::Vlan), DeletionPolicy::Retain);
        let s = PnapSpec::from_json(
            &json!({"location": "PHX", "privateNetwork": {"vlanId": 20, "cidr": "10.0.0.0/24"}}),
        )
        .unwrap();
        assert!(!s.adopted(Resource::Vlan));
        assert_eq!(s.deletion(Resource::Vlan), DeletionPolicy::Delete);
        assert_eq!(s.block(), Some(("10.0.0.0".parse().unwrap(), 24)));
        let s = PnapSpec::from_json(&json!({"location": "ASH", "publicNetwork": {"vlanId": 30},
            "ipBlock": {"cidrBlockSize": 29, "deletionPolicy": "Retain"}}))
        .unwrap();
        assert!(s.adopted(Resource::Vlan));
        assert!(!s.adopted(Resource::Reservation));
        assert_eq!(s.deletion(Resource::Reservation), DeletionPolicy::Retain);
        assert_eq!(s.block(), None);
        assert_eq!(s.teardown_order(), &[Resource::Vlan, Resource::Reservation]);
        assert_eq!(
            s.section(Resource::Reservation),
            json!({"location": "ASH", "cidrBlockSize": 29, "deletionPolicy": "Retain"})
        );
    }

    #[test]
    fn json_round_trips() {
        let v = json!({"location": "ASH", "publicNetwork": {"vlanId": 30, "deletionPolicy": "Delete"},
            "ipBlock": {"id": "6047127fed34ecc3ba8402d2"}});
        assert_eq!(PnapSpec::from_json(&v).unwrap().to_json(), v);
    }
}
