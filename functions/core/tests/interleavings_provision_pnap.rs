//! The interleaving checker over the progress record of pools backed by
//! phoenixNAP (`spec.phoenixnap`): creation and teardown of a pool's
//! phoenixNAP resources by several instances at once, every KV operation a
//! yield point, a crash possible before any of them (so also between a
//! phoenixNAP call and the KV operation after it), on each backend's real
//! compare-and-swap semantics. The same checker as
//! `interleavings_provision.rs` (Metal's VRF), sharing its watched store,
//! its in-flight requests and its plans (`interleavings/provision_kit.rs`).
//!
//! The instances run the step's real code, [`provision`] and
//! [`deprovision`] (`provision::step`) with phoenixNAP as the cloud
//! (`provision::vrf_pnap`, `provision::pnap_pools`, the real [`Pnap`]
//! client), against phoenixNAP as a ledger: an [`HttpClient`] answering the
//! token endpoint and the Networks and IP API calls the pools make (create,
//! list by location, get, delete; an IP block's order, listing, detach and
//! deletion), checking each request's shape as `pnap_pools` sends it
//! (headers, query, the body's fields and values). Two pools:
//! - **private**: a private network created with its `cidr` (one
//!   resource, [`Resource::Vlan`]);
//! - **public**: an IP block ordered (`cidrBlockSize`), then a public
//!   network created with it attached; torn down network first (which
//!   frees the block), then the block.
//!
//! The ledger keeps phoenixNAP's rules the steps rely on (from the
//! simulator's, `tests/src/pnap_sim`): a network name is unique per kind
//! (a second creation under it is a 400), a public network is created only
//! with an existing, unassigned block of its location (409 otherwise) and
//! frees its blocks when deleted, an assigned block is not deleted (400).
//!
//! Invariants, checked at every store write and every creation:
//! - the record's retired uids only grow, and no live record belongs to a
//!   retired uid;
//! - nothing is created in phoenixNAP for a uid once its tombstone is
//!   written (a network by its name, a block by its description);
//! - a live record holds only resources created for its uid, and a public
//!   network is created only with its own uid's block.
//!
//! And after each schedule, once recovery ran (after the lease: the
//! deleted pool's teardown to its tombstone, the live pool's provisioning
//! to ready):
//! - nothing created for a deleted pool is left in phoenixNAP;
//! - a live pool holds exactly one network (and, public, one block, on
//!   that network), created for it, the recorded ones;
//! - without a crash, a teardown that answered `Gone` left nothing, and no
//!   instance failed but as the step may.
//!
//! The number of schedules explored is printed. Every KV operation of the
//! pool index (the step lists and unlists the pool there) is a yield point
//! too, which makes every schedule of two full chains out of reach: see
//! each test for what is exhaustive and what is sampled.

#[path = "interleavings/provision_kit.rs"]
mod provision_kit;
#[path = "interleavings/sched.rs"]
mod sched;

use std::sync::Mutex;

use metal_ipam_core::cloud::retry::RetryPolicy;
use metal_ipam_core::error::Error;
use metal_ipam_core::ipam::pnap::PnapSpec;
use metal_ipam_core::ipam::vrf::Resource;
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::pnap::auth::Credentials;
use metal_ipam_core::pnap::client::{Pnap, PnapConfig};
use metal_ipam_core::ports::http::{HttpClient, TransportError};
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::ports::Env;
use metal_ipam_core::provision::plan::{Decided, Progress, INTENT_LEASE_S};
use metal_ipam_core::provision::pnap_pools::{fit_name, NETWORK_DESCRIPTION};
use metal_ipam_core::provision::step::{deprovision, provision, ProvisionPhase};
use metal_ipam_core::provision::target::{tag_for, Target};
use metal_ipam_core::provision::transitions::PoolRecord;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::{json, Map, Value};

use provision_kit::{
    caught, ctx, pct, pool, stored, stuck, Explore, InFlight, Verdict, Watched, LATER, NOW, PAIR,
    U1, U2,
};
use sched::{Chooser, SchedEnv};

const API: &str = "http://pnap.test";
const TOKEN_URL: &str = "http://auth.pnap.test/auth/realms/BMC/protocol/openid-connect/token";
const PRIVATE: &str = "/networks/v1/private-networks";
const PUBLIC: &str = "/networks/v1/public-networks";
const BLOCKS: &str = "/ips/v1/ip-blocks";
const LOCATION: &str = "PHX";
const CIDR: &str = "10.20.0.0/24";
const BLOCK_SIZE: u8 = 29;

/// The pool's backing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A private network created with its cidr.
    Private,
    /// An IP block ordered, then a public network created with it.
    Public,
}

fn spec(shape: Shape) -> PnapSpec {
    let v = match shape {
        Shape::Private => json!({"location": LOCATION, "privateNetwork": {"cidr": CIDR}}),
        Shape::Public => json!({"location": LOCATION, "publicNetwork": {},
            "ipBlock": {"cidrBlockSize": BLOCK_SIZE}}),
    };
    let s = PnapSpec::from_json(&v).unwrap();
    s.validate().unwrap();
    s
}

