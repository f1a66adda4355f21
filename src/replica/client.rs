//! The client side of the turn protocol, for one replica: it numbers its tickets,
//! routes grants (pushed by the backend, returned by a release, or found by the
//! re-check) to whoever waits for them, ends waits at their deadline, and renews its
//! leases. [`Replica`](crate::Replica) (in `mod.rs`) is the handle that owns its
//! threads.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::lease::{TurnState, clock_ns};
use super::names::{ChatName, is_reserved, shown_chat, stored_chat};
pub(crate) use super::slot::{Ending, NoTurn, OnGrant};
use super::turn::{Owner, Turn};
use super::waiters::{PlacedWaiter, Waiters};
use crate::clock::Clock;
use crate::coordinator::{
    BackendError, Coordinator, EnqueueRequest, Enqueued, Grant, Previous, Released, ReplicaId,
    Ticket, Token, Waiting,
};
use crate::error::{CoordinationUnavailableError, Reason};
use crate::metrics::{Metrics, inc};
use crate::timer::Timer;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// How often a replica without a renewal thread asks again about a message whose id
/// is in flight on an earlier delivery (see `retry_later_unless_ticking`).
const LOCAL_RETRY: Duration = Duration::from_millis(20);

const RUNNING: u8 = 0;
const STOPPING: u8 = 1;
const ABORTED: u8 = 2;

pub(super) type Waiter = super::waiters::Waiter<Ending>;

/// What placing a ticket came to.
pub(crate) struct Placed {
    /// The intake's answer.
    pub(crate) accepted: Accepted,
    /// The ticket's sequence number.
    pub(crate) seq: u64,
    /// A blocked acquire's turn ([`Ending::Slot`]), when it was granted in the reply to
    /// the enqueue: returned here instead of through its slot. `None` for a callback,
    /// which got the turn itself.
    pub(crate) turn: Option<Turn>,
    /// Where a blocked acquire ([`Ending::Caller`]) whose ticket had to wait is
    /// answered; `None` for a callback, or when `turn` is the answer.
    pub(crate) slot: Option<Arc<super::slot::Slot>>,
}

/// The answer of an intake: the message holds its place, or was a duplicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// The message is taken in: it holds its place in its chat's queue (or already
    /// holds the turn), or, when its id is still in flight on another replica, it
    /// waits for that delivery and ends as a duplicate once that one was handled (or
    /// runs, if that one's replica died first). Either way it ends exactly once.
    Queued,
    /// The message id counts as handled in its chat, so it will not run again: a
    /// delivery of it ran to its end (with success or with a handler error: a failed
    /// message is not run again by a redelivery) within the dedup window, and the chat
    /// still remembers it (its newest `dedup_ids` handled ids), or it is a numeric id at
    /// or under the chat's floor for rising ids. The README's *Duplicates* section says
    /// exactly when an old id can run again, and when Redis remembers one longer.
    Duplicate,
}

