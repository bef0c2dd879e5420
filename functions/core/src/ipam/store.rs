//! The IPAM repository: the pool record (spec plus allocation state, one
//! document so one compare-and-swap covers both) and the claim binding, as
//! stored, and the pool record's read and read-modify-write on the generic
//! protocol of [`crate::kv`] ([`read_pool`], [`update_pool`]). Their keys
//! are built by [`crate::kv::keys`] from a [`PoolId`] (which is
//! [`Scoped`]). Their JSON Schemas are in `kv-schema/`; a test checks golden
//! records against both.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::ip::RangeSet;
use crate::ipam::alloc::{Cooling, Holders, Intent, IntentKind, PoolState, Recent};
use crate::ipam::claim::{AddressView, CapiVersion, Claim, ClaimId, IpAddress, PoolRef};
use crate::ipam::pool::{PoolId, PoolKind, PoolObject, ValidatedPool};
use crate::kv::keys::{self, Scoped};
use crate::kv::protocol::{
    read_record, update_record, CasRecord, Content, Ctx, Decision, Envelope, Enveloped,
};
use crate::kv::records::{decode_versioned, writers_after, written_by, SwapCheck, RECORD_VERSION};
use crate::ports::kv::KvStore;

impl Scoped for PoolId {
    fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn scope(&self) -> &'static str {
        keys::SCOPES
            [usize::from(self.kind.is_prefix()) + 2 * usize::from(self.kind.is_in_cluster())]
    }
    fn from_parts(scope: &str, namespace: Option<&str>, name: &str) -> Option<Self> {
        let i = keys::SCOPES.iter().position(|s| *s == scope)?;
        let (prefix, in_cluster) = (i % 2 == 1, i >= 2);
        let family = if in_cluster {
            PoolKind::InCluster
        } else {
            PoolKind::Namespaced
        };
        let kind = family.with_shape(namespace.is_none(), prefix);
        Some(PoolId::of(kind, namespace.unwrap_or_default(), name))
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

/// An intent in the record (see [`crate::ipam::alloc::Intent`]).
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

/// Schema version of the pool record this build writes: 2, the record in
/// the generic envelope ([`Enveloped`]). Version 1 (the envelope's fields
/// and the content side by side, written by builds before) is still read
/// ([`PoolContent::legacy`]) and written back as version 2 by the next
/// write.
pub const POOL_VERSION: u32 = 2;

/// The content of a pool key: spec plus allocation state, one document so
/// a single compare-and-swap covers both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolContent {
    /// Tombstone: the pool was deleted (the key stays, see `kv::protocol`).
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
    /// Who holds the pool's values, as far as the record knows (the
    /// bindings not yet in the holder pages, and the pages); absent in a
    /// record written before the holder pages (read as not indexed). A
    /// tombstone keeps `pages` until they are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holders: Option<HoldersRecord>,
    /// Requests counted in this record's writes, by signature (see
    /// [`PoolState::counted`]); a tombstone keeps them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counted: BTreeMap<String, u64>,
}

/// The holder index's part in the pool record (see
/// [`crate::ipam::alloc::Holders`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HoldersRecord {
    /// Every binding of the pool is in its intents, `recent` or its pages.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub indexed: bool,
    /// The pool's incarnation: page entries of another are ignored.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub incarnation: String,
    /// Confirmed bindings not yet written to their pages, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<RecentRecord>,
    /// Page numbers that may hold entries, as decimal `n` or `a-b` ranges,
    /// ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pages: Vec<String>,
}

/// A binding confirmed but not yet in its page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecentRecord {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The address (a prefix pool's: the sub-prefix's network address).
    pub address: String,
    /// The claim's cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The holder order ([`crate::ipam::alloc::write_stamp`]).
    pub stamp: u64,
}

/// Page numbers as stored: `n` or `a-b`, decimal.
fn pages_to_entries(pages: &RangeSet) -> Vec<String> {
    pages
        .ranges()
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect()
}

