//! A `Replica` stopped cleanly while one of its turns is being released (the release
//! sent, the backend not reached yet), on both backends. The stop waits for that
//! release before it detaches: releasing the turn too, without its message id, made
//! the turn's own release find its lease gone and report `lost` (found by the
//! breaker review of session 11). Events are ordered with channels; the one bounded
//! wait checks that something does not happen, so a slow host can only make the test
//! pass without proving the order, never fail.

mod support;

use std::sync::Arc;
use std::time::Duration;

use botmesh::{
    BackendError, Coordinator, EnqueueRequest, Enqueued, Grant, GrantSink, HeldLease,
    MemoryCoordinator, Released, Renewal, Replica, ReplicaId, Token, Waiting,
};
use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::Mutex;

/// A backend whose next `release` waits at the door (told on `at`, let through by
/// `go`), and which tells `detached` once a `detach` is done.
struct Door {
    inner: Arc<dyn Coordinator>,
    door: Mutex<Option<(Sender<()>, Receiver<()>)>>,
    detached: Mutex<Option<Sender<()>>>,
}

impl Coordinator for Door {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl()
    }
    fn attach(&self, replica: &ReplicaId, sink: GrantSink) -> Result<(), BackendError> {
        self.inner.attach(replica, sink)
    }
    fn detach(&self, replica: &ReplicaId, held: &[HeldLease<'_>]) -> Result<(), BackendError> {
        let out = self.inner.detach(replica, held);
        if let Some(tx) = self.detached.lock().take() {
            let _ = tx.send(());
        }
        out
    }
    fn enqueue(&self, request: &EnqueueRequest<'_>) -> Result<Enqueued, BackendError> {
        self.inner.enqueue(request)
    }
    fn cancel(&self, waiting: &Waiting<'_>) -> Result<Option<Grant>, BackendError> {
        self.inner.cancel(waiting)
    }
    fn release(
        &self,
        lease: &HeldLease<'_>,
        handled: Option<&str>,
    ) -> Result<Released, BackendError> {
        let door = self.door.lock().take();
        if let Some((at, go)) = door {
            let _ = at.send(());
            let _ = go.recv();
        }
        self.inner.release(lease, handled)
    }
    fn renew(
        &self,
        replica: &ReplicaId,
        held: &[HeldLease<'_>],
        waiting: &[Waiting<'_>],
    ) -> Result<Renewal, BackendError> {
        self.inner.renew(replica, held, waiting)
    }
    fn write_checkpoint(
        &self,
        chat: &str,
        token: Token,
        data: Option<&str>,
    ) -> Result<bool, BackendError> {
        self.inner.write_checkpoint(chat, token, data)
    }
    fn read_checkpoint(&self, chat: &str) -> Result<Option<(Token, String)>, BackendError> {
        self.inner.read_checkpoint(chat)
    }
}

/// The turn's release reaches the door and the replica's stop starts: no detach may
/// come while the release waits there; once it goes on, it succeeds, and the stop
/// ends.
fn a_release_in_flight_at_the_stop_succeeds(inner: Arc<dyn Coordinator>) {
    let backend = Arc::new(Door {
        inner,
        door: Mutex::new(None),
        detached: Mutex::new(None),
    });
    let replica = Replica::start("r", backend.clone()).expect("start");
    let turn = replica.acquire("chat").expect("acquire");
    let (at_tx, at_rx) = unbounded();
    let (go_tx, go_rx) = unbounded();
    let (detached_tx, detached_rx) = unbounded();
    *backend.door.lock() = Some((at_tx, go_rx));
    *backend.detached.lock() = Some(detached_tx);
    let releasing = std::thread::spawn(move || turn.release());
    at_rx.recv().expect("the release is on its way");
    let stopping = std::thread::spawn(move || replica.shutdown());
    assert!(
        detached_rx
            .recv_timeout(Duration::from_millis(300))
            .is_err(),
        "the stop detached while a release was on its way"
    );
    go_tx.send(()).expect("let the release through");
    let released = releasing.join().expect("the release thread");
    detached_rx.recv().expect("the stop detached");
    stopping.join().expect("the stop thread");
    assert!(
        released.is_ok(),
        "a release sent before the stop: {released:?}"
    );
}

#[test]
fn a_release_in_flight_when_the_replica_stops_is_not_lost_in_memory() {
    a_release_in_flight_at_the_stop_succeeds(Arc::new(MemoryCoordinator::new()));
}

#[cfg(feature = "redis")]
#[test]
fn a_release_in_flight_when_the_replica_stops_is_not_lost_on_redis() {
    use botmesh::redis::{RedisCoordinator, RedisOptions};
    let server = support::redis_server::RedisServer::start();
    let options = RedisOptions::new(server.url()).with_lease_ttl(Duration::from_secs(10));
    let redis = RedisCoordinator::connect(options).expect("connect");
    a_release_in_flight_at_the_stop_succeeds(Arc::new(redis));
}
