//! A real Redis Cluster of 3 primaries and 3 replicas, each a `redis-server` child
//! process on a free loopback port below 45000 (its cluster bus port is the port +
//! 10000), in a temporary directory; every node killed when dropped. Fault tests fail
//! a primary over to its replica, SIGKILL a primary, and migrate a slot. Nothing here
//! mocks Redis.
//!
//! Shared by the tests (through `tests/support/mod.rs`) and the `replay` example
//! (which includes this file with `#[path]`), so it reports failures as errors.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the cluster may take to form or to settle after a fault: a loaded
/// 2-core machine is slow.
const SETTLE: Duration = Duration::from_secs(30);

/// Cluster node timeout (ms): how long a silent primary takes to be judged failed.
/// Short, so a killed primary is replaced within seconds.
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// One node.
struct Node {
    port: u16,
    child: Option<Child>,
}

/// A running cluster.
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

/// Whether `port` and its bus port are both free on loopback now.
fn pair_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
        && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok()
}

/// Lowest and one past the highest port tried: the bus ports (+10000) stay below
/// Linux's default ephemeral range (32768 and up), where outgoing connections of
/// other programs would take them at random.
const PORTS: (u32, u32) = (20_000, 22_700);

/// `n` ports whose bus ports (+10000) are free too, spread by the process id and a
/// counter so that parallel test binaries and retries rarely try the same ones.
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static TRIES: AtomicU32 = AtomicU32::new(0);
    let mut out = Vec::new();
    let span = PORTS.1 - PORTS.0;
    let salt = TRIES.fetch_add(97, Ordering::Relaxed);
    let mut candidate = PORTS.0 + (std::process::id().wrapping_mul(7919).wrapping_add(salt) % span);
    for _ in 0..span {
        candidate = if candidate + 1 >= PORTS.1 {
            PORTS.0
        } else {
            candidate + 1
        };
        let port = candidate as u16;
        if pair_free(port) && !out.contains(&port) {
            out.push(port);
            if out.len() == n {
                return Ok(out);
            }
        }
    }
    Err("no free loopback ports below 45000".to_owned())
}

fn connection(port: u16) -> Result<redis::Connection, String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .map_err(|e| format!("client for {port}: {e}"))?;
    let con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| format!("connect to {port}: {e}"))?;
    let _ = con.set_read_timeout(Some(Duration::from_secs(5)));
    Ok(con)
}

fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    let mut con = connection(port)?;
    cmd.query(&mut con)
        .map_err(|e| format!("redis at {port}: {e}"))
}

