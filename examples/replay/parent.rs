//! The platform in front of replica processes (`--processes`).
//!
//! The parent starts `--replicas` copies of this example as replica processes (hidden
//! flag `--child-replica rK`, see `replay/procs.rs`) and talks to each over its
//! stdin/stdout with the line protocol of [`crate::protocol`]. One thread, the
//! dispatcher, owns every decision; per replica one thread feeds its stdin and one
//! reads its stdout into the dispatcher's queue.
//!
//! - **Order.** A chat's next update is sent only once its previous one was answered
//!   (`accepted`, `duplicate` or `refused`), as Telegram's webhooks do.
//! - **Load balancing.** Each delivery goes to a live replica drawn from a generator
//!   seeded by `--seed`.
//! - **Redelivery.** When a replica's stdout ends (it died, or was killed), every update
//!   it accepted that did not end is sent to another live replica and logged with
//!   `"redelivered": true`. botmesh's duplicate suppression still sees the dead
//!   replica's claim on the message id until its liveness lapses (at most one lease TTL
//!   after its last renewal), and answers `duplicate` until then; so a redelivery that
//!   is answered `duplicate` within lease TTL + 1 s of the death is sent again after a
//!   short pause, and only a later `duplicate` is final (the dead replica had handled it,
//!   which its part file then shows).
//! - **Faults.** A [`Director`] is called on every turn of the loop and may kill,
//!   pause or start replicas and add rounds of the trace: `--kill-replica-at F` is the
//!   director [`KillAt`] here (it SIGKILLs one live replica once `F` of the updates
//!   were delivered for the first time); the chaos example has a richer one.
//! - **Part files.** Every replica appends its `handled` lines to a part file of its
//!   own before the handler returns (`replay/parts.rs`); at the end the platform adds
//!   the ones it never heard of (a replica killed before it reported them) to the log
//!   and to the checks, with `"recovered": true`. A line whose replica reported the
//!   update as ending otherwise (`lost`) becomes a `ran` line, checked for fencing only.
//!
//! The parent checks across processes: every update ended exactly once (at least once
//! when redelivered), none ended only as a `duplicate` without a `handled` line
//! anywhere (a silent loss), a chat's handlers started in `message_id` order
//! (redelivered ones skipped), never overlapped (by their start and end on the system
//! clock), and carried fencing tokens that never went backwards and rose whenever the
//! replica changed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::args::Options;
use crate::backend::RedisSettings;
use crate::common;
use crate::data::Trace;
use crate::parts;
use crate::procs::{self, Event, Replica};
use crate::report::{LogMsg, LogWriter, REASONS, RedisFacts, Summary};

// What the platform makes of a finished run: the part files merged, the silent losses,
// the checks.
#[path = "verdict.rs"]
mod verdict;
// What a director may do to the platform.
#[path = "steer.rs"]
mod steer;
// The replicas' answers, and the deliveries they lead to.
#[path = "events.rs"]
mod events;

/// How long the replicas may take to stop once every update ended.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// One update as the dispatcher tracks it.
#[derive(Default)]
struct Update {
    /// The replica its latest delivery went to.
    sent_to: Option<usize>,
    /// When its latest delivery was sent.
    sent_at: Option<Instant>,
    /// How many times it ended.
    ends: u32,
    /// Delivered again after a replica died with it.
    redelivered: bool,
    /// Until when a `duplicate` answer may still be the dead replica's live claim.
    retry_until: Option<Instant>,
    /// Whether one of its ends was `handled` (as reported, or recovered from a part
    /// file).
    handled: bool,
    /// Whether one of its ends was not `duplicate`.
    ended_otherwise: bool,
}

/// One chat: its updates in file order, and the one whose answer it waits for.
#[derive(Default)]
struct Chat {
    updates: Vec<usize>,
    next: usize,
    awaiting: Option<usize>,
    /// A `Due` timer for it is queued: nothing else may send for it meanwhile.
    timer: bool,
    /// Its updates delivered and not ended yet (for `--max-backlog`).
    open: usize,
}

