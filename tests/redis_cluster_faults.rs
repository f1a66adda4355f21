//! Faults of a real Redis Cluster (3 primaries, 3 replicas) while a chat on the
//! affected primary is held and waited on: a manual failover to the replica, a
//! SIGKILLed primary replaced by its replica, and the chat's slot migrated to another
//! primary mid-turn. In each: no two handlers of a chat overlap, tokens keep rising,
//! every message ends exactly once (handled, or dropped with a reason), a chat on
//! another primary keeps its turn, and new messages flow afterwards.
#![cfg(feature = "redis")]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::{Bot, CoordinationConfig, Coordinator, CoordinatorConfig, Message, Outcome, Replica};
use crossbeam_channel::{Receiver, unbounded};
use support::redis_cluster::RedisCluster;
use support::serial;

const RECV: Duration = Duration::from_secs(40);
const TTL: Duration = Duration::from_secs(5);
const WAITERS: usize = 4;

fn coordinator(cluster: &RedisCluster) -> Arc<RedisCoordinator> {
    let options = RedisOptions::cluster(cluster.seeds())
        .with_lease_ttl(TTL)
        .with_command_timeout(Duration::from_millis(500));
    Arc::new(RedisCoordinator::connect(options).expect("connect"))
}

/// A chat name whose keys live on the primary `port` (or, with `on == false`, on any
/// other primary), by the server's own `CLUSTER KEYSLOT`.
fn chat_on(cluster: &RedisCluster, port: u16, on: bool) -> (String, u16) {
    for i in 0..10_000 {
        let chat = format!("chat-{i}");
        let slot = cluster.keyslot(&format!("botmesh:{{{chat}}}:h"));
        if (cluster.primary_of(slot) == port) == on {
            return (chat, slot);
        }
    }
    panic!("no chat found for {port}")
}

/// Handler starts (chat, text, token) and overlaps seen.
#[derive(Default)]
struct Log {
    starts: Vec<(String, String, u64)>,
    busy: HashMap<String, bool>,
    overlaps: usize,
}

struct Run {
    bots: Vec<Bot>,
    log: Arc<Mutex<Log>>,
    started: Receiver<String>,
    outcomes: Receiver<(String, String)>,
    gate: Option<crossbeam_channel::Sender<()>>,
}

/// Two bots over the cluster; the handler of "hold" blocks until the gate is
/// dropped.
fn bots(cluster: &RedisCluster) -> Run {
    let log = Arc::new(Mutex::new(Log::default()));
    let (started_tx, started) = unbounded::<String>();
    let (gate, gate_rx) = unbounded::<()>();
    let (out_tx, outcomes) = unbounded::<(String, String)>();
    let mut bots = Vec::new();
    for id in ["a", "b"] {
        let (started_tx, gate_rx, out_tx, log) = (
            started_tx.clone(),
            gate_rx.clone(),
            out_tx.clone(),
            log.clone(),
        );
        let c = coordinator(cluster);
        bots.push(
            Bot::builder()
                .id(id)
                .workers(2)
                .coordination(CoordinationConfig::new(CoordinatorConfig::Shared(c)))
                .handler(move |ctx| {
                    let chat = ctx.message().chat.clone();
                    let text = ctx.message().text.clone();
                    {
                        let mut l = log.lock().unwrap();
                        let was = l.busy.insert(chat.clone(), true).unwrap_or(false);
                        if was {
                            l.overlaps += 1;
                        }
                        l.starts
                            .push((chat.clone(), text.clone(), ctx.turn().fencing_token()));
                    }
                    let _ = started_tx.send(text.clone());
                    if text == "hold" {
                        let _ = gate_rx.recv();
                    }
                    log.lock().unwrap().busy.insert(chat, false);
                    Ok(())
                })
                .on_outcome(move |m, o| {
                    let what = match o {
                        Outcome::Handled { .. } => "handled".to_owned(),
                        Outcome::Dropped(e) => {
                            eprintln!("{} dropped: {e}", m.text);
                            e.reason.to_string()
                        }
                        other => format!("{other:?}"),
                    };
                    let _ = out_tx.send((m.text.clone(), what));
                })
                .build()
                .expect("bot"),
        );
    }
    Run {
        bots,
        log,
        started,
        outcomes,
        gate: Some(gate),
    }
}