fn pages_from_entries(entries: &[String]) -> Result<RangeSet> {
    let mut out = RangeSet::new();
    for e in entries {
        let bad = || Error::unreadable(format!("stored holder page range {e:?}"));
        let (a, b) = match e.split_once('-') {
            Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
            None => {
                let a = e.parse().map_err(|_| bad())?;
                (a, a)
            }
        };
        if a > b {
            return Err(bad());
        }
        out.insert_range(a, b);
    }
    Ok(out)
}

/// The value of a pool key: [`PoolContent`] in the generic envelope.
pub type PoolRecord = Enveloped<PoolContent>;

/// A version 1 pool record: the envelope's fields beside the content's.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PoolRecordV1 {
    v: u32,
    rev: u64,
    writer: String,
    #[serde(default)]
    recent_writers: Vec<String>,
    swap_check: SwapCheck,
    #[serde(default)]
    deleted: bool,
    #[serde(default)]
    pool: Option<Value>,
    #[serde(default)]
    used: Vec<String>,
    #[serde(default)]
    cooling: Vec<CoolingRecord>,
    #[serde(default)]
    intents: Vec<IntentRecord>,
    #[serde(default)]
    journal: Vec<JournalRecord>,
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

impl PoolContent {
    /// The pool and its state, or `None` for a tombstone; `rev` and `exact`
    /// are the envelope's.
    ///
    /// # Errors
    /// 500 if the stored object or state does not parse.
    pub fn load(&self, id: &PoolId, rev: u64, exact: bool) -> Result<Option<Loaded>> {
        let Some(obj) = self.pool.as_ref().filter(|_| !self.deleted) else {
            return Ok(None);
        };
        let invalid =
            |e: Error| Error::unreadable(format!("stored pool {} is invalid: {e}", id.display()));
        let object = PoolObject::parse(id, obj).map_err(invalid)?;
        let pool = object.spec.validate().map_err(invalid)?;
        let shift = pool.shift;
        Ok(Some(Loaded {
            object,
            pool,
            state: self.state(shift)?,
            rev,
            exact,
        }))
    }

    /// The allocation state it stores: entries are addresses (a prefix
    /// pool's, sub-prefix network addresses), values are shifted right by
    /// the pool's `shift` into its units.
    fn state(&self, shift: u8) -> Result<PoolState> {
        let mut state = PoolState {
            counted: self.counted.clone(),
            ..PoolState::default()
        };
        let stored_entry = |s: &str| stored_entry(s).map(|(a, b)| (a >> shift, b >> shift));
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
        if let Some(h) = &self.holders {
            state.holders.indexed = h.indexed;
            state.holders.incarnation.clone_from(&h.incarnation);
            state.holders.pages = pages_from_entries(&h.pages)?;
            for r in &h.recent {
                let (a, _) = stored_entry(&r.address)?;
                state.holders.recent.push(Recent {
                    claim: r.claim.clone(),
                    address: a,
                    cluster: r.cluster.clone(),
                    stamp: r.stamp,
                });
            }
        }
        Ok(state)
    }

    /// The holder pages a tombstone still lists (to be deleted), with the
    /// incarnation they belong to; none for a live record.
    ///
    /// # Errors
    /// 500 when the stored ranges do not parse.
    pub fn tombstone_pages(&self) -> Result<(String, RangeSet)> {
        match &self.holders {
            Some(h) if self.deleted || self.pool.is_none() => {
                Ok((h.incarnation.clone(), pages_from_entries(&h.pages)?))
            }
            _ => Ok((String::new(), RangeSet::new())),
        }
    }

    /// The content for `next` (see [`Next`]).
    pub fn build(next: &Next) -> PoolContent {
        let Some((object, vp)) = &next.pool else {
            return PoolContent::tombstone(next);
        };
        let fmt = |v: u128| vp.ip(v).to_string();
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
            .map(|i| IntentRecord::of(i, fmt(i.address)))
            .collect();
        PoolContent {
            deleted: false,
            pool: Some(object.to_json(None)),
            used,
            cooling,
            intents,
            journal: Vec::new(),
            holders: holders_record(&next.state.holders, &fmt),
            counted: next.state.counted.clone(),
        }
    }

