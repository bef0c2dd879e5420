//! CAPI `IPAddressClaim` input and `IPAddress` output (group
//! `ipam.cluster.x-k8s.io`, versions v1beta2 and v1beta1), and the typed
//! views of both objects as the API server returns them
//! ([`ClaimObject`], [`IpAddressObject`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{Error, ErrorKind, Result};
use crate::ipam::pool::{self, PoolId, PoolKind};
use crate::kube::names;
use crate::kube::object::{self, metadata, MetadataPatch, Object, ObjectMeta, OwnerReference};

/// API group of the CAPI IPAM types.
pub const CAPI_IPAM_GROUP: &str = "ipam.cluster.x-k8s.io";
/// Annotation on a claim asking for one specific address of the pool.
pub const REQUESTED_ADDRESS_ANNOTATION: &str = "ipam.metal-ipam.dev/requested-address";

/// Annotation asking a prefix pool for a specific sub-prefix (`net/len`,
/// the length the pool hands out).
pub const REQUESTED_PREFIX_ANNOTATION: &str = "ipam.metal-ipam.dev/requested-prefix";
/// Label CAPI puts on objects of a cluster (copied onto the IPAddress).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// The CAPI IPAM API versions we accept and answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapiVersion {
    /// `ipam.cluster.x-k8s.io/v1beta2` (storage version since CAPI v1.11).
    V1beta2,
    /// `ipam.cluster.x-k8s.io/v1beta1` (deprecated, still served).
    V1beta1,
}

impl CapiVersion {
    /// The full `apiVersion` string.
    pub fn api_version(self) -> &'static str {
        match self {
            CapiVersion::V1beta2 => "ipam.cluster.x-k8s.io/v1beta2",
            CapiVersion::V1beta1 => "ipam.cluster.x-k8s.io/v1beta1",
        }
    }

    /// Parses an `apiVersion` string.
    pub fn parse(s: &str) -> Option<CapiVersion> {
        match s {
            "ipam.cluster.x-k8s.io/v1beta2" => Some(CapiVersion::V1beta2),
            "ipam.cluster.x-k8s.io/v1beta1" => Some(CapiVersion::V1beta1),
            _ => None,
        }
    }
}

/// A claim's `spec.poolRef`, kept exactly as given so the IPAddress can
/// carry an identical copy (the CAPI webhook compares them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRef {
    /// `apiGroup` (required in v1beta2, optional in v1beta1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// `kind`.
    pub kind: String,
    /// `name`.
    pub name: String,
}

impl PoolRef {
    /// Reads a `poolRef` leniently (an object's; absent fields are empty):
    /// for references the API server already checked. A claim's is
    /// checked field by field by [`Claim::parse`].
    pub fn from_json(v: &Value) -> Option<PoolRef> {
        v.as_object()?;
        Some(PoolRef {
            api_group: object::opt_string(v, "apiGroup"),
            kind: object::string(v, "kind"),
            name: object::string(v, "name"),
        })
    }

    /// As JSON, field names as in the CRD.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Identity of a claim: namespace, name and uid.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimId {
    /// Namespace of the claim.
    pub namespace: String,
    /// Name of the claim (and of its IPAddress).
    pub name: String,
    /// `metadata.uid`: tells a re-created claim from the old one.
    pub uid: String,
}

impl ClaimId {
    /// `namespace/name`.
    pub fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A parsed, checked `IPAddressClaim`.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The version the claim came in (the IPAddress is answered in it).
    pub version: CapiVersion,
    /// Namespace, name, uid.
    pub id: ClaimId,
    /// `spec.poolRef` as given.
    pub pool_ref: PoolRef,
    /// The pool it resolves to.
    pub pool: PoolId,
    /// Address asked for with [`REQUESTED_ADDRESS_ANNOTATION`].
    pub requested: Option<IpAddr>,
    /// The length of a requested sub-prefix
    /// ([`REQUESTED_PREFIX_ANNOTATION`]); the pool refuses another than its
    /// own.
    pub requested_len: Option<u8>,
    /// `spec.clusterName`, or the cluster-name label.
    pub cluster_name: Option<String>,
}

