//! # botmesh
//!
//! Run a chatbot as N replicas safely, on plain threads, with no async runtime.
//!
//! A bot scaled to several processes breaks in three ways; botmesh answers each:
//!
//! - **Turns.** Two replicas must never handle one chat at once or out of order. Each
//!   chat has a *turn*: a FIFO queue of its messages across all replicas, and a leased
//!   lock held by one message at a time. Every grant carries a *fencing token*
//!   (Kleppmann, "How to do distributed locking", 2016), strictly increasing per chat,
//!   that stores can use to refuse a deposed holder's writes.
//! - **Leases.** A held turn is a lease with a TTL, renewed for all chats of a replica
//!   in one coordinator call per tick by one thread. A replica that dies frees its
//!   chats within the TTL (Gray and Cheriton, "Leases", 1989).
//! - **Provider leadership.** A transport that allows one live session (WhatsApp Web,
//!   Telegram long polling) is run by one replica at a time: the holder of the lease
//!   `provider:<id>`, a turn on a reserved name. The others stand by and take over
//!   when it stops (at once), crashes (within the TTL and one re-check) or steps down
//!   because its transport stayed closed; see [`provider`].
//! - **Backends.** [`MemoryCoordinator`] for one process (and for tests: replicas as
//!   threads, crashes included); `RedisCoordinator` (module [`redis`], feature
//!   `redis`, on by default) for replicas in many processes and machines; other
//!   backends implement [`Coordinator`], and the crate's conformance suite (in
//!   `tests/`) checks them against the same contract.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use botmesh::{Bot, CoordinationConfig, CoordinatorConfig, MemoryCoordinator, Message};
//!
//! // Two replicas in one process share one coordinator.
//! let coordinator = Arc::new(MemoryCoordinator::new());
//! let handled = Arc::new(AtomicUsize::new(0));
//! let replicas: Vec<Bot> = ["r1", "r2"]
//!     .into_iter()
//!     .map(|id| {
//!         let handled = handled.clone();
//!         Bot::builder()
//!             .id(id)
//!             .coordination(CoordinationConfig::new(CoordinatorConfig::Shared(coordinator.clone())))
//!             .handler(move |ctx| {
//!                 assert!(!ctx.turn().is_lost());
//!                 handled.fetch_add(1, Ordering::Relaxed);
//!                 Ok(())
//!             })
//!             .build()
//!     })
//!     .collect::<Result<_, _>>()
//!     .unwrap();
//! // A load balancer spreads one chat's messages over both replicas; they still run
//! // one at a time and in order.
//! for i in 0..10 {
//!     let msg = Message::new("chat-42", format!("message {i}")).with_id(i.to_string());
//!     replicas[i % 2].intake().deliver(msg).unwrap();
//! }
//! for bot in replicas {
//!     bot.shutdown();
//! }
//! assert_eq!(handled.load(Ordering::Relaxed), 10);
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![deny(clippy::unwrap_used)]

pub mod config;
mod conversation;
pub mod coordinator;
mod error;
#[cfg(feature = "ffi")]
pub mod ffi;
pub mod flow;
mod leadership;
pub mod lease;
pub mod memory;
mod message;
mod metrics;
pub mod provider;
#[cfg(feature = "redis")]
pub mod redis;
pub mod replica;
pub mod runtime;
pub mod turn;

pub use config::{
    ConfigError, CoordinationConfig, CoordinatorConfig, FallbackPolicy, FlowsPolicy,
    HandoverConfig, MemoryOptions, ProviderSession,
};
pub use coordinator::{BackendError, Coordinator, Grant, Previous, ReplicaId, Ticket, Token};
pub use error::{CoordinationUnavailableError, Error, HandlerError, Reason};
pub use flow::{Answer, Cancelled, Capture, Flow, State, StepContext};
pub use memory::MemoryCoordinator;
pub use message::{Message, Outcome};
pub use metrics::{MetricsSnapshot, WAIT_BUCKETS};
pub use provider::{
    Capabilities, CloseReason, Provider, ProviderError, Session, Status, StatusSender,
};
pub use replica::{Accepted, Replica};
pub use runtime::{Bot, BotBuilder, Context, Intake, StartError};
pub use turn::Turn;

/// The README's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
