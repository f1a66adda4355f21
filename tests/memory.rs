//! The conformance suite against `MemoryCoordinator`.

mod conformance;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::DEFAULT_DEDUP_WINDOW;
use botmesh::{Coordinator, MemoryCoordinator};

struct Memory(Arc<MemoryCoordinator>);

impl conformance::Harness for Memory {
    fn start(ttl: Duration) -> Self {
        Memory(Arc::new(MemoryCoordinator::with_settings(
            ttl,
            DEFAULT_DEDUP_WINDOW,
        )))
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.0.clone()
    }
    fn live_state(&self) -> usize {
        self.0.active_chats()
    }
}

conformance::suite!(Memory);

/// Two live replicas may not share an id: they would take each other's grants.
#[test]
fn duplicate_replica_id_is_refused() {
    let c = Arc::new(MemoryCoordinator::new());
    let a = botmesh::Replica::start("same", c.clone()).expect("first");
    let err = botmesh::Replica::start("same", c.clone()).expect_err("second");
    assert!(err.to_string().contains("\"same\""), "{err}");
    a.shutdown();
    // After a clean stop the name is free again.
    botmesh::Replica::start("same", c)
        .expect("reuse")
        .shutdown();
}

/// A fake-clock coordinator with a 10 s TTL, and the clock.
fn fake_clocked() -> (MemoryCoordinator, botmesh::Clock, Duration) {
    let clock = botmesh::Clock::fake();
    let ttl = Duration::from_secs(10);
    let c = MemoryCoordinator::with_clock(ttl, DEFAULT_DEDUP_WINDOW, clock.clone());
    (c, clock, ttl)
}

/// Replica "a" attached, then a fifth of a TTL later granted the free chat "chat" at
/// once: its stored liveness still ends a TTL after the attach (the call moved it
/// not, being within a quarter TTL), its lease a TTL after the grant.
struct GrantedLater {
    c: MemoryCoordinator,
    clock: botmesh::Clock,
    ttl: Duration,
    a: support::Caller,
    ticket: botmesh::Ticket,
    grant: botmesh::Grant,
}

fn granted_a_fifth_ttl_after_attach() -> GrantedLater {
    let (c, clock, ttl) = fake_clocked();
    let a = support::Caller::attach(&c, "a");
    clock.advance(ttl / 5);
    let ticket = a.ticket(1);
    let grant = c
        .grant_if_free(&support::request(&ticket), std::time::Instant::now())
        .expect("call")
        .expect("the chat is free");
    GrantedLater {
        c,
        clock,
        ttl,
        a,
        ticket,
        grant,
    }
}

/// A turn granted at once lasts a full TTL from the call, whatever the caller's
/// stored liveness (which such a call moves only once it lags by a quarter TTL).
#[test]
fn a_grant_at_once_lasts_a_ttl_from_its_call() {
    let g = granted_a_fifth_ttl_after_attach();
    let (c, clock, ttl, ticket) = (&g.c, &g.clock, g.ttl, &g.ticket);
    // Past a TTL from attach, within a TTL from the grant.
    clock.advance(ttl - ttl / 10);
    let b = support::Caller::attach(c, "b");
    let other = b.ticket(1);
    assert!(
        c.grant_if_free(&support::request(&other), std::time::Instant::now())
            .expect("call")
            .is_none(),
        "a's lease runs a TTL from its grant"
    );
    let view = c.inspect_chat("chat").expect("inspect");
    let holder = view.holder.expect("held");
    assert_eq!(&holder.ticket, ticket);
    assert_eq!(holder.lease_left, ttl / 10);
}

/// The lease of `ticket` granted at once on the free chat "chat".
fn take_free<'a>(c: &MemoryCoordinator, ticket: &'a botmesh::Ticket) -> botmesh::HeldLease<'a> {
    let grant = c
        .grant_if_free(&support::request(ticket), std::time::Instant::now())
        .expect("call")
        .expect("free");
    botmesh::HeldLease {
        chat: "chat",
        ticket,
        token: grant.token,
    }
}

