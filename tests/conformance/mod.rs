//! The conformance suite of the `Coordinator` contract (SPEC §3, §8), written once and
//! run unchanged against every backend: a backend's test file declares `mod support;`
//! (the suite's tests hold `support::serial`), implements [`Harness`] and calls
//! `suite!(ItsHarness)`.
//!
//! Events are ordered with channels and barriers, never with sleeps; where the contract
//! itself is about time (a TTL running out), the tests wait for the event with a
//! generous upper bound and fail if it does not come.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use botmesh::{
    Accepted, Bot, CoordinationConfig, Coordinator, CoordinatorConfig, Error, Message, Outcome,
    Reason, Replica,
};
use botmesh::{EnqueueRequest, Enqueued, HeldLease, Released, Ticket, Waiting};
use crossbeam_channel::{Receiver, Sender, unbounded};

/// A backend under test.
pub trait Harness: Sized + 'static {
    /// A fresh, empty backend whose leases have this TTL.
    fn start(ttl: Duration) -> Self;
    /// A handle to it, shared by the replicas of one test.
    fn coordinator(&self) -> Arc<dyn Coordinator>;
    /// How many chats have state without an expiry (0 once every chat is idle).
    fn live_state(&self) -> usize;
}

pub const LONG: Duration = Duration::from_secs(30);

const RECV: Duration = Duration::from_secs(20);

fn config(h: &impl Harness, turn_wait: Duration) -> CoordinationConfig {
    CoordinationConfig::new(CoordinatorConfig::Shared(h.coordinator())).with_turn_wait(turn_wait)
}

fn recv<T>(rx: &Receiver<T>, what: &str) -> T {
    rx.recv_timeout(RECV)
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// One handler start: (chat, text, fencing token, replica).
type Entry = (String, String, u64, String);

/// A handler that records (chat, text, token) in start order and can be made to block
/// on chosen texts until the test lets it go.
#[derive(Clone)]
struct Recorder {
    log: Arc<Mutex<Vec<Entry>>>,
    started: Sender<String>,
    started_rx: Receiver<String>,
    gates: Arc<Mutex<HashMap<String, Receiver<()>>>>,
    busy: Arc<Mutex<HashMap<String, bool>>>,
    overlaps: Arc<AtomicUsize>,
}

impl Recorder {
    fn new() -> Self {
        let (started, started_rx) = unbounded();
        Recorder {
            log: Arc::default(),
            started,
            started_rx,
            gates: Arc::default(),
            busy: Arc::default(),
            overlaps: Arc::default(),
        }
    }

    /// Makes the handler of `text` block until the returned sender is used or dropped.
    fn gate(&self, text: &str) -> Sender<()> {
        let (tx, rx) = unbounded();
        self.gates.lock().unwrap().insert(text.to_owned(), rx);
        tx
    }

    fn bot(&self, id: &str, workers: usize, config: Option<CoordinationConfig>) -> Bot {
        self.bot_with(id, workers, config, |_| {})
    }

    fn bot_with(
        &self,
        id: &str,
        workers: usize,
        config: Option<CoordinationConfig>,
        on_error: impl Fn(&Error) + Send + Sync + 'static,
    ) -> Bot {
        let me = self.clone();
        let mut b = Bot::builder().id(id).workers(workers).on_error(on_error);
        if let Some(c) = config {
            b = b.coordination(c);
        }
        b.handler(move |ctx| {
            let m = ctx.message();
            {
                let mut busy = me.busy.lock().unwrap();
                let flag = busy.entry(m.chat.clone()).or_default();
                if *flag {
                    me.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                *flag = true;
            }
            me.log.lock().unwrap().push((
                m.chat.clone(),
                m.text.clone(),
                ctx.turn().fencing_token(),
                ctx.turn().replica().to_owned(),
            ));
            let _ = me.started.send(m.text.clone());
            let gate = me.gates.lock().unwrap().remove(&m.text);
            if let Some(gate) = gate {
                let _ = gate.recv();
            }
            me.busy.lock().unwrap().insert(m.chat.clone(), false);
            Ok(())
        })
        .build()
        .expect("bot starts")
    }

    fn texts(&self, chat: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.0 == chat)
            .map(|e| e.1.clone())
            .collect()
    }
}

fn msg(chat: &str, text: &str) -> Message {
    Message::new(chat, text).with_id(text)
}

/// Many threads on several replicas hammer a few chats: never two holders of one chat,
/// and tokens strictly increase per chat.
pub fn exclusion_and_fencing<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let replicas: Vec<Arc<Replica>> = (0..4)
        .map(|i| Arc::new(Replica::start(format!("r{i}"), h.coordinator()).expect("start")))
        .collect();
    let chats = ["a", "b", "c"];
    let holders: Arc<Vec<AtomicBool>> =
        Arc::new(chats.iter().map(|_| AtomicBool::new(false)).collect());
    let last: Arc<Vec<AtomicU64>> = Arc::new(chats.iter().map(|_| AtomicU64::new(0)).collect());
    let violations = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(16));
    let mut threads = Vec::new();
    for t in 0..16 {
        let r = replicas[t % 4].clone();
        let (holders, last, violations, barrier) = (
            holders.clone(),
            last.clone(),
            violations.clone(),
            barrier.clone(),
        );
        threads.push(thread::spawn(move || {
            barrier.wait();
            for i in 0..200 {
                let c = (t + i) % 3;
                let turn = r.acquire_timeout(chats[c], LONG).expect("acquire");
                if holders[c].swap(true, Ordering::SeqCst) {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                let token = turn.fencing_token();
                if last[c].swap(token, Ordering::SeqCst) >= token {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                holders[c].store(false, Ordering::SeqCst);
                turn.release().expect("release");
            }
        }));
    }
    for t in threads {
        t.join().expect("thread");
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    for r in replicas {
        Arc::into_inner(r).expect("sole owner").shutdown();
    }
    assert_eq!(h.live_state(), 0, "idle chats left state behind");
}

/// Messages of one chat run in the order intake accepted them, across replicas.
pub fn fifo_across_replicas<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let rec = Recorder::new();
    let bots: Vec<Bot> = (0..3)
        .map(|i| rec.bot(&format!("r{i}"), 2, Some(config(&h, LONG))))
        .collect();
    let hold = rec.gate("m0");
    bots[0]
        .intake()
        .deliver(msg("chat", "m0"))
        .expect("deliver");
    assert_eq!(recv(&rec.started_rx, "m0 to start"), "m0");
    for i in 1..=30 {
        let bot = &bots[i % 3];
        assert_eq!(
            bot.intake()
                .deliver(msg("chat", &format!("m{i}")))
                .expect("deliver"),
            Accepted::Queued
        );
    }
    drop(hold);
    for bot in bots {
        bot.shutdown();
    }
    let expected: Vec<String> = (0..=30).map(|i| format!("m{i}")).collect();
    assert_eq!(rec.texts("chat"), expected);
    assert_eq!(rec.overlaps.load(Ordering::SeqCst), 0);
    let tokens: Vec<u64> = rec.log.lock().unwrap().iter().map(|e| e.2).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens {tokens:?}");
}

/// A message that waits longer than turn_wait is reported once with `timeout`, and the
/// waiters behind it keep their order.
pub fn timeout_keeps_order_behind<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let rec = Recorder::new();
    let (err_tx, err_rx) = unbounded();
    let holder = rec.bot("holder", 2, Some(config(&h, LONG)));
    let impatient = rec.bot_with(
        "impatient",
        2,
        Some(config(&h, Duration::from_millis(200))),
        move |e| {
            let _ = err_tx.send(format!("{e:?}"));
        },
    );
    let patient = rec.bot("patient", 2, Some(config(&h, LONG)));
    let hold = rec.gate("m0");
    holder.intake().deliver(msg("chat", "m0")).expect("deliver");
    recv(&rec.started_rx, "m0 to start");
    patient
        .intake()
        .deliver(msg("chat", "m1"))
        .expect("deliver");
    impatient
        .intake()
        .deliver(msg("chat", "m2"))
        .expect("deliver");
    patient
        .intake()
        .deliver(msg("chat", "m3"))
        .expect("deliver");
    patient
        .intake()
        .deliver(msg("chat", "m4"))
        .expect("deliver");
    let reported = recv(&err_rx, "the timeout report");
    assert!(
        reported.contains("Timeout") && reported.contains("m2"),
        "{reported}"
    );
    drop(hold);
    for bot in [holder, impatient, patient] {
        bot.shutdown();
    }
    assert!(err_rx.try_recv().is_err(), "reported more than once");
    assert_eq!(rec.texts("chat"), ["m0", "m1", "m3", "m4"]);
}

