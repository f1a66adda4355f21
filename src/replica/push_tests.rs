//! Races of a pushed grant with its own ticket's enqueue (see `client_tests.rs`, whose
//! backend, hooks and helpers these tests use).

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
