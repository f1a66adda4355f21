//! Races of the replica's protocol, made deterministic: no threads of the replica run
//! (the tests call the renewal tick themselves), the time is a fake clock, and the
//! interleavings that once lost or stalled messages are forced with hooks in the
//! coordinator's calls and channels.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::Mutex;

use super::{Inner, NoTurn, OnGrant};
use crate::coordinator::{
    BackendError, Coordinator, EnqueueRequest, Enqueued, Grant, GrantSink, HeldLease, Released,
    Renewal, ReplicaId, Token, Waiting,
};
use crate::metrics::Metrics;
use crate::{Clock, MemoryCoordinator, Turn};

type Hook = Box<dyn FnOnce() + Send>;
type HeldHook = Box<dyn FnOnce(&[HeldLease<'_>]) + Send>;
type RenewalHook = Box<dyn FnOnce(&mut Renewal) + Send>;

/// The memory backend, with a one-shot hook that runs inside the next `renew` (after
/// the caller took its snapshot, before the backend answers) and one inside the next
/// `release` (after the caller dropped the turn from its table, before the backend
/// sees the release).
struct Hooked {
    inner: MemoryCoordinator,
    before_renew: Mutex<Option<Hook>>,
    before_release: Mutex<Option<Hook>>,
    /// Rewrites the next `renew`'s answer (a backend state the memory backend never
    /// reaches itself, such as a ticket whose trace expired).
    rewrite_renewal: Mutex<Option<RenewalHook>>,
    /// A replica whose renewals and cancels fail, as if cut off from the backend.
    cut_off: Mutex<Option<ReplicaId>>,
    /// Runs inside the next `renew` that carries held leases, with them.
    with_held: Mutex<Option<HeldHook>>,
    /// Runs after the next `enqueue` reached the backend, whose reply is then lost
    /// (the caller gets an error, as when a connection breaks after sending).
    after_enqueue_fails: Mutex<Option<Hook>>,
    /// Runs after the next `enqueue` reached the backend, which then answers
    /// `Duplicate` (as a retried call does once the first attempt's ticket was
    /// granted and handled).
    after_enqueue_duplicate: Mutex<Option<Hook>>,
    /// Runs after the next `enqueue` reached the backend, before its reply returns
    /// (the reply is then read as usual): what happens while it is on its way back.
    after_enqueue: Mutex<Option<Hook>>,
    /// While set, pushes are kept here (with their sink) instead of delivered: a
    /// wake-up still on its way.
    held_pushes: HeldPushes,
}

type HeldPushes = Arc<Mutex<Option<Vec<(String, Grant, GrantSink)>>>>;

impl Hooked {
    /// `sink`, keeping its pushes in `held_pushes` while that is set.
    fn wrap(&self, sink: GrantSink) -> GrantSink {
        let held = self.held_pushes.clone();
        Arc::new(move |chat: &str, grant: Grant| {
            let mut kept = held.lock();
            match kept.as_mut() {
                Some(list) => list.push((chat.to_owned(), grant, sink.clone())),
                None => {
                    drop(kept);
                    sink(chat, grant);
                }
            }
        })
    }
}

impl Coordinator for Hooked {
    fn backend(&self) -> &'static str {
        "hooked memory"
    }
    fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl()
    }
    fn attach(&self, replica: &ReplicaId, sink: GrantSink) -> Result<(), BackendError> {
        self.inner.attach(replica, self.wrap(sink))
    }
    fn attach_incarnation(
        &self,
        replica: &ReplicaId,
        incarnation: u64,
        sink: GrantSink,
    ) -> Result<(), BackendError> {
        self.inner
            .attach_incarnation(replica, incarnation, self.wrap(sink))
    }
    fn detach_incarnation(
        &self,
        replica: &ReplicaId,
        incarnation: u64,
        held: &[HeldLease<'_>],
    ) -> Result<(), BackendError> {
        self.inner.detach_incarnation(replica, incarnation, held)
    }
    fn detach(&self, replica: &ReplicaId, held: &[HeldLease<'_>]) -> Result<(), BackendError> {
        self.inner.detach(replica, held)
    }
    fn enqueue(&self, request: &EnqueueRequest<'_>) -> Result<Enqueued, BackendError> {
        let answer = self.inner.enqueue(request);
        let hook = self.after_enqueue.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        let hook = self.after_enqueue_fails.lock().take();
        if let Some(hook) = hook {
            hook();
            return Err(BackendError::new("reply lost"));
        }
        let hook = self.after_enqueue_duplicate.lock().take();
        if let Some(hook) = hook {
            hook();
            return Ok(Enqueued::Duplicate);
        }
        answer
    }
    fn cancel(&self, waiting: &Waiting<'_>) -> Result<Option<Grant>, BackendError> {
        if self.cut_off.lock().as_ref() == Some(&waiting.ticket.replica) {
            return Err(BackendError::new("cut off"));
        }
        self.inner.cancel(waiting)
    }
    fn release(
        &self,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
    ) -> Result<Released, BackendError> {
        let hook = self.before_release.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        self.inner.release(lease, handled)
    }
    fn renew(
        &self,
        replica: &ReplicaId,
        held: &[HeldLease<'_>],
        waiting: &[Waiting<'_>],
    ) -> Result<Renewal, BackendError> {
        let hook = self.before_renew.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        if !held.is_empty() {
            let hook = self.with_held.lock().take();
            if let Some(hook) = hook {
                hook(held);
            }
        }
        if self.cut_off.lock().as_ref() == Some(replica) {
            return Err(BackendError::new("cut off"));
        }
        let mut renewal = self.inner.renew(replica, held, waiting)?;
        let rewrite = self.rewrite_renewal.lock().take();
        if let Some(rewrite) = rewrite {
            rewrite(&mut renewal);
        }
        Ok(renewal)
    }
    fn write_checkpoint(
        &self,
        chat: &str,
        token: Token,
        data: Option<&str>,
    ) -> Result<bool, BackendError> {
        self.inner.write_checkpoint(chat, token, data)
    }
    fn read_checkpoint(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError> {
        self.inner.read_checkpoint(chat)
    }
}

struct World {
    clock: Clock,
    backend: Arc<Hooked>,
}

/// How a wait ended, as a test sees it.
type Ended = Result<Turn, NoTurn>;

impl World {
    fn new() -> Self {
        Self::with_dedup_window(Duration::from_secs(600))
    }

    fn with_dedup_window(window: Duration) -> Self {
        let clock = Clock::fake();
        let inner = MemoryCoordinator::with_clock(Duration::from_secs(10), window, clock.clone());
        World {
            clock,
            backend: Arc::new(Hooked {
                inner,
                before_renew: Mutex::new(None),
                before_release: Mutex::new(None),
                rewrite_renewal: Mutex::new(None),
                cut_off: Mutex::new(None),
                with_held: Mutex::new(None),
                after_enqueue_fails: Mutex::new(None),
                after_enqueue_duplicate: Mutex::new(None),
                after_enqueue: Mutex::new(None),
                held_pushes: Arc::default(),
            }),
        }
    }

    fn replica(&self, id: &str) -> Arc<Inner> {
        Inner::attach(
            id.to_owned(),
            self.backend.clone(),
            Arc::new(Metrics::default()),
            self.clock.clone(),
            Duration::ZERO,
        )
        .expect("attach")
    }
}

/// Enqueues a message on `chat`; its wait's end arrives on the returned channel.
fn take(r: &Arc<Inner>, chat: &str, id: Option<&str>) -> Receiver<Ended> {
    let (answer, rx) = offer(r, chat, id);
    answer.expect("enqueue");
    rx
}

/// Like [`take`], with the enqueue's answer.
fn offer(
    r: &Arc<Inner>,
    chat: &str,
    id: Option<&str>,
) -> (
    Result<crate::Accepted, crate::CoordinationUnavailableError>,
    Receiver<Ended>,
) {
    let (tx, rx): (Sender<Ended>, Receiver<Ended>) = unbounded();
    let on_grant: OnGrant = Box::new(move |r| {
        let _ = tx.send(r);
    });
    (r.enqueue(chat, id, Duration::from_secs(60), on_grant), rx)
}

/// `r` is cut off (its ticks run, its renewals fail) for 9 of its 10 s of liveness
/// while `h` keeps renewing; then it is reachable again.
fn cut_off_for_nine_seconds(w: &World, h: &Arc<Inner>, r: &Arc<Inner>) {
    *w.backend.cut_off.lock() = Some(r.id.clone());
    for _ in 0..3 {
        w.clock.advance(Duration::from_secs(3));
        tick(h);
        tick(r);
    }
    *w.backend.cut_off.lock() = None;
}

/// Replica h holds "chat" and r waits on it, r cut off for 9 s meanwhile: a grant
/// pushed to r now has 1 s of r's liveness left, and is confirmed before use.
fn held_with_a_stale_waiter(w: &World) -> (Arc<Inner>, Arc<Inner>, Turn, Receiver<Ended>) {
    let h = w.replica("h");
    let r = w.replica("r");
    let h_turn = turn(&take(&h, "chat", None));
    let waiting = take(&r, "chat", None);
    cut_off_for_nine_seconds(w, &h, &r);
    (h, r, h_turn, waiting)
}

fn turn(rx: &Receiver<Ended>) -> Turn {
    match rx.try_recv() {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => panic!("expected a turn, the wait ended with {e}"),
        Err(_) => panic!("expected a turn, nothing arrived yet"),
    }
}

fn tick(r: &Arc<Inner>) {
    let mut last_ok = r.now();
    r.renew_once(&mut last_ok);
}

/// The re-check's snapshot of waiting tickets is older than its answer: a ticket
/// granted and released in between reads as gone. That must not re-queue the chat's
/// other tickets, which are still validly queued: doing so once queued them twice
/// (the second copy's grant then held the chat for a renewal period) and, for a
/// message with an id, answered `Duplicate` against its own claim, reporting it lost.
#[test]
fn a_ticket_granted_after_the_recheck_snapshot_does_not_requeue_its_chat() {
    let w = World::new();
    let h = w.replica("h");
    let x = w.replica("x");
    let r = w.replica("r");
    let held = take(&h, "chat", None);
    let h_turn = turn(&held);
    let first = take(&r, "chat", Some("m1"));
    let between = take(&x, "chat", None);
    let second = take(&r, "chat", Some("m2"));
    // Inside r's renewal, after its snapshot: h releases, r's first message runs and
    // releases, and x gets the chat. r's second message still waits behind x.
    let (first_tx, first_rx) = unbounded();
    *w.backend.before_renew.lock() = Some(Box::new(move || {
        h_turn.release().expect("h releases");
        let t = turn(&first);
        t.release().expect("r's first message releases");
        let _ = first_tx.send(());
    }));
    tick(&r);
    first_rx.try_recv().expect("the hook ran");
    assert!(
        second.try_recv().is_err(),
        "r's second message still waits (it was neither reported nor granted)"
    );
    turn(&between).release().expect("x releases");
    let t = turn(&second);
    t.release().expect("r's second message releases");
    // Exactly one copy of it was queued: the chat is idle now, nothing holds it.
    assert_eq!(w.backend.inner.active_chats(), 0);
    assert_eq!(r.snapshot().lost, 0);
}

/// The first delivery of a message is queued on a replica that crashes; the platform
/// redelivers it to another at once, within the TTL. The second delivery must not be
/// answered "duplicate" and then dropped: it waits, and once the first one's ticket
/// lapsed unhandled, it takes the claim over and runs.
#[test]
fn a_redelivery_while_the_first_owner_is_dead_runs_once_it_lapsed() {
    let w = World::new();
    let h = w.replica("h");
    let a = w.replica("a");
    let b = w.replica("b");
    let held = take(&h, "chat", None);
    let h_turn = turn(&held);
    let _first = take(&a, "chat", Some("m1"));
    a.set_aborted(); // a crashes: its ticket stays queued until its liveness lapses
    let second = take(&b, "chat", Some("m1"));
    assert!(second.try_recv().is_err(), "taken in, waiting");
    // Past a's liveness (b and h renew, a does not): the first ticket is dead.
    w.clock.advance(Duration::from_secs(6));
    tick(&h);
    tick(&b);
    w.clock.advance(Duration::from_secs(6));
    tick(&h);
    h_turn.release().expect("h releases");
    tick(&b);
    let t = turn(&second);
    assert_eq!(t.chat(), "chat");
    t.release().expect("release");
}

/// With a drift allowance, a holder whose renewals stop gives its turn up that long
/// before the TTL runs out by its own clock (the backend's clock may run faster).
#[test]
fn a_holder_stops_a_drift_allowance_before_its_lease_runs_out() {
    let w = World::new();
    let r = Inner::attach(
        "r".to_owned(),
        w.backend.clone(),
        Arc::new(Metrics::default()),
        w.clock.clone(),
        Duration::from_secs(1),
    )
    .expect("attach");
    let t = turn(&take(&r, "chat", None));
    w.clock.advance(Duration::from_millis(8_900));
    assert!(!t.is_lost(), "within TTL less the allowance");
    w.clock.advance(Duration::from_millis(200));
    assert!(
        t.is_lost(),
        "9.1 s of a 10 s lease with a 1 s allowance: given up"
    );
    // By the backend's clock the lease still stands; the holder's release frees it.
    assert!(t.release().is_err(), "reported lost, as it was given up");
}

/// A renewal thread held up by a busy CPU for well under the TTL loses nothing: the
/// lease (by the backend's clock and by the holder's) still stands when the late tick
/// comes, and the tick renews it.
#[test]
fn a_renewal_late_by_less_than_the_ttl_keeps_the_lease() {
    let w = World::new();
    let r = w.replica("r");
    let t = turn(&take(&r, "chat", None));
    // On time: one period (TTL/3) later.
    w.clock.advance(Duration::from_millis(3_333));
    tick(&r);
    // The next tick comes 6 s late (9.3 s after the last renewal, within 10 s).
    w.clock.advance(Duration::from_millis(9_300));
    assert!(!t.is_lost());
    tick(&r);
    assert!(!t.is_lost(), "renewed by the late tick");
    w.clock.advance(Duration::from_secs(5));
    assert!(!t.is_lost(), "the late renewal put the end a TTL ahead");
    t.release().expect("still held");
    assert_eq!(r.snapshot().lost, 0);
}

/// A replica paused past its liveness comes back to find its queued ticket skipped and
/// a later message of the chat handled meanwhile. Queueing its ticket again would run
/// it after that later one (FIFO broken); it is reported `lost` instead.
#[test]
fn a_ticket_skipped_while_its_replica_was_paused_is_reported_not_requeued() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let x = w.replica("x");
    let h_turn = turn(&take(&h, "chat", None));
    let early = take(&r, "chat", Some("m1"));
    // r is paused (no ticks) past its liveness; h and x go on renewing.
    w.clock.advance(Duration::from_secs(6));
    tick(&h);
    let later = take(&x, "chat", Some("m2"));
    w.clock.advance(Duration::from_secs(6));
    tick(&h);
    tick(&x);
    h_turn.release().expect("h releases");
    // r's ticket was skipped: x's later message holds the chat.
    let x_turn = turn(&later);
    x_turn.release().expect("x releases");
    // r runs again: its ticket lost its place.
    tick(&r);
    match early.try_recv() {
        Ok(Err(NoTurn::Failed(e))) => assert_eq!(e.reason, crate::Reason::Lost),
        other => panic!("expected the skipped message reported lost, got {other:?}"),
    }
    assert_eq!(
        w.backend.inner.active_chats(),
        0,
        "nothing was queued again"
    );
}

/// A grant another replica makes lasts only as long as the grantee's liveness in the
/// chat. Made after the grantee went unrefreshed for most of a TTL (a partition), it
/// has little left; the grantee once trusted any pushed grant for two thirds of a TTL
/// from its arrival, so it held the turn by its own clock after the backend had let
/// the lease lapse and given the chat to the next waiter. Now it confirms the grant
/// with a renewal first.
#[test]
fn a_grant_with_little_of_its_grantees_liveness_left_is_confirmed_before_use() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let x = w.replica("x");
    let h_turn = turn(&take(&h, "chat", None));
    let waiting = take(&r, "chat", None);
    cut_off_for_nine_seconds(&w, &h, &r);
    // h hands the chat on: r's grant has 1 s of r's liveness left.
    h_turn.release().expect("h releases");
    let r_turn = turn(&waiting);
    // 1.5 s later, still before r's next renewal tick, x asks for the chat.
    w.clock.advance(Duration::from_millis(1_500));
    let x_wait = take(&x, "chat", None);
    let x_granted = matches!(x_wait.try_recv(), Ok(Ok(_)));
    assert!(
        !x_granted || r_turn.is_lost(),
        "r still believes it holds the chat while x was granted it"
    );
    assert!(
        !x_granted,
        "the confirmed lease still stands at the backend"
    );
    r_turn.release().expect("r held it throughout");
}

/// A ticket the backend has no trace of, found after the replica's liveness in the
/// chat went unrefreshed for a TTL (the queue's keys expired while it was paused, or
/// Redis was down that long), was most likely skipped and later messages ran: it is
/// reported lost. Once it was queued again at the back, which ran it after them.
#[test]
fn a_ticket_gone_after_its_liveness_lapsed_is_reported_not_requeued() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let h_turn = turn(&take(&h, "chat", None));
    let early = take(&r, "chat", Some("m1"));
    // r is paused (no ticks) for 12 s; h keeps renewing.
    for _ in 0..4 {
        w.clock.advance(Duration::from_secs(3));
        tick(&h);
    }
    *w.backend.rewrite_renewal.lock() = Some(Box::new(|renewal: &mut Renewal| {
        for state in &mut renewal.waiting {
            *state = crate::TicketState::Gone;
        }
    }));
    tick(&r);
    match early.try_recv() {
        Ok(Err(NoTurn::Failed(e))) => assert_eq!(e.reason, crate::Reason::Lost),
        other => panic!("expected the message reported lost, got {other:?}"),
    }
    // (The memory backend did keep the ticket, so h's release grants it to nobody
    // here; r's next tick releases that grant.)
    h_turn.release().expect("h releases");
    tick(&r);
    assert_eq!(w.backend.inner.active_chats(), 0, "nothing waits or holds");
}

/// The same answer while the replica kept its liveness refreshed means the backend
/// lost its data (a restart without persistence): the ticket is queued again.
#[test]
fn a_ticket_gone_while_its_liveness_was_kept_is_queued_again() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let h_turn = turn(&take(&h, "chat", None));
    let early = take(&r, "chat", Some("m1"));
    w.clock.advance(Duration::from_secs(3));
    tick(&h);
    *w.backend.rewrite_renewal.lock() = Some(Box::new(|renewal: &mut Renewal| {
        for state in &mut renewal.waiting {
            *state = crate::TicketState::Gone;
        }
    }));
    tick(&r);
    assert!(early.try_recv().is_err(), "still waiting, queued again");
    h_turn.release().expect("h releases");
    turn(&early).release().expect("r runs it");
}

/// An enqueue whose reply is lost although it reached the backend, and whose grant
/// was pushed before the error came back: the grant's callback owns the message's
/// end. The caller was once told `backend` as well, so the message ended twice.
#[test]
fn an_enqueue_that_fails_after_its_grant_arrived_ends_once() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let h_turn = turn(&take(&h, "chat", None));
    *w.backend.after_enqueue_fails.lock() = Some(Box::new(move || {
        h_turn.release().expect("h releases");
    }));
    let (answer, rx) = offer(&r, "chat", Some("m1"));
    assert!(answer.is_ok(), "accepted, not failed: {answer:?}");
    turn(&rx).release().expect("r runs it");
    assert!(rx.try_recv().is_err(), "one end only");
}

