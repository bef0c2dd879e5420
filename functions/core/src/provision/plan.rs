//! What to do next for a VRF-backed pool's Metal resources: a pure decision
//! from the pool's `spec.metal`, the progress recorded in the store and the
//! clock. The provisioning step runs one action per round and records its
//! result before the next, so any instance can resume after any crash.
//!
//! # Exactly once
//! A resource is created only by the instance that recorded a creation
//! intent for it (a compare-and-swap on the progress record, so one
//! instance wins). The intent stays until the created resource's id is
//! recorded. An intent found without an id means its creator crashed, or
//! lost the answer, after it may have created the resource: before
//! creating again, the step looks for it by the pool's tag
//! ([`Action::FindCreated`]). An intent younger than [`INTENT_LEASE_S`] is
//! another instance at work: wait. Creation requests are never repeated by
//! the client itself (`metal::retry`: a POST whose outcome is unknown is
//! not retried).
//!
//! # Order
//! Provisioning follows [`Resource::ALL`] (VRF, reservation, VLAN,
//! gateway): each needs the ones before. Teardown follows
//! [`TEARDOWN_ORDER`] (gateway, reservation, VLAN, VRF) and only touches
//! what the pool's deletion policies allow, waiting for the gateway to be
//! gone before deleting its reservation (Metal refuses that with 422
//! otherwise).

use crate::ipam::vrf::{DeletionPolicy, MetalSpec, Resource};

/// How long a creation intent excludes other instances, in seconds: longer
/// than one round of the step (one Metal request within its budget, plus
/// the store writes around it).
pub const INTENT_LEASE_S: u64 = 120;

/// A resource the pool holds: its Metal id and whether metal-ipam created
/// it (and so may delete it, policy permitting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Metal UUID.
    pub id: String,
    /// Created by metal-ipam (false: adopted).
    pub created: bool,
}

/// A creation in progress: who started it and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// The resource being created.
    pub resource: Resource,
    /// The instance's token.
    pub token: String,
    /// Unix seconds when it was recorded.
    pub at: u64,
}

/// What the store records about a pool's Metal resources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
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
}

impl Progress {
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
pub fn next(spec: &MetalSpec, progress: &Progress, now: u64) -> Action {
    for r in Resource::ALL {
        if progress.held(r).is_some() {
            continue;
        }
        if spec.adopted(r) {
            return Action::Adopt(r);
        }
        return match &progress.intent {
            Some(i) if i.resource == r && now < i.at.saturating_add(INTENT_LEASE_S) => {
                Action::WaitForOther(r, i.at + INTENT_LEASE_S - now)
            }
            Some(i) if i.resource == r => Action::FindCreated(r),
            _ => Action::Create(r),
        };
    }
    if progress.gateway_state.as_deref() == Some("active") {
        Action::Ready
    } else {
        Action::AwaitGateway
    }
}

/// Teardown order, Metal's documented one: the gateway (gone before its
/// reservation can be deleted), the reservation, the VLAN (once no port
/// uses it), the VRF.
pub const TEARDOWN_ORDER: [Resource; 4] = [
    Resource::Gateway,
    Resource::Reservation,
    Resource::Vlan,
    Resource::Vrf,
];

/// The next teardown action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Teardown {
    /// A creation intent may have created a resource nobody recorded: look
    /// for it by tag first, so it is not left behind.
    FindCreated(Resource),
    /// Delete the resource (its policy is `Delete`).
    Delete(Resource),
    /// Forget the resource without touching it (policy `Retain`).
    Release(Resource),
    /// The gateway's deletion was requested: read it until it is gone.
    AwaitGatewayGone,
    /// Nothing is left.
    Done,
}

