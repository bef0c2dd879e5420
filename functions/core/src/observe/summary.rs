//! The observation summary: what the last full reconcile saw that no
//! per-pool record holds — claims waiting per pool and reason, machines
//! (network mode per port, VLANs, addresses, phase), Metal assignment
//! states — so that a scrape or a page reads one key instead of listing
//! every claim and machine.
//!
//! [`PollSeen`] is the same for the Metal event poll: written by
//! `capi::poll` at the end of each call that read events (`at` only by the
//! successful ones).
//!
//! Written by `capi::reconcile` at the end of each run with a blind `set`
//! (last writer wins: it is an observation, never read for a decision, so
//! a lost write is replaced by the next run's); read by [`super::metrics`]
//! and [`super::view`]. As fresh as the last reconcile run (`at`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::kv::keys;
use crate::ports::kv::KvStore;
use crate::provision::poll::PendingDevice;

/// Schema version of the summary record.
pub const SUMMARY_VERSION: u32 = 1;

/// Most machines the summary lists (the counts cover them all).
pub const MAX_MACHINES: usize = 5000;

/// A pool, as the summary names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolName {
    /// `MetalIPPool` or `GlobalMetalIPPool` (the claim's `poolRef.kind`).
    pub kind: String,
    /// Namespace (empty for a global pool).
    #[serde(default)]
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// Claims of one pool waiting for an address, for one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Waiting {
    /// The pool the claims name.
    pub pool: PoolName,
    /// Their `Ready=False` reason (e.g. `PoolExhausted`, `PoolNotFound`).
    pub reason: String,
    /// How many.
    pub count: u32,
}

/// One bond of a machine (the unit Metal's network modes apply to), as
/// its profile configures it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortRow {
    /// The bond (`bond0`, `bond1`).
    pub port: String,
    /// Its network mode (`network::profile::Mode::as_str`: `layer3`,
    /// `hybrid`, `layer2-bonded`, …).
    pub mode: String,
    /// The VLANs on the bond and its members, as the profile names them:
    /// the VXLAN number (`1010`), `pool <name>` (a VRF-backed pool's VLAN)
    /// or `id <uuid>`.
    #[serde(default)]
    pub vlans: Vec<String>,
}

/// A machine opted into a network profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRow {
    /// The Machine's namespace.
    pub namespace: String,
    /// The Machine's name.
    pub name: String,
    /// Its cluster (`spec.clusterName`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The network profile it opted into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The Metal device, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The machine step's result: `converged`, `in-progress`, `failed`,
    /// `waiting-for-device`, `released`, … (`capi::machine::Synced::result`),
    /// or `error` when the step failed.
    pub phase: String,
    /// Ports with their mode and VLANs.
    #[serde(default)]
    pub ports: Vec<PortRow>,
    /// Per-VLAN addresses (`10.1.0.5/24`), by the per-VLAN claim's name.
    #[serde(default)]
    pub addresses: BTreeMap<String, String>,
    /// The last failure, when the phase is `failed` or `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The value of `obs/summary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Schema version, [`SUMMARY_VERSION`].
    pub v: u32,
    /// Unix seconds when the reconcile run that wrote it ended.
    pub at: u64,
    /// The run's duration in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    /// Errors the run reported.
    #[serde(default)]
    pub errors: u32,
    /// Claims waiting, per pool and reason (only non-zero counts).
    #[serde(default)]
    pub waiting: Vec<Waiting>,
    /// Machines opted into a profile (at most [`MAX_MACHINES`]).
    #[serde(default)]
    pub machines: Vec<MachineRow>,
    /// Machines left out of `machines` past [`MAX_MACHINES`].
    #[serde(default)]
    pub machines_omitted: u32,
    /// Claims' Metal assignment records by state (`assigned`,
    /// `assigning`, `unassigning`, `held`, …).
    #[serde(default)]
    pub assignments: BTreeMap<String, u32>,
}

/// Reads the summary; `None` before the first reconcile run (or when the
/// stored one cannot be read: it is only an observation).
///
/// # Errors
/// The store failed.
pub fn read<K: KvStore>(kv: &K) -> Result<Option<Summary>> {
    Ok(kv
        .get(keys::OBS_SUMMARY)?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

/// Writes the summary (one `set`; last writer wins).
///
/// # Errors
/// The store failed.
pub fn write<K: KvStore>(kv: &K, summary: &Summary) -> Result<()> {
    let bytes = serde_json::to_vec(summary).expect("a summary serialises");
    kv.set(keys::OBS_SUMMARY, &bytes)?;
    Ok(())
}

/// The value of `obs/poll`: what the Metal event poll saw, as of its last
/// call (`at`: its last successful one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PollSeen {
    /// Unix seconds when the last successful poll ended (0: none yet).
    pub at: u64,
    /// Unix seconds when a poll last moved the cursor (ingested events);
    /// 0 before any did.
    #[serde(default)]
    pub cursor_moved_at: u64,
    /// Events the last call ingested.
    #[serde(default)]
    pub events: u64,
    /// Devices named by events and not handled yet after the last call
    /// (those backing off included).
    #[serde(default)]
    pub pending: u64,
    /// Failures on single claims, machines and devices the last call
    /// reported.
    #[serde(default)]
    pub errors: u64,
    /// Pending devices whose last read failed (backing off).
    #[serde(default)]
    pub failing: u64,
    /// Unix seconds the oldest pending device was first named; 0 when
    /// none is pending (or none with a known time).
    #[serde(default)]
    pub oldest_pending_since: u64,
}

/// Reads the poll observation; `None` before the first poll call that
/// read events (or when the stored one cannot be read).
///
/// # Errors
/// The store failed.
pub fn read_poll<K: KvStore>(kv: &K) -> Result<Option<PollSeen>> {
    Ok(kv
        .get(keys::OBS_POLL)?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

/// What one poll call saw, for [`record_poll`].
#[derive(Debug, Clone, Copy)]
pub struct PollCall<'a> {
    /// The call succeeded (it may still have reported failures on single
    /// objects); `false` when it stopped early.
    pub succeeded: bool,
    /// Events it ingested.
    pub events: u64,
    /// The devices pending after it (`metal/poll`).
    pub pending: &'a [PendingDevice],
    /// Failures on single objects it reported.
    pub errors: u64,
}

/// Records a poll call ending at `now` (one `get`, one `set`; last writer
/// wins). `at` moves only when the call succeeded; the cursor's last move
/// is kept from the record before when the call ingested nothing.
///
/// # Errors
/// The store failed.
pub fn record_poll<K: KvStore>(kv: &K, now: u64, call: &PollCall<'_>) -> Result<PollSeen> {
    let before = read_poll(kv)?.unwrap_or_default();
    let seen = PollSeen {
        at: if call.succeeded { now } else { before.at },
        cursor_moved_at: if call.events > 0 {
            now
        } else {
            before.cursor_moved_at
        },
        events: call.events,
        pending: call.pending.len() as u64,
        errors: call.errors,
        failing: call.pending.iter().filter(|p| p.failures > 0).count() as u64,
        oldest_pending_since: call
            .pending
            .iter()
            .map(|p| p.since)
            .filter(|s| *s > 0)
            .min()
            .unwrap_or(0),
    };
    let bytes = serde_json::to_vec(&seen).expect("a poll observation serialises");
    kv.set(keys::OBS_POLL, &bytes)?;
    Ok(seen)
}
