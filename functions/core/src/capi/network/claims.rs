//! A machine's per-VLAN claims: the slots of a profile (their identity
//! and its hash, see the module docs of [`super`]), the claims that serve
//! them, created, adopted from list-index names, or deleted when stale.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{json, Value};

use super::{MachineNetwork, MACHINE_LABEL, SLOT_ANNOTATION, SLOT_LABEL};
use crate::error::{Error, Result};
use crate::ipam::claim::{PoolRef, CLUSTER_NAME_LABEL};
use crate::kube::object::{metadata, Object, ObjectMeta, OwnerReference};
use crate::kube::{self, names, Kube, KubeError};
use crate::network::node::Slot;
use crate::network::profile::{PoolName, Profile, VlanRef};
use crate::ports::http::HttpClient;

/// FNV-1a, 64 bits: a short stable hash of a slot's identity (names and
/// labels; not a security boundary).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// [`MACHINE_LABEL`]'s value for machine `name`.
///
/// ```
/// use metal_ipam_core::capi::network::machine_label;
/// assert_eq!(machine_label("md-0-x7f"), "md-0-x7f");
/// assert!(machine_label(&"m".repeat(64)).starts_with("h-"));
/// ```
pub fn machine_label(name: &str) -> String {
    // A DNS subdomain of at most 63 characters is a valid label value.
    if name.len() <= 63 {
        name.to_string()
    } else {
        format!("h-{:016x}", fnv(name))
    }
}

fn pool_ident(p: &PoolName) -> String {
    format!("{}/{}", p.kind.as_deref().unwrap_or("MetalIPPool"), p.name)
}

fn vlan_ident(r: &VlanRef, metro: &str) -> String {
    match (&r.id, r.vxlan, &r.pool) {
        (Some(id), _, _) => format!("id:{}", id.to_ascii_lowercase()),
        (_, Some(n), _) => format!("vxlan:{metro}/{n}"),
        (_, _, Some(p)) => format!("pool:{}", pool_ident(p)),
        _ => "?".into(),
    }
}

/// One pool address of a profile: which port and slot, from which pool,
/// and its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSlot<'a> {
    /// The port.
    pub port: &'a str,
    /// The slot on the port (its place in the profile's lists).
    pub slot: Slot,
    /// The pool the address comes from.
    pub pool: &'a PoolName,
    /// What it is for (port, VLAN or elastic IP, pool), for people.
    pub identity: String,
    /// The identity's hash: [`SLOT_LABEL`] and the tail of the claim's name.
    pub key: String,
}

impl PoolSlot<'_> {
    /// The claim's name for machine `machine`.
    pub fn claim_name(&self, machine: &str) -> String {
        let what = match self.slot {
            Slot::Vlan(_) => "vlan",
            Slot::Elastic(_) => "elastic",
        };
        format!("{machine}-{}-{what}-{}", self.port, self.key)
    }

    /// The claim's name before claims were identified (by list index).
    fn legacy_name(&self, machine: &str) -> String {
        match self.slot {
            Slot::Vlan(j) => format!("{machine}-{}-vlan-{j}", self.port),
            Slot::Elastic(k) => format!("{machine}-{}-elastic-{k}", self.port),
        }
    }
}

