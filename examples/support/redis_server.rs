//! A throwaway `redis-server` for the examples: a child process on a free loopback
//! port, persistence off, killed when dropped.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server` child process.
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts one on a free port of 127.0.0.1 and waits until it accepts connections.
    ///
    /// # Errors
    /// A message when `redis-server` is not installed or does not come up in 10 s.
    pub fn start() -> Result<RedisServer, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start redis-server ({e}); install it, or pass --redis-url")
            })?;
        let mut server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                server.stop();
                return Err("redis-server did not come up within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