impl Claim {
    /// Parses and checks an `IPAddressClaim` object.
    ///
    /// # Errors
    /// 400 when `body` is not an object; 422 naming the field for a wrong
    /// apiVersion/kind, a missing name, namespace or uid, a malformed
    /// requested-address annotation, or a `poolRef` whose group/kind is not
    /// ours (reason `UnsupportedPoolRef`).
    pub fn parse(body: &Value) -> Result<Claim> {
        let obj = body
            .as_object()
            .ok_or_else(|| Error::malformed("the body must be a JSON object"))?;
        let version = match obj.get("apiVersion").and_then(Value::as_str) {
            Some(v) => CapiVersion::parse(v).ok_or_else(|| {
                Error::invalid(
                    "apiVersion",
                    format!("{v:?} is not supported; use ipam.cluster.x-k8s.io/v1beta2 or v1beta1"),
                )
            })?,
            None => return Err(Error::invalid("apiVersion", "is required")),
        };
        if obj.get("kind").and_then(Value::as_str) != Some("IPAddressClaim") {
            return Err(Error::invalid("kind", "must be \"IPAddressClaim\""));
        }
        let meta = obj
            .get("metadata")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::invalid("metadata", "is required"))?;
        let id = claim_id(meta)?;
        let spec = obj
            .get("spec")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::invalid("spec", "is required"))?;
        let pr = spec
            .get("poolRef")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::invalid("spec.poolRef", "is required"))?;
        let (pool_ref, pool_kind) = pool_ref(pr, version)?;
        names::check_subdomain(&pool_ref.name)
            .map_err(|m| Error::invalid("spec.poolRef.name", m))?;
        let pool = PoolId::of(pool_kind, &id.namespace, &pool_ref.name);
        let (requested, requested_len) = if pool_kind.is_prefix() {
            match requested_prefix(meta)? {
                Some(net) => (Some(net.addr()), Some(net.prefix_len())),
                None => (requested_address(meta)?, None),
            }
        } else {
            if annotation(meta, REQUESTED_PREFIX_ANNOTATION).is_some() {
                return Err(Error::invalid(
                    format!("metadata.annotations[{REQUESTED_PREFIX_ANNOTATION}]"),
                    format!("is for prefix pools; {} hands out addresses (use {REQUESTED_ADDRESS_ANNOTATION})", pool_kind.kind_name()),
                ));
            }
            (requested_address(meta)?, None)
        };
        let cluster_name = spec
            .get("clusterName")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .or_else(|| {
                meta.get("labels")
                    .and_then(Value::as_object)
                    .and_then(|l| l.get(CLUSTER_NAME_LABEL))
                    .and_then(Value::as_str)
            })
            .map(str::to_string);
        Ok(Claim {
            version,
            id,
            pool_ref,
            pool,
            requested,
            requested_len,
            cluster_name,
        })
    }
}

/// A claim's name, namespace and uid, checked.
fn claim_id(meta: &Map<String, Value>) -> Result<ClaimId> {
    let name = meta_str(meta, "name")?;
    names::check_subdomain(name).map_err(|m| Error::invalid("metadata.name", m))?;
    let namespace = meta_str(meta, "namespace")?;
    names::check_label(namespace).map_err(|m| Error::invalid("metadata.namespace", m))?;
    let uid = meta_str(meta, "uid")?;
    if uid.len() > 128 || uid.contains(char::is_whitespace) {
        return Err(Error::invalid(
            "metadata.uid",
            "must be a UID without spaces, at most 128 characters",
        ));
    }
    Ok(ClaimId {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
    })
}