/// A handler longer than the lease TTL keeps its turn through renewal; the chat's next
/// message starts only after it ended.
pub fn renewal_outlives_ttl<H: Harness>() {
    // 600 ms: short enough that the handler below outlives three TTLs, long enough
    // that a renewal delayed by a loaded host (a TLS reconnect, a busy CI machine)
    // still lands in time; at 300 ms the TLS run lost the lease under load.
    let h = H::start(Duration::from_millis(600));
    let rec = Recorder::new();
    let (out_tx, out_rx) = unbounded();
    let a = Bot::builder()
        .id("a")
        .coordination(config(&h, LONG))
        .handler({
            let rec = rec.clone();
            move |ctx| {
                let t0 = Instant::now();
                rec.log.lock().unwrap().push((
                    ctx.message().chat.clone(),
                    "start-long".into(),
                    0,
                    String::new(),
                ));
                // The handler really runs for 2 s, more than three TTLs.
                while t0.elapsed() < Duration::from_secs(2) {
                    thread::park_timeout(Duration::from_millis(50));
                }
                assert!(!ctx.turn().is_lost());
                rec.log.lock().unwrap().push((
                    ctx.message().chat.clone(),
                    "end-long".into(),
                    0,
                    String::new(),
                ));
                Ok(())
            }
        })
        .on_outcome(move |m, o| {
            let _ = out_tx.send((m.text.clone(), format!("{o:?}")));
        })
        .build()
        .expect("bot");
    let b = rec.bot("b", 2, Some(config(&h, LONG)));
    a.intake().deliver(msg("chat", "long")).expect("deliver");
    // Let the long handler start before the next message is queued.
    while rec.texts("chat").is_empty() {
        thread::yield_now();
    }
    b.intake().deliver(msg("chat", "next")).expect("deliver");
    let (text, outcome) = recv(&out_rx, "the long handler's outcome");
    assert_eq!(text, "long");
    assert!(outcome.starts_with("Handled"), "{outcome}");
    a.shutdown();
    b.shutdown();
    assert_eq!(rec.texts("chat"), ["start-long", "end-long", "next"]);
}

