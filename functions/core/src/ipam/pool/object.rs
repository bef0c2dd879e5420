//! A pool object as registered: its envelope (kind, namespace, name, uid,
//! labels and annotations kept as they came) around its spec.

use crate::error::{Error, Result};
use serde_json::{Map, Value};

use super::{PoolId, PoolSpec};

/// A pool object as registered through the API: envelope plus spec.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolObject {
    /// Identity derived from kind, namespace and name.
    pub id: PoolId,
    /// `metadata` as given, minus server-managed fields we do not keep
    /// (`resourceVersion`, `managedFields`, `creationTimestamp` are kept only
    /// if present; we never invent them).
    pub metadata: Map<String, Value>,
    /// The spec.
    pub spec: PoolSpec,
}

impl PoolObject {
    /// Parses a pool object registered at `id` (from the route).
    ///
    /// `apiVersion` must be the kind's (ours, or the in-cluster provider's
    /// for its kinds), `kind` must match the route's kind,
    /// `metadata.name` / `metadata.namespace` must match the route when given
    /// (they are filled in from the route when absent).
    ///
    /// # Errors
    /// 400 if `body` is not a JSON object; 422 naming the field otherwise.
    pub fn parse(id: &PoolId, body: &Value) -> Result<PoolObject> {
        let obj = body
            .as_object()
            .ok_or_else(|| Error::malformed("the body must be a JSON object"))?;
        let api_version = id.kind.api_version();
        match obj.get("apiVersion").and_then(Value::as_str) {
            Some(v) if v == api_version => {}
            Some(other) => {
                return Err(Error::invalid(
                    "apiVersion",
                    format!("{other:?} is not served; use {api_version:?}"),
                ))
            }
            None => return Err(Error::invalid("apiVersion", "is required")),
        }
        let want_kind = id.kind.kind_name();
        match obj.get("kind").and_then(Value::as_str) {
            Some(k) if k == want_kind => {}
            Some(k) => {
                return Err(Error::invalid(
                    "kind",
                    format!("{k:?} does not match this route, which serves {want_kind:?}"),
                ))
            }
            None => return Err(Error::invalid("kind", "is required")),
        }
        let mut metadata = match obj.get("metadata") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err(Error::invalid("metadata", "must be an object")),
        };
        match metadata.get("name").and_then(Value::as_str) {
            None => {
                metadata.insert("name".into(), id.name.clone().into());
            }
            Some(n) if n == id.name => {}
            Some(n) => {
                return Err(Error::invalid(
                    "metadata.name",
                    format!("{n:?} does not match the name in the path, {:?}", id.name),
                ))
            }
        }
        match (
            &id.namespace,
            metadata.get("namespace").and_then(Value::as_str),
        ) {
            (Some(ns), None) => {
                metadata.insert("namespace".into(), ns.clone().into());
            }
            (Some(ns), Some(n)) if n == ns => {}
            (Some(ns), Some(n)) => {
                return Err(Error::invalid(
                    "metadata.namespace",
                    format!("{n:?} does not match the namespace in the path, {ns:?}"),
                ))
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "metadata.namespace",
                    format!(
                        "a {} is cluster-scoped and has no namespace",
                        id.kind.kind_name()
                    ),
                ))
            }
            (None, None) => {}
        }
        // Fields the server manages are not part of what we store.
        for k in ["managedFields", "resourceVersion", "selfLink"] {
            metadata.remove(k);
        }
        let spec = PoolSpec::from_json_as(id.kind, obj.get("spec").unwrap_or(&Value::Null))?;
        Ok(PoolObject {
            id: id.clone(),
            metadata,
            spec,
        })
    }

    /// The object as JSON, with `status` when given.
    pub fn to_json(&self, status: Option<Value>) -> Value {
        let mut m = Map::new();
        m.insert("apiVersion".into(), self.id.kind.api_version().into());
        m.insert("kind".into(), self.id.kind.kind_name().into());
        m.insert("metadata".into(), Value::Object(self.metadata.clone()));
        m.insert("spec".into(), self.spec.to_json());
        if let Some(s) = status {
            m.insert("status".into(), s);
        }
        Value::Object(m)
    }

    /// `metadata.uid`, when the object came from Kubernetes.
    pub fn uid(&self) -> Option<&str> {
        self.metadata.get("uid").and_then(Value::as_str)
    }
}
