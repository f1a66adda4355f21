//! The bot runtime: intake, the local turn table that schedules workers, and hooks.
//!
//! A message goes through three stages:
//!
//! 1. **Intake** ([`Intake::deliver`], called by a provider or a webhook handler): the
//!    message gets a ticket in its chat's queue at the coordinator. The call returns
//!    when the ticket is placed, so the message's place in its chat's order is fixed
//!    before the platform is told "accepted".
//! 2. **Waiting**: the ticket waits for its grant without holding any thread; the
//!    grant (pushed by a release, or found by the re-check) moves the message to the
//!    ready queue.
//! 3. **Running**: one of the W workers, all blocked on one condition variable, takes
//!    the next ready message, runs the handler under the turn, and releases the turn,
//!    which hands the chat to its next waiter.
//!
//! Every accepted message ends exactly once, as an [`Outcome`]: handled, failed,
//! dropped (reported through the error hook and the log), or a duplicate.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::config::{ConfigError, CoordinationConfig, ProviderSession};
use crate::conversation::{
    At, CheckpointStore, Flows, Live, Route, Run, RunSlot, StepsEnd, now_ms,
};
use crate::coordinator::{BackendError, Token};
use crate::error::{CoordinationUnavailableError, Error, HandlerError, Reason};
use crate::flow::{Flow, State};
use crate::leadership::{Gated, LeaderState, Leadership};
use crate::memory::MemoryCoordinator;
use crate::message::{Message, Outcome};
use crate::metrics::{Metrics, MetricsSnapshot, inc};
use crate::provider::{Provider, ProviderError, Session, StatusSender};
use crate::replica::{Accepted, Inner, OnGrant, Replica};
use crate::turn::Turn;

