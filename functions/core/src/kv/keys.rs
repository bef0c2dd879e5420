//! Every key family: its builder and its parser, in one place.
//!
//! | Family | Key | Value |
//! |---|---|---|
//! | pool record | `pool/ns/<namespace>/<name>`, `pool/global/<name>`; prefix pools `pool/prefix-ns/<namespace>/<name>`, `pool/prefix-global/<name>` | `ipam::store::PoolRecord` |
//! | creation guard | `pool-init/ns/<namespace>/<name>`, `pool-init/global/<name>` | counter |
//! | claim binding | `claim/<namespace>/<name>` | `ipam::store::ClaimRecord` |
//! | Metal progress | `metal/pool/ns/<namespace>/<name>`, `metal/pool/global/<name>` | `provision::record::ProgressRecord` |
//! | its creation guard | `metal-init/pool/ns/<namespace>/<name>`, `metal-init/pool/global/<name>` | counter |
//! | Metal assignment | `metal/claim/<namespace>/<name>`, guard `metal-init/claim/…` | `provision::assign::AssignmentRecord` |
//! | Metal poll cursor | `metal/poll`, guard `metal-init/poll` | `provision::poll::CursorRecord` |
//! | network apply | `net/device/<uuid>`, guard `net-init/device/<uuid>` | `network::apply::ApplyRecord` |
//! | network apply index | `net-device-index`, guard `net-device-index-init` | `kv::registry::RegistryRecord` (devices with an apply record) |
//! | Metal assignment index | `metal-claim-index`, guard `metal-claim-index-init` | `kv::registry::RegistryRecord` (`<namespace>/<name>` of open assignment records) |
//! | creation stall | `guard-stall/<record key>` | Unix seconds (text) |
//! | observation summary | `obs/summary` | `observe::summary::Summary` (blind `set`, last writer wins) |
//! | poll observation | `obs/poll` | `observe::summary::PollSeen` (blind `set`, last writer wins) |
//! | request counter | `obs/req/<signature>` | counter (`observe::counters`) |
//! | signature registry | `obs/signatures`, guard `obs-init/signatures` | `kv::registry::RegistryRecord` (signatures) |
//! | Kubernetes call counter | `obs/kube/<component>/<class>` | counter |
//! | Metal call counter | `obs/metal/<operation index>/<class>` | counter |
//! | conflict counter | `obs/conflicts/<component>` | counter |
//! | counter registry | `obs/counters`, guard `obs-init/counters` | `kv::registry::RegistryRecord` (the three families above, by key) |
//! | dropped requests (earlier builds) | `obs/dropped` | counter |
//! | takeover record | `takeover/<Kind>` (an in-cluster provider's pool kind) | `capi::takeover::TakeoverRecord` |
//! | pool index | `pool-index`, guard `pool-index-init` | `kv::registry::RegistryRecord` (pool record keys) |
//! | holder page | `holders/<pool key suffix>/<incarnation>/<page>` (e.g. `holders/ns/<namespace>/<name>/<incarnation>/0`), guard `holders-init/…` | `ipam::store::HolderPage` |
//!
//! Why every family is here rather than beside its record: one table shows
//! that no two families share a prefix, and that no key string is built
//! anywhere else. The module knows strings only: the pool-scoped families
//! take anything [`Scoped`] (the pool id implements it in `ipam::store`),
//! so `kv` imports nothing of the domains it stores.
//!
//! Names are validated (`kube::names`) before they become part
//! of a key, so a `/` cannot alias another object's key.

/// An object named in a namespace or cluster-wide: what the pool-scoped
/// families (`pool/…`, `pool-init/…`, `metal/pool/…`) are keyed by.
pub trait Scoped: Sized {
    /// Its namespace, `None` when cluster-wide.
    fn namespace(&self) -> Option<&str>;
    /// Its name.
    fn name(&self) -> &str;
    /// Its family's scope word, put before `ns/…` and `global/…`: one of
    /// [`SCOPES`] (`""` for plain pools, `prefix-` for prefix pools, …).
    fn scope(&self) -> &'static str;
    /// The object a key names (for the parsers); `None` for a scope word
    /// it does not know.
    fn from_parts(scope: &str, namespace: Option<&str>, name: &str) -> Option<Self>;
}

