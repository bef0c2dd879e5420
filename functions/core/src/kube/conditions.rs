//! `metav1.Condition` lists: the `Ready` condition our steps write on
//! claims and pools. Other controllers' conditions are passed through as
//! JSON, untouched.

use serde_json::{json, Value};

use super::meta::rfc3339;

/// The `Ready` condition a step writes on a claim or a pool.
#[derive(Debug, Clone, Copy)]
pub struct Ready<'a> {
    /// `True` or `False`.
    pub status: bool,
    /// CamelCase reason.
    pub reason: &'a str,
    /// Human message (empty when ready).
    pub message: &'a str,
    /// Unix time, for `lastTransitionTime`.
    pub now: u64,
}

impl<'a> Ready<'a> {
    /// `Ready=True` with `reason`.
    pub fn yes(reason: &'a str, now: u64) -> Self {
        Ready {
            status: true,
            reason,
            message: "",
            now,
        }
    }

    /// `Ready=False` with `reason` and `message`.
    pub fn no(reason: &'a str, message: &'a str, now: u64) -> Self {
        Ready {
            status: false,
            reason,
            message,
            now,
        }
    }
}

/// A `metav1.Condition` list with `Ready` set, keeping others and keeping
/// `lastTransitionTime` when the status does not change.
///
/// Returns the list and whether the `Ready` condition changed (so the
/// caller can skip a write that would change nothing).
pub fn with_ready(
    existing: &[Value],
    ready: Ready<'_>,
    generation: Option<i64>,
) -> (Vec<Value>, bool) {
    with_condition(existing, "Ready", ready, generation)
}

/// [`with_ready`] for a condition of type `ctype` (e.g. the claim's
/// `MetalAssigned`): the same status, reason and message rules.
pub fn with_condition(
    existing: &[Value],
    ctype: &str,
    ready: Ready<'_>,
    generation: Option<i64>,
) -> (Vec<Value>, bool) {
    let Ready {
        status,
        reason,
        message,
        now,
    } = ready;
    let mut out = Vec::new();
    let mut changed = true;
    let want_status = if status { "True" } else { "False" };
    let mut found = false;
    for c in existing {
        if c.get("type").and_then(Value::as_str) == Some(ctype) {
            found = true;
            let same_status = c.get("status").and_then(Value::as_str) == Some(want_status);
            let same = same_status
                && c.get("reason").and_then(Value::as_str) == Some(reason)
                && c.get("message").and_then(Value::as_str).unwrap_or("") == message;
            changed = !same;
            let ltt = if same_status {
                c.get("lastTransitionTime")
                    .cloned()
                    .unwrap_or_else(|| rfc3339(now).into())
            } else {
                rfc3339(now).into()
            };
            let mut cond = json!({"type": ctype, "status": want_status, "reason": reason, "message": message, "lastTransitionTime": ltt});
            if let Some(g) = generation {
                cond["observedGeneration"] = g.into();
            }
            out.push(cond);
        } else {
            out.push(c.clone());
        }
    }
    if !found {
        let mut cond = json!({"type": ctype, "status": want_status, "reason": reason, "message": message, "lastTransitionTime": rfc3339(now)});
        if let Some(g) = generation {
            cond["observedGeneration"] = g.into();
        }
        out.push(cond);
    }
    (out, changed)
}
