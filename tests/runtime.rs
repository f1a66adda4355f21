//! The runtime without a shared backend: local mode, hooks, failures, bad settings.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use botmesh::{
    Bot, CoordinationConfig, CoordinatorConfig, Error, MemoryOptions, Message, Outcome, StartError,
};
use crossbeam_channel::unbounded;

/// Without coordination, a chat's messages still run one at a time and in order.
#[test]
fn local_mode_keeps_order_and_exclusion() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let busy = Arc::new(Mutex::new(std::collections::HashMap::<String, bool>::new()));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let bot = {
        let (log, busy, overlaps) = (log.clone(), busy.clone(), overlaps.clone());
        Bot::builder()
            .workers(4)
            .handler(move |ctx| {
                let chat = ctx.message().chat.clone();
                if busy.lock().unwrap().insert(chat.clone(), true) == Some(true) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                log.lock()
                    .unwrap()
                    .push((chat.clone(), ctx.message().text.clone()));
                std::thread::yield_now();
                busy.lock().unwrap().insert(chat, false);
                Ok(())
            })
            .build()
            .expect("bot")
    };
    for i in 0..500 {
        let chat = format!("c{}", i % 7);
        bot.intake()
            .deliver(Message::new(chat, i.to_string()).with_id(i.to_string()))
            .expect("deliver");
    }
    bot.shutdown();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 500);
    for c in 0..7 {
        let chat = format!("c{c}");
        let seq: Vec<usize> = log
            .iter()
            .filter(|e| e.0 == chat)
            .map(|e| e.1.parse().unwrap())
            .collect();
        assert!(seq.windows(2).all(|w| w[0] < w[1]), "{chat}: {seq:?}");
    }
}

/// A failing or panicking handler is reported once; the worker pool keeps its size.
/// The default replica id names the host and the process, so that bots in containers
/// (often all pid 1) still differ (a breaker's note, session 14).
#[test]
fn the_default_id_names_the_host_and_the_process() {
    let bot = Bot::builder().handler(|_| Ok(())).build().expect("bot");
    let id = bot.id().to_owned();
    bot.shutdown();
    let host: String = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(63)
        .collect();
    let host = if host.is_empty() {
        "host".to_owned()
    } else {
        host
    };
    let expected = format!("replica-{host}-{}-", std::process::id());
    assert!(
        id.starts_with(&expected),
        "{id} should start with {expected}"
    );
}

#[test]
fn handler_failures_are_reported_and_workers_survive() {
    let (err_tx, err_rx) = unbounded();
    let (out_tx, out_rx) = unbounded();
    let bot = Bot::builder()
        .workers(1)
        .handler(|ctx| match ctx.message().text.as_str() {
            "fail" => Err("no such order".into()),
            "panic" => panic!("boom"),
            _ => Ok(()),
        })
        .on_error(move |e| {
            let _ = err_tx.send(e.to_string());
        })
        .on_outcome(move |m, o| {
            let _ = out_tx.send((m.text.clone(), matches!(o, Outcome::Handled { .. })));
        })
        .build()
        .expect("bot");
    for t in ["fail", "panic", "ok"] {
        bot.intake().deliver(Message::new("c", t)).expect("deliver");
    }
    bot.shutdown();
    let errors: Vec<String> = err_rx.try_iter().collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].contains("no such order"));
    assert!(errors[1].contains("boom"));
    let outcomes: Vec<_> = out_rx.try_iter().collect();
    assert_eq!(
        outcomes,
        [
            ("fail".into(), false),
            ("panic".into(), false),
            ("ok".into(), true)
        ]
    );
}

/// Bad settings are refused before anything starts, naming the field and the value.
#[test]
fn bad_settings_are_refused() {
    let no_handler = Bot::builder().build().expect_err("no handler");
    assert!(no_handler.to_string().contains("handler"), "{no_handler}");
    let zero = Bot::builder()
        .workers(0)
        .handler(|_| Ok(()))
        .build()
        .expect_err("0 workers");
    assert!(zero.to_string().contains("workers: 0"), "{zero}");
    let config = CoordinationConfig::new(CoordinatorConfig::Memory(MemoryOptions::default()))
        .with_turn_wait(Duration::ZERO);
    let err = Bot::builder()
        .coordination(config)
        .handler(|_| Ok(()))
        .build()
        .expect_err("zero turn wait");
    assert!(matches!(err, StartError::Config(_)));
    assert!(err.to_string().contains("turnWait"), "{err}");
}

