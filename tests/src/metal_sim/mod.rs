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
//! | Devices | `GET /devices/{id}`, `GET /devices/{id}/events` | devices are seeded ([`MetalSim::add_device`]: `active`, 2 or 4 ethernet ports; [`MetalSim::add_device_in_state`]: any of [`DEVICE_STATES`]) and answer their `state` and `network_frozen` ([`MetalSim::set_network_frozen`]); the test moves them on ([`MetalSim::set_device_state`]) and deletes them ([`MetalSim::delete_device`]: the device, its ports, its assignments, its pending port changes and batches are gone, 404 afterwards). `ip_addresses` lists its assignments, management ones too ([`MetalSim::add_management_ips`]). Its events: the project's events whose `relationships` name it |
//! | Ports: VLANs | `GET /ports/{id}`, `POST /ports/{id}/assign`, `POST /ports/{id}/unassign`, `GET /ports/{id}/vlan-assignments[/{assignment_id}]` | `vnid` is a VLAN UUID or number in the device's metro; `Virtual network N already assigned` / `… not assigned`; an ethernet port must be out of its bond (`Port eth1 is bonded: disbond it before assigning virtual networks`), a bond port up (`Port bond0 is not bonded: assign virtual networks to its ethernet ports`). Unassigning the native VLAN clears it. Assignments have stable ids, `state: assigned` (`unassigning` while an `in_progress` batch removes them) |
//! | Ports: modes | `POST /ports/{id}/bond` (`?bulk_enable`), `/disbond` (`?bulk_disable`), `/convert/layer-2` (body `{}`), `/convert/layer-3` (optional `request_ips`) | see [Ports](#ports) below |
//! | Ports: native VLAN | `POST /ports/{id}/native-vlan?vnid=`, `DELETE /ports/{id}/native-vlan` | immediate. The VLAN is on the port (`Virtual network N must be assigned to the port before it can be its native VLAN`), the port has ≥ 2 VLANs (`A native VLAN needs at least 2 virtual networks on the port`), it is not a Layer 3 bond port (`A native VLAN is not supported on the Layer 3 bond port bond0 (hybrid-bonded mode)`); no-ops refused: `Virtual network N is already the native VLAN of the port`, `Port bond0 has no native VLAN` |
//! | Ports: batches | `POST /ports/{id}/vlan-assignments/batches` (201), `GET …/batches`, `GET …/batches/{batch_id}` | `vlan_assignments` `[{vlan, state, native}]`, `vlan` a UUID or number (`state` absent: `assigned`). Refused at once: none (`A batch needs at least one VLAN assignment`), an unknown VLAN, one twice, `native` on an `unassigned` one, two natives, an assignment the port cannot carry (as for assign), a native on a Layer 3 bond. Created `queued`, then `in_progress`, then `completed` over reads ([`SimConfig::batch_reads`]); the changes apply at completion, all or nothing: unassigning a VLAN not there, assigning one there already (`Virtual network N not assigned` / `… already assigned`) or a native VLAN breaking the rules above ends it `failed` with those `error_messages` and nothing changed; so does [`MetalSim::fail_next_batch`] |
//! | VLANs | `GET/POST /projects/{id}/virtual-networks` (`?metro=`), `GET/PUT/DELETE /virtual-networks/{id}` | `metro` required; `vxlan` 2–3999, unique per project **and metro**, omitted: next free in 1000–1999; list without `meta`; DELETE (204) refused with `Cannot delete Virtual Network when port is assigned` while on a port, and while a gateway uses it |
//! | Metal Gateways | `GET/POST /projects/{project_id}/metal-gateways`, `GET/DELETE /metal-gateways/{id}` | VLAN and reservation exist, same metro; one gateway per reservation; one IPv6 reservation per VLAN. 201 `state: ready`; DELETE 202 `state: deleting`; once gone, a GET answers **403** `Access denied for the current authentication token` (as Metal's did), not 404. List paginated under `metal_gateways` (`per_page` default 10) |
//! | Events | `GET /projects/{id}/events` | newest first (in the order of the changes; `created_at` has whole seconds, so events may share it), paginated; `vrf.created`, `vrf.updated`, `vrf.deleted`, `ip_reservation.created/deleted`, `ip_assignment.created/deleted`, `virtual_network.created/deleted`, `metal_gateway.created/deleted`, `instance.state_changed` ([`MetalSim::set_device_state`], body `Device <id> is now <state>`), `instance.deleted` ([`MetalSim::delete_device`]; no `ip_assignment.deleted` for the addresses it unassigns), with `relationships` (the resource's href, e.g. `/metal/v1/devices/<id>`, then the project's); `port.bonded`, `port.disbonded`, `port.converted_to_layer2`, `port.converted_to_layer3` when a mode change takes effect (body e.g. `Device <id>: disbonded eth1; bond0 is now hybrid`; `relationships`: the port the request named, the device, the project). Seeding with `add_device*`, `add_management_ips`, `set_network_frozen` records none |
//!
//! **Eventual states, without a clock.** A gateway answers `ready` to its
//! first [`SimConfig::gateway_reads`] reads (GET or list; default 1), then
//! `active`; after DELETE it answers `deleting` to as many reads and is
//! then gone (404). While it exists, in any state, its reservation and VLAN
//! cannot be deleted. A bond, disbond or convert answers 200 with the
//! port as it was, and so do the next [`SimConfig::port_reads`] reads of
//! the bond's ports or the device (default 1); then it is in effect. A
//! batch moves on as it is read ([`SimConfig::batch_reads`], default 2:
//! `queued` to its creation and first read, `in_progress` to the second,
//! then `completed`). [`MetalSim::settle`] finishes every transition.
//!
//! **Pagination.** [`MetalSim::set_max_per_page`] caps pages below the
//! client's `per_page`, as a server may, so that lists of a few items span
//! pages.
//!
//! # Ports
//!
//! A device has `bond0` = `eth0` + `eth1`, or on 4-port devices `bond0` =
//! `eth0` + `eth2` and `bond1` = `eth1` + `eth3`; each bond changes mode
//! on its own. Per port: `data.bonded` (an ethernet port is in its bond; a
//! bond port is up while one of its members is), Layer 2 or 3 (bond ports),
//! VLANs and a native VLAN. A bond's `network_type` (bond ports only):
//!
//! | Bond | Members | VLANs | `network_type` |
//! | --- | --- | --- | --- |
//! | Layer 3 | all bonded | none on the bond | `layer3` |
//! | Layer 3 | all bonded | on the bond | `hybrid-bonded` |
//! | Layer 3 | one out of the bond | any (on the member out of it) | `hybrid` |
//! | Layer 2 | all bonded | any (on the bond) | `layer2-bonded` |
//! | Layer 2 | one or more out of the bond | any (on the members out of it) | `layer2-individual` |
//!
//! Mode operations (checked in this order; 422 unless noted):
//!
//! - Any: 404 for an unknown port; a frozen device: `This device's network
//!   is frozen: bonding, disbonding and converting between Layer 2 and
//!   Layer 3 are not permitted`; while a mode change of the bond is pending
//!   or a batch of one of its ports is unfinished (and, for VLAN
//!   operations on a port, while its bond changes mode or its own batch
//!   runs): `Another operation is in progress on port <name>; try again
//!   when it has completed`.
//! - `bond`: a bond port, or an ethernet port with `bulk_enable=true`,
//!   bonds every member of the bond; an ethernet port alone itself.
//!   Nothing to bond: `Port <name> is already bonded`; a member with VLANs:
//!   `Port eth1 has virtual networks assigned: unassign them before
//!   bonding it`.
//! - `disbond`: a bond port, or an ethernet port with `bulk_disable=true`,
//!   disbonds every member; an ethernet port alone itself. Nothing to
//!   disbond: `Port <name> is already disbonded`. A Layer 3 bond cannot be
//!   disbonded as a whole (`bond0 is a Layer 3 bond port and cannot be
//!   disbonded; convert it to Layer 2 first`) nor lose its last bonded
//!   member (`Port eth0 is the last bonded port of bond0, which is in
//!   Layer 3: it cannot be disbonded`): in Layer 3 only a member leaves
//!   (layer3 → hybrid). A Layer 2 bond with VLANs cannot lose its last
//!   member (`Port bond0 has virtual networks assigned: unassign them
//!   before disbonding it`).
//! - `convert/layer-2`: bond ports only (`Port eth1 is not a bond port:
//!   only bond ports can be converted to Layer 2`); a Layer 2 bond, and a
//!   hybrid one (as Metal answered hybrid → layer2-bonded,
//!   terraform-provider-equinix #143): `bond0 is already configured for
//!   Layer 2`. VLANs on the bond stay (hybrid-bonded → layer2-bonded); the
//!   bond's management addresses are removed (other assignments, from VRF
//!   or public reservations, stay).
//! - `convert/layer-3`: bond ports only; a Layer 3 bond: one message per
//!   requested kind it has, `The port already has a public IPv4
//!   assignment` (`private IPv4`, `public IPv6`), or `bond0 is already
//!   configured for Layer 3` if it has none of them; VLANs on the bond or a
//!   member: `VLANs must first be unassigned from bond0 and its ports
//!   before converting to Layer 3`; a member out of the bond: `bond0 must
//!   be bonded (all its ports) before converting to Layer 3`.
//!   `request_ips` (`address_family` 4 or 6, no private IPv6, no kind
//!   twice; absent or empty: public IPv4, private IPv4, public IPv6) become
//!   new management addresses of the bond.
//!
//! So layer3 ↔ hybrid-bonded (assign / unassign on the bond), layer3 →
//! hybrid (disbond a member, then assign to it) and back (unassign,
//! bond), layer3 → layer2-bonded (convert/layer-2, assign) and back
//! (unassign, convert/layer-3), layer2-bonded → layer2-individual
//! (unassign from the bond, disbond it) and back (unassign from the
//! members, bond), layer2-individual → layer3 (unassign, bond,
//! convert/layer-3); hybrid → layer2 goes through layer3.
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
//! states do not change by themselves), `PUT /devices/{id}`
//! (`network_frozen` is set by the test), the device-wide network type,
//! the native-VLAN limits of the product docs beyond the rules above (4-port
//! devices take native VLANs here), virtual circuits, BGP,
//! VRF routes, elastic IPs, `private_ipv4`/`global_ipv4`/`public_ipv6`
//! reservations and approvals (`state: pending`), private gateways
//! (`private_ipv4_subnet_size`), the project VLAN limit, sorting and
//! filtering by field, rate limits other than injected ones. Where the real API's
//! behaviour is unknown the simulator takes the stricter side: a VRF with
//! reservations, a reservation with assignments and a VLAN with a gateway
//! cannot be deleted; overlapping ranges in one VRF are refused; port
//! operations are serialised per bond and refuse every no-op; a failed
//! batch changes nothing. The error texts quoted above for VRFs,
//! reservations, VLANs and gateways, and among the port texts `Virtual
//! network N already assigned` / `not assigned`, `bond0 is already
//! configured for Layer 2` and `The port already has a public IPv4
//! assignment`, follow texts Metal was seen answering; the other texts are
//! ours.