/// A claim's `spec.poolRef`, checked field by field, and the pool kind it
/// names (ours, or `UnsupportedPoolRef`).
fn pool_ref(pr: &Map<String, Value>, version: CapiVersion) -> Result<(PoolRef, PoolKind)> {
    let api_group = match pr.get("apiGroup") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(Error::invalid("spec.poolRef.apiGroup", "must be a string")),
    };
    if version == CapiVersion::V1beta2 && api_group.is_none() {
        return Err(Error::invalid(
            "spec.poolRef.apiGroup",
            "is required in v1beta2",
        ));
    }
    let kind = pr
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid("spec.poolRef.kind", "is required"))?;
    let pool_name = pr
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid("spec.poolRef.name", "is required"))?;
    let pool_ref = PoolRef {
        api_group,
        kind: kind.to_string(),
        name: pool_name.to_string(),
    };
    match pool_ref
        .api_group
        .as_deref()
        .and_then(|g| PoolKind::of_group(g, kind))
    {
        Some(k) => Ok((pool_ref, k)),
        None => Err(Error::new(
            ErrorKind::Invalid,
            "UnsupportedPoolRef",
            format!(
                "spec.poolRef {}/{} is not served by metal-ipam, which serves {}",
                pool_ref.api_group.as_deref().unwrap_or(""),
                kind,
                PoolKind::ALL
                    .map(|k| format!("{}/{}", pool::GROUP, k.kind_name()))
                    .join(", ")
            ),
        )
        .with_field("spec.poolRef")),
    }
}

fn annotation<'a>(meta: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    meta.get("annotations")
        .and_then(Value::as_object)
        .and_then(|a| a.get(key))
}

/// The sub-prefix a claim asks for with [`REQUESTED_PREFIX_ANNOTATION`]:
/// a CIDR whose host bits are zero.
fn requested_prefix(meta: &Map<String, Value>) -> Result<Option<ipnet::IpNet>> {
    let Some(v) = annotation(meta, REQUESTED_PREFIX_ANNOTATION) else {
        return Ok(None);
    };
    let field = format!("metadata.annotations[{REQUESTED_PREFIX_ANNOTATION}]");
    let s = v
        .as_str()
        .ok_or_else(|| Error::invalid(&field, "must be a string"))?;
    pool::aligned_cidr(s)
        .map(Some)
        .map_err(|m| Error::invalid(&field, m))
}

/// The address a claim asks for with [`REQUESTED_ADDRESS_ANNOTATION`].
fn requested_address(meta: &Map<String, Value>) -> Result<Option<IpAddr>> {
    let Some(v) = annotation(meta, REQUESTED_ADDRESS_ANNOTATION) else {
        return Ok(None);
    };
    let field = format!("metadata.annotations[{REQUESTED_ADDRESS_ANNOTATION}]");
    let s = v
        .as_str()
        .ok_or_else(|| Error::invalid(&field, "must be a string"))?;
    let ip = s
        .trim()
        .parse::<IpAddr>()
        .map_err(|_| Error::invalid(&field, format!("{s:?} is not an IP address")))?;
    Ok(Some(ip))
}

fn meta_str<'a>(meta: &'a Map<String, Value>, key: &str) -> Result<&'a str> {
    meta.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Error::invalid(format!("metadata.{key}"), "is required"))
}

/// Everything needed to render the `IPAddress` of a bound claim.
#[derive(Debug, Clone, PartialEq)]
pub struct AddressView<'a> {
    /// Version to answer in (the claim's).
    pub version: CapiVersion,
    /// The claim.
    pub claim: &'a ClaimId,
    /// The claim's poolRef, copied verbatim.
    pub pool_ref: &'a PoolRef,
    /// The pool's uid, when known (adds the pool owner reference).
    pub pool_uid: Option<&'a str>,
    /// Cluster name (adds the cluster-name label).
    pub cluster_name: Option<&'a str>,
    /// The address.
    pub address: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// Gateway.
    pub gateway: Option<IpAddr>,
}

