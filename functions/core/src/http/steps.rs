//! The steps' handlers: the Kubernetes side's chained steps (claim, pool
//! status, VRF-backed pool, Metal assignment), the Metal poll, the full
//! reconciliation, the events route and the admission webhooks. Each takes
//! the route's fields, already authenticated and matched
//! ([`super::dispatch`]); chaining itself is [`crate::events::chain`]'s.

use serde_json::{json, Value};

use crate::admission::{self, KvPools};
use crate::capi;
use crate::capi::reconcile as full;
use crate::cloud::CloudKind;
use crate::error::Result;
use crate::events::chain::{self, ChainRun};
use crate::events::{self, Outcome};
use crate::http::api::{ApiRequest, ApiResponse};
use crate::http::services::Services;
use crate::ipam::pool::PoolId;
use crate::kube::Kube;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::routes::{check_object, Route, RouteKind};

fn outcome_response(
    route: &'static str,
    o: Result<capi::Reconciled>,
    kind: &'static str,
    what: String,
) -> ApiResponse {
    match o {
        Ok(o) => {
            let mut r = ApiResponse::success(200, Some(o.to_json()), route, o.result.as_str());
            r.objects.push((kind, what));
            if let Some(a) = capi::ClaimAnswer::address(&o) {
                r.objects.push(("address", a.to_string()));
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
pub(crate) fn claim<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let route = RouteKind::Claim.def().template;
    let checked = check_object(Some(ns), name);
    let result = checked.and_then(|_| capi::reconcile_claim(s.store()?, s.kube()?, ns, name));
    outcome_response(route, result, "claim", format!("{ns}/{name}"))
}

/// A pool step (`route`, the template it was reached by): the pool's names
/// checked, then `run`; 202 with `Retry-After` and `Location` (the VRF
/// step's public twin) when the step is waiting on something that takes
/// time (Metal), 200 otherwise.
fn pool_step(
    route: &'static str,
    id: &PoolId,
    run: impl FnOnce(&PoolId) -> Result<capi::Reconciled>,
) -> ApiResponse {
    let checked = check_object(id.namespace.as_deref(), &id.name);
    let result = checked.and_then(|_| run(id));
    let retry_after = result.as_ref().ok().and_then(|o| o.retry_after);
    let r = outcome_response(route, result, "pool", id.display());
    match retry_after {
        // Only the VRF-backed pool step waits; its public route is where
        // to POST again for the next step and the status.
        Some(secs) => accepted(r, secs, Route::VrfPoolStatus(id.clone()).path()),
        None => r,
    }
}

/// `POST /v1/capi/pools/{ns}/{name}`, `/v1/capi/global-pools/{name}` and
/// the prefix pools' twins: sync a pool's status.
pub(crate) fn pool_sync<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    id: &PoolId,
) -> ApiResponse {
    let route = Route::PoolSync(id.clone()).template();
    pool_step(route, id, |id| capi::sync_pool(s.store()?, s.kube()?, id))
}

/// `POST /v1/capi/metal/pools/{ns}/{name}`,
/// `/v1/capi/metal/global-pools/{name}` and the prefix pools' twins
/// (chained), and the same step at `/v1/metal/…` (public; `route` is the
/// one it was reached by): sync a VRF-backed pool. Answers 202 with
/// `Retry-After` while Metal is still working (the caller, or the next
/// event, runs it again), 200 otherwise.
pub(crate) fn vrf_pool<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    route: &'static str,
    id: &PoolId,
) -> ApiResponse {
    pool_step(route, id, |id| {
        capi::vrf::sync_vrf_pool(s.store()?, s.kube()?, &s.clouds(), id)
    })
}

/// `POST /v1/capi/metal/claims/{ns}/{name}` (chained) or
/// `/v1/metal/claims/{ns}/{name}` (public; both named after the latter):
/// assign a claim's address to its device in Metal, or remove the
/// assignment of a claim that is going. 202 with `Retry-After` and
/// `Location` while another instance is at it.
pub(crate) fn metal_claim<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    ns: &str,
    name: &str,
) -> ApiResponse {
    let status = Route::MetalClaimStatus {
        ns: ns.into(),
        name: name.into(),
    };
    let route = status.template();
    let checked = status.check_names();
    let result = checked.and_then(|_| {
        capi::assign::sync_claim_assignment(s.store()?, s.kube()?, &s.clouds(), ns, name)
    });
    let retry_after = result.as_ref().ok().and_then(|o| o.retry_after);
    let r = outcome_response(route, result, "claim", format!("{ns}/{name}"));
    match retry_after {
        Some(secs) => accepted(r, secs, status.path()),
        None => r,
    }
}

