//! The bare-metal cloud seam: what the pool, claim and profile logic needs
//! of a cloud, as one trait ([`Cloud`]) and cloud-neutral types. The
//! domain modules (`network`, `capi`, `provision`'s assignments and event
//! cursor) talk to it; `crate::metal` is its first implementation
//! (`metal::cloud`), phoenixNAP Bare Metal Cloud the next
//! (`docs/cloud-seam.md` maps its concepts).
//!
//! What every cloud provides:
//! - **devices** ([`DeviceView`]): state, location, addresses and NICs
//!   ([`Nic`]: name, MAC, the segments it carries);
//! - **segments** ([`Segment`]): a layer-2 network with a number in a
//!   location (Metal's VLAN, phoenixNAP's private or public network);
//! - **attach and detach** of segments on a NIC, answered by an
//!   [`Operation`] to follow until it finishes (Metal's VLAN batch,
//!   phoenixNAP's asynchronous membership);
//! - **addresses assigned to a device** ([`AssignedAddress`]), tagged with
//!   the claim they serve;
//! - **events after a cursor** ([`CloudEvent`]): the devices that changed.
//!
//! What only some clouds provide is in [`Capabilities`]; a caller asks
//! [`Capabilities::require`] before it relies on one, and a cloud that lacks
//! it is refused with an error naming the capability (422
//! `CapabilityMissing`). NIC modes and bonding are the [`NicModes`]
//! extension ([`Cloud::nic_modes`]); VRFs and gateways stay behind the Metal
//! implementation.
//!
//! [`retry`] is every HTTP cloud client's retry decision (429 and
//! `Retry-After`, 5xx, lost answers never repeated for a POST), and
//! [`attempts`] the loop that sends a request's attempts by it.
//!
//! Owns no IPAM, Kubernetes or KV knowledge and imports only `error` and
//! (in `attempts`) the `ports`.

pub mod attempts;
mod error;
pub mod retry;

pub use error::CloudError;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, ErrorKind, Result};

/// A call's result: the value, or what the cloud answered.
pub type CloudResult<T> = std::result::Result<T, CloudError>;

/// Which cloud an object lives in: a pool's backing, an assignment's
/// record, a device's provider ID.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum CloudKind {
    /// Equinix Metal (the default of records written before there were
    /// two).
    #[default]
    Metal,
    /// phoenixNAP Bare Metal Cloud.
    Phoenixnap,
}

impl CloudKind {
    /// The name in messages (`Metal`, `phoenixNAP`).
    pub fn name(self) -> &'static str {
        match self {
            CloudKind::Metal => "Metal",
            CloudKind::Phoenixnap => "phoenixNAP",
        }
    }

    /// Whether it is Metal (a record leaves the default out).
    pub fn is_metal(&self) -> bool {
        *self == CloudKind::Metal
    }
}

/// What a cloud may or may not do, beyond what every [`Cloud`] provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Capability {
    /// NICs change mode (Layer3, Hybrid, Layer2) through [`NicModes`].
    NicModes,
    /// NICs bond and disbond.
    Bonding,
    /// A segment carried untagged on a NIC (a native VLAN).
    NativeSegment,
    /// Pools backed by a routed address space of the cloud's (Metal VRFs).
    VrfPools,
    /// Gateways the pool logic creates on a segment.
    Gateways,
    /// Several segments attached or detached in one operation.
    BatchAttach,
    /// Addresses chosen by the caller when a device joins a segment.
    ChosenAddresses,
}

impl Capability {
    /// The capability's name in errors and docs.
    pub fn name(self) -> &'static str {
        match self {
            Capability::NicModes => "NIC modes",
            Capability::Bonding => "bonding",
            Capability::NativeSegment => "native segments",
            Capability::VrfPools => "VRF-backed pools",
            Capability::Gateways => "gateways",
            Capability::BatchAttach => "batch attach",
            Capability::ChosenAddresses => "chosen addresses",
        }
    }
}

/// What a cloud can do: the set of [`Capability`]s it has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities(u16);

impl Capabilities {
    /// None at all.
    pub const NONE: Capabilities = Capabilities(0);

