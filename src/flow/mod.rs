//! The flow builder ([`Flow`], documented there) and what a step sees.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use unicode_normalization::UnicodeNormalization;

use crate::error::HandlerError;
use crate::message::Message;
use crate::provider::{ProviderError, Reply};

/// A conversation's state: a JSON object, saved in checkpoints.
pub type State = Map<String, Value>;

/// What a capture callback decides about the answer to an `ask`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capture {
    /// Accept it: go on with the next step.
    Next,
    /// Refuse it: send this text and wait for another answer (the prompt is not sent
    /// again).
    Retry(String),
    /// Leave this flow and continue with the named flow's first step (the state is
    /// kept). An unknown name ends the conversation and is reported.
    Goto(String),
    /// End the conversation here (e.g. the user typed "cancel"); its checkpoint is
    /// deleted.
    End,
}

/// The answer to an `ask`, as its capture callback sees it.
pub struct Answer<'a> {
    pub(crate) message: &'a Message,
    pub(crate) state: &'a mut State,
}

impl fmt::Debug for Answer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Answer")
            .field("message", self.message)
            .finish_non_exhaustive()
    }
}

impl Answer<'_> {
    /// The answer's text.
    pub fn text(&self) -> &str {
        &self.message.text
    }

    /// The whole message (chat, id, payload).
    pub fn message(&self) -> &Message {
        self.message
    }

    /// The conversation's state.
    pub fn state(&self) -> &State {
        self.state
    }

    /// The conversation's state, to record the answer.
    pub fn state_mut(&mut self) -> &mut State {
        self.state
    }

    /// Stores `value` under `key` in the state.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.state.insert(key.to_owned(), value.into());
    }
}

/// An action step was stopped: its `settle` time ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cancelled;

impl fmt::Display for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the step was cancelled (its settle time ran out)")
    }
}

impl std::error::Error for Cancelled {}

/// What an action step gets: the chat's state, a way to send, an interruptible
/// sleep, and the cancellation flag.
///
/// Changes to the state take effect when the action returns `Ok`; an action that
/// fails or is stopped leaves the state as it was before the step.
pub struct StepContext<'a> {
    pub(crate) chat: &'a str,
    pub(crate) state: &'a mut State,
    pub(crate) run: &'a dyn StepRun,
    pub(crate) outbox: &'a dyn Fn(&Reply) -> Result<(), ProviderError>,
}

impl fmt::Debug for StepContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepContext")
            .field("chat", &self.chat)
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl StepContext<'_> {
    /// The chat this conversation runs in.
    pub fn chat(&self) -> &str {
        self.chat
    }

    /// The conversation's state.
    pub fn state(&self) -> &State {
        self.state
    }

    /// The conversation's state, to change it.
    pub fn state_mut(&mut self) -> &mut State {
        self.state
    }

    /// Stores `value` under `key` in the state.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.state.insert(key.to_owned(), value.into());
    }

    /// Whether the step was stopped: its `settle` time ran out, or the chat's turn was
    /// lost (the lease lapsed, so another replica may run this step too). Check it
    /// before side effects that must not happen after the chat moved on.
    pub fn is_cancelled(&self) -> bool {
        self.run.is_cancelled()
    }

    /// Sends `text` to the chat.
    ///
    /// # Errors
    /// [`ProviderError`] when the step was stopped, the chat's turn was lost, the bot
    /// has no provider, or the transport fails.
    pub fn send(&self, text: &str) -> Result<(), ProviderError> {
        self.send_reply(&Reply::new(text))
    }

    /// Sends a [`Reply`] (a text with an optional keyboard) to the chat; a transport
    /// that retries stops once the step is stopped or the turn lost.
    ///
    /// # Errors
    /// As [`StepContext::send`].
    pub fn send_reply(&self, reply: &Reply) -> Result<(), ProviderError> {
        if self.is_cancelled() {
            return Err(ProviderError(format!(
                "send refused: the step on chat {:?} was stopped",
                self.chat
            )));
        }
        (self.outbox)(reply)
    }

    /// Sleeps for `duration`, waking early when the step is stopped (at once for a
    /// `settle` cut; within 50 ms when the turn's lease is lost). Holds the worker
    /// thread meanwhile (bounded by `settle`): to wait without a thread, end the action
    /// and put a [`Flow::delay`] step after it.
    ///
    /// # Errors
    /// [`Cancelled`] when the step was stopped before or during the sleep.
    pub fn sleep(&self, duration: Duration) -> Result<(), Cancelled> {
        self.run.sleep(duration)
    }
}

