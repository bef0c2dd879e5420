//! Service chaining: sending the chained steps an event or a full
//! reconciliation calls for, and collecting what they answered.
//!
//! [`run_chain`] runs an event's calls ([`super::route::calls`]) and what
//! follows each from its answer ([`super::route::follow_up`]);
//! [`chain_reconciled`] drives the steps a full reconciliation lists
//! (VRF-backed pools, Metal assignments, opted-in Machines);
//! [`forward`] sends one call with the API token. The HTTP answers built
//! from these are `http::components`'.

use std::collections::VecDeque;

use serde_json::{json, Value};

use crate::capi::reconcile;
use crate::error::{Error, Result};
use crate::network::batch::Chained;
use crate::ports::http::{headers, Deadline, HttpClient};
use crate::routes::{Answer, Call, Component, Route};

/// What an event's chained steps did.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainRun {
    /// `{step, path, status, result}` per call, in order.
    pub steps: Vec<Value>,
    /// The worst status any step answered.
    pub worst: u16,
    /// A step still working (202): the longest wait it asked for.
    pub in_progress: Option<u64>,
    /// The component of the first call.
    pub first_component: &'static str,
}

/// Runs `calls` and what follows each from its answer
/// ([`super::route::follow_up`]), in order.
///
/// # Errors
/// 503 `StepUnavailable` when a step cannot be reached (the calls before
/// it stay done).
pub fn run_chain<H: HttpClient + ?Sized>(
    to: &Chained<'_, H>,
    calls: Vec<Call>,
) -> Result<ChainRun> {
    let mut run = ChainRun {
        steps: Vec::new(),
        worst: 200,
        in_progress: None,
        first_component: "",
    };
    let mut queue: VecDeque<Call> = calls.into();
    let mut assigned = false;
    while let Some(call) = queue.pop_front() {
        let component = call.component.name();
        if run.first_component.is_empty() {
            run.first_component = component;
        }
        let (status, body, answer) = forward(to, &call)?;
        queue.extend(super::route::follow_up(&call, &answer, &mut assigned));
        run.worst = run.worst.max(status);
        if status == 202 {
            let wait = answer.retry_after.unwrap_or(1);
            run.in_progress = Some(run.in_progress.unwrap_or(0).max(wait));
        }
        let path = call.step.path();
        run.steps
            .push(json!({"step": component, "path": path, "status": status, "result": body}));
    }
    Ok(run)
}

/// The chained steps of a full reconciliation, and its report as JSON
/// with what each answered (`provision`, `assign`, `network`). Failures
/// are added to the report's errors.
pub fn chain_reconciled<H: HttpClient + ?Sized>(
    to: &Chained<'_, H>,
    report: &mut reconcile::ReconcileReport,
) -> Value {
    // VRF-backed pools are the provision step's: drive each one (Metal's
    // asynchrony means an event alone may not finish them).
    let pools: Vec<(String, Call)> = std::mem::take(&mut report.vrf_pools)
        .into_iter()
        .map(|id| {
            (
                id.display(),
                Call::new(Component::Provision, Route::VrfPool(id)),
            )
        })
        .collect();
    let provisioned = forward_each(to, ("pool", "pool"), pools, 500, &mut report.errors);
    // Claims in VRF-backed pools: their Metal assignments are the assign
    // step's.
    let claims = std::mem::take(&mut report.metal_claims)
        .into_iter()
        .map(|(ns, name)| {
            let object = format!("{ns}/{name}");
            (
                object,
                Call::new(Component::Assign, Route::MetalClaim { ns, name }),
            )
        })
        .collect();
    let what = ("claim", "IPAddressClaim");
    let assigned = forward_each(to, what, claims, 500, &mut report.errors);
    // Opted-in Machines: the network step converges each (without it a
    // lost Machine event, or a profile edit, would never reach them). Any
    // error is the machine's to report: a network that does not converge
    // (a missing profile, a frozen device, a VLAN not there) is one.
    let machines = std::mem::take(&mut report.machines)
        .into_iter()
        .map(|(ns, name)| {
            let object = format!("{ns}/{name}");
            (
                object,
                Call::new(Component::Network, Route::Machine { ns, name }),
            )
        })
        .collect();
    let what = ("machine", "Machine");
    let network = forward_each(to, what, machines, 400, &mut report.errors);
    let mut body = report.to_json();
    if !provisioned.is_empty() {
        body["provision"] = Value::Array(provisioned);
    }
    if !assigned.is_empty() {
        body["assign"] = Value::Array(assigned);
    }
    body["network"] = Value::Array(network);
    body
}

/// Forwards each `(object, call)`; returns one `{<key>: object, "status",
/// "result"}` per request and adds the failures (a status from
/// `failed_from` on, unreachable) to `errors` as
/// `<kind> <object> (<component>): …`.
fn forward_each<H: HttpClient + ?Sized>(
    to: &Chained<'_, H>,
    (key, kind): (&str, &str),
    requests: Vec<(String, Call)>,
    failed_from: u16,
    errors: &mut Vec<String>,
) -> Vec<Value> {
    let mut out = Vec::new();
    for (object, call) in requests {
        let component = call.component.name();
        match forward(to, &call) {
            Ok((status, body, _)) => {
                if status >= failed_from {
                    errors.push(format!(
                        "{kind} {object} ({component}): {status} {}",
                        body["message"].as_str().unwrap_or("")
                    ));
                }
                let mut entry = json!({"status": status, "result": body["result"]});
                if let Some(reason) = body.get("reason") {
                    entry["reason"] = reason.clone();
                }
                entry[key] = object.into();
                out.push(entry);
            }
            Err(e) => errors.push(format!("{kind} {object} ({component}): {e}")),
        }
    }
    out
}

/// Sends one chained request (`POST`, with the API token, within
/// [`Deadline::CHAINED`]) and returns its status, its body and what
/// chaining reads of it.
///
/// # Errors
/// 503 `StepUnavailable` when the component cannot be reached.
pub fn forward<H: HttpClient + ?Sized>(
    to: &Chained<'_, H>,
    call: &Call,
) -> Result<(u16, Value, Answer)> {
    let component = call.component.name();
    let mut request = http::Request::builder()
        .method("POST")
        .uri(call.url())
        .header(headers::AUTHORIZATION, format!("Bearer {}", to.api_token))
        .body(Vec::new())
        .map_err(|e| Error::internal(e.to_string()))?;
    Deadline::CHAINED.set(&mut request);
    let resp = to.http.send(request).map_err(|e| {
        Error::transient(
            "StepUnavailable",
            format!("{component} could not be reached"),
        )
        .with_detail(e.to_string())
    })?;
    let body: Value = serde_json::from_slice(resp.body()).unwrap_or(Value::Null);
    let answer = Answer::parse(resp.body());
    Ok((resp.status().as_u16(), body, answer))
}
