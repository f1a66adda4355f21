//! The chat table on a fake clock: every expiry is a clock step, never a sleep.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::Clock;

const TTL: Duration = Duration::from_secs(3);
const DEDUP: Duration = Duration::from_secs(600);

/// A table with its surroundings: a fake clock, the replicas' liveness and a token
/// counter, as the backend would provide them.
struct Fixture {
    clock: Clock,
    /// The instant the table's ns count from, as the backend's `base`.
    base: Instant,
    shard: Shard,
    alive: RefCell<HashMap<ReplicaId, u64>>,
    tokens: Cell<Token>,
    pushes: Pushes,
}

impl Fixture {
    fn new() -> Self {
        let clock = Clock::fake();
        let f = Fixture {
            base: clock.now(),
            clock,
            shard: Shard::default(),
            alive: RefCell::new(HashMap::new()),
            tokens: Cell::new(0),
            pushes: Pushes::new(),
        };
        for r in ["a", "b", "c"] {
            f.heartbeat(r);
        }
        f
    }

    /// The replica renewed: alive for one more TTL from now.
    fn heartbeat(&self, replica: &str) {
        self.alive
            .borrow_mut()
            .insert(Arc::from(replica), self.ns(self.clock.now() + TTL));
    }

    /// Moves the clock on by `secs` with `replica` still alive (it renewed just now).
    fn later(&mut self, secs: u64, replica: &str) {
        self.clock.advance(Duration::from_secs(secs));
        self.heartbeat(replica);
    }

    /// `t` as the table's ns.
    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn op<T>(&mut self, f: impl FnOnce(&mut Shard, &Env<'_>, &mut Pushes) -> T) -> T {
        self.op_at(self.clock.now(), f)
    }

    /// [`Fixture::op`] with `now` as the call's present, as a caller that read the
    /// clock a while before its call reached the table gives it.
    fn op_at<T>(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut Shard, &Env<'_>, &mut Pushes) -> T,
    ) -> T {
        let alive = |t: &Ticket| self.alive.borrow().get(&t.replica).copied();
        let next = || {
            self.tokens.set(self.tokens.get() + 1);
            self.tokens.get()
        };
        let env = Env {
            now,
            now_ns: self.ns(now),
            ttl: TTL,
            ttl_ns: self.ns(self.base + TTL),
            history_ns: self.ns(self.base + Duration::from_secs(3600)),
            dedup_window: DEDUP,
            dedup_ids: crate::DEFAULT_DEDUP_IDS,
            alive_until: &alive,
            next_token: &next,
        };
        f(&mut self.shard, &env, &mut self.pushes)
    }

    fn enqueue(&mut self, chat: &str, t: &Ticket, id: Option<&str>) -> Enqueued {
        let req = EnqueueRequest {
            chat,
            ticket: t,
            message_id: id,
            wait: Duration::from_secs(60),
        };
        self.op(|s, env, p| s.enqueue(env, &req, p))
    }

    fn release(&mut self, chat: &str, g: &Grant, handled: Option<&str>) -> Released {
        let lease = HeldLease {
            chat,
            ticket: &g.ticket,
            token: g.token,
        };
        self.op(|s, env, p| s.release(env, &lease, handled, p))
    }

    fn check(&mut self, chat: &str, t: &Ticket) -> TicketState {
        let w = Waiting {
            chat,
            ticket: t,
            message_id: None,
        };
        self.op(|s, env, p| s.check(env, &w, p))
    }

    fn renew(&mut self, chat: &str, g: &Grant) -> bool {
        let lease = HeldLease {
            chat,
            ticket: &g.ticket,
            token: g.token,
        };
        self.op(|s, env, _| s.renew(env, &lease))
    }

    fn pushed(&mut self) -> Vec<Grant> {
        std::mem::take(&mut self.pushes)
    }
}

fn ticket(replica: &str, seq: u64) -> Ticket {
    Ticket {
        replica: Arc::from(replica),
        seq,
    }
}

fn granted(e: Enqueued) -> Grant {
    match e {
        Enqueued::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn an_active_chat_takes_112_bytes_and_an_idle_one_64_its_name_inline() {
    // The figures the module docs give: a name of up to 24 bytes costs nothing more.
    use super::super::chat_map::entry_size;
    assert_eq!(std::mem::size_of::<ChatState>(), 80);
    assert_eq!(entry_size::<ChatState>(), 112);
    assert_eq!(entry_size::<Past>(), 64);
}

#[test]
fn a_free_chat_is_granted_at_once_and_a_busy_one_queues() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    assert_eq!(g.token, 1);
    assert_eq!(g.previous, None);
    assert_eq!(f.enqueue("x", &ticket("b", 1), None), Enqueued::Queued);
    assert_eq!(f.shard.active_chats(), 1);
}

#[test]
fn release_hands_the_turn_to_the_queue_in_fifo_order() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    for (r, seq) in [("b", 1), ("c", 1), ("b", 2)] {
        assert_eq!(f.enqueue("x", &ticket(r, seq), None), Enqueued::Queued);
    }
    let mut holder = g;
    let mut order = Vec::new();
    loop {
        let next = match f.release("x", &holder, None) {
            Released::Released { next: Some(n) } => n,
            Released::Released { next: None } => match f.pushed().pop() {
                Some(n) => n,
                None => break,
            },
            Released::Lost => panic!("a live holder's release is not lost"),
        };
        assert!(next.token > holder.token, "tokens rise with every grant");
        assert_eq!(
            next.previous.as_ref().map(|p| p.token),
            Some(holder.token),
            "each grant names the turn before it"
        );
        order.push(next.ticket.to_string());
        holder = next;
    }
    assert_eq!(order, ["b#1", "c#1", "b#2"]);
    assert_eq!(f.shard.active_chats(), 0);
}

#[test]
fn an_expired_lease_is_replaced_by_the_recheck_and_its_release_is_lost() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    let w = ticket("b", 1);
    assert_eq!(f.enqueue("x", &w, None), Enqueued::Queued);
    // Within the TTL the holder keeps the chat; renewing pushes its end out.
    f.clock.advance(TTL - Duration::from_millis(1));
    f.heartbeat("b");
    assert!(f.renew("x", &g));
    assert_eq!(f.check("x", &w), TicketState::Waiting);
    // Now a holds until now + TTL; past that, unrenewed, the re-check moves on.
    f.clock.advance(TTL + Duration::from_millis(1));
    f.heartbeat("b");
    let TicketState::Granted(next) = f.check("x", &w) else {
        panic!("the waiter gets the chat once the holder's lease expired");
    };
    assert_eq!(next.ticket, w);
    assert_eq!(next.previous.map(|p| p.token), Some(g.token));
    assert!(!f.renew("x", &g), "the expired lease cannot be renewed");
    assert_eq!(f.release("x", &g, None), Released::Lost);
}

