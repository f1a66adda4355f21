//! # bench_worker: botmesh under the shared benchmark harness
//!
//! One worker process of the benchmark protocol in `../shared/bench/FORMAT.md`. The
//! harness starts `--replicas` copies, each with `--threads` worker threads, sends
//! `GO`, and computes every figure itself from the raw timestamps this worker writes.
//!
//! ```text
//! cargo build --release --example bench_worker
//! target/release/examples/bench_worker --workload W2 --replica 0 --replicas 4 \
//!     --threads 4 --chats 1000 --messages 20000 --cs redis --port 6379 \
//!     --deadline-ms 120000 --out w2-r0.json
//! ```
//!
//! ## Protocol
//!
//! The worker connects (the coordinator, one [`Replica`] named `r<replica>` shared by
//! all its threads, and one plain Redis connection per thread for the critical
//! section), starts its threads, prints `READY`, waits for the line `GO` on stdin, runs,
//! writes `--out` atomically (a temporary file in the same folder, then a rename),
//! prints `DONE` and exits 0. Exit status 2: the command line was refused; 1: setup or
//! the run failed (the reason on stderr).
//!
//! Workloads (worker `g = replica * threads + t` of `R * T`):
//!
//! - **W1**: chats `g, g + R*T, …` below `--keys`, each once: acquire → release.
//! - **W2**: messages `g, g + R*T, …` below `--messages`, message `m` on chat
//!   `chat_of(m, seed, chats)`: acquire → critical section → release. With `--cs redis`
//!   the critical section is the pipeline `SET cs:<c> 1 NX PX 60000` + `GET cnt:<c>`,
//!   then the pipeline `SET cnt:<c> <v+1>` + `DEL cs:<c>`; with `--cs mem` the same on
//!   in-process atomics, whose per-chat counters are written as `mem_counts`.
//! - **W3**: every worker loops on chat `hot`: acquire → pipeline
//!   `SET cs:hot 1 NX PX 60000` + `INCR seq:hot` → hold `--hold-us` (a blocking sleep)
//!   → `DEL cs:hot` → release, and stops once the sequence passed `--acquisitions`. The
//!   acquisition that drew a value above N is recorded (it is a real grant, `k > N`
//!   marks it) but does not hold; a round whose `INCR` failed has no `k` and is only
//!   counted in `errors`. With `--cs mem` the flag and the sequence are in-process
//!   atomics and `mem_counts` is `[last sequence value]`.
//!
//! SIGTERM or SIGINT: before `GO` the worker shuts its replica down and exits 1; after
//! it, each thread stops at its next acquisition (as at the deadline, so `incomplete`
//! is set), the replica shuts down (releasing every turn), and `--out` is written as
//! usual.
//!
//! A sample `[t_req, t_acq, t_rel, t_done, k]` is written per acquisition, in
//! CLOCK_MONOTONIC nanoseconds (read with `rustix`, no `unsafe`). `overlaps` counts the
//! messages whose "inside" flag was not free on entry or not still set on exit;
//! `errors` counts refused or failed calls (acquire, critical section, release);
//! `acquire_timeouts` counts waits cut by the deadline; `incomplete` says the deadline
//! (or too many errors) stopped the worker before its count. Every loop is bounded by
//! its count and by `--deadline-ms`, counted from `GO`.
//!
//! ## Backends
//!
//! `--backend redis` (default): a [`RedisCoordinator`] at `127.0.0.1:<port>` with lease
//! TTL `--ttl-ms`; any number of processes share its turns. `--backend memory`: a
//! [`MemoryCoordinator`], whose turns exist only inside one process, so it requires
//! `--replicas 1` (run several workers with `--threads` instead); anything else is
//! refused rather than measured as if the processes excluded each other. Its table
//! grows as it goes, as `MemoryCoordinator::new()`'s does; `--chat-capacity auto`
//! prepares it before `READY` for the chats the workload touches
//! (`MemoryCoordinator::with_chat_capacity`, as a bot that knows its chat count would
//! configure `chatCapacity`). Redis is still
//! used for the critical section with `--cs redis` (and for W3's sequence).
//! `--backend contract-floor`: no botmesh turn at all, but the bench's contract floor
//! (`examples/common/floor.rs`: the least state the turn's contract keeps for an
//! uncontended pair, with no queue), a yardstick for W1 measured in this worker's
//! frame; W1 only, as it is no lock.

