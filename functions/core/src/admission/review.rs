//! The `AdmissionReview` envelope (`admission.k8s.io/v1`), independent of
//! what is reviewed: reading a review within the size limit, its request
//! fields, and rendering the response with a [`Denial`] and warnings. The
//! pool webhook ([`super`]) is its first user; VRF and port-profile webhooks
//! reuse it.

use serde_json::{json, Map, Value};

use crate::error::{Error, ErrorKind, Result};

/// The `apiVersion` of the reviews we accept and answer.
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// `request.kind` of a review: what object type is under review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewedKind<'a> {
    /// API group (empty for the core group).
    pub group: &'a str,
    /// Kind, e.g. `MetalIPPool`.
    pub kind: &'a str,
}

/// The parts of `request` every webhook needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Request<'a> {
    /// `request.uid`, echoed in the response.
    pub uid: &'a str,
    /// `request.operation`: `CREATE`, `UPDATE`, `DELETE`, `CONNECT`.
    pub operation: &'a str,
    /// `request.kind`.
    pub kind: ReviewedKind<'a>,
    /// `request.dryRun` (webhooks without side effects check it the same
    /// way).
    pub dry_run: bool,
    /// The whole `request` object (`name`, `namespace`, `object`,
    /// `oldObject`, …).
    pub fields: &'a Map<String, Value>,
}

/// Parses a review body as JSON, refusing one over
/// [`crate::MAX_BODY`].
///
/// # Errors
/// 400 `Malformed` (too large) or `MalformedJSON`.
pub fn read(body: &[u8]) -> Result<Value> {
    if body.len() > crate::MAX_BODY {
        return Err(Error::malformed(format!(
            "the body is larger than {} bytes",
            crate::MAX_BODY
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        Error::new(
            ErrorKind::Malformed,
            "MalformedJSON",
            format!("the body is not valid JSON: {e}"),
        )
    })
}

impl<'a> Request<'a> {
    /// The request of an `admission.k8s.io/v1` `AdmissionReview`.
    ///
    /// # Errors
    /// 400 `MalformedRequest` naming the field when the review is not a v1
    /// `AdmissionReview` with `request.uid`, `request.operation` and
    /// `request.kind`.
    pub fn parse(v: &'a Value) -> Result<Request<'a>> {
        let obj = v
            .as_object()
            .ok_or_else(|| Error::malformed("the body must be an AdmissionReview object"))?;
        match obj.get("apiVersion").and_then(Value::as_str) {
            Some(REVIEW_API_VERSION) => {}
            other => {
                return Err(Error::malformed(format!(
                    "apiVersion {:?} is not accepted; configure the webhook with admissionReviewVersions: [\"v1\"]",
                    other.unwrap_or("")
                ))
                .with_field("apiVersion"))
            }
        }
        if obj.get("kind").and_then(Value::as_str) != Some("AdmissionReview") {
            return Err(Error::malformed("kind must be \"AdmissionReview\"").with_field("kind"));
        }
        let req = obj
            .get("request")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::malformed("the review has no request").with_field("request"))?;
        let uid = nonempty(req, "uid")
            .ok_or_else(|| Error::malformed("request.uid is required").with_field("request.uid"))?;
        let operation = nonempty(req, "operation").ok_or_else(|| {
            Error::malformed("request.operation is required").with_field("request.operation")
        })?;
        let kind = req.get("kind").and_then(Value::as_object).ok_or_else(|| {
            Error::malformed("request.kind is required").with_field("request.kind")
        })?;
        Ok(Request {
            uid,
            operation,
            kind: ReviewedKind {
                group: kind.get("group").and_then(Value::as_str).unwrap_or(""),
                kind: kind.get("kind").and_then(Value::as_str).unwrap_or(""),
            },
            dry_run: req.get("dryRun").and_then(Value::as_bool).unwrap_or(false),
            fields: req,
        })
    }
}

/// The `AdmissionReview` response: allowed unless `denial`, with
/// `warnings` when there are any.
pub fn response(uid: &str, denial: Option<&Denial>, warnings: &[String]) -> Value {
    let mut response = Map::new();
    response.insert("uid".into(), uid.into());
    response.insert("allowed".into(), denial.is_none().into());
    if let Some(d) = denial {
        response.insert("status".into(), d.status());
    }
    if !warnings.is_empty() {
        response.insert("warnings".into(), warnings.to_vec().into());
    }
    json!({
        "apiVersion": REVIEW_API_VERSION,
        "kind": "AdmissionReview",
        "response": Value::Object(response),
    })
}

fn nonempty<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    m.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Why a request is denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// `status.code`: 422 for an invalid or overlapping spec, 403 for a
    /// delete while addresses are bound.
    pub code: u16,
    /// `status.reason`: `Invalid`, `AllocatedAddressesDropped`,
    /// `PoolOverlap`, `PoolInUse`.
    pub reason: &'static str,
    /// `status.message`: `field: message` when a field is known.
    pub message: String,
    /// The offending field, e.g. `spec.addresses[1]`.
    pub field: Option<String>,
}

impl Denial {
    /// The denial for `e`, with `code` (`status.code`), its reason and
    /// field.
    pub fn from_error(code: u16, e: &Error) -> Denial {
        Denial {
            code,
            reason: e.reason(),
            message: match e.field() {
                Some(f) => format!("{f}: {}", e.message()),
                None => e.message().to_string(),
            },
            field: e.field().map(str::to_string),
        }
    }

    /// `response.status`.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "status": "Failure",
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
        });
        if let Some(f) = &self.field {
            s["details"] = json!({"causes": [{"field": f, "message": self.message}]});
        }
        s
    }
}
