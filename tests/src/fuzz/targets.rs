//! The fuzz targets: how each generates a request and what it calls.
//!
//! Every input goes through the component entry point that serves it in
//! production ([`metal_ipam_core::http::dispatch`]: routing, authentication,
//! body parsing, the step) against an in-memory store holding a few pools
//! and bindings, with a fake outbound HTTP client standing in for the
//! Kubernetes API and for Spin service chaining. Targets also call the
//! parsers behind the entry points directly ([`Claim::parse`],
//! [`PoolObject::parse`] + `PoolSpec::validate` (which calls `parse_entry`),
//! [`events::parse`], [`events::presented_token`], [`admission::evaluate`],
//! the name and bearer checks), so a parser is exercised even when the
//! entry point refuses the request earlier.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use metal_ipam_core::admission;
use metal_ipam_core::events;
use metal_ipam_core::http::api::{ApiRequest, ApiResponse};
use metal_ipam_core::http::auth;
use metal_ipam_core::http::dispatch::{dispatch, Services};
use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::ops;
use metal_ipam_core::ipam::pool::{PoolId, PoolObject};
use metal_ipam_core::ipam::store::{self, Loaded};
use metal_ipam_core::kube::names;
use metal_ipam_core::kube::{Kube, KubeConfig};
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::ports::http::{HttpClient, TransportError, TransportKind};
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
use serde_json::{json, Value};

use super::mutate::{self, damage_bytes, mutate_json, oversized, serialize, tweak_string};
use super::rng::Rng;
use super::seeds::{self, Seeds};
use super::{API_TOKEN, EVENTS_TOKEN, NOW};

/// The components the fuzzer sends requests to, through
/// [`metal_ipam_core::http::dispatch::dispatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// `pools`.
    Pools,
    /// `allocate`.
    Allocate,
    /// `release`.
    Release,
    /// `events`.
    Events,
    /// `admission`.
    Admission,
    /// `reconcile`.
    Reconcile,
}

impl Component {
    /// The component of the route table.
    pub fn served(self) -> metal_ipam_core::routes::Component {
        use metal_ipam_core::routes::Component as C;
        match self {
            Component::Pools => C::Pools,
            Component::Allocate => C::Allocate,
            Component::Release => C::Release,
            Component::Events => C::Events,
            Component::Admission => C::Admission,
            Component::Reconcile => C::Reconcile,
        }
    }

    /// Every component with a core entry point.
    pub const ALL: [Component; 6] = [
        Component::Pools,
        Component::Allocate,
        Component::Release,
        Component::Events,
        Component::Admission,
        Component::Reconcile,
    ];

    /// The component's name in spin.toml.
    pub fn name(self) -> &'static str {
        match self {
            Component::Pools => "pools",
            Component::Allocate => "allocate",
            Component::Release => "release",
            Component::Events => "events",
            Component::Admission => "admission",
            Component::Reconcile => "reconcile",
        }
    }
}

/// One generated request.
#[derive(Debug, Clone)]
pub struct Input {
    /// The component it is delivered to.
    pub component: Component,
    /// The method.
    pub method: String,
    /// The path (no query).
    pub path: String,
    /// The query string, without `?`.
    pub query: String,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The `Content-Type` header.
    pub content_type: Option<String>,
    /// Other headers (lower-case names), e.g. CloudEvents `ce-*`.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Input {
    fn new(component: Component, method: &str, path: &str, body: Vec<u8>) -> Input {
        Input {
            component,
            method: method.to_string(),
            path: path.to_string(),
            query: String::new(),
            authorization: Some(format!("Bearer {API_TOKEN}")),
            content_type: Some("application/json".to_string()),
            headers: Vec::new(),
            body,
        }
    }

    /// The header `name` (lower case), as the Spin glue looks it up.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    /// The headers as the request carries them: `content-type` (if any)
    /// first, then the others.
    pub fn all_headers(&self) -> Vec<(String, String)> {
        let ct = self
            .content_type
            .iter()
            .map(|ct| ("content-type".to_string(), ct.clone()));
        ct.chain(self.headers.iter().cloned()).collect()
    }

