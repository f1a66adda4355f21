//! The chaos harness's command line, parsed with `lexopt`. Every refusal names the flag
//! and the value it got.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::faults::Kind;

/// The text `--help` prints.
pub const USAGE: &str = "\
Replays Telegram `Update` JSON lines through botmesh replica processes over a Redis server
it starts itself, injecting seeded faults (SIGKILL and SIGSTOP of replicas, Redis restarts,
killed subscriber connections, network jitter, blackholes and cuts, busy CPUs), then checks
order, exclusion, fencing, that every update ended, and that every drop has a fault to
explain it.

usage: cargo run --release --example chaos -- [options]

options:
  --updates PATH        Update JSON lines to replay, looped until the faults are done
                        [default: examples/data/chitchat-slice.jsonl]
  --faults N            faults to inject, one after another [default: 20]
  --seed S              seed of the fault plan, of the replica choice and of the work [default: 1]
  --kinds LIST          comma-separated fault kinds to draw from [default: all]:
                        kill,pause,redis_restart,pubsub_kill,jitter,blackhole,cut,busy
  --replicas N          replica processes (2 to 64) [default: 4]
  --workers W           worker threads per replica [default: 4]
  --rate R              first deliveries per second [default: 1000]
  --handler-ms MS       simulated work per message, in ms [default: 3]
  --lease-ttl DURATION  lease TTL, e.g. 1s, 500ms [default: 1s]
  --turn-wait DURATION  longest wait for a chat's turn [default: 10s]
  --max-backlog N       a chat's next update waits while N of its updates were accepted and
                        have not ended (Telegram holds updates for a slow bot) [default: 50]
  --log PATH            the replay's event log (JSON lines); the faults go to PATH.faults
  --json                stdout is only the JSON summary (the human one goes to stderr)
  -h, --help            print this help

The last line on stdout is always the JSON summary. Exit status: 0 when there were no
violations, no silent losses, no unexplained drops and every fault was injected; 1 when
one of those failed; 2 when the command line, the input or the set-up could not be used.";

/// What the command line asks for.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    pub updates: PathBuf,
    pub faults: usize,
    pub seed: u64,
    pub kinds: Vec<Kind>,
    pub replicas: usize,
    pub workers: usize,
    pub rate: f64,
    pub handler_ms: f64,
    pub lease_ttl: Duration,
    pub turn_wait: Duration,
    pub max_backlog: usize,
    pub log: Option<PathBuf>,
    pub json: bool,
}

/// The result of reading the command line.
pub enum Command {
    Run(Box<ChaosOptions>),
    Help,
}

/// Reads the command line (the program name first).
///
/// # Errors
/// A one-line message naming the flag and the value that was refused.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    use lexopt::prelude::*;

    let mut o = ChaosOptions {
        updates: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join("data")
            .join("chitchat-slice.jsonl"),
        faults: 20,
        seed: 1,
        kinds: Kind::ALL.to_vec(),
        replicas: 4,
        workers: 4,
        rate: 1000.0,
        handler_ms: 3.0,
        lease_ttl: Duration::from_secs(1),
        turn_wait: Duration::from_secs(10),
        max_backlog: 50,
        log: None,
        json: false,
    };
    let mut parser = lexopt::Parser::from_iter(args);
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("updates") => o.updates = PathBuf::from(value(&mut parser, "--updates")?),
            Long("faults") => o.faults = whole(&mut parser, "--faults", 0, 1_000_000)?,
            Long("seed") => {
                let v = text(&mut parser, "--seed")?;
                o.seed = v.parse().map_err(|_| {
                    format!("--seed: {v:?} is not a whole number from 0 to {}", u64::MAX)
                })?;
            }
            Long("kinds") => {
                let v = text(&mut parser, "--kinds")?;
                let mut kinds = Vec::new();
                for name in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let kind = Kind::from_name(name).ok_or_else(|| {
                        format!(
                            "--kinds: {name:?} (in {v:?}) is not a fault kind; use some of {}",
                            Kind::ALL.map(Kind::name).join(",")
                        )
                    })?;
                    if !kinds.contains(&kind) {
                        kinds.push(kind);
                    }
                }
                if kinds.is_empty() {
                    return Err(format!("--kinds: {v:?} names no fault kind"));
                }
                o.kinds = kinds;
            }
            Long("replicas") => o.replicas = whole(&mut parser, "--replicas", 2, 64)?,
            Long("workers") => o.workers = whole(&mut parser, "--workers", 1, 256)?,
            Long("rate") => {
                let v = text(&mut parser, "--rate")?;
                match v.parse::<f64>() {
                    Ok(r) if r.is_finite() && (1.0..=1_000_000.0).contains(&r) => o.rate = r,
                    _ => {
                        return Err(format!(
                            "--rate: {v:?} is not a number of deliveries per second from 1 to 1000000"
                        ));
                    }
                }
            }
            Long("handler-ms") => {
                let v = text(&mut parser, "--handler-ms")?;
                match v.parse::<f64>() {
                    Ok(ms) if ms.is_finite() && (0.0..=60_000.0).contains(&ms) => {
                        o.handler_ms = ms;
                    }
                    _ => {
                        return Err(format!(
                            "--handler-ms: {v:?} is not a number of milliseconds from 0 to 60000"
                        ));
                    }
                }
            }
            Long("lease-ttl") => {
                o.lease_ttl = duration(
                    &mut parser,
                    "--lease-ttl",
                    Duration::from_millis(100),
                    Duration::from_secs(60),
                )?;
            }
            Long("turn-wait") => {
                o.turn_wait = duration(
                    &mut parser,
                    "--turn-wait",
                    Duration::from_millis(100),
                    Duration::from_secs(3600),
                )?;
            }
            Long("max-backlog") => {
                o.max_backlog = whole(&mut parser, "--max-backlog", 1, 1_000_000)?;
            }
            Long("log") => o.log = Some(PathBuf::from(value(&mut parser, "--log")?)),
            Long("json") => o.json = true,
            Short('h') | Long("help") => return Ok(Command::Help),
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    Ok(Command::Run(Box::new(o)))
}

fn value(parser: &mut lexopt::Parser, flag: &str) -> Result<OsString, String> {
    parser.value().map_err(|_| format!("{flag}: missing value"))
}

fn text(parser: &mut lexopt::Parser, flag: &str) -> Result<String, String> {
    value(parser, flag)?
        .into_string()
        .map_err(|v| format!("{flag}: {v:?} is not valid UTF-8"))
}

fn whole(parser: &mut lexopt::Parser, flag: &str, lo: usize, hi: usize) -> Result<usize, String> {
    let v = text(parser, flag)?;
    match v.parse::<usize>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag}: {v:?} is not a whole number from {lo} to {hi}"
        )),
    }
}

fn duration(
    parser: &mut lexopt::Parser,
    flag: &str,
    lo: Duration,
    hi: Duration,
) -> Result<Duration, String> {
    let v = text(parser, flag)?;
    match humantime::parse_duration(&v) {
        Ok(d) if (lo..=hi).contains(&d) => Ok(d),
        Ok(_) => Err(format!(
            "{flag}: {v:?} is outside {} to {}",
            humantime::format_duration(lo),
            humantime::format_duration(hi)
        )),
        Err(e) => Err(format!(
            "{flag}: {v:?} is not a duration like 1s or 500ms ({e})"
        )),
    }
}
