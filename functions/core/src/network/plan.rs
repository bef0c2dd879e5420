//! The port plan: from the ports as Metal reports them ([`Observed`]) and
//! as the profile wants them ([`Desired`], VLANs resolved to UUIDs), the
//! Metal port calls that get there, in order ([`plan`]). Pure.
//!
//! # Order
//! Per bond (bond0, then bond1 on 4-port devices), in Metal's safe order:
//! native VLANs off, VLANs off (one batch per port), disbond, convert to
//! layer2, bond, convert to layer3, VLANs on (one batch per port), native
//! VLANs on. One exception, from packngo: layer3 → layer2-individual
//! converts the bond to layer2 *before* disbonding it (Metal refuses to
//! disbond a Layer3 bond port). A port whose state is already right gets
//! no call: a converged device plans nothing.
//!
//! # Transitions
//! Direct (the conversion table of the Metal notes, §4.2): layer3 to and
//! from each of hybrid-bonded, hybrid, layer2-bonded and layer2-individual,
//! and between layer2-bonded and layer2-individual. Every other change
//! (e.g. hybrid → layer2-bonded, which Metal refuses with `bond0 is
//! already configured for Layer 2`) goes through layer3: the plan to
//! layer3 without VLANs, then the plan from there. A mode change takes
//! every VLAN off the bond's ports first and puts the wanted ones back
//! after (Metal refuses to bond or convert to layer3 a port with VLANs).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::profile::{bonds, Mode, Profile, VlanRef};
use crate::cloud::DeviceView;
use crate::error::{Error, Result};

/// A port as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedPort {
    /// Metal's UUID.
    pub id: String,
    /// `bond0`, `eth1`, ….
    pub name: String,
    /// In its bond (bond port: bonded at all).
    pub bonded: bool,
    /// The bond's mode as Metal reports it (bond ports).
    pub mode: Option<Mode>,
    /// Assigned VLANs' UUIDs.
    pub vlans: BTreeSet<String>,
    /// The native VLAN's UUID.
    pub native: Option<String>,
}

/// A device's ports as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `network_frozen`: mode changes are refused.
    pub frozen: bool,
    /// Its ports.
    pub ports: Vec<ObservedPort>,
}

impl Observed {
    /// From the device with its NICs ([`crate::cloud::Cloud::device_nics`]:
    /// on Metal `GET /devices/{id}?include=network_ports`).
    ///
    /// # Errors
    /// 500 `MetalMalformed` when a port has no name.
    pub fn from_device(d: &DeviceView) -> Result<Observed> {
        let mut ports = Vec::new();
        for p in &d.nics {
            let name = p.name.clone().ok_or_else(|| {
                Error::new(
                    crate::ErrorKind::Internal,
                    "MetalMalformed",
                    format!("port {} of device {} has no name", p.id, d.id),
                )
            })?;
            ports.push(ObservedPort {
                id: p.id.clone(),
                bonded: p.bonded.unwrap_or(true),
                mode: p.mode.as_deref().and_then(Mode::parse),
                vlans: p.segments.iter().cloned().collect(),
                native: p.native.clone(),
                name,
            });
        }
        Ok(Observed {
            frozen: d.frozen,
            ports,
        })
    }

    fn port(&self, name: &str) -> Option<&ObservedPort> {
        self.ports.iter().find(|p| p.name == name)
    }

    /// Ethernet ports on the device.
    pub fn eth_ports(&self) -> usize {
        self.ports
            .iter()
            .filter(|p| p.name.starts_with("eth"))
            .count()
    }
}

/// A port as the profile wants it, VLANs resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPort {
    /// `bond0`, `eth1`, ….
    pub name: String,
    /// In its bond.
    pub bonded: bool,
    /// Layer2 (bond ports).
    pub layer2: bool,
    /// VLAN UUIDs.
    pub vlans: BTreeSet<String>,
    /// Native VLAN UUID.
    pub native: Option<String>,
}

/// Every port of the device as wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The ports (all of the device's).
    pub ports: Vec<DesiredPort>,
}

