//! Coordination settings, loaded and checked; documented on [`CoordinationConfig`].
//!
//! Parts, from the bottom: `error` ([`ConfigError`]), `value` (a value as written,
//! for messages), `strict` (the strict map reader that names each field as spelled),
//! `duration` (the one duration type), `count` (the one count, `dedupIds`), `redis` (Redis options in files), `settings`
//! (the public types, defaults and checks), `choice` (modes and policies in files),
//! `file` (the file form, derived, and its conversion).

mod choice;
mod count;
mod duration;
mod error;
mod file;
#[cfg(feature = "redis")]
mod redis;
mod settings;
mod strict;
mod value;

pub use error::ConfigError;
pub use settings::{
    CoordinationConfig, CoordinatorConfig, FallbackPolicy, FlowsPolicy, HandoverConfig,
    MemoryOptions, ProviderSession,
};
