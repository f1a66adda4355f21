//! Judging a chaos run: which fault explains each drop, and the summary.
//!
//! A drop is explained when a fault that may cause that reason ran while the update was
//! in the platform's hands: the update's latest delivery came before the fault's window
//! closed, and the drop was heard of after the window opened. A window is the fault's
//! own span plus a grace of one lease TTL, one renewal period (TTL/3) and 0.5 s for the
//! report to travel (a cut's grace is the command timeout and 0.5 s: a call broken by
//! it fails within that). What a fault may cause is what botmesh's contract lets it
//! cause (SPEC §3, §8):
//!
//! | fault | may explain | on |
//! | --- | --- | --- |
//! | kill | any reason | the killed replica |
//! | pause | `lost`, `backend` | the paused replica |
//! | redis_restart | `lost`, `backend` | any replica |
//! | blackhole | `backend`; `lost` when it lasted ≥ TTL/2 (with the renewal period, long enough to reach the holder's give-up point) | any replica |
//! | cut | `backend` | any replica |
//! | pubsub_kill, jitter, busy | nothing: the contract says they lose no lease and drop no message | |
//! | stall (seen, not injected) | `backend`; `lost` when stalls, blackholes and Redis restarts together cover ≥ TTL/2 of the lease's last TTL + TTL/3 + 0.5 s | any replica |
//! | starved (seen, not injected) | `lost` when the above and the time the replica's own renewal thread waited for a CPU (the kernel's scheduler account) together cover ≥ TTL/2 of that stretch | that replica |
//!
//! A *stall* is not a fault the harness injects but one it observes: its link probe
//! (`probe.rs`) pings Redis through the proxy every 20 ms, and a ping that took at least
//! the renewal period (TTL/3) is a span in which no renewal could have reached Redis in
//! time. Busy loops alone do not stall the link on a healthy host (the contract holds
//! them harmless, and runs of jitter and busy loops alone end clean); but busy loops on
//! top of the other faults' aftermath (every replica reconnecting and retrying at once)
//! can starve Redis and the proxy until a plain `PING` takes longer than a TTL, and the
//! contract then lets a lease go: the backend was out of reach. The probe is the
//! independent evidence of it, and a stall is judged as a blackhole of its length is.
//!
//! A `timeout` is explained by a pause (on its replica), restart or blackhole that
//! could itself have kept a turn from being granted for `turn_wait` (its length plus
//! TTL, TTL/3 and 0.5 s reach `turn_wait`; with the default 10 s `turn_wait` none
//! can), or by a storm: faults of any kind, back to back, whose windows together
//! cover at least half of the message's wait. Every fault slows a chat's hand-overs
//! (a busy CPU stretches each hop of a hand-over from ~1 ms to tens; a lost wake-up
//! waits for the re-check), and a hot chat whose messages keep arriving faster than
//! it is served then builds a queue deeper than `turn_wait` can drain: an honest
//! timeout, caused by the faults, though no single one could have caused it.
//! `shutting_down` is never explained: replicas stop only after every update ended.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::chaos_args::ChaosOptions;
use crate::faults::{Kind, Seen};
use crate::parent::{DropSeen, Finished};
use crate::probe::{ProbeStats, Stall};
use crate::report::REASONS;

/// The Redis backend's command timeout (the crate's default, which the replicas keep).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// The window of a fault: from its start to its end plus the grace for its kind.
fn window(f: &Seen, ttl: Duration) -> (Duration, Duration) {
    let grace = match f.kind {
        Kind::Cut => COMMAND_TIMEOUT + Duration::from_millis(500),
        _ => ttl + ttl / 3 + Duration::from_millis(500),
    };
    (f.start, f.end + grace)
}

fn overlaps(d: &DropSeen, f: &Seen, ttl: Duration) -> bool {
    let (open, close) = window(f, ttl);
    d.sent <= close && d.at >= open
}

