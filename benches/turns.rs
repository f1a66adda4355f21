//! Benchmarks of per-chat turns on the in-process `MemoryCoordinator`, each next to a
//! plain reference lock so the figures have something to be read against.
//!
//! Two references ("baselines"), the per-chat FIFO locks one would write by hand, with
//! no leases, no replicas, no fencing that survives a restart, and a blocked thread
//! per waiter:
//!
//! - **per-chat condvar lock**: a map of chat -> (mutex, condition variable) ticket
//!   lock, made on a chat's first ask and dropped once the chat is idle, so an ask on
//!   an idle chat allocates its entry (as the turn table does for a chat it has not
//!   seen). The one the turn table is held against (issue 11: at least as fast).
//! - **one-map ticket lock**: every chat's (next ticket, now serving) in one
//!   `Mutex<HashMap<String, _>>` and one `Condvar` woken with `notify_all`; entries are
//!   never dropped, so once warm it allocates nothing (and keeps every chat ever seen).
//!   Issue 2 asked the turn table to stay within 2x of it.
//!
//! Three workloads, after the spirit of W1 and W3 in `../shared/bench/FORMAT.md`:
//!
//! - **uncontended**: one replica takes and gives back the turn of distinct chats,
//!   cycling over 10,000 pre-built chat ids, nobody else around. Measured twice: as
//!   the criterion group `uncontended` (`turn_table/acquire_release`,
//!   `baseline/...`), and directly with `Instant` over 1,000,000 pairs
//!   (pairs/s) plus 100,000 pairs timed one by one (p50/p99 per pair, which include
//!   one clock read; its cost is printed alongside).
//! - **W1** (as FORMAT.md defines it): 10,000 chats never seen before, each once,
//!   every pair timed, on a lock made fresh for the round (a W1 worker is a fresh
//!   process); 21 rounds, the median round's pairs/s.
//!   `--profile-w1 ROUNDS` runs only the turn table's rounds, for a profiler
//!   (`turn-prepared`: on a coordinator prepared for the round's chats,
//!   `with_chat_capacity`);
//!   `--profile-w1 ROUNDS floor` the *contract floor* instead: the least state the
//!   turn's contract keeps for an uncontended pair (a token, a lease with its two clock
//!   reads, the chat's last holder), with nothing else around it.
//! - **hot_handoff** (W3 with a near-zero hold): 4 threads on ONE chat, each looping
//!   ask -> acquire -> critical section -> release, 20,000 acquisitions in all. For the
//!   turn table every thread is its own `Replica` over one shared coordinator; for the
//!   baseline they share the lock. The critical section is an "inside" flag (must be
//!   free on entry) and a sequence counter, so an exclusion failure would show, plus a
//!   5 us busy spin: with no hold at all, on 2 cores one thread can finish whole runs
//!   of turns before the others are even scheduled, and there is no handoff left to
//!   measure. The threads start together once all of them are running. Every
//!   acquisition records `t_req` (before asking), `t_acq` (held) and `t_rel` (before
//!   release) on one `Instant` base; the analysis puts them in grant order (fencing
//!   token, or the baseline's ticket) and derives:
//!   - handoff latency: for a release while another thread was already asking (the
//!     next holder's `t_req` < the previous `t_rel`), from that `t_rel` to the next
//!     holder's `t_acq`; p50/p99;
//!   - FIFO share: of the releases with someone waiting, the share granted to the
//!     thread that had been asking longest (timestamps are taken outside the lock, so
//!     a thread preempted between its `t_req` and its place in the queue can make a
//!     strictly FIFO lock score a little under 100%);
//!   - longest streak of one thread in grant order, and acquisitions per second.
//!
//! `cargo bench --bench turns` runs criterion's group, then the direct measurements,
//! prints a table and appends one JSON line per variant and workload, in the record
//! shape of FORMAT.md, to `target/bench-turns.jsonl`. Without `--bench` (as under
//! `cargo test --benches`) criterion runs each benchmark once and the direct part runs
//! a small smoke version and writes nothing.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use botmesh::{MemoryCoordinator, Replica, Turn};

#[path = "../examples/common/floor.rs"]
mod floor;
use criterion::{Criterion, criterion_group};
use floor::ContractFloor;
use serde_json::json;

