//! Read-only inspection for operators: plain reads (`HMGET`, `LLEN`, `TIME`), `SCAN`
//! with `COUNT` over the key prefix, and `PUBSUB CHANNELS` for the live replicas. No
//! script runs, so nothing is taken, extended, broken or moved on.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, Value};

use super::keys::{ChatKeys, parse_ticket};
use super::target::Target;
use crate::coordinator::{
    BackendError, ChatView, HISTORY, HolderView, LeaderView, LeaseName, MeshView, Previous,
    ReplicaId, lease_name, stored_name,
};

/// Keys `SCAN` looks at per call: enough to move fast, small enough that one call
/// never blocks the server for long.
const SCAN_COUNT: usize = 1000;

/// `pattern` with the glob characters of `s` escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The stored chat name in a key `P:{enc}:<suffix>`, when the suffix is `want`.
fn chat_of(prefix: &str, key: &str, want: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let close = rest.find('}')?;
    if &rest[close + 1..] != want {
        return None;
    }
    let enc = &rest[..close];
    let mut out = String::with_capacity(enc.len());
    let mut i = 0;
    while i < enc.len() {
        let tail = &enc[i..];
        let (c, n) = if tail.starts_with("%25") {
            ('%', 3)
        } else if tail.starts_with("%7B") {
            ('{', 3)
        } else if tail.starts_with("%7D") {
            ('}', 3)
        } else {
            let c = tail.chars().next()?;
            (c, c.len_utf8())
        };
        out.push(c);
        i += n;
    }
    Some(out)
}

/// What the reads of one chat answered: fields `h` ("token,lease end µs,queue
/// length,marks,ticket": the holder, or once free the last holder) and `p` ("token,replica"
/// of the previous holder) of its state hash, its queue's length (the tickets of field
/// `q` and of list `q`), and the server's time (µs).
struct Read {
    fields: [Option<String>; 2],
    queued: usize,
    now_us: u64,
}

fn view_of(chat: &str, r: Read) -> ChatView {
    let [h, p] = r.fields;
    let mut parts = h.as_deref().unwrap_or("").splitn(5, ',');
    let (k, u) = (parts.next(), parts.next());
    let t = parts.nth(2);
    let (pk, pr) = p
        .as_deref()
        .and_then(|p| p.split_once(','))
        .map_or((None, None), |(k, r)| (Some(k), Some(r)));
    let ticket = t.and_then(parse_ticket);
    let token: Option<u64> = k.and_then(|k| k.parse().ok());
    let until: u64 = u.and_then(|u| u.parse().ok()).unwrap_or(0);
    let holder = match (&ticket, token) {
        (Some(ticket), Some(token)) if until >= r.now_us => Some(HolderView {
            ticket: ticket.clone(),
            token,
            lease_left: Duration::from_micros(until - r.now_us),
        }),
        _ => None,
    };
    let previous = match &holder {
        Some(_) => match (pr, pk.and_then(|k| k.parse().ok())) {
            (Some(replica), Some(token)) if !replica.is_empty() => Some(Previous {
                replica: Arc::from(replica),
                token,
            }),
            _ => None,
        },
        // Free: the last holder, while the backend remembers it (a token is its
        // grant's time in µs, or just above).
        None => match (&ticket, token) {
            (Some(ticket), Some(token))
                if r.now_us.saturating_sub(token) <= HISTORY.as_micros() as u64 =>
            {
                Some(Previous {
                    replica: ticket.replica.clone(),
                    token,
                })
            }
            _ => None,
        },
    };
    ChatView {
        chat: chat.to_owned(),
        holder,
        queued: r.queued,
        previous,
    }
}

/// What an inspection needs from the coordinator: its prefixes and a connection.
pub(super) trait Reads {
    /// The key prefix.
    fn prefix(&self) -> &str;
    /// The prefix of the replicas' wake channels.
    fn wake_prefix(&self) -> String;
    /// Runs `f` on a pooled connection (with the coordinator's retry).
    /// Where commands go (one server, or every node of a cluster).
    fn target(&self) -> &Target;
}