    /// Everything about the input, the body in hex (for a panic report).
    pub fn describe(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "component: {}", self.component.name());
        let _ = writeln!(s, "method: {:?}", self.method);
        let _ = writeln!(s, "path: {:?}", self.path);
        let _ = writeln!(s, "query: {:?}", self.query);
        let _ = writeln!(s, "authorization: {:?}", self.authorization);
        let _ = writeln!(s, "content-type: {:?}", self.content_type);
        for (k, v) in &self.headers {
            let _ = writeln!(s, "header {k}: {v:?}");
        }
        let _ = write!(s, "body ({} bytes, hex): ", self.body.len());
        for b in &self.body {
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}

/// What one input led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The request was accepted (2xx, and not an admission denial).
    pub accepted: bool,
    /// A short label: component, status, reason or outcome, event format.
    pub label: String,
}

impl Outcome {
    fn of(component: Component, r: &ApiResponse) -> Outcome {
        let what = r.reason.unwrap_or(r.outcome);
        let mut label = format!("{} {} {}", component.name(), r.status, what);
        let field = r.body.as_ref().and_then(|b| {
            b.get("field")
                .or_else(|| b.pointer("/response/status/details/causes/0/field"))
                .and_then(Value::as_str)
        });
        if let Some(f) = field {
            label.push(' ');
            label.push_str(&normalize_field(f));
        }
        if let Some(f) = r
            .body
            .as_ref()
            .and_then(|b| b.get("format"))
            .and_then(Value::as_str)
        {
            label.push(' ');
            label.push_str(f);
        }
        Outcome {
            accepted: (200..300).contains(&r.status) && r.outcome != "denied",
            label,
        }
    }
}

/// A field path with indexes and user-chosen names taken out, so that
/// outcomes group by rule: `spec.addresses[3]` → `spec.addresses[]`,
/// `spec.preAllocations.m-0` → `spec.preAllocations.*`, an unknown spec
/// member → `spec.<unknown>`.
fn normalize_field(f: &str) -> String {
    let mut out = String::new();
    let mut in_brackets = false;
    for c in f.chars() {
        match c {
            '[' => {
                in_brackets = true;
                out.push_str("[]");
            }
            ']' => in_brackets = false,
            _ if !in_brackets => out.push(c),
            _ => {}
        }
    }
    // The pool spec's fields, and the claim spec's that share the prefix.
    const CLAIM_SPEC: &[&str] = &["poolRef", "clusterName"];
    if let Some(rest) = out.strip_prefix("spec.") {
        let member = rest.split(['.', '[']).next().unwrap_or("");
        if member == "preAllocations" && rest.len() > member.len() {
            return "spec.preAllocations.*".to_string();
        }
        if !metal_ipam_core::ipam::pool::SPEC_FIELDS.contains(&member)
            && !CLAIM_SPEC.contains(&member)
        {
            return "spec.<unknown>".to_string();
        }
    }
    out
}

/// Outbound HTTP for the components: `*.spin.internal` (service chaining
/// from `events`) answers 200 as a step would; the Kubernetes API answers
/// an empty list to every list and 404 to everything else, so the steps
/// behind the `/v1/capi/…` routes and `/v1/reconcile` run without a server.
#[derive(Debug, Default)]
pub struct FakeHttp;

impl HttpClient for FakeHttp {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        let host = req.uri().host().unwrap_or("");
        let (status, body) = if host.ends_with(".spin.internal") {
            (200, json!({"result": "reconciled"}))
        } else if req.method() == http::Method::GET
            && req.uri().query().is_some_and(|q| q.contains("limit="))
        {
            (
                200,
                json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []}),
            )
        } else {
            (
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "NotFound", "code": 404, "message": "not found"}),
            )
        };
        http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(body.to_string().into_bytes())
            .map_err(|e| TransportError::new(TransportKind::Dropped, e.to_string()))
    }
}

/// The store every input starts from (restored before each input, so an
/// input's outcome depends on nothing but itself), and the Kubernetes
/// configuration.
pub struct World {
    kv: MemKv,
    snapshot: BTreeMap<String, Vec<u8>>,
    loaded: Vec<Loaded>,
    kube: KubeConfig,
}

