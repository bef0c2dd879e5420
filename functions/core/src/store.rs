//! Key layout, stored records and the compare-and-swap protocol.
//!
//! The full description, with the invariants and the reasoning about each
//! backend's quirks, is `kv-schema/README.md`; this module is its code.
//!
//! # Keys
//! | Key | Value | Written by |
//! |---|---|---|
//! | `pool/ns/<namespace>/<name>` | [`PoolRecord`] (or, for an instant while a pool is first created, a zero counter) | pools, allocate, release |
//! | `pool/global/<name>` | [`PoolRecord`] | pools, allocate, release |
//! | `pool-init/ns/<namespace>/<name>`, `pool-init/global/<name>` | counter (creation guard) | pools |
//! | `claim/<namespace>/<name>` | [`ClaimRecord`] | the owner of the pool's intent for it: allocate (set), release (delete) |
//!
//! # Protocol
//! Every change to a pool — registration, update, deletion, allocation,
//! release — is one read-modify-write of its record with
//! [`KvStore::cas_read`] / [`KvStore::cas_swap`], retried on conflict. The
//! claim-key writes a decision owes are intents in the record
//! ([`crate::alloc::Intent`], [`crate::steps`]). Two rules make the swap
//! exact on Spin's real backends:
//! 1. **Never swap on an absent key** (Spin's SQLite backend upserts it, so
//!    two creators would both "win"). A pool key is first brought into
//!    existence with `increment(key, 0)` by the one request that won the
//!    creation guard counter; the swap then replaces that zero counter.
//!    Pool keys are never deleted afterwards (deletion leaves a tombstone
//!    record), so every later swap is on an existing key.
//! 2. **Read back whenever the backend's answer cannot be trusted.** Each
//!    written record carries a fresh random `writer` token and the 31
//!    before it, so a read-back tells a landed swap (its token is there,
//!    possibly under newer writes) from an aborted one, whatever the
//!    backend reported (Redis may report an abort as success; Spin 3.6's
//!    Redis backend reports every swap as failed). The zero counter's
//!    encoding tells the backends apart at creation: eight zero bytes is
//!    Spin's SQLite store, whose swaps are exact, so its records are marked
//!    `swapCheck: exact` and skip the read-back; anything else is marked
//!    `verify`. The `kv_swap_check = "always"` variable forces the read-back.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::addr::{from_u128, to_u128};
use crate::alloc::{Cooling, Intent, IntentKind, PoolState};
use crate::claim::{AddressView, CapiVersion, Claim, ClaimId, PoolRef};
use crate::error::{Error, Result};
use crate::kv::{self, KvStore, Swap};
use crate::pool::{PoolId, PoolKind, PoolObject, ValidatedPool};

/// Current version of every record's schema (`"v"`).
pub const RECORD_VERSION: u32 = 1;

/// How many times a read-modify-write is attempted before giving up with a
/// 503 (`Contention`).
pub const MAX_CAS_ATTEMPTS: u32 = 64;

/// How many earlier writers' tokens a pool record keeps besides its own
/// (`recentWriters`). A read-back that finds the reader's token among them
/// knows its swap landed and was overwritten since, rather than aborted.
pub const RECENT_WRITERS: usize = 31;

/// Key builders and parsers.
pub mod keys {
    use crate::pool::{PoolId, PoolKind};

    /// Prefix of every pool record key.
    pub const POOL_PREFIX: &str = "pool/";
    /// Prefix of every claim binding key.
    pub const CLAIM_PREFIX: &str = "claim/";
    /// Prefix of every pool creation guard key.
    pub const POOL_INIT_PREFIX: &str = "pool-init/";

    fn pool_suffix(id: &PoolId) -> String {
        match &id.namespace {
            Some(ns) => format!("ns/{ns}/{}", id.name),
            None => format!("global/{}", id.name),
        }
    }

    /// `pool/ns/<namespace>/<name>` or `pool/global/<name>`.
    ///
    /// # Examples
    /// ```
    /// use metal_ipam_core::{pool::PoolId, store::keys};
    /// assert_eq!(keys::pool(&PoolId::namespaced("a", "b")), "pool/ns/a/b");
    /// assert_eq!(keys::pool(&PoolId::global("g")), "pool/global/g");
    /// assert_eq!(keys::parse_pool("pool/ns/a/b"), Some(PoolId::namespaced("a", "b")));
    /// ```
    pub fn pool(id: &PoolId) -> String {
        format!("{POOL_PREFIX}{}", pool_suffix(id))
    }