#[test]
fn a_lease_that_ran_out_with_nobody_granted_after_it_is_released() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), Some("m1")));
    let w = ticket("b", 1);
    assert_eq!(f.enqueue("x", &w, None), Enqueued::Queued);
    f.heartbeat("b");
    f.clock.advance(TTL + Duration::from_millis(1));
    f.heartbeat("b");
    // No re-check ran since the lease ran out: no other grant, so no overlap.
    assert!(matches!(
        f.release("x", &g, Some("m1")),
        Released::Released { next: None }
    ));
    let pushed = f.pushed();
    assert_eq!(pushed.len(), 1, "the waiter gets the chat");
    assert_eq!(pushed[0].ticket, w);
    // The message counts as handled: a redelivery is a duplicate.
    assert_eq!(
        f.enqueue("x", &ticket("c", 1), Some("m1")),
        Enqueued::Duplicate
    );
    // A second release of the same grant is lost (the chat has another holder).
    assert_eq!(f.release("x", &g, None), Released::Lost);
}

#[test]
fn a_crashed_replicas_tickets_are_skipped_once_its_liveness_lapses() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    assert_eq!(f.enqueue("x", &ticket("b", 1), None), Enqueued::Queued);
    assert_eq!(f.enqueue("x", &ticket("c", 1), None), Enqueued::Queued);
    // b stops renewing (it crashed); a and c go on.
    f.clock.advance(TTL + Duration::from_millis(1));
    f.heartbeat("a");
    f.heartbeat("c");
    assert!(
        !f.renew("x", &g),
        "a's grant expired too: it did not renew the lease"
    );
    let TicketState::Granted(next) = f.check("x", &ticket("c", 1)) else {
        panic!("c is next: b's ticket is skipped");
    };
    assert_eq!(next.ticket, ticket("c", 1));
}

