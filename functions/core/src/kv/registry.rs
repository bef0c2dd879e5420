//! A set of strings kept in one record: what lets a reader find a family
//! of keys without listing the store (`list_keys` is `KEYS *` on Redis).
//! The request signatures (`obs/signatures`) and the pool index
//! (`pool-index`) are registries; so are the indexes of the records that
//! come and go with devices and claims ([`Index`]: `net/devices`,
//! `metal/claims`).
//!
//! A registry is an [`Enveloped`] record under [`update_record`] (creation
//! guard, read-back where the backend's swap cannot be trusted). [`add`]
//! and [`remove`] each decide on the set they read and write it with their
//! members put in or taken out, so every write that lands is the current
//! record as of its swap: an add that returned `Ok` is in the set until a
//! remove of that member lands after it, and a remove that returned `Ok`
//! is out of it until an add of that member lands after it (each call is
//! atomic on its members: linearizable). A crashed call (anything before
//! its swap landed) left the set as it was, or as the call wanted it:
//! calling again makes it so either way. Argued in `kv-schema/README.md`
//! ("Registries"), checked by `tests/interleavings_registry.rs`.
//!
//! An [`Index`] keeps the rule between a registry and the records it
//! lists: member before a record comes alive, out only once it is not
//! alive, with a check on each side (see its docs).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::kv::protocol::{read_record, update_record, Ctx, Decision, Enveloped, StateRecord};
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
            return Ok(Decision::Done(Added::Present));
        }
        let mut next = seen.cloned().unwrap_or_default();
        if next.members.len() + missing.len() > cap {
            return Ok(Decision::Done(Added::Full));
        }
        next.members
            .extend(missing.iter().map(|m| (*m).to_string()));
        Ok(Decision::Write(Box::new(next), Added::Added))
    })
}

/// What [`remove`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// None of the members was there (or the registry does not exist);
    /// nothing written.
    Absent,
    /// Written: the members are out of the set now.
    Removed,
}

