//! Machine networking on clouds whose servers join segments with the
//! addresses they hold on each ([`Memberships`]: phoenixNAP's private and
//! public networks): the memberships a profile wants ([`Wanted`]), the
//! changes that get the server there ([`plan`], pure), and their apply
//! ([`apply_members`]) under the same device record, lease and fencing as
//! the port apply of [`super::apply`] — one writer per server.
//!
//! # What the apply owns
//! Only the segments it joined (`joined` in the device's record, added
//! when the join is recorded, before the call): a segment the profile no
//! longer names is left only if the apply joined it. A segment the server
//! was on before the profile named it (its provisioning networks) gets the
//! profile's addresses but is never left, by an edit or a release.
//!
//! # Order
//! Leaves first (they free addresses), then address changes, then joins;
//! one change at a time per server, each followed until the membership
//! reads done (`Ready`) or gone. A membership that is changing for another
//! reason is waited for; one the cloud reports failed is an error naming
//! it (409 `MembershipFailed`) while the profile wants it.

use std::collections::BTreeSet;

use super::apply::{
    device_not_found, lease_lost, under_lease, ApplyPhase, ApplyReport, DeviceRecord, Holder, Step,
    StepRecord, POLL_S, RUNNING_S,
};
pub use super::changes::{MemberAction, MemberStep};
use crate::cloud::{missing, Capability, Cloud, CloudError, Member, MemberState, Memberships};
use crate::error::{Error, Result};
use crate::kv::Ctx;
use crate::ports::kv::KvStore;

/// A segment the server should be on, with the addresses it holds there
/// (plain addresses, no prefix length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The segment's id.
    pub segment: String,
    /// Its addresses on the server.
    pub addresses: BTreeSet<String>,
}

/// `step` as stored in the device's record (`port` is `server`).
pub fn step_record(step: &MemberStep, device: &str) -> StepRecord {
    StepRecord {
        port: "server".into(),
        port_id: device.to_string(),
        action: step.action.name().to_string(),
        vlans: vec![step.segment.clone()],
        bulk: false,
        addresses: step.action.addresses().to_vec(),
    }
}

fn same(addresses: &[String], wanted: &BTreeSet<String>) -> bool {
    addresses.iter().cloned().collect::<BTreeSet<_>>() == *wanted
}

/// The changes from the server's memberships (`observed`) to `wanted`;
/// `joined`: the segments the apply joined (the only ones it leaves).
/// Changes on a membership that is changing are not planned yet.
///
/// ```
/// use std::collections::BTreeSet;
/// use metal_ipam_core::cloud::{Member, MemberState};
/// use metal_ipam_core::network::memberships::{plan, MemberAction, Wanted};
/// let ips = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
/// let member = |s: &str, a: &[&str]| Member { segment: s.into(), public: false,
///     addresses: a.iter().map(|x| x.to_string()).collect(), state: MemberState::Ready };
/// let observed = [member("prov", &["10.0.0.9"]), member("old", &["10.9.0.2"]), member("a", &["10.1.0.5"])];
/// let wanted = [Wanted { segment: "a".into(), addresses: ips(&["10.1.0.5", "10.1.0.6"]) },
///               Wanted { segment: "b".into(), addresses: ips(&["10.2.0.5"]) }];
/// let joined = ["old".to_string(), "a".to_string()];
/// let steps = plan(&observed, &wanted, &joined).unwrap();
/// let actions: Vec<_> = steps.iter().map(|s| (s.segment.as_str(), s.action.name())).collect();
/// // `prov` was not joined by the apply: never left.
/// assert_eq!(actions, [("old", "leave-network"), ("a", "set-network-addresses"), ("b", "join-network")]);
/// assert_eq!(steps[2].action, MemberAction::Join(vec!["10.2.0.5".into()]));
/// ```
///
/// # Errors
/// 409 `MembershipFailed` for a wanted membership the cloud reports
/// failed.
pub fn plan(observed: &[Member], wanted: &[Wanted], joined: &[String]) -> Result<Vec<MemberStep>> {
    let member = |s: &str| observed.iter().find(|m| m.segment == s);
    let is_wanted = |s: &str| wanted.iter().any(|w| w.segment == s);
    let mut leaves = Vec::new();
    for s in joined {
        match member(s) {
            Some(m) if !is_wanted(s) && m.state != MemberState::Changing => {
                leaves.push(MemberStep {
                    segment: s.clone(),
                    public: m.public,
                    action: MemberAction::Leave,
                })
            }
            _ => {}
        }
    }
    let mut sets = Vec::new();
    let mut joins = Vec::new();
    for w in wanted {
        let addresses: Vec<String> = w.addresses.iter().cloned().collect();
        match member(&w.segment) {
            None => joins.push(MemberStep {
                segment: w.segment.clone(),
                public: false,
                action: MemberAction::Join(addresses),
            }),
            Some(m) if m.state == MemberState::Failed => {
                return Err(Error::conflict(
                    "MembershipFailed",
                    format!(
                        "the cloud reports the server's membership of network {} failed; remove the network from the profile (or the server from the network) and apply again",
                        w.segment
                    ),
                ))
            }
            // No addresses named: the cloud's choice stands.
            Some(m)
                if m.state == MemberState::Ready
                    && !w.addresses.is_empty()
                    && !same(&m.addresses, &w.addresses) =>
            {
                sets.push(MemberStep {
                    segment: w.segment.clone(),
                    public: m.public,
                    action: MemberAction::SetAddresses(addresses),
                })
            }
            Some(_) => {}
        }
    }
    Ok(leaves.into_iter().chain(sets).chain(joins).collect())
}

