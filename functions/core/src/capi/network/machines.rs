//! Which Machines: the ones a profile or a `PacketMachine` concerns, and
//! the ones the full reconcile syncs (with their rows for the view).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::claims::ClaimsOfMachines;
use super::PROFILE_ANNOTATION;
use crate::capi::device::{device_of, provider_of};
use crate::capi::objects::MachineObject;
use crate::error::{Error, Result};
use crate::ipam::ops;
use crate::kube::object::{Object, ObjectMeta};
use crate::kube::{self, Kube, KubeError};
use crate::kv::Ctx;
use crate::network::apply::{self};
use crate::network::profile::{bonds, Profile};
use crate::observe::summary::{MachineRow, PortRow};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;

/// Every object of a kind; none when the API server does not serve it (a
/// cluster without CAPI's Machines or CAPP's `PacketMachine`s).
fn list_or_none<H: HttpClient + ?Sized, T: Object>(
    kube: &Kube<'_, H>,
    r: &kube::Resource,
    ns: Option<&str>,
) -> Result<Vec<T>> {
    match kube.list_as(r, ns) {
        Ok(v) => Ok(v),
        Err(KubeError::NotFound(_)) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// A Machine, the profile annotation it is opted in by (its own, else its
/// `PacketMachine`'s; unchecked) and its device.
struct Listed {
    machine: MachineObject,
    profile: Option<String>,
    device: Option<String>,
}

/// The Machines of a namespace (or of all, `None`), not deleting, as
/// [`Listed`]. Two lists (Machines, `PacketMachine`s; a cluster without
/// CAPP's kind has none).
fn machines_with_profiles<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: Option<&str>,
) -> Result<Vec<Listed>> {
    let machines: Vec<MachineObject> = list_or_none(kube, &kube::MACHINES, ns)?;
    let infra: Vec<MachineObject> = list_or_none(kube, &kube::PACKET_MACHINES, ns)?;
    let mut out = Vec::new();
    for m in machines {
        if m.metadata.deleting() {
            continue;
        }
        let pm = match &m.infrastructure {
            Some((kind, iname)) if kind == "PacketMachine" => infra.iter().find(|i| {
                i.metadata.name == *iname && i.metadata.namespace == m.metadata.namespace
            }),
            _ => None,
        };
        let profile = m
            .metadata
            .annotation(PROFILE_ANNOTATION)
            .or_else(|| pm.and_then(|i| i.metadata.annotation(PROFILE_ANNOTATION)))
            .map(str::to_string);
        let device = provider_of(&m, pm).and_then(device_of).map(str::to_string);
        out.push(Listed {
            machine: m,
            profile,
            device,
        });
    }
    Ok(out)
}

/// The Machines of namespace `ns` that use profile `profile` (their
/// annotation, or their `PacketMachine`'s, names it), sorted: what a
/// profile's event is routed to, and what keeps the webhook from deleting
/// it.
///
/// # Errors
/// API server errors.
pub fn machines_using<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    profile: &str,
) -> Result<Vec<String>> {
    let mut out: Vec<String> = machines_with_profiles(kube, Some(ns))?
        .into_iter()
        .filter(|l| l.profile.as_deref() == Some(profile))
        .map(|l| l.machine.metadata.name)
        .collect();
    out.sort();
    Ok(out)
}

/// The Machines of namespace `ns` whose `spec.infrastructureRef` is the
/// `PacketMachine` `pm` (what its event is routed to). One list.
///
/// # Errors
/// API server errors.
pub fn machines_of_packet_machine<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    ns: &str,
    pm: &str,
) -> Result<Vec<String>> {
    let machines: Vec<MachineObject> = list_or_none(kube, &kube::MACHINES, Some(ns))?;
    let mut out: Vec<String> = machines
        .into_iter()
        .filter(|m| {
            m.infrastructure
                .as_ref()
                .is_some_and(|(k, n)| k == "PacketMachine" && n == pm)
        })
        .map(|m| m.metadata.name)
        .collect();
    out.sort();
    Ok(out)
}

/// What [`machines_to_sync`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToSync {
    /// `(namespace, name)` of every Machine to sync: opted in, or on a
    /// device with our apply record (a release to finish, or to remember).
    pub machines: Vec<(String, String)>,
    /// Claims deleted of Machines that are not opted in and whose device
    /// has no record of ours (claims made while a Machine waited for its
    /// device, then its annotation removed).
    pub claims_deleted: usize,
    /// The Machines to sync as the observation summary lists them, in the
    /// order of `machines` (phase left empty: the network step's answer
    /// gives it); each profile is read once per run.
    pub rows: Vec<MachineRow>,
}

