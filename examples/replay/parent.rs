//! The platform in front of replica processes (`--processes`).
//!
//! The parent starts `--replicas` copies of this example as replica processes (hidden
//! flag `--child-replica rK`) and talks to each over its stdin/stdout with the line
//! protocol of [`crate::protocol`]. One thread, the dispatcher, owns every decision;
//! per replica one thread feeds its stdin and one reads its stdout into the
//! dispatcher's queue.
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
//!   short pause, and only a later `duplicate` is final (the dead replica had handled it).
//! - **Faults.** `--kill-replica-at F` SIGKILLs one live replica (drawn from the same
//!   generator) once `F` of the updates were delivered for the first time.
//!
//! The parent checks across processes, from the `ended` answers: every update ended
//! exactly once (at least once when redelivered), a chat's handlers started in
//! `message_id` order (redelivered ones skipped), never overlapped (by their start and
//! end on the system clock), and carried fencing tokens that never went backwards and
//! rose whenever the replica changed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::args::{Options, REDIS_URL_ENV};
use crate::backend::RedisSettings;
use crate::data::Trace;
use crate::protocol::{Ended, FromReplica, ToReplica};
use crate::report::{Ending, LogMsg, LogWriter, REASONS, RedisFacts, Summary};

/// How long a replica process may take to connect and say `ready`.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long the replicas may take to stop once every update ended.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// What the reader threads tell the dispatcher.
enum Event {
    /// Lines from replica `.0`, as many as had arrived (each one, or why it is not part
    /// of the protocol).
    Lines(usize, Vec<Result<FromReplica, String>>),
    /// Replica `.0`'s stdout ended: it exited or died.
    Gone(usize),
}

/// One replica process as the dispatcher sees it.
struct Replica {
    name: String,
    process: Child,
    /// The feed of its stdin; `None` once closed.
    feed: Option<Sender<Vec<u8>>>,
    /// Lines for its stdin not yet handed to the feed (sent once per batch of events).
    outgoing: Vec<u8>,
    threads: Vec<JoinHandle<()>>,
    /// May get deliveries (not killed, not gone).
    live: bool,
    /// Its stdout ended.
    gone: bool,
    /// Killed on purpose (`--kill-replica-at`).
    killed: bool,
    /// Updates delivered to it that have not ended (nor been refused).
    holding: HashSet<usize>,
    /// Its `stopped` answer: handovers.
    handovers: Option<u64>,
}

/// One update as the dispatcher tracks it.
#[derive(Default)]
struct Update {
    /// The replica its latest delivery went to.
    sent_to: Option<usize>,
    /// How many times it ended.
    ends: u32,
    /// Delivered again after a replica died with it.
    redelivered: bool,
    /// Until when a `duplicate` answer may still be the dead replica's live claim.
    retry_until: Option<Instant>,
    /// Whether one of its ends was `handled`.
    handled: bool,
}

/// One chat: its updates in file order, and the one whose answer it waits for.
#[derive(Default)]
struct Chat {
    updates: Vec<usize>,
    next: usize,
    awaiting: Option<usize>,
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
}

/// Timed work of the dispatcher.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// A chat's next update reaches its original time (`--speed`).
    Due(usize),
    /// A redelivery answered `duplicate` is tried again.
    Retry(usize),
}

#[derive(Default)]
struct Counts {
    handled: u64,
    dropped: [u64; 4],
    duplicates: u64,
    failed: u64,
    ended_twice: u64,
    redelivered: u64,
    redelivered_ended_twice: u64,
    retries: u64,
    /// Updates that ended at least once.
    ended: usize,
    /// First deliveries.
    delivered: usize,
}

struct Dispatcher<'a> {
    trace: &'a Trace,
    due: Option<Vec<Duration>>,
    replicas: Vec<Replica>,
    updates: Vec<Update>,
    chats: Vec<Chat>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    rng: StdRng,
    log: Option<Sender<LogMsg>>,
    runs: Vec<Run>,
    waits: Vec<u64>,
    counts: Counts,
    start: Instant,
    lease_ttl: Duration,
    kill_after: Option<usize>,
    killed: Option<(String, usize)>,
    notes: Vec<String>,
    /// Set once the replicas are asked to stop: exits are expected then.
    stopping: bool,
}

