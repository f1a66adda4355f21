//! What a conversation checkpoint holds, and why one cannot be resumed.

use serde::{Deserialize, Serialize};

use crate::flow::State;

/// The checkpoint format this crate writes and reads. A checkpoint of another format
/// is "cannot be resumed" (the `fallback` policy applies).
pub(crate) const FORMAT: u32 = 1;

/// Where a conversation stands between steps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum At {
    /// About to run `step` (or stopped while running it: it runs again).
    Run,
    /// `step` is an `ask` whose prompt was sent; the next message answers it.
    Ask,
    /// Sleeping until `wake_at_ms` (wall clock, ms since the Unix epoch); `step` is the
    /// one after the delay.
    Delay {
        /// When to go on.
        wake_at_ms: u64,
    },
}

/// A conversation: the checkpoint's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Conversation {
    pub(crate) flow: String,
    pub(crate) version: u32,
    pub(crate) step: usize,
    pub(crate) at: At,
    pub(crate) state: State,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) format: u32,
    #[serde(flatten)]
    pub(crate) conversation: Conversation,
}

/// Why a checkpoint cannot be resumed here.
#[derive(Debug)]
pub(crate) enum Unresumable {
    /// Unreadable; `flow` is its flow's name when that much could be read.
    Parse {
        error: String,
        flow: Option<String>,
    },
    Format {
        format: u32,
        flow: Option<String>,
    },
    UnknownFlow(String),
    Version {
        flow: String,
        saved: u32,
        have: u32,
    },
    Step {
        flow: String,
        step: usize,
    },
}

impl Unresumable {
    /// The checkpoint's flow, when it could be read.
    pub(crate) fn flow(&self) -> Option<&str> {
        match self {
            Unresumable::Parse { flow, .. } | Unresumable::Format { flow, .. } => flow.as_deref(),
            Unresumable::UnknownFlow(flow)
            | Unresumable::Version { flow, .. }
            | Unresumable::Step { flow, .. } => Some(flow),
        }
    }
}

impl std::fmt::Display for Unresumable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unresumable::Parse { error, .. } => write!(f, "it does not parse ({error})"),
            Unresumable::Format { format, .. } => {
                write!(f, "its format version {format} is unknown")
            }
            Unresumable::UnknownFlow(name) => {
                write!(f, "its flow {name:?} is not registered on this replica")
            }
            Unresumable::Version { flow, saved, have } => write!(
                f,
                "it was saved by version {saved} of flow {flow:?}, this replica has version {have}"
            ),
            Unresumable::Step { flow, step } => {
                write!(f, "flow {flow:?} has no step {step}")
            }
        }
    }
}
