//! Request counters: what every request of a component with a store did,
//! each in an atomic `increment` of a key from a bounded family.
//!
//! - A request's [`Signature`] is only (component, route template,
//!   status, outcome, reason), each from a finite set fixed by the build
//!   ([`Signature::new`]): so the signatures are bounded by components ×
//!   routes × statuses × reasons, whatever the traffic. One
//!   `increment(obs/req/<signature>, 1)` per request.
//! - Its Kubernetes calls (by component and status class), Metal calls (by
//!   operation, [`METAL_OPS`], and class) and compare-and-swap conflicts
//!   (by component) are **counted, not keyed**: one
//!   `increment(key, n)` per distinct counter the request touched
//!   (`obs/kube/<component>/<class>`, `obs/metal/<op>/<class>`,
//!   `obs/conflicts/<component>`). A request without outbound calls and
//!   without conflicts costs exactly one increment.
//!
//! [`record_request`] does both. A key is added to its registry
//! ([`crate::kv::registry`]: [`REGISTRY`] for the signatures,
//! [`COUNTER_REGISTRY`] for the call and conflict counters) when its
//! increment passes a power of two (1, 2, 4, …): O(log n) registry reads
//! over n counts, and a registration lost to a crash between the increment
//! and the registry write is made at the next power of two (until then
//! that key's counts are stored but not exposed).
//!
//! **Caps.** [`COUNTER_REGISTRY`]'s cap, [`COUNTER_KEYS`], is the exact
//! product of its key families' finite label sets: it cannot be reached
//! past. [`REGISTRY`] holds the signatures of this build (bounded by its
//! vocabulary, see [`MAX_SIGNATURES`]) and those an earlier build left
//! (at most [`LEGACY_SIGNATURES`]). Should it ever be full, a request of a
//! new signature is still counted: at each power of two of its own count,
//! the requests since the last one go to the *overflow* signature
//! (component, `other`, status, `other`, [`UNREGISTERED`]), whose
//! registration has a reserve of its own ([`OVERFLOW_SIGNATURES`],
//! components × statuses, so it is never refused): the first request of
//! a new failure is counted under its status (exact at every power of two
//! of that signature's count, low by less than half in between).
//!
//! **Stored by an earlier build.** Signatures of the form
//! `component|route|status|outcome|reason|k…|c…|m…` (exact call and
//! conflict counts in the signature) are read and folded into the same
//! series and counters at the scrape ([`read_all`]): their keys are never
//! incremented again, so the fold is exact and counts nothing twice.
//!
//! A handler may count its request's signature itself (inside its own
//! write): its answer says so ([`Request::signature_counted`]) and only
//! the calls and conflicts are counted here.
//!
//! Not counted: components without a store (`events`, `attach-vlan`,
//! `detach-vlan`, `healthz`: nowhere to count; a chained step's Metal
//! calls are therefore not in its caller's counters either), and requests
//! answered before the store is opened (401, 413, setup errors).

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::kv::keys::{self, ObsCounter};
use crate::kv::registry::{self, Added, RegistryId};
use crate::kv::Ctx;
use crate::ports::http::{HttpClient, TransportError};
use crate::ports::kv::KvStore;
use crate::routes::{Component, TABLE};

/// The registry of request signatures (`obs/signatures`).
pub const REGISTRY: RegistryId = RegistryId {
    key: keys::OBS_SIGNATURES,
    guard: keys::OBS_SIGNATURES_INIT,
};

/// The registry of the call and conflict counters' keys (`obs/counters`).
pub const COUNTER_REGISTRY: RegistryId = RegistryId {
    key: keys::OBS_COUNTERS,
    guard: keys::OBS_COUNTERS_INIT,
};

/// Signatures an earlier build may have left in [`REGISTRY`]: its cap.
pub const LEGACY_SIGNATURES: usize = 2000;

/// The cap of [`REGISTRY`] for a request's own signature: what an
/// earlier build left ([`LEGACY_SIGNATURES`]) plus 4096 of this build's.
///
/// This build's signatures are bounded by its vocabulary, not by traffic:
/// a component answers on its own route templates (61 pairs of a
/// component with a store and a route, `-` included), with the success
/// statuses and outcomes of its handlers and the reasons its code paths
/// raise (`&'static str` literals: fewer than 100 in the whole code, each
/// raised on a few routes; a failure's status is its error kind's, one of
/// 9). 4096 is 67 per pair. Past it nothing goes uncounted (the overflow
/// signatures, module docs).
pub const MAX_SIGNATURES: usize = LEGACY_SIGNATURES + 4096;

/// Statuses as counted: 100–599 as they are, anything else 0.
const STATUSES: usize = 501;

/// The reserve of [`REGISTRY`] for the overflow signatures: one per
/// component name ([`Component::ALL`] and `other`) and status, so an
/// overflow signature is never refused.
pub const OVERFLOW_SIGNATURES: usize = (Component::ALL.len() + 1) * STATUSES;

/// The reason of the overflow signatures.
pub const UNREGISTERED: &str = "Unregistered";

/// Every key the call and conflict counters can have: Kubernetes calls by
/// component name ([`Component::ALL`] and `other`) and class, Metal calls
/// by operation and class, conflicts by component name. The cap of
/// [`COUNTER_REGISTRY`], never reached past.
pub const COUNTER_KEYS: usize = (Component::ALL.len() + 1) * CLASSES.len()
    + METAL_OPS.len() * CLASSES.len()
    + (Component::ALL.len() + 1);

