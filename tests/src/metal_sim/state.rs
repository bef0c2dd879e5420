//! What the simulator holds (VRFs, reservations, assignments, VLANs,
//! gateways, devices and their ports, events), the rules each operation
//! enforces, and how resources are rendered as API answers.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use metal_ipam_core::ip::{from_u128, subnet_bounds, to_u128, Family};
use serde_json::{json, Value};

use super::spec::BASE_PATH;

#[path = "ports.rs"]
mod ports;

use ports::PendingChange;
pub use ports::{BatchEntry, BatchState, VlanBatch};

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// An error answer: a status and the messages of its `Error` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: u16,
    pub messages: Vec<String>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            messages: vec![message.into()],
        }
    }

    /// A 422, the API's answer to a refused change.
    pub fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::new(422, message)
    }

    pub fn not_found() -> ApiError {
        ApiError::new(404, "Not found")
    }

    /// The `Error` body: `errors` for a 422 or several messages, else
    /// `error`.
    pub fn body(&self) -> Value {
        if self.status == 422 || self.messages.len() != 1 {
            json!({ "errors": self.messages })
        } else {
            json!({ "error": self.messages[0] })
        }
    }
}

fn refuse<T>(message: impl Into<String>) -> Result<T, ApiError> {
    Err(ApiError::unprocessable(message))
}

/// A successful answer: status and JSON body (none for 204).
pub(crate) type Answer = Result<(u16, Option<Value>), ApiError>;

// ---------------------------------------------------------------------------
// Metros, addresses, ids, time
// ---------------------------------------------------------------------------

/// A metro the simulator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metro {
    /// Lower-case code, e.g. `da`.
    pub code: &'static str,
    /// UUID.
    pub id: &'static str,
    /// Name.
    pub name: &'static str,
    /// ISO country code.
    pub country: &'static str,
}

/// The metros: `da`, `sv`, `ny` (made-up UUIDs).
pub const METROS: [Metro; 3] = [
    Metro {
        code: "da",
        id: "108b2cfb-246b-45e3-885a-bf3e82fce1a0",
        name: "Dallas",
        country: "US",
    },
    Metro {
        code: "sv",
        id: "2991b022-b8c4-497e-8db7-5a407c3a209b",
        name: "Silicon Valley",
        country: "US",
    },
    Metro {
        code: "ny",
        id: "96a57b6d-c62c-41b5-ab8e-f8d63a7f9887",
        name: "New York",
        country: "US",
    },
];

/// The metro with this code (any case) or UUID.
pub fn metro(code_or_id: &str) -> Option<&'static Metro> {
    METROS
        .iter()
        .find(|m| m.code.eq_ignore_ascii_case(code_or_id) || m.id.eq_ignore_ascii_case(code_or_id))
}

fn metro_json(code: &str) -> Value {
    let m = metro(code).expect("stored metros are known");
    json!({ "id": m.id, "code": m.code, "name": m.name, "country": m.country })
}

/// An address block: family, first address, prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub family: Family,
    pub start: u128,
    pub prefix: u8,
}

impl Block {
    /// Parses `network/prefix`; the network must be the block's first
    /// address.
    pub fn parse(text: &str) -> Result<Block, String> {
        let (addr, prefix) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a CIDR (address/prefix)"))?;
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| format!("{prefix:?} is not a prefix length"))?;
        Block::new(ip, prefix)
    }

    /// The block of `prefix` starting at `ip`.
    pub fn new(ip: IpAddr, prefix: u8) -> Result<Block, String> {
        let family = Family::of(ip);
        if prefix > family.bits() {
            return Err(format!("/{prefix} is longer than an {family:?} address"));
        }
        let v = to_u128(ip);
        let (start, _) = subnet_bounds(family, v, prefix);
        if start != v {
            return Err(format!(
                "{ip}/{prefix} is not a network address (the block starts at {})",
                from_u128(family, start)
            ));
        }
        Ok(Block {
            family,
            start,
            prefix,
        })
    }

    pub fn end(&self) -> u128 {
        subnet_bounds(self.family, self.start, self.prefix).1
    }

    pub fn contains(&self, family: Family, v: u128) -> bool {
        self.family == family && self.start <= v && v <= self.end()
    }

    pub fn covers(&self, other: &Block) -> bool {
        self.contains(other.family, other.start) && self.contains(other.family, other.end())
    }

    pub fn overlaps(&self, other: &Block) -> bool {
        self.family == other.family && self.start <= other.end() && other.start <= self.end()
    }

    pub fn network(&self) -> IpAddr {
        from_u128(self.family, self.start)
    }

    /// The first usable address: the gateway's.
    pub fn first_usable(&self) -> IpAddr {
        from_u128(self.family, self.start + 1)
    }

    pub fn netmask(&self) -> String {
        let bits = u32::from(self.family.bits());
        let host = bits - u32::from(self.prefix);
        let mask = if host >= 128 {
            0
        } else {
            self.family.max_value() & !((1u128 << host) - 1)
        };
        from_u128(self.family, mask).to_string()
    }

    pub fn address_family(&self) -> u8 {
        match self.family {
            Family::V4 => 4,
            Family::V6 => 6,
        }
    }
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix)
    }
}

/// UUIDs (version 4 layout) from a per-simulator seed and a counter, so
/// ids differ between simulators and never repeat within one.
#[derive(Debug)]
pub(crate) struct IdGen {
    seed: u64,
    next: u64,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A UUID (version 4 layout) made of these bits.
fn uuid_of(hi: u64, lo: u64) -> String {
    let v = (u128::from(hi) << 64 | u128::from(lo)) & !(0xf000u128 << 64) & !(0xc000u128 << 48)
        | (0x4000u128 << 64)
        | (0x8000u128 << 48);
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl IdGen {
    pub fn new() -> IdGen {
        let mut h = RandomState::new().build_hasher();
        h.write_u8(0);
        IdGen {
            seed: h.finish(),
            next: 0,
        }
    }

    pub fn uuid(&mut self) -> String {
        self.next += 1;
        let hi = mix(self.seed ^ self.next);
        let lo = mix(hi ^ self.next.rotate_left(32));
        uuid_of(hi, lo)
    }

    /// 16 hex digits, for tokens.
    pub fn hex(&mut self) -> String {
        self.next += 1;
        format!("{:016x}", mix(self.seed ^ self.next))
    }
}

/// Now as RFC 3339 UTC with seconds.
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Unix seconds as `YYYY-MM-DDThh:mm:ssZ`: the core's one formatter.
pub(crate) use metal_ipam_core::kube::meta::rfc3339;

fn href(kind: &str, id: &str) -> String {
    format!("{BASE_PATH}/{kind}/{id}")
}

fn href_obj(kind: &str, id: &str) -> Value {
    json!({ "href": href(kind, id) })
}

// ---------------------------------------------------------------------------
// Records (public snapshots)
// ---------------------------------------------------------------------------

/// A VRF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vrf {
    /// UUID.
    pub id: String,
    /// Name.
    pub name: String,
    /// Description.
    pub description: Option<String>,
    /// Metro code.
    pub metro: String,
    /// Ranges reservations may be made in, as given (CIDRs).
    pub ip_ranges: Vec<String>,
    /// Local ASN.
    pub local_asn: Option<u64>,
    /// Tags.
    pub tags: Vec<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
    bgp: [bool; 3],
}

/// An IP reservation: a VRF block or a (fake) public IPv4 block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// UUID.
    pub id: String,
    /// `vrf` or `public_ipv4`.
    pub kind: String,
    /// The VRF of a `vrf` reservation.
    pub vrf_id: Option<String>,
    /// Metro code.
    pub metro: String,
    /// First address.
    pub network: String,
    /// Prefix length.
    pub cidr: u8,
    /// The gateway address (the first usable one).
    pub gateway: String,
    /// Free text.
    pub details: Option<String>,
    /// Metadata.
    pub customdata: Value,
    /// Tags.
    pub tags: Vec<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
    block: Block,
}

/// An address assigned to a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// UUID.
    pub id: String,
    /// The device.
    pub device_id: String,
    /// The reservation the address comes from.
    pub reservation_id: String,
    /// The address.
    pub address: String,
    /// Prefix length (as given, else the reservation's).
    pub cidr: u8,
    /// Metadata.
    pub customdata: Value,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// A management address of a Layer 3 bond (Metal's own; see
    /// `MetalSim::add_management_ips` and `convert/layer-3`): it has no
    /// reservation in the simulator (`reservation_id` is empty) and goes
    /// away when its bond is converted to Layer 2.
    pub management: bool,
    /// The bond port a management address is on.
    pub port_id: Option<String>,
    family: Family,
    value: u128,
    /// Whether a management address is public.
    public: bool,
}

/// A VLAN (virtual network).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vlan {
    /// UUID.
    pub id: String,
    /// VLAN number.
    pub vxlan: u16,
    /// Metro code.
    pub metro: String,
    /// Description.
    pub description: Option<String>,
    /// Tags.
    pub tags: Vec<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
}

