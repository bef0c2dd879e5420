//! What the phoenixNAP simulator holds (private and public networks, IP
//! blocks, servers, memberships, tokens, audit events), the rules each
//! operation enforces, and how resources are rendered as API answers.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::spec::Api;

// ---------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------

/// The locations the specifications list (`PHX`, `ASH`, `SGP`, `NLD`,
/// `CHI`, `SEA`, `AUS`); anything else is refused.
pub const LOCATIONS: &[&str] = &["PHX", "ASH", "SGP", "NLD", "CHI", "SEA", "AUS"];

/// The server statuses of the BMC specification.
pub const SERVER_STATUSES: &[&str] = &[
    "creating",
    "powered-on",
    "powered-off",
    "rebooting",
    "resetting",
    "deleting",
    "reserved",
    "error",
    "reinstating",
];

/// The IPv4 block sizes an order may ask for (`IpBlockCreate`'s list).
pub const BLOCK_SIZES: &[&str] = &["/31", "/30", "/29", "/28"];

/// The (fake) range ordered IP blocks are cut from.
pub const PUBLIC_POOL: &str = "198.18.0.0/15";

/// The first VLAN id given to a network created without one.
pub const FIRST_AUTO_VLAN: u16 = 100;

/// Most IPv4 blocks on one public network (the spec's "maximum of 10").
pub const MAX_BLOCKS_PER_NETWORK: usize = 10;

/// The operations the simulator emulates, by API and `operationId`; the
/// other operations of the four specs answer 501 after the spec check.
pub const EMULATED: &[(Api, &str)] = &[
    (Api::Bmc, "serversGet"),
    (Api::Bmc, "serversServerIdGet"),
    (Api::Bmc, "serversServerIdPrivateNetworksPost"),
    (Api::Bmc, "serversServerIdPrivateNetworksPatch"),
    (Api::Bmc, "deletePrivateNetwork"),
    (Api::Bmc, "serversServerIdPublicNetworksPost"),
    (Api::Bmc, "serversServerIdPublicNetworksPatch"),
    (Api::Bmc, "serversServerIdPublicNetworksDelete"),
    (Api::Networks, "privateNetworksGet"),
    (Api::Networks, "privateNetworksPost"),
    (Api::Networks, "privateNetworksNetworkIdGet"),
    (Api::Networks, "privateNetworksNetworkIdPut"),
    (Api::Networks, "privateNetworksNetworkIdDelete"),
    (Api::Networks, "publicNetworksGet"),
    (Api::Networks, "publicNetworksPost"),
    (Api::Networks, "publicNetworksNetworkIdGet"),
    (Api::Networks, "publicNetworksNetworkIdPatch"),
    (Api::Networks, "publicNetworksNetworkIdDelete"),
    (Api::Networks, "publicNetworksNetworkIdIpBlocksPost"),
    (
        Api::Networks,
        "publicNetworksNetworkIdIpBlocksIpBlockIdDelete",
    ),
    (Api::Ips, "ipBlocksGet"),
    (Api::Ips, "ipBlocksPost"),
    (Api::Ips, "ipBlocksIpBlockIdGet"),
    (Api::Ips, "ipBlocksIpBlockIdDelete"),
    (Api::Ips, "ipBlocksIpBlockIdPatch"),
    (Api::Audit, "eventsGet"),
];

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// An error answer: a status and the `Error` body (`message`, and
/// `validationErrors` when there are several problems).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: u16,
    pub message: String,
    pub validation: Vec<String>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            validation: Vec::new(),
        }
    }

    /// The `Error` body.
    pub fn body(&self) -> Value {
        if self.validation.is_empty() {
            json!({ "message": self.message })
        } else {
            json!({ "message": self.message, "validationErrors": self.validation })
        }
    }
}

fn bad<T>(message: impl Into<String>) -> Result<T, ApiError> {
    Err(ApiError::new(400, message))
}

fn not_found<T>(message: impl Into<String>) -> Result<T, ApiError> {
    Err(ApiError::new(404, message))
}

fn conflict<T>(message: impl Into<String>) -> Result<T, ApiError> {
    Err(ApiError::new(409, message))
}

pub(crate) type Answer = Result<(u16, Option<Value>), ApiError>;

// ---------------------------------------------------------------------------
// Time and ids
// ---------------------------------------------------------------------------

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds
/// (`2025-01-01T00:00:00.000Z`).
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = metal_ipam_core::kube::meta::rfc3339(ms / 1000);
    format!("{}.{:03}Z", secs.trim_end_matches('Z'), ms % 1000)
}

/// Reads an RFC 3339 date-time (`Z` or an offset, optional fraction) as
/// Unix milliseconds; `None` if it is not one or is before 1970.
pub fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &text[19..];
    let mut ms = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits: String = frac.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            return None;
        }
        let first3: String = digits.chars().chain("000".chars()).take(3).collect();
        ms = first3.parse().ok()?;
        rest = &frac[digits.len()..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (oh * 60 + om)
        }
    };
    let days = days_from_civil(y, mo, d);
    let total = ((days * 24 + h) * 60 + mi - offset_min) * 60 + s;
    u64::try_from(total * 1000 + ms).ok()
}

/// Ids of 24 hex digits, as phoenixNAP's look, from a per-simulator seed
/// and a counter.
#[derive(Debug)]
pub(crate) struct Ids {
    seed: u64,
    next: u64,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Ids {
    pub fn new() -> Ids {
        let mut h = RandomState::new().build_hasher();
        h.write_u8(1);
        Ids {
            seed: h.finish(),
            next: 0,
        }
    }

    /// A fresh 24-hex-digit id.
    pub fn id(&mut self) -> String {
        self.next += 1;
        let a = mix(self.seed ^ self.next);
        format!("{:08x}{:016x}", self.next as u32, a)
    }

    /// A fresh opaque token.
    pub fn token(&mut self) -> String {
        self.next += 1;
        format!(
            "pnap-sim-{:016x}{:016x}",
            mix(self.seed ^ self.next),
            mix(!self.seed ^ self.next)
        )
    }
}

// ---------------------------------------------------------------------------
// Records (public snapshots)
// ---------------------------------------------------------------------------

/// A private network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateNetwork {
    /// Its id.
    pub id: String,
    /// Its name (unique among private networks).
    pub name: String,
    /// Its description.
    pub description: Option<String>,
    /// Its location, e.g. `PHX`.
    pub location: String,
    /// Its VLAN (unique per location among all networks).
    pub vlan_id: u16,
    /// Its range, e.g. `10.0.0.0/24` (absent when created with `force`).
    pub cidr: Option<String>,
    /// Whether it is its location's default.
    pub location_default: bool,
    /// When it was created (RFC 3339).
    pub created_on: String,
}

/// A public network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicNetwork {
    /// Its id.
    pub id: String,
    /// Its name (unique among public networks).
    pub name: String,
    /// Its description.
    pub description: Option<String>,
    /// Its location.
    pub location: String,
    /// Its VLAN.
    pub vlan_id: u16,
    /// `raEnabled`.
    pub ra_enabled: bool,
    /// When it was created (RFC 3339).
    pub created_on: String,
}

