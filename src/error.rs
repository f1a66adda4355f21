//! Errors: why a message was not handled, and the crate's error type.

use std::fmt;

use crate::coordinator::BackendError;

/// Why a message could not be handled under its chat's turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The message waited longer than `turn_wait` for its chat's turn.
    Timeout,
    /// The turn's lease was lost while the message held it (renewal refused, or the
    /// backend unreachable for longer than the TTL).
    Lost,
    /// The coordinator could not be reached.
    Backend,
    /// The replica was stopping and the message could not run before it stopped.
    ShuttingDown,
}

impl Reason {
    /// The reason as written in logs and JSON: `timeout`, `lost`, `backend`,
    /// `shutting_down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Timeout => "timeout",
            Reason::Lost => "lost",
            Reason::Backend => "backend",
            Reason::ShuttingDown => "shutting_down",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A message that could not be handled under its chat's turn, reported once through
/// the bot's error hook and the log.
#[derive(Clone, Debug)]
pub struct CoordinationUnavailableError {
    /// Why.
    pub reason: Reason,
    /// The chat id.
    pub chat: String,
    /// The message id, when the message had one.
    pub message_id: Option<String>,
    /// The backend failure behind a `backend` (or some `lost`) report.
    pub source: Option<BackendError>,
}

impl CoordinationUnavailableError {
    pub(crate) fn new(reason: Reason, chat: &str, message_id: Option<&str>) -> Self {
        CoordinationUnavailableError {
            reason,
            chat: chat.to_owned(),
            message_id: message_id.map(str::to_owned),
            source: None,
        }
    }

    pub(crate) fn with_source(mut self, source: BackendError) -> Self {
        self.source = Some(source);
        self
    }
}

impl fmt::Display for CoordinationUnavailableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.message_id {
            Some(id) => format!("message {id:?} of chat {:?}", self.chat),
            None => format!("work on chat {:?}", self.chat),
        };
        let why = match self.reason {
            Reason::Timeout => "the chat's turn did not come within the allowed wait (turn_wait)",
            Reason::Lost => "the chat's turn was lost while it ran (lease expired or taken over)",
            Reason::Backend => "the coordinator could not be reached",
            Reason::ShuttingDown => "the replica was shutting down",
        };
        write!(f, "{what} was not handled: {why}")?;
        if let Some(source) = &self.source {
            write!(f, " ({source})")?;
        }
        Ok(())
    }
}

impl std::error::Error for CoordinationUnavailableError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The error a user handler may return; any error type converts into it with `?`.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// Everything the bot reports through its error hook.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A message was dropped: timeout, lost lease, backend down, shutting down.
    Coordination(CoordinationUnavailableError),
    /// A handler returned an error or panicked; the message counts as ended.
    Handler {
        /// The chat id.
        chat: String,
        /// The message id, when the message had one.
        message_id: Option<String>,
        /// What the handler returned, or the panic message.
        message: String,
    },
    /// A conversation step failed (an action returned an error or panicked, a capture
    /// panicked, a `goto` named no flow); the conversation ended.
    Flow {
        /// The chat id.
        chat: String,
        /// What failed, naming the flow and step.
        message: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Coordination(e) => e.fmt(f),
            Error::Handler {
                chat,
                message_id,
                message,
            } => match message_id {
                Some(id) => write!(
                    f,
                    "handler failed on message {id:?} of chat {chat:?}: {message}"
                ),
                None => write!(f, "handler failed on a message of chat {chat:?}: {message}"),
            },
            Error::Flow { chat, message } => {
                write!(f, "conversation of chat {chat:?} ended: {message}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Coordination(e) => Some(e),
            Error::Handler { .. } | Error::Flow { .. } => None,
        }
    }
}

/// The text of a caught panic, naming what panicked.
pub(crate) fn panic_text(what: &str, panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("{what} panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("{what} panicked: {s}")
    } else {
        format!("{what} panicked")
    }
}
