//! The bot runtime: intake, the local turn table that schedules workers, and hooks.
//!
//! A message goes through three stages:
//!
//! 1. **Intake** ([`Intake::deliver`](crate::Intake::deliver), called by a provider or
//!    a webhook handler): the message gets a ticket in its chat's queue at the
//!    coordinator. The call returns when the ticket is placed, so the message's place
//!    in its chat's order is fixed before the platform is told "accepted".
//! 2. **Waiting**: the ticket waits for its grant without holding any thread; the
//!    grant (pushed by a release, or found by the re-check) moves the message to the
//!    ready queue.
//! 3. **Running**: one of the W workers, all blocked on one condition variable, takes
//!    the next ready message, runs the handler under the turn, and releases the turn,
//!    which hands the chat to its next waiter.
//!
//! Every accepted message ends exactly once, as an [`Outcome`](crate::Outcome):
//! handled, failed, dropped (reported through the error hook and the log), or a
//! duplicate.
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
pub use handle::Bot;
