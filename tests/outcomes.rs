//! Dropped outcomes say what ran: `handler_started` tells a message whose handler ran
//! before its lease was found lost from one that never ran. Ordered by the fake clock
//! of the coordinator and by channels; no sleeps.

use std::sync::Arc;
use std::time::Duration;

use botmesh::{
    Bot, Clock, CoordinationConfig, CoordinatorConfig, MemoryCoordinator, Message, Outcome, Reason,
    Replica,
};
use crossbeam_channel::unbounded;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn a_lease_lost_under_a_running_handler_is_reported_as_started() {
    let clock = Clock::fake();
    let ttl = Duration::from_secs(10);
    let c = Arc::new(MemoryCoordinator::with_clock(
        ttl,
        Duration::from_secs(600),
        clock.clone(),
    ));
    let (tx, rx) = unbounded();
    let other = Replica::start("r2", c.clone()).expect("replica");
    let (taken_tx, taken_rx) = unbounded();
    let bot = Bot::builder()
        .id("r1")
        .coordination(CoordinationConfig::new(CoordinatorConfig::Shared(c)))
        .handler(move |_| {
            // The backend's clock runs past the lease while the handler runs (a long
            // pause, as far as the backend can tell) and another replica takes the
            // chat: the release finds it lost.
            clock.advance(ttl * 2);
            let turn = other
                .acquire_timeout("c", WAIT)
                .expect("the lapsed chat is free");
            let _ = taken_tx.send(turn);
            Ok(())
        })
        .on_outcome(move |_, o| {
            let _ = tx.send(o.clone());
        })
        .build()
        .expect("bot");
    bot.intake()
        .deliver(Message::new("c", "x").with_id("1"))
        .expect("deliver");
    match rx.recv_timeout(WAIT).expect("outcome") {
        Outcome::Dropped(e) => {
            assert_eq!(e.reason, Reason::Lost);
            assert!(e.handler_started, "{e}");
            assert!(
                e.to_string().contains("its effects (replies) may be out"),
                "{e}"
            );
        }
        other => panic!("expected a lost drop, got {other:?}"),
    }
    taken_rx
        .recv_timeout(WAIT)
        .expect("taken")
        .release()
        .expect("the new holder releases");
    bot.stop().expect("stop");
}

#[test]
fn a_message_that_never_got_its_turn_is_reported_as_not_started() {
    let c = Arc::new(MemoryCoordinator::new());
    let holder = Replica::start("holder", c.clone()).expect("replica");
    let turn = holder.acquire_timeout("c", WAIT).expect("acquire");
    let (tx, rx) = unbounded();
    let bot = Bot::builder()
        .id("r1")
        .coordination(
            CoordinationConfig::new(CoordinatorConfig::Shared(c))
                .with_turn_wait(Duration::from_millis(50)),
        )
        .handler(|_| panic!("must not run"))
        .on_outcome(move |_, o| {
            let _ = tx.send(o.clone());
        })
        .build()
        .expect("bot");
    bot.intake()
        .deliver(Message::new("c", "x").with_id("1"))
        .expect("deliver");
    match rx.recv_timeout(WAIT).expect("outcome") {
        Outcome::Dropped(e) => {
            assert_eq!(e.reason, Reason::Timeout);
            assert!(!e.handler_started, "{e}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    turn.release().expect("release");
    bot.stop().expect("stop");
    holder.shutdown();
}
