//! `MemoryCoordinator`: the backend for one process.
//!
//! Replicas simulated as threads (or several bots in one process) share one
//! `MemoryCoordinator` through an `Arc`. It keeps the whole [`Coordinator`] contract,
//! lease expiry included, so a replica can "crash" in a test ([`Replica::abort`]) and
//! its chats come free within the TTL, exactly as with Redis.
//!
//! State is split into shards by a hash of the chat id, so unrelated chats do not
//! contend on one mutex. Fencing tokens come from one process-wide counter, which makes
//! them strictly increasing per chat even after an idle chat's state was dropped.
//! Expiry is evaluated lazily, like Redis key expiry: whoever touches a chat next
//! (a release, an enqueue, the re-check in [`Coordinator::renew`]) moves it on.
//!
//! [`Replica::abort`]: crate::Replica::abort

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The turn table's maps use foldhash (randomly seeded per map, far cheaper than
/// SipHash on short keys): every message costs several lookups.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use parking_lot::{Mutex, RwLock};

use crate::coordinator::{
    BackendError, CHECKPOINT_TTL, Coordinator, EnqueueRequest, Enqueued, Grant, GrantSink,
    HeldLease, Previous, Released, Renewal, ReplicaId, Ticket, TicketState, Token, Waiting,
};

const SHARDS: usize = 32;
/// Durations are clamped here so that `Instant + d` cannot overflow (about 100 years).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long an idle chat's last holder is remembered (for [`Grant::previous`]).
pub const HISTORY: Duration = Duration::from_secs(3600);

/// The default lease TTL: 10 s.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// The default duplicate-suppression window: 10 min.
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(600);

/// The in-process backend: one process, any number of replicas (threads).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use botmesh::{MemoryCoordinator, Replica};
///
/// let coordinator = Arc::new(MemoryCoordinator::new());
/// let replica = Replica::start("r1", coordinator.clone()).unwrap();
/// let turn = replica.acquire("chat-1", Duration::from_secs(1)).unwrap();
/// assert!(!turn.is_lost());
/// turn.release().unwrap();
/// replica.shutdown();
/// ```
pub struct MemoryCoordinator {
    ttl: Duration,
    dedup_window: Duration,
    history: Duration,
    shards: Box<[Mutex<Shard>]>,
    shard_hasher: foldhash::fast::RandomState,
    replicas: RwLock<HashMap<ReplicaId, ReplicaEntry>>,
    last_token: AtomicU64,
}

struct ReplicaEntry {
    sink: GrantSink,
    alive_until: Instant,
}

#[derive(Default)]
struct Shard {
    chats: HashMap<String, ChatState>,
    seen: HashMap<(String, String), Seen>,
    /// Claims in the order they were made, so expired ones are purged from the front.
    seen_order: VecDeque<(Instant, (String, String))>,
    /// Size of `chats` at which expired idle chats are swept next.
    sweep_at: usize,
    /// Conversation checkpoints by chat; kept apart from `chats` because they outlive
    /// an idle chat's history by far.
    checkpoints: HashMap<String, Checkpoint>,
    /// Size of `checkpoints` at which expired ones are swept next.
    checkpoints_sweep_at: usize,
}

struct Checkpoint {
    token: Token,
    data: String,
    expires: Instant,
}

struct ChatState {
    holder: Option<Holder>,
    queue: VecDeque<Queued>,
    previous: Option<Previous>,
    /// While idle: until when the state (the previous holder) is kept.
    idle_until: Instant,
}

impl ChatState {
    fn new(now: Instant) -> Self {
        ChatState {
            holder: None,
            queue: VecDeque::new(),
            previous: None,
            idle_until: now,
        }
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
    }
}

struct Holder {
    ticket: Ticket,
    token: Token,
    lease_until: Instant,
    previous: Option<Previous>,
}

struct Queued {
    ticket: Ticket,
    deadline: Instant,
}

struct Seen {
    expires: Instant,
    /// `Some(ticket)` while the claiming ticket has not been handled; `None` once done.
    claimed_by: Option<Ticket>,
}

