//! The conformance suite against `RedisCoordinator` and real `redis-server` processes.
#![cfg(feature = "redis")]

mod conformance;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::Coordinator;
use botmesh::redis::{RedisCoordinator, RedisOptions};
use support::RedisServer;

struct Redis {
    server: RedisServer,
    coordinator: Arc<RedisCoordinator>,
}

impl conformance::Harness for Redis {
    fn start(ttl: Duration) -> Self {
        let server = RedisServer::start();
        let options = RedisOptions::new(server.url()).with_lease_ttl(ttl);
        let coordinator = Arc::new(RedisCoordinator::connect(options).expect("connect"));
        Redis {
            server,
            coordinator,
        }
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.coordinator.clone()
    }
    fn live_state(&self) -> usize {
        self.server.keys_without_ttl().len()
    }
}

conformance::suite!(Redis);
