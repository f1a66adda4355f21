//! # replay: real chat traffic through N replicas
//!
//! The main job of botmesh, end to end. This example plays the messaging platform in
//! front of a bot that runs as several replicas, feeds it real conversations, and
//! checks the guarantees botmesh gives for each chat:
//!
//! - **one at a time**: no two handlers of one chat overlap, whichever replicas they
//!   run on;
//! - **in order**: a chat's handlers start in `message_id` order;
//! - **fenced**: a chat's fencing tokens never go backwards, and rise whenever the chat
//!   moves to another replica.
//!
//! ```text
//! cargo run --release --example replay                      # the bundled slice
//! cargo run --release --example replay -- --updates ../shared/data/chitchat/updates.jsonl
//! cargo run --release --example replay -- --handler-ms 2 --handler-jitter-ms 1
//! cargo run --release --example replay -- --speed 1000 --log replay.jsonl --json
//! cargo run --release --example replay -- --backend redis --redis-url redis://127.0.0.1:6379
//! cargo run --release --example replay -- --backend redis --redis-url redis://127.0.0.1:6379 \
//!     --processes --kill-replica-at 0.5 --log replay.jsonl
//! cargo run --release --example replay -- --backend redis --redis-url redis://127.0.0.1:6379 \
//!     --processes --redis-stats   # what a message costs Redis: commands, µs, round trips, memory
//! cargo run --release --example replay -- --help
//! ```
//!
//! ## What happens
//!
//! The input is Telegram Bot API `Update` JSON lines, by default
//! `examples/data/chitchat-slice.jsonl` (300 real conversations, 5,318 messages; see
//! `examples/data/README.md`). Lines that hold no text message are skipped and counted.
//!
//! `--replicas` bots (default 4, each with `--workers` threads, default 4) share one
//! [`MemoryCoordinator`](botmesh::MemoryCoordinator), as replicas in separate processes
//! would share Redis (with `--backend redis`, each bot has its own `RedisCoordinator`,
//! i.e. its own connection pool and subscriber, as a separate process would). The
//! platform works like Telegram's webhooks behind a load balancer: each update goes to
//! a replica chosen at random (seeded by `--seed`), and a chat's next update is sent
//! only once a replica accepted the previous one ([`Intake::deliver`] returned), while
//! other chats go on in parallel on several sender threads (each owns a share of the
//! chats and walks them in file order). With `--speed X` every update is sent at its
//! original time, X times faster; without it, as fast as the replicas take them.
//!
//! The handler checks the three guarantees above as it starts, then sleeps for
//! `--handler-ms` ± `--handler-jitter-ms` (a fixed amount per update, from the seed) to
//! stand in for real work. The platform waits until every update has ended, as the
//! bots' outcome hooks report it: handled, dropped (with a reason), or a duplicate.
//!
//! ## Output
//!
//! A progress line on stderr about once a second; a summary at the end (handled,
//! dropped by reason, duplicates, violations, wall time, messages/s, and the wait for
//! the turn at p50 and p99 from the exact per-message waits). With `--json` the last
//! line on stdout is one JSON record in the shape of the project's benchmark records
//! (`"workload": "replay"`). With `--log PATH` every update that ends adds one JSON
//! line to PATH, written by one thread so the workers never wait on the disk (it
//! writes out whenever it has caught up, so a run stopped by SIGTERM or SIGINT, which
//! exits with no report, leaves whole lines for every update that ended before):
//!
//! ```text
//! {"event":"handled","update_id":8,"chat":"-1003219","message_id":3,"replica":"r2","fence":9,"start_us":…,"end_us":…}
//! {"event":"dropped","update_id":9,"chat":"-1003219","reason":"timeout"}
//! {"event":"duplicate","update_id":10}
//! ```
//!
//! `start_us` and `end_us` are the handler's start and end in µs since the Unix epoch
//! (the system clock). The exit status is 0 for a clean run, 1 when an update was
//! dropped or a check failed, and 2 when the command line or the input was refused.
//!
//! ## Over Redis, and with real processes
//!
//! `--backend redis --redis-url URL` runs the same replay over a Redis server. Every run
//! uses a fresh key prefix `replay-<pid>-<nanos>` (or `--key-prefix`), so runs on one
//! server never meet; botmesh gives every key it leaves a TTL, so nothing needs
//! cleaning up. `--lease-ttl` sets the lease TTL (default 10 s). `--redis-stats` reads
//! the server's `INFO` (commandstats, stats, cpu, memory) and `DBSIZE` before and after
//! the run and adds what it cost per handled message to the summary and to the JSON
//! record's `extra.redis_stats`: commands (script calls and the commands inside them),
//! µs in commands, server CPU µs, round trips (the server's read events), and the
//! memory and keys left behind (see `replay/redis_stats.rs`; the server should run
//! nothing else meanwhile).
//!
//! With `--processes` every replica is its own OS process: the example starts itself
//! again once per replica (hidden flag `--child-replica rK`, the URL passed in the
//! environment so that no password shows in the process list) and plays the platform
//! over their stdin and stdout (see `replay/protocol.rs` for the line protocol and
//! `replay/parent.rs` for the platform). A replica that dies (or that
//! `--kill-replica-at F` SIGKILLs once the fraction F of the updates was delivered)
//! has every update it accepted but did not finish sent to another live replica; those
//! log lines carry `"redelivered": true`. The parent checks the guarantees across
//! processes from the replicas' answers (handler intervals on the system clock,
//! fencing tokens, order), every update ending exactly once, or at least once when
//! redelivered; the order check skips redelivered updates.
//!
//! Each replica process also appends a `handled` line to a part file of its own
//! (`<log>.<replica>.part`, or a temporary file without `--log`) before its handler
//! returns, so before the turn is released; one `write` per line, no fsync (a SIGKILL
//! cannot take back what the kernel has). At the end the parent merges the part files
//! into the log: a `handled` line it never heard of (the replica was killed before it
//! reported it) is added with `"recovered": true`, and takes part in the checks. So a
//! checker of the log can tell a redelivered update that the dead replica had handled
//! (its later `duplicate` answers are right) from one that was lost: an update that
//! ended only as `duplicate` with no `handled` line anywhere is counted as a silent
//! loss. A part line whose replica reported the update as ending otherwise (its turn
//! was lost under the running handler) is added as `{"event":"ran",…,"reported":"lost"}`:
//! not a `handled` end, but held to the fencing rule. `dropped` lines of this mode also
//! name the `replica` that reported the drop and `at_us`, when the platform heard of it.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

