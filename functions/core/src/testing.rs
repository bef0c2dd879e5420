//! In-memory test doubles (feature `testing`): a key-value store that
//! reproduces each real Spin backend's quirks, with operation counting and
//! fault injection, a deterministic [`Env`], and a scripted
//! [`HttpClient`] that checks the order of requests.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::ports::http::{Deadline, HttpClient, TransportError, TransportKind};
use crate::ports::kv::{KvError, KvStore, OpCounts, Swap};
use crate::ports::Env;

/// Which real backend [`MemKv`] imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Spin's default SQLite store: a swap after `current() == None` is an
    /// upsert; counters are 8-byte little-endian; incrementing anything else
    /// is a host panic (reported here as an error and recorded).
    SpinSqlite,
    /// Redis with the transaction's reply read as Spin's code intends: a
    /// swap whose key changed since `current()` is reported as success
    /// without writing; counters are decimal text; `get_many` fails (Spin
    /// sends it as a `KEYS` command).
    Redis,
    /// Spin 3.6's Redis store as it really behaves: its `UNWATCH <key>`
    /// after the EXEC is refused, so every swap is reported as failed,
    /// whether it was applied or aborted; otherwise as [`Backend::Redis`].
    RedisSpin36,
    /// An ideal store: exact swaps, including on absent keys.
    Exact,
}

/// Handle returned by [`MemKv::cas_read`].
#[derive(Debug, Clone)]
pub struct MemCas {
    key: String,
    seen: Option<Vec<u8>>,
}

#[derive(Default)]
struct Inner {
    map: BTreeMap<String, Vec<u8>>,
    counts: OpCounts,
    fail_after: Option<u32>,
    ops_seen: u32,
    increment_panics: u32,
    silent_aborts: u32,
}

/// An in-memory store shared by every clone-by-reference user (wrap it in
/// an `Arc` to share it between threads).
pub struct MemKv {
    backend: Backend,
    inner: Mutex<Inner>,
}

