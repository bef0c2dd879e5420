//! Which pool: the four kinds ([`PoolKind`]) and a pool's identity
//! ([`PoolId`]), the one place (kind, namespace, name) becomes an id.

use super::{KIND_GLOBAL, KIND_GLOBAL_PREFIX, KIND_NAMESPACED, KIND_PREFIX};

/// Which of the four pool kinds: namespaced or cluster-wide, handing out
/// addresses or sub-prefixes.
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
}

impl PoolKind {
    /// Every kind.
    pub const ALL: [PoolKind; 4] = [
        PoolKind::Namespaced,
        PoolKind::Global,
        PoolKind::NamespacedPrefix,
        PoolKind::GlobalPrefix,
    ];

    /// The Kubernetes kind name.
    pub fn kind_name(self) -> &'static str {
        match self {
            PoolKind::Namespaced => KIND_NAMESPACED,
            PoolKind::Global => KIND_GLOBAL,
            PoolKind::NamespacedPrefix => KIND_PREFIX,
            PoolKind::GlobalPrefix => KIND_GLOBAL_PREFIX,
        }
    }

    /// Parses a kind name (exact, case-sensitive as in Kubernetes).
    ///
    /// ```
    /// use metal_ipam_core::ipam::pool::PoolKind;
    /// for k in PoolKind::ALL {
    ///     assert_eq!(PoolKind::from_kind_name(k.kind_name()), Some(k));
    /// }
    /// assert_eq!(PoolKind::from_kind_name("InClusterIPPool"), None);
    /// ```
    pub fn from_kind_name(kind: &str) -> Option<PoolKind> {
        PoolKind::ALL.into_iter().find(|k| k.kind_name() == kind)
    }

    /// Whether pools of this kind are cluster-wide.
    pub fn is_global(self) -> bool {
        matches!(self, PoolKind::Global | PoolKind::GlobalPrefix)
    }

    /// Whether pools of this kind hand out sub-prefixes.
    pub fn is_prefix(self) -> bool {
        matches!(self, PoolKind::NamespacedPrefix | PoolKind::GlobalPrefix)
    }

    /// The kind of this scope (`global`) and shape (`prefix`).
    pub fn of_shape(global: bool, prefix: bool) -> PoolKind {
        match (global, prefix) {
            (false, false) => PoolKind::Namespaced,
            (true, false) => PoolKind::Global,
            (false, true) => PoolKind::NamespacedPrefix,
            (true, true) => PoolKind::GlobalPrefix,
        }
    }

    /// The Kubernetes resource of this kind.
    pub fn resource(self) -> &'static crate::kube::Resource {
        match self {
            PoolKind::Namespaced => &crate::kube::METAL_IP_POOLS,
            PoolKind::Global => &crate::kube::GLOBAL_METAL_IP_POOLS,
            PoolKind::NamespacedPrefix => &crate::kube::METAL_PREFIX_POOLS,
            PoolKind::GlobalPrefix => &crate::kube::GLOBAL_METAL_PREFIX_POOLS,
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
