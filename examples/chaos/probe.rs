//! The link probe: an observer, independent of botmesh, that measures how long Redis
//! takes to answer over the same path the replicas use (through the proxy).
//!
//! Busy loops starve every process on the host: the proxy, Redis and the replicas. The
//! contract (SPEC §3) lets a lease be lost when the backend was unreachable long enough,
//! and a host so starved that a `PING` takes longer than the renewal period is, for the
//! replicas, a backend out of reach. The judge needs evidence of that which does not
//! come from botmesh itself, so the harness pings Redis every few milliseconds on its own
//! connection and keeps every answer's round trip. A *stall* is a ping (or a reconnect)
//! that took at least the renewal period: for that span no renewal could have reached
//! Redis in time. The judge sets stalls beside blackholes (see `judge.rs`).
//!
//! The probe lives in the harness's process, so it cannot see a replica process
//! starved on its own. It therefore also reads, every sample, the kernel's scheduler
//! account of each live replica's renewal thread (`/proc/<pid>/task/<tid>/schedstat`,
//! second field: nanoseconds spent runnable but waiting for a CPU): a renewal thread
//! that waited half a TTL for a CPU within a lease's last stretch could not keep the
//! lease, which the contract lets go (SPEC §3: a host so starved that a lease truly runs
//! out). That too is the kernel's word, not botmesh's.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The pause between two pings.
const EVERY: Duration = Duration::from_millis(20);
/// How long one ping may wait for its answer before it counts as failed.
const WAIT: Duration = Duration::from_secs(5);

/// One ping: when it was sent and how long the answer took (`ok` false: no answer, the
/// connection broke or could not be made; `took` is then the time until that was known).
#[derive(Clone, Copy, Debug)]
pub struct Ping {
    pub sent: Instant,
    /// The same, in µs since the Unix epoch (the log's clock).
    pub sent_us: u64,
    pub took: Duration,
    pub ok: bool,
}

/// The live replicas (name, pid), kept up to date by the fault director.
pub type Watched = Arc<Mutex<Vec<(String, u32)>>>;

/// Time a replica's renewal thread spent waiting for a CPU between two samples.
#[derive(Clone, Debug)]
pub struct Wait {
    pub replica: String,
    /// When the sample was read, on the run's clock (see [`waits`]).
    pub at: Instant,
    pub waited: Duration,
}

/// What the probe's thread saw.
#[derive(Default)]
pub struct Seen {
    pub pings: Vec<Ping>,
    /// Samples of at least a millisecond of waiting only (the rest cannot add up to
    /// anything the judge counts).
    pub waits: Vec<Wait>,
}

/// The probe's thread; [`Probe::stop`] ends it and hands back what it saw.
pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Seen>>,
}

impl Probe {
    /// Starts pinging `127.0.0.1:port` and watching the replicas in `watched`.
    pub fn start(port: u16, watched: Watched) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let thread = std::thread::Builder::new()
            .name("chaos-probe".into())
            .spawn(move || run(addr, &flag, &watched))
            .ok();
        Probe { stop, thread }
    }

    /// Stops the probe and returns what it saw, oldest first (nothing if its thread
    /// could not start).
    pub fn stop(mut self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn run(addr: SocketAddr, stop: &AtomicBool, watched: &Watched) -> Seen {
    let mut pings = Vec::new();
    let mut waits = Vec::new();
    let mut threads = Threads::default();
    let mut link: Option<(TcpStream, BufReader<TcpStream>)> = None;
    while !stop.load(Ordering::Relaxed) {
        let live = watched.lock().map(|w| w.clone()).unwrap_or_default();
        threads.sample(&live, &mut waits);
        let sent = Instant::now();
        let sent_us = crate::common::unix_us();
        let ok = ping(addr, &mut link);
        if !ok {
            link = None;
        }
        pings.push(Ping {
            sent,
            sent_us,
            took: sent.elapsed(),
            ok,
        });
        std::thread::sleep(EVERY);
    }
    Seen { pings, waits }
}

/// The renewal thread of each watched replica and its wait so far.
#[derive(Default)]
struct Threads {
    /// pid → (the renewal thread's tid, its run-queue wait at the last sample, ns).
    known: HashMap<u32, (u32, u64)>,
}

impl Threads {
    fn sample(&mut self, live: &[(String, u32)], waits: &mut Vec<Wait>) {
        let now = Instant::now();
        self.known
            .retain(|pid, _| live.iter().any(|(_, p)| p == pid));
        for (name, pid) in live {
            let entry = match self.known.get(pid) {
                Some(&e) => Some(e),
                None => renewal_thread(*pid).map(|tid| (tid, u64::MAX)),
            };
            let Some((tid, before)) = entry else {
                continue; // not started yet, or gone
            };
            let Some(total) = run_queue_wait(*pid, tid) else {
                self.known.remove(pid);
                continue;
            };
            self.known.insert(*pid, (tid, total));
            if before != u64::MAX && total >= before + 1_000_000 {
                waits.push(Wait {
                    replica: name.clone(),
                    at: now,
                    waited: Duration::from_nanos(total - before),
                });
            }
        }
    }
}

/// The tid of the replica's renewal thread (named `botmesh-lease-<id>`).
fn renewal_thread(pid: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.flatten().find_map(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
        comm.starts_with("botmesh-lease")
            .then(|| task.file_name().to_str()?.parse().ok())
            .flatten()
    })
}

