//! A map from chat names that keeps each name's hash in its entry.
//!
//! The table of a shard keeps every chat it knows, often far more than are active. A
//! map that hashed its keys again when it grew would read each name once more (a
//! pointer chase per entry, a cache miss on a large map); with the hash stored, growth
//! moves entries without looking at their names. The hash is computed once per
//! operation ([`ChatHasher::hash`]) and serves every map of the shard, and a
//! get-or-insert probes once. This is `hashbrown`'s `HashTable`, the building block of
//! std's `HashMap`, used for exactly this.

use std::hash::BuildHasher;

use hashbrown::HashTable;

/// A chat's name as the maps keep it: inline up to 24 bytes (every Telegram chat id,
/// most platforms' ids), on the heap only beyond. A new chat then costs no allocation
/// for its name, and a lookup compares the name in the entry itself, with no pointer
/// to chase (a cache miss on a large map).
pub(crate) type Name = compact_str::CompactString;

/// Hashes chat names for the maps of one shard (foldhash, randomly seeded per shard:
/// far cheaper than SipHash on short keys, and not predictable from outside).
#[derive(Default)]
pub(crate) struct ChatHasher(foldhash::fast::RandomState);

impl ChatHasher {
    /// The hash of `name`, for every [`ChatMap`] of this hasher's shard.
    pub(crate) fn hash(&self, name: &str) -> NameHash {
        NameHash(self.0.hash_one(name))
    }
}

/// A chat name's hash by its shard's [`ChatHasher`].
#[derive(Clone, Copy)]
pub(crate) struct NameHash(u64);

struct Entry<V> {
    /// The name's hash, so that growth never hashes a name again.
    hash: u64,
    name: Name,
    value: V,
}

/// A map from chat names (stored as [`Name`], 24 bytes) to `V`. Every call takes the
/// name's [`NameHash`] from the shard's hasher; a hash from another hasher finds
/// nothing (no panic, no wrong entry: names are still compared).
pub(crate) struct ChatMap<V> {
    table: HashTable<Entry<V>>,
}

impl<V> Default for ChatMap<V> {
    fn default() -> Self {
        ChatMap {
            table: HashTable::new(),
        }
    }
}

fn rehash<V>(e: &Entry<V>) -> u64 {
    e.hash
}

/// The bytes one entry of a `ChatMap<V>` takes in its table (name inline).
#[cfg(test)]
pub(crate) const fn entry_size<V>() -> usize {
    std::mem::size_of::<Entry<V>>()
}

impl<V> ChatMap<V> {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn get(&self, h: NameHash, name: &str) -> Option<&V> {
        self.table.find(h.0, |e| &*e.name == name).map(|e| &e.value)
    }

    pub(crate) fn get_mut(&mut self, h: NameHash, name: &str) -> Option<&mut V> {
        self.table
            .find_mut(h.0, |e| &*e.name == name)
            .map(|e| &mut e.value)
    }

    /// Removes `name`'s entry; returns its stored name (to move into another map
    /// without a copy) and value.
    pub(crate) fn remove(&mut self, h: NameHash, name: &str) -> Option<(Name, V)> {
        let found = self.table.find_entry(h.0, |e| &*e.name == name).ok()?;
        let (e, _) = found.remove();
        Some((e.name, e.value))
    }

    /// `name`'s value, made by `make` (with the name to store) when the map has none:
    /// one probe either way.
    pub(crate) fn get_or_insert_with(
        &mut self,
        h: NameHash,
        name: &str,
        make: impl FnOnce() -> (Name, V),
    ) -> &mut V {
        match self.table.entry(h.0, |e| &*e.name == name, rehash) {
            hashbrown::hash_table::Entry::Occupied(e) => &mut e.into_mut().value,
            hashbrown::hash_table::Entry::Vacant(e) => {
                let (name, value) = make();
                let entry = Entry {
                    hash: h.0,
                    name,
                    value,
                };
                &mut e.insert(entry).into_mut().value
            }
        }
    }

