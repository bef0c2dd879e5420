//! Pool objects (`MetalIPPool`, `GlobalMetalIPPool`) and their validation.
//!
//! A pool is registered as a Kubernetes-shaped object. [`PoolObject::parse`]
//! checks the envelope, [`PoolSpec::validate`] turns the spec into a
//! [`ValidatedPool`]: the set of allocatable addresses as ranges (so a /64 is
//! cheap), the reserved addresses, the pre-allocations, and the grace period.
//! Every problem is reported as a 422 [`Error`] naming the field.
//! What a pool is ([`PoolKind`], [`PoolId`]) is `id`'s; the object's
//! envelope is `object`'s.

mod id;
mod object;

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{Error, ErrorKind, Known, Result};
use crate::ip::{from_u128, subnet_bounds, to_u128, Family, RangeSet};
use crate::ipam::backing::Backing;
use crate::ipam::pnap::{PnapIn, PnapSpec};
use crate::ipam::vrf::{null_default, parse_at, MetalIn, MetalSpec};
use crate::kube::names;

/// Our API group, version and pool kinds: `kube`'s resource table owns them.
pub use crate::kube::{
    API_VERSION, GROUP, KIND_GLOBAL_POOL as KIND_GLOBAL,
    KIND_GLOBAL_PREFIX_POOL as KIND_GLOBAL_PREFIX, KIND_POOL as KIND_NAMESPACED,
    KIND_PREFIX_POOL as KIND_PREFIX, VERSION,
};

/// Most entries `spec.addresses` may list, and separately most entries
/// `spec.excludedAddresses` may list (each entry an IP, a range `a-b` or a
/// CIDR, so one entry can cover a /64). A longer list is refused with 422
/// `Invalid` naming the list. Validation costs O(n log n) in the number of
/// entries.
pub const MAX_ENTRIES: usize = 1024;

/// What a pool hands out, with the fields only that shape has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolShape {
    /// Addresses (`MetalIPPool`, `GlobalMetalIPPool`).
    Addresses {
        /// `spec.prefix`: the prefix length handed out with every address
        /// (0 in a VRF-backed pool that leaves it to its block).
        prefix: u8,
        /// `spec.allocateReservedIPAddresses`: hand out network,
        /// broadcast/anycast and gateway addresses too.
        allocate_reserved: bool,
    },
    /// Sub-prefixes (`MetalPrefixPool`, `GlobalMetalPrefixPool`) of
    /// `spec.allocationPrefixLength`.
    Prefixes {
        /// The length of every sub-prefix handed out.
        length: u8,
    },
}

impl Default for PoolShape {
    fn default() -> Self {
        PoolShape::Addresses {
            prefix: 0,
            allocate_reserved: false,
        }
    }
}

impl PoolShape {
    /// An address pool handing out `prefix` with every address.
    pub fn addresses(prefix: u8) -> PoolShape {
        PoolShape::Addresses {
            prefix,
            allocate_reserved: false,
        }
    }

    /// A prefix pool's sub-prefix length; `None` for an address pool.
    pub fn prefix_length(self) -> Option<u8> {
        match self {
            PoolShape::Prefixes { length } => Some(length),
            PoolShape::Addresses { .. } => None,
        }
    }
}

/// The spec of a pool, as registered (field names as in the CRD).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolSpec {
    /// Single IPs, ranges `a-b` and CIDRs; a prefix pool's `prefixes`.
    pub addresses: Vec<String>,
    /// Addresses or prefixes or prefix length handed out, and what only
    /// that shape has.
    pub shape: PoolShape,
    /// Default gateway handed out with every address.
    pub gateway: Option<String>,
    /// Addresses (same syntax as `addresses`) never handed out; a prefix
    /// pool's `excludedPrefixes`.
    pub excluded_addresses: Vec<String>,
    /// Seconds a released address waits before it can be reused.
    pub address_reuse_grace_period_seconds: u32,
    /// Claim name → the address that claim always gets.
    pub pre_allocations: BTreeMap<String, String>,
    /// The Metal resources behind a VRF-backed pool. Such a pool may leave
    /// `addresses` empty and `prefix` 0: they are then its block's.
    pub metal: Option<MetalSpec>,
    /// The phoenixNAP network behind a phoenixNAP-backed pool (never with
    /// `metal`). Such a pool may leave `addresses` and `prefix` to its
    /// block too.
    pub phoenixnap: Option<PnapSpec>,
}

/// A validated pool: everything the allocator needs, precomputed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedPool {
    /// Address family of every address in the pool.
    pub family: Family,
    /// Prefix length handed out.
    pub prefix: u8,
    /// Gateway handed out, if any.
    pub gateway: Option<IpAddr>,
    /// Addresses configured in `spec.addresses` (before exclusions).
    pub configured: RangeSet,
    /// Addresses that may be handed out: configured − excluded − reserved.
    pub allocatable: RangeSet,
    /// Pre-allocated addresses by claim name (all inside `allocatable`).
    pub pre_allocations: BTreeMap<String, u128>,
    /// The set of pre-allocated addresses (reserved for their claims).
    pub pre_allocated: RangeSet,
    /// Reuse grace period in seconds.
    pub grace_seconds: u64,
    /// Bits below the unit the allocator counts in: 0 for an address pool
    /// (a value is an address), `bits − allocationPrefixLength` for a prefix
    /// pool (a value is a sub-prefix number, its network address shifted
    /// right by `shift`). Every set above is in these units.
    pub shift: u8,
}

impl ValidatedPool {
    /// Converts a value of this pool (an address, or a sub-prefix number)
    /// to the [`IpAddr`] handed out: the address, or the sub-prefix's
    /// network address.
    ///
    /// ```
    /// use metal_ipam_core::ipam::pool::{PoolShape, PoolSpec};
    /// let spec = PoolSpec { addresses: vec!["2001:db8::/48".into()],
    ///     shape: PoolShape::Prefixes { length: 64 }, ..Default::default() };
    /// let pool = spec.validate().unwrap();
    /// assert_eq!(pool.total(), 65_536);
    /// let first = pool.allocatable.first().unwrap();
    /// assert_eq!(pool.ip(first + 5).to_string(), "2001:db8:0:5::");
    /// ```
    pub fn ip(&self, v: u128) -> IpAddr {
        from_u128(self.family, v << self.shift)
    }

