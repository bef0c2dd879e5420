//! [`KvStore`] on `wasi:keyvalue@0.2.0-draft2`.

use metal_ipam_core::ports::kv::{KvError, KvStore, Swap};

use crate::bindings::wasi::keyvalue::{atomics, batch, store};

/// The store label every function uses (spin.toml `key_value_stores`).
pub const STORE_LABEL: &str = "default";

/// One opened `wasi:keyvalue` bucket.
///
/// Every method is one host call (two for [`KvStore::cas_read`], and one per
/// page for [`KvStore::list_keys`]); nothing is cached, so the operation
/// counts of [`metal_ipam_core::ports::kv::CountingKv`] are what the host sees.
pub struct SpinKv {
    bucket: store::Bucket,
}

impl SpinKv {
    /// Opens the bucket `label`.
    ///
    /// # Errors
    /// [`KvError::AccessDenied`] when the component may not use the label
    /// (spin.toml `key_value_stores`), [`KvError::NoSuchStore`] when the
    /// label is not configured, [`KvError::Other`] for a backend failure.
    pub fn open(label: &str) -> Result<Self, KvError> {
        Ok(SpinKv {
            bucket: store::open(label).map_err(kv_error)?,
        })
    }

    /// Opens the [`STORE_LABEL`] bucket.
    ///
    /// # Errors
    /// As [`SpinKv::open`].
    pub fn open_default() -> Result<Self, KvError> {
        Self::open(STORE_LABEL)
    }

    /// The underlying bucket, for direct use of the bindings (e.g. `batch`).
    pub fn bucket(&self) -> &store::Bucket {
        &self.bucket
    }
}

/// Maps a `wasi:keyvalue` error onto the port's error.
fn kv_error(e: store::Error) -> KvError {
    match e {
        store::Error::NoSuchStore => KvError::NoSuchStore,
        store::Error::AccessDenied => KvError::AccessDenied,
        store::Error::Other(m) => KvError::Other(m),
    }
}

impl KvStore for SpinKv {
    type Cas = atomics::Cas;

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        self.bucket.get(key).map_err(kv_error)
    }

    /// One `wasi:keyvalue/batch` `get-many`; the host answers only the
    /// keys that exist (Spin and our test host alike), so the answer is
    /// matched back to `keys` by name.
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let found = batch::get_many(&self.bucket, keys).map_err(kv_error)?;
        let mut by_key: std::collections::BTreeMap<String, Option<Vec<u8>>> =
            found.into_iter().collect();
        Ok(keys.iter().map(|k| by_key.remove(k).flatten()).collect())
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        self.bucket.set(key, value).map_err(kv_error)
    }

    fn delete(&self, key: &str) -> Result<(), KvError> {
        self.bucket.delete(key).map_err(kv_error)
    }

    /// Follows the cursor until the host returns none. Spin's backends
    /// answer every key in one page; a host whose cursor stops advancing is
    /// reported as an error rather than looped on.
    fn list_keys(&self) -> Result<Vec<String>, KvError> {
        let mut keys = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self.bucket.list_keys(cursor.as_deref()).map_err(kv_error)?;
            keys.extend(page.keys);
            match page.cursor {
                None => return Ok(keys),
                Some(next) if cursor.as_deref() == Some(next.as_str()) => {
                    return Err(KvError::Other(
                        "list-keys returned the same cursor twice".to_string(),
                    ))
                }
                Some(next) => cursor = Some(next),
            }
        }
    }

    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        atomics::increment(&self.bucket, key, delta).map_err(kv_error)
    }

    fn cas_read(&self, key: &str) -> Result<(Self::Cas, Option<Vec<u8>>), KvError> {
        let cas = atomics::Cas::new(&self.bucket, key).map_err(kv_error)?;
        let current = cas.current().map_err(kv_error)?;
        Ok((cas, current))
    }

    /// `Ok` → [`Swap::Reported`]; `cas-failed` → [`Swap::Failed`] (the fresh
    /// handle the host returns is dropped: the core protocol re-reads with
    /// [`KvStore::cas_read`]); `store-error` → [`KvError`].
    fn cas_swap(&self, cas: Self::Cas, value: &[u8]) -> Result<Swap, KvError> {
        match atomics::swap(cas, value) {
            Ok(()) => Ok(Swap::Reported),
            Err(atomics::CasError::CasFailed(_fresh)) => Ok(Swap::Failed),
            Err(atomics::CasError::StoreError(e)) => Err(kv_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wasi_errors_map_onto_the_port() {
        assert_eq!(kv_error(store::Error::NoSuchStore), KvError::NoSuchStore);
        assert_eq!(kv_error(store::Error::AccessDenied), KvError::AccessDenied);
        assert_eq!(
            kv_error(store::Error::Other("boom".into())),
            KvError::Other("boom".into())
        );
    }
}
