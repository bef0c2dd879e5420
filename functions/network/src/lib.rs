//! The Layer2 / Hybrid networking step: `POST
//! /v1/machines/{namespace}/{name}/network` applies a machine's network
//! profile to its Equinix Metal device or phoenixNAP server (`?dryRun=true`
//! answers the plan), `GET /v1/machines/{namespace}/{name}/netconfig?format=`
//! renders the node's OS network configuration. Holds the Metal token and
//! phoenixNAP's client credentials.
//!
//! All logic is in [`metal_ipam_core::http::dispatch::network`]; the
//! glue in [`metal_ipam_spin::serve`] adapts it to Spin.

metal_ipam_spin::component!(Network, network);