/// A pushed grant being confirmed (one renewal round trip) is not in `held` yet. A
/// second copy of it arriving meanwhile (the re-check found it too) finds the waiter
/// taken and becomes a suspect; the tick used to release it as unused, freeing the
/// chat under the turn about to run. It now waits while the grant is in hand.
#[test]
fn a_second_copy_of_a_grant_being_confirmed_is_not_released() {
    let w = World::new();
    let (_h, r, h_turn, waiting) = held_with_a_stale_waiter(&w);
    let r2 = r.clone();
    *w.backend.with_held.lock() = Some(Box::new(move |held: &[HeldLease<'_>]| {
        let copy = Grant {
            ticket: held[0].ticket.clone(),
            token: held[0].token,
            previous: None,
        };
        r2.deliver(held[0].chat, copy);
        tick(&r2);
    }));
    h_turn.release().expect("h releases");
    let r_turn = turn(&waiting);
    tick(&r);
    r_turn.release().expect("r's turn stood throughout");
    assert_eq!(r.snapshot().lost, 0);
}

/// An enqueue retried after its first reply was lost finds its own ticket granted and
/// handled meanwhile, and the backend answers `Duplicate`. The grant's callback owns
/// the message's end; answering `Duplicate` to the caller as well ended it twice.
#[test]
fn an_enqueue_answered_duplicate_after_its_own_grant_ends_once() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let h_turn = turn(&take(&h, "chat", None));
    *w.backend.after_enqueue_duplicate.lock() = Some(Box::new(move || {
        h_turn.release().expect("h releases");
    }));
    let (answer, rx) = offer(&r, "chat", Some("m1"));
    assert!(
        matches!(answer, Ok(crate::Accepted::Queued)),
        "taken in, not a duplicate: {answer:?}"
    );
    turn(&rx).release().expect("r runs it");
    assert!(rx.try_recv().is_err(), "one end only");
}

