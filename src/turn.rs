//! `Turn`: a held, fenced, leased turn on one chat.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::coordinator::{HeldLease, Previous, Ticket, Token};
use crate::error::CoordinationUnavailableError;
use crate::replica::Inner;

/// What the renewal thread and the holder share about one held turn.
pub(crate) struct TurnState {
    pub(crate) chat: Arc<str>,
    pub(crate) ticket: Ticket,
    pub(crate) token: Token,
    pub(crate) previous: Option<Previous>,
    pub(crate) message_id: Option<Arc<str>>,
    pub(crate) waited: Duration,
    pub(crate) lost: AtomicBool,
    /// When the lease ends by this replica's clock unless renewed ([`clock_ns`]).
    pub(crate) valid_until: AtomicU64,
}

/// Nanoseconds of `t` since a process-wide base instant: a monotonic clock that fits
/// in an atomic.
pub(crate) fn clock_ns(t: Instant) -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

impl TurnState {
    /// Lost by the renewal's verdict, or by our own clock: the lease ran out without a
    /// renewal confirming it (the backend unreachable, a pause). Once lost, always
    /// lost.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if clock_ns(Instant::now()) > self.valid_until.load(Ordering::Acquire) {
            self.lost.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// Whether the lease is lost, or runs out by our clock within `margin` unless a
    /// renewal comes first.
    pub(crate) fn expires_within(&self, margin: Duration) -> bool {
        self.is_lost()
            || clock_ns(Instant::now() + margin) > self.valid_until.load(Ordering::Acquire)
    }

    /// Extends the lease by our clock after a renewal sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        self.valid_until
            .fetch_max(clock_ns(sent + ttl), Ordering::AcqRel);
    }

    pub(crate) fn lease(&self) -> HeldLease<'_> {
        HeldLease {
            chat: &self.chat,
            ticket: &self.ticket,
            token: self.token,
        }
    }
}

/// The turn on one chat, held by this replica: at most one exists per chat across
/// all replicas sharing a coordinator.
///
/// A `Turn` is a lease kept alive by the replica's renewal thread. Dropping it
/// releases it (errors are logged); [`Turn::release`] releases it and reports whether
/// it was still held. Check [`Turn::is_lost`] before an irreversible side effect, and
/// pass [`Turn::fencing_token`] to any store that can refuse stale writers.
pub struct Turn {
    pub(crate) state: Arc<TurnState>,
    pub(crate) replica: Arc<Inner>,
    pub(crate) done: bool,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("chat", &self.chat())
            .field("token", &self.state.token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Turn {
    /// The chat this turn is on, as it was given to [`Replica::acquire`] or in the
    /// message.
    ///
    /// [`Replica::acquire`]: crate::Replica::acquire
    pub fn chat(&self) -> &str {
        crate::replica::shown_chat(&self.state.chat)
    }

    /// The id of the replica holding the turn.
    pub fn replica(&self) -> &str {
        &self.state.ticket.replica
    }

    /// The grant's fencing token: strictly greater than the token of every earlier
    /// turn on this chat (Kleppmann 2016).
    pub fn fencing_token(&self) -> Token {
        self.state.token
    }

    /// The previous holder of this chat's turn, if the backend still remembered it.
    pub fn previous(&self) -> Option<&Previous> {
        self.state.previous.as_ref()
    }

    /// Whether the chat was last held by another replica: a handover.
    pub fn is_handover(&self) -> bool {
        self.state
            .previous
            .as_ref()
            .is_some_and(|p| p.replica != self.state.ticket.replica)
    }

    /// How long the message waited for this turn, from intake to grant.
    pub fn waited(&self) -> Duration {
        self.state.waited
    }

    /// Whether the lease was lost: renewal was refused, the backend was unreachable for
    /// longer than the TTL, or the TTL ran out by this replica's own clock since the last
    /// renewal that succeeded (so a holder learns of it no later than the backend
    /// expires the lease, give or take clock drift over one TTL). Once true, it stays
    /// true. A lost turn no longer excludes anyone; stop work.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Releases the turn, handing the chat to its next waiter.
    ///
    /// # Errors
    /// [`CoordinationUnavailableError`] with reason `lost` when the lease had been lost
    /// before the release, or `backend` when the coordinator could not be reached (the
    /// lease then expires after its TTL).
    pub fn release(mut self) -> Result<(), CoordinationUnavailableError> {
        self.done = true;
        self.replica.release(&self.state, None)
    }

    /// Releases after the message was handled, making its duplicate claim final.
    pub(crate) fn release_handled(mut self) -> Result<(), CoordinationUnavailableError> {
        self.done = true;
        let id = self.state.message_id.clone();
        self.replica.release(&self.state, id.as_deref())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.done
            && let Err(e) = self.replica.release(&self.state, None)
        {
            log::warn!(target: "botmesh::turn", "release on drop: {e}");
        }
    }
}
