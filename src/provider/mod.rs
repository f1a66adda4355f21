//! Providers (transports) and their sessions; provider leadership lives in `leadership.rs`. The user-facing story is on [`Provider`].

use std::fmt;
use std::sync::Arc;

use crossbeam_channel::Sender;

use crate::coordinator::Token;
use crate::intake::Intake;
use crate::metrics::{Metrics, inc};

pub(crate) mod leadership;
mod reply;

pub use reply::{ButtonAction, Fence, InlineButton, Keyboard, Reply};

/// What a provider's transport allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Only one live session may exist at a time (WhatsApp Web, Telegram long
    /// polling): two replicas connecting kick each other off. With
    /// [`ProviderSession::Auto`](crate::ProviderSession::Auto) such a provider is run
    /// by one leader replica.
    pub exclusive_session: bool,
}

/// A provider failed to start, stop or send; the text says why (no secrets).
#[derive(Debug, Clone)]
pub struct ProviderError(pub String);

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProviderError {}

/// Why a transport's session closed, as the provider reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// The platform closed this session because another session of the account
    /// connected (WhatsApp Web's "replaced", Telegram's `409 Conflict`): two replicas
    /// used the exclusive session at once. Counted in
    /// [`MetricsSnapshot::provider_conflicts`](crate::MetricsSnapshot::provider_conflicts).
    Replaced,
    /// The platform refused this session's fencing token because a newer leader has
    /// connected since: this replica was deposed.
    Fenced,
    /// Logged out or credentials revoked: reconnecting as is will not help.
    LoggedOut,
    /// Anything else (network error, platform down, reconnecting given up), with a
    /// short text for the log. No secrets.
    Other(String),
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Replaced => f.write_str("replaced by another session"),
            CloseReason::Fenced => f.write_str("refused: a newer leader's token was seen"),
            CloseReason::LoggedOut => f.write_str("logged out"),
            CloseReason::Other(why) => f.write_str(why),
        }
    }
}

/// The state of a transport's session, as its provider reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Connecting or reconnecting. Does not end a closed period: a leader whose
    /// reconnect attempts keep failing still steps down after `provider_down`.
    Connecting,
    /// The session is live: messages flow.
    Open,
    /// The session is closed. With leader sessions, a leader whose transport stays
    /// closed (no [`Status::Open`] since) for `provider_down` steps down.
    Closed(CloseReason),
}

/// What the status reports go to: the leadership thread of the provider, if any.
pub(crate) type StatusEvents = Sender<(u64, Status)>;

/// Where a provider reports its [`Status`]; cloneable, cheap, never blocks.
///
/// Each [`Session`] has its own sender: reports through the sender of a session that
/// the runtime has stopped since are logged and counted but do not change what the
/// runtime does.
#[derive(Clone)]
pub struct StatusSender {
    provider: Arc<str>,
    replica: Arc<str>,
    metrics: Arc<Metrics>,
    generation: u64,
    events: Option<StatusEvents>,
}

impl fmt::Debug for StatusSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusSender")
            .field("provider", &self.provider)
            .field("session", &self.generation)
            .finish_non_exhaustive()
    }
}

impl StatusSender {
    pub(crate) fn new(
        provider: Arc<str>,
        replica: Arc<str>,
        metrics: Arc<Metrics>,
        generation: u64,
        events: Option<StatusEvents>,
    ) -> Self {
        StatusSender {
            provider,
            replica,
            metrics,
            generation,
            events,
        }
    }

    /// Reports the transport's status. Call it on every change: [`Status::Connecting`]
    /// when a (re)connect starts, [`Status::Open`] once messages flow,
    /// [`Status::Closed`] with the reason when the session ends. Never blocks and
    /// never fails; a report after the bot stopped is ignored.
    pub fn report(&self, status: Status) {
        match &status {
            Status::Open => {
                log::info!(target: "botmesh::provider", "provider {:?} on replica {} is open", self.provider, self.replica)
            }
            Status::Connecting => {
                log::debug!(target: "botmesh::provider", "provider {:?} on replica {} is connecting", self.provider, self.replica)
            }
            Status::Closed(reason) => {
                if *reason == CloseReason::Replaced {
                    inc(&self.metrics.provider_conflicts);
                }
                log::warn!(target: "botmesh::provider", "provider {:?} on replica {} closed: {reason}", self.provider, self.replica)
            }
        }
        if let Some(events) = &self.events {
            // The leadership thread is gone once the bot stopped; nothing to tell then.
            let _ = events.send((self.generation, status));
        }
    }
}