/// Replica "paused", attached straight to the backend (it never renews), granted
/// "chat" for ticket 1 with message id `id`.
fn paused_holder(
    c: &dyn Coordinator,
    id: Option<&str>,
) -> (botmesh::ReplicaId, Ticket, botmesh::Grant) {
    let paused: botmesh::ReplicaId = Arc::from("paused");
    c.attach(&paused, Arc::new(|_: &str, _| {}))
        .expect("attach");
    let old = Ticket {
        replica: paused.clone(),
        seq: 1,
    };
    let request = EnqueueRequest {
        chat: "chat",
        ticket: &old,
        message_id: id,
        wait: LONG,
    };
    match c.enqueue(&request).expect("enqueue") {
        Enqueued::Granted(g) => (paused.clone(), old.clone(), g),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// A holder whose lease expired and whose chat went to another replica releases: the
/// new holder keeps its turn and the old one learns it had lost (backend level).
pub fn stale_release_is_refused<H: Harness>() {
    let ttl = Duration::from_millis(300);
    let h = H::start(ttl);
    let c = h.coordinator();
    // The old holder talks to the backend directly and never renews: a paused process.
    let (paused, old, grant) = paused_holder(&*c, None);
    let fresh = Replica::start("fresh", c.clone()).expect("start");
    let turn = fresh
        .acquire_timeout("chat", LONG)
        .expect("the expired lease frees the chat");
    assert!(turn.fencing_token() > grant.token);
    assert_eq!(
        turn.previous().map(|p| p.replica.to_string()),
        Some("paused".to_owned())
    );
    let stale = HeldLease {
        chat: "chat",
        ticket: &old,
        token: grant.token,
    };
    assert_eq!(c.release(&stale, None).expect("release"), Released::Lost);
    assert_eq!(
        c.renew(&paused, &[stale], &[]).expect("renew").held,
        vec![false]
    );
    assert!(!turn.is_lost());
    // The new holder still excludes others.
    let other = Ticket {
        replica: paused.clone(),
        seq: 2,
    };
    assert_eq!(
        c.enqueue(&EnqueueRequest {
            chat: "chat",
            ticket: &other,
            message_id: None,
            wait: LONG
        })
        .expect("enqueue"),
        Enqueued::Queued
    );
    c.cancel(&Waiting {
        chat: "chat",
        ticket: &other,
        message_id: None,
    })
    .expect("cancel");
    turn.release().expect("the new holder's release succeeds");
    fresh.shutdown();
    c.detach(&paused, &[]).expect("detach");
}

/// A lease that ran out while nobody else was granted the chat is released (no other
/// holder can have overlapped it) and counts its message handled; a release once
/// another replica holds the chat is lost (backend level).
pub fn a_lapsed_lease_nobody_took_is_released<H: Harness>() {
    let ttl = Duration::from_millis(300);
    let h = H::start(ttl);
    let c = h.coordinator();
    let (paused, old, grant) = paused_holder(&*c, Some("m1"));
    let lease = HeldLease {
        chat: "chat",
        ticket: &old,
        token: grant.token,
    };
    // The backends' clocks are this host's: twice the TTL on it, and the lease ran out.
    let end = Instant::now() + ttl * 2;
    while Instant::now() < end {
        thread::park_timeout(end - Instant::now());
    }
    assert_eq!(
        c.release(&lease, Some("m1")).expect("release"),
        Released::Released { next: None }
    );
    let other = Ticket {
        replica: paused.clone(),
        seq: 2,
    };
    assert_eq!(
        c.enqueue(&EnqueueRequest {
            chat: "chat",
            ticket: &other,
            message_id: Some("m1"),
            wait: LONG,
        })
        .expect("enqueue"),
        Enqueued::Duplicate,
        "the message was handled under its lease"
    );
    c.detach(&paused, &[]).expect("detach");
}

/// A replica that loses its lease (its renewals fail for longer than the TTL) is told
/// through `Turn::is_lost`, and its release reports `lost`.
pub fn lost_lease_is_reported<H: Harness>() {
    let ttl = Duration::from_millis(300);
    let h = H::start(ttl);
    let cut = Arc::new(AtomicBool::new(false));
    let partitioned: Arc<dyn Coordinator> = Arc::new(Faulty {
        cut: cut.clone(),
        ..Faulty::new(h.coordinator())
    });
    let a = Replica::start("a", partitioned).expect("start");
    let b = Replica::start("b", h.coordinator()).expect("start");
    let turn = a.acquire_timeout("chat", LONG).expect("acquire");
    cut.store(true, Ordering::SeqCst);
    let next = b
        .acquire_timeout("chat", LONG)
        .expect("b gets the chat after a's lease lapsed");
    assert!(next.fencing_token() > turn.fencing_token());
    let t0 = Instant::now();
    while !turn.is_lost() {
        assert!(t0.elapsed() < RECV, "a never learned it lost the turn");
        thread::park_timeout(Duration::from_millis(10));
    }
    cut.store(false, Ordering::SeqCst);
    let err = turn.release().expect_err("a stale release fails");
    assert_eq!(err.reason, Reason::Lost);
    assert!(!next.is_lost());
    next.release().expect("b's release");
    a.shutdown();
    b.shutdown();
}

/// A waiter whose wake-ups are all lost still gets the turn, through the re-check in
/// the renewal tick (at most every TTL/3).
pub fn lost_wakeup_is_covered_by_recheck<H: Harness>() {
    let ttl = Duration::from_millis(600);
    let h = H::start(ttl);
    let deaf: Arc<dyn Coordinator> = Arc::new(Faulty {
        deaf: true,
        ..Faulty::new(h.coordinator())
    });
    let a = Replica::start("a", h.coordinator()).expect("start");
    let b = Arc::new(Replica::start("b", deaf).expect("start"));
    let turn = a.acquire_timeout("chat", LONG).expect("acquire");
    let (tx, rx) = unbounded();
    let b2 = b.clone();
    let waiter = thread::spawn(move || {
        let t = b2
            .acquire_timeout("chat", LONG)
            .expect("b gets the turn without a wake-up");
        let _ = tx.send(Instant::now());
        drop(t);
    });
    // Wait until b's ticket is queued, so the measured time is the re-check's alone.
    while b.metrics().tickets_waiting == 0 {
        thread::yield_now();
    }
    let released = Instant::now();
    turn.release().expect("release");
    let got = recv(&rx, "b's grant through the re-check");
    // One re-check period (TTL/3) plus scheduling slack; never the full turn_wait.
    assert!(
        got.duration_since(released) < ttl * 2,
        "took {:?}",
        got.duration_since(released)
    );
    waiter.join().expect("waiter");
    Arc::into_inner(b).expect("sole owner").shutdown();
    a.shutdown();
}

/// A coordinator wrapper that injects faults: renewals fail while `cut` is set (a
/// replica cut off from the backend), with `deaf` no push ever arrives (every
/// wake-up is lost), and a `door` holds the next release just before the backend.
struct Faulty {
    inner: Arc<dyn Coordinator>,
    cut: Arc<AtomicBool>,
    deaf: bool,
    /// The next `release` tells the first and waits on the second before it goes on.
    door: Mutex<Option<(Sender<()>, Receiver<()>)>>,
    /// Told once the next `detach` is done.
    detached: Mutex<Option<Sender<()>>>,
}

impl Faulty {
    fn new(inner: Arc<dyn Coordinator>) -> Self {
        Faulty {
            inner,
            cut: Arc::default(),
            deaf: false,
            door: Mutex::new(None),
            detached: Mutex::new(None),
        }
    }
}

impl Coordinator for Faulty {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl()
    }
    fn attach(
        &self,
        r: &botmesh::ReplicaId,
        sink: botmesh::GrantSink,
    ) -> Result<(), botmesh::BackendError> {
        if self.deaf {
            return self.inner.attach(r, Arc::new(|_: &str, _| {}));
        }
        self.inner.attach(r, sink)
    }
    fn detach(
        &self,
        r: &botmesh::ReplicaId,
        h: &[HeldLease<'_>],
    ) -> Result<(), botmesh::BackendError> {
        let out = self.inner.detach(r, h);
        if let Some(tx) = self.detached.lock().expect("detached").take() {
            let _ = tx.send(());
        }
        out
    }
    fn enqueue(&self, q: &EnqueueRequest<'_>) -> Result<Enqueued, botmesh::BackendError> {
        self.inner.enqueue(q)
    }
    fn cancel(&self, w: &Waiting<'_>) -> Result<Option<botmesh::Grant>, botmesh::BackendError> {
        self.inner.cancel(w)
    }
    fn release(
        &self,
        l: &HeldLease<'_>,
        h: Option<&str>,
    ) -> Result<Released, botmesh::BackendError> {
        let door = self.door.lock().expect("door").take();
        if let Some((at, go)) = door {
            let _ = at.send(());
            let _ = go.recv();
        }
        self.inner.release(l, h)
    }
    fn renew(
        &self,
        r: &botmesh::ReplicaId,
        l: &[HeldLease<'_>],
        w: &[Waiting<'_>],
    ) -> Result<botmesh::Renewal, botmesh::BackendError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(botmesh::BackendError::new("partitioned (test)"));
        }
        self.inner.renew(r, l, w)
    }
    fn write_checkpoint(
        &self,
        chat: &str,
        token: botmesh::Token,
        data: Option<&str>,
    ) -> Result<bool, botmesh::BackendError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(botmesh::BackendError::new("partitioned (test)"));
        }
        self.inner.write_checkpoint(chat, token, data)
    }
    fn read_checkpoint(
        &self,
        chat: &str,
    ) -> Result<Option<(botmesh::Token, String)>, botmesh::BackendError> {
        self.inner.read_checkpoint(chat)
    }
}

