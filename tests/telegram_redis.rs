//! The Telegram transport with replicas as processes over Redis (this test binary
//! re-executed, see `telegram_child`) in front of the fake Bot API: long polling on
//! the leader through a crash, a clean stop and a rolling restart; webhooks on two
//! replicas over Redis.
#![cfg(all(feature = "telegram", feature = "redis"))]

mod support;

use std::collections::HashMap;
use std::io::BufRead;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::telegram::{Telegram, TelegramConfig, Webhook};
use botmesh::{Bot, CoordinationConfig, CoordinatorConfig};
use crossbeam_channel::{RecvTimeoutError, bounded};
use serde_json::json;
use support::fake_telegram::{FakeTelegram, Poll, PollEnd};
use support::process::ReplicaProcess;
use support::{RedisServer, serial};

const LONG: Duration = Duration::from_secs(30);
const TOKEN: &str = "123:TEST";
const TTL: Duration = Duration::from_secs(1);

fn telegram_config(api: &str) -> TelegramConfig {
    TelegramConfig::new(TOKEN)
        .with_api_url(api)
        .with_poll_timeout(Duration::from_secs(1))
        .with_backoff(Duration::from_millis(20), Duration::from_millis(300))
        // Under TTL/3: a leader whose renewals fail has that long to stop.
        .with_stop_timeout(Duration::from_millis(200))
}

fn coordinator(url: &str) -> Arc<RedisCoordinator> {
    let options = RedisOptions::new(url)
        .with_lease_ttl(TTL)
        .with_command_timeout(Duration::from_millis(300));
    Arc::new(RedisCoordinator::connect(options).expect("connect"))
}

/// Child process: one echo replica polling the fake API. Not a test by itself.
#[test]
#[ignore = "child process of the Telegram tests over Redis"]
fn telegram_child() {
    let get = |k: &str| std::env::var(k).ok();
    let (Some(id), Some(redis), Some(api)) = (
        get("BOTMESH_TG_ID"),
        get("BOTMESH_TG_REDIS"),
        get("BOTMESH_TG_API"),
    ) else {
        return;
    };
    let telegram = Telegram::long_polling(telegram_config(&api)).expect("config");
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(&redis)));
    let bot = Bot::builder()
        .id(id.as_str())
        .workers(2)
        .coordination(config)
        .provider(Arc::new(telegram))
        .handler(|ctx| Ok(ctx.reply(&ctx.message().text)?))
        .build()
        .expect("bot");
    println!("READY");
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
    bot.shutdown();
    println!("BYE");
}

fn spawn(id: &str, redis: &RedisServer, fake: &FakeTelegram) -> ReplicaProcess {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--exact",
        "telegram_child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("BOTMESH_TG_ID", id)
    .env("BOTMESH_TG_REDIS", redis.url())
    .env("BOTMESH_TG_API", fake.url_for(id));
    ReplicaProcess::spawn_command(cmd, id).expect("replica process")
}

/// Polls of different clients whose times overlap (a poll still held counts up to now).
fn overlaps(polls: &[Poll]) -> Vec<(String, String)> {
    let end = |p: &Poll| p.end.as_ref().map_or_else(Instant::now, |e| e.0);
    let mut found = Vec::new();
    for (i, a) in polls.iter().enumerate() {
        for b in &polls[i + 1..] {
            if a.label != b.label && a.start < end(b) && b.start < end(a) {
                found.push((a.label.clone(), b.label.clone()));
            }
        }
    }
    found
}

