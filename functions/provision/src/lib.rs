//! The VRF-backed pool step, reached by service chaining from `events`:
//! `POST /v1/capi/metal/pools/{namespace}/{name}` and
//! `/v1/capi/metal/global-pools/{name}` provision a pool's Equinix Metal
//! resources (or tear them down), register the pool once they are ready,
//! and answer 202 with `Retry-After` while Metal is still working. The only
//! component that holds the Metal token.
//!
//! All logic is in [`metal_ipam_core::http::components::provision`]; the
//! glue in [`metal_ipam_spin::serve_component`] adapts it to Spin.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "provision",
        req,
        out,
        true,
        metal_ipam_core::http::components::provision,
    )
    .await
}
