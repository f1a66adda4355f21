//! An echo bot on Telegram: every text message is answered with one `sendMessage`
//! carrying the same text to the same chat.
//!
//! ```sh
//! cargo run --release --features telegram --example telegram_echo -- --token TOKEN \
//!     [--api-url URL] [--redis-url URL] [--replica-id ID] \
//!     [--webhook-listen 0.0.0.0:8443 --webhook-secret SECRET]
//! ```
//!
//! Without `--redis-url` it runs alone on the memory backend; with it, start it
//! several times (each with its own `--replica-id`): one replica long-polls, the
//! others stand by. With `--webhook-listen` it does not poll: it serves the webhook
//! endpoint over plain HTTP on that address (put TLS in front; run one on every
//! replica) and only sends. SIGTERM or SIGINT stops it cleanly: intake closes, the
//! messages taken in finish, the leader hands the polling over at once.
//!
//! The HTTP serving here is deliberately tiny (one request per connection, a
//! `Content-Length` body of at most 1 MiB): enough for Telegram's webhook calls, not
//! a general server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::telegram::{SECRET_HEADER, Telegram, TelegramConfig, Update, Webhook};
use botmesh::{Bot, CoordinationConfig, CoordinatorConfig};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

#[path = "common/stderr_log.rs"]
mod stderr_log;

const USAGE: &str = "\
usage: telegram_echo --token TOKEN [--api-url URL] [--redis-url URL] [--replica-id ID]
                     [--webhook-listen ADDR --webhook-secret SECRET]

Answers every text message with the same text. Alone on the memory backend, or with
--redis-url as one of several replicas (one long-polls, the others stand by). With
--webhook-listen it serves Telegram's webhook calls over plain HTTP on ADDR instead of
polling (put TLS in front). botmesh's warnings go to stderr (BOTMESH_LOG=info or debug
for more, off for none). SIGTERM or SIGINT stops it cleanly.";

struct Args {
    token: String,
    api_url: Option<String>,
    redis_url: Option<String>,
    replica_id: Option<String>,
    webhook_listen: Option<String>,
    webhook_secret: Option<String>,
}

