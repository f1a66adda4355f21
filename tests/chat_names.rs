//! Chat ids that start with a NUL (stored with one more, so they never meet the
//! runtime's reserved lease names) keep their checkpoints under the same stored name
//! as their turns, so checkpoint fencing compares against the chat's own grants.

mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::DEFAULT_DEDUP_WINDOW;
use botmesh::{
    Bot, CoordinationConfig, Coordinator, CoordinatorConfig, Flow, MemoryCoordinator, Message,
    Outcome,
};
use crossbeam_channel::unbounded;
use support::transport::Outbox;

#[test]
fn checkpoints_use_the_stored_chat_name() {
    let c = Arc::new(MemoryCoordinator::with_settings(
        Duration::from_secs(3),
        DEFAULT_DEDUP_WINDOW,
    ));
    let (ended_tx, ended) = unbounded();
    let bot = Bot::builder()
        .id("a")
        .coordination(CoordinationConfig::new(CoordinatorConfig::Shared(
            c.clone(),
        )))
        .provider(Arc::new(Outbox::mute()))
        .flow(
            Flow::new("order")
                .keywords(["order"])
                .ask_for("name", "name?")
                .persistent(),
        )
        .on_outcome(move |m: &Message, o: &Outcome| {
            let _ = ended_tx.send((m.chat.clone(), matches!(o, Outcome::Handled { .. })));
        })
        .build()
        .expect("bot");
    let chat = "\0provider:x";
    bot.intake()
        .deliver(Message::new(chat, "order"))
        .expect("deliver");
    let (seen, handled) = ended
        .recv_timeout(Duration::from_secs(20))
        .expect("the message ends");
    assert_eq!((seen.as_str(), handled), (chat, true));
    let stored = format!("\0{chat}");
    assert!(c.read_checkpoint(&stored).expect("read").is_some());
    assert!(c.read_checkpoint(chat).expect("read").is_none());
    bot.shutdown();
}
