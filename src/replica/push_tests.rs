//! Races of a pushed grant with its own ticket's enqueue, and waits that run out while
//! the backend does not answer (see `client_tests.rs`, whose backend, hooks and helpers
//! these tests use).

use super::*;

/// A grant pushed while its ticket's enqueue is still on its way back (a blackhole
/// held both), read late, so confirmed first; the confirming renewal fails (the next
/// blackhole), and the enqueue's answer (queued) arrives while the grant is being
/// confirmed. The waiter goes back to the table for the re-check. It once went back
/// as never placed (the enqueue's answer had found it taken) and without a deadline
/// (none was set for a ticket taken already): the re-check ignores a gone or lapsed
/// answer about a ticket never placed, so once the grant lapsed unused the message
/// never ended (the chaos harness's blackhole stalls: accepted, neither handled nor
/// dropped). A grant proves the ticket was placed: the re-check now reports it lost.
#[test]
fn a_pushed_grant_unconfirmed_while_its_enqueue_answered_still_ends() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let h_turn = turn(&take(&h, "chat", None));
    let (entered_tx, entered_rx) = unbounded::<()>();
    let (go_tx, go_rx) = unbounded::<()>();
    let (confirm_tx, confirm_rx) = unbounded();
    let clock = w.clock.clone();
    let backend = w.backend.clone();
    let r_id = r.id.clone();
    *w.backend.after_enqueue.lock() = Some(Box::new(move || {
        // r's ticket is queued; h hands the chat to it, and the wake-up is read a
        // renewal period late (r's ticks stalled meanwhile), on the listener's thread.
        *backend.held_pushes.lock() = Some(Vec::new());
        h_turn.release().expect("h releases");
        let pushes = backend.held_pushes.lock().take().unwrap_or_default();
        clock.advance(Duration::from_secs(4));
        *backend.cut_off.lock() = Some(r_id);
        let entered = entered_tx.clone();
        *backend.before_renew.lock() = Some(Box::new(move || {
            let _ = entered.send(());
            let _ = go_rx.recv();
        }));
        let listener = std::thread::spawn(move || {
            for (chat, grant, sink) in pushes {
                sink(&chat, grant);
            }
        });
        let _ = confirm_tx.send(listener);
        // The confirming renewal is on its way when the enqueue's answer arrives.
        entered_rx.recv().expect("the grant is being confirmed");
    }));
    let (answer, waiting) = offer(&r, "chat", Some("m1"));
    assert_eq!(answer.expect("accepted"), crate::Accepted::Queued);
    go_tx.send(()).expect("the confirmation goes on");
    let listener = confirm_rx.recv().expect("the listener ran");
    listener.join().expect("the listener returns");
    assert!(
        waiting.try_recv().is_err(),
        "an unconfirmed grant neither runs nor ends the wait"
    );
    // r is reachable again only after its grant lapsed unused, and the chat went on
    // to x.
    w.clock.advance(Duration::from_secs(11));
    let x = w.replica("x");
    let x_turn = turn(&take(&x, "chat", None));
    *w.backend.cut_off.lock() = None;
    tick(&r);
    match waiting.try_recv() {
        Ok(Err(NoTurn::Failed(e))) => assert_eq!(e.reason, crate::Reason::Lost),
        Ok(Ok(_)) => panic!("a lapsed grant must not run"),
        other => panic!("expected the message reported lost, got {other:?}"),
    }
    x_turn.release().expect("x held the chat");
}

/// A wait that runs out while the backend does not answer ends at its deadline, with
/// `timeout`: the timer thread makes no backend call for it, and the replica's next
/// renewal tick withdraws the ticket. The timer thread once called `cancel` itself, one
/// expiring waiter at a time, so with Redis paused each wait ended a command timeout
/// (two attempts of 2 s) after the one before, and a stop waited for all of them.
#[test]
fn a_wait_that_runs_out_ends_at_once_and_the_tick_withdraws_its_ticket() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    // As under a renewal thread.
    r.ticking.store(true, std::sync::atomic::Ordering::Release);
    let h_turn = turn(&take(&h, "chat", None));
    let waiting = take(&r, "chat", Some("m1"));
    let seq = r.placed_waiters()[0].1;
    *w.backend.cut_off.lock() = Some(r.id.clone());
    r.expire(seq);
    match waiting.try_recv() {
        Ok(Err(NoTurn::Failed(e))) => assert_eq!(e.reason, crate::Reason::Timeout),
        other => panic!("expected the wait ended with timeout, got {other:?}"),
    }
    // Reachable again: the tick withdraws the ticket and gives up its claim on m1.
    *w.backend.cut_off.lock() = None;
    tick(&r);
    assert!(r.ghosts.lock().is_empty(), "the ticket was withdrawn");
    h_turn.release().expect("h releases");
    let x = w.replica("x");
    let x_turn = turn(&take(&x, "chat", Some("m1")));
    x_turn.release().expect("the redelivery ran");
}

/// A grant that reaches a ticket whose wait ran out (before the tick withdrew it) is
/// released at once: the chat goes on to the next waiter.
#[test]
fn a_grant_to_a_wait_that_ran_out_is_released() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    r.ticking.store(true, std::sync::atomic::Ordering::Release);
    let h_turn = turn(&take(&h, "chat", None));
    let waiting = take(&r, "chat", None);
    let behind = take(&h, "chat", None);
    let seq = r.placed_waiters()[0].1;
    r.expire(seq);
    assert!(matches!(waiting.try_recv(), Ok(Err(NoTurn::Failed(_)))));
    // h's release hands the chat to r's ticket; r releases it on arrival, and the chat
    // goes on to h's second ticket.
    h_turn.release().expect("h releases");
    turn(&behind).release().expect("the next waiter ran");
}

/// A turn whose lease ran out by the replica's clock (its renewals failed) while nobody
/// was granted the chat after it: the backend still releases it, but the message is
/// reported `lost`, so it is not marked handled either: a redelivery runs, it is not
/// answered `duplicate`.
#[test]
fn a_turn_lost_by_the_replicas_clock_leaves_its_message_open_for_a_redelivery() {
    let w = World::new();
    let r = w.replica("r");
    let held = turn(&take(&r, "chat", Some("m1")));
    *w.backend.cut_off.lock() = Some(r.id.clone());
    for _ in 0..7 {
        w.clock.advance(Duration::from_secs(3));
        tick(&r);
    }
    assert!(held.is_lost());
    let err = held
        .release_handled()
        .expect_err("lost by the replica's clock");
    assert_eq!(err.reason, crate::Reason::Lost);
    *w.backend.cut_off.lock() = None;
    let x = w.replica("x");
    let again = turn(&take(&x, "chat", Some("m1")));
    again.release().expect("the redelivery ran");
}

/// A pushed grant whose confirming renewal fails (Redis unreachable for a moment, or
/// a failover whose new primary may not have the grant) is neither run nor given up:
/// the ticket waits again, and the next re-check, answered by the backend, hands it
/// the turn. Once it was reported lost though the backend still held the grant.
#[test]
fn a_pushed_grant_whose_confirmation_fails_waits_for_the_re_check() {
    let w = World::new();
    let (_h, r, h_turn, waiting) = held_with_a_stale_waiter(&w);
    *w.backend.cut_off.lock() = Some(r.id.clone());
    h_turn.release().expect("h releases");
    assert!(
        waiting.try_recv().is_err(),
        "an unconfirmed grant neither runs nor ends the wait"
    );
    *w.backend.cut_off.lock() = None;
    tick(&r);
    turn(&waiting)
        .release()
        .expect("r held the chat from its grant on");
}