fn args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut a = Args {
        token: String::new(),
        api_url: None,
        redis_url: None,
        replica_id: None,
        webhook_listen: None,
        webhook_secret: None,
    };
    let mut parser = lexopt::Parser::from_env();
    let value = |p: &mut lexopt::Parser, flag: &str| -> Result<String, String> {
        p.value()
            .map_err(|e| format!("{flag}: {e}"))?
            .into_string()
            .map_err(|_| format!("{flag}: not UTF-8"))
    };
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("token") => a.token = value(&mut parser, "--token")?,
            Long("api-url") => a.api_url = Some(value(&mut parser, "--api-url")?),
            Long("redis-url") => a.redis_url = Some(value(&mut parser, "--redis-url")?),
            Long("replica-id") => a.replica_id = Some(value(&mut parser, "--replica-id")?),
            Long("webhook-listen") => {
                a.webhook_listen = Some(value(&mut parser, "--webhook-listen")?)
            }
            Long("webhook-secret") => {
                a.webhook_secret = Some(value(&mut parser, "--webhook-secret")?)
            }
            Short('h') | Long("help") => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => {
                return Err(format!(
                    "unexpected argument: {}\n{USAGE}",
                    other.unexpected()
                ));
            }
        }
    }
    if a.token.is_empty() {
        return Err(format!(
            "--token: missing; use the token @BotFather gave\n{USAGE}"
        ));
    }
    if let Some(addr) = &a.webhook_listen {
        addr.parse::<std::net::SocketAddr>()
            .map_err(|e| format!("--webhook-listen {addr:?}: not a socket address ({e})"))?;
        if a.webhook_secret.is_none() {
            eprintln!(
                "telegram_echo: warning: --webhook-listen without --webhook-secret accepts \
                 calls from anyone who finds the address"
            );
        }
    } else if a.webhook_secret.is_some() {
        return Err("--webhook-secret: only used with --webhook-listen".into());
    }
    Ok(a)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("telegram_echo: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let a = args()?;
    // Without a logger botmesh's warnings (a refused token, an API it cannot reach)
    // would go nowhere.
    stderr_log::StderrLog::install(
        a.replica_id.as_deref().unwrap_or("telegram_echo"),
        Some(log::LevelFilter::Warn),
    );
    let mut config = TelegramConfig::new(a.token.as_str());
    if let Some(url) = &a.api_url {
        config = config.with_api_url(url.as_str());
    }
    let webhook = a.webhook_listen.is_some();
    let telegram = if webhook {
        Telegram::webhook(config)
    } else {
        Telegram::long_polling(config)
    }
    .map_err(|e| e.to_string())?;
    let mut builder = Bot::builder()
        .provider(Arc::new(telegram))
        .handler(|ctx| {
            // Only text messages (a sticker or a photo without a caption has none).
            let has_text = ctx
                .message()
                .payload::<Update>()
                .and_then(|u| u.message.as_ref())
                .is_some_and(|m| m.text.is_some());
            if has_text {
                ctx.reply(&ctx.message().text)?;
            }
            Ok(())
        })
        .on_error(|e| eprintln!("{e}"));
    if let Some(id) = &a.replica_id {
        builder = builder.id(id.as_str());
    }
    if let Some(url) = &a.redis_url {
        let options = RedisOptions::new(url.as_str()).with_key_prefix("telegram_echo");
        let coordinator = RedisCoordinator::connect(options).map_err(|e| e.to_string())?;
        builder = builder.coordination(CoordinationConfig::new(CoordinatorConfig::Shared(
            Arc::new(coordinator),
        )));
    }
    let bot = builder.build().map_err(|e| e.to_string())?;
    eprintln!("telegram_echo: replica {} running", bot.id());
    if let Some(addr) = &a.webhook_listen {
        let hook = match &a.webhook_secret {
            Some(s) => Webhook::new(bot.intake(), s.as_str()).map_err(|e| e.to_string())?,
            None => Webhook::without_secret(bot.intake()),
        };
        let listener =
            TcpListener::bind(addr).map_err(|e| format!("--webhook-listen {addr}: {e}"))?;
        eprintln!("telegram_echo: webhook on http://{addr}/");
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let hook = hook.clone();
                std::thread::spawn(move || serve(conn, &hook));
            }
        });
    }
    let mut signals = Signals::new([SIGTERM, SIGINT]).map_err(|e| e.to_string())?;
    if let Some(sig) = signals.forever().next() {
        eprintln!("telegram_echo: signal {sig}, stopping");
    }
    // Requests still arriving are answered 503 from here on, so Telegram retries
    // them on another replica.
    bot.shutdown();
    eprintln!("telegram_echo: stopped");
    Ok(())
}

/// One webhook request: its secret header and body to the handler, its status back.
fn serve(conn: TcpStream, hook: &Webhook) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let status = match read_request(&conn) {
        Some((secret, body)) => hook.handle(secret.as_deref(), &body),
        None => 400,
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut conn = conn;
    let _ = write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
}

/// The secret header and the body of a POST, or `None` for anything else.
fn read_request(conn: &TcpStream) -> Option<(Option<String>, Vec<u8>)> {
    const MAX_BODY: usize = 1 << 20;
    const MAX_HEAD: u64 = 16 * 1024;
    // The request line and headers together, bounded before anything is checked: a
    // caller without the secret must not make it buffer without end.
    let mut reader = BufReader::new(conn.try_clone().ok()?.take(MAX_HEAD));
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    if !line.starts_with("POST ") {
        return None;
    }
    let (mut secret, mut length) = (None, 0usize);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h.len() > 8192 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        if k.eq_ignore_ascii_case("content-length") {
            length = v.trim().parse().ok()?;
        } else if k.eq_ignore_ascii_case(SECRET_HEADER) {
            secret = Some(v.trim().to_owned());
        }
    }
    if length > MAX_BODY {
        return None;
    }
    // The body may be longer than what is left of the head's bound.
    reader.get_mut().set_limit(length as u64);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((secret, body))
}
