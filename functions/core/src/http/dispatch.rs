//! The dispatcher: a request to a component, through the route table.
//!
//! [`dispatch`] runs the whole order natively; the Spin shell runs the same
//! pieces around its own work (variables, body, store):
//!
//! 1. [`public`]: a route whose policy is [`Auth::None`] (`/healthz`, the
//!    browser view's page and files) is answered at once, without a
//!    credential, the store or the body;
//! 2. [`authenticate`]: the request's credential against its row's policy
//!    (the component's [`Component::fallback_auth`] for a path that is
//!    none of its routes), once, before anything else: an unauthenticated
//!    request learns nothing, not even whether a path is a route (401,
//!    never 404 or 405 first). Its [`Admitted`] is the proof the entries
//!    take;
//! 3. the component's entry ([`entry`]): 404 for a path that is none of
//!    its routes, 405 with the row's `Allow`, then the row's handler, with
//!    the route's fields (a pool route's [`PoolId`]).
//!
//! One entry per component, each naming only its own handlers, so that a
//! component's wasm holds its own routes' code and no other's.

use crate::events;
use crate::http::api::{self, ApiRequest, ApiResponse};
use crate::http::auth::{self, Tokens};
pub use crate::http::services::Services;
use crate::http::{method_not_allowed, network, no_route, read, steps};
use crate::kv::Ctx;
use crate::network::batch::Direction;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::routes::{Auth, Component, Route, RouteKind};

/// A request that passed its route's policy ([`authenticate`]), with the
/// route it is (`None`: none of the component's routes, a 404).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    route: Option<Route>,
}

