//! Where each command goes, and what happens when it cannot get there: the one
//! server, the primary of a key's hash slot in a Redis Cluster, or the primary the
//! sentinels name. Every call of the coordinator goes through [`Target::run`], one
//! pipeline per node per round, with the bounded retries below; the coordinator
//! itself never sees a connection.
//!
//! # Why not the `redis` crate's `ClusterConnection`
//!
//! Its pipeline fails as a whole when one node does not answer, but the renewal tick
//! must keep the leases held on the healthy nodes; after a primary dies it keeps its
//! slot map until some node answers `MOVED`, which a dead node never does, so every
//! call for that node's slots fails until the connection is dropped; it holds a
//! socket to every node and is not `Sync`, so a pool of them multiplies the sockets;
//! and it cannot reload scripts (or a function library) on the one node that
//! forgot them. The routing here is small: a slot map from `CLUSTER SLOTS`, a pool
//! per node, and the error kinds and redirection parsing of the `redis` crate.
//!
//! # Retries
//!
//! A round sends every pending command, grouped into one pipeline per node (all
//! pipelines are written before any reply is read, so a round costs about one round
//! trip however many nodes it touches), then sorts each reply. A round for one node
//! (every turn call but a cluster's renewal tick) goes through the node's group
//! commit ([`Node::exchange`]): the pipelines other threads of this process have for
//! that node at the same moment go out with it in one write, and each thread sorts
//! its own replies. The replies are sorted so:
//!
//! - `MOVED slot addr`: the slot's owner is set at once and the whole map is read
//!   again (a failover moves many slots); the command goes to the new owner.
//! - `ASK slot addr` (a slot being migrated, this key already moved): the command is
//!   sent to `addr` preceded by `ASKING`, without changing the map.
//! - `TRYAGAIN` (a multi-key command during migration), `CLUSTERDOWN`, `MASTERDOWN`,
//!   `LOADING`, `READONLY` (a primary demoted by a failover): a short wait (10 ms,
//!   doubling), the map read again, and another round.
//! - the scripts missing (`NOSCRIPT` after a restart or failover, or a function
//!   library not loaded): loaded on that node, then another round.
//! - a broken connection or a timeout: that node's pooled connections are dropped
//!   and the map is read again from another node (the dead node's replica may have
//!   taken over).
//!
//! At most [`ROUNDS`] rounds, and none starts once the command timeout has run out
//! since the call began, so a call takes at most about twice the command timeout
//! (the last round may itself wait a full timeout), the bound the lease TTL is
//! checked against. Group commit can add one more: a round may first wait for the
//! batch already on the wire to that node (bounded by the timeout too; when it
//! breaks, each call queued behind it is sent alone on a connection of its own,
//! so every round is an attempt of the call's own), so a slow server that still
//! answers can stretch a call to about three command timeouts. The default command
//! timeout is a third of the TTL, and a lease's end is counted from before its
//! renewal was sent, so a late answer costs the lease, never safety. Commands still
//! pending then fail with the last error, each on its own: the other nodes' answers
//! stand. Every script is safe to repeat, so a
//! command whose reply was lost may run twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::{
    Client, Cmd, Connection, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult,
    ServerErrorKind, Value,
};

use super::node::{Map, Node, Outcome, is_transient, parse_slots, read_replies};
use super::url::{describe_at, host_port};
use crate::coordinator::BackendError;

/// Most rounds of one call (see the module docs).
pub(super) const ROUNDS: usize = 6;

/// How the servers are found again after a failure.
pub(super) enum Source {
    /// One server, always the same.
    Single,
    /// Redis Cluster: `CLUSTER SLOTS` from any known node, or from these seeds.
    Cluster(Vec<(String, u16)>),
    /// The primary the sentinels name for a service.
    Sentinel(super::sentinel::Lookup),
}

