//! What the integration tests share; a new test starts with `mod support;`.
//!
//! - [`RedisServer`]: a real `redis-server` on a free loopback port (also used by the
//!   examples, which include `redis_server.rs` alone);
//! - `redis_cluster` (feature `redis`): a real Redis Cluster of 3 primaries and 3
//!   replicas, with failover, SIGKILL and slot migration;
//! - `redis_tls` (feature `tls`): a TLS-only `redis-server` with certificates made
//!   by `openssl`;
//! - `held_chat` (feature `redis`): a held chat with waiters through a server fault,
//!   and the checks after it;
//! - `redis_sentinel` (feature `redis`): a primary, a replica and 3 sentinels;
//! - [`Proxy`]: a loopback TCP proxy that can lose a reply;
//! - [`serial`]: runs timing-bound tests of one test binary one at a time;
//! - [`transport`]: the test platform with exclusive sessions and its client provider,
//!   and [`transport::Outbox`], a provider with no platform behind it;
//! - `process` (feature `redis`): replica processes over Redis;
//! - [`fake_telegram`]: a fake Telegram Bot API on loopback.
//!
//! Nothing here mocks Redis.

// Each test binary compiles this whole module and uses only part of it.
#![allow(dead_code)]

pub mod fake_telegram;
#[cfg(feature = "redis")]
pub mod held_chat;
#[cfg(feature = "redis")]
pub mod process;
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis_cluster;
#[cfg(feature = "redis")]
pub mod redis_sentinel;
pub mod redis_server;
#[cfg(feature = "tls")]
pub mod redis_tls;
pub mod transport;

use std::sync::{Mutex, MutexGuard};

// Short paths for the tests that use them; the others would warn.
#[allow(unused_imports)]
pub use proxy::Proxy;
#[allow(unused_imports)]
pub use redis_server::RedisServer;

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by a test that bounds an event in time against a lease TTL, `settle` or a
/// failover, so that no other such test of its binary runs meanwhile: a CPU-heavy
/// neighbour (or one restarting its Redis) on a 2-core machine would eat into the
/// bound. A test that panicked while holding it does not stop the others.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A coordinator-level caller for tests that drive a backend directly: replica `id`,
/// attached with a sink that drops every push, asking for chat `"chat"`.
pub struct Caller {
    pub id: botmesh::ReplicaId,
}

impl Caller {
    /// Attaches replica `id` to `c` (pushes dropped).
    pub fn attach(c: &dyn botmesh::Coordinator, id: &str) -> Self {
        let id: botmesh::ReplicaId = std::sync::Arc::from(id);
        c.attach(&id, std::sync::Arc::new(|_: &str, _| {}))
            .expect("attach");
        Caller { id }
    }

    /// Ticket `seq` of this replica.
    pub fn ticket(&self, seq: u64) -> botmesh::Ticket {
        botmesh::Ticket {
            replica: self.id.clone(),
            seq,
        }
    }
}

/// An enqueue of `ticket` on chat `"chat"`, no message id, waiting up to 30 s.
pub fn request(ticket: &botmesh::Ticket) -> botmesh::EnqueueRequest<'_> {
    botmesh::EnqueueRequest {
        chat: "chat",
        ticket,
        message_id: None,
        wait: std::time::Duration::from_secs(30),
    }
}
