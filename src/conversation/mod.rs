//! The conversation engine: which flow a message feeds, running steps under the turn,
//! checkpoints, and the handover decision when a chat comes from another replica.
//!
//! One conversation per chat at most. It lives in this replica's memory between
//! turns, tagged with the fencing token of the turn it last ran under. The next grant
//! names the previous holder's token: when it is that same token nobody else touched
//! the chat since, and the in-memory copy is current. Otherwise the copy is stale (it
//! is never continued) and the checkpoint in the coordinator is the truth.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::config::{FallbackPolicy, FlowsPolicy, HandoverConfig};
use crate::coordinator::{HISTORY, Token};
use crate::error::panic_text;
use crate::flow::{Answer, Capture, Flow, State, Step, StepContext, Trigger, words};
use crate::metrics::{Metrics, inc};
use crate::replica::Turn;

mod checkpoint;
mod run;

pub(crate) use checkpoint::{At, Conversation};
use checkpoint::{FORMAT, Record, Unresumable};
use run::send_logged;
pub(crate) use run::{CheckpointStore, Run, RunSlot};

/// Local conversations not touched for this long are forgotten (a persistent one
/// still has its checkpoint).
const LOCAL_KEEP: Duration = Duration::from_secs(24 * 3600);
/// Chats without a conversation are remembered as long as the coordinator keeps a
/// chat's last holder: after that every grant reads the checkpoint anyway.
const NO_CONVERSATION_KEEP: Duration = HISTORY;

/// A chat's conversation as this replica knows it, plus whether a checkpoint of it
/// is stored (so that ending it deletes the checkpoint, and only then).
#[derive(Default)]
pub(crate) struct Live {
    pub(crate) conversation: Option<Conversation>,
    pub(crate) stored: bool,
}

struct Local {
    token: Token,
    live: Live,
    touched: Instant,
}

/// What a message does to the chat's conversation.
pub(crate) enum Route {
    /// It answers the waiting `ask` at this step.
    Capture,
    /// It wakes a conversation that must run on (a stopped step, an overdue delay, a
    /// restarted checkpoint); the message itself is consumed by that.
    Resume,
    /// It starts this flow (by index).
    Start(usize),
    /// None of the above: the bot's handler takes it.
    Handler,
}

/// How a run of steps ended.
#[derive(Debug)]
pub(crate) enum StepsEnd {
    /// At a wait (`ask`, `delay`), or the conversation ended.
    Done,
    /// `settle` ran out; the watchdog released the turn and put the conversation back.
    Cut,
    /// A checkpoint write was refused: another turn on the chat is newer. The
    /// conversation is stale and must not be kept.
    Stale,
    /// A step failed (the conversation ended); the text says why.
    Failed(String),
}

/// The flows of one bot and its chats' live conversations.
pub(crate) struct Flows {
    flows: Vec<Flow>,
    by_name: HashMap<String, usize>,
    handover: HandoverConfig,
    pub(crate) settle: Duration,
    /// Without coordination there is no other replica: the local copy is always
    /// current and nothing is checkpointed.
    coordinated: bool,
    local: Mutex<LocalMap>,
}

#[derive(Default)]
struct LocalMap {
    chats: HashMap<String, Local>,
    sweep_at: usize,
}

