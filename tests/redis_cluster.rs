//! The conformance suite, unchanged, against `RedisCoordinator` in cluster mode on a
//! real Redis Cluster (3 primaries, 3 replicas, `redis-server` processes started per
//! test).
#![cfg(feature = "redis")]

mod conformance;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::Coordinator;
use botmesh::redis::{RedisCoordinator, RedisOptions};
use support::redis_cluster::RedisCluster;

struct Cluster {
    cluster: RedisCluster,
    coordinator: Arc<RedisCoordinator>,
}

impl conformance::Harness for Cluster {
    fn start(ttl: Duration) -> Self {
        let cluster = RedisCluster::start();
        let options = RedisOptions::cluster(cluster.seeds()).with_lease_ttl(ttl);
        let coordinator = Arc::new(RedisCoordinator::connect(options).expect("connect"));
        assert_eq!(coordinator.primaries().len(), 3, "three primaries in use");
        Cluster {
            cluster,
            coordinator,
        }
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.coordinator.clone()
    }
    fn live_state(&self) -> usize {
        self.cluster.keys_without_ttl("botmesh").len()
    }
}

conformance::suite!(Cluster);

/// The renewal tick is one pipeline per node, not a round trip per lease: renewing
/// 45 leases spread over the 3 primaries reads each primary's socket a few times at
/// most (the pipeline, the `INFO` that asks, perhaps a replica's once-a-second
/// `REPLCONF ACK`), though each primary runs one `FCALL` per lease it holds.
#[test]
fn the_renewal_tick_is_one_round_trip_per_node() {
    use botmesh::{EnqueueRequest, Enqueued, HeldLease, ReplicaId, Ticket};
    let cluster = RedisCluster::start();
    let c = RedisCoordinator::connect(RedisOptions::cluster(cluster.seeds())).expect("connect");
    let id: ReplicaId = Arc::from("r");
    c.attach(&id, Arc::new(|_: &str, _| {})).expect("attach");
    let chats: Vec<String> = (0..45).map(|i| format!("chat-{i}")).collect();
    let tickets: Vec<Ticket> = (0..45)
        .map(|seq| Ticket {
            replica: id.clone(),
            seq,
        })
        .collect();
    let mut tokens = Vec::new();
    for (chat, ticket) in chats.iter().zip(&tickets) {
        let request = EnqueueRequest {
            chat,
            ticket,
            message_id: None,
            wait: Duration::from_secs(30),
        };
        let Ok(Enqueued::Granted(g)) = c.enqueue(&request) else {
            panic!("a free chat is granted at once");
        };
        tokens.push(g.token);
    }
    let held: Vec<HeldLease<'_>> = chats
        .iter()
        .zip(&tickets)
        .zip(&tokens)
        .map(|((chat, ticket), &token)| HeldLease {
            chat,
            ticket,
            token,
        })
        .collect();
    let primaries = cluster.primaries();
    // What reading the counters costs: each query of the test's own is a connection
    // (its command and its close are reads too).
    let counters = |p: u16| {
        let calls = cluster.info_count(p, "commandstats", "fcall");
        (
            calls,
            cluster.info_count(p, "stats", "total_reads_processed"),
        )
    };
    let mut idle = Vec::new();
    for &p in &primaries {
        cluster.reset_stats(p);
        idle.push(counters(p).1);
    }
    for &p in &primaries {
        cluster.reset_stats(p);
    }
    let renewal = c.renew(&id, &held, &[]).expect("renew");
    assert!(renewal.held.iter().all(|&h| h), "every lease renewed");
    for (&p, idle) in primaries.iter().zip(idle) {
        let (calls, reads) = counters(p);
        eprintln!("primary {p}: {calls} renewals, {reads} reads, {idle} idle");
        assert!(
            calls >= 8,
            "primary {p} holds {calls} of the leases; the test needs several"
        );
        assert!(
            reads <= idle + 2,
            "primary {p}: {reads} reads ({idle} with no renewal) for {calls} renewals, not one pipeline"
        );
    }
}