fn config() -> PnapConfig {
    PnapConfig {
        api_url: API.into(),
        token_url: TOKEN_URL.into(),
        credentials: Credentials {
            client_id: "metal-ipam".into(),
            client_secret: "s".into(),
        },
        retry: RetryPolicy::default(),
    }
}

/// The name of the network, and the description of the block, created for
/// incarnation `u`.
fn name_for(u: &str) -> String {
    fit_name(&tag_for(&pool(), Some(u)))
}

/// The incarnation a network name or block description was made for.
fn uid_of(name: Option<&str>) -> Option<String> {
    [U1, U2]
        .into_iter()
        .find(|u| name == Some(name_for(u).as_str()))
        .map(str::to_string)
}

/// A phoenixNAP network, created and deleted.
#[derive(Debug, Clone)]
struct Net {
    id: String,
    public: bool,
    name: String,
    description: Option<String>,
    vlan: u16,
    cidr: Option<String>,
    /// A public network's blocks.
    blocks: Vec<String>,
    alive: bool,
    created_on: String,
}

/// A phoenixNAP IP block, ordered and deleted.
#[derive(Debug, Clone)]
struct Blk {
    id: String,
    description: Option<String>,
    cidr: String,
    /// The public network it is assigned to.
    on: Option<String>,
    alive: bool,
    created_on: String,
}

/// phoenixNAP's state: every network and block ever made.
#[derive(Debug, Clone, Default)]
struct Cloud {
    nets: Vec<Net>,
    blocks: Vec<Blk>,
    made: u32,
}

impl Cloud {
    fn stamp(&mut self) -> String {
        self.made += 1;
        format!("2025-01-01T00:{:02}:{:02}Z", self.made / 60, self.made % 60)
    }

    /// The uid resource `id` was made for.
    fn owner_of(&self, id: &str) -> Option<String> {
        if let Some(n) = self.nets.iter().find(|n| n.id == id) {
            return uid_of(Some(&n.name))
                .filter(|_| n.description.as_deref() == Some(NETWORK_DESCRIPTION));
        }
        self.blocks
            .iter()
            .find(|b| b.id == id)
            .and_then(|b| uid_of(b.description.as_deref()))
    }

    fn alive_nets(&self) -> Vec<Net> {
        self.nets.iter().filter(|n| n.alive).cloned().collect()
    }

    fn alive_blocks(&self) -> Vec<Blk> {
        self.blocks.iter().filter(|b| b.alive).cloned().collect()
    }

    fn net_json(&self, n: &Net) -> Value {
        let mut v = json!({"id": n.id, "name": n.name, "vlanId": n.vlan,
            "location": LOCATION, "status": "READY", "memberships": [],
            "createdOn": n.created_on});
        if let Some(d) = &n.description {
            v["description"] = json!(d);
        }
        if n.public {
            let blocks: Vec<Value> = n
                .blocks
                .iter()
                .filter_map(|id| self.blocks.iter().find(|b| &b.id == id))
                .map(|b| json!({"id": b.id, "cidr": b.cidr, "usedIpsCount": "0"}))
                .collect();
            v["ipBlocks"] = json!(blocks);
        } else if let Some(c) = &n.cidr {
            v["cidr"] = json!(c);
        }
        v
    }

    fn block_json(b: &Blk) -> Value {
        let mut v = json!({"id": b.id, "location": LOCATION,
            "cidrBlockSize": format!("/{BLOCK_SIZE}"), "cidr": b.cidr,
            "ipVersion": "V4", "createdOn": b.created_on,
            "status": if b.on.is_some() { "assigned" } else { "unassigned" }});
        if let Some(d) = &b.description {
            v["description"] = json!(d);
        }
        if let Some(on) = &b.on {
            v["assignedResourceId"] = json!(on);
            v["assignedResourceType"] = json!("network");
        }
        v
    }
}

/// phoenixNAP as a ledger, answering the requests the steps make and
/// checking their shapes; and the watcher of the invariants checked as
/// resources are created.
struct Ledger<'a> {
    cloud: Mutex<Cloud>,
    kv: &'a MemKv,
    violations: &'a Mutex<Vec<String>>,
}

fn reply(status: u16, body: Option<Value>) -> http::Response<Vec<u8>> {
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(bytes)
        .unwrap()
}

fn refused(status: u16, message: &str) -> http::Response<Vec<u8>> {
    reply(
        status,
        Some(json!({"message": message, "validationErrors": []})),
    )
}

/// The fields of a JSON object body, checked against `allowed` (and each
/// of `required` present).
fn fields<'b>(
    body: &'b Value,
    allowed: &[&str],
    required: &[&str],
    bad: &mut Vec<String>,
) -> Option<&'b Map<String, Value>> {
    let Some(o) = body.as_object() else {
        bad.push(format!("a body that is not an object: {body}"));
        return None;
    };
    for k in o.keys() {
        if !allowed.contains(&k.as_str()) {
            bad.push(format!("an unexpected field {k:?} in {body}"));
        }
    }
    for k in required {
        if !o.contains_key(*k) {
            bad.push(format!("no {k:?} in {body}"));
        }
    }
    Some(o)
}