    /// The value of `ip` in this pool: `None` when its family differs, or,
    /// in a prefix pool, when it is not the network address of a
    /// sub-prefix (host bits below the allocation length set).
    pub fn value_of(&self, ip: IpAddr) -> Option<u128> {
        if Family::of(ip) != self.family {
            return None;
        }
        let v = to_u128(ip);
        let low = low_mask(self.shift);
        (v & low == 0).then(|| v >> self.shift)
    }

    /// The value of the address or sub-prefix that contains `ip` (in a
    /// prefix pool, any address of a sub-prefix gives its number); `None`
    /// when the family differs. Whether the pool hands it out is
    /// `allocatable`'s to say.
    pub fn value_containing(&self, ip: IpAddr) -> Option<u128> {
        (Family::of(ip) == self.family).then(|| to_u128(ip) >> self.shift)
    }

    /// `set` (in this pool's units) as the addresses it covers: a
    /// sub-prefix covers all of its addresses. Used to compare pools of
    /// either kind (overlaps are about addresses).
    pub fn addresses_of(&self, set: &RangeSet) -> RangeSet {
        if self.shift == 0 {
            return set.clone();
        }
        let low = low_mask(self.shift);
        RangeSet::from_ranges(
            set.ranges()
                .iter()
                .map(|&(a, b)| (a << self.shift, (b << self.shift) | low)),
        )
    }

    /// Number of addresses that can be handed out (saturating).
    pub fn total(&self) -> u128 {
        self.allocatable.len()
    }
}

/// A prefix pool's `prefixes` entry: a CIDR with its host bits zero.
///
/// ```
/// use metal_ipam_core::ipam::pool::aligned_cidr;
/// assert_eq!(aligned_cidr("fd00::/48").unwrap().to_string(), "fd00::/48");
/// assert!(aligned_cidr("fd00::1/48").unwrap_err().contains("fd00::/48"));
/// assert!(aligned_cidr("fd00::1").is_err());
/// ```
pub fn aligned_cidr(entry: &str) -> std::result::Result<ipnet::IpNet, String> {
    let net: ipnet::IpNet = entry
        .trim()
        .parse()
        .map_err(|_| format!("{entry:?} is not a CIDR (address/length)"))?;
    if net.addr() != net.network() {
        return Err(format!(
            "{entry:?} has host bits set: the network is {}",
            net.trunc()
        ));
    }
    Ok(net)
}

/// A sub-prefix of length `len` given as `net/len` or as its network
/// address `net`: the network address.
///
/// ```
/// use metal_ipam_core::ipam::pool::sub_prefix;
/// assert_eq!(sub_prefix("10.0.0.16/28", 28).unwrap().to_string(), "10.0.0.16");
/// assert_eq!(sub_prefix("10.0.0.16", 28).unwrap().to_string(), "10.0.0.16");
/// assert!(sub_prefix("10.0.0.16/29", 28).is_err());
/// assert!(sub_prefix("10.0.0.17", 28).is_err());
/// ```
pub fn sub_prefix(given: &str, len: u8) -> std::result::Result<IpAddr, String> {
    let net = if given.contains('/') {
        let n = aligned_cidr(given)?;
        if n.prefix_len() != len {
            return Err(format!(
                "{given:?} is a /{}, but the pool hands out /{len}",
                n.prefix_len()
            ));
        }
        n
    } else {
        let ip: IpAddr = given
            .trim()
            .parse()
            .map_err(|_| format!("{given:?} is not a sub-prefix (net/len or net)"))?;
        let n = ipnet::IpNet::new(ip, len).map_err(|_| format!("/{len} is too long for {ip}"))?;
        if n.network() != ip {
            return Err(format!(
                "{ip} is not the network address of a /{len} (that is {})",
                n.network()
            ));
        }
        n
    };
    Ok(net.addr())
}

/// The `shift` low bits set.
fn low_mask(shift: u8) -> u128 {
    match shift {
        0 => 0,
        128.. => u128::MAX,
        s => (1u128 << s) - 1,
    }
}

/// Parses one `addresses` / `excludedAddresses` entry into an inclusive range.
///
/// Accepts a single address, a range `a-b` (same family, `a <= b`) or a CIDR
/// (all addresses of the network, host bits ignored).
///
/// # Examples
/// ```
/// use metal_ipam_core::ipam::pool::parse_entry;
/// use metal_ipam_core::ip::Family;
/// assert_eq!(parse_entry("10.0.0.1-10.0.0.3").unwrap(), (Family::V4, 0x0a00_0001, 0x0a00_0003));
/// assert_eq!(parse_entry("10.0.0.5/30").unwrap(), (Family::V4, 0x0a00_0004, 0x0a00_0007));
/// assert!(parse_entry("10.0.0.3-10.0.0.1").is_err());
/// assert!(parse_entry("10.0.0.1-2001:db8::1").is_err());
/// ```
pub fn parse_entry(entry: &str) -> std::result::Result<(Family, u128, u128), String> {
    let s = entry.trim();
    if let Some((a, b)) = s.split_once('-') {
        let a: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("{:?} is not a valid range start", a.trim()))?;
        let b: IpAddr = b
            .trim()
            .parse()
            .map_err(|_| format!("{:?} is not a valid range end", b.trim()))?;
        if Family::of(a) != Family::of(b) {
            return Err(format!("range {s:?} mixes IPv4 and IPv6"));
        }
        let (x, y) = (to_u128(a), to_u128(b));
        if x > y {
            return Err(format!("range {s:?} ends before it starts"));
        }
        return Ok((Family::of(a), x, y));
    }
    if s.contains('/') {
        let net: ipnet::IpNet = s
            .parse()
            .map_err(|_| format!("{s:?} is not a valid CIDR"))?;
        let fam = Family::of(net.addr());
        let (x, y) = subnet_bounds(fam, to_u128(net.addr()), net.prefix_len());
        return Ok((fam, x, y));
    }
    let ip: IpAddr = s
        .parse()
        .map_err(|_| format!("{s:?} is not an IP address, a range a-b or a CIDR"))?;
    Ok((Family::of(ip), to_u128(ip), to_u128(ip)))
}

