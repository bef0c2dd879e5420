//! The reconcile kit: one lifecycle for every Kubernetes object metal-ipam
//! reconciles, with a [`Handler`] per kind deciding what is specific to it.
//!
//! [`run`] owns the order of the lifecycle, the finalizer, the retry after a
//! 409, the count of Kubernetes calls, and the mapping from a handler's
//! typed [`Verdict`] to the object's condition and to the step's
//! [`Reconciled`]. A handler only reads, decides and acts. A new contract rule
//! that holds for every kind is one edit here.
//!
//! Handlers: the IPAM claim and the plain pool ([`crate::capi`]), the
//! VRF-backed pool ([`crate::capi::vrf`]), the Metal assignment
//! ([`crate::capi::assign`]) and the machine network
//! ([`crate::capi::machine`]).
//!
//! # Expected flow
//! 1. [`Handler::read`] the object fresh (or from a full reconcile's
//!    snapshot on the first attempt). Absent: [`Handler::gone`] cleans up
//!    what the store still holds for it.
//! 2. [`Handler::parse`] it. A spec that cannot be served is a verdict: its
//!    condition is written on a live object (a deleting one is past
//!    caring), and nothing else happens.
//! 3. Pause and deletion, in the handler's [`Handler::ORDER`]:
//!    [`Order::PauseFirst`] (a paused claim is not even released: the
//!    contract's rule for claims) or [`Order::DeletionFirst`] (a deleted
//!    pool is torn down even when paused: its resources are billable).
//!    [`Handler::paused`] says whether and why the object waits.
//! 4. Deleting: when [`Handler::CLEANUP_NEEDS_FINALIZER`], an object
//!    without our [`Handler::finalizer`] (or of a kind we hold none on) is
//!    not ours to clean up. Otherwise
//!    [`Handler::cleanup`] runs; when it reports [`Cleanup::Done`], the
//!    finalizer is removed, last.
//! 5. Live: the finalizer is added first (when [`Handler::keeps_finalizer`]
//!    says so for this object), then [`Handler::apply`] acts.
//! 6. The verdict's condition is written (only if it changes anything),
//!    then the outcome answered.
//!
//! # Guarantees
//! - The finalizer is on the object before anything is allocated or
//!   created for it, and comes off only after the cleanup reported done: a
//!   crash in between leaves the finalizer, and the next run resumes.
//! - A 409 (or a 404 between a read and a write) re-reads the object and
//!   runs the whole lifecycle again, at most
//!   [`crate::kube::meta::CONFLICT_RETRIES`] times; the retry never uses a
//!   snapshot.
//! - `kubeCalls` in the outcome counts every request of every attempt.
//! - A condition is written only when its status, reason or message
//!   changes: a converged object costs no write.
//!
//! # Assumptions
//! - Handlers are idempotent: every write is guarded (`resourceVersion`, a
//!   store compare-and-swap) or harmless when repeated, because any step
//!   may run again after a crash, a conflict or a duplicated event.
//! - Events are hints: the handler decides on what it reads, never on the
//!   event.
//! - Only metal-ipam removes its finalizers. One removed by hand is treated
//!   as described by each handler (claims and VRF-backed pools: not ours
//!   to clean up any more).

use serde_json::{json, Map, Value};

use crate::error::{ErrorKind, Result};
use crate::kube::meta::{add_finalizer, remove_finalizer, retrying};
use crate::kube::object::Object;
use crate::kube::{Kube, Resource};
use crate::ports::http::HttpClient;

/// What a contract step concluded: `result` in its answer, and the key
/// of the counts in a full reconcile's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StepResult {
    /// The claim has its address (`IPAddress` and status written).
    Bound,
    /// The claim's address was released.
    Released,
    /// The object does not exist (or holds nothing of ours): nothing to do.
    Absent,
    /// The object is not ours (another pool kind or group).
    Ignored,
    /// The claim or its cluster is paused.
    Paused,
    /// Not possible yet (pool not ready or exhausted, cluster missing, pool
    /// still in use); the status says why, and a later event or reconcile
    /// retries.
    Waiting,
    /// The request cannot succeed as it is (status says why).
    Failed,
    /// The pool's spec was stored and its status written.
    Synced,
    /// The pool was removed from the store.
    Deleted,
    /// The pool left Kubernetes with addresses allocated: kept in the store.
    Kept,
}

impl StepResult {
    /// The lower-case name used in answers, reports and logs.
    ///
    /// ```
    /// use metal_ipam_core::reconcile::StepResult;
    /// assert_eq!(StepResult::Bound.as_str(), "bound");
    /// assert_eq!(StepResult::Kept.as_str(), "kept");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            StepResult::Bound => "bound",
            StepResult::Released => "released",
            StepResult::Absent => "absent",
            StepResult::Ignored => "ignored",
            StepResult::Paused => "paused",
            StepResult::Waiting => "waiting",
            StepResult::Failed => "failed",
            StepResult::Synced => "synced",
            StepResult::Deleted => "deleted",
            StepResult::Kept => "kept",
        }
    }
}

