//! `MetalSim`: an in-process simulator of the Equinix Metal API, built from
//! the last published OpenAPI spec (vendored in
//! `tests/fixtures/metal-openapi/`), for tests of the code that provisions
//! VRF-backed pools. Equinix Metal is shut down; this is what we test
//! against.
//!
//! It speaks HTTP/1 JSON on `127.0.0.1:<port>` under the spec's base path,
//! so its base URL is `http://127.0.0.1:<port>/metal/v1`. Every request is
//! checked against the spec and every answer it sends is checked too, so a
//! test fails where the real API would refuse our request, and where the
//! simulator itself drifts from the spec.
//!
//! ```no_run
//! # async fn demo() {
//! use metal_ipam_core::metal::client::Metal;
//! use metal_ipam_core::metal::model::VrfCreateInput;
//! use metal_ipam_core::metal::retry::RetryPolicy;
//! use metal_ipam_core::testing::TestEnv;
//! use metal_ipam_tests::metal_sim::{BlockingHttp, MetalSim};
//!
//! let sim = MetalSim::start().await;
//! let cfg = sim.metal_config(RetryPolicy::default());
//! // The client blocks: run it off the runtime's worker threads.
//! let vrf = tokio::task::spawn_blocking(move || {
//!     let (http, env) = (BlockingHttp::new(), TestEnv::at(1_000));
//!     let metal = Metal::new(&http, &cfg, &env);
//!     metal.create_vrf(&VrfCreateInput {
//!         name: "pool-a".into(),
//!         metro: "da".into(),
//!         ip_ranges: vec!["10.10.0.0/16".into()],
//!         ..VrfCreateInput::default()
//!     })
//! })
//! .await
//! .unwrap()
//! .unwrap();
//! assert_eq!(sim.vrfs()[0].id, vrf.id);
//! assert!(sim.violations().is_empty() && sim.answer_violations().is_empty());
//! # }
//! ```
//!
//! The server runs as a task on the caller's tokio runtime: code that
//! blocks a thread on its HTTP calls (the Metal client does) needs a
//! multi-threaded runtime and `spawn_blocking`, or its own thread. The
//! seeding, fault and inspection methods are synchronous and take effect
//! at once (they only take a mutex); they are neither recorded nor subject
//! to faults. [`BlockingHttp`] is the core's `HttpClient` port over a plain
//! blocking socket, for running the real client natively. `cargo run -p
//! metal-ipam-tests --bin metal-sim` serves a simulator standalone.
//!
//! # The spec check
//!
//! | What | Rule | On failure |
//! | --- | --- | --- |
//! | Token | header `X-Auth-Token` equals [`MetalSim::token`] | 401 `{"error"}`, not a violation |
//! | Method and path | an operation of the spec (under `/metal/v1`; the template with the most literal segments wins) | 404, violation |
//! | Path parameters | their schema (ids are `format: uuid`) | 422, violation |
//! | Query parameters | declared by the operation; values of the declared type (`types=a&types=b` exploded, `include=a,b` comma lists); scalars once | 422, violation |
//! | Body | JSON, `Content-Type: application/json`, present when required, absent when the operation takes none; valid against the request body schema, `oneOf` meaning "at least one branch" | 422, violation |
//! | Answer | the simulator's own answer against the operation's declared response for that status (a nested object may be `{"href"}` alone, as the spec's introduction says it is when not included) | recorded in [`MetalSim::answer_violations`] |
//!
//! Violations answer 422 `{"errors": [...]}` and are kept in
//! [`MetalSim::violations`]; tests assert both lists empty. Schemas are
//! read as OpenAPI 3.0 (`nullable`), with one deliberate strictness: in
//! requests, objects are closed (an unknown field, such as a misspelt one,
//! is a violation; the real API would most likely ignore it), except
//! schemas used as `allOf` parts. The spec's alias `vrf` for `vrf_id` is
//! therefore refused. Formats (`uuid`, `date-time`, `ipv4`, …) are
//! asserted. Operations the spec has but the simulator does not emulate
//! answer 501 after the check.
//!
//! # Emulated
//!
//! One project ([`MetalSim::project_id`]); metros `da`, `sv`, `ny` (any
//! case, or their UUIDs, see [`METROS`]); answers carry lower-case metro
//! codes and `metro {id, code, name, country}`. Nested resources come back
//! as `{"href"}` unless named in `include` (dotted paths work, `exclude`
//! wins); a metro is always embedded.
//!
//! | Operation | Endpoint | Rules (422 unless noted) |
//! | --- | --- | --- |
//! | VRFs | `GET/POST /projects/{id}/vrfs` (`?metro=` code or id), `GET/PUT/DELETE /vrfs/{id}`, `GET /vrfs/{id}/ips`, `GET /vrfs/{vrf_id}/ips/{id}` | at most [`MAX_VRFS`] per project; `ip_ranges` are network addresses, IPv4 /8–/29, IPv6 /59–/64, not overlapping each other; a PUT's `ip_ranges` replaces the list and **a dropped range deletes every reservation inside it with its gateways and assignments**; `local_asn` cannot change while a VLAN of one of the VRF's gateways is on a port; DELETE (204) refused while the VRF has reservations |
//! | VRF reservations | `POST /projects/{id}/ips` with `type: vrf` | the VRF exists; `network` is the block's first address; IPv4 /22–/29 or IPv6 /64; inside one of the VRF's `ip_ranges`; no overlap with another reservation of the VRF; one IPv6 /64 per VRF. `state: created`, `gateway` = first usable address |
//! | Public reservations | `POST /projects/{id}/ips` with `type: public_ipv4` | `quantity` a power of two 1–256 and a known `metro`; the block comes from 198.18.0.0/15 (fake). Other types are refused (not emulated) |
//! | Reservation lists | `GET /projects/{id}/ips?types=…&page=&per_page=` | paginated (`per_page` default 250), `meta {current_page, last_page, total, first, last, self, next, previous}` |
//! | Addresses | `GET/PATCH/DELETE /ips/{id}` | reservations (`type: vrf`/`public_ipv4`) and assignments (`type: IPAssignment`); DELETE of a reservation with a gateway (in any state): `… Cannot delete with associated metal gateway`; with assignments: refused; of an assignment: unassigns (204) |
//! | Assignments | `GET/POST /devices/{id}/ips` | `address` (`a.b.c.d`, or with the reservation's prefix or a host prefix) inside one of the project's reservations in the device's metro, not assigned already. Answer `type: IPAssignment`, `assigned_to {href}`, `parent_block` |
//! | Devices, ports | `GET /devices/{id}`, `GET /ports/{id}`, `POST /ports/{id}/assign`, `POST /ports/{id}/unassign` | devices are seeded ([`MetalSim::add_device`]: `active`; [`MetalSim::add_device_in_state`]: any of [`DEVICE_STATES`]) and answer their `state`; the test moves them on ([`MetalSim::set_device_state`]) and deletes them ([`MetalSim::delete_device`]: the device, its ports and its assignments are gone, 404 afterwards); `vnid` is a VLAN UUID or number in the device's metro; `Virtual network N already assigned` / `… not assigned` |
//! | VLANs | `GET/POST /projects/{id}/virtual-networks` (`?metro=`), `GET/PUT/DELETE /virtual-networks/{id}` | `metro` required; `vxlan` 2–3999, unique per project **and metro**, omitted: next free in 1000–1999; list without `meta`; DELETE (204) refused with `Cannot delete Virtual Network when port is assigned` while on a port, and while a gateway uses it |
//! | Metal Gateways | `GET/POST /projects/{project_id}/metal-gateways`, `GET/DELETE /metal-gateways/{id}` | VLAN and reservation exist, same metro; one gateway per reservation; one IPv6 reservation per VLAN. 201 `state: ready`; DELETE 202 `state: deleting`; once gone, a GET answers **403** `Access denied for the current authentication token` (as Metal's did), not 404. List paginated under `metal_gateways` (`per_page` default 10) |
//! | Events | `GET /projects/{id}/events` | newest first (in the order of the changes; `created_at` has whole seconds, so events may share it), paginated; `vrf.created`, `vrf.updated`, `vrf.deleted`, `ip_reservation.created/deleted`, `ip_assignment.created/deleted`, `virtual_network.created/deleted`, `metal_gateway.created/deleted`, `instance.state_changed` ([`MetalSim::set_device_state`], body `Device <id> is now <state>`), `instance.deleted` ([`MetalSim::delete_device`]; no `ip_assignment.deleted` for the addresses it unassigns), with `relationships` (the resource's href, e.g. `/metal/v1/devices/<id>`, then the project's). Seeding with `add_device*` records none |
//!
//! **Eventual states, without a clock.** A gateway answers `ready` to its
//! first [`SimConfig::gateway_reads`] reads (GET or list; default 1), then
//! `active`; after DELETE it answers `deleting` to as many reads and is
//! then gone (404). While it exists, in any state, its reservation and VLAN
//! cannot be deleted. [`MetalSim::settle`] finishes every transition.
//!
//! **Pagination.** [`MetalSim::set_max_per_page`] caps pages below the
//! client's `per_page`, as a server may, so that lists of a few items span
//! pages.
//!
//! # Faults
//!
//! [`MetalSim::inject`] makes the next `times` requests matching a method
//! (`"*"` for any) and a route (an `operationId`, a path template such as
//! `/projects/{id}/ips`, a concrete path with or without `/metal/v1`, or
//! `"*"`) fail with a [`Fault`]: 429 with `Retry-After`, a 5xx, a delay, a
//! dropped connection, or the request applied and then the connection
//! dropped. Faults apply after authentication and route lookup, before the
//! spec check; every answer carries `X-Request-Id`.
//!
//! # Not emulated (deliberate differences)
//!
//! Organizations, several projects, facilities (a VLAN with `facility` is
//! refused, a `facility` filter matches nothing), device creation and
//! deletion over HTTP (the test seeds, moves and deletes devices; their
//! states do not change by themselves), port modes (bond, disbond, convert;
//! `network_type` only reflects where VLANs are: `layer3`, `hybrid-bonded`,
//! `hybrid`), native VLANs, VLAN assignment batches, virtual circuits, BGP,
//! VRF routes, elastic IPs, `private_ipv4`/`global_ipv4`/`public_ipv6`
//! reservations and approvals (`state: pending`), private gateways
//! (`private_ipv4_subnet_size`), the project VLAN limit, sorting and
//! filtering by field, rate limits other than injected ones. Where the real API's
//! behaviour is unknown the simulator takes the stricter side: a VRF with
//! reservations, a reservation with assignments and a VLAN with a gateway
//! cannot be deleted; overlapping ranges in one VRF are refused; the error
//! texts other than those quoted above are ours.

