//! What the replay writes: the per-update log, the human summary and the JSON record.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};

use crate::data::Trace;

/// How one update ended, as sent to the log thread. The log thread looks the update's
/// chat and message id up in the trace, so the workers send only a few numbers.
#[derive(Debug)]
pub enum Ending {
    /// The handler ran under the chat's turn.
    Handled {
        /// Index of the replica that ran it.
        replica: usize,
        /// The turn's fencing token.
        fence: u64,
        /// Handler start, µs since the Unix epoch.
        start_us: u64,
        /// Handler end, µs since the Unix epoch.
        end_us: u64,
    },
    /// Not handled; the reason as botmesh writes it (`timeout`, `lost`, …).
    Dropped(&'static str),
    /// A second delivery of a message id that was skipped.
    Duplicate,
    /// The handler returned an error or panicked.
    Failed(String),
}

/// A message to the log thread.
#[derive(Debug)]
pub enum LogMsg {
    /// Update number `index` (in trace order) ended.
    Ended {
        /// Index into the trace's entries.
        index: usize,
        /// How it ended.
        ending: Ending,
        /// Whether the platform delivered it again after a replica died with it.
        redelivered: bool,
    },
    /// A line the sender wrote out in full (the platform of replica processes, whose
    /// trace may grow and whose replicas come and go).
    Record(LogRecord),
    /// Everything has ended: flush and stop.
    Finish,
}

/// One line of the `--log` file with every field owned: what the platform of replica
/// processes sends, and what a replica process appends to its own part file (a
/// `handled` line, written before the handler returns; see `replay/parts.rs`). The same
/// shape as the lines the in-process replay writes, plus optional fields a checker of a
/// faulty run needs: `recovered` (a `handled` line the platform took from the replica's
/// part file because the replica never reported it), and on `dropped` lines the replica
/// that reported the drop and when the platform heard of it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum LogRecord {
    /// The handler ran under the chat's turn.
    Handled {
        /// The Telegram `update_id`.
        update_id: i64,
        /// The chat id.
        chat: String,
        /// The message id.
        message_id: i64,
        /// The replica that ran the handler.
        replica: String,
        /// The turn's fencing token.
        fence: u64,
        /// Handler start, µs since the Unix epoch.
        start_us: u64,
        /// Handler end, µs since the Unix epoch.
        end_us: u64,
        /// Delivered again after a replica died with it.
        #[serde(default, skip_serializing_if = "is_false")]
        redelivered: bool,
        /// Known only from the replica's part file.
        #[serde(default, skip_serializing_if = "is_false")]
        recovered: bool,
    },
    /// A handler run that a replica's part file shows but that the same replica
    /// reported as ending otherwise (`reported`: e.g. `lost`): the handler ran to its
    /// end, and its turn was lost meanwhile or before the release (a replica paused
    /// past its lease, say). Not a `handled` end: the update ended as reported.
    Ran {
        /// The Telegram `update_id`.
        update_id: i64,
        /// The chat id.
        chat: String,
        /// The message id.
        message_id: i64,
        /// The replica that ran the handler.
        replica: String,
        /// The turn's fencing token.
        fence: u64,
        /// Handler start, µs since the Unix epoch.
        start_us: u64,
        /// Handler end, µs since the Unix epoch.
        end_us: u64,
        /// How the replica reported the update's end.
        reported: String,
        /// Delivered again after a replica died with it.
        #[serde(default, skip_serializing_if = "is_false")]
        redelivered: bool,
    },
    /// Not handled.
    Dropped {
        /// The Telegram `update_id`.
        update_id: i64,
        /// The chat id.
        chat: String,
        /// botmesh's reason.
        reason: String,
        /// Delivered again after a replica died with it.
        #[serde(default, skip_serializing_if = "is_false")]
        redelivered: bool,
        /// The replica that reported it (absent when no replica could take it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replica: Option<String>,
        /// When the platform heard of it, µs since the Unix epoch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_us: Option<u64>,
    },
    /// A second delivery of a message id that was skipped.
    Duplicate {
        /// The Telegram `update_id`.
        update_id: i64,
        /// Delivered again after a replica died with it.
        #[serde(default, skip_serializing_if = "is_false")]
        redelivered: bool,
    },
    /// The handler returned an error or panicked.
    Failed {
        /// The Telegram `update_id`.
        update_id: i64,
        /// The chat id.
        chat: String,
        /// The error text.
        error: String,
        /// Delivered again after a replica died with it.
        #[serde(default, skip_serializing_if = "is_false")]
        redelivered: bool,
    },
}

