//! `PnapSim`: an in-process, stateful simulator of phoenixNAP's Bare Metal
//! Cloud APIs, built from the four vendored OpenAPI specifications
//! (`tests/fixtures/phoenixnap-openapi/`), for tests of the phoenixNAP
//! backend (issue 29). Modelled on [`crate::metal_sim`], whose spec loader
//! it shares.
//!
//! One HTTP/1 server on `127.0.0.1:<port>` serves the BMC (`/bmc/v1`),
//! Networks (`/networks/v1`), IP Addresses (`/ips/v1`) and Audit Log
//! (`/audit/v1`) APIs and the OAuth 2.0 token endpoint
//! ([`TOKEN_PATH`]). Every request is checked against the spec of its API
//! and every answer the simulator sends is checked too.
//!
//! ```no_run
//! # async fn demo() {
//! use metal_ipam_core::cloud::retry::RetryPolicy;
//! use metal_ipam_core::pnap::client::Pnap;
//! use metal_ipam_core::pnap::model::PrivateNetworkCreate;
//! use metal_ipam_core::testing::TestEnv;
//! use metal_ipam_tests::metal_sim::BlockingHttp;
//! use metal_ipam_tests::pnap_sim::PnapSim;
//!
//! let sim = PnapSim::start().await;
//! let cfg = sim.config(RetryPolicy::default());
//! // The client blocks: run it off the runtime's worker threads.
//! let net = tokio::task::spawn_blocking(move || {
//!     let (http, env) = (BlockingHttp::new(), TestEnv::at(1_000));
//!     Pnap::new(&http, &cfg, &env).create_private_network(&PrivateNetworkCreate {
//!         name: "pool a".into(),
//!         description: None,
//!         location: "PHX".into(),
//!         vlan_id: None,
//!         cidr: Some("10.0.0.0/24".into()),
//!     })
//! })
//! .await
//! .unwrap()
//! .unwrap();
//! assert_eq!(sim.private_networks()[0].id, net.id);
//! assert!(sim.violations().is_empty() && sim.answer_violations().is_empty());
//! # }
//! ```
//!
//! The server runs as a task on the caller's tokio runtime: the blocking
//! core client needs a multi-threaded runtime and `spawn_blocking`. The
//! seeding, clock, fault and inspection methods are synchronous, take
//! effect at once, and are neither recorded nor subject to faults.
//!
//! # Authentication
//!
//! `POST` [`TOKEN_PATH`] with `Content-Type:
//! application/x-www-form-urlencoded`, body `grant_type=client_credentials`
//! and `Authorization: Basic base64(urlencode(id):urlencode(secret))`
//! answers `{access_token, token_type: "Bearer", expires_in, scope}` for
//! the seeded client ([`PnapSim::client_id`], [`PnapSim::client_secret`]);
//! other credentials get 401 `{"error": "invalid_client"}` (not a
//! violation); a request of another shape gets 400 `invalid_request` and
//! is a violation. A token lives [`SimConfig::token_lifetime_s`] on the
//! simulator's clock ([`PnapSim::advance`]); an API request without a
//! valid, unexpired `Authorization: Bearer` token gets 401 `{"message"}`
//! (not a violation). Scopes are not checked.
//!
//! # The spec check
//!
//! | What | Rule | On failure |
//! | --- | --- | --- |
//! | Base path | `/bmc/v1`, `/networks/v1`, `/ips/v1` or `/audit/v1` | 404, violation |
//! | Method and path | an operation of that API's spec | 404, violation |
//! | Path and query parameters | declared, of the declared type (`force=true`, `limit=10`, `from` a `date-time`, `order` `ASC`/`DESC`) | 400, violation |
//! | Body | JSON, `Content-Type: application/json`, present when required, valid against the request schema with objects **closed** (an unknown field is a violation, as in `metal_sim`) | 400, violation |
//! | Answer | the simulator's own answer against the declared response for its status | [`PnapSim::answer_violations`] |
//!
//! Violations answer 400 `{"message", "validationErrors": [...]}` (the
//! specs' `Error`) and are kept in [`PnapSim::violations`]; tests assert
//! both lists empty. Operations of the specs that are not emulated (see
//! [`EMULATED`]) answer 501 after the check.
//!
//! # Emulated
//!
//! | Resource | Endpoints | Rules (400 unless noted) |
//! | --- | --- | --- |
//! | Private networks | `GET/POST /networks/v1/private-networks` (`?location=`), `GET/PUT/DELETE …/{id}` | `location` one of [`LOCATIONS`]; `name` unique among private networks (unless [`PnapSim::allow_duplicate_names`]); `description` kept; `createdOn` the simulator's clock; `vlanId` unique per location among private and public networks, absent: the next free from [`FIRST_AUTO_VLAN`]; `cidr` required unless `force=true`, an RFC 1918 network address of /30 or larger, not overlapping another private network of the location; one `locationDefault` per location. 201 `status: READY`; `BUSY` while a membership of it is in progress. `memberships` (and the deprecated `servers`) list every member in any state (joining, assigned, leaving). DELETE (204) refused (400) while it has members (any state): `Private network <id> has members (…): remove them from it first`; 404 when unknown |
//! | Public networks | `GET/POST /networks/v1/public-networks`, `GET/PATCH/DELETE …/{id}`, `POST …/{id}/ip-blocks`, `DELETE …/{id}/ip-blocks/{ipBlockId}` | name unique among public networks (as above), `description` and `createdOn` as above, VLAN as above; `memberships` every member in any state; `ipBlocks` at creation or by POST (202 `{id, cidr, usedIpsCount}`): the block exists, is in the network's location, is not assigned (409), at most [`MAX_BLOCKS_PER_NETWORK`]. An attached block reads `assigning` for [`SimConfig::block_reads`] reads (of it, or of its network), then `assigned`; only then do joins take IPs from it; the network is `BUSY` meanwhile. Detaching (202) is immediate; refused (409) while members hold IPs of the block, unless `force=true`. DELETE (204) refused (400) while it has members (any state); frees its blocks (`unassigned`, not deleted) |
//! | IP blocks | `GET/POST /ips/v1/ip-blocks`, `GET/PATCH/DELETE …/{id}` | `cidrBlockSize` one of [`BLOCK_SIZES`], `ipVersion` `V4` only; cut from [`PUBLIC_POOL`] (fake), lowest free aligned block; 201 `status: unassigned`; `description` kept (not unique: several blocks may share one), `createdOn` the simulator's clock; `assignedResourceId` the public network, `assignedResourceType: network` while attached (gone once detached or the network deleted); PATCH sets `description`; DELETE (200 `{result, ipBlockId}`) refused while assigned or assigning |
//! | Servers | `GET /bmc/v1/servers`, `GET …/{id}` | seeded by the test ([`PnapSim::add_server`]); `networkConfiguration` lists its memberships with `statusDescription`; `privateIpAddresses` / `publicIpAddresses` the IPs of its assigned memberships. 404 when unknown or deleted ([`PnapSim::delete_server`]) |
//! | Memberships | `POST /bmc/v1/servers/{id}/network-configuration/private-network-configuration/private-networks`, `PATCH` and `DELETE …/private-networks/{privateNetworkId}`, and the same under `public-network-configuration/public-networks` | the server exists (404) and is `powered-on` or `powered-off`; the network exists and is in the server's location; the server is not a member already (any state). Private `ips`: addresses or ranges `a - b` inside the network's range, not its network or broadcast address, not used by another member (unless `force=true`), none twice, at most 256; absent with `dhcp` false: the next free address; `dhcp: true` with IPs refused. Public `ips`: single addresses inside an `assigned` block of the network, not the block's network, gateway (its first host) or broadcast address, not used by another member (unless `force=true`); none: refused unless `force=true`. 202, `statusDescription: in-progress`, then `assigned` after [`SimConfig::membership_reads`] reads of the server. Leaving: 202, the membership reads `in-progress` as many reads, then is gone (its IPs free); leaving again meanwhile answers 202; 404 when not a member. Updating the IPs: `PATCH …/private-networks/{privateNetworkId}` and `PATCH …/public-networks/{publicNetworkId}` (`ServerNetworkUpdate {ips}`): the server exists (404) and is `powered-on` or `powered-off`; it is a member (404) and the membership is `assigned` (409 while joining or leaving); `ips` not empty unless `force=true`; each IP by the rules of joining (private: inside the range, not its network or broadcast address; public: inside an `assigned` block of the network, not its network, gateway or broadcast address; free, the server's own IPs counting as free; none twice); a private `dhcp` membership takes no IPs. The IPs are replaced at once: 200 with the membership, `statusDescription: assigned` |
//! | Audit log | `GET /audit/v1/events` (`from`, `to` inclusive, `limit`, `order` default `ASC`, `username`, `verb`, `uri` a path prefix) | every applied write of the APIs (2xx, heard or not) appends `{name, timestamp, userInfo {accountId, clientId, username}}`; `timestamp` is the simulator's clock ([`PnapSim::now_ms`], moved only by [`PnapSim::advance`] / [`PnapSim::set_now_ms`]); events of one instant keep their order. More than [`PnapSim::set_events_cap`] events: the first ones, 206 |
//!
//! [`PnapSim::settle`] finishes every pending membership change and block
//! attachment. There is no clock behind any transition and no sleep
//! anywhere but in an injected [`Fault::Latency`].
//!
//! # Faults
//!
//! [`PnapSim::inject`] makes the next `times` requests matching a method
//! (`"*"` for any) and a route (an `operationId`, a path template such as
//! `/private-networks/{privateNetworkId}`, a path relative to its API's
//! base or absolute, `"token"` for the token endpoint, or `"*"`) meet a
//! [`Fault`]: 429 with `Retry-After`, a status before the write (5xx), a
//! status after the write (applied, then a 5xx), a delay, a dropped
//! connection before the write, the write applied and then the
//! connection dropped, or a server deleted before or after the step. Faults apply after authentication and route lookup,
//! before the spec check.
//!
//! # Assumed beyond the specs
//!
//! - Error statuses the specs do not list: 404 for an unknown id on the
//!   get/update/delete operations that list none; 400 for a private
//!   network DELETE with members and for the private-membership POST
//!   (which lists no 409); 400 for a refused IP-block DELETE (which lists
//!   neither 400 nor 409 although its description forbids deleting an
//!   assigned block). A member that is already one, a network in another
//!   location or an unknown network id in the body: 400.
//! - `Server.privateIpAddresses` requires at least one item, which a
//!   server on no private network cannot have: the simulator's loaded BMC
//!   spec drops that `minItems` for answers (the one edit of a spec).
//! - The audit `Event` has no verb or uri: the simulator keeps them
//!   internally for the `verb` and `uri` filters. Event names are ours
//!   (`API.CreatePrivateNetwork`, `API.AddServerPrivateNetwork`,
//!   `API.DeleteServer` for [`PnapSim::delete_server`], …); seeding
//!   records none; refused requests record none.
//! - Network names are unique per kind (the specs: "should be unique"); a
//!   taken name is a 400. [`PnapSim::allow_duplicate_names`] lifts the
//!   rule, for callers that must cope with duplicates if phoenixNAP
//!   allowed them. IP block descriptions are never unique.
//! - A private network with members (any state) is not deleted, as the
//!   public network DELETE's description says of public networks (the
//!   private one's says nothing); both refusals are 400 (the public DELETE
//!   declares 400 and 409). A public network's deletion frees its blocks
//!   (its description says so); they are not deleted.
//! - `createdOn` of networks and blocks is the simulator's clock at
//!   creation (milliseconds, `Z`): resources created at one instant share
//!   it. `assignedResourceType` of a block on a public network is
//!   `network` (the spec's example is `server`, and no value for a network
//!   is documented).
//! - Status strings: networks `READY` / `BUSY` (never `DELETING` or
//!   `ERROR`: deletes are immediate); blocks `unassigned` → `assigning` →
//!   `assigned`, back to `unassigned` at once when detached; memberships
//!   `in-progress` → `assigned`, and `in-progress` while leaving. Timing is
//!   by reads, not time.
//! - The public-network `ips` prose says "at least 1" and "single IPs"
//!   while the schema allows none and ranges: the simulator follows the
//!   prose (ranges refused, none refused without `force`).
//! - IPv4 only; `computeSlaacIp` refused. Tags are not kept (a `tag`
//!   filter matches nothing). BGP peer groups, server creation, actions,
//!   SSH keys, quotas and IP blocks on servers are not emulated (501). No rate limit other than injected ones. The gateway
//!   of a public block is its first host address.
//! - Private networks need no gateway; their network and broadcast
//!   addresses are refused as member IPs.
//! - A membership PATCH only changes what BMC records (its description
//!   says so): it is synchronous (200, `assigned`, no reads to wait),
//!   refused with 409 while the membership is in progress, and 404 when
//!   the server is not a member (the spec lists no 404). Its
//!   `ServerNetworkUpdate` allows ranges for both kinds (the public PATCH's
//!   examples have them): ranges are accepted there, unlike on a public
//!   join. Events `API.UpdateServerPrivateNetwork` and
//!   `API.UpdateServerPublicNetwork`.

