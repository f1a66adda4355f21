//! Provider leadership, end to end: four replica processes over Redis share one
//! exclusive transport session.
//!
//! The demo starts its own `redis-server` on a free loopback port (or uses
//! `--redis-url`), a test messaging platform that allows one session at a time and
//! counts a conflict whenever a newer session replaces a live one (as WhatsApp Web's
//! "replaced" or Telegram's `409 Conflict` would), and four replica processes (this
//! program re-executed with `--child`) whose one provider is exclusive. Then it:
//!
//! 1. waits for a leader to connect, and checks a message round trip through it;
//! 2. SIGKILLs the leader and measures the time the platform goes without a session
//!    until a standby connects (the lease lapses: about one TTL, at most TTL plus one
//!    re-check);
//! 3. stops the new leader cleanly and measures again (the release wakes a standby
//!    at once);
//! 4. SIGTERMs the next leader (its signal thread calls `Bot::stop`) and measures the
//!    hand-over to the last standby;
//! 5. prints the figures, the conflicts seen (0 expected) and one JSON line.
//!
//! ```sh
//! cargo run --release --example leader_demo            # needs redis-server on PATH
//! cargo run --release --example leader_demo -- --redis-url redis://127.0.0.1:6379 --ttl-ms 2000
//! ```
//!
//! Exit status: 0 when every check passed, 1 when one failed, 2 for a bad command line
//! or when Redis cannot be started.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

#[path = "common/signals.rs"]
mod signals;
#[path = "../tests/support/mod.rs"]
mod support;

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use botmesh::{ProviderSession, Token};
use support::RedisServer;
use support::process::{ReplicaConfig, ReplicaProcess, run_replica};
use support::transport::{Event, Server};

const USAGE: &str = "\
Four botmesh replica processes over Redis share one exclusive transport session; the
demo kills the leader, stops the next one cleanly, SIGTERMs the next, and measures each
failover.

usage: cargo run --release --example leader_demo -- [options]

options:
  --redis-url URL   use this Redis server instead of starting one (a fresh key prefix
                    per run keeps runs apart)
  --ttl-ms N        lease TTL in ms [default: 1000]
  -h, --help        print this help

exit status: 0 when every check passed, 1 when one failed, 2 when the command line
could not be used or Redis could not be started.";

struct Options {
    redis_url: Option<String>,
    ttl: Duration,
    child: bool,
}

fn parse() -> Result<Option<Options>, String> {
    use lexopt::prelude::*;
    let mut options = Options {
        redis_url: None,
        ttl: Duration::from_secs(1),
        child: false,
    };
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("redis-url") => {
                let url = parser.value().map_err(|e| e.to_string())?;
                let url = url
                    .into_string()
                    .map_err(|_| "--redis-url: not valid UTF-8".to_owned())?;
                options.redis_url = Some(url);
            }
            Long("ttl-ms") => {
                let v = parser.value().map_err(|e| e.to_string())?;
                let text = v.to_string_lossy().into_owned();
                let ms: u64 = text
                    .parse()
                    .ok()
                    .filter(|ms| (100..=60_000).contains(ms))
                    .ok_or_else(|| {
                        format!("--ttl-ms: {text:?} is not a whole number from 100 to 60000")
                    })?;
                options.ttl = Duration::from_millis(ms);
            }
            Long("child") => options.child = true,
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(Some(options))
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("leader_demo: {e}");
            eprintln!("leader_demo: run with --help to see the options");
            return ExitCode::from(2);
        }
    };
    if options.child {
        return child();
    }
    // SIGTERM / SIGINT: the replica processes stop cleanly, then the redis-server.
    if let Err(e) = signals::stop_children_on_signal("leader_demo") {
        eprintln!("leader_demo: cannot install the signal handler: {e}");
        return ExitCode::from(2);
    }
    let result = demo(&options);
    // A signal stop under way ends the process with its own status.
    signals::park_if_stopping();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("leader_demo: {e}");
            ExitCode::from(2)
        }
    }
}

/// A replica process: its settings come in the environment (so a Redis password never
/// shows in the process list).
fn child() -> ExitCode {
    let Some(cfg) = ReplicaConfig::from_env() else {
        eprintln!("leader_demo --child: started without its environment");
        return ExitCode::from(2);
    };
    match run_replica(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leader_demo replica {}: {e}", cfg.id);
            ExitCode::from(1)
        }
    }
}