/// The segments still the apply's after `observed`: those it joined that
/// the server is still on or the profile still wants.
fn still_joined(joined: &[String], observed: &[Member], wanted: &[Wanted]) -> Vec<String> {
    joined
        .iter()
        .filter(|s| {
            observed.iter().any(|m| &m.segment == *s) || wanted.iter().any(|w| &w.segment == *s)
        })
        .cloned()
        .collect()
}

/// Whether a recorded step's effect shows in `observed`: `Some(Err)` when
/// the cloud reports the membership failed.
fn effect(step: &StepRecord, observed: &[Member]) -> Option<std::result::Result<(), String>> {
    let segment = step.vlans.first()?;
    let m = observed.iter().find(|m| &m.segment == segment);
    match (step.action.as_str(), m) {
        ("leave-network", None) => Some(Ok(())),
        ("leave-network", Some(_)) => None,
        (_, Some(m)) if m.state == MemberState::Failed => Some(Err(format!(
            "the cloud reports the server's membership of network {segment} failed"
        ))),
        ("join-network", Some(m)) if m.state == MemberState::Ready => Some(Ok(())),
        ("set-network-addresses", Some(m))
            if m.state == MemberState::Ready && same(&m.addresses, &set(&step.addresses)) =>
        {
            Some(Ok(()))
        }
        _ => None,
    }
}

fn set(a: &[String]) -> BTreeSet<String> {
    a.iter().cloned().collect()
}

fn members_of<C: Cloud + ?Sized>(cloud: &C) -> Result<&dyn Memberships> {
    cloud.memberships().ok_or_else(|| {
        missing(
            cloud.name(),
            Capability::ChosenAddresses,
            "a profile of server networks",
        )
    })
}

/// The server's memberships, `None` when it does not exist.
///
/// # Errors
/// 422 `CapabilityMissing` on a cloud without memberships; the cloud's
/// errors.
pub fn observe_members<C: Cloud + ?Sized>(cloud: &C, device: &str) -> Result<Option<Vec<Member>>> {
    members_of(cloud)?
        .members(device)
        .map_err(|e| cloud.error(e))
}

/// The plan for `device` (no writes): what `dryRun` answers.
///
/// # Errors
/// 404 `DeviceNotFound`; as [`plan`]; the cloud's errors.
pub fn plan_members<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    device: &str,
    wanted: &[Wanted],
) -> Result<Vec<MemberStep>> {
    let observed = observe_members(cloud, device)?.ok_or_else(|| device_not_found(device))?;
    let joined = super::apply::read(ctx.kv, device)?.joined;
    plan(&observed, wanted, &joined)
}

/// Applies `wanted` to the server `device`: up to
/// [`super::apply::MAX_ROUNDS`] rounds of following the running change or
/// making the next, under the device's lease (`honour_release`: as
/// [`super::apply::apply_profile`], `None` when the operator released the
/// device). An empty `wanted` leaves every segment the apply joined (the
/// release).
///
/// # Idempotency
/// Any number of invocations, concurrent (one holds the lease, the others
/// answer in progress) or after a crash between any two operations,
/// converge; a change is recorded before its call, so a lost answer is
/// followed on the server, not repeated; a converged server costs one read
/// of the record and one of the server.
///
/// # Errors
/// 404 `DeviceNotFound` (the record is forgotten); 409 `MembershipFailed`,
/// `MembershipRefused` (a 422 of the cloud's, its messages kept in the
/// record); 422 `CapabilityMissing` on a cloud without memberships; the
/// cloud's and the store's errors.
pub fn apply_members<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    device: &str,
    wanted: &[Wanted],
    honour_release: bool,
) -> Result<Option<ApplyReport>> {
    let m = members_of(cloud)?;
    under_lease(ctx, device, honour_release, |holder, started| {
        rounds(ctx, cloud, m, device, wanted, holder, started)
    })
}