    /// The creation guard counter of a pool.
    pub fn pool_init(id: &PoolId) -> String {
        format!("{POOL_INIT_PREFIX}{}", pool_suffix(id))
    }

    /// `claim/<namespace>/<name>`.
    pub fn claim(namespace: &str, name: &str) -> String {
        format!("{CLAIM_PREFIX}{namespace}/{name}")
    }

    /// The pool a pool record key belongs to.
    pub fn parse_pool(key: &str) -> Option<PoolId> {
        let rest = key.strip_prefix(POOL_PREFIX)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["ns", ns, name] => Some(PoolId {
                kind: PoolKind::Namespaced,
                namespace: Some(ns.to_string()),
                name: name.to_string(),
            }),
            ["global", name] => Some(PoolId {
                kind: PoolKind::Global,
                namespace: None,
                name: name.to_string(),
            }),
            _ => None,
        }
    }
}

/// Whether swaps on a pool record are read back (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SwapCheck {
    /// The backend's swaps are exact (Spin's SQLite store).
    Exact,
    /// Read back after every reported swap.
    Verify,
}

/// The operator's choice (`kv_swap_check` variable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapPolicy {
    /// Read back unless the record says the backend's swaps are exact.
    Auto,
    /// Always read back.
    Always,
}

impl SwapPolicy {
    /// Parses the variable: `auto` or `always`.
    ///
    /// # Errors
    /// 500 naming the bad value (a deployment mistake, not a client error).
    pub fn parse(s: &str) -> Result<SwapPolicy> {
        match s.trim() {
            "" | "auto" => Ok(SwapPolicy::Auto),
            "always" => Ok(SwapPolicy::Always),
            other => Err(Error::internal(format!(
                "variable kv_swap_check is {other:?}; expected \"auto\" or \"always\""
            ))),
        }
    }
}

/// A released address in the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoolingRecord {
    /// The address.
    pub address: String,
    /// Unix seconds from which it is free.
    pub until: u64,
}

/// A journal entry of a record written by an earlier version (read and
/// ignored: intents replaced the journal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalRecord {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// Its uid.
    pub uid: String,
    /// The address it got.
    pub address: String,
    /// Unix seconds of the allocation.
    pub at: u64,
}

/// What an intent owes the claim key, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IntentKindRecord {
    /// Write the binding.
    Bind,
    /// Remove the binding.
    Unbind,
}

/// An intent in the record (see [`crate::alloc::Intent`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntentRecord {
    /// Bind or unbind.
    pub kind: IntentKindRecord,
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The claim's uid.
    pub uid: String,
    /// The address.
    pub address: String,
    /// The binding's token.
    pub token: String,
    /// Writer token of the request that owes the write.
    pub owner: String,
    /// Unix seconds when the owner took it.
    pub at: u64,
}

/// The value of a pool key: spec plus allocation state, one document so a
/// single compare-and-swap covers both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolRecord {
    /// Schema version, [`RECORD_VERSION`].
    pub v: u32,
    /// Incremented by every write.
    pub rev: u64,
    /// Random token of the last writer (detects silently aborted swaps).
    pub writer: String,
    /// Tokens of the writers before it, newest last, at most
    /// [`RECENT_WRITERS`]: a read-back finding its token here knows its
    /// swap landed (and a newer one came after) rather than aborted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_writers: Vec<String>,
    /// Whether swaps on this record are read back.
    pub swap_check: SwapCheck,
    /// Tombstone: the pool was deleted (the key stays, see the module docs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The pool object (apiVersion, kind, metadata, spec); absent in a tombstone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Value>,
    /// Addresses bound or cooling down, as `a` or `a-b` entries, ascending.
    #[serde(default)]
    pub used: Vec<String>,
    /// Released addresses in their grace period.
    #[serde(default)]
    pub cooling: Vec<CoolingRecord>,
    /// Claim-key writes still owed, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intents: Vec<IntentRecord>,
    /// Written by versions before intents; read and ignored.
    #[serde(default, skip_serializing)]
    pub journal: Vec<JournalRecord>,
}

