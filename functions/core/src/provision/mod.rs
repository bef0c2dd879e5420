//! Provisioning of VRF-backed pools: bringing a pool's Metal resources
//! (VRF, IP reservation, VLAN, Metal Gateway) into existence in dependency
//! order, exactly once across instances and crashes, and tearing them down
//! in reverse order by the deletion policies decided when each was created
//! or adopted; a deleted pool's record is final (a tombstone naming its
//! uid), a re-created one starts afresh.
//!
//! - [`plan`]: the next action as a pure decision from the spec, the
//!   recorded progress and the clock; whose the record is.
//! - [`record`]: the progress record in the store (a
//!   [`crate::kv::protocol::CasRecord`]) and its reads.
//! - [`transitions`]: the record's compare-and-swap decisions, methods on
//!   a [`transitions::PoolRecord`] handle (public for the interleaving
//!   checker).
//! - [`target`]: the pool being provisioned, its tags and customdata.
//! - [`vrf_cloud`]: [`vrf_cloud::VrfCloud`], what a cloud offering
//!   VRF-backed pools must do (VRF, reservation, VLAN, gateway: an
//!   extension of a bare-metal cloud); [`vrf_metal`]: Equinix Metal's
//!   implementation.
//! - [`pnap_pools`]: phoenixNAP's calls for pools backed by its networks and IP blocks (imports `pnap`).
//! - [`step`]: the driver, [`step::provision`] and [`step::deprovision`],
//!   which run the plan against the cloud and the store, one recorded
//!   action at a time.
//! - [`assign`]: per-claim IP assignments of a VRF-backed pool's addresses
//!   to the claims' devices, exactly once, removed before release.
//! - [`poll`]: the Metal event poller's cursor and the devices the new
//!   events concern (Metal has no webhooks).
//!
//! May import `ipam` (the pool's `spec.metal`), `kv` (the progress record),
//! `metal` (the client: [`vrf_metal`], and `assign` and `poll`) and the
//! ports; never `http`, `kube` or `capi`, which call it.

pub mod assign;
pub mod clouds;
pub mod plan;
pub mod pnap_pools;
pub mod poll;
pub mod record;
pub mod step;
pub mod target;
pub mod transitions;
pub mod vrf_cloud;
pub mod vrf_metal;
pub mod vrf_pnap;