#![forbid(unsafe_code)]

#[path = "common/floor.rs"]
mod floor;
#[path = "common/signals.rs"]
mod signals;

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use botmesh::DEFAULT_DEDUP_WINDOW;
use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::{Coordinator, MemoryCoordinator, Reason, Replica};
use parking_lot::{Condvar, Mutex};

const USAGE: &str = "\
usage: bench_worker --workload W1|W2|W3 --out FILE [options]

  --workload W1|W2|W3   the workload (see the shared benchmark format, bench/FORMAT.md)
  --replica I           this process's index, 0-based          (default 0)
  --replicas R          processes in the run                   (default 1)
  --threads T           worker threads in this process         (default 1)
  --keys K              W1: distinct chats                     (default 10000)
  --chats C             W2: chats                              (default 1000)
  --messages M          W2: messages                           (default 20000)
  --acquisitions N      W3: stop once the sequence passes N    (default 2000)
  --hold-us H           W3: hold time in microseconds          (default 1000)
  --ttl-ms L            lease TTL in milliseconds              (default 10000)
  --seed S              seed of chat_of                        (default 12345)
  --cs redis|mem        where the critical section works       (default redis)
  --port P              Redis at 127.0.0.1:P                   (default 6379)
  --deadline-ms D       bound of the run from GO               (default 600000)
  --backend redis|memory|contract-floor
                        the coordinator (memory needs --replicas 1; contract-floor,
                        a yardstick of W1's least cost, is no lock: W1 only)
                        (default redis)
  --chat-capacity N|auto
                        --backend memory: chats the table is prepared for before
                        READY (MemoryCoordinator::with_chat_capacity); auto: the
                        chats the workload touches (W1 --keys, W2 --chats, W3 1);
                        0: none, the table grows as it goes, as the library's
                        default                                   (default 0)
  --out FILE            where the samples go (JSON, written atomically)

Prints READY once connected, waits for the line GO on stdin, runs, writes FILE,
prints DONE. Exit status 2: bad command line; 1: setup or run failed.";

/// Errors in a row after which a W3 worker gives up (each followed by a short pause).
const MAX_ERRORS_IN_A_ROW: u32 = 200;
/// Read/write timeout of the critical-section connections.
const CS_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    W1,
    W2,
    W3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CsKind {
    Redis,
    Mem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Redis,
    Memory,
    /// The bench's contract floor in place of the turn (see the module docs).
    ContractFloor,
}

#[derive(Debug)]
struct Options {
    workload: Workload,
    replica: u64,
    replicas: u64,
    threads: u64,
    keys: u64,
    chats: u64,
    messages: u64,
    acquisitions: u64,
    hold_us: u64,
    ttl_ms: u64,
    seed: u64,
    cs: CsKind,
    port: u16,
    deadline_ms: u64,
    backend: Backend,
    /// `--chat-capacity`: `None` is `auto`. Default 0, the library's default: a
    /// prepared table's memory is also still in the cache of the core that prepared
    /// it, which a bot's would not be (README, *Turn table, in process*).
    chat_capacity: Option<u64>,
    out: PathBuf,
}

enum Command {
    Run(Box<Options>),
    Help,
}

fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    use lexopt::prelude::*;

    let mut workload = None;
    let mut out = None;
    let mut o = Options {
        workload: Workload::W1,
        replica: 0,
        replicas: 1,
        threads: 1,
        keys: 10_000,
        chats: 1_000,
        messages: 20_000,
        acquisitions: 2_000,
        hold_us: 1_000,
        ttl_ms: 10_000,
        seed: 12_345,
        cs: CsKind::Redis,
        port: 6379,
        deadline_ms: 600_000,
        backend: Backend::Redis,
        chat_capacity: Some(0),
        out: PathBuf::new(),
    };
    let mut parser = lexopt::Parser::from_args(args);
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("workload") => {
                workload = Some(match text(&mut parser, "--workload")?.as_str() {
                    "W1" | "w1" => Workload::W1,
                    "W2" | "w2" => Workload::W2,
                    "W3" | "w3" => Workload::W3,
                    v => return Err(format!("--workload: {v:?} is not W1, W2 or W3")),
                });
            }
            Long("replica") => o.replica = number(&mut parser, "--replica", 0, 1 << 20)?,
            Long("replicas") => o.replicas = number(&mut parser, "--replicas", 1, 1 << 20)?,
            Long("threads") => o.threads = number(&mut parser, "--threads", 1, 4096)?,
            Long("keys") => o.keys = number(&mut parser, "--keys", 0, 1 << 40)?,
            Long("chats") => o.chats = number(&mut parser, "--chats", 1, 1 << 40)?,
            Long("messages") => o.messages = number(&mut parser, "--messages", 0, 1 << 40)?,
            Long("acquisitions") => {
                o.acquisitions = number(&mut parser, "--acquisitions", 0, 1 << 40)?;
            }
            Long("hold-us") => o.hold_us = number(&mut parser, "--hold-us", 0, 60_000_000)?,
            Long("ttl-ms") => o.ttl_ms = number(&mut parser, "--ttl-ms", 10, 86_400_000)?,
            Long("seed") => o.seed = number(&mut parser, "--seed", 0, u64::MAX)?,
            Long("cs") => {
                o.cs = match text(&mut parser, "--cs")?.as_str() {
                    "redis" => CsKind::Redis,
                    "mem" => CsKind::Mem,
                    v => return Err(format!("--cs: {v:?} is not redis or mem")),
                };
            }
            Long("port") => {
                let p = number(&mut parser, "--port", 1, u64::from(u16::MAX))?;
                o.port = u16::try_from(p).map_err(|_| format!("--port: {p} is out of range"))?;
            }
            Long("deadline-ms") => {
                o.deadline_ms = number(&mut parser, "--deadline-ms", 1, 2_147_483_647)?;
            }
            Long("backend") => {
                o.backend = match text(&mut parser, "--backend")?.as_str() {
                    "redis" => Backend::Redis,
                    "memory" => Backend::Memory,
                    "contract-floor" => Backend::ContractFloor,
                    v => {
                        return Err(format!(
                            "--backend: {v:?} is not redis, memory or contract-floor"
                        ));
                    }
                };
            }
            Long("chat-capacity") => {
                o.chat_capacity = match text(&mut parser, "--chat-capacity")?.as_str() {
                    "auto" => None,
                    v => Some(v.parse().ok().filter(|n| *n <= 1 << 24).ok_or_else(|| {
                        format!("--chat-capacity: {v:?} is not auto or a number from 0 to 16777216")
                    })?),
                };
            }
            Long("out") => {
                out = Some(PathBuf::from(
                    parser
                        .value()
                        .map_err(|_| "--out: missing value".to_owned())?,
                ));
            }
            Short('h') | Long("help") => return Ok(Command::Help),
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    o.workload = workload.ok_or("--workload is required (W1, W2 or W3)")?;
    o.out = out.ok_or("--out is required (the file the samples are written to)")?;
    if o.replica >= o.replicas {
        return Err(format!(
            "--replica: {} is not below --replicas {}",
            o.replica, o.replicas
        ));
    }
    if o.backend == Backend::ContractFloor && o.workload != Workload::W1 {
        return Err(format!(
            "--backend contract-floor: a yardstick of W1's least cost, not a lock (a second \
             ask of a held chat would panic); it runs W1 only, not {:?}",
            o.workload
        ));
    }
    if o.backend != Backend::Redis && o.replicas > 1 {
        return Err(format!(
            "--backend {}: its turns live inside one process, so {} processes would not \
             exclude each other; use --replicas 1 with --threads T, or --backend redis",
            backend_name(o.backend),
            o.replicas
        ));
    }
    Ok(Command::Run(Box::new(o)))
}