/// Decodes a JSON record and checks its schema version.
fn decode_versioned<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
    version: impl Fn(&T) -> u32,
) -> Result<T> {
    let rec: T = serde_json::from_slice(bytes)
        .map_err(|e| Error::internal(format!("unreadable {what} record: {e}")))?;
    let v = version(&rec);
    if v != RECORD_VERSION {
        return Err(Error::internal(format!(
            "{what} record has schema version {v}, this build reads {RECORD_VERSION}"
        )));
    }
    Ok(rec)
}

/// A pool as loaded from its record.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The registered object.
    pub object: PoolObject,
    /// Its validated spec.
    pub pool: ValidatedPool,
    /// Allocation state.
    pub state: PoolState,
    /// Revision of the record.
    pub rev: u64,
    /// Whether the backend's swaps are exact (Spin's SQLite store, detected
    /// when the pool was created). Only there is `get_many` used: Spin
    /// 3.6's Redis backend sends it as a `KEYS` command, which fails.
    pub exact: bool,
}

impl PoolRecord {
    /// Decodes a record.
    ///
    /// # Errors
    /// 500 if the bytes are not a version-1 record (corruption or a newer
    /// writer).
    pub fn decode(bytes: &[u8]) -> Result<PoolRecord> {
        decode_versioned(bytes, "pool", |r: &PoolRecord| r.v)
    }

    /// Encodes the record as compact JSON.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The pool and its state, or `None` for a tombstone.
    ///
    /// # Errors
    /// 500 if the stored object or state does not parse.
    pub fn load(&self, id: &PoolId) -> Result<Option<Loaded>> {
        let Some(obj) = self.pool.as_ref().filter(|_| !self.deleted) else {
            return Ok(None);
        };
        let object = PoolObject::parse(id, obj).map_err(|e| {
            Error::internal(format!("stored pool {} is invalid: {e}", id.display()))
        })?;
        let pool = object.spec.validate().map_err(|e| {
            Error::internal(format!("stored pool {} is invalid: {e}", id.display()))
        })?;
        let mut state = PoolState::default();
        for u in &self.used {
            let (a, b) = stored_entry(u)?;
            state.used.insert_range(a, b);
        }
        for c in &self.cooling {
            let (a, _) = stored_entry(&c.address)?;
            state.cooling.push(Cooling {
                address: a,
                until: c.until,
            });
        }
        for i in &self.intents {
            let (a, _) = stored_entry(&i.address)?;
            state.intents.push(Intent {
                kind: match i.kind {
                    IntentKindRecord::Bind => IntentKind::Bind,
                    IntentKindRecord::Unbind => IntentKind::Unbind,
                },
                claim: i.claim.clone(),
                uid: i.uid.clone(),
                address: a,
                token: i.token.clone(),
                owner: i.owner.clone(),
                at: i.at,
            });
        }
        Ok(Some(Loaded {
            object,
            pool,
            state,
            rev: self.rev,
            exact: self.swap_check == SwapCheck::Exact,
        }))
    }

    /// Whether the write carrying `token` is this record or one of the
    /// [`RECENT_WRITERS`] before it.
    pub fn written_by(&self, token: &str) -> bool {
        self.writer == token || self.recent_writers.iter().any(|w| w == token)
    }

    /// The `recentWriters` of the record that replaces this one.
    pub fn writers_after(&self) -> Vec<String> {
        let mut w = self.recent_writers.clone();
        w.push(self.writer.clone());
        let excess = w.len().saturating_sub(RECENT_WRITERS);
        w.drain(..excess);
        w
    }

