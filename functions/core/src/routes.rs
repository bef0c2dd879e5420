//! The route table: every route a component serves, defined once.
//!
//! Each row of [`TABLE`] ([`RouteDef`]) gives a route's path template (also
//! its name in log lines), its [`RouteKind`] (which handler answers it) and,
//! for a pool route, the [`PoolKind`] its paths name; the components that
//! serve it and those that reach it by Spin service chaining; its methods
//! (the `Allow` of a 405) and its [`Auth`] policy. From it come the typed
//! [`Route`] (its builder, [`Route::path`], and its matcher,
//! [`Route::parse`]). `http::dispatch` authenticates, answers 404 and 405
//! and calls the row's handler from it, `events` builds its chained calls
//! from it, and `tests/routes.rs` checks it against `spin.toml`. A chained
//! step's answer, as far as chaining reads it, is [`Answer`].
//!
//! Imports nothing of ours but `error`, `kube::names` and `ipam::pool`'s
//! ids.

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::ipam::pool::{PoolId, PoolKind};
use crate::kube::names;

/// A Spin component, by its name in `spin.toml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Component {
    /// `healthz`.
    Healthz,
    /// `pools`.
    Pools,
    /// `allocate`.
    Allocate,
    /// `release`.
    Release,
    /// `events`.
    Events,
    /// `admission`.
    Admission,
    /// `reconcile`.
    Reconcile,
    /// `provision`.
    Provision,
    /// `assign`.
    Assign,
    /// `network`.
    Network,
    /// `attach-vlan`.
    AttachVlan,
    /// `detach-vlan`.
    DetachVlan,
    /// `poll`.
    Poll,
    /// `metrics`.
    Metrics,
    /// `ui`.
    Ui,
}

impl Component {
    /// Every component.
    pub const ALL: [Component; 15] = [
        Self::Healthz,
        Self::Pools,
        Self::Allocate,
        Self::Release,
        Self::Events,
        Self::Admission,
        Self::Reconcile,
        Self::Provision,
        Self::Assign,
        Self::Network,
        Self::AttachVlan,
        Self::DetachVlan,
        Self::Poll,
        Self::Metrics,
        Self::Ui,
    ];

    /// The component's name in `spin.toml` (and its chaining host,
    /// `http://{name}.spin.internal`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Healthz => "healthz",
            Self::Pools => "pools",
            Self::Allocate => "allocate",
            Self::Release => "release",
            Self::Events => "events",
            Self::Admission => "admission",
            Self::Reconcile => "reconcile",
            Self::Provision => "provision",
            Self::Assign => "assign",
            Self::Network => "network",
            Self::AttachVlan => "attach-vlan",
            Self::DetachVlan => "detach-vlan",
            Self::Poll => "poll",
            Self::Metrics => "metrics",
            Self::Ui => "ui",
        }
    }
}

impl Component {
    /// Whether the component has the `default` key-value store in
    /// `spin.toml` (all but `healthz`, `events` and the VLAN batch steps).
    pub fn has_store(self) -> bool {
        !matches!(
            self,
            Self::Healthz | Self::Events | Self::AttachVlan | Self::DetachVlan
        )
    }

