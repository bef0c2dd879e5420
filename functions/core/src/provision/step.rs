//! The provisioning driver: [`provision`] brings a VRF-backed pool's
//! resources into existence, [`deprovision`] tears them down. Each round
//! reads the progress record, asks [`super::plan`] for the next action,
//! performs it (at most one write in the cloud, through
//! [`super::vrf_cloud::VrfCloud`]) and records the result by
//! compare-and-swap ([`super::transitions`]) before the next round, so an
//! instance may stop after any operation and another resumes where it
//! stopped.

use std::net::IpAddr;

use super::plan::{self, owner, Action, Decided, Owner, Progress, Teardown};
use super::record::{read_progress, read_state};
use super::target::Target;
use super::transitions::PoolRecord;
use super::vrf_cloud::VrfCloud;
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::Resource;
use crate::kv::Ctx;
use crate::ports::kv::KvStore;

/// Rounds one invocation runs at most before answering "in progress".
pub const MAX_ROUNDS: u32 = 12;

/// Seconds to wait before reading a gateway that is not active yet.
pub const GATEWAY_POLL_S: u64 = 5;

/// Where provisioning or teardown stands after an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProvisionPhase {
    /// Every resource exists and the gateway is active.
    Ready {
        /// The block: network address and prefix length.
        block: (IpAddr, u8),
    },
    /// Not done: call again after `retry_after_s` (another instance is
    /// creating something, or the gateway is not active yet, or the
    /// invocation used its rounds).
    InProgress {
        /// What it waits for.
        waiting: String,
        /// Seconds until the next attempt is worthwhile.
        retry_after_s: u64,
    },
    /// Every resource the pool held is deleted or released.
    Gone,
}

/// What an invocation did and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionReport {
    /// Where it stands.
    pub phase: ProvisionPhase,
    /// The resources held afterwards.
    pub progress: Progress,
    /// What it did, in order (`created vrf <id>`, …), for the log.
    pub done: Vec<String>,
}

/// What one invocation works with: the store and the cloud.
struct Driver<'a, 'k, K: KvStore, C: VrfCloud + ?Sized> {
    ctx: &'a Ctx<'k, K>,
    cloud: &'a C,
}

/// Where a round stands.
enum Round {
    /// Plan again.
    Again,
    /// Answer this.
    Stop(ProvisionPhase, Box<Progress>),
}

/// Whose record [`provision`] works on this round.
enum Turn {
    /// This incarnation's record (or a fresh one): plan on it.
    Plan(Box<Progress>),
    /// The record changed hands (marked for replacement, or an earlier
    /// incarnation's teardown moved on): read it again.
    Again,
    /// An earlier incarnation's teardown is in progress: answer this.
    Wait(ProvisionPhase),
}

/// Provisions the pool's resources, up to [`MAX_ROUNDS`] actions. The
/// record of an earlier incarnation of the pool (another uid) that was not
/// torn down is torn down first, by its own decisions.
///
/// # Idempotency
/// Any number of invocations, concurrent or after a crash between any two
/// operations, create each resource at most once (see [`super::plan`]);
/// once ready, an invocation reads the gateway and the reservation and
/// writes nothing.
///
/// # Errors
/// 422 naming the `spec.metal` field whose adopted resource is missing or
/// does not fit, or that changed where it can no longer be applied
/// (`MetalSpecChanged`); 409 `MetalTearingDown` once the pool's teardown
/// started, `MetalPoolDeleted` for an incarnation already torn down;
/// Metal's refusals (409 `MetalRefused`, …); 503 when Metal is unavailable
/// or a creation's outcome is unknown (the next invocation looks for it
/// before creating again); store errors.
pub fn provision<K: KvStore, C: VrfCloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    t: &Target<'_>,
) -> Result<ProvisionReport> {
    let d = Driver { ctx, cloud };
    let mut done = Vec::new();
    let mut indexed = false;
    for _ in 0..MAX_ROUNDS {
        let cur = read_state(ctx.kv, t.id)?;
        if cur.is_none() && !indexed {
            // In the pool index before its first record is written, so the
            // metrics see a VRF-backed pool while it is being provisioned.
            crate::ipam::index::list_metal(ctx, t.id)?;
            indexed = true;
        }
        let now = ctx.env.now();
        let progress = match d.whose(t, cur, &mut done)? {
            Turn::Plan(p) => *p,
            Turn::Again => continue,
            Turn::Wait(phase) => {
                return Ok(ProvisionReport {
                    phase,
                    progress: Progress::default(),
                    done,
                })
            }
        };
        if let Round::Stop(phase, progress) = d.act(t, progress, now, &mut done)? {
            return Ok(stopped(phase, progress, done));
        }
    }
    used_all_rounds(ctx, t.id, done)
}

