//! Counters and gauges an operator can read.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets of the wait-time histogram: bucket `i` counts the waits from `2^(i-1)` µs
/// up to under `2^i` µs (bucket 0: under 1 µs; each bucket on its own, not cumulative,
/// unlike the Prometheus text); the last bucket takes everything longer.
pub const WAIT_BUCKETS: usize = 32;

/// Live counters of one replica, updated with relaxed atomics.
#[derive(Default)]
pub(crate) struct Metrics {
    pub(crate) accepted: AtomicU64,
    pub(crate) granted: AtomicU64,
    /// Turns granted on a free chat without a place in its queue (the uncontended
    /// path), each also an accepted message, a granted turn and a wait under 1 µs: one
    /// atomic add stands for those three, which the snapshot adds back in.
    pub(crate) granted_at_once: AtomicU64,
    pub(crate) waited: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) handovers: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) handled: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) backend_errors: AtomicU64,
    pub(crate) shutting_down: AtomicU64,
    pub(crate) leadership_changes: AtomicU64,
    pub(crate) leaderless_us: AtomicU64,
    pub(crate) provider_conflicts: AtomicU64,
    pub(crate) providers_led: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) conversations_resumed: AtomicU64,
    pub(crate) conversations_dropped: AtomicU64,
    pub(crate) conversations_restarted: AtomicU64,
    pub(crate) conversations_stale: AtomicU64,
    pub(crate) steps_stopped: AtomicU64,
    wait_hist: [AtomicU64; WAIT_BUCKETS],
    /// Sum of the recorded waits in µs: a Prometheus histogram's `_sum`.
    wait_sum_us: AtomicU64,
}

pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn dec(counter: &AtomicU64) {
    counter.fetch_sub(1, Ordering::Relaxed);
}

/// How a new turn counts in the metrics.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counted {
    /// Granted on a free chat in the answer to its request, with no place in a queue
    /// and no wait: counted as accepted too, all by one add (see
    /// `Metrics::granted_at_once`).
    AtOnce,
    /// Granted to a ticket placed in its chat's queue, whose acceptance was counted
    /// when it was placed; `queued`: whether it had to wait behind another.
    Placed { queued: bool },
}

impl Metrics {
    /// Counts a turn granted after `waited`.
    pub(crate) fn count_turn(&self, counted: Counted, waited: Duration) {
        match counted {
            Counted::AtOnce => inc(&self.granted_at_once),
            Counted::Placed { queued } => {
                inc(&self.granted);
                if queued {
                    inc(&self.waited);
                }
                self.record_wait(waited);
            }
        }
    }

