//! `GET /v1/metrics`: the Prometheus exposition (text format 0.0.4).
//!
//! All logic is in [`metal_ipam_core::observe`].

metal_ipam_spin::component!(Metrics, metrics);
