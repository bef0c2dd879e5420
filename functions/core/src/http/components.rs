//! One entry point per Spin component: which routes each serves and what it
//! needs, on top of [`crate::http::api`] (the plain HTTP API) and [`crate::capi`]
//! (the Kubernetes side).
//!
//! | Component | Routes | Store | Kubernetes | Chains to |
//! |---|---|---|---|---|
//! | `pools` | `/v1/pools…`, `/v1/global-pools…`, `/v1/prefix-pools…`, `/v1/global-prefix-pools…`; `POST /v1/capi/pools/{ns}/{name}`, `POST /v1/capi/global-pools/{name}` and their `prefix-pools` twins (pool sync) | yes | yes | — |
//! | `allocate` | `POST /v1/claims`; `POST /v1/capi/claims/{ns}/{name}` (claim reconcile) | yes | yes | — |
//! | `release` | `/v1/claims/{ns}/{name}`; `POST /v1/capi/claims/{ns}/{name}` (claim reconcile) | yes | yes | — |
//! | `events` | `POST /v1/events` | no | no | `allocate`, `release`, `pools`, `provision`, `assign`, `network` (Machines; a profile's or a `PacketMachine`'s Machines, each) |
//! | `admission` | `POST /v1/admission/pools`, `POST /v1/admission/network-profiles` | read | yes (lists the Machines of a profile being deleted, and the profiles using a VRF-backed pool's VLAN on its `DELETE`) | — |
//! | `reconcile` | `POST /v1/reconcile` | yes | yes | `provision` (each VRF-backed pool), `assign` (each claim in one), `network` (each opted-in Machine) |
//! | `assign` | `POST /v1/capi/metal/claims/{ns}/{name}` (chained after a claim step that answers `metalAssignment`) and `POST /v1/metal/claims/{ns}/{name}` (public; 202 with `Retry-After` and `Location` while another instance assigns) | yes | yes | — (calls Metal) |
//! | `poll` | `POST /v1/metal/poll` (CronJob: Metal events after the stored cursor) | yes | yes | `attach-vlan`, `detach-vlan` (a machine's network on a device that became active; calls Metal) |
//! | `network` | `POST`/`DELETE /v1/machines/{ns}/{name}/network` (`?dryRun=true`), `GET /v1/machines/{ns}/{name}/netconfig?format=`; `POST /v1/capi/machines/{ns}/{name}/network` (sync one Machine, chained from `events` and `reconcile`), `POST /v1/capi/network-profiles/{ns}/{name}` and `POST /v1/capi/packet-machines/{ns}/{name}` (the Machines a profile's or a `PacketMachine`'s event concerns, chained from `events`) | yes | yes | `attach-vlan`, `detach-vlan` (VLAN batches; calls Metal for the rest) |
//! | `attach-vlan`, `detach-vlan` | `POST /v1/metal/ports/{port}/vlan-batches` (private: chained from `network` and `poll`) | no | no | — (calls Metal) |
//! | `provision` | `POST /v1/capi/metal/pools/{ns}/{name}`, `POST /v1/capi/metal/global-pools/{name}` and their `prefix-pools` twins (VRF-backed pool sync, chained), and the same step at `POST /v1/metal/pools/{ns}/{name}`, `/v1/metal/global-pools/{name}` (public; 202 with `Retry-After` and `Location` while Metal works) | yes | yes | — (calls Metal; with `assign`, `poll`, `network`, `attach-vlan` and `detach-vlan`, the only components with the Metal token) |
//!
//! The `/v1/capi/…` routes have no public trigger in spin.toml: they are
//! reached by Spin service chaining from `events` (with the API token).
//! Every path is matched, and every chained path built, with the route
//! table ([`crate::routes::Step`]); `tests/routes.rs` checks it against
//! spin.toml.
//!
//! Every entry has the same signature (services, request, content type,
//! header lookup), the one `metal_ipam_spin::serve_component` calls; only
//! `events` looks at the last two.

use serde_json::{json, Value};

use crate::admission::{self, KvPools};
use crate::capi;
use crate::capi::reconcile;
use crate::error::{Error, ErrorKind, Result};
use crate::events::chain::{self, ChainRun};
use crate::events::{self, Outcome};
use crate::http::api::{self, ApiRequest, ApiResponse};
use crate::http::auth::{self, Policy, Tokens};
use crate::http::{method_not_allowed, no_route};
use crate::ipam::pool::PoolId;
use crate::kube::Kube;
use crate::kv::Ctx;
use crate::metal::client::{Metal, MetalError};
use crate::network::batch::{self, BatchOp, Chained, Direction};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::ports::Env;
use crate::routes::{check_object, Component, Step, StepKind};

/// What a component has at hand for one request.
pub struct Services<'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The key-value store (`None` for components without one).
    pub ctx: Option<&'a Ctx<'a, K>>,
    /// The Kubernetes client (`None` when `k8s_token` is not configured).
    pub kube: Option<&'a Kube<'a, H>>,
    /// Outbound HTTP (service chaining).
    pub http: &'a H,
    /// The API token (every route; also sent on chained requests).
    pub api_token: &'a str,
    /// The events token (accepted on `/v1/events` only; empty = none).
    pub events_token: &'a str,
    /// The read token (accepted on the read-only routes, `metrics` and
    /// `ui`'s data; empty = none).
    pub read_token: &'a str,
    /// The Metal client (`None` when the component has no Metal token).
    pub metal: Option<&'a Metal<'a, H, dyn Env + 'a>>,
}

