//! The key-value layout and protocol, on the [`crate::ports::kv::KvStore`]
//! port. `kv-schema/README.md` states the protocol and argues its
//! invariants; this module is its code.
//!
//! - [`keys`]: every key family, builder and parser.
//! - [`records`]: the versioned records (pool record, claim binding).
//! - [`protocol`]: the compare-and-swap read-modify-write of any
//!   [`CasRecord`] ([`update_record`]; [`update_pool`] for the pool record)
//!   with its creation guard, tombstones and read-back.
//!
//! May import [`crate::ip`], [`crate::ipam`]'s pure types ([`crate::ipam::pool`],
//! [`crate::ipam::claim`], [`crate::ipam::alloc`]) and the [`crate::ports`];
//! never HTTP or Kubernetes.

pub mod keys;
pub mod protocol;
pub mod records;

pub use protocol::{
    read_pool, update_pool, update_record, CasRecord, Ctx, Envelope, Step, SwapPolicy,
    MAX_CAS_ATTEMPTS,
};
pub use records::{
    addr_in_family, ClaimRecord, CoolingRecord, IntentKindRecord, IntentRecord, JournalRecord,
    Loaded, Next, PoolRecord, PoolRefRecord, SwapCheck, RECENT_WRITERS, RECORD_VERSION,
};
