//! `metav1.Condition` lists: the typed [`Condition`] our steps write
//! (`Ready` on claims and pools, the claim's `MetalAssigned`). Other
//! controllers' conditions are passed through as JSON, untouched.

use serde::Serialize;
use serde_json::Value;

use super::meta::rfc3339;

/// One `metav1.Condition`, as metal-ipam writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `type` (`Ready`, `MetalAssigned`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// CamelCase reason.
    pub reason: String,
    /// Human message (empty when ready).
    pub message: String,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: String,
    /// The `metadata.generation` the condition was decided on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    /// Reads a condition leniently: absent or mistyped fields read as
    /// empty (the API server checked the list against its schema).
    pub fn from_json(v: &Value) -> Condition {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Condition {
            type_: s("type").unwrap_or_default(),
            status: s("status").unwrap_or_default(),
            reason: s("reason").unwrap_or_default(),
            message: s("message").unwrap_or_default(),
            last_transition_time: s("lastTransitionTime").unwrap_or_default(),
            observed_generation: v.get("observedGeneration").and_then(Value::as_i64),
        }
    }

    /// As JSON, field names as in the API.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

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

impl Ready<'_> {
    /// The condition of type `ctype` this decision writes over `old` (the
    /// list's entry of that type, if any), and whether it differs from
    /// `old` in status, reason or message. `lastTransitionTime` is kept
    /// while the status stays.
    pub fn condition(
        &self,
        ctype: &str,
        old: Option<&Condition>,
        generation: Option<i64>,
    ) -> (Condition, bool) {
        let status = if self.status { "True" } else { "False" };
        let same_status = old.is_some_and(|c| c.status == status);
        let same = same_status
            && old.is_some_and(|c| c.reason == self.reason && c.message == self.message);
        let last_transition_time = match old {
            Some(c) if same_status && !c.last_transition_time.is_empty() => {
                c.last_transition_time.clone()
            }
            _ => rfc3339(self.now),
        };
        let cond = Condition {
            type_: ctype.to_string(),
            status: status.to_string(),
            reason: self.reason.to_string(),
            message: self.message.to_string(),
            last_transition_time,
            observed_generation: generation,
        };
        (cond, !same)
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
    let mut changed = true;
    let mut found = false;
    let mut out: Vec<Value> = existing
        .iter()
        .map(|c| {
            if c.get("type").and_then(Value::as_str) != Some(ctype) {
                return c.clone();
            }
            found = true;
            let (cond, ch) = ready.condition(ctype, Some(&Condition::from_json(c)), generation);
            changed = ch;
            cond.to_json()
        })
        .collect();
    if !found {
        out.push(ready.condition(ctype, None, generation).0.to_json());
    }
    (out, changed)
}