/// `field:value` lines of an `INFO`-like reply.
fn fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Polls `check` until it answers `Some` or the deadline passes.
fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> Result<T, String> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if t0.elapsed() > SETTLE {
            return Err(format!("{what}: not within {} s", SETTLE.as_secs()));
        }
        // Polling a server's state with a deadline; nothing signals it.
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl RedisCluster {
    /// Starts 6 nodes, joins them with `redis-cli --cluster create … --cluster-replicas
    /// 1`, and waits until every node says `cluster_state:ok` and every replica is in
    /// sync. Panics when it cannot (tests only).
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`RedisCluster::start`].
    ///
    /// # Errors
    /// A message when `redis-server` or `redis-cli` is missing or the cluster does
    /// not form.
    pub fn try_start() -> Result<Self, String> {
        // A port found free can be taken before its node binds it; try afresh.
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start_once() {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn try_start_once() -> Result<Self, String> {
        let ports = free_ports(6)?;
        let dir = std::env::temp_dir().join(format!(
            "botmesh-cluster-{}-{}",
            std::process::id(),
            ports[0]
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut cluster = RedisCluster {
            nodes: ports
                .iter()
                .map(|&port| Node { port, child: None })
                .collect(),
            dir,
        };
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i)?;
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for p in &ports {
            create.arg(format!("127.0.0.1:{p}"));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run redis-cli (apt-get install redis-tools): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        cluster.wait_settled()?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let port = self.nodes[i].port;
        let dir = self.dir.join(port.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let child = Command::new("redis-server")
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes"])
            .arg("--cluster-config-file")
            .arg(dir.join("nodes.conf"))
            .arg("--cluster-node-timeout")
            .arg(NODE_TIMEOUT_MS.to_string())
            // A replica may take over however long it was cut off from its primary.
            .args(["--cluster-replica-validity-factor", "0"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start redis-server (apt-get install redis-server): {e}")
            })?;
        self.nodes[i].child = Some(child);
        let exited = std::cell::Cell::new(false);
        let up = poll(&format!("redis-server on {port} answering"), || {
            if let Some(c) = self.nodes[i].child.as_mut()
                && let Ok(Some(_)) = c.try_wait()
            {
                exited.set(true);
                return Some(false);
            }
            query::<String>(port, &redis::cmd("PING"))
                .ok()
                .map(|_| true)
        })?;
        if !up || exited.get() {
            self.nodes[i].child = None;
            return Err(format!(
                "redis-server on {port} exited at start (port taken?)"
            ));
        }
        Ok(())
    }

    /// Waits until every live node says `cluster_state:ok`, agrees on 3 primaries
    /// covering all slots, and every live replica's link to its primary is up.
    pub fn wait_settled(&self) -> Result<(), String> {
        poll("the cluster settled", || {
            let live: Vec<u16> = self.live_ports();
            for &p in &live {
                let info: String = query(p, redis::cmd("CLUSTER").arg("INFO")).ok()?;
                if fields(&info).get("cluster_state").map(String::as_str) != Some("ok") {
                    return None;
                }
                let repl: String = query(p, redis::cmd("INFO").arg("replication")).ok()?;
                let f = fields(&repl);
                if f.get("role").map(String::as_str) == Some("slave")
                    && f.get("master_link_status").map(String::as_str) != Some("up")
                {
                    return None;
                }
            }
            // Every live node sees the same primaries.
            let views: Vec<Vec<u16>> = live
                .iter()
                .map(|&p| self.primaries_seen_by(p))
                .collect::<Option<_>>()?;
            (views.windows(2).all(|w| w[0] == w[1]) && views.first()?.len() == 3).then_some(())
        })
    }

    fn primaries_seen_by(&self, port: u16) -> Option<Vec<u16>> {
        let slots: redis::Value = query(port, redis::cmd("CLUSTER").arg("SLOTS")).ok()?;
        let redis::Value::Array(ranges) = slots else {
            return None;
        };
        let mut out: Vec<u16> = Vec::new();
        for r in ranges {
            let redis::Value::Array(parts) = r else {
                return None;
            };
            let redis::Value::Array(primary) = parts.get(2)? else {
                return None;
            };
            let redis::Value::Int(p) = primary.get(1)? else {
                return None;
            };
            let p = u16::try_from(*p).ok()?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out.sort_unstable();
        Some(out)
    }

    /// Ports of the nodes still running.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// `redis://127.0.0.1:<port>` of every node, the seed list for a client.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// Any live node's port.
    fn any(&self) -> Result<u16, String> {
        self.live_ports()
            .first()
            .copied()
            .ok_or_else(|| "no live node".to_owned())
    }

    /// The hash slot of `key`, as the server computes it (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.any().expect("a live node");
        let slot: i64 =
            query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).expect("KEYSLOT");
        u16::try_from(slot).expect("slot")
    }

    /// The port of the primary serving `slot`, as a live node sees it now.
    pub fn primary_of(&self, slot: u16) -> u16 {
        let port = self.any().expect("a live node");
        let slots: redis::Value = query(port, redis::cmd("CLUSTER").arg("SLOTS")).expect("SLOTS");
        let redis::Value::Array(ranges) = slots else {
            panic!("CLUSTER SLOTS")
        };
        for r in ranges {
            let redis::Value::Array(parts) = r else {
                continue;
            };
            let (
                Some(redis::Value::Int(a)),
                Some(redis::Value::Int(b)),
                Some(redis::Value::Array(p)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            if (*a..=*b).contains(&i64::from(slot))
                && let Some(redis::Value::Int(port)) = p.get(1)
            {
                return u16::try_from(*port).expect("port");
            }
        }
        panic!("no primary serves slot {slot}")
    }

    /// The ports of the primaries now.
    pub fn primaries(&self) -> Vec<u16> {
        self.primaries_seen_by(self.any().expect("a live node"))
            .expect("CLUSTER SLOTS")
    }

    /// The node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        query(port, redis::cmd("CLUSTER").arg("MYID")).expect("CLUSTER MYID")
    }

    /// The port of a live replica of the primary on `port`.
    pub fn replica_of(&self, primary: u16) -> u16 {
        let id = self.node_id(primary);
        for p in self.live_ports() {
            let repl: String = query(p, redis::cmd("INFO").arg("replication")).expect("INFO");
            let f = fields(&repl);
            if f.get("role").map(String::as_str) == Some("slave")
                && f.get("master_port").and_then(|v| v.parse::<u16>().ok()) == Some(primary)
            {
                return p;
            }
        }
        panic!("no replica of {primary} ({id})")
    }

    /// `CLUSTER FAILOVER` on the replica on `replica`: a manual failover (the
    /// primary stops, the replica catches up, then takes over, losing nothing).
    /// Returns once the replica is a primary and the cluster settled.
    pub fn failover(&self, replica: u16) -> Result<(), String> {
        query::<String>(replica, redis::cmd("CLUSTER").arg("FAILOVER"))?;
        poll("the replica took over", || {
            let repl: String = query(replica, redis::cmd("INFO").arg("replication")).ok()?;
            (fields(&repl).get("role").map(String::as_str) == Some("master")).then_some(())
        })?;
        self.wait_settled()
    }

    /// SIGKILL of the node on `port` (its data is lost with it).
    pub fn kill(&mut self, port: u16) {
        for n in &mut self.nodes {
            if n.port == port
                && let Some(mut c) = n.child.take()
            {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Waits until a replica replaced the killed primary: every live node says ok
    /// and sees 3 primaries among the live nodes.
    pub fn wait_replaced(&self) -> Result<(), String> {
        poll("a replica took over", || {
            let live = self.live_ports();
            let seen = self.primaries_seen_by(*live.first()?)?;
            seen.iter().all(|p| live.contains(p)).then_some(())
        })?;
        self.wait_settled_live()
    }

    /// As [`wait_settled`](Self::wait_settled), without asking that every primary
    /// has a replica (a killed primary's replica has none until it comes back).
    fn wait_settled_live(&self) -> Result<(), String> {
        poll("the cluster settled", || {
            for p in self.live_ports() {
                let info: String = query(p, redis::cmd("CLUSTER").arg("INFO")).ok()?;
                if fields(&info).get("cluster_state").map(String::as_str) != Some("ok") {
                    return None;
                }
            }
            Some(())
        })
    }

    /// Moves `slot` from the primary on `from` to the primary on `to` the way
    /// `redis-cli --cluster reshard` does: `SETSLOT IMPORTING` on the target,
    /// `SETSLOT MIGRATING` on the source, `MIGRATE` of its keys in batches, then
    /// `SETSLOT NODE` on both and on every other primary. `between` runs after the
    /// first batch is moved, while the slot is half migrated (so clients meet `ASK`).
    pub fn migrate_slot(
        &self,
        slot: u16,
        from: u16,
        to: u16,
        between: impl FnOnce(),
    ) -> Result<(), String> {
        let from_id = self.node_id(from);
        let to_id = self.node_id(to);
        query::<String>(
            to,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&from_id),
        )?;
        query::<String>(
            from,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&to_id),
        )?;
        let mut between = Some(between);
        loop {
            let keys: Vec<String> = query(
                from,
                redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(1),
            )?;
            if keys.is_empty() {
                break;
            }
            let _: redis::Value = query(
                from,
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&keys),
            )?;
            if let Some(f) = between.take() {
                f();
            }
        }
        if let Some(f) = between.take() {
            f();
        }
        for p in self.primaries() {
            query::<String>(
                p,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&to_id),
            )?;
        }
        poll("every node sees the slot moved", || {
            self.live_ports()
                .iter()
                .all(|&p| {
                    let owner = self.owner_seen_by(p, slot);
                    owner == Some(to)
                })
                .then_some(())
        })
    }

    fn owner_seen_by(&self, port: u16, slot: u16) -> Option<u16> {
        let slots: redis::Value = query(port, redis::cmd("CLUSTER").arg("SLOTS")).ok()?;
        let redis::Value::Array(ranges) = slots else {
            return None;
        };
        for r in ranges {
            let redis::Value::Array(parts) = r else {
                continue;
            };
            let (
                Some(redis::Value::Int(a)),
                Some(redis::Value::Int(b)),
                Some(redis::Value::Array(p)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            if (*a..=*b).contains(&i64::from(slot))
                && let Some(redis::Value::Int(port)) = p.get(1)
            {
                return u16::try_from(*port).ok();
            }
        }
        None
    }

    /// Keys under `prefix` that would never expire (`PTTL` = -1), on every primary.
    pub fn keys_without_ttl(&self, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        for p in self.primaries() {
            let keys: Vec<String> =
                query(p, redis::cmd("KEYS").arg(format!("{prefix}*"))).expect("KEYS");
            for k in keys {
                let ttl: i64 = query(p, redis::cmd("PTTL").arg(&k)).unwrap_or(0);
                if ttl == -1 {
                    out.push(k);
                }
            }
        }
        out
    }

    /// Zeroes the node's statistics (`CONFIG RESETSTAT`).
    pub fn reset_stats(&self, port: u16) {
        let _: () = query(port, redis::cmd("CONFIG").arg("RESETSTAT")).expect("CONFIG RESETSTAT");
    }

    /// A counter of `INFO <section>` on the node on `port`, such as
    /// `total_reads_processed` of `stats`; for `commandstats`, the `calls` of command
    /// `field` (`fcall`).
    pub fn info_count(&self, port: u16, section: &str, field: &str) -> u64 {
        let text: String = query(port, redis::cmd("INFO").arg(section)).expect("INFO");
        text.lines()
            .find_map(|l| {
                if section == "commandstats" {
                    let rest = l.strip_prefix(&format!("cmdstat_{field}:calls="))?;
                    rest.split(',').next()?.parse().ok()
                } else {
                    l.strip_prefix(&format!("{field}:"))?.trim().parse().ok()
                }
            })
            .unwrap_or(0)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
