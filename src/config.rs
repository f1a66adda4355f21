//! Coordination settings: how a bot runs as one of N replicas.
//!
//! [`CoordinationConfig`] gathers the backend the replicas share (the
//! [`coordinator`](CoordinationConfig::coordinator)) and the timings and policies of
//! turns, provider leadership and conversation handover. A bot that has no coordination
//! config runs as a single process and does no coordination work at all.
//!
//! # Building it in code
//!
//! [`CoordinationConfig::new`] takes the one required setting, the coordinator, and
//! fills in every default; the `with_*` setters change single settings. The setters do
//! not check anything: call [`CoordinationConfig::validate`] before using a config
//! built by hand (the runtime does too, and refuses to start on an invalid one).
//!
//! # Loading it from a file
//!
//! The same settings load with serde from any self-describing format (JSON, TOML,
//! YAML...). Keys may be written the way the TypeScript framework writes them
//! (`turnWaitMs`, `settleMs`, `providerDownMs`, `providerSession`) or in snake_case
//! (`turn_wait_ms`, `settle_ms`, `provider_down_ms`, `provider_session`); the short
//! names `turn_wait`/`turnWait`, `settle`, `provider_down`/`providerDown` are accepted
//! too. Keys of the nested maps follow the same scheme (`leaseTtlMs`, `lease_ttl_ms`,
//! `leaseTtl`, `lease_ttl`, and so on).
//!
//! A duration is either a string in [`humantime`] form (`"2m"`, `"1500ms"`,
//! `"1h 30m"`) or a whole, non-negative number of milliseconds (`120000`). No duration
//! may exceed [`CoordinationConfig::MAX_DURATION`] (2^31 − 1 ms, about 24.8 days), the
//! largest the TypeScript original accepts.
//!
//! In a file the coordinator is a map naming one backend: `{"memory": {}}` or
//! `{"memory": {"leaseTtl": "10s", "dedupWindow": "10m"}}` for the in-process backend,
//! and, with the `redis` cargo feature (on by default),
//! `{"redis": {"url": "redis://user:pass@host:6379/0", "keyPrefix": "mybot"}}` for
//! Redis (see `CoordinatorConfig::Redis` for every option). A coordinator object
//! created in code (for example one backend shared by several replicas living in one
//! process) cannot come from a file; use [`CoordinatorConfig::Shared`] for it.
//!
//! # One coordinator per bot, unless shared
//!
//! A config describes a backend; [`CoordinatorConfig::build`] creates one, and every bot
//! built from the config calls it. So a [`CoordinatorConfig::Memory`] spec gives *each
//! bot its own* in-process coordinator: two bots in one process built from clones of
//! such a config do **not** exclude each other. Call [`CoordinationConfig::shared`]
//! once (or pass [`CoordinatorConfig::Shared`]) and clone the result instead; its
//! clones all use one backend instance. Redis bots coordinate through the server
//! whatever they do, and `shared()` only saves them connections.
//!
//! Loading is strict: an unknown key, a key given twice under two spellings, a value of
//! the wrong type, a negative or fractional number, an unparsable or out-of-range
//! duration, or an unknown mode or policy name is an error. Every error message names
//! the field (as it was spelled in the input) and the offending value.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use botmesh::{CoordinationConfig, CoordinatorConfig, FlowsPolicy, ProviderSession};
//!
//! let json = r#"{
//!     "coordinator": { "memory": { "leaseTtl": "5s" } },
//!     "turnWaitMs": 30000,
//!     "settle": "1m 30s",
//!     "providerSession": "leader",
//!     "handover": { "flows": "resume" }
//! }"#;
//! let config: CoordinationConfig = serde_json::from_str(json)?;
//! assert_eq!(config.turn_wait, Duration::from_secs(30));
//! assert_eq!(config.settle, Duration::from_secs(90));
//! assert_eq!(config.provider_down, Duration::from_secs(60)); // the default
//! assert_eq!(config.provider_session, ProviderSession::Leader);
//! assert_eq!(config.handover.flows, FlowsPolicy::Resume);
//! match &config.coordinator {
//!     CoordinatorConfig::Memory(options) => {
//!         assert_eq!(options.lease_ttl, Duration::from_secs(5))
//!     }
//!     other => unreachable!("this file names the memory backend, not {other:?}"),
//! }
//!
//! // Bad input is refused with a message naming the field and the value.
//! let err = CoordinationConfig::from_json_str(
//!     r#"{"coordinator": {"memory": {}}, "turnWaitMs": -5}"#,
//! )
//! .unwrap_err();
//! assert!(err.to_string().contains("turnWaitMs: -5 is negative"));
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

// ---------------------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------------------

/// How a bot runs as one of N replicas sharing a coordinator.
///
/// See the [module documentation](self) for how it loads from files. `Default` is not
/// implemented because the coordinator has no default; use [`CoordinationConfig::new`].
///
/// # Several bots in one process: share the coordinator
///
/// The [`coordinator`](Self::coordinator) field is a *description* of a backend, and
/// every bot built from the config creates its own backend from it. With
/// [`CoordinatorConfig::Memory`] that means one separate in-process coordinator per
/// bot: bots built from clones of that config never see each other's turns, so two of
/// them can handle one chat at the same time. Bots in one process that must exclude
/// each other (replicas simulated as threads, tests) need one backend instance: call
/// [`shared`](Self::shared) once and clone its result, or put an existing coordinator
/// in [`CoordinatorConfig::Shared`].
///
/// ```
/// use botmesh::{Bot, CoordinationConfig, CoordinatorConfig};
///
/// let config = CoordinationConfig::new(CoordinatorConfig::memory())
///     .shared()
///     .expect("an in-process coordinator always builds");
/// // Both bots use the one coordinator that `shared()` created, so a chat's messages
/// // run one at a time across them.
/// let bots = ["r1", "r2"].map(|id| {
///     Bot::builder()
///         .id(id)
///         .coordination(config.clone())
///         .handler(|_ctx| Ok(()))
///         .build()
///         .expect("bot starts")
/// });
/// for bot in bots {
///     bot.shutdown();
/// }
/// ```
///
/// Redis replicas in one process coordinate through the server in any case; `shared()`
/// lets them use one connection pool instead of one each.
#[derive(Debug, Clone)]
pub struct CoordinationConfig {
    /// The backend shared by the replicas. Required.
    pub coordinator: CoordinatorConfig,
    /// Longest a message waits for its chat's turn. When it runs out, the message
    /// leaves the queue and is reported as not handled with reason `timeout`.
    /// Must be greater than zero. Default 2 minutes (`turnWaitMs`).
    pub turn_wait: Duration,
    /// Longest the chat's turn stays held after the handler returned, while a
    /// conversation step the message fed runs on to its next wait or its end. A step
    /// still running then is stopped (its checkpoint kept) and the turn is released;
    /// a persistent flow runs that step again on the chat's next message. Zero is
    /// refused for a bot with flows (every step would be stopped at once). Default 1
    /// minute (`settleMs`).
    pub settle: Duration,
    /// With leader sessions: how long the leader's transport may stay closed before
    /// this replica steps down so that a standby connects instead. Closed means: the
    /// provider reported [`Status::Closed`](crate::Status::Closed), failed to start, or
    /// has not reported [`Status::Open`](crate::Status::Open) since it was started, and
    /// has not reported `Open` since (reconnect attempts in between do not reset the
    /// clock). Zero steps down at once on the first close. Default 1 minute
    /// (`providerDownMs`).
    pub provider_down: Duration,
    /// Which replicas connect the provider's transport. Default
    /// [`ProviderSession::Auto`] (`providerSession`).
    pub provider_session: ProviderSession,
    /// What happens to a chat's live conversation when another replica takes the
    /// chat. Default: only persistent flows continue (`handover`).
    pub handover: HandoverConfig,
}