fn text(parser: &mut lexopt::Parser, flag: &str) -> Result<String, String> {
    parser
        .value()
        .map_err(|_| format!("{flag}: missing value"))?
        .into_string()
        .map_err(|v| format!("{flag}: {v:?} is not valid UTF-8"))
}

fn number(parser: &mut lexopt::Parser, flag: &str, min: u64, max: u64) -> Result<u64, String> {
    let v = text(parser, flag)?;
    match v.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag}: {v:?} is not a whole number from {min} to {max}"
        )),
    }
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the host.
fn now_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

/// MurmurHash3's 32-bit finaliser.
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^= h >> 16;
    h
}

/// The chat of message `m`: `fmix32((m XOR seed) mod 2^32) mod chats`.
fn chat_of(m: u64, seed: u64, chats: u64) -> u64 {
    // Truncation to 32 bits is the `mod 2^32` of the definition.
    u64::from(fmix32((m ^ seed) as u32)) % chats
}

/// The in-process critical section of `--cs mem`: a flag and a counter per chat.
struct MemCs {
    inside: Vec<AtomicBool>,
    counts: Vec<AtomicU64>,
}

impl MemCs {
    fn new(chats: usize) -> Self {
        MemCs {
            inside: (0..chats).map(|_| AtomicBool::new(false)).collect(),
            counts: (0..chats).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Sets the flag (was it free?) and reads the counter.
    fn enter(&self, c: usize) -> (bool, u64) {
        let free = !self.inside[c].swap(true, Ordering::AcqRel);
        (free, self.counts[c].load(Ordering::Acquire))
    }

    /// Writes the counter (non-atomically with the read) and clears the flag (was it
    /// still set?).
    fn exit(&self, c: usize, value: u64) -> bool {
        self.counts[c].store(value, Ordering::Release);
        self.inside[c].swap(false, Ordering::AcqRel)
    }
}

/// Where one worker thread does its critical section.
enum Cs<'a> {
    Redis(redis::Connection),
    Mem(&'a MemCs),
}

impl Cs<'_> {
    /// W2's critical section on chat `c`; `Ok(true)` when the flag showed an overlap.
    fn message(&mut self, c: u64) -> Result<bool, String> {
        match self {
            Cs::Redis(con) => {
                let flag = format!("cs:{c}");
                let counter = format!("cnt:{c}");
                let (set, value): (Option<String>, Option<u64>) = redis::pipe()
                    .cmd("SET")
                    .arg(&flag)
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(60_000)
                    .cmd("GET")
                    .arg(&counter)
                    .query(con)
                    .map_err(|e| format!("critical section (enter): {e}"))?;
                let (_, deleted): (redis::Value, u64) = redis::pipe()
                    .cmd("SET")
                    .arg(&counter)
                    .arg(value.unwrap_or(0) + 1)
                    .cmd("DEL")
                    .arg(&flag)
                    .query(con)
                    .map_err(|e| format!("critical section (exit): {e}"))?;
                Ok(set.is_none() || deleted != 1)
            }
            Cs::Mem(mem) => {
                let c = usize::try_from(c).map_err(|_| "chat index out of range".to_owned())?;
                let (free, value) = mem.enter(c);
                let still_set = mem.exit(c, value + 1);
                Ok(!free || !still_set)
            }
        }
    }

    /// W3's entry on the hot chat: (was the flag free, the new sequence value).
    fn hot_enter(&mut self) -> Result<(bool, u64), String> {
        match self {
            Cs::Redis(con) => {
                let (set, seq): (Option<String>, u64) = redis::pipe()
                    .cmd("SET")
                    .arg("cs:hot")
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(60_000)
                    .cmd("INCR")
                    .arg("seq:hot")
                    .query(con)
                    .map_err(|e| format!("critical section (enter): {e}"))?;
                Ok((set.is_some(), seq))
            }
            Cs::Mem(mem) => {
                let free = !mem.inside[0].swap(true, Ordering::AcqRel);
                Ok((free, mem.counts[0].fetch_add(1, Ordering::AcqRel) + 1))
            }
        }
    }

    /// W3's exit: was the flag still set?
    fn hot_exit(&mut self) -> Result<bool, String> {
        match self {
            Cs::Redis(con) => {
                let deleted: u64 = redis::cmd("DEL")
                    .arg("cs:hot")
                    .query(con)
                    .map_err(|e| format!("critical section (exit): {e}"))?;
                Ok(deleted == 1)
            }
            Cs::Mem(mem) => Ok(mem.inside[0].swap(false, Ordering::AcqRel)),
        }
    }
}

/// What one worker thread reports.
#[derive(Default)]
struct WorkerOut {
    id: String,
    samples: Vec<[u64; 5]>,
    errors: u64,
    acquire_timeouts: u64,
    overlaps: u64,
    incomplete: bool,
}

/// The start line: worker threads wait here until `GO` (with the run's deadline) or
/// until the run is called off.
#[derive(Default)]
struct Gate {
    /// `None` while closed; `Some(Some(deadline))` at `GO`; `Some(None)` when called off.
    state: Mutex<Option<Option<Instant>>>,
    cv: Condvar,
}

impl Gate {
    fn open(&self, deadline: Option<Instant>) {
        *self.state.lock() = Some(deadline);
        self.cv.notify_all();
    }