/// The handler of a component's routes that need no credential.
pub type PublicRoutes = fn(&Route, &ApiRequest<'_>) -> ApiResponse;

/// The answer to a route of `component` that needs no credential
/// ([`Auth::None`]: `/healthz`, the browser view's page and files), by
/// `answer` (the component's [`public_routes`]), or `None` for any other
/// request. Answered without the store and without reading the body.
pub fn public(
    component: Component,
    req: &ApiRequest<'_>,
    answer: PublicRoutes,
) -> Option<ApiResponse> {
    let route = Route::parse_for(component, req.path)?;
    (route.def().auth == Auth::None).then(|| answer(&route, req))
}

/// The handler of `component`'s public routes (`healthz`, `ui`), if it has
/// any. A shell names its own ([`ui_files`]), so that no other component
/// carries the browser view's files.
pub fn public_routes(component: Component) -> Option<PublicRoutes> {
    match component {
        Component::Healthz => Some(liveness),
        Component::Ui => Some(ui_files),
        _ => None,
    }
}

/// `ui`'s public routes: the browser view's page and files.
pub fn ui_files(route: &Route, req: &ApiRequest<'_>) -> ApiResponse {
    read::ui_file(route, req)
}

/// `/healthz` (its shell answers it without the core; this is the same
/// answer for a native caller).
fn liveness(_: &Route, req: &ApiRequest<'_>) -> ApiResponse {
    let route = Route::Healthz.def();
    if !route.allows(req.method) {
        return method_not_allowed(route.template, route.methods);
    }
    let body = serde_json::json!({"status": "ok"});
    ApiResponse::success(200, Some(body), route.template, "ok")
}

/// The policy a request of `component` to `path` is authenticated by.
fn policy(component: Component, route: Option<&Route>) -> Auth {
    route.map_or_else(|| component.fallback_auth(), |r| r.def().auth)
}

/// Whether the request's credential may travel in its body (the events
/// token, in a CloudEvent): the body is then read, within the limit,
/// before [`authenticate`].
pub fn credential_in_body(component: Component, tokens: &Tokens<'_>, path: &str) -> bool {
    let route = Route::parse_for(component, path);
    policy(component, route.as_ref()) == Auth::Events && !tokens.events.is_empty()
}

/// The one authentication of a request, by its row's policy
/// ([`auth::authorize`]); the events token is looked for in the
/// CloudEvent too (headers or body: see [`credential_in_body`]).
///
/// # Errors
/// The refusal (401, rendered): it names no route, but `/v1/events` when
/// an events token is configured (its body was read for the credential).
pub fn authenticate(
    component: Component,
    tokens: &Tokens<'_>,
    req: &ApiRequest<'_>,
) -> std::result::Result<Admitted, Box<ApiResponse>> {
    let route = Route::parse_for(component, req.path);
    let policy = policy(component, route.as_ref());
    let presented = || {
        let header = |name: &str| req.header(name).map(str::to_string);
        events::presented_token(req.content_type(), &header, req.body)
    };
    match auth::authorize(policy, tokens, req.authorization, presented) {
        Ok(()) => Ok(Admitted { route }),
        Err(e) => {
            let named = policy == Auth::Events && !tokens.events.is_empty();
            let route = if named { Route::Events.template() } else { "" };
            Err(Box::new(ApiResponse::from_error(&e, route)))
        }
    }
}

/// A request to `component`, answered natively: [`public`], then
/// [`authenticate`], then the component's [`entry`].
pub fn dispatch<K: KvStore, H: HttpClient + ?Sized>(
    component: Component,
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = public_routes(component).and_then(|p| public(component, req, p)) {
        return r;
    }
    match authenticate(component, &s.tokens(), req) {
        Ok(admitted) => entry::<K, H>(component)(s, req, admitted),
        Err(r) => *r,
    }
}

/// A component's entry: the request, authenticated, to its route's
/// handler.
pub type Entry<K, H> = fn(&Services<'_, K, H>, &ApiRequest<'_>, Admitted) -> ApiResponse;

/// The entry of `component`.
pub fn entry<K: KvStore, H: HttpClient + ?Sized>(component: Component) -> Entry<K, H> {
    match component {
        Component::Healthz => healthz,
        Component::Pools => pools,
        Component::Allocate => allocate,
        Component::Release => release,
        Component::Events => events,
        Component::Admission => admission,
        Component::Reconcile => reconcile,
        Component::Provision => provision,
        Component::Assign => assign,
        Component::Network => network,
        Component::AttachVlan => attach_vlan,
        Component::DetachVlan => detach_vlan,
        Component::Poll => poll,
        Component::Metrics => metrics,
        Component::Ui => ui,
    }
}

/// 404 and 405 from the table, then `handle` with the route.
fn route_to(
    req: &ApiRequest<'_>,
    admitted: Admitted,
    handle: impl FnOnce(Route) -> ApiResponse,
) -> ApiResponse {
    let Some(route) = admitted.route else {
        return no_route(req.path);
    };
    let def = route.def();
    if !def.allows(req.method) {
        return wrong_method(&route);
    }
    handle(route)
}

/// The 405 of `route` (`Allow` from its row). The plain API's objects
/// check their names first (400) and name their object in the log line;
/// the chained assign step is named after its public twin, as its
/// answers are.
fn wrong_method(route: &Route) -> ApiResponse {
    let def = route.def();
    match route {
        Route::PoolObject(id) => match api::checked_pool(id) {
            Ok(id) => method_not_allowed(def.template, def.methods).touching("pool", id.display()),
            Err(e) => ApiResponse::from_error(&e, def.template),
        },
        Route::ClaimObject { ns, name } => match api::checked_claim(ns, name) {
            Ok(_) => method_not_allowed(def.template, def.methods)
                .touching("claim", format!("{ns}/{name}")),
            Err(e) => ApiResponse::from_error(&e, def.template),
        },
        Route::MetalClaim { .. } => {
            method_not_allowed(RouteKind::MetalClaimStatus.def().template, def.methods)
        }
        _ => method_not_allowed(def.template, def.methods),
    }
}

/// `f` with the store (500 naming no route without one).
fn with_store<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    f: impl FnOnce(&Ctx<'_, K>) -> ApiResponse,
) -> ApiResponse {
    match s.store() {
        Ok(ctx) => f(ctx),
        Err(e) => ApiResponse::from_error(&e, ""),
    }
}

/// Defines the entries: each a function `(services, request, admitted)`
/// that answers 404 and 405 from the table ([`route_to`]) and hands the
/// route to the arms written here, its component's only.
macro_rules! entries {
    ($(
        $(#[$doc:meta])*
        $name:ident($s:ident, $req:ident) { $($arms:tt)* }
    )*) => {$(
        $(#[$doc])*
        pub fn $name<K: KvStore, H: HttpClient + ?Sized>(
            $s: &Services<'_, K, H>,
            $req: &ApiRequest<'_>,
            admitted: Admitted,
        ) -> ApiResponse {
            let _ = $s;
            route_to($req, admitted, |route| match route {
                $($arms)*
                _ => no_route($req.path),
            })
        }
    )*};
}

entries! {
    /// `healthz`: its one route is public ([`public`]); nothing else.
    healthz(s, req) {}

    /// `pools`: the plain API's pools and the pool status step.
    pools(s, req) {
        Route::PoolSync(id) => steps::pool_sync(s, &id),
        Route::PoolList(kind) => with_store(s, |ctx| api::list_pools(ctx, kind)),
        Route::PoolObject(id) => with_store(s, |ctx| api::pool_object(ctx, req, &id)),
    }

    /// `allocate`: `POST /v1/claims`, and the claim step.
    allocate(s, req) {
        Route::Claim { ns, name } => steps::claim(s, &ns, &name),
        Route::Claims => with_store(s, |ctx| api::allocate(ctx, req)),
    }

    /// `release`: `/v1/claims/{namespace}/{name}`, and the claim step.
    release(s, req) {
        Route::Claim { ns, name } => steps::claim(s, &ns, &name),
        Route::ClaimObject { ns, name } => {
            with_store(s, |ctx| api::claim_object(ctx, req, &ns, &name))
        }
    }

    /// `events`: `POST /v1/events`.
    events(s, req) {
        Route::Events => steps::events(s, req),
    }

    /// `admission`: the two validating webhooks.
    admission(s, req) {
        ref r @ (Route::AdmissionPools | Route::AdmissionProfiles) => {
            steps::admission(s, req, r.template())
        }
    }

    /// `reconcile`: `POST /v1/reconcile`, and the takeover of the
    /// in-cluster provider's pool kinds.
    reconcile(s, req) {
        Route::Reconcile => steps::reconcile(s),
        Route::Takeover(kind) => steps::takeover(s, req, kind),
    }

    /// `provision`: the VRF-backed pool step, chained and public.
    provision(s, req) {
        ref r @ (Route::VrfPool(ref id) | Route::VrfPoolStatus(ref id)) => {
            steps::vrf_pool(s, r.template(), id)
        }
    }

    /// `assign`: a claim's Metal assignment, chained and public.
    assign(s, req) {
        Route::MetalClaim { ns, name } | Route::MetalClaimStatus { ns, name } => {
            steps::metal_claim(s, &ns, &name)
        }
    }

    /// `poll`: `POST /v1/metal/poll`.
    poll(s, req) {
        Route::MetalPoll => steps::poll(s),
    }

    /// `network`: a machine's network, public and chained.
    network(s, req) {
        Route::Machine { ns, name } => network::machine_sync(s, &ns, &name),
        Route::ProfileMachines { ns, name } => {
            network::machines_of(s, network::Concerned::Profile, &ns, &name)
        }
        Route::PacketMachineMachines { ns, name } => {
            network::machines_of(s, network::Concerned::PacketMachine, &ns, &name)
        }
        ref r @ (Route::MachineNetwork { .. } | Route::MachineNetconfig { .. }) => {
            network::machine(s, req, r)
        }
    }

    /// `attach-vlan`: a port's batch that assigns VLANs (chained).
    attach_vlan(s, req) {
        Route::VlanBatch { port } => network::vlan_batch(s, req, Direction::Attach, port),
    }

    /// `detach-vlan`: a port's batch that unassigns VLANs (chained).
    detach_vlan(s, req) {
        Route::VlanBatch { port } => network::vlan_batch(s, req, Direction::Detach, port),
    }

    /// `metrics`: `GET /v1/metrics`.
    metrics(s, req) {
        Route::Metrics => read::metrics(s),
    }

    /// `ui`: the browser view's data (its page and files are [`public`]).
    ui(s, req) {
        ref r @ (Route::UiOverview | Route::UiPool(_) | Route::UiMachines | Route::UiSearch) => {
            read::ui_data(s, req, r)
        }
    }
}
