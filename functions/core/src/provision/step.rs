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

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::plan::{self, Action, Held, Intent, Progress, Teardown};
use super::record::ProgressRecord;
use crate::error::{Error, Result};
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
    Ok(read_record::<K, ProgressRecord>(ctx.kv, id)?.unwrap_or_default())
}

/// Applies `change` to the recorded progress (one compare-and-swap,
/// retried); `change` returns `false` to write nothing. Returns whether
/// it wrote.
fn record<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    mut change: impl FnMut(&mut Progress) -> bool,
) -> Result<bool> {
    update_record::<K, ProgressRecord, bool>(ctx, id, |cur| {
        let mut p = cur.cloned().unwrap_or_default();
        if change(&mut p) {
            Ok(Step::Write(Box::new(Some(p)), true))
        } else {
            Ok(Step::Done(false))
        }
    })
}

fn field(r: Resource, f: &str) -> String {
    format!("spec.metal.{}.{f}", r.field())
}

/// Provisions the pool's Metal resources, up to [`MAX_ROUNDS`] actions.
///
/// # Idempotency
/// Any number of invocations, concurrent or after a crash between any two
/// operations, create each resource at most once (see [`super::plan`]);
/// once ready, an invocation reads the gateway and the reservation and
/// writes nothing.
///
/// # Errors
/// 422 naming the `spec.metal` field whose adopted resource is missing or
/// does not fit; Metal's refusals (409 `MetalRefused`, …); 503 when Metal
/// is unavailable or a creation's outcome is unknown (the next invocation
/// looks for it before creating again); store errors.
pub fn provision<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
) -> Result<Report> {
    let mut done = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let progress = read_progress(ctx, t.id)?;
        if progress.deleting {
            return Err(Error::conflict(
                "MetalTearingDown",
                "the pool's Metal resources are being torn down",
            ));
        }
        let now = ctx.env.now();
        match plan::next(t.spec, &progress, now) {
            Action::Adopt(r) => {
                let id = adopt(metal, t, &progress, r)?;
                record(ctx, t.id, |p| {
                    if p.held(r).is_some() {
                        return false;
                    }
                    p.set(
                        r,
                        Some(Held {
                            id: id.clone(),
                            created: false,
                        }),
                    );
                    true
                })?;
                done.push(format!("adopted {} {id}", r.field()));
            }
            Action::Create(r) => {
                let me = ctx.env.token();
                let won = claim_intent(ctx, t.id, r, &me, now)?;
                if !won {
                    continue; // someone else moved first: plan again
                }
                match create(metal, t, &progress, r) {
                    Ok(id) => {
                        let kept = record_created(ctx, t.id, r, &id)?;
                        if kept {
                            done.push(format!("created {} {id}", r.field()));
                        } else {
                            // Another instance recorded one after our lease
                            // ran out: ours is the duplicate.
                            delete(metal, r, &id)?;
                            done.push(format!("deleted duplicate {} {id}", r.field()));
                        }
                    }
                    Err(e) if matches!(e, MetalError::OutcomeUnknown { .. }) => {
                        // It may exist: look now, and otherwise leave the
                        // intent to its lease (the request may land late).
                        if let Some(id) = find_created(metal, t, &progress, r)? {
                            record_created(ctx, t.id, r, &id)?;
                            done.push(format!("found {} {id}", r.field()));
                            continue;
                        }
                        return Err(e.into());
                    }
                    Err(e) => {
                        // Refused or rate limited: nothing was created.
                        withdraw_intent(ctx, t.id, r, &me)?;
                        return Err(e.into());
                    }
                }
            }
            Action::FindCreated(r) => {
                let stale = progress.intent.clone();
                match find_created(metal, t, &progress, r)? {
                    Some(id) => {
                        record_created(ctx, t.id, r, &id)?;
                        done.push(format!("found {} {id}", r.field()));
                    }
                    None => {
                        let token = stale.map(|i| i.token).unwrap_or_default();
                        withdraw_intent(ctx, t.id, r, &token)?;
                        done.push(format!("no {} was created; creating", r.field()));
                    }
                }
            }
            Action::WaitForOther(r, s) => {
                return Ok(Report {
                    phase: Phase::InProgress {
                        waiting: format!("another instance is creating the {}", r.field()),
                        retry_after_s: s,
                    },
                    progress,
                    done,
                })
            }
            Action::AwaitGateway => {
                let gw = progress
                    .gateway
                    .as_ref()
                    .map(|g| g.id.clone())
                    .unwrap_or_default();
                let state = metal.get_gateway(&gw)?.map(|g| g.state.unwrap_or_default());
                record(ctx, t.id, |p| {
                    if p.gateway.as_ref().map(|g| g.id.as_str()) != Some(gw.as_str()) {
                        return false;
                    }
                    match &state {
                        // Gone behind our back: create it again.
                        None => {
                            p.gateway = None;
                            p.gateway_state = None;
                        }
                        Some(s) if p.gateway_state.as_ref() == Some(s) => return false,
                        Some(s) => p.gateway_state = Some(s.clone()),
                    }
                    true
                })?;
                if state.as_deref() != Some("active") && state.is_some() {
                    return Ok(Report {
                        phase: Phase::InProgress {
                            waiting: format!("the Metal Gateway is {}", state.unwrap_or_default()),
                            retry_after_s: GATEWAY_POLL_S,
                        },
                        progress: read_progress(ctx, t.id)?,
                        done,
                    });
                }
            }
            Action::Ready => {
                let block = block_of(metal, &progress)?;
                return Ok(Report {
                    phase: Phase::Ready { block },
                    progress,
                    done,
                });
            }
        }
    }
    used_all_rounds(ctx, t.id, done)
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

