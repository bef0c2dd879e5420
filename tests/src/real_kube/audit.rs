//! Recording the ServiceAccount's requests through the API server's audit
//! log.
//!
//! The policy ([`POLICY`]) logs, at stages `ResponseStarted` and
//! `ResponseComplete` (`omitStages: [RequestReceived]`):
//!
//! * every request of the project's ServiceAccount at level `Request`, so
//!   the event carries the request body (`requestObject`);
//! * the fence's marker requests (the admin's `GET` of a ConfigMap in
//!   `default`), at level `Metadata`;
//! * nothing else.
//!
//! # The fence
//!
//! The API server writes a request's `ResponseComplete` event in the
//! request's own goroutine once its handler has returned, i.e. just after
//! the response has been written; the log backend in `blocking` mode writes
//! it before that goroutine finishes. Events are not written in the order
//! the requests arrived but in the order they completed. To read "every
//! request the app made until now", the reader first sends a marker request
//! of its own (the admin GETs a ConfigMap `audit-marker-<pid>-<n>` that
//! does not exist) and then reads the log until the marker's event appears,
//! taking the ServiceAccount's events before it.
//!
//! The assumption: every request of the app that the test has seen
//! answered (the app made its calls, then answered the test, and only then
//! does the test look) completes its audit write before our marker request,
//! which is sent on a new TLS connection after that, completes its own.
//! The window is the few microseconds between the API server writing a
//! response and writing its audit event, against a full round trip with a
//! TLS handshake for the marker. Requests still in flight while the fence
//! runs may or may not be included.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fake_kube::Recorded;

/// The user name of the project's ServiceAccount.
pub(crate) const SA_USERNAME: &str = "system:serviceaccount:metal-ipam-system:metal-ipam";

/// The user name of the admin token (the fence's markers come from it).
pub(crate) const ADMIN_USERNAME: &str = "admin";

/// The namespace of the marker requests (the admin never reads ConfigMaps
/// there otherwise).
pub(crate) const MARKER_NAMESPACE: &str = "default";

/// The audit policy (see the module docs).
pub(crate) const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
# The project's ServiceAccount: everything, with request bodies.
- level: Request
  users: ["system:serviceaccount:metal-ipam-system:metal-ipam"]
# The fence's markers: the admin GETs a ConfigMap that does not exist.
- level: Metadata
  users: ["admin"]
  verbs: ["get"]
  namespaces: ["default"]
  resources: [{group: "", resources: ["configmaps"]}]
- level: None
"#;

/// The path the admin GETs for marker `name`.
pub(crate) fn marker_path(name: &str) -> String {
    format!("/api/v1/namespaces/{MARKER_NAMESPACE}/configmaps/{name}")
}

/// One audit event of the ServiceAccount, as FakeKube would have recorded
/// the request, plus the response's message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SaRequest {
    pub recorded: Recorded,
    /// `responseStatus.message` (empty on success).
    pub message: String,
}

impl SaRequest {
    /// `"METHOD path: message"`.
    pub fn describe(&self) -> String {
        format!(
            "{} {}: {}",
            self.recorded.method, self.recorded.path, self.message
        )
    }
}

/// What one audit log line is, as far as recording goes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Line {
    /// A completed request of the ServiceAccount.
    Sa(SaRequest),
    /// The marker GET of the ConfigMap with this name.
    Marker(String),
    /// Anything else (another stage, another user).
    Other,
}

/// The HTTP method of an audit `verb` (`get`/`list`/`watch` → GET,
/// `create` → POST, `update` → PUT, `patch` → PATCH, `delete` and
/// `deletecollection` → DELETE; a non-resource request's verb is its
/// lower-cased method, so anything else is upper-cased).
pub(crate) fn method_of_verb(verb: &str) -> String {
    match verb {
        "get" | "list" | "watch" => "GET".to_owned(),
        "create" => "POST".to_owned(),
        "update" => "PUT".to_owned(),
        "patch" => "PATCH".to_owned(),
        "delete" | "deletecollection" => "DELETE".to_owned(),
        other => other.to_ascii_uppercase(),
    }
}

