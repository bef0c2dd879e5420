//! The HTTP side: accept loop, authentication, fault injection, recording,
//! and routing of Kubernetes API paths to the store.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::error::ApiError;
use super::patch::{json_patch, merge_patch, JsonPatchError};
use super::store::{
    meta_str, resource_types, DeleteOptions, ListQuery, ResourceType, State, Write,
};
use super::{DeleteOutcome, Recorded};

/// What the server tasks and the [`FakeKube`](super::FakeKube) handle share.
pub(crate) struct Shared {
    pub state: Mutex<State>,
    pub token: String,
}

impl Shared {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Accepts connections until the task is aborted; aborting it drops the
/// connection tasks with it.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let shared = Arc::clone(&shared);
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
                    });
                    // A client that hangs up mid-request is no error of ours.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

fn json_response(code: u16, body: &Value, retry_after: Option<u64>) -> Response<Full<Bytes>> {
    let mut builder = Response::builder()
        .status(code)
        .header(CONTENT_TYPE, "application/json");
    if let Some(seconds) = retry_after {
        builder = builder.header(RETRY_AFTER, seconds.to_string());
    }
    builder
        .body(Full::new(Bytes::from(
            serde_json::to_vec(body).expect("JSON values serialise"),
        )))
        .expect("a valid response")
}

fn error_response(error: &ApiError) -> Response<Full<Bytes>> {
    json_response(error.code, &error.status(), error.retry_after())
}

/// A write that does not ask for `fieldValidation=Strict`, described.
/// FakeKube always refuses unknown fields; a real API server does so only
/// when asked, and otherwise drops them with nothing but a `Warning`
/// header. So that a client passing here cannot lose fields on a real
/// server, every write must ask (found against kube-apiserver v1.36.2).
fn lax_write(method: &str, path: &str, query: Option<&str>) -> Option<String> {
    if !matches!(method, "POST" | "PUT" | "PATCH") {
        return None;
    }
    let strict = parse_query(query.unwrap_or(""))
        .iter()
        .any(|(k, v)| k == "fieldValidation" && v == "Strict");
    (!strict).then(|| {
        format!(
            "{method} {path}: sent without fieldValidation=Strict (a real API server would drop unknown fields silently)"
        )
    })
}

/// One request, as routing needs it.
struct Req<'a> {
    method: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    content_type: Option<&'a str>,
    body: &'a [u8],
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header(CONTENT_TYPE);
    if header(AUTHORIZATION) != Some(format!("Bearer {}", shared.token)) {
        return error_response(&ApiError::unauthorized());
    }
    let bytes = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return error_response(&ApiError::bad_request(format!("reading the body: {e}"))),
    };
    let body = (!bytes.is_empty()).then(|| {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    });

    let mut state = shared.lock();
    let reply = match state.take_fault(&method, &path, false) {
        Some(code) => Err(ApiError::injected(code, &path)),
        None => {
            let request = Req {
                method: &method,
                path: &path,
                query: query.as_deref(),
                content_type: content_type.as_deref(),
                body: &bytes,
            };
            let reply = route(&mut state, &request);
            if let Some(v) = lax_write(&method, &path, query.as_deref()) {
                state.lax_writes.push(v);
            }
            if let Err(e) = &reply {
                if e.violation {
                    state
                        .violations
                        .push(format!("{method} {path}: {}", e.message));
                }
            }
            match state.take_fault(&method, &path, true) {
                Some(code) => Err(ApiError::injected(code, &path)),
                None => reply,
            }
        }
    };
    let status = match &reply {
        Ok((code, _)) => *code,
        Err(e) => e.code,
    };
    state.requests.push(Recorded {
        method,
        path,
        query,
        content_type,
        body,
        status,
    });
    drop(state);
    match reply {
        Ok((code, value)) => json_response(code, &value, None),
        Err(e) => error_response(&e),
    }
}

// ---------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------