/// One line of the `--log` file, in the shape of issue 2, item 6, plus
/// `"redelivered": true` (issue 3, item 4) on the updates the platform sent again after
/// a replica process died with them (absent otherwise, so the line is unchanged).
#[derive(Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum LogLine<'a> {
    Handled {
        update_id: i64,
        chat: &'a str,
        message_id: i64,
        replica: &'a str,
        fence: u64,
        start_us: u64,
        end_us: u64,
        #[serde(skip_serializing_if = "is_false")]
        redelivered: bool,
    },
    Dropped {
        update_id: i64,
        chat: &'a str,
        reason: &'a str,
        #[serde(skip_serializing_if = "is_false")]
        redelivered: bool,
    },
    Duplicate {
        update_id: i64,
        #[serde(skip_serializing_if = "is_false")]
        redelivered: bool,
    },
    Failed {
        update_id: i64,
        chat: &'a str,
        error: &'a str,
        #[serde(skip_serializing_if = "is_false")]
        redelivered: bool,
    },
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}

/// The thread that owns the `--log` file.
#[derive(Debug)]
pub struct LogWriter {
    tx: Sender<LogMsg>,
    thread: JoinHandle<Result<u64, String>>,
}

impl LogWriter {
    /// Creates (truncates) `path` and starts the thread that writes it.
    ///
    /// # Errors
    /// A message naming the path when it cannot be created, or the thread not started.
    pub fn start(
        path: &Path,
        trace: Arc<Trace>,
        replicas: Arc<[String]>,
    ) -> Result<LogWriter, String> {
        let file = File::create(path)
            .map_err(|e| format!("--log: cannot create {}: {e}", path.display()))?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let shown = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("replay-log".into())
            .spawn(move || {
                write_log(
                    BufWriter::with_capacity(1 << 20, file),
                    &rx,
                    &trace,
                    &replicas,
                    &shown,
                )
            })
            .map_err(|e| format!("cannot start the log thread: {e}"))?;
        Ok(LogWriter { tx, thread })
    }

    /// A log for a sender that writes whole [`LogRecord`]s and needs no lookups.
    ///
    /// # Errors
    /// As [`LogWriter::start`].
    pub fn start_records(path: &Path) -> Result<LogWriter, String> {
        LogWriter::start(path, Arc::new(Trace::default()), Arc::from(Vec::new()))
    }

    /// A handle the hooks send endings through.
    pub fn sender(&self) -> Sender<LogMsg> {
        self.tx.clone()
    }

    /// Writes what is left, closes the file and returns how many lines it holds.
    ///
    /// # Errors
    /// A message naming the file when a write failed.
    pub fn finish(self) -> Result<u64, String> {
        // The thread only stops on `Finish`, so it cannot have hung up before this.
        let _ = self.tx.send(LogMsg::Finish);
        self.thread
            .join()
            .unwrap_or_else(|_| Err("the log thread panicked".into()))
    }
}

