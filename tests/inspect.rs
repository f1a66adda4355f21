//! The inspection API on both backends: one chat's holder, token, lease left, queue
//! and previous holder; the whole prefix's held chats, live replicas and provider
//! leaders; bounded by a limit; read-only. Ordered with channels, no sleeps.

mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::{
    Bot, Capabilities, CoordinationConfig, Coordinator, CoordinatorConfig, MemoryCoordinator,
    Message, Provider, ProviderError, Replica, Session, Status,
};
use crossbeam_channel::{Receiver, Sender, unbounded};

const WAIT: Duration = Duration::from_secs(10);

struct Exclusive(Sender<String>, String);

impl Provider for Exclusive {
    fn id(&self) -> &str {
        "tg"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exclusive_session: true,
        }
    }
    fn start(&self, session: Session) -> Result<(), ProviderError> {
        session.status().report(Status::Open);
        let _ = self.0.send(self.1.clone());
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, _: &str, _: &str) -> Result<(), ProviderError> {
        Ok(())
    }
}

fn bot(
    id: &str,
    c: Arc<dyn Coordinator>,
    leads: Sender<String>,
    started: Sender<()>,
    gate: Receiver<()>,
) -> Bot {
    Bot::builder()
        .id(id)
        .coordination(CoordinationConfig::new(CoordinatorConfig::Shared(c)))
        .provider(Arc::new(Exclusive(leads, id.to_owned())))
        .handler(move |_| {
            let _ = started.send(());
            let _ = gate.recv_timeout(WAIT);
            Ok(())
        })
        .build()
        .expect("bot")
}

fn inspection_shows_holders_queues_replicas_and_leaders(c: Arc<dyn Coordinator>, ttl: Duration) {
    let (leads_tx, leads_rx) = unbounded();
    let (started_tx, started_rx) = unbounded();
    let (gate_tx, gate_rx) = unbounded();
    let b1 = bot(
        "r1",
        c.clone(),
        leads_tx.clone(),
        started_tx.clone(),
        gate_rx.clone(),
    );
    let leader = leads_rx.recv_timeout(WAIT).expect("a leader");
    assert_eq!(leader, "r1");
    let b2 = bot("r2", c.clone(), leads_tx, started_tx, gate_rx);
    // r1 runs chat "a"'s first message and holds it; r2's message for "a" queues.
    b1.intake()
        .deliver(Message::new("a", "1").with_id("1"))
        .expect("deliver");
    started_rx.recv_timeout(WAIT).expect("handler 1 runs");
    b2.intake()
        .deliver(Message::new("a", "2").with_id("2"))
        .expect("deliver");
    let a = c.inspect_chat("a").expect("inspect a");
    assert_eq!(a.chat, "a");
    let holder = a.holder.clone().expect("held");
    assert_eq!(&*holder.ticket.replica, "r1");
    assert!(
        holder.lease_left > Duration::ZERO && holder.lease_left <= ttl,
        "{holder:?}"
    );
    assert_eq!(a.queued, 1);
    let idle = c.inspect_chat("nobody").expect("inspect idle");
    assert_eq!((idle.holder, idle.queued, idle.previous), (None, 0, None));

    // r2's leadership thread queues its standby ticket on its own schedule: wait
    // until the backend shows it (a condition on observable state, with a deadline).
    let deadline = std::time::Instant::now() + WAIT;
    let mesh = loop {
        let mesh = c.inspect(100).expect("inspect all");
        if mesh.leaders.first().is_some_and(|l| l.standbys == 1)
            || std::time::Instant::now() > deadline
        {
            break mesh;
        }
        std::thread::yield_now();
    };
    assert!(!mesh.truncated);
    assert_eq!(mesh.chats.len(), 1, "{mesh:?}");
    assert_eq!(
        mesh.chats[0].holder.as_ref().map(|h| h.token),
        Some(holder.token)
    );
    let ids: Vec<&str> = mesh.replicas.iter().map(|r| &**r).collect();
    assert_eq!(ids, ["r1", "r2"]);
    assert_eq!(mesh.leaders.len(), 1, "{mesh:?}");
    assert_eq!(mesh.leaders[0].provider, "tg");
    let lead = mesh.leaders[0].holder.as_ref().expect("led");
    assert_eq!(&*lead.ticket.replica, "r1");
    assert_eq!(Some(lead.token), b1.leader_token("tg"));
    assert_eq!(mesh.leaders[0].standbys, 1);

    // Read-only: the holder's token is unchanged, and the next grant names it as the
    // previous holder.
    gate_tx.send(()).expect("let 1 finish");
    started_rx.recv_timeout(WAIT).expect("handler 2 runs");
    let a = c.inspect_chat("a").expect("inspect a");
    let next = a.holder.expect("held by r2");
    assert_eq!(&*next.ticket.replica, "r2");
    assert!(next.token > holder.token);
    let previous = a.previous.expect("previous");
    assert_eq!((&*previous.replica, previous.token), ("r1", holder.token));
    gate_tx.send(()).expect("let 2 finish");
    b1.stop().expect("stop");
    b2.stop().expect("stop");
    // Free now: the last holder is remembered.
    let a = c.inspect_chat("a").expect("inspect a");
    assert_eq!(a.holder, None);
    assert_eq!(a.previous.map(|p| p.token), Some(next.token));
}