fn typed<T: FromRedisValue>(v: Value) -> Result<T, BackendError> {
    redis::from_redis_value(v).map_err(|e| BackendError::new(format!("unexpected reply: {e}")))
}

/// Reads the given stored chats in one pipeline (2 reads each, and the time).
fn read_chats(r: &impl Reads, stored: &[String]) -> Result<Vec<Read>, BackendError> {
    if stored.is_empty() {
        return Ok(Vec::new());
    }
    // Per chat, on its own node (one pipeline per node): that node's time, the state's
    // holder fields and queue head, and the queue tail's length.
    let mut cmds: Vec<(u16, Cmd)> = Vec::with_capacity(stored.len() * 3);
    for name in stored {
        let keys = ChatKeys::new(r.prefix(), name);
        let slot = keys.slot();
        cmds.push((slot, redis::cmd("TIME")));
        cmds.push((
            slot,
            redis::cmd("HMGET")
                .arg(keys.key("s"))
                .arg(&["h", "p", "q"])
                .clone(),
        ));
        cmds.push((slot, redis::cmd("LLEN").arg(keys.key("q")).clone()));
    }
    let refs: Vec<(u16, &Cmd)> = cmds.iter().map(|(s, c)| (*s, c)).collect();
    let replies = r
        .target()
        .run(&refs)
        .into_iter()
        .collect::<Result<Vec<Value>, BackendError>>()?;
    let mut it = replies.into_iter();
    let mut out = Vec::with_capacity(stored.len());
    while let (Some(t), Some(h), Some(tail)) = (it.next(), it.next(), it.next()) {
        let (secs, micros): (u64, u64) = typed(t)?;
        let now_us = secs * 1_000_000 + micros;
        let fields: Vec<Option<String>> = typed(h)?;
        let [h, p, q]: [Option<String>; 3] = fields
            .try_into()
            .map_err(|_| BackendError::new("short HMGET reply from Redis"))?;
        // Each ticket of the head stands between NULs: "\0t1\0t2\0".
        let head = q.map_or(0, |q| q.matches('\0').count().saturating_sub(1));
        let tail: usize = typed(tail)?;
        let queued = head + tail;
        out.push(Read {
            fields: [h, p],
            queued,
            now_us,
        });
    }
    Ok(out)
}

/// The most `SCAN` calls one scan makes (with `SCAN_COUNT`, 100,000 keys looked at):
/// on a big keyspace whose keys are mostly not ours, `--limit` alone would not bound
/// the walk.
const SCAN_CALLS: usize = 100;