    /// The policy a request to none of the component's routes is
    /// authenticated by before its 404: that of its first row that needs a
    /// credential (`read` on `metrics` and `ui`, `events` on `events`, the
    /// API token elsewhere).
    pub fn fallback_auth(self) -> Auth {
        TABLE
            .iter()
            .find(|d| d.served_by.contains(&self) && d.auth != Auth::None)
            .map_or(Auth::Api, |d| d.auth)
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// The API token.
    Api,
    /// The API token or the read token (the read-only routes).
    Read,
    /// The API token or the events token (bearer or CloudEvents extension).
    Events,
    /// No credential (`/healthz`, the browser view's page and files).
    None,
}

/// Which handler answers a route; the pool routes' kind is a field of the
/// [`Route`], not a kind of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// Reconcile one `IPAddressClaim` (chained).
    Claim,
    /// Sync a plain pool's status (chained).
    PoolSync,
    /// Sync a VRF-backed pool (chained).
    VrfPool,
    /// A claim's Metal assignment (chained).
    MetalClaim,
    /// Converge one Machine's network (chained).
    Machine,
    /// The Machines using a `MetalNetworkProfile` (chained).
    ProfileMachines,
    /// The Machines of a `PacketMachine` (chained).
    PacketMachineMachines,
    /// A port's VLAN batch (chained).
    VlanBatch,
    /// A VRF-backed pool's step and status (public).
    VrfPoolStatus,
    /// A claim's Metal assignment and its status (public).
    MetalClaimStatus,
    /// Apply or release a machine's network.
    MachineNetwork,
    /// A machine's rendered OS network configuration.
    MachineNetconfig,
    /// The Metal event poll.
    MetalPoll,
    /// A full reconciliation.
    Reconcile,
    /// Events from forwarders.
    Events,
    /// The pool kinds' validating webhook.
    AdmissionPools,
    /// The network profiles' validating webhook.
    AdmissionProfiles,
    /// A pool collection.
    PoolList,
    /// One pool.
    PoolObject,
    /// Allocate for a claim.
    Claims,
    /// One claim's binding.
    ClaimObject,
    /// The Prometheus exposition.
    Metrics,
    /// The browser view's page.
    UiPage,
    /// The browser view's static files.
    UiAsset,
    /// The browser view's overview.
    UiOverview,
    /// The browser view's data of one pool.
    UiPool,
    /// The browser view's machines.
    UiMachines,
    /// The browser view's search.
    UiSearch,
    /// Liveness.
    Healthz,
    /// Take over, show or hand back one of the in-cluster provider's pool
    /// kinds (`capi::takeover`).
    Takeover,
}

impl RouteKind {
    /// The first row of this kind (a pool family's: its namespaced
    /// pools').
    pub fn def(self) -> &'static RouteDef {
        TABLE
            .iter()
            .find(|d| d.kind == self)
            .expect("every kind has a row")
    }
}

/// One row of the route table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteDef {
    /// The path template (`{…}` marks a segment taken as a field, in the
    /// order of the route's fields); also the route's name in log lines.
    pub template: &'static str,
    /// Which handler answers it.
    pub kind: RouteKind,
    /// The pool kind its paths name (pool routes only).
    pub pool: Option<PoolKind>,
    /// The components that serve it.
    pub served_by: &'static [Component],
    /// The components that reach it by service chaining; empty for a
    /// route only clients call.
    pub chained_from: &'static [Component],
    /// Whether `spin.toml` exposes it (`false`: reached by chaining only).
    pub public: bool,
    /// The methods it accepts, as a 405's `Allow` lists them.
    pub methods: &'static str,
    /// Who may call it.
    pub auth: Auth,
}

impl RouteDef {
    /// Whether `method` is one of the route's.
    pub fn allows(&self, method: &str) -> bool {
        self.methods.split(", ").any(|m| m == method)
    }
}

use Component as C;

const CHAINED: bool = false;
const PUBLIC: bool = true;
const POOL_KINDS: [PoolKind; 4] = PoolKind::ALL;

/// A row without a pool kind (see [`RouteDef`]'s fields, in order).
const fn plain(
    template: &'static str,
    kind: RouteKind,
    served_by: &'static [Component],
    chained_from: &'static [Component],
    public: bool,
    methods: &'static str,
    auth: Auth,
) -> RouteDef {
    RouteDef {
        template,
        kind,
        pool: None,
        served_by,
        chained_from,
        public,
        methods,
        auth,
    }
}