fn store<'a, K: KvStore, H: HttpClient + ?Sized>(s: &Services<'a, K, H>) -> Result<&'a Ctx<'a, K>> {
    s.ctx.ok_or_else(|| {
        Error::new(
            ErrorKind::Internal,
            "StoreMisconfigured",
            "this component has no key-value store",
        )
    })
}

fn kube<'a, K: KvStore, H: HttpClient + ?Sized>(s: &Services<'a, K, H>) -> Result<&'a Kube<'a, H>> {
    s.kube.ok_or_else(|| {
        Error::new(
            ErrorKind::Internal,
            "KubeNotConfigured",
            "the Kubernetes API is not configured (variables k8s_api_url and k8s_token)",
        )
    })
}

/// The checks every single-purpose route makes after authentication, in
/// order: the exact route (`None` when the caller already matched it) and
/// the method (`POST`). Returns the error response, if any.
fn guard(req: &ApiRequest<'_>, route: &'static str, kind: Option<StepKind>) -> Option<ApiResponse> {
    if kind.is_some_and(|k| Step::parse(req.path).map(|s| s.kind()) != Some(k)) {
        return Some(no_route(req.path));
    }
    if req.method != "POST" {
        return Some(method_not_allowed(route, "POST"));
    }
    None
}

/// The one authentication of a request, before anything else: its
/// credential against `policy` ([`auth::authorize`]). An unauthenticated
/// request learns nothing, not even whether a path is a route (401, never
/// 404 or 405 first); the refusal names `route` (empty but on
/// `/v1/events`).
fn refused<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    policy: Policy,
    route: &'static str,
) -> Option<ApiResponse> {
    let tokens = Tokens {
        api: s.api_token,
        read: s.read_token,
        events: s.events_token,
    };
    let presented = || {
        let header = |name: &str| req.header(name).map(str::to_string);
        events::presented_token(req.content_type(), &header, req.body)
    };
    auth::authorize(policy, &tokens, req.authorization, presented)
        .err()
        .map(|e| ApiResponse::from_error(&e, route))
}

/// [`refused`] for the API token's routes.
fn authenticated<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> Option<ApiResponse> {
    refused(s, req, Policy::Api, "")
}

fn outcome_response(
    route: &'static str,
    o: Result<capi::Outcome>,
    kind: &'static str,
    what: String,
) -> ApiResponse {
    match o {
        Ok(o) => {
            let mut r = ApiResponse::success(200, Some(o.to_json()), route, o.result.as_str());
            r.objects.push((kind, what));
            if let Some(a) = o.address {
                r.objects.push(("address", a));
            }
            r
        }
        Err(e) => {
            let mut r = ApiResponse::from_error(&e, route);
            r.objects.push((kind, what));
            r
        }
    }
}

/// `POST /v1/capi/claims/{namespace}/{name}`: reconcile one claim.
fn capi_claim<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let route = StepKind::Claim.route().template;
    if let Some(r) = guard(req, route, None) {
        return r;
    }
    let checked = check_object(Some(ns), name);
    let result = checked.and_then(|_| capi::reconcile_claim(store(s)?, kube(s)?, ns, name));
    outcome_response(route, result, "claim", format!("{ns}/{name}"))
}

/// A pool step route (`step`, one of the routes
/// [`capi::steps::pool_of_step`] knows): the method, the pool's names
/// checked, then `run`; 202 with `Retry-After` and `Location`
/// (the VRF step's public twin) when the step is waiting on something that
/// takes time (Metal), 200 otherwise.
fn pool_step(
    req: &ApiRequest<'_>,
    step: &Step,
    run: impl FnOnce(&PoolId) -> Result<capi::Outcome>,
) -> ApiResponse {
    let route = step.template();
    if let Some(r) = guard(req, route, None) {
        return r;
    }
    let Some(id) = capi::steps::pool_of_step(step) else {
        return no_route(req.path);
    };
    let checked = check_object(id.namespace.as_deref(), &id.name);
    let result = checked.and_then(|_| run(&id));
    let retry_after = result.as_ref().ok().and_then(|o| o.retry_after);
    let r = outcome_response(route, result, "pool", id.display());
    match retry_after {
        // Only the VRF-backed pool step waits; its public route is where
        // to POST again for the next step and the status.
        Some(secs) => {
            let location = capi::steps::pool_steps(&id).metal_status;
            accepted(r, secs, location.path())
        }
        None => r,
    }
}

/// `POST /v1/capi/pools/{ns}/{name}`, `/v1/capi/global-pools/{name}` and
/// the prefix pools' twins: sync a pool's status.
fn capi_pool<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    step: &Step,
) -> ApiResponse {
    pool_step(req, step, |id| capi::sync_pool(store(s)?, kube(s)?, id))
}