/// A Metal Gateway's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayState {
    /// Created, not yet active.
    Ready,
    /// Active.
    Active,
    /// Being deleted; disappears after enough reads.
    Deleting,
}

impl GatewayState {
    fn as_str(self) -> &'static str {
        match self {
            GatewayState::Ready => "ready",
            GatewayState::Active => "active",
            GatewayState::Deleting => "deleting",
        }
    }
}

/// A Metal Gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// UUID.
    pub id: String,
    /// The VLAN.
    pub vlan_id: String,
    /// The reservation.
    pub reservation_id: String,
    /// The VRF, for a VRF gateway.
    pub vrf_id: Option<String>,
    /// State.
    pub state: GatewayState,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Reads left before the state moves on.
    pub reads_left: u32,
}

/// The states a device may be in (the spec's `Device.state` enum).
pub const DEVICE_STATES: &[&str] = &[
    "queued",
    "provisioning",
    "deprovisioning",
    "reinstalling",
    "active",
    "inactive",
    "failed",
    "powering_on",
    "powering_off",
    "deleted",
];

/// A device (seeded, never created over HTTP; its state changes and its
/// deletion are driven by the test, see `MetalSim::set_device_state`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// UUID.
    pub id: String,
    /// Hostname.
    pub hostname: String,
    /// Metro code.
    pub metro: String,
    /// One of [`DEVICE_STATES`], e.g. `active`.
    pub state: String,
    /// Whether network mode changes (bond, disbond, convert) are refused
    /// (`MetalSim::set_network_frozen`).
    pub network_frozen: bool,
    /// The bond ports first (`bond0`, then `bond1` on 4-port devices),
    /// then `eth0`, `eth1`, ….
    pub ports: Vec<Port>,
}

impl Device {
    /// The port named `name` (`bond0`, `eth1`).
    pub fn port(&self, name: &str) -> Option<&Port> {
        self.ports.iter().find(|p| p.name == name)
    }
}

/// A device port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// UUID.
    pub id: String,
    /// `bond0`, `eth0`, ….
    pub name: String,
    /// Whether it is a bond port.
    pub is_bond: bool,
    /// `data.bonded`: an ethernet port is in its bond; a bond port is up
    /// (at least one of its ethernet ports is bonded).
    pub bonded: bool,
    /// A bond port in Layer 2 (`false`: Layer 3; always `false` on
    /// ethernet ports).
    pub layer2: bool,
    /// An ethernet port's bond (`bond0`, `bond1`); `None` on bond ports.
    pub bond: Option<String>,
    /// VLAN ids assigned to it.
    pub vlans: Vec<String>,
    /// The native VLAN, if any.
    pub native_vlan: Option<String>,
}

/// A project event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// UUID.
    pub id: String,
    /// e.g. `vrf.created`.
    pub kind: String,
    /// Text.
    pub body: String,
    /// Hrefs of the resources it concerns.
    pub relationships: Vec<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
}

// ---------------------------------------------------------------------------
// include / exclude
// ---------------------------------------------------------------------------

/// The `include` and `exclude` lists of a request, as dotted paths.
#[derive(Debug, Clone, Default)]
pub(crate) struct Inc {
    include: Vec<Vec<String>>,
    exclude: Vec<Vec<String>>,
}

impl Inc {
    pub fn from_query(query: &[(String, String)]) -> Inc {
        let list = |name: &str| -> Vec<Vec<String>> {
            query
                .iter()
                .filter(|(k, _)| k == name)
                .flat_map(|(_, v)| v.split(','))
                .filter(|s| !s.is_empty())
                .map(|s| s.split('.').map(str::to_owned).collect())
                .collect()
        };
        Inc {
            include: list("include"),
            exclude: list("exclude"),
        }
    }

    /// Whether the nested object `name` is rendered in full.
    fn has(&self, name: &str) -> bool {
        self.include.iter().any(|p| p[0] == name) && !self.exclude.iter().any(|p| p == &[name])
    }

    /// The lists as seen from inside `name`.
    fn child(&self, name: &str) -> Inc {
        let sub = |paths: &[Vec<String>]| {
            paths
                .iter()
                .filter(|p| p.len() > 1 && p[0] == name)
                .map(|p| p[1..].to_vec())
                .collect()
        };
        Inc {
            include: sub(&self.include),
            exclude: sub(&self.exclude),
        }
    }
}

// ---------------------------------------------------------------------------
// The state
// ---------------------------------------------------------------------------

/// Largest number of VRFs in a project.
pub const MAX_VRFS: usize = 8;

/// The fake range public IPv4 reservations come from (198.18.0.0/15,
/// reserved for benchmarking, never routed).
const PUBLIC_V4: (u128, u128) = (0xc612_0000, 0xc613_ffff);

/// One request, as the operations need it.
pub(crate) struct Call<'a> {
    pub op: &'a str,
    pub path: &'a BTreeMap<String, String>,
    pub query: &'a [(String, String)],
    pub body: Option<&'a Value>,
    pub inc: Inc,
    /// The operation's default `per_page`, if it is paginated.
    pub default_per_page: Option<u32>,
    /// The request path (relative to the base), for pagination links.
    pub rel_path: &'a str,
}

