//! Provider leadership: one replica drives an exclusive transport, the others stand by.
//!
//! The leadership of provider `p` is a lease named `"\0provider:p"` at the coordinator,
//! taken exactly like a chat's turn (leases for leader election: Gray and Cheriton,
//! "Leases", 1989). A replica campaigns by queueing one ticket on that name, with no
//! message id and no wait limit; the ticket that holds the turn is the leader. So the
//! turn machinery gives leadership everything it needs, with no backend script of its
//! own:
//!
//! - the leader's lease is renewed with the replica's other leases, in the renewal
//!   tick's one round trip;
//! - a leader that stops cleanly releases, and the release pushes the grant to the next
//!   standby in the queue at once (Redis: pub/sub);
//! - a crashed leader's lease lapses after the TTL, and the standbys' re-check (every
//!   TTL/3) hands it on: failover within TTL + one re-check;
//! - the grant's fencing token is the leadership's token (Kleppmann 2016), strictly
//!   greater than every earlier leader's, and is given to the transport.
//!
//! One thread per leader-mode provider runs the state machine below; standbys hold no
//! thread while they wait (the ticket is an entry in the replica's table).
//!
//! ```text
//!            grant                      transport closed for provider_down
//! Standby ─────────▶ Leader ───────────────────────────────────────────▶ SittingOut
//!    ▲                 │  lease lost (renewal refused, paused past TTL)        │
//!    └─────────────────┴───────────────────────────────────────────────────────┘
//!                          (sitting out lasts one re-check period)
//! ```
//!
//! Leaving the leader state always stops the transport first, then gives the lease up,
//! so the next leader's session cannot overlap this one.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, select, unbounded};
use parking_lot::Mutex;

use crate::coordinator::Token;
use crate::intake::Intake;
use crate::metrics::{Metrics, dec, inc};
use crate::provider::{
    Capabilities, CloseReason, Fence, Provider, ProviderError, Reply, Session, Status, StatusSender,
};
use crate::replica::{Inner, OnGrant};
use crate::replica::{Turn, TurnState, period, provider_lease};

/// How often a leader checks its lease by its own clock: a lease marked lost by the
/// renewal thread is noticed within this period, one that ran out while the process
/// was paused as soon as the thread runs again.
fn watch_period(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(1), Duration::from_millis(100))
}

/// How long before its lease would run out unrenewed a leader gives the transport
/// up: one renewal period (TTL/3), so that [`Provider::stop`] has that long to close
/// the session before the backend could grant the lease to a standby. A healthy leader
/// never gets this close (each renewal puts the end a TTL ahead); it takes two missed
/// renewals in a row.
fn give_up_margin(ttl: Duration) -> Duration {
    ttl / 3
}

/// What this replica knows about one provider's leadership, shared by the leadership
/// thread, the send gate and [`Bot::leader_token`](crate::Bot::leader_token).
pub(crate) struct LeaderState {
    pub(crate) provider: Arc<str>,
    /// The lease while this replica leads and its transport may run.
    current: Mutex<Option<Arc<TurnState>>>,
    /// While leading: since when no session has been open (for `leaderless_ms`,
    /// which a snapshot reads while the period is still going).
    pub(crate) unopened_since: Mutex<Option<Instant>>,
}

impl LeaderState {
    pub(crate) fn new(provider: Arc<str>) -> Self {
        LeaderState {
            provider,
            current: Mutex::new(None),
            unopened_since: Mutex::new(None),
        }
    }

    /// The token of this replica's leadership, when it leads and its lease is not
    /// known to be lost (by the renewal's verdict or by its own clock).
    pub(crate) fn token(&self) -> Option<Token> {
        self.current
            .lock()
            .as_ref()
            .filter(|s| !s.is_lost_at(Instant::now()))
            .map(|s| s.token)
    }
}

/// The provider as the handlers see it in leader mode: sends are refused unless this
/// replica holds a live leadership. Start and stop belong to the leadership thread.
pub(crate) struct Gated {
    pub(crate) inner: Arc<dyn Provider>,
    pub(crate) state: Arc<LeaderState>,
}