/// `POST /v1/capi/metal/pools/{ns}/{name}`,
/// `/v1/capi/metal/global-pools/{name}` and the prefix pools' twins: sync
/// a VRF-backed pool. Answers 202 with `Retry-After` while Metal is still
/// working (the caller, or the next event, runs it again), 200 otherwise.
fn metal_pool<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    step: &Step,
) -> ApiResponse {
    pool_step(req, step, |id| {
        capi::vrf::sync_vrf_pool(store(s)?, kube(s)?, metal_of(s)?, id)
    })
}

/// The `provision` component: the VRF-backed pool step, the one component
/// that calls Metal.
pub fn provision<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    // The chained step route and its public twin (the status URL a 202
    // names): the same step, the same API token.
    match Step::parse_for(Component::Provision, req.path) {
        Some(step) => metal_pool(s, req, &step),
        None => no_route(req.path),
    }
}

fn metal_of<'a, K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'a, K, H>,
) -> Result<&'a Metal<'a, H, dyn Env + 'a>> {
    s.metal.ok_or_else(|| {
        Error::new(
            ErrorKind::Internal,
            "MetalNotConfigured",
            "Equinix Metal is not configured (variables metal_token and metal_project_id)",
        )
    })
}

/// `POST /v1/capi/metal/claims/{ns}/{name}` (chained) or
/// `/v1/metal/claims/{ns}/{name}` (public): assign a claim's address to its
/// device in Metal, or remove the assignment of a claim that is going.
/// 202 with `Retry-After` and `Location` while another instance is at it.
fn metal_claim<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let status = Step::MetalClaimStatus {
        ns: ns.into(),
        name: name.into(),
    };
    let route = status.template();
    if let Some(r) = guard(req, route, None) {
        return r;
    }
    let checked = status.check_names();
    let result = checked.and_then(|_| {
        capi::assign::sync_claim_assignment(store(s)?, kube(s)?, metal_of(s)?, ns, name)
    });
    let retry_after = result.as_ref().ok().and_then(|o| o.retry_after);
    let r = outcome_response(route, result, "claim", format!("{ns}/{name}"));
    match retry_after {
        Some(secs) => accepted(r, secs, status.path()),
        None => r,
    }
}

/// The `assign` component: per-claim Metal IP assignments (calls Metal).
pub fn assign<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    match Step::parse_for(Component::Assign, req.path) {
        Some(Step::MetalClaim { ns, name } | Step::MetalClaimStatus { ns, name }) => {
            metal_claim(s, req, &ns, &name)
        }
        _ => no_route(req.path),
    }
}

/// The `poll` component: `POST /v1/metal/poll` reads the Metal events
/// after the stored cursor and handles the devices they name, in bounded
/// work per call (run by a CronJob; Metal has no webhooks). 200 with the
/// report (`more` when devices are still due: call again); 500
/// `PollIncomplete` with it when single claims, machines or device reads
/// failed (the cursor moved anyway; their steps' conditions say why and
/// the reconcile run retries them; a device whose read failed backs off);
/// the error when the call stopped early (`capi::poll::poll`: Metal
/// failing device reads, or a failure that is not a device's); 200
/// `skipped` when Metal is not configured (nothing
/// can need polling then: VRF-backed pools say `MetalNotConfigured`
/// themselves).
pub fn poll<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    let route = StepKind::MetalPoll.route().template;
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    if let Some(r) = guard(req, route, Some(StepKind::MetalPoll)) {
        return r;
    }
    let Some(metal) = s.metal else {
        let mut r = ok(
            route,
            "skipped",
            json!({"result": "skipped", "reason": "MetalNotConfigured"}),
        );
        r.detail = Some("Equinix Metal is not configured: nothing to poll".into());
        return r;
    };
    let batches = chained(s);
    let report = match (|| capi::poll::poll(store(s)?, kube(s)?, metal, &batches))() {
        Ok(r) => r,
        Err(e) => return ApiResponse::from_error(&e, route),
    };
    let outcome = if report.more { "polled-more" } else { "polled" };
    let mut r = ApiResponse::success(200, Some(report.to_json()), route, outcome);
    if let Some(c) = &report.cursor {
        r.objects.push(("cursor", c.clone()));
    }
    with_errors(r, &report.errors, "polled-with-errors", "PollIncomplete")
}