/// The backend the replicas of one bot share: a description of one to create
/// ([`Memory`](Self::Memory), `Redis`), or one already created
/// ([`Shared`](Self::Shared)). [`build`](Self::build) turns it into a coordinator.
#[derive(Clone)]
pub enum CoordinatorConfig {
    /// An in-process backend ([`MemoryCoordinator`](crate::MemoryCoordinator)), built
    /// from these options. In files: `{"memory": {}}` or
    /// `{"memory": {"leaseTtl": "10s", "dedupWindow": "10m"}}`.
    ///
    /// **Every bot built from this creates its own, separate coordinator**, so bots
    /// built from clones of one `Memory` config do not exclude each other. Bots in one
    /// process that must share turns need one instance: use
    /// [`CoordinationConfig::shared`] or [`Shared`](Self::Shared).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use botmesh::{CoordinationConfig, CoordinatorConfig};
    ///
    /// let spec = CoordinationConfig::new(CoordinatorConfig::memory());
    /// let config = spec.shared()?; // builds ONE coordinator
    /// let (a, b) = (config.clone(), config.clone());
    /// match (&a.coordinator, &b.coordinator) {
    ///     (CoordinatorConfig::Shared(x), CoordinatorConfig::Shared(y)) => {
    ///         assert!(Arc::ptr_eq(x, y))
    ///     }
    ///     _ => unreachable!("shared() always gives a Shared coordinator"),
    /// }
    /// # Ok::<(), botmesh::BackendError>(())
    /// ```
    Memory(MemoryOptions),
    /// A Redis (or Valkey) server shared by replicas in any number of processes: each
    /// bot built from it connects with these options (see
    /// [`RedisCoordinator`](crate::redis::RedisCoordinator)). Only with the `redis`
    /// cargo feature (on by default).
    ///
    /// In files:
    ///
    /// ```json
    /// {"redis": {"url": "redis://user:pass@host:6379/0", "keyPrefix": "mybot",
    ///            "leaseTtl": "10s", "dedupWindow": "10m", "commandTimeout": "2s"}}
    /// ```
    ///
    /// - `url` (required): a string starting with `redis://`, `rediss://` (TLS, which
    ///   needs a TLS feature of the `redis` crate), `redis+unix://` or `unix://`. It may
    ///   hold a password, so it never appears in error messages or in `Debug` output.
    /// - `keyPrefix` / `key_prefix`: prefix of every key and channel, so bots can share
    ///   a server; not empty, no `{` or `}`. Default `botmesh`.
    /// - `leaseTtlMs` / `lease_ttl_ms` / `leaseTtl` / `lease_ttl`: lease TTL, at least
    ///   10 ms. Default 10 s.
    /// - `dedupWindowMs` / `dedup_window_ms` / `dedupWindow` / `dedup_window`:
    ///   duplicate-suppression window, zero turns it off. Default 10 min.
    /// - `commandTimeoutMs` / `command_timeout_ms` / `commandTimeout` /
    ///   `command_timeout`: connect, read and write timeout of every Redis call, at
    ///   least 1 ms. Default 2 s.
    ///
    /// Durations are humantime strings or whole milliseconds, as everywhere in the
    /// config. Loading does not connect; [`build`](Self::build) (and so starting a bot)
    /// does.
    ///
    /// botmesh's own messages never contain the URL, but a format crate may quote the
    /// source text around an error: `toml::de::Error`'s `Display` shows the offending
    /// line. Log its `message()` instead when the file holds a password.
    ///
    /// ```no_run
    /// use botmesh::{Bot, CoordinationConfig};
    ///
    /// let config = CoordinationConfig::from_json_str(
    ///     r#"{"coordinator": {"redis": {"url": "redis://127.0.0.1:6379", "keyPrefix": "shop"}},
    ///         "turnWait": "30s"}"#,
    /// )?;
    /// let bot = Bot::builder()
    ///     .coordination(config)
    ///     .handler(|_ctx| Ok(()))
    ///     .build()?;
    /// bot.shutdown();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "redis")]
    Redis(crate::redis::RedisOptions),
    /// A coordinator object created in code, for example one backend that several
    /// replicas in the same process share. It cannot be loaded from a file; its
    /// `Debug` form shows only the backend's name. `From<Arc<C>>` builds it from any
    /// concrete coordinator (`Arc::new(MemoryCoordinator::new()).into()`).
    Shared(Arc<dyn crate::Coordinator>),
}

/// Options of the in-process memory coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOptions {
    /// TTL of every lease the backend grants: a replica that stops renewing loses its
    /// chats after this long. At least [`MemoryOptions::MIN_LEASE_TTL`] (10 ms).
    /// Default 10 seconds (`leaseTtlMs`).
    pub lease_ttl: Duration,
    /// How long a message id is remembered so that a second delivery of the same
    /// message is not handled again. Zero turns duplicate suppression off. Default 10
    /// minutes (`dedupWindowMs`).
    pub dedup_window: Duration,
}

/// Which replicas connect a provider's transport (`providerSession`: `"leader"`,
/// `"shared"` or `"auto"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProviderSession {
    /// Only the replica holding the provider's leadership connects; the others stand
    /// by and take over when it fails (`"leader"`).
    Leader,
    /// Every replica connects, for example with webhooks where each replica receives
    /// part of the traffic (`"shared"`).
    Shared,
    /// [`Leader`](ProviderSession::Leader) when the provider declares an exclusive
    /// session, else [`Shared`](ProviderSession::Shared) (`"auto"`). The default.
    #[default]
    Auto,
}

/// What happens to a chat's live conversation when another replica takes the chat
/// (its previous replica crashed, was stopped for a deploy, or lost its turn).
///
/// The default, `{ flows: drop, fallback: drop }`, lets only persistent flows
/// continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HandoverConfig {
    /// What happens to flows that are not persistent (`flows`).
    pub flows: FlowsPolicy,
    /// What happens when a checkpoint cannot be resumed (`fallback`).
    pub fallback: FallbackPolicy,
}

/// Handover policy for flows that are not marked persistent (`"drop"` or
/// `"resume"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FlowsPolicy {
    /// Such a flow ends when another replica takes its chat (`"drop"`). The default.
    #[default]
    Drop,
    /// Such a flow is checkpointed like a persistent one and resumes on the replica
    /// that takes its chat (`"resume"`).
    Resume,
}

/// Handover policy for a checkpoint that cannot be resumed: its flow is not registered
/// on this replica, its format version is unknown, or it does not parse (`"drop"` or
/// `"restart"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FallbackPolicy {
    /// The conversation ends (`"drop"`). The default.
    #[default]
    Drop,
    /// The flow starts again from its first step (`"restart"`).
    Restart,
}

/// A configuration that cannot be used: a file that does not load, or a value that
/// [`CoordinationConfig::validate`] refuses.
///
/// It displays as `invalid config: ` followed by one sentence naming the field and the
/// value at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

// ---------------------------------------------------------------------------------------
// Constructors, setters, validation
// ---------------------------------------------------------------------------------------

impl CoordinationConfig {
    /// Default of [`turn_wait`](Self::turn_wait): 2 minutes.
    pub const DEFAULT_TURN_WAIT: Duration = Duration::from_secs(2 * 60);
    /// Default of [`settle`](Self::settle): 1 minute.
    pub const DEFAULT_SETTLE: Duration = Duration::from_secs(60);
    /// Default of [`provider_down`](Self::provider_down): 1 minute.
    pub const DEFAULT_PROVIDER_DOWN: Duration = Duration::from_secs(60);
    /// The longest duration any setting accepts: 2^31 − 1 milliseconds (about 24.8
    /// days), the largest the TypeScript framework accepts.
    pub const MAX_DURATION: Duration = Duration::from_millis(MAX_MILLIS);

    /// A config with the given coordinator and every other setting at its default.
    #[must_use]
    pub fn new(coordinator: CoordinatorConfig) -> Self {
        CoordinationConfig {
            coordinator,
            turn_wait: Self::DEFAULT_TURN_WAIT,
            settle: Self::DEFAULT_SETTLE,
            provider_down: Self::DEFAULT_PROVIDER_DOWN,
            provider_session: ProviderSession::default(),
            handover: HandoverConfig::default(),
        }
    }

    /// Sets [`turn_wait`](Self::turn_wait). Not checked here; see
    /// [`validate`](Self::validate).
    #[must_use]
    pub fn with_turn_wait(mut self, turn_wait: Duration) -> Self {
        self.turn_wait = turn_wait;
        self
    }

