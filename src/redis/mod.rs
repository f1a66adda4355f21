//! `RedisCoordinator`: turns shared by replicas in many processes and machines.
#![doc = include_str!("protocol.md")]
//!
//! # Redis Cluster, Sentinel, TLS
//!
//! - **Cluster** ([`RedisOptions::cluster`]): every function's keys are one chat's
//!   (the state hash `s` and the queue `q`, or `s` and the checkpoint `c`), all under
//!   the chat's hash tag, so each call goes to the primary of the chat's slot, read
//!   from `CLUSTER SLOTS`. The function library is loaded on every primary at connect
//!   and again on a node that answers that it lacks it (`FUNCTION LOAD` is
//!   replicated, but a node that joined later may not have it). Routing and retries:
//!   see `target.rs`; wake-ups: `subscriber.rs` (a plain `PUBLISH` reaches a
//!   subscriber on any node). A renewal that reaches some nodes and not others
//!   reports the unreachable nodes' leases lost and keeps the rest; when no node
//!   answers it fails as a whole, as with one server.
//! - **Sentinel** ([`RedisOptions::sentinel`]): one server whose address the
//!   sentinels give, asked again after a broken connection or a `READONLY` answer
//!   (the old primary demoted), so a failover is followed: waiters re-queue through
//!   the re-check, a lease the new primary does not have is reported lost.
//! - **TLS** (feature `tls`): `rediss://` URLs, with [`TlsOptions`] for a CA file and
//!   a client certificate; the same files serve every node of a cluster.
//!
//! Fencing tokens after a failover that lost the last writes (asynchronous
//! replication): the new primary may not know the last grant, but the next token is
//! still above it, being the new primary's time in µs, later than the lost grant's by
//! the failover's duration (seconds) as long as the servers' clocks agree better than
//! that. The lost grant's holder can still be running for up to one renewal period;
//! its fenced writes (checkpoints, release) are refused. `WAIT` on grants would close
//! that window at one more round trip per grant; it is not done.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Cmd, Value};

use crate::coordinator::{
    BackendError, CHECKPOINT_TTL, ChatView, Coordinator, EnqueueRequest, Enqueued, Grant,
    GrantSink, HISTORY, HeldLease, MeshView, Released, Renewal, ReplicaId, TicketState, Token,
    Waiting,
};

mod connect;
mod inspect;
mod keys;
mod node;
mod options;
mod scripts;
mod sentinel;
mod server;
mod subscriber;
mod target;
mod url;

use keys::{ChatKeys, check_replica_id, grant_from, ticket_str};
pub use options::{MAX_WAIT_REPLICAS, RedisOptions, SentinelOptions, TlsOptions};
pub(crate) use options::{check_mode, check_timeout_fits_lease, check_wait_replicas};
use scripts::Scripts;
use target::Target;
pub(crate) use url::{check_parses, read_env};

struct Subscriber {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The run of the replica id it listens for (`attach_incarnation`; `None` from a
    /// plain `attach`): a stop by an earlier run of the id leaves it listening.
    incarnation: Option<u64>,
}

/// The Redis backend: standalone Redis or Valkey 7+, a Redis Cluster, or a primary
/// found through Sentinel, shared by replicas in any number of processes. See the
/// module docs for the keys, scripts and modes.
///
/// ```no_run
/// use std::sync::Arc;
/// use botmesh::redis::{RedisCoordinator, RedisOptions};
/// use botmesh::Replica;
///
/// let options = RedisOptions::new("redis://127.0.0.1:6379").with_key_prefix("mybot");
/// let coordinator = Arc::new(RedisCoordinator::connect(options)?);
/// let replica = Replica::start("pod-1", coordinator)?;
/// let turn = replica.acquire_timeout("chat-1", std::time::Duration::from_secs(5))?;
/// turn.release()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisCoordinator {
    /// Where each command goes (one server, a cluster's primaries, or the primary
    /// the sentinels name), with the pools and retries.
    target: Arc<Target>,
    options: RedisOptions,
    ttl_ms: u64,
    /// The per-chat functions' settings argument (see [`Scripts`]'s `settings`),
    /// the same in every call of this coordinator: made once.
    settings: String,
    scripts: Arc<Scripts>,
    subscribers: Mutex<HashMap<ReplicaId, Subscriber>>,
}

