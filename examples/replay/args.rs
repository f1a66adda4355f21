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
  --backend NAME           coordination backend: `memory` (one process) or `redis`
                           [default: memory]
  --redis-url URL          the Redis server, e.g. redis://127.0.0.1:6379 (with --backend redis)
  --redis-cluster URL[,URL…]
                           Redis Cluster seed nodes instead of --redis-url, e.g.
                           redis://127.0.0.1:7000,redis://127.0.0.1:7001
  --redis-sentinel URL[,URL…]
                           sentinels instead of --redis-url (with --sentinel-service)
  --sentinel-service NAME  the service the sentinels monitor, e.g. mymaster
  --key-prefix P           Redis key prefix [default: a fresh replay-<pid>-<nanos> per run]
  --dedup-ids N            handled message ids each chat remembers at least (Redis)
                           [default: the library's, 64]
  --wait-replicas N        replicas that must acknowledge each turn write (Redis
                           `wait_replicas`; for Sentinel or Cluster with replicas) [default: 0]
  --lease-ttl DURATION     Redis lease TTL, e.g. 10s, 2s (with --backend redis) [default: 10s]
  --processes              run each replica as its own OS process (needs --backend redis);
                           --senders is then the intake threads of each replica process
  --kill-replica-at F      with --processes: SIGKILL one replica once the fraction F (0 to 1)
                           of the updates was delivered; its unfinished updates are redelivered
  --max-backlog N          with --processes: the platform holds a chat's next update while N
                           of its updates were accepted and have not ended, as Telegram holds
                           updates for a slow bot [default: no limit]
  --redis-stats            with --backend redis: read INFO and DBSIZE before and after the run
                           and report Redis commands, µs and round trips per message and the
                           memory left behind (the server should run nothing else meanwhile)
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
/// The shortest lease TTL the Redis backend accepts.
const MIN_LEASE_TTL: Duration = Duration::from_millis(10);
/// The longest lease TTL accepted here: one day.
const MAX_LEASE_TTL: Duration = Duration::from_secs(86_400);
/// The environment variable a parent hands the Redis URL to its replica processes in,
/// so that a password in it never shows in the process list.
pub const REDIS_URL_ENV: &str = "BOTMESH_REPLAY_REDIS_URL";
/// As [`REDIS_URL_ENV`], for the cluster seed nodes (comma-separated).
pub const REDIS_CLUSTER_ENV: &str = "BOTMESH_REPLAY_REDIS_CLUSTER";
/// As [`REDIS_URL_ENV`], for the sentinels (comma-separated).
pub const REDIS_SENTINEL_ENV: &str = "BOTMESH_REPLAY_REDIS_SENTINEL";

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
    /// The coordination backend's name: `memory` or `redis`.
    pub backend: String,
    /// The Redis server (with `--backend redis`).
    pub redis_url: Option<String>,
    /// Redis Cluster seed nodes (`--redis-cluster`); empty: not a cluster.
    pub redis_cluster: Vec<String>,
    /// Sentinels (`--redis-sentinel`); empty: no Sentinel.
    pub redis_sentinel: Vec<String>,
    /// The service the sentinels monitor.
    pub sentinel_service: Option<String>,
    /// The Redis key prefix; `None`: a fresh one per run.
    pub key_prefix: Option<String>,
    /// The Redis lease TTL; `None`: the library's default.
    pub lease_ttl: Option<Duration>,
    /// The Redis `dedup_ids` option; `None`: the library's default.
    pub dedup_ids: Option<usize>,
    /// The Redis `wait_replicas` option.
    pub wait_replicas: usize,
    /// Whether each replica runs as its own OS process.
    pub processes: bool,
    /// With `processes`: SIGKILL one replica once this fraction of the updates was
    /// delivered.
    pub kill_replica_at: Option<f64>,
    /// With `processes`: a chat's next update waits while this many of its updates were
    /// accepted and have not ended (a platform holding updates for a slow bot).
    pub max_backlog: Option<usize>,
    /// Set in a replica process the parent started (hidden flag `--child-replica`): this
    /// process is that replica and speaks the line protocol on stdin/stdout.
    pub child_replica: Option<String>,
    /// Set in a replica process (hidden flag `--part`): the file it appends a `handled`
    /// line to before each handler returns, so that a handled update is on record even
    /// when the process is killed before it could report it.
    pub part: Option<PathBuf>,
    /// Whether to read the Redis server's counters before and after the run.
    pub redis_stats: bool,
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
            redis_url: None,
            redis_cluster: Vec::new(),
            redis_sentinel: Vec::new(),
            sentinel_service: None,
            key_prefix: None,
            lease_ttl: None,
            dedup_ids: None,
            wait_replicas: 0,
            processes: false,
            kill_replica_at: None,
            max_backlog: None,
            child_replica: None,
            part: None,
            redis_stats: false,
            log: None,
            json: false,
        }
    }
}

