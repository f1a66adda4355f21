//! The `Coordinator` contract: the seam between the runtime and the backends, and the
//! constants every backend shares. The protocol is documented on [`Coordinator`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A fencing token: strictly increasing per chat, across replicas, restarts and idle
/// periods.
pub type Token = u64;

/// The name of one replica, unique among the replicas sharing a coordinator:
/// non-empty, free of NUL characters and at most
/// [`MAX_REPLICA_ID_BYTES`](crate::MAX_REPLICA_ID_BYTES) (`Replica::start` refuses
/// other ids, and `RedisCoordinator` refuses calls for them, since its records use
/// NUL as a separator).
pub type ReplicaId = Arc<str>;

/// One place in a chat's queue: the replica that asked and a sequence number unique
/// within that replica.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    /// The replica that enqueued the ticket.
    pub replica: ReplicaId,
    /// A number unique among this replica's tickets (a per-replica counter).
    pub seq: u64,
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.replica, self.seq)
    }
}

/// Who held a chat's turn before this grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Previous {
    /// The replica that held the previous turn.
    pub replica: ReplicaId,
    /// The fencing token of that previous turn.
    pub token: Token,
}

/// A turn handed to a ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The ticket that now holds the chat.
    pub ticket: Ticket,
    /// The grant's fencing token.
    pub token: Token,
    /// The previous holder, when the backend still remembers it (it forgets it once
    /// the chat has been idle long enough for its keys to expire).
    pub previous: Option<Previous>,
}

/// What [`Coordinator::enqueue`] asks for.
#[derive(Clone, Copy, Debug)]
pub struct EnqueueRequest<'a> {
    /// The chat id: any UTF-8 string.
    pub chat: &'a str,
    /// The new ticket.
    pub ticket: &'a Ticket,
    /// The message id, for duplicate suppression; `None` disables it for this message.
    pub message_id: Option<&'a str>,
    /// Longest the ticket may wait in the queue; after that it is skipped.
    pub wait: Duration,
}

/// The answer to [`Coordinator::enqueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// The chat was free: the ticket holds the turn now.
    Granted(Grant),
    /// The ticket is queued; its grant will be pushed, or found by the re-check in
    /// [`Coordinator::renew`].
    Queued,
    /// The message id was handled within the dedup window; nothing was queued.
    Duplicate,
    /// The message id is claimed by a ticket that is still alive and not handled yet
    /// (queued, or holding the turn); nothing was queued and the claim was left as it
    /// is. The caller asks again later: the answer turns into `Duplicate` once that
    /// ticket was handled, or into a grant or a place (taking the claim over) once it
    /// died unhandled. So a duplicate never swallows a message whose first delivery
    /// is lost with its replica.
    InFlight,
}

/// A held lease, as listed to [`Coordinator::renew`] and [`Coordinator::release`].
#[derive(Clone, Copy, Debug)]
pub struct HeldLease<'a> {
    /// The chat.
    pub chat: &'a str,
    /// The holding ticket.
    pub ticket: &'a Ticket,
    /// The fencing token of the grant.
    pub token: Token,
}

/// A ticket still waiting, as listed to [`Coordinator::renew`] and
/// [`Coordinator::cancel`].
#[derive(Clone, Copy, Debug)]
pub struct Waiting<'a> {
    /// The chat.
    pub chat: &'a str,
    /// The waiting ticket.
    pub ticket: &'a Ticket,
    /// The message id the ticket claimed at enqueue, if any; a cancelled ticket gives
    /// its claim up so a redelivery of the message can run.
    pub message_id: Option<&'a str>,
}

