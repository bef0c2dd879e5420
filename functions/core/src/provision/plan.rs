//! What to do next for a VRF-backed pool's Metal resources: a pure decision
//! from the pool's `spec.metal`, the progress recorded in the store and the
//! clock. The provisioning step runs one action per round and records its
//! result before the next, so any instance can resume after any crash.
//!
//! # Whose the record is
//! The progress record belongs to one incarnation of the pool: its uid
//! ([`Progress::uid`]). Once that incarnation's teardown is complete the
//! record is a tombstone that lists the uid among the [`Progress::retired`]
//! ones, and nothing is recorded for a retired uid again ([`owner`]): a
//! creation that lands late is refused its recording and deleted by its
//! creator. A pool re-created under the same name (a new uid) starts a
//! fresh record over the tombstone and gets its own resources. A record of
//! another uid that is not a tombstone is the leftover of an incarnation
//! deleted without its teardown (its finalizer removed by hand): it is torn
//! down, by its own recorded decisions, before anything is created.
//!
//! # Exactly once
//! A resource is created only by the instance that recorded a creation
//! intent for it (a compare-and-swap on the progress record, so one
//! instance wins). The intent stays until the created resource's id is
//! recorded. An intent found without an id means its creator crashed, or
//! lost the answer, after it may have created the resource: before
//! creating again, the step looks for it by the pool's tag
//! ([`Action::FindCreated`]). An intent younger than [`INTENT_LEASE_S`] is
//! another instance at work: wait — teardown too ([`Teardown::WaitForCreation`]).
//! Creation requests are never repeated by the client itself
//! (`metal::retry`: a POST whose outcome is unknown is not retried).
//!
//! # Decided once
//! What happens to a resource at teardown is decided when it is created or
//! adopted and recorded with it ([`Decided`]): its deletion policy then
//! (`Delete` for what is created, `Retain` for what is adopted, unless the
//! spec says otherwise) and the `spec.metal` section it was made from. A
//! later `spec.metal` that differs in a held resource's section is not
//! applied: [`next`] answers [`Action::Refuse`] naming the field, and
//! teardown follows the recorded decisions whatever the spec says by then.
//!
//! # Order
//! Provisioning follows the backing's chain ([`Backing::chain`]: on Metal
//! [`Resource::ALL`], VRF, reservation, VLAN,
//! gateway): each needs the ones before. Teardown follows
//! [`Backing::teardown_order`] (on Metal gateway, reservation, VLAN, VRF;
//! on phoenixNAP the network, then its block), deleting what its
//! decision says to delete and Metal allows (a resource a retained one
//! depends on is kept: Metal refuses to delete a reservation or VLAN with a
//! gateway, a VRF with reservations), waiting for the gateway to be gone
//! before deleting its reservation; the retained ones are forgotten last,
//! in creation order.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::ipam::backing::Backing;
use crate::ipam::vrf::{DeletionPolicy, Resource};
use crate::kv::lease::{self, Lease as _};

/// How long a creation intent excludes other instances, in seconds: longer
/// than one round of the step (one Metal request within its budget, plus
/// the store writes around it).
pub const INTENT_LEASE_S: u64 = 120;

/// How many retired uids a record remembers (the newest): more than any
/// instance could outlive.
pub const MAX_RETIRED: usize = 16;

/// What was decided for a resource when it was created or adopted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// Deleted at teardown (its deletion policy was `Delete`).
    pub delete: bool,
    /// The `spec.metal` it was made from ([`MetalSpec::section`]).
    pub spec: Value,
}

impl Decided {
    /// The decision for `r` from `spec` (a [`Backing`], or the
    /// `MetalSpec` / `PnapSpec` it borrows).
    pub fn of<'s>(spec: impl Into<Backing<'s>>, r: Resource) -> Decided {
        let spec = spec.into();
        Decided {
            delete: spec.deletion(r) == DeletionPolicy::Delete,
            spec: spec.section(r),
        }
    }
}

/// A resource the pool holds: its Metal id, whether metal-ipam created it,
/// and what was decided for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Metal UUID.
    pub id: String,
    /// Created by metal-ipam (false: adopted).
    pub created: bool,
    /// The decision (absent in records written before it was recorded:
    /// teardown then deletes it if the spec's explicit `deletionPolicy` says
    /// `Delete`, else if metal-ipam created it).
    pub decided: Option<Decided>,
}

