//! `GET`/`DELETE /v1/claims/{namespace}/{name}`: reads or releases a claim's
//! address; and, reached by service chaining from `events`, the claim
//! reconcile step `POST /v1/capi/claims/{namespace}/{name}` (CAPI contract,
//! deleted claims).
//!
//! All logic is in [`metal_ipam_core::http::dispatch::release`]; the glue in
//! [`metal_ipam_spin::serve`] adapts it to Spin.

metal_ipam_spin::component!(Release, release);