#[path = "replay/args.rs"]
mod args;
#[path = "replay/backend.rs"]
mod backend;
#[path = "replay/child.rs"]
mod child;
#[path = "replay/common.rs"]
mod common;
#[path = "replay/data.rs"]
mod data;
#[path = "common/signals.rs"]
mod signals;
#[path = "common/stderr_log.rs"]
mod stderr_log;
// The platform of replica processes is shared with the chaos example, which uses the
// parts of it that only fault injection needs.
#[allow(dead_code)]
#[path = "replay/parent.rs"]
mod parent;
#[path = "replay/parts.rs"]
mod parts;
#[path = "replay/procs.rs"]
mod procs;
#[path = "replay/protocol.rs"]
mod protocol;
#[path = "replay/redis_stats.rs"]
mod redis_stats;
#[path = "replay/report.rs"]
mod report;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use botmesh::{Bot, CoordinationConfig, CoordinatorConfig, HandlerError, Intake, Message, Outcome};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use args::{Command, Options};
use backend::RedisSettings;
use data::Trace;
use report::{Ending, LogMsg, LogWriter, REASONS, RedisFacts, Summary};

fn main() -> ExitCode {
    let options = match args::parse(std::env::args_os()) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Help) => {
            let _ = writeln!(std::io::stdout(), "{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("replay: {e}");
            eprintln!("replay: run with --help to see the options");
            return ExitCode::from(2);
        }
    };
    if let Some(name) = &options.child_replica {
        return child::run(&options, name);
    }
    // SIGTERM / SIGINT: the replica processes stop cleanly, then any redis-server.
    if let Err(e) = signals::stop_children_on_signal("replay") {
        eprintln!("replay: cannot install the signal handler: {e}");
        return ExitCode::FAILURE;
    }
    let redis = RedisSettings::of(&options);
    let before = match redis.as_ref().filter(|_| options.redis_stats) {
        Some(settings) => match redis_stats::take(&settings.url) {
            Ok(snapshot) => Some(snapshot),
            Err(e) => {
                eprintln!("replay: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let result = match &redis {
        Some(settings) if options.processes => parent::replay(&options, settings),
        _ => replay(&options, redis.as_ref()),
    };
    let result = match (result, before, &redis) {
        (Ok(summary), Some(before), Some(settings)) => with_cost(summary, &before, settings),
        (result, _, _) => result,
    };
    // A signal stop under way ends the process with its own status.
    signals::park_if_stopping();
    match result {
        Ok(summary) => {
            let record = if options.json {
                match summary.json() {
                    Ok(line) => Some(line),
                    Err(e) => {
                        eprintln!("replay: cannot write the JSON record: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                None
            };
            // A closed stdout (`| head`) is not worth a panic; the exit status still
            // tells whether the run was clean.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", summary.human());
            if let Some(line) = record {
                let _ = writeln!(out, "{line}");
            }
            let _ = out.flush();
            if summary.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("replay: {e}");
            ExitCode::from(2)
        }
    }
}

/// Adds what the run cost the Redis server (`--redis-stats`), read now that every
/// replica has stopped.
fn with_cost(
    mut summary: Summary,
    before: &redis_stats::Snapshot,
    settings: &RedisSettings,
) -> Result<Summary, String> {
    let after = redis_stats::take(&settings.url)?;
    let cost = redis_stats::cost(before, &after, summary.handled);
    let json = serde_json::to_value(&cost).map_err(|e| format!("--redis-stats: {e}"))?;
    if let Some(r) = summary.redis.as_mut() {
        r.cost = Some((cost.human(), json));
    }
    Ok(summary)
}

/// The payload each message carries to the handler and the outcome hook: its index in
/// the trace.
#[derive(Clone, Copy, Debug)]
struct UpdateIndex(usize);

fn update_index(message: &Message) -> Option<usize> {
    message.payload::<UpdateIndex>().map(|u| u.0)
}

/// What the handlers of one chat leave for the next one to check.
#[derive(Default)]
struct ChatState {
    /// Set while a handler of this chat runs: finding it set at start is an overlap.
    busy: AtomicBool,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// The `message_id` of the chat's latest handler to start.
    message_id: Option<i64>,
    /// The fencing token and replica of the chat's latest handler to start.
    fence: Option<(u64, usize)>,
}

/// What one update's handler and outcome hook record.
struct Slot {
    start_us: AtomicU64,
    end_us: AtomicU64,
    /// `turn.waited()` in ns; `u64::MAX` until a handler started.
    waited_ns: AtomicU64,
    ends: AtomicUsize,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            start_us: AtomicU64::new(0),
            end_us: AtomicU64::new(0),
            waited_ns: AtomicU64::new(u64::MAX),
            ends: AtomicUsize::new(0),
        }
    }
}

#[derive(Default)]
struct Tally {
    handled: AtomicU64,
    dropped: [AtomicU64; 4],
    duplicates: AtomicU64,
    failed: AtomicU64,
    order: AtomicU64,
    overlap: AtomicU64,
    fence: AtomicU64,
    ended_twice: AtomicU64,
    /// Updates that ended, however.
    ended: AtomicUsize,
    /// Updates handed to a replica (deliver returned).
    sent: AtomicUsize,
    /// Sender threads sleeping until an update's original time (`--speed`).
    pacing: AtomicUsize,
}

/// Everything the handlers, the hooks and the platform share.
struct Run {
    trace: Arc<Trace>,
    /// Simulated work per update; empty when there is none.
    work: Vec<Duration>,
    chats: Vec<ChatState>,
    slots: Vec<Slot>,
    tally: Tally,
    log: Option<Sender<LogMsg>>,
    /// Told once, when the last update ended.
    done: Sender<()>,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Run {
    /// The handler of replica number `replica`: checks the chat's guarantees, then
    /// simulates work.
    fn handle(&self, ctx: &botmesh::Context<'_>, replica: usize) -> Result<(), HandlerError> {
        let start_us = common::unix_us();
        let index = update_index(ctx.message()).ok_or("the message carries no update index")?;
        let (Some(entry), Some(slot)) = (self.trace.entries.get(index), self.slots.get(index))
        else {
            return Err(format!("update index {index} is out of range").into());
        };
        let chat = self
            .chats
            .get(entry.chat)
            .ok_or("the update's chat index is out of range")?;
        let turn = ctx.turn();
        slot.start_us.store(start_us, Ordering::Relaxed);
        let waited = u64::try_from(turn.waited().as_nanos()).unwrap_or(u64::MAX - 1);
        slot.waited_ns.store(waited, Ordering::Relaxed);

        if chat.busy.swap(true, Ordering::AcqRel) {
            add(&self.tally.overlap);
        }
        {
            let mut seen = chat.seen.lock();
            if seen.message_id.is_some_and(|last| entry.message_id <= last) {
                add(&self.tally.order);
            }
            seen.message_id = Some(entry.message_id);
            let token = turn.fencing_token();
            if let Some((last_token, last_replica)) = seen.fence {
                let backwards = token < last_token;
                let flat_across_replicas = token == last_token && replica != last_replica;
                if backwards || flat_across_replicas {
                    add(&self.tally.fence);
                }
            }
            seen.fence = Some((token, replica));
        }

        if let Some(work) = self.work.get(index).filter(|w| !w.is_zero()) {
            std::thread::sleep(*work);
        }

        slot.end_us.store(common::unix_us(), Ordering::Relaxed);
        // Cleared before the handler returns, i.e. before the turn is released.
        chat.busy.store(false, Ordering::Release);
        Ok(())
    }

    /// The outcome hook of replica number `replica`: counts and logs how an update
    /// ended.
    fn outcome(&self, message: &Message, outcome: &Outcome, replica: usize) {
        let Some(index) = update_index(message) else {
            return;
        };
        let ending = match outcome {
            Outcome::Handled { token, .. } => {
                add(&self.tally.handled);
                let (start_us, end_us) = self.slots.get(index).map_or((0, 0), |s| {
                    (
                        s.start_us.load(Ordering::Relaxed),
                        s.end_us.load(Ordering::Relaxed),
                    )
                });
                Ending::Handled {
                    replica,
                    fence: *token,
                    start_us,
                    end_us,
                }
            }
            Outcome::Dropped(e) => {
                let reason = e.reason.as_str();
                self.count_drop(reason);
                Ending::Dropped(reason)
            }
            Outcome::Failed(text) => {
                add(&self.tally.failed);
                Ending::Failed(text.clone())
            }
            Outcome::Duplicate => {
                add(&self.tally.duplicates);
                Ending::Duplicate
            }
            // An outcome this example does not know yet counts as a failure, so the
            // checker notices it.
            other => {
                add(&self.tally.failed);
                Ending::Failed(format!("unknown outcome {other:?}"))
            }
        };
        self.ended(index, ending);
    }

    fn count_drop(&self, reason: &str) {
        let i = REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(REASONS.len() - 1);
        add(&self.tally.dropped[i]);
    }

    /// Records that update `index` ended; tells the platform when it was the last one.
    fn ended(&self, index: usize, ending: Ending) {
        if let Some(slot) = self.slots.get(index)
            && slot.ends.fetch_add(1, Ordering::Relaxed) > 0
        {
            add(&self.tally.ended_twice);
        }
        if let Some(log) = &self.log {
            // Fails only once the log thread has finished, after every update ended.
            let _ = log.send(LogMsg::Ended {
                index,
                ending,
                redelivered: false,
            });
        }
        let ended = self.tally.ended.fetch_add(1, Ordering::AcqRel) + 1;
        if ended == self.trace.entries.len() {
            let _ = self.done.try_send(());
        }
    }
}

/// The platform's choices, fixed before the run from the seed.
struct Plan {
    /// The replica each update goes to.
    replica_of: Vec<usize>,
    /// With `--speed`: when each update is due, from the start of the replay.
    due: Option<Vec<Duration>>,
}

fn plan(trace: &Trace, o: &Options) -> Result<Plan, String> {
    let mut rng = StdRng::seed_from_u64(o.seed);
    let replica_of = trace
        .entries
        .iter()
        .map(|_| rng.gen_range(0..o.replicas))
        .collect();
    let due = common::due_times(trace, o)?;
    Ok(Plan { replica_of, due })
}

/// Spreads chats over the sender threads (a chat belongs to exactly one sender, which
/// is what keeps its updates in order).
fn sender_of(chat: usize, senders: usize) -> usize {
    // splitmix64's finaliser: neighbouring chat indexes land on unrelated senders.
    let mut z = (chat as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % senders as u64) as usize
}

/// One platform thread: delivers its chats' updates in file order, each as soon as the
/// previous one of the same chat was accepted (and, with `--speed`, not before its
/// time).
fn send_updates(run: &Run, plan: &Plan, intakes: &[Intake], owned: &[usize], start: Instant) {
    for &index in owned {
        let Some(entry) = run.trace.entries.get(index) else {
            continue;
        };
        if let Some(at) = plan
            .due
            .as_ref()
            .and_then(|due| due.get(index))
            .and_then(|d| start.checked_add(*d))
        {
            let now = Instant::now();
            if at > now {
                run.tally.pacing.fetch_add(1, Ordering::AcqRel);
                std::thread::sleep(at - now);
                run.tally.pacing.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let chat = run.trace.chats.get(entry.chat).cloned().unwrap_or_default();
        let message = Message::new(chat, entry.text.clone())
            .with_id(entry.message_id.to_string())
            .with_payload(UpdateIndex(index));
        let replica = plan.replica_of.get(index).copied().unwrap_or(0);
        let delivered = match intakes.get(replica) {
            Some(intake) => intake.deliver(message).map_err(|e| e.reason.as_str()),
            None => Err("backend"),
        };
        if let Err(reason) = delivered {
            // Not taken in: no outcome will come for it, so the platform ends it.
            run.count_drop(reason);
            run.ended(index, Ending::Dropped(reason));
        }
        run.tally.sent.fetch_add(1, Ordering::AcqRel);
    }
}

/// Waits until every update has ended, printing a progress line to stderr about once
/// a second. Returns `false` if the run stalled instead: nothing was accepted or ended
/// for `stall_limit` while no sender was waiting for an update's original time.
fn watch(
    run: &Run,
    bots: &[Bot],
    done: &Receiver<()>,
    start: Instant,
    stall_limit: Duration,
) -> bool {
    let expected = run.trace.entries.len();
    let mut last_tick = (start, 0usize);
    let mut last_change = (start, 0usize, 0usize);
    loop {
        match done.recv_timeout(Duration::from_secs(1)) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return true,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        let ended = run.tally.ended.load(Ordering::Acquire);
        let sent = run.tally.sent.load(Ordering::Acquire);
        let in_flight: usize = bots.iter().map(Bot::in_flight).sum();
        let waiting: u64 = bots.iter().map(|b| b.metrics().tickets_waiting).sum();
        let rate = ended.saturating_sub(last_tick.1) as f64
            / now.duration_since(last_tick.0).as_secs_f64();
        eprintln!(
            "replay: {:7.1} s  {ended}/{expected} ended  {rate:8.0} msg/s  in flight {in_flight}  waiting {waiting}",
            now.duration_since(start).as_secs_f64()
        );
        last_tick = (now, ended);
        if (ended, sent) != (last_change.1, last_change.2)
            || run.tally.pacing.load(Ordering::Acquire) > 0
        {
            last_change = (now, ended, sent);
        } else if now.duration_since(last_change.0) > stall_limit {
            return false;
        }
    }
}

/// The replay with every replica in this process: over one shared
/// `MemoryCoordinator`, or over Redis with one `RedisCoordinator` (connection pool and
/// subscriber) per replica, as separate processes would have.
fn replay(o: &Options, redis: Option<&RedisSettings>) -> Result<Summary, String> {
    let trace = Arc::new(common::load_trace(o)?);
    let plan = Arc::new(plan(&trace, o)?);
    let replica_names: Arc<[String]> = (1..=o.replicas).map(|i| format!("r{i}")).collect();
    let log = match &o.log {
        Some(path) => Some(LogWriter::start(
            path,
            trace.clone(),
            replica_names.clone(),
        )?),
        None => None,
    };
    let work = if o.handler_ms > 0.0 || o.handler_jitter_ms > 0.0 {
        trace
            .entries
            .iter()
            .map(|e| common::work_of(e.update_id, o.seed, o.handler_ms, o.handler_jitter_ms))
            .collect()
    } else {
        Vec::new()
    };
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let run = Arc::new(Run {
        trace: trace.clone(),
        work,
        chats: trace.chats.iter().map(|_| ChatState::default()).collect(),
        slots: trace.entries.iter().map(|_| Slot::new()).collect(),
        tally: Tally::default(),
        log: log.as_ref().map(LogWriter::sender),
        done: done_tx,
    });

    // The replicas: one memory coordinator shared by all, as Redis is shared across
    // processes; or one Redis connection (pool) each.
    let coordinators = backend::coordinators(redis, o.replicas)?;
    let mut bots = Vec::with_capacity(o.replicas);
    for ((i, name), coordinator) in replica_names.iter().enumerate().zip(coordinators) {
        let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator))
            .with_turn_wait(o.turn_wait);
        let (for_handler, for_outcome) = (run.clone(), run.clone());
        let bot = Bot::builder()
            .id(name.as_str())
            .workers(o.workers)
            .coordination(config)
            .handler(move |ctx| for_handler.handle(ctx, i))
            .on_outcome(move |message, outcome| for_outcome.outcome(message, outcome, i))
            .build()
            .map_err(|e| format!("cannot start replica {name}: {e}"))?;
        bots.push(bot);
    }
    let intakes: Arc<[Intake]> = bots.iter().map(Bot::intake).collect();

    // The platform: each sender thread owns the chats that hash to it.
    let mut owned = vec![Vec::new(); o.senders];
    for (index, entry) in trace.entries.iter().enumerate() {
        owned[sender_of(entry.chat, o.senders)].push(index);
    }
    let start = Instant::now();
    let mut senders: Vec<JoinHandle<()>> = Vec::with_capacity(o.senders);
    for (n, mine) in owned.into_iter().enumerate() {
        let (run, plan, intakes) = (run.clone(), plan.clone(), intakes.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("replay-platform-{n}"))
            .spawn(move || send_updates(&run, &plan, &intakes, &mine, start))
            .map_err(|e| format!("cannot start a platform thread: {e}"))?;
        senders.push(spawned);
    }

    // Wait for every update to end, with a progress line about once a second.
    let expected = trace.entries.len();
    let longest_work = run.work.iter().max().copied().unwrap_or_default();
    let stall_limit = o
        .turn_wait
        .saturating_add(longest_work)
        .saturating_add(Duration::from_secs(30));
    let stalled = expected > 0 && !watch(&run, &bots, &done_rx, start, stall_limit);
    let wall = start.elapsed();

    let handovers = bots.iter().map(|b| b.metrics().handovers).sum();
    let mut notes = String::new();
    if stalled {
        let ended = run.tally.ended.load(Ordering::Acquire);
        let sent = run.tally.sent.load(Ordering::Acquire);
        notes = format!(
            "stalled: no update ended or was accepted for {} s; {sent} of {expected} sent, {} accepted but not ended",
            stall_limit.as_secs(),
            sent.saturating_sub(ended)
        );
        // A stop would wait for the stuck updates forever; leave the replicas and the
        // platform threads as they are, the process ends after the summary.
        std::mem::forget(bots);
        drop(senders);
    } else {
        for sender in senders {
            if sender.join().is_err() {
                notes = "a platform thread panicked".to_owned();
            }
        }
        for bot in bots {
            bot.shutdown();
        }
    }
    if let Some(log) = log
        && let Err(e) = log.finish()
    {
        if !notes.is_empty() {
            notes.push_str("; ");
        }
        notes.push_str(&e);
    }

    let mut waits: Vec<u64> = run
        .slots
        .iter()
        .map(|s| s.waited_ns.load(Ordering::Relaxed))
        .filter(|w| *w != u64::MAX)
        .collect();
    waits.sort_unstable();
    let t = &run.tally;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    Ok(Summary {
        dropped: std::array::from_fn(|i| load(&t.dropped[i])),
        duplicates: load(&t.duplicates),
        failed: load(&t.failed),
        order_violations: load(&t.order),
        overlap_violations: load(&t.overlap),
        token_violations: load(&t.fence),
        ended_twice: load(&t.ended_twice),
        handovers,
        notes,
        redis: redis.map(|r| RedisFacts {
            mode: "threads",
            servers: r.describe(),
            key_prefix: r.key_prefix.clone(),
            lease_ttl_ms: r.lease_ttl.as_millis(),
            ..RedisFacts::default()
        }),
        ..Summary::base(o, &trace, expected, wall, load(&t.handled), &waits)
    })
}
