//! The HTTP side: accept loop, authentication, route lookup in the spec,
//! fault injection, request checking, dispatch to the state, answer
//! checking and recording.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::spec::{parse_query, spec, Lookup, Operation, BASE_PATH};
use super::state::{ApiError, Call, Inc, State};
use super::{Fault, Recorded};

/// An injected fault waiting for matching requests.
#[derive(Debug, Clone)]
pub(crate) struct FaultRule {
    pub method: String,
    pub route: String,
    pub fault: Fault,
    pub remaining: usize,
}

impl FaultRule {
    fn matches(&self, method: &str, rel_path: &str, op: &Operation) -> bool {
        let method_ok = self.method == "*" || self.method.eq_ignore_ascii_case(method);
        let r = self.route.as_str();
        let route_ok = r == "*"
            || r == op.id
            || r == op.template
            || r == rel_path
            || r.strip_prefix(BASE_PATH) == Some(rel_path)
            || r.strip_prefix(BASE_PATH) == Some(op.template.as_str());
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
    fn take_fault(&mut self, method: &str, rel_path: &str, op: &Operation) -> Option<Fault> {
        let i = self
            .faults
            .iter()
            .position(|f| f.matches(method, rel_path, op))?;
        let rule = &mut self.faults[i];
        rule.remaining -= 1;
        let fault = rule.fault.clone();
        if rule.remaining == 0 {
            self.faults.remove(i);
        }
        Some(fault)
    }
}

/// What the server tasks and the [`MetalSim`](super::MetalSim) handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub inner: Mutex<Inner>,
    pub token: String,
}

impl Shared {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The service's way to close a connection without answering (the
/// simulators' dropped-answer faults).
#[derive(Debug)]
pub(crate) struct HangUp;

impl std::fmt::Display for HangUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the simulator hung up (injected fault)")
    }
}

impl std::error::Error for HangUp {}

/// Accepts connections until the task is aborted; aborting it drops the
/// connection tasks with it.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    serve_connections(listener, move |req| {
        let shared = Arc::clone(&shared);
        async move { handle(&shared, req).await }
    })
    .await;
}

/// Serves HTTP/1 on `listener`, each request answered by `handle` (a
/// [`HangUp`] closes the connection unanswered), until the task is aborted;
/// aborting it drops the connection tasks with it. Shared by the Metal and
/// phoenixNAP simulators.
pub(crate) async fn serve_connections<F, Fut>(listener: TcpListener, handle: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, HangUp>> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let handle = handle.clone();
                connections.spawn(async move {
                    // A hang-up (ours or the client's) ends the connection;
                    // neither is an error of the server.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service_fn(handle))
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

fn respond(
    status: u16,
    body: Option<&Value>,
    request_id: &str,
    retry_after: Option<u64>,
) -> Response<Full<Bytes>> {
    let mut b = Response::builder()
        .status(status)
        .header("x-request-id", request_id);
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

/// Media type without parameters, lower case.
fn media_type(content_type: Option<&str>) -> Option<String> {
    content_type.map(|ct| {
        ct.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    })
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
    let token = header("x-auth-token");
    let content_type = header("content-type");
    let bytes = match req.into_body().collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return Err(HangUp),
    };
    let request_id = shared.lock().state.ids.uuid();
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
    let finish = |mut rec: Recorded, status: Option<u16>| {
        rec.status = status;
        shared.lock().requests.push(rec);
    };

    if token.as_deref() != Some(shared.token.as_str()) {
        finish(rec, Some(401));
        let body = json!({ "error": "Invalid authentication token" });
        return Ok(respond(401, Some(&body), &request_id, None));
    }

    let spec = spec();
    let rel = path
        .strip_prefix(BASE_PATH)
        .filter(|r| r.starts_with('/'))
        .unwrap_or("");
    let (op, path_params) = match spec.lookup(&method, rel) {
        Lookup::Found(op, params) => (op, params),
        miss => {
            let problem = match (rel.is_empty(), miss) {
                (true, _) => format!("{path} is not under {BASE_PATH}"),
                (false, Lookup::NoMethod) => format!("the spec has no {method} on {rel}"),
                _ => format!("the spec has no path matching {rel}"),
            };
            let mut inner = shared.lock();
            inner.violations.push(format!("{method} {path}: {problem}"));
            drop(inner);
            finish(rec, Some(404));
            let body = json!({ "error": problem });
            return Ok(respond(404, Some(&body), &request_id, None));
        }
    };
    rec.operation = Some(op.id.clone());

    let fault = {
        let mut inner = shared.lock();
        inner.counts.entry(op.id.clone()).or_default().received += 1;
        inner.take_fault(&method, rel, op)
    };
    rec.fault.clone_from(&fault);
    let mut crash = false;
    match fault {
        Some(Fault::RateLimit { retry_after_s }) => {
            finish(rec, Some(429));
            let body = json!({ "error": "Too Many Requests" });
            return Ok(respond(429, Some(&body), &request_id, Some(retry_after_s)));
        }
        Some(Fault::Status(code)) => {
            finish(rec, Some(code));
            let body = json!({ "error": format!("injected fault: {code}") });
            return Ok(respond(code, Some(&body), &request_id, None));
        }
        Some(Fault::Latency(ms)) => tokio::time::sleep(Duration::from_millis(ms)).await,
        Some(Fault::Drop) => {
            finish(rec, None);
            return Err(HangUp);
        }
        Some(Fault::CrashAfter) => crash = true,
        None => {}
    }

    // The request against the spec (validators compile outside the lock).
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
        (422, Some(json!({ "errors": problems })))
    } else if !State::emulates(&op.id) {
        let e = ApiError::new(
            501,
            format!(
                "{} {} ({}) is in the spec but not emulated by the Metal simulator",
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
            inc: Inc::from_query(&pairs),
            default_per_page: op
                .query_default("per_page")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok()),
            rel_path: rel,
        };
        let mut inner = shared.lock();
        let result = inner.state.dispatch(&call);
        match result {
            Ok((status, body)) => {
                inner.counts.entry(op.id.clone()).or_default().applied += 1;
                (status, body)
            }
            Err(e) => (e.status, Some(e.body())),
        }
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
        finish(rec, None);
        return Err(HangUp);
    }
    finish(rec, Some(status));
    Ok(respond(status, answer.as_ref(), &request_id, None))
}