#[test]
fn a_grant_to_a_replica_about_to_lapse_ends_with_its_liveness() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    assert_eq!(f.enqueue("x", &ticket("b", 1), None), Enqueued::Queued);
    f.clock.advance(Duration::from_secs(2));
    // b last renewed 2 s ago: its grant lasts only its remaining second.
    let next = match f.release("x", &g, None) {
        Released::Released { next: None } => f.pushed().pop().expect("pushed to b"),
        other => panic!("{other:?}"),
    };
    f.clock.advance(Duration::from_millis(1001));
    assert!(!f.renew("x", &next));
}

/// A release whose present was read 2 s before it reached the table (its thread was
/// preempted), while the next holder's replica showed a sign of life in between: the
/// grant lasts that replica's liveness, which is what the grantee counts a pushed
/// grant from, not a TTL from the release's older present.
#[test]
fn a_grant_made_with_an_older_present_lasts_its_grantees_liveness() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    let w = ticket("b", 1);
    assert_eq!(f.enqueue("x", &w, None), Enqueued::Queued);
    let read = f.clock.now();
    f.later(2, "b"); // b is alive until 2 s + TTL
    let lease = HeldLease {
        chat: "x",
        ticket: &g.ticket,
        token: g.token,
    };
    let next = match f.op_at(read, |s, env, p| s.release(env, &lease, None, p)) {
        Released::Released { next: None } => f.pushed().pop().expect("pushed to b"),
        other => panic!("{other:?}"),
    };
    assert_eq!(next.ticket, w);
    // Past a TTL from the old present, within b's liveness: b still holds the chat.
    f.clock.advance(TTL - Duration::from_millis(500));
    f.heartbeat("c");
    assert_eq!(
        f.enqueue("x", &ticket("c", 1), None),
        Enqueued::Queued,
        "b's lease must not have ended before b stops trusting it"
    );
    assert!(f.renew("x", &next), "b's lease still stands");
}

#[test]
fn a_duplicate_is_refused_while_its_claim_lives_and_after_it_was_handled() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), Some("m1")));
    // The same id through another replica while the first is held: in flight (it
    // may still die unhandled), so nothing is queued and b asks again later.
    assert_eq!(
        f.enqueue("x", &ticket("b", 1), Some("m1")),
        Enqueued::InFlight
    );
    assert_eq!(
        f.release("x", &g, Some("m1")),
        Released::Released { next: None }
    );
    assert_eq!(
        f.enqueue("x", &ticket("b", 2), Some("m1")),
        Enqueued::Duplicate
    );
    // After the window the id is new again.
    f.clock.advance(DEDUP + Duration::from_secs(1));
    f.heartbeat("b");
    assert!(matches!(
        f.enqueue("x", &ticket("b", 3), Some("m1")),
        Enqueued::Granted(_)
    ));
}

#[test]
fn a_claim_whose_ticket_died_unhandled_gives_way_to_a_redelivery() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    assert_eq!(
        f.enqueue("x", &ticket("b", 1), Some("m1")),
        Enqueued::Queued
    );
    // b crashes with m1 queued; once its liveness lapses a redelivery runs.
    f.clock.advance(TTL + Duration::from_millis(1));
    f.heartbeat("c");
    let redelivered = granted(f.enqueue("x", &ticket("c", 1), Some("m1")));
    assert_eq!(redelivered.previous.map(|p| p.token), Some(g.token));
}

#[test]
fn tokens_keep_rising_after_an_idle_chat_is_forgotten() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    assert_eq!(f.release("x", &g, None), Released::Released { next: None });
    // Within the history the next grant names the previous holder...
    let g2 = granted(f.enqueue("x", &ticket("b", 1), None));
    assert_eq!(g2.previous.as_ref().map(|p| p.token), Some(g.token));
    assert_eq!(f.release("x", &g2, None), Released::Released { next: None });
    // ...after it, the chat is forgotten, but its token still rises.
    f.clock.advance(Duration::from_secs(3601));
    f.heartbeat("a");
    let g3 = granted(f.enqueue("x", &ticket("a", 2), None));
    assert_eq!(g3.previous, None);
    assert!(g3.token > g2.token);
}

