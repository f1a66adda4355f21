//! Provider leadership with `MemoryCoordinator`: replicas as threads in one process,
//! sharing one coordinator, in front of the exclusive test platform
//! (`support/transport.rs`), which counts a conflict whenever two sessions overlap.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use botmesh::DEFAULT_DEDUP_WINDOW;
use botmesh::{
    Bot, CloseReason, CoordinationConfig, CoordinatorConfig, MemoryCoordinator, Message, Provider,
    ProviderError, ProviderSession, Reason, Replica, Session, StartError, Status,
};
use crossbeam_channel::{Receiver, Sender, unbounded};
use support::serial;
use support::transport::{Client, ClientEvent, Event, Server};

const P: &str = "platform";
const LONG: Duration = Duration::from_secs(20);

fn coordinator(ttl: Duration) -> Arc<MemoryCoordinator> {
    Arc::new(MemoryCoordinator::with_settings(ttl, DEFAULT_DEDUP_WINDOW))
}

/// How one replica of a test is set up.
struct Setup {
    coordinator: Arc<MemoryCoordinator>,
    server: std::net::SocketAddr,
    session: ProviderSession,
    exclusive: bool,
    provider_down: Duration,
    events: Sender<ClientEvent>,
    /// (replica, reply result) per handled message.
    replies: Sender<(String, Result<(), String>)>,
}

impl Setup {
    fn new(coordinator: Arc<MemoryCoordinator>, server: &Server) -> (Self, Receivers) {
        let (events, events_rx) = unbounded();
        let (replies, replies_rx) = unbounded();
        let setup = Setup {
            coordinator,
            server: server.addr(),
            session: ProviderSession::Leader,
            exclusive: true,
            provider_down: Duration::from_secs(60),
            events,
            replies,
        };
        (
            setup,
            Receivers {
                events: events_rx,
                replies: replies_rx,
            },
        )
    }

    fn bot(&self, id: &str) -> Bot {
        let client =
            Client::new(P, id, self.server, self.exclusive).with_events(self.events.clone());
        let config = CoordinationConfig::new(CoordinatorConfig::Shared(self.coordinator.clone()))
            .with_provider_session(self.session)
            .with_provider_down(self.provider_down);
        let (me, replies) = (id.to_owned(), self.replies.clone());
        Bot::builder()
            .id(id)
            .workers(2)
            .coordination(config)
            .provider(Arc::new(client))
            .handler(move |ctx| {
                let sent = ctx.reply(&format!("{me}: {}", ctx.message().text));
                let _ = replies.send((me.clone(), sent.map_err(|e| e.to_string())));
                Ok(())
            })
            .build()
            .expect("bot")
    }
}

struct Receivers {
    events: Receiver<ClientEvent>,
    replies: Receiver<(String, Result<(), String>)>,
}

impl Receivers {
    /// Skips client events until one matches.
    fn wait(&self, what: &str, mut f: impl FnMut(&ClientEvent) -> bool) -> ClientEvent {
        let deadline = Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let e = self
                .events
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no client event: {what}"));
            if f(&e) {
                return e;
            }
        }
    }
}

fn leaders(bots: &HashMap<String, Bot>) -> Vec<String> {
    bots.iter()
        .filter(|(_, b)| b.leader_token(P).is_some())
        .map(|(id, _)| id.clone())
        .collect()
}

/// When the server recorded the end of `replica`'s session with token `token`.
fn closed_at(server: &Server, replica: &str, token: Option<u64>) -> Instant {
    server
        .history()
        .into_iter()
        .find_map(|e| match e {
            Event::Closed {
                replica: r,
                token: t,
                at,
                ..
            } if r == replica && t == token => Some(at),
            _ => None,
        })
        .expect("the old session's end was recorded")
}

