//! The replay example's command line, parsed with `lexopt`.
//!
//! Every refusal names the flag and the value it got, so `main` can print it as is and
//! exit with status 2.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// The text `--help` prints.
pub const USAGE: &str = "\
Replays Telegram `Update` JSON lines through N botmesh replicas and checks that every
chat's messages ran one at a time, in order, under rising fencing tokens.

usage: cargo run --release --example replay -- [options]

options:
  --updates PATH           Update JSON lines to replay
                           [default: examples/data/chitchat-slice.jsonl]
  --replicas N             replicas sharing one coordinator [default: 4]
  --workers W              worker threads per replica [default: 4]
  --senders S              platform threads delivering updates [default: 4]
  --seed S                 seed of the replica choice and of the handler jitter [default: 1]
  --handler-ms MS          simulated work per message, in ms [default: 0]
  --handler-jitter-ms MS   work varies by up to ± this many ms [default: 0]
  --speed X                replay the original timing X times faster
                           [default: as fast as possible]
  --turn-wait DURATION     longest wait for a chat's turn, e.g. 2m, 1500ms [default: 2m]
  --backend NAME           coordination backend; only `memory` for now [default: memory]
  --log PATH               write one JSON line per update as it ends
  --json                   end stdout with one JSON record (the shared benchmark record format)
  -h, --help               print this help

exit status: 0 when every update was handled with no violation, 1 when an update was
dropped or a check failed, 2 when the command line or the input could not be used.";

/// The largest replica or worker count accepted: each one is a thread (or three).
const MAX_THREADS: usize = 1024;
/// The longest `turn_wait` botmesh accepts: 2^31 − 1 ms, as the TypeScript original.
const MAX_TURN_WAIT: Duration = Duration::from_millis(2_147_483_647);
/// The largest simulated handler time accepted: one hour, in ms.
const MAX_HANDLER_MS: f64 = 3_600_000.0;

/// What the command line asks for.
#[derive(Clone, Debug)]
pub struct Options {
    /// The Update JSON lines to replay.
    pub updates: PathBuf,
    /// How many replicas run over the one coordinator.
    pub replicas: usize,
    /// Worker threads per replica.
    pub workers: usize,
    /// Platform threads delivering updates (each owns a share of the chats).
    pub senders: usize,
    /// Seed of the replica choice and of the per-update handler jitter.
    pub seed: u64,
    /// Simulated handler work, in ms.
    pub handler_ms: f64,
    /// Up to this many ms more or less work per update.
    pub handler_jitter_ms: f64,
    /// Replay the original timing this many times faster; `None`: as fast as possible.
    pub speed: Option<f64>,
    /// Longest a message waits for its chat's turn.
    pub turn_wait: Duration,
    /// The coordination backend's name (only `memory` exists so far).
    pub backend: String,
    /// Where to write the per-update log, if anywhere.
    pub log: Option<PathBuf>,
    /// Whether to end stdout with the JSON record.
    pub json: bool,
}

impl Options {
    fn defaults() -> Options {
        Options {
            updates: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("examples")
                .join("data")
                .join("chitchat-slice.jsonl"),
            replicas: 4,
            workers: 4,
            senders: 4,
            seed: 1,
            handler_ms: 0.0,
            handler_jitter_ms: 0.0,
            speed: None,
            turn_wait: Duration::from_secs(120),
            backend: "memory".to_owned(),
            log: None,
            json: false,
        }
    }
}

/// The result of reading the command line.
#[derive(Debug)]
pub enum Command {
    /// Run the replay with these options.
    Run(Options),
    /// Print the usage and stop.
    Help,
}

/// Reads the command line (the program name first, as `std::env::args_os` gives it).
///
/// # Errors
/// A one-line message naming the flag and the value that was refused.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    use lexopt::prelude::*;

    let mut o = Options::defaults();
    let mut parser = lexopt::Parser::from_iter(args);
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("updates") => o.updates = PathBuf::from(value(&mut parser, "--updates")?),
            Long("replicas") => o.replicas = count(&mut parser, "--replicas")?,
            Long("workers") => o.workers = count(&mut parser, "--workers")?,
            Long("senders") => o.senders = count(&mut parser, "--senders")?,
            Long("seed") => {
                let v = text(&mut parser, "--seed")?;
                o.seed = v.parse().map_err(|_| {
                    format!("--seed: {v:?} is not a whole number from 0 to {}", u64::MAX)
                })?;
            }
            Long("handler-ms") => o.handler_ms = millis(&mut parser, "--handler-ms")?,
            Long("handler-jitter-ms") => {
                o.handler_jitter_ms = millis(&mut parser, "--handler-jitter-ms")?;
            }
            Long("speed") => {
                let v = text(&mut parser, "--speed")?;
                match v.parse::<f64>() {
                    Ok(x) if x.is_finite() && x > 0.0 => o.speed = Some(x),
                    _ => {
                        return Err(format!(
                            "--speed: {v:?} is not a positive number (e.g. 100 replays 100 times faster than the original timing)"
                        ));
                    }
                }
            }
            Long("turn-wait") => {
                let v = text(&mut parser, "--turn-wait")?;
                match humantime::parse_duration(&v) {
                    Ok(d) if d > MAX_TURN_WAIT => {
                        return Err(format!(
                            "--turn-wait: {v:?} is longer than {} ms, the most botmesh accepts",
                            MAX_TURN_WAIT.as_millis()
                        ));
                    }
                    Ok(d) if !d.is_zero() => o.turn_wait = d,
                    Ok(_) => {
                        return Err(format!(
                            "--turn-wait: {v:?} is zero; give a positive duration"
                        ));
                    }
                    Err(e) => {
                        return Err(format!(
                            "--turn-wait: {v:?} is not a duration like 2m or 1500ms ({e})"
                        ));
                    }
                }
            }
            Long("backend") => {
                let v = text(&mut parser, "--backend")?;
                if v != "memory" {
                    return Err(format!(
                        "--backend: {v:?} is not available; only \"memory\" is supported so far"
                    ));
                }
                o.backend = v;
            }
            Long("log") => o.log = Some(PathBuf::from(value(&mut parser, "--log")?)),
            Long("json") => o.json = true,
            Short('h') | Long("help") => return Ok(Command::Help),
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    Ok(Command::Run(o))
}

fn value(parser: &mut lexopt::Parser, flag: &str) -> Result<OsString, String> {
    parser.value().map_err(|_| format!("{flag}: missing value"))
}

fn text(parser: &mut lexopt::Parser, flag: &str) -> Result<String, String> {
    value(parser, flag)?
        .into_string()
        .map_err(|v| format!("{flag}: {v:?} is not valid UTF-8"))
}

fn count(parser: &mut lexopt::Parser, flag: &str) -> Result<usize, String> {
    let v = text(parser, flag)?;
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag}: {v:?} is not a whole number from 1 to {MAX_THREADS}"
        )),
    }
}

fn millis(parser: &mut lexopt::Parser, flag: &str) -> Result<f64, String> {
    let v = text(parser, flag)?;
    match v.parse::<f64>() {
        Ok(ms) if ms.is_finite() && (0.0..=MAX_HANDLER_MS).contains(&ms) => Ok(ms),
        _ => Err(format!(
            "{flag}: {v:?} is not a number of milliseconds from 0 to {MAX_HANDLER_MS}"
        )),
    }
}
