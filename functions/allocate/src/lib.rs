//! `POST /v1/claims`: allocates an address for an `IPAddressClaim` and
//! answers the `IPAddress` (201 new, 200 already bound).
//!
//! All logic is in [`metal_ipam_core::api::allocate`]; [`metal_ipam_spin::serve`]
//! adapts it to Spin (variables, key-value store, rendering, log line).

use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
fn handle(req: Request) -> Response {
    metal_ipam_spin::serve("allocate", req, metal_ipam_core::api::allocate)
}