/// A handler run, for the checks after the replay.
struct Run {
    chat: usize,
    message_id: i64,
    replica: usize,
    fence: u64,
    start_us: u64,
    end_us: u64,
    redelivered: bool,
    /// A handled end (reported, or recovered from a killed replica's part file), so it
    /// takes part in every check; a run its replica reported as ending otherwise (a
    /// lost turn) is only held to the fencing rule, since botmesh declared it void.
    counted: bool,
}

/// Timed work of the dispatcher.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// A chat's next update reaches its time.
    Due(usize),
    /// A redelivery answered `duplicate` is tried again.
    Retry(usize),
}

/// How the platform treats a `duplicate` answer to a redelivery that came soon after
/// the replica that had the update died.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum EarlyDuplicates {
    /// Sends it again after a short pause, until the dead replica's claim lapsed (the
    /// replay's platform: it measures throughput and order, not this).
    Retry,
    /// Takes it as final, as a webhook platform takes any answer that is not an error
    /// (the chaos harness: a `duplicate` must then be backed by a `handled` line).
    Final,
}

/// When the platform sends each update for the first time.
pub enum Pace {
    /// As soon as its chat's previous update was answered.
    Asap,
    /// Not before these offsets from the start (`--speed`), one per update.
    Times(Vec<Duration>),
    /// Update number `i` not before `i / rate` seconds from the start.
    Rate(f64),
}

/// What the platform counted.
#[derive(Default, Debug)]
pub struct Counts {
    /// Ends reported `handled`.
    pub handled: u64,
    /// Ends reported `dropped`, by [`REASONS`].
    pub dropped: [u64; 4],
    /// Ends reported `duplicate`.
    pub duplicates: u64,
    /// Ends reported `failed`.
    pub failed: u64,
    /// Updates that were not redelivered and ended more than once.
    pub ended_twice: u64,
    /// Updates delivered again because the replica that had them died.
    pub redelivered: u64,
    /// Redelivered updates that ended more than once.
    pub redelivered_ended_twice: u64,
    /// Redeliveries answered `duplicate` early and sent again.
    pub retries: u64,
    /// Updates that ended at least once.
    pub ended: usize,
    /// First deliveries.
    pub delivered: usize,
    /// `handled` lines taken from part files that the platform never heard of.
    pub recovered: u64,
    /// Handler runs that part files show and whose replica reported the update as
    /// ending otherwise (dropped: mostly `lost`).
    pub ran_then_dropped: u64,
}

/// A drop, as the platform saw it.
#[derive(Debug, Clone)]
pub struct DropSeen {
    /// The update's `update_id`.
    pub update_id: i64,
    /// botmesh's reason.
    pub reason: &'static str,
    /// The replica that reported it; `None` when no replica could take the update.
    pub replica: Option<String>,
    /// The update's latest delivery, from the start of the run.
    pub sent: Duration,
    /// When the platform heard of the drop, from the start of the run.
    pub at: Duration,
    /// Whether the update had been redelivered.
    pub redelivered: bool,
}

/// An update that ended nowhere, or only as `duplicate` with no `handled` line
/// anywhere.
#[derive(Debug, Clone)]
pub struct Silent {
    /// The update's `update_id`.
    pub update_id: i64,
    /// The chat id.
    pub chat: String,
    /// `never_ended` or `duplicate_only`.
    pub how: &'static str,
    /// The replica its latest delivery went to.
    pub sent_to: Option<String>,
    /// Whether it had been redelivered.
    pub redelivered: bool,
}

