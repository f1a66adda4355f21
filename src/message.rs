//! Messages taken in by a bot, and how each one ended.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::coordinator::Token;
use crate::error::CoordinationUnavailableError;

/// One incoming message of one chat.
///
/// ```
/// let m = botmesh::Message::new("-1005176", "hello").with_id("3");
/// assert_eq!(m.chat, "-1005176");
/// ```
#[derive(Clone)]
pub struct Message {
    /// The chat id: any UTF-8 string. Messages of one chat run one at a time, in order.
    pub chat: String,
    /// The platform's message id, used to suppress duplicates (webhook retries). Ids
    /// only need to be unique within their chat. `None` turns the check off.
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
    Dropped(CoordinationUnavailableError),
    /// Its id was seen within the dedup window; it did not run again.
    Duplicate,
}