    /// A deleted pool's record: its holder pages (to collect) and its
    /// counts, nothing else.
    fn tombstone(next: &Next) -> PoolContent {
        let h = &next.state.holders;
        let pages = &h.pages;
        PoolContent {
            deleted: true,
            pool: None,
            used: Vec::new(),
            cooling: Vec::new(),
            intents: Vec::new(),
            journal: Vec::new(),
            holders: (!pages.is_empty()).then(|| HoldersRecord {
                incarnation: h.incarnation.clone(),
                pages: pages_to_entries(pages),
                ..HoldersRecord::default()
            }),
            counted: next.state.counted.clone(),
        }
    }
}

impl IntentRecord {
    /// Intent `i` as stored, its value written as `address`.
    fn of(i: &Intent, address: String) -> IntentRecord {
        IntentRecord {
            kind: match i.kind {
                IntentKind::Bind => IntentKindRecord::Bind,
                IntentKind::Unbind => IntentKindRecord::Unbind,
            },
            claim: i.claim.clone(),
            uid: i.uid.clone(),
            address,
            token: i.token.clone(),
            owner: i.owner.clone(),
            at: i.at,
        }
    }
}

/// A live pool's holders as stored (`None` when there is nothing to say),
/// values written by `fmt`.
fn holders_record(h: &Holders, fmt: &dyn Fn(u128) -> String) -> Option<HoldersRecord> {
    (*h != Holders::default()).then(|| HoldersRecord {
        indexed: h.indexed,
        incarnation: h.incarnation.clone(),
        recent: h
            .recent
            .iter()
            .map(|r| RecentRecord {
                claim: r.claim.clone(),
                address: fmt(r.address),
                cluster: r.cluster.clone(),
                stamp: r.stamp,
            })
            .collect(),
        pages: pages_to_entries(&h.pages),
    })
}

impl Content for PoolContent {
    type Id = PoolId;
    type View = Loaded;
    type Next = Next;
    const VERSION: u32 = POOL_VERSION;
    const WHAT: &'static str = "pool record";

    fn key(id: &PoolId) -> String {
        keys::pool(id)
    }
    fn guard_key(id: &PoolId) -> String {
        keys::pool_init(id)
    }
    fn describe(id: &PoolId) -> String {
        format!("pool {}", id.display())
    }
    fn view(&self, id: &PoolId, e: &Envelope) -> Result<Option<Loaded>> {
        self.load(id, e.rev, e.swap_check == SwapCheck::Exact)
    }
    fn build(next: &Next) -> Self {
        PoolContent::build(next)
    }
    /// A version 1 record, moved into the envelope.
    fn legacy(bytes: &[u8]) -> Option<Result<PoolRecord>> {
        let old: PoolRecordV1 = serde_json::from_slice(bytes).ok()?;
        if old.v != RECORD_VERSION {
            return Some(Err(Error::unreadable(format!(
                "pool record has schema version {}, this build reads {RECORD_VERSION} and {POOL_VERSION}",
                old.v
            ))));
        }
        let e = Envelope {
            rev: old.rev,
            writer: old.writer,
            recent_writers: old.recent_writers,
            swap_check: old.swap_check,
        };
        let content = PoolContent {
            deleted: old.deleted,
            pool: old.pool,
            used: old.used,
            cooling: old.cooling,
            intents: old.intents,
            journal: old.journal,
            holders: None,
            counted: BTreeMap::new(),
        };
        Some(Ok(Enveloped::wrap(content, e)))
    }
}

impl PoolRecord {
    /// Decodes a record, version 2 or 1.
    ///
    /// # Errors
    /// 500 if the bytes are not a pool record this build reads (corruption
    /// or a newer writer).
    pub fn decode(bytes: &[u8]) -> Result<PoolRecord> {
        <PoolRecord as CasRecord>::decode(bytes)
    }