impl Provider for Gated {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn start(&self, session: Session) -> Result<(), ProviderError> {
        self.inner.start(session)
    }

    fn stop(&self) {
        self.inner.stop();
    }

    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        self.check()?;
        self.inner.send(chat, text)
    }

    fn send_reply(
        &self,
        chat: &str,
        reply: &Reply,
        fence: &Fence<'_>,
    ) -> Result<(), ProviderError> {
        self.check()?;
        // Retries inside the transport ask the leadership again at every attempt.
        let leads = || self.state.token().is_some();
        let live = fence.and(&leads);
        self.inner
            .send_reply(chat, reply, &Fence::new(&live, fence.token()))
    }
}

impl Gated {
    fn check(&self) -> Result<(), ProviderError> {
        if self.state.token().is_none() {
            return Err(ProviderError(format!(
                "send refused: this replica does not hold the leadership of provider {:?}",
                self.state.provider
            )));
        }
        Ok(())
    }
}

enum Cmd {
    /// A clean stop: stop the transport, give the lease up (or the ticket back).
    Stop,
    /// A simulated crash: stop the transport, release nothing.
    Abort,
}

/// How a leadership ended.
enum Ended {
    Stop,
    Abort,
    /// The transport stayed closed for `provider_down`.
    SteppedDown,
    /// The lease was lost while leading.
    Deposed,
}

/// The handle of one provider's leadership thread.
pub(crate) struct Leadership {
    state: Arc<LeaderState>,
    cmds: Sender<Cmd>,
    thread: Option<JoinHandle<()>>,
}

impl Leadership {
    /// Starts campaigning for `provider` on `replica`.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub(crate) fn spawn(
        replica: Arc<Inner>,
        provider: Arc<dyn Provider>,
        state: Arc<LeaderState>,
        intake: Intake,
        metrics: Arc<Metrics>,
        provider_down: Duration,
    ) -> std::io::Result<Leadership> {
        let (cmd_tx, cmd_rx) = unbounded();
        let (status_tx, status_rx) = unbounded();
        let ttl = replica.ttl;
        // A thread name may not hold a NUL; a provider id may.
        let name = format!("botmesh-lead-{}-{}", replica.id, state.provider).replace('\0', "?");
        let runner = Runner {
            lease: provider_lease(&state.provider),
            replica,
            provider,
            state: state.clone(),
            intake,
            metrics,
            provider_down,
            period: period(ttl),
            watch: watch_period(ttl),
            margin: give_up_margin(ttl),
            cmds: cmd_rx,
            status_tx,
            status_rx,
            generation: 0,
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || runner.run())?;
        Ok(Leadership {
            state,
            cmds: cmd_tx,
            thread: Some(thread),
        })
    }

    pub(crate) fn state(&self) -> &Arc<LeaderState> {
        &self.state
    }

    /// A clean stop: the transport stops, then the lease is released (a standby leads
    /// at once) or the standby's ticket is taken back. Returns when done.
    pub(crate) fn stop(mut self) {
        self.finish(Cmd::Stop);
    }

    /// A simulated crash: the transport stops (as a dead process's connections
    /// close), nothing is released. Call it after the replica was aborted.
    pub(crate) fn abort(mut self) {
        self.finish(Cmd::Abort);
    }

    fn finish(&mut self, cmd: Cmd) {
        let _ = self.cmds.send(cmd);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            log::error!(target: "botmesh::leadership", "the leadership thread of provider {:?} panicked", self.state.provider);
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.finish(Cmd::Stop);
    }
}

struct Runner {
    lease: String,
    replica: Arc<Inner>,
    provider: Arc<dyn Provider>,
    state: Arc<LeaderState>,
    intake: Intake,
    metrics: Arc<Metrics>,
    provider_down: Duration,
    /// The re-check period: how long a failed campaign waits to retry, and how long a
    /// leader that stepped down sits out.
    period: Duration,
    watch: Duration,
    margin: Duration,
    cmds: Receiver<Cmd>,
    status_tx: Sender<(u64, Status)>,
    status_rx: Receiver<(u64, Status)>,
    /// Numbers the transport's sessions, so late reports of a stopped one are ignored.
    generation: u64,
}

