//! The numeric codes of the C API, written once. `include/botmesh.h` is hand-written
//! (it carries the documentation C users read) and restates them; `tests/ffi.rs`
//! parses it and fails on any name or value that differs from the tables here.

use std::ffi::c_int;

/// Declares each code as a `pub const` and lists them all in `$table`, so the consts
/// and the table the header is checked against cannot drift apart.
macro_rules! codes {
    ($(#[$table_doc:meta])* $table:ident { $($(#[$doc:meta])* $name:ident = $value:literal,)* }) => {
        $($(#[$doc])* pub const $name: c_int = $value;)*
        $(#[$table_doc])*
        pub const $table: &[(&str, c_int)] = &[$((stringify!($name), $name),)*];
    };
}

codes! {
    /// Every `botmesh_status` code, as (name in `botmesh.h`, value).
    STATUS_CODES {
        /// Status codes of the C API (`botmesh_status`): done.
        BOTMESH_OK = 0,
        /// An argument was invalid (a NULL where a value is needed, a string that is
        /// not UTF-8, zero workers).
        BOTMESH_INVALID = 1,
        /// The configuration was refused; the message names the field and the value.
        BOTMESH_CONFIG = 2,
        /// The coordinator could not be reached.
        BOTMESH_BACKEND = 3,
        /// The bot is shutting down and took nothing in.
        BOTMESH_SHUTTING_DOWN = 4,
        /// The message was a duplicate of one seen within the dedup window (not an
        /// error).
        BOTMESH_DUPLICATE = 5,
        /// The transport refused or failed (a reply).
        BOTMESH_SEND_FAILED = 6,
        /// Rust code panicked; the message says where. Nothing was unwound into C.
        BOTMESH_PANIC = 7,
        /// A transport started when the bot was built (shared mode, or no
        /// coordination) failed to start; the bot was not started.
        BOTMESH_PROVIDER = 8,
    }
}

codes! {
    /// Every outcome code the outcome callback hears, as (name in `botmesh.h`, value).
    OUTCOME_CODES {
        /// How a message ended, as the outcome callback hears it: the handler returned 0.
        BOTMESH_OUTCOME_HANDLED = 0,
        /// The handler returned non-zero (or panicked); the message counts as ended and
        /// its id as seen.
        BOTMESH_OUTCOME_FAILED = 1,
        /// It did not run: its wait for the chat's turn ran out, its lease was lost, the
        /// coordinator failed, or the bot stopped.
        BOTMESH_OUTCOME_DROPPED = 2,
        /// A duplicate of a message id seen recently.
        BOTMESH_OUTCOME_DUPLICATE = 3,
    }
}

codes! {
    /// Every session status a C transport reports with `botmesh_session_report`, as
    /// (name in `botmesh.h`, value).
    SESSION_CODES {
        /// Connecting or reconnecting (`Status::Connecting`): does not end a closed
        /// period.
        BOTMESH_SESSION_CONNECTING = 0,
        /// The session is live: messages flow (`Status::Open`).
        BOTMESH_SESSION_OPEN = 1,
        /// Closed because another session of the account connected (WhatsApp's
        /// "replaced", Telegram's `409 Conflict`): counted as a provider conflict.
        BOTMESH_SESSION_REPLACED = 2,
        /// Closed because the platform refused this session's fencing token: this
        /// replica was deposed.
        BOTMESH_SESSION_FENCED = 3,
        /// Logged out or credentials revoked.
        BOTMESH_SESSION_LOGGED_OUT = 4,
        /// Closed for any other reason (the detail text says which).
        BOTMESH_SESSION_CLOSED = 5,
    }
}
