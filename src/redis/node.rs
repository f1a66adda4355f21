//! One Redis server with its pool of idle connections, the slot map of a cluster
//! (who serves which hash slot), and the hash slot of a key.

use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Client, Connection, ErrorKind, RedisError, RedisResult, Value};

use crate::coordinator::BackendError;

/// Idle pooled connections kept at most per node.
const POOL_MAX: usize = 64;

/// Hash slots of Redis Cluster.
pub(super) const SLOTS: usize = 16384;

/// The hash slot of a key: CRC16 (XMODEM) of its hash tag (the part inside the first
/// `{…}`, when not empty) or of the whole key, modulo 16384 (the Redis Cluster
/// specification's `HASH_SLOT`).
pub(super) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let hashed = tagged.unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS as u16
}

/// Whether an error leaves the connection unusable (the replies after it are lost).
pub(super) fn is_transient(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error()
}

/// Reads `n` replies of a pipeline. After an error that breaks the connection the
/// remaining replies are that error's kind of loss, not read; `false` then, and the
/// connection must not be reused.
pub(super) fn read_replies(con: &mut Connection, n: usize) -> (Vec<RedisResult<Value>>, bool) {
    let mut out = Vec::with_capacity(n);
    let mut usable = true;
    for _ in 0..n {
        if !usable {
            out.push(Err(lost_earlier()));
            continue;
        }
        let reply = con.recv_response();
        if let Err(e) = &reply
            && is_transient(e)
        {
            usable = false;
        }
        out.push(reply);
    }
    (out, usable)
}

fn lost_earlier() -> RedisError {
    RedisError::from((ErrorKind::Io, "connection lost earlier in the pipeline"))
}

/// One Redis server, with its pool of idle connections.
pub(super) struct Node {
    /// `host:port`, for error messages and to find the node again after a refresh.
    pub(super) addr: String,
    pub(super) client: Client,
    pub(super) pool: Mutex<Vec<Connection>>,
    /// Pipelines of this process's threads to this node, sent together.
    pub(super) batch: Combiner,
}

/// Group commit of the pipelines that several threads have for one node: while one
/// batch is on the wire the others queue, and the next thread to send takes every
/// queued pipeline as one write and reads all their replies. Most of what a turn call
/// costs the server is the kernel's (a read event, a send, a wake-up per call), so a
/// batch of k calls costs about one call's system overhead instead of k. Nothing
/// waits for a batch to fill: a thread that finds no batch in flight sends at once,
/// so an uncontended call costs what it did.
///
/// Each caller is woken by the one event that concerns it: its batch's end (its
/// replies are in), being queued first when a batch ends (it sends the next one), or
/// its call going out alone after a broken batch. A wake-up of every waiting thread
/// at each batch's end woke the callers queued for the next batch too, all but one of
/// which went back to sleep: W2 (4 × 4 workers) counted 0.8 such wake-ups, each a
/// context switch, per message.
#[derive(Default)]
pub(super) struct Combiner {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    /// Queued calls, in arrival order (their pipelines go in this order).
    waiting: Vec<Arc<Call>>,
    /// Calls that were queued behind a batch that broke: each goes out alone, on a
    /// connection of its own, once its thread wakes.
    alone: Vec<Arc<Call>>,
    /// A batch is on the wire: whoever queues now waits for it to end.
    sending: bool,
}

/// One thread's pipeline in a batch.
struct Call {
    packed: Vec<u8>,
    /// How many replies the pipeline has: the sender reads this many for it.
    replies: usize,
    /// The write's failure, or the replies; filled by the batch's sender.
    outcome: Mutex<Option<Outcome>>,
    /// The calling thread, parked while it waits: unparked when its call has its
    /// outcome, is first in the queue as a batch ends, or is to go out alone.
    caller: Thread,
}

/// A pipeline's fate: not written (the connection or the write failed), or its replies.
pub(super) type Outcome = Result<Vec<RedisResult<Value>>, RedisError>;

