//! Object metadata mechanics every controller step uses: optimistic
//! concurrency (`resourceVersion` preconditions and the conflict retry
//! loop), finalizers, and timestamps.

use serde_json::{json, Value};

use super::{obj, Kube, Resource};
use crate::error::{Error, Result};
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
            Err(e) if matches!(e.reason(), "KubeConflict" | "KubeNotFound") => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| Error::transient("KubeConflict", "retry")))
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

/// `metadata.resourceVersion` (or `null`), the precondition of every
/// write that must not clobber a concurrent change.
pub fn rv(o: &Value) -> Value {
    o.pointer("/metadata/resourceVersion")
        .cloned()
        .unwrap_or(Value::Null)
}

/// Patches `metadata.finalizers` to `finalizers`, guarded by the object's
/// resourceVersion. Returns the updated object.
///
/// # Errors
/// The API server's answer (409 when the object changed since `o`).
pub fn set_finalizers<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    r: &Resource,
    ns: Option<&str>,
    o: &Value,
    finalizers: Vec<String>,
) -> Result<Value> {
    let name = obj::meta_str(o, "name").unwrap_or_default();
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": rv(o)}});
    Ok(kube.merge_patch(r, ns, name, false, &patch)?)
}

/// Adds finalizer `f` unless `o` has it. Returns the object as it now is.
///
/// # Errors
/// As [`set_finalizers`].
pub fn add_finalizer<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    r: &Resource,
    ns: Option<&str>,
    o: &Value,
    f: &str,
) -> Result<Value> {
    let mut fs = obj::finalizers(o);
    if fs.iter().any(|x| x == f) {
        return Ok(o.clone());
    }
    fs.push(f.to_string());
    set_finalizers(kube, r, ns, o, fs)
}

/// Removes finalizer `f` if `o` has it. Returns the object as it now is,
/// or `None` when removing the last finalizer of a deleting object made it
/// disappear.
///
/// # Errors
/// As [`set_finalizers`].
pub fn remove_finalizer<H: HttpClient + ?Sized>(
    kube: &Kube<'_, H>,
    r: &Resource,
    ns: Option<&str>,
    o: &Value,
    f: &str,
) -> Result<Option<Value>> {
    let fs = obj::finalizers(o);
    if !fs.iter().any(|x| x == f) {
        return Ok(Some(o.clone()));
    }
    let rest: Vec<String> = fs.into_iter().filter(|x| x != f).collect();
    match set_finalizers(kube, r, ns, o, rest) {
        Ok(v) => Ok(Some(v)),
        // Removing the last finalizer of a deleting object removes it; a
        // server may then answer 404 or 200 with the final state.
        Err(e) if e.reason() == "KubeNotFound" => Ok(None),
        Err(e) => Err(e),
    }
}
