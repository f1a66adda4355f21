//! `Bot`: the handle of one running replica, and its stops.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::workers::Shared;
use crate::coordinator::Token;
use crate::intake::{Intake, running_for};
use crate::metrics::MetricsSnapshot;
use crate::provider::Provider;
use crate::provider::leadership::{LeaderState, Leadership};
use crate::replica::Replica;

/// One replica of a bot: W worker threads running a handler per message under the
/// chat's turn.
///
/// Build it with [`Bot::builder`]; feed it through [`Bot::intake`] (or providers);
/// stop it with [`Bot::stop`] (from any thread, also through an `Arc<Bot>`) or
/// [`Bot::shutdown`]. See the [`BotBuilder`](crate::BotBuilder) example.
///
/// A message goes through three stages:
///
/// 1. **Intake** ([`Intake::deliver`](crate::Intake::deliver), called by a provider or
///    a webhook handler): the message gets a ticket in its chat's queue at the
///    coordinator. The call returns when the ticket is placed, so the message's place
///    in its chat's order is fixed before the platform is told "accepted".
/// 2. **Waiting**: the ticket waits for its grant without holding any thread; the
///    grant (pushed by a release, or found by the re-check) moves the message to the
///    ready queue.
/// 3. **Running**: one of the W workers, all blocked on one condition variable, takes
///    the next ready message, runs the handler under the turn, and releases the turn,
///    which hands the chat to its next waiter.
///
/// Every accepted message ends exactly once, as an [`Outcome`](crate::Outcome):
/// handled, failed, dropped (reported through the error hook and the log), or a
/// duplicate.
pub struct Bot {
    /// What the workers, the intake and the timer jobs share.
    pub(super) shared: Arc<Shared>,
    /// The leadership states, readable while a stop runs (metrics, leader tokens).
    leader_states: Vec<Arc<LeaderState>>,
    /// What a stop takes apart, and how far it got.
    stop: Mutex<Stop>,
    /// Wakes callers of [`Bot::stop`] that wait for another caller's stop.
    stopped_cv: Condvar,
}

/// How far a bot's stop got.
enum Stop {
    Running(Parts),
    /// One caller is stopping the bot; the others wait for `Stopped`.
    Stopping,
    Stopped,
}

/// The parts of a running bot that a stop takes apart.
pub(super) struct Parts {
    /// The replica; released last.
    pub(super) replica: Option<Replica>,
    /// Providers started directly (shared mode, or no coordination).
    pub(super) providers: Vec<Arc<dyn Provider>>,
    /// Leader-mode providers: one leadership thread each.
    pub(super) leaders: Vec<Leadership>,
}

/// [`Bot::stop`] was called from the bot's own code: a handler, a flow step, the error
/// or outcome hook, or a provider's `start`/`stop`. The stop waits for every message
/// to end and for those threads to finish, so it would wait for itself; it is refused
/// and nothing changes. Stop from another thread (a signal thread, a monitor).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StopError {
    /// The replica id.
    pub replica: String,
}

impl std::fmt::Display for StopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Bot::stop of replica {:?} called from the bot's own handler, hook or provider \
             callback: it would wait for itself; stop the bot from another thread",
            self.replica
        )
    }
}

impl std::error::Error for StopError {}

impl std::fmt::Debug for Bot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bot")
            .field("id", &self.shared.replica.id)
            .field("workers", &self.shared.workers.lock().len())
            .finish_non_exhaustive()
    }
}

/// The intake of the bot whose scheduler is `shared`.
pub(super) fn intake_of(shared: &Arc<Shared>) -> Intake {
    Intake::new(shared.clone(), shared.replica.id.clone())
}

impl Parts {
    pub(super) fn new(replica: Replica) -> Parts {
        Parts {
            replica: Some(replica),
            providers: Vec::new(),
            leaders: Vec::new(),
        }
    }

    pub(super) fn stop_providers(&mut self) {
        for l in self.leaders.drain(..) {
            l.stop();
        }
        for p in self.providers.drain(..) {
            if catch_unwind(AssertUnwindSafe(|| p.stop())).is_err() {
                log::error!(target: "botmesh::runtime", "provider {:?} panicked in stop", p.id());
            }
        }
    }

