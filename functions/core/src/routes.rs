//! The route table: every route a component serves, defined once.
//!
//! Each line of the table gives a route's path template, the components
//! that serve it and those that reach it by Spin service chaining; from it
//! come the typed [`Step`] (its builder, [`Step::path`], and its matcher,
//! [`Step::parse`]) and [`Step::route`] (the definition).
//! `events` builds its chained calls from it, `http::components` routes
//! requests with it, and `tests/routes.rs` checks it against `spin.toml`.
//! A chained step's answer, as far as chaining reads it, is [`Answer`].
//!
//! Imports nothing of ours but `error` and `kube::names`.

use serde::Deserialize;

use crate::error::{Error, Result};
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

/// One route's definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The path template (`{…}` marks a segment taken as a field, in the
    /// order of the step's fields); also the route's name in log lines.
    pub template: &'static str,
    /// The components that serve it.
    pub served_by: &'static [Component],
    /// The components that reach it by service chaining; empty for a
    /// route only clients call.
    pub chained_from: &'static [Component],
    /// Whether `spin.toml` exposes it (`false`: reached by chaining only).
    pub public: bool,
}

/// Defines [`Step`], [`StepKind`] and the table, one line per route.
macro_rules! table {
    ($(
        $(#[$doc:meta])*
        $variant:ident { $($field:ident),* } = $template:literal,
            served_by [$($served:ident),*], chained_from [$($caller:ident),*], public $public:literal;
    )*) => {
        /// A request to a route of the table, with the path's fields.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Step {
            $( $(#[$doc])* $variant { $(
                #[allow(missing_docs)] $field: String
            ),* }, )*
        }

        /// Which route a [`Step`] is, without its fields.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum StepKind {
            $( $(#[$doc])* $variant, )*
        }

        impl StepKind {
            /// Every route of the table.
            pub const ALL: &'static [StepKind] = &[$(StepKind::$variant),*];

            /// The route's definition.
            pub fn route(self) -> Route {
                match self {
                    $(StepKind::$variant => Route {
                        template: $template,
                        served_by: &[$(Component::$served),*],
                        chained_from: &[$(Component::$caller),*],
                        public: $public,
                    },)*
                }
            }

            /// The step of this kind with `args` as its fields, in order
            /// (`None` when their number is not the route's).
            fn with(self, args: &[&str]) -> Option<Step> {
                #[allow(unused_mut, unused_variables)]
                match self {
                    $(StepKind::$variant => {
                        let mut it = args.iter();
                        let step = Step::$variant { $($field: (*it.next()?).to_string()),* };
                        it.next().is_none().then_some(step)
                    })*
                }
            }
        }

        impl Step {
            /// Which route this is.
            pub fn kind(&self) -> StepKind {
                match self {
                    $(Step::$variant { .. } => StepKind::$variant,)*
                }
            }

            /// The fields, by name, in the template's order.
            fn fields(&self) -> Vec<(&'static str, &str)> {
                match self {
                    $(Step::$variant { $($field),* } => vec![$((stringify!($field), $field.as_str())),*],)*
                }
            }
        }
    };
}

