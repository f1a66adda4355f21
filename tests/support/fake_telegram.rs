//! A fake Telegram Bot API on a loopback port (std `TcpListener`, one thread per
//! connection, a minimal HTTP/1.1 reading of each request, `Connection: close`).
//!
//! It keeps the updates pushed to it and the confirmed offset; holds a `getUpdates`
//! until an update is there or its `timeout` runs out; answers `409` to the older of
//! two concurrent polls (as Telegram does) and ends a held poll whose client went away;
//! answers `429` to every Nth poll when asked; records every poll (with the client's
//! label) and every `sendMessage` with its time.
//!
//! A client's label is the path before `/bot<token>/`: give each replica an API URL of
//! its own (`url_for("a")`) to tell their polls apart.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How one poll ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PollEnd {
    /// Answered with this many updates.
    Updates(usize),
    /// Answered 409: a newer poll came.
    Conflict,
    /// Answered 429.
    RateLimited,
    /// The client went away while it was held (a killed process).
    Gone,
}

/// One `getUpdates`.
#[derive(Clone, Debug)]
pub struct Poll {
    pub label: String,
    pub start: Instant,
    pub end: Option<(Instant, PollEnd)>,
    /// The offset it confirmed, if it gave one.
    pub offset: Option<i64>,
}

/// A 409 given to a held poll: whose poll it ended, whose newer poll caused it.
#[derive(Clone, Debug)]
pub struct Conflict {
    pub older: String,
    pub newer: String,
    pub at: Instant,
}

/// One recorded `sendMessage`.
#[derive(Clone, Debug)]
pub struct Sent {
    pub label: String,
    pub chat: Value,
    pub text: String,
    pub markup: Option<Value>,
    pub at: Instant,
}

#[derive(Default)]
struct State {
    /// Every update pushed, in order of id.
    updates: Vec<(i64, Value)>,
    next_id: i64,
    /// Updates below this id are confirmed (forgotten by getUpdates).
    confirmed: i64,
    polls: Vec<Poll>,
    /// The poll held now, by index into `polls`.
    held: Option<usize>,
    /// Polls told to end with 409, by index.
    conflicted: Vec<usize>,
    conflicts: Vec<Conflict>,
    sends: Vec<Sent>,
    send_attempts: usize,
    /// Status codes for the next sendMessage calls (429, 500…), then success.
    send_faults: VecDeque<u16>,
    /// Every Nth poll is answered 429 with retry_after 1 (0: never).
    rate_limit_every: u64,
    poll_count: u64,
}

pub struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<(Mutex<State>, Condvar)>,
    stop: Arc<AtomicBool>,
}

