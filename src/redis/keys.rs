//! How chats, tickets and grants are written in Redis keys and replies.

use std::sync::Arc;

use crate::coordinator::{BackendError, Grant, Previous, Ticket};

/// One chat's keys.
pub(super) struct ChatKeys {
    base: String,
}

impl ChatKeys {
    pub(super) fn new(prefix: &str, chat: &str) -> Self {
        let mut base = String::with_capacity(prefix.len() + chat.len() + 4);
        base.push_str(prefix);
        base.push_str(":{");
        for ch in chat.chars() {
            match ch {
                '%' => base.push_str("%25"),
                '{' => base.push_str("%7B"),
                '}' => base.push_str("%7D"),
                c => base.push(c),
            }
        }
        base.push('}');
        ChatKeys { base }
    }

    /// The chat's Redis Cluster hash slot: that of its hash tag, shared by every key
    /// of the chat (the claims and the checkpoint included).
    pub(super) fn slot(&self) -> u16 {
        super::node::slot_of(self.base.as_bytes())
    }

    pub(super) fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.base)
    }
}

/// Refuses a replica id that holds a NUL: the holder record, the wake-ups and the
/// replies use NUL as their separator, so such a replica's ticket would be granted
/// and its reply misread. Checked before anything is written (`Replica::start`
/// refuses such ids too; this guards a direct user of the
/// [`Coordinator`](crate::Coordinator) calls).
pub(super) fn check_replica_id(replica: &str) -> Result<(), BackendError> {
    if replica.contains('\0') {
        return Err(BackendError::new(format!(
            "replica id {replica:?} holds a NUL character, which the Redis backend uses as a separator"
        )));
    }
    Ok(())
}

/// A ticket as the functions take it, `<seq>:<replica>`.
///
/// # Errors
/// As [`check_replica_id`].
pub(super) fn ticket_str(t: &Ticket) -> Result<String, BackendError> {
    check_replica_id(&t.replica)?;
    Ok(format!("{}:{}", t.seq, t.replica))
}

pub(super) fn parse_ticket(s: &str) -> Option<Ticket> {
    let (seq, replica) = s.split_once(':')?;
    Some(Ticket {
        replica: Arc::from(replica),
        seq: seq.parse().ok()?,
    })
}

pub(super) fn parse_grant(t: &str, k: &str, pr: &str, pk: &str) -> Result<Grant, BackendError> {
    let ticket = parse_ticket(t).ok_or_else(|| BackendError::new("malformed ticket in Redis"))?;
    let token = k
        .parse()
        .map_err(|_| BackendError::new("malformed token in Redis"))?;
    let previous = match (pr, pk.parse()) {
        ("", _) | (_, Err(_)) => None,
        (replica, Ok(token)) => Some(Previous {
            replica: Arc::from(replica),
            token,
        }),
    };
    Ok(Grant {
        ticket,
        token,
        previous,
    })
}

/// A grant reply from a script, split at its NULs: the tag, ticket, token, previous
/// replica and previous token.
pub(super) fn grant_from(reply: &[String]) -> Result<Grant, BackendError> {
    match reply {
        [_, t, k, pr, pk, ..] => parse_grant(t, k, pr, pk),
        _ => Err(BackendError::new("short grant reply from Redis")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_keys_are_injective_and_slot_safe() {
        let a = ChatKeys::new("p", "{a}");
        let b = ChatKeys::new("p", "%7Ba%7D");
        assert_ne!(a.key("h"), b.key("h"));
        assert_eq!(a.key("h"), "p:{%7Ba%7D}:h");
        // The hash tag is the first {...}: the encoded chat, never part of it.
        let k = ChatKeys::new("p", "x}y{z").key("q");
        assert_eq!(k, "p:{x%7Dy%7Bz}:q");
    }

    #[test]
    fn tickets_round_trip_with_colons_in_replica_names() {
        let t = Ticket {
            replica: Arc::from("pod:7"),
            seq: 42,
        };
        assert_eq!(parse_ticket(&ticket_str(&t).expect("no NUL")), Some(t));
        let nul = Ticket {
            replica: Arc::from("a\0b"),
            seq: 1,
        };
        let e = ticket_str(&nul).expect_err("a NUL is refused");
        assert!(e.to_string().contains("\"a\\0b\""), "{e}");
    }
}