/// Whether fault `f` explains drop `d`.
fn explains(f: &Seen, d: &DropSeen, o: &ChaosOptions) -> bool {
    let ttl = o.lease_ttl;
    if !overlaps(d, f, ttl) {
        return false;
    }
    let on_target = f.replica.is_some() && f.replica == d.replica;
    let could_outlast_wait = f.length + ttl + ttl / 3 + Duration::from_millis(500) >= o.turn_wait;
    match (f.kind, d.reason) {
        (Kind::Kill, _) => on_target,
        (Kind::Pause, "lost" | "backend") => on_target,
        (Kind::Pause, "timeout") => on_target && could_outlast_wait,
        (Kind::RedisRestart, "lost" | "backend") => true,
        (Kind::Blackhole, "backend") => true,
        (Kind::Blackhole, "lost") => f.length >= ttl / 2,
        (Kind::RedisRestart | Kind::Blackhole, "timeout") => could_outlast_wait,
        (Kind::Cut, "backend") => true,
        _ => false,
    }
}

/// The kind of the latest fault whose window (in µs since the Unix epoch) holds
/// `at_us`, or `none`.
fn during_us(at_us: u64, faults: &[Seen], ttl: Duration) -> &'static str {
    faults
        .iter()
        .rev()
        .find(|f| {
            let (_, close) = window(f, ttl);
            let grace = u64::try_from(close.saturating_sub(f.end).as_micros()).unwrap_or(u64::MAX);
            f.start_us <= at_us && at_us <= f.end_us.saturating_add(grace)
        })
        .map_or("none", |f| f.kind.name())
}

/// Counts by the kind of the latest fault whose window holds each time.
fn tally<'a>(kinds: impl Iterator<Item = &'a str>) -> BTreeMap<&'a str, u64> {
    let mut counts = BTreeMap::new();
    for kind in kinds {
        *counts.entry(kind).or_insert(0) += 1;
    }
    counts
}

/// A drop no fault explains, with the faults whose windows it fell in.
pub struct Unexplained {
    pub drop: DropSeen,
    pub during: Vec<String>,
}

/// The verdict on every drop.
pub struct Verdict {
    /// Explained drops by the kind of the fault that explains them.
    pub explained: BTreeMap<&'static str, u64>,
    pub unexplained: Vec<Unexplained>,
}

/// How much of drop `d`'s wait (from its latest delivery to its drop) the windows
/// of `faults` cover together.
fn covered(d: &DropSeen, faults: &[Seen], ttl: Duration) -> Duration {
    union_within(faults.iter().map(|f| window(f, ttl)), d.sent, d.at)
}

/// Whether the link was out of reach long enough to explain drop `d`: for `backend`, a
/// stall the call could have run into (the stall plus the command timeout and 0.5 s);
/// for `lost`, stalls, blackholes and Redis restarts that together cover at least half
/// a TTL of the lease's last stretch (a TTL, a renewal period and 0.5 s for the report,
/// back from the drop) — the same test as for one blackhole (SPEC §3: a lease is lost
/// only when the backend was out of reach for long enough).
fn stalled(
    d: &DropSeen,
    faults: &[Seen],
    stalls: &[Stall],
    waits: &[(String, Duration, Duration)],
    ttl: Duration,
) -> bool {
    match d.reason {
        "backend" => {
            let grace = COMMAND_TIMEOUT + Duration::from_millis(500);
            stalls
                .iter()
                .any(|s| d.sent <= s.end + grace && d.at >= s.start)
        }
        "lost" => {
            let reach = ttl + ttl / 3 + Duration::from_millis(500);
            let from = d.sent.max(d.at.saturating_sub(reach));
            let spans = stalls
                .iter()
                .map(|s| (s.start, s.end))
                .chain(
                    faults
                        .iter()
                        .filter(|f| matches!(f.kind, Kind::Blackhole | Kind::RedisRestart))
                        .map(|f| (f.start, f.end)),
                )
                // The dropping replica's renewal thread waiting for a CPU.
                .chain(
                    waits
                        .iter()
                        .filter(|w| d.replica.as_deref() == Some(w.0.as_str()))
                        .map(|w| (w.1, w.2)),
                );
            union_within(spans, from, d.at) * 2 >= ttl
        }
        _ => false,
    }
}

