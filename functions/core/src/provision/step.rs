//! Runs the plan against Metal and the store: [`provision`] brings a
//! VRF-backed pool's resources into existence, [`deprovision`] tears them
//! down. Each round reads the progress record, asks [`super::plan`] for
//! the next action, performs it (at most one Metal write) and records the
//! result by compare-and-swap before the next round, so an instance may
//! stop after any operation and another resumes where it stopped.
//!
//! Created resources carry the pool's tag (a gateway, which has no tags,
//! is found by its reservation): that is how a creation whose answer was
//! lost is found instead of repeated.
//!
//! Every store decision is one compare-and-swap on the progress record
//! that first checks whose the record is ([`super::plan::owner`]): no write
//! for an incarnation lands on its tombstone or on another incarnation's
//! record. The decisions are public for the interleaving checker
//! (`functions/core/tests/interleavings_provision.rs`), which runs them as
//! [`provision`] and [`deprovision`] do.

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::plan::{self, owner, Action, Decided, Held, Intent, Owner, Progress, Teardown};
use super::record::ProgressRecord;
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::{MetalSpec, Resource};
use crate::kv::protocol::{read_record, update_record, Step};
use crate::kv::Ctx;
use crate::metal::client::{Metal, MetalError};
use crate::metal::model::{
    IpAddress, VirtualNetworkCreateInput, VrfCreateInput, VrfIpReservationCreateInput,
    VrfMetalGatewayCreateInput,
};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::ports::Env;

/// Rounds one invocation runs at most before answering "in progress".
pub const MAX_ROUNDS: u32 = 12;

/// Seconds to wait before reading a gateway that is not active yet.
pub const GATEWAY_POLL_S: u64 = 5;

/// The pool whose resources are provisioned.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// The pool.
    pub id: &'a PoolId,
    /// Its `spec.metal`.
    pub spec: &'a MetalSpec,
    /// The pool's uid, when it came from Kubernetes.
    pub uid: Option<String>,
    /// The pool's cluster (its `cluster.x-k8s.io/cluster-name` label).
    pub cluster: Option<String>,
}

impl<'a> Target<'a> {
    /// The target for pool `id` (uid and cluster when known).
    pub fn new(
        id: &'a PoolId,
        spec: &'a MetalSpec,
        uid: Option<&str>,
        cluster: Option<&str>,
    ) -> Target<'a> {
        Target {
            id,
            spec,
            uid: uid.map(str::to_string),
            cluster: cluster.map(str::to_string),
        }
    }

    /// The same pool as incarnation `uid` (whose resources carry its tag):
    /// the target of an earlier incarnation's teardown.
    pub fn with_uid(&self, uid: Option<&str>) -> Target<'a> {
        Target {
            uid: uid.map(str::to_string),
            ..self.clone()
        }
    }

    /// The tag that identifies the pool's resources ([`tag_for`]).
    pub fn tag(&self) -> String {
        tag_for(self.id, self.uid.as_deref())
    }

    /// Every tag a created resource carries: the identifying one, the
    /// pool's kind, namespace and name for people, and its cluster.
    pub fn tags(&self) -> Vec<String> {
        let mut tags = vec![
            self.tag(),
            format!(
                "metal-ipam.dev/pool-name={}/{}",
                self.id.kind.kind_name(),
                self.id.display()
            ),
        ];
        if let Some(c) = &self.cluster {
            tags.push(format!("cluster.x-k8s.io/cluster-name={c}"));
        }
        tags
    }

    /// The customdata of a created reservation: the pool (kind, namespace,
    /// name, uid) and its cluster, under `metal-ipam.dev`.
    pub fn customdata(&self) -> Map<String, Value> {
        let mut pool = Map::new();
        pool.insert("kind".into(), self.id.kind.kind_name().into());
        if let Some(ns) = &self.id.namespace {
            pool.insert("namespace".into(), ns.clone().into());
        }
        pool.insert("name".into(), self.id.name.clone().into());
        if let Some(u) = &self.uid {
            pool.insert("uid".into(), u.clone().into());
        }
        let mut m = Map::new();
        m.insert("pool".into(), pool.into());
        if let Some(c) = &self.cluster {
            m.insert("cluster".into(), c.clone().into());
        }
        let mut out = Map::new();
        out.insert("metal-ipam.dev".into(), m.into());
        out
    }

    /// Whether `tags` say the resource was created for another pool (an
    /// identifying tag that is not ours): such a resource is never adopted.
    ///
    /// ```
    /// use metal_ipam_core::ipam::{pool::PoolId, vrf::MetalSpec};
    /// use metal_ipam_core::provision::step::Target;
    /// let (id, spec) = (PoolId::namespaced("a", "b"), MetalSpec::default());
    /// let t = Target::new(&id, &spec, Some("u-1"), None);
    /// assert!(!t.belongs_elsewhere(&["metal-ipam.dev/pool-uid=u-1".into(), "x".into()]));
    /// assert!(!t.belongs_elsewhere(&["team=blue".into()]));
    /// assert!(t.belongs_elsewhere(&["metal-ipam.dev/pool-uid=u-2".into()]));
    /// ```
    pub fn belongs_elsewhere(&self, tags: &[String]) -> bool {
        let ours = self.tag();
        tags.iter().any(|t| {
            (t.starts_with("metal-ipam.dev/pool-uid=") || t.starts_with("metal-ipam.dev/pool="))
                && *t != ours
        })
    }
}

