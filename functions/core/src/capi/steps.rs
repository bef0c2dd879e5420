//! Which route serves which pool: the one place that maps a [`PoolId`] of
//! any of the four kinds to its steps (status sync, VRF step and that
//! step's public twin), and a pool-scoped [`Step`] back to the pool it
//! names. The events router, the components and the reconcile's chaining
//! all come through here, so a new kind is one table to extend.

use crate::ipam::pool::{PoolId, PoolKind};
use crate::routes::Step;

/// A pool's steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSteps {
    /// Sync its status from the store (`pools`, chained from `events`).
    pub sync: Step,
    /// Its VRF step (`provision`, chained).
    pub metal: Step,
    /// The VRF step's public twin: where a 202 says to poll.
    pub metal_status: Step,
}

/// The steps of pool `id`.
///
/// ```
/// use metal_ipam_core::capi::steps::{pool_of_step, pool_steps};
/// use metal_ipam_core::ipam::pool::{PoolId, PoolKind};
/// for kind in PoolKind::ALL {
///     let id = PoolId::of(kind, "team-a", "p");
///     let steps = pool_steps(&id);
///     for step in [&steps.sync, &steps.metal, &steps.metal_status] {
///         assert_eq!(pool_of_step(step), Some(id.clone()));
///     }
/// }
/// let id = PoolId::of(PoolKind::NamespacedPrefix, "team-a", "p");
/// assert_eq!(pool_steps(&id).metal_status.path(), "/v1/metal/prefix-pools/team-a/p");
/// ```
pub fn pool_steps(id: &PoolId) -> PoolSteps {
    let name = id.name.clone();
    match (id.kind, id.namespace.clone()) {
        (PoolKind::Namespaced, Some(ns)) => PoolSteps {
            sync: Step::Pool {
                ns: ns.clone(),
                name: name.clone(),
            },
            metal: Step::MetalPool {
                ns: ns.clone(),
                name: name.clone(),
            },
            metal_status: Step::MetalPoolStatus { ns, name },
        },
        (PoolKind::NamespacedPrefix, Some(ns)) => PoolSteps {
            sync: Step::PrefixPool {
                ns: ns.clone(),
                name: name.clone(),
            },
            metal: Step::MetalPrefixPool {
                ns: ns.clone(),
                name: name.clone(),
            },
            metal_status: Step::MetalPrefixPoolStatus { ns, name },
        },
        (PoolKind::GlobalPrefix, _) => PoolSteps {
            sync: Step::GlobalPrefixPool { name: name.clone() },
            metal: Step::MetalGlobalPrefixPool { name: name.clone() },
            metal_status: Step::MetalGlobalPrefixPoolStatus { name },
        },
        // A global pool, or (never built: `PoolId::of` sets the namespace
        // of every namespaced kind) a namespaced one without a namespace.
        _ => PoolSteps {
            sync: Step::GlobalPool { name: name.clone() },
            metal: Step::MetalGlobalPool { name: name.clone() },
            metal_status: Step::MetalGlobalPoolStatus { name },
        },
    }
}

/// The pool a pool-scoped step names (its sync, VRF, status, object and
/// browser-view routes), `None` for any other step. The names are as in
/// the path, not checked.
pub fn pool_of_step(step: &Step) -> Option<PoolId> {
    use PoolKind::{Global, GlobalPrefix, Namespaced, NamespacedPrefix};
    let (kind, ns, name) = match step {
        Step::Pool { ns, name }
        | Step::MetalPool { ns, name }
        | Step::MetalPoolStatus { ns, name }
        | Step::PoolObject { ns, name }
        | Step::UiPool { ns, name } => (Namespaced, ns.as_str(), name),
        Step::PrefixPool { ns, name }
        | Step::MetalPrefixPool { ns, name }
        | Step::MetalPrefixPoolStatus { ns, name }
        | Step::PrefixPoolObject { ns, name }
        | Step::UiPrefixPool { ns, name } => (NamespacedPrefix, ns.as_str(), name),
        Step::GlobalPool { name }
        | Step::MetalGlobalPool { name }
        | Step::MetalGlobalPoolStatus { name }
        | Step::GlobalPoolObject { name }
        | Step::UiGlobalPool { name } => (Global, "", name),
        Step::GlobalPrefixPool { name }
        | Step::MetalGlobalPrefixPool { name }
        | Step::MetalGlobalPrefixPoolStatus { name }
        | Step::GlobalPrefixPoolObject { name }
        | Step::UiGlobalPrefixPool { name } => (GlobalPrefix, "", name),
        _ => return None,
    };
    Some(PoolId::of(kind, ns, name))
}
