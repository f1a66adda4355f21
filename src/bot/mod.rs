//! The bot runtime.
//!
//! Parts, from the bottom: `context.rs` (what a handler sees), `workers.rs` (the
//! scheduler and the workers, with the flows glue), `handle.rs` ([`Bot`] and its
//! stops), `builder.rs` (checks the settings and starts the threads).

mod builder;
mod context;
mod handle;
mod workers;

pub use builder::{BotBuilder, DEFAULT_WORKERS, StartError};
pub use context::{Context, ErrorHook, Handler, OutcomeHook};
pub use handle::{Bot, StopError};