/// `POST /v1/metal/poll` reads each configured cloud's events after its
/// stored cursor (Metal's project events; phoenixNAP's audit log, whose
/// new events make it re-read every server the store knows) and handles
/// the devices they name, in bounded work per call (run by a
/// CronJob; neither cloud has webhooks). 200 with Metal's report at the top
/// level (`{"result": "skipped", "reason": "MetalNotConfigured"}` without
/// Metal) and phoenixNAP's under `phoenixnap` when it is configured
/// (`more` when devices are still due: call again); 500 `PollIncomplete`
/// with it when single claims, machines or device reads failed (the cursor
/// moved anyway; their steps' conditions say why and the reconcile run
/// retries them; a device whose read failed backs off); the error when a
/// cloud's call stopped early (`capi::poll::poll`: the cloud failing
/// device reads, or a failure that is not a device's; the other cloud is
/// still polled first). 200 `skipped` when no cloud is configured.
pub(crate) fn poll<K: KvStore, H: HttpClient + ?Sized>(s: &Services<'_, K, H>) -> ApiResponse {
    let route = Route::MetalPoll.template();
    let clouds = s.clouds();
    if clouds.is_empty() {
        let mut r = ok(
            route,
            "skipped",
            json!({"result": "skipped", "reason": "MetalNotConfigured"}),
        );
        r.detail = Some("no cloud is configured: nothing to poll".into());
        return r;
    }
    let batches = s.chained();
    let mut body = json!({"result": "skipped", "reason": "MetalNotConfigured"});
    let (mut more, mut errors, mut stopped, mut cursor) = (false, Vec::new(), None, None);
    for (kind, cloud) in clouds.configured() {
        let cloud: &dyn crate::cloud::Cloud = cloud;
        match (|| capi::poll::poll(s.store()?, s.kube()?, kind, cloud, &batches))() {
            Ok(report) => {
                more |= report.more;
                errors.extend(report.errors.iter().map(|e| match kind {
                    CloudKind::Metal => e.clone(),
                    CloudKind::Phoenixnap => format!("phoenixNAP: {e}"),
                }));
                match kind {
                    CloudKind::Metal => {
                        cursor = report.cursor.clone();
                        body = report.to_json();
                    }
                    CloudKind::Phoenixnap => body["phoenixnap"] = report.to_json(),
                }
            }
            Err(e) => {
                if kind == CloudKind::Phoenixnap {
                    body["phoenixnap"] = json!({"error": e.reason(), "message": e.message()});
                }
                stopped.get_or_insert(e);
            }
        }
    }
    if let Some(e) = stopped {
        let mut r = ApiResponse::from_error(&e, route);
        if let Some(p) = body.get("phoenixnap") {
            r.detail = Some(format!("phoenixNAP: {p}"));
        }
        return r;
    }
    let outcome = if more { "polled-more" } else { "polled" };
    let mut r = ApiResponse::success(200, Some(body), route, outcome);
    if let Some(c) = cursor {
        r.objects.push(("cursor", c));
    }
    with_errors(r, &errors, "polled-with-errors", "PollIncomplete")
}