/// Every scope word a pool-scoped key may carry: our address pools (none),
/// our prefix pools, and the in-cluster provider's two shapes (pools served
/// during a takeover), so a pool of one family never shares a key with a
/// same-named pool of another.
pub const SCOPES: [&str; 4] = ["", "prefix-", "incluster-", "incluster-prefix-"];

/// Prefix of every pool record key.
pub const POOL_PREFIX: &str = "pool/";
/// Prefix of every claim binding key.
pub const CLAIM_PREFIX: &str = "claim/";
/// Prefix of every pool creation guard key.
pub const POOL_INIT_PREFIX: &str = "pool-init/";

fn pool_suffix(id: &impl Scoped) -> String {
    let shape = id.scope();
    match id.namespace() {
        Some(ns) => format!("{shape}ns/{ns}/{}", id.name()),
        None => format!("{shape}global/{}", id.name()),
    }
}

/// `pool/ns/<namespace>/<name>` or `pool/global/<name>`.
///
/// # Examples
/// ```
/// use metal_ipam_core::{ipam::pool::{PoolId, PoolKind}, kv::keys};
/// assert_eq!(keys::pool(&PoolId::namespaced("a", "b")), "pool/ns/a/b");
/// assert_eq!(keys::pool(&PoolId::global("g")), "pool/global/g");
/// assert_eq!(keys::parse_pool("pool/ns/a/b"), Some(PoolId::namespaced("a", "b")));
/// // Prefix pools: their own scope words, so a MetalPrefixPool and a
/// // MetalIPPool of one name are two records.
/// let p = PoolId::of(PoolKind::NamespacedPrefix, "a", "b");
/// assert_eq!(keys::pool(&p), "pool/prefix-ns/a/b");
/// assert_eq!(keys::parse_pool(&keys::pool(&p)), Some(p));
/// let g = PoolId::of(PoolKind::GlobalPrefix, "", "g");
/// assert_eq!(keys::parse_pool(&keys::pool(&g)), Some(g));
/// // The in-cluster provider's pools, served during a takeover.
/// let i = PoolId::of(PoolKind::InCluster, "a", "b");
/// assert_eq!(keys::pool(&i), "pool/incluster-ns/a/b");
/// assert_eq!(keys::parse_pool(&keys::pool(&i)), Some(i));
/// let gi = PoolId::of(PoolKind::GlobalInClusterPrefix, "", "g");
/// assert_eq!(keys::pool(&gi), "pool/incluster-prefix-global/g");
/// assert_eq!(keys::parse_pool(&keys::pool(&gi)), Some(gi));
/// assert_eq!(keys::parse_pool::<PoolId>("pool/other-ns/a/b"), None);
/// ```
pub fn pool(id: &impl Scoped) -> String {
    format!("{POOL_PREFIX}{}", pool_suffix(id))
}

/// The creation guard counter of a pool.
pub fn pool_init(id: &impl Scoped) -> String {
    format!("{POOL_INIT_PREFIX}{}", pool_suffix(id))
}

/// Prefix of every Metal progress record key.
pub const METAL_POOL_PREFIX: &str = "metal/pool/";

/// `metal/pool/ns/<namespace>/<name>` or `metal/pool/global/<name>`: the
/// Metal resources of a VRF-backed pool.
///
/// ```
/// use metal_ipam_core::{ipam::pool::PoolId, kv::keys};
/// assert_eq!(keys::metal_pool(&PoolId::namespaced("a", "b")), "metal/pool/ns/a/b");
/// assert_eq!(keys::parse_pool::<PoolId>(&keys::metal_pool(&PoolId::global("g"))), None);
/// ```
pub fn metal_pool(id: &impl Scoped) -> String {
    format!("{METAL_POOL_PREFIX}{}", pool_suffix(id))
}

/// The creation guard counter of a Metal progress record.
pub fn metal_pool_init(id: &impl Scoped) -> String {
    format!("metal-init/pool/{}", pool_suffix(id))
}

/// Prefix of every claim assignment record key.
pub const METAL_CLAIM_PREFIX: &str = "metal/claim/";

/// `metal/claim/<namespace>/<name>`: the Metal IP assignment of a claim's
/// address to its device (beside the binding `claim/<namespace>/<name>`).
///
/// ```
/// use metal_ipam_core::kv::keys;
/// assert_eq!(keys::metal_claim("a", "m-0"), "metal/claim/a/m-0");
/// assert_eq!(keys::parse_metal_claim(&keys::metal_claim("a", "m-0")), Some(("a", "m-0")));
/// assert_eq!(keys::parse_metal_claim("claim/a/m-0"), None);
/// ```
pub fn metal_claim(namespace: &str, name: &str) -> String {
    format!("{METAL_CLAIM_PREFIX}{namespace}/{name}")
}

