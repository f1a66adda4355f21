//! The public settings types, their defaults, builders and checks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::duration::{self, Any, LeaseTtl, TurnWait};
use super::error::ConfigError;

/// How a bot runs as one of N replicas sharing a coordinator.
///
/// [`CoordinationConfig`] gathers the backend the replicas share (the
/// [`coordinator`](CoordinationConfig::coordinator)) and the timings and policies of
/// turns, provider leadership and conversation handover. A bot without one runs as a
/// single process and does no coordination work at all.
///
/// In code, [`CoordinationConfig::new`] takes the one required setting and fills in
/// every default; the `with_*` setters check nothing, so call
/// [`validate`](CoordinationConfig::validate) on a config built by hand (the runtime
/// does too, and refuses to start on an invalid one).
///
/// # Loading it from a file
///
/// The settings load with serde from any self-describing format (JSON, TOML, YAML...).
/// Keys are written as the TypeScript framework writes them (`turnWaitMs`, `settleMs`,
/// `providerDownMs`, `providerSession`) or in snake_case (`turn_wait_ms`, ...), and a
/// duration's key may drop its `Ms` (`turnWait`, `turn_wait`, `settle`); the nested
/// maps follow the same scheme (`leaseTtlMs`, `lease_ttl_ms`, `leaseTtl`, `lease_ttl`).
/// A duration is a [`humantime`] string (`"2m"`, `"1500ms"`, `"1h 30m"`) or a whole,
/// non-negative number of milliseconds, at most [`CoordinationConfig::MAX_DURATION`].
/// The coordinator is a map naming one backend: `{"memory": {}}`, or with the `redis`
/// cargo feature (on by default) `{"redis": {"url": "redis://host:6379"}}`.
///
/// Loading is strict: an unknown key, a key given twice under two spellings, a value of
/// the wrong type, a negative or fractional number, an unparsable or out-of-range
/// duration, or an unknown mode or policy is an error whose message names the field (as
/// spelled in the input) and the value.
///
/// ```
/// use std::time::Duration;
/// use botmesh::{CoordinationConfig, CoordinatorConfig, FlowsPolicy, ProviderSession};
///
/// let json = r#"{
///     "coordinator": { "memory": { "leaseTtl": "5s" } },
///     "turnWaitMs": 30000,
///     "settle": "1m 30s",
///     "providerSession": "leader",
///     "handover": { "flows": "resume" }
/// }"#;
/// let config: CoordinationConfig = serde_json::from_str(json)?;
/// assert_eq!(config.turn_wait, Duration::from_secs(30));
/// assert_eq!(config.settle, Duration::from_secs(90));
/// assert_eq!(config.provider_down, Duration::from_secs(60)); // the default
/// assert_eq!(config.provider_session, ProviderSession::Leader);
/// assert_eq!(config.handover.flows, FlowsPolicy::Resume);
/// match &config.coordinator {
///     CoordinatorConfig::Memory(options) => {
///         assert_eq!(options.lease_ttl, Duration::from_secs(5))
///     }
///     other => unreachable!("this file names the memory backend, not {other:?}"),
/// }
///
/// let err = CoordinationConfig::from_json_str(
///     r#"{"coordinator": {"memory": {}}, "turnWaitMs": -5}"#,
/// )
/// .unwrap_err();
/// assert!(err.to_string().contains("turnWaitMs: -5 is negative"));
/// # Ok::<(), serde_json::Error>(())
/// ```
///
/// `Default` is not implemented because the coordinator has none; use
/// [`CoordinationConfig::new`].
///
/// # Several bots in one process: share the coordinator
///
/// The [`coordinator`](Self::coordinator) field *describes* a backend, and every bot
/// built from the config creates its own from it. With [`CoordinatorConfig::Memory`]
/// that is one separate in-process coordinator per bot, so bots built from clones of
/// such a config never see each other's turns. Bots in one process that must exclude
/// each other (replicas as threads, tests) need one instance: call
/// [`shared`](Self::shared) once and clone its result, or pass an existing coordinator
/// as [`CoordinatorConfig::Shared`]. Redis replicas coordinate through the server in
/// any case; `shared()` only saves them connections.
#[derive(Debug, Clone)]
pub struct CoordinationConfig {
    /// The backend shared by the replicas. Required.
    pub coordinator: CoordinatorConfig,
    /// Longest a message waits for its chat's turn; then it leaves the queue and is
    /// reported as not handled with reason `timeout`. More than zero. Default 2
    /// minutes (`turnWaitMs`).
    pub turn_wait: Duration,
    /// Longest the chat's turn stays held after the handler returned, while a
    /// conversation step the message fed runs on to its next wait or its end. A step
    /// still running then is stopped (its checkpoint kept) and the turn released; a
    /// persistent flow runs that step again on the chat's next message. Zero is refused
    /// for a bot with flows. Default 1 minute (`settleMs`).
    pub settle: Duration,
    /// With leader sessions: how long the leader's transport may stay closed before
    /// this replica steps down so that a standby connects. Closed means the provider
    /// reported [`Status::Closed`](crate::Status::Closed), failed to start, or has not
    /// reported [`Status::Open`](crate::Status::Open) since it was started, and not
    /// `Open` since (reconnect attempts do not reset the clock). Zero steps down on the
    /// first close. Default 1 minute (`providerDownMs`).
    pub provider_down: Duration,
    /// Which replicas connect the provider's transport. Default
    /// [`ProviderSession::Auto`] (`providerSession`).
    pub provider_session: ProviderSession,
    /// What happens to a chat's live conversation when another replica takes the
    /// chat. Default: only persistent flows continue (`handover`).
    pub handover: HandoverConfig,
    /// The clock drift allowance: a holder whose renewals stop getting through stops
    /// acting this long before its lease could run out by its own clock, for a backend
    /// clock that runs a little faster and the time between its last check and its
    /// action. Costs nothing while renewals succeed. `None`: a twentieth of the lease
    /// TTL (500 ms of the default 10 s). Must be under the renewal period (TTL/3)
    /// (`clockDriftMs`).
    pub clock_drift: Option<Duration>,
}

