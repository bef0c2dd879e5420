//! The HTTP side: accept loop, the token endpoint, bearer authentication,
//! the API a path belongs to and its operation in that API's spec, fault
//! injection, request checking, dispatch to the state, answer checking,
//! the audit log and recording.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::spec::{Api, TOKEN_PATH};
use super::state::{ApiError, Call, State};
use super::{Fault, Recorded};
use crate::metal_sim::server::{serve_connections, HangUp};
use crate::metal_sim::spec::{parse_query, Lookup, Operation};

/// The route name of the token endpoint in fault rules and counts.
pub const TOKEN_ROUTE: &str = "token";

/// An injected fault waiting for matching requests.
#[derive(Debug, Clone)]
pub(crate) struct FaultRule {
    pub method: String,
    pub route: String,
    pub fault: Fault,
    pub remaining: usize,
}

impl FaultRule {
    fn matches(&self, method: &str, path: &str, rel: &str, op: Option<&Operation>) -> bool {
        let method_ok = self.method == "*" || self.method.eq_ignore_ascii_case(method);
        let r = self.route.as_str();
        let route_ok = r == "*"
            || r == path
            || (!rel.is_empty() && r == rel)
            || match op {
                Some(op) => r == op.id || r == op.template,
                None => r == TOKEN_ROUTE,
            };
        method_ok && route_ok
    }
}

/// Requests per operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Count {
    pub received: usize,
    pub applied: usize,
}

/// Everything behind the simulator's mutex.
#[derive(Debug)]
pub(crate) struct Inner {
    pub state: State,
    pub requests: Vec<Recorded>,
    pub violations: Vec<String>,
    pub answer_violations: Vec<String>,
    pub faults: Vec<FaultRule>,
    pub counts: BTreeMap<String, Count>,
}

impl Inner {
    fn take_fault(
        &mut self,
        method: &str,
        path: &str,
        rel: &str,
        op: Option<&Operation>,
    ) -> Option<Fault> {
        let i = self
            .faults
            .iter()
            .position(|f| f.matches(method, path, rel, op))?;
        let rule = &mut self.faults[i];
        rule.remaining -= 1;
        let fault = rule.fault.clone();
        if rule.remaining == 0 {
            self.faults.remove(i);
        }
        Some(fault)
    }
}

/// What the server tasks and the [`PnapSim`](super::PnapSim) handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub inner: Mutex<Inner>,
}

impl Shared {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Accepts connections until the task is aborted (the Metal simulator's
/// loop, [`serve_connections`]).
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    serve_connections(listener, move |req| {
        let shared = Arc::clone(&shared);
        async move { handle(&shared, req).await }
    })
    .await;
}

fn respond(status: u16, body: Option<&Value>, retry_after: Option<u64>) -> Response<Full<Bytes>> {
    let mut b = Response::builder().status(status);
    if let Some(s) = retry_after {
        b = b.header(RETRY_AFTER, s.to_string());
    }
    let bytes = match body {
        Some(v) => {
            b = b.header(CONTENT_TYPE, "application/json");
            Bytes::from(serde_json::to_vec(v).expect("JSON values serialise"))
        }
        None => Bytes::new(),
    };
    b.body(Full::new(bytes)).expect("a valid response")
}

fn media_type(content_type: Option<&str>) -> Option<String> {
    content_type.map(|ct| {
        ct.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    })
}

/// `Basic base64(urlencode(id):urlencode(secret))` → (id, secret).
fn basic_credentials(header: Option<&str>) -> Option<(String, String)> {
    let encoded = header?.strip_prefix("Basic ")?.trim();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (id, secret) = text.split_once(':')?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8()
            .ok()
            .map(|c| c.into_owned())
    };
    Some((decode(id)?, decode(secret)?))
}

/// What a fault does before the request is handled.
enum Before {
    Answer(Response<Full<Bytes>>),
    HangUp,
    Go(After),
}

/// What a fault does once the request is handled.
enum After {
    Nothing,
    HangUp,
    Status(u16),
    DeleteServer(String),
}