/// The tag of the resources created for a pool: its uid when it came from
/// Kubernetes (a re-created pool of the same name gets new resources),
/// else its id.
///
/// ```
/// use metal_ipam_core::ipam::pool::PoolId;
/// use metal_ipam_core::provision::step::tag_for;
/// assert_eq!(tag_for(&PoolId::namespaced("a", "b"), Some("u-1")), "metal-ipam.dev/pool-uid=u-1");
/// assert_eq!(tag_for(&PoolId::namespaced("a", "b"), None), "metal-ipam.dev/pool=a/b");
/// ```
pub fn tag_for(id: &PoolId, uid: Option<&str>) -> String {
    match uid {
        Some(u) => format!("metal-ipam.dev/pool-uid={u}"),
        None => format!("metal-ipam.dev/pool={}", id.display()),
    }
}

/// Where provisioning or teardown stands after an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
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
pub struct Report {
    /// Where it stands.
    pub phase: Phase,
    /// The resources held afterwards.
    pub progress: Progress,
    /// What it did, in order (`created vrf <id>`, …), for the log.
    pub done: Vec<String>,
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

/// The record of pool `id` as stored, a tombstone included (one `get`).
///
/// # Errors
/// Store errors; 500 for an unreadable record.
pub fn read_state<K: KvStore>(kv: &K, id: &PoolId) -> Result<Option<Progress>> {
    read_record::<K, ProgressRecord>(kv, id)
}

/// One compare-and-swap on the record (retried): `f` sees the current
/// record (a tombstone included) and returns what to write, if anything,
/// and what to answer.
fn change<K: KvStore, T>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    mut f: impl FnMut(Option<&Progress>) -> (Option<Progress>, T),
) -> Result<T> {
    update_record::<K, ProgressRecord, T>(ctx, id, |cur| match f(cur) {
        (Some(next), out) => Ok(Step::Write(Box::new(next), out)),
        (None, out) => Ok(Step::Done(out)),
    })
}

/// `cur` as `uid`'s record to write on, if it is (a record that names no
/// uid gets `uid`; a free one starts fresh when `fresh`); `None` when a
/// write for `uid` must not land on it.
fn mine(cur: Option<&Progress>, uid: Option<&str>, fresh: bool) -> Option<Progress> {
    match owner(cur, uid) {
        Owner::Mine => {
            let mut p = cur.cloned().unwrap_or_default();
            if p.uid.is_none() {
                p.uid = uid.map(str::to_string);
            }
            Some(p)
        }
        Owner::Free if fresh => Some(Progress::fresh(cur, uid)),
        _ => None,
    }
}

fn field(r: Resource, f: &str) -> String {
    format!("spec.metal.{}.{f}", r.field())
}

/// Where [`provision`] stands with whose record it is.
enum Round {
    /// Plan again.
    Again,
    /// Answer this.
    Stop(Phase, Box<Progress>),
}

/// Provisions the pool's Metal resources, up to [`MAX_ROUNDS`] actions.
/// The record of an earlier incarnation of the pool (another uid) that was
/// not torn down is torn down first, by its own decisions.
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
pub fn provision<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
) -> Result<Report> {
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
        let progress = match whose(ctx, metal, t, cur, &mut done)? {
            Turn::Plan(p) => *p,
            Turn::Again => continue,
            Turn::Wait(phase) => {
                return Ok(Report {
                    phase,
                    progress: Progress::default(),
                    done,
                })
            }
        };
        match act(ctx, metal, t, progress, now, &mut done)? {
            Round::Again => {}
            Round::Stop(phase, progress) => {
                return Ok(Report {
                    phase,
                    progress: *progress,
                    done,
                })
            }
        }
    }
    used_all_rounds(ctx, t.id, done)
}

/// Whose record [`provision`] works on this round.
enum Turn {
    /// This incarnation's record (or a fresh one): plan on it.
    Plan(Box<Progress>),
    /// The record changed hands (marked for replacement, or an earlier
    /// incarnation's teardown moved on): read it again.
    Again,
    /// An earlier incarnation's teardown is in progress: answer this.
    Wait(Phase),
}

