//! An add-only set of strings kept in one record: what lets a reader find
//! a family of keys without listing the store (`list_keys` is `KEYS *` on
//! Redis). The request signatures (`obs/signatures`) and the pool index
//! (`pool-index`) are registries.
//!
//! A registry is an [`Enveloped`] record under [`update_record`] (creation
//! guard, read-back where the backend's swap cannot be trusted), so an
//! [`add`] that returned `Ok` is in the set from then on: members are never
//! removed, and every write is a superset of what its decision read, which
//! was the current record as of the swap. A crashed add (anything before
//! its swap landed) left nothing, or left the member: adding it again
//! makes it present either way. Argued in `kv-schema/README.md`
//! ("Registries"), checked by `tests/interleavings_registry.rs`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::kv::protocol::{read_record, update_record, Ctx, Enveloped, StateRecord, Step};
use crate::ports::kv::KvStore;

/// Which registry: its record key and its creation guard's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryId {
    /// The record's key.
    pub key: &'static str,
    /// Its creation guard counter's key.
    pub guard: &'static str,
}

/// The content of a registry record: its members, sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Members {
    /// The members.
    #[serde(default)]
    pub members: BTreeSet<String>,
}

/// The stored registry: [`Members`] in the generic envelope.
pub type RegistryRecord = Enveloped<Members>;

impl StateRecord for Members {
    type Id = RegistryId;
    const VERSION: u32 = 1;
    const WHAT: &'static str = "registry";
    fn key(id: &RegistryId) -> String {
        id.key.to_string()
    }
    fn guard_key(id: &RegistryId) -> String {
        id.guard.to_string()
    }
    fn describe(id: &RegistryId) -> String {
        format!("registry {}", id.key)
    }
}

/// What [`add`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Every member was already there; nothing written.
    Present,
    /// Written: the members are there now.
    Added,
    /// The registry holds `cap` members and some were missing: nothing
    /// written.
    Full,
}

/// Adds `members` to registry `id` (creating it, even with no member, when
/// absent), unless that would take it past `cap` members. One `cas_read`
/// when every member is present; otherwise one read-modify-write.
///
/// # Errors
/// Store failures (503), an unreadable record (500), 503 `Contention`.
pub fn add<K: KvStore>(
    ctx: &Ctx<'_, K>,
    id: &RegistryId,
    members: &[&str],
    cap: usize,
) -> Result<Added> {
    update_record::<K, RegistryRecord, Added>(ctx, id, |seen| {
        let have = seen.map(|m| &m.members);
        let missing: Vec<&str> = members
            .iter()
            .copied()
            .filter(|m| have.is_none_or(|h| !h.contains(*m)))
            .collect();
        if seen.is_some() && missing.is_empty() {
            return Ok(Step::Done(Added::Present));
        }
        let mut next = seen.cloned().unwrap_or_default();
        if next.members.len() + missing.len() > cap {
            return Ok(Step::Done(Added::Full));
        }
        next.members
            .extend(missing.iter().map(|m| (*m).to_string()));
        Ok(Step::Write(Box::new(next), Added::Added))
    })
}

/// The members of registry `id` (one `get`); `None` when it was never
/// created.
///
/// # Errors
/// Store failures (503), an unreadable record (500).
pub fn read<K: KvStore>(kv: &K, id: &RegistryId) -> Result<Option<BTreeSet<String>>> {
    Ok(read_record::<K, RegistryRecord>(kv, id)?.map(|m| m.members))
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::kv::SwapPolicy;
    use crate::testing::{Backend, MemKv, TestEnv};

    const ID: RegistryId = RegistryId {
        key: "test/registry",
        guard: "test-init/registry",
    };

    #[test]
    fn adds_are_idempotent_capped_and_read_back_on_every_backend() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = Ctx {
                kv: &kv,
                env: &env,
                swap_policy: SwapPolicy::Auto,
            };
            assert_eq!(read(&kv, &ID).unwrap(), None);
            assert_eq!(add(&ctx, &ID, &[], 2).unwrap(), Added::Added, "{backend:?}");
            assert_eq!(read(&kv, &ID).unwrap(), Some(BTreeSet::new()));
            assert_eq!(add(&ctx, &ID, &["a"], 2).unwrap(), Added::Added);
            kv.reset_counts();
            assert_eq!(add(&ctx, &ID, &["a"], 2).unwrap(), Added::Present);
            assert_eq!(kv.counts().total(), 1, "a present member costs one read");
            assert_eq!(add(&ctx, &ID, &["b", "a"], 2).unwrap(), Added::Added);
            assert_eq!(add(&ctx, &ID, &["c"], 2).unwrap(), Added::Full);
            let got = read(&kv, &ID).unwrap().unwrap();
            assert_eq!(got.into_iter().collect::<Vec<_>>(), ["a", "b"]);
        }
    }
}