    pub(crate) fn record_wait(&self, waited: Duration) {
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        let bucket = (64 - us.leading_zeros() as usize).min(WAIT_BUCKETS - 1);
        self.wait_hist[bucket].fetch_add(1, Ordering::Relaxed);
        if us > 0 {
            // Most turns of a quiet chat did not wait: no atomic add of nothing.
            self.wait_sum_us.fetch_add(us, Ordering::Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let at_once = get(&self.granted_at_once);
        let mut wait_histogram: [u64; WAIT_BUCKETS] =
            std::array::from_fn(|i| get(&self.wait_hist[i]));
        wait_histogram[0] = wait_histogram[0].saturating_add(at_once);
        MetricsSnapshot {
            accepted: get(&self.accepted).saturating_add(at_once),
            turns_granted: get(&self.granted).saturating_add(at_once),
            turns_waited: get(&self.waited),
            timed_out: get(&self.timed_out),
            lost: get(&self.lost),
            handovers: get(&self.handovers),
            duplicates: get(&self.duplicates),
            handled: get(&self.handled),
            failed: get(&self.failed),
            backend_errors: get(&self.backend_errors),
            shutting_down: get(&self.shutting_down),
            leadership_changes: get(&self.leadership_changes),
            leaderless_ms: get(&self.leaderless_us) / 1000,
            provider_conflicts: get(&self.provider_conflicts),
            providers_led: get(&self.providers_led),
            // A gauge the replica reads from its table of held turns (see
            // `Inner::snapshot`): no counter on every turn's way in and out.
            turns_held: 0,
            tickets_waiting: get(&self.waiting),
            conversations_resumed: get(&self.conversations_resumed),
            conversations_dropped: get(&self.conversations_dropped),
            conversations_restarted: get(&self.conversations_restarted),
            conversations_stale: get(&self.conversations_stale),
            steps_stopped: get(&self.steps_stopped),
            wait_histogram,
            wait_sum_us: get(&self.wait_sum_us),
        }
    }
}

/// A point-in-time copy of one replica's counters (monotonic totals) and gauges.
///
/// The turn figures count chats only: provider leadership leases are built on turns
/// but show up in the leadership figures, not in `turns_*`, `tickets_waiting` or the
/// wait histogram.
///
/// Built by the crate only (`#[non_exhaustive]`), so new figures can be added.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Messages taken in (duplicates not included: a message taken in while a delivery
    /// of its id was still running elsewhere waits for that one, and is counted here
    /// once it ends otherwise than as a duplicate), plus wake-ups of conversations
    /// whose `delay` ran out (they queue for the chat's turn like a message). With the
    /// lock API ([`Replica::acquire`](crate::Replica::acquire) and its family) every
    /// ask that got a ticket counts, granted or not: a `try_acquire` refused at once,
    /// or an ask whose wait ran out, counts here and in `timed_out`.
    pub accepted: u64,
    /// Turns granted to this replica.
    pub turns_granted: u64,
    /// Of those, turns that were not free at intake (the message queued first).
    pub turns_waited: u64,
    /// Messages dropped because they waited longer than `turn_wait`; with the lock
    /// API, asks whose wait ran out (their `timeout` or `deadline`; a `try_acquire`
    /// that found the chat held waits not at all, and counts here too).
    pub timed_out: u64,
    /// Turns whose lease was lost while held.
    pub lost: u64,
    /// Grants whose previous holder was another replica.
    pub handovers: u64,
    /// Deliveries skipped as duplicates of a message id seen before.
    pub duplicates: u64,
    /// Messages whose handler ran and whose turn was released cleanly.
    pub handled: u64,
    /// Messages whose handler returned an error or panicked.
    pub failed: u64,
    /// Coordinator calls that failed.
    pub backend_errors: u64,
    /// Messages reported `shutting_down`.
    pub shutting_down: u64,
    /// Times this replica became, or stopped being, the leader of a provider (so a
    /// replica that led once and stepped down counts 2).
    pub leadership_changes: u64,
    /// Milliseconds this replica led a provider without an open session: from each
    /// grant of the leadership until its transport reported [`Status::Open`], and from
    /// each close until it reopened or this replica gave the leadership up. This is
    /// the part of the bot's time without a working leader that this replica can see;
    /// the gap between two leases (at most the lease TTL plus one re-check after a
    /// crash, a few ms after a clean stop) happens while no replica leads, and is
    /// measured at the transport (see the `leader_demo` example).
    ///
    /// [`Status::Open`]: crate::Status::Open
    pub leaderless_ms: u64,
    /// Times a transport reported its session closed because another session took
    /// it over ([`CloseReason::Replaced`]): two replicas connected at once. Stays 0
    /// with leader sessions unless a leader was deposed while paused.
    ///
    /// [`CloseReason::Replaced`]: crate::CloseReason::Replaced
    pub provider_conflicts: u64,
    /// Gauge: providers this replica leads right now.
    pub providers_led: u64,
    /// Gauge: turns held right now.
    pub turns_held: u64,
    /// Gauge: tickets queued and waiting right now.
    pub tickets_waiting: u64,
    /// Conversations resumed from a checkpoint another turn wrote (a handover).
    pub conversations_resumed: u64,
    /// Conversations ended by a handover: a checkpoint that could not be resumed under
    /// `fallback: drop`, or a stale non-checkpointed conversation.
    pub conversations_dropped: u64,
    /// Checkpoints that could not be resumed and restarted their flow
    /// (`fallback: restart`).
    pub conversations_restarted: u64,
    /// In-memory conversations found stale (another turn ran on the chat since) and
    /// not continued.
    pub conversations_stale: u64,
    /// Steps stopped because `settle` ran out.
    pub steps_stopped: u64,
    /// Wait for the turn, intake to grant: bucket `i` counts the waits from
    /// `2^(i-1)` µs up to under `2^i` µs (see [`WAIT_BUCKETS`]).
    pub wait_histogram: [u64; WAIT_BUCKETS],
    /// The sum of those waits, in µs (the histogram's `_sum` in
    /// [`MetricsSnapshot::prometheus_text`]).
    pub wait_sum_us: u64,
}

impl MetricsSnapshot {
    /// An upper bound of the `q` quantile (0.0..=1.0) of the wait for the turn, from the
    /// histogram (so within a factor of 2); `None` when nothing was granted yet.
    pub fn wait_quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.wait_histogram.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.wait_histogram.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(Duration::from_micros(1u64 << i));
            }
        }
        None
    }
}