#![warn(missing_docs)]

mod server;
mod spec;
mod state;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::pnap::auth::Credentials;
use metal_ipam_core::pnap::client::PnapConfig;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use server::TOKEN_ROUTE;
pub use spec::{Api, APIS, TOKEN_PATH};
pub use state::{
    parse_rfc3339_ms, rfc3339_ms, Event, IpBlock, Membership, MembershipStatus, NetworkKind,
    PrivateNetwork, PublicNetwork, Server, BLOCK_SIZES, EMULATED, FIRST_AUTO_VLAN, LOCATIONS,
    MAX_BLOCKS_PER_NETWORK, PUBLIC_POOL, SERVER_STATUSES,
};

use server::{FaultRule, Inner, Shared};
use state::State;

/// The simulator's clock at start by default: 2025-01-01T00:00:00Z.
pub const DEFAULT_START_MS: u64 = 1_735_689_600_000;

/// A failure to inject into matching requests (see [`PnapSim::inject`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// 429 with `Retry-After: retry_after_s`, before the request is applied.
    RateLimit {
        /// Seconds the client is asked to wait.
        retry_after_s: u64,
    },
    /// This status (e.g. 500, 503) with an `Error` body, before the
    /// request is applied.
    Status(u16),
    /// Waits this many milliseconds, then handles the request normally.
    Latency(u64),
    /// Closes the connection without answering and without applying the
    /// request.
    Drop,
    /// Applies the request, then closes the connection without answering:
    /// it took effect but the client never heard.
    CrashAfter,
    /// Applies the request, then answers this status (a 5xx after the
    /// write: it took effect, the client hears a failure).
    StatusAfter(u16),
    /// Deletes this server (as [`PnapSim::delete_server`]) just before the
    /// request is handled: the step meets a server gone mid-step.
    DeleteServerBefore(String),
    /// Handles the request, then deletes this server before answering:
    /// the client hears the step's answer, but the server is gone.
    DeleteServerAfter(String),
}

