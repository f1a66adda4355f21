//! Messages taken in by a bot, and how each one ended.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::coordinator::Token;
use crate::error::CoordinationUnavailableError;

/// The longest chat id taken in, in bytes of UTF-8: 4 KiB, as SPEC §3 promises. A
/// longer (or an empty) chat id is refused at intake with reason
/// [`Invalid`](crate::Reason::Invalid): every chat id is part of several keys at the
/// coordinator, so an unbounded one would make unbounded keys.
pub const MAX_CHAT_ID_BYTES: usize = 4096;

/// The longest message id taken in, in bytes of UTF-8: 1 KiB. Platform ids are far
/// shorter (Telegram's are integers, WhatsApp's about 30 characters); the bound keeps
/// the duplicate-suppression keys small. A longer (or an empty) id is refused at
/// intake with reason [`Invalid`](crate::Reason::Invalid); leave the id unset to turn
/// duplicate suppression off.
pub const MAX_MESSAGE_ID_BYTES: usize = 1024;

/// The longest replica id a replica starts with, in bytes of UTF-8: 512 (a
/// Kubernetes pod name, at most 253, with room for a suffix). A replica's id is part
/// of every ticket and lease it holds at the coordinator, so an unbounded one would
/// make every chat's state unbounded; `Replica::start` and `Bot::build` refuse a
/// longer one. Short ids cost least (see the README's *Across processes: Redis*).
pub const MAX_REPLICA_ID_BYTES: usize = 512;

/// Checks a replica id: non-empty, no NUL, at most [`MAX_REPLICA_ID_BYTES`]; the text
/// names the field and shows the id cut to 64 characters.
pub(crate) fn check_replica_id(id: &str) -> Result<(), String> {
    let shown = crate::error::shown_id(id);
    if id.is_empty() || id.contains('\0') {
        return Err(format!(
            "replica id {shown:?} must be non-empty and free of NUL characters"
        ));
    }
    if id.len() > MAX_REPLICA_ID_BYTES {
        return Err(format!(
            "replica id {shown:?} is {} bytes, over the {MAX_REPLICA_ID_BYTES}-byte maximum \
             (MAX_REPLICA_ID_BYTES)",
            id.len()
        ));
    }
    Ok(())
}

/// Checks a chat id and message id against the limits above; the text names the
/// field, the size and the limit.
pub(crate) fn check_ids(chat: &str, id: Option<&str>) -> Result<(), String> {
    if chat.is_empty() {
        return Err("chat: the chat id is empty; every message needs its chat's id".into());
    }
    if chat.len() > MAX_CHAT_ID_BYTES {
        return Err(format!(
            "chat: the chat id is {} bytes, over the {MAX_CHAT_ID_BYTES}-byte maximum \
             (MAX_CHAT_ID_BYTES)",
            chat.len()
        ));
    }
    match id {
        Some("") => Err(
            "message id: the message id is empty; leave it unset (None) to \
             turn duplicate suppression off"
                .into(),
        ),
        Some(id) if id.len() > MAX_MESSAGE_ID_BYTES => Err(format!(
            "message id: the message id is {} bytes, over the {MAX_MESSAGE_ID_BYTES}-byte \
             maximum (MAX_MESSAGE_ID_BYTES)",
            id.len()
        )),
        _ => Ok(()),
    }
}

/// One incoming message of one chat.
///
/// ```
/// let m = botmesh::Message::new("-1005176", "hello").with_id("3");
/// assert_eq!(m.chat, "-1005176");
/// ```
#[derive(Clone)]
pub struct Message {
    /// The chat id: any non-empty UTF-8 string of at most [`MAX_CHAT_ID_BYTES`].
    /// Messages of one chat run one at a time, in order.
    pub chat: String,
    /// The platform's message id, used to suppress duplicates (webhook retries). Ids
    /// only need to be unique within their chat. `None` turns the check off; an empty
    /// id, or one over [`MAX_MESSAGE_ID_BYTES`], is refused at intake.
    pub id: Option<String>,
    /// The text.
    pub text: String,
    /// Anything the caller wants to carry to the handler (the raw update, a C pointer
    /// wrapped in a `Send + Sync` type…).
    pub payload: Option<Arc<dyn Any + Send + Sync>>,
}

impl Message {
    /// A message with a chat id and a text, no id and no payload.
    pub fn new(chat: impl Into<String>, text: impl Into<String>) -> Self {
        Message {
            chat: chat.into(),
            id: None,
            text: text.into(),
            payload: None,
        }
    }

    /// Sets the message id (for duplicate suppression).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Attaches a payload for the handler; read it back with
    /// [`Message::payload`].
    pub fn with_payload<T: Any + Send + Sync>(mut self, payload: T) -> Self {
        self.payload = Some(Arc::new(payload));
        self
    }

    /// The payload, if one of type `T` was attached.
    pub fn payload<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.payload.as_deref().and_then(|p| p.downcast_ref())
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("chat", &self.chat)
            .field("id", &self.id)
            .field("text_len", &self.text.len())
            .finish_non_exhaustive()
    }
}

/// How a message that was taken in ended. Every accepted message ends exactly once.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran under the chat's turn and the turn was released cleanly.
    Handled {
        /// The fencing token of the turn it ran under.
        token: Token,
        /// How long it waited for the turn.
        waited: Duration,
    },
    /// The handler ran but returned an error or panicked (the text says which).
    Failed(String),
    /// It could not run, or its turn was lost while it ran: reported to the error hook.
    /// [`CoordinationUnavailableError::handler_started`] tells which, and its docs say
    /// what a host should do in each case.
    Dropped(CoordinationUnavailableError),
    /// Its id counts as handled in its chat (see
    /// [`Accepted::Duplicate`](crate::Accepted::Duplicate)); it did not run again.
    Duplicate,
}
