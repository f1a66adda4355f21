//! The platform's reactions: to the replicas' answers and exits, and the deliveries
//! they lead to.

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use super::{Dispatcher, DropSeen, EarlyDuplicates, Pace, Run, Timer, static_reason};
use crate::common;
use crate::procs::Event;
use crate::protocol::{Ended, FromReplica, ToReplica};
use crate::report::{Ending, LogMsg, LogRecord, REASONS};

impl Dispatcher {
    pub(super) fn on(&mut self, event: Event) {
        match event {
            Event::Lines(k, lines) => {
                for line in lines {
                    match line {
                        Ok(msg) => self.on_line(k, msg),
                        Err(line) => {
                            let note =
                                format!("replica {} wrote an unknown line: {line}", self.name(k));
                            self.note(note);
                        }
                    }
                }
            }
            Event::Gone(k) => self.on_gone(k),
        }
    }

    /// Hands each replica's lines of this round to its feed, in one piece.
    pub(super) fn flush(&mut self) {
        for r in &mut self.replicas {
            if r.outgoing.is_empty() {
                continue;
            }
            let batch = std::mem::take(&mut r.outgoing);
            if let Some(feed) = &r.feed {
                // Fails only when the replica is gone; its `Gone` event redelivers.
                let _ = feed.send(batch);
            }
        }
    }

    pub(super) fn on_line(&mut self, k: usize, msg: FromReplica) {
        match msg {
            FromReplica::Ready { .. } => {
                if let Some(r) = self.replicas.get_mut(k) {
                    r.ready = true;
                    r.live = !r.killed && !r.gone && !self.stopping;
                }
            }
            FromReplica::Accepted { index } | FromReplica::Duplicate { index } => {
                self.answered(k, index);
            }
            FromReplica::Refused { index, reason } => {
                if let Some(r) = self.replicas.get_mut(k) {
                    r.holding.remove(&index);
                }
                let reason = static_reason(&reason);
                self.end(index, Some(k), Ending::Dropped(reason));
                self.answered(k, index);
            }
            FromReplica::Ended { index, how } => self.on_ended(k, index, how),
            FromReplica::Stopped { handovers } => {
                if let Some(r) = self.replicas.get_mut(k) {
                    r.handovers = Some(handovers);
                }
            }
        }
    }

    /// Replica `k` answered the delivery of `index`: the chat's next update may go.
    pub(super) fn answered(&mut self, k: usize, index: usize) {
        let Some(update) = self.updates.get(index) else {
            return;
        };
        if update.sent_to != Some(k) {
            return; // an answer to an earlier delivery of a redelivered update
        }
        let Some(chat) = self.trace.entries.get(index).map(|e| e.chat) else {
            return;
        };
        if let Some(c) = self.chats.get_mut(chat)
            && c.awaiting == Some(index)
        {
            c.awaiting = None;
            self.send_next(chat);
        }
    }

    pub(super) fn on_ended(&mut self, k: usize, index: usize, how: Ended) {
        if let Some(r) = self.replicas.get_mut(k) {
            r.holding.remove(&index);
        }
        let now = Instant::now();
        let Some(update) = self.updates.get(index) else {
            return;
        };
        if matches!(how, Ended::Duplicate)
            && update.ends == 0
            && update.retry_until.is_some_and(|until| now < until)
        {
            // Most likely the dead replica's claim, still live: try again shortly.
            let pause = (self.settings.lease_ttl / 10)
                .clamp(Duration::from_millis(50), Duration::from_secs(1));
            self.counts.retries += 1;
            self.timers
                .push(Reverse((now + pause, Timer::Retry(index))));
            return;
        }
        let ending = match how {
            Ended::Handled {
                replica: _,
                fence,
                start_us,
                end_us,
                waited_ns,
            } => {
                if let Some(entry) = self.trace.entries.get(index) {
                    self.runs.push(Run {
                        chat: entry.chat,
                        message_id: entry.message_id,
                        replica: k,
                        fence,
                        start_us,
                        end_us,
                        redelivered: update.redelivered,
                        counted: true,
                    });
                }
                self.reported.insert((index, k, start_us));
                self.waits.push(waited_ns);
                Ending::Handled {
                    replica: k,
                    fence,
                    start_us,
                    end_us,
                }
            }
            Ended::Dropped { reason } => Ending::Dropped(static_reason(&reason)),
            Ended::Duplicate => Ending::Duplicate,
            Ended::Failed { error } => Ending::Failed(error),
        };
        let how = match &ending {
            Ending::Handled { .. } => "handled",
            Ending::Dropped(reason) => reason,
            Ending::Duplicate => "duplicate",
            Ending::Failed(_) => "failed",
        };
        self.ended_by.insert((index, k), how);
        self.end(index, Some(k), ending);
    }