/// Decides whose record `cur` is for `t`: an earlier incarnation's is
/// marked for replacement, then torn down a round at a time, first.
///
/// # Errors
/// 409 `MetalPoolDeleted` for a retired uid, `MetalTearingDown` once this
/// incarnation's teardown started; the teardown's errors.
fn whose<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    cur: Option<Progress>,
    done: &mut Vec<String>,
) -> Result<Turn> {
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
                begin_replacing(ctx, t.id, uid)?;
                return Ok(Turn::Again);
            }
            let earlier = t.with_uid(Some(&v));
            match teardown_round(ctx, metal, &earlier, &p, std::slice::from_ref(&v), done)? {
                Round::Stop(Phase::InProgress { waiting, retry_after_s }, _) => {
                    Ok(Turn::Wait(Phase::InProgress {
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
fn act<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    progress: Progress,
    now: u64,
    done: &mut Vec<String>,
) -> Result<Round> {
    let uid = t.uid.as_deref();
    let waiting = |waiting: String, retry_after_s| Phase::InProgress {
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
            let id = adopt(metal, t, &progress, r)?;
            let decided = Decided::of(t.spec, r);
            if record_adopted(ctx, t.id, uid, r, &id, &decided)? {
                done.push(format!("adopted {} {id}", r.field()));
            }
        }
        Action::Create(r) => create_once(ctx, metal, t, &progress, r, now, done)?,
        Action::FindCreated(r) => match settle_intent(ctx, metal, t, uid, &progress, r)? {
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
            let state = metal.get_gateway(&gw)?.map(|g| g.state.unwrap_or_default());
            record_gateway(ctx, t.id, uid, &gw, state.clone())?;
            if state.as_deref() != Some("active") && state.is_some() {
                let phase = waiting(
                    format!("the Metal Gateway is {}", state.unwrap_or_default()),
                    GATEWAY_POLL_S,
                );
                return Ok(Round::Stop(phase, Box::new(read_progress(ctx, t.id)?)));
            }
        }
        Action::Ready => {
            let block = block_of(metal, &progress)?;
            return Ok(Round::Stop(Phase::Ready { block }, Box::new(progress)));
        }
    }
    Ok(Round::Again)
}

/// Creates `r` under an intent claimed at `now` (none claimed: someone
/// else moved first, plan again). A creation whose outcome is unknown is
/// looked for at once; otherwise the intent is left to its lease (the
/// request may land late). A refusal withdraws the intent.
///
/// # Errors
/// Metal's errors (503 for an unknown outcome); store errors.
fn create_once<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    progress: &Progress,
    r: Resource,
    now: u64,
    done: &mut Vec<String>,
) -> Result<()> {
    let uid = t.uid.as_deref();
    let me = ctx.env.token();
    let decided = Decided::of(t.spec, r);
    if !claim_intent(ctx, t.id, uid, r, &me, now, &decided)? {
        return Ok(());
    }
    match create(metal, t, progress, r) {
        Ok(id) => keep_or_delete(ctx, metal, t, r, &id, &decided, "created", done),
        Err(e) if matches!(e, MetalError::OutcomeUnknown { .. }) => {
            match find_created(metal, t, progress, r)? {
                Some(id) => keep_or_delete(ctx, metal, t, r, &id, &decided, "found", done),
                None => Err(e.into()),
            }
        }
        Err(e) => {
            // Refused or rate limited: nothing was created.
            withdraw_intent(ctx, t.id, uid, r, &me)?;
            Err(e.into())
        }
    }
}

/// Settles an intent whose lease ran out on `owner`'s record: `r` looked
/// for by tag ([`find_created`]) and recorded with the intent's decisions (or
/// deleted when the record refuses it: `Some((id, false))`), or, when
/// none was made, the intent withdrawn (`None`).
///
/// # Errors
/// Metal's and the store's.
fn settle_intent<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    owner: Option<&str>,
    p: &Progress,
    r: Resource,
) -> Result<Option<(String, bool)>> {
    let intent = p.intent.clone();
    let decided = intent
        .as_ref()
        .and_then(|i| i.decided.clone())
        .unwrap_or_else(|| Decided::of(t.spec, r));
    match find_created(metal, t, p, r)? {
        Some(id) => {
            let kept = record_created(ctx, t.id, owner, r, &id, &decided)?;
            if !kept {
                delete(metal, r, &id)?;
            }
            Ok(Some((id, kept)))
        }
        None => {
            let token = intent.map(|i| i.token).unwrap_or_default();
            withdraw_intent(ctx, t.id, owner, r, &token)?;
            Ok(None)
        }
    }
}

/// Records `id`, just created (or found) for `r`; when the record refuses
/// it (the pool is gone, or another is recorded), deletes it: a duplicate,
/// or a resource for a pool that no longer exists.
#[allow(clippy::too_many_arguments)]
fn keep_or_delete<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    r: Resource,
    id: &str,
    decided: &Decided,
    how: &str,
    done: &mut Vec<String>,
) -> Result<()> {
    if record_created(ctx, t.id, t.uid.as_deref(), r, id, decided)? {
        done.push(format!("{how} {} {id}", r.field()));
    } else {
        delete(metal, r, id)?;
        done.push(format!(
            "deleted {} {id}: another is recorded, or the pool is gone",
            r.field()
        ));
    }
    Ok(())
}