    pub(super) fn stop_workers(&mut self, shared: &Shared) {
        shared.sched.lock().stopping = true;
        shared.work_cv.notify_all();
        let workers: Vec<JoinHandle<()>> = shared.workers.lock().drain().map(|(_, w)| w).collect();
        for w in workers {
            if w.join().is_err() {
                log::error!(target: "botmesh::runtime", "a worker thread panicked");
            }
        }
    }

    /// The clean stop (see [`Bot::stop`]).
    fn drain(mut self, shared: &Shared, grace: Option<Duration>) {
        // Intake closes first and the providers stop last: the replies of messages
        // still running here go out through a transport that is still up (and, in
        // leader mode, under a leadership that is still held). Messages a transport
        // delivers meanwhile are refused (`shutting_down`), so the platform sends them
        // again, to the next leader.
        let deadline = grace.and_then(|g| Instant::now().checked_add(g));
        {
            let mut s = shared.sched.lock();
            s.closed = true;
            while s.in_flight > 0 {
                match deadline {
                    Some(d) => {
                        if shared.idle_cv.wait_until(&mut s, d).timed_out() {
                            break;
                        }
                    }
                    None => shared.idle_cv.wait(&mut s),
                }
            }
        }
        if let Some(r) = &self.replica {
            // Messages still waiting end as `shutting_down`; those running or ready
            // finish below while the renewal thread still keeps their leases.
            r.cancel_waiters();
        }
        {
            let mut s = shared.sched.lock();
            while s.in_flight > 0 {
                shared.idle_cv.wait(&mut s);
            }
        }
        self.stop_providers();
        self.stop_workers(shared);
        if let Some(r) = self.replica.take() {
            r.shutdown();
        }
    }
}

impl Bot {
    pub(super) fn assemble(shared: Arc<Shared>, parts: Parts) -> Bot {
        Bot {
            shared,
            leader_states: parts.leaders.iter().map(|l| l.state().clone()).collect(),
            stop: Mutex::new(Stop::Running(parts)),
            stopped_cv: Condvar::new(),
        }
    }

    /// The handle that takes messages in.
    pub fn intake(&self) -> Intake {
        intake_of(&self.shared)
    }

    /// This replica's id.
    pub fn id(&self) -> &str {
        &self.shared.replica.id
    }

    /// A snapshot of this replica's counters and gauges.
    pub fn metrics(&self) -> MetricsSnapshot {
        let mut m = self.shared.replica.snapshot();
        // A leadership still without an open session counts up to now.
        let now = Instant::now();
        for l in &self.leader_states {
            if let Some(since) = *l.unopened_since.lock() {
                let ms = u64::try_from(now.saturating_duration_since(since).as_millis());
                m.leaderless_ms += ms.unwrap_or(u64::MAX);
            }
        }
        m
    }

    /// This replica's metrics in the Prometheus text exposition format (version
    /// 0.0.4): the snapshot's counters, gauges and wait histogram (see
    /// [`MetricsSnapshot::prometheus_text`]), then one
    /// `botmesh_leader_election_master_status{name="<provider id>"}` gauge per
    /// leader-mode provider: 1 while this replica leads it, 0 on a standby (shaped
    /// like client-go's `leader_election_master_status`). No label holds a chat id.
    pub fn metrics_text(&self) -> String {
        let mut out = self.metrics().prometheus_text();
        let leaders: Vec<(&str, bool)> = self
            .leader_states
            .iter()
            .map(|l| (&*l.provider, l.token().is_some()))
            .collect();
        crate::metrics::write_leader_gauges(&mut out, &leaders);
        out
    }

    /// The fencing token of this replica's leadership of the provider with id
    /// `provider`, while this replica leads it and its lease is not known to be lost;
    /// `None` on a standby, for a provider in shared mode, or for an unknown id.
    pub fn leader_token(&self, provider: &str) -> Option<Token> {
        self.leader_states
            .iter()
            .find(|l| &*l.provider == provider)
            .and_then(|l| l.token())
    }

    /// Messages taken in that have not ended yet (waiting, ready or running).
    pub fn in_flight(&self) -> usize {
        self.shared.sched.lock().in_flight
    }