/// A message's claim on its id must outlive its wait, also under a dedup window
/// shorter than that: it expired while the message still waited, and a redelivery of
/// it elsewhere took a new claim and ran it a second time (breaker finding).
#[test]
fn a_claim_outlives_its_messages_wait_under_a_short_dedup_window() {
    let w = World::with_dedup_window(Duration::from_millis(500));
    let h = w.replica("h");
    let r = w.replica("r");
    let q = w.replica("q");
    let h_turn = turn(&take(&h, "chat", None));
    let first = take(&r, "chat", Some("x"));
    w.clock.advance(Duration::from_secs(1));
    let (answer, redelivery) = offer(&q, "chat", Some("x"));
    assert!(answer.is_ok());
    h_turn.release().expect("h releases");
    turn(&first)
        .release_handled()
        .expect("the first delivery runs");
    // The redelivery waited for the first (in flight), and ends as a duplicate.
    tick(&q);
    match redelivery.try_recv() {
        Ok(Err(NoTurn::Duplicate)) => {}
        other => panic!("expected a duplicate, got {other:?}"),
    }
}

/// A replica's liveness in a chat is one for all its tickets there, and the re-check
/// asks about the earliest only. A grant pushed to a later ticket long after that
/// ticket's own enqueue must count from the chat's latest refresh: counted from the
/// enqueue it looked nearly lapsed and was confirmed first, and a confirming round
/// trip that failed (a starved host, a slow link) lost a turn the backend still held.
#[test]
fn a_later_ticket_counts_its_liveness_from_the_chats_latest_refresh() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let x = w.replica("x");
    let h_turn = turn(&take(&h, "chat", None));
    let first = take(&r, "chat", None);
    let between = take(&x, "chat", None);
    let second = take(&r, "chat", None);
    // 9 s of ticks: r's re-checks ask about `first`, which refreshes r in the chat.
    for _ in 0..3 {
        w.clock.advance(Duration::from_secs(3));
        tick(&h);
        tick(&r);
        tick(&x);
    }
    // From now on a confirming renewal by r fails.
    *w.backend.cut_off.lock() = Some(r.id.clone());
    h_turn.release().expect("h releases");
    turn(&first).release().expect("r releases");
    // x's release pushes `second`'s grant to r, 9 s after its enqueue.
    turn(&between).release().expect("x releases");
    turn(&second).release().expect("r held the chat throughout");
}