impl World {
    /// A store with pools `team-a/nodes` (one binding, a pre-allocation),
    /// `team-a/tiny` (exhausted), `team-b/nodes`, and the global pools
    /// `edge` (one binding) and `v6`.
    ///
    /// # Panics
    /// If the setup itself fails (a bug in the seeds).
    pub fn new() -> World {
        let kv = MemKv::new(Backend::SpinSqlite);
        let env = TestEnv::at(NOW);
        let ctx = Ctx::auto(&kv, &env);
        let mut nodes = seeds::pool(Some("team-a"), "nodes", seeds::nodes_spec());
        nodes["metadata"]["uid"] = json!("uid-nodes");
        let pools = [
            (PoolId::namespaced("team-a", "nodes"), nodes),
            (
                PoolId::namespaced("team-a", "tiny"),
                seeds::pool(
                    Some("team-a"),
                    "tiny",
                    json!({"addresses": ["10.30.0.1-10.30.0.2"], "prefix": 24}),
                ),
            ),
            (
                PoolId::namespaced("team-b", "nodes"),
                seeds::pool(
                    Some("team-b"),
                    "nodes",
                    json!({"addresses": ["10.20.0.0/24"], "prefix": 24}),
                ),
            ),
            (
                PoolId::global("edge"),
                seeds::pool(
                    None,
                    "edge",
                    json!({"addresses": ["192.0.2.0/24"], "prefix": 24, "gateway": "192.0.2.1"}),
                ),
            ),
            (
                PoolId::global("v6"),
                seeds::pool(
                    None,
                    "v6",
                    json!({"addresses": ["2001:db8::/64"], "prefix": 64}),
                ),
            ),
        ];
        for (id, obj) in &pools {
            let o = PoolObject::parse(id, obj).expect("seed pool parses");
            ops::put_pool(&ctx, o).expect("seed pool registers");
        }
        for (ns, name, uid, kind, pool) in [
            ("team-a", "worker-bound", "u-bound", "MetalIPPool", "nodes"),
            ("team-a", "tiny-0", "u-t0", "MetalIPPool", "tiny"),
            ("team-a", "tiny-1", "u-t1", "MetalIPPool", "tiny"),
            ("team-b", "edge-0", "u-e0", "GlobalMetalIPPool", "edge"),
        ] {
            let c = Claim::parse(&seeds::claim("v1beta2", ns, name, uid, kind, pool))
                .expect("seed claim parses");
            ops::allocate(&ctx, &c).expect("seed claim allocates");
        }
        let loaded = pools
            .iter()
            .filter_map(|(id, _)| store::read_pool(&kv, id).ok().flatten())
            .collect();
        World {
            snapshot: kv.dump(),
            kv,
            loaded,
            kube: KubeConfig {
                base_url: "https://kube.fuzz.invalid:6443".to_string(),
                token: "fuzz-kube-token".to_string(),
            },
        }
    }

    /// Restores the initial store.
    pub fn reset(&self) {
        self.kv.load(self.snapshot.clone());
    }

    /// Delivers `input` to its component, as `metal_ipam_spin` would: the
    /// `events` component has no store and no Kubernetes client, the
    /// `admission` component no Kubernetes client.
    pub fn handle(&self, input: &Input) -> ApiResponse {
        let env = TestEnv::at(NOW);
        let ctx = Ctx::auto(&self.kv, &env);
        let http = FakeHttp;
        let kube = Kube::new(&http, &self.kube);
        let (with_ctx, with_kube) = match input.component {
            Component::Events => (false, false),
            Component::Admission => (true, false),
            _ => (true, true),
        };
        let s = Services {
            ctx: with_ctx.then_some(&ctx),
            kube: with_kube.then_some(&kube),
            http: &http,
            api_token: API_TOKEN,
            events_token: EVENTS_TOKEN,
            read_token: "",
            metal: None,
            pnap: None,
        };
        let headers = input.all_headers();
        let req = ApiRequest {
            headers: &headers,
            ..to_request(input)
        };
        dispatch(input.component.served(), &s, &req)
    }

