//! `POST /v1/admission/pools`: the validating admission webhook for our pool
//! kinds (invalid specs, unsafe overlaps, updates dropping allocated
//! addresses, deletion while in use).
//!
//! All logic is in [`metal_ipam_core::admission`]; it reads the key-value
//! store and never writes it.

use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
fn handle(req: Request) -> Response {
    metal_ipam_spin::serve_component(
        "admission",
        req,
        true,
        metal_ipam_core::components::admission,
    )
}