/// The `network` component: a machine's Layer2 / Hybrid networking.
///
/// - `POST /v1/machines/{ns}/{name}/network`: applies the machine's
///   profile to its device; 200 when converged, 202 with `Retry-After` and
///   `Location` (this URL) while a step runs or another instance holds the
///   device. `?dryRun=true`: 200 with the plan, nothing changed.
/// - `DELETE` of the same URL releases it: the release is recorded (events,
///   reconcile and the poll leave the device alone until the annotation
///   changes or a `POST` asks to apply again), the device back to Layer3
///   without VLANs (202 while that runs), then the machine's per-VLAN
///   claims deleted (200). A `POST` withdraws the release.
/// - `GET /v1/machines/{ns}/{name}/netconfig?format=netplan|ifupdown|cloud-init|shell|network-data`:
///   the node's OS configuration as text (`X-Metal-IPAM-Pending` counts the
///   pool addresses not rendered yet); `network-data` is the whole
///   configuration as OpenStack `network_data.json` (`application/json`;
///   409 `DeviceUnknown` / `MacUnknown` until the device reports its
///   ports' MACs).
pub fn network<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    let step = match Step::parse_for(Component::Network, req.path) {
        Some(Step::Machine { ns, name }) => return machine_sync(s, req, &ns, &name),
        Some(Step::ProfileMachines { ns, name }) => {
            return machines_of(s, req, Concerned::Profile, &ns, &name)
        }
        Some(Step::PacketMachineMachines { ns, name }) => {
            return machines_of(s, req, Concerned::PacketMachine, &ns, &name)
        }
        Some(step) => step,
        None => return no_route(req.path),
    };
    let (route, netconfig) = (step.template(), step.kind() == StepKind::MachineNetconfig);
    let allowed = if netconfig { "GET" } else { "POST, DELETE" };
    if !allowed.split(", ").any(|m| m == req.method) {
        return method_not_allowed(route, allowed);
    }
    let (Step::MachineNetwork { ns, name } | Step::MachineNetconfig { ns, name }) = &step else {
        return no_route(req.path);
    };
    let machine = format!("{ns}/{name}");
    let fail = |e: Error| ApiResponse::from_error(&e, route).touching("machine", machine.clone());
    let services = || -> Result<_> {
        step.check_names()?;
        Ok((store(s)?, kube(s)?, metal_of(s)?))
    };
    let (ctx, kube, metal) = match services() {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let at = MachineAt {
        route,
        ns,
        name,
        chained: chained(s),
    };
    let answer = if netconfig {
        netconfig_answer(ctx, kube, metal, &at, req.query)
    } else if req.method == "DELETE" {
        release_answer(ctx, kube, metal, &at)
    } else if req.query.split('&').any(|kv| kv == "dryRun=true") {
        capi::network::plan_machine(ctx, kube, metal, ns, name).map(|plan| {
            ApiResponse::success(200, Some(plan), route, "planned")
                .touching("machine", machine.clone())
        })
    } else {
        apply_answer(ctx, kube, metal, &at)
    };
    answer.unwrap_or_else(fail)
}

/// The machine a public network route is about, and what its answers need.
struct MachineAt<'a, H: HttpClient + ?Sized> {
    route: &'static str,
    ns: &'a str,
    name: &'a str,
    chained: Chained<'a, H>,
}

type MetalOf<'a, H> = Metal<'a, H, dyn Env + 'a>;

/// `GET …/netconfig?format=`: the node's configuration as text.
fn netconfig_answer<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &MetalOf<'_, H>,
    at: &MachineAt<'_, H>,
    query: &str,
) -> Result<ApiResponse> {
    let format = capi::network::format_of(query)?;
    let (text, pending) = capi::network::netconfig(ctx, kube, metal, at.ns, at.name, format)?;
    let content_type = match format {
        crate::network::render::Format::Shell => "text/x-shellscript",
        crate::network::render::Format::Ifupdown => "text/plain; charset=utf-8",
        crate::network::render::Format::NetworkData => "application/json",
        _ => "application/yaml",
    };
    let mut r = ApiResponse::success(200, None, at.route, "rendered");
    r.text = Some((content_type, text));
    r.headers
        .push(("x-metal-ipam-pending", pending.len().to_string()));
    Ok(r.touching("machine", format!("{}/{}", at.ns, at.name)))
}

/// `DELETE …/network`: release the machine's network.
fn release_answer<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &MetalOf<'_, H>,
    at: &MachineAt<'_, H>,
) -> Result<ApiResponse> {
    let (report, deleted) =
        capi::network::release_machine(ctx, kube, metal, &at.chained, at.ns, at.name)?;
    let outcome = if report
        .as_ref()
        .is_some_and(|r| r.phase.retry_after().is_some())
    {
        "releasing"
    } else {
        "released"
    };
    let done = json!({"phase": "converged", "remaining": [], "issued": []});
    Ok(
        network_answer(at.route, outcome, report.as_ref(), done, at.ns, at.name)
            .with_member("claimsDeleted", deleted.into()),
    )
}

/// `POST …/network`: apply the machine's profile.
fn apply_answer<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    metal: &MetalOf<'_, H>,
    at: &MachineAt<'_, H>,
) -> Result<ApiResponse> {
    let (report, device) =
        capi::network::apply_machine(ctx, kube, metal, &at.chained, at.ns, at.name)?;
    let phase = report.phase.name();
    Ok(
        network_answer(at.route, phase, Some(&report), json!({}), at.ns, at.name)
            .with_member("device", device.clone().into())
            .touching("device", device),
    )
}

