//! Faults of a real Redis Cluster (3 primaries, 3 replicas) while a chat on the
//! affected primary is held and waited on: a manual failover to the replica, a
//! SIGKILLed primary replaced by its replica, and the chat's slot migrated to another
//! primary mid-turn. In each: no two handlers of a chat overlap, tokens keep rising,
//! every message ends exactly once (handled, or dropped with a reason), a chat on
//! another primary keeps its turn, and new messages flow afterwards.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::redis::{RedisCoordinator, RedisOptions};
use support::held_chat::scenario;
use support::redis_cluster::RedisCluster;
use support::serial;

const TTL: Duration = Duration::from_secs(5);

fn coordinator(seeds: &[String]) -> Arc<RedisCoordinator> {
    let options = RedisOptions::cluster(seeds.iter().cloned())
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

/// `CLUSTER FAILOVER` on the hot primary's replica while the chat is held: a manual
/// failover loses no write, so every message is handled (the replica had no
/// scripts: `NOSCRIPT` is answered by loading them there).
#[test]
fn manual_failover_mid_turn() {
    let _serial = serial();
    let mut cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let connect = move || coordinator(&seeds);
    let primary = cluster.primaries()[0];
    let (hot, _) = chat_on(&cluster, primary, true);
    let (cold, _) = chat_on(&cluster, primary, false);
    let replica = cluster.replica_of(primary);
    let (ended, took) = scenario(&mut cluster, &connect, &hot, &cold, |c, _| {
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
    let seeds = cluster.seeds();
    let connect = move || coordinator(&seeds);
    let primary = cluster.primaries()[1];
    let (hot, _) = chat_on(&cluster, primary, true);
    let (cold, _) = chat_on(&cluster, primary, false);
    let (ended, took) = scenario(&mut cluster, &connect, &hot, &cold, |c, _| {
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
    let seeds = cluster.seeds();
    let connect = move || coordinator(&seeds);
    let primaries = cluster.primaries();
    let (from, to) = (primaries[2], primaries[0]);
    let (hot, slot) = chat_on(&cluster, from, true);
    let (cold, _) = chat_on(&cluster, from, false);
    let (ended, took) = scenario(&mut cluster, &connect, &hot, &cold, |c, release| {
        c.migrate_slot(slot, from, to, release).expect("migrate");
    });
    eprintln!("slot migration took {took:?}");
    assert!(ended.values().all(|w| w == "handled"), "{ended:?}");
    assert_eq!(cluster.primary_of(slot), to);
}
