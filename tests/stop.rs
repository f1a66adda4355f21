//! `Bot::stop(&self)`: from any thread and through an `Arc`, idempotent (also when
//! called from two threads at once), and refused from the bot's own handler, hook and
//! provider callback instead of waiting for itself. Events are ordered with channels
//! and barriers, never sleeps.

use std::sync::{Arc, Barrier, Mutex, OnceLock, Weak};
use std::time::Duration;

use botmesh::{
    Bot, Capabilities, CoordinationConfig, CoordinatorConfig, MemoryCoordinator, Message, Outcome,
    Provider, ProviderError, Reason, Session, Status,
};
use crossbeam_channel::{Sender, bounded, unbounded};

const WAIT: Duration = Duration::from_secs(10);

fn coordination() -> CoordinationConfig {
    CoordinationConfig::new(CoordinatorConfig::Shared(
        Arc::new(MemoryCoordinator::new()),
    ))
}

#[test]
fn stop_through_an_arc_from_two_threads_at_once_stops_once_and_runs_everything() {
    let (handled_tx, handled_rx) = unbounded();
    let (release_tx, release_rx) = bounded::<()>(0);
    let bot = Arc::new(
        Bot::builder()
            .id("r1")
            .coordination(coordination())
            .handler(move |ctx| {
                if ctx.message().text == "slow" {
                    // Held until both stops are under way.
                    let _ = release_rx.recv_timeout(WAIT);
                }
                Ok(())
            })
            .on_outcome(move |m, o| {
                let _ = handled_tx.send((m.text.clone(), matches!(o, Outcome::Handled { .. })));
            })
            .build()
            .expect("bot"),
    );
    bot.intake()
        .deliver(Message::new("c", "slow").with_id("1"))
        .expect("deliver");
    let start = Arc::new(Barrier::new(3));
    let stoppers: Vec<_> = (0..2)
        .map(|_| {
            let (bot, start) = (bot.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                bot.stop()
            })
        })
        .collect();
    start.wait();
    // Intake closes once a stop began: wait for that, then let the handler finish.
    while bot.intake().deliver(Message::new("c", "late")).is_ok() {
        std::thread::yield_now();
    }
    let e = bot
        .intake()
        .deliver(Message::new("c", "late"))
        .expect_err("closed");
    assert_eq!(e.reason, Reason::ShuttingDown);
    release_tx.send(()).expect("release the handler");
    for s in stoppers {
        s.join()
            .expect("stopper")
            .expect("stop is Ok on both threads");
    }
    // Everything taken in ended; "late" ones were either handled before the close or
    // refused.
    let ended: Vec<(String, bool)> = handled_rx.try_iter().collect();
    assert!(ended.contains(&("slow".to_owned(), true)), "{ended:?}");
    assert!(ended.iter().all(|(_, handled)| *handled), "{ended:?}");
    assert_eq!(bot.in_flight(), 0);
    // Again, and the drop of the last Arc: nothing more happens.
    bot.stop().expect("idempotent");
    drop(bot);
}

