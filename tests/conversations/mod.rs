//! Conversations across replicas (SPEC §4, §5): settle, checkpoints and handover,
//! written once and run against every backend (`flows_memory.rs`, `flows_redis.rs`,
//! which also declare `mod support;`: the tests hold `support::serial`).
//!
//! Replicas are bots in this process sharing one coordinator; a crash is
//! `Bot::abort`. Events are ordered with channels; where the contract is about time
//! (`settle` running out, a delay) the tests wait for the event with a generous bound.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use botmesh::{
    Bot, Capture, CoordinationConfig, Coordinator, CoordinatorConfig, FallbackPolicy, Flow,
    FlowsPolicy, HandoverConfig, Message, Outcome,
};
use crossbeam_channel::{Receiver, Sender, unbounded};

use crate::support::transport::Outbox;

/// A backend under test.
pub trait Backend: Sized + 'static {
    /// A fresh, empty backend whose leases have this TTL.
    fn start(ttl: Duration) -> Self;
    /// The coordinator the replicas of one test share.
    fn coordinator(&self) -> Arc<dyn Coordinator>;
}

const RECV: Duration = Duration::from_secs(20);
const TTL: Duration = Duration::from_secs(2);

fn recv<T>(rx: &Receiver<T>, what: &str) -> T {
    rx.recv_timeout(RECV)
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// What the replicas of one test share: their sends and outcomes, in order.
struct World {
    coordinator: Arc<dyn Coordinator>,
    sent_tx: Sender<(String, String, String)>,
    sent: Receiver<(String, String, String)>,
    ended_tx: Sender<(String, String, String)>,
    /// (replica, message text, outcome kind) for every message that ended.
    ended: Receiver<(String, String, String)>,
    handled_tx: Sender<(String, String)>,
    /// (replica, text) of every message that reached the plain handler.
    handled: Receiver<(String, String)>,
    /// A handler given the text "probe" reports here, then waits for the gate.
    probe_in_tx: Sender<()>,
    probe_in: Receiver<()>,
    probe_gate_tx: Sender<()>,
    probe_gate: Receiver<()>,
}

impl World {
    fn new(b: &impl Backend) -> Self {
        let (sent_tx, sent) = unbounded();
        let (ended_tx, ended) = unbounded();
        let (handled_tx, handled) = unbounded();
        let (probe_in_tx, probe_in) = unbounded();
        let (probe_gate_tx, probe_gate) = unbounded();
        World {
            probe_in_tx,
            probe_in,
            probe_gate_tx,
            probe_gate,
            coordinator: b.coordinator(),
            sent_tx,
            sent,
            ended_tx,
            ended,
            handled_tx,
            handled,
        }
    }

    fn config(&self) -> CoordinationConfig {
        CoordinationConfig::new(CoordinatorConfig::Shared(self.coordinator.clone()))
    }

    fn bot(&self, id: &str, workers: usize, config: CoordinationConfig, flows: Vec<Flow>) -> Bot {
        let ended = self.ended_tx.clone();
        let handled = self.handled_tx.clone();
        let (probe_in, probe_gate) = (self.probe_in_tx.clone(), self.probe_gate.clone());
        let (me, me2) = (id.to_owned(), id.to_owned());
        let mut b = Bot::builder()
            .id(id)
            .workers(workers)
            .coordination(config)
            .provider(Arc::new(Outbox::new(id, self.sent_tx.clone())))
            .handler(move |ctx| {
                if ctx.message().text == "probe" {
                    let _ = probe_in.send(());
                    let _ = probe_gate.recv_timeout(RECV);
                }
                let _ = handled.send((me2.clone(), ctx.message().text.clone()));
                Ok(())
            })
            .on_outcome(move |m: &Message, o: &Outcome| {
                let kind = match o {
                    Outcome::Handled { .. } => "handled",
                    Outcome::Failed(_) => "failed",
                    Outcome::Dropped(_) => "dropped",
                    Outcome::Duplicate => "duplicate",
                    _ => "unknown",
                };
                let _ = ended.send((me.clone(), m.text.clone(), kind.to_owned()));
            });
        for f in flows {
            b = b.flow(f);
        }
        b.build().expect("bot starts")
    }

    /// Delivers `text` on `chat` to `bot` and waits until it ended; returns its
    /// outcome kind.
    fn say(&self, bot: &Bot, chat: &str, text: &str) -> String {
        bot.intake()
            .deliver(Message::new(chat, text))
            .expect("accepted");
        let (_, t, kind) = recv(&self.ended, &format!("the end of {text:?}"));
        assert_eq!(t, text, "messages end in order");
        kind
    }

    /// The next send: (replica, text).
    fn next_sent(&self) -> (String, String) {
        let (r, _, t) = recv(&self.sent, "a send");
        (r, t)
    }

    fn no_more_sent(&self) {
        if let Ok(s) = self.sent.try_recv() {
            panic!("unexpected send {s:?}");
        }
    }
}

fn order_form(persistent: bool) -> Flow {
    let f = Flow::new("order")
        .keywords(["order"])
        .ask_for("name", "name?")
        .ask_for("address", "address?")
        .ask("confirm?", |a| match a.text() {
            "yes" => Capture::Next,
            _ => Capture::Retry("yes or no?".into()),
        })
        .action(|step| {
            let s = step.state();
            let text = format!(
                "done {} {}",
                s["name"].as_str().unwrap_or("-"),
                s["address"].as_str().unwrap_or("-")
            );
            step.send(&text)?;
            Ok(())
        });
    if persistent { f.persistent() } else { f }
}

fn quiz() -> Flow {
    Flow::new("quiz")
        .keywords(["quiz"])
        .ask_for("a", "a?")
        .ask_for("b", "b?")
        .action(|step| {
            let s = step.state();
            let text = format!(
                "got {} {}",
                s["a"].as_str().unwrap_or("-"),
                s["b"].as_str().unwrap_or("-")
            );
            step.send(&text)?;
            Ok(())
        })
}

/// After a message answers an ask, the turn stays held while the next steps run (a
/// 200 ms action), and the chat's next message, even on another replica, waits.
pub fn settle_holds_the_turn<B: Backend>() {
    let b = B::start(TTL);
    let w = World::new(&b);
    let (ev_tx, ev) = unbounded::<&'static str>();
    let mk = |ev_tx: Sender<&'static str>| {
        let ev2 = ev_tx.clone();
        Flow::new("slow")
            .keywords(["slow"])
            .persistent()
            .ask_for("x", "x?")
            .action(move |step| {
                let _ = ev_tx.send("action start");
                step.sleep(Duration::from_millis(200))?;
                let _ = ev_tx.send("action end");
                Ok(())
            })
            .ask("y?", move |_| {
                let _ = ev2.send("y captured");
                Capture::Next
            })
    };
    let config = w.config().with_settle(Duration::from_secs(10));
    let a = w.bot("settle-a", 2, config.clone(), vec![mk(ev_tx.clone())]);
    let c = w.bot("settle-b", 2, config, vec![mk(ev_tx)]);
    assert_eq!(w.say(&a, "chat", "slow"), "handled");
    assert_eq!(w.next_sent(), ("settle-a".into(), "x?".into()));
    a.intake().deliver(Message::new("chat", "1")).expect("x");
    assert_eq!(recv(&ev, "action start"), "action start");
    // The action is running under the turn: the chat's next message waits for it.
    c.intake().deliver(Message::new("chat", "2")).expect("y");
    assert_eq!(recv(&ev, "action end"), "action end");
    assert_eq!(recv(&ev, "capture"), "y captured");
    assert_eq!(w.next_sent().1, "y?");
    for _ in 0..2 {
        assert_eq!(recv(&w.ended, "ends").2, "handled");
    }
    a.shutdown();
    c.shutdown();
}