impl Flows {
    /// Checks the flows (unique, non-empty names; `goto` targets exist).
    ///
    /// Errors name the flow and the step at fault.
    pub(crate) fn new(
        flows: Vec<Flow>,
        handover: HandoverConfig,
        settle: Duration,
        coordinated: bool,
    ) -> Result<Self, String> {
        let mut by_name = HashMap::new();
        for (i, f) in flows.iter().enumerate() {
            if f.name.is_empty() {
                return Err(format!("flows[{i}]: the flow name \"\" is empty"));
            }
            if by_name.insert(f.name.clone(), i).is_some() {
                return Err(format!(
                    "flows: the name {:?} is used by two flows; names must be unique",
                    f.name
                ));
            }
        }
        for f in &flows {
            if let Some(k) = f.bad_keywords.first() {
                return Err(format!(
                    "flow {:?}: keyword {k:?} has no letter or digit, so it can never match",
                    f.name
                ));
            }
            if f.trigger == Trigger::Keywords(Vec::new()) {
                return Err(format!(
                    "flow {:?}: keywords([]) is empty; give at least one keyword",
                    f.name
                ));
            }
            for (i, s) in f.steps.iter().enumerate() {
                if let Step::Goto(target) = s
                    && !by_name.contains_key(target)
                {
                    return Err(format!(
                        "flow {:?} step {i} (goto): no flow named {target:?} is registered",
                        f.name
                    ));
                }
            }
        }
        if settle.is_zero() {
            return Err(
                "settleMs: 0 leaves flow steps no time to run (every step after a \
                 message would be stopped at once); give it at least the time of your \
                 slowest step"
                    .to_owned(),
            );
        }
        if coordinated && handover.flows == FlowsPolicy::Drop {
            // The coordinator remembers a chat's last holder for HISTORY; after that a
            // copy in memory cannot be told current, so only a checkpoint carries a
            // conversation over such a wait.
            for f in flows.iter().filter(|f| !f.persistent) {
                for (i, s) in f.steps.iter().enumerate() {
                    if let Step::Delay(d) = s
                        && *d > HISTORY
                    {
                        return Err(format!(
                            "flow {:?} step {i} (delay {}): longer than {}, the longest a \
                             conversation that is not persistent survives between turns \
                             under coordination; mark the flow .persistent() or use \
                             handover flows: resume",
                            f.name,
                            humantime::format_duration(*d),
                            humantime::format_duration(HISTORY)
                        ));
                    }
                }
            }
        }
        if let Some(cycle) = goto_cycle(&flows, &by_name) {
            return Err(format!(
                "flows: {} go to each other without an ask or a delay between them, so \
                 a conversation would loop until settle stops it; add a wait",
                cycle.join(" -> ")
            ));
        }
        Ok(Flows {
            flows,
            by_name,
            handover,
            settle,
            coordinated,
            local: Mutex::new(LocalMap::default()),
        })
    }

    fn flow(&self, name: &str) -> Option<&Flow> {
        self.by_name.get(name).map(|&i| &self.flows[i])
    }

    fn checkpointed(&self, flow: &Flow) -> bool {
        self.coordinated && (flow.persistent || self.handover.flows == FlowsPolicy::Resume)
    }

    /// A new conversation at the first step of flow `index`, keeping `state`.
    pub(crate) fn start(&self, index: usize, state: State) -> Conversation {
        let f = &self.flows[index];
        Conversation {
            flow: f.name.clone(),
            version: f.version,
            step: 0,
            at: At::Run,
            state,
        }
    }

    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Takes the chat's conversation for the run under `turn`: the in-memory copy when
    /// it is current, else the checkpoint (resumed, dropped or restarted by the
    /// handover policy).
    ///
    /// Errors when the checkpoint cannot be read (backend down): the caller must not
    /// run the message as if there were no conversation.
    pub(crate) fn take(
        &self,
        chat: &str,
        turn: &Turn,
        store: &dyn CheckpointStore,
        metrics: &Metrics,
    ) -> Result<Live, crate::coordinator::BackendError> {
        let local = self.local.lock().chats.remove(chat);
        if !self.coordinated {
            return Ok(local.map(|l| l.live).unwrap_or_default());
        }
        let previous = turn.previous().map(|p| p.token);
        let stale = match local {
            Some(l) if Some(l.token) == previous => return Ok(l.live),
            Some(l) => l.live.conversation.is_some(),
            None => false,
        };
        if stale {
            // Someone else held the chat since (or our lease lapsed): what we remember
            // may be behind what they did.
            inc(&metrics.conversations_stale);
            log::debug!(target: "botmesh::conversation", "chat {chat:?}: in-memory conversation is stale; reading the checkpoint");
        }
        // Read even when no flow here is checkpointed: a checkpoint written by a
        // replica with other flows (a rolling deploy) still gets its fallback.
        let Some((_, data)) = store.read(chat)? else {
            if stale {
                inc(&metrics.conversations_dropped);
            }
            return Ok(Live::default());
        };
        match self.parse(&data) {
            Ok(conversation) => {
                inc(&metrics.conversations_resumed);
                log::info!(target: "botmesh::conversation", "chat {chat:?}: resuming flow {:?} at step {} from its checkpoint", conversation.flow, conversation.step);
                Ok(Live {
                    conversation: Some(conversation),
                    stored: true,
                })
            }
            Err(why) => {
                let restart = match (&self.handover.fallback, why.flow()) {
                    (FallbackPolicy::Restart, Some(flow)) => self.index_of(flow),
                    _ => None,
                };
                match restart {
                    Some(i) => {
                        inc(&metrics.conversations_restarted);
                        log::warn!(target: "botmesh::conversation", "chat {chat:?}: the checkpoint cannot be resumed: {why}; restarting flow {:?}", self.flows[i].name);
                        Ok(Live {
                            conversation: Some(self.start(i, State::new())),
                            stored: true,
                        })
                    }
                    None => {
                        inc(&metrics.conversations_dropped);
                        log::warn!(target: "botmesh::conversation", "chat {chat:?}: the checkpoint cannot be resumed: {why}; the conversation is dropped");
                        // Deleted under this turn's token, so no other replica tries again.
                        if let Err(e) = store.write(chat, turn.fencing_token(), None) {
                            log::warn!(target: "botmesh::conversation", "chat {chat:?}: deleting the unresumable checkpoint failed: {e}");
                        }
                        Ok(Live::default())
                    }
                }
            }
        }
    }

