//! Every outbound call ends within the budget the docs state, connect
//! included (issue 26, finding 11): the deadline arithmetic, natively.
//!
//! - a request's [`Deadline`] becomes runtime timeouts whose phases add up
//!   to no more than its total;
//! - a Metal request, its attempts, waits and retries included, ends within
//!   its budget against a peer that holds every attempt as long as the
//!   attempt's deadline lets the transport wait (and answers 5xx, 429 with
//!   any `Retry-After`, or nothing), on a virtual clock;
//! - the Kubernetes and chained deadlines, and the leases and windows that
//!   assume these bounds, agree with each other.
//!
//! The transport's own side (the shell stops waiting at the absolute end
//! whatever the peer does) is tested through the real components in
//! `tests/tests/time_bounds.rs`.

use std::cell::{Cell, RefCell};

use http::Method;
use metal_ipam_core::metal::client::{attempt_deadline, Metal, MetalConfig, MetalError};
use metal_ipam_core::metal::retry::{RetryPolicy, MIN_ATTEMPT_MS};
use metal_ipam_core::network::apply::{CALL_S, LEASE_S};
use metal_ipam_core::network::batch::STEP_DEADLINE;
use metal_ipam_core::ports::http::{Deadline, HttpClient, TransportError, TransportKind};
use metal_ipam_core::ports::Env;
use metal_ipam_core::provision::assign::LOST_ANSWER_S;
use metal_ipam_core::provision::plan::INTENT_LEASE_S;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Connecting plus the first byte, and connecting plus any one gap of
    /// the body, never pass the total; connecting never passes its own
    /// limit; every phase gets some time once the total is 2 ms or more.
    #[test]
    fn the_runtime_timeouts_add_up_to_no_more_than_the_total(
        connect_ms in 0u64..20_000,
        total_ms in 0u64..400_000,
    ) {
        let t = Deadline { connect_ms, total_ms }.timeouts();
        prop_assert!(t.connect_ms <= connect_ms);
        prop_assert!(t.connect_ms + t.first_byte_ms <= total_ms, "{t:?}");
        prop_assert!(t.connect_ms + t.between_bytes_ms <= total_ms, "{t:?}");
        if total_ms >= 2 && connect_ms >= 1 {
            prop_assert!(t.connect_ms >= 1 && t.first_byte_ms >= 1, "{t:?}");
        }
    }
}

/// A clock that moves only when the client waits or a peer holds it.
#[derive(Default)]
struct Clock {
    now_ms: Cell<u64>,
    seq: Cell<u64>,
}

impl Env for Clock {
    fn now(&self) -> u64 {
        self.now_ms.get() / 1000
    }
    fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }
    fn sleep_ms(&self, ms: u64) {
        self.now_ms.set(self.now_ms.get() + ms);
    }
    fn random_u64(&self) -> u64 {
        self.seq.set(self.seq.get() + 1);
        self.seq.get().wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
    fn pause(&self, _attempt: u32) {}
}

/// What the peer does with one attempt: hold it for a share (‰) of what
/// its deadline lets the transport wait, then end it this way.
#[derive(Debug, Clone, Copy)]
enum End {
    /// The transport gives up (the peer never finished the answer).
    TimedOut,
    /// The connection could not be made (nothing sent).
    Refused,
    /// An answer with this status (5xx, or 200).
    Status(u16),
    /// 429 asking for this many seconds.
    RateLimited(u64),
}

/// A peer that holds each attempt as long as its [`Deadline`] lets the
/// transport wait, or a share of it, on the [`Clock`].
struct Holding<'a> {
    clock: &'a Clock,
    peer: RefCell<Vec<(u16, End)>>,
    /// Each attempt: its start and its deadline.
    attempts: RefCell<Vec<(u64, Deadline)>>,
}

