//! Shared helpers for metal-ipam's component, concurrency and schema tests.

pub mod client;
pub mod harness;
pub mod schema;