    /// Inserts an entry for a name the map does not hold (the caller looked first).
    pub(crate) fn insert_new(&mut self, h: NameHash, name: Name, value: V) -> &mut V {
        let e = Entry {
            hash: h.0,
            name,
            value,
        };
        &mut self.table.insert_unique(h.0, e, rehash).into_mut().value
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.table.iter().map(|e| (&*e.name, &e.value))
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        self.table.iter_mut().map(|e| (&*e.name, &mut e.value))
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|e| &e.value)
    }

    /// Makes room for `n` entries in all and writes to that room once, so that the
    /// first `n` entries cost no growth: no rehash, and no page fault on first touch
    /// of fresh memory (about 1.4 µs a page on this project's VM, a dozen new chats'
    /// worth of time), both of which would land on the insert that needs the room.
    /// `filler` makes the placeholder values written and dropped again at once.
    ///
    /// Room reserved but never written is no help: the allocator hands out fresh pages
    /// untouched, and the kernel maps each on its first write.
    ///
    /// # Errors
    /// When the room's size overflows or the allocator refuses it (a memory limit);
    /// the map is then as it was.
    pub(crate) fn reserve_touched(
        &mut self,
        n: usize,
        filler: impl Fn() -> V,
    ) -> Result<(), hashbrown::TryReserveError> {
        self.table
            .try_reserve(n.saturating_sub(self.table.len()), rehash)?;
        if !self.table.is_empty() {
            return Ok(()); // only a new map is prepared: the placeholders go by `clear`
        }
        let room = self.table.capacity();
        for i in 0..room as u64 {
            // Spread over the whole table (the golden ratio's multiplier), so that
            // every page is written and no probe sequence grows long.
            let hash = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let e = Entry {
                hash,
                name: Name::default(),
                value: filler(),
            };
            self.table.insert_unique(hash, e, rehash);
        }
        // Keeps the room (hashbrown's `clear` never shrinks).
        self.table.clear();
        Ok(())
    }

    /// How many entries fit before the map grows.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Keeps the entries for which `keep` is true.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        self.table.retain(|e| keep(&mut e.value));
    }

    /// Removes the entries for which `take` is true and hands each to `moved`, with
    /// its hash and stored name (to move into another map of the shard).
    pub(crate) fn take_if(
        &mut self,
        mut take: impl FnMut(&V) -> bool,
        mut moved: impl FnMut(NameHash, Name, V),
    ) {
        for e in self.table.extract_if(|e| take(&e.value)) {
            moved(NameHash(e.hash), e.name, e.value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names inline (up to 24 bytes) and on the heap, mixed.
    fn name_of(i: u32) -> String {
        if i.is_multiple_of(7) {
            format!("a-chat-name-longer-than-twenty-four-bytes-{i}")
        } else {
            format!("chat-{i}")
        }
    }

    #[test]
    fn reserved_room_holds_that_many_entries_without_growing() {
        let hasher = ChatHasher::default();
        let mut a: ChatMap<u32> = ChatMap::default();
        a.reserve_touched(1000, || 7).expect("room for 1000");
        let room = a.capacity();
        assert!(room >= 1000, "{room}");
        assert_eq!(a.len(), 0, "the placeholders are gone");
        for i in 0..room as u32 {
            let name = name_of(i);
            let h = hasher.hash(&name);
            assert!(a.get(h, &name).is_none(), "{name}: a placeholder was found");
            a.insert_new(h, name.into(), i);
        }
        assert_eq!(a.capacity(), room, "filled to its room without growing");
        for i in 0..room as u32 {
            let name = name_of(i);
            assert_eq!(a.get(hasher.hash(&name), &name), Some(&i));
        }
        // A map in use only grows to the room; what it holds stays.
        a.reserve_touched(room * 4, || 0).expect("room");
        // A room too large for the address space is refused, and the map stays.
        assert!(a.reserve_touched(usize::MAX, || 0).is_err());
        assert!(a.capacity() >= room * 4);
        assert_eq!(a.len(), room);
        assert_eq!(a.get(hasher.hash("chat-1"), "chat-1"), Some(&1));
    }

    #[test]
    fn entries_survive_growth_and_move_between_maps_by_their_stored_hash() {
        let hasher = ChatHasher::default();
        let mut a: ChatMap<u32> = ChatMap::default();
        let mut b: ChatMap<u32> = ChatMap::default();
        for i in 0..5000u32 {
            let name = name_of(i);
            let h = hasher.hash(&name);
            assert!(a.get(h, &name).is_none());
            *a.insert_new(h, name.into(), i) += 1;
        }
        assert_eq!(a.len(), 5000);
        a.take_if(
            |v| v % 2 == 0,
            |h, name, v| {
                b.insert_new(h, name, v);
            },
        );
        assert_eq!((a.len(), b.len()), (2500, 2500));
        for i in 0..5000u32 {
            let name = name_of(i);
            let h = hasher.hash(&name);
            let (here, there) = if (i + 1) % 2 == 0 { (&b, &a) } else { (&a, &b) };
            assert_eq!(here.get(h, &name), Some(&(i + 1)), "{name}");
            assert_eq!(there.get(h, &name), None, "{name}");
        }
        let h = hasher.hash("chat-1");
        let (name, v) = b.remove(h, "chat-1").expect("moved to b");
        assert_eq!((&*name, v), ("chat-1", 2));
        assert!(b.remove(h, "chat-1").is_none());
        b.retain(|v| *v < 100);
        assert!(b.values().all(|v| *v < 100));
        // A hash of another name never finds this one.
        assert_eq!(a.get(hasher.hash("chat-3"), "chat-2"), None);
    }
}
