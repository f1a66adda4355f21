//! One run of a conversation's steps under a turn: what the settle watchdog shares
//! with the worker, and what the run needs from the bot.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::checkpoint::Conversation;
use crate::coordinator::{BackendError, Token};
use crate::flow::{Cancelled, StepRun};
use crate::message::Message;
use crate::provider::{ProviderError, Reply};
use crate::replica::Turn;

/// The cancellation flag of one run of steps, with the condvar its sleeps wait on.
#[derive(Default)]
pub(crate) struct Control {
    cancelled: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Control {
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    pub(crate) fn cancel(&self) {
        // Set under the lock: a sleeper checks the flag under it before waiting, so it
        // cannot miss this notification.
        let _g = self.lock.lock();
        self.cancelled.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Waits until `deadline` or a cancellation, at most `slice` at a time (so that
    /// the caller can check for a lost lease, which nobody notifies). Returns whether
    /// the deadline passed.
    fn wait(&self, deadline: Instant, slice: Duration) -> bool {
        let mut g = self.lock.lock();
        if self.is_cancelled() {
            return false;
        }
        let until = deadline.min(Instant::now() + slice);
        self.cv.wait_until(&mut g, until);
        Instant::now() >= deadline
    }
}

impl StepRun for RunSlot {
    /// Cancelled by a settle cut, or the turn's lease was lost.
    fn is_cancelled(&self) -> bool {
        self.control.is_cancelled() || self.inner.lock().turn.as_ref().is_none_or(Turn::is_lost)
    }

    fn sleep(&self, duration: Duration) -> Result<(), Cancelled> {
        const SLICE: Duration = Duration::from_millis(50);
        let deadline = Instant::now()
            .checked_add(duration)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
        loop {
            if self.is_cancelled() {
                return Err(Cancelled);
            }
            if self.control.wait(deadline, SLICE) {
                return if self.is_cancelled() {
                    Err(Cancelled)
                } else {
                    Ok(())
                };
            }
        }
    }
}

/// The part of a run of steps that the settle watchdog shares with the worker.
#[derive(Default)]
pub(crate) struct RunSlot {
    /// Set by the watchdog's cut; wakes the step's sleeps.
    pub(crate) control: Control,
    /// Who finished the run first, and what the other side then needs.
    pub(crate) inner: Mutex<SlotInner>,
}

/// Guarded by the run's lock.
#[derive(Default)]
pub(crate) struct SlotInner {
    /// The watchdog stopped the run: it released the turn and ended the message.
    pub(crate) cut: bool,
    /// The worker finished the run first.
    pub(crate) done: bool,
    /// The conversation at the last boundary: what the chat's next message resumes.
    pub(crate) snapshot: Option<Conversation>,
    /// Whether a checkpoint was stored at the last boundary.
    pub(crate) stored: bool,
    /// The turn the run is under, until the worker or the watchdog releases it.
    pub(crate) turn: Option<Turn>,
    /// The message that fed the run, ended by whoever releases the turn.
    pub(crate) message: Option<Arc<Message>>,
}

/// What a run of steps needs from the runtime.
pub(crate) struct Run<'a> {
    pub(crate) token: Token,
    pub(crate) slot: &'a RunSlot,
    pub(crate) store: &'a dyn CheckpointStore,
    pub(crate) outbox: &'a dyn Fn(&Reply) -> Result<(), ProviderError>,
    pub(crate) schedule_wake: &'a dyn Fn(u64),
}

pub(crate) fn send_logged(run: &Run<'_>, chat: &str, reply: &Reply) {
    if let Err(e) = (run.outbox)(reply) {
        log::warn!(target: "botmesh::conversation", "chat {chat:?}: send failed: {e}");
    }
}

/// Checkpoint storage: the coordinator, through the replica (which maps chat ids to
/// the coordinator's keys).
pub(crate) trait CheckpointStore {
    /// See [`Coordinator::read_checkpoint`](crate::Coordinator::read_checkpoint).
    fn read(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError>;
    /// See [`Coordinator::write_checkpoint`](crate::Coordinator::write_checkpoint).
    fn write(&self, chat: &str, token: Token, data: Option<&str>) -> Result<bool, BackendError>;
}