/// What a reconciliation did: the step's answer. The kit's part is the
/// same for every kind; a handler adds its own members to the answer's
/// JSON through [`Reconciled::detail`] (the claim handler's `address` and
/// `metalAssignment`: [`crate::capi::ClaimAnswer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// What the step concluded.
    pub result: StepResult,
    /// Human explanation.
    pub message: String,
    /// Requests sent to the API server.
    pub kube_calls: u32,
    /// Seconds after which running the step again is worthwhile, when it
    /// is waiting on something that takes time (Metal provisioning).
    pub retry_after: Option<u64>,
    /// The reason of the `Ready=False` condition the step wrote, if it
    /// wrote one (what a full reconcile counts claims waiting by; not in
    /// the answer's JSON, whose `message` says it).
    pub reason: Option<&'static str>,
    /// A handler's own members of the answer's JSON, passed on as they
    /// are (the kit never reads them).
    pub detail: Map<String, Value>,
}

impl Reconciled {
    /// An answer with `result` and `message`, nothing else.
    pub fn new(result: StepResult, message: impl Into<String>) -> Reconciled {
        Reconciled {
            result,
            message: message.into(),
            kube_calls: 0,
            retry_after: None,
            reason: None,
            detail: Map::new(),
        }
    }

    /// With a wait before the step is worth running again.
    pub fn retry_after(mut self, seconds: u64) -> Reconciled {
        self.retry_after = Some(seconds);
        self
    }

    /// With the handler's member `key` set to `value` in the answer.
    pub fn with_detail(mut self, key: &str, value: impl Into<Value>) -> Reconciled {
        self.detail.insert(key.to_string(), value.into());
        self
    }

    /// As JSON (for responses and reports).
    pub fn to_json(&self) -> Value {
        let mut v = json!({"result": self.result.as_str(), "message": self.message, "kubeCalls": self.kube_calls});
        if let Some(s) = self.retry_after {
            v["retryAfter"] = s.into();
        }
        if let Value::Object(m) = &mut v {
            m.extend(self.detail.clone());
        }
        v
    }
}

/// Why an object is (not) ready: the condition reasons our steps write,
/// one enum, each with the step result it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Claim bound (`Ready=True`).
    AddressAllocated,
    /// Pool registered (`Ready=True`).
    PoolReady,
    /// The claim's pool is not registered (yet). Waiting.
    PoolNotReady,
    /// The claim's pool has no free address. Waiting.
    PoolExhausted,
    /// The claim cannot be served as it is. Failed.
    AllocationFailed,
    /// The pool's spec does not validate. Failed.
    InvalidSpec,
    /// The pool is deleted while addresses are allocated from it. Waiting.
    PoolInUse,
    /// The pool's Metal resources are being provisioned. Waiting.
    MetalProvisioning,
    /// The pool's Metal resources are being torn down. Waiting.
    MetalTearingDown,
    /// A deleted VRF-backed pool's VLAN is still used by profiles. Waiting.
    PoolVlanInUse,
    /// Any other reason (an error's stable reason, passed on): Failed.
    Other(&'static str),
}

impl Reason {
    /// The CamelCase reason written in the condition.
    ///
    /// ```
    /// use metal_ipam_core::reconcile::Reason;
    /// assert_eq!(Reason::PoolExhausted.as_str(), "PoolExhausted");
    /// assert_eq!(Reason::Other("MetalRefused").as_str(), "MetalRefused");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AddressAllocated => "AddressAllocated",
            Reason::PoolReady => "PoolReady",
            Reason::PoolNotReady => "PoolNotReady",
            Reason::PoolExhausted => "PoolExhausted",
            Reason::AllocationFailed => "AllocationFailed",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::PoolInUse => "PoolInUse",
            Reason::MetalProvisioning => "MetalProvisioning",
            Reason::MetalTearingDown => "MetalTearingDown",
            Reason::PoolVlanInUse => "PoolVlanInUse",
            Reason::Other(r) => r,
        }
    }

    /// What a `Ready=False` with this reason means for the step: something
    /// to wait for, or a request that cannot succeed as it is.
    ///
    /// ```
    /// use metal_ipam_core::reconcile::{Reason, StepResult};
    /// assert_eq!(Reason::PoolExhausted.result(), StepResult::Waiting);
    /// assert_eq!(Reason::AllocationFailed.result(), StepResult::Failed);
    /// ```
    pub fn result(self) -> StepResult {
        match self {
            Reason::PoolNotReady
            | Reason::PoolExhausted
            | Reason::PoolInUse
            | Reason::MetalProvisioning
            | Reason::MetalTearingDown
            | Reason::PoolVlanInUse => StepResult::Waiting,
            Reason::AddressAllocated | Reason::PoolReady => StepResult::Synced,
            Reason::AllocationFailed | Reason::InvalidSpec | Reason::Other(_) => StepResult::Failed,
        }
    }
}