    /// Parses and checks a checkpoint against the flows registered here.
    pub(crate) fn parse(&self, data: &str) -> Result<Conversation, Unresumable> {
        // Read leniently first, so that a record this replica cannot resume can
        // still name its flow (for `fallback: restart`).
        let value: serde_json::Value =
            serde_json::from_str(data).map_err(|e| Unresumable::Parse {
                error: e.to_string(),
                flow: None,
            })?;
        let flow_name = value
            .get("flow")
            .and_then(|f| f.as_str())
            .map(str::to_owned);
        let format = value.get("format").and_then(serde_json::Value::as_u64);
        if format != Some(u64::from(FORMAT)) {
            return Err(match format.and_then(|f| u32::try_from(f).ok()) {
                Some(format) => Unresumable::Format {
                    format,
                    flow: flow_name,
                },
                None => Unresumable::Parse {
                    error: "no format version".into(),
                    flow: flow_name,
                },
            });
        }
        let record: Record = serde_json::from_value(value).map_err(|e| Unresumable::Parse {
            error: e.to_string(),
            flow: flow_name,
        })?;
        let c = record.conversation;
        let Some(flow) = self.flow(&c.flow) else {
            return Err(Unresumable::UnknownFlow(c.flow));
        };
        if flow.version != c.version {
            return Err(Unresumable::Version {
                saved: c.version,
                have: flow.version,
                flow: c.flow,
            });
        }
        let in_range = match c.at {
            At::Ask => matches!(flow.steps.get(c.step), Some(Step::Ask { .. })),
            At::Run | At::Delay { .. } => c.step <= flow.steps.len(),
        };
        if !in_range {
            return Err(Unresumable::Step {
                flow: c.flow,
                step: c.step,
            });
        }
        Ok(c)
    }

    /// Puts the chat's conversation back after a run under `token`.
    pub(crate) fn put(&self, chat: &str, token: Token, live: Live) {
        let now = Instant::now();
        let mut map = self.local.lock();
        map.chats.insert(
            chat.to_owned(),
            Local {
                token,
                live,
                touched: now,
            },
        );
        if map.chats.len() >= map.sweep_at {
            // An entry without a conversation only saves a checkpoint read; one with a
            // conversation not touched for a day is given up (a checkpointed one can
            // still be resumed from the coordinator).
            map.chats.retain(|_, l| {
                let idle = now.duration_since(l.touched);
                idle < LOCAL_KEEP && (l.live.conversation.is_some() || idle < NO_CONVERSATION_KEEP)
            });
            map.sweep_at = (map.chats.len() * 2).max(1024);
        }
    }

    /// What `text` does to `live`'s conversation (see [`Route`]).
    pub(crate) fn route(&self, live: &Live, text: &str) -> Route {
        if let Some(c) = &live.conversation {
            match c.at {
                At::Ask => return Route::Capture,
                At::Run => return Route::Resume,
                At::Delay { wake_at_ms } if wake_at_ms <= now_ms() => return Route::Resume,
                At::Delay { .. } => {}
            }
        }
        let w = words(text);
        // Keyword flows first, whatever the order of registration: a catch-all must
        // not hide them.
        let keyword = self
            .flows
            .iter()
            .position(|f| f.trigger != Trigger::CatchAll && f.triggered_by(&w));
        let any = keyword.or_else(|| {
            self.flows
                .iter()
                .position(|f| f.trigger == Trigger::CatchAll)
        });
        match any {
            Some(i) => Route::Start(i),
            None => Route::Handler,
        }
    }