/// Tears the pool's resources down, up to [`MAX_ROUNDS`] actions:
/// gateway, reservation, VLAN, VRF, by the decisions recorded when they were
/// created or adopted (not by the spec at teardown), the gateway gone before
/// its reservation, a VLAN to delete unassigned from the ports still
/// carrying it (`POST /ports/{id}/unassign`) before it is deleted. A live
/// creation intent is waited out (in progress, retry after the rest of its
/// lease), then its resource looked for by tag. A resource found absent
/// counts as deleted. The record ends as a tombstone that retires the
/// pool's uid: nothing is recorded for it again.
///
/// The caller checks first that no profile uses the pool's VLAN
/// (`capi::vrf`), and marks the teardown
/// ([`PoolRecord::begin_teardown`]) before it deletes the pool from the
/// store.
///
/// # Idempotency
/// Safe to repeat and to run concurrently: deleting what is already gone
/// counts as done, and each result is recorded by compare-and-swap. Once
/// everything is gone the record is a tombstone and invocations write
/// nothing.
///
/// # Errors
/// Metal's refusals (409 `MetalRefused`), 503 when Metal is unavailable,
/// store errors.
pub fn deprovision<K: KvStore, C: VrfCloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    t: &Target<'_>,
) -> Result<ProvisionReport> {
    let d = Driver { ctx, cloud };
    let uid = t.uid.as_deref();
    let mut done = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let cur = read_state(ctx.kv, t.id)?;
        let gone = |done: Vec<String>| -> Result<ProvisionReport> {
            // Torn down: the pool index need not list it for its Metal
            // resources any more (a failure here is repaired by the
            // reconcile's tidy).
            let _ = crate::ipam::index::unlist_metal(ctx, t.id);
            Ok(ProvisionReport {
                phase: ProvisionPhase::Gone,
                progress: Progress::default(),
                done,
            })
        };
        let record = PoolRecord::new(ctx, t.id, uid);
        let (p, retire) = match owner(cur.as_ref(), uid) {
            Owner::Retired => return gone(done),
            Owner::Free => {
                record.begin_teardown()?;
                continue;
            }
            Owner::Mine | Owner::Other(_)
                if !cur
                    .as_ref()
                    .is_some_and(|p| p.deleting && (p.uid.is_some() || uid.is_none())) =>
            {
                record.begin_teardown()?;
                continue;
            }
            Owner::Mine => (cur.unwrap_or_default(), uid.map(str::to_string)),
            Owner::Other(v) => (cur.unwrap_or_default(), Some(v)),
        };
        let mut retire: Vec<String> = retire.into_iter().collect();
        if let Some(u) = uid {
            if !retire.iter().any(|r| r == u) {
                retire.push(u.to_string());
            }
        }
        let of = t.with_uid(p.uid.as_deref());
        match d.teardown_round(&of, &p, &retire, &mut done)? {
            Round::Again => {}
            Round::Stop(ProvisionPhase::Gone, _) => return gone(done),
            Round::Stop(phase, progress) => return Ok(stopped(phase, progress, done)),
        }
    }
    used_all_rounds(ctx, t.id, done)
}

