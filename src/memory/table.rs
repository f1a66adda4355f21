//! The memory backend's chat table: the turn protocol's decisions, with no lock, no
//! clock and no thread of its own.
//!
//! Every operation takes an [`Env`]: the present (from the backend's
//! [`Clock`](crate::Clock)), the settings, the replicas' liveness and the token
//! counter. Grants to be pushed to other replicas are returned to the caller, which
//! pushes them once its lock is released. The backend in `mod.rs` is the thin layer of
//! locks and pushes around this.
//!
//! Expiry is evaluated lazily, like Redis key expiry: whoever touches a chat next (a
//! release, an enqueue, the re-check in `check`) moves it on.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::chat_map::{ChatHasher, ChatMap, Name};
use super::dedup::{Claim, Dedup};

use crate::coordinator::{
    CHECKPOINT_TTL, EnqueueRequest, Enqueued, Grant, HeldLease, Previous, Released, ReplicaId,
    Ticket, TicketState, Token, Waiting,
};

/// The table's maps use foldhash (randomly seeded per map, far cheaper than SipHash
/// on short keys): every message costs several lookups.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Durations are clamped here so that `Instant + d` cannot overflow (about 100 years).
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Grants made to other replicas' tickets on the chat of the operation, to push once
/// the lock is released (the chat is the caller's: no copy of its name per push).
pub(crate) type Pushes = Vec<Grant>;

/// Grants a detach made, by chat: it touches every chat of the shard.
pub(crate) type ChatPushes = Vec<(String, Grant)>;

/// What every table operation needs from outside.
pub(crate) struct Env<'a> {
    /// The present, by the backend's clock: for queue deadlines and message ids.
    pub(crate) now: Instant,
    /// The present again, in ns since the backend's base instant: the form of lease
    /// ends, idle chats' history and replicas' liveness, so that the uncontended path
    /// adds and compares integers (each `Instant` sum or difference normalises a
    /// `timespec`, a few dozen instructions every time).
    pub(crate) now_ns: u64,
    /// The lease TTL.
    pub(crate) ttl: Duration,
    /// The lease TTL in ns.
    pub(crate) ttl_ns: u64,
    /// How long an idle chat's last holder is remembered, in ns.
    pub(crate) history_ns: u64,
    /// The duplicate-suppression window; zero turns it off.
    pub(crate) dedup_window: Duration,
    /// Handled message ids each chat remembers at least (the `dedup_ids` option).
    pub(crate) dedup_ids: usize,
    /// Until when a ticket's replica is alive (its last renewal + TTL), in ns as
    /// `now_ns`; `None` when it is not attached, or when the ticket is a replaced
    /// run's (below the attached run's first ticket number, see
    /// `Coordinator::attach_incarnation`).
    pub(crate) alive_until: &'a dyn Fn(&Ticket) -> Option<u64>,
    /// The next fencing token: one counter for all chats, so tokens keep rising after
    /// an idle chat's state is dropped.
    pub(crate) next_token: &'a dyn Fn() -> Token,
}

impl Env<'_> {
    fn alive(&self, ticket: &Ticket) -> bool {
        (self.alive_until)(ticket).is_some_and(|t| t >= self.now_ns)
    }
}

/// One shard of chats: the backend keeps several, each under its own lock.
#[derive(Default)]
pub(crate) struct Shard {
    /// Hashes a chat's name once per operation, for both maps of chats.
    hasher: ChatHasher,
    /// The chats held or waited for (and idle ones until the next sweep).
    chats: ChatMap<ChatState>,
    /// Size of `chats` at which its idle chats move to `history` next.
    sweep_at: usize,
    /// Idle chats' last holders, until their history runs out: all an idle chat
    /// leaves (a 64-byte entry, its name inline), in a map of its own so that `chats` stays
    /// the size of the active chats. When full entries of every chat seen stayed in
    /// `chats`, each new chat paid a share of that map's growth, copied into fresh
    /// memory whose first touch is a page fault: most of a new chat's time.
    history: ChatMap<Past>,
    /// Size of `history` at which expired entries are dropped next.
    history_sweep_at: usize,
    /// The earliest end of an entry in `history` (`None`: none there yet); removals
    /// leave it as it is, so it is a lower bound. Before it nothing there has expired
    /// and the scan is skipped: while chats arrive faster than an hour's history ends
    /// (a new bot, a burst), the scans at each doubling would otherwise read the whole
    /// map, a million chats' worth under the shard's lock, to drop nothing.
    history_oldest: Option<u64>,
    /// How many times `history` was scanned for expired entries, for the tests.
    #[cfg(test)]
    history_scans: usize,
    /// Conversation checkpoints by chat; kept apart from `chats` because they outlive
    /// an idle chat's history by far.
    checkpoints: HashMap<String, Checkpoint>,
    /// Size of `checkpoints` at which expired ones are swept next.
    checkpoints_sweep_at: usize,
}