/// A creation in progress: who started it, when, and what was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// The resource being created.
    pub resource: Resource,
    /// The instance's token.
    pub token: String,
    /// Unix seconds when it was recorded.
    pub at: u64,
    /// The decision for the resource (absent in older records).
    pub decided: Option<Decided>,
}

/// The intent is the record's [`lease::Lease`]: it excludes other
/// instances for [`INTENT_LEASE_S`] after `at`.
impl lease::Lease for Intent {
    fn holder(&self) -> &str {
        &self.token
    }
    fn ends(&self) -> u64 {
        self.at.saturating_add(INTENT_LEASE_S)
    }
}

/// What the store records about a pool's Metal resources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The pool incarnation the record belongs to (its object's uid; absent
    /// in records written before it was recorded: the next write claims it).
    pub uid: Option<String>,
    /// The VRF, once known.
    pub vrf: Option<Held>,
    /// The reservation, once known.
    pub reservation: Option<Held>,
    /// The VLAN, once known.
    pub vlan: Option<Held>,
    /// The gateway, once known.
    pub gateway: Option<Held>,
    /// The gateway's last observed state (`ready`, `active`, `deleting`).
    pub gateway_state: Option<String>,
    /// A creation in progress.
    pub intent: Option<Intent>,
    /// Teardown has started: nothing is created any more.
    pub deleting: bool,
    /// Tombstone: the teardown of `uid` is complete.
    pub deleted: bool,
    /// Incarnations whose teardown is complete, oldest first (at most
    /// [`MAX_RETIRED`]): nothing is recorded for them again.
    pub retired: Vec<String>,
}

/// Whose the record is, as seen by the incarnation `uid` (see the module
/// docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No record, or the tombstone of other incarnations: `uid` may start a
    /// fresh record.
    Free,
    /// `uid`'s record (or an older record that names no uid).
    Mine,
    /// `uid`'s teardown is complete: nothing is recorded for it again.
    Retired,
    /// The live record of another incarnation, to be torn down first.
    Other(String),
}

/// Whose `cur` is for `uid`.
///
/// ```
/// use metal_ipam_core::provision::plan::{owner, Owner, Progress};
/// let mine = Progress { uid: Some("u1".into()), ..Progress::default() };
/// assert_eq!(owner(None, Some("u1")), Owner::Free);
/// assert_eq!(owner(Some(&mine), Some("u1")), Owner::Mine);
/// assert_eq!(owner(Some(&mine), Some("u2")), Owner::Other("u1".into()));
/// let gone = Progress { uid: Some("u1".into()), deleted: true, retired: vec!["u1".into()],
///     ..Progress::default() };
/// assert_eq!(owner(Some(&gone), Some("u1")), Owner::Retired);
/// assert_eq!(owner(Some(&gone), Some("u2")), Owner::Free);
/// ```
pub fn owner(cur: Option<&Progress>, uid: Option<&str>) -> Owner {
    let Some(p) = cur else {
        return Owner::Free;
    };
    if uid.is_some_and(|u| p.retired.iter().any(|r| r == u)) {
        return Owner::Retired;
    }
    if p.deleted {
        return Owner::Free;
    }
    match (&p.uid, uid) {
        (None, _) => Owner::Mine,
        (Some(a), Some(b)) if a == b => Owner::Mine,
        (Some(a), _) => Owner::Other(a.clone()),
    }
}

impl Progress {
    /// A fresh record for `uid` over `cur` (keeping the retired uids).
    pub fn fresh(cur: Option<&Progress>, uid: Option<&str>) -> Progress {
        Progress {
            uid: uid.map(str::to_string),
            retired: cur.map(|c| c.retired.clone()).unwrap_or_default(),
            ..Progress::default()
        }
    }

    /// The tombstone that completes a teardown: `retire` joins the retired
    /// uids (the last one names the tombstone).
    pub fn tombstone(&self, retire: &[String]) -> Progress {
        let mut retired = self.retired.clone();
        for u in retire {
            if !retired.contains(u) {
                retired.push(u.clone());
            }
        }
        let excess = retired.len().saturating_sub(MAX_RETIRED);
        retired.drain(..excess);
        Progress {
            uid: retire.last().cloned().or_else(|| self.uid.clone()),
            deleted: true,
            retired,
            ..Progress::default()
        }
    }

