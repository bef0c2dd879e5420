//! `POST /v1/reconcile`: full reconciliation between the key-value store
//! and the Kubernetes API, meant to run periodically (a CronJob).
//!
//! All logic is in [`metal_ipam_core::capi::reconcile`].

metal_ipam_spin::component!(Reconcile, reconcile);