/// The message handler: runs once per message, under the chat's turn, on a worker.
pub type Handler = Arc<dyn Fn(&Context<'_>) -> Result<(), HandlerError> + Send + Sync>;
/// Called once for every error the bot reports (dropped messages, failed handlers).
pub type ErrorHook = Arc<dyn Fn(&Error) + Send + Sync>;
/// Called once for every accepted message when it ends, with how it ended.
pub type OutcomeHook = Arc<dyn Fn(&Message, &Outcome) + Send + Sync>;

/// A provider to start, with its leadership state when it runs in leader mode.
type Plan = (Arc<dyn Provider>, Option<Arc<LeaderState>>);

/// The default number of worker threads per replica.
pub const DEFAULT_WORKERS: usize = 4;

/// What a handler sees: the message, its turn, and a way to reply.
pub struct Context<'a> {
    message: &'a Message,
    turn: &'a Turn,
    provider: Option<&'a Arc<dyn Provider>>,
    start: RefCell<Option<String>>,
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
        if self.turn.is_lost() {
            return Err(ProviderError(format!(
                "send refused: the turn on chat {:?} was lost",
                self.message.chat
            )));
        }
        match self.provider {
            Some(p) => p.send(&self.message.chat, text),
            None => Err(ProviderError("the bot has no provider to send with".into())),
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

/// Why a bot could not start.
#[derive(Debug)]
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
    /// `replica-<pid>-<n>`.
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
    pub fn on_error<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Error) + Send + Sync + 'static,
    {
        self.on_error = Some(Arc::new(hook));
        self
    }

    /// The outcome hook: every accepted message, once, when it ends.
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

    /// Validates the settings, attaches to the coordinator, starts the threads and
    /// the providers (shared ones directly; leader-mode ones begin campaigning for
    /// their leadership, and start once this replica wins it).
    ///
    /// # Errors
    /// [`StartError::Config`] for a missing handler (without flows), zero workers, two
    /// providers with one id, flows without a provider, an invalid coordination config,
    /// or invalid flows (a duplicate name, a `goto` to no flow, a `goto` cycle without
    /// a wait, a keyword with no letter or digit, `settle` of 0); [`StartError::Backend`]
    /// when the coordinator cannot be reached or a thread cannot be spawned;
    /// [`StartError::Provider`] when a shared-mode provider fails to start or panics
    /// in it (the bot is stopped again then). A leader-mode provider that fails to
    /// start does not fail the build: it counts as a closed transport, and the leader
    /// steps down after `provider_down`.
    pub fn build(self) -> Result<Bot, StartError> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        if !self.flows.is_empty() && self.providers.is_empty() {
            return Err(StartError::Config(ConfigError::new(
                "provider: missing; flows send their answers and prompts through a provider, \
                 add one with .provider(…)",
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
            format!(
                "replica-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            )
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
                let replica = Replica::start_with(id, coordinator, metrics.clone(), true)
                    .map_err(StartError::Backend)?;
                (replica, config.turn_wait, config.settle, config.handover)
            }
            None => {
                let local = Arc::new(MemoryCoordinator::local());
                let replica = Replica::start_with(id, local, metrics.clone(), false)
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
            provider: plans.first().map(|(p, state)| match state {
                Some(state) => Arc::new(Gated {
                    inner: p.clone(),
                    state: state.clone(),
                }) as Arc<dyn Provider>,
                None => p.clone(),
            }),
            metrics,
            sched: Mutex::new(Sched::default()),
            work_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            workers: Mutex::new(HashMap::new()),
            next_worker: AtomicUsize::new(0),
            timer: Mutex::new(Timer::default()),
            timer_cv: Condvar::new(),
        });
        let mut bot = Bot::assemble(shared.clone(), replica, Vec::new());
        let mut spawned = (0..self.workers).try_for_each(|_| shared.spawn_worker());
        if spawned.is_ok() && shared.flows.is_some() {
            let s = shared.clone();
            spawned = std::thread::Builder::new()
                .name(format!("botmesh-flows-{}", shared.replica.id))
                .spawn(move || s.timer_loop())
                .map(|t| bot.timer = Some(t));
        }
        if let Err(e) = spawned {
            bot.stop_workers();
            return Err(StartError::Backend(BackendError::new(format!(
                "cannot spawn a thread: {e}"
            ))));
        }
        // Shared providers first: they are the ones whose failure stops the build.
        for (p, _) in plans.iter().filter(|(_, state)| state.is_none()) {
            let status = StatusSender::new(
                Arc::from(p.id()),
                bot.shared.replica.id.clone(),
                bot.shared.metrics.clone(),
                0,
                None,
            );
            let session = Session::new(bot.intake(), status, None);
            let started = catch_unwind(AssertUnwindSafe(|| p.start(session)))
                .unwrap_or_else(|_| Err(ProviderError("start panicked".into())));
            if let Err(e) = started {
                bot.stop_providers();
                bot.stop_workers();
                return Err(StartError::Provider(e));
            }
            bot.providers.push(p.clone());
        }
        for (p, state) in plans {
            let Some(state) = state else { continue };
            let spawned = Leadership::spawn(
                bot.shared.replica.clone(),
                p,
                state,
                bot.intake(),
                bot.shared.metrics.clone(),
                provider_down,
            );
            match spawned {
                Ok(l) => bot.leaders.push(l),
                Err(e) => {
                    bot.stop_providers();
                    bot.stop_workers();
                    return Err(StartError::Backend(BackendError::new(format!(
                        "cannot spawn a leadership thread: {e}"
                    ))));
                }
            }
        }
        Ok(bot)
    }
}

/// One replica of a bot: W worker threads running a handler per message under the
/// chat's turn.
///
/// Build it with [`Bot::builder`]; feed it through [`Bot::intake`] (or providers);
/// stop it with [`Bot::shutdown`]. See the [`BotBuilder`] example.
pub struct Bot {
    shared: Arc<Shared>,
    timer: Option<JoinHandle<()>>,
    replica: Option<Replica>,
    /// Providers started directly (shared mode, or no coordination).
    providers: Vec<Arc<dyn Provider>>,
    /// Leader-mode providers: one leadership thread each.
    leaders: Vec<Leadership>,
}

impl std::fmt::Debug for Bot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bot")
            .field("id", &self.shared.replica.id)
            .field("workers", &self.shared.workers.lock().len())
            .finish_non_exhaustive()
    }
}

/// A cloneable handle that takes messages into a bot (what a webhook or provider
/// calls).
#[derive(Clone)]
pub struct Intake {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("replica", &self.shared.replica.id)
            .finish()
    }
}

impl Intake {
    /// Takes a message in. Returns once the message holds its place in its chat's
    /// queue (so a webhook may answer 200 then); the handler runs later on a worker,
    /// and the outcome hook hears how it ended.
    ///
    /// # Errors
    /// [`CoordinationUnavailableError`] with reason `backend` when the coordinator
    /// cannot be reached, `shutting_down` when the bot is stopping. The message was not
    /// taken in then: the caller should answer the platform with an error so it retries.
    pub fn deliver(&self, message: Message) -> Result<Accepted, CoordinationUnavailableError> {
        self.shared.deliver(message)
    }

