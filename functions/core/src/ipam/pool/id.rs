//! Which pool: the pool kinds ([`PoolKind`]: our four and, during a
//! takeover, the in-cluster provider's four) and a pool's identity
//! ([`PoolId`]), the one place (kind, namespace, name) becomes an id.

use super::{KIND_GLOBAL, KIND_GLOBAL_PREFIX, KIND_NAMESPACED, KIND_PREFIX};
use crate::kube::{self, Resource};

/// Which pool kind: ours (namespaced or cluster-wide, handing out
/// addresses or sub-prefixes) or the in-cluster provider's, which
/// metal-ipam serves only while it has taken that kind over
/// (`capi::takeover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// `MetalIPPool`: addresses, to claims of its own namespace.
    Namespaced,
    /// `GlobalMetalIPPool`: addresses, to claims of every namespace.
    Global,
    /// `MetalPrefixPool`: sub-prefixes, to claims of its own namespace.
    NamespacedPrefix,
    /// `GlobalMetalPrefixPool`: sub-prefixes, to claims of every namespace.
    GlobalPrefix,
    /// The in-cluster provider's `InClusterIPPool`.
    InCluster,
    /// The in-cluster provider's `GlobalInClusterIPPool`.
    GlobalInCluster,
    /// The in-cluster provider's `InClusterPrefixPool`.
    InClusterPrefix,
    /// The in-cluster provider's `GlobalInClusterPrefixPool`.
    GlobalInClusterPrefix,
}

impl PoolKind {
    /// Our kinds (group `ipam.metal-ipam.dev`).
    pub const ALL: [PoolKind; 4] = [
        PoolKind::Namespaced,
        PoolKind::Global,
        PoolKind::NamespacedPrefix,
        PoolKind::GlobalPrefix,
    ];

    /// The in-cluster provider's kinds (group `ipam.cluster.x-k8s.io`),
    /// served only while taken over.
    pub const IN_CLUSTER: [PoolKind; 4] = [
        PoolKind::InCluster,
        PoolKind::GlobalInCluster,
        PoolKind::InClusterPrefix,
        PoolKind::GlobalInClusterPrefix,
    ];