/// An action longer than `settle` is stopped at `settle`: its flag is set, its sleep
/// wakes, its later sends and state changes are refused, the turn is released, the
/// pool keeps its size although the action ignores the flag, and the chat's next
/// message runs the stopped step again.
pub fn settle_stops_a_long_step<B: Backend>() {
    let b = B::start(TTL);
    let w = World::new(&b);
    let runs = Arc::new(AtomicUsize::new(0));
    let (gate_tx, gate) = unbounded::<()>();
    let (ev_tx, ev) = unbounded::<String>();
    let stubborn = {
        let (runs, ev_tx) = (runs.clone(), ev_tx.clone());
        Flow::new("stubborn")
            .keywords(["stubborn"])
            .persistent()
            .action(move |step| {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = ev_tx.send(format!("run {n}"));
                if n == 1 {
                    // Ignores cancellation until the test lets it go.
                    let _ = gate.recv();
                    let cancelled = step.is_cancelled();
                    let send = step.send("late").is_err();
                    step.set("touched", true);
                    let _ = ev_tx.send(format!("after: cancelled={cancelled} send_refused={send}"));
                } else {
                    let touched = step.state().contains_key("touched");
                    let _ = ev_tx.send(format!("rerun sees touched={touched}"));
                }
                Ok(())
            })
            .answer("stubborn done")
    };
    let sleepy = {
        let ev_tx = ev_tx.clone();
        Flow::new("sleepy")
            .keywords(["sleepy"])
            .action(move |step| {
                let t = Instant::now();
                let r = step.sleep(Duration::from_secs(30));
                let _ = ev_tx.send(format!(
                    "sleep woke cancelled={} early={}",
                    r.is_err(),
                    t.elapsed() < Duration::from_secs(20)
                ));
                Ok(())
            })
    };
    let config = w.config().with_settle(Duration::from_millis(300));
    let bot = w.bot("cut", 2, config, vec![stubborn, sleepy]);
    let intake = bot.intake();
    intake.deliver(Message::new("s", "stubborn")).expect("in");
    assert_eq!(recv(&ev, "run 1"), "run 1");
    // settle cuts it: the message ends and the turn is released.
    assert_eq!(recv(&w.ended, "the cut message's end").2, "handled");
    // The checkpoint stays at the stopped step.
    let (_, data) = w
        .coordinator
        .read_checkpoint("s")
        .expect("read")
        .expect("a checkpoint");
    assert!(data.contains("\"step\":0"), "{data}");
    // Two workers are still free although one thread is stuck: two handlers on two
    // chats that each wait for the test both get in.
    intake.deliver(Message::new("p1", "probe")).expect("in");
    intake.deliver(Message::new("p2", "probe")).expect("in");
    recv(&w.probe_in, "the first probe");
    recv(&w.probe_in, "the second probe (a second free worker)");
    w.probe_gate_tx.send(()).expect("gate");
    w.probe_gate_tx.send(()).expect("gate");
    for _ in 0..2 {
        assert_eq!(recv(&w.ended, "the probes' ends").2, "handled");
    }
    // The sleeping action wakes at settle.
    intake.deliver(Message::new("z", "sleepy")).expect("in");
    assert_eq!(
        recv(&ev, "sleep result"),
        "sleep woke cancelled=true early=true"
    );
    assert_eq!(recv(&w.ended, "sleepy's end").2, "handled");
    // The stubborn action ends now: everything it tried after the cut was refused.
    gate_tx.send(()).expect("gate");
    assert_eq!(
        recv(&ev, "after"),
        "after: cancelled=true send_refused=true"
    );
    // ... and its state change was not written: the checkpoint is as before the step.
    let (_, data) = w
        .coordinator
        .read_checkpoint("s")
        .expect("read")
        .expect("a checkpoint");
    assert!(
        data.contains("\"step\":0") && !data.contains("touched"),
        "{data}"
    );
    // The chat's next message runs the stopped step again, from the saved state.
    intake.deliver(Message::new("s", "again")).expect("in");
    assert_eq!(recv(&ev, "run 2"), "run 2");
    assert_eq!(recv(&ev, "rerun"), "rerun sees touched=false");
    assert_eq!(w.next_sent().1, "stubborn done");
    assert_eq!(recv(&w.ended, "again's end").2, "handled");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(bot.metrics().steps_stopped >= 2);
    bot.shutdown();
}

