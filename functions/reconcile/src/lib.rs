//! `POST /v1/reconcile`: full reconciliation between the key-value store
//! and the Kubernetes API, meant to run periodically (a CronJob).
//!
//! All logic is in [`metal_ipam_core::capi::reconcile`].

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "reconcile",
        req,
        out,
        true,
        metal_ipam_core::http::components::reconcile,
    )
    .await
}