/// The report of an invocation that used its [`MAX_ROUNDS`]: call again.
fn used_all_rounds<K: KvStore>(ctx: &Ctx<'_, K>, id: &PoolId, done: Vec<String>) -> Result<Report> {
    Ok(Report {
        phase: Phase::InProgress {
            waiting: "more steps".into(),
            retry_after_s: 1,
        },
        progress: read_progress(ctx, id)?,
        done,
    })
}

/// Records a creation intent for `r` by `token` at `now`, with what was
/// decided for it: the one compare-and-swap that makes a creation
/// exclusive. Granted only on `uid`'s record (or a free one, which starts
/// fresh) that is not being torn down, holds no `r` and no other intent.
/// Returns whether it was recorded (this instance may create `r`).
///
/// # Errors
/// Store errors; 503 `Contention`.
#[allow(clippy::too_many_arguments)]
pub fn claim_intent<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    uid: Option<&str>,
    r: Resource,
    token: &str,
    now: u64,
    decided: &Decided,
) -> Result<bool> {
    change(ctx, id, |cur| {
        let Some(mut p) = mine(cur, uid, true) else {
            return (None, false);
        };
        if p.deleting || p.held(r).is_some() || p.intent.is_some() {
            return (None, false);
        }
        p.intent = Some(Intent {
            resource: r,
            token: token.to_string(),
            at: now,
            decided: Some(decided.clone()),
        });
        (Some(p), true)
    })
}

/// Records `found` as the `r` metal-ipam created for `uid`, with its
/// decision, clearing an intent for `r`. Accepted on `uid`'s record,
/// teardown or not (a creation that landed while the teardown waited is
/// torn down with the rest), unless another `r` is recorded. Refused
/// (`false`) on a tombstone, a free record or another incarnation's: the
/// caller deletes `found`, a duplicate or a resource of a pool that is
/// gone.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn record_created<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    uid: Option<&str>,
    r: Resource,
    found: &str,
    decided: &Decided,
) -> Result<bool> {
    change(ctx, id, |cur| {
        let Some(mut p) = mine(cur, uid, false) else {
            return (None, false);
        };
        match p.held(r) {
            Some(h) if h.id != found => (None, false),
            Some(_) if p.intent.as_ref().is_some_and(|i| i.resource == r) => {
                p.intent = None;
                (Some(p), true)
            }
            Some(_) => (None, true),
            None => {
                p.set(
                    r,
                    Some(Held {
                        id: found.to_string(),
                        created: true,
                        decided: Some(decided.clone()),
                    }),
                );
                (Some(p), true)
            }
        }
    })
}

/// Records the adopted `found` as `uid`'s `r`, with its decision. Refused
/// (`false`) when the record is not `uid`'s (a free one starts fresh), is
/// being torn down, or already holds an `r`.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn record_adopted<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    uid: Option<&str>,
    r: Resource,
    found: &str,
    decided: &Decided,
) -> Result<bool> {
    change(ctx, id, |cur| {
        let Some(mut p) = mine(cur, uid, true) else {
            return (None, false);
        };
        if p.deleting || p.held(r).is_some() {
            return (None, false);
        }
        p.set(
            r,
            Some(Held {
                id: found.to_string(),
                created: false,
                decided: Some(decided.clone()),
            }),
        );
        (Some(p), true)
    })
}

/// Clears `token`'s intent for `r` on `uid`'s record, if it still stands
/// (nothing was created, or nothing was found). Returns whether it did.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn withdraw_intent<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    uid: Option<&str>,
    r: Resource,
    token: &str,
) -> Result<bool> {
    change(ctx, id, |cur| {
        let Some(mut p) = mine(cur, uid, false) else {
            return (None, false);
        };
        match &p.intent {
            Some(i) if i.resource == r && i.token == token => {
                p.intent = None;
                (Some(p), true)
            }
            _ => (None, false),
        }
    })
}

/// Records the gateway `gw`'s state as read (`None`: gone behind our back,
/// so forgotten and created again), on `uid`'s record while it is not torn
/// down and still holds `gw`.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn record_gateway<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    uid: Option<&str>,
    gw: &str,
    state: Option<String>,
) -> Result<bool> {
    change(ctx, id, |cur| {
        let Some(mut p) = mine(cur, uid, false) else {
            return (None, false);
        };
        if p.deleting || p.gateway.as_ref().map(|g| g.id.as_str()) != Some(gw) {
            return (None, false);
        }
        match &state {
            None => {
                p.gateway = None;
                p.gateway_state = None;
            }
            Some(s) if p.gateway_state.as_ref() == Some(s) => return (None, false),
            Some(s) => p.gateway_state = Some(s.clone()),
        }
        (Some(p), true)
    })
}

