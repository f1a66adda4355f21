//! `RedisCoordinator`: turns shared by replicas in many processes and machines.
#![doc = include_str!("protocol.md")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Client, Cmd, Connection, ErrorKind, RedisError, ServerErrorKind, Value};
use serde::Deserialize;

use crate::coordinator::{
    BackendError, CHECKPOINT_TTL, ChatView, Coordinator, DEFAULT_DEDUP_IDS, DEFAULT_DEDUP_WINDOW,
    DEFAULT_LEASE_TTL, EnqueueRequest, Enqueued, Grant, GrantSink, HISTORY, HeldLease, MeshView,
    Released, Renewal, ReplicaId, TicketState, Token, Waiting,
};

mod inspect;
mod keys;
mod scripts;
mod server;
mod url;

use keys::{ChatKeys, grant_from, parse_grant, ticket_str};
use scripts::Scripts;
use url::connection_info;
pub(crate) use url::{check_parses, read_env};

/// Idle pooled connections kept at most.
const POOL_MAX: usize = 64;

/// Settings of a [`RedisCoordinator`].
#[derive(Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://` with a TLS feature of
    /// the `redis` crate). Never logged.
    pub url: String,
    /// Prefix of every key and channel, so bots can share a server. No `{` or `}`.
    /// Default `botmesh`.
    pub key_prefix: String,
    /// TTL of every lease; renewed every TTL/3. Default 10 s; at least 10 ms.
    pub lease_ttl: Duration,
    /// Duplicate-suppression window; zero turns it off. Default 10 min.
    pub dedup_window: Duration,
    /// How many handled message ids each chat remembers at least (1 to
    /// [`MAX_DEDUP_IDS`](crate::MAX_DEDUP_IDS), default
    /// [`DEFAULT_DEDUP_IDS`], 64; `dedupIds` in files): a
    /// chat's state hash keeps its newest `dedup_ids` to 1.5 × `dedup_ids` handled
    /// ids. Replicas sharing a server may differ; each release applies its own.
    pub dedup_ids: usize,
    /// Connect, read and write timeout of every Redis call. Default 2 s, or a third of
    /// the lease TTL when that is shorter (set through
    /// [`with_lease_ttl`](RedisOptions::with_lease_ttl)); must stay under half the
    /// lease TTL (see [`RedisCoordinator::connect`]).
    pub command_timeout: Duration,
    /// The password, given apart from the URL (from an environment variable: see
    /// [`RedisOptions::with_password_from_env`], or `passwordEnv` in files); it takes
    /// the place of any password in `url`. `None`: the URL's own, if any. Never logged.
    pub password: Option<String>,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &"<redacted>")
            .field("key_prefix", &self.key_prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("dedup_window", &self.dedup_window)
            .field("dedup_ids", &self.dedup_ids)
            .field("command_timeout", &self.command_timeout)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The default command timeout: 2 s.
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Refuses a command timeout that cannot work with the lease TTL: a renewal that
/// times out is retried once on a fresh connection, so it may take twice the command
/// timeout; when that reaches the TTL, one slow renewal loses every lease even though
/// Redis came back in time. The error text starts with the field name (`commandTimeoutMs`).
pub(crate) fn check_timeout_fits_lease(o: &RedisOptions) -> Result<(), String> {
    if o.command_timeout.saturating_mul(2) >= o.lease_ttl {
        return Err(format!(
            "commandTimeoutMs: {} is too long for leaseTtlMs {}: a renewal that times out \
             and is retried takes up to twice the command timeout, which must stay under the \
             lease TTL; use a command timeout under half the TTL",
            humantime::format_duration(o.command_timeout),
            humantime::format_duration(o.lease_ttl)
        ));
    }
    Ok(())
}

impl RedisOptions {
    /// Options for `url` with every default.
    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            url: url.into(),
            key_prefix: "botmesh".into(),
            lease_ttl: DEFAULT_LEASE_TTL,
            dedup_window: DEFAULT_DEDUP_WINDOW,
            dedup_ids: DEFAULT_DEDUP_IDS,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            password: None,
        }
    }

    /// Options for the URL held by the environment variable `var` (so the URL, with
    /// its password, stays out of files and command lines), with every default.
    ///
    /// # Errors
    /// A message naming the variable (never its value) when it is unset, empty or not
    /// UTF-8.
    pub fn from_env(var: &str) -> Result<Self, String> {
        Ok(Self::new(read_env("urlEnv", var)?))
    }

    /// Sets the password, taking the place of any password in the URL.
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Sets the password from the environment variable `var`.
    ///
    /// # Errors
    /// A message naming the variable (never its value) when it is unset, empty or not
    /// UTF-8.
    pub fn with_password_from_env(self, var: &str) -> Result<Self, String> {
        Ok(self.with_password(read_env("passwordEnv", var)?))
    }

    /// Sets the key prefix.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets the lease TTL. A command timeout still at its default is shortened to a
    /// third of the TTL if that is less, so a short TTL works without more settings
    /// (a timeout set with [`with_command_timeout`](Self::with_command_timeout) is kept
    /// and checked).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        if self.command_timeout == DEFAULT_COMMAND_TIMEOUT {
            self.command_timeout = DEFAULT_COMMAND_TIMEOUT.min(ttl / 3);
        }
        self
    }

    /// Sets the duplicate-suppression window.
    pub fn with_dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// Sets [`dedup_ids`](Self::dedup_ids), checked at
    /// [`connect`](RedisCoordinator::connect).
    pub fn with_dedup_ids(mut self, n: usize) -> Self {
        self.dedup_ids = n;
        self
    }

    /// Sets the timeout of every Redis call.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }
}

