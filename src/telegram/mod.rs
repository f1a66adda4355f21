//! A transport for the Telegram Bot API (feature `telegram`): long polling on the
//! leader replica, webhooks on every replica, `sendMessage` with keyboards.
//!
//! - **Long polling** ([`Telegram::long_polling`]) is an exclusive session: Telegram
//!   answers a second `getUpdates` poller with `409 Conflict`. The provider declares
//!   [`exclusive_session`](crate::Capabilities::exclusive_session), so under the
//!   default `auto` session mode only the leader replica polls (see
//!   [`Provider`] for the election). An update's offset is confirmed
//!   (by the next `getUpdates`) only once the intake took it in, so a new leader
//!   fetches again what the old one fetched and did not take in; the dedup window
//!   absorbs what both took (the update id is the message id). A `409` is reported as
//!   [`CloseReason::Replaced`](crate::CloseReason::Replaced): the runtime checks the
//!   leadership with one renewal and stops a deposed leader; the poller backs off.
//!   `429` waits its `retry_after`; network errors back off exponentially with jitter.
//! - **Webhooks** ([`Webhook`]): every replica serves the endpoint and delivers to its
//!   own intake; [`Webhook::handle`] answers `200` only once the update holds its
//!   place. Replies go out through [`Telegram::webhook`], a provider that only sends
//!   (shared session: every replica may send).
//! - **Replies** ([`Context::reply_with`](crate::Context::reply_with), flow prompts):
//!   `sendMessage` with `reply_markup` from a [`Keyboard`](crate::Keyboard). `429` and
//!   5xx are retried while the send's [`Fence`] stays live (the turn's lease is held,
//!   the step was not stopped) and within [`TelegramConfig::with_send_retry_for`]; a
//!   send whose fence reads stale is refused and not retried.
//!
//! ```no_run
//! use std::sync::Arc;
//! use botmesh::{Bot, CoordinationConfig, CoordinatorConfig, MemoryCoordinator};
//! use botmesh::telegram::{Telegram, TelegramConfig};
//!
//! let telegram = Telegram::long_polling(TelegramConfig::new("123456:ABC-your-token"))?;
//! let config = CoordinationConfig::new(CoordinatorConfig::Shared(Arc::new(MemoryCoordinator::new())));
//! let bot = Bot::builder()
//!     .coordination(config) // RedisCoordinator across processes: one of them polls
//!     .provider(Arc::new(telegram))
//!     .handler(|ctx| Ok(ctx.reply(&ctx.message().text)?)) // echo
//!     .build()?;
//! # bot.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Not covered: media uploads, editing and deleting messages, `answerCallbackQuery`
//! (use [`Telegram::call`]), edited messages, inline queries and the other update
//! kinds without a chat to answer (they are skipped and confirmed).

mod api;
mod http;
mod poll;
mod retry;
mod settings;
mod webhook;

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

pub use api::{CallbackQuery, Chat, ChatMessage, Update, User, to_message};
pub use settings::{DEFAULT_API_URL, TelegramConfig};
pub use webhook::{SECRET_HEADER, Webhook};

use crate::config::ConfigError;
use crate::provider::{Capabilities, Fence, Provider, ProviderError, Reply, Session, Status};
use http::Client;
use retry::{Backoff, random, send_retry};

/// The Telegram transport: a [`Provider`] that receives by long polling (leader
/// only) or sends only (webhook replicas), and sends with `sendMessage`. See the
/// [module docs](self).
pub struct Telegram {
    client: Arc<Client>,
    config: Arc<TelegramConfig>,
    /// Long polling (an exclusive session) or sending only.
    polling: bool,
    /// The poll session while started.
    running: Mutex<Option<poll::Running>>,
}

impl std::fmt::Debug for Telegram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telegram")
            .field("config", &self.config)
            .field("polling", &self.polling)
            .finish_non_exhaustive()
    }
}

impl Telegram {
    /// A long-polling transport: an exclusive session, run by the leader replica.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting at fault (the token's value is never shown).
    pub fn long_polling(config: TelegramConfig) -> Result<Self, ConfigError> {
        Self::with(config, true)
    }