/// Whether `name` is a network name phoenixNAP accepts
/// (`^(?=.*[a-zA-Z])([a-zA-Z0-9(). -])+$`, 1–100 characters).
fn valid_name(name: &str) -> bool {
    (1..=100).contains(&name.len())
        && name.chars().any(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "(). -".contains(c))
}

impl Ledger<'_> {
    fn snapshot(&self) -> Cloud {
        self.cloud.lock().unwrap().clone()
    }

    fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }

    /// A creation for `uid` (from a name or description): never once its
    /// tombstone is written.
    fn created_for(&self, what: &str, uid: Option<&str>) {
        if let (Some(u), Some(p)) = (uid, stored(self.kv)) {
            if p.retired.iter().any(|r| r == u) {
                self.violation(format!("{what} created for {u} after its tombstone"));
            }
        }
    }

    fn token(&self, req: &http::Request<Vec<u8>>) -> http::Response<Vec<u8>> {
        let mut bad = Vec::new();
        let h = |k: &str| {
            req.headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        if req.method() != http::Method::POST {
            bad.push(format!("a token request by {}", req.method()));
        }
        if !h("authorization").starts_with("Basic ") {
            bad.push("a token request without HTTP Basic".into());
        }
        if h("content-type") != "application/x-www-form-urlencoded" {
            bad.push(format!("a token request of {:?}", h("content-type")));
        }
        if req.body().as_slice() != b"grant_type=client_credentials" {
            bad.push("a token request without grant_type=client_credentials".into());
        }
        for b in bad {
            self.violation(b);
        }
        reply(
            200,
            Some(json!({"access_token": "t", "token_type": "Bearer", "expires_in": 3600})),
        )
    }

    fn api(&self, req: &http::Request<Vec<u8>>) -> http::Response<Vec<u8>> {
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let mut bad = Vec::new();
        let header = |k: &str| req.headers().get(k).and_then(|v| v.to_str().ok());
        if header("authorization") != Some("Bearer t") {
            bad.push(format!("{method} {path} without the bearer token"));
        }
        if header("accept") != Some("application/json") {
            bad.push(format!("{method} {path} not accepting JSON"));
        }
        let body: Value = if req.body().is_empty() {
            Value::Null
        } else {
            if header("content-type") != Some("application/json") {
                bad.push(format!("{method} {path} with a body not said to be JSON"));
            }
            serde_json::from_slice(req.body()).unwrap_or_else(|e| {
                bad.push(format!("{method} {path} with a body that is not JSON: {e}"));
                Value::Null
            })
        };
        let listing = method == "GET" && (path == PRIVATE || path == PUBLIC);
        if listing && query != format!("location={LOCATION}") {
            bad.push(format!("{method} {path} listed by {query:?}"));
        }
        if !listing && !query.is_empty() {
            bad.push(format!("{method} {path} with a query {query:?}"));
        }
        let answer = self.route(&method, &path, &body, &mut bad);
        for b in bad {
            self.violation(b);
        }
        answer
    }

    fn route(
        &self,
        method: &str,
        path: &str,
        body: &Value,
        bad: &mut Vec<String>,
    ) -> http::Response<Vec<u8>> {
        let mut cloud = self.cloud.lock().unwrap();
        let tail = |prefix: &str| {
            path.strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('/'))
                .map(str::to_string)
        };
        match method {
            "POST" if path == PRIVATE || path == PUBLIC => {
                let public = path == PUBLIC;
                let allowed: &[&str] = if public {
                    &["name", "description", "location", "vlanId", "ipBlocks"]
                } else {
                    &["name", "description", "location", "vlanId", "cidr"]
                };
                let required: &[&str] = if public {
                    &["name", "description", "location", "ipBlocks"]
                } else {
                    &["name", "description", "location", "cidr"]
                };
                let Some(o) = fields(body, allowed, required, bad) else {
                    return refused(400, "bad body");
                };
                let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
                if !valid_name(name) {
                    bad.push(format!("a network named {name:?}"));
                }
                if o.get("description").and_then(Value::as_str) != Some(NETWORK_DESCRIPTION) {
                    bad.push(format!("a network described as {:?}", o.get("description")));
                }
                if o.get("location").and_then(Value::as_str) != Some(LOCATION) {
                    bad.push(format!("a network in {:?}", o.get("location")));
                }
                if o.contains_key("vlanId") {
                    bad.push("a VLAN the spec does not name".into());
                }
                let uid = uid_of(Some(name));
                if uid.is_none() {
                    bad.push(format!("a network named {name:?}, no pool's"));
                }
                self.created_for(&format!("network {name}"), uid.as_deref());
                if cloud
                    .nets
                    .iter()
                    .any(|n| n.alive && n.public == public && n.name == name)
                {
                    return refused(400, &format!("network name {name} already in use"));
                }
                let mut blocks = Vec::new();
                if public {
                    let ids: Vec<&str> = o
                        .get("ipBlocks")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .map(|b| b.get("id").and_then(Value::as_str).unwrap_or_default())
                                .collect()
                        })
                        .unwrap_or_default();
                    if ids.len() != 1 {
                        bad.push(format!("a public network with blocks {ids:?}"));
                    }
                    for id in ids {
                        let Some(b) = cloud.blocks.iter().find(|b| b.alive && b.id == id) else {
                            return refused(400, &format!("IP block {id} does not exist"));
                        };
                        if b.on.is_some() {
                            return refused(409, &format!("IP block {id} is assigned"));
                        }
                        let of = uid_of(b.description.as_deref());
                        if of != uid {
                            bad.push(format!("a network of {uid:?} with {of:?}'s block {id}"));
                        }
                        blocks.push(id.to_string());
                    }
                } else if o.get("cidr").and_then(Value::as_str) != Some(CIDR) {
                    bad.push(format!("a private network of {:?}", o.get("cidr")));
                }
                let id = format!("net-{}", cloud.nets.len());
                for b in &blocks {
                    if let Some(b) = cloud.blocks.iter_mut().find(|x| &x.id == b) {
                        b.on = Some(id.clone());
                    }
                }
                let created_on = cloud.stamp();
                let vlan = 100 + cloud.nets.len() as u16;
                let n = Net {
                    id,
                    public,
                    name: name.into(),
                    description: Some(NETWORK_DESCRIPTION.into()),
                    vlan,
                    cidr: (!public).then(|| CIDR.to_string()),
                    blocks,
                    alive: true,
                    created_on,
                };
                cloud.nets.push(n.clone());
                reply(201, Some(cloud.net_json(&n)))
            }
            "GET" if path == PRIVATE || path == PUBLIC => {
                let public = path == PUBLIC;
                let list: Vec<Value> = cloud
                    .nets
                    .iter()
                    .filter(|n| n.alive && n.public == public)
                    .map(|n| cloud.net_json(n))
                    .collect();
                reply(200, Some(json!(list)))
            }
            "GET" | "DELETE" if tail(PRIVATE).or(tail(PUBLIC)).is_some() => {
                let public = path.starts_with(PUBLIC);
                let rest = tail(if public { PUBLIC } else { PRIVATE }).unwrap();
                if let Some((net, block)) = rest.split_once("/ip-blocks/") {
                    // Detaching a block from a public network.
                    if method != "DELETE" || !public {
                        bad.push(format!("{method} {path}"));
                        return refused(400, "unexpected");
                    }
                    let attached = cloud
                        .nets
                        .iter()
                        .any(|n| n.alive && n.id == net && n.blocks.iter().any(|b| b == block));
                    if !attached {
                        return refused(404, "not attached");
                    }
                    for n in cloud.nets.iter_mut().filter(|n| n.id == net) {
                        n.blocks.retain(|b| b != block);
                    }
                    for b in cloud.blocks.iter_mut().filter(|b| b.id == block) {
                        b.on = None;
                    }
                    return reply(202, Some(json!("detached")));
                }
                let Some(i) = cloud
                    .nets
                    .iter()
                    .position(|n| n.alive && n.public == public && n.id == rest)
                else {
                    return refused(404, &format!("network {rest} not found"));
                };
                if method == "GET" {
                    return reply(200, Some(cloud.net_json(&cloud.nets[i])));
                }
                // No member ever joins: the deletion is allowed, and frees
                // a public network's blocks.
                cloud.nets[i].alive = false;
                let freed = std::mem::take(&mut cloud.nets[i].blocks);
                for b in cloud.blocks.iter_mut().filter(|b| freed.contains(&b.id)) {
                    b.on = None;
                }
                reply(204, None)
            }
            "POST" if path == BLOCKS => {
                let Some(o) = fields(
                    body,
                    &["location", "cidrBlockSize", "description"],
                    &["location", "cidrBlockSize", "description"],
                    bad,
                ) else {
                    return refused(400, "bad body");
                };
                if o.get("location").and_then(Value::as_str) != Some(LOCATION) {
                    bad.push(format!("a block in {:?}", o.get("location")));
                }
                let size = format!("/{BLOCK_SIZE}");
                if o.get("cidrBlockSize").and_then(Value::as_str) != Some(size.as_str()) {
                    bad.push(format!("a block of {:?}", o.get("cidrBlockSize")));
                }
                let description = o
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let uid = uid_of(description.as_deref());
                if uid.is_none() {
                    bad.push(format!("a block described {description:?}, no pool's"));
                }
                self.created_for(&format!("block {description:?}"), uid.as_deref());
                let n = cloud.blocks.len();
                let created_on = cloud.stamp();
                let b = Blk {
                    id: format!("blk-{n}"),
                    description,
                    cidr: format!("198.51.100.{}/{BLOCK_SIZE}", 8 * (n + 1)),
                    on: None,
                    alive: true,
                    created_on,
                };
                cloud.blocks.push(b.clone());
                reply(201, Some(Cloud::block_json(&b)))
            }
            "GET" if path == BLOCKS => {
                let list: Vec<Value> = cloud
                    .blocks
                    .iter()
                    .filter(|b| b.alive)
                    .map(Cloud::block_json)
                    .collect();
                reply(200, Some(json!(list)))
            }
            "GET" | "DELETE" if tail(BLOCKS).is_some() => {
                let id = tail(BLOCKS).unwrap();
                let Some(i) = cloud.blocks.iter().position(|b| b.alive && b.id == id) else {
                    return refused(404, &format!("IP block {id} not found"));
                };
                if method == "GET" {
                    return reply(200, Some(Cloud::block_json(&cloud.blocks[i])));
                }
                if cloud.blocks[i].on.is_some() {
                    return refused(400, &format!("IP block {id} is assigned"));
                }
                cloud.blocks[i].alive = false;
                reply(200, Some(json!({"result": "OK", "ipBlockId": id})))
            }
            _ => {
                bad.push(format!("an unexpected request {method} {path}"));
                refused(400, "unexpected")
            }
        }
    }
}

