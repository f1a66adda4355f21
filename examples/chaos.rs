//! # chaos: the replay under injected faults
//!
//! ```text
//! cargo run --release --example chaos                                # 20 faults, seed 1
//! cargo run --release --example chaos -- --faults 200 --seed 7 --log chaos.jsonl
//! cargo run --release --example chaos -- --faults 50 --kinds pause,blackhole --json
//! cargo run --release --example chaos -- --help
//! ```
//!
//! The harness starts its own `redis-server` on a free loopback port, a TCP proxy on
//! loopback in front of it (`chaos/proxy.rs`), and `--replicas` replica processes that
//! reach Redis only through the proxy. It then plays the platform exactly as
//! `replay --backend redis --processes` does (the same modules: `replay/parent.rs`,
//! `replay/child.rs`, …): each chat's next update goes to a random live replica once
//! the previous one was accepted, first deliveries paced at `--rate` per second, and a
//! replica that dies has what it accepted but did not finish redelivered.
//!
//! Meanwhile it injects `--faults` faults drawn from `--seed` (`chaos/faults.rs`), one
//! after another with 0.1–0.5 s between them:
//!
//! | kind | what | how long |
//! | --- | --- | --- |
//! | `kill` | SIGKILL of a replica; a new process (a new replica id) takes its place | replaced after 0–0.5 s |
//! | `pause` | SIGSTOP of a replica, then SIGCONT | 1.2–2 × the lease TTL |
//! | `redis_restart` | Redis SIGKILLed, started again on its port from its append-only file (fsync per write) | down 0.05–1 s |
//! | `pubsub_kill` | `CLIENT KILL TYPE pubsub` on an admin connection | an instant |
//! | `jitter` | every chunk through the proxy delayed 0–5 ms | 0.5–2 s |
//! | `blackhole` | the proxy holds every byte (bytes flow again after) | 0.2–1.5 × TTL |
//! | `cut` | the proxy shuts every open connection | an instant |
//! | `busy` | two `sh -c 'while :; do :; done'` per core, killed after | 0.5–2 s |
//!
//! The input is looped (each round's `update_id`s and `message_id`s shifted past the
//! previous round's) until the last fault is over; then the last round drains.
//!
//! ## What it checks
//!
//! Everything the replay's platform checks (SPEC §11: order, no overlap, fencing
//! tokens; every update ended exactly once, at least once when redelivered), with the
//! replicas' part files merged (a `handled` line a killed replica wrote before it could
//! report it; see `replay/parts.rs`). On top of that:
//!
//! - **silent losses**: updates that never ended, or ended only as `duplicate` with no
//!   `handled` line anywhere;
//! - **drops**: each `dropped` must be explained by a fault (`chaos/judge.rs` has the
//!   rules: which fault may cause which reason, on which replica, in which window), or
//!   by a stall of the link that the probe saw (`chaos/probe.rs`: a ping to Redis
//!   through the proxy slower than the renewal period); the rest are unexplained;
//! - **late**: updates that ended more than `turn_wait` + 5 s after their latest
//!   delivery (a wait ends by its deadline whatever the faults; the 5 s cover a
//!   release held up by a paused Redis or a cut link).
//!
//! ## Output
//!
//! A line on stderr per fault and a progress line a second; at the end a human summary
//! and a few examples of each problem found, then the JSON summary as the last line on
//! stdout (`--json`: stdout holds only that line):
//!
//! ```text
//! {"faults":{"kill":3,"pause":2,…},"updates":…,"handled":…,"dropped":{"timeout":0,…},
//!  "redelivered":…,"violations":{"overlap":0,"order":0,"fence":0,"ended_twice":0},
//!  "silent_losses":0,"unexplained_drops":0,…,"ok":true}
//! ```
//!
//! `--log PATH` writes the replay's event log to PATH and the faults to `PATH.faults`
//! (`{"event":"fault","kind":"pause","replica":"r2","start_us":…,"end_us":…}`, and
//! `{"event":"stall","start_us":…,"end_us":…}` for the probe's stalls, times in
//! µs since the Unix epoch like the log's `at_us`, `start_us` and `end_us`), so an
//! independent checker can redo the attribution. Exit status 0 when there were no
//! violations, no silent losses, no unexplained drops and no late endings (and every
//! fault was injected), 1 otherwise, 2 when the command line or the set-up failed.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

