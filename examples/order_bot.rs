//! An order-form bot run as several replica processes over Redis, with a demo that
//! kills a replica in the middle of a form and shows the form finishing on another.
//!
//! ```text
//! cargo run --release --example order_bot            # the demo (starts its own redis-server)
//! cargo run --release --example order_bot -- --redis-url redis://127.0.0.1:6379/
//! ```
//!
//! The parent plays the messaging platform: it starts replica processes (this same
//! program with `--replica <id>`), sends each one chat messages on stdin
//! (`<chat> TAB <text>`), and reads what the replica sent back to the user and how each
//! message ended on its stdout. The demo's last line is one JSON object saying which
//! checks held, e.g.
//! `{"persistent_resumed":true,"non_persistent_dropped":true,"stale_continued":false,…,"ok":true}`;
//! the exit status is 1 when one did not.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;
#[path = "common/signals.rs"]
mod signals;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use botmesh::redis::RedisOptions;
use botmesh::{
    Bot, Capture, CoordinationConfig, CoordinatorConfig, Flow, Message, Outcome, Provider,
    ProviderError, Session,
};
use crossbeam_channel::{Receiver, Sender, unbounded};

const WAIT: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let result = match value("--replica") {
        Some(id) => replica(&id, value("--redis-url"), value("--key-prefix")),
        None => match signals::stop_children_on_signal("order_bot") {
            // SIGTERM / SIGINT: the replica processes stop cleanly, then the redis-server.
            Ok(()) => demo(value("--redis-url")),
            Err(e) => Err(format!("cannot install the signal handler: {e}")),
        },
    };
    // A signal stop under way ends the process with its own status.
    signals::park_if_stopping();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("order_bot: {e}");
            ExitCode::from(2)
        }
    }
}

// ----- the bot (one replica process)

/// The transport: what the bot sends to a user goes to stdout as `sent TAB chat TAB
/// text`, where the parent (the platform) reads it.
struct Stdout;

impl Provider for Stdout {
    fn id(&self) -> &str {
        "stdout"
    }
    fn start(&self, _session: Session) -> Result<(), ProviderError> {
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        line(&format!("sent\t{chat}\t{text}"));
        Ok(())
    }
}

fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

fn flows() -> Vec<Flow> {
    let order = Flow::new("order")
        .keywords(["order"])
        .persistent()
        .answer("Let's take your order.")
        .ask_for("name", "What is your name?")
        .ask_for("address", "Where do we deliver?")
        .ask("Confirm? (yes/no)", |answer| {
            match answer.text().trim().to_lowercase().as_str() {
                "yes" => Capture::Next,
                "no" => Capture::Goto("cancelled".into()),
                _ => Capture::Retry("Please answer yes or no.".into()),
            }
        })
        .action(|step| {
            let field = |k: &str| step.state()[k].as_str().unwrap_or("?").to_owned();
            step.send(&format!(
                "Order confirmed: {}, {}",
                field("name"),
                field("address")
            ))?;
            Ok(())
        });
    // Not persistent: under the default handover policy it ends with its replica.
    let feedback = Flow::new("feedback")
        .keywords(["feedback"])
        .ask_for("rating", "Rate us from 1 to 5.")
        .action(|step| {
            let rating = step.state()["rating"].as_str().unwrap_or("?").to_owned();
            step.send(&format!("Thanks for rating us {rating}."))?;
            Ok(())
        });
    let cancelled = Flow::new("cancelled").answer("Order cancelled.");
    // A slow step: a replica that dies while running it leaves it to another one,
    // which runs it again (steps are at-least-once: a real one would pass an
    // idempotency key to the payment provider).
    let pay = Flow::new("pay")
        .keywords(["pay"])
        .persistent()
        .answer("Processing your payment...")
        .action(|step| {
            // Sent once this step's checkpoint is saved: the demo kills here.
            step.send("Charging the card...")?;
            step.sleep(Duration::from_millis(1500))?;
            step.send("Payment done.")?;
            Ok(())
        })
        .ask_for("email", "Where should we email the receipt?");
    vec![order, feedback, cancelled, pay]
}