    /// The set of `caps`.
    pub const fn of(caps: &[Capability]) -> Capabilities {
        let mut bits = 0;
        let mut i = 0;
        while i < caps.len() {
            bits |= 1 << caps[i] as u16;
            i += 1;
        }
        Capabilities(bits)
    }

    /// Whether the cloud has `c`.
    pub fn has(&self, c: Capability) -> bool {
        self.0 & (1 << c as u16) != 0
    }

    /// The same set without `c`.
    pub fn without(self, c: Capability) -> Capabilities {
        Capabilities(self.0 & !(1 << c as u16))
    }

    /// Ok when the cloud (named `cloud`) has `c`, for `what`.
    ///
    /// # Errors
    /// 422 `CapabilityMissing` naming the cloud, the capability and what
    /// needed it.
    ///
    /// ```
    /// use metal_ipam_core::cloud::{Capabilities, Capability};
    /// let none = Capabilities::NONE;
    /// let e = none.require("phoenixNAP", Capability::NicModes, "a Layer2 profile").unwrap_err();
    /// assert_eq!((e.status(), e.reason()), (422, "CapabilityMissing"));
    /// assert!(e.message().contains("NIC modes"));
    /// ```
    pub fn require(&self, cloud: &str, c: Capability, what: &str) -> Result<()> {
        if self.has(c) {
            return Ok(());
        }
        Err(missing(cloud, c, what))
    }
}

/// The refusal of `what` on a cloud (named `cloud`) without `c`: 422
/// `CapabilityMissing`.
pub fn missing(cloud: &str, c: Capability, what: &str) -> Error {
    Error::new(
        ErrorKind::Invalid,
        "CapabilityMissing",
        format!("{what} needs {}, which {cloud} does not offer", c.name()),
    )
}

/// A layer-2 network of the cloud: Metal's VLAN, phoenixNAP's private or
/// public network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segment {
    /// The cloud's id (a UUID on Metal).
    pub id: String,
    /// Its number (Metal's vxlan, phoenixNAP's `vlanId`).
    pub vlan: Option<u16>,
    /// Its location (Metal's metro code, lower case).
    pub location: Option<String>,
}

impl Segment {
    /// Whether this is number `vlan` of `location` (a lower-case code): a
    /// number is unique per location only, so both are checked.
    pub fn is(&self, vlan: u16, location: &str) -> bool {
        self.vlan == Some(vlan) && self.location.as_deref() == Some(location)
    }
}

/// A device's network interface: a physical port or a bond.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nic {
    /// The cloud's id.
    pub id: String,
    /// `bond0`, `eth1`, ….
    pub name: Option<String>,
    /// A bond (not a physical port).
    pub bond: bool,
    /// In its bond (a bond: bonded at all); `None` when not reported.
    pub bonded: Option<bool>,
    /// MAC address, as the cloud reports it.
    pub mac: Option<String>,
    /// Its mode, as the cloud names it (bonds on clouds with NIC modes).
    pub mode: Option<String>,
    /// The ids of the segments it carries.
    pub segments: Vec<String>,
    /// The segment it carries untagged, if any.
    pub native: Option<String>,
}

/// An address of a device as the cloud lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceAddress {
    /// The address.
    pub address: Option<String>,
    /// Prefix length.
    pub cidr: Option<u8>,
    /// Its gateway.
    pub gateway: Option<String>,
    /// Public (else private).
    pub public: Option<bool>,
    /// One of the addresses the cloud gave the device at provisioning.
    pub management: Option<bool>,
}

/// A device (server) as the domain sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceView {
    /// The cloud's id.
    pub id: String,
    /// Its state, in the cloud's words.
    pub state: Option<String>,
    /// Whether addresses can be assigned to it (provisioned, running).
    pub active: bool,
    /// Whether it is gone or going.
    pub gone: bool,
    /// Mode changes are refused for now.
    pub frozen: bool,
    /// Its NICs (filled by [`Cloud::device_nics`]).
    pub nics: Vec<Nic>,
    /// Its addresses.
    pub addresses: Vec<DeviceAddress>,
}