    /// Sets [`settle`](Self::settle). Not checked here; see [`validate`](Self::validate).
    #[must_use]
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// Sets [`provider_down`](Self::provider_down). Not checked here; see
    /// [`validate`](Self::validate).
    #[must_use]
    pub fn with_provider_down(mut self, provider_down: Duration) -> Self {
        self.provider_down = provider_down;
        self
    }

    /// Sets [`provider_session`](Self::provider_session).
    #[must_use]
    pub fn with_provider_session(mut self, provider_session: ProviderSession) -> Self {
        self.provider_session = provider_session;
        self
    }

    /// Sets [`handover`](Self::handover).
    #[must_use]
    pub fn with_handover(mut self, handover: HandoverConfig) -> Self {
        self.handover = handover;
        self
    }

    /// Replaces the [`coordinator`](Self::coordinator).
    #[must_use]
    pub fn with_coordinator(mut self, coordinator: CoordinatorConfig) -> Self {
        self.coordinator = coordinator;
        self
    }

    /// Checks every setting. Loading from a file already does this; a config built in
    /// code should be checked before use.
    ///
    /// # Errors
    /// A [`ConfigError`] for the first setting at fault, named in camelCase as in files:
    /// `turnWaitMs` is zero; any duration is over [`Self::MAX_DURATION`]; the memory or
    /// Redis coordinator's `leaseTtlMs` is under [`MemoryOptions::MIN_LEASE_TTL`]; the
    /// Redis coordinator's `url` is not a Redis URL (the message never shows the URL),
    /// its `keyPrefix` is empty or holds a brace, or its `commandTimeoutMs` is under
    /// 1 ms.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_set_duration("turnWaitMs", self.turn_wait, &TURN_WAIT_RANGE)?;
        check_set_duration("settleMs", self.settle, &ANY_RANGE)?;
        check_set_duration("providerDownMs", self.provider_down, &ANY_RANGE)?;
        self.coordinator.validate()
    }

    /// This config with its coordinator built once ([`CoordinatorConfig::build`]) and
    /// put in [`CoordinatorConfig::Shared`], so that every clone of the result, and
    /// every bot built from one, uses that one backend instance.
    ///
    /// This is what bots in one process need when they must exclude each other with a
    /// [`CoordinatorConfig::Memory`] backend: without it each bot creates its own
    /// memory coordinator (see [`CoordinationConfig`]). A config that is already
    /// `Shared` comes back unchanged (same instance).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use botmesh::{CoordinationConfig, CoordinatorConfig, MemoryCoordinator};
    ///
    /// let config = CoordinationConfig::new(CoordinatorConfig::memory()).shared()?;
    /// assert!(matches!(config.coordinator, CoordinatorConfig::Shared(_)));
    ///
    /// // The same, with a coordinator made by hand.
    /// let by_hand = CoordinationConfig::new(Arc::new(MemoryCoordinator::new()).into());
    /// assert_eq!(by_hand.coordinator.backend(), "memory");
    /// # Ok::<(), botmesh::BackendError>(())
    /// ```
    ///
    /// # Errors
    /// As [`CoordinatorConfig::build`]: a [`BackendError`](crate::BackendError) when
    /// the coordinator's settings are invalid or (Redis) the server cannot be reached
    /// or refuses the credentials.
    pub fn shared(self) -> Result<CoordinationConfig, crate::BackendError> {
        let built = self.coordinator.build()?;
        Ok(CoordinationConfig {
            coordinator: CoordinatorConfig::Shared(built),
            ..self
        })
    }

    /// Loads and checks a config from a JSON document.
    ///
    /// # Errors
    /// A [`ConfigError`] carrying serde_json's message (which names the field, the
    /// value and the position) when the text is not JSON or a setting is refused.
    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
        serde_json::from_str(s).map_err(|e: serde_json::Error| ConfigError::new(e.to_string()))
    }
}

impl CoordinatorConfig {
    /// A memory coordinator with default options.
    #[must_use]
    pub fn memory() -> Self {
        CoordinatorConfig::Memory(MemoryOptions::default())
    }

    /// A Redis coordinator for `url` (`redis://[user:password@]host:port[/db]`) with
    /// every other option at its default. Not checked here; see
    /// [`validate`](Self::validate).
    #[cfg(feature = "redis")]
    #[must_use]
    pub fn redis(url: impl Into<String>) -> Self {
        CoordinatorConfig::Redis(crate::redis::RedisOptions::new(url))
    }

    /// The backend's short name, as used in logs: `"memory"`, `"redis"`, or whatever a
    /// shared coordinator reports.
    pub fn backend(&self) -> &'static str {
        match self {
            CoordinatorConfig::Memory(_) => "memory",
            #[cfg(feature = "redis")]
            CoordinatorConfig::Redis(_) => "redis",
            CoordinatorConfig::Shared(coordinator) => coordinator.backend(),
        }
    }

    /// Checks the backend's options ([`Shared`](Self::Shared) has none).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first option at fault as in files
    /// (`coordinator.memory.leaseTtlMs`, `coordinator.redis.url`, ...); see
    /// [`CoordinationConfig::validate`]. A Redis URL is never shown.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            CoordinatorConfig::Memory(options) => options.validate_as("coordinator.memory."),
            #[cfg(feature = "redis")]
            CoordinatorConfig::Redis(options) => validate_redis(options, "coordinator.redis."),
            CoordinatorConfig::Shared(_) => Ok(()),
        }
    }

    /// Creates the coordinator this describes: a new
    /// [`MemoryCoordinator`](crate::MemoryCoordinator) with the options for
    /// [`Memory`](Self::Memory); a new connection to the server with
    /// `RedisCoordinator::connect` for `Redis`; the same instance (a clone of the
    /// `Arc`) for [`Shared`](Self::Shared).
    ///
    /// Every call on a `Memory` or `Redis` spec creates a new, separate coordinator;
    /// see [`CoordinationConfig::shared`] to build once and share.
    ///
    /// # Errors
    /// A [`BackendError`](crate::BackendError) when the options are invalid (as
    /// [`validate`](Self::validate) reports them, the URL never shown), or, for Redis,
    /// when the server cannot be reached within the command timeout, refuses the
    /// credentials, or the scripts cannot be loaded.
    pub fn build(&self) -> Result<Arc<dyn crate::Coordinator>, crate::BackendError> {
        if let Err(e) = self.validate() {
            return Err(crate::BackendError::new(e.to_string()));
        }
        match self {
            CoordinatorConfig::Memory(options) => Ok(Arc::new(
                crate::MemoryCoordinator::with_settings(options.lease_ttl, options.dedup_window),
            )),
            #[cfg(feature = "redis")]
            CoordinatorConfig::Redis(options) => Ok(Arc::new(
                crate::redis::RedisCoordinator::connect(options.clone())?,
            )),
            CoordinatorConfig::Shared(coordinator) => Ok(Arc::clone(coordinator)),
        }
    }
}

impl fmt::Debug for CoordinatorConfig {
    /// `Memory(MemoryOptions { .. })`, `Redis(RedisOptions { url: "<redacted>", .. })`
    /// (the URL may hold a password and is never printed), or `Shared("<backend>")`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoordinatorConfig::Memory(options) => f.debug_tuple("Memory").field(options).finish(),
            #[cfg(feature = "redis")]
            CoordinatorConfig::Redis(options) => f
                .debug_tuple("Redis")
                .field(options) // RedisOptions' Debug redacts the URL
                .finish(),
            CoordinatorConfig::Shared(coordinator) => f
                .debug_tuple("Shared")
                .field(&coordinator.backend())
                .finish(),
        }
    }
}

impl From<MemoryOptions> for CoordinatorConfig {
    /// [`CoordinatorConfig::Memory`] with these options.
    fn from(options: MemoryOptions) -> Self {
        CoordinatorConfig::Memory(options)
    }
}

#[cfg(feature = "redis")]
impl From<crate::redis::RedisOptions> for CoordinatorConfig {
    /// `CoordinatorConfig::Redis` with these options.
    fn from(options: crate::redis::RedisOptions) -> Self {
        CoordinatorConfig::Redis(options)
    }
}

