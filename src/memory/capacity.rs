//! Preparing the memory backend's table for a known number of chats
//! ([`MemoryCoordinator::with_chat_capacity`]): room reserved and written before
//! turns are taken, so that none of them pays for a map's growth.

use super::{MemoryCoordinator, SHARDS};
use crate::coordinator::BackendError;

/// The most chats [`MemoryCoordinator::with_chat_capacity`] prepares for (2^24, about
/// 16.8 million, which takes about 2.1 GB); a larger number is clamped to it,
/// [`MemoryCoordinator::try_with_chat_capacity`] refuses it, and `CoordinationConfig`
/// refuses it naming `chatCapacity`. Past this size a table still grows as needed.
pub const MAX_CHAT_CAPACITY: usize = 1 << 24;

/// Checks a configured `chatCapacity` (`field` names it in the error).
pub(crate) fn check_chat_capacity(field: &str, n: usize) -> Result<(), String> {
    if n > MAX_CHAT_CAPACITY {
        return Err(format!(
            "{field}: {n} is out of range; expected a number of chats from 0 (grow as \
             needed) to {MAX_CHAT_CAPACITY}"
        ));
    }
    Ok(())
}

impl MemoryCoordinator {
    /// Prepares the table for `chats` chats: the distinct chats that take a turn
    /// within an hour, as each one's last holder is what an idle chat leaves for an
    /// hour (so that its next grant can name it). Their room is reserved and written
    /// once, now, instead of growing while turns are taken. Like
    /// `HashMap::with_capacity`, but the memory is also mapped: the first touch of a
    /// fresh page is a page fault, and a growing map rehashes under its shard's lock,
    /// both on the turn that needs the room; with a million chats one such growth
    /// holds a shard for up to 2 ms here (README, *Turn table, in process*).
    ///
    /// **Costs**, taken at once: a slot is 65 bytes and each of the table's 32 shards
    /// rounds its room (the mean share plus a margin of 4 standard deviations for
    /// uneven hashing) up to a power of two, so 75 to 150 bytes per chat asked for
    /// (about 130 MB for a million, 2.1 GB at [`MAX_CHAT_CAPACITY`]); a chat name over
    /// 24 bytes costs its length again on the heap when the chat arrives. The call
    /// takes 5–30 ms per 100,000 chats here, 0.07–0.3 s per million and 2.5–5 s at
    /// the maximum. Every coordinator built from a `{"memory": …}` config spec
    /// reserves its own: share one
    /// (`CoordinationConfig::shared`) rather than multiply it. A table still grows
    /// past its room when needed. 0, the default, reserves nothing.
    ///
    /// Clamped to [`MAX_CHAT_CAPACITY`]. Never fails: when the allocator refuses the
    /// room (a memory limit), it logs a warning and the table grows as it goes; see
    /// [`try_with_chat_capacity`](Self::try_with_chat_capacity) for an error instead.
    /// With overcommit, room the machine cannot back is found out on first touch, by
    /// the kernel's OOM killer, as for any allocation.
    ///
    /// ```
    /// use botmesh::MemoryCoordinator;
    ///
    /// // A bot with about 50,000 chats an hour: no growth on their first turns.
    /// let coordinator = MemoryCoordinator::new().with_chat_capacity(50_000);
    /// # drop(coordinator);
    /// ```
    #[must_use]
    pub fn with_chat_capacity(self, chats: usize) -> Self {
        if let Err(e) = self.reserve_chats(chats.min(MAX_CHAT_CAPACITY)) {
            log::warn!(target: "botmesh::memory", "chat capacity: {e}; the table grows as it goes");
        }
        self
    }

    /// [`with_chat_capacity`](Self::with_chat_capacity), with an error instead of a
    /// clamp or a warning.
    ///
    /// # Errors
    /// A [`BackendError`] naming the number when `chats` is over
    /// [`MAX_CHAT_CAPACITY`], or when the allocator refuses the room (then the
    /// coordinator is dropped, and what was reserved with it).
    pub fn try_with_chat_capacity(self, chats: usize) -> Result<Self, BackendError> {
        self.try_chat_capacity_as("chat capacity", chats)
    }

    /// [`try_with_chat_capacity`](Self::try_with_chat_capacity) with `field` naming
    /// the setting in the error (`coordinator.memory.chatCapacity` from a config).
    pub(crate) fn try_chat_capacity_as(
        self,
        field: &str,
        chats: usize,
    ) -> Result<Self, BackendError> {
        check_chat_capacity(field, chats).map_err(BackendError::new)?;
        self.reserve_chats(chats)
            .map_err(|e| BackendError::new(format!("{field}: {e}")))?;
        Ok(self)
    }

    /// Reserves room for `chats` (at most [`MAX_CHAT_CAPACITY`]) in every shard.
    fn reserve_chats(&self, chats: usize) -> Result<(), String> {
        if chats == 0 {
            return Ok(());
        }
        let mean = chats.div_ceil(SHARDS);
        let per_shard = mean + 4 * mean.isqrt() + 8;
        for shard in self.shards.iter() {
            shard.lock().table.reserve(per_shard).map_err(|e| {
                format!(
                    "cannot reserve room for {chats} chats ({per_shard} in each of {SHARDS} \
                     shards): {e}"
                )
            })?;
        }
        Ok(())
    }
}