    /// Runs `input` through its component and through `direct` (the
    /// target's parsers), from the initial store.
    pub fn run(&self, target: &Target, input: &Input) -> Outcome {
        self.reset();
        (target.direct)(self, input);
        let r = self.handle(input);
        // The log line is built from request data too.
        let _ = r.log_line(
            input.component.name(),
            &to_request(input),
            0,
            0.0,
            Default::default(),
        );
        Outcome::of(input.component, &r)
    }
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

fn to_request(input: &Input) -> ApiRequest<'_> {
    ApiRequest {
        method: &input.method,
        path: &input.path,
        query: &input.query,
        authorization: input.authorization.as_deref(),
        body: &input.body,
        headers: &[],
    }
}

/// A fuzz target.
pub struct Target {
    /// Its name (`--target`).
    pub name: &'static str,
    /// What it covers.
    pub about: &'static str,
    /// Generates one input.
    pub generate: fn(&mut Rng, &Seeds) -> Input,
    /// Calls the target's parsers directly (results are not checked, only
    /// that they return).
    pub direct: fn(&World, &Input),
}

/// Every target, in run order.
pub const TARGETS: &[Target] = &[
    Target {
        name: "claim",
        about: "POST /v1/claims: IPAddressClaim bodies (allocate component, Claim::parse)",
        generate: gen_claim,
        direct: direct_claim,
    },
    Target {
        name: "pool",
        about: "PUT /v1/pools/{ns}/{name}, /v1/global-pools/{name}: pool objects and specs \
                (pools component, PoolObject::parse, PoolSpec::validate, parse_entry)",
        generate: gen_pool,
        direct: direct_pool,
    },
    Target {
        name: "events",
        about: "POST /v1/events: watch, Argo Events, CloudEvents structured and binary \
                (Resource and Reference mode) with headers and content types \
                (events component, events::parse, presented_token)",
        generate: gen_events,
        direct: direct_events,
    },
    Target {
        name: "admission",
        about:
            "POST /v1/admission/pools: AdmissionReviews (admission component, admission::evaluate)",
        generate: gen_admission,
        direct: direct_admission,
    },
    Target {
        name: "routes",
        about: "every component with generated methods, path segments, query strings and \
                Authorization headers (routing, auth, names, ?uid=)",
        generate: gen_routes,
        direct: direct_routes,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

// ------------------------------------------------------------ generation

/// A body from `seeds`: mostly mutated, sometimes damaged at byte level,
/// rarely oversized.
fn body(rng: &mut Rng, seeds: &[Value], donors: &[Value]) -> Vec<u8> {
    let mut doc = rng.pick(seeds).clone();
    body_of(rng, &mut doc, donors)
}

fn body_of(rng: &mut Rng, doc: &mut Value, donors: &[Value]) -> Vec<u8> {
    if rng.chance(4, 5) {
        mutate_json(rng, doc, donors);
    }
    let mut bytes = serialize(doc);
    if rng.chance(1, 4) {
        damage_bytes(rng, &mut bytes);
    }
    if rng.chance(1, 20_000) {
        bytes = oversized(&bytes);
    }
    bytes
}

const METHODS: &[&str] = &[
    "GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "", "get", "Post",
    "G\u{e9}T", "POST ",
];

/// Authorization headers: right, nearly right, wrong.
fn authorization(rng: &mut Rng) -> Option<String> {
    let t = API_TOKEN;
    let v = match rng.below(20) {
        0 => return None,
        1 => String::new(),
        2 => "Bearer".to_string(),
        3 => "Bearer ".to_string(),
        4 => format!("bearer {t}"),
        5 => format!("Bearer  {t}"),
        6 => format!("Bearer {t} "),
        7 => format!(" Bearer {t}"),
        8 => format!("Bearer {t}\t"),
        9 => format!("Bearer {t}x"),
        10 => format!("Bearer {}", &t[..t.len() - 1]),
        11 => format!("Basic {t}"),
        12 => format!("Bearer {EVENTS_TOKEN}"),
        13 => format!("Bearer \u{e9}{t}"),
        14 => format!("Bearer {}", "x".repeat(10_000)),
        15 => t.to_string(),
        16 => format!("BEARER {t}"),
        _ => format!("Bearer {t}"),
    };
    Some(v)
}

const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/json; charset=utf-8",
    "application/cloudevents+json",
    "Application/CloudEvents+JSON; charset=UTF-8",
    " application/cloudevents+json ;",
    "application/cloudevents-batch+json",
    "text/plain",
    "",
    ";",
    "application/cloudevents+json\u{0}",
];

fn content_type(rng: &mut Rng) -> Option<String> {
    if rng.chance(1, 8) {
        None
    } else {
        Some(rng.pick_copy(CONTENT_TYPES).to_string())
    }
}

fn gen_claim(rng: &mut Rng, s: &Seeds) -> Input {
    let mut i = Input::new(
        Component::Allocate,
        "POST",
        "/v1/claims",
        body(rng, &s.claims, &s.donors),
    );
    if rng.chance(1, 20) {
        i.authorization = authorization(rng);
    }
    if rng.chance(1, 40) {
        i.method = rng.pick_copy(METHODS).to_string();
    }
    i
}

fn direct_claim(_: &World, i: &Input) {
    if let Ok(v) = serde_json::from_slice::<Value>(&i.body) {
        let _ = Claim::parse(&v);
    }
}

/// The route of a pool object, from its metadata as seeded.
fn pool_path(doc: &Value) -> String {
    let name = doc["metadata"]["name"].as_str().unwrap_or("");
    match doc["metadata"]["namespace"].as_str() {
        Some(ns) => format!("/v1/pools/{ns}/{name}"),
        None => format!("/v1/global-pools/{name}"),
    }
}

fn gen_pool(rng: &mut Rng, s: &Seeds) -> Input {
    let mut doc = rng.pick(&s.pools).clone();
    let mut path = pool_path(&doc);
    if rng.chance(1, 10) {
        path = mutate_path(rng, &path);
    }
    let body = body_of(rng, &mut doc, &s.donors);
    let mut i = Input::new(Component::Pools, "PUT", &path, body);
    if rng.chance(1, 20) {
        i.authorization = authorization(rng);
    }
    if rng.chance(1, 40) {
        i.method = rng.pick_copy(METHODS).to_string();
    }
    i
}

/// The pool id a path names, if it is a well-formed pool route.
fn pool_id_of_path(path: &str) -> Option<PoolId> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match segs.as_slice() {
        ["v1", "pools", ns, name] => Some(PoolId::namespaced(ns, name)),
        ["v1", "global-pools", name] => Some(PoolId::global(name)),
        _ => None,
    }
}

