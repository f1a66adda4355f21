//! The replica's table of waiting tickets: which message waits on which chat, since
//! when, and whether the backend has confirmed its place.
//!
//! A waiter is an entry here, not a blocked thread: its callback `G` runs when its
//! grant arrives. The table is plain data; the replica's core holds it under a lock
//! and passes the present in, so its answers are tested without a clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A waiting ticket as the renewal tick lists it: (chat, seq, message id).
pub(crate) type PlacedWaiter = (Arc<str>, u64, Option<Arc<str>>);

/// One waiting ticket.
pub(crate) struct Waiter<G> {
    /// The chat, in its stored form.
    pub(crate) chat: Arc<str>,
    /// The message id the ticket claimed, given up if the wait ends unhandled.
    pub(crate) message_id: Option<Arc<str>>,
    /// When the message was taken in: its wait and its metrics count from here.
    pub(crate) since: Instant,
    /// Longest it may wait (`turn_wait`).
    pub(crate) wait: Duration,
    /// When the last call that refreshed this ticket's liveness at the backend was
    /// sent (its enqueue, then each re-check that found it waiting). A grant made to
    /// it by another replica lapses with that liveness, a TTL after this at the
    /// earliest: the bound on a pushed grant's lease, and the sign that the backend
    /// may have skipped the ticket.
    pub(crate) alive_from: Instant,
    /// Set once the backend confirmed the ticket is queued; only placed tickets are
    /// re-checked, so a ticket whose enqueue is still in flight is never reported lost.
    pub(crate) placed: bool,
    /// Set while the message's id is claimed by a live delivery elsewhere
    /// ([`Enqueued::InFlight`](crate::Enqueued::InFlight)): the ticket is not queued
    /// anywhere, and the renewal tick asks again.
    pub(crate) in_flight: bool,
    /// Set while the message is not counted in `accepted` yet: its first answer was
    /// that its id is in flight on another delivery, so it may end as a duplicate,
    /// which `accepted` leaves out. Counted once it leaves the table otherwise (see
    /// `Inner::left_table`).
    pub(crate) uncounted: bool,
    /// What runs when the wait ends, with the turn or with why not.
    pub(crate) on_grant: G,
}

/// Waiting tickets by sequence number.
pub(crate) struct Waiters<G> {
    map: HashMap<u64, Waiter<G>>,
    /// Per chat with waiters here: how many, and when the last call that refreshed
    /// this replica's liveness in the chat was sent. The backend keeps one liveness
    /// per replica and chat (SPEC §3: a replica's tickets of a chat lapse together),
    /// and the re-check asks about the earliest ticket only; without this, a later
    /// ticket's own `alive_from` stays at its enqueue, and a grant pushed to it much
    /// later looks nearly lapsed and costs a confirming round trip, which on a
    /// starved host can fail and lose a turn the backend still held.
    chats: HashMap<Arc<str>, ChatLiveness>,
}

/// See [`Waiters::chats`].
struct ChatLiveness {
    waiters: usize,
    refreshed: Option<Instant>,
}

impl<G> Default for Waiters<G> {
    fn default() -> Self {
        Waiters {
            map: HashMap::default(),
            chats: HashMap::default(),
        }
    }
}

impl<G> Waiters<G> {
    pub(crate) fn insert(&mut self, seq: u64, waiter: Waiter<G>) {
        let chat = waiter.chat.clone();
        if let Some(old) = self.map.insert(seq, waiter) {
            self.forget(&old.chat);
        }
        self.chats
            .entry(chat)
            .or_insert(ChatLiveness {
                waiters: 0,
                refreshed: None,
            })
            .waiters += 1;
    }

    /// Takes a waiter out: whoever takes it (a grant, the timer, a cancel) owns its
    /// outcome, so each wait ends exactly once. Its `alive_from` includes the chat's
    /// latest refresh.
    pub(crate) fn take(&mut self, seq: u64) -> Option<Waiter<G>> {
        let mut w = self.map.remove(&seq)?;
        if let Some(at) = self.forget(&w.chat) {
            w.alive_from = w.alive_from.max(at);
        }
        Some(w)
    }

    /// One waiter of `chat` left; returns the chat's latest refresh.
    fn forget(&mut self, chat: &Arc<str>) -> Option<Instant> {
        // One lookup (the entry API), where `get_mut` and `remove` would hash twice.
        let std::collections::hash_map::Entry::Occupied(mut e) = self.chats.entry(chat.clone())
        else {
            return None;
        };
        let c = e.get_mut();
        let refreshed = c.refreshed;
        c.waiters = c.waiters.saturating_sub(1);
        if c.waiters == 0 {
            e.remove();
        }
        refreshed
    }