    /// What is recorded for `r`.
    pub fn held(&self, r: Resource) -> Option<&Held> {
        match r {
            Resource::Vrf => self.vrf.as_ref(),
            Resource::Reservation => self.reservation.as_ref(),
            Resource::Vlan => self.vlan.as_ref(),
            Resource::Gateway => self.gateway.as_ref(),
        }
    }

    /// Records `r` as held (clearing an intent for it).
    pub fn set(&mut self, r: Resource, held: Option<Held>) {
        let slot = match r {
            Resource::Vrf => &mut self.vrf,
            Resource::Reservation => &mut self.reservation,
            Resource::Vlan => &mut self.vlan,
            Resource::Gateway => &mut self.gateway,
        };
        *slot = held;
        if self.intent.as_ref().is_some_and(|i| i.resource == r) {
            self.intent = None;
        }
    }

    /// The id of the held `r`.
    ///
    /// # Errors
    /// 500 when no `r` is recorded yet.
    pub fn held_id(&self, r: Resource) -> Result<String> {
        self.held(r)
            .map(|h| h.id.clone())
            .ok_or_else(|| Error::internal(format!("the {} is not recorded yet", r.field())))
    }

    /// Whether anything is held or may have been created (an intent).
    pub fn holds_anything(&self) -> bool {
        Resource::ALL.iter().any(|r| self.held(*r).is_some()) || self.intent.is_some()
    }
}

/// The next provisioning action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read the adopted resource from Metal (by id; a VLAN by number and
    /// metro), check it fits, and record it.
    Adopt(Resource),
    /// A creation may have happened without being recorded: look for the
    /// resource by the pool's tag; record it if found, else clear the
    /// intent.
    FindCreated(Resource),
    /// Record a creation intent (compare-and-swap; losing it means another
    /// instance creates), then create the resource with the pool's tag and
    /// record its id.
    Create(Resource),
    /// Another instance is creating `0`: come back after `retry_after_s`.
    WaitForOther(Resource, u64),
    /// The gateway exists but is not active yet: read it again.
    AwaitGateway,
    /// Every resource exists and the gateway is active.
    Ready,
    /// `spec.metal` differs from what a held (or being created) resource
    /// was decided from, at `field`: nothing is done in Metal.
    Refuse {
        /// The first differing field (`spec.metal.vrf.deletionPolicy`).
        field: String,
        /// What is wrong, for the condition.
        message: String,
    },
}

/// The first field where `spec` differs from a decision already taken
/// (held resources, and the one being created), with the message.
fn refused_change(spec: Backing<'_>, progress: &Progress) -> Option<(String, String)> {
    let taken = Resource::ALL
        .into_iter()
        .filter_map(|r| {
            let d = progress.held(r).and_then(|h| h.decided.as_ref());
            let d = d.or(progress
                .intent
                .as_ref()
                .filter(|i| i.resource == r)
                .and_then(|i| i.decided.as_ref()));
            d.map(|d| (r, d))
        })
        .collect::<Vec<_>>();
    for (r, d) in taken {
        if let Some(field) = spec.changed_field(r, &d.spec) {
            let what = if progress.held(r).is_some() {
                "exists"
            } else {
                "is being created"
            };
            let message = format!(
                "the pool's {} {what} as {} said before, and {field} cannot change once it is: \
                 revert the change (a different {} needs a new pool)",
                spec.field(r),
                spec.path(),
                spec.field(r)
            );
            return Some((field, message));
        }
    }
    None
}

/// The next provisioning action for `spec` given `progress` at `now`.
///
/// # Examples
/// ```
/// use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
/// use metal_ipam_core::provision::plan::{next, Action, Progress};
/// let spec = MetalSpec::default(); // everything created
/// assert_eq!(next(&spec, &Progress::default(), 0), Action::Create(Resource::Vrf));
/// ```
pub fn next<'s>(spec: impl Into<Backing<'s>>, progress: &Progress, now: u64) -> Action {
    let spec = spec.into();
    if let Some((field, message)) = refused_change(spec, progress) {
        return Action::Refuse { field, message };
    }
    for &r in spec.chain() {
        if progress.held(r).is_some() {
            continue;
        }
        if spec.adopted(r) {
            return Action::Adopt(r);
        }
        return match &progress.intent {
            Some(i) if i.resource == r && i.live(now) => Action::WaitForOther(r, i.left(now)),
            Some(i) if i.resource == r => Action::FindCreated(r),
            _ => Action::Create(r),
        };
    }
    if !spec.awaits_gateway() || progress.gateway_state.as_deref() == Some("active") {
        Action::Ready
    } else {
        Action::AwaitGateway
    }
}