impl From<Arc<dyn crate::Coordinator>> for CoordinatorConfig {
    /// [`CoordinatorConfig::Shared`] with this coordinator.
    fn from(coordinator: Arc<dyn crate::Coordinator>) -> Self {
        CoordinatorConfig::Shared(coordinator)
    }
}

impl<C: crate::Coordinator> From<Arc<C>> for CoordinatorConfig {
    /// [`CoordinatorConfig::Shared`] with this coordinator, for example
    /// `Arc::new(MemoryCoordinator::new()).into()`. (It does not overlap the
    /// `Arc<dyn Coordinator>` conversion: this one needs a sized `C`.)
    fn from(coordinator: Arc<C>) -> Self {
        CoordinatorConfig::Shared(coordinator)
    }
}

impl MemoryOptions {
    /// Default of [`lease_ttl`](Self::lease_ttl): 10 seconds.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
    /// Default of [`dedup_window`](Self::dedup_window): 10 minutes.
    pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(10 * 60);
    /// The shortest accepted [`lease_ttl`](Self::lease_ttl): 10 milliseconds.
    pub const MIN_LEASE_TTL: Duration = Duration::from_millis(10);

    /// Sets [`lease_ttl`](Self::lease_ttl). Not checked here; see
    /// [`validate`](Self::validate).
    #[must_use]
    pub fn with_lease_ttl(mut self, lease_ttl: Duration) -> Self {
        self.lease_ttl = lease_ttl;
        self
    }

    /// Sets [`dedup_window`](Self::dedup_window) (zero disables duplicate
    /// suppression). Not checked here; see [`validate`](Self::validate).
    #[must_use]
    pub fn with_dedup_window(mut self, dedup_window: Duration) -> Self {
        self.dedup_window = dedup_window;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// A [`ConfigError`] when `leaseTtlMs` is under [`Self::MIN_LEASE_TTL`] or either
    /// duration is over [`CoordinationConfig::MAX_DURATION`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as("")
    }

    fn validate_as(&self, prefix: &str) -> Result<(), ConfigError> {
        check_set_duration(
            &format!("{prefix}leaseTtlMs"),
            self.lease_ttl,
            &LEASE_TTL_RANGE,
        )?;
        check_set_duration(
            &format!("{prefix}dedupWindowMs"),
            self.dedup_window,
            &ANY_RANGE,
        )
    }
}

impl Default for MemoryOptions {
    /// A 10 second lease TTL and a 10 minute dedup window.
    fn default() -> Self {
        MemoryOptions {
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            dedup_window: Self::DEFAULT_DEDUP_WINDOW,
        }
    }
}

impl ConfigError {
    /// An error with the given one-sentence description (without the `invalid config: `
    /// prefix, which [`Display`](fmt::Display) adds).
    pub fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: message.into(),
        }
    }

    /// The description, without the `invalid config: ` prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

// ---------------------------------------------------------------------------------------
// Named choices (session mode, handover policies)
// ---------------------------------------------------------------------------------------

/// A setting written as one of a few fixed strings.
trait Choice: Copy + 'static {
    /// What one value is called in messages ("session mode").
    const WHAT: &'static str;
    /// Every accepted string and its value.
    const CHOICES: &'static [(&'static str, Self)];
    /// The accepted strings, as listed in messages.
    const EXPECTED: &'static str;
}

impl Choice for ProviderSession {
    const WHAT: &'static str = "session mode";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("leader", ProviderSession::Leader),
        ("shared", ProviderSession::Shared),
        ("auto", ProviderSession::Auto),
    ];
    const EXPECTED: &'static str = r#""leader", "shared" or "auto""#;
}

impl Choice for FlowsPolicy {
    const WHAT: &'static str = "flows policy";
    const CHOICES: &'static [(&'static str, Self)] =
        &[("drop", FlowsPolicy::Drop), ("resume", FlowsPolicy::Resume)];
    const EXPECTED: &'static str = r#""drop" or "resume""#;
}

impl Choice for FallbackPolicy {
    const WHAT: &'static str = "fallback policy";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("drop", FallbackPolicy::Drop),
        ("restart", FallbackPolicy::Restart),
    ];
    const EXPECTED: &'static str = r#""drop" or "restart""#;
}

/// Reads a choice; the error message does not name a field.
fn parse_choice<T: Choice>(s: &str) -> Result<T, String> {
    if let Some((_, value)) = T::CHOICES.iter().find(|(name, _)| *name == s) {
        return Ok(*value);
    }
    let hint = T::CHOICES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(s.trim()))
        .map(|(name, _)| format!("; did you mean \"{name}\"?"))
        .unwrap_or_default();
    Err(format!(
        "unknown {} {} (expected {}){hint}",
        T::WHAT,
        shorten(format!("{s:?}")),
        T::EXPECTED
    ))
}

fn choice_name<T: Choice + PartialEq>(value: T) -> &'static str {
    T::CHOICES
        .iter()
        .find(|(_, v)| *v == value)
        .map_or("?", |(name, _)| name)
}

macro_rules! choice_impls {
    ($ty:ty, $field:literal) => {
        impl $ty {
            /// The value as written in config files.
            pub fn as_str(self) -> &'static str {
                choice_name(self)
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = ConfigError;

            /// Reads the value as written in config files (lowercase, exact).
            fn from_str(s: &str) -> Result<Self, ConfigError> {
                parse_choice(s).map_err(ConfigError::new)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            /// Reads the value as written in config files; errors name the field as
            #[doc = concat!("`", $field, "`.")]
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                ExpectSeed(ChoiceField::<$ty>::new($field)).deserialize(deserializer)
            }
        }
    };
}

choice_impls!(ProviderSession, "providerSession");
choice_impls!(FlowsPolicy, "flows");
choice_impls!(FallbackPolicy, "fallback");

// ---------------------------------------------------------------------------------------
// Durations
// ---------------------------------------------------------------------------------------

const MAX_MILLIS: u64 = 2_147_483_647;
const DURATION_EXPECTED: &str = r#"a duration such as "2m" or a whole number of milliseconds"#;

/// The accepted range of one duration setting, below [`CoordinationConfig::MAX_DURATION`].
struct Range {
    min: Duration,
    /// Why the minimum exists, for the error message.
    why: &'static str,
}

const ANY_RANGE: Range = Range {
    min: Duration::ZERO,
    why: "",
};

const TURN_WAIT_RANGE: Range = Range {
    min: Duration::from_nanos(1),
    why: "no message could ever get its chat's turn",
};

const LEASE_TTL_RANGE: Range = Range {
    min: MemoryOptions::MIN_LEASE_TTL,
    why: "a lease that short would expire before it could be renewed",
};

/// The shortest accepted Redis command timeout: 1 millisecond.
#[cfg(feature = "redis")]
const COMMAND_TIMEOUT_RANGE: Range = Range {
    min: Duration::from_millis(1),
    why: "every Redis call would time out at once",
};

/// Checks a duration against its range. `shown` is the value as the user wrote it.
fn check_range(name: &str, shown: &str, d: Duration, range: &Range) -> Result<Duration, String> {
    if d > CoordinationConfig::MAX_DURATION {
        return Err(format!(
            "{name}: {shown} is too large; the longest accepted duration is \
             {MAX_MILLIS} ms (about 24.8 days)"
        ));
    }
    if d < range.min {
        return Err(if range.min == Duration::from_nanos(1) {
            format!(
                "{name}: {shown} is zero; it must be more than zero, or {}",
                range.why
            )
        } else {
            format!(
                "{name}: {shown} is too short ({}ms is the minimum); {}",
                range.min.as_millis(),
                range.why
            )
        });
    }
    Ok(d)
}

/// [`check_range`] for a value set in code.
fn check_set_duration(name: &str, d: Duration, range: &Range) -> Result<(), ConfigError> {
    let shown = humantime::format_duration(d).to_string();
    check_range(name, &shown, d, range)
        .map(drop)
        .map_err(ConfigError::new)
}

/// Reads one duration setting.
struct DurationField<'a> {
    name: &'a str,
    range: &'static Range,
}