impl Call<'_> {
    fn param(&self, name: &str) -> &str {
        self.path.get(name).map_or("", String::as_str)
    }

    fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn field(&self, name: &str) -> Option<&Value> {
        self.body.and_then(|b| b.get(name)).filter(|v| !v.is_null())
    }

    fn str_field(&self, name: &str) -> Option<&str> {
        self.field(name).and_then(Value::as_str)
    }

    fn tags(&self) -> Option<Vec<String>> {
        self.field("tags").and_then(Value::as_array).map(|tags| {
            tags.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
    }
}

/// Everything the simulator holds, behind one mutex.
#[derive(Debug)]
pub(crate) struct State {
    pub project_id: String,
    pub gateway_reads: u32,
    pub max_per_page: Option<u32>,
    pub ids: IdGen,
    pub vrfs: Vec<Vrf>,
    pub reservations: Vec<Reservation>,
    pub assignments: Vec<Assignment>,
    pub vlans: Vec<Vlan>,
    pub gateways: Vec<Gateway>,
    pub devices: Vec<Device>,
    /// Oldest first.
    pub events: Vec<Event>,
    /// Gateways deleted so far: a GET of one answers 403, as Metal's did.
    pub deleted_gateways: Vec<String>,
    /// Reads of a port (or its device) that still show the state before
    /// a bond, disbond or convert.
    pub port_reads: u32,
    /// Reads of a VLAN assignment batch before it is finished.
    pub batch_reads: u32,
    /// Mode changes accepted but not yet in effect, oldest first.
    pending: Vec<PendingChange>,
    /// VLAN assignment batches, oldest first.
    pub batches: Vec<VlanBatch>,
    /// Port id → the error message its next batch fails with.
    fail_batches: BTreeMap<String, String>,
    /// Management address blocks handed out so far.
    mgmt_next: u32,
}

impl State {
    pub fn new(
        project_id: String,
        gateway_reads: u32,
        max_per_page: Option<u32>,
        port_reads: u32,
        batch_reads: u32,
    ) -> State {
        State {
            project_id,
            gateway_reads,
            max_per_page,
            port_reads,
            batch_reads,
            pending: Vec::new(),
            batches: Vec::new(),
            fail_batches: BTreeMap::new(),
            mgmt_next: 0,
            ids: IdGen::new(),
            vrfs: Vec::new(),
            reservations: Vec::new(),
            assignments: Vec::new(),
            vlans: Vec::new(),
            gateways: Vec::new(),
            devices: Vec::new(),
            events: Vec::new(),
            deleted_gateways: Vec::new(),
        }
    }

    /// Records an event. The list's order is the order of the changes
    /// (`events` is a `Vec`, answered newest first); `created_at` has
    /// whole seconds, so events of the same second share it, and it never
    /// goes below the previous event's (a clock stepping back does not
    /// reorder them). Ids are random-looking UUIDs, not ordered.
    fn event(&mut self, kind: &str, body: String, resource: String) {
        let project = href("projects", &self.project_id);
        self.event_about(kind, body, vec![resource, project]);
    }

    /// Records an event with these `relationships` (hrefs).
    fn event_about(&mut self, kind: &str, body: String, relationships: Vec<String>) {
        let id = self.ids.uuid();
        let mut created_at = now_rfc3339();
        if let Some(last) = self.events.last() {
            // Same fixed-width format: the strings compare as the times do.
            if last.created_at > created_at {
                created_at.clone_from(&last.created_at);
            }
        }
        self.events.push(Event {
            id,
            kind: kind.to_owned(),
            body,
            relationships,
            created_at,
        });
    }

    // -- seeding --------------------------------------------------------------

    /// Adds a device in `state` with `eth_ports` (2 or 4) ethernet ports:
    /// `bond0` = `eth0` + `eth1`, or `bond0` = `eth0` + `eth2` and `bond1`
    /// = `eth1` + `eth3`; all bonded, Layer 3, without VLANs.
    pub fn add_device(
        &mut self,
        id: &str,
        metro_code: &str,
        eth_ports: usize,
        state: &str,
    ) -> Device {
        let m = metro(metro_code).unwrap_or_else(|| panic!("unknown metro {metro_code:?}"));
        check_device_state(state);
        assert!(
            !self.devices.iter().any(|d| d.id == id),
            "device {id} exists already"
        );
        assert!(
            matches!(eth_ports, 2 | 4),
            "a device has 2 or 4 ethernet ports, not {eth_ports}"
        );
        let bonds = eth_ports / 2;
        let mut ports = Vec::new();
        for b in 0..bonds {
            ports.push(Port {
                id: self.ids.uuid(),
                name: format!("bond{b}"),
                is_bond: true,
                bonded: true,
                layer2: false,
                bond: None,
                vlans: Vec::new(),
                native_vlan: None,
            });
        }
        for i in 0..eth_ports {
            ports.push(Port {
                id: self.ids.uuid(),
                name: format!("eth{i}"),
                is_bond: false,
                bonded: true,
                layer2: false,
                bond: Some(format!("bond{}", i % bonds)),
                vlans: Vec::new(),
                native_vlan: None,
            });
        }
        let device = Device {
            id: id.to_owned(),
            hostname: format!("sim-{}", &id[..id.len().min(8)]),
            metro: m.code.to_owned(),
            state: state.to_owned(),
            network_frozen: false,
            ports,
        };
        self.devices.push(device.clone());
        device
    }

    /// Moves a device to `state` and records an `instance.state_changed`
    /// event (one per call, even when the state is unchanged).
    pub fn set_device_state(&mut self, id: &str, state: &str) -> Result<Device, String> {
        check_device_state(state);
        let d = self
            .devices
            .iter_mut()
            .find(|d| d.id == id)
            .ok_or_else(|| format!("no device {id}"))?;
        d.state = state.to_owned();
        let d = d.clone();
        self.event(
            "instance.state_changed",
            format!("Device {id} is now {state}"),
            href("devices", id),
        );
        Ok(d)
    }

    /// Removes a device with its ports and its IP assignments (which are
    /// returned, oldest first) and records an `instance.deleted` event.
    pub fn delete_device(&mut self, id: &str) -> Result<Vec<Assignment>, String> {
        if !self.devices.iter().any(|d| d.id == id) {
            return Err(format!("no device {id}"));
        }
        self.forget_ports_of(id);
        self.devices.retain(|d| d.id != id);
        let (gone, kept) = std::mem::take(&mut self.assignments)
            .into_iter()
            .partition(|a| a.device_id == id);
        self.assignments = kept;
        self.event(
            "instance.deleted",
            format!("Device {id} was deleted"),
            href("devices", id),
        );
        Ok(gone)
    }

    fn port_mut(&mut self, port_id: &str) -> Option<(&mut Port, String)> {
        self.devices.iter_mut().find_map(|d| {
            let metro = d.metro.clone();
            d.ports
                .iter_mut()
                .find(|p| p.id == port_id)
                .map(|p| (p, metro))
        })
    }

    /// Puts a VLAN on a port (or takes it off).
    pub fn set_port_vlan(&mut self, port_id: &str, vlan_id: &str, on: bool) -> Result<(), String> {
        let vlan_metro = self
            .vlans
            .iter()
            .find(|v| v.id == vlan_id)
            .map(|v| v.metro.clone())
            .ok_or_else(|| format!("no VLAN {vlan_id}"))?;
        let (port, metro) = self
            .port_mut(port_id)
            .ok_or_else(|| format!("no port {port_id}"))?;
        if metro != vlan_metro {
            return Err(format!(
                "VLAN {vlan_id} is in {vlan_metro}, the port's device in {metro}"
            ));
        }
        port.vlans.retain(|v| v != vlan_id);
        if on {
            port.vlans.push(vlan_id.to_owned());
        } else if port.native_vlan.as_deref() == Some(vlan_id) {
            port.native_vlan = None;
        }
        Ok(())
    }

    /// Moves every gateway on to its final state, and puts every pending
    /// port change and VLAN batch into effect.
    pub fn settle(&mut self) {
        self.settle_ports();
        let deleting: Vec<String> = self
            .gateways
            .iter()
            .filter(|g| g.state == GatewayState::Deleting)
            .map(|g| g.id.clone())
            .collect();
        for g in &mut self.gateways {
            if g.state == GatewayState::Ready {
                g.state = GatewayState::Active;
                g.reads_left = 0;
            }
        }
        for id in deleting {
            self.remove_gateway(&id);
        }
    }

    // -- dispatch -------------------------------------------------------------

    /// Whether the simulator implements the operation.
    pub fn emulates(op: &str) -> bool {
        EMULATED.contains(&op)
    }

    pub fn dispatch(&mut self, call: &Call<'_>) -> Answer {
        match call.op {
            "findVrfs" => self.find_vrfs(call),
            "createVrf" => self.create_vrf(call),
            "findVrfById" => {
                let v = self.vrf(call.param("id"))?;
                Ok((200, Some(self.vrf_json(&v, &call.inc))))
            }
            "updateVrf" => self.update_vrf(call),
            "deleteVrf" => self.delete_vrf(call.param("id")),
            "findVrfIpReservations" => {
                let vrf = self.vrf(call.param("id"))?;
                let items: Vec<Value> = self
                    .reservations
                    .iter()
                    .filter(|r| r.vrf_id.as_deref() == Some(vrf.id.as_str()))
                    .map(|r| self.reservation_json(r, &call.inc))
                    .collect();
                Ok((200, Some(json!({ "ip_addresses": items }))))
            }
            "findVrfIpReservation" => {
                let vrf = self.vrf(call.param("vrf_id"))?;
                let r = self
                    .reservations
                    .iter()
                    .find(|r| r.id == call.param("id") && r.vrf_id.as_ref() == Some(&vrf.id))
                    .ok_or_else(ApiError::not_found)?;
                Ok((200, Some(self.reservation_json(r, &call.inc))))
            }
            "findIPReservations" => self.find_reservations(call),
            "requestIPReservation" => self.request_reservation(call),
            "findIPAddressById" => self.find_ip(call),
            "updateIPAddress" => self.update_ip(call),
            "deleteIPAddress" => self.delete_ip(call.param("id")),
            "findIPAssignments" => {
                let device = self.device(call.param("id"))?;
                let items: Vec<Value> = self
                    .assignments
                    .iter()
                    .filter(|a| a.device_id == device.id)
                    .map(|a| self.assignment_json(a))
                    .collect();
                Ok((200, Some(json!({ "ip_addresses": items }))))
            }
            "createIPAssignment" => self.assign(call),
            "findDeviceById" => {
                let device = self.device(call.param("id"))?;
                let body = self.device_json(&device, &call.inc);
                self.tick_ports(&device.id, None);
                Ok((200, Some(body)))
            }
            "findDeviceEvents" => {
                let device = self.device(call.param("id"))?;
                let h = href("devices", &device.id);
                let items: Vec<Value> = self
                    .events
                    .iter()
                    .rev()
                    .filter(|e| e.relationships.contains(&h))
                    .map(event_json)
                    .collect();
                self.page(call, "events", items)
            }
            "findVirtualNetworks" => self.find_vlans(call),
            "createVirtualNetwork" => self.create_vlan(call),
            "getVirtualNetwork" => {
                let v = self.vlan(call.param("id"))?;
                Ok((200, Some(self.vlan_json(&v, &call.inc))))
            }
            "updateVirtualNetwork" => self.update_vlan(call),
            "deleteVirtualNetwork" => self.delete_vlan(call.param("id")),
            "findMetalGatewaysByProject" => self.find_gateways(call),
            "createMetalGateway" => self.create_gateway(call),
            "findMetalGatewayById" => self.find_gateway(call),
            "deleteMetalGateway" => self.delete_gateway(call),
            "findProjectEvents" => {
                self.project(call, "id")?;
                let items: Vec<Value> = self.events.iter().rev().map(event_json).collect();
                self.page(call, "events", items)
            }
            "findPortById" => {
                let (device, port) = self.port(call.param("id"))?;
                let body = self.port_json(&device, &port, &call.inc);
                self.tick_ports(&device.id, Some(ports::group(&port)));
                Ok((200, Some(body)))
            }
            "assignPort" => self.port_vlan(call, true),
            "unassignPort" => self.port_vlan(call, false),
            "bondPort" | "disbondPort" | "convertLayer2" | "convertLayer3" => self.mode_op(call),
            "assignNativeVlan" => self.assign_native(call),
            "deleteNativeVlan" => self.delete_native(call),
            "findPortVlanAssignments" => self.port_vlan_assignments(call),
            "findPortVlanAssignmentByPortIdAndAssignmentId" => self.port_vlan_assignment(call),
            "createPortVlanAssignmentBatch" => self.create_batch(call),
            "findPortVlanAssignmentBatches" => self.find_batches(call),
            "findPortVlanAssignmentBatchByPortIdAndBatchId" => self.find_batch(call),
            other => Err(ApiError::new(
                501,
                format!("{other} is in the spec but not emulated by the Metal simulator"),
            )),
        }
    }

    fn project(&self, call: &Call<'_>, param: &str) -> Result<(), ApiError> {
        if call.param(param) == self.project_id {
            Ok(())
        } else {
            Err(ApiError::not_found())
        }
    }

    /// A page of `items` under `key`, with `meta`.
    fn page(&self, call: &Call<'_>, key: &str, items: Vec<Value>) -> Answer {
        let page = call
            .query("page")
            .and_then(|p| p.parse::<u64>().ok())
            .unwrap_or(1)
            .max(1);
        let asked = call
            .query("per_page")
            .and_then(|p| p.parse::<u64>().ok())
            .unwrap_or(u64::from(call.default_per_page.unwrap_or(10)))
            .max(1);
        let per_page = self
            .max_per_page
            .map_or(asked, |cap| asked.min(u64::from(cap).max(1)));
        let total = items.len() as u64;
        let last_page = total.div_ceil(per_page).max(1);
        let start = usize::try_from((page - 1).saturating_mul(per_page)).unwrap_or(usize::MAX);
        let chunk: Vec<Value> = items
            .into_iter()
            .skip(start)
            .take(usize::try_from(per_page).unwrap_or(usize::MAX))
            .collect();
        let link = |p: u64| json!({ "href": format!("{BASE_PATH}{}?page={p}&per_page={per_page}", call.rel_path) });
        let mut meta = json!({
            "current_page": page, "last_page": last_page, "total": total,
            "first": link(1), "last": link(last_page), "self": link(page),
        });
        if page < last_page {
            meta["next"] = link(page + 1);
        }
        if page > 1 {
            meta["previous"] = link((page - 1).min(last_page));
        }
        Ok((200, Some(json!({ key: chunk, "meta": meta }))))
    }

    // -- VRFs -------------------------------------------------------------

    fn vrf(&self, id: &str) -> Result<Vrf, ApiError> {
        self.vrfs
            .iter()
            .find(|v| v.id == id)
            .cloned()
            .ok_or_else(ApiError::not_found)
    }

    fn find_vrfs(&self, call: &Call<'_>) -> Answer {
        self.project(call, "id")?;
        let wanted = match call.query("metro") {
            Some(m) => match metro(m) {
                Some(m) => Some(m.code),
                None => return refuse(format!("Metro {m:?} not found")),
            },
            None => None,
        };
        let items: Vec<Value> = self
            .vrfs
            .iter()
            .filter(|v| wanted.is_none_or(|m| v.metro == m))
            .map(|v| self.vrf_json(v, &call.inc))
            .collect();
        let total = items.len();
        Ok((
            200,
            Some(
                json!({ "vrfs": items, "meta": {"current_page": 1, "last_page": 1, "total": total} }),
            ),
        ))
    }

    /// Parses and checks a VRF's `ip_ranges`.
    fn vrf_ranges(value: &Value) -> Result<Vec<(String, Block)>, ApiError> {
        let mut out: Vec<(String, Block)> = Vec::new();
        for text in value
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            let block = Block::parse(text).map_err(ApiError::unprocessable)?;
            let ok = match block.family {
                Family::V4 => (8..=29).contains(&block.prefix),
                Family::V6 => (59..=64).contains(&block.prefix),
            };
            if !ok {
                return refuse(format!(
                    "IP range {text} has an invalid size: IPv4 ranges must be /8 to /29, IPv6 ranges /59 to /64"
                ));
            }
            if let Some((other, _)) = out.iter().find(|(_, b)| b.overlaps(&block)) {
                return refuse(format!("IP range {text} overlaps IP range {other}"));
            }
            out.push((text.to_owned(), block));
        }
        Ok(out)
    }

    fn create_vrf(&mut self, call: &Call<'_>) -> Answer {
        self.project(call, "id")?;
        let name = call.str_field("name").unwrap_or_default().to_owned();
        let metro_arg = call.str_field("metro").unwrap_or_default();
        let Some(m) = metro(metro_arg) else {
            return refuse(format!("Metro {metro_arg:?} not found"));
        };
        if self.vrfs.len() >= MAX_VRFS {
            return refuse(format!("Project has reached its limit of {MAX_VRFS} VRFs"));
        }
        let ranges = match call.field("ip_ranges") {
            Some(v) => Self::vrf_ranges(v)?,
            None => Vec::new(),
        };
        let bool_field = |n: &str| call.field(n).and_then(Value::as_bool).unwrap_or(false);
        let vrf = Vrf {
            id: self.ids.uuid(),
            name,
            description: call.str_field("description").map(str::to_owned),
            metro: m.code.to_owned(),
            ip_ranges: ranges.into_iter().map(|(t, _)| t).collect(),
            local_asn: call.field("local_asn").and_then(Value::as_u64),
            tags: call.tags().unwrap_or_default(),
            created_at: now_rfc3339(),
            bgp: [
                bool_field("bgp_dynamic_neighbors_enabled"),
                bool_field("bgp_dynamic_neighbors_export_route_map"),
                bool_field("bgp_dynamic_neighbors_bfd_enabled"),
            ],
        };
        self.event(
            "vrf.created",
            format!("VRF {} was created in {}", vrf.name, vrf.metro),
            href("vrfs", &vrf.id),
        );
        self.vrfs.push(vrf.clone());
        Ok((201, Some(self.vrf_json(&vrf, &call.inc))))
    }

    fn update_vrf(&mut self, call: &Call<'_>) -> Answer {
        let vrf = self.vrf(call.param("id"))?;
        let new_ranges = match call.field("ip_ranges") {
            Some(v) => Some(Self::vrf_ranges(v)?),
            None => None,
        };
        if let Some(asn) = call.field("local_asn").and_then(Value::as_u64) {
            if Some(asn) != vrf.local_asn && self.vrf_vlan_on_a_port(&vrf.id) {
                return refuse(
                    "local_asn cannot be updated while a VLAN of the VRF's metal gateway is assigned to an instance",
                );
            }
        }
        if let Some(ranges) = &new_ranges {
            let old: Vec<Block> = vrf
                .ip_ranges
                .iter()
                .filter_map(|t| Block::parse(t).ok())
                .collect();
            let dropped: Vec<Block> = old
                .into_iter()
                .filter(|b| !ranges.iter().any(|(_, n)| n == b))
                .collect();
            let doomed: Vec<String> = self
                .reservations
                .iter()
                .filter(|r| {
                    r.vrf_id.as_deref() == Some(vrf.id.as_str())
                        && dropped.iter().any(|d| d.covers(&r.block))
                })
                .map(|r| r.id.clone())
                .collect();
            for id in doomed {
                self.remove_reservation(&id);
            }
        }
        let v = self
            .vrfs
            .iter_mut()
            .find(|v| v.id == vrf.id)
            .expect("the VRF was just read");
        if let Some(name) = call.str_field("name") {
            v.name = name.to_owned();
        }
        if let Some(d) = call.str_field("description") {
            v.description = Some(d.to_owned());
        }
        if let Some(asn) = call.field("local_asn").and_then(Value::as_u64) {
            v.local_asn = Some(asn);
        }
        if let Some(tags) = call.tags() {
            v.tags = tags;
        }
        if let Some(ranges) = new_ranges {
            v.ip_ranges = ranges.into_iter().map(|(t, _)| t).collect();
        }
        for (i, name) in [
            "bgp_dynamic_neighbors_enabled",
            "bgp_dynamic_neighbors_export_route_map",
            "bgp_dynamic_neighbors_bfd_enabled",
        ]
        .iter()
        .enumerate()
        {
            if let Some(b) = call.field(name).and_then(Value::as_bool) {
                v.bgp[i] = b;
            }
        }
        let updated = v.clone();
        self.event(
            "vrf.updated",
            format!("VRF {} was updated", updated.name),
            href("vrfs", &updated.id),
        );
        Ok((200, Some(self.vrf_json(&updated, &call.inc))))
    }

    fn vrf_vlan_on_a_port(&self, vrf_id: &str) -> bool {
        self.gateways
            .iter()
            .filter(|g| g.vrf_id.as_deref() == Some(vrf_id))
            .any(|g| {
                self.devices
                    .iter()
                    .flat_map(|d| &d.ports)
                    .any(|p| p.vlans.contains(&g.vlan_id))
            })
    }

    fn delete_vrf(&mut self, id: &str) -> Answer {
        let vrf = self.vrf(id)?;
        let held = self
            .reservations
            .iter()
            .filter(|r| r.vrf_id.as_deref() == Some(id))
            .count();
        if held > 0 {
            return refuse(format!(
                "Cannot delete VRF {} with {held} IP reservation(s)",
                vrf.name
            ));
        }
        self.vrfs.retain(|v| v.id != id);
        self.event(
            "vrf.deleted",
            format!("VRF {} was deleted", vrf.name),
            href("vrfs", id),
        );
        Ok((204, None))
    }

    // -- IP reservations ------------------------------------------------------

    fn find_reservations(&self, call: &Call<'_>) -> Answer {
        self.project(call, "id")?;
        let types: Vec<&str> = call
            .query
            .iter()
            .filter(|(k, _)| k == "types")
            .map(|(_, v)| v.as_str())
            .collect();
        let items: Vec<Value> = self
            .reservations
            .iter()
            .filter(|r| types.is_empty() || types.contains(&r.kind.as_str()))
            .map(|r| self.reservation_json(r, &call.inc))
            .collect();
        self.page(call, "ip_addresses", items)
    }

    fn request_reservation(&mut self, call: &Call<'_>) -> Answer {
        self.project(call, "id")?;
        match call.str_field("type").unwrap_or_default() {
            "vrf" => self.reserve_vrf_block(call),
            "public_ipv4" => self.reserve_public(call),
            other => refuse(format!(
                "IP reservations of type {other:?} are not emulated by the Metal simulator (vrf and public_ipv4 are)"
            )),
        }
    }

    fn reserve_vrf_block(&mut self, call: &Call<'_>) -> Answer {
        let Some(vrf_id) = call.str_field("vrf_id") else {
            return refuse("vrf_id is required for a VRF IP reservation");
        };
        let Some(vrf) = self.vrfs.iter().find(|v| v.id == vrf_id).cloned() else {
            return refuse(format!("VRF {vrf_id} not found"));
        };
        let network = call.str_field("network").unwrap_or_default();
        let cidr = call.field("cidr").and_then(Value::as_u64).unwrap_or(0);
        let ip: IpAddr = network.parse().map_err(|_| {
            ApiError::unprocessable(format!("network {network:?} is not an IP address"))
        })?;
        let size_ok = match Family::of(ip) {
            Family::V4 => (22..=29).contains(&cidr),
            Family::V6 => cidr == 64,
        };
        if !size_ok {
            return refuse(format!(
                "Invalid subnet size /{cidr}: VRF IP reservations must be IPv4 /22 to /29 or IPv6 /64"
            ));
        }
        let prefix = u8::try_from(cidr).expect("checked above");
        let block = Block::new(ip, prefix).map_err(ApiError::unprocessable)?;
        let inside = vrf
            .ip_ranges
            .iter()
            .filter_map(|t| Block::parse(t).ok())
            .any(|range| range.covers(&block));
        if !inside {
            return refuse(format!(
                "{block} is not within any IP range of VRF {} ({})",
                vrf.name,
                vrf.ip_ranges.join(", ")
            ));
        }
        let mine = || {
            self.reservations
                .iter()
                .filter(|r| r.vrf_id.as_deref() == Some(vrf_id))
        };
        if let Some(other) = mine().find(|r| r.block.overlaps(&block)) {
            return refuse(format!(
                "{block} overlaps the existing VRF IP reservation {}",
                other.block
            ));
        }
        if block.family == Family::V6 && mine().any(|r| r.block.family == Family::V6) {
            return refuse(format!(
                "VRF {} already has an IPv6 /64 reservation; only one is allowed",
                vrf.name
            ));
        }
        let r = Reservation {
            id: self.ids.uuid(),
            kind: "vrf".into(),
            vrf_id: Some(vrf.id.clone()),
            metro: vrf.metro.clone(),
            network: block.network().to_string(),
            cidr: prefix,
            gateway: block.first_usable().to_string(),
            details: call.str_field("details").map(str::to_owned),
            customdata: call.field("customdata").cloned().unwrap_or(json!({})),
            tags: call.tags().unwrap_or_default(),
            created_at: now_rfc3339(),
            block,
        };
        self.event(
            "ip_reservation.created",
            format!("IP reservation {block} was created in VRF {}", vrf.name),
            href("ips", &r.id),
        );
        self.reservations.push(r.clone());
        Ok((201, Some(self.reservation_json(&r, &call.inc))))
    }

    fn reserve_public(&mut self, call: &Call<'_>) -> Answer {
        let quantity = call.field("quantity").and_then(Value::as_u64).unwrap_or(0);
        if !(1..=256).contains(&quantity) || !quantity.is_power_of_two() {
            return refuse(format!(
                "quantity {quantity} is not a power of two between 1 and 256"
            ));
        }
        let Some(m) = call.str_field("metro").and_then(metro) else {
            return refuse("a public_ipv4 reservation needs a known metro");
        };
        let prefix = 32 - u8::try_from(quantity.trailing_zeros()).expect("small");
        let size = u128::from(quantity);
        let mut start = PUBLIC_V4.0;
        let taken: Vec<Block> = self.reservations.iter().map(|r| r.block).collect();
        while start + size - 1 <= PUBLIC_V4.1 {
            let candidate = Block {
                family: Family::V4,
                start,
                prefix,
            };
            if !taken.iter().any(|b| b.overlaps(&candidate)) {
                let r = Reservation {
                    id: self.ids.uuid(),
                    kind: "public_ipv4".into(),
                    vrf_id: None,
                    metro: m.code.to_owned(),
                    network: candidate.network().to_string(),
                    cidr: prefix,
                    gateway: candidate.first_usable().to_string(),
                    details: call.str_field("details").map(str::to_owned),
                    customdata: call.field("customdata").cloned().unwrap_or(json!({})),
                    tags: call.tags().unwrap_or_default(),
                    created_at: now_rfc3339(),
                    block: candidate,
                };
                self.event(
                    "ip_reservation.created",
                    format!("IP reservation {candidate} was created in {}", m.code),
                    href("ips", &r.id),
                );
                self.reservations.push(r.clone());
                return Ok((201, Some(self.reservation_json(&r, &call.inc))));
            }
            start += size;
        }
        refuse("the simulator's public IPv4 range is exhausted")
    }

    fn find_ip(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("id");
        if let Some(r) = self.reservations.iter().find(|r| r.id == id) {
            return Ok((200, Some(self.reservation_json(r, &call.inc))));
        }
        if let Some(a) = self.assignments.iter().find(|a| a.id == id) {
            return Ok((200, Some(self.assignment_json(a))));
        }
        Err(ApiError::not_found())
    }

    fn update_ip(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("id").to_owned();
        let details = call.str_field("details").map(str::to_owned);
        let customdata = call.field("customdata").cloned();
        let tags = call.tags();
        if let Some(r) = self.reservations.iter_mut().find(|r| r.id == id) {
            if details.is_some() {
                r.details = details;
            }
            if let Some(c) = customdata {
                r.customdata = c;
            }
            if let Some(t) = tags {
                r.tags = t;
            }
            let r = r.clone();
            return Ok((200, Some(self.reservation_json(&r, &call.inc))));
        }
        if let Some(a) = self.assignments.iter_mut().find(|a| a.id == id) {
            if let Some(c) = customdata {
                a.customdata = c;
            }
            let a = a.clone();
            return Ok((200, Some(self.assignment_json(&a))));
        }
        Err(ApiError::not_found())
    }

    fn delete_ip(&mut self, id: &str) -> Answer {
        if let Some(a) = self.assignments.iter().find(|a| a.id == id).cloned() {
            self.assignments.retain(|x| x.id != id);
            self.event(
                "ip_assignment.deleted",
                format!(
                    "IP address {}/{} was unassigned from device {}",
                    a.address, a.cidr, a.device_id
                ),
                href("ips", id),
            );
            return Ok((204, None));
        }
        let Some(r) = self.reservations.iter().find(|r| r.id == id).cloned() else {
            return Err(ApiError::not_found());
        };
        if self.gateways.iter().any(|g| g.reservation_id == id) {
            return refuse(format!(
                "IP Reservation \"{}\" error: Cannot delete with associated metal gateway",
                r.block
            ));
        }
        let assigned = self
            .assignments
            .iter()
            .filter(|a| a.reservation_id == id)
            .count();
        if assigned > 0 {
            return refuse(format!(
                "IP Reservation \"{}\" error: Cannot delete with {assigned} assigned IP address(es)",
                r.block
            ));
        }
        self.remove_reservation(id);
        Ok((204, None))
    }

    /// Removes a reservation with its gateways and assignments (a VRF range
    /// dropped by an update; a plain delete has checked there are none).
    fn remove_reservation(&mut self, id: &str) {
        let gateways: Vec<String> = self
            .gateways
            .iter()
            .filter(|g| g.reservation_id == id)
            .map(|g| g.id.clone())
            .collect();
        for g in gateways {
            self.remove_gateway(&g);
        }
        let assignments: Vec<String> = self
            .assignments
            .iter()
            .filter(|a| a.reservation_id == id)
            .map(|a| a.id.clone())
            .collect();
        for a in assignments {
            self.assignments.retain(|x| x.id != a);
            self.event(
                "ip_assignment.deleted",
                "IP address was unassigned: its reservation was deleted".into(),
                href("ips", &a),
            );
        }
        if let Some(r) = self.reservations.iter().find(|r| r.id == id).cloned() {
            self.reservations.retain(|x| x.id != id);
            self.event(
                "ip_reservation.deleted",
                format!("IP reservation {} was deleted", r.block),
                href("ips", id),
            );
        }
    }

    // -- assignments and devices ----------------------------------------------

    fn device(&self, id: &str) -> Result<Device, ApiError> {
        self.devices
            .iter()
            .find(|d| d.id == id)
            .cloned()
            .ok_or_else(ApiError::not_found)
    }

    fn assign(&mut self, call: &Call<'_>) -> Answer {
        let device = self.device(call.param("id"))?;
        let text = call.str_field("address").unwrap_or_default();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| {
            ApiError::unprocessable(format!("address {text:?} is not an IP address"))
        })?;
        let family = Family::of(ip);
        let v = to_u128(ip);
        let Some(r) = self
            .reservations
            .iter()
            .find(|r| r.block.contains(family, v))
            .cloned()
        else {
            return refuse(format!(
                "Address {addr} is not within any IP reservation of the project"
            ));
        };
        let cidr = match prefix {
            None => r.cidr,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p == r.cidr || p == family.bits() => p,
                _ => {
                    return refuse(format!(
                        "{text}: the prefix must be the reservation's (/{}) or a single address",
                        r.cidr
                    ))
                }
            },
        };
        if r.metro != device.metro {
            return refuse(format!(
                "IP reservation {} is in {}, device {} in {}",
                r.block, r.metro, device.id, device.metro
            ));
        }
        if let Some(other) = self
            .assignments
            .iter()
            .find(|a| a.family == family && a.value == v)
        {
            return refuse(format!(
                "Address {addr} is already assigned (to device {})",
                other.device_id
            ));
        }
        let a = Assignment {
            id: self.ids.uuid(),
            device_id: device.id.clone(),
            reservation_id: r.id.clone(),
            address: ip.to_string(),
            cidr,
            customdata: call.field("customdata").cloned().unwrap_or(json!({})),
            created_at: now_rfc3339(),
            management: false,
            port_id: None,
            family,
            value: v,
            public: false,
        };
        self.event(
            "ip_assignment.created",
            format!(
                "IP address {ip}/{cidr} was assigned to device {}",
                device.id
            ),
            href("ips", &a.id),
        );
        self.assignments.push(a.clone());
        Ok((201, Some(self.assignment_json(&a))))
    }

    fn port(&self, port_id: &str) -> Result<(Device, Port), ApiError> {
        self.devices
            .iter()
            .find_map(|d| {
                d.ports
                    .iter()
                    .find(|p| p.id == port_id)
                    .map(|p| (d.clone(), p.clone()))
            })
            .ok_or_else(ApiError::not_found)
    }

    /// The VLAN `vnid` (a UUID, or a VLAN number in the device's metro)
    /// names.
    fn resolve_vlan(&self, device: &Device, vnid: &str) -> Result<Vlan, ApiError> {
        self.vlans
            .iter()
            .find(|v| v.id == vnid || (v.metro == device.metro && v.vxlan.to_string() == vnid))
            .cloned()
            .ok_or_else(|| ApiError::unprocessable(format!("Virtual network {vnid} not found")))
    }

    fn port_vlan(&mut self, call: &Call<'_>, on: bool) -> Answer {
        let (device, port) = self.port(call.param("id"))?;
        self.check_vlan_op_free(&device, &port)?;
        let vnid = call.str_field("vnid").unwrap_or_default();
        let vlan = self.resolve_vlan(&device, vnid)?;
        let assigned = port.vlans.contains(&vlan.id);
        if on && assigned {
            return refuse(format!("Virtual network {} already assigned", vlan.vxlan));
        }
        if !on && !assigned {
            return refuse(format!("Virtual network {} not assigned", vlan.vxlan));
        }
        if on {
            ports::check_can_carry_vlans(&port)?;
        }
        self.set_port_vlan(&port.id, &vlan.id, on)
            .map_err(ApiError::unprocessable)?;
        let (device, port) = self.port(&port.id)?;
        Ok((200, Some(self.port_json(&device, &port, &call.inc))))
    }

    // -- VLANs ------------------------------------------------------------

    fn vlan(&self, id: &str) -> Result<Vlan, ApiError> {
        self.vlans
            .iter()
            .find(|v| v.id == id)
            .cloned()
            .ok_or_else(ApiError::not_found)
    }

    fn find_vlans(&self, call: &Call<'_>) -> Answer {
        self.project(call, "id")?;
        let wanted = call.query("metro").map(|m| metro(m).map(|m| m.code));
        let facility = call.query("facility").is_some();
        let items: Vec<Value> = self
            .vlans
            .iter()
            .filter(|v| !facility && wanted.is_none_or(|m| m == Some(v.metro.as_str())))
            .map(|v| self.vlan_json(v, &call.inc))
            .collect();
        Ok((200, Some(json!({ "virtual_networks": items }))))
    }

    fn create_vlan(&mut self, call: &Call<'_>) -> Answer {
        self.project(call, "id")?;
        if call.field("facility").is_some() {
            return refuse("facility VLANs are not emulated by the Metal simulator; give a metro");
        }
        let Some(arg) = call.str_field("metro") else {
            return refuse("metro is required");
        };
        let Some(m) = metro(arg) else {
            return refuse(format!("Metro {arg:?} not found"));
        };
        let used = |n: u16| self.vlans.iter().any(|v| v.metro == m.code && v.vxlan == n);
        let vxlan = match call.field("vxlan").map(Value::as_u64) {
            Some(Some(n)) => {
                let Some(n) = u16::try_from(n).ok().filter(|n| (2..=3999).contains(n)) else {
                    return refuse(format!("vxlan {n} is out of range (2-3999)"));
                };
                if used(n) {
                    return refuse(format!(
                        "vxlan {n} is already in use in metro {} for this project",
                        m.code
                    ));
                }
                n
            }
            _ => match (1000..=1999).find(|n| !used(*n)) {
                Some(n) => n,
                None => return refuse("no free VLAN number in 1000-1999"),
            },
        };
        let vlan = Vlan {
            id: self.ids.uuid(),
            vxlan,
            metro: m.code.to_owned(),
            description: call.str_field("description").map(str::to_owned),
            tags: call.tags().unwrap_or_default(),
            created_at: now_rfc3339(),
        };
        self.event(
            "virtual_network.created",
            format!("Virtual network {vxlan} was created in {}", m.code),
            href("virtual-networks", &vlan.id),
        );
        self.vlans.push(vlan.clone());
        Ok((201, Some(self.vlan_json(&vlan, &call.inc))))
    }

    fn update_vlan(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("id").to_owned();
        let description = call.str_field("description").map(str::to_owned);
        let tags = call.tags();
        let v = self
            .vlans
            .iter_mut()
            .find(|v| v.id == id)
            .ok_or_else(ApiError::not_found)?;
        if description.is_some() {
            v.description = description;
        }
        if let Some(t) = tags {
            v.tags = t;
        }
        let v = v.clone();
        Ok((200, Some(self.vlan_json(&v, &call.inc))))
    }

    fn delete_vlan(&mut self, id: &str) -> Answer {
        let vlan = self.vlan(id)?;
        let on_port = self
            .devices
            .iter()
            .flat_map(|d| &d.ports)
            .any(|p| p.vlans.iter().any(|v| v == id));
        if on_port {
            return refuse("Cannot delete Virtual Network when port is assigned");
        }
        if self.gateways.iter().any(|g| g.vlan_id == id) {
            return refuse("Cannot delete Virtual Network with associated metal gateway");
        }
        self.vlans.retain(|v| v.id != id);
        self.event(
            "virtual_network.deleted",
            format!("Virtual network {} was deleted", vlan.vxlan),
            href("virtual-networks", id),
        );
        Ok((204, None))
    }

    // -- Metal Gateways -------------------------------------------------------

    fn find_gateways(&mut self, call: &Call<'_>) -> Answer {
        self.project(call, "project_id")?;
        let items: Vec<Value> = self
            .gateways
            .iter()
            .map(|g| self.gateway_json(g, &call.inc))
            .collect();
        let answer = self.page(call, "metal_gateways", items);
        let ids: Vec<String> = self.gateways.iter().map(|g| g.id.clone()).collect();
        for id in ids {
            self.tick(&id);
        }
        answer
    }

    fn find_gateway(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("id");
        if self.deleted_gateways.iter().any(|d| d == id) {
            return Err(ApiError::new(
                403,
                "Access denied for the current authentication token",
            ));
        }
        let g = self
            .gateways
            .iter()
            .find(|g| g.id == id)
            .ok_or_else(ApiError::not_found)?;
        let body = self.gateway_json(g, &call.inc);
        self.tick(id);
        Ok((200, Some(body)))
    }

    /// Counts a read of a gateway: after `gateway_reads` reads a `ready`
    /// one turns `active` and a `deleting` one is gone.
    fn tick(&mut self, id: &str) {
        let Some(g) = self.gateways.iter_mut().find(|g| g.id == id) else {
            return;
        };
        if g.state == GatewayState::Active {
            return;
        }
        g.reads_left = g.reads_left.saturating_sub(1);
        if g.reads_left == 0 {
            match g.state {
                GatewayState::Ready => g.state = GatewayState::Active,
                GatewayState::Deleting => self.remove_gateway(id),
                GatewayState::Active => {}
            }
        }
    }

    fn remove_gateway(&mut self, id: &str) {
        if let Some(g) = self.gateways.iter().find(|g| g.id == id).cloned() {
            self.gateways.retain(|x| x.id != id);
            self.deleted_gateways.push(id.to_string());
            self.event(
                "metal_gateway.deleted",
                "Metal gateway was deleted".into(),
                href("metal-gateways", &g.id),
            );
        }
    }

    fn create_gateway(&mut self, call: &Call<'_>) -> Answer {
        self.project(call, "project_id")?;
        if call.field("private_ipv4_subnet_size").is_some() {
            return refuse(
                "private_ipv4_subnet_size is not emulated by the Metal simulator; give an ip_reservation_id",
            );
        }
        let vlan_id = call.str_field("virtual_network_id").unwrap_or_default();
        let Some(res_id) = call.str_field("ip_reservation_id") else {
            return refuse("ip_reservation_id is required");
        };
        let Some(vlan) = self.vlans.iter().find(|v| v.id == vlan_id).cloned() else {
            return refuse(format!("Virtual network {vlan_id} not found"));
        };
        let Some(r) = self.reservations.iter().find(|r| r.id == res_id).cloned() else {
            return refuse(format!("IP reservation {res_id} not found"));
        };
        if r.metro != vlan.metro {
            return refuse(format!(
                "IP reservation {} is in {}, the virtual network in {}: they must be in the same metro",
                r.block, r.metro, vlan.metro
            ));
        }
        if self.gateways.iter().any(|g| g.reservation_id == r.id) {
            return refuse(format!(
                "IP reservation {} already has a metal gateway",
                r.block
            ));
        }
        if r.block.family == Family::V6 {
            let v6_on_vlan = self.gateways.iter().any(|g| {
                g.vlan_id == vlan.id
                    && self
                        .reservations
                        .iter()
                        .any(|x| x.id == g.reservation_id && x.block.family == Family::V6)
            });
            if v6_on_vlan {
                return refuse(format!(
                    "Virtual network {} already has an IPv6 VRF IP reservation",
                    vlan.vxlan
                ));
            }
        }
        let reads = self.gateway_reads;
        let mut g = Gateway {
            id: self.ids.uuid(),
            vlan_id: vlan.id.clone(),
            reservation_id: r.id.clone(),
            vrf_id: r.vrf_id.clone(),
            state: GatewayState::Ready,
            created_at: now_rfc3339(),
            reads_left: reads,
        };
        let body = self.gateway_json(&g, &call.inc);
        if reads == 0 {
            g.state = GatewayState::Active;
        }
        self.event(
            "metal_gateway.created",
            format!(
                "Metal gateway for {} was created on virtual network {}",
                r.block, vlan.vxlan
            ),
            href("metal-gateways", &g.id),
        );
        self.gateways.push(g);
        Ok((201, Some(body)))
    }

    fn delete_gateway(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("id").to_owned();
        let reads = self.gateway_reads;
        let g = self
            .gateways
            .iter_mut()
            .find(|g| g.id == id)
            .ok_or_else(ApiError::not_found)?;
        if g.state != GatewayState::Deleting {
            g.state = GatewayState::Deleting;
            g.reads_left = reads;
        }
        let g = g.clone();
        let body = self.gateway_json(&g, &call.inc);
        if reads == 0 {
            self.remove_gateway(&id);
        }
        Ok((202, Some(body)))
    }

    // -- rendering ----------------------------------------------------------

    fn project_json(&self, inc: &Inc, name: &str) -> Value {
        let h = href("projects", &self.project_id);
        if inc.has(name) {
            json!({ "id": self.project_id, "name": "metal-sim", "href": h })
        } else {
            json!({ "href": h })
        }
    }

    pub fn vrf_json(&self, v: &Vrf, inc: &Inc) -> Value {
        let mut out = json!({
            "id": v.id, "name": v.name, "bill": false,
            "ip_ranges": v.ip_ranges, "virtual_circuits": [], "tags": v.tags,
            "metro": metro_json(&v.metro), "project": self.project_json(inc, "project"),
            "href": href("vrfs", &v.id), "created_at": v.created_at, "updated_at": v.created_at,
            "bgp_dynamic_neighbors_enabled": v.bgp[0],
            "bgp_dynamic_neighbors_export_route_map": v.bgp[1],
            "bgp_dynamic_neighbors_bfd_enabled": v.bgp[2],
        });
        if let Some(d) = &v.description {
            out["description"] = json!(d);
        }
        if let Some(asn) = v.local_asn {
            out["local_asn"] = json!(asn);
        }
        out
    }

    fn gateway_lite(&self, g: &Gateway) -> Value {
        let r = self.reservations.iter().find(|r| r.id == g.reservation_id);
        let vlan = self.vlans.iter().find(|v| v.id == g.vlan_id);
        let mut out = json!({
            "id": g.id, "state": g.state.as_str(), "href": href("metal-gateways", &g.id),
            "created_at": g.created_at, "updated_at": g.created_at,
        });
        if let Some(r) = r {
            out["gateway_address"] = json!(format!("{}/{}", r.gateway, r.cidr));
        }
        if let Some(v) = vlan {
            out["vlan"] = json!(v.vxlan);
        }
        out
    }

    pub fn reservation_json(&self, r: &Reservation, inc: &Inc) -> Value {
        let mut out = json!({
            "id": r.id, "type": r.kind, "address_family": r.block.address_family(),
            "network": r.network, "cidr": r.cidr, "netmask": r.block.netmask(),
            "gateway": r.gateway, "state": "created", "public": r.kind == "public_ipv4",
            "management": false, "manageable": true, "bill": false,
            "customdata": r.customdata, "tags": r.tags, "metro": metro_json(&r.metro),
            "project": self.project_json(inc, "project"),
            "href": href("ips", &r.id), "created_at": r.created_at,
        });
        if let Some(d) = &r.details {
            out["details"] = json!(d);
        }
        if let Some(g) = self.gateways.iter().find(|g| g.reservation_id == r.id) {
            out["metal_gateway"] = self.gateway_lite(g);
        }
        match &r.vrf_id {
            Some(vrf_id) => {
                out["vrf"] = match self.vrfs.iter().find(|v| &v.id == vrf_id) {
                    Some(v) if inc.has("vrf") => self.vrf_json(v, &inc.child("vrf")),
                    _ => href_obj("vrfs", vrf_id),
                };
            }
            None => {
                out["global_ip"] = json!(false);
                out["enabled"] = json!(true);
                out["addon"] = json!(false);
                let assigned: Vec<Value> = self
                    .assignments
                    .iter()
                    .filter(|a| a.reservation_id == r.id)
                    .map(|a| href_obj("ips", &a.id))
                    .collect();
                out["assignments"] = json!(assigned);
            }
        }
        out
    }

    pub fn assignment_json(&self, a: &Assignment) -> Value {
        let r = self.reservations.iter().find(|r| r.id == a.reservation_id);
        let public = if a.management {
            a.public
        } else {
            r.is_some_and(|r| r.kind == "public_ipv4")
        };
        let mut out = json!({
            "id": a.id, "type": "IPAssignment", "address": a.address, "cidr": a.cidr,
            "address_family": match a.family { Family::V4 => 4, Family::V6 => 6 },
            "assigned_to": href_obj("devices", &a.device_id),
            "public": public,
            "management": a.management, "manageable": !a.management, "enabled": true,
            "global_ip": false, "href": href("ips", &a.id), "created_at": a.created_at,
        });
        if a.management {
            // A /31 or /127: the other address is the gateway.
            if let Ok(block) = Block::new(from_u128(a.family, a.value & !1), a.cidr) {
                out["network"] = json!(block.network().to_string());
                out["gateway"] = json!(block.network().to_string());
                out["netmask"] = json!(block.netmask());
            }
            if let Some(d) = self.devices.iter().find(|d| d.id == a.device_id) {
                out["metro"] = metro_json(&d.metro);
            }
        }
        if let Some(r) = r {
            out["network"] = json!(r.network);
            out["gateway"] = json!(r.gateway);
            out["netmask"] = json!(r.block.netmask());
            out["metro"] = metro_json(&r.metro);
            out["parent_block"] = json!({
                "network": r.network, "cidr": r.cidr, "netmask": r.block.netmask(),
                "href": href("ips", &r.id),
            });
        }
        // `customdata` is not part of IPAssignment: kept, but not answered.
        out
    }

    pub fn vlan_json(&self, v: &Vlan, inc: &Inc) -> Value {
        let instances: Vec<Value> = self
            .devices
            .iter()
            .filter(|d| d.ports.iter().any(|p| p.vlans.contains(&v.id)))
            .map(|d| {
                if inc.has("instances") {
                    self.device_json(d, &inc.child("instances"))
                } else {
                    href_obj("devices", &d.id)
                }
            })
            .collect();
        let gateways: Vec<Value> = self
            .gateways
            .iter()
            .filter(|g| g.vlan_id == v.id)
            .map(|g| self.gateway_lite(g))
            .collect();
        let mut out = json!({
            "id": v.id, "vxlan": v.vxlan, "metro_code": v.metro, "metro": metro_json(&v.metro),
            "tags": v.tags, "assigned_to": self.project_json(inc, "assigned_to"),
            "assigned_to_virtual_circuit": false, "instances": instances,
            "metal_gateways": gateways, "href": href("virtual-networks", &v.id),
            "created_at": v.created_at,
        });
        if let Some(d) = &v.description {
            out["description"] = json!(d);
        }
        out
    }

    pub fn gateway_json(&self, g: &Gateway, inc: &Inc) -> Value {
        let mut out = json!({
            "id": g.id, "state": g.state.as_str(), "href": href("metal-gateways", &g.id),
            "created_at": g.created_at, "updated_at": g.created_at,
            "project": self.project_json(inc, "project"),
        });
        out["ip_reservation"] = match self.reservations.iter().find(|r| r.id == g.reservation_id) {
            Some(r) if inc.has("ip_reservation") => {
                self.reservation_json(r, &inc.child("ip_reservation"))
            }
            _ => href_obj("ips", &g.reservation_id),
        };
        out["virtual_network"] = match self.vlans.iter().find(|v| v.id == g.vlan_id) {
            Some(v) if inc.has("virtual_network") => {
                self.vlan_json(v, &inc.child("virtual_network"))
            }
            _ => href_obj("virtual-networks", &g.vlan_id),
        };
        if let Some(vrf_id) = &g.vrf_id {
            out["vrf"] = match self.vrfs.iter().find(|v| &v.id == vrf_id) {
                Some(v) if inc.has("vrf") => self.vrf_json(v, &inc.child("vrf")),
                _ => href_obj("vrfs", vrf_id),
            };
        }
        out
    }

    pub fn port_json(&self, d: &Device, p: &Port, inc: &Inc) -> Value {
        let vlans: Vec<Value> = p
            .vlans
            .iter()
            .map(|id| match self.vlans.iter().find(|v| &v.id == id) {
                Some(v) if inc.has("virtual_networks") => {
                    self.vlan_json(v, &inc.child("virtual_networks"))
                }
                _ => href_obj("virtual-networks", id),
            })
            .collect();
        let mut out = json!({
            "id": p.id, "name": p.name, "href": href("ports", &p.id),
            "type": if p.is_bond { "NetworkBondPort" } else { "NetworkPort" },
            "disbond_operation_supported": true, "virtual_networks": vlans,
        });
        if p.is_bond {
            if let Some(t) = d.network_type(&p.name) {
                out["network_type"] = json!(t);
            }
            out["data"] = json!({ "bonded": p.bonded });
        } else {
            let n = u128::from_str_radix(&p.id.replace('-', "")[20..], 16).unwrap_or(0);
            let mac: Vec<String> = (0..6)
                .map(|i| format!("{:02x}", (n >> (8 * (5 - i))) & 0xff))
                .collect();
            out["data"] = json!({ "bonded": p.bonded, "mac": mac.join(":") });
            if let Some(bond) = p.bond.as_deref().and_then(|b| d.port(b)) {
                out["bond"] = json!({ "id": bond.id, "name": bond.name });
            }
        }
        if let Some(native) = &p.native_vlan {
            out["native_virtual_network"] = match self.vlans.iter().find(|v| &v.id == native) {
                Some(v) if inc.has("native_virtual_network") => {
                    self.vlan_json(v, &inc.child("native_virtual_network"))
                }
                _ => href_obj("virtual-networks", native),
            };
        }
        out
    }

    pub fn device_json(&self, d: &Device, inc: &Inc) -> Value {
        let ports: Vec<Value> = d
            .ports
            .iter()
            .map(|p| self.port_json(d, p, &inc.child("network_ports")))
            .collect();
        let ips: Vec<Value> = self
            .assignments
            .iter()
            .filter(|a| a.device_id == d.id)
            .map(|a| self.assignment_json(a))
            .collect();
        json!({
            "id": d.id, "hostname": d.hostname, "state": d.state, "metro": metro_json(&d.metro),
            "network_ports": ports, "ip_addresses": ips, "network_frozen": d.network_frozen,
            "project": self.project_json(inc, "project"), "tags": [],
            "href": href("devices", &d.id),
        })
    }
}

