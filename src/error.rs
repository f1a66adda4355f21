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
    /// The message breaks an input limit (an empty or over-long chat id or message
    /// id; see [`MAX_CHAT_ID_BYTES`](crate::MAX_CHAT_ID_BYTES) and
    /// [`MAX_MESSAGE_ID_BYTES`](crate::MAX_MESSAGE_ID_BYTES)); it was refused at
    /// intake and never taken in. `detail` names the field and the limit. Sending it
    /// again cannot help: fix the input.
    Invalid,
}

impl Reason {
    /// The reason as written in logs and JSON: `timeout`, `lost`, `backend`,
    /// `shutting_down`, `invalid`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Timeout => "timeout",
            Reason::Lost => "lost",
            Reason::Backend => "backend",
            Reason::ShuttingDown => "shutting_down",
            Reason::Invalid => "invalid",
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
///
/// What a host should do with a dropped message, by `reason` and `handler_started`:
///
/// | reason | `handler_started` | what ran | what to do |
/// | --- | --- | --- | --- |
/// | `timeout`, `shutting_down`, `backend` at intake | false | nothing | redeliver: when `deliver` returned the error, the platform's retry does it (answer non-2xx); when it came later through the hooks, the platform already got its 2xx, so redeliver it yourself (a redelivery with the same id is not a duplicate) |
/// | `lost` | false | nothing: the lease was gone before the handler was called | redeliver it yourself from the hook (the platform saw it accepted) |
/// | `lost` | true | the handler ran to its end, but the lease was found lost when the turn was released: its replies may be out, and another replica may have run later messages of the chat meanwhile | redeliver only if the handler is idempotent (fencing tokens refuse its stale writes); otherwise log it |
/// | `backend` | true | the handler ran; the release could not reach the coordinator (the lease lapses by TTL) | as for `lost` with the handler started |
/// | `invalid` | false | nothing: refused at intake | fix the input; a retry fails the same way |
///
/// The lock API ([`Replica::acquire`](crate::Replica::acquire) and its kin) reports
/// through the same type: `timeout` when the wait of `acquire_timeout` passed (or, for
/// `try_acquire`, the chat was held), `invalid` for an empty or over-long chat id,
/// `shutting_down` and `backend` as above; [`Turn::release`](crate::Turn::release)
/// reports `lost` or `backend` with `handler_started` set, since the holder's work ran.
/// (`invalid` is not about the coordinator: the one type keeps every refusal in one
/// place, named by its `reason`.)
///
/// Constructed only by the crate (`#[non_exhaustive]`): read its fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CoordinationUnavailableError {
    /// Why.
    pub reason: Reason,
    /// The chat id: whole, so the host can act on it (for `invalid`, cut to its first
    /// 64 characters). The `Display` text cuts any id to 64 characters, so a huge id
    /// does not flood the log.
    pub chat: String,
    /// The message id, when the message had one (cut like `chat` for `invalid`).
    pub message_id: Option<String>,
    /// The backend failure behind a `backend` (or some `lost`) report.
    pub source: Option<BackendError>,
    /// Whether the message's handling (the handler, or a flow's capture and steps) had
    /// started before the message was dropped: its effects and replies may be out. See
    /// the table above for what a host should do in each case.
    pub handler_started: bool,
    /// For `invalid`: which field broke which limit, as in the `Display` text.
    pub detail: Option<String>,
}

/// The longest chat or message id an `invalid` error carries, and any error's
/// `Display` text shows, in characters.
const SHOWN_ID_CHARS: usize = 64;

pub(crate) fn shown_id(id: &str) -> String {
    match id.char_indices().nth(SHOWN_ID_CHARS) {
        Some((cut, _)) => format!("{}…", &id[..cut]),
        None => id.to_owned(),
    }
}

impl CoordinationUnavailableError {
    pub(crate) fn new(reason: Reason, chat: &str, message_id: Option<&str>) -> Self {
        CoordinationUnavailableError {
            reason,
            chat: chat.to_owned(),
            message_id: message_id.map(str::to_owned),
            source: None,
            handler_started: false,
            detail: None,
        }
    }

    /// An `invalid` refusal at intake; `detail` names the field and the limit.
    pub(crate) fn invalid(chat: &str, message_id: Option<&str>, detail: String) -> Self {
        CoordinationUnavailableError {
            reason: Reason::Invalid,
            chat: shown_id(chat),
            message_id: message_id.map(shown_id),
            source: None,
            handler_started: false,
            detail: Some(detail),
        }
    }

    pub(crate) fn with_source(mut self, source: BackendError) -> Self {
        self.source = Some(source);
        self
    }

    /// Marks that the message's handling had started (see `handler_started`).
    pub(crate) fn after_handler(mut self) -> Self {
        self.handler_started = true;
        self
    }
}

impl fmt::Display for CoordinationUnavailableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let chat = shown_id(&self.chat);
        let what = match &self.message_id {
            Some(id) => format!("message {:?} of chat {chat:?}", shown_id(id)),
            None => format!("work on chat {chat:?}"),
        };
        if self.reason == Reason::Invalid {
            let detail = self
                .detail
                .as_deref()
                .unwrap_or("an input limit was broken");
            return write!(f, "{what} was refused: {detail}");
        }
        let why = match (self.reason, self.handler_started) {
            (Reason::Timeout, _) => {
                "the chat's turn did not come within the allowed wait (the bot's turn_wait, the \
                 timeout given to Replica::acquire_timeout, or none for Replica::try_acquire)"
            }
            (Reason::Lost, false) => {
                "the chat's turn was lost before its work started (its lease expired or was taken \
                 over, the backend lost its ticket, as Redis restarted without persistence does, \
                 or the replica stopped)"
            }
            (Reason::Lost, true) => {
                "the chat's turn was lost while it was held (its lease expired or was taken over, \
                 the backend lost it, or the replica stopped); the work under it had started, so \
                 its effects (replies) may be out"
            }
            (Reason::Backend, false) => "the coordinator could not be reached",
            (Reason::Backend, true) => {
                "the coordinator could not be reached to release the turn; the work under it \
                 had started, so its effects (replies) may be out"
            }
            (Reason::ShuttingDown, _) => "the replica was shutting down",
            (Reason::Invalid, _) => "an input limit was broken",
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