/// An IP block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpBlock {
    /// Its id.
    pub id: String,
    /// Its location.
    pub location: String,
    /// Its size, e.g. `/29`.
    pub cidr_block_size: String,
    /// Its CIDR, from [`PUBLIC_POOL`].
    pub cidr: String,
    /// `unassigned`, `assigning` (attached to a public network, not yet
    /// usable) or `assigned`.
    pub status: String,
    /// The public network it is attached to.
    pub assigned_resource_id: Option<String>,
    /// Its description.
    pub description: Option<String>,
    /// When it was ordered (RFC 3339).
    pub created_on: String,
    /// Reads left while `assigning`.
    pub reads_left: u32,
}

/// A server, seeded by the test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Its id.
    pub id: String,
    /// Its hostname.
    pub hostname: String,
    /// Its location.
    pub location: String,
    /// One of [`SERVER_STATUSES`].
    pub status: String,
}

/// Which kind of network a membership is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NetworkKind {
    /// A private network.
    Private,
    /// A public network.
    Public,
}

/// Where a membership is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembershipStatus {
    /// Joining: `statusDescription: in-progress`.
    Joining,
    /// Joined: `assigned`.
    Assigned,
    /// Leaving after a DELETE: `in-progress`, then gone.
    Leaving,
}

impl MembershipStatus {
    /// The `statusDescription` it reads as.
    pub fn description(self) -> &'static str {
        match self {
            MembershipStatus::Assigned => "assigned",
            MembershipStatus::Joining | MembershipStatus::Leaving => "in-progress",
        }
    }
}

/// A server's membership of a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The server.
    pub server_id: String,
    /// The network.
    pub network_id: String,
    /// Private or public.
    pub kind: NetworkKind,
    /// The IPs as given (a private entry may be a range `a - b`), or the
    /// one chosen when none was given.
    pub ips: Vec<String>,
    /// Every address the entries cover.
    pub addresses: Vec<Ipv4Addr>,
    /// `dhcp` (private only).
    pub dhcp: bool,
    /// Its status.
    pub status: MembershipStatus,
    /// Server reads left before the status moves on.
    pub reads_left: u32,
}

/// An audit log event (`name`, `timestamp` and `userInfo` are what the
/// API shows; `verb` and `uri` are kept for the filters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// E.g. `API.CreatePrivateNetwork`.
    pub name: String,
    /// RFC 3339 with milliseconds, from the simulator's clock.
    pub timestamp: String,
    /// The same instant in Unix milliseconds.
    pub at_ms: u64,
    /// `POST`, `PUT`, `PATCH` or `DELETE`.
    pub verb: String,
    /// The request path, e.g. `/networks/v1/private-networks/<id>`.
    pub uri: String,
    /// Who did it.
    pub username: String,
    /// With which client.
    pub client_id: String,
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// One decoded request, as the state sees it.
pub(crate) struct Call<'a> {
    pub op: &'a str,
    pub path: &'a BTreeMap<String, String>,
    pub query: &'a [(String, String)],
    pub body: Option<&'a Value>,
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

    fn force(&self) -> bool {
        self.query("force") == Some("true")
    }

    fn body(&self) -> &Value {
        static NULL: Value = Value::Null;
        self.body.unwrap_or(&NULL)
    }

    fn str_field(&self, name: &str) -> Option<String> {
        self.body()
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
    }
}

/// Everything the simulator holds.
#[derive(Debug)]
pub(crate) struct State {
    pub ids: Ids,
    pub now_ms: u64,
    pub membership_reads: u32,
    pub block_reads: u32,
    pub events_cap: Option<usize>,
    /// Whether a network name may be taken twice (of one kind).
    pub duplicate_names: bool,
    pub account_id: String,
    pub username: String,
    pub client_id: String,
    pub client_secret: String,
    pub token_lifetime_s: u64,
    /// Token → expiry (Unix ms, the simulator's clock).
    pub tokens: BTreeMap<String, u64>,
    pub tokens_issued: usize,
    pub private_networks: Vec<PrivateNetwork>,
    pub public_networks: Vec<PublicNetwork>,
    pub ip_blocks: Vec<IpBlock>,
    pub servers: Vec<Server>,
    pub memberships: Vec<Membership>,
    pub events: Vec<Event>,
}

fn location_ok(location: &str) -> Result<(), ApiError> {
    if LOCATIONS.contains(&location) {
        Ok(())
    } else {
        bad(format!(
            "Location {location} is not supported: one of {}",
            LOCATIONS.join(", ")
        ))
    }
}

fn is_rfc1918(net: &Ipv4Net) -> bool {
    ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
        .iter()
        .any(|r| r.parse::<Ipv4Net>().is_ok_and(|r| r.contains(net)))
}

/// One `ips` entry: an address, or (`ranges`) `a - b`.
fn parse_entry(entry: &str, ranges: bool) -> Result<Vec<Ipv4Addr>, String> {
    if let Some((a, b)) = entry.split_once('-') {
        if !ranges {
            return Err(format!("{entry:?}: only single IP addresses are accepted"));
        }
        let a: Ipv4Addr = a
            .trim()
            .parse()
            .map_err(|_| format!("{entry:?} is not an IPv4 range"))?;
        let b: Ipv4Addr = b
            .trim()
            .parse()
            .map_err(|_| format!("{entry:?} is not an IPv4 range"))?;
        let (lo, hi) = (u32::from(a), u32::from(b));
        if hi < lo || hi - lo >= 256 {
            return Err(format!(
                "{entry:?}: a range runs upwards over at most 256 IPs"
            ));
        }
        Ok((lo..=hi).map(Ipv4Addr::from).collect())
    } else {
        entry
            .trim()
            .parse::<Ipv4Addr>()
            .map(|a| vec![a])
            .map_err(|_| format!("{entry:?} is not an IPv4 address"))
    }
}

/// Whether `a` is a host address of `net` (not its network or broadcast
/// address, for prefixes up to /30).
fn host_of(net: &Ipv4Net, a: Ipv4Addr) -> bool {
    net.contains(&a) && (net.prefix_len() >= 31 || (a != net.network() && a != net.broadcast()))
}

/// The gateway of a public block: its first host address (/31: none).
fn block_gateway(net: &Ipv4Net) -> Option<Ipv4Addr> {
    (net.prefix_len() <= 30).then(|| Ipv4Addr::from(u32::from(net.network()) + 1))
}

fn event_name(op: &str) -> String {
    let name = match op {
        "privateNetworksPost" => "CreatePrivateNetwork",
        "privateNetworksNetworkIdPut" => "UpdatePrivateNetwork",
        "privateNetworksNetworkIdDelete" => "DeletePrivateNetwork",
        "publicNetworksPost" => "CreatePublicNetwork",
        "publicNetworksNetworkIdPatch" => "UpdatePublicNetwork",
        "publicNetworksNetworkIdDelete" => "DeletePublicNetwork",
        "publicNetworksNetworkIdIpBlocksPost" => "AddPublicNetworkIpBlock",
        "publicNetworksNetworkIdIpBlocksIpBlockIdDelete" => "RemovePublicNetworkIpBlock",
        "ipBlocksPost" => "CreateIpBlock",
        "ipBlocksIpBlockIdPatch" => "UpdateIpBlock",
        "ipBlocksIpBlockIdDelete" => "DeleteIpBlock",
        "serversServerIdPrivateNetworksPost" => "AddServerPrivateNetwork",
        "serversServerIdPrivateNetworksPatch" => "UpdateServerPrivateNetwork",
        "deletePrivateNetwork" => "RemoveServerPrivateNetwork",
        "serversServerIdPublicNetworksPost" => "AddServerPublicNetwork",
        "serversServerIdPublicNetworksPatch" => "UpdateServerPublicNetwork",
        "serversServerIdPublicNetworksDelete" => "RemoveServerPublicNetwork",
        other => other,
    };
    format!("API.{name}")
}