/// Whether pool `id`'s incarnation `uid` may be registered in the store:
/// its record is live and not being torn down. Read (one `get`) inside the
/// registration's compare-and-swap decision on the pool record (see
/// `kv-schema/README.md`): a teardown marks the record `deleting` before
/// it deletes the pool from the store, so a registration either lands
/// before that deletion (which then removes it) or reads `deleting` and is
/// refused.
///
/// # Errors
/// 409 `MetalTearingDown` when it may not; store errors.
pub fn may_register<K: KvStore>(kv: &K, id: &PoolId, uid: Option<&str>) -> Result<()> {
    let cur = read_state(kv, id)?;
    match owner(cur.as_ref(), uid) {
        Owner::Mine if cur.as_ref().is_some_and(|p| !p.deleting) => Ok(()),
        _ => Err(Error::conflict(
            "MetalTearingDown",
            format!(
                "pool {} is being deleted (or its Metal resources are not its own): it is not registered again",
                id.display()
            ),
        )),
    }
}

/// How the teardown of a pool starts ([`begin_teardown`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begun {
    /// Nothing is (or is any longer) recorded for the pool: its tombstone
    /// names its uid.
    Gone,
    /// The record is being torn down.
    Tearing,
}

/// Starts the teardown of incarnation `uid`: its record, or a free one, or
/// the leftover of an earlier incarnation, is marked `deleting` (nothing is
/// created for it any more); with nothing recorded, the tombstone retiring
/// `uid` is written at once, so that no creation for `uid` can start after
/// the pool is gone. A record already deleting or retired is left as it is.
///
/// # Idempotency
/// Writes at most once per teardown.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn begin_teardown<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    uid: Option<&str>,
) -> Result<Begun> {
    change(ctx, id, |cur| match owner(cur, uid) {
        Owner::Retired => (None, Begun::Gone),
        Owner::Free => {
            let base = cur.cloned().unwrap_or_default();
            let retire: Vec<String> = uid.map(str::to_string).into_iter().collect();
            (Some(base.tombstone(&retire)), Begun::Gone)
        }
        Owner::Mine | Owner::Other(_) => {
            let mut p = cur.cloned().unwrap_or_default();
            if p.deleting && (p.uid.is_some() || uid.is_none()) {
                return (None, Begun::Tearing);
            }
            if p.uid.is_none() {
                p.uid = uid.map(str::to_string);
            }
            p.deleting = true;
            (Some(p), Begun::Tearing)
        }
    })
}

/// Marks the leftover record of an earlier incarnation `deleting` so that
/// `uid`'s provisioning can tear it down first. Returns whether the record
/// is (now) such a leftover being torn down.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn begin_replacing<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    uid: Option<&str>,
) -> Result<bool> {
    change(ctx, id, |cur| match owner(cur, uid) {
        Owner::Other(_) => {
            let mut p = cur.cloned().unwrap_or_default();
            if p.deleting {
                return (None, true);
            }
            p.deleting = true;
            (Some(p), true)
        }
        _ => (None, false),
    })
}

/// `cur` if it is the record being torn down for `owner`.
fn tearing(cur: Option<&Progress>, owner: Option<&str>) -> Option<Progress> {
    cur.filter(|p| !p.deleted && p.deleting && p.uid.as_deref() == owner)
        .cloned()
}

/// Records that `r` (id `rid`) was deleted from `owner`'s record being
/// torn down (a gateway: its deletion requested, awaited next).
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn record_deleted<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    owner: Option<&str>,
    r: Resource,
    rid: &str,
) -> Result<bool> {
    change(ctx, id, |cur| {
        let Some(mut p) = tearing(cur, owner) else {
            return (None, false);
        };
        if p.held(r).map(|h| h.id.as_str()) != Some(rid) {
            return (None, false);
        }
        if r == Resource::Gateway {
            if p.gateway_state.as_deref() == Some("deleting") {
                return (None, true);
            }
            p.gateway_state = Some("deleting".into());
        } else {
            p.set(r, None);
        }
        (Some(p), true)
    })
}

/// Forgets `r` (id `rid`) on `owner`'s record being torn down, without
/// touching it in Metal (a gateway: also once it is gone).
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn record_released<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    owner: Option<&str>,
    r: Resource,
    rid: &str,
) -> Result<bool> {
    change(ctx, id, |cur| {
        let Some(mut p) = tearing(cur, owner) else {
            return (None, false);
        };
        if p.held(r).map(|h| h.id.as_str()) != Some(rid) {
            return (None, false);
        }
        p.set(r, None);
        if r == Resource::Gateway {
            p.gateway_state = None;
        }
        (Some(p), true)
    })
}

/// Completes the teardown of `owner`'s record: once it holds nothing and no
/// intent stands, writes the tombstone retiring `retire` (the last names
/// it). Returns whether the record is (now) that tombstone.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn finish_teardown<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    owner: Option<&str>,
    retire: &[String],
) -> Result<bool> {
    change(ctx, id, |cur| {
        if let Some(p) = cur.filter(|p| p.deleted) {
            let all = retire.iter().all(|u| p.retired.contains(u));
            return (None, all);
        }
        match tearing(cur, owner) {
            Some(p) if !p.holds_anything() => (Some(p.tombstone(retire)), true),
            _ => (None, false),
        }
    })
}

