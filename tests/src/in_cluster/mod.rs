//! An emulation of what the in-cluster IPAM provider
//! (kubernetes-sigs/cluster-api-ipam-provider-in-cluster, v1.1.x) does to
//! the API server, for the takeover tests: builders for objects exactly as
//! it writes them, and [`InCluster`], one reconcile pass of its controllers
//! over a [`Kube`] (FakeKube or the real API server).
//!
//! We cannot run the provider (Go, no image here), so this module owns a
//! faithful copy of its observable behaviour, taken from its code (facts
//! only; paths are in that repository):
//! - `pkg/ipamutil/reconciler.go`: the claim lifecycle — pause checks, the
//!   claim finalizer, create-or-patch of the `IPAddress` named after the
//!   claim (ownerReferences, `cluster.x-k8s.io/cluster-name` label copied
//!   from the claim, `ProtectAddress` finalizer), `status.addressRef`, and
//!   the deletion order (address finalizer off, address deleted, claim
//!   finalizer off);
//! - `pkg/ipamutil/address.go`: the `IPAddress` it builds (name and
//!   namespace of the claim, `claimRef`, `poolRef`) and its
//!   ownerReferences (claim: `controller: true, blockOwnerDeletion: true`
//!   through `SetControllerReference`; pool: `controller: false,
//!   blockOwnerDeletion: true`, set explicitly);
//! - `internal/controllers/ipaddressclaim_address.go` and
//!   `internal/poolutil/pool.go`: the lowest free address (pool addresses
//!   minus excluded, minus network and broadcast (IPv4) or the first
//!   address (IPv6) of the subnet the first address and `spec.prefix` give
//!   unless `allocateReservedIPAddresses`, minus the gateway, minus every
//!   `IPAddress` of the pool), and the reuse grace period
//!   (`addressReuseGracePeriodSeconds`, not applied when the pool is gone or
//!   deleting);
//! - `internal/controllers/ipaddressclaim_prefix.go`,
//!   `internal/controllers/inclusterprefixpool.go`,
//!   `internal/poolutil/prefix.go`: prefix pools (first free aligned
//!   sub-prefix of `allocationPrefixLength`, default 64; the gateway is
//!   carried, never blocked) and their status;
//! - `internal/controllers/inclusterippool.go`: pool status
//!   `ipAddresses{total, used, free, outOfRange}` and the `ProtectPool`
//!   finalizer, dropped from a deleting pool at zero addresses;
//! - `internal/index/index.go`: a pool's addresses are the `IPAddress`es
//!   whose `spec.poolRef` has its kind and name (the index value is
//!   `kind/name`, no group) in the pool's namespace (all namespaces for a
//!   global pool).
//!
//! v1.1.x sets no claim condition (no `Ready`): only `status.addressRef`.
//! Not emulated: the provider's webhooks (pool validation, v1alpha1
//! conversion), leader election, the 5 s cache-visibility poll (our reads
//! are direct), and re-queue timing (a test runs passes until quiet).
//!
//! Not verified against a v1.1.x tag: the IP pool status count. The code
//! read (`inclusterippool.go`, v1alpha2 with `outOfRange`) counts `total`
//! over `spec.addresses` alone (minus the gateway when inside), not minus
//! excluded or reserved addresses; [`ip_pool_status`] does the same.

mod sets;

use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use serde_json::{json, Map, Value};

use crate::fake_kube::{CLUSTER_GROUP, IPAM_GROUP};
use crate::kube::Kube;
use sets::{family_bits, parse_entries, prefix_range, show, to_int, RangeSet};

/// The in-cluster pools' API version (their storage version).
pub const POOL_API_VERSION: &str = "ipam.cluster.x-k8s.io/v1alpha2";
/// The API version the provider (built against CAPI v1beta2) writes claims
/// and addresses in, and names in the claim ownerReference.
pub const CAPI_IPAM_API_VERSION: &str = "ipam.cluster.x-k8s.io/v1beta2";
/// The claim finalizer (`ipamutil.ReleaseAddressFinalizer`).
pub const RELEASE_ADDRESS_FINALIZER: &str = "ipam.cluster.x-k8s.io/ReleaseAddress";
/// The `IPAddress` finalizer (`ipamutil.ProtectAddressFinalizer`).
pub const PROTECT_ADDRESS_FINALIZER: &str = "ipam.cluster.x-k8s.io/ProtectAddress";
/// The pool finalizer (`controllers.ProtectPoolFinalizer`).
pub const PROTECT_POOL_FINALIZER: &str = "ipam.cluster.x-k8s.io/ProtectPool";
/// The label copied from a claim to its `IPAddress`, and the Cluster
/// lookup when `spec.clusterName` is empty.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// CAPI's pause annotation (on a claim, its Cluster or its pool).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// The default `allocationPrefixLength` of prefix pools.
pub const DEFAULT_ALLOCATION_PREFIX_LENGTH: u8 = 64;