    /// Runs the waiting `ask`'s capture on `message`; moves the conversation on.
    /// Returns the text to send back when the capture asked again, or an error text
    /// when the capture panicked or named an unknown flow (the conversation ends).
    pub(crate) fn capture(
        &self,
        live: &mut Live,
        message: &crate::message::Message,
    ) -> Result<Option<String>, String> {
        let Some(c) = live.conversation.as_mut() else {
            return Ok(None);
        };
        let capture = match self.flow(&c.flow).and_then(|f| f.steps.get(c.step)) {
            Some(Step::Ask { capture, .. }) => capture.clone(),
            _ => {
                // parse() checked this for checkpoints; a local copy always fits.
                live.conversation = None;
                return Err("the conversation's ask step no longer exists".into());
            }
        };
        let mut state = c.state.clone();
        let decision = catch_unwind(AssertUnwindSafe(|| {
            capture(&mut Answer {
                message,
                state: &mut state,
            })
        }));
        match decision {
            Ok(Capture::Next) => {
                c.state = state;
                c.step += 1;
                c.at = At::Run;
                Ok(None)
            }
            Ok(Capture::Retry(text)) => {
                c.state = state;
                Ok(Some(text))
            }
            Ok(Capture::End) => {
                live.conversation = None;
                Ok(None)
            }
            Ok(Capture::Goto(name)) => match self.index_of(&name) {
                Some(i) => {
                    *c = self.start(i, state);
                    Ok(None)
                }
                None => {
                    live.conversation = None;
                    Err(format!("capture chose goto {name:?}: no such flow"))
                }
            },
            Err(panic) => {
                live.conversation = None;
                Err(panic_text("a capture callback", &panic))
            }
        }
    }

    /// Saves the conversation at a boundary (or deletes its checkpoint when it ended or
    /// is not checkpointed). Returns `Ok(false)` when the write was refused (stale).
    fn save(
        &self,
        chat: &str,
        token: Token,
        live: &mut Live,
        store: &dyn CheckpointStore,
    ) -> Result<bool, crate::coordinator::BackendError> {
        let keep = live
            .conversation
            .as_ref()
            .and_then(|c| self.flow(&c.flow))
            .is_some_and(|f| self.checkpointed(f));
        if keep {
            let Some(c) = &live.conversation else {
                return Ok(true);
            };
            let record = Record {
                format: FORMAT,
                conversation: c.clone(),
            };
            let data = serde_json::to_string(&record).map_err(|e| {
                crate::coordinator::BackendError::new(format!(
                    "the conversation state of chat {chat:?} does not serialise: {e}"
                ))
            })?;
            let applied = store.write(chat, token, Some(&data))?;
            live.stored = applied;
            Ok(applied)
        } else if live.stored {
            let applied = store.write(chat, token, None)?;
            live.stored = !applied;
            Ok(applied)
        } else {
            Ok(true)
        }
    }