impl Desired {
    /// The desired state of every port of a device with `eth_ports`
    /// Ethernet ports from a validated profile; `resolve` gives a VLAN's
    /// UUID (looked up in Metal by the caller).
    ///
    /// # Errors
    /// 422 naming the VLAN that `resolve` does not know; 422 when the
    /// profile describes ports the device lacks.
    pub fn from_profile(
        profile: &Profile,
        eth_ports: usize,
        resolve: &dyn Fn(&VlanRef) -> Option<String>,
    ) -> Result<Desired> {
        if profile.eth_ports() > eth_ports {
            return Err(Error::invalid(
                "spec.ports",
                format!("the profile is for a 4-port device; this one has {eth_ports} ports"),
            ));
        }
        // The device's layout decides the bonds' members: the rules again
        // with it (a 2-port profile's unbonded eth1 is bond1's first
        // member on a 4-port device).
        let profile = &profile.on_device(eth_ports);
        profile.validate()?;
        let mut ports = Vec::new();
        for (bond, members) in bonds(eth_ports) {
            for name in std::iter::once(bond).chain(members) {
                let flags = profile.flags(name);
                let spec = profile.port(name);
                let i = profile.ports.iter().position(|p| p.name == name);
                let mut vlans = BTreeSet::new();
                for (j, v) in spec
                    .map(|s| s.vlans.as_slice())
                    .unwrap_or(&[])
                    .iter()
                    .enumerate()
                {
                    let id = resolve(&v.vlan()).ok_or_else(|| {
                        Error::invalid(
                            format!("spec.ports[{}].vlans[{j}]", i.unwrap_or(0)),
                            "this VLAN does not exist in Metal",
                        )
                    })?;
                    vlans.insert(id);
                }
                let native = match spec.and_then(|s| s.native_vlan.as_ref()) {
                    None => None,
                    Some(n) => Some(resolve(n).ok_or_else(|| {
                        Error::invalid(
                            format!("spec.ports[{}].nativeVLAN", i.unwrap_or(0)),
                            "this VLAN does not exist in Metal",
                        )
                    })?),
                };
                ports.push(DesiredPort {
                    name: name.to_string(),
                    bonded: flags.bonded,
                    layer2: flags.layer2,
                    vlans,
                    native,
                });
            }
        }
        Ok(Desired { ports })
    }

    fn port(&self, name: &str) -> Option<&DesiredPort> {
        self.ports.iter().find(|p| p.name == name)
    }

    /// What a released device goes back to: every port bonded, Layer3,
    /// without VLANs (Metal's default).
    pub fn teardown(observed: &Observed) -> Desired {
        Desired {
            ports: observed
                .ports
                .iter()
                .map(|p| DesiredPort {
                    name: p.name.clone(),
                    bonded: true,
                    layer2: false,
                    vlans: BTreeSet::new(),
                    native: None,
                })
                .collect(),
        }
    }
}

/// One Metal port call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `DELETE /ports/{id}/native-vlan`.
    RemoveNative,
    /// A batch unassigning these VLANs (`state: unassigned`).
    Unassign(Vec<String>),
    /// `POST /ports/{id}/disbond` (`bulk_disable` for a bond port).
    Disbond {
        /// Both members at once (a bond port).
        bulk: bool,
    },
    /// `POST /ports/{id}/convert/layer-2`.
    ConvertLayer2,
    /// `POST /ports/{id}/bond` (`bulk_enable` for a bond port).
    Bond {
        /// Both members at once (a bond port).
        bulk: bool,
    },
    /// `POST /ports/{id}/convert/layer-3` (new management addresses).
    ConvertLayer3,
    /// A batch assigning these VLANs (`state: assigned`).
    Assign(Vec<String>),
    /// `POST /ports/{id}/native-vlan?vnid=…`.
    SetNative(String),
}

impl Action {
    /// Short name for plans and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Action::RemoveNative => "remove-native-vlan",
            Action::Unassign(_) => "unassign-vlans",
            Action::Disbond { .. } => "disbond",
            Action::ConvertLayer2 => "convert-layer2",
            Action::Bond { .. } => "bond",
            Action::ConvertLayer3 => "convert-layer3",
            Action::Assign(_) => "assign-vlans",
            Action::SetNative(_) => "set-native-vlan",
        }
    }

    /// Whether it changes the port's mode (refused on a frozen device).
    pub fn changes_mode(&self) -> bool {
        matches!(
            self,
            Action::Disbond { .. }
                | Action::ConvertLayer2
                | Action::Bond { .. }
                | Action::ConvertLayer3
        )
    }
}