struct Subscriber {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The Redis backend: standalone Redis or Valkey 7+, shared by replicas in any number of
/// processes. See the module docs for the keys and scripts.
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
    client: Client,
    /// The server's address without credentials, for error messages.
    server: String,
    options: RedisOptions,
    ttl_ms: u64,
    pool: Mutex<Vec<Connection>>,
    scripts: Scripts,
    subscribers: Mutex<HashMap<ReplicaId, Subscriber>>,
}

impl std::fmt::Debug for RedisCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCoordinator")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Wake {
    c: String,
    t: String,
    k: String,
    pr: String,
    pk: String,
}

/// A Redis failure as a backend error naming the server (host:port or socket path,
/// never the user or password; RedisError's own text holds neither) and, for a
/// timeout, the timeout that ran out.
fn describe_at(server: &str, timeout: Duration, e: &RedisError) -> BackendError {
    if e.is_timeout() {
        BackendError::new(format!(
            "redis at {server}: no reply within the command timeout ({}): {e}",
            humantime::format_duration(timeout)
        ))
    } else if e.is_connection_refusal() {
        BackendError::new(format!("redis at {server}: cannot connect: {e}"))
    } else {
        BackendError::new(format!("redis at {server}: {e}"))
    }
}

/// Whether Redis lost the function library (a restart without persistence, or
/// `FUNCTION FLUSH`): it is loaded again and the call retried.
fn forgot_functions(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
        || e.to_string().contains("Function not found")
}

fn is_transient(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error()
}