/// The backend the replicas of one bot share: a description of one to create
/// ([`Memory`](Self::Memory), `Redis`), or one already created
/// ([`Shared`](Self::Shared)). [`build`](Self::build) turns it into a coordinator.
// The Redis options are the big variant (URLs, cluster seeds, Sentinel, TLS files); a
// config value is built once at start-up, so its size costs nothing worth a `Box`
// in the public variant.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum CoordinatorConfig {
    /// An in-process backend ([`MemoryCoordinator`](crate::MemoryCoordinator)), built
    /// from these options; in files `{"memory": {}}` or
    /// `{"memory": {"leaseTtl": "10s", "dedupWindow": "10m", "chatCapacity": 50000}}`.
    /// **Every bot built from it creates its own coordinator**; see
    /// [`CoordinationConfig::shared`].
    Memory(MemoryOptions),
    /// A Redis (or Valkey) server shared by replicas in any number of processes, reached
    /// with these options ([`RedisCoordinator`](crate::redis::RedisCoordinator)); only
    /// with the `redis` cargo feature (on by default). In files
    /// `{"redis": {"url": "redis://user:pass@host:6379/0", "keyPrefix": "mybot"}}`, with:
    ///
    /// - `url` (required): `redis://`, `rediss://` (TLS, which needs a TLS feature of the
    ///   `redis` crate), `redis+unix://` or `unix://`. It may hold a password, so no
    ///   error message and no `Debug` output shows it.
    /// - `keyPrefix`: prefix of every key and channel, so bots can share a server; not
    ///   empty, no `{` or `}`. Default `botmesh`.
    /// - `leaseTtlMs` (at least 10 ms, default 10 s), `dedupWindowMs` (zero turns
    ///   duplicate suppression off, default 10 min) and `commandTimeoutMs` (connect, read
    ///   and write timeout of every Redis call, at least 1 ms, default 2 s).
    /// - `dedupIds`: handled message ids each chat remembers at least (1 to 10,000,
    ///   default 64; see [`MemoryOptions::dedup_ids`]).
    /// - `waitReplicas`: replicas that must acknowledge each turn write before it
    ///   counts (0 to 100, default 0: off; see
    ///   [`RedisOptions::wait_replicas`](crate::redis::RedisOptions::wait_replicas)).
    /// - `cluster`, `sentinel`, `tls`, `urlEnv`, `passwordEnv`: see the README's
    ///   *Configuration* table.
    ///
    /// Loading does not connect; [`build`](Self::build) (and so starting a bot) does.
    /// A format crate may quote the source around an error (`toml::de::Error`'s
    /// `Display` shows the line): log its `message()` when the file holds a password.
    #[cfg(feature = "redis")]
    Redis(crate::redis::RedisOptions),
    /// A coordinator created in code, for example one backend that several replicas in
    /// one process share. It cannot come from a file; its `Debug` form shows only the
    /// backend's name. `From<Arc<C>>` builds it from any concrete coordinator
    /// (`Arc::new(MemoryCoordinator::new()).into()`).
    Shared(Arc<dyn crate::Coordinator>),
}

