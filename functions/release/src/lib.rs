//! `GET`/`DELETE /v1/claims/{namespace}/{name}`: reads a claim's `IPAddress`
//! or releases its address.
//!
//! All logic is in [`metal_ipam_core::api::claims`]; [`metal_ipam_spin::serve`]
//! adapts it to Spin (variables, key-value store, rendering, log line).

use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
fn handle(req: Request) -> Response {
    metal_ipam_spin::serve("release", req, metal_ipam_core::api::claims)
}
