//! The attach-vlan step: `POST /v1/metal/ports/{port}/vlan-batches` creates,
//! finds or reads the Metal batch that assigns VLANs to a port
//! (`state: assigned`). Private: reached by service chaining from
//! `network` and `poll`, whose apply records the step before asking.
//! Holds the Metal token; no store, no Kubernetes access.
//!
//! All logic is in [`metal_ipam_core::http::dispatch::attach_vlan`] and
//! [`metal_ipam_core::network::batch`]; the glue in
//! [`metal_ipam_spin::serve`] adapts it to Spin.

metal_ipam_spin::component!(AttachVlan, attach_vlan);