fn held_id(progress: &Progress, r: Resource) -> Result<String> {
    progress
        .held(r)
        .map(|h| h.id.clone())
        .ok_or_else(|| Error::internal(format!("the {} is not recorded yet", r.field())))
}

/// Reads an adopted resource and checks it fits the pool.
///
/// # Errors
/// 422 naming the `spec.metal` field whose resource is missing or does
/// not fit; 500 when a resource it depends on is not recorded; Metal's.
fn adopt<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    progress: &Progress,
    r: Resource,
) -> Result<String> {
    let invalid = |what: String| Error::invalid(field(r, "id"), what);
    match r {
        Resource::Vrf => adopt_vrf(metal, t),
        Resource::Reservation => {
            let id = t.spec.reservation.id.clone().unwrap_or_default();
            let vrf = held_id(progress, Resource::Vrf)?;
            match metal.get_ip(&id)? {
                Some(IpAddress::Vrf(res)) if t.belongs_elsewhere(&res.tags) => Err(invalid(
                    format!("reservation {id} was created for another metal-ipam pool"),
                )),
                Some(IpAddress::Vrf(res)) if res.vrf.id() == Some(vrf.as_str()) => Ok(res.id),
                Some(IpAddress::Vrf(_)) => Err(invalid(format!(
                    "reservation {id} belongs to another VRF than {vrf}"
                ))),
                Some(_) => Err(invalid(format!("{id} is not a VRF IP reservation"))),
                None => Err(invalid(format!("reservation {id} does not exist"))),
            }
        }
        Resource::Vlan => adopt_vlan(metal, t),
        Resource::Gateway => {
            let id = t.spec.gateway.id.clone().unwrap_or_default();
            let gw = metal
                .get_gateway(&id)?
                .ok_or_else(|| invalid(format!("Metal Gateway {id} does not exist")))?;
            let res = held_id(progress, Resource::Reservation)?;
            let vlan = held_id(progress, Resource::Vlan)?;
            let on = |x: &Option<crate::metal::model::Ref>, want: &str| {
                x.as_ref().and_then(|r| r.id()) == Some(want)
            };
            if !on(&gw.ip_reservation, &res) || !on(&gw.virtual_network, &vlan) {
                return Err(invalid(format!(
                    "Metal Gateway {id} does not serve reservation {res} on VLAN {vlan}"
                )));
            }
            Ok(gw.id)
        }
    }
}

/// The adopted VRF: it exists, in the pool's metro, not another pool's.
fn adopt_vrf<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
) -> Result<String> {
    let metro = t.spec.metro.to_ascii_lowercase();
    let invalid = |what: String| Error::invalid(field(Resource::Vrf, "id"), what);
    let id = t.spec.vrf.id.clone().unwrap_or_default();
    let vrf = metal
        .get_vrf(&id)?
        .ok_or_else(|| invalid(format!("VRF {id} does not exist in the project")))?;
    let vrf_metro = vrf
        .metro
        .and_then(|m| m.code)
        .map(|c| c.to_ascii_lowercase());
    if vrf_metro.as_deref().is_some_and(|m| m != metro) {
        return Err(invalid(format!(
            "VRF {id} is in metro {}, not {metro}",
            vrf_metro.unwrap_or_default()
        )));
    }
    if t.belongs_elsewhere(&vrf.tags) {
        return Err(invalid(format!(
            "VRF {id} was created for another metal-ipam pool"
        )));
    }
    Ok(vrf.id)
}

/// The adopted VLAN (by id, or by VXLAN in the pool's metro): it exists,
/// is not another pool's, and is in the pool's metro.
fn adopt_vlan<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
) -> Result<String> {
    let s = t.spec;
    let metro = s.metro.to_ascii_lowercase();
    let invalid = |f: &str, what: String| Error::invalid(field(Resource::Vlan, f), what);
    let vlan = match (&s.vlan.id, s.vlan.vxlan) {
        (Some(id), _) => metal.get_vlan(id)?,
        (None, Some(vxlan)) => metal.find_vlan(vxlan, &metro)?,
        (None, None) => None,
    };
    let vlan = vlan.ok_or_else(|| {
        let (f, what) = match (&s.vlan.id, s.vlan.vxlan) {
            (Some(id), _) => ("id", format!("VLAN {id} does not exist")),
            (None, Some(v)) => ("vxlan", format!("no VLAN {v} in metro {metro}")),
            _ => ("id", "no VLAN named".to_string()),
        };
        invalid(f, what)
    })?;
    if t.belongs_elsewhere(&vlan.tags) {
        return Err(invalid(
            "id",
            format!("VLAN {} was created for another metal-ipam pool", vlan.id),
        ));
    }
    if vlan.metro().is_some_and(|m| m != metro) {
        return Err(invalid(
            "id",
            format!(
                "VLAN {} is in metro {}, not {metro}",
                vlan.id,
                vlan.metro().unwrap_or_default()
            ),
        ));
    }
    Ok(vlan.id)
}