fn write_log(
    mut out: BufWriter<File>,
    rx: &Receiver<LogMsg>,
    trace: &Trace,
    replicas: &[String],
    path: &Path,
) -> Result<u64, String> {
    let mut lines = 0u64;
    let mut failure: Option<String> = None;
    loop {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(crossbeam_channel::TryRecvError::Disconnected) => break,
            Err(crossbeam_channel::TryRecvError::Empty) => {
                // Written out whenever nothing more is queued, so a run stopped by a
                // signal (the process exits without a report) leaves its log whole up
                // to the lines still on their way; under load lines still go out in
                // large writes.
                if failure.is_none()
                    && let Err(e) = out.flush()
                {
                    failure = Some(format!("--log: cannot write {}: {e}", path.display()));
                }
                match rx.recv() {
                    Ok(msg) => msg,
                    Err(_) => break,
                }
            }
        };
        let (index, ending, redelivered) = match msg {
            LogMsg::Finish => break,
            LogMsg::Record(record) => {
                if failure.is_none() {
                    let written = serde_json::to_writer(&mut out, &record)
                        .map_err(std::io::Error::from)
                        .and_then(|()| out.write_all(b"\n"));
                    match written {
                        Ok(()) => lines += 1,
                        Err(e) => {
                            failure = Some(format!("--log: cannot write {}: {e}", path.display()));
                        }
                    }
                }
                continue;
            }
            LogMsg::Ended {
                index,
                ending,
                redelivered,
            } => (index, ending, redelivered),
        };
        if failure.is_some() {
            continue; // keep draining so the senders never notice
        }
        let Some(entry) = trace.entries.get(index) else {
            continue;
        };
        let chat = trace.chats.get(entry.chat).map_or("", String::as_str);
        let line = match &ending {
            Ending::Handled {
                replica,
                fence,
                start_us,
                end_us,
            } => LogLine::Handled {
                update_id: entry.update_id,
                chat,
                message_id: entry.message_id,
                replica: replicas.get(*replica).map_or("", String::as_str),
                fence: *fence,
                start_us: *start_us,
                end_us: *end_us,
                redelivered,
            },
            Ending::Dropped(reason) => LogLine::Dropped {
                update_id: entry.update_id,
                chat,
                reason,
                redelivered,
            },
            Ending::Duplicate => LogLine::Duplicate {
                update_id: entry.update_id,
                redelivered,
            },
            Ending::Failed(error) => LogLine::Failed {
                update_id: entry.update_id,
                chat,
                error,
                redelivered,
            },
        };
        let written = serde_json::to_writer(&mut out, &line)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
        match written {
            Ok(()) => lines += 1,
            Err(e) => failure = Some(format!("--log: cannot write {}: {e}", path.display())),
        }
    }
    if failure.is_none()
        && let Err(e) = out.flush()
    {
        failure = Some(format!("--log: cannot write {}: {e}", path.display()));
    }
    match failure {
        Some(f) => Err(f),
        None => Ok(lines),
    }
}

/// Drops by reason, in the order the JSON record lists them.
pub const REASONS: [&str; 4] = ["timeout", "lost", "backend", "shutting_down"];

/// Everything the summary and the JSON record say about one run.
#[derive(Debug, Default)]
pub struct Summary {
    /// The input as shown (relative to the crate for the bundled slice).
    pub updates_path: String,
    /// The backend's name.
    pub backend: String,
    /// Replicas.
    pub replicas: usize,
    /// Workers per replica.
    pub workers: usize,
    /// Platform sender threads.
    pub senders: usize,
    /// The seed.
    pub seed: u64,
    /// Simulated work per update, ms.
    pub handler_ms: f64,
    /// Work jitter, ms.
    pub handler_jitter_ms: f64,
    /// Speed-up of the original timing; `None`: as fast as possible.
    pub speed: Option<f64>,
    /// `turn_wait`, ms.
    pub turn_wait_ms: u128,
    /// Text messages replayed.
    pub updates: usize,
    /// Chats among them.
    pub chats: usize,
    /// Input lines skipped (no text message, or not an Update).
    pub skipped_lines: usize,
    /// Handled updates.
    pub handled: u64,
    /// Dropped updates, by [`REASONS`]; anything else counts as the last one.
    pub dropped: [u64; 4],
    /// Duplicates skipped.
    pub duplicates: u64,
    /// Handlers that failed.
    pub failed: u64,
    /// A chat's handler started before one with a lower `message_id`.
    pub order_violations: u64,
    /// Two handlers of one chat ran at the same time.
    pub overlap_violations: u64,
    /// A fencing token went backwards, or did not rise when the replica changed.
    pub token_violations: u64,
    /// An update ended more than once.
    pub ended_twice: u64,
    /// Grants whose previous holder was another replica (from the replicas' metrics).
    pub handovers: u64,
    /// From the first delivery to the last update's end, seconds.
    pub wall_s: f64,
    /// Handled updates per second of wall time.
    pub messages_per_s: f64,
    /// Wait for the turn, exact percentiles over handled updates, µs.
    pub wait_p50_us: Option<f64>,
    /// See `wait_p50_us`.
    pub wait_p99_us: Option<f64>,
    /// Longest wait for the turn, µs.
    pub wait_max_us: Option<f64>,
    /// Anything unusual about the run (a stall, a log write failure).
    pub notes: String,
    /// What only a Redis run has; `None` for the memory backend.
    pub redis: Option<RedisFacts>,
}