    /// Records that `index` ended, as replica `from` reported (`None`: the platform
    /// ended it, no replica could take it).
    pub(super) fn end(&mut self, index: usize, from: Option<usize>, ending: Ending) {
        let now = Instant::now();
        let from_name = from.map(|k| self.name(k));
        let Some(update) = self.updates.get_mut(index) else {
            return;
        };
        let since_sent = update
            .sent_at
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        if update.ends == 0 {
            self.slowest = self.slowest.max(since_sent);
            if since_sent > self.late_after {
                self.late += 1;
            }
        }
        let c = &mut self.counts;
        match &ending {
            Ending::Handled { .. } => {
                c.handled += 1;
                update.handled = true;
            }
            Ending::Dropped(reason) => {
                let i = REASONS
                    .iter()
                    .position(|r| r == reason)
                    .unwrap_or(REASONS.len() - 1);
                if let Some(n) = c.dropped.get_mut(i) {
                    *n += 1;
                }
            }
            Ending::Duplicate => c.duplicates += 1,
            Ending::Failed(_) => c.failed += 1,
        }
        if !matches!(ending, Ending::Duplicate) {
            update.ended_otherwise = true;
        }
        update.ends += 1;
        let first_end = update.ends == 1;
        if first_end {
            c.ended += 1;
        } else if update.redelivered {
            c.redelivered_ended_twice += 1;
        } else {
            c.ended_twice += 1;
        }
        let redelivered = update.redelivered;
        let sent_at = update.sent_at;
        if first_end && let Some(chat) = self.trace.entries.get(index).map(|e| e.chat) {
            self.unblock(chat);
        }
        let Some(entry) = self.trace.entries.get(index) else {
            return;
        };
        let chat = self
            .trace
            .chats
            .get(entry.chat)
            .cloned()
            .unwrap_or_default();
        if let Ending::Dropped(reason) = &ending {
            self.drops.push(DropSeen {
                update_id: entry.update_id,
                reason,
                replica: from_name.clone(),
                sent: sent_at.map_or(Duration::ZERO, |t| t.saturating_duration_since(self.start)),
                at: now.saturating_duration_since(self.start),
                redelivered,
            });
        }
        let Some(log) = &self.log else {
            return;
        };
        let record = match ending {
            Ending::Handled {
                replica,
                fence,
                start_us,
                end_us,
            } => LogRecord::Handled {
                update_id: entry.update_id,
                chat,
                message_id: entry.message_id,
                replica: self
                    .replicas
                    .get(replica)
                    .map(|r| r.name.clone())
                    .unwrap_or_default(),
                fence,
                start_us,
                end_us,
                redelivered,
                recovered: false,
            },
            Ending::Dropped(reason) => LogRecord::Dropped {
                update_id: entry.update_id,
                chat,
                reason: reason.to_owned(),
                redelivered,
                replica: from_name,
                at_us: Some(common::unix_us()),
            },
            Ending::Duplicate => LogRecord::Duplicate {
                update_id: entry.update_id,
                redelivered,
            },
            Ending::Failed(error) => LogRecord::Failed {
                update_id: entry.update_id,
                chat,
                error,
                redelivered,
            },
        };
        // Fails only once the log thread has finished, after every update ended.
        let _ = log.send(LogMsg::Record(record));
    }

