//! The scheduler and the workers: the local turn table that hands runnable messages
//! to W worker threads, the end of every message, and the flows glue (settle cuts
//! and delays through the replica's timer).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::context::{Context, ErrorHook, Handler, OutcomeHook};
use crate::config::CoordinationConfig;
use crate::conversation::{
    At, CheckpointStore, Flows, Live, Route, Run, RunSlot, StepsEnd, now_ms,
};
use crate::coordinator::{BackendError, Token};
use crate::error::{CoordinationUnavailableError, Error, Reason, panic_text};
use crate::flow::State;
use crate::intake::{Admit, InBot};
use crate::message::{Message, Outcome};
use crate::metrics::{Metrics, inc};
use crate::provider::{Fence, Provider, ProviderError, Reply};
use crate::replica::{Accepted, Inner, NoTurn, OnGrant, Turn};

/// Work a replacement worker does before it joins the pool.
type FirstTask = Box<dyn FnOnce(&Shared) + Send>;

/// Work for a worker, under a turn.
pub(super) enum Job {
    /// A message taken in.
    Message(Arc<Message>),
    /// A conversation's delay ran out (wall clock, ms): run its next steps.
    Wake(Arc<str>, u64),
}

/// The local turn table: granted jobs waiting for a worker, and the counts a stop
/// waits on.
#[derive(Default)]
pub(super) struct Sched {
    /// Granted jobs, in grant order; any free worker takes the first.
    pub(super) ready: VecDeque<(Job, Turn)>,
    /// Messages and wake-ups taken in that have not ended.
    pub(super) in_flight: usize,
    /// Intake refuses new messages (a stop began).
    pub(super) closed: bool,
    /// Workers leave once `ready` is empty.
    pub(super) stopping: bool,
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

/// What the workers, the intake, the timer jobs and the bot handle share.
pub(super) struct Shared {
    /// The replica: tickets, turns, checkpoints and the timer.
    pub(super) replica: Arc<Inner>,
    /// Longest a message waits for its turn.
    pub(super) turn_wait: Duration,
    /// The user's handler, if any (a bot may run on flows alone).
    pub(super) handler: Option<Handler>,
    /// The flows and live conversations, if any flow is registered.
    pub(super) flows: Option<Flows>,
    /// Hears every error, once.
    pub(super) on_error: Option<ErrorHook>,
    /// Hears every message's end, once.
    pub(super) on_outcome: Option<OutcomeHook>,
    /// Where replies go: the first provider (gated by its leadership in leader mode).
    pub(super) provider: Option<Arc<dyn Provider>>,
    /// The bot's counters (shared with the replica).
    pub(super) metrics: Arc<Metrics>,
    /// The local turn table.
    pub(super) sched: Mutex<Sched>,
    /// Wakes a worker when a job is ready (or the pool stops).
    pub(super) work_cv: Condvar,
    /// Wakes a stop when `in_flight` reaches zero.
    pub(super) idle_cv: Condvar,
    /// Live worker threads by number. A worker stuck in a stopped step is removed
    /// (detached) and replaced, so the pool keeps its size.
    pub(super) workers: Mutex<HashMap<usize, JoinHandle<()>>>,
    /// Numbers workers, for their thread names and the map.
    pub(super) next_worker: AtomicUsize,
}

impl Admit for Shared {
    fn admit(self: Arc<Self>, message: Message) -> Result<Accepted, CoordinationUnavailableError> {
        self.deliver(message)
    }
}

impl Shared {
    pub(super) fn spawn_worker(self: &Arc<Self>) -> std::io::Result<()> {
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

    pub(super) fn deliver(
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
            Err(NoTurn::Failed(e)) => me.end(&m, Outcome::Dropped(e)),
            Err(NoTurn::Duplicate) => me.end(&m, Outcome::Duplicate),
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

    /// Names this bot for [`InBot`]: the address of its scheduler.
    pub(super) fn key(&self) -> usize {
        self as *const Shared as *const u8 as usize
    }

    fn worker_loop(self: Arc<Self>, n: usize) {
        // Handlers, steps and hooks run here: a stop of this bot from them is refused.
        let _in_bot = InBot::enter(self.key());
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
            // Also on the timer, renewal and subscriber threads: marked as this bot's.
            let _in_bot = InBot::enter(self.key());
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

    /// Sends `reply` to `chat` through the bot's provider (or sender) under `fence`.
    /// A panicking provider is reported as an error, so that the worker and the
    /// message's end survive it.
    fn send(&self, chat: &str, reply: &Reply, fence: &Fence<'_>) -> Result<(), ProviderError> {
        let Some(p) = &self.provider else {
            return Err(ProviderError(
                "the bot has no provider or sender to send with".into(),
            ));
        };
        catch_unwind(AssertUnwindSafe(|| p.send_reply(chat, reply, fence)))
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
                            let held = || !turn.is_lost();
                            let fence = Fence::new(&held, Some(token));
                            self.send(&chat, &Reply::new(retry), &fence)
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
                        self.wake_at(
                            Instant::now() + left.min(CoordinationConfig::MAX_DURATION),
                            chat.clone(),
                            at,
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
            let me = Arc::downgrade(self);
            let (cut_slot, cut_chat) = (Arc::downgrade(&slot), chat.clone());
            self.replica.timer.at(
                Instant::now() + flows.settle.min(CoordinationConfig::MAX_DURATION),
                Box::new(move || {
                    if let (Some(me), Some(slot)) = (me.upgrade(), cut_slot.upgrade()) {
                        me.cut(&slot, &cut_chat, token, worker, waited);
                    }
                }),
            );
        }
        // Asked before every attempt of a send, retries included.
        let held_live = || {
            let held = slot
                .inner
                .lock()
                .turn
                .as_ref()
                .is_some_and(|t| !t.is_lost());
            held && !slot.control.is_cancelled()
        };
        let outbox = |reply: &Reply| -> Result<(), ProviderError> {
            if !held_live() {
                return Err(ProviderError(format!(
                    "send refused: the turn on chat {chat:?} was lost or the step was stopped"
                )));
            }
            self.send(&chat, reply, &Fence::new(&held_live, Some(token)))
        };
        let schedule_wake = |at: u64| {
            let now = now_ms();
            let delay = Duration::from_millis(at.saturating_sub(now));
            self.wake_at(
                Instant::now() + delay.min(CoordinationConfig::MAX_DURATION),
                chat.clone(),
                at,
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
            (Err(e), _) => Outcome::Dropped(e.after_handler()),
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

    /// Asks the timer to queue the chat's delayed conversation (due at `at`, wall
    /// clock ms) for its turn at `when`.
    fn wake_at(self: &Arc<Self>, when: Instant, chat: Arc<str>, at: u64) {
        let me: Weak<Shared> = Arc::downgrade(self);
        self.replica.timer.at(
            when,
            Box::new(move || {
                if let Some(me) = me.upgrade() {
                    me.wake(chat, at);
                }
            }),
        );
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
            Err(NoTurn::Failed(e)) => me.end_job(None, Outcome::Dropped(e)),
            // A wake-up has no message id.
            Err(NoTurn::Duplicate) => me.end_job(None, Outcome::Duplicate),
        });
        if let Err(e) = self.replica.enqueue(&chat, None, self.turn_wait, on_grant) {
            log::warn!(target: "botmesh::conversation", "chat {chat:?}: cannot queue the delayed step: {e}");
            self.finish();
        }
    }

    pub(super) fn call_error_hook(&self, e: &Error) {
        let _in_bot = InBot::enter(self.key());
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