impl fmt::Display for MetricsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "accepted={} granted={} waited={} handled={} failed={} timed_out={} lost={} \
             handovers={} duplicates={} backend_errors={} held={} waiting={}",
            self.accepted,
            self.turns_granted,
            self.turns_waited,
            self.handled,
            self.failed,
            self.timed_out,
            self.lost,
            self.handovers,
            self.duplicates,
            self.backend_errors,
            self.turns_held,
            self.tickets_waiting
        )?;
        if self.leadership_changes > 0 || self.provider_conflicts > 0 {
            write!(
                f,
                " leadership_changes={} leaderless_ms={} conflicts={} led={}",
                self.leadership_changes,
                self.leaderless_ms,
                self.provider_conflicts,
                self.providers_led
            )?;
        }
        if let Some(p99) = self.wait_quantile(0.99) {
            write!(f, " wait_p99<{p99:?}")?;
        }
        Ok(())
    }
}

/// One metric family of the exposition: name (without `botmesh_`), type, help, value.
type Family<'a> = (&'a str, &'a str, &'a str, f64);

/// Writes one family with one sample, HELP and TYPE first.
fn family(out: &mut String, (name, kind, help, value): Family<'_>) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "# HELP botmesh_{name} {help}");
    let _ = writeln!(out, "# TYPE botmesh_{name} {kind}");
    let _ = writeln!(out, "botmesh_{name} {value}");
}

/// A label value escaped as the text format wants: backslash, double quote, newline.
pub(crate) fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Appends the leader gauge, shaped like client-go's `leader_election_master_status`
/// (gauge, label `name`): 1 while this replica leads the provider, else 0.
pub(crate) fn write_leader_gauges(out: &mut String, leaders: &[(&str, bool)]) {
    use std::fmt::Write as _;
    if leaders.is_empty() {
        return;
    }
    out.push_str(
        "# HELP botmesh_leader_election_master_status 1 while this replica leads the \
         provider named by `name`, 0 while it stands by.\n\
         # TYPE botmesh_leader_election_master_status gauge\n",
    );
    for (name, leading) in leaders {
        let _ = writeln!(
            out,
            "botmesh_leader_election_master_status{{name=\"{}\"}} {}",
            label_value(name),
            u8::from(*leading)
        );
    }
}

