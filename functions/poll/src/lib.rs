//! The Metal event poll: `POST /v1/metal/poll`, run by a CronJob (Metal
//! has no webhooks), handles the project's events after the cursor kept in
//! the store: a deleted device's claims lose their assignment, an active
//! device gets its claims' pending ones. Holds the Metal token.
//!
//! All logic is in [`metal_ipam_core::http::components::poll`]; the glue
//! in [`metal_ipam_spin::serve_component`] adapts it to Spin.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "poll",
        req,
        out,
        true,
        metal_ipam_core::http::components::poll,
    )
    .await
}