/// An enqueue stores its caller's liveness a TTL ahead (the replica counts a pushed
/// grant from the enqueue's send time), and a replica id attached again has its new
/// entry refreshed, not one a shard remembered from before. `detach`: the first
/// replica of the id detaches; else it crashes and its liveness lapses.
fn the_entry_attached_now_is_refreshed(detach: bool) {
    let (c, clock, ttl) = fake_clocked();
    let first = support::Caller::attach(&c, "a");
    let ticket = first.ticket(1);
    let now = std::time::Instant::now();
    // The chat's shard remembers the first entry of "a".
    let lease = take_free(&c, &ticket);
    c.release(&lease, None).expect("release");
    if detach {
        c.detach(&first.id, &[]).expect("detach");
        // A detached replica is not granted anything, though the shard saw it.
        let late = first.ticket(2);
        let granted = c
            .grant_if_free(&support::request(&late), now)
            .expect("call");
        assert!(
            granted.is_none(),
            "granted to a detached replica: {granted:?}"
        );
    } else {
        clock.advance(ttl * 2);
    }
    let again = support::Caller::attach(&c, "a");
    let holder = support::Caller::attach(&c, "b");
    let held = holder.ticket(1);
    let lease = take_free(&c, &held);
    clock.advance(ttl / 10);
    // b's lease now ends at 1.1 TTL; a's entry was stored alive until 1 TTL.
    c.renew(&holder.id, std::slice::from_ref(&lease), &[])
        .expect("renew");
    let waiting = again.ticket(7);
    let queued = c.enqueue(&support::request(&waiting)).expect("enqueue");
    assert!(matches!(queued, botmesh::Enqueued::Queued), "{queued:?}");
    clock.advance(ttl - ttl / 20);
    let live = c.inspect(10).expect("inspect").replicas;
    assert!(
        live.iter().any(|r| &**r == "a"),
        "the enqueue stored a's liveness in its attached entry: {live:?}"
    );
    // b's release hands the chat to a's waiting ticket, alive by that enqueue.
    c.release(&lease, None).expect("release");
    let view = c.inspect_chat("chat").expect("inspect");
    assert_eq!(view.holder.map(|h| h.ticket), Some(waiting));
}

#[test]
fn an_enqueue_refreshes_the_entry_of_a_replica_attached_after_a_detach() {
    the_entry_attached_now_is_refreshed(true);
}

#[test]
fn an_enqueue_refreshes_the_entry_of_a_replica_attached_after_a_crash() {
    the_entry_attached_now_is_refreshed(false);
}

/// An enqueue of `ticket` on `chat`, no message id, waiting up to an hour.
fn waiting_long<'a>(chat: &'a str, ticket: &'a botmesh::Ticket) -> botmesh::EnqueueRequest<'a> {
    botmesh::EnqueueRequest {
        chat,
        ticket,
        message_id: None,
        wait: Duration::from_secs(3600),
    }
}

/// A call into one chat finds replicas' entries under its shard's lock, while
/// renewals visit shards and attach and detach write the replicas' map: this must
/// never deadlock, also with two writers at once (a reader parked behind one writer
/// while a renewal read the map and waited for the shard was the deadlock a breaker
/// found). Threads hammer all of it at once; a watchdog turns a hang into a failure.
#[test]
fn shard_and_replica_locks_never_wait_on_each_other() {
    use std::sync::Barrier;
    const ROUNDS: u64 = 40_000;
    let c = Arc::new(MemoryCoordinator::new());
    let renewer = support::Caller::attach(&*c, "renewer");
    let chats: Vec<String> = (0..64).map(|i| format!("chat-{i}")).collect();
    // The renewer holds every chat, so callers queue behind it and their calls look
    // up the renewer's liveness (another replica's) under the shard's lock.
    let mut held = Vec::new();
    for (i, chat) in chats.iter().enumerate() {
        let ticket = renewer.ticket(i as u64 + 1);
        let req = waiting_long(chat, &ticket);
        let grant = c
            .grant_if_free(&req, std::time::Instant::now())
            .expect("call")
            .expect("free");
        held.push((ticket, grant.token));
    }
    const THREADS: usize = 5;
    let start = Arc::new(Barrier::new(THREADS + 1));
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    let mut threads = Vec::new();
    for t in 0..2u64 {
        let (c, chats, start, done) = (c.clone(), chats.clone(), start.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || {
            let me = support::Caller::attach(&*c, &format!("caller-{t}"));
            start.wait();
            for n in 0..ROUNDS {
                let ticket = me.ticket(n + 1);
                let chat = &chats[(n as usize) % chats.len()];
                let w = botmesh::Waiting {
                    chat,
                    ticket: &ticket,
                    message_id: None,
                };
                let req = waiting_long(chat, &ticket);
                let _ = c
                    .grant_if_free(&req, std::time::Instant::now())
                    .expect("grant_if_free");
                let _ = c.enqueue(&req).expect("enqueue");
                let _ = c.cancel(&w).expect("cancel");
            }
            let _ = done.send(());
        }));
    }
    for t in 0..2u64 {
        let (c, start, done) = (c.clone(), start.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || {
            start.wait();
            for n in 0..ROUNDS / 4 {
                let id: botmesh::ReplicaId = Arc::from(format!("passer-{t}-{}", n % 3));
                c.attach(&id, Arc::new(|_: &str, _| {})).expect("attach");
                c.detach(&id, &[]).expect("detach");
            }
            let _ = done.send(());
        }));
    }
    {
        let (c, start, done, chats) = (c.clone(), start.clone(), done_tx.clone(), chats.clone());
        threads.push(std::thread::spawn(move || {
            start.wait();
            for _ in 0..ROUNDS / 4 {
                let leases: Vec<botmesh::HeldLease<'_>> = held
                    .iter()
                    .zip(&chats)
                    .map(|((ticket, token), chat)| botmesh::HeldLease {
                        chat,
                        ticket,
                        token: *token,
                    })
                    .collect();
                c.renew(&renewer.id, &leases, &[]).expect("renew");
            }
            let _ = done.send(());
        }));
    }
    start.wait();
    for _ in 0..THREADS {
        done_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a thread is stuck: the locks waited on each other");
    }
    for t in threads {
        t.join().expect("thread");
    }
}