/// One replica's side of the protocol, shared by its handle, its threads, its turns
/// and the grant sink it gave the backend.
pub(crate) struct Inner {
    /// This replica's name at the coordinator.
    pub(crate) id: ReplicaId,
    /// The backend shared with the other replicas.
    pub(super) coordinator: Arc<dyn Coordinator>,
    /// Counters the bot and the handle report.
    pub(crate) metrics: Arc<Metrics>,
    /// The backend's lease TTL, read once at start.
    pub(crate) ttl: Duration,
    /// How long a lease is trusted by this replica's clock from the moment its grant
    /// or renewal was sent: the TTL less the drift allowance, so a holder stops acting
    /// before the backend's clock (on another host, running a little faster) could
    /// give the chat to someone else.
    pub(crate) trusted: Duration,
    /// The backend's [`Coordinator::pushes_need_confirmation`], read once: a pushed
    /// grant then always costs a confirming renewal before it runs.
    pub(super) confirm_pushes: bool,
    /// When the renewal thread last started a tick ([`clock_ns`]). A grant pushed
    /// while it has been silent for over a renewal period may have sat unread while
    /// this process was paused or starved, and lapsed meanwhile: it is confirmed with
    /// one renewal round trip before a handler may act on it.
    pub(super) last_tick: AtomicU64,
    /// Until when grants are confirmed anyway ([`clock_ns`]): a tick that finds the
    /// one before it too long ago (the process was paused) sets it one renewal period
    /// ahead, for pushes read after the renewal thread already ran again.
    pub(super) confirm_until: AtomicU64,
    /// Where "now" comes from: real, or fake in tests.
    pub(super) clock: Clock,
    /// Set once the renewal thread runs: it asks again about in-flight duplicates;
    /// without it (no coordination) the timer does.
    pub(crate) ticking: AtomicBool,
    /// The last ticket sequence number handed out.
    pub(super) seq: AtomicU64,
    /// The first sequence number of this incarnation: tickets below it are a dead
    /// predecessor's with the same id (a restarted process), whose grants nobody here
    /// waits for and which are released at once. Also the incarnation named at attach
    /// and detach, so that a stale run's stop cannot detach a later run of the id.
    pub(super) first_seq: u64,
    /// `RUNNING`, `STOPPING` (no new tickets) or `ABORTED` (a simulated crash).
    state: AtomicU8,
    /// Tickets waiting for their grant.
    pub(super) waiting: Mutex<Waiters<Ending>>,
    /// Held turns by ticket sequence number, renewed by the renewal thread.
    pub(super) held: Mutex<HashMap<u64, Arc<TurnState>>>,
    /// Tickets whose enqueue failed (timeout, connection lost) but may have reached the
    /// backend anyway: they are cancelled on the next renewal ticks, so they neither
    /// hold a place nor keep their message id claimed against a redelivery.
    pub(super) ghosts: Mutex<Vec<PlacedWaiter>>,
    /// Grants that found their waiter taken; released at the next tick unless a held
    /// turn has that very grant (see `deliver`).
    pub(super) suspects: Mutex<Vec<(Arc<str>, Grant)>>,
    /// Grants this replica released unused (see `release_ghost`), newest last, at
    /// most `UNUSED_KEPT` (in `grants`): (stored chat, token, the previous holder that grant
    /// named). Nothing ran under such a grant, so a later grant naming it as its
    /// previous holder names that one's previous instead: a turn's `previous` and
    /// `is_handover` must show the last holder that could have done work (a waiter
    /// that gave up on a chat, then asked again, would otherwise see itself).
    pub(super) unused: Mutex<Vec<(ChatName, Token, Option<Previous>)>>,
    /// Tickets whose waiter was taken by a path that may still turn a grant into a
    /// held turn (a push being confirmed, a cancel that may come back granted): until
    /// the turn is in `held`, a second copy of its grant must not be released by the
    /// tick as a suspect, or the handler would run on a turn freed under it.
    pub(super) in_hand: Mutex<HashSet<u64>>,
    /// Wait deadlines, and for a bot with flows its settle cuts and delays.
    pub(crate) timer: Timer,
    /// Told when a release leaves `held`: a stop waits on it for the releases
    /// already on their way (see `finish_stop`). Telling nobody costs a load.
    released_cv: Condvar,
    /// Set by a stop; the renewal thread waits on `stop_cv` between ticks.
    pub(crate) stop: Mutex<bool>,
    pub(crate) stop_cv: Condvar,
}