/// A replica stopped cleanly while one of its turns is being released (the release
/// sent, the backend not reached yet): the stop waits for that release before it
/// detaches. Released by the stop too, without its message id, the turn found its
/// own release refused and reported `lost` (the breaker review of session 11). The
/// one bounded wait checks that something does not happen, so a slow host can only
/// make this pass without proving the order, never fail it.
pub fn a_release_in_flight_at_a_stop_is_not_lost<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let backend = Arc::new(Faulty::new(h.coordinator()));
    let replica = Replica::start("r", backend.clone()).expect("start");
    let turn = replica.acquire_timeout("chat", LONG).expect("acquire");
    let (at_tx, at_rx) = unbounded();
    let (go_tx, go_rx) = unbounded();
    let (detached_tx, detached_rx) = unbounded();
    *backend.door.lock().expect("door") = Some((at_tx, go_rx));
    *backend.detached.lock().expect("detached") = Some(detached_tx);
    let releasing = thread::spawn(move || turn.release());
    recv(&at_rx, "the release at the backend's door");
    let stopping = thread::spawn(move || replica.shutdown());
    assert!(
        detached_rx
            .recv_timeout(Duration::from_millis(300))
            .is_err(),
        "the stop detached while a release was on its way"
    );
    go_tx.send(()).expect("let the release through");
    let released = releasing.join().expect("the release thread");
    recv(&detached_rx, "the stop's detach");
    stopping.join().expect("the stop thread");
    assert!(
        released.is_ok(),
        "a release sent before the stop: {released:?}"
    );
}