/// Panics unless `state` is one of [`DEVICE_STATES`].
fn check_device_state(state: &str) {
    assert!(
        DEVICE_STATES.contains(&state),
        "{state:?} is not a device state (one of {DEVICE_STATES:?})"
    );
}

fn event_json(e: &Event) -> Value {
    let rel: Vec<Value> = e
        .relationships
        .iter()
        .map(|h| json!({ "href": h }))
        .collect();
    json!({
        "id": e.id, "type": e.kind, "body": e.body, "interpolated": e.body,
        "state": "success", "relationships": rel, "created_at": e.created_at,
        "href": href("events", &e.id),
    })
}

/// The operations the simulator implements (`operationId`s).
pub const EMULATED: &[&str] = &[
    "findVrfs",
    "createVrf",
    "findVrfById",
    "updateVrf",
    "deleteVrf",
    "findVrfIpReservations",
    "findVrfIpReservation",
    "findIPReservations",
    "requestIPReservation",
    "findIPAddressById",
    "updateIPAddress",
    "deleteIPAddress",
    "findIPAssignments",
    "createIPAssignment",
    "findDeviceById",
    "findVirtualNetworks",
    "createVirtualNetwork",
    "getVirtualNetwork",
    "updateVirtualNetwork",
    "deleteVirtualNetwork",
    "findMetalGatewaysByProject",
    "createMetalGateway",
    "findMetalGatewayById",
    "deleteMetalGateway",
    "findProjectEvents",
    "findPortById",
    "assignPort",
    "unassignPort",
    "bondPort",
    "disbondPort",
    "convertLayer2",
    "convertLayer3",
    "assignNativeVlan",
    "deleteNativeVlan",
    "findPortVlanAssignments",
    "findPortVlanAssignmentByPortIdAndAssignmentId",
    "createPortVlanAssignmentBatch",
    "findPortVlanAssignmentBatches",
    "findPortVlanAssignmentBatchByPortIdAndBatchId",
    "findDeviceEvents",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks() {
        let b = Block::parse("10.1.2.0/29").unwrap();
        assert_eq!(b.to_string(), "10.1.2.0/29");
        assert_eq!(b.first_usable().to_string(), "10.1.2.1");
        assert_eq!(b.netmask(), "255.255.255.248");
        assert!(Block::parse("10.1.2.1/29").is_err());
        assert!(Block::parse("10.1.2.0").is_err());
        let r = Block::parse("10.1.0.0/16").unwrap();
        assert!(r.covers(&b) && !b.covers(&r) && r.overlaps(&b));
        let v6 = Block::parse("2001:db8:0:1::/64").unwrap();
        assert_eq!(v6.netmask(), "ffff:ffff:ffff:ffff::");
        assert!(!v6.overlaps(&b));
    }

    #[test]
    fn dates_and_ids() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_785_542_399), "2026-07-31T23:59:59Z");
        let mut ids = IdGen::new();
        let (a, b) = (ids.uuid(), ids.uuid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }

    #[test]
    fn include_paths() {
        let inc = Inc::from_query(&[
            (
                "include".into(),
                "ip_reservation.vrf,virtual_network".into(),
            ),
            ("exclude".into(), "virtual_network".into()),
        ]);
        assert!(inc.has("ip_reservation"));
        assert!(!inc.has("virtual_network"));
        assert!(inc.child("ip_reservation").has("vrf"));
        assert!(!inc.has("vrf"));
    }
}
