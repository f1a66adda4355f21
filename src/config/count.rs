//! The count settings in files, `dedupIds` and `waitReplicas`: whole numbers checked
//! as the code checks them.

use serde::Deserializer;

use super::strict;
use super::value::{self, Raw, Scalar};

/// Reads a whole number named `alone` when read on its own, described by `expected`
/// in messages, and checked by `check` (which names the field and the value).
fn count<'de, D: Deserializer<'de>>(
    d: D,
    alone: &str,
    expected: &'static str,
    check: fn(&str, usize) -> Result<(), String>,
) -> Result<Option<usize>, D::Error> {
    let name = strict::name_or(alone);
    value::read(
        d,
        Scalar(expected, |raw| match raw {
            Raw::Whole(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                check(&name, n).map(|()| Some(n))
            }
            raw => Err(raw.wrong(&name, expected, false)),
        }),
    )
}

/// Reads `dedupIds`: a whole number from 1 to [`crate::MAX_DEDUP_IDS`], the handled
/// message ids each chat remembers at least.
pub(super) fn dedup_ids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    count(
        d,
        "dedupIds",
        "a whole number of message ids per chat from 1 to 10000, such as 64",
        crate::coordinator::check_dedup_ids,
    )
}

/// Reads `chatCapacity`: a whole number from 0 to [`crate::MAX_CHAT_CAPACITY`], the
/// chats a memory coordinator is prepared for.
pub(super) fn chat_capacity<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    count(
        d,
        "chatCapacity",
        "a whole number of chats from 0 to 16777216, such as 50000",
        crate::memory::capacity::check_chat_capacity,
    )
}

/// Reads `waitReplicas`: a whole number from 0 to [`crate::redis::MAX_WAIT_REPLICAS`],
/// the replicas that must acknowledge each write.
#[cfg(feature = "redis")]
pub(super) fn wait_replicas<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    count(
        d,
        "waitReplicas",
        "a whole number of replicas from 0 (off) to 100, such as 1",
        crate::redis::check_wait_replicas,
    )
}
