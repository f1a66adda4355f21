//! The faults: their kinds, the seeded plan, and the director that injects them into
//! the platform's loop one after another.
//!
//! The plan is drawn before the run from `--seed`: for each fault its kind, how long it
//! lasts, which replica slot it hits (replica faults) and the pause before it. One fault
//! runs at a time (a replica fault ends once the replica runs again: resumed, or its
//! replacement ready), so each drop can be set against the fault that caused it. The
//! timing of the run itself (when a replica answers, how long Redis takes to start) is
//! the machine's, so two runs with one seed inject the same faults in the same order,
//! not at the same microsecond.

use std::panic::AssertUnwindSafe;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common;
use crate::parent::{Director, Dispatcher};
use crate::proxy::Proxy;
use crate::redis_server::RedisServer;
use crate::resp;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// SIGKILL of a replica; a new replica process replaces it.
    Kill,
    /// SIGSTOP of a replica for longer than the lease TTL, then SIGCONT.
    Pause,
    /// Redis killed and started again on its port, empty.
    RedisRestart,
    /// `CLIENT KILL TYPE pubsub`: every subscriber connection closed by Redis.
    PubsubKill,
    /// 0–5 ms of delay on every chunk through the proxy.
    Jitter,
    /// The proxy holds every byte for a while.
    Blackhole,
    /// The proxy shuts every open connection.
    Cut,
    /// Busy loops, two per core.
    Busy,
}

impl Kind {
    /// Every kind, in the order the summary lists them.
    pub const ALL: [Kind; 8] = [
        Kind::Kill,
        Kind::Pause,
        Kind::RedisRestart,
        Kind::PubsubKill,
        Kind::Jitter,
        Kind::Blackhole,
        Kind::Cut,
        Kind::Busy,
    ];

    /// The name in flags, logs and the summary.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Pause => "pause",
            Kind::RedisRestart => "redis_restart",
            Kind::PubsubKill => "pubsub_kill",
            Kind::Jitter => "jitter",
            Kind::Blackhole => "blackhole",
            Kind::Cut => "cut",
            Kind::Busy => "busy",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether it hits one replica.
    pub fn targets_replica(self) -> bool {
        matches!(self, Kind::Kill | Kind::Pause)
    }
}

/// One fault of the plan.
#[derive(Clone, Debug)]
pub struct Planned {
    pub kind: Kind,
    /// The pause after the previous fault ended.
    pub gap: Duration,
    /// How long it lasts: the pause, the blackhole, the jitter or the busy loops; Redis's
    /// time down; the delay before a killed replica is replaced. Zero for a cut and a
    /// subscriber kill, which are instants.
    pub length: Duration,
    /// For replica faults: the replica slot (0-based) it hits.
    pub slot: usize,
}

/// Draws `n` faults of `kinds` from `seed`. Lengths scale with the lease TTL where the
/// TTL is what they test: a pause is always longer than it (the lease must lapse), a
/// blackhole is sometimes shorter (the lease must survive) and sometimes longer.
pub fn plan(seed: u64, n: usize, kinds: &[Kind], ttl: Duration, slots: usize) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC4A0_5EED);
    let ms = |rng: &mut StdRng, lo: f64, hi: f64| {
        Duration::try_from_secs_f64(rng.gen_range(lo..=hi) / 1000.0).unwrap_or_default()
    };
    let ttl_ms = ttl.as_secs_f64() * 1000.0;
    (0..n)
        .map(|_| {
            let kind = kinds
                .get(rng.gen_range(0..kinds.len().max(1)))
                .copied()
                .unwrap_or(Kind::Kill);
            let length = match kind {
                Kind::Kill => ms(&mut rng, 0.0, 500.0),
                Kind::Pause => ms(&mut rng, 1.2 * ttl_ms, 2.0 * ttl_ms),
                Kind::RedisRestart => ms(&mut rng, 50.0, 1000.0),
                Kind::PubsubKill | Kind::Cut => Duration::ZERO,
                Kind::Jitter | Kind::Busy => ms(&mut rng, 500.0, 2000.0),
                Kind::Blackhole => ms(&mut rng, 0.2 * ttl_ms, 1.5 * ttl_ms),
            };
            Planned {
                kind,
                gap: ms(&mut rng, 100.0, 500.0),
                length,
                slot: rng.gen_range(0..slots.max(1)),
            }
        })
        .collect()
}

/// A fault as it happened, on the run's clock (from its start).
#[derive(Clone, Debug)]
pub struct Seen {
    pub kind: Kind,
    /// The replica it hit.
    pub replica: Option<String>,
    pub start: Duration,
    pub end: Duration,
    /// The same, in µs since the Unix epoch (the log's clock).
    pub start_us: u64,
    pub end_us: u64,
    /// The planned length (see [`Planned::length`]).
    pub length: Duration,
    /// What else there is to say (the replacement replica, connections cut, …).
    pub detail: String,
}

