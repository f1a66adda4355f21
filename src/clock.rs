//! `Clock`: where the turn tables read the time.
//!
//! The logic that decides (the memory backend's chat table, the replica's waiters and
//! leases) takes time from outside, as ureq's core does with its `CurrentTime`: a real
//! clock in production, a fake one in tests, which moves only when told to and so
//! lets a test expire a lease or a wait without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of monotonic time: the real clock ([`Clock::real`], the default) or a
/// fake one for tests ([`Clock::fake`]). Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use botmesh::Clock;
///
/// let clock = Clock::fake();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now() - start, Duration::from_secs(30));
/// ```
#[derive(Clone, Default)]
pub struct Clock {
    fake: Option<Arc<FakeTime>>,
}

/// The fake clock's state: a fixed origin and how far it has been advanced.
struct FakeTime {
    /// Taken from the real clock once, so fake instants mix with real ones in
    /// arithmetic (durations between them stay meaningful).
    origin: Instant,
    /// Nanoseconds advanced since `origin`; atomic so any thread may read or advance.
    offset_ns: AtomicU64,
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.fake {
            None => f.write_str("Clock::real"),
            Some(t) => write!(
                f,
                "Clock::fake(+{:?})",
                Duration::from_nanos(t.offset_ns.load(Ordering::Acquire))
            ),
        }
    }
}

impl Clock {
    /// The real monotonic clock ([`Instant::now`]).
    pub fn real() -> Self {
        Clock { fake: None }
    }

    /// A fake clock, starting at the real clock's present, that moves only through
    /// [`Clock::advance`].
    pub fn fake() -> Self {
        Clock {
            fake: Some(Arc::new(FakeTime {
                origin: Instant::now(),
                offset_ns: AtomicU64::new(0),
            })),
        }
    }

    /// Whether this is a fake clock.
    pub fn is_fake(&self) -> bool {
        self.fake.is_some()
    }

    /// The present.
    pub fn now(&self) -> Instant {
        match &self.fake {
            None => Instant::now(),
            Some(t) => t.origin + Duration::from_nanos(t.offset_ns.load(Ordering::Acquire)),
        }
    }

    /// Moves a fake clock forward by `by` (saturating at about 584 years); does
    /// nothing on the real clock, which moves by itself.
    pub fn advance(&self, by: Duration) {
        if let Some(t) = &self.fake {
            let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            let _ = t
                .offset_ns
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    Some(v.saturating_add(ns))
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_time_moves_only_when_advanced_and_clones_share_it() {
        let clock = Clock::fake();
        let other = clock.clone();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        other.advance(Duration::from_millis(5));
        assert_eq!(clock.now() - t0, Duration::from_millis(5));
        clock.advance(Duration::MAX);
        assert!(clock.now() > t0);
    }
}