/// Distinct chats the uncontended workloads cycle over.
const CHATS: usize = 10_000;
/// Pairs timed as one block for the uncontended pairs/s.
const UNCONTENDED_PAIRS: usize = 1_000_000;
/// Pairs timed one by one for the uncontended p50/p99.
const SAMPLED_PAIRS: usize = 100_000;
/// Threads sharing the hot chat.
const HOT_THREADS: usize = 4;
/// Acquisitions of the hot chat, all threads together.
const HOT_ACQUISITIONS: u64 = 20_000;
/// How long any acquire may wait; far above anything these workloads should see.
const WAIT: Duration = Duration::from_secs(30);
/// The hot chat's id.
const HOT_CHAT: &str = "hot";
/// How long a hot-chat holder keeps the turn: a busy spin, so the holder stays on its
/// core while the others queue up.
const HOLD_US: u64 = 5;

/// What both variants offer the workloads: take a chat's turn, read its token, give it
/// back.
trait ChatLock: Sync {
    type Held;
    fn lock(&self, chat: &str) -> Self::Held;
    fn token(held: &Self::Held) -> u64;
    fn unlock(&self, chat: &str, held: Self::Held);
}

impl ChatLock for Replica {
    type Held = Turn;

    fn lock(&self, chat: &str) -> Turn {
        self.acquire_timeout(chat, WAIT)
            .expect("the turn is granted well within the wait")
    }

    fn token(held: &Turn) -> u64 {
        held.fencing_token()
    }

    fn unlock(&self, _chat: &str, held: Turn) {
        held.release().expect("the turn was still held at release");
    }
}

/// The reference: a per-chat ticket lock in one mutex-protected map.
#[derive(Default)]
struct TicketLock {
    slots: Mutex<HashMap<String, ChatSlot>>,
    turn_changed: Condvar,
}

/// One chat of the reference lock. Slots are kept once made, so tickets keep growing
/// (they double as the fencing token) and the steady state allocates nothing.
#[derive(Default)]
struct ChatSlot {
    next_ticket: u64,
    now_serving: u64,
}

impl ChatLock for TicketLock {
    type Held = u64;

    fn lock(&self, chat: &str) -> u64 {
        let mut slots = self.slots.lock().expect("ticket lock poisoned");
        let ticket = match slots.get_mut(chat) {
            Some(slot) => {
                slot.next_ticket += 1;
                slot.next_ticket - 1
            }
            None => {
                slots.insert(
                    chat.to_owned(),
                    ChatSlot {
                        next_ticket: 1,
                        now_serving: 0,
                    },
                );
                0
            }
        };
        while slots.get(chat).map(|s| s.now_serving) != Some(ticket) {
            slots = self.turn_changed.wait(slots).expect("ticket lock poisoned");
        }
        ticket
    }

    fn token(held: &u64) -> u64 {
        *held
    }

    fn unlock(&self, chat: &str, held: u64) {
        let someone_waits = {
            let mut slots = self.slots.lock().expect("ticket lock poisoned");
            let slot = slots.get_mut(chat).expect("a held chat has a slot");
            debug_assert_eq!(slot.now_serving, held);
            slot.now_serving += 1;
            slot.next_ticket > slot.now_serving
        };
        if someone_waits {
            self.turn_changed.notify_all();
        }
    }
}

/// The reference a user would most likely write for a per-chat FIFO lock: one ticket
/// lock (a mutex and a condition variable) per chat, found through one map, made on
/// the first ask and dropped again once its chat is idle (nobody holds or waits), so a
/// quiet chat costs no memory. That makes an ask on an idle chat allocate its name and
/// its lock, as the turn table's state for a chat seen for the first time does.
#[derive(Default)]
struct PerChatTicketLock {
    chats: Mutex<HashMap<String, Arc<ChatTickets>>>,
    /// Fencing tokens: a chat's tickets start again at 0 once its lock was dropped, so
    /// the token is taken from one counter once the turn is held.
    last_token: AtomicU64,
}

#[derive(Default)]
struct ChatTickets {
    /// (next ticket, now serving); tickets double as the fencing token.
    state: Mutex<(u64, u64)>,
    turn_changed: Condvar,
}

impl ChatLock for PerChatTicketLock {
    /// The chat's lock, the ticket, the fencing token.
    type Held = (Arc<ChatTickets>, u64, u64);

