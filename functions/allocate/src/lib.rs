//! `POST /v1/claims`: allocates an address for an `IPAddressClaim` and
//! answers the `IPAddress` (201 new, 200 already bound); and, reached by
//! service chaining from `events`, the claim reconcile step
//! `POST /v1/capi/claims/{namespace}/{name}` (CAPI contract, live claims).
//!
//! All logic is in [`metal_ipam_core::http::dispatch::allocate`]; the glue in
//! [`metal_ipam_spin::serve`] adapts it to Spin.

metal_ipam_spin::component!(Allocate, allocate);