    fn wait(&self) -> Option<Instant> {
        let mut state = self.state.lock();
        loop {
            if let Some(opened) = *state {
                return opened;
            }
            self.cv.wait(&mut state);
        }
    }
}

/// What a worker thread needs besides its critical section.
struct Job<'a> {
    o: &'a Options,
    replica: &'a Replica,
    /// `--backend contract-floor`: taken and given back instead of the replica's turn.
    floor: Option<&'a floor::ContractFloor>,
    gate: &'a Gate,
    /// Raised by SIGTERM / SIGINT: stop as at the deadline.
    stop: &'a AtomicBool,
    t: u64,
}

/// Result of one acquire → work → release round.
enum Round {
    Done,
    /// The deadline passed (before asking, or while waiting).
    Deadline,
    /// The acquire failed otherwise (counted in `errors`).
    Failed,
}

impl Job<'_> {
    /// Acquires `chat`, runs `work` under the turn, releases, and records the sample
    /// with the `k` that `work` returns. `None` means the work failed before it learnt
    /// its `k` (W3's `INCR`): the turn is still released, but no sample is recorded.
    fn round(
        &self,
        out: &mut WorkerOut,
        deadline: Instant,
        chat: &str,
        work: impl FnOnce(&mut WorkerOut) -> Option<u64>,
    ) -> Round {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() || signals::raised(self.stop) {
            return Round::Deadline;
        }
        if let Some(floor) = self.floor {
            let t_req = now_ns();
            let held = floor.lock(chat);
            let t_acq = now_ns();
            let k = work(out);
            let t_rel = now_ns();
            floor.unlock(chat, held);
            let t_done = now_ns();
            if let Some(k) = k {
                out.samples.push([t_req, t_acq, t_rel, t_done, k]);
            }
            return Round::Done;
        }
        let t_req = now_ns();
        let turn = match self.replica.acquire_timeout(chat, wait) {
            Ok(turn) => turn,
            Err(e) if e.reason == Reason::Timeout => {
                out.acquire_timeouts += 1;
                return Round::Deadline;
            }
            Err(e) => {
                out.errors += 1;
                eprintln!("bench_worker {}: acquire: {e}", out.id);
                return Round::Failed;
            }
        };
        let t_acq = now_ns();
        let k = work(out);
        let t_rel = now_ns();
        if let Err(e) = turn.release() {
            out.errors += 1;
            eprintln!("bench_worker {}: release: {e}", out.id);
        }
        let t_done = now_ns();
        if let Some(k) = k {
            out.samples.push([t_req, t_acq, t_rel, t_done, k]);
        }
        Round::Done
    }

    fn run(&self, mut cs: Cs<'_>) -> WorkerOut {
        let o = self.o;
        let g = o.replica * o.threads + self.t;
        let stride = o.replicas * o.threads;
        let mut out = WorkerOut {
            id: format!("r{}t{}", o.replica, self.t),
            ..WorkerOut::default()
        };
        let Some(deadline) = self.gate.wait() else {
            out.incomplete = true;
            return out;
        };
        match o.workload {
            Workload::W1 | Workload::W2 => {
                let count = if o.workload == Workload::W1 {
                    o.keys
                } else {
                    o.messages
                };
                let expected = count.saturating_sub(g).div_ceil(stride);
                out.samples
                    .reserve(usize::try_from(expected).unwrap_or(0).min(1 << 24));
                let mut m = g;
                while m < count {
                    let c = if o.workload == Workload::W1 {
                        m
                    } else {
                        chat_of(m, o.seed, o.chats)
                    };
                    let chat = c.to_string();
                    let w2 = o.workload == Workload::W2;
                    let round = self.round(&mut out, deadline, &chat, |out| {
                        if w2 {
                            match cs.message(c) {
                                Ok(overlap) => out.overlaps += u64::from(overlap),
                                Err(e) => {
                                    out.errors += 1;
                                    eprintln!("bench_worker {}: {e}", out.id);
                                }
                            }
                        }
                        Some(c)
                    });
                    if let Round::Deadline = round {
                        out.incomplete = true;
                        break;
                    }
                    // A failed message is counted in `errors` and not retried.
                    m += stride;
                }
            }
            Workload::W3 => {
                let hold = Duration::from_micros(o.hold_us);
                let n = o.acquisitions;
                let mut in_a_row = 0u32;
                loop {
                    let mut last = None;
                    let round = self.round(&mut out, deadline, "hot", |out| {
                        let k = match cs.hot_enter() {
                            Ok((free, k)) => {
                                out.overlaps += u64::from(!free);
                                k
                            }
                            Err(e) => {
                                out.errors += 1;
                                eprintln!("bench_worker {}: {e}", out.id);
                                return None;
                            }
                        };
                        if k <= n {
                            std::thread::sleep(hold);
                        }
                        match cs.hot_exit() {
                            Ok(still_set) => out.overlaps += u64::from(!still_set),
                            Err(e) => {
                                out.errors += 1;
                                eprintln!("bench_worker {}: {e}", out.id);
                            }
                        }
                        last = Some(k);
                        Some(k)
                    });
                    match round {
                        Round::Done if last.is_some() => in_a_row = 0,
                        Round::Deadline => {
                            out.incomplete = true;
                            break;
                        }
                        Round::Done | Round::Failed => {
                            in_a_row += 1;
                            if in_a_row >= MAX_ERRORS_IN_A_ROW {
                                eprintln!(
                                    "bench_worker {}: {in_a_row} errors in a row; giving up",
                                    out.id
                                );
                                out.incomplete = true;
                                break;
                            }
                            // A pause before trying again, so a dead Redis is not spun on.
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                    if last.is_some_and(|k| k > n) {
                        break;
                    }
                }
            }
        }
        out
    }
}

fn redis_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

fn cs_connection(port: u16) -> Result<redis::Connection, String> {
    let client = redis::Client::open(redis_url(port)).map_err(|e| format!("redis url: {e}"))?;
    let con = client
        .get_connection_with_timeout(CS_TIMEOUT)
        .map_err(|e| format!("cannot connect to Redis at 127.0.0.1:{port}: {e}"))?;
    con.set_read_timeout(Some(CS_TIMEOUT))
        .and_then(|()| con.set_write_timeout(Some(CS_TIMEOUT)))
        .map_err(|e| format!("redis timeouts: {e}"))?;
    Ok(con)
}

fn peer(backend: Backend) -> &'static str {
    match backend {
        Backend::Redis => "botmesh-redis",
        Backend::Memory => "botmesh-memory",
        Backend::ContractFloor => "contract-floor",
    }
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Redis => "redis",
        Backend::Memory => "memory",
        Backend::ContractFloor => "contract-floor",
    }
}

