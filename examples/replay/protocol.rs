//! The line protocol between the platform (the parent process) and a replica process
//! (`--processes`): one JSON object a line, over the replica's stdin and stdout.
//!
//! Parent → replica (stdin):
//!
//! ```text
//! {"op":"deliver","index":17,"update_id":8,"chat":"-1003219","message_id":3,"text":"hi","date":1612345678}
//! ```
//!
//! `index` is the update's place in the parent's trace; every answer names it. Closing
//! stdin asks the replica to stop cleanly (`Bot::shutdown`: everything it accepted
//! ends first).
//!
//! Replica → parent (stdout):
//!
//! ```text
//! {"type":"ready","replica":"r2","pid":4242}           connected, bot running
//! {"type":"accepted","index":17}                       deliver returned: queued
//! {"type":"duplicate","index":17}                      deliver returned: duplicate
//! {"type":"refused","index":17,"reason":"backend"}     deliver failed: not taken in
//! {"type":"ended","index":17,"event":"handled","replica":"r2","fence":9,"start_us":…,"end_us":…,"waited_ns":…}
//! {"type":"ended","index":17,"event":"dropped","reason":"timeout"}
//! {"type":"ended","index":17,"event":"duplicate"}
//! {"type":"ended","index":17,"event":"failed","error":"…"}
//! {"type":"stopped","handovers":1234}                  after shutdown, just before exit
//! ```
//!
//! `ended` comes from the bot's outcome hook, once per accepted update. For a duplicate
//! the hook runs inside `deliver`, so its `ended` line may come before the `duplicate`
//! answer. `start_us`/`end_us` are the handler's start and end in µs of the system
//! clock (one clock for every process of the host), so the parent can compare handler
//! intervals across processes.

use serde::{Deserialize, Serialize};

/// A line to a replica process.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToReplica {
    /// Take this update in (`bot.intake().deliver(...)`).
    Deliver {
        /// The update's index in the parent's trace.
        index: usize,
        /// The Telegram `update_id`.
        update_id: i64,
        /// The chat id.
        chat: String,
        /// The message id (the dedup key and the order the chat's handlers follow).
        message_id: i64,
        /// The message text.
        text: String,
        /// The original send time, Unix seconds.
        date: i64,
    },
}

/// A line from a replica process.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromReplica {
    /// The replica is connected and its bot runs.
    Ready {
        /// Its replica id.
        replica: String,
        /// Its process id.
        pid: u32,
    },
    /// `deliver` returned: the update holds its place in its chat's queue.
    Accepted {
        /// The update's index.
        index: usize,
    },
    /// `deliver` returned: the message id was a duplicate.
    Duplicate {
        /// The update's index.
        index: usize,
    },
    /// `deliver` failed: the update was not taken in, no `ended` follows.
    Refused {
        /// The update's index.
        index: usize,
        /// Why (`backend`, `shutting_down`).
        reason: String,
    },
    /// The outcome hook reported how an accepted update ended.
    Ended {
        /// The update's index.
        index: usize,
        /// How.
        #[serde(flatten)]
        how: Ended,
    },
    /// The bot stopped; the process exits next.
    Stopped {
        /// Grants whose previous holder was another replica.
        handovers: u64,
    },
}

/// How an update ended in a replica process.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Ended {
    /// The handler ran under the chat's turn.
    Handled {
        /// The replica id.
        replica: String,
        /// The turn's fencing token.
        fence: u64,
        /// Handler start, µs since the Unix epoch.
        start_us: u64,
        /// Handler end, µs since the Unix epoch.
        end_us: u64,
        /// How long it waited for the turn, ns.
        waited_ns: u64,
    },
    /// Not handled, with botmesh's reason.
    Dropped {
        /// `timeout`, `lost`, `backend` or `shutting_down`.
        reason: String,
    },
    /// A second delivery of a message id that was skipped.
    Duplicate,
    /// The handler returned an error or panicked.
    Failed {
        /// The error text.
        error: String,
    },
}