/// The backend skips a replica's lapsed tickets one by one, as each reaches the front
/// of the queue; a later call (an enqueue, a re-check) makes the replica live again.
/// When the earliest ticket of a chat answers lapsed, the later ones may still be
/// queued: each is asked about, and only those skipped too are reported lost. Once all
/// of them were reported, throwing away messages that would have run in order.
#[test]
fn a_lapsed_first_ticket_loses_only_the_later_tickets_skipped_too() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let h_turn = turn(&take(&h, "chat", None));
    let first = take(&r, "chat", None);
    let second = take(&r, "chat", None);
    // The backend answers that the earliest ticket was skipped (its follow-up
    // question gets the memory backend's own answer: still queued).
    *w.backend.rewrite_renewal.lock() = Some(Box::new(|renewal: &mut Renewal| {
        for state in &mut renewal.waiting {
            *state = crate::TicketState::Lapsed;
        }
    }));
    tick(&r);
    match first.try_recv() {
        Ok(Err(NoTurn::Failed(e))) => assert_eq!(e.reason, crate::Reason::Lost),
        other => panic!("expected the first message reported lost, got {other:?}"),
    }
    assert!(
        second.try_recv().is_err(),
        "the second ticket is still queued and keeps waiting"
    );
    // h hands the chat on to `first`, whose waiter is gone: r's next tick releases
    // that grant, which hands the chat to `second`.
    h_turn.release().expect("h releases");
    tick(&r);
    turn(&second).release().expect("second ran in order");
}