    fn lock(&self, chat: &str) -> Self::Held {
        // The ticket is drawn under the map's lock (map, then chat: the order `unlock`
        // takes them in too), so a chat found in the map cannot be dropped as idle
        // before this ask counts in it.
        let (slot, ticket) = {
            let mut chats = self.chats.lock().expect("ticket lock poisoned");
            let slot = match chats.get(chat) {
                Some(slot) => slot.clone(),
                None => {
                    let slot = Arc::new(ChatTickets::default());
                    chats.insert(chat.to_owned(), slot.clone());
                    slot
                }
            };
            let (ticket, served) = {
                let mut state = slot.state.lock().expect("ticket lock poisoned");
                state.0 += 1;
                (state.0 - 1, state.1 == state.0 - 1)
            };
            (slot, (ticket, served))
        };
        let (ticket, served) = ticket;
        if !served {
            let mut state = slot.state.lock().expect("ticket lock poisoned");
            while state.1 != ticket {
                state = slot.turn_changed.wait(state).expect("ticket lock poisoned");
            }
        }
        let token = self.last_token.fetch_add(1, Ordering::Relaxed) + 1;
        (slot, ticket, token)
    }

    fn token(held: &Self::Held) -> u64 {
        held.2
    }

    fn unlock(&self, chat: &str, (slot, ticket, _): Self::Held) {
        // The map's lock first, so no ask can find the slot between the check that it
        // is idle and its removal.
        let mut chats = self.chats.lock().expect("ticket lock poisoned");
        let idle = {
            let mut state = slot.state.lock().expect("ticket lock poisoned");
            debug_assert_eq!(state.1, ticket);
            state.1 += 1;
            state.0 == state.1
        };
        if idle {
            chats.remove(chat);
        } else {
            drop(chats);
            slot.turn_changed.notify_all();
        }
    }
}

impl<const H: bool, const L: bool> ChatLock for ContractFloor<H, L> {
    type Held = floor::FloorHeld;

    fn lock(&self, chat: &str) -> Self::Held {
        ContractFloor::lock(self, chat)
    }

    fn token(held: &Self::Held) -> u64 {
        held.1
    }

    fn unlock(&self, chat: &str, held: Self::Held) {
        ContractFloor::unlock(self, chat, held);
    }
}

fn chat_ids() -> Vec<String> {
    (0..CHATS).map(|i| format!("chat-{i}")).collect()
}

fn start_replica(id: &str, coordinator: &Arc<MemoryCoordinator>) -> Replica {
    Replica::start(id, coordinator.clone()).expect("a memory replica starts")
}

/// One acquire+release of `chat`.
fn pair<L: ChatLock>(lock: &L, chat: &str) {
    let held = lock.lock(chat);
    black_box(L::token(&held));
    lock.unlock(chat, held);
}

fn bench_pairs<L: ChatLock>(c: &mut Criterion, group: &str, name: &str, lock: &L) {
    let chats = chat_ids();
    let mut next = 0;
    let mut g = c.benchmark_group(group);
    g.bench_function(name, |b| {
        b.iter(|| {
            pair(lock, &chats[next]);
            next = (next + 1) % chats.len();
        });
    });
    g.finish();
}

fn turn_table_pairs(c: &mut Criterion) {
    let coordinator = Arc::new(MemoryCoordinator::new());
    let replica = start_replica("bench-r1", &coordinator);
    bench_pairs(c, "turn_table", "acquire_release", &replica);
    replica.shutdown();
}

fn baseline_pairs(c: &mut Criterion) {
    bench_pairs(c, "baseline", "mutex_ticket_lock", &TicketLock::default());
}

fn per_chat_pairs(c: &mut Criterion) {
    bench_pairs(
        c,
        "baseline",
        "per_chat_condvar_lock",
        &PerChatTicketLock::default(),
    );
}

criterion_group! {
    name = uncontended;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = turn_table_pairs, per_chat_pairs, baseline_pairs
}

/// Nearest-rank quantile of sorted values.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ns_to_us(ns: u64) -> f64 {
    ns as f64 / 1_000.0
}