/// The next teardown action for `spec` given `progress`, in
/// [`TEARDOWN_ORDER`]; the gateway must be gone (no longer recorded)
/// before the reservation is touched.
///
/// ```
/// use metal_ipam_core::ipam::vrf::{MetalSpec, Resource};
/// use metal_ipam_core::provision::plan::{teardown, Held, Progress, Teardown};
/// let held = |id: &str| Some(Held { id: id.into(), created: true });
/// let p = Progress { vrf: held("v"), reservation: held("r"), vlan: held("l"), gateway: held("g"),
///     gateway_state: Some("active".into()), deleting: true, ..Progress::default() };
/// assert_eq!(teardown(&MetalSpec::default(), &p), Teardown::Delete(Resource::Gateway));
/// ```
pub fn teardown(spec: &MetalSpec, progress: &Progress) -> Teardown {
    if let Some(i) = &progress.intent {
        if progress.held(i.resource).is_none() {
            return Teardown::FindCreated(i.resource);
        }
    }
    for r in TEARDOWN_ORDER {
        if progress.held(r).is_none() {
            continue;
        }
        // The spec's policy decides (by default: delete what was created,
        // keep what was adopted).
        let delete = spec.deletion(r) == DeletionPolicy::Delete;
        if r == Resource::Gateway && delete {
            return match progress.gateway_state.as_deref() {
                Some("deleting") => Teardown::AwaitGatewayGone,
                _ => Teardown::Delete(r),
            };
        }
        return if delete {
            Teardown::Delete(r)
        } else {
            Teardown::Release(r)
        };
    }
    Teardown::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "8f3d3c4e-0b1a-4f7e-9c52-2d6f1f0a9b11";

    fn held(id: &str, created: bool) -> Option<Held> {
        Some(Held {
            id: id.into(),
            created,
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
                Action::Adopt(r) => p.set(r, held(r.field(), false)),
                Action::Create(r) => p.set(r, held(r.field(), true)),
                Action::AwaitGateway => p.gateway_state = Some("active".into()),
                Action::Ready => return out,
                other => panic!("unexpected {other:?}"),
            }
        }
        panic!("no end: {out:?}")
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
            vrf: held("v", true),
            intent: Some(Intent {
                resource: Resource::Reservation,
                token: "other".into(),
                at: 1_000,
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
            }),
            ..Progress::default()
        };
        p.set(Resource::Vrf, held("v", true));
        assert!(p.intent.is_some());
        p.set(Resource::Vlan, held("l", true));
        assert!(p.intent.is_none());
    }

    #[test]
    fn teardown_runs_in_metals_order_by_policy_and_waits_for_the_gateway() {
        use Resource::*;
        let mut spec = MetalSpec::default();
        spec.vlan.vxlan = Some(1010); // adopted: Retain by default
        let mut p = Progress {
            vrf: held("v", true),
            reservation: held("r", true),
            vlan: held("l", false),
            gateway: held("g", true),
            gateway_state: Some("active".into()),
            deleting: true,
            ..Progress::default()
        };
        let mut seen = Vec::new();
        for _ in 0..20 {
            let t = teardown(&spec, &p);
            seen.push(t.clone());
            match t {
                Teardown::Delete(Gateway) => p.gateway_state = Some("deleting".into()),
                Teardown::AwaitGatewayGone => {
                    p.set(Gateway, None);
                    p.gateway_state = None;
                }
                Teardown::Delete(r) | Teardown::Release(r) => p.set(r, None),
                Teardown::Done => break,
                Teardown::FindCreated(_) => unreachable!(),
            }
        }
        assert_eq!(
            seen,
            [
                Teardown::Delete(Gateway),
                Teardown::AwaitGatewayGone,
                Teardown::Delete(Reservation),
                Teardown::Release(Vlan),
                Teardown::Delete(Vrf),
                Teardown::Done
            ]
        );
    }

    #[test]
    fn an_explicit_retain_keeps_even_what_metal_ipam_created() {
        let mut spec = MetalSpec::default();
        spec.vrf.deletion_policy = Some(DeletionPolicy::Retain);
        let p = Progress {
            vrf: held("v", true),
            deleting: true,
            ..Progress::default()
        };
        assert_eq!(teardown(&spec, &p), Teardown::Release(Resource::Vrf));
        // … and an explicit Delete removes an adopted one.
        let mut spec = MetalSpec::default();
        spec.vrf.id = Some(UUID.into());
        spec.vrf.deletion_policy = Some(DeletionPolicy::Delete);
        let p = Progress {
            vrf: held("v", false),
            deleting: true,
            ..Progress::default()
        };
        assert_eq!(teardown(&spec, &p), Teardown::Delete(Resource::Vrf));
    }

    #[test]
    fn a_pending_creation_is_looked_for_before_teardown() {
        let p = Progress {
            vrf: held("v", true),
            intent: Some(Intent {
                resource: Resource::Reservation,
                token: "t".into(),
                at: 0,
            }),
            deleting: true,
            ..Progress::default()
        };
        assert_eq!(
            teardown(&MetalSpec::default(), &p),
            Teardown::FindCreated(Resource::Reservation)
        );
    }
}
