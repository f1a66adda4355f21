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
