//! The C ABI (feature `ffi`): bots, their configuration, their messages, C transports
//! with provider leadership and the metrics text, behind opaque handles, for C, C++
//! and `ctypes` hosts. The header is `include/botmesh.h`; build the library with
//! `cargo rustc --release --features ffi --crate-type cdylib --lib`.
//!
//! Shape (after `rure`, regex's C API, and `rustls-ffi`):
//!
//! - every object is an opaque pointer with a `_free` function (`NULL` is accepted and
//!   ignored); a string the library allocates for the host has `botmesh_string_free`;
//! - a function that can fail returns a `botmesh_status` and fills a caller-owned
//!   `botmesh_error` (which may be `NULL`) whose message `botmesh_error_message` reads;
//! - no panic crosses the boundary: each entry point catches it and returns
//!   `BOTMESH_PANIC` (or `NULL`);
//! - strings are NUL-terminated UTF-8; strings handed to a callback live until it
//!   returns;
//! - callbacks get the `void *user_data` they were registered with; a C transport is
//!   a struct of function pointers (`botmesh_provider`), adapted to [`Provider`](crate::Provider) so
//!   that the Rust leadership machinery runs it unchanged.
//!
//! The handler runs on the bot's worker threads, so it and its `user_data` must be
//! safe to call from several threads at once; the header says which thread calls each
//! callback.

#![allow(unsafe_code)]

mod base;
mod bot;
mod provider;
mod status;

pub use base::{
    BotmeshConfig, BotmeshContext, BotmeshError, BotmeshHandler, BotmeshOutcome, BotmeshSend,
};
pub use bot::{BotmeshBot, BotmeshBuilder};
pub use provider::{BotmeshProvider, BotmeshSession};
pub use status::*;