/// What a field outside its vocabulary is counted as.
pub const OTHER: &str = "other";

/// Longest outcome or reason kept (longer ones count as `other`).
const MAX_WORD: usize = 64;

/// Longest signature, in bytes; an earlier build cut longer ones with a
/// hash (this build's are shorter: bounded fields).
pub const MAX_SIGNATURE: usize = 224;

/// Status classes of outbound calls; `error` is a transport failure (no
/// response).
pub const CLASSES: [&str; 5] = ["2xx", "3xx", "4xx", "5xx", "error"];

/// The Metal operations counted, by index (append-only: an index is never
/// reused, so stored signatures keep their meaning). Index 0 is any other
/// call. Ids in paths are `{id}`.
pub const METAL_OPS: &[&str] = &[
    "other",
    "GET /metal/v1/projects/{id}/vrfs",
    "POST /metal/v1/projects/{id}/vrfs",
    "GET /metal/v1/vrfs/{id}",
    "DELETE /metal/v1/vrfs/{id}",
    "GET /metal/v1/projects/{id}/ips",
    "POST /metal/v1/projects/{id}/ips",
    "GET /metal/v1/ips/{id}",
    "DELETE /metal/v1/ips/{id}",
    "POST /metal/v1/devices/{id}/ips",
    "GET /metal/v1/devices/{id}/ips",
    "GET /metal/v1/devices/{id}",
    "GET /metal/v1/virtual-networks/{id}",
    "POST /metal/v1/ports/{id}/unassign",
    "POST /metal/v1/ports/{id}/bond",
    "POST /metal/v1/ports/{id}/disbond",
    "POST /metal/v1/ports/{id}/convert/layer-2",
    "POST /metal/v1/ports/{id}/convert/layer-3",
    "POST /metal/v1/ports/{id}/vlan-assignments/batches",
    "GET /metal/v1/ports/{id}/vlan-assignments/batches/{id}",
    "GET /metal/v1/ports/{id}/vlan-assignments/batches",
    "POST /metal/v1/ports/{id}/native-vlan",
    "DELETE /metal/v1/ports/{id}/native-vlan",
    "GET /metal/v1/projects/{id}/virtual-networks",
    "POST /metal/v1/projects/{id}/virtual-networks",
    "DELETE /metal/v1/virtual-networks/{id}",
    "GET /metal/v1/projects/{id}/metal-gateways",
    "GET /metal/v1/metal-gateways/{id}",
    "POST /metal/v1/projects/{id}/metal-gateways",
    "DELETE /metal/v1/metal-gateways/{id}",
    "GET /metal/v1/projects/{id}/events",
];

/// Path segments of Metal's API that are words, not ids.
const METAL_WORDS: &[&str] = &[
    "metal",
    "v1",
    "projects",
    "vrfs",
    "ips",
    "devices",
    "virtual-networks",
    "ports",
    "unassign",
    "bond",
    "disbond",
    "convert",
    "layer-2",
    "layer-3",
    "vlan-assignments",
    "batches",
    "native-vlan",
    "metal-gateways",
    "events",
];

/// The index in [`METAL_OPS`] of a call: `path` from `/metal/v1` on,
/// without the query; any segment that is not one of Metal's words is an
/// id.
///
/// ```
/// use metal_ipam_core::observe::counters::{metal_op, METAL_OPS};
/// let op = metal_op("POST", "/metal/v1/ports/3f2a/convert/layer-2");
/// assert_eq!(METAL_OPS[op], "POST /metal/v1/ports/{id}/convert/layer-2");
/// assert_eq!(metal_op("PATCH", "/metal/v1/vrfs/x"), 0);
/// ```
pub fn metal_op(method: &str, path: &str) -> usize {
    let path = path.split('?').next().unwrap_or("");
    let mut template = format!("{method} ");
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        template.push('/');
        template.push_str(if METAL_WORDS.contains(&seg) {
            seg
        } else {
            "{id}"
        });
    }
    METAL_OPS.iter().position(|op| *op == template).unwrap_or(0)
}

fn class_of(status: u16) -> usize {
    match status {
        ..=299 => 0,
        300..=399 => 1,
        400..=499 => 2,
        _ => 3,
    }
}

/// Outbound calls of one request, by destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Calls {
    /// Kubernetes calls by class ([`CLASSES`]).
    pub kube: [u32; 5],
    /// Metal calls by (operation index, class index).
    pub metal: BTreeMap<(usize, usize), u32>,
}

/// An [`HttpClient`] that counts the calls it passes on: those to the
/// Kubernetes base URL by status class, those to the Metal base URL by
/// operation and class; chained calls (`*.spin.internal`) and anything
/// else are passed on uncounted.
pub struct Tally<H> {
    inner: H,
    kube_base: Option<String>,
    metal_base: Option<String>,
    calls: RefCell<Calls>,
}

