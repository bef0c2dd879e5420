//! The VLAN batch steps: attaching VLANs to a port and detaching them, each
//! one `POST /ports/{id}/vlan-assignments/batches` that Metal runs
//! asynchronously (`queued` → `in_progress` → `completed` | `failed`).
//!
//! On the seam a batch is a [`Cloud::change_segments`] answered by an
//! [`Operation`]; the apply names no Metal type.
//!
//! They are the `attach-vlan` and `detach-vlan` components. The `network`
//! component's apply ([`super::apply`]) decides *when* a batch is made and
//! keeps the progress in its KV record; these steps only talk to Metal, so
//! they hold the Metal token and nothing else (no store, no Kubernetes).
//! What a step is asked ([`BatchOp`]):
//! - `create`: start a batch of the given VLANs (never an empty one);
//! - `find`: the port's unfinished batch, if any (how a batch whose
//!   creation's answer was lost is found again: Metal runs one per port at
//!   a time);
//! - `get`: one batch by id, to poll it.
//!
//! [`VlanBatches`] is the port the apply uses: [`Direct`] runs a step in
//! the calling process (tests, tools); [`Chained`] asks the step's
//! component by Spin service chaining
//! (`http://attach-vlan.spin.internal/…`), and hands back the component's
//! [`CloudError`] as it happened, so the apply's rules (a 422 confirmed by a
//! re-read; an unknown outcome polled, not repeated) hold across the hop.
//! An answer of the step's own (not configured, not authorised, a request
//! it cannot read: an error body with a `reason` but no `metal`) is
//! [`BatchError::Step`]: definite, since the step refused before reaching
//! Metal, and named by the step's reason. Only no answer, or one that is
//! not the step's error body (a trapped component), leaves a `create`'s
//! outcome unknown.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::cloud::{Cloud, CloudError, Operation};
use crate::error::{Error, ErrorKind, Result};
use crate::ipam::vrf::is_uuid;
use crate::ports::http::{headers, Deadline, HttpClient};
use crate::routes::Route;

/// Which way a batch moves VLANs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `assigned`: the `attach-vlan` step.
    Attach,
    /// `unassigned`: the `detach-vlan` step.
    Detach,
}

impl Direction {
    /// The batch items' `state`.
    pub fn state(self) -> &'static str {
        match self {
            Direction::Attach => "assigned",
            Direction::Detach => "unassigned",
        }
    }

    /// The component that runs the step.
    pub fn component(self) -> &'static str {
        match self {
            Direction::Attach => "attach-vlan",
            Direction::Detach => "detach-vlan",
        }
    }
}

/// What a VLAN batch step is asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", deny_unknown_fields)]
pub enum BatchOp {
    /// Start a batch of these VLANs (UUIDs).
    Create {
        /// The VLANs; at least one, at most [`MAX_VLANS`].
        vlans: Vec<String>,
    },
    /// The port's unfinished batch, if any. (A struct variant, so that
    /// unknown fields are refused as in the others.)
    Find {},
    /// One batch, to poll it.
    Get {
        /// Its id.
        batch: String,
    },
}

/// VLANs in one batch at most (a port carries far fewer).
pub const MAX_VLANS: usize = 64;

impl BatchOp {
    /// Checks what a caller sent: VLANs and batch ids are UUIDs, a batch
    /// has 1..=[`MAX_VLANS`] distinct VLANs.
    ///
    /// # Errors
    /// 400 `InvalidBatch` naming what is wrong.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::new(ErrorKind::Malformed, "InvalidBatch", m));
        match self {
            BatchOp::Create { vlans } => {
                if vlans.is_empty() {
                    return bad("a batch needs at least one VLAN (Metal has no empty batch)".into());
                }
                if vlans.len() > MAX_VLANS {
                    return bad(format!("a batch takes at most {MAX_VLANS} VLANs"));
                }
                for (i, v) in vlans.iter().enumerate() {
                    if !is_uuid(v) {
                        return bad(format!("vlans[{i}] is not a UUID"));
                    }
                    if vlans[..i].contains(v) {
                        return bad(format!("vlans[{i}] repeats {v}"));
                    }
                }
                Ok(())
            }
            BatchOp::Find {} => Ok(()),
            BatchOp::Get { batch } if is_uuid(batch) => Ok(()),
            BatchOp::Get { .. } => bad("batch is not a UUID".into()),
        }
    }
}

