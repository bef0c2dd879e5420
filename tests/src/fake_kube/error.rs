//! Kubernetes `Status` errors, shaped as `k8s.io/apimachinery` builds them.

use std::fmt;

use serde_json::{json, Value};

use super::store::ResourceType;
use crate::schema::SchemaError;

/// One `details.causes` entry of an `Invalid` error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cause {
    reason: &'static str,
    field: String,
    message: String,
}

impl Cause {
    pub fn invalid(field: &str, message: impl Into<String>) -> Cause {
        Cause {
            reason: "FieldValueInvalid",
            field: field.to_owned(),
            message: message.into(),
        }
    }

    pub fn required(field: &str, message: impl Into<String>) -> Cause {
        Cause {
            reason: "FieldValueRequired",
            field: field.to_owned(),
            message: message.into(),
        }
    }

    pub fn forbidden(field: &str, message: impl Into<String>) -> Cause {
        Cause {
            reason: "FieldValueForbidden",
            field: field.to_owned(),
            message: message.into(),
        }
    }

    pub fn from_schema_error(e: &SchemaError) -> Cause {
        let reason = if e.message.starts_with("Required value") {
            "FieldValueRequired"
        } else if e.message.starts_with("Unsupported value") {
            "FieldValueNotSupported"
        } else if e.message.starts_with("Duplicate value") {
            "FieldValueDuplicate"
        } else if e.message == "unknown field" {
            "FieldValueUnknown"
        } else {
            "FieldValueInvalid"
        };
        Cause {
            reason,
            field: if e.path.is_empty() {
                "<root>".to_owned()
            } else {
                e.path.clone()
            },
            message: e.message.clone(),
        }
    }
}

/// A failed API call: what FakeKube answers as a `Status` object, and what
/// the seeding methods ([`FakeKube::try_create`](super::FakeKube::try_create)
/// and friends) return.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code, e.g. 409.
    pub code: u16,
    /// `Status.reason`, e.g. `Conflict`.
    pub reason: String,
    /// `Status.message`, e.g. `ipaddresses.ipam.cluster.x-k8s.io "a" already exists`.
    pub message: String,
    /// `Status.details` (an object, possibly empty).
    pub details: Value,
    /// Whether this is a failed object validation (recorded in
    /// [`FakeKube::schema_violations`](super::FakeKube::schema_violations)).
    pub(crate) violation: bool,
}

impl ApiError {
    fn new(code: u16, reason: &str, message: impl Into<String>, details: Value) -> ApiError {
        ApiError {
            code,
            reason: reason.to_owned(),
            message: message.into(),
            details,
            violation: false,
        }
    }

    fn resource_details(rt: &ResourceType, name: &str) -> Value {
        json!({"name": name, "group": rt.group, "kind": rt.plural})
    }

    pub(crate) fn violation(mut self) -> ApiError {
        self.violation = true;
        self
    }

    /// The `Status` object sent as the response body.
    pub fn status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        })
    }

    pub(crate) fn not_found(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", rt.resource()),
            Self::resource_details(rt, name),
        )
    }

    /// A path that names no resource FakeKube serves.
    pub(crate) fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
            json!({}),
        )
    }

    pub(crate) fn already_exists(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", rt.resource()),
            Self::resource_details(rt, name),
        )
    }

    pub(crate) fn conflict(rt: &ResourceType, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                rt.resource()
            ),
            Self::resource_details(rt, name),
        )
    }

    pub(crate) fn invalid(rt: &ResourceType, name: &str, causes: Vec<Cause>) -> ApiError {
        let lines: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let list = if lines.len() == 1 {
            lines[0].clone()
        } else {
            format!("[{}]", lines.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        ApiError::new(
            422,
            "Invalid",
            format!("{} {name:?} is invalid: {list}", rt.group_kind()),
            json!({"name": name, "group": rt.group, "kind": rt.kind, "causes": causes}),
        )
    }

    /// 422 for a JSON patch that does not apply (a failed `test`, a missing
    /// path), as the API server answers it.
    pub(crate) fn patch_failed(message: impl Into<String>) -> ApiError {
        ApiError::new(422, "Invalid", message, json!({}))
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message, json!({}))
    }

    pub(crate) fn expired() -> ApiError {
        ApiError::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter.",
            json!({}),
        )
    }

    pub(crate) fn method_not_allowed(method: &str) -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
            json!({}),
        )
    }

    pub(crate) fn unsupported_media_type(message: impl Into<String>) -> ApiError {
        ApiError::new(415, "UnsupportedMediaType", message, json!({}))
    }

    pub(crate) fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized", json!({}))
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message, json!({}))
    }

    /// The error a [`FakeKube::fail_next`](super::FakeKube::fail_next) fault
    /// answers with: reason and details as a real server would give for
    /// that code.
    pub(crate) fn injected(code: u16, path: &str) -> ApiError {
        let message = format!("injected by FakeKube::fail_next (HTTP {code}) for {path}");
        let (reason, details) = match code {
            400 => ("BadRequest", json!({})),
            401 => ("Unauthorized", json!({})),
            403 => ("Forbidden", json!({})),
            404 => ("NotFound", json!({})),
            405 => ("MethodNotAllowed", json!({})),
            409 => ("Conflict", json!({})),
            410 => ("Expired", json!({})),
            415 => ("UnsupportedMediaType", json!({})),
            422 => ("Invalid", json!({})),
            429 => ("TooManyRequests", json!({"retryAfterSeconds": 1})),
            500 => ("InternalError", json!({})),
            503 => ("ServiceUnavailable", json!({"retryAfterSeconds": 1})),
            504 => ("Timeout", json!({"retryAfterSeconds": 1})),
            _ => ("", json!({})),
        };
        ApiError::new(code, reason, message, details)
    }

    /// `Retry-After` seconds for the response header, if the error has one.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.details
            .get("retryAfterSeconds")
            .and_then(Value::as_u64)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
