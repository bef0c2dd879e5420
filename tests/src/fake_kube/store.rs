//! The object store and the API semantics: create, update (main resource,
//! status subresource, direct), delete with finalizers, garbage collection,
//! paged lists with label and field selectors.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use regex::Regex;
use serde_json::{json, Map, Value};

use super::error::{ApiError, Cause};
use super::{DeleteOutcome, Recorded};
use crate::schema::{capi_crds_dir, load_crd, repo_root, Crd, Scope};

// ---------------------------------------------------------------------------
// Resource types
// ---------------------------------------------------------------------------

/// One served resource: group, version, plural and what the API server knows
/// about it.
#[derive(Debug, Clone)]
pub(crate) struct ResourceType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub status: bool,
    /// The CRD whose `version` schema validates writes; `None` accepts any
    /// object (Cluster, for which no CRD is at hand).
    pub crd: Option<Crd>,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// `plural.group`, as in API error messages.
    pub fn resource(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// `Kind.group`, as in `Invalid` messages.
    pub fn group_kind(&self) -> String {
        format!("{}.{}", self.kind, self.group)
    }

    fn from_crd(crd: Crd, version: &str) -> ResourceType {
        let v = crd
            .version(version)
            .unwrap_or_else(|| panic!("{} has no version {version}", crd.name()));
        assert!(v.served, "{} does not serve {version}", crd.name());
        let status = v.status_subresource;
        ResourceType {
            group: crd.group().to_owned(),
            version: version.to_owned(),
            plural: crd.plural().to_owned(),
            kind: crd.kind().to_owned(),
            list_kind: crd
                .list_kind()
                .map_or_else(|| format!("{}List", crd.kind()), str::to_owned),
            namespaced: crd.scope() == Scope::Namespaced,
            status,
            crd: Some(crd),
        }
    }
}

const CLAIMS_CRD: &str =
    "cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddressclaims.yaml";
const ADDRESSES_CRD: &str =
    "cluster-api__core_config_crd_bases_ipam.cluster.x-k8s.io_ipaddresses.yaml";

/// The in-cluster IPAM provider's pool CRDs in `tests/fixtures/crds/`:
/// `InClusterIPPool`, `GlobalInClusterIPPool`, `InClusterPrefixPool`,
/// `GlobalInClusterPrefixPool`.
pub(crate) const IN_CLUSTER_CRDS: [&str; 4] = [
    "cluster-api-ipam-provider-in-cluster__config_crd_bases_ipam.cluster.x-k8s.io_inclusterippools.yaml",
    "cluster-api-ipam-provider-in-cluster__config_crd_bases_ipam.cluster.x-k8s.io_globalinclusterippools.yaml",
    "cluster-api-ipam-provider-in-cluster__config_crd_bases_ipam.cluster.x-k8s.io_inclusterprefixpools.yaml",
    "cluster-api-ipam-provider-in-cluster__config_crd_bases_ipam.cluster.x-k8s.io_globalinclusterprefixpools.yaml",
];

/// The resources FakeKube serves, loaded once per test process.
pub(crate) fn resource_types() -> &'static [ResourceType] {
    static TYPES: OnceLock<Vec<ResourceType>> = OnceLock::new();
    TYPES.get_or_init(|| {
        let load = |path: std::path::PathBuf| {
            load_crd(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
        };
        let reference = capi_crds_dir();
        let ours = repo_root().join("deploy/crds");
        vec![
            ResourceType::from_crd(load(reference.join(CLAIMS_CRD)), "v1beta2"),
            ResourceType::from_crd(load(reference.join(ADDRESSES_CRD)), "v1beta2"),
            ResourceType::from_crd(
                load(ours.join("ipam.metal-ipam.dev_metalippools.yaml")),
                "v1alpha1",
            ),
            ResourceType::from_crd(
                load(ours.join("ipam.metal-ipam.dev_globalmetalippools.yaml")),
                "v1alpha1",
            ),
            ResourceType::from_crd(
                load(ours.join("ipam.metal-ipam.dev_metalprefixpools.yaml")),
                "v1alpha1",
            ),
            ResourceType::from_crd(
                load(ours.join("ipam.metal-ipam.dev_globalmetalprefixpools.yaml")),
                "v1alpha1",
            ),
            ResourceType::from_crd(
                load(ours.join("ipam.metal-ipam.dev_metalnetworkprofiles.yaml")),
                "v1alpha1",
            ),
            // The in-cluster provider's pool kinds (v1alpha2, its storage
            // version), for the takeover tests and `crate::in_cluster`.
            ResourceType::from_crd(load(reference.join(IN_CLUSTER_CRDS[0])), "v1alpha2"),
            ResourceType::from_crd(load(reference.join(IN_CLUSTER_CRDS[1])), "v1alpha2"),
            ResourceType::from_crd(load(reference.join(IN_CLUSTER_CRDS[2])), "v1alpha2"),
            ResourceType::from_crd(load(reference.join(IN_CLUSTER_CRDS[3])), "v1alpha2"),
            ResourceType {
                group: super::CLUSTER_GROUP.to_owned(),
                version: "v1beta2".to_owned(),
                plural: "clusters".to_owned(),
                kind: "Cluster".to_owned(),
                list_kind: "ClusterList".to_owned(),
                namespaced: true,
                status: true,
                crd: None,
            },
            // Owners of claims whose spec.providerID names a Metal device
            // (no schema: only metadata and spec.providerID are read).
            ResourceType {
                group: super::CLUSTER_GROUP.to_owned(),
                version: "v1beta2".to_owned(),
                plural: "machines".to_owned(),
                kind: "Machine".to_owned(),
                list_kind: "MachineList".to_owned(),
                namespaced: true,
                status: true,
                crd: None,
            },
            ResourceType {
                group: super::INFRA_GROUP.to_owned(),
                version: "v1beta1".to_owned(),
                plural: "packetmachines".to_owned(),
                kind: "PacketMachine".to_owned(),
                list_kind: "PacketMachineList".to_owned(),
                namespaced: true,
                status: true,
                crd: None,
            },
        ]
    })
}