impl std::fmt::Debug for RedisCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCoordinator")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedisCoordinator {
    /// Connects (to check the URLs and credentials now; in cluster mode reads the
    /// slot map, under Sentinel asks for the primary) and loads the scripts on every
    /// primary.
    ///
    /// # Errors
    /// [`BackendError`] for an invalid URL or key prefix, none or more than one of
    /// `url`, `cluster` and `sentinel`, a `rediss://` URL or TLS files without the
    /// `tls` feature, a TLS file that cannot be read, a lease TTL under 10 ms, a
    /// command timeout of half the lease TTL or more (a renewal that times out and is
    /// retried would outlast the lease), or when Redis cannot be reached or refuses
    /// the credentials.
    pub fn connect(options: RedisOptions) -> Result<Self, BackendError> {
        if options.key_prefix.contains(['{', '}']) {
            return Err(BackendError::new(format!(
                "key_prefix: {:?} contains a brace; braces would change the Redis Cluster hash slot",
                options.key_prefix
            )));
        }
        if options.lease_ttl < Duration::from_millis(10) {
            return Err(BackendError::new(format!(
                "lease_ttl: {:?} is under the 10 ms minimum",
                options.lease_ttl
            )));
        }
        // Redis takes expiries as integer milliseconds; the same bound as the config.
        const MAX: Duration = Duration::from_millis(2_147_483_647);
        for (name, d) in [
            ("lease_ttl", options.lease_ttl),
            ("dedup_window", options.dedup_window),
            ("command_timeout", options.command_timeout),
        ] {
            if d > MAX {
                return Err(BackendError::new(format!(
                    "{name}: {} is over the 2^31-1 ms (about 24.8 days) maximum",
                    humantime::format_duration(d)
                )));
            }
        }
        check_timeout_fits_lease(&options).map_err(BackendError::new)?;
        crate::coordinator::check_dedup_ids("dedup_ids", options.dedup_ids)
            .map_err(BackendError::new)?;
        check_wait_replicas("wait_replicas", options.wait_replicas).map_err(BackendError::new)?;
        let scripts = Arc::new(Scripts::new());
        let loading = scripts.clone();
        let target = connect::target(
            &options,
            Box::new(move |con| loading.load(con)),
            Scripts::is_missing,
        )?;
        target.load_everywhere()?;
        if options.wait_replicas > 0 {
            check_replicas(&target, options.wait_replicas)?;
        }
        for node in target.primaries() {
            let _ = target.on_node(&node, &mut |con| {
                server::warn_on_eviction(&node.addr, con);
                Ok(Value::Okay)
            });
        }
        target.started();
        let ttl_ms = u64::try_from(options.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        let settings = scripts::settings(
            ttl_ms,
            HISTORY.as_millis() as u64,
            keep_ms(&options),
            options.dedup_ids,
            &wake_prefix(&options),
        );
        Ok(RedisCoordinator {
            target: Arc::new(target),
            options,
            ttl_ms,
            settings,
            scripts,
            subscribers: Mutex::new(HashMap::new()),
        })
    }

    /// Connects to `url` with default options.
    ///
    /// # Errors
    /// As [`RedisCoordinator::connect`].
    pub fn open_url(url: &str) -> Result<Self, BackendError> {
        Self::connect(RedisOptions::new(url))
    }

    /// The options in use.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// The server's address (host:port or socket path), or in cluster mode the seed
    /// nodes' and under Sentinel the sentinels' (with the service), without
    /// credentials.
    pub fn server(&self) -> &str {
        &self.target.label
    }

    /// The addresses (host:port) of the primaries in use now: the one server, a
    /// cluster's primaries as last read from its slot map, or the primary the
    /// sentinels named last.
    pub fn primaries(&self) -> Vec<String> {
        self.target
            .primaries()
            .iter()
            .map(|n| n.addr.clone())
            .collect()
    }

    /// A per-chat function call (`FCALL` of `function` over the chat's keys `s`
    /// and `q`, one hash slot) and the chat's hash slot: every script call goes
    /// through [`Target::call`] or [`Target::run`] with one of these.
    fn chat_cmd(
        &self,
        function: &str,
        keys: &ChatKeys,
        message_id: Option<&str>,
        chat: &str,
        ticket: &str,
    ) -> (u16, Cmd) {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(function)
            .arg(2)
            .arg(keys.key("s"))
            .arg(keys.key("q"))
            .arg(chat)
            .arg(ticket)
            .arg(&self.settings)
            .arg(message_id.filter(|_| self.dedup_on()).unwrap_or(""));
        (keys.slot(), cmd)
    }

    /// How long a chat's state outlives its last grant, ms: the history and the dedup
    /// window both fit.
    fn keep_ms(&self) -> u64 {
        keep_ms(&self.options)
    }

    fn wake_prefix(&self) -> String {
        wake_prefix(&self.options)
    }

    /// `WAIT` after each turn call's pipeline, when `wait_replicas` asks for it: how
    /// many replicas, and for how long (half the command timeout, so the pipeline's
    /// reply still arrives within the timeout).
    fn replicas(&self) -> Option<(u32, u64)> {
        let n = u32::try_from(self.options.wait_replicas)
            .ok()
            .filter(|&n| n > 0)?;
        let ms = u64::try_from((self.options.command_timeout / 2).as_millis()).unwrap_or(1);
        Some((n, ms.max(1)))
    }

    /// One turn call on its chat's primary, followed by `WAIT` when asked: the answer
    /// and whether enough replicas acknowledged it.
    fn call_replicated(&self, slot: u16, cmd: &Cmd) -> Result<(Value, bool), BackendError> {
        self.target
            .run_replicated(&[(slot, cmd)], self.replicas())
            .pop()
            .unwrap_or_else(|| Err(BackendError::new("no reply from Redis")))
    }

    /// The error of a write the replicas did not acknowledge in time.
    fn unreplicated(&self, what: &str) -> BackendError {
        BackendError::new(format!(
            "{}: {what} was not acknowledged by {} replica(s) within {} (wait_replicas); \
             it may be applied on the primary only",
            self.target.label,
            self.options.wait_replicas,
            humantime::format_duration(self.options.command_timeout / 2)
        ))
    }

    fn dedup_on(&self) -> bool {
        !self.options.dedup_window.is_zero()
    }

    /// Attaches `replica`'s run `incarnation`: its wake-up subscriber (replacing an
    /// earlier run's) is live on return.
    fn attach_run(
        &self,
        replica: &ReplicaId,
        incarnation: Option<u64>,
        sink: GrantSink,
    ) -> Result<(), BackendError> {
        // The same check as every call's: the wake-ups name the replica too.
        check_replica_id(replica)?;
        self.stop_subscriber(replica);
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
        let channel = format!("{}{}", self.wake_prefix(), replica);
        let listen = subscriber::Listen {
            target: self.target.clone(),
            start: subscriber::start_for(replica),
            channel,
            sink,
            stop: stop.clone(),
            ready: ready_tx,
        };
        let thread = std::thread::Builder::new()
            .name(format!("botmesh-sub-{replica}"))
            .spawn(move || subscriber::subscriber_loop(listen))
            .map_err(|e| BackendError::new(format!("cannot spawn the subscriber thread: {e}")))?;
        let sub = Subscriber {
            stop,
            thread: Some(thread),
            incarnation,
        };
        self.subscribers.lock().insert(replica.clone(), sub);
        // Grants can only be pushed once the subscription is live.
        if ready_rx
            .recv_timeout((self.options.command_timeout * 2).max(Duration::from_secs(2)))
            .is_err()
        {
            self.stop_subscriber(replica);
            return Err(BackendError::new(format!(
                "redis at {}: could not subscribe to the wake channel",
                self.target.label
            )));
        }
        Ok(())
    }

    /// A clean stop of `replica`'s run `incarnation` (`None`: whichever listens):
    /// releases `held` by their tokens, and stops the id's subscriber unless a later
    /// run of the id attached it (see `Coordinator::detach_incarnation`).
    fn detach_run(
        &self,
        replica: &ReplicaId,
        incarnation: Option<u64>,
        held: &[HeldLease<'_>],
    ) -> Result<(), BackendError> {
        let mut result = Ok(());
        for lease in held {
            match self.release(lease, None) {
                Ok(Released::Released { next: Some(g) }) => {
                    // Our own next ticket: nobody will take it now; release it too.
                    let t = g.ticket.clone();
                    let again = HeldLease {
                        chat: lease.chat,
                        ticket: &t,
                        token: g.token,
                    };
                    let _ = self.release(&again, None);
                }
                Ok(_) => {}
                Err(e) => {
                    // Redis is unreachable: the rest would time out one by one. Their
                    // leases lapse within the TTL instead.
                    result = Err(e);
                    break;
                }
            }
        }
        // Checked and taken under one lock: a later run attaching meanwhile keeps its.
        let ours = {
            let mut subscribers = self.subscribers.lock();
            let listening = subscribers.get(replica).and_then(|s| s.incarnation);
            let later = incarnation.is_some_and(|run| listening.is_some_and(|l| l != run));
            if later {
                None
            } else {
                subscribers.remove(replica)
            }
        };
        if let Some(sub) = ours {
            end_subscriber(sub);
        }
        result
    }

    fn stop_subscriber(&self, replica: &ReplicaId) {
        let sub = self.subscribers.lock().remove(replica);
        if let Some(sub) = sub {
            end_subscriber(sub);
        }
    }
}

/// Stops a subscriber taken out of the map and waits for its thread.
fn end_subscriber(mut sub: Subscriber) {
    sub.stop.store(true, Ordering::Release);
    if let Some(t) = sub.thread.take()
        && t.join().is_err()
    {
        log::error!(target: "botmesh::redis", "the subscriber thread panicked");
    }
}

impl inspect::Reads for RedisCoordinator {
    fn prefix(&self) -> &str {
        &self.options.key_prefix
    }
    fn wake_prefix(&self) -> String {
        RedisCoordinator::wake_prefix(self)
    }
    fn target(&self) -> &Target {
        &self.target
    }
}

impl Drop for RedisCoordinator {
    fn drop(&mut self) {
        let ids: Vec<ReplicaId> = self.subscribers.lock().keys().cloned().collect();
        for id in ids {
            self.stop_subscriber(&id);
        }
    }
}

/// How long a chat's state outlives its last grant, ms: the history and the dedup
/// window both fit.
fn keep_ms(options: &RedisOptions) -> u64 {
    let keep = HISTORY.max(options.dedup_window);
    u64::try_from(keep.as_millis()).unwrap_or(u64::MAX)
}

/// The prefix of the replicas' wake-up channels.
fn wake_prefix(options: &RedisOptions) -> String {
    // The prefix holds no braces, so the first `{` ends it: channels of different
    // prefixes and replica ids never coincide.
    format!("{}:{{wake}}:", options.key_prefix)
}

/// Refuses `wait_replicas` above the replicas a primary has connected now: every write
/// would wait its `WAIT` out and fail, and the bot would crawl instead of working.
fn check_replicas(target: &Target, wanted: usize) -> Result<(), BackendError> {
    for node in target.primaries() {
        let info: String = typed(target.on_node(&node, &mut |con| {
            redis::cmd("INFO").arg("replication").query(con)
        })?)?;
        let connected = info
            .lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if connected < wanted {
            return Err(BackendError::new(format!(
                "wait_replicas: {wanted} replica(s) must acknowledge each write, but the primary \
                 at {} has {connected} connected; every write would wait and fail (lower \
                 wait_replicas, or connect the replicas first)",
                node.addr
            )));
        }
    }
    Ok(())
}

fn typed<T: redis::FromRedisValue>(v: Value) -> Result<T, BackendError> {
    redis::from_redis_value(v).map_err(|e| BackendError::new(format!("unexpected reply: {e}")))
}

/// A per-chat function's reply: its tag and fields, sent as one string separated by
/// NULs (no ticket, token or replica id holds a NUL).
fn strings(v: Value) -> Result<Vec<String>, BackendError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b)
            .map(|s| s.split('\0').map(str::to_owned).collect())
            .map_err(|_| BackendError::new("a reply from Redis that is not UTF-8")),
        other => typed(other),
    }
}