/// Every pool address of the profile, one claim each (see the module
/// docs for the identity).
///
/// ```
/// use metal_ipam_core::capi::network::pool_slots;
/// use metal_ipam_core::network::profile::Profile;
/// let p = |vlans: serde_json::Value| Profile::from_json(&serde_json::json!(
///     {"metro": "da", "ports": [{"name": "bond0", "vlans": vlans}]})).unwrap();
/// let a = p(serde_json::json!([{"vxlan": 1011, "addresses": [{"pool": {"name": "nodes"}}]}]));
/// let b = p(serde_json::json!([{"vxlan": 1010}, {"vxlan": 1011, "addresses": [{"pool": {"name": "nodes"}}]}]));
/// let c = p(serde_json::json!([{"vxlan": 1011, "addresses": [{"pool": {"name": "stor"}}]}]));
/// let key = |p: &Profile| pool_slots(p)[0].key.clone();
/// assert_eq!(key(&a), key(&b), "a VLAN inserted before it changes nothing");
/// assert_ne!(key(&a), key(&c), "another pool is another claim");
/// assert_eq!(pool_slots(&a)[0].claim_name("m-0"), format!("m-0-bond0-vlan-{}", key(&a)));
/// ```
pub fn pool_slots(profile: &Profile) -> Vec<PoolSlot<'_>> {
    let metro = profile
        .metro
        .as_deref()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let mut out = Vec::new();
    for port in &profile.ports {
        for (j, v) in port.vlans.iter().enumerate() {
            if let Some(pool) = v.addresses.iter().find_map(|a| a.pool.as_ref()) {
                let identity = format!(
                    "{} vlan {} pool {}",
                    port.name,
                    vlan_ident(&v.vlan(), &metro),
                    pool_ident(pool)
                );
                out.push((port.name.as_str(), Slot::Vlan(j), pool, identity));
            }
        }
        for (k, e) in port.elastic_ips.iter().enumerate() {
            let ordinal = port.elastic_ips[..k]
                .iter()
                .filter(|x| x.pool == e.pool)
                .count();
            let identity = format!(
                "{} elastic-ip pool {} #{ordinal}",
                port.name,
                pool_ident(&e.pool)
            );
            out.push((port.name.as_str(), Slot::Elastic(k), &e.pool, identity));
        }
    }
    out.into_iter()
        .map(|(port, slot, pool, identity)| PoolSlot {
            port,
            slot,
            pool,
            key: format!("{:010x}", fnv(&identity) >> 24),
            identity,
        })
        .collect()
}

/// A claim as the network step reads it.
#[derive(Debug, Clone, Default, PartialEq)]
struct NetClaim {
    metadata: ObjectMeta,
    /// `spec.poolRef` (kind, name).
    pool: (String, String),
}

impl Object for NetClaim {
    fn from_json(v: &Value) -> Self {
        let s = |p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        NetClaim {
            metadata: metadata(v),
            pool: (s("/spec/poolRef/kind"), s("/spec/poolRef/name")),
        }
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

impl NetClaim {
    fn of_machine(&self, machine: &str) -> bool {
        self.metadata
            .owner_references
            .iter()
            .any(|r| r.kind == "Machine" && r.name == machine)
    }

    fn is_from(&self, p: &PoolName) -> bool {
        let kind = p.kind.as_deref().unwrap_or("MetalIPPool");
        self.pool.0 == kind && self.pool.1 == p.name
    }
}

/// The machine's labelled claims (one list of its namespace's claims with
/// [`MACHINE_LABEL`]), owned by a Machine of that name.
fn labelled_claims<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
) -> Result<Vec<NetClaim>> {
    let selector = format!("{MACHINE_LABEL}={}", machine_label(name));
    Ok(kube
        .list_as_selected::<NetClaim>(&kube::CLAIMS, Some(ns), Some(&selector))?
        .into_iter()
        .filter(|c| c.of_machine(name))
        .collect())
}

/// Whether a claim name is one of `machine`'s profile claims by its name
/// (both namings: `<machine>-<port>-vlan-…`, `<machine>-<port>-elastic-…`).
fn named_for(claim: &str, machine: &str) -> bool {
    claim.strip_prefix(machine).is_some_and(|rest| {
        rest.starts_with('-') && (rest.contains("-vlan-") || rest.contains("-elastic-"))
    })
}

/// The live claims of every Machine, grouped once so that finding a
/// Machine's claims costs a lookup, not a pass over every claim: by
/// (namespace, machine label value) and by (namespace, the machine name
/// [`named_for`] would accept). A claim is in the first map once and in
/// the second once per `-` before its `-vlan-`/`-elastic-` part.
#[derive(Default)]
pub(super) struct ClaimsOfMachines<'c> {
    by_label: BTreeMap<(&'c str, &'c str), Vec<&'c ObjectMeta>>,
    by_name: BTreeMap<(&'c str, &'c str), Vec<&'c ObjectMeta>>,
}

