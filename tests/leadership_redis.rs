//! Provider leadership over `RedisCoordinator` and real `redis-server` processes, with
//! replicas as separate processes (this test binary re-executed, see `leader_child`)
//! in front of the exclusive test platform, which counts a conflict whenever two
//! sessions overlap.
#![cfg(feature = "redis")]

mod support;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::{Bot, CoordinationConfig, CoordinatorConfig, ProviderSession, Reason, Replica};
use support::process::{PROVIDER, ReplicaConfig, ReplicaProcess, run_replica};
use support::transport::{Client, Event, Server};
use support::{RedisServer, serial};

const LONG: Duration = Duration::from_secs(30);

/// Child process: one replica (see `support::process`). Not a test by itself.
#[test]
#[ignore = "child process of the leadership tests over Redis"]
fn leader_child() {
    let Some(cfg) = ReplicaConfig::from_env() else {
        return;
    };
    if let Err(e) = run_replica(&cfg) {
        panic!("replica {}: {e}", cfg.id);
    }
}

struct Cluster {
    redis: RedisServer,
    server: Server,
    ttl: Duration,
    provider_down: Duration,
    procs: HashMap<String, ReplicaProcess>,
}

impl Cluster {
    fn start(ttl: Duration, provider_down: Duration, ids: &[&str]) -> Self {
        let mut c = Cluster {
            redis: RedisServer::start(),
            server: Server::start(true),
            ttl,
            provider_down,
            procs: HashMap::new(),
        };
        for id in ids {
            c.spawn(id);
        }
        c
    }

