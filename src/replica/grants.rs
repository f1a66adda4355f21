//! Routing grants to their waiters: a grant pushed by the backend, returned by a
//! release, found by the re-check or by a cancel becomes a held turn with its lease's
//! end by this replica's clock, is confirmed first when that end is near or unknown,
//! and is released when nobody waits for it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::client::{Ending, Inner, NoTurn, Waiter};
use super::lease::{TurnState, clock_ns, period};
use super::names::{ChatName, is_reserved, shown_chat};
use super::turn::Turn;
use crate::coordinator::{Grant, HeldLease, Previous, Released};
use crate::error::{CoordinationUnavailableError, Reason};
use crate::metrics::{Counted, dec, inc};

/// Grants released unused that a replica remembers (see `Inner::unused`): the next
/// grant on the chat follows within the same release, or within one re-check, so a
/// few suffice; an older one forgotten only leaves that chat's next `previous` as the
/// backend gave it.
const UNUSED_KEPT: usize = 32;

/// A grant released unused, waiting its turn (see [`Inner::release_ghost`]).
type PendingGhost = (Arc<Inner>, String, Grant);

thread_local! {
    /// The grants nobody here will use that this thread met while it released one:
    /// `Some` while a `release_ghost` runs on the thread, which releases them in turn.
    static PENDING_GHOSTS: RefCell<Option<VecDeque<PendingGhost>>> = const { RefCell::new(None) };
}

/// Ends a thread's run of ghost releases, also when one panicked, so that a later
/// `release_ghost` on the thread releases its own grant instead of queueing it for
/// nobody.
struct GhostRun;

impl Drop for GhostRun {
    fn drop(&mut self) {
        PENDING_GHOSTS.with(|p| p.borrow_mut().take());
    }
}

impl Inner {
    /// Takes a waiter out like [`Inner::take_waiter`], marking its ticket in hand
    /// (see `in_hand`) until the returned guard drops: the taker turns a grant into a
    /// held turn, or ends the wait, before that.
    pub(crate) fn take_in_hand(&self, seq: u64) -> Option<(Waiter, InHand<'_>)> {
        let w = {
            let mut waiting = self.waiting.lock();
            let w = waiting.take(seq);
            // Under the table's lock: a second copy of the grant that finds the waiter
            // gone also finds the ticket in hand.
            if w.is_some() {
                self.in_hand.lock().insert(seq);
            }
            w
        }?;
        self.left_table(&w, false);
        Some((w, InHand { inner: self, seq }))
    }

    /// Takes a waiter out of the table: whoever takes it owns its outcome.
    pub(crate) fn take_waiter(&self, seq: u64) -> Option<Waiter> {
        let w = self.waiting.lock().take(seq)?;
        self.left_table(&w, false);
        Some(w)
    }

    /// Takes out a waiter whose message ends as a duplicate of another delivery.
    pub(crate) fn take_duplicate(&self, seq: u64) -> Option<Waiter> {
        let w = self.waiting.lock().take(seq)?;
        self.left_table(&w, true);
        Some(w)
    }

    /// Counts a waiter out of the table: the `waiting` gauge, and the acceptance of a
    /// message held back while its id was in flight elsewhere, unless it ends as a
    /// `duplicate` (see `Waiter::uncounted`). Reserved names are not metered.
    pub(crate) fn left_table(&self, w: &Waiter, duplicate: bool) {
        if !is_reserved(&w.chat) {
            dec(&self.metrics.waiting);
            if w.uncounted && !duplicate {
                inc(&self.metrics.accepted);
            }
        }
    }

    /// Routes a grant heard of after the fact (a push, the re-check, a cancel that
    /// found it granted) to its waiter; a grant nobody waits for is released.
    pub(crate) fn deliver(self: &Arc<Self>, chat: &str, grant: Grant) {
        self.route(chat, grant, None, false);
    }