    /// Runs the conversation's steps from where it stands to its next wait or its end.
    ///
    /// Stops at a boundary when the watchdog cut the run (`settle` ran out). Sends go
    /// through the run's outbox.
    pub(crate) fn run_steps(&self, chat: &str, live: &mut Live, run: &Run<'_>) -> StepsEnd {
        loop {
            let Some(c) = live.conversation.as_mut() else {
                return self.boundary(chat, live, run, StepsEnd::Done);
            };
            if c.at != At::Run {
                // Waiting (an ask, a delay not due): nothing runs, the state is saved.
                return self.boundary(chat, live, run, StepsEnd::Done);
            }
            let Some(flow) = self.flow(&c.flow) else {
                let name = c.flow.clone();
                live.conversation = None;
                self.boundary(chat, live, run, StepsEnd::Done);
                return StepsEnd::Failed(format!("flow {name:?} is not registered"));
            };
            let Some(step) = flow.steps.get(c.step).cloned() else {
                live.conversation = None;
                return self.boundary(chat, live, run, StepsEnd::Done);
            };
            if let end @ (StepsEnd::Cut | StepsEnd::Stale) =
                self.boundary(chat, live, run, StepsEnd::Done)
            {
                return end;
            }
            let Some(c) = live.conversation.as_mut() else {
                return StepsEnd::Done;
            };
            match step {
                Step::Answer(text) => {
                    send_logged(run, chat, &text);
                    c.step += 1;
                }
                Step::Ask { prompt, .. } => {
                    send_logged(run, chat, &prompt);
                    c.at = At::Ask;
                    return self.boundary(chat, live, run, StepsEnd::Done);
                }
                Step::Action(action) => {
                    let mut state = c.state.clone();
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        action(&mut StepContext {
                            chat,
                            state: &mut state,
                            run: run.slot,
                            outbox: run.outbox,
                        })
                    }));
                    if run.slot.control.is_cancelled() {
                        return StepsEnd::Cut;
                    }
                    if run
                        .slot
                        .inner
                        .lock()
                        .turn
                        .as_ref()
                        .is_none_or(Turn::is_lost)
                    {
                        // Whatever it returned (a refused send is an error), the
                        // step runs again wherever the chat goes next.
                        return StepsEnd::Stale;
                    }
                    let failure = match result {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(panic) => Some(panic_text("an action", &panic)),
                    };
                    if let Some(text) = failure {
                        let what = format!("flow {:?} step {} (action): {text}", c.flow, c.step);
                        live.conversation = None;
                        self.boundary(chat, live, run, StepsEnd::Done);
                        return StepsEnd::Failed(what);
                    }
                    c.state = state;
                    c.step += 1;
                }
                Step::Delay(d) => {
                    let wake_at_ms = now_ms().saturating_add(ms(d));
                    c.step += 1;
                    c.at = At::Delay { wake_at_ms };
                    let end = self.boundary(chat, live, run, StepsEnd::Done);
                    if matches!(end, StepsEnd::Done) {
                        (run.schedule_wake)(wake_at_ms);
                    }
                    return end;
                }
                Step::Goto(name) => match self.index_of(&name) {
                    Some(i) => {
                        let state = std::mem::take(&mut c.state);
                        *c = self.start(i, state);
                    }
                    None => {
                        live.conversation = None;
                        self.boundary(chat, live, run, StepsEnd::Done);
                        return StepsEnd::Failed(format!("goto {name:?}: no such flow"));
                    }
                },
                Step::End => {
                    live.conversation = None;
                    return self.boundary(chat, live, run, StepsEnd::Done);
                }
            }
        }
    }

    /// A step boundary: stops when the run was cut, else remembers the position (what
    /// a cut puts back) and saves the checkpoint, all under the run's lock so that no
    /// write happens after a cut. Returns `ok` when the run may go on.
    fn boundary(&self, chat: &str, live: &mut Live, run: &Run<'_>, ok: StepsEnd) -> StepsEnd {
        let mut slot = run.slot.inner.lock();
        if slot.cut {
            return StepsEnd::Cut;
        }
        if slot.turn.as_ref().is_none_or(Turn::is_lost) {
            // The lease ran out (by this replica's clock, or a refused renewal):
            // another replica may hold the chat; this copy must not be written.
            return StepsEnd::Stale;
        }
        slot.snapshot = live.conversation.clone();
        let saved = self.save(chat, run.token, live, run.store);
        slot.stored = live.stored;
        match saved {
            Ok(true) => ok,
            Ok(false) => StepsEnd::Stale,
            Err(e) => {
                // The previous checkpoint stays: a handover re-runs from there (steps
                // are at-least-once).
                log::warn!(target: "botmesh::conversation", "chat {chat:?}: checkpoint write failed: {e}");
                ok
            }
        }
    }
}

/// A cycle of flows that reach each other by `goto` with no wait on the way, as the
/// names along it (first repeated at the end), if there is one.
fn goto_cycle(flows: &[Flow], by_name: &HashMap<String, usize>) -> Option<Vec<String>> {
    // Each flow has at most one such edge: its first goto, if no wait comes before.
    let next: Vec<Option<usize>> = flows
        .iter()
        .map(|f| {
            f.steps
                .iter()
                .find_map(|s| match s {
                    Step::Ask { .. } | Step::Delay(_) | Step::End => Some(None),
                    Step::Goto(t) => Some(by_name.get(t).copied()),
                    _ => None,
                })
                .flatten()
        })
        .collect();
    for start in 0..flows.len() {
        let mut path = vec![start];
        let mut at = start;
        while let Some(n) = next[at] {
            if let Some(pos) = path.iter().position(|&p| p == n) {
                let mut names: Vec<String> =
                    path[pos..].iter().map(|&i| flows[i].name.clone()).collect();
                names.push(flows[n].name.clone());
                return Some(names);
            }
            path.push(n);
            at = n;
        }
    }
    None
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(ms)
        .unwrap_or(0)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
