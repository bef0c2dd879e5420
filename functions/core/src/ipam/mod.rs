//! IPAM: what a pool is and how addresses are handed out, independent of
//! where the state is kept.
//!
//! - [`pool`]: pool objects (`MetalIPPool`, `GlobalMetalIPPool`, and the
//!   prefix pools `MetalPrefixPool`, `GlobalMetalPrefixPool`), their
//!   identity ([`pool::PoolId`]) and validation into a
//!   [`pool::ValidatedPool`], whose values are addresses or, in a prefix
//!   pool, sub-prefix numbers (everything below counts in those units).
//! - [`vrf`]: the `spec.metal` section of a VRF-backed pool (which Metal
//!   resources, adopted or created, and their deletion policies).
//! - [`claim`]: the CAPI `IPAddressClaim` input and `IPAddress` output.
//! - [`alloc`]: the allocator as pure state transitions of one pool
//!   ([`alloc::PoolState`]: used ranges, cooling, intents).
//! - [`store`]: the pool record and the claim binding as stored, and the
//!   pool record's read and read-modify-write on [`crate::kv`]'s protocol.
//! - [`holders`]: who holds a pool's values without listing the store:
//!   the confirmed bindings in the pool record and the holder pages, their
//!   flush, migration and readers.
//! - [`index`]: the pool index: every live pool and the addresses it may
//!   hold, where the overlap rule is decided.
//! - [`ops`]: the operations (allocate, adopt, release, register and delete
//!   a pool) over the key-value port, on the protocol of [`crate::kv`].
//!
//! May import [`crate::ip`], [`crate::kube::names`] (name rules),
//! [`crate::kv`] and the [`crate::ports`]; never HTTP, Kubernetes calls or
//! Spin.

pub mod alloc;
pub mod backing;
pub mod claim;
pub mod holders;
pub mod index;
pub mod ops;
pub mod pnap;
pub mod pool;
pub mod store;
pub mod vrf;
