//! The progress record of a VRF-backed pool: which pool incarnation it
//! belongs to, which Metal resources it holds and what was decided for
//! them, the creation in progress, the gateway's last state. One record per
//! pool name under `metal/pool/…`, kept with the compare-and-swap protocol
//! of [`crate::kv::protocol`] (creation guard, writer tokens, read-back, a
//! tombstone instead of a delete), so two instances never both record a
//! creation intent. Its tombstone is content, not absence: it names the
//! retired uids, for which nothing is recorded again (see
//! [`super::plan::owner`]).
//!
//! Schema version 3 ([`PROGRESS_VERSION`]) is the record in the generic
//! envelope ([`Enveloped`]: the content under `state`). Version 2 (the
//! uid, the retired uids and the decisions beside the envelope's fields)
//! and version 1 (without uid and decisions) are still read, and written
//! back as version 3 by the next write.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::plan::{Decided, Held, Intent, Progress};
use crate::error::{Error, Result};
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::Resource;
use crate::kv::keys;
use crate::kv::protocol::{read_record, Content, Envelope, Enveloped};
use crate::kv::records::SwapCheck;
use crate::kv::Ctx;
use crate::ports::kv::KvStore;

/// Schema version of the progress record this build writes.
pub const PROGRESS_VERSION: u32 = 3;

/// The earlier versions this build still reads (envelope and content side
/// by side).
pub const PROGRESS_VERSIONS_READ: [u32; 2] = [1, 2];

/// A held resource, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldRecord {
    /// Metal UUID.
    pub id: String,
    /// Created by metal-ipam.
    pub created: bool,
    /// Deleted at teardown (decided when created or adopted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete: Option<bool>,
    /// The `spec.metal` section (with the metro) it was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
}

/// A creation intent, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntentRecord {
    /// `vrf`, `reservation`, `vlan` or `gateway`.
    pub resource: String,
    /// The creating instance's token.
    pub token: String,
    /// Unix seconds when it was recorded.
    pub at: u64,
    /// Deleted at teardown, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete: Option<bool>,
    /// The `spec.metal` section (with the metro) it is created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
}

/// The content of a `metal/pool/…` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProgressContent {
    /// The pool incarnation (object uid) the record belongs to; on a
    /// tombstone, the one whose teardown wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Tombstone: everything was torn down.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// Incarnations whose teardown is complete, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<String>,
    /// The VRF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<HeldRecord>,
    /// The reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<HeldRecord>,
    /// The VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<HeldRecord>,
    /// The gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<HeldRecord>,
    /// The gateway's last observed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_state: Option<String>,
    /// The creation in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<IntentRecord>,
    /// Teardown has started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

/// The value of a `metal/pool/…` key: [`ProgressContent`] in the generic
/// envelope.
pub type ProgressRecord = Enveloped<ProgressContent>;

/// A version 1 or 2 record: the envelope's fields beside the content's.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProgressRecordV2 {
    v: u32,
    rev: u64,
    writer: String,
    #[serde(default)]
    recent_writers: Vec<String>,
    swap_check: SwapCheck,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    deleted: bool,
    #[serde(default)]
    retired: Vec<String>,
    #[serde(default)]
    vrf: Option<HeldRecord>,
    #[serde(default)]
    reservation: Option<HeldRecord>,
    #[serde(default)]
    vlan: Option<HeldRecord>,
    #[serde(default)]
    gateway: Option<HeldRecord>,
    #[serde(default)]
    gateway_state: Option<String>,
    #[serde(default)]
    intent: Option<IntentRecord>,
    #[serde(default)]
    deleting: bool,
}

impl ProgressRecordV2 {
    /// Moved into the envelope.
    fn migrate(self) -> ProgressRecord {
        let e = Envelope {
            rev: self.rev,
            writer: self.writer,
            recent_writers: self.recent_writers,
            swap_check: self.swap_check,
        };
        let content = ProgressContent {
            uid: self.uid,
            deleted: self.deleted,
            retired: self.retired,
            vrf: self.vrf,
            reservation: self.reservation,
            vlan: self.vlan,
            gateway: self.gateway,
            gateway_state: self.gateway_state,
            intent: self.intent,
            deleting: self.deleting,
        };
        Enveloped::wrap(content, e)
    }
}

fn resource_of(name: &str) -> Result<Resource> {
    Resource::ALL
        .into_iter()
        .find(|r| r.field() == name)
        .ok_or_else(|| Error::internal(format!("progress record names resource {name:?}")))
}