#[test]
fn checkpoints_are_fenced_by_the_live_lease() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), None));
    let now = f.clock.now();
    let now_ns = f.ns(now);
    assert!(
        f.shard
            .write_checkpoint(now, now_ns, "x", g.token, Some("{}"))
    );
    assert!(
        !f.shard
            .write_checkpoint(now, now_ns, "x", g.token + 1, Some("{}"))
    );
    f.clock.advance(TTL + Duration::from_millis(1));
    let later = f.clock.now();
    assert!(
        !f.shard
            .write_checkpoint(later, f.ns(later), "x", g.token, Some("{}")),
        "a holder whose lease ran out writes nothing"
    );
    assert_eq!(
        f.shard.read_checkpoint(later, "x"),
        Some((g.token, "{}".to_owned()))
    );
}

#[test]
fn enqueue_is_idempotent_per_ticket() {
    let mut f = Fixture::new();
    let g = granted(f.enqueue("x", &ticket("a", 1), Some("m1")));
    // Asked again (a re-queue): the same grant, no second token, no duplicate answer.
    assert_eq!(granted(f.enqueue("x", &ticket("a", 1), Some("m1"))), g);
    let w = ticket("b", 1);
    assert_eq!(f.enqueue("x", &w, Some("m2")), Enqueued::Queued);
    assert_eq!(f.enqueue("x", &w, Some("m2")), Enqueued::Queued);
    // One copy only: after b's turn the chat is free.
    let next = match f.release("x", &g, Some("m1")) {
        Released::Released { next: None } => f.pushed().pop().expect("pushed to b"),
        other => panic!("{other:?}"),
    };
    assert_eq!(next.ticket, w);
    assert_eq!(
        f.release("x", &next, Some("m2")),
        Released::Released { next: None }
    );
    assert!(
        f.pushed().is_empty(),
        "no second copy of b's ticket was queued"
    );
    assert_eq!(f.shard.active_chats(), 0);
}

/// The uncontended path alone grants a free chat as `enqueue` would (a rising token,
/// the previous holder), and leaves a held or waited-for chat, or a request with a
/// message id, to the full enqueue without touching it.
#[test]
fn grant_if_free_grants_only_a_free_chat_and_changes_nothing_else() {
    let mut f = Fixture::new();
    let free = |f: &mut Fixture, t: &Ticket, id: Option<&str>| {
        let req = EnqueueRequest {
            chat: "c",
            ticket: t,
            message_id: id,
            wait: Duration::from_secs(60),
        };
        f.op(|s, env, _| s.grant_if_free(env, &req))
    };
    let first = free(&mut f, &ticket("a", 1), None).expect("a free chat is granted");
    assert!(free(&mut f, &ticket("b", 1), None).is_none(), "held");
    let queued = f.enqueue("c", &ticket("b", 2), None);
    assert_eq!(queued, Enqueued::Queued);
    assert!(matches!(
        f.release("c", &first, None),
        Released::Released { next: None }
    ));
    let next = f.pushed();
    assert_eq!(next.len(), 1, "the queue keeps its turn: {next:?}");
    assert!(free(&mut f, &ticket("a", 3), None).is_none(), "held by b");
    assert!(matches!(
        f.release("c", &next[0], None),
        Released::Released { next: None }
    ));
    assert!(
        free(&mut f, &ticket("a", 4), Some("m1")).is_none(),
        "ids go to enqueue"
    );
    let again = free(&mut f, &ticket("a", 5), None).expect("free again");
    assert!(again.token > next[0].token);
    assert_eq!(again.previous.map(|p| p.replica), Some(Arc::from("b")));
}

