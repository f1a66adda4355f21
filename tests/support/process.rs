//! Replica processes for the leadership tests and the `leader_demo` example: a bot
//! over Redis whose one provider is a [`transport::Client`](super::transport::Client)
//! of the test platform, driven through stdin and reporting through stdout.
//!
//! A replica process prints, one per line: `READY` once built; `STARTED <token>` and
//! `STOPPED` when the runtime starts and stops its transport; `REPLY ok|refused …`
//! for each handled message's reply; `BYE` when it stopped cleanly. It reads commands
//! on stdin: `poke` (take a local message in; its handler replies), `raw` (send to
//! the platform with the last session's token, bypassing the runtime), `token` (the
//! leadership token it holds now), `metrics`. End of stdin is a clean stop.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::{Bot, CoordinationConfig, CoordinatorConfig, Message, ProviderSession};
use crossbeam_channel::{Receiver, unbounded};

use super::transport::{Client, ClientEvent};

/// The provider id every replica process gives its platform client.
pub const PROVIDER: &str = "platform";

/// How a replica process is set up; passed to it in environment variables.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub id: String,
    pub redis_url: String,
    /// The Redis key prefix (isolates runs sharing a server).
    pub key_prefix: String,
    pub server: SocketAddr,
    pub ttl: Duration,
    pub provider_down: Duration,
    pub session: ProviderSession,
    pub exclusive: bool,
}

const ENV: [&str; 8] = [
    "BOTMESH_LEAD_ID",
    "BOTMESH_LEAD_REDIS",
    "BOTMESH_LEAD_SERVER",
    "BOTMESH_LEAD_TTL_MS",
    "BOTMESH_LEAD_DOWN_MS",
    "BOTMESH_LEAD_SESSION",
    "BOTMESH_LEAD_EXCLUSIVE",
    "BOTMESH_LEAD_PREFIX",
];

impl ReplicaConfig {
    /// The environment that carries this config to a child.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let session = match self.session {
            ProviderSession::Leader => "leader",
            ProviderSession::Shared => "shared",
            _ => "auto",
        };
        let values = [
            self.id.clone(),
            self.redis_url.clone(),
            self.server.to_string(),
            self.ttl.as_millis().to_string(),
            self.provider_down.as_millis().to_string(),
            session.to_owned(),
            u8::from(self.exclusive).to_string(),
            self.key_prefix.clone(),
        ];
        ENV.into_iter().zip(values).collect()
    }

    /// The config of this process, if it was started as a replica child.
    pub fn from_env() -> Option<Self> {
        let get = |k: &str| std::env::var(k).ok();
        let ms = |k: &str| get(k)?.parse().ok().map(Duration::from_millis);
        let session = match get(ENV[5])?.as_str() {
            "leader" => ProviderSession::Leader,
            "shared" => ProviderSession::Shared,
            _ => ProviderSession::Auto,
        };
        Some(ReplicaConfig {
            id: get(ENV[0])?,
            redis_url: get(ENV[1])?,
            server: get(ENV[2])?.parse().ok()?,
            ttl: ms(ENV[3])?,
            provider_down: ms(ENV[4])?,
            session,
            exclusive: get(ENV[6])? == "1",
            key_prefix: get(ENV[7])?,
        })
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The body of a replica process: runs until stdin closes, then stops cleanly.
pub fn run_replica(cfg: &ReplicaConfig) -> Result<(), String> {
    let options = RedisOptions::new(cfg.redis_url.as_str())
        .with_lease_ttl(cfg.ttl)
        .with_key_prefix(cfg.key_prefix.as_str())
        .with_command_timeout((cfg.ttl / 3).min(Duration::from_millis(500)));
    let coordinator = RedisCoordinator::connect(options).map_err(|e| e.to_string())?;
    let (events_tx, events_rx) = unbounded();
    let client = Client::new(PROVIDER, &cfg.id, cfg.server, cfg.exclusive).with_events(events_tx);
    let printer = std::thread::spawn(move || {
        for event in events_rx {
            match event {
                ClientEvent::Started { token, .. } => {
                    say(&format!("STARTED {}", token.unwrap_or(0)));
                }
                ClientEvent::Stopped { .. } => say("STOPPED"),
                ClientEvent::Status { status, .. } => say(&format!("STATUS {status:?}")),
            }
        }
    });
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(Arc::new(coordinator)))
        .with_provider_down(cfg.provider_down)
        .with_provider_session(cfg.session);
    let me = cfg.id.clone();
    let bot = Bot::builder()
        .id(cfg.id.as_str())
        .workers(2)
        .coordination(config)
        .provider(Arc::new(client.clone()))
        .handler(move |ctx| {
            let text = &ctx.message().text;
            match ctx.reply(&format!("{me} handled {text}")) {
                Ok(()) => say(&format!("REPLY ok {text}")),
                Err(e) => say(&format!("REPLY refused {e}")),
            }
            Ok(())
        })
        .build()
        .map_err(|e| e.to_string())?;
    let bot = Arc::new(bot);
    // SIGTERM / SIGINT (a pod being deleted, Ctrl-C): a clean stop, so the leadership
    // and every turn are handed over at once instead of lapsing after the TTL.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    // A weak handle: the signal thread never ends, and must not keep the bot (and
    // its provider) alive after a stop through stdin.
    let on_signal = Arc::downgrade(&bot);
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            say(&format!("SIGNAL {sig}"));
            if let Some(bot) = on_signal.upgrade()
                && let Err(e) = bot.stop()
            {
                say(&format!("STOP refused {e}"));
            }
            say("BYE");
            // stdin may stay open: the stop is done, leave now.
            std::process::exit(0);
        }
    });
    say("READY");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "poke" => {
                let _ = bot.intake().deliver(Message::new("local", "poke"));
            }
            "raw" => {
                let sent = Client::send_with(cfg.server, &cfg.id, client.last_token(), "c", "raw");
                match sent {
                    Ok(()) => say("RAW ok"),
                    Err(e) => say(&format!("RAW refused {e}")),
                }
            }
            "token" => say(&format!("TOKEN {:?}", bot.leader_token(PROVIDER))),
            "metrics" => {
                let m = bot.metrics();
                say(&format!(
                    "METRICS changes={} conflicts={} leaderless_ms={} led={}",
                    m.leadership_changes, m.provider_conflicts, m.leaderless_ms, m.providers_led
                ));
            }
            _ => {}
        }
    }
    if let Err(e) = bot.stop() {
        say(&format!("STOP refused {e}"));
    }
    drop(bot);
    drop(client);
    let _ = printer.join();
    say("BYE");
    Ok(())
}

