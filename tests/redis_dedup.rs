//! Duplicate suppression over Redis with state bounded per chat: the newest handled
//! message ids are kept as marks, older ones are evicted, and a chat whose numeric ids
//! rise keeps a floor under which an unknown id is a duplicate. Against a real
//! `redis-server`, through the `Coordinator` calls.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::{
    Coordinator, EnqueueRequest, Enqueued, HeldLease, Released, ReplicaId, Ticket, Waiting,
};
use support::RedisServer;

const WAIT: Duration = Duration::from_secs(30);

struct One {
    c: RedisCoordinator,
    me: ReplicaId,
    seq: u64,
}

impl One {
    fn new(server: &RedisServer) -> One {
        Self::with(RedisOptions::new(server.url()).with_dedup_ids(16))
    }

    fn with(options: RedisOptions) -> One {
        let c = RedisCoordinator::connect(options).expect("connect");
        let me: ReplicaId = Arc::from("r");
        c.attach(&me, Arc::new(|_: &str, _| {})).expect("attach");
        One { c, me, seq: 0 }
    }

    fn ticket(&mut self) -> Ticket {
        self.seq += 1;
        Ticket {
            replica: self.me.clone(),
            seq: self.seq,
        }
    }

    fn enqueue(&mut self, chat: &str, id: &str) -> (Ticket, Enqueued) {
        let t = self.ticket();
        let answer = self
            .c
            .enqueue(&EnqueueRequest {
                chat,
                ticket: &t,
                message_id: Some(id),
                wait: WAIT,
            })
            .expect("enqueue");
        (t, answer)
    }

    /// Delivers `id` to a free chat and handles it; false when it was a duplicate.
    fn handle(&mut self, chat: &str, id: &str) -> bool {
        match self.enqueue(chat, id) {
            (t, Enqueued::Granted(g)) => {
                let lease = HeldLease {
                    chat,
                    ticket: &t,
                    token: g.token,
                };
                let released = self.c.release(&lease, Some(id)).expect("release");
                assert_eq!(released, Released::Released { next: None });
                true
            }
            (_, Enqueued::Duplicate) => false,
            (_, other) => panic!("{id}: {other:?}"),
        }
    }
}

fn fields(server: &RedisServer, chat: &str) -> usize {
    redis::cmd("HLEN")
        .arg(format!("botmesh:{{{chat}}}:s"))
        .query(&mut server.connection())
        .expect("HLEN")
}

#[test]
fn rising_ids_are_suppressed_for_good_in_bounded_state() {
    let server = RedisServer::start();
    let mut r = One::new(&server);
    for i in 1..=200 {
        assert!(r.handle("chat", &i.to_string()), "{i} is new");
    }
    // A few holder fields, the floor and at most 24 marks (dedup_ids 16), whatever
    // the count.
    let n = fields(&server, "chat");
    assert!(n <= 35, "{n} fields");
    // The newest ids by their marks, the oldest by the floor.
    for i in [200, 199, 150, 2, 1] {
        assert!(!r.handle("chat", &i.to_string()), "{i} is a duplicate");
    }
    assert!(r.handle("chat", "201"), "a new id runs");
    // Other chats do not share the floor.
    assert!(r.handle("other", "5"));
}

#[test]
fn a_given_up_id_under_the_floor_still_runs() {
    let server = RedisServer::start();
    let mut r = One::new(&server);
    // Id 10 waits behind a holder and gives up (its wait ran out).
    let (t9, g9) = r.enqueue("chat", "9");
    let Enqueued::Granted(g9) = g9 else {
        panic!("a free chat is granted")
    };
    let (t10, queued) = r.enqueue("chat", "10");
    assert_eq!(queued, Enqueued::Queued);
    let waiting = Waiting {
        chat: "chat",
        ticket: &t10,
        message_id: Some("10"),
    };
    assert_eq!(r.c.cancel(&waiting).expect("cancel"), None);
    let lease = HeldLease {
        chat: "chat",
        ticket: &t9,
        token: g9.token,
    };
    r.c.release(&lease, Some("9")).expect("release");
    // Many later ids are handled: the floor passes 10.
    for i in 11..=100 {
        assert!(r.handle("chat", &i.to_string()));
    }
    assert!(!r.handle("chat", "9"), "9 was handled");
    assert!(r.handle("chat", "10"), "10 never ran: its redelivery must");
}

