//! Where a blocked [`Replica::acquire`](crate::Replica::acquire) waits for its answer,
//! and how a waiting ticket's end is told: to a callback (a bot's message, a
//! standby), or into such a slot.
//!
//! An uncontended acquire gets its grant in the reply to its own enqueue, on its own
//! thread: the slot is filled and read by that thread with no wake-up. So that this
//! path allocates nothing here, each thread keeps its last slot and reuses it once no
//! filler holds it any more.

use std::cell::RefCell;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::names::shown_chat;
use super::turn::Turn;
use crate::error::{CoordinationUnavailableError, Reason};

/// How a wait ended without a turn.
#[derive(Debug)]
pub(crate) enum NoTurn {
    /// Timed out, lost, the backend unreachable, or the replica stopping.
    Failed(CoordinationUnavailableError),
    /// The message's id was handled meanwhile by a delivery of it elsewhere (the wait
    /// was for that delivery, see [`Enqueued::InFlight`](crate::Enqueued::InFlight)).
    Duplicate,
}

impl std::fmt::Display for NoTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoTurn::Failed(e) => e.fmt(f),
            NoTurn::Duplicate => f.write_str("the message was handled by another delivery"),
        }
    }
}

/// What runs when a queued ticket's wait ends: with the turn, or with why not.
pub(crate) type OnGrant = Box<dyn FnOnce(Result<Turn, NoTurn>) + Send>;

/// What a blocked acquire is answered with.
type Answer = Result<Turn, CoordinationUnavailableError>;

/// The answer of one blocked acquire, filled once.
#[derive(Default)]
pub(crate) struct Slot {
    result: Mutex<Option<Answer>>,
    ready: Condvar,
}

thread_local! {
    /// This thread's slot from its last acquire, for the next one.
    static SPARE: RefCell<Option<Arc<Slot>>> = const { RefCell::new(None) };
}

impl Slot {
    /// A slot for the calling thread's next wait: the thread's own one when nothing
    /// else holds it any more (the last wait returned and its filler is gone), or a
    /// new one, which becomes the thread's.
    pub(crate) fn for_this_thread() -> Arc<Slot> {
        SPARE
            .try_with(|spare| {
                let mut spare = spare.borrow_mut();
                if let Some(slot) = spare.as_mut()
                    && let Some(only) = Arc::get_mut(slot)
                {
                    // A wait that failed before it was placed leaves its filler's
                    // `shutting_down` behind, unread.
                    *only.result.get_mut() = None;
                    return slot.clone();
                }
                let slot = Arc::new(Slot::default());
                *spare = Some(slot.clone());
                slot
            })
            // During thread teardown there is no spare: a slot of its own.
            .unwrap_or_default()
    }

    /// Blocks until the slot is filled; returns the answer.
    pub(crate) fn wait(&self) -> Answer {
        let mut result = self.result.lock();
        loop {
            if let Some(r) = result.take() {
                return r;
            }
            self.ready.wait(&mut result);
        }
    }
}

/// Fills a [`Slot`] once; if dropped unfilled (the replica was aborted and forgot its
/// waiters), fills it with `shutting_down` so the caller never blocks forever.
pub(crate) struct Fill {
    /// `None` once filled.
    slot: Option<Arc<Slot>>,
    /// The chat in its stored form (shown as the caller gave it), for the error.
    chat: Arc<str>,
}

impl Fill {
    pub(crate) fn new(slot: Arc<Slot>, chat: Arc<str>) -> Fill {
        Fill {
            slot: Some(slot),
            chat,
        }
    }

    /// The wait was answered without the slot (see [`Ending::take_turn`]): nothing is
    /// written to it.
    fn disarm(mut self) {
        self.slot = None;
    }

    fn put(mut self, r: Answer) {
        if let Some(slot) = self.slot.take() {
            *slot.result.lock() = Some(r);
            slot.ready.notify_one();
        }
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        // Filled already: nothing may be written again, the slot may be reused by now.
        let Some(slot) = self.slot.take() else {
            return;
        };
        let mut result = slot.result.lock();
        if result.is_none() {
            *result = Some(Err(CoordinationUnavailableError::new(
                Reason::ShuttingDown,
                shown_chat(&self.chat),
                None,
            )));
            slot.ready.notify_one();
        }
    }
}

/// How a waiting ticket's end is told: exactly once, with the turn or why not.
pub(crate) enum Ending {
    /// A callback (a bot's message, a standby's campaign).
    Call(OnGrant),
    /// A blocked acquire's slot. A lock's wait has no message id, so it never ends as
    /// a duplicate; should one, it reads as lost.
    Slot(Fill),
    /// A blocked acquire on the calling thread before its ticket has to wait: the
    /// thread's slot is taken only then (see [`Ending::placed`]), so a turn granted in
    /// the reply to the first call costs no slot, no filler and no shared copy of the
    /// chat's name. Never kept in a waiter.
    Caller,
}

impl From<OnGrant> for Ending {
    fn from(f: OnGrant) -> Ending {
        Ending::Call(f)
    }
}

impl Ending {
    /// The ending to keep in a waiter on `chat` (stored form): a blocked acquire
    /// ([`Ending::Caller`]) takes its thread's slot here and gets it back, to wait on
    /// once the enqueue returns.
    pub(crate) fn placed(self, chat: &Arc<str>) -> (Ending, Option<Arc<Slot>>) {
        match self {
            Ending::Caller => {
                let slot = Slot::for_this_thread();
                (
                    Ending::Slot(Fill::new(slot.clone(), chat.clone())),
                    Some(slot),
                )
            }
            other => (other, None),
        }
    }

    /// Hands `turn` to its waiter: a callback is called with it; a blocked acquire's
    /// turn is returned instead, for the caller on the acquiring thread to return
    /// straight away (a grant in the reply to its own enqueue: no slot, no wake-up).
    pub(crate) fn take_turn(self, turn: Turn) -> Option<Turn> {
        match self {
            Ending::Call(f) => {
                f(Ok(turn));
                None
            }
            Ending::Slot(fill) => {
                fill.disarm();
                Some(turn)
            }
            Ending::Caller => Some(turn),
        }
    }

    /// Tells the ticket's end.
    pub(crate) fn end(self, r: Result<Turn, NoTurn>) {
        match self {
            Ending::Call(f) => f(r),
            Ending::Slot(fill) => {
                let granted = r.is_ok();
                let answer = r.map_err(|no| match no {
                    NoTurn::Failed(e) => e,
                    NoTurn::Duplicate => CoordinationUnavailableError::new(
                        Reason::Lost,
                        shown_chat(&fill.chat),
                        None,
                    ),
                });
                fill.put(answer);
                if granted {
                    // A thread blocked in `acquire` was just woken with the turn, often
                    // onto this core (the releasing or the pushing thread's): yielding
                    // lets it run now rather than after this thread's next steps. Only
                    // here: a bot's callbacks (`Call`) gain nothing from it, and a
                    // yield per handed-on message cost the main job a tenth of its
                    // throughput. W3 in process (1 × 4 threads): handoff p50 lower in
                    // 7 of 7 repeats, 8.1–14.7 µs → 6.0–11.2 µs.
                    std::thread::yield_now();
                }
            }
            // Not reached: a caller's ending is made a slot before its ticket waits,
            // and an answer before that is the enqueue's return value. Dropped, a turn
            // is released.
            Ending::Caller => {}
        }
    }
}