impl<H> Tally<H> {
    /// Counts the calls `inner` sends to `kube_base` and `metal_base`
    /// (`scheme://host[:port][/path]`; Metal's includes `/metal/v1`).
    pub fn new(inner: H, kube_base: Option<&str>, metal_base: Option<&str>) -> Self {
        Tally {
            inner,
            kube_base: kube_base.map(str::to_string),
            metal_base: metal_base.map(str::to_string),
            calls: RefCell::new(Calls::default()),
        }
    }

    /// The calls so far.
    pub fn calls(&self) -> Calls {
        self.calls.borrow().clone()
    }
}

fn under(url: &str, base: Option<&str>) -> bool {
    base.is_some_and(|b| {
        url.strip_prefix(b)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?']))
    })
}

impl<H: HttpClient> HttpClient for Tally<H> {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        let url = req.uri().to_string();
        let kube = under(&url, self.kube_base.as_deref());
        let metal = !kube && under(&url, self.metal_base.as_deref());
        let op = metal.then(|| metal_op(req.method().as_str(), req.uri().path()));
        let result = self.inner.send(req);
        if kube || metal {
            let class = match &result {
                Ok(r) => class_of(r.status().as_u16()),
                Err(_) => 4,
            };
            let mut calls = self.calls.borrow_mut();
            match op {
                Some(op) => *calls.metal.entry((op, class)).or_default() += 1,
                None => calls.kube[class] += 1,
            }
        }
        result
    }
}

/// A request's signature: (component, route template, status, outcome,
/// reason), each from a finite set ([`Signature::new`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Signature {
    /// The component: its name in spin.toml, or `other`.
    pub component: String,
    /// The route template: one the component serves in the route table,
    /// `-` when none matched, `other` for anything else.
    pub route: String,
    /// The HTTP status (100–599; anything else 0).
    pub status: u16,
    /// The outcome (`allocated`, `released`, `error`, …; `-` when none,
    /// `other` when not a word of at most 64 characters).
    pub outcome: String,
    /// The error reason (`-` when none; `other` as for the outcome).
    pub reason: String,
}

/// The name a component is counted under.
fn component_of(name: &str) -> &'static str {
    Component::ALL
        .iter()
        .map(|c| c.name())
        .find(|n| *n == name)
        .unwrap_or(OTHER)
}

/// The route a request of `component` is counted under.
fn route_of(component: &str, route: &str) -> &'static str {
    if route.is_empty() || route == "-" {
        return "-";
    }
    let served = Component::ALL.iter().find(|c| c.name() == component);
    TABLE
        .iter()
        .find(|r| r.template == route && served.is_some_and(|c| r.served_by.contains(c)))
        .map_or(OTHER, |r| r.template)
}

/// An outcome or reason as counted: a word (`[A-Za-z0-9._-]`, at most
/// [`MAX_WORD`] bytes) as it is, empty as `-`, anything else `other`.
fn word_of(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else if s.len() <= MAX_WORD
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        s
    } else {
        OTHER
    }
}

fn status_of(status: u16) -> u16 {
    if (100..=599).contains(&status) {
        status
    } else {
        0
    }
}

impl Signature {
    /// The signature of an answer, every field mapped into its finite set
    /// (see the fields).
    ///
    /// ```
    /// use metal_ipam_core::observe::counters::Signature;
    /// let s = Signature::new("allocate", "/v1/claims", 201, "allocated", "");
    /// assert_eq!(s.encode(), "allocate|/v1/claims|201|allocated|-");
    /// // A concrete path, a route another component serves, odd text:
    /// let s = Signature::new("allocate", "/v1/claims/ns/c-1", 404, "error", "No|Such");
    /// assert_eq!(s.encode(), "allocate|other|404|error|other");
    /// let s = Signature::new("nobody", "/v1/pools", 200, "listed", "");
    /// assert_eq!(s.encode(), "other|other|200|listed|-");
    /// ```
    pub fn new(component: &str, route: &str, status: u16, outcome: &str, reason: &str) -> Self {
        let component = component_of(component);
        Signature {
            component: component.to_string(),
            route: route_of(component, route).to_string(),
            status: status_of(status),
            outcome: word_of(outcome).to_string(),
            reason: word_of(reason).to_string(),
        }
    }

    /// The overflow signature of this one: (component, `other`, status,
    /// `other`, [`UNREGISTERED`]).
    pub fn overflow(&self) -> Signature {
        Signature {
            component: component_of(&self.component).to_string(),
            route: OTHER.to_string(),
            status: status_of(self.status),
            outcome: OTHER.to_string(),
            reason: UNREGISTERED.to_string(),
        }
    }

    /// Whether this is an overflow signature.
    pub fn is_overflow(&self) -> bool {
        self.route == OTHER && self.outcome == OTHER && self.reason == UNREGISTERED
    }

