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
