//! `BotBuilder`: a bot's settings, checked and assembled into running threads.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::context::{Context, ErrorHook, Handler, OutcomeHook};
use super::handle::{Bot, Parts, intake_of};
use super::workers::{Sched, Shared};
use crate::config::{ConfigError, CoordinationConfig, ProviderSession};
use crate::conversation::Flows;
use crate::coordinator::BackendError;
use crate::error::{Error, HandlerError};
use crate::flow::Flow;
use crate::memory::MemoryCoordinator;
use crate::message::{Message, Outcome};
use crate::metrics::Metrics;
use crate::provider::leadership::{Gated, LeaderState, Leadership};
use crate::provider::{Fence, Provider, ProviderError, Reply, Session, StatusSender};
use crate::replica::{Replica, default_drift};

/// A provider to start, with its leadership state when it runs in leader mode.
type Plan = (Arc<dyn Provider>, Option<Arc<LeaderState>>);

/// The default number of worker threads per replica.
pub const DEFAULT_WORKERS: usize = 4;

/// Why a bot could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration was refused; the text names the field and the value.
    Config(ConfigError),
    /// The coordinator could not be reached.
    Backend(BackendError),
    /// A provider failed to start.
    Provider(ProviderError),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => e.fmt(f),
            StartError::Backend(e) => write!(f, "coordinator unavailable: {e}"),
            StartError::Provider(e) => write!(f, "provider failed to start: {e}"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Config(e) => Some(e),
            StartError::Backend(e) => Some(e),
            StartError::Provider(e) => Some(e),
        }
    }
}

/// Builds a [`Bot`].
///
/// ```
/// use std::sync::Arc;
/// use botmesh::{Bot, CoordinationConfig, CoordinatorConfig, MemoryCoordinator, Message};
///
/// let shared = Arc::new(MemoryCoordinator::new());
/// let config = CoordinationConfig::new(CoordinatorConfig::Shared(shared));
/// let bot = Bot::builder()
///     .id("replica-1")
///     .workers(2)
///     .coordination(config)
///     .handler(|ctx| {
///         println!("{}: {}", ctx.message().chat, ctx.message().text);
///         Ok(())
///     })
///     .build()
///     .unwrap();
/// bot.intake().deliver(Message::new("chat-1", "hi").with_id("1")).unwrap();
/// bot.shutdown(); // waits for the message to end
/// ```
#[must_use]
pub struct BotBuilder {
    id: Option<String>,
    workers: usize,
    coordination: Option<CoordinationConfig>,
    handler: Option<Handler>,
    on_error: Option<ErrorHook>,
    on_outcome: Option<OutcomeHook>,
    providers: Vec<Arc<dyn Provider>>,
    flows: Vec<Flow>,
    /// Where replies go when no provider carries them (messages from a webhook).
    sender: Option<Arc<dyn Provider>>,
}

/// A reply function as a provider the runtime never starts: what
/// [`BotBuilder::sender`] wraps, so handlers and flows send the same way either way.
struct SendOnly<F>(F);

impl<F> Provider for SendOnly<F>
where
    F: Fn(&str, &Reply, &Fence<'_>) -> Result<(), ProviderError> + Send + Sync,
{
    fn id(&self) -> &str {
        "sender"
    }
    fn start(&self, _: Session) -> Result<(), ProviderError> {
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        (self.0)(chat, &Reply::new(text), &Fence::none())
    }
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
        (self.0)(chat, reply, fence)
    }
}

impl std::fmt::Debug for BotBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotBuilder")
            .field("id", &self.id)
            .field("workers", &self.workers)
            .field("coordinated", &self.coordination.is_some())
            .field("providers", &self.providers.len())
            .finish_non_exhaustive()
    }
}

impl BotBuilder {
    /// This replica's id, unique among the replicas sharing the coordinator. Default:
    /// `replica-<host>-<pid>-<n>`, the host's name (as the kernel has it; its letters,
    /// digits, `.`, `_` and `-`, at most 63) so that containers, where every bot is
    /// often pid 1, still differ; a restarted process on the same host may reuse its
    /// predecessor's id, which the backends expect.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The number of worker threads (W). Default 4; 0 is refused by `build`.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Runs this bot as one of N replicas. Without it: one process, no coordination
    /// work (no renewal thread, no backend); a chat's messages still run one at a time
    /// and in order.
    pub fn coordination(mut self, config: CoordinationConfig) -> Self {
        self.coordination = Some(config);
        self
    }

    /// The message handler: it gets every message that no conversation and no flow
    /// trigger took. Required unless the bot has flows.
    pub fn handler<F>(mut self, handler: F) -> Self
    where
        F: Fn(&Context<'_>) -> Result<(), HandlerError> + Send + Sync + 'static,
    {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// The error hook: every dropped message and failed handler, once.
    ///
    /// Like [`on_outcome`](Self::on_outcome) it runs wherever a message ends: on a
    /// worker, on botmesh's renewal, timer or subscriber thread, or inside
    /// `Intake::deliver`. Keep hooks short (hand slow work to a channel): a hook that
    /// blocks on the renewal thread delays every lease's renewal, and may lose them.
    pub fn on_error<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Error) + Send + Sync + 'static,
    {
        self.on_error = Some(Arc::new(hook));
        self
    }

    /// The outcome hook: every accepted message, once, when it ends. It runs on the
    /// thread where the message ended (see [`on_error`](Self::on_error)): keep it short.
    pub fn on_outcome<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Message, &Outcome) + Send + Sync + 'static,
    {
        self.on_outcome = Some(Arc::new(hook));
        self
    }