/// A leader that stops cleanly hands over at once: the standby is woken by the
/// release, not by the re-check (the TTL here is 3 s, the re-check 1 s).
#[test]
fn clean_stop_hands_over_at_once() {
    let _serial = serial();
    let server = Server::start(true);
    let (setup, rx) = Setup::new(coordinator(Duration::from_secs(3)), &server);
    let mut bots: HashMap<String, Bot> = ["a", "b", "c"]
        .iter()
        .map(|id| (id.to_string(), setup.bot(id)))
        .collect();
    let (first, t1, _) = server.wait_opened(LONG).expect("a leader connects");
    assert_eq!(leaders(&bots), std::slice::from_ref(&first));
    // The leadership lease is not a chat turn: it stays out of the turn figures.
    for (id, bot) in &bots {
        let m = bot.metrics();
        assert_eq!(
            (m.turns_held, m.tickets_waiting, m.turns_granted),
            (0, 0, 0),
            "{id}"
        );
        assert_eq!(m.providers_led, u64::from(*id == first), "{id}");
    }
    bots.remove(&first).expect("leader").shutdown();
    let (second, t2, opened) = server.wait_opened(LONG).expect("a standby takes over");
    let gap = opened - closed_at(&server, &first, t1);
    eprintln!("clean stop: {first} -> {second}, {gap:?} without a session");
    assert_ne!(second, first);
    assert!(t2 > t1, "tokens rise: {t1:?} then {t2:?}");
    assert!(
        gap < Duration::from_secs(1),
        "woken by the release: {gap:?}"
    );
    assert_eq!(leaders(&bots), std::slice::from_ref(&second));
    for bot in bots.into_values() {
        bot.shutdown();
    }
    assert_eq!(server.conflicts(), 0);
    assert!(matches!(
        rx.events.try_iter().last(),
        Some(ClientEvent::Stopped { .. })
    ));
}

/// A leader that crashes (abort: nothing released) is replaced after its lease lapses:
/// within the TTL plus one re-check, and not at once (a release would take a few ms).
#[test]
fn crash_hands_over_after_the_ttl() {
    let _serial = serial();
    let ttl = Duration::from_millis(600);
    let server = Server::start(true);
    let (setup, _rx) = Setup::new(coordinator(ttl), &server);
    let mut bots: HashMap<String, Bot> = ["a", "b", "c"]
        .iter()
        .map(|id| (id.to_string(), setup.bot(id)))
        .collect();
    let (first, t1, _) = server.wait_opened(LONG).expect("a leader connects");
    let crashed = Instant::now();
    bots.remove(&first).expect("leader").abort();
    let (second, t2, opened) = server.wait_opened(LONG).expect("a standby takes over");
    let gap = opened - crashed;
    eprintln!("crash: {first} -> {second} after {gap:?} (TTL {ttl:?})");
    assert_ne!(second, first);
    assert!(t2 > t1);
    assert!(gap >= ttl / 4, "the lease was not released: {gap:?}");
    assert!(gap < ttl * 5, "{gap:?}");
    for bot in bots.into_values() {
        bot.shutdown();
    }
    assert_eq!(server.conflicts(), 0);
}

/// The leader's transport stays closed (logged out) for `provider_down`: it stops the
/// transport and resigns, the standby connects; the old leader campaigns again and
/// leads once the new one stops.
#[test]
fn step_down_hands_over_to_the_standby() {
    let _serial = serial();
    let server = Server::start(true);
    let (mut setup, _rx) = Setup::new(coordinator(Duration::from_millis(600)), &server);
    let down = Duration::from_millis(300);
    setup.provider_down = down;
    let mut bots: HashMap<String, Bot> = ["a", "b"]
        .iter()
        .map(|id| (id.to_string(), setup.bot(id)))
        .collect();
    let (first, t1, _) = server.wait_opened(LONG).expect("a leader connects");
    let denied = Instant::now();
    server.deny(&first);
    let (second, t2, opened) = server.wait_opened(LONG).expect("the standby takes over");
    eprintln!(
        "step-down: {first} -> {second}, {:?} after the logout",
        opened - denied
    );
    assert_ne!(second, first);
    assert!(t2 > t1);
    assert!(opened - denied >= down, "stepped down early");
    let old = bots[&first].metrics();
    assert_eq!((old.leadership_changes, old.providers_led), (2, 0));
    assert!(old.leaderless_ms >= down.as_millis() as u64, "{old}");
    // The old leader campaigns again: it leads when the new one stops.
    server.allow(&first);
    bots.remove(&second).expect("new leader").shutdown();
    let (third, t3, _) = server
        .wait_opened(LONG)
        .expect("the old leader leads again");
    assert_eq!(third, first);
    assert!(t3 > t2);
    for bot in bots.into_values() {
        bot.shutdown();
    }
    assert_eq!(server.conflicts(), 0);
}