/// The total length of the union of `spans`, clipped to `from..to`.
fn union_within(
    spans: impl Iterator<Item = (Duration, Duration)>,
    from: Duration,
    to: Duration,
) -> Duration {
    let mut spans: Vec<(Duration, Duration)> = spans
        .map(|(open, close)| (open.max(from), close.min(to)))
        .filter(|(open, close)| open < close)
        .collect();
    spans.sort_unstable();
    let mut total = Duration::ZERO;
    let mut reach = Duration::ZERO;
    for (open, close) in spans {
        let open = open.max(reach);
        if close > open {
            total += close - open;
            reach = close;
        }
    }
    total
}

/// Sets every drop against the faults and the stalls the probe saw.
pub fn judge(
    drops: &[DropSeen],
    faults: &[Seen],
    stalls: &[Stall],
    waits: &[(String, Duration, Duration)],
    o: &ChaosOptions,
) -> Verdict {
    let mut explained = BTreeMap::new();
    let mut unexplained = Vec::new();
    for d in drops {
        if d.reason == "timeout"
            && !faults.iter().any(|f| explains(f, d, o))
            && covered(d, faults, o.lease_ttl) * 2 >= o.turn_wait
        {
            *explained.entry("storm").or_insert(0) += 1;
            continue;
        }
        match faults.iter().find(|f| explains(f, d, o)) {
            Some(f) => *explained.entry(f.kind.name()).or_insert(0) += 1,
            None if stalled(d, faults, stalls, &[], o.lease_ttl) => {
                *explained.entry("stall").or_insert(0) += 1;
            }
            None if stalled(d, faults, stalls, waits, o.lease_ttl) => {
                *explained.entry("starved").or_insert(0) += 1;
            }
            None => {
                let during = faults
                    .iter()
                    .filter(|f| overlaps(d, f, o.lease_ttl))
                    .map(|f| {
                        let who = f
                            .replica
                            .as_ref()
                            .map_or(String::new(), |r| format!(" {r}"));
                        format!("{}{who}@{:.1}s", f.kind.name(), f.start.as_secs_f64())
                    })
                    .collect();
                unexplained.push(Unexplained {
                    drop: d.clone(),
                    during,
                });
            }
        }
    }
    Verdict {
        explained,
        unexplained,
    }
}

#[derive(Serialize)]
struct Dropped {
    timeout: u64,
    lost: u64,
    backend: u64,
    shutting_down: u64,
}

impl Dropped {
    fn of(counts: [u64; 4]) -> Dropped {
        let [timeout, lost, backend, shutting_down] = counts;
        Dropped {
            timeout,
            lost,
            backend,
            shutting_down,
        }
    }
}

#[derive(Serialize)]
struct Violations {
    overlap: u64,
    order: u64,
    fence: u64,
    /// Updates that were not redelivered and still ended more than once.
    ended_twice: u64,
}

/// The JSON summary, the last line on stdout.
#[derive(Serialize)]
pub struct Summary {
    faults: BTreeMap<&'static str, u64>,
    faults_failed: u64,
    updates: usize,
    rounds: usize,
    handled: u64,
    recovered: u64,
    ran_then_dropped: u64,
    duplicates: u64,
    failed: u64,
    dropped: Dropped,
    explained: BTreeMap<&'static str, u64>,
    redelivered: u64,
    violations: Violations,
    silent_losses: u64,
    silent: BTreeMap<&'static str, u64>,
    unexplained_drops: u64,
    unexplained: Dropped,
    /// Unexplained drops by the latest fault whose window they fell in (`none`: no
    /// fault's).
    unexplained_during: BTreeMap<&'static str, u64>,
    /// Violations by the latest fault whose window the offending run started in.
    violations_during: BTreeMap<&'static str, u64>,
    /// What the link probe saw: its round trips and stalls (`probe.rs`).
    probe: ProbeStats,
    /// Updates whose first ending came more than `turn_wait` + 5 s after their
    /// latest delivery: a wait that outran its bound fails the verdict.
    late: u64,
    slowest_ms: u128,
    wall_s: f64,
    seed: u64,
    replicas: usize,
    replicas_started: usize,
    lease_ttl_ms: u128,
    turn_wait_ms: u128,
    rate: f64,
    notes: String,
    pub ok: bool,
}