/// Writes `value` to `path` through a temporary file beside it and a rename.
fn write_atomically(path: &std::path::Path, value: &serde_json::Value) -> Result<(), String> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let file = std::fs::File::create(&tmp)?;
        let mut w = std::io::BufWriter::new(file);
        serde_json::to_writer(&mut w, value)?;
        w.write_all(b"\n")?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Waits for the line `GO` on stdin.
/// Waits for `GO` on stdin (read on a thread of its own) or a signal, whichever comes
/// first.
fn wait_for_go_or_signal(signal: &crossbeam_channel::Receiver<i32>) -> Result<(), String> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let _ = tx.send(wait_for_go());
        })
        .map_err(|e| format!("cannot spawn the stdin thread: {e}"))?;
    crossbeam_channel::select! {
        recv(rx) -> got => got.unwrap_or_else(|_| Err("the stdin thread ended".into())),
        recv(signal) -> sig => Err(format!("stopped by signal {} before GO", sig.unwrap_or(0))),
    }
}

fn wait_for_go() -> Result<(), String> {
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        line.clear();
        let n = stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| format!("reading stdin: {e}"))?;
        if n == 0 {
            return Err("stdin closed before GO".into());
        }
        if line.trim() == "GO" {
            return Ok(());
        }
    }
}

