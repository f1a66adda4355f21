//! Races of a turn's release with the renewal tick: the tick's snapshot, a renewal
//! refused and a second copy of the grant all meet a release on its way to the
//! backend (see `client_tests.rs`, whose backend, hooks and helpers these tests use).

use super::*;

/// A grant that reaches the replica twice (the push and the re-check) while its turn
/// is being released: the tick must not release the second copy in between, or the
/// turn's own release finds its lease gone and a handled message is reported lost.
#[test]
fn a_second_copy_of_a_grant_is_not_released_while_its_turn_releases() {
    let w = World::new();
    let h = w.replica("h");
    let r = w.replica("r");
    let held = take(&h, "chat", None);
    let h_turn = turn(&held);
    let waiter = take(&r, "chat", Some("m1"));
    let (entered_tx, entered_rx) = unbounded::<()>();
    let (go_tx, go_rx) = unbounded::<()>();
    let (done_tx, done_rx) = unbounded();
    let backend = w.backend.clone();
    // Inside r's renewal, after its snapshot (which lists the waiter): h releases, the
    // push hands the turn to the waiter, and its handler ends at once: its release
    // starts on another thread and stops just before the backend hears of it.
    *w.backend.before_renew.lock() = Some(Box::new(move || {
        h_turn.release().expect("h releases");
        let t = turn(&waiter);
        *backend.before_release.lock() = Some(Box::new(move || {
            let _ = entered_tx.send(());
            let _ = go_rx.recv();
        }));
        std::thread::spawn(move || {
            let _ = done_tx.send(t.release());
        });
        entered_rx
            .recv()
            .expect("the release reached the backend's door");
    }));
    // The re-check finds the waiter's ticket holding the chat: a second copy of the
    // grant, whose waiter is gone. The tick decides what to do with it now.
    tick(&r);
    go_tx.send(()).expect("let the release through");
    let released = done_rx.recv().expect("the release ended");
    assert!(
        released.is_ok(),
        "the handler's own release must succeed: {released:?}"
    );
    assert_eq!(r.snapshot().lost, 0);
}

/// A renewal that listed a turn just before its release started, and is refused
/// while that release is on its way to the backend: the turn is being released, not
/// lost. It stays in `held` until the backend answered (see
/// `TurnState::releasing`), so the refusal must not take it out as lost.
#[test]
fn a_renewal_refused_while_its_turn_releases_does_not_count_it_lost() {
    let w = World::new();
    let h = w.replica("h");
    let h_turn = turn(&take(&h, "chat", Some("m1")));
    let (entered_tx, entered_rx) = unbounded::<()>();
    let (go_tx, go_rx) = unbounded::<()>();
    let (done_tx, done_rx) = unbounded();
    let backend = w.backend.clone();
    // Inside h's renewal, after its snapshot (which lists the turn): the handler's
    // release starts on another thread and stops just before the backend hears of it.
    *w.backend.before_renew.lock() = Some(Box::new(move || {
        *backend.before_release.lock() = Some(Box::new(move || {
            let _ = entered_tx.send(());
            let _ = go_rx.recv();
        }));
        std::thread::spawn(move || {
            let _ = done_tx.send(h_turn.release_handled());
        });
        entered_rx
            .recv()
            .expect("the release reached the backend's door");
    }));
    // The backend refuses the renewal of the listed lease.
    *w.backend.rewrite_renewal.lock() = Some(Box::new(|r: &mut Renewal| {
        for kept in &mut r.held {
            *kept = false;
        }
    }));
    tick(&h);
    go_tx.send(()).expect("let the release through");
    let released = done_rx.recv().expect("the release ended");
    assert!(released.is_ok(), "the release must succeed: {released:?}");
    let m = h.snapshot();
    assert_eq!((m.lost, m.turns_held), (0, 0), "{m:?}");
    // Its message id's claim was made final: a redelivery is a duplicate.
    let (again, _rx) = offer(&h, "chat", Some("m1"));
    assert_eq!(again.expect("enqueue"), crate::Accepted::Duplicate);
}