    /// Routes a grant the backend pushed; confirmed before use when the backend asks
    /// for it ([`Coordinator::pushes_need_confirmation`]).
    ///
    /// [`Coordinator::pushes_need_confirmation`]: crate::Coordinator::pushes_need_confirmation
    pub(crate) fn deliver_pushed(self: &Arc<Self>, chat: &str, grant: Grant) {
        self.route(chat, grant, None, self.confirm_pushes);
    }

    /// Routes a grant to its waiter. `sent` is given for a grant made fresh in the
    /// reply to our own call sent then (a release handing the chat on to another of
    /// our tickets): the backend gave it a full TTL after that.
    pub(crate) fn deliver_from(self: &Arc<Self>, chat: &str, grant: Grant, sent: Option<Instant>) {
        self.route(chat, grant, sent, false);
    }

    /// Routes a grant to its waiter (`confirm`: with a confirming renewal first,
    /// however much of its lease is left).
    fn route(self: &Arc<Self>, chat: &str, grant: Grant, sent: Option<Instant>, confirm: bool) {
        if self.is_aborted() {
            return;
        }
        match self.take_in_hand(grant.ticket.seq) {
            Some((w, _in_hand)) => self.use_grant(chat, w, grant, sent, confirm),
            // A ticket number this run never drew: a later run's of the same id (this
            // one stalled past its liveness and was replaced; the re-check of one of
            // our tickets answers with the grant the chat's holder of our id has). It
            // is that run's to use or release, never ours (a breaker's find, session
            // 14: releasing it as a suspect freed the later run's turn).
            None if grant.ticket.seq > self.seq.load(Ordering::Acquire) => {
                log::debug!(target: "botmesh::replica", "grant {} on chat {chat:?} is a later run's", grant.ticket);
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
                if ghost.is_some() || grant.ticket.seq < self.first_seq {
                    // A ghost's, or a dead predecessor's (same id, earlier process):
                    // nobody here will use it.
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

    /// Hands `grant` to `w`, the waiter taken for it, with the lease's end by our
    /// clock; a grant with too little left (or read while this process was stalled)
    /// is confirmed with one renewal round trip first, and reported lost if it
    /// lapsed. `sent` as in [`Inner::deliver_from`]; `confirm`: confirmed anyway.
    pub(super) fn use_grant(
        self: &Arc<Self>,
        chat: &str,
        w: Waiter,
        grant: Grant,
        sent: Option<Instant>,
        confirm: bool,
    ) {
        let now = self.clock.now();
        let now_ns = clock_ns(now);
        // Where the backend's lease ends at the earliest, by our clock. A grant
        // another replica made lapses with our liveness in the chat, which
        // lasts a TTL from the last call that refreshed it: after a partition
        // or a pause it may have been granted with little left, or lapsed and
        // been given on (the handler would then run on a stale turn).
        let until = sent.unwrap_or(w.alive_from) + self.trusted;
        let silent = now_ns.saturating_sub(self.last_tick.load(Ordering::Acquire));
        let stalled = u128::from(silent) > period(self.ttl).as_nanos()
            || now_ns < self.confirm_until.load(Ordering::Acquire);
        // Too little left to reach the next renewal: confirm it now instead.
        if !stalled && !confirm && until >= now + period(self.ttl) {
            return self.grant_to(w, grant, true, until);
        }
        // Possibly read long after it was sent: ask the backend.
        let lease = HeldLease {
            chat,
            ticket: &grant.ticket,
            token: grant.token,
        };
        match self
            .coordinator
            .renew(&self.id, std::slice::from_ref(&lease), &[])
        {
            Ok(r) if r.held.first() == Some(&true) => {
                self.grant_to(w, grant, true, now + self.trusted);
            }
            // A confirmation that did not get through is not used as one: it fails
            // most often in a failover, when the new primary may never have seen the
            // grant (asynchronous replication) and grants the chat on; running on what
            // this replica believed of the lease would then overlap the next holder.
            // Nor is the turn given up: the ticket waits again, and the re-check asks
            // the backend (the new primary) where it stands, granted, waiting or gone.
            Err(e) if !self.is_aborted() => {
                inc(&self.metrics.backend_errors);
                log::info!(target: "botmesh::replica", "grant {} on chat {chat:?} could not be confirmed ({e}); it waits for the re-check", grant.ticket);
                if !is_reserved(&w.chat) {
                    inc(&self.metrics.waiting);
                }
                self.wait_again(grant.ticket.seq, w);
            }
            answer => {
                if answer.is_err() {
                    inc(&self.metrics.backend_errors);
                }
                // Lapsed unread (or unconfirmable): its place is gone; running
                // it now could break its chat's order or overlap a newer turn.
                log::warn!(target: "botmesh::replica", "grant {} on chat {chat:?} lapsed before it could be used", grant.ticket);
                if !is_reserved(&w.chat) {
                    inc(&self.metrics.lost);
                }
                self.release_ghost(chat, &grant);
                w.on_grant
                    .end(Err(NoTurn::Failed(CoordinationUnavailableError::new(
                        Reason::Lost,
                        shown_chat(&w.chat),
                        w.message_id.as_deref(),
                    ))));
            }
        }
    }

    /// Puts back a waiter taken for a grant that could not be confirmed, for the
    /// re-check to settle, with its deadline.
    ///
    /// It goes back placed: the backend granted the ticket, so it had it. Put back as
    /// it was taken, a ticket whose push arrived before its enqueue's answer stayed
    /// unplaced for good (that answer finds the waiter taken and marks nothing), and
    /// the re-check ignores a gone or lapsed answer about a ticket never placed (its
    /// enqueue may not have arrived): once the grant lapsed unused, nothing ended the
    /// wait. Nor did its deadline: the enqueue sets none for a ticket taken already,
    /// and one that fell due meanwhile found nothing to end. So it is set again
    /// (a second one is harmless: whoever takes the waiter first ends it, the others
    /// find nothing), at once if it passed already.
    fn wait_again(self: &Arc<Self>, seq: u64, mut w: Waiter) {
        w.placed = true;
        w.in_flight = false;
        let deadline = w.since.checked_add(w.wait);
        self.waiting.lock().insert(seq, w);
        if let Some(deadline) = deadline {
            self.expire_at(seq, deadline);
        }
    }

    /// Turns a grant into a held turn and hands it to the waiter. `valid_until` is when
    /// the lease ends by this replica's own clock, at the latest.
    pub(super) fn grant_to(
        self: &Arc<Self>,
        w: Waiter,
        grant: Grant,
        queued: bool,
        valid_until: Instant,
    ) {
        let (turn, ending) = self.make_turn(w, grant, queued, valid_until);
        ending.end(Ok(turn));
    }

    /// Turns a grant into a held turn for the ticket's waiter; returns it with its
    /// `Ending` still to be told, to be handed over by the caller: see
    /// [`Ending::take_turn`].
    pub(super) fn make_turn(
        self: &Arc<Self>,
        w: Waiter,
        grant: Grant,
        queued: bool,
        valid_until: Instant,
    ) -> (Turn, Ending) {
        let waited = self.clock.now().saturating_duration_since(w.since);
        let turn = self.new_turn(
            (&*w.chat).into(),
            w.message_id,
            waited,
            grant,
            Counted::Placed { queued },
            valid_until,
        );
        (turn, w.on_grant)
    }

    /// The held turn of a grant made on a free chat in the answer to the request sent
    /// at `sent`, registered for renewal; counted as accepted too (`Counted::AtOnce`).
    pub(super) fn turn_at_once(self: &Arc<Self>, chat: &str, grant: Grant, sent: Instant) -> Turn {
        // The lease started after the request was sent. The turn did not wait: it
        // never had a place in a queue (and a clock read to time the call would be a
        // tenth of the in-process turn's cost).
        let valid_until = sent + self.trusted;
        let zero = Duration::ZERO;
        self.new_turn(chat.into(), None, zero, grant, Counted::AtOnce, valid_until)
    }

    /// The held turn of a grant to a ticket of `chat` taken in at `since` (see
    /// [`Inner::make_turn`]), registered for renewal.
    pub(super) fn new_turn(
        self: &Arc<Self>,
        chat: ChatName,
        message_id: Option<Arc<str>>,
        waited: Duration,
        grant: Grant,
        counted: Counted,
        valid_until: Instant,
    ) -> Turn {
        let previous = self.previous_of(&chat, grant.previous);
        let state = Arc::new(TurnState {
            chat,
            ticket: grant.ticket,
            token: grant.token,
            previous,
            message_id,
            waited,
            lost: Default::default(),
            valid_until: AtomicU64::new(clock_ns(valid_until)),
            releasing: AtomicBool::new(false),
        });
        self.held.lock().insert(state.ticket.seq, state.clone());
        let metered = !is_reserved(&state.chat);
        if metered {
            self.metrics.count_turn(counted, waited);
        }
        let turn = Turn::new(state, self.clone());
        if metered && turn.is_handover() {
            inc(&self.metrics.handovers);
        }
        turn
    }

    /// Releases a grant nobody here will use (a ghost's, a dead predecessor's, a
    /// given-up waiter's), remembering it in `unused` first; a grant handed on in the
    /// reply to another of our tickets is routed.
    ///
    /// The reply may hand the chat to another such ticket (a dead predecessor with
    /// the same id left its queued backlog), whose release hands it on again, and so
    /// on: one level of recursion a ticket would overflow the thread's stack on a
    /// backlog of a few thousand (a breaker's find). So a release met while one runs
    /// on this thread is queued, and the first one releases the queue in a loop.
    pub(super) fn release_ghost(self: &Arc<Self>, chat: &str, grant: &Grant) {
        let queued = PENDING_GHOSTS.with(|p| match p.borrow_mut().as_mut() {
            Some(queue) => {
                queue.push_back((self.clone(), chat.to_owned(), grant.clone()));
                true
            }
            None => false,
        });
        if queued {
            return;
        }
        PENDING_GHOSTS.with(|p| *p.borrow_mut() = Some(VecDeque::new()));
        let _run = GhostRun;
        self.release_ghost_now(chat, grant);
        while let Some((inner, chat, grant)) =
            PENDING_GHOSTS.with(|p| p.borrow_mut().as_mut().and_then(VecDeque::pop_front))
        {
            inner.release_ghost_now(&chat, &grant);
        }
    }

    /// [`Inner::release_ghost`]'s one release.
    fn release_ghost_now(self: &Arc<Self>, chat: &str, grant: &Grant) {
        // Recorded before the release, whose reply may hand the chat on to another of
        // our tickets naming this grant as its previous holder.
        let previous = self.previous_of(chat, grant.previous.clone());
        {
            let mut unused = self.unused.lock();
            if unused.len() >= UNUSED_KEPT {
                unused.remove(0);
            }
            unused.push((chat.into(), grant.token, previous));
        }
        let lease = HeldLease {
            chat,
            ticket: &grant.ticket,
            token: grant.token,
        };
        let sent = self.clock.now();
        match self.coordinator.release_sent(&lease, None, self.real(sent)) {
            Ok(Released::Released { next: Some(next) }) => {
                self.deliver_from(chat, next, Some(sent));
            }
            Ok(_) => {}
            Err(e) => log::debug!(target: "botmesh::replica", "ghost release failed: {e}"),
        }
    }

    /// The previous holder a grant on `chat` should name: `previous` as the backend
    /// gave it, or, when that is a grant of ours released unused, the one that grant
    /// named (see `unused`).
    pub(super) fn previous_of(&self, chat: &str, previous: Option<Previous>) -> Option<Previous> {
        let p = previous?;
        if p.replica != self.id {
            return Some(p);
        }
        let mut unused = self.unused.lock();
        match unused.iter().position(|u| u.1 == p.token && u.0 == chat) {
            Some(i) => unused.remove(i).2,
            None => Some(p),
        }
    }
}

/// A ticket marked in hand (see [`Inner::take_in_hand`]); unmarked on drop.
pub(crate) struct InHand<'a> {
    inner: &'a Inner,
    seq: u64,
}

impl Drop for InHand<'_> {
    fn drop(&mut self) {
        self.inner.in_hand.lock().remove(&self.seq);
    }
}