/// An asynchronous attach or detach, to follow until it finishes. Its
/// serialised form (`id`, `state`, `error_messages`) is Metal's VLAN batch,
/// which the attach and detach steps answer with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Operation {
    /// The cloud's id.
    pub id: String,
    /// `queued`, `in_progress`, `completed`, `failed`.
    pub state: Option<String>,
    /// Why it failed.
    pub error_messages: Vec<String>,
}

impl Operation {
    /// Whether it reached `completed` or `failed`.
    pub fn finished(&self) -> bool {
        matches!(self.state.as_deref(), Some("completed" | "failed"))
    }
}

/// An address assigned to a device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssignedAddress {
    /// The cloud's id (what [`Cloud::unassign_address`] takes).
    pub id: String,
    /// The address.
    pub address: Option<String>,
}

/// Something that happened in the cloud, as far as the poll reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloudEvent {
    /// Its id (the cursor).
    pub id: String,
    /// The ids of the devices it concerns.
    pub devices: Vec<String>,
}

/// A NIC mode change (the [`NicModes`] extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeChange {
    /// Into its bond (`bulk`: both members of a bond).
    Bond {
        /// Both members.
        bulk: bool,
    },
    /// Out of its bond (`bulk`: both members of a bond).
    Disbond {
        /// Both members.
        bulk: bool,
    },
    /// A bond to Layer2.
    ConvertLayer2,
    /// A bond to Layer3.
    ConvertLayer3,
}

/// NIC modes: bonding, Layer2/Layer3, a native segment. Metal has them;
/// phoenixNAP has none of them.
pub trait NicModes {
    /// Changes the NIC's mode; the change shows on later reads.
    ///
    /// # Errors
    /// What the cloud answered (a 422 for its refusals).
    fn change_mode(&self, nic: &str, change: ModeChange) -> CloudResult<()>;
    /// Carries `segment` untagged on the NIC.
    ///
    /// # Errors
    /// What the cloud answered.
    fn set_native(&self, nic: &str, segment: &str) -> CloudResult<()>;
    /// Carries no segment untagged on the NIC.
    ///
    /// # Errors
    /// What the cloud answered.
    fn remove_native(&self, nic: &str) -> CloudResult<()>;
}

/// A bare-metal cloud, as the pool, claim and profile logic needs it.
///
/// Each method is one request (or one paginated listing) to the cloud;
/// none is retried here beyond the implementation's own policy, and a
/// create whose answer was lost is [`CloudError::OutcomeUnknown`].
pub trait Cloud {
    /// The cloud's name in messages (`Metal`).
    fn name(&self) -> &'static str;

    /// What it can do beyond the trait.
    fn capabilities(&self) -> Capabilities;

    /// One of its answers as an error that names this cloud: its reasons
    /// (`MetalNotFound`, `PnapForbidden`, …) and the settings to check.
    fn error(&self, e: CloudError) -> Error;

    /// One device (state, addresses; NICs not asked for); `None` if it does
    /// not exist.
    ///
    /// # Errors
    /// What the cloud answered.
    fn device(&self, id: &str) -> CloudResult<Option<DeviceView>>;

    /// [`Cloud::device`] within `budget_ms` of retries (the poll's reads).
    ///
    /// # Errors
    /// What the cloud answered.
    fn device_within(&self, id: &str, budget_ms: u64) -> CloudResult<Option<DeviceView>>;

    /// One device with its NICs and the segments they carry; `None` if it
    /// does not exist.
    ///
    /// # Errors
    /// What the cloud answered.
    fn device_nics(&self, id: &str) -> CloudResult<Option<DeviceView>>;

    /// One segment; `None` if it does not exist.
    ///
    /// # Errors
    /// What the cloud answered.
    fn segment(&self, id: &str) -> CloudResult<Option<Segment>>;

    /// Every segment of a location.
    ///
    /// # Errors
    /// What the cloud answered.
    fn segments(&self, location: &str) -> CloudResult<Vec<Segment>>;