    /// Encodes the record as compact JSON (always version 2).
    pub fn encode(&self) -> Vec<u8> {
        <PoolRecord as CasRecord>::encode(self)
    }

    /// The pool and its state, or `None` for a tombstone.
    ///
    /// # Errors
    /// 500 if the stored object or state does not parse.
    pub fn load(&self, id: &PoolId) -> Result<Option<Loaded>> {
        self.state
            .load(id, self.rev, self.swap_check == SwapCheck::Exact)
    }

    /// Whether the write carrying `token` is this record or one of the
    /// [`crate::kv::RECENT_WRITERS`] before it.
    pub fn written_by(&self, token: &str) -> bool {
        written_by(&self.writer, &self.recent_writers, token)
    }

    /// The `recentWriters` of the record that replaces this one.
    pub fn writers_after(&self) -> Vec<String> {
        writers_after(&self.writer, &self.recent_writers)
    }

    /// Builds a record for `next` (see [`Next`]), with no recent writers.
    pub fn build(next: &Next, rev: u64, writer: String, swap_check: SwapCheck) -> PoolRecord {
        let e = Envelope {
            rev,
            writer,
            recent_writers: Vec::new(),
            swap_check,
        };
        Enveloped::wrap(PoolContent::build(next), e)
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

impl Next {
    /// The tombstone that replaces pool `l`: it keeps the list of `l`'s
    /// holder pages (and their incarnation), which the deletion then
    /// deletes, and the requests counted in the record.
    pub fn tombstone(l: &Loaded) -> Next {
        let mut state = PoolState {
            counted: l.state.counted.clone(),
            ..PoolState::default()
        };
        state.holders.pages = l.state.holders.pages.clone();
        state.holders.incarnation = l.state.holders.page_incarnation().to_string();
        Next { pool: None, state }
    }
}

/// The requests counted in pool `id`'s record, a tombstone's included
/// (one `get`): what a pool re-created over its tombstone goes on from,
/// and what the pool index folds in when the pool's entry goes. `None`
/// when the record is absent or does not load.
///
/// # Errors
/// Store failures (503).
pub fn read_counted<K: KvStore>(kv: &K, id: &PoolId) -> Result<Option<BTreeMap<String, u64>>> {
    match kv.get(&keys::pool(id))? {
        Some(b) if !crate::ports::kv::is_zero_counter(&b) => {
            Ok(PoolRecord::decode(&b).ok().map(|r| r.state.counted))
        }
        _ => Ok(None),
    }
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
        let kind = PoolKind::from_kind_name(&self.pool_ref.kind).ok_or_else(|| {
            Error::internal(format!(
                "claim record names pool kind {:?}",
                self.pool_ref.kind
            ))
        })?;
        Ok(PoolId::of(kind, namespace, &self.pool_ref.name))
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
    pub fn to_ip_address(&self, namespace: &str, name: &str) -> Result<IpAddress> {
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
        Ok(IpAddress::new(&AddressView {
            version,
            claim: &claim,
            pool_ref: &pool_ref,
            pool_uid: self.pool_uid.as_deref(),
            cluster_name: self.cluster_name.as_deref(),
            address: self.ip()?,
            prefix: self.prefix,
            gateway,
        }))
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

fn stored_entry(s: &str) -> Result<(u128, u128)> {
    crate::ipam::pool::parse_entry(s)
        .map(|(_, a, b)| (a, b))
        .map_err(|m| Error::unreadable(format!("stored address entry: {m}")))
}

/// Reads a pool record without starting a swap (one `get`).
///
/// # Errors
/// Store failures (503) and unreadable records (500).
pub fn read_pool<K: KvStore>(kv: &K, id: &PoolId) -> Result<Option<Loaded>> {
    read_record::<K, PoolRecord>(kv, id)
}

/// Replaces a pool record that does not load with what `build` decides
/// (the repair of [`crate::ipam::ops`]): the pool instance of
/// [`crate::kv::protocol::replace_unreadable`]; `None` when the record
/// loads (or is absent) by the time it is read.
///
/// # Errors
/// As [`crate::kv::protocol::replace_unreadable`].
pub fn replace_unreadable_pool<K: KvStore, T>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    swap_check: SwapCheck,
    build: impl FnMut() -> Result<(Next, T)>,
) -> Result<Option<T>> {
    crate::kv::protocol::replace_unreadable::<K, PoolRecord, T>(ctx, id, swap_check, build)
}

/// One read-modify-write of a pool record, retried on conflict: the pool
/// instance of [`update_record`].
///
/// # Errors
/// As [`update_record`].
///
/// # Idempotency
/// As `decide`: the protocol applies one decision exactly once.
pub fn update_pool<K: KvStore, T>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    decide: impl FnMut(Option<&Loaded>) -> Result<Decision<T, Next>>,
) -> Result<T> {
    update_record::<K, PoolRecord, T>(ctx, id, decide)
}

/// Schema version of a holder page.
pub const HOLDER_PAGE_VERSION: u32 = 1;

/// One holder page entry: who holds an address, and the holder order of
/// the binding ([`crate::ipam::alloc::write_stamp`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PageEntry {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The claim's cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The holder order: of two entries for one address, the higher is the
    /// later binding.
    pub stamp: u64,
}

/// Who holds the values of one page of one incarnation of a pool
/// (`holders/<pool key suffix>/<incarnation>/<page>`, [`keys::holders`]):
/// address → entry. Kept with the generic protocol
/// ([`crate::kv::update_record`]); written by the flush and the migration
/// of `ipam::holders`, read by the browser view and the reconcile. An entry
/// stays after its binding is released (readers only ask for held values)
/// until a later write of the page finds it stale.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HolderPage {
    /// Address (a prefix pool's: the sub-prefix's network address) → its
    /// holder.
    #[serde(default)]
    pub entries: std::collections::BTreeMap<String, PageEntry>,
}

