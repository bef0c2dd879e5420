//! The detach-vlan step: `POST /v1/metal/ports/{port}/vlan-batches` creates,
//! finds or reads the Metal batch that unassigns VLANs from a port
//! (`state: unassigned`). Private: reached by service chaining from
//! `network` and `poll`, whose apply records the step before asking.
//! Holds the Metal token; no store, no Kubernetes access.
//!
//! All logic is in [`metal_ipam_core::http::components::detach_vlan`] and
//! [`metal_ipam_core::network::batch`]; the glue in
//! [`metal_ipam_spin::serve_component`] adapts it to Spin.

use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point (streaming:
/// the body is read by the glue, within the limit, once the head passed).
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    metal_ipam_spin::serve_component(
        "detach-vlan",
        req,
        out,
        false,
        metal_ipam_core::http::components::detach_vlan,
    )
    .await
}