impl Summary {
    /// The part every mode fills the same way: the settings, the input, the wall time,
    /// the rate of handled messages and the wait percentiles (from sorted waits in
    /// ns). The caller adds its counts with struct update syntax.
    pub fn base(
        o: &crate::args::Options,
        trace: &Trace,
        updates: usize,
        wall: std::time::Duration,
        handled: u64,
        sorted_waits_ns: &[u64],
    ) -> Summary {
        let us = |q: f64| percentile(sorted_waits_ns, q).map(|ns| ns as f64 / 1000.0);
        let wall_s = wall.as_secs_f64();
        Summary {
            updates_path: crate::common::shown_path(o),
            backend: o.backend.clone(),
            replicas: o.replicas,
            workers: o.workers,
            senders: o.senders,
            seed: o.seed,
            handler_ms: o.handler_ms,
            handler_jitter_ms: o.handler_jitter_ms,
            speed: o.speed,
            turn_wait_ms: o.turn_wait.as_millis(),
            updates,
            chats: trace.chats.len(),
            skipped_lines: trace.skipped + trace.malformed,
            handled,
            wall_s,
            // Handled messages only: drops end fast and would flatter the figure.
            messages_per_s: if wall_s > 0.0 {
                handled as f64 / wall_s
            } else {
                0.0
            },
            wait_p50_us: us(0.50),
            wait_p99_us: us(0.99),
            wait_max_us: us(1.0),
            ..Summary::default()
        }
    }
}

/// The Redis side of a run: its settings, and with `--processes` the redeliveries.
#[derive(Debug, Default)]
pub struct RedisFacts {
    /// `threads` (replicas in this process) or `processes` (one OS process each).
    pub mode: &'static str,
    /// Which servers: one, a cluster, or a Sentinel service (and `wait_replicas`).
    pub servers: String,
    /// The key prefix the run used.
    pub key_prefix: String,
    /// The lease TTL, ms.
    pub lease_ttl_ms: u128,
    /// `--kill-replica-at`.
    pub kill_replica_at: Option<f64>,
    /// The replica that was killed, and at how many first deliveries.
    pub killed: Option<(String, usize)>,
    /// Updates delivered again because the replica that had them died.
    pub redelivered: u64,
    /// Of those, how many were handled in the end.
    pub redelivered_handled: u64,
    /// Redeliveries answered `duplicate` while the dead replica's claim could still be
    /// live, and so sent again later.
    pub redelivery_retries: u64,
    /// Redelivered updates that ended more than once (allowed: at-least-once).
    pub redelivered_ended_twice: u64,
    /// `handled` lines taken from the replicas' part files that no replica reported.
    pub recovered: u64,
    /// Updates that never ended, or ended only as `duplicate` with no `handled` line
    /// anywhere.
    pub silent_losses: u64,
    /// With `--redis-stats`: what the run cost the server, as summary lines and as the
    /// JSON record's `extra.redis_stats`.
    pub cost: Option<(String, serde_json::Value)>,
}

impl Summary {
    /// Dropped updates, all reasons.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    /// All checks that failed.
    pub fn violations(&self) -> u64 {
        self.order_violations + self.overlap_violations + self.token_violations + self.ended_twice
    }

    /// Whether the run was clean: all handled, nothing dropped or failed, no violation.
    pub fn is_clean(&self) -> bool {
        self.dropped_total() == 0
            && self.failed == 0
            && self.violations() == 0
            && self.notes.is_empty()
    }

