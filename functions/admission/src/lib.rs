//! `POST /v1/admission/pools`: the validating admission webhook for our pool
//! kinds (invalid specs, unsafe overlaps, updates dropping allocated
//! addresses, deletion while in use).
//!
//! All logic is in [`metal_ipam_core::admission`]; it reads the key-value
//! store and never writes it.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "admission",
        req,
        out,
        true,
        metal_ipam_core::http::components::admission,
    )
    .await
}
