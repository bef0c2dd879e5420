//! Request counters: what every request of a component with a store did,
//! counted with one atomic `increment` per request.
//!
//! A request's [`Signature`] says what it did: component, route template,
//! status, outcome, reason, its Kubernetes calls by status class, its Metal
//! calls by operation ([`METAL_OPS`]) and class, and its compare-and-swap
//! conflicts. The shell ([`Tally`] around its HTTP client, `CountingKv`
//! for the conflicts) builds it after the handler answered and calls
//! [`record`]: `increment(obs/req/<signature>, 1)`, and when that returns
//! a power of two (1, 2, 4, …) it adds the signature to the registry
//! `obs/signatures` ([`crate::kv::registry`]): O(log n) registry reads over
//! n requests, and a crash between the increment and the registration
//! heals at the next power of two. Past [`MAX_SIGNATURES`] the registry
//! refuses a new signature and [`record`] adds the requests it stands for
//! to `obs/dropped` instead (at each power of two, the requests since the
//! last one: so `obs/dropped` is exact at every power of two of each
//! unregistered signature and low by less than half in between).
//!
//! Signatures are compact text, at most [`MAX_SIGNATURE`] bytes (so
//! `obs/req/<signature>` stays under Spin's 256-byte key limit): a longer
//! one keeps its first bytes and ends with `#` and the 64-bit FNV-1a hash
//! of the whole (its Metal calls past the cut are not reported).
//!
//! Not counted: components without a store (`events`, `attach-vlan`,
//! `detach-vlan`, `healthz`: nowhere to count; a chained step's Metal
//! calls are therefore not in its caller's signature either), and requests
//! answered before the store is opened (401, 413, setup errors).

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::error::Result;
use crate::kv::keys;
use crate::kv::registry::{self, Added, RegistryId};
use crate::kv::Ctx;
use crate::ports::http::{HttpClient, TransportError};
use crate::ports::kv::KvStore;

/// The registry of signatures.
pub const REGISTRY: RegistryId = RegistryId {
    key: keys::OBS_SIGNATURES,
    guard: keys::OBS_SIGNATURES_INIT,
};

/// Most signatures the registry holds.
pub const MAX_SIGNATURES: usize = 2000;

/// Longest signature, in bytes (`obs/req/` + this stays under 256).
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

/// What one request did, as counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signature {
    /// The component.
    pub component: String,
    /// The route template (`-` when none matched).
    pub route: String,
    /// The HTTP status.
    pub status: u16,
    /// The outcome (`allocated`, `released`, `error`, …).
    pub outcome: String,
    /// The error reason (`-` when none).
    pub reason: String,
    /// Compare-and-swap conflicts (swaps that did not land).
    pub conflicts: u32,
    /// Outbound calls.
    pub calls: Calls,
}