/// Grants to push once the shard lock is released.
type Pushes = Vec<(String, Grant)>;

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
            .finish_non_exhaustive()
    }
}

impl MemoryCoordinator {
    /// A coordinator with the default lease TTL (10 s) and dedup window (10 min).
    pub fn new() -> Self {
        Self::with_settings(DEFAULT_LEASE_TTL, DEFAULT_DEDUP_WINDOW)
    }

    /// A coordinator with the given lease TTL and duplicate-suppression window (a zero
    /// window turns duplicate suppression off). Values over ~100 years are clamped.
    pub fn with_settings(lease_ttl: Duration, dedup_window: Duration) -> Self {
        MemoryCoordinator {
            ttl: lease_ttl.min(FOREVER),
            dedup_window: dedup_window.min(FOREVER),
            history: HISTORY,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_hasher: foldhash::fast::RandomState::default(),
            replicas: RwLock::new(HashMap::default()),
            last_token: AtomicU64::new(0),
        }
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
            .map(|s| s.lock().chats.values().filter(|c| !c.is_idle()).count())
            .sum()
    }

    fn shard(&self, chat: &str) -> &Mutex<Shard> {
        let h = self.shard_hasher.hash_one(chat);
        &self.shards[(h as usize) % self.shards.len()]
    }

    fn alive(&self, replica: &ReplicaId, now: Instant) -> bool {
        self.alive_until(replica).is_some_and(|t| t >= now)
    }

    fn alive_until(&self, replica: &ReplicaId) -> Option<Instant> {
        self.replicas.read().get(replica).map(|r| r.alive_until)
    }

    /// Moves a chat on: an expired holder is dropped, and a free chat is granted to
    /// the first live ticket in its queue. Returns the grant made, if any.
    fn settle(&self, chat: &mut ChatState, now: Instant) -> Option<Grant> {
        if let Some(h) = &chat.holder {
            if h.lease_until >= now {
                return None;
            }
            log::debug!(target: "botmesh::memory", "lease of {} expired", h.ticket);
            chat.previous = Some(Previous {
                replica: h.ticket.replica.clone(),
                token: h.token,
            });
            chat.holder = None;
        }
        while let Some(q) = chat.queue.pop_front() {
            let Some(alive_until) = self.alive_until(&q.ticket.replica) else {
                continue; // detached
            };
            if q.deadline < now || alive_until < now {
                continue;
            }
            return Some(self.grant(chat, q.ticket, now, alive_until));
        }
        None
    }

    /// Makes `ticket` the holder of a free chat.
    fn grant(
        &self,
        chat: &mut ChatState,
        ticket: Ticket,
        now: Instant,
        alive_until: Instant,
    ) -> Grant {
        let token = self.last_token.fetch_add(1, Ordering::Relaxed) + 1;
        let previous = chat.previous.clone();
        chat.holder = Some(Holder {
            ticket: ticket.clone(),
            token,
            // A grant to a replica that stopped renewing lapses with its liveness, so a
            // crashed replica's queued tickets cost the others at most one TTL in all,
            // not one TTL each.
            lease_until: (now + self.ttl).min(alive_until),
            previous: previous.clone(),
        });
        Grant {
            ticket,
            token,
            previous,
        }
    }

    fn push(&self, pushes: Pushes) {
        for (chat, grant) in pushes {
            let sink = self
                .replicas
                .read()
                .get(&grant.ticket.replica)
                .map(|r| r.sink.clone());
            // A replica that detached meanwhile is skipped: its grant expires by TTL.
            if let Some(sink) = sink {
                sink(&chat, grant);
            }
        }
    }

    fn ticket_alive(&self, chat: Option<&ChatState>, ticket: &Ticket, now: Instant) -> bool {
        let Some(chat) = chat else { return false };
        if let Some(h) = &chat.holder
            && &h.ticket == ticket
        {
            return h.lease_until >= now;
        }
        chat.queue
            .iter()
            .any(|q| &q.ticket == ticket && q.deadline >= now)
            && self.alive(&ticket.replica, now)
    }
}

