//! `POST /v1/events`: the sink for Kubernetes event forwarders. Parses the
//! event (Knative CloudEvents binary/structured, Argo Events, watch events)
//! and forwards it by Spin service chaining to `allocate`, `release` or
//! `pools`, which re-read the object from the API server and reconcile it.
//!
//! All logic is in [`metal_ipam_core::http::dispatch::events`]. No key-value
//! store, no Kubernetes access: only `http://*.spin.internal` chaining.

metal_ipam_spin::component!(Events, events);