    /// The Kubernetes kind name.
    pub fn kind_name(self) -> &'static str {
        match self {
            PoolKind::Namespaced => KIND_NAMESPACED,
            PoolKind::Global => KIND_GLOBAL,
            PoolKind::NamespacedPrefix => KIND_PREFIX,
            PoolKind::GlobalPrefix => KIND_GLOBAL_PREFIX,
            in_cluster => in_cluster.resource().kind,
        }
    }

    /// Parses a kind name of either group (exact, case-sensitive as in
    /// Kubernetes; the names of the two groups differ).
    ///
    /// ```
    /// use metal_ipam_core::ipam::pool::PoolKind;
    /// for k in PoolKind::ALL.into_iter().chain(PoolKind::IN_CLUSTER) {
    ///     assert_eq!(PoolKind::from_kind_name(k.kind_name()), Some(k));
    /// }
    /// assert_eq!(PoolKind::from_kind_name("InClusterIPPool"), Some(PoolKind::InCluster));
    /// assert_eq!(PoolKind::from_kind_name("IPPool"), None);
    /// ```
    pub fn from_kind_name(kind: &str) -> Option<PoolKind> {
        PoolKind::ALL
            .into_iter()
            .chain(PoolKind::IN_CLUSTER)
            .find(|k| k.kind_name() == kind)
    }

    /// The kind of `group` named `kind`: ours in our group, the in-cluster
    /// provider's in its group.
    ///
    /// ```
    /// use metal_ipam_core::ipam::pool::PoolKind;
    /// assert_eq!(PoolKind::of_group("ipam.cluster.x-k8s.io", "GlobalInClusterIPPool"), Some(PoolKind::GlobalInCluster));
    /// assert_eq!(PoolKind::of_group("ipam.cluster.x-k8s.io", "MetalIPPool"), None);
    /// assert_eq!(PoolKind::of_group("ipam.metal-ipam.dev", "InClusterIPPool"), None);
    /// ```
    pub fn of_group(group: &str, kind: &str) -> Option<PoolKind> {
        PoolKind::from_kind_name(kind).filter(|k| k.group() == group)
    }

    /// The kind's API group.
    pub fn group(self) -> &'static str {
        self.resource().group
    }

    /// The kind's `apiVersion` as metal-ipam reads and writes it.
    pub fn api_version(self) -> String {
        self.resource().api_version()
    }

    /// Whether this is one of the in-cluster provider's kinds.
    pub fn is_in_cluster(self) -> bool {
        PoolKind::IN_CLUSTER.contains(&self)
    }

    /// Whether pools of this kind are cluster-wide.
    pub fn is_global(self) -> bool {
        !self.resource().namespaced
    }

    /// Whether pools of this kind hand out sub-prefixes.
    pub fn is_prefix(self) -> bool {
        matches!(
            self,
            PoolKind::NamespacedPrefix
                | PoolKind::GlobalPrefix
                | PoolKind::InClusterPrefix
                | PoolKind::GlobalInClusterPrefix
        )
    }

    /// Our kind of this scope (`global`) and shape (`prefix`).
    pub fn of_shape(global: bool, prefix: bool) -> PoolKind {
        match (global, prefix) {
            (false, false) => PoolKind::Namespaced,
            (true, false) => PoolKind::Global,
            (false, true) => PoolKind::NamespacedPrefix,
            (true, true) => PoolKind::GlobalPrefix,
        }
    }

    /// The kind of this shape in `self`'s family (ours or the in-cluster
    /// provider's).
    pub fn with_shape(self, global: bool, prefix: bool) -> PoolKind {
        let ours = PoolKind::of_shape(global, prefix);
        if self.is_in_cluster() {
            let i = PoolKind::ALL.iter().position(|k| *k == ours).unwrap_or(0);
            PoolKind::IN_CLUSTER[i]
        } else {
            ours
        }
    }

    /// The Kubernetes resource of this kind.
    pub fn resource(self) -> &'static Resource {
        match self {
            PoolKind::Namespaced => &kube::METAL_IP_POOLS,
            PoolKind::Global => &kube::GLOBAL_METAL_IP_POOLS,
            PoolKind::NamespacedPrefix => &kube::METAL_PREFIX_POOLS,
            PoolKind::GlobalPrefix => &kube::GLOBAL_METAL_PREFIX_POOLS,
            PoolKind::InCluster => &kube::IN_CLUSTER_IP_POOLS,
            PoolKind::GlobalInCluster => &kube::GLOBAL_IN_CLUSTER_IP_POOLS,
            PoolKind::InClusterPrefix => &kube::IN_CLUSTER_PREFIX_POOLS,
            PoolKind::GlobalInClusterPrefix => &kube::GLOBAL_IN_CLUSTER_PREFIX_POOLS,
        }
    }
}

/// Identity of a pool: kind, namespace (namespaced kind only) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId {
    /// Namespaced or global.
    pub kind: PoolKind,
    /// Namespace; `None` for global pools.
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
}

impl PoolId {
    /// A namespaced pool id.
    pub fn namespaced(namespace: &str, name: &str) -> PoolId {
        PoolId {
            kind: PoolKind::Namespaced,
            namespace: Some(namespace.to_string()),
            name: name.to_string(),
        }
    }

    /// A global pool id.
    pub fn global(name: &str) -> PoolId {
        PoolId {
            kind: PoolKind::Global,
            namespace: None,
            name: name.to_string(),
        }
    }

    /// The pool of `kind` named `name`; `namespace` is its namespace when
    /// the kind is namespaced (and ignored for a global pool). The one
    /// place where (kind, namespace, name) becomes an id: paths, claim
    /// `poolRef`s, bindings, admission reviews and Kubernetes objects all
    /// come through here.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ipam::pool::{PoolId, PoolKind};
    /// assert_eq!(PoolId::of(PoolKind::Namespaced, "a", "p"), PoolId::namespaced("a", "p"));
    /// assert_eq!(PoolId::of(PoolKind::Global, "a", "p"), PoolId::global("p"));
    /// ```
    pub fn of(kind: PoolKind, namespace: &str, name: &str) -> PoolId {
        PoolId {
            kind,
            namespace: (!kind.is_global()).then(|| namespace.to_string()),
            name: name.to_string(),
        }
    }

    /// Human form used in messages and logs: `ns/name` or `global/name`.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ipam::pool::PoolId;
    /// assert_eq!(PoolId::namespaced("team-a", "nodes").display(), "team-a/nodes");
    /// assert_eq!(PoolId::global("edge").display(), "global/edge");
    /// ```
    pub fn display(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => format!("global/{}", self.name),
        }
    }
}
