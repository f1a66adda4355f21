//! Waiting between attempts: exponential back-off with jitter, and what each failure
//! of a call asks for. Pure: the randomness and the time come in as arguments.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use super::http::CallError;

/// Exponential back-off between `min` and `max`, with "equal jitter": each wait is
/// drawn from the upper half of the current step, so replicas that failed together do
/// not retry together, and a wait never drops below half the step (the idea: AWS
/// Architecture Blog, "Exponential Backoff And Jitter", 2015).
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    /// Failures since the last success.
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            failures: 0,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// The wait after one more failure; `random` is any random number.
    pub(crate) fn next(&mut self, random: u64) -> Duration {
        let step = self
            .min
            .saturating_mul(1u32 << self.failures.min(20))
            .min(self.max);
        self.failures = self.failures.saturating_add(1);
        let half = step / 2;
        let span = u64::try_from(half.as_micros()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_micros(random % span)
    }
}

/// A random number for the jitter, from the standard library's randomly seeded
/// hasher (no dependency for this).
pub(crate) fn random() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// What a failed `sendMessage` asks for: `Some(wait)` to try again after `wait`,
/// `None` to give up. Retried: `429` (after its `retry_after`, 1 s when absent), 5xx,
/// and network failures known to have happened before the request went out. Not
/// retried: other API errors (a bad request, a bot blocked by the user) and network
/// failures after the request may have reached Telegram (a retry could post the
/// message twice).
pub(crate) fn send_retry(e: &CallError, backoff: &mut Backoff, random: u64) -> Option<Duration> {
    match e {
        CallError::Api {
            code: 429,
            retry_after,
            ..
        } => Some(retry_after.unwrap_or(Duration::from_secs(1))),
        CallError::Api { code, .. } if *code >= 500 => Some(backoff.next(random)),
        CallError::Network { sent: false, .. } => Some(backoff.next(random)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_doubles_within_bounds_and_jitters_in_the_upper_half() {
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let waits: Vec<Duration> = (0..6).map(|_| b.next(0)).collect();
        assert_eq!(
            waits,
            [50 * MS, 100 * MS, 200 * MS, 400 * MS, 500 * MS, 500 * MS]
        );
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let w = b.next(u64::MAX);
        assert!(w >= 50 * MS && w < 100 * MS, "{w:?}");
        b.reset();
        assert_eq!(b.next(0), 50 * MS);
    }

    #[test]
    fn sends_retry_rate_limits_server_errors_and_unsent_requests_only() {
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let api = |code, retry_after| CallError::Api {
            code,
            description: String::new(),
            retry_after,
        };
        let secs = Duration::from_secs;
        assert_eq!(
            send_retry(&api(429, Some(secs(3))), &mut b, 0),
            Some(secs(3))
        );
        assert_eq!(send_retry(&api(429, None), &mut b, 0), Some(secs(1)));
        assert_eq!(send_retry(&api(502, None), &mut b, 0), Some(50 * MS));
        assert_eq!(send_retry(&api(400, None), &mut b, 0), None);
        assert_eq!(send_retry(&api(403, None), &mut b, 0), None);
        let net = |sent| CallError::Network {
            sent,
            text: String::new(),
        };
        assert!(send_retry(&net(false), &mut b, 0).is_some());
        assert_eq!(send_retry(&net(true), &mut b, 0), None);
    }
}
