//! Conversations (settle, checkpoints, handover) against `MemoryCoordinator`.

mod conversations;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::DEFAULT_DEDUP_WINDOW;
use botmesh::{Coordinator, MemoryCoordinator};

struct Memory(Arc<MemoryCoordinator>);

impl conversations::Backend for Memory {
    fn start(ttl: Duration) -> Self {
        Memory(Arc::new(MemoryCoordinator::with_settings(
            ttl,
            DEFAULT_DEDUP_WINDOW,
        )))
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.0.clone()
    }
}

conversations::suite!(Memory);