fn decided_in(delete: Option<bool>, spec: &Option<Value>) -> Option<Decided> {
    match (delete, spec) {
        (Some(delete), Some(spec)) => Some(Decided {
            delete,
            spec: spec.clone(),
        }),
        _ => None,
    }
}

fn held_in(h: &Option<HeldRecord>) -> Option<Held> {
    h.as_ref().map(|h| Held {
        id: h.id.clone(),
        created: h.created,
        decided: decided_in(h.delete, &h.spec),
    })
}

fn held_out(h: &Option<Held>) -> Option<HeldRecord> {
    h.as_ref().map(|h| HeldRecord {
        id: h.id.clone(),
        created: h.created,
        delete: h.decided.as_ref().map(|d| d.delete),
        spec: h.decided.as_ref().map(|d| d.spec.clone()),
    })
}

impl ProgressContent {
    /// The progress it holds (a tombstone included).
    ///
    /// # Errors
    /// 500 for an intent naming an unknown resource.
    pub fn progress(&self) -> Result<Progress> {
        Ok(Progress {
            uid: self.uid.clone(),
            vrf: held_in(&self.vrf),
            reservation: held_in(&self.reservation),
            vlan: held_in(&self.vlan),
            gateway: held_in(&self.gateway),
            gateway_state: self.gateway_state.clone(),
            intent: match &self.intent {
                None => None,
                Some(i) => Some(Intent {
                    resource: resource_of(&i.resource)?,
                    token: i.token.clone(),
                    at: i.at,
                    decided: decided_in(i.delete, &i.spec),
                }),
            },
            deleting: self.deleting,
            deleted: self.deleted,
            retired: self.retired.clone(),
        })
    }
}

impl ProgressRecord {
    /// The progress it holds (a tombstone included).
    ///
    /// # Errors
    /// As [`ProgressContent::progress`].
    pub fn progress(&self) -> Result<Progress> {
        self.state.progress()
    }
}

impl Content for ProgressContent {
    type Id = PoolId;
    /// The whole record, a tombstone included (`deleted`): a decision must
    /// see whose tombstone it is.
    type View = Progress;
    /// What to write; `deleted` writes a tombstone (its uid and the retired
    /// uids only).
    type Next = Progress;
    const VERSION: u32 = PROGRESS_VERSION;
    const WHAT: &'static str = "Metal progress record";

    fn key(id: &PoolId) -> String {
        keys::metal_pool(id)
    }
    fn guard_key(id: &PoolId) -> String {
        keys::metal_pool_init(id)
    }
    fn describe(id: &PoolId) -> String {
        format!("the Metal resources of pool {}", id.display())
    }
    fn view(&self, _id: &PoolId, _: &Envelope) -> Result<Option<Progress>> {
        self.progress().map(Some)
    }
    fn build(next: &Progress) -> Self {
        let mut rec = ProgressContent {
            uid: next.uid.clone(),
            deleted: next.deleted,
            retired: next.retired.clone(),
            vrf: None,
            reservation: None,
            vlan: None,
            gateway: None,
            gateway_state: None,
            intent: None,
            deleting: false,
        };
        if !next.deleted {
            rec.vrf = held_out(&next.vrf);
            rec.reservation = held_out(&next.reservation);
            rec.vlan = held_out(&next.vlan);
            rec.gateway = held_out(&next.gateway);
            rec.gateway_state = next.gateway_state.clone();
            rec.intent = next.intent.as_ref().map(|i| IntentRecord {
                resource: i.resource.field().to_string(),
                token: i.token.clone(),
                at: i.at,
                delete: i.decided.as_ref().map(|d| d.delete),
                spec: i.decided.as_ref().map(|d| d.spec.clone()),
            });
            rec.deleting = next.deleting;
        }
        rec
    }
    /// A version 1 or 2 record, moved into the envelope.
    fn legacy(bytes: &[u8]) -> Option<Result<ProgressRecord>> {
        let old: ProgressRecordV2 = serde_json::from_slice(bytes).ok()?;
        if !PROGRESS_VERSIONS_READ.contains(&old.v) {
            return Some(Err(Error::internal(format!(
                "Metal progress record has schema version {}, this build reads 1 to {PROGRESS_VERSION}",
                old.v
            ))));
        }
        Some(Ok(old.migrate()))
    }
}

/// The record of pool `id` as stored, a tombstone included (one `get`).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn read_state<K: KvStore>(kv: &K, id: &PoolId) -> Result<Option<Progress>> {
    read_record::<K, ProgressRecord>(kv, id)
}