    /// The signature's text: `component|route|status|outcome|reason`
    /// (no field contains `|`; at most [`MAX_SIGNATURE`] bytes).
    pub fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            self.component, self.route, self.status, self.outcome, self.reason
        )
    }

    /// Reads a registry member back: this build's five fields, or an
    /// earlier build's signature with its exact call and conflict counts
    /// (`…|k…|c…|m…`, possibly cut and ending with `#` and a hash: what is
    /// complete before the cut). Fields are mapped as by
    /// [`Signature::new`]. `None` for text that is neither.
    ///
    /// ```
    /// use metal_ipam_core::observe::counters::Signature;
    /// let s = Signature::parse("allocate|/v1/claims|201|allocated|-").unwrap();
    /// assert_eq!((s.signature.status, s.conflicts), (201, 0));
    /// let old = Signature::parse("reconcile|/v1/reconcile|200|reconciled|-|k7,0,0,1,0|c2|m9.0*3").unwrap();
    /// assert_eq!(old.signature.encode(), "reconcile|/v1/reconcile|200|reconciled|-");
    /// assert_eq!((old.calls.kube, old.conflicts), ([7, 0, 0, 1, 0], 2));
    /// assert_eq!(old.calls.metal[&(9, 0)], 3);
    /// assert!(Signature::parse("kube/x").is_none());
    /// ```
    pub fn parse(text: &str) -> Option<Stored> {
        let (text, cut) = match text.rsplit_once('#') {
            Some((head, hash)) if hash.len() == 16 && text.len() >= MAX_SIGNATURE - 1 => {
                (head, true)
            }
            _ => (text, false),
        };
        let parts: Vec<&str> = text.splitn(8, '|').collect();
        if parts.len() != 5 && !(parts.len() > 5 && parts[5].starts_with('k')) {
            return None;
        }
        let mut s = Stored {
            signature: Signature::new(
                parts[0],
                parts[1],
                parts[2].parse().ok()?,
                parts[3],
                parts[4],
            ),
            ..Stored::default()
        };
        let last = parts.len() - 1;
        if let Some(k) = parts.get(5).and_then(|k| k.strip_prefix('k')) {
            let complete = !(cut && last == 5);
            if complete && !k.is_empty() {
                for (i, n) in k.split(',').enumerate().take(CLASSES.len()) {
                    s.calls.kube[i] = n.parse().ok()?;
                }
            }
        }
        if let Some(c) = parts.get(6).and_then(|c| c.strip_prefix('c')) {
            if !(cut && last == 6) {
                s.conflicts = c.parse().ok()?;
            }
        }
        if let Some(m) = parts.get(7).and_then(|m| m.strip_prefix('m')) {
            let entries: Vec<&str> = m.split(',').filter(|e| !e.is_empty()).collect();
            // A cut signature's last entry may be incomplete.
            let keep = if cut {
                entries.len().saturating_sub(1)
            } else {
                entries.len()
            };
            for e in &entries[..keep] {
                let (key, n) = e.split_once('*')?;
                let (op, class) = key.split_once('.')?;
                let (op, class): (usize, usize) = (op.parse().ok()?, class.parse().ok()?);
                if op >= METAL_OPS.len() || class >= CLASSES.len() {
                    continue;
                }
                *s.calls.metal.entry((op, class)).or_default() += n.parse::<u32>().ok()?;
            }
        }
        Some(s)
    }
}

/// A registry member read back ([`Signature::parse`]): its signature and,
/// for an earlier build's signature, the calls and conflicts each of its
/// requests made (zero for this build's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// The signature (five fields).
    pub signature: Signature,
    /// Conflicts per request.
    pub conflicts: u32,
    /// Calls per request.
    pub calls: Calls,
}

/// One answered request, as the shell saw it: what [`record_request`]
/// counts.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The component's name.
    pub component: &'a str,
    /// The route template of the answer.
    pub route: &'a str,
    /// The HTTP status.
    pub status: u16,
    /// The outcome.
    pub outcome: &'a str,
    /// The error reason (empty when none).
    pub reason: &'a str,
    /// Compare-and-swap conflicts (swaps that did not land).
    pub conflicts: u32,
    /// Outbound calls.
    pub calls: &'a Calls,
    /// The handler already counted the request's signature (inside its own
    /// write): only the calls and conflicts are counted.
    pub signature_counted: bool,
}

/// Whether a counter that is `n` after adding `delta` passed a power of
/// two (1, 2, 4, …) with that add.
///
/// ```
/// use metal_ipam_core::observe::counters::passed_power_of_two;
/// let hits: Vec<i64> = (1..=9).filter(|n| passed_power_of_two(*n, 1)).collect();
/// assert_eq!(hits, [1, 2, 4, 8]);
/// assert!(passed_power_of_two(5, 3) && !passed_power_of_two(7, 2) && passed_power_of_two(9, 2));
/// ```
pub fn passed_power_of_two(n: i64, delta: i64) -> bool {
    let before = n - delta;
    n > 0 && (before <= 0 || n.ilog2() > before.ilog2())
}

/// The call and conflict counters one request adds to: (key, amount), one
/// per distinct key with a non-zero amount.
fn counter_adds(component: &str, conflicts: u32, calls: &Calls) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for (class, n) in CLASSES.iter().zip(calls.kube) {
        if n > 0 {
            out.push((keys::obs_kube(component, class), i64::from(n)));
        }
    }
    for (&(op, class), &n) in &calls.metal {
        if n > 0 && op < METAL_OPS.len() && class < CLASSES.len() {
            out.push((keys::obs_metal(op, CLASSES[class]), i64::from(n)));
        }
    }
    if conflicts > 0 {
        out.push((keys::obs_conflicts(component), i64::from(conflicts)));
    }
    out
}