/// The median cost of one `Instant::now()` pair, included in every per-pair sample.
fn clock_overhead_ns() -> u64 {
    let mut v: Vec<u64> = (0..10_000)
        .map(|_| {
            let a = Instant::now();
            let b = Instant::now();
            b.duration_since(a).as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    quantile(&v, 0.5)
}

struct Uncontended {
    pairs: usize,
    sampled: usize,
    ops_per_s: f64,
    p50_ns: u64,
    p99_ns: u64,
}

fn measure_uncontended<L: ChatLock>(lock: &L, pairs: usize, sampled: usize) -> Uncontended {
    let chats = chat_ids();
    // One pass first, so every variant starts with its chats seen once.
    for chat in &chats {
        pair(lock, chat);
    }
    let start = Instant::now();
    for i in 0..pairs {
        pair(lock, &chats[i % chats.len()]);
    }
    let secs = start.elapsed().as_secs_f64();
    let mut each: Vec<u64> = (0..sampled)
        .map(|i| {
            let t = Instant::now();
            pair(lock, &chats[i % chats.len()]);
            t.elapsed().as_nanos() as u64
        })
        .collect();
    each.sort_unstable();
    Uncontended {
        pairs,
        sampled,
        ops_per_s: pairs as f64 / secs,
        p50_ns: quantile(&each, 0.5),
        p99_ns: quantile(&each, 0.99),
    }
}

/// One acquisition of the hot chat; times in ns since the run's base instant.
#[derive(Clone, Copy)]
struct Sample {
    t_req: u64,
    t_acq: u64,
    t_rel: u64,
    thread: usize,
    token: u64,
    seq: u64,
}

struct HotRun {
    samples: Vec<Sample>,
    secs: f64,
    overlaps: u64,
}

/// Runs the hot chat: thread `t` uses `locks[t]` (the same lock for every thread, or a
/// replica each).
fn run_hot<L: ChatLock>(locks: &[&L], acquisitions: u64) -> HotRun {
    let inside = AtomicBool::new(false);
    let seq = AtomicU64::new(0);
    let overlaps = AtomicU64::new(0);
    let start = Barrier::new(locks.len() + 1);
    let running = AtomicU64::new(0);
    let base = Instant::now();
    let since = |t: Instant| t.duration_since(base).as_nanos() as u64;
    let (samples, secs) = std::thread::scope(|s| {
        let handles: Vec<_> = locks
            .iter()
            .enumerate()
            .map(|(thread, lock)| {
                let (inside, seq, overlaps, start, running) =
                    (&inside, &seq, &overlaps, &start, &running);
                s.spawn(move || {
                    let mut mine = Vec::with_capacity(acquisitions as usize);
                    start.wait();
                    // Begin only once every thread is actually running: on 2 cores a
                    // thread woken by the barrier may otherwise wait out a whole time
                    // slice while the first one runs alone.
                    running.fetch_add(1, Ordering::AcqRel);
                    while running.load(Ordering::Acquire) < locks.len() as u64 {
                        std::thread::yield_now();
                    }
                    loop {
                        let t_req = since(Instant::now());
                        let held = lock.lock(HOT_CHAT);
                        let t_acq = since(Instant::now());
                        // The critical section: nobody else may be inside.
                        if inside.swap(true, Ordering::AcqRel) {
                            overlaps.fetch_add(1, Ordering::Relaxed);
                        }
                        let n = seq.fetch_add(1, Ordering::AcqRel);
                        let token = L::token(&held);
                        while since(Instant::now()) < t_acq + HOLD_US * 1_000 {
                            std::hint::spin_loop();
                        }
                        if !inside.swap(false, Ordering::AcqRel) {
                            overlaps.fetch_add(1, Ordering::Relaxed);
                        }
                        let t_rel = since(Instant::now());
                        lock.unlock(HOT_CHAT, held);
                        if n >= acquisitions {
                            break;
                        }
                        mine.push(Sample {
                            t_req,
                            t_acq,
                            t_rel,
                            thread,
                            token,
                            seq: n,
                        });
                    }
                    mine
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let samples: Vec<Sample> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("a hot-chat thread panicked"))
            .collect();
        (samples, t0.elapsed().as_secs_f64())
    });
    HotRun {
        samples,
        secs,
        overlaps: overlaps.into_inner(),
    }
}

struct HotStats {
    acquisitions: usize,
    ops_per_s: f64,
    handoffs: usize,
    handoff_p50_ns: u64,
    handoff_p99_ns: u64,
    fifo_pct: f64,
    max_streak: usize,
    wait_p50_ns: u64,
    wait_p99_ns: u64,
    max_wait_ns: u64,
    /// Overlaps the flag saw, plus grant-order pairs where token order and the counter
    /// taken inside the critical section disagree.
    violations: u64,
}

fn analyse_hot(run: HotRun) -> HotStats {
    let mut s = run.samples;
    s.sort_unstable_by_key(|x| x.token);
    let order_breaks = s.windows(2).filter(|w| w[0].seq >= w[1].seq).count() as u64;

    // Each thread's acquisitions, as positions in grant order.
    let mut by_thread: Vec<Vec<usize>> = vec![Vec::new(); HOT_THREADS];
    for (pos, x) in s.iter().enumerate() {
        by_thread[x.thread].push(pos);
    }
    let mut cursor = [0usize; HOT_THREADS];

    let mut handoff = Vec::new();
    let (mut decisions, mut fifo) = (0u64, 0u64);
    let (mut streak, mut max_streak) = (1usize, usize::from(!s.is_empty()));
    for i in 1..s.len() {
        let (prev, cur) = (s[i - 1], s[i]);
        if cur.t_req < prev.t_rel {
            handoff.push(cur.t_acq - prev.t_rel);
        }
        // Who was asking when `prev` released: each thread's first acquisition at or
        // after position i, if it had asked by then.
        let mut longest: Option<usize> = None;
        for (t, positions) in by_thread.iter().enumerate() {
            while cursor[t] < positions.len() && positions[cursor[t]] < i {
                cursor[t] += 1;
            }
            if let Some(&p) = positions.get(cursor[t])
                && s[p].t_req < prev.t_rel
                && longest.is_none_or(|l| s[p].t_req < s[l].t_req)
            {
                longest = Some(p);
            }
        }
        if let Some(l) = longest {
            decisions += 1;
            fifo += u64::from(l == i);
        }
        streak = if cur.thread == prev.thread {
            streak + 1
        } else {
            1
        };
        max_streak = max_streak.max(streak);
    }
    handoff.sort_unstable();
    let mut waits: Vec<u64> = s.iter().map(|x| x.t_acq - x.t_req).collect();
    waits.sort_unstable();
    HotStats {
        acquisitions: s.len(),
        ops_per_s: s.len() as f64 / run.secs,
        handoffs: handoff.len(),
        handoff_p50_ns: quantile(&handoff, 0.5),
        handoff_p99_ns: quantile(&handoff, 0.99),
        fifo_pct: if decisions == 0 {
            100.0
        } else {
            100.0 * fifo as f64 / decisions as f64
        },
        max_streak,
        wait_p50_ns: quantile(&waits, 0.5),
        wait_p99_ns: quantile(&waits, 0.99),
        max_wait_ns: waits.last().copied().unwrap_or(0),
        violations: run.overlaps + order_breaks,
    }
}

/// What every record of one run shares.
struct RunInfo {
    unix_s: u64,
    load_1m: Option<f64>,
    clock_ns: u64,
}

/// Adds the run-wide keys to a record's `extra`.
fn with_run(mut record: serde_json::Value, run: &RunInfo) -> serde_json::Value {
    if let Some(extra) = record
        .get_mut("extra")
        .and_then(serde_json::Value::as_object_mut)
    {
        extra.insert("lib_version".into(), env!("CARGO_PKG_VERSION").into());
        extra.insert("unix_time_s".into(), run.unix_s.into());
        extra.insert("loadavg_1m".into(), run.load_1m.into());
        extra.insert("clock_overhead_ns".into(), run.clock_ns.into());
    }
    record
}

fn uncontended_record(
    peer: &str,
    workload: &str,
    u: &Uncontended,
    run: &RunInfo,
) -> serde_json::Value {
    let notes = if workload == "W1" {
        "in-process; chats never seen before, each once; pairs/s of the median round; \
         per-pair p50/p99 include one clock read"
    } else {
        "in-process; per-pair p50/p99 include one clock read"
    };
    let record = json!({
        "peer": peer,
        "workload": workload,
        "params": {
            "processes": 1, "workers_per_process": 1, "keys": CHATS,
            "pairs": u.pairs, "sampled_pairs": u.sampled, "backend": "memory",
            "scale": 1.0,
        },
        "ops_per_s": round1(u.ops_per_s),
        "p50_us": ns_to_us(u.p50_ns),
        "p99_us": ns_to_us(u.p99_ns),
        "exclusion_violations": 0,
        "notes": notes,
        "extra": {},
    });
    with_run(record, run)
}

fn hot_record(peer: &str, h: &HotStats, run: &RunInfo) -> serde_json::Value {
    let notes = match peer {
        "botmesh-memory" => {
            "in-process threads, one Replica each, over one MemoryCoordinator; hold is a busy spin"
        }
        "baseline-per-chat-condvar" => {
            "in-process threads sharing one per-chat condvar ticket lock; hold is a busy spin"
        }
        _ => "in-process threads sharing one Mutex<HashMap> ticket lock; hold is a busy spin",
    };
    let record = json!({
        "peer": peer,
        "workload": "hot_handoff",
        "params": {
            "processes": 1, "workers_per_process": HOT_THREADS, "cs": "mem",
            "acquisitions": h.acquisitions, "hold_us": HOLD_US, "backend": "memory",
            "scale": 1.0,
        },
        "ops_per_s": round1(h.ops_per_s),
        "p50_us": ns_to_us(h.handoff_p50_ns),
        "p99_us": ns_to_us(h.handoff_p99_ns),
        "exclusion_violations": h.violations,
        "max_streak": h.max_streak,
        "notes": notes,
        "extra": {
            "fifo_grant_pct": round1(h.fifo_pct),
            "handoffs": h.handoffs,
            "wait_p50_us": ns_to_us(h.wait_p50_ns),
            "wait_p99_us": ns_to_us(h.wait_p99_ns),
            "max_wait_us": ns_to_us(h.max_wait_ns),
        },
    });
    with_run(record, run)
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The 1-minute load average, to judge how quiet the machine was (Linux only).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn append_records(records: &[serde_json::Value]) -> std::io::Result<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-turns.jsonl");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
    for r in records {
        writeln!(file, "{r}")?;
    }
    Ok(path)
}

/// W1 as FORMAT.md has it: `CHATS` chats never seen before, each once, timed one by
/// one, on a lock made fresh (as a W1 worker process starts with one); `rounds` times.
/// `with_lock` makes the lock, runs the round on it and takes it down after (a
/// replica's shutdown is outside the timing). Returns the median round's pairs/s and
/// the p50/p99 per pair over all rounds.
fn measure_w1(rounds: usize, with_lock: impl Fn(&mut dyn FnMut(&dyn W1Lock))) -> Uncontended {
    let mut rates = Vec::with_capacity(rounds);
    let mut each = Vec::with_capacity(rounds * CHATS);
    let chats: Vec<String> = (0..CHATS).map(|i| i.to_string()).collect();
    for _ in 0..rounds {
        with_lock(&mut |lock| {
            let (rate, times) = lock.round(&chats);
            rates.push(rate);
            each.extend(times);
        });
    }
    rates.sort_by(f64::total_cmp);
    each.sort_unstable();
    Uncontended {
        pairs: rounds * CHATS,
        sampled: each.len(),
        ops_per_s: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
        p50_ns: quantile(&each, 0.5),
        p99_ns: quantile(&each, 0.99),
    }
}

/// One W1 round on some lock: (pairs/s, each pair's ns).
trait W1Lock {
    fn round(&self, chats: &[String]) -> (f64, Vec<u64>);
}

impl<L: ChatLock> W1Lock for L {
    // Never inlined, so `callgrind_annotate` finds every variant's round by this name.
    #[inline(never)]
    fn round(&self, chats: &[String]) -> (f64, Vec<u64>) {
        let mut each = Vec::with_capacity(chats.len());
        let start = Instant::now();
        let mut last = start;
        for chat in chats {
            pair(self, chat);
            let t = Instant::now();
            each.push(t.duration_since(last).as_nanos() as u64);
            last = t;
        }
        (chats.len() as f64 / start.elapsed().as_secs_f64(), each)
    }
}

/// [`measure_w1`] of the turn table: a coordinator and a replica per round, the
/// coordinator prepared for the round's chats (`with_chat_capacity`) when `prepared`.
fn w1_turn_table(rounds: usize, prepared: bool) -> Uncontended {
    measure_w1(rounds, |round| {
        let capacity = if prepared { CHATS } else { 0 };
        let coordinator = Arc::new(MemoryCoordinator::new().with_chat_capacity(capacity));
        let replica = start_replica("w1-r1", &coordinator);
        round(&replica);
        replica.shutdown();
    })
}

/// Rounds of W1 per variant in the direct part.
const W1_ROUNDS: usize = 21;

/// The variants as the tables name them, with their record's peer.
const VARIANTS: [(&str, &str); 3] = [
    ("turn table (memory)", "botmesh-memory"),
    ("per-chat condvar lock", "baseline-per-chat-condvar"),
    ("one-map ticket lock", "baseline-mutex"),
];

/// The measurements criterion does not do: uncontended pairs timed directly, W1 on
/// fresh chats and the hot chat handoff, for every variant.
fn direct_measurements(full: bool) {
    let (pairs, sampled, hot, w1_rounds) = if full {
        (
            UNCONTENDED_PAIRS,
            SAMPLED_PAIRS,
            HOT_ACQUISITIONS,
            W1_ROUNDS,
        )
    } else {
        (20_000, 2_000, 400, 1)
    };
    let clock_ns = clock_overhead_ns();
    let load_1m = load_average();

    let coordinator = Arc::new(MemoryCoordinator::new());
    let replica = start_replica("uncontended-r1", &coordinator);
    let turn_u = measure_uncontended(&replica, pairs, sampled);
    replica.shutdown();
    let per_chat = PerChatTicketLock::default();
    let per_u = measure_uncontended(&per_chat, pairs, sampled);
    let one_map = TicketLock::default();
    let base_u = measure_uncontended(&one_map, pairs, sampled);
    let turn_w1 = w1_turn_table(w1_rounds, false);
    let per_w1 = measure_w1(w1_rounds, |round| round(&PerChatTicketLock::default()));
    let base_w1 = measure_w1(w1_rounds, |round| round(&TicketLock::default()));

    let coordinator = Arc::new(MemoryCoordinator::new());
    let replicas: Vec<Replica> = (0..HOT_THREADS)
        .map(|i| start_replica(&format!("hot-r{i}"), &coordinator))
        .collect();
    let turn_h = analyse_hot(run_hot(&replicas.iter().collect::<Vec<_>>(), hot));
    for r in replicas {
        r.shutdown();
    }
    let lock = PerChatTicketLock::default();
    let per_h = analyse_hot(run_hot(&[&lock; HOT_THREADS], hot));
    let lock = TicketLock::default();
    let base_h = analyse_hot(run_hot(&[&lock; HOT_THREADS], hot));

    println!();
    if let Some(load) = load_1m {
        println!(
            "load average (1 min) before the direct part: {load:.2} on {} cpus",
            cpus()
        );
    }
    let row = |name: &str, u: &Uncontended| {
        println!(
            "  {:<22} {:>12.0} {:>10} {:>10}",
            name, u.ops_per_s, u.p50_ns, u.p99_ns
        );
    };
    println!(
        "uncontended: acquire+release of {CHATS} distinct chats in turn, {pairs} pairs \
         (p50/p99 from {sampled} pairs timed one by one; a clock read costs ~{clock_ns} ns)"
    );
    println!(
        "  {:<22} {:>12} {:>10} {:>10}",
        "variant", "pairs/s", "p50 ns", "p99 ns"
    );
    for ((name, _), u) in VARIANTS.iter().zip([&turn_u, &per_u, &base_u]) {
        row(name, u);
    }
    println!();
    println!(
        "W1: {CHATS} chats never seen before, each once, on a fresh lock, {w1_rounds} rounds \
         (pairs/s: the median round; p50/p99 per pair over all rounds, one clock read each)"
    );
    println!(
        "  {:<22} {:>12} {:>10} {:>10}",
        "variant", "pairs/s", "p50 ns", "p99 ns"
    );
    for ((name, _), u) in VARIANTS.iter().zip([&turn_w1, &per_w1, &base_w1]) {
        row(name, u);
    }
    println!();
    println!(
        "hot_handoff: {HOT_THREADS} threads on one chat, {hot} acquisitions, hold {HOLD_US} us \
         spin (turn table: one replica per thread)"
    );
    println!(
        "  {:<22} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9} {:>11} {:>6}",
        "variant",
        "acq/s",
        "hand p50",
        "hand p99",
        "FIFO %",
        "streak",
        "handoffs",
        "wait p99",
        "viol."
    );
    for ((name, _), h) in VARIANTS.iter().zip([&turn_h, &per_h, &base_h]) {
        println!(
            "  {:<22} {:>10.0} {:>8.1}us {:>8.1}us {:>8.1} {:>7} {:>9} {:>9.1}us {:>6}",
            name,
            h.ops_per_s,
            ns_to_us(h.handoff_p50_ns),
            ns_to_us(h.handoff_p99_ns),
            h.fifo_pct,
            h.max_streak,
            h.handoffs,
            ns_to_us(h.wait_p99_ns),
            h.violations
        );
    }
    println!();
    println!(
        "turn table / per-chat condvar lock: uncontended {:.2}x, W1 {:.2}x (pairs/s, over 1 \
         is faster); handoff p50 {:.1} us (target <= 10 us)",
        turn_u.ops_per_s / per_u.ops_per_s,
        turn_w1.ops_per_s / per_w1.ops_per_s,
        ns_to_us(turn_h.handoff_p50_ns),
    );

    if !full {
        return;
    }
    let run = RunInfo {
        unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        load_1m,
        clock_ns,
    };
    let mut records = Vec::new();
    for (i, (_, peer)) in VARIANTS.iter().enumerate() {
        let u = [&turn_u, &per_u, &base_u][i];
        let w = [&turn_w1, &per_w1, &base_w1][i];
        let h = [&turn_h, &per_h, &base_h][i];
        records.push(uncontended_record(peer, "uncontended", u, &run));
        records.push(uncontended_record(peer, "W1", w, &run));
        records.push(hot_record(peer, h, &run));
    }
    match append_records(&records) {
        Ok(path) => println!("appended {} records to {}", records.len(), path.display()),
        Err(e) => eprintln!("cannot append the records to target/bench-turns.jsonl: {e}"),
    }
}

/// `turns --profile-w1 ROUNDS [turn|turn-prepared|per-chat|one-map|floor|floor-no-lease|
/// floor-no-history|floor-map-token]`: only one variant's W1 rounds
/// (the turn table's by default; an unknown name is refused), for a profiler (`valgrind --tool=callgrind`),
/// nothing printed but the rate.
fn profile_w1(rounds: usize, variant: &str) {
    let w1 = match variant {
        "per-chat" => measure_w1(rounds, |round| round(&PerChatTicketLock::default())),
        "one-map" => measure_w1(rounds, |round| round(&TicketLock::default())),
        "floor" => measure_w1(rounds, |round| {
            round(&ContractFloor::<true, true>::default())
        }),
        "floor-no-lease" => measure_w1(rounds, |round| {
            round(&ContractFloor::<true, false>::default())
        }),
        "floor-no-history" => measure_w1(rounds, |round| {
            round(&ContractFloor::<false, true>::default())
        }),
        "floor-map-token" => measure_w1(rounds, |round| {
            round(&ContractFloor::<false, false>::default())
        }),
        "turn" => w1_turn_table(rounds, false),
        "turn-prepared" => w1_turn_table(rounds, true),
        other => {
            eprintln!(
                "turns --profile-w1: {other:?} is not a variant (turn, turn-prepared, per-chat, \
                 one-map, floor, \
                 floor-no-lease, floor-no-history, floor-map-token)"
            );
            std::process::exit(2);
        }
    };
    println!(
        "W1 {variant}: {:.0} pairs/s, p50 {} ns",
        w1.ops_per_s, w1.p50_ns
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--profile-w1") {
        let rounds = args.get(at + 1).and_then(|n| n.parse().ok()).unwrap_or(1);
        let variant = args.get(at + 2).map_or("turn", String::as_str);
        return profile_w1(rounds, variant);
    }
    uncontended();
    Criterion::default().configure_from_args().final_summary();
    if args.iter().any(|a| a == "--list" || a == "--profile-time") {
        return;
    }
    // `cargo bench` passes `--bench`; without it (cargo test) only a smoke run.
    direct_measurements(args.iter().any(|a| a == "--bench"));
}