/// A 10 s delay inside a conversation holds no worker: with one worker, other chats
/// flow meanwhile.
pub fn delay_holds_no_worker<B: Backend>() {
    let b = B::start(TTL);
    let w = World::new(&b);
    let remind = Flow::new("remind")
        .keywords(["remind"])
        .answer("soon")
        .delay(Duration::from_secs(10))
        .answer("reminder");
    let bot = w.bot("delay", 1, w.config(), vec![remind]);
    assert_eq!(w.say(&bot, "r", "remind"), "handled");
    assert_eq!(w.next_sent().1, "soon");
    for i in 0..20 {
        assert_eq!(w.say(&bot, &format!("other-{i}"), "hello"), "handled");
    }
    w.no_more_sent();
    bot.shutdown();
}

/// A: mid-way through a persistent form (waiting at its third question), crashes.
/// The chat's next message goes to B, which continues at that question with the
/// answers so far.
pub fn persistent_form_survives_a_crash<B: Backend>() {
    let b = B::start(TTL);
    let w = World::new(&b);
    let a = w.bot("form-a", 2, w.config(), vec![order_form(true)]);
    let c = w.bot("form-b", 2, w.config(), vec![order_form(true)]);
    for (text, prompt) in [
        ("order", "name?"),
        ("Ann", "address?"),
        ("Main St", "confirm?"),
    ] {
        assert_eq!(w.say(&a, "form", text), "handled");
        assert_eq!(w.next_sent(), ("form-a".into(), prompt.into()));
    }
    a.abort();
    assert_eq!(w.say(&c, "form", "maybe"), "handled");
    assert_eq!(w.next_sent(), ("form-b".into(), "yes or no?".into()));
    assert_eq!(w.say(&c, "form", "yes"), "handled");
    assert_eq!(w.next_sent(), ("form-b".into(), "done Ann Main St".into()));
    assert_eq!(c.metrics().conversations_resumed, 1);
    assert!(
        w.handled.try_recv().is_err(),
        "no message fell through to the handler"
    );
    c.shutdown();
}

