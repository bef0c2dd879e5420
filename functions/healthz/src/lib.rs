//! `GET /healthz`: answers `200 {"status":"ok"}` without touching any store.
//!
//! The only unauthenticated route. It deliberately does no key-value or
//! outbound work, so a probe never adds load to the shared store and never
//! reports a store outage as a dead pod (readiness of the store is visible
//! through the authenticated routes' 503 answers instead).

use spin_sdk::http::{IntoResponse, Method, Request, Response};
use spin_sdk::http_component;

#[http_component]
fn handle(req: Request) -> impl IntoResponse {
    let (status, body) = match req.method() {
        Method::Get | Method::Head => (200, r#"{"status":"ok"}"#),
        _ => (
            405,
            r#"{"reason":"MethodNotAllowed","message":"/healthz accepts GET and HEAD"}"#,
        ),
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(body)
        .build()
}
