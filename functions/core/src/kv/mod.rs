//! The generic key-value layer, on the [`crate::ports::kv::KvStore`]
//! port: the compare-and-swap protocol any record is kept with, its
//! envelope, and every key family. `kv-schema/README.md` states the
//! protocol and argues its invariants; this module is its code.
//!
//! - [`keys`]: every key family, builder and parser.
//! - [`records`]: what every stored envelope shares (schema version,
//!   writer tokens, [`SwapCheck`]).
//! - [`protocol`]: the compare-and-swap read-modify-write of any
//!   [`CasRecord`] ([`update_record`], [`read_record`], [`forget_record`])
//!   with its creation guard, tombstones and read-back; [`Enveloped`], the
//!   one envelope records are stored in.
//! - [`lease`]: the fenced lease a record embeds (take, hold, release,
//!   take over after expiry), one holder at a time for work that outlives
//!   a compare-and-swap.
//! - [`registry`]: an add-only set of strings in one record (the request
//!   signatures, the pool index), so a family is found without listing.
//!
//! The records themselves live with their domain (`ipam::store`,
//! `provision`, `network::apply`). May import [`crate::error`] and the
//! [`crate::ports`] only: nothing of the domains it stores.

pub mod keys;
pub mod lease;
pub mod protocol;
pub mod records;
pub mod registry;

pub use protocol::{
    forget_record, read_record, update_record, CasRecord, Ctx, Decision, Envelope, Enveloped,
    StateRecord, SwapPolicy, MAX_CAS_ATTEMPTS,
};
pub use records::{SwapCheck, RECENT_WRITERS, RECORD_VERSION};