#[test]
fn stop_from_the_handler_and_the_hooks_is_refused_not_a_deadlock() {
    let me: Arc<OnceLock<Weak<Bot>>> = Arc::new(OnceLock::new());
    let (tx, rx) = unbounded::<(&'static str, String)>();
    let try_stop = {
        let me = me.clone();
        move |at: &'static str, tx: &Sender<(&'static str, String)>| {
            if let Some(bot) = me.get().and_then(Weak::upgrade) {
                let r = bot.stop().map_err(|e| e.to_string());
                let _ = tx.send((at, r.err().unwrap_or_else(|| "stopped!".into())));
            }
        }
    };
    let (h, o) = (try_stop.clone(), try_stop);
    let (htx, otx) = (tx.clone(), tx);
    let bot = Arc::new(
        Bot::builder()
            .id("self-stopper")
            .coordination(coordination())
            .handler(move |_| {
                h("handler", &htx);
                Ok(())
            })
            .on_outcome(move |_, _| o("outcome", &otx))
            .build()
            .expect("bot"),
    );
    me.set(Arc::downgrade(&bot)).expect("set once");
    bot.intake()
        .deliver(Message::new("c", "x").with_id("1"))
        .expect("deliver");
    for _ in 0..2 {
        let (at, text) = rx.recv_timeout(WAIT).expect("a stop attempt");
        assert_eq!(
            text,
            "Bot::stop of replica \"self-stopper\" called from the bot's own handler, hook or \
             provider callback: it would wait for itself; stop the bot from another thread",
            "{at}"
        );
    }
    // Still running: it takes the next message.
    bot.intake()
        .deliver(Message::new("c", "y").with_id("2"))
        .expect("still running");
    rx.recv_timeout(WAIT).expect("handler of y");
    rx.recv_timeout(WAIT).expect("outcome of y");
    bot.stop().expect("from the test thread");
    assert_eq!(bot.metrics().handled, 2);
}

/// An exclusive transport whose `start` (on the leadership thread) tries to stop the bot.
struct SelfStopping {
    bot: Arc<OnceLock<Weak<Bot>>>,
    bot_ready: crossbeam_channel::Receiver<()>,
    result: Mutex<Option<Sender<String>>>,
}

impl Provider for SelfStopping {
    fn id(&self) -> &str {
        "exclusive"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exclusive_session: true,
        }
    }
    fn start(&self, session: Session) -> Result<(), ProviderError> {
        let _ = self.bot_ready.recv_timeout(WAIT);
        let text = match self.bot.get().and_then(Weak::upgrade) {
            Some(bot) => match bot.stop() {
                Ok(()) => "stopped!".to_owned(),
                Err(e) => e.to_string(),
            },
            None => "no bot".to_owned(),
        };
        if let Some(tx) = self.result.lock().expect("lock").take() {
            let _ = tx.send(text);
        }
        session.status().report(Status::Open);
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, _: &str, _: &str) -> Result<(), ProviderError> {
        Ok(())
    }
}

#[test]
fn stop_from_a_provider_start_on_the_leadership_thread_is_refused() {
    let cell: Arc<OnceLock<Weak<Bot>>> = Arc::new(OnceLock::new());
    let (ready_tx, ready_rx) = bounded(1);
    let (result_tx, result_rx) = bounded(1);
    let provider = Arc::new(SelfStopping {
        bot: cell.clone(),
        bot_ready: ready_rx,
        result: Mutex::new(Some(result_tx)),
    });
    let bot = Arc::new(
        Bot::builder()
            .id("leader")
            .coordination(coordination())
            .provider(provider)
            .handler(|_| Ok(()))
            .build()
            .expect("bot"),
    );
    cell.set(Arc::downgrade(&bot)).expect("set");
    ready_tx.send(()).expect("ready");
    let text = result_rx.recv_timeout(WAIT).expect("start ran");
    assert!(
        text.starts_with("Bot::stop of replica \"leader\" called from"),
        "{text}"
    );
    // The leadership thread holds no Arc (it had a Weak): this stop ends it.
    bot.stop().expect("stop");
    assert_eq!(bot.leader_token("exclusive"), None);
}

#[test]
fn shutdown_and_drop_still_stop_cleanly() {
    let c = Arc::new(MemoryCoordinator::new());
    let make = |id: &str| {
        Bot::builder()
            .id(id)
            .coordination(CoordinationConfig::new(CoordinatorConfig::Shared(
                c.clone(),
            )))
            .handler(|_| Ok(()))
            .build()
            .expect("bot")
    };
    let a = make("a");
    a.intake().deliver(Message::new("c", "1")).expect("deliver");
    a.shutdown();
    let b = make("b");
    b.intake().deliver(Message::new("c", "2")).expect("deliver");
    drop(b);
    // Both released everything: the chat is idle, and the ids can be used again.
    assert_eq!(c.active_chats(), 0);
    make("a").stop().expect("stop");
}