/// The end of a batch, also if its sender unwinds: every call has an outcome and
/// the queue is open again, so no caller waits for a batch that will never end.
struct Sending<'a> {
    combiner: &'a Combiner,
    calls: &'a [Arc<Call>],
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        for c in self.calls {
            let mut outcome = c.outcome.lock();
            if outcome.is_none() {
                *outcome = Some(Err(lost_earlier()));
            }
        }
        // Woken once the queue is open again, so the next sender finds it open.
        let (next, alone) = {
            let mut q = self.combiner.queue.lock();
            q.sending = false;
            let next = q.waiting.first().map(|c| c.caller.clone());
            let alone: Vec<Thread> = q.alone.iter().map(|c| c.caller.clone()).collect();
            (next, alone)
        };
        let me = std::thread::current().id();
        for c in self.calls {
            if c.caller.id() != me {
                c.caller.unpark();
            }
        }
        next.into_iter().chain(alone).for_each(|t| t.unpark());
    }
}

impl Combiner {
    /// Queues a pipeline and waits for its outcome; when no batch is in flight, this
    /// thread is the sender: `send` gets every queued call (this one included), must
    /// fill each one's outcome, and says whether the connection held.
    ///
    /// When it broke, each call queued meanwhile is sent alone, by its own thread, on
    /// a connection of its own (`send` with that call only), instead of failing
    /// unsent or waiting for the next batch: a caller waits for at most one batch
    /// and then its own exchange, so a round takes at most about two command
    /// timeouts (the bound the lease TTL is checked against, see
    /// [`Target`](super::target)), and every round is an attempt of the call's own.
    /// (Failing them unsent spent their retry rounds without sending anything: in a
    /// server restart they all ran out within a few ms, and refused far more.)
    fn run(&self, packed: Vec<u8>, replies: usize, send: impl Fn(&[Arc<Call>]) -> bool) -> Outcome {
        let call = Arc::new(Call {
            packed,
            replies,
            outcome: Mutex::new(None),
            caller: std::thread::current(),
        });
        let mut q = self.queue.lock();
        q.waiting.push(call.clone());
        while q.sending {
            drop(q);
            // An unpark between the unlock and here makes this return at once; a
            // spurious return finds nothing and parks again.
            std::thread::park();
            q = self.queue.lock();
            if let Some(outcome) = call.outcome.lock().take() {
                return outcome;
            }
            if let Some(i) = q.alone.iter().position(|c| Arc::ptr_eq(c, &call)) {
                q.alone.swap_remove(i);
                drop(q);
                // Outside the queue: the batches of the others go on meanwhile.
                send(std::slice::from_ref(&call));
                return call
                    .outcome
                    .lock()
                    .take()
                    .unwrap_or_else(|| Err(lost_earlier()));
            }
        }
        // This thread sends the batch: its own call and every one queued meanwhile.
        let calls = std::mem::take(&mut q.waiting);
        q.sending = true;
        drop(q);
        let sending = Sending {
            combiner: self,
            calls: &calls,
        };
        if !send(sending.calls) {
            let mut q = self.queue.lock();
            let queued = std::mem::take(&mut q.waiting);
            q.alone.extend(queued);
        }
        drop(sending);
        call.outcome
            .lock()
            .take()
            .unwrap_or_else(|| Err(lost_earlier()))
    }
}

impl Node {
    /// Sends `packed` (a pipeline of `replies` commands) to this node, in one batch
    /// with whatever other threads send at the same time, and returns its replies in
    /// order. `Err` when the pipeline was not written (no connection, or the write
    /// failed: the pool is dropped); a connection that breaks while the replies are
    /// read fails the replies from there on (see [`read_replies`]).
    pub(super) fn exchange(
        &self,
        packed: Vec<u8>,
        replies: usize,
        connect: Duration,
        io: Duration,
    ) -> Outcome {
        self.batch
            .run(packed, replies, |calls| self.send_batch(calls, connect, io))
    }