/// After shutdown began, intake refuses with `shutting_down` instead of losing the
/// message; shutdown waits for messages already taken in.
#[test]
fn shutdown_drains_then_refuses() {
    let (out_tx, out_rx) = unbounded();
    let bot = Bot::builder()
        .handler(|_| Ok(()))
        .on_outcome(move |m, _| {
            let _ = out_tx.send(m.text.clone());
        })
        .build()
        .expect("bot");
    let intake = bot.intake();
    for i in 0..100 {
        intake
            .deliver(Message::new("c", i.to_string()))
            .expect("deliver");
    }
    bot.shutdown();
    assert_eq!(out_rx.try_iter().count(), 100);
    let refused = intake
        .deliver(Message::new("c", "late"))
        .expect_err("refused");
    assert_eq!(refused.reason, botmesh::Reason::ShuttingDown);
    let _ = Error::Coordination(refused).to_string();
}

/// A second delivery of a message id while the first one still runs waits for it (it
/// may not run twice) and must still end: once the first was handled, as a duplicate,
/// and counted in `duplicates`, not in `accepted` (it is counted there only if it ends
/// otherwise). `builder` is the bot without its handler and outcome hook.
fn a_duplicate_delivered_while_the_first_runs(builder: botmesh::BotBuilder) {
    let (entered_tx, entered) = unbounded::<()>();
    let (go, go_rx) = unbounded::<()>();
    let (ended_tx, ended) = unbounded::<String>();
    let bot = builder
        .workers(2)
        .handler(move |_ctx| {
            let _ = entered_tx.send(());
            // Bounded, so that a failed assertion below ends the test instead of
            // leaving the bot's stop waiting for this handler.
            let _ = go_rx.recv_timeout(Duration::from_secs(60));
            Ok(())
        })
        .on_outcome(move |_m, outcome| {
            let how = match outcome {
                Outcome::Handled { .. } => "handled",
                Outcome::Duplicate => "duplicate",
                _ => "other",
            };
            let _ = ended_tx.send(how.to_owned());
        })
        .build()
        .expect("bot");
    let first = Message::new("chat", "hi").with_id("m1");
    bot.intake().deliver(first.clone()).expect("first");
    entered.recv().expect("the first runs");
    // While it runs, the same id again: taken in, waiting for the first.
    let second = bot.intake().deliver(first).expect("second");
    assert_eq!(second, botmesh::Accepted::Queued);
    assert_eq!(bot.metrics().accepted, 1, "held back, not counted yet");
    go.send(()).expect("let the first finish");
    // A hang guard, not a speed check: it once never ended in local mode.
    let end = || ended.recv_timeout(Duration::from_secs(60));
    let mut ends = vec![end().expect("first end"), end().expect("second end")];
    ends.sort();
    assert_eq!(ends, ["duplicate", "handled"]);
    let m = bot.metrics();
    assert_eq!((m.accepted, m.handled, m.duplicates), (1, 1, 1), "{m:?}");
    assert_eq!(m.tickets_waiting, 0, "{m:?}");
    bot.shutdown();
}

/// Without coordination there is no renewal thread: the timer asks again about the
/// held-back delivery. It once waited forever, and the bot's stop with it.
#[test]
fn local_mode_ends_a_duplicate_delivered_while_the_first_runs() {
    a_duplicate_delivered_while_the_first_runs(Bot::builder());
}

/// With a shared backend the renewal thread asks again about the held-back delivery.
#[test]
fn a_duplicate_delivered_while_the_first_runs_is_not_counted_as_accepted() {
    let coordinator = Arc::new(botmesh::MemoryCoordinator::with_settings(
        Duration::from_millis(300),
        Duration::from_secs(600),
    ));
    let shared = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator));
    a_duplicate_delivered_while_the_first_runs(Bot::builder().id("r1").coordination(shared));
}