    /// Registers a conversation flow (see [`Flow`]). Names must be unique; a `goto`
    /// must name a registered flow (both checked by `build`).
    pub fn flow(mut self, flow: Flow) -> Self {
        self.flows.push(flow);
        self
    }

    /// Adds a provider. Who starts it depends on the coordination config's
    /// [`provider_session`](CoordinationConfig::provider_session): in shared mode (and
    /// without coordination) `build` starts it; in leader mode (the default for a
    /// provider with [`exclusive_session`](crate::Capabilities::exclusive_session)) it
    /// is started only while this replica holds the provider's leadership. Either way
    /// `shutdown` stops it. Handlers reply through the first provider added.
    pub fn provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.providers.push(provider);
        self
    }

    /// Where handlers' replies and flows' answers and prompts go when no provider
    /// carries them: a bot fed through [`Bot::intake`] by a webhook endpoint of its own
    /// needs no transport stub, only this. `send(chat, reply, fence)` is called on the
    /// worker threads, possibly concurrently, after a fence check; one that retries
    /// asks [`Fence::is_live`] before every attempt. Ignored when the bot has a
    /// provider (replies go through the first provider then).
    ///
    /// ```
    /// use botmesh::{Bot, Flow, Message};
    ///
    /// let bot = Bot::builder()
    ///     .sender(|chat, reply, _fence| {
    ///         println!("to {chat}: {}", reply.text); // your platform's send call
    ///         Ok(())
    ///     })
    ///     .flow(Flow::new("hello").catch_all().answer("Hello!"))
    ///     .build()?;
    /// bot.intake().deliver(Message::new("chat-1", "hi"))?;
    /// bot.shutdown();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sender<F>(mut self, send: F) -> Self
    where
        F: Fn(&str, &Reply, &Fence<'_>) -> Result<(), ProviderError> + Send + Sync + 'static,
    {
        self.sender = Some(Arc::new(SendOnly(send)));
        self
    }

    /// Validates the settings, attaches to the coordinator, starts the threads and
    /// the providers (shared ones directly; leader-mode ones begin campaigning for
    /// their leadership, and start once this replica wins it).
    ///
    /// # Errors
    /// [`StartError::Config`] for a missing handler (without flows), zero workers, two
    /// providers with one id, flows without a provider or sender, an invalid coordination config,
    /// or invalid flows (a duplicate name, a `goto` to no flow, a `goto` cycle without
    /// a wait, a keyword with no letter or digit, `settle` of 0); [`StartError::Backend`]
    /// when the coordinator cannot be reached or a thread cannot be spawned;
    /// [`StartError::Provider`] when a shared-mode provider fails to start or panics
    /// in it (the bot is stopped again then). A leader-mode provider that fails to
    /// start does not fail the build: it counts as a closed transport, and the leader
    /// steps down after `provider_down`.
    pub fn build(self) -> Result<Bot, StartError> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        if !self.flows.is_empty() && self.providers.is_empty() && self.sender.is_none() {
            return Err(StartError::Config(ConfigError::new(
                "provider: missing; flows send their answers and prompts through a provider \
                 or a sender: add one with .provider(…), or .sender(…) when messages come \
                 through the intake (webhooks)",
            )));
        }
        if self.handler.is_none() && self.flows.is_empty() {
            return Err(StartError::Config(ConfigError::new(
                "handler: missing; set one with .handler(…) or register flows with .flow(…)",
            )));
        }
        if self.workers == 0 {
            return Err(StartError::Config(ConfigError::new(
                "workers: 0 is not allowed; use at least 1",
            )));
        }
        let id = self.id.unwrap_or_else(|| {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            format!("replica-{}-{}-{n}", host_name(), std::process::id())
        });
        if id.is_empty() {
            return Err(StartError::Config(ConfigError::new(
                "id: \"\" is empty; give the replica a name",
            )));
        }
        for (i, p) in self.providers.iter().enumerate() {
            if self.providers[..i].iter().any(|q| q.id() == p.id()) {
                return Err(StartError::Config(ConfigError::new(format!(
                    "provider id {:?} is used twice; give each provider its own id",
                    p.id()
                ))));
            }
        }
        // Which providers run under a leadership: only with coordination (one process
        // has nobody to share a session with).
        let leads = |p: &Arc<dyn Provider>| match &self.coordination {
            None => false,
            Some(c) => match c.provider_session {
                ProviderSession::Leader => true,
                ProviderSession::Shared => false,
                ProviderSession::Auto => p.capabilities().exclusive_session,
            },
        };
        let plans: Vec<Plan> = self
            .providers
            .iter()
            .map(|p| {
                let state = leads(p).then(|| Arc::new(LeaderState::new(Arc::from(p.id()))));
                (p.clone(), state)
            })
            .collect();
        let provider_down = self
            .coordination
            .as_ref()
            .map_or(Duration::ZERO, |c| c.provider_down);
        let metrics = Arc::new(Metrics::default());
        let (replica, turn_wait, settle, handover) = match &self.coordination {
            Some(config) => {
                config.validate().map_err(StartError::Config)?;
                let coordinator = config.coordinator.build().map_err(StartError::Backend)?;
                let drift = config
                    .clock_drift
                    .unwrap_or_else(|| default_drift(coordinator.lease_ttl()));
                let replica = Replica::start_with(id, coordinator, metrics.clone(), true, drift)
                    .map_err(StartError::Backend)?;
                (replica, config.turn_wait, config.settle, config.handover)
            }
            None => {
                let local = Arc::new(MemoryCoordinator::local());
                // Leases that never expire need no allowance.
                let replica =
                    Replica::start_with(id, local, metrics.clone(), false, Duration::ZERO)
                        .map_err(StartError::Backend)?;
                (
                    replica,
                    Duration::MAX,
                    CoordinationConfig::DEFAULT_SETTLE,
                    Default::default(),
                )
            }
        };
        let flows = if self.flows.is_empty() {
            None
        } else {
            let coordinated = self.coordination.is_some();
            Some(
                Flows::new(self.flows, handover, settle, coordinated)
                    .map_err(|e| StartError::Config(ConfigError::new(e)))?,
            )
        };
        let shared = Arc::new(Shared {
            replica: replica.inner.clone(),
            turn_wait,
            handler: self.handler,
            flows,
            on_error: self.on_error,
            on_outcome: self.on_outcome,
            // Replies through a leader-mode provider pass its leadership gate.
            provider: plans
                .first()
                .map(|(p, state)| match state {
                    Some(state) => Arc::new(Gated {
                        inner: p.clone(),
                        state: state.clone(),
                    }) as Arc<dyn Provider>,
                    None => p.clone(),
                })
                .or(self.sender),
            metrics,
            sched: Mutex::new(Sched::default()),
            work_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            workers: Mutex::new(HashMap::new()),
            next_worker: AtomicUsize::new(0),
        });
        let mut parts = Parts::new(replica);
        let spawned = (0..self.workers).try_for_each(|_| shared.spawn_worker());
        if let Err(e) = spawned {
            parts.stop_workers(&shared);
            return Err(StartError::Backend(BackendError::new(format!(
                "cannot spawn a thread: {e}"
            ))));
        }
        // Settle cuts and delays, and the re-asking of in-flight duplicates, go
        // through the replica's timer, which a replica without coordination does not
        // start by itself.
        if let Some(Err(e)) = parts.replica.as_ref().map(Replica::start_timer) {
            parts.stop_workers(&shared);
            return Err(StartError::Backend(e));
        }
        // Shared providers first: they are the ones whose failure stops the build.
        for (p, _) in plans.iter().filter(|(_, state)| state.is_none()) {
            let status = StatusSender::new(
                Arc::from(p.id()),
                shared.replica.id.clone(),
                shared.metrics.clone(),
                0,
                None,
            );
            let session = Session::new(intake_of(&shared), status, None);
            let started = catch_unwind(AssertUnwindSafe(|| p.start(session)))
                .unwrap_or_else(|_| Err(ProviderError("start panicked".into())));
            if let Err(e) = started {
                parts.stop_providers();
                parts.stop_workers(&shared);
                return Err(StartError::Provider(e));
            }
            parts.providers.push(p.clone());
        }
        for (p, state) in plans {
            let Some(state) = state else { continue };
            let spawned = Leadership::spawn(
                shared.replica.clone(),
                p,
                state,
                intake_of(&shared),
                shared.metrics.clone(),
                provider_down,
            );
            match spawned {
                Ok(l) => parts.leaders.push(l),
                Err(e) => {
                    parts.stop_providers();
                    parts.stop_workers(&shared);
                    return Err(StartError::Backend(BackendError::new(format!(
                        "cannot spawn a leadership thread: {e}"
                    ))));
                }
            }
        }
        Ok(Bot::assemble(shared, parts))
    }
}

impl Bot {
    /// A builder with defaults: 4 workers, no coordination, no hooks.
    pub fn builder() -> BotBuilder {
        BotBuilder {
            id: None,
            workers: DEFAULT_WORKERS,
            coordination: None,
            handler: None,
            on_error: None,
            on_outcome: None,
            providers: Vec::new(),
            flows: Vec::new(),
            sender: None,
        }
    }
}

/// The host's name for default replica ids: the kernel's (`/proc/sys/kernel/hostname`,
/// else `$HOSTNAME`), cut to the characters an id shows plainly; `host` when neither
/// is readable.
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(63)
        .collect();
    if name.is_empty() {
        "host".to_owned()
    } else {
        name
    }
}
