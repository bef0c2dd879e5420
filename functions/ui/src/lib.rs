//! `/ui`: the read-only browser view (its page, files and data routes).
//!
//! All logic is in [`metal_ipam_core::observe`].

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component("ui", req, out, true, metal_ipam_core::http::components::ui)
        .await
}
