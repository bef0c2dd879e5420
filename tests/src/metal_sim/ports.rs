//! Ports: bonding and disbonding, Layer 2 / Layer 3 conversion (with the
//! management addresses of a Layer 3 bond), native VLANs, VLAN assignment
//! batches, and how long mode changes and batches take (counted in reads,
//! not time). A child of `state`, whose records and helpers it uses.

use metal_ipam_core::ip::{from_u128, Family};
use serde_json::{json, Value};

use super::{
    href, href_obj, mix, now_rfc3339, refuse, uuid_of, Answer, ApiError, Assignment, Call, Device,
    Inc, Port, State,
};

// ---------------------------------------------------------------------------
// Texts of the refusals (422) that are the simulator's own choice
// ---------------------------------------------------------------------------

/// Bond, disbond or convert on a device with `network_frozen`.
pub(super) const FROZEN: &str = "This device's network is frozen: bonding, disbonding and \
     converting between Layer 2 and Layer 3 are not permitted";

fn busy(port: &str) -> String {
    format!("Another operation is in progress on port {port}; try again when it has completed")
}

/// The management addresses a Layer 3 bond gets by default (Metal's
/// default for a new device): public IPv4, private IPv4, public IPv6.
const DEFAULT_IPS: [(Family, bool); 3] =
    [(Family::V4, true), (Family::V4, false), (Family::V6, true)];

fn ip_kind((family, public): (Family, bool)) -> &'static str {
    match (family, public) {
        (Family::V4, true) => "public IPv4",
        (Family::V4, false) => "private IPv4",
        (Family::V6, true) => "public IPv6",
        (Family::V6, false) => "private IPv6",
    }
}

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

/// A VLAN assignment batch's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchState {
    /// Created, not started.
    Queued,
    /// Started; nothing applied yet.
    InProgress,
    /// Applied.
    Completed,
    /// Refused as a whole (`error_messages`); nothing applied.
    Failed,
}

impl BatchState {
    /// The API's name: `queued`, `in_progress`, `completed`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Queued => "queued",
            BatchState::InProgress => "in_progress",
            BatchState::Completed => "completed",
            BatchState::Failed => "failed",
        }
    }

    /// `completed` or `failed`.
    pub fn is_final(self) -> bool {
        matches!(self, BatchState::Completed | BatchState::Failed)
    }
}

/// One VLAN of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEntry {
    /// UUID.
    pub id: String,
    /// The VLAN.
    pub vlan_id: String,
    /// Its number.
    pub vxlan: u16,
    /// `state: assigned` (else `unassigned`).
    pub assigned: bool,
    /// To become the port's native VLAN.
    pub native: bool,
}

/// A port's VLAN assignment batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VlanBatch {
    /// UUID.
    pub id: String,
    /// The port.
    pub port_id: String,
    /// State.
    pub state: BatchState,
    /// The VLANs, as requested.
    pub entries: Vec<BatchEntry>,
    /// Why it failed.
    pub error_messages: Vec<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Last change (RFC 3339).
    pub updated_at: String,
    /// Reads left before it is finished.
    pub reads_left: u32,
    /// The failure it is bound to (`MetalSim::fail_next_batch`).
    fail: Option<String>,
}

/// A bond, disbond or convert accepted and not yet in effect.
#[derive(Debug, Clone)]
pub(crate) struct PendingChange {
    device_id: String,
    /// The bond whose ports it changes.
    bond: String,
    /// The port the request named.
    port_id: String,
    reads_left: u32,
    change: ModeChange,
}

#[derive(Debug, Clone)]
enum ModeChange {
    /// These ethernet ports join their bond.
    Bond(Vec<String>),
    /// These ethernet ports leave their bond.
    Disbond(Vec<String>),
    /// The bond goes Layer 2, losing its management addresses.
    Layer2,
    /// The bond goes Layer 3 with new management addresses of these kinds.
    Layer3(Vec<(Family, bool)>),
}

/// The bond a port belongs to (a bond port: itself).
pub(super) fn group(p: &Port) -> &str {
    if p.is_bond {
        &p.name
    } else {
        p.bond.as_deref().unwrap_or("bond0")
    }
}