/// Everything the summary is made from.
pub struct Inputs<'a> {
    pub o: &'a ChaosOptions,
    pub finished: &'a Finished,
    pub verdict: &'a Verdict,
    pub faults: &'a [Seen],
    pub probe: &'a ProbeStats,
    pub failed_faults: &'a [String],
}

/// The summary of a run.
pub fn summary(i: &Inputs<'_>) -> Summary {
    let f = i.finished;
    let mut faults: BTreeMap<&'static str, u64> = Kind::ALL.iter().map(|k| (k.name(), 0)).collect();
    for seen in i.faults {
        *faults.entry(seen.kind.name()).or_insert(0) += 1;
    }
    let mut silent: BTreeMap<&'static str, u64> = [("never_ended", 0), ("duplicate_only", 0)]
        .into_iter()
        .collect();
    for s in &f.silent {
        *silent.entry(s.how).or_insert(0) += 1;
    }
    let mut unexplained = [0u64; 4];
    for u in &i.verdict.unexplained {
        let k = REASONS
            .iter()
            .position(|r| *r == u.drop.reason)
            .unwrap_or(REASONS.len() - 1);
        if let Some(n) = unexplained.get_mut(k) {
            *n += 1;
        }
    }
    let violations = Violations {
        overlap: f.overlap,
        order: f.order,
        fence: f.fence,
        ended_twice: f.counts.ended_twice,
    };
    let violated =
        violations.overlap + violations.order + violations.fence + violations.ended_twice;
    let mut notes = f.notes.clone();
    notes.extend(i.failed_faults.iter().cloned());
    let rounds = f.trace.entries.len().checked_div(f.round_len).unwrap_or(0);
    let ok = violated == 0
        && f.silent.is_empty()
        && i.verdict.unexplained.is_empty()
        && f.counts.failed == 0
        && f.late == 0
        && i.failed_faults.is_empty()
        && i.faults.len() == i.o.faults
        && !f.stalled;
    Summary {
        faults,
        faults_failed: i.failed_faults.len() as u64,
        updates: f.trace.entries.len(),
        rounds,
        handled: f.counts.handled + f.counts.recovered,
        recovered: f.counts.recovered,
        ran_then_dropped: f.counts.ran_then_dropped,
        duplicates: f.counts.duplicates,
        failed: f.counts.failed,
        dropped: Dropped::of(f.counts.dropped),
        explained: i.verdict.explained.clone(),
        redelivered: f.counts.redelivered,
        violations,
        silent_losses: f.silent.len() as u64,
        silent,
        unexplained_drops: i.verdict.unexplained.len() as u64,
        unexplained: Dropped::of(unexplained),
        unexplained_during: tally(i.verdict.unexplained.iter().map(|u| {
            i.faults
                .iter()
                .rev()
                .find(|f| overlaps(&u.drop, f, i.o.lease_ttl))
                .map_or("none", |f| f.kind.name())
        })),
        violations_during: tally(
            f.violations_at
                .iter()
                .map(|(_, at)| during_us(*at, i.faults, i.o.lease_ttl)),
        ),
        probe: i.probe.clone(),
        late: f.late,
        slowest_ms: f.slowest.as_millis(),
        wall_s: (f.wall.as_secs_f64() * 10.0).round() / 10.0,
        seed: i.o.seed,
        replicas: i.o.replicas,
        replicas_started: f.replicas_started,
        lease_ttl_ms: i.o.lease_ttl.as_millis(),
        turn_wait_ms: i.o.turn_wait.as_millis(),
        rate: i.o.rate,
        notes: notes.join("; "),
        ok,
    }
}
