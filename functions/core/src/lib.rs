//! Pure domain logic of metal-ipam, a Cluster API IPAM provider that runs as
//! Fermyon Spin components.
//!
//! Nothing here depends on Spin: the store is the [`kv::KvStore`] trait,
//! time and randomness come through [`store::Env`], and the HTTP layer works
//! on plain [`api::ApiRequest`] / [`api::ApiResponse`] values. Function crates
//! only adapt Spin to these types.
//!
//! # Organization
//! - [`error`]: the [`Error`] type; [`ErrorKind`] decides the HTTP status.
//! - [`addr`]: addresses as integers, [`addr::RangeSet`].
//! - [`names`]: Kubernetes name rules.
//! - [`pool`]: pool objects and validation into [`pool::ValidatedPool`].
//! - [`claim`]: `IPAddressClaim` parsing and `IPAddress` rendering.
//! - [`alloc`]: the allocator as pure state transitions ([`alloc::PoolState`]).
//! - [`kv`]: the key-value port and an operation counter.
//! - [`store`]: key layout, records and the compare-and-swap protocol.
//! - [`steps`]: allocate, release, pool registration… over the port.
//! - [`auth`]: bearer-token check.
//! - [`outbound`]: the outbound HTTP port; [`kube`]: a typed Kubernetes API client on it.
//! - [`capi`]: the CAPI IPAM contract: claim and pool reconciliation.
//! - [`components`]: one entry point per Spin component (routing, auth, what each needs).
//! - [`reconcile`]: full reconciliation and store rebuild from the API server.
//! - [`api`]: routing and rendering of every route.
//! - [`events`]: the payloads event forwarders post to `/v1/events`.
//! - [`admission`]: the validating webhook for the pool kinds.
//! - `testing` (feature `testing`): in-memory store with each Spin backend's
//!   quirks, and a deterministic environment.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod addr;
pub mod admission;
pub mod alloc;
pub mod api;
pub mod auth;
pub mod capi;
pub mod claim;
pub mod components;
pub mod error;
pub mod events;
pub mod kube;
pub mod kv;
pub mod names;
pub mod outbound;
pub mod pool;
pub mod reconcile;
pub mod steps;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{Error, ErrorKind, Result};