impl Device {
    /// The ethernet ports of bond `bond`.
    pub fn members<'a>(&'a self, bond: &'a str) -> impl Iterator<Item = &'a Port> + 'a {
        self.ports
            .iter()
            .filter(move |p| p.bond.as_deref() == Some(bond))
    }

    /// The `network_type` of bond port `bond`: Layer 2 with every member
    /// bonded `layer2-bonded`, else `layer2-individual`; Layer 3 with a
    /// member out of the bond `hybrid`, else `hybrid-bonded` with VLANs on
    /// the bond and `layer3` without. `None` if there is no such bond.
    pub fn network_type(&self, bond: &str) -> Option<&'static str> {
        let b = self.port(bond).filter(|p| p.is_bond)?;
        let all_bonded = self.members(bond).all(|p| p.bonded);
        Some(match (b.layer2, all_bonded) {
            (true, true) => "layer2-bonded",
            (true, false) => "layer2-individual",
            (false, false) => "hybrid",
            (false, true) if b.vlans.is_empty() => "layer3",
            (false, true) => "hybrid-bonded",
        })
    }
}

/// A bond port is up while one of its members is bonded.
fn sync_bonds(d: &mut Device) {
    let up: Vec<(String, bool)> = d
        .ports
        .iter()
        .filter(|p| p.is_bond)
        .map(|b| (b.name.clone(), d.members(&b.name).any(|p| p.bonded)))
        .collect();
    for (name, bonded) in up {
        if let Some(b) = d.ports.iter_mut().find(|p| p.name == name) {
            b.bonded = bonded;
        }
    }
}

/// Whether VLANs may be assigned to the port: an ethernet port must be
/// out of its bond, a bond port up.
pub(super) fn check_can_carry_vlans(p: &Port) -> Result<(), ApiError> {
    if !p.is_bond && p.bonded {
        return refuse(format!(
            "Port {} is bonded: disbond it before assigning virtual networks",
            p.name
        ));
    }
    if p.is_bond && !p.bonded {
        return refuse(format!(
            "Port {} is not bonded: assign virtual networks to its ethernet ports",
            p.name
        ));
    }
    Ok(())
}

/// The native VLAN rules: not on a Layer 3 bond port, one of the port's
/// VLANs, which are two or more.
fn check_native(p: &Port, vlan_id: &str, vxlan: u16, vlans: &[String]) -> Result<(), String> {
    if p.is_bond && !p.layer2 {
        return Err(format!(
            "A native VLAN is not supported on the Layer 3 bond port {} (hybrid-bonded mode)",
            p.name
        ));
    }
    if !vlans.iter().any(|v| v == vlan_id) {
        return Err(format!(
            "Virtual network {vxlan} must be assigned to the port before it can be its native VLAN"
        ));
    }
    if vlans.len() < 2 {
        return Err("A native VLAN needs at least 2 virtual networks on the port".into());
    }
    Ok(())
}

fn bond_change(d: &Device, p: &Port, bulk: bool) -> Result<ModeChange, ApiError> {
    let bond = group(p);
    let targets: Vec<&Port> = if p.is_bond || bulk {
        d.members(bond).collect()
    } else {
        vec![p]
    };
    let todo: Vec<&Port> = targets.into_iter().filter(|q| !q.bonded).collect();
    if todo.is_empty() {
        return refuse(format!("Port {} is already bonded", p.name));
    }
    if let Some(q) = todo.iter().find(|q| !q.vlans.is_empty()) {
        return refuse(format!(
            "Port {} has virtual networks assigned: unassign them before bonding it",
            q.name
        ));
    }
    Ok(ModeChange::Bond(
        todo.iter().map(|q| q.id.clone()).collect(),
    ))
}