/// Runs the replay over replica processes.
///
/// # Errors
/// A message when the input, the log or the replica processes cannot be used.
pub fn replay(o: &Options, settings: &RedisSettings) -> Result<Summary, String> {
    let trace = Arc::new(crate::load_trace(o)?);
    let due = crate::plan(&trace, o)?.due;
    let names: Arc<[String]> = (1..=o.replicas).map(|i| format!("r{i}")).collect();
    let log = match &o.log {
        Some(path) => Some(LogWriter::start(path, trace.clone(), names.clone())?),
        None => None,
    };

    let (events_tx, events_rx) = crossbeam_channel::unbounded::<Event>();
    let mut replicas = Vec::with_capacity(o.replicas);
    for (k, name) in names.iter().enumerate() {
        match spawn(o, settings, k, name, &events_tx) {
            Ok(r) => replicas.push(r),
            Err(e) => {
                stop_all(&mut replicas);
                return Err(e);
            }
        }
    }
    drop(events_tx);
    if let Err(e) = await_ready(&mut replicas, &events_rx) {
        stop_all(&mut replicas);
        return Err(e);
    }

    let total = trace.entries.len();
    let mut chats: Vec<Chat> = trace.chats.iter().map(|_| Chat::default()).collect();
    for (index, entry) in trace.entries.iter().enumerate() {
        if let Some(chat) = chats.get_mut(entry.chat) {
            chat.updates.push(index);
        }
    }
    let kill_after = o
        .kill_replica_at
        .map(|f| ((f * total as f64).ceil() as usize).min(total));
    let mut d = Dispatcher {
        trace: &trace,
        due,
        replicas,
        updates: trace.entries.iter().map(|_| Update::default()).collect(),
        chats,
        timers: BinaryHeap::new(),
        rng: StdRng::seed_from_u64(o.seed),
        log: log.as_ref().map(LogWriter::sender),
        runs: Vec::with_capacity(total),
        waits: Vec::with_capacity(total),
        counts: Counts::default(),
        start: Instant::now(),
        lease_ttl: settings.lease_ttl,
        kill_after,
        killed: None,
        notes: Vec::new(),
        stopping: false,
    };

    d.start = Instant::now();
    d.maybe_kill();
    for chat in 0..d.chats.len() {
        d.send_next(chat);
    }
    d.flush();
    let longest_work = (0..total)
        .filter_map(|i| trace.entries.get(i))
        .map(|e| crate::work_of(e.update_id, o.seed, o.handler_ms, o.handler_jitter_ms))
        .max()
        .unwrap_or_default();
    let stall_limit = o
        .turn_wait
        .saturating_add(longest_work)
        .saturating_add(settings.lease_ttl)
        .saturating_add(Duration::from_secs(30));
    let finished = d.dispatch(&events_rx, stall_limit);
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
    let Dispatcher {
        mut replicas,
        mut notes,
        runs,
        mut waits,
        counts,
        killed,
        updates,
        ..
    } = d;
    for r in &mut replicas {
        if !r.gone {
            let _ = r.process.kill();
        }
        match r.process.wait() {
            Ok(status) if !status.success() && !r.killed => {
                notes.push(format!("replica {} exited with {status}", r.name));
            }
            Ok(_) => {}
            Err(e) => notes.push(format!("cannot wait for replica {}: {e}", r.name)),
        }
        for t in r.threads.drain(..) {
            if t.join().is_err() {
                notes.push(format!("a thread of replica {} panicked", r.name));
            }
        }
    }
    if let Some(log) = log
        && let Err(e) = log.finish()
    {
        notes.push(e);
    }

    let (order, overlap, fence) = check(runs);
    waits.sort_unstable();
    let redelivered_handled = updates
        .iter()
        .filter(|u| u.redelivered && u.handled)
        .count() as u64;
    Ok(Summary {
        dropped: counts.dropped,
        duplicates: counts.duplicates,
        failed: counts.failed,
        order_violations: order,
        overlap_violations: overlap,
        token_violations: fence,
        ended_twice: counts.ended_twice,
        handovers: replicas.iter().filter_map(|r| r.handovers).sum(),
        notes: notes.join("; "),
        redis: Some(RedisFacts {
            mode: "processes",
            key_prefix: settings.key_prefix.clone(),
            lease_ttl_ms: settings.lease_ttl.as_millis(),
            kill_replica_at: o.kill_replica_at,
            killed,
            redelivered: counts.redelivered,
            redelivered_handled,
            redelivery_retries: counts.retries,
            redelivered_ended_twice: counts.redelivered_ended_twice,
        }),
        ..Summary::base(o, &trace, total, wall, counts.handled, &waits)
    })
}

