//! `/ui`: the read-only browser view (its page, files and data routes).
//!
//! All logic is in [`metal_ipam_core::observe`]. The page and its files
//! hold no data and no secret: the shell answers them without a token or
//! the store ([`metal_ipam_core::http::components::ui_file`], the
//! component's public routes); the data routes under `/ui/api/` are
//! authenticated first, as every other route.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component_public(
        "ui",
        Some(metal_ipam_core::http::components::ui_file),
        req,
        out,
        true,
        metal_ipam_core::http::components::ui,
    )
    .await
}
