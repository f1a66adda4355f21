//! SIGTERM and SIGINT for the examples: a clean stop instead of a crash, so leases and
//! leaderships are handed over at once rather than lapsing after the TTL, and a parent
//! process leaves no replica process or `redis-server` behind.

// Each example includes this file alone and uses only part of it.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use botmesh::Bot;

/// How long a replica process may take to stop cleanly after its SIGTERM (its
/// messages in flight end first) before it is killed.
const CHILD_STOP_WITHIN: Duration = Duration::from_secs(15);
/// How long a `redis-server` may take to exit after its SIGTERM before it is killed.
const SERVER_STOP_WITHIN: Duration = Duration::from_secs(5);

/// On the first SIGTERM or SIGINT, stops `bot` cleanly (if it is still alive: the
/// handle is weak, so it never keeps the bot from being dropped), runs `then`, and
/// exits the process with status 0. Runs on a thread of its own.
///
/// # Errors
/// The signal handler could not be installed.
pub fn stop_on_signal(bot: &Arc<Bot>, then: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let bot: Weak<Bot> = Arc::downgrade(bot);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!("signal {sig}: stopping cleanly");
                if let Some(bot) = bot.upgrade()
                    && let Err(e) = bot.stop()
                {
                    eprintln!("{e}");
                }
                then();
                std::process::exit(0);
            }
        })?;
    Ok(())
}

/// A flag that turns true on the first SIGTERM or SIGINT, for a program whose main
/// thread owns what it must stop (a `Replica`) and checks the flag between steps. A
/// second signal ends the process at once (exit status 1), for a program stuck
/// where it does not check.
///
/// # Errors
/// The signal handler could not be installed.
pub fn flag_on_signal() -> std::io::Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [SIGTERM, SIGINT] {
        // Registered first, so the second signal (flag already set) exits.
        signal_hook::flag::register_conditional_shutdown(sig, 1, flag.clone())?;
        signal_hook::flag::register(sig, flag.clone())?;
    }
    Ok(flag)
}

/// A channel that gets the number of every SIGTERM or SIGINT, for a main thread that
/// waits on something else meanwhile (`crossbeam_channel::select!`). Fed by a thread
/// of its own.
///
/// # Errors
/// The signal handler could not be installed.
pub fn channel_on_signal() -> std::io::Result<crossbeam_channel::Receiver<i32>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(sig).is_err() {
                    return;
                }
            }
        })?;
    Ok(rx)
}

/// Whether `flag` (from [`flag_on_signal`]) was raised.
pub fn raised(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Relaxed)
}

/// For a parent process (a demo that starts replica processes and maybe its own
/// `redis-server`): on the first SIGTERM or SIGINT, sends SIGTERM to every child
/// process other than a `redis-server` (the replicas stop cleanly through
/// [`stop_on_signal`], handing their leases over) and waits for them to exit, then
/// stops the `redis-server` children the same way, removes their temporary
/// directories, and exits with status 128 + the signal (the run was cut short; no
/// report). A child still running after its grace period is killed.
///
/// Children are found in `/proc` by their parent pid (Linux); elsewhere the process
/// only exits. The main thread goes on meanwhile; it must call [`park_if_stopping`]
/// before it starts a replica process and before it returns, so that it neither
/// starts new ones nor drops its `redis-server` under the stopping replicas.
///
/// # Errors
/// The signal handler could not be installed.
pub fn stop_children_on_signal(program: &'static str) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                STOPPING.store(true, Ordering::SeqCst);
                eprintln!("{program}: signal {sig}: stopping the replica processes");
                // Rounds, for a replica the main thread was starting meanwhile.
                let mut replicas = 0;
                for _ in 0..3 {
                    let live: Vec<u32> = children()
                        .into_iter()
                        .filter(|c| c.command != "redis-server")
                        .map(|c| c.pid)
                        .collect();
                    if live.is_empty() {
                        break;
                    }
                    replicas += live.len();
                    stop_all(&live, CHILD_STOP_WITHIN);
                }
                let servers: Vec<u32> = children().into_iter().map(|c| c.pid).collect();
                stop_all(&servers, SERVER_STOP_WITHIN);
                remove_server_dirs();
                let late: Vec<u32> = children().into_iter().map(|c| c.pid).collect();
                for pid in &late {
                    send(*pid, "KILL");
                }
                eprintln!(
                    "{program}: stopped {replicas} replica and {} redis-server processes{}",
                    servers.len(),
                    if late.is_empty() {
                        String::new()
                    } else {
                        format!(", killed {} started meanwhile", late.len())
                    }
                );
                std::process::exit(128 + sig);
            }
        })?;
    Ok(())
}

/// Set once [`stop_children_on_signal`]'s thread is stopping the children.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Called by a parent before it starts a replica process: once a signal stop is under
/// way, this never returns (the signal thread ends the process), so the main thread
/// starts nothing new and drops nothing (its `redis-server`) while the replicas stop.
pub fn park_if_stopping() {
    while STOPPING.load(Ordering::SeqCst) {
        std::thread::park();
    }
}

/// A child process of this one, as `/proc` shows it.
struct ChildProcess {
    pid: u32,
    /// Its command name (`comm`, at most 15 bytes).
    command: String,
}

/// This process's children that have not exited (zombies are left out).
fn children() -> Vec<ChildProcess> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (command, state, ppid) = stat(pid)?;
            (ppid == me && state != 'Z').then_some(ChildProcess { pid, command })
        })
        .collect()
}

/// `(comm, state, ppid)` from `/proc/<pid>/stat`; `None` once the process is gone.
fn stat(pid: u32) -> Option<(String, char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid …"; comm may hold spaces and parentheses.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let command = text.get(open + 1..close)?.to_owned();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((command, state, ppid))
}

/// Whether `pid` is still a live child of this process.
fn running(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, state, ppid)| ppid == std::process::id() && state != 'Z')
}

/// Sends SIGTERM to each of `pids`, waits up to `within` for them to exit, and kills
/// those still running then.
fn stop_all(pids: &[u32], within: Duration) {
    for &pid in pids {
        send(pid, "TERM");
    }
    let deadline = Instant::now() + within;
    // Polling another process's exit: /proc has no notification for a non-owner.
    while pids.iter().any(|&p| running(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for &pid in pids.iter().filter(|&&p| running(p)) {
        eprintln!("process {pid} did not stop within {within:?}: killed");
        send(pid, "KILL");
    }
}

fn send(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status();
}

/// The temporary directories of the servers `tests/support/redis_server.rs` started
/// for this process (named `botmesh-redis-<pid>-<port>`).
fn remove_server_dirs() {
    let prefix = format!("botmesh-redis-{}-", std::process::id());
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(tmp.join(e.file_name()));
        }
    }
}
