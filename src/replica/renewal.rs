//! The renewal thread: one per replica, one coordinator call per tick.
//!
//! Every tick (TTL/3) the thread renews all leases the replica holds in a single
//! [`Coordinator::renew`](crate::Coordinator::renew) call, which also keeps the
//! replica's queued tickets alive (so they are not skipped) and is the slow safety
//! re-check: a waiter that missed its wake-up gets its grant from it, and a ticket the
//! backend lost is queued again. A lease the coordinator refuses, or every lease when
//! the coordinator has been unreachable for longer than the TTL, is marked lost: the
//! holder sees it in [`Turn::is_lost`](crate::Turn::is_lost) and its release reports
//! `lost`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::client::{Inner, NoTurn};
use super::lease::{TurnState, clock_ns, period};
use super::names::{is_reserved, shown_chat};
use super::waiters::PlacedWaiter;
use crate::coordinator::{EnqueueRequest, Enqueued, HeldLease, Ticket, TicketState, Waiting};
use crate::error::{CoordinationUnavailableError, Reason};
use crate::metrics::inc;

/// Runs ticks until the replica stops: every half renewal period (TTL/6), a re-check
/// of the waiting tickets, and every other one also the renewal of every held lease.
/// The re-check runs twice as often as the renewal so that two lost wake-ups in a
/// row still cost no more than one renewal period (TTL/3) in all. The wait between
/// ticks is on the real clock (it is a thread's sleep); the tick's judgements use the
/// replica's clock. Ticks are scheduled from the previous one's due time, not its
/// end, so a slow tick does not push every later one back.
pub(crate) fn renewal_loop(inner: &Arc<Inner>) {
    inner
        .ticking
        .store(true, std::sync::atomic::Ordering::Release);
    let half = period(inner.ttl) / 2;
    let mut last_ok = inner.now();
    let mut next = Instant::now() + half;
    let mut renew = false;
    loop {
        {
            let mut stop = inner.stop.lock();
            while !*stop && Instant::now() < next {
                inner.stop_cv.wait_until(&mut stop, next);
            }
            if *stop {
                return;
            }
        }
        let started = Instant::now();
        // A tick that fell far behind (a paused process) starts the schedule afresh.
        next = if started > next + half {
            started + half
        } else {
            next + half
        };
        if renew {
            inner.renew_once(&mut last_ok);
        } else {
            inner.recheck_once(&mut last_ok);
        }
        renew = !renew;
        let took = started.elapsed();
        if took > half / 2 {
            log::warn!(
                target: "botmesh::lease",
                "a renewal tick of replica {} took {took:?}, over half its {half:?} slot",
                inner.id
            );
        }
    }
}

/// The re-check's question for each listed waiter, with its ticket.
fn as_waiting<'a>(waiters: &'a [PlacedWaiter], tickets: &'a [Ticket]) -> Vec<Waiting<'a>> {
    waiters
        .iter()
        .zip(tickets)
        .map(|((chat, _, id), ticket)| Waiting {
            chat,
            ticket,
            message_id: id.as_deref(),
        })
        .collect()
}

/// The most in-flight duplicates asked about again, ghosts cancelled and suspect
/// grants released per tick: each costs a round trip on the renewal thread.
const RETRIES_PER_TICK: usize = 32;

/// The renewal tick's work: it runs on the renewal thread, and tests call it
/// directly.
impl Inner {
    /// One renewal tick, in one coordinator call: extends every held lease, keeps the
    /// waiting tickets alive and re-checks them for lost wake-ups. `last_ok` is when a
    /// renewal last got through: once that is longer ago than the TTL, every held
    /// lease is lost.
    pub(crate) fn renew_once(self: &Arc<Self>, last_ok: &mut Instant) {
        self.tick(last_ok, true);
    }