fn lock(shared: &(Mutex<State>, Condvar)) -> MutexGuard<'_, State> {
    shared.0.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeTelegram {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new((
            Mutex::new(State {
                next_id: 1,
                confirmed: 1,
                ..State::default()
            }),
            Condvar::new(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (shared.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        FakeTelegram { addr, shared, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The API URL for a client labelled `label`.
    pub fn url_for(&self, label: &str) -> String {
        format!("http://{}/{label}", self.addr)
    }

    /// Queues a text message from a private chat; returns its update id.
    pub fn push_text(&self, chat: i64, text: &str) -> i64 {
        let mut g = lock(&self.shared);
        let id = g.next_id;
        g.next_id += 1;
        let update = json!({"update_id": id, "message": {"message_id": id, "date": 0,
            "chat": {"id": chat, "type": "private"}, "from": {"id": chat, "first_name": "u"},
            "text": text}});
        g.updates.push((id, update));
        self.shared.1.notify_all();
        id
    }

    /// Queues an update of any shape (its `update_id` is set here); returns the id.
    pub fn push_update(&self, mut update: Value) -> i64 {
        let mut g = lock(&self.shared);
        let id = g.next_id;
        g.next_id += 1;
        update["update_id"] = json!(id);
        g.updates.push((id, update));
        self.shared.1.notify_all();
        id
    }

    /// The lowest update id not confirmed yet.
    pub fn confirmed(&self) -> i64 {
        lock(&self.shared).confirmed
    }

    pub fn polls(&self) -> Vec<Poll> {
        lock(&self.shared).polls.clone()
    }

    pub fn conflicts(&self) -> Vec<Conflict> {
        lock(&self.shared).conflicts.clone()
    }

    pub fn sends(&self) -> Vec<Sent> {
        lock(&self.shared).sends.clone()
    }

    pub fn send_attempts(&self) -> usize {
        lock(&self.shared).send_attempts
    }

    pub fn rate_limit_every(&self, n: u64) {
        lock(&self.shared).rate_limit_every = n;
    }

    pub fn fail_next_sends(&self, codes: &[u16]) {
        lock(&self.shared).send_faults.extend(codes);
    }

    /// Waits until `done(state)` holds, up to `timeout`; woken by every change.
    fn wait(&self, timeout: Duration, done: impl Fn(&State) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.shared);
        loop {
            if done(&g) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self
                .shared
                .1
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits until `n` messages were sent.
    pub fn wait_sends(&self, n: usize, timeout: Duration) -> bool {
        self.wait(timeout, |s| s.sends.len() >= n)
    }

    /// Waits until every text in `texts` was sent at least once.
    pub fn wait_sent_all(&self, texts: &[String], timeout: Duration) -> bool {
        self.wait(timeout, |s| {
            let sent: std::collections::HashSet<&str> =
                s.sends.iter().map(|x| x.text.as_str()).collect();
            texts.iter().all(|t| sent.contains(t.as_str()))
        })
    }

    /// Waits until every pushed update is confirmed.
    pub fn wait_all_confirmed(&self, timeout: Duration) -> bool {
        self.wait(timeout, |s| s.confirmed >= s.next_id)
    }

    /// Waits for the first poll started after `after` whose label `fits`; returns it.
    pub fn wait_poll(
        &self,
        after: Instant,
        timeout: Duration,
        fits: impl Fn(&str) -> bool,
    ) -> Option<Poll> {
        let find = |s: &State| {
            s.polls
                .iter()
                .find(|p| p.start >= after && fits(&p.label))
                .cloned()
        };
        if self.wait(timeout, |s| find(s).is_some()) {
            find(&lock(&self.shared))
        } else {
            None
        }
    }

    /// Waits for the first 409 given to a held poll; returns it.
    pub fn wait_conflict(&self, timeout: Duration) -> Option<Conflict> {
        if self.wait(timeout, |s| !s.conflicts.is_empty()) {
            lock(&self.shared).conflicts.first().cloned()
        } else {
            None
        }
    }

    /// The label of the poll held now, if any.
    pub fn held_by(&self) -> Option<String> {
        let g = lock(&self.shared);
        g.held.map(|i| g.polls[i].label.clone())
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Reads one request: (path, body).
fn read_request(conn: &TcpStream) -> Option<(String, Vec<u8>)> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((path, body))
}

fn respond(mut conn: &TcpStream, status: u16, body: &Value) {
    let text = body.to_string();
    let reason = match status {
        200 => "OK",
        409 => "Conflict",
        429 => "Too Many Requests",
        _ => "Error",
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = conn.flush();
}

fn error(code: u16, description: &str) -> Value {
    json!({"ok": false, "error_code": code, "description": description})
}

/// Whether the peer closed the connection (a held poll's client died).
fn gone(conn: &TcpStream) -> bool {
    if conn.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let closed = matches!(conn.peek(&mut b), Ok(0));
    let _ = conn.set_nonblocking(false);
    closed
}

fn serve(conn: TcpStream, shared: &(Mutex<State>, Condvar)) {
    let Some((path, body)) = read_request(&conn) else {
        return;
    };
    let Some(at) = path.find("/bot") else {
        respond(&conn, 404, &error(404, "Not Found"));
        return;
    };
    let label = path[..at].trim_start_matches('/').to_owned();
    let method = path.rsplit('/').next().unwrap_or("").to_owned();
    let params: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match method.as_str() {
        "getUpdates" => get_updates(&conn, shared, label, &params),
        "sendMessage" => send_message(&conn, shared, label, &params),
        "getMe" => respond(
            &conn,
            200,
            &json!({"ok": true, "result": {"id": 1, "is_bot": true, "first_name": "fake"}}),
        ),
        _ => respond(&conn, 404, &error(404, "Not Found: method not found")),
    }
}

fn get_updates(conn: &TcpStream, shared: &(Mutex<State>, Condvar), label: String, p: &Value) {
    let offset = p["offset"].as_i64();
    let timeout = Duration::from_secs(p["timeout"].as_u64().unwrap_or(0));
    let limit = p["limit"].as_u64().unwrap_or(100) as usize;
    let me;
    let start;
    {
        let mut g = lock(shared);
        // Read under the lock, so polls' starts rise with their order in `polls`: a
        // start read before it let a poll registered after a newer one carry the
        // earlier start, and `wait_poll(conflict.at, ..)` then found the very poll
        // the 409 was about to end, before its client had seen the 409.
        start = Instant::now();
        g.poll_count += 1;
        if g.rate_limit_every > 0 && g.poll_count.is_multiple_of(g.rate_limit_every) {
            g.polls.push(Poll {
                label,
                start,
                end: Some((start, PollEnd::RateLimited)),
                offset,
            });
            shared.1.notify_all();
            drop(g);
            let mut e = error(429, "Too Many Requests: retry after 1");
            e["parameters"] = json!({"retry_after": 1});
            respond(conn, 429, &e);
            return;
        }
        if let Some(o) = offset {
            g.confirmed = g.confirmed.max(o);
        }
        me = g.polls.len();
        g.polls.push(Poll {
            label: label.clone(),
            start,
            end: None,
            offset,
        });
        if let Some(older) = g.held.replace(me) {
            g.conflicted.push(older);
            let older_label = g.polls[older].label.clone();
            g.conflicts.push(Conflict {
                older: older_label,
                newer: label,
                at: start,
            });
        }
        shared.1.notify_all();
    }
    let deadline = start + timeout;
    let mut g = lock(shared);
    let (status, answer, end) = loop {
        if g.conflicted.contains(&me) {
            break (
                409,
                error(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                ),
                PollEnd::Conflict,
            );
        }
        let confirmed = g.confirmed;
        let ready: Vec<Value> = g
            .updates
            .iter()
            .filter(|(id, _)| *id >= confirmed)
            .take(limit)
            .map(|(_, u)| u.clone())
            .collect();
        let now = Instant::now();
        if !ready.is_empty() || now >= deadline {
            let n = ready.len();
            break (
                200,
                json!({"ok": true, "result": ready}),
                PollEnd::Updates(n),
            );
        }
        if gone(conn) {
            g.polls[me].end = Some((now, PollEnd::Gone));
            if g.held == Some(me) {
                g.held = None;
            }
            shared.1.notify_all();
            return;
        }
        let slice = (deadline - now).min(Duration::from_millis(20));
        g = shared
            .1
            .wait_timeout(g, slice)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    };
    g.polls[me].end = Some((Instant::now(), end));
    if g.held == Some(me) {
        g.held = None;
    }
    shared.1.notify_all();
    drop(g);
    respond(conn, status, &answer);
}

fn send_message(conn: &TcpStream, shared: &(Mutex<State>, Condvar), label: String, p: &Value) {
    let mut g = lock(shared);
    g.send_attempts += 1;
    if let Some(code) = g.send_faults.pop_front() {
        shared.1.notify_all();
        drop(g);
        let mut e = error(code, "injected fault");
        if code == 429 {
            e["parameters"] = json!({"retry_after": 1});
        }
        respond(conn, code, &e);
        return;
    }
    let text = p["text"].as_str().unwrap_or("").to_owned();
    let id = g.sends.len() as i64 + 1;
    g.sends.push(Sent {
        label,
        chat: p["chat_id"].clone(),
        text: text.clone(),
        markup: p.get("reply_markup").cloned(),
        at: Instant::now(),
    });
    shared.1.notify_all();
    drop(g);
    respond(
        conn,
        200,
        &json!({"ok": true, "result": {"message_id": id, "date": 0,
            "chat": {"id": p["chat_id"].clone(), "type": "private"}, "text": text}}),
    );
}