fn in_progress(waiting: String, remaining: Vec<MemberStep>, issued: Vec<Step>) -> ApplyReport {
    let remaining = remaining.into_iter().map(Step::Member).collect();
    ApplyReport::in_progress(waiting, POLL_S, remaining, issued)
}

fn rounds<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    m: &dyn Memberships,
    device: &str,
    wanted: &[Wanted],
    holder: &Holder<'_>,
    started: u64,
) -> Result<ApplyReport> {
    let record = DeviceRecord::new(ctx, device);
    let mut issued = Vec::new();
    for _ in 0..super::apply::MAX_ROUNDS {
        let now = ctx.env.now();
        if now >= started + super::apply::LEASE_S / 2 {
            break;
        }
        let state = super::apply::read(ctx.kv, device)?;
        let Some(observed) = m.members(device).map_err(|e| cloud.error(e))? else {
            record.forget()?;
            return Err(device_not_found(device));
        };
        if let Some(r) = &state.running {
            match effect(&r.step, &observed) {
                Some(Err(msg)) => {
                    record.finish(holder.token, Some(msg.clone()))?;
                    return Err(Error::conflict("MembershipFailed", msg));
                }
                None if now < r.at.saturating_add(RUNNING_S) => {
                    let remaining = plan(&observed, wanted, &state.joined).unwrap_or_default();
                    let what = format!("{} {}", r.step.action, r.step.vlans.join(","));
                    return Ok(in_progress(what, remaining, issued));
                }
                _ => {
                    record.finish(holder.token, None)?;
                    continue;
                }
            }
        }
        let joined = still_joined(&state.joined, &observed, wanted);
        let steps = plan(&observed, wanted, &joined)?;
        let Some(next) = steps.first().cloned() else {
            if joined != state.joined {
                record.set_joined(holder.token, &joined)?;
            }
            if let Some(busy) = observed.iter().find(|m| m.state == MemberState::Changing) {
                let what = format!("network {} changing", busy.segment);
                return Ok(in_progress(what, steps, issued));
            }
            return Ok(ApplyReport {
                phase: ApplyPhase::Converged,
                remaining: Vec::new(),
                issued,
            });
        };
        issue(ctx, cloud, m, device, &next, &joined, holder)?;
        issued.push(Step::Member(next));
    }
    let remaining = match m.members(device).map_err(|e| cloud.error(e))? {
        Some(o) => plan(&o, wanted, &super::apply::read(ctx.kv, device)?.joined)?,
        None => Vec::new(),
    };
    let remaining = remaining.into_iter().map(Step::Member).collect();
    Ok(ApplyReport::in_progress(
        super::apply::MORE_STEPS.into(),
        1,
        remaining,
        issued,
    ))
}