/// Classifies one line of the audit log (a JSON `audit.k8s.io/v1` Event).
///
/// Only `ResponseComplete` (and `Panic`, answered 500) events count: a
/// long-running request (a watch) also logs `ResponseStarted` when it
/// begins, and is recorded once it ends.
pub(crate) fn parse_line(line: &str) -> Line {
    let Ok(event) = serde_json::from_str::<Value>(line) else {
        return Line::Other;
    };
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let stage = text(&event, "stage");
    if stage != "ResponseComplete" && stage != "Panic" {
        return Line::Other;
    }
    let user = event
        .pointer("/user/username")
        .and_then(Value::as_str)
        .unwrap_or("");
    let uri = text(&event, "requestURI");
    let verb = text(&event, "verb");
    if user == ADMIN_USERNAME && verb == "get" {
        if let Some(name) = event.pointer("/objectRef/name").and_then(Value::as_str) {
            if uri == marker_path(name) || uri.starts_with(&format!("{}?", marker_path(name))) {
                return Line::Marker(name.to_owned());
            }
        }
        return Line::Other;
    }
    if user != SA_USERNAME {
        return Line::Other;
    }
    let (path, query) = match uri.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (uri.clone(), None),
    };
    let response = event.get("responseStatus").cloned().unwrap_or(Value::Null);
    let status = match response.get("code").and_then(Value::as_u64) {
        Some(code) => u16::try_from(code).unwrap_or(0),
        None if stage == "Panic" => 500,
        None => 0,
    };
    Line::Sa(SaRequest {
        recorded: Recorded {
            method: method_of_verb(&verb),
            path,
            query,
            content_type: None,
            body: event.get("requestObject").cloned(),
            status,
        },
        message: text(&response, "message"),
    })
}