/// Starts replica process `k` and its two threads.
fn spawn(
    o: &Options,
    settings: &RedisSettings,
    k: usize,
    name: &str,
    events: &Sender<Event>,
) -> Result<Replica, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this program to start replica {name}: {e}"))?;
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let mut command = Command::new(exe);
    command
        .arg("--child-replica")
        .arg(name)
        .args(["--backend", "redis"])
        .args(["--key-prefix", &settings.key_prefix])
        .args(["--lease-ttl", &ms(settings.lease_ttl)])
        .args(["--workers", &o.workers.to_string()])
        .args(["--senders", &o.senders.to_string()])
        .args(["--turn-wait", &ms(o.turn_wait)])
        .args(["--seed", &o.seed.to_string()])
        .args(["--handler-ms", &o.handler_ms.to_string()])
        .args(["--handler-jitter-ms", &o.handler_jitter_ms.to_string()])
        // The URL goes through the environment: it may hold a password, and the
        // process list shows arguments to every user.
        .env(REDIS_URL_ENV, &settings.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut process = command
        .spawn()
        .map_err(|e| format!("cannot start replica {name}: {e}"))?;
    let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
        let _ = process.kill();
        let _ = process.wait();
        return Err(format!("replica {name} has no stdin or stdout pipe"));
    };
    let (feed_tx, feed_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
    let mut threads = Vec::with_capacity(2);
    let spawned = std::thread::Builder::new()
        .name(format!("replay-feed-{name}"))
        .spawn(move || feed(&feed_rx, stdin))
        .and_then(|t| {
            threads.push(t);
            let events = events.clone();
            std::thread::Builder::new()
                .name(format!("replay-read-{name}"))
                .spawn(move || read(k, stdout, &events))
        });
    match spawned {
        Ok(t) => threads.push(t),
        Err(e) => {
            let _ = process.kill();
            let _ = process.wait();
            return Err(format!("cannot start a thread for replica {name}: {e}"));
        }
    }
    Ok(Replica {
        name: name.to_owned(),
        process,
        feed: Some(feed_tx),
        outgoing: Vec::new(),
        threads,
        live: true,
        gone: false,
        killed: false,
        holding: HashSet::new(),
        handovers: None,
    })
}

/// Feeds one replica's stdin: writes the batches of lines the dispatcher hands over.
/// Ends (closing stdin) when the dispatcher drops the feed, or the replica is gone.
/// A separate thread, so that the dispatcher never blocks on a full pipe (which could
/// deadlock with a replica blocked on its own full stdout).
fn feed(rx: &Receiver<Vec<u8>>, mut stdin: ChildStdin) {
    while let Ok(batch) = rx.recv() {
        if stdin.write_all(&batch).is_err() {
            return;
        }
    }
}