/// Three replica processes over Redis: the leader SIGKILLed, the next one stopped
/// cleanly, then a rolling restart of all three, with updates arriving all along.
/// Only the leader polls (no two clients' polls overlap, no 409 between clients),
/// every update is answered, in order per chat; duplicates are counted.
#[test]
fn three_processes_poll_one_at_a_time_and_answer_every_update() {
    let _serial = serial();
    let redis = RedisServer::start();
    let fake = Arc::new(FakeTelegram::start());
    fake.rate_limit_every(40); // a 429 now and then
    let mut procs: HashMap<String, ReplicaProcess> = ["a", "b", "c"]
        .iter()
        .map(|id| (id.to_string(), spawn(id, &redis, &fake)))
        .collect();

    // The platform's traffic: 4 chats, one update every 10 ms, until told to stop.
    let (stop_tx, stop_rx) = bounded::<()>(0);
    let feeder = {
        let fake = fake.clone();
        std::thread::spawn(move || {
            let mut texts = Vec::new();
            for n in 0.. {
                let chat = 1 + n % 4;
                let text = format!("c{chat}-{n:05}");
                fake.push_text(chat, &text);
                texts.push(text);
                // Pacing of the traffic, not a synchronisation.
                match stop_rx.recv_timeout(Duration::from_millis(10)) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
            }
            texts
        })
    };
    let begin = Instant::now();
    let first = fake
        .wait_poll(begin - LONG, LONG, |_| true)
        .expect("a leader polls");
    let mut leader = first.label;

    // Crash: the lease lapses after the TTL, a standby's re-check takes it.
    let killed = Instant::now();
    procs.remove(&leader).expect("leader").kill();
    let old = leader.clone();
    let next = fake
        .wait_poll(killed, LONG, |l| l != old)
        .expect("a standby polls");
    let crash = next.start - killed;
    procs.insert(old.clone(), spawn(&old, &redis, &fake));
    leader = next.label;

    // Clean stop: the leader's closing poll, then its release wakes a standby.
    let stopping = Instant::now();
    let old = leader.clone();
    assert!(
        procs.remove(&old).expect("leader").stop(LONG),
        "{old} stops cleanly"
    );
    let next = fake
        .wait_poll(stopping, LONG, |l| l != old)
        .expect("a standby polls");
    let last_old_end = fake
        .polls()
        .iter()
        .filter(|p| p.label == old)
        .filter_map(|p| p.end.as_ref().map(|e| e.0))
        .max()
        .expect("the old leader's polls ended");
    let clean = next.start.saturating_duration_since(last_old_end);
    let clean_from_request = next.start - stopping;
    procs.insert(old.clone(), spawn(&old, &redis, &fake));
    leader = next.label;

    // Rolling restart of every replica, the leader among them.
    for id in ["a", "b", "c"] {
        let at = Instant::now();
        assert!(
            procs.remove(id).expect("running").stop(LONG),
            "{id} stops cleanly"
        );
        if id == leader {
            leader = fake
                .wait_poll(at, LONG, |l| l != id)
                .expect("a standby polls")
                .label;
        }
        procs.insert(id.to_owned(), spawn(id, &redis, &fake));
    }

    drop(stop_tx);
    let texts = feeder.join().expect("feeder");
    assert!(fake.wait_sent_all(&texts, LONG), "every update answered");
    for (id, p) in procs.drain() {
        assert!(p.stop(LONG), "{id} stops cleanly");
    }

    let sends = fake.sends();
    let mut count: HashMap<&str, usize> = HashMap::new();
    let mut firsts: HashMap<String, Vec<&str>> = HashMap::new();
    for s in &sends {
        let n = count.entry(s.text.as_str()).or_default();
        *n += 1;
        if *n == 1 {
            firsts
                .entry(s.chat.to_string())
                .or_default()
                .push(s.text.as_str());
        }
    }
    let duplicates: usize = count.values().map(|n| n - 1).sum();
    for (chat, got) in &firsts {
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(got, &sorted, "chat {chat} answered in order");
    }
    let polls = fake.polls();
    let conflicts = fake.conflicts();
    let between: Vec<_> = conflicts.iter().filter(|c| c.older != c.newer).collect();
    let own = conflicts.len() - between.len();
    let limited = polls
        .iter()
        .filter(|p| p.end.as_ref().is_some_and(|e| e.1 == PollEnd::RateLimited))
        .count();
    eprintln!(
        "telegram over Redis, TTL {TTL:?}: {} updates, {} sends, {duplicates} duplicate answers; \
         crash failover {crash:?} (kill to the next leader's first poll); clean stop {clean:?} \
         from the old leader's last poll to the next one's first ({clean_from_request:?} from the stop \
         request); 409s: {} between clients, {own} closing polls ending their own; {limited} polls \
         answered 429; {} polls",
        texts.len(),
        sends.len(),
        between.len(),
        polls.len()
    );
    assert!(between.is_empty(), "{between:?}");
    assert_eq!(overlaps(&polls), Vec::<(String, String)>::new());
    assert!(
        crash >= TTL / 4,
        "the crashed leader's lease was not released: {crash:?}"
    );
}

/// Webhooks on two replicas over Redis: every update sent to both (Telegram retrying
/// after a lost answer) is answered once, in order per chat.
#[test]
fn webhook_retries_to_two_replicas_over_redis_are_answered_once() {
    let _serial = serial();
    let redis = RedisServer::start();
    let fake = FakeTelegram::start();
    let replicas: Vec<(Bot, Webhook)> = ["a", "b"]
        .into_iter()
        .map(|id| {
            let config =
                CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(&redis.url())));
            let t = Telegram::webhook(telegram_config(&fake.url_for(id))).expect("config");
            let bot = Bot::builder()
                .id(id)
                .coordination(config)
                .provider(Arc::new(t))
                .handler(|ctx| Ok(ctx.reply(&ctx.message().text)?))
                .build()
                .expect("bot");
            let hook = Webhook::new(bot.intake(), "secret").expect("secret");
            (bot, hook)
        })
        .collect();
    let mut texts = Vec::new();
    for i in 0..40 {
        let text = format!("t{i:03}");
        let body = json!({"update_id": 1000 + i, "message": {"message_id": i,
            "chat": {"id": 10 + i % 3}, "text": text}})
        .to_string();
        // Alternate which replica gets the first copy.
        let order: [usize; 2] = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for r in order {
            assert_eq!(replicas[r].1.handle(Some("secret"), body.as_bytes()), 200);
        }
        texts.push(text);
    }
    assert!(fake.wait_sent_all(&texts, LONG));
    for (bot, _) in replicas {
        bot.shutdown();
    }
    let sends = fake.sends();
    assert_eq!(sends.len(), 40, "each update answered once");
    let mut by_chat: HashMap<String, Vec<String>> = HashMap::new();
    for s in sends {
        by_chat.entry(s.chat.to_string()).or_default().push(s.text);
    }
    for (chat, got) in by_chat {
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(got, sorted, "chat {chat} in order");
    }
}