table! {
    // Chained steps (private: no public trigger in spin.toml).
    /// Reconcile one `IPAddressClaim` (`allocate` while it lives,
    /// `release` once it is going).
    Claim { ns, name } = "/v1/capi/claims/{namespace}/{name}",
        served_by [Allocate, Release], chained_from [Events], public false;
    /// Sync a namespaced pool's status.
    Pool { ns, name } = "/v1/capi/pools/{namespace}/{name}",
        served_by [Pools], chained_from [Events], public false;
    /// Sync a global pool's status.
    GlobalPool { name } = "/v1/capi/global-pools/{name}",
        served_by [Pools], chained_from [Events], public false;
    /// Sync a VRF-backed namespaced pool.
    MetalPool { ns, name } = "/v1/capi/metal/pools/{namespace}/{name}",
        served_by [Provision], chained_from [Events, Reconcile], public false;
    /// Sync a VRF-backed global pool.
    MetalGlobalPool { name } = "/v1/capi/metal/global-pools/{name}",
        served_by [Provision], chained_from [Events, Reconcile], public false;
    /// Sync a namespaced prefix pool's status.
    PrefixPool { ns, name } = "/v1/capi/prefix-pools/{namespace}/{name}",
        served_by [Pools], chained_from [Events], public false;
    /// Sync a global prefix pool's status.
    GlobalPrefixPool { name } = "/v1/capi/global-prefix-pools/{name}",
        served_by [Pools], chained_from [Events], public false;
    /// Sync a VRF-backed namespaced prefix pool.
    MetalPrefixPool { ns, name } = "/v1/capi/metal/prefix-pools/{namespace}/{name}",
        served_by [Provision], chained_from [Events, Reconcile], public false;
    /// Sync a VRF-backed global prefix pool.
    MetalGlobalPrefixPool { name } = "/v1/capi/metal/global-prefix-pools/{name}",
        served_by [Provision], chained_from [Events, Reconcile], public false;
    /// A claim's Metal assignment.
    MetalClaim { ns, name } = "/v1/capi/metal/claims/{namespace}/{name}",
        served_by [Assign], chained_from [Events, Reconcile], public false;
    /// Converge one Machine's network.
    Machine { ns, name } = "/v1/capi/machines/{namespace}/{name}/network",
        served_by [Network], chained_from [Events, Reconcile], public false;
    /// The Machines using a `MetalNetworkProfile`.
    ProfileMachines { ns, name } = "/v1/capi/network-profiles/{namespace}/{name}",
        served_by [Network], chained_from [Events], public false;
    /// The Machines whose infrastructure machine a `PacketMachine` is.
    PacketMachineMachines { ns, name } = "/v1/capi/packet-machines/{namespace}/{name}",
        served_by [Network], chained_from [Events], public false;
    /// A port's VLAN batch (attach or detach, by the component).
    VlanBatch { port } = "/v1/metal/ports/{port}/vlan-batches",
        served_by [AttachVlan, DetachVlan], chained_from [Network, Poll], public false;
    // Public routes.
    /// A VRF-backed namespaced pool's step and status.
    MetalPoolStatus { ns, name } = "/v1/metal/pools/{namespace}/{name}",
        served_by [Provision], chained_from [], public true;
    /// A VRF-backed global pool's step and status.
    MetalGlobalPoolStatus { name } = "/v1/metal/global-pools/{name}",
        served_by [Provision], chained_from [], public true;
    /// A VRF-backed namespaced prefix pool's step and status.
    MetalPrefixPoolStatus { ns, name } = "/v1/metal/prefix-pools/{namespace}/{name}",
        served_by [Provision], chained_from [], public true;
    /// A VRF-backed global prefix pool's step and status.
    MetalGlobalPrefixPoolStatus { name } = "/v1/metal/global-prefix-pools/{name}",
        served_by [Provision], chained_from [], public true;
    /// A claim's Metal assignment, and its status.
    MetalClaimStatus { ns, name } = "/v1/metal/claims/{namespace}/{name}",
        served_by [Assign], chained_from [], public true;
    /// Apply or release a machine's network.
    MachineNetwork { ns, name } = "/v1/machines/{namespace}/{name}/network",
        served_by [Network], chained_from [], public true;
    /// A machine's rendered OS network configuration.
    MachineNetconfig { ns, name } = "/v1/machines/{namespace}/{name}/netconfig",
        served_by [Network], chained_from [], public true;
    /// The Metal event poll.
    MetalPoll {} = "/v1/metal/poll",
        served_by [Poll], chained_from [], public true;
    /// A full reconciliation.
    Reconcile {} = "/v1/reconcile",
        served_by [Reconcile], chained_from [], public true;
    /// Events from forwarders.
    Events {} = "/v1/events",
        served_by [Events], chained_from [], public true;
    /// The pool kinds' validating webhook.
    AdmissionPools {} = "/v1/admission/pools",
        served_by [Admission], chained_from [], public true;
    /// The network profiles' validating webhook.
    AdmissionProfiles {} = "/v1/admission/network-profiles",
        served_by [Admission], chained_from [], public true;
    /// The namespaced pools.
    Pools {} = "/v1/pools",
        served_by [Pools], chained_from [], public true;
    /// The global pools.
    GlobalPools {} = "/v1/global-pools",
        served_by [Pools], chained_from [], public true;
    /// One namespaced pool.
    PoolObject { ns, name } = "/v1/pools/{namespace}/{name}",
        served_by [Pools], chained_from [], public true;
    /// One global pool.
    GlobalPoolObject { name } = "/v1/global-pools/{name}",
        served_by [Pools], chained_from [], public true;
    /// The namespaced prefix pools.
    PrefixPools {} = "/v1/prefix-pools",
        served_by [Pools], chained_from [], public true;
    /// The global prefix pools.
    GlobalPrefixPools {} = "/v1/global-prefix-pools",
        served_by [Pools], chained_from [], public true;
    /// One namespaced prefix pool.
    PrefixPoolObject { ns, name } = "/v1/prefix-pools/{namespace}/{name}",
        served_by [Pools], chained_from [], public true;
    /// One global prefix pool.
    GlobalPrefixPoolObject { name } = "/v1/global-prefix-pools/{name}",
        served_by [Pools], chained_from [], public true;
    /// Allocate for a claim.
    Claims {} = "/v1/claims",
        served_by [Allocate], chained_from [], public true;
    /// One claim's binding.
    ClaimObject { ns, name } = "/v1/claims/{namespace}/{name}",
        served_by [Release], chained_from [], public true;
    /// The Prometheus exposition.
    Metrics {} = "/v1/metrics",
        served_by [Metrics], chained_from [], public true;
    /// The browser view's page (HTML).
    UiPage {} = "/ui",
        served_by [Ui], chained_from [], public true;
    /// The browser view's static files (`app.css`, `app.js`).
    UiAsset { file } = "/ui/{file}",
        served_by [Ui], chained_from [], public true;
    /// The browser view's data: the overview (pools, poll, reconcile).
    UiOverview {} = "/ui/api/overview",
        served_by [Ui], chained_from [], public true;
    /// The browser view's data: one namespaced pool's addresses.
    UiPool { ns, name } = "/ui/api/pools/{namespace}/{name}",
        served_by [Ui], chained_from [], public true;
    /// The browser view's data: one global pool's addresses.
    UiGlobalPool { name } = "/ui/api/global-pools/{name}",
        served_by [Ui], chained_from [], public true;
    /// The browser view's data: one namespaced prefix pool.
    UiPrefixPool { ns, name } = "/ui/api/prefix-pools/{namespace}/{name}",
        served_by [Ui], chained_from [], public true;
    /// The browser view's data: one global prefix pool.
    UiGlobalPrefixPool { name } = "/ui/api/global-prefix-pools/{name}",
        served_by [Ui], chained_from [], public true;
    /// The browser view's data: the machines.
    UiMachines {} = "/ui/api/machines",
        served_by [Ui], chained_from [], public true;
    /// The browser view's data: search by address, claim or machine
    /// (`?q=`).
    UiSearch {} = "/ui/api/search",
        served_by [Ui], chained_from [], public true;
    /// Liveness.
    Healthz {} = "/healthz",
        served_by [Healthz], chained_from [], public true;
}