/// Reads one replica's stdout into the dispatcher's queue, as many lines per event as
/// have arrived, then says it is gone. A last line without its newline (torn by a
/// SIGKILL) is dropped.
fn read(k: usize, stdout: ChildStdout, events: &Sender<Event>) {
    let mut reader = BufReader::with_capacity(1 << 16, stdout);
    let mut line = String::new();
    let mut batch = Vec::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if !line.ends_with('\n') => break,
            Ok(_) => {}
        }
        batch.push(
            serde_json::from_str::<FromReplica>(&line)
                .map_err(|e| format!("{e}: {}", line.trim_end())),
        );
        // Hand the batch over before the next read could block.
        if reader.buffer().is_empty()
            && events
                .send(Event::Lines(k, std::mem::take(&mut batch)))
                .is_err()
        {
            return;
        }
    }
    if !batch.is_empty() {
        let _ = events.send(Event::Lines(k, batch));
    }
    let _ = events.send(Event::Gone(k));
}

/// Waits until every replica said `ready`.
fn await_ready(replicas: &mut [Replica], events: &Receiver<Event>) -> Result<(), String> {
    let deadline = Instant::now() + READY_WITHIN;
    let mut ready = vec![false; replicas.len()];
    while ready.iter().any(|r| !r) {
        let left = deadline.saturating_duration_since(Instant::now());
        let name = |k: usize| replicas.get(k).map_or("?", |r| r.name.as_str()).to_owned();
        match events.recv_timeout(left) {
            Ok(Event::Lines(k, lines)) => {
                for line in lines {
                    match line {
                        Ok(FromReplica::Ready { .. }) => {
                            if let Some(r) = ready.get_mut(k) {
                                *r = true;
                            }
                        }
                        Ok(other) => {
                            return Err(format!(
                                "replica {} answered {other:?} before it was ready",
                                name(k)
                            ));
                        }
                        Err(line) => {
                            return Err(format!(
                                "replica {} wrote an unknown line: {line}",
                                name(k)
                            ));
                        }
                    }
                }
            }
            Ok(Event::Gone(k)) => {
                let shown = name(k);
                if let Some(r) = replicas.get_mut(k) {
                    r.gone = true;
                }
                return Err(format!(
                    "replica {shown} exited before it was ready (its error is above)"
                ));
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "the replica processes were not ready within {} s",
                    READY_WITHIN.as_secs()
                ));
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err("every replica process is gone".to_owned());
            }
        }
    }
    Ok(())
}

/// Kills and reaps every replica (after a failed start).
fn stop_all(replicas: &mut [Replica]) {
    for r in replicas {
        r.feed = None;
        let _ = r.process.kill();
        let _ = r.process.wait();
    }
}