impl MemKv {
    /// An empty store imitating `backend`.
    pub fn new(backend: Backend) -> Self {
        MemKv {
            backend,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts of operations since creation or the last [`MemKv::reset_counts`].
    pub fn counts(&self) -> OpCounts {
        self.lock().counts
    }

    /// Zeroes the counters.
    pub fn reset_counts(&self) {
        self.lock().counts = OpCounts::default();
    }

    /// Makes every operation after the next `n` fail, as if the request
    /// died there (`None` lifts it).
    pub fn fail_after(&self, n: Option<u32>) {
        let mut i = self.lock();
        i.fail_after = n;
        i.ops_seen = 0;
    }

    /// How many increments hit a non-counter value (a host panic on Spin's
    /// SQLite store). Tests assert this stays zero.
    pub fn increment_panics(&self) -> u32 {
        self.lock().increment_panics
    }

    /// How many swaps were reported as success without writing (Redis).
    pub fn silent_aborts(&self) -> u32 {
        self.lock().silent_aborts
    }

    /// A copy of every key and value.
    pub fn dump(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock().map.clone()
    }

    /// Replaces the whole content (for golden-data tests).
    pub fn load(&self, map: BTreeMap<String, Vec<u8>>) {
        self.lock().map = map;
    }

    fn op(
        &self,
        count: impl FnOnce(&mut OpCounts),
    ) -> Result<std::sync::MutexGuard<'_, Inner>, KvError> {
        let mut i = self.lock();
        count(&mut i.counts);
        i.ops_seen += 1;
        if let Some(n) = i.fail_after {
            if i.ops_seen > n {
                return Err(KvError::Other("injected fault".into()));
            }
        }
        Ok(i)
    }

    fn decode_counter(&self, v: &[u8]) -> Option<i64> {
        match self.backend {
            Backend::SpinSqlite | Backend::Exact => {
                <[u8; 8]>::try_from(v).ok().map(i64::from_le_bytes)
            }
            Backend::Redis | Backend::RedisSpin36 => std::str::from_utf8(v).ok()?.parse().ok(),
        }
    }

    fn encode_counter(&self, n: i64) -> Vec<u8> {
        match self.backend {
            Backend::SpinSqlite | Backend::Exact => n.to_le_bytes().to_vec(),
            Backend::Redis | Backend::RedisSpin36 => n.to_string().into_bytes(),
        }
    }
}

impl KvStore for MemKv {
    type Cas = MemCas;

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let i = self.op(|c| c.get += 1)?;
        Ok(i.map.get(key).cloned())
    }

    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let i = self.op(|c| c.get_many += 1)?;
        if matches!(self.backend, Backend::Redis | Backend::RedisSpin36) {
            return Err(KvError::Other(
                "ERR wrong number of arguments for 'keys' command".into(),
            ));
        }
        Ok(keys.iter().map(|k| i.map.get(k).cloned()).collect())
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        let mut i = self.op(|c| c.set += 1)?;
        i.map.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), KvError> {
        let mut i = self.op(|c| c.delete += 1)?;
        i.map.remove(key);
        Ok(())
    }

    fn list_keys(&self) -> Result<Vec<String>, KvError> {
        let i = self.op(|c| c.list_keys += 1)?;
        Ok(i.map.keys().cloned().collect())
    }

    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        let mut i = self.op(|c| c.increment += 1)?;
        let current = match i.map.get(key) {
            None => 0,
            Some(v) => match self.decode_counter(v) {
                Some(n) => n,
                None => {
                    if matches!(self.backend, Backend::SpinSqlite | Backend::Exact) {
                        i.increment_panics += 1;
                        return Err(KvError::Other(
                            "host panic: incorrect length (increment of a non-counter)".into(),
                        ));
                    }
                    return Err(KvError::Other(
                        "ERR value is not an integer or out of range".into(),
                    ));
                }
            },
        };
        let n = current.wrapping_add(delta);
        let enc = self.encode_counter(n);
        i.map.insert(key.to_string(), enc);
        Ok(n)
    }

    fn cas_read(&self, key: &str) -> Result<(MemCas, Option<Vec<u8>>), KvError> {
        let i = self.op(|c| c.cas_read += 1)?;
        let seen = i.map.get(key).cloned();
        Ok((
            MemCas {
                key: key.to_string(),
                seen: seen.clone(),
            },
            seen,
        ))
    }

    fn cas_swap(&self, cas: MemCas, value: &[u8]) -> Result<Swap, KvError> {
        let mut i = self.op(|c| c.cas_swap += 1)?;
        let now = i.map.get(&cas.key).cloned();
        let unchanged = now == cas.seen;
        match self.backend {
            Backend::SpinSqlite if cas.seen.is_none() => {
                i.map.insert(cas.key, value.to_vec()); // upsert
                Ok(Swap::Reported)
            }
            Backend::Redis if !unchanged => {
                i.silent_aborts += 1;
                Ok(Swap::Reported) // WATCH aborted the EXEC, reported as Ok
            }
            Backend::RedisSpin36 => {
                if unchanged {
                    i.map.insert(cas.key, value.to_vec());
                } else {
                    i.silent_aborts += 1;
                }
                Ok(Swap::Failed) // the UNWATCH error, applied or not
            }
            _ if unchanged => {
                i.map.insert(cas.key, value.to_vec());
                Ok(Swap::Reported)
            }
            _ => Ok(Swap::Failed),
        }
    }
}

/// The world most tests start from: an in-memory store with one backend's
/// quirks, a deterministic clock, and the context over both (the one copy
/// of what tests used to build locally).
pub struct World {
    /// The store.
    pub kv: MemKv,
    /// The clock and randomness.
    pub env: TestEnv,
}

impl World {
    /// A store of `backend`, the clock at `now` seconds.
    pub fn new(backend: Backend, now: u64) -> World {
        World {
            kv: MemKv::new(backend),
            env: TestEnv::at(now),
        }
    }

    /// The context requests run in (swaps checked as the backend needs).
    pub fn ctx(&self) -> crate::kv::Ctx<'_, MemKv> {
        crate::kv::Ctx::auto(&self.kv, &self.env)
    }

    /// Runs route handler `h` (the API token `token`) on `method path`
    /// (a `?query` split off), with `authorization` and `body`.
    pub fn request(
        &self,
        (h, token): (RouteFn, &str),
        (method, path): (&str, &str),
        authorization: Option<&str>,
        body: &[u8],
    ) -> crate::http::api::ApiResponse {
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        let req = crate::http::api::ApiRequest {
            method,
            path,
            query,
            authorization,
            body,
            headers: &[],
        };
        h(&self.ctx(), token, &req)
    }
}