    /// A clean stop, callable from any thread and through an `Arc<Bot>` (a signal
    /// handler's thread, a monitor): intake refuses new messages (a provider's
    /// `deliver` gets `shutting_down`, so the platform sends them again), every message
    /// taken in runs to its end (each still bounded by `turn_wait`) with its replies
    /// still going out, then providers stop (a leader stops its transport, then
    /// releases its leadership so a standby takes over at once), the workers stop and
    /// every turn is released at the coordinator. Returns once the bot is stopped.
    ///
    /// Idempotent: a second call, also one made while the first is still stopping
    /// the bot on another thread, waits for that stop and returns `Ok`.
    ///
    /// # Errors
    /// [`StopError`] when called from the bot's own handler, flow step, error or
    /// outcome hook, or provider `start`/`stop` (it would wait for itself); nothing
    /// changes then.
    pub fn stop(&self) -> Result<(), StopError> {
        self.stop_inner(None)
    }

    /// Like [`Bot::stop`], but messages still waiting for their turn after `grace`
    /// are reported `shutting_down` instead of being waited for.
    ///
    /// # Errors
    /// As [`Bot::stop`].
    pub fn stop_within(&self, grace: Duration) -> Result<(), StopError> {
        self.stop_inner(Some(grace))
    }

    /// [`Bot::stop`] for the owner of the bot. Called from the bot's own code it
    /// cannot wait for itself: it logs an error and leaves the stop to a thread of its
    /// own.
    pub fn shutdown(self) {
        self.stop_or_detach(None);
    }

    /// Like [`Bot::shutdown`], but messages still waiting for their turn after
    /// `grace` are reported `shutting_down` instead of being waited for.
    pub fn shutdown_within(self, grace: Duration) {
        self.stop_or_detach(Some(grace));
    }

    /// A simulated crash: the renewal thread stops, nothing is released or reported,
    /// and messages not yet ended are lost with the replica (its turns lapse within the
    /// TTL). Transports stop as a dead process's connections would, but a leadership
    /// is not released: a standby takes over after the TTL. Workers exit once their
    /// current handler returns; `abort` does not wait for them. For tests of replica
    /// failure.
    pub fn abort(self) {
        let Stop::Running(mut parts) = std::mem::replace(&mut *self.stop.lock(), Stop::Stopped)
        else {
            return;
        };
        // The replica first, so that no leadership thread can release its lease.
        if let Some(r) = parts.replica.take() {
            r.abort();
        }
        for l in parts.leaders.drain(..) {
            l.abort();
        }
        parts.stop_providers();
        {
            let mut s = self.shared.sched.lock();
            s.ready.clear();
            s.stopping = true;
        }
        self.shared.work_cv.notify_all();
        // Not joined: a worker stuck in a handler would block the "crash". Each one
        // exits when its handler returns.
        self.shared.workers.lock().clear();
    }

    fn stop_inner(&self, grace: Option<Duration>) -> Result<(), StopError> {
        if running_for(self.shared.key()) {
            return Err(StopError {
                replica: self.shared.replica.id.to_string(),
            });
        }
        let mut state = self.stop.lock();
        let parts = loop {
            match std::mem::replace(&mut *state, Stop::Stopping) {
                Stop::Running(parts) => break parts,
                Stop::Stopping => self.stopped_cv.wait(&mut state),
                Stop::Stopped => {
                    *state = Stop::Stopped;
                    return Ok(());
                }
            }
        };
        drop(state);
        parts.drain(&self.shared, grace);
        *self.stop.lock() = Stop::Stopped;
        self.stopped_cv.notify_all();
        Ok(())
    }

    /// Stops, or, from the bot's own code, hands the stop to a new thread.
    fn stop_or_detach(&self, grace: Option<Duration>) {
        if self.stop_inner(grace).is_ok() {
            return;
        }
        log::error!(target: "botmesh::runtime", "replica {:?} was shut down (or dropped) from its own handler, hook or provider callback; it stops on a thread of its own", self.shared.replica.id);
        let Stop::Running(parts) = std::mem::replace(&mut *self.stop.lock(), Stop::Stopped) else {
            return;
        };
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("botmesh-stop-{}", shared.replica.id))
            .spawn(move || parts.drain(&shared, grace));
        if let Err(e) = spawned {
            log::error!(target: "botmesh::runtime", "cannot spawn the stop thread ({e}); the replica's leases lapse by TTL");
        }
    }
}

impl Drop for Bot {
    fn drop(&mut self) {
        self.stop_or_detach(None);
    }
}