fn inspection_is_bounded_by_the_limit(c: Arc<dyn Coordinator>) {
    let r = Replica::start("r", c.clone()).expect("replica");
    // Idle chats first, far more than the limit: over Redis their state stays for an
    // hour or so, and the limit counts the chats shown, not the keys looked at.
    for i in 0..200 {
        r.acquire_timeout(&format!("idle{i}"), WAIT)
            .expect("acquire")
            .release()
            .expect("release");
    }
    let turns: Vec<_> = (0..5)
        .map(|i| r.acquire_timeout(&format!("c{i}"), WAIT).expect("acquire"))
        .collect();
    let mesh = c.inspect(2).expect("inspect");
    assert!(mesh.truncated);
    assert_eq!(mesh.chats.len(), 2);
    let all = c.inspect(5).expect("inspect");
    assert!(!all.truncated, "{all:?}");
    let names: Vec<&str> = all.chats.iter().map(|v| v.chat.as_str()).collect();
    assert_eq!(names, ["c0", "c1", "c2", "c3", "c4"]);
    drop(turns);
    r.shutdown();
    assert!(c.inspect(5).expect("inspect").chats.is_empty());
}

#[test]
fn memory_inspection() {
    let ttl = Duration::from_secs(10);
    let c = Arc::new(MemoryCoordinator::with_settings(
        ttl,
        Duration::from_secs(600),
    ));
    inspection_shows_holders_queues_replicas_and_leaders(c, ttl);
}

#[test]
fn memory_inspection_limit() {
    inspection_is_bounded_by_the_limit(Arc::new(MemoryCoordinator::new()));
}

#[cfg(feature = "redis")]
mod redis_backend {
    use super::*;
    use botmesh::redis::{RedisCoordinator, RedisOptions};
    use support::RedisServer;

    fn connect(server: &RedisServer, prefix: &str, ttl: Duration) -> Arc<RedisCoordinator> {
        let options = RedisOptions::new(server.url())
            .with_key_prefix(prefix)
            .with_lease_ttl(ttl);
        Arc::new(RedisCoordinator::connect(options).expect("connect"))
    }

    #[test]
    fn redis_inspection() {
        let Ok(server) = RedisServer::try_start() else {
            eprintln!("skipped: redis-server is not installed");
            return;
        };
        let ttl = Duration::from_secs(10);
        // Another prefix's keys on the same server stay out of the view.
        let other = connect(&server, "other*", ttl);
        let r = Replica::start("x", other.clone()).expect("replica");
        let t = r.acquire_timeout("a", WAIT).expect("acquire");
        inspection_shows_holders_queues_replicas_and_leaders(connect(&server, "insp", ttl), ttl);
        assert_eq!(other.inspect(10).expect("inspect").chats.len(), 1);
        drop(t);
        r.shutdown();
    }

    #[test]
    fn redis_inspection_limit() {
        let Ok(server) = RedisServer::try_start() else {
            eprintln!("skipped: redis-server is not installed");
            return;
        };
        inspection_is_bounded_by_the_limit(connect(&server, "lim", Duration::from_secs(10)));
    }
}