impl AddressView<'_> {
    /// Renders the `IPAddress` object: named after the claim, owned by the
    /// claim (controller, blockOwnerDeletion) and by the pool when its uid is
    /// known (blockOwnerDeletion), with the cluster-name label when known,
    /// and `spec.poolRef` identical to the claim's.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ipam::claim::*;
    /// let id = ClaimId { namespace: "ns".into(), name: "m-0".into(), uid: "u1".into() };
    /// let pr = PoolRef { api_group: Some("ipam.metal-ipam.dev".into()), kind: "MetalIPPool".into(), name: "p".into() };
    /// let v = AddressView { version: CapiVersion::V1beta2, claim: &id, pool_ref: &pr, pool_uid: None,
    ///     cluster_name: None, address: "10.0.0.2".parse().unwrap(), prefix: 24, gateway: None };
    /// let a = v.to_json();
    /// assert_eq!(a["spec"]["address"], "10.0.0.2");
    /// assert_eq!(a["spec"]["poolRef"]["kind"], "MetalIPPool");
    /// assert_eq!(a["metadata"]["ownerReferences"][0]["controller"], true);
    /// ```
    pub fn to_json(&self) -> Value {
        IpAddress::new(self).to_json()
    }
}

/// The `IPAddress` metal-ipam writes, serialised as it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IpAddress {
    /// The claim's version.
    pub api_version: &'static str,
    /// `IPAddress`.
    pub kind: &'static str,
    /// Name, namespace, owners, finalizers, cluster-name label.
    pub metadata: IpAddressMeta,
    /// Address, prefix, gateway and the two references.
    pub spec: IpAddressSpecOut,
}

/// `IPAddress.metadata` as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IpAddressMeta {
    /// The claim's name.
    pub name: String,
    /// The claim's namespace.
    pub namespace: String,
    /// Finalizers to create the object with.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    /// The claim (controller) and the pool, when its uid is known.
    pub owner_references: Vec<OwnerReference>,
    /// The cluster-name label, when known.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// `IPAddress.spec` as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IpAddressSpecOut {
    /// The address.
    pub address: String,
    /// Prefix length.
    pub prefix: u8,
    /// Gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The claim.
    pub claim_ref: LocalRef,
    /// The claim's poolRef, verbatim.
    pub pool_ref: PoolRef,
}

impl IpAddress {
    /// The `IPAddress` of a bound claim (see [`AddressView::to_json`]).
    pub fn new(v: &AddressView<'_>) -> IpAddress {
        let mut owners = vec![OwnerReference::owner(
            v.version.api_version(),
            "IPAddressClaim",
            &v.claim.name,
            &v.claim.uid,
            true,
        )];
        if let (Some(uid), Some(group)) = (v.pool_uid, v.pool_ref.api_group.as_deref()) {
            // The pool's own version: ours, or the in-cluster provider's.
            let api_version = PoolKind::of_group(group, &v.pool_ref.kind).map_or_else(
                || format!("{group}/{}", pool::VERSION),
                PoolKind::api_version,
            );
            owners.push(OwnerReference::owner(
                &api_version,
                &v.pool_ref.kind,
                &v.pool_ref.name,
                uid,
                false,
            ));
        }
        let labels = v
            .cluster_name
            .map(|c| BTreeMap::from([(CLUSTER_NAME_LABEL.to_string(), c.to_string())]))
            .unwrap_or_default();
        IpAddress {
            api_version: v.version.api_version(),
            kind: "IPAddress",
            metadata: IpAddressMeta {
                name: v.claim.name.clone(),
                namespace: v.claim.namespace.clone(),
                finalizers: Vec::new(),
                owner_references: owners,
                labels,
            },
            spec: IpAddressSpecOut {
                address: v.address.to_string(),
                prefix: v.prefix,
                gateway: v.gateway.map(|g| g.to_string()),
                claim_ref: LocalRef {
                    name: v.claim.name.clone(),
                },
                pool_ref: v.pool_ref.clone(),
            },
        }
    }

    /// The object with finalizer `f` (for its creation).
    pub fn with_finalizer(mut self, f: &str) -> IpAddress {
        self.metadata.finalizers = vec![f.to_string()];
        self
    }

    /// As JSON, to send.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Whether `existing` holds another address or names another pool
    /// than this one (it is then not ours to complete).
    pub fn conflicts_with(&self, existing: &IpAddressObject) -> bool {
        existing.spec.address != self.spec.address
            || existing.spec.pool_ref.as_ref() != Some(&self.spec.pool_ref)
    }