impl Runner {
    fn run(mut self) {
        // The transport's start and stop run here: a bot stop called from them would
        // wait for this thread.
        let _in_bot = crate::intake::InBot::enter(self.intake.bot_key());
        loop {
            let Some(turn) = self.campaign() else {
                return;
            };
            match self.lead(turn) {
                Ended::Stop | Ended::Abort => return,
                // Out of the next round, so a standby gets its chance: any live standby
                // has its ticket queued already and got the lease with the release;
                // one whose ticket is being placed again does within a re-check.
                Ended::SteppedDown => {
                    if self.pause(self.period).is_some() {
                        return;
                    }
                }
                Ended::Deposed => {}
            }
        }
    }

    /// Waits up to `d` for a command; `Some` means stop now.
    fn pause(&self, d: Duration) -> Option<Cmd> {
        match self.cmds.recv_timeout(d) {
            Ok(cmd) => Some(cmd),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Cmd::Stop),
        }
    }

    /// Standby: queues a ticket on the lease and waits for its grant. `None` when told
    /// to stop meanwhile.
    fn campaign(&self) -> Option<Turn> {
        loop {
            let (tx, rx) = bounded(1);
            // If this thread is gone when the grant comes, the turn drops with the
            // failed send and is released, so the lease moves on.
            let on_grant: OnGrant = Box::new(move |r| {
                let _ = tx.send(r);
            });
            let seq = match self.replica.enqueue_stored(
                self.lease.as_str(),
                None,
                Duration::MAX,
                on_grant,
            ) {
                Ok(placed) => placed.seq,
                Err(e) => {
                    log::warn!(target: "botmesh::leadership", "replica {} cannot campaign for provider {:?}, retrying: {e}", self.replica.id, self.state.provider);
                    if self.pause(self.period).is_some() {
                        return None;
                    }
                    continue;
                }
            };
            select! {
                recv(rx) -> got => match got {
                    Ok(Ok(turn)) => return Some(turn),
                    Ok(Err(e)) => {
                        log::debug!(target: "botmesh::leadership", "campaign for provider {:?} ended without a grant: {e}", self.state.provider);
                    }
                    // The ticket was forgotten unanswered (the replica was aborted).
                    Err(_) => {}
                },
                recv(self.cmds) -> cmd => {
                    if !matches!(cmd, Ok(Cmd::Abort)) {
                        self.replica.withdraw(seq);
                        // A grant that came just before the withdrawal is released.
                        if let Ok(Ok(turn)) = rx.try_recv() {
                            let _ = turn.release();
                        }
                    }
                    return None;
                }
            }
            if self.pause(self.period).is_some() {
                return None;
            }
        }
    }

    /// Leader: runs the transport until a command, a step-down or a lost lease.
    fn lead(&mut self, turn: Turn) -> Ended {
        let token = turn.fencing_token();
        // A pushed grant may arrive late (a paused process, a slow network), after the
        // backend let the lease lapse and granted it to another standby: one renewal
        // round trip proves the lease is still ours before the transport starts.
        if !self.replica.confirm(&turn.state) {
            log::info!(target: "botmesh::leadership", "replica {} got a stale grant of provider {:?} (token {token}); campaigning again", self.replica.id, self.state.provider);
            drop(turn.release());
            return Ended::Deposed;
        }
        self.generation += 1;
        let granted = Instant::now();
        *self.state.current.lock() = Some(turn.state.clone());
        inc(&self.metrics.leadership_changes);
        inc(&self.metrics.providers_led);
        log::info!(target: "botmesh::leadership", "replica {} leads provider {:?} (token {token})", self.replica.id, self.state.provider);
        let status = StatusSender::new(
            self.state.provider.clone(),
            self.replica.id.clone(),
            self.metrics.clone(),
            self.generation,
            Some(self.status_tx.clone()),
        );
        // Since when the transport has not been open, for provider_down: from the grant,
        // so a transport that never opens (stuck connecting) steps down too.
        let mut down_since: Option<Instant> = Some(granted);
        // When the current period without an open session began, for leaderless_ms.
        *self.state.unopened_since.lock() = Some(granted);
        let session = Session::new(self.intake.clone(), status, Some(token));
        // A panicking transport must not end the election thread: it counts as a
        // failed start, and the lease is still given up the normal way.
        let started = catch_unwind(AssertUnwindSafe(|| self.provider.start(session)))
            .unwrap_or_else(|_| Err(ProviderError("start panicked".into())));
        if let Err(e) = started {
            log::warn!(target: "botmesh::leadership", "provider {:?} failed to start on replica {}: {e}", self.state.provider, self.replica.id);
        }
        let ended = loop {
            // One renewal period early (checked every watch period): the transport is
            // then stopped before the lease could run out by our clock, which is
            // before the backend could grant it to a standby.
            if turn
                .state
                .expires_within(Instant::now(), self.margin + self.watch)
            {
                break Ended::Deposed;
            }
            let mut timeout = self.watch;
            if let Some(since) = down_since {
                let left = (since + self.provider_down).saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Ended::SteppedDown;
                }
                timeout = timeout.min(left);
            }
            select! {
                recv(self.cmds) -> cmd => break match cmd {
                    Ok(Cmd::Abort) => Ended::Abort,
                    _ => Ended::Stop,
                },
                recv(self.status_rx) -> got => {
                    let Ok((generation, status)) = got else { continue };
                    if generation != self.generation {
                        continue; // a stopped session's late report
                    }
                    let now = Instant::now();
                    match status {
                        Status::Open => {
                            down_since = None;
                            if let Some(since) = self.state.unopened_since.lock().take() {
                                self.add_leaderless(now - since);
                            }
                        }
                        Status::Closed(reason) => {
                            down_since.get_or_insert(now);
                            self.state.unopened_since.lock().get_or_insert(now);
                            // The platform saw a newer token, or a newer session took
                            // over: unless a renewal proves the lease is still ours,
                            // we were deposed; reconnecting would only fight.
                            let fenced = matches!(reason, CloseReason::Fenced);
                            let replaced = matches!(reason, CloseReason::Replaced);
                            if fenced || (replaced && !self.replica.confirm(&turn.state)) {
                                break Ended::Deposed;
                            }
                        }
                        Status::Connecting => {}
                    }
                },
                default(timeout) => {}
            }
        };
        // Sends are refused from here on; the transport stops before the lease goes.
        *self.state.current.lock() = None;
        if catch_unwind(AssertUnwindSafe(|| self.provider.stop())).is_err() {
            log::error!(target: "botmesh::leadership", "provider {:?} panicked in stop on replica {}", self.state.provider, self.replica.id);
        }
        if let Some(since) = self.state.unopened_since.lock().take() {
            self.add_leaderless(since.elapsed());
        }
        inc(&self.metrics.leadership_changes);
        dec(&self.metrics.providers_led);
        let (replica, provider) = (&self.replica.id, &self.state.provider);
        match ended {
            Ended::Stop => {
                log::info!(target: "botmesh::leadership", "replica {replica} stops leading provider {provider:?}");
            }
            Ended::Abort => {}
            Ended::SteppedDown => {
                log::warn!(target: "botmesh::leadership", "replica {replica} steps down as leader of provider {provider:?}: its transport stayed closed for {:?}", self.provider_down);
            }
            Ended::Deposed => {
                log::warn!(target: "botmesh::leadership", "replica {replica} lost the leadership of provider {provider:?} (token {token}); transport stopped");
            }
        }
        // After an abort the replica is aborted already: this releases nothing at the
        // backend, and a standby waits for the lease to lapse, as after a crash.
        if let Err(e) = turn.release()
            && !matches!(ended, Ended::Abort)
        {
            log::debug!(target: "botmesh::leadership", "release of the leadership of provider {provider:?}: {e}");
        }
        ended
    }

    fn add_leaderless(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.metrics
            .leaderless_us
            .fetch_add(us, std::sync::atomic::Ordering::Relaxed);
    }
}
