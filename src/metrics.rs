//! Counters and gauges an operator can read.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets of the wait-time histogram: bucket `i` counts waits below `2^i` µs
/// (bucket 0: under 1 µs); the last bucket takes everything longer.
pub const WAIT_BUCKETS: usize = 32;

/// Live counters of one replica, updated with relaxed atomics.
#[derive(Default)]
pub(crate) struct Metrics {
    pub(crate) accepted: AtomicU64,
    pub(crate) granted: AtomicU64,
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
    pub(crate) held: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) conversations_resumed: AtomicU64,
    pub(crate) conversations_dropped: AtomicU64,
    pub(crate) conversations_restarted: AtomicU64,
    pub(crate) conversations_stale: AtomicU64,
    pub(crate) steps_stopped: AtomicU64,
    wait_hist: [AtomicU64; WAIT_BUCKETS],
}

pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn dec(counter: &AtomicU64) {
    counter.fetch_sub(1, Ordering::Relaxed);
}

impl Metrics {
    pub(crate) fn record_wait(&self, waited: Duration) {
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        let bucket = (64 - us.leading_zeros() as usize).min(WAIT_BUCKETS - 1);
        self.wait_hist[bucket].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            accepted: get(&self.accepted),
            turns_granted: get(&self.granted),
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
            turns_held: get(&self.held),
            tickets_waiting: get(&self.waiting),
            conversations_resumed: get(&self.conversations_resumed),
            conversations_dropped: get(&self.conversations_dropped),
            conversations_restarted: get(&self.conversations_restarted),
            conversations_stale: get(&self.conversations_stale),
            steps_stopped: get(&self.steps_stopped),
            wait_histogram: std::array::from_fn(|i| get(&self.wait_hist[i])),
        }
    }
}

/// A point-in-time copy of one replica's counters (monotonic totals) and gauges.
///
/// The turn figures count chats only: provider leadership leases are built on turns
/// but show up in the leadership figures, not in `turns_*`, `tickets_waiting` or the
/// wait histogram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Messages taken in (duplicates not included), plus wake-ups of conversations
    /// whose `delay` ran out (they queue for the chat's turn like a message).
    pub accepted: u64,
    /// Turns granted to this replica.
    pub turns_granted: u64,
    /// Of those, turns that were not free at intake (the message queued first).
    pub turns_waited: u64,
    /// Messages dropped because they waited longer than `turn_wait`.
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
    /// Wait for the turn, intake to grant: bucket `i` counts waits under `2^i` µs.
    pub wait_histogram: [u64; WAIT_BUCKETS],
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