    /// Replica `k`'s stdout ended: every update it held goes to another replica.
    pub(super) fn on_gone(&mut self, k: usize) {
        let now = Instant::now();
        let (held, expected) = match self.replicas.get_mut(k) {
            Some(r) => {
                r.gone = true;
                r.live = false;
                r.feed = None;
                r.outgoing.clear();
                // Reaped now so that a long run of kills leaves no zombies behind.
                if r.killed {
                    let _ = r.process.try_wait();
                }
                let mut held: Vec<usize> = r.holding.drain().collect();
                held.sort_unstable();
                (held, r.killed || self.stopping)
            }
            None => return,
        };
        if !expected {
            let note = format!("replica {} exited unexpectedly", self.name(k));
            self.note(note);
        }
        if self.stopping {
            // After a clean run nothing is held here; after a stall, the stuck updates
            // are already counted in the stall note.
            return;
        }
        // Its claims and leases lapse at most one TTL after its last renewal.
        let until = now + self.settings.lease_ttl + Duration::from_secs(1);
        for index in held {
            if let Some(update) = self.updates.get_mut(index) {
                if !update.redelivered {
                    self.counts.redelivered += 1;
                }
                update.redelivered = true;
                if self.early_duplicates == EarlyDuplicates::Retry {
                    update.retry_until = Some(until);
                }
            }
            self.deliver(index);
        }
    }

    /// When update `index` may be sent for the first time.
    pub(super) fn due(&self, index: usize) -> Option<Instant> {
        let offset = match &self.pace {
            Pace::Asap => return None,
            Pace::Times(times) => *times.get(index)?,
            Pace::Rate(rate) => Duration::try_from_secs_f64(index as f64 / rate).ok()?,
        };
        self.start.checked_add(offset)
    }

    /// One of the chat's updates ended: one fewer open, and a chat held back by
    /// `--max-backlog` sends its next update on the next turn of the loop (not by
    /// recursion from here).
    fn unblock(&mut self, chat: usize) {
        let Some(c) = self.chats.get_mut(chat) else {
            return;
        };
        c.open = c.open.saturating_sub(1);
        if self.o.max_backlog.is_some() && c.awaiting.is_none() && !c.timer {
            c.timer = true;
            self.timers
                .push(Reverse((Instant::now(), Timer::Due(chat))));
        }
    }

    /// Sends the chat's next update, unless it waits for an answer or its time.
    pub(super) fn send_next(&mut self, chat: usize) {
        let Some(c) = self.chats.get(chat) else {
            return;
        };
        if c.awaiting.is_some() || c.timer || self.o.max_backlog.is_some_and(|n| c.open >= n) {
            return;
        }
        let Some(&index) = c.updates.get(c.next) else {
            return;
        };
        if let Some(at) = self.due(index)
            && at > Instant::now()
        {
            if let Some(c) = self.chats.get_mut(chat) {
                c.timer = true;
            }
            self.timers.push(Reverse((at, Timer::Due(chat))));
            return;
        }
        if let Some(c) = self.chats.get_mut(chat) {
            c.next += 1;
            c.awaiting = Some(index);
            c.open += 1;
        }
        self.counts.delivered += 1;
        self.deliver(index);
    }

    /// Sends update `index` to a live replica drawn at random.
    pub(super) fn deliver(&mut self, index: usize) {
        let live = self.live();
        if live.is_empty() {
            if !self.notes.iter().any(|n| n.starts_with("no live replica")) {
                self.notes
                    .push("no live replica left; the remaining updates were dropped".to_owned());
            }
            self.end(index, None, Ending::Dropped("backend"));
            if let Some(chat) = self.trace.entries.get(index).map(|e| e.chat)
                && let Some(c) = self.chats.get_mut(chat)
                && c.awaiting == Some(index)
            {
                // The chat's next update goes on the next turn of the loop (not by
                // recursion, which a long chat would run deep).
                c.awaiting = None;
                if !c.timer {
                    c.timer = true;
                    self.timers
                        .push(Reverse((Instant::now(), Timer::Due(chat))));
                }
            }
            return;
        }
        let k = self.pick(&live);
        let Some(entry) = self.trace.entries.get(index) else {
            return;
        };
        let line = serde_json::to_vec(&ToReplica::Deliver {
            index,
            update_id: entry.update_id,
            chat: self
                .trace
                .chats
                .get(entry.chat)
                .cloned()
                .unwrap_or_default(),
            message_id: entry.message_id,
            text: entry.text.clone(),
            date: entry.date,
        });
        let Ok(line) = line else {
            self.end(
                index,
                None,
                Ending::Failed("cannot encode the delivery".to_owned()),
            );
            return;
        };
        if let Some(update) = self.updates.get_mut(index) {
            update.sent_to = Some(k);
            update.sent_at = Some(Instant::now());
        }
        if let Some(r) = self.replicas.get_mut(k) {
            r.holding.insert(index);
            r.outgoing.extend_from_slice(&line);
            r.outgoing.push(b'\n');
        }
    }
}
