//! Pure domain logic of metal-ipam, a Cluster API IPAM provider that runs as
//! Spin components. Nothing here depends on Spin: the store, outbound HTTP,
//! time and randomness are [`ports`] the shells implement. Three pieces
//! carry the rest; read them first.
//!
//! # The dispatcher
//! Every request goes through [`http::dispatch`]. The route table
//! ([`routes::TABLE`]) gives each route its template, its methods, its
//! authentication policy ([`routes::Auth`]: API token, read token, events
//! token, none) and its handler; [`routes::Route`] is a matched route
//! with its fields (a pool route carries its parsed pool). The dispatcher
//! answers public routes, authenticates once by the row's policy before
//! anything else, answers 404 and 405 (with `Allow`) from the table, then
//! calls the handler with what it reads. Each Spin shell is one line
//! naming its component; chaining to other components lives with the
//! events ([`events::chain`]).
//!
//! # The reconcile kit
//! Every Kubernetes object metal-ipam reconciles goes through one
//! lifecycle, [`reconcile::run`]: read → gone → parse → pause and deletion
//! in the handler's [`reconcile::Order`] → finalizer → act → condition and
//! answer ([`reconcile::Reconciled`]). Each kind is a
//! [`reconcile::Handler`], its phases on `&mut self`:
//! - [`capi::claim::ClaimHandler`]: `IPAddressClaim` → address and
//!   `IPAddress`;
//! - [`capi::pool::PoolHandler`]: plain pools → the store and their counts;
//! - [`capi::vrf`]: VRF-backed pools → their VRF, reservation, VLAN and
//!   gateway (the VRF extension, [`provision::vrf_cloud::VrfCloud`]);
//! - [`capi::assign`]: a claim's IP assignment to its device;
//! - [`capi::machine`]: a Machine's port networking from its profile
//!   ([`capi::network`] holds the machinery).
//!
//! [`capi::poll`] (the cloud's event poll) and [`capi::reconcile`] (the
//! full reconcile) drive these handlers. Records that one instance works
//! on at a time (a pool's provisioning intents, a claim's assignment, a
//! device's apply) hold the one fenced lease, [`kv::lease`].
//!
//! # The cloud seam
//! The pool, claim and profile logic talks to one trait,
//! [`cloud::Cloud`] (devices with NICs and addresses, segments, attach and
//! detach with an operation to follow, address assignment, events after a
//! cursor), and asks its [`cloud::Capabilities`] before relying on what
//! only some clouds do (NIC modes, bonding, VRF-backed pools), refusing
//! clearly where a cloud cannot. Equinix Metal ([`metal::cloud`]) is its
//! first implementation; `docs/cloud-seam.md` says what each cloud must
//! provide and what Metal provides beyond it.
//!
//! # Modules, by concept (inner first)
//! - [`error`]: the one [`Error`] type; [`ErrorKind::status`] is the only
//!   error → HTTP status map.
//! - [`ports`]: the traits the shells implement: [`ports::kv::KvStore`],
//!   [`ports::http::HttpClient`], [`ports::Env`].
//! - [`ip`]: addresses as integers and [`ip::RangeSet`]; knows nothing of
//!   pools.
//! - [`ipam`]: pools, claims, the allocator and the operations over the
//!   store.
//! - [`kv`]: the key layout, records and the compare-and-swap protocol.
//! - [`kube`]: a Kubernetes API client returning typed object views
//!   ([`kube::object`]), the resource table with `USED_PERMISSIONS`,
//!   Kubernetes name rules.
//! - [`cloud`]: the bare-metal cloud seam: the [`cloud::Cloud`] trait,
//!   capabilities, the NIC modes extension, cloud-neutral views.
//! - [`metal`]: the Equinix Metal API client (typed models, retries,
//!   pagination) and Metal as a [`cloud::Cloud`].
//! - [`pnap`]: phoenixNAP Bare Metal Cloud, the next cloud: so far its
//!   OAuth 2.0 client credentials.
//! - [`network`]: Layer2 / Hybrid networking: network profiles (per-port
//!   desired state), the port plan, the node's OS configuration.
//! - [`provision`]: VRF-backed pools' Metal resources, provisioned in
//!   order and exactly once, torn down by policy; claims' IP assignments to
//!   their devices, exactly once; the Metal event cursor.
//! - [`reconcile`]: the lifecycle skeleton, the [`reconcile::Handler`]
//!   trait, typed verdicts and condition reasons.
//! - [`capi`]: the CAPI IPAM contract: claim and pool reconciliation, full
//!   reconcile; VRF-backed pools and claims' Metal assignments on the
//!   Kubernetes side, and the Metal event poll.
//! - [`routes`]: the route table: every route's path, component, chaining
//!   callers, methods and authentication policy; the typed [`routes::Route`]
//!   (a pool route's pool kind parsed from its path) built and matched
//!   from it.
//! - [`events`]: the payloads event forwarders post to `/v1/events`, where
//!   they are chained to ([`events::route`]) and the chaining itself
//!   ([`events::chain`]).
//! - [`observe`]: what operators look at: request counters, the
//!   reconcile's and the poll's summaries, the Prometheus exposition, the
//!   browser view's data and page.
//! - [`admission`]: the validating webhook for the pool kinds and network
//!   profiles.
//! - [`http`]: requests and responses, auth, the dispatcher (one entry per
//!   component) and the routes' handlers, the plain HTTP API among them.
//! - `testing` (feature `testing`): in-memory store with each Spin
//!   backend's quirks, a deterministic environment, and `World` (the two
//!   and a context over them: what a test starts from).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod admission;
pub mod capi;
pub mod cloud;
pub mod error;
pub mod events;
pub mod http;
pub mod ip;
pub mod ipam;
pub mod kube;
pub mod kv;
pub mod metal;
pub mod network;
pub mod observe;
pub mod pnap;
pub mod ports;
pub mod provision;
pub mod reconcile;
pub mod routes;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{Error, ErrorKind, Result};

/// Largest request body accepted (1 MiB), by every parser of request bytes
/// (HTTP API, events, admission reviews). A larger body is answered 413
/// `PayloadTooLarge` ([`Error::payload_too_large`]): by the Spin shell
/// before it reads the body when `Content-Length` says so, or as soon as a
/// body without one has passed the limit; and by the parsers, for bodies
/// that reach them some other way.
pub const MAX_BODY: usize = 1 << 20;