#![warn(missing_docs)]

mod blocking;
mod server;
mod spec;
mod state;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use metal_ipam_core::metal::client::MetalConfig;
use metal_ipam_core::metal::retry::RetryPolicy;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use blocking::BlockingHttp;
pub use spec::BASE_PATH;
pub use state::{
    metro, Assignment, Device, Event, Gateway, GatewayState, Metro, Port, Reservation, Vlan, Vrf,
    DEVICE_STATES, EMULATED, MAX_VRFS, METROS,
};

use server::{FaultRule, Inner, Shared};
use state::{IdGen, State};

/// A failure to inject into matching requests (see [`MetalSim::inject`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// 429 `Too Many Requests` with `Retry-After: retry_after_s`, before
    /// the request is applied.
    RateLimit {
        /// Seconds the client is asked to wait.
        retry_after_s: u64,
    },
    /// This status (e.g. 500, 503) with an `Error` body, before the request
    /// is applied.
    Status(u16),
    /// Waits this many milliseconds, then handles the request normally.
    Latency(u64),
    /// Closes the connection without answering and without applying the
    /// request.
    Drop,
    /// Applies the request, then closes the connection without answering:
    /// it took effect but the client never heard.
    CrashAfter,
}

/// One request the simulator received.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// `GET`, `POST`, ….
    pub method: String,
    /// The URL path, e.g. `/metal/v1/projects/<id>/vrfs`.
    pub path: String,
    /// The raw (still percent-encoded) query string, if any.
    pub query: Option<String>,
    /// The spec's `operationId`, when the route matched one.
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