/// `POST /v1/capi/machines/{ns}/{name}/network` (chained from `events`
/// and `reconcile`): converges one Machine's network
/// ([`capi::machine::sync_machine`]). 200 with `result` (`absent`,
/// `ignored`, `waiting-for-device`, `converged`, `released`,
/// `released-by-operator`, `device-gone`), 202 with `Retry-After` while a
/// step runs (the forwarder delivers the event again); a machine whose
/// network cannot converge answers its error (404 `ProfileNotFound` with
/// the network left as it is, 409, 422, …).
fn machine_sync<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let route = StepKind::Machine.route().template;
    if let Some(r) = guard(req, route, None) {
        return r;
    }
    let machine = format!("{ns}/{name}");
    let checked = check_object(Some(ns), name);
    let result = checked.and_then(|_| {
        let (ctx, kube, metal) = (store(s)?, kube(s)?, metal_of(s)?);
        capi::machine::sync_machine(ctx, kube, metal, &chained(s), ns, name)
    });
    let synced = match result {
        Ok(x) => x,
        Err(e) => return ApiResponse::from_error(&e, route).touching("machine", machine),
    };
    let result = synced.result();
    let mut r = network_answer(route, result, synced.report(), json!({}), ns, name)
        .with_member("result", result.into());
    if let Some(n) = synced.claims_deleted() {
        r = r.with_member("claimsDeleted", n.into());
    }
    r
}

/// What an expansion route is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Concerned {
    /// A `MetalNetworkProfile`: the Machines using it.
    Profile,
    /// A `PacketMachine`: the Machines whose infrastructure machine it is.
    PacketMachine,
}

/// `POST /v1/capi/network-profiles/{ns}/{name}` and
/// `/v1/capi/packet-machines/{ns}/{name}` (chained from `events`): the
/// Machines the object's event concerns, `{"result": "expanded",
/// "machines": [names]}`; the `events` component then forwards each to
/// the machine sync route (one invocation each, so each has its own time
/// budget).
fn machines_of<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    what: Concerned,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let route = match what {
        Concerned::Profile => StepKind::ProfileMachines,
        Concerned::PacketMachine => StepKind::PacketMachineMachines,
    }
    .route()
    .template;
    if let Some(r) = guard(req, route, None) {
        return r;
    }
    let checked = check_object(Some(ns), name);
    let result = checked.and_then(|_| {
        let kube = kube(s)?;
        match what {
            Concerned::Profile => capi::network::machines_using(kube, ns, name),
            Concerned::PacketMachine => capi::network::machines_of_packet_machine(kube, ns, name),
        }
    });
    let (kind, object) = match what {
        Concerned::Profile => ("profile", format!("{ns}/{name}")),
        Concerned::PacketMachine => ("packetMachine", format!("{ns}/{name}")),
    };
    match result {
        Ok(machines) => ok(
            route,
            "expanded",
            json!({"result": "expanded", "machines": machines}),
        )
        .touching(kind, object),
        Err(e) => ApiResponse::from_error(&e, route).touching(kind, object),
    }
}

/// A network step's answer: the apply `report` as JSON (`none` without
/// one) with `machine`, logged as `outcome`; 202 with `Retry-After` and
/// `Location` (the machine's network route) while the report is in
/// progress.
fn network_answer(
    route: &'static str,
    outcome: &'static str,
    report: Option<&crate::network::apply::Report>,
    none: Value,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let machine = format!("{ns}/{name}");
    let mut body = report.map_or(none, crate::network::apply::Report::to_json);
    body["machine"] = machine.clone().into();
    let r = ApiResponse::success(200, Some(body), route, outcome).touching("machine", machine);
    match report.and_then(|r| r.phase.retry_after()) {
        Some(secs) => {
            let status = Step::MachineNetwork {
                ns: ns.into(),
                name: name.into(),
            };
            accepted(r, secs, status.path())
        }
        None => r,
    }
}

/// The VLAN batch steps, reached by service chaining with the API token.
fn chained<'a, K: KvStore, H: HttpClient + ?Sized>(s: &Services<'a, K, H>) -> Chained<'a, H> {
    Chained {
        http: s.http,
        api_token: s.api_token,
    }
}

/// The `attach-vlan` component (private: reached from `network` and `poll`
/// by service chaining): `POST /v1/metal/ports/{port}/vlan-batches` with a
/// [`BatchOp`] creates, finds or reads a port's batch that assigns VLANs.
/// 200 with `{port, op, batch}`; a Metal failure answers its status with
/// the usual error body plus `metal`, the Metal error itself.
pub fn attach_vlan<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    vlan_batch(s, req, Direction::Attach)
}

/// The `detach-vlan` component: as [`attach_vlan`], for batches that
/// unassign VLANs.
pub fn detach_vlan<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    vlan_batch(s, req, Direction::Detach)
}