/// Creates `r` with the pool's tag; returns its id.
fn create<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    progress: &Progress,
    r: Resource,
) -> std::result::Result<String, MetalError> {
    let s = t.spec;
    let about = format!("metal-ipam pool {}", t.id.display());
    let missing = |what: &str| MetalError::Malformed {
        detail: format!("the {what} is not recorded yet"),
    };
    let id_of = |r: Resource| progress.held(r).map(|h| h.id.clone());
    match r {
        Resource::Vrf => metal
            .create_vrf(&VrfCreateInput {
                name: s.vrf.name.clone().unwrap_or_else(|| t.id.name.clone()),
                metro: s.metro.clone(),
                description: Some(about),
                ip_ranges: s.vrf.ip_ranges.clone(),
                local_asn: s.vrf.local_asn.map(u64::from),
                tags: t.tags(),
            })
            .map(|v| v.id),
        Resource::Reservation => metal
            .create_vrf_reservation(&VrfIpReservationCreateInput {
                kind: "vrf",
                vrf_id: id_of(Resource::Vrf).ok_or_else(|| missing("VRF"))?,
                network: s.reservation.network.clone().unwrap_or_default(),
                cidr: s.reservation.cidr.unwrap_or_default(),
                details: Some(about),
                customdata: Some(t.customdata()),
                tags: t.tags(),
            })
            .map(|r| r.id),
        Resource::Vlan => metal
            .create_vlan(&VirtualNetworkCreateInput {
                metro: s.metro.clone(),
                vxlan: None,
                description: Some(about),
                tags: t.tags(),
            })
            .map(|v| v.id),
        Resource::Gateway => metal
            .create_vrf_gateway(&VrfMetalGatewayCreateInput {
                virtual_network_id: id_of(Resource::Vlan).ok_or_else(|| missing("VLAN"))?,
                ip_reservation_id: id_of(Resource::Reservation)
                    .ok_or_else(|| missing("reservation"))?,
            })
            .map(|g| g.id),
    }
}

/// Looks for `r` created for this pool (by tag; a gateway by its
/// reservation). Duplicates, which only a creation outliving its intent's
/// lease can leave, are deleted, the oldest id kept.
fn find_created<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    progress: &Progress,
    r: Resource,
) -> Result<Option<String>> {
    let metro = t.spec.metro.to_ascii_lowercase();
    let tag = t.tag();
    let tagged = |tags: &[String]| tags.contains(&tag);
    let mut ids: Vec<String> = match r {
        Resource::Vrf => metal
            .list_vrfs(Some(&metro))?
            .into_iter()
            .filter(|v| tagged(&v.tags))
            .map(|v| v.id)
            .collect(),
        Resource::Reservation => metal
            .list_ips(&["vrf"])?
            .into_iter()
            .filter_map(|ip| match ip {
                IpAddress::Vrf(r) if tagged(&r.tags) => Some(r.id),
                _ => None,
            })
            .collect(),
        Resource::Vlan => metal
            .list_vlans(&metro)?
            .into_iter()
            .filter(|v| tagged(&v.tags))
            .map(|v| v.id)
            .collect(),
        Resource::Gateway => {
            let res = held_id(progress, Resource::Reservation)?;
            metal
                .list_gateways()?
                .into_iter()
                .filter(|g| g.ip_reservation.as_ref().and_then(|r| r.id()) == Some(res.as_str()))
                .map(|g| g.id)
                .collect()
        }
    };
    ids.sort();
    let Some(keep) = ids.first().cloned() else {
        return Ok(None);
    };
    for extra in &ids[1..] {
        delete(metal, r, extra)?;
    }
    Ok(Some(keep))
}

fn delete<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    r: Resource,
    id: &str,
) -> Result<bool> {
    Ok(match r {
        Resource::Vrf => metal.delete_vrf(id)?,
        Resource::Reservation => metal.delete_ip(id)?,
        Resource::Vlan => metal.delete_vlan(id)?,
        Resource::Gateway => metal.delete_gateway(id)?,
    })
}

/// The block of the recorded reservation, read from Metal.
fn block_of<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    progress: &Progress,
) -> Result<(IpAddr, u8)> {
    let id = held_id(progress, Resource::Reservation)?;
    match metal.get_ip(&id)? {
        Some(IpAddress::Vrf(r)) => {
            let net = r.network.as_deref().and_then(|n| n.parse().ok());
            match (net, r.cidr) {
                (Some(net), Some(cidr)) => Ok((net, cidr)),
                _ => Err(Error::internal(format!(
                    "reservation {id} has no network/cidr"
                ))),
            }
        }
        _ => Err(Error::conflict(
            "MetalReservationGone",
            format!("the pool's reservation {id} is gone from Metal"),
        )),
    }
}