impl<'de> Expect<'de> for DurationField<'_> {
    type Value = Duration;

    fn name(&self) -> &str {
        self.name
    }

    fn expected(&self) -> &str {
        DURATION_EXPECTED
    }

    fn str_value(self, v: &str) -> Result<Duration, String> {
        let shown = shorten(format!("{v:?}"));
        let name = self.name;
        let d = match humantime::parse_duration(v.trim()) {
            Ok(d) => d,
            Err(humantime::DurationError::NumberOverflow) => {
                // Too large even for `Duration`: certainly over the maximum.
                return check_range(name, &shown, Duration::MAX, self.range);
            }
            Err(humantime::DurationError::Empty) => {
                return Err(format!(
                    "{name}: {shown} is empty; expected {DURATION_EXPECTED}"
                ));
            }
            Err(e) => {
                return Err(format!(
                    "{name}: {shown} is not a duration ({e}); expected {DURATION_EXPECTED}"
                ));
            }
        };
        check_range(name, &shown, d, self.range)
    }

    fn u64_value(self, v: u64) -> Result<Duration, String> {
        let shown = v.to_string();
        let d = if v > MAX_MILLIS {
            Duration::MAX
        } else {
            Duration::from_millis(v)
        };
        check_range(self.name, &shown, d, self.range)
    }

    fn i64_value(self, v: i64) -> Result<Duration, String> {
        match u64::try_from(v) {
            Ok(v) => self.u64_value(v),
            Err(_) => Err(format!(
                "{}: {v} is negative; expected {DURATION_EXPECTED}",
                self.name
            )),
        }
    }

    fn f64_value(self, v: f64) -> Result<Duration, String> {
        let name = self.name;
        if !v.is_finite() {
            return Err(format!(
                "{name}: {v} is not a finite number; expected {DURATION_EXPECTED}"
            ));
        }
        if v < 0.0 {
            let shown = show_f64(v);
            return Err(format!(
                "{name}: {shown} is negative; expected {DURATION_EXPECTED}"
            ));
        }
        let shown = show_f64(v);
        if v.fract() != 0.0 {
            return Err(format!(
                "{name}: {shown} has a fractional part; expected {DURATION_EXPECTED}"
            ));
        }
        if v > MAX_MILLIS as f64 {
            return check_range(name, &shown, Duration::MAX, self.range);
        }
        // Whole, finite and within 0..=MAX_MILLIS, so the conversion is exact.
        check_range(name, &shown, Duration::from_millis(v as u64), self.range)
    }
}

/// A float as shown in messages: plain unless very large or very small.
fn show_f64(v: f64) -> String {
    if v != 0.0 && !(1e-6..1e16).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

// ---------------------------------------------------------------------------------------
// A visitor that reports any value of the wrong kind with the field's name
// ---------------------------------------------------------------------------------------

/// How one field reads the kinds of value it accepts. Every other kind is refused with
/// a message naming the field, the value and what was expected.
trait Expect<'de>: Sized {
    type Value;

    /// The field, as spelled in the input (with its path).
    fn name(&self) -> &str;

    /// What the field accepts, as a phrase following "expected".
    fn expected(&self) -> &str;

    /// The message for a value of the wrong kind; `is_kind` reads like "is a boolean".
    fn wrong(&self, shown: &str, is_kind: &str) -> String {
        format!(
            "{}: {shown} {is_kind}; expected {}",
            self.name(),
            self.expected()
        )
    }

    fn str_value(self, v: &str) -> Result<Self::Value, String> {
        Err(self.wrong(&shorten(format!("{v:?}")), "is a string"))
    }

    fn u64_value(self, v: u64) -> Result<Self::Value, String> {
        Err(self.wrong(&v.to_string(), "is a number"))
    }

    fn i64_value(self, v: i64) -> Result<Self::Value, String> {
        Err(self.wrong(&v.to_string(), "is a number"))
    }

    fn f64_value(self, v: f64) -> Result<Self::Value, String> {
        Err(self.wrong(&show_f64(v), "is a number"))
    }

    fn map_value<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let (shown, is_kind) = render_map(map);
        Err(de::Error::custom(self.wrong(&shown, is_kind)))
    }
}

/// Deserializes one value with an [`Expect`].
struct ExpectSeed<E>(E);

impl<'de, E: Expect<'de>> DeserializeSeed<'de> for ExpectSeed<E> {
    type Value = E::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<E::Value, D::Error> {
        deserializer.deserialize_any(ExpectVisitor(self.0, PhantomData))
    }
}

struct ExpectVisitor<'de, E>(E, PhantomData<&'de ()>);

impl<'de, E: Expect<'de>> Visitor<'de> for ExpectVisitor<'de, E> {
    type Value = E::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} for {}", self.0.expected(), self.0.name())
    }

    fn visit_bool<Er: de::Error>(self, v: bool) -> Result<E::Value, Er> {
        Err(Er::custom(self.0.wrong(&v.to_string(), "is a boolean")))
    }

    fn visit_i64<Er: de::Error>(self, v: i64) -> Result<E::Value, Er> {
        self.0.i64_value(v).map_err(Er::custom)
    }

    fn visit_u64<Er: de::Error>(self, v: u64) -> Result<E::Value, Er> {
        self.0.u64_value(v).map_err(Er::custom)
    }

    fn visit_i128<Er: de::Error>(self, v: i128) -> Result<E::Value, Er> {
        match i64::try_from(v) {
            Ok(v) => self.visit_i64(v),
            // Far out of range either way; the f64 path reports it as such.
            Err(_) => self.visit_f64(v as f64),
        }
    }

    fn visit_u128<Er: de::Error>(self, v: u128) -> Result<E::Value, Er> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => self.visit_f64(v as f64),
        }
    }

    fn visit_f64<Er: de::Error>(self, v: f64) -> Result<E::Value, Er> {
        self.0.f64_value(v).map_err(Er::custom)
    }

    fn visit_str<Er: de::Error>(self, v: &str) -> Result<E::Value, Er> {
        self.0.str_value(v).map_err(Er::custom)
    }

    fn visit_bytes<Er: de::Error>(self, v: &[u8]) -> Result<E::Value, Er> {
        let shown = format!("<{} bytes>", v.len());
        Err(Er::custom(self.0.wrong(&shown, "is a byte string")))
    }

    fn visit_unit<Er: de::Error>(self) -> Result<E::Value, Er> {
        Err(Er::custom(self.0.wrong("null", "is not accepted")))
    }

    fn visit_none<Er: de::Error>(self) -> Result<E::Value, Er> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<E::Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<E::Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<E::Value, A::Error> {
        let shown = render_seq(seq);
        Err(de::Error::custom(self.0.wrong(&shown, "is an array")))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<E::Value, A::Error> {
        self.0.map_value(map)
    }
}

/// The key under which the `toml` crate passes a date-time through serde.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// Shortens a rendered value for an error message.
fn shorten(s: String) -> String {
    const LIMIT: usize = 60;
    if s.chars().count() <= LIMIT {
        s
    } else {
        let mut short: String = s.chars().take(LIMIT - 1).collect();
        short.push('…');
        short
    }
}

/// Renders an array (only ever for an error message).
fn render_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> String {
    let mut items = Vec::new();
    loop {
        match seq.next_element::<serde_json::Value>() {
            Ok(Some(item)) => items.push(item),
            Ok(None) => break,
            Err(_) => return "[…]".to_owned(),
        }
    }
    shorten(serde_json::Value::Array(items).to_string())
}

/// Renders a map (only ever for an error message), telling a TOML date-time apart.
fn render_map<'de, A: MapAccess<'de>>(mut map: A) -> (String, &'static str) {
    let mut entries = serde_json::Map::new();
    loop {
        let key = match map.next_key::<String>() {
            Ok(Some(key)) => key,
            Ok(None) => break,
            Err(_) => return ("{…}".to_owned(), "is a map"),
        };
        if key == TOML_DATETIME_KEY && entries.is_empty() {
            return match map.next_value::<String>() {
                Ok(datetime) => (datetime, "is a date-time"),
                Err(_) => ("<date-time>".to_owned(), "is a date-time"),
            };
        }
        match map.next_value::<serde_json::Value>() {
            Ok(value) => {
                entries.insert(key, value);
            }
            Err(_) => return ("{…}".to_owned(), "is a map"),
        }
    }
    (
        shorten(serde_json::Value::Object(entries).to_string()),
        "is a map",
    )
}