/// What a provider gets when the runtime starts it: where incoming messages go, where
/// its status goes, and, with leader sessions, the leadership's fencing token.
#[derive(Clone, Debug)]
pub struct Session {
    intake: Intake,
    status: StatusSender,
    fencing_token: Option<Token>,
}

impl Session {
    pub(crate) fn new(intake: Intake, status: StatusSender, fencing_token: Option<Token>) -> Self {
        Session {
            intake,
            status,
            fencing_token,
        }
    }

    /// Where incoming messages go ([`Intake::deliver`]): one chat's messages in order.
    pub fn intake(&self) -> &Intake {
        &self.intake
    }

    /// Where the transport reports its status.
    pub fn status(&self) -> &StatusSender {
        &self.status
    }

    /// With leader sessions, the fencing token of this replica's leadership: strictly
    /// greater than the token of every earlier leader of this provider. Present it to
    /// the platform (or a proxy in front of it) where it can refuse older tokens, and
    /// send with it. `None` in shared mode and without coordination.
    pub fn fencing_token(&self) -> Option<Token> {
        self.fencing_token
    }
}

/// A transport: it delivers incoming messages to an [`Intake`], sends replies, and
/// reports the state of its connection.
///
/// Implementations must be `Send + Sync` (the runtime calls them from several
/// threads) and are used as `Arc<dyn Provider>`.
///
/// ```
/// use std::sync::Mutex;
/// use botmesh::{Capabilities, Provider, ProviderError, Session, Status};
///
/// /// A transport with one session per account, like WhatsApp Web.
/// struct Phone {
///     session: Mutex<Option<Session>>,
/// }
///
/// impl Provider for Phone {
///     fn id(&self) -> &str {
///         "phone"
///     }
///     fn capabilities(&self) -> Capabilities {
///         Capabilities { exclusive_session: true }
///     }
///     fn start(&self, session: Session) -> Result<(), ProviderError> {
///         // A real transport connects on its own thread and reports as it goes.
///         session.status().report(Status::Open);
///         *self.session.lock().map_err(|_| ProviderError("poisoned".into()))? = Some(session);
///         Ok(())
///     }
///     fn stop(&self) {
///         if let Ok(mut s) = self.session.lock() {
///             s.take();
///         }
///     }
///     fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
///         let session = self.session.lock().map_err(|_| ProviderError("poisoned".into()))?;
///         let token = session.as_ref().and_then(|s| s.fencing_token());
///         println!("to {chat} (token {token:?}): {text}");
///         Ok(())
///     }
/// }
/// ```
///
/// Providers: the transports that bring messages in and take replies out.
///
/// A [`Provider`] connects to a messaging platform (a webhook endpoint, a long-polling
/// loop, a WhatsApp Web socket…), hands incoming messages to the bot's [`Intake`] and
/// sends replies. It tells the runtime how its connection is doing through the
/// [`StatusSender`] of its [`Session`].
///
/// # Who connects: session modes
///
/// Some transports allow one live session per account ([`Capabilities::exclusive_session`]):
/// WhatsApp Web closes the older session when a newer one logs in ("replaced"), and
/// Telegram answers a second `getUpdates` poller with `409 Conflict`. Two replicas
/// connecting at once would knock each other off in a loop. The coordination setting
/// [`provider_session`](crate::CoordinationConfig::provider_session) decides:
///
/// - [`Leader`](crate::ProviderSession::Leader): only the replica holding the provider's
///   leadership lease starts the transport; the other replicas stand by and take over
///   when the leader stops (at once), crashes (within the lease TTL plus one re-check)
///   or steps down because its transport stayed closed for
///   [`provider_down`](crate::CoordinationConfig::provider_down).
/// - [`Shared`](crate::ProviderSession::Shared): every replica starts it (webhooks: each
///   replica receives part of the traffic).
/// - [`Auto`](crate::ProviderSession::Auto), the default: `Leader` for a provider that
///   declares an exclusive session, `Shared` otherwise.
///
/// A bot without coordination (one process) starts every provider itself.
///
/// # Fencing
///
/// A leader's [`Session::fencing_token`] is the token of its leadership lease, strictly
/// greater than every earlier leader's (Kleppmann, "How to do distributed locking",
/// 2016). A platform or proxy that remembers the highest token it saw can refuse a
/// deposed leader that comes back from a pause. The runtime also refuses a reply on a
/// leader-mode provider whenever this replica does not hold a live leadership lease;
/// that check runs just before the send, so the platform-side check is what closes the
/// last gap.
pub trait Provider: Send + Sync {
    /// A stable id, unique among the bot's providers (used in logs and, for leader
    /// sessions, in the leadership lease name `provider:<id>`, so every replica must
    /// give the same provider the same id).
    fn id(&self) -> &str;

