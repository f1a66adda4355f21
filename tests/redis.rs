//! The conformance suite against `RedisCoordinator` and real `redis-server` processes.
#![cfg(feature = "redis")]

mod conformance;
mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::{Coordinator, EnqueueRequest, Enqueued, HeldLease, ReplicaId, Ticket};
use support::RedisServer;

struct Redis {
    server: RedisServer,
    coordinator: Arc<RedisCoordinator>,
}

impl conformance::Harness for Redis {
    fn start(ttl: Duration) -> Self {
        let server = RedisServer::start();
        let options = RedisOptions::new(server.url()).with_lease_ttl(ttl);
        let coordinator = Arc::new(RedisCoordinator::connect(options).expect("connect"));
        Redis {
            server,
            coordinator,
        }
    }
    fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.coordinator.clone()
    }
    fn live_state(&self) -> usize {
        self.server.keys_without_ttl().len()
    }
}

conformance::suite!(Redis);

/// Two runs of one replica id on one coordinator: a run that stalled past its
/// liveness, and the run that replaced it. The stale run's stop releases its own lease
/// by its token and leaves the later run's wake-up subscription live: a grant pushed
/// to the later run still arrives. (The plain `detach` stopped the id's subscriber,
/// whichever run it listened for.)
#[test]
fn a_stale_runs_detach_leaves_the_later_runs_wake_ups() {
    let _serial = support::serial();
    let server = RedisServer::start();
    let c = RedisCoordinator::connect(RedisOptions::new(server.url())).expect("connect");
    let r: ReplicaId = Arc::from("r");
    let x: ReplicaId = Arc::from("x");
    let (old_tx, _old_rx) = crossbeam_channel::unbounded::<String>();
    let old_sink = Arc::new(move |chat: &str, _| {
        let _ = old_tx.send(chat.to_owned());
    });
    c.attach_incarnation(&r, 1, old_sink)
        .expect("the first run attaches");
    let ticket = |replica: &ReplicaId, seq| Ticket {
        replica: replica.clone(),
        seq,
    };
    let request = |chat, ticket| EnqueueRequest {
        chat,
        ticket,
        message_id: None,
        wait: Duration::from_secs(30),
    };
    // The first run holds "old".
    let t_old = ticket(&r, 1);
    let Ok(Enqueued::Granted(g_old)) = c.enqueue(&request("old", &t_old)) else {
        panic!("a free chat is granted")
    };
    // A later run of the id takes over; x holds "chat" and the later run waits on it.
    let (new_tx, new_rx) = crossbeam_channel::unbounded::<String>();
    let new_sink = Arc::new(move |chat: &str, _| {
        let _ = new_tx.send(chat.to_owned());
    });
    c.attach_incarnation(&r, 2, new_sink)
        .expect("the later run attaches");
    c.attach(&x, Arc::new(|_: &str, _| {})).expect("x attaches");
    let t_x = ticket(&x, 1);
    let Ok(Enqueued::Granted(g_x)) = c.enqueue(&request("chat", &t_x)) else {
        panic!("a free chat is granted")
    };
    let t_new = ticket(&r, 1_000);
    assert_eq!(
        c.enqueue(&request("chat", &t_new)).ok(),
        Some(Enqueued::Queued)
    );
    // The stale run stops: its lease on "old" by its token, nothing of the later run.
    let held = [HeldLease {
        chat: "old",
        ticket: &t_old,
        token: g_old.token,
    }];
    c.detach_incarnation(&r, 1, &held)
        .expect("the stale run detaches");
    let t_y = ticket(&x, 2);
    assert!(
        matches!(c.enqueue(&request("old", &t_y)), Ok(Enqueued::Granted(_))),
        "the stale run's own lease was released"
    );
    // x releases "chat": the grant is pushed to the later run, which still listens.
    let lease_x = HeldLease {
        chat: "chat",
        ticket: &t_x,
        token: g_x.token,
    };
    c.release(&lease_x, None).expect("x releases");
    let pushed = new_rx.recv_timeout(Duration::from_secs(20));
    assert_eq!(
        pushed.ok().as_deref(),
        Some("chat"),
        "the later run's wake-up"
    );
    c.detach_incarnation(&r, 2, &[])
        .expect("the later run detaches");
}
