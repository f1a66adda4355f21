//! `RedisCoordinator` over `rediss://` (feature `tls`): the conformance suite,
//! unchanged, against a TLS-only `redis-server` that checks client certificates; and
//! the errors for a missing CA file and an untrusted server.
#![cfg(feature = "tls")]

mod conformance;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::Coordinator;
use botmesh::redis::{RedisCoordinator, RedisOptions};
use support::redis_tls::TlsRedis;

struct Tls {
    server: TlsRedis,
    coordinator: Arc<RedisCoordinator>,
}

fn options(server: &TlsRedis) -> RedisOptions {
    let (cert, key) = server.client();
    RedisOptions::new(server.url())
        .with_ca_file(server.ca())
        .with_client_cert(cert, key)
}

impl conformance::Harness for Tls {
    fn start(ttl: Duration) -> Self {
        let server = TlsRedis::start();
        let coordinator = Arc::new(
            RedisCoordinator::connect(options(&server).with_lease_ttl(ttl)).expect("connect"),
        );
        Tls {
            server,
            coordinator,
        }
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.coordinator.clone()
    }
    fn live_state(&self) -> usize {
        self.server.keys_without_ttl()
    }
}

conformance::suite!(Tls);

#[test]
fn a_missing_ca_file_is_named() {
    let server = TlsRedis::start();
    let e = RedisCoordinator::connect(options(&server).with_ca_file("/nonexistent/ca.pem"))
        .expect_err("refused");
    let text = e.to_string();
    assert!(
        text.contains("tls.caFile") && text.contains("/nonexistent/ca.pem"),
        "{text}"
    );
}

#[test]
fn an_untrusted_server_is_refused() {
    let server = TlsRedis::start();
    let other = TlsRedis::start();
    // The other server's CA does not vouch for this server's certificate.
    let (cert, key) = server.client();
    let e = RedisCoordinator::connect(
        RedisOptions::new(server.url())
            .with_ca_file(other.ca())
            .with_client_cert(cert, key),
    )
    .expect_err("refused");
    assert!(e.to_string().contains("redis at 127.0.0.1"), "{e}");
}
