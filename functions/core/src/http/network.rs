//! The network handlers: a machine's network and its rendered
//! configuration (public), the Machine sync and the expansion steps
//! (chained from `events` and `reconcile`), and the VLAN batch steps
//! (chained from `network` and `poll`). Each takes the route's fields,
//! already authenticated and matched ([`super::dispatch`]).

use serde_json::{json, Value};

use crate::capi;
use crate::capi::network::Deps;
use crate::cloud::{Cloud, CloudError};
use crate::error::{Error, ErrorKind, Result};
use crate::http::api::{self, ApiRequest, ApiResponse};
use crate::http::services::Services;
use crate::http::steps::{accepted, ok};
use crate::network::batch::{self, BatchOp, Chained, Direction};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::routes::{check_object, Route, RouteKind};

/// A machine's Layer2 / Hybrid networking (`route`, one of the two
/// public machine routes; its method already one of the row's).
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
pub(crate) fn machine<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    step: &Route,
) -> ApiResponse {
    let (route, netconfig) = (step.template(), step.kind() == RouteKind::MachineNetconfig);
    let (Route::MachineNetwork { ns, name } | Route::MachineNetconfig { ns, name }) = step else {
        return crate::http::no_route(req.path);
    };
    let machine = format!("{ns}/{name}");
    let fail = |e: Error| ApiResponse::from_error(&e, route).touching("machine", machine.clone());
    let services = || -> Result<_> {
        step.check_names()?;
        Ok((s.store()?, s.kube()?))
    };
    let (ctx, kube) = match services() {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let at = MachineAt {
        route,
        ns,
        name,
        chained: s.chained(),
    };
    let clouds = s.clouds();
    let deps = Deps {
        ctx,
        kube,
        metal: clouds.metal.map(|c| c as &dyn Cloud),
        pnap: clouds.pnap.map(|c| c as &dyn Cloud),
        batches: &at.chained,
    };
    let answer = if netconfig {
        netconfig_answer(deps, &at, req.query)
    } else if req.method == "DELETE" {
        release_answer(deps, &at)
    } else if req.query.split('&').any(|kv| kv == "dryRun=true") {
        capi::network::plan_machine(deps, ns, name).map(|plan| {
            ApiResponse::success(200, Some(plan), route, "planned")
                .touching("machine", machine.clone())
        })
    } else {
        apply_answer(deps, &at)
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

/// `GET …/netconfig?format=`: the node's configuration as text.
fn netconfig_answer<K: KvStore, H: HttpClient + ?Sized>(
    deps: Deps<'_, '_, K, H>,
    at: &MachineAt<'_, H>,
    query: &str,
) -> Result<ApiResponse> {
    let format = capi::network::format_of(query)?;
    let (text, pending) = capi::network::netconfig(deps, at.ns, at.name, format)?;
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
    deps: Deps<'_, '_, K, H>,
    at: &MachineAt<'_, H>,
) -> Result<ApiResponse> {
    let (report, deleted) = capi::network::release_machine(deps, at.ns, at.name)?;
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
    deps: Deps<'_, '_, K, H>,
    at: &MachineAt<'_, H>,
) -> Result<ApiResponse> {
    let (report, device) = capi::network::apply_machine(deps, at.ns, at.name)?;
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
pub(crate) fn machine_sync<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let route = RouteKind::Machine.def().template;
    let machine = format!("{ns}/{name}");
    let checked = check_object(Some(ns), name);
    let result = checked.and_then(|_| {
        let batches = s.chained();
        let clouds = s.clouds();
        let deps = Deps {
            ctx: s.store()?,
            kube: s.kube()?,
            metal: clouds.metal.map(|c| c as &dyn Cloud),
            pnap: clouds.pnap.map(|c| c as &dyn Cloud),
            batches: &batches,
        };
        capi::machine::sync_machine(deps, ns, name)
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
pub(crate) enum Concerned {
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
pub(crate) fn machines_of<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    what: Concerned,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let route = match what {
        Concerned::Profile => RouteKind::ProfileMachines,
        Concerned::PacketMachine => RouteKind::PacketMachineMachines,
    }
    .def()
    .template;
    let checked = check_object(Some(ns), name);
    let result = checked.and_then(|_| {
        let kube = s.kube()?;
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
    report: Option<&crate::network::apply::ApplyReport>,
    none: Value,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let machine = format!("{ns}/{name}");
    let mut body = report.map_or(none, crate::network::apply::ApplyReport::to_json);
    body["machine"] = machine.clone().into();
    let r = ApiResponse::success(200, Some(body), route, outcome).touching("machine", machine);
    match report.and_then(|r| r.phase.retry_after()) {
        Some(secs) => {
            let status = Route::MachineNetwork {
                ns: ns.into(),
                name: name.into(),
            };
            accepted(r, secs, status.path())
        }
        None => r,
    }
}

/// `POST /v1/metal/ports/{port}/vlan-batches` (`attach-vlan` and
/// `detach-vlan`, private: reached from `network` and `poll` by service
/// chaining) with a [`BatchOp`]: creates, finds or reads a port's batch
/// that assigns (`dir`: attach) or unassigns VLANs. 200 with `{port, op,
/// batch}`; a Metal failure answers its status with the usual error body
/// plus `metal`, the Metal error itself.
pub(crate) fn vlan_batch<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    dir: Direction,
    port: String,
) -> ApiResponse {
    let route = RouteKind::VlanBatch.def().template;
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
    let metal = match s.metal() {
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
            if let CloudError::Unavailable { retry_after_s, .. } = &e {
                r.headers.retain(|(h, _)| *h != "retry-after");
                r.headers.push(("retry-after", retry_after_s.to_string()));
            }
            r.touching("port", port)
        }
    }
}