    /// The re-check alone, between renewals: the waiting tickets (and the replica's
    /// liveness), no held lease. Costs nothing when nothing waits.
    pub(crate) fn recheck_once(self: &Arc<Self>, last_ok: &mut Instant) {
        let idle = self.waiting.lock().is_empty()
            && self.ghosts.lock().is_empty()
            && self.suspects.lock().is_empty();
        if !idle {
            self.tick(last_ok, false);
        }
    }

    fn tick(self: &Arc<Self>, last_ok: &mut Instant, renew_held: bool) {
        use std::sync::atomic::Ordering;
        // The follow-up calls after the renewal (retries, ghosts, suspects) are one
        // round trip each on this thread: on a slow link or a starved host they stop
        // at this point in real time and go on next tick, so the next renewal (which
        // keeps this replica's tickets alive) is never pushed back by them.
        let budget = Instant::now() + period(self.ttl) / 4;
        let now_ns = clock_ns(self.clock.now());
        let before = self.last_tick.swap(now_ns, Ordering::AcqRel);
        let period_ns = u64::try_from(period(self.ttl).as_nanos()).unwrap_or(u64::MAX);
        if now_ns.saturating_sub(before) > period_ns {
            // This thread did not run for over a renewal period: pushes read from now
            // on may have waited as long; confirm them for one more period.
            self.confirm_until
                .fetch_max(now_ns.saturating_add(period_ns), Ordering::AcqRel);
        }
        let held: Vec<Arc<TurnState>> = if renew_held {
            // A turn being released is left out: its lease ends with the release.
            self.held
                .lock()
                .values()
                .filter(|s| !s.releasing.load(Ordering::Acquire))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        let leases: Vec<HeldLease<'_>> = held.iter().map(|s| s.lease()).collect();
        let waiters = self.placed_waiters();
        let tickets: Vec<Ticket> = waiters.iter().map(|w| self.ticket(w.1)).collect();
        let waiting = as_waiting(&waiters, &tickets);
        let sent = self.clock.now();
        match self.coordinator.renew(&self.id, &leases, &waiting) {
            Ok(renewal) => {
                *last_ok = self.clock.now();
                for (state, kept) in held.iter().zip(renewal.held) {
                    if kept {
                        state.renewed(sent, self.trusted);
                    } else {
                        self.mark_lost(state, "renewal refused");
                    }
                }
                self.apply_recheck(&waiters, renewal.waiting, sent);
                self.retry_in_flight(budget);
                self.bury_ghosts(budget);
                self.release_suspects(budget);
            }
            Err(e) => {
                inc(&self.metrics.backend_errors);
                log::warn!(target: "botmesh::lease", "renewal failed: {e}");
                if self.clock.now().saturating_duration_since(*last_ok) > self.ttl {
                    for state in &held {
                        self.mark_lost(state, "coordinator unreachable for longer than the TTL");
                    }
                }
            }
        }
    }

    fn mark_lost(&self, state: &TurnState, why: &str) {
        // A turn released while the renewal was in flight is not lost, just gone.
        {
            let mut held = self.held.lock();
            if state.releasing.load(Ordering::Acquire) || held.remove(&state.ticket.seq).is_none() {
                return;
            }
        }
        let metered = !is_reserved(&state.chat);
        if state.mark_lost() {
            if metered {
                inc(&self.metrics.lost);
            }
            log::warn!(
                target: "botmesh::lease",
                "turn on chat {:?} (token {}) lost: {why}",
                shown_chat(&state.chat),
                state.token
            );
        }
    }

    /// Releases the grants no held turn uses (see `deliver`); called by the tick.
    fn release_suspects(self: &Arc<Self>, budget: Instant) {
        let suspects = std::mem::take(&mut *self.suspects.lock());
        let mut released = 0;
        for (chat, grant) in suspects {
            let seq = grant.ticket.seq;
            // Each release is a round trip on this thread: a flood waits for the next
            // ticks rather than delaying this one's renewals.
            if released >= RETRIES_PER_TICK || Instant::now() >= budget {
                self.suspects.lock().push((chat, grant));
                continue;
            }
            // Still being turned into a held turn: ask again on the next tick.
            if self.in_hand.lock().contains(&seq) {
                self.suspects.lock().push((chat, grant));
                continue;
            }
            // In `held` with that token (a turn being released stays there until the
            // backend answered), and a turn enters `held` before its ticket leaves
            // `in_hand`, so checking in this order never misses one.
            let in_use = self
                .held
                .lock()
                .get(&seq)
                .is_some_and(|s| s.token == grant.token);
            if !in_use {
                log::debug!(target: "botmesh::replica", "releasing grant {} on chat {chat:?}: no turn uses it", grant.ticket);
                self.release_ghost(&chat, &grant);
                released += 1;
            }
        }
    }

    /// Cancels the tickets whose enqueue failed; called by the renewal tick. Stops at
    /// the first backend error (the rest wait for the next tick).
    fn bury_ghosts(self: &Arc<Self>, budget: Instant) {
        let ghosts: Vec<PlacedWaiter> = std::mem::take(&mut *self.ghosts.lock());
        let mut left = Vec::new();
        let mut reachable = true;
        for (i, g) in ghosts.into_iter().enumerate() {
            if !reachable || i >= RETRIES_PER_TICK || Instant::now() >= budget {
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
    /// (see [`Waiters::first_placed_per_chat`]): a backlog does not multiply the
    /// tick's work.
    pub(super) fn placed_waiters(&self) -> Vec<PlacedWaiter> {
        // An enqueue unanswered for a renewal period is slow, not failed (that takes
        // the command timeout): keep its ticket alive meanwhile.
        let slow = self
            .clock
            .now()
            .checked_sub(period(self.ttl))
            .unwrap_or_else(|| self.clock.now());
        self.waiting.lock().first_placed_per_chat(slow)
    }

    /// Acts on the re-check's findings (of a call sent at `sent`): grants found are
    /// delivered (a lost wake-up), tickets the backend lost are enqueued again.
    fn apply_recheck(
        self: &Arc<Self>,
        waiters: &[PlacedWaiter],
        states: Vec<TicketState>,
        sent: Instant,
    ) {
        let again = self.apply_answers(waiters, states, sent, true);
        if again.is_empty() {
            return;
        }
        // The earliest ticket of a chat lapsed: each later one is asked about on
        // its own, in one more round trip (rare: after a pause or a partition).
        let tickets: Vec<Ticket> = again.iter().map(|w| self.ticket(w.1)).collect();
        let waiting = as_waiting(&again, &tickets);
        let sent = self.clock.now();
        match self.coordinator.renew(&self.id, &[], &waiting) {
            Ok(renewal) => {
                self.apply_answers(&again, renewal.waiting, sent, false);
            }
            Err(e) => {
                inc(&self.metrics.backend_errors);
                log::warn!(target: "botmesh::lease", "re-check of later tickets failed, they are asked about next tick: {e}");
            }
        }
    }

    /// Acts on re-check answers; with `follow`, returns the later placed tickets of
    /// each chat whose earliest ticket lapsed, to ask about each.
    fn apply_answers(
        self: &Arc<Self>,
        waiters: &[PlacedWaiter],
        states: Vec<TicketState>,
        sent: Instant,
        follow: bool,
    ) -> Vec<PlacedWaiter> {
        let mut again = Vec::new();
        for ((chat, seq, _), state) in waiters.iter().zip(states) {
            // A ticket gone after our liveness in the chat may have lapsed (no call
            // refreshed it for a TTL: a partition, a pause, a backend down that long)
            // was most likely skipped, and its trace expired since: later messages
            // may have run, so it is lost like a lapsed one, not queued again. The
            // table is read (one lock) only for these rare answers.
            let mut why = String::new();
            let state = match state {
                TicketState::Gone | TicketState::Lapsed => {
                    let (placed, refreshed) = {
                        let table = self.waiting.lock();
                        (table.is_placed(*seq), table.confirmed_at(*seq))
                    };
                    // A ticket whose enqueue has not answered yet may not have
                    // arrived: only a grant or a place found is news.
                    if !placed {
                        log::debug!(target: "botmesh::replica", "re-check of ticket {seq} on chat {:?}, its enqueue unanswered since {:?} ago: {state:?}, ignored", shown_chat(chat), refreshed.map(|t| self.clock.now().saturating_duration_since(t)));
                        continue;
                    }
                    let age = refreshed.map(|t| self.clock.now().saturating_duration_since(t));
                    let gone = matches!(state, TicketState::Gone);
                    if let Some(age) = age {
                        why = if gone {
                            format!("it is gone, its liveness unrefreshed for {age:?}")
                        } else {
                            format!("skipped, its liveness refreshed {age:?} ago")
                        };
                    }
                    if gone && age.is_some_and(|a| a >= self.trusted) {
                        TicketState::Lapsed
                    } else {
                        state
                    }
                }
                other => other,
            };
            match state {
                // The re-check renewed it (see `Coordinator::renew`).
                TicketState::Granted(grant) => {
                    // The check refreshed our liveness in the chat as it found the grant.
                    self.waiting.lock().refreshed_chat(chat, sent);
                    // The usual case in a busy chat: our own turn there, running. It is
                    // not news, and routing it would only park it as a suspect to
                    // drop at the end of the tick.
                    let running = grant.ticket.seq != *seq
                        && self
                            .held
                            .lock()
                            .get(&grant.ticket.seq)
                            .is_some_and(|s| s.token == grant.token);
                    if !running {
                        log::debug!(target: "botmesh::replica", "re-check found grant {} on chat {:?}", grant.ticket, shown_chat(chat));
                        self.deliver_from(chat, grant, Some(sent));
                    }
                }
                TicketState::Waiting => self.waiting.lock().refreshed(*seq, sent),
                TicketState::Lapsed => {
                    // Skipped because this replica's liveness lapsed (it was paused or
                    // cut off for longer than a lease): later messages of the chat may
                    // have run since, so running ours now would break the chat's order.
                    // Our later tickets of the chat may have been skipped too, or may
                    // still be queued (skipping happens as a ticket reaches the front,
                    // and a later call refreshed our liveness): each is asked about,
                    // and only those skipped are lost.
                    if !self.waiting.lock().contains(*seq) {
                        continue;
                    }
                    self.report_lost(*seq, &why);
                    if follow {
                        let placed = self.waiting.lock().placed_on(chat);
                        again.extend(placed);
                    }
                }
                TicketState::Gone => {
                    // Gone because it was granted (and maybe released) after this
                    // tick's snapshot: nothing to do, the grant reached its waiter.
                    // Gone while it still waits here: the backend lost it, so most
                    // likely all of the chat's tickets (a restart): queue them all
                    // again, in intake order (enqueue is idempotent per ticket, so one
                    // that is still queued keeps its place).
                    if !self.waiting.lock().contains(*seq) {
                        continue;
                    }
                    let placed = self.waiting.lock().placed_on(chat);
                    for (chat, seq, id) in placed {
                        self.requeue(&chat, seq, id.as_deref());
                    }
                }
            }
        }
        again
    }

    /// Puts a ticket the backend lost (a restart without persistence) back in its
    /// queue. It loses its place, but nothing waits forever.
    fn requeue(self: &Arc<Self>, chat: &str, seq: u64, message_id: Option<&str>) {
        let Some(wait) = self.waiting.lock().left(seq, self.clock.now()) else {
            return; // resolved meanwhile
        };
        log::warn!(target: "botmesh::replica", "ticket {seq} of chat {chat:?} was lost by the coordinator; queueing it again");
        let ticket = self.ticket(seq);
        let request = EnqueueRequest {
            chat,
            ticket: &ticket,
            message_id,
            wait,
        };
        self.enqueue_again(&request);
    }

    /// Asks the backend again for a ticket this replica still waits on (re-queued, or
    /// waiting for a delivery of its id elsewhere), and acts on the answer.
    fn enqueue_again(self: &Arc<Self>, request: &EnqueueRequest<'_>) {
        let seq = request.ticket.seq;
        match self.coordinator.enqueue(request) {
            // Not counted from this call: the ticket may have been granted long
            // before (its reply lost), with a lease bounded by our liveness then.
            Ok(Enqueued::Granted(grant)) => self.deliver(request.chat, grant),
            Ok(Enqueued::Queued) => {
                self.waiting.lock().mark_placed(seq);
            }
            Ok(Enqueued::InFlight) => {
                self.waiting.lock().mark_in_flight(seq, false);
            }
            Ok(Enqueued::Duplicate) => {
                // Another delivery of this message was handled meanwhile: the message
                // ends as a duplicate, which it is.
                if let Some(w) = self.take_duplicate(seq) {
                    inc(&self.metrics.duplicates);
                    w.on_grant.end(Err(NoTurn::Duplicate));
                }
            }
            Err(e) => {
                inc(&self.metrics.backend_errors);
                log::warn!(target: "botmesh::replica", "enqueue of ticket {seq} failed, retrying next tick: {e}");
            }
        }
    }

    /// Asks again for each message whose id was in flight on another replica: it
    /// becomes a duplicate once that delivery was handled, or takes the claim over
    /// (and a place) once that delivery died unhandled.
    /// Asks again about one in-flight duplicate (see `retry_later_unless_ticking`),
    /// and schedules the next try while it stays in flight.
    pub(super) fn retry_in_flight_one(self: &Arc<Self>, seq: u64) {
        let Some(waiter) = self.waiting.lock().in_flight_one(seq) else {
            return; // queued, granted or ended meanwhile
        };
        self.ask_again(waiter, self.clock.now());
        if self.waiting.lock().in_flight_one(seq).is_some() {
            self.retry_later_unless_ticking(seq);
        }
    }

    fn retry_in_flight(self: &Arc<Self>, budget: Instant) {
        let now = self.clock.now();
        // Listed first: the table's lock must not be held across the calls below.
        let in_flight = self.waiting.lock().in_flight();
        // One round trip each, on the renewal thread: a bounded number per tick, oldest
        // first, so that a flood of redeliveries never delays the renewals (the rest
        // wait for the next ticks, every TTL/6; each is still bounded by turn_wait).
        for waiter in in_flight.into_iter().take(RETRIES_PER_TICK) {
            if Instant::now() >= budget {
                break;
            }
            self.ask_again(waiter, now);
        }
    }

    /// Asks the backend again about an in-flight duplicate, with what is left of its
    /// wait at `now` (nothing, if it ended meanwhile).
    fn ask_again(self: &Arc<Self>, (chat, seq, id): PlacedWaiter, now: Instant) {
        let Some(wait) = self.waiting.lock().left(seq, now) else {
            return;
        };
        let ticket = self.ticket(seq);
        self.enqueue_again(&EnqueueRequest {
            chat: &chat,
            ticket: &ticket,
            message_id: id.as_deref(),
            wait,
        });
    }

    /// Ends a waiting ticket with `lost`: it lost its place in the queue.
    fn report_lost(self: &Arc<Self>, seq: u64, why: &str) {
        if let Some(w) = self.take_waiter(seq) {
            if !is_reserved(&w.chat) {
                inc(&self.metrics.lost);
            }
            let err = CoordinationUnavailableError::new(
                Reason::Lost,
                shown_chat(&w.chat),
                w.message_id.as_deref(),
            );
            log::warn!(target: "botmesh::replica", "{err}: its ticket lapsed while this replica was out of touch ({why})");
            w.on_grant.end(Err(NoTurn::Failed(err)));
        }
    }
}
