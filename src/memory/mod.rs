//! `MemoryCoordinator`: the backend for one process.
//!
//! Replicas simulated as threads (or several bots in one process) share one
//! `MemoryCoordinator` through an `Arc`. It keeps the whole [`Coordinator`] contract,
//! lease expiry included, so a replica can "crash" in a test ([`Replica::abort`]) and
//! its chats come free within the TTL, exactly as with Redis.
//!
//! The decisions live in the pure chat table (`table.rs`); this file is the thin
//! layer around it: shards by a hash of the chat id (so unrelated chats do not contend
//! on one mutex), the replicas' sinks and liveness (each shard caching the entries of
//! the replicas that call into it, so an uncontended call takes no lock but its
//! shard's), one process-wide token counter
//! (strictly increasing per chat even after an idle chat's state was dropped), the
//! [`Clock`], and pushing grants once no lock is held.
//!
//! Memory per chat: an active chat (held or waited for) is an entry of 112 bytes, its
//! name inside up to 24 bytes (a longer one on the heap besides), and its queue and
//! duplicate check, made on first use. An idle chat leaves its name and last holder, a
//! 64-byte entry (the name inside as before), for [`HISTORY`]
//! (1 h) after its release, so the next grant can name the previous holder (see
//! [`Grant::previous`]); then nothing, once a later sweep passes. A chat that had
//! message ids keeps its full entry, duplicate check included, for the longer of the
//! history and the dedup window, as the Redis backend keeps a chat's state hash.
//!
//! [`Replica::abort`]: crate::Replica::abort

use std::cell::OnceCell;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::clock::Clock;
use crate::coordinator::{
    BackendError, ChatView, Coordinator, DEFAULT_DEDUP_IDS, DEFAULT_DEDUP_WINDOW,
    DEFAULT_LEASE_TTL, EnqueueRequest, Enqueued, Grant, GrantSink, HISTORY, HeldLease, LeaderView,
    LeaseName, MAX_DEDUP_IDS, MeshView, Released, Renewal, ReplicaId, Ticket, Token, Waiting,
    lease_name, stored_name,
};

pub(crate) mod capacity;
mod chat_map;
mod dedup;
mod membership;
mod table;

use table::{ChatPushes, Env, FOREVER, Pushes, Shard};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

const SHARDS: usize = 32;

/// The in-process backend: one process, any number of replicas (threads).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use botmesh::{MemoryCoordinator, Replica};
///
/// let coordinator = Arc::new(MemoryCoordinator::new());
/// let replica = Replica::start("r1", coordinator.clone()).unwrap();
/// let turn = replica.acquire_timeout("chat-1", Duration::from_secs(1)).unwrap();
/// assert!(!turn.is_lost());
/// turn.release().unwrap();
/// replica.shutdown();
/// ```
pub struct MemoryCoordinator {
    /// The TTL of every lease granted.
    ttl: Duration,
    /// Duplicate-suppression window; zero turns it off.
    dedup_window: Duration,
    /// Handled message ids each chat remembers at least (see [`DEFAULT_DEDUP_IDS`]).
    dedup_ids: usize,
    /// Where "now" comes from: real, or fake in tests.
    clock: Clock,
    /// The chat table, split so unrelated chats do not contend on one lock.
    shards: Box<[Mutex<ShardCell>]>,
    /// Picks a chat's shard; randomly seeded.
    shard_hasher: foldhash::fast::RandomState,
    /// Attached replicas: where their grants are pushed, and until when they live.
    /// Each entry is shared with the shards' caches (see [`ShardCell::callers`]).
    replicas: RwLock<HashMap<ReplicaId, Arc<ReplicaEntry>>>,
    /// Held through every attach and detach, so that a stale run's stop and a later
    /// run's attach of the same id never interleave (a breaker's find, session 14).
    membership: Mutex<()>,
    /// Bumped (under the write lock of `replicas`) by every attach and detach: a
    /// shard's cache of callers built under an older value is dropped before use.
    replicas_gen: AtomicU64,
    /// The last fencing token handed out, for all chats.
    last_token: AtomicU64,
    /// The instant replicas' liveness and the table's lease ends are counted from
    /// (see [`ReplicaEntry`], `Env::now_ns`).
    base: Instant,
    /// `ttl` in ns, converted once.
    ttl_ns: u64,
    /// How long an idle chat's last holder is remembered, in ns.
    history_ns: u64,
}

