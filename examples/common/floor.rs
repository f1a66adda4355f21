//! The *contract floor*: the least state botmesh's turn contract keeps for an
//! uncontended acquire and release, with nothing else around it. A yardstick for
//! issue 11's W1 target (README, *Turn table, in process*), shared by `cargo bench
//! --bench turns` (`--profile-w1 ROUNDS floor`) and `bench_worker --backend
//! contract-floor`, so the same code is measured in both frames.
//!
//! Not a lock: it has no queue and no waiting, and a second ask of a held chat
//! panics. Per pair: a read of the clock as the lease starts and one as it ends (the
//! holder's lost verdict), the lease registered with its holder (a map the renewal
//! would walk), the chat's entry in a sharded map while held, a fencing token from one
//! counter, and the chat's last holder kept for the next grant's `previous` once it is
//! idle. `HISTORY` and `LEASE` false leave those parts out, to show what each costs.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The floor's maps: foldhash, as the turn table's.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// See the module docs.
pub struct ContractFloor<const HISTORY: bool = true, const LEASE: bool = true> {
    /// Chats by a hash of their name, each shard under its own lock, as the table's.
    shards: Vec<Mutex<FloorShard>>,
    hasher: foldhash::fast::RandomState,
    /// Fencing tokens: one counter, so they rise per chat after its entry is gone.
    last_token: AtomicU64,
    /// The holder's leases by ticket, as a replica keeps them for its renewal thread.
    held: Mutex<FastMap<u64, Arc<(Instant, u64)>>>,
    /// Ticket numbers, as a replica draws them.
    seq: AtomicU64,
    /// The holder's name, kept in each idle chat's history.
    replica: Arc<str>,
    /// The one instant the variants without a lease use instead of a clock read.
    start: Instant,
}

#[derive(Default)]
struct FloorShard {
    /// Held chats and their tokens.
    active: FastMap<compact_str::CompactString, u64>,
    /// (last holder, its token, remembered until).
    history: FastMap<compact_str::CompactString, (Arc<str>, u64, Instant)>,
}

/// A held pair: (ticket, token, the previous holder's token).
pub type FloorHeld = (u64, u64, Option<u64>);

impl<const H: bool, const L: bool> Default for ContractFloor<H, L> {
    fn default() -> Self {
        ContractFloor {
            shards: (0..32).map(|_| Mutex::default()).collect(),
            hasher: Default::default(),
            last_token: AtomicU64::new(0),
            held: Mutex::default(),
            seq: AtomicU64::new(0),
            replica: Arc::from("floor"),
            start: Instant::now(),
        }
    }
}

impl<const H: bool, const L: bool> ContractFloor<H, L> {
    fn shard(&self, chat: &str) -> &Mutex<FloorShard> {
        &self.shards[self.hasher.hash_one(chat) as usize % self.shards.len()]
    }

    /// Takes `chat`, free by the caller's word.
    ///
    /// # Panics
    /// When `chat` is held already (the floor has no queue), or a lock was poisoned.
    pub fn lock(&self, chat: &str) -> FloorHeld {
        let sent = if L { Instant::now() } else { self.start };
        let token = self.last_token.fetch_add(1, Ordering::Relaxed) + 1;
        let previous = {
            let mut shard = self.shard(chat).lock().expect("floor poisoned");
            let previous = if H {
                shard.history.remove(chat).map(|p| p.1)
            } else {
                None
            };
            let fresh = shard.active.insert(chat.into(), token).is_none();
            assert!(fresh, "the contract floor is uncontended only");
            previous
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        if L {
            let lease = Arc::new((sent + Duration::from_secs(10), token));
            self.held.lock().expect("floor poisoned").insert(seq, lease);
        }
        (seq, token, previous)
    }

    /// Gives `chat` back.
    ///
    /// # Panics
    /// When the lease ran out (10 s), or a lock was poisoned.
    pub fn unlock(&self, chat: &str, (seq, token, _): FloorHeld) {
        let now = if L {
            let lease = self.held.lock().expect("floor poisoned").remove(&seq);
            let now = Instant::now();
            assert!(lease.is_some_and(|l| now <= l.0), "the lease ran out");
            now
        } else {
            self.start
        };
        let mut shard = self.shard(chat).lock().expect("floor poisoned");
        if let Some((name, _)) = shard.active.remove_entry(chat)
            && H
        {
            let until = now + Duration::from_secs(3600);
            shard
                .history
                .insert(name, (self.replica.clone(), token, until));
        }
    }
}