async fn apply_fault(shared: &Shared, fault: Option<Fault>, rec: &mut Recorded) -> Before {
    match fault {
        Some(Fault::RateLimit { retry_after_s }) => {
            rec.status = Some(429);
            let body = json!({ "message": "Too Many Requests" });
            Before::Answer(respond(429, Some(&body), Some(retry_after_s)))
        }
        Some(Fault::Status(code)) => {
            rec.status = Some(code);
            let body = json!({ "message": format!("injected fault: {code}") });
            Before::Answer(respond(code, Some(&body), None))
        }
        Some(Fault::Latency(ms)) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Before::Go(After::Nothing)
        }
        Some(Fault::Drop) => Before::HangUp,
        Some(Fault::CrashAfter) => Before::Go(After::HangUp),
        Some(Fault::StatusAfter(code)) => Before::Go(After::Status(code)),
        Some(Fault::DeleteServerBefore(id)) => {
            // A server already gone is fine: the step meets what is left.
            let _ = shared.lock().state.delete_server(&id);
            Before::Go(After::Nothing)
        }
        Some(Fault::DeleteServerAfter(id)) => Before::Go(After::DeleteServer(id)),
        None => Before::Go(After::Nothing),
    }
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, HangUp> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let authorization = header("authorization");
    let content_type = header("content-type");
    let bytes = match req.into_body().collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return Err(HangUp),
    };
    let mut rec = Recorded {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        operation: None,
        body: (!bytes.is_empty()).then(|| {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        }),
        status: None,
        fault: None,
    };
    let finish = |rec: Recorded| shared.lock().requests.push(rec);

    if path == TOKEN_PATH {
        return token(
            shared,
            &method,
            authorization.as_deref(),
            content_type.as_deref(),
            &bytes,
            rec,
        )
        .await;
    }

    // Bearer authentication first, as the API gateway would.
    let bearer = authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::trim);
    let authorized = bearer.is_some_and(|t| shared.lock().state.token_valid(t));
    if !authorized {
        rec.status = Some(401);
        finish(rec);
        let body = json!({ "message": "Unauthorized: a valid bearer token is required" });
        return Ok(respond(401, Some(&body), None));
    }

    let Some((api, rel)) = Api::of_path(&path) else {
        let problem = format!("{path} is not under /bmc/v1, /networks/v1, /ips/v1 or /audit/v1");
        shared
            .lock()
            .violations
            .push(format!("{method} {path}: {problem}"));
        rec.status = Some(404);
        finish(rec);
        return Ok(respond(404, Some(&json!({ "message": problem })), None));
    };
    let spec = api.spec();
    let (op, path_params) = match spec.lookup(&method, rel) {
        Lookup::Found(op, params) => (op, params),
        miss => {
            let problem = match miss {
                Lookup::NoMethod => format!("the spec has no {method} on {rel}"),
                _ => format!("the spec has no path matching {rel}"),
            };
            shared
                .lock()
                .violations
                .push(format!("{method} {path}: {problem}"));
            rec.status = Some(404);
            finish(rec);
            return Ok(respond(404, Some(&json!({ "message": problem })), None));
        }
    };
    rec.operation = Some(op.id.clone());

    let fault = {
        let mut inner = shared.lock();
        inner.counts.entry(op.id.clone()).or_default().received += 1;
        inner.take_fault(&method, &path, rel, Some(op))
    };
    rec.fault.clone_from(&fault);
    let after = match apply_fault(shared, fault, &mut rec).await {
        Before::Answer(resp) => {
            finish(rec);
            return Ok(resp);
        }
        Before::HangUp => {
            finish(rec);
            return Err(HangUp);
        }
        Before::Go(after) => after,
    };

    // The request against the spec.
    let pairs = parse_query(query.as_deref().unwrap_or(""));
    let mut problems = op.check_params(spec, &path_params, &pairs);
    let body: Option<Value> = if bytes.is_empty() {
        if op.body_required() {
            problems.push(format!(
                "{} {} requires a JSON request body",
                op.method, op.template
            ));
        }
        None
    } else {
        match media_type(content_type.as_deref()).as_deref() {
            Some("application/json") => {}
            other => problems.push(format!(
                "a request body must be application/json, got {}",
                other.unwrap_or("no Content-Type")
            )),
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => {
                problems.extend(op.check_body(spec, &v));
                Some(v)
            }
            Err(e) => {
                problems.push(format!("the request body is not JSON: {e}"));
                None
            }
        }
    };

    let (status, answer) = if !problems.is_empty() {
        shared
            .lock()
            .violations
            .push(format!("{method} {path}: {}", problems.join("; ")));
        let e = ApiError {
            status: 400,
            message: "The request does not match the API specification".into(),
            validation: problems,
        };
        (e.status, Some(e.body()))
    } else if !State::emulates(api, &op.id) {
        let e = ApiError::new(
            501,
            format!(
                "{} {} ({}) is in the spec but not emulated by the phoenixNAP simulator",
                op.method, op.template, op.id
            ),
        );
        (e.status, Some(e.body()))
    } else {
        let call = Call {
            op: &op.id,
            path: &path_params,
            query: &pairs,
            body: body.as_ref(),
        };
        let mut inner = shared.lock();
        match inner.state.dispatch(&call) {
            Ok((status, body)) => {
                inner.counts.entry(op.id.clone()).or_default().applied += 1;
                if method != "GET" {
                    inner.state.record_event(&op.id, &method, &path);
                }
                (status, body)
            }
            Err(e) => (e.status, Some(e.body())),
        }
    };
    let crash = matches!(after, After::HangUp);
    let (status, answer) = match after {
        After::DeleteServer(id) => {
            let _ = shared.lock().state.delete_server(&id);
            (status, answer)
        }
        After::Status(code) => {
            let body = json!({ "message": format!("injected fault after the write: {code}") });
            (code, Some(body))
        }
        After::Nothing | After::HangUp => (status, answer),
    };

    let answer_problems = op.check_response(spec, status, answer.as_ref());
    if !answer_problems.is_empty() {
        let mut inner = shared.lock();
        for p in answer_problems {
            inner
                .answer_violations
                .push(format!("{method} {path} -> {status}: {p}"));
        }
    }
    if crash {
        finish(rec);
        return Err(HangUp);
    }
    rec.status = Some(status);
    finish(rec);
    Ok(respond(status, answer.as_ref(), None))
}