struct ReplicaEntry {
    sink: GrantSink,
    /// The run of the id that attached (`attach_incarnation`; `None` from a plain
    /// `attach`): a detach by another run is a stale one and leaves this entry be.
    incarnation: Option<u64>,
    /// Until when the replica counts as alive, in ns since the coordinator's `base`:
    /// an atomic, so that every enqueue can push it forward (as Redis refreshes the
    /// replica's field in the chat) under the read lock alone.
    alive_until: AtomicU64,
}

impl ReplicaEntry {
    /// Until when `ticket` of this entry's id is alive: the entry's liveness, or
    /// `None` for a ticket below the attached run's first ticket number, a replaced
    /// run's (it stalled past its liveness and a later run took the id over; a grant
    /// to it would reach the later run, which would release it as a predecessor's,
    /// while the stalled run might still use it).
    fn alive_for(&self, ticket: &Ticket) -> Option<u64> {
        if self.incarnation.is_some_and(|first| ticket.seq < first) {
            return None;
        }
        Some(self.alive_until.load(Ordering::Acquire))
    }
}

/// One shard: its part of the chat table and the callers it has seen.
#[derive(Default)]
struct ShardCell {
    table: Shard,
    /// The entries of replicas that called into this shard, found under its lock
    /// without the replicas' read lock or a lookup by name: on the uncontended path
    /// those were a third of the backend's own cost.
    callers: Callers,
}

/// A shard's cache of replica entries (see [`ShardCell::callers`]).
#[derive(Default)]
struct Callers {
    /// At most [`CALLERS_CACHED`]; valid while `generation` equals the coordinator's
    /// `replicas_gen`.
    entries: Vec<(ReplicaId, Arc<ReplicaEntry>)>,
    /// The `replicas_gen` that `entries` was filled under.
    generation: u64,
}

/// Callers a shard remembers before it starts over (a process has a few replicas).
const CALLERS_CACHED: usize = 8;

/// How a call into a chat's shard counts as a sign of life of its caller.
#[derive(Clone, Copy)]
enum Refresh<'a> {
    /// Not at all (a cancel, a read).
    No,
    /// The caller's liveness is stored as at least a TTL from the call's `now`: an
    /// enqueue, whose new ticket the replica counts alive from its send time.
    Stored(&'a ReplicaId),
    /// Within the call the caller counts as alive for a TTL from `now`, exactly as
    /// with `Stored`; the stored liveness is moved only once it has fallen more than
    /// [`MemoryCoordinator::refresh_slack_ns`] behind. For calls the replica does not
    /// count its tickets' liveness from (`grant_if_free`, `release`): the replica
    /// assumes no more than its enqueues and renewals stored, and the grants made in
    /// the call itself see the full TTL. Saves a locked write per uncontended call.
    /// Such a grant's lease may end up to the slack after the stored liveness, which
    /// is why a replica counts as present (its id in use) for that much longer
    /// ([`MemoryCoordinator::present_until`]).
    InCall(&'a ReplicaId),
}

/// Whether two ids name one replica: by pointer first, as a replica passes the same
/// `Arc` to every call, else by name.
fn same_replica(a: &ReplicaId, b: &ReplicaId) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// A duration in ns, saturating (at about 584 years).
fn as_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Default for MemoryCoordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCoordinator")
            .field("lease_ttl", &self.ttl)
            .field("dedup_window", &self.dedup_window)
            .field("dedup_ids", &self.dedup_ids)
            .finish_non_exhaustive()
    }
}

impl MemoryCoordinator {
    /// A coordinator with the default lease TTL (10 s) and dedup window (10 min).
    pub fn new() -> Self {
        Self::with_settings(DEFAULT_LEASE_TTL, DEFAULT_DEDUP_WINDOW)
    }