    /// What `existing` lacks of this object's metadata: finalizer `f`, the
    /// owner references (added, or replaced by uid), the cluster-name
    /// label; guarded by its resourceVersion. `None` when it lacks nothing.
    pub fn metadata_patch(&self, existing: &IpAddressObject, f: &str) -> Option<MetadataPatch> {
        let m = &existing.metadata;
        let mut patch = MetadataPatch {
            resource_version: m.resource_version.clone(),
            ..MetadataPatch::default()
        };
        if !m.has_finalizer(f) {
            let mut fs = m.finalizers.clone();
            fs.push(f.to_string());
            patch.finalizers = Some(fs);
        }
        let mut refs = m.owner_references.clone();
        let mut refs_changed = false;
        for want in &self.metadata.owner_references {
            match refs.iter_mut().find(|r| r.uid == want.uid) {
                Some(r) if r == want => {}
                Some(r) => {
                    *r = want.clone();
                    refs_changed = true;
                }
                None => {
                    refs.push(want.clone());
                    refs_changed = true;
                }
            }
        }
        patch.owner_references = refs_changed.then_some(refs);
        if let Some(c) = self.metadata.labels.get(CLUSTER_NAME_LABEL) {
            if m.label(CLUSTER_NAME_LABEL) != Some(c) {
                patch.labels = Some(BTreeMap::from([(
                    CLUSTER_NAME_LABEL.to_string(),
                    c.clone(),
                )]));
            }
        }
        (!patch.is_empty()).then_some(patch)
    }
}

/// A reference by name in the same namespace (`claimRef`, `addressRef`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LocalRef {
    /// `name`.
    pub name: String,
}

impl LocalRef {
    /// Reads `v[key]` when it is an object.
    pub fn at(v: &Value, key: &str) -> Option<LocalRef> {
        let r = v.get(key).filter(|r| r.is_object())?;
        Some(LocalRef {
            name: object::string(r, "name"),
        })
    }
}

/// An `IPAddressClaim` as read from the API server: what the contract
/// steps decide on besides the spec, which [`Claim::parse`] checks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimObject {
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// `status`.
    pub status: ClaimStatus,
}

/// `IPAddressClaim.status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimStatus {
    /// `conditions` (`metav1.Condition`; other controllers' entries are
    /// passed through untouched).
    pub conditions: Vec<Value>,
    /// `addressRef`: the bound `IPAddress`.
    pub address_ref: Option<LocalRef>,
}

impl Object for ClaimObject {
    fn from_json(v: &Value) -> Self {
        let status = v.get("status").unwrap_or(&Value::Null);
        ClaimObject {
            metadata: metadata(v),
            status: ClaimStatus {
                conditions: object::array(status, "conditions"),
                address_ref: LocalRef::at(status, "addressRef"),
            },
        }
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// An `IPAddress` as read from the API server (v1beta2 or v1beta1: the
/// fields read here are the same in both).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpAddressObject {
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// `spec`.
    pub spec: IpAddressSpec,
}

/// `IPAddress.spec`, as far as metal-ipam reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpAddressSpec {
    /// `address`, as written (parse with [`IpAddressSpec::ip`]).
    pub address: String,
    /// `poolRef`.
    pub pool_ref: Option<PoolRef>,
    /// `claimRef`.
    pub claim_ref: Option<LocalRef>,
}

impl IpAddressSpec {
    /// Reads `spec` (an `IPAddress`'s), leniently.
    pub fn from_json(spec: &Value) -> IpAddressSpec {
        IpAddressSpec {
            address: object::string(spec, "address"),
            pool_ref: spec.get("poolRef").and_then(PoolRef::from_json),
            claim_ref: LocalRef::at(spec, "claimRef"),
        }
    }

