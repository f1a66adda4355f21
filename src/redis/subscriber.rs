//! The wake-up listener of one replica: one connection subscribed to the replica's
//! wake channel, handing pushed grants to the replica's sink.
//!
//! # Why a plain `SUBSCRIBE` works in cluster mode
//!
//! The scripts `PUBLISH` a grant on the chat's primary. In Redis Cluster a plain
//! (not sharded) `PUBLISH` is sent over the cluster bus to every node, primaries and
//! replicas, so one subscriber connection per replica on any node hears every
//! grant, whatever slot its chat is in. When that node fails, the listener moves to
//! the next one (primaries first, then replicas, starting at a place that depends on
//! the replica so that replicas spread over the nodes) and reads the map again.
//! Grants published while no connection was subscribed are not lost for good: the
//! renewal thread's re-check (every TTL/6 while anything waits) finds them. The
//! price: every wake-up is a bus message to every node. Sharded pub/sub
//! (`SSUBSCRIBE`) would keep a wake-up on one shard, but needs a channel in the
//! chat's slot and so one subscription per slot owner per replica; not done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Deserialize;

use super::keys::parse_grant;
use super::target::Target;
use crate::coordinator::{BackendError, Grant, GrantSink};

/// A wake-up as an older version of the library published it (JSON), still read so
/// that a rolling deploy loses no push between versions.
#[derive(Deserialize)]
struct JsonWake {
    c: String,
    t: String,
    k: String,
    pr: String,
    pk: String,
}

/// A pushed grant: the chat and the grant. The library publishes
/// `ticket NUL token NUL previous replica NUL previous token NUL chat` (no replica id
/// holds a NUL, tokens are digits, and the chat, last, may hold anything); a payload
/// opening with `{` is the JSON of older versions.
fn parse_wake(payload: &[u8]) -> Result<(String, Grant), BackendError> {
    if payload.first() == Some(&b'{') {
        let w: JsonWake = serde_json::from_slice(payload)
            .map_err(|e| BackendError::new(format!("wake-up JSON: {e}")))?;
        return Ok((w.c, parse_grant(&w.t, &w.k, &w.pr, &w.pk)?));
    }
    let text =
        std::str::from_utf8(payload).map_err(|_| BackendError::new("wake-up is not UTF-8"))?;
    let mut parts = text.splitn(5, '\0');
    let mut next = || {
        parts
            .next()
            .ok_or_else(|| BackendError::new("short wake-up"))
    };
    let (t, k, pr, pk, chat) = (next()?, next()?, next()?, next()?, next()?);
    Ok((chat.to_owned(), parse_grant(t, k, pr, pk)?))
}

/// Where the listener starts among the nodes: a hash of the replica id, so replicas
/// spread over a cluster's nodes.
pub(super) fn start_for(replica: &str) -> usize {
    replica.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    })
}

/// What a listener needs.
pub(super) struct Listen {
    pub(super) target: Arc<Target>,
    pub(super) start: usize,
    pub(super) channel: String,
    pub(super) sink: GrantSink,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) ready: crossbeam_channel::Sender<()>,
}

/// Receives grants from the wake channel until `stop`; reconnects (to the next node
/// in cluster mode, to the current primary under Sentinel) with a back-off when the
/// connection drops.
pub(super) fn subscriber_loop(l: Listen) {
    let timeout = l.target.timeout();
    let mut backoff = Duration::from_millis(50);
    let mut turn = l.start;
    let mut failed = false;
    while !l.stop.load(Ordering::Acquire) {
        if failed {
            // A retry back-off, not synchronisation.
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
            turn = turn.wrapping_add(1);
            l.target.refresh_now();
        }
        failed = true;
        let Some(node) = l.target.listen_candidates(turn).into_iter().next() else {
            continue;
        };
        let mut con = match node.client().get_connection_with_timeout(timeout) {
            Ok(c) => c,
            Err(e) => {
                log::warn!(target: "botmesh::redis", "subscriber cannot connect to {}: {e}", node.addr);
                continue;
            }
        };
        // Bounded before the first read: `SUBSCRIBE` waits for its confirmation, and on
        // a link that drops packets (not one that refuses) an unbounded read would
        // stop wake-ups and keep a stop request waiting for the thread forever.
        if con.set_read_timeout(Some(timeout)).is_err()
            || con.set_write_timeout(Some(timeout)).is_err()
        {
            continue;
        }
        let mut pubsub = con.as_pubsub();
        if let Err(e) = pubsub.subscribe(&l.channel) {
            log::warn!(target: "botmesh::redis", "subscribe at {} failed: {e}", node.addr);
            continue;
        }
        // Short reads, so a stop request is seen quickly.
        if pubsub
            .set_read_timeout(Some(Duration::from_millis(200)))
            .is_err()
        {
            continue;
        }
        backoff = Duration::from_millis(50);
        let _ = l.ready.try_send(());
        while !l.stop.load(Ordering::Acquire) {
            match pubsub.get_message() {
                Ok(msg) => match parse_wake(msg.get_payload_bytes()) {
                    Ok((chat, grant)) => (l.sink)(&chat, grant),
                    Err(e) => log::warn!(target: "botmesh::redis", "bad wake-up: {e}"),
                },
                Err(e) if e.is_timeout() => {}
                Err(e) => {
                    log::warn!(target: "botmesh::redis", "subscriber connection to {} lost, reconnecting: {e}", node.addr);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_wake;

    #[test]
    fn compact_and_json_wake_ups_parse_alike() {
        let compact =
            parse_wake(b"7:r1\x001700000000000001\x00r2\x001700000000000000\x00a,b:{c}\x00d")
                .expect("compact");
        let json = parse_wake(
            br#"{"c":"a,b:{c}\u0000d","t":"7:r1","k":"1700000000000001","pr":"r2","pk":"1700000000000000"}"#,
        )
        .expect("json");
        assert_eq!(compact.0, "a,b:{c}\0d");
        assert_eq!(json.0, compact.0);
        assert_eq!(format!("{:?}", compact.1), format!("{:?}", json.1));
        assert_eq!(compact.1.token, 1_700_000_000_000_001);
        let first = parse_wake(b"7:r1\x0012\x00\x00\x00chat").expect("no previous");
        assert!(first.1.previous.is_none());
    }

    #[test]
    fn malformed_wake_ups_are_errors() {
        for bad in [
            &b"7:r1\x0012"[..],
            b"7:r1\x00x\x00\x00\x00c",
            b"\xff\x00",
            b"{\"c\":1}",
        ] {
            assert!(parse_wake(bad).is_err(), "{bad:?}");
        }
    }
}
