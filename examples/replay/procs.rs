//! The replica processes of the platform (`--processes`): starting one, the two
//! threads that feed its stdin and read its stdout, and waiting until the first ones are
//! ready.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::args::{Options, REDIS_CLUSTER_ENV, REDIS_SENTINEL_ENV, REDIS_URL_ENV};
use crate::backend::RedisSettings;
use crate::protocol::FromReplica;

/// How long a replica process may take to connect and say `ready`.
pub const READY_WITHIN: Duration = Duration::from_secs(30);

/// What the reader threads tell the dispatcher.
pub enum Event {
    /// Lines from replica `.0`, as many as had arrived (each one, or why it is not part
    /// of the protocol).
    Lines(usize, Vec<Result<FromReplica, String>>),
    /// Replica `.0`'s stdout ended: it exited or died.
    Gone(usize),
}

/// One replica process as the dispatcher sees it.
pub struct Replica {
    pub name: String,
    pub process: Child,
    /// The feed of its stdin; `None` once closed.
    pub feed: Option<Sender<Vec<u8>>>,
    /// Lines for its stdin not yet handed to the feed (sent once per batch of events).
    pub outgoing: Vec<u8>,
    pub threads: Vec<JoinHandle<()>>,
    /// Said `ready`: may get deliveries unless killed or gone.
    pub ready: bool,
    /// May get deliveries (ready, not killed, not gone).
    pub live: bool,
    /// Its stdout ended.
    pub gone: bool,
    /// Killed on purpose.
    pub killed: bool,
    /// Updates delivered to it that have not ended (nor been refused).
    pub holding: HashSet<usize>,
    /// Its `stopped` answer: handovers.
    pub handovers: Option<u64>,
    /// Its part file (see `replay/parts.rs`).
    pub part: std::path::PathBuf,
}

/// Starts replica process `k` and its two threads.
pub fn spawn(
    o: &Options,
    settings: &RedisSettings,
    k: usize,
    name: &str,
    part: &Path,
    events: &Sender<Event>,
) -> Result<Replica, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this program to start replica {name}: {e}"))?;
    // A part file left by an earlier run with the same --log path (one interrupted
    // before it could merge and remove them) would be merged into this one's record.
    match std::fs::remove_file(part) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(format!(
                "cannot remove the stale part file {}: {e}",
                part.display()
            ));
        }
    }
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    crate::signals::park_if_stopping();
    let mut command = Command::new(exe);
    command
        .arg("--child-replica")
        .arg(name)
        .args(["--backend", "redis"])
        .args(
            settings
                .service
                .iter()
                .flat_map(|s| ["--sentinel-service", s.as_str()]),
        )
        .args(["--key-prefix", &settings.key_prefix])
        .args(["--lease-ttl", &ms(settings.lease_ttl)])
        .args(["--dedup-ids", &settings.dedup_ids.to_string()])
        .args(["--wait-replicas", &settings.wait_replicas.to_string()])
        .args(["--workers", &o.workers.to_string()])
        .args(["--senders", &o.senders.to_string()])
        .args(["--turn-wait", &ms(o.turn_wait)])
        .args(["--seed", &o.seed.to_string()])
        .args(["--handler-ms", &o.handler_ms.to_string()])
        .args(["--handler-jitter-ms", &o.handler_jitter_ms.to_string()])
        .arg("--part")
        .arg(part)
        // The URL goes through the environment: it may hold a password, and the
        // process list shows arguments to every user.
        .env(REDIS_URL_ENV, &settings.url)
        .env(REDIS_CLUSTER_ENV, settings.cluster.join(","))
        .env(REDIS_SENTINEL_ENV, settings.sentinel.join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut process = command
        .spawn()
        .map_err(|e| format!("cannot start replica {name}: {e}"))?;
    let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
        let _ = process.kill();
        let _ = process.wait();
        return Err(format!("replica {name} has no stdin or stdout pipe"));
    };
    let (feed_tx, feed_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
    let mut threads = Vec::with_capacity(2);
    let spawned = std::thread::Builder::new()
        .name(format!("replay-feed-{name}"))
        .spawn(move || feed(&feed_rx, stdin))
        .and_then(|t| {
            threads.push(t);
            let events = events.clone();
            std::thread::Builder::new()
                .name(format!("replay-read-{name}"))
                .spawn(move || read(k, stdout, &events))
        });
    match spawned {
        Ok(t) => threads.push(t),
        Err(e) => {
            let _ = process.kill();
            let _ = process.wait();
            return Err(format!("cannot start a thread for replica {name}: {e}"));
        }
    }
    Ok(Replica {
        name: name.to_owned(),
        process,
        feed: Some(feed_tx),
        outgoing: Vec::new(),
        threads,
        ready: false,
        live: false,
        gone: false,
        killed: false,
        holding: HashSet::new(),
        handovers: None,
        part: part.to_path_buf(),
    })
}