/// How long any one step may take before the demo gives up.
fn patience(ttl: Duration) -> Duration {
    (ttl * 10).max(Duration::from_secs(10))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The checks and figures of one run.
struct Run {
    ok: bool,
    crash: Option<Duration>,
    clean: Option<Duration>,
    sigterm: Option<Duration>,
}

impl Run {
    fn check(&mut self, ok: bool, what: &str) {
        if !ok {
            println!("CHECK FAILED: {what}");
            self.ok = false;
        }
    }
}

fn demo(options: &Options) -> Result<bool, String> {
    let own_redis = match &options.redis_url {
        Some(_) => None,
        None => Some(RedisServer::try_start().map_err(|e| format!("{e}; or pass --redis-url"))?),
    };
    let redis_url = match (&options.redis_url, &own_redis) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => server.url(),
        (None, None) => return Err("no Redis server".to_owned()),
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let key_prefix = format!("leader-demo-{}-{nanos}", std::process::id());
    let ttl = options.ttl;
    let platform = Server::start(true);
    let shown_redis = if own_redis.is_some() {
        redis_url.as_str()
    } else {
        "the server given with --redis-url"
    };
    println!(
        "4 replicas over Redis ({shown_redis}), lease TTL {} ms; exclusive test platform on {}",
        ttl.as_millis(),
        platform.addr()
    );
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let spawn = |id: &str| {
        let cfg = ReplicaConfig {
            id: id.to_owned(),
            redis_url: redis_url.clone(),
            key_prefix: key_prefix.clone(),
            server: platform.addr(),
            ttl,
            provider_down: Duration::from_secs(60),
            session: ProviderSession::Leader,
            exclusive: true,
        };
        signals::park_if_stopping();
        let mut command = Command::new(&exe);
        command.arg("--child");
        ReplicaProcess::spawn(command, &cfg)
    };
    let mut replicas = Vec::new();
    for id in ["r1", "r2", "r3", "r4"] {
        replicas.push(spawn(id)?);
    }
    let wait = patience(ttl);
    let mut run = Run {
        ok: true,
        crash: None,
        clean: None,
        sigterm: None,
    };

    let Some((first, t1, _)) = platform.wait_opened(wait) else {
        println!("CHECK FAILED: no replica connected within {wait:?}");
        return Ok(false);
    };
    println!("{first} leads (token {})", show(t1));
    round_trip(&platform, &mut run, "hello 1", &first, t1, wait);
    // A crash comes at any moment: the kill lands at a pseudo-random point of the
    // leader's renewal cycle (TTL/3), not right after its grant, so that runs sample
    // the whole range of crash failovers (about TTL − TTL/3 to TTL + TTL/3).
    let phase = u32::try_from(nanos % 1000).unwrap_or(0);
    std::thread::sleep(ttl / 2 + ttl / 3 * phase / 1000);

    let Some(at) = replicas.iter().position(|r| r.id == first) else {
        return Err(format!("unknown leader {first}"));
    };
    let mut victim = replicas.remove(at);
    let killed = Instant::now();
    victim.kill();
    let Some((second, t2, opened)) = platform.wait_opened(wait) else {
        println!("CHECK FAILED: no standby took over within {wait:?} of the crash");
        return Ok(false);
    };
    let closed = closed_at(&platform, &first, t1).unwrap_or(killed);
    let crash = opened.saturating_duration_since(closed);
    run.crash = Some(crash);
    println!(
        "SIGKILL {first} -> {second} leads (token {}) after {:.1} ms without a session \
         (bound: TTL + one re-check = {} ms)",
        show(t2),
        ms(crash),
        (ttl + ttl / 3).as_millis()
    );
    run.check(second != first, "a standby took over");
    run.check(t2 > t1, "the new leader's token is greater");
    run.check(
        crash <= ttl * 2,
        "the crash failover stayed within twice the TTL",
    );
    round_trip(&platform, &mut run, "hello 2", &second, t2, wait);

    let Some(at) = replicas.iter().position(|r| r.id == second) else {
        return Err(format!("unknown leader {second}"));
    };
    let stopping = replicas.remove(at);
    run.check(stopping.stop(wait), "the leader stopped cleanly");
    let Some((third, t3, opened)) = platform.wait_opened(wait) else {
        println!("CHECK FAILED: no standby took over within {wait:?} of the clean stop");
        return Ok(false);
    };
    let closed = closed_at(&platform, &second, t2).unwrap_or(opened);
    let clean = opened.saturating_duration_since(closed);
    run.clean = Some(clean);
    println!(
        "clean stop of {second} -> {third} leads (token {}) after {:.1} ms without a session",
        show(t3),
        ms(clean)
    );
    run.check(third != second, "a standby took over");
    run.check(t3 > t2, "the new leader's token is greater");
    run.check(clean < ttl / 3, "the clean failover beat the re-check");
    round_trip(&platform, &mut run, "hello 3", &third, t3, wait);

    let Some(at) = replicas.iter().position(|r| r.id == third) else {
        return Err(format!("unknown leader {third}"));
    };
    let terminated = replicas.remove(at);
    run.check(terminated.terminate(), "SIGTERM sent");
    run.check(
        terminated.wait_line("BYE", wait).is_some(),
        "the SIGTERMed leader stopped cleanly",
    );
    drop(terminated);
    let Some((fourth, t4, opened)) = platform.wait_opened(wait) else {
        println!("CHECK FAILED: no standby took over within {wait:?} of the SIGTERM");
        return Ok(false);
    };
    let closed = closed_at(&platform, &third, t3).unwrap_or(opened);
    let sigterm = opened.saturating_duration_since(closed);
    run.sigterm = Some(sigterm);
    println!(
        "SIGTERM {third} -> {fourth} leads (token {}) after {:.1} ms without a session",
        show(t4),
        ms(sigterm)
    );
    run.check(fourth != third, "a standby took over");
    run.check(t4 > t3, "the new leader's token is greater");
    run.check(sigterm < ttl / 3, "the SIGTERM failover beat the re-check");
    round_trip(&platform, &mut run, "hello 4", &fourth, t4, wait);

    for r in replicas {
        let id = r.id.clone();
        run.check(r.stop(wait), &format!("{id} stopped cleanly"));
    }
    let conflicts = platform.conflicts();
    println!("conflicts seen by the platform: {conflicts}");
    run.check(conflicts == 0, "no conflict");
    let figure = |d: Option<Duration>| d.map_or_else(|| "null".to_owned(), |d| ms(d).to_string());
    println!(
        "{{\"crash_failover_ms\":{},\"clean_failover_ms\":{},\"sigterm_failover_ms\":{},\"conflicts\":{conflicts},\"ttl_ms\":{},\"ok\":{}}}",
        figure(run.crash),
        figure(run.clean),
        figure(run.sigterm),
        ttl.as_millis(),
        run.ok
    );
    Ok(run.ok)
}

fn show(token: Option<Token>) -> String {
    token.map_or_else(|| "none".to_owned(), |t| t.to_string())
}

/// The platform delivers a message to the session; the leader's reply comes back
/// carrying the leader's token.
fn round_trip(
    platform: &Server,
    run: &mut Run,
    text: &str,
    leader: &str,
    token: Option<Token>,
    wait: Duration,
) {
    let reached = platform.inject("demo-chat", text);
    run.check(reached == 1, "the message reached one session");
    let reply = platform.wait_for(
        wait,
        |e| matches!(e, Event::Sent { text: t, .. } if t.ends_with(text)),
    );
    match reply {
        Some(Event::Sent {
            replica,
            token: t,
            text: answer,
            ..
        }) => {
            println!(
                "  {text:?} answered by {replica} with token {}: {answer:?}",
                show(t)
            );
            run.check(
                replica == leader && t == token,
                "the reply came from the leader",
            );
        }
        _ => run.check(false, &format!("no reply to {text:?}")),
    }
}

/// When the platform recorded the end of `replica`'s session with `token`.
fn closed_at(platform: &Server, replica: &str, token: Option<Token>) -> Option<Instant> {
    platform.history().into_iter().find_map(|e| match e {
        Event::Closed {
            replica: r,
            token: t,
            at,
            ..
        } if r == replica && t == token => Some(at),
        _ => None,
    })
}