    /// A coordinator with the given lease TTL and duplicate-suppression window (a zero
    /// window turns duplicate suppression off). Values over ~100 years are clamped, and
    /// a TTL under 1 ms is raised to 1 ms (a zero lease could never be held).
    pub fn with_settings(lease_ttl: Duration, dedup_window: Duration) -> Self {
        Self::with_clock(lease_ttl, dedup_window, Clock::real())
    }

    /// Like [`MemoryCoordinator::with_settings`], reading the time from `clock`: with
    /// [`Clock::fake`] a test expires leases, waits and claims by advancing the clock
    /// instead of sleeping.
    pub fn with_clock(lease_ttl: Duration, dedup_window: Duration, clock: Clock) -> Self {
        let base = clock.now();
        let ttl = lease_ttl.clamp(Duration::from_millis(1), FOREVER);
        MemoryCoordinator {
            ttl,
            dedup_window: dedup_window.min(FOREVER),
            dedup_ids: DEFAULT_DEDUP_IDS,
            clock,
            shards: (0..SHARDS)
                .map(|_| Mutex::new(ShardCell::default()))
                .collect(),
            shard_hasher: foldhash::fast::RandomState::default(),
            replicas: RwLock::new(HashMap::default()),
            membership: Mutex::new(()),
            replicas_gen: AtomicU64::new(0),
            last_token: AtomicU64::new(0),
            base,
            ttl_ns: as_ns(ttl),
            history_ns: as_ns(HISTORY),
        }
    }

    /// Sets how many handled message ids each chat remembers at least (default
    /// [`DEFAULT_DEDUP_IDS`], 64): a chat keeps its newest `n` to 1.5 × `n` handled ids,
    /// and forgets older ones in batches; for numeric ids that rise per chat a floor
    /// keeps suppressing the forgotten ones for the window (see the README's
    /// *Duplicates*). Clamped to 1..=[`MAX_DEDUP_IDS`]; `CoordinationConfig` refuses
    /// a value out of that range instead, naming `dedupIds`.
    #[must_use]
    pub fn with_dedup_ids(mut self, n: usize) -> Self {
        self.dedup_ids = n.clamp(1, MAX_DEDUP_IDS);
        self
    }

    /// The coordinator of a bot without coordination: leases never expire, so no
    /// renewal thread is needed.
    pub(crate) fn local() -> Self {
        Self::with_settings(FOREVER, DEFAULT_DEDUP_WINDOW)
    }