impl<'k, K: KvStore, C: VrfCloud + ?Sized> Driver<'_, 'k, K, C> {
    /// The record of `t`'s incarnation.
    fn record<'t>(&'t self, t: &'t Target<'_>) -> PoolRecord<'t, 'k, K> {
        PoolRecord::new(self.ctx, t.id, t.uid.as_deref())
    }

    /// Decides whose record `cur` is for `t`: an earlier incarnation's is
    /// marked for replacement, then torn down a round at a time, first.
    ///
    /// # Errors
    /// 409 `MetalPoolDeleted` for a retired uid, `MetalTearingDown` once
    /// this incarnation's teardown started; the teardown's errors.
    fn whose(&self, t: &Target<'_>, cur: Option<Progress>, done: &mut Vec<String>) -> Result<Turn> {
        let uid = t.uid.as_deref();
        match owner(cur.as_ref(), uid) {
            Owner::Retired => Err(Error::conflict(
                "MetalPoolDeleted",
                format!(
                    "pool {} (uid {}) was deleted and its Metal resources torn down",
                    t.id.display(),
                    uid.unwrap_or_default()
                ),
            )),
            Owner::Other(v) => {
                let p = cur.unwrap_or_default();
                if !p.deleting {
                    self.record(t).begin_replacing()?;
                    return Ok(Turn::Again);
                }
                let earlier = t.with_uid(Some(&v));
                match self.teardown_round(&earlier, &p, std::slice::from_ref(&v), done)? {
                    Round::Stop(ProvisionPhase::InProgress { waiting, retry_after_s }, _) => {
                        Ok(Turn::Wait(ProvisionPhase::InProgress {
                            waiting: format!(
                                "tearing down the Metal resources of an earlier pool of this name (uid {v}) first: {waiting}"
                            ),
                            retry_after_s,
                        }))
                    }
                    Round::Again | Round::Stop(..) => Ok(Turn::Again),
                }
            }
            Owner::Mine if cur.as_ref().is_some_and(|p| p.deleting) => Err(Error::conflict(
                "MetalTearingDown",
                "the pool's Metal resources are being torn down",
            )),
            Owner::Mine => Ok(Turn::Plan(Box::new(cur.unwrap_or_default()))),
            Owner::Free => Ok(Turn::Plan(Box::default())),
        }
    }

    /// One provisioning action on `progress`, as [`plan::next`] decides at
    /// `now`.
    ///
    /// # Errors
    /// As [`provision`].
    fn act(
        &self,
        t: &Target<'_>,
        progress: Progress,
        now: u64,
        done: &mut Vec<String>,
    ) -> Result<Round> {
        let waiting = |waiting: String, retry_after_s| ProvisionPhase::InProgress {
            waiting,
            retry_after_s,
        };
        match plan::next(t.spec, &progress, now) {
            Action::Refuse { field, message } => {
                return Err(
                    Error::new(ErrorKind::Invalid, "MetalSpecChanged", message).with_field(field)
                );
            }
            Action::Adopt(r) => {
                let id = self.cloud.adopt(t, &progress, r)?;
                let decided = Decided::of(t.spec, r);
                if self.record(t).record_adopted(r, &id, &decided)? {
                    done.push(format!("adopted {} {id}", r.field()));
                }
            }
            Action::Create(r) => self.create_once(t, &progress, r, now, done)?,
            Action::FindCreated(r) => match self.settle_intent(t, &progress, r)? {
                Some((id, true)) => done.push(format!("found {} {id}", r.field())),
                Some((id, false)) => done.push(format!(
                    "deleted {} {id}: another is recorded, or the pool is gone",
                    r.field()
                )),
                None => done.push(format!("no {} was created; creating", r.field())),
            },
            Action::WaitForOther(r, s) => {
                let phase = waiting(format!("another instance is creating the {}", r.field()), s);
                return Ok(Round::Stop(phase, Box::new(progress)));
            }
            Action::AwaitGateway => {
                let gw = progress
                    .gateway
                    .as_ref()
                    .map(|g| g.id.clone())
                    .unwrap_or_default();
                let state = self.cloud.gateway_state(&gw)?;
                self.record(t).record_gateway(&gw, state.clone())?;
                if state.as_deref() != Some("active") && state.is_some() {
                    let phase = waiting(
                        format!("the Metal Gateway is {}", state.unwrap_or_default()),
                        GATEWAY_POLL_S,
                    );
                    return Ok(Round::Stop(phase, Box::new(read_progress(self.ctx, t.id)?)));
                }
            }
            Action::Ready => {
                let block = self.cloud.block(t, &progress)?;
                return Ok(Round::Stop(
                    ProvisionPhase::Ready { block },
                    Box::new(progress),
                ));
            }
        }
        Ok(Round::Again)
    }

    /// Creates `r` under an intent claimed at `now` (none claimed: someone
    /// else moved first, plan again). A creation whose outcome is unknown
    /// is looked for at once; otherwise the intent is left to its lease
    /// (the request may land late). A refusal withdraws the intent.
    ///
    /// # Errors
    /// The cloud's errors (503 for an unknown outcome); store errors.
    fn create_once(
        &self,
        t: &Target<'_>,
        progress: &Progress,
        r: Resource,
        now: u64,
        done: &mut Vec<String>,
    ) -> Result<()> {
        let me = self.ctx.env.token();
        let decided = Decided::of(t.spec, r);
        let record = self.record(t);
        if !record.claim_intent(r, &me, now, &decided)? {
            return Ok(());
        }
        match self.cloud.create(t, progress, r) {
            Ok(id) => self.keep_or_delete(t, r, &id, &decided, "created", done),
            Err(e) if e.outcome_unknown => match self.cloud.find_created(t, progress, r)? {
                Some(id) => self.keep_or_delete(t, r, &id, &decided, "found", done),
                None => Err(e.error),
            },
            Err(e) => {
                // Refused or rate limited: nothing was created.
                record.withdraw_intent(r, &me)?;
                Err(e.error)
            }
        }
    }

    /// Settles an intent whose lease ran out on `t`'s record `p`: `r`
    /// looked for by tag ([`VrfCloud::find_created`]) and recorded with the
    /// intent's decisions (or deleted when the record refuses it:
    /// `Some((id, false))`), or, when none was made, the intent withdrawn
    /// (`None`).
    ///
    /// # Errors
    /// The cloud's and the store's.
    fn settle_intent(
        &self,
        t: &Target<'_>,
        p: &Progress,
        r: Resource,
    ) -> Result<Option<(String, bool)>> {
        let intent = p.intent.clone();
        let decided = intent
            .as_ref()
            .and_then(|i| i.decided.clone())
            .unwrap_or_else(|| Decided::of(t.spec, r));
        let record = self.record(t);
        match self.cloud.find_created(t, p, r)? {
            Some(id) => {
                let kept = record.record_created(r, &id, &decided)?;
                if !kept {
                    self.cloud.delete(t, r, &id)?;
                }
                Ok(Some((id, kept)))
            }
            None => {
                let token = intent.map(|i| i.token).unwrap_or_default();
                record.withdraw_intent(r, &token)?;
                Ok(None)
            }
        }
    }

    /// Records `id`, just created (or found) for `r`; when the record
    /// refuses it (the pool is gone, or another is recorded), deletes it: a
    /// duplicate, or a resource for a pool that no longer exists.
    fn keep_or_delete(
        &self,
        t: &Target<'_>,
        r: Resource,
        id: &str,
        decided: &Decided,
        how: &str,
        done: &mut Vec<String>,
    ) -> Result<()> {
        if self.record(t).record_created(r, id, decided)? {
            done.push(format!("{how} {} {id}", r.field()));
        } else {
            self.cloud.delete(t, r, id)?;
            done.push(format!(
                "deleted {} {id}: another is recorded, or the pool is gone",
                r.field()
            ));
        }
        Ok(())
    }

    /// One teardown action on `p`, the record being torn down (its uid is
    /// `t`'s), ending with the tombstone retiring `retire`.
    fn teardown_round(
        &self,
        t: &Target<'_>,
        p: &Progress,
        retire: &[String],
        done: &mut Vec<String>,
    ) -> Result<Round> {
        let record = PoolRecord::new(self.ctx, t.id, p.uid.as_deref());
        match plan::teardown(t.spec, p, self.ctx.env.now()) {
            Teardown::WaitForCreation(r, s) => {
                return Ok(Round::Stop(
                    ProvisionPhase::InProgress {
                        waiting: format!(
                            "another instance is creating the {}: it is torn down once recorded",
                            r.field()
                        ),
                        retry_after_s: s,
                    },
                    Box::new(p.clone()),
                ))
            }
            Teardown::FindCreated(r) => {
                // A duplicate (the record moved on: another instance
                // finished) is nobody's and deleted; found either way.
                match self.settle_intent(t, p, r)? {
                    Some((id, _)) => done.push(format!("found {} {id}", r.field())),
                    None => done.push(format!("no {} was created", r.field())),
                }
            }
            Teardown::Delete(r) => return self.delete_held(t, p, r, done),
            Teardown::Release {
                resource: r,
                kept_for,
            } => {
                let id = p.held_id(r)?;
                record.record_released(r, &id)?;
                done.push(match kept_for {
                    Some(k) => format!(
                        "kept {} {id}: the retained {} uses it",
                        r.field(),
                        k.field()
                    ),
                    None => format!("kept {} {id}", r.field()),
                });
            }
            Teardown::AwaitGatewayGone => return self.gateway_gone(t, p, done),
            Teardown::Done => {
                if record.finish_teardown(retire)? {
                    return Ok(Round::Stop(ProvisionPhase::Gone, Box::default()));
                }
            }
        }
        Ok(Round::Again)
    }

    /// Deletes `r` as recorded on `p` (`t`'s record), and records it gone
    /// (already gone, 404, counts as deleted). A VLAN still on ports is
    /// unassigned from them first (Metal refuses to delete it; its teardown
    /// order), and deleted in the next round; a port gone meanwhile counts
    /// as unassigned.
    ///
    /// # Errors
    /// The cloud's and the store's.
    fn delete_held(
        &self,
        t: &Target<'_>,
        p: &Progress,
        r: Resource,
        done: &mut Vec<String>,
    ) -> Result<Round> {
        let id = p.held_id(r)?;
        if r == Resource::Vlan {
            let ports = self.cloud.vlan_ports(t, &id)?;
            if !ports.is_empty() {
                for port in &ports {
                    self.cloud.unassign_port(t, port, &id)?;
                    done.push(format!("unassigned vlan {id} from port {port}"));
                }
                return Ok(Round::Again);
            }
        }
        self.cloud.delete(t, r, &id)?;
        PoolRecord::new(self.ctx, t.id, p.uid.as_deref()).record_deleted(r, &id)?;
        done.push(format!("deleted {} {id}", r.field()));
        Ok(Round::Again)
    }

    /// Waits for the deleted gateway on `p` (`t`'s record) to be gone, then
    /// records it released.
    ///
    /// # Errors
    /// The cloud's and the store's.
    fn gateway_gone(&self, t: &Target<'_>, p: &Progress, done: &mut Vec<String>) -> Result<Round> {
        let id = p.held_id(Resource::Gateway)?;
        if !self.cloud.gateway_gone(&id)? {
            return Ok(Round::Stop(
                ProvisionPhase::InProgress {
                    waiting: "the Metal Gateway is being deleted".into(),
                    retry_after_s: GATEWAY_POLL_S,
                },
                Box::new(p.clone()),
            ));
        }
        let record = PoolRecord::new(self.ctx, t.id, p.uid.as_deref());
        record.record_released(Resource::Gateway, &id)?;
        done.push(format!("gateway {id} is gone"));
        Ok(Round::Again)
    }
}

/// The report of an invocation that stopped at `phase` on `progress`.
fn stopped(phase: ProvisionPhase, progress: Box<Progress>, done: Vec<String>) -> ProvisionReport {
    ProvisionReport {
        phase,
        progress: *progress,
        done,
    }
}

/// The report of an invocation that used its [`MAX_ROUNDS`]: call again.
fn used_all_rounds<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    done: Vec<String>,
) -> Result<ProvisionReport> {
    Ok(ProvisionReport {
        phase: ProvisionPhase::InProgress {
            waiting: "more steps".into(),
            retry_after_s: 1,
        },
        progress: read_progress(ctx, id)?,
        done,
    })
}
