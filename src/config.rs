//! TEMPORARY stub, replaced by the real module.
use std::sync::Arc;
use std::time::Duration;
#[derive(Clone)]
pub enum CoordinatorConfig { Memory(MemoryOptions), Shared(Arc<dyn crate::Coordinator>) }
#[derive(Clone, Debug)]
pub struct MemoryOptions { pub lease_ttl: Duration, pub dedup_window: Duration }
#[derive(Clone)]
pub struct CoordinationConfig { pub coordinator: CoordinatorConfig, pub turn_wait: Duration }
impl CoordinationConfig {
    pub fn new(c: CoordinatorConfig) -> Self { CoordinationConfig { coordinator: c, turn_wait: Duration::from_secs(120) } }
    pub fn with_turn_wait(mut self, d: Duration) -> Self { self.turn_wait = d; self }
    pub fn validate(&self) -> Result<(), String> { Ok(()) }
}