/// One step of a plan: an action on a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortStep {
    /// Port name.
    pub port: String,
    /// Port UUID.
    pub port_id: String,
    /// What to do.
    pub action: Action,
}

impl PortStep {
    /// As JSON (what `dryRun` answers).
    pub fn to_json(&self) -> Value {
        let mut v =
            json!({"port": self.port, "portId": self.port_id, "action": self.action.name()});
        match &self.action {
            Action::Unassign(ids) | Action::Assign(ids) => v["vlans"] = json!(ids),
            Action::SetNative(id) => v["vlan"] = json!(id),
            Action::Disbond { bulk } | Action::Bond { bulk } => v["bulk"] = json!(bulk),
            _ => {}
        }
        v
    }
}

/// A bond group's state: its mode and each port's VLANs and native VLAN,
/// by name (bond first, then its members).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Group {
    mode: Mode,
    ports: Vec<(String, String, BTreeSet<String>, Option<String>)>,
}

impl Group {
    fn emptied(&self, mode: Mode) -> Group {
        Group {
            mode,
            ports: self
                .ports
                .iter()
                .map(|(n, id, _, _)| (n.clone(), id.clone(), BTreeSet::new(), None))
                .collect(),
        }
    }
}

/// The mode of a bond from its flags: the rules of
/// [`Profile::modes`](super::profile::Profile::modes).
fn mode_of(layer2: bool, bond_bonded: bool, members_bonded: &[bool], bond_vlans: bool) -> Mode {
    if layer2 {
        if bond_bonded {
            Mode::Layer2Bonded
        } else {
            Mode::Layer2Individual
        }
    } else if members_bonded.iter().any(|b| !b) {
        Mode::Hybrid
    } else if bond_vlans {
        Mode::HybridBonded
    } else {
        Mode::Layer3
    }
}

/// The calls that change a bond's mode directly, or `None` when Metal
/// does not (the plan then goes through layer3).
fn mode_calls(
    from: Mode,
    to: Mode,
    bond: &(String, String),
    second: &(String, String),
) -> Option<Vec<PortStep>> {
    let on = |p: &(String, String), action: Action| PortStep {
        port: p.0.clone(),
        port_id: p.1.clone(),
        action,
    };
    use Mode::*;
    Some(match (from, to) {
        (a, b) if a == b => vec![],
        (Layer3, HybridBonded) | (HybridBonded, Layer3) => vec![],
        (Layer3, Hybrid) => vec![on(second, Action::Disbond { bulk: false })],
        (Hybrid, Layer3) => vec![on(second, Action::Bond { bulk: false })],
        (Layer3, Layer2Bonded) => vec![on(bond, Action::ConvertLayer2)],
        (Layer2Bonded, Layer3) => vec![on(bond, Action::ConvertLayer3)],
        (Layer3, Layer2Individual) => vec![
            on(bond, Action::ConvertLayer2),
            on(bond, Action::Disbond { bulk: true }),
        ],
        (Layer2Individual, Layer3) => vec![
            on(bond, Action::Bond { bulk: true }),
            on(bond, Action::ConvertLayer3),
        ],
        (Layer2Individual, Layer2Bonded) => vec![on(bond, Action::Bond { bulk: true })],
        (Layer2Bonded, Layer2Individual) => vec![on(bond, Action::Disbond { bulk: true })],
        _ => return None,
    })
}