fn direct_pool(_: &World, i: &Input) {
    let Ok(v) = serde_json::from_slice::<Value>(&i.body) else {
        return;
    };
    let id = pool_id_of_path(&i.path).unwrap_or_else(|| PoolId::namespaced("team-a", "nodes"));
    let _ = PoolObject::parse(&id, &v).and_then(|o| o.spec.validate());
}

/// A header value mangled the ways a CloudEvents header can be.
fn mangle_header(rng: &mut Rng, v: &str) -> String {
    match rng.below(6) {
        0 => rng
            .pick_copy(&[
                "%", "%4", "%zz", "%FF", "%C3%A9", "%2F", "%00", "%e9", "a%20b", "%%", "",
            ])
            .to_string(),
        1 => format!("{v}%"),
        2 => {
            // Percent-encode the whole value.
            v.bytes().map(|b| format!("%{b:02X}")).collect()
        }
        3 => rng.pick_copy(mutate::VOCAB).to_string(),
        4 => rng.pick_copy(mutate::NAMES).to_string(),
        _ => tweak_string(rng, v),
    }
}

const CE_HEADERS: &[&str] = &[
    "ce-specversion",
    "ce-type",
    "ce-id",
    "ce-source",
    "ce-kind",
    "ce-apiversion",
    "ce-name",
    "ce-namespace",
    "ce-metalipamtoken",
];