/// Options of the in-process memory coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOptions {
    /// TTL of every lease the backend grants: a replica that stops renewing loses its
    /// chats after this long (Gray and Cheriton, "Leases", 1989). At least
    /// [`MemoryOptions::MIN_LEASE_TTL`]. Default 10 seconds (`leaseTtlMs`).
    pub lease_ttl: Duration,
    /// How long a message id is remembered so that a second delivery of the same
    /// message is not handled again. Zero turns duplicate suppression off. Default 10
    /// minutes (`dedupWindowMs`).
    pub dedup_window: Duration,
    /// How many handled message ids each chat remembers at least (`dedupIds`, 1 to
    /// [`MAX_DEDUP_IDS`](crate::MAX_DEDUP_IDS), default
    /// [`DEFAULT_DEDUP_IDS`](crate::DEFAULT_DEDUP_IDS), 64): a chat keeps its newest
    /// `dedup_ids` to 1.5 × `dedup_ids` handled ids; an older one is still suppressed
    /// when ids are numbers that rise per chat (Telegram's `message_id`), and may run
    /// again otherwise (see the README's *Duplicates*).
    pub dedup_ids: usize,
    /// How many chats the table is prepared for when it is built (`chatCapacity`, 0 to
    /// [`MAX_CHAT_CAPACITY`](crate::MAX_CHAT_CAPACITY), default 0: grow as needed); see
    /// [`MemoryCoordinator::with_chat_capacity`](crate::MemoryCoordinator::with_chat_capacity).
    pub chat_capacity: usize,
}

/// Which replicas connect a provider's transport (`providerSession`).
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
/// (its previous replica crashed, was stopped for a deploy, or lost its turn). The
/// default, `{ flows: drop, fallback: drop }`, lets only persistent flows continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HandoverConfig {
    /// What happens to flows that are not persistent (`flows`).
    pub flows: FlowsPolicy,
    /// What happens when a checkpoint cannot be resumed (`fallback`).
    pub fallback: FallbackPolicy,
}

/// Handover policy for flows that are not marked persistent (`flows`).
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
/// on this replica, its format version is unknown, or it does not parse (`fallback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FallbackPolicy {
    /// The conversation ends (`"drop"`). The default.
    #[default]
    Drop,
    /// The flow starts again from its first step (`"restart"`).
    Restart,
}