#[test]
fn ids_that_do_not_rise_turn_the_floor_off() {
    let server = RedisServer::start();
    let mut r = One::new(&server);
    // Numbers in no order: after the first out-of-order one there is no floor, and the
    // oldest ids are forgotten once evicted rather than swallowed.
    let ids: Vec<u64> = (0..100).map(|i| (i * 7919 % 1000) + 1).collect();
    for id in &ids {
        assert!(r.handle("chat", &id.to_string()), "{id} is new");
    }
    let n = fields(&server, "chat");
    assert!(n <= 35, "{n} fields");
    assert!(
        !r.handle("chat", &ids[99].to_string()),
        "recent: a duplicate"
    );
    // An id never seen, under every id handled so far: new, never a duplicate.
    assert!(r.handle("chat", "1001") && r.handle("chat", "1000"));
}

#[test]
fn string_ids_keep_the_newest_marks() {
    let server = RedisServer::start();
    let mut r = One::new(&server);
    for i in 0..100 {
        assert!(r.handle("chat", &format!("u-{i}")));
    }
    assert!(fields(&server, "chat") <= 35);
    for i in [99, 90, 85] {
        assert!(!r.handle("chat", &format!("u-{i}")), "u-{i} is recent");
    }
}

/// With the default `dedup_ids` (64), a chat whose ids are strings remembers at least
/// its newest 64 handled ids, and holds at most 96 marks.
#[test]
fn the_default_keeps_the_newest_64_handled_ids() {
    let server = RedisServer::start();
    let mut r = One::with(RedisOptions::new(server.url()));
    for i in 0..300 {
        assert!(r.handle("chat", &format!("u-{i}")));
    }
    let n = fields(&server, "chat");
    assert!(n <= 96 + 10, "{n} fields");
    for i in 236..300 {
        assert!(
            !r.handle("chat", &format!("u-{i}")),
            "u-{i} is among the newest 64"
        );
    }
    let refused = RedisCoordinator::connect(RedisOptions::new(server.url()).with_dedup_ids(0));
    let Err(e) = refused else {
        panic!("dedup_ids 0 is refused")
    };
    assert!(e.to_string().contains("dedup_ids: 0"), "{e}");
}

/// An enqueue retried after its first reply was lost, once its ticket was granted
/// (by that first attempt or a push) and the message handled meanwhile: the handled
/// mark names the ticket, so the retry is answered `Queued` (the grant's own end
/// reports the message), while any other ticket with the id is a `Duplicate`.
#[test]
fn a_retried_enqueue_whose_own_ticket_handled_the_id_is_not_a_duplicate() {
    let server = RedisServer::start();
    let mut r = One::new(&server);
    let (t, answer) = r.enqueue("chat", "7");
    let Enqueued::Granted(g) = answer else {
        panic!("a free chat is granted: {answer:?}")
    };
    let lease = HeldLease {
        chat: "chat",
        ticket: &t,
        token: g.token,
    };
    r.c.release(&lease, Some("7")).expect("release");
    let retry =
        r.c.enqueue(&EnqueueRequest {
            chat: "chat",
            ticket: &t,
            message_id: Some("7"),
            wait: WAIT,
        })
        .expect("enqueue");
    assert_eq!(retry, Enqueued::Queued, "the same ticket's retry");
    assert!(
        !r.handle("chat", "7"),
        "another delivery of 7 is a duplicate"
    );
    // A retried release after a lost reply is recognised by the same mark.
    assert_eq!(
        r.c.release(&lease, Some("7")).expect("release"),
        Released::Released { next: None }
    );
}

/// A message that may wait longer than the chat's state would otherwise be kept (a
/// `turn_wait` of hours, beyond the history and the dedup window) keeps its claim: the
/// state hash holding it is kept at least the wait and a lease from its enqueue, so a
/// redelivery meanwhile cannot run it a second time.
#[test]
fn a_claim_outlives_a_wait_longer_than_the_history() {
    let server = RedisServer::start();
    let mut r =
        One::with(RedisOptions::new(server.url()).with_dedup_window(Duration::from_secs(60)));
    let (_, holder) = r.enqueue("chat", "1");
    assert!(matches!(holder, Enqueued::Granted(_)), "{holder:?}");
    let t = r.ticket();
    let wait = Duration::from_secs(3 * 3600);
    let answer =
        r.c.enqueue(&EnqueueRequest {
            chat: "chat",
            ticket: &t,
            message_id: Some("2"),
            wait,
        })
        .expect("enqueue");
    assert_eq!(answer, Enqueued::Queued);
    let left: i64 = redis::cmd("PTTL")
        .arg("botmesh:{chat}:s")
        .query(&mut server.connection())
        .expect("PTTL");
    assert!(
        left >= i64::try_from(wait.as_millis()).unwrap_or(i64::MAX),
        "the claim's hash expires in {left} ms, before the message's wait ends"
    );
}