/// Tears the pool's Metal resources down, up to [`MAX_ROUNDS`] actions:
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
/// (`capi::vrf`), and marks the teardown ([`begin_teardown`]) before it
/// deletes the pool from the store.
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
pub fn deprovision<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
) -> Result<Report> {
    let uid = t.uid.as_deref();
    let mut done = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let cur = read_state(ctx.kv, t.id)?;
        let gone = |done: Vec<String>| -> Result<Report> {
            // Torn down: the pool index need not list it for its Metal
            // resources any more (a failure here is repaired by the
            // reconcile's tidy).
            let _ = crate::ipam::index::unlist_metal(ctx, t.id);
            Ok(Report {
                phase: Phase::Gone,
                progress: Progress::default(),
                done,
            })
        };
        let (p, retire) = match owner(cur.as_ref(), uid) {
            Owner::Retired => return gone(done),
            Owner::Free => {
                begin_teardown(ctx, t.id, uid)?;
                continue;
            }
            Owner::Mine | Owner::Other(_)
                if !cur
                    .as_ref()
                    .is_some_and(|p| p.deleting && (p.uid.is_some() || uid.is_none())) =>
            {
                begin_teardown(ctx, t.id, uid)?;
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
        match teardown_round(ctx, metal, &of, &p, &retire, &mut done)? {
            Round::Again => {}
            Round::Stop(Phase::Gone, _) => return gone(done),
            Round::Stop(phase, progress) => {
                return Ok(Report {
                    phase,
                    progress: *progress,
                    done,
                })
            }
        }
    }
    used_all_rounds(ctx, t.id, done)
}

/// One teardown action on `p`, the record being torn down (its uid is
/// `t`'s), ending with the tombstone retiring `retire`.
fn teardown_round<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    p: &Progress,
    retire: &[String],
    done: &mut Vec<String>,
) -> Result<Round> {
    let owner = p.uid.as_deref();
    match plan::teardown(t.spec, p, ctx.env.now()) {
        Teardown::WaitForCreation(r, s) => {
            return Ok(Round::Stop(
                Phase::InProgress {
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
            match settle_intent(ctx, metal, t, owner, p, r)? {
                Some((id, _)) => done.push(format!("found {} {id}", r.field())),
                None => done.push(format!("no {} was created", r.field())),
            }
        }
        Teardown::Delete(r) => return delete_held(ctx, metal, t, p, r, done),
        Teardown::Release {
            resource: r,
            kept_for,
        } => {
            let id = held_id(p, r)?;
            record_released(ctx, t.id, owner, r, &id)?;
            done.push(match kept_for {
                Some(k) => format!(
                    "kept {} {id}: the retained {} uses it",
                    r.field(),
                    k.field()
                ),
                None => format!("kept {} {id}", r.field()),
            });
        }
        Teardown::AwaitGatewayGone => return gateway_gone(ctx, metal, t, p, done),
        Teardown::Done => {
            if finish_teardown(ctx, t.id, owner, retire)? {
                return Ok(Round::Stop(Phase::Gone, Box::default()));
            }
        }
    }
    Ok(Round::Again)
}

/// Deletes `r` as recorded on `p` (`t`'s record), and records it gone
/// (already gone, 404, counts as deleted). A VLAN still on ports is
/// unassigned from them first (Metal refuses to delete it; its teardown
/// order), and deleted in the next round; a port gone meanwhile counts as
/// unassigned.
///
/// # Errors
/// Metal's and the store's.
fn delete_held<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    p: &Progress,
    r: Resource,
    done: &mut Vec<String>,
) -> Result<Round> {
    let id = held_id(p, r)?;
    if r == Resource::Vlan {
        let ports = metal.vlan_ports(&id)?;
        if !ports.is_empty() {
            for port in &ports {
                match metal.unassign_port(port, &id) {
                    Ok(_) => {}
                    Err(e) if e.status() == Some(404) => {}
                    Err(e) => return Err(e.into()),
                }
                done.push(format!("unassigned vlan {id} from port {port}"));
            }
            return Ok(Round::Again);
        }
    }
    delete(metal, r, &id)?;
    record_deleted(ctx, t.id, p.uid.as_deref(), r, &id)?;
    done.push(format!("deleted {} {id}", r.field()));
    Ok(Round::Again)
}

/// Waits for the deleted gateway on `p` (`t`'s record) to be gone (a 404,
/// or the 403 a deleted gateway may answer), then records it released.
///
/// # Errors
/// Metal's and the store's.
fn gateway_gone<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    p: &Progress,
    done: &mut Vec<String>,
) -> Result<Round> {
    let id = held_id(p, Resource::Gateway)?;
    let gone = match metal.get_gateway(&id) {
        Ok(None) => true,
        Err(e) if e.status() == Some(403) => true,
        Ok(Some(_)) => false,
        Err(e) => return Err(e.into()),
    };
    if !gone {
        return Ok(Round::Stop(
            Phase::InProgress {
                waiting: "the Metal Gateway is being deleted".into(),
                retry_after_s: GATEWAY_POLL_S,
            },
            Box::new(p.clone()),
        ));
    }
    record_released(ctx, t.id, p.uid.as_deref(), Resource::Gateway, &id)?;
    done.push(format!("gateway {id} is gone"));
    Ok(Round::Again)
}
