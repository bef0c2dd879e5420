//! phoenixNAP Bare Metal Cloud: the second cloud behind [`crate::cloud`]
//! (issue 29; `docs/cloud-seam.md` maps its concepts). Its specifications
//! are vendored in `tests/fixtures/phoenixnap-openapi/`.
//!
//! Holds so far the OAuth 2.0 client credentials ([`auth`]: the token
//! request, its answer and the token cached with its expiry, refreshed once
//! on a 401), the objects metal-ipam reads and sends ([`model`]) and the
//! typed client ([`client`]: retries, error bodies, one method per call)
//! and phoenixNAP as a [`crate::cloud::Cloud`] ([`cloud`]: servers,
//! networks, memberships as operations, IPs on memberships as assigned
//! addresses, the audit log as hints). The pool kinds, the components'
//! wiring and the end-to-end tests against the simulator come next.
//!
//! Imports only `cloud` (its error type): like `metal`, nothing of IPAM,
//! Kubernetes or the store.

pub mod auth;
pub mod client;
pub mod cloud;
pub mod model;
