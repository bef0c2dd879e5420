//! When to retry a cloud API request, and how long to wait: a pure decision
//! from the attempt's outcome, the time spent and a random value, so that
//! every branch is tested without a clock.
//!
//! - **429** was refused before it was processed: always safe to retry,
//!   after `Retry-After` (seconds), else until `X-RateLimit-Reset` (Unix
//!   seconds), else the backoff.
//! - **A connection that could not be made** (refused, unroutable, DNS)
//!   sent nothing: safe to retry, even a POST, with the backoff.
//! - **5xx, dropped connections and timeouts** may have been processed. A request
//!   that is safe to repeat (GET, PUT, DELETE) is retried with jittered
//!   exponential backoff; a POST is not: its outcome is unknown, and the
//!   caller must look the resource up (by tag) before creating it again.
//! - Everything else is the answer.
//!
//! No wait may end past the per-request budget, nor leave less than
//! [`MIN_ATTEMPT_MS`] of it for the attempt that follows: then the caller
//! gives up with a `Retry-After` for its own client, and keeps its
//! progress. The attempts themselves are bounded too: each carries what is
//! left of the budget as its deadline, connecting included
//! (`client::attempt_deadline`), which the transport keeps whatever the
//! peer does. So a request, its attempts, waits and retries included, ends
//! within its budget.

/// The least of the budget a retry is sent with: a wait that would leave
/// less gives up instead.
pub const MIN_ATTEMPT_MS: u64 = 500;

/// Retry limits of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total time one request may take, waits included, in milliseconds.
    pub budget_ms: u64,
    /// Backoff before the first retry (nominal), in milliseconds.
    pub base_ms: u64,
    /// Longest single backoff, in milliseconds.
    pub cap_ms: u64,
}

impl Default for RetryPolicy {
    /// 10 s per request, backoff from 250 ms doubling up to 4 s.
    fn default() -> Self {
        RetryPolicy {
            budget_ms: 10_000,
            base_ms: 250,
            cap_ms: 4_000,
        }
    }
}

/// What one attempt produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt<'a> {
    /// An HTTP response.
    Response {
        /// Its status.
        status: u16,
        /// `Retry-After`, as sent.
        retry_after: Option<&'a str>,
        /// `X-RateLimit-Reset`, as sent.
        rate_limit_reset: Option<&'a str>,
    },
    /// No response, and the request may have been sent (connection
    /// dropped, timeout).
    Transport,
    /// No response, and the request was certainly not sent (connection
    /// refused, unroutable, DNS failure).
    NotSent,
}

/// The decision after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Use this response (success or an error that retrying cannot fix).
    Answer,
    /// Wait this many milliseconds, then send the request again.
    Wait(u64),
    /// The budget does not allow the wait the server or the backoff asks
    /// for: stop, and tell the client to come back in this many seconds.
    GiveUp {
        /// Seconds until a retry is worthwhile (at least 1).
        retry_after_s: u64,
    },
    /// A request that is not safe to repeat failed in a way that may have
    /// taken effect: stop without retrying.
    Unknown,
}

/// The decision after attempt number `attempt` (1 for the first) of a
/// request that `repeatable` or not, `elapsed_ms` into its budget, at Unix
/// time `now_s`, with `random` for the jitter. A wait is only chosen when
/// at least [`MIN_ATTEMPT_MS`] of the budget is left after it.
///
/// # Examples
/// ```
/// use metal_ipam_core::cloud::retry::{decide, Attempt, Next, RetryPolicy};
/// let p = RetryPolicy::default();
/// let limited = Attempt::Response { status: 429, retry_after: Some("2"), rate_limit_reset: None };
/// assert_eq!(decide(&p, 1, 0, 0, 0, true, &limited), Next::Wait(2_000));
/// assert_eq!(decide(&p, 1, 9_000, 0, 0, false, &limited), Next::GiveUp { retry_after_s: 2 });
/// let gone = Attempt::Transport;
/// assert_eq!(decide(&p, 1, 0, 0, 0, false, &gone), Next::Unknown);
/// ```
pub fn decide(
    policy: &RetryPolicy,
    attempt: u32,
    elapsed_ms: u64,
    now_s: u64,
    random: u64,
    repeatable: bool,
    outcome: &Attempt<'_>,
) -> Next {
    let wait = match *outcome {
        Attempt::Response {
            status: 429,
            retry_after,
            rate_limit_reset,
        } => server_wait_ms(retry_after, rate_limit_reset, now_s)
            .unwrap_or_else(|| backoff_ms(policy, attempt, random)),
        Attempt::Response { status, .. } if !(500..=599).contains(&status) => return Next::Answer,
        Attempt::NotSent => backoff_ms(policy, attempt, random),
        _ if !repeatable => return Next::Unknown,
        _ => backoff_ms(policy, attempt, random),
    };
    if elapsed_ms
        .saturating_add(wait)
        .saturating_add(MIN_ATTEMPT_MS)
        > policy.budget_ms
    {
        Next::GiveUp {
            retry_after_s: wait.div_ceil(1000).max(1),
        }
    } else {
        Next::Wait(wait)
    }
}