/// The same message id reaching two replicas a few ms apart is handled once; the
/// second delivery is reported as a duplicate.
pub fn duplicate_across_replicas<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let rec = Recorder::new();
    let (out_tx, out_rx) = unbounded();
    // The handler tells it started and waits to be let go, so the second delivery
    // comes while the first is surely in flight.
    let (started_tx, started_rx) = unbounded();
    let (go_tx, go_rx) = unbounded::<()>();
    let mk = |id: &str| {
        let rec = rec.clone();
        let out_tx = out_tx.clone();
        let (started_tx, go_rx) = (started_tx.clone(), go_rx.clone());
        let id_owned = id.to_owned();
        Bot::builder()
            .id(id)
            .coordination(config(&h, LONG))
            .handler(move |ctx| {
                let _ = started_tx.send(());
                let _ = go_rx.recv_timeout(LONG);
                rec.log.lock().unwrap().push((
                    ctx.message().chat.clone(),
                    ctx.message().text.clone(),
                    0,
                    String::new(),
                ));
                Ok(())
            })
            .on_outcome(move |m, o| {
                let _ = out_tx.send((
                    id_owned.clone(),
                    m.text.clone(),
                    matches!(o, Outcome::Duplicate),
                ));
            })
            .build()
            .expect("bot")
    };
    let a = mk("a");
    let b = mk("b");
    let m = Message::new("chat", "hello").with_id("update-7");
    assert_eq!(
        a.intake().deliver(m.clone()).expect("deliver"),
        Accepted::Queued
    );
    started_rx.recv_timeout(LONG).expect("a's handler started");
    // While a's delivery is in flight, b's is taken in and waits for it: it ends as a
    // duplicate once a's was handled (it would run if a died first).
    assert_eq!(
        b.intake().deliver(m.clone()).expect("deliver"),
        Accepted::Queued
    );
    go_tx.send(()).expect("let a's handler go");
    let mut outcomes: Vec<_> = Vec::new();
    while outcomes.len() < 2 {
        outcomes.push(out_rx.recv_timeout(LONG).expect("both deliveries end"));
    }
    let ma = a.metrics();
    a.shutdown();
    // A duplicate at once after the first was handled.
    assert_eq!(b.intake().deliver(m).expect("deliver"), Accepted::Duplicate);
    // Duplicates are not counted as accepted, also the one held back while a's ran.
    let mb = b.metrics();
    assert_eq!(
        (ma.accepted, ma.handled, ma.duplicates),
        (1, 1, 0),
        "{ma:?}"
    );
    assert_eq!(
        (mb.accepted, mb.handled, mb.duplicates),
        (0, 0, 2),
        "{mb:?}"
    );
    assert_eq!(mb.tickets_waiting, 0, "{mb:?}");
    b.shutdown();
    outcomes.extend(out_rx.try_iter());
    assert_eq!(outcomes.iter().filter(|o| !o.2).count(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| o.2).count(), 2, "{outcomes:?}");
    assert_eq!(rec.texts("chat"), ["hello"]);
}

/// A waiter that gave up (a `try_acquire`, an `acquire_timeout` that ran out) and asks
/// again later sees the holder before it as the previous one, not a grant of its own
/// released unused: on Redis the given-up tickets stay queued until the next
/// re-check, so the release hands the chat to one of them first (a grant nobody waits
/// for, released at once), and the next grant would name it.
pub fn a_waiter_that_gave_up_is_not_its_own_previous_holder<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let a = Replica::start("a", h.coordinator()).expect("start");
    let b = Replica::start("b", h.coordinator()).expect("start");
    let held = a.acquire_timeout("chat", LONG).expect("acquire");
    let first = held.fencing_token();
    let err = b.try_acquire("chat").expect_err("held by a");
    assert_eq!(err.reason, Reason::Timeout);
    let err = b
        .acquire_timeout("chat", Duration::from_millis(20))
        .expect_err("held by a throughout");
    assert_eq!(err.reason, Reason::Timeout);
    held.release().expect("release");
    let next = b.acquire_timeout("chat", LONG).expect("free now");
    assert!(next.fencing_token() > first);
    let previous = next.previous().expect("a held it last");
    assert_eq!((previous.replica.as_ref(), previous.token), ("a", first));
    assert!(next.is_handover());
    next.release().expect("release");
    a.shutdown();
    b.shutdown();
}

