//! The per-claim Metal assignment step: `POST
//! /v1/capi/metal/claims/{namespace}/{name}` (service chaining from
//! `events` and `reconcile`) and its public twin `/v1/metal/claims/…`
//! assign a VRF-backed pool claim's address to the claim's device, or
//! remove the assignment of a claim that is going, before its address is
//! released. Holds the Metal token.
//!
//! All logic is in [`metal_ipam_core::http::components::assign`]; the glue
//! in [`metal_ipam_spin::serve_component`] adapts it to Spin.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "assign",
        req,
        out,
        true,
        metal_ipam_core::http::components::assign,
    )
    .await
}
