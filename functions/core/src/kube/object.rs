//! Typed views of what metal-ipam reads from Kubernetes objects: the
//! `metadata` every object has ([`ObjectMeta`], [`OwnerReference`]), the
//! [`Object`] trait the finalizer and status helpers work on, and
//! [`WithJson`] for the few places that also pass the object through
//! (a pool's metadata is stored as it came).
//!
//! The views read leniently, as the JSON accessors they replace did: an
//! absent, `null` or mistyped field reads as empty (the API server checks
//! objects against their schema, so this matters only for hand-made
//! JSON). Fields the code does not decide on are not modelled, and nothing
//! here writes an object back whole. Writes are serialised from typed
//! values ([`OwnerReference`], [`MetadataPatch`],
//! `conditions::Condition`).
//!
//! The readers are written out rather than derived with `serde`. Measured
//! in release wasm, the derive and `serde_json`'s `Value` deserializer that
//! comes with it added 30 KB to a component reading only metadata, and
//! 42–64 KB to each IPAM component. These readers cost 1–13 KB.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

/// `metadata` as far as metal-ipam decides on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    /// `name`.
    pub name: String,
    /// `namespace` (`None` for cluster-scoped objects).
    pub namespace: Option<String>,
    /// `uid`.
    pub uid: Option<String>,
    /// `generation` (copied to a condition's `observedGeneration`).
    pub generation: Option<i64>,
    /// `resourceVersion`: the precondition of guarded writes.
    pub resource_version: Option<String>,
    /// `deletionTimestamp`: set once deletion was requested.
    pub deletion_timestamp: Option<String>,
    /// `finalizers`.
    pub finalizers: Vec<String>,
    /// `labels`, as the API returned them ([`ObjectMeta::label`] reads one).
    pub labels: Map<String, Value>,
    /// `annotations`, as the API returned them ([`ObjectMeta::annotation`]
    /// reads one).
    pub annotations: Map<String, Value>,
    /// `ownerReferences`.
    pub owner_references: Vec<OwnerReference>,
}

impl ObjectMeta {
    /// Reads `v` (an object's `metadata`).
    pub fn from_json(v: &Value) -> ObjectMeta {
        ObjectMeta {
            name: string(v, "name"),
            namespace: opt_string(v, "namespace"),
            uid: opt_string(v, "uid"),
            generation: v.get("generation").and_then(Value::as_i64),
            resource_version: opt_string(v, "resourceVersion"),
            deletion_timestamp: opt_string(v, "deletionTimestamp"),
            finalizers: list(v, "finalizers", |f| f.as_str().map(str::to_string)),
            labels: string_map(v, "labels"),
            annotations: string_map(v, "annotations"),
            owner_references: list(v, "ownerReferences", OwnerReference::from_json),
        }
    }

    /// Whether deletion was requested (`deletionTimestamp` is set).
    pub fn deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    /// Whether the object carries finalizer `f`.
    pub fn has_finalizer(&self, f: &str) -> bool {
        self.finalizers.iter().any(|x| x == f)
    }

    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key)?.as_str()
    }

    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)?.as_str()
    }

    /// Whether an owner reference points at `uid`.
    pub fn owned_by(&self, uid: &str) -> bool {
        self.owner_references.iter().any(|r| r.uid == uid)
    }

    /// `resourceVersion` as JSON (`null` when absent), for a patch's
    /// precondition.
    pub fn resource_version_json(&self) -> Value {
        self.resource_version
            .clone()
            .map_or(Value::Null, Value::from)
    }
}

/// One `metadata.ownerReferences` entry (every field of
/// `metav1.OwnerReference`, so a list read and written back is unchanged):
/// read with [`OwnerReference::from_json`], written serialised.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    /// `apiVersion` of the owner.
    pub api_version: String,
    /// `kind` of the owner.
    pub kind: String,
    /// `name` of the owner.
    pub name: String,
    /// `uid` of the owner.
    pub uid: String,
    /// Whether the owner is the managing controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    /// Whether the owner's deletion waits for this object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
}

impl OwnerReference {
    /// Reads one entry; `None` unless it is an object.
    pub fn from_json(v: &Value) -> Option<OwnerReference> {
        v.as_object()?;
        Some(OwnerReference {
            api_version: string(v, "apiVersion"),
            kind: string(v, "kind"),
            name: string(v, "name"),
            uid: string(v, "uid"),
            controller: v.get("controller").and_then(Value::as_bool),
            block_owner_deletion: v.get("blockOwnerDeletion").and_then(Value::as_bool),
        })
    }

    /// A reference to the managing controller `kind` `name` (`uid`) of
    /// `api_version`, blocking its deletion (`controller` false: an owner
    /// that is not the controller).
    pub fn owner(api_version: &str, kind: &str, name: &str, uid: &str, controller: bool) -> Self {
        OwnerReference {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        }
    }

    /// As JSON, field names as in the API (absent flags omitted).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A merge patch of `metadata`, guarded by `resourceVersion` (serialised
/// as `null` when absent, which the server takes as no precondition).
/// Fields left `None` are not touched.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataPatch {
    /// New `finalizers`, whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finalizers: Option<Vec<String>>,
    /// New `ownerReferences`, whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_references: Option<Vec<OwnerReference>>,
    /// Labels to set (others are kept: a merge patch merges maps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// The precondition.
    pub resource_version: Option<String>,
}