/// The resource type with this group and plural (any version).
pub(crate) fn by_plural(group: &str, plural: &str) -> Option<&'static ResourceType> {
    resource_types()
        .iter()
        .find(|rt| rt.group == group && rt.plural == plural)
}

/// The resource type an object's `apiVersion` and `kind` name.
pub(crate) fn by_object(obj: &Value) -> Result<&'static ResourceType, ApiError> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    resource_types()
        .iter()
        .find(|rt| rt.api_version() == api_version && rt.kind == kind)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "FakeKube serves no kind {kind:?} in apiVersion {api_version:?}"
            ))
        })
}

// ---------------------------------------------------------------------------
// Small helpers: time, uids, metadata access
// ---------------------------------------------------------------------------

/// Seconds since the epoch as RFC 3339 UTC (`2026-11-29T18:17:07Z`): the
/// core's one formatter.
pub(crate) use metal_ipam_core::kube::meta::rfc3339 as format_rfc3339;

fn now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_rfc3339(secs)
}

/// Unique, random-looking UUIDs (version 4 layout): a random seed per store
/// mixed with a counter.
struct UidGen {
    seed: u64,
    counter: u64,
}

impl UidGen {
    fn new() -> UidGen {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(0x6b75_6265);
        UidGen {
            seed: hasher.finish(),
            counter: 0,
        }
    }

