//! `Bot`: the handle of one running replica, and its stops.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::workers::Shared;
use crate::coordinator::Token;
use crate::intake::Intake;
use crate::metrics::MetricsSnapshot;
use crate::provider::Provider;
use crate::provider::leadership::Leadership;
use crate::replica::Replica;

/// One replica of a bot: W worker threads running a handler per message under the
/// chat's turn.
///
/// Build it with [`Bot::builder`]; feed it through [`Bot::intake`] (or providers);
/// stop it with [`Bot::shutdown`]. See the [`BotBuilder`](crate::BotBuilder) example.
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
    /// The replica; taken by the stop (so `Drop` after `shutdown` does nothing).
    pub(super) replica: Option<Replica>,
    /// Providers started directly (shared mode, or no coordination).
    pub(super) providers: Vec<Arc<dyn Provider>>,
    /// Leader-mode providers: one leadership thread each.
    pub(super) leaders: Vec<Leadership>,
}

impl std::fmt::Debug for Bot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bot")
            .field("id", &self.shared.replica.id)
            .field("workers", &self.shared.workers.lock().len())
            .finish_non_exhaustive()
    }
}

impl Bot {
    /// The handle that takes messages in.
    pub fn intake(&self) -> Intake {
        Intake::new(self.shared.clone(), self.shared.replica.id.clone())
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
        self.stop_workers();
        if let Some(r) = self.replica.take() {
            r.shutdown();
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

    pub(super) fn stop_workers(&mut self) {
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
