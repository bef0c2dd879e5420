//! The subset of Spin's runtime configuration file
//! (`spin up --runtime-config-file`) this host supports: key-value stores of
//! type `spin` (SQLite) and `redis`.
//!
//! ```toml
//! [key_value_store.leases]
//! type = "spin"
//! path = "leases.db"   # relative to this file's directory; omit for in-memory
//!
//! [key_value_store.default]
//! type = "redis"
//! url = "redis://127.0.0.1:6379/0"   # Spin's only option for redis
//! ```
//!
//! A `redis` store gets Spin 3.6's swap reporting
//! ([`RedisSwap::Spin36`](crate::kv::RedisSwap)); the host option
//! `--redis-swap` ([`HostBuilder::redis_swap`](crate::HostBuilder::redis_swap))
//! changes it. The URL is checked at load ([`check_redis_url`]); `rediss://`
//! (TLS) is refused. Every label on one URL shares one keyspace, as on Spin:
//! give each label its own database number.
//!
//! Any other key, store type or option is rejected with an error.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use crate::kv::{check_redis_url, resolve_store_path, KvBackend};

/// A parsed runtime configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Key-value stores by label, sorted by label.
    pub key_value_stores: Vec<(String, KvBackend)>,
}

impl RuntimeConfig {
    /// Reads and validates a runtime configuration file.
    pub fn from_file(path: impl AsRef<Path>) -> anyhow::Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read runtime config {}", path.display()))?;
        let base = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Self::parse(&text, &base)
            .with_context(|| format!("invalid runtime config {}", path.display()))
    }

    /// Parses runtime configuration text; relative store paths are resolved
    /// against `base`.
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Self> {
        let mut table: toml::Table = toml::from_str(text).context("not valid TOML")?;
        let stores = table.remove("key_value_store");
        if let Some(key) = table.keys().next() {
            bail!("runtime config key {key:?} is not supported by this host (only [key_value_store.<label>])");
        }
        let mut key_value_stores = Vec::new();
        if let Some(stores) = stores {
            let toml::Value::Table(stores) = stores else {
                bail!("`key_value_store` must be a table of [key_value_store.<label>] tables");
            };
            for (label, config) in stores {
                let toml::Value::Table(mut config) = config else {
                    bail!("[key_value_store.{label}] must be a table");
                };
                let kind = config.remove("type");
                let backend = match kind.as_ref().and_then(|v| v.as_str()) {
                    Some("spin") => match config.remove("path") {
                        None => KvBackend::Memory,
                        Some(toml::Value::String(p)) => {
                            KvBackend::SqliteFile(resolve_store_path(base, &p))
                        }
                        Some(other) => {
                            bail!("[key_value_store.{label}] path must be a string, got {other}")
                        }
                    },
                    Some("redis") => match config.remove("url") {
                        Some(toml::Value::String(url)) => {
                            if let Err(m) = check_redis_url(&url) {
                                bail!("[key_value_store.{label}] {m}");
                            }
                            KvBackend::redis(url)
                        }
                        Some(other) => {
                            bail!("[key_value_store.{label}] url must be a string, got {other}")
                        }
                        None => bail!(
                            "[key_value_store.{label}] type \"redis\" needs `url = \"redis://host:port\"`"
                        ),
                    },
                    Some(other) => bail!(
                        "[key_value_store.{label}] type {other:?} is not supported by this host (only \"spin\", SQLite, and \"redis\")"
                    ),
                    None => bail!(
                        "[key_value_store.{label}] needs `type = \"spin\"` or `type = \"redis\"`"
                    ),
                };
                if let Some(key) = config.keys().next() {
                    bail!("[key_value_store.{label}] option {key:?} is not supported");
                }
                key_value_stores.push((label, backend));
            }
        }
        Ok(RuntimeConfig { key_value_stores })
    }

    /// The backend configured for `label`, if any.
    pub fn store(&self, label: &str) -> Option<&KvBackend> {
        self.key_value_stores
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, b)| b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_spin_stores() {
        let rc = RuntimeConfig::parse(
            "[key_value_store.leases]\ntype = \"spin\"\npath = \"data/leases.db\"\n[key_value_store.scratch]\ntype = \"spin\"\n[key_value_store.abs]\ntype = \"spin\"\npath = \"/tmp/x.db\"\n",
            Path::new("/cfg"),
        )
        .unwrap();
        assert_eq!(
            rc.store("leases"),
            Some(&KvBackend::SqliteFile(PathBuf::from("/cfg/data/leases.db")))
        );
        assert_eq!(rc.store("scratch"), Some(&KvBackend::Memory));
        assert_eq!(
            rc.store("abs"),
            Some(&KvBackend::SqliteFile(PathBuf::from("/tmp/x.db")))
        );
        assert_eq!(rc.store("nope"), None);
    }

    #[test]
    fn parses_redis_stores() {
        let rc = RuntimeConfig::parse(
            "[key_value_store.default]\ntype = \"redis\"\nurl = \"redis://127.0.0.1:6399/3\"\n",
            Path::new("/cfg"),
        )
        .unwrap();
        assert_eq!(
            rc.store("default"),
            Some(&KvBackend::redis("redis://127.0.0.1:6399/3"))
        );
        assert_eq!(
            rc.store("default").unwrap().to_string(),
            "Redis at 127.0.0.1:6399"
        );
    }

    #[test]
    fn rejects_unsupported() {
        for (text, needle) in [
            (
                "[key_value_store.a]\ntype = \"azure_cosmos\"\n",
                "azure_cosmos",
            ),
            ("[key_value_store.a]\ntype = \"redis\"\n", "url"),
            (
                "[key_value_store.a]\ntype = \"redis\"\nurl = \"http://x\"\n",
                "invalid Redis URL",
            ),
            (
                "[key_value_store.a]\ntype = \"redis\"\nurl = \"rediss://x:6380\"\n",
                "unusable Redis URL",
            ),
            (
                "[key_value_store.a]\ntype = \"redis\"\nurl = \"redis://x\"\npath = \"y\"\n",
                "path",
            ),
            ("[key_value_store.a]\npath = \"x\"\n", "type"),
            ("[key_value_store.a]\ntype = \"spin\"\nbogus = 1\n", "bogus"),
            (
                "[sqlite_database.default]\ntype = \"spin\"\n",
                "sqlite_database",
            ),
            ("state_dir = \"/x\"\n", "state_dir"),
        ] {
            let err = format!(
                "{:#}",
                RuntimeConfig::parse(text, Path::new(".")).unwrap_err()
            );
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }
}