/// A flow that is not persistent ends when another replica takes the chat under
/// `flows: drop`, and continues there under `flows: resume`.
pub fn non_persistent_flows_follow_the_policy<B: Backend>() {
    for policy in [FlowsPolicy::Drop, FlowsPolicy::Resume] {
        let b = B::start(TTL);
        let w = World::new(&b);
        let config = w.config().with_handover(HandoverConfig {
            flows: policy,
            fallback: FallbackPolicy::Drop,
        });
        let a = w.bot("np-a", 2, config.clone(), vec![quiz()]);
        let c = w.bot("np-b", 2, config, vec![quiz()]);
        assert_eq!(w.say(&a, "q", "quiz"), "handled");
        assert_eq!(w.say(&a, "q", "1"), "handled");
        assert_eq!(w.next_sent().1, "a?");
        assert_eq!(w.next_sent().1, "b?");
        a.abort();
        assert_eq!(w.say(&c, "q", "2"), "handled");
        match policy {
            FlowsPolicy::Drop => {
                assert_eq!(recv(&w.handled, "the handler"), ("np-b".into(), "2".into()));
                w.no_more_sent();
            }
            FlowsPolicy::Resume => {
                assert_eq!(w.next_sent(), ("np-b".into(), "got 1 2".into()));
                assert!(w.handled.try_recv().is_err());
            }
        }
        c.shutdown();
    }
}