    /// Builds a record for `next` (see [`Next`]).
    pub fn build(next: &Next, rev: u64, writer: String, swap_check: SwapCheck) -> PoolRecord {
        let (pool, used, cooling, intents) = match &next.pool {
            None => (None, Vec::new(), Vec::new(), Vec::new()),
            Some((object, vp)) => {
                let fam = vp.family;
                let fmt = |v: u128| from_u128(fam, v).to_string();
                let used = next
                    .state
                    .used
                    .ranges()
                    .iter()
                    .map(|&(a, b)| {
                        if a == b {
                            fmt(a)
                        } else {
                            format!("{}-{}", fmt(a), fmt(b))
                        }
                    })
                    .collect();
                let cooling = next
                    .state
                    .cooling
                    .iter()
                    .map(|c| CoolingRecord {
                        address: fmt(c.address),
                        until: c.until,
                    })
                    .collect();
                let intents = next
                    .state
                    .intents
                    .iter()
                    .map(|i| IntentRecord {
                        kind: match i.kind {
                            IntentKind::Bind => IntentKindRecord::Bind,
                            IntentKind::Unbind => IntentKindRecord::Unbind,
                        },
                        claim: i.claim.clone(),
                        uid: i.uid.clone(),
                        address: fmt(i.address),
                        token: i.token.clone(),
                        owner: i.owner.clone(),
                        at: i.at,
                    })
                    .collect();
                (Some(object.to_json(None)), used, cooling, intents)
            }
        };
        PoolRecord {
            v: RECORD_VERSION,
            rev,
            writer,
            recent_writers: Vec::new(),
            swap_check,
            deleted: pool.is_none(),
            pool,
            used,
            cooling,
            intents,
            journal: Vec::new(),
        }
    }
}

/// The state a read-modify-write wants to write.
#[derive(Debug, Clone)]
pub struct Next {
    /// The pool (object and its validated spec), or `None` for a tombstone.
    pub pool: Option<(PoolObject, ValidatedPool)>,
    /// Allocation state (ignored for a tombstone).
    pub state: PoolState,
}

/// What a read-modify-write callback decided.
#[derive(Debug)]
pub enum Step<T> {
    /// Nothing to write; return `T`.
    Done(T),
    /// Write `Next`, then return `T`.
    Write(Box<Next>, T),
}

/// The value of a claim key: the binding of a claim to an address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimRecord {
    /// Schema version, [`RECORD_VERSION`].
    pub v: u32,
    /// The claim's uid.
    pub uid: String,
    /// The claim's apiVersion (the IPAddress is rendered in it).
    pub api_version: String,
    /// The claim's `spec.poolRef`, verbatim.
    pub pool_ref: PoolRefRecord,
    /// The bound address.
    pub address: String,
    /// Prefix length handed out.
    pub prefix: u8,
    /// Gateway handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The claim's cluster name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// The pool's uid, when it came from Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_uid: Option<String>,
    /// The allocation's token, matching the pool's intent for it (empty in
    /// bindings written before intents).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
}

/// `spec.poolRef` in a [`ClaimRecord`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolRefRecord {
    /// apiGroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// kind.
    pub kind: String,
    /// name.
    pub name: String,
}

impl From<&PoolRef> for PoolRefRecord {
    fn from(p: &PoolRef) -> Self {
        PoolRefRecord {
            api_group: p.api_group.clone(),
            kind: p.kind.clone(),
            name: p.name.clone(),
        }
    }
}

impl PoolRefRecord {
    /// Back to the API type.
    pub fn to_pool_ref(&self) -> PoolRef {
        PoolRef {
            api_group: self.api_group.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
        }
    }
}

impl ClaimRecord {
    /// Decodes a record.
    ///
    /// # Errors
    /// 500 if the bytes are not a version-1 claim record.
    pub fn decode(bytes: &[u8]) -> Result<ClaimRecord> {
        decode_versioned(bytes, "claim", |r: &ClaimRecord| r.v)
    }

    /// Encodes as compact JSON.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The pool this binding is in; `namespace` is the claim's.
    ///
    /// # Errors
    /// 500 if the stored kind is not one of ours.
    pub fn pool_id(&self, namespace: &str) -> Result<PoolId> {
        match PoolKind::from_kind_name(&self.pool_ref.kind) {
            Some(PoolKind::Namespaced) => Ok(PoolId::namespaced(namespace, &self.pool_ref.name)),
            Some(PoolKind::Global) => Ok(PoolId::global(&self.pool_ref.name)),
            None => Err(Error::internal(format!(
                "claim record names pool kind {:?}",
                self.pool_ref.kind
            ))),
        }
    }