/// Why a VLAN batch step did not answer a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchError {
    /// What the cloud answered (directly, or through the step's component).
    Cloud(CloudError),
    /// The step's component refused or failed before it reached Metal (its
    /// own error: Metal not configured, a token it does not accept, a
    /// request it cannot read): definite, nothing was made; 500
    /// `VlanStepFailed` naming the component, its status and reason.
    Step(Error),
}

impl From<CloudError> for BatchError {
    fn from(e: CloudError) -> Self {
        BatchError::Cloud(e)
    }
}

impl From<BatchError> for Error {
    fn from(e: BatchError) -> Self {
        match e {
            BatchError::Cloud(e) => e.into(),
            BatchError::Step(e) => e,
        }
    }
}

/// Runs VLAN batch steps for the apply.
pub trait VlanBatches {
    /// Runs `op` on port `port_id` in direction `dir`: the batch created,
    /// found or read (`None`: no unfinished batch, or no such batch).
    ///
    /// # Errors
    /// What Metal answered, as [`BatchError::Cloud`] (a `create` whose
    /// answer was lost is [`CloudError::OutcomeUnknown`]); the step's own
    /// refusal as [`BatchError::Step`].
    fn run(
        &self,
        dir: Direction,
        port_id: &str,
        op: &BatchOp,
    ) -> std::result::Result<Option<Operation>, BatchError>;
}

/// Runs a step against Metal: what the `attach-vlan` and `detach-vlan`
/// components do.
///
/// # Idempotency
/// `find` and `get` only read. `create` makes one batch per call; the
/// apply calls it once per recorded step and looks (`find`) before it
/// would create again.
///
/// # Errors
/// As [`VlanBatches::run`].
pub fn execute<C: Cloud + ?Sized>(
    cloud: &C,
    dir: Direction,
    port_id: &str,
    op: &BatchOp,
) -> std::result::Result<Option<Operation>, CloudError> {
    match op {
        BatchOp::Create { vlans } => cloud
            .change_segments(port_id, dir == Direction::Attach, vlans)
            .map(Some),
        BatchOp::Find {} => cloud.unfinished_operation(port_id),
        BatchOp::Get { batch } => cloud.operation(port_id, batch),
    }
}

/// [`execute`] in this process.
pub struct Direct<'a, C: Cloud + ?Sized>(pub &'a C);

impl<C: Cloud + ?Sized> VlanBatches for Direct<'_, C> {
    fn run(
        &self,
        dir: Direction,
        port_id: &str,
        op: &BatchOp,
    ) -> std::result::Result<Option<Operation>, BatchError> {
        Ok(execute(self.0, dir, port_id, op)?)
    }
}

/// The path of a port's batch step on its component (the route table's).
pub fn step_path(port_id: &str) -> String {
    Route::VlanBatch {
        port: port_id.to_string(),
    }
    .path()
}

/// The success body of a step: the port, the op and the batch (or null).
pub fn answer(port_id: &str, op: &BatchOp, batch: Option<&Operation>) -> Value {
    json!({"port": port_id, "op": op, "batch": batch})
}

/// The error body of a step that Metal failed: the usual error body plus
/// `metal`, the [`CloudError`] itself.
pub fn failure_body(e: &CloudError) -> Value {
    let mut body = Error::from(e.clone()).body();
    body["metal"] = serde_json::to_value(e).unwrap_or(Value::Null);
    body
}

/// The deadline of a chained VLAN step, as its caller keeps it: the step
/// makes one Metal request (its own 10 s budget), and the caller stops
/// waiting after 10 s, connecting included, so the step is one bounded
/// call inside the apply's lease (`apply::CALL_S`). A step cut off
/// answers nothing: a `create` is then an unknown outcome (polled, never
/// repeated), a read is retried.
pub const STEP_DEADLINE: Deadline = Deadline {
    connect_ms: 3_000,
    total_ms: 10_000,
};

