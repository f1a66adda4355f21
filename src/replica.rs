//! `Replica`: one member of a bot's replica set, attached to a coordinator.
//!
//! A replica owns the client side of the turn protocol: it numbers its tickets, routes
//! grants (pushed by the backend, returned by a release, or found by the re-check) to
//! whoever waits for them, drops tickets whose wait ran out, and runs the one renewal
//! thread that keeps all its leases alive (see [`lease`](crate::lease)).
//!
//! Waiting never occupies a thread of the replica: a waiter is a callback in a table,
//! run when its grant arrives. [`Replica::acquire`] is the blocking form for code that
//! just wants a distributed per-chat lock.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The turn table's maps use foldhash (randomly seeded per map, far cheaper than
/// SipHash on short keys): every message costs several lookups.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use parking_lot::{Condvar, Mutex};

use crate::coordinator::{
    BackendError, Coordinator, EnqueueRequest, Enqueued, Grant, GrantSink, Released, ReplicaId,
    Ticket, TicketState, Token, Waiting,
};
use crate::error::{CoordinationUnavailableError, Reason};
use crate::metrics::{Metrics, MetricsSnapshot, dec, inc};
use crate::turn::{Turn, TurnState};

const RUNNING: u8 = 0;
const STOPPING: u8 = 1;
const ABORTED: u8 = 2;

/// The chat id as stored at the coordinator. Names the runtime reserves for its own
/// leases (provider leadership: `"\0provider:<id>"`) start with one NUL; a user's chat
/// id that starts with a NUL is stored with one more in front. So no chat id can meet
/// a reserved name, two chat ids never meet each other, and every other chat id is
/// stored as it is, without a copy.
pub(crate) fn stored_chat(chat: &str) -> Cow<'_, str> {
    if chat.starts_with('\0') {
        Cow::Owned(format!("\0{chat}"))
    } else {
        Cow::Borrowed(chat)
    }
}

/// The chat id as the user gave it, from its stored form (a reserved name shows
/// without its NUL, for logs).
pub(crate) fn shown_chat(stored: &str) -> &str {
    stored.strip_prefix('\0').unwrap_or(stored)
}

/// Whether a stored name is one of the runtime's own leases rather than a chat: those
/// stay out of the turn metrics (a standby's ticket waits for hours by design).
pub(crate) fn is_reserved(stored: &str) -> bool {
    stored.starts_with('\0') && !stored.starts_with("\0\0")
}

/// How long a grant learned of after the fact (a push, a re-check, a cancel) is
/// trusted by this replica's clock before the next renewal confirms it: the backend
/// grants at least two thirds of a TTL to a live replica's ticket, from a moment before
/// we heard of it.
fn pushed_lease(ttl: Duration) -> Duration {
    ttl * 2 / 3
}

/// What runs when a queued ticket's wait ends: with the turn, or with why not.
pub(crate) type OnGrant = Box<dyn FnOnce(Result<Turn, CoordinationUnavailableError>) + Send>;

/// Where a blocked [`Replica::acquire`] waits for its answer.
#[derive(Default)]
struct Slot {
    result: Mutex<Option<Result<Turn, CoordinationUnavailableError>>>,
    ready: Condvar,
}

/// Fills a [`Slot`] once; if dropped unfilled (the replica was aborted and forgot its
/// waiters), fills it with `shutting_down` so the caller never blocks forever.
struct Fill {
    slot: Arc<Slot>,
    chat: Arc<str>,
}

impl Fill {
    fn put(self, r: Result<Turn, CoordinationUnavailableError>) {
        *self.slot.result.lock() = Some(r);
        self.slot.ready.notify_one();
        // `self` drops here with the slot filled; `Drop` sees that and does nothing.
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        let mut result = self.slot.result.lock();
        if result.is_none() {
            *result = Some(Err(CoordinationUnavailableError::new(
                Reason::ShuttingDown,
                &self.chat,
                None,
            )));
            self.slot.ready.notify_one();
        }
    }
}

/// The answer of an intake: the message holds its place, or was a duplicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// The message holds its place in its chat's queue (or already holds the turn).
    Queued,
    /// The message id was seen within the dedup window; it will not run again.
    Duplicate,
}

