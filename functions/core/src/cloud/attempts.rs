//! The attempt loop every HTTP cloud client sends its requests through:
//! build an attempt, bound it by what is left of the budget, send it, and
//! let [`super::retry::decide`] say whether to wait and send again, give
//! up, or keep the answer. A TLS failure or a refusal by the runtime stops
//! at once (retrying cannot help).
//!
//! Imports only `ports` (the transport, the clock) and the seam's error.

use std::cell::Cell;

use http::header::HeaderName;

use super::retry::{decide, Attempt, Next, RetryPolicy, MIN_ATTEMPT_MS};
use super::CloudError;
use crate::ports::http::{headers, Deadline, HttpClient, TransportError, TransportKind};
use crate::ports::Env;

/// Longest connect of one attempt, in milliseconds (at most half of the
/// attempt's deadline: [`Deadline::timeouts`]).
pub const CONNECT_MS: u64 = 3_000;

/// The deadline of one attempt with `left_ms` of the request's budget
/// left: the whole attempt, connecting included, within what is left;
/// connecting within [`CONNECT_MS`] (and half of what is left). With the
/// retry policy's waits, which never end past the budget, a request ends
/// within its budget, whatever the peer does.
///
/// ```
/// use metal_ipam_core::cloud::attempts::attempt_deadline;
/// use metal_ipam_core::ports::http::Deadline;
/// assert_eq!(attempt_deadline(10_000), Deadline { connect_ms: 3_000, total_ms: 10_000 });
/// assert_eq!(attempt_deadline(800).timeouts().connect_ms, 400);
/// ```
pub fn attempt_deadline(left_ms: u64) -> Deadline {
    Deadline {
        connect_ms: CONNECT_MS,
        total_ms: left_ms,
    }
}

/// What the retry policy sees of an attempt's result.
fn attempt_of(result: &Result<http::Response<Vec<u8>>, TransportError>) -> Attempt<'_> {
    match result {
        Ok(r) => {
            let header = |n: &HeaderName| r.headers().get(n).and_then(|v| v.to_str().ok());
            Attempt::Response {
                status: r.status().as_u16(),
                retry_after: header(&headers::RETRY_AFTER),
                rate_limit_reset: header(&headers::X_RATELIMIT_RESET),
            }
        }
        Err(e) if e.kind.not_sent() => Attempt::NotSent,
        Err(_) => Attempt::Transport,
    }
}

/// One request's attempts: the transport, the clock, the policy and a
/// counter of requests sent.
pub struct Attempts<'a, H: HttpClient + ?Sized, E: Env + ?Sized> {
    /// The transport.
    pub http: &'a H,
    /// The clock, the waits and the jitter.
    pub env: &'a E,
    /// The budget and backoff.
    pub policy: RetryPolicy,
    /// Incremented for every attempt sent.
    pub calls: &'a Cell<u32>,
}

impl<H: HttpClient + ?Sized, E: Env + ?Sized> Attempts<'_, H, E> {
    /// Sends what `build` makes until the policy keeps an answer, within
    /// the budget; `seen` is shown every response. `request` (`METHOD
    /// path`) names it in errors; a request that is not `repeatable` (a
    /// `POST`) is not sent again once it may have reached the server.
    ///
    /// # Errors
    /// [`CloudError::Tls`], [`CloudError::Denied`] at once;
    /// [`CloudError::Unavailable`] when the budget does not allow another
    /// attempt; [`CloudError::OutcomeUnknown`] for a request that is not
    /// repeatable and may have taken effect; [`CloudError::Api`] with
    /// status 0 when the request cannot be built. Any kept HTTP status is
    /// an `Ok`.
    pub fn send(
        &self,
        request: &str,
        repeatable: bool,
        build: impl Fn() -> http::Result<http::Request<Vec<u8>>>,
        mut seen: impl FnMut(&http::Response<Vec<u8>>),
    ) -> Result<http::Response<Vec<u8>>, CloudError> {
        let start = self.env.now_ms();
        let mut last = String::new();
        for attempt in 1u32.. {
            let mut req = build().map_err(|e| CloudError::Api {
                status: 0,
                request: request.to_owned(),
                messages: vec![format!("cannot build the request: {e}")],
            })?;
            // This attempt may use what is left of the request's budget. A
            // retry has at least MIN_ATTEMPT_MS of it (the policy's waits
            // leave that much), unless the wait overran: then it stops.
            let left = self
                .policy
                .budget_ms
                .saturating_sub(self.env.now_ms().saturating_sub(start));
            if attempt > 1 && left < MIN_ATTEMPT_MS {
                return Err(CloudError::Unavailable {
                    retry_after_s: 1,
                    detail: format!("{last} after {} attempt(s)", attempt - 1),
                });
            }
            attempt_deadline(left).set(&mut req);
            self.calls.set(self.calls.get() + 1);
            let result = self.http.send(req);
            match &result {
                Err(e) if e.kind == TransportKind::Tls => {
                    return Err(CloudError::Tls {
                        detail: format!("{request}: {e}"),
                    })
                }
                Err(e) if e.kind == TransportKind::Denied => {
                    return Err(CloudError::Denied {
                        detail: format!("{request}: {e}"),
                    })
                }
                Err(_) => {}
                Ok(r) => seen(r),
            }
            last = match &result {
                Err(e) => format!("{request}: {e}"),
                Ok(r) => format!("{request}: {}", r.status().as_u16()),
            };
            let elapsed = self.env.now_ms().saturating_sub(start);
            match decide(
                &self.policy,
                attempt,
                elapsed,
                self.env.now(),
                self.env.random_u64(),
                repeatable,
                &attempt_of(&result),
            ) {
                Next::Wait(ms) => self.env.sleep_ms(ms),
                Next::GiveUp { retry_after_s } => {
                    return Err(CloudError::Unavailable {
                        retry_after_s,
                        detail: format!("{last} after {attempt} attempt(s)"),
                    })
                }
                Next::Unknown => return Err(CloudError::OutcomeUnknown { detail: last }),
                Next::Answer => {
                    return result.map_err(|e| CloudError::OutcomeUnknown {
                        detail: format!("{request}: {e}"),
                    })
                }
            }
        }
        unreachable!("the attempt counter does not run out")
    }
}