    /// The bound address.
    ///
    /// # Errors
    /// 500 if the stored address does not parse.
    pub fn ip(&self) -> Result<IpAddr> {
        self.address
            .parse()
            .map_err(|_| Error::internal(format!("claim record address {:?}", self.address)))
    }

    /// Renders the IPAddress object of this binding.
    ///
    /// # Errors
    /// 500 if the record is inconsistent.
    pub fn to_ip_address(&self, namespace: &str, name: &str) -> Result<Value> {
        let version = CapiVersion::parse(&self.api_version).ok_or_else(|| {
            Error::internal(format!("claim record apiVersion {:?}", self.api_version))
        })?;
        let claim = ClaimId {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: self.uid.clone(),
        };
        let pool_ref = self.pool_ref.to_pool_ref();
        let gateway = match &self.gateway {
            Some(g) => Some(
                g.parse()
                    .map_err(|_| Error::internal(format!("claim record gateway {g:?}")))?,
            ),
            None => None,
        };
        Ok(AddressView {
            version,
            claim: &claim,
            pool_ref: &pool_ref,
            pool_uid: self.pool_uid.as_deref(),
            cluster_name: self.cluster_name.as_deref(),
            address: self.ip()?,
            prefix: self.prefix,
            gateway,
        }
        .to_json())
    }

    /// The binding of `claim` to `address` in `pool`, for the allocation
    /// identified by `token`.
    pub fn new(
        claim: &Claim,
        address: IpAddr,
        pool: &ValidatedPool,
        pool_uid: Option<&str>,
        token: &str,
    ) -> Self {
        ClaimRecord {
            v: RECORD_VERSION,
            uid: claim.id.uid.clone(),
            api_version: claim.version.api_version().to_string(),
            pool_ref: (&claim.pool_ref).into(),
            address: address.to_string(),
            prefix: pool.prefix,
            gateway: pool.gateway.map(|g| g.to_string()),
            cluster_name: claim.cluster_name.clone(),
            pool_uid: pool_uid.map(str::to_string),
            token: token.to_string(),
        }
    }
}

/// Time, randomness and waiting, supplied by the shell.
pub trait Env {
    /// Unix time in seconds.
    fn now(&self) -> u64;
    /// A random 64-bit value (writer tokens, jitter).
    fn random_u64(&self) -> u64;
    /// Waits a little before retry `attempt` (≥ 1) of a contended update.
    fn pause(&self, attempt: u32);
}

/// Everything a step needs: the store, the environment and the swap policy.
pub struct Ctx<'a, K: KvStore> {
    /// The key-value store.
    pub kv: &'a K,
    /// Time, randomness, waiting.
    pub env: &'a dyn Env,
    /// The `kv_swap_check` policy.
    pub swap_policy: SwapPolicy,
}

enum Base {
    Absent,
    Placeholder(SwapCheck),
    Record {
        rev: u64,
        swap_check: SwapCheck,
        writers: Vec<String>,
    },
}

/// Reads a pool record without starting a swap (one `get`).
///
/// # Errors
/// Store failures (503) and unreadable records (500).
pub fn read_pool<K: KvStore>(kv: &K, id: &PoolId) -> Result<Option<Loaded>> {
    match kv.get(&keys::pool(id))? {
        None => Ok(None),
        Some(b) if kv::is_zero_counter(&b) => Ok(None),
        Some(b) => PoolRecord::decode(&b)?.load(id),
    }
}