/// Four rows of a pool route family, one per kind: `templates` in the
/// order of [`POOL_KINDS`] (namespaced, global, namespaced prefix, global
/// prefix).
const fn pools(
    templates: [&'static str; 4],
    kind: RouteKind,
    served_by: &'static [Component],
    chained_from: &'static [Component],
    public: bool,
    methods: &'static str,
    auth: Auth,
) -> [RouteDef; 4] {
    let mut out = [plain("", kind, served_by, chained_from, public, methods, auth); 4];
    let mut i = 0;
    while i < 4 {
        out[i].template = templates[i];
        out[i].pool = Some(POOL_KINDS[i]);
        i += 1;
    }
    out
}

/// A family's rows for `kinds` instead (the same order of shapes).
const fn of_kinds(mut rows: [RouteDef; 4], kinds: [PoolKind; 4]) -> [RouteDef; 4] {
    let mut i = 0;
    while i < 4 {
        rows[i].pool = Some(kinds[i]);
        i += 1;
    }
    rows
}

const POST: &str = "POST";
const GET: &str = "GET";
const EVENTS: &[Component] = &[C::Events];
const FROM_EVENTS_AND_RECONCILE: &[Component] = &[C::Events, C::Reconcile];

#[rustfmt::skip]
const POOL_SYNC: [RouteDef; 4] = pools(
    ["/v1/capi/pools/{namespace}/{name}", "/v1/capi/global-pools/{name}", "/v1/capi/prefix-pools/{namespace}/{name}", "/v1/capi/global-prefix-pools/{name}"],
    RouteKind::PoolSync, &[C::Pools], EVENTS, CHAINED, POST, Auth::Api,
);
/// The in-cluster provider's pools, synced while metal-ipam has taken
/// their kind over (`capi::takeover`).
#[rustfmt::skip]
const IN_CLUSTER_POOL_SYNC: [RouteDef; 4] = of_kinds(pools(
    ["/v1/capi/in-cluster/pools/{namespace}/{name}", "/v1/capi/in-cluster/global-pools/{name}", "/v1/capi/in-cluster/prefix-pools/{namespace}/{name}", "/v1/capi/in-cluster/global-prefix-pools/{name}"],
    RouteKind::PoolSync, &[C::Pools], EVENTS, CHAINED, POST, Auth::Api,
), PoolKind::IN_CLUSTER);
#[rustfmt::skip]
const VRF_POOL: [RouteDef; 4] = pools(
    ["/v1/capi/metal/pools/{namespace}/{name}", "/v1/capi/metal/global-pools/{name}", "/v1/capi/metal/prefix-pools/{namespace}/{name}", "/v1/capi/metal/global-prefix-pools/{name}"],
    RouteKind::VrfPool, &[C::Provision], FROM_EVENTS_AND_RECONCILE, CHAINED, POST, Auth::Api,
);
#[rustfmt::skip]
const VRF_POOL_STATUS: [RouteDef; 4] = pools(
    ["/v1/metal/pools/{namespace}/{name}", "/v1/metal/global-pools/{name}", "/v1/metal/prefix-pools/{namespace}/{name}", "/v1/metal/global-prefix-pools/{name}"],
    RouteKind::VrfPoolStatus, &[C::Provision], &[], PUBLIC, POST, Auth::Api,
);
#[rustfmt::skip]
const POOL_LIST: [RouteDef; 4] = pools(
    ["/v1/pools", "/v1/global-pools", "/v1/prefix-pools", "/v1/global-prefix-pools"],
    RouteKind::PoolList, &[C::Pools], &[], PUBLIC, GET, Auth::Api,
);
#[rustfmt::skip]
const POOL_OBJECT: [RouteDef; 4] = pools(
    ["/v1/pools/{namespace}/{name}", "/v1/global-pools/{name}", "/v1/prefix-pools/{namespace}/{name}", "/v1/global-prefix-pools/{name}"],
    RouteKind::PoolObject, &[C::Pools], &[], PUBLIC, "GET, PUT, DELETE", Auth::Api,
);
#[rustfmt::skip]
const UI_POOL: [RouteDef; 4] = pools(
    ["/ui/api/pools/{namespace}/{name}", "/ui/api/global-pools/{name}", "/ui/api/prefix-pools/{namespace}/{name}", "/ui/api/global-prefix-pools/{name}"],
    RouteKind::UiPool, &[C::Ui], &[], PUBLIC, GET, Auth::Read,
);

/// Every route, one row each (a pool family's four kinds are four rows).
#[rustfmt::skip]
pub const TABLE: &[RouteDef] = &{
    use RouteKind as K;
    let singles = [
        // Chained steps (private: no public trigger in spin.toml).
        plain("/v1/capi/claims/{namespace}/{name}", K::Claim, &[C::Allocate, C::Release], EVENTS, CHAINED, POST, Auth::Api),
        plain("/v1/capi/metal/claims/{namespace}/{name}", K::MetalClaim, &[C::Assign], FROM_EVENTS_AND_RECONCILE, CHAINED, POST, Auth::Api),
        plain("/v1/capi/machines/{namespace}/{name}/network", K::Machine, &[C::Network], FROM_EVENTS_AND_RECONCILE, CHAINED, POST, Auth::Api),
        plain("/v1/capi/network-profiles/{namespace}/{name}", K::ProfileMachines, &[C::Network], EVENTS, CHAINED, POST, Auth::Api),
        plain("/v1/capi/packet-machines/{namespace}/{name}", K::PacketMachineMachines, &[C::Network], EVENTS, CHAINED, POST, Auth::Api),
        plain("/v1/metal/ports/{port}/vlan-batches", K::VlanBatch, &[C::AttachVlan, C::DetachVlan], &[C::Network, C::Poll], CHAINED, POST, Auth::Api),
        // Public routes.
        plain("/v1/metal/claims/{namespace}/{name}", K::MetalClaimStatus, &[C::Assign], &[], PUBLIC, POST, Auth::Api),
        plain("/v1/machines/{namespace}/{name}/network", K::MachineNetwork, &[C::Network], &[], PUBLIC, "POST, DELETE", Auth::Api),
        plain("/v1/machines/{namespace}/{name}/netconfig", K::MachineNetconfig, &[C::Network], &[], PUBLIC, GET, Auth::Api),
        plain("/v1/metal/poll", K::MetalPoll, &[C::Poll], &[], PUBLIC, POST, Auth::Api),
        plain("/v1/reconcile", K::Reconcile, &[C::Reconcile], &[], PUBLIC, POST, Auth::Api),
        plain("/v1/events", K::Events, &[C::Events], &[], PUBLIC, POST, Auth::Events),
        plain("/v1/admission/pools", K::AdmissionPools, &[C::Admission], &[], PUBLIC, POST, Auth::Api),
        plain("/v1/admission/network-profiles", K::AdmissionProfiles, &[C::Admission], &[], PUBLIC, POST, Auth::Api),
        plain("/v1/claims", K::Claims, &[C::Allocate], &[], PUBLIC, POST, Auth::Api),
        plain("/v1/claims/{namespace}/{name}", K::ClaimObject, &[C::Release], &[], PUBLIC, "GET, DELETE", Auth::Api),
        plain("/v1/metrics", K::Metrics, &[C::Metrics], &[], PUBLIC, GET, Auth::Read),
        plain("/ui", K::UiPage, &[C::Ui], &[], PUBLIC, GET, Auth::None),
        plain("/ui/{file}", K::UiAsset, &[C::Ui], &[], PUBLIC, GET, Auth::None),
        plain("/ui/api/overview", K::UiOverview, &[C::Ui], &[], PUBLIC, GET, Auth::Read),
        plain("/ui/api/machines", K::UiMachines, &[C::Ui], &[], PUBLIC, GET, Auth::Read),
        plain("/ui/api/search", K::UiSearch, &[C::Ui], &[], PUBLIC, GET, Auth::Read),
        plain("/healthz", K::Healthz, &[C::Healthz], &[], PUBLIC, "GET, HEAD", Auth::None),
        plain("/v1/takeover/{kind}", K::Takeover, &[C::Reconcile], &[], PUBLIC, "GET, POST, DELETE", Auth::Api),
    ];
    let families = [
        POOL_SYNC,
        VRF_POOL,
        VRF_POOL_STATUS,
        POOL_LIST,
        POOL_OBJECT,
        UI_POOL,
        IN_CLUSTER_POOL_SYNC,
    ];
    let mut out = [singles[0]; 24 + 7 * 4];
    let mut i = 0;
    while i < 24 {
        out[i] = singles[i];
        i += 1;
    }
    let mut f = 0;
    while f < 7 {
        let mut k = 0;
        while k < 4 {
            out[24 + f * 4 + k] = families[f][k];
            k += 1;
        }
        f += 1;
    }
    out
};

/// A request to a route of the table, with the path's fields (a pool
/// route's pool, its kind parsed from the path).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Route {
    /// `/v1/capi/claims/{namespace}/{name}`: reconcile one
    /// `IPAddressClaim` (`allocate` while it lives, `release` once it is
    /// going).
    Claim { ns: String, name: String },
    /// `/v1/capi/{pools,global-pools,prefix-pools,global-prefix-pools}/…`:
    /// sync a plain pool's status.
    PoolSync(PoolId),
    /// `/v1/capi/metal/{…pools}/…`: sync a VRF-backed pool.
    VrfPool(PoolId),
    /// `/v1/capi/metal/claims/{namespace}/{name}`: a claim's Metal
    /// assignment.
    MetalClaim { ns: String, name: String },
    /// `/v1/capi/machines/{namespace}/{name}/network`: converge one
    /// Machine's network.
    Machine { ns: String, name: String },
    /// `/v1/capi/network-profiles/{namespace}/{name}`: the Machines using
    /// a `MetalNetworkProfile`.
    ProfileMachines { ns: String, name: String },
    /// `/v1/capi/packet-machines/{namespace}/{name}`: the Machines whose
    /// infrastructure machine a `PacketMachine` is.
    PacketMachineMachines { ns: String, name: String },
    /// `/v1/metal/ports/{port}/vlan-batches`: a port's VLAN batch (attach
    /// or detach, by the component).
    VlanBatch { port: String },
    /// `/v1/metal/{…pools}/…`: a VRF-backed pool's step and status.
    VrfPoolStatus(PoolId),
    /// `/v1/metal/claims/{namespace}/{name}`: a claim's Metal assignment,
    /// and its status.
    MetalClaimStatus { ns: String, name: String },
    /// `/v1/machines/{namespace}/{name}/network`: apply or release a
    /// machine's network.
    MachineNetwork { ns: String, name: String },
    /// `/v1/machines/{namespace}/{name}/netconfig`: a machine's rendered OS
    /// network configuration.
    MachineNetconfig { ns: String, name: String },
    /// `/v1/metal/poll`: the Metal event poll.
    MetalPoll,
    /// `/v1/reconcile`: a full reconciliation.
    Reconcile,
    /// `/v1/events`: events from forwarders.
    Events,
    /// `/v1/admission/pools`: the pool kinds' validating webhook.
    AdmissionPools,
    /// `/v1/admission/network-profiles`: the profiles' validating webhook.
    AdmissionProfiles,
    /// `/v1/pools`, `/v1/global-pools`, …: a pool collection (`/v1/pools`,
    /// [`PoolKind::Namespaced`], lists every kind).
    PoolList(PoolKind),
    /// `/v1/pools/{namespace}/{name}`, …: one pool.
    PoolObject(PoolId),
    /// `/v1/claims`: allocate for a claim.
    Claims,
    /// `/v1/claims/{namespace}/{name}`: one claim's binding.
    ClaimObject { ns: String, name: String },
    /// `/v1/metrics`: the Prometheus exposition.
    Metrics,
    /// `/ui`: the browser view's page (HTML).
    UiPage,
    /// `/ui/{file}`: the browser view's static files.
    UiAsset { file: String },
    /// `/ui/api/overview`: the overview (pools, poll, reconcile).
    UiOverview,
    /// `/ui/api/{…pools}/…`: one pool's addresses.
    UiPool(PoolId),
    /// `/ui/api/machines`: the machines.
    UiMachines,
    /// `/ui/api/search`: search by address, claim or machine (`?q=`).
    UiSearch,
    /// `/healthz`: liveness.
    Healthz,
    /// `/v1/takeover/{kind}`: take over (`POST`), show (`GET`) or hand
    /// back (`DELETE`) one of the in-cluster provider's pool kinds.
    Takeover(PoolKind),
}