/// A route handler as [`World::request`] runs it: the context, the API
/// token, the request.
pub type RouteFn = for<'a> fn(
    &crate::kv::Ctx<'a, MemKv>,
    &str,
    &crate::http::api::ApiRequest<'_>,
) -> crate::http::api::ApiResponse;

/// Runs `component`'s entry through the dispatcher (which authenticates)
/// with `c`'s store and API token `t`: no Kubernetes, no outbound HTTP.
pub fn store_only(
    component: crate::routes::Component,
    c: &crate::kv::Ctx<'_, MemKv>,
    t: &str,
    r: &crate::http::api::ApiRequest<'_>,
) -> crate::http::api::ApiResponse {
    let http = ScriptedHttp::new(Vec::new());
    let services = crate::http::dispatch::Services::store_only(c, &http, t);
    crate::http::dispatch::dispatch(component, &services, r)
}

/// The `pools` component as a [`RouteFn`] ([`store_only`]).
pub fn pools(
    c: &crate::kv::Ctx<'_, MemKv>,
    t: &str,
    r: &crate::http::api::ApiRequest<'_>,
) -> crate::http::api::ApiResponse {
    store_only(crate::routes::Component::Pools, c, t, r)
}

/// The `allocate` component as a [`RouteFn`] ([`store_only`]).
pub fn allocate(
    c: &crate::kv::Ctx<'_, MemKv>,
    t: &str,
    r: &crate::http::api::ApiRequest<'_>,
) -> crate::http::api::ApiResponse {
    store_only(crate::routes::Component::Allocate, c, t, r)
}

/// The `release` component (claims' routes) as a [`RouteFn`]
/// ([`store_only`]).
pub fn claims(
    c: &crate::kv::Ctx<'_, MemKv>,
    t: &str,
    r: &crate::http::api::ApiRequest<'_>,
) -> crate::http::api::ApiResponse {
    store_only(crate::routes::Component::Release, c, t, r)
}

/// A stored pool of `object` (a [`crate::ipam::store::Loaded`] at
/// revision `rev`) whose first `bound` free values are
/// allocated at `now`, to claims `ns/m-0`, `ns/m-1`, ….
///
/// # Panics
/// When the object's spec is invalid or has fewer than `bound` values.
pub fn stored_pool(
    object: crate::ipam::pool::PoolObject,
    bound: usize,
    now: u64,
    rev: u64,
) -> crate::ipam::store::Loaded {
    let pool = object.spec.validate().expect("a valid pool");
    let mut state = crate::ipam::alloc::PoolState::default();
    for i in 0..bound {
        let name = format!("m-{i}");
        let claim = format!("ns/{name}");
        let req = crate::ipam::alloc::AllocRequest {
            claim: &claim,
            claim_name: &name,
            uid: "u",
            requested: None,
        };
        state.allocate(&pool, &req, now).expect("a free value");
    }
    crate::ipam::store::Loaded {
        object,
        pool,
        state,
        rev,
        exact: true,
    }
}

/// A deterministic [`Env`]: settable clock, counter-based randomness, no
/// real waiting (a sleep advances the clock and is recorded).
#[derive(Debug, Default)]
pub struct TestEnv {
    now_ms: AtomicU64,
    seq: AtomicU64,
    slept: Mutex<Vec<u64>>,
}

impl TestEnv {
    /// Clock at `now` seconds.
    pub fn at(now: u64) -> Self {
        TestEnv {
            now_ms: AtomicU64::new(now * 1000),
            ..TestEnv::default()
        }
    }

    /// Clock at `now` seconds, with a random stream of its own: every
    /// [`TestEnv`] otherwise yields the same tokens, so two "instances"
    /// sharing a store need different seeds (real ones are seeded by the
    /// host; the protocol relies on concurrent writers' tokens differing).
    pub fn seeded(now: u64, seed: u64) -> Self {
        TestEnv {
            now_ms: AtomicU64::new(now * 1000),
            seq: AtomicU64::new(seed << 32),
            ..TestEnv::default()
        }
    }

    /// Moves the clock.
    pub fn set_now(&self, now: u64) {
        self.now_ms.store(now * 1000, Ordering::SeqCst);
    }

