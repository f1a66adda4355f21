//! `Turn`: a held, fenced, leased turn on one chat.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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
}

impl TurnState {
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
    /// The chat this turn is on.
    pub fn chat(&self) -> &str {
        &self.state.chat
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

    /// Whether the lease was lost: renewal was refused, or the backend was unreachable
    /// for longer than the TTL. A lost turn no longer excludes anyone; stop work.
    pub fn is_lost(&self) -> bool {
        self.state.lost.load(Ordering::Acquire)
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