/// Reads a [`Choice`] setting.
struct ChoiceField<'a, T> {
    name: &'a str,
    _choice: PhantomData<T>,
}

impl<'a, T> ChoiceField<'a, T> {
    fn new(name: &'a str) -> Self {
        ChoiceField {
            name,
            _choice: PhantomData,
        }
    }
}

impl<'de, T: Choice> Expect<'de> for ChoiceField<'_, T> {
    type Value = T;

    fn name(&self) -> &str {
        self.name
    }

    fn expected(&self) -> &str {
        T::EXPECTED
    }

    fn str_value(self, v: &str) -> Result<T, String> {
        parse_choice(v).map_err(|e| format!("{}: {e}", self.name))
    }
}

// ---------------------------------------------------------------------------------------
// Maps: key spellings, unknown and repeated keys
// ---------------------------------------------------------------------------------------

/// One map's accepted keys.
struct Keys<K: 'static> {
    /// Every accepted spelling and the field it sets.
    spellings: &'static [(&'static str, K)],
    /// The spellings listed in an unknown-key message.
    listed: &'static str,
}

impl<K: Copy + PartialEq> Keys<K> {
    fn find(&self, key: &str) -> Option<K> {
        self.spellings
            .iter()
            .find(|(spelling, _)| *spelling == key)
            .map(|(_, field)| *field)
    }

    /// The message for a key that is not accepted; `context` names the map.
    fn unknown(&self, key: &str, context: &str) -> String {
        let folded = fold_key(key);
        let hint = self
            .spellings
            .iter()
            .find(|(spelling, _)| fold_key(spelling) == folded)
            .map(|(spelling, _)| format!("; did you mean \"{spelling}\"?"))
            .unwrap_or_default();
        format!(
            "unknown key {} in {context} (expected one of: {}){hint}",
            shorten(format!("{key:?}")),
            self.listed
        )
    }
}

/// A key with case, `_` and `-` ignored, to suggest the intended spelling.
fn fold_key(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Remembers which fields were set, and under which spelling, to refuse a field given
/// twice (for example as `turnWaitMs` and as `turn_wait`).
struct Seen<K> {
    seen: Vec<(K, String)>,
}

impl<K: Copy + PartialEq> Seen<K> {
    fn new() -> Self {
        Seen { seen: Vec::new() }
    }

    fn mark(&mut self, field: K, key: &str, prefix: &str) -> Result<(), String> {
        if let Some((_, earlier)) = self.seen.iter().find(|(f, _)| *f == field) {
            return Err(if earlier == key {
                format!("{prefix}{key}: given twice")
            } else {
                format!("{prefix}{key}: given twice (also as {prefix}{earlier})")
            });
        }
        self.seen.push((field, key.to_owned()));
        Ok(())
    }
}

// ----- top level

#[derive(Clone, Copy, PartialEq, Eq)]
enum TopKey {
    Coordinator,
    TurnWait,
    Settle,
    ProviderDown,
    ProviderSession,
    Handover,
}

const TOP_KEYS: Keys<TopKey> = Keys {
    spellings: &[
        ("coordinator", TopKey::Coordinator),
        ("turnWaitMs", TopKey::TurnWait),
        ("turn_wait_ms", TopKey::TurnWait),
        ("turnWait", TopKey::TurnWait),
        ("turn_wait", TopKey::TurnWait),
        ("settleMs", TopKey::Settle),
        ("settle_ms", TopKey::Settle),
        ("settle", TopKey::Settle),
        ("providerDownMs", TopKey::ProviderDown),
        ("provider_down_ms", TopKey::ProviderDown),
        ("providerDown", TopKey::ProviderDown),
        ("provider_down", TopKey::ProviderDown),
        ("providerSession", TopKey::ProviderSession),
        ("provider_session", TopKey::ProviderSession),
        ("handover", TopKey::Handover),
    ],
    listed: "coordinator, turnWaitMs, settleMs, providerDownMs, providerSession, handover; \
             snake_case spellings such as turn_wait_ms are accepted too",
};

const CONFIG_EXPECTED: &str = r#"a map such as {"coordinator": {"memory": {}}}"#;

/// Reads the coordination config map itself.
struct ConfigField;

impl<'de> Expect<'de> for ConfigField {
    type Value = CoordinationConfig;

    fn name(&self) -> &str {
        "coordination config"
    }

    fn expected(&self) -> &str {
        CONFIG_EXPECTED
    }

    fn map_value<A: MapAccess<'de>>(self, mut map: A) -> Result<CoordinationConfig, A::Error> {
        let mut seen = Seen::new();
        let mut coordinator = None;
        let mut turn_wait = None;
        let mut settle = None;
        let mut provider_down = None;
        let mut provider_session = None;
        let mut handover = None;
        while let Some(key) = map.next_key::<String>()? {
            let Some(field) = TOP_KEYS.find(&key) else {
                return Err(de::Error::custom(
                    TOP_KEYS.unknown(&key, "coordination config"),
                ));
            };
            seen.mark(field, &key, "").map_err(de::Error::custom)?;
            let name = key.as_str();
            match field {
                TopKey::Coordinator => {
                    coordinator = Some(map.next_value_seed(ExpectSeed(CoordinatorField))?);
                }
                TopKey::TurnWait => {
                    turn_wait = Some(map.next_value_seed(ExpectSeed(DurationField {
                        name,
                        range: &TURN_WAIT_RANGE,
                    }))?);
                }
                TopKey::Settle => {
                    settle = Some(map.next_value_seed(ExpectSeed(DurationField {
                        name,
                        range: &ANY_RANGE,
                    }))?);
                }
                TopKey::ProviderDown => {
                    provider_down = Some(map.next_value_seed(ExpectSeed(DurationField {
                        name,
                        range: &ANY_RANGE,
                    }))?);
                }
                TopKey::ProviderSession => {
                    provider_session =
                        Some(map.next_value_seed(ExpectSeed(ChoiceField::new(name)))?);
                }
                TopKey::Handover => {
                    handover = Some(map.next_value_seed(ExpectSeed(HandoverField {
                        prefix: "handover.",
                        context: "handover",
                    }))?);
                }
            }
        }
        let Some(coordinator) = coordinator else {
            return Err(de::Error::custom(
                r#"missing key "coordinator" in coordination config; name the backend, for example "coordinator": {"memory": {}}"#,
            ));
        };
        let mut config = CoordinationConfig::new(coordinator);
        if let Some(d) = turn_wait {
            config.turn_wait = d;
        }
        if let Some(d) = settle {
            config.settle = d;
        }
        if let Some(d) = provider_down {
            config.provider_down = d;
        }
        if let Some(mode) = provider_session {
            config.provider_session = mode;
        }
        if let Some(h) = handover {
            config.handover = h;
        }
        // Every field was checked as it was read; this only guards against the two
        // drifting apart.
        config
            .validate()
            .map_err(|e| de::Error::custom(e.message))?;
        Ok(config)
    }
}

impl<'de> Deserialize<'de> for CoordinationConfig {
    /// Reads a coordination config map (see the [module documentation](self)).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ExpectSeed(ConfigField).deserialize(deserializer)
    }
}

// ----- coordinator

/// Reads the `coordinator` map: exactly one backend name and its options.
struct CoordinatorField;

#[cfg(feature = "redis")]
const BACKENDS: &str = r#""memory" or "redis""#;
#[cfg(not(feature = "redis"))]
const BACKENDS: &str = r#""memory" (this build lacks the "redis" cargo feature)"#;

impl<'de> Expect<'de> for CoordinatorField {
    type Value = CoordinatorConfig;

    fn name(&self) -> &str {
        "coordinator"
    }

    fn expected(&self) -> &str {
        r#"a map naming one backend, such as {"memory": {}} or {"redis": {"url": "redis://host:6379"}}"#
    }