/// A replica process seen from its parent.
pub struct ReplicaProcess {
    pub id: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl ReplicaProcess {
    /// Spawns `command` (with `cfg` in its environment), piping stdin and stdout, and
    /// waits for its `READY`.
    pub fn spawn(mut command: Command, cfg: &ReplicaConfig) -> Result<Self, String> {
        command.envs(cfg.env());
        Self::spawn_command(command, &cfg.id)
    }

    /// Spawns `command` as replica `id` (its settings already in its environment),
    /// piping stdin and stdout, and waits for its `READY`.
    pub fn spawn_command(mut command: Command, id: &str) -> Result<Self, String> {
        command.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot spawn replica {id}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut p = ReplicaProcess {
            id: id.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines: rx,
        };
        if p.wait_line("READY", Duration::from_secs(30)).is_none() {
            p.kill();
            return Err(format!("replica {id} did not start"));
        }
        Ok(p)
    }

    /// Skips output lines until one contains `tag` (libtest may print the test's name
    /// first) and returns what follows the tag; `None` after `timeout` or at exit.
    pub fn wait_line(&self, tag: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).ok()?;
            if let Some(at) = line.find(tag) {
                return Some(line[at + tag.len()..].trim().to_owned());
            }
        }
    }

    /// Sends a command line.
    pub fn command(&mut self, line: &str) {
        if let Some(stdin) = &mut self.stdin {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    fn signal(&self, sig: &str) -> bool {
        Command::new("kill")
            .arg(sig)
            .arg(self.child.id().to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// SIGTERM: the replica stops cleanly (see `run_replica`) and says `BYE`.
    pub fn terminate(&self) -> bool {
        self.signal("-TERM")
    }

    /// SIGSTOP: the process stops, its connections stay open.
    pub fn pause(&self) -> bool {
        self.signal("-STOP")
    }

    /// SIGCONT.
    pub fn resume(&self) -> bool {
        self.signal("-CONT")
    }

    /// SIGKILL: a crash; its sockets close, its leases lapse after the TTL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A clean stop: closes stdin and waits for `BYE` and the exit. `false` when the
    /// process did not say `BYE` within `timeout` (it is killed then).
    pub fn stop(mut self, timeout: Duration) -> bool {
        self.stdin = None;
        let said_bye = self.wait_line("BYE", timeout).is_some();
        if !said_bye {
            self.kill();
            return false;
        }
        self.child.wait().map(|s| s.success()).unwrap_or(false)
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        // Only a live child: a reaped one's pid may belong to someone else by now.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.resume();
            self.kill();
        }
    }
}