/// One of the provider's four pool kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// `InClusterIPPool` (namespaced).
    InClusterIPPool,
    /// `GlobalInClusterIPPool` (cluster-scoped).
    GlobalInClusterIPPool,
    /// `InClusterPrefixPool` (namespaced, IPv6 sub-prefixes).
    InClusterPrefixPool,
    /// `GlobalInClusterPrefixPool` (cluster-scoped).
    GlobalInClusterPrefixPool,
}

impl PoolKind {
    /// All four.
    pub const ALL: [PoolKind; 4] = [
        PoolKind::InClusterIPPool,
        PoolKind::GlobalInClusterIPPool,
        PoolKind::InClusterPrefixPool,
        PoolKind::GlobalInClusterPrefixPool,
    ];

    /// The `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            PoolKind::InClusterIPPool => "InClusterIPPool",
            PoolKind::GlobalInClusterIPPool => "GlobalInClusterIPPool",
            PoolKind::InClusterPrefixPool => "InClusterPrefixPool",
            PoolKind::GlobalInClusterPrefixPool => "GlobalInClusterPrefixPool",
        }
    }

    /// The resource (plural).
    pub fn plural(self) -> &'static str {
        match self {
            PoolKind::InClusterIPPool => "inclusterippools",
            PoolKind::GlobalInClusterIPPool => "globalinclusterippools",
            PoolKind::InClusterPrefixPool => "inclusterprefixpools",
            PoolKind::GlobalInClusterPrefixPool => "globalinclusterprefixpools",
        }
    }

    /// Whether the kind is cluster-scoped.
    pub fn is_global(self) -> bool {
        matches!(
            self,
            PoolKind::GlobalInClusterIPPool | PoolKind::GlobalInClusterPrefixPool
        )
    }

    /// Whether it hands out sub-prefixes.
    pub fn is_prefix(self) -> bool {
        matches!(
            self,
            PoolKind::InClusterPrefixPool | PoolKind::GlobalInClusterPrefixPool
        )
    }

    /// The kind a claim's `poolRef` names, if it is one of these (group
    /// `ipam.cluster.x-k8s.io` and kind, as `pkg/predicates/references.go`
    /// filters).
    pub fn of_pool_ref(pool_ref: &Value) -> Option<PoolKind> {
        if pool_ref.get("apiGroup").and_then(Value::as_str) != Some(IPAM_GROUP) {
            return None;
        }
        let kind = pool_ref.get("kind").and_then(Value::as_str)?;
        PoolKind::ALL.into_iter().find(|k| k.kind() == kind)
    }
}

// ---------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

/// A pool as it stands once the provider has seen it: `spec` as given and
/// the `ProtectPool` finalizer (its status comes with [`InCluster`]'s pool
/// pass, or [`ip_pool_status`]/[`prefix_pool_status`] put by the test).
/// `namespace` is ignored for global kinds.
pub fn pool(kind: PoolKind, namespace: &str, name: &str, spec: Value) -> Value {
    let mut metadata = json!({"name": name, "finalizers": [PROTECT_POOL_FINALIZER]});
    if !kind.is_global() {
        metadata["namespace"] = json!(namespace);
    }
    json!({
        "apiVersion": POOL_API_VERSION,
        "kind": kind.kind(),
        "metadata": metadata,
        "spec": spec,
    })
}

/// An `IPAddressClaim` as a consumer (CAPV, CAPM3) creates it: v1beta2,
/// `spec.poolRef` to an in-cluster pool and, when `cluster` is given, the
/// `cluster.x-k8s.io/cluster-name` label (consumers set the label, not
/// `spec.clusterName`).
pub fn claim(
    namespace: &str,
    name: &str,
    kind: PoolKind,
    pool: &str,
    cluster: Option<&str>,
) -> Value {
    let mut c = json!({
        "apiVersion": CAPI_IPAM_API_VERSION,
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"poolRef": {"apiGroup": IPAM_GROUP, "kind": kind.kind(), "name": pool}},
    });
    if let Some(cluster) = cluster {
        c["metadata"]["labels"] = json!({ CLUSTER_NAME_LABEL: cluster });
    }
    c
}

