//! The one admin command the harness sends Redis itself, in plain RESP over its own
//! connection (straight to the server, not through the proxy): no client library
//! state to keep across Redis restarts.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long the admin connection waits for Redis.
const TIMEOUT: Duration = Duration::from_secs(2);

/// `CLIENT KILL TYPE pubsub` on the server at `127.0.0.1:port`: closes every subscriber
/// connection. Returns how many it closed.
///
/// # Errors
/// When the server cannot be reached or answers with an error.
pub fn client_kill_pubsub(port: u16) -> Result<i64, String> {
    let command = ["CLIENT", "KILL", "TYPE", "pubsub"];
    let mut request = format!("*{}\r\n", command.len());
    for part in command {
        request.push_str(&format!("${}\r\n{part}\r\n", part.len()));
    }
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| format!("cannot reach Redis on 127.0.0.1:{port}: {e}"))?;
    let _ = stream.set_read_timeout(Some(TIMEOUT));
    let _ = stream.set_write_timeout(Some(TIMEOUT));
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("cannot send CLIENT KILL: {e}"))?;
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .map_err(|e| format!("no answer to CLIENT KILL: {e}"))?;
    let reply = reply.trim_end();
    match reply.strip_prefix(':') {
        Some(n) => n
            .parse()
            .map_err(|_| format!("CLIENT KILL answered {reply:?}")),
        None => Err(format!("CLIENT KILL answered {reply:?}")),
    }
}
