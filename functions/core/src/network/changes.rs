//! The changes of a server's memberships (phoenixNAP): what the
//! memberships plan ([`super::memberships::plan`]) answers and the apply
//! reports. Types only, so the apply's report ([`super::apply::Step`]) and
//! the memberships apply both use them without importing each other.

use serde_json::{json, Value};

/// What to do to one membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberAction {
    /// Join with these addresses.
    Join(Vec<String>),
    /// Hold these addresses instead of the current ones.
    SetAddresses(Vec<String>),
    /// Leave.
    Leave,
}

impl MemberAction {
    /// `join-network`, `set-network-addresses`, `leave-network`.
    pub fn name(&self) -> &'static str {
        match self {
            MemberAction::Join(_) => "join-network",
            MemberAction::SetAddresses(_) => "set-network-addresses",
            MemberAction::Leave => "leave-network",
        }
    }

    /// The addresses it gives the server (none for a leave).
    pub fn addresses(&self) -> &[String] {
        match self {
            MemberAction::Join(a) | MemberAction::SetAddresses(a) => a,
            MemberAction::Leave => &[],
        }
    }
}

/// One change of a server's memberships.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStep {
    /// The segment.
    pub segment: String,
    /// Whether the segment is public (as the server's membership says;
    /// `false` for a join, which the cloud looks up).
    pub public: bool,
    /// What to do.
    pub action: MemberAction,
}

impl MemberStep {
    /// As JSON (what `dryRun` answers).
    pub fn to_json(&self) -> Value {
        let mut v = json!({"network": self.segment, "action": self.action.name()});
        if !matches!(self.action, MemberAction::Leave) {
            v["addresses"] = json!(self.action.addresses());
        }
        v
    }
}