    /// How many chats currently have state (a holder or waiters): 0 when all are idle.
    pub fn active_chats(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().table.active_chats())
            .sum()
    }

    fn shard(&self, chat: &str) -> &Mutex<ShardCell> {
        let h = self.shard_hasher.hash_one(chat);
        &self.shards[(h as usize) % self.shards.len()]
    }

    /// `t` as ns since `base`, the form [`ReplicaEntry::alive_until`] and the table's
    /// lease ends keep.
    fn ns(&self, t: Instant) -> u64 {
        as_ns(t.saturating_duration_since(self.base))
    }

    /// Moves a replica's liveness to at least a TTL from `now_ns`.
    fn refresh(&self, entry: &ReplicaEntry, now_ns: u64) {
        entry
            .alive_until
            .fetch_max(now_ns.saturating_add(self.ttl_ns), Ordering::AcqRel);
    }

    /// How far a caller's stored liveness may lag a TTL from now before a
    /// [`Refresh::InCall`] stores it: a quarter of the TTL. A lease granted in such a
    /// call ends at most this long after its holder's stored liveness, so a replica
    /// counts as present (its id in use, listed live) until then: see
    /// [`MemoryCoordinator::present_until`].
    fn refresh_slack_ns(&self) -> u64 {
        self.ttl_ns / 4
    }

    /// Until when (ns, as `ns`) a replica counts as present: its stored liveness plus
    /// the refresh slack, which covers every lease it was granted (a grant in an
    /// `InCall` ends at most the slack after the liveness stored then). Its id is in
    /// use until then, and `inspect` lists it live; its waiting tickets still lapse
    /// with the stored liveness itself (the replica counts on no more for them).
    fn present_until(&self, entry: &ReplicaEntry) -> u64 {
        entry
            .alive_until
            .load(Ordering::Acquire)
            .saturating_add(self.refresh_slack_ns())
    }

    /// The caller's entry from a shard's cache, looked up in `replicas` on a miss;
    /// `None` when the caller is not attached. Called under the shard's lock, which
    /// is safe because nothing waits for a shard's lock while holding the replicas'
    /// (see `with_env`).
    fn cached_caller<'c>(
        &self,
        callers: &'c mut Callers,
        id: &ReplicaId,
    ) -> Option<&'c (ReplicaId, Arc<ReplicaEntry>)> {
        let now_gen = self.replicas_gen.load(Ordering::Acquire);
        if callers.generation != now_gen {
            callers.entries.clear();
            callers.generation = now_gen;
        }
        let cached = callers
            .entries
            .iter()
            .position(|(k, _)| same_replica(k, id));
        let at = match cached {
            Some(i) => i,
            None => {
                let found = self
                    .replicas
                    .read()
                    .get_key_value(id)
                    .map(|(k, e)| (k.clone(), e.clone()))?;
                if callers.entries.len() >= CALLERS_CACHED {
                    callers.entries.clear();
                }
                callers.entries.push(found);
                callers.entries.len() - 1
            }
        };
        callers.entries.get(at)
    }

    fn next_token(&self) -> Token {
        self.last_token.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Runs `f` with the table's environment at `now` (one clock read per call into
    /// the backend, taken by the caller). `refresh`: a replica the call is a sign of
    /// life of (see `enqueue`), refreshed first.
    ///
    /// For the calls that visit many shards (renew, detach). They read the replicas
    /// from a copy of the map (its entries shared, so liveness is read live) taken
    /// before any shard's lock: no thread waits for a shard's lock while it holds the
    /// replicas' lock, read or write, so a call into one shard may take the
    /// replicas' lock under its shard's (see `on_chat_at`) without the two ever
    /// waiting on each other. A copy per renewal tick costs little: a process has a
    /// few replicas.
    fn with_env<T>(
        &self,
        now: Instant,
        refresh: Option<&ReplicaId>,
        f: impl FnOnce(&Env<'_>) -> T,
    ) -> T {
        // One conversion per call: the table's times are ns since `base`.
        let now_ns = self.ns(now);
        let replicas = self.replicas.read().clone();
        let caller = refresh.and_then(|id| replicas.get_key_value(id));
        if let Some((_, entry)) = caller {
            self.refresh(entry, now_ns);
        }
        let alive_until = |t: &Ticket| match caller {
            Some((id, entry)) if same_replica(id, &t.replica) => entry.alive_for(t),
            _ => replicas.get(&t.replica).and_then(|e| e.alive_for(t)),
        };
        let next_token = || self.next_token();
        f(&self.env(now, now_ns, &alive_until, &next_token))
    }

    /// The table's environment at `now` (`now_ns` the same instant in ns).
    fn env<'a>(
        &self,
        now: Instant,
        now_ns: u64,
        alive_until: &'a dyn Fn(&Ticket) -> Option<u64>,
        next_token: &'a dyn Fn() -> Token,
    ) -> Env<'a> {
        Env {
            now,
            now_ns,
            ttl: self.ttl,
            ttl_ns: self.ttl_ns,
            history_ns: self.history_ns,
            dedup_window: self.dedup_window,
            dedup_ids: self.dedup_ids,
            alive_until,
            next_token,
        }
    }

    /// Runs one table operation on `chat`'s shard, then pushes the grants it made to
    /// other replicas, with no lock held (a sink may call back into the backend).
    fn on_chat<T>(
        &self,
        chat: &str,
        refresh: Refresh<'_>,
        op: impl FnOnce(&mut Shard, &Env<'_>, &mut Pushes) -> T,
    ) -> T {
        self.on_chat_at(chat, refresh, self.clock.now(), op)
    }

    /// The present for a call whose caller read the real clock as it sent it
    /// (`sent`): that reading when this table runs on the real clock (one clock read
    /// a call saved), else this table's own clock (a fake one).
    fn now_or(&self, sent: Instant) -> Instant {
        if self.clock.is_fake() {
            self.clock.now()
        } else {
            sent
        }
    }

    /// [`MemoryCoordinator::on_chat`] at `now`, read by the caller.
    ///
    /// The caller's entry comes from the shard's cache, so an uncontended call takes
    /// no lock but the shard's. Other replicas' liveness (needed only where tickets
    /// wait) is read under the replicas' read lock, taken once per call when first
    /// needed.
    fn on_chat_at<T>(
        &self,
        chat: &str,
        refresh: Refresh<'_>,
        now: Instant,
        op: impl FnOnce(&mut Shard, &Env<'_>, &mut Pushes) -> T,
    ) -> T {
        let mut pushes = Pushes::new();
        let now_ns = self.ns(now);
        let in_call = now_ns.saturating_add(self.ttl_ns);
        let result = {
            let mut guard = self.shard(chat).lock();
            let cell = &mut *guard;
            let (caller, stored) = match refresh {
                Refresh::No => (None, false),
                Refresh::Stored(id) => (self.cached_caller(&mut cell.callers, id), true),
                Refresh::InCall(id) => (self.cached_caller(&mut cell.callers, id), false),
            };
            if let Some((_, entry)) = caller {
                let alive = entry.alive_until.load(Ordering::Acquire);
                if stored || alive < in_call.saturating_sub(self.refresh_slack_ns()) {
                    self.refresh(entry, now_ns);
                }
            }
            let others = OnceCell::new();
            let alive_until = |t: &Ticket| match caller {
                Some((id, entry)) if same_replica(id, &t.replica) => {
                    // The call itself is a sign of life (see `Refresh`).
                    entry.alive_for(t).map(|alive| alive.max(in_call))
                }
                _ => others
                    .get_or_init(|| self.replicas.read())
                    .get(&t.replica)
                    .and_then(|e| e.alive_for(t)),
            };
            let next_token = || self.next_token();
            let env = self.env(now, now_ns, &alive_until, &next_token);
            op(&mut cell.table, &env, &mut pushes)
        };
        if !pushes.is_empty() {
            // Most calls push nothing: no iterator to make and drop for them.
            self.push(chat, pushes);
        }
        result
    }

    fn push(&self, chat: &str, pushes: Pushes) {
        for grant in pushes {
            self.push_one(chat, grant);
        }
    }

    fn push_chats(&self, pushes: ChatPushes) {
        for (chat, grant) in pushes {
            self.push_one(&chat, grant);
        }
    }

    fn push_one(&self, chat: &str, grant: Grant) {
        let sink = self
            .replicas
            .read()
            .get(&grant.ticket.replica)
            .map(|r| r.sink.clone());
        // A replica that detached meanwhile is skipped: its grant expires by TTL.
        if let Some(sink) = sink {
            sink(chat, grant);
        }
    }
}

impl Coordinator for MemoryCoordinator {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn lease_ttl(&self) -> Duration {
        self.ttl
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
        // An enqueue is a sign of life, as with Redis (which refreshes the replica's
        // field in the chat): the replica counts the lease of a grant made to this
        // ticket from the enqueue's send time, and a replica whose liveness lapsed
        // while it was cut off (its renewals failing) must not have its new ticket
        // skipped at once.
        Ok(self.on_chat(
            req.chat,
            Refresh::Stored(&req.ticket.replica),
            |shard, env, pushes| shard.enqueue(env, req, pushes),
        ))
    }

    fn grant_if_free(
        &self,
        req: &EnqueueRequest<'_>,
        sent: Instant,
    ) -> Result<Option<Grant>, BackendError> {
        // A sign of life within the call (see `Refresh::InCall`): the turn granted
        // lasts a TTL from `sent`. Nothing is queued, so nothing is pushed.
        Ok(self.on_chat_at(
            req.chat,
            Refresh::InCall(&req.ticket.replica),
            self.now_or(sent),
            |shard, env, _pushes| shard.grant_if_free(env, req),
        ))
    }

    fn cancel(&self, w: &Waiting<'_>) -> Result<Option<Grant>, BackendError> {
        Ok(self.on_chat(w.chat, Refresh::No, |shard, env, pushes| {
            shard.cancel(env, w, pushes)
        }))
    }

    fn release(
        &self,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
    ) -> Result<Released, BackendError> {
        self.release_sent(lease, handled, self.clock.now())
    }

    fn release_sent(
        &self,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
        sent: Instant,
    ) -> Result<Released, BackendError> {
        // The caller is alive: a grant it gets back in the answer (the chat handed on
        // to another of its tickets) lasts a full TTL, counted from its call.
        Ok(self.on_chat_at(
            lease.chat,
            Refresh::InCall(&lease.ticket.replica),
            self.now_or(sent),
            |shard, env, pushes| shard.release(env, lease, handled, pushes),
        ))
    }

    fn renew(
        &self,
        replica: &ReplicaId,
        held: &[HeldLease<'_>],
        waiting: &[Waiting<'_>],
    ) -> Result<Renewal, BackendError> {
        let mut pushes = ChatPushes::new();
        let out = self.with_env(self.clock.now(), Some(replica), |env| Renewal {
            held: held
                .iter()
                .map(|lease| self.shard(lease.chat).lock().table.renew(env, lease))
                .collect(),
            waiting: waiting
                .iter()
                .map(|w| {
                    let mut found = Pushes::new();
                    let state = self.shard(w.chat).lock().table.check(env, w, &mut found);
                    pushes.extend(found.into_iter().map(|g| (w.chat.to_owned(), g)));
                    state
                })
                .collect(),
        });
        self.push_chats(pushes);
        Ok(out)
    }

    fn write_checkpoint(
        &self,
        chat: &str,
        token: Token,
        data: Option<&str>,
    ) -> Result<bool, BackendError> {
        let now = self.clock.now();
        Ok(self
            .shard(chat)
            .lock()
            .table
            .write_checkpoint(now, self.ns(now), chat, token, data))
    }

    fn read_checkpoint(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError> {
        let now = self.clock.now();
        Ok(self.shard(chat).lock().table.read_checkpoint(now, chat))
    }

    fn inspect_chat(&self, chat: &str) -> Result<ChatView, BackendError> {
        let now = self.clock.now();
        let stored = stored_name(chat);
        let row = self.shard(&stored).lock().table.view(self.ns(now), &stored);
        Ok(match row {
            Some((_, holder, queued, previous)) => ChatView {
                chat: chat.to_owned(),
                holder,
                queued,
                previous,
            },
            None => ChatView {
                chat: chat.to_owned(),
                holder: None,
                queued: 0,
                previous: None,
            },
        })
    }

    fn inspect(&self, limit: usize) -> Result<MeshView, BackendError> {
        let now = self.clock.now();
        let mut rows = Vec::new();
        for shard in self.shards.iter() {
            shard.lock().table.views(self.ns(now), &mut rows);
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut view = MeshView::default();
        for (name, holder, queued, previous) in rows {
            match lease_name(&name) {
                LeaseName::Chat(chat) if view.chats.len() < limit => view.chats.push(ChatView {
                    chat: chat.to_owned(),
                    holder,
                    queued,
                    previous,
                }),
                LeaseName::Chat(_) => view.truncated = true,
                LeaseName::Provider(id) => view.leaders.push(LeaderView {
                    provider: id.to_owned(),
                    holder,
                    standbys: queued,
                }),
                LeaseName::Other => {}
            }
        }
        let mut replicas: Vec<ReplicaId> = self
            .replicas
            .read()
            .iter()
            .filter(|(_, r)| self.present_until(r) >= self.ns(now))
            .map(|(id, _)| id.clone())
            .collect();
        replicas.sort();
        view.replicas = replicas;
        Ok(view)
    }
}