/// One request the simulator received.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// `GET`, `POST`, ….
    pub method: String,
    /// The URL path, e.g. `/networks/v1/private-networks`.
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// The spec's `operationId` (or [`TOKEN_ROUTE`]), when the route
    /// matched one.
    pub operation: Option<String>,
    /// The body: its JSON if it parses, else a JSON string of its text.
    pub body: Option<Value>,
    /// The status answered; `None` when the connection was dropped.
    pub status: Option<u16>,
    /// The fault injected into this request, if any.
    pub fault: Option<Fault>,
}

impl Recorded {
    /// `"METHOD path"`, handy for asserting request order.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// How to start a simulator; see [`SimConfig::default`].
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// The OAuth client id.
    pub client_id: String,
    /// The OAuth client secret.
    pub client_secret: String,
    /// The username events are recorded under.
    pub username: String,
    /// Lifetime of an issued token, in seconds of the simulator's clock.
    pub token_lifetime_s: u64,
    /// Server reads a membership change reads `in-progress` before it is
    /// done (0: done at once, though the 202 still says `in-progress`).
    pub membership_reads: u32,
    /// Reads (of the block or its network) an attached block reads
    /// `assigning` before it is `assigned` (0: at once).
    pub block_reads: u32,
    /// The clock at start, Unix milliseconds.
    pub start_ms: u64,
}