/// The next teardown action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Teardown {
    /// Another instance's creation of `0` may still land: come back after
    /// `1` seconds (the rest of its intent's lease), then look for it.
    WaitForCreation(Resource, u64),
    /// A creation intent may have created a resource nobody recorded: look
    /// for it by tag first, so it is not left behind.
    FindCreated(Resource),
    /// Delete the resource (its decision is `Delete`).
    Delete(Resource),
    /// Forget the resource without touching it: its decision is `Retain`,
    /// or a retained resource depends on it (`kept_for`).
    Release {
        /// The resource.
        resource: Resource,
        /// The retained resource that keeps it (Metal would refuse its
        /// deletion), if that is why.
        kept_for: Option<Resource>,
    },
    /// The gateway's deletion was requested: read it until it is gone.
    AwaitGatewayGone,
    /// Nothing is left: write the tombstone.
    Done,
}

/// Whether `r` (held) is to be deleted by its own decision. A resource
/// recorded before decisions were (schema version 1) is deleted when the
/// spec says `deletionPolicy: Delete`, kept when it says `Retain`, and
/// otherwise deleted when metal-ipam created it: never by whether the
/// current spec adopts it.
fn decided_delete(progress: &Progress, legacy: Backing<'_>, r: Resource) -> bool {
    let Some(h) = progress.held(r) else {
        return false;
    };
    match &h.decided {
        Some(d) => d.delete,
        None => legacy
            .explicit_deletion(r)
            .map_or(h.created, |p| p == DeletionPolicy::Delete),
    }
}

/// The held resource that stays in the cloud and keeps `r` from being
/// deleted (one made on it, [`Backing::made_on`]: on Metal a gateway keeps
/// its reservation and VLAN, a reservation its VRF).
fn kept_for(progress: &Progress, legacy: Backing<'_>, r: Resource) -> Option<Resource> {
    let stays = |d: Resource| {
        progress.held(d).is_some()
            && (!decided_delete(progress, legacy, d) || kept_for(progress, legacy, d).is_some())
    };
    legacy
        .chain()
        .iter()
        .copied()
        .filter(|d| legacy.made_on(*d).contains(&r))
        .find(|d| stays(*d))
}