/// Where a waiting ticket stands, as seen by [`Coordinator::renew`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TicketState {
    /// The ticket, or another ticket of the same replica in the same chat, holds the
    /// turn (its grant may also have been pushed); the grant names the holder. The
    /// re-check asks about a replica's earliest ticket of a chat by sequence, and a
    /// ticket queued again later (an in-flight claim taken over, a re-queue) stands
    /// behind later ones: a grant to any of them must be found, or a lost wake-up for
    /// it would go unnoticed until its lease ran out.
    Granted(Grant),
    /// Still in the queue.
    Waiting,
    /// Neither queued nor holding, and the backend has no trace of it: it lost its data
    /// (a restart without persistence). The replica enqueues it again.
    Gone,
    /// Skipped at hand-over because its replica's liveness had lapsed (the replica was
    /// paused or cut off for longer than a lease): it lost its place, and later messages
    /// of the chat may have run since. The replica reports it `lost` rather than
    /// queueing it again, which would break the chat's order.
    Lapsed,
}

/// The answer to [`Coordinator::renew`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Renewal {
    /// Per held lease, in order: whether it was still held (and is now extended).
    pub held: Vec<bool>,
    /// Per waiting ticket, in order: where it stands.
    pub waiting: Vec<TicketState>,
}

/// The answer to [`Coordinator::release`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// The turn was ours and is released; `next` is the grant made to one of the
    /// calling replica's own tickets, if the turn went to one of them.
    Released {
        /// A grant to the caller's own next ticket, which the backend did not push.
        next: Option<Grant>,
    },
    /// The lease had already been lost: the chat was granted to someone else since
    /// (which needs the lease to have run out first), or the turn was released already.
    /// Nothing was changed. A lease that ran out with no grant made after it is still
    /// released: no other holder can have overlapped it. The holder's own deadline and
    /// refused renewals tell it of a lease that ran out, whatever the release answers.
    Lost,
}

/// Where a backend pushes grants for a replica's queued tickets: `(chat, grant)`.
///
/// Called from whatever thread made the grant (another replica's worker, a subscriber
/// thread), never while the backend holds a lock, so it may call back into the backend.
pub type GrantSink = Arc<dyn Fn(&str, Grant) + Send + Sync>;

/// A failure to reach or use the backend.
#[derive(Debug, Clone)]
pub struct BackendError {
    message: String,
}

impl BackendError {
    /// A backend error with a one-line description (no secrets: no passwords or URLs
    /// with credentials).
    pub fn new(message: impl Into<String>) -> Self {
        BackendError {
            message: message.into(),
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {}

/// A held lease as an inspection shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderView {
    /// The holding ticket (its replica and sequence number).
    pub ticket: Ticket,
    /// The grant's fencing token.
    pub token: Token,
    /// Time left on the lease by the backend's clock (Redis: `PTTL`).
    pub lease_left: Duration,
}

/// One chat as [`Coordinator::inspect_chat`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatView {
    /// The chat id, as the user gave it.
    pub chat: String,
    /// The holder, while the lease runs.
    pub holder: Option<HolderView>,
    /// Tickets in the chat's queue (Redis: `LLEN`; may include tickets of a lapsed
    /// replica that the next hand-over skips).
    pub queued: usize,
    /// The holder before the current one, or, on a free chat, the last holder, while
    /// the backend remembers it ([`HISTORY`]).
    pub previous: Option<Previous>,
}

/// One provider's leadership as [`Coordinator::inspect`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderView {
    /// The provider id.
    pub provider: String,
    /// The leader's lease, if a replica leads now.
    pub holder: Option<HolderView>,
    /// Standbys queued for the leadership.
    pub standbys: usize,
}

/// What [`Coordinator::inspect`] sees under the backend's key prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeshView {
    /// Chats that are held or have waiting tickets, by chat id (at most the limit).
    pub chats: Vec<ChatView>,
    /// Live replicas (Redis: those subscribed to their wake channel), by id.
    pub replicas: Vec<ReplicaId>,
    /// Provider leaderships, by provider id.
    pub leaders: Vec<LeaderView>,
    /// The limit was reached, or the backend stopped looking (Redis: after 100,000
    /// keys per scan): there may be more chats, or leaders, than listed.
    pub truncated: bool,
}