/// An idle chat's memory of its last holder (see [`Shard::history`]).
struct Past {
    previous: Previous,
    /// Until when it is remembered (ns, as `Env::now_ns`).
    until: u64,
}

/// The least size of `chats` at which idle chats move to `history`: a few dozen
/// entries per shard stay in cache, and a chat going idle and active again in between
/// keeps its entry.
const ACTIVE_FLOOR: usize = 64;

struct Checkpoint {
    token: Token,
    data: String,
    expires: Instant,
}

/// One active chat's entry (or an idle one's until the next sweep), kept small (80
/// bytes): what only a contended chat or one with message ids needs is in [`Extra`],
/// made on first use.
struct ChatState {
    holder: Option<Holder>,
    /// Who held the chat before the present holder (the holder's grant's `previous`,
    /// answered again to a repeated enqueue of its ticket) or, while the chat is free,
    /// who held it last (the next grant's `previous`). One field serves both: it
    /// changes only when a holder leaves.
    previous: Option<Previous>,
    /// While idle: until when the previous holder is remembered (ns, as `Env::now_ns`).
    idle_until: u64,
    /// The queue and the duplicate check, from the chat's first waiter or message id
    /// on; kept while the chat's entry is, so a busy chat allocates it once.
    extra: Option<Box<Extra>>,
}

/// The parts of a chat's state that an uncontended chat without message ids (the lock
/// API, W1) never needs.
#[derive(Default)]
struct Extra {
    queue: VecDeque<Queued>,
    /// Duplicate suppression for the chat's message ids, bounded per chat; the chat's
    /// whole entry is kept while it remembers anything (see
    /// [`ChatState::keeps_dedup`]). Made on the chat's first message id: a chat locked
    /// without ids does without it.
    dedup: Option<Dedup>,
}

/// The queue of a chat that never had a waiter.
static NO_QUEUE: VecDeque<Queued> = VecDeque::new();

impl ChatState {
    fn queue(&self) -> &VecDeque<Queued> {
        self.extra.as_ref().map_or(&NO_QUEUE, |e| &e.queue)
    }

    /// The queue, for changes that only remove: nothing is made for a chat without one.
    fn queue_if_any(&mut self) -> Option<&mut VecDeque<Queued>> {
        self.extra.as_mut().map(|e| &mut e.queue)
    }

    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Box::default)
    }

    fn dedup_mut(&mut self) -> Option<&mut Dedup> {
        self.extra.as_mut().and_then(|e| e.dedup.as_mut())
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.queue().is_empty()
    }

    /// A chat nobody holds or waits for keeps only who held it last, until `history`
    /// has passed since it became idle (like a Redis key with a TTL), so the next
    /// grant can still name the previous holder. `was_idle`: whether it was idle at
    /// the start of the operation. A chat idle already keeps its end: a stale release
    /// or a re-check touching it must not lengthen what it remembers, or that would
    /// depend on whether a sweep had moved it to `history` meanwhile, where nothing
    /// touches it (see [`Shard::sweep`]).
    fn mark_if_idle(&mut self, env: &Env<'_>, was_idle: bool) {
        if !was_idle && self.is_idle() {
            self.idle_until = env.now_ns.saturating_add(env.history_ns);
        }
    }

    /// Whether the entry must stay in `chats` though idle: its duplicate check still
    /// remembers something that `history` cannot keep (its marks while the window runs,
    /// and, while the chat's history runs, what it learned of the chat's ids, such as a
    /// floor turned off for good, as Redis keeps the chat's state hash that long).
    fn keeps_dedup(&self, now: Instant, now_ns: u64) -> bool {
        self.extra
            .as_ref()
            .and_then(|e| e.dedup.as_ref())
            .is_some_and(|d| d.until >= now || self.idle_until >= now_ns)
    }
}