impl HttpClient for Holding<'_> {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        let deadline = Deadline::of(&req);
        self.attempts
            .borrow_mut()
            .push((self.clock.now_ms(), deadline));
        let (share, end) = self
            .peer
            .borrow_mut()
            .pop()
            .unwrap_or((1000, End::TimedOut));
        // The longest a transport waits on this attempt: its total.
        let held = deadline.total_ms * u64::from(share.min(1000)) / 1000;
        self.clock.sleep_ms(held);
        let answer = |status: u16, retry_after: Option<u64>| {
            let mut b = http::Response::builder().status(status);
            if let Some(s) = retry_after {
                b = b.header("retry-after", s.to_string());
            }
            Ok(b.body(b"{}".to_vec()).unwrap())
        };
        match end {
            End::TimedOut => Err(TransportError::new(TransportKind::Timeout, "held")),
            End::Refused => Err(TransportError::new(TransportKind::Unreachable, "refused")),
            End::Status(s) => answer(s, None),
            End::RateLimited(s) => answer(429, Some(s)),
        }
    }
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        3 => Just(End::TimedOut),
        1 => Just(End::Refused),
        2 => prop_oneof![Just(500u16), Just(502), Just(503), Just(200)].prop_map(End::Status),
        2 => (0u64..40).prop_map(End::RateLimited),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Whatever the peer does, a Metal request (reads retried, creates
    /// not) ends within its budget, connect included; every attempt after
    /// the first has at least `MIN_ATTEMPT_MS`; no attempt's deadline
    /// passes what is left of the budget.
    #[test]
    fn a_metal_request_ends_within_its_budget_whatever_the_peer_does(
        budget_ms in 600u64..60_000,
        base_ms in 1u64..2_000,
        cap_ms in 1u64..8_000,
        post in any::<bool>(),
        peer in prop::collection::vec((0u16..=1000, end()), 0..12),
    ) {
        let clock = Clock::default();
        clock.sleep_ms(1_000_000);
        let http = Holding {
            clock: &clock,
            peer: RefCell::new(peer.into_iter().rev().collect()),
            attempts: RefCell::new(Vec::new()),
        };
        let cfg = MetalConfig {
            base_url: "http://metal.test/metal/v1".into(),
            token: "t".into(),
            project_id: "p".into(),
            retry: RetryPolicy { budget_ms, base_ms, cap_ms },
        };
        let metal = Metal::new(&http, &cfg, &clock);
        let start = clock.now_ms();
        let method = if post { Method::POST } else { Method::GET };
        let result = metal.send(method, "/vrfs/v1", &[], None);
        let took = clock.now_ms() - start;
        prop_assert!(took <= budget_ms, "took {took} ms of {budget_ms}: {result:?}");
        for (i, (at, d)) in http.attempts.borrow().iter().enumerate() {
            let left = budget_ms - (at - start);
            prop_assert!(d.total_ms <= left, "attempt {i}: {d:?} with {left} ms left");
            if i > 0 {
                prop_assert!(d.total_ms >= MIN_ATTEMPT_MS, "attempt {i}: {d:?}");
            }
        }
        if let Err(e) = result {
            prop_assert!(
                matches!(e, MetalError::Unavailable { .. } | MetalError::OutcomeUnknown { .. } | MetalError::Api { .. }),
                "{e:?}"
            );
        }
    }
}

#[test]
fn an_attempt_uses_what_is_left_and_connects_within_three_seconds() {
    let d = attempt_deadline(10_000);
    assert_eq!(d.total_ms, 10_000);
    assert_eq!(d.timeouts().connect_ms, 3_000);
    assert_eq!(d.timeouts().first_byte_ms, 7_000);
    // Late in the budget, connecting gets at most half of what is left.
    let d = attempt_deadline(MIN_ATTEMPT_MS);
    assert_eq!(d.total_ms, MIN_ATTEMPT_MS);
    assert_eq!(d.timeouts().connect_ms, MIN_ATTEMPT_MS / 2);
}

/// The Kubernetes deadline is the docs' 10 s, connect included; a chained
/// VLAN step is cut when a Metal request would be; the leases and windows
/// that assume bounded calls outlast them.
#[test]
fn the_leases_and_windows_outlast_the_calls_they_assume_bounded() {
    let metal_ms = RetryPolicy::default().budget_ms;
    assert_eq!(metal_ms, 10_000);
    assert_eq!(
        metal_ipam_core::kube::DEADLINE,
        Deadline {
            connect_ms: 3_000,
            total_ms: 10_000
        }
    );
    // network::apply: a call starts only with more than CALL_S of the
    // lease left, so each call the holder makes must end within CALL_S:
    // a Metal request (its whole budget) and a chained VLAN step (cut by
    // the caller at STEP_DEADLINE).
    assert!(metal_ms <= CALL_S * 1000);
    const { assert!(STEP_DEADLINE.total_ms <= CALL_S * 1000) };
    // Rounds start no later than half the lease, well before CALL_S is
    // reached.
    const { assert!(LEASE_S / 2 > CALL_S) };
    // provision::assign: a lost POST is no longer in flight on our side
    // when its intent ends LOST_ANSWER_S after its answer was lost, and a
    // crashed instance's intent (INTENT_LEASE_S) outlasts any request.
    assert!(metal_ms < LOST_ANSWER_S * 1000);
    assert!(metal_ms < INTENT_LEASE_S * 1000);
    // A chained step is bounded; the fallback too. (Checks of constants
    // alone are compile-time checks.)
    const { assert!(Deadline::CHAINED.total_ms <= 150_000) };
    const { assert!(Deadline::FALLBACK.total_ms <= 30_000) };
}
