//! A replica process (`--processes`): one bot over Redis, fed by the parent through the
//! line protocol of [`crate::protocol`] on stdin, answering on stdout.
//!
//! `--senders` intake threads (a webhook server's request threads) take turns reading
//! `deliver` lines from stdin, call `Intake::deliver` and answer once it returned. The
//! bot's outcome hook sends one `ended` line per accepted update. Answers from every
//! thread go through one [`Out`], which batches them without a writer thread. When stdin
//! closes, the replica stops cleanly: intake threads finish, then `Bot::shutdown` lets
//! every accepted update end, then a `stopped` line, then exit 0.
//!
//! With `--part PATH` the handler also appends its `handled` line to PATH before it
//! returns (see `replay/parts.rs`), so what it handled survives a SIGKILL.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use botmesh::{
    Accepted, Bot, CoordinationConfig, CoordinatorConfig, HandlerError, Message, Outcome,
};
use parking_lot::{Mutex, MutexGuard};

use crate::args::Options;
use crate::backend::{self, RedisSettings};
use crate::common;
use crate::parts::PartWriter;
use crate::protocol::{Ended, FromReplica, ToReplica};
use crate::report::LogRecord;

/// What a message carries from the intake to its handler and outcome hook.
struct Delivery {
    index: usize,
    update_id: i64,
    chat: String,
    message_id: i64,
    start_us: AtomicU64,
    end_us: AtomicU64,
    waited_ns: AtomicU64,
}

/// Runs replica `name` until its stdin closes. Exit status 0 after a clean stop, 2 when
/// it could not start (the reason on stderr).
pub fn run(o: &Options, name: &str) -> ExitCode {
    match serve(o, name) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replay replica {name}: {e}");
            ExitCode::from(2)
        }
    }
}

/// Stdout, shared by every thread. A thread that finds no write in progress writes
/// everything queued so far, its own line included, in one call (flat combining);
/// lines queued meanwhile by others go out in its next round. So answers leave in
/// batches when traffic is heavy, at once when it is light, and no thread is woken just
/// to write.
#[derive(Default)]
struct Out {
    state: Mutex<OutState>,
}

#[derive(Default)]
struct OutState {
    queued: Vec<u8>,
    spare: Vec<u8>,
    writing: bool,
    /// Stdout is gone (the parent died): lines are dropped.
    broken: bool,
}

impl Out {
    /// Queues one line and, unless another thread is writing, writes the queue.
    fn send(&self, line: &FromReplica) {
        let text = match serde_json::to_vec(line) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("replay replica: cannot encode an answer: {e}");
                return;
            }
        };
        let mut state = self.state.lock();
        if state.broken {
            return;
        }
        state.queued.extend_from_slice(&text);
        state.queued.push(b'\n');
        if state.writing {
            return; // the writing thread takes it in its next round
        }
        state.writing = true;
        loop {
            let spare = std::mem::take(&mut state.spare);
            let mut chunk = std::mem::replace(&mut state.queued, spare);
            if chunk.is_empty() {
                state.spare = chunk;
                state.writing = false;
                return;
            }
            let written = MutexGuard::unlocked(&mut state, || {
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(&chunk).and_then(|()| stdout.flush())
            });
            if written.is_err() {
                state.broken = true;
                state.writing = false;
                state.queued.clear();
                return;
            }
            chunk.clear();
            state.spare = chunk;
        }
    }
}

fn serve(o: &Options, name: &str) -> Result<(), String> {
    crate::stderr_log::StderrLog::install(name, None);
    let settings =
        RedisSettings::of(o).ok_or("a replica process needs --backend redis and the Redis URL")?;
    if o.key_prefix.is_none() {
        return Err("a replica process needs the run's --key-prefix".to_owned());
    }
    let coordinator = backend::connect(&settings)?;
    let part = match &o.part {
        Some(path) => Some(Arc::new(PartWriter::open(path)?)),
        None => None,
    };

    let out = Arc::new(Out::default());
    let work = Work {
        seed: o.seed,
        ms: o.handler_ms,
        jitter: o.handler_jitter_ms,
    };
    let handler_name = name.to_owned();
    let hook_out = out.clone();
    let replica = name.to_owned();
    let config =
        CoordinationConfig::new(CoordinatorConfig::Shared(coordinator)).with_turn_wait(o.turn_wait);
    let bot = Bot::builder()
        .id(name)
        .workers(o.workers)
        .coordination(config)
        .handler(move |ctx| handle(ctx, &handler_name, work, part.as_deref()))
        .on_outcome(move |message, outcome| ended(&hook_out, &replica, message, outcome))
        .build()
        .map_err(|e| format!("cannot start the bot: {e}"))?;

    // SIGTERM / SIGINT: a clean stop (every turn released at once), then exit.
    let bot = std::sync::Arc::new(bot);
    crate::signals::stop_on_signal(&bot, || {})
        .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    out.send(&FromReplica::Ready {
        replica: name.to_owned(),
        pid: std::process::id(),
    });

    // The intake threads read stdin themselves, one line at a time under its lock, so
    // no thread hands a delivery to another.
    let mut intakes: Vec<JoinHandle<()>> = Vec::with_capacity(o.senders);
    for n in 0..o.senders {
        let (out, intake, name) = (out.clone(), bot.intake(), name.to_owned());
        let spawned = std::thread::Builder::new()
            .name(format!("replica-intake-{n}"))
            .spawn(move || take_in(&name, &out, &intake));
        match spawned {
            Ok(handle) => intakes.push(handle),
            Err(e) => {
                if let Ok(bot) = std::sync::Arc::try_unwrap(bot) {
                    bot.abort();
                }
                return Err(format!("cannot start an intake thread: {e}"));
            }
        }
    }
    // They return once the parent closed stdin (or went away).
    for handle in intakes {
        if handle.join().is_err() {
            eprintln!("replay replica {name}: an intake thread panicked");
        }
    }
    // Read before the stop (which consumes the bot); the parent closes stdin only once
    // every update ended, so no grant is left to come.
    let handovers = bot.metrics().handovers;
    if let Err(e) = bot.stop() {
        eprintln!("replay replica {name}: {e}");
    }
    out.send(&FromReplica::Stopped { handovers });
    Ok(())
}

