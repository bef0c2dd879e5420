//! `GET`/`DELETE /v1/claims/{namespace}/{name}`: reads or releases a claim's
//! address; and, reached by service chaining from `events`, the claim
//! reconcile step `POST /v1/capi/claims/{namespace}/{name}` (CAPI contract,
//! deleted claims).
//!
//! All logic is in [`metal_ipam_core::components::release`]; the glue in
//! [`metal_ipam_spin::serve_component`] adapts it to Spin.

use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
fn handle(req: Request) -> Response {
    metal_ipam_spin::serve_component("release", req, true, metal_ipam_core::components::release)
}