/// Loads the scripts (or function library) on one connection; called on every
/// primary at connect and on a node that answers that they are missing. With
/// `EVALSHA` scripts it is a `SCRIPT LOAD` per script and "missing" is `NOSCRIPT`;
/// a Redis function library would be one `FUNCTION LOAD REPLACE` and "missing" the
/// server's "function not found" error. The routing does not care which.
pub(super) type Loader = Box<dyn Fn(&mut Connection) -> RedisResult<()> + Send + Sync>;

/// Where commands go. See the module docs.
pub(super) struct Target {
    source: Source,
    /// Connection settings of the first seed (credentials, database, TLS), used for
    /// every node found later with its own host and port.
    base: ConnectionInfo,
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
    timeout: Duration,
    loader: Loader,
    missing: fn(&RedisError) -> bool,
    map: RwLock<Arc<Map>>,
    /// Every node met so far, by address, so pools outlive refreshes.
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// Held while the map is read again.
    refreshing: Mutex<()>,
    /// A text naming the servers (never a password), for messages.
    pub(super) label: String,
    /// Set until the coordinator has connected (see `connect_timeout`).
    starting: std::sync::atomic::AtomicBool,
}

/// The shortest time a connection may take to open while the coordinator connects.
const STARTUP_CONNECT: Duration = Duration::from_secs(2);

/// The pipeline of commands `ids` for one node (each preceded by `ASKING` where a
/// migration redirected it, the `WAIT` trailer last) and how many replies it has.
fn pack(
    cmds: &[(u16, &Cmd)],
    ids: &[usize],
    asking: &HashMap<usize, Arc<Node>>,
    trailer: &[u8],
) -> (Vec<u8>, usize) {
    let mut packed = Vec::new();
    let mut n = ids.len();
    for &i in ids {
        if asking.contains_key(&i) {
            redis::cmd("ASKING").write_packed_command(&mut packed);
            n += 1;
        }
        cmds[i].1.write_packed_command(&mut packed);
    }
    if !trailer.is_empty() {
        packed.extend_from_slice(trailer);
        n += 1;
    }
    (packed, n)
}

/// What to do about one command's answer.
enum Verdict {
    Done(Result<Value, RedisError>),
    Moved(u16, String),
    Ask(String),
    /// Wait, read the map again, retry.
    Later,
    /// Load the scripts on this node, retry.
    Reload,
    /// The connection broke: drop the node's pool, read the map again, retry.
    Broken,
}