    /// Writes the calls' pipelines as one, reads every reply, and gives each call its
    /// own; every call gets an outcome.
    fn send_batch(&self, calls: &[Arc<Call>], connect: Duration, io: Duration) -> bool {
        let written = self.take(connect, io).and_then(|mut con| {
            if let [one] = calls {
                con.send_packed_command(&one.packed)?;
            } else {
                let mut all = Vec::with_capacity(calls.iter().map(|c| c.packed.len()).sum());
                for c in calls {
                    all.extend_from_slice(&c.packed);
                }
                con.send_packed_command(&all)?;
            }
            Ok(con)
        });
        let mut con = match written {
            Ok(con) => con,
            Err(e) => {
                self.clear();
                for c in calls {
                    *c.outcome.lock() = Some(Err(e.clone()));
                }
                return false;
            }
        };
        let mut usable = true;
        for c in calls {
            let replies = if usable {
                let (replies, ok) = read_replies(&mut con, c.replies);
                usable = ok;
                replies
            } else {
                (0..c.replies).map(|_| Err(lost_earlier())).collect()
            };
            *c.outcome.lock() = Some(Ok(replies));
        }
        if usable {
            self.give(con);
        } else {
            self.clear();
        }
        usable
    }

    /// A pooled connection, or a new one: `connect` bounds the connection (and TLS
    /// handshake), `io` every read and write on it.
    pub(super) fn take(&self, connect: Duration, io: Duration) -> RedisResult<Connection> {
        if let Some(con) = self.pool.lock().pop() {
            return Ok(con);
        }
        let con = self.client.get_connection_with_timeout(connect)?;
        con.set_read_timeout(Some(io))?;
        con.set_write_timeout(Some(io))?;
        Ok(con)
    }

    pub(super) fn give(&self, con: Connection) {
        let mut pool = self.pool.lock();
        if pool.len() < POOL_MAX {
            pool.push(con);
        }
    }

    /// Drops every idle connection: when one broke, the others may have too (the
    /// server restarted or died).
    pub(super) fn clear(&self) {
        self.pool.lock().clear();
    }

    /// The client, for a subscriber's own connection.
    pub(super) fn client(&self) -> &Client {
        &self.client
    }
}

/// The slot map: who serves what.
pub(super) struct Map {
    /// Bumped by every refresh, so threads that saw the same failure refresh once.
    pub(super) generation: u64,
    /// Per hash slot, the index of its primary in `primaries` (`u16::MAX`: no
    /// owner known); empty outside cluster mode, where `primaries[0]` serves all.
    pub(super) slots: Vec<u16>,
    pub(super) primaries: Vec<Arc<Node>>,
    /// Replicas, where a subscriber may listen (published messages reach every node
    /// of a cluster).
    pub(super) replicas: Vec<Arc<Node>>,
}

impl Map {
    pub(super) fn owner(&self, slot: u16) -> Option<&Arc<Node>> {
        if self.slots.is_empty() {
            return self.primaries.first();
        }
        let i = *self.slots.get(usize::from(slot))?;
        self.primaries.get(usize::from(i))
    }
}

/// A map from a `CLUSTER SLOTS` reply: `[start, end, [host, port, id…], replicas…]`
/// per range. An empty host means the node that answered.
/// Finds or makes the node at a host and port.
pub(super) type NodeFor<'a> = dyn Fn(&str, u16) -> Result<Arc<Node>, BackendError> + 'a;