fn family_name(f: Family) -> &'static str {
    match f {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// Reason of the error [`PoolSpec::validate`] gives for a VRF-backed pool
/// whose addresses are those of an adopted reservation, not known until
/// the reservation is read from Metal.
pub const BLOCK_UNKNOWN: &str = Known::MetalBlockUnknown.as_str();

/// The fields of a pool's `spec` (those [`PoolSpec::from_json`] accepts;
/// any other is refused as unknown).
pub const SPEC_FIELDS: &[&str] = &[
    "addresses",
    "prefix",
    "gateway",
    "excludedAddresses",
    "allocateReservedIPAddresses",
    "addressReuseGracePeriodSeconds",
    "preAllocations",
    "metal",
    "phoenixnap",
];

/// A pool's `spec` as read: the fields whose absence depends on `metal`
/// are optional here, checked in [`SpecIn::checked`]; any other field is
/// refused as unknown.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SpecIn {
    addresses: Option<Vec<String>>,
    prefix: Option<u64>,
    gateway: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    excluded_addresses: Vec<String>,
    #[serde(rename = "allocateReservedIPAddresses")]
    #[serde(default, deserialize_with = "null_default")]
    allocate_reserved_ip_addresses: bool,
    address_reuse_grace_period_seconds: Option<u64>,
    #[serde(default, deserialize_with = "null_default")]
    pre_allocations: BTreeMap<String, String>,
    metal: Option<MetalIn>,
    phoenixnap: Option<PnapIn>,
}

impl SpecIn {
    /// The spec: `addresses` and `prefix` are required unless the pool is
    /// VRF-backed, the numbers are in range, an empty gateway is none.
    fn checked(self) -> Result<PoolSpec> {
        let metal = self.metal.map(MetalIn::checked).transpose()?;
        let phoenixnap = self.phoenixnap.map(PnapIn::checked).transpose()?;
        if metal.is_some() && phoenixnap.is_some() {
            return Err(Error::invalid(
                "spec.phoenixnap",
                "a pool is backed by one cloud: set spec.metal or spec.phoenixnap, not both",
            ));
        }
        let vrf = metal.is_some() || phoenixnap.is_some();
        let addresses = match self.addresses {
            Some(a) => a,
            None if vrf => Vec::new(),
            None => return Err(Error::invalid("spec.addresses", "is required")),
        };
        let prefix = match self.prefix {
            None if vrf => 0,
            None => return Err(Error::invalid("spec.prefix", "is required")),
            Some(p) => u8::try_from(p)
                .ok()
                .filter(|p| *p <= 128)
                .ok_or_else(|| Error::invalid("spec.prefix", "must be an integer from 0 to 128"))?,
        };
        let grace = match self.address_reuse_grace_period_seconds {
            None => 0,
            Some(g) => u32::try_from(g)
                .ok()
                .filter(|g| *g <= i32::MAX as u32)
                .ok_or_else(|| {
                    Error::invalid(
                        "spec.addressReuseGracePeriodSeconds",
                        "must be an integer from 0 to 2147483647",
                    )
                })?,
        };
        Ok(PoolSpec {
            addresses,
            shape: PoolShape::Addresses {
                prefix,
                allocate_reserved: self.allocate_reserved_ip_addresses,
            },
            gateway: self.gateway.filter(|g| !g.is_empty()),
            excluded_addresses: self.excluded_addresses,
            address_reuse_grace_period_seconds: grace,
            pre_allocations: self.pre_allocations,
            metal,
            phoenixnap,
        })
    }
}

/// The fields of a prefix pool's `spec`.
pub const PREFIX_SPEC_FIELDS: &[&str] = &[
    "prefixes",
    "allocationPrefixLength",
    "excludedPrefixes",
    "gateway",
    "addressReuseGracePeriodSeconds",
    "preAllocations",
    "metal",
];

/// `allocationPrefixLength` when not given (as the in-cluster provider).
pub const DEFAULT_ALLOCATION_PREFIX_LENGTH: u8 = 64;

/// A prefix pool's `spec` as read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrefixSpecIn {
    prefixes: Option<Vec<String>>,
    allocation_prefix_length: Option<u64>,
    #[serde(default, deserialize_with = "null_default")]
    excluded_prefixes: Vec<String>,
    gateway: Option<String>,
    address_reuse_grace_period_seconds: Option<u64>,
    #[serde(default, deserialize_with = "null_default")]
    pre_allocations: BTreeMap<String, String>,
    metal: Option<MetalIn>,
}

impl PrefixSpecIn {
    /// The spec: `prefixes` required unless VRF-backed, the length 1–128.
    fn checked(self) -> Result<PoolSpec> {
        let as_address = SpecIn {
            addresses: self.prefixes.clone(),
            prefix: Some(0),
            gateway: self.gateway,
            excluded_addresses: self.excluded_prefixes,
            allocate_reserved_ip_addresses: false,
            address_reuse_grace_period_seconds: self.address_reuse_grace_period_seconds,
            pre_allocations: self.pre_allocations,
            metal: self.metal,
            phoenixnap: None,
        };
        let vrf = as_address.metal.is_some();
        if self.prefixes.is_none() && !vrf {
            return Err(Error::invalid("spec.prefixes", "is required"));
        }
        let len = match self.allocation_prefix_length {
            None => DEFAULT_ALLOCATION_PREFIX_LENGTH,
            Some(l) => u8::try_from(l)
                .ok()
                .filter(|l| (1..=128).contains(l))
                .ok_or_else(|| {
                    Error::invalid(
                        "spec.allocationPrefixLength",
                        "must be an integer from 1 to 128",
                    )
                })?,
        };
        let mut spec = as_address.checked()?;
        spec.shape = PoolShape::Prefixes { length: len };
        Ok(spec)
    }
}