/// A lone replica whose transport stays closed steps down, sits one round out (nobody
/// else campaigns), then leads again with a new token.
#[test]
fn lone_replica_steps_down_and_tries_again() {
    let _serial = serial();
    let server = Server::start(true);
    let (mut setup, rx) = Setup::new(coordinator(Duration::from_millis(600)), &server);
    setup.provider_down = Duration::from_millis(200);
    let bot = setup.bot("solo");
    let (_, t1, _) = server.wait_opened(LONG).expect("it leads");
    server.deny("solo");
    rx.wait("the transport is stopped", |e| {
        matches!(e, ClientEvent::Stopped { .. })
    });
    server.allow("solo");
    let started = rx.wait("it leads again", |e| {
        matches!(e, ClientEvent::Started { .. })
    });
    let ClientEvent::Started { token: t2, .. } = started else {
        unreachable!()
    };
    assert!(t2 > t1, "a new lease: {t1:?} then {t2:?}");
    let (who, t3, _) = server.wait_opened(LONG).expect("it connects again");
    assert_eq!((who.as_str(), t3), ("solo", t2));
    assert_eq!(bot.metrics().leadership_changes, 3);
    bot.shutdown();
    assert_eq!(server.conflicts(), 0);
}

/// Only the leader's replies go out, with its token; a standby's are refused before
/// they reach the transport, and a stale token is refused by the platform.
#[test]
fn only_the_leader_sends() {
    let _serial = serial();
    let server = Server::start(true);
    let (setup, rx) = Setup::new(coordinator(Duration::from_secs(3)), &server);
    let bots: HashMap<String, Bot> = ["a", "b", "c"]
        .iter()
        .map(|id| (id.to_string(), setup.bot(id)))
        .collect();
    let (leader, token, _) = server.wait_opened(LONG).expect("a leader connects");
    // Messages reaching every replica directly (a webhook) are handled, but only the
    // leader may answer through the exclusive transport.
    for (id, bot) in &bots {
        bot.intake()
            .deliver(Message::new(format!("chat-{id}"), "hi"))
            .expect("deliver");
    }
    let mut refused = 0;
    for _ in 0..3 {
        let (who, sent) = rx.replies.recv_timeout(LONG).expect("a reply");
        match sent {
            Ok(()) => assert_eq!(who, leader),
            Err(e) => {
                assert_ne!(who, leader);
                assert!(e.contains("does not hold the leadership"), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 2);
    // A message from the platform reaches the leader, whose reply carries its token.
    assert_eq!(server.inject("chat-p", "hello"), 1);
    let sent = server
        .wait_for(
            LONG,
            |e| matches!(e, Event::Sent { text, .. } if text.ends_with("hello")),
        )
        .expect("the reply reaches the platform");
    let Event::Sent {
        replica, token: t, ..
    } = sent
    else {
        unreachable!()
    };
    assert_eq!((replica, t), (leader.clone(), token));
    // A send with an older token (a deposed leader's) is refused by the platform.
    let stale = token.map(|t| t - 1);
    let err = Client::send_with(server.addr(), "ghost", stale, "chat-p", "late")
        .expect_err("stale token");
    assert!(err.to_string().contains("FENCED"), "{err}");
    assert_eq!(server.fenced(), 1);
    for bot in bots.into_values() {
        bot.shutdown();
    }
    assert_eq!(server.conflicts(), 0);
}

/// `shared`: every replica connects, without a token, and every replica may send.
#[test]
fn shared_mode_connects_every_replica() {
    let _serial = serial();
    let server = Server::start(false);
    let (mut setup, rx) = Setup::new(coordinator(Duration::from_secs(3)), &server);
    setup.session = ProviderSession::Shared;
    let bots: Vec<Bot> = ["a", "b", "c"].iter().map(|id| setup.bot(id)).collect();
    let mut seen: Vec<(String, Option<u64>)> = (0..3)
        .map(|_| {
            let (r, t, _) = server.wait_opened(LONG).expect("every replica connects");
            (r, t)
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [("a".into(), None), ("b".into(), None), ("c".into(), None)]
    );
    for bot in &bots {
        assert_eq!(bot.leader_token(P), None);
        bot.intake()
            .deliver(Message::new("chat", "hi"))
            .expect("deliver");
    }
    for _ in 0..3 {
        let (who, sent) = rx.replies.recv_timeout(LONG).expect("a reply");
        assert_eq!(sent, Ok(()), "{who}");
    }
    for bot in bots {
        bot.shutdown();
    }
}

/// `auto` runs an exclusive provider under a leader, and a shared one everywhere.
#[test]
fn auto_picks_by_capability() {
    let _serial = serial();
    // Exclusive: one leader, the others stand by.
    let server = Server::start(true);
    let (mut setup, _rx) = Setup::new(coordinator(Duration::from_secs(3)), &server);
    setup.session = ProviderSession::Auto;
    setup.exclusive = true;
    let bots: HashMap<String, Bot> = ["a", "b", "c"]
        .iter()
        .map(|id| (id.to_string(), setup.bot(id)))
        .collect();
    let (leader, token, _) = server.wait_opened(LONG).expect("a leader connects");
    assert!(token.is_some());
    assert_eq!(leaders(&bots), [leader]);
    assert_eq!(server.sessions().len(), 1);
    for bot in bots.into_values() {
        bot.shutdown();
    }
    // A second session at any time would have replaced the first: a conflict.
    assert_eq!(server.conflicts(), 0);

    // Shared: everyone connects.
    let server = Server::start(false);
    let (mut setup, _rx) = Setup::new(coordinator(Duration::from_secs(3)), &server);
    setup.session = ProviderSession::Auto;
    setup.exclusive = false;
    let bots: Vec<Bot> = ["a", "b", "c"].iter().map(|id| setup.bot(id)).collect();
    for _ in 0..3 {
        let (_, token, _) = server.wait_opened(LONG).expect("every replica connects");
        assert_eq!(token, None);
    }
    for bot in bots {
        bot.shutdown();
    }
}

/// Every replica is restarted in turn, leader included: never two sessions.
#[test]
fn rolling_restart_has_no_conflict() {
    let _serial = serial();
    let server = Server::start(true);
    let (setup, _rx) = Setup::new(coordinator(Duration::from_millis(600)), &server);
    let ids = ["a", "b", "c"];
    let mut bots: HashMap<String, Bot> = ids
        .iter()
        .map(|id| (id.to_string(), setup.bot(id)))
        .collect();
    let (mut leader, _, _) = server.wait_opened(LONG).expect("a leader connects");
    for round in 0..2 {
        for id in ids {
            bots.remove(id).expect("running").shutdown();
            if id == leader {
                let (next, _, _) = server.wait_opened(LONG).expect("a standby takes over");
                assert_ne!(next, id, "round {round}");
                leader = next;
            }
            bots.insert(id.to_owned(), setup.bot(id));
        }
    }
    assert_eq!(leaders(&bots), [leader]);
    for bot in bots.into_values() {
        bot.shutdown();
    }
    assert_eq!(server.conflicts(), 0);
    let opened = server
        .history()
        .iter()
        .filter(|e| matches!(e, Event::Opened { .. }))
        .count();
    assert!(opened >= 3, "{opened} sessions");
}

/// A session taken over by another client is reported as a conflict in the metrics,
/// and the time without an open session is counted.
#[test]
fn conflicts_and_leaderless_time_are_counted() {
    let _serial = serial();
    let server = Server::start(true);
    let (setup, rx) = Setup::new(coordinator(Duration::from_secs(3)), &server);
    let bot = setup.bot("a");
    server.wait_opened(LONG).expect("it leads");
    // An intruder (no token) opens a session: the platform closes ours.
    let intruder = std::net::TcpStream::connect(server.addr()).expect("connect");
    use std::io::Write;
    (&intruder)
        .write_all(b"HELLO\tintruder\t-\n")
        .expect("hello");
    rx.wait("replaced", |e| {
        matches!(
            e,
            ClientEvent::Status {
                status: Status::Closed(CloseReason::Replaced),
                ..
            }
        )
    });
    assert_eq!(bot.metrics().provider_conflicts, 1);
    // Our client reconnects after 20 ms and takes the session back.
    server
        .wait_for(
            LONG,
            |e| matches!(e, Event::Opened { replica, .. } if replica == "a"),
        )
        .expect("reconnected");
    let deadline = Instant::now() + LONG;
    while bot.metrics().leaderless_ms < 20 {
        assert!(Instant::now() < deadline, "{}", bot.metrics());
        std::thread::yield_now();
    }
    bot.shutdown();
    drop(intruder);
}

/// A chat named like the leadership lease, with or without a leading NUL, and the
/// lease never block each other.
#[test]
fn chats_named_like_the_lease_do_not_collide() {
    let _serial = serial();
    let server = Server::start(true);
    let c = coordinator(Duration::from_secs(3));
    let (setup, _rx) = Setup::new(c.clone(), &server);
    let other = Replica::start("other", c.clone()).expect("replica");
    let names = ["provider:platform", "\0provider:platform"];
    // Chats first: the lease is still free.
    let held: Vec<_> = names
        .iter()
        .map(|n| other.acquire_timeout(n, LONG).expect("chat"))
        .collect();
    for (turn, name) in held.iter().zip(names) {
        assert_eq!(turn.chat(), name);
    }
    let bot = setup.bot("a");
    let (who, _, _) = server.wait_opened(LONG).expect("leads beside the chats");
    assert_eq!(who, "a");
    // Both chats are busy, and say so with their own names.
    let probe = Replica::start("probe", c.clone()).expect("replica");
    for name in names {
        let err = probe
            .acquire_timeout(name, Duration::from_millis(50))
            .expect_err("held");
        assert_eq!((err.reason, err.chat.as_str()), (Reason::Timeout, name));
    }
    drop(held);
    // Lease first: the chats are free.
    for name in names {
        let turn = other
            .acquire_timeout(name, LONG)
            .expect("free beside the lease");
        assert_eq!(turn.chat(), name);
        turn.release().expect("release");
    }
    assert!(bot.leader_token(P).is_some());
    bot.shutdown();
    probe.shutdown();
    other.shutdown();
}

/// A provider that never starts.
struct Broken;

impl Provider for Broken {
    fn id(&self) -> &str {
        "broken"
    }
    fn start(&self, _: Session) -> Result<(), ProviderError> {
        Err(ProviderError("no network".into()))
    }
    fn stop(&self) {}
    fn send(&self, _: &str, _: &str) -> Result<(), ProviderError> {
        Err(ProviderError("no network".into()))
    }
}

/// A provider whose start and stop panic.
struct Panicky;

impl Provider for Panicky {
    fn id(&self) -> &str {
        "panicky"
    }
    fn start(&self, _: Session) -> Result<(), ProviderError> {
        panic!("start blew up")
    }
    fn stop(&self) {
        panic!("stop blew up")
    }
    fn send(&self, _: &str, _: &str) -> Result<(), ProviderError> {
        Ok(())
    }
}

/// A transport that panics in start and stop does not end the election: it counts as
/// a failed start, and the replica keeps stepping down and trying again.
#[test]
fn a_panicking_provider_does_not_end_the_election() {
    let _serial = serial();
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(
        Duration::from_millis(300),
    )))
    .with_provider_session(ProviderSession::Leader)
    .with_provider_down(Duration::from_millis(50));
    let bot = Bot::builder()
        .id("a")
        .coordination(config)
        .provider(Arc::new(Panicky))
        .handler(|_| Ok(()))
        .build()
        .expect("bot");
    let deadline = Instant::now() + LONG;
    while bot.metrics().leadership_changes < 4 {
        assert!(Instant::now() < deadline, "{}", bot.metrics());
        std::thread::yield_now();
    }
    bot.shutdown();
    // In shared mode the panic is a failed start: the build says so.
    let err = Bot::builder()
        .provider(Arc::new(Panicky))
        .handler(|_| Ok(()))
        .build()
        .expect_err("start panics");
    assert!(err.to_string().contains("start panicked"), "{err}");
}

/// A leader-mode provider that fails to start counts as closed: the bot still starts,
/// and its leader steps down after `provider_down`, again and again.
#[test]
fn a_failed_start_counts_as_closed() {
    let _serial = serial();
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(
        Duration::from_millis(300),
    )))
    .with_provider_session(ProviderSession::Leader)
    .with_provider_down(Duration::from_millis(50));
    let bot = Bot::builder()
        .id("a")
        .coordination(config.clone())
        .provider(Arc::new(Broken))
        .handler(|_| Ok(()))
        .build()
        .expect("leader-mode start failures do not stop the build");
    let deadline = Instant::now() + LONG;
    while bot.metrics().leadership_changes < 4 {
        assert!(Instant::now() < deadline, "{}", bot.metrics());
        std::thread::yield_now();
    }
    bot.shutdown();
    // In shared mode the failure stops the build.
    let err = Bot::builder()
        .coordination(config.with_provider_session(ProviderSession::Shared))
        .provider(Arc::new(Broken))
        .handler(|_| Ok(()))
        .build()
        .expect_err("shared start fails");
    assert!(matches!(err, StartError::Provider(_)), "{err}");
}

