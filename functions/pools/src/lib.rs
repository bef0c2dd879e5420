//! `/v1/pools`, `/v1/pools/{namespace}/{name}`, `/v1/global-pools`,
//! `/v1/global-pools/{name}`: register, read, list and delete pools.
//!
//! All logic is in [`metal_ipam_core::api::pools`]; [`metal_ipam_spin::serve`]
//! adapts it to Spin (variables, key-value store, rendering, log line).

use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
fn handle(req: Request) -> Response {
    metal_ipam_spin::serve("pools", req, metal_ipam_core::api::pools)
}
