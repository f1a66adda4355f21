//! Test support: real `redis-server` processes on free loopback ports.
//!
//! Each [`RedisServer`] is a child process bound to 127.0.0.1 with persistence off, in
//! a temporary directory; it is killed when dropped. Fault tests kill, pause (SIGSTOP)
//! and restart it. Nothing here mocks Redis.

#![allow(dead_code)]

pub mod process;
pub mod transport;

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

/// A TCP proxy on loopback in front of a server, that can cut a connection right after
/// the server answered, before the answer reaches the client: a reply lost on the wire.
pub struct Proxy {
    port: u16,
    cut_next_reply: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Self {
        use std::io::{Read, Write};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (cut2, stop2) = (cut.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop2.load(Ordering::Acquire) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (mut c_read, mut s_write) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = c_read.read(&mut buf) {
                        if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_write.shutdown(std::net::Shutdown::Both);
                });
                let cut = cut2.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = s_read.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if cut.swap(false, Ordering::AcqRel) {
                            // The server has done the work; the client never hears it.
                            break;
                        }
                        if c_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Both);
                    let _ = s_read.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Proxy {
            port,
            cut_next_reply: cut,
            stop,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The next reply from the server is dropped and its connection closed.
    pub fn cut_next_reply(&self) {
        self.cut_next_reply
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        // Wake the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