/// What is under way.
enum State {
    /// Waiting until the next fault is due.
    Idle { next: Instant },
    /// A fault runs until `until`.
    Active {
        fault: usize,
        target: Option<usize>,
        until: Instant,
    },
    /// A killed replica's replacement `k` is starting.
    Replacing {
        fault: usize,
        k: usize,
        since: Instant,
    },
}

/// Busy-loop processes, killed when dropped (also on an early return or a panic).
#[derive(Default)]
struct Busy(Vec<Child>);

impl Busy {
    fn stop(&mut self) {
        for mut child in self.0.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The director of a chaos run.
pub struct Chaos<'a> {
    plan: Vec<Planned>,
    /// The replica in each slot now (a killed one's replacement takes its slot).
    slots: Vec<usize>,
    server: &'a mut RedisServer,
    proxy: &'a Proxy,
    state: State,
    /// Faults injected so far (the next one to inject is `plan[injected]`).
    injected: usize,
    /// Faults that could not be injected, with why.
    pub failed: Vec<String>,
    /// The faults as they happened.
    pub seen: Vec<Seen>,
    busy: Busy,
    /// The longest a replacement replica may take to be ready.
    ready_within: Duration,
    /// The platform's start, the origin of the run's clock (for the probe's stalls).
    pub started: Option<Instant>,
    /// The live replicas for the probe to watch (name, pid), updated every tick.
    pub watched: crate::probe::Watched,
}

impl<'a> Chaos<'a> {
    /// A director for `plan`, over replicas `0..replicas` of the platform.
    pub fn new(
        plan: Vec<Planned>,
        replicas: usize,
        server: &'a mut RedisServer,
        proxy: &'a Proxy,
    ) -> Chaos<'a> {
        let first = plan.first().map_or(Duration::ZERO, |p| p.gap);
        Chaos {
            plan,
            slots: (0..replicas).collect(),
            server,
            proxy,
            state: State::Idle {
                next: Instant::now() + first + Duration::from_millis(500),
            },
            injected: 0,
            failed: Vec::new(),
            seen: Vec::new(),
            busy: Busy::default(),
            ready_within: Duration::from_secs(30),
            started: None,
            watched: Default::default(),
        }
    }

    fn start(&mut self, p: &mut Dispatcher, now: Instant) -> State {
        let index = self.injected;
        let Some(fault) = self.plan.get(index).cloned() else {
            return State::Idle { next: now };
        };
        self.injected += 1;
        let at = now.saturating_duration_since(p.started());
        let target = fault.kind.targets_replica().then(|| {
            let slot = fault.slot % self.slots.len().max(1);
            self.slots.get(slot).copied().unwrap_or(0)
        });
        let result: Result<String, String> = match (fault.kind, target) {
            (Kind::Kill, Some(k)) => {
                let held = p.held(k);
                p.kill(k).map(|()| format!("held {held} update(s)"))
            }
            (Kind::Pause, Some(k)) => p.signal(k, "STOP").map(|()| String::new()),
            (Kind::RedisRestart, _) => {
                self.server.kill();
                Ok(String::new())
            }
            (Kind::PubsubKill, _) => resp::client_kill_pubsub(self.server.port())
                .map(|n| format!("{n} subscriber connection(s) killed")),
            (Kind::Jitter, _) => {
                self.proxy.set_jitter(true);
                Ok(String::new())
            }
            (Kind::Blackhole, _) => {
                self.proxy.set_blackhole(true);
                Ok(String::new())
            }
            (Kind::Cut, _) => Ok(format!("{} connection(s) cut", self.proxy.cut_all())),
            (Kind::Busy, _) => self.start_busy(),
            (_, None) => Err("no replica to hit".to_owned()),
        };
        let replica = target.map(|k| p.name(k));
        eprintln!(
            "chaos: {:7.1} s  fault {}/{}: {}{} for {} ms",
            at.as_secs_f64(),
            index + 1,
            self.plan.len(),
            fault.kind.name(),
            replica.as_ref().map_or(String::new(), |r| format!(" {r}")),
            fault.length.as_millis()
        );
        match result {
            Ok(detail) => {
                self.seen.push(Seen {
                    kind: fault.kind,
                    replica,
                    start: at,
                    end: at,
                    start_us: common::unix_us(),
                    end_us: common::unix_us(),
                    length: fault.length,
                    detail,
                });
                State::Active {
                    fault: self.seen.len() - 1,
                    target,
                    until: now + fault.length,
                }
            }
            Err(e) => {
                self.failed
                    .push(format!("fault {} ({}): {e}", index + 1, fault.kind.name()));
                State::Idle {
                    next: now + self.gap_after(index),
                }
            }
        }
    }

    fn start_busy(&mut self) -> Result<String, String> {
        // Twice as many loops as cores, so every thread of the replicas (renewal, timer,
        // subscriber) waits for a core now and then, not only the workers.
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        for _ in 0..2 * cores {
            let child = Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start a busy loop: {e}"))?;
            self.busy.0.push(child);
        }
        Ok(format!("{} busy loop(s)", 2 * cores))
    }