fn vlan_batch<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    dir: Direction,
) -> ApiResponse {
    let route = StepKind::VlanBatch.route().template;
    let port = match Step::parse(req.path) {
        Some(Step::VlanBatch { port }) => port,
        _ => return no_route(req.path),
    };
    if let Some(r) = guard(req, route, None) {
        return r;
    }
    let fail = |e: Error| ApiResponse::from_error(&e, route).touching("port", port.clone());
    if !crate::ipam::vrf::is_uuid(&port) {
        return fail(Error::new(
            ErrorKind::Malformed,
            "InvalidBatch",
            "the port is not a UUID",
        ));
    }
    let op = api::parse_json(req.body).and_then(|v| {
        let op: BatchOp = serde_json::from_value(v).map_err(|e| {
            Error::new(
                ErrorKind::Malformed,
                "InvalidBatch",
                format!("not a batch step: {e}"),
            )
        })?;
        op.check()?;
        Ok(op)
    });
    let op = match op {
        Ok(op) => op,
        Err(e) => return fail(e),
    };
    let metal = match metal_of(s) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    match batch::execute(metal, dir, &port, &op) {
        Ok(b) => {
            let outcome = match (&op, &b) {
                (BatchOp::Create { .. }, _) => "created",
                (_, Some(_)) => "found",
                (_, None) => "none",
            };
            let mut r = ok(route, outcome, batch::answer(&port, &op, b.as_ref()));
            if let Some(b) = &b {
                r.objects.push(("batch", b.id.clone()));
            }
            r.touching("port", port)
        }
        Err(e) => {
            let mut r = ApiResponse::from_error(&Error::from(e.clone()), route);
            r.body = Some(batch::failure_body(&e));
            if let MetalError::Unavailable { retry_after_s, .. } = &e {
                r.headers.retain(|(h, _)| *h != "retry-after");
                r.headers.push(("retry-after", retry_after_s.to_string()));
            }
            r.touching("port", port)
        }
    }
}

fn with_store<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    f: impl FnOnce(&Ctx<'_, K>, &ApiRequest<'_>) -> ApiResponse,
) -> ApiResponse {
    match store(s) {
        Ok(ctx) => f(ctx, req),
        Err(e) => ApiResponse::from_error(&e, ""),
    }
}

/// The `pools` component.
pub fn pools<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    match Step::parse_for(Component::Pools, req.path) {
        Some(
            step @ (Step::Pool { .. }
            | Step::GlobalPool { .. }
            | Step::PrefixPool { .. }
            | Step::GlobalPrefixPool { .. }),
        ) => capi_pool(s, req, &step),
        _ => with_store(s, req, api::pools),
    }
}

/// Headers of every answer of the read-only components: nothing cached,
/// nothing sniffed, no referrer, not framed.
fn read_only_headers(r: &mut ApiResponse) {
    r.headers.push(("cache-control", "no-store".to_string()));
    r.headers
        .push(("x-content-type-options", "nosniff".to_string()));
    r.headers
        .push(("referrer-policy", "no-referrer".to_string()));
    r.headers.push(("x-frame-options", "DENY".to_string()));
}

/// The `metrics` component: `GET /v1/metrics`, the Prometheus exposition
/// (text format 0.0.4), with the API token or the read token.
pub fn metrics<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    const ROUTE: &str = "/v1/metrics";
    if let Some(r) = refused(s, req, Policy::Read, "") {
        return r;
    }
    if Step::parse_for(Component::Metrics, req.path).is_none() {
        return no_route(req.path);
    }
    if req.method != "GET" {
        return method_not_allowed(ROUTE, "GET");
    }
    let mut r = match store(s).and_then(|ctx| crate::observe::metrics::scrape(ctx)) {
        Ok(text) => {
            let mut r = ApiResponse::success(200, None, ROUTE, "scraped");
            r.text = Some((crate::observe::metrics::CONTENT_TYPE, text));
            r
        }
        Err(e) => ApiResponse::from_error(&e, ROUTE),
    };
    read_only_headers(&mut r);
    r
}

/// The browser view's page and files (`/ui`, `/ui/{file}`), answered
/// without a token and without the store (they hold no data); `None` for
/// any other path (the data routes, [`ui`]). Non-GET → 405, an unknown
/// file → 404. The Spin shell serves these before its token check.
pub fn ui_file(req: &ApiRequest<'_>) -> Option<ApiResponse> {
    use crate::observe::ui;
    let step = Step::parse_for(Component::Ui, req.path)
        .filter(|s| matches!(s, Step::UiPage {} | Step::UiAsset { .. }))?;
    let route = step.template();
    let mut r = if req.method != "GET" {
        method_not_allowed(route, "GET")
    } else {
        let f = match &step {
            Step::UiAsset { file } => ui::asset(file),
            _ => Some(ui::page()),
        };
        match f {
            Some((content_type, text)) => {
                let mut r = ApiResponse::success(200, None, route, "served");
                r.text = Some((content_type, text.to_string()));
                r
            }
            None => no_route(req.path),
        }
    };
    r.headers.push((
        "content-security-policy",
        ui::CONTENT_SECURITY_POLICY.to_string(),
    ));
    read_only_headers(&mut r);
    Some(r)
}