fn disbond_change(d: &Device, p: &Port, bulk: bool) -> Result<ModeChange, ApiError> {
    let bond_name = group(p);
    let Some(bond) = d.port(bond_name) else {
        return Err(ApiError::not_found());
    };
    let whole = p.is_bond || bulk;
    let targets: Vec<&Port> = if whole {
        d.members(bond_name).collect()
    } else {
        vec![p]
    };
    let todo: Vec<&Port> = targets.into_iter().filter(|q| q.bonded).collect();
    if todo.is_empty() {
        return refuse(format!("Port {} is already disbonded", p.name));
    }
    let left = d
        .members(bond_name)
        .filter(|q| q.bonded && !todo.iter().any(|t| t.id == q.id))
        .count();
    if !bond.layer2 {
        if whole {
            return refuse(format!(
                "{bond_name} is a Layer 3 bond port and cannot be disbonded; convert it to Layer 2 first"
            ));
        }
        if left == 0 {
            return refuse(format!(
                "Port {} is the last bonded port of {bond_name}, which is in Layer 3: it cannot be disbonded",
                p.name
            ));
        }
    } else if left == 0 && !bond.vlans.is_empty() {
        return refuse(format!(
            "Port {bond_name} has virtual networks assigned: unassign them before disbonding it"
        ));
    }
    Ok(ModeChange::Disbond(
        todo.iter().map(|q| q.id.clone()).collect(),
    ))
}

fn layer2_change(d: &Device, p: &Port) -> Result<ModeChange, ApiError> {
    if !p.is_bond {
        return refuse(format!(
            "Port {} is not a bond port: only bond ports can be converted to Layer 2",
            p.name
        ));
    }
    // A hybrid bond (a member out of the bond) answers as Metal did for
    // hybrid → layer2-bonded (terraform-provider-equinix #143).
    if p.layer2 || d.members(&p.name).any(|q| !q.bonded) {
        return refuse(format!("{} is already configured for Layer 2", p.name));
    }
    Ok(ModeChange::Layer2)
}

/// `request_ips` of a convert/layer-3 (absent or empty: [`DEFAULT_IPS`]).
fn request_ips(call: &Call<'_>) -> Result<Vec<(Family, bool)>, ApiError> {
    let Some(list) = call
        .field("request_ips")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
    else {
        return Ok(DEFAULT_IPS.to_vec());
    };
    let mut out = Vec::new();
    for item in list {
        let family = match item.get("address_family").and_then(Value::as_u64) {
            Some(4) => Family::V4,
            Some(6) => Family::V6,
            _ => return refuse("request_ips: address_family must be 4 or 6"),
        };
        let public = item.get("public").and_then(Value::as_bool).unwrap_or(false);
        if family == Family::V6 && !public {
            return refuse("request_ips: private IPv6 addresses are not available");
        }
        if out.contains(&(family, public)) {
            return refuse(format!(
                "request_ips: {} is requested twice",
                ip_kind((family, public))
            ));
        }
        out.push((family, public));
    }
    Ok(out)
}