/// A waiting ticket as the renewal tick lists it: (chat, seq, message id).
pub(crate) type PlacedWaiter = (Arc<str>, u64, Option<Arc<str>>);

pub(crate) struct Waiter {
    chat: Arc<str>,
    message_id: Option<Arc<str>>,
    since: Instant,
    wait: Duration,
    /// Set once the backend confirmed the ticket is queued; only placed tickets are
    /// re-checked, so a ticket whose enqueue is still in flight is never reported lost.
    placed: bool,
    on_grant: OnGrant,
}

pub(crate) struct Inner {
    pub(crate) id: ReplicaId,
    pub(crate) coordinator: Arc<dyn Coordinator>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) ttl: Duration,
    seq: AtomicU64,
    state: AtomicU8,
    waiting: Mutex<HashMap<u64, Waiter>>,
    pub(crate) held: Mutex<HashMap<u64, Arc<TurnState>>>,
    /// Tickets whose enqueue failed (timeout, connection lost) but may have reached the
    /// backend anyway: they are cancelled on the next renewal ticks, so they neither
    /// hold a place nor keep their message id claimed against a redelivery.
    ghosts: Mutex<Vec<PlacedWaiter>>,
    /// Grants that found their waiter taken; released at the next tick unless a held
    /// turn has that very grant (see `deliver`).
    suspects: Mutex<Vec<(Arc<str>, Grant)>>,
    deadlines: Mutex<BinaryHeap<Reverse<(Instant, u64)>>>,
    deadlines_cv: Condvar,
    pub(crate) stop: Mutex<bool>,
    pub(crate) stop_cv: Condvar,
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
            .field("backend", &self.inner.coordinator.backend())
            .finish()
    }
}

impl Replica {
    /// Attaches a replica named `id` to `coordinator` and starts its renewal and timer
    /// threads.
    ///
    /// # Errors
    /// [`BackendError`] when the coordinator cannot be reached, or when a thread cannot
    /// be spawned.
    pub fn start(
        id: impl Into<String>,
        coordinator: Arc<dyn Coordinator>,
    ) -> Result<Replica, BackendError> {
        Self::start_with(id.into(), coordinator, Arc::default(), true)
    }