    /// Records that a re-check sent at `sent` refreshed this replica's liveness in
    /// `chat` (it found a ticket there waiting, or granted, which it renewed): every
    /// ticket of ours there stays alive a TTL from then, and a lease granted to one of
    /// them before lasts as long (the re-check renews a grant to any of them). Not
    /// an enqueue: it refreshes the liveness but not a lease granted before it.
    pub(crate) fn refreshed_chat(&mut self, chat: &str, sent: Instant) {
        if let Some(c) = self.chats.get_mut(chat) {
            c.refreshed = Some(c.refreshed.map_or(sent, |t| t.max(sent)));
        }
    }

    /// Marks a ticket as placed at the backend; `false` if it is gone already.
    pub(crate) fn mark_placed(&mut self, seq: u64) -> bool {
        self.map
            .get_mut(&seq)
            .map(|w| {
                w.placed = true;
                w.in_flight = false;
            })
            .is_some()
    }

    /// Marks a ticket as waiting for a delivery of its id elsewhere; `false` if it is
    /// gone already. `first`: this is the ticket's first answer, so its acceptance is
    /// not counted until it ends otherwise than as a duplicate (see
    /// [`Waiter::uncounted`]).
    pub(crate) fn mark_in_flight(&mut self, seq: u64, first: bool) -> bool {
        self.map
            .get_mut(&seq)
            .map(|w| {
                w.in_flight = true;
                w.placed = false;
                w.uncounted |= first;
            })
            .is_some()
    }

    /// Records that a call sent at `sent` found the ticket waiting, which refreshed
    /// its liveness at the backend.
    pub(crate) fn refreshed(&mut self, seq: u64, sent: Instant) {
        let Some(w) = self.map.get_mut(&seq) else {
            return;
        };
        w.alive_from = w.alive_from.max(sent);
        let chat = w.chat.clone();
        self.refreshed_chat(&chat, sent);
    }

    /// When the backend last confirmed this very ticket queued (its enqueue, a
    /// re-check that found it waiting); `None` once the ticket is gone. For telling a
    /// ticket skipped during a lapse from one lost with the data: the chat's latest
    /// refresh says nothing about a lapse before it, in which this ticket may have
    /// been skipped (counted from there, such a ticket was queued again at the back,
    /// after later messages of its chat).
    pub(crate) fn confirmed_at(&self, seq: u64) -> Option<Instant> {
        self.map.get(&seq).map(|w| w.alive_from)
    }

    /// See [`Waiter::alive_from`], with the chat's latest refresh (see
    /// [`Waiters::refreshed_chat`]): where a grant's lease ends at the earliest (as
    /// [`Waiters::take`] folds it in); `None` once the ticket is gone.
    #[cfg(test)]
    pub(crate) fn alive_from(&self, seq: u64) -> Option<Instant> {
        let w = self.map.get(&seq)?;
        let chat = self.chats.get(&w.chat).and_then(|c| c.refreshed);
        Some(chat.map_or(w.alive_from, |t| t.max(w.alive_from)))
    }

    /// Whether the backend confirmed the ticket's place (see [`Waiter::placed`]).
    pub(crate) fn is_placed(&self, seq: u64) -> bool {
        self.map.get(&seq).is_some_and(|w| w.placed)
    }

