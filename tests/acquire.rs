//! The `acquire` family of `Replica`, shaped like crossbeam-channel's `recv`:
//! `acquire` waits as long as it takes, `try_acquire` not at all, `acquire_timeout`
//! and `acquire_deadline` until a bound. Events are ordered by channels, not sleeps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use botmesh::{MemoryCoordinator, MemoryOptions, Reason, Replica};

fn two_replicas() -> (Replica, Replica) {
    let c = Arc::new(MemoryCoordinator::new());
    let a = Replica::start("a", c.clone()).expect("a");
    let b = Replica::start("b", c).expect("b");
    (a, b)
}

#[test]
fn try_acquire_takes_a_free_chat_and_refuses_a_held_one_at_once() {
    let (a, b) = two_replicas();
    let turn = a.try_acquire("chat").expect("free");
    let err = b.try_acquire("chat").expect_err("held by a");
    assert_eq!(err.reason, Reason::Timeout);
    turn.release().expect("release");
    // The refused attempt left nothing queued: the chat is free again at once.
    b.try_acquire("chat")
        .expect("free again")
        .release()
        .expect("release");
    a.shutdown();
    b.shutdown();
}

#[test]
fn acquire_waits_for_the_release_however_long_it_takes() {
    let (a, b) = two_replicas();
    let held = a.acquire("chat").expect("free");
    let token = held.fencing_token();
    let (started, waiting) = crossbeam_channel::bounded(1);
    let (done, got) = crossbeam_channel::bounded(1);
    let waiter = std::thread::spawn(move || {
        started.send(()).expect("send");
        let turn = b.acquire("chat").expect("granted after the release");
        done.send(turn.fencing_token()).expect("send");
        turn.release().expect("release");
        b
    });
    waiting.recv().expect("waiter started");
    // Still held: nothing can have been granted yet.
    assert!(got.try_recv().is_err());
    held.release().expect("release");
    assert!(got.recv().expect("granted") > token);
    waiter.join().expect("waiter").shutdown();
    a.shutdown();
}

#[test]
fn acquire_timeout_and_deadline_give_up_with_timeout() {
    let (a, b) = two_replicas();
    let held = a.acquire("chat").expect("free");
    let err = b
        .acquire_timeout("chat", Duration::from_millis(20))
        .expect_err("held throughout");
    assert_eq!(err.reason, Reason::Timeout);
    // A deadline already past is a try.
    let err = b
        .acquire_deadline("chat", Instant::now())
        .expect_err("held throughout");
    assert_eq!(err.reason, Reason::Timeout);
    held.release().expect("release");
    let t = b
        .acquire_deadline("chat", Instant::now() + Duration::from_secs(5))
        .expect("free now");
    t.release().expect("release");
    a.shutdown();
    b.shutdown();
}

#[test]
fn turns_and_errors_name_the_chat_as_given_whatever_its_length_or_first_byte() {
    // Names up to 24 bytes are kept inline by the turn and the table, longer ones on
    // the heap; a chat id starting with a NUL is stored with one more in front.
    let long = "chat-ünïcödé-that-is-longer-than-twenty-four-bytes";
    for chat in ["c", "\0starts-with-a-nul", long, &format!("\0{long}")] {
        let (a, b) = two_replicas();
        let held = a.acquire(chat).expect("free");
        assert_eq!(held.chat(), chat);
        let err = b.try_acquire(chat).expect_err("held by a");
        assert_eq!((err.reason, err.chat.as_str()), (Reason::Timeout, chat));
        let err = b
            .acquire_timeout(chat, Duration::from_millis(20))
            .expect_err("held throughout");
        assert_eq!((err.reason, err.chat.as_str()), (Reason::Timeout, chat));
        let token = held.fencing_token();
        held.release().expect("release");
        let next = b.acquire(chat).expect("free now");
        assert_eq!(next.chat(), chat);
        assert!(next.fencing_token() > token);
        // The table remembered the chat under its full name.
        let previous = next.previous().expect("a held it last");
        assert_eq!((previous.replica.as_ref(), previous.token), ("a", token));
        assert!(next.is_handover());
        next.release().expect("release");
        a.shutdown();
        b.shutdown();
    }
}

#[test]
fn a_replica_refuses_a_coordinator_whose_lease_is_too_short_to_keep() {
    let short = Arc::new(MemoryCoordinator::with_settings(
        Duration::from_millis(1),
        Duration::ZERO,
    ));
    match Replica::start("r1", short) {
        Ok(_) => panic!("a 1 ms lease cannot be kept by renewals every TTL/3"),
        Err(e) => assert!(e.to_string().contains("lease TTL is 1ms"), "{e}"),
    }
    let least = Arc::new(MemoryCoordinator::with_settings(
        MemoryOptions::MIN_LEASE_TTL,
        Duration::ZERO,
    ));
    assert!(Replica::start("r1", least).is_ok());
}