    /// Every [`Env::sleep_ms`] so far, in milliseconds.
    pub fn slept_ms(&self) -> Vec<u64> {
        self.slept.lock().unwrap().clone()
    }
}

impl Env for TestEnv {
    fn now(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst) / 1000
    }

    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn sleep_ms(&self, ms: u64) {
        self.slept.lock().unwrap().push(ms);
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    fn random_u64(&self) -> u64 {
        // Distinct per call, like real randomness would be (with certainty).
        self.seq
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ 0x5bd1_e995
    }

    fn pause(&self, _attempt: u32) {
        std::thread::yield_now();
    }
}

/// One scripted answer of [`ScriptedHttp`].
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    failure: Option<TransportKind>,
}

impl Reply {
    /// A status with an empty body.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            failure: None,
        }
    }

    /// A JSON answer.
    pub fn json(status: u16, body: serde_json::Value) -> Reply {
        Reply::raw(status, body.to_string().as_bytes()).header("content-type", "application/json")
    }

    /// An answer with `body` as it is.
    pub fn raw(status: u16, body: &[u8]) -> Reply {
        Reply {
            body: body.to_vec(),
            ..Reply::status(status)
        }
    }

    /// No answer: the connection drops.
    pub fn dropped() -> Reply {
        Reply::failed(TransportKind::Dropped)
    }

    /// No answer, for this reason (a timeout, a TLS failure, …).
    pub fn failed(kind: TransportKind) -> Reply {
        Reply {
            failure: Some(kind),
            ..Reply::status(0)
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

/// A request [`ScriptedHttp`] received.
#[derive(Debug, Clone)]
pub struct Sent {
    /// Method.
    pub method: String,
    /// Full URI.
    pub uri: String,
    /// Headers, names lower case.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
    /// The request's deadline.
    pub deadline: Deadline,
}

impl Sent {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }

    /// The body as JSON (`null` when empty or not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// An [`HttpClient`] that expects requests in a fixed order and answers
/// each from a script: `("METHOD /path?query", reply)`, the path relative
/// to the URI's authority with any base path before the expected one
/// ignored. A request out of order or past the script's end panics, so a
/// test fails at the first unexpected call; so does a request without a
/// [`Deadline`] (every outbound call must be bounded in time).
#[derive(Debug)]
pub struct ScriptedHttp {
    script: Mutex<std::collections::VecDeque<(String, Reply)>>,
    sent: Mutex<Vec<Sent>>,
}

impl ScriptedHttp {
    /// A transport that will answer `script`, in order.
    pub fn new(script: Vec<(&str, Reply)>) -> Self {
        ScriptedHttp {
            script: Mutex::new(
                script
                    .into_iter()
                    .map(|(r, reply)| (r.to_string(), reply))
                    .collect(),
            ),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// Every request received, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// Panics unless every scripted request was made.
    pub fn assert_done(&self) {
        let left = self.script.lock().unwrap();
        assert!(
            left.is_empty(),
            "requests never made: {:?}",
            left.iter().map(|(r, _)| r).collect::<Vec<_>>()
        );
    }
}

impl HttpClient for ScriptedHttp {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        let uri = req.uri().to_string();
        let path_and_query = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let got = format!("{} {path_and_query}", req.method());
        assert!(
            Deadline::is_set(&req),
            "{got} was sent without a deadline: every outbound request is bounded"
        );
        self.sent.lock().unwrap().push(Sent {
            method: req.method().to_string(),
            uri,
            headers: req
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect(),
            body: req.body().clone(),
            deadline: Deadline::of(&req),
        });
        let (want, reply) = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| panic!("unexpected request past the script: {got}"));
        let (want_method, want_path) = want
            .split_once(' ')
            .expect("script entries are \"METHOD /path\"");
        assert!(
            got.starts_with(want_method) && path_and_query.ends_with(want_path),
            "expected {want}, got {got}"
        );
        if let Some(kind) = reply.failure {
            return Err(TransportError::new(kind, "scripted"));
        }
        let mut b = http::Response::builder().status(reply.status);
        for (n, v) in &reply.headers {
            b = b.header(n.as_str(), v.as_str());
        }
        Ok(b.body(reply.body).expect("a valid scripted response"))
    }
}
