//! Object metadata mechanics every controller step uses: optimistic
//! concurrency (`resourceVersion` preconditions and the conflict retry
//! loop), finalizers (written as a typed `object::MetadataPatch`), and
//! timestamps.

use super::object::{MetadataPatch, Object};
use super::{Kube, Resource};
use crate::error::{Error, Known, Result};
use crate::ports::http::HttpClient;

/// How often a step re-reads and retries after a 409.
pub const CONFLICT_RETRIES: u32 = 5;

/// Runs `f` until it does not fail with a conflict (409) or a vanished
/// object (404 between a read and the write), at most
/// [`CONFLICT_RETRIES`] times; `f` re-reads what it writes.
///
/// # Errors
/// `f`'s error, or the last conflict after [`CONFLICT_RETRIES`] attempts.
pub fn retrying<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let mut last = None;
    for _ in 0..CONFLICT_RETRIES {
        match f() {
            Err(e) if e.is(Known::KubeConflict) || e.is(Known::KubeNotFound) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| Error::transient(Known::KubeConflict.as_str(), "retry")))
}

/// Formats Unix seconds as an RFC 3339 UTC timestamp.
///
/// # Examples
/// ```
/// use metal_ipam_core::kube::meta::rfc3339;
/// assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
/// assert_eq!(rfc3339(1_764_441_600), "2025-11-29T18:40:00Z");
/// ```
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Patches `metadata.finalizers` of `o` to `finalizers`, guarded by its
/// resourceVersion. Returns the updated object.
///
/// # Errors
/// The API server's answer (409 when the object changed since `o`).
pub fn set_finalizers<T: Object>(
    kube: &Kube<'_, impl HttpClient + ?Sized>,
    r: &Resource,
    o: &T,
    finalizers: Vec<String>,
) -> Result<T> {
    let m = o.meta();
    let patch = MetadataPatch {
        finalizers: Some(finalizers),
        resource_version: m.resource_version.clone(),
        ..MetadataPatch::default()
    };
    let v = kube.merge_patch(r, m.namespace.as_deref(), &m.name, false, &patch.to_json())?;
    Ok(T::from_json(&v))
}

/// Adds finalizer `f` unless `o` has it. Returns the object as it now is.
///
/// # Errors
/// As [`set_finalizers`].
pub fn add_finalizer<T: Object + Clone>(
    kube: &Kube<'_, impl HttpClient + ?Sized>,
    r: &Resource,
    o: &T,
    f: &str,
) -> Result<T> {
    if o.meta().has_finalizer(f) {
        return Ok(o.clone());
    }
    let mut fs = o.meta().finalizers.clone();
    fs.push(f.to_string());
    set_finalizers(kube, r, o, fs)
}

/// Removes finalizer `f` if `o` has it. Returns the object as it now is,
/// or `None` when removing the last finalizer of a deleting object made it
/// disappear.
///
/// # Errors
/// As [`set_finalizers`].
pub fn remove_finalizer<T: Object + Clone>(
    kube: &Kube<'_, impl HttpClient + ?Sized>,
    r: &Resource,
    o: &T,
    f: &str,
) -> Result<Option<T>> {
    if !o.meta().has_finalizer(f) {
        return Ok(Some(o.clone()));
    }
    let rest: Vec<String> = o
        .meta()
        .finalizers
        .iter()
        .filter(|x| *x != f)
        .cloned()
        .collect();
    match set_finalizers(kube, r, o, rest) {
        Ok(v) => Ok(Some(v)),
        // Removing the last finalizer of a deleting object removes it; a
        // server may then answer 404 or 200 with the final state.
        Err(e) if e.is(Known::KubeNotFound) => Ok(None),
        Err(e) => Err(e),
    }
}