/// Everything a finished run leaves for its summary.
pub struct Finished {
    /// The trace, with every round a director added.
    pub trace: Trace,
    /// From the first delivery until every update ended.
    pub wall: Duration,
    /// What the platform counted.
    pub counts: Counts,
    /// Order, overlap and fencing violations over every handler run.
    pub order: u64,
    /// See `order`.
    pub overlap: u64,
    /// See `order`.
    pub fence: u64,
    /// Examples of the violations, one line each.
    pub violations: Vec<String>,
    /// Every violation: its kind (`order`, `overlap`, `fence`) and the start of the run
    /// that broke the rule, µs since the Unix epoch.
    pub violations_at: Vec<(&'static str, u64)>,
    /// Waits for the turn of the reported handler runs, ns, sorted.
    pub waits: Vec<u64>,
    /// Every drop.
    pub drops: Vec<DropSeen>,
    /// Every silent loss.
    pub silent: Vec<Silent>,
    /// Redelivered updates handled in the end.
    pub redelivered_handled: u64,
    /// Grants whose previous holder was another replica (replicas that stopped cleanly).
    pub handovers: u64,
    /// Anything unusual.
    pub notes: Vec<String>,
    /// Whether the run stalled.
    pub stalled: bool,
    /// Updates that took longer than `turn_wait` + 5 s from their latest delivery to
    /// their first end (a bounded wait that was not bounded).
    pub late: u64,
    /// The longest time from a latest delivery to an end.
    pub slowest: Duration,
    /// The updates of one round of the input.
    pub round_len: usize,
    /// Replica processes started, replacements included.
    pub replicas_started: usize,
}

/// The faults of a run: called by the dispatcher on every turn of its loop.
pub trait Director {
    /// May act on the platform (kill, pause or start replicas, add rounds). Returns
    /// when it wants to be called next (it is called at least once a second anyway).
    fn tick(&mut self, p: &mut Dispatcher) -> Option<Instant>;