/// Two providers with one id would share a lease name: refused.
#[test]
fn duplicate_provider_ids_are_refused() {
    let err = Bot::builder()
        .provider(Arc::new(Broken))
        .provider(Arc::new(Broken))
        .handler(|_| Ok(()))
        .build()
        .expect_err("duplicate");
    assert!(err.to_string().contains("\"broken\""), "{err}");
}

/// Provider ids are any string, NUL included: the bot still builds and leads.
#[test]
fn any_provider_id_works() {
    let _serial = serial();
    let server = Server::start(true);
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(
        Duration::from_secs(3),
    )))
    .with_provider_session(ProviderSession::Leader);
    let id = "odd\0id {with} provider:colons";
    let bot = Bot::builder()
        .id("a")
        .coordination(config)
        .provider(Arc::new(Client::new(id, "a", server.addr(), true)))
        .handler(|_| Ok(()))
        .build()
        .expect("bot");
    let (who, _, _) = server.wait_opened(LONG).expect("leads");
    assert_eq!(who, "a");
    assert!(bot.leader_token(id).is_some());
    bot.shutdown();
}

/// A standby cut off from the coordinator (its renewals fail, pushes to it are held
/// back, as behind a stalled network link) gets the lease pushed after the leader's
/// clean stop; its liveness lapses, so the lease goes on to the next standby, which
/// leads. When the link comes back the stale push arrives: the standby confirms it
/// with one renewal, finds it is not the holder, and never starts the transport.
#[test]
fn a_late_grant_is_confirmed_before_leading() {
    use botmesh::{BackendError, Coordinator, Grant, ReplicaId};
    use botmesh::{EnqueueRequest, Enqueued, GrantSink, HeldLease, Released, Renewal, Waiting};
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Stalled {
        inner: Arc<MemoryCoordinator>,
        stalled: AtomicBool,
        held_back: std::sync::Mutex<Vec<(String, Grant)>>,
        sink: std::sync::Mutex<Option<GrantSink>>,
        confirms: Sender<bool>,
        enqueued: Sender<()>,
    }
    impl Coordinator for Stalled {
        fn backend(&self) -> &'static str {
            "stalled"
        }
        fn lease_ttl(&self) -> Duration {
            self.inner.lease_ttl()
        }
        fn attach(&self, r: &ReplicaId, sink: GrantSink) -> Result<(), BackendError> {
            *self.sink.lock().expect("sink") = Some(sink);
            // Pushes go through `push` below, which holds them back while stalled.
            let me = SELF.with(|s| s.borrow().clone()).expect("registered");
            self.inner
                .attach(r, Arc::new(move |chat: &str, g: Grant| me.push(chat, g)))
        }
        fn detach(&self, r: &ReplicaId, h: &[HeldLease<'_>]) -> Result<(), BackendError> {
            self.inner.detach(r, h)
        }
        fn enqueue(&self, q: &EnqueueRequest<'_>) -> Result<Enqueued, BackendError> {
            let r = self.inner.enqueue(q);
            let _ = self.enqueued.send(());
            r
        }
        fn cancel(&self, w: &Waiting<'_>) -> Result<Option<Grant>, BackendError> {
            self.inner.cancel(w)
        }
        fn release(&self, l: &HeldLease<'_>, h: Option<&str>) -> Result<Released, BackendError> {
            self.inner.release(l, h)
        }
        fn renew(
            &self,
            r: &ReplicaId,
            l: &[HeldLease<'_>],
            w: &[Waiting<'_>],
        ) -> Result<Renewal, BackendError> {
            if self.stalled.load(Ordering::SeqCst) {
                return Err(BackendError::new("stalled (test)"));
            }
            let renewal = self.inner.renew(r, l, w)?;
            if l.len() == 1 && w.is_empty() {
                // One lease and no tickets: a confirmation before leading.
                let _ = self.confirms.send(renewal.held[0]);
            }
            Ok(renewal)
        }
        fn write_checkpoint(&self, c: &str, t: u64, d: Option<&str>) -> Result<bool, BackendError> {
            self.inner.write_checkpoint(c, t, d)
        }
        fn read_checkpoint(&self, c: &str) -> Result<Option<(u64, String)>, BackendError> {
            self.inner.read_checkpoint(c)
        }
    }
    impl Stalled {
        fn push(&self, chat: &str, g: Grant) {
            if self.stalled.load(Ordering::SeqCst) {
                self.held_back
                    .lock()
                    .expect("held")
                    .push((chat.to_owned(), g));
            } else if let Some(sink) = self.sink.lock().expect("sink").clone() {
                sink(chat, g);
            }
        }
        fn flush(&self) {
            self.stalled.store(false, Ordering::SeqCst);
            let held: Vec<_> = self.held_back.lock().expect("held").drain(..).collect();
            let sink = self.sink.lock().expect("sink").clone().expect("attached");
            for (chat, g) in held {
                sink(&chat, g);
            }
        }
    }
    thread_local! {
        static SELF: std::cell::RefCell<Option<Arc<Stalled>>> = const { std::cell::RefCell::new(None) };
    }

    let _serial = serial();
    let server = Server::start(true);
    let shared = coordinator(Duration::from_millis(600));
    let (confirms_tx, confirms) = unbounded();
    let (enqueued_tx, enqueued) = unbounded();
    let stalled = Arc::new(Stalled {
        inner: shared.clone(),
        stalled: AtomicBool::new(false),
        held_back: std::sync::Mutex::new(Vec::new()),
        sink: std::sync::Mutex::new(None),
        confirms: confirms_tx,
        enqueued: enqueued_tx,
    });
    SELF.with(|s| *s.borrow_mut() = Some(stalled.clone()));
    let bot = |id: &str, coordinator: Arc<dyn Coordinator>| {
        Bot::builder()
            .id(id)
            .workers(1)
            .coordination(
                CoordinationConfig::new(CoordinatorConfig::Shared(coordinator))
                    .with_provider_session(ProviderSession::Leader),
            )
            .provider(Arc::new(Client::new(P, id, server.addr(), true)))
            .handler(|_| Ok(()))
            .build()
            .expect("bot")
    };
    let b = bot("b", shared.clone());
    assert_eq!(server.wait_opened(LONG).expect("b leads").0, "b");
    let a = bot("a", stalled.clone());
    // a campaigns (its ticket queued behind b) before c starts.
    enqueued.recv_timeout(LONG).expect("a campaigns");
    let c = bot("c", shared.clone());
    stalled.stalled.store(true, Ordering::SeqCst);
    b.shutdown();
    // The push to a is held back; a's liveness lapses and c takes over.
    let (next, _, _) = server.wait_opened(LONG).expect("a standby leads");
    assert_eq!(next, "c", "the stalled standby must not lead");
    stalled.flush();
    assert_eq!(
        confirms.recv_timeout(LONG),
        Ok(false),
        "a confirms the late grant, which is not the lease any more"
    );
    assert!(a.leader_token(P).is_none());
    assert_eq!(server.conflicts(), 0);
    assert_eq!(server.fenced(), 0, "a never presented its stale token");
    a.shutdown();
    c.shutdown();
    assert!(server.sessions().iter().all(|(r, _)| r != "a"));
}

/// A clean stop lets the messages still running finish with their replies going out:
/// the transport and the leadership stay up until they end (intake refuses new
/// messages meanwhile).
#[test]
fn shutdown_lets_running_messages_reply() {
    let _serial = serial();
    let server = Server::start(true);
    let (gate_tx, gate) = unbounded::<()>();
    let (replied_tx, replied) = unbounded::<Result<(), String>>();
    let (running_tx, running) = unbounded::<()>();
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(
        Duration::from_secs(3),
    )))
    .with_provider_session(ProviderSession::Leader);
    let bot = Bot::builder()
        .id("solo")
        .coordination(config)
        .provider(Arc::new(Client::new(P, "solo", server.addr(), true)))
        .handler(move |ctx| {
            if ctx.message().text == "slow" {
                let _ = running_tx.send(());
                let _ = gate.recv_timeout(LONG);
                let _ = replied_tx.send(ctx.reply("done").map_err(|e| e.to_string()));
            }
            Ok(())
        })
        .build()
        .expect("bot");
    server.wait_opened(LONG).expect("it leads");
    let intake = bot.intake();
    intake.deliver(Message::new("c", "slow")).expect("deliver");
    running.recv_timeout(LONG).expect("the handler runs");
    let stopper = std::thread::spawn(move || bot.shutdown());
    // Shutdown has begun once intake refuses.
    let t0 = Instant::now();
    while intake.deliver(Message::new("probe", "x")).is_ok() {
        assert!(t0.elapsed() < LONG, "intake never closed");
        std::thread::yield_now();
    }
    gate_tx.send(()).expect("gate");
    assert_eq!(replied.recv_timeout(LONG).expect("the reply"), Ok(()));
    stopper.join().expect("shutdown");
    assert_eq!(server.conflicts(), 0);
}