/// What a step's context asks of the run it belongs to: the conversation engine
/// implements it (a trait so that flows sit below the engine).
pub(crate) trait StepRun {
    /// Stopped by `settle`, or the turn's lease was lost.
    fn is_cancelled(&self) -> bool;
    /// An interruptible sleep; see [`StepContext::sleep`].
    fn sleep(&self, duration: Duration) -> Result<(), Cancelled>;
}

type CaptureFn = Arc<dyn Fn(&mut Answer<'_>) -> Capture + Send + Sync>;
type ActionFn = Arc<dyn Fn(&mut StepContext<'_>) -> Result<(), HandlerError> + Send + Sync>;

#[derive(Clone)]
pub(crate) enum Step {
    Answer(Reply),
    Ask { prompt: Reply, capture: CaptureFn },
    Action(ActionFn),
    Delay(Duration),
    Goto(String),
    End,
}

impl Step {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Step::Answer(_) => "answer",
            Step::Ask { .. } => "ask",
            Step::Action(_) => "action",
            Step::Delay(_) => "delay",
            Step::Goto(_) => "goto",
            Step::End => "end",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Trigger {
    #[default]
    None,
    /// Each keyword as its normalised words.
    Keywords(Vec<Vec<String>>),
    CatchAll,
}

/// A named conversation script. Build it with chained calls; register it with
/// [`BotBuilder::flow`](crate::BotBuilder::flow).
#[derive(Clone)]
#[must_use]
///
/// Flows: scripted conversations (a form, a survey, a reminder) built from steps.
///
/// A [`Flow`] is a named list of steps started by a trigger (keywords, or a
/// catch-all). Its steps:
///
/// | step | what it does |
/// | --- | --- |
/// | [`answer`](Flow::answer) | sends a text |
/// | [`ask`](Flow::ask) / [`ask_for`](Flow::ask_for) | sends a prompt and waits for the chat's next message; a capture callback accepts it, asks again, or goes to another flow |
/// | [`action`](Flow::action) | runs your code with a [`StepContext`]: the chat's state (a JSON map), send, an interruptible sleep, a cancellation flag |
/// | [`delay`](Flow::delay) | waits without holding a worker thread, then runs the next steps under the chat's turn |
/// | [`goto`](Flow::goto) | continues with another flow (the state is kept) |
/// | [`end`](Flow::end) | ends the conversation |
///
/// The last step ends the conversation too. An order form:
///
/// ```
/// use botmesh::{Bot, Capture, Flow};
///
/// let order = Flow::new("order")
///     .keywords(["order", "pedido"])
///     .persistent() // survives its replica: see "Handover" below
///     .answer("Let's take your order.")
///     .ask_for("name", "What is your name?")
///     .ask_for("address", "Where do we deliver?")
///     .ask("Confirm the order? (yes/no)", |answer| match answer.text().trim() {
///         "yes" => Capture::Next,
///         "no" => Capture::Goto("cancelled".into()),
///         _ => Capture::Retry("Please answer yes or no.".into()),
///     })
///     .action(|step| {
///         let name = step.state()["name"].as_str().unwrap_or("?").to_owned();
///         step.send(&format!("Thanks {name}, your order is on its way."))?;
///         Ok(())
///     });
/// let cancelled = Flow::new("cancelled").answer("Order cancelled.");
///
/// # struct Telegram;
/// # impl botmesh::Provider for Telegram {
/// #     fn id(&self) -> &str { "telegram" }
/// #     fn start(&self, _: botmesh::Session) -> Result<(), botmesh::ProviderError> { Ok(()) }
/// #     fn stop(&self) {}
/// #     fn send(&self, _: &str, _: &str) -> Result<(), botmesh::ProviderError> { Ok(()) }
/// # }
/// // Flows send through the bot's provider (your transport).
/// let bot = Bot::builder()
///     .provider(std::sync::Arc::new(Telegram))
///     .flow(order)
///     .flow(cancelled)
///     .build()?;
/// # bot.shutdown();
/// # Ok::<(), botmesh::StartError>(())
/// ```
///
/// # Settle, and steps that run at least once
///
/// A message that answers an `ask` (or starts a flow) keeps the chat's turn while the
/// steps after it run, up to their next wait (`ask`, `delay`) or their end, so the
/// chat's next message waits for them. That extra time is bounded by `settle`
/// ([`CoordinationConfig::settle`](crate::CoordinationConfig::settle), default 1 min).
/// A step still running then is **stopped**: its [`StepContext::is_cancelled`] turns
/// true, its [`StepContext::sleep`] wakes, its sends and checkpoint writes are refused
/// from then on, its changes to the state are discarded, and the turn is released. The
/// worker pool spawns a replacement thread, so a step that ignores cancellation costs
/// no worker. The stopped step runs **again, from its start**, when the chat's next
/// message arrives (that message wakes the conversation; it is not an answer to
/// anything).
///
/// So steps are **at-least-once**: an action may run twice (after a settle cut, or on
/// another replica after a crash). Make side effects idempotent (an order id in the
/// state, an upsert) or check [`StepContext::is_cancelled`] before them.
///
/// # Handover
///
/// A [`persistent`](Flow::persistent) flow saves a checkpoint (flow, step, state, the
/// flow's version, and the checkpoint format) to the coordinator at every step
/// boundary and wait, fenced by the turn's token. When another replica gets the chat
/// (its replica crashed, was redeployed, or lost its lease), it resumes the
/// conversation from that checkpoint. [`HandoverConfig`](crate::HandoverConfig) says
/// what happens to other flows (`flows: drop | resume`) and to checkpoints that cannot
/// be resumed (`fallback: drop | restart`). See the crate's README for examples.
pub struct Flow {
    pub(crate) name: String,
    pub(crate) trigger: Trigger,
    pub(crate) steps: Vec<Step>,
    pub(crate) persistent: bool,
    pub(crate) version: u32,
    /// Keywords without a letter or digit (refused by `build`).
    pub(crate) bad_keywords: Vec<String>,
}

impl fmt::Debug for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let steps: Vec<&str> = self.steps.iter().map(Step::kind).collect();
        f.debug_struct("Flow")
            .field("name", &self.name)
            .field("trigger", &self.trigger)
            .field("steps", &steps)
            .field("persistent", &self.persistent)
            .field("version", &self.version)
            .finish()
    }
}

impl Flow {
    /// An empty flow named `name` (unique among the bot's flows; it is saved in
    /// checkpoints, so keep it stable across deploys). Version 1, not persistent, no
    /// trigger (reach it with [`goto`](Self::goto), [`Capture::Goto`] or
    /// [`Context::start_flow`](crate::Context::start_flow)).
    pub fn new(name: impl Into<String>) -> Self {
        Flow {
            name: name.into(),
            trigger: Trigger::None,
            steps: Vec::new(),
            persistent: false,
            version: 1,
            bad_keywords: Vec::new(),
        }
    }

    /// Starts the flow when a message contains one of `keywords` as whole words,
    /// ignoring case and accents (`"Pedido"`, `"quiero un PÉDIDO"` match `"pedido"`).
    /// A word is a run of letters and digits; a keyword with none (`""`, `"!!!"`) or
    /// an empty list is refused by `build`.
    /// Flows are tried in the order they were registered; a conversation waiting for
    /// an answer takes the chat's messages first.
    pub fn keywords<I, S>(mut self, keywords: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list = Vec::new();
        for k in keywords {
            let w = words(k.as_ref());
            if w.is_empty() {
                // Reported by `build`: such a keyword could never match.
                self.bad_keywords.push(k.as_ref().to_owned());
            } else {
                list.push(w);
            }
        }
        self.trigger = Trigger::Keywords(list);
        self
    }

    /// Starts the flow on any message no conversation and no keyword flow took.
    pub fn catch_all(mut self) -> Self {
        self.trigger = Trigger::CatchAll;
        self
    }

    /// Makes the conversation survive its replica: a checkpoint is saved at every step
    /// boundary and wait, and another replica resumes it (see the module docs).
    pub fn persistent(mut self) -> Self {
        self.persistent = true;
        self
    }

    /// The flow's version, saved in its checkpoints (default 1). Raise it when you
    /// change the steps in a way old checkpoints must not resume into (a step added
    /// or removed before a wait): a replica resumes only checkpoints of the version it
    /// has, and applies the `fallback` policy to others.
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Sends `text` (a `&str`, a `String`, or a [`Reply`] with a keyboard).
    pub fn answer(mut self, text: impl Into<Reply>) -> Self {
        self.steps.push(Step::Answer(text.into()));
        self
    }

    /// Sends `prompt` (a text, or a [`Reply`] with a keyboard: the buttons' presses
    /// come back as the answer) and waits for the chat's next message; `capture`
    /// decides what the answer does ([`Capture`]). The capture runs under the answer's
    /// turn, on a worker; it should be quick.
    pub fn ask<F>(mut self, prompt: impl Into<Reply>, capture: F) -> Self
    where
        F: Fn(&mut Answer<'_>) -> Capture + Send + Sync + 'static,
    {
        self.steps.push(Step::Ask {
            prompt: prompt.into(),
            capture: Arc::new(capture),
        });
        self
    }

    /// Sends `prompt`, waits for the next message and stores its text under `key`
    /// in the state.
    pub fn ask_for(self, key: impl Into<String>, prompt: impl Into<Reply>) -> Self {
        let key = key.into();
        self.ask(prompt, move |answer| {
            let text = answer.text().to_owned();
            answer.set(&key, text);
            Capture::Next
        })
    }

    /// Runs `action` (your code). An `Err` ends the conversation and is reported
    /// through the bot's error hook. Bounded by `settle` when it follows a message's
    /// handling (see the module docs).
    pub fn action<F>(mut self, action: F) -> Self
    where
        F: Fn(&mut StepContext<'_>) -> Result<(), HandlerError> + Send + Sync + 'static,
    {
        self.steps.push(Step::Action(Arc::new(action)));
        self
    }

    /// Waits `duration` without holding a worker thread, then runs the next steps
    /// under the chat's turn (in order with the chat's messages). Messages that
    /// arrive meanwhile go to keyword flows and the handler; a flow they start
    /// replaces this conversation. If the replica stops before the delay ends, the
    /// conversation (when checkpointed) continues on the chat's next message.
    pub fn delay(mut self, duration: Duration) -> Self {
        self.steps.push(Step::Delay(duration));
        self
    }

    /// Continues with the flow named `flow`, at its first step; the state is kept.
    pub fn goto(mut self, flow: impl Into<String>) -> Self {
        self.steps.push(Step::Goto(flow.into()));
        self
    }

    /// Ends the conversation (and deletes its checkpoint).
    pub fn end(mut self) -> Self {
        self.steps.push(Step::End);
        self
    }

    /// The flow's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a message with this text triggers the flow (keywords or catch-all).
    pub(crate) fn triggered_by(&self, text_words: &[String]) -> bool {
        match &self.trigger {
            Trigger::None => false,
            Trigger::CatchAll => true,
            Trigger::Keywords(keywords) => keywords.iter().any(|k| {
                text_words
                    .windows(k.len())
                    .any(|window| window == k.as_slice())
            }),
        }
    }
}

/// Splits `text` into lowercase words without accents (canonical decomposition, then
/// the combining marks dropped), so that "Pédido!" and "pedido" compare equal.
pub(crate) fn words(text: &str) -> Vec<String> {
    let folded: String = text
        .nfd()
        .filter(|c| !unicode_normalization::char::is_combining_mark(*c))
        .flat_map(char::to_lowercase)
        .collect();
    folded
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_ignore_case_accents_and_punctuation() {
        let f = Flow::new("order").keywords(["pedido", "New Order"]);
        assert!(f.triggered_by(&words("Quiero un PÉDIDO!")));
        assert!(f.triggered_by(&words("a new   order, please")));
        assert!(!f.triggered_by(&words("pedidos")));
        assert!(!f.triggered_by(&words("order new")));
        assert!(Flow::new("x").catch_all().triggered_by(&words("")));
        assert!(!Flow::new("x").triggered_by(&words("x")));
    }
}