impl CoordinationConfig {
    /// Default of [`turn_wait`](Self::turn_wait): 2 minutes.
    pub const DEFAULT_TURN_WAIT: Duration = Duration::from_secs(2 * 60);
    /// Default of [`settle`](Self::settle): 1 minute.
    pub const DEFAULT_SETTLE: Duration = Duration::from_secs(60);
    /// Default of [`provider_down`](Self::provider_down): 1 minute.
    pub const DEFAULT_PROVIDER_DOWN: Duration = Duration::from_secs(60);
    /// The longest duration any setting accepts: 2^31 − 1 milliseconds (about 24.8
    /// days), the largest the TypeScript framework accepts.
    pub const MAX_DURATION: Duration = Duration::from_millis(duration::MAX_MILLIS);

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
            clock_drift: None,
        }
    }

    /// Sets [`clock_drift`](Self::clock_drift); checked by [`validate`](Self::validate).
    #[must_use]
    pub fn with_clock_drift(mut self, drift: Duration) -> Self {
        self.clock_drift = Some(drift);
        self
    }

    /// Sets [`turn_wait`](Self::turn_wait); checked by [`validate`](Self::validate).
    #[must_use]
    pub fn with_turn_wait(mut self, turn_wait: Duration) -> Self {
        self.turn_wait = turn_wait;
        self
    }

    /// Sets [`settle`](Self::settle); checked by [`validate`](Self::validate).
    #[must_use]
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// Sets [`provider_down`](Self::provider_down); checked by
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
    /// its `keyPrefix` is empty or holds a brace, its `commandTimeoutMs` is under
    /// 1 ms, or its `waitReplicas` is over 100; either coordinator's `dedupIds` is 0
    /// or over [`MAX_DEDUP_IDS`](crate::MAX_DEDUP_IDS); the memory coordinator's
    /// `chatCapacity` is over [`MAX_CHAT_CAPACITY`](crate::MAX_CHAT_CAPACITY).
    pub fn validate(&self) -> Result<(), ConfigError> {
        duration::check_set::<TurnWait>("turnWaitMs", self.turn_wait)?;
        duration::check_set::<Any>("settleMs", self.settle)?;
        duration::check_set::<Any>("providerDownMs", self.provider_down)?;
        self.coordinator.validate()?;
        if let Some(drift) = self.clock_drift {
            duration::check_set::<Any>("clockDriftMs", drift)?;
            let ttl = self.coordinator.lease_ttl();
            if drift >= ttl / 3 {
                return Err(ConfigError::new(format!(
                    "clockDriftMs: {} is not under the renewal period (leaseTtlMs {} / 3): a \
                     holder would stop acting before its first renewal; use a small fraction \
                     of the lease TTL",
                    humantime::format_duration(drift),
                    humantime::format_duration(ttl)
                )));
            }
        }
        Ok(())
    }

    /// This config with its coordinator built once ([`CoordinatorConfig::build`]) and
    /// put in [`CoordinatorConfig::Shared`], so that every clone of the result, and
    /// every bot built from one, uses that one backend instance (see
    /// [`CoordinationConfig`]). A config that is already `Shared` keeps its instance.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use botmesh::{CoordinationConfig, CoordinatorConfig, MemoryCoordinator};
    ///
    /// let config = CoordinationConfig::new(CoordinatorConfig::memory()).shared()?;
    /// let (a, b) = (config.clone(), config);
    /// match (&a.coordinator, &b.coordinator) {
    ///     (CoordinatorConfig::Shared(x), CoordinatorConfig::Shared(y)) => {
    ///         assert!(Arc::ptr_eq(x, y))
    ///     }
    ///     _ => unreachable!("shared() always gives a Shared coordinator"),
    /// }
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
    /// value and the position) when a setting is refused; when the text is not JSON
    /// at all (or ends early), the message says so first, then gives serde_json's.
    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
        serde_json::from_str(s).map_err(|e: serde_json::Error| {
            if e.is_syntax() || e.is_eof() {
                ConfigError::new(format!("the text is not valid JSON: {e}"))
            } else {
                ConfigError::new(e.to_string())
            }
        })
    }
}

impl CoordinatorConfig {
    /// A memory coordinator with default options.
    #[must_use]
    pub fn memory() -> Self {
        CoordinatorConfig::Memory(MemoryOptions::default())
    }

    /// A Redis coordinator for `url` (`redis://[user:password@]host:port[/db]`) with
    /// every other option at its default; checked by [`validate`](Self::validate).
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

    /// The lease TTL of the backend this describes (or is).
    pub fn lease_ttl(&self) -> Duration {
        match self {
            CoordinatorConfig::Memory(options) => options.lease_ttl,
            #[cfg(feature = "redis")]
            CoordinatorConfig::Redis(options) => options.lease_ttl,
            CoordinatorConfig::Shared(coordinator) => coordinator.lease_ttl(),
        }
    }

