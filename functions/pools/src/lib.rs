//! The pool registry: `PUT`/`GET`/`DELETE /v1/pools/{namespace}/{name}` and
//! `/v1/global-pools/{name}`, `GET` on both collections; and, reached by
//! service chaining from `events`, the pool sync step
//! `POST /v1/capi/pools/{namespace}/{name}` / `/v1/capi/global-pools/{name}`.
//!
//! All logic is in [`metal_ipam_core::http::dispatch::pools`]; the glue in
//! [`metal_ipam_spin::serve`] adapts it to Spin.

metal_ipam_spin::component!(Pools, pools);