    fn spawn(&mut self, id: &str) {
        let cfg = ReplicaConfig {
            id: id.to_owned(),
            redis_url: self.redis.url(),
            key_prefix: "botmesh".to_owned(),
            server: self.server.addr(),
            ttl: self.ttl,
            provider_down: self.provider_down,
            session: ProviderSession::Leader,
            exclusive: true,
        };
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args([
            "--exact",
            "leader_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        let p = ReplicaProcess::spawn(cmd, &cfg).expect("replica process");
        self.procs.insert(id.to_owned(), p);
    }

    fn take(&mut self, id: &str) -> ReplicaProcess {
        self.procs.remove(id).expect("a running replica")
    }

    /// Asks every replica which leadership token it holds: exactly `leader` holds one.
    fn check_one_leader(&mut self, leader: &str) {
        for p in self.procs.values_mut() {
            p.command("token");
        }
        for (id, p) in &self.procs {
            let token = p.wait_line("TOKEN", LONG).expect("token answer");
            assert_eq!(token != "None", id == leader, "{id} says {token}");
        }
    }

    fn stop_all(&mut self) {
        for (id, p) in self.procs.drain() {
            assert!(p.stop(LONG), "{id} stops cleanly");
        }
    }
}

/// When the platform recorded the end of `replica`'s session with `token`.
fn closed_at(server: &Server, replica: &str, token: Option<u64>) -> Instant {
    server
        .history()
        .into_iter()
        .find_map(|e| match e {
            Event::Closed {
                replica: r,
                token: t,
                at,
                ..
            } if r == replica && t == token => Some(at),
            _ => None,
        })
        .expect("the old session's end was recorded")
}

/// Three replica processes in leader mode: a leader crash (SIGKILL), a clean stop, a
/// step-down after `provider_down` and a rolling restart of all three; the platform
/// never sees two sessions at once, and one replica at a time holds the leadership.
#[test]
fn three_processes_never_conflict() {
    let _serial = serial();
    let ttl = Duration::from_secs(1);
    let mut c = Cluster::start(ttl, Duration::from_millis(300), &["a", "b", "c"]);
    let (l1, t1, _) = c.server.wait_opened(LONG).expect("a leader connects");
    c.check_one_leader(&l1);

    // Crash: the lease lapses after the TTL, a standby's re-check takes it.
    let killed = Instant::now();
    c.take(&l1).kill();
    let (l2, t2, opened) = c.server.wait_opened(LONG).expect("a standby takes over");
    let crash_gap = opened - killed;
    assert_ne!(l2, l1);
    assert!(t2 > t1);
    assert!(
        crash_gap >= ttl / 4,
        "the lease was not released: {crash_gap:?}"
    );
    assert!(crash_gap < ttl * 5, "{crash_gap:?}");
    c.spawn(&l1);
    c.check_one_leader(&l2);

    // Clean stop: the release wakes a standby at once.
    assert!(c.take(&l2).stop(LONG));
    let (l3, t3, opened) = c.server.wait_opened(LONG).expect("a standby takes over");
    let clean_gap = opened - closed_at(&c.server, &l2, t2);
    assert_ne!(l3, l2);
    assert!(t3 > t2);
    assert!(clean_gap < ttl / 3, "woken by the release: {clean_gap:?}");
    c.spawn(&l2);
    c.check_one_leader(&l3);

    // Step-down: the leader is logged out and cannot reconnect.
    let denied = Instant::now();
    c.server.deny(&l3);
    let (l4, t4, opened) = c.server.wait_opened(LONG).expect("a standby takes over");
    assert_ne!(l4, l3);
    assert!(t4 > t3);
    assert!(opened - denied >= c.provider_down);
    c.server.allow(&l3);
    c.check_one_leader(&l4);

    // Rolling restart of every replica, the leader among them.
    let mut leader = l4;
    for id in ["a", "b", "c"] {
        assert!(c.take(id).stop(LONG), "{id} stops cleanly");
        if id == leader {
            let (next, _, _) = c.server.wait_opened(LONG).expect("a standby takes over");
            assert_ne!(next, id);
            leader = next;
        }
        c.spawn(id);
    }
    c.check_one_leader(&leader);
    eprintln!(
        "over Redis, TTL {ttl:?}: crash {crash_gap:?}, clean stop {clean_gap:?} without a session"
    );
    assert_eq!(c.server.conflicts(), 0, "{:?}", c.server.history());
    c.stop_all();
    assert_eq!(c.server.conflicts(), 0);
}

/// A leader process paused (SIGSTOP) past its TTL is replaced; back from the pause it
/// stops its transport as soon as it notices, holds no leadership, its replies are
/// refused, and a send with its stale token is refused by the platform.
#[test]
fn deposed_leader_stops_its_transport() {
    let _serial = serial();
    let mut c = Cluster::start(
        Duration::from_millis(600),
        Duration::from_secs(60),
        &["a", "b"],
    );
    let (old, t1, _) = c.server.wait_opened(LONG).expect("a leader connects");
    let paused = c.take(&old);
    assert!(paused.pause());
    let (new, t2, _) = c.server.wait_opened(LONG).expect("the standby takes over");
    assert_ne!(new, old);
    assert!(t2 > t1);
    // The platform closed the paused session for the new one, as WhatsApp would: the
    // one conflict a pause past the TTL costs, and why the token matters.
    assert_eq!(c.server.conflicts(), 1);
    assert!(paused.resume());
    let mut paused = paused;
    paused
        .wait_line("STOPPED", LONG)
        .expect("the deposed leader stops its transport");
    paused.command("token");
    assert_eq!(paused.wait_line("TOKEN", LONG).as_deref(), Some("None"));
    paused.command("poke");
    let reply = paused.wait_line("REPLY", LONG).expect("reply attempt");
    assert!(reply.starts_with("refused"), "{reply}");
    paused.command("raw");
    let raw = paused.wait_line("RAW", LONG).expect("raw send");
    assert!(raw.contains("FENCED"), "{raw}");
    // The new leader kept its session; the old one never got a session back.
    assert_eq!(c.server.sessions(), [(new.clone(), t2)]);
    assert_eq!(c.server.conflicts(), 1);
    c.procs.insert(old, paused);
    c.check_one_leader(&new);
    c.stop_all();
}

fn coordinator(url: &str, ttl: Duration) -> Arc<RedisCoordinator> {
    let options = RedisOptions::new(url).with_lease_ttl(ttl);
    Arc::new(RedisCoordinator::connect(options).expect("connect"))
}

/// Over Redis too, chats named like the leadership lease (with or without a leading
/// NUL) and the lease never block each other.
#[test]
fn chats_named_like_the_lease_do_not_collide() {
    let _serial = serial();
    let redis = RedisServer::start();
    let server = Server::start(true);
    let ttl = Duration::from_secs(3);
    let other = Replica::start("other", coordinator(&redis.url(), ttl)).expect("replica");
    let names = ["provider:platform", "\0provider:platform"];
    let held: Vec<_> = names
        .iter()
        .map(|n| other.acquire_timeout(n, LONG).expect("chat"))
        .collect();
    for (turn, name) in held.iter().zip(names) {
        assert_eq!(turn.chat(), name);
    }
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(&redis.url(), ttl)))
        .with_provider_session(ProviderSession::Leader);
    let bot = Bot::builder()
        .id("a")
        .coordination(config)
        .provider(Arc::new(Client::new(PROVIDER, "a", server.addr(), true)))
        .handler(|_| Ok(()))
        .build()
        .expect("bot");
    let (who, _, _) = server.wait_opened(LONG).expect("leads beside the chats");
    assert_eq!(who, "a");
    let probe = Replica::start("probe", coordinator(&redis.url(), ttl)).expect("replica");
    for name in names {
        let err = probe
            .acquire_timeout(name, Duration::from_millis(100))
            .expect_err("held");
        assert_eq!((err.reason, err.chat.as_str()), (Reason::Timeout, name));
    }
    drop(held);
    for name in names {
        let turn = other
            .acquire_timeout(name, LONG)
            .expect("free beside the lease");
        assert_eq!(turn.chat(), name);
        turn.release().expect("release");
    }
    assert!(bot.leader_token(PROVIDER).is_some());
    bot.shutdown();
    probe.shutdown();
    other.shutdown();
    assert!(
        redis.keys_without_ttl().is_empty(),
        "{:?}",
        redis.keys_without_ttl()
    );
}

/// `auto` over Redis: an exclusive provider gets one leader, a shared one connects on
/// every replica.
#[test]
fn auto_over_redis() {
    let _serial = serial();
    let redis = RedisServer::start();
    for exclusive in [true, false] {
        let server = Server::start(exclusive);
        let bots: Vec<Bot> = ["a", "b", "c"]
            .iter()
            .map(|id| {
                let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(
                    &redis.url(),
                    Duration::from_secs(3),
                )));
                Bot::builder()
                    .id(*id)
                    .coordination(config)
                    .provider(Arc::new(Client::new(
                        PROVIDER,
                        id,
                        server.addr(),
                        exclusive,
                    )))
                    .handler(|_| Ok(()))
                    .build()
                    .expect("bot")
            })
            .collect();
        let sessions = if exclusive { 1 } else { 3 };
        for _ in 0..sessions {
            let (_, token, _) = server.wait_opened(LONG).expect("connects");
            assert_eq!(token.is_some(), exclusive);
        }
        let leading = bots.iter().filter(|b| b.leader_token(PROVIDER).is_some());
        assert_eq!(leading.count(), usize::from(exclusive));
        assert_eq!(server.sessions().len(), sessions);
        for bot in bots {
            bot.shutdown();
        }
        assert_eq!(server.conflicts(), 0);
    }
}