/// The earlier of a lower bound of ends (`None`: no end yet) and `end`.
fn earliest(bound: Option<u64>, end: u64) -> u64 {
    bound.map_or(end, |b| b.min(end))
}

/// Whether `ticket` still holds the chat or waits in it, alive. Takes the chat's
/// parts, so the duplicate check can ask while it holds the chat's `dedup`.
fn ticket_alive(
    env: &Env<'_>,
    holder: Option<&Holder>,
    queue: &VecDeque<Queued>,
    ticket: &Ticket,
) -> bool {
    if let Some(h) = holder
        && &h.ticket == ticket
    {
        return h.lease_until >= env.now_ns;
    }
    queue
        .iter()
        .any(|q| &q.ticket == ticket && q.deadline >= env.now)
        && env.alive(ticket)
}

struct Holder {
    ticket: Ticket,
    token: Token,
    /// When the lease ends unless renewed (ns, as `Env::now_ns`).
    lease_until: u64,
}

struct Queued {
    ticket: Ticket,
    deadline: Instant,
}

/// The grant `holder` got, answered again (the chat's `previous` is its grant's while
/// it holds).
fn grant_of(holder: &Holder, previous: &Option<Previous>) -> Grant {
    Grant {
        ticket: holder.ticket.clone(),
        token: holder.token,
        previous: previous.clone(),
    }
}

/// Makes `ticket` the holder of a free chat.
fn grant(env: &Env<'_>, chat: &mut ChatState, ticket: Ticket, alive_until: u64) -> Grant {
    let token = (env.next_token)();
    let previous = chat.previous.clone();
    chat.holder = Some(Holder {
        ticket: ticket.clone(),
        token,
        // A grant lasts as long as its grantee's liveness: a replica that stopped
        // renewing costs the others at most one TTL in all with its queued tickets,
        // not one TTL each. Not `now + TTL` capped by it: `now` may be a little old
        // (read by the caller before the call, or before a wait for the shard's
        // lock), and the grantee counts a pushed grant from its own last sign of
        // life, which may be newer; a lease counted from the older instant could end
        // before the grantee stops trusting it. Liveness only ever moves up to a TTL
        // past a call's own `now`, so with a fresh `now` the two are the same.
        lease_until: alive_until,
    });
    Grant {
        ticket,
        token,
        previous,
    }
}

/// Moves a chat on: an expired holder is dropped, and a free chat is granted to the
/// first live ticket in its queue. Returns the grant made, if any.
fn settle(env: &Env<'_>, chat: &mut ChatState) -> Option<Grant> {
    if let Some(h) = &chat.holder {
        if h.lease_until >= env.now_ns {
            return None;
        }
        log::debug!(target: "botmesh::memory", "lease of {} expired", h.ticket);
        chat.previous = Some(Previous {
            replica: h.ticket.replica.clone(),
            token: h.token,
        });
        chat.holder = None;
    }
    while let Some(q) = chat.queue_if_any().and_then(VecDeque::pop_front) {
        let Some(alive_until) = (env.alive_until)(&q.ticket) else {
            continue; // detached
        };
        if q.deadline < env.now || alive_until < env.now_ns {
            continue;
        }
        return Some(grant(env, chat, q.ticket, alive_until));
    }
    None
}

/// One chat of the table as an inspection shows it: `(stored name, holder, queued,
/// previous)`; the holder only while its lease runs.
pub(crate) type ChatRow = (
    String,
    Option<crate::coordinator::HolderView>,
    usize,
    Option<Previous>,
);