/// How to start a simulator; [`Default`] is an ephemeral port, a fresh
/// token and project id, gateways settling after one read, no page cap.
#[derive(Debug, Clone, Default)]
pub struct SimConfig {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// The API token; `None`: a fresh random one.
    pub token: Option<String>,
    /// The project id; `None`: a fresh UUID.
    pub project_id: Option<String>,
    /// Reads a new gateway answers `ready` (and a deleted one `deleting`)
    /// before it turns `active` (is gone). `None`: 1.
    pub gateway_reads: Option<u32>,
    /// Largest page size, whatever `per_page` asks (`None`: the request's).
    pub max_per_page: Option<u32>,
}

/// A running simulator; dropping it stops the server.
pub struct MetalSim {
    shared: Arc<Shared>,
    addr: SocketAddr,
    project_id: String,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for MetalSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalSim")
            .field("addr", &self.addr)
            .field("project_id", &self.project_id)
            .finish_non_exhaustive()
    }
}

impl Drop for MetalSim {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl MetalSim {
    /// Starts a simulator with [`SimConfig::default`] on the current tokio
    /// runtime.
    ///
    /// # Panics
    /// If 127.0.0.1:0 cannot be bound.
    pub async fn start() -> MetalSim {
        MetalSim::start_with(SimConfig::default())
            .await
            .expect("bind 127.0.0.1:0")
    }

