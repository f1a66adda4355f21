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

fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            t0.elapsed() < SETTLE,
            "{what}: not within {} s",
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
            data: [free_port(), free_port()],
            sentinels: Vec::new(),
            dir,
        };
        let [primary, replica] = me.data;
        me.spawn_data(primary, None);
        me.spawn_data(replica, Some(primary));
        poll("the replica in sync", || {
            let info: String = query(replica, redis::cmd("INFO").arg("replication")).ok()?;
            info.contains("master_link_status:up").then_some(())
        });
        for i in 0..3 {
            let port = free_port();
            let conf = me.dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\nsentinel failover-timeout {SERVICE} 10000\n",
                    me.dir.display()
                ),
            )
            .expect("sentinel.conf");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel");
            me.children.push(child);
            me.sentinels.push(port);
        }
        for &s in &me.sentinels.clone() {
            poll(
                "a sentinel sees the replica and the other sentinels",
                || {
                    let replicas: Vec<redis::Value> =
                        query(s, redis::cmd("SENTINEL").arg("REPLICAS").arg(SERVICE)).ok()?;
                    let others: Vec<redis::Value> =
                        query(s, redis::cmd("SENTINEL").arg("SENTINELS").arg(SERVICE)).ok()?;
                    (!replicas.is_empty() && others.len() == 2).then_some(())
                },
            );
        }
        me
    }

    fn spawn_data(&mut self, port: u16, replica_of: Option<u16>) {
        let dir = self.dir.join(port.to_string());
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
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        self.children.push(child);
        poll("redis-server answering", || {
            query::<String>(port, &redis::cmd("PING")).ok()
        });
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
                return None;
            }
            let role: redis::Value = query(now, &redis::cmd("ROLE")).ok()?;
            let redis::Value::Array(parts) = role else {
                return None;
            };
            matches!(parts.first(), Some(redis::Value::BulkString(b)) if b.as_slice() == b"master")
                .then_some(now)
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
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