/// Reads `log` from byte `from` until the line of marker `name`, waiting up
/// to `deadline` for it to be written. Returns the ServiceAccount's
/// requests before the marker and the offset just past the marker's line.
pub(crate) fn read_until_marker(
    log: &Path,
    from: u64,
    name: &str,
    deadline: Duration,
) -> Result<(Vec<SaRequest>, u64), String> {
    let started = Instant::now();
    let mut requests = Vec::new();
    // Complete lines consumed so far end at `offset`.
    let mut offset = from;
    loop {
        let mut file =
            File::open(log).map_err(|e| format!("opening the audit log {}: {e}", log.display()))?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| format!("seeking in {}: {e}", log.display()))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| format!("reading {}: {e}", log.display()))?;
        let mut start = 0;
        while let Some(nl) = bytes[start..].iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&bytes[start..start + nl]);
            start += nl + 1;
            match parse_line(&line) {
                Line::Marker(m) if m == name => {
                    return Ok((requests, offset + start as u64));
                }
                Line::Sa(r) => requests.push(r),
                Line::Marker(_) | Line::Other => {}
            }
        }
        offset += start as u64;
        if started.elapsed() > deadline {
            return Err(format!(
                "the audit event of marker {name} did not appear in {} within {deadline:?}",
                log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(user: &str, verb: &str, uri: &str, code: u16, extra: Value) -> String {
        let mut e = json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Request",
            "auditID": "3f990ff5-0384-4fca-96d6-996868ca86a7",
            "stage": "ResponseComplete", "requestURI": uri, "verb": verb,
            "user": {"username": user, "groups": ["system:authenticated"]},
            "sourceIPs": ["127.0.0.1"],
            "responseStatus": {"metadata": {}, "code": code},
        });
        if let (Some(e), Value::Object(extra)) = (e.as_object_mut(), extra) {
            e.extend(extra);
        }
        e.to_string()
    }

    #[test]
    fn a_merge_patch_maps_to_patch_with_path_query_body_and_status() {
        let line = event(
            SA_USERNAME,
            "patch",
            "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/default/ipaddressclaims/web-0/status?fieldManager=x",
            200,
            json!({"requestObject": {"status": {"addressRef": {"name": "web-0"}}}}),
        );
        let Line::Sa(r) = parse_line(&line) else {
            panic!("not an SA request: {line}");
        };
        assert_eq!(
            r.recorded,
            Recorded {
                method: "PATCH".into(),
                path: "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/default/ipaddressclaims/web-0/status".into(),
                query: Some("fieldManager=x".into()),
                content_type: None,
                body: Some(json!({"status": {"addressRef": {"name": "web-0"}}})),
                status: 200,
            }
        );
        assert_eq!(r.message, "");
    }

    #[test]
    fn verbs_map_to_methods() {
        for (verb, method) in [
            ("get", "GET"),
            ("list", "GET"),
            ("watch", "GET"),
            ("create", "POST"),
            ("update", "PUT"),
            ("patch", "PATCH"),
            ("delete", "DELETE"),
            ("deletecollection", "DELETE"),
            ("head", "HEAD"),
        ] {
            assert_eq!(method_of_verb(verb), method, "{verb}");
        }
    }

    #[test]
    fn a_refused_write_keeps_the_status_message_and_has_no_body() {
        let line = event(
            SA_USERNAME,
            "create",
            "/api/v1/namespaces/default/secrets",
            403,
            json!({"responseStatus": {"code": 403, "status": "Failure", "reason": "Forbidden",
                   "message": "secrets is forbidden: User \"x\" cannot create resource"}}),
        );
        let Line::Sa(r) = parse_line(&line) else {
            panic!("not an SA request");
        };
        assert_eq!(r.recorded.method, "POST");
        assert_eq!(r.recorded.query, None);
        assert_eq!(r.recorded.body, None);
        assert_eq!(r.recorded.status, 403);
        assert!(r.recorded.is_write());
        assert_eq!(
            r.describe(),
            "POST /api/v1/namespaces/default/secrets: secrets is forbidden: User \"x\" cannot create resource"
        );
    }

    #[test]
    fn markers_other_users_and_other_stages_are_told_apart() {
        let marker = event(
            ADMIN_USERNAME,
            "get",
            "/api/v1/namespaces/default/configmaps/audit-marker-1-7",
            404,
            json!({"objectRef": {"resource": "configmaps", "namespace": "default",
                                 "name": "audit-marker-1-7", "apiVersion": "v1"}}),
        );
        assert_eq!(parse_line(&marker), Line::Marker("audit-marker-1-7".into()));
        let admin_list = event(
            ADMIN_USERNAME,
            "list",
            "/api/v1/namespaces/default/configmaps",
            200,
            json!({}),
        );
        assert_eq!(parse_line(&admin_list), Line::Other);
        let other = event(
            "system:kube-scheduler",
            "get",
            "/api/v1/nodes",
            200,
            json!({}),
        );
        assert_eq!(parse_line(&other), Line::Other);
        let started = event(
            SA_USERNAME,
            "watch",
            "/api/v1/pods?watch=true",
            200,
            json!({"stage": "ResponseStarted"}),
        );
        assert_eq!(parse_line(&started), Line::Other);
        assert_eq!(parse_line("not json"), Line::Other);
    }

    #[test]
    fn reading_stops_at_the_marker_and_resumes_after_it() {
        let dir = std::env::temp_dir().join(format!("real-kube-audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("audit.log");
        let marker = |n: &str| {
            event(
                ADMIN_USERNAME,
                "get",
                &marker_path(n),
                404,
                json!({"objectRef": {"resource": "configmaps", "namespace": "default", "name": n}}),
            )
        };
        let get = |name: &str| {
            event(
                SA_USERNAME,
                "get",
                &format!("/apis/cluster.x-k8s.io/v1beta2/namespaces/default/clusters/{name}"),
                404,
                json!({}),
            )
        };
        let text = [get("a"), marker("m1"), get("b"), get("c"), marker("m2")].join("\n") + "\n";
        std::fs::write(&log, text).unwrap();

        let (first, after_m1) = read_until_marker(&log, 0, "m1", Duration::from_secs(1)).unwrap();
        assert_eq!(first.len(), 1);
        assert!(first[0].recorded.path.ends_with("/clusters/a"));
        let (second, end) =
            read_until_marker(&log, after_m1, "m2", Duration::from_secs(1)).unwrap();
        let paths: Vec<_> = second
            .iter()
            .map(|r| r.recorded.path.rsplit('/').next().unwrap().to_owned())
            .collect();
        assert_eq!(paths, ["b", "c"]);
        assert_eq!(end, std::fs::metadata(&log).unwrap().len());
        // A marker that never comes: bounded.
        let err = read_until_marker(&log, end, "m3", Duration::from_millis(50)).unwrap_err();
        assert!(err.contains("m3"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