impl Inner {
    /// Makes a replica's core and attaches it to `coordinator`, which will push this
    /// replica's grants to it.
    ///
    /// # Errors
    /// [`BackendError`] when the id is empty, has a NUL or is over
    /// [`MAX_REPLICA_ID_BYTES`](crate::MAX_REPLICA_ID_BYTES), or the coordinator refuses
    /// or cannot be reached.
    pub(crate) fn attach(
        id: String,
        coordinator: Arc<dyn Coordinator>,
        metrics: Arc<Metrics>,
        clock: Clock,
        drift: Duration,
    ) -> Result<Arc<Inner>, BackendError> {
        crate::message::check_replica_id(&id).map_err(BackendError::new)?;
        let ttl = coordinator.lease_ttl();
        let confirm_pushes = coordinator.pushes_need_confirmation();
        // Tickets of a restarted replica that reuses its id must not repeat the dead
        // incarnation's: start from the wall clock in ns.
        let first_seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2))
            .unwrap_or(0);
        let inner = Arc::new(Inner {
            id: id.into(),
            coordinator,
            metrics,
            ttl,
            trusted: ttl.saturating_sub(drift),
            confirm_pushes,
            last_tick: AtomicU64::new(clock_ns(clock.now())),
            confirm_until: AtomicU64::new(0),
            ticking: AtomicBool::new(false),
            clock,
            seq: AtomicU64::new(first_seq),
            first_seq: first_seq + 1,
            state: AtomicU8::new(RUNNING),
            waiting: Mutex::new(Waiters::default()),
            held: Mutex::new(HashMap::default()),
            in_hand: Mutex::new(HashSet::default()),
            ghosts: Mutex::new(Vec::new()),
            suspects: Mutex::new(Vec::new()),
            unused: Mutex::new(Vec::new()),
            timer: Timer::default(),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            released_cv: Condvar::new(),
        });
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        let sink: crate::coordinator::GrantSink = Arc::new(move |chat: &str, grant: Grant| {
            if let Some(inner) = weak.upgrade() {
                inner.deliver_pushed(chat, grant);
            }
        });
        let run = inner.first_seq;
        inner.coordinator.attach_incarnation(&inner.id, run, sink)?;
        Ok(inner)
    }

    /// The backend's short name, for logs.
    pub(crate) fn backend(&self) -> &'static str {
        self.coordinator.backend()
    }

    /// `t` of this replica's clock as a reading of the real clock, for a backend that
    /// may take it as the present ([`Coordinator::grant_if_free`]): `t` itself on the
    /// real clock, the real present on a fake one (a test's).
    pub(super) fn real(&self, t: Instant) -> Instant {
        if self.clock.is_fake() {
            Instant::now()
        } else {
            t
        }
    }

    /// A snapshot of the replica's metrics, with the gauge of turns held read from
    /// its table of held turns (a turn being released counts until the backend
    /// answered; the provider leases, reserved names, do not count).
    pub(crate) fn snapshot(&self) -> crate::MetricsSnapshot {
        let mut m = self.metrics.snapshot();
        let held = self.held.lock();
        let users = held.values().filter(|s| !is_reserved(&s.chat)).count();
        m.turns_held = u64::try_from(users).unwrap_or(u64::MAX);
        m
    }

    /// The present by this replica's clock.
    pub(crate) fn now(&self) -> Instant {
        self.clock.now()
    }

    /// First phase of a clean stop: refuse new tickets and end every waiting one with
    /// `shutting_down` (taking it out of its queue). Held turns and the renewal thread
    /// are untouched, so handlers still running keep their leases.
    pub(crate) fn cancel_waiters(self: &Arc<Self>) {
        let (running, stopping) = (RUNNING, STOPPING);
        let _ =
            (self.state).compare_exchange(running, stopping, Ordering::AcqRel, Ordering::Acquire);
        let seqs = self.waiting.lock().seqs();
        // After one failed call the backend is taken as unreachable: the remaining
        // tickets are not cancelled one timeout at a time; they lapse within the TTL.
        let mut reachable = true;
        for seq in seqs {
            // Taking the waiter makes this exactly-once against a grant or the timer.
            let Some((w, _in_hand)) = self.take_in_hand(seq) else {
                continue;
            };
            let ticket = self.ticket(seq);
            let waiting = Waiting {
                chat: &w.chat,
                ticket: &ticket,
                message_id: w.message_id.as_deref(),
            };
            let cancelled = if reachable {
                self.coordinator.cancel(&waiting)
            } else {
                Ok(None)
            };
            match cancelled {
                Ok(Some(grant)) => {
                    // Granted meanwhile: it may as well run.
                    let chat = w.chat.clone();
                    self.use_grant(&chat, w, grant, None, false);
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    reachable = false;
                    inc(&self.metrics.backend_errors);
                    log::warn!(target: "botmesh::replica", "cancel at shutdown failed: {e}");
                }
            }
            if !is_reserved(&w.chat) {
                inc(&self.metrics.shutting_down);
            }
            w.on_grant
                .end(Err(NoTurn::Failed(CoordinationUnavailableError::new(
                    Reason::ShuttingDown,
                    shown_chat(&w.chat),
                    w.message_id.as_deref(),
                ))));
        }
    }

    /// Last phase of a stop, once the threads are gone: every turn still held is lost
    /// from here on (its holder must not act on it). A clean stop then releases them
    /// all at the coordinator; a crash forgets its waiters without calling them, as a
    /// dead process would. Releases already on their way are waited for first (one
    /// TTL at most): released by the stop as well, without its message id (the
    /// memory backend's `detach` releases every lease of the replica), such a turn
    /// would find its own release refused and report a handled message `lost`.
    pub(crate) fn finish_stop(&self, aborted: bool) {
        let releasing = |s: &Arc<TurnState>| s.releasing.load(Ordering::Acquire);
        let held: Vec<Arc<TurnState>> = {
            let mut held = self.held.lock();
            let until = Instant::now() + self.ttl;
            while !aborted && held.values().any(releasing) {
                if self.released_cv.wait_until(&mut held, until).timed_out() {
                    break;
                }
            }
            // One still on its way after that is left to its own release.
            held.drain()
                .map(|(_, s)| s)
                .filter(|s| !releasing(s))
                .collect()
        };
        for state in &held {
            state.lost.store(true, Ordering::Release);
        }
        if aborted {
            // Dropped without being called; `acquire`'s slot fills itself on drop.
            let forgotten: Vec<Waiter> = self.waiting.lock().drain().collect();
            for w in &forgotten {
                self.left_table(w, false);
            }
            return;
        }
        let leases: Vec<_> = held.iter().map(|s| s.lease()).collect();
        let (id, run) = (&self.id, self.first_seq);
        if let Err(e) = self.coordinator.detach_incarnation(id, run, &leases) {
            log::warn!(target: "botmesh::replica", "detach of replica {} failed: {e}", self.id);
        }
    }

    /// Marks the replica crashed: nothing is released or reported from here on.
    pub(crate) fn set_aborted(&self) {
        self.state.store(ABORTED, Ordering::Release);
    }

    pub(crate) fn ticket(&self, seq: u64) -> Ticket {
        Ticket {
            replica: self.id.clone(),
            seq,
        }
    }

    /// Confirms a held lease with one renewal round trip before something that must
    /// not run on a stale grant (a pushed grant may arrive late, after the backend
    /// gave the lease to someone else). Extends it by our clock on success.
    pub(crate) fn confirm(&self, state: &TurnState) -> bool {
        let sent = self.clock.now();
        let lease = state.lease();
        match self
            .coordinator
            .renew(&self.id, std::slice::from_ref(&lease), &[])
        {
            Ok(r) if r.held.first() == Some(&true) => {
                state.renewed(sent, self.trusted);
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
        on_grant: impl Into<Ending>,
    ) -> Result<Accepted, CoordinationUnavailableError> {
        self.enqueue_placed(chat, message_id, wait, on_grant)
            .map(|placed| placed.accepted)
    }

    /// Like [`Inner::enqueue`], answering with the ticket's [`Placed`]: a blocked
    /// acquire's turn granted in the enqueue's reply is returned (see
    /// [`Placed::turn`]).
    pub(crate) fn enqueue_placed(
        self: &Arc<Self>,
        chat: &str,
        message_id: Option<&str>,
        wait: Duration,
        on_grant: impl Into<Ending>,
    ) -> Result<Placed, CoordinationUnavailableError> {
        // Every user chat comes through here (bot intake and `acquire`); reserved
        // names do not.
        crate::message::check_ids(chat, message_id)
            .map_err(|e| CoordinationUnavailableError::invalid(chat, message_id, e))?;
        self.enqueue_stored(&stored_chat(chat), message_id, wait, on_grant)
    }

    /// Places a ticket on a chat given in its stored form (a user's chat, or a
    /// reserved lease name); returns the ticket's sequence number with the answer.
    /// The chat's name is copied into a shared string only for a ticket that waits
    /// (its waiter keeps it); a turn granted at once keeps it inline (see
    /// [`TurnState::chat`](super::lease::TurnState::chat)).
    pub(crate) fn enqueue_stored(
        self: &Arc<Self>,
        chat: &str,
        message_id: Option<&str>,
        wait: Duration,
        on_grant: impl Into<Ending>,
    ) -> Result<Placed, CoordinationUnavailableError> {
        let on_grant = on_grant.into();
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
        let placed = |accepted, slot| Placed {
            accepted,
            seq,
            turn: None,
            slot,
        };
        let ticket = self.ticket(seq);
        let since = self.clock.now();
        let sent = since; // one clock read serves both
        let request = EnqueueRequest {
            chat,
            ticket: &ticket,
            message_id,
            wait,
        };
        if message_id.is_none() {
            // A free chat granted without a place in its queue: no grant of this
            // ticket can be pushed, so no waiter is registered first.
            match self.coordinator.grant_if_free(&request, self.real(sent)) {
                Ok(Some(grant)) => {
                    let turn = self.turn_at_once(chat, grant, sent);
                    return Ok(Placed {
                        turn: on_grant.take_turn(turn),
                        ..placed(Accepted::Queued, None)
                    });
                }
                Ok(None) => {}
                // It may have been granted all the same: the enqueue below of the same
                // ticket (idempotent per ticket) answers with that grant.
                Err(e) => {
                    log::debug!(target: "botmesh::replica", "grant_if_free on chat {:?} failed: {e}", shown_chat(chat));
                }
            }
        }
        let chat_arc: Arc<str> = Arc::from(chat);
        let (on_grant, slot) = on_grant.placed(&chat_arc);
        // Registered before the call: a push may arrive before `enqueue` returns.
        self.waiting.lock().insert(
            seq,
            Waiter {
                chat: chat_arc,
                message_id: message_id.map(Arc::from),
                since,
                wait,
                alive_from: since,
                placed: false,
                in_flight: false,
                uncounted: false,
                on_grant,
            },
        );
        if metered {
            inc(&self.metrics.waiting);
        }
        match self.coordinator.enqueue(&request) {
            Ok(Enqueued::Granted(grant)) => {
                if metered {
                    inc(&self.metrics.accepted);
                }
                let mut turn = None;
                if let Some(w) = self.take_waiter(seq) {
                    // The lease started after this request was sent.
                    let (held, ending) = self.make_turn(w, grant, false, sent + self.trusted);
                    turn = ending.take_turn(held);
                }
                Ok(Placed {
                    turn,
                    ..placed(Accepted::Queued, slot)
                })
            }
            Ok(answer @ (Enqueued::Queued | Enqueued::InFlight)) => {
                // A message whose id is in flight elsewhere is counted once it ends
                // otherwise than as a duplicate (see `Waiter::uncounted`).
                let in_flight = matches!(answer, Enqueued::InFlight);
                if metered && !in_flight {
                    inc(&self.metrics.accepted);
                }
                // A ticket granted meanwhile (by a push) needs no deadline. One whose
                // id is in flight elsewhere asks again on every renewal tick.
                let waiting = {
                    let mut table = self.waiting.lock();
                    match answer {
                        Enqueued::InFlight => table.mark_in_flight(seq, true),
                        // Queuing it refreshed our liveness in the chat, but that is not
                        // counted for the chat's other tickets: it does not lengthen a
                        // lease already granted to one of them (bounded by the liveness
                        // when it was granted), whose wake-up may still be on its way.
                        _ => table.mark_placed(seq),
                    }
                };
                if in_flight && waiting {
                    self.retry_later_unless_ticking(seq);
                } else if in_flight && metered {
                    // Ended already (a stop), before it could be marked: not as a
                    // duplicate, which only an answer to a marked ticket finds.
                    inc(&self.metrics.accepted);
                }
                if waiting && let Some(deadline) = since.checked_add(wait) {
                    self.expire_at(seq, deadline);
                }
                Ok(placed(Accepted::Queued, slot))
            }
            Ok(Enqueued::Duplicate) => {
                if self.take_waiter(seq).is_none() {
                    // Our own ticket, granted and handled while this call was retried
                    // (its first attempt's reply was lost): the grant's callback owns
                    // the message's end, which was not a duplicate.
                    if metered {
                        inc(&self.metrics.accepted);
                    }
                    return Ok(placed(Accepted::Queued, slot));
                }
                inc(&self.metrics.duplicates);
                Ok(placed(Accepted::Duplicate, slot))
            }
            Err(e) => {
                inc(&self.metrics.backend_errors);
                if self.take_waiter(seq).is_none() {
                    // The call reached the backend after all: the ticket was granted
                    // (a push took the waiter), and its callback now owns the
                    // message's end. Reporting an error too would end it twice.
                    if metered {
                        inc(&self.metrics.accepted);
                    }
                    log::debug!(target: "botmesh::replica", "enqueue on chat {:?} failed after its grant arrived: {e}", shown_chat(chat));
                    return Ok(placed(Accepted::Queued, slot));
                }
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

    fn release_turn(
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
        let seq = state.ticket.seq;
        // Marked releasing while it stays in `held` until the backend answered (see
        // `TurnState::releasing`).
        state.releasing.store(true, Ordering::Release);
        // Whether it was still held (not taken out as lost, or by a stop) decides
        // who counts it lost in the metrics: exactly one remover does.
        let leave_held = || {
            let was_held = self.held.lock().remove(&seq).is_some();
            self.released_cv.notify_all();
            was_held
        };
        if self.is_aborted() {
            // A crashed replica releases nothing; its lease expires.
            leave_held();
            return Err(lost_err());
        }
        // Known lost here (by the renewal, or by our own clock): still release at the
        // coordinator, which refuses it if the chat moved on and frees it at once if not.
        // One clock read serves the verdict and the release's send time.
        let sent = self.clock.now();
        let locally_lost = state.is_lost_at(sent);
        // A turn counted lost is reported `lost` (its handler's later sends and
        // checkpoint writes failed), so its message id stays open for a redelivery,
        // even where the backend still releases it (no grant was made after it).
        let handled = if locally_lost { None } else { handled };
        let released = self
            .coordinator
            .release_sent(&state.lease(), handled, self.real(sent));
        let was_held = leave_held();
        if locally_lost && was_held && metered {
            inc(&self.metrics.lost);
        }
        match released {
            Ok(Released::Released { next }) => {
                if let Some(grant) = next {
                    self.deliver_from(&state.chat, grant, Some(sent));
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

    /// Without a renewal thread (a bot without coordination), nothing would ask again
    /// about a ticket whose id is in flight on an earlier delivery: the timer does,
    /// every [`LOCAL_RETRY`], until it is queued, granted or ended.
    pub(super) fn retry_later_unless_ticking(self: &Arc<Self>, seq: u64) {
        if self.ticking.load(Ordering::Acquire) {
            return; // the renewal tick asks again
        }
        let me = Arc::downgrade(self);
        self.timer.at(
            self.clock.now() + LOCAL_RETRY,
            Box::new(move || {
                if let Some(inner) = me.upgrade() {
                    inner.retry_in_flight_one(seq);
                }
            }),
        );
    }

    /// Ends the wait of ticket `seq` at `deadline` (on the timer thread), unless it
    /// ended before.
    pub(super) fn expire_at(self: &Arc<Self>, seq: u64, deadline: Instant) {
        let me = Arc::downgrade(self);
        self.timer.at(
            deadline,
            Box::new(move || {
                if let Some(inner) = me.upgrade() {
                    inner.expire(seq);
                }
            }),
        );
    }

    /// A waiter's deadline passed: its message is reported `timeout` now and its
    /// ticket taken out of the queue, unless it was granted before.
    ///
    /// With a renewal thread, the ticket is withdrawn by its next tick (as a ghost,
    /// whose grant is released if one comes first), not here: this runs on the timer
    /// thread, which ends every wait, and a backend that does not answer (paused,
    /// blackholed) held it for a command timeout per expiring waiter, so waits ran
    /// for many times `turn_wait` and a stop for longer still. A grant that arrives
    /// meanwhile is released; the message was reported already.
    pub(super) fn expire(self: &Arc<Self>, seq: u64) {
        let Some((w, _in_hand)) = self.take_in_hand(seq) else {
            return; // already granted
        };
        let timed_out = |w: Waiter| {
            inc(&self.metrics.timed_out);
            let err = CoordinationUnavailableError::new(
                Reason::Timeout,
                shown_chat(&w.chat),
                w.message_id.as_deref(),
            );
            log::debug!(target: "botmesh::replica", "{err}");
            w.on_grant.end(Err(NoTurn::Failed(err)));
        };
        if self.ticking.load(Ordering::Acquire) {
            self.ghosts
                .lock()
                .push((w.chat.clone(), seq, w.message_id.clone()));
            return timed_out(w);
        }
        let ticket = self.ticket(seq);
        let waiting = Waiting {
            chat: &w.chat,
            ticket: &ticket,
            message_id: w.message_id.as_deref(),
        };
        match self.coordinator.cancel(&waiting) {
            Ok(Some(grant)) => {
                let chat = w.chat.clone();
                self.use_grant(&chat, w, grant, None, false);
            }
            Ok(None) => timed_out(w),
            Err(e) => {
                inc(&self.metrics.backend_errors);
                let err = CoordinationUnavailableError::new(
                    Reason::Backend,
                    shown_chat(&w.chat),
                    w.message_id.as_deref(),
                )
                .with_source(e);
                log::debug!(target: "botmesh::replica", "{err}");
                w.on_grant.end(Err(NoTurn::Failed(err)));
            }
        }
    }
}

impl Owner for Inner {
    fn release(
        self: Arc<Self>,
        state: &TurnState,
        handled: Option<&str>,
    ) -> Result<(), CoordinationUnavailableError> {
        self.release_turn(state, handled)
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