/// Counts one answered request: `increment(obs/req/<signature>, 1)`
/// (unless [`Request::signature_counted`]) and `increment(key, n)` per
/// call or conflict counter it touched; a key whose count passed a power
/// of two is then registered (one registry `cas_read` per registry, a
/// write the first time). See the module docs for the caps and the
/// overflow signature.
///
/// Not idempotent (a count): the shell calls it once per request.
///
/// # Errors
/// Store failures (503); the registries' errors (500 for an unreadable
/// record, 503 `Contention`). Counting stops at the first error; what was
/// incremented stays counted.
pub fn record_request<K: KvStore>(ctx: &Ctx<'_, K>, req: &Request<'_>) -> Result<()> {
    let signature = Signature::new(
        req.component,
        req.route,
        req.status,
        req.outcome,
        req.reason,
    );
    let mut new_signature = None;
    if !req.signature_counted {
        let text = signature.encode();
        let n = ctx.kv.increment(&keys::obs_request(&text), 1)?;
        if passed_power_of_two(n, 1) {
            new_signature = Some((text, n));
        }
    }
    let mut passed = Vec::new();
    for (key, n) in counter_adds(&signature.component, req.conflicts, req.calls) {
        if passed_power_of_two(ctx.kv.increment(&key, n)?, n) {
            passed.push(key);
        }
    }
    if !passed.is_empty() {
        let refs: Vec<&str> = passed.iter().map(String::as_str).collect();
        if registry::add(ctx, &COUNTER_REGISTRY, &refs, COUNTER_KEYS)? == Added::Full {
            return Err(Error::internal(
                "the counter registry is full, which its cap rules out",
            ));
        }
    }
    if let Some((text, n)) = new_signature {
        if registry::add(ctx, &REGISTRY, &[&text], MAX_SIGNATURES)? == Added::Full {
            // The requests since the last power of two (n is one).
            let since = n - n / 2;
            let over = signature.overflow().encode();
            let m = ctx.kv.increment(&keys::obs_request(&over), since)?;
            if passed_power_of_two(m, since)
                && registry::add(
                    ctx,
                    &REGISTRY,
                    &[&over],
                    MAX_SIGNATURES + OVERFLOW_SIGNATURES,
                )? == Added::Full
            {
                return Err(Error::internal(
                    "the signature registry refused an overflow signature, which its reserve rules out",
                ));
            }
        }
    }
    Ok(())
}

/// What the counters hold, summed for the exposition by [`read_all`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requests by (component, route, status).
    pub requests: BTreeMap<(String, String, u16), u64>,
    /// Answers with outcome `allocated`.
    pub allocations: u64,
    /// Answers with outcome `released`, the `network` component's (a
    /// machine's release) excepted.
    pub releases: u64,
    /// Answers with reason `Contention`, by component.
    pub contention: BTreeMap<String, u64>,
    /// Compare-and-swap conflicts by component.
    pub conflicts: BTreeMap<String, u64>,
    /// Kubernetes calls by (component, class index in [`CLASSES`]).
    pub kube: BTreeMap<(String, usize), u64>,
    /// Metal calls by (operation index in [`METAL_OPS`], class index).
    pub metal: BTreeMap<(usize, usize), u64>,
    /// Requests not counted under their own signature: those under an
    /// overflow signature, and an earlier build's `obs/dropped`.
    pub unregistered: u64,
    /// Members of [`REGISTRY`].
    pub signatures: usize,
    /// Members of [`COUNTER_REGISTRY`].
    pub counters: usize,
}

impl Totals {
    /// Adds `n` requests of the signature `text` counted elsewhere than in
    /// its own key: the allocations and releases a pool record counted in
    /// its own write (`ipam::index::Index::counted`). Text that is not a
    /// signature is ignored.
    pub fn add_signature(&mut self, text: &str, n: u64) {
        if let Some(s) = Signature::parse(text) {
            self.add(&s, n);
        }
    }

    /// Adds `n` requests of `s`, each with `conflicts` and `calls`.
    fn add(&mut self, s: &Stored, n: u64) {
        let sig = &s.signature;
        *self
            .requests
            .entry((sig.component.clone(), sig.route.clone(), sig.status))
            .or_default() += n;
        if sig.is_overflow() {
            self.unregistered += n;
        } else if sig.reason == "Contention" {
            *self.contention.entry(sig.component.clone()).or_default() += n;
        }
        match sig.outcome.as_str() {
            "allocated" => self.allocations += n,
            "released" if sig.component != "network" => self.releases += n,
            _ => {}
        }
        if s.conflicts > 0 {
            *self.conflicts.entry(sig.component.clone()).or_default() += u64::from(s.conflicts) * n;
        }
        for (class, c) in s.calls.kube.iter().enumerate() {
            if *c > 0 {
                *self.kube.entry((sig.component.clone(), class)).or_default() += u64::from(*c) * n;
            }
        }
        for (k, c) in &s.calls.metal {
            *self.metal.entry(*k).or_default() += u64::from(*c) * n;
        }
    }

    /// Adds `n` to the call or conflict counter `c` (labels checked by
    /// [`counter_labels`]).
    fn add_counter(&mut self, c: Counter, n: u64) {
        match c {
            Counter::Kube(component, class) => {
                *self.kube.entry((component.to_string(), class)).or_default() += n;
            }
            Counter::Metal(op, class) => *self.metal.entry((op, class)).or_default() += n,
            Counter::Conflicts(component) => {
                *self.conflicts.entry(component.to_string()).or_default() += n;
            }
        }
    }
}