    /// The id of the replica this intake feeds.
    pub fn replica(&self) -> &str {
        &self.shared.replica.id
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
        }
    }

    fn assemble(shared: Arc<Shared>, replica: Replica, providers: Vec<Arc<dyn Provider>>) -> Bot {
        Bot {
            shared,
            timer: None,
            replica: Some(replica),
            providers,
            leaders: Vec::new(),
        }
    }

    /// The handle that takes messages in.
    pub fn intake(&self) -> Intake {
        Intake {
            shared: self.shared.clone(),
        }
    }

    /// This replica's id.
    pub fn id(&self) -> &str {
        &self.shared.replica.id
    }

    /// A snapshot of this replica's counters and gauges.
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut m = self.shared.metrics.snapshot();
        // A leadership still without an open session counts up to now.
        let now = Instant::now();
        for l in &self.leaders {
            if let Some(since) = *l.state().unopened_since.lock() {
                let ms = u64::try_from(now.saturating_duration_since(since).as_millis());
                m.leaderless_ms += ms.unwrap_or(u64::MAX);
            }
        }
        m
    }

    /// The fencing token of this replica's leadership of the provider with id
    /// `provider`, while this replica leads it and its lease is not known to be lost;
    /// `None` on a standby, for a provider in shared mode, or for an unknown id.
    pub fn leader_token(&self, provider: &str) -> Option<Token> {
        self.leaders
            .iter()
            .find(|l| &*l.state().provider == provider)
            .and_then(|l| l.state().token())
    }

    /// Messages taken in that have not ended yet (waiting, ready or running).
    pub fn in_flight(&self) -> usize {
        self.shared.sched.lock().in_flight
    }

    /// A clean stop: intake refuses new messages (a provider's `deliver` gets
    /// `shutting_down`, so the platform sends them again), every message taken in runs
    /// to its end (each still bounded by `turn_wait`) with its replies still going out,
    /// then providers stop (a leader stops its transport, then releases its leadership
    /// so a standby takes over at once), the workers stop and every turn is released
    /// at the coordinator.
    pub fn shutdown(mut self) {
        self.drain(None);
    }

    /// Like [`Bot::shutdown`], but messages still waiting for their turn after
    /// `grace` are reported `shutting_down` instead of being waited for.
    pub fn shutdown_within(mut self, grace: Duration) {
        self.drain(Some(grace));
    }

    /// A simulated crash: the renewal thread stops, nothing is released or reported,
    /// and messages not yet ended are lost with the replica (its turns lapse within the
    /// TTL). Transports stop as a dead process's connections would, but a leadership
    /// is not released: a standby takes over after the TTL. Workers exit once their
    /// current handler returns; `abort` does not wait for them. For tests of replica
    /// failure.
    pub fn abort(mut self) {
        // The replica first, so that no leadership thread can release its lease.
        if let Some(r) = self.replica.take() {
            r.abort();
        }
        for l in self.leaders.drain(..) {
            l.abort();
        }
        self.stop_providers();
        {
            let mut s = self.shared.sched.lock();
            s.ready.clear();
            s.stopping = true;
        }
        self.shared.work_cv.notify_all();
        // Not joined: a worker stuck in a handler would block the "crash". Each one
        // exits when its handler returns.
        self.shared.workers.lock().clear();
        self.stop_timer(false);
    }

    fn stop_timer(&mut self, join: bool) {
        self.shared.timer.lock().stopped = true;
        self.shared.timer_cv.notify_all();
        if let Some(t) = self.timer.take()
            && join
            && t.join().is_err()
        {
            log::error!(target: "botmesh::runtime", "the flows timer thread panicked");
        }
    }

    fn drain(&mut self, grace: Option<Duration>) {
        // Intake closes first and the providers stop last: the replies of messages
        // still running here go out through a transport that is still up (and, in
        // leader mode, under a leadership that is still held). Messages a transport
        // delivers meanwhile are refused (`shutting_down`), so the platform sends them
        // again, to the next leader.
        let deadline = grace.and_then(|g| Instant::now().checked_add(g));
        {
            let mut s = self.shared.sched.lock();
            s.closed = true;
            while s.in_flight > 0 {
                match deadline {
                    Some(d) => {
                        if self.shared.idle_cv.wait_until(&mut s, d).timed_out() {
                            break;
                        }
                    }
                    None => self.shared.idle_cv.wait(&mut s),
                }
            }
        }
        if let Some(r) = &self.replica {
            // Messages still waiting end as `shutting_down`; those running or ready
            // finish below while the renewal thread still keeps their leases.
            r.cancel_waiters();
        }
        {
            let mut s = self.shared.sched.lock();
            while s.in_flight > 0 {
                self.shared.idle_cv.wait(&mut s);
            }
        }
        self.stop_providers();
        self.stop_timer(true);
        self.stop_workers();
        if let Some(r) = self.replica.take() {
            r.shutdown();
        }
    }

    fn stop_providers(&mut self) {
        for l in self.leaders.drain(..) {
            l.stop();
        }
        for p in self.providers.drain(..) {
            if catch_unwind(AssertUnwindSafe(|| p.stop())).is_err() {
                log::error!(target: "botmesh::runtime", "provider {:?} panicked in stop", p.id());
            }
        }
    }

    fn stop_workers(&mut self) {
        self.shared.sched.lock().stopping = true;
        self.shared.work_cv.notify_all();
        let workers: Vec<JoinHandle<()>> =
            self.shared.workers.lock().drain().map(|(_, w)| w).collect();
        for w in workers {
            if w.join().is_err() {
                log::error!(target: "botmesh::runtime", "a worker thread panicked");
            }
        }
    }
}