fn row(name: &str, chat: &ChatState, now_ns: u64) -> ChatRow {
    let holder = chat.holder.as_ref().filter(|h| h.lease_until >= now_ns);
    let view = holder.map(|h| crate::coordinator::HolderView {
        ticket: h.ticket.clone(),
        token: h.token,
        lease_left: Duration::from_nanos(h.lease_until.saturating_sub(now_ns)),
    });
    let previous = match holder {
        Some(_) => chat.previous.clone(),
        // Free (or expired): the last holder.
        None => match &chat.holder {
            Some(h) => Some(Previous {
                replica: h.ticket.replica.clone(),
                token: h.token,
            }),
            None => chat.previous.clone(),
        },
    };
    (name.to_owned(), view, chat.queue().len(), previous)
}

impl Shard {
    /// Prepares a new shard for `chats` chats (see
    /// [`MemoryCoordinator::with_chat_capacity`](crate::MemoryCoordinator::with_chat_capacity)):
    /// `history` gets room for their last holders and `chats` for twice
    /// [`ACTIVE_FLOOR`] active ones (a sweep starts at `ACTIVE_FLOOR`; the margin
    /// leaves room for the tombstones its removals leave), both written once so that
    /// their memory is mapped.
    ///
    /// # Errors
    /// When the allocator refuses the room; what was reserved stays.
    pub(crate) fn reserve(&mut self, chats: usize) -> Result<(), hashbrown::TryReserveError> {
        let nobody: ReplicaId = ReplicaId::from("");
        let past = || Past {
            previous: Previous {
                replica: nobody.clone(),
                token: 0,
            },
            until: 0,
        };
        self.history.reserve_touched(chats, past)?;
        let free = || ChatState {
            holder: None,
            previous: None,
            idle_until: 0,
            extra: None,
        };
        self.chats.reserve_touched(2 * ACTIVE_FLOOR, free)
    }

    /// How many idle chats' last holders fit before `history` grows.
    #[cfg(test)]
    pub(crate) fn history_capacity(&self) -> usize {
        self.history.capacity()
    }

    /// Inspection of one chat (read-only) at `now_ns` (as `Env::now_ns`); `None` when
    /// the table has no state for it.
    pub(crate) fn view(&self, now_ns: u64, chat: &str) -> Option<ChatRow> {
        let h = self.hasher.hash(chat);
        match self.chats.get(h, chat) {
            // An idle chat past its history shows nothing, as in `history` (where a
            // sweep would have moved it) and as its next grant names nobody.
            Some(c) if c.is_idle() && c.idle_until < now_ns => None,
            Some(c) => Some(row(chat, c, now_ns)),
            None => self
                .history
                .get(h, chat)
                .filter(|p| p.until >= now_ns)
                .map(|p| (chat.to_owned(), None, 0, Some(p.previous.clone()))),
        }
    }

    /// Inspection of every chat that is held or waited for (read-only).
    pub(crate) fn views(&self, now_ns: u64, out: &mut Vec<ChatRow>) {
        for (name, c) in self.chats.iter() {
            let held = c.holder.as_ref().is_some_and(|h| h.lease_until >= now_ns);
            if held || !c.queue().is_empty() {
                out.push(row(name, c, now_ns));
            }
        }
    }

    /// How many chats have a holder or waiters.
    pub(crate) fn active_chats(&self) -> usize {
        self.chats.values().filter(|c| !c.is_idle()).count()
    }

    /// Idle chats (see [`ChatState::mark_if_idle`]) leave `chats` when it has doubled
    /// since the last sweep: amortised O(1), and the map stays within twice the active
    /// entries (or [`ACTIVE_FLOOR`]), so it stops growing and stays in cache. Their last
    /// holder moves to `history` while it is remembered; a chat whose duplicate check
    /// still remembers ids stays until that runs out too.
    fn sweep(&mut self, env: &Env<'_>) {
        if self.chats.len() < self.sweep_at {
            return;
        }
        let (now, now_ns) = (env.now, env.now_ns);
        let (history, oldest) = (&mut self.history, &mut self.history_oldest);
        let idle = |c: &ChatState| c.is_idle() && !c.keeps_dedup(now, now_ns);
        self.chats.take_if(idle, |h, name, c| {
            if let Some(previous) = c.previous.filter(|_| c.idle_until >= now_ns) {
                let until = c.idle_until;
                *oldest = Some(earliest(*oldest, until));
                history.insert_new(h, name, Past { previous, until });
            }
        });
        self.sweep_at = (self.chats.len() * 2).max(ACTIVE_FLOOR);
        if self.history.len() >= self.history_sweep_at {
            if self.history_oldest.is_some_and(|o| o < now_ns) {
                let mut left: Option<u64> = None;
                self.history.retain(|p| {
                    let keep = p.until >= now_ns;
                    if keep {
                        left = Some(earliest(left, p.until));
                    }
                    keep
                });
                self.history_oldest = left;
                #[cfg(test)]
                {
                    self.history_scans += 1;
                }
            }
            self.history_sweep_at = (self.history.len() * 2).max(1024);
        }
    }