/// `POST /v1/reconcile` runs a full
/// reconciliation and answers its report (200).
pub(crate) fn reconcile<K: KvStore, H: HttpClient + ?Sized>(s: &Services<'_, K, H>) -> ApiResponse {
    let route = Route::Reconcile.template();
    let ctx = match s.store() {
        Ok(ctx) => ctx,
        Err(e) => return ApiResponse::from_error(&e, route),
    };
    let started = ctx.env.now_ms();
    let mut report = match s.kube().and_then(|kube| full::reconcile_all(ctx, kube)) {
        Ok(report) => report,
        Err(e) => return ApiResponse::from_error(&e, route),
    };
    let body = chain::chain_reconciled(&s.chained(), &mut report);
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

/// `POST /v1/events` (authenticated by the API token or the events token,
/// as a bearer token or the `metalipamtoken` CloudEvents extension):
/// parses the event, forwards
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
pub(crate) fn events<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> ApiResponse {
    let route = Route::Events.template();
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
    let run = match chain::run_chain(&s.chained(), events::route::calls(&ev)) {
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

/// `POST /v1/admission/pools` and `POST /v1/admission/network-profiles`
/// (`route`) with an `AdmissionReview`: answers the review (200) whether
/// allowed or denied. One review function for both kinds (it dispatches
/// on request.kind); a route per webhook so each is registered for its
/// resources only.
pub(crate) fn admission<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    route: &'static str,
) -> ApiResponse {
    let machines = KubeMachines(s.kube);
    let result = s.store().and_then(|ctx| {
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

/// A run's report: `ok` as it is when `errors` is empty, else a 500 with
/// the same body, `outcome`, `reason` and the errors in the log line (so a
/// CronJob shows the failure).
pub(crate) fn with_errors(
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
pub(crate) fn accepted(mut r: ApiResponse, retry_after: u64, location: String) -> ApiResponse {
    r.status = 202;
    r.headers.push(("retry-after", retry_after.to_string()));
    r.headers.push(("location", location));
    r
}

/// A 200 with `body`, logging `outcome`.
pub(crate) fn ok(route: &'static str, outcome: &'static str, body: Value) -> ApiResponse {
    ApiResponse::success(200, Some(body), route, outcome)
}

/// What `POST /v1/takeover/{kind}` may carry: the in-cluster provider's
/// Deployment, when it is not clusterctl's default.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TakeoverBody {
    #[serde(default)]
    deployment: Option<capi::takeover::DeploymentRef>,
}

/// `/v1/takeover/{kind}` (API token): `POST` takes one of the in-cluster
/// provider's pool kinds over (optional body `{"deployment": {"namespace",
/// "name"}}`), `GET` shows where it stands, `DELETE` hands it back; each
/// answers 200 with the kind's state, its pools and addresses
/// (`capi::takeover`; docs/takeover.md).
pub(crate) fn takeover<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    kind: crate::ipam::pool::PoolKind,
) -> ApiResponse {
    use capi::takeover as t;
    let route = Route::Takeover(kind).template();
    let run = || -> Result<(t::TakeoverReport, &'static str)> {
        let ctx = s.store()?;
        match req.method {
            "POST" => {
                let body: TakeoverBody = if req.body.iter().all(u8::is_ascii_whitespace) {
                    TakeoverBody::default()
                } else {
                    serde_json::from_slice(req.body).map_err(|e| {
                        crate::error::Error::malformed(format!(
                            "the body must be {{\"deployment\": {{\"namespace\": …, \"name\": …}}}} or empty: {e}"
                        ))
                    })?
                };
                let kube = s.kube()?;
                let d = body.deployment.unwrap_or_default();
                Ok((t::take_over(ctx, kube, kind, d)?, "taken-over"))
            }
            "DELETE" => Ok((t::hand_back(ctx, kind)?, "handed-back")),
            _ => Ok((
                t::TakeoverReport {
                    record: t::record(ctx.kv, kind)?,
                    ..t::TakeoverReport::default()
                },
                "shown",
            )),
        }
    };
    match run() {
        // A hand-back in its quiet period: 202, call again after it.
        Ok((report, "handed-back")) if report.record.is_some() => {
            let mut body = report.to_json(kind);
            body["retryAfterSeconds"] = t::QUIET_SECONDS.into();
            ApiResponse::success(202, Some(body), route, "returning")
        }
        Ok((report, outcome)) => {
            ApiResponse::success(200, Some(report.to_json(kind)), route, outcome)
        }
        Err(e) => ApiResponse::from_error(&e, route),
    }
}