/// A replica holding a chat crashes (no release): the chat comes free within the TTL
/// plus one re-check, and the next holder's token is greater.
pub fn crashed_holder_frees_chat<H: Harness>() {
    let ttl = Duration::from_millis(400);
    let h = H::start(ttl);
    let a = Replica::start("a", h.coordinator()).expect("start");
    let b = Replica::start("b", h.coordinator()).expect("start");
    let turn = a.acquire_timeout("chat", LONG).expect("acquire");
    let first = turn.fencing_token();
    std::mem::forget(turn);
    let t0 = Instant::now();
    a.abort();
    let next = b
        .acquire_timeout("chat", LONG)
        .expect("the chat comes free");
    let waited = t0.elapsed();
    assert!(next.fencing_token() > first);
    assert!(next.is_handover());
    // Bound with slack for a loaded machine: TTL + one re-check (TTL/3) + scheduling.
    assert!(waited < ttl * 4, "took {waited:?}");
    next.release().expect("release");
    b.shutdown();
}

/// A crashed replica's tickets queued ahead of another replica's are skipped: the
/// other replica's message runs within about one TTL of the crash, not one TTL per
/// dead ticket.
pub fn crashed_replica_queue_is_skipped<H: Harness>() {
    let ttl = Duration::from_millis(400);
    let h = H::start(ttl);
    let rec = Recorder::new();
    let a = rec.bot("a", 1, Some(config(&h, LONG)));
    let b = rec.bot("b", 1, Some(config(&h, LONG)));
    let hold = rec.gate("a0");
    a.intake().deliver(msg("chat", "a0")).expect("deliver");
    recv(&rec.started_rx, "a0 to start");
    for i in 1..=6 {
        a.intake()
            .deliver(msg("chat", &format!("a{i}")))
            .expect("deliver");
    }
    b.intake().deliver(msg("chat", "b0")).expect("deliver");
    let t0 = Instant::now();
    a.abort();
    assert_eq!(recv(&rec.started_rx, "b0 to start"), "b0");
    let waited = t0.elapsed();
    // TTL for the liveness to lapse + one re-check (TTL/3) + slack for a busy machine;
    // one TTL per dead ticket would be 7 × 400 ms.
    assert!(waited < ttl * 4, "b0 waited {waited:?}");
    drop(hold);
    b.shutdown();
    assert_eq!(rec.texts("chat"), ["a0", "b0"]);
}

/// A clean stop frees the replica's chats at once, not after the TTL.
pub fn clean_stop_frees_at_once<H: Harness>() {
    let h = H::start(Duration::from_secs(60));
    let a = Replica::start("a", h.coordinator()).expect("start");
    let b = Replica::start("b", h.coordinator()).expect("start");
    let turn = a.acquire_timeout("chat", LONG).expect("acquire");
    std::mem::forget(turn); // still held when `a` stops
    let (tx, rx) = unbounded();
    let waiter = thread::spawn(move || {
        let t = b.acquire_timeout("chat", LONG);
        let _ = tx.send(t.is_ok());
        drop(t);
        b.shutdown();
    });
    // The waiter may or may not be queued yet; either way it must get the chat long
    // before the 60 s TTL.
    a.shutdown();
    assert!(recv(&rx, "b to get the chat"));
    waiter.join().expect("waiter");
}

/// Turns still held when their replica stops read as lost, and the chat is free.
pub fn stopping_replica_loses_its_turns<H: Harness>() {
    let h = H::start(Duration::from_secs(60));
    let a = Replica::start("a", h.coordinator()).expect("start");
    let b = Replica::start("b", h.coordinator()).expect("start");
    let turn = a.acquire_timeout("chat", LONG).expect("acquire");
    a.shutdown();
    assert!(turn.is_lost());
    let next = b
        .acquire_timeout("chat", Duration::from_secs(5))
        .expect("free at once");
    assert!(next.fencing_token() > turn.fencing_token());
    assert_eq!(turn.release().expect_err("stale").reason, Reason::Lost);
    next.release().expect("release");
    b.shutdown();
}

/// Chat ids are any non-empty UTF-8 string up to 4 KiB and never collide.
pub fn any_chat_id<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let r = Replica::start("r", h.coordinator()).expect("start");
    let long = "x".repeat(4096);
    let ids: Vec<String> = vec![
        "{a}".into(),
        "{a}:b".into(),
        "{a}:".into(),
        ":b".into(),
        "a b".into(),
        "a\nb".into(),
        "a\rb".into(),
        "ñandú 🦀".into(),
        "{".into(),
        "}".into(),
        "a\0b".into(),
        long.clone(),
        "turn:a".into(),
        "a:turn".into(),
    ];
    // Hold every id at once: none may block another.
    let turns: Vec<_> = ids
        .iter()
        .map(|id| {
            r.acquire_timeout(id, Duration::from_secs(2))
                .unwrap_or_else(|e| panic!("{id:?}: {e}"))
        })
        .collect();
    for (t, id) in turns.iter().zip(&ids) {
        assert_eq!(t.chat(), id);
    }
    drop(turns);
    // SPEC §3: an empty id and one over 4 KiB are refused, naming the limit.
    for id in [String::new(), format!("{long}y")] {
        let e = r
            .acquire_timeout(&id, Duration::from_secs(2))
            .expect_err("refused");
        assert_eq!(e.reason, Reason::Invalid, "{e}");
        assert!(e.to_string().contains("chat: the chat id is"), "{e}");
    }
    r.shutdown();
    assert_eq!(h.live_state(), 0);
}