    /// Checks the backend's options; of a [`Shared`](Self::Shared) coordinator, its
    /// lease TTL (a coordinator built in code may have been given one no lease can be
    /// held with, such as `MemoryCoordinator::with_settings(Duration::ZERO, …)`).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first option at fault as in files
    /// (`coordinator.memory.leaseTtlMs`, `coordinator.redis.url`,
    /// `coordinator.shared.leaseTtl`, ...); see [`CoordinationConfig::validate`]. A
    /// Redis URL is never shown.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            CoordinatorConfig::Memory(options) => options.validate_as("coordinator.memory."),
            #[cfg(feature = "redis")]
            CoordinatorConfig::Redis(options) => {
                super::redis::validate(options, "coordinator.redis.")
            }
            CoordinatorConfig::Shared(coordinator) => duration::check_set::<LeaseTtl>(
                "coordinator.shared.leaseTtl",
                coordinator.lease_ttl(),
            ),
        }
    }

    /// Creates the coordinator this describes: a new
    /// [`MemoryCoordinator`](crate::MemoryCoordinator) for [`Memory`](Self::Memory); a
    /// new connection to the server (`RedisCoordinator::connect`) for `Redis`; the same
    /// instance (a clone of the `Arc`) for [`Shared`](Self::Shared). Every call on a
    /// `Memory` or `Redis` spec creates a new, separate coordinator; see
    /// [`CoordinationConfig::shared`] to build once and share.
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
                crate::MemoryCoordinator::with_settings(options.lease_ttl, options.dedup_window)
                    .with_dedup_ids(options.dedup_ids)
                    .try_chat_capacity_as(
                        "coordinator.memory.chatCapacity",
                        options.chat_capacity,
                    )?,
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
    /// (the URL may hold a password), or `Shared("<backend>")`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoordinatorConfig::Memory(options) => f.debug_tuple("Memory").field(options).finish(),
            // RedisOptions' own Debug redacts the URL.
            #[cfg(feature = "redis")]
            CoordinatorConfig::Redis(options) => f.debug_tuple("Redis").field(options).finish(),
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
    pub const DEFAULT_LEASE_TTL: Duration = crate::coordinator::DEFAULT_LEASE_TTL;
    /// Default of [`dedup_window`](Self::dedup_window): 10 minutes.
    pub const DEFAULT_DEDUP_WINDOW: Duration = crate::coordinator::DEFAULT_DEDUP_WINDOW;
    /// The shortest accepted [`lease_ttl`](Self::lease_ttl): 10 milliseconds, as a
    /// shorter lease would expire before it could be renewed.
    pub const MIN_LEASE_TTL: Duration = duration::MIN_LEASE_TTL;

    /// Sets [`lease_ttl`](Self::lease_ttl); checked by [`validate`](Self::validate).
    #[must_use]
    pub fn with_lease_ttl(mut self, lease_ttl: Duration) -> Self {
        self.lease_ttl = lease_ttl;
        self
    }

    /// Sets [`dedup_window`](Self::dedup_window) (zero disables duplicate
    /// suppression); checked by [`validate`](Self::validate).
    #[must_use]
    pub fn with_dedup_window(mut self, dedup_window: Duration) -> Self {
        self.dedup_window = dedup_window;
        self
    }

    /// Sets [`dedup_ids`](Self::dedup_ids); checked by [`validate`](Self::validate).
    #[must_use]
    pub fn with_dedup_ids(mut self, dedup_ids: usize) -> Self {
        self.dedup_ids = dedup_ids;
        self
    }

    /// Sets [`chat_capacity`](Self::chat_capacity); checked by
    /// [`validate`](Self::validate).
    #[must_use]
    pub fn with_chat_capacity(mut self, chats: usize) -> Self {
        self.chat_capacity = chats;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// A [`ConfigError`] when `leaseTtlMs` is under [`Self::MIN_LEASE_TTL`], either
    /// duration is over [`CoordinationConfig::MAX_DURATION`], `dedupIds` is 0 or over
    /// [`MAX_DEDUP_IDS`](crate::MAX_DEDUP_IDS), or `chatCapacity` is over
    /// [`MAX_CHAT_CAPACITY`](crate::MAX_CHAT_CAPACITY).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as("")
    }

    fn validate_as(&self, prefix: &str) -> Result<(), ConfigError> {
        duration::check_set::<LeaseTtl>(&format!("{prefix}leaseTtlMs"), self.lease_ttl)?;
        duration::check_set::<Any>(&format!("{prefix}dedupWindowMs"), self.dedup_window)?;
        crate::coordinator::check_dedup_ids(&format!("{prefix}dedupIds"), self.dedup_ids)
            .map_err(ConfigError::new)?;
        crate::memory::capacity::check_chat_capacity(
            &format!("{prefix}chatCapacity"),
            self.chat_capacity,
        )
        .map_err(ConfigError::new)
    }
}

impl Default for MemoryOptions {
    /// A 10 second lease TTL, a 10 minute dedup window, 64 ids a chat, no chat
    /// capacity reserved.
    fn default() -> Self {
        MemoryOptions {
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            dedup_window: Self::DEFAULT_DEDUP_WINDOW,
            dedup_ids: crate::coordinator::DEFAULT_DEDUP_IDS,
            chat_capacity: 0,
        }
    }
}