    /// Starts attaching (`attach`) or detaching segments on a NIC.
    ///
    /// # Idempotency
    /// Not repeated after a lost answer: look with
    /// [`Cloud::unfinished_operation`] first.
    ///
    /// # Errors
    /// What the cloud answered.
    fn change_segments(
        &self,
        nic: &str,
        attach: bool,
        segments: &[String],
    ) -> CloudResult<Operation>;

    /// One operation of a NIC; `None` if it does not exist.
    ///
    /// # Errors
    /// What the cloud answered.
    fn operation(&self, nic: &str, id: &str) -> CloudResult<Option<Operation>>;

    /// The NIC's operation still running, if any.
    ///
    /// # Errors
    /// What the cloud answered.
    fn unfinished_operation(&self, nic: &str) -> CloudResult<Option<Operation>>;

    /// The addresses assigned to a device.
    ///
    /// # Errors
    /// What the cloud answered.
    fn addresses(&self, device: &str) -> CloudResult<Vec<AssignedAddress>>;

    /// Assigns `address` (CIDR form) to a device, tagged with `labels`.
    ///
    /// # Errors
    /// What the cloud answered; not repeated after a lost answer.
    fn assign_address(
        &self,
        device: &str,
        address: &str,
        labels: Map<String, Value>,
    ) -> CloudResult<AssignedAddress>;

    /// Unassigns an address; `false` if it was already gone.
    ///
    /// # Errors
    /// What the cloud answered.
    fn unassign_address(&self, id: &str) -> CloudResult<bool>;

    /// The events newer than `after` (newest first), reading at most
    /// `pages` pages, and whether `after` was found (else events may have
    /// been missed: resync).
    ///
    /// # Errors
    /// What the cloud answered.
    fn events_after(&self, after: Option<&str>, pages: u32)
        -> CloudResult<(Vec<CloudEvent>, bool)>;

    /// The NIC modes extension, when the cloud has it.
    fn nic_modes(&self) -> Option<&dyn NicModes> {
        None
    }

    /// The memberships extension, when the cloud has it.
    fn memberships(&self) -> Option<&dyn Memberships> {
        None
    }
}

/// Where a device's membership of a segment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Done: the device is on the segment with its addresses.
    Ready,
    /// Joining, changing its addresses or leaving (the cloud does not say
    /// which).
    Changing,
    /// The cloud reports it failed.
    Failed,
}

/// A device's membership of a segment, with the addresses it holds there
/// (the [`Memberships`] extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The segment's id.
    pub segment: String,
    /// A public segment (else private).
    pub public: bool,
    /// The addresses, as the cloud lists them.
    pub addresses: Vec<String>,
    /// Where it is.
    pub state: MemberState,
}

/// Memberships: a device (not a NIC) joins and leaves segments with the
/// addresses it holds on each, chosen by the caller; every change is
/// asynchronous and shows on later reads. phoenixNAP has them (a server's
/// private and public networks); Metal has not (its VLANs are per port,
/// its addresses per device).
pub trait Memberships {
    /// The device's memberships; `None` when the device does not exist.
    ///
    /// # Errors
    /// What the cloud answered.
    fn members(&self, device: &str) -> CloudResult<Option<Vec<Member>>>;

    /// Joins `segment` with `addresses`.
    ///
    /// # Idempotency
    /// Not repeated after a lost answer: read the memberships first.
    ///
    /// # Errors
    /// What the cloud answered (a 422 for its refusals: an address outside
    /// the segment's range or held by another device, a device already on
    /// it).
    fn join(&self, device: &str, segment: &str, addresses: &[String]) -> CloudResult<()>;

    /// Sets the addresses the device holds on `segment` (a member, public
    /// or not).
    ///
    /// # Errors
    /// What the cloud answered.
    fn set_addresses(
        &self,
        device: &str,
        segment: &str,
        public: bool,
        addresses: &[String],
    ) -> CloudResult<()>;

    /// Leaves `segment`; `false` when the device was not on it.
    ///
    /// # Errors
    /// What the cloud answered.
    fn leave(&self, device: &str, segment: &str, public: bool) -> CloudResult<bool>;
}
