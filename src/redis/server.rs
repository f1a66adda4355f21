//! Checks of the Redis server's own settings, made once at connect.

use redis::Connection;

/// Warns when the server may evict keys under memory pressure: every key botmesh
/// writes has a TTL, so any policy but `noeviction` may drop a live lease, a queue or
/// a chat's last token, which breaks exclusion, FIFO and fencing without an error.
/// A server that refuses `CONFIG GET` (managed services often do) is not judged.
pub(super) fn warn_on_eviction(server: &str, con: &mut Connection) {
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query(con);
    if let Ok(pair) = reply
        && let Some(policy) = pair.get(1)
        && policy != "noeviction"
    {
        log::warn!(target: "botmesh::redis", "redis at {server} has maxmemory-policy {policy:?}: it may evict botmesh's leases and queues under memory pressure, breaking exclusion and order; set it to noeviction");
    }
}