/// The Machines a full reconciliation syncs (see [`ToSync`]), from two
/// lists (Machines, `PacketMachine`s) and the devices with an apply record
/// (`network::apply::devices`: their index); `claims` are
/// the claims the reconciliation listed, whose profile claims of Machines
/// that are neither opted in nor applied to are deleted here.
///
/// # Idempotency
/// Claims already deleting are left alone.
///
/// # Errors
/// API server and store errors.
pub fn machines_to_sync<'c, K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    claims: impl Iterator<Item = &'c ObjectMeta>,
) -> Result<ToSync> {
    let machines = machines_with_profiles(kube, None)?;
    let recorded: BTreeSet<String> = apply::devices(ctx)?.into_iter().collect();
    let claims: Vec<&ObjectMeta> = claims.collect();
    let grouped = ClaimsOfMachines::new(&claims);
    let mut out = ToSync::default();
    let mut idle: Vec<(String, String, String)> = Vec::new();
    let mut profiles = BTreeMap::new();
    for Listed {
        machine: m,
        profile,
        device,
    } in &machines
    {
        let ns = m.metadata.namespace.clone().unwrap_or_default();
        let name = m.metadata.name.clone();
        if profile.is_some() || device.as_ref().is_some_and(|d| recorded.contains(d)) {
            let row = machine_row(ctx, kube, &mut profiles, (m, profile, device), &grouped);
            out.rows.push(row);
            out.machines.push((ns, name));
        } else if let Some(uid) = &m.metadata.uid {
            idle.push((ns, name, uid.clone()));
        }
    }
    // The idle Machines' own claims (owned by them), deleted once each, in
    // the order listed.
    let mut orphans: BTreeSet<(&str, &str)> = BTreeSet::new();
    for (ns, name, uid) in &idle {
        for c in grouped.of(ns, name).into_iter().filter(|c| c.owned_by(uid)) {
            orphans.insert((ns.as_str(), c.name.as_str()));
        }
    }
    for c in claims {
        let ns = c.namespace.as_deref().unwrap_or_default();
        if orphans.contains(&(ns, c.name.as_str()))
            && kube.delete(&kube::CLAIMS, Some(ns), &c.name)?
        {
            out.claims_deleted += 1;
        }
    }
    Ok(out)
}

/// A Machine to sync as the observation summary lists it: its profile's
/// bonds with their modes and VLANs (each profile read once per run,
/// `profiles`) and the addresses its per-VLAN claims are bound to.
fn machine_row<K: KvStore, H: HttpClient + ?Sized>(
    ctx: &Ctx<'_, K>,
    kube: &Kube<'_, H>,
    profiles: &mut BTreeMap<(String, String), std::result::Result<Profile, String>>,
    (m, profile, device): (&MachineObject, &Option<String>, &Option<String>),
    claims: &ClaimsOfMachines<'_>,
) -> MachineRow {
    let ns = m.metadata.namespace.clone().unwrap_or_default();
    let name = m.metadata.name.clone();
    let mut row = MachineRow {
        namespace: ns.clone(),
        name: name.clone(),
        cluster: m.cluster.clone(),
        profile: profile.clone(),
        device: device.clone(),
        phase: String::new(),
        ports: Vec::new(),
        addresses: BTreeMap::new(),
        error: None,
    };
    if let Some(p) = profile {
        let read = profiles.entry((ns.clone(), p.clone())).or_insert_with(|| {
            let object = kube
                .get(&kube::NETWORK_PROFILES, Some(&ns), p)
                .map_err(|e| Error::from(e).to_string())?
                .ok_or_else(|| format!("MetalNetworkProfile {ns}/{p} does not exist"))?;
            Profile::from_json(object.get("spec").unwrap_or(&Value::Null))
                .map_err(|e| e.to_string())
        });
        match read {
            Ok(profile) => row.ports = port_rows(profile),
            Err(e) => row.error = Some(e.clone()),
        }
    }
    for c in claims.of(&ns, &name) {
        if let Ok(Some(b)) = ops::get_claim(ctx.kv, &ns, &c.name) {
            row.addresses
                .insert(c.name.clone(), format!("{}/{}", b.address, b.prefix));
        }
    }
    row
}

/// A profile's bonds with their modes and the VLANs on each bond and its
/// members.
fn port_rows(profile: &Profile) -> Vec<PortRow> {
    let modes = profile.modes();
    bonds(profile.eth_ports())
        .into_iter()
        .map(|(bond, members)| {
            let vlans = std::iter::once(bond)
                .chain(members)
                .filter_map(|p| profile.port(p))
                .flat_map(|p| &p.vlans)
                .map(|v| match (v.vxlan, &v.pool, &v.id) {
                    (Some(n), _, _) => n.to_string(),
                    (None, Some(pool), _) => format!("pool {}", pool.name),
                    (None, None, Some(id)) => format!("id {id}"),
                    (None, None, None) => "?".to_string(),
                })
                .collect();
            PortRow {
                port: bond.to_string(),
                mode: modes.get(bond).map_or("layer3", |m| m.as_str()).to_string(),
                vlans,
            }
        })
        .collect()
}
