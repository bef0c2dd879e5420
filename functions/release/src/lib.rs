//! `GET`/`DELETE /v1/claims/{namespace}/{name}`: reads or releases a claim's
//! address; and, reached by service chaining from `events`, the claim
//! reconcile step `POST /v1/capi/claims/{namespace}/{name}` (CAPI contract,
//! deleted claims).
//!
//! All logic is in [`metal_ipam_core::http::components::release`]; the glue in
//! [`metal_ipam_spin::serve_component`] adapts it to Spin.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "release",
        req,
        out,
        true,
        metal_ipam_core::http::components::release,
    )
    .await
}
