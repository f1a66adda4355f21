//! The conformance suite against `MemoryCoordinator`.

mod conformance;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::DEFAULT_DEDUP_WINDOW;
use botmesh::{Coordinator, MemoryCoordinator};

struct Memory(Arc<MemoryCoordinator>);

impl conformance::Harness for Memory {
    fn start(ttl: Duration) -> Self {
        Memory(Arc::new(MemoryCoordinator::with_settings(
            ttl,
            DEFAULT_DEDUP_WINDOW,
        )))
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.0.clone()
    }
    fn live_state(&self) -> usize {
        self.0.active_chats()
    }
}

conformance::suite!(Memory);

/// Two live replicas may not share an id: they would take each other's grants.
#[test]
fn duplicate_replica_id_is_refused() {
    let c = Arc::new(MemoryCoordinator::new());
    let a = botmesh::Replica::start("same", c.clone()).expect("first");
    let err = botmesh::Replica::start("same", c.clone()).expect_err("second");
    assert!(err.to_string().contains("\"same\""), "{err}");
    a.shutdown();
    // After a clean stop the name is free again.
    botmesh::Replica::start("same", c)
        .expect("reuse")
        .shutdown();
}
