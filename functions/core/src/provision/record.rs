//! The progress record of a VRF-backed pool: which Metal resources it
//! holds, the creation in progress, the gateway's last state. One record per
//! pool under `metal/pool/…`, kept with the compare-and-swap protocol of
//! [`crate::kv::protocol`] (creation guard, writer tokens, read-back, a
//! tombstone instead of a delete), so two instances never both record a
//! creation intent.

use serde::{Deserialize, Serialize};

use super::plan::{Held, Intent, Progress};
use crate::error::{Error, Result};
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::Resource;
use crate::kv::keys;
use crate::kv::protocol::{CasRecord, Envelope};
use crate::kv::records::SwapCheck;

/// Schema version of the progress record.
pub const PROGRESS_VERSION: u32 = 1;

/// A held resource, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldRecord {
    /// Metal UUID.
    pub id: String,
    /// Created by metal-ipam.
    pub created: bool,
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
}

/// The value of a `metal/pool/…` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProgressRecord {
    /// Schema version, [`PROGRESS_VERSION`].
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
    /// Tombstone: everything was torn down.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
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

fn held_in(h: &Option<HeldRecord>) -> Option<Held> {
    h.as_ref().map(|h| Held {
        id: h.id.clone(),
        created: h.created,
    })
}

fn held_out(h: &Option<Held>) -> Option<HeldRecord> {
    h.as_ref().map(|h| HeldRecord {
        id: h.id.clone(),
        created: h.created,
    })
}

impl ProgressRecord {
    /// The progress it holds.
    ///
    /// # Errors
    /// 500 for an intent naming an unknown resource.
    pub fn progress(&self) -> Result<Progress> {
        Ok(Progress {
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
                }),
            },
            deleting: self.deleting,
        })
    }
}

/// What a decision asks to write: the new progress, or `None` for the
/// tombstone.
pub type NextProgress = Option<Progress>;

impl CasRecord for ProgressRecord {
    type Id = PoolId;
    type View = Progress;
    type Next = NextProgress;

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
        if rec.v != PROGRESS_VERSION {
            return Err(Error::internal(format!(
                "Metal progress record has schema version {}, this build reads {PROGRESS_VERSION}",
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
        if self.deleted {
            return Ok(None);
        }
        self.progress().map(Some)
    }
    fn build(next: &NextProgress, e: Envelope) -> Self {
        let mut rec = ProgressRecord {
            v: PROGRESS_VERSION,
            rev: e.rev,
            writer: e.writer,
            recent_writers: e.recent_writers,
            swap_check: e.swap_check,
            deleted: next.is_none(),
            vrf: None,
            reservation: None,
            vlan: None,
            gateway: None,
            gateway_state: None,
            intent: None,
            deleting: false,
        };
        if let Some(p) = next {
            rec.vrf = held_out(&p.vrf);
            rec.reservation = held_out(&p.reservation);
            rec.vlan = held_out(&p.vlan);
            rec.gateway = held_out(&p.gateway);
            rec.gateway_state = p.gateway_state.clone();
            rec.intent = p.intent.as_ref().map(|i| IntentRecord {
                resource: i.resource.field().to_string(),
                token: i.token.clone(),
                at: i.at,
            });
            rec.deleting = p.deleting;
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

    fn progress() -> Progress {
        Progress {
            vrf: Some(Held {
                id: "v".into(),
                created: true,
            }),
            gateway_state: Some("ready".into()),
            intent: Some(Intent {
                resource: Resource::Reservation,
                token: "t1".into(),
                at: 7,
            }),
            ..Progress::default()
        }
    }

    #[test]
    fn a_record_round_trips_and_a_tombstone_reads_as_absent() {
        let e = Envelope {
            rev: 3,
            writer: "w".into(),
            recent_writers: vec!["a".into()],
            swap_check: SwapCheck::Verify,
        };
        let rec = ProgressRecord::build(&Some(progress()), e.clone());
        let back = ProgressRecord::decode(&rec.encode()).unwrap();
        assert_eq!(back, rec);
        let id = PoolId::namespaced("ns", "p");
        assert_eq!(back.view(&id).unwrap(), Some(progress()));
        let gone = ProgressRecord::build(&None, e);
        assert_eq!(
            ProgressRecord::decode(&gone.encode())
                .unwrap()
                .view(&id)
                .unwrap(),
            None
        );
        let mut newer = serde_json::to_value(&rec).unwrap();
        newer["v"] = 2.into();
        assert!(ProgressRecord::decode(newer.to_string().as_bytes()).is_err());
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
                    });
                    Ok(Step::Write(Box::new(Some(next)), true))
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