    /// `chat`'s entry, made for a chat not in `chats` with its last holder taken back
    /// from `history` while remembered (and its name: only a chat never seen, or
    /// forgotten, copies it).
    fn entry(&mut self, now_ns: u64, chat: &str) -> &mut ChatState {
        let h = self.hasher.hash(chat);
        let history = &mut self.history;
        self.chats.get_or_insert_with(h, chat, || {
            let (name, previous, idle_until) = match history.remove(h, chat) {
                Some((name, past)) if past.until >= now_ns => {
                    (name, Some(past.previous), past.until)
                }
                Some((name, _)) => (name, None, now_ns),
                None => (Name::from(chat), None, now_ns),
            };
            let state = ChatState {
                holder: None,
                previous,
                idle_until,
                extra: None,
            };
            (name, state)
        })
    }

    /// `chat`'s entry, if it is in `chats`.
    fn chat_mut(&mut self, chat: &str) -> Option<&mut ChatState> {
        let h = self.hasher.hash(chat);
        self.chats.get_mut(h, chat)
    }

    /// See [`Coordinator::enqueue`](crate::Coordinator::enqueue).
    pub(crate) fn enqueue(
        &mut self,
        env: &Env<'_>,
        req: &EnqueueRequest<'_>,
        pushes: &mut Pushes,
    ) -> Enqueued {
        let now = env.now;
        let chat = self.entry(env.now_ns, req.chat);
        let was_idle = chat.is_idle();
        // Idempotent per ticket: a ticket already holding or queued keeps its grant or
        // its place.
        if let Some(h) = chat.holder.as_ref().filter(|h| &h.ticket == req.ticket) {
            return Enqueued::Granted(grant_of(h, &chat.previous));
        }
        if chat.queue().iter().any(|q| &q.ticket == req.ticket) {
            return Enqueued::Queued;
        }
        if let Some(id) = req.message_id.filter(|_| !env.dedup_window.is_zero()) {
            // The claim outlives the message's wait and one lease more (see the Redis
            // backend's enqueue): expired under a waiting message, a redelivery would
            // run it a second time.
            let claim_for = env
                .dedup_window
                .max(req.wait.saturating_add(env.ttl))
                .min(FOREVER);
            let ChatState { holder, extra, .. } = &mut *chat;
            let Extra { queue, dedup } = &mut **extra.get_or_insert_with(Box::default);
            let dedup = dedup.get_or_insert_with(|| Dedup::new(now));
            let answer = dedup.claim(now, claim_for, id, req.ticket, |t| {
                ticket_alive(env, holder.as_ref(), queue, t)
            });
            match answer {
                Claim::Duplicate => return Enqueued::Duplicate,
                Claim::InFlight => return Enqueued::InFlight,
                Claim::Claimed => {}
            }
        }
        if chat.is_idle() && chat.idle_until < env.now_ns {
            // Idle past its history: forget the previous holder, as Redis would.
            chat.previous = None;
        }
        if chat.is_idle() {
            // The uncontended path: a free chat is granted without queueing.
            if let Some(alive_until) = (env.alive_until)(req.ticket).filter(|t| *t >= env.now_ns) {
                return Enqueued::Granted(grant(env, chat, req.ticket.clone(), alive_until));
            }
        }
        chat.extra().queue.push_back(Queued {
            ticket: req.ticket.clone(),
            deadline: now + req.wait.min(FOREVER),
        });
        let answer = match settle(env, chat) {
            Some(g) if &g.ticket == req.ticket => Enqueued::Granted(g),
            Some(g) => {
                // An earlier waiter got the turn because an old holder had expired.
                pushes.push(g);
                Enqueued::Queued
            }
            None => Enqueued::Queued,
        };
        // Idle after all (an expired holder settled, and the ticket skipped: its
        // replica is detached): the history starts now.
        chat.mark_if_idle(env, was_idle);
        answer
    }

