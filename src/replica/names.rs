//! How chat ids are stored at the coordinator, and the names the runtime reserves.

use std::borrow::Cow;

/// A chat's stored name kept by a held turn: inline up to 24 bytes (every Telegram
/// chat id, most platforms' ids), so a turn granted at once allocates nothing for
/// it; longer names go to the heap.
pub(crate) type ChatName = compact_str::CompactString;

/// The chat id as stored at the coordinator. Names the runtime reserves for its own
/// leases (provider leadership: `"\0provider:<id>"`) start with one NUL; a user's chat
/// id that starts with a NUL is stored with one more in front. So no chat id can meet
/// a reserved name, two chat ids never meet each other, and every other chat id is
/// stored as it is, without a copy.
pub(crate) fn stored_chat(chat: &str) -> Cow<'_, str> {
    if chat.starts_with('\0') {
        Cow::Owned(format!("\0{chat}"))
    } else {
        Cow::Borrowed(chat)
    }
}

/// The chat id as the user gave it, from its stored form (a reserved name shows
/// without its NUL, for logs).
pub(crate) fn shown_chat(stored: &str) -> &str {
    stored.strip_prefix('\0').unwrap_or(stored)
}

/// Whether a stored name is one of the runtime's own leases rather than a chat: those
/// stay out of the turn metrics (a standby's ticket waits for hours by design).
pub(crate) fn is_reserved(stored: &str) -> bool {
    stored.starts_with('\0') && !stored.starts_with("\0\0")
}

/// The reserved lease name of a provider's leadership (see [`stored_chat`]): no chat
/// id can take it.
pub(crate) fn provider_lease(provider: &str) -> String {
    format!("\0provider:{provider}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_ids_never_meet_reserved_names_or_each_other() {
        let lease = provider_lease("tg");
        for chat in ["\0provider:tg", "provider:tg", "\0\0x", ""] {
            assert_ne!(stored_chat(chat), lease.as_str());
            assert!(!is_reserved(&stored_chat(chat)));
            assert_eq!(shown_chat(&stored_chat(chat)), chat);
        }
        assert!(is_reserved(&lease));
        assert_ne!(stored_chat("\0a"), stored_chat("a"));
    }
}