/// The `ui` component: the browser view's page and files (no data in
/// them: served without a token, [`ui_file`]) and its data routes under
/// `/ui/api/` (the API token or the read token, sent by the page from
/// `fetch`; checked before anything else).
pub fn ui<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    use crate::observe::view;
    if let Some(r) = ui_file(req) {
        return r;
    }
    if let Some(r) = refused(s, req, Policy::Read, "") {
        return r;
    }
    let Some(step) = Step::parse_for(Component::Ui, req.path) else {
        return no_route(req.path);
    };
    let route = step.template();
    if req.method != "GET" {
        return method_not_allowed(route, "GET");
    }
    let data = |v: Result<Option<Value>>, what: String| match v {
        Ok(Some(v)) => ApiResponse::success(200, Some(v), route, "read").touching("view", what),
        Ok(None) => ApiResponse::from_error(
            &Error::not_found("NotFound", format!("{what} is not in the store")),
            route,
        ),
        Err(e) => ApiResponse::from_error(&e, route),
    };
    let mut r = match store(s) {
        Err(e) => ApiResponse::from_error(&e, route),
        Ok(ctx) => match step {
            Step::UiOverview {} => data(view::overview(ctx).map(Some), "overview".into()),
            Step::UiPool { .. }
            | Step::UiGlobalPool { .. }
            | Step::UiPrefixPool { .. }
            | Step::UiGlobalPrefixPool { .. } => match capi::steps::pool_of_step(&step) {
                Some(id) => data(view::pool(ctx, &id), id.display()),
                None => no_route(req.path),
            },
            Step::UiMachines {} => data(view::machines(ctx).map(Some), "machines".into()),
            Step::UiSearch {} => data(view::search(ctx, req.query).map(Some), "search".into()),
            _ => no_route(req.path),
        },
    };
    read_only_headers(&mut r);
    r
}

/// The claim step route both claim components serve, else `plain` (their
/// part of the plain HTTP API).
fn claim_component<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    plain: impl FnOnce(&Ctx<'_, K>, &ApiRequest<'_>) -> ApiResponse,
) -> ApiResponse {
    match Step::parse(req.path) {
        Some(Step::Claim { ns, name }) => capi_claim(s, req, &ns, &name),
        _ => with_store(s, req, plain),
    }
}

/// The `allocate` component: `POST /v1/claims`, and the claim step.
pub fn allocate<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    claim_component(s, req, api::allocate)
}

/// The `release` component: `/v1/claims/{namespace}/{name}`, and the claim
/// step.
pub fn release<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    claim_component(s, req, api::claims)
}

/// The `admission` component: `POST /v1/admission/pools` and
/// `POST /v1/admission/network-profiles` with an `AdmissionReview`;
/// answers the review (200) whether allowed or denied.
pub fn admission<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    // One review function for both kinds (it dispatches on request.kind);
    // a route per webhook so each is registered for its resources only.
    let route = match Step::parse_for(Component::Admission, req.path) {
        Some(step) => step.template(),
        None => return no_route(req.path),
    };
    if let Some(r) = guard(req, route, None) {
        return r;
    }
    let machines = KubeMachines(s.kube);
    let result = store(s).and_then(|ctx| {
        let profiles = s
            .kube
            .map(|kube| admission::KubeProfiles { kv: ctx.kv, kube });
        let profiles = profiles
            .as_ref()
            .map(|p| p as &dyn admission::ProfileLookup);
        match s.kube {
            Some(kube) => {
                let pools = admission::KubePools { kv: ctx.kv, kube };
                admission::evaluate_with(req.body, &pools, &machines, profiles)
            }
            None => admission::evaluate_with(req.body, &KvPools(ctx.kv), &machines, profiles),
        }
    });
    match result {
        Ok(r) => {
            let outcome = if r.allowed() { "allowed" } else { "denied" };
            let mut resp = ApiResponse::success(200, Some(r.to_json()), route, outcome);
            if let Some(d) = &r.denial {
                resp.reason = Some(d.reason);
                resp.detail = Some(d.message.clone());
            }
            if let Some(p) = &r.pool {
                resp.objects.push(("pool", p.display()));
            }
            resp
        }
        Err(e) => ApiResponse::from_error(&e, route),
    }
}

/// The Machines using a profile, from the API server (the profile
/// webhook's DELETE check); without Kubernetes access, the review fails.
struct KubeMachines<'a, H: HttpClient + ?Sized>(Option<&'a Kube<'a, H>>);

impl<H: HttpClient + ?Sized> admission::MachineLookup for KubeMachines<'_, H> {
    fn using(&self, ns: &str, profile: &str) -> Result<Vec<String>> {
        match self.0 {
            Some(kube) => capi::network::machines_using(kube, ns, profile),
            None => admission::MachineLookup::using(&admission::NoMachines, ns, profile),
        }
    }
}

/// The `reconcile` component: `POST /v1/reconcile` runs a full
/// reconciliation and answers its report (200).
pub fn reconcile<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    if let Some(r) = authenticated(s, req) {
        return r;
    }
    let route = StepKind::Reconcile.route().template;
    if let Some(r) = guard(req, route, Some(StepKind::Reconcile)) {
        return r;
    }
    let ctx = match store(s) {
        Ok(ctx) => ctx,
        Err(e) => return ApiResponse::from_error(&e, route),
    };
    let started = ctx.env.now_ms();
    let mut report = match kube(s).and_then(|kube| reconcile::reconcile_all(ctx, kube)) {
        Ok(report) => report,
        Err(e) => return ApiResponse::from_error(&e, route),
    };
    let body = chain::chain_reconciled(&chained(s), &mut report);
    // What the run saw, for the metrics and the browser view: an
    // observation, so a store failure here is reported, not fatal.
    let network = body["network"].as_array().map_or(&[][..], Vec::as_slice);
    let (now, took) = (ctx.env.now(), ctx.env.now_ms().saturating_sub(started));
    if let Err(e) = report
        .summary(ctx, network, now, took)
        .and_then(|sum| crate::observe::summary::write(ctx.kv, &sum))
    {
        report.errors.push(format!("observation summary: {e}"));
    }
    // Errors on single objects make the run a 500 (with the report), so
    // a CronJob shows the failure; the rest of the run still happened.
    with_errors(
        ApiResponse::success(200, Some(body), route, "reconciled"),
        &report.errors,
        "reconciled-with-errors",
        "ReconcileIncomplete",
    )
}