/// Feeds one replica's stdin: writes the batches of lines the dispatcher hands over.
/// Ends (closing stdin) when the dispatcher drops the feed, or the replica is gone.
/// A separate thread, so that the dispatcher never blocks on a full pipe (which could
/// deadlock with a replica blocked on its own full stdout).
fn feed(rx: &Receiver<Vec<u8>>, mut stdin: ChildStdin) {
    while let Ok(batch) = rx.recv() {
        if stdin.write_all(&batch).is_err() {
            return;
        }
    }
}

/// Reads one replica's stdout into the dispatcher's queue, as many lines per event as
/// have arrived, then says it is gone. A last line without its newline (torn by a
/// SIGKILL) is dropped.
fn read(k: usize, stdout: ChildStdout, events: &Sender<Event>) {
    let mut reader = BufReader::with_capacity(1 << 16, stdout);
    let mut line = String::new();
    let mut batch = Vec::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if !line.ends_with('\n') => break,
            Ok(_) => {}
        }
        batch.push(
            serde_json::from_str::<FromReplica>(&line)
                .map_err(|e| format!("{e}: {}", line.trim_end())),
        );
        // Hand the batch over before the next read could block.
        if reader.buffer().is_empty()
            && events
                .send(Event::Lines(k, std::mem::take(&mut batch)))
                .is_err()
        {
            return;
        }
    }
    if !batch.is_empty() {
        let _ = events.send(Event::Lines(k, batch));
    }
    let _ = events.send(Event::Gone(k));
}

/// Waits until every replica said `ready`.
pub fn await_ready(replicas: &mut [Replica], events: &Receiver<Event>) -> Result<(), String> {
    let deadline = Instant::now() + READY_WITHIN;
    let mut ready = vec![false; replicas.len()];
    while ready.iter().any(|r| !r) {
        let left = deadline.saturating_duration_since(Instant::now());
        let name = |k: usize| replicas.get(k).map_or("?", |r| r.name.as_str()).to_owned();
        match events.recv_timeout(left) {
            Ok(Event::Lines(k, lines)) => {
                for line in lines {
                    match line {
                        Ok(FromReplica::Ready { .. }) => {
                            if let Some(r) = ready.get_mut(k) {
                                *r = true;
                            }
                        }
                        Ok(other) => {
                            return Err(format!(
                                "replica {} answered {other:?} before it was ready",
                                name(k)
                            ));
                        }
                        Err(line) => {
                            return Err(format!(
                                "replica {} wrote an unknown line: {line}",
                                name(k)
                            ));
                        }
                    }
                }
            }
            Ok(Event::Gone(k)) => {
                let shown = name(k);
                if let Some(r) = replicas.get_mut(k) {
                    r.gone = true;
                }
                return Err(format!(
                    "replica {shown} exited before it was ready (its error is above)"
                ));
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "the replica processes were not ready within {} s",
                    READY_WITHIN.as_secs()
                ));
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err("every replica process is gone".to_owned());
            }
        }
    }
    for r in replicas.iter_mut() {
        r.ready = true;
        r.live = true;
    }
    Ok(())
}

/// Kills and reaps every replica (after a failed start).
pub fn stop_all(replicas: &mut [Replica]) {
    for r in replicas {
        r.feed = None;
        let _ = r.process.kill();
        let _ = r.process.wait();
    }
}