/// Whether a template's segment is a field (it opens with a brace; the
/// character is written by its code so that brace-counting tools read
/// this file right).
fn is_field(segment: &str) -> bool {
    segment.starts_with('\x7b')
}

/// The segments of a path after the leading `/`, ignoring one trailing
/// `/`: `/v1/pools/a/b` → `["v1", "pools", "a", "b"]`.
pub fn segments(path: &str) -> Vec<&str> {
    path.trim_end_matches('/').split('/').skip(1).collect()
}

impl Route {
    /// Which handler answers it.
    pub fn kind(&self) -> RouteKind {
        use RouteKind as K;
        match self {
            Route::Claim { .. } => K::Claim,
            Route::PoolSync(_) => K::PoolSync,
            Route::VrfPool(_) => K::VrfPool,
            Route::MetalClaim { .. } => K::MetalClaim,
            Route::Machine { .. } => K::Machine,
            Route::ProfileMachines { .. } => K::ProfileMachines,
            Route::PacketMachineMachines { .. } => K::PacketMachineMachines,
            Route::VlanBatch { .. } => K::VlanBatch,
            Route::VrfPoolStatus(_) => K::VrfPoolStatus,
            Route::MetalClaimStatus { .. } => K::MetalClaimStatus,
            Route::MachineNetwork { .. } => K::MachineNetwork,
            Route::MachineNetconfig { .. } => K::MachineNetconfig,
            Route::MetalPoll => K::MetalPoll,
            Route::Reconcile => K::Reconcile,
            Route::Events => K::Events,
            Route::AdmissionPools => K::AdmissionPools,
            Route::AdmissionProfiles => K::AdmissionProfiles,
            Route::PoolList(_) => K::PoolList,
            Route::PoolObject(_) => K::PoolObject,
            Route::Claims => K::Claims,
            Route::ClaimObject { .. } => K::ClaimObject,
            Route::Metrics => K::Metrics,
            Route::UiPage => K::UiPage,
            Route::UiAsset { .. } => K::UiAsset,
            Route::UiOverview => K::UiOverview,
            Route::UiPool(_) => K::UiPool,
            Route::UiMachines => K::UiMachines,
            Route::UiSearch => K::UiSearch,
            Route::Healthz => K::Healthz,
            Route::Takeover(_) => K::Takeover,
        }
    }

