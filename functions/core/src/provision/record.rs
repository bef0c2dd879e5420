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
//! Schema version 2 ([`PROGRESS_VERSION`]) added the uid, the retired
//! uids and the decisions; a version 1 record (written by builds before)
//! is read as one with no uid and no decisions, and written back as
//! version 2 by the next write.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::plan::{Decided, Held, Intent, Progress};
use crate::error::{Error, Result};
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::Resource;
use crate::kv::keys;
use crate::kv::protocol::{CasRecord, Envelope};
use crate::kv::records::SwapCheck;

/// Schema version of the progress record this build writes.
pub const PROGRESS_VERSION: u32 = 2;

/// The earlier version this build still reads.
pub const PROGRESS_VERSION_READ: u32 = 1;

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

/// The value of a `metal/pool/…` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProgressRecord {
    /// Schema version, [`PROGRESS_VERSION`] (or 1 when read).
    pub v: u32,
    /// Incremented by every write.
    pub rev: u64,
    /// Random token of the last writer.
    pub writer: String,
    /// Tokens of the writers before it, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_writers: Vec<String>,
    /// Whether swaps on this record are read back.
    pub swap_check: SwapCheck,
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

impl ProgressRecord {
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

impl CasRecord for ProgressRecord {
    type Id = PoolId;
    /// The whole record, a tombstone included (`deleted`): a decision must
    /// see whose tombstone it is.
    type View = Progress;
    /// What to write; `deleted` writes a tombstone (its uid and the retired
    /// uids only).
    type Next = Progress;

    fn key(id: &PoolId) -> String {
        keys::metal_pool(id)
    }
    fn guard_key(id: &PoolId) -> String {
        keys::metal_pool_init(id)
    }
    fn describe(id: &PoolId) -> String {
        format!("the Metal resources of pool {}", id.display())
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        let rec: ProgressRecord = serde_json::from_slice(bytes)
            .map_err(|e| Error::internal(format!("unreadable Metal progress record: {e}")))?;
        if rec.v != PROGRESS_VERSION && rec.v != PROGRESS_VERSION_READ {
            return Err(Error::internal(format!(
                "Metal progress record has schema version {}, this build reads {PROGRESS_VERSION_READ} and {PROGRESS_VERSION}",
                rec.v
            )));
        }
        Ok(rec)
    }
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
    fn envelope(&self) -> Envelope {
        Envelope {
            rev: self.rev,
            writer: self.writer.clone(),
            recent_writers: self.recent_writers.clone(),
            swap_check: self.swap_check,
        }
    }
    fn view(&self, _id: &PoolId) -> Result<Option<Progress>> {
        self.progress().map(Some)
    }
    fn build(next: &Progress, e: Envelope) -> Self {
        let mut rec = ProgressRecord {
            v: PROGRESS_VERSION,
            rev: e.rev,
            writer: e.writer,
            recent_writers: e.recent_writers,
            swap_check: e.swap_check,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::protocol::{update_record, Step};
    use crate::kv::{Ctx, SwapPolicy};
    use crate::ports::kv::KvStore;
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
        newer["v"] = 3.into();
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
            let ctx = Ctx {
                kv: &kv,
                env: &env,
                swap_policy: SwapPolicy::Auto,
            };
            let id = PoolId::namespaced("ns", "p");
            // Each "instance" records its intent unless one is recorded.
            let claim = |me: &str| {
                update_record::<_, ProgressRecord, bool>(&ctx, &id, |cur| {
                    let p = cur.cloned().unwrap_or_default();
                    if p.intent.is_some() {
                        return Ok(Step::Done(false));
                    }
                    let mut next = p;
                    next.intent = Some(Intent {
                        resource: Resource::Vrf,
                        token: me.into(),
                        at: 100,
                        decided: None,
                    });
                    Ok(Step::Write(Box::new(next), true))
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
