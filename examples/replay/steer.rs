//! What a [`Director`](super::Director) may do to the platform: look at the
//! replicas, kill, signal or start them, and add rounds of the input.

use std::time::Instant;

use rand::Rng;

use super::{Dispatcher, Update};
use crate::data::Entry;
use crate::parts;
use crate::procs;

impl Dispatcher {
    /// The name of replica `k` (`r1`, `r2`, …; restarted replicas get new numbers).
    pub fn name(&self, k: usize) -> String {
        self.replicas
            .get(k)
            .map_or_else(|| format!("#{k}"), |r| r.name.clone())
    }

    /// The process id of replica `k`.
    pub fn pid(&self, k: usize) -> Option<u32> {
        self.replicas.get(k).map(|r| r.process.id())
    }

    /// Replicas that get deliveries: ready, not killed, not gone.
    pub fn live(&self) -> Vec<usize> {
        (0..self.replicas.len())
            .filter(|&k| self.replicas.get(k).is_some_and(|r| r.live))
            .collect()
    }

    /// Whether replica `k` is ready and not gone (it may be paused).
    pub fn is_live(&self, k: usize) -> bool {
        self.replicas.get(k).is_some_and(|r| r.live)
    }

    /// Updates delivered to replica `k` that have not ended (nor been refused).
    pub fn held(&self, k: usize) -> usize {
        self.replicas.get(k).map_or(0, |r| r.holding.len())
    }

    /// Whether replica `k`'s stdout ended.
    pub fn is_gone(&self, k: usize) -> bool {
        self.replicas.get(k).is_none_or(|r| r.gone)
    }

    /// One of `among`, drawn from the platform's seeded generator.
    pub fn pick(&mut self, among: &[usize]) -> usize {
        if among.is_empty() {
            return 0;
        }
        among
            .get(self.rng.gen_range(0..among.len()))
            .copied()
            .unwrap_or(0)
    }

    /// First deliveries so far.
    pub fn delivered(&self) -> usize {
        self.counts.delivered
    }

    /// Updates in the trace not yet delivered for the first time.
    pub fn undelivered(&self) -> usize {
        self.updates.len().saturating_sub(self.counts.delivered)
    }

    /// The updates of one round of the input.
    pub fn round_len(&self) -> usize {
        self.base_len
    }

    /// When the run started.
    pub fn started(&self) -> Instant {
        self.start
    }

    /// Adds a note to the summary.
    pub fn note(&mut self, note: String) {
        if self.notes.len() < 20 {
            self.notes.push(note);
        }
    }

    /// SIGKILLs replica `k`: no clean stop, no release. Its stdout then ends, and what
    /// it held is redelivered.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn kill(&mut self, k: usize) -> Result<(), String> {
        let r = self
            .replicas
            .get_mut(k)
            .ok_or_else(|| format!("no replica #{k}"))?;
        // `Child::kill` is SIGKILL on Unix.
        r.process
            .kill()
            .map_err(|e| format!("cannot kill replica {}: {e}", r.name))?;
        r.live = false;
        r.killed = true;
        Ok(())
    }

    /// Sends `signal` (`STOP`, `CONT`) to replica `k` with kill(1), since this example
    /// has no unsafe code to call kill(2) with.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn signal(&self, k: usize, signal: &str) -> Result<(), String> {
        let pid = self.pid(k).ok_or_else(|| format!("no replica #{k}"))?;
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(|e| format!("cannot run kill -{signal} {pid}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -{signal} {pid} failed ({status})"))
        }
    }

    /// Starts a new replica process with the next free name. It gets deliveries once it
    /// said `ready`.
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn start_replica(&mut self) -> Result<usize, String> {
        // A killed replica's stdout can close a moment before it can be reaped; reap
        // those now so that a long run of kills leaves no zombies behind.
        for r in self.replicas.iter_mut().filter(|r| r.killed && r.gone) {
            let _ = r.process.try_wait();
        }
        let k = self.replicas.len();
        let name = format!("r{}", k + 1);
        let part = parts::path_for(&self.part_base, &name);
        let r = procs::spawn(&self.o, &self.settings, k, &name, &part, &self.events_tx)?;
        self.replicas.push(r);
        Ok(k)
    }

    /// Adds one more round of the input to the trace: the same chats and texts, with
    /// `update_id` and `message_id` shifted past every earlier round, so each chat's
    /// messages stay in rising `message_id` order and none is a duplicate of an
    /// earlier one.
    pub fn add_round(&mut self) {
        let first_round = self.trace.entries.get(..self.base_len).unwrap_or_default();
        let (id_span, message_span) = spans(first_round);
        let shift = self.rounds;
        for i in 0..self.base_len {
            let Some(e) = self.trace.entries.get(i) else {
                break;
            };
            let entry = Entry {
                update_id: e.update_id.saturating_add(id_span.saturating_mul(shift)),
                chat: e.chat,
                message_id: e
                    .message_id
                    .saturating_add(message_span.saturating_mul(shift)),
                date: e.date,
                text: e.text.clone(),
            };
            let index = self.trace.entries.len();
            if let Some(c) = self.chats.get_mut(entry.chat) {
                c.updates.push(index);
            }
            self.trace.entries.push(entry);
            self.updates.push(Update::default());
        }
        self.rounds += 1;
        // Chats that had run out go on.
        for chat in 0..self.chats.len() {
            self.send_next(chat);
        }
    }
}

/// The `update_id` and `message_id` ranges of a round: how far the next round shifts.
fn spans(entries: &[Entry]) -> (i64, i64) {
    let span = |values: &mut dyn Iterator<Item = i64>| {
        let (lo, hi) = values.fold((i64::MAX, i64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if lo > hi {
            1
        } else {
            hi.saturating_sub(lo).saturating_add(1)
        }
    };
    (
        span(&mut entries.iter().map(|e| e.update_id)),
        span(&mut entries.iter().map(|e| e.message_id)),
    )
}
