//! `RedisCoordinator` under Sentinel, on real servers (a primary, a replica, 3
//! sentinels): the conformance suite unchanged, and a `SENTINEL FAILOVER` while a
//! chat is held and waited on (waiters re-queue or are reported, the holder's loss is
//! reported, nothing hangs, new messages flow on the new primary).
#![cfg(feature = "redis")]

mod conformance;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::Coordinator;
use botmesh::redis::{RedisCoordinator, RedisOptions};
use support::held_chat::scenario;
use support::redis_sentinel::{RedisSentinel, SERVICE};
use support::serial;

fn coordinator(sentinels: &[String], ttl: Duration) -> Arc<RedisCoordinator> {
    let options = RedisOptions::sentinel(sentinels.iter().cloned(), SERVICE)
        .with_lease_ttl(ttl)
        .with_command_timeout((ttl / 3).min(Duration::from_millis(500)));
    Arc::new(RedisCoordinator::connect(options).expect("connect"))
}

struct Sentinel {
    servers: RedisSentinel,
    coordinator: Arc<RedisCoordinator>,
}

impl conformance::Harness for Sentinel {
    fn start(ttl: Duration) -> Self {
        let servers = RedisSentinel::start();
        let coordinator = coordinator(&servers.sentinel_urls(), ttl);
        assert_eq!(
            coordinator.primaries(),
            vec![format!("127.0.0.1:{}", servers.primary())],
            "the sentinels' primary is used"
        );
        Sentinel {
            servers,
            coordinator,
        }
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.coordinator.clone()
    }
    fn live_state(&self) -> usize {
        self.servers.keys_without_ttl()
    }
}

conformance::suite!(Sentinel);

#[test]
fn sentinel_failover_mid_turn() {
    let _serial = serial();
    let mut servers = RedisSentinel::start();
    let urls = servers.sentinel_urls();
    let connect = move || coordinator(&urls, Duration::from_secs(5));
    let before = servers.primary();
    let (ended, took) = scenario(&mut servers, &connect, "hot", "cold", |s, _| {
        let now = s.failover();
        assert_ne!(now, before);
    });
    eprintln!("sentinel failover took {took:?}; outcomes {ended:?}");
    for (text, what) in &ended {
        assert!(
            ["handled", "lost", "timeout", "unavailable", "backend"].contains(&what.as_str()),
            "{text}: {what}"
        );
    }
}

#[test]
fn an_unknown_service_is_reported() {
    let servers = RedisSentinel::start();
    let e = RedisCoordinator::connect(RedisOptions::sentinel(servers.sentinel_urls(), "nosuch"))
        .expect_err("refused");
    assert!(e.to_string().contains("\"nosuch\""), "{e}");
}

/// `wait_replicas`: with the one replica of the set-up acknowledging, turns work as
/// usual (pushed grants are confirmed before use); asking for two replicas, which the
/// set-up does not have, is refused at connect.
#[test]
fn wait_replicas_counts_a_write_once_replicated() {
    use botmesh::{Enqueued, HeldLease, Released};
    let servers = RedisSentinel::start();
    let with = |n: usize| {
        let options = RedisOptions::sentinel(servers.sentinel_urls(), SERVICE)
            .with_lease_ttl(Duration::from_secs(5))
            .with_command_timeout(Duration::from_millis(400))
            .with_wait_replicas(n);
        RedisCoordinator::connect(options).expect("connect")
    };
    let c = with(1);
    assert!(
        c.pushes_need_confirmation(),
        "a push leaves before its grant is replicated"
    );
    let caller = support::Caller::attach(&c, "w");
    let ticket = |seq| caller.ticket(seq);
    let request = support::request;
    let id = caller.id.clone();
    let (first, second) = (ticket(1), ticket(2));
    let Ok(Enqueued::Granted(grant)) = c.enqueue(&request(&first)) else {
        panic!("a free chat is granted at once, once replicated");
    };
    assert!(matches!(c.enqueue(&request(&second)), Ok(Enqueued::Queued)));
    let lease = HeldLease {
        chat: "chat",
        ticket: &first,
        token: grant.token,
    };
    let renewal = c
        .renew(&id, std::slice::from_ref(&lease), &[])
        .expect("renew");
    assert_eq!(renewal.held, [true], "a replicated renewal counts");
    match c.release(&lease, None).expect("release") {
        Released::Released { next: Some(next) } => assert_eq!(next.ticket, second),
        other => panic!("the chat goes to our next ticket, got {other:?}"),
    }

    let e = RedisCoordinator::connect(
        RedisOptions::sentinel(servers.sentinel_urls(), SERVICE).with_wait_replicas(2),
    )
    .expect_err("two replicas asked for, one there");
    assert!(e.to_string().contains("has 1 connected"), "{e}");
    let e = RedisCoordinator::connect(
        RedisOptions::sentinel(servers.sentinel_urls(), SERVICE).with_wait_replicas(101),
    )
    .expect_err("out of range");
    assert!(
        e.to_string().contains("wait_replicas: 101 is out of range"),
        "{e}"
    );
}