    /// Ends the fault that ran until now; a kill goes on until its replacement is ready.
    fn finish(
        &mut self,
        p: &mut Dispatcher,
        fault: usize,
        target: Option<usize>,
        now: Instant,
    ) -> State {
        let Some(kind) = self.seen.get(fault).map(|s| s.kind) else {
            return State::Idle { next: now };
        };
        let mut problem = None;
        match (kind, target) {
            (Kind::Kill, Some(_)) => match p.start_replica() {
                Ok(k) => {
                    if let Some(s) = self.seen.get_mut(fault) {
                        s.detail = format!("{}, replaced by {}", s.detail, p.name(k));
                    }
                    return State::Replacing {
                        fault,
                        k,
                        since: now,
                    };
                }
                Err(e) => problem = Some(e),
            },
            (Kind::Pause, Some(k)) => {
                if let Err(e) = p.signal(k, "CONT") {
                    problem = Some(e);
                }
            }
            (Kind::RedisRestart, _) => {
                let server = &mut *self.server;
                // The support code panics when the server does not come back.
                if std::panic::catch_unwind(AssertUnwindSafe(|| server.restart())).is_err() {
                    problem = Some("redis-server did not start again".to_owned());
                }
            }
            (Kind::Jitter, _) => self.proxy.set_jitter(false),
            (Kind::Blackhole, _) => self.proxy.set_blackhole(false),
            (Kind::Busy, _) => self.busy.stop(),
            _ => {}
        }
        self.close(p, fault, now, problem)
    }

    fn close(
        &mut self,
        p: &Dispatcher,
        fault: usize,
        now: Instant,
        problem: Option<String>,
    ) -> State {
        if let Some(s) = self.seen.get_mut(fault) {
            // Now, not `now`: bringing Redis back (an append-only file to load) takes
            // seconds after `now` was read, and the fault lasts until it is back.
            s.end = Instant::now().saturating_duration_since(p.started());
            s.end_us = common::unix_us();
            if let Some(e) = problem {
                self.failed.push(format!(
                    "{} at {:.1} s: {e}",
                    s.kind.name(),
                    s.start.as_secs_f64()
                ));
            }
        }
        State::Idle {
            next: now + self.gap_after(self.injected.saturating_sub(1)),
        }
    }

    fn gap_after(&self, index: usize) -> Duration {
        self.plan.get(index + 1).map_or(Duration::ZERO, |p| p.gap)
    }
}

impl Director for Chaos<'_> {
    fn tick(&mut self, p: &mut Dispatcher) -> Option<Instant> {
        let now = Instant::now();
        self.started.get_or_insert(p.started());
        if let Ok(mut watched) = self.watched.lock() {
            watched.clear();
            watched.extend(
                p.live()
                    .into_iter()
                    .filter_map(|k| Some((p.name(k), p.pid(k)?))),
            );
        }
        // Traffic runs until the last fault is over: another round of the input
        // before the platform runs dry.
        if !self.finished() && p.undelivered() < p.round_len() / 2 + 1 {
            p.add_round();
        }
        let state = std::mem::replace(&mut self.state, State::Idle { next: now });
        self.state = match state {
            State::Idle { next } if now >= next && self.injected < self.plan.len() => {
                self.start(p, now)
            }
            State::Active {
                fault,
                target,
                until,
            } if now >= until => self.finish(p, fault, target, now),
            State::Replacing { fault, k, since } => {
                if p.is_live(k) {
                    // The replacement takes the killed replica's slot.
                    if let Some(seen) = self.seen.get(fault)
                        && let Some(slot) = self
                            .slots
                            .iter()
                            .position(|&s| Some(p.name(s)) == seen.replica)
                        && let Some(s) = self.slots.get_mut(slot)
                    {
                        *s = k;
                    }
                    self.close(p, fault, now, None)
                } else if p.is_gone(k) || now.saturating_duration_since(since) > self.ready_within {
                    self.close(
                        p,
                        fault,
                        now,
                        Some(format!("replacement {} never got ready", p.name(k))),
                    )
                } else {
                    State::Replacing { fault, k, since }
                }
            }
            other => other,
        };
        match &self.state {
            State::Idle { next } => Some(*next),
            State::Active { until, .. } => Some(*until),
            State::Replacing { .. } => Some(now + Duration::from_millis(10)),
        }
    }

    fn finished(&self) -> bool {
        self.injected >= self.plan.len() && matches!(self.state, State::Idle { .. })
    }
}

impl Drop for Chaos<'_> {
    fn drop(&mut self) {
        // Whatever happened, nothing is left misbehaving: the proxy behaves, the busy
        // loops end (paused replicas are killed with the rest by the platform).
        self.proxy.set_jitter(false);
        self.proxy.set_blackhole(false);
        self.busy.stop();
    }
}