/// A stable UUID for a port's assignment of a VLAN.
fn assignment_id(port_id: &str, vlan_id: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in port_id.bytes().chain([0]).chain(vlan_id.bytes()) {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let hi = mix(h);
    uuid_of(hi, mix(hi ^ h.rotate_left(32)))
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

impl State {
    /// Whether a mode change of the device's bond `bond` is pending.
    fn changing(&self, device_id: &str, bond: &str) -> bool {
        self.pending
            .iter()
            .any(|c| c.device_id == device_id && c.bond == bond)
    }

    /// Whether a batch of the port is not finished.
    fn batch_running(&self, port_id: &str) -> bool {
        self.batches
            .iter()
            .any(|b| b.port_id == port_id && !b.state.is_final())
    }

    /// A VLAN operation on `p` must wait for a mode change of its bond and
    /// for the port's own batch.
    pub(super) fn check_vlan_op_free(&self, d: &Device, p: &Port) -> Result<(), ApiError> {
        if self.changing(&d.id, group(p)) || self.batch_running(&p.id) {
            return refuse(busy(&p.name));
        }
        Ok(())
    }

    /// A mode change must wait for another of the bond and for the
    /// batches of every port of the bond.
    fn check_mode_op_free(&self, d: &Device, p: &Port) -> Result<(), ApiError> {
        let bond = group(p);
        let batches = d
            .ports
            .iter()
            .filter(|q| group(q) == bond)
            .any(|q| self.batch_running(&q.id));
        if self.changing(&d.id, bond) || batches {
            return refuse(busy(&p.name));
        }
        Ok(())
    }

    /// `bondPort`, `disbondPort`, `convertLayer2`, `convertLayer3`: checked
    /// now, in effect after `port_reads` reads.
    pub(super) fn mode_op(&mut self, call: &Call<'_>) -> Answer {
        let (d, p) = self.port(call.param("id"))?;
        if d.network_frozen {
            return refuse(FROZEN);
        }
        self.check_mode_op_free(&d, &p)?;
        let change = match call.op {
            "bondPort" => bond_change(&d, &p, call.query("bulk_enable") == Some("true"))?,
            "disbondPort" => disbond_change(&d, &p, call.query("bulk_disable") == Some("true"))?,
            "convertLayer2" => layer2_change(&d, &p)?,
            _ => self.layer3_change(&d, &p, call)?,
        };
        let pending = PendingChange {
            device_id: d.id.clone(),
            bond: group(&p).to_owned(),
            port_id: p.id.clone(),
            reads_left: self.port_reads,
            change,
        };
        if self.port_reads == 0 {
            self.apply_change(pending);
        } else {
            self.pending.push(pending);
        }
        let (d, p) = self.port(&p.id)?;
        Ok((200, Some(self.port_json(&d, &p, &call.inc))))
    }

    fn layer3_change(&self, d: &Device, p: &Port, call: &Call<'_>) -> Result<ModeChange, ApiError> {
        if !p.is_bond {
            return refuse(format!(
                "Port {} is not a bond port: only bond ports can be converted to Layer 3",
                p.name
            ));
        }
        let ips = request_ips(call)?;
        if !p.layer2 {
            let has: Vec<String> = ips
                .iter()
                .filter(|(family, public)| {
                    self.assignments.iter().any(|a| {
                        a.management
                            && a.port_id.as_deref() == Some(p.id.as_str())
                            && a.family == *family
                            && a.public == *public
                    })
                })
                .map(|k| format!("The port already has a {} assignment", ip_kind(*k)))
                .collect();
            return Err(if has.is_empty() {
                ApiError::unprocessable(format!("{} is already configured for Layer 3", p.name))
            } else {
                ApiError {
                    status: 422,
                    messages: has,
                }
            });
        }
        let members: Vec<&Port> = d.members(&p.name).collect();
        if !p.vlans.is_empty() || members.iter().any(|q| !q.vlans.is_empty()) {
            return refuse(format!(
                "VLANs must first be unassigned from {} and its ports before converting to Layer 3",
                p.name
            ));
        }
        if members.iter().any(|q| !q.bonded) {
            return refuse(format!(
                "{} must be bonded (all its ports) before converting to Layer 3",
                p.name
            ));
        }
        Ok(ModeChange::Layer3(ips))
    }

    /// Puts a mode change into effect and records its `port.*` event.
    fn apply_change(&mut self, c: PendingChange) {
        let Some(di) = self.devices.iter().position(|d| d.id == c.device_id) else {
            return;
        };
        let Some(bond_id) = self.devices[di].port(&c.bond).map(|p| p.id.clone()) else {
            return;
        };
        let (kind, what) = match &c.change {
            ModeChange::Bond(ids) | ModeChange::Disbond(ids) => {
                let on = matches!(c.change, ModeChange::Bond(_));
                let mut names = Vec::new();
                for p in self.devices[di].ports.iter_mut() {
                    if ids.contains(&p.id) {
                        p.bonded = on;
                        names.push(p.name.clone());
                    }
                }
                if on {
                    ("port.bonded", format!("bonded {}", names.join(", ")))
                } else {
                    ("port.disbonded", format!("disbonded {}", names.join(", ")))
                }
            }
            ModeChange::Layer2 => {
                if let Some(b) = self.devices[di].ports.iter_mut().find(|p| p.id == bond_id) {
                    b.layer2 = true;
                }
                self.assignments
                    .retain(|a| !(a.management && a.port_id.as_deref() == Some(bond_id.as_str())));
                (
                    "port.converted_to_layer2",
                    format!("converted {} to Layer 2", c.bond),
                )
            }
            ModeChange::Layer3(ips) => {
                if let Some(b) = self.devices[di].ports.iter_mut().find(|p| p.id == bond_id) {
                    b.layer2 = false;
                }
                let device_id = c.device_id.clone();
                self.add_mgmt(&device_id, &bond_id, ips);
                (
                    "port.converted_to_layer3",
                    format!("converted {} to Layer 3", c.bond),
                )
            }
        };
        sync_bonds(&mut self.devices[di]);
        let d = &self.devices[di];
        let now = d.network_type(&c.bond).unwrap_or("unknown");
        let body = format!("Device {}: {what}; {} is now {now}", d.id, c.bond);
        let rel = vec![
            href("ports", &c.port_id),
            href("devices", &d.id),
            href("projects", &self.project_id),
        ];
        self.event_about(kind, body, rel);
    }

    /// New management addresses on a bond port, from fake blocks: public
    /// IPv4 /31s in 100.64.0.0/11, private IPv4 /31s in 100.96.0.0/11,
    /// public IPv6 /127s in 2001:db8:ffff::/48 (the device has the second
    /// address of each, the gateway the first).
    fn add_mgmt(
        &mut self,
        device_id: &str,
        port_id: &str,
        kinds: &[(Family, bool)],
    ) -> Vec<Assignment> {
        let mut out = Vec::new();
        for &(family, public) in kinds {
            let n = u128::from(self.mgmt_next);
            self.mgmt_next += 1;
            let (base, cidr) = match (family, public) {
                (Family::V4, true) => (0x6440_0000 + 2 * n, 31),
                (Family::V4, false) => (0x6460_0000 + 2 * n, 31),
                (Family::V6, _) => (0x2001_0db8_ffff_0000_0000_0000_0000_0000 + 2 * n, 127),
            };
            let value = base + 1;
            let a = Assignment {
                id: self.ids.uuid(),
                device_id: device_id.to_owned(),
                reservation_id: String::new(),
                address: from_u128(family, value).to_string(),
                cidr,
                customdata: json!({}),
                created_at: now_rfc3339(),
                management: true,
                port_id: Some(port_id.to_owned()),
                family,
                value,
                public,
            };
            self.assignments.push(a.clone());
            out.push(a);
        }
        out
    }

    /// Gives a device's `bond0` Metal's default management addresses.
    pub fn add_management_ips(&mut self, device_id: &str) -> Result<Vec<Assignment>, String> {
        let d = self
            .devices
            .iter()
            .find(|d| d.id == device_id)
            .ok_or_else(|| format!("no device {device_id}"))?;
        let bond = d.port("bond0").ok_or("the device has no bond0")?;
        if bond.layer2 {
            return Err(format!("bond0 of device {device_id} is in Layer 2"));
        }
        let bond_id = bond.id.clone();
        if self
            .assignments
            .iter()
            .any(|a| a.management && a.port_id.as_deref() == Some(bond_id.as_str()))
        {
            return Err(format!(
                "bond0 of device {device_id} has management addresses already"
            ));
        }
        Ok(self.add_mgmt(device_id, &bond_id, &DEFAULT_IPS))
    }

    /// Freezes (or thaws) a device's network.
    pub fn set_network_frozen(&mut self, device_id: &str, frozen: bool) -> Result<Device, String> {
        let d = self
            .devices
            .iter_mut()
            .find(|d| d.id == device_id)
            .ok_or_else(|| format!("no device {device_id}"))?;
        d.network_frozen = frozen;
        Ok(d.clone())
    }

    /// Makes the next batch created on the port fail with `message`.
    pub fn fail_next_batch(&mut self, port_id: &str, message: &str) -> Result<(), String> {
        self.port(port_id)
            .map_err(|_| format!("no port {port_id}"))?;
        self.fail_batches
            .insert(port_id.to_owned(), message.to_owned());
        Ok(())
    }

    /// Mode changes accepted and not yet in effect.
    pub fn pending_port_changes(&self) -> usize {
        self.pending.len()
    }

    /// Counts a read of the device's ports (of bond `bond` only, or all):
    /// a pending change whose reads are used up takes effect.
    pub(super) fn tick_ports(&mut self, device_id: &str, bond: Option<&str>) {
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let c = &mut self.pending[i];
            if c.device_id == device_id && bond.is_none_or(|b| b == c.bond) {
                c.reads_left = c.reads_left.saturating_sub(1);
                if c.reads_left == 0 {
                    due.push(self.pending.remove(i));
                    continue;
                }
            }
            i += 1;
        }
        for c in due {
            self.apply_change(c);
        }
    }

    /// Puts every pending change into effect and finishes every batch.
    pub(super) fn settle_ports(&mut self) {
        for c in std::mem::take(&mut self.pending) {
            self.apply_change(c);
        }
        for i in 0..self.batches.len() {
            if !self.batches[i].state.is_final() {
                self.finish_batch(i);
            }
        }
    }

    /// Drops the pending changes, batches and batch failures of a device
    /// being deleted.
    pub(super) fn forget_ports_of(&mut self, device_id: &str) {
        let ports: Vec<String> = self
            .devices
            .iter()
            .filter(|d| d.id == device_id)
            .flat_map(|d| d.ports.iter().map(|p| p.id.clone()))
            .collect();
        self.pending.retain(|c| c.device_id != device_id);
        self.batches.retain(|b| !ports.contains(&b.port_id));
        self.fail_batches.retain(|p, _| !ports.contains(p));
    }

    // -- native VLAN ----------------------------------------------------------

    pub(super) fn assign_native(&mut self, call: &Call<'_>) -> Answer {
        let (d, p) = self.port(call.param("id"))?;
        self.check_vlan_op_free(&d, &p)?;
        let vlan = self.resolve_vlan(&d, call.query("vnid").unwrap_or_default())?;
        check_native(&p, &vlan.id, vlan.vxlan, &p.vlans).map_err(ApiError::unprocessable)?;
        if p.native_vlan.as_deref() == Some(vlan.id.as_str()) {
            return refuse(format!(
                "Virtual network {} is already the native VLAN of the port",
                vlan.vxlan
            ));
        }
        if let Some((port, _)) = self.port_mut(&p.id) {
            port.native_vlan = Some(vlan.id.clone());
        }
        let (d, p) = self.port(&p.id)?;
        Ok((200, Some(self.port_json(&d, &p, &call.inc))))
    }

    pub(super) fn delete_native(&mut self, call: &Call<'_>) -> Answer {
        let (d, p) = self.port(call.param("id"))?;
        self.check_vlan_op_free(&d, &p)?;
        if p.native_vlan.is_none() {
            return refuse(format!("Port {} has no native VLAN", p.name));
        }
        if let Some((port, _)) = self.port_mut(&p.id) {
            port.native_vlan = None;
        }
        let (d, p) = self.port(&p.id)?;
        Ok((200, Some(self.port_json(&d, &p, &call.inc))))
    }

    // -- VLAN assignments -------------------------------------------------------

    fn vlan_assignment_json(&self, p: &Port, vlan_id: &str) -> Value {
        let vxlan = self
            .vlans
            .iter()
            .find(|v| v.id == vlan_id)
            .map_or(0, |v| v.vxlan);
        let unassigning = self.batches.iter().any(|b| {
            b.port_id == p.id
                && b.state == BatchState::InProgress
                && b.entries
                    .iter()
                    .any(|e| !e.assigned && e.vlan_id == vlan_id)
        });
        json!({
            "id": assignment_id(&p.id, vlan_id), "vlan": vxlan,
            "native": p.native_vlan.as_deref() == Some(vlan_id),
            "state": if unassigning { "unassigning" } else { "assigned" },
            "port": href_obj("ports", &p.id),
            "virtual_network": href_obj("virtual-networks", vlan_id),
        })
    }

    pub(super) fn port_vlan_assignments(&self, call: &Call<'_>) -> Answer {
        let (_, p) = self.port(call.param("id"))?;
        let items: Vec<Value> = p
            .vlans
            .iter()
            .map(|v| self.vlan_assignment_json(&p, v))
            .collect();
        Ok((200, Some(json!({ "vlan_assignments": items }))))
    }

    pub(super) fn port_vlan_assignment(&self, call: &Call<'_>) -> Answer {
        let (_, p) = self.port(call.param("id"))?;
        let wanted = call.param("assignment_id");
        let v = p
            .vlans
            .iter()
            .find(|v| assignment_id(&p.id, v) == wanted)
            .ok_or_else(ApiError::not_found)?;
        Ok((200, Some(self.vlan_assignment_json(&p, v))))
    }

    // -- batches ------------------------------------------------------------

    pub(super) fn batch_json(&self, b: &VlanBatch, inc: &Inc) -> Value {
        let port = match self.port(&b.port_id) {
            Ok((d, p)) if inc.has("port") => self.port_json(&d, &p, &inc.child("port")),
            _ => href_obj("ports", &b.port_id),
        };
        let entries: Vec<Value> = b
            .entries
            .iter()
            .map(|e| {
                json!({
                    "id": e.id, "vlan": e.vxlan, "native": e.native,
                    "state": if e.assigned { "assigned" } else { "unassigned" },
                })
            })
            .collect();
        json!({
            "id": b.id, "state": b.state.as_str(), "quantity": b.entries.len(),
            "vlan_assignments": entries, "error_messages": b.error_messages,
            "port": port, "project": href_obj("projects", &self.project_id),
            "created_at": b.created_at, "updated_at": b.updated_at,
        })
    }

    pub(super) fn create_batch(&mut self, call: &Call<'_>) -> Answer {
        let (d, p) = self.port(call.param("id"))?;
        self.check_vlan_op_free(&d, &p)?;
        let items = call
            .field("vlan_assignments")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if items.is_empty() {
            return refuse("A batch needs at least one VLAN assignment");
        }
        let mut entries: Vec<BatchEntry> = Vec::new();
        for item in &items {
            let vnid = item.get("vlan").and_then(Value::as_str).unwrap_or_default();
            let vlan = self.resolve_vlan(&d, vnid)?;
            if vlan.metro != d.metro {
                return refuse(format!(
                    "Virtual network {} is in {}, the port's device in {}",
                    vlan.vxlan, vlan.metro, d.metro
                ));
            }
            let assigned = item.get("state").and_then(Value::as_str) != Some("unassigned");
            let native = item.get("native").and_then(Value::as_bool).unwrap_or(false);
            if entries.iter().any(|e| e.vlan_id == vlan.id) {
                return refuse(format!(
                    "Virtual network {} is given more than once in the batch",
                    vlan.vxlan
                ));
            }
            if native && !assigned {
                return refuse(format!(
                    "Virtual network {}: only an assigned VLAN can be native",
                    vlan.vxlan
                ));
            }
            if assigned {
                check_can_carry_vlans(&p)?;
            }
            entries.push(BatchEntry {
                id: self.ids.uuid(),
                vlan_id: vlan.id.clone(),
                vxlan: vlan.vxlan,
                assigned,
                native,
            });
        }
        if entries.iter().filter(|e| e.native).count() > 1 {
            return refuse("Only one VLAN of a batch can be native");
        }
        if entries.iter().any(|e| e.native) && p.is_bond && !p.layer2 {
            return refuse(format!(
                "A native VLAN is not supported on the Layer 3 bond port {} (hybrid-bonded mode)",
                p.name
            ));
        }
        let now = now_rfc3339();
        let batch = VlanBatch {
            id: self.ids.uuid(),
            port_id: p.id.clone(),
            state: BatchState::Queued,
            entries,
            error_messages: Vec::new(),
            created_at: now.clone(),
            updated_at: now,
            reads_left: self.batch_reads,
            fail: self.fail_batches.remove(&p.id),
        };
        self.batches.push(batch);
        let i = self.batches.len() - 1;
        if self.batch_reads == 0 {
            self.finish_batch(i);
        }
        Ok((201, Some(self.batch_json(&self.batches[i], &call.inc))))
    }

    pub(super) fn find_batch(&mut self, call: &Call<'_>) -> Answer {
        let (_, p) = self.port(call.param("id"))?;
        let i = self
            .batches
            .iter()
            .position(|b| b.id == call.param("batch_id") && b.port_id == p.id)
            .ok_or_else(ApiError::not_found)?;
        let body = self.batch_json(&self.batches[i], &call.inc);
        self.tick_batch(i);
        Ok((200, Some(body)))
    }

    pub(super) fn find_batches(&mut self, call: &Call<'_>) -> Answer {
        let (_, p) = self.port(call.param("id"))?;
        let mine: Vec<usize> = (0..self.batches.len())
            .filter(|&i| self.batches[i].port_id == p.id)
            .collect();
        let items: Vec<Value> = mine
            .iter()
            .map(|&i| self.batch_json(&self.batches[i], &call.inc))
            .collect();
        for i in mine {
            self.tick_batch(i);
        }
        Ok((200, Some(json!({ "batches": items }))))
    }

    /// Counts a read of a batch: the first moves it to `in_progress`, the
    /// `batch_reads`-th finishes it.
    fn tick_batch(&mut self, i: usize) {
        let b = &mut self.batches[i];
        if b.state.is_final() {
            return;
        }
        b.reads_left = b.reads_left.saturating_sub(1);
        if b.reads_left == 0 {
            self.finish_batch(i);
        } else {
            b.state = BatchState::InProgress;
            b.updated_at = now_rfc3339();
        }
    }

    /// Finishes a batch: all of it applies (`completed`) or none of it
    /// (`failed`, with `error_messages`).
    fn finish_batch(&mut self, i: usize) {
        let b = self.batches[i].clone();
        let outcome = match &b.fail {
            Some(message) => Err(vec![message.clone()]),
            None => self.batch_outcome(&b),
        };
        match outcome {
            Ok((vlans, native)) => {
                if let Some((port, _)) = self.port_mut(&b.port_id) {
                    port.vlans = vlans;
                    port.native_vlan = native;
                }
                self.batches[i].state = BatchState::Completed;
            }
            Err(messages) => {
                let b = &mut self.batches[i];
                b.state = BatchState::Failed;
                b.error_messages = messages;
            }
        }
        let b = &mut self.batches[i];
        b.reads_left = 0;
        b.updated_at = now_rfc3339();
    }

    /// The port's VLANs and native VLAN after the batch, or why it fails:
    /// unassignments first, then assignments, then the native VLAN.
    fn batch_outcome(&self, b: &VlanBatch) -> Result<(Vec<String>, Option<String>), Vec<String>> {
        let Ok((_, p)) = self.port(&b.port_id) else {
            return Err(vec!["Port not found".into()]);
        };
        let mut vlans = p.vlans.clone();
        let mut native = p.native_vlan.clone();
        let mut errors = Vec::new();
        for e in b.entries.iter().filter(|e| !e.assigned) {
            match vlans.iter().position(|v| v == &e.vlan_id) {
                Some(at) => {
                    vlans.remove(at);
                    if native.as_deref() == Some(e.vlan_id.as_str()) {
                        native = None;
                    }
                }
                None => errors.push(format!("Virtual network {} not assigned", e.vxlan)),
            }
        }
        for e in b.entries.iter().filter(|e| e.assigned) {
            if vlans.contains(&e.vlan_id) {
                errors.push(format!("Virtual network {} already assigned", e.vxlan));
            } else {
                vlans.push(e.vlan_id.clone());
            }
        }
        if let Some(e) = b.entries.iter().find(|e| e.native) {
            match check_native(&p, &e.vlan_id, e.vxlan, &vlans) {
                Ok(()) => native = Some(e.vlan_id.clone()),
                Err(m) => errors.push(m),
            }
        }
        if errors.is_empty() {
            Ok((vlans, native))
        } else {
            Err(errors)
        }
    }
}