/// A chat nobody holds or waits for keeps only who held it last, until `history` has
/// passed (like a Redis key with a TTL), so the next grant can still name the previous
/// holder. Its state stays in the map meanwhile, so a busy chat going idle and active
/// again costs no allocation; expired idle chats are swept when the map has doubled
/// since the last sweep (amortised O(1), and the map stays within twice the live
/// entries).
fn drop_if_idle(shard: &mut Shard, chat: &str, now: Instant, history: Duration) {
    if let Some(c) = shard.chats.get_mut(chat)
        && c.is_idle()
    {
        c.idle_until = now + history;
    }
    if shard.chats.len() >= shard.sweep_at {
        shard
            .chats
            .retain(|_, c| !c.is_idle() || c.idle_until >= now);
        shard.sweep_at = (shard.chats.len() * 2).max(1024);
    }
}

fn purge_seen(shard: &mut Shard, now: Instant) {
    while let Some((expires, _)) = shard.seen_order.front() {
        if *expires >= now {
            break;
        }
        if let Some((_, key)) = shard.seen_order.pop_front()
            && shard.seen.get(&key).is_some_and(|s| s.expires < now)
        {
            shard.seen.remove(&key);
        }
    }
}

fn grant_of(holder: &Holder) -> Grant {
    Grant {
        ticket: holder.ticket.clone(),
        token: holder.token,
        previous: holder.previous.clone(),
    }
}

impl Coordinator for MemoryCoordinator {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn write_checkpoint(
        &self,
        chat: &str,
        token: Token,
        data: Option<&str>,
    ) -> Result<bool, BackendError> {
        let now = Instant::now();
        let mut shard = self.shard(chat).lock();
        // Only the live holder of the latest grant writes: an older token, or the
        // latest one whose lease ran out, is refused.
        let held = shard
            .chats
            .get(chat)
            .and_then(|c| c.holder.as_ref())
            .is_some_and(|h| h.token == token && h.lease_until >= now);
        let stored = shard
            .checkpoints
            .get(chat)
            .filter(|c| c.expires >= now)
            .map(|c| c.token);
        if !held || stored.is_some_and(|latest| token < latest) {
            return Ok(false);
        }
        match data {
            Some(data) => {
                let checkpoint = Checkpoint {
                    token,
                    data: data.to_owned(),
                    expires: now + CHECKPOINT_TTL,
                };
                shard.checkpoints.insert(chat.to_owned(), checkpoint);
                if shard.checkpoints.len() >= shard.checkpoints_sweep_at {
                    shard.checkpoints.retain(|_, c| c.expires >= now);
                    shard.checkpoints_sweep_at = (shard.checkpoints.len() * 2).max(1024);
                }
            }
            None => {
                shard.checkpoints.remove(chat);
            }
        }
        Ok(true)
    }

