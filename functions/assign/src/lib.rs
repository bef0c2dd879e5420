//! The per-claim Metal assignment step: `POST
//! /v1/capi/metal/claims/{namespace}/{name}` (service chaining from
//! `events` and `reconcile`) and its public twin `/v1/metal/claims/…`
//! assign a VRF-backed pool claim's address to the claim's device, or
//! remove the assignment of a claim that is going, before its address is
//! released. Holds the Metal token.
//!
//! All logic is in [`metal_ipam_core::http::dispatch::assign`]; the glue
//! in [`metal_ipam_spin::serve`] adapts it to Spin.

metal_ipam_spin::component!(Assign, assign);