/// Eviction goes by the handling grant's token as a number, also when tokens of
/// different widths meet in one chat (marks sort as strings only while all tokens
/// have one width).
#[test]
fn eviction_orders_marks_of_mixed_token_widths_by_number() {
    let server = RedisServer::start();
    let mut r = One::new(&server);
    for i in 0..10 {
        assert!(r.handle("chat", &format!("u-{i}")));
    }
    // Marks with short tokens, so older than any token the server hands out now.
    let key = "botmesh:{chat}:s";
    let mut con = server.connection();
    for i in 0..10 {
        let _: i64 = redis::cmd("HSET")
            .arg(key)
            .arg(format!("mold-{i}"))
            .arg(format!("!{},{i}:x", 5 + i))
            .query(&mut con)
            .expect("HSET");
    }
    // 14 more handled: 24 counted marks (dedup_ids 16) start an eviction of the 18
    // oldest of 34: the 10 short-token ones, then u-0 to u-7.
    for i in 10..24 {
        assert!(r.handle("chat", &format!("u-{i}")));
    }
    let exists = |con: &mut redis::Connection, f: &str| -> bool {
        redis::cmd("HEXISTS")
            .arg(key)
            .arg(f)
            .query(con)
            .expect("HEXISTS")
    };
    for i in 0..10 {
        assert!(!exists(&mut con, &format!("mold-{i}")), "old-{i} evicted");
    }
    for i in 0..8 {
        assert!(!exists(&mut con, &format!("mu-{i}")), "u-{i} evicted");
    }
    for i in 8..24 {
        assert!(exists(&mut con, &format!("mu-{i}")), "u-{i} kept");
    }
}

#[test]
fn a_call_that_fails_midway_leaves_nothing_for_the_next_call() {
    // The functions keep their working tables for the library's life and empty them
    // at each call's start: what a call that failed before writing had gathered must
    // not be written by the next call, into another chat.
    let server = RedisServer::start();
    let mut r = One::new(&server);
    let mut con = server.connection();
    // A chat held by another replica with tickets counted in its list, whose list key
    // is damaged: an enqueue gathers its claim's write, then its RPUSH fails.
    let _: () = redis::cmd("HSET")
        .arg("botmesh:{bad}:s")
        .arg("h")
        .arg("1,99999999999999999,3,0,1:other")
        .arg("e")
        .arg("99999999999999999")
        .query(&mut con)
        .expect("HSET");
    let _: () = redis::cmd("SET")
        .arg("botmesh:{bad}:q")
        .arg("not a list")
        .query(&mut con)
        .expect("SET");
    let t = r.ticket();
    let failed = r.c.enqueue(&EnqueueRequest {
        chat: "bad",
        ticket: &t,
        message_id: Some("m-bad"),
        wait: WAIT,
    });
    assert!(failed.is_err(), "{failed:?}");
    // The next calls, on other chats, write only their own fields.
    assert!(r.handle("good", "m-good"));
    let (_, queued) = r.enqueue("good", "m-next");
    assert!(matches!(queued, Enqueued::Granted(_)), "{queued:?}");
    let good: Vec<String> = redis::cmd("HKEYS")
        .arg("botmesh:{good}:s")
        .query(&mut con)
        .expect("HKEYS");
    assert!(
        !good.iter().any(|f| f == "mm-bad" || f.starts_with("a")),
        "fields of the failed call leaked: {good:?}"
    );
    assert!(good.iter().any(|f| f == "mm-good"), "{good:?}");
}

#[test]
fn a_replica_id_with_a_nul_is_refused_before_anything_is_written() {
    // The records, wake-ups and replies separate their fields with NULs: a ticket of
    // such a replica would be granted and its reply misread, the chat then held by
    // nobody until the lease ran out.
    let server = RedisServer::start();
    let c = RedisCoordinator::connect(RedisOptions::new(server.url())).expect("connect");
    let odd: ReplicaId = Arc::from("a\0b");
    let e = c
        .attach(&odd, Arc::new(|_: &str, _| {}))
        .expect_err("attach refuses it");
    assert!(e.to_string().contains("NUL"), "{e}");
    let t = Ticket {
        replica: odd,
        seq: 1,
    };
    let e = c
        .enqueue(&EnqueueRequest {
            chat: "c",
            ticket: &t,
            message_id: None,
            wait: WAIT,
        })
        .expect_err("enqueue refuses it");
    assert!(e.to_string().contains(r#""a\0b""#), "{e}");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.connection())
        .expect("KEYS");
    assert!(keys.is_empty(), "written: {keys:?}");
}