impl Target {
    /// A target over `source`. `first` is the first reachable server's connection
    /// settings and address (the seed for a cluster); the map is read at once.
    ///
    /// # Errors
    /// When the map cannot be read (no node answers `CLUSTER SLOTS`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        source: Source,
        base: ConnectionInfo,
        #[cfg(feature = "tls")] certs: Option<redis::TlsCertificates>,
        timeout: Duration,
        loader: Loader,
        missing: fn(&RedisError) -> bool,
        label: String,
    ) -> Result<Self, BackendError> {
        let me = Target {
            source,
            base,
            #[cfg(feature = "tls")]
            certs,
            timeout,
            loader,
            missing,
            map: RwLock::new(Arc::new(Map {
                generation: 0,
                slots: Vec::new(),
                primaries: Vec::new(),
                replicas: Vec::new(),
            })),
            nodes: Mutex::new(HashMap::new()),
            refreshing: Mutex::new(()),
            label,
            starting: std::sync::atomic::AtomicBool::new(true),
        };
        match &me.source {
            Source::Single => {
                let (host, port) = host_port(me.base.addr());
                let node = me.node_with(&host, port, me.base.clone())?;
                *me.map.write() = Arc::new(Map {
                    generation: 1,
                    slots: Vec::new(),
                    primaries: vec![node],
                    replicas: Vec::new(),
                });
            }
            _ => me.refresh(0, None)?,
        }
        Ok(me)
    }

    /// The command timeout.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long a new connection may take to open: the command timeout, but at least
    /// [`STARTUP_CONNECT`] while the coordinator connects (no lease is at stake yet,
    /// and a TLS handshake on a busy host can outlast a short timeout).
    fn connect_timeout(&self) -> Duration {
        if self.starting.load(std::sync::atomic::Ordering::Acquire) {
            self.timeout.max(STARTUP_CONNECT)
        } else {
            self.timeout
        }
    }

    /// Ends the start-up: from now on connections open within the command timeout.
    pub(super) fn started(&self) {
        self.starting
            .store(false, std::sync::atomic::Ordering::Release);
    }

    fn client_for(&self, info: ConnectionInfo) -> RedisResult<Client> {
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs
            && matches!(info.addr(), ConnectionAddr::TcpTls { .. })
        {
            return Client::build_with_tls(info, certs.clone());
        }
        Client::open(info)
    }

    fn node_with(
        &self,
        host: &str,
        port: u16,
        info: ConnectionInfo,
    ) -> Result<Arc<Node>, BackendError> {
        let addr = if port == 0 {
            host.to_owned()
        } else {
            format!("{host}:{port}")
        };
        if let Some(n) = self.nodes.lock().get(&addr) {
            return Ok(n.clone());
        }
        let client = self.client_for(info).map_err(|e| {
            BackendError::new(format!("redis at {addr}: not a usable address ({e})"))
        })?;
        let node = Arc::new(Node {
            addr: addr.clone(),
            client,
            pool: Mutex::new(Vec::new()),
            batch: Default::default(),
        });
        Ok(self.nodes.lock().entry(addr).or_insert(node).clone())
    }

    /// The node at `host:port`, reached with the seed's settings.
    pub(super) fn node(&self, host: &str, port: u16) -> Result<Arc<Node>, BackendError> {
        let addr = match self.base.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        self.node_with(host, port, self.base.clone().set_addr(addr))
    }

    fn node_at(&self, addr: &str) -> Option<Arc<Node>> {
        let (host, port) = addr.rsplit_once(':')?;
        self.node(host, port.parse().ok()?).ok()
    }

    /// Every primary, for loading scripts and scanning keys.
    pub(super) fn primaries(&self) -> Vec<Arc<Node>> {
        self.map.read().primaries.clone()
    }

    /// Where a subscriber may listen, starting at the `start`-th (mod their number):
    /// primaries, then replicas.
    pub(super) fn listen_candidates(&self, start: usize) -> Vec<Arc<Node>> {
        let map = self.map.read().clone();
        let mut all: Vec<Arc<Node>> = map.primaries.iter().chain(&map.replicas).cloned().collect();
        if !all.is_empty() {
            let n = start % all.len();
            all.rotate_left(n);
        }
        all
    }

    /// Every node (primaries and replicas), for `PUBSUB CHANNELS`: a subscriber
    /// shows only on the node it is connected to.
    pub(super) fn all_nodes(&self) -> Vec<Arc<Node>> {
        self.listen_candidates(0)
    }

    /// Reads the servers again (after a subscriber lost its node).
    pub(super) fn refresh_now(&self) {
        let seen = self.map.read().generation;
        if let Err(e) = self.refresh(seen, None) {
            log::debug!(target: "botmesh::redis", "refresh failed: {e}");
        }
    }

    /// Reads the slot map (or the sentinels' answer) again, unless another thread
    /// did since the map of generation `seen` was used. `avoid` (a node that just
    /// failed) is asked last.
    fn refresh(&self, seen: u64, avoid: Option<&str>) -> Result<(), BackendError> {
        let _one = self.refreshing.lock();
        if self.map.read().generation != seen {
            return Ok(());
        }
        let next = match &self.source {
            Source::Single => return Ok(()),
            Source::Cluster(seeds) => self.read_slots(seeds, avoid)?,
            Source::Sentinel(lookup) => {
                let (host, port) = lookup.primary(self.timeout)?;
                let node = self.node(&host, port)?;
                // Mid-failover a sentinel may name a replica not promoted yet.
                let role = self.on_node(&node, &mut |con| redis::cmd("ROLE").query(con))?;
                let is_primary = matches!(&role, Value::Array(v) if matches!(v.first(),
                    Some(Value::BulkString(b)) if b.as_slice() == b"master"));
                if !is_primary {
                    return Err(BackendError::new(format!(
                        "redis at {}: named primary by the sentinels but not (yet) a primary",
                        node.addr
                    )));
                }
                Map {
                    generation: 0,
                    slots: Vec::new(),
                    primaries: vec![node],
                    replicas: Vec::new(),
                }
            }
        };
        let mut map = self.map.write();
        let changed = map
            .primaries
            .iter()
            .map(|n| &n.addr)
            .ne(next.primaries.iter().map(|n| &n.addr));
        if changed {
            log::info!(target: "botmesh::redis", "{}: primaries now {}", self.label,
                next.primaries.iter().map(|n| n.addr.as_str()).collect::<Vec<_>>().join(", "));
        }
        *map = Arc::new(Map {
            generation: seen + 1,
            ..next
        });
        Ok(())
    }

    /// `CLUSTER SLOTS` from the first node that answers: the known primaries, then
    /// the replicas, then the seeds; `avoid` last.
    fn read_slots(
        &self,
        seeds: &[(String, u16)],
        avoid: Option<&str>,
    ) -> Result<Map, BackendError> {
        let known = self.listen_candidates(0);
        let mut asked: Vec<Arc<Node>> = Vec::new();
        for n in known {
            if !asked.iter().any(|a| a.addr == n.addr) {
                asked.push(n);
            }
        }
        for (h, p) in seeds {
            let n = self.node(h, *p)?;
            if !asked.iter().any(|a| a.addr == n.addr) {
                asked.push(n);
            }
        }
        asked.sort_by_key(|n| Some(n.addr.as_str()) == avoid);
        let mut last = String::from("no node to ask");
        for n in asked {
            let reply = n
                .take(self.connect_timeout(), self.timeout)
                .and_then(|mut con| {
                    let v: Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)?;
                    n.give(con);
                    Ok(v)
                });
            match reply {
                Ok(v) => match parse_slots(&n, v, &|h, p| self.node(h, p)) {
                    Ok(map) => return Ok(map),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => {
                    n.clear();
                    last = describe_at(&n.addr, self.timeout, &e).to_string();
                }
            }
        }
        Err(BackendError::new(format!(
            "{}: cannot read the cluster's slot map: {last}",
            self.label
        )))
    }

    /// Sets the owners that `MOVED` answers named.
    fn patch(&self, moved: &[(u16, String)]) {
        if moved.is_empty() {
            return;
        }
        let found: Vec<(u16, Arc<Node>)> = moved
            .iter()
            .filter_map(|(slot, to)| Some((*slot, self.node_at(to)?)))
            .collect();
        let mut map = self.map.write();
        if map.slots.is_empty() {
            return;
        }
        let mut next = Map {
            generation: map.generation + 1,
            slots: map.slots.clone(),
            primaries: map.primaries.clone(),
            replicas: map.replicas.clone(),
        };
        for (slot, node) in found {
            let index = match next.primaries.iter().position(|n| n.addr == node.addr) {
                Some(i) => i,
                None => {
                    next.primaries.push(node);
                    next.primaries.len() - 1
                }
            };
            if let (Some(s), Ok(i)) = (next.slots.get_mut(usize::from(slot)), u16::try_from(index))
            {
                *s = i;
            }
        }
        *map = Arc::new(next);
    }

    /// Loads the scripts on every primary.
    ///
    /// # Errors
    /// The first primary that fails.
    pub(super) fn load_everywhere(&self) -> Result<(), BackendError> {
        for node in self.primaries() {
            self.on_node(&node, &mut |con| (self.loader)(con).map(|()| Value::Okay))?;
        }
        Ok(())
    }

    /// Runs `f` on a connection to `node`, retried once on a fresh connection after
    /// a broken one; for commands that belong to one node (`SCAN`, `PUBSUB`,
    /// loading scripts), so no redirection applies.
    pub(super) fn on_node(
        &self,
        node: &Node,
        f: &mut dyn FnMut(&mut Connection) -> RedisResult<Value>,
    ) -> Result<Value, BackendError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut con = node
                .take(self.connect_timeout(), self.timeout)
                .map_err(|e| describe_at(&node.addr, self.timeout, &e))?;
            match f(&mut con) {
                Ok(v) => {
                    node.give(con);
                    return Ok(v);
                }
                Err(e) if is_transient(&e) && attempt < 2 => node.clear(),
                Err(e) => {
                    if is_transient(&e) {
                        node.clear();
                    } else {
                        node.give(con);
                    }
                    return Err(describe_at(&node.addr, self.timeout, &e));
                }
            }
        }
    }

    /// Runs one command on the primary of `slot`.
    pub(super) fn call(&self, slot: u16, cmd: &Cmd) -> Result<Value, BackendError> {
        self.run(&[(slot, cmd)])
            .pop()
            .unwrap_or_else(|| Err(BackendError::new("no reply from Redis")))
    }

    /// Runs every command on the primary of its slot, one pipeline per node per
    /// round (see the module docs); the answers in order, each its own success or
    /// failure.
    pub(super) fn run(&self, cmds: &[(u16, &Cmd)]) -> Vec<Result<Value, BackendError>> {
        self.run_replicated(cmds, None)
            .into_iter()
            .map(|r| r.map(|(v, _)| v))
            .collect()
    }

    /// As [`run`](Self::run), and with `replicas` = `Some((n, ms))` each node's pipeline
    /// ends with `WAIT n ms`: an answer comes with `true` when at least `n` replicas
    /// of its node acknowledged it (and every write the node made before it) within
    /// `ms`, `false` when they did not (the write stands on the primary, and a
    /// failover may lose it). With `None` every answer comes with `true`.
    pub(super) fn run_replicated(
        &self,
        cmds: &[(u16, &Cmd)],
        replicas: Option<(u32, u64)>,
    ) -> Vec<Result<(Value, bool), BackendError>> {
        let mut trailer = Vec::new();
        if let Some((n, ms)) = replicas {
            redis::cmd("WAIT")
                .arg(n)
                .arg(ms)
                .write_packed_command(&mut trailer);
        }
        let mut durable = vec![replicas.is_none(); cmds.len()];
        // Some node's replicas did not acknowledge: it may be a primary the others
        // left behind (a Sentinel failover promotes a replica and demotes the old
        // primary only later), so the map is read again once the call is over.
        let mut short = false;
        let started = Instant::now();
        let mut out: Vec<Option<Result<Value, BackendError>>> =
            (0..cmds.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..cmds.len()).collect();
        let mut asking: HashMap<usize, Arc<Node>> = HashMap::new();
        let mut last_err: HashMap<usize, BackendError> = HashMap::new();
        let mut wait = Duration::from_millis(10);
        for round in 0..ROUNDS {
            let map = self.map.read().clone();
            // Per node: the node, its command indices.
            let mut groups: Vec<(Arc<Node>, Vec<usize>)> = Vec::new();
            for &i in &pending {
                let node = match asking
                    .get(&i)
                    .cloned()
                    .or_else(|| map.owner(cmds[i].0).cloned())
                {
                    Some(n) => n,
                    None => {
                        last_err.insert(
                            i,
                            BackendError::new(format!(
                                "{}: no node serves hash slot {}",
                                self.label, cmds[i].0
                            )),
                        );
                        continue;
                    }
                };
                match groups.iter_mut().find(|(n, _)| n.addr == node.addr) {
                    Some((_, ids)) => ids.push(i),
                    None => groups.push((node, vec![i])),
                }
            }
            let mut later = false;
            let mut refresh: Option<String> = None;
            let mut reload: Vec<Arc<Node>> = Vec::new();
            let mut moved: Vec<(u16, String)> = Vec::new();
            let mut next: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|i| !groups.iter().any(|(_, ids)| ids.contains(i)))
                .collect();
            // Each node's replies, in the pipeline's order (`ASKING` and `WAIT`
            // included), or the error that kept its pipeline from being written.
            let mut sent: Vec<(Arc<Node>, Vec<usize>, Outcome)> = Vec::new();
            if let [(node, ids)] = groups.as_slice() {
                // One node (every turn call but a cluster's renewal tick): sent in a
                // batch with the other threads' calls to it (group commit).
                let (packed, n) = pack(cmds, ids, &asking, &trailer);
                let outcome = node.exchange(packed, n, self.connect_timeout(), self.timeout);
                sent.push((node.clone(), ids.clone(), outcome));
            } else {
                // Write every node's pipeline first, then read the replies: a round
                // costs about one round trip however many nodes it touches.
                let mut written = Vec::new();
                for (node, ids) in groups {
                    let (packed, n) = pack(cmds, &ids, &asking, &trailer);
                    let con =
                        node.take(self.connect_timeout(), self.timeout)
                            .and_then(|mut con| {
                                con.send_packed_command(&packed)?;
                                Ok(con)
                            });
                    written.push((node, ids, n, con));
                }
                for (node, ids, n, con) in written {
                    let outcome = con.map(|mut con| {
                        let (replies, usable) = read_replies(&mut con, n);
                        if usable {
                            node.give(con);
                        } else {
                            node.clear();
                        }
                        replies
                    });
                    sent.push((node, ids, outcome));
                }
            }
            for (node, ids, outcome) in sent {
                let mut replies = match outcome {
                    Ok(replies) => replies.into_iter(),
                    Err(e) => {
                        node.clear();
                        for &i in &ids {
                            last_err.insert(i, describe_at(&node.addr, self.timeout, &e));
                            next.push(i);
                        }
                        refresh.get_or_insert_with(|| node.addr.clone());
                        continue;
                    }
                };
                let mut recv = || {
                    replies.next().unwrap_or_else(|| {
                        Err(RedisError::from((
                            ErrorKind::Io,
                            "connection lost earlier in the pipeline",
                        )))
                    })
                };
                let mut answered = Vec::new();
                for &i in &ids {
                    let was_asking = asking.remove(&i).is_some();
                    let skipped = if was_asking {
                        recv().map(|_| ())
                    } else {
                        Ok(())
                    };
                    let reply = skipped.and_then(|()| recv());
                    let verdict = self.judge(reply);
                    match verdict {
                        Verdict::Done(Ok(v)) => {
                            answered.push(i);
                            out[i] = Some(Ok(v));
                        }
                        Verdict::Done(Err(e)) => {
                            out[i] = Some(Err(describe_at(&node.addr, self.timeout, &e)))
                        }
                        Verdict::Moved(slot, to) => {
                            last_err.insert(
                                i,
                                BackendError::new(format!(
                                    "redis at {}: MOVED {slot} {to}",
                                    node.addr
                                )),
                            );
                            refresh.get_or_insert_with(String::new);
                            moved.push((slot, to));
                            next.push(i);
                        }
                        Verdict::Ask(to) => {
                            match self.node_at(&to) {
                                Some(n) => {
                                    asking.insert(i, n);
                                }
                                None => refresh = refresh.or(Some(String::new())),
                            }
                            last_err.insert(
                                i,
                                BackendError::new(format!("redis at {}: ASK {to}", node.addr)),
                            );
                            next.push(i);
                        }
                        Verdict::Later => {
                            last_err.insert(i, BackendError::new(format!(
                                "redis at {}: the cluster is changing (no answer to retry within {})",
                                node.addr, humantime::format_duration(self.timeout))));
                            later = true;
                            refresh.get_or_insert_with(String::new);
                            next.push(i);
                        }
                        Verdict::Reload => {
                            if !reload.iter().any(|n| n.addr == node.addr) {
                                reload.push(node.clone());
                            }
                            last_err.insert(
                                i,
                                BackendError::new(format!(
                                    "redis at {}: the scripts are missing",
                                    node.addr
                                )),
                            );
                            next.push(i);
                        }
                        Verdict::Broken => {
                            // The rest of this pipeline's replies are lost with it
                            // (the connection was dropped as it broke).
                            node.clear();
                            last_err.insert(i, BackendError::new(format!(
                                "redis at {}: connection lost or no reply within the command timeout ({})",
                                node.addr, humantime::format_duration(self.timeout))));
                            refresh.get_or_insert_with(|| node.addr.clone());
                            next.push(i);
                        }
                    }
                }
                if let Some((n, _)) = replicas {
                    // How many replicas have this pipeline's writes; a failed read
                    // leaves the answers counted as not replicated.
                    match recv().and_then(Value::extract_error) {
                        Ok(Value::Int(got)) if got >= i64::from(n) => {
                            for &i in &answered {
                                durable[i] = true;
                            }
                        }
                        Ok(_) => short = true,
                        Err(e) => {
                            short = true;
                            log::debug!(target: "botmesh::redis", "WAIT at {}: {e}", node.addr);
                        }
                    }
                }
            }
            pending = next;
            if pending.is_empty() || round + 1 == ROUNDS || started.elapsed() >= self.timeout {
                break;
            }
            for node in reload {
                let loaded =
                    self.on_node(&node, &mut |con| (self.loader)(con).map(|()| Value::Okay));
                if let Err(e) = loaded {
                    log::warn!(target: "botmesh::redis", "cannot load the scripts: {e}");
                } else {
                    log::info!(target: "botmesh::redis", "redis at {} forgot the scripts; loaded them again", node.addr);
                }
            }
            if let Some(avoid) = refresh {
                let avoid = (!avoid.is_empty()).then_some(avoid);
                if let Err(e) = self.refresh(map.generation, avoid.as_deref()) {
                    log::debug!(target: "botmesh::redis", "{e}");
                }
            }
            // The node that answered MOVED knows better than a map read from a node
            // the news may not have reached yet.
            self.patch(&moved);
            if later {
                let left = self.timeout.saturating_sub(started.elapsed());
                // A retry back-off, not synchronisation: the cluster settles on its own.
                std::thread::sleep(wait.min(left));
                wait *= 2;
            }
        }
        if short {
            self.refresh_now();
        }
        for i in pending {
            out[i] = Some(Err(last_err.remove(&i).unwrap_or_else(|| {
                BackendError::new(format!("{}: no answer", self.label))
            })));
        }
        out.into_iter()
            .zip(durable)
            .map(|(o, d)| {
                o.unwrap_or_else(|| Err(BackendError::new("no reply from Redis")))
                    .map(|v| (v, d))
            })
            .collect()
    }

    fn judge(&self, reply: RedisResult<Value>) -> Verdict {
        let e = match reply.and_then(Value::extract_error) {
            Ok(v) => return Verdict::Done(Ok(v)),
            Err(e) => e,
        };
        if (self.missing)(&e) {
            return Verdict::Reload;
        }
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => match e.redirect_node() {
                Some((addr, slot)) => Verdict::Moved(slot, addr.to_owned()),
                None => Verdict::Later,
            },
            ErrorKind::Server(ServerErrorKind::Ask) => match e.redirect_node() {
                Some((addr, _)) => Verdict::Ask(addr.to_owned()),
                None => Verdict::Later,
            },
            ErrorKind::Server(
                ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly,
            ) => Verdict::Later,
            _ if is_transient(&e) => Verdict::Broken,
            _ => Verdict::Done(Err(e)),
        }
    }
}