#[test]
fn idle_chats_leave_the_active_map_and_keep_their_last_holder_for_the_history() {
    let mut f = Fixture::new();
    let held = granted(f.enqueue("held", &ticket("b", 1), None));
    let mut first = Vec::new();
    for i in 0..1000 {
        let chat = format!("c{i}");
        let g = granted(f.enqueue(&chat, &ticket("a", i), None));
        assert_eq!(
            f.release(&chat, &g, None),
            Released::Released { next: None }
        );
        first.push(g);
    }
    // The active map stops growing with the chats seen; the held chat stays in it.
    assert!(
        f.shard.chats.len() <= ACTIVE_FLOOR,
        "{}",
        f.shard.chats.len()
    );
    assert!(
        f.shard
            .chats
            .get(f.shard.hasher.hash("held"), "held")
            .is_some()
    );
    assert!(f.renew("held", &held));
    // Inspection and the next grant of every idle chat still name its last holder.
    let seen = f.op(|s, env, _| s.view(env.now_ns, "c7"));
    let previous = seen.and_then(|(_, holder, queued, previous)| {
        assert!(holder.is_none() && queued == 0);
        previous
    });
    assert_eq!(previous.map(|p| p.token), Some(first[7].token));
    retake_naming_a(&mut f, &first, 10);
    // Past the history they are forgotten, and dropped from memory as new chats come.
    f.clock.advance(Duration::from_secs(3601));
    f.heartbeat("a");
    assert_eq!(
        granted(f.enqueue("c0", &ticket("a", 5000), None)).previous,
        None
    );
    for i in 0..2100 {
        let chat = format!("n{i}");
        let g = granted(f.enqueue(&chat, &ticket("a", 6000 + i), None));
        assert_eq!(
            f.release(&chat, &g, None),
            Released::Released { next: None }
        );
    }
    let kept = (1..1000)
        .map(|i| format!("c{i}"))
        .filter(|c| f.shard.history.get(f.shard.hasher.hash(c), c).is_some())
        .count();
    assert_eq!(kept, 0, "expired history entries are dropped");
    assert!(
        f.shard
            .history
            .get(f.shard.hasher.hash("n5"), "n5")
            .is_some()
    );
}

/// A shard prepared for 1,000 chats (`with_chat_capacity`) holds their history
/// without growing, and its placeholders are never seen: no chat finds a previous
/// holder it did not have, and every one finds the one it had.
#[test]
fn a_prepared_shard_remembers_its_chats_without_growing_or_inventing_holders() {
    let mut f = Fixture::new();
    f.shard.reserve(1000).expect("room for 1000");
    let room = f.shard.history_capacity();
    assert!(room >= 1000, "{room}");
    assert_eq!(f.shard.history.len(), 0);
    let mut first = Vec::new();
    for i in 0..1000 {
        let chat = format!("c{i}");
        let g = granted(f.enqueue(&chat, &ticket("a", i), None));
        assert_eq!(g.previous, None, "{chat}: a placeholder's holder");
        assert!(f.op(|s, env, _| s.view(env.now_ns, &chat)).is_some());
        assert_eq!(
            f.release(&chat, &g, None),
            Released::Released { next: None }
        );
        first.push(g);
    }
    assert_eq!(f.shard.history_capacity(), room, "no growth");
    retake_naming_a(&mut f, &first, 10_000);
    // A name the placeholders had (the empty one) is a chat like any other.
    assert_eq!(f.op(|s, env, _| s.view(env.now_ns, "")), None);
}

/// While nothing in the history can have ended, its growth past each doubling does
/// not scan it; once something may have, the scan drops what ended and keeps the rest.
#[test]
fn the_history_is_scanned_only_once_an_entry_may_have_ended() {
    let mut f = Fixture::new();
    let cycle = |f: &mut Fixture, prefix: &str, n: u64, seq: u64| {
        for i in 0..n {
            let chat = format!("{prefix}{i}");
            let g = granted(f.enqueue(&chat, &ticket("a", seq + i), None));
            f.release(&chat, &g, None);
        }
    };
    cycle(&mut f, "c", 5000, 0);
    assert!(f.shard.history.len() > 4000, "{}", f.shard.history.len());
    assert_eq!(f.shard.history_scans, 0, "nothing had ended: no scan");
    // An hour later the first 5,000 have ended; the next doubling scans once.
    f.clock.advance(Duration::from_secs(3601));
    f.heartbeat("a");
    cycle(&mut f, "n", 12_000, 100_000);
    assert!(f.shard.history_scans >= 1);
    let old = (0..5000)
        .map(|i| format!("c{i}"))
        .filter(|c| f.shard.history.get(f.shard.hasher.hash(c), c).is_some())
        .count();
    assert_eq!(old, 0, "the ended entries are dropped");
    let scans = f.shard.history_scans;
    // Nothing left has ended: more growth scans no more.
    cycle(&mut f, "m", 30_000, 200_000);
    assert_eq!(f.shard.history_scans, scans);
    assert!(
        f.shard
            .history
            .get(f.shard.hasher.hash("n7"), "n7")
            .is_some()
    );
}