impl Drop for Bot {
    fn drop(&mut self) {
        if self.replica.is_some() {
            self.drain(None);
        }
    }
}

/// Work a replacement worker does before it joins the pool.
type FirstTask = Box<dyn FnOnce(&Shared) + Send>;

/// Work for a worker, under a turn.
enum Job {
    /// A message taken in.
    Message(Arc<Message>),
    /// A conversation's delay ran out (wall clock, ms): run its next steps.
    Wake(Arc<str>, u64),
}

#[derive(Default)]
struct Sched {
    ready: VecDeque<(Job, Turn)>,
    in_flight: usize,
    closed: bool,
    stopping: bool,
}

/// The flows timer's queue: settle deadlines and delay wake-ups.
#[derive(Default)]
struct Timer {
    heap: BinaryHeap<Reverse<TimerEntry>>,
    seq: u64,
    stopped: bool,
}

struct TimerEntry {
    at: Instant,
    seq: u64,
    job: TimerJob,
}

enum TimerJob {
    /// Stop the run if it is still going (its `settle` ran out).
    Cut {
        slot: Weak<RunSlot>,
        chat: Arc<str>,
        token: Token,
        worker: usize,
        waited: Duration,
    },
    /// Queue a wake-up of the chat's delayed conversation for its turn.
    Wake(Arc<str>, u64),
}

impl PartialEq for TimerEntry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for TimerEntry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Checkpoints go through the replica, which maps chat ids to coordinator keys.
struct ReplicaStore<'a>(&'a Inner);

impl CheckpointStore for ReplicaStore<'_> {
    fn read(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError> {
        self.0.read_checkpoint(chat)
    }
    fn write(&self, chat: &str, token: Token, data: Option<&str>) -> Result<bool, BackendError> {
        self.0.write_checkpoint(chat, token, data)
    }
}

struct Shared {
    replica: Arc<Inner>,
    turn_wait: Duration,
    handler: Option<Handler>,
    flows: Option<Flows>,
    on_error: Option<ErrorHook>,
    on_outcome: Option<OutcomeHook>,
    provider: Option<Arc<dyn Provider>>,
    metrics: Arc<Metrics>,
    sched: Mutex<Sched>,
    work_cv: Condvar,
    idle_cv: Condvar,
    /// Live worker threads by number. A worker stuck in a stopped step is removed
    /// (detached) and replaced, so the pool keeps its size.
    workers: Mutex<HashMap<usize, JoinHandle<()>>>,
    next_worker: AtomicUsize,
    timer: Mutex<Timer>,
    timer_cv: Condvar,
}

impl Shared {
    fn spawn_worker(self: &Arc<Self>) -> std::io::Result<()> {
        self.spawn_worker_with(None).map_err(|(e, _)| e)
    }