fn gen_events(rng: &mut Rng, s: &Seeds) -> Input {
    let mut i = Input::new(Component::Events, "POST", "/v1/events", Vec::new());
    match rng.below(4) {
        0 => i.body = body(rng, &s.watch, &s.donors),
        1 => i.body = body(rng, &s.argo, &s.donors),
        2 => {
            i.content_type = Some("application/cloudevents+json".to_string());
            i.body = body(rng, &s.structured, &s.donors);
        }
        _ => {
            let (headers, doc) = rng.pick(&s.binary);
            let mut doc = doc.clone();
            i.headers = headers.clone();
            i.body = body_of(rng, &mut doc, &s.donors);
            if rng.chance(2, 3) {
                for _ in 0..rng.small_count(3) {
                    let n = i.headers.len();
                    match rng.below(4) {
                        0 if n > 0 => {
                            i.headers.remove(rng.below(n));
                        }
                        1 => {
                            let name = rng.pick_copy(CE_HEADERS).to_string();
                            let v = mangle_header(rng, "");
                            i.headers.insert(0, (name, v));
                        }
                        _ if n > 0 => {
                            let k = rng.below(n);
                            i.headers[k].1 = mangle_header(rng, &i.headers[k].1);
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    if rng.chance(1, 6) {
        i.content_type = content_type(rng);
    }
    i.authorization = match rng.below(10) {
        0..=4 => Some(format!("Bearer {API_TOKEN}")),
        5 | 6 => Some(format!("Bearer {EVENTS_TOKEN}")),
        7 => None,
        _ => authorization(rng),
    };
    if rng.chance(1, 40) {
        i.method = rng.pick_copy(METHODS).to_string();
    }
    i
}

fn direct_events(_: &World, i: &Input) {
    let header = |name: &str| i.header(name);
    let ct = i.content_type.as_deref();
    let _ = events::presented_token(ct, &header, &i.body);
    if let Ok(p) = events::parse(ct, &header, &i.body) {
        if let events::Outcome::Object(ev) = p.outcome {
            let _ = metal_ipam_core::events::route::route_event(&ev);
        }
    }
}

fn gen_admission(rng: &mut Rng, s: &Seeds) -> Input {
    let mut i = Input::new(
        Component::Admission,
        "POST",
        "/v1/admission/pools",
        body(rng, &s.reviews, &s.donors),
    );
    if rng.chance(1, 20) {
        i.authorization = authorization(rng);
    }
    if rng.chance(1, 40) {
        i.method = rng.pick_copy(METHODS).to_string();
    }
    i
}

fn direct_admission(w: &World, i: &Input) {
    let _ = admission::evaluate(&i.body, &w.loaded);
}

/// Path segments that are wrong in every way a router can trip on.
const SEGMENTS: &[&str] = &[
    "",
    ".",
    "..",
    "%2F",
    "a%2Fb",
    "%2e%2e",
    "v1",
    "V1",
    "pools",
    "Pools",
    "global-pools",
    "claims",
    "capi",
    "events",
    "admission",
    "reconcile",
    "healthz",
    "team-a",
    "TEAM-A",
    "nodes",
    "edge",
    "worker-bound",
    "worker-0",
    "\u{e9}",
    "a b",
    "a..b",
    "-a",
    "a-",
    "0",
    "\u{0}",
    "a/b",
    ";",
    "?",
    "#",
    "%00",
    "%",
    "nodes.",
    ".nodes",
    "a.b",
];

/// Damages a path: segments replaced, inserted, removed; slashes doubled,
/// trailing or missing; very long segments.
fn mutate_path(rng: &mut Rng, path: &str) -> String {
    let mut segs: Vec<String> = path.split('/').map(str::to_string).collect();
    for _ in 0..rng.small_count(3) {
        let n = segs.len();
        match rng.below(9) {
            0 | 1 => {
                let k = rng.below(n);
                segs[k] = rng.pick_copy(SEGMENTS).to_string();
            }
            2 => {
                let k = rng.below(n + 1);
                segs.insert(k, rng.pick_copy(SEGMENTS).to_string());
            }
            3 if n > 1 => {
                segs.remove(rng.below(n));
            }
            4 => segs.push(String::new()),
            5 => {
                let k = rng.below(n);
                let len = rng.pick_copy(&[63usize, 64, 253, 254, 5000]);
                segs[k] = "a".repeat(len);
            }
            6 => {
                let k = rng.below(n);
                segs[k] = segs[k].bytes().map(|b| format!("%{b:02x}")).collect();
            }
            7 => {
                let k = rng.below(n);
                segs[k] = segs[k].to_uppercase();
            }
            _ => {
                if segs.first().is_some_and(String::is_empty) && n > 1 {
                    segs.remove(0);
                } else {
                    segs.insert(0, String::new());
                }
            }
        }
    }
    segs.join("/")
}

const QUERIES: &[&str] = &[
    "",
    "uid=u-bound",
    "uid=u-other",
    "uid=",
    "uid",
    "uid=u-bound&uid=u-other",
    "&",
    "&&uid=u-bound",
    "x=1&uid=u-bound",
    "uid=%2F",
    "uid=u%2Dbound",
    "UID=u-bound",
    "uid=u-bound#frag",
    "uid==u-bound",
    "uid=\u{e9}",
    "dryRun=1&x=%2F",
    "?uid=u-bound",
    "uid=u bound",
];

/// Route templates: component, methods, path, body kind.
const ROUTES: &[(Component, &[&str], &str, u8)] = &[
    (Component::Pools, &["GET"], "/v1/pools", 0),
    (Component::Pools, &["GET"], "/v1/global-pools", 0),
    (
        Component::Pools,
        &["GET", "PUT", "DELETE"],
        "/v1/pools/team-a/nodes",
        1,
    ),
    (
        Component::Pools,
        &["GET", "PUT", "DELETE"],
        "/v1/pools/team-a/fresh",
        1,
    ),
    (
        Component::Pools,
        &["GET", "PUT", "DELETE"],
        "/v1/global-pools/edge",
        1,
    ),
    (
        Component::Pools,
        &["POST"],
        "/v1/capi/pools/team-a/nodes",
        0,
    ),
    (Component::Pools, &["POST"], "/v1/capi/global-pools/edge", 0),
    (Component::Allocate, &["POST"], "/v1/claims", 2),
    (
        Component::Allocate,
        &["POST"],
        "/v1/capi/claims/team-a/worker-bound",
        0,
    ),
    (
        Component::Release,
        &["GET", "DELETE"],
        "/v1/claims/team-a/worker-bound",
        0,
    ),
    (
        Component::Release,
        &["GET", "DELETE"],
        "/v1/claims/team-b/edge-0",
        0,
    ),
    (
        Component::Release,
        &["POST"],
        "/v1/capi/claims/team-a/worker-0",
        0,
    ),
    (Component::Events, &["POST"], "/v1/events", 3),
    (Component::Admission, &["POST"], "/v1/admission/pools", 4),
    (Component::Reconcile, &["POST"], "/v1/reconcile", 0),
];

fn gen_routes(rng: &mut Rng, s: &Seeds) -> Input {
    let (component, methods, path, body_kind) = rng.pick_copy(ROUTES);
    let mut i = Input::new(component, rng.pick_copy(methods), path, Vec::new());
    i.body = match body_kind {
        1 => {
            // The pool of this route when there is one, else any pool.
            let doc = s
                .pools
                .iter()
                .find(|p| pool_path(p) == path)
                .unwrap_or_else(|| rng.pick(&s.pools));
            serialize(doc)
        }
        2 => serialize(rng.pick(&s.claims)),
        3 => serialize(rng.pick(&s.watch)),
        4 => serialize(rng.pick(&s.reviews)),
        _ => Vec::new(),
    };
    if rng.chance(1, 2) {
        i.path = mutate_path(rng, &i.path);
    }
    if rng.chance(1, 3) {
        i.query = rng.pick_copy(QUERIES).to_string();
    }
    if rng.chance(1, 4) {
        i.method = rng.pick_copy(METHODS).to_string();
    }
    if rng.chance(1, 3) {
        i.authorization = authorization(rng);
    }
    if rng.chance(1, 5) {
        i.component = rng.pick_copy(&Component::ALL);
    }
    i
}

fn direct_routes(_: &World, i: &Input) {
    let _ = auth::check_bearer(API_TOKEN, i.authorization.as_deref());
    for seg in i.path.split('/') {
        let _ = names::check_label(seg);
        let _ = names::check_subdomain(seg);
    }
    let _ = i
        .query
        .split('&')
        .find_map(|kv| kv.strip_prefix("uid="))
        .filter(|u| !u.is_empty());
}