    /// The pool a pool route names (`None` for any other route).
    pub fn pool(&self) -> Option<&PoolId> {
        match self {
            Route::PoolSync(id)
            | Route::VrfPool(id)
            | Route::VrfPoolStatus(id)
            | Route::PoolObject(id)
            | Route::UiPool(id) => Some(id),
            _ => None,
        }
    }

    /// The object a route with a namespace and a name names.
    fn object(&self) -> Option<(&str, &str)> {
        match self {
            Route::Claim { ns, name }
            | Route::MetalClaim { ns, name }
            | Route::Machine { ns, name }
            | Route::ProfileMachines { ns, name }
            | Route::PacketMachineMachines { ns, name }
            | Route::MetalClaimStatus { ns, name }
            | Route::MachineNetwork { ns, name }
            | Route::MachineNetconfig { ns, name }
            | Route::ClaimObject { ns, name } => Some((ns, name)),
            _ => None,
        }
    }

    /// The route's row in [`TABLE`].
    pub fn def(&self) -> &'static RouteDef {
        let (kind, pool) = match self {
            Route::PoolList(k) => (self.kind(), Some(*k)),
            _ => (self.kind(), self.pool().map(|id| id.kind)),
        };
        TABLE
            .iter()
            .find(|d| d.kind == kind && d.pool == pool)
            .expect("every route has its row")
    }

    /// The route's template, its name in log lines.
    pub fn template(&self) -> &'static str {
        self.def().template
    }

    /// The path's fields, in the template's order.
    fn fields(&self) -> Vec<&str> {
        if let Some(id) = self.pool() {
            return id
                .namespace
                .iter()
                .map(String::as_str)
                .chain([id.name.as_str()])
                .collect();
        }
        if let Some((ns, name)) = self.object() {
            return vec![ns, name];
        }
        match self {
            Route::VlanBatch { port } => vec![port],
            Route::UiAsset { file } => vec![file],
            Route::Takeover(kind) => vec![kind.kind_name()],
            _ => Vec::new(),
        }
    }

    /// The route of row `def` with `args` as its fields, in order (`None`
    /// when their number is not the template's).
    fn with(def: &RouteDef, args: &[&str]) -> Option<Route> {
        use RouteKind as K;
        let s = |i: usize| args[i].to_string();
        let (two, one) = (args.len() == 2, args.len() == 1);
        if let Some(kind) = def.pool {
            if def.kind == K::PoolList {
                return args.is_empty().then_some(Route::PoolList(kind));
            }
            let id = match (kind.is_global(), args) {
                (true, [name]) => PoolId::of(kind, "", name),
                (false, [ns, name]) => PoolId::of(kind, ns, name),
                _ => return None,
            };
            return Some(match def.kind {
                K::PoolSync => Route::PoolSync(id),
                K::VrfPool => Route::VrfPool(id),
                K::VrfPoolStatus => Route::VrfPoolStatus(id),
                K::PoolObject => Route::PoolObject(id),
                _ => Route::UiPool(id),
            });
        }
        let object = |f: fn(String, String) -> Route| two.then(|| f(s(0), s(1)));
        let none = |r: Route| args.is_empty().then_some(r);
        match def.kind {
            K::Claim => object(|ns, name| Route::Claim { ns, name }),
            K::MetalClaim => object(|ns, name| Route::MetalClaim { ns, name }),
            K::Machine => object(|ns, name| Route::Machine { ns, name }),
            K::ProfileMachines => object(|ns, name| Route::ProfileMachines { ns, name }),
            K::PacketMachineMachines => {
                object(|ns, name| Route::PacketMachineMachines { ns, name })
            }
            K::MetalClaimStatus => object(|ns, name| Route::MetalClaimStatus { ns, name }),
            K::MachineNetwork => object(|ns, name| Route::MachineNetwork { ns, name }),
            K::MachineNetconfig => object(|ns, name| Route::MachineNetconfig { ns, name }),
            K::ClaimObject => object(|ns, name| Route::ClaimObject { ns, name }),
            K::VlanBatch => one.then(|| Route::VlanBatch { port: s(0) }),
            K::UiAsset => one.then(|| Route::UiAsset { file: s(0) }),
            // Only the in-cluster provider's kinds can be taken over.
            K::Takeover => one
                .then(|| PoolKind::of_group(crate::kube::IN_CLUSTER_GROUP, args[0]))
                .flatten()
                .map(Route::Takeover),
            K::MetalPoll => none(Route::MetalPoll),
            K::Reconcile => none(Route::Reconcile),
            K::Events => none(Route::Events),
            K::AdmissionPools => none(Route::AdmissionPools),
            K::AdmissionProfiles => none(Route::AdmissionProfiles),
            K::Claims => none(Route::Claims),
            K::Metrics => none(Route::Metrics),
            K::UiPage => none(Route::UiPage),
            K::UiOverview => none(Route::UiOverview),
            K::UiMachines => none(Route::UiMachines),
            K::UiSearch => none(Route::UiSearch),
            K::Healthz => none(Route::Healthz),
            // Pool families have a pool kind (above).
            K::PoolSync
            | K::VrfPool
            | K::VrfPoolStatus
            | K::PoolList
            | K::PoolObject
            | K::UiPool => None,
        }
    }

    /// The path: the template with the fields in place.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::routes::Route;
    /// let r = Route::Claim { ns: "ns".into(), name: "m-0".into() };
    /// assert_eq!(r.path(), "/v1/capi/claims/ns/m-0");
    /// ```
    pub fn path(&self) -> String {
        let mut fields = self.fields().into_iter();
        let mut out = String::new();
        for seg in segments(self.template()) {
            out.push('/');
            match is_field(seg) {
                true => out.push_str(fields.next().unwrap_or("")),
                false => out.push_str(seg),
            }
        }
        out
    }

    /// The route a path is, with its fields (as they are: see
    /// [`Route::check_names`]); `None` when no route of the table matches.
    /// One trailing `/` is ignored.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::ipam::pool::{PoolId, PoolKind};
    /// use metal_ipam_core::routes::Route;
    /// assert_eq!(Route::parse("/v1/capi/global-pools/p/"),
    ///     Some(Route::PoolSync(PoolId::of(PoolKind::Global, "", "p"))));
    /// assert_eq!(Route::parse("/v1/capi/global-pools/p/x"), None);
    /// ```
    pub fn parse(path: &str) -> Option<Route> {
        let segs = segments(path);
        TABLE.iter().find_map(|def| {
            let tpl = segments(def.template);
            if tpl.len() != segs.len() {
                return None;
            }
            let mut args = Vec::new();
            for (t, s) in tpl.iter().zip(&segs) {
                if is_field(t) {
                    args.push(*s);
                } else if t != s {
                    return None;
                }
            }
            Route::with(def, &args)
        })
    }

    /// The route served by `component`, if the table says it serves it.
    pub fn parse_for(component: Component, path: &str) -> Option<Route> {
        Self::parse(path).filter(|r| r.def().served_by.contains(&component))
    }

    /// The names in the path checked as today's routes check them: a
    /// namespace as a DNS label, a name as a DNS subdomain (a port is the
    /// batch step's to check, a file the browser view's).
    ///
    /// # Errors
    /// 400 `Malformed` naming the first field that breaks its rule.
    pub fn check_names(&self) -> Result<()> {
        if let Some(id) = self.pool() {
            return check_object(id.namespace.as_deref(), &id.name);
        }
        match self.object() {
            Some((ns, name)) => check_object(Some(ns), name),
            None => Ok(()),
        }
    }
}