    /// Starts a worker that first runs `first`. On failure `first` comes back, so the
    /// caller can run it itself.
    fn spawn_worker_with(
        self: &Arc<Self>,
        first: Option<FirstTask>,
    ) -> Result<(), (std::io::Error, Option<FirstTask>)> {
        let n = self.next_worker.fetch_add(1, Ordering::Relaxed);
        let s = self.clone();
        // The map is locked across the spawn so the thread cannot retire before its
        // handle is in the map.
        let mut workers = self.workers.lock();
        let slot = Arc::new(Mutex::new(first));
        let task = slot.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("botmesh-worker-{}-{n}", self.replica.id))
            .spawn(move || {
                if let Some(f) = task.lock().take() {
                    f(&s);
                }
                s.worker_loop(n)
            });
        match spawned {
            Ok(t) => {
                workers.insert(n, t);
                Ok(())
            }
            Err(e) => Err((e, slot.lock().take())),
        }
    }

    fn deliver(
        self: &Arc<Self>,
        message: Message,
    ) -> Result<Accepted, CoordinationUnavailableError> {
        {
            let mut s = self.sched.lock();
            if s.closed {
                inc(&self.metrics.shutting_down);
                return Err(CoordinationUnavailableError::new(
                    Reason::ShuttingDown,
                    &message.chat,
                    message.id.as_deref(),
                ));
            }
            s.in_flight += 1;
        }
        let message = Arc::new(message);
        let me = self.clone();
        let m = message.clone();
        let on_grant: OnGrant = Box::new(move |result| match result {
            Ok(turn) => {
                let mut s = me.sched.lock();
                s.ready.push_back((Job::Message(m), turn));
                drop(s);
                me.work_cv.notify_one();
            }
            Err(e) => me.end(&m, Outcome::Dropped(e)),
        });
        let result = self.replica.enqueue(
            &message.chat,
            message.id.as_deref(),
            self.turn_wait,
            on_grant,
        );
        match &result {
            Ok(Accepted::Queued) => {}
            Ok(Accepted::Duplicate) => self.end(&message, Outcome::Duplicate),
            Err(_) => self.finish(),
        }
        result
    }

    fn worker_loop(self: Arc<Self>, n: usize) {
        loop {
            let (job, turn) = {
                let mut s = self.sched.lock();
                loop {
                    if let Some(job) = s.ready.pop_front() {
                        break job;
                    }
                    if s.stopping {
                        return;
                    }
                    self.work_cv.wait(&mut s);
                }
            };
            let keep = match (&self.flows, job) {
                (Some(flows), job) => self.run_flows(flows, job, turn, n),
                (None, Job::Message(m)) => {
                    self.run(&m, turn);
                    true
                }
                (None, Job::Wake(..)) => true,
            };
            if !keep {
                // This worker's step was stopped by `settle` and a replacement was
                // started: leave the pool.
                return;
            }
        }
    }

    fn run(&self, message: &Message, turn: Turn) {
        if turn.is_lost() {
            let e = CoordinationUnavailableError::new(
                Reason::Lost,
                &message.chat,
                message.id.as_deref(),
            );
            drop(turn);
            return self.end(message, Outcome::Dropped(e));
        }
        let (failure, _) = self.call_handler(message, &turn);
        let waited = turn.waited();
        self.finish_turn(Some(message), turn, failure, waited);
    }

    /// Reports how a message ended, once, and counts it out of the in-flight total.
    fn end(&self, message: &Message, outcome: Outcome) {
        match &outcome {
            Outcome::Handled { .. } => inc(&self.metrics.handled),
            Outcome::Failed(text) => {
                inc(&self.metrics.failed);
                let e = Error::Handler {
                    chat: message.chat.clone(),
                    message_id: message.id.clone(),
                    message: text.clone(),
                };
                log::error!(target: "botmesh::runtime", "{e}");
                self.call_error_hook(&e);
            }
            Outcome::Dropped(e) => {
                log::warn!(target: "botmesh::runtime", "{e}");
                self.call_error_hook(&Error::Coordination(e.clone()));
            }
            Outcome::Duplicate => {
                log::debug!(target: "botmesh::runtime", "duplicate message {:?} of chat {:?} skipped", message.id, message.chat);
            }
        }
        if let Some(hook) = &self.on_outcome {
            // A panicking hook must not lose the message's end: the in-flight count
            // would never reach zero and shutdown would hang.
            if catch_unwind(AssertUnwindSafe(|| hook(message, &outcome))).is_err() {
                log::error!(target: "botmesh::runtime", "the outcome hook panicked");
            }
        }
        self.finish();
    }

    /// Runs the handler (if any) on `message`; returns its failure text and the flow
    /// it asked to start.
    fn call_handler(&self, message: &Message, turn: &Turn) -> (Option<String>, Option<String>) {
        let Some(handler) = &self.handler else {
            return (None, None);
        };
        let ctx = Context {
            message,
            turn,
            provider: self.provider.as_ref(),
            start: RefCell::new(None),
        };
        let result = catch_unwind(AssertUnwindSafe(|| handler(&ctx)));
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(panic) => Some(panic_text("handler", &panic)),
        };
        (failure, ctx.start.into_inner())
    }

    /// Sends `text` to `chat` through the bot's provider. A panicking provider is
    /// reported as an error, so that the worker and the message's end survive it.
    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        let Some(p) = &self.provider else {
            return Err(ProviderError("the bot has no provider to send with".into()));
        };
        catch_unwind(AssertUnwindSafe(|| p.send(chat, text)))
            .unwrap_or_else(|panic| Err(ProviderError(panic_text("the provider's send", &panic))))
    }

    /// Runs a job of a bot with flows: the message feeds the chat's conversation (or a
    /// flow trigger, or the handler), then the conversation's steps run under the turn
    /// up to their next wait, bounded by `settle`. Returns `false` when `settle` cut
    /// the run: this worker was replaced and must leave.
    fn run_flows(self: &Arc<Self>, flows: &Flows, job: Job, turn: Turn, worker: usize) -> bool {
        let (chat, message, wake): (Arc<str>, Option<Arc<Message>>, Option<u64>) = match job {
            Job::Message(m) => (Arc::from(m.chat.as_str()), Some(m), None),
            Job::Wake(chat, at) => (chat, None, Some(at)),
        };
        let token = turn.fencing_token();
        let waited = turn.waited();
        let lost = |turn: Turn| {
            drop(turn);
            CoordinationUnavailableError::new(
                Reason::Lost,
                &chat,
                message.as_ref().and_then(|m| m.id.as_deref()),
            )
        };
        if turn.is_lost() {
            let e = lost(turn);
            self.end_job(message.as_deref(), Outcome::Dropped(e));
            return true;
        }
        let store = ReplicaStore(&self.replica);
        let mut live = match flows.take(&chat, &turn, &store, &self.metrics) {
            Ok(live) => live,
            Err(e) => {
                // Without its conversation the message would be misread (an answer
                // taken for a new request): it is not handled, and says why.
                drop(turn);
                let id = message.as_ref().and_then(|m| m.id.as_deref());
                let e =
                    CoordinationUnavailableError::new(Reason::Backend, &chat, id).with_source(e);
                self.end_job(message.as_deref(), Outcome::Dropped(e));
                return true;
            }
        };
        let mut failure: Option<String> = None;
        let mut flow_error: Option<String> = None;
        match (&message, wake) {
            (Some(m), _) => match flows.route(&live, &m.text) {
                Route::Capture => match flows.capture(&mut live, m) {
                    Ok(Some(retry)) => {
                        let sent = if turn.is_lost() {
                            Err(ProviderError(format!(
                                "send refused: the turn on chat {chat:?} was lost"
                            )))
                        } else {
                            self.send(&chat, &retry)
                        };
                        if let Err(e) = sent {
                            log::warn!(target: "botmesh::conversation", "chat {chat:?}: send failed: {e}");
                        }
                    }
                    Ok(None) => {}
                    Err(e) => flow_error = Some(e),
                },
                Route::Resume => {
                    if let Some(c) = live.conversation.as_mut() {
                        c.at = At::Run;
                    }
                }
                Route::Start(i) => live.conversation = Some(flows.start(i, State::new())),
                Route::Handler => {
                    let (failed, start) = self.call_handler(m, &turn);
                    failure = failed;
                    if let Some(name) = start {
                        match flows.index_of(&name) {
                            Some(i) => live.conversation = Some(flows.start(i, State::new())),
                            None => {
                                flow_error = Some(format!("start_flow({name:?}): no such flow"))
                            }
                        }
                    }
                }
            },
            (None, Some(at)) => {
                if let Some(c) = live.conversation.as_mut()
                    && c.at == (At::Delay { wake_at_ms: at })
                {
                    let now = now_ms();
                    if now >= at {
                        c.at = At::Run;
                    } else {
                        // The timer is clamped to MAX_DURATION (~24.8 days): wait again.
                        let left = Duration::from_millis(at - now);
                        self.timer_add(
                            Instant::now() + left.min(CoordinationConfig::MAX_DURATION),
                            TimerJob::Wake(chat.clone(), at),
                        );
                    }
                }
            }
            (None, None) => {}
        }
        // The steps the message fed run under the turn, for at most `settle`.
        let slot = Arc::new(RunSlot::default());
        {
            let mut g = slot.inner.lock();
            g.turn = Some(turn);
            g.message = message.clone();
            g.stored = live.stored;
            // A cut before the first boundary puts back the conversation as it is now.
            g.snapshot = live.conversation.clone();
        }
        if live.conversation.as_ref().is_some_and(|c| c.at == At::Run) {
            // Only a run that has steps to run can outlast settle.
            self.timer_add(
                Instant::now() + flows.settle.min(CoordinationConfig::MAX_DURATION),
                TimerJob::Cut {
                    slot: Arc::downgrade(&slot),
                    chat: chat.clone(),
                    token,
                    worker,
                    waited,
                },
            );
        }
        let outbox = |text: &str| -> Result<(), ProviderError> {
            let held = slot
                .inner
                .lock()
                .turn
                .as_ref()
                .is_some_and(|t| !t.is_lost());
            if !held || slot.control.is_cancelled() {
                return Err(ProviderError(format!(
                    "send refused: the turn on chat {chat:?} was lost or the step was stopped"
                )));
            }
            self.send(&chat, text)
        };
        let schedule_wake = |at: u64| {
            let now = now_ms();
            let delay = Duration::from_millis(at.saturating_sub(now));
            self.timer_add(
                Instant::now() + delay.min(CoordinationConfig::MAX_DURATION),
                TimerJob::Wake(chat.clone(), at),
            );
        };
        let run = Run {
            token,
            slot: &slot,
            store: &store,
            outbox: &outbox,
            schedule_wake: &schedule_wake,
        };
        let end = flows.run_steps(&chat, &mut live, &run);
        let turn = {
            let mut g = slot.inner.lock();
            if g.cut {
                return false;
            }
            g.done = true;
            g.turn.take()
        };
        let Some(turn) = turn else { return true };
        match end {
            StepsEnd::Cut => return false,
            StepsEnd::Stale => {
                log::warn!(target: "botmesh::conversation", "chat {chat:?}: a newer turn exists; this conversation copy is dropped");
            }
            StepsEnd::Failed(e) => {
                flow_error = Some(e);
                flows.put(&chat, token, live);
            }
            StepsEnd::Done if turn.is_lost() => {}
            StepsEnd::Done => flows.put(&chat, token, live),
        }
        if let Some(text) = flow_error {
            let e = Error::Flow {
                chat: chat.to_string(),
                message: text,
            };
            log::error!(target: "botmesh::conversation", "{e}");
            self.call_error_hook(&e);
        }
        self.finish_turn(message.as_deref(), turn, failure, waited);
        true
    }

    /// Releases a turn whose job ran, and ends the job with how it went.
    fn finish_turn(
        &self,
        message: Option<&Message>,
        turn: Turn,
        failure: Option<String>,
        waited: Duration,
    ) {
        let token = turn.fencing_token();
        if self.replica.is_aborted() {
            // A crashed replica reports nothing; the turn is not released.
            drop(turn);
            return self.finish();
        }
        let released = turn.release_handled();
        let outcome = match (released, failure) {
            (Err(e), _) => Outcome::Dropped(e),
            (Ok(()), Some(text)) => Outcome::Failed(text),
            (Ok(()), None) => Outcome::Handled { token, waited },
        };
        self.end_job(message, outcome);
    }

    /// Ends a job: a message with its outcome; a wake-up just leaves the count.
    fn end_job(&self, message: Option<&Message>, outcome: Outcome) {
        match message {
            Some(m) => self.end(m, outcome),
            None => {
                if let Outcome::Dropped(e) = &outcome {
                    log::warn!(target: "botmesh::conversation", "delayed step not run now: {e}");
                }
                self.finish();
            }
        }
    }

    /// `settle` ran out on a run still going: stop its step, put the conversation
    /// back at that step, release the turn, end the message, replace the worker.
    fn cut(
        self: &Arc<Self>,
        slot: &RunSlot,
        chat: &str,
        token: Token,
        worker: usize,
        waited: Duration,
    ) {
        let (turn, message, snapshot, stored) = {
            let mut g = slot.inner.lock();
            if g.done || g.cut {
                return;
            }
            g.cut = true;
            slot.control.cancel();
            (g.turn.take(), g.message.take(), g.snapshot.take(), g.stored)
        };
        inc(&self.metrics.steps_stopped);
        let at = snapshot
            .as_ref()
            .map(|c| format!("step {} of flow {:?}", c.step, c.flow))
            .unwrap_or_else(|| "a step".to_owned());
        let stopped = Error::Flow {
            chat: chat.to_owned(),
            message: format!(
                "{at} ran past settle and was stopped; it runs again on the chat's next message"
            ),
        };
        if let Some(flows) = &self.flows
            && turn.as_ref().is_some_and(|t| !t.is_lost())
        {
            // As saved at the last boundary: the stopped step runs again.
            let conversation = snapshot;
            flows.put(
                chat,
                token,
                Live {
                    conversation,
                    stored,
                },
            );
        }
        // The release and the hooks may be slow (a backend call, user code): they run
        // on the replacement worker, not on the timer thread that cuts other chats.
        let finish = move |me: &Shared| {
            log::warn!(target: "botmesh::conversation", "{stopped}");
            me.call_error_hook(&stopped);
            match turn {
                Some(turn) => me.finish_turn(message.as_deref(), turn, None, waited),
                None => me.end_job(message.as_deref(), Outcome::Handled { token, waited }),
            }
        };
        // The stuck thread leaves the pool when its step returns; it is not joined.
        drop(self.workers.lock().remove(&worker));
        let first: FirstTask = Box::new(finish);
        if let Err((e, first)) = self.spawn_worker_with(Some(first)) {
            log::error!(target: "botmesh::runtime", "cannot replace a worker stuck in a stopped step: {e}");
            if let Some(f) = first {
                f(self);
            }
        }
    }

    fn timer_add(&self, at: Instant, job: TimerJob) {
        let mut t = self.timer.lock();
        t.seq += 1;
        let seq = t.seq;
        let earlier = t.heap.peek().is_none_or(|Reverse(e)| at < e.at);
        t.heap.push(Reverse(TimerEntry { at, seq, job }));
        drop(t);
        if earlier {
            self.timer_cv.notify_one();
        }
    }

    fn timer_loop(self: Arc<Self>) {
        let mut t = self.timer.lock();
        loop {
            if t.stopped {
                return;
            }
            let now = Instant::now();
            match t.heap.peek() {
                Some(Reverse(e)) if e.at <= now => {}
                Some(Reverse(e)) => {
                    let at = e.at;
                    self.timer_cv.wait_until(&mut t, at);
                    continue;
                }
                None => {
                    self.timer_cv.wait(&mut t);
                    continue;
                }
            }
            let Some(Reverse(entry)) = t.heap.pop() else {
                continue;
            };
            drop(t);
            match entry.job {
                TimerJob::Cut {
                    slot,
                    chat,
                    token,
                    worker,
                    waited,
                } => {
                    if let Some(slot) = slot.upgrade() {
                        self.cut(&slot, &chat, token, worker, waited);
                    }
                }
                TimerJob::Wake(chat, at) => self.wake(chat, at),
            }
            t = self.timer.lock();
        }
    }

    /// A delay ran out: queue a wake-up for the chat's turn, in order with its
    /// messages.
    fn wake(self: &Arc<Self>, chat: Arc<str>, at: u64) {
        {
            let mut s = self.sched.lock();
            if s.closed {
                // Stopping: the checkpoint (if any) carries the conversation on.
                return;
            }
            s.in_flight += 1;
        }
        let me = self.clone();
        let c = chat.clone();
        let on_grant: OnGrant = Box::new(move |result| match result {
            Ok(turn) => {
                let mut s = me.sched.lock();
                s.ready.push_back((Job::Wake(c, at), turn));
                drop(s);
                me.work_cv.notify_one();
            }
            Err(e) => me.end_job(None, Outcome::Dropped(e)),
        });
        if let Err(e) = self.replica.enqueue(&chat, None, self.turn_wait, on_grant) {
            log::warn!(target: "botmesh::conversation", "chat {chat:?}: cannot queue the delayed step: {e}");
            self.finish();
        }
    }

    fn call_error_hook(&self, e: &Error) {
        if let Some(hook) = &self.on_error
            && catch_unwind(AssertUnwindSafe(|| hook(e))).is_err()
        {
            log::error!(target: "botmesh::runtime", "the error hook panicked");
        }
    }

    fn finish(&self) {
        let mut s = self.sched.lock();
        s.in_flight -= 1;
        if s.in_flight == 0 {
            self.idle_cv.notify_all();
        }
    }
}

/// The text of a caught panic, naming what panicked.
pub(crate) fn panic_text(what: &str, panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("{what} panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("{what} panicked: {s}")
    } else {
        format!("{what} panicked")
    }
}