    /// Starts a simulator as `cfg` says, on the current tokio runtime.
    ///
    /// # Errors
    /// If the port cannot be bound.
    pub async fn start_with(cfg: SimConfig) -> std::io::Result<MetalSim> {
        // Load the spec before serving, so that a broken bundle fails here.
        let _ = spec::spec();
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, cfg.port)).await?;
        let addr = listener.local_addr()?;
        let mut ids = IdGen::new();
        let token = cfg
            .token
            .unwrap_or_else(|| format!("metal-sim-{}", ids.hex()));
        let project_id = cfg.project_id.unwrap_or_else(|| ids.uuid());
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                state: State::new(
                    project_id.clone(),
                    cfg.gateway_reads.unwrap_or(1),
                    cfg.max_per_page,
                ),
                requests: Vec::new(),
                violations: Vec::new(),
                answer_violations: Vec::new(),
                faults: Vec::new(),
                counts: BTreeMap::new(),
            }),
            token,
        });
        let server = tokio::spawn(server::serve(listener, Arc::clone(&shared)));
        Ok(MetalSim {
            shared,
            addr,
            project_id,
            server,
        })
    }

    /// `http://127.0.0.1:<port>/metal/v1`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}{BASE_PATH}", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The token every request must carry in `X-Auth-Token`.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The project's id.
    pub fn project_id(&self) -> &str {
        &self.project_id
    }

    /// A client configuration for this simulator.
    pub fn metal_config(&self, retry: RetryPolicy) -> MetalConfig {
        MetalConfig {
            base_url: self.base_url(),
            token: self.token().to_owned(),
            project_id: self.project_id.clone(),
            retry,
        }
    }

    // -- seeding --------------------------------------------------------------

    /// Adds an `active` device in `metro` (code) with `bond0` and
    /// `eth_ports` ethernet ports (`eth0`, `eth1`, …; 2 for the usual
    /// server), all bonded and without VLANs. `id` should be a UUID (path
    /// ids are checked against the spec's `format: uuid`). Records no
    /// event.
    ///
    /// # Panics
    /// If the metro is unknown or the id is taken.
    pub fn add_device(&self, id: &str, metro: &str, eth_ports: usize) -> Device {
        self.add_device_in_state(id, metro, eth_ports, "active")
    }

    /// Like [`MetalSim::add_device`], the device in `state` (one of
    /// [`DEVICE_STATES`], e.g. `queued` or `provisioning`). Records no
    /// event.
    ///
    /// # Panics
    /// If the metro or the state is unknown, or the id is taken.
    pub fn add_device_in_state(
        &self,
        id: &str,
        metro: &str,
        eth_ports: usize,
        state: &str,
    ) -> Device {
        self.shared
            .lock()
            .state
            .add_device(id, metro, eth_ports, state)
    }

    /// Moves device `id` to `state` (one of [`DEVICE_STATES`]) and records
    /// an event `instance.state_changed`, body `Device <id> is now
    /// <state>`, `relationships` the device's href
    /// (`/metal/v1/devices/<id>`) and the project's. Every call records
    /// one, even when the state does not change. Returns the device as
    /// it now is.
    ///
    /// # Panics
    /// If there is no such device or the state is unknown.
    pub fn set_device_state(&self, id: &str, state: &str) -> Device {
        self.shared
            .lock()
            .state
            .set_device_state(id, state)
            .unwrap_or_else(|e| panic!("MetalSim::set_device_state: {e}"))
    }

    /// Deletes device `id` as its deprovisioning would end: the device
    /// and its ports are gone (`GET /devices/{id}`, `/devices/{id}/ips`,
    /// `POST /devices/{id}/ips` and its ports answer 404), and its IP
    /// assignments are removed (Metal unassigns a deleted device's
    /// addresses; their reservations stay). VLANs that were on its ports
    /// are free again. Records one event `instance.deleted` (device href
    /// and project href in `relationships`), none for the assignments.
    /// Returns the assignments removed, oldest first.
    ///
    /// # Panics
    /// If there is no such device.
    pub fn delete_device(&self, id: &str) -> Vec<Assignment> {
        self.shared
            .lock()
            .state
            .delete_device(id)
            .unwrap_or_else(|e| panic!("MetalSim::delete_device: {e}"))
    }

    /// Puts VLAN `vlan_id` on port `port_id`, as a `POST /ports/{id}/assign`
    /// would (no-op if it is there already).
    ///
    /// # Panics
    /// If the port or VLAN does not exist or they are in different metros.
    pub fn assign_vlan(&self, port_id: &str, vlan_id: &str) {
        self.shared
            .lock()
            .state
            .set_port_vlan(port_id, vlan_id, true)
            .unwrap_or_else(|e| panic!("MetalSim::assign_vlan: {e}"));
    }

    /// Takes VLAN `vlan_id` off port `port_id` (no-op if it is not there).
    ///
    /// # Panics
    /// If the port or VLAN does not exist.
    pub fn unassign_vlan(&self, port_id: &str, vlan_id: &str) {
        self.shared
            .lock()
            .state
            .set_port_vlan(port_id, vlan_id, false)
            .unwrap_or_else(|e| panic!("MetalSim::unassign_vlan: {e}"));
    }

    /// Sets how many reads gateways created or deleted from now on take to
    /// settle (see [`SimConfig::gateway_reads`]).
    pub fn set_gateway_reads(&self, reads: u32) {
        self.shared.lock().state.gateway_reads = reads;
    }

    /// Caps page sizes (`None` lifts the cap).
    pub fn set_max_per_page(&self, max: Option<u32>) {
        self.shared.lock().state.max_per_page = max;
    }

    /// Finishes every pending transition: `ready` gateways turn `active`,
    /// `deleting` ones are gone.
    pub fn settle(&self) {
        self.shared.lock().state.settle();
    }

    // -- faults ---------------------------------------------------------------

    /// Makes the next `times` requests whose method is `method` (`"*"` for
    /// any) and whose route is `route` (an `operationId` such as
    /// `createVrf`, a template such as `/projects/{id}/vrfs`, a concrete
    /// path, or `"*"`) fail with `fault`. Rules are tried in the order
    /// they were added; each request takes at most one.
    ///
    /// # Panics
    /// If a [`Fault::Status`] is not a 4xx or 5xx.
    pub fn inject(&self, method: &str, route: &str, fault: Fault, times: usize) {
        if let Fault::Status(code) = fault {
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

    /// Drops every pending fault.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    /// How many injected faults are still waiting for requests.
    pub fn pending_faults(&self) -> usize {
        self.shared.lock().faults.iter().map(|f| f.remaining).sum()
    }

    // -- inspection -----------------------------------------------------------

    /// The VRFs, oldest first.
    pub fn vrfs(&self) -> Vec<Vrf> {
        self.shared.lock().state.vrfs.clone()
    }

    /// The IP reservations, oldest first.
    pub fn reservations(&self) -> Vec<Reservation> {
        self.shared.lock().state.reservations.clone()
    }

    /// The device IP assignments, oldest first.
    pub fn assignments(&self) -> Vec<Assignment> {
        self.shared.lock().state.assignments.clone()
    }

    /// The VLANs, oldest first.
    pub fn vlans(&self) -> Vec<Vlan> {
        self.shared.lock().state.vlans.clone()
    }

    /// The Metal Gateways (including `deleting` ones), oldest first.
    pub fn gateways(&self) -> Vec<Gateway> {
        self.shared.lock().state.gateways.clone()
    }

    /// The devices.
    pub fn devices(&self) -> Vec<Device> {
        self.shared.lock().state.devices.clone()
    }

    /// The project's events, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().state.events.clone()
    }

    /// Requests that broke the spec, one entry per request, as `"METHOD
    /// path: problem; problem"`; each was answered 404 (no such operation)
    /// or 422.
    pub fn violations(&self) -> Vec<String> {
        self.shared.lock().violations.clone()
    }

    /// Answers of the simulator that do not match the spec's declared
    /// response (a bug of the simulator), as `"METHOD path -> status:
    /// problem"`.
    pub fn answer_violations(&self) -> Vec<String> {
        self.shared.lock().answer_violations.clone()
    }

    /// Every request received, in order (faulted and refused ones too).
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// Forgets the recorded requests (not the counters or violations).
    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// Authenticated requests received for an operation (`operationId`,
    /// e.g. `createVrf`), faulted ones included.
    pub fn count(&self, operation_id: &str) -> usize {
        self.shared
            .lock()
            .counts
            .get(operation_id)
            .map_or(0, |c| c.received)
    }

    /// Requests for an operation that took effect (a 2xx outcome, whether
    /// or not the client heard it).
    pub fn applied(&self, operation_id: &str) -> usize {
        self.shared
            .lock()
            .counts
            .get(operation_id)
            .map_or(0, |c| c.applied)
    }
}
