//! `Replica`: one member of a bot's replica set, attached to a coordinator.
//!
//! A replica owns the client side of the turn protocol (`core.rs`): it numbers its
//! tickets, routes grants to whoever waits for them, drops tickets whose wait ran out,
//! and runs the one renewal thread that keeps all its leases alive (`renewal.rs`).
//! The parts below it are plain data judged by a clock passed in: the waiter table
//! (`waiters.rs`), a held lease (`lease.rs`), and the stored form of chat ids
//! (`names.rs`).
//!
//! Waiting never occupies a thread of the replica: a waiter is a callback in a table,
//! run when its grant arrives. [`Replica::acquire`] and its `try_` / `_timeout` /
//! `_deadline` relatives are the blocking forms for code that just wants a
//! distributed per-chat lock.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::coordinator::{BackendError, Coordinator};
use crate::error::{CoordinationUnavailableError, Reason};
use crate::metrics::{Metrics, MetricsSnapshot};

mod client;
mod grants;
mod lease;
mod names;
mod renewal;
mod slot;
mod turn;
mod waiters;

pub use self::client::Accepted;
pub(crate) use self::client::{Inner, NoTurn, OnGrant};
pub(crate) use self::lease::{TurnState, period};
pub(crate) use self::names::provider_lease;
use self::slot::Ending;
pub use self::turn::Turn;

/// The default clock drift allowance for a lease TTL: a twentieth of it (500 ms of a
/// 10 s TTL). A holder whose renewals stop getting through stops acting that long
/// before its lease could run out by its own clock, to cover a backend clock that runs
/// a little faster and the time between a holder's check and its action. It costs
/// nothing while renewals succeed (each puts the end a TTL ahead).
pub(crate) fn default_drift(ttl: Duration) -> Duration {
    ttl / 20
}

/// One replica of a bot: a name, a coordinator, and the threads that keep its leases.
///
/// Threads: one renewal thread (renews every held lease in one coordinator call per
/// tick, every TTL/3, and re-checks waiting tickets for lost wake-ups) and one timer
/// thread (ends waits at their deadline). A replica without coordination (see
/// [`Bot`](crate::Bot)) runs neither.
pub struct Replica {
    pub(crate) inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    stopped: bool,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.inner.id)
            .field("backend", &self.inner.backend())
            .finish()
    }
}

impl Replica {
    /// Attaches a replica named `id` to `coordinator` and starts its renewal and timer
    /// threads.
    ///
    /// # Errors
    /// [`BackendError`] when the coordinator cannot be reached, when a thread cannot
    /// be spawned, when `id` is empty, holds a NUL or is over
    /// [`MAX_REPLICA_ID_BYTES`](crate::MAX_REPLICA_ID_BYTES), when another live replica
    /// uses `id` (or one that crashed less than 1.25 TTLs ago; the memory backend
    /// only: Redis cannot tell two live replicas with one id apart, so give each
    /// process its own), or when the coordinator's lease TTL is under
    /// [`MemoryOptions::MIN_LEASE_TTL`](crate::MemoryOptions::MIN_LEASE_TTL) (10 ms:
    /// renewed every TTL/3, a shorter lease would be lost between renewals), as
    /// `Bot::build` and the configuration refuse it.
    pub fn start(
        id: impl Into<String>,
        coordinator: Arc<dyn Coordinator>,
    ) -> Result<Replica, BackendError> {
        let ttl = coordinator.lease_ttl();
        let least = crate::MemoryOptions::MIN_LEASE_TTL;
        if ttl < least {
            return Err(BackendError::new(format!(
                "the coordinator's lease TTL is {ttl:?}, under the least a replica can keep \
                 ({least:?}: leases are renewed every TTL/3)"
            )));
        }
        let drift = default_drift(ttl);
        Self::start_with(id.into(), coordinator, Arc::default(), true, drift)
    }

    pub(crate) fn start_with(
        id: String,
        coordinator: Arc<dyn Coordinator>,
        metrics: Arc<Metrics>,
        background: bool,
        drift: Duration,
    ) -> Result<Replica, BackendError> {
        let inner = Inner::attach(id, coordinator, metrics, Clock::real(), drift)?;
        let mut replica = Replica {
            inner,
            threads: Vec::new(),
            stopped: false,
        };
        if background {
            let a = replica.inner.clone();
            let renewal = std::thread::Builder::new()
                .name(format!("botmesh-lease-{}", a.id))
                .spawn(move || renewal::renewal_loop(&a))
                .map_err(|e| BackendError::new(format!("cannot spawn a thread: {e}")))?;
            replica.threads.push(renewal);
            replica.start_timer()?;
        }
        Ok(replica)
    }

    /// Starts the timer thread (wait deadlines; a bot's settle cuts and delays) unless
    /// it runs already.
    pub(crate) fn start_timer(&self) -> Result<(), BackendError> {
        self.inner
            .timer
            .start(format!("botmesh-timer-{}", self.inner.id))
            .map_err(|e| BackendError::new(format!("cannot spawn a thread: {e}")))
    }

