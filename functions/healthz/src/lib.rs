//! `GET /healthz`: answers `200 {"status":"ok"}` without touching any store.
//!
//! The only unauthenticated route. It deliberately does no key-value or
//! outbound work, so a probe never adds load to the shared store and never
//! reports a store outage as a dead pod (readiness of the store is visible
//! through the authenticated routes' 503 answers instead). It takes the
//! request as a stream and never reads its body, so a large body costs it
//! nothing.

use spin_sdk::http::{Fields, IncomingRequest, Method, OutgoingResponse, ResponseOutparam};
use spin_sdk::http_component;

/// Answers from the method alone; the request body is never read.
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    let (status, body) = match req.method() {
        Method::Get | Method::Head => (200, r#"{"status":"ok"}"#),
        _ => (
            405,
            r#"{"reason":"MethodNotAllowed","message":"/healthz accepts GET and HEAD"}"#,
        ),
    };
    drop(req);
    let headers = [("content-type".to_string(), b"application/json".to_vec())];
    let resp = OutgoingResponse::new(Fields::from_list(&headers).unwrap_or_else(|_| Fields::new()));
    let _ = resp.set_status_code(status);
    let _ = out.set_with_body(resp, body.as_bytes().to_vec()).await;
}