/// Records `step` (a join adds its segment to `joined` in the same write),
/// then makes its call if the lease still leaves time for it.
fn issue<K: KvStore, C: Cloud + ?Sized>(
    ctx: &Ctx<'_, K>,
    cloud: &C,
    m: &dyn Memberships,
    device: &str,
    step: &MemberStep,
    joined: &[String],
    holder: &Holder<'_>,
) -> Result<()> {
    let record = DeviceRecord::new(ctx, device);
    let rec = step_record(step, device);
    let owned = joined;
    let mut joined = joined.to_vec();
    if matches!(step.action, MemberAction::Join(_)) && !joined.contains(&step.segment) {
        joined.push(step.segment.clone());
    }
    record.record_change(holder.token, &rec, &joined, ctx.env.now())?;
    if !holder.may_call(ctx.env.now()) {
        return Err(lease_lost(device));
    }
    let s = &step.segment;
    let called = match &step.action {
        MemberAction::Join(a) => m.join(device, s, a),
        MemberAction::SetAddresses(a) => m.set_addresses(device, s, step.public, a),
        MemberAction::Leave => m.leave(device, s, step.public).map(drop),
    };
    match called {
        Ok(()) => Ok(()),
        // A refusal: done if a re-read shows the effect (a join already
        // made), else reported with the cloud's messages and kept in the
        // record (nothing runs; the next invocation plans again).
        Err(CloudError::Api {
            status: 422,
            messages,
            ..
        }) => {
            let now = m.members(device).map_err(|e| cloud.error(e))?;
            let join = matches!(step.action, MemberAction::Join(_));
            let on_it = |o: &Vec<Member>| o.iter().any(|x| x.segment == *s);
            if join && now.as_ref().is_some_and(on_it) {
                // A join refused because the server is on the network
                // already (joined or joining): another writer joined it,
                // so it is not the apply's to leave; the next round waits
                // for it and gives it the profile's addresses.
                record.set_joined(holder.token, owned)?;
                return record.finish(holder.token, None);
            }
            if now.is_some_and(|o| matches!(effect(&rec, &o), Some(Ok(())))) {
                return record.finish(holder.token, None);
            }
            let msg = messages.join("; ");
            record.finish(holder.token, Some(msg.clone()))?;
            Err(Error::conflict(
                "MembershipRefused",
                format!(
                    "{} refused {} of network {s} for server {device}: {msg}",
                    cloud.name(),
                    step.action.name()
                ),
            ))
        }
        // Not made for sure: nothing runs.
        Err(e @ CloudError::Api { .. }) | Err(e @ CloudError::Unavailable { .. }) => {
            record.finish(holder.token, None)?;
            Err(cloud.error(e))
        }
        // Made or not: followed on the server.
        Err(e) => Err(cloud.error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(s: &str, a: &[&str], state: MemberState) -> Member {
        Member {
            segment: s.into(),
            public: false,
            addresses: a.iter().map(|x| x.to_string()).collect(),
            state,
        }
    }

    fn wanted(s: &str, a: &[&str]) -> Wanted {
        Wanted {
            segment: s.into(),
            addresses: a.iter().map(|x| x.to_string()).collect(),
        }
    }

    #[test]
    fn a_converged_server_plans_nothing_and_a_changing_membership_waits() {
        let o = [member("a", &["10.1.0.5"], MemberState::Ready)];
        assert!(plan(&o, &[wanted("a", &["10.1.0.5"])], &["a".into()])
            .unwrap()
            .is_empty());
        let changing = [member("a", &["10.1.0.4"], MemberState::Changing)];
        assert!(plan(&changing, &[wanted("a", &["10.1.0.5"])], &[])
            .unwrap()
            .is_empty());
        assert!(plan(&changing, &[], &["a".into()]).unwrap().is_empty());
    }

    #[test]
    fn a_network_named_without_addresses_keeps_the_ones_the_cloud_chose() {
        let o = [member("a", &["10.1.0.2"], MemberState::Ready)];
        assert!(plan(&o, &[wanted("a", &[])], &["a".into()])
            .unwrap()
            .is_empty());
        let steps = plan(&[], &[wanted("a", &[])], &[]).unwrap();
        assert_eq!(steps[0].action, MemberAction::Join(vec![]));
    }

    #[test]
    fn a_failed_membership_the_profile_wants_is_an_error_naming_it() {
        let o = [member("a", &[], MemberState::Failed)];
        let e = plan(&o, &[wanted("a", &["10.1.0.5"])], &[]).unwrap_err();
        assert_eq!((e.status(), e.reason()), (409, "MembershipFailed"));
        assert!(e.message().contains("network a"));
        // Not wanted and ours: left.
        let steps = plan(&o, &[], &["a".into()]).unwrap();
        assert_eq!(steps[0].action, MemberAction::Leave);
    }

    #[test]
    fn the_release_leaves_only_what_the_apply_joined() {
        let o = [
            member("prov", &["10.0.0.9"], MemberState::Ready),
            member("a", &["10.1.0.5"], MemberState::Ready),
        ];
        let steps = plan(&o, &[], &["a".into(), "gone".into()]).unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(
            (steps[0].segment.as_str(), &steps[0].action),
            ("a", &MemberAction::Leave)
        );
        assert_eq!(still_joined(&["a".into(), "gone".into()], &o, &[]), ["a"]);
    }

    #[test]
    fn effects_are_read_from_the_membership() {
        let step = |action: MemberAction| {
            let step = MemberStep {
                segment: "a".into(),
                public: false,
                action,
            };
            step_record(&step, "srv")
        };
        let ready = [member("a", &["10.1.0.5"], MemberState::Ready)];
        let changing = [member("a", &["10.1.0.5"], MemberState::Changing)];
        let join = step(MemberAction::Join(vec!["10.1.0.5".into()]));
        assert_eq!(effect(&join, &ready), Some(Ok(())));
        assert_eq!(effect(&join, &changing), None);
        let set = step(MemberAction::SetAddresses(vec!["10.1.0.6".into()]));
        assert_eq!(
            effect(&set, &ready),
            None,
            "not the addresses asked for yet"
        );
        let leave = step(MemberAction::Leave);
        assert_eq!(effect(&leave, &[]), Some(Ok(())));
        assert_eq!(effect(&leave, &changing), None);
        let failed = [member("a", &[], MemberState::Failed)];
        assert!(matches!(effect(&join, &failed), Some(Err(_))));
    }
}