/// Takes `members` out of registry `id`. One `cas_read` when none is
/// there (or the registry does not exist: nothing is created); otherwise
/// one read-modify-write.
///
/// # Errors
/// Store failures (503), an unreadable record (500), 503 `Contention`.
pub fn remove<K: KvStore>(ctx: &Ctx<'_, K>, id: &RegistryId, members: &[&str]) -> Result<Removed> {
    update_record::<K, RegistryRecord, Removed>(ctx, id, |seen| {
        let Some(seen) = seen else {
            return Ok(Decision::Done(Removed::Absent));
        };
        if !members.iter().any(|m| seen.members.contains(*m)) {
            return Ok(Decision::Done(Removed::Absent));
        }
        let mut next = seen.clone();
        for m in members {
            next.members.remove(*m);
        }
        Ok(Decision::Write(Box::new(next), Removed::Removed))
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

/// A registry listing the live records of one key family (a device's
/// network apply record, a claim's open Metal assignment record), so that
/// their readers never list the store, and bounded by what is alive: a
/// record's member goes once the record is deleted or closed.
///
/// # The rule (argued in `kv-schema/README.md`, "Registries")
/// 1. A write that brings a record alive (creates it, or reopens one that
///    was not alive) is made only after [`Index::ensure`] put its member in;
///    once that write landed, the writer calls `ensure` again.
/// 2. A record that is no longer alive (deleted, closed) leaves the index
///    by [`Index::unlist`]: the record is read and the member taken out
///    only if it is not alive, then the record is read again and the
///    member put back if it came alive meanwhile.
///
/// Each side writes its own key before it reads the other's, so without a
/// crash a record alive once both finished is listed: if the writer's
/// record write came before the remover's second read, the remover puts
/// the member back; if after, it came after the removal too, and the
/// writer's second `ensure` puts it back. A crash between one side's two
/// steps can leave a live record unlisted until a step of its own calls
/// `ensure` again (the callers' repair paths), and a member may outlive its
/// record (a writer that crashed before its write, or a race's second
/// `ensure`): readers skip it and `unlist` it.
///
/// A store written before the index: the first call that finds the
/// registry absent builds it from one listing of the store (every key of
/// the family, alive or not; readers `unlist` the others), once per store.
#[derive(Debug, Clone, Copy)]
pub struct Index {
    /// The registry.
    pub id: RegistryId,
    /// The member a store key stands for, when it is a key of the indexed
    /// family (for the one listing that builds an absent index).
    pub member_of: fn(&str) -> Option<String>,
}

impl Index {
    /// Builds the registry from one listing of the store, with `extra`.
    fn build<K: KvStore>(&self, ctx: &Ctx<'_, K>, extra: Option<&str>) -> Result<()> {
        let listed: Vec<String> = ctx
            .kv
            .list_keys()?
            .iter()
            .filter_map(|k| (self.member_of)(k))
            .collect();
        let mut members: Vec<&str> = listed.iter().map(String::as_str).collect();
        members.extend(extra);
        add(ctx, &self.id, &members, usize::MAX)?;
        Ok(())
    }

    /// The members (one `get`; building the registry first when it does
    /// not exist).
    ///
    /// # Errors
    /// Store failures (503), an unreadable record (500), 503 `Contention`.
    pub fn members<K: KvStore>(&self, ctx: &Ctx<'_, K>) -> Result<BTreeSet<String>> {
        if let Some(m) = read(ctx.kv, &self.id)? {
            return Ok(m);
        }
        self.build(ctx, None)?;
        Ok(read(ctx.kv, &self.id)?.unwrap_or_default())
    }

    /// Puts `member` in unless it is there (one `get` when it is).
    ///
    /// # Idempotency
    /// Any number of calls: the member is in once.
    ///
    /// # Errors
    /// Store failures (503), an unreadable record (500), 503 `Contention`.
    pub fn ensure<K: KvStore>(&self, ctx: &Ctx<'_, K>, member: &str) -> Result<()> {
        match read(ctx.kv, &self.id)? {
            Some(m) if m.contains(member) => Ok(()),
            Some(_) => add(ctx, &self.id, &[member], usize::MAX).map(|_| ()),
            None => self.build(ctx, Some(member)),
        }
    }

    /// Takes `member` out when its record is not alive (`alive` reads it),
    /// and puts it back when the record came alive meanwhile (rule 2).
    /// Returns whether it is out.
    ///
    /// # Idempotency
    /// Any number of calls; an absent registry is left absent.
    ///
    /// # Errors
    /// `alive`'s; store failures (503), an unreadable record (500), 503
    /// `Contention`.
    pub fn unlist<K: KvStore>(
        &self,
        ctx: &Ctx<'_, K>,
        member: &str,
        mut alive: impl FnMut() -> Result<bool>,
    ) -> Result<bool> {
        if alive()? {
            return Ok(false);
        }
        if remove(ctx, &self.id, &[member])? == Removed::Absent {
            return Ok(true);
        }
        if alive()? {
            self.ensure(ctx, member)?;
            return Ok(false);
        }
        Ok(true)
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;

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
            let ctx = Ctx::auto(&kv, &env);
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

    #[test]
    fn removes_take_members_out_and_create_nothing_on_every_backend() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = Ctx::auto(&kv, &env);
            assert_eq!(remove(&ctx, &ID, &["a"]).unwrap(), Removed::Absent);
            assert_eq!(
                read(&kv, &ID).unwrap(),
                None,
                "{backend:?}: nothing created"
            );
            add(&ctx, &ID, &["a", "b"], 10).unwrap();
            kv.reset_counts();
            assert_eq!(remove(&ctx, &ID, &["c"]).unwrap(), Removed::Absent);
            assert_eq!(kv.counts().total(), 1, "an absent member costs one read");
            assert_eq!(remove(&ctx, &ID, &["a", "c"]).unwrap(), Removed::Removed);
            let got = read(&kv, &ID).unwrap().unwrap();
            assert_eq!(got.into_iter().collect::<Vec<_>>(), ["b"]);
            assert_eq!(add(&ctx, &ID, &["a"], 10).unwrap(), Added::Added);
        }
    }

    fn member_of(key: &str) -> Option<String> {
        key.strip_prefix("rec/").map(str::to_string)
    }

    const INDEX: Index = Index { id: ID, member_of };

    #[test]
    fn an_index_is_built_once_from_one_listing_and_follows_its_records() {
        for backend in [Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36] {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_000);
            let ctx = Ctx::auto(&kv, &env);
            // A store written before the index: two records, one other key.
            kv.set("rec/x", b"1").unwrap();
            kv.set("rec/y", b"1").unwrap();
            kv.set("other/z", b"1").unwrap();
            kv.reset_counts();
            let m = INDEX.members(&ctx).unwrap();
            assert_eq!(m.into_iter().collect::<Vec<_>>(), ["x", "y"], "{backend:?}");
            assert_eq!(kv.counts().list_keys, 1);
            kv.reset_counts();
            INDEX.members(&ctx).unwrap();
            INDEX.ensure(&ctx, "x").unwrap();
            assert_eq!(kv.counts().list_keys, 0, "listed once per store");
            assert_eq!(kv.counts().total(), 2, "one read each");
            let alive = |k: &str| {
                kv.get(&format!("rec/{k}"))
                    .map(|v| v.is_some())
                    .map_err(Into::into)
            };
            // A live record stays; a deleted one goes; a record that comes
            // back before the second read is put back.
            assert!(!INDEX.unlist(&ctx, "x", || alive("x")).unwrap());
            kv.delete("rec/y").unwrap();
            assert!(INDEX.unlist(&ctx, "y", || alive("y")).unwrap());
            let mut reads = 0;
            let back = INDEX
                .unlist(&ctx, "x", || {
                    reads += 1;
                    Ok(reads > 1)
                })
                .unwrap();
            assert!(!back, "put back");
            let m = read(&kv, &ID).unwrap().unwrap();
            assert_eq!(m.into_iter().collect::<Vec<_>>(), ["x"]);
        }
    }
}