/// A lease granted on a free chat runs a TTL from its call, which may be up to a
/// quarter TTL past its holder's stored liveness: until it ends, the holder's id is
/// in use (a second replica of that id would share its grants, and its clean stop
/// would free the first one's turns) and the holder is listed live.
#[test]
fn a_holders_id_stays_in_use_while_its_lease_runs() {
    let g = granted_a_fifth_ttl_after_attach();
    let (c, clock, ttl, a, grant) = (&g.c, &g.clock, g.ttl, &g.a, &g.grant);
    // Past a's stored liveness (a TTL from attach), within its lease (1.2 TTL).
    clock.advance(ttl - ttl / 20);
    let view = c.inspect_chat("chat").expect("inspect");
    assert_eq!(
        view.holder.map(|h| h.token),
        Some(grant.token),
        "still held"
    );
    assert!(
        c.attach(&a.id, Arc::new(|_: &str, _| {})).is_err(),
        "a's id was taken again while a holds a running lease"
    );
    let live = c.inspect(10).expect("inspect").replicas;
    assert!(live.iter().any(|r| &**r == "a"), "{live:?}");
    // Once the lease could have ended, the id is free.
    clock.advance(ttl / 5);
    c.attach(&a.id, Arc::new(|_: &str, _| {}))
        .expect("a crashed replica's id is free once its leases ended");
}

/// A replica that crashed with a long queue of tickets on one chat, restarted under
/// the same id: the backlog's tickets count as the new replica's, which releases each
/// one's grant unused as it comes. Each release hands the chat to the next ticket of
/// the backlog; they are released in a loop, not one stack frame a ticket (3,000 of
/// them overflowed a 2 MiB thread stack), and the chat then goes on to a live waiter.
#[test]
fn a_dead_predecessors_backlog_is_released_without_recursion() {
    const BACKLOG: u64 = 3_000;
    let (c, clock, ttl) = fake_clocked();
    let c = Arc::new(c);
    {
        let old = support::Caller::attach(&*c, "a");
        for seq in 1..=BACKLOG {
            let ticket = old.ticket(seq);
            let req = waiting_long("chat", &ticket);
            c.enqueue(&req).expect("enqueue");
        }
    }
    clock.advance(ttl * 2);
    let new = botmesh::Replica::start("a", c.clone()).expect("the id is free again");
    let b = botmesh::Replica::start("b", c.clone()).expect("b");
    let got = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let token = b
                .acquire_timeout("chat", Duration::from_secs(5))
                .map(|t| t.fencing_token());
            b.shutdown();
            token
        })
        .expect("thread")
        .join()
        .expect("b's thread did not overflow its stack");
    assert!(got.is_ok(), "{got:?}");
    new.shutdown();
}
