//! `Context`: what a handler sees.

use std::cell::RefCell;
use std::sync::Arc;

use crate::error::{Error, HandlerError};
use crate::message::{Message, Outcome};
use crate::provider::{Fence, Provider, ProviderError, Reply};
use crate::replica::Turn;

/// The message handler: runs once per message, under the chat's turn, on a worker.
pub type Handler = Arc<dyn Fn(&Context<'_>) -> Result<(), HandlerError> + Send + Sync>;
/// Called once for every error the bot reports (dropped messages, failed handlers).
pub type ErrorHook = Arc<dyn Fn(&Error) + Send + Sync>;
/// Called once for every accepted message when it ends, with how it ended.
pub type OutcomeHook = Arc<dyn Fn(&Message, &Outcome) + Send + Sync>;

/// What a handler sees: the message, its turn, and a way to reply.
pub struct Context<'a> {
    /// The message being handled.
    pub(super) message: &'a Message,
    /// The turn it runs under.
    pub(super) turn: &'a Turn,
    /// Where replies go (gated by the leadership in leader mode).
    pub(super) provider: Option<&'a Arc<dyn Provider>>,
    /// The flow the handler asked to start, run once it returns.
    pub(super) start: RefCell<Option<String>>,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("message", self.message)
            .field("turn", self.turn)
            .finish_non_exhaustive()
    }
}

impl Context<'_> {
    /// The message being handled.
    pub fn message(&self) -> &Message {
        self.message
    }

    /// The turn the message runs under (fencing token, lost flag, previous holder).
    pub fn turn(&self) -> &Turn {
        self.turn
    }

    /// Sends `text` to the message's chat through the bot's first provider.
    ///
    /// # Errors
    /// [`ProviderError`] when the bot has no provider, when the turn's lease was lost
    /// (a deposed holder must not speak for the chat), when the provider runs in
    /// leader mode and this replica does not hold a live leadership of it, or when the
    /// transport fails.
    pub fn reply(&self, text: &str) -> Result<(), ProviderError> {
        self.reply_with(&Reply::new(text))
    }

    /// Sends a [`Reply`] (a text with an optional keyboard) to the message's chat,
    /// fenced by the turn: a transport that retries (rate limits, server errors) stops
    /// retrying once the turn's lease is lost.
    ///
    /// # Errors
    /// As [`Context::reply`].
    pub fn reply_with(&self, reply: &Reply) -> Result<(), ProviderError> {
        if self.turn.is_lost() {
            return Err(ProviderError(format!(
                "send refused: the turn on chat {:?} was lost",
                self.message.chat
            )));
        }
        let held = || !self.turn.is_lost();
        let fence = Fence::new(&held, Some(self.turn.fencing_token()));
        match self.provider {
            Some(p) => p.send_reply(&self.message.chat, reply, &fence),
            None => Err(ProviderError(
                "the bot has no provider or sender to send with".into(),
            )),
        }
    }

    /// Starts the flow named `name` for this chat once the handler returns (replacing
    /// any conversation the chat had); its steps run under this message's turn, up to
    /// their first wait, bounded by `settle`. The last call wins.
    ///
    /// An unknown name is reported through the error hook (the handler's message
    /// still counts as handled).
    pub fn start_flow(&self, name: &str) {
        *self.start.borrow_mut() = Some(name.to_owned());
    }
}