    /// `address` as an IP address, when it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        self.address.parse().ok()
    }

    /// The pool `poolRef` names, for an `IPAddress` in `namespace`: one of
    /// our kinds in our group (or one of the in-cluster provider's kinds in
    /// its group, which metal-ipam serves only during a takeover) and a
    /// valid name; `None` otherwise.
    ///
    /// ```
    /// use metal_ipam_core::ipam::claim::{IpAddressSpec, PoolRef};
    /// let mut s = IpAddressSpec::default();
    /// s.pool_ref = Some(PoolRef { api_group: Some("ipam.metal-ipam.dev".into()), kind: "MetalIPPool".into(), name: "p".into() });
    /// assert_eq!(s.our_pool("ns").unwrap().display(), "ns/p");
    /// s.pool_ref.as_mut().unwrap().api_group = Some("other.example".into());
    /// assert!(s.our_pool("ns").is_none());
    /// ```
    pub fn our_pool(&self, namespace: &str) -> Option<PoolId> {
        let r = self.pool_ref.as_ref()?;
        if names::check_subdomain(&r.name).is_err() {
            return None;
        }
        let kind = PoolKind::of_group(r.api_group.as_deref()?, &r.kind)?;
        Some(PoolId::of(kind, namespace, &r.name))
    }
}