/// Records a creation intent for `r` by `token` at `now`, unless `r` is
/// held or an intent stands: the one compare-and-swap that makes a
/// creation exclusive. Returns whether it was recorded (this instance may
/// create `r`).
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn claim_intent<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    r: Resource,
    token: &str,
    now: u64,
) -> Result<bool> {
    record(ctx, id, |p| {
        if p.held(r).is_some() || p.intent.is_some() {
            return false;
        }
        p.intent = Some(Intent {
            resource: r,
            token: token.to_string(),
            at: now,
        });
        true
    })
}

/// Records `found` as the pool's `r` (created by metal-ipam), clearing an
/// intent for `r`, unless `r` is already recorded. Returns whether it
/// recorded it: `false` means another is held and `found` is a duplicate.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn record_created<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    r: Resource,
    found: &str,
) -> Result<bool> {
    record(ctx, id, |p| {
        if p.held(r).is_some() {
            return false;
        }
        p.set(
            r,
            Some(Held {
                id: found.to_string(),
                created: true,
            }),
        );
        true
    })
}

/// Clears `token`'s intent for `r`, if it still stands (nothing was
/// created, or nothing was found). Returns whether it did.
///
/// # Errors
/// Store errors; 503 `Contention`.
pub fn withdraw_intent<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &PoolId,
    r: Resource,
    token: &str,
) -> Result<bool> {
    record(ctx, id, |p| match &p.intent {
        Some(i) if i.resource == r && i.token == token => {
            p.intent = None;
            true
        }
        _ => false,
    })
}

fn held_id(progress: &Progress, r: Resource) -> Result<String> {
    progress
        .held(r)
        .map(|h| h.id.clone())
        .ok_or_else(|| Error::internal(format!("the {} is not recorded yet", r.field())))
}