    /// The human summary, several lines.
    pub fn human(&self) -> String {
        let speed = match self.speed {
            Some(x) => format!("original timing ×{x}"),
            None => "as fast as possible".to_owned(),
        };
        let us = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} µs"));
        let d = &self.dropped;
        let setup = match &self.redis {
            Some(r) if r.mode == "processes" => format!(
                "{} replica processes × {} workers, {} backend, {} intake threads each",
                self.replicas, self.workers, self.backend, self.senders
            ),
            _ => format!(
                "{} replicas × {} workers, {} backend, {} platform senders",
                self.replicas, self.workers, self.backend, self.senders
            ),
        };
        let mut s = format!(
            "replay of {path}\n  \
             setup        {setup}, seed {seed}, {speed}\n  \
             handler      {hms} ms ± {jms} ms, turn_wait {tw} ms\n  \
             updates      {u} text messages in {c} chats ({sk} lines skipped)\n  \
             handled      {h}\n  \
             dropped      {dt} (timeout {d0}, lost {d1}, backend {d2}, shutting_down {d3})\n  \
             duplicates   {dup}\n  \
             failed       {f}\n  \
             violations   {v} (order {o}, overlap {ov}, fencing {t}, ended twice {e2})\n  \
             handovers    {ho}\n  \
             wall time    {wall:.3} s\n  \
             throughput   {mps:.0} messages/s\n  \
             turn wait    p50 {p50}, p99 {p99}, max {max}\n",
            path = self.updates_path,
            seed = self.seed,
            hms = self.handler_ms,
            jms = self.handler_jitter_ms,
            tw = self.turn_wait_ms,
            u = self.updates,
            c = self.chats,
            sk = self.skipped_lines,
            h = self.handled,
            dt = self.dropped_total(),
            d0 = d[0],
            d1 = d[1],
            d2 = d[2],
            d3 = d[3],
            dup = self.duplicates,
            f = self.failed,
            v = self.violations(),
            o = self.order_violations,
            ov = self.overlap_violations,
            t = self.token_violations,
            e2 = self.ended_twice,
            ho = self.handovers,
            wall = self.wall_s,
            mps = self.messages_per_s,
            p50 = us(self.wait_p50_us),
            p99 = us(self.wait_p99_us),
            max = us(self.wait_max_us),
        );
        if let Some(r) = &self.redis {
            s.push_str(&format!(
                "  redis        {}, key prefix {}, lease TTL {} ms\n",
                r.servers, r.key_prefix, r.lease_ttl_ms
            ));
            if r.mode == "processes" {
                let killed = match (&r.killed, r.kill_replica_at) {
                    (Some((name, at)), _) => {
                        format!("{name} SIGKILLed after {at} deliveries")
                    }
                    (None, Some(f)) => format!("none (asked for at {f})"),
                    (None, None) => "none".to_owned(),
                };
                s.push_str(&format!(
                    "  killed       {killed}\n  \
                     redelivered  {} (handled {}, retried after a duplicate answer {}, ended twice {})\n  \
                     part files   {} handled line(s) recovered, {} silent loss(es)\n",
                    r.redelivered,
                    r.redelivered_handled,
                    r.redelivery_retries,
                    r.redelivered_ended_twice,
                    r.recovered,
                    r.silent_losses
                ));
            }
        }
        if let Some((lines, _)) = self.redis.as_ref().and_then(|r| r.cost.as_ref()) {
            s.push_str(lines);
        }
        if !self.notes.is_empty() {
            s.push_str(&format!("  note         {}\n", self.notes));
        }
        s.push_str(if self.is_clean() {
            "  result       clean"
        } else {
            "  result       NOT CLEAN"
        });
        s
    }

    /// The one-line JSON record (bench/FORMAT.md, `"workload": "replay"`).
    ///
    /// # Errors
    /// Only if serialisation fails, which plain numbers and strings do not.
    pub fn json(&self) -> Result<String, serde_json::Error> {
        let round = |v: f64| (v * 10.0).round() / 10.0;
        let processes = self.redis.as_ref().filter(|r| r.mode == "processes");
        let record = Record {
            peer: format!("botmesh-{}", self.backend),
            workload: "replay",
            params: Params {
                updates: &self.updates_path,
                backend: &self.backend,
                replicas: self.replicas,
                workers: self.workers,
                senders: self.senders,
                seed: self.seed,
                handler_ms: self.handler_ms,
                handler_jitter_ms: self.handler_jitter_ms,
                speed: self.speed,
                turn_wait_ms: self.turn_wait_ms,
                mode: self.redis.as_ref().map(|r| r.mode),
                lease_ttl_ms: self.redis.as_ref().map(|r| r.lease_ttl_ms),
                kill_replica_at: self.redis.as_ref().and_then(|r| r.kill_replica_at),
            },
            ops_per_s: round(self.messages_per_s),
            p50_us: self.wait_p50_us.map(round),
            p99_us: self.wait_p99_us.map(round),
            exclusion_violations: self.overlap_violations,
            max_streak: None,
            notes: &self.notes,
            extra: Extra {
                handled: self.handled,
                dropped: Dropped {
                    timeout: self.dropped[0],
                    lost: self.dropped[1],
                    backend: self.dropped[2],
                    shutting_down: self.dropped[3],
                },
                duplicates: self.duplicates,
                failed: self.failed,
                order_violations: self.order_violations,
                token_violations: self.token_violations,
                overlap_violations: self.overlap_violations,
                ended_twice: self.ended_twice,
                handovers: self.handovers,
                updates: self.updates,
                chats: self.chats,
                skipped_lines: self.skipped_lines,
                wall_s: (self.wall_s * 1000.0).round() / 1000.0,
                wait_max_us: self.wait_max_us.map(round),
                key_prefix: self.redis.as_ref().map(|r| r.key_prefix.as_str()),
                killed: self
                    .redis
                    .as_ref()
                    .and_then(|r| r.killed.as_ref())
                    .map(|(name, _)| name.as_str()),
                redelivered: processes.map(|r| r.redelivered),
                redelivered_handled: processes.map(|r| r.redelivered_handled),
                redelivery_retries: processes.map(|r| r.redelivery_retries),
                recovered: processes.map(|r| r.recovered),
                silent_losses: processes.map(|r| r.silent_losses),
                redis_stats: self
                    .redis
                    .as_ref()
                    .and_then(|r| r.cost.as_ref())
                    .map(|c| &c.1),
            },
        };
        serde_json::to_string(&record)
    }
}

