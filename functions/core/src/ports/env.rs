//! Time, randomness and waiting: the environment port.

/// Time, randomness and waiting, supplied by the shell.
pub trait Env {
    /// Unix time in seconds.
    fn now(&self) -> u64;
    /// A random 64-bit value (writer tokens, jitter).
    fn random_u64(&self) -> u64;
    /// Waits a little before retry `attempt` (≥ 1) of a contended update.
    fn pause(&self, attempt: u32);

    /// Unix time in milliseconds (request budgets).
    fn now_ms(&self) -> u64 {
        self.now().saturating_mul(1000)
    }

    /// Waits `ms` milliseconds before retrying an outbound request (a test
    /// environment advances its clock instead).
    fn sleep_ms(&self, ms: u64);

    /// A fresh random token, 16 hex digits: a record's writer, an intent's
    /// owner, a binding's token. Tokens need only differ between concurrent
    /// writers.
    fn token(&self) -> String {
        format!("{:016x}", self.random_u64())
    }
}