    /// What the transport allows; by default a shared session.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Connects and starts delivering messages to [`Session::intake`], reporting the
    /// connection's state through [`Session::status`]. Must not block for long: a
    /// transport that polls or keeps a socket runs its own thread.
    ///
    /// With leader sessions it is called each time this replica becomes the leader,
    /// with a new session (and a greater fencing token), after a [`Provider::stop`].
    ///
    /// # Errors
    /// [`ProviderError`] when the transport cannot start. In shared mode and without
    /// coordination the bot then does not start; with leader sessions the failure
    /// counts as a closed transport and `start` is not called again during that
    /// leadership (the leader steps down after `provider_down`): a transport that
    /// should retry returns `Ok`, retries on its own thread and reports `Connecting`
    /// / `Closed` meanwhile. With leader sessions a transport that has not reported
    /// [`Status::Open`] within `provider_down` of its start counts as down too.
    fn start(&self, session: Session) -> Result<(), ProviderError>;

    /// Disconnects and returns once the session is closed: no message is delivered
    /// after it returns, and the runtime ignores later status reports of that session.
    /// With leader sessions the runtime stops the transport before it gives up the
    /// leadership, so the next leader's session never overlaps this one. When the
    /// leader's renewals fail, it calls `stop` one renewal period (lease TTL/3) before
    /// its lease could run out: `stop` must return within that, or the next leader's
    /// session may overlap this one. Do not wait in `stop` for a thread that may be
    /// inside [`Intake::deliver`](crate::Intake::deliver): `deliver` can block up to
    /// the backend's command timeout when the coordinator is unreachable; tell it to
    /// drop what it delivers instead.
    fn stop(&self);

    /// Sends a text to a chat. Called from the bot's worker threads, possibly
    /// concurrently. With leader sessions the runtime refuses the send before calling
    /// this when this replica does not hold a live leadership; a transport that can
    /// present its session's fencing token to the platform should.
    ///
    /// # Errors
    /// [`ProviderError`] when the transport refuses or fails.
    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError>;

    /// Sends a [`Reply`] (a text with an optional keyboard) to a chat, under `fence`:
    /// what handlers ([`Context::reply`](crate::Context::reply)) and flows call. A
    /// transport that retries (rate limits, server errors) asks [`Fence::is_live`]
    /// before every attempt and returns an error without retrying once it reads false.
    ///
    /// The default sends the text alone with [`Provider::send`] (a keyboard is
    /// dropped, logged at debug level) after one fence check: override it in a
    /// transport that has keyboards or retries.
    ///
    /// # Errors
    /// [`ProviderError`] when the fence is not live, or the transport refuses or fails.
    fn send_reply(
        &self,
        chat: &str,
        reply: &Reply,
        fence: &Fence<'_>,
    ) -> Result<(), ProviderError> {
        if !fence.is_live() {
            return Err(ProviderError(format!(
                "send refused: the turn on chat {chat:?} is no longer held"
            )));
        }
        if reply.keyboard.is_some() {
            log::debug!(target: "botmesh::provider", "provider {:?} has no keyboards: sending the text alone", self.id());
        }
        self.send(chat, &reply.text)
    }
}
