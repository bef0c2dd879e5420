//! The Layer2 / Hybrid networking step: `POST
//! /v1/machines/{namespace}/{name}/network` applies a machine's network
//! profile to its Equinix Metal device (`?dryRun=true` answers the plan),
//! `GET /v1/machines/{namespace}/{name}/netconfig?format=` renders the
//! node's OS network configuration. Holds the Metal token.
//!
//! All logic is in [`metal_ipam_core::http::components::network`]; the
//! glue in [`metal_ipam_spin::serve_component`] adapts it to Spin.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "network",
        req,
        out,
        true,
        metal_ipam_core::http::components::network,
    )
    .await
}