/// How the runtime names a lease at the coordinator (the rule of the replica's
/// `names.rs`, kept here so backends can tell chats from leaderships when they list
/// them): a chat id is stored as it is, except that one starting with a NUL gets one
/// more in front; `"\0provider:<id>"` is the leadership of provider `<id>`.
pub(crate) enum LeaseName<'a> {
    Chat(&'a str),
    Provider(&'a str),
    /// Another reserved name of the runtime: not shown.
    Other,
}

pub(crate) fn lease_name(stored: &str) -> LeaseName<'_> {
    if let Some(rest) = stored.strip_prefix('\0') {
        if rest.starts_with('\0') {
            return LeaseName::Chat(rest);
        }
        return match rest.strip_prefix("provider:") {
            Some(id) => LeaseName::Provider(id),
            None => LeaseName::Other,
        };
    }
    LeaseName::Chat(stored)
}

/// The stored name of a user's chat id (see [`lease_name`]).
pub(crate) fn stored_name(chat: &str) -> std::borrow::Cow<'_, str> {
    if chat.starts_with('\0') {
        std::borrow::Cow::Owned(format!("\0{chat}"))
    } else {
        std::borrow::Cow::Borrowed(chat)
    }
}

/// The error of a backend that has no inspection.
fn no_inspection(backend: &str) -> BackendError {
    BackendError::new(format!("the {backend} backend does not support inspection"))
}