pub(super) fn parse_slots(
    asked: &Node,
    v: Value,
    node_for: &NodeFor<'_>,
) -> Result<Map, BackendError> {
    let bad = || {
        BackendError::new(format!(
            "redis at {}: unexpected CLUSTER SLOTS reply",
            asked.addr
        ))
    };
    let Value::Array(ranges) = v else {
        return Err(bad());
    };
    let asked_host = asked
        .addr
        .rsplit_once(':')
        .map_or("", |(h, _)| h)
        .to_owned();
    let endpoint = |v: &Value| -> Option<(String, u16)> {
        let Value::Array(parts) = v else { return None };
        let host = match parts.first()? {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.clone()
        } else {
            host
        };
        let port = match parts.get(1)? {
            Value::Int(p) => u16::try_from(*p).ok()?,
            _ => return None,
        };
        Some((host, port))
    };
    let mut slots = vec![u16::MAX; SLOTS];
    let mut primaries: Vec<Arc<Node>> = Vec::new();
    let mut replicas: Vec<Arc<Node>> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad());
        };
        let (Some(Value::Int(start)), Some(Value::Int(end))) = (parts.first(), parts.get(1)) else {
            return Err(bad());
        };
        let (host, port) = parts.get(2).and_then(endpoint).ok_or_else(bad)?;
        let node = node_for(&host, port)?;
        let index = match primaries.iter().position(|n| n.addr == node.addr) {
            Some(i) => i,
            None => {
                primaries.push(node);
                primaries.len() - 1
            }
        };
        let index = u16::try_from(index).map_err(|_| bad())?;
        for s in (*start).max(0)..=(*end).min(SLOTS as i64 - 1) {
            slots[s as usize] = index;
        }
        for r in parts.iter().skip(3).filter_map(endpoint) {
            let node = node_for(&r.0, r.1)?;
            if !replicas.iter().any(|n| n.addr == node.addr) {
                replicas.push(node);
            }
        }
    }
    if primaries.is_empty() {
        return Err(BackendError::new(format!(
            "redis at {}: the cluster serves no slot yet (CLUSTER SLOTS is empty)",
            asked.addr
        )));
    }
    Ok(Map {
        generation: 0,
        slots,
        primaries,
        replicas,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A sender that answers each call with its pipeline's first byte, and tells
    /// which calls it sent together.
    fn answer(calls: &[Arc<Call>], batches: &mpsc::Sender<Vec<u8>>) -> bool {
        let firsts: Vec<u8> = calls.iter().map(|c| c.packed[0]).collect();
        for c in calls {
            *c.outcome.lock() = Some(Ok(vec![Ok(Value::Int(i64::from(c.packed[0])))]));
        }
        let _ = batches.send(firsts);
        true
    }

    fn queued(c: &Combiner) -> usize {
        c.queue.lock().waiting.len()
    }

    #[test]
    fn calls_queued_behind_a_batch_go_out_together_and_get_their_own_replies() {
        let combiner = Arc::new(Combiner::default());
        let (batches, sent) = mpsc::channel();
        let (hold, held) = mpsc::channel::<()>();
        let (entered, sending) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let first = {
                let (c, b) = (combiner.clone(), batches.clone());
                s.spawn(move || {
                    c.run(vec![1], 1, |calls| {
                        let _ = entered.send(());
                        // The wire is busy until the test lets it go.
                        let _ = held.recv();
                        answer(calls, &b)
                    })
                })
            };
            // The first call is on the wire: the next ones queue.
            sending.recv().expect("test step");
            let others: Vec<_> = [2u8, 3, 4]
                .into_iter()
                .map(|k| {
                    let (c, b) = (combiner.clone(), batches.clone());
                    s.spawn(move || c.run(vec![k], 1, |calls| answer(calls, &b)))
                })
                .collect();
            while queued(&combiner) < 3 {
                std::thread::yield_now();
            }
            hold.send(()).expect("test step");
            let got = |h: std::thread::ScopedJoinHandle<'_, Outcome>| {
                let replies = h.join().expect("test step").expect("test step");
                match replies.as_slice() {
                    [Ok(Value::Int(k))] => *k,
                    other => panic!("unexpected replies {other:?}"),
                }
            };
            assert_eq!(got(first), 1);
            for (h, k) in others.into_iter().zip([2, 3, 4]) {
                assert_eq!(got(h), k, "a call got another call's reply");
            }
        });
        drop(batches);
        let batches: Vec<Vec<u8>> = sent.iter().collect();
        // The three queued calls went out as one batch, in the order they queued.
        assert_eq!(batches.len(), 2, "batches: {batches:?}");
        assert_eq!(batches[0], vec![1]);
        let mut second = batches[1].clone();
        second.sort_unstable();
        assert_eq!(second, vec![2, 3, 4]);
    }

    #[test]
    fn calls_queued_behind_a_broken_batch_go_out_alone_without_holding_up_the_queue() {
        let combiner = Arc::new(Combiner::default());
        let (hold, held) = mpsc::channel::<()>();
        let (entered, sending) = mpsc::channel::<()>();
        let (hold_alone, held_alone) = mpsc::channel::<()>();
        let held_alone = Mutex::new(held_alone);
        let (alone_entered, alone_sending) = mpsc::channel::<Vec<u8>>();
        let (batches, sent) = mpsc::channel::<Vec<u8>>();
        std::thread::scope(|s| {
            let first = {
                let c = combiner.clone();
                s.spawn(move || {
                    c.run(vec![1], 1, |calls| {
                        let _ = entered.send(());
                        let _ = held.recv();
                        for c in calls {
                            *c.outcome.lock() = Some(Err(lost_earlier()));
                        }
                        false
                    })
                })
            };
            sending.recv().expect("test step");
            let queued_calls: Vec<_> = [2u8, 3]
                .into_iter()
                .map(|k| {
                    let (c, b, e, h) = (
                        combiner.clone(),
                        batches.clone(),
                        alone_entered.clone(),
                        &held_alone,
                    );
                    s.spawn(move || {
                        c.run(vec![k], 1, |calls| {
                            let firsts: Vec<u8> = calls.iter().map(|c| c.packed[0]).collect();
                            let _ = e.send(firsts);
                            // Each alone exchange stays on the wire until the test
                            // lets it go.
                            let _ = h.lock().recv();
                            answer(calls, &b)
                        })
                    })
                })
                .collect();
            // The calls' threads hold the only senders: a call that ended without
            // going out alone ends the wait below with an error, not a hang.
            drop(alone_entered);
            while queued(&combiner) < 2 {
                std::thread::yield_now();
            }
            hold.send(()).expect("test step");
            assert!(first.join().expect("test step").is_err());
            // Both queued calls went out, each alone, not failed unsent.
            let mut alone: Vec<Vec<u8>> = (0..2)
                .map(|_| alone_sending.recv().expect("test step"))
                .collect();
            alone.sort_unstable();
            assert_eq!(alone, vec![vec![2], vec![3]]);
            // While they are on the wire the queue is open: a new call is sent at once.
            let next = combiner.run(vec![4], 1, |calls| answer(calls, &batches));
            assert!(matches!(
                next.expect("test step").as_slice(),
                [Ok(Value::Int(4))]
            ));
            hold_alone.send(()).expect("test step");
            hold_alone.send(()).expect("test step");
            for (h, k) in queued_calls.into_iter().zip([2, 3]) {
                let replies = h.join().expect("test step").expect("test step");
                assert!(
                    matches!(replies.as_slice(), [Ok(Value::Int(got))] if *got == k),
                    "call {k} got {replies:?}"
                );
            }
        });
        drop(batches);
        let mut batches: Vec<Vec<u8>> = sent.iter().collect();
        batches.sort_unstable();
        assert_eq!(batches, vec![vec![2], vec![3], vec![4]]);
    }

    #[test]
    fn a_sender_that_fails_every_call_ends_each_with_an_error_and_frees_the_queue() {
        let combiner = Combiner::default();
        // A sender that fills nothing: each call still ends, with the loss error.
        let outcome = combiner.run(vec![1], 1, |_| true);
        assert!(outcome.is_err(), "{outcome:?}");
        // The queue is open for the next call.
        let next = combiner.run(vec![7], 1, |calls| {
            *calls[0].outcome.lock() = Some(Ok(vec![Ok(Value::Int(7))]));
            true
        });
        assert!(matches!(
            next.expect("test step").as_slice(),
            [Ok(Value::Int(7))]
        ));
    }

    #[test]
    fn slots_follow_the_cluster_specification() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        assert_eq!(slot_of(b"p:{chat-1}:h"), slot_of(b"p:{chat-1}:m:msg{9}"));
    }
}
