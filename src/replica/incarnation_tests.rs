//! Runs of one replica id: a run that stalled past its liveness (1.25 TTLs without a
//! renewal) and the later run that took the id over (see `client_tests.rs`, whose
//! backend, hooks and helpers these tests use).

use std::sync::Barrier;

use super::*;

/// The stalled run `r` waits on "c", held by x, and stalls for 13 s while x renews;
/// then a later run of "r" attaches. Returns (x, the stalled run, the later run, x's
/// turn, the stalled run's wait).
fn stalled_and_replaced(w: &World) -> (Arc<Inner>, Arc<Inner>, Arc<Inner>, Turn, Receiver<Ended>) {
    let x = w.replica("x");
    let old = w.replica("r");
    let x_turn = turn(&take(&x, "c", None));
    let old_wait = take(&old, "c", None);
    for _ in 0..13 {
        w.clock.advance(Duration::from_secs(1));
        tick(&x);
    }
    let new = w.replica("r");
    assert_ne!(new.first_seq, old.first_seq, "two runs, two incarnations");
    (x, old, new, x_turn, old_wait)
}

/// A replica that stalled past its liveness (1.25 TTLs without a renewal) while a
/// later run of its id took the id over, then stops cleanly: its stop gives up its
/// own lease and leaves the later run holding its turn. It used to detach the id,
/// freeing the later run's turns while that run still acted on them: two holders of
/// one chat (a breaker's find, session 13).
#[test]
fn a_stale_runs_stop_leaves_the_later_run_of_its_id_holding_its_turns() {
    let w = World::new();
    let old = w.replica("r");
    let x = w.replica("x");
    let old_turn = turn(&take(&old, "a", None));
    // The old run stalls: x renews, it does not, for 13 s (past 1.25 x the 10 s TTL).
    for _ in 0..13 {
        w.clock.advance(Duration::from_secs(1));
        tick(&x);
    }
    let new = w.replica("r");
    assert_ne!(new.first_seq, old.first_seq, "two runs, two incarnations");
    let new_turn = turn(&take(&new, "b", None));
    // The stale run wakes up and stops cleanly.
    old.finish_stop(false);
    assert!(old_turn.is_lost());
    let waits = take(&x, "b", None);
    assert!(
        waits.try_recv().is_err(),
        "x must wait for b: the later run still holds it"
    );
    assert!(!new_turn.is_lost());
    turn(&take(&x, "a", None)).release().expect("a is free");
    new_turn.release().expect("the later run still held b");
    turn(&waits).release().expect("x gets b after it");
    // The later run is still attached: its next turn is granted as usual.
    turn(&take(&new, "c", None))
        .release()
        .expect("still attached");
}

/// The stalled run wakes up and its renewal ticks once (the first thing its thread
/// does) while the later run holds "c": the re-check of its old ticket answers with
/// the later run's grant (same id), which it must leave alone. It once released it as
/// a suspect, and y took "c" under the later run (a breaker's find, session 14).
#[test]
fn a_stale_runs_recheck_leaves_the_later_runs_grant_alone() {
    let w = World::new();
    let (_x, old, new, x_turn, old_wait) = stalled_and_replaced(&w);
    let new_wait = take(&new, "c", None);
    x_turn.release().expect("x releases");
    let new_turn = turn(&new_wait);
    tick(&old);
    assert!(
        !matches!(old_wait.try_recv(), Ok(Ok(_))),
        "the stalled run took a turn on c"
    );
    assert!(!new_turn.is_lost());
    let y = w.replica("y");
    let y_wait = take(&y, "c", None);
    assert!(
        y_wait.try_recv().is_err(),
        "y must wait: the later run of r holds c"
    );
    new_turn.release().expect("the later run still held c");
    turn(&y_wait).release().expect("y after it");
}

/// The later run's attach clears the stalled run's tickets: its old ticket on "c" is
/// never granted (under the id's fresh liveness) and run by the stalled run's stop
/// while the later run, reading the push, releases it as a predecessor's grant (a
/// breaker's find, session 14: two holders of "c").
#[test]
fn a_later_runs_attach_clears_the_stalled_runs_tickets() {
    let w = World::new();
    let (_x, old, new, x_turn, old_wait) = stalled_and_replaced(&w);
    *w.backend.held_pushes.lock() = Some(Vec::new());
    x_turn.release().expect("x releases");
    old.cancel_waiters();
    assert!(
        !matches!(old_wait.try_recv(), Ok(Ok(_))),
        "the stalled run's old ticket was granted after the later run attached"
    );
    let pushes = w.backend.held_pushes.lock().take().unwrap_or_default();
    let granted: Vec<_> = pushes.iter().map(|(chat, g, _)| (chat, g)).collect();
    assert!(granted.is_empty(), "nothing was granted to r: {granted:?}");
    let y = w.replica("y");
    turn(&take(&y, "c", None)).release().expect("c is free");
    turn(&take(&new, "c", None))
        .release()
        .expect("the later run takes c");
}