#![warn(missing_docs)]

mod blocking;
pub(crate) mod server;
pub(crate) mod spec;
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
    metro, Assignment, BatchEntry, BatchState, Device, Event, Gateway, GatewayState, Metro, Port,
    Reservation, Vlan, VlanBatch, Vrf, DEVICE_STATES, EMULATED, MAX_VRFS, METROS,
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
/// token and project id, gateways settling after one read, port changes
/// after one read, batches after two, no page cap.
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
    /// Reads of a port (`GET /ports/{id}` of a port of the bond, or `GET
    /// /devices/{id}`) that still answer the state from before an
    /// accepted bond, disbond or convert; the change shows from the next
    /// read on. 0: the POST's answer shows it already. `None`: 1.
    pub port_reads: Option<u32>,
    /// Reads of a VLAN assignment batch (`GET` of it or of the port's
    /// batch list) until it is finished: the first moves it from `queued`
    /// to `in_progress`, the last to `completed` or `failed` (each read
    /// answers the state before its move). 0: finished at creation.
    /// `None`: 2.
    pub batch_reads: Option<u32>,
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
                    cfg.port_reads.unwrap_or(1),
                    cfg.batch_reads.unwrap_or(2),
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

    /// Creates VLANs `vxlans` in `metro` through the real Metal client (so
    /// each request is checked against the spec like any other); their
    /// `(vxlan, id)` in that order.
    pub async fn create_vlans(&self, metro: &str, vxlans: &[u16]) -> Vec<(u16, String)> {
        use metal_ipam_core::metal::model::VirtualNetworkCreateInput;
        let cfg = self.metal_config(RetryPolicy::default());
        let (metro, vxlans) = (metro.to_owned(), vxlans.to_vec());
        tokio::task::spawn_blocking(move || {
            let http = BlockingHttp::new();
            let env = metal_ipam_core::testing::TestEnv::at(1_000);
            let m = metal_ipam_core::metal::client::Metal::new(&http, &cfg, &env);
            vxlans
                .into_iter()
                .map(|n| {
                    let v = m
                        .create_vlan(&VirtualNetworkCreateInput {
                            metro: metro.clone(),
                            vxlan: Some(n),
                            ..Default::default()
                        })
                        .expect("the simulator creates the VLAN");
                    (n, v.id)
                })
                .collect()
        })
        .await
        .expect("the VLAN task")
    }

    // -- seeding --------------------------------------------------------------

    /// Adds an `active` device in `metro` (code) with `eth_ports`
    /// ethernet ports: 2 (`bond0` = `eth0` + `eth1`, the usual server) or
    /// 4 (`bond0` = `eth0` + `eth2`, `bond1` = `eth1` + `eth3`), all
    /// bonded, Layer 3 (`network_type: layer3`), without VLANs and
    /// without management addresses (see
    /// [`MetalSim::add_management_ips`]). `id` should be a UUID (path ids
    /// are checked against the spec's `format: uuid`). Records no event.
    ///
    /// # Panics
    /// If the metro is unknown, the id is taken or `eth_ports` is not 2
    /// or 4.
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
    /// would (no-op if it is there already), without its mode rules (a
    /// bonded ethernet port takes it too) and whatever is in progress.
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

    /// Gives bond0 of device `id` Metal's default management addresses:
    /// a public IPv4 /31, a private IPv4 /31 and a public IPv6 /127 (fake
    /// blocks: 100.64.0.0/11, 100.96.0.0/11, 2001:db8:ffff::/48), listed
    /// in the device's `ip_addresses` and `GET /devices/{id}/ips` with
    /// `management: true`. Converting bond0 to Layer 2 removes them;
    /// converting it back to Layer 3 gives new ones. Records no event.
    /// Returns them.
    ///
    /// # Panics
    /// If there is no such device, its bond0 is in Layer 2 or has
    /// management addresses already.
    pub fn add_management_ips(&self, id: &str) -> Vec<Assignment> {
        self.shared
            .lock()
            .state
            .add_management_ips(id)
            .unwrap_or_else(|e| panic!("MetalSim::add_management_ips: {e}"))
    }

    /// Sets device `id`'s `network_frozen`: while it is true, bond,
    /// disbond and convert on its ports answer 422 (VLAN operations are
    /// not affected). Records no event. Returns the device.
    ///
    /// # Panics
    /// If there is no such device.
    pub fn set_network_frozen(&self, id: &str, frozen: bool) -> Device {
        self.shared
            .lock()
            .state
            .set_network_frozen(id, frozen)
            .unwrap_or_else(|e| panic!("MetalSim::set_network_frozen: {e}"))
    }

    /// Makes the next VLAN assignment batch created on port `port_id` end
    /// `failed` with `error_messages: [message]`, changing nothing (a
    /// batch the API refuses with a 422 does not use it up).
    ///
    /// # Panics
    /// If there is no such port.
    pub fn fail_next_batch(&self, port_id: &str, message: &str) {
        self.shared
            .lock()
            .state
            .fail_next_batch(port_id, message)
            .unwrap_or_else(|e| panic!("MetalSim::fail_next_batch: {e}"));
    }

    /// Sets how many reads bonds, disbonds and converts accepted from now
    /// on take to show (see [`SimConfig::port_reads`]).
    pub fn set_port_reads(&self, reads: u32) {
        self.shared.lock().state.port_reads = reads;
    }

    /// Sets how many reads batches created from now on take to finish
    /// (see [`SimConfig::batch_reads`]).
    pub fn set_batch_reads(&self, reads: u32) {
        self.shared.lock().state.batch_reads = reads;
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
    /// `deleting` ones are gone, accepted bonds, disbonds and converts
    /// take effect, and unfinished VLAN batches complete (or fail).
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

    /// The devices, as the API shows them (accepted mode changes that
    /// have not taken effect are not in them).
    pub fn devices(&self) -> Vec<Device> {
        self.shared.lock().state.devices.clone()
    }

    /// Device `id`, if it exists.
    pub fn device(&self, id: &str) -> Option<Device> {
        self.shared
            .lock()
            .state
            .devices
            .iter()
            .find(|d| d.id == id)
            .cloned()
    }

    /// Bonds, disbonds and converts accepted and not yet in effect.
    pub fn pending_port_changes(&self) -> usize {
        self.shared.lock().state.pending_port_changes()
    }

    /// The VLAN assignment batches, oldest first.
    pub fn batches(&self) -> Vec<VlanBatch> {
        self.shared.lock().state.batches.clone()
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
