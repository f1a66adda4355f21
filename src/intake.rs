//! `Intake`: where messages enter a bot, from a provider or a webhook handler.
//!
//! It sits below the providers (which are handed one) and above the replica: the
//! bot's scheduler implements [`Admit`], so a provider can deliver without knowing
//! the bot.

use std::sync::Arc;

use crate::coordinator::ReplicaId;
use crate::error::CoordinationUnavailableError;
use crate::message::Message;
use crate::replica::Accepted;

thread_local! {
    /// The bot whose own code runs on this thread right now (its worker, or a hook or
    /// provider callback it called), as [`Intake::bot_key`]; 0 for none. A stop
    /// called from there would wait for itself, so it is refused instead.
    static RUNNING_FOR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as running the bot `key`'s code until dropped (nests).
pub(crate) struct InBot(usize);

impl InBot {
    pub(crate) fn enter(key: usize) -> InBot {
        InBot(RUNNING_FOR.replace(key))
    }
}

impl Drop for InBot {
    fn drop(&mut self) {
        RUNNING_FOR.set(self.0);
    }
}

/// Whether this thread runs the bot `key`'s code (see [`InBot`]).
pub(crate) fn running_for(key: usize) -> bool {
    key != 0 && RUNNING_FOR.get() == key
}

/// What takes a message in: the bot's scheduler.
pub(crate) trait Admit: Send + Sync {
    /// See [`Intake::deliver`].
    fn admit(self: Arc<Self>, message: Message) -> Result<Accepted, CoordinationUnavailableError>;
}

/// A cloneable handle that takes messages into a bot (what a webhook or provider
/// calls).
#[derive(Clone)]
pub struct Intake {
    /// The bot's scheduler.
    admit: Arc<dyn Admit>,
    /// For logs and [`Intake::replica`].
    replica: ReplicaId,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("replica", &self.replica)
            .finish()
    }
}

impl Intake {
    pub(crate) fn new(admit: Arc<dyn Admit>, replica: ReplicaId) -> Self {
        Intake { admit, replica }
    }

    /// Takes a message in. Returns once the message holds its place in its chat's
    /// queue (so a webhook may answer 200 then); the handler runs later on a worker,
    /// and the outcome hook hears how it ended.
    ///
    /// # Errors
    /// [`CoordinationUnavailableError`] with reason `backend` when the coordinator
    /// cannot be reached, `shutting_down` when the bot is stopping: the message was not
    /// taken in, and the caller should answer the platform with an error so it
    /// retries. Reason `invalid` when the message cannot be taken in as it is (an
    /// empty or over-long chat id or message id): a retry fails the same way.
    pub fn deliver(&self, message: Message) -> Result<Accepted, CoordinationUnavailableError> {
        self.admit.clone().admit(message)
    }

    /// Names the bot this intake feeds, for [`InBot`]: the address of its scheduler.
    pub(crate) fn bot_key(&self) -> usize {
        Arc::as_ptr(&self.admit) as *const u8 as usize
    }

    /// The id of the replica this intake feeds.
    pub fn replica(&self) -> &str {
        &self.replica
    }
}