    pub(crate) fn start_with(
        id: String,
        coordinator: Arc<dyn Coordinator>,
        metrics: Arc<Metrics>,
        background: bool,
    ) -> Result<Replica, BackendError> {
        if id.is_empty() || id.contains('\0') {
            return Err(BackendError::new(format!(
                "replica id {id:?} must be non-empty and free of NUL characters"
            )));
        }
        let ttl = coordinator.lease_ttl();
        let inner = Arc::new(Inner {
            id: id.into(),
            coordinator,
            metrics,
            ttl,
            // Tickets of a restarted replica that reuses its id must not repeat the
            // dead incarnation's: start from the wall clock in ns.
            seq: AtomicU64::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2))
                    .unwrap_or(0),
            ),
            state: AtomicU8::new(RUNNING),
            waiting: Mutex::new(HashMap::default()),
            held: Mutex::new(HashMap::default()),
            ghosts: Mutex::new(Vec::new()),
            suspects: Mutex::new(Vec::new()),
            deadlines: Mutex::new(BinaryHeap::new()),
            deadlines_cv: Condvar::new(),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
        });
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        let sink: GrantSink = Arc::new(move |chat: &str, grant: Grant| {
            if let Some(inner) = weak.upgrade() {
                inner.deliver(chat, grant);
            }
        });
        inner.coordinator.attach(&inner.id, sink)?;
        let mut threads = Vec::new();
        if background {
            let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
                std::thread::Builder::new()
                    .name(name)
                    .spawn(f)
                    .map_err(|e| BackendError::new(format!("cannot spawn a thread: {e}")))
            };
            let a = inner.clone();
            threads.push(spawn(
                format!("botmesh-lease-{}", inner.id),
                Box::new(move || crate::lease::renewal_loop(&a)),
            )?);
            let b = inner.clone();
            threads.push(spawn(
                format!("botmesh-timer-{}", inner.id),
                Box::new(move || b.timer_loop()),
            )?);
        }
        Ok(Replica {
            inner,
            threads,
            stopped: false,
        })
    }

    /// This replica's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// A snapshot of this replica's counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// Waits for `chat`'s turn for at most `wait`, blocking the calling thread, and
    /// returns it held. Turns are granted in FIFO order across replicas.
    ///
    /// # Errors
    /// [`CoordinationUnavailableError`] with reason `timeout` when the wait ran out,
    /// `backend` when the coordinator could not be reached, `shutting_down` when the
    /// replica is stopping.
    pub fn acquire(
        &self,
        chat: &str,
        wait: Duration,
    ) -> Result<Turn, CoordinationUnavailableError> {
        let slot = Arc::new(Slot::default());
        let fill = Fill {
            slot: slot.clone(),
            chat: Arc::from(chat),
        };
        let on_grant: OnGrant = Box::new(move |r| fill.put(r));
        self.inner.enqueue(chat, None, wait, on_grant)?;
        let mut result = slot.result.lock();
        loop {
            if let Some(r) = result.take() {
                return r;
            }
            slot.ready.wait(&mut result);
        }
    }

    /// A clean stop: ends the threads, reports waiting tickets as `shutting_down`, and
    /// releases everything this replica holds at the coordinator so other replicas get
    /// its chats at once. Turns still held become lost ([`Turn::is_lost`]), so release
    /// them first. Dropping the `Replica` does the same: keep it alive while you use
    /// its turns.
    pub fn shutdown(mut self) {
        self.stop(STOPPING);
    }

    /// A simulated crash: the threads stop and nothing is released or reported; the
    /// replica's leases expire after the TTL and its queued tickets are skipped once its
    /// liveness lapses. Turns still held read as lost. For tests and simulations of
    /// replica failure.
    pub fn abort(mut self) {
        self.stop(ABORTED);
    }

    /// First phase of a clean stop: refuse new tickets and end every waiting one with
    /// `shutting_down` (taking it out of its queue). Held turns and the renewal thread
    /// are untouched, so handlers still running keep their leases.
    pub(crate) fn cancel_waiters(&self) {
        let _ = self.inner.state.compare_exchange(
            RUNNING,
            STOPPING,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        let seqs: Vec<u64> = self.inner.waiting.lock().keys().copied().collect();
        // After one failed call the backend is taken as unreachable: the remaining
        // tickets are not cancelled one timeout at a time; they lapse within the TTL.
        let mut reachable = true;
        for seq in seqs {
            // `take_waiter` makes this exactly-once against a grant or the timer.
            let Some(w) = self.inner.take_waiter(seq) else {
                continue;
            };
            let ticket = self.inner.ticket(seq);
            let waiting = Waiting {
                chat: &w.chat,
                ticket: &ticket,
                message_id: w.message_id.as_deref(),
            };
            let cancelled = if reachable {
                self.inner.coordinator.cancel(&waiting)
            } else {
                Ok(None)
            };
            match cancelled {
                Ok(Some(grant)) => {
                    // Granted meanwhile: it may as well run.
                    let valid = Instant::now() + pushed_lease(self.inner.ttl);
                    self.inner.grant_to(w, grant, true, valid);
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    reachable = false;
                    inc(&self.inner.metrics.backend_errors);
                    log::warn!(target: "botmesh::replica", "cancel at shutdown failed: {e}");
                }
            }
            if !is_reserved(&w.chat) {
                inc(&self.inner.metrics.shutting_down);
            }
            (w.on_grant)(Err(CoordinationUnavailableError::new(
                Reason::ShuttingDown,
                shown_chat(&w.chat),
                w.message_id.as_deref(),
            )));
        }
    }

    fn stop(&mut self, how: u8) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if how == ABORTED {
            self.inner.state.store(ABORTED, Ordering::Release);
        } else {
            self.cancel_waiters();
        }
        *self.inner.stop.lock() = true;
        self.inner.stop_cv.notify_all();
        {
            // Notified under the heap's lock: the timer checks `stop` under this lock
            // before it sleeps, so the wake-up cannot fall between check and sleep.
            let _heap = self.inner.deadlines.lock();
            self.inner.deadlines_cv.notify_all();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!(target: "botmesh::replica", "a background thread panicked");
            }
        }
        // Every turn still held is lost from here on: its holder must not act on it.
        let held: Vec<Arc<TurnState>> = self.inner.held.lock().drain().map(|(_, s)| s).collect();
        for state in &held {
            state.lost.store(true, Ordering::Release);
            if !is_reserved(&state.chat) {
                dec(&self.inner.metrics.held);
            }
        }
        if how == ABORTED {
            // Forget the waiters without calling them, as a dead process would.
            let forgotten = self
                .inner
                .waiting
                .lock()
                .drain()
                .filter(|(_, w)| !is_reserved(&w.chat))
                .count();
            for _ in 0..forgotten {
                dec(&self.inner.metrics.waiting);
            }
            return;
        }
        let leases: Vec<_> = held.iter().map(|s| s.lease()).collect();
        if let Err(e) = self.inner.coordinator.detach(&self.inner.id, &leases) {
            log::warn!(target: "botmesh::replica", "detach of replica {} failed: {e}", self.inner.id);
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop(STOPPING);
    }
}

