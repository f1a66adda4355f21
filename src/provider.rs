//! Providers: the transports that bring messages in and take replies out.

use std::fmt;

use crate::runtime::Intake;

/// What a provider's transport allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Only one live session may exist at a time (WhatsApp Web, Telegram long
    /// polling): two replicas connecting kick each other off.
    pub exclusive_session: bool,
}

/// A provider failed to start, stop or send.
#[derive(Debug, Clone)]
pub struct ProviderError(pub String);

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProviderError {}

/// A transport: it delivers incoming messages to an [`Intake`] and sends replies.
///
/// `start` must not block for long: a provider that polls runs its own thread and
/// calls [`Intake::deliver`] from it, one chat's messages in order.
pub trait Provider: Send + Sync {
    /// A stable id, unique among the bot's providers (used in logs and, for exclusive
    /// transports, in the leadership lease name `provider:<id>`).
    fn id(&self) -> &str;

    /// What the transport allows; by default a shared session.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Connects and starts delivering messages to `intake`.
    ///
    /// # Errors
    /// [`ProviderError`] when the transport cannot start; the bot does not start then.
    fn start(&self, intake: Intake) -> Result<(), ProviderError>;

    /// Disconnects; no message is delivered after it returns.
    fn stop(&self);

    /// Sends a text to a chat.
    ///
    /// # Errors
    /// [`ProviderError`] when the transport refuses or fails.
    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError>;
}