/// What a path names.
struct Target {
    rt: &'static ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_path(path: &str) -> Result<Target, ApiError> {
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(ApiError::no_route());
    }
    let ["apis", group, version, rest @ ..] = segments.as_slice() else {
        return Err(ApiError::no_route());
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some((*name).to_owned()), false),
        [plural, name, "status"] => (*plural, Some((*name).to_owned()), true),
        _ => return Err(ApiError::no_route()),
    };
    let rt = resource_types()
        .iter()
        .find(|rt| rt.group == *group && rt.version == *version && rt.plural == plural)
        .ok_or_else(ApiError::no_route)?;
    let misplaced = if rt.namespaced {
        namespace.is_none() && name.is_some()
    } else {
        namespace.is_some()
    };
    if misplaced || (status && !rt.status) {
        return Err(ApiError::no_route());
    }
    Ok(Target {
        rt,
        namespace,
        name,
        status,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(u8::try_from(h * 16 + l).expect("two hex digits"));
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// The media type without parameters, lower-cased.
fn media_type(content_type: Option<&str>) -> Option<String> {
    content_type.map(|ct| {
        ct.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    })
}

fn json_body(req: &Req<'_>) -> Result<Value, ApiError> {
    match media_type(req.content_type).as_deref() {
        None | Some("application/json") => {}
        Some(other) => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format ({other}); FakeKube accepts application/json"
            )))
        }
    }
    serde_json::from_slice(req.body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })
}

fn route(state: &mut State, req: &Req<'_>) -> Result<(u16, Value), ApiError> {
    let params = parse_query(req.query.unwrap_or(""));
    let param = |name: &str| query_param(&params, name);
    if param("dryRun").is_some() {
        return Err(ApiError::bad_request("dryRun is not emulated by FakeKube"));
    }
    if matches!(param("watch"), Some("true" | "1")) {
        return Err(ApiError::bad_request("watch is not emulated by FakeKube"));
    }
    let target = parse_path(req.path)?;
    let rt = target.rt;
    let ns = target.namespace.as_deref();
    match (req.method, target.name.as_deref()) {
        ("GET", None) => {
            let limit = match param("limit") {
                None | Some("") => None,
                Some(l) => Some(l.parse::<usize>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "limit must be a non-negative integer, got {l:?}"
                    ))
                })?),
            };
            let query = ListQuery {
                limit,
                continue_token: param("continue")
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned),
                label_selector: param("labelSelector").map(str::to_owned),
                field_selector: param("fieldSelector").map(str::to_owned),
            };
            state.list(rt, ns, &query).map(|list| (200, list))
        }
        ("POST", None) if !rt.namespaced || ns.is_some() => {
            let obj = json_body(req)?;
            state.create(rt, ns, obj).map(|obj| (201, obj))
        }
        ("GET", Some(name)) => state.get_or_404(rt, ns, name).map(|obj| (200, obj)),
        ("PUT", Some(name)) => {
            let obj = json_body(req)?;
            let write = if target.status {
                Write::Status
            } else {
                Write::Main
            };
            state.update(rt, ns, name, obj, write).map(|obj| (200, obj))
        }
        ("PATCH", Some(name)) => patch(state, rt, ns, name, target.status, req),
        ("DELETE", Some(name)) if !target.status => delete(state, rt, ns, name, req, &params),
        (method, _) => Err(ApiError::method_not_allowed(method)),
    }
}

fn patch(
    state: &mut State,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    status: bool,
    req: &Req<'_>,
) -> Result<(u16, Value), ApiError> {
    enum Kind {
        Merge,
        Json,
    }
    let kind = match media_type(req.content_type).as_deref() {
        Some("application/merge-patch+json") => Kind::Merge,
        Some("application/json-patch+json") => Kind::Json,
        Some("application/strategic-merge-patch+json") => {
            return Err(ApiError::unsupported_media_type(
                "strategic merge patch is not supported for custom resources; \
                 accepted media types include: application/json-patch+json, application/merge-patch+json",
            ))
        }
        Some(apply) if apply.starts_with("application/apply-patch") => {
            return Err(ApiError::unsupported_media_type(
                "server-side apply is not emulated by FakeKube",
            ))
        }
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format ({}) - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json",
                other.unwrap_or("no Content-Type")
            )))
        }
    };
    let patch: Value = serde_json::from_slice(req.body).map_err(|e| {
        ApiError::bad_request(format!("the patch could not be decoded as JSON: {e}"))
    })?;
    let existing = state.get_or_404(rt, ns, name)?;
    let patched = match kind {
        Kind::Merge => {
            let mut doc = existing;
            merge_patch(&mut doc, &patch);
            doc
        }
        Kind::Json => json_patch(&existing, &patch).map_err(|e| match e {
            JsonPatchError::Malformed(m) => ApiError::bad_request(m),
            JsonPatchError::Failed(m) => ApiError::patch_failed(m),
        })?,
    };
    let write = if status { Write::Status } else { Write::Main };
    state
        .update(rt, ns, name, patched, write)
        .map(|obj| (200, obj))
}

