//! `POST /v1/events`: the sink for Kubernetes event forwarders. Parses the
//! event (Knative CloudEvents binary/structured, Argo Events, watch events)
//! and forwards it by Spin service chaining to `allocate`, `release` or
//! `pools`, which re-read the object from the API server and reconcile it.
//!
//! All logic is in [`metal_ipam_core::http::components::events`]. No key-value
//! store, no Kubernetes access: only `http://*.spin.internal` chaining.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "events",
        req,
        out,
        false,
        metal_ipam_core::http::components::events,
    )
    .await
}