/// Polls the coordinator until `chat` has `n` queued tickets (a server state, read
/// with a deadline).
fn wait_queued(c: &dyn Coordinator, chat: &str, n: usize) {
    let t0 = Instant::now();
    while c.inspect_chat(chat).map(|v| v.queued).unwrap_or(0) < n {
        assert!(t0.elapsed() < RECV, "{n} waiters queued on {chat}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Holds `hot` (on the affected primary) in a handler with 4 messages waiting
/// behind it, and `cold` (another primary) with a bare `Replica` turn; runs `fault`
/// (which lets the holder go through `release_holder` at the moment it chooses);
/// then checks the properties in the module docs. Returns the outcomes by text and
/// how long the fault took.
fn scenario(
    cluster: &mut RedisCluster,
    hot: &str,
    cold: &str,
    fault: impl FnOnce(&mut RedisCluster, &mut dyn FnMut()),
) -> (HashMap<String, String>, Duration) {
    let mut run = bots(cluster);
    let probe = coordinator(cluster);
    let cold_replica = Replica::start("cold", probe.clone()).expect("replica");
    let cold_turn = cold_replica
        .acquire_timeout(cold, Duration::from_secs(10))
        .expect("cold turn");
    run.bots[0]
        .intake()
        .deliver(Message::new(hot, "hold").with_id("0"))
        .expect("deliver");
    assert_eq!(run.started.recv_timeout(RECV).expect("hold starts"), "hold");
    for i in 1..=WAITERS {
        run.bots[i % 2]
            .intake()
            .deliver(Message::new(hot, format!("m{i}")).with_id(i.to_string()))
            .expect("deliver");
    }
    wait_queued(probe.as_ref(), hot, WAITERS);
    let gate = run.gate.take();
    let mut gate = Some(gate);
    let mut release_holder = move || {
        gate.take();
    };
    let t0 = Instant::now();
    fault(cluster, &mut release_holder);
    let took = t0.elapsed();
    release_holder();
    let mut ended: HashMap<String, String> = HashMap::new();
    for _ in 0..=WAITERS {
        let (text, what) = run.outcomes.recv_timeout(RECV).expect("every message ends");
        assert!(
            ended.insert(text.clone(), what).is_none(),
            "{text} ended twice"
        );
    }
    // New messages flow on the changed cluster, and nothing ends a second time.
    run.bots[1]
        .intake()
        .deliver(Message::new(hot, "after").with_id("after"))
        .expect("deliver after");
    let (text, what) = run.outcomes.recv_timeout(RECV).expect("after ends");
    assert_eq!((text.as_str(), what.as_str()), ("after", "handled"));
    let log = run.log.lock().unwrap();
    assert_eq!(log.overlaps, 0, "no two handlers of a chat at once");
    let tokens: Vec<u64> = log
        .starts
        .iter()
        .filter(|s| s.0 == hot)
        .map(|s| s.2)
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens rise: {tokens:?}"
    );
    // The chat on a healthy primary kept its turn through the fault.
    assert!(!cold_turn.is_lost(), "the cold chat's turn survived");
    cold_turn.release().expect("cold release");
    drop(log);
    cold_replica.shutdown();
    for bot in run.bots {
        bot.shutdown();
    }
    (ended, took)
}

/// `CLUSTER FAILOVER` on the hot primary's replica while the chat is held: a manual
/// failover loses no write, so every message is handled (the replica had no
/// scripts: `NOSCRIPT` is answered by loading them there).
#[test]
fn manual_failover_mid_turn() {
    let _serial = serial();
    let mut cluster = RedisCluster::start();
    let primary = cluster.primaries()[0];
    let (hot, _) = chat_on(&cluster, primary, true);
    let (cold, _) = chat_on(&cluster, primary, false);
    let replica = cluster.replica_of(primary);
    let (ended, took) = scenario(&mut cluster, &hot, &cold, |c, _| {
        c.failover(replica).expect("failover");
    });
    eprintln!("manual failover took {took:?}");
    assert!(ended.values().all(|w| w == "handled"), "{ended:?}");
    assert_eq!(
        cluster.primary_of(cluster.keyslot(&format!("botmesh:{{{hot}}}:h"))),
        replica
    );
}

/// The hot primary SIGKILLed while the chat is held; its replica takes over after
/// the node timeout. The holder's turn may be reported lost (its node was gone);
/// the waiters run or are dropped with a reason; nothing hangs.
#[test]
fn killed_primary_mid_turn() {
    let _serial = serial();
    let mut cluster = RedisCluster::start();
    let primary = cluster.primaries()[1];
    let (hot, _) = chat_on(&cluster, primary, true);
    let (cold, _) = chat_on(&cluster, primary, false);
    let (ended, took) = scenario(&mut cluster, &hot, &cold, |c, _| {
        c.kill(primary);
        c.wait_replaced().expect("a replica takes over");
    });
    eprintln!("killed primary replaced after {took:?}; outcomes {ended:?}");
    for (text, what) in &ended {
        assert!(
            ["handled", "lost", "timeout", "unavailable"].contains(&what.as_str()),
            "{text}: {what}"
        );
    }
}

/// The hot chat's slot migrated to another primary while the chat is held; the
/// holder finishes while the slot is half moved (its release meets `ASK` or
/// `TRYAGAIN`), and the waiters run on the new owner.
#[test]
fn slot_migrated_mid_turn() {
    let _serial = serial();
    let mut cluster = RedisCluster::start();
    let primaries = cluster.primaries();
    let (from, to) = (primaries[2], primaries[0]);
    let (hot, slot) = chat_on(&cluster, from, true);
    let (cold, _) = chat_on(&cluster, from, false);
    let (ended, took) = scenario(&mut cluster, &hot, &cold, |c, release| {
        c.migrate_slot(slot, from, to, release).expect("migrate");
    });
    eprintln!("slot migration took {took:?}");
    assert!(ended.values().all(|w| w == "handled"), "{ended:?}");
    assert_eq!(cluster.primary_of(slot), to);
}