/// Takes every chat `c{i}` again for replica b (ticket numbers from `seq`), each
/// grant naming a's turn `first[i]` as the previous one, and releases it.
fn retake_naming_a(f: &mut Fixture, first: &[Grant], seq: u64) {
    for (i, g) in first.iter().enumerate() {
        let chat = format!("c{i}");
        let again = granted(f.enqueue(&chat, &ticket("b", seq + i as u64), None));
        let expected = Previous {
            replica: Arc::from("a"),
            token: g.token,
        };
        assert_eq!(again.previous, Some(expected), "{chat}");
        assert_eq!(
            f.release(&chat, &again, None),
            Released::Released { next: None }
        );
    }
}

/// Enqueues and releases `n` other chats: enough traffic for the shard to sweep.
fn other_traffic(f: &mut Fixture, n: u64) {
    for i in 0..n {
        let chat = format!("other{i}");
        let g = granted(f.enqueue(&chat, &ticket("c", 10_000 + i), None));
        assert_eq!(
            f.release(&chat, &g, None),
            Released::Released { next: None }
        );
    }
}

/// Found by review: a sweep once dropped the duplicate check of a chat idle past the
/// dedup window but inside its history, and with it the floor turned off for good.
#[test]
fn a_floor_turned_off_stays_off_whether_or_not_the_shard_swept() {
    for sweep in [false, true] {
        let mut f = Fixture::new();
        other_traffic(&mut f, 1); // the first sweep is done: the next comes at 64 chats
        // x's ids do not rise: 50 after 100 turns its floor off for good.
        for (seq, id) in [(1, "100"), (2, "50")] {
            let g = granted(f.enqueue("x", &ticket("a", seq), Some(id)));
            assert_eq!(
                f.release("x", &g, Some(id)),
                Released::Released { next: None }
            );
        }
        // A quiet spell past the dedup window but well inside the history (1 h).
        f.clock.advance(DEDUP + Duration::from_secs(5));
        f.heartbeat("a");
        f.heartbeat("c");
        if sweep {
            other_traffic(&mut f, 80); // unrelated chats: the shard sweeps
        }
        // 97 handled ids: the oldest are forgotten (a floor would cover them).
        for i in 0..97u64 {
            let id = (1000 + i).to_string();
            let g = granted(f.enqueue("x", &ticket("a", 100 + i), Some(&id)));
            assert_eq!(
                f.release("x", &g, Some(&id)),
                Released::Released { next: None }
            );
        }
        // A new message whose id is under the highest: its floor is off, so it runs.
        let e = f.enqueue("x", &ticket("a", 999), Some("500"));
        assert!(matches!(e, Enqueued::Granted(_)), "sweep={sweep}: {e:?}");
    }
}

/// Found by review: a stale release of an idle chat once restarted its history, but
/// only while the chat had not been swept into `history`.
#[test]
fn an_idle_chat_remembers_its_last_holder_for_the_history_from_its_release() {
    for sweep in [false, true] {
        let mut f = Fixture::new();
        other_traffic(&mut f, 1); // the first sweep is done: the next comes at 64 chats
        let g = granted(f.enqueue("x", &ticket("a", 1), None));
        assert_eq!(f.release("x", &g, None), Released::Released { next: None });
        if sweep {
            other_traffic(&mut f, 80); // unrelated chats: the shard sweeps
        }
        f.later(3000, "a");
        // A late, stale release of x's old lease: lost, and x stays as it was.
        assert_eq!(f.release("x", &g, None), Released::Lost);
        f.later(599, "b");
        let within = granted(f.enqueue("x", &ticket("b", 1), None));
        assert_eq!(
            within.previous.as_ref().map(|p| p.token),
            Some(g.token),
            "sweep={sweep}"
        );
        assert_eq!(
            f.release("x", &within, None),
            Released::Released { next: None }
        );
        // Another stale release later on, then the history since b's release runs out.
        f.later(2000, "a");
        assert_eq!(f.release("x", &g, None), Released::Lost);
        f.later(1601, "a");
        // Inspection agrees with the next grant: nothing is left to show (a
        // breaker's find, session 14: it named the holder while x was still in the
        // active map).
        let seen = f.op(|s, env, _| s.view(env.now_ns, "x"));
        assert_eq!(seen, None, "sweep={sweep}");
        let after = granted(f.enqueue("x", &ticket("a", 2), None));
        assert_eq!(after.previous, None, "sweep={sweep}");
    }
}
