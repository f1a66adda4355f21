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
        let c = RedisCoordinator::connect(RedisOptions::new(server.url())).expect("connect");
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
    // A few holder fields, the floor and at most 32 marks, whatever the count.
    let n = fields(&server, "chat");
    assert!(n <= 45, "{n} fields");
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
    assert!(n <= 45, "{n} fields");
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
    assert!(fields(&server, "chat") <= 45);
    for i in [99, 90, 85] {
        assert!(!r.handle("chat", &format!("u-{i}")), "u-{i} is recent");
    }
}