impl<'c> ClaimsOfMachines<'c> {
    pub(super) fn new(claims: &[&'c ObjectMeta]) -> Self {
        let mut out = ClaimsOfMachines::default();
        for &c in claims.iter().filter(|c| !c.deleting()) {
            let ns = c.namespace.as_deref().unwrap_or_default();
            if let Some(l) = c.label(MACHINE_LABEL) {
                out.by_label.entry((ns, l)).or_default().push(c);
            }
            for (i, _) in c.name.match_indices('-') {
                let machine = &c.name[..i];
                if named_for(&c.name, machine) {
                    out.by_name.entry((ns, machine)).or_default().push(c);
                }
            }
        }
        out
    }

    /// Machine `ns/name`'s claims: its label's, then those named for it
    /// without the label, each once.
    pub(super) fn of(&self, ns: &str, name: &str) -> Vec<&'c ObjectMeta> {
        let label = machine_label(name);
        let mut out: Vec<&'c ObjectMeta> = self
            .by_label
            .get(&(ns, label.as_str()))
            .cloned()
            .unwrap_or_default();
        for c in self.by_name.get(&(ns, name)).into_iter().flatten() {
            if c.label(MACHINE_LABEL) != Some(label.as_str()) {
                out.push(c);
            }
        }
        out
    }
}

/// What [`ensure_claims`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// Claims created.
    pub created: usize,
    /// Claims under the old naming adopted (labelled; addresses kept).
    pub adopted: usize,
    /// Claims that no longer match the profile (to delete once allowed).
    pub stale: Vec<String>,
}

