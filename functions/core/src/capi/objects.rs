//! Typed views of the other objects the contract steps decide on: the CAPI
//! `Cluster` (pause) and our pool objects (metadata and status; the spec
//! is [`crate::ipam::pool::PoolObject`]'s). Claims and `IPAddress`es are
//! [`crate::ipam::claim`]'s.

use serde_json::Value;

use crate::kube::object::{self, metadata, Object, ObjectMeta};

/// CAPI's pause annotation (on claims, Clusters and pools).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// Whether `o` carries [`PAUSED_ANNOTATION`].
pub fn paused(o: &impl Object) -> bool {
    o.meta().annotation(PAUSED_ANNOTATION).is_some()
}

/// A CAPI `Cluster`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterObject {
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// `spec`.
    pub spec: ClusterSpec,
}

/// `Cluster.spec`, as far as metal-ipam reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterSpec {
    /// `paused`.
    pub paused: Option<bool>,
}

impl ClusterObject {
    /// Paused by `spec.paused` or by the annotation.
    pub fn is_paused(&self) -> bool {
        self.spec.paused == Some(true) || paused(self)
    }
}

impl Object for ClusterObject {
    fn from_json(v: &Value) -> Self {
        ClusterObject {
            metadata: metadata(v),
            spec: ClusterSpec {
                paused: v.pointer("/spec/paused").and_then(Value::as_bool),
            },
        }
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// A CAPI `Machine` or an infrastructure machine (CAPP's `PacketMachine`),
/// as far as metal-ipam reads it: the Metal device its `spec.providerID`
/// names, and for a `Machine` its infrastructure machine and cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineObject {
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// `spec.providerID`, when set and not empty.
    pub provider_id: Option<String>,
    /// `spec.infrastructureRef` (kind, name) of a CAPI Machine.
    pub infrastructure: Option<(String, String)>,
    /// `spec.clusterName` of a CAPI Machine.
    pub cluster: Option<String>,
}

impl Object for MachineObject {
    fn from_json(v: &Value) -> Self {
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
        MachineObject {
            metadata: metadata(v),
            provider_id: s("/spec/providerID").filter(|p| !p.is_empty()),
            infrastructure: s("/spec/infrastructureRef/kind")
                .zip(s("/spec/infrastructureRef/name")),
            cluster: s("/spec/clusterName"),
        }
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// A `MetalIPPool` or `GlobalMetalIPPool` as read from the API server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolResource {
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// Whether `spec.metal` or `spec.phoenixnap` is set: a cloud-backed
    /// pool, which the provision step syncs (see [`crate::capi::vrf`]).
    pub vrf_backed: bool,
    /// `status`.
    pub status: PoolStatus,
}

/// A pool's `status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolStatus {
    /// `conditions`.
    pub conditions: Vec<Value>,
    /// `ipAddresses` (the counts), compared whole before a write.
    pub ip_addresses: Option<Value>,
    /// `metal` (a VRF-backed pool's resources), compared whole before a
    /// write.
    pub metal: Option<Value>,
    /// `phoenixnap` (a phoenixNAP-backed pool's resources), compared whole
    /// before a write.
    pub phoenixnap: Option<Value>,
}

impl Object for PoolResource {
    fn from_json(v: &Value) -> Self {
        let status = v.get("status").unwrap_or(&Value::Null);
        PoolResource {
            metadata: metadata(v),
            vrf_backed: ["/spec/metal", "/spec/phoenixnap"]
                .iter()
                .any(|p| v.pointer(p).is_some_and(Value::is_object)),
            status: PoolStatus {
                conditions: object::array(status, "conditions"),
                ip_addresses: status.get("ipAddresses").cloned(),
                metal: status.get("metal").cloned(),
                phoenixnap: status.get("phoenixnap").cloned(),
            },
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

    #[test]
    fn a_cluster_is_paused_by_spec_or_annotation() {
        let c = |v| ClusterObject::from_json(&v);
        assert!(!c(json!({"metadata": {"name": "c"}, "spec": {"paused": false}})).is_paused());
        assert!(c(json!({"metadata": {"name": "c"}, "spec": {"paused": true}})).is_paused());
        assert!(
            c(json!({"metadata": {"name": "c", "annotations": {PAUSED_ANNOTATION: ""}}}))
                .is_paused()
        );
        assert!(!c(json!({"metadata": {"name": "c"}})).is_paused());
    }
}
