//! What a conversation costs per message, in process (memory backend).
//!
//! `cargo bench --bench flows`. Each iteration delivers one message and waits for its
//! outcome (intake, grant, a worker, release: a full round trip through the bot):
//!
//! - `handler`: a plain handler, no flows: the baseline;
//! - `ask_loop`: the message answers a waiting `ask` of a persistent flow, which loops
//!   back to the same `ask` (capture, a goto, the prompt sent, two checkpoint writes);
//! - `ask_loop_local`: the same flow without coordination (nothing is checkpointed).

use std::sync::Arc;
use std::time::Duration;

use botmesh::{
    Bot, CoordinationConfig, CoordinatorConfig, Flow, Message, Provider, ProviderError, Session,
};
use criterion::{Criterion, criterion_group, criterion_main};
use crossbeam_channel::{Receiver, unbounded};

struct Mute;

impl Provider for Mute {
    fn id(&self) -> &str {
        "mute"
    }
    fn start(&self, _: Session) -> Result<(), ProviderError> {
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, _: &str, _: &str) -> Result<(), ProviderError> {
        Ok(())
    }
}

fn bot(flows: bool, coordinated: bool) -> (Bot, Receiver<()>) {
    let (tx, rx) = unbounded();
    let mut b = Bot::builder()
        .workers(2)
        .provider(Arc::new(Mute))
        .handler(|_| Ok(()))
        .on_outcome(move |_, _| {
            let _ = tx.send(());
        });
    if coordinated {
        let config = CoordinationConfig::new(CoordinatorConfig::memory());
        b = b.coordination(config);
    }
    if flows {
        b = b
            .flow(
                Flow::new("loop")
                    .keywords(["start"])
                    .persistent()
                    .ask_for("last", "next?")
                    .goto("again"),
            )
            .flow(Flow::new("again").persistent().goto("loop"));
    }
    let bot = b.build().expect("bot");
    if flows {
        bot.intake()
            .deliver(Message::new("c", "start"))
            .expect("start");
        rx.recv_timeout(Duration::from_secs(10)).expect("started");
    }
    (bot, rx)
}

fn round_trips(c: &mut Criterion) {
    let mut g = c.benchmark_group("flows");
    g.measurement_time(Duration::from_secs(5));
    for (name, flows, coordinated) in [
        ("handler", false, true),
        ("ask_loop", true, true),
        ("ask_loop_local", true, false),
    ] {
        let (bot, rx) = bot(flows, coordinated);
        let intake = bot.intake();
        g.bench_function(name, |b| {
            b.iter(|| {
                intake
                    .deliver(Message::new("c", "answer"))
                    .expect("deliver");
                rx.recv_timeout(Duration::from_secs(10)).expect("ended");
            })
        });
        bot.shutdown();
    }
    g.finish();
}

criterion_group!(benches, round_trips);
criterion_main!(benches);