impl Dispatcher<'_> {
    /// Handles events and timers until every update ended. Returns `false` when the
    /// run stalled or every replica died.
    fn dispatch(&mut self, events: &Receiver<Event>, stall_limit: Duration) -> bool {
        let total = self.updates.len();
        let mut last_tick = (Instant::now(), 0usize);
        let mut last_change = Instant::now();
        while self.counts.ended < total {
            let now = Instant::now();
            let next_tick = last_tick.0 + Duration::from_secs(1);
            let mut wake = next_tick;
            if let Some(Reverse((at, _))) = self.timers.peek() {
                wake = wake.min(*at);
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
                        Timer::Due(chat) => self.send_next(chat),
                        Timer::Retry(index) => self.deliver(index),
                    }
                    last_change = now;
                }
            }
            self.flush();
            if now >= next_tick {
                let ended = self.counts.ended;
                let rate = ended.saturating_sub(last_tick.1) as f64
                    / now.duration_since(last_tick.0).as_secs_f64();
                let in_flight: usize = self.replicas.iter().map(|r| r.holding.len()).sum();
                let live = self.replicas.iter().filter(|r| r.live).count();
                eprintln!(
                    "replay: {:7.1} s  {ended}/{total} ended  {rate:8.0} msg/s  in flight {in_flight}  live replicas {live}  redelivered {}",
                    now.duration_since(self.start).as_secs_f64(),
                    self.counts.redelivered,
                );
                last_tick = (now, ended);
            }
            if !self.timers.is_empty() {
                // Waiting for an update's original time, or to retry one, is no stall.
                last_change = now;
            }
            if now.duration_since(last_change) > stall_limit {
                let in_flight: usize = self.replicas.iter().map(|r| r.holding.len()).sum();
                self.notes.push(format!(
                    "stalled: nothing happened for {} s; {} of {total} ended, {in_flight} accepted but not ended",
                    stall_limit.as_secs(),
                    self.counts.ended
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

    fn name(&self, k: usize) -> String {
        self.replicas
            .get(k)
            .map_or_else(|| format!("#{k}"), |r| r.name.clone())
    }

    fn on(&mut self, event: Event) {
        match event {
            Event::Lines(k, lines) => {
                for line in lines {
                    match line {
                        Ok(msg) => self.on_line(k, msg),
                        Err(line) => {
                            let note =
                                format!("replica {} wrote an unknown line: {line}", self.name(k));
                            if self.notes.len() < 10 {
                                self.notes.push(note);
                            }
                        }
                    }
                }
            }
            Event::Gone(k) => self.on_gone(k),
        }
    }

    /// Hands each replica's lines of this round to its feed, in one piece.
    fn flush(&mut self) {
        for r in &mut self.replicas {
            if r.outgoing.is_empty() {
                continue;
            }
            let batch = std::mem::take(&mut r.outgoing);
            if let Some(feed) = &r.feed {
                // Fails only when the replica is gone; its `Gone` event redelivers.
                let _ = feed.send(batch);
            }
        }
    }

    fn on_line(&mut self, k: usize, msg: FromReplica) {
        match msg {
            FromReplica::Ready { .. } => {}
            FromReplica::Accepted { index } | FromReplica::Duplicate { index } => {
                self.answered(k, index);
            }
            FromReplica::Refused { index, reason } => {
                if let Some(r) = self.replicas.get_mut(k) {
                    r.holding.remove(&index);
                }
                let reason = static_reason(&reason);
                self.end(index, Ending::Dropped(reason));
                self.answered(k, index);
            }
            FromReplica::Ended { index, how } => self.on_ended(k, index, how),
            FromReplica::Stopped { handovers } => {
                if let Some(r) = self.replicas.get_mut(k) {
                    r.handovers = Some(handovers);
                }
            }
        }
    }

    /// Replica `k` answered the delivery of `index`: the chat's next update may go.
    fn answered(&mut self, k: usize, index: usize) {
        let Some(update) = self.updates.get(index) else {
            return;
        };
        if update.sent_to != Some(k) {
            return; // an answer to an earlier delivery of a redelivered update
        }
        let Some(chat) = self.trace.entries.get(index).map(|e| e.chat) else {
            return;
        };
        if let Some(c) = self.chats.get_mut(chat)
            && c.awaiting == Some(index)
        {
            c.awaiting = None;
            self.send_next(chat);
        }
    }

    fn on_ended(&mut self, k: usize, index: usize, how: Ended) {
        if let Some(r) = self.replicas.get_mut(k) {
            r.holding.remove(&index);
        }
        let now = Instant::now();
        let Some(update) = self.updates.get(index) else {
            return;
        };
        if matches!(how, Ended::Duplicate)
            && update.ends == 0
            && update.retry_until.is_some_and(|until| now < until)
        {
            // Most likely the dead replica's claim, still live: try again shortly.
            let pause =
                (self.lease_ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
            self.counts.retries += 1;
            self.timers
                .push(Reverse((now + pause, Timer::Retry(index))));
            return;
        }
        let ending = match how {
            Ended::Handled {
                replica: _,
                fence,
                start_us,
                end_us,
                waited_ns,
            } => {
                if let Some(entry) = self.trace.entries.get(index) {
                    self.runs.push(Run {
                        chat: entry.chat,
                        message_id: entry.message_id,
                        replica: k,
                        fence,
                        start_us,
                        end_us,
                        redelivered: update.redelivered,
                    });
                }
                self.waits.push(waited_ns);
                Ending::Handled {
                    replica: k,
                    fence,
                    start_us,
                    end_us,
                }
            }
            Ended::Dropped { reason } => Ending::Dropped(static_reason(&reason)),
            Ended::Duplicate => Ending::Duplicate,
            Ended::Failed { error } => Ending::Failed(error),
        };
        self.end(index, ending);
    }

    /// Records that `index` ended.
    fn end(&mut self, index: usize, ending: Ending) {
        let Some(update) = self.updates.get_mut(index) else {
            return;
        };
        let c = &mut self.counts;
        match &ending {
            Ending::Handled { .. } => {
                c.handled += 1;
                update.handled = true;
            }
            Ending::Dropped(reason) => {
                let i = REASONS
                    .iter()
                    .position(|r| r == reason)
                    .unwrap_or(REASONS.len() - 1);
                if let Some(n) = c.dropped.get_mut(i) {
                    *n += 1;
                }
            }
            Ending::Duplicate => c.duplicates += 1,
            Ending::Failed(_) => c.failed += 1,
        }
        update.ends += 1;
        if update.ends == 1 {
            c.ended += 1;
        } else if update.redelivered {
            c.redelivered_ended_twice += 1;
        } else {
            c.ended_twice += 1;
        }
        if let Some(log) = &self.log {
            let _ = log.send(LogMsg::Ended {
                index,
                ending,
                redelivered: update.redelivered,
            });
        }
    }

    /// Replica `k`'s stdout ended: every update it held goes to another replica.
    fn on_gone(&mut self, k: usize) {
        let now = Instant::now();
        let (held, expected) = match self.replicas.get_mut(k) {
            Some(r) => {
                r.gone = true;
                r.live = false;
                r.feed = None;
                r.outgoing.clear();
                let mut held: Vec<usize> = r.holding.drain().collect();
                held.sort_unstable();
                (held, r.killed || self.stopping)
            }
            None => return,
        };
        if !expected {
            self.notes
                .push(format!("replica {} exited unexpectedly", self.name(k)));
        }
        if self.stopping {
            // After a clean run nothing is held here; after a stall, the stuck updates
            // are already counted in the stall note.
            return;
        }
        // Its claims and leases lapse at most one TTL after its last renewal.
        let until = now + self.lease_ttl + Duration::from_secs(1);
        for index in held {
            if let Some(update) = self.updates.get_mut(index) {
                if !update.redelivered {
                    self.counts.redelivered += 1;
                }
                update.redelivered = true;
                update.retry_until = Some(until);
            }
            self.deliver(index);
        }
    }

    /// Sends the chat's next update, unless it waits for an answer or its time.
    fn send_next(&mut self, chat: usize) {
        let Some(c) = self.chats.get(chat) else {
            return;
        };
        if c.awaiting.is_some() {
            return;
        }
        let Some(&index) = c.updates.get(c.next) else {
            return;
        };
        if let Some(at) = self
            .due
            .as_ref()
            .and_then(|due| due.get(index))
            .and_then(|d| self.start.checked_add(*d))
            && at > Instant::now()
        {
            // At most one such timer per chat: nothing else sends while it waits.
            self.timers.push(Reverse((at, Timer::Due(chat))));
            return;
        }
        if let Some(c) = self.chats.get_mut(chat) {
            c.next += 1;
            c.awaiting = Some(index);
        }
        self.counts.delivered += 1;
        self.deliver(index);
        self.maybe_kill();
    }

    /// Sends update `index` to a live replica drawn at random.
    fn deliver(&mut self, index: usize) {
        let live: Vec<usize> = (0..self.replicas.len())
            .filter(|&k| self.replicas.get(k).is_some_and(|r| r.live))
            .collect();
        if live.is_empty() {
            if !self.notes.iter().any(|n| n.starts_with("no live replica")) {
                self.notes
                    .push("no live replica left; the remaining updates were dropped".to_owned());
            }
            self.end(index, Ending::Dropped("backend"));
            if let Some(chat) = self.trace.entries.get(index).map(|e| e.chat)
                && let Some(c) = self.chats.get_mut(chat)
                && c.awaiting == Some(index)
            {
                // The chat's next update goes on the next turn of the loop (not by
                // recursion, which a long chat would run deep).
                c.awaiting = None;
                self.timers
                    .push(Reverse((Instant::now(), Timer::Due(chat))));
            }
            return;
        }
        let k = live
            .get(self.rng.gen_range(0..live.len()))
            .copied()
            .unwrap_or(0);
        let Some(entry) = self.trace.entries.get(index) else {
            return;
        };
        let line = serde_json::to_vec(&ToReplica::Deliver {
            index,
            update_id: entry.update_id,
            chat: self
                .trace
                .chats
                .get(entry.chat)
                .cloned()
                .unwrap_or_default(),
            message_id: entry.message_id,
            text: entry.text.clone(),
            date: entry.date,
        });
        let Ok(line) = line else {
            self.end(
                index,
                Ending::Failed("cannot encode the delivery".to_owned()),
            );
            return;
        };
        if let Some(update) = self.updates.get_mut(index) {
            update.sent_to = Some(k);
        }
        if let Some(r) = self.replicas.get_mut(k) {
            r.holding.insert(index);
            r.outgoing.extend_from_slice(&line);
            r.outgoing.push(b'\n');
        }
    }

    /// SIGKILLs one live replica once enough updates were delivered.
    fn maybe_kill(&mut self) {
        let Some(after) = self.kill_after else {
            return;
        };
        if self.killed.is_some() || self.counts.delivered < after {
            return;
        }
        let live: Vec<usize> = (0..self.replicas.len())
            .filter(|&k| self.replicas.get(k).is_some_and(|r| r.live))
            .collect();
        if live.len() < 2 {
            return;
        }
        let k = live
            .get(self.rng.gen_range(0..live.len()))
            .copied()
            .unwrap_or(0);
        let delivered = self.counts.delivered;
        if let Some(r) = self.replicas.get_mut(k) {
            // `Child::kill` is SIGKILL on Unix: no clean stop, no release.
            match r.process.kill() {
                Ok(()) => {
                    r.live = false;
                    r.killed = true;
                    eprintln!(
                        "replay: SIGKILLed replica {} (pid {}) after {delivered} deliveries",
                        r.name,
                        r.process.id()
                    );
                    self.killed = Some((r.name.clone(), delivered));
                }
                Err(e) => {
                    let note = format!("cannot kill replica {}: {e}", r.name);
                    self.notes.push(note);
                    self.kill_after = None;
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

/// The cross-process checks over every handler run: (order, overlap, fencing)
/// violations.
fn check(mut runs: Vec<Run>) -> (u64, u64, u64) {
    runs.sort_unstable_by_key(|r| (r.chat, r.start_us, r.end_us));
    let (mut order, mut overlap, mut fence) = (0, 0, 0);
    let mut i = 0;
    while i < runs.len() {
        let chat = runs.get(i).map_or(0, |r| r.chat);
        let mut last_message: Option<i64> = None;
        let mut last_end: u64 = 0;
        let mut last_fence: Option<(u64, usize)> = None;
        while let Some(r) = runs.get(i).filter(|r| r.chat == chat) {
            if r.start_us < last_end {
                overlap += 1;
            }
            last_end = last_end.max(r.end_us);
            if !r.redelivered {
                if last_message.is_some_and(|m| r.message_id <= m) {
                    order += 1;
                }
                last_message = Some(r.message_id);
            }
            if let Some((token, replica)) = last_fence
                && (r.fence < token || (r.fence == token && r.replica != replica))
            {
                fence += 1;
            }
            last_fence = Some((r.fence, r.replica));
            i += 1;
        }
    }
    (order, overlap, fence)
}