    /// See [`Coordinator::grant_if_free`](crate::Coordinator::grant_if_free): the
    /// uncontended path of [`Shard::enqueue`] alone. A chat with a holder (even an
    /// expired one, which `enqueue` settles) or a queue is left untouched, as is one
    /// whose previous state is unknown here; a new chat is made only to be granted.
    pub(crate) fn grant_if_free(
        &mut self,
        env: &Env<'_>,
        req: &EnqueueRequest<'_>,
    ) -> Option<Grant> {
        if req.message_id.is_some() {
            // Duplicate suppression is the full enqueue's job.
            return None;
        }
        let alive_until = (env.alive_until)(req.ticket).filter(|t| *t >= env.now_ns)?;
        let chat = self.entry(env.now_ns, req.chat);
        if !chat.is_idle() {
            return None;
        }
        if chat.idle_until < env.now_ns {
            // Idle past its history: forget the previous holder, as `enqueue` does.
            chat.previous = None;
        }
        Some(grant(env, chat, req.ticket.clone(), alive_until))
    }

    /// See [`Coordinator::cancel`](crate::Coordinator::cancel).
    pub(crate) fn cancel(
        &mut self,
        env: &Env<'_>,
        w: &Waiting<'_>,
        pushes: &mut Pushes,
    ) -> Option<Grant> {
        let chat = self.chat_mut(w.chat)?;
        let was_idle = chat.is_idle();
        if let Some(g) = settle(env, chat)
            && &g.ticket != w.ticket
        {
            pushes.push(g);
        }
        let result = chat
            .holder
            .as_ref()
            .filter(|h| &h.ticket == w.ticket)
            .map(|h| grant_of(h, &chat.previous));
        if result.is_none() {
            if let Some(queue) = chat.queue_if_any() {
                queue.retain(|q| &q.ticket != w.ticket);
            }
            if let Some(id) = w.message_id {
                // A message that timed out may be delivered again and then handled.
                if let Some(dedup) = chat.dedup_mut() {
                    dedup.give_up(id, w.ticket);
                }
            }
        }
        chat.mark_if_idle(env, was_idle);
        self.sweep(env);
        result
    }

    /// See [`Coordinator::release`](crate::Coordinator::release).
    pub(crate) fn release(
        &mut self,
        env: &Env<'_>,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
        pushes: &mut Pushes,
    ) -> Released {
        let Some(chat) = self.chat_mut(lease.chat) else {
            return Released::Lost;
        };
        let was_idle = chat.is_idle();
        // Ours while no other grant was made since: a lease that ran out with nobody
        // granted the chat after it still was the only one, so exclusion held, and the
        // Redis backend answers the same without reading its clock.
        let ours = chat
            .holder
            .as_ref()
            .is_some_and(|h| &h.ticket == lease.ticket && h.token == lease.token);
        let result = if ours {
            // The holder's own name of its replica moves to `previous`: no reference
            // count taken and dropped on the release of every turn.
            if let Some(h) = chat.holder.take() {
                chat.previous = Some(Previous {
                    replica: h.ticket.replica,
                    token: h.token,
                });
            }
            let next = match settle(env, chat) {
                Some(g) if g.ticket.replica == lease.ticket.replica => Some(g),
                Some(g) => {
                    pushes.push(g);
                    None
                }
                None => None,
            };
            if let Some(id) = handled
                && let Some(dedup) = chat.dedup_mut()
            {
                dedup.handled(env.now, env.dedup_window, env.dedup_ids, id, lease.ticket);
            }
            Released::Released { next }
        } else {
            if let Some(g) = settle(env, chat) {
                pushes.push(g);
            }
            Released::Lost
        };
        chat.mark_if_idle(env, was_idle);
        self.sweep(env);
        result
    }

