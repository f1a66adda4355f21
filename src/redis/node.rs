//! One Redis server with its pool of idle connections, the slot map of a cluster
//! (who serves which hash slot), and the hash slot of a key.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Client, Connection, RedisResult, Value};

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

/// One Redis server, with its pool of idle connections.
pub(super) struct Node {
    /// `host:port`, for error messages and to find the node again after a refresh.
    pub(super) addr: String,
    pub(super) client: Client,
    pub(super) pool: Mutex<Vec<Connection>>,
}

impl Node {
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