impl Inner {
    pub(crate) fn ticket(&self, seq: u64) -> Ticket {
        Ticket {
            replica: self.id.clone(),
            seq,
        }
    }

    pub(crate) fn take_waiter(&self, seq: u64) -> Option<Waiter> {
        let w = self.waiting.lock().remove(&seq);
        if let Some(w) = &w
            && !is_reserved(&w.chat)
        {
            dec(&self.metrics.waiting);
        }
        w
    }

    /// Confirms a held lease with one renewal round trip before something that must
    /// not run on a stale grant (a pushed grant may arrive late, after the backend
    /// gave the lease to someone else). Extends it by our clock on success.
    pub(crate) fn confirm(&self, state: &TurnState) -> bool {
        let sent = Instant::now();
        let lease = state.lease();
        match self
            .coordinator
            .renew(&self.id, std::slice::from_ref(&lease), &[])
        {
            Ok(r) if r.held.first() == Some(&true) => {
                state.renewed(sent, self.ttl);
                true
            }
            Ok(_) => false,
            Err(e) => {
                inc(&self.metrics.backend_errors);
                log::debug!(target: "botmesh::replica", "confirming a lease failed: {e}");
                false
            }
        }
    }

    /// The chat's checkpoint (see [`Coordinator::read_checkpoint`]).
    pub(crate) fn read_checkpoint(
        &self,
        chat: &str,
    ) -> Result<Option<(Token, String)>, BackendError> {
        self.coordinator
            .read_checkpoint(&stored_chat(chat))
            .inspect_err(|_| inc(&self.metrics.backend_errors))
    }

    /// Writes the chat's checkpoint, fenced (see [`Coordinator::write_checkpoint`]).
    pub(crate) fn write_checkpoint(
        &self,
        chat: &str,
        token: Token,
        data: Option<&str>,
    ) -> Result<bool, BackendError> {
        self.coordinator
            .write_checkpoint(&stored_chat(chat), token, data)
            .inspect_err(|_| inc(&self.metrics.backend_errors))
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.state.load(Ordering::Acquire) == ABORTED
    }

    /// Takes a message of a user's chat in (see [`stored_chat`]).
    pub(crate) fn enqueue(
        self: &Arc<Self>,
        chat: &str,
        message_id: Option<&str>,
        wait: Duration,
        on_grant: OnGrant,
    ) -> Result<Accepted, CoordinationUnavailableError> {
        self.enqueue_stored(&stored_chat(chat), message_id, wait, on_grant)
            .map(|(accepted, _)| accepted)
    }