/// When B cannot resume a checkpoint (its flow is not registered on B, its version
/// differs, it does not parse): `fallback: drop` ends it (the message goes to the
/// handler), `fallback: restart` starts the flow again from its first step.
pub fn unresumable_checkpoints_follow_the_fallback<B: Backend>() {
    let cases: [(&str, FallbackPolicy, &str); 6] = [
        ("unregistered", FallbackPolicy::Drop, "handler"),
        ("unregistered", FallbackPolicy::Restart, "handler"),
        ("version", FallbackPolicy::Drop, "handler"),
        ("version", FallbackPolicy::Restart, "restart"),
        ("garbage", FallbackPolicy::Drop, "handler"),
        ("format", FallbackPolicy::Restart, "restart"),
    ];
    for (case, fallback, expect) in cases {
        let b = B::start(TTL);
        let w = World::new(&b);
        let config = w.config().with_handover(HandoverConfig {
            flows: FlowsPolicy::Drop,
            fallback,
        });
        let a = w.bot("fb-a", 2, config.clone(), vec![order_form(true)]);
        assert_eq!(w.say(&a, "f", "order"), "handled");
        assert_eq!(w.say(&a, "f", "Ann"), "handled");
        a.shutdown();
        let _ = (w.next_sent(), w.next_sent());
        let flows_on_b = match case {
            "unregistered" => vec![quiz()],
            "version" => vec![order_form(true).version(2)],
            _ => vec![order_form(true)],
        };
        if case == "garbage" || case == "format" {
            // Written under a fresh turn so the fenced write is accepted.
            let r = botmesh::Replica::start("fb-writer", w.coordinator.clone()).expect("writer");
            let t = r.acquire_timeout("f", RECV).expect("turn");
            let data = if case == "garbage" {
                "{not json".to_owned()
            } else {
                r#"{"format":99,"flow":"order","step":1}"#.to_owned()
            };
            assert!(
                w.coordinator
                    .write_checkpoint("f", t.fencing_token(), Some(&data))
                    .expect("write")
            );
            t.release().expect("release");
            r.shutdown();
        }
        let c = w.bot("fb-b", 2, config, flows_on_b);
        assert_eq!(w.say(&c, "f", "Main St"), "handled", "{case} {fallback:?}");
        match expect {
            "handler" => {
                assert_eq!(
                    recv(&w.handled, "the handler").1,
                    "Main St",
                    "{case} {fallback:?}"
                );
                w.no_more_sent();
                assert_eq!(c.metrics().conversations_dropped, 1, "{case} {fallback:?}");
                // Dropped means deleted: the next message does not try again.
                assert_eq!(w.coordinator.read_checkpoint("f").expect("read"), None);
            }
            _ => {
                assert_eq!(w.next_sent().1, "name?", "{case} {fallback:?}");
                assert_eq!(
                    c.metrics().conversations_restarted,
                    1,
                    "{case} {fallback:?}"
                );
            }
        }
        c.shutdown();
    }
}

/// A replica whose in-memory conversation went stale (B handled the chat since)
/// never continues it: it reads the checkpoint B wrote; with a flow that is not
/// checkpointed it drops it.
pub fn stale_conversation_is_never_continued<B: Backend>() {
    // Persistent: A continues from B's checkpoint, not from its own memory.
    let b = B::start(TTL);
    let w = World::new(&b);
    let a = w.bot("st-a", 2, w.config(), vec![order_form(true)]);
    let c = w.bot("st-b", 2, w.config(), vec![order_form(true)]);
    assert_eq!(w.say(&a, "s", "order"), "handled"); // A: name?
    assert_eq!(w.say(&c, "s", "Ann"), "handled"); // B: address?
    assert_eq!(w.say(&a, "s", "Main St"), "handled"); // A must answer address?, not name?
    let sent: Vec<(String, String)> = (0..3).map(|_| w.next_sent()).collect();
    assert_eq!(
        sent,
        vec![
            ("st-a".to_owned(), "name?".to_owned()),
            ("st-b".to_owned(), "address?".to_owned()),
            ("st-a".to_owned(), "confirm?".to_owned())
        ]
    );
    assert_eq!(w.say(&a, "s", "yes"), "handled");
    assert_eq!(w.next_sent().1, "done Ann Main St");
    assert!(a.metrics().conversations_stale >= 1);
    a.shutdown();
    c.shutdown();

    // Not checkpointed (flows: drop): A's copy is stale once B handled the chat.
    let b = B::start(TTL);
    let w = World::new(&b);
    let a = w.bot("st2-a", 2, w.config(), vec![quiz()]);
    let c = w.bot("st2-b", 2, w.config(), vec![quiz()]);
    assert_eq!(w.say(&a, "s", "quiz"), "handled"); // A: a?
    assert_eq!(w.say(&c, "s", "hello"), "handled"); // B: no conversation, handler
    assert_eq!(w.say(&a, "s", "1"), "handled"); // A: stale quiz dropped, handler
    assert_eq!(w.next_sent().1, "a?");
    w.no_more_sent();
    assert_eq!(
        recv(&w.handled, "B's handler"),
        ("st2-b".into(), "hello".into())
    );
    assert_eq!(
        recv(&w.handled, "A's handler"),
        ("st2-a".into(), "1".into())
    );
    a.shutdown();
    c.shutdown();
}