/// One replica: a bot over Redis fed from stdin until it closes (a clean stop).
fn replica(id: &str, url: Option<String>, prefix: Option<String>) -> Result<bool, String> {
    let url = url.ok_or("--replica needs --redis-url")?;
    let options = RedisOptions::new(url)
        .with_key_prefix(prefix.unwrap_or_else(|| "order-bot".into()))
        .with_lease_ttl(Duration::from_secs(2));
    let config = CoordinationConfig::new(CoordinatorConfig::Redis(options));
    let mut builder = Bot::builder()
        .id(id)
        .workers(2)
        .coordination(config)
        .provider(Arc::new(Stdout))
        .handler(|ctx| {
            ctx.reply("Sorry, I did not get that. Say \"order\" or \"feedback\".")?;
            Ok(())
        })
        .on_outcome(|m: &Message, o: &Outcome| {
            let kind = match o {
                Outcome::Handled { .. } => "handled".to_owned(),
                other => format!("{other:?}").replace(['\t', '\n'], " "),
            };
            line(&format!("ended\t{}\t{}\t{kind}", m.chat, m.text));
        });
    for f in flows() {
        builder = builder.flow(f);
    }
    let bot = std::sync::Arc::new(builder.build().map_err(|e| e.to_string())?);
    // SIGTERM / SIGINT: a clean stop (the chats' turns handed over at once), then exit.
    signals::stop_on_signal(&bot, || line("stopped"))
        .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    line("ready");
    let intake = bot.intake();
    for input in std::io::stdin().lock().lines() {
        let input = input.map_err(|e| e.to_string())?;
        let Some((chat, text)) = input.split_once('\t') else {
            continue;
        };
        if let Err(e) = intake.deliver(Message::new(chat, text)) {
            line(&format!("ended\t{chat}\t{text}\trefused: {e}"));
        }
    }
    if let Err(e) = bot.stop() {
        line(&format!("stop refused: {e}"));
    }
    line("stopped");
    Ok(true)
}

// ----- the demo (the platform)

struct Replica {
    child: Child,
    stdin: Option<ChildStdin>,
}

struct Platform {
    exe: std::path::PathBuf,
    url: String,
    prefix: String,
    replicas: HashMap<String, Replica>,
    events_tx: Sender<(String, String)>,
    events: Receiver<(String, String)>,
}

impl Platform {
    fn start(&mut self, id: &str) -> Result<(), String> {
        signals::park_if_stopping();
        let mut child = Command::new(&self.exe)
            .args(["--replica", id, "--redis-url", &self.url])
            .args(["--key-prefix", &self.prefix])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start replica {id}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = self.events_tx.clone();
        let name = id.to_owned();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((name.clone(), l)).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        self.replicas
            .insert(id.to_owned(), Replica { child, stdin });
        loop {
            let (who, l) = self.next()?;
            if who == id && l == "ready" {
                return Ok(());
            }
        }
    }

    fn next(&self) -> Result<(String, String), String> {
        self.events
            .recv_timeout(WAIT)
            .map_err(|_| "a replica did not answer within 20 s".to_owned())
    }

    /// Sends `text` on `chat` to replica `id`, waits until it ended, and returns what
    /// the bot sent back meanwhile.
    fn say(&mut self, id: &str, chat: &str, text: &str) -> Result<Vec<String>, String> {
        self.send(id, chat, text)?;
        self.wait_end(chat, text)
    }

    /// Sends `text` on `chat` to replica `id`.
    fn send(&mut self, id: &str, chat: &str, text: &str) -> Result<(), String> {
        let r = self
            .replicas
            .get_mut(id)
            .ok_or(format!("no replica {id}"))?;
        let stdin = r.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{chat}\t{text}").map_err(|e| e.to_string())?;
        stdin.flush().map_err(|e| e.to_string())?;
        println!("  user {chat:>5} -> {id}: {text}");
        Ok(())
    }

    /// Waits until the bot sends `until` on `chat`; returns what it sent up to then.
    fn until_sent(&mut self, chat: &str, until: &str) -> Result<Vec<String>, String> {
        self.watch(chat, Some(until), None)
    }

    /// Waits for the end of a message already sent; returns what was sent meanwhile.
    fn wait_end(&mut self, chat: &str, text: &str) -> Result<Vec<String>, String> {
        self.watch(chat, None, Some(text))
    }

    /// Prints and collects what the bot sends on `chat` until it sends `until`, or
    /// until the message `text` ended (an error unless it was handled).
    fn watch(
        &mut self,
        chat: &str,
        until: Option<&str>,
        text: Option<&str>,
    ) -> Result<Vec<String>, String> {
        let mut sent = Vec::new();
        loop {
            let (who, l) = self.next()?;
            let parts: Vec<&str> = l.split('\t').collect();
            match parts.as_slice() {
                ["sent", c, t] if *c == chat => {
                    println!("  bot  {chat:>5} <- {who}: {t}");
                    sent.push((*t).to_owned());
                    if until == Some(*t) {
                        return Ok(sent);
                    }
                }
                ["ended", c, t, kind] if *c == chat && text.is_none_or(|x| x == *t) => {
                    return match (until, *kind) {
                        (Some(u), _) => Err(format!("{t:?} on {chat} ended ({kind}) before {u:?}")),
                        (None, "handled") => Ok(sent),
                        (None, _) => Err(format!("{t:?} on {chat} ended {kind}")),
                    };
                }
                _ => {}
            }
        }
    }