/// A call or conflict counter with this build's labels.
#[derive(Debug, Clone, Copy)]
enum Counter {
    Kube(&'static str, usize),
    Metal(usize, usize),
    Conflicts(&'static str),
}

/// The labels of a counter key, `None` when they are not this build's (a
/// member written by another build: skipped).
fn counter_labels(c: ObsCounter<'_>) -> Option<Counter> {
    let class = |name: &str| CLASSES.iter().position(|c| *c == name);
    Some(match c {
        ObsCounter::Kube {
            component,
            class: k,
        } => Counter::Kube(component_of(component), class(k)?),
        ObsCounter::Metal { op, class: k } if op < METAL_OPS.len() => Counter::Metal(op, class(k)?),
        ObsCounter::Metal { .. } => return None,
        ObsCounter::Conflicts { component } => Counter::Conflicts(component_of(component)),
    })
}

/// Every registered counter, summed: one `get` of each registry, one
/// `increment(key, 0)` per member it can read (an earlier build's
/// signatures folded in, members it cannot read skipped), one for
/// `obs/dropped`. Independent of the traffic: S + C + 3 operations for S
/// registered signatures and C registered call and conflict counters.
///
/// # Errors
/// Store failures (503), an unreadable registry (500).
pub fn read_all<K: KvStore>(kv: &K) -> Result<Totals> {
    let mut t = Totals::default();
    let signatures = registry::read(kv, &REGISTRY)?.unwrap_or_default();
    t.signatures = signatures.len();
    for text in &signatures {
        if let Some(stored) = Signature::parse(text) {
            let n = kv.increment(&keys::obs_request(text), 0)?;
            t.add(&stored, u64::try_from(n).unwrap_or(0));
        }
    }
    let counters = registry::read(kv, &COUNTER_REGISTRY)?.unwrap_or_default();
    t.counters = counters.len();
    for key in &counters {
        // Parsed before it is read: a member of another build is skipped
        // without touching its key.
        if let Some(c) = keys::parse_obs_counter(key).and_then(counter_labels) {
            let n = u64::try_from(kv.increment(key, 0)?).unwrap_or(0);
            t.add_counter(c, n);
        }
    }
    t.unregistered += u64::try_from(kv.increment(keys::OBS_DROPPED, 0)?).unwrap_or(0);
    // Zeros where a series may come (as the exposition had them): the
    // conflicts of every component with requests, every class of a
    // component with Kubernetes calls.
    let components: Vec<String> = t.requests.keys().map(|(c, _, _)| c.clone()).collect();
    for c in components {
        t.conflicts.entry(c).or_default();
    }
    let callers: Vec<String> = t.kube.keys().map(|(c, _)| c.clone()).collect();
    for c in callers {
        for class in 0..CLASSES.len() {
            t.kube.entry((c.clone(), class)).or_default();
        }
    }
    Ok(t)
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;

    use crate::testing::{Backend, MemKv, Reply, ScriptedHttp, TestEnv};

    const BACKENDS: [Backend; 3] = [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36];

    fn ctx<'a>(kv: &'a MemKv, env: &'a TestEnv) -> Ctx<'a, MemKv> {
        Ctx::auto(kv, env)
    }

    fn request<'a>(calls: &'a Calls, conflicts: u32, status: u16, reason: &'a str) -> Request<'a> {
        Request {
            component: "reconcile",
            route: "/v1/reconcile",
            status,
            outcome: if reason.is_empty() {
                "reconciled"
            } else {
                "error"
            },
            reason,
            conflicts,
            calls,
            signature_counted: false,
        }
    }

    /// Issue 26 finding 3, natively: requests of one (component, route,
    /// status, outcome, reason) whose call and conflict counts all differ
    /// register one signature, and the counters hold the exact sums.
    #[test]
    fn varying_calls_and_conflicts_make_one_signature_and_exact_counters() {
        for backend in BACKENDS {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = ctx(&kv, &env);
            let mut want = Totals::default();
            // Every class of a component with calls is exposed (0 if none).
            for class in 0..CLASSES.len() {
                want.kube.insert(("reconcile".into(), class), 0);
            }
            let (get_vrf, post_ips) = (
                metal_op("GET", "/metal/v1/vrfs/x"),
                metal_op("POST", "/metal/v1/projects/p/ips"),
            );
            for i in 0..300u32 {
                let mut calls = Calls {
                    kube: [i, 0, i % 3, i % 7, i % 2],
                    ..Calls::default()
                };
                calls.metal.insert((get_vrf, 0), i % 11);
                calls.metal.insert((post_ips, 4), i % 5);
                let conflicts = i % 13;
                record_request(&ctx, &request(&calls, conflicts, 200, "")).unwrap();
                for (class, n) in calls.kube.iter().enumerate() {
                    if *n > 0 {
                        *want.kube.entry(("reconcile".into(), class)).or_default() += u64::from(*n);
                    }
                }
                for (k, n) in &calls.metal {
                    if *n > 0 {
                        *want.metal.entry(*k).or_default() += u64::from(*n);
                    }
                }
                if conflicts > 0 {
                    *want.conflicts.entry("reconcile".into()).or_default() += u64::from(conflicts);
                }
            }
            let got = read_all(&kv).unwrap();
            assert_eq!(got.signatures, 1, "{backend:?}");
            assert_eq!(
                got.requests.into_iter().collect::<Vec<_>>(),
                [(("reconcile".into(), "/v1/reconcile".into(), 200), 300)]
            );
            assert_eq!(got.kube, want.kube, "{backend:?}");
            assert_eq!(got.metal, want.metal, "{backend:?}");
            assert_eq!(got.conflicts, want.conflicts, "{backend:?}");
            // Bounded keys: 4 Kubernetes classes + 2 Metal + 1 conflicts.
            assert_eq!(got.counters, 7, "{backend:?}");
        }
    }

    #[test]
    fn a_request_without_calls_costs_one_increment_and_each_counter_one_more() {
        for backend in BACKENDS {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = ctx(&kv, &env);
            let none = Calls::default();
            let mut ops = Vec::new();
            for _ in 0..5 {
                kv.reset_counts();
                record_request(&ctx, &request(&none, 0, 200, "")).unwrap();
                ops.push(kv.counts().total());
            }
            // 1: increment + creation of the registry; 2, 4: increment +
            // one read (present); 3, 5: the increment alone.
            assert_eq!(
                (ops[1], ops[2], ops[3], ops[4]),
                (2, 1, 2, 1),
                "{backend:?}"
            );
            let mut calls = Calls::default();
            calls.kube[0] = 3;
            calls.metal.insert((3, 0), 1);
            // Past their powers of two: signature 9 → 10, kube 12 → 15,
            // Metal and conflicts 4 → 5.
            for _ in 0..4 {
                record_request(&ctx, &request(&calls, 1, 200, "")).unwrap();
            }
            kv.reset_counts();
            record_request(&ctx, &request(&calls, 1, 200, "")).unwrap();
            let c = kv.counts();
            assert_eq!(
                (c.increment, c.total()),
                (4, 4),
                "{backend:?}: the signature, kube 2xx, one Metal op, conflicts"
            );
            // A handler that counted its signature itself: only the rest.
            kv.reset_counts();
            let mut counted = request(&none, 0, 200, "");
            counted.signature_counted = true;
            record_request(&ctx, &counted).unwrap();
            assert_eq!(kv.counts().total(), 0, "{backend:?}");
        }
    }

    /// A first-seen failure is counted under its status even when the
    /// registry is full (filled here by an earlier build's signatures).
    #[test]
    fn a_new_failure_is_counted_when_the_registry_is_full() {
        for backend in BACKENDS {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = ctx(&kv, &env);
            let many: Vec<String> = (0..MAX_SIGNATURES)
                .map(|i| format!("allocate|/v1/claims|201|allocated|-|k{i},0,0,0,0|c0|m"))
                .collect();
            let refs: Vec<&str> = many.iter().map(String::as_str).collect();
            assert_eq!(
                registry::add(&ctx, &REGISTRY, &refs, MAX_SIGNATURES).unwrap(),
                Added::Added
            );
            let none = Calls::default();
            for i in 1..=5u64 {
                record_request(&ctx, &request(&none, 0, 503, "StoreUnavailable")).unwrap();
                let t = read_all(&kv).unwrap();
                let n = t.requests[&("reconcile".into(), OTHER.into(), 503)];
                // Exact at each power of two, low by less than half between.
                assert_eq!(n, 1 << i.ilog2(), "{backend:?} after {i}");
                assert_eq!(t.unregistered, n);
                assert_eq!(t.signatures, MAX_SIGNATURES + 1, "the overflow signature");
            }
        }
    }

    #[test]
    fn an_earlier_builds_signatures_fold_into_the_same_series() {
        let kv = MemKv::new(Backend::SpinSqlite);
        let env = TestEnv::at(1_000);
        let ctx = ctx(&kv, &env);
        let old = [
            (
                "reconcile|/v1/reconcile|200|reconciled|-|k3,0,0,0,0|c1|m",
                4,
            ),
            (
                "reconcile|/v1/reconcile|200|reconciled|-|k5,0,1,0,0|c0|m9.0*2",
                2,
            ),
            ("allocate|/v1/claims|503|error|Contention|k|c6|m", 1),
            ("not a signature", 9),
        ];
        let texts: Vec<&str> = old.iter().map(|(t, _)| *t).collect();
        registry::add(&ctx, &REGISTRY, &texts, LEGACY_SIGNATURES).unwrap();
        for (t, n) in old {
            kv.increment(&keys::obs_request(t), n).unwrap();
        }
        let mut calls = Calls::default();
        calls.kube[0] = 1;
        record_request(&ctx, &request(&calls, 0, 200, "")).unwrap();
        kv.reset_counts();
        let t = read_all(&kv).unwrap();
        assert_eq!(
            t.requests[&("reconcile".into(), "/v1/reconcile".into(), 200)],
            4 + 2 + 1
        );
        assert_eq!(
            t.requests[&("allocate".into(), "/v1/claims".into(), 503)],
            1
        );
        assert_eq!(t.kube[&("reconcile".into(), 0)], 3 * 4 + 5 * 2 + 1);
        assert_eq!(t.kube[&("reconcile".into(), 2)], 2);
        assert_eq!(t.metal[&(9, 0)], 4);
        assert_eq!(t.conflicts[&"reconcile".to_string()], 4);
        assert_eq!(t.conflicts[&"allocate".to_string()], 6);
        assert_eq!(t.contention[&"allocate".to_string()], 1);
        // Two registry reads, one per member it can read, obs/dropped.
        assert_eq!(t.signatures, 5);
        assert_eq!(kv.counts().total(), 2 + 4 + 1 + 1);
    }

    #[test]
    fn long_legacy_signatures_keep_what_is_complete_before_the_cut() {
        let mut full =
            "network|/v1/machines/{namespace}/{name}/network|200|converged|-|k|c0|m".to_string();
        let entries: Vec<String> = (1..METAL_OPS.len())
            .map(|op| format!("{op}.0*{}", 1000 + op))
            .collect();
        full.push_str(&entries.join(","));
        assert!(full.len() > MAX_SIGNATURE);
        // How the earlier build cut it: the first bytes, `#`, a hash.
        let text = format!("{}#{:016x}", &full[..MAX_SIGNATURE - 17], 0x1234_u64);
        let s = Signature::parse(&text).unwrap();
        assert_eq!(s.signature.component, "network");
        assert_eq!(s.signature.route, "/v1/machines/{namespace}/{name}/network");
        assert!(!s.calls.metal.is_empty());
        for ((op, class), n) in &s.calls.metal {
            assert_eq!(
                (*class, *n as usize),
                (0, 1000 + op),
                "a kept entry is exact"
            );
        }
    }

    #[test]
    fn every_field_comes_from_a_finite_set() {
        // Each route a component serves is kept; anything else is `other`.
        for r in TABLE {
            for c in r.served_by {
                let s = Signature::new(c.name(), r.template, 200, "ok", "");
                assert_eq!(s.route, r.template);
                assert!(s.encode().len() <= MAX_SIGNATURE);
            }
        }
        let s = Signature::new("allocate", "/v1/metrics", 999, &"x".repeat(65), "a b");
        assert_eq!(
            (
                s.route.as_str(),
                s.status,
                s.outcome.as_str(),
                s.reason.as_str()
            ),
            (OTHER, 0, OTHER, OTHER)
        );
        // The longest possible signature fits.
        let longest = Signature {
            component: "attach-vlan".into(),
            route: TABLE
                .iter()
                .map(|r| r.template)
                .max_by_key(|t| t.len())
                .unwrap()
                .into(),
            status: 599,
            outcome: "o".repeat(MAX_WORD),
            reason: "r".repeat(MAX_WORD),
        };
        assert!(keys::obs_request(&longest.encode()).len() < 256);
        // The counter keys: exactly COUNTER_KEYS, all parsed back.
        let mut names: Vec<&str> = Component::ALL.iter().map(|c| c.name()).collect();
        names.push(OTHER);
        let mut all = std::collections::BTreeSet::new();
        for c in &names {
            for class in CLASSES {
                all.insert(keys::obs_kube(c, class));
            }
            all.insert(keys::obs_conflicts(c));
        }
        for op in 0..METAL_OPS.len() {
            for class in CLASSES {
                all.insert(keys::obs_metal(op, class));
            }
        }
        assert_eq!(all.len(), COUNTER_KEYS);
        // The figures kv-schema/README.md states.
        assert_eq!(COUNTER_KEYS, 251, "update kv-schema/README.md");
        let no_store = [
            Component::Healthz,
            Component::Events,
            Component::AttachVlan,
            Component::DetachVlan,
        ];
        let pairs: usize = Component::ALL
            .iter()
            .filter(|c| !no_store.contains(c))
            .map(|c| 1 + TABLE.iter().filter(|r| r.served_by.contains(c)).count())
            .sum();
        assert_eq!(
            pairs, 61,
            "update MAX_SIGNATURES' docs and kv-schema/README.md"
        );
        assert!(all.iter().all(|k| keys::parse_obs_counter(k)
            .and_then(counter_labels)
            .is_some()));
    }

    #[test]
    fn the_tally_classifies_by_base_url() {
        let http = ScriptedHttp::new(vec![
            ("GET /api/v1/namespaces", Reply::status(200)),
            ("POST /metal/v1/devices/d1/ips", Reply::status(422)),
            ("GET /x", Reply::status(200)),
            ("GET /apis/x", Reply::status(503)),
        ]);
        let t = Tally::new(http, Some("https://k8s"), Some("https://metal/metal/v1"));
        for (m, u) in [
            ("GET", "https://k8s/api/v1/namespaces"),
            ("POST", "https://metal/metal/v1/devices/d1/ips"),
            ("GET", "http://attach-vlan.spin.internal/x"),
            ("GET", "https://k8s/apis/x"),
        ] {
            let mut req = http::Request::builder()
                .method(m)
                .uri(u)
                .body(Vec::new())
                .unwrap();
            crate::ports::http::Deadline::FALLBACK.set(&mut req);
            t.send(req).unwrap();
        }
        let c = t.calls();
        assert_eq!(c.kube, [1, 0, 0, 1, 0]);
        let op = metal_op("POST", "/metal/v1/devices/x/ips");
        assert_eq!(c.metal.into_iter().collect::<Vec<_>>(), [((op, 2), 1)]);
    }
}