/// A user answering at once, on another replica, reads the state the previous turn
/// wrote: each message is delivered as soon as the previous one was accepted.
pub fn quick_answers_read_the_previous_state<B: Backend>() {
    let b = B::start(TTL);
    let w = World::new(&b);
    let a = w.bot("qa-a", 2, w.config(), vec![order_form(true)]);
    let c = w.bot("qa-b", 2, w.config(), vec![order_form(true)]);
    let bots = [&a, &c, &a, &c];
    for (bot, text) in bots.iter().zip(["order", "Ann", "Main St", "yes"]) {
        bot.intake()
            .deliver(Message::new("quick", text))
            .expect("accepted");
    }
    for _ in 0..4 {
        assert_eq!(recv(&w.ended, "an end").2, "handled");
    }
    let texts: Vec<String> = (0..4).map(|_| w.next_sent().1).collect();
    assert_eq!(texts, ["name?", "address?", "confirm?", "done Ann Main St"]);
    a.shutdown();
    c.shutdown();
}

/// A timed step (a reminder after a delay) runs under the chat's turn: never beside
/// a message handler of the same chat.
pub fn timed_step_runs_under_the_turn<B: Backend>() {
    let b = B::start(TTL);
    let w = World::new(&b);
    let (ev_tx, ev) = unbounded::<&'static str>();
    let (gate_tx, gate) = unbounded::<()>();
    let remind = {
        let ev_tx = ev_tx.clone();
        Flow::new("remind")
            .keywords(["remind"])
            .delay(Duration::from_millis(200))
            .action(move |step| {
                let _ = ev_tx.send("reminder runs");
                step.send("reminder")?;
                Ok(())
            })
    };
    let bot = Bot::builder()
        .id("timed")
        .workers(2)
        .coordination(w.config())
        .provider(Arc::new(Outbox::new("timed", w.sent_tx.clone())))
        .flow(remind)
        .handler(move |_| {
            let _ = ev_tx.send("handler starts");
            let _ = gate.recv_timeout(RECV);
            let _ = ev_tx.send("handler ends");
            Ok(())
        })
        .build()
        .expect("bot");
    bot.intake()
        .deliver(Message::new("t", "remind"))
        .expect("in");
    bot.intake().deliver(Message::new("t", "busy")).expect("in");
    assert_eq!(recv(&ev, "handler start"), "handler starts");
    // The delay runs out while the handler holds the turn: the wake-up queues for it.
    let t0 = Instant::now();
    while bot.metrics().tickets_waiting == 0 {
        assert!(t0.elapsed() < RECV, "the wake-up never queued");
        std::thread::yield_now();
    }
    gate_tx.send(()).expect("gate");
    assert_eq!(recv(&ev, "handler end"), "handler ends");
    assert_eq!(recv(&ev, "reminder"), "reminder runs");
    bot.shutdown();
}