#[test]
fn a_turn_released_after_its_replica_stopped_reports_lost_while_held() {
    let (a, _b) = two_replicas();
    let turn = a.acquire("chat").expect("free");
    a.shutdown();
    let e = turn.release().expect_err("the replica stopped under it");
    assert_eq!(e.reason, Reason::Lost);
    assert!(e.handler_started, "the holder's work ran: {e}");
    assert!(e.to_string().contains("lost while it was held"), "{e}");
}

#[test]
fn an_error_keeps_a_long_chat_id_whole_and_shows_its_first_64_characters() {
    let (a, b) = two_replicas();
    let chat = "ü".repeat(2000); // 4,000 bytes: within the 4 KiB limit
    let _held = a.acquire(&chat).expect("free");
    let e = b.try_acquire(&chat).expect_err("held by a");
    assert_eq!(e.reason, Reason::Timeout);
    assert_eq!(e.chat, chat, "the host gets the id whole, to act on");
    let shown = e.to_string();
    let cut = format!("\"{}…\"", "ü".repeat(64));
    assert!(shown.contains(&cut), "{shown}");
    assert!(shown.len() < 600, "{} bytes: {shown}", shown.len());
}

#[test]
fn a_free_chat_and_a_waited_one_each_count_once_as_accepted_and_granted() {
    use botmesh::Coordinator as _;
    let c = Arc::new(MemoryCoordinator::new());
    let a = Replica::start("a", c.clone()).expect("a");
    let b = Replica::start("b", c.clone()).expect("b");
    // Uncontended: granted in the answer to its request.
    let held = a.acquire("chat").expect("free");
    let m = a.metrics();
    assert_eq!((m.accepted, m.turns_granted, m.turns_waited), (1, 1, 0));
    assert_eq!(m.wait_histogram.iter().sum::<u64>(), 1);
    assert_eq!(m.wait_histogram[0], 1, "no wait: under 1 µs");
    assert_eq!(m.turns_held, 1);
    // Contended: b's ticket waits in the queue until a releases.
    let (asked, asking) = crossbeam_channel::bounded(1);
    let waiter = std::thread::spawn(move || {
        asked.send(()).expect("main waits");
        let turn = b.acquire("chat").expect("granted after a's release");
        turn.release().expect("release");
        b
    });
    asking.recv().expect("waiter started");
    // The waiter's ticket is queued once the chat shows it (no sleep).
    while c.inspect_chat("chat").expect("inspect").queued == 0 {
        std::thread::yield_now();
    }
    held.release().expect("release");
    let b = waiter.join().expect("waiter");
    let m = b.metrics();
    assert_eq!((m.accepted, m.turns_granted, m.turns_waited), (1, 1, 1));
    assert_eq!(m.wait_histogram.iter().sum::<u64>(), 1);
    assert_eq!(a.metrics().turns_held, 0);
    a.shutdown();
    b.shutdown();
}

/// A turn dropped by a thread that panics while holding it is released once by the
/// unwinding drop: the next holder names it as previous, and nothing counts it lost.
#[test]
fn a_turn_dropped_while_its_thread_panics_is_released_once() {
    let c = Arc::new(MemoryCoordinator::new());
    let a = Arc::new(Replica::start("a", c.clone()).expect("a"));
    let b = Replica::start("b", c).expect("b");
    let holder = a.clone();
    let (token_tx, token_rx) = crossbeam_channel::bounded(1);
    let panicked = std::thread::spawn(move || {
        let turn = holder.acquire("chat").expect("free");
        token_tx.send(turn.fencing_token()).expect("main waits");
        panic!("a handler panics holding the turn");
    })
    .join();
    assert!(panicked.is_err());
    let token = token_rx.recv().expect("token");
    let next = b
        .try_acquire("chat")
        .expect("released by the unwinding drop");
    let previous = next.previous().map(|p| (&*p.replica, p.token));
    assert_eq!(previous, Some(("a", token)));
    next.release().expect("release");
    let m = a.metrics();
    assert_eq!(
        (m.accepted, m.turns_granted, m.turns_held, m.lost),
        (1, 1, 0, 0)
    );
    b.shutdown();
}

/// A replica id is at most `MAX_REPLICA_ID_BYTES`; a longer one is refused with an
/// error that names the field and the limit and shows the id cut short.
#[test]
fn a_replica_id_over_the_limit_is_refused_naming_it() {
    let c = Arc::new(MemoryCoordinator::new());
    let longest = "r".repeat(botmesh::MAX_REPLICA_ID_BYTES);
    Replica::start(longest, c.clone())
        .expect("an id at the limit")
        .shutdown();
    let over = "r".repeat(botmesh::MAX_REPLICA_ID_BYTES + 1);
    let err = Replica::start(over, c.clone()).expect_err("over the limit");
    let text = err.to_string();
    assert!(text.contains("replica id"), "{text}");
    assert!(
        text.contains("513 bytes") && text.contains("MAX_REPLICA_ID_BYTES"),
        "{text}"
    );
    assert!(
        text.len() < 300,
        "the id is shown cut short: {} bytes",
        text.len()
    );
    let err = Replica::start("", c).expect_err("empty");
    assert!(err.to_string().contains("non-empty"), "{err}");
}
