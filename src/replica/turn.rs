//! `Turn`: a held, fenced, leased turn on one chat.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lease::TurnState;
use super::names::shown_chat;
use crate::coordinator::{Previous, Token};
use crate::error::CoordinationUnavailableError;

/// What a turn needs from the replica that holds it. A trait so that `Turn` sits
/// below the replica's core (which makes turns) without the two naming each other.
pub(crate) trait Owner: Send + Sync {
    /// Releases the turn at the coordinator; `handled` makes that message id's
    /// duplicate claim final.
    fn release(
        self: Arc<Self>,
        state: &TurnState,
        handled: Option<&str>,
    ) -> Result<(), CoordinationUnavailableError>;

    /// The present by the replica's clock.
    fn now(&self) -> Instant;
}

/// The turn on one chat, held by this replica: at most one exists per chat across
/// all replicas sharing a coordinator.
///
/// A `Turn` is a lease kept alive by the replica's renewal thread. Dropping it
/// releases it (errors are logged); [`Turn::release`] releases it and reports whether
/// it was still held. Check [`Turn::is_lost`] before an irreversible side effect, and
/// pass [`Turn::fencing_token`] to any store that can refuse stale writers.
pub struct Turn {
    /// Shared with the renewal thread, which extends or loses the lease.
    pub(crate) state: Arc<TurnState>,
    /// The replica that releases it; taken by the release (moved into the owner's
    /// call, not cloned: no reference count taken and dropped per turn), so `None`
    /// once released and `Drop` does not release again.
    owner: Option<Arc<dyn Owner>>,
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
    pub(crate) fn new(state: Arc<TurnState>, owner: Arc<dyn Owner>) -> Turn {
        Turn {
            state,
            owner: Some(owner),
        }
    }

    /// The chat this turn is on, as it was given to [`Replica::acquire`] or in the
    /// message.
    ///
    /// [`Replica::acquire`]: crate::Replica::acquire
    pub fn chat(&self) -> &str {
        shown_chat(&self.state.chat)
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
    /// A grant this replica was given and released unused (to a waiter that had given
    /// up meanwhile) does not count: the holder before it is named instead, since
    /// nothing ran under it.
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

    /// How long the message waited for this turn, from intake to grant. Zero for a
    /// turn the backend granted in its uncontended path, without a place in the queue
    /// (the memory backend's free chat, asked without a message id).
    pub fn waited(&self) -> Duration {
        self.state.waited
    }

    /// Whether the lease was lost: renewal was refused, the backend was unreachable for
    /// longer than the TTL, or the TTL ran out by this replica's own clock since the last
    /// renewal that succeeded (so a holder learns of it no later than the backend
    /// expires the lease, give or take clock drift over one TTL). Once true, it stays
    /// true. A lost turn no longer excludes anyone; stop work.
    pub fn is_lost(&self) -> bool {
        // The owner is only gone once the turn was released, which consumed it.
        self.owner
            .as_ref()
            .is_none_or(|owner| self.state.is_lost_at(owner.now()))
    }

    /// Releases the turn, handing the chat to its next waiter.
    ///
    /// # Errors
    /// [`CoordinationUnavailableError`] with reason `lost` when the lease had been lost
    /// before the release (it expired, another replica took the chat, or this replica
    /// was shut down or aborted while the turn was held), or `backend` when the
    /// coordinator could not be reached (the lease then expires after its TTL). Either
    /// has `handler_started` set: whatever was done under the turn may be out.
    pub fn release(mut self) -> Result<(), CoordinationUnavailableError> {
        // The holder's work ran under the turn: its effects may be out, whatever the
        // release found (`handler_started`).
        self.release_once(None)
            .map_err(CoordinationUnavailableError::after_handler)
    }

    /// Releases after the message was handled, making its duplicate claim final.
    pub(crate) fn release_handled(mut self) -> Result<(), CoordinationUnavailableError> {
        let id = self.state.message_id.clone();
        self.release_once(id.as_deref())
    }

    /// Releases through the owner, taken out so that no later call releases again; a
    /// turn already released releases nothing.
    fn release_once(&mut self, handled: Option<&str>) -> Result<(), CoordinationUnavailableError> {
        match self.owner.take() {
            Some(owner) => owner.release(&self.state, handled),
            None => Ok(()),
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Err(e) = self.release_once(None) {
            log::warn!(target: "botmesh::turn", "release on drop: {e}");
        }
    }
}