/// Nanoseconds the thread has spent runnable, waiting for a CPU.
fn run_queue_wait(pid: u32, tid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    stat.split_whitespace().nth(1)?.parse().ok()
}

/// The waits as spans on the run's clock from `origin`: each sample's wait, ending
/// when it was read.
pub fn waits(seen: &[Wait], origin: Instant) -> Vec<(String, Duration, Duration)> {
    seen.iter()
        .map(|w| {
            let end = w.at.saturating_duration_since(origin);
            (w.replica.clone(), end.saturating_sub(w.waited), end)
        })
        .collect()
}

/// One `PING` (connecting first when there is no connection); true on `+PONG`.
fn ping(addr: SocketAddr, link: &mut Option<(TcpStream, BufReader<TcpStream>)>) -> bool {
    if link.is_none() {
        let Ok(stream) = TcpStream::connect_timeout(&addr, WAIT) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(WAIT));
        let _ = stream.set_write_timeout(Some(WAIT));
        let _ = stream.set_nodelay(true);
        let Ok(reader) = stream.try_clone() else {
            return false;
        };
        *link = Some((stream, BufReader::new(reader)));
    }
    let Some((stream, reader)) = link.as_mut() else {
        return false;
    };
    if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    matches!(reader.read_line(&mut reply), Ok(n) if n > 0) && reply.starts_with("+PONG")
}

/// What the probe saw, for the summary.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ProbeStats {
    pub pings: usize,
    pub failed: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Stalls (pings that took at least the renewal period) and their total length.
    pub stalls: usize,
    pub stalled_ms: u128,
    /// Time the replicas' renewal threads spent waiting for a CPU, in all, and the
    /// longest wait between two samples.
    pub renewal_cpu_wait_ms: u128,
    pub renewal_cpu_wait_max_ms: u128,
}

/// The stalls among `pings`: each ping that took at least `period`, as (start, end)
/// on the run's clock from `origin` and in µs since the Unix epoch.
pub fn stalls(pings: &[Ping], period: Duration, origin: Instant) -> Vec<Stall> {
    pings
        .iter()
        .filter(|p| p.took >= period)
        .map(|p| {
            let start = p.sent.saturating_duration_since(origin);
            Stall {
                start,
                end: start + p.took,
                start_us: p.sent_us,
                end_us: p.sent_us + u64::try_from(p.took.as_micros()).unwrap_or(u64::MAX),
            }
        })
        .collect()
}

/// A span in which Redis did not answer the probe within the renewal period.
#[derive(Clone, Copy, Debug)]
pub struct Stall {
    pub start: Duration,
    pub end: Duration,
    pub start_us: u64,
    pub end_us: u64,
}

/// The summary's view of what the probe saw.
pub fn stats(pings: &[Ping], stalls: &[Stall], waits: &[Wait]) -> ProbeStats {
    let mut took: Vec<f64> = pings
        .iter()
        .filter(|p| p.ok)
        .map(|p| p.took.as_secs_f64() * 1000.0)
        .collect();
    took.sort_unstable_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((took.len() as f64 - 1.0) * q).round() as usize;
        took.get(i).map_or(0.0, |v| (v * 10.0).round() / 10.0)
    };
    ProbeStats {
        pings: pings.len(),
        failed: pings.iter().filter(|p| !p.ok).count(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: at(1.0),
        stalls: stalls.len(),
        stalled_ms: stalls.iter().map(|s| (s.end - s.start).as_millis()).sum(),
        renewal_cpu_wait_ms: waits.iter().map(|w| w.waited.as_millis()).sum(),
        renewal_cpu_wait_max_ms: waits
            .iter()
            .map(|w| w.waited.as_millis())
            .max()
            .unwrap_or(0),
    }
}