    /// Extends a held lease by one TTL; `false` when it is no longer held.
    pub(crate) fn renew(&mut self, env: &Env<'_>, lease: &HeldLease<'_>) -> bool {
        match self.chat_mut(lease.chat).and_then(|c| c.holder.as_mut()) {
            Some(h)
                if &h.ticket == lease.ticket
                    && h.token == lease.token
                    && h.lease_until >= env.now_ns =>
            {
                h.lease_until = env.now_ns.saturating_add(env.ttl_ns);
                true
            }
            _ => false,
        }
    }

    /// The re-check of one waiting ticket: moves its chat on (an expired holder is
    /// replaced) and reports where the ticket stands.
    pub(crate) fn check(
        &mut self,
        env: &Env<'_>,
        w: &Waiting<'_>,
        pushes: &mut Pushes,
    ) -> TicketState {
        // This backend never loses data: a ticket it does not know was skipped (its
        // replica's liveness lapsed) or already resolved.
        let Some(chat) = self.chat_mut(w.chat) else {
            return TicketState::Lapsed;
        };
        let was_idle = chat.is_idle();
        if let Some(g) = settle(env, chat)
            && &g.ticket != w.ticket
        {
            pushes.push(g);
        }
        let waits = chat.queue().iter().any(|q| &q.ticket == w.ticket);
        let state = match chat.holder.as_mut() {
            // This ticket, or another of its replica's (see `TicketState::Granted`).
            Some(h) if h.ticket.replica == w.ticket.replica => {
                // Renewed, as the holder's renewal would (see `Coordinator::renew`).
                h.lease_until = h.lease_until.max(env.now_ns.saturating_add(env.ttl_ns));
                TicketState::Granted(grant_of(h, &chat.previous))
            }
            _ if waits => TicketState::Waiting,
            _ => TicketState::Lapsed,
        };
        chat.mark_if_idle(env, was_idle);
        self.sweep(env);
        state
    }

    /// A clean stop of `replica` (already detached from `env.alive_until`): its
    /// tickets leave the queues, its leases are released, and each chat moves on.
    pub(crate) fn detach(&mut self, env: &Env<'_>, replica: &ReplicaId, pushes: &mut ChatPushes) {
        for (id, chat) in self.chats.iter_mut() {
            let was_idle = chat.is_idle();
            if let Some(queue) = chat.queue_if_any() {
                queue.retain(|q| &q.ticket.replica != replica);
            }
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
            if let Some(g) = settle(env, chat) {
                pushes.push((id.to_string(), g));
            }
            chat.mark_if_idle(env, was_idle);
        }
        self.sweep(env);
    }

    /// See [`Coordinator::write_checkpoint`](crate::Coordinator::write_checkpoint).
    pub(crate) fn write_checkpoint(
        &mut self,
        now: Instant,
        now_ns: u64,
        chat: &str,
        token: Token,
        data: Option<&str>,
    ) -> bool {
        // Only the live holder of the latest grant writes: an older token, or the
        // latest one whose lease ran out, is refused.
        let held = self
            .chats
            .get(self.hasher.hash(chat), chat)
            .and_then(|c| c.holder.as_ref())
            .is_some_and(|h| h.token == token && h.lease_until >= now_ns);
        let stored = self
            .checkpoints
            .get(chat)
            .filter(|c| c.expires >= now)
            .map(|c| c.token);
        if !held || stored.is_some_and(|latest| token < latest) {
            return false;
        }
        match data {
            Some(data) => {
                let checkpoint = Checkpoint {
                    token,
                    data: data.to_owned(),
                    expires: now + CHECKPOINT_TTL,
                };
                self.checkpoints.insert(chat.to_owned(), checkpoint);
                if self.checkpoints.len() >= self.checkpoints_sweep_at {
                    self.checkpoints.retain(|_, c| c.expires >= now);
                    self.checkpoints_sweep_at = (self.checkpoints.len() * 2).max(1024);
                }
            }
            None => {
                self.checkpoints.remove(chat);
            }
        }
        true
    }

    /// See [`Coordinator::read_checkpoint`](crate::Coordinator::read_checkpoint).
    pub(crate) fn read_checkpoint(&self, now: Instant, chat: &str) -> Option<(Token, String)> {
        self.checkpoints
            .get(chat)
            .filter(|c| c.expires >= now)
            .map(|c| (c.token, c.data.clone()))
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