impl RedisCoordinator {
    /// Connects (one connection, to check the URL and credentials now) and loads the
    /// scripts.
    ///
    /// # Errors
    /// [`BackendError`] for an invalid URL or key prefix, a lease TTL under 10 ms, a
    /// command timeout of half the lease TTL or more (a renewal that times out and is
    /// retried would outlast the lease), a `dedup_ids` of 0 or over
    /// [`MAX_DEDUP_IDS`](crate::MAX_DEDUP_IDS), or when Redis cannot be reached or refuses
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
        let client = Client::open(
            connection_info(&options.url, options.password.as_deref())
                .map_err(BackendError::new)?,
        )
        .map_err(|e| BackendError::new(format!("url: not a usable Redis URL ({e})")))?;
        let server = client.get_connection_info().addr().to_string();
        let ttl_ms = u64::try_from(options.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        let me = RedisCoordinator {
            client,
            server,
            options,
            ttl_ms,
            pool: Mutex::new(Vec::new()),
            scripts: Scripts::new(),
            subscribers: Mutex::new(HashMap::new()),
        };
        let mut con = me.open()?;
        me.load_scripts(&mut con).map_err(|e| me.describe(&e))?;
        server::warn_on_eviction(&me.server, &mut con);
        me.pool.lock().push(con);
        Ok(me)
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

    /// The server's address (host:port or socket path), without credentials.
    pub fn server(&self) -> &str {
        &self.server
    }

    fn describe(&self, e: &RedisError) -> BackendError {
        describe_at(&self.server, self.options.command_timeout, e)
    }

    fn open(&self) -> Result<Connection, BackendError> {
        let t = self.options.command_timeout;
        let con = self
            .client
            .get_connection_with_timeout(t)
            .map_err(|e| self.describe(&e))?;
        con.set_read_timeout(Some(t))
            .map_err(|e| self.describe(&e))?;
        con.set_write_timeout(Some(t))
            .map_err(|e| self.describe(&e))?;
        Ok(con)
    }

    fn load_scripts(&self, con: &mut Connection) -> Result<(), RedisError> {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.scripts.source)
            .exec(con)
    }

    /// Runs `f` on a pooled connection; on a broken connection retries once on a fresh
    /// one, and on `NOSCRIPT` (Redis restarted or flushed its scripts) reloads the
    /// scripts and retries.
    fn with_conn<T>(
        &self,
        mut f: impl FnMut(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let pooled = self.pool.lock().pop();
            let mut con = match pooled {
                Some(c) => c,
                None => self.open()?,
            };
            match f(&mut con) {
                Ok(v) => {
                    let mut pool = self.pool.lock();
                    if pool.len() < POOL_MAX {
                        pool.push(con);
                    }
                    return Ok(v);
                }
                Err(e) if forgot_functions(&e) && attempts < 3 => {
                    log::info!(target: "botmesh::redis", "Redis forgot the scripts; loading them again");
                    self.load_scripts(&mut con).map_err(|e| self.describe(&e))?;
                    self.pool.lock().push(con);
                }
                Err(e) if is_transient(&e) && attempts < 2 => {
                    log::debug!(target: "botmesh::redis", "retrying on a fresh connection: {e}");
                    // A broken connection is dropped, not returned to the pool; the
                    // others may be broken too (Redis restarted), so start afresh.
                    self.pool.lock().clear();
                }
                Err(e) => {
                    if is_transient(&e) {
                        self.pool.lock().clear();
                    }
                    return Err(self.describe(&e));
                }
            }
        }
    }

    fn chat_invocation(
        &self,
        function: &str,
        keys: &ChatKeys,
        message_id: Option<&str>,
        chat: &str,
        ticket: &str,
    ) -> Cmd {
        let mut inv = redis::cmd("FCALL");
        inv.arg(function)
            .arg(2)
            .arg(keys.key("s"))
            .arg(keys.key("q"))
            .arg(chat)
            .arg(ticket)
            .arg(self.ttl_ms)
            .arg(HISTORY.as_millis() as u64)
            .arg(self.wake_prefix())
            .arg(self.keep_ms())
            .arg(message_id.filter(|_| self.dedup_on()).unwrap_or(""));
        inv
    }

    /// How long a chat's state outlives its last grant, ms: the history and the dedup
    /// window both fit.
    fn keep_ms(&self) -> u64 {
        let keep = HISTORY.max(self.options.dedup_window);
        u64::try_from(keep.as_millis()).unwrap_or(u64::MAX)
    }

    fn wake_prefix(&self) -> String {
        // The prefix holds no braces, so the first `{` ends it: channels of different
        // prefixes and replica ids never coincide.
        format!("{}:{{wake}}:", self.options.key_prefix)
    }

    fn dedup_on(&self) -> bool {
        !self.options.dedup_window.is_zero()
    }

