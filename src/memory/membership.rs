//! Which replicas are attached to the memory backend: attach and detach, one at a
//! time (`MemoryCoordinator::membership`), and telling runs of one replica id apart
//! (`Coordinator::attach_incarnation`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::table::ChatPushes;
use super::{MemoryCoordinator, ReplicaEntry};
use crate::coordinator::{BackendError, Coordinator, GrantSink, HeldLease, ReplicaId};

impl MemoryCoordinator {
    /// Attaches `replica`'s run `incarnation` (`None` from a plain `attach`).
    ///
    /// An earlier run of the id is gone by then (its liveness and every lease it was
    /// granted have ended), but its tickets may still sit in the table: the new run's
    /// liveness, shared through the id, would make them count again, and a grant to
    /// one of them would then reach the new run, or the earlier run if it was only
    /// stalled and wakes up. So they are cleared first, as its detach would have.
    pub(super) fn attach_run(
        &self,
        replica: &ReplicaId,
        incarnation: Option<u64>,
        sink: GrantSink,
    ) -> Result<(), BackendError> {
        let one_at_a_time = self.membership.lock();
        let now = self.clock.now();
        let earlier = {
            let mut replicas = self.replicas.write();
            let present = |r: &Arc<ReplicaEntry>| self.present_until(r) >= self.ns(now);
            if replicas.get(replica).is_some_and(present) {
                // Two live replicas with one id would take each other's grants, and a
                // crashed one may still hold leases.
                return Err(BackendError::new(format!(
                    "replica id {replica:?} is already in use (by a live replica, or by \
                     one that crashed less than 1.25 lease TTLs ago)"
                )));
            }
            let earlier = replicas.remove(replica).is_some();
            if earlier {
                // No shard may go on using the removed entry from its cache.
                self.replicas_gen.fetch_add(1, Ordering::Release);
            }
            earlier
        };
        let pushes = if earlier {
            self.clear_tickets(replica)
        } else {
            ChatPushes::new()
        };
        let entry = ReplicaEntry {
            sink,
            incarnation,
            alive_until: AtomicU64::new(self.ns(now + self.ttl)),
        };
        self.replicas
            .write()
            .insert(replica.clone(), Arc::new(entry));
        // A shard may cache an earlier entry of this id (see `ShardCell::callers`).
        self.replicas_gen.fetch_add(1, Ordering::Release);
        // Sinks are called with no lock held: one may wait on another attach.
        drop(one_at_a_time);
        self.push_chats(pushes);
        Ok(())
    }

    /// A clean stop of `replica`'s run `incarnation` (`None`: whichever is attached).
    /// When a later run of the id is attached (the caller stalled past its liveness
    /// and was replaced), only the caller's own leases in `held` are released, by
    /// their tokens; the later run's turns and tickets share the id and stay.
    /// Otherwise the entry goes and every chat the id held or waited for moves on.
    pub(super) fn detach_run(
        &self,
        replica: &ReplicaId,
        incarnation: Option<u64>,
        held: &[HeldLease<'_>],
    ) -> Result<(), BackendError> {
        let one_at_a_time = self.membership.lock();
        let later = {
            let mut replicas = self.replicas.write();
            let attached = replicas.get(replica).and_then(|e| e.incarnation);
            let later = incarnation.is_some_and(|run| attached.is_some_and(|a| a != run));
            if !later {
                replicas.remove(replica);
                self.replicas_gen.fetch_add(1, Ordering::Release);
            }
            later
        };
        if !later {
            let pushes = self.clear_tickets(replica);
            drop(one_at_a_time);
            self.push_chats(pushes);
            return Ok(());
        }
        // The later run stays attached whatever this releases: no lock is needed for
        // it, and the sinks its releases push to are called with none held.
        drop(one_at_a_time);
        log::warn!(
            target: "botmesh::memory",
            "replica {replica:?}: a stop of an earlier run (incarnation {incarnation:?}) \
             after a later run attached; releasing only its {} lease(s)",
            held.len()
        );
        for lease in held {
            self.release(lease, None)?;
        }
        Ok(())
    }

    /// Frees every chat `replica` (no longer attached) holds and removes its queued
    /// tickets; returns the grants this makes to the next waiters, for the caller to
    /// push once it holds no lock.
    fn clear_tickets(&self, replica: &ReplicaId) -> ChatPushes {
        let mut pushes = ChatPushes::new();
        self.with_env(self.clock.now(), None, |env| {
            for shard in self.shards.iter() {
                shard.lock().table.detach(env, replica, &mut pushes);
            }
        });
        pushes
    }
}
