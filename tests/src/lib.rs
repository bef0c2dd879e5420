//! Shared helpers for metal-ipam's component, concurrency and schema tests.

pub mod client;
pub mod clusterctl;
pub mod fake_kube;
pub mod fuzz;
pub mod harness;
pub mod in_cluster;
pub mod kube;
pub mod metal_sim;
pub mod oci_registry;
pub mod pnap_sim;
pub mod pnap_world;
pub mod real_kube;
pub mod real_spin;
pub mod schema;
pub mod soak;
pub mod vrf_world;