/// The result of reading the command line.
#[derive(Debug)]
pub enum Command {
    /// Run the replay with these options.
    Run(Box<Options>),
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
            Long("max-backlog") => o.max_backlog = Some(count(&mut parser, "--max-backlog")?),
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
                if v != "memory" && v != "redis" {
                    return Err(format!(
                        "--backend: {v:?} is not available; use \"memory\" or \"redis\""
                    ));
                }
                o.backend = v;
            }
            Long("redis-url") => {
                let v = text(&mut parser, "--redis-url")?;
                if !(v.starts_with("redis://")
                    || v.starts_with("rediss://")
                    || v.starts_with("unix://")
                    || v.starts_with("redis+unix://"))
                {
                    // The value is not echoed: it may hold a password.
                    return Err(
                        "--redis-url: not a Redis URL (expected redis://[user:password@]host:port[/db])"
                            .to_owned(),
                    );
                }
                o.redis_url = Some(v);
            }
            Long("redis-cluster") => {
                o.redis_cluster =
                    url_list(&text(&mut parser, "--redis-cluster")?, "--redis-cluster")?;
            }
            Long("redis-sentinel") => {
                o.redis_sentinel =
                    url_list(&text(&mut parser, "--redis-sentinel")?, "--redis-sentinel")?;
            }
            Long("sentinel-service") => {
                let v = text(&mut parser, "--sentinel-service")?;
                if v.trim().is_empty() {
                    return Err("--sentinel-service: the name is empty".to_owned());
                }
                o.sentinel_service = Some(v);
            }
            Long("key-prefix") => {
                let v = text(&mut parser, "--key-prefix")?;
                if v.is_empty() || v.contains(['{', '}']) || v.chars().any(char::is_control) {
                    return Err(format!(
                        "--key-prefix: {v:?} must be non-empty, without braces or control characters"
                    ));
                }
                o.key_prefix = Some(v);
            }
            Long("dedup-ids") => {
                let v = text(&mut parser, "--dedup-ids")?;
                match v.parse::<usize>() {
                    Ok(n) if (1..=botmesh::MAX_DEDUP_IDS).contains(&n) => o.dedup_ids = Some(n),
                    _ => {
                        return Err(format!(
                            "--dedup-ids: {v:?} is not a whole number from 1 to {}",
                            botmesh::MAX_DEDUP_IDS
                        ));
                    }
                }
            }
            Long("wait-replicas") => {
                let v = text(&mut parser, "--wait-replicas")?;
                match v.parse::<usize>() {
                    Ok(n) if n <= botmesh::redis::MAX_WAIT_REPLICAS => o.wait_replicas = n,
                    _ => {
                        return Err(format!(
                            "--wait-replicas: {v:?} is not a whole number from 0 to {}",
                            botmesh::redis::MAX_WAIT_REPLICAS
                        ));
                    }
                }
            }
            Long("lease-ttl") => {
                let v = text(&mut parser, "--lease-ttl")?;
                match humantime::parse_duration(&v) {
                    Ok(d) if (MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&d) => o.lease_ttl = Some(d),
                    Ok(_) => {
                        return Err(format!("--lease-ttl: {v:?} is outside 10ms to 1day"));
                    }
                    Err(e) => {
                        return Err(format!(
                            "--lease-ttl: {v:?} is not a duration like 10s or 500ms ({e})"
                        ));
                    }
                }
            }
            Long("processes") => o.processes = true,
            Long("kill-replica-at") => {
                let v = text(&mut parser, "--kill-replica-at")?;
                match v.parse::<f64>() {
                    Ok(f) if (0.0..=1.0).contains(&f) => o.kill_replica_at = Some(f),
                    _ => {
                        return Err(format!(
                            "--kill-replica-at: {v:?} is not a fraction from 0 to 1 (e.g. 0.5: once half the updates were delivered)"
                        ));
                    }
                }
            }
            Long("child-replica") => {
                let v = text(&mut parser, "--child-replica")?;
                if v.is_empty() {
                    return Err("--child-replica: the replica id is empty".to_owned());
                }
                o.child_replica = Some(v);
            }
            Long("part") => o.part = Some(PathBuf::from(value(&mut parser, "--part")?)),
            Long("log") => o.log = Some(PathBuf::from(value(&mut parser, "--log")?)),
            Long("json") => o.json = true,
            Long("redis-stats") => o.redis_stats = true,
            Short('h') | Long("help") => return Ok(Command::Help),
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    if o.child_replica.is_some() && o.redis_url.is_none() {
        // A replica process gets the URLs from its parent through the environment.
        o.redis_url = std::env::var(REDIS_URL_ENV).ok().filter(|v| !v.is_empty());
        let list = |var| {
            std::env::var(var)
                .map(|v| {
                    v.split(',')
                        .filter(|u| !u.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        o.redis_cluster = list(REDIS_CLUSTER_ENV);
        o.redis_sentinel = list(REDIS_SENTINEL_ENV);
    }
    check_combination(&o)?;
    Ok(Command::Run(Box::new(o)))
}

/// Refuses flags that only make sense together with others.
fn check_combination(o: &Options) -> Result<(), String> {
    let redis = o.backend == "redis";
    let given: Vec<&str> = [
        ("--redis-url", o.redis_url.is_some()),
        ("--redis-cluster", !o.redis_cluster.is_empty()),
        ("--redis-sentinel", !o.redis_sentinel.is_empty()),
    ]
    .iter()
    .filter(|(_, set)| *set)
    .map(|(f, _)| *f)
    .collect();
    if redis && given.is_empty() {
        return Err(
            "--backend redis needs --redis-url URL, --redis-cluster URL[,URL…] or \
             --redis-sentinel URL[,URL…] with --sentinel-service NAME"
                .to_owned(),
        );
    }
    if given.len() > 1 {
        return Err(format!("{}: give only one of them", given.join(", ")));
    }
    if o.redis_sentinel.is_empty() != o.sentinel_service.is_none() {
        return Err("--redis-sentinel and --sentinel-service go together".to_owned());
    }
    let redis_only = [
        ("--redis-url", o.redis_url.is_some()),
        ("--redis-cluster", !o.redis_cluster.is_empty()),
        ("--redis-sentinel", !o.redis_sentinel.is_empty()),
        ("--key-prefix", o.key_prefix.is_some()),
        ("--lease-ttl", o.lease_ttl.is_some()),
        ("--dedup-ids", o.dedup_ids.is_some()),
        ("--wait-replicas", o.wait_replicas > 0),
        ("--processes", o.processes),
        ("--child-replica", o.child_replica.is_some()),
        ("--part", o.part.is_some()),
        ("--redis-stats", o.redis_stats),
    ];
    if let Some((flag, _)) = redis_only.iter().find(|(_, set)| *set && !redis) {
        return Err(format!(
            "{flag}: only with --backend redis (replicas in several processes need a shared server)"
        ));
    }
    if o.kill_replica_at.is_some() {
        if !o.processes {
            return Err("--kill-replica-at: only with --processes".to_owned());
        }
        if o.replicas < 2 {
            return Err(
                "--kill-replica-at: needs --replicas 2 or more (someone must take over)".to_owned(),
            );
        }
    }
    if o.part.is_some() && o.child_replica.is_none() {
        return Err("--part: only for a replica process (--child-replica)".to_owned());
    }
    if o.child_replica.is_some() && o.processes {
        return Err("--child-replica: a replica process does not start processes".to_owned());
    }
    Ok(())
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

/// A comma-separated list of Redis URLs; the value is not echoed (it may hold a
/// password).
fn url_list(v: &str, flag: &str) -> Result<Vec<String>, String> {
    let urls: Vec<String> = v.split(',').map(|u| u.trim().to_owned()).collect();
    for (i, u) in urls.iter().enumerate() {
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            return Err(format!(
                "{flag}: item {} is not a Redis URL (expected redis://host:port[,redis://host:port…])",
                i + 1
            ));
        }
    }
    Ok(urls)
}