/// A run's report: `ok` as it is when `errors` is empty, else a 500 with
/// the same body, `outcome`, `reason` and the errors in the log line (so a
/// CronJob shows the failure).
fn with_errors(
    mut ok: ApiResponse,
    errors: &[String],
    outcome: &'static str,
    reason: &'static str,
) -> ApiResponse {
    if errors.is_empty() {
        return ok;
    }
    ok.status = 500;
    ok.outcome = outcome;
    ok.reason = Some(reason);
    ok.detail = Some(errors.join("; "));
    ok
}

/// Marks `r` as 202: a step still working, with `Retry-After` and the
/// `Location` to POST again.
fn accepted(mut r: ApiResponse, retry_after: u64, location: String) -> ApiResponse {
    r.status = 202;
    r.headers.push(("retry-after", retry_after.to_string()));
    r.headers.push(("location", location));
    r
}

/// The `events` component: `POST /v1/events`.
///
/// Authenticates (the API token or the events token, as a bearer token or
/// the `metalipamtoken` CloudEvents extension), parses the event, forwards
/// it by service chaining to the step component (with the API token) and
/// answers 200 with what the step reported, 200 `ignored` for events we do
/// not act on, 400 for malformed payloads, the step's status when it
/// failed with a 5xx (so the forwarder retries), and 503 with the step's
/// `Retry-After` when a step answered 202 (still working on Metal: the
/// forwarder delivers the event again after the wait). A claim step that
/// answers `"metalAssignment": true` (the claim is in a VRF-backed pool) is
/// followed by the `assign` step, and a `release` that was waiting for it
/// runs once more after it. A profile's or a `PacketMachine`'s event goes to
/// the `network` step that names the Machines it concerns, and each of
/// them is then synced by its own chained request (the worst status of all
/// decides the answer). The response never carries CloudEvents headers
/// (a Knative broker would take it for a reply event).
pub fn events<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    let route = StepKind::Events.route().template;
    if let Some(r) = refused(s, req, Policy::Events, route) {
        return r;
    }
    if let Some(r) = guard(req, route, Some(StepKind::Events)) {
        return r;
    }
    let header = |name: &str| req.header(name).map(str::to_string);
    let parsed = match events::parse(req.content_type(), &header, req.body) {
        Ok(p) => p,
        Err(e) => return ApiResponse::from_error(&e, route),
    };
    let ev = match parsed.outcome {
        Outcome::Ignored { format, reason } => {
            let mut r = ok(
                route,
                "ignored",
                json!({"result": "ignored", "format": format.name(), "reason": reason}),
            );
            r.detail = Some(reason);
            return r;
        }
        Outcome::Object(ev) => ev,
    };
    let object = format!("{} {}", ev.kind.kind_name(), ev.display());
    let run = match chain::run_chain(&chained(s), events::route::calls(&ev)) {
        Ok(run) => run,
        Err(e) => {
            let mut r = ApiResponse::from_error(&e, route);
            r.objects.push(("object", object));
            return r;
        }
    };
    let first = run.steps.first().cloned().unwrap_or(Value::Null);
    let r = ok(
        route,
        "forwarded",
        json!({"result": "forwarded", "format": ev.format.name(), "object": object,
               "step": first["step"], "stepStatus": first["status"], "stepResult": first["result"],
               "steps": run.steps}),
    );
    let mut r = chain_status(&run, r);
    r.objects.push(("object", object));
    r.objects.push(("step", run.first_component.to_string()));
    r
}

/// `r` with the status `run` calls for: a 5xx step → 502 (503 as it
/// is) so the forwarder retries; a 4xx step → `step-refused`; a step in
/// progress → 503 with its `Retry-After` (forwarders retry 503s, not
/// 2xx).
fn chain_status(run: &ChainRun, mut r: ApiResponse) -> ApiResponse {
    let worst = run.worst;
    if worst >= 500 {
        r.status = if worst == 503 { 503 } else { 502 };
        r.outcome = "step-failed";
        r.headers.push(("retry-after", "1".to_string()));
        r.detail = Some(format!("a step answered {worst}"));
    } else if worst >= 400 {
        r.outcome = "step-refused";
        r.detail = Some(format!("a step answered {worst}"));
    } else if let Some(wait) = run.in_progress {
        r.status = 503;
        r.outcome = "step-in-progress";
        r.headers.push(("retry-after", wait.to_string()));
        r.detail = Some(format!("a step is in progress; deliver again in {wait} s"));
    }
    r
}

fn ok(route: &'static str, outcome: &'static str, body: Value) -> ApiResponse {
    ApiResponse::success(200, Some(body), route, outcome)
}