/// Fencing tokens keep rising after a chat was idle and its state was dropped.
pub fn tokens_rise_after_idle<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let r = Replica::start("r", h.coordinator()).expect("start");
    let t1 = r.acquire_timeout("chat", LONG).expect("acquire");
    let first = t1.fencing_token();
    t1.release().expect("release");
    assert_eq!(h.live_state(), 0);
    r.shutdown();
    let r2 = Replica::start("r-restarted", h.coordinator()).expect("start");
    let t2 = r2.acquire_timeout("chat", LONG).expect("acquire");
    assert!(t2.fencing_token() > first);
    drop(t2);
    r2.shutdown();
}

/// A message waiting for a busy chat holds no worker: with W = 2 and one chat stuck
/// behind a blocked handler, other chats still run.
pub fn waiting_holds_no_worker<H: Harness>() {
    let h = H::start(Duration::from_secs(10));
    let rec = Recorder::new();
    let bot = rec.bot("r", 2, Some(config(&h, LONG)));
    let hold = rec.gate("stuck-0");
    bot.intake()
        .deliver(msg("stuck", "stuck-0"))
        .expect("deliver");
    recv(&rec.started_rx, "the stuck handler");
    for i in 1..20 {
        bot.intake()
            .deliver(msg("stuck", &format!("stuck-{i}")))
            .expect("deliver");
    }
    for i in 0..100 {
        bot.intake()
            .deliver(msg(&format!("other-{i}"), &format!("o{i}")))
            .expect("deliver");
    }
    // All 100 other chats run on the one free worker while "stuck" waits.
    for _ in 0..100 {
        let t = recv(&rec.started_rx, "other chats to run");
        assert!(t.starts_with('o'), "{t} ran while the chat was held");
    }
    drop(hold);
    bot.shutdown();
    let expected: Vec<String> = (0..20).map(|i| format!("stuck-{i}")).collect();
    assert_eq!(rec.texts("stuck"), expected);
}

/// Checkpoint writes are fenced: once B was granted the chat after A, A's writes
/// (and deletes) with its older token are refused, B's are applied, and a reader sees
/// B's data with B's token.
pub fn checkpoint_fencing<H: Harness>() {
    let h = H::start(LONG);
    let c = h.coordinator();
    let a = Replica::start("ckpt-a", c.clone()).expect("a");
    let b = Replica::start("ckpt-b", c.clone()).expect("b");
    let chat = "ckpt {chat}\n";
    assert_eq!(c.read_checkpoint(chat).expect("read"), None);
    let ta = a.acquire_timeout(chat, LONG).expect("a turn");
    let old = ta.fencing_token();
    assert!(
        c.write_checkpoint(chat, old, Some("from a"))
            .expect("write a")
    );
    ta.release().expect("release a");
    let tb = b.acquire_timeout(chat, LONG).expect("b turn");
    let new = tb.fencing_token();
    assert!(new > old);
    // B has not written yet: A's stale write is refused by the grant's token alone.
    assert!(
        !c.write_checkpoint(chat, old, Some("stale a"))
            .expect("stale write")
    );
    assert_eq!(
        c.read_checkpoint(chat).expect("read"),
        Some((old, "from a".to_owned()))
    );
    assert!(
        c.write_checkpoint(chat, new, Some("from b"))
            .expect("write b")
    );
    assert!(!c.write_checkpoint(chat, old, None).expect("stale delete"));
    // Large and binary-looking data round-trips.
    let big = "x\u{0}y{}".repeat(10_000);
    assert!(c.write_checkpoint(chat, new, Some(&big)).expect("big"));
    assert_eq!(c.read_checkpoint(chat).expect("read"), Some((new, big)));
    assert!(
        c.write_checkpoint(chat, new, Some("from b"))
            .expect("write b")
    );
    tb.release().expect("release b");
    // Once released, even the latest token writes nothing (its lease is over), and
    // the older one still nothing.
    assert!(
        !c.write_checkpoint(chat, old, Some("late a"))
            .expect("late write")
    );
    assert!(
        !c.write_checkpoint(chat, new, Some("late b"))
            .expect("late write")
    );
    assert_eq!(
        c.read_checkpoint(chat).expect("read"),
        Some((new, "from b".to_owned()))
    );
    let tb = b.acquire_timeout(chat, LONG).expect("b again");
    assert!(
        c.write_checkpoint(chat, tb.fencing_token(), None)
            .expect("delete")
    );
    assert_eq!(c.read_checkpoint(chat).expect("read"), None);
    tb.release().expect("release");
    a.shutdown();
    b.shutdown();
}