    /// A transport that only sends, for replicas fed by a [`Webhook`]: a shared
    /// session (every replica sends), `start` reports it open at once.
    ///
    /// # Errors
    /// As [`Telegram::long_polling`].
    pub fn webhook(config: TelegramConfig) -> Result<Self, ConfigError> {
        Self::with(config, false)
    }

    fn with(config: TelegramConfig, polling: bool) -> Result<Self, ConfigError> {
        config.validate()?;
        let client = Client::new(&config.api_url, &config.token, config.request_timeout);
        Ok(Telegram {
            client: Arc::new(client),
            config: Arc::new(config),
            polling,
            running: Mutex::new(None),
        })
    }

    /// Calls any Bot API method with JSON parameters, once (no retry), bounded by the
    /// request timeout: for what this transport does not wrap (`setWebhook`,
    /// `answerCallbackQuery`, `getMe`…). Outside any turn: no fence.
    ///
    /// # Errors
    /// [`ProviderError`] with the API's code and description, or the network error.
    pub fn call(&self, method: &str, params: &Value) -> Result<Value, ProviderError> {
        self.client
            .call(method, params, self.config.request_timeout)
            .map_err(|e| ProviderError(format!("{method}: {e}")))
    }

    fn send_message(
        &self,
        chat: &str,
        reply: &Reply,
        fence: &Fence<'_>,
    ) -> Result<(), ProviderError> {
        let body = api::send_message_body(chat, reply);
        let deadline = Instant::now() + self.config.send_retry_for;
        let mut backoff = Backoff::new(self.config.backoff_min, self.config.backoff_max);
        let mut attempts = 0u32;
        loop {
            if !fence.is_live() {
                log::warn!(target: "botmesh::telegram", "sendMessage to chat {chat:?} refused after {attempts} attempts: its turn is no longer held (stale); not retried");
                return Err(ProviderError(format!(
                    "send refused (stale): the turn on chat {chat:?} is no longer held"
                )));
            }
            attempts += 1;
            let err =
                match self
                    .client
                    .call::<Value>("sendMessage", &body, self.config.request_timeout)
                {
                    Ok(_) => return Ok(()),
                    Err(e) => e,
                };
            let wait = send_retry(&err, &mut backoff, random());
            let Some(wait) = wait.filter(|w| Instant::now() + *w <= deadline) else {
                return Err(ProviderError(format!(
                    "sendMessage to chat {chat:?} failed after {attempts} attempts: {err}"
                )));
            };
            log::debug!(target: "botmesh::telegram", "sendMessage to chat {chat:?}: {err}; retrying in {wait:?}");
            sleep_while_live(wait, fence);
        }
    }
}

/// Sleeps `d`, waking early (within 20 ms) when the fence reads stale.
fn sleep_while_live(d: Duration, fence: &Fence<'_>) {
    let until = Instant::now() + d;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || !fence.is_live() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

impl Provider for Telegram {
    fn id(&self) -> &str {
        &self.config.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exclusive_session: self.polling,
        }
    }

    fn start(&self, session: Session) -> Result<(), ProviderError> {
        if !self.polling {
            session.status().report(Status::Open);
            return Ok(());
        }
        let running = poll::start(self.client.clone(), self.config.clone(), session)
            .map_err(|e| ProviderError(format!("cannot spawn the poll thread: {e}")))?;
        let old = self.running.lock().replace(running);
        if let Some(old) = old {
            old.stop(&self.client, &self.config);
        }
        Ok(())
    }

    fn stop(&self) {
        let running = self.running.lock().take();
        if let Some(r) = running {
            r.stop(&self.client, &self.config);
        }
    }

    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        self.send_message(chat, &Reply::new(text), &Fence::none())
    }

    fn send_reply(
        &self,
        chat: &str,
        reply: &Reply,
        fence: &Fence<'_>,
    ) -> Result<(), ProviderError> {
        self.send_message(chat, reply, fence)
    }
}

impl Drop for Telegram {
    fn drop(&mut self) {
        Provider::stop(self);
    }
}
