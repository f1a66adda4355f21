//! Conversations (settle, checkpoints, handover) against `RedisCoordinator` and real
//! `redis-server` processes.
#![cfg(feature = "redis")]

mod conversations;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::Coordinator;
use botmesh::redis::{RedisCoordinator, RedisOptions};
use support::RedisServer;

struct Redis {
    _server: RedisServer,
    coordinator: Arc<RedisCoordinator>,
}

impl conversations::Backend for Redis {
    fn start(ttl: Duration) -> Self {
        let server = RedisServer::start();
        let options = RedisOptions::new(server.url()).with_lease_ttl(ttl);
        let coordinator = Arc::new(RedisCoordinator::connect(options).expect("connect"));
        Redis {
            _server: server,
            coordinator,
        }
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.coordinator.clone()
    }
}

conversations::suite!(Redis);