impl Coordinator for RedisCoordinator {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn lease_ttl(&self) -> Duration {
        self.options.lease_ttl
    }

    fn pushes_need_confirmation(&self) -> bool {
        self.options.wait_replicas > 0
    }

    fn attach(&self, replica: &ReplicaId, sink: GrantSink) -> Result<(), BackendError> {
        self.attach_run(replica, None, sink)
    }

    fn attach_incarnation(
        &self,
        replica: &ReplicaId,
        incarnation: u64,
        sink: GrantSink,
    ) -> Result<(), BackendError> {
        self.attach_run(replica, Some(incarnation), sink)
    }

    fn detach(&self, replica: &ReplicaId, held: &[HeldLease<'_>]) -> Result<(), BackendError> {
        self.detach_run(replica, None, held)
    }

    fn detach_incarnation(
        &self,
        replica: &ReplicaId,
        incarnation: u64,
        held: &[HeldLease<'_>],
    ) -> Result<(), BackendError> {
        self.detach_run(replica, Some(incarnation), held)
    }

    fn enqueue(&self, req: &EnqueueRequest<'_>) -> Result<Enqueued, BackendError> {
        let keys = ChatKeys::new(&self.options.key_prefix, req.chat);
        let ticket = ticket_str(req.ticket)?;
        let (slot, mut cmd) = self.chat_cmd(
            &self.scripts.enqueue,
            &keys,
            req.message_id,
            req.chat,
            &ticket,
        );
        // The claim outlives the message's wait (and one lease more), also under a
        // dedup window shorter than that: a claim that expired while its message still
        // waited would let a redelivery run the message a second time.
        let claim_for = self
            .options
            .dedup_window
            .max(req.wait.saturating_add(self.options.lease_ttl));
        cmd.arg(u64::try_from(claim_for.as_millis()).unwrap_or(u64::MAX));
        let (reply, replicated) = self.call_replicated(slot, &cmd)?;
        if !replicated {
            // Not taken in: the caller treats the message as not accepted. A ticket
            // left queued on the primary is granted to nobody who waits for it and
            // released (or lapses with this replica's liveness).
            return Err(self.unreplicated("the enqueue"));
        }
        let reply = strings(reply)?;
        match reply.first().map(String::as_str) {
            Some("granted") => Ok(Enqueued::Granted(grant_from(&reply)?)),
            Some("queued") => Ok(Enqueued::Queued),
            Some("duplicate") => Ok(Enqueued::Duplicate),
            Some("inflight") => Ok(Enqueued::InFlight),
            _ => Err(BackendError::new("unexpected enqueue reply from Redis")),
        }
    }

    fn write_checkpoint(
        &self,
        chat: &str,
        token: Token,
        data: Option<&str>,
    ) -> Result<bool, BackendError> {
        let keys = ChatKeys::new(&self.options.key_prefix, chat);
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.scripts.write_checkpoint)
            .arg(2)
            .arg(keys.key("s"))
            .arg(keys.key("c"))
            .arg(token)
            .arg(u64::try_from(CHECKPOINT_TTL.as_millis()).unwrap_or(u64::MAX));
        if let Some(data) = data {
            cmd.arg(data);
        }
        let (reply, replicated) = self.call_replicated(keys.slot(), &cmd)?;
        let applied: i64 = typed(reply)?;
        if applied == 1 && !replicated {
            return Err(self.unreplicated("the checkpoint write"));
        }
        Ok(applied == 1)
    }

    fn read_checkpoint(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError> {
        let keys = ChatKeys::new(&self.options.key_prefix, chat);
        let value: Option<Vec<u8>> = typed(
            self.target
                .call(keys.slot(), redis::cmd("GET").arg(keys.key("c")))?,
        )?;
        let Some(value) = value else { return Ok(None) };
        let parsed = value.iter().position(|&b| b == 0).and_then(|i| {
            let token = std::str::from_utf8(&value[..i]).ok()?.parse().ok()?;
            Some((token, String::from_utf8_lossy(&value[i + 1..]).into_owned()))
        });
        // A value not in botmesh's layout (written by hand, or by another program) is
        // handed on as it is, with token 0: it will not parse as a checkpoint, and
        // the `fallback` policy deals with it instead of the chat being blocked.
        Ok(Some(parsed.unwrap_or_else(|| {
            (0, String::from_utf8_lossy(&value).into_owned())
        })))
    }

    fn cancel(&self, w: &Waiting<'_>) -> Result<Option<Grant>, BackendError> {
        let keys = ChatKeys::new(&self.options.key_prefix, w.chat);
        let ticket = ticket_str(w.ticket)?;
        let (slot, cmd) = self.chat_cmd(&self.scripts.cancel, &keys, w.message_id, w.chat, &ticket);
        let (reply, replicated) = self.call_replicated(slot, &cmd)?;
        let reply = strings(reply)?;
        match reply.first().map(String::as_str) {
            // A grant the replicas may not have cannot be run on.
            Some("granted") if !replicated => Err(self.unreplicated("the grant")),
            Some("granted") => Ok(Some(grant_from(&reply)?)),
            Some("cancelled") => Ok(None),
            _ => Err(BackendError::new("unexpected cancel reply from Redis")),
        }
    }

    fn release(
        &self,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
    ) -> Result<Released, BackendError> {
        let keys = ChatKeys::new(&self.options.key_prefix, lease.chat);
        let ticket = ticket_str(lease.ticket)?;
        let (slot, mut cmd) =
            self.chat_cmd(&self.scripts.release, &keys, handled, lease.chat, &ticket);
        cmd.arg(lease.token.to_string())
            .arg(lease.ticket.replica.as_ref());
        let (reply, replicated) = self.call_replicated(slot, &cmd)?;
        let reply = strings(reply)?;
        match reply.first().map(String::as_str) {
            // The hand-over to our own next ticket is not run on until the replicas
            // have it: the next re-check finds it granted (and waits for them again).
            Some("released") if reply.len() >= 5 && !replicated => {
                Ok(Released::Released { next: None })
            }
            Some("released") if reply.len() >= 5 => Ok(Released::Released {
                next: Some(grant_from(&reply)?),
            }),
            Some("released") => Ok(Released::Released { next: None }),
            Some("lost") => Ok(Released::Lost),
            _ => Err(BackendError::new("unexpected release reply from Redis")),
        }
    }

    fn inspect_chat(&self, chat: &str) -> Result<ChatView, BackendError> {
        inspect::inspect_chat(self, chat)
    }

    fn inspect(&self, limit: usize) -> Result<MeshView, BackendError> {
        inspect::inspect(self, limit)
    }

    fn renew(
        &self,
        _replica: &ReplicaId,
        held: &[HeldLease<'_>],
        waiting: &[Waiting<'_>],
    ) -> Result<Renewal, BackendError> {
        if held.is_empty() && waiting.is_empty() {
            return Ok(Renewal::default());
        }
        // One command per lease and per waiting ticket, each routed to its chat's
        // primary: one pipeline per node (see `target`).
        let mut cmds: Vec<(u16, Cmd)> = Vec::with_capacity(held.len() + waiting.len());
        for lease in held {
            let keys = ChatKeys::new(&self.options.key_prefix, lease.chat);
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(&self.scripts.renew)
                .arg(1)
                .arg(keys.key("s"))
                .arg(ticket_str(lease.ticket)?)
                .arg(lease.token.to_string())
                .arg(self.ttl_ms)
                .arg(self.keep_ms());
            cmds.push((keys.slot(), cmd));
        }
        for w in waiting {
            let keys = ChatKeys::new(&self.options.key_prefix, w.chat);
            cmds.push(self.chat_cmd(
                &self.scripts.check,
                &keys,
                None,
                w.chat,
                &ticket_str(w.ticket)?,
            ));
        }
        let refs: Vec<(u16, &Cmd)> = cmds.iter().map(|(s, c)| (*s, c)).collect();
        let replies = self.target.run_replicated(&refs, self.replicas());
        // Nothing got through: as with one server, the renewal failed (the replica
        // keeps its leases until they run out). When only some nodes failed (a
        // cluster primary died), the leases there are reported lost (their holder
        // cannot reach them: no release, no checkpoint) and their waiters stay
        // waiting; the other nodes' leases are kept.
        if let Some(Err(first)) = replies.iter().find(|r| r.is_err())
            && replies.iter().all(Result::is_err)
        {
            return Err(first.clone());
        }
        // Nothing acknowledged by the replicas (`wait_replicas`): as good as not sent;
        // the leases run out at the end this replica already knows.
        if replies.iter().all(|r| !matches!(r, Ok((_, true)))) {
            return Err(self.unreplicated("the renewal"));
        }
        let mut out = Renewal::default();
        let mut it = replies.into_iter();
        for r in it.by_ref().take(held.len()) {
            out.held.push(match r {
                // An extension the replicas may not have is not counted: a failover
                // could bring back the lease's earlier end.
                Ok((v, replicated)) => typed::<i64>(v)? == 1 && replicated,
                Err(e) => {
                    log::warn!(target: "botmesh::redis", "renewal: {e}");
                    false
                }
            });
        }
        for r in it {
            let Ok((v, replicated)) = r else {
                out.waiting.push(TicketState::Waiting);
                continue;
            };
            let reply = strings(v)?;
            out.waiting.push(match reply.first().map(String::as_str) {
                // Asked again next tick, once the replicas may have it.
                Some("granted") if !replicated => TicketState::Waiting,
                Some("granted") => TicketState::Granted(grant_from(&reply)?),
                Some("waiting") => TicketState::Waiting,
                Some("lapsed") => TicketState::Lapsed,
                _ => TicketState::Gone,
            });
        }
        Ok(out)
    }
}