/// Asks the step's component by Spin service chaining, with the API token.
pub struct Chained<'a, H: HttpClient + ?Sized> {
    /// Outbound HTTP.
    pub http: &'a H,
    /// The API token (the steps require it, as every route does).
    pub api_token: &'a str,
}

impl<H: HttpClient + ?Sized> VlanBatches for Chained<'_, H> {
    fn run(
        &self,
        dir: Direction,
        port_id: &str,
        op: &BatchOp,
    ) -> std::result::Result<Option<Operation>, BatchError> {
        let component = dir.component();
        let url = format!("http://{component}.spin.internal{}", step_path(port_id));
        let body = serde_json::to_vec(op).map_err(|e| CloudError::Malformed {
            detail: e.to_string(),
        })?;
        let mut request = http::Request::builder()
            .method("POST")
            .uri(&url)
            .header(headers::AUTHORIZATION, format!("Bearer {}", self.api_token))
            .header(headers::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| CloudError::Malformed {
                detail: e.to_string(),
            })?;
        STEP_DEADLINE.set(&mut request);
        let resp = self
            .http
            .send(request)
            .map_err(|e| unreachable(op, format!("{component} could not be reached: {e}")))?;
        read_answer(component, op, resp.status().as_u16(), resp.body())
    }
}

/// What a step that gave no usable answer means: a `create` may have made
/// the batch before the answer was lost (polled, never repeated); a read
/// is retried.
fn unreachable(op: &BatchOp, detail: String) -> CloudError {
    match op {
        BatchOp::Create { .. } => CloudError::OutcomeUnknown { detail },
        _ => CloudError::Unavailable {
            retry_after_s: 1,
            detail,
        },
    }
}