    /// Whether the run may end once every update ended.
    fn finished(&self) -> bool {
        true
    }
}

/// `--kill-replica-at F`: SIGKILLs one live replica once `after` updates were delivered
/// for the first time.
pub struct KillAt {
    after: Option<usize>,
    /// The replica it killed, and after how many first deliveries.
    pub killed: Option<(String, usize)>,
}

impl Director for KillAt {
    fn tick(&mut self, p: &mut Dispatcher) -> Option<Instant> {
        let after = self.after?;
        if self.killed.is_some() || p.delivered() < after {
            return None;
        }
        let live = p.live();
        if live.len() < 2 {
            return None;
        }
        let k = p.pick(&live);
        let delivered = p.delivered();
        match p.kill(k) {
            Ok(()) => {
                eprintln!(
                    "replay: SIGKILLed replica {} (pid {}) after {delivered} deliveries",
                    p.name(k),
                    p.pid(k).unwrap_or(0)
                );
                self.killed = Some((p.name(k), delivered));
            }
            Err(e) => {
                p.note(e);
                self.after = None;
            }
        }
        None
    }
}

/// The dispatcher: the platform's state, owned by one thread.
pub struct Dispatcher {
    o: Options,
    settings: RedisSettings,
    trace: Trace,
    /// The updates of the first round (the input as read).
    base_len: usize,
    /// Rounds of the input in the trace.
    rounds: i64,
    pace: Pace,
    early_duplicates: EarlyDuplicates,
    replicas: Vec<Replica>,
    updates: Vec<Update>,
    chats: Vec<Chat>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    rng: StdRng,
    log: Option<Sender<LogMsg>>,
    runs: Vec<Run>,
    waits: Vec<u64>,
    counts: Counts,
    drops: Vec<DropSeen>,
    /// (update index, replica, handler start) of every reported handler run: what the
    /// part files are merged against.
    reported: HashSet<(usize, usize, u64)>,
    /// How each replica reported each update it ended: (update index, replica) → end.
    ended_by: HashMap<(usize, usize), &'static str>,
    start: Instant,
    events_tx: Sender<Event>,
    /// Where part files go: `<base>.<replica>.part`.
    part_base: PathBuf,
    notes: Vec<String>,
    /// Set once the replicas are asked to stop: exits are expected then.
    stopping: bool,
    late_after: Duration,
    late: u64,
    slowest: Duration,
}

/// Runs the replay over replica processes (the replay example's `--processes`).
///
/// # Errors
/// A message when the input, the log or the replica processes cannot be used.
pub fn replay(o: &Options, settings: &RedisSettings) -> Result<Summary, String> {
    let trace = common::load_trace(o)?;
    let pace = match common::due_times(&trace, o)? {
        Some(times) => Pace::Times(times),
        None => Pace::Asap,
    };
    let total = trace.entries.len();
    let mut director = KillAt {
        after: o
            .kill_replica_at
            .map(|f| ((f * total as f64).ceil() as usize).min(total)),
        killed: None,
    };
    let f = run(
        o,
        settings,
        trace,
        (pace, EarlyDuplicates::Retry),
        &mut director,
    )?;
    let mut notes = f.notes;
    // A few examples of each kind of violation, so a run that is not clean says
    // which runs broke which rule.
    for v in &f.violations {
        eprintln!("replay: {v}");
    }
    if !f.silent.is_empty() {
        notes.push(format!(
            "{} update(s) lost silently (never ended, or answered duplicate with no handled line anywhere), e.g. update_id {}",
            f.silent.len(),
            f.silent.first().map_or(0, |s| s.update_id)
        ));
    }
    let total = f.trace.entries.len();
    Ok(Summary {
        dropped: f.counts.dropped,
        duplicates: f.counts.duplicates,
        failed: f.counts.failed,
        order_violations: f.order,
        overlap_violations: f.overlap,
        token_violations: f.fence,
        ended_twice: f.counts.ended_twice,
        handovers: f.handovers,
        notes: notes.join("; "),
        redis: Some(RedisFacts {
            mode: "processes",
            servers: settings.describe(),
            key_prefix: settings.key_prefix.clone(),
            lease_ttl_ms: settings.lease_ttl.as_millis(),
            kill_replica_at: o.kill_replica_at,
            killed: director.killed,
            redelivered: f.counts.redelivered,
            redelivered_handled: f.redelivered_handled,
            redelivery_retries: f.counts.retries,
            redelivered_ended_twice: f.counts.redelivered_ended_twice,
            recovered: f.counts.recovered,
            silent_losses: f.silent.len() as u64,
            cost: None,
        }),
        ..Summary::base(o, &f.trace, total, f.wall, f.counts.handled, &f.waits)
    })
}

/// Where the part files of a run go when there is no log to put them beside.
fn temporary_part_base() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("botmesh-replay-{}-{nanos}", std::process::id()))
}