/// The condition a verdict writes: `Ready` for claims and pools (other
/// handlers may write another type, e.g. `MetalAssigned`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `True` or `False`.
    pub ok: bool,
    /// Why.
    pub reason: Reason,
    /// Human message (empty when ready).
    pub message: String,
}

/// A handler's conclusion about one object, typed: what to write on it and
/// what to answer.
#[derive(Debug, Clone)]
pub struct Verdict<S> {
    /// The condition to write on the object, with the handler's status
    /// fields (`S`: an address reference, counts); `None` writes nothing.
    pub status: Option<(Condition, S)>,
    /// The step's answer.
    pub outcome: Reconciled,
}

impl<S> Verdict<S> {
    /// Nothing to write; answer `outcome`.
    pub fn answer(outcome: Reconciled) -> Self {
        Verdict {
            status: None,
            outcome,
        }
    }

    /// Nothing to write; answer `result` with `message`.
    pub fn just(result: StepResult, message: impl Into<String>) -> Self {
        Verdict::answer(Reconciled::new(result, message))
    }

    /// `Ready=True` with `reason` and the handler's `fields`; answer
    /// `outcome`.
    pub fn ready(reason: Reason, fields: S, outcome: Reconciled) -> Self {
        let c = Condition {
            ok: true,
            reason,
            message: String::new(),
        };
        Verdict {
            status: Some((c, fields)),
            outcome,
        }
    }

    /// `Ready=False` with `reason` and `message`; the answer's result is
    /// [`Reason::result`] and its message `message`.
    pub fn not_ready(reason: Reason, message: impl Into<String>, fields: S) -> Self {
        let message = message.into();
        let mut outcome = Reconciled::new(reason.result(), message.clone());
        outcome.reason = Some(reason.as_str());
        let c = Condition {
            ok: false,
            reason,
            message,
        };
        Verdict {
            status: Some((c, fields)),
            outcome,
        }
    }

    /// The same verdict, its outcome changed by `f`.
    pub fn map_outcome(mut self, f: impl FnOnce(Reconciled) -> Reconciled) -> Self {
        self.outcome = f(self.outcome);
        self
    }
}

/// Which of pause and deletion a handler looks at first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// A paused object is left alone even while it is being deleted (the
    /// CAPI contract's rule for claims: a paused cluster is being moved).
    PauseFirst,
    /// Deletion is carried out even when the object is paused (Metal
    /// resources cost money, a device's assignment must not outlive it).
    DeletionFirst,
}

/// What a cleanup concluded.
#[derive(Debug, Clone)]
pub enum Cleanup<S> {
    /// Everything is released: remove the finalizer, then answer.
    Done(Reconciled),
    /// Not yet (or nothing to remove the finalizer for): write and answer
    /// the verdict, keep the finalizer.
    Pending(Verdict<S>),
}

/// One kind of object's part of the lifecycle (see the module docs for
/// where [`run`] calls each method).
///
/// The phases take `&mut self`: what one phase learns (the attempt's
/// snapshot rule, the clock read with the object, a second object read
/// beside it, what the action did) is kept in the handler's own fields for
/// the next, without interior mutability.
pub trait Handler<H: HttpClient + ?Sized> {
    /// The object as read from the API server.
    type Object: Object + Clone;
    /// What [`Handler::parse`] makes of it.
    type Parsed;
    /// Status fields the handler writes beside its condition.
    type Status;
    /// Pause before deletion, or deletion before pause.
    const ORDER: Order;
    /// The object's name in messages ("claim", "pool").
    const NOUN: &'static str;
    /// A deleting object without [`Handler::finalizer`] is not cleaned up
    /// (someone else released it, or it was never ours).
    const CLEANUP_NEEDS_FINALIZER: bool;

    /// The Kubernetes client every call goes through.
    fn kube(&self) -> &Kube<'_, H>;
    /// The object's resource (for finalizer patches).
    fn resource(&self) -> &'static Resource;
    /// Our finalizer on this kind; `None` for a kind we never hold (a
    /// Machine: nothing of ours has to be released before it goes).
    fn finalizer(&self) -> Option<&'static str>;