/// The stalled run wakes up and takes a new message for "c" after the later run
/// attached: its new ticket is below the later run's first ticket number, so the
/// memory backend counts it dead. It is never granted: not pushed to the later run
/// (which would release it as a predecessor's), not found granted by the stalled
/// run's stop (which would run it). Both once happened: two holders of "c" (a
/// breaker's find, session 14).
#[test]
fn a_stalled_runs_new_ticket_after_a_later_attach_is_never_granted() {
    let w = World::new();
    let (_x, old, _new, x_turn, _old_wait) = stalled_and_replaced(&w);
    let late_wait = take(&old, "c", None);
    *w.backend.held_pushes.lock() = Some(Vec::new());
    x_turn.release().expect("x releases");
    old.cancel_waiters();
    assert!(
        !matches!(late_wait.try_recv(), Ok(Ok(_))),
        "the stalled run ran a ticket it drew after the later run attached"
    );
    let pushes = w.backend.held_pushes.lock().take().unwrap_or_default();
    let granted: Vec<_> = pushes.iter().map(|(chat, g, _)| (chat, g)).collect();
    assert!(granted.is_empty(), "nothing was granted to r: {granted:?}");
    let y = w.replica("y");
    turn(&take(&y, "c", None)).release().expect("c is free");
}

/// A stale run's stop and a later run's attach of the same id, started together on
/// two threads, 3,000 times (either may come first, or they overlap): the later run
/// is never detached by the stale stop. A breaker found 262 losses in 100,000 rounds
/// when the stop checked the attached run under one lock and removed the entry under
/// another (session 14); attach and detach now run one at a time and the stop checks
/// and removes under one write lock. This test fails at once on a stop that ignores
/// the run; the narrow interleaving itself it meets too rarely to be sure of.
#[test]
fn a_stale_stop_racing_a_later_attach_never_detaches_it() {
    for round in 0..3_000 {
        let clock = Clock::fake();
        let c = Arc::new(MemoryCoordinator::with_clock(
            Duration::from_secs(10),
            Duration::from_secs(600),
            clock.clone(),
        ));
        let r: ReplicaId = Arc::from("r");
        c.attach_incarnation(&r, 1, Arc::new(|_: &str, _| {}))
            .expect("the first run");
        clock.advance(Duration::from_secs(13));
        let start = Arc::new(Barrier::new(2));
        let (c2, r2, start2) = (c.clone(), r.clone(), start.clone());
        let stale = std::thread::spawn(move || {
            start2.wait();
            for _ in 0..(round % 500) {
                std::hint::spin_loop();
            }
            c2.detach_incarnation(&r2, 1, &[]).expect("the stale stop");
        });
        start.wait();
        let attached = c.attach_incarnation(&r, 2, Arc::new(|_: &str, _| {}));
        stale.join().expect("the stale stop's thread");
        attached.expect("the later run attaches");
        let live = c.inspect(10).expect("inspect").replicas;
        assert!(
            live.iter().any(|id| &**id == "r"),
            "round {round}: the later run was detached by the stale stop"
        );
    }
}

/// A detach hands a chat to another replica's ticket; that replica's sink needs an
/// attach done on another thread before it returns (a sink handing work to a thread
/// that starts a replica). Sinks are called with no lock of attach or detach held, so
/// the attach goes through (a breaker's find, session 14: the push ran under the lock
/// that serialises attach and detach, and the two waited for each other).
#[test]
fn a_detachs_pushes_run_with_no_membership_lock_held() {
    let c = Arc::new(MemoryCoordinator::with_clock(
        Duration::from_secs(10),
        Duration::from_secs(600),
        Clock::fake(),
    ));
    let a: ReplicaId = Arc::from("a");
    let b: ReplicaId = Arc::from("b");
    c.attach(&a, Arc::new(|_: &str, _| {})).expect("a attaches");
    let (done_tx, done_rx) = crossbeam_channel::bounded::<bool>(1);
    let c2 = c.clone();
    let sink: GrantSink = Arc::new(move |_: &str, _| {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let c3 = c2.clone();
        std::thread::spawn(move || {
            let z: ReplicaId = Arc::from("z");
            let _ = tx.send(c3.attach(&z, Arc::new(|_: &str, _| {})).is_ok());
        });
        let attached = rx.recv_timeout(Duration::from_secs(20)).unwrap_or(false);
        let _ = done_tx.send(attached);
    });
    c.attach(&b, sink).expect("b attaches");
    let request = |ticket| EnqueueRequest {
        chat: "c",
        ticket,
        message_id: None,
        wait: Duration::from_secs(60),
    };
    let (ta, tb) = (
        crate::Ticket {
            replica: a.clone(),
            seq: 1,
        },
        crate::Ticket {
            replica: b.clone(),
            seq: 1,
        },
    );
    assert!(matches!(c.enqueue(&request(&ta)), Ok(Enqueued::Granted(_))));
    assert_eq!(c.enqueue(&request(&tb)).ok(), Some(Enqueued::Queued));
    c.detach(&a, &[]).expect("a detaches");
    let attached = done_rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(attached.ok(), Some(true), "the attach the sink waited for");
}
