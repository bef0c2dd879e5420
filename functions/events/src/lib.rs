//! `POST /v1/events`: the sink for Kubernetes event forwarders. Parses the
//! event (Knative CloudEvents binary/structured, Argo Events, watch events)
//! and forwards it by Spin service chaining to `allocate`, `release` or
//! `pools`, which re-read the object from the API server and reconcile it.
//!
//! All logic is in [`metal_ipam_core::components::events`]. No key-value
//! store, no Kubernetes access: only `http://*.spin.internal` chaining.

use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
fn handle(req: Request) -> Response {
    metal_ipam_spin::serve_component("events", req, false, metal_ipam_core::components::events)
}