/// The OAuth 2.0 token endpoint (client credentials).
async fn token(
    shared: &Shared,
    method: &str,
    authorization: Option<&str>,
    content_type: Option<&str>,
    bytes: &[u8],
    mut rec: Recorded,
) -> Result<Response<Full<Bytes>>, HangUp> {
    rec.operation = Some(TOKEN_ROUTE.into());
    let fault = {
        let mut inner = shared.lock();
        inner.counts.entry(TOKEN_ROUTE.into()).or_default().received += 1;
        inner.take_fault(method, TOKEN_PATH, "", None)
    };
    rec.fault.clone_from(&fault);
    let finish = |rec: Recorded| shared.lock().requests.push(rec);
    let after = match apply_fault(shared, fault, &mut rec).await {
        Before::Answer(resp) => {
            finish(rec);
            return Ok(resp);
        }
        Before::HangUp => {
            finish(rec);
            return Err(HangUp);
        }
        Before::Go(after) => after,
    };
    let form = parse_query(&String::from_utf8_lossy(bytes));
    let mut problems = Vec::new();
    if method != "POST" {
        problems.push(format!("the token endpoint takes POST, not {method}"));
    }
    if media_type(content_type).as_deref() != Some("application/x-www-form-urlencoded") {
        problems.push(format!(
            "a token request is application/x-www-form-urlencoded, got {}",
            content_type.unwrap_or("no Content-Type")
        ));
    }
    let grant = form
        .iter()
        .find(|(k, _)| k == "grant_type")
        .map(|(_, v)| v.as_str());
    if grant != Some("client_credentials") {
        problems.push(format!(
            "grant_type must be client_credentials, got {grant:?}"
        ));
    }
    let (status, body) = if !problems.is_empty() {
        shared
            .lock()
            .violations
            .push(format!("{method} {TOKEN_PATH}: {}", problems.join("; ")));
        (
            400,
            json!({ "error": "invalid_request", "error_description": problems.join("; ") }),
        )
    } else {
        let mut inner = shared.lock();
        let ok = basic_credentials(authorization).is_some_and(|(id, secret)| {
            id == inner.state.client_id && secret == inner.state.client_secret
        });
        if ok {
            let (token, lifetime) = inner.state.issue_token();
            inner.counts.entry(TOKEN_ROUTE.into()).or_default().applied += 1;
            (
                200,
                json!({
                    "access_token": token,
                    "token_type": "Bearer",
                    "expires_in": lifetime,
                    "scope": "bmc bmc.read audit.read",
                }),
            )
        } else {
            (
                401,
                json!({ "error": "invalid_client", "error_description": "Invalid client credentials" }),
            )
        }
    };
    let (status, body) = match after {
        After::HangUp => {
            finish(rec);
            return Err(HangUp);
        }
        After::Status(code) => (
            code,
            json!({ "message": format!("injected fault: {code}") }),
        ),
        After::Nothing | After::DeleteServer(_) => (status, body),
    };
    rec.status = Some(status);
    finish(rec);
    Ok(respond(status, Some(&body), None))
}