/// The wait a 429 asks for: `Retry-After` seconds (an HTTP date is not
/// understood and falls through), else `X-RateLimit-Reset` − now.
fn server_wait_ms(retry_after: Option<&str>, reset: Option<&str>, now_s: u64) -> Option<u64> {
    if let Some(s) = retry_after.and_then(|v| v.trim().parse::<u64>().ok()) {
        return Some(s.saturating_mul(1000));
    }
    let reset = reset?.trim().parse::<u64>().ok()?;
    Some(reset.saturating_sub(now_s).max(1).saturating_mul(1000))
}

/// Jittered exponential backoff: nominal `base · 2^(attempt−1)`, spread
/// uniformly over `[nominal/2, 3·nominal/2)`, capped.
///
/// ```
/// use metal_ipam_core::cloud::retry::{backoff_ms, RetryPolicy};
/// let p = RetryPolicy { budget_ms: 60_000, base_ms: 100, cap_ms: 1_000 };
/// assert_eq!(backoff_ms(&p, 1, 0), 50);
/// assert_eq!(backoff_ms(&p, 2, 0), 100);
/// assert!(backoff_ms(&p, 1, u64::MAX) < 150);
/// assert_eq!(backoff_ms(&p, 30, 7), 1_000);
/// ```
pub fn backoff_ms(policy: &RetryPolicy, attempt: u32, random: u64) -> u64 {
    let nominal = policy
        .base_ms
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(20))
        .max(1);
    (nominal / 2 + random % nominal).min(policy.cap_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: RetryPolicy = RetryPolicy {
        budget_ms: 10_000,
        base_ms: 250,
        cap_ms: 4_000,
    };

    fn status(s: u16) -> Attempt<'static> {
        Attempt::Response {
            status: s,
            retry_after: None,
            rate_limit_reset: None,
        }
    }

    #[test]
    fn answers_are_not_retried() {
        for s in [200, 201, 202, 204, 400, 401, 403, 404, 422] {
            assert_eq!(
                decide(&P, 1, 0, 0, 0, true, &status(s)),
                Next::Answer,
                "{s}"
            );
        }
    }

    #[test]
    fn a_429_waits_for_the_server_then_for_the_backoff() {
        let reset = Attempt::Response {
            status: 429,
            retry_after: None,
            rate_limit_reset: Some("1000005"),
        };
        assert_eq!(
            decide(&P, 1, 0, 1_000_000, 0, false, &reset),
            Next::Wait(5_000)
        );
        // A reset in the past still waits a second.
        assert_eq!(
            decide(&P, 1, 0, 2_000_000, 0, false, &reset),
            Next::Wait(1_000)
        );
        let date = Attempt::Response {
            status: 429,
            retry_after: Some("Wed, 21 Oct 2026 07:28:00 GMT"),
            rate_limit_reset: None,
        };
        assert_eq!(decide(&P, 1, 0, 0, 0, false, &date), Next::Wait(125));
    }

    #[test]
    fn server_errors_and_lost_connections_are_retried_only_when_repeatable() {
        for a in [status(500), status(502), status(503), Attempt::Transport] {
            assert_eq!(decide(&P, 1, 0, 0, 0, false, &a), Next::Unknown, "{a:?}");
            assert_eq!(decide(&P, 1, 0, 0, 0, true, &a), Next::Wait(125), "{a:?}");
            assert_eq!(decide(&P, 3, 0, 0, 0, true, &a), Next::Wait(500), "{a:?}");
        }
    }

    #[test]
    fn a_request_that_was_never_sent_is_retried_even_as_a_post() {
        assert_eq!(
            decide(&P, 1, 0, 0, 0, false, &Attempt::NotSent),
            Next::Wait(125)
        );
        assert_eq!(
            decide(&P, 1, 9_990, 0, 0, false, &Attempt::NotSent),
            Next::GiveUp { retry_after_s: 1 }
        );
    }

    #[test]
    fn no_wait_ends_past_the_budget() {
        // 9.9 s spent: a 125 ms backoff would end at 10.025 s.
        assert_eq!(
            decide(&P, 1, 9_900, 0, 0, true, &status(503)),
            Next::GiveUp { retry_after_s: 1 }
        );
        // 9.4 s spent: the backoff would end at 9.525 s, leaving the retry
        // 475 ms, less than MIN_ATTEMPT_MS; 9.375 s is the last point that
        // leaves it 500 ms.
        assert_eq!(
            decide(&P, 1, 9_400, 0, 0, true, &status(503)),
            Next::GiveUp { retry_after_s: 1 }
        );
        assert_eq!(
            decide(&P, 1, 9_375, 0, 0, true, &status(503)),
            Next::Wait(125)
        );
        let long = Attempt::Response {
            status: 429,
            retry_after: Some("30"),
            rate_limit_reset: None,
        };
        assert_eq!(
            decide(&P, 1, 0, 0, 0, true, &long),
            Next::GiveUp { retry_after_s: 30 }
        );
    }

    #[test]
    fn backoff_is_jittered_around_its_nominal_value_and_capped() {
        for attempt in 1..12 {
            let nominal = P.base_ms << (attempt - 1);
            for r in [0, 1, 77, 1 << 40, u64::MAX] {
                let b = backoff_ms(&P, attempt, r);
                assert!(
                    b >= (nominal / 2).min(P.cap_ms) && b <= P.cap_ms,
                    "{attempt} {r} {b}"
                );
                assert!(b < nominal * 3 / 2 || b == P.cap_ms, "{attempt} {r} {b}");
            }
        }
    }
}