/// The creation guard counter of a claim assignment record.
pub fn metal_claim_init(namespace: &str, name: &str) -> String {
    format!("metal-init/claim/{namespace}/{name}")
}

/// The claim (namespace, name) an assignment record key belongs to.
pub fn parse_metal_claim(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix(METAL_CLAIM_PREFIX)?.split_once('/')
}

/// `takeover/<Kind>`: the takeover record of one of the in-cluster
/// provider's pool kinds.
///
/// ```
/// assert_eq!(metal_ipam_core::kv::keys::takeover("InClusterIPPool"), "takeover/InClusterIPPool");
/// ```
pub fn takeover(kind: &str) -> String {
    format!("takeover/{kind}")
}

/// `metal/poll`: the Metal event poller's cursor.
pub const METAL_POLL: &str = "metal/poll";

/// The creation guard counter of the poller's cursor.
pub const METAL_POLL_INIT: &str = "metal-init/poll";

/// The phoenixNAP audit-log poller's cursor (the same record as
/// [`METAL_POLL`], for phoenixNAP's events).
pub const PNAP_POLL: &str = "metal/poll-phoenixnap";

/// The creation guard of [`PNAP_POLL`].
pub const PNAP_POLL_INIT: &str = "metal-init/poll-phoenixnap";

/// Prefix of the keys noting when a record's creation was first seen
/// stalled between its guard and its key (`kv::protocol`).
pub const GUARD_STALL_PREFIX: &str = "guard-stall/";

/// `guard-stall/<record key>`: when a request that lost the creation
/// guard first found the record's key still absent (Unix seconds, text).
///
/// ```
/// use metal_ipam_core::kv::keys;
/// assert_eq!(keys::guard_stall("pool/ns/a/b"), "guard-stall/pool/ns/a/b");
/// ```
pub fn guard_stall(record_key: &str) -> String {
    format!("{GUARD_STALL_PREFIX}{record_key}")
}

/// `net/device/<uuid>`: a device's network apply record.
pub const NET_DEVICE_PREFIX: &str = "net/device/";

/// The device a `net/device/…` key belongs to.
///
/// ```
/// use metal_ipam_core::kv::keys;
/// assert_eq!(keys::parse_net_device("net/device/d-1"), Some("d-1"));
/// assert_eq!(keys::parse_net_device("net-init/device/d-1"), None);
/// ```
pub fn parse_net_device(key: &str) -> Option<&str> {
    key.strip_prefix(NET_DEVICE_PREFIX)
        .filter(|d| !d.is_empty())
}

/// `net/device/<uuid>`.
///
/// ```
/// use metal_ipam_core::kv::keys;
/// assert_eq!(keys::net_device("d-1"), "net/device/d-1");
/// assert_eq!(keys::net_device_init("d-1"), "net-init/device/d-1");
/// ```
pub fn net_device(device: &str) -> String {
    format!("{NET_DEVICE_PREFIX}{device}")
}

/// The creation guard counter of a device's network apply record.
pub fn net_device_init(device: &str) -> String {
    format!("net-init/device/{device}")
}

/// `net-device-index`: the registry (`kv::registry::Index`) of the devices
/// with a network apply record, so they are listed without listing the
/// store.
pub const NET_DEVICE_INDEX: &str = "net-device-index";

/// The creation guard counter of the network apply index.
pub const NET_DEVICE_INDEX_INIT: &str = "net-device-index-init";

/// `metal-claim-index`: the registry (`kv::registry::Index`) of the claims
/// (`<namespace>/<name>`) whose Metal assignment record is open.
pub const METAL_CLAIM_INDEX: &str = "metal-claim-index";

/// The creation guard counter of the Metal assignment index.
pub const METAL_CLAIM_INDEX_INIT: &str = "metal-claim-index-init";

/// `obs/summary`: what the last full reconcile saw (claims waiting,
/// machines, assignments), for the metrics and the browser view.
pub const OBS_SUMMARY: &str = "obs/summary";

/// `obs/poll`: what the Metal event poll saw at the end of its last call.
pub const OBS_POLL: &str = "obs/poll";

/// Prefix of the request counters (`observe::counters`).
pub const OBS_REQ_PREFIX: &str = "obs/req/";