    fn str_value(self, v: &str) -> Result<CoordinatorConfig, String> {
        if looks_like_url(v) {
            // Probably a Redis URL given without its map: it may hold a password.
            return Err(format!(
                "coordinator: a URL string is not accepted (its text is not shown, as it \
                 may hold a password); expected {}",
                self.expected()
            ));
        }
        Err(self.wrong(&shorten(format!("{v:?}")), "is a string"))
    }

    fn map_value<A: MapAccess<'de>>(self, mut map: A) -> Result<CoordinatorConfig, A::Error> {
        let Some(backend) = map.next_key::<String>()? else {
            return Err(de::Error::custom(format!(
                "coordinator: {{}} names no backend; expected {}",
                self.expected()
            )));
        };
        let config = match backend.as_str() {
            "memory" => {
                CoordinatorConfig::Memory(map.next_value_seed(ExpectSeed(MemoryField {
                    prefix: "coordinator.memory.",
                    context: "coordinator.memory",
                }))?)
            }
            #[cfg(feature = "redis")]
            "redis" => CoordinatorConfig::Redis(map.next_value_seed(ExpectSeed(RedisField {
                prefix: "coordinator.redis.",
                context: "coordinator.redis",
            }))?),
            #[cfg(not(feature = "redis"))]
            "redis" => {
                return Err(de::Error::custom(
                    r#"coordinator: backend "redis" needs the "redis" cargo feature of botmesh, which this build lacks"#,
                ));
            }
            other => {
                return Err(de::Error::custom(format!(
                    "coordinator: unknown backend {} (expected {BACKENDS}; a \
                     coordinator object made in code is passed as CoordinatorConfig::Shared)",
                    shorten(format!("{other:?}"))
                )));
            }
        };
        if let Some(extra) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!(
                "coordinator: {extra:?} given next to {backend:?}; expected exactly one backend"
            )));
        }
        Ok(config)
    }
}

impl<'de> Deserialize<'de> for CoordinatorConfig {
    /// Reads a map naming one backend, such as `{"memory": {}}` or
    /// `{"redis": {"url": "redis://host:6379"}}`; errors name the field as
    /// `coordinator`. [`CoordinatorConfig::Shared`] is never produced.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ExpectSeed(CoordinatorField).deserialize(deserializer)
    }
}

// ----- memory options

#[derive(Clone, Copy, PartialEq, Eq)]
enum MemoryKey {
    LeaseTtl,
    DedupWindow,
}

const MEMORY_KEYS: Keys<MemoryKey> = Keys {
    spellings: &[
        ("leaseTtlMs", MemoryKey::LeaseTtl),
        ("lease_ttl_ms", MemoryKey::LeaseTtl),
        ("leaseTtl", MemoryKey::LeaseTtl),
        ("lease_ttl", MemoryKey::LeaseTtl),
        ("dedupWindowMs", MemoryKey::DedupWindow),
        ("dedup_window_ms", MemoryKey::DedupWindow),
        ("dedupWindow", MemoryKey::DedupWindow),
        ("dedup_window", MemoryKey::DedupWindow),
    ],
    listed: "leaseTtlMs, dedupWindowMs; snake_case spellings such as lease_ttl_ms \
             are accepted too",
};

/// Reads the memory coordinator's options map.
struct MemoryField {
    /// Put before each key in messages (`coordinator.memory.`).
    prefix: &'static str,
    /// Names the map in messages.
    context: &'static str,
}

impl<'de> Expect<'de> for MemoryField {
    type Value = MemoryOptions;

    fn name(&self) -> &str {
        self.context
    }

    fn expected(&self) -> &str {
        r#"a map of memory coordinator options, such as {} or {"leaseTtl": "10s"}"#
    }

    fn map_value<A: MapAccess<'de>>(self, mut map: A) -> Result<MemoryOptions, A::Error> {
        let mut seen = Seen::new();
        let mut options = MemoryOptions::default();
        while let Some(key) = map.next_key::<String>()? {
            let Some(field) = MEMORY_KEYS.find(&key) else {
                return Err(de::Error::custom(MEMORY_KEYS.unknown(&key, self.context)));
            };
            seen.mark(field, &key, self.prefix)
                .map_err(de::Error::custom)?;
            let name = format!("{}{key}", self.prefix);
            match field {
                MemoryKey::LeaseTtl => {
                    options.lease_ttl = map.next_value_seed(ExpectSeed(DurationField {
                        name: &name,
                        range: &LEASE_TTL_RANGE,
                    }))?;
                }
                MemoryKey::DedupWindow => {
                    options.dedup_window = map.next_value_seed(ExpectSeed(DurationField {
                        name: &name,
                        range: &ANY_RANGE,
                    }))?;
                }
            }
        }
        Ok(options)
    }
}

impl<'de> Deserialize<'de> for MemoryOptions {
    /// Reads an options map such as `{"leaseTtl": "10s"}`; missing options take their
    /// defaults.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ExpectSeed(MemoryField {
            prefix: "",
            context: "memory coordinator options",
        })
        .deserialize(deserializer)
    }
}

// ----- redis options

/// The URL schemes a Redis URL may start with (compared without regard to case).
#[cfg(feature = "redis")]
const REDIS_SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];

#[cfg(feature = "redis")]
const REDIS_URL_EXPECTED: &str = "a Redis URL string such as \"redis://host:6379\" \
     (schemes redis://, rediss://, redis+unix:// or unix://)";

/// Whether a string looks like a URL, which may hold a password and so is never shown.
fn looks_like_url(v: &str) -> bool {
    v.contains("://") || v.contains('@')
}

/// Checks a Redis URL. The message names the field but never shows the URL.
#[cfg(feature = "redis")]
fn check_redis_url(name: &str, url: &str) -> Result<(), String> {
    if url.trim().is_empty() {
        return Err(format!(
            "{name}: the URL is empty; expected {REDIS_URL_EXPECTED}"
        ));
    }
    let known = REDIS_SCHEMES.iter().any(|scheme| {
        url.get(..scheme.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(scheme))
            && url.len() > scheme.len()
    });
    if known {
        Ok(())
    } else {
        Err(format!(
            "{name}: not a Redis URL (expected redis://host:port, rediss://host:port, \
             redis+unix:///path or unix:///path; the value is not shown, as it may hold \
             a password)"
        ))
    }
}

/// Checks a Redis key prefix; the message names the field and shows the prefix.
#[cfg(feature = "redis")]
fn check_key_prefix(name: &str, prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err(format!(
            "{name}: \"\" is empty; give a prefix such as \"mybot\" (the default is \"botmesh\")"
        ));
    }
    if prefix.contains(['{', '}']) {
        return Err(format!(
            "{name}: {prefix:?} contains a brace; '{{' and '}}' are not allowed because they \
             would change the Redis Cluster hash slot of a chat's keys"
        ));
    }
    Ok(())
}

/// Checks Redis options set in code; `prefix` goes before each field name.
#[cfg(feature = "redis")]
fn validate_redis(options: &crate::redis::RedisOptions, prefix: &str) -> Result<(), ConfigError> {
    check_redis_url(&format!("{prefix}url"), &options.url).map_err(ConfigError::new)?;
    check_key_prefix(&format!("{prefix}keyPrefix"), &options.key_prefix)
        .map_err(ConfigError::new)?;
    check_set_duration(
        &format!("{prefix}leaseTtlMs"),
        options.lease_ttl,
        &LEASE_TTL_RANGE,
    )?;
    check_set_duration(
        &format!("{prefix}dedupWindowMs"),
        options.dedup_window,
        &ANY_RANGE,
    )?;
    check_set_duration(
        &format!("{prefix}commandTimeoutMs"),
        options.command_timeout,
        &COMMAND_TIMEOUT_RANGE,
    )
}

#[cfg(feature = "redis")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum RedisKey {
    Url,
    KeyPrefix,
    LeaseTtl,
    DedupWindow,
    CommandTimeout,
}

