//! Who holds what, read-only: a table (or one JSON object) of the held chats, their
//! holders, tokens, lease time left and queues, the live replicas and the provider
//! leaders under one key prefix of a Redis server. It never takes, extends or breaks a
//! lease (plain reads, `SCAN` with `COUNT`, `PUBSUB CHANNELS`), and stops at
//! `--limit` chats on a large keyspace.
//!
//! ```sh
//! cargo run --example inspect -- --redis-url redis://127.0.0.1:6379 [--key-prefix botmesh] \
//!     [--chat ID] [--json] [--limit 100]
//! ```
//!
//! The URL may also come from the environment (`--redis-url-env VAR`), so the password
//! stays off the command line. `--json` prints
//! `{"chats": [{"chat", "holder", "token", "lease_ms_left", "queued"}…], "replicas": […],
//! "leaders": [{"provider", "holder", "token"}…], "truncated": bool}`: the chats held or
//! waited for; with `--chat` the `chats` list has that one chat (its `holder` null when
//! free) and `previous`.
//! Exit status: 0 done, 1 Redis failed, 2 bad command line.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use botmesh::redis::{RedisCoordinator, RedisOptions};
use botmesh::{ChatView, Coordinator, MeshView};
use serde_json::{Value, json};

struct Args {
    url: String,
    prefix: String,
    chat: Option<String>,
    json: bool,
    limit: usize,
}

const USAGE: &str =
    "usage: cargo run --example inspect -- (--redis-url URL | --redis-url-env VAR) \
[--key-prefix P] [--chat ID] [--json] [--limit N]

Read-only view of a botmesh mesh over Redis: the chats held or waited for (holder,
fencing token, lease left, queue length), the live replicas and the provider leaders.

  --redis-url URL       the Redis (or cluster node) to read
  --redis-url-env VAR   the same, from an environment variable (keeps a password out of ps)
  --key-prefix P        the replicas' key prefix [default: botmesh]
  --chat ID             one chat only, with its previous holder
  --json                one JSON object instead of the table
  --limit N             at most N held or waited-for chats shown [default: 100]; idle
                        chats are read and skipped, at most 100,000 keys looked at in all";

fn parse() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_env();
    let (mut url, mut prefix, mut chat, mut json, mut limit) =
        (None, "botmesh".to_owned(), None, false, 100usize);
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        let value = |p: &mut lexopt::Parser, name: &str| -> Result<String, String> {
            p.value()
                .map_err(|e| format!("{name}: {e}"))?
                .into_string()
                .map_err(|_| format!("{name}: not UTF-8"))
        };
        match arg {
            Long("redis-url") => url = Some(value(&mut p, "--redis-url")?),
            Long("redis-url-env") => {
                let var = value(&mut p, "--redis-url-env")?;
                url = Some(std::env::var(&var).map_err(|_| {
                    format!("--redis-url-env: the environment variable {var:?} is not set")
                })?);
            }
            Long("key-prefix") => prefix = value(&mut p, "--key-prefix")?,
            Long("chat") => {
                let id = value(&mut p, "--chat")?;
                if id.is_empty() {
                    return Err("--chat: an empty chat id names no chat".to_owned());
                }
                chat = Some(id);
            }
            Long("json") => json = true,
            Long("limit") => {
                let v = value(&mut p, "--limit")?;
                limit = v
                    .parse()
                    .map_err(|_| format!("--limit: {v:?} is not a whole number"))?;
            }
            Long("help") | Short('h') => return Err(String::new()),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let url = url.ok_or("--redis-url (or --redis-url-env) is required")?;
    Ok(Args {
        url,
        prefix,
        chat,
        json,
        limit,
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("inspect: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let options = RedisOptions::new(args.url.as_str()).with_key_prefix(args.prefix.as_str());
    let coordinator = match RedisCoordinator::connect(options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("inspect: {e}");
            return ExitCode::from(1);
        }
    };
    let result = match &args.chat {
        Some(chat) => coordinator.inspect_chat(chat).map(|v| {
            let mesh = MeshView {
                chats: vec![v],
                ..MeshView::default()
            };
            (mesh, true)
        }),
        None => coordinator.inspect(args.limit).map(|m| (m, false)),
    };
    match result {
        Ok((mesh, one)) => {
            let text = if args.json {
                format!("{}\n", to_json(&mesh, one))
            } else {
                table(&mesh, one)
            };
            // Written at once, and a closed pipe (`inspect | head`) is not an error.
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("inspect: {e}");
                    ExitCode::from(1)
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("inspect: {e}");
            ExitCode::from(1)
        }
    }
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn chat_json(v: &ChatView, one: bool) -> Value {
    let mut o = json!({
        "chat": v.chat,
        "holder": v.holder.as_ref().map(|h| h.ticket.replica.to_string()),
        "token": v.holder.as_ref().map(|h| h.token),
        "lease_ms_left": v.holder.as_ref().map(|h| ms(h.lease_left)),
        "queued": v.queued,
    });
    if one {
        o["previous"] = json!(v.previous.as_ref().map(|p| json!({
            "holder": p.replica.to_string(), "token": p.token
        })));
    }
    o
}

fn to_json(m: &MeshView, one: bool) -> Value {
    json!({
        "chats": m.chats.iter().map(|v| chat_json(v, one)).collect::<Vec<_>>(),
        "replicas": m.replicas.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
        "leaders": m.leaders.iter().map(|l| json!({
            "provider": l.provider,
            "holder": l.holder.as_ref().map(|h| h.ticket.replica.to_string()),
            "token": l.holder.as_ref().map(|h| h.token),
            "standbys": l.standbys,
        })).collect::<Vec<_>>(),
        "truncated": m.truncated,
    })
}

/// The view as the text table the command prints.
fn table(m: &MeshView, one: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<16} {:>18} {:>9} {:>7}{}",
        "CHAT",
        "HOLDER",
        "TOKEN",
        "LEASE_MS",
        "QUEUED",
        if one { "  PREVIOUS" } else { "" }
    );
    for v in &m.chats {
        let (holder, token, left) = match &v.holder {
            Some(h) => (
                h.ticket.replica.to_string(),
                h.token.to_string(),
                ms(h.lease_left).to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let previous = match (&v.previous, one) {
            (Some(p), true) => format!("  {} #{}", p.replica, p.token),
            (None, true) => "  -".into(),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<24} {holder:<16} {token:>18} {left:>9} {:>7}{previous}",
            format!("{:?}", v.chat),
            v.queued
        );
    }
    if one {
        return out;
    }
    if m.truncated {
        let _ = writeln!(
            out,
            "(truncated: more chats than --limit, or over 100,000 keys scanned; a narrower --key-prefix helps there)"
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "replicas ({}): {}",
        m.replicas.len(),
        if m.replicas.is_empty() {
            "none".to_owned()
        } else {
            m.replicas.join(", ")
        }
    );
    for l in &m.leaders {
        let _ = match &l.holder {
            Some(h) => writeln!(
                out,
                "leader of {:?}: {} (token {}, lease {} ms left), {} standby(s)",
                l.provider,
                h.ticket.replica,
                h.token,
                ms(h.lease_left),
                l.standbys
            ),
            None => writeln!(
                out,
                "leader of {:?}: none, {} standby(s)",
                l.provider, l.standbys
            ),
        };
    }
    out
}