/// `SCAN … MATCH pattern COUNT n` on every primary: hands each call's new names to
/// `batch` (which answers whether it has enough) until the end, until `batch` has
/// enough, or after [`SCAN_CALLS`] calls in all; returns whether it stopped early.
fn scan_chats(
    r: &impl Reads,
    pattern: &str,
    suffixes: &[&str],
    batch: &mut dyn FnMut(Vec<String>) -> Result<bool, BackendError>,
) -> Result<bool, BackendError> {
    let prefix = r.prefix();
    let mut seen = BTreeSet::new();
    let mut calls = 0;
    for node in r.target().primaries() {
        let mut cursor: u64 = 0;
        loop {
            if calls == SCAN_CALLS {
                return Ok(true);
            }
            calls += 1;
            // Raw bytes: a key under the prefix that is not UTF-8 (not botmesh's) is
            // skipped rather than failing the whole view.
            let (next, keys): (u64, Vec<Vec<u8>>) =
                typed(r.target().on_node(&node, &mut |con| {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(SCAN_COUNT)
                        .query(con)
                })?)?;
            let mut fresh = Vec::new();
            for key in keys.into_iter().filter_map(|k| String::from_utf8(k).ok()) {
                if let Some(name) = suffixes.iter().find_map(|s| chat_of(prefix, &key, s))
                    && seen.insert(name.clone())
                {
                    fresh.push(name);
                }
            }
            if !fresh.is_empty() && batch(fresh)? {
                return Ok(true);
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(false)
}

pub(super) fn inspect_chat(r: &impl Reads, chat: &str) -> Result<ChatView, BackendError> {
    let stored = stored_name(chat).into_owned();
    let mut reads = read_chats(r, std::slice::from_ref(&stored))?;
    let read = reads
        .pop()
        .ok_or_else(|| BackendError::new("short pipeline reply from Redis"))?;
    Ok(view_of(chat, read))
}

pub(super) fn inspect(r: &impl Reads, limit: usize) -> Result<MeshView, BackendError> {
    let p = glob_escape(r.prefix());
    let mut view = MeshView::default();
    // Each batch of chats is read as it is found and only the held or waited-for
    // ones kept: a chat's state outlives its last grant by an hour or so, so most
    // keys of a busy mesh are idle chats, and a limit on the keys looked at would
    // show an arbitrary few of the active ones, or none.
    let mut active: Vec<ChatView> = Vec::new();
    let truncated = scan_chats(r, &format!("{p}:{{*}}:[sq]"), &[":s", ":q"], &mut |names| {
        let chats: Vec<String> = names
            .into_iter()
            .filter(|n| matches!(lease_name(n), LeaseName::Chat(_)))
            .collect();
        for (name, read) in chats.iter().zip(read_chats(r, &chats)?) {
            if let LeaseName::Chat(chat) = lease_name(name) {
                let v = view_of(chat, read);
                if v.holder.is_some() || v.queued > 0 {
                    active.push(v);
                }
            }
        }
        Ok(active.len() > limit)
    })?;
    active.sort_by(|a, b| a.chat.cmp(&b.chat));
    active.truncate(limit);
    view.chats = active;
    // Leaderships apart, so a truncated chat scan cannot hide them.
    let mut leaders: Vec<String> = Vec::new();
    let leaders_cut = scan_chats(
        r,
        &format!("{p}:{{\0provider:*}}:[sq]"),
        &[":s", ":q"],
        &mut |names| {
            leaders.extend(names);
            Ok(leaders.len() > limit)
        },
    )?;
    leaders.sort();
    leaders.truncate(limit);
    view.truncated = truncated || leaders_cut;
    for (name, read) in leaders.iter().zip(read_chats(r, &leaders)?) {
        if let LeaseName::Provider(id) = lease_name(name) {
            let v = view_of(id, read);
            view.leaders.push(LeaderView {
                provider: id.to_owned(),
                holder: v.holder,
                standbys: v.queued,
            });
        }
    }
    let wake = r.wake_prefix();
    let pattern = format!("{}*", glob_escape(&wake));
    // A subscriber shows only on the node it is connected to: ask every node.
    let mut channels: BTreeSet<String> = BTreeSet::new();
    for node in r.target().all_nodes() {
        let here: Vec<String> = typed(r.target().on_node(&node, &mut |con| {
            redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg(&pattern)
                .query(con)
        })?)?;
        channels.extend(here);
    }
    // Sorted and without repeats (a set).
    let replicas: Vec<ReplicaId> = channels
        .iter()
        .filter_map(|c| c.strip_prefix(&wake))
        .map(Arc::from)
        .collect();
    view.replicas = replicas;
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_decode_back_to_their_chat() {
        for chat in ["a", "{x}", "50%", "a}:h", "\0provider:tg", "ñ"] {
            let key = ChatKeys::new("p*", chat).key("h");
            assert_eq!(chat_of("p*", &key, ":h").as_deref(), Some(chat), "{key}");
        }
        let other = ChatKeys::new("p", "c").key("x}:s");
        assert_eq!(chat_of("p", &other, ":s"), None);
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }
}