    /// Reads the object; `first` is true on the first attempt only (a
    /// snapshot may be used then).
    ///
    /// # Errors
    /// API server errors.
    fn read(&mut self, first: bool) -> Result<Option<Self::Object>>;
    /// The object does not exist: clean up what we hold for it.
    ///
    /// # Errors
    /// Store, Metal and API server errors.
    fn gone(&mut self) -> Result<Reconciled>;
    /// Parses the object, or concludes here (not ours, or invalid).
    ///
    /// # Errors
    /// Store or API server errors (a bad spec is a verdict, not an error).
    fn parse(&mut self, o: &Self::Object) -> Result<Result<Self::Parsed, Verdict<Self::Status>>>;
    /// Whether the object waits (paused, or its cluster is missing), and
    /// the answer then. May keep what it read in `p` for later steps.
    ///
    /// # Errors
    /// API server errors.
    fn paused(&mut self, o: &Self::Object, p: &mut Self::Parsed) -> Result<Option<Reconciled>>;
    /// Releases what the deleting object holds.
    ///
    /// # Errors
    /// Store, Metal and API server errors.
    fn cleanup(&mut self, o: &Self::Object, p: &Self::Parsed) -> Result<Cleanup<Self::Status>>;
    /// Whether the live object should carry our finalizer now (before
    /// [`Handler::apply`]); by default always.
    fn keeps_finalizer(&self, _o: &Self::Object, _p: &Self::Parsed) -> bool {
        true
    }
    /// Acts on the live object.
    ///
    /// # Errors
    /// Store, Metal and API server errors that the next run may not meet
    /// (a refusal of the object as it is is a verdict).
    fn apply(&mut self, o: &Self::Object, p: Self::Parsed) -> Result<Verdict<Self::Status>>;
    /// Writes the condition and status fields if they differ from the
    /// object's; returns whether it wrote.
    ///
    /// # Errors
    /// API server errors (409 when the object changed: the lifecycle runs
    /// again).
    fn write_status(&mut self, o: &Self::Object, c: &Condition, s: &Self::Status) -> Result<bool>;
}

/// Runs `h`'s lifecycle to an outcome (see the module docs).
///
/// # Idempotency
/// As idempotent as the handler's steps, which the kit assumes they are:
/// on the same objects a second run writes nothing.
///
/// # Errors
/// The handler's errors; a conflict that persists after
/// [`crate::kube::meta::CONFLICT_RETRIES`] attempts (503).
pub fn run<H: HttpClient + ?Sized, X: Handler<H>>(h: &mut X) -> Result<Reconciled> {
    let before = h.kube().calls();
    let mut first = true;
    let mut out = retrying(|| {
        let f = first;
        first = false;
        once(h, f)
    })?;
    out.kube_calls = h.kube().calls() - before;
    Ok(out)
}

fn once<H: HttpClient + ?Sized, X: Handler<H>>(h: &mut X, first: bool) -> Result<Reconciled> {
    let Some(o) = h.read(first)? else {
        return h.gone();
    };
    let deleting = o.meta().deleting();
    let mut p = match h.parse(&o)? {
        Ok(p) => p,
        Err(v) if deleting => return Ok(v.outcome),
        Err(v) => return finish(h, &o, v),
    };
    if X::ORDER == Order::PauseFirst || !deleting {
        if let Some(out) = h.paused(&o, &mut p)? {
            return Ok(out);
        }
    }
    if deleting {
        let held = h.finalizer().is_some_and(|f| o.meta().has_finalizer(f));
        if X::CLEANUP_NEEDS_FINALIZER && !held {
            return Ok(Reconciled::new(
                StepResult::Absent,
                format!(
                    "the {} is being deleted and holds no metal-ipam finalizer",
                    X::NOUN
                ),
            ));
        }
        return match h.cleanup(&o, &p)? {
            Cleanup::Done(out) => {
                if let Some(f) = h.finalizer() {
                    remove_finalizer(h.kube(), h.resource(), &o, f)?;
                }
                Ok(out)
            }
            Cleanup::Pending(v) => finish(h, &o, v),
        };
    }
    let o = match h.finalizer() {
        Some(f) if h.keeps_finalizer(&o, &p) => add_finalizer(h.kube(), h.resource(), &o, f)?,
        _ => o,
    };
    let v = h.apply(&o, p)?;
    finish(h, &o, v)
}

/// Writes the verdict's condition (if any) and answers its outcome.
fn finish<H: HttpClient + ?Sized, X: Handler<H>>(
    h: &mut X,
    o: &X::Object,
    v: Verdict<X::Status>,
) -> Result<Reconciled> {
    if let Some((c, s)) = &v.status {
        h.write_status(o, c, s)?;
    }
    Ok(v.outcome)
}

/// Which errors of an action a handler reports on the object rather than
/// returns: the ones retrying cannot fix (the object as it is is refused).
/// Transient and internal errors are returned (the step answers 5xx and is
/// run again).
pub fn is_verdict(kind: ErrorKind) -> bool {
    !matches!(kind, ErrorKind::Transient | ErrorKind::Internal)
}