/// Makes the machine's claims match the profile: creates the claim of
/// every pool address of the profile that has none, owned by the Machine
/// (garbage-collected with it, so its address is released through the
/// allocator) and labelled with its cluster, the machine and the slot;
/// adopts claims of the old naming that still match; returns the claims
/// that no longer match, for [`delete_stale`]. Names are checked before
/// anything is created.
///
/// # Idempotency
/// A second call creates nothing and finds the same stale claims.
///
/// # Errors
/// 422 for a claim name that is not a valid Kubernetes name (a machine
/// name near the length limit); API server errors.
pub fn ensure_claims<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    m: &MachineNetwork,
) -> Result<Claims> {
    let slots = pool_slots(&m.profile);
    for s in &slots {
        let claim = s.claim_name(name);
        names::check_subdomain(&claim)
            .map_err(|e| Error::invalid("metadata.name", format!("claim {claim}: {e}")))?;
    }
    let mut out = Claims::default();
    let mut have = labelled_claims(kube, ns, name)?;
    // Upgrade: no labelled claim yet, but the profile has pool addresses:
    // the machine's claims of the old naming, once.
    if have.is_empty() && !slots.is_empty() {
        let legacy: Vec<NetClaim> = kube
            .list_as::<NetClaim>(&kube::CLAIMS, Some(ns))?
            .into_iter()
            .filter(|c| c.of_machine(name) && named_for(&c.metadata.name, name))
            .filter(|c| c.metadata.label(SLOT_LABEL).is_none() && !c.metadata.deleting())
            .collect();
        for c in legacy {
            let slot = slots
                .iter()
                .find(|s| s.legacy_name(name) == c.metadata.name && c.is_from(s.pool));
            match slot {
                Some(s) => {
                    let patch = json!({"metadata": {
                        "labels": {MACHINE_LABEL: machine_label(name), SLOT_LABEL: s.key},
                        "annotations": {SLOT_ANNOTATION: s.identity}}});
                    let labelled =
                        kube.merge_patch(&kube::CLAIMS, Some(ns), &c.metadata.name, false, &patch)?;
                    have.push(NetClaim::from_json(&labelled));
                    out.adopted += 1;
                }
                None => out.stale.push(c.metadata.name.clone()),
            }
        }
    }
    let keys: BTreeSet<&str> = slots.iter().map(|s| s.key.as_str()).collect();
    for c in &have {
        let current = c
            .metadata
            .label(SLOT_LABEL)
            .is_some_and(|k| keys.contains(k));
        if !current && !c.metadata.deleting() {
            out.stale.push(c.metadata.name.clone());
        }
    }
    for s in &slots {
        if have
            .iter()
            .any(|c| c.metadata.label(SLOT_LABEL) == Some(s.key.as_str()))
        {
            // Ours already (or still going: created again once gone).
            continue;
        }
        let object = NewClaim::for_slot(s, ns, name, m);
        match kube.create(&kube::CLAIMS, Some(ns), &object.to_json()) {
            Ok(_) => out.created += 1,
            Err(KubeError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// A per-VLAN `IPAddressClaim` as created: labelled with its machine and
/// slot, owned (controller) by the Machine, its `poolRef` the slot's pool.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewClaim {
    api_version: String,
    kind: &'static str,
    metadata: NewClaimMeta,
    spec: NewClaimSpec,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewClaimMeta {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner_references: Vec<OwnerReference>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewClaimSpec {
    pool_ref: PoolRef,
}

impl NewClaim {
    fn for_slot(s: &PoolSlot<'_>, ns: &str, machine: &str, m: &MachineNetwork) -> NewClaim {
        let mut labels = BTreeMap::from([
            (MACHINE_LABEL.to_string(), machine_label(machine)),
            (SLOT_LABEL.to_string(), s.key.clone()),
        ]);
        if let Some(c) = &m.cluster {
            labels.insert(CLUSTER_NAME_LABEL.to_string(), c.clone());
        }
        let owner = OwnerReference::owner(
            &kube::MACHINES.api_version(),
            "Machine",
            machine,
            &m.uid,
            true,
        );
        NewClaim {
            api_version: kube::CLAIMS.api_version(),
            kind: "IPAddressClaim",
            metadata: NewClaimMeta {
                name: s.claim_name(machine),
                namespace: ns.to_string(),
                labels,
                annotations: BTreeMap::from([(SLOT_ANNOTATION.to_string(), s.identity.clone())]),
                owner_references: vec![owner],
            },
            spec: NewClaimSpec {
                pool_ref: PoolRef {
                    api_group: Some(crate::ipam::pool::GROUP.to_string()),
                    kind: s.pool.kind.as_deref().unwrap_or("MetalIPPool").to_string(),
                    name: s.pool.name.clone(),
                },
            },
        }
    }

    fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Deletes claims [`ensure_claims`] found stale (their addresses are
/// released through the allocator); returns how many were still there.
///
/// # Errors
/// API server errors.
pub fn delete_stale<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    stale: &[String],
) -> Result<usize> {
    let mut deleted = 0;
    for c in stale {
        if kube.delete(&kube::CLAIMS, Some(ns), c)? {
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Deletes every claim the profile made for the machine (owned by the
/// Machine `uid`, labelled for it or named after it under either naming),
/// so their addresses are released through the allocator; returns how
/// many. A profile's claims are found without the profile, which may be
/// gone. (One list of the namespace's claims.)
///
/// # Idempotency
/// Claims already deleting are left alone: a second call deletes nothing.
///
/// # Errors
/// API server errors.
pub fn delete_claims<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<usize> {
    let claims: Vec<crate::kube::object::Meta> = kube.list_as(&kube::CLAIMS, Some(ns))?;
    let label = machine_label(name);
    let mut deleted = 0;
    for c in claims {
        let m = &c.metadata;
        let ours = m.owned_by(uid)
            && (m.label(MACHINE_LABEL) == Some(label.as_str()) || named_for(&m.name, name));
        if ours && !m.deleting() {
            kube.delete(&kube::CLAIMS, Some(ns), &m.name)?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Each slot's claim, if it has one: by label, or (before any claim is
/// labelled) by its old name, owned by the Machine and from the slot's
/// pool. Reads only.
pub(super) fn claims_of_slots<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    name: &str,
    slots: &[PoolSlot<'_>],
) -> Result<Vec<Option<String>>> {
    let have = labelled_claims(kube, ns, name)?;
    let mut out = Vec::new();
    for s in slots {
        let labelled = have.iter().find(|c| {
            c.metadata.label(SLOT_LABEL) == Some(s.key.as_str()) && !c.metadata.deleting()
        });
        let found = match labelled {
            Some(c) => Some(c.metadata.name.clone()),
            None if have.is_empty() => {
                let old = s.legacy_name(name);
                kube.get_as::<NetClaim>(&kube::CLAIMS, Some(ns), &old)?
                    .filter(|c| c.of_machine(name) && c.is_from(s.pool) && !c.metadata.deleting())
                    .map(|_| old)
            }
            None => None,
        };
        out.push(found);
    }
    Ok(out)
}

/// The address with prefix of claim `claim`'s `IPAddress`, once bound, if
/// it comes from `pool`.
pub(super) fn bound_address<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    claim: &str,
    pool: &PoolName,
) -> Result<Option<String>> {
    let Some(v) = kube.get(&kube::IP_ADDRESSES, Some(ns), claim)? else {
        return Ok(None);
    };
    let kind = v.pointer("/spec/poolRef/kind").and_then(Value::as_str);
    let pool_name = v.pointer("/spec/poolRef/name").and_then(Value::as_str);
    if kind != Some(pool.kind.as_deref().unwrap_or("MetalIPPool"))
        || pool_name != Some(pool.name.as_str())
    {
        return Ok(None);
    }
    let address = v.pointer("/spec/address").and_then(Value::as_str);
    let prefix = v.pointer("/spec/prefix").and_then(Value::as_u64);
    Ok(address.zip(prefix).map(|(a, p)| format!("{a}/{p}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn meta(ns: &str, name: &str, label: Option<&str>, deleting: bool) -> ObjectMeta {
        let mut m = json!({"name": name, "namespace": ns});
        if let Some(l) = label {
            m["labels"] = json!({MACHINE_LABEL: l});
        }
        if deleting {
            m["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        ObjectMeta::from_json(&m)
    }

    proptest! {
        /// The grouped claims of a Machine are exactly those the one-pass
        /// filter (the definition) finds: live, same namespace, labelled
        /// for it or named for it.
        #[test]
        fn grouped_claims_are_the_filtered_ones(
            claims in prop::collection::vec((
                prop::sample::select(vec!["a", "b"]),
                prop::sample::select(vec!["m", "m-1", "m-1-vlan-0", "m-vlan-2", "m-1-elastic-0",
                    "m-vlan-1-vlan-2", "x-vlan-0", "m1-vlan-0", "m-"]),
                prop::option::of(prop::sample::select(vec!["m", "m-1", "x"])),
                prop::bool::weighted(0.2),
            ), 0..12),
        ) {
            let metas: Vec<ObjectMeta> = claims
                .iter()
                .map(|(ns, name, label, del)| meta(ns, name, *label, *del))
                .collect();
            let refs: Vec<&ObjectMeta> = metas.iter().collect();
            let grouped = ClaimsOfMachines::new(&refs);
            for ns in ["a", "b"] {
                for machine in ["m", "m-1", "x", "m1", "m-vlan-1"] {
                    let label = machine_label(machine);
                    let want: BTreeSet<*const ObjectMeta> = refs
                        .iter()
                        .filter(|c| {
                            c.namespace.as_deref() == Some(ns)
                                && !c.deleting()
                                && (c.label(MACHINE_LABEL) == Some(label.as_str())
                                    || named_for(&c.name, machine))
                        })
                        .map(|c| *c as *const ObjectMeta)
                        .collect();
                    let got: Vec<*const ObjectMeta> = grouped
                        .of(ns, machine)
                        .into_iter()
                        .map(|c| c as *const ObjectMeta)
                        .collect();
                    prop_assert_eq!(got.len(), want.len(), "each once: {} {}", ns, machine);
                    prop_assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want);
                }
            }
        }
    }
}