/// Reads a step component's answer (`status`, `body`) to `op`: the batch
/// (200), Metal's error as the step met it (`metal`), the step's own
/// refusal (an error body with a `reason` and no `metal`: it did not reach
/// Metal), or else an answer that is not the step's (a trapped component):
/// unreachable.
///
/// ```
/// use metal_ipam_core::network::batch::{read_answer, BatchError, BatchOp};
/// let create = BatchOp::Create { vlans: vec!["3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a".into()] };
/// let body = br#"{"reason": "MetalNotConfigured", "message": "Equinix Metal is not configured"}"#;
/// match read_answer("attach-vlan", &create, 500, body) {
///     Err(BatchError::Step(e)) => {
///         assert_eq!((e.status(), e.reason()), (500, "VlanStepFailed"));
///         assert!(e.message().contains("attach-vlan answered 500 MetalNotConfigured"));
///     }
///     other => panic!("{other:?}"),
/// }
/// ```
///
/// # Errors
/// As [`VlanBatches::run`].
pub fn read_answer(
    component: &str,
    op: &BatchOp,
    status: u16,
    body: &[u8],
) -> std::result::Result<Option<Operation>, BatchError> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if status == 200 {
        return serde_json::from_value(v["batch"].clone()).map_err(|e| {
            BatchError::Cloud(CloudError::Malformed {
                detail: format!("{component} answered a batch metal-ipam cannot read: {e}"),
            })
        });
    }
    if let Ok(e) = serde_json::from_value::<CloudError>(v["metal"].clone()) {
        return Err(BatchError::Cloud(e));
    }
    match v["reason"].as_str() {
        Some(reason) => Err(BatchError::Step(Error::new(
            ErrorKind::Internal,
            "VlanStepFailed",
            format!(
                "{component} answered {status} {reason}: {} (it did not reach Metal)",
                v["message"].as_str().unwrap_or("")
            ),
        ))),
        None => Err(BatchError::Cloud(unreachable(
            op,
            format!("{component} answered {status} without its error body"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_checked_and_round_trip() {
        let v = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a".to_string();
        let ok = BatchOp::Create {
            vlans: vec![v.clone()],
        };
        assert!(ok.check().is_ok());
        let text = serde_json::to_string(&ok).unwrap();
        assert_eq!(serde_json::from_str::<BatchOp>(&text).unwrap(), ok);
        assert_eq!(
            serde_json::from_str::<BatchOp>(r#"{"op":"find"}"#).unwrap(),
            BatchOp::Find {}
        );
        for bad in [
            BatchOp::Create { vlans: vec![] },
            BatchOp::Create {
                vlans: vec![v.clone(), v.clone()],
            },
            BatchOp::Create {
                vlans: vec!["1001".into()],
            },
            BatchOp::Create {
                vlans: vec![v.clone(); MAX_VLANS + 1],
            },
            BatchOp::Get {
                batch: "x/../y".into(),
            },
        ] {
            let e = bad.check().unwrap_err();
            assert_eq!(e.reason(), "InvalidBatch", "{bad:?}");
        }
        assert!(serde_json::from_str::<BatchOp>(r#"{"op":"find","x":1}"#).is_err());
    }

    /// A step component that answers `status` with `body`.
    struct Answers(u16, &'static str);

    impl HttpClient for Answers {
        fn send(
            &self,
            _: http::Request<Vec<u8>>,
        ) -> std::result::Result<http::Response<Vec<u8>>, crate::ports::http::TransportError>
        {
            Ok(http::Response::builder()
                .status(self.0)
                .body(self.1.as_bytes().to_vec())
                .unwrap())
        }
    }

    /// Issue 17, finding 13: a step that refused before reaching Metal (no
    /// `metal` in its error body) is a definite failure naming its reason,
    /// not an unknown outcome (which the apply polls as a running step, a
    /// 202 forever); only an answer that is not the step's own error body
    /// leaves a create's outcome unknown.
    #[test]
    fn a_step_that_did_not_reach_metal_is_a_definite_failure() {
        let create = BatchOp::Create {
            vlans: vec!["3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b0a".into()],
        };
        for (status, body, reason) in [
            (
                500,
                r#"{"reason":"MetalNotConfigured","message":"Equinix Metal is not configured"}"#,
                "MetalNotConfigured",
            ),
            (
                400,
                r#"{"reason":"InvalidBatch","message":"vlans[0] is not a UUID"}"#,
                "InvalidBatch",
            ),
            (
                401,
                r#"{"reason":"Unauthorized","message":"the bearer token is not valid"}"#,
                "Unauthorized",
            ),
        ] {
            let http = Answers(status, body);
            let chained = Chained {
                http: &http,
                api_token: "t",
            };
            let e: Error = chained
                .run(Direction::Attach, "p", &create)
                .unwrap_err()
                .into();
            assert_eq!((e.status(), e.reason()), (500, "VlanStepFailed"), "{e}");
            assert!(
                e.message()
                    .contains(&format!("attach-vlan answered {status} {reason}")),
                "{e}"
            );
        }
        // A trapped component (no error body of ours): the create may have
        // happened.
        let http = Answers(500, "");
        let chained = Chained {
            http: &http,
            api_token: "t",
        };
        let e: Error = chained
            .run(Direction::Attach, "p", &create)
            .unwrap_err()
            .into();
        assert_eq!(e.reason(), "MetalOutcomeUnknown", "{e}");
    }

    #[test]
    fn metal_errors_cross_the_hop_unchanged() {
        for e in [
            CloudError::Api {
                status: 422,
                request: "POST /ports/p/vlan-assignments/batches".into(),
                messages: vec!["already assigned".into()],
            },
            CloudError::Unavailable {
                retry_after_s: 7,
                detail: "429".into(),
            },
            CloudError::OutcomeUnknown {
                detail: "connection reset".into(),
            },
            CloudError::Malformed { detail: "x".into() },
        ] {
            let body = failure_body(&e);
            assert!(body["reason"].is_string());
            let back: CloudError = serde_json::from_value(body["metal"].clone()).unwrap();
            assert_eq!(back, e);
        }
    }
}
