//! Test support: real `redis-server` processes on free loopback ports.
//!
//! Each [`RedisServer`] is a child process bound to 127.0.0.1 with persistence off, in
//! a temporary directory; it is killed when dropped. Fault tests kill, pause (SIGSTOP)
//! and restart it. Nothing here mocks Redis.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

impl RedisServer {
    /// Starts a server on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra config arguments (e.g. `["--requirepass", "x"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "botmesh-redis-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut s = RedisServer {
            child: None,
            port: 0,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        // A port found free can be taken before the server binds it; try a few.
        for _ in 0..5 {
            s.port = free_port();
            if s.spawn() {
                return s;
            }
        }
        panic!("could not start redis-server (is it installed? `apt-get install redis-server`)");
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(mut child) = child else { return false };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = child.try_wait() {
                return false; // exited: port taken
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(5)); // polling a server's start-up
        }
        let _ = child.kill();
        false
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
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("client")
            .get_connection()
            .expect("connection")
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
        while !self.spawn() {
            assert!(t0.elapsed() < Duration::from_secs(10), "restart failed");
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .arg(sig)
                .arg(c.id().to_string())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
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

    /// Keys that would never expire (`PTTL` = -1): what an idle bot must not leave.
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
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
