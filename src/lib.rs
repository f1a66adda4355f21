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
//!   because its transport stayed closed; see [`Provider`].
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
//!
//! # Layout
//!
//! Each module has one job and uses only the modules listed above it here (no
//! import cycles; `tests/layout.rs` checks it):
//!
//! | layer | modules | job |
//! | --- | --- | --- |
//! | 1 | `clock`, `coordinator` | the time source; the backend contract and its shared constants |
//! | 2 | `error`, `message`, `metrics`, `timer` | errors, messages and outcomes, counters, the one timer |
//! | 3 | `memory/`, `redis/` | the backends (the memory backend's decisions are a pure table) |
//! | 4 | `config/` | settings, loaded and checked |
//! | 5 | `replica/` | the client side of the turn protocol: tickets, waiters, leases, renewal |
//! | 6 | `intake` | where messages enter a bot |
//! | 7 | `provider/` | transports and provider leadership |
//! | 8 | `flow/` | the flow builder and what a step sees |
//! | 9 | `conversation/` | the flow engine: routing, steps, checkpoints, handover |
//! | 10 | `bot/` | the runtime: builder, scheduler, workers, handler context |
//! | 11 | `telegram/` | the Telegram Bot API transport (feature `telegram`): long polling, webhooks, replies |
//! | 12 | `ffi` | the C ABI (feature `ffi`) |
//!
//! Every public type has one path: the crate root. Only the Redis backend and the
//! Telegram transport keep a namespace of their own (`redis`, `telegram`), for their
//! options and types.
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![deny(clippy::unwrap_used)]

mod clock;
mod coordinator;

mod error;
mod message;
mod metrics;
mod timer;

mod memory;
#[cfg(feature = "redis")]
pub mod redis;

mod config;

mod replica;

mod intake;

mod provider;

mod flow;

mod conversation;

mod bot;

#[cfg(feature = "telegram")]
pub mod telegram;

#[cfg(feature = "ffi")]
pub mod ffi;

pub use bot::{
    Bot, BotBuilder, Context, DEFAULT_WORKERS, ErrorHook, Handler, OutcomeHook, StartError,
    StopError,
};
pub use clock::Clock;
pub use config::{
    ConfigError, CoordinationConfig, CoordinatorConfig, FallbackPolicy, FlowsPolicy,
    HandoverConfig, MemoryOptions, ProviderSession,
};
pub use coordinator::{
    BackendError, CHECKPOINT_TTL, ChatView, Coordinator, DEFAULT_DEDUP_IDS, DEFAULT_DEDUP_WINDOW,
    DEFAULT_LEASE_TTL, EnqueueRequest, Enqueued, Grant, GrantSink, HISTORY, HeldLease, HolderView,
    LeaderView, MAX_DEDUP_IDS, MeshView, Previous, Released, Renewal, ReplicaId, Ticket,
    TicketState, Token, Waiting,
};
pub use error::{CoordinationUnavailableError, Error, HandlerError, Reason};
pub use flow::{Answer, Cancelled, Capture, Flow, State, StepContext};
pub use intake::Intake;
pub use memory::MemoryCoordinator;
pub use memory::capacity::MAX_CHAT_CAPACITY;
pub use message::{
    MAX_CHAT_ID_BYTES, MAX_MESSAGE_ID_BYTES, MAX_REPLICA_ID_BYTES, Message, Outcome,
};
pub use metrics::{MetricsSnapshot, WAIT_BUCKETS};
pub use provider::{
    ButtonAction, Capabilities, CloseReason, Fence, InlineButton, Keyboard, Provider,
    ProviderError, Reply, Session, Status, StatusSender,
};
pub use replica::{Accepted, Replica, Turn};

/// The README's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