/// The ownerReference to the claim (`SetControllerReference`).
fn claim_owner_ref(claim: &Value) -> Value {
    json!({
        "apiVersion": CAPI_IPAM_API_VERSION,
        "kind": "IPAddressClaim",
        "name": str_at(claim, "/metadata/name"),
        "uid": str_at(claim, "/metadata/uid"),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// The ownerReference to the pool (`SetOwnerReference`, then
/// `controller: false, blockOwnerDeletion: true`).
fn pool_owner_ref(pool: &Value) -> Value {
    json!({
        "apiVersion": POOL_API_VERSION,
        "kind": str_at(pool, "/kind"),
        "name": str_at(pool, "/metadata/name"),
        "uid": str_at(pool, "/metadata/uid"),
        "controller": false,
        "blockOwnerDeletion": true,
    })
}

/// The `IPAddress` the provider writes for a claim, exactly: name and
/// namespace of the claim, `spec.address`/`prefix`/`gateway` (gateway left
/// out when empty), `claimRef`, `poolRef {apiGroup, kind, name}`,
/// ownerReferences claim (controller) then pool (not controller, both
/// blocking deletion), the claim's `cluster.x-k8s.io/cluster-name` label if
/// it has one, and the `ProtectAddress` finalizer. `claim` and `pool` must
/// be stored objects (their `uid`s are used).
pub fn ip_address(
    claim: &Value,
    pool: &Value,
    address: &str,
    prefix: u8,
    gateway: Option<&str>,
) -> Value {
    let name = str_at(claim, "/metadata/name");
    let mut spec = json!({
        "address": address,
        "prefix": prefix,
        "claimRef": {"name": name},
        "poolRef": {
            "apiGroup": IPAM_GROUP,
            "kind": str_at(pool, "/kind"),
            "name": str_at(pool, "/metadata/name"),
        },
    });
    if let Some(gw) = gateway.filter(|g| !g.is_empty()) {
        spec["gateway"] = json!(gw);
    }
    let mut metadata = json!({
        "name": name,
        "namespace": str_at(claim, "/metadata/namespace"),
        "ownerReferences": [claim_owner_ref(claim), pool_owner_ref(pool)],
        "finalizers": [PROTECT_ADDRESS_FINALIZER],
    });
    if let Some(cluster) = claim
        .pointer("/metadata/labels")
        .and_then(|l| l.get(CLUSTER_NAME_LABEL))
    {
        metadata["labels"] = json!({ CLUSTER_NAME_LABEL: cluster });
    }
    json!({
        "apiVersion": CAPI_IPAM_API_VERSION,
        "kind": "IPAddress",
        "metadata": metadata,
        "spec": spec,
    })
}

/// A claim as the provider leaves it once bound: the `ReleaseAddress`
/// finalizer added and `status.addressRef.name` set (no conditions in
/// v1.1.x). Put it with [`Kube::put`].
pub fn bound_claim(claim: &Value, address_name: &str) -> Value {
    let mut c = claim.clone();
    add_finalizer(&mut c, RELEASE_ADDRESS_FINALIZER);
    c["status"] = json!({"addressRef": {"name": address_name}});
    c
}

/// Status of an IP pool (`InClusterIPPoolStatusIPAddresses`).
pub fn ip_pool_status(total: i64, used: i64, free: i64, out_of_range: i64) -> Value {
    json!({"ipAddresses": {"total": total, "used": used, "free": free, "outOfRange": out_of_range}})
}

/// Status of a prefix pool (same shape, counted in sub-prefixes).
pub fn prefix_pool_status(total: i64, used: i64, free: i64, out_of_range: i64) -> Value {
    ip_pool_status(total, used, free, out_of_range)
}

// ---------------------------------------------------------------------------
// Metadata helpers
// ---------------------------------------------------------------------------

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn has_finalizer(obj: &Value, f: &str) -> bool {
    finalizers(obj).iter().any(|x| x == f)
}

/// Appends `f` if missing (`controllerutil.AddFinalizer`).
fn add_finalizer(obj: &mut Value, f: &str) {
    let mut fs = finalizers(obj);
    if !fs.iter().any(|x| x == f) {
        fs.push(f.to_owned());
        obj["metadata"]["finalizers"] = json!(fs);
    }
}

/// Removes `f` (`controllerutil.RemoveFinalizer`).
fn remove_finalizer(obj: &mut Value, f: &str) {
    let fs: Vec<String> = finalizers(obj).into_iter().filter(|x| x != f).collect();
    obj["metadata"]["finalizers"] = json!(fs);
}

fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

fn has_annotation(obj: &Value, a: &str) -> bool {
    obj.pointer("/metadata/annotations")
        .and_then(|m| m.get(a))
        .is_some()
}

/// Upserts an ownerReference the way controllerutil does: one with the same
/// group, kind and name is replaced.
fn upsert_owner_ref(refs: &mut Vec<Value>, new: Value) {
    let group = |r: &Value| {
        str_at(r, "/apiVersion")
            .split('/')
            .next()
            .unwrap_or("")
            .to_owned()
    };
    let same = |r: &Value| {
        group(r) == group(&new)
            && str_at(r, "/kind") == str_at(&new, "/kind")
            && str_at(r, "/name") == str_at(&new, "/name")
    };
    match refs.iter_mut().find(|r| same(r)) {
        Some(r) => *r = new,
        None => refs.push(new),
    }
}

/// Seconds since the epoch of an RFC 3339 UTC time (`2026-12-05T23:35:49Z`,
/// as the API server writes `deletionTimestamp`).
fn parse_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + mi * 60 + se).ok()
}

// ---------------------------------------------------------------------------
// Allocation
// ---------------------------------------------------------------------------

/// What a pool's spec allows, derived as the provider derives it.
enum Allocator {
    /// An IP pool: allocatable set, in-use blockers (the gateway), family,
    /// prefix written, gateway written, and the raw addresses set (for
    /// status).
    Ip {
        allocatable: RangeSet,
        spec_set: RangeSet,
        gateway: Option<u128>,
        v4: bool,
        prefix: u8,
        gateway_text: Option<String>,
    },
    /// A prefix pool: pool set, excluded set, family, allocation length.
    Prefix {
        pool: RangeSet,
        excluded: RangeSet,
        v4: bool,
        len: u8,
        gateway_text: Option<String>,
    },
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl Allocator {
    fn of(kind: PoolKind, pool: &Value) -> Result<Allocator, String> {
        let spec = pool.get("spec").cloned().unwrap_or(Value::Null);
        let gateway_text = spec
            .get("gateway")
            .and_then(Value::as_str)
            .filter(|g| !g.is_empty())
            .map(str::to_owned);
        if kind.is_prefix() {
            let prefixes = strings(spec.get("prefixes"));
            let mut pool_set = RangeSet::new();
            let mut v4 = false;
            for p in &prefixes {
                let net: IpNet = p.parse().map_err(|e| format!("prefix {p:?}: {e}"))?;
                v4 = matches!(net, IpNet::V4(_));
                let (a, b) = prefix_range(net);
                pool_set.add(a, b);
            }
            let excluded_entries = strings(spec.get("excludedPrefixes"));
            let (excluded, _) = parse_entries(excluded_entries.iter().map(String::as_str))?;
            let len = spec
                .get("allocationPrefixLength")
                .and_then(Value::as_u64)
                .filter(|&l| l > 0)
                .map_or(DEFAULT_ALLOCATION_PREFIX_LENGTH, |l| {
                    u8::try_from(l).unwrap_or(128)
                });
            return Ok(Allocator::Prefix {
                pool: pool_set,
                excluded,
                v4,
                len,
                gateway_text,
            });
        }
        let addresses = strings(spec.get("addresses"));
        let (spec_set, v4) = parse_entries(addresses.iter().map(String::as_str))?;
        let mut allocatable = spec_set.clone();
        let excluded_entries = strings(spec.get("excludedAddresses"));
        let (excluded, _) = parse_entries(excluded_entries.iter().map(String::as_str))?;
        allocatable.remove_set(&excluded);
        let prefix = spec.get("prefix").and_then(Value::as_u64).unwrap_or(0);
        let prefix = u8::try_from(prefix).unwrap_or(128);
        let reserved_ok = spec
            .get("allocateReservedIPAddresses")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if let (false, Some(&(first, _))) = (reserved_ok, spec_set.ranges().first()) {
            let bits = family_bits(v4);
            let host = bits.saturating_sub(u32::from(prefix));
            let mask: u128 = if host >= 128 {
                u128::MAX
            } else {
                (1u128 << host) - 1
            };
            let net = first & !mask;
            allocatable.remove(net, net); // network (IPv4) / anycast (IPv6)
            if v4 {
                let bcast = net | mask;
                allocatable.remove(bcast, bcast);
            }
        }
        let gateway = match &gateway_text {
            Some(g) => {
                let ip: std::net::IpAddr = g.parse().map_err(|e| format!("gateway {g:?}: {e}"))?;
                let n = to_int(ip);
                allocatable.remove(n, n);
                Some(n)
            }
            None => None,
        };
        Ok(Allocator::Ip {
            allocatable,
            spec_set,
            gateway,
            v4,
            prefix,
            gateway_text,
        })
    }

    /// The lowest free address (or sub-prefix) given the pool's addresses:
    /// `(address, prefix)`.
    fn allocate(&self, in_use: &[Value]) -> Option<(String, u8)> {
        match self {
            Allocator::Ip {
                allocatable,
                gateway,
                v4,
                prefix,
                ..
            } => {
                let mut used = RangeSet::new();
                for a in in_use {
                    if let Ok(ip) = str_at(a, "/spec/address").parse() {
                        let n = to_int(ip);
                        used.add(n, n);
                    }
                }
                if let Some(g) = gateway {
                    used.add(*g, *g);
                }
                allocatable
                    .lowest_not_in(&used)
                    .map(|n| (show(n, *v4), *prefix))
            }
            Allocator::Prefix { .. } => {
                let free = self.prefix_free_set(in_use);
                free.ranges()
                    .first()
                    .map(|&(a, _)| (show(a, self.v4()), self.len()))
            }
        }
    }

    fn v4(&self) -> bool {
        match self {
            Allocator::Ip { v4, .. } | Allocator::Prefix { v4, .. } => *v4,
        }
    }

    fn len(&self) -> u8 {
        match self {
            Allocator::Ip { prefix, .. } => *prefix,
            Allocator::Prefix { len, .. } => *len,
        }
    }

    fn gateway_text(&self) -> Option<&str> {
        match self {
            Allocator::Ip { gateway_text, .. } | Allocator::Prefix { gateway_text, .. } => {
                gateway_text.as_deref()
            }
        }
    }

    /// The host mask of an allocation.
    fn block_mask(&self) -> u128 {
        let host = family_bits(self.v4()).saturating_sub(u32::from(self.len()));
        if host >= 128 {
            u128::MAX
        } else {
            (1u128 << host) - 1
        }
    }

    /// The prefix (first, last) of an in-use address (`PrefixFromIPAddress`:
    /// `address/prefix`, masked).
    fn address_prefix(a: &Value) -> Option<(u128, u128, u8)> {
        let prefix = u8::try_from(a.pointer("/spec/prefix").and_then(Value::as_u64)?).ok()?;
        let net: IpNet = format!("{}/{prefix}", str_at(a, "/spec/address"))
            .parse()
            .ok()?;
        let (lo, hi) = prefix_range(net);
        Some((lo, hi, prefix))
    }

    /// Allocatable aligned blocks: the pool minus every block that overlaps
    /// `blocked` (excluded, plus in-use prefixes when given).
    fn prefix_free_set(&self, in_use: &[Value]) -> RangeSet {
        let Allocator::Prefix { pool, excluded, .. } = self else {
            return RangeSet::new();
        };
        let mask = self.block_mask();
        let mut blocked = excluded.clone();
        for a in in_use {
            if let Some((lo, hi, _)) = Self::address_prefix(a) {
                blocked.add(lo, hi);
            }
        }
        let mut free = RangeSet::new();
        for &(a, b) in pool.ranges() {
            // Only whole aligned blocks of the pool range.
            let start = if a & mask == 0 {
                Some(a)
            } else {
                (a | mask).checked_add(1)
            };
            let end = if b & mask == mask {
                Some(b)
            } else {
                (b & !mask).checked_sub(1)
            };
            if let (Some(start), Some(end)) = (start, end) {
                if start <= end {
                    free.add(start, end);
                }
            }
        }
        for &(a, b) in blocked.ranges() {
            free.remove(a & !mask, b | mask);
        }
        free
    }

    /// `ipAddresses` status.
    fn status(&self, in_use: &[Value]) -> Value {
        let used = i64::try_from(in_use.len()).unwrap_or(i64::MAX);
        match self {
            Allocator::Ip {
                spec_set, gateway, ..
            } => {
                let mut total = spec_set.count();
                if gateway.is_some_and(|g| spec_set.contains(g)) && total < i64::MAX {
                    total -= 1;
                }
                let mut outside = RangeSet::new();
                for a in in_use {
                    if let Ok(ip) = str_at(a, "/spec/address").parse() {
                        let n = to_int(ip);
                        outside.add(n, n);
                    }
                }
                outside.remove_set(spec_set);
                ip_pool_status(total, used, total.saturating_sub(used), outside.count())
            }
            Allocator::Prefix { pool, excluded, .. } => {
                let shift = family_bits(self.v4()).saturating_sub(u32::from(self.len()));
                let total = self
                    .prefix_free_set(&[])
                    .ranges()
                    .iter()
                    .fold(0u128, |acc, &(a, b)| {
                        acc.saturating_add(((b - a) >> shift).saturating_add(1))
                    });
                let total = i64::try_from(total).unwrap_or(i64::MAX);
                let mask = self.block_mask();
                let out_of_range = in_use
                    .iter()
                    .filter(|a| match Self::address_prefix(a) {
                        Some((lo, hi, p)) => {
                            p != self.len()
                                || lo & mask != 0
                                || !pool.contains_range(lo, hi)
                                || excluded.overlaps(lo, hi)
                        }
                        None => true,
                    })
                    .count();
                let out_of_range = i64::try_from(out_of_range).unwrap_or(i64::MAX);
                let free = total
                    .saturating_sub(used)
                    .saturating_add(out_of_range)
                    .max(0);
                prefix_pool_status(total, used, free, out_of_range)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The controller
// ---------------------------------------------------------------------------

/// One write the emulated controller made, in order. Keys are
/// `namespace/name` (`name` for a global pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// An `IPAddress` created for a claim.
    AddressCreated {
        /// The address's key (= the claim's).
        key: String,
        /// `spec.address`.
        address: String,
        /// `spec.prefix`.
        prefix: u8,
    },
    /// An existing `IPAddress`'s ownerReferences, label or finalizer
    /// re-ensured (create-or-patch on an address already there).
    AddressPatched {
        /// The address's key.
        key: String,
    },
    /// A claim's finalizer and/or `status.addressRef` written.
    ClaimBound {
        /// The claim's key.
        key: String,
    },
    /// The finalizer added to a claim the controller could not serve yet
    /// (pool missing or paused, or no address free).
    ClaimFinalizerAdded {
        /// The claim's key.
        key: String,
    },
    /// `ProtectAddress` removed from an `IPAddress` of a deleting claim.
    AddressFinalizerRemoved {
        /// The address's key.
        key: String,
    },
    /// An `IPAddress` deleted.
    AddressDeleted {
        /// The address's key.
        key: String,
    },
    /// `ReleaseAddress` removed from a deleting claim.
    ClaimFinalizerRemoved {
        /// The claim's key.
        key: String,
    },
    /// A pool's finalizer or status written.
    PoolUpdated {
        /// The pool's kind.
        kind: PoolKind,
        /// The pool's key.
        key: String,
    },
}

/// What one pass did: its writes in order, and the claims it left alone
/// with the reason (as the provider logs and returns).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Every write, in order.
    pub writes: Vec<Write>,
    /// `(claim key, reason)` for every claim of ours not (fully) served.
    pub skipped: Vec<(String, String)>,
}

impl Pass {
    /// The `spec.address` of every address created, in order.
    pub fn created(&self) -> Vec<String> {
        self.writes
            .iter()
            .filter_map(|w| match w {
                Write::AddressCreated { address, .. } => Some(address.clone()),
                _ => None,
            })
            .collect()
    }
}

/// The in-cluster provider's controllers, one pass at a time, over a
/// [`Kube`] (writes as the admin). A pass reconciles every claim whose
/// `poolRef` is one of [`kinds`](Self::kinds), in namespace/name order (the
/// provider runs one worker), then every pool's finalizer and status.
#[derive(Debug)]
pub struct InCluster<'a> {
    kube: &'a Kube,
    kinds: Vec<PoolKind>,
    now: Option<u64>,
}

impl<'a> InCluster<'a> {
    /// The controller for all four pool kinds, on the wall clock.
    pub fn new(kube: &'a Kube) -> InCluster<'a> {
        InCluster {
            kube,
            kinds: PoolKind::ALL.to_vec(),
            now: None,
        }
    }

    /// Only these kinds (a provider running with some controllers only).
    pub fn kinds(mut self, kinds: &[PoolKind]) -> InCluster<'a> {
        self.kinds = kinds.to_vec();
        self
    }

    /// Reads "now" (seconds since the epoch) as `now` for the reuse grace
    /// period instead of the wall clock.
    pub fn at(mut self, now: u64) -> InCluster<'a> {
        self.now = Some(now);
        self
    }

    fn now(&self) -> u64 {
        self.now.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        })
    }

    /// One pass: claims, then pools.
    pub fn reconcile(&self) -> Pass {
        let mut pass = self.reconcile_claims();
        let pools = self.reconcile_pools();
        pass.writes.extend(pools.writes);
        pass.skipped.extend(pools.skipped);
        pass
    }

    /// Passes until one writes nothing (at most `max`), returning every
    /// write; the provider's re-queues, compressed.
    ///
    /// # Panics
    /// If the last of `max` passes still wrote something.
    pub fn settle(&self, max: usize) -> Pass {
        let mut all = Pass::default();
        for _ in 0..max {
            let pass = self.reconcile();
            let quiet = pass.writes.is_empty();
            all.writes.extend(pass.writes);
            all.skipped = pass.skipped;
            if quiet {
                return all;
            }
        }
        panic!("the in-cluster emulation did not settle in {max} passes: {all:?}");
    }

    fn pool_of(&self, kind: PoolKind, claim_ns: &str, name: &str) -> Option<Value> {
        let ns = (!kind.is_global()).then_some(claim_ns);
        self.kube.get(IPAM_GROUP, kind.plural(), ns, name)
    }

    /// The addresses of a pool (`ListAddressesInUse`: poolRef kind and name,
    /// in the pool's namespace, every namespace for a global pool).
    fn addresses_of(&self, all: &[Value], kind: PoolKind, pool: &Value) -> Vec<Value> {
        let pool_ns = str_at(pool, "/metadata/namespace");
        let name = str_at(pool, "/metadata/name");
        all.iter()
            .filter(|a| {
                str_at(a, "/spec/poolRef/kind") == kind.kind()
                    && str_at(a, "/spec/poolRef/name") == name
                    && (kind.is_global() || str_at(a, "/metadata/namespace") == pool_ns)
            })
            .cloned()
            .collect()
    }

    /// Every claim pass (see [`reconcile`](Self::reconcile)).
    pub fn reconcile_claims(&self) -> Pass {
        let mut pass = Pass::default();
        for claim in self.kube.list(IPAM_GROUP, "ipaddressclaims") {
            let Some(kind) = claim
                .pointer("/spec/poolRef")
                .and_then(PoolKind::of_pool_ref)
            else {
                continue;
            };
            if !self.kinds.contains(&kind) {
                continue;
            }
            self.reconcile_claim(&claim, kind, &mut pass);
        }
        pass
    }

    fn reconcile_claim(&self, claim: &Value, kind: PoolKind, pass: &mut Pass) {
        let ns = str_at(claim, "/metadata/namespace");
        let name = str_at(claim, "/metadata/name");
        let ckey = key(ns, name);
        let skip = |pass: &mut Pass, why: &str| pass.skipped.push((ckey.clone(), why.to_owned()));
        // The event filter drops paused claims.
        if has_annotation(claim, PAUSED_ANNOTATION) {
            skip(pass, "claim paused");
            return;
        }
        let deleting = is_deleting(claim);
        let cluster_name = match str_at(claim, "/spec/clusterName") {
            "" => claim
                .pointer("/metadata/labels")
                .and_then(|l| l.get(CLUSTER_NAME_LABEL))
                .and_then(Value::as_str)
                .unwrap_or(""),
            n => n,
        };
        if !cluster_name.is_empty() {
            match self
                .kube
                .get(CLUSTER_GROUP, "clusters", Some(ns), cluster_name)
            {
                None if deleting => {
                    // A deleting claim proceeds without its Cluster.
                    self.reconcile_delete(claim, pass);
                    return;
                }
                None => {
                    skip(pass, "cluster not found");
                    return;
                }
                Some(c) => {
                    let paused = c.pointer("/spec/paused").and_then(Value::as_bool) == Some(true)
                        || has_annotation(&c, PAUSED_ANNOTATION);
                    if paused {
                        skip(pass, "cluster paused");
                        return;
                    }
                }
            }
        }
        let pool_name = str_at(claim, "/spec/poolRef/name");
        // From here the provider's patch helper writes the claim's
        // finalizer on every return.
        let Some(pool) = self.pool_of(kind, ns, pool_name) else {
            if deleting {
                self.reconcile_delete(claim, pass);
            } else {
                self.add_claim_finalizer(claim, pass);
                skip(pass, "pool not found");
            }
            return;
        };
        if has_annotation(&pool, PAUSED_ANNOTATION) {
            if !deleting {
                self.add_claim_finalizer(claim, pass);
            }
            skip(pass, "pool paused");
            return;
        }
        if deleting {
            if let Some(until) = self.grace_until(claim, &pool) {
                if self.now() < until {
                    skip(pass, &format!("reuse grace period until {until}"));
                    return;
                }
            }
            self.reconcile_delete(claim, pass);
            return;
        }
        self.reconcile_live(claim, kind, &pool, pass);
    }

    /// When a deleting claim's release may happen, if a grace period holds
    /// it (`IPAddressClaimHandler.ReleaseAddress`).
    fn grace_until(&self, claim: &Value, pool: &Value) -> Option<u64> {
        if is_deleting(pool) {
            return None;
        }
        let grace = pool
            .pointer("/spec/addressReuseGracePeriodSeconds")
            .and_then(Value::as_u64)
            .filter(|&g| g > 0)?;
        let deleted = parse_rfc3339(str_at(claim, "/metadata/deletionTimestamp"))?;
        Some(deleted + grace)
    }

    fn add_claim_finalizer(&self, claim: &Value, pass: &mut Pass) {
        if has_finalizer(claim, RELEASE_ADDRESS_FINALIZER) {
            return;
        }
        let mut c = claim.clone();
        add_finalizer(&mut c, RELEASE_ADDRESS_FINALIZER);
        self.kube.put(c);
        pass.writes.push(Write::ClaimFinalizerAdded {
            key: key(
                str_at(claim, "/metadata/namespace"),
                str_at(claim, "/metadata/name"),
            ),
        });
    }

    fn reconcile_live(&self, claim: &Value, kind: PoolKind, pool: &Value, pass: &mut Pass) {
        let ns = str_at(claim, "/metadata/namespace");
        let name = str_at(claim, "/metadata/name");
        let ckey = key(ns, name);
        let all = self.kube.list(IPAM_GROUP, "ipaddresses");
        let in_use = self.addresses_of(&all, kind, pool);
        let allocated = in_use
            .iter()
            .any(|a| str_at(a, "/metadata/name") == name && str_at(a, "/metadata/namespace") == ns);
        let existing = self.kube.get(IPAM_GROUP, "ipaddresses", Some(ns), name);
        let address = match (allocated, existing) {
            (true, Some(existing)) => {
                // Create-or-patch on an address already there: owner refs,
                // label and finalizer re-ensured; the spec stays.
                let desired = self.ensure_address_meta(&existing, claim, pool);
                if desired != existing {
                    self.kube.put(desired);
                    pass.writes
                        .push(Write::AddressPatched { key: ckey.clone() });
                }
                name.to_owned()
            }
            (false, Some(_)) => {
                // The provider would try to patch another pool's address's
                // immutable spec and be refused.
                self.add_claim_finalizer(claim, pass);
                pass.skipped.push((
                    ckey,
                    "an IPAddress of that name belongs to another pool".into(),
                ));
                return;
            }
            (_, None) => {
                let alloc = match Allocator::of(kind, pool) {
                    Ok(a) => a,
                    Err(e) => {
                        self.add_claim_finalizer(claim, pass);
                        pass.skipped.push((ckey, format!("pool spec: {e}")));
                        return;
                    }
                };
                let Some((addr, prefix)) = alloc.allocate(&in_use) else {
                    self.add_claim_finalizer(claim, pass);
                    pass.skipped.push((ckey, "no address available".into()));
                    return;
                };
                let obj = ip_address(claim, pool, &addr, prefix, alloc.gateway_text());
                self.kube.create(obj);
                pass.writes.push(Write::AddressCreated {
                    key: ckey.clone(),
                    address: addr,
                    prefix,
                });
                name.to_owned()
            }
        };
        let mut bound = bound_claim(claim, &address);
        // Keep any other status the claim has (v1.1.x writes only addressRef).
        if let (Some(Value::Object(old)), Some(Value::Object(new))) =
            (claim.get("status"), bound.get_mut("status"))
        {
            let mut merged: Map<String, Value> = old.clone();
            merged.extend(new.clone());
            *new = merged;
        }
        if &bound != claim {
            self.kube.put(bound);
            pass.writes.push(Write::ClaimBound { key: ckey });
        }
    }

    /// The existing address with the provider's metadata ensured.
    fn ensure_address_meta(&self, existing: &Value, claim: &Value, pool: &Value) -> Value {
        let mut a = existing.clone();
        let mut refs: Vec<Value> = a
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let another_controller = refs.iter().any(|r| {
            r.get("controller").and_then(Value::as_bool) == Some(true)
                && !(str_at(r, "/kind") == "IPAddressClaim"
                    && str_at(r, "/name") == str_at(claim, "/metadata/name"))
        });
        if !another_controller {
            upsert_owner_ref(&mut refs, claim_owner_ref(claim));
        }
        upsert_owner_ref(&mut refs, pool_owner_ref(pool));
        a["metadata"]["ownerReferences"] = json!(refs);
        if let Some(cluster) = claim
            .pointer("/metadata/labels")
            .and_then(|l| l.get(CLUSTER_NAME_LABEL))
        {
            if a.pointer("/metadata/labels").is_none_or(Value::is_null) {
                a["metadata"]["labels"] = json!({});
            }
            a["metadata"]["labels"][CLUSTER_NAME_LABEL] = cluster.clone();
        }
        if !is_deleting(&a) {
            add_finalizer(&mut a, PROTECT_ADDRESS_FINALIZER);
        }
        a
    }

    /// `reconcileDelete`: the address's finalizer off, the address deleted,
    /// then the claim's finalizer off.
    fn reconcile_delete(&self, claim: &Value, pass: &mut Pass) {
        let ns = str_at(claim, "/metadata/namespace");
        let name = str_at(claim, "/metadata/name");
        let k = key(ns, name);
        if let Some(addr) = self.kube.get(IPAM_GROUP, "ipaddresses", Some(ns), name) {
            if has_finalizer(&addr, PROTECT_ADDRESS_FINALIZER) {
                let mut a = addr.clone();
                remove_finalizer(&mut a, PROTECT_ADDRESS_FINALIZER);
                self.kube.put(a);
                pass.writes
                    .push(Write::AddressFinalizerRemoved { key: k.clone() });
            }
            if self
                .kube
                .delete(IPAM_GROUP, "ipaddresses", Some(ns), name)
                .is_some()
            {
                pass.writes.push(Write::AddressDeleted { key: k.clone() });
            }
        }
        if has_finalizer(claim, RELEASE_ADDRESS_FINALIZER) {
            // Re-read: the address's deletion may have touched nothing here,
            // but the claim we hold may be stale after earlier writes.
            let current = self
                .kube
                .get(IPAM_GROUP, "ipaddressclaims", Some(ns), name)
                .unwrap_or_else(|| claim.clone());
            let mut c = current;
            remove_finalizer(&mut c, RELEASE_ADDRESS_FINALIZER);
            self.kube.put(c);
            pass.writes.push(Write::ClaimFinalizerRemoved { key: k });
        }
    }

    /// Every pool pass: the `ProtectPool` finalizer (removed from a
    /// deleting pool with no addresses) and the status counts.
    pub fn reconcile_pools(&self) -> Pass {
        let mut pass = Pass::default();
        let all = self.kube.list(IPAM_GROUP, "ipaddresses");
        for &kind in &self.kinds {
            for pool in self.kube.list(IPAM_GROUP, kind.plural()) {
                let in_use = self.addresses_of(&all, kind, &pool);
                let mut p = pool.clone();
                let pkey = key(
                    str_at(&pool, "/metadata/namespace"),
                    str_at(&pool, "/metadata/name"),
                );
                add_finalizer(&mut p, PROTECT_POOL_FINALIZER);
                if is_deleting(&pool) {
                    if in_use.is_empty() {
                        remove_finalizer(&mut p, PROTECT_POOL_FINALIZER);
                    }
                } else {
                    match Allocator::of(kind, &pool) {
                        Ok(alloc) => p["status"] = alloc.status(&in_use),
                        Err(e) => pass.skipped.push((pkey.clone(), format!("pool spec: {e}"))),
                    }
                }
                if p != pool {
                    self.kube.put(p);
                    pass.writes.push(Write::PoolUpdated { kind, key: pkey });
                }
            }
        }
        pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2026-11-29T18:17:07Z"), Some(1_795_976_227));
        assert_eq!(
            parse_rfc3339(&crate::fake_kube::FakeKube::path(
                IPAM_GROUP,
                "ipaddresses",
                None,
                None
            )),
            None
        );
    }

    #[test]
    fn pool_ref_kinds() {
        let r = json!({"apiGroup": IPAM_GROUP, "kind": "GlobalInClusterIPPool", "name": "p"});
        assert_eq!(
            PoolKind::of_pool_ref(&r),
            Some(PoolKind::GlobalInClusterIPPool)
        );
        let other =
            json!({"apiGroup": "ipam.metal-ipam.dev", "kind": "InClusterIPPool", "name": "p"});
        assert_eq!(PoolKind::of_pool_ref(&other), None);
    }
}
