//! A real `redis-server` child process on a free loopback port, persistence off, in a
//! temporary directory of its own; killed when dropped. Fault tests kill, pause
//! (SIGSTOP) and restart it. Nothing here mocks Redis.
//!
//! Shared by the tests (through `tests/support/mod.rs`) and the examples (which
//! include this file with `#[path]`), so it has no test-only dependency and
//! [`RedisServer::try_start`] reports a missing server instead of panicking.

// The examples include this file alone and use only part of it.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to accept connections: a loaded 2-core machine is slow
/// to start processes.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    /// Append-only file with an fsync per write: a restart keeps every acknowledged
    /// write (for fault runs that must not lose the queues).
    persistent: bool,
}

/// Whether the server on `port` answers `PING` with `PONG`: up, and done loading its
/// append-only file (until then it answers `-LOADING`).
fn answers_ping(port: u16) -> bool {
    use std::io::{BufRead, BufReader, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

impl RedisServer {
    /// Starts a server on a free port; panics when it cannot (tests only).
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server on a free port and waits until it accepts connections.
    ///
    /// # Errors
    /// A message when `redis-server` is not installed or does not come up.
    pub fn try_start() -> Result<Self, String> {
        Self::try_start_with(false)
    }

    /// Like [`RedisServer::try_start`], with an append-only file fsynced on every
    /// write, so that a restart (even after SIGKILL) loses no acknowledged write.
    ///
    /// # Errors
    /// As [`RedisServer::try_start`].
    pub fn try_start_persistent() -> Result<Self, String> {
        Self::try_start_with(true)
    }

    fn try_start_with(persistent: bool) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!(
            "botmesh-redis-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            persistent,
        };
        // A port found free can be taken before the server binds it; try a few.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(format!(
            "{last} (is it installed? `apt-get install redis-server`)"
        ))
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(if self.persistent {
                ["--appendonly", "yes", "--appendfsync", "always"]
            } else {
                ["--appendonly", "no", "--appendfsync", "everysec"]
            })
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        let t0 = Instant::now();
        while t0.elapsed() < START_TIMEOUT {
            if let Ok(Some(status)) = child.try_wait() {
                // Most likely the port was taken meanwhile.
                return Err(format!("redis-server exited at start ({status})"));
            }
            if answers_ping(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            // Nothing to wait on: a starting server signals nothing but its open port.
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!(
            "redis-server did not come up within {} s",
            START_TIMEOUT.as_secs()
        ))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A plain client connection for inspecting the server.
    #[cfg(feature = "redis")]
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("client")
            .get_connection()
            .expect("connection")
    }

    /// Keys that would never expire (`PTTL` = -1): what an idle bot must not leave.
    #[cfg(feature = "redis")]
    pub fn keys_without_ttl(&self) -> Vec<String> {
        let mut con = self.connection();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
        keys.into_iter()
            .filter(|k| {
                let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut con).expect("PTTL");
                ttl == -1
            })
            .collect()
    }

    /// SIGKILL: the server dies and its data is lost (no persistence).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let t0 = Instant::now();
        while let Err(e) = self.spawn() {
            // The old process's port may linger for a moment after its death.
            assert!(t0.elapsed() < START_TIMEOUT, "restart failed: {e}");
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .arg(sig)
                .arg(c.id().to_string())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} failed");
        }
    }

    /// SIGSTOP: the server stops answering, connections stay open.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a paused (SIGSTOPped) server too.
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