/// Runs `trace` through `o.replicas` replica processes, with `director` injecting
/// faults, until every update ended (and the director is finished), then stops the
/// replicas, merges their part files and checks the handler runs.
///
/// # Errors
/// A message when the log or the replica processes cannot be used.
pub fn run(
    o: &Options,
    settings: &RedisSettings,
    trace: Trace,
    (pace, early_duplicates): (Pace, EarlyDuplicates),
    director: &mut dyn Director,
) -> Result<Finished, String> {
    let log = match &o.log {
        Some(path) => Some(LogWriter::start_records(path)?),
        None => None,
    };
    let part_base = o.log.clone().unwrap_or_else(temporary_part_base);

    let (events_tx, events_rx) = crossbeam_channel::unbounded::<Event>();
    let mut replicas = Vec::with_capacity(o.replicas);
    for k in 0..o.replicas {
        let name = format!("r{}", k + 1);
        let part = parts::path_for(&part_base, &name);
        match procs::spawn(o, settings, k, &name, &part, &events_tx) {
            Ok(r) => replicas.push(r),
            Err(e) => {
                procs::stop_all(&mut replicas);
                return Err(e);
            }
        }
    }
    if let Err(e) = procs::await_ready(&mut replicas, &events_rx) {
        procs::stop_all(&mut replicas);
        return Err(e);
    }

    let mut chats: Vec<Chat> = trace.chats.iter().map(|_| Chat::default()).collect();
    for (index, entry) in trace.entries.iter().enumerate() {
        if let Some(chat) = chats.get_mut(entry.chat) {
            chat.updates.push(index);
        }
    }
    let longest_work = trace
        .entries
        .iter()
        .map(|e| common::work_of(e.update_id, o.seed, o.handler_ms, o.handler_jitter_ms))
        .max()
        .unwrap_or_default();
    let stall_limit = o
        .turn_wait
        .saturating_add(longest_work)
        .saturating_add(settings.lease_ttl)
        .saturating_add(Duration::from_secs(30));
    let mut d = Dispatcher {
        o: o.clone(),
        settings: settings.clone(),
        base_len: trace.entries.len(),
        rounds: 1,
        updates: trace.entries.iter().map(|_| Update::default()).collect(),
        trace,
        pace,
        early_duplicates,
        replicas,
        chats,
        timers: BinaryHeap::new(),
        rng: StdRng::seed_from_u64(o.seed),
        log: log.as_ref().map(LogWriter::sender),
        runs: Vec::new(),
        waits: Vec::new(),
        counts: Counts::default(),
        drops: Vec::new(),
        reported: HashSet::new(),
        ended_by: HashMap::new(),
        start: Instant::now(),
        events_tx,
        part_base,
        notes: Vec::new(),
        stopping: false,
        late_after: o.turn_wait.saturating_add(Duration::from_secs(5)),
        late: 0,
        slowest: Duration::ZERO,
    };

    d.start = Instant::now();
    director.tick(&mut d);
    for chat in 0..d.chats.len() {
        d.send_next(chat);
    }
    d.flush();
    let finished = d.dispatch(&events_rx, stall_limit, director);
    let wall = d.start.elapsed();

    // Stop the replicas: closing stdin asks for a clean stop.
    d.stopping = true;
    for r in &mut d.replicas {
        r.feed = None;
    }
    d.drain_until_gone(
        &events_rx,
        if finished {
            STOP_WITHIN
        } else {
            Duration::ZERO
        },
    );
    for r in &mut d.replicas {
        if !r.gone {
            let _ = r.process.kill();
        }
        match r.process.wait() {
            Ok(status) if !status.success() && !r.killed => {
                let note = format!("replica {} exited with {status}", r.name);
                d.notes.push(note);
            }
            Ok(_) => {}
            Err(e) => {
                let note = format!("cannot wait for replica {}: {e}", r.name);
                d.notes.push(note);
            }
        }
        for t in r.threads.drain(..) {
            if t.join().is_err() {
                let note = format!("a thread of replica {} panicked", r.name);
                d.notes.push(note);
            }
        }
    }
    d.merge_parts(o.log.is_none());
    let silent = d.silent_losses();
    drop(d.log.take());
    if let Some(log) = log
        && let Err(e) = log.finish()
    {
        d.notes.push(e);
    }

    let Dispatcher {
        trace,
        replicas,
        notes,
        runs,
        mut waits,
        counts,
        drops,
        updates,
        late,
        slowest,
        base_len,
        ..
    } = d;
    let names: Vec<String> = replicas.iter().map(|r| r.name.clone()).collect();
    let checked = verdict::check(runs, &names, &trace.chats);
    waits.sort_unstable();
    let redelivered_handled = updates
        .iter()
        .filter(|u| u.redelivered && u.handled)
        .count() as u64;
    Ok(Finished {
        trace,
        wall,
        counts,
        order: checked.order,
        overlap: checked.overlap,
        fence: checked.fence,
        violations: checked.examples,
        violations_at: checked.at,
        waits,
        drops,
        silent,
        redelivered_handled,
        handovers: replicas.iter().filter_map(|r| r.handovers).sum(),
        notes,
        stalled: !finished,
        late,
        slowest,
        round_len: base_len,
        replicas_started: replicas.len(),
    })
}