impl Object for IpAddressObject {
    fn from_json(v: &Value) -> Self {
        IpAddressObject {
            metadata: metadata(v),
            spec: IpAddressSpec::from_json(v.get("spec").unwrap_or(&Value::Null)),
        }
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim_json() -> Value {
        json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddressClaim",
            "metadata": {"name": "m-0", "namespace": "ns", "uid": "u-1",
                "labels": {CLUSTER_NAME_LABEL: "c1"}},
            "spec": {"poolRef": {"apiGroup": "ipam.metal-ipam.dev", "kind": "MetalIPPool", "name": "p"}}
        })
    }

    #[test]
    fn parses_v1beta2_claim() {
        let c = Claim::parse(&claim_json()).unwrap();
        assert_eq!(c.pool, PoolId::namespaced("ns", "p"));
        assert_eq!(c.cluster_name.as_deref(), Some("c1"));
        assert_eq!(c.version, CapiVersion::V1beta2);
    }

    #[test]
    fn global_pool_ref_resolves_without_namespace() {
        let mut j = claim_json();
        j["spec"]["poolRef"]["kind"] = json!("GlobalMetalIPPool");
        assert_eq!(Claim::parse(&j).unwrap().pool, PoolId::global("p"));
    }

    #[test]
    fn foreign_pool_refs_are_unsupported() {
        for (group, kind) in [
            (json!("ipam.metal3.io"), "IPPool"),
            (json!("ipam.metal-ipam.dev"), "InClusterIPPool"),
            (json!("ipam.cluster.x-k8s.io"), "MetalIPPool"),
            (json!("other.example"), "MetalIPPool"),
        ] {
            let mut j = claim_json();
            j["spec"]["poolRef"]["apiGroup"] = group;
            j["spec"]["poolRef"]["kind"] = json!(kind);
            let e = Claim::parse(&j).unwrap_err();
            assert_eq!((e.status(), e.reason()), (422, "UnsupportedPoolRef"));
        }
        // v1beta1 allows a missing apiGroup, which cannot be ours.
        let mut j = claim_json();
        j["apiVersion"] = json!("ipam.cluster.x-k8s.io/v1beta1");
        j["spec"]["poolRef"]
            .as_object_mut()
            .unwrap()
            .remove("apiGroup");
        assert_eq!(Claim::parse(&j).unwrap_err().reason(), "UnsupportedPoolRef");
    }

    #[test]
    fn missing_or_bad_fields_are_422_with_path() {
        type Mutation = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|j| j["apiVersion"] = json!("v1")), "apiVersion"),
            (Box::new(|j| j["kind"] = json!("IPAddress")), "kind"),
            (
                Box::new(|j| {
                    j["metadata"].as_object_mut().unwrap().remove("uid");
                }),
                "metadata.uid",
            ),
            (
                Box::new(|j| j["metadata"]["name"] = json!("A/B")),
                "metadata.name",
            ),
            (
                Box::new(|j| j["metadata"]["namespace"] = json!("")),
                "metadata.namespace",
            ),
            (
                Box::new(|j| {
                    j["spec"]["poolRef"]
                        .as_object_mut()
                        .unwrap()
                        .remove("apiGroup");
                }),
                "spec.poolRef.apiGroup",
            ),
            (
                Box::new(|j| {
                    j["metadata"]["annotations"] =
                        json!({REQUESTED_ADDRESS_ANNOTATION: "10.0.0.300"})
                }),
                "metadata.annotations[ipam.metal-ipam.dev/requested-address]",
            ),
        ];
        for (mutate, field) in cases {
            let mut j = claim_json();
            mutate(&mut j);
            let e = Claim::parse(&j).unwrap_err();
            assert_eq!(e.status(), 422, "{e}");
            assert_eq!(e.field(), Some(field), "{e}");
        }
        assert_eq!(Claim::parse(&json!("x")).unwrap_err().status(), 400);
    }

    #[test]
    fn the_rendered_ip_address_reads_back_as_its_typed_view() {
        let c = Claim::parse(&claim_json()).unwrap();
        let view = AddressView {
            version: c.version,
            claim: &c.id,
            pool_ref: &c.pool_ref,
            pool_uid: Some("pool-uid"),
            cluster_name: c.cluster_name.as_deref(),
            address: "10.0.0.7".parse().unwrap(),
            prefix: 24,
            gateway: None,
        };
        let o = IpAddressObject::from_json(&view.to_json());
        assert_eq!(o.metadata.name, "m-0");
        assert_eq!(o.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(o.metadata.label(CLUSTER_NAME_LABEL), Some("c1"));
        assert!(o.metadata.owned_by("u-1") && o.metadata.owned_by("pool-uid"));
        assert_eq!(o.spec.ip(), Some("10.0.0.7".parse().unwrap()));
        assert_eq!(o.spec.pool_ref.as_ref(), Some(&c.pool_ref));
        assert_eq!(
            o.spec.claim_ref.as_ref().map(|r| r.name.as_str()),
            Some("m-0")
        );
        assert_eq!(o.spec.our_pool("ns"), Some(c.pool.clone()));
        // The owner references render back to exactly what was written.
        let refs: Vec<Value> = o
            .metadata
            .owner_references
            .iter()
            .map(|r| r.to_json())
            .collect();
        assert_eq!(
            Value::Array(refs),
            view.to_json()["metadata"]["ownerReferences"]
        );
    }

    #[test]
    fn only_our_group_kinds_and_valid_names_are_our_pools() {
        let spec = |g: Option<&str>, k: &str, n: &str| IpAddressSpec {
            pool_ref: Some(PoolRef {
                api_group: g.map(str::to_string),
                kind: k.into(),
                name: n.into(),
            }),
            ..IpAddressSpec::default()
        };
        let ours = Some(pool::GROUP);
        assert_eq!(
            spec(ours, "GlobalMetalIPPool", "g").our_pool("ns"),
            Some(PoolId::global("g"))
        );
        assert_eq!(
            spec(ours, "MetalIPPool", "p").our_pool("ns"),
            Some(PoolId::namespaced("ns", "p"))
        );
        assert_eq!(spec(None, "MetalIPPool", "p").our_pool("ns"), None);
        assert_eq!(
            spec(Some("other.example"), "MetalIPPool", "p").our_pool("ns"),
            None
        );
        assert_eq!(spec(ours, "InClusterIPPool", "p").our_pool("ns"), None);
        assert_eq!(spec(ours, "MetalIPPool", "Not_A_Name").our_pool("ns"), None);
        assert_eq!(IpAddressSpec::default().our_pool("ns"), None);
    }

    #[test]
    fn a_claim_object_reads_its_status() {
        let mut j = claim_json();
        j["status"] = json!({"addressRef": {"name": "m-0"}, "conditions": [{"type": "Other", "status": "True"}]});
        let o = ClaimObject::from_json(&j);
        assert_eq!(o.status.address_ref, Some(LocalRef { name: "m-0".into() }));
        assert_eq!(
            o.status.conditions,
            vec![json!({"type": "Other", "status": "True"})]
        );
        assert_eq!(o.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(
            ClaimObject::from_json(&claim_json()).status,
            ClaimStatus::default()
        );
    }
}