/// `obs/req/<signature>`: how many requests had this signature.
///
/// ```
/// use metal_ipam_core::kv::keys;
/// assert_eq!(keys::obs_request("allocate|200"), "obs/req/allocate|200");
/// ```
pub fn obs_request(signature: &str) -> String {
    format!("{OBS_REQ_PREFIX}{signature}")
}

/// `obs/signatures`: the registry of request signatures seen.
pub const OBS_SIGNATURES: &str = "obs/signatures";

/// The creation guard counter of the signature registry.
pub const OBS_SIGNATURES_INIT: &str = "obs-init/signatures";

/// `obs/dropped`: requests an earlier build could not count by signature
/// (its registry full); read, no longer written.
pub const OBS_DROPPED: &str = "obs/dropped";

/// Prefix of the Kubernetes call counters.
pub const OBS_KUBE_PREFIX: &str = "obs/kube/";
/// Prefix of the Metal call counters.
pub const OBS_METAL_PREFIX: &str = "obs/metal/";
/// Prefix of the compare-and-swap conflict counters.
pub const OBS_CONFLICTS_PREFIX: &str = "obs/conflicts/";

/// `obs/counters`: the registry of the call and conflict counters' keys.
pub const OBS_COUNTERS: &str = "obs/counters";

/// The creation guard counter of the counter registry.
pub const OBS_COUNTERS_INIT: &str = "obs-init/counters";

/// `obs/kube/<component>/<class>`: Kubernetes calls of a component's
/// requests answered with a status of that class.
pub fn obs_kube(component: &str, class: &str) -> String {
    format!("{OBS_KUBE_PREFIX}{component}/{class}")
}

/// `obs/metal/<operation index>/<class>`: Metal calls of one operation
/// (an index in `observe::counters::METAL_OPS`) by status class.
pub fn obs_metal(op: usize, class: &str) -> String {
    format!("{OBS_METAL_PREFIX}{op}/{class}")
}

/// `obs/conflicts/<component>`: compare-and-swap conflicts of a
/// component's requests.
pub fn obs_conflicts(component: &str) -> String {
    format!("{OBS_CONFLICTS_PREFIX}{component}")
}

/// A call or conflict counter's key, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObsCounter<'a> {
    /// `obs/kube/<component>/<class>`.
    Kube {
        /// The component.
        component: &'a str,
        /// The status class.
        class: &'a str,
    },
    /// `obs/metal/<op>/<class>`.
    Metal {
        /// The operation's index.
        op: usize,
        /// The status class.
        class: &'a str,
    },
    /// `obs/conflicts/<component>`.
    Conflicts {
        /// The component.
        component: &'a str,
    },
}

/// The counter a call or conflict counter key names.
///
/// ```
/// use metal_ipam_core::kv::keys::{self, ObsCounter};
/// assert_eq!(keys::parse_obs_counter(&keys::obs_kube("allocate", "2xx")),
///     Some(ObsCounter::Kube { component: "allocate", class: "2xx" }));
/// assert_eq!(keys::parse_obs_counter(&keys::obs_metal(9, "error")),
///     Some(ObsCounter::Metal { op: 9, class: "error" }));
/// assert_eq!(keys::parse_obs_counter(&keys::obs_conflicts("pools")),
///     Some(ObsCounter::Conflicts { component: "pools" }));
/// assert_eq!(keys::parse_obs_counter("obs/metal/x/2xx"), None);
/// assert_eq!(keys::parse_obs_counter("obs/req/a|b"), None);
/// ```
pub fn parse_obs_counter(key: &str) -> Option<ObsCounter<'_>> {
    if let Some(rest) = key.strip_prefix(OBS_KUBE_PREFIX) {
        let (component, class) = rest.split_once('/')?;
        return Some(ObsCounter::Kube { component, class });
    }
    if let Some(rest) = key.strip_prefix(OBS_METAL_PREFIX) {
        let (op, class) = rest.split_once('/')?;
        return Some(ObsCounter::Metal {
            op: op.parse().ok()?,
            class,
        });
    }
    let component = key.strip_prefix(OBS_CONFLICTS_PREFIX)?;
    (!component.is_empty() && !component.contains('/'))
        .then_some(ObsCounter::Conflicts { component })
}

/// `pool-index`: the registry (`kv::registry`) of every pool record key
/// ever written, so pools are listed without listing the store.
pub const POOL_INDEX: &str = "pool-index";