fn delete(
    state: &mut State,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    req: &Req<'_>,
    params: &[(String, String)],
) -> Result<(u16, Value), ApiError> {
    let mut options = DeleteOptions::default();
    let mut policy = query_param(params, "propagationPolicy").map(str::to_owned);
    if !req.body.is_empty() {
        let body: Value = serde_json::from_slice(req.body).map_err(|e| {
            ApiError::bad_request(format!("DeleteOptions could not be decoded as JSON: {e}"))
        })?;
        let pre = body.get("preconditions");
        let field = |f: &str| {
            pre.and_then(|p| p.get(f))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        options.uid = field("uid");
        options.resource_version = field("resourceVersion");
        if let Some(p) = body.get("propagationPolicy").and_then(Value::as_str) {
            policy = Some(p.to_owned());
        }
        if body
            .get("dryRun")
            .is_some_and(|d| d.as_array().is_some_and(|a| !a.is_empty()))
        {
            return Err(ApiError::bad_request("dryRun is not emulated by FakeKube"));
        }
    }
    match policy.as_deref() {
        None | Some("Background") => {}
        Some("Orphan") => options.orphan = true,
        Some("Foreground") => {
            return Err(ApiError::bad_request(
                "propagationPolicy Foreground is not emulated by FakeKube",
            ))
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unsupported propagationPolicy {other:?}: use Background, Orphan or Foreground"
            )))
        }
    }
    match state.delete(rt, ns, name, &options)? {
        DeleteOutcome::Finalizing(obj) => Ok((200, obj)),
        DeleteOutcome::Removed(obj) => Ok((
            200,
            json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {
                    "name": name,
                    "group": rt.group,
                    "kind": rt.plural,
                    "uid": meta_str(&obj, "uid"),
                },
            }),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        assert_eq!(
            parse_query("labelSelector=cluster.x-k8s.io%2Fcluster-name%3Dweb&limit=2&x"),
            [
                (
                    "labelSelector".to_owned(),
                    "cluster.x-k8s.io/cluster-name=web".to_owned()
                ),
                ("limit".to_owned(), "2".to_owned()),
                ("x".to_owned(), String::new()),
            ]
        );
        assert_eq!(percent_decode("a+b%2"), "a b%2");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }

    #[test]
    fn paths_route_by_scope() {
        let ok =
            |p: &str| parse_path(p).map(|t| (t.rt.plural.clone(), t.namespace, t.name, t.status));
        assert_eq!(
            ok("/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/default/ipaddressclaims/c/status")
                .unwrap(),
            (
                "ipaddressclaims".into(),
                Some("default".into()),
                Some("c".into()),
                true
            )
        );
        assert_eq!(
            ok("/apis/ipam.cluster.x-k8s.io/v1beta2/ipaddresses").unwrap(),
            ("ipaddresses".into(), None, None, false)
        );
        assert_eq!(
            ok("/apis/ipam.metal-ipam.dev/v1alpha1/globalmetalippools/g").unwrap(),
            ("globalmetalippools".into(), None, Some("g".into()), false)
        );
        for missing in [
            "/apis/ipam.cluster.x-k8s.io/v1beta1/namespaces/default/ipaddressclaims",
            "/apis/ipam.cluster.x-k8s.io/v1beta2/ipaddressclaims/c",
            "/apis/ipam.metal-ipam.dev/v1alpha1/namespaces/d/globalmetalippools",
            "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/d/ipaddresses/a/status",
            "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/d/ipaddresses/",
            "/api/v1/namespaces",
        ] {
            assert_eq!(ok(missing).unwrap_err().code, 404, "{missing}");
        }
    }
}