/// One read-modify-write of a pool record, retried on conflict.
///
/// `decide` sees the current pool (`None` if absent or deleted) and returns
/// [`Step::Done`] (nothing to write) or [`Step::Write`]. It runs after the
/// pool has been read for this attempt and before the swap, so anything it
/// reads from the store is at least as recent as the pool it sees. It may be
/// called several times (once per attempt); it may read but must not write.
///
/// # Guarantees
/// When this returns `Ok` after a `Write`, the written record is the pool's
/// current record as of the swap: no concurrent writer's change was lost.
///
/// # Errors
/// Whatever `decide` returns; 503 `Contention` after
/// [`MAX_CAS_ATTEMPTS`]; store failures.
pub fn update_pool<K: KvStore, T>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    mut decide: impl FnMut(Option<&Loaded>) -> Result<Step<T>>,
) -> Result<T> {
    let key = keys::pool(id);
    for attempt in 0..MAX_CAS_ATTEMPTS {
        if attempt > 0 {
            ctx.env.pause(attempt);
        }
        let (cas, current) = ctx.kv.cas_read(&key)?;
        let (base, loaded) = match current.as_deref() {
            None => (Base::Absent, None),
            Some(b) if kv::is_zero_counter(b) => {
                let check = if b.len() == 8 {
                    SwapCheck::Exact
                } else {
                    SwapCheck::Verify
                };
                (Base::Placeholder(check), None)
            }
            Some(b) => {
                let rec = PoolRecord::decode(b)?;
                let loaded = rec.load(id)?;
                (
                    Base::Record {
                        rev: rec.rev,
                        swap_check: rec.swap_check,
                        writers: rec.writers_after(),
                    },
                    loaded,
                )
            }
        };
        let (next, out) = match decide(loaded.as_ref())? {
            Step::Done(out) => return Ok(out),
            Step::Write(next, out) => (next, out),
        };
        let (rev, check, writers) = match base {
            Base::Absent => {
                ensure_pool_key(ctx, id, &key)?;
                continue;
            }
            Base::Placeholder(check) => (1, check, Vec::new()),
            Base::Record {
                rev,
                swap_check,
                writers,
            } => (rev + 1, swap_check, writers),
        };
        let check = match ctx.swap_policy {
            SwapPolicy::Always => SwapCheck::Verify,
            SwapPolicy::Auto => check,
        };
        let writer = format!("{:016x}", ctx.env.random_u64());
        let mut record = PoolRecord::build(&next, rev, writer.clone(), check);
        record.recent_writers = writers;
        let bytes = record.encode();
        let reported = ctx.kv.cas_swap(cas, &bytes)?;
        let written = match (check, reported) {
            (SwapCheck::Exact, Swap::Reported) => true,
            (SwapCheck::Exact, Swap::Failed) => false,
            // A store whose answer cannot be trusted either way: Redis may
            // report an aborted swap as success, and Spin 3.6's Redis
            // backend reports every swap as failed (its `UNWATCH <key>` is
            // refused after the EXEC). The read-back decides.
            (SwapCheck::Verify, _) => landed(ctx.kv.get(&key)?.as_deref(), &writer)?,
        };
        if written {
            return Ok(out);
        }
    }
    Err(Error::transient(
        "Contention",
        format!(
            "pool {} is being changed by too many requests at once; retry",
            id.display()
        ),
    ))
}

/// Whether a read-back shows the write of `writer`: the record it wrote, or
/// a newer one that still lists it among its recent writers. Anything else
/// means the swap was silently aborted (Redis) and nothing was written.
fn landed(read: Option<&[u8]>, writer: &str) -> Result<bool> {
    match read {
        Some(b) if !kv::is_zero_counter(b) => Ok(PoolRecord::decode(b)?.written_by(writer)),
        _ => Ok(false),
    }
}

/// Brings an absent pool key into existence as a zero counter, so the
/// following swap is on an existing key.
///
/// Only the winner of the creation guard (the request whose
/// `increment(pool-init-key, 1)` returned 1) ever increments the pool key:
/// a later `increment` could meet a record that the winner has swapped in
/// meanwhile, which Spin's SQLite host answers with a panic. A loser
/// returns and its caller re-reads after a pause, until the winner's key
/// shows up (or answers 503 `Contention` after [`MAX_CAS_ATTEMPTS`]).
fn ensure_pool_key<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId, key: &str) -> Result<()> {
    if ctx.kv.increment(&keys::pool_init(id), 1)? != 1 {
        return Ok(());
    }
    ctx.kv.increment(key, 0)?;
    Ok(())
}

fn stored_entry(s: &str) -> Result<(u128, u128)> {
    crate::pool::parse_entry(s)
        .map(|(_, a, b)| (a, b))
        .map_err(|m| Error::internal(format!("stored address entry: {m}")))
}

/// Converts `ip` for `pool`, or `None` when the family differs.
pub fn addr_in_family(pool: &ValidatedPool, ip: IpAddr) -> Option<u128> {
    (crate::addr::Family::of(ip) == pool.family).then(|| to_u128(ip))
}
