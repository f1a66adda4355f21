//! A real Sentinel set-up: a primary, a replica and 3 sentinels (`redis-server
//! sentinel.conf --sentinel`, quorum 2) on free loopback ports, monitoring the
//! service `mymaster`; `SENTINEL FAILOVER` promotes the replica. Every process is
//! killed when dropped. Nothing here mocks Redis.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The service name the sentinels monitor.
pub const SERVICE: &str = "mymaster";

const SETTLE: Duration = Duration::from_secs(30);

/// A running set-up.
pub struct RedisSentinel {
    children: Vec<Child>,
    /// Primary, replica.
    data: [u16; 2],
    sentinels: Vec<u16>,
    dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| format!("connect to {port}: {e}"))?;
    let _ = con.set_read_timeout(Some(Duration::from_secs(5)));
    cmd.query(&mut con)
        .map_err(|e| format!("redis at {port}: {e}"))
}

/// Polls `check` until it gives a value; panics after `SETTLE` with what it saw last.
fn poll<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let t0 = Instant::now();
    loop {
        let seen = match check() {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        assert!(
            t0.elapsed() < SETTLE,
            "{what}: not within {} s (last seen: {seen})",
            SETTLE.as_secs()
        );
        // Polling a server's state with a deadline; nothing signals it.
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl RedisSentinel {
    /// Starts the primary, the replica (in sync) and 3 sentinels that see the
    /// replica and each other. Panics when it cannot (tests only).
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "botmesh-sentinel-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut me = RedisSentinel {
            children: Vec::new(),
            data: [0, 0],
            sentinels: Vec::new(),
            dir,
        };
        let primary = me.spawn_data(None);
        let replica = me.spawn_data(Some(primary));
        me.data = [primary, replica];
        poll("the replica in sync", || {
            let info: String = query(replica, redis::cmd("INFO").arg("replication"))?;
            if info.contains("master_link_status:up") {
                Ok(())
            } else {
                Err(format!("replica {replica} link not up"))
            }
        });
        for i in 0..3 {
            let conf = me.dir.join(format!("sentinel-{i}.conf"));
            let log = me.dir.join(format!("sentinel-{i}.log"));
            let dir = me.dir.clone();
            let port = me.spawn_on_free_port(|port| {
                // Written anew for each port tried: a sentinel rewrites its own file.
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {}\nlogfile {}\n\
                         sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                         sentinel down-after-milliseconds {SERVICE} 1000\n\
                         sentinel failover-timeout {SERVICE} 10000\n",
                        dir.display(),
                        log.display()
                    ),
                )
                .expect("sentinel.conf");
                let mut cmd = Command::new("redis-server");
                cmd.arg(&conf).arg("--sentinel");
                cmd
            });
            me.sentinels.push(port);
        }
        for &s in &me.sentinels.clone() {
            poll(
                "a sentinel sees the replica and the other sentinels",
                || {
                    let replicas: Vec<redis::Value> =
                        query(s, redis::cmd("SENTINEL").arg("REPLICAS").arg(SERVICE))?;
                    let others: Vec<redis::Value> =
                        query(s, redis::cmd("SENTINEL").arg("SENTINELS").arg(SERVICE))?;
                    if !replicas.is_empty() && others.len() == 2 {
                        Ok(())
                    } else {
                        Err(format!(
                            "sentinel {s} sees {} replicas and {} other sentinels; logs in {}",
                            replicas.len(),
                            others.len(),
                            me.dir.display()
                        ))
                    }
                },
            );
        }
        me
    }

    fn spawn_data(&mut self, replica_of: Option<u16>) -> u16 {
        let root = self.dir.clone();
        self.spawn_on_free_port(|port| {
            let dir = root.join(port.to_string());
            std::fs::create_dir_all(&dir).expect("node dir");
            let mut cmd = Command::new("redis-server");
            cmd.arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir);
            if let Some(p) = replica_of {
                cmd.arg("--replicaof").arg("127.0.0.1").arg(p.to_string());
            }
            cmd
        })
    }

    /// Starts `make(port)` on a port found free and waits until it answers PING.
    /// A port found free can be taken (by any outgoing connection's local port)
    /// before the server binds it; the server then exits, and another port is tried.
    fn spawn_on_free_port(&mut self, make: impl Fn(u16) -> Command) -> u16 {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut child = make(port)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server");
            let t0 = Instant::now();
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!("redis-server on {port} exited at start ({status})");
                    break;
                }
                if query::<String>(port, &redis::cmd("PING")).is_ok() {
                    self.children.push(child);
                    return port;
                }
                if t0.elapsed() > SETTLE {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = format!("redis-server on {port} did not answer within 30 s");
                    break;
                }
                // A starting server signals nothing but its open port.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("{last}")
    }

    /// `redis://127.0.0.1:<port>` of each sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The port the sentinels name as the primary now.
    pub fn primary(&self) -> u16 {
        let (_, port): (String, u16) = query(
            self.sentinels[0],
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(SERVICE),
        )
        .expect("GET-MASTER-ADDR-BY-NAME");
        port
    }

    /// `SENTINEL FAILOVER`: the replica is promoted and the old primary made its
    /// replica. Returns the new primary's port once the sentinels name it and it
    /// says it is the primary.
    pub fn failover(&self) -> u16 {
        let old = self.primary();
        let _: String = query(
            self.sentinels[0],
            redis::cmd("SENTINEL").arg("FAILOVER").arg(SERVICE),
        )
        .expect("SENTINEL FAILOVER");
        poll("the replica promoted", || {
            let now = self.primary();
            if now == old {
                return Err(format!("the sentinels still name {old}"));
            }
            let role: redis::Value = query(now, &redis::cmd("ROLE"))?;
            match role {
                redis::Value::Array(parts) if matches!(parts.first(), Some(redis::Value::BulkString(b)) if b.as_slice() == b"master") => {
                    Ok(now)
                }
                other => Err(format!("{now} says ROLE {other:?}")),
            }
        })
    }

    /// Keys without an expiry on the current primary.
    pub fn keys_without_ttl(&self) -> usize {
        let p = self.primary();
        let keys: Vec<String> = query(p, redis::cmd("KEYS").arg("*")).expect("KEYS");
        keys.iter()
            .filter(|k| query::<i64>(p, redis::cmd("PTTL").arg(k)).unwrap_or(0) == -1)
            .count()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Kept after a failure: the sentinels' logs say what they saw.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
