//! The pool registry: `PUT`/`GET`/`DELETE /v1/pools/{namespace}/{name}` and
//! `/v1/global-pools/{name}`, `GET` on both collections; and, reached by
//! service chaining from `events`, the pool sync step
//! `POST /v1/capi/pools/{namespace}/{name}` / `/v1/capi/global-pools/{name}`.
//!
//! All logic is in [`metal_ipam_core::http::components::pools`]; the glue in
//! [`metal_ipam_spin::serve_component`] adapts it to Spin.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "pools",
        req,
        out,
        true,
        metal_ipam_core::http::components::pools,
    )
    .await
}