/// The creation guard counter of the pool index.
pub const POOL_INDEX_INIT: &str = "pool-index-init";

/// Prefix of every holder page key.
pub const HOLDERS_PREFIX: &str = "holders/";

/// `holders/<pool key suffix>/<incarnation>/<page>`: who holds the values
/// of one page of one incarnation of a pool (`ipam::store::HolderPage`);
/// `page` is decimal. Each incarnation of a pool (its record created,
/// rebuilt) has pages of its own, so a writer of one never touches
/// another's.
///
/// ```
/// use metal_ipam_core::{ipam::pool::{PoolId, PoolKind}, kv::keys};
/// let id = PoolId::namespaced("a", "b");
/// assert_eq!(keys::holders(&id, "9f3c", 3), "holders/ns/a/b/9f3c/3");
/// assert_eq!(keys::holders_init(&id, "9f3c", 3), "holders-init/ns/a/b/9f3c/3");
/// assert_eq!(
///     keys::parse_holders::<PoolId>("holders/ns/a/b/9f3c/3"),
///     Some((id.clone(), "9f3c".to_string(), 3))
/// );
/// assert!(keys::holders(&id, "9f3c", 3).starts_with(&keys::holders_of_pool(&id)));
/// let g = PoolId::of(PoolKind::GlobalPrefix, "", "g");
/// assert_eq!(
///     keys::parse_holders(&keys::holders(&g, "i", u128::MAX)),
///     Some((g, "i".to_string(), u128::MAX))
/// );
/// assert_eq!(keys::parse_holders::<PoolId>("holders/ns/a/b/9f3c/x"), None);
/// assert_eq!(keys::parse_pool::<PoolId>("holders/ns/a/b/9f3c/3"), None);
/// ```
pub fn holders(id: &impl Scoped, incarnation: &str, page: u128) -> String {
    format!("{HOLDERS_PREFIX}{}/{incarnation}/{page}", pool_suffix(id))
}

/// The creation guard counter of a holder page.
pub fn holders_init(id: &impl Scoped, incarnation: &str, page: u128) -> String {
    format!("holders-init/{}/{incarnation}/{page}", pool_suffix(id))
}

/// The prefix every holder page key of pool `id` starts with, whatever
/// its incarnation.
pub fn holders_of_pool(id: &impl Scoped) -> String {
    format!("{HOLDERS_PREFIX}{}/", pool_suffix(id))
}

/// The pool, incarnation and page a holder page key belongs to.
pub fn parse_holders<S: Scoped>(key: &str) -> Option<(S, String, u128)> {
    let rest = key.strip_prefix(HOLDERS_PREFIX)?;
    let (rest, page) = rest.rsplit_once('/')?;
    let (suffix, incarnation) = rest.rsplit_once('/')?;
    if incarnation.is_empty() || page.starts_with('+') {
        return None;
    }
    let page = page.parse().ok()?;
    let pool = parse_pool(&format!("{POOL_PREFIX}{suffix}"))?;
    Some((pool, incarnation.to_string(), page))
}

/// `claim/<namespace>/<name>`.
pub fn claim(namespace: &str, name: &str) -> String {
    format!("{CLAIM_PREFIX}{namespace}/{name}")
}

/// The claim (namespace, name) a claim key belongs to.
///
/// ```
/// use metal_ipam_core::kv::keys;
/// assert_eq!(keys::parse_claim("claim/a/web-0"), Some(("a", "web-0")));
/// assert_eq!(keys::parse_claim(&keys::claim("a", "b")), Some(("a", "b")));
/// assert_eq!(keys::parse_claim("pool/ns/a/b"), None);
/// ```
pub fn parse_claim(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix(CLAIM_PREFIX)?.split_once('/')
}

/// The pool a pool record key belongs to.
pub fn parse_pool<S: Scoped>(key: &str) -> Option<S> {
    let rest = key.strip_prefix(POOL_PREFIX)?;
    let parts: Vec<&str> = rest.split('/').collect();
    let (scope, ns, name) = match parts.as_slice() {
        [scope, ns, name] => (scope.strip_suffix("ns")?, Some(*ns), *name),
        [scope, name] => (scope.strip_suffix("global")?, None, *name),
        _ => return None,
    };
    SCOPES
        .contains(&scope)
        .then(|| S::from_parts(scope, ns, name))
        .flatten()
}