/// A transport that never opens (it only ever reports connecting) counts as down:
/// the leader steps down after `provider_down` and, alone, tries again.
#[test]
fn a_transport_stuck_connecting_steps_down() {
    struct Stuck {
        starts: Sender<()>,
    }
    impl Provider for Stuck {
        fn id(&self) -> &str {
            P
        }
        fn capabilities(&self) -> botmesh::Capabilities {
            botmesh::Capabilities {
                exclusive_session: true,
            }
        }
        fn start(&self, session: Session) -> Result<(), ProviderError> {
            session.status().report(Status::Connecting);
            let _ = self.starts.send(());
            Ok(())
        }
        fn stop(&self) {}
        fn send(&self, _: &str, _: &str) -> Result<(), ProviderError> {
            Err(ProviderError("not connected".into()))
        }
    }
    let _serial = serial();
    let (starts_tx, starts) = unbounded();
    let config = CoordinationConfig::new(CoordinatorConfig::Shared(coordinator(
        Duration::from_millis(600),
    )))
    .with_provider_down(Duration::from_millis(200));
    let bot = Bot::builder()
        .id("stuck")
        .coordination(config)
        .provider(Arc::new(Stuck { starts: starts_tx }))
        .handler(|_| Ok(()))
        .build()
        .expect("bot");
    starts.recv_timeout(LONG).expect("it leads");
    starts
        .recv_timeout(LONG)
        .expect("it stepped down and leads again");
    let m = bot.metrics();
    assert!(m.leadership_changes >= 3, "{m}");
    bot.shutdown();
}