/// The next teardown action given `progress` at `now`: the recorded
/// decisions say what is deleted (`legacy`, the current spec, answers only
/// for resources recorded without one), in the backing's
/// [`Backing::teardown_order`]; the gateway
/// must be gone (no longer recorded) before the reservation is touched; a
/// live creation intent is waited out, then its resource looked for.
///
/// ```
/// use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
/// use metal_ipam_core::provision::plan::{teardown, Decided, Held, Progress, Teardown};
/// let spec = MetalSpec::default();
/// let held = |r| Some(Held { id: "x".into(), created: true, decided: Some(Decided::of(&spec, r)) });
/// let p = Progress { vrf: held(Resource::Vrf), reservation: held(Resource::Reservation),
///     vlan: held(Resource::Vlan), gateway: held(Resource::Gateway),
///     gateway_state: Some("active".into()), deleting: true, ..Progress::default() };
/// assert_eq!(teardown(&spec, &p, 0), Teardown::Delete(Resource::Gateway));
/// ```
pub fn teardown<'s>(legacy: impl Into<Backing<'s>>, progress: &Progress, now: u64) -> Teardown {
    let legacy = legacy.into();
    if let Some(i) = &progress.intent {
        if progress.held(i.resource).is_none() {
            return if i.live(now) {
                Teardown::WaitForCreation(i.resource, i.left(now))
            } else {
                Teardown::FindCreated(i.resource)
            };
        }
    }
    for &r in legacy.teardown_order() {
        if progress.held(r).is_none()
            || !decided_delete(progress, legacy, r)
            || kept_for(progress, legacy, r).is_some()
        {
            continue;
        }
        if r == Resource::Gateway && progress.gateway_state.as_deref() == Some("deleting") {
            return Teardown::AwaitGatewayGone;
        }
        return Teardown::Delete(r);
    }
    // The retained ones, dependents first (the VRF before the reservation
    // that keeps it, …): while a resource is recorded, what depends on it
    // is not deleted.
    for &r in legacy.chain() {
        if progress.held(r).is_some() {
            let kept = if decided_delete(progress, legacy, r) {
                kept_for(progress, legacy, r)
            } else {
                None
            };
            return Teardown::Release {
                resource: r,
                kept_for: kept,
            };
        }
    }
    Teardown::Done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::vrf::MetalSpec;
    use serde_json::json;

    const UUID: &str = "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11";

    fn held_by(spec: &MetalSpec, r: Resource, id: &str, created: bool) -> Option<Held> {
        Some(Held {
            id: id.into(),
            created,
            decided: Some(Decided::of(spec, r)),
        })
    }

    /// Runs the planner as the step would, every action succeeding at
    /// once: the sequence of actions until Ready.
    fn run(spec: &MetalSpec) -> Vec<Action> {
        let mut p = Progress::default();
        let mut out = Vec::new();
        for _ in 0..20 {
            let a = next(spec, &p, 1_000);
            out.push(a.clone());
            match a {
                Action::Adopt(r) => p.set(r, held_by(spec, r, r.field(), false)),
                Action::Create(r) => p.set(r, held_by(spec, r, r.field(), true)),
                Action::AwaitGateway => p.gateway_state = Some("active".into()),
                Action::Ready => return out,
                other => panic!("unexpected {other:?}"),
            }
        }
        panic!("no end: {out:?}")
    }

    /// Runs the teardown planner as the step would, every action
    /// succeeding at once: the actions until Done.
    fn tear(legacy: &MetalSpec, mut p: Progress) -> Vec<Teardown> {
        p.deleting = true;
        let mut seen = Vec::new();
        for _ in 0..20 {
            let t = teardown(legacy, &p, 1_000);
            seen.push(t.clone());
            match t {
                Teardown::Delete(Resource::Gateway) => p.gateway_state = Some("deleting".into()),
                Teardown::AwaitGatewayGone => {
                    p.set(Resource::Gateway, None);
                    p.gateway_state = None;
                }
                Teardown::Delete(r) | Teardown::Release { resource: r, .. } => p.set(r, None),
                Teardown::Done => return seen,
                other => panic!("unexpected {other:?}"),
            }
        }
        panic!("no end: {seen:?}")
    }

    #[test]
    fn resources_come_in_dependency_order_adopted_or_created() {
        use Resource::*;
        assert_eq!(
            run(&MetalSpec::default()),
            [
                Action::Create(Vrf),
                Action::Create(Reservation),
                Action::Create(Vlan),
                Action::Create(Gateway),
                Action::AwaitGateway,
                Action::Ready
            ]
        );
        let mut spec = MetalSpec::default();
        spec.vrf.id = Some(UUID.into());
        spec.reservation.id = Some(UUID.into());
        spec.vlan.vxlan = Some(1010);
        assert_eq!(
            run(&spec),
            [
                Action::Adopt(Vrf),
                Action::Adopt(Reservation),
                Action::Adopt(Vlan),
                Action::Create(Gateway),
                Action::AwaitGateway,
                Action::Ready
            ]
        );
    }

    #[test]
    fn an_intent_excludes_others_until_its_lease_ends_then_is_looked_for() {
        let spec = MetalSpec::default();
        let p = Progress {
            vrf: held_by(&spec, Resource::Vrf, "v", true),
            intent: Some(Intent {
                resource: Resource::Reservation,
                token: "other".into(),
                at: 1_000,
                decided: Some(Decided::of(&spec, Resource::Reservation)),
            }),
            ..Progress::default()
        };
        assert_eq!(
            next(&spec, &p, 1_000),
            Action::WaitForOther(Resource::Reservation, INTENT_LEASE_S)
        );
        assert_eq!(
            next(&spec, &p, 1_000 + INTENT_LEASE_S - 1),
            Action::WaitForOther(Resource::Reservation, 1)
        );
        // Never create again before looking: the creator may have crashed
        // after Metal created it.
        assert_eq!(
            next(&spec, &p, 1_000 + INTENT_LEASE_S),
            Action::FindCreated(Resource::Reservation)
        );
    }

    #[test]
    fn recording_a_resource_clears_its_intent_only() {
        let mut p = Progress {
            intent: Some(Intent {
                resource: Resource::Vlan,
                token: "t".into(),
                at: 0,
                decided: None,
            }),
            ..Progress::default()
        };
        p.set(
            Resource::Vrf,
            held_by(&MetalSpec::default(), Resource::Vrf, "v", true),
        );
        assert!(p.intent.is_some());
        p.set(
            Resource::Vlan,
            held_by(&MetalSpec::default(), Resource::Vlan, "l", true),
        );
        assert!(p.intent.is_none());
    }

    #[test]
    fn a_spec_changed_where_a_decision_was_taken_is_refused_naming_the_field() {
        let was = MetalSpec::from_json(&json!({"metro": "da", "vrf": {"id": UUID},
            "reservation": {"network": "10.10.1.0", "cidr": 29}}))
        .unwrap();
        let p = Progress {
            vrf: held_by(&was, Resource::Vrf, "v", false),
            intent: Some(Intent {
                resource: Resource::Reservation,
                token: "t".into(),
                at: 1_000,
                decided: Some(Decided::of(&was, Resource::Reservation)),
            }),
            ..Progress::default()
        };
        let mut now = was.clone();
        now.vrf.deletion_policy = Some(DeletionPolicy::Delete);
        assert!(matches!(next(&now, &p, 1_000),
            Action::Refuse { field, .. } if field == "spec.metal.vrf.deletionPolicy"));
        let mut now = was.clone();
        now.reservation.cidr = Some(28);
        assert!(matches!(next(&now, &p, 1_000),
            Action::Refuse { field, .. } if field == "spec.metal.reservation.cidr"));
        // A section not decided yet may still change.
        let mut now = was.clone();
        now.vlan.vxlan = Some(1010);
        assert_eq!(
            next(&now, &p, 1_000),
            Action::WaitForOther(Resource::Reservation, INTENT_LEASE_S)
        );
    }

    #[test]
    fn teardown_follows_the_recorded_decisions_not_the_spec_in_metals_order() {
        use Resource::*;
        let mut spec = MetalSpec::default();
        spec.vlan.vxlan = Some(1010); // adopted: Retain by default
        let p = Progress {
            vrf: held_by(&spec, Vrf, "v", true),
            reservation: held_by(&spec, Reservation, "r", true),
            vlan: held_by(&spec, Vlan, "l", false),
            gateway: held_by(&spec, Gateway, "g", true),
            gateway_state: Some("active".into()),
            ..Progress::default()
        };
        let expected = [
            Teardown::Delete(Gateway),
            Teardown::AwaitGatewayGone,
            Teardown::Delete(Reservation),
            Teardown::Delete(Vrf),
            Teardown::Release {
                resource: Vlan,
                kept_for: None,
            },
            Teardown::Done,
        ];
        assert_eq!(tear(&spec, p.clone()), expected);
        // A spec edited since (the VLAN to delete, the VRF to keep) changes
        // nothing: the decisions were taken.
        let mut edited = spec.clone();
        edited.vlan.deletion_policy = Some(DeletionPolicy::Delete);
        edited.vrf.deletion_policy = Some(DeletionPolicy::Retain);
        assert_eq!(tear(&edited, p), expected);
    }

    #[test]
    fn an_explicit_retain_keeps_even_what_metal_ipam_created_and_delete_removes_the_adopted() {
        let mut spec = MetalSpec::default();
        spec.vrf.deletion_policy = Some(DeletionPolicy::Retain);
        let p = Progress {
            vrf: held_by(&spec, Resource::Vrf, "v", true),
            deleting: true,
            ..Progress::default()
        };
        assert_eq!(
            teardown(&spec, &p, 0),
            Teardown::Release {
                resource: Resource::Vrf,
                kept_for: None
            }
        );
        let mut spec = MetalSpec::default();
        spec.vrf.id = Some(UUID.into());
        spec.vrf.deletion_policy = Some(DeletionPolicy::Delete);
        let p = Progress {
            vrf: held_by(&spec, Resource::Vrf, "v", false),
            deleting: true,
            ..Progress::default()
        };
        assert_eq!(teardown(&spec, &p, 0), Teardown::Delete(Resource::Vrf));
    }

    #[test]
    fn what_a_retained_resource_depends_on_is_kept_not_refused_forever() {
        use Resource::*;
        // Recorded decisions Metal could not carry out (the webhook and the
        // spec's rules refuse them now; a record may still hold them):
        // nothing is attempted that Metal refuses.
        let keep = |id: &str, created| {
            Some(Held {
                id: id.into(),
                created,
                decided: Some(Decided {
                    delete: false,
                    spec: json!({}),
                }),
            })
        };
        let del = |id: &str| {
            Some(Held {
                id: id.into(),
                created: true,
                decided: Some(Decided {
                    delete: true,
                    spec: json!({}),
                }),
            })
        };
        let p = Progress {
            vrf: del("v"),
            reservation: del("r"),
            vlan: del("l"),
            gateway: keep("g", true),
            ..Progress::default()
        };
        assert_eq!(
            tear(&MetalSpec::default(), p),
            [
                Teardown::Release {
                    resource: Vrf,
                    kept_for: Some(Reservation)
                },
                Teardown::Release {
                    resource: Reservation,
                    kept_for: Some(Gateway)
                },
                Teardown::Release {
                    resource: Vlan,
                    kept_for: Some(Gateway)
                },
                Teardown::Release {
                    resource: Gateway,
                    kept_for: None
                },
                Teardown::Done
            ]
        );
        let p = Progress {
            vrf: del("v"),
            reservation: keep("r", false),
            vlan: del("l"),
            ..Progress::default()
        };
        assert_eq!(
            tear(&MetalSpec::default(), p),
            [
                Teardown::Delete(Vlan),
                Teardown::Release {
                    resource: Vrf,
                    kept_for: Some(Reservation)
                },
                Teardown::Release {
                    resource: Reservation,
                    kept_for: None
                },
                Teardown::Done
            ]
        );
    }

    #[test]
    fn a_record_without_decisions_is_torn_down_by_what_was_created_or_an_explicit_policy() {
        use Resource::*;
        let legacy = |id: &str, created| {
            Some(Held {
                id: id.into(),
                created,
                decided: None,
            })
        };
        let p = Progress {
            vrf: legacy("v", false),
            vlan: legacy("l", true),
            ..Progress::default()
        };
        // The spec now claims the VRF is created and says nothing of
        // policies: the adopted VRF is still kept.
        assert_eq!(
            tear(&MetalSpec::default(), p.clone()),
            [
                Teardown::Delete(Vlan),
                Teardown::Release {
                    resource: Vrf,
                    kept_for: None
                },
                Teardown::Done
            ]
        );
        let mut explicit = MetalSpec::default();
        explicit.vlan.deletion_policy = Some(DeletionPolicy::Retain);
        assert!(!tear(&explicit, p).contains(&Teardown::Delete(Vlan)));
    }

    #[test]
    fn teardown_waits_out_a_live_creation_intent_then_looks_for_it() {
        let spec = MetalSpec::default();
        let p = Progress {
            vrf: held_by(&spec, Resource::Vrf, "v", true),
            intent: Some(Intent {
                resource: Resource::Reservation,
                token: "t".into(),
                at: 1_000,
                decided: Some(Decided::of(&spec, Resource::Reservation)),
            }),
            deleting: true,
            ..Progress::default()
        };
        assert_eq!(
            teardown(&spec, &p, 1_010),
            Teardown::WaitForCreation(Resource::Reservation, INTENT_LEASE_S - 10)
        );
        assert_eq!(
            teardown(&spec, &p, 1_000 + INTENT_LEASE_S),
            Teardown::FindCreated(Resource::Reservation)
        );
    }

    #[test]
    fn whose_the_record_is() {
        let mine = Progress {
            uid: Some("u1".into()),
            retired: vec!["u0".into()],
            ..Progress::default()
        };
        assert_eq!(owner(Some(&mine), Some("u1")), Owner::Mine);
        assert_eq!(owner(Some(&mine), Some("u0")), Owner::Retired);
        assert_eq!(owner(Some(&mine), Some("u2")), Owner::Other("u1".into()));
        let legacy = Progress::default();
        assert_eq!(owner(Some(&legacy), Some("u9")), Owner::Mine);
        let gone = mine.tombstone(&["u1".into()]);
        assert_eq!(gone.retired, ["u0", "u1"]);
        assert_eq!(owner(Some(&gone), Some("u1")), Owner::Retired);
        assert_eq!(owner(Some(&gone), Some("u2")), Owner::Free);
        let fresh = Progress::fresh(Some(&gone), Some("u2"));
        assert_eq!((fresh.uid.as_deref(), fresh.retired.len()), (Some("u2"), 2));
        assert_eq!(owner(Some(&fresh), Some("u1")), Owner::Retired);
    }
}