    fn next(&mut self) -> String {
        self.counter += 1;
        let a = splitmix(self.seed ^ self.counter);
        let b = splitmix(a ^ self.counter.rotate_left(32));
        let time_hi = (a >> 16) & 0x0fff | 0x4000;
        let clock = (b >> 48) & 0x3fff | 0x8000;
        format!(
            "{:08x}-{:04x}-{time_hi:04x}-{clock:04x}-{:012x}",
            a >> 32,
            a & 0xffff,
            b & 0xffff_ffff_ffff
        )
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(crate) fn meta(obj: &Value) -> &Map<String, Value> {
    static EMPTY: OnceLock<Map<String, Value>> = OnceLock::new();
    obj.get("metadata")
        .and_then(Value::as_object)
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let root = obj.as_object_mut().expect("objects are JSON objects");
    if !root.get("metadata").is_some_and(Value::is_object) {
        root.insert("metadata".into(), Value::Object(Map::new()));
    }
    root.get_mut("metadata")
        .and_then(Value::as_object_mut)
        .expect("inserted above")
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj).get(field).and_then(Value::as_str).unwrap_or("")
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn is_deleting(obj: &Value) -> bool {
    meta(obj)
        .get("deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn owner_uids(obj: &Value) -> Vec<String> {
    meta(obj)
        .get("ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The object without `metadata` (and without `status` when it is a
/// subresource): what `metadata.generation` tracks.
fn generation_content(rt: &ResourceType, obj: &Value) -> Value {
    let mut copy = obj.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        if rt.status {
            map.remove("status");
        }
    }
    copy
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("valid regex"))
}

fn is_dns_subdomain(s: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    s.len() <= 253
        && regex(
            &RE,
            r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        )
        .is_match(s)
}

fn is_dns_label(s: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    s.len() <= 63 && regex(&RE, r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").is_match(s)
}

fn is_label_name(s: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    !s.is_empty()
        && s.len() <= 63
        && regex(&RE, r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").is_match(s)
}

/// A qualified name (`prefix/name` or `name`), as label keys and finalizers
/// must be.
pub(crate) fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(s),
    }
}

pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_label_name(s)
}

/// The metadata checks an API server makes on every object
/// (`ValidateObjectMeta`), reduced to what our code could get wrong.
fn metadata_causes(rt: &ResourceType, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(m) = obj.get("metadata").and_then(Value::as_object) else {
        causes.push(Cause::required("metadata", "Required value"));
        return causes;
    };
    let name = m.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        causes.push(Cause::required(
            "metadata.name",
            "Required value: name or generateName is required",
        ));
    } else if !is_dns_subdomain(name) {
        causes.push(Cause::invalid(
            "metadata.name",
            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    if rt.namespaced {
        let ns = m.get("namespace").and_then(Value::as_str).unwrap_or("");
        if !is_dns_label(ns) {
            causes.push(Cause::invalid(
                "metadata.namespace",
                format!("Invalid value: {ns:?}: a namespace must be an RFC 1123 label"),
            ));
        }
    }
    for field in ["labels", "annotations"] {
        match m.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (k, v) in map {
                    let path = format!("metadata.{field}");
                    if !is_qualified_name(k) {
                        causes.push(Cause::invalid(
                            &path,
                            format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (with an optional DNS subdomain prefix and '/')"),
                        ));
                    }
                    match v.as_str() {
                        None => causes.push(Cause::invalid(
                            &path,
                            format!("Invalid value: {v}: {k} must be a string"),
                        )),
                        Some(s) if field == "labels" && !is_label_value(s) => {
                            causes.push(Cause::invalid(
                                &path,
                                format!("Invalid value: {s:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63)"),
                            ));
                        }
                        Some(_) => {}
                    }
                }
            }
            Some(other) => causes.push(Cause::invalid(
                &format!("metadata.{field}"),
                format!("Invalid value: {other}: must be an object of strings"),
            )),
        }
    }
    match m.get("finalizers") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (i, f) in items.iter().enumerate() {
                if !f.as_str().is_some_and(is_qualified_name) {
                    causes.push(Cause::invalid(
                        &format!("metadata.finalizers[{i}]"),
                        format!("Invalid value: {f}: a finalizer must be a qualified name"),
                    ));
                }
            }
        }
        Some(other) => causes.push(Cause::invalid(
            "metadata.finalizers",
            format!("Invalid value: {other}: must be a list of strings"),
        )),
    }
    match m.get("ownerReferences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(refs)) => {
            let mut controllers = 0;
            for (i, r) in refs.iter().enumerate() {
                let path = format!("metadata.ownerReferences[{i}]");
                for field in ["apiVersion", "kind", "name", "uid"] {
                    if r.get(field)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .is_empty()
                    {
                        causes.push(Cause::required(
                            &format!("{path}.{field}"),
                            "Required value",
                        ));
                    }
                }
                for field in ["controller", "blockOwnerDeletion"] {
                    if r.get(field).is_some_and(|v| !v.is_boolean()) {
                        causes.push(Cause::invalid(
                            &format!("{path}.{field}"),
                            "Invalid value: must be a boolean",
                        ));
                    }
                }
                if r.get("controller") == Some(&Value::Bool(true)) {
                    controllers += 1;
                }
            }
            if controllers > 1 {
                causes.push(Cause::invalid(
                    "metadata.ownerReferences",
                    "Invalid value: Only one reference can have Controller set to true",
                ));
            }
        }
        Some(other) => causes.push(Cause::invalid(
            "metadata.ownerReferences",
            format!("Invalid value: {other}: must be a list of owner references"),
        )),
    }
    causes
}

/// Metadata and CRD schema validation; an `Invalid` error flagged as a
/// schema violation.
fn validate(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let mut causes = metadata_causes(rt, obj);
    if let Some(crd) = &rt.crd {
        if let Err(errors) = crd.validate(obj) {
            causes.extend(errors.iter().map(Cause::from_schema_error));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt, meta_str(obj, "name"), causes).violation())
    }
}

/// `apiVersion` and `kind` must name the resource the request is for.
fn check_type_meta(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(format!(
            "the body must be a JSON object, got {}",
            short(obj)
        )));
    }
    let api_version = obj.get("apiVersion").and_then(Value::as_str);
    let kind = obj.get("kind").and_then(Value::as_str);
    let (Some(api_version), Some(kind)) = (api_version, kind) else {
        return Err(ApiError::bad_request(format!(
            "Object 'Kind' or 'apiVersion' is missing in '{}'",
            short(obj)
        )));
    };
    if api_version != rt.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            rt.api_version()
        )));
    }
    if kind != rt.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    if obj.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(())
}

