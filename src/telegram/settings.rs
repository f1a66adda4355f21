//! The settings of the Telegram transport, and their checks.

use std::time::Duration;

use crate::config::ConfigError;

/// The Bot API's public address.
pub const DEFAULT_API_URL: &str = "https://api.telegram.org";

/// The settings of a [`Telegram`](super::Telegram) transport. Build with [`TelegramConfig::new`] and
/// the `with_` methods; checked by [`Telegram::long_polling`](super::Telegram::long_polling) / [`Telegram::webhook`](super::Telegram::webhook).
#[derive(Clone)]
pub struct TelegramConfig {
    /// The bot's token from @BotFather; secret: never logged or shown in errors.
    pub(crate) token: String,
    /// Base URL of the Bot API (a local Bot API server, or a test double).
    pub(crate) api_url: String,
    /// The provider id (the leadership lease is `provider:<id>`).
    pub(crate) id: String,
    /// How long one `getUpdates` waits for updates (whole seconds).
    pub(crate) poll_timeout: Duration,
    /// The update kinds to receive; `None` keeps what Telegram has (all but a few).
    pub(crate) allowed_updates: Option<Vec<String>>,
    /// Bound of every call but the long poll's wait, and of connecting.
    pub(crate) request_timeout: Duration,
    /// How long a send keeps retrying `429` and 5xx.
    pub(crate) send_retry_for: Duration,
    /// First and longest back-off of a failing poll or send.
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    /// Bound of each closing call when the runtime stops the session.
    pub(crate) stop_timeout: Duration,
}

impl std::fmt::Debug for TelegramConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramConfig")
            .field("token", &"<secret>")
            .field("api_url", &self.api_url)
            .field("id", &self.id)
            .field("poll_timeout", &self.poll_timeout)
            .field("allowed_updates", &self.allowed_updates)
            .finish_non_exhaustive()
    }
}

impl TelegramConfig {
    /// Settings for the bot with this token, with defaults: the public API
    /// ([`DEFAULT_API_URL`]), provider id `telegram`, a 30 s long poll, Telegram's own
    /// `allowed_updates`, 10 s per request, sends retried for up to 20 s, back-off from
    /// 0.5 s to 30 s, 1 s per closing call.
    pub fn new(token: impl Into<String>) -> Self {
        TelegramConfig {
            token: token.into(),
            api_url: DEFAULT_API_URL.to_owned(),
            id: "telegram".to_owned(),
            poll_timeout: Duration::from_secs(30),
            allowed_updates: None,
            request_timeout: Duration::from_secs(10),
            send_retry_for: Duration::from_secs(20),
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(1),
        }
    }

    /// The Bot API base URL (`http://` or `https://`, no trailing `/bot…`): a local
    /// Bot API server, or a test double.
    #[must_use]
    pub fn with_api_url(mut self, url: impl Into<String>) -> Self {
        self.api_url = url.into();
        self
    }

    /// The provider id, the same on every replica (default `telegram`).
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// How long one `getUpdates` waits for updates: whole seconds, at most 50 s
    /// (Telegram's limit). 0 polls without waiting (a busy loop; for tests).
    #[must_use]
    pub fn with_poll_timeout(mut self, timeout: Duration) -> Self {
        self.poll_timeout = timeout;
        self
    }

    /// The update kinds to receive (`["message", "callback_query"]`). Telegram keeps
    /// the last list it was given.
    #[must_use]
    pub fn with_allowed_updates<I, S>(mut self, kinds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allowed_updates = Some(kinds.into_iter().map(Into::into).collect());
        self
    }

    /// The bound of connecting and of every call besides the long poll's own wait.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long a send keeps retrying `429` and 5xx (while its fence is live).
    #[must_use]
    pub fn with_send_retry_for(mut self, d: Duration) -> Self {
        self.send_retry_for = d;
        self
    }

    /// The first and the longest back-off of a failing poll or send.
    #[must_use]
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// The bound of each closing `getUpdates` when the session is stopped (at most 3
    /// are made). Keep it under a third of the lease TTL: a leader whose renewals
    /// fail has that long to stop.
    #[must_use]
    pub fn with_stop_timeout(mut self, d: Duration) -> Self {
        self.stop_timeout = d;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.token;
        if t.is_empty() || t.chars().any(|c| c.is_whitespace() || c == '/' || c == '?') {
            return Err(ConfigError::new(format!(
                "token: a value of {} characters with a space, `/` or `?`, or empty, is refused \
                 (the value is not shown); use the token @BotFather gave",
                t.chars().count()
            )));
        }
        if !(self.api_url.starts_with("http://") || self.api_url.starts_with("https://")) {
            return Err(ConfigError::new(format!(
                "api_url: {:?} is not an http:// or https:// URL",
                self.api_url
            )));
        }
        if self.id.is_empty() {
            return Err(ConfigError::new(
                "id: \"\" is empty; the default is \"telegram\"",
            ));
        }
        let p = self.poll_timeout;
        if p.subsec_nanos() != 0 || p > Duration::from_secs(50) {
            return Err(ConfigError::new(format!(
                "poll_timeout: {p:?} is refused; use whole seconds from 0 to 50"
            )));
        }
        for (field, d) in [
            ("request_timeout", self.request_timeout),
            ("stop_timeout", self.stop_timeout),
            ("backoff_min", self.backoff_min),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(format!("{field}: 0 is refused")));
            }
        }
        Ok(())
    }
}