#[path = "chaos/args.rs"]
mod chaos_args;
#[path = "chaos/faults.rs"]
mod faults;
#[path = "chaos/judge.rs"]
mod judge;
#[path = "chaos/probe.rs"]
mod probe;
#[path = "chaos/proxy.rs"]
mod proxy;
#[path = "chaos/resp.rs"]
mod resp;
#[path = "common/signals.rs"]
mod signals;
#[path = "common/stderr_log.rs"]
mod stderr_log;

// The replay's modules, shared: the platform, the replica processes, the log. The
// parts only the replay's other modes use are unused here.
#[allow(dead_code)]
#[path = "replay/args.rs"]
mod args;
#[allow(dead_code)]
#[path = "replay/backend.rs"]
mod backend;
#[path = "replay/child.rs"]
mod child;
#[allow(dead_code)]
#[path = "replay/common.rs"]
mod common;
#[path = "replay/data.rs"]
mod data;
#[allow(dead_code)]
#[path = "replay/parent.rs"]
mod parent;
#[path = "replay/parts.rs"]
mod parts;
#[path = "replay/procs.rs"]
mod procs;
#[path = "replay/protocol.rs"]
mod protocol;
// The chaos harness writes its own summary; it uses the log side of this module.
#[allow(dead_code)]
#[path = "replay/report.rs"]
mod report;

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use chaos_args::{ChaosOptions, Command};
use faults::{Chaos, Seen};
use parent::{EarlyDuplicates, Finished, Pace};
use redis_server::RedisServer;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // The replica processes are this program again, started by the platform with the
    // replay's hidden flags.
    if argv.iter().any(|a| a == "--child-replica") {
        return match args::parse(argv) {
            Ok(args::Command::Run(o)) => match &o.child_replica {
                Some(name) => child::run(&o, name),
                None => ExitCode::from(2),
            },
            Ok(args::Command::Help) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("chaos replica: {e}");
                ExitCode::from(2)
            }
        };
    }
    // SIGTERM / SIGINT: the replica processes stop cleanly, then the redis-server.
    if let Err(e) = signals::stop_children_on_signal("chaos") {
        eprintln!("chaos: cannot install the signal handler: {e}");
        return ExitCode::FAILURE;
    }
    let o = match chaos_args::parse(argv) {
        Ok(Command::Run(o)) => o,
        Ok(Command::Help) => {
            let _ = writeln!(std::io::stdout(), "{}", chaos_args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("chaos: {e}");
            eprintln!("chaos: run with --help to see the options");
            return ExitCode::from(2);
        }
    };
    let result = chaos(&o);
    // A signal stop under way ends the process with its own status.
    signals::park_if_stopping();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

/// The replay's options for the platform and its replicas, through the replay's own
/// parser so that they get the same checks.
fn replay_options(o: &ChaosOptions, url: &str) -> Result<args::Options, String> {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut argv: Vec<OsString> =
        vec!["chaos".into(), "--updates".into(), o.updates.clone().into()];
    for (flag, value) in [
        ("--backend", "redis".to_owned()),
        ("--redis-url", url.to_owned()),
        (
            "--key-prefix",
            format!("chaos-{}-{nanos}", std::process::id()),
        ),
        ("--lease-ttl", ms(o.lease_ttl)),
        ("--turn-wait", ms(o.turn_wait)),
        ("--replicas", o.replicas.to_string()),
        ("--workers", o.workers.to_string()),
        ("--seed", o.seed.to_string()),
        ("--handler-ms", o.handler_ms.to_string()),
        ("--max-backlog", o.max_backlog.to_string()),
    ] {
        argv.push(flag.into());
        argv.push(value.into());
    }
    argv.push("--processes".into());
    if let Some(log) = &o.log {
        argv.push("--log".into());
        argv.push(log.clone().into());
    }
    match args::parse(argv)? {
        args::Command::Run(options) => Ok(*options),
        args::Command::Help => Err("unexpected --help".to_owned()),
    }
}

fn chaos(o: &ChaosOptions) -> Result<bool, String> {
    // The input is read before anything starts, so a bad path fails at once; the
    // proxy's address is filled in once it listens.
    let mut ro = replay_options(o, "redis://127.0.0.1:0")?;
    let trace = common::load_trace(&ro)?;
    if trace.entries.is_empty() {
        return Err(format!(
            "--updates: {} holds no text message",
            o.updates.display()
        ));
    }
    // Persistent (append-only file, fsync per write): a restart keeps the queues, as a
    // production coordinator's Redis must for FIFO to survive it (a restart that loses
    // the data keeps exclusion and fencing, not the order of the messages queued then).
    let mut server = RedisServer::try_start_persistent()?;
    let proxy = proxy::Proxy::start(server.port(), o.seed)?;
    ro.redis_url = Some(proxy.url());
    let settings = backend::RedisSettings::of(&ro).ok_or("the Redis settings are missing")?;
    let plan = faults::plan(o.seed, o.faults, &o.kinds, o.lease_ttl, o.replicas);
    let mut director = Chaos::new(plan, o.replicas, &mut server, &proxy);
    let link_probe = probe::Probe::start(proxy.port(), director.watched.clone());
    // A `duplicate` is final here, as it is for a webhook platform: the harness must
    // see whether botmesh's "handled or will be" holds.
    let finished = parent::run(
        &ro,
        &settings,
        trace,
        (Pace::Rate(o.rate), EarlyDuplicates::Final),
        &mut director,
    )?;
    let probe::Seen { pings, waits } = link_probe.stop();
    let seen = std::mem::take(&mut director.seen);
    let failed_faults = std::mem::take(&mut director.failed);
    let origin = director.started.unwrap_or_else(std::time::Instant::now);
    drop(director);
    // A ping slower than the renewal period: no renewal could have landed in time.
    let stalls = probe::stalls(&pings, o.lease_ttl / 3, origin);
    let probe_stats = probe::stats(&pings, &stalls, &waits);
    let waits = probe::waits(&waits, origin);

    if let Some(log) = &o.log {
        write_faults(log, &seen, &stalls)?;
    }
    let verdict = judge::judge(&finished.drops, &seen, &stalls, &waits, o);
    if let Some(log) = &o.log {
        write_unexplained(log, &verdict)?;
    }
    let summary = judge::summary(&judge::Inputs {
        o,
        finished: &finished,
        verdict: &verdict,
        faults: &seen,
        probe: &probe_stats,
        failed_faults: &failed_faults,
    });
    let line = serde_json::to_string(&summary)
        .map_err(|e| format!("cannot write the JSON summary: {e}"))?;
    let human = human(o, &finished, &verdict, &seen, &probe_stats);
    // A closed stdout (`| head`) is not worth a panic; the exit status still tells.
    if o.json {
        eprintln!("{human}");
    } else {
        let _ = writeln!(std::io::stdout(), "{human}");
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    Ok(summary.ok)
}

#[derive(Serialize)]
struct FaultLine<'a> {
    event: &'static str,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    replica: Option<&'a str>,
    start_us: u64,
    end_us: u64,
    length_ms: u128,
    #[serde(skip_serializing_if = "str::is_empty")]
    detail: &'a str,
}

/// Writes the faults beside the log, on the log's clock (µs since the Unix epoch).
/// One unexplained drop, for the summary and `PATH.unexplained`.
fn describe_unexplained(u: &judge::Unexplained) -> String {
    let d = &u.drop;
    format!(
        "update_id {} {} on {} (sent at {:.3} s, dropped at {:.3} s{}), during: {}",
        d.update_id,
        d.reason,
        d.replica.as_deref().unwrap_or("-"),
        d.sent.as_secs_f64(),
        d.at.as_secs_f64(),
        if d.redelivered { ", redelivered" } else { "" },
        if u.during.is_empty() {
            "no fault".to_owned()
        } else {
            u.during.join(", ")
        }
    )
}

/// Every drop no fault explains, one line each, to `PATH.unexplained` (the summary
/// shows a few).
fn write_unexplained(log: &std::path::Path, verdict: &judge::Verdict) -> Result<(), String> {
    let mut path = log.as_os_str().to_owned();
    path.push(".unexplained");
    let path = std::path::PathBuf::from(path);
    let mut text = String::new();
    for u in &verdict.unexplained {
        text.push_str(&describe_unexplained(u));
        text.push('\n');
    }
    std::fs::write(&path, text).map_err(|e| format!("--log: cannot write {}: {e}", path.display()))
}

/// One JSON value and a newline.
fn json_line(
    out: &mut impl Write,
    value: &impl Serialize,
    path: &std::path::Path,
) -> Result<(), String> {
    serde_json::to_writer(&mut *out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(|e| format!("--log: cannot write {}: {e}", path.display()))
}

#[derive(Serialize)]
struct StallLine {
    event: &'static str,
    start_us: u64,
    end_us: u64,
}

fn write_faults(
    log: &std::path::Path,
    seen: &[Seen],
    stalls: &[probe::Stall],
) -> Result<(), String> {
    let mut path = log.as_os_str().to_owned();
    path.push(".faults");
    let path = std::path::PathBuf::from(path);
    let file =
        File::create(&path).map_err(|e| format!("--log: cannot create {}: {e}", path.display()))?;
    let mut out = BufWriter::new(file);
    for s in seen {
        let line = FaultLine {
            event: "fault",
            kind: s.kind.name(),
            replica: s.replica.as_deref(),
            start_us: s.start_us,
            end_us: s.end_us,
            length_ms: s.length.as_millis(),
            detail: &s.detail,
        };
        json_line(&mut out, &line, &path)?;
    }
    for s in stalls {
        let line = StallLine {
            event: "stall",
            start_us: s.start_us,
            end_us: s.end_us,
        };
        json_line(&mut out, &line, &path)?;
    }
    out.flush()
        .map_err(|e| format!("--log: cannot write {}: {e}", path.display()))
}

/// The human summary, with a few examples of each problem.
fn human(
    o: &ChaosOptions,
    f: &Finished,
    v: &judge::Verdict,
    seen: &[Seen],
    probe: &probe::ProbeStats,
) -> String {
    let mut s = String::new();
    let c = &f.counts;
    let kinds: Vec<String> = faults::Kind::ALL
        .iter()
        .map(|k| {
            format!(
                "{} {}",
                k.name(),
                seen.iter().filter(|s| s.kind == *k).count()
            )
        })
        .collect();
    s.push_str(&format!(
        "chaos run, seed {}, {} replicas × {} workers, lease TTL {} ms, turn_wait {} ms, {} deliveries/s\n",
        o.seed,
        o.replicas,
        o.workers,
        o.lease_ttl.as_millis(),
        o.turn_wait.as_millis(),
        o.rate
    ));
    s.push_str(&format!(
        "  faults       {} ({})\n",
        seen.len(),
        kinds.join(", ")
    ));
    s.push_str(&format!(
        "  updates      {} ({} round(s)), handled {} (+{} recovered from part files), duplicates {}, failed {}\n",
        f.trace.entries.len(),
        f.trace.entries.len().checked_div(f.round_len).unwrap_or(0),
        c.handled,
        c.recovered,
        c.duplicates,
        c.failed
    ));
    s.push_str(&format!(
        "  dropped      timeout {}, lost {}, backend {}, shutting_down {}; explained {:?}, unexplained {}\n",
        c.dropped[0],
        c.dropped[1],
        c.dropped[2],
        c.dropped[3],
        v.explained,
        v.unexplained.len()
    ));
    s.push_str(&format!(
        "  redelivered  {} (retried after an early duplicate {}, ended twice {})\n",
        c.redelivered, c.retries, c.redelivered_ended_twice
    ));
    s.push_str(&format!(
        "  violations   overlap {}, order {}, fence {}, ended twice {}\n",
        f.overlap, f.order, f.fence, c.ended_twice
    ));
    s.push_str(&format!(
        "  silent       {} lost silently; {} late (> turn_wait + 5 s), slowest {} ms\n",
        f.silent.len(),
        f.late,
        f.slowest.as_millis()
    ));
    s.push_str(&format!(
        "  void runs    {} handler run(s) the part files show whose turn the replica reported lost (fence-checked only)\n",
        c.ran_then_dropped
    ));
    s.push_str(&format!(
        "  link probe   {} pings ({} failed), round trip p50 {} ms, p99 {} ms, max {} ms; {} stall(s) of ≥ TTL/3, {} ms in all; renewal threads waited {} ms for a CPU (at most {} ms between samples)\n",
        probe.pings, probe.failed, probe.p50_ms, probe.p99_ms, probe.max_ms, probe.stalls, probe.stalled_ms,
        probe.renewal_cpu_wait_ms, probe.renewal_cpu_wait_max_ms
    ));
    s.push_str(&format!("  wall time    {:.1} s\n", f.wall.as_secs_f64()));
    for v in f.violations.iter().take(8) {
        s.push_str(&format!("  violation    {v}\n"));
    }
    for u in v.unexplained.iter().take(8) {
        s.push_str(&format!("  unexplained  {}\n", describe_unexplained(u)));
    }
    for l in f.silent.iter().take(8) {
        s.push_str(&format!(
            "  silent loss  update_id {} chat {} {} (last sent to {}{})\n",
            l.update_id,
            l.chat,
            l.how,
            l.sent_to.as_deref().unwrap_or("-"),
            if l.redelivered { ", redelivered" } else { "" }
        ));
    }
    for n in f.notes.iter().take(8) {
        s.push_str(&format!("  note         {n}\n"));
    }
    s.push_str(if f.stalled {
        "  result       STALLED"
    } else {
        "  result       finished"
    });
    s
}