    fn read_checkpoint(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError> {
        let now = Instant::now();
        let shard = self.shard(chat).lock();
        Ok(shard
            .checkpoints
            .get(chat)
            .filter(|c| c.expires >= now)
            .map(|c| (c.token, c.data.clone())))
    }

    fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    fn attach(&self, replica: &ReplicaId, sink: GrantSink) -> Result<(), BackendError> {
        let now = Instant::now();
        let mut replicas = self.replicas.write();
        if replicas.get(replica).is_some_and(|r| r.alive_until >= now) {
            // Two live replicas with one id would take each other's grants.
            return Err(BackendError::new(format!(
                "replica id {replica:?} is already in use (by a live replica, or by one that \
                 crashed less than one lease TTL ago)"
            )));
        }
        let entry = ReplicaEntry {
            sink,
            alive_until: now + self.ttl,
        };
        replicas.insert(replica.clone(), entry);
        Ok(())
    }

    fn detach(&self, replica: &ReplicaId, _held: &[HeldLease<'_>]) -> Result<(), BackendError> {
        self.replicas.write().remove(replica);
        let now = Instant::now();
        let mut pushes = Pushes::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let mut touched = Vec::new();
            for (id, chat) in shard.chats.iter_mut() {
                chat.queue.retain(|q| &q.ticket.replica != replica);
                if chat
                    .holder
                    .as_ref()
                    .is_some_and(|h| &h.ticket.replica == replica)
                    && let Some(h) = chat.holder.take()
                {
                    chat.previous = Some(Previous {
                        replica: replica.clone(),
                        token: h.token,
                    });
                }
                if let Some(g) = self.settle(chat, now) {
                    pushes.push((id.clone(), g));
                }
                touched.push(id.clone());
            }
            for id in touched {
                drop_if_idle(&mut shard, &id, now, self.history);
            }
        }
        self.push(pushes);
        Ok(())
    }

    fn enqueue(&self, req: &EnqueueRequest<'_>) -> Result<Enqueued, BackendError> {
        let now = Instant::now();
        let mut pushes = Pushes::new();
        let result = {
            let mut guard = self.shard(req.chat).lock();
            let shard = &mut *guard;
            if let Some(id) = req.message_id.filter(|_| !self.dedup_window.is_zero()) {
                purge_seen(shard, now);
                let key = (req.chat.to_owned(), id.to_owned());
                let duplicate = match shard.seen.get(&key) {
                    None => false,
                    Some(s) if s.expires < now => false,
                    Some(Seen {
                        claimed_by: None, ..
                    }) => true,
                    Some(Seen {
                        claimed_by: Some(t),
                        ..
                    }) => self.ticket_alive(shard.chats.get(req.chat), t, now),
                };
                if duplicate {
                    return Ok(Enqueued::Duplicate);
                }
                let expires = now + self.dedup_window;
                shard.seen.insert(
                    key.clone(),
                    Seen {
                        expires,
                        claimed_by: Some(req.ticket.clone()),
                    },
                );
                shard.seen_order.push_back((expires, key));
            }
            if !shard.chats.contains_key(req.chat) {
                shard.chats.insert(req.chat.to_owned(), ChatState::new(now));
            }
            let Some(chat) = shard.chats.get_mut(req.chat) else {
                return Err(BackendError::new("chat state vanished under its lock"));
            };
            if chat.is_idle() && chat.idle_until < now {
                // Idle past its history: forget the previous holder, as Redis would.
                chat.previous = None;
            }
            if chat.holder.is_none() && chat.queue.is_empty() {
                // The uncontended path: a free chat is granted without queueing.
                if let Some(alive_until) =
                    self.alive_until(&req.ticket.replica).filter(|t| *t >= now)
                {
                    let grant = self.grant(chat, req.ticket.clone(), now, alive_until);
                    return Ok(Enqueued::Granted(grant));
                }
            }
            chat.queue.push_back(Queued {
                ticket: req.ticket.clone(),
                deadline: now + req.wait.min(FOREVER),
            });
            match self.settle(chat, now) {
                Some(g) if &g.ticket == req.ticket => Enqueued::Granted(g),
                Some(g) => {
                    // An earlier waiter got the turn because an old holder had expired.
                    pushes.push((req.chat.to_owned(), g));
                    Enqueued::Queued
                }
                None => Enqueued::Queued,
            }
        };
        self.push(pushes);
        Ok(result)
    }

    fn cancel(&self, w: &Waiting<'_>) -> Result<Option<Grant>, BackendError> {
        let now = Instant::now();
        let mut pushes = Pushes::new();
        let result = {
            let mut guard = self.shard(w.chat).lock();
            let shard = &mut *guard;
            let mut result = None;
            if let Some(chat) = shard.chats.get_mut(w.chat) {
                if let Some(g) = self.settle(chat, now)
                    && &g.ticket != w.ticket
                {
                    pushes.push((w.chat.to_owned(), g));
                }
                result = chat
                    .holder
                    .as_ref()
                    .filter(|h| &h.ticket == w.ticket)
                    .map(grant_of);
                if result.is_none() {
                    chat.queue.retain(|q| &q.ticket != w.ticket);
                }
            }
            if result.is_none() {
                // A message that timed out may be delivered again and then handled.
                if let Some(id) = w.message_id {
                    let key = (w.chat.to_owned(), id.to_owned());
                    if shard
                        .seen
                        .get(&key)
                        .is_some_and(|s| s.claimed_by.as_ref() == Some(w.ticket))
                    {
                        shard.seen.remove(&key);
                    }
                }
            }
            drop_if_idle(shard, w.chat, now, self.history);
            result
        };
        self.push(pushes);
        Ok(result)
    }

    fn release(
        &self,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
    ) -> Result<Released, BackendError> {
        let now = Instant::now();
        let mut pushes = Pushes::new();
        let result = {
            let mut guard = self.shard(lease.chat).lock();
            let shard = &mut *guard;
            let Some(chat) = shard.chats.get_mut(lease.chat) else {
                return Ok(Released::Lost);
            };
            let ours = chat.holder.as_ref().is_some_and(|h| {
                &h.ticket == lease.ticket && h.token == lease.token && h.lease_until >= now
            });
            let result = if ours {
                chat.holder = None;
                chat.previous = Some(Previous {
                    replica: lease.ticket.replica.clone(),
                    token: lease.token,
                });
                let next = match self.settle(chat, now) {
                    Some(g) if g.ticket.replica == lease.ticket.replica => Some(g),
                    Some(g) => {
                        pushes.push((lease.chat.to_owned(), g));
                        None
                    }
                    None => None,
                };
                if let Some(id) = handled
                    && let Some(s) = shard.seen.get_mut(&(lease.chat.to_owned(), id.to_owned()))
                    && s.claimed_by.as_ref() == Some(lease.ticket)
                {
                    s.claimed_by = None;
                }
                Released::Released { next }
            } else {
                if let Some(g) = self.settle(chat, now) {
                    pushes.push((lease.chat.to_owned(), g));
                }
                Released::Lost
            };
            drop_if_idle(shard, lease.chat, now, self.history);
            result
        };
        self.push(pushes);
        Ok(result)
    }

    fn renew(
        &self,
        replica: &ReplicaId,
        held: &[HeldLease<'_>],
        waiting: &[Waiting<'_>],
    ) -> Result<Renewal, BackendError> {
        let now = Instant::now();
        if let Some(r) = self.replicas.write().get_mut(replica) {
            r.alive_until = now + self.ttl;
        }
        let mut out = Renewal {
            held: Vec::with_capacity(held.len()),
            waiting: Vec::with_capacity(waiting.len()),
        };
        for lease in held {
            let mut shard = self.shard(lease.chat).lock();
            let kept = match shard
                .chats
                .get_mut(lease.chat)
                .and_then(|c| c.holder.as_mut())
            {
                Some(h)
                    if &h.ticket == lease.ticket
                        && h.token == lease.token
                        && h.lease_until >= now =>
                {
                    h.lease_until = now + self.ttl;
                    true
                }
                _ => false,
            };
            out.held.push(kept);
        }
        let mut pushes = Pushes::new();
        for w in waiting {
            let mut shard = self.shard(w.chat).lock();
            let Some(chat) = shard.chats.get_mut(w.chat) else {
                out.waiting.push(TicketState::Gone);
                continue;
            };
            if let Some(g) = self.settle(chat, now)
                && &g.ticket != w.ticket
            {
                pushes.push((w.chat.to_owned(), g));
            }
            let state = match chat.holder.as_ref() {
                Some(h) if &h.ticket == w.ticket => TicketState::Granted(grant_of(h)),
                _ if chat.queue.iter().any(|q| &q.ticket == w.ticket) => TicketState::Waiting,
                _ => TicketState::Gone,
            };
            out.waiting.push(state);
            drop_if_idle(&mut shard, w.chat, now, self.history);
        }
        self.push(pushes);
        Ok(out)
    }
}