/// Reads an adopted resource and checks it fits the pool.
fn adopt<H: HttpClient + ?Sized, E: Env + ?Sized>(
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
    progress: &Progress,
    r: Resource,
) -> Result<String> {
    let s = t.spec;
    let metro = s.metro.to_ascii_lowercase();
    let missing = |f: &str, what: String| Error::invalid(field(r, f), what);
    match r {
        Resource::Vrf => {
            let id = s.vrf.id.clone().unwrap_or_default();
            let vrf = metal
                .get_vrf(&id)?
                .ok_or_else(|| missing("id", format!("VRF {id} does not exist in the project")))?;
            let vrf_metro = vrf
                .metro
                .and_then(|m| m.code)
                .map(|c| c.to_ascii_lowercase());
            if vrf_metro.as_deref().is_some_and(|m| m != metro) {
                return Err(missing(
                    "id",
                    format!(
                        "VRF {id} is in metro {}, not {metro}",
                        vrf_metro.unwrap_or_default()
                    ),
                ));
            }
            if t.belongs_elsewhere(&vrf.tags) {
                return Err(missing(
                    "id",
                    format!("VRF {id} was created for another metal-ipam pool"),
                ));
            }
            Ok(vrf.id)
        }
        Resource::Reservation => {
            let id = s.reservation.id.clone().unwrap_or_default();
            let vrf = held_id(progress, Resource::Vrf)?;
            match metal.get_ip(&id)? {
                Some(IpAddress::Vrf(res)) if t.belongs_elsewhere(&res.tags) => Err(missing(
                    "id",
                    format!("reservation {id} was created for another metal-ipam pool"),
                )),
                Some(IpAddress::Vrf(res)) if res.vrf.id() == Some(vrf.as_str()) => Ok(res.id),
                Some(IpAddress::Vrf(_)) => Err(missing(
                    "id",
                    format!("reservation {id} belongs to another VRF than {vrf}"),
                )),
                Some(_) => Err(missing("id", format!("{id} is not a VRF IP reservation"))),
                None => Err(missing("id", format!("reservation {id} does not exist"))),
            }
        }
        Resource::Vlan => {
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
                missing(f, what)
            })?;
            if t.belongs_elsewhere(&vlan.tags) {
                return Err(missing(
                    "id",
                    format!("VLAN {} was created for another metal-ipam pool", vlan.id),
                ));
            }
            if vlan.metro().is_some_and(|m| m != metro) {
                return Err(missing(
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
        Resource::Gateway => {
            let id = s.gateway.id.clone().unwrap_or_default();
            let gw = metal
                .get_gateway(&id)?
                .ok_or_else(|| missing("id", format!("Metal Gateway {id} does not exist")))?;
            let res = held_id(progress, Resource::Reservation)?;
            let vlan = held_id(progress, Resource::Vlan)?;
            let on = |x: &Option<crate::metal::model::Ref>, want: &str| {
                x.as_ref().and_then(|r| r.id()) == Some(want)
            };
            if !on(&gw.ip_reservation, &res) || !on(&gw.virtual_network, &vlan) {
                return Err(missing(
                    "id",
                    format!("Metal Gateway {id} does not serve reservation {res} on VLAN {vlan}"),
                ));
            }
            Ok(gw.id)
        }
    }
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
/// gateway, reservation, VLAN, VRF, by deletion policy, the gateway gone
/// before its reservation, and a VLAN to delete unassigned from the ports
/// still carrying it (`POST /ports/{id}/unassign`) before it is deleted.
///
/// # Idempotency
/// Safe to repeat and to run concurrently: deleting what is already gone
/// counts as done, and each result is recorded by compare-and-swap. Once
/// everything is gone the record is a tombstone and invocations write
/// nothing.
///
/// # Errors
/// Metal's refusals (a VLAN that still has ports: 409 `MetalRefused`),
/// 503 when Metal is unavailable, store errors.
pub fn deprovision<K: KvStore, H: HttpClient + ?Sized, E: Env + ?Sized>(
    ctx: &Ctx<'_, K>,
    metal: &Metal<'_, H, E>,
    t: &Target<'_>,
) -> Result<Report> {
    let mut done = Vec::new();
    // Nothing recorded (never provisioned, or already torn down): done,
    // without a write.
    let any = update_record::<K, ProgressRecord, bool>(ctx, t.id, |cur| match cur {
        None => Ok(Step::Done(false)),
        Some(p) if p.deleting => Ok(Step::Done(true)),
        Some(p) => {
            let mut p = p.clone();
            p.deleting = true;
            Ok(Step::Write(Box::new(Some(p)), true))
        }
    })?;
    if !any {
        return Ok(Report {
            phase: Phase::Gone,
            progress: Progress::default(),
            done,
        });
    }
    for _ in 0..MAX_ROUNDS {
        let progress = read_progress(ctx, t.id)?;
        match plan::teardown(t.spec, &progress) {
            Teardown::FindCreated(r) => {
                let token = progress
                    .intent
                    .as_ref()
                    .map(|i| i.token.clone())
                    .unwrap_or_default();
                match find_created(metal, t, &progress, r)? {
                    Some(id) => {
                        record_created(ctx, t.id, r, &id)?;
                    }
                    None => {
                        withdraw_intent(ctx, t.id, r, &token)?;
                    }
                }
            }
            Teardown::Delete(r) => {
                let id = held_id(&progress, r)?;
                if r == Resource::Vlan {
                    // Metal refuses to delete a VLAN still on a port:
                    // unassign it first (Metal's teardown order), then
                    // delete in the next round.
                    let ports = metal.vlan_ports(&id)?;
                    if !ports.is_empty() {
                        for p in &ports {
                            metal.unassign_port(p, &id)?;
                            done.push(format!("unassigned vlan {id} from port {p}"));
                        }
                        continue;
                    }
                }
                delete(metal, r, &id)?;
                record(ctx, t.id, |p| {
                    if p.held(r).map(|h| h.id.as_str()) != Some(id.as_str()) {
                        return false;
                    }
                    if r == Resource::Gateway {
                        p.gateway_state = Some("deleting".into());
                    } else {
                        p.set(r, None);
                    }
                    true
                })?;
                done.push(format!("deleted {} {id}", r.field()));
            }
            Teardown::Release(r) => {
                let id = held_id(&progress, r)?;
                record(ctx, t.id, |p| {
                    if p.held(r).is_none() {
                        return false;
                    }
                    p.set(r, None);
                    if r == Resource::Gateway {
                        p.gateway_state = None;
                    }
                    true
                })?;
                done.push(format!("kept {} {id}", r.field()));
            }
            Teardown::AwaitGatewayGone => {
                let id = held_id(&progress, Resource::Gateway)?;
                let gone = match metal.get_gateway(&id) {
                    Ok(None) => true,
                    // A deleted gateway may answer 403.
                    Err(e) if e.status() == Some(403) => true,
                    Ok(Some(_)) => false,
                    Err(e) => return Err(e.into()),
                };
                if !gone {
                    return Ok(Report {
                        phase: Phase::InProgress {
                            waiting: "the Metal Gateway is being deleted".into(),
                            retry_after_s: GATEWAY_POLL_S,
                        },
                        progress,
                        done,
                    });
                }
                record(ctx, t.id, |p| {
                    if p.gateway.is_none() {
                        return false;
                    }
                    p.set(Resource::Gateway, None);
                    p.gateway_state = None;
                    true
                })?;
                done.push(format!("gateway {id} is gone"));
            }
            Teardown::Done => {
                update_record::<K, ProgressRecord, ()>(ctx, t.id, |cur| match cur {
                    None => Ok(Step::Done(())),
                    Some(_) => Ok(Step::Write(Box::new(None), ())),
                })?;
                return Ok(Report {
                    phase: Phase::Gone,
                    progress: Progress::default(),
                    done,
                });
            }
        }
    }
    used_all_rounds(ctx, t.id, done)
}