/// The backend shared by the replicas of one bot.
///
/// Implementations: [`MemoryCoordinator`](crate::MemoryCoordinator) (one process) and
/// `RedisCoordinator` (feature `redis`; many processes).
/// Every method may block on I/O but never for longer than the backend's own timeouts;
/// none may block waiting for a turn (waiting is the runtime's job).
///
/// A backend keeps, per chat, a FIFO queue of *tickets* (one per message taken in) and
/// at most one *holder*: the ticket whose turn it is. The holder has a lease with a TTL
/// and a fencing token that is strictly greater than every token handed out before for
/// that chat. The runtime ([`Replica`](crate::Replica)) drives the backend through the
/// calls below; users implement this trait to add a backend, or to wrap one.
///
/// **Wrapping a backend** (to count or trace its calls, say): forward every method,
/// the provided ones too ([`grant_if_free`](Coordinator::grant_if_free),
/// [`release_sent`](Coordinator::release_sent),
/// [`pushes_need_confirmation`](Coordinator::pushes_need_confirmation),
/// [`inspect_chat`](Coordinator::inspect_chat), [`inspect`](Coordinator::inspect)).
/// Their defaults describe a backend that has none of these, not the wrapped one: a
/// wrapper that leaves them out stays correct, but loses the memory backend's
/// uncontended path (its turns cost about three times as much), the confirmation of
/// pushed grants that a Redis coordinator with `wait_replicas` asks for, and
/// inspection. The runtime releases through `release_sent`, never `release`.
///
/// The protocol a backend must follow, which the conformance suite checks (a test
/// module of this crate's repository, `tests/conformance/mod.rs`, not part of the
/// published API: copy it into a backend's own tests, with the `tests/support` it
/// uses, and implement its `Harness`):
///
/// 1. [`enqueue`](Coordinator::enqueue) places a ticket at the tail of the chat's queue
///    and returns only once it is placed. When the chat is free and nobody waits, the
///    ticket is granted at once (one call for the uncontended case). A message id
///    handled for that chat within the dedup window is answered `Duplicate` instead;
///    one claimed by a ticket still alive and unhandled is answered `InFlight`; one
///    whose ticket ended without being handled (its replica died or it timed out) is
///    taken over by the new ticket. A backend may bound what it keeps per chat (the
///    Redis backend keeps a chat's newest handled ids, plus a floor for numeric ids
///    that rise): `Duplicate` always means handled, never a guess, except that an
///    unknown numeric id under a rising chat's floor counts as an old one. Enqueue is
///    idempotent per ticket: a ticket that is already queued or holding gets its
///    place or its grant back, nothing is added (a
///    re-queue after a lost reply, or after the re-check took a ticket for lost, must
///    not queue it twice).
/// 2. [`release`](Coordinator::release) ends a holder's turn and hands the turn straight
///    to the next live ticket in the queue (no one can barge in between). A grant for
///    the calling replica is returned; a grant for another replica is pushed to that
///    replica's [`GrantSink`].
/// 3. Tickets whose wait deadline passed, or whose replica stopped renewing, are skipped
///    at hand-over. A holder whose lease expired is replaced by the next waiter when
///    anyone touches the chat (the re-check in [`renew`](Coordinator::renew) makes sure
///    someone does).
/// 4. [`renew`](Coordinator::renew) extends every listed lease of one replica, keeps
///    its waiting tickets alive and reports where they stand, in one call.
///
/// Fencing tokens follow Kleppmann, "How to do distributed locking" (2016): a resource
/// that remembers the highest token it saw can refuse a write from a deposed holder.
pub trait Coordinator: Send + Sync + 'static {
    /// A short name of the backend for logs and benchmark records (`"memory"`, `"redis"`).
    fn backend(&self) -> &'static str;

    /// The TTL of every lease this backend grants.
    fn lease_ttl(&self) -> Duration;

    /// Whether a grant pushed to a [`GrantSink`] must be confirmed with a
    /// [`renew`](Coordinator::renew) of its lease before its turn runs. A backend
    /// that counts a write only once its replicas acknowledged it (Redis with
    /// `wait_replicas`) says `true`: the push leaves before the grant reached them,
    /// and a failover meanwhile would lose it. Grants in the answers of the calls
    /// themselves are used as they come. The default is `false`.
    fn pushes_need_confirmation(&self) -> bool {
        false
    }

    /// Registers a replica and where its grants are pushed. Replica ids must be unique
    /// among live replicas; a restarted process may reuse its name.
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached, or (where the backend can
    /// tell) when the id is already used by a live replica.
    fn attach(&self, replica: &ReplicaId, sink: GrantSink) -> Result<(), BackendError>;

    /// A clean stop: releases every lease the replica holds (handing each chat to its
    /// next waiter), removes its queued tickets and forgets its sink. `held` lists the
    /// leases the replica knows it holds (a backend that cannot find a replica's
    /// leases by itself, like one sharded by chat, releases those).
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached; leases then expire by TTL.
    fn detach(&self, replica: &ReplicaId, held: &[HeldLease<'_>]) -> Result<(), BackendError>;

    /// [`attach`](Self::attach) naming the replica's *incarnation*: a number that tells
    /// this run of the id from an earlier or later one (a [`Replica`](crate::Replica)
    /// gives its first ticket's sequence number, from the wall clock). A backend that
    /// keeps it can then refuse a stale run's [`detach_incarnation`](Self::detach_incarnation);
    /// the default forgets it and attaches.
    ///
    /// # Errors
    /// As [`attach`](Self::attach).
    fn attach_incarnation(
        &self,
        replica: &ReplicaId,
        incarnation: u64,
        sink: GrantSink,
    ) -> Result<(), BackendError> {
        let _ = incarnation;
        self.attach(replica, sink)
    }

    /// [`detach`](Self::detach) by the incarnation that
    /// [`attach_incarnation`](Self::attach_incarnation) named. When a later
    /// incarnation of the id is attached (the caller stalled past its liveness, and a
    /// new run took the id over), a backend that keeps incarnations releases only the
    /// leases in `held` that are still the caller's (by their fencing tokens) and
    /// leaves the later run attached, its turns and tickets untouched: a stale stop
    /// must not free another run's turns. The default detaches the id, as
    /// [`detach`](Self::detach) does.
    ///
    /// # Errors
    /// As [`detach`](Self::detach).
    fn detach_incarnation(
        &self,
        replica: &ReplicaId,
        incarnation: u64,
        held: &[HeldLease<'_>],
    ) -> Result<(), BackendError> {
        let _ = incarnation;
        self.detach(replica, held)
    }

    /// Places a ticket in its chat's queue (see the protocol above, rule 1).
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached; the ticket may or may not
    /// be queued then, and the runtime treats it as not taken in.
    fn enqueue(&self, request: &EnqueueRequest<'_>) -> Result<Enqueued, BackendError>;

    /// The uncontended path of [`enqueue`](Coordinator::enqueue) alone, for a
    /// request without a message id: when the chat is free and nobody waits, grants
    /// it to the ticket exactly as `enqueue` would (`Some`); otherwise changes nothing
    /// and answers `None`, and the caller enqueues the same ticket. Since nothing is
    /// queued, no grant of this ticket can be pushed, so the runtime need not
    /// register a waiter before the call: the cost it saves on every uncontended turn
    /// of an in-process backend. A backend may answer `None` for anything it does not
    /// want to decide here (a request with a message id, say); the default always
    /// does. A backend over the network loses nothing by that (one more function call
    /// per enqueue, no round trip); the memory backend implements it, and a wrapper
    /// of it that does not forward it makes each uncontended turn register a waiter
    /// and take the full enqueue, about three times the cost.
    ///
    /// `sent` is the caller's reading of the process's real monotonic clock
    /// ([`Instant::now`]) taken as it made the call. A backend whose table runs on
    /// that same clock (the memory backend, unless built with a fake clock) may take
    /// it as the present instead of reading the clock again: in process, a clock
    /// read is a tenth of a turn's cost. It is never later than the call itself, so
    /// the caller's own lease counted from it ends no later than one counted from the
    /// backend's own reading. A grant the call hands on to another replica's waiter
    /// must not be counted from it: that grantee counts a pushed grant from its own
    /// last sign of life, which may be newer (the memory backend makes such a grant
    /// last its grantee's liveness).
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached; the ticket may or may not
    /// hold the turn then, and the caller's `enqueue` of the same ticket (idempotent
    /// per ticket) finds out.
    fn grant_if_free(
        &self,
        request: &EnqueueRequest<'_>,
        sent: Instant,
    ) -> Result<Option<Grant>, BackendError> {
        let _ = (request, sent);
        Ok(None)
    }

    /// Takes a waiting ticket out of its queue (its wait ran out). Returns the grant if
    /// the ticket had been granted in the meantime, so the caller can use or release
    /// it.
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached.
    fn cancel(&self, waiting: &Waiting<'_>) -> Result<Option<Grant>, BackendError>;

    /// Ends a held turn and hands it to the next live waiter (rule 2). `handled`
    /// names the message id whose claim becomes final (a later delivery of it is a
    /// duplicate); `None` when the message was not handled or had no id.
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached; the lease then expires.
    fn release(
        &self,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
    ) -> Result<Released, BackendError>;

    /// [`release`](Coordinator::release) with the caller's reading of the process's
    /// real monotonic clock taken as it made the call, as `sent` of
    /// [`grant_if_free`](Coordinator::grant_if_free): a backend on that same clock
    /// may take it as the present (the memory backend does). The runtime releases
    /// through this, never through `release` directly; the default ignores `sent` and
    /// calls `release`.
    ///
    /// # Errors
    /// As [`release`](Coordinator::release).
    fn release_sent(
        &self,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
        sent: Instant,
    ) -> Result<Released, BackendError> {
        let _ = sent;
        self.release(lease, handled)
    }

    /// The renewal tick of one replica, in one call: extends the listed leases by one
    /// TTL and keeps the listed waiting tickets (and the replica) alive, and doubles as
    /// the safety re-check: expired holders are replaced first (so a crashed holder's
    /// chat moves on), and each waiting ticket's state is reported. Grants made to
    /// other replicas on the way are pushed to them. A waiting ticket found granted
    /// has its lease extended to at least one TTL from the call (its replica is
    /// alive, and is about to use it), so the caller may count it from the call's
    /// send time, as a renewal.
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached.
    fn renew(
        &self,
        replica: &ReplicaId,
        held: &[HeldLease<'_>],
        waiting: &[Waiting<'_>],
    ) -> Result<Renewal, BackendError>;

    /// Stores the chat's conversation checkpoint (`Some(data)`) or deletes it
    /// (`None`), fenced by `token` (fencing tokens: Kleppmann 2016): the write is
    /// applied (`Ok(true)`) only when `token` is the token of the chat's current,
    /// unexpired lease and not older than the stored checkpoint's; otherwise it is
    /// refused (`Ok(false)`): a holder whose lease ran out, even if nobody took the
    /// chat since, writes nothing. A stored checkpoint is kept for [`CHECKPOINT_TTL`] after its
    /// last write, also while the chat is idle.
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached; the write may or may not
    /// have been applied then.
    fn write_checkpoint(
        &self,
        chat: &str,
        token: Token,
        data: Option<&str>,
    ) -> Result<bool, BackendError>;

    /// The chat's stored checkpoint and the token it was written with, if any.
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached.
    fn read_checkpoint(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError>;

    /// For operators: one chat's holder, token, lease time left, queue length and
    /// previous holder. Read-only: never takes, extends or breaks a lease, and never
    /// moves the chat on (an expired holder simply shows as none). `chat` is the chat
    /// id as the user gave it. The default answers an error, for backends without it.
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached or has no inspection.
    fn inspect_chat(&self, chat: &str) -> Result<ChatView, BackendError> {
        let _ = chat;
        Err(no_inspection(self.backend()))
    }

    /// For operators: every held or waited-for chat (at most `limit`, sorted by chat
    /// id), the live replicas and the provider leaderships, read-only and bounded
    /// (Redis: `SCAN` with `COUNT`, stopping at the limit; not a point-in-time
    /// snapshot of the whole keyspace). The default answers an error.
    ///
    /// # Errors
    /// [`BackendError`] when the backend cannot be reached or has no inspection.
    fn inspect(&self, limit: usize) -> Result<MeshView, BackendError> {
        let _ = limit;
        Err(no_inspection(self.backend()))
    }
}

/// How long a chat's checkpoint is kept after its last write: 7 days. A user who
/// leaves a form for longer starts over.
pub const CHECKPOINT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a backend remembers an idle chat's last holder (for [`Grant::previous`]),
/// and so how long a replica's in-memory conversation can be told current: 1 h.
pub const HISTORY: Duration = Duration::from_secs(3600);

/// The default lease TTL of every backend: 10 s.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// The default duplicate-suppression window of every backend: 10 min.
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(600);

/// The default of the `dedup_ids` option of every backend: how many handled message
/// ids each chat remembers at least, 64. A chat keeps its newest `dedup_ids` to
/// 1.5 × `dedup_ids` handled ids (older ones are forgotten in batches, so that the
/// eviction's cost is shared by many messages); only a chat with more than that many
/// handled messages since an id can forget the id within the window. 64 keeps the
/// Redis state hash of a chat in Redis' compact encoding (under 128 fields); on the
/// whole-trace replay (5,974 chats, 213,759 messages) Redis kept 9.0 MB (6.9 MB with
/// 32, 10.9 MB with 128). See the README's *Duplicates* and *Performance* sections.
pub const DEFAULT_DEDUP_IDS: usize = 64;

/// The largest accepted `dedup_ids`: 10,000. A chat's handled ids are read whole when
/// a batch is forgotten, so the bound keeps that one call short.
pub const MAX_DEDUP_IDS: usize = 10_000;

/// Checks a `dedup_ids` setting; the error names `field` and the value.
pub(crate) fn check_dedup_ids(field: &str, n: usize) -> Result<(), String> {
    if n == 0 || n > MAX_DEDUP_IDS {
        return Err(format!(
            "{field}: {n} is out of range; expected a count of handled message ids per chat \
             from 1 to {MAX_DEDUP_IDS} (to turn duplicate suppression off, set the dedup \
             window to zero)"
        ));
    }
    Ok(())
}
