//! Equinix Metal: the API client metal-ipam uses for VRF-backed pools (and,
//! later, port networking).
//!
//! - [`model`]: typed requests and responses (`serde`), the `oneOf`
//!   answers told apart by `type`;
//! - [`retry`]: when to retry and how long to wait, as a pure decision
//!   (`crate::cloud::retry`, shared with the other clouds' clients);
//! - [`client`]: [`client::Metal`], over [`crate::ports::http::HttpClient`]
//!   and [`crate::ports::Env`] (clock, waits);
//! - [`cloud`]: Metal as a [`crate::cloud::Cloud`], the seam the domain
//!   modules talk to (they name no Metal type).
//!
//! Owns nothing of IPAM or Kubernetes and may not import `ipam`, `kv`,
//! `kube`, `capi` or `http`: the steps that provision Metal resources use
//! it, not the other way round. The Metal token reaches only the
//! components that call Metal.

pub mod client;
pub mod cloud;
pub mod model;
pub use crate::cloud::retry;