/// Runs the whole suite for a harness type.
/// The re-check asks about a replica's earliest ticket of a chat by sequence; a ticket
/// queued again later (an in-flight claim taken over, a re-queue) stands behind later
/// ones. A grant to any of the replica's tickets in the chat is reported, so a lost
/// wake-up for it is found by the next tick, not when its lease has run out.
pub fn recheck_finds_a_grant_to_another_ticket_of_the_caller<H: Harness>() {
    let h = H::start(LONG);
    let c = h.coordinator();
    let (hid, rid): (botmesh::ReplicaId, botmesh::ReplicaId) = (Arc::from("h"), Arc::from("r"));
    for id in [&hid, &rid] {
        // Every push is dropped: the wake-ups are lost.
        c.attach(id, Arc::new(|_: &str, _| {})).expect("attach");
    }
    let ticket = |replica: &botmesh::ReplicaId, seq| Ticket {
        replica: replica.clone(),
        seq,
    };
    let (holder, late, early) = (ticket(&hid, 1), ticket(&rid, 7), ticket(&rid, 3));
    let enqueue = |t: &Ticket| {
        c.enqueue(&EnqueueRequest {
            chat: "chat",
            ticket: t,
            message_id: None,
            wait: LONG,
        })
        .expect("enqueue")
    };
    let Enqueued::Granted(first) = enqueue(&holder) else {
        panic!("a free chat is granted at once");
    };
    // r's ticket 7 is queued before its ticket 3.
    assert_eq!(enqueue(&late), Enqueued::Queued);
    assert_eq!(enqueue(&early), Enqueued::Queued);
    let lease = HeldLease {
        chat: "chat",
        ticket: &holder,
        token: first.token,
    };
    c.release(&lease, None).expect("release");
    let asked = [Waiting {
        chat: "chat",
        ticket: &early,
        message_id: None,
    }];
    let renewal = c.renew(&rid, &[], &asked).expect("renew");
    let found = match renewal.waiting.first() {
        Some(botmesh::TicketState::Granted(g)) => g.clone(),
        other => panic!("expected the grant to ticket 7, got {other:?}"),
    };
    assert_eq!(found.ticket, late);
    let held = HeldLease {
        chat: "chat",
        ticket: &late,
        token: found.token,
    };
    assert!(
        matches!(c.release(&held, None), Ok(Released::Released { .. })),
        "the found grant is the chat's live lease"
    );
    c.cancel(&asked[0]).expect("cancel");
    for id in [&hid, &rid] {
        c.detach(id, &[]).expect("detach");
    }
}

macro_rules! suite {
    ($h:ty) => {
        #[test]
        fn recheck_finds_a_grant_to_another_ticket_of_the_caller() {
            let _serial = crate::support::serial();
            conformance::recheck_finds_a_grant_to_another_ticket_of_the_caller::<$h>();
        }
        #[test]
        fn exclusion_and_fencing() {
            let _serial = crate::support::serial();
            conformance::exclusion_and_fencing::<$h>();
        }
        #[test]
        fn fifo_across_replicas() {
            let _serial = crate::support::serial();
            conformance::fifo_across_replicas::<$h>();
        }
        #[test]
        fn timeout_keeps_order_behind() {
            let _serial = crate::support::serial();
            conformance::timeout_keeps_order_behind::<$h>();
        }
        #[test]
        fn renewal_outlives_ttl() {
            let _serial = crate::support::serial();
            conformance::renewal_outlives_ttl::<$h>();
        }
        #[test]
        fn stale_release_is_refused() {
            let _serial = crate::support::serial();
            conformance::stale_release_is_refused::<$h>();
        }
        #[test]
        fn a_lapsed_lease_nobody_took_is_released() {
            let _serial = crate::support::serial();
            conformance::a_lapsed_lease_nobody_took_is_released::<$h>();
        }
        #[test]
        fn lost_lease_is_reported() {
            let _serial = crate::support::serial();
            conformance::lost_lease_is_reported::<$h>();
        }
        #[test]
        fn duplicate_across_replicas() {
            let _serial = crate::support::serial();
            conformance::duplicate_across_replicas::<$h>();
        }
        #[test]
        fn a_waiter_that_gave_up_is_not_its_own_previous_holder() {
            let _serial = crate::support::serial();
            conformance::a_waiter_that_gave_up_is_not_its_own_previous_holder::<$h>();
        }
        #[test]
        fn a_release_in_flight_at_a_stop_is_not_lost() {
            let _serial = crate::support::serial();
            conformance::a_release_in_flight_at_a_stop_is_not_lost::<$h>();
        }
        #[test]
        fn crashed_holder_frees_chat() {
            let _serial = crate::support::serial();
            conformance::crashed_holder_frees_chat::<$h>();
        }
        #[test]
        fn crashed_replica_queue_is_skipped() {
            let _serial = crate::support::serial();
            conformance::crashed_replica_queue_is_skipped::<$h>();
        }
        #[test]
        fn clean_stop_frees_at_once() {
            let _serial = crate::support::serial();
            conformance::clean_stop_frees_at_once::<$h>();
        }
        #[test]
        fn stopping_replica_loses_its_turns() {
            let _serial = crate::support::serial();
            conformance::stopping_replica_loses_its_turns::<$h>();
        }
        #[test]
        fn lost_wakeup_is_covered_by_recheck() {
            let _serial = crate::support::serial();
            conformance::lost_wakeup_is_covered_by_recheck::<$h>();
        }
        #[test]
        fn any_chat_id() {
            let _serial = crate::support::serial();
            conformance::any_chat_id::<$h>();
        }
        #[test]
        fn tokens_rise_after_idle() {
            let _serial = crate::support::serial();
            conformance::tokens_rise_after_idle::<$h>();
        }
        #[test]
        fn checkpoint_fencing() {
            let _serial = crate::support::serial();
            conformance::checkpoint_fencing::<$h>();
        }
        #[test]
        fn waiting_holds_no_worker() {
            let _serial = crate::support::serial();
            conformance::waiting_holds_no_worker::<$h>();
        }
    };
}
pub(crate) use suite;