    /// Whether a ticket still waits here.
    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.map.contains_key(&seq)
    }

    /// The tickets waiting for a delivery of their id elsewhere: (chat, seq, id).
    pub(crate) fn in_flight(&self) -> Vec<PlacedWaiter> {
        let mut list: Vec<PlacedWaiter> = self
            .map
            .iter()
            .filter(|(_, w)| w.in_flight)
            .map(|(seq, w)| (w.chat.clone(), *seq, w.message_id.clone()))
            .collect();
        list.sort_unstable_by_key(|w| w.1);
        list
    }

    /// The ticket as [`Waiters::in_flight`] lists it, if it still waits for a delivery
    /// of its id elsewhere.
    pub(crate) fn in_flight_one(&self, seq: u64) -> Option<PlacedWaiter> {
        self.map
            .get(&seq)
            .filter(|w| w.in_flight)
            .map(|w| (w.chat.clone(), seq, w.message_id.clone()))
    }

    /// How much of a ticket's wait is left at `now`; `None` once it is gone.
    pub(crate) fn left(&self, seq: u64, now: Instant) -> Option<Duration> {
        self.map.get(&seq).map(|w| {
            w.wait
                .saturating_sub(now.saturating_duration_since(w.since))
        })
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every waiting ticket's sequence number.
    pub(crate) fn seqs(&self) -> Vec<u64> {
        self.map.keys().copied().collect()
    }

    /// Takes every waiter out (a crash forgets them).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Waiter<G>> + '_ {
        self.chats.clear();
        self.map.drain().map(|(_, w)| w)
    }

    /// Per chat, the earliest placed ticket: only it can be the next grant among
    /// ours, and the backend keeps a replica's tickets of a chat alive together, so
    /// one re-check per chat suffices however deep the queue. Sorted by sequence.
    ///
    /// A ticket whose enqueue has been in flight since before `slow` counts too: its
    /// reply is late (a loaded host, a slow link), but the call may well have queued
    /// it, and a ticket nobody refreshes lapses at the backend. Its answer is
    /// trusted only when it says granted or waiting (see [`Waiters::is_placed`]).
    pub(crate) fn first_placed_per_chat(&self, slow: Instant) -> Vec<PlacedWaiter> {
        let mut first: HashMap<Arc<str>, (u64, Option<Arc<str>>)> = HashMap::default();
        let listed = |w: &Waiter<G>| w.placed || (!w.in_flight && w.since < slow);
        for (seq, w) in self.map.iter().filter(|(_, w)| listed(w)) {
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

    /// The placed tickets on one chat, in intake order.
    pub(crate) fn placed_on(&self, chat: &str) -> Vec<PlacedWaiter> {
        let mut list: Vec<PlacedWaiter> = self
            .map
            .iter()
            .filter(|(_, w)| w.placed && &*w.chat == chat)
            .map(|(seq, w)| (w.chat.clone(), *seq, w.message_id.clone()))
            .collect();
        list.sort_unstable_by_key(|w| w.1);
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Clock;

    fn waiter(chat: &str, since: Instant, placed: bool) -> Waiter<&'static str> {
        Waiter {
            chat: Arc::from(chat),
            message_id: None,
            since,
            wait: Duration::from_secs(10),
            alive_from: since,
            placed,
            in_flight: false,
            uncounted: false,
            on_grant: "cb",
        }
    }

    /// The backend keeps one liveness per replica and chat: a refresh found through
    /// the earliest ticket counts for the later ones, also once taken out, and the
    /// chat's entry goes with its last waiter.
    #[test]
    fn a_refresh_through_one_ticket_counts_for_the_chats_others() {
        let clock = Clock::fake();
        let start = clock.now();
        let mut t = Waiters::default();
        t.insert(1, waiter("a", start, true));
        t.insert(2, waiter("a", start, true));
        t.insert(3, waiter("b", start, true));
        let later = start + Duration::from_secs(9);
        t.refreshed(1, later);
        assert_eq!(t.alive_from(2), Some(later));
        assert_eq!(
            t.alive_from(3),
            Some(start),
            "another chat's refresh is not b's"
        );
        let two = t.take(2).map(|w| w.alive_from);
        assert_eq!(two, Some(later));
        t.take(1);
        assert!(!t.chats.contains_key("a"), "a has no waiter left");
        t.insert(4, waiter("a", start, true));
        assert_eq!(t.alive_from(4), Some(start), "an old refresh is not kept");
    }

    #[test]
    fn the_recheck_lists_one_placed_ticket_per_chat_the_earliest() {
        let clock = Clock::fake();
        let now = clock.now();
        let mut t = Waiters::default();
        t.insert(5, waiter("a", now, true));
        t.insert(3, waiter("a", now, true));
        t.insert(4, waiter("b", now, true));
        // In flight: its enqueue has not returned, so it is not re-checked yet.
        t.insert(1, waiter("b", now, false));
        let list: Vec<(String, u64)> = t
            .first_placed_per_chat(now)
            .into_iter()
            .map(|(c, s, _)| (c.to_string(), s))
            .collect();
        assert_eq!(list, [("a".to_owned(), 3), ("b".to_owned(), 4)]);
        // Once its enqueue is slow to answer, it is listed, marked not placed.
        let later = now + Duration::from_millis(1);
        assert_eq!(t.first_placed_per_chat(later)[0].1, 1);
        assert!(!t.is_placed(1));
        assert!(t.mark_placed(1));
        assert_eq!(t.first_placed_per_chat(now)[0].1, 1);
        let on_a: Vec<u64> = t.placed_on("a").into_iter().map(|w| w.1).collect();
        assert_eq!(on_a, [3, 5]);
    }

    #[test]
    fn a_wait_ends_once_and_its_time_left_runs_down_by_the_clock() {
        let clock = Clock::fake();
        let mut t = Waiters::default();
        t.insert(1, waiter("a", clock.now(), true));
        clock.advance(Duration::from_secs(4));
        assert_eq!(t.left(1, clock.now()), Some(Duration::from_secs(6)));
        clock.advance(Duration::from_secs(60));
        assert_eq!(t.left(1, clock.now()), Some(Duration::ZERO));
        assert!(t.take(1).is_some());
        assert!(t.take(1).is_none(), "a second taker gets nothing");
        assert!(!t.mark_placed(1));
        assert_eq!(t.left(1, clock.now()), None);
    }
}