impl PoolSpec {
    /// What backs the pool in a cloud (`spec.metal` or `spec.phoenixnap`),
    /// if anything.
    pub fn backing(&self) -> Option<Backing<'_>> {
        match (&self.metal, &self.phoenixnap) {
            (Some(m), _) => Some(Backing::Metal(m)),
            (None, Some(p)) => Some(Backing::Pnap(p)),
            (None, None) => None,
        }
    }

    /// Parses `spec` from JSON, reporting the exact field of any type error.
    ///
    /// # Errors
    /// 422 `Invalid` with a path like `spec.addresses[1]` for a wrong type,
    /// a missing required field, or an unknown field.
    pub fn from_json(v: &Value) -> Result<PoolSpec> {
        parse_at::<SpecIn>(v, "spec")?.checked()
    }

    /// Parses the `spec` of a pool of `kind`: a prefix pool's fields
    /// (`prefixes`, `allocationPrefixLength`, `excludedPrefixes`, …) for
    /// the prefix kinds, [`PoolSpec::from_json`] otherwise.
    ///
    /// # Errors
    /// As [`PoolSpec::from_json`], with the prefix pool's field names.
    ///
    /// ```
    /// use metal_ipam_core::ipam::pool::{PoolKind, PoolSpec};
    /// let v = serde_json::json!({"prefixes": ["fd00:1::/48"]});
    /// let spec = PoolSpec::from_json_as(PoolKind::NamespacedPrefix, &v).unwrap();
    /// assert_eq!(spec.shape.prefix_length(), Some(64));
    /// assert_eq!(spec.to_json(), serde_json::json!({"prefixes": ["fd00:1::/48"], "allocationPrefixLength": 64}));
    /// let bad = serde_json::json!({"prefixes": ["fd00:1::/48"], "allocationPrefixLength": 0});
    /// assert_eq!(PoolSpec::from_json_as(PoolKind::GlobalPrefix, &bad).unwrap_err().field(), Some("spec.allocationPrefixLength"));
    /// ```
    pub fn from_json_as(kind: PoolKind, v: &Value) -> Result<PoolSpec> {
        if kind.is_prefix() {
            parse_at::<PrefixSpecIn>(v, "spec")?.checked()
        } else {
            PoolSpec::from_json(v)
        }
    }

    /// A prefix pool's spec as JSON (the prefix pool's field names).
    fn prefix_to_json(&self, len: u8) -> Value {
        let mut m = Map::new();
        if self.backing().is_none() || !self.addresses.is_empty() {
            m.insert("prefixes".into(), self.addresses.clone().into());
        }
        m.insert("allocationPrefixLength".into(), len.into());
        if !self.excluded_addresses.is_empty() {
            m.insert(
                "excludedPrefixes".into(),
                self.excluded_addresses.clone().into(),
            );
        }
        if let Some(g) = &self.gateway {
            m.insert("gateway".into(), g.clone().into());
        }
        self.common_to_json(&mut m);
        Value::Object(m)
    }

    /// The fields both shapes share: grace period, pre-allocations, metal.
    fn common_to_json(&self, m: &mut Map<String, Value>) {
        if self.address_reuse_grace_period_seconds > 0 {
            m.insert(
                "addressReuseGracePeriodSeconds".into(),
                self.address_reuse_grace_period_seconds.into(),
            );
        }
        if !self.pre_allocations.is_empty() {
            let pa: Map<String, Value> = self
                .pre_allocations
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            m.insert("preAllocations".into(), Value::Object(pa));
        }
        if let Some(metal) = &self.metal {
            m.insert("metal".into(), metal.to_json());
        }
        if let Some(p) = &self.phoenixnap {
            m.insert("phoenixnap".into(), p.to_json());
        }
    }

    /// The spec as JSON (CRD field names; empty optional fields omitted,
    /// and a VRF-backed pool's `addresses` and `prefix` when left to its
    /// block).
    pub fn to_json(&self) -> Value {
        let (prefix, allocate_reserved) = match self.shape {
            PoolShape::Prefixes { length } => return self.prefix_to_json(length),
            PoolShape::Addresses {
                prefix,
                allocate_reserved,
            } => (prefix, allocate_reserved),
        };
        let mut m = Map::new();
        let vrf = self.backing().is_some();
        if !vrf || !self.addresses.is_empty() {
            m.insert("addresses".into(), self.addresses.clone().into());
        }
        if !vrf || prefix != 0 {
            m.insert("prefix".into(), prefix.into());
        }
        if let Some(g) = &self.gateway {
            m.insert("gateway".into(), g.clone().into());
        }
        if !self.excluded_addresses.is_empty() {
            m.insert(
                "excludedAddresses".into(),
                self.excluded_addresses.clone().into(),
            );
        }
        if allocate_reserved {
            m.insert("allocateReservedIPAddresses".into(), true.into());
        }
        self.common_to_json(&mut m);
        Value::Object(m)
    }

    /// The spec with a VRF-backed pool's left-out fields taken from its
    /// block `net/cidr`: `addresses` the block, `prefix` its length,
    /// `gateway` its first address (where Metal puts the gateway). Given
    /// fields must agree: addresses inside the block, the same prefix, the
    /// gateway's address. A pool without `metal` is returned as it is.
    ///
    /// # Errors
    /// 422 naming the field that disagrees with the block.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ipam::pool::{PoolShape, PoolSpec};
    /// let spec = PoolSpec::from_json(&serde_json::json!({"metal": {"metro": "da",
    ///     "vrf": {"ipRanges": ["10.10.0.0/16"]}, "reservation": {"network": "10.10.1.0", "cidr": 29}}})).unwrap();
    /// let full = spec.with_block("10.10.1.0".parse().unwrap(), 29).unwrap();
    /// assert_eq!((full.addresses[0].as_str(), full.shape, full.gateway.as_deref()), ("10.10.1.0/29", PoolShape::addresses(29), Some("10.10.1.1")));
    /// // .0 (network), .1 (gateway) and .7 (broadcast) are not handed out.
    /// assert_eq!(full.validate().unwrap().total(), 5);
    /// ```
    pub fn with_block(&self, net: IpAddr, cidr: u8) -> Result<PoolSpec> {
        let Some(backing) = self.backing() else {
            return Ok(self.clone());
        };
        let cloud = backing.cloud();
        let family = Family::of(net);
        let (lo, hi) = subnet_bounds(family, to_u128(net), cidr);
        let block = format!("{}/{cidr}", from_u128(family, lo));
        let mut out = self.clone();
        if out.addresses.is_empty() {
            out.addresses = vec![block.clone()];
        }
        for (i, entry) in out.addresses.iter().enumerate() {
            let inside =
                parse_entry(entry).is_ok_and(|(f, a, b)| f == family && a >= lo && b <= hi);
            if !inside {
                return Err(Error::invalid(
                    format!("spec.addresses[{i}]"),
                    format!("{entry:?} is outside the pool's {cloud} block {block}"),
                ));
            }
        }
        match &mut out.shape {
            PoolShape::Prefixes { .. } => {}
            PoolShape::Addresses { prefix: p, .. } if *p == 0 => *p = cidr,
            PoolShape::Addresses { prefix: p, .. } if *p == cidr => {}
            PoolShape::Addresses { prefix: p, .. } => {
                return Err(Error::invalid(
                    "spec.prefix",
                    format!("{p} differs from the length of the pool's {cloud} block {block}"),
                ))
            }
        }
        if !backing.gateway_in_block() {
            // No gateway of the cloud's: the pool's is what the spec says.
            return Ok(out);
        }
        let gw = from_u128(family, lo + 1).to_string();
        match out.gateway.as_deref() {
            None => out.gateway = Some(gw),
            Some(g) if g.trim().parse::<IpAddr>().ok() == gw.parse().ok() => {}
            Some(g) => {
                return Err(Error::invalid(
                    "spec.gateway",
                    format!("{g:?}: the {cloud} gateway of block {block} is {gw}"),
                ))
            }
        }
        Ok(out)
    }

    /// Validates the spec and precomputes the allocatable set.
    ///
    /// Rules (those of the in-cluster provider, plus ours):
    /// - `addresses` is non-empty and every entry parses; all entries,
    ///   exclusions, the gateway and pre-allocations share one family;
    /// - `prefix` is at most 32 for IPv4, 128 for IPv6, and every address
    ///   lies inside the subnet formed by the first address and `prefix`;
    /// - unless `allocateReservedIPAddresses`, the subnet's network address
    ///   and (IPv4) broadcast address are not handed out (none for IPv4 /31
    ///   and /32 or IPv6 /127 and /128, which have no such addresses), nor is
    ///   the gateway;
    /// - every pre-allocation names a valid claim name and an allocatable
    ///   address, and no address is pre-allocated twice.
    ///
    /// # Errors
    /// 422 `Invalid` naming the first offending field.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ipam::pool::{PoolShape, PoolSpec};
    /// let spec = PoolSpec { addresses: vec!["10.0.0.0/29".into()], shape: PoolShape::addresses(29),
    ///     gateway: Some("10.0.0.1".into()), ..Default::default() };
    /// let pool = spec.validate().unwrap();
    /// // .0 (network), .1 (gateway) and .7 (broadcast) are not handed out.
    /// assert_eq!(pool.total(), 5);
    /// ```
    pub fn validate(&self) -> Result<ValidatedPool> {
        if let Some(backing) = self.backing() {
            backing.validate()?;
            let cloud = backing.cloud();
            if backing.pnap().is_some() && self.shape.prefix_length().is_some() {
                return Err(Error::invalid(
                    "spec.phoenixnap",
                    "a phoenixNAP network puts single addresses on servers: back an address pool with it, not a prefix pool",
                ));
            }
            if let Some((net, cidr)) = backing.block() {
                if let Some(len) = self.shape.prefix_length().filter(|l| *l <= cidr) {
                    // The block's first sub-prefix holds Metal's gateway:
                    // a sub-prefix as long as the block is all of it.
                    return Err(Error::invalid(
                        "spec.allocationPrefixLength",
                        format!("/{len} does not split the Metal block /{cidr}: a VRF-backed prefix pool hands out sub-prefixes longer than its block (Metal's gateway holds the first)"),
                    ));
                }
                return self.with_block(net, cidr)?.validate_shape();
            }
            let known = match self.shape {
                PoolShape::Prefixes { .. } => true,
                PoolShape::Addresses { prefix, .. } => prefix != 0,
            };
            if self.addresses.is_empty() || !known {
                let (what, field) = match backing {
                    Backing::Metal(_) => ("adopted Metal reservation", "spec.metal.reservation.id"),
                    Backing::Pnap(p) if p.kind() == crate::ipam::pnap::NetworkKind::Public => {
                        ("phoenixNAP IP block", "spec.phoenixnap.ipBlock")
                    }
                    Backing::Pnap(_) => (
                        "adopted phoenixNAP network",
                        "spec.phoenixnap.privateNetwork",
                    ),
                };
                return Err(Error::new(
                    ErrorKind::Invalid,
                    BLOCK_UNKNOWN,
                    format!("the pool's addresses come from its {what}, which is read from {cloud} when the pool is provisioned"),
                )
                .with_field(field));
            }
        }
        self.validate_shape()
    }

    /// [`PoolSpec::validate`] without the Metal section, for either shape.
    fn validate_shape(&self) -> Result<ValidatedPool> {
        match self.shape {
            PoolShape::Prefixes { length } => self.validate_prefixes(length),
            PoolShape::Addresses {
                prefix,
                allocate_reserved,
            } => self.validate_addresses(prefix, allocate_reserved),
        }
    }

    /// A prefix pool's rules (those of the in-cluster provider's
    /// `InClusterPrefixPool`, for IPv4 too):
    /// - `prefixes` is non-empty; every entry is a CIDR whose host bits are
    ///   zero; all entries, exclusions, the gateway and pre-allocations
    ///   share one family;
    /// - `allocationPrefixLength` is at least every prefix's length and at
    ///   most the family's bits (32 or 128);
    /// - a sub-prefix overlapping an `excludedPrefixes` entry is never
    ///   handed out; the gateway is handed out with every sub-prefix and
    ///   blocks none, except in a VRF-backed pool, where Metal's gateway
    ///   holds an address of the block and its sub-prefix is not handed
    ///   out;
    /// - every pre-allocation is a sub-prefix of the pool (`net/len` with
    ///   the allocation length, or `net`), given to one claim.
    fn validate_prefixes(&self, len: u8) -> Result<ValidatedPool> {
        if self.addresses.is_empty() {
            return Err(Error::invalid(
                "spec.prefixes",
                "must list at least one CIDR",
            ));
        }
        check_entry_count("spec.prefixes", self.addresses.len())?;
        check_entry_count("spec.excludedPrefixes", self.excluded_addresses.len())?;
        let mut family = None;
        let mut nets = Vec::with_capacity(self.addresses.len());
        for (i, entry) in self.addresses.iter().enumerate() {
            let field = format!("spec.prefixes[{i}]");
            let net = aligned_cidr(entry).map_err(|m| Error::invalid(&field, m))?;
            check_family(&mut family, Family::of(net.addr()), &field)?;
            nets.push(net);
        }
        let family = family.unwrap_or(Family::V6);
        if len > family.bits() {
            return Err(Error::invalid(
                "spec.allocationPrefixLength",
                format!(
                    "must be at most {} for {}",
                    family.bits(),
                    family_name(family)
                ),
            ));
        }
        if let Some((i, net)) = nets.iter().enumerate().find(|(_, n)| n.prefix_len() > len) {
            return Err(Error::invalid(
                format!("spec.prefixes[{i}]"),
                format!("{net} is longer than allocationPrefixLength /{len}: it holds no /{len}"),
            ));
        }
        let shift = family.bits() - len;
        let unit = |(a, b): (u128, u128)| (a >> shift, b >> shift);
        let configured: Vec<(u128, u128)> = nets
            .iter()
            .map(|n| unit(subnet_bounds(family, to_u128(n.addr()), n.prefix_len())))
            .collect();
        let mut excluded: Vec<(u128, u128)> =
            ranges(&self.excluded_addresses, "spec.excludedPrefixes", family)?
                .into_iter()
                .map(unit)
                .collect();
        let gateway = self.gateway_ip(family)?;
        if let (Some(g), Some(_)) = (gateway, self.backing()) {
            let v = to_u128(g) >> shift;
            excluded.push((v, v));
        }
        let configured = RangeSet::from_ranges(configured);
        let allocatable = configured.difference(&RangeSet::from_ranges(excluded));
        let (pre_allocations, pre_allocated) =
            self.pre_allocated(family, &allocatable, Some(len))?;
        Ok(ValidatedPool {
            family,
            prefix: len,
            gateway,
            configured,
            allocatable,
            pre_allocations,
            pre_allocated,
            grace_seconds: u64::from(self.address_reuse_grace_period_seconds),
            shift,
        })
    }

    /// [`PoolSpec::validate`] of an address pool without the Metal section.
    fn validate_addresses(&self, prefix: u8, allocate_reserved: bool) -> Result<ValidatedPool> {
        if self.addresses.is_empty() {
            return Err(Error::invalid(
                "spec.addresses",
                "must list at least one address, range or CIDR",
            ));
        }
        check_entry_count("spec.addresses", self.addresses.len())?;
        check_entry_count("spec.excludedAddresses", self.excluded_addresses.len())?;
        let (family, configured) = self.configured(prefix)?;
        let first = configured.first().map_or(0, |r| r.0);
        let (net, last) = subnet_bounds(family, first, prefix);
        let excluded = ranges(&self.excluded_addresses, "spec.excludedAddresses", family)?;
        // Sort and sweep (`RangeSet`): O(n log n) whatever the order of
        // the entries.
        let configured = RangeSet::from_ranges(configured);
        let mut allocatable = configured.difference(&RangeSet::from_ranges(excluded));
        let gateway = self.gateway_ip(family)?;
        if !allocate_reserved {
            let reserved_edges = match family {
                Family::V4 => prefix < 31,
                Family::V6 => prefix < 127,
            };
            if reserved_edges {
                allocatable.remove(net);
                if family == Family::V4 {
                    allocatable.remove(last);
                }
            }
            if let Some(g) = gateway {
                allocatable.remove(to_u128(g));
            }
        }
        let (pre_allocations, pre_allocated) = self.pre_allocated(family, &allocatable, None)?;
        Ok(ValidatedPool {
            family,
            prefix,
            gateway,
            configured,
            allocatable,
            pre_allocations,
            pre_allocated,
            grace_seconds: u64::from(self.address_reuse_grace_period_seconds),
            shift: 0,
        })
    }

    /// `spec.addresses` as ranges, their one family, checked against
    /// `spec.prefix`: at most the family's bits, every entry inside the
    /// subnet of the first address.
    fn configured(&self, prefix: u8) -> Result<(Family, Vec<(u128, u128)>)> {
        let mut family = None;
        let mut configured = Vec::with_capacity(self.addresses.len());
        for (i, entry) in self.addresses.iter().enumerate() {
            let field = format!("spec.addresses[{i}]");
            let (f, a, b) = parse_entry(entry).map_err(|m| Error::invalid(&field, m))?;
            check_family(&mut family, f, &field)?;
            configured.push((a, b));
        }
        let family = family.unwrap_or(Family::V4);
        if prefix > family.bits() {
            return Err(Error::invalid(
                "spec.prefix",
                format!(
                    "must be at most {} for {}",
                    family.bits(),
                    family_name(family)
                ),
            ));
        }
        let first = configured.first().map_or(0, |r| r.0);
        let (net, last) = subnet_bounds(family, first, prefix);
        for (i, &(a, b)) in configured.iter().enumerate() {
            if a < net || b > last {
                return Err(Error::invalid(
                    format!("spec.addresses[{i}]"),
                    format!(
                        "{:?} is outside {}/{}, the subnet of the first address and spec.prefix",
                        self.addresses[i],
                        from_u128(family, net),
                        prefix
                    ),
                ));
            }
        }
        Ok((family, configured))
    }

    /// `spec.gateway`, an address of the pool's family.
    fn gateway_ip(&self, family: Family) -> Result<Option<IpAddr>> {
        let Some(g) = &self.gateway else {
            return Ok(None);
        };
        let ip: IpAddr = g
            .trim()
            .parse()
            .map_err(|_| Error::invalid("spec.gateway", format!("{g:?} is not an IP address")))?;
        check_family(&mut Some(family), Family::of(ip), "spec.gateway")?;
        Ok(Some(ip))
    }

    /// `spec.preAllocations`: valid claim names, each an allocatable value
    /// of its own: an address, or with `len` (a prefix pool) a sub-prefix
    /// of that length ([`sub_prefix`]) as its number. Also the set of those
    /// values.
    fn pre_allocated(
        &self,
        family: Family,
        allocatable: &RangeSet,
        len: Option<u8>,
    ) -> Result<(BTreeMap<String, u128>, RangeSet)> {
        let shift = len.map_or(0, |l| family.bits() - l);
        let shown = |ip: IpAddr| match len {
            Some(l) => format!("{ip}/{l}"),
            None => ip.to_string(),
        };
        let mut pre_allocations = BTreeMap::new();
        let mut holders: BTreeMap<u128, &str> = BTreeMap::new();
        for (claim, given) in &self.pre_allocations {
            let field = format!("spec.preAllocations.{claim}");
            names::check_subdomain(claim).map_err(|m| Error::invalid(&field, m))?;
            let ip = match len {
                Some(l) => sub_prefix(given, l).map_err(|m| Error::invalid(&field, m))?,
                None => given.trim().parse().map_err(|_| {
                    Error::invalid(&field, format!("{given:?} is not an IP address"))
                })?,
            };
            check_family(&mut Some(family), Family::of(ip), &field)?;
            let v = to_u128(ip) >> shift;
            if !allocatable.contains(v) {
                let what = if len.is_some() {
                    "a sub-prefix this pool hands out (outside prefixes, or excluded)"
                } else {
                    "an allocatable address of this pool (outside addresses, excluded or reserved)"
                };
                return Err(Error::invalid(
                    &field,
                    format!("{} is not {what}", shown(ip)),
                ));
            }
            if holders.insert(v, claim).is_some() {
                return Err(Error::invalid(
                    &field,
                    format!("{} is pre-allocated to another claim too", shown(ip)),
                ));
            }
            pre_allocations.insert(claim.clone(), v);
        }
        // `holders` is in ascending order, so building the set is O(p log p).
        let set = RangeSet::from_ranges(holders.into_keys().map(|v| (v, v)));
        Ok((pre_allocations, set))
    }
}