/// An object's names as the routes check them: the namespace (if any) a
/// DNS label, the name a DNS subdomain.
///
/// # Errors
/// 400 `Malformed` naming the first that breaks its rule.
pub fn check_object(ns: Option<&str>, name: &str) -> Result<()> {
    ns.map_or(Ok(()), names::check_label)
        .and_then(|_| names::check_subdomain(name))
        .map_err(Error::malformed)
}

/// A chained request: a route and the component it goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The component that serves it (one of the route's `served_by`).
    pub component: Component,
    /// The route.
    pub step: Route,
}

impl Call {
    /// A call of `step` on `component`.
    pub fn new(component: Component, step: Route) -> Self {
        debug_assert!(step.def().served_by.contains(&component));
        Self { component, step }
    }

    /// The chaining URL: `http://{component}.spin.internal{path}`.
    pub fn url(&self) -> String {
        format!(
            "http://{}.spin.internal{}",
            self.component.name(),
            self.step.path()
        )
    }
}

/// What chaining reads of a chained step's answer (the rest is passed on
/// as it is). Unknown members are ignored; an answer that is not JSON, or
/// whose members have other types, reads as the default (nothing to
/// chain, no wait asked for).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Answer {
    /// The step's result word (`waiting`, `converged`, …).
    pub result: Option<String>,
    /// A claim step: the claim is in a VRF-backed pool (the assign step
    /// follows).
    pub metal_assignment: bool,
    /// A step still working (202): seconds to wait.
    pub retry_after: Option<u64>,
    /// An expansion step: the Machines the object concerns.
    pub machines: Vec<String>,
}