    /// This replica's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// A snapshot of this replica's counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.snapshot()
    }

    /// Waits for `chat`'s turn, blocking the calling thread, and returns it held.
    /// Turns are granted in FIFO order across replicas. Waits as long as it takes
    /// (like crossbeam-channel's `recv`); see [`Replica::acquire_timeout`] for a
    /// bounded wait.
    ///
    /// Not re-entrant: a replica asking again for a chat it holds queues behind its
    /// own turn, so `acquire` blocks until that turn is released (from another
    /// thread). Each ask is one place in the chat's FIFO queue.
    ///
    /// # Errors
    /// [`CoordinationUnavailableError`] with reason `backend` when the coordinator
    /// could not be reached, `shutting_down` when the replica is stopping, `invalid`
    /// when `chat` is empty or over [`MAX_CHAT_ID_BYTES`](crate::MAX_CHAT_ID_BYTES),
    /// and `lost` when the backend lost the waiting ticket itself (a Redis restart
    /// without persistence that outlasted a TTL, so its liveness lapsed too): the
    /// place in the queue is gone, and asking again queues anew.
    pub fn acquire(&self, chat: &str) -> Result<Turn, CoordinationUnavailableError> {
        self.acquire_for(chat, Duration::MAX)
    }

    /// Takes `chat`'s turn only if it is free now and nobody waits for it: no
    /// waiting, one coordinator round trip.
    ///
    /// # Errors
    /// [`CoordinationUnavailableError`] with reason `timeout` when the chat is held
    /// (by this replica too) or others wait for it, `backend` when the coordinator
    /// could not be reached, `shutting_down` when the replica is stopping, `invalid`
    /// for a bad chat id (as for [`Replica::acquire`]).
    pub fn try_acquire(&self, chat: &str) -> Result<Turn, CoordinationUnavailableError> {
        self.acquire_for(chat, Duration::ZERO)
    }

    /// Waits for `chat`'s turn for at most `timeout`.
    ///
    /// # Errors
    /// [`CoordinationUnavailableError`] with reason `timeout` when the wait ran out
    /// (also when this replica holds the chat itself: see [`Replica::acquire`]),
    /// `backend` when the coordinator could not be reached, `shutting_down` when the
    /// replica is stopping, `invalid` for a bad chat id, `lost` when the backend lost
    /// the waiting ticket (as for [`Replica::acquire`]).
    pub fn acquire_timeout(
        &self,
        chat: &str,
        timeout: Duration,
    ) -> Result<Turn, CoordinationUnavailableError> {
        // The same as a deadline `timeout` from now, without reading the clock here:
        // the wait is counted from the enqueue's own clock read.
        self.acquire_for(chat, timeout)
    }

    /// Waits for `chat`'s turn until `deadline` (an instant of the real clock).
    ///
    /// # Errors
    /// As [`Replica::acquire_timeout`].
    pub fn acquire_deadline(
        &self,
        chat: &str,
        deadline: Instant,
    ) -> Result<Turn, CoordinationUnavailableError> {
        self.acquire_for(chat, deadline.saturating_duration_since(Instant::now()))
    }

    fn acquire_for(
        &self,
        chat: &str,
        wait: Duration,
    ) -> Result<Turn, CoordinationUnavailableError> {
        let placed = self
            .inner
            .enqueue_placed(chat, None, wait, Ending::Caller)?;
        match (placed.turn, placed.slot) {
            (Some(turn), _) => Ok(turn),
            (None, Some(slot)) => slot.wait(),
            // Not reached: a caller's ticket that had no turn in the reply waits in a
            // slot (see `Ending::placed`).
            (None, None) => Err(CoordinationUnavailableError::new(Reason::Lost, chat, None)),
        }
    }

    /// A clean stop: ends the threads, reports waiting tickets as `shutting_down`, and
    /// releases everything this replica holds at the coordinator so other replicas get
    /// its chats at once. Turns still held become lost ([`Turn::is_lost`]), so release
    /// them first. Dropping the `Replica` does the same: keep it alive while you use
    /// its turns.
    pub fn shutdown(mut self) {
        self.stop(false);
    }

    /// A simulated crash: the threads stop and nothing is released or reported; the
    /// replica's leases expire after the TTL and its queued tickets are skipped once its
    /// liveness lapses. Turns still held read as lost. For tests and simulations of
    /// replica failure.
    pub fn abort(mut self) {
        self.stop(true);
    }

    /// First phase of a clean stop (see [`Inner::cancel_waiters`]).
    pub(crate) fn cancel_waiters(&self) {
        self.inner.cancel_waiters();
    }

    fn stop(&mut self, aborted: bool) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if aborted {
            self.inner.set_aborted();
        } else {
            self.inner.cancel_waiters();
        }
        *self.inner.stop.lock() = true;
        self.inner.stop_cv.notify_all();
        self.inner.timer.stop(true);
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!(target: "botmesh::replica", "a background thread panicked");
            }
        }
        self.inner.finish_stop(aborted);
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop(false);
    }
}