impl MetricsSnapshot {
    /// The snapshot in the Prometheus text exposition format (version 0.0.4): every
    /// total as a `botmesh_…_total` counter, the gauges, and the wait for the turn as
    /// the histogram `botmesh_turn_wait_seconds` (buckets at 2^i µs, i = 0..30, then
    /// `+Inf`). No label holds a chat id (that would make one series per chat).
    /// [`Bot::metrics_text`](crate::Bot::metrics_text) adds the leader gauges. Serve it
    /// with `Content-Type: text/plain; version=0.0.4` (see the `metrics_server`
    /// example).
    pub fn prometheus_text(&self) -> String {
        use std::fmt::Write as _;
        let c = "counter";
        let g = "gauge";
        let families: [Family<'_>; 23] = [
            (
                "messages_accepted_total",
                c,
                "Messages taken in (duplicates not included), and wake-ups of delayed conversation steps.",
                self.accepted as f64,
            ),
            (
                "messages_handled_total",
                c,
                "Messages whose handler ran and whose turn was released cleanly.",
                self.handled as f64,
            ),
            (
                "messages_failed_total",
                c,
                "Messages whose handler returned an error or panicked.",
                self.failed as f64,
            ),
            (
                "messages_duplicate_total",
                c,
                "Deliveries skipped as duplicates of a message id seen before.",
                self.duplicates as f64,
            ),
            (
                "messages_timed_out_total",
                c,
                "Messages dropped because they waited longer than turn_wait.",
                self.timed_out as f64,
            ),
            (
                "messages_shutting_down_total",
                c,
                "Messages refused or dropped because the replica was stopping.",
                self.shutting_down as f64,
            ),
            (
                "turns_granted_total",
                c,
                "Turns granted to this replica.",
                self.turns_granted as f64,
            ),
            (
                "turns_waited_total",
                c,
                "Turns that were not free at intake (the message queued first).",
                self.turns_waited as f64,
            ),
            (
                "turns_lost_total",
                c,
                "Turns whose lease was lost while held.",
                self.lost as f64,
            ),
            (
                "handovers_total",
                c,
                "Grants whose previous holder was another replica.",
                self.handovers as f64,
            ),
            (
                "backend_errors_total",
                c,
                "Coordinator calls that failed.",
                self.backend_errors as f64,
            ),
            (
                "leadership_changes_total",
                c,
                "Times this replica became, or stopped being, a provider's leader.",
                self.leadership_changes as f64,
            ),
            (
                "leaderless_seconds_total",
                c,
                "Seconds this replica led a provider without an open session.",
                self.leaderless_ms as f64 / 1000.0,
            ),
            (
                "provider_conflicts_total",
                c,
                "Sessions the transport reported replaced by another session.",
                self.provider_conflicts as f64,
            ),
            (
                "conversations_resumed_total",
                c,
                "Conversations resumed from a checkpoint another turn wrote.",
                self.conversations_resumed as f64,
            ),
            (
                "conversations_dropped_total",
                c,
                "Conversations ended by a handover.",
                self.conversations_dropped as f64,
            ),
            (
                "conversations_restarted_total",
                c,
                "Checkpoints that could not be resumed and restarted their flow.",
                self.conversations_restarted as f64,
            ),
            (
                "conversations_stale_total",
                c,
                "In-memory conversations found stale and not continued.",
                self.conversations_stale as f64,
            ),
            (
                "steps_stopped_total",
                c,
                "Conversation steps stopped because settle ran out.",
                self.steps_stopped as f64,
            ),
            (
                "providers_led",
                g,
                "Providers this replica leads right now.",
                self.providers_led as f64,
            ),
            (
                "turns_held",
                g,
                "Turns held right now.",
                self.turns_held as f64,
            ),
            (
                "tickets_waiting",
                g,
                "Tickets queued and waiting right now.",
                self.tickets_waiting as f64,
            ),
            (
                "info",
                g,
                "Always 1; the crate version is in the label.",
                1.0,
            ),
        ];
        let mut out = String::with_capacity(4096);
        for f in families {
            if f.0 == "info" {
                let _ = writeln!(out, "# HELP botmesh_info {}", f.2);
                let _ = writeln!(out, "# TYPE botmesh_info gauge");
                let _ = writeln!(
                    out,
                    "botmesh_info{{version=\"{}\"}} 1",
                    env!("CARGO_PKG_VERSION")
                );
                continue;
            }
            family(&mut out, f);
        }
        out.push_str(
            "# HELP botmesh_turn_wait_seconds Wait for the chat's turn, from intake to grant.\n\
             # TYPE botmesh_turn_wait_seconds histogram\n",
        );
        let mut cumulative = 0u64;
        for (i, n) in self.wait_histogram[..WAIT_BUCKETS - 1].iter().enumerate() {
            cumulative += n;
            // Bucket i holds waits under 2^i µs.
            let le = (1u64 << i) as f64 / 1e6;
            let _ = writeln!(
                out,
                "botmesh_turn_wait_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        let count: u64 = self.wait_histogram.iter().sum();
        let _ = writeln!(
            out,
            "botmesh_turn_wait_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "botmesh_turn_wait_seconds_sum {}",
            self.wait_sum_us as f64 / 1e6
        );
        let _ = writeln!(out, "botmesh_turn_wait_seconds_count {count}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_granted_at_once_counts_as_accepted_granted_and_a_wait_under_1us() {
        let m = Metrics::default();
        m.count_turn(Counted::AtOnce, Duration::ZERO);
        // A placed ticket's acceptance is counted as it is placed.
        inc(&m.accepted);
        m.count_turn(Counted::Placed { queued: true }, Duration::from_micros(3));
        inc(&m.accepted);
        m.count_turn(Counted::Placed { queued: false }, Duration::ZERO);
        let s = m.snapshot();
        assert_eq!((s.accepted, s.turns_granted, s.turns_waited), (3, 3, 1));
        assert_eq!(s.wait_histogram[0], 2, "{:?}", s.wait_histogram);
        assert_eq!(s.wait_histogram[2], 1, "3 µs is in [2, 4) µs");
        assert_eq!(s.wait_histogram.iter().sum::<u64>(), 3);
        assert_eq!(s.wait_sum_us, 3);
    }
}