/// The segments of a path after the leading `/`, ignoring one trailing
/// `/`: `/v1/pools/a/b` → `["v1", "pools", "a", "b"]`.
pub fn segments(path: &str) -> Vec<&str> {
    path.trim_end_matches('/').split('/').skip(1).collect()
}

impl Step {
    /// The route's definition.
    pub fn route(&self) -> Route {
        self.kind().route()
    }

    /// The route's template, its name in log lines.
    pub fn template(&self) -> &'static str {
        self.route().template
    }

    /// The path: the template with the fields in place.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::routes::Step;
    /// let s = Step::Claim { ns: "ns".into(), name: "m-0".into() };
    /// assert_eq!(s.path(), "/v1/capi/claims/ns/m-0");
    /// ```
    pub fn path(&self) -> String {
        let mut fields = self.fields().into_iter();
        let mut out = String::new();
        for seg in segments(self.template()) {
            out.push('/');
            match seg.starts_with('{') {
                true => out.push_str(fields.next().map_or("", |(_, v)| v)),
                false => out.push_str(seg),
            }
        }
        out
    }

    /// The route a path is, with its fields (as they are: see
    /// [`Step::check_names`]); `None` when no route of the table matches.
    /// One trailing `/` is ignored.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::routes::Step;
    /// assert_eq!(Step::parse("/v1/capi/global-pools/p/"),
    ///     Some(Step::GlobalPool { name: "p".into() }));
    /// assert_eq!(Step::parse("/v1/capi/global-pools/p/x"), None);
    /// ```
    pub fn parse(path: &str) -> Option<Step> {
        let segs = segments(path);
        StepKind::ALL.iter().find_map(|kind| {
            let tpl = segments(kind.route().template);
            if tpl.len() != segs.len() {
                return None;
            }
            let mut args = Vec::new();
            for (t, s) in tpl.iter().zip(&segs) {
                if t.starts_with('{') {
                    args.push(*s);
                } else if t != s {
                    return None;
                }
            }
            kind.with(&args)
        })
    }

    /// The step served by `component`, if the table says it serves it.
    pub fn parse_for(component: Component, path: &str) -> Option<Step> {
        Self::parse(path).filter(|s| s.route().served_by.contains(&component))
    }

    /// The names in the path checked as today's routes check them: a
    /// namespace as a DNS label, a name as a DNS subdomain (a port is the
    /// batch step's to check).
    ///
    /// # Errors
    /// 400 `Malformed` naming the first field that breaks its rule.
    pub fn check_names(&self) -> Result<()> {
        let fields = self.fields();
        let field = |f: &str| fields.iter().find(|(n, _)| *n == f).map(|(_, v)| *v);
        match field("name") {
            Some(name) => check_object(field("ns"), name),
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

/// A chained request: a step and the component it goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The component that serves it (one of the step's `served_by`).
    pub component: Component,
    /// The step.
    pub step: Step,
}

impl Call {
    /// A call of `step` on `component`.
    pub fn new(component: Component, step: Step) -> Self {
        debug_assert!(step.route().served_by.contains(&component));
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

    fn sample(kind: StepKind) -> Step {
        let n = segments(kind.route().template)
            .iter()
            .filter(|s| s.starts_with('{'))
            .count();
        let args: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kind.with(&args).expect("fields match the template")
    }

    #[test]
    fn every_route_round_trips_and_no_two_overlap() {
        for kind in StepKind::ALL {
            let step = sample(*kind);
            assert_eq!(Step::parse(&step.path()), Some(step.clone()), "{kind:?}");
            assert_eq!(Step::parse(&format!("{}/", step.path())), Some(step));
        }
    }

    #[test]
    fn names_are_checked_by_field() {
        let ok = Step::Machine {
            ns: "team-a".into(),
            name: "m.0".into(),
        };
        assert!(ok.check_names().is_ok());
        let bad = Step::Machine {
            ns: "a.b".into(),
            name: "m".into(),
        };
        assert!(bad.check_names().is_err());
        let port = Step::VlanBatch { port: "X_".into() };
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