impl Dispatcher {
    /// Handles events and timers until every update ended and the director is
    /// finished. Returns `false` when the run stalled or every replica died.
    fn dispatch(
        &mut self,
        events: &Receiver<Event>,
        stall_limit: Duration,
        director: &mut dyn Director,
    ) -> bool {
        let mut last_tick = (Instant::now(), 0usize);
        let mut last_change = Instant::now();
        let mut director_at: Option<Instant> = None;
        while self.counts.ended < self.updates.len() || !director.finished() {
            let now = Instant::now();
            let next_tick = last_tick.0 + Duration::from_secs(1);
            let mut wake = next_tick;
            if let Some(Reverse((at, _))) = self.timers.peek() {
                wake = wake.min(*at);
            }
            if let Some(at) = director_at {
                wake = wake.min(at);
            }
            match events.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(event) => {
                    self.on(event);
                    last_change = Instant::now();
                    // Take what else is queued before looking at the clock again.
                    while let Ok(event) = events.try_recv() {
                        self.on(event);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.notes.push("every replica process is gone".to_owned());
                    return false;
                }
            }
            let now = Instant::now();
            while let Some(Reverse((at, _))) = self.timers.peek()
                && *at <= now
            {
                if let Some(Reverse((_, timer))) = self.timers.pop() {
                    match timer {
                        Timer::Due(chat) => {
                            if let Some(c) = self.chats.get_mut(chat) {
                                c.timer = false;
                            }
                            self.send_next(chat);
                        }
                        Timer::Retry(index) => self.deliver(index),
                    }
                    last_change = now;
                }
            }
            director_at = director.tick(self);
            self.flush();
            if now >= next_tick {
                let ended = self.counts.ended;
                let rate = ended.saturating_sub(last_tick.1) as f64
                    / now.duration_since(last_tick.0).as_secs_f64();
                let in_flight: usize = self.replicas.iter().map(|r| r.holding.len()).sum();
                let live = self.replicas.iter().filter(|r| r.live).count();
                eprintln!(
                    "replay: {:7.1} s  {ended}/{} ended  {rate:8.0} msg/s  in flight {in_flight}  live replicas {live}  redelivered {}",
                    now.duration_since(self.start).as_secs_f64(),
                    self.updates.len(),
                    self.counts.redelivered,
                );
                last_tick = (now, ended);
            }
            if !self.timers.is_empty() || !director.finished() {
                // Waiting for an update's time, a retry, or a fault to run its course
                // is no stall.
                last_change = now;
            }
            if now.duration_since(last_change) > stall_limit {
                let in_flight: usize = self.replicas.iter().map(|r| r.holding.len()).sum();
                self.notes.push(format!(
                    "stalled: nothing happened for {} s; {} of {} ended, {in_flight} accepted but not ended",
                    stall_limit.as_secs(),
                    self.counts.ended,
                    self.updates.len()
                ));
                return false;
            }
        }
        true
    }

    /// After the replicas were asked to stop: reads their last answers until every
    /// stdout ended, or `within` passed.
    fn drain_until_gone(&mut self, events: &Receiver<Event>, within: Duration) {
        let deadline = Instant::now() + within;
        while self.replicas.iter().any(|r| !r.gone) {
            let left = deadline.saturating_duration_since(Instant::now());
            match events.recv_timeout(left) {
                Ok(event) => self.on(event),
                Err(_) => {
                    if !within.is_zero() {
                        self.notes.push(format!(
                            "replicas did not stop within {} s and were killed",
                            within.as_secs()
                        ));
                    }
                    return;
                }
            }
        }
    }
}

/// botmesh's drop reasons as the static strings the log and the counts use.
fn static_reason(reason: &str) -> &'static str {
    REASONS
        .iter()
        .find(|r| **r == reason)
        .copied()
        .unwrap_or("unknown")
}