impl Default for SimConfig {
    /// An ephemeral port, client `pnap-sim-client` / `pnap-sim-secret`,
    /// user `owner@example.test`, tokens for 3600 s, memberships and
    /// blocks settling after one read, the clock at [`DEFAULT_START_MS`].
    fn default() -> Self {
        SimConfig {
            port: 0,
            client_id: "pnap-sim-client".into(),
            client_secret: "pnap-sim-secret".into(),
            username: "owner@example.test".into(),
            token_lifetime_s: 3600,
            membership_reads: 1,
            block_reads: 1,
            start_ms: DEFAULT_START_MS,
        }
    }
}

/// A running simulator; dropping it stops the server.
pub struct PnapSim {
    shared: Arc<Shared>,
    addr: SocketAddr,
    credentials: Credentials,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for PnapSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PnapSim")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for PnapSim {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl PnapSim {
    /// Starts a simulator with [`SimConfig::default`].
    ///
    /// # Panics
    /// If 127.0.0.1:0 cannot be bound.
    pub async fn start() -> PnapSim {
        PnapSim::start_with(SimConfig::default())
            .await
            .expect("bind 127.0.0.1:0")
    }

    /// Starts a simulator as `cfg` says, on the current tokio runtime.
    ///
    /// # Errors
    /// If the port cannot be bound.
    pub async fn start_with(cfg: SimConfig) -> std::io::Result<PnapSim> {
        // Load the specs before serving, so that a broken copy fails here.
        for (api, id) in EMULATED {
            assert!(
                api.spec().operation(id).is_some(),
                "{id} is not an operation of the {api:?} spec"
            );
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, cfg.port)).await?;
        let addr = listener.local_addr()?;
        let credentials = Credentials {
            client_id: cfg.client_id.clone(),
            client_secret: cfg.client_secret.clone(),
        };
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                state: State::new(
                    cfg.start_ms,
                    cfg.membership_reads,
                    cfg.block_reads,
                    cfg.client_id,
                    cfg.client_secret,
                    cfg.token_lifetime_s,
                    cfg.username,
                ),
                requests: Vec::new(),
                violations: Vec::new(),
                answer_violations: Vec::new(),
                faults: Vec::new(),
                counts: BTreeMap::new(),
            }),
        });
        let server = tokio::spawn(server::serve(listener, Arc::clone(&shared)));
        Ok(PnapSim {
            shared,
            addr,
            credentials,
            server,
        })
    }

    /// `http://127.0.0.1:<port>`: the APIs are under it at their base
    /// paths.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The token endpoint's URL.
    pub fn token_url(&self) -> String {
        format!("http://{}{TOKEN_PATH}", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The seeded client id.
    pub fn client_id(&self) -> &str {
        &self.credentials.client_id
    }

    /// The seeded client secret.
    pub fn client_secret(&self) -> &str {
        &self.credentials.client_secret
    }

    /// A client configuration for this simulator with the seeded
    /// credentials.
    pub fn config(&self, retry: RetryPolicy) -> PnapConfig {
        PnapConfig {
            api_url: self.api_url(),
            token_url: self.token_url(),
            credentials: self.credentials.clone(),
            retry,
        }
    }

    // -- clock and tokens -------------------------------------------------------

    /// The simulator's clock (Unix milliseconds).
    pub fn now_ms(&self) -> u64 {
        self.shared.lock().state.now_ms
    }

    /// Sets the clock.
    pub fn set_now_ms(&self, ms: u64) {
        self.shared.lock().state.now_ms = ms;
    }

    /// Moves the clock on by `ms` (tokens may expire; later events carry
    /// the new time).
    pub fn advance(&self, ms: u64) {
        let mut inner = self.shared.lock();
        inner.state.now_ms = inner.state.now_ms.saturating_add(ms);
    }

    /// Tokens issued so far.
    pub fn tokens_issued(&self) -> usize {
        self.shared.lock().state.tokens_issued
    }

    /// Revokes every token issued so far (the next API request meets a
    /// 401), as an expiry the client's clock does not know of would.
    pub fn revoke_tokens(&self) {
        self.shared.lock().state.tokens.clear();
    }

    // -- seeding ----------------------------------------------------------------

    /// Adds a `powered-on` server. Records no event.
    ///
    /// # Panics
    /// If the location is unknown or the id taken.
    pub fn add_server(&self, id: &str, hostname: &str, location: &str) -> Server {
        self.add_server_in_state(id, hostname, location, "powered-on")
    }

    /// Adds a server in `status` (one of [`SERVER_STATUSES`]).
    ///
    /// # Panics
    /// If the location or status is unknown or the id taken.
    pub fn add_server_in_state(
        &self,
        id: &str,
        hostname: &str,
        location: &str,
        status: &str,
    ) -> Server {
        self.shared
            .lock()
            .state
            .add_server(id, hostname, location, status)
            .unwrap_or_else(|e| panic!("PnapSim::add_server: {e}"))
    }

    /// Sets a server's status. Records no event.
    ///
    /// # Panics
    /// If there is no such server or the status is unknown.
    pub fn set_server_status(&self, id: &str, status: &str) -> Server {
        self.shared
            .lock()
            .state
            .set_server_status(id, status)
            .unwrap_or_else(|e| panic!("PnapSim::set_server_status: {e}"))
    }

    /// Deletes a server: it answers 404 from now on and its memberships
    /// (any state) are gone, their IPs free. Records an event
    /// `API.DeleteServer` (`DELETE /bmc/v1/servers/<id>`). Returns the
    /// memberships removed.
    ///
    /// # Panics
    /// If there is no such server.
    pub fn delete_server(&self, id: &str) -> Vec<Membership> {
        self.shared
            .lock()
            .state
            .delete_server(id)
            .unwrap_or_else(|e| panic!("PnapSim::delete_server: {e}"))
    }

    /// Sets how many server reads membership changes made from now on take
    /// (see [`SimConfig::membership_reads`]).
    pub fn set_membership_reads(&self, reads: u32) {
        self.shared.lock().state.membership_reads = reads;
    }

    /// Sets how many reads block attachments made from now on take (see
    /// [`SimConfig::block_reads`]).
    pub fn set_block_reads(&self, reads: u32) {
        self.shared.lock().state.block_reads = reads;
    }

    /// Caps the events one audit answer carries; more answer 206 with the
    /// first `cap` (`None` lifts the cap).
    pub fn set_events_cap(&self, cap: Option<usize>) {
        self.shared.lock().state.events_cap = cap;
    }

    /// Lets a network name be taken twice (of one kind) from now on, or
    /// not (the default): the specs say a name "should be unique", which
    /// the simulator enforces unless told otherwise.
    pub fn allow_duplicate_names(&self, allow: bool) {
        self.shared.lock().state.duplicate_names = allow;
    }

    /// Finishes every pending membership change and block attachment.
    pub fn settle(&self) {
        self.shared.lock().state.settle();
    }

    // -- faults -------------------------------------------------------------------

    /// Makes the next `times` requests matching `method` (`"*"`: any) and
    /// `route` (see the module docs) meet `fault`. Rules are tried in the
    /// order they were added; each request takes at most one.
    ///
    /// # Panics
    /// If a [`Fault::Status`] is not a 4xx or 5xx.
    pub fn inject(&self, method: &str, route: &str, fault: Fault, times: usize) {
        if let Fault::Status(code) | Fault::StatusAfter(code) = fault {
            assert!(
                (400..600).contains(&code),
                "an injected status must be 4xx or 5xx, got {code}"
            );
        }
        if times == 0 {
            return;
        }
        self.shared.lock().faults.push(FaultRule {
            method: method.to_owned(),
            route: route.to_owned(),
            fault,
            remaining: times,
        });
    }

    /// How many injected faults are still waiting for requests.
    pub fn pending_faults(&self) -> usize {
        self.shared.lock().faults.iter().map(|f| f.remaining).sum()
    }

    /// Drops every pending fault.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    // -- inspection -----------------------------------------------------------------

    /// The private networks, oldest first.
    pub fn private_networks(&self) -> Vec<PrivateNetwork> {
        self.shared.lock().state.private_networks.clone()
    }

    /// The public networks, oldest first.
    pub fn public_networks(&self) -> Vec<PublicNetwork> {
        self.shared.lock().state.public_networks.clone()
    }

    /// The IP blocks, oldest first.
    pub fn ip_blocks(&self) -> Vec<IpBlock> {
        self.shared.lock().state.ip_blocks.clone()
    }

    /// The servers.
    pub fn servers(&self) -> Vec<Server> {
        self.shared.lock().state.servers.clone()
    }

    /// Every membership (any state), oldest first.
    pub fn memberships(&self) -> Vec<Membership> {
        self.shared.lock().state.memberships.clone()
    }

    /// The audit events, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().state.events.clone()
    }

    /// Requests that broke a spec (or the token request's shape), one
    /// entry per request, as `"METHOD path: problem; problem"`.
    pub fn violations(&self) -> Vec<String> {
        self.shared.lock().violations.clone()
    }

    /// Answers of the simulator that do not match its spec's declared
    /// response (a bug of the simulator).
    pub fn answer_violations(&self) -> Vec<String> {
        self.shared.lock().answer_violations.clone()
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// Authenticated requests received for an operation (`operationId`,
    /// or [`TOKEN_ROUTE`]), faulted ones included.
    pub fn count(&self, operation: &str) -> usize {
        self.shared
            .lock()
            .counts
            .get(operation)
            .map_or(0, |c| c.received)
    }

    /// Requests for an operation that took effect (2xx), heard or not.
    pub fn applied(&self, operation: &str) -> usize {
        self.shared
            .lock()
            .counts
            .get(operation)
            .map_or(0, |c| c.applied)
    }
}