/// The recorded progress of pool `id` (empty when none, or a tombstone).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn read_progress<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId) -> Result<Progress> {
    Ok(read_state(ctx.kv, id)?
        .filter(|p| !p.deleted)
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::protocol::{update_record, CasRecord, Decision};

    use crate::testing::{Backend, MemKv, TestEnv};
    use serde_json::json;

    fn progress() -> Progress {
        Progress {
            uid: Some("u-1".into()),
            vrf: Some(Held {
                id: "v".into(),
                created: true,
                decided: Some(Decided {
                    delete: true,
                    spec: json!({"metro": "da", "ipRanges": ["10.0.0.0/16"]}),
                }),
            }),
            gateway_state: Some("ready".into()),
            intent: Some(Intent {
                resource: Resource::Reservation,
                token: "t1".into(),
                at: 7,
                decided: Some(Decided {
                    delete: false,
                    spec: json!({"metro": "da", "network": "10.0.1.0", "cidr": 29}),
                }),
            }),
            retired: vec!["u-0".into()],
            ..Progress::default()
        }
    }

    fn envelope() -> Envelope {
        Envelope {
            rev: 3,
            writer: "w".into(),
            recent_writers: vec!["a".into()],
            swap_check: SwapCheck::Verify,
        }
    }

    #[test]
    fn a_record_round_trips_and_a_tombstone_keeps_only_whose_it_is() {
        let rec = ProgressRecord::build(&progress(), envelope());
        let back = ProgressRecord::decode(&rec.encode()).unwrap();
        assert_eq!(back, rec);
        let id = PoolId::namespaced("ns", "p");
        assert_eq!(back.view(&id).unwrap(), Some(progress()));
        let gone = progress().tombstone(&["u-1".into()]);
        let rec = ProgressRecord::build(&gone, envelope());
        let read = ProgressRecord::decode(&rec.encode())
            .unwrap()
            .view(&id)
            .unwrap()
            .unwrap();
        assert_eq!(
            read,
            Progress {
                uid: Some("u-1".into()),
                deleted: true,
                retired: vec!["u-0".into(), "u-1".into()],
                ..Progress::default()
            }
        );
        let mut newer = serde_json::to_value(&rec).unwrap();
        newer["v"] = (PROGRESS_VERSION + 1).into();
        assert!(ProgressRecord::decode(newer.to_string().as_bytes()).is_err());
    }

    #[test]
    fn a_version_1_record_reads_without_uid_or_decisions() {
        let v1 = json!({"v": 1, "rev": 2, "writer": "w", "swapCheck": "exact",
            "vrf": {"id": "v", "created": true}, "deleting": true});
        let rec = ProgressRecord::decode(v1.to_string().as_bytes()).unwrap();
        let p = rec.progress().unwrap();
        assert_eq!(p.uid, None);
        assert_eq!(p.vrf.unwrap().decided, None);
        assert!(p.deleting);
        // Written back as version 2.
        let again = ProgressRecord::build(&rec.progress().unwrap(), rec.envelope());
        assert_eq!(again.v, PROGRESS_VERSION);
    }

    #[test]
    fn retired_uids_are_bounded_oldest_dropped_first() {
        let mut p = Progress::default();
        for i in 0..(crate::provision::plan::MAX_RETIRED + 3) {
            p = p.tombstone(&[format!("u{i}")]);
        }
        assert_eq!(p.retired.len(), crate::provision::plan::MAX_RETIRED);
        assert_eq!(p.retired[0], "u3");
        assert_eq!(p.uid.as_deref(), p.retired.last().map(String::as_str));
    }

    #[test]
    fn only_one_of_two_racing_intents_is_recorded_on_every_backend() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(100);
            let ctx = Ctx::auto(&kv, &env);
            let id = PoolId::namespaced("ns", "p");
            // Each "instance" records its intent unless one is recorded.
            let claim = |me: &str| {
                update_record::<_, ProgressRecord, bool>(&ctx, &id, |cur| {
                    let p = cur.cloned().unwrap_or_default();
                    if p.intent.is_some() {
                        return Ok(Decision::Done(false));
                    }
                    let mut next = p;
                    next.intent = Some(Intent {
                        resource: Resource::Vrf,
                        token: me.into(),
                        at: 100,
                        decided: None,
                    });
                    Ok(Decision::Write(Box::new(next), true))
                })
                .unwrap()
            };
            assert!(claim("a"), "{backend:?}");
            assert!(!claim("b"), "{backend:?}");
            let stored = kv.get(&keys::metal_pool(&id)).unwrap().unwrap();
            let p = ProgressRecord::decode(&stored).unwrap().progress().unwrap();
            assert_eq!(p.intent.unwrap().token, "a", "{backend:?}");
        }
    }
}