fn field(s: &str) -> String {
    if s.is_empty() {
        return "-".into();
    }
    s.chars()
        .map(|c| if c == '|' || c.is_control() { '_' } else { c })
        .collect()
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Signature {
    /// The signature's text: `component|route|status|outcome|reason|k…|c…|m…`
    /// where `k` lists the Kubernetes calls per class (`k` alone: none),
    /// `c` the conflicts and `m` the Metal calls as `op.class*n` joined by
    /// `,`. At most [`MAX_SIGNATURE`] bytes (see the module docs).
    ///
    /// ```
    /// use metal_ipam_core::observe::counters::Signature;
    /// let mut s = Signature { component: "allocate".into(), route: "/v1/claims/{namespace}/{name}".into(),
    ///     status: 201, outcome: "allocated".into(), ..Default::default() };
    /// assert_eq!(s.encode(), "allocate|/v1/claims/{namespace}/{name}|201|allocated|-|k|c0|m");
    /// s.calls.kube[0] = 2;
    /// s.calls.metal.insert((9, 0), 1);
    /// assert_eq!(s.encode(), "allocate|/v1/claims/{namespace}/{name}|201|allocated|-|k2,0,0,0,0|c0|m9.0*1");
    /// // An empty field is written `-` and reads back as `-`.
    /// let back = Signature::parse(&s.encode()).unwrap();
    /// assert_eq!(back.reason, "-");
    /// assert_eq!(back.encode(), s.encode());
    /// ```
    pub fn encode(&self) -> String {
        let kube = if self.calls.kube.iter().all(|n| *n == 0) {
            "k".to_string()
        } else {
            let n: Vec<String> = self.calls.kube.iter().map(u32::to_string).collect();
            format!("k{}", n.join(","))
        };
        let metal: Vec<String> = self
            .calls
            .metal
            .iter()
            .map(|((op, class), n)| format!("{op}.{class}*{n}"))
            .collect();
        let full = format!(
            "{}|{}|{}|{}|{}|{kube}|c{}|m{}",
            field(&self.component),
            field(&self.route),
            self.status,
            field(&self.outcome),
            field(&self.reason),
            self.conflicts,
            metal.join(","),
        );
        if full.len() <= MAX_SIGNATURE {
            return full;
        }
        let mut cut = MAX_SIGNATURE - 17;
        while !full.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}#{:016x}", &full[..cut], fnv1a(&full))
    }

    /// Reads a signature's text back (a shortened one: what is complete
    /// before the cut); `None` for text that is not one.
    pub fn parse(text: &str) -> Option<Signature> {
        let (text, cut) = match text.rsplit_once('#') {
            Some((head, hash)) if hash.len() == 16 && text.len() >= MAX_SIGNATURE - 1 => {
                (head, true)
            }
            _ => (text, false),
        };
        let parts: Vec<&str> = text.splitn(8, '|').collect();
        if parts.len() < 5 {
            return None;
        }
        let mut s = Signature {
            component: parts[0].to_string(),
            route: parts[1].to_string(),
            status: parts[2].parse().ok()?,
            outcome: parts[3].to_string(),
            reason: parts[4].to_string(),
            ..Signature::default()
        };
        let last = parts.len() - 1;
        if let Some(k) = parts.get(5).and_then(|k| k.strip_prefix('k')) {
            let complete = !(cut && last == 5);
            if complete && !k.is_empty() {
                for (i, n) in k.split(',').enumerate().take(5) {
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

/// Counts one request of `signature`: one `increment`, and at each power
/// of two of its count, the registration (see the module docs). Returns
/// the count.
///
/// # Errors
/// Store failures (503); the registry's errors.
pub fn record<K: KvStore>(ctx: &Ctx<'_, K>, signature: &str) -> Result<i64> {
    let n = ctx.kv.increment(&keys::obs_request(signature), 1)?;
    if n > 0 && n & (n - 1) == 0 {
        if let Added::Full = registry::add(ctx, &REGISTRY, &[signature], MAX_SIGNATURES)? {
            // The requests since the last power of two.
            ctx.kv.increment(keys::OBS_DROPPED, n - n / 2)?;
        }
    }
    Ok(n)
}

/// Every registered signature with its count, and the requests counted in
/// `obs/dropped`: one `get` of the registry, one `increment(key, 0)` per
/// signature, one for `obs/dropped`.
///
/// # Errors
/// Store failures (503), an unreadable registry (500).
pub fn read_all<K: KvStore>(kv: &K) -> Result<(Vec<(Signature, u64)>, u64)> {
    let mut out = Vec::new();
    for text in registry::read(kv, &REGISTRY)?.unwrap_or_default() {
        let n = kv.increment(&keys::obs_request(&text), 0)?;
        if let Some(sig) = Signature::parse(&text) {
            out.push((sig, u64::try_from(n).unwrap_or(0)));
        }
    }
    let dropped = u64::try_from(kv.increment(keys::OBS_DROPPED, 0)?).unwrap_or(0);
    Ok((out, dropped))
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::kv::SwapPolicy;
    use crate::testing::{Backend, MemKv, Reply, ScriptedHttp, TestEnv};

    #[test]
    fn long_signatures_are_cut_with_a_hash_and_stay_deterministic() {
        let mut s = Signature {
            component: "network".into(),
            route: "/v1/steps/network/{device}".into(),
            status: 200,
            outcome: "converged".into(),
            ..Default::default()
        };
        for op in 1..METAL_OPS.len() {
            s.calls.metal.insert((op, 0), 1000 + op as u32);
        }
        let a = s.encode();
        assert!(a.len() <= MAX_SIGNATURE, "{}", a.len());
        assert_eq!(a, s.encode());
        assert!(keys::obs_request(&a).len() < 256);
        let back = Signature::parse(&a).unwrap();
        assert_eq!(back.component, "network");
        assert_eq!(back.status, 200);
        assert!(!back.calls.metal.is_empty());
        for (k, n) in &back.calls.metal {
            assert_eq!(s.calls.metal[k], *n, "a kept entry is exact");
        }
        let mut other = s.clone();
        other.calls.metal.insert((METAL_OPS.len() - 1, 0), 1);
        assert_ne!(other.encode(), a, "the hash tells them apart");
        // Fields never break the format.
        let odd = Signature {
            component: "a|b".into(),
            ..Default::default()
        };
        assert_eq!(Signature::parse(&odd.encode()).unwrap().component, "a_b");
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

    #[test]
    fn registration_happens_at_powers_of_two_and_past_the_cap_counts_as_dropped() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = Ctx {
                kv: &kv,
                env: &env,
                swap_policy: SwapPolicy::Auto,
            };
            let mut ops = Vec::new();
            for _ in 0..5 {
                kv.reset_counts();
                record(&ctx, "a|-|200|ok|-|k|c0|m").unwrap();
                ops.push(kv.counts().total());
            }
            // 1: increment + creation of the registry; 2, 4: increment +
            // one read (present); 3, 5: the increment alone.
            assert_eq!(ops[2], 1, "{backend:?}");
            assert_eq!(ops[4], 1, "{backend:?}");
            assert_eq!(ops[1], 2, "{backend:?}");
            assert_eq!(ops[3], 2, "{backend:?}");
            let (all, dropped) = read_all(&kv).unwrap();
            assert_eq!(all.len(), 1);
            assert_eq!(all[0].1, 5);
            assert_eq!(dropped, 0);
            // Fill the registry, then a new signature is dropped.
            let many: Vec<String> = (0..MAX_SIGNATURES - 1)
                .map(|i| format!("s{i}|-|200|ok|-|k|c0|m"))
                .collect();
            let refs: Vec<&str> = many.iter().map(String::as_str).collect();
            registry::add(&ctx, &REGISTRY, &refs, MAX_SIGNATURES).unwrap();
            for _ in 0..4 {
                record(&ctx, "new|-|200|ok|-|k|c0|m").unwrap();
            }
            let (_, dropped) = read_all(&kv).unwrap();
            assert_eq!(dropped, 4, "{backend:?}");
        }
    }
}