/// An intake thread: reads a delivery from stdin, delivers it, answers once `deliver`
/// returned; until stdin ends.
fn take_in(name: &str, out: &Out, intake: &botmesh::Intake) {
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        line.clear();
        match stdin.lock().read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                eprintln!("replay replica {name}: cannot read stdin ({e}); stopping");
                return;
            }
        }
        if line.trim().is_empty() {
            continue;
        }
        let msg = match serde_json::from_str::<ToReplica>(&line) {
            Ok(msg) => msg,
            Err(e) => {
                eprintln!("replay replica {name}: ignoring a line that is not a delivery: {e}");
                continue;
            }
        };
        let ToReplica::Deliver {
            index,
            update_id,
            chat,
            message_id,
            text,
            date: _,
        } = msg;
        let message = Message::new(chat.clone(), text)
            .with_id(message_id.to_string())
            .with_payload(Delivery {
                index,
                update_id,
                chat: chat.clone(),
                message_id,
                start_us: AtomicU64::new(0),
                end_us: AtomicU64::new(0),
                waited_ns: AtomicU64::new(0),
            });
        let answer = match intake.deliver(message) {
            Ok(Accepted::Queued) => FromReplica::Accepted { index },
            Ok(Accepted::Duplicate) => FromReplica::Duplicate { index },
            Err(e) => FromReplica::Refused {
                index,
                reason: e.reason.as_str().to_owned(),
            },
        };
        out.send(&answer);
    }
}

/// The simulated work of every handler.
#[derive(Clone, Copy)]
struct Work {
    seed: u64,
    ms: f64,
    jitter: f64,
}

/// The handler: records its interval and wait, simulates the update's work, and with a
/// part file appends its `handled` line there before returning (so before the turn is
/// released).
fn handle(
    ctx: &botmesh::Context<'_>,
    replica: &str,
    work: Work,
    part: Option<&PartWriter>,
) -> Result<(), HandlerError> {
    let start_us = common::unix_us();
    let delivery = ctx
        .message()
        .payload::<Delivery>()
        .ok_or("the message carries no delivery")?;
    delivery.start_us.store(start_us, Ordering::Relaxed);
    let waited = u64::try_from(ctx.turn().waited().as_nanos()).unwrap_or(u64::MAX);
    delivery.waited_ns.store(waited, Ordering::Relaxed);
    if work.ms > 0.0 || work.jitter > 0.0 {
        let pause = common::work_of(delivery.update_id, work.seed, work.ms, work.jitter);
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    let end_us = common::unix_us();
    delivery.end_us.store(end_us, Ordering::Relaxed);
    if let Some(part) = part {
        // A handled update the part file cannot record is reported as failed: the
        // platform must not count on a record that is not there.
        part.record(&LogRecord::Handled {
            update_id: delivery.update_id,
            chat: delivery.chat.clone(),
            message_id: delivery.message_id,
            replica: replica.to_owned(),
            fence: ctx.turn().fencing_token(),
            start_us,
            end_us,
            redelivered: false,
            recovered: false,
        })?;
    }
    Ok(())
}

/// The outcome hook: one `ended` line per accepted update.
fn ended(out: &Out, replica: &str, message: &Message, outcome: &Outcome) {
    let Some(delivery) = message.payload::<Delivery>() else {
        return;
    };
    let how = match outcome {
        Outcome::Handled { token, .. } => Ended::Handled {
            replica: replica.to_owned(),
            fence: *token,
            start_us: delivery.start_us.load(Ordering::Relaxed),
            end_us: delivery.end_us.load(Ordering::Relaxed),
            waited_ns: delivery.waited_ns.load(Ordering::Relaxed),
        },
        Outcome::Dropped(e) => Ended::Dropped {
            reason: e.reason.as_str().to_owned(),
        },
        Outcome::Duplicate => Ended::Duplicate,
        Outcome::Failed(text) => Ended::Failed {
            error: text.clone(),
        },
        other => Ended::Failed {
            error: format!("unknown outcome {other:?}"),
        },
    };
    out.send(&FromReplica::Ended {
        index: delivery.index,
        how,
    });
}