    /// Places a ticket on a chat given in its stored form (a user's chat, or a
    /// reserved lease name); returns the ticket's sequence number with the answer.
    pub(crate) fn enqueue_stored(
        self: &Arc<Self>,
        chat: &str,
        message_id: Option<&str>,
        wait: Duration,
        on_grant: OnGrant,
    ) -> Result<(Accepted, u64), CoordinationUnavailableError> {
        let metered = !is_reserved(chat);
        if self.state.load(Ordering::Acquire) != RUNNING {
            if metered {
                inc(&self.metrics.shutting_down);
            }
            return Err(CoordinationUnavailableError::new(
                Reason::ShuttingDown,
                shown_chat(chat),
                message_id,
            ));
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let ticket = self.ticket(seq);
        let chat_arc: Arc<str> = Arc::from(chat);
        let since = Instant::now();
        // Registered before the call: a push may arrive before `enqueue` returns.
        self.waiting.lock().insert(
            seq,
            Waiter {
                chat: chat_arc,
                message_id: message_id.map(Arc::from),
                since,
                wait,
                placed: false,
                on_grant,
            },
        );
        if metered {
            inc(&self.metrics.waiting);
        }
        let request = EnqueueRequest {
            chat,
            ticket: &ticket,
            message_id,
            wait,
        };
        let sent = since; // one clock read serves both
        match self.coordinator.enqueue(&request) {
            Ok(Enqueued::Granted(grant)) => {
                if metered {
                    inc(&self.metrics.accepted);
                }
                if let Some(w) = self.take_waiter(seq) {
                    // The lease started after this request was sent.
                    self.grant_to(w, grant, false, sent + self.ttl);
                }
                Ok((Accepted::Queued, seq))
            }
            Ok(Enqueued::Queued) => {
                if metered {
                    inc(&self.metrics.accepted);
                }
                if let Some(w) = self.waiting.lock().get_mut(&seq) {
                    w.placed = true;
                }
                if let Some(deadline) = since.checked_add(wait) {
                    let mut heap = self.deadlines.lock();
                    // Wake the timer only if it now has to wake earlier than planned.
                    let earlier = heap.peek().is_none_or(|Reverse((at, _))| deadline < *at);
                    heap.push(Reverse((deadline, seq)));
                    drop(heap);
                    if earlier {
                        self.deadlines_cv.notify_one();
                    }
                }
                Ok((Accepted::Queued, seq))
            }
            Ok(Enqueued::Duplicate) => {
                inc(&self.metrics.duplicates);
                self.take_waiter(seq);
                Ok((Accepted::Duplicate, seq))
            }
            Err(e) => {
                inc(&self.metrics.backend_errors);
                self.take_waiter(seq);
                self.ghosts
                    .lock()
                    .push((Arc::from(chat), seq, message_id.map(Arc::from)));
                let chat = shown_chat(chat);
                log::warn!(target: "botmesh::replica", "enqueue on chat {chat:?} failed: {e}");
                Err(
                    CoordinationUnavailableError::new(Reason::Backend, chat, message_id)
                        .with_source(e),
                )
            }
        }
    }

    /// Routes a grant to its waiter; a grant nobody waits for is released.
    pub(crate) fn deliver(self: &Arc<Self>, chat: &str, grant: Grant) {
        if self.is_aborted() {
            return;
        }
        match self.take_waiter(grant.ticket.seq) {
            Some(w) => {
                let valid = Instant::now() + pushed_lease(self.ttl);
                self.grant_to(w, grant, true, valid);
            }
            None => {
                // The same grant reached us twice (a push, a release's reply, the
                // re-check, a cancel that found it granted); whoever took the waiter
                // owns it. Releasing it here would free a turn a handler may be using,
                // unless it is a ghost's: nobody uses that one.
                let ghost = {
                    let mut ghosts = self.ghosts.lock();
                    let at = ghosts.iter().position(|g| g.1 == grant.ticket.seq);
                    at.map(|i| ghosts.swap_remove(i))
                };
                if ghost.is_some() {
                    self.release_ghost(chat, &grant);
                } else {
                    // Usually a second copy of a grant a turn now holds. But it may be
                    // a later grant of a requeued copy of the ticket (the re-check
                    // queued it again while an old push was on its way), which nobody
                    // will use and which would hold the chat until its lease lapses.
                    // The next renewal tick tells them apart, once the turn that took
                    // the waiter is surely registered.
                    log::debug!(target: "botmesh::replica", "grant {} on chat {chat:?} already taken", grant.ticket);
                    self.suspects.lock().push((Arc::from(chat), grant));
                }
            }
        }
    }

    /// Turns a grant into a held turn and hands it to the waiter. `valid_until` is when
    /// the lease ends by this replica's own clock, at the latest.
    fn grant_to(self: &Arc<Self>, w: Waiter, grant: Grant, queued: bool, valid_until: Instant) {
        let waited = w.since.elapsed();
        let state = Arc::new(TurnState {
            chat: w.chat,
            ticket: grant.ticket,
            token: grant.token,
            previous: grant.previous,
            message_id: w.message_id,
            waited,
            lost: Default::default(),
            valid_until: std::sync::atomic::AtomicU64::new(crate::turn::clock_ns(valid_until)),
        });
        self.held.lock().insert(state.ticket.seq, state.clone());
        let metered = !is_reserved(&state.chat);
        if metered {
            inc(&self.metrics.granted);
            inc(&self.metrics.held);
            if queued {
                inc(&self.metrics.waited);
            }
            self.metrics.record_wait(waited);
        }
        let turn = Turn {
            state,
            replica: self.clone(),
            done: false,
        };
        if metered && turn.is_handover() {
            inc(&self.metrics.handovers);
        }
        (w.on_grant)(Ok(turn));
    }

    pub(crate) fn release(
        self: &Arc<Self>,
        state: &TurnState,
        handled: Option<&str>,
    ) -> Result<(), CoordinationUnavailableError> {
        let lost_err = || {
            CoordinationUnavailableError::new(
                Reason::Lost,
                shown_chat(&state.chat),
                state.message_id.as_deref(),
            )
        };
        let metered = !is_reserved(&state.chat);
        let was_held = self.held.lock().remove(&state.ticket.seq).is_some();
        if was_held && metered {
            dec(&self.metrics.held);
        }
        if self.is_aborted() {
            // A crashed replica releases nothing; its lease expires.
            return Err(lost_err());
        }
        // Known lost here (by the renewal, or by our own clock): still release at the
        // coordinator, which refuses it if the chat moved on and frees it at once if not.
        let locally_lost = state.is_lost();
        if locally_lost && was_held && metered {
            inc(&self.metrics.lost);
        }
        match self.coordinator.release(&state.lease(), handled) {
            Ok(Released::Released { next }) => {
                if let Some(grant) = next {
                    self.deliver(&state.chat, grant);
                }
                if locally_lost {
                    return Err(lost_err());
                }
                Ok(())
            }
            Ok(Released::Lost) => {
                state.lost.store(true, Ordering::Release);
                if was_held && !locally_lost && metered {
                    inc(&self.metrics.lost);
                }
                Err(lost_err())
            }
            Err(e) => {
                inc(&self.metrics.backend_errors);
                // Known lost is the more useful verdict: the lease is gone either way.
                let reason = if locally_lost {
                    Reason::Lost
                } else {
                    Reason::Backend
                };
                Err(CoordinationUnavailableError::new(
                    reason,
                    shown_chat(&state.chat),
                    state.message_id.as_deref(),
                )
                .with_source(e))
            }
        }
    }

    /// Takes a waiting ticket back because nobody wants its turn any more (a standby
    /// that stops campaigning). A grant that raced with it is released at once; a
    /// ticket the backend could not be told about is cancelled by the next renewal
    /// ticks. The waiter's callback is dropped without being called.
    pub(crate) fn withdraw(self: &Arc<Self>, seq: u64) {
        let Some(w) = self.take_waiter(seq) else {
            return; // granted or ended already: its callback owns the outcome
        };
        let ticket = self.ticket(seq);
        let waiting = Waiting {
            chat: &w.chat,
            ticket: &ticket,
            message_id: w.message_id.as_deref(),
        };
        match self.coordinator.cancel(&waiting) {
            Ok(Some(grant)) => self.release_ghost(&w.chat, &grant),
            Ok(None) => {}
            Err(e) => {
                inc(&self.metrics.backend_errors);
                log::debug!(target: "botmesh::replica", "withdraw failed, retrying on the renewal tick: {e}");
                self.ghosts
                    .lock()
                    .push((w.chat.clone(), seq, w.message_id.clone()));
            }
        }
    }

    fn release_ghost(self: &Arc<Self>, chat: &str, grant: &Grant) {
        let lease = crate::coordinator::HeldLease {
            chat,
            ticket: &grant.ticket,
            token: grant.token,
        };
        match self.coordinator.release(&lease, None) {
            Ok(Released::Released { next: Some(next) }) => self.deliver(chat, next),
            Ok(_) => {}
            Err(e) => log::debug!(target: "botmesh::replica", "ghost release failed: {e}"),
        }
    }

    /// Cancels the tickets whose enqueue failed; called by the renewal tick. Stops at
    /// the first backend error (the rest wait for the next tick).
    /// Releases the grants no held turn uses (see `deliver`); called by the renewal
    /// tick.
    pub(crate) fn release_suspects(self: &Arc<Self>) {
        let suspects = std::mem::take(&mut *self.suspects.lock());
        for (chat, grant) in suspects {
            let in_use = self
                .held
                .lock()
                .get(&grant.ticket.seq)
                .is_some_and(|s| s.token == grant.token);
            if !in_use {
                log::debug!(target: "botmesh::replica", "releasing grant {} on chat {chat:?}: no turn uses it", grant.ticket);
                self.release_ghost(&chat, &grant);
            }
        }
    }

    pub(crate) fn bury_ghosts(self: &Arc<Self>) {
        let ghosts: Vec<PlacedWaiter> = std::mem::take(&mut *self.ghosts.lock());
        let mut left = Vec::new();
        let mut reachable = true;
        for g in ghosts {
            if !reachable {
                left.push(g);
                continue;
            }
            let ticket = self.ticket(g.1);
            let waiting = Waiting {
                chat: &g.0,
                ticket: &ticket,
                message_id: g.2.as_deref(),
            };
            match self.coordinator.cancel(&waiting) {
                Ok(None) => {}
                Ok(Some(grant)) => self.release_ghost(&g.0, &grant),
                Err(_) => {
                    reachable = false;
                    left.push(g);
                }
            }
        }
        self.ghosts.lock().extend(left);
    }

    /// For the renewal tick: per chat, this replica's earliest placed waiting ticket
    /// (chat, seq, message id). Only it can be the next grant among ours, and the
    /// backend keeps a replica's tickets of a chat alive together, so one check per
    /// chat suffices however deep the queue: a backlog does not multiply the tick's
    /// work.
    pub(crate) fn placed_waiters(&self) -> Vec<PlacedWaiter> {
        let mut first: HashMap<Arc<str>, (u64, Option<Arc<str>>)> = HashMap::default();
        for (seq, w) in self.waiting.lock().iter().filter(|(_, w)| w.placed) {
            let e = first
                .entry(w.chat.clone())
                .or_insert_with(|| (*seq, w.message_id.clone()));
            if *seq < e.0 {
                *e = (*seq, w.message_id.clone());
            }
        }
        let mut list: Vec<PlacedWaiter> = first
            .into_iter()
            .map(|(chat, (seq, id))| (chat, seq, id))
            .collect();
        list.sort_unstable_by_key(|w| w.1);
        list
    }

    /// This replica's placed waiting tickets on one chat, in intake order.
    fn placed_on(&self, chat: &str) -> Vec<PlacedWaiter> {
        let mut list: Vec<PlacedWaiter> = self
            .waiting
            .lock()
            .iter()
            .filter(|(_, w)| w.placed && &*w.chat == chat)
            .map(|(seq, w)| (w.chat.clone(), *seq, w.message_id.clone()))
            .collect();
        list.sort_unstable_by_key(|w| w.1);
        list
    }

    /// Acts on the re-check's findings: grants found are delivered (a lost wake-up),
    /// tickets the backend lost are enqueued again.
    pub(crate) fn apply_recheck(
        self: &Arc<Self>,
        waiters: &[PlacedWaiter],
        states: Vec<TicketState>,
    ) {
        for ((chat, seq, message_id), state) in waiters.iter().zip(states) {
            match state {
                TicketState::Granted(grant) => self.deliver(chat, grant),
                TicketState::Waiting => {}
                TicketState::Gone => {
                    // The backend lost our earliest ticket of this chat, so most likely
                    // all of them (a restart): queue them all again, in intake order.
                    let _ = (seq, message_id);
                    for (chat, seq, id) in self.placed_on(chat) {
                        self.requeue(&chat, seq, id.as_deref());
                    }
                }
            }
        }
    }

    /// Puts a ticket the backend lost (a restart without persistence) back in its
    /// queue. It loses its place, but nothing waits forever.
    fn requeue(self: &Arc<Self>, chat: &str, seq: u64, message_id: Option<&str>) {
        let wait = match self.waiting.lock().get(&seq) {
            Some(w) => w.wait.saturating_sub(w.since.elapsed()),
            None => return, // resolved meanwhile
        };
        log::warn!(target: "botmesh::replica", "ticket {seq} of chat {chat:?} was lost by the coordinator; queueing it again");
        let ticket = self.ticket(seq);
        let request = EnqueueRequest {
            chat,
            ticket: &ticket,
            message_id,
            wait,
        };
        match self.coordinator.enqueue(&request) {
            Ok(Enqueued::Granted(grant)) => self.deliver(chat, grant),
            Ok(Enqueued::Queued) => {}
            Ok(Enqueued::Duplicate) => {
                // Another replica handled a redelivery of this message meanwhile.
                if let Some(w) = self.take_waiter(seq) {
                    inc(&self.metrics.duplicates);
                    (w.on_grant)(Err(CoordinationUnavailableError::new(
                        Reason::Lost,
                        shown_chat(&w.chat),
                        w.message_id.as_deref(),
                    )));
                }
            }
            Err(e) => {
                inc(&self.metrics.backend_errors);
                log::warn!(target: "botmesh::replica", "re-queue failed, retrying next tick: {e}");
            }
        }
    }

    fn timer_loop(self: &Arc<Self>) {
        loop {
            let due = {
                let mut heap = self.deadlines.lock();
                loop {
                    if *self.stop.lock() {
                        return;
                    }
                    let now = Instant::now();
                    match heap.peek() {
                        Some(Reverse((at, _))) if *at <= now => break,
                        Some(Reverse((at, _))) => {
                            let at = *at;
                            self.deadlines_cv.wait_until(&mut heap, at);
                        }
                        None => {
                            self.deadlines_cv.wait(&mut heap);
                        }
                    }
                }
                let now = Instant::now();
                let mut due = Vec::new();
                while let Some(Reverse((at, seq))) = heap.peek().copied() {
                    if at > now {
                        break;
                    }
                    heap.pop();
                    due.push(seq);
                }
                due
            };
            for seq in due {
                self.expire(seq);
            }
        }
    }

    /// A waiter's deadline passed: take its ticket out of the queue, unless it was
    /// granted meanwhile.
    fn expire(self: &Arc<Self>, seq: u64) {
        let Some(w) = self.take_waiter(seq) else {
            return; // already granted
        };
        let ticket = self.ticket(seq);
        let waiting = Waiting {
            chat: &w.chat,
            ticket: &ticket,
            message_id: w.message_id.as_deref(),
        };
        match self.coordinator.cancel(&waiting) {
            Ok(Some(grant)) => {
                let valid = Instant::now() + pushed_lease(self.ttl);
                self.grant_to(w, grant, true, valid);
            }
            Ok(None) => {
                inc(&self.metrics.timed_out);
                let err = CoordinationUnavailableError::new(
                    Reason::Timeout,
                    shown_chat(&w.chat),
                    w.message_id.as_deref(),
                );
                log::debug!(target: "botmesh::replica", "{err}");
                (w.on_grant)(Err(err));
            }
            Err(e) => {
                inc(&self.metrics.backend_errors);
                let err = CoordinationUnavailableError::new(
                    Reason::Backend,
                    shown_chat(&w.chat),
                    w.message_id.as_deref(),
                )
                .with_source(e);
                log::debug!(target: "botmesh::replica", "{err}");
                (w.on_grant)(Err(err));
            }
        }
    }
}