    fn stop_subscriber(&self, replica: &ReplicaId) {
        let sub = self.subscribers.lock().remove(replica);
        if let Some(mut sub) = sub {
            sub.stop.store(true, Ordering::Release);
            if let Some(t) = sub.thread.take()
                && t.join().is_err()
            {
                log::error!(target: "botmesh::redis", "the subscriber thread panicked");
            }
        }
    }
}

impl inspect::Reads for RedisCoordinator {
    fn prefix(&self) -> &str {
        &self.options.key_prefix
    }
    fn wake_prefix(&self) -> String {
        RedisCoordinator::wake_prefix(self)
    }
    fn read(
        &self,
        f: &mut dyn FnMut(&mut Connection) -> Result<Value, RedisError>,
    ) -> Result<Value, BackendError> {
        self.with_conn(f)
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

/// The subscriber thread of one replica: receives its grants from the wake channel
/// and hands them to the sink; reconnects with a back-off when the connection drops.
fn subscriber_loop(
    client: Client,
    channel: String,
    sink: GrantSink,
    stop: Arc<AtomicBool>,
    ready: crossbeam_channel::Sender<()>,
    timeout: Duration,
) {
    let mut backoff = Duration::from_millis(50);
    while !stop.load(Ordering::Acquire) {
        let mut con = match client.get_connection_with_timeout(timeout) {
            Ok(c) => c,
            Err(e) => {
                log::warn!(target: "botmesh::redis", "subscriber cannot connect: {e}");
                std::thread::sleep(backoff); // a reconnect back-off, not synchronisation
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let mut pubsub = con.as_pubsub();
        if let Err(e) = pubsub.subscribe(&channel) {
            log::warn!(target: "botmesh::redis", "subscribe failed: {e}");
            continue;
        }
        // Short reads, so a stop request is seen quickly.
        if pubsub
            .set_read_timeout(Some(Duration::from_millis(200)))
            .is_err()
        {
            continue;
        }
        backoff = Duration::from_millis(50);
        let _ = ready.try_send(());
        while !stop.load(Ordering::Acquire) {
            match pubsub.get_message() {
                Ok(msg) => {
                    let wake: Result<Wake, _> = serde_json::from_slice(msg.get_payload_bytes());
                    match wake {
                        Ok(w) => match parse_grant(&w.t, &w.k, &w.pr, &w.pk) {
                            Ok(grant) => sink(&w.c, grant),
                            Err(e) => log::warn!(target: "botmesh::redis", "bad wake-up: {e}"),
                        },
                        Err(e) => log::warn!(target: "botmesh::redis", "bad wake-up: {e}"),
                    }
                }
                Err(e) if e.is_timeout() => {}
                Err(e) => {
                    log::warn!(target: "botmesh::redis", "subscriber connection lost, reconnecting: {e}");
                    break;
                }
            }
        }
    }
}

fn strings(v: Value) -> Result<Vec<String>, BackendError> {
    redis::from_redis_value(v).map_err(|e| BackendError::new(format!("unexpected reply: {e}")))
}

impl Coordinator for RedisCoordinator {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn lease_ttl(&self) -> Duration {
        self.options.lease_ttl
    }

    fn attach(&self, replica: &ReplicaId, sink: GrantSink) -> Result<(), BackendError> {
        self.stop_subscriber(replica);
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
        let channel = format!("{}{}", self.wake_prefix(), replica);
        let client = self.client.clone();
        let stop2 = stop.clone();
        let timeout = self.options.command_timeout;
        let thread = std::thread::Builder::new()
            .name(format!("botmesh-sub-{replica}"))
            .spawn(move || subscriber_loop(client, channel, sink, stop2, ready_tx, timeout))
            .map_err(|e| BackendError::new(format!("cannot spawn the subscriber thread: {e}")))?;
        let sub = Subscriber {
            stop,
            thread: Some(thread),
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
                self.server
            )));
        }
        Ok(())
    }

    fn detach(&self, replica: &ReplicaId, held: &[HeldLease<'_>]) -> Result<(), BackendError> {
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
        self.stop_subscriber(replica);
        result
    }

    fn enqueue(&self, req: &EnqueueRequest<'_>) -> Result<Enqueued, BackendError> {
        let keys = ChatKeys::new(&self.options.key_prefix, req.chat);
        let ticket = ticket_str(req.ticket);
        let mut inv = self.chat_invocation(
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
        inv.arg(u64::try_from(claim_for.as_millis()).unwrap_or(u64::MAX));
        let reply: Vec<String> = self.with_conn(|con| inv.query(con))?;
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
        let mut inv = redis::cmd("FCALL");
        inv.arg(&self.scripts.write_checkpoint)
            .arg(2)
            .arg(keys.key("s"))
            .arg(keys.key("c"))
            .arg(token)
            .arg(u64::try_from(CHECKPOINT_TTL.as_millis()).unwrap_or(u64::MAX));
        if let Some(data) = data {
            inv.arg(data);
        }
        let applied: i64 = self.with_conn(|con| inv.query(con))?;
        Ok(applied == 1)
    }

    fn read_checkpoint(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError> {
        let key = ChatKeys::new(&self.options.key_prefix, chat).key("c");
        let value: Option<Vec<u8>> =
            self.with_conn(|con| redis::cmd("GET").arg(&key).query(con))?;
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
        let ticket = ticket_str(w.ticket);
        let inv = self.chat_invocation(&self.scripts.cancel, &keys, w.message_id, w.chat, &ticket);
        let reply: Vec<String> = self.with_conn(|con| inv.query(con))?;
        match reply.first().map(String::as_str) {
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
        let ticket = ticket_str(lease.ticket);
        let mut inv =
            self.chat_invocation(&self.scripts.release, &keys, handled, lease.chat, &ticket);
        inv.arg(lease.token.to_string())
            .arg(lease.ticket.replica.as_ref())
            .arg(self.options.dedup_ids);
        let reply: Vec<String> = self.with_conn(|con| inv.query(con))?;
        match reply.first().map(String::as_str) {
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
        let (renew, check) = (&self.scripts.renew, &self.scripts.check);
        let mut pipe = redis::pipe();
        for lease in held {
            let keys = ChatKeys::new(&self.options.key_prefix, lease.chat);
            pipe.cmd("FCALL")
                .arg(renew)
                .arg(1)
                .arg(keys.key("s"))
                .arg(ticket_str(lease.ticket))
                .arg(lease.token.to_string())
                .arg(self.ttl_ms)
                .arg(self.keep_ms());
        }
        let wake = self.wake_prefix();
        for w in waiting {
            let keys = ChatKeys::new(&self.options.key_prefix, w.chat);
            pipe.cmd("FCALL")
                .arg(check)
                .arg(2)
                .arg(keys.key("s"))
                .arg(keys.key("q"))
                .arg(w.chat)
                .arg(ticket_str(w.ticket))
                .arg(self.ttl_ms)
                .arg(HISTORY.as_millis() as u64)
                .arg(&wake)
                .arg(self.keep_ms())
                .arg("");
        }
        let replies: Vec<Value> = self.with_conn(|con| pipe.query(con))?;
        if replies.len() != held.len() + waiting.len() {
            return Err(BackendError::new("short pipeline reply from Redis"));
        }
        let mut out = Renewal::default();
        let mut it = replies.into_iter();
        for v in it.by_ref().take(held.len()) {
            let kept: i64 = redis::from_redis_value(v)
                .map_err(|e| BackendError::new(format!("unexpected reply: {e}")))?;
            out.held.push(kept == 1);
        }
        for v in it {
            let reply = strings(v)?;
            out.waiting.push(match reply.first().map(String::as_str) {
                Some("granted") => TicketState::Granted(grant_from(&reply)?),
                Some("waiting") => TicketState::Waiting,
                Some("lapsed") => TicketState::Lapsed,
                _ => TicketState::Gone,
            });
        }
        Ok(out)
    }
}