#[derive(Serialize)]
struct Record<'a> {
    peer: String,
    workload: &'a str,
    params: Params<'a>,
    ops_per_s: f64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    exclusion_violations: u64,
    max_streak: Option<u64>,
    notes: &'a str,
    extra: Extra<'a>,
}

#[derive(Serialize)]
struct Params<'a> {
    updates: &'a str,
    backend: &'a str,
    replicas: usize,
    workers: usize,
    senders: usize,
    seed: u64,
    handler_ms: f64,
    handler_jitter_ms: f64,
    speed: Option<f64>,
    turn_wait_ms: u128,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_ttl_ms: Option<u128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kill_replica_at: Option<f64>,
}

#[derive(Serialize)]
struct Extra<'a> {
    handled: u64,
    dropped: Dropped,
    duplicates: u64,
    failed: u64,
    order_violations: u64,
    token_violations: u64,
    overlap_violations: u64,
    ended_twice: u64,
    handovers: u64,
    updates: usize,
    chats: usize,
    skipped_lines: usize,
    wall_s: f64,
    wait_max_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_prefix: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    killed: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redelivered: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redelivered_handled: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redelivery_retries: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    recovered: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    silent_losses: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redis_stats: Option<&'a serde_json::Value>,
}

#[derive(Serialize)]
struct Dropped {
    timeout: u64,
    lost: u64,
    backend: u64,
    shutting_down: u64,
}

/// Exact nearest-rank percentile `q` (0..=1) of sorted samples.
pub fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}