/// A later enqueue refreshes the replica's liveness in the chat, but says nothing of
/// the lapse before it, in which an earlier ticket may have been skipped: a ticket gone
/// whose own place was last confirmed over a TTL ago is reported lost even so. Counted
/// from the chat's latest refresh it was queued again at the back, and ran after later
/// messages of its chat.
#[test]
fn a_ticket_gone_after_a_lapse_is_lost_though_a_later_enqueue_refreshed_the_chat() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let h_turn = turn(&take(&h, "chat", None));
    let early = take(&r, "chat", Some("m1"));
    // r is paused (no ticks) for 12 s; h keeps renewing.
    for _ in 0..4 {
        w.clock.advance(Duration::from_secs(3));
        tick(&h);
    }
    // Back, r takes in a later message of the chat.
    let later = take(&r, "chat", Some("m2"));
    *w.backend.rewrite_renewal.lock() = Some(Box::new(|renewal: &mut Renewal| {
        for state in &mut renewal.waiting {
            *state = crate::TicketState::Gone;
        }
    }));
    tick(&r);
    match early.try_recv() {
        Ok(Err(NoTurn::Failed(e))) => assert_eq!(e.reason, crate::Reason::Lost),
        other => panic!("expected the early message reported lost, got {other:?}"),
    }
    assert!(
        later.try_recv().is_err(),
        "the later message keeps its place"
    );
    h_turn.release().expect("h releases");
    tick(&r);
    turn(&later).release().expect("the later message runs");
}