impl Answer {
    /// Reads an answer's bytes.
    pub fn parse(body: &[u8]) -> Answer {
        serde_json::from_slice(body).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(def: &RouteDef) -> Route {
        let n = segments(def.template)
            .iter()
            .filter(|s| s.starts_with('{'))
            .count();
        let args: Vec<String> = match def.kind {
            // Only an in-cluster pool kind's name is a takeover route.
            RouteKind::Takeover => vec!["InClusterIPPool".to_string()],
            _ => (0..n).map(|i| format!("a{i}")).collect(),
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Route::with(def, &args).expect("fields match the template")
    }

    #[test]
    fn every_route_round_trips_and_no_two_overlap() {
        for def in TABLE {
            let route = sample(def);
            assert_eq!(route.def(), def, "{}", def.template);
            assert_eq!(Route::parse(&route.path()), Some(route.clone()), "{def:?}");
            assert_eq!(Route::parse(&format!("{}/", route.path())), Some(route));
        }
        for (i, a) in TABLE.iter().enumerate() {
            assert!(TABLE[i + 1..].iter().all(|b| b.template != a.template));
        }
    }

    #[test]
    fn names_are_checked_by_field() {
        let ok = Route::Machine {
            ns: "team-a".into(),
            name: "m.0".into(),
        };
        assert!(ok.check_names().is_ok());
        let bad = Route::Machine {
            ns: "a.b".into(),
            name: "m".into(),
        };
        assert!(bad.check_names().is_err());
        let port = Route::VlanBatch { port: "X_".into() };
        assert!(port.check_names().is_ok());
    }

    #[test]
    fn answers_read_leniently() {
        let a =
            Answer::parse(br#"{"result":"waiting","metalAssignment":true,"retryAfter":5,"x":[1]}"#);
        assert_eq!(a.result.as_deref(), Some("waiting"));
        assert!(a.metal_assignment);
        assert_eq!(a.retry_after, Some(5));
        assert_eq!(Answer::parse(b"not json"), Answer::default());
    }
}