/// A delay's next steps run when it ends (the reminder is sent), under a turn.
pub fn delay_runs_the_next_steps<B: Backend>() {
    let b = B::start(TTL);
    let w = World::new(&b);
    let remind = Flow::new("remind")
        .keywords(["remind"])
        .persistent()
        .answer("soon")
        .delay(Duration::from_millis(100))
        .answer("reminder")
        .ask_for("reply", "still there?");
    let bot = w.bot("wake", 1, w.config(), vec![remind]);
    assert_eq!(w.say(&bot, "d", "remind"), "handled");
    assert_eq!(w.next_sent().1, "soon");
    assert_eq!(w.next_sent().1, "reminder");
    assert_eq!(w.next_sent().1, "still there?");
    // The conversation now waits at the ask: the next message answers it (it does
    // not reach the handler) and ends the flow, deleting its checkpoint.
    assert_eq!(w.say(&bot, "d", "yes"), "handled");
    assert!(w.handled.try_recv().is_err(), "the answer went to the ask");
    assert_eq!(w.coordinator.read_checkpoint("d").expect("read"), None);
    bot.shutdown();
}

/// A coordinator whose renewals fail while `cut` is set: a replica partitioned from
/// the backend (or paused) loses its leases after the TTL.
struct Partition {
    inner: Arc<dyn Coordinator>,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl Coordinator for Partition {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl()
    }
    fn attach(
        &self,
        r: &botmesh::ReplicaId,
        sink: botmesh::GrantSink,
    ) -> Result<(), botmesh::BackendError> {
        self.inner.attach(r, sink)
    }
    fn detach(
        &self,
        r: &botmesh::ReplicaId,
        h: &[botmesh::HeldLease<'_>],
    ) -> Result<(), botmesh::BackendError> {
        self.inner.detach(r, h)
    }
    fn enqueue(
        &self,
        q: &botmesh::EnqueueRequest<'_>,
    ) -> Result<botmesh::Enqueued, botmesh::BackendError> {
        self.inner.enqueue(q)
    }
    fn cancel(
        &self,
        w: &botmesh::Waiting<'_>,
    ) -> Result<Option<botmesh::Grant>, botmesh::BackendError> {
        self.inner.cancel(w)
    }
    fn release(
        &self,
        l: &botmesh::HeldLease<'_>,
        h: Option<&str>,
    ) -> Result<botmesh::Released, botmesh::BackendError> {
        self.inner.release(l, h)
    }
    fn renew(
        &self,
        r: &botmesh::ReplicaId,
        l: &[botmesh::HeldLease<'_>],
        w: &[botmesh::Waiting<'_>],
    ) -> Result<botmesh::Renewal, botmesh::BackendError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(botmesh::BackendError::new("partitioned (test)"));
        }
        self.inner.renew(r, l, w)
    }
    fn write_checkpoint(
        &self,
        chat: &str,
        token: u64,
        data: Option<&str>,
    ) -> Result<bool, botmesh::BackendError> {
        self.inner.write_checkpoint(chat, token, data)
    }
    fn read_checkpoint(&self, chat: &str) -> Result<Option<(u64, String)>, botmesh::BackendError> {
        self.inner.read_checkpoint(chat)
    }
}

/// A replica that loses its lease in the middle of a step (partitioned past the TTL)
/// while B takes the chat and moves the conversation on: when A's step returns, its
/// sends and its checkpoint write are refused and it keeps nothing; B's progress
/// stands.
pub fn deposed_step_is_refused<B: Backend>() {
    let b = B::start(Duration::from_millis(600));
    let w = World::new(&b);
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let partitioned: Arc<dyn Coordinator> = Arc::new(Partition {
        inner: w.coordinator.clone(),
        cut: cut.clone(),
    });
    let (gate_tx, gate) = unbounded::<()>();
    let (ev_tx, ev) = unbounded::<String>();
    let flow = move |who: &'static str, gate: Option<Receiver<()>>, ev_tx: Sender<String>| {
        Flow::new("job")
            .keywords(["job"])
            .persistent()
            .action(move |step| {
                if let Some(g) = &gate {
                    let _ = ev_tx.send(format!("{who} in step"));
                    let _ = g.recv_timeout(RECV);
                    let refused = step.send("late").is_err();
                    let cancelled = step.is_cancelled();
                    let _ = ev_tx.send(format!(
                        "{who} send refused={refused} cancelled={cancelled}"
                    ));
                }
                step.set("by", who);
                Ok(())
            })
            .ask_for("answer", "next?")
    };
    let config_a = CoordinationConfig::new(CoordinatorConfig::Shared(partitioned))
        .with_settle(Duration::from_secs(60));
    let a = w.bot(
        "dp-a",
        2,
        config_a,
        vec![flow("a", Some(gate), ev_tx.clone())],
    );
    let c = w.bot("dp-b", 2, w.config(), vec![flow("b", None, ev_tx)]);
    a.intake().deliver(Message::new("d", "job")).expect("in");
    assert_eq!(recv(&ev, "A in its step"), "a in step");
    cut.store(true, Ordering::SeqCst);
    // B gets the chat once A's lease ran out, and runs the step again (at least once).
    assert_eq!(w.say(&c, "d", "hello"), "handled");
    assert_eq!(w.next_sent(), ("dp-b".into(), "next?".into()));
    cut.store(false, Ordering::SeqCst);
    gate_tx.send(()).expect("gate");
    assert_eq!(recv(&ev, "A's send"), "a send refused=true cancelled=true");
    let (who, text, kind) = recv(&w.ended, "A's message end");
    assert_eq!((who.as_str(), text.as_str()), ("dp-a", "job"));
    assert_eq!(kind, "dropped", "A's turn was lost");
    w.no_more_sent();
    let (_, data) = w
        .coordinator
        .read_checkpoint("d")
        .expect("read")
        .expect("checkpoint");
    assert!(
        data.contains("\"by\":\"b\""),
        "B's checkpoint stands: {data}"
    );
    // A's next turn on the chat continues from B's checkpoint, not its own copy.
    assert_eq!(w.say(&a, "d", "42"), "handled");
    w.no_more_sent();
    assert!(w.handled.try_recv().is_err(), "42 answered B's ask");
    let (_, data) = w
        .coordinator
        .read_checkpoint("d")
        .expect("read")
        .unwrap_or_default();
    assert!(!data.contains("next?"), "{data}");
    a.shutdown();
    c.shutdown();
}

