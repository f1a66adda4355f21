//! What the platform makes of a finished run: the replicas' part files merged into the
//! log and the checks, the silent losses, and the cross-process checks of every handler
//! run (order, overlap, fencing).

use std::collections::HashMap;

use super::{Dispatcher, Run, Silent};
use crate::parts;
use crate::report::{LogMsg, LogRecord};

impl Dispatcher {
    /// Reads every replica's part file and adds the `handled` lines the platform never
    /// heard of to the log and the checks. Removes the part files once merged.
    pub(super) fn merge_parts(&mut self, temporary: bool) {
        let index_of: HashMap<i64, usize> = self
            .trace
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.update_id, i))
            .collect();
        let mut unreadable = 0usize;
        for k in 0..self.replicas.len() {
            let Some(r) = self.replicas.get(k) else {
                continue;
            };
            let path = r.part.clone();
            let part = match parts::read(&path) {
                Ok(part) => part,
                Err(e) => {
                    self.note(format!("part file of replica {}: {e}", self.name(k)));
                    continue;
                }
            };
            unreadable += part.unreadable;
            for record in part.records {
                let LogRecord::Handled {
                    update_id,
                    chat,
                    message_id,
                    replica,
                    fence,
                    start_us,
                    end_us,
                    ..
                } = record
                else {
                    continue;
                };
                let Some(&index) = index_of.get(&update_id) else {
                    continue;
                };
                if self.reported.contains(&(index, k, start_us)) {
                    continue;
                }
                let reported = self.ended_by.get(&(index, k)).copied();
                let Some(update) = self.updates.get_mut(index) else {
                    continue;
                };
                // A replica that reported this update's end knew of the run: what it
                // reported stands. One that never did was killed first.
                let counted = reported.is_none();
                if counted {
                    update.handled = true;
                    self.counts.recovered += 1;
                } else {
                    self.counts.ran_then_dropped += 1;
                }
                let redelivered = update.redelivered;
                if let Some(entry) = self.trace.entries.get(index) {
                    self.runs.push(Run {
                        chat: entry.chat,
                        message_id: entry.message_id,
                        replica: k,
                        fence,
                        start_us,
                        end_us,
                        redelivered,
                        counted,
                    });
                }
                if let Some(log) = &self.log {
                    let record = match reported {
                        None => LogRecord::Handled {
                            update_id,
                            chat,
                            message_id,
                            replica,
                            fence,
                            start_us,
                            end_us,
                            redelivered,
                            recovered: true,
                        },
                        Some(how) => LogRecord::Ran {
                            update_id,
                            chat,
                            message_id,
                            replica,
                            fence,
                            start_us,
                            end_us,
                            reported: how.to_owned(),
                            redelivered,
                        },
                    };
                    let _ = log.send(LogMsg::Record(record));
                }
            }
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
                && !temporary
            {
                self.note(format!("cannot remove {}: {e}", path.display()));
            }
        }
        if unreadable > 1 {
            self.note(format!(
                "{unreadable} unreadable lines in the part files (a kill tears at most one per file)"
            ));
        }
    }

    /// Updates that never ended, or ended only as `duplicate` while no `handled` line
    /// for them exists anywhere.
    pub(super) fn silent_losses(&self) -> Vec<Silent> {
        let mut silent = Vec::new();
        for (index, update) in self.updates.iter().enumerate() {
            let how = if update.ends == 0 {
                "never_ended"
            } else if !update.ended_otherwise && !update.handled {
                "duplicate_only"
            } else {
                continue;
            };
            let Some(entry) = self.trace.entries.get(index) else {
                continue;
            };
            silent.push(Silent {
                update_id: entry.update_id,
                chat: self
                    .trace
                    .chats
                    .get(entry.chat)
                    .cloned()
                    .unwrap_or_default(),
                how,
                sent_to: update.sent_to.map(|k| self.name(k)),
                redelivered: update.redelivered,
            });
        }
        silent
    }
}

/// The cross-process checks over every handler run: (order, overlap, fencing)
/// violations, and a few examples of each, naming replicas by `names`.
pub(super) fn check(mut runs: Vec<Run>, names: &[String], chats: &[String]) -> Checked {
    runs.sort_unstable_by_key(|r| (r.chat, r.start_us, r.end_us));
    let name = |k: usize| names.get(k).map_or("?", String::as_str);
    let describe = |what: &str, before: &Run, r: &Run| {
        format!(
            "{what}: chat {} message {} on {} (fence {}, {}..{} µs) then message {} on {} (fence {}, {}..{} µs){}",
            chats.get(r.chat).map_or("?", String::as_str),
            before.message_id,
            name(before.replica),
            before.fence,
            before.start_us,
            before.end_us,
            r.message_id,
            name(r.replica),
            r.fence,
            r.start_us,
            r.end_us,
            if r.counted {
                ""
            } else {
                " (a void run: its turn was reported lost)"
            }
        )
    };
    let mut c = Checked::default();
    let mut i = 0;
    while i < runs.len() {
        let chat = runs.get(i).map_or(0, |r| r.chat);
        let mut last_message: Option<usize> = None;
        let mut last_end: Option<usize> = None;
        let mut last_fence: Option<usize> = None;
        while let Some(r) = runs.get(i).filter(|r| r.chat == chat) {
            if r.counted
                && let Some(j) = last_end
                && let Some(before) = runs.get(j)
                && r.start_us < before.end_us
            {
                c.overlap += 1;
                c.at.push(("overlap", r.start_us));
                if c.examples.len() < 12 {
                    c.examples.push(describe("overlap", before, r));
                }
            }
            if r.counted
                && last_end
                    .and_then(|j| runs.get(j))
                    .is_none_or(|b| r.end_us > b.end_us)
            {
                last_end = Some(i);
            }
            if r.counted && !r.redelivered {
                if let Some(j) = last_message
                    && let Some(before) = runs.get(j)
                    && r.message_id <= before.message_id
                {
                    c.order += 1;
                    c.at.push(("order", r.start_us));
                    if c.examples.len() < 12 {
                        c.examples.push(describe("order", before, r));
                    }
                }
                last_message = Some(i);
            }
            if let Some(j) = last_fence
                && let Some(before) = runs.get(j)
                && (r.fence < before.fence
                    || (r.fence == before.fence && r.replica != before.replica))
            {
                c.fence += 1;
                c.at.push(("fence", r.start_us));
                if c.examples.len() < 12 {
                    c.examples.push(describe("fence", before, r));
                }
            }
            last_fence = Some(i);
            i += 1;
        }
    }
    c
}

/// What [`check`] found.
#[derive(Default)]
pub(super) struct Checked {
    pub order: u64,
    pub overlap: u64,
    pub fence: u64,
    pub examples: Vec<String>,
    /// Every violation: its kind and the start of the run that broke the rule, µs
    /// since the Unix epoch.
    pub at: Vec<(&'static str, u64)>,
}