impl MetadataPatch {
    /// Whether the patch changes nothing (only the precondition is set).
    pub fn is_empty(&self) -> bool {
        self.finalizers.is_none() && self.owner_references.is_none() && self.labels.is_none()
    }

    /// The merge patch body: `{"metadata": …}`.
    pub fn to_json(&self) -> Value {
        #[derive(Serialize)]
        struct Body<'a> {
            metadata: &'a MetadataPatch,
        }
        serde_json::to_value(Body { metadata: self }).unwrap_or(Value::Null)
    }
}

/// A typed Kubernetes object: something with [`ObjectMeta`].
pub trait Object: Sized {
    /// Reads the typed view of `v`, leniently (see the module docs).
    fn from_json(v: &Value) -> Self;

    /// The object's metadata.
    fn meta(&self) -> &ObjectMeta;
}

/// An object with nothing typed but its metadata (for pause, uid and
/// finalizer checks on kinds whose other fields do not matter).
///
/// ```
/// use metal_ipam_core::kube::object::{Meta, Object};
/// let o = Meta::from_json(&serde_json::json!(
///     {"metadata": {"name": "c", "annotations": {"cluster.x-k8s.io/paused": ""}, "finalizers": null, "labels": []}}
/// ));
/// assert_eq!(o.metadata.annotation("cluster.x-k8s.io/paused"), Some(""));
/// assert!(o.metadata.finalizers.is_empty() && o.metadata.labels.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    /// `metadata`.
    pub metadata: ObjectMeta,
}

impl Object for Meta {
    fn from_json(v: &Value) -> Self {
        Meta {
            metadata: metadata(v),
        }
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// A typed object together with the JSON it was read from, for code that
/// decides on the typed fields and passes the object on whole.
#[derive(Debug, Clone, PartialEq)]
pub struct WithJson<T> {
    /// The typed view.
    pub typed: T,
    /// The object as the API server returned it.
    pub json: Value,
}

impl<T: Object> Object for WithJson<T> {
    fn from_json(v: &Value) -> Self {
        WithJson {
            typed: T::from_json(v),
            json: v.clone(),
        }
    }

    fn meta(&self) -> &ObjectMeta {
        self.typed.meta()
    }
}

/// The `metadata` of object `v`.
pub fn metadata(v: &Value) -> ObjectMeta {
    ObjectMeta::from_json(v.get("metadata").unwrap_or(&Value::Null))
}

/// `v[key]` as a string; empty when absent or not a string.
pub fn string(v: &Value, key: &str) -> String {
    opt_string(v, key).unwrap_or_default()
}

/// `v[key]` as a string, when it is one.
pub fn opt_string(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

/// `v[key]` as a list of what `item` reads; entries it refuses are skipped.
pub fn list<T>(v: &Value, key: &str, item: impl Fn(&Value) -> Option<T>) -> Vec<T> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(item).collect())
        .unwrap_or_default()
}

/// `v[key]` when it is an object (a `map[string]string` as the API
/// returned it; read values with `as_str`).
pub fn string_map(v: &Value, key: &str) -> Map<String, Value> {
    v.get(key)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// `v[key]` when it is an array (entries passed through as they are).
pub fn array(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn owner_references_round_trip_unchanged() {
        let refs = json!([
            {"apiVersion": "a/v1", "kind": "K", "name": "n", "uid": "u", "controller": true, "blockOwnerDeletion": true},
            {"apiVersion": "b/v1", "kind": "L", "name": "m", "uid": "v"}
        ]);
        let typed = list(&json!({ "r": refs }), "r", OwnerReference::from_json);
        assert_eq!(typed.len(), 2);
        let back: Vec<Value> = typed.iter().map(OwnerReference::to_json).collect();
        assert_eq!(Value::Array(back), refs);
    }

    #[test]
    fn metadata_reads_what_the_helpers_need() {
        let m = Meta::from_json(&json!({"metadata": {
            "name": "a", "namespace": "ns", "uid": "u1", "generation": 3, "resourceVersion": "42",
            "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x", 7, "y"],
            "labels": {"l": "1", "n": 2}, "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u0"}, "junk"],
            "managedFields": [{"whatever": 1}]
        }}))
        .metadata;
        assert!(m.deleting());
        assert_eq!(m.finalizers, ["x", "y"]);
        assert!(m.has_finalizer("y") && !m.has_finalizer("z"));
        assert_eq!(m.label("l"), Some("1"));
        assert_eq!(
            m.label("n"),
            None,
            "a label that is not a string reads as absent"
        );
        assert_eq!(m.annotation("l"), None);
        assert_eq!(m.owner_references.len(), 1);
        assert!(m.owned_by("u0") && !m.owned_by("u1"));
        assert_eq!(m.resource_version_json(), json!("42"));
        assert_eq!(m.generation, Some(3));
        assert_eq!(
            Meta::default().metadata.resource_version_json(),
            Value::Null
        );
        let none = Meta::from_json(&json!({"metadata": {"deletionTimestamp": null}})).metadata;
        assert!(!none.deleting());
        assert_eq!(Meta::from_json(&json!(7)), Meta::default());
    }

    #[test]
    fn with_json_keeps_the_object_whole() {
        let v = json!({"metadata": {"name": "p"}, "spec": {"anything": [1, 2]}});
        let w = WithJson::<Meta>::from_json(&v);
        assert_eq!(w.json, v);
        assert_eq!(w.meta().name, "p");
    }
}