impl HttpClient for Ledger<'_> {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        let uri = req.uri().to_string();
        if uri == TOKEN_URL {
            return Ok(self.token(&req));
        }
        if !uri.starts_with(API) {
            self.violation(format!("a request to {uri}"));
        }
        Ok(self.api(&req))
    }
}

/// What one instance does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// The provision step for incarnation `uid`.
    Provision(&'static str),
    /// The teardown of incarnation `uid` (its object is deleting).
    Teardown(&'static str),
    /// A mutation: the network's creation with writes that start from an
    /// empty record over a tombstone (as the step did before issue 17).
    /// The checker must catch it.
    Reviving(&'static str),
}

/// The store a schedule starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// U1's record, holding nothing yet.
    Empty,
    /// U1's record holding its network (and block).
    Held,
    /// U1's record with a crashed creator's intent on the network (a public
    /// pool's block recorded), the network made in phoenixNAP (its answer
    /// lost), recorded at `NOW - lease`.
    StaleIntent,
    /// U1's record holding its resources, its teardown started (U1 is
    /// deleted; U2 is its re-creation).
    Deleting,
}

/// Prepares `start` in `kv`, phoenixNAP's ledger in `cloud`.
fn prepare(kv: &MemKv, cloud: &mut Cloud, shape: Shape, start: Start) {
    let env = TestEnv::at(NOW - INTENT_LEASE_S);
    let c = ctx(kv, &env);
    let id = pool();
    let spec = spec(shape);
    // The pool is listed in the pool index from the start (as for Metal).
    metal_ipam_core::ipam::index::list_metal(&c, &id).unwrap();
    let record = PoolRecord::new(&c, &id, Some(U1));
    let chain = spec.chain();
    for (i, &r) in chain.iter().enumerate() {
        let decided = Decided::of(&spec, r);
        assert!(record
            .claim_intent(r, "ghost", NOW - INTENT_LEASE_S, &decided)
            .unwrap());
        if start == Start::Empty {
            record.withdraw_intent(r, "ghost").unwrap();
            return;
        }
        let made = match r {
            Resource::Reservation => {
                let created_on = cloud.stamp();
                cloud.blocks.push(Blk {
                    id: "blk-ghost".into(),
                    description: Some(name_for(U1)),
                    cidr: "198.51.100.0/29".into(),
                    on: None,
                    alive: true,
                    created_on,
                });
                "blk-ghost"
            }
            _ => {
                let created_on = cloud.stamp();
                let public = shape == Shape::Public;
                let blocks: Vec<String> = if public {
                    vec!["blk-ghost".into()]
                } else {
                    Vec::new()
                };
                for b in cloud.blocks.iter_mut().filter(|b| blocks.contains(&b.id)) {
                    b.on = Some("net-ghost".into());
                }
                cloud.nets.push(Net {
                    id: "net-ghost".into(),
                    public,
                    name: name_for(U1),
                    description: Some(NETWORK_DESCRIPTION.into()),
                    vlan: 99,
                    cidr: (!public).then(|| CIDR.to_string()),
                    blocks,
                    alive: true,
                    created_on,
                });
                "net-ghost"
            }
        };
        if start == Start::StaleIntent && i + 1 == chain.len() {
            return;
        }
        assert!(record.record_created(r, made, &decided).unwrap());
    }
    if start == Start::Deleting {
        record.begin_teardown().unwrap();
    }
}

/// Whether an instance's error is one the step may answer here: a
/// refusal of a retired or deleting incarnation, or a crash (the store
/// failing under the instance; a creation lost in flight).
fn expected(e: &Error) -> bool {
    matches!(
        e.reason(),
        "MetalTearingDown"
            | "MetalPoolDeleted"
            | "StoreUnavailable"
            | "PnapOutcomeUnknown"
            | "PnapUnavailable"
    )
}

/// phoenixNAP's client as one instance reaches it through `kv`.
type Client<'a, K> = Pnap<'a, InFlight<'a, Ledger<'a>, K>, dyn Env + 'a>;

/// Runs `op` on `kv` at `env`'s time, phoenixNAP being `ledger`.
fn run_op<K: KvStore>(kv: &K, env: &dyn Env, ledger: &Ledger<'_>, shape: Shape, op: Op) -> String {
    let spec = spec(shape);
    let id = pool();
    let cfg = config();
    let http = InFlight { ledger, kv };
    let pnap: Client<'_, K> = Pnap::new(&http, &cfg, env);
    let c = ctx(kv, env);
    match op {
        Op::Provision(u) => {
            let t = Target::new(&id, &spec, Some(u), None);
            match provision(&c, &pnap, &t) {
                Ok(p) => format!("provision {u}: {:?}", p.phase),
                Err(e) if expected(&e) => format!("provision {u}: {}", e.reason()),
                Err(e) => format!("UNEXPECTED provision {u}: {e}"),
            }
        }
        Op::Teardown(u) => {
            let t = Target::new(&id, &spec, Some(u), None);
            match deprovision(&c, &pnap, &t) {
                Ok(p) => format!("teardown {u}: {:?}", p.phase),
                Err(e) if expected(&e) => format!("teardown {u}: {}", e.reason()),
                Err(e) => format!("UNEXPECTED teardown {u}: {e}"),
            }
        }
        Op::Reviving(u) => {
            let t = Target::new(&id, &spec, Some(u), None);
            match reviving_creator(&c, &pnap, &t) {
                Ok(done) => format!("reviving {u}: {done}"),
                Err(e) => format!("reviving {u}: {}", e.reason()),
            }
        }
    }
}

/// The mutation [`Op::Reviving`] on a private pool: intent, creation,
/// recording, each write reviving a tombstone (a tombstone read as no
/// record at all).
fn reviving_creator<K: KvStore>(
    c: &Ctx<'_, K>,
    pnap: &Client<'_, K>,
    t: &Target<'_>,
) -> metal_ipam_core::error::Result<String> {
    use metal_ipam_core::kv::protocol::{update_record, Decision};
    use metal_ipam_core::provision::plan::{Held, Intent};
    use metal_ipam_core::provision::pnap_pools::create_private_network;
    use metal_ipam_core::provision::record::ProgressRecord;
    let revived = |cur: Option<&Progress>| cur.filter(|p| !p.deleted).cloned().unwrap_or_default();
    let decided = Decided::of(t.spec, Resource::Vlan);
    let now = c.env.now();
    let won = update_record::<K, ProgressRecord, bool>(c, t.id, |cur| {
        let mut p = revived(cur);
        if p.vlan.is_some() || p.intent.is_some() {
            return Ok(Decision::Done(false));
        }
        p.intent = Some(Intent {
            resource: Resource::Vlan,
            token: "mutant".into(),
            at: now,
            decided: Some(decided.clone()),
        });
        Ok(Decision::Write(Box::new(p), true))
    })?;
    if !won {
        return Ok("another creates".into());
    }
    let net = create_private_network(pnap, LOCATION, &t.tag(), CIDR, None).map_err(|e| e.error)?;
    update_record::<K, ProgressRecord, ()>(c, t.id, |cur| {
        let mut p = revived(cur);
        if p.vlan.is_some() {
            return Ok(Decision::Done(()));
        }
        p.set(
            Resource::Vlan,
            Some(Held {
                id: net.clone(),
                created: true,
                decided: Some(decided.clone()),
            }),
        );
        Ok(Decision::Write(Box::new(p), ()))
    })?;
    Ok(format!("created {net}"))
}

/// The resources alive in phoenixNAP for `u`: networks and blocks.
fn left_for(cloud: &Cloud, u: &str) -> (Vec<Net>, Vec<Blk>) {
    let mine = |x: Option<&str>| uid_of(x).as_deref() == Some(u);
    (
        cloud
            .alive_nets()
            .into_iter()
            .filter(|n| mine(Some(&n.name)))
            .collect(),
        cloud
            .alive_blocks()
            .into_iter()
            .filter(|b| mine(b.description.as_deref()))
            .collect(),
    )
}

/// Recovery after the lease, single-threaded: the deleted incarnation's
/// teardown to its tombstone, the live one's provisioning to ready; then
/// the end-state invariants. `kv` is the watched store; `raw` the same,
/// unwatched.
fn recover_and_check(
    kv: &Watched<'_>,
    raw: &MemKv,
    ledger: &Ledger<'_>,
    shape: Shape,
    ops: &[Op],
    answers: &[String],
) -> Verdict {
    let env = TestEnv::at(LATER + 1);
    let cfg = config();
    let http = InFlight { ledger, kv };
    let pnap: Client<'_, Watched<'_>> = Pnap::new(&http, &cfg, &env as &dyn Env);
    if let Some(a) = answers.iter().find(|a| a.starts_with("UNEXPECTED")) {
        return Err(a.clone());
    }
    let deleted: Vec<&str> = ops
        .iter()
        .filter_map(|o| match o {
            Op::Teardown(u) => Some(*u),
            _ => None,
        })
        .fold(Vec::new(), |mut v, u| {
            if !v.contains(&u) {
                v.push(u);
            }
            v
        });
    let mut live: Vec<&str> = Vec::new();
    for o in ops {
        if let Op::Provision(u) | Op::Reviving(u) = o {
            if !deleted.contains(u) && !live.contains(u) {
                live.push(u);
            }
        }
    }
    // A teardown that answered Gone left nothing of its uid, and nothing
    // was made for it since.
    for a in answers {
        if let Some(u) = deleted.iter().find(|u| a == &format!("teardown {u}: Gone")) {
            let left = left_for(&ledger.snapshot(), u);
            if !left.0.is_empty() || !left.1.is_empty() {
                return Err(format!("teardown of {u} answered Gone, left {left:?}"));
            }
        }
    }
    if stuck(raw) {
        let c = ledger.snapshot();
        let ghosts = c.alive_nets().iter().all(|n| n.id.ends_with("-ghost"))
            && c.alive_blocks().iter().all(|b| b.id.ends_with("-ghost"));
        return if ghosts {
            Ok(())
        } else {
            Err(format!("created without a record: {c:?}"))
        };
    }
    let (id, spec) = (pool(), spec(shape));
    for round in 0..8 {
        let mut settled = true;
        for u in &deleted {
            let t = Target::new(&id, &spec, Some(u), None);
            match deprovision(&ctx(kv, &env), &pnap, &t).map(|r| r.phase) {
                Ok(ProvisionPhase::Gone) => {}
                Ok(_) => settled = false,
                Err(e) => return Err(format!("recovery, teardown {u} (round {round}): {e}")),
            }
        }
        for u in &live {
            let t = Target::new(&id, &spec, Some(u), None);
            match provision(&ctx(kv, &env), &pnap, &t).map(|r| r.phase) {
                Ok(ProvisionPhase::Ready { .. }) => {}
                Ok(_) => settled = false,
                Err(e) => return Err(format!("recovery, provision {u} (round {round}): {e}")),
            }
        }
        if settled {
            break;
        }
    }
    let p = stored(raw);
    let cloud = ledger.snapshot();
    for u in &deleted {
        let left = left_for(&cloud, u);
        if !left.0.is_empty() || !left.1.is_empty() {
            return Err(format!(
                "LEAK after recovery, {u}'s {left:?} left in phoenixNAP; record {p:?}"
            ));
        }
        if !p.as_ref().is_some_and(|p| p.retired.iter().any(|r| r == u)) {
            return Err(format!("after recovery, {u} not retired: {p:?}"));
        }
    }
    for u in &live {
        let (nets, blocks) = left_for(&cloud, u);
        let mine = p
            .as_ref()
            .filter(|p| !p.deleted && p.uid.as_deref() == Some(u));
        let held = |r: Resource| mine.and_then(|p| p.held(r)).map(|h| h.id.clone());
        let net_ok = nets.len() == 1 && held(Resource::Vlan).as_ref() == Some(&nets[0].id);
        let block_ok = match shape {
            Shape::Private => blocks.is_empty() && held(Resource::Reservation).is_none(),
            Shape::Public => {
                blocks.len() == 1
                    && held(Resource::Reservation).as_ref() == Some(&blocks[0].id)
                    && net_ok
                    && nets[0].blocks == [blocks[0].id.clone()]
                    && blocks[0].on.as_ref() == Some(&nets[0].id)
            }
        };
        if !net_ok || !block_ok {
            return Err(format!(
                "after recovery, {u} has {nets:?} and {blocks:?} in phoenixNAP; record {p:?}"
            ));
        }
    }
    Ok(())
}

/// Runs one schedule of `ops` on a `shape` pool from `start`.
fn one_schedule(
    backend: Backend,
    shape: Shape,
    start: Start,
    ops: &[Op],
    chooser: &mut dyn Chooser,
    crashes: usize,
) -> Verdict {
    let kv = MemKv::new(backend);
    let violations = Mutex::new(Vec::new());
    let mut cloud = Cloud::default();
    prepare(&kv, &mut cloud, shape, start);
    let ledger = Ledger {
        cloud: Mutex::new(cloud),
        kv: &kv,
        violations: &violations,
    };
    let owner_of = |id: &str| ledger.cloud.lock().unwrap().owner_of(id);
    let watched = Watched::new(&kv, &violations, &owner_of);
    let envs: Vec<SchedEnv> = (0..ops.len())
        .map(|i| SchedEnv(TestEnv::seeded(NOW, i as u64 + 1)))
        .collect();
    let fns: Vec<_> = ops
        .iter()
        .zip(&envs)
        .map(|(op, env)| {
            let (ledger, op) = (&ledger, *op);
            move |k: &sched::SchedKv<'_, Watched<'_>>| run_op(k, env, ledger, shape, op)
        })
        .collect();
    let (answers, _) = sched::run(&watched, fns, chooser, crashes, 6_000);
    let what = format!("{backend:?}, {shape:?} from {start:?}, {ops:?}");
    let v = violations.lock().unwrap().clone();
    if !v.is_empty() {
        return Err(format!("{what}: {v:?}\nanswers: {answers:?}"));
    }
    recover_and_check(&watched, &kv, &ledger, shape, ops, &answers)
        .map_err(|e| format!("{what}: {e}\nanswers: {answers:?}"))?;
    let v = violations.lock().unwrap().clone();
    if !v.is_empty() {
        return Err(format!("{what}, in recovery: {v:?}"));
    }
    Ok(())
}

/// Explores `ops` on a `shape` pool from `start` as `plan` says; returns
/// the number of schedules.
fn explore(shape: Shape, start: Start, ops: &[Op], plan: &[(Backend, Explore)]) -> usize {
    provision_kit::explore(
        &format!("pnap provision interleavings: {shape:?}, {ops:?} from {start:?}"),
        plan,
        |backend, chooser, crashes| one_schedule(backend, shape, start, ops, chooser, crashes),
    )
}

use Op::{Provision, Teardown};

/// Two deliveries of the same pool event: the network (and block) is
/// created once. A private pool's under every schedule as for Metal's VRF
/// (`PAIR`: with a crash on SQLite's semantics, without on Redis's, PCT
/// with one on Redis's and Spin 3.6's); a public pool's two creations put
/// every schedule out of reach (its DFS ran over 10 minutes without
/// finishing SQLite's), so they are sampled with PCT on each backend.
#[test]
fn two_instances_create_the_resources_once() {
    let ops = [Provision(U1), Provision(U1)];
    let n = explore(Shape::Private, Start::Empty, &ops, &PAIR)
        + explore(Shape::Public, Start::Empty, &ops, &pct(1000));
    println!("pnap provision interleavings: create ∥ create, {n} schedules");
    assert!(n > 8_000);
}

/// A creation racing the pool's teardown (create ∥ delete): the teardown
/// waits for the creation, then tears it down (network, then block);
/// nothing is left, nothing is created after the tombstone. Sampled with
/// PCT on each backend (every schedule of a private pool's is over 90 s
/// on the shared 2-core machine: Metal's same pair is 11,815 with a crash
/// on SQLite and 78,674 without on Redis).
#[test]
fn a_creation_racing_the_teardown_leaves_nothing() {
    let ops = [Provision(U1), Teardown(U1)];
    let n = explore(Shape::Private, Start::Empty, &ops, &pct(1500))
        + explore(Shape::Public, Start::Empty, &ops, &pct(1500));
    println!("pnap provision interleavings: create ∥ delete, {n} schedules");
    assert!(n > 8_000);
}

/// A crashed creator's intent (its network made, the answer lost; a
/// public pool's block recorded): a provisioning and a teardown after its
/// lease. Sampled with PCT on each backend.
#[test]
fn a_crashed_creation_is_found_by_a_teardown_racing_a_provision() {
    let ops = [Provision(U1), Teardown(U1)];
    let n = explore(Shape::Private, Start::StaleIntent, &ops, &pct(1000))
        + explore(Shape::Public, Start::StaleIntent, &ops, &pct(1000));
    println!("pnap provision interleavings: after a crashed creation, {n} schedules");
    assert!(n > 5_000);
}

/// Two teardowns at once, the pool re-created (a new uid) while a stale
/// instance still tears the old one down, and three instances at once:
/// sampled with PCT on each backend.
#[test]
fn teardowns_re_created_pools_and_triples_under_pct_schedules() {
    let mut n = 0;
    for shape in [Shape::Private, Shape::Public] {
        n += explore(shape, Start::Held, &[Teardown(U1), Teardown(U1)], &pct(300));
        n += explore(
            shape,
            Start::Deleting,
            &[Provision(U2), Teardown(U1)],
            &pct(200),
        );
        n += explore(
            shape,
            Start::Held,
            &[Provision(U2), Teardown(U1)],
            &pct(200),
        );
        n += explore(
            shape,
            Start::Empty,
            &[Provision(U1), Teardown(U1), Teardown(U1)],
            &pct(100),
        );
        n += explore(
            shape,
            Start::Empty,
            &[Provision(U1), Provision(U1), Teardown(U1)],
            &pct(100),
        );
    }
    println!(
        "pnap provision interleavings: teardowns, re-created pools and triples, {n} schedules"
    );
    assert!(n > 5_000);
}

/// The checker catches the bug it is for: the network's creation with the
/// step's writes as they were before issue 17 (a tombstone revived, and
/// a network created for the retired uid).
#[test]
fn a_revived_tombstone_is_caught() {
    assert!(caught(|d| one_schedule(
        Backend::SpinSqlite,
        Shape::Private,
        Start::Deleting,
        &[Op::Reviving(U1), Teardown(U1)],
        d,
        0
    )));
}