    fn kill(&mut self, id: &str) -> Result<(), String> {
        let mut r = self.replicas.remove(id).ok_or(format!("no replica {id}"))?;
        r.child.kill().map_err(|e| e.to_string())?;
        let _ = r.child.wait();
        println!("  ** replica {id} killed (SIGKILL)");
        Ok(())
    }

    fn stop(&mut self, id: &str) -> Result<(), String> {
        let mut r = self.replicas.remove(id).ok_or(format!("no replica {id}"))?;
        drop(r.stdin.take());
        let status = r.child.wait().map_err(|e| e.to_string())?;
        println!("  ** replica {id} stopped cleanly ({status})");
        Ok(())
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        for (_, mut r) in self.replicas.drain() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}

fn demo(url: Option<String>) -> Result<bool, String> {
    let started = Instant::now();
    let (_server, url) = match url {
        Some(u) => (None, u),
        None => {
            let s = redis_server::RedisServer::try_start()
                .map_err(|e| format!("{e}; or pass --redis-url"))?;
            let u = s.url();
            (Some(s), u)
        }
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let (events_tx, events) = unbounded();
    let mut p = Platform {
        exe: std::env::current_exe().map_err(|e| e.to_string())?,
        url,
        prefix: format!("order-bot-{}-{nanos}", std::process::id()),
        replicas: HashMap::new(),
        events_tx,
        events,
    };
    p.start("r1")?;
    p.start("r2")?;

    println!("1. A persistent order form; its replica crashes before the last answer.");
    p.say("r1", "alice", "order")?;
    p.say("r1", "alice", "Ann")?;
    p.say("r1", "alice", "1 Main St")?;
    p.kill("r1")?;
    let sent = p.say("r2", "alice", "yes")?;
    let persistent_resumed = sent.iter().any(|s| s == "Order confirmed: Ann, 1 Main St");

    println!("2. A flow that is not persistent; its replica crashes (handover flows: drop).");
    p.say("r2", "bob", "feedback")?;
    p.kill("r2")?;
    p.start("r3")?;
    p.start("r4")?;
    let sent = p.say("r3", "bob", "5")?;
    let non_persistent_dropped = sent.iter().all(|s| !s.starts_with("Thanks"))
        && sent.iter().any(|s| s.starts_with("Sorry"));

    println!("3. Answers alternate between replicas: none continues a stale copy.");
    p.say("r3", "carol", "order")?;
    p.say("r4", "carol", "Cy")?;
    let sent = p.say("r3", "carol", "2 Elm St")?;
    let stale_continued = sent.iter().any(|s| s == "Where do we deliver?");
    let sent_last = p.say("r4", "carol", "yes")?;
    let alternating_finished = sent_last
        .iter()
        .any(|s| s == "Order confirmed: Cy, 2 Elm St");

    println!("4. A replica is stopped cleanly (a deploy) in the middle of a form.");
    p.say("r3", "dave", "order")?;
    p.say("r3", "dave", "Di")?;
    p.stop("r3")?;
    p.say("r4", "dave", "3 Oak Rd")?;
    let sent = p.say("r4", "dave", "yes")?;
    let clean_stop_resumed = sent.iter().any(|s| s == "Order confirmed: Di, 3 Oak Rd");

    println!("5. A replica is killed in the middle of a slow step, holding the chat's turn.");
    p.start("r5")?;
    p.send("r4", "erin", "pay")?;
    p.until_sent("erin", "Charging the card...")?;
    p.kill("r4")?;
    let t = Instant::now();
    p.send("r5", "erin", "hello?")?;
    p.until_sent("erin", "Charging the card...")?;
    let takeover_ms = t.elapsed().as_millis();
    println!("  (r5 took the chat over {takeover_ms} ms after the kill; the lease TTL is 2 s)");
    let sent = p.wait_end("erin", "hello?")?;
    let step_rerun_after_crash = sent.iter().any(|s| s == "Payment done.")
        && sent.iter().all(|s| s != "Processing your payment...");
    p.stop("r5")?;

    let ok = persistent_resumed
        && step_rerun_after_crash
        && non_persistent_dropped
        && !stale_continued
        && alternating_finished
        && clean_stop_resumed;
    println!(
        "{{\"persistent_resumed\":{persistent_resumed},\"non_persistent_dropped\":{non_persistent_dropped},\
         \"stale_continued\":{stale_continued},\"alternating_finished\":{alternating_finished},\
         \"clean_stop_resumed\":{clean_stop_resumed},\"step_rerun_after_crash\":{step_rerun_after_crash},\
         \"takeover_ms\":{takeover_ms},\"replicas_killed\":3,\"elapsed_ms\":{},\"ok\":{ok}}}",
        started.elapsed().as_millis()
    );
    Ok(ok)
}
