//! Serves a replica's metrics on `/metrics` in the Prometheus text format, with only
//! std's `TcpListener` (one scrape at a time is plenty for a scraper every few
//! seconds), and stops cleanly on SIGTERM / SIGINT.
//!
//! ```sh
//! cargo run --example metrics_server -- [--port 9464] [--messages 1000]
//! curl -s http://127.0.0.1:9464/metrics
//! ```
//!
//! The bot runs on a `MemoryCoordinator` with one exclusive provider (a stand-in
//! transport that only counts replies), so the leader gauge shows; `--messages` are
//! delivered at start over 50 chats. Binds loopback only.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

#[path = "common/signals.rs"]
mod signals;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use botmesh::{
    Bot, Capabilities, CoordinationConfig, CoordinatorConfig, MemoryCoordinator, Message, Provider,
    ProviderError, Session, Status,
};

/// A stand-in exclusive transport: opens at once, counts what it would send.
struct Counting(AtomicU64);

impl Provider for Counting {
    fn id(&self) -> &str {
        "demo"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exclusive_session: true,
        }
    }
    fn start(&self, session: Session) -> Result<(), ProviderError> {
        session.status().report(Status::Open);
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, _: &str, _: &str) -> Result<(), ProviderError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn main() -> ExitCode {
    let mut port: u16 = 9464;
    let mut messages: u64 = 1000;
    let mut args = lexopt::Parser::from_env();
    loop {
        use lexopt::prelude::*;
        let arg = match args.next() {
            Ok(Some(arg)) => arg,
            Ok(None) => break,
            Err(e) => return usage(&e.to_string()),
        };
        let parsed = match arg {
            Long("port") => args
                .value()
                .and_then(|v| v.parse())
                .map(|p| port = p)
                .map_err(|e| format!("--port: {e}")),
            Long("messages") => args
                .value()
                .and_then(|v| v.parse())
                .map(|n| messages = n)
                .map_err(|e| format!("--messages: {e}")),
            Long("help") | Short('h') => return usage(""),
            other => Err(other.unexpected().to_string()),
        };
        if let Err(e) = parsed {
            return usage(&e);
        }
    }
    match run(port, messages) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metrics_server: {e}");
            ExitCode::from(1)
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    if !problem.is_empty() {
        eprintln!("{problem}");
    }
    eprintln!("usage: cargo run --example metrics_server -- [--port N] [--messages N]");
    ExitCode::from(if problem.is_empty() { 0 } else { 2 })
}

fn run(port: u16, messages: u64) -> Result<(), String> {
    let coordinator = Arc::new(MemoryCoordinator::new());
    let bot = Bot::builder()
        .id("metrics-demo")
        .coordination(CoordinationConfig::new(CoordinatorConfig::Shared(
            coordinator,
        )))
        .provider(Arc::new(Counting(AtomicU64::new(0))))
        .handler(|ctx| Ok(ctx.reply("ok")?))
        .build()
        .map_err(|e| format!("cannot start the bot: {e}"))?;
    let bot = Arc::new(bot);
    signals::stop_on_signal(&bot, || eprintln!("metrics_server: stopped"))
        .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    let intake = bot.intake();
    for i in 0..messages {
        let m = Message::new(format!("chat-{}", i % 50), "hi").with_id(i.to_string());
        if let Err(e) = intake.deliver(m) {
            eprintln!("{e}");
        }
    }
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("serving http://{addr}/metrics (SIGTERM or Ctrl-C stops)");
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                if let Err(e) = serve(s, &bot) {
                    eprintln!("a scrape failed: {e}");
                }
            }
            Err(e) => eprintln!("accept: {e}"),
        }
    }
    Ok(())
}

/// Answers one HTTP/1.x request: `GET /metrics` gets the exposition, anything else
/// a 404. The connection is closed after the answer.
fn serve(stream: TcpStream, bot: &Bot) -> std::io::Result<()> {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Headers up to the blank line; their content does not matter here.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next(), parts.next());
    let (status, content_type, body) = match (method, path) {
        (Some("GET"), Some("/metrics")) => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            bot.metrics_text(),
        ),
        _ => ("404 Not Found", "text/plain", "try /metrics\n".to_owned()),
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}