/// A holder page as stored.
pub type HolderPageRecord = Enveloped<HolderPage>;

/// What names a holder page: the pool, its incarnation, the page number.
pub type PageId = (PoolId, String, u128);

impl crate::kv::StateRecord for HolderPage {
    type Id = PageId;
    const VERSION: u32 = HOLDER_PAGE_VERSION;
    const WHAT: &'static str = "holder page";
    fn key((id, inc, page): &PageId) -> String {
        keys::holders(id, inc, *page)
    }
    fn guard_key((id, inc, page): &PageId) -> String {
        keys::holders_init(id, inc, *page)
    }
    fn describe((id, _, page): &PageId) -> String {
        format!("holder page {page} of pool {}", id.display())
    }
}

/// Reads holder page `page` of pool `id`'s incarnation `inc` (one `get`).
///
/// # Errors
/// Store failures (503) and unreadable records (500).
pub fn read_page<K: KvStore>(
    kv: &K,
    id: &PoolId,
    inc: &str,
    page: u128,
) -> Result<Option<HolderPage>> {
    read_record::<K, HolderPageRecord>(kv, &(id.clone(), inc.to_string(), page))
}

/// Reads pool `id` (one `get`): the pool, or for a tombstone the holder
/// pages it still lists (to delete), with their incarnation.
///
/// # Errors
/// Store failures (503) and unreadable records (500).
pub fn read_pool_or_pages<K: KvStore>(
    kv: &K,
    id: &PoolId,
) -> Result<(Option<Loaded>, (String, RangeSet))> {
    let none = || (String::new(), RangeSet::new());
    let Some(bytes) = kv.get(&keys::pool(id))? else {
        return Ok((None, none()));
    };
    if crate::ports::kv::is_zero_counter(&bytes) {
        return Ok((None, none()));
    }
    let rec = PoolRecord::decode(&bytes)?;
    match rec.load(id)? {
        Some(l) => Ok((Some(l), none())),
        None => Ok((None, rec.state.tombstone_pages()?)),
    }
}
