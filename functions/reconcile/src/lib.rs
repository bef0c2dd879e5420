//! `POST /v1/reconcile`: full reconciliation between the key-value store
//! and the Kubernetes API, meant to run periodically (a CronJob).
//!
//! All logic is in [`metal_ipam_core::reconcile`].

use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
fn handle(req: Request) -> Response {
    metal_ipam_spin::serve_component(
        "reconcile",
        req,
        true,
        metal_ipam_core::components::reconcile,
    )
}