/// An enqueue refreshes the replica's liveness in the chat but does not lengthen a
/// lease already granted to another of its tickets there (that lease was bounded by the
/// liveness at the moment of the grant). A pushed grant read after such an enqueue must
/// not count its lease from it: counted so, the turn ran past the backend's lease while
/// the chat went to the next holder (a fence violation in the 1,000-fault run).
#[test]
fn an_enqueue_after_a_grant_does_not_lengthen_that_grant() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let x = w.replica("x");
    let h_turn = turn(&take(&h, "chat", None));
    let first = take(&r, "chat", None);
    // 8 s on: r's ticks run but reach nothing (its liveness stays at 10 s).
    *w.backend.cut_off.lock() = Some(r.id.clone());
    for step in [3, 3, 2] {
        w.clock.advance(Duration::from_secs(step));
        tick(&h);
        tick(&r);
        tick(&x);
    }
    *w.backend.cut_off.lock() = None;
    // h hands the chat to `first`; the wake-up is still on its way when r takes in a
    // later message of the chat.
    *w.backend.held_pushes.lock() = Some(Vec::new());
    h_turn.release().expect("h releases");
    let later = take(&r, "chat", None);
    let pushes = w.backend.held_pushes.lock().take().unwrap_or_default();
    for (chat, grant, sink) in pushes {
        sink(&chat, grant);
    }
    let r_turn = turn(&first);
    // 2.5 s later, past the lease the grant was made with (10 s), x asks for the chat:
    // the backend moves it on, to `later`.
    w.clock.advance(Duration::from_millis(2_500));
    let _x_wait = take(&x, "chat", None);
    let later_granted = matches!(later.try_recv(), Ok(Ok(_)));
    assert!(
        !later_granted || r_turn.is_lost(),
        "r's first turn still believes it holds the chat while the next one was granted"
    );
}

#[path = "push_tests.rs"]
mod push;

#[path = "release_tests.rs"]
mod release;

#[path = "incarnation_tests.rs"]
mod incarnation;