impl State {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        now_ms: u64,
        membership_reads: u32,
        block_reads: u32,
        client_id: String,
        client_secret: String,
        token_lifetime_s: u64,
        username: String,
    ) -> State {
        State {
            ids: Ids::new(),
            now_ms,
            membership_reads,
            block_reads,
            events_cap: None,
            duplicate_names: false,
            account_id: "pnap-sim-account".into(),
            username,
            client_id,
            client_secret,
            token_lifetime_s,
            tokens: BTreeMap::new(),
            tokens_issued: 0,
            private_networks: Vec::new(),
            public_networks: Vec::new(),
            ip_blocks: Vec::new(),
            servers: Vec::new(),
            memberships: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Whether the simulator emulates the operation.
    pub fn emulates(api: Api, op: &str) -> bool {
        EMULATED.iter().any(|(a, id)| *a == api && *id == op)
    }

    // -- tokens -------------------------------------------------------------

    /// Issues a token for the seeded client: its value and lifetime.
    pub fn issue_token(&mut self) -> (String, u64) {
        let token = self.ids.token();
        let expires = self
            .now_ms
            .saturating_add(self.token_lifetime_s.saturating_mul(1000));
        self.tokens.insert(token.clone(), expires);
        self.tokens_issued += 1;
        (token, self.token_lifetime_s)
    }

    /// Whether `token` was issued and has not expired.
    pub fn token_valid(&self, token: &str) -> bool {
        self.tokens.get(token).is_some_and(|&exp| self.now_ms < exp)
    }

    // -- audit ----------------------------------------------------------------

    /// Appends an event for an applied write.
    pub fn record_event(&mut self, op: &str, verb: &str, uri: &str) {
        self.events.push(Event {
            name: event_name(op),
            timestamp: rfc3339_ms(self.now_ms),
            at_ms: self.now_ms,
            verb: verb.to_owned(),
            uri: uri.to_owned(),
            username: self.username.clone(),
            client_id: self.client_id.clone(),
        });
    }

    fn event_json(&self, e: &Event) -> Value {
        json!({
            "name": e.name,
            "timestamp": e.timestamp,
            "userInfo": {
                "accountId": self.account_id,
                "clientId": e.client_id,
                "username": e.username,
            }
        })
    }

    fn events_get(&self, call: &Call<'_>) -> Answer {
        let time = |name: &str| -> Result<Option<u64>, ApiError> {
            match call.query(name) {
                None => Ok(None),
                Some(t) => parse_rfc3339_ms(t)
                    .map(Some)
                    .ok_or_else(|| ApiError::new(400, format!("{name}: {t:?} is not a date-time"))),
            }
        };
        let (from, to) = (time("from")?, time("to")?);
        let limit = match call.query("limit") {
            None => None,
            Some(l) => match l.parse::<usize>() {
                Ok(n) if n >= 1 => Some(n),
                _ => return bad(format!("limit must be a positive integer, got {l:?}")),
            },
        };
        let descending = call.query("order") == Some("DESC");
        let mut picked: Vec<&Event> = self
            .events
            .iter()
            .filter(|e| from.is_none_or(|f| e.at_ms >= f))
            .filter(|e| to.is_none_or(|t| e.at_ms <= t))
            .filter(|e| call.query("verb").is_none_or(|v| e.verb == v))
            .filter(|e| call.query("uri").is_none_or(|u| e.uri.starts_with(u)))
            .filter(|e| call.query("username").is_none_or(|u| e.username == u))
            .collect();
        if descending {
            picked.reverse();
        }
        if let Some(n) = limit {
            picked.truncate(n);
        }
        let mut status = 200;
        if let Some(cap) = self.events_cap {
            if picked.len() > cap {
                picked.truncate(cap);
                status = 206;
            }
        }
        let list: Vec<Value> = picked.into_iter().map(|e| self.event_json(e)).collect();
        Ok((status, Some(Value::Array(list))))
    }

    // -- rendering ------------------------------------------------------------

    fn members_of(&self, kind: NetworkKind, network: &str) -> impl Iterator<Item = &Membership> {
        let network = network.to_owned();
        self.memberships
            .iter()
            .filter(move |m| m.kind == kind && m.network_id == network)
    }

    fn membership_json(m: &Membership) -> Value {
        json!({ "resourceId": m.server_id, "resourceType": "server", "ips": m.ips })
    }

    fn network_status(&self, kind: NetworkKind, id: &str) -> &'static str {
        let busy_member = self
            .members_of(kind, id)
            .any(|m| m.status != MembershipStatus::Assigned);
        let busy_block = kind == NetworkKind::Public
            && self
                .ip_blocks
                .iter()
                .any(|b| b.assigned_resource_id.as_deref() == Some(id) && b.status == "assigning");
        if busy_member || busy_block {
            "BUSY"
        } else {
            "READY"
        }
    }

    fn private_json(&self, n: &PrivateNetwork) -> Value {
        let members: Vec<&Membership> = self.members_of(NetworkKind::Private, &n.id).collect();
        let mut v = json!({
            "id": n.id,
            "name": n.name,
            "vlanId": n.vlan_id,
            "type": "PRIVATE",
            "location": n.location,
            "locationDefault": n.location_default,
            "servers": members.iter().map(|m| json!({ "id": m.server_id, "ips": m.ips })).collect::<Vec<_>>(),
            "memberships": members.iter().map(|m| Self::membership_json(m)).collect::<Vec<_>>(),
            "status": self.network_status(NetworkKind::Private, &n.id),
            "createdOn": n.created_on,
        });
        if let Some(c) = &n.cidr {
            v["cidr"] = json!(c);
        }
        if let Some(d) = &n.description {
            v["description"] = json!(d);
        }
        v
    }

    fn used_in_block(&self, block: &IpBlock) -> usize {
        let Ok(net) = block.cidr.parse::<Ipv4Net>() else {
            return 0;
        };
        self.memberships
            .iter()
            .filter(|m| m.kind == NetworkKind::Public)
            .flat_map(|m| m.addresses.iter())
            .filter(|a| net.contains(*a))
            .count()
    }

    fn public_block_json(&self, b: &IpBlock) -> Value {
        json!({ "id": b.id, "cidr": b.cidr, "usedIpsCount": self.used_in_block(b).to_string() })
    }

    fn public_json(&self, n: &PublicNetwork) -> Value {
        let blocks: Vec<Value> = self
            .ip_blocks
            .iter()
            .filter(|b| b.assigned_resource_id.as_deref() == Some(n.id.as_str()))
            .map(|b| self.public_block_json(b))
            .collect();
        let members: Vec<Value> = self
            .members_of(NetworkKind::Public, &n.id)
            .map(Self::membership_json)
            .collect();
        let mut v = json!({
            "id": n.id,
            "name": n.name,
            "vlanId": n.vlan_id,
            "location": n.location,
            "status": self.network_status(NetworkKind::Public, &n.id),
            "createdOn": n.created_on,
            "ipBlocks": blocks,
            "memberships": members,
            "raEnabled": n.ra_enabled,
        });
        if let Some(d) = &n.description {
            v["description"] = json!(d);
        }
        v
    }

    fn block_json(b: &IpBlock) -> Value {
        let mut v = json!({
            "id": b.id,
            "location": b.location,
            "cidrBlockSize": b.cidr_block_size,
            "cidr": b.cidr,
            "ipVersion": "V4",
            "status": b.status,
            "tags": [],
            "isSystemManaged": false,
            "isBringYourOwn": false,
            "createdOn": b.created_on,
        });
        if let Some(r) = &b.assigned_resource_id {
            v["assignedResourceId"] = json!(r);
            v["assignedResourceType"] = json!("network");
        }
        if let Some(d) = &b.description {
            v["description"] = json!(d);
        }
        v
    }

    fn server_json(&self, s: &Server) -> Value {
        let mine = |kind| {
            self.memberships
                .iter()
                .filter(move |m| m.server_id == s.id && m.kind == kind)
        };
        let assigned_ips = |kind| -> Vec<String> {
            mine(kind)
                .filter(|m| m.status == MembershipStatus::Assigned)
                .flat_map(|m| m.addresses.iter().map(ToString::to_string))
                .collect()
        };
        let private: Vec<Value> = mine(NetworkKind::Private)
            .map(|m| {
                json!({
                    "id": m.network_id,
                    "ips": m.ips,
                    "dhcp": m.dhcp,
                    "statusDescription": m.status.description(),
                })
            })
            .collect();
        let public: Vec<Value> = mine(NetworkKind::Public)
            .map(|m| {
                json!({
                    "id": m.network_id,
                    "ips": m.ips,
                    "statusDescription": m.status.description(),
                })
            })
            .collect();
        json!({
            "id": s.id,
            "status": s.status,
            "hostname": s.hostname,
            "type": "s1.c1.small",
            "location": s.location,
            "cpu": "E-2276G",
            "cpuCount": 1,
            "coresPerCpu": 6,
            "cpuFrequency": 3.8,
            "ram": "32GB RAM",
            "storage": "2x 960GB NVMe",
            "privateIpAddresses": assigned_ips(NetworkKind::Private),
            "publicIpAddresses": assigned_ips(NetworkKind::Public),
            "pricingModel": "HOURLY",
            "networkType": "PUBLIC_AND_PRIVATE",
            "networkConfiguration": {
                "privateNetworkConfiguration": { "privateNetworks": private },
                "publicNetworkConfiguration": { "publicNetworks": public },
            },
            "storageConfiguration": { "rootPartition": { "raid": "NO_RAID", "size": -1 } },
        })
    }

    // -- reads move things on ----------------------------------------------------

    /// A read of these servers: their unfinished memberships move on.
    fn read_servers(&mut self, ids: &BTreeSet<String>) {
        for m in &mut self.memberships {
            if ids.contains(&m.server_id) && m.status != MembershipStatus::Assigned {
                m.reads_left = m.reads_left.saturating_sub(1);
            }
        }
        self.finish_memberships();
    }

    fn finish_memberships(&mut self) {
        self.memberships
            .retain(|m| !(m.status == MembershipStatus::Leaving && m.reads_left == 0));
        for m in &mut self.memberships {
            if m.status == MembershipStatus::Joining && m.reads_left == 0 {
                m.status = MembershipStatus::Assigned;
            }
        }
    }

    /// A read of these blocks: attaching ones move on.
    fn read_blocks(&mut self, ids: &BTreeSet<String>) {
        for b in &mut self.ip_blocks {
            if ids.contains(&b.id) && b.status == "assigning" {
                b.reads_left = b.reads_left.saturating_sub(1);
                if b.reads_left == 0 {
                    b.status = "assigned".into();
                }
            }
        }
    }

    fn blocks_of_networks(&self, networks: &BTreeSet<String>) -> BTreeSet<String> {
        self.ip_blocks
            .iter()
            .filter(|b| {
                b.assigned_resource_id
                    .as_ref()
                    .is_some_and(|r| networks.contains(r))
            })
            .map(|b| b.id.clone())
            .collect()
    }

    /// Finishes every pending membership change and block attachment.
    pub fn settle(&mut self) {
        for m in &mut self.memberships {
            m.reads_left = 0;
        }
        self.finish_memberships();
        for b in &mut self.ip_blocks {
            if b.status == "assigning" {
                b.reads_left = 0;
                b.status = "assigned".into();
            }
        }
    }

    // -- seeding ----------------------------------------------------------------

    pub fn add_server(
        &mut self,
        id: &str,
        hostname: &str,
        location: &str,
        status: &str,
    ) -> Result<Server, String> {
        if !LOCATIONS.contains(&location) {
            return Err(format!("unknown location {location}"));
        }
        if !SERVER_STATUSES.contains(&status) {
            return Err(format!("unknown server status {status}"));
        }
        if self.servers.iter().any(|s| s.id == id) {
            return Err(format!("server {id} exists already"));
        }
        let s = Server {
            id: id.into(),
            hostname: hostname.into(),
            location: location.into(),
            status: status.into(),
        };
        self.servers.push(s.clone());
        Ok(s)
    }

    pub fn set_server_status(&mut self, id: &str, status: &str) -> Result<Server, String> {
        if !SERVER_STATUSES.contains(&status) {
            return Err(format!("unknown server status {status}"));
        }
        let s = self
            .servers
            .iter_mut()
            .find(|s| s.id == id)
            .ok_or_else(|| format!("no server {id}"))?;
        s.status = status.into();
        Ok(s.clone())
    }

    /// Deletes a server with its memberships; records `API.DeleteServer`.
    pub fn delete_server(&mut self, id: &str) -> Result<Vec<Membership>, String> {
        let before = self.servers.len();
        self.servers.retain(|s| s.id != id);
        if self.servers.len() == before {
            return Err(format!("no server {id}"));
        }
        let (gone, kept): (Vec<Membership>, Vec<Membership>) =
            std::mem::take(&mut self.memberships)
                .into_iter()
                .partition(|m| m.server_id == id);
        self.memberships = kept;
        self.record_event(
            "DeleteServer",
            "DELETE",
            &format!("{}/servers/{id}", Api::Bmc.base_path()),
        );
        Ok(gone)
    }

    // -- dispatch ---------------------------------------------------------------

    pub fn dispatch(&mut self, call: &Call<'_>) -> Answer {
        match call.op {
            "serversGet" => {
                let list: Vec<Value> = self.servers.iter().map(|s| self.server_json(s)).collect();
                let ids = self.servers.iter().map(|s| s.id.clone()).collect();
                self.read_servers(&ids);
                Ok((200, Some(Value::Array(list))))
            }
            "serversServerIdGet" => {
                let id = call.param("serverId");
                let Some(s) = self.servers.iter().find(|s| s.id == id) else {
                    return not_found(format!("Server {id} not found"));
                };
                let v = self.server_json(s);
                self.read_servers(&BTreeSet::from([id.to_owned()]));
                Ok((200, Some(v)))
            }
            "serversServerIdPrivateNetworksPost" => self.join(call, NetworkKind::Private),
            "serversServerIdPublicNetworksPost" => self.join(call, NetworkKind::Public),
            "serversServerIdPrivateNetworksPatch" => {
                self.update_ips(call, NetworkKind::Private, "privateNetworkId")
            }
            "serversServerIdPublicNetworksPatch" => {
                self.update_ips(call, NetworkKind::Public, "publicNetworkId")
            }
            "deletePrivateNetwork" => self.leave(call, NetworkKind::Private, "privateNetworkId"),
            "serversServerIdPublicNetworksDelete" => {
                self.leave(call, NetworkKind::Public, "publicNetworkId")
            }
            "privateNetworksGet" => {
                let loc = call.query("location");
                let list = self
                    .private_networks
                    .iter()
                    .filter(|n| loc.is_none_or(|l| n.location == l))
                    .map(|n| self.private_json(n))
                    .collect();
                Ok((200, Some(Value::Array(list))))
            }
            "privateNetworksNetworkIdGet" => {
                let id = call.param("privateNetworkId");
                match self.private_networks.iter().find(|n| n.id == id) {
                    Some(n) => Ok((200, Some(self.private_json(n)))),
                    None => not_found(format!("Private network {id} not found")),
                }
            }
            "privateNetworksPost" => self.create_private(call),
            "privateNetworksNetworkIdPut" => self.update_private(call),
            "privateNetworksNetworkIdDelete" => self.delete_private(call),
            "publicNetworksGet" => {
                let loc = call.query("location");
                let shown: Vec<&PublicNetwork> = self
                    .public_networks
                    .iter()
                    .filter(|n| loc.is_none_or(|l| n.location == l))
                    .collect();
                let list = shown.iter().map(|n| self.public_json(n)).collect();
                let ids = shown.iter().map(|n| n.id.clone()).collect();
                let blocks = self.blocks_of_networks(&ids);
                self.read_blocks(&blocks);
                Ok((200, Some(Value::Array(list))))
            }
            "publicNetworksNetworkIdGet" => {
                let id = call.param("publicNetworkId");
                let Some(n) = self.public_networks.iter().find(|n| n.id == id) else {
                    return not_found(format!("Public network {id} not found"));
                };
                let v = self.public_json(n);
                let blocks = self.blocks_of_networks(&BTreeSet::from([id.to_owned()]));
                self.read_blocks(&blocks);
                Ok((200, Some(v)))
            }
            "publicNetworksPost" => self.create_public(call),
            "publicNetworksNetworkIdPatch" => self.update_public(call),
            "publicNetworksNetworkIdDelete" => self.delete_public(call),
            "publicNetworksNetworkIdIpBlocksPost" => self.attach_block(call),
            "publicNetworksNetworkIdIpBlocksIpBlockIdDelete" => self.detach_block(call),
            "ipBlocksGet" => {
                // Tags are not kept: a tag filter matches nothing.
                let list: Vec<Value> = if call.query("tag").is_some() {
                    Vec::new()
                } else {
                    self.ip_blocks.iter().map(Self::block_json).collect()
                };
                let ids = self.ip_blocks.iter().map(|b| b.id.clone()).collect();
                self.read_blocks(&ids);
                Ok((200, Some(Value::Array(list))))
            }
            "ipBlocksIpBlockIdGet" => {
                let id = call.param("ipBlockId");
                let Some(b) = self.ip_blocks.iter().find(|b| b.id == id) else {
                    return not_found(format!("IP block {id} not found"));
                };
                let v = Self::block_json(b);
                self.read_blocks(&BTreeSet::from([id.to_owned()]));
                Ok((200, Some(v)))
            }
            "ipBlocksPost" => self.create_block(call),
            "ipBlocksIpBlockIdPatch" => {
                let id = call.param("ipBlockId");
                let description = call.str_field("description");
                let Some(b) = self.ip_blocks.iter_mut().find(|b| b.id == id) else {
                    return not_found(format!("IP block {id} not found"));
                };
                if description.is_some() {
                    b.description = description;
                }
                Ok((200, Some(Self::block_json(b))))
            }
            "ipBlocksIpBlockIdDelete" => {
                let id = call.param("ipBlockId");
                let Some(i) = self.ip_blocks.iter().position(|b| b.id == id) else {
                    return not_found(format!("IP block {id} not found"));
                };
                let b = &self.ip_blocks[i];
                if let Some(r) = &b.assigned_resource_id {
                    return bad(format!(
                        "IP block {id} is {} to {r}: remove it from the network first",
                        b.status
                    ));
                }
                self.ip_blocks.remove(i);
                Ok((
                    200,
                    Some(json!({ "result": "IP Block has been deleted.", "ipBlockId": id })),
                ))
            }
            "eventsGet" => self.events_get(call),
            other => Err(ApiError::new(501, format!("{other} is not emulated"))),
        }
    }

    // -- networks -----------------------------------------------------------------

    fn vlan_taken(&self, location: &str, vlan: u16) -> bool {
        self.private_networks
            .iter()
            .any(|n| n.location == location && n.vlan_id == vlan)
            || self
                .public_networks
                .iter()
                .any(|n| n.location == location && n.vlan_id == vlan)
    }

    fn pick_vlan(&self, location: &str, asked: Option<u64>) -> Result<u16, ApiError> {
        match asked {
            Some(v) => {
                let v = u16::try_from(v).unwrap_or(u16::MAX);
                if self.vlan_taken(location, v) {
                    bad(format!("VLAN {v} is already in use in {location}"))
                } else {
                    Ok(v)
                }
            }
            None => (FIRST_AUTO_VLAN..=4094)
                .find(|v| !self.vlan_taken(location, *v))
                .ok_or_else(|| ApiError::new(400, format!("No free VLAN left in {location}"))),
        }
    }

    fn create_private(&mut self, call: &Call<'_>) -> Answer {
        let name = call.str_field("name").unwrap_or_default();
        let location = call.str_field("location").unwrap_or_default();
        location_ok(&location)?;
        if !self.duplicate_names && self.private_networks.iter().any(|n| n.name == name) {
            return bad(format!("A private network named {name:?} already exists"));
        }
        let location_default = call.body().get("locationDefault") == Some(&Value::Bool(true));
        if location_default
            && self
                .private_networks
                .iter()
                .any(|n| n.location == location && n.location_default)
        {
            return bad(format!("{location} already has a default private network"));
        }
        let cidr = match call.str_field("cidr") {
            None if call.force() => None,
            None => return bad("cidr is required (or force=true for a network without a range)"),
            Some(text) => {
                let net: Ipv4Net = text.parse().map_err(|_| {
                    ApiError::new(400, format!("cidr {text:?} is not an IPv4 CIDR"))
                })?;
                if net.network() != net.addr() {
                    return bad(format!(
                        "cidr {text}: {} is not its network address",
                        net.addr()
                    ));
                }
                if !is_rfc1918(&net) || net.prefix_len() > 30 {
                    return bad(format!(
                        "cidr {text} must be a private (RFC 1918) range of /30 or larger"
                    ));
                }
                if let Some(other) = self.private_networks.iter().find(|n| {
                    n.location == location
                        && n.cidr
                            .as_ref()
                            .and_then(|c| c.parse::<Ipv4Net>().ok())
                            .is_some_and(|c| c.contains(&net) || net.contains(&c))
                }) {
                    return bad(format!(
                        "cidr {text} overlaps private network {} ({})",
                        other.name,
                        other.cidr.as_deref().unwrap_or("")
                    ));
                }
                Some(net.to_string())
            }
        };
        let vlan_id =
            self.pick_vlan(&location, call.body().get("vlanId").and_then(Value::as_u64))?;
        let n = PrivateNetwork {
            id: self.ids.id(),
            name,
            description: call.str_field("description"),
            location,
            vlan_id,
            cidr,
            location_default,
            created_on: rfc3339_ms(self.now_ms),
        };
        let v = self.private_json(&n);
        self.private_networks.push(n);
        Ok((201, Some(v)))
    }

    fn update_private(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("privateNetworkId").to_owned();
        let name = call.str_field("name").unwrap_or_default();
        let location_default = call.body().get("locationDefault") == Some(&Value::Bool(true));
        let Some(i) = self.private_networks.iter().position(|n| n.id == id) else {
            return not_found(format!("Private network {id} not found"));
        };
        if !self.duplicate_names
            && self
                .private_networks
                .iter()
                .any(|n| n.id != id && n.name == name)
        {
            return bad(format!("A private network named {name:?} already exists"));
        }
        let location = self.private_networks[i].location.clone();
        if location_default
            && self
                .private_networks
                .iter()
                .any(|n| n.id != id && n.location == location && n.location_default)
        {
            return bad(format!("{location} already has a default private network"));
        }
        let description = call.str_field("description");
        let n = &mut self.private_networks[i];
        n.name = name;
        n.location_default = location_default;
        if description.is_some() {
            n.description = description;
        }
        let n = n.clone();
        Ok((200, Some(self.private_json(&n))))
    }

    fn delete_private(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("privateNetworkId");
        let Some(i) = self.private_networks.iter().position(|n| n.id == id) else {
            return not_found(format!("Private network {id} not found"));
        };
        let members: Vec<String> = self
            .members_of(NetworkKind::Private, id)
            .map(|m| m.server_id.clone())
            .collect();
        if !members.is_empty() {
            return bad(format!(
                "Private network {id} has members ({}): remove them from it first",
                members.join(", ")
            ));
        }
        self.private_networks.remove(i);
        Ok((204, None))
    }

    fn create_public(&mut self, call: &Call<'_>) -> Answer {
        let name = call.str_field("name").unwrap_or_default();
        let location = call.str_field("location").unwrap_or_default();
        location_ok(&location)?;
        if !self.duplicate_names && self.public_networks.iter().any(|n| n.name == name) {
            return bad(format!("A public network named {name:?} already exists"));
        }
        let block_ids: Vec<String> = call
            .body()
            .get("ipBlocks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|b| b.get("id").and_then(Value::as_str).map(str::to_owned))
            .collect();
        if block_ids.len() > MAX_BLOCKS_PER_NETWORK {
            return bad(format!(
                "At most {MAX_BLOCKS_PER_NETWORK} IPv4 blocks per public network"
            ));
        }
        let mut seen = BTreeSet::new();
        for b in &block_ids {
            if !seen.insert(b) {
                return bad(format!("IP block {b} is given twice"));
            }
            self.attachable(b, &location)?;
        }
        let vlan_id =
            self.pick_vlan(&location, call.body().get("vlanId").and_then(Value::as_u64))?;
        let n = PublicNetwork {
            id: self.ids.id(),
            name,
            description: call.str_field("description"),
            location,
            vlan_id,
            ra_enabled: call.body().get("raEnabled") == Some(&Value::Bool(true)),
            created_on: rfc3339_ms(self.now_ms),
        };
        for b in &block_ids {
            self.attach(b, &n.id);
        }
        let v = self.public_json(&n);
        self.public_networks.push(n);
        Ok((201, Some(v)))
    }

    fn update_public(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("publicNetworkId").to_owned();
        let Some(i) = self.public_networks.iter().position(|n| n.id == id) else {
            return not_found(format!("Public network {id} not found"));
        };
        if let Some(name) = call.str_field("name") {
            if !self.duplicate_names
                && self
                    .public_networks
                    .iter()
                    .any(|n| n.id != id && n.name == name)
            {
                return bad(format!("A public network named {name:?} already exists"));
            }
            self.public_networks[i].name = name;
        }
        if let Some(d) = call.str_field("description") {
            self.public_networks[i].description = Some(d);
        }
        if let Some(ra) = call.body().get("raEnabled").and_then(Value::as_bool) {
            self.public_networks[i].ra_enabled = ra;
        }
        let n = self.public_networks[i].clone();
        Ok((200, Some(self.public_json(&n))))
    }

    fn delete_public(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("publicNetworkId").to_owned();
        let Some(i) = self.public_networks.iter().position(|n| n.id == id) else {
            return not_found(format!("Public network {id} not found"));
        };
        let members: Vec<String> = self
            .members_of(NetworkKind::Public, &id)
            .map(|m| m.server_id.clone())
            .collect();
        if !members.is_empty() {
            return bad(format!(
                "Public network {id} has members ({}): remove them from it first",
                members.join(", ")
            ));
        }
        self.public_networks.remove(i);
        for b in &mut self.ip_blocks {
            if b.assigned_resource_id.as_deref() == Some(id.as_str()) {
                b.assigned_resource_id = None;
                b.status = "unassigned".into();
                b.reads_left = 0;
            }
        }
        Ok((204, None))
    }

    /// Whether block `id` may be attached to a network in `location`.
    fn attachable(&self, id: &str, location: &str) -> Result<(), ApiError> {
        let Some(b) = self.ip_blocks.iter().find(|b| b.id == id) else {
            return bad(format!("IP block {id} not found"));
        };
        if b.location != location {
            return bad(format!(
                "IP block {id} is in {}, the network in {location}",
                b.location
            ));
        }
        if let Some(r) = &b.assigned_resource_id {
            return conflict(format!("IP block {id} is already assigned to {r}"));
        }
        Ok(())
    }

    fn attach(&mut self, block: &str, network: &str) {
        let reads = self.block_reads;
        if let Some(b) = self.ip_blocks.iter_mut().find(|b| b.id == block) {
            b.assigned_resource_id = Some(network.to_owned());
            b.reads_left = reads;
            b.status = if reads == 0 { "assigned" } else { "assigning" }.into();
        }
    }

    fn attach_block(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("publicNetworkId").to_owned();
        let block = call.str_field("id").unwrap_or_default();
        let Some(n) = self.public_networks.iter().find(|n| n.id == id) else {
            return not_found(format!("Public network {id} not found"));
        };
        let location = n.location.clone();
        self.attachable(&block, &location)?;
        let attached = self
            .ip_blocks
            .iter()
            .filter(|b| b.assigned_resource_id.as_deref() == Some(id.as_str()))
            .count();
        if attached >= MAX_BLOCKS_PER_NETWORK {
            return bad(format!(
                "At most {MAX_BLOCKS_PER_NETWORK} IPv4 blocks per public network"
            ));
        }
        self.attach(&block, &id);
        let b = self
            .ip_blocks
            .iter()
            .find(|b| b.id == block)
            .expect("the block was just attached");
        Ok((202, Some(self.public_block_json(b))))
    }

    fn detach_block(&mut self, call: &Call<'_>) -> Answer {
        let id = call.param("publicNetworkId").to_owned();
        let block = call.param("ipBlockId").to_owned();
        if !self.public_networks.iter().any(|n| n.id == id) {
            return not_found(format!("Public network {id} not found"));
        }
        let Some(b) = self
            .ip_blocks
            .iter()
            .find(|b| b.id == block && b.assigned_resource_id.as_deref() == Some(id.as_str()))
        else {
            return not_found(format!("IP block {block} is not on public network {id}"));
        };
        if !call.force() && self.used_in_block(b) > 0 {
            return conflict(format!(
                "IP block {block} has IPs assigned to members of the network: remove them first (or force=true)"
            ));
        }
        let b = self
            .ip_blocks
            .iter_mut()
            .find(|b| b.id == block)
            .expect("found above");
        b.assigned_resource_id = None;
        b.status = "unassigned".into();
        b.reads_left = 0;
        Ok((
            202,
            Some(json!("The IP block is being removed from the network.")),
        ))
    }

    // -- IP blocks ----------------------------------------------------------------

    fn create_block(&mut self, call: &Call<'_>) -> Answer {
        let location = call.str_field("location").unwrap_or_default();
        location_ok(&location)?;
        if call.str_field("ipVersion").is_some_and(|v| v != "V4") {
            return bad("Only V4 blocks are emulated");
        }
        let size = call.str_field("cidrBlockSize").unwrap_or_default();
        if !BLOCK_SIZES.contains(&size.as_str()) {
            return bad(format!(
                "cidrBlockSize {size:?} is not one of {}",
                BLOCK_SIZES.join(", ")
            ));
        }
        let prefix: u8 = size[1..].parse().expect("BLOCK_SIZES are /NN");
        let pool: Ipv4Net = PUBLIC_POOL.parse().expect("the pool is a CIDR");
        let taken: Vec<Ipv4Net> = self
            .ip_blocks
            .iter()
            .filter_map(|b| b.cidr.parse().ok())
            .collect();
        let net = pool
            .subnets(prefix)
            .expect("a block is inside the pool")
            .find(|s| !taken.iter().any(|t| t.contains(s) || s.contains(t)))
            .ok_or_else(|| ApiError::new(400, "The IP block pool is exhausted"))?;
        let b = IpBlock {
            id: self.ids.id(),
            location,
            cidr_block_size: size,
            cidr: net.to_string(),
            status: "unassigned".into(),
            assigned_resource_id: None,
            description: call.str_field("description"),
            created_on: rfc3339_ms(self.now_ms),
            reads_left: 0,
        };
        let v = Self::block_json(&b);
        self.ip_blocks.push(b);
        Ok((201, Some(v)))
    }

    // -- memberships ----------------------------------------------------------------

    /// The server (other than `except`) whose membership of `network`
    /// holds `a`, if any.
    fn used_elsewhere(
        &self,
        kind: NetworkKind,
        network: &str,
        a: Ipv4Addr,
        except: Option<&str>,
    ) -> Option<&str> {
        self.members_of(kind, network)
            .filter(|m| except != Some(m.server_id.as_str()))
            .find(|m| m.addresses.contains(&a))
            .map(|m| m.server_id.as_str())
    }

    fn join(&mut self, call: &Call<'_>, kind: NetworkKind) -> Answer {
        let server_id = call.param("serverId").to_owned();
        let Some(server) = self.servers.iter().find(|s| s.id == server_id) else {
            return not_found(format!("Server {server_id} not found"));
        };
        if !matches!(server.status.as_str(), "powered-on" | "powered-off") {
            return bad(format!(
                "Server {server_id} is {}: its networks cannot change now",
                server.status
            ));
        }
        let network = call.str_field("id").unwrap_or_default();
        let what = match kind {
            NetworkKind::Private => "private",
            NetworkKind::Public => "public",
        };
        let location = match kind {
            NetworkKind::Private => self
                .private_networks
                .iter()
                .find(|n| n.id == network)
                .map(|n| n.location.clone()),
            NetworkKind::Public => self
                .public_networks
                .iter()
                .find(|n| n.id == network)
                .map(|n| n.location.clone()),
        };
        let Some(location) = location else {
            return bad(format!("The {what} network {network} does not exist"));
        };
        if location != server.location {
            return bad(format!(
                "Server {server_id} is in {}, the {what} network {network} in {location}",
                server.location
            ));
        }
        if self
            .members_of(kind, &network)
            .any(|m| m.server_id == server_id)
        {
            return bad(format!(
                "Server {server_id} is already a member of the {what} network {network}"
            ));
        }
        let given: Option<Vec<String>> =
            call.body().get("ips").and_then(Value::as_array).map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            });
        let dhcp = call.body().get("dhcp") == Some(&Value::Bool(true));
        let force = call.force();
        let (ips, addresses) = match kind {
            NetworkKind::Private => self.private_ips(&network, given, dhcp, force, None)?,
            NetworkKind::Public => {
                if call.body().get("computeSlaacIp") == Some(&Value::Bool(true)) {
                    return bad("computeSlaacIp applies to IPv6 blocks, which are not emulated");
                }
                self.public_ips(&network, given.unwrap_or_default(), force, false, None)?
            }
        };
        let reads = self.membership_reads;
        let m = Membership {
            server_id,
            network_id: network.clone(),
            kind,
            ips: ips.clone(),
            addresses,
            dhcp,
            status: MembershipStatus::Joining,
            reads_left: reads,
        };
        let answer = match kind {
            NetworkKind::Private => json!({
                "id": network, "ips": ips, "dhcp": dhcp, "statusDescription": "in-progress"
            }),
            NetworkKind::Public => json!({
                "id": network, "ips": ips, "statusDescription": "in-progress"
            }),
        };
        self.memberships.push(m);
        self.finish_memberships();
        Ok((202, Some(answer)))
    }

    fn private_ips(
        &self,
        network: &str,
        given: Option<Vec<String>>,
        dhcp: bool,
        force: bool,
        except: Option<&str>,
    ) -> Result<(Vec<String>, Vec<Ipv4Addr>), ApiError> {
        let n = self
            .private_networks
            .iter()
            .find(|n| n.id == network)
            .expect("checked by the caller");
        let range: Option<Ipv4Net> = n.cidr.as_ref().and_then(|c| c.parse().ok());
        let given_any = given.as_ref().is_some_and(|g| !g.is_empty());
        if dhcp {
            if given_any {
                return bad("ips must be empty when dhcp is true");
            }
            return Ok((Vec::new(), Vec::new()));
        }
        let Some(range) = range else {
            if given_any {
                return bad(format!("The private network {network} has no IP range"));
            }
            return Ok((Vec::new(), Vec::new()));
        };
        match given {
            // Absent: the next available IP of the network.
            None => {
                let next = range
                    .hosts()
                    .find(|a| {
                        self.used_elsewhere(NetworkKind::Private, network, *a, None)
                            .is_none()
                    })
                    .ok_or_else(|| {
                        ApiError::new(400, format!("The private network {network} is full"))
                    })?;
                Ok((vec![next.to_string()], vec![next]))
            }
            Some(entries) => {
                let mut problems = Vec::new();
                let mut addresses = Vec::new();
                for e in &entries {
                    match parse_entry(e, true) {
                        Err(p) => problems.push(p),
                        Ok(list) => {
                            for a in list {
                                if !host_of(&range, a) {
                                    problems.push(format!(
                                        "{a} is not a host address of the network's range {range}"
                                    ));
                                } else if addresses.contains(&a) {
                                    problems.push(format!("{a} is given twice"));
                                } else if let (false, Some(other)) = (
                                    force,
                                    self.used_elsewhere(NetworkKind::Private, network, a, except),
                                ) {
                                    problems.push(format!("{a} is already used by server {other}"));
                                } else {
                                    addresses.push(a);
                                }
                            }
                        }
                    }
                }
                if addresses.len() > 256 {
                    problems.push("at most 256 IPs per server and network".into());
                }
                if problems.is_empty() {
                    Ok((entries, addresses))
                } else {
                    Err(ApiError {
                        status: 400,
                        message: problems[0].clone(),
                        validation: problems,
                    })
                }
            }
        }
    }

    /// Public `ips` (`ranges`: `a - b` entries too, as the PATCH's
    /// `ServerNetworkUpdate` allows), free but for `except`'s own.
    fn public_ips(
        &self,
        network: &str,
        entries: Vec<String>,
        force: bool,
        ranges: bool,
        except: Option<&str>,
    ) -> Result<(Vec<String>, Vec<Ipv4Addr>), ApiError> {
        if entries.is_empty() {
            if force {
                return Ok((Vec::new(), Vec::new()));
            }
            return bad("At least 1 IP address is required (or force=true)");
        }
        let blocks: Vec<(&IpBlock, Ipv4Net)> = self
            .ip_blocks
            .iter()
            .filter(|b| b.assigned_resource_id.as_deref() == Some(network))
            .filter_map(|b| b.cidr.parse().ok().map(|n| (b, n)))
            .collect();
        let mut problems = Vec::new();
        let mut addresses = Vec::new();
        let parsed: Vec<Ipv4Addr> = entries
            .iter()
            .flat_map(|e| match parse_entry(e, ranges) {
                Ok(list) => list,
                Err(p) => {
                    problems.push(p);
                    Vec::new()
                }
            })
            .collect();
        for a in parsed {
            let Some((b, net)) = blocks.iter().find(|(_, n)| n.contains(&a)) else {
                problems.push(format!(
                    "{a} is not inside an IP block of the public network {network}"
                ));
                continue;
            };
            if b.status != "assigned" {
                problems.push(format!(
                    "IP block {} is still being assigned to the network",
                    b.id
                ));
            } else if !host_of(net, a) || block_gateway(net) == Some(a) {
                problems.push(format!(
                    "{a} is the network, gateway or broadcast address of {net}"
                ));
            } else if addresses.contains(&a) {
                problems.push(format!("{a} is given twice"));
            } else if let (false, Some(other)) = (
                force,
                self.used_elsewhere(NetworkKind::Public, network, a, except),
            ) {
                problems.push(format!("{a} is already used by server {other}"));
            } else {
                addresses.push(a);
            }
        }
        if problems.is_empty() {
            Ok((entries, addresses))
        } else {
            Err(ApiError {
                status: 400,
                message: problems[0].clone(),
                validation: problems,
            })
        }
    }

    /// `PATCH …/{private,public}-networks/{id}` (`ServerNetworkUpdate`):
    /// replaces the IPs of an assigned membership at once, by the rules of
    /// joining (the server's own IPs count as free); 200 with the
    /// membership.
    fn update_ips(&mut self, call: &Call<'_>, kind: NetworkKind, param: &str) -> Answer {
        let server_id = call.param("serverId").to_owned();
        let network = call.param(param).to_owned();
        let Some(server) = self.servers.iter().find(|s| s.id == server_id) else {
            return not_found(format!("Server {server_id} not found"));
        };
        if !matches!(server.status.as_str(), "powered-on" | "powered-off") {
            return bad(format!(
                "Server {server_id} is {}: its networks cannot change now",
                server.status
            ));
        }
        let Some(i) = self
            .memberships
            .iter()
            .position(|m| m.kind == kind && m.server_id == server_id && m.network_id == network)
        else {
            return not_found(format!(
                "Server {server_id} is not a member of network {network}"
            ));
        };
        let m = &self.memberships[i];
        if m.status != MembershipStatus::Assigned {
            return conflict(format!(
                "The membership of server {server_id} in network {network} is in progress: update its IPs once it is assigned"
            ));
        }
        let given: Vec<String> = call
            .body()
            .get("ips")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let force = call.force();
        if given.is_empty() && !force {
            return bad("At least 1 IP address is required (or force=true)");
        }
        let dhcp = m.dhcp;
        let (ips, addresses) = match kind {
            NetworkKind::Private => {
                if dhcp && !given.is_empty() {
                    return bad("ips must be empty when dhcp is true");
                }
                self.private_ips(&network, Some(given), false, force, Some(&server_id))?
            }
            NetworkKind::Public => {
                self.public_ips(&network, given, force, true, Some(&server_id))?
            }
        };
        let m = &mut self.memberships[i];
        m.ips.clone_from(&ips);
        m.addresses = addresses;
        let answer = match kind {
            NetworkKind::Private => json!({
                "id": network, "ips": ips, "dhcp": dhcp, "statusDescription": "assigned"
            }),
            NetworkKind::Public => json!({
                "id": network, "ips": ips, "statusDescription": "assigned"
            }),
        };
        Ok((200, Some(answer)))
    }

    fn leave(&mut self, call: &Call<'_>, kind: NetworkKind, param: &str) -> Answer {
        let server_id = call.param("serverId").to_owned();
        let network = call.param(param).to_owned();
        if !self.servers.iter().any(|s| s.id == server_id) {
            return not_found(format!("Server {server_id} not found"));
        }
        let reads = self.membership_reads;
        let Some(m) = self
            .memberships
            .iter_mut()
            .find(|m| m.kind == kind && m.server_id == server_id && m.network_id == network)
        else {
            return not_found(format!(
                "Server {server_id} is not a member of network {network}"
            ));
        };
        if m.status != MembershipStatus::Leaving {
            m.status = MembershipStatus::Leaving;
            m.reads_left = reads;
        }
        self.finish_memberships();
        Ok((
            202,
            Some(json!("The server is being removed from the network.")),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        let ms = 1_735_689_600_123;
        assert_eq!(rfc3339_ms(ms), "2025-01-01T00:00:00.123Z");
        assert_eq!(parse_rfc3339_ms("2025-01-01T00:00:00.123Z"), Some(ms));
        assert_eq!(parse_rfc3339_ms("2025-01-01T01:00:00.123+01:00"), Some(ms));
        assert_eq!(parse_rfc3339_ms("2025-01-01T00:00:00Z"), Some(ms - 123));
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
    }

    #[test]
    fn entries_parse() {
        assert_eq!(parse_entry("10.0.0.1", true).unwrap().len(), 1);
        assert_eq!(parse_entry("10.0.0.1 - 10.0.0.3", true).unwrap().len(), 3);
        assert!(parse_entry("10.0.0.1 - 10.0.0.3", false).is_err());
        assert!(parse_entry("10.0.0.3-10.0.0.1", true).is_err());
        let net: Ipv4Net = "198.18.0.0/29".parse().unwrap();
        assert!(!host_of(&net, "198.18.0.0".parse().unwrap()));
        assert!(!host_of(&net, "198.18.0.7".parse().unwrap()));
        assert_eq!(block_gateway(&net), Some("198.18.0.1".parse().unwrap()));
    }
}