/// Runs every test above for a backend type.
macro_rules! suite {
    ($b:ty) => {
        #[test]
        fn settle_holds_the_turn() {
            let _s = crate::support::serial();
            conversations::settle_holds_the_turn::<$b>();
        }
        #[test]
        fn settle_stops_a_long_step() {
            let _s = crate::support::serial();
            conversations::settle_stops_a_long_step::<$b>();
        }
        #[test]
        fn persistent_form_survives_a_crash() {
            let _s = crate::support::serial();
            conversations::persistent_form_survives_a_crash::<$b>();
        }
        #[test]
        fn non_persistent_flows_follow_the_policy() {
            let _s = crate::support::serial();
            conversations::non_persistent_flows_follow_the_policy::<$b>();
        }
        #[test]
        fn unresumable_checkpoints_follow_the_fallback() {
            let _s = crate::support::serial();
            conversations::unresumable_checkpoints_follow_the_fallback::<$b>();
        }
        #[test]
        fn stale_conversation_is_never_continued() {
            let _s = crate::support::serial();
            conversations::stale_conversation_is_never_continued::<$b>();
        }
        #[test]
        fn quick_answers_read_the_previous_state() {
            let _s = crate::support::serial();
            conversations::quick_answers_read_the_previous_state::<$b>();
        }
        #[test]
        fn timed_step_runs_under_the_turn() {
            let _s = crate::support::serial();
            conversations::timed_step_runs_under_the_turn::<$b>();
        }
        #[test]
        fn delay_runs_the_next_steps() {
            let _s = crate::support::serial();
            conversations::delay_runs_the_next_steps::<$b>();
        }
        #[test]
        fn deposed_step_is_refused() {
            let _s = crate::support::serial();
            conversations::deposed_step_is_refused::<$b>();
        }
        #[test]
        fn delay_holds_no_worker() {
            let _s = crate::support::serial();
            conversations::delay_holds_no_worker::<$b>();
        }
    };
}
pub(crate) use suite;