#[cfg(feature = "redis")]
const REDIS_KEYS: Keys<RedisKey> = Keys {
    spellings: &[
        ("url", RedisKey::Url),
        ("keyPrefix", RedisKey::KeyPrefix),
        ("key_prefix", RedisKey::KeyPrefix),
        ("leaseTtlMs", RedisKey::LeaseTtl),
        ("lease_ttl_ms", RedisKey::LeaseTtl),
        ("leaseTtl", RedisKey::LeaseTtl),
        ("lease_ttl", RedisKey::LeaseTtl),
        ("dedupWindowMs", RedisKey::DedupWindow),
        ("dedup_window_ms", RedisKey::DedupWindow),
        ("dedupWindow", RedisKey::DedupWindow),
        ("dedup_window", RedisKey::DedupWindow),
        ("commandTimeoutMs", RedisKey::CommandTimeout),
        ("command_timeout_ms", RedisKey::CommandTimeout),
        ("commandTimeout", RedisKey::CommandTimeout),
        ("command_timeout", RedisKey::CommandTimeout),
    ],
    listed: "url, keyPrefix, leaseTtlMs, dedupWindowMs, commandTimeoutMs; snake_case \
             spellings such as lease_ttl_ms are accepted too",
};

/// Reads the Redis coordinator's options map.
#[cfg(feature = "redis")]
struct RedisField {
    /// Put before each key in messages (`coordinator.redis.`).
    prefix: &'static str,
    /// Names the map in messages.
    context: &'static str,
}

#[cfg(feature = "redis")]
impl<'de> Expect<'de> for RedisField {
    type Value = crate::redis::RedisOptions;

    fn name(&self) -> &str {
        self.context
    }

    fn expected(&self) -> &str {
        r#"a map of Redis coordinator options, such as {"url": "redis://host:6379"}"#
    }

    /// Never shows the value: a URL written in place of the map may hold a password.
    fn wrong(&self, shown: &str, is_kind: &str) -> String {
        hidden_wrong(self.name(), self.expected(), shown, is_kind)
    }

    fn map_value<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<crate::redis::RedisOptions, A::Error> {
        let mut seen = Seen::new();
        let mut url = None;
        let mut key_prefix = None;
        let mut lease_ttl = None;
        let mut dedup_window = None;
        let mut command_timeout = None;
        while let Some(key) = map.next_key::<String>()? {
            let Some(field) = REDIS_KEYS.find(&key) else {
                return Err(de::Error::custom(REDIS_KEYS.unknown(&key, self.context)));
            };
            seen.mark(field, &key, self.prefix)
                .map_err(de::Error::custom)?;
            let name = format!("{}{key}", self.prefix);
            match field {
                RedisKey::Url => {
                    url = Some(map.next_value_seed(ExpectSeed(UrlField { name: &name }))?);
                }
                RedisKey::KeyPrefix => {
                    key_prefix =
                        Some(map.next_value_seed(ExpectSeed(KeyPrefixField { name: &name }))?);
                }
                RedisKey::LeaseTtl => {
                    lease_ttl = Some(map.next_value_seed(ExpectSeed(DurationField {
                        name: &name,
                        range: &LEASE_TTL_RANGE,
                    }))?);
                }
                RedisKey::DedupWindow => {
                    dedup_window = Some(map.next_value_seed(ExpectSeed(DurationField {
                        name: &name,
                        range: &ANY_RANGE,
                    }))?);
                }
                RedisKey::CommandTimeout => {
                    command_timeout = Some(map.next_value_seed(ExpectSeed(DurationField {
                        name: &name,
                        range: &COMMAND_TIMEOUT_RANGE,
                    }))?);
                }
            }
        }
        let Some(url) = url else {
            return Err(de::Error::custom(format!(
                r#"{}url: missing; give the Redis server's address, for example "url": "redis://127.0.0.1:6379""#,
                self.prefix
            )));
        };
        let mut options = crate::redis::RedisOptions::new(url);
        if let Some(p) = key_prefix {
            options.key_prefix = p;
        }
        if let Some(d) = lease_ttl {
            options.lease_ttl = d;
        }
        if let Some(d) = dedup_window {
            options.dedup_window = d;
        }
        if let Some(d) = command_timeout {
            options.command_timeout = d;
        }
        Ok(options)
    }
}

/// The message for a value of the wrong kind whose text must not be shown.
#[cfg(feature = "redis")]
fn hidden_wrong(name: &str, expected: &str, shown: &str, is_kind: &str) -> String {
    if shown == "null" {
        format!("{name}: null {is_kind}; expected {expected}")
    } else {
        format!(
            "{name}: the value {is_kind} (its text is not shown, as it may hold a password); \
             expected {expected}"
        )
    }
}

/// Reads a Redis URL; never shows it in a message.
#[cfg(feature = "redis")]
struct UrlField<'a> {
    name: &'a str,
}

#[cfg(feature = "redis")]
impl<'de> Expect<'de> for UrlField<'_> {
    type Value = String;

    fn name(&self) -> &str {
        self.name
    }

    fn expected(&self) -> &str {
        REDIS_URL_EXPECTED
    }

    fn wrong(&self, shown: &str, is_kind: &str) -> String {
        hidden_wrong(self.name, REDIS_URL_EXPECTED, shown, is_kind)
    }

    fn str_value(self, v: &str) -> Result<String, String> {
        check_redis_url(self.name, v)?;
        Ok(v.to_owned())
    }
}

/// Reads a Redis key prefix.
#[cfg(feature = "redis")]
struct KeyPrefixField<'a> {
    name: &'a str,
}

#[cfg(feature = "redis")]
impl<'de> Expect<'de> for KeyPrefixField<'_> {
    type Value = String;

    fn name(&self) -> &str {
        self.name
    }

    fn expected(&self) -> &str {
        r#"a non-empty string without '{' or '}', such as "mybot""#
    }

    fn str_value(self, v: &str) -> Result<String, String> {
        check_key_prefix(self.name, v)?;
        Ok(v.to_owned())
    }
}

#[cfg(feature = "redis")]
impl<'de> Deserialize<'de> for crate::redis::RedisOptions {
    /// Reads an options map such as `{"url": "redis://host:6379", "keyPrefix": "mybot"}`
    /// (keys as for `CoordinatorConfig::Redis`); `url` is required, the other options
    /// take their defaults. Errors name the field and never show the URL.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ExpectSeed(RedisField {
            prefix: "",
            context: "Redis coordinator options",
        })
        .deserialize(deserializer)
    }
}

// ----- handover

#[derive(Clone, Copy, PartialEq, Eq)]
enum HandoverKey {
    Flows,
    Fallback,
}

const HANDOVER_KEYS: Keys<HandoverKey> = Keys {
    spellings: &[
        ("flows", HandoverKey::Flows),
        ("fallback", HandoverKey::Fallback),
    ],
    listed: "flows, fallback",
};

/// Reads the `handover` map.
struct HandoverField {
    /// Put before each key in messages (`handover.`).
    prefix: &'static str,
    /// Names the map in messages.
    context: &'static str,
}

impl<'de> Expect<'de> for HandoverField {
    type Value = HandoverConfig;

    fn name(&self) -> &str {
        self.context
    }

    fn expected(&self) -> &str {
        r#"a map such as {"flows": "drop", "fallback": "drop"}"#
    }

    fn map_value<A: MapAccess<'de>>(self, mut map: A) -> Result<HandoverConfig, A::Error> {
        let mut seen = Seen::new();
        let mut handover = HandoverConfig::default();
        while let Some(key) = map.next_key::<String>()? {
            let Some(field) = HANDOVER_KEYS.find(&key) else {
                return Err(de::Error::custom(HANDOVER_KEYS.unknown(&key, self.context)));
            };
            seen.mark(field, &key, self.prefix)
                .map_err(de::Error::custom)?;
            let name = format!("{}{key}", self.prefix);
            match field {
                HandoverKey::Flows => {
                    handover.flows = map.next_value_seed(ExpectSeed(ChoiceField::new(&name)))?;
                }
                HandoverKey::Fallback => {
                    handover.fallback = map.next_value_seed(ExpectSeed(ChoiceField::new(&name)))?;
                }
            }
        }
        Ok(handover)
    }
}

impl<'de> Deserialize<'de> for HandoverConfig {
    /// Reads a map such as `{"flows": "resume", "fallback": "restart"}`; missing keys
    /// take their defaults.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ExpectSeed(HandoverField {
            prefix: "",
            context: "handover config",
        })
        .deserialize(deserializer)
    }
}