fn say(line: &str) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("writing stdout: {e}"))
}

fn run(o: &Options) -> Result<(), String> {
    let ttl = Duration::from_millis(o.ttl_ms);
    let coordinator: Arc<dyn Coordinator> = match o.backend {
        Backend::Redis => Arc::new(
            RedisCoordinator::connect(RedisOptions::new(redis_url(o.port)).with_lease_ttl(ttl))
                .map_err(|e| format!("RedisCoordinator at 127.0.0.1:{}: {e}", o.port))?,
        ),
        // The floor's worker still starts a replica (unused), so both frames set up alike.
        Backend::Memory | Backend::ContractFloor => {
            let touched = match o.workload {
                Workload::W1 => o.keys,
                Workload::W2 => o.chats,
                Workload::W3 => 1,
            };
            let chats = o.chat_capacity.unwrap_or(touched);
            Arc::new(
                MemoryCoordinator::with_settings(ttl, DEFAULT_DEDUP_WINDOW)
                    .with_chat_capacity(usize::try_from(chats).unwrap_or(usize::MAX)),
            )
        }
    };
    let floor = (o.backend == Backend::ContractFloor).then(floor::ContractFloor::default);
    let replica = Replica::start(format!("r{}", o.replica), coordinator)
        .map_err(|e| format!("replica: {e}"))?;
    let stop = signals::flag_on_signal().map_err(|e| format!("signal handler: {e}"))?;
    let signal = signals::channel_on_signal().map_err(|e| format!("signal handler: {e}"))?;

    // W1 has no critical section; W3 always counts its sequence somewhere.
    let mem_chats = match (o.workload, o.cs) {
        (Workload::W2, CsKind::Mem) => {
            usize::try_from(o.chats).map_err(|_| "--chats: too many for --cs mem")?
        }
        (Workload::W3, CsKind::Mem) => 1,
        _ => 0,
    };
    let mem = MemCs::new(mem_chats);
    let threads = usize::try_from(o.threads).map_err(|_| "--threads: out of range")?;
    let mut css = Vec::with_capacity(threads);
    for _ in 0..threads {
        css.push(match (o.workload, o.cs) {
            (Workload::W1, _) | (_, CsKind::Mem) => Cs::Mem(&mem),
            (_, CsKind::Redis) => Cs::Redis(cs_connection(o.port)?),
        });
    }

    let gate = Gate::default();
    let outs: Vec<WorkerOut> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(threads);
        for (t, cs) in (0..o.threads).zip(css) {
            let job = Job {
                o,
                replica: &replica,
                floor: floor.as_ref(),
                gate: &gate,
                stop: &stop,
                t,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("bench-r{}t{t}", o.replica))
                .spawn_scoped(s, move || job.run(cs));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    gate.open(None); // the threads already started end at once
                    return Err(format!("cannot spawn a worker thread: {e}"));
                }
            }
        }
        let go = say("READY").and_then(|()| wait_for_go_or_signal(&signal));
        gate.open(
            go.is_ok()
                .then(|| Instant::now() + Duration::from_millis(o.deadline_ms)),
        );
        let mut outs = Vec::with_capacity(threads);
        for h in handles {
            outs.push(
                h.join()
                    .map_err(|_| "a worker thread panicked".to_owned())?,
            );
        }
        go.map(|()| outs)
    })?;
    replica.shutdown();

    let mem_counts: Vec<u64> = mem
        .counts
        .iter()
        .map(|c| c.load(Ordering::Acquire))
        .collect();
    let workers: Vec<serde_json::Value> = outs
        .into_iter()
        .map(|w| {
            serde_json::json!({
                "id": w.id,
                "samples": w.samples,
                "errors": w.errors,
                "acquire_timeouts": w.acquire_timeouts,
                "overlaps": w.overlaps,
                "incomplete": w.incomplete,
            })
        })
        .collect();
    let record = serde_json::json!({
        "peer": peer(o.backend),
        "replica": o.replica,
        "pid": std::process::id(),
        "meta": {
            "version": {"lib": env!("CARGO_PKG_VERSION")},
            "backend": backend_name(o.backend),
            "ttl_ms": o.ttl_ms,
        },
        "workers": workers,
        "mem_counts": if o.cs == CsKind::Mem { mem_counts } else { Vec::new() },
    });
    write_atomically(&o.out, &record)?;
    say("DONE")
}