/// The entries of the list at `field` as ranges, all of `family`.
fn ranges(entries: &[String], field: &str, family: Family) -> Result<Vec<(u128, u128)>> {
    let mut out = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("{field}[{i}]");
        let (f, a, b) = parse_entry(entry).map_err(|m| Error::invalid(&field, m))?;
        check_family(&mut Some(family), f, &field)?;
        out.push((a, b));
    }
    Ok(out)
}

/// 422 when a list has more than [`MAX_ENTRIES`] entries.
fn check_entry_count(field: &str, n: usize) -> Result<()> {
    if n > MAX_ENTRIES {
        return Err(Error::invalid(
            field,
            format!("must have at most {MAX_ENTRIES} entries, has {n}"),
        ));
    }
    Ok(())
}

fn check_family(seen: &mut Option<Family>, f: Family, field: &str) -> Result<()> {
    match seen {
        Some(s) if *s != f => Err(Error::invalid(
            field,
            format!(
                "is {} but the pool is {}: a pool holds one family",
                family_name(f),
                family_name(*s)
            ),
        )),
        _ => {
            *seen = Some(f);
            Ok(())
        }
    }
}

pub use id::{PoolId, PoolKind};
pub use object::PoolObject;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(addresses: &[&str], prefix: u8) -> PoolSpec {
        PoolSpec {
            addresses: addresses.iter().map(|s| s.to_string()).collect(),
            shape: PoolShape::addresses(prefix),
            ..Default::default()
        }
    }

    #[test]
    fn v4_cidr_skips_network_broadcast_and_gateway() {
        let mut s = spec(&["192.168.0.0/24"], 24);
        s.gateway = Some("192.168.0.1".into());
        let p = s.validate().unwrap();
        assert_eq!(p.total(), 253);
        assert_eq!(
            p.allocatable.first(),
            Some(to_u128("192.168.0.2".parse().unwrap()))
        );
        s.shape = PoolShape::Addresses {
            prefix: 24,
            allocate_reserved: true,
        };
        assert_eq!(s.validate().unwrap().total(), 256);
    }

    #[test]
    fn v6_64_is_one_range_and_skips_only_anycast() {
        let p = spec(&["2001:db8::/64"], 64).validate().unwrap();
        assert_eq!(p.allocatable.ranges().len(), 1);
        assert_eq!(p.total(), (1u128 << 64) - 1);
        assert_eq!(
            p.ip(p.allocatable.first().unwrap()).to_string(),
            "2001:db8::1"
        );
    }

    #[test]
    fn point_to_point_prefixes_reserve_nothing() {
        assert_eq!(spec(&["10.0.0.0/31"], 31).validate().unwrap().total(), 2);
        assert_eq!(spec(&["10.0.0.9"], 32).validate().unwrap().total(), 1);
    }

    #[test]
    fn exclusions_and_ranges() {
        let mut s = spec(&["10.0.0.10-10.0.0.20", "10.0.0.50"], 24);
        s.excluded_addresses = vec!["10.0.0.12-10.0.0.13".into(), "10.0.0.50".into()];
        assert_eq!(s.validate().unwrap().total(), 9);
    }

    #[test]
    fn errors_name_the_field() {
        let cases: Vec<(PoolSpec, &str)> = vec![
            (spec(&[], 24), "spec.addresses"),
            (spec(&["10.0.0.1", "nope"], 24), "spec.addresses[1]"),
            (spec(&["10.0.0.1", "2001:db8::1"], 24), "spec.addresses[1]"),
            (spec(&["10.0.0.1"], 33), "spec.prefix"),
            (spec(&["10.0.0.1", "10.0.1.1"], 24), "spec.addresses[1]"),
            (
                PoolSpec {
                    gateway: Some("2001:db8::1".into()),
                    ..spec(&["10.0.0.0/24"], 24)
                },
                "spec.gateway",
            ),
            (
                PoolSpec {
                    excluded_addresses: vec!["x".into()],
                    ..spec(&["10.0.0.0/24"], 24)
                },
                "spec.excludedAddresses[0]",
            ),
            (
                PoolSpec {
                    pre_allocations: [("m1".to_string(), "10.0.0.0".to_string())].into(),
                    ..spec(&["10.0.0.0/24"], 24)
                },
                "spec.preAllocations.m1",
            ),
            (
                PoolSpec {
                    pre_allocations: [
                        ("m1".to_string(), "10.0.0.5".to_string()),
                        ("m2".to_string(), "10.0.0.5".to_string()),
                    ]
                    .into(),
                    ..spec(&["10.0.0.0/24"], 24)
                },
                "spec.preAllocations.m2",
            ),
            (
                PoolSpec {
                    pre_allocations: [("Bad_Name".to_string(), "10.0.0.5".to_string())].into(),
                    ..spec(&["10.0.0.0/24"], 24)
                },
                "spec.preAllocations.Bad_Name",
            ),
        ];
        for (s, field) in cases {
            let e = s.validate().unwrap_err();
            assert_eq!(e.status(), 422, "{e}");
            assert_eq!(e.field(), Some(field), "{e}");
        }
    }

    #[test]
    fn lists_longer_than_the_cap_are_refused_naming_the_list() {
        let ips: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!("10.1.{}.{}", i / 256, i % 256))
            .collect();
        let at_cap = PoolSpec {
            addresses: ips[..MAX_ENTRIES].to_vec(),
            shape: PoolShape::addresses(16),
            ..Default::default()
        };
        assert!(at_cap.validate().is_ok());
        let over = PoolSpec {
            addresses: ips.clone(),
            ..at_cap.clone()
        };
        let e = over.validate().unwrap_err();
        assert_eq!(
            (e.status(), e.field()),
            (422, Some("spec.addresses")),
            "{e}"
        );
        assert_eq!(
            e.message(),
            format!(
                "must have at most {MAX_ENTRIES} entries, has {}",
                MAX_ENTRIES + 1
            )
        );
        let over = PoolSpec {
            excluded_addresses: ips,
            ..at_cap
        };
        let e = over.validate().unwrap_err();
        assert_eq!(
            (e.status(), e.field()),
            (422, Some("spec.excludedAddresses")),
            "{e}"
        );
        assert!(e.message().contains("at most 1024 entries"), "{e}");
    }

    #[test]
    fn a_spec_with_the_most_entries_validates() {
        // The worst order for one-by-one insertion: descending, disjoint
        // ranges of 4 addresses (10.2.0.0/16, 8 apart); every exclusion
        // splits a range in two and comes in another order (interleaved).
        let v4 = |v: u32| std::net::Ipv4Addr::from(0x0a02_0000 + v).to_string();
        let addresses: Vec<String> = (0..MAX_ENTRIES as u32)
            .rev()
            .map(|i| format!("{}-{}", v4(8 * i + 1), v4(8 * i + 4)))
            .collect();
        let excluded: Vec<String> = (0..MAX_ENTRIES as u32)
            .map(|i| v4(8 * ((i * 7) % MAX_ENTRIES as u32) + 2))
            .collect();
        let pre: BTreeMap<String, String> = (0..MAX_ENTRIES as u32)
            .rev()
            .map(|i| (format!("m-{i}"), v4(8 * i + 4)))
            .collect();
        let s = PoolSpec {
            addresses,
            shape: PoolShape::addresses(16),
            excluded_addresses: excluded,
            pre_allocations: pre,
            ..Default::default()
        };
        let p = s.validate().unwrap();
        assert_eq!(p.configured.ranges().len(), MAX_ENTRIES);
        assert_eq!(p.configured.len(), 4 * MAX_ENTRIES as u128);
        // Each range loses one address to its exclusion: .1 and .3-.4 remain.
        assert_eq!(p.allocatable.ranges().len(), 2 * MAX_ENTRIES);
        assert_eq!(p.total(), 3 * MAX_ENTRIES as u128);
        assert_eq!(p.pre_allocated.len(), MAX_ENTRIES as u128);
        assert_eq!(p.pre_allocations.len(), MAX_ENTRIES);
    }

    #[test]
    fn spec_json_round_trips_and_reports_type_errors() {
        let v = json!({"addresses": ["10.0.0.0/24"], "prefix": 24, "gateway": "10.0.0.1",
            "excludedAddresses": ["10.0.0.9"], "allocateReservedIPAddresses": true,
            "addressReuseGracePeriodSeconds": 30, "preAllocations": {"m1": "10.0.0.7"}});
        let s = PoolSpec::from_json(&v).unwrap();
        assert_eq!(s.to_json(), v);
        for (bad, field) in [
            (json!({"prefix": 24}), "spec.addresses"),
            (
                json!({"addresses": "10.0.0.1", "prefix": 24}),
                "spec.addresses",
            ),
            (json!({"addresses": [1], "prefix": 24}), "spec.addresses[0]"),
            (json!({"addresses": ["10.0.0.1"]}), "spec.prefix"),
            (
                json!({"addresses": ["10.0.0.1"], "prefix": -1}),
                "spec.prefix",
            ),
            (
                json!({"addresses": ["10.0.0.1"], "prefix": 24, "addressReuseGracePeriodSeconds": -5}),
                "spec.addressReuseGracePeriodSeconds",
            ),
            (
                json!({"addresses": ["10.0.0.1"], "prefix": 24, "colour": "red"}),
                "spec.colour",
            ),
        ] {
            let e = PoolSpec::from_json(&bad).unwrap_err();
            assert_eq!(e.field(), Some(field), "{bad}: {e}");
        }
    }

    #[test]
    fn spec_fields_lists_what_the_parser_accepts() {
        for f in SPEC_FIELDS {
            let mut v = json!({"addresses": ["10.0.0.1"], "prefix": 24});
            v[*f] = Value::Null;
            if let Err(e) = PoolSpec::from_json(&v) {
                assert!(!e.message().contains("unknown field"), "{f}: {e}");
            }
        }
        let e = PoolSpec::from_json(&json!({"colour": 1})).unwrap_err();
        assert!(e.message().contains("unknown field"), "{e}");
        for f in SPEC_FIELDS {
            assert!(e.message().contains(f), "{f} is not among the fields: {e}");
        }
    }

    #[test]
    fn object_envelope_checks() {
        let id = PoolId::namespaced("ns1", "p");
        let good = json!({"apiVersion": API_VERSION, "kind": "MetalIPPool",
            "metadata": {"name": "p", "resourceVersion": "7"}, "spec": {"addresses": ["10.0.0.1"], "prefix": 24}});
        let o = PoolObject::parse(&id, &good).unwrap();
        assert_eq!(o.metadata.get("namespace"), Some(&json!("ns1")));
        assert!(!o.metadata.contains_key("resourceVersion"));
        let mut wrong_kind = good.clone();
        wrong_kind["kind"] = json!("GlobalMetalIPPool");
        assert_eq!(
            PoolObject::parse(&id, &wrong_kind).unwrap_err().field(),
            Some("kind")
        );
        let mut wrong_name = good.clone();
        wrong_name["metadata"]["name"] = json!("q");
        assert_eq!(
            PoolObject::parse(&id, &wrong_name).unwrap_err().field(),
            Some("metadata.name")
        );
        let mut ns_on_global = good.clone();
        ns_on_global["kind"] = json!("GlobalMetalIPPool");
        ns_on_global["metadata"]["namespace"] = json!("x");
        assert_eq!(
            PoolObject::parse(&PoolId::global("p"), &ns_on_global)
                .unwrap_err()
                .field(),
            Some("metadata.namespace")
        );
        assert_eq!(
            PoolObject::parse(&id, &json!([1])).unwrap_err().status(),
            400
        );
    }
}
