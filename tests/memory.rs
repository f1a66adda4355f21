//! The conformance suite against `MemoryCoordinator`.

mod conformance;

use std::sync::Arc;
use std::time::Duration;

use botmesh::memory::DEFAULT_DEDUP_WINDOW;
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
