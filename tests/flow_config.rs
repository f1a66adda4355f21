//! Flows refused at `build`, each with an error naming the flow (or setting) and the
//! value at fault; and routing rules that need no backend.

mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::{Bot, Capture, CoordinationConfig, CoordinatorConfig, Flow, Message, StartError};
use support::transport::Outbox;

fn build(flows: Vec<Flow>, config: Option<CoordinationConfig>) -> Result<Bot, StartError> {
    let mut b = Bot::builder().provider(Arc::new(Outbox::mute()));
    if let Some(c) = config {
        b = b.coordination(c);
    }
    for f in flows {
        b = b.flow(f);
    }
    b.build()
}

fn refused(flows: Vec<Flow>, config: Option<CoordinationConfig>, needle: &str) {
    match build(flows, config) {
        Ok(bot) => {
            bot.shutdown();
            panic!("expected a refusal mentioning {needle:?}");
        }
        Err(e) => assert!(e.to_string().contains(needle), "{e}"),
    }
}

#[test]
fn bad_flows_are_refused_with_the_flow_named() {
    refused(vec![Flow::new("")], None, "flow name \"\" is empty");
    refused(
        vec![Flow::new("a"), Flow::new("a")],
        None,
        "\"a\" is used by two flows",
    );
    refused(
        vec![Flow::new("a").goto("nope")],
        None,
        "flow \"a\" step 0 (goto): no flow named \"nope\"",
    );
    refused(
        vec![
            Flow::new("a").answer("x").goto("b"),
            Flow::new("b").goto("a"),
        ],
        None,
        "a -> b -> a",
    );
    refused(
        vec![Flow::new("k").keywords(["ok", "!!!"])],
        None,
        "keyword \"!!!\"",
    );
    refused(
        vec![Flow::new("k").keywords(Vec::<String>::new())],
        None,
        "keywords([]) is empty",
    );
    // A wait breaks a goto cycle: that is a loop the user drives, and fine.
    build(
        vec![
            Flow::new("a").ask_for("x", "x?").goto("b"),
            Flow::new("b").goto("a"),
        ],
        None,
    )
    .expect("a loop with a wait")
    .shutdown();
}

#[test]
fn settings_that_would_break_flows_are_refused() {
    let memory = || CoordinationConfig::new(CoordinatorConfig::memory());
    refused(
        vec![Flow::new("a").answer("x")],
        Some(memory().with_settle(Duration::ZERO)),
        "settleMs: 0",
    );
    refused(
        vec![Flow::new("r").delay(Duration::from_secs(7200)).answer("x")],
        Some(memory()),
        "flow \"r\" step 0 (delay 2h)",
    );
    // Persistent, the long delay is carried by the checkpoint.
    build(
        vec![
            Flow::new("r")
                .persistent()
                .delay(Duration::from_secs(7200))
                .answer("x"),
        ],
        Some(memory()),
    )
    .expect("persistent long delay")
    .shutdown();
    match Bot::builder().flow(Flow::new("a").answer("x")).build() {
        Err(e) => assert!(e.to_string().contains("provider: missing"), "{e}"),
        Ok(b) => {
            b.shutdown();
            panic!("a bot with flows and no provider was built")
        }
    }
}

/// Keyword flows win over a catch-all registered before them; `Capture::End` ends
/// the conversation so the next message is free again.
#[test]
fn keywords_before_catch_all_and_capture_end() {
    let (sent_tx, sent) = crossbeam_channel::unbounded();
    let (tx, rx) = crossbeam_channel::unbounded();
    let bot = Bot::builder()
        .workers(1)
        .provider(Arc::new(Outbox::new("a", sent_tx)))
        .flow(Flow::new("any").catch_all().answer("fallback"))
        .flow(
            Flow::new("form")
                .keywords(["form"])
                .ask("name?", |a| {
                    if a.text() == "cancel" {
                        Capture::End
                    } else {
                        Capture::Next
                    }
                })
                .answer("thanks"),
        )
        .on_outcome(move |_, _| {
            let _ = tx.send(());
        })
        .build()
        .expect("bot");
    for text in ["form", "cancel", "hello"] {
        bot.intake().deliver(Message::new("c", text)).expect("in");
        rx.recv_timeout(Duration::from_secs(20)).expect("ended");
    }
    bot.shutdown();
    let sent: Vec<String> = sent.try_iter().map(|(_, _, text)| text).collect();
    assert_eq!(sent, ["name?", "fallback"]);
}

/// A bot fed through its intake (a webhook endpoint of its own) builds flows with a
/// sender and no provider: answers and prompts (keyboards included) reach the sender,
/// fenced by the turn.
#[test]
fn flows_build_with_a_sender_and_no_provider() {
    let (sent_tx, sent) = crossbeam_channel::unbounded();
    let (tx, rx) = crossbeam_channel::unbounded();
    let size = botmesh::Reply::new("size?").with_keyboard(botmesh::Keyboard::reply([["S", "M"]]));
    let bot = Bot::builder()
        .workers(1)
        .sender(move |chat, reply, fence| {
            assert!(fence.is_live() && fence.token().is_some());
            let _ = sent_tx.send((chat.to_owned(), reply.clone()));
            Ok(())
        })
        .flow(
            Flow::new("order")
                .keywords(["order"])
                .ask_for("size", size)
                .answer("ok"),
        )
        .on_outcome(move |_, _| {
            let _ = tx.send(());
        })
        .build()
        .expect("flows with a sender build");
    for text in ["order", "M"] {
        bot.intake().deliver(Message::new("c", text)).expect("in");
        rx.recv_timeout(Duration::from_secs(20)).expect("ended");
    }
    bot.shutdown();
    let sent: Vec<(String, botmesh::Reply)> = sent.try_iter().collect();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        (sent[0].0.as_str(), sent[0].1.text.as_str()),
        ("c", "size?")
    );
    assert!(sent[0].1.keyboard.is_some());
    assert_eq!(sent[1].1.text, "ok");
    // Neither a provider nor a sender: still refused, naming both ways out.
    match Bot::builder().flow(Flow::new("a").answer("x")).build() {
        Err(e) => assert!(e.to_string().contains(".sender("), "{e}"),
        Ok(b) => {
            b.shutdown();
            panic!("a bot with flows and nothing to send with was built")
        }
    }
}
