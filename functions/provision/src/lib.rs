//! The VRF-backed pool step, reached by service chaining from `events`:
//! `POST /v1/capi/metal/pools/{namespace}/{name}` and
//! `/v1/capi/metal/global-pools/{name}` provision a pool's Equinix Metal
//! resources (or tear them down), register the pool once they are ready,
//! and answer 202 with `Retry-After` while Metal is still working. The only
//! component that holds the Metal token.
//!
//! All logic is in [`metal_ipam_core::http::dispatch::provision`]; the
//! glue in [`metal_ipam_spin::serve`] adapts it to Spin.

metal_ipam_spin::component!(Provision, provision);