fn short(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

// ---------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl LabelReq {
    fn matches(&self, labels: &Map<String, Value>) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        match self {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
        }
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Parses a label selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
fn parse_label_selector(s: &str) -> Result<Vec<LabelReq>, ApiError> {
    let bad = |msg: String| ApiError::bad_request(format!("unable to parse requirement: {msg}"));
    let key = |k: &str| -> Result<String, ApiError> {
        let k = k.trim();
        if is_qualified_name(k) {
            Ok(k.to_owned())
        } else {
            Err(bad(format!("invalid label key {k:?}")))
        }
    };
    let value = |v: &str| -> Result<String, ApiError> {
        let v = v.trim();
        if is_label_value(v) {
            Ok(v.to_owned())
        } else {
            Err(bad(format!("invalid label value {v:?}")))
        }
    };
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut reqs = Vec::new();
    for term in split_top_level(s) {
        let term = term.trim();
        if term.is_empty() {
            return Err(bad("empty requirement".into()));
        }
        let req = if let Some(rest) = term.strip_prefix('!') {
            LabelReq::NotExists(key(rest)?)
        } else if let Some((k, v)) = term.split_once("!=") {
            LabelReq::NotEq(key(k)?, value(v)?)
        } else if let Some((k, v)) = term.split_once("==") {
            LabelReq::Eq(key(k)?, value(v)?)
        } else if let Some((k, v)) = term.split_once('=') {
            LabelReq::Eq(key(k)?, value(v)?)
        } else if let Some(open) = term.find('(') {
            let list = term[open + 1..]
                .strip_suffix(')')
                .ok_or_else(|| bad(format!("missing ')' in {term:?}")))?;
            let values = list.split(',').map(value).collect::<Result<Vec<_>, _>>()?;
            let mut words = term[..open].split_whitespace();
            let (Some(k), Some(op), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad(format!("expected '<key> in|notin (...)' in {term:?}")));
            };
            match op {
                "in" => LabelReq::In(key(k)?, values),
                "notin" => LabelReq::NotIn(key(k)?, values),
                _ => return Err(bad(format!("unknown operator {op:?}"))),
            }
        } else {
            LabelReq::Exists(key(term)?)
        };
        reqs.push(req);
    }
    Ok(reqs)
}

/// One requirement of a field selector: only `metadata.name` and
/// `metadata.namespace`, as for custom resources without selectable fields.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldReq {
    field: String,
    value: String,
    equal: bool,
}

fn parse_field_selector(s: &str) -> Result<Vec<FieldReq>, ApiError> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|term| {
            let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: {term:?}"
                )));
            };
            let field = field.trim();
            if field != "metadata.name" && field != "metadata.namespace" {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            Ok(FieldReq {
                field: field.to_owned(),
                value: value.trim().to_owned(),
                equal,
            })
        })
        .collect()
}

impl FieldReq {
    fn matches(&self, obj: &Value) -> bool {
        let field = self.field.trim_start_matches("metadata.");
        (meta_str(obj, field) == self.value) == self.equal
    }
}

/// The list parameters FakeKube understands.
#[derive(Debug, Default)]
pub(crate) struct ListQuery {
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
}

// ---------------------------------------------------------------------------
// Continue tokens
// ---------------------------------------------------------------------------

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(B64[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

fn unbase64url(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = B64.iter().position(|&b| b == c)?;
        acc = acc << 6 | u32::try_from(v).ok()?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from(acc >> bits & 0xff).ok()?);
        }
    }
    Some(out)
}

/// A consistent copy of one LIST's scope, kept for its continue tokens.
struct Snapshot {
    group: String,
    plural: String,
    namespace: Option<String>,
    resource_version: u64,
    items: Vec<Value>,
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

/// An injected failure waiting for matching requests.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub method: String,
    pub path_contains: String,
    pub remaining: usize,
    pub status: u16,
    pub after_apply: bool,
}

// ---------------------------------------------------------------------------
// The store
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    group: String,
    plural: String,
    namespace: String,
    name: String,
}

impl Key {
    fn new(rt: &ResourceType, namespace: Option<&str>, name: &str) -> Key {
        Key {
            group: rt.group.clone(),
            plural: rt.plural.clone(),
            namespace: if rt.namespaced {
                namespace.unwrap_or("").to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
        }
    }
}

/// What kind of write an update is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// PUT/PATCH on the main resource: `status` is kept from the stored
    /// object when it is a subresource.
    Main,
    /// PUT/PATCH on `/status`: only `status` is taken.
    Status,
    /// [`FakeKube::put`](super::FakeKube::put): no resourceVersion
    /// precondition, spec and status both taken.
    Direct,
}

