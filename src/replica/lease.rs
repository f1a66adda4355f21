//! What a replica knows about one lease it holds, judged by its own clock.
//!
//! A holder cannot ask the backend before every action whether its lease still
//! stands; it keeps its own deadline instead: the send time of the last renewal that
//! succeeded, plus the TTL (Gray & Cheriton 1989). The lease is lost once that passes
//! or the backend refuses a renewal. All checks take the present as an argument.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::names::ChatName;
use crate::coordinator::{HeldLease, Previous, Ticket, Token};

/// The renewal period for a TTL: a third of it, so two renewals may fail before the
/// lease lapses.
pub(crate) fn period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// Nanoseconds of `t` since a process-wide base instant: a monotonic clock that fits
/// in an atomic. Instants before the base (a fake clock's, say) read as 0.
pub(crate) fn clock_ns(t: Instant) -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

/// What the renewal thread and the holder share about one held turn.
pub(crate) struct TurnState {
    /// The chat, in its stored form (see `names`), inline up to 24 bytes: the turn
    /// of a free chat is then made without allocating for its name.
    pub(crate) chat: ChatName,
    /// The ticket the grant went to; identifies the lease at the backend.
    pub(crate) ticket: Ticket,
    /// The grant's fencing token.
    pub(crate) token: Token,
    /// Who held the chat before, for the handover decision.
    pub(crate) previous: Option<Previous>,
    /// The message's id, whose duplicate claim the release makes final.
    pub(crate) message_id: Option<Arc<str>>,
    /// From intake to grant, for the metrics and the outcome.
    pub(crate) waited: Duration,
    /// Set once by a refused renewal, an unreachable backend or our own clock.
    pub(crate) lost: AtomicBool,
    /// When the lease ends by this replica's clock unless renewed ([`clock_ns`]).
    pub(crate) valid_until: AtomicU64,
    /// Set as its release starts. The turn stays in the replica's `held` until the
    /// backend answered, so the tick neither takes a second copy of its grant for a
    /// ghost nor counts it lost when a renewal in flight is refused. A flag here
    /// costs a plain store; a list of releases in flight cost two lock round trips.
    pub(crate) releasing: AtomicBool,
}

impl TurnState {
    /// Lost by the renewal's verdict, or by our own clock at `now`: the lease ran out
    /// without a renewal confirming it (the backend unreachable, a pause). Once lost,
    /// always lost.
    pub(crate) fn is_lost_at(&self, now: Instant) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if clock_ns(now) > self.valid_until.load(Ordering::Acquire) {
            self.lost.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// Whether the lease is lost at `now`, or runs out by our clock within `margin`
    /// unless a renewal comes first.
    pub(crate) fn expires_within(&self, now: Instant, margin: Duration) -> bool {
        self.is_lost_at(now) || clock_ns(now + margin) > self.valid_until.load(Ordering::Acquire)
    }

    /// Extends the lease by our clock after a renewal sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        self.valid_until
            .fetch_max(clock_ns(sent + ttl), Ordering::AcqRel);
    }

    /// Marks the lease lost; returns whether it was not marked before.
    pub(crate) fn mark_lost(&self) -> bool {
        !self.lost.swap(true, Ordering::AcqRel)
    }

    /// The lease as the coordinator's calls name it.
    pub(crate) fn lease(&self) -> HeldLease<'_> {
        HeldLease {
            chat: &self.chat,
            ticket: &self.ticket,
            token: self.token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Clock;

    fn state(valid_until: Instant) -> TurnState {
        TurnState {
            chat: "c".into(),
            ticket: Ticket {
                replica: Arc::from("r"),
                seq: 1,
            },
            token: 7,
            previous: None,
            message_id: None,
            waited: Duration::ZERO,
            lost: AtomicBool::new(false),
            valid_until: AtomicU64::new(clock_ns(valid_until)),
            releasing: AtomicBool::new(false),
        }
    }

    #[test]
    fn a_lease_is_lost_by_our_clock_once_its_ttl_passes_unrenewed() {
        let clock = Clock::fake();
        let ttl = Duration::from_secs(3);
        let s = state(clock.now() + ttl);
        clock.advance(ttl - Duration::from_millis(1));
        assert!(!s.is_lost_at(clock.now()));
        assert!(s.expires_within(clock.now(), Duration::from_millis(2)));
        // A renewal sent now moves the end a TTL ahead of its send time.
        s.renewed(clock.now(), ttl);
        clock.advance(Duration::from_secs(2));
        assert!(!s.is_lost_at(clock.now()));
        clock.advance(Duration::from_secs(2));
        assert!(s.is_lost_at(clock.now()));
        // Once lost, always lost: a late renewal does not bring it back.
        s.renewed(clock.now(), ttl);
        assert!(s.is_lost_at(clock.now()));
    }

    #[test]
    fn a_refused_renewal_marks_it_lost_once() {
        let clock = Clock::fake();
        let s = state(clock.now() + Duration::from_secs(10));
        assert!(s.mark_lost());
        assert!(!s.mark_lost());
        assert!(s.is_lost_at(clock.now()));
    }

    #[test]
    fn renewal_period_leaves_two_chances_before_expiry() {
        assert_eq!(period(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(period(Duration::ZERO), Duration::from_millis(1));
    }
}