fn plan_group(cur: &Group, want: &Group) -> Vec<PortStep> {
    let bond = (cur.ports[0].0.clone(), cur.ports[0].1.clone());
    let second = (cur.ports[2].0.clone(), cur.ports[2].1.clone());
    let step = |i: usize, action: Action| PortStep {
        port: cur.ports[i].0.clone(),
        port_id: cur.ports[i].1.clone(),
        action,
    };
    let same = cur.mode == want.mode
        || matches!(
            (cur.mode, want.mode),
            (Mode::Layer3, Mode::HybridBonded) | (Mode::HybridBonded, Mode::Layer3)
        );
    let Some(calls) = mode_calls(cur.mode, want.mode, &bond, &second) else {
        let mid = cur.emptied(Mode::Layer3);
        let mut steps = plan_group(cur, &mid);
        steps.extend(plan_group(&mid, want));
        return steps;
    };
    let mut steps = Vec::new();
    // Off: native VLANs, then VLANs (all of them when the mode changes).
    for (i, ((_, _, cv, cn), (_, _, wv, wn))) in cur.ports.iter().zip(&want.ports).enumerate() {
        if cn.is_some() && (!same || cn != wn || wn.as_ref().is_some_and(|n| !wv.contains(n))) {
            steps.push(step(i, Action::RemoveNative));
        }
        let off: Vec<String> = if same {
            cv.difference(wv).cloned().collect()
        } else {
            cv.iter().cloned().collect()
        };
        if !off.is_empty() {
            steps.push(step(i, Action::Unassign(off)));
        }
    }
    steps.extend(calls);
    // On: VLANs, then native VLANs.
    for (i, ((_, _, cv, cn), (_, _, wv, wn))) in cur.ports.iter().zip(&want.ports).enumerate() {
        let on: Vec<String> = if same {
            wv.difference(cv).cloned().collect()
        } else {
            wv.iter().cloned().collect()
        };
        if !on.is_empty() {
            steps.push(step(i, Action::Assign(on)));
        }
        let removed = steps
            .iter()
            .any(|s| s.port == cur.ports[i].0 && s.action == Action::RemoveNative);
        if let Some(n) = wn {
            if removed || cn.as_ref() != Some(n) {
                steps.push(step(i, Action::SetNative(n.clone())));
            }
        }
    }
    steps
}

/// The Metal port calls that bring `observed` to `desired` (see the module
/// docs for the order); empty when the device is already so.
///
/// # Errors
/// 409 `NetworkFrozen` when a mode change is needed on a `network_frozen`
/// device; 422 when a port of the device is missing from `desired` or the
/// other way round.
pub fn plan(observed: &Observed, desired: &Desired) -> Result<Vec<PortStep>> {
    let mut steps = Vec::new();
    for (bond, members) in bonds(observed.eth_ports()) {
        let names: Vec<&str> = std::iter::once(bond)
            .chain(members.iter().copied())
            .collect();
        let mut cur_ports = Vec::new();
        let mut want_ports = Vec::new();
        for n in &names {
            let o = observed.port(n).ok_or_else(|| {
                Error::new(
                    crate::ErrorKind::Internal,
                    "MetalMalformed",
                    format!("the device has no port {n}"),
                )
            })?;
            let w = desired
                .port(n)
                .ok_or_else(|| Error::invalid("spec.ports", format!("no desired state for {n}")))?;
            cur_ports.push((
                o.name.clone(),
                o.id.clone(),
                o.vlans.clone(),
                o.native.clone(),
            ));
            want_ports.push((
                w.name.clone(),
                o.id.clone(),
                w.vlans.clone(),
                w.native.clone(),
            ));
        }
        let ob = observed.port(bond).expect("checked above");
        let members_bonded: Vec<bool> = members
            .iter()
            .map(|m| observed.port(m).is_some_and(|p| p.bonded))
            .collect();
        let cur_mode = ob
            .mode
            .unwrap_or_else(|| mode_of(false, ob.bonded, &members_bonded, !ob.vlans.is_empty()));
        let wb = desired.port(bond).expect("checked above");
        let want_members: Vec<bool> = members
            .iter()
            .map(|m| desired.port(m).is_some_and(|p| p.bonded))
            .collect();
        let want_mode = mode_of(wb.layer2, wb.bonded, &want_members, !wb.vlans.is_empty());
        let group_steps = plan_group(
            &Group {
                mode: cur_mode,
                ports: cur_ports,
            },
            &Group {
                mode: want_mode,
                ports: want_ports,
            },
        );
        if observed.frozen && group_steps.iter().any(|s| s.action.changes_mode()) {
            return Err(Error::conflict(
                "NetworkFrozen",
                format!(
                    "the device is network_frozen: {bond} cannot change from {} to {}",
                    cur_mode.as_str(),
                    want_mode.as_str()
                ),
            ));
        }
        steps.extend(group_steps);
    }
    Ok(steps)
}