/// How a DELETE was asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub orphan: bool,
}

/// Everything FakeKube holds, behind one mutex.
pub(crate) struct State {
    objects: BTreeMap<Key, Value>,
    resource_version: u64,
    uids: UidGen,
    snapshots: HashMap<u64, Snapshot>,
    next_snapshot: u64,
    pub page_size: Option<usize>,
    /// `(namespace, name)` of objects that LISTs leave out (see
    /// `FakeKube::hide_from_lists`).
    pub hidden: Vec<(String, String)>,
    pub requests: Vec<Recorded>,
    pub violations: Vec<String>,
    /// HTTP writes that did not ask for `fieldValidation=Strict`.
    pub lax_writes: Vec<String>,
    pub faults: Vec<Fault>,
}

impl State {
    pub fn new() -> State {
        State {
            objects: BTreeMap::new(),
            resource_version: 0,
            uids: UidGen::new(),
            snapshots: HashMap::new(),
            next_snapshot: 0,
            page_size: None,
            hidden: Vec::new(),
            requests: Vec::new(),
            violations: Vec::new(),
            lax_writes: Vec::new(),
            faults: Vec::new(),
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    fn bump(&mut self, obj: &mut Value) {
        self.resource_version += 1;
        meta_mut(obj).insert(
            "resourceVersion".into(),
            Value::String(self.resource_version.to_string()),
        );
    }

    /// Takes the first fault matching the request, if any, and returns its
    /// status code.
    pub fn take_fault(&mut self, method: &str, path: &str, after_apply: bool) -> Option<u16> {
        let i = self.faults.iter().position(|f| {
            f.after_apply == after_apply
                && (f.method == "*" || f.method.eq_ignore_ascii_case(method))
                && path.contains(&f.path_contains)
        })?;
        let fault = &mut self.faults[i];
        fault.remaining -= 1;
        let status = fault.status;
        if fault.remaining == 0 {
            self.faults.remove(i);
        }
        Some(status)
    }

    // -- reads --------------------------------------------------------------

    pub fn get(&self, rt: &ResourceType, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.objects.get(&Key::new(rt, namespace, name)).cloned()
    }

    pub fn get_or_404(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.get(rt, namespace, name)
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Every object of a resource in `namespace` (all namespaces if `None`),
    /// ordered by namespace and name as etcd keys are.
    pub fn scope(&self, rt: &ResourceType, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| {
                k.group == rt.group
                    && k.plural == rt.plural
                    && namespace.is_none_or(|ns| k.namespace == ns)
            })
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// A LIST, paged when `limit` is set (capped by the page size).
    pub fn list(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        query: &ListQuery,
    ) -> Result<Value, ApiError> {
        let labels = parse_label_selector(query.label_selector.as_deref().unwrap_or(""))?;
        let fields = parse_field_selector(query.field_selector.as_deref().unwrap_or(""))?;
        let hidden = self.hidden.clone();
        let selected = |obj: &Value| {
            let m = meta(obj);
            let key = (
                m.get("namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                m.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            );
            if hidden.contains(&key) {
                return false;
            }
            let obj_labels = meta(obj)
                .get("labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            labels.iter().all(|r| r.matches(&obj_labels)) && fields.iter().all(|r| r.matches(obj))
        };
        let page = match (query.limit.filter(|&l| l > 0), self.page_size) {
            (Some(limit), Some(cap)) => Some(limit.min(cap)),
            (limit, _) => limit,
        };

        let (snapshot_id, start) = match &query.continue_token {
            Some(token) => {
                let (id, start) = self.decode_continue(token, rt, namespace)?;
                (Some(id), start)
            }
            None => (None, 0),
        };
        let (items, resource_version) = match snapshot_id {
            Some(id) => {
                let s = &self.snapshots[&id];
                (s.items.clone(), s.resource_version)
            }
            None => (self.scope(rt, namespace), self.resource_version),
        };

        let mut out = Vec::new();
        let mut next = None;
        for (i, obj) in items.iter().enumerate().skip(start) {
            if !selected(obj) {
                continue;
            }
            if page.is_some_and(|p| out.len() == p) {
                next = Some(i);
                break;
            }
            out.push(obj.clone());
        }

        let mut list_meta = Map::new();
        list_meta.insert(
            "resourceVersion".into(),
            Value::String(resource_version.to_string()),
        );
        if let Some(next) = next {
            let id = snapshot_id.unwrap_or_else(|| {
                self.next_snapshot += 1;
                self.snapshots.insert(
                    self.next_snapshot,
                    Snapshot {
                        group: rt.group.clone(),
                        plural: rt.plural.clone(),
                        namespace: namespace.map(str::to_owned),
                        resource_version,
                        items: items.clone(),
                    },
                );
                self.next_snapshot
            });
            let token =
                json!({"v": "fakekube/v1", "rv": resource_version, "snapshot": id, "start": next});
            list_meta.insert(
                "continue".into(),
                Value::String(base64url(token.to_string().as_bytes())),
            );
            if labels.is_empty() && fields.is_empty() {
                list_meta.insert("remainingItemCount".into(), json!(items.len() - next));
            }
        }
        Ok(json!({
            "apiVersion": rt.api_version(),
            "kind": rt.list_kind,
            "metadata": list_meta,
            "items": out,
        }))
    }

    fn decode_continue(
        &self,
        token: &str,
        rt: &ResourceType,
        namespace: Option<&str>,
    ) -> Result<(u64, usize), ApiError> {
        let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
        let decoded: Value = unbase64url(token)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(bad)?;
        if decoded.get("v").and_then(Value::as_str) != Some("fakekube/v1") {
            return Err(bad());
        }
        let id = decoded
            .get("snapshot")
            .and_then(Value::as_u64)
            .ok_or_else(bad)?;
        let start = decoded
            .get("start")
            .and_then(Value::as_u64)
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(bad)?;
        let snapshot = self.snapshots.get(&id).ok_or_else(ApiError::expired)?;
        if snapshot.group != rt.group
            || snapshot.plural != rt.plural
            || snapshot.namespace.as_deref() != namespace
        {
            return Err(ApiError::bad_request(
                "continue key is not valid: it belongs to another list",
            ));
        }
        Ok((id, start))
    }

    /// Forgets every LIST snapshot: their continue tokens now get 410 Gone,
    /// as after an etcd compaction.
    pub fn expire_snapshots(&mut self) {
        self.snapshots.clear();
    }

    // -- create -------------------------------------------------------------

    /// POST: `namespace` is the request path's (for the HTTP API) or the
    /// object's own (for seeding).
    pub fn create(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        check_type_meta(rt, &obj)?;
        let uid = self.uids.next();
        let m = meta_mut(&mut obj);
        if rt.namespaced {
            let path_ns = namespace.unwrap_or("");
            match m.get("namespace").and_then(Value::as_str) {
                Some(ns) if !ns.is_empty() && ns != path_ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {
                    m.insert("namespace".into(), Value::String(path_ns.to_owned()));
                }
            }
        } else {
            m.remove("namespace");
        }
        if m.get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|rv| !rv.is_empty())
        {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let name = m.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() {
            if let Some(prefix) = m.get("generateName").and_then(Value::as_str) {
                let suffix: String = uid
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(5)
                    .collect();
                m.insert("name".into(), Value::String(format!("{prefix}{suffix}")));
            }
        }
        m.insert("uid".into(), Value::String(uid));
        m.insert("creationTimestamp".into(), Value::String(now()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        if rt.status {
            if let Some(root) = obj.as_object_mut() {
                root.remove("status");
            }
        }
        validate(rt, &obj)?;
        let name = meta_str(&obj, "name").to_owned();
        let key = Key::new(rt, namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(rt, &name));
        }
        self.bump(&mut obj);
        self.objects.insert(key, obj.clone());
        Ok(obj)
    }

    // -- update -------------------------------------------------------------

    /// PUT (or a PATCH once applied), on the main resource, on `/status`, or
    /// directly. Returns the stored object (the last state if the update
    /// removed it).
    pub fn update(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        mut new: Value,
        write: Write,
    ) -> Result<Value, ApiError> {
        check_type_meta(rt, &new)?;
        {
            let m = meta_mut(&mut new);
            let body_name = m.get("name").and_then(Value::as_str).unwrap_or("");
            if body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            if rt.namespaced {
                let path_ns = namespace.unwrap_or("");
                match m.get("namespace").and_then(Value::as_str) {
                    Some(ns) if !ns.is_empty() && ns != path_ns => {
                        return Err(ApiError::bad_request(
                            "the namespace of the provided object does not match the namespace sent on the request",
                        ));
                    }
                    _ => {
                        m.insert("namespace".into(), Value::String(path_ns.to_owned()));
                    }
                }
            } else {
                m.remove("namespace");
            }
        }
        let key = Key::new(rt, namespace, name);
        let existing = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        let current_rv = meta_str(&existing, "resourceVersion").to_owned();
        if write != Write::Direct {
            let rv = meta_str(&new, "resourceVersion");
            if rv.is_empty() {
                return Err(ApiError::invalid(
                    rt,
                    name,
                    vec![Cause::invalid(
                        "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an update",
                    )],
                ));
            }
            if rv != current_rv {
                return Err(ApiError::conflict(
                    rt,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
        }

        let mut next = match write {
            Write::Status => {
                let mut next = existing.clone();
                let root = next.as_object_mut().expect("stored objects are objects");
                match new.get("status") {
                    Some(status) => root.insert("status".into(), status.clone()),
                    None => root.remove("status"),
                };
                next
            }
            Write::Main if rt.status => {
                let root = new.as_object_mut().expect("checked above");
                match existing.get("status") {
                    Some(status) => root.insert("status".into(), status.clone()),
                    None => root.remove("status"),
                };
                new
            }
            Write::Main | Write::Direct => new,
        };

        // System fields: immutable, or silently kept, as BeforeUpdate does.
        let old = meta(&existing).clone();
        let m = meta_mut(&mut next);
        let new_uid = m.get("uid").and_then(Value::as_str).unwrap_or("");
        let old_uid = old.get("uid").and_then(Value::as_str).unwrap_or("");
        if !new_uid.is_empty() && new_uid != old_uid && write != Write::Direct {
            return Err(ApiError::invalid(
                rt,
                name,
                vec![Cause::invalid(
                    "metadata.uid",
                    format!("Invalid value: {new_uid:?}: field is immutable"),
                )],
            ));
        }
        for field in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
            match old.get(field) {
                Some(v) => m.insert(field.into(), v.clone()),
                None => m.remove(field),
            };
        }
        if old.contains_key("deletionTimestamp") {
            for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
                match old.get(field) {
                    Some(v) => m.insert(field.into(), v.clone()),
                    None => m.remove(field),
                };
            }
        } else if m.get("deletionTimestamp").is_some_and(|t| !t.is_null()) {
            return Err(ApiError::invalid(
                rt,
                name,
                vec![Cause::invalid(
                    "metadata.deletionTimestamp",
                    "Invalid value: field is immutable; may only be changed via deletion",
                )],
            ));
        } else {
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
        }

        if is_deleting(&existing) {
            let before = finalizers(&existing);
            let added: Vec<String> = finalizers(&next)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    rt,
                    name,
                    vec![Cause::forbidden(
                        "metadata.finalizers",
                        format!("Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"),
                    )],
                ));
            }
        }

        validate(rt, &next)?;

        if generation_content(rt, &next) != generation_content(rt, &existing) {
            let generation = meta(&existing)
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut next).insert("generation".into(), json!(generation + 1));
        }
        if next == existing {
            // A no-op write: etcd is not touched, resourceVersion stays.
            return Ok(existing);
        }
        if is_deleting(&next) && finalizers(&next).is_empty() {
            return Ok(self.remove(&key, Some(next)).expect("the object exists"));
        }
        self.bump(&mut next);
        self.objects.insert(key, next.clone());
        Ok(next)
    }

    // -- delete and garbage collection --------------------------------------

    /// DELETE: marks an object with finalizers as deleting, removes any
    /// other (collecting its dependents).
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<DeleteOutcome, ApiError> {
        let key = Key::new(rt, namespace, name);
        let existing = self
            .objects
            .get(&key)
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        let uid = meta_str(existing, "uid").to_owned();
        if let Some(want) = &options.uid {
            if *want != uid {
                return Err(ApiError::conflict(
                    rt,
                    name,
                    &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
                ));
            }
        }
        if let Some(want) = &options.resource_version {
            let rv = meta_str(existing, "resourceVersion");
            if want != rv {
                return Err(ApiError::conflict(
                    rt,
                    name,
                    &format!("Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"),
                ));
            }
        }
        if options.orphan {
            self.orphan_dependents(&uid);
        }
        Ok(self.delete_key(&key))
    }

    fn delete_key(&mut self, key: &Key) -> DeleteOutcome {
        let mut obj = self.objects[key].clone();
        if finalizers(&obj).is_empty() {
            return DeleteOutcome::Removed(self.remove(key, None).expect("the object exists"));
        }
        if is_deleting(&obj) {
            return DeleteOutcome::Finalizing(obj);
        }
        let generation = meta(&obj)
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let m = meta_mut(&mut obj);
        m.insert("deletionTimestamp".into(), Value::String(now()));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        if generation > 0 {
            m.insert("generation".into(), json!(generation + 1));
        }
        self.bump(&mut obj);
        self.objects.insert(key.clone(), obj.clone());
        DeleteOutcome::Finalizing(obj)
    }

    /// Removes an object for good (its last state `last` if given), then
    /// collects its dependents.
    fn remove(&mut self, key: &Key, last: Option<Value>) -> Option<Value> {
        let stored = self.objects.remove(key)?;
        let mut obj = last.unwrap_or(stored);
        self.bump(&mut obj);
        let uid = meta_str(&obj, "uid").to_owned();
        self.collect_dependents_of(&uid);
        Some(obj)
    }

    fn live_uids(&self) -> HashSet<String> {
        self.objects
            .values()
            .map(|o| meta_str(o, "uid").to_owned())
            .collect()
    }

    fn keys_owned_by(&self, uid: &str) -> Vec<Key> {
        self.objects
            .iter()
            .filter(|(_, o)| owner_uids(o).iter().any(|u| u == uid))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// What the garbage collector does for one object: if none of its
    /// owners exist any more it is deleted (finalizers honoured); if only
    /// some are gone, the dangling references are removed. Returns whether
    /// anything changed.
    fn collect(&mut self, key: &Key) -> bool {
        let Some(obj) = self.objects.get(key) else {
            return false;
        };
        let owners = owner_uids(obj);
        if owners.is_empty() {
            return false;
        }
        let live = self.live_uids();
        let dangling: Vec<&String> = owners.iter().filter(|u| !live.contains(*u)).collect();
        if dangling.is_empty() {
            return false;
        }
        if dangling.len() == owners.len() {
            if is_deleting(obj) {
                return false;
            }
            self.delete_key(key);
            return true;
        }
        let mut obj = obj.clone();
        if let Some(refs) = meta_mut(&mut obj)
            .get_mut("ownerReferences")
            .and_then(Value::as_array_mut)
        {
            refs.retain(|r| {
                r.get("uid")
                    .and_then(Value::as_str)
                    .is_some_and(|u| live.contains(u))
            });
        }
        self.bump(&mut obj);
        self.objects.insert(key.clone(), obj);
        true
    }

    fn collect_dependents_of(&mut self, uid: &str) {
        if uid.is_empty() {
            return;
        }
        for key in self.keys_owned_by(uid) {
            self.collect(&key);
        }
    }

    /// A full garbage-collector pass over every object with owners.
    pub fn collect_garbage(&mut self) {
        loop {
            let keys: Vec<Key> = self
                .objects
                .iter()
                .filter(|(_, o)| !owner_uids(o).is_empty())
                .map(|(k, _)| k.clone())
                .collect();
            let mut changed = false;
            for key in keys {
                changed |= self.collect(&key);
            }
            if !changed {
                break;
            }
        }
    }

    /// propagationPolicy=Orphan: dependents lose their reference to `uid`.
    fn orphan_dependents(&mut self, uid: &str) {
        for key in self.keys_owned_by(uid) {
            let mut obj = self.objects[&key].clone();
            if let Some(refs) = meta_mut(&mut obj)
                .get_mut("ownerReferences")
                .and_then(Value::as_array_mut)
            {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
            }
            self.bump(&mut obj);
            self.objects.insert(key, obj);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_rfc3339(1_798_561_027), "2026-12-29T16:17:07Z");
    }

    #[test]
    fn uids_are_unique_uuids() {
        let mut g = UidGen::new();
        let a = g.next();
        let b = g.next();
        assert_ne!(a, b);
        let re =
            Regex::new(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
                .unwrap();
        assert!(re.is_match(&a), "{a}");
        assert!(re.is_match(&b), "{b}");
    }

    #[test]
    fn base64url_round_trips() {
        for s in ["", "a", "ab", "abc", "abcd", "{\"v\":\"fakekube/v1\"}"] {
            assert_eq!(unbase64url(&base64url(s.as_bytes())).unwrap(), s.as_bytes());
        }
        assert_eq!(base64url(b"hello"), "aGVsbG8");
        assert!(unbase64url("a+b").is_none());
    }

    #[test]
    fn label_selectors() {
        let labels: Map<String, Value> =
            serde_json::from_value(json!({"a": "1", "b": "2", "x.io/c": "3"})).unwrap();
        let matches = |s: &str| {
            parse_label_selector(s)
                .unwrap()
                .iter()
                .all(|r| r.matches(&labels))
        };
        assert!(matches(""));
        assert!(matches("a=1,b==2"));
        assert!(!matches("a=1,b=3"));
        assert!(matches("a!=2,z!=1"));
        assert!(matches("x.io/c in (1,3), a notin (2)"));
        assert!(!matches("a in (2,3)"));
        assert!(matches("a,!z"));
        assert!(!matches("!a"));
        for bad in ["a=1,", "a in (1", "a=b c", "a frob (1)", "-a=1"] {
            assert!(parse_label_selector(bad).is_err(), "{bad}");
        }
    }
}