fn main() -> ExitCode {
    let o = match parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(o)) => o,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench_worker: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_worker: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmix32_matches_murmur3() {
        assert_eq!(fmix32(0), 0);
        // Reference values of MurmurHash3's fmix32.
        assert_eq!(fmix32(1), 0x514E_28B7);
        assert_eq!(chat_of(0, 0, 7), 0);
    }

    #[test]
    fn memory_backend_needs_one_process() {
        let args = |r: &str| {
            [
                "--workload",
                "W2",
                "--backend",
                "memory",
                "--replicas",
                r,
                "--out",
                "x",
            ]
            .map(OsString::from)
        };
        assert!(parse(args("2")).is_err());
        assert!(matches!(parse(args("1")), Ok(Command::Run(_))));
    }

    #[test]
    fn the_contract_floor_runs_w1_alone_in_one_process() {
        let args = |w: &str, r: &str| {
            [
                "--workload",
                w,
                "--backend",
                "contract-floor",
                "--replicas",
                r,
                "--out",
                "x",
            ]
            .map(OsString::from)
        };
        assert!(matches!(parse(args("W1", "1")), Ok(Command::Run(_))));
        for (w, r) in [("W2", "1"), ("W3", "1"), ("W1", "2")] {
            let err = parse(args(w, r)).err().unwrap_or_default();
            assert!(err.contains("contract-floor"), "{w} {r}: {err}");
        }
    }
}
