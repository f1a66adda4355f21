//! Test transports. [`Outbox`]: a provider with no platform behind it, for bots that
//! only need somewhere to send (flows' prompts and answers), recording what they send.
//! [`Server`] and [`Client`]: an exclusive-session platform on loopback TCP that
//! allows one session at a time, as WhatsApp Web ("replaced") and Telegram long
//! polling (`409 Conflict`) do, and a client [`Provider`](botmesh::Provider) that
//! talks to it.
//!
//! The server is the judge of the leadership tests: a newer session closes the older
//! one and counts a *conflict*, so "never two leaders" reads as "no conflict". It also
//! fences (Kleppmann 2016): a session or a send whose token is lower than the highest
//! it has seen is refused. Bound to 127.0.0.1 only.
//!
//! Protocol, one line per message, fields separated by tabs:
//!
//! | from | line | meaning |
//! | --- | --- | --- |
//! | client | `HELLO replica token` | open a session (`-` for no token) |
//! | server | `OK` / `FENCED max` / `DENIED` | session open / stale token / replica logged out |
//! | server | `MSG id chat text` | an incoming message for the session |
//! | server | `REPLACED` / `LOGGEDOUT` | the session was closed by a newer one / by `deny` |
//! | client | `BYE` | close the session; the server answers `BYE` once it recorded the end |
//! | client | `SEND replica token chat text` | on a connection of its own: send a reply; answered `OK` or `FENCED max` |

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use botmesh::{
    Capabilities, CloseReason, Message, Provider, ProviderError, Session, Status, Token,
};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn token_field(token: Option<Token>) -> String {
    token.map_or_else(|| "-".to_owned(), |t| t.to_string())
}

/// What the server saw, in order, with the server's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A session opened.
    Opened {
        replica: String,
        token: Option<Token>,
        at: Instant,
    },
    /// A session ended: `bye` (the client closed it), `eof` (its connection died),
    /// `replaced` (a newer session took over), `logged out` (by [`Server::deny`]).
    Closed {
        replica: String,
        token: Option<Token>,
        why: &'static str,
        at: Instant,
    },
    /// A newer session replaced a live one: two clients used the session at once.
    Conflict { old: String, new: String },
    /// A session or a send with a token below the highest seen was refused.
    Fenced {
        replica: String,
        token: Token,
        max: Token,
    },
    /// A session refused because its replica was logged out.
    Denied { replica: String },
    /// A send was accepted.
    Sent {
        replica: String,
        token: Option<Token>,
        chat: String,
        text: String,
    },
}

/// One send an [`Outbox`] saw: (replica, chat, text).
pub type Sent = (String, String, String);

/// A provider with no platform behind it: every send succeeds and, unless mute, is
/// recorded on a channel that the replicas of a test may share.
pub struct Outbox {
    replica: String,
    sent: Option<Sender<Sent>>,
}

impl Outbox {
    /// Records the sends of `replica` on `sent`.
    pub fn new(replica: &str, sent: Sender<Sent>) -> Self {
        Outbox {
            replica: replica.to_owned(),
            sent: Some(sent),
        }
    }

    /// Drops every send.
    pub fn mute() -> Self {
        Outbox {
            replica: String::new(),
            sent: None,
        }
    }
}

impl Provider for Outbox {
    fn id(&self) -> &str {
        "test-outbox"
    }
    fn start(&self, _session: Session) -> Result<(), ProviderError> {
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        if let Some(sent) = &self.sent {
            let _ = sent.send((self.replica.clone(), chat.to_owned(), text.to_owned()));
        }
        Ok(())
    }
}

struct Live {
    id: u64,
    replica: String,
    token: Option<Token>,
    stream: TcpStream,
}

#[derive(Default)]
struct State {
    next_id: u64,
    sessions: Vec<Live>,
    max_token: Token,
    conflicts: u64,
    fenced: u64,
    denied: HashSet<String>,
    history: Vec<Event>,
    next_msg: u64,
}

struct Shared {
    exclusive: bool,
    state: Mutex<State>,
    events: Sender<Event>,
    stop: AtomicBool,
}

impl Shared {
    fn emit(&self, state: &mut State, event: Event) {
        state.history.push(event.clone());
        let _ = self.events.send(event);
    }
}

/// The test platform. Exclusive: one session at a time; shared: any number.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    events: Receiver<Event>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Starts a server on a free loopback port.
    pub fn start(exclusive: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the test platform");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = unbounded();
        let shared = Arc::new(Shared {
            exclusive,
            state: Mutex::new(State::default()),
            events: tx,
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(&s, conn));
            }
        });
        Server {
            addr,
            shared,
            events: rx,
            accept: Some(accept),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sessions replaced by a newer one: 0 when never two clients held the session.
    pub fn conflicts(&self) -> u64 {
        lock(&self.shared.state).conflicts
    }

    /// Sessions and sends refused for a stale token.
    pub fn fenced(&self) -> u64 {
        lock(&self.shared.state).fenced
    }

    /// The highest token seen.
    pub fn max_token(&self) -> Token {
        lock(&self.shared.state).max_token
    }

    /// The open sessions: (replica, token).
    pub fn sessions(&self) -> Vec<(String, Option<Token>)> {
        lock(&self.shared.state)
            .sessions
            .iter()
            .map(|s| (s.replica.clone(), s.token))
            .collect()
    }

    /// Everything seen so far, in order.
    pub fn history(&self) -> Vec<Event> {
        lock(&self.shared.state).history.clone()
    }

    /// The next event, waiting at most `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Option<Event> {
        self.events.recv_timeout(timeout).ok()
    }

    /// Skips events until one matches, waiting at most `timeout` in all.
    pub fn wait_for(&self, timeout: Duration, mut f: impl FnMut(&Event) -> bool) -> Option<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(e) if f(&e) => return Some(e),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// Waits for the next session to open (skipping other events); `None` after
    /// `timeout`.
    pub fn wait_opened(&self, timeout: Duration) -> Option<(String, Option<Token>, Instant)> {
        match self.wait_for(timeout, |e| matches!(e, Event::Opened { .. }))? {
            Event::Opened { replica, token, at } => Some((replica, token, at)),
            _ => None,
        }
    }

    /// Logs `replica` out: its session is closed (`LOGGEDOUT`) and it cannot open a
    /// new one until [`Server::allow`].
    pub fn deny(&self, replica: &str) {
        let mut st = lock(&self.shared.state);
        st.denied.insert(replica.to_owned());
        let (out, keep): (Vec<Live>, Vec<Live>) = std::mem::take(&mut st.sessions)
            .into_iter()
            .partition(|s| s.replica == replica);
        st.sessions = keep;
        for mut s in out {
            let _ = s.stream.write_all(b"LOGGEDOUT\n");
            let _ = s.stream.shutdown(Shutdown::Both);
            let event = Event::Closed {
                replica: s.replica,
                token: s.token,
                why: "logged out",
                at: Instant::now(),
            };
            self.shared.emit(&mut st, event);
        }
    }

    /// Lets a replica denied before open sessions again.
    pub fn allow(&self, replica: &str) {
        lock(&self.shared.state).denied.remove(replica);
    }

    /// Sends an incoming message to every open session; returns how many got it.
    pub fn inject(&self, chat: &str, text: &str) -> usize {
        let mut st = lock(&self.shared.state);
        st.next_msg += 1;
        let line = format!("MSG\t{}\t{chat}\t{text}\n", st.next_msg);
        st.sessions
            .iter()
            .filter(|s| (&s.stream).write_all(line.as_bytes()).is_ok())
            .count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in lock(&self.shared.state).sessions.drain(..) {
            let _ = s.stream.shutdown(Shutdown::Both);
        }
    }
}

fn parse_token(field: &str) -> Option<Option<Token>> {
    match field {
        "-" => Some(None),
        t => t.parse().ok().map(Some),
    }
}

/// One connection: a session (`HELLO`) or a send (`SEND`).
fn serve(shared: &Arc<Shared>, stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let fields: Vec<&str> = line.trim_end_matches('\n').split('\t').collect();
    match fields.as_slice() {
        ["HELLO", replica, token] => {
            if let Some(token) = parse_token(token) {
                session(shared, stream, reader, replica, token);
            }
        }
        ["SEND", replica, token, chat, text] => {
            if let Some(token) = parse_token(token) {
                send(shared, stream, replica, token, chat, text);
            }
        }
        _ => {}
    }
}

/// Checks a token against the highest seen; raises the highest. `Err(max)` if stale.
fn fence(st: &mut State, token: Option<Token>) -> Result<(), Token> {
    match token {
        Some(t) if t < st.max_token => {
            st.fenced += 1;
            Err(st.max_token)
        }
        Some(t) => {
            st.max_token = t;
            Ok(())
        }
        None => Ok(()),
    }
}

fn session(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    mut reader: BufReader<TcpStream>,
    replica: &str,
    token: Option<Token>,
) {
    let id = {
        let mut st = lock(&shared.state);
        if st.denied.contains(replica) {
            let _ = stream.write_all(b"DENIED\n");
            let event = Event::Denied {
                replica: replica.to_owned(),
            };
            shared.emit(&mut st, event);
            return;
        }
        if let Err(max) = fence(&mut st, token) {
            let _ = stream.write_all(format!("FENCED\t{max}\n").as_bytes());
            let event = Event::Fenced {
                replica: replica.to_owned(),
                token: token.unwrap_or(0),
                max,
            };
            shared.emit(&mut st, event);
            return;
        }
        if shared.exclusive {
            // The platform's rule: the newest session wins, the older one is closed.
            for mut old in std::mem::take(&mut st.sessions) {
                st.conflicts += 1;
                let _ = old.stream.write_all(b"REPLACED\n");
                let _ = old.stream.shutdown(Shutdown::Both);
                let now = Instant::now();
                let conflict = Event::Conflict {
                    old: old.replica.clone(),
                    new: replica.to_owned(),
                };
                shared.emit(&mut st, conflict);
                let closed = Event::Closed {
                    replica: old.replica,
                    token: old.token,
                    why: "replaced",
                    at: now,
                };
                shared.emit(&mut st, closed);
            }
        }
        let Ok(write_half) = stream.try_clone() else {
            return;
        };
        st.next_id += 1;
        let id = st.next_id;
        st.sessions.push(Live {
            id,
            replica: replica.to_owned(),
            token,
            stream: write_half,
        });
        // Under the lock: `OK` reaches the client before any `MSG` of this session.
        let _ = stream.write_all(b"OK\n");
        let event = Event::Opened {
            replica: replica.to_owned(),
            token,
            at: Instant::now(),
        };
        shared.emit(&mut st, event);
        id
    };
    let mut line = String::new();
    let why = loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break "eof",
            Ok(_) if line.trim_end() == "BYE" => break "bye",
            Ok(_) => {}
        }
    };
    let mut st = lock(&shared.state);
    if let Some(at) = st.sessions.iter().position(|s| s.id == id) {
        let s = st.sessions.remove(at);
        let event = Event::Closed {
            replica: s.replica,
            token: s.token,
            why,
            at: Instant::now(),
        };
        shared.emit(&mut st, event);
    }
    if why == "bye" {
        // After the end is recorded: a client whose stop returned is gone for sure.
        let _ = stream.write_all(b"BYE\n");
    }
}

fn send(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    replica: &str,
    token: Option<Token>,
    chat: &str,
    text: &str,
) {
    let mut st = lock(&shared.state);
    let reply = match fence(&mut st, token) {
        Err(max) => {
            let event = Event::Fenced {
                replica: replica.to_owned(),
                token: token.unwrap_or(0),
                max,
            };
            shared.emit(&mut st, event);
            format!("FENCED\t{max}\n")
        }
        Ok(()) => {
            let event = Event::Sent {
                replica: replica.to_owned(),
                token,
                chat: chat.to_owned(),
                text: text.to_owned(),
            };
            shared.emit(&mut st, event);
            "OK\n".to_owned()
        }
    };
    drop(st);
    let _ = stream.write_all(reply.as_bytes());
}

/// What a [`Client`] tells its test about what the runtime did with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The runtime started the transport (this replica leads, or shared mode).
    Started {
        replica: String,
        token: Option<Token>,
    },
    /// The runtime stopped the transport; the session is closed.
    Stopped { replica: String },
    /// The transport reported a status.
    Status { replica: String, status: Status },
}

#[derive(Default)]
struct ClientState {
    stopped: bool,
    conn: Option<TcpStream>,
    thread: Option<JoinHandle<()>>,
    /// Dropped to wake the reconnect back-off at stop.
    wake: Option<Sender<()>>,
    token: Option<Token>,
}

struct ClientInner {
    id: String,
    replica: String,
    addr: SocketAddr,
    exclusive: bool,
    retry: Duration,
    events: Option<Sender<ClientEvent>>,
    state: Mutex<ClientState>,
}

/// A [`Provider`] for the test [`Server`]: keeps one session open while started,
/// reconnects after a close (every `retry`), delivers `MSG`s to the intake, sends
/// replies with its session's token.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl Client {
    /// A client of `addr` for replica `replica`, with provider id `id`; `exclusive`
    /// is what it declares in its capabilities.
    pub fn new(id: &str, replica: &str, addr: SocketAddr, exclusive: bool) -> Self {
        Client {
            inner: Arc::new(ClientInner {
                id: id.to_owned(),
                replica: replica.to_owned(),
                addr,
                exclusive,
                retry: Duration::from_millis(20),
                events: None,
                state: Mutex::new(ClientState::default()),
            }),
        }
    }

    /// Reports what the runtime does with the client to `events`.
    pub fn with_events(self, events: Sender<ClientEvent>) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|_| panic!("configure first"));
        Client {
            inner: Arc::new(ClientInner {
                events: Some(events),
                ..inner
            }),
        }
    }

    /// The token of the last session started.
    pub fn last_token(&self) -> Option<Token> {
        lock(&self.inner.state).token
    }

    /// A send straight to the server with any token, bypassing the runtime: what a
    /// deposed leader's stale send would look like.
    pub fn send_with(
        addr: SocketAddr,
        replica: &str,
        token: Option<Token>,
        chat: &str,
        text: &str,
    ) -> Result<(), ProviderError> {
        let err = |e: std::io::Error| ProviderError(format!("test platform: {e}"));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(err)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(err)?;
        let line = format!("SEND\t{replica}\t{}\t{chat}\t{text}\n", token_field(token));
        stream.write_all(line.as_bytes()).map_err(err)?;
        let mut reply = String::new();
        BufReader::new(stream).read_line(&mut reply).map_err(err)?;
        match reply.trim_end() {
            "OK" => Ok(()),
            other => Err(ProviderError(format!("test platform refused: {other}"))),
        }
    }

    fn tell(&self, event: ClientEvent) {
        if let Some(events) = &self.inner.events {
            let _ = events.send(event);
        }
    }

    fn report(&self, session: &Session, status: Status) {
        // The runtime hears it first: a test that saw the event sees its metrics.
        session.status().report(status.clone());
        self.tell(ClientEvent::Status {
            replica: self.inner.replica.clone(),
            status,
        });
    }

    /// Connects and says hello; the open stream and its reader, or why not.
    fn hello(&self, token: Option<Token>) -> Result<(TcpStream, BufReader<TcpStream>), Status> {
        let other = |e: std::io::Error| Status::Closed(CloseReason::Other(e.to_string()));
        let mut stream =
            TcpStream::connect_timeout(&self.inner.addr, Duration::from_secs(2)).map_err(other)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(other)?;
        let line = format!("HELLO\t{}\t{}\n", self.inner.replica, token_field(token));
        stream.write_all(line.as_bytes()).map_err(other)?;
        let mut reader = BufReader::new(stream.try_clone().map_err(other)?);
        let mut reply = String::new();
        reader.read_line(&mut reply).map_err(other)?;
        match reply.trim_end() {
            "OK" => {
                stream.set_read_timeout(None).map_err(other)?;
                Ok((stream, reader))
            }
            "DENIED" => Err(Status::Closed(CloseReason::LoggedOut)),
            r if r.starts_with("FENCED") => Err(Status::Closed(CloseReason::Fenced)),
            r => Err(Status::Closed(CloseReason::Other(format!(
                "unexpected answer {r:?}"
            )))),
        }
    }

    fn run(&self, session: Session, wake: Receiver<()>) {
        loop {
            if lock(&self.inner.state).stopped {
                return;
            }
            self.report(&session, Status::Connecting);
            match self.hello(session.fencing_token()) {
                Ok((stream, reader)) => {
                    let stopped = {
                        let mut st = lock(&self.inner.state);
                        if !st.stopped {
                            st.conn = stream.try_clone().ok();
                        }
                        st.stopped
                    };
                    if stopped {
                        // Stopped while connecting: close the session the clean way.
                        let _ = (&stream).write_all(b"BYE\n");
                    } else {
                        self.report(&session, Status::Open);
                    }
                    if self.read_session(&session, reader) {
                        return;
                    }
                    lock(&self.inner.state).conn = None;
                }
                Err(status) => self.report(&session, status),
            }
            match wake.recv_timeout(self.inner.retry) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
        }
    }

    /// Reads an open session until it ends; `true` when it ended by our `BYE`.
    fn read_session(&self, session: &Session, mut reader: BufReader<TcpStream>) -> bool {
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line).unwrap_or(0);
            let fields: Vec<&str> = line.trim_end_matches('\n').split('\t').collect();
            match fields.as_slice() {
                _ if n == 0 => {
                    if lock(&self.inner.state).stopped {
                        return true;
                    }
                    let lost = CloseReason::Other("connection lost".into());
                    self.report(session, Status::Closed(lost));
                    return false;
                }
                ["BYE"] => return true,
                ["REPLACED"] => {
                    self.report(session, Status::Closed(CloseReason::Replaced));
                    return false;
                }
                ["LOGGEDOUT"] => {
                    self.report(session, Status::Closed(CloseReason::LoggedOut));
                    return false;
                }
                ["MSG", id, chat, text] => {
                    let m = Message::new(*chat, *text).with_id(*id);
                    let _ = session.intake().deliver(m);
                }
                _ => {}
            }
        }
    }
}

impl Provider for Client {
    fn id(&self) -> &str {
        &self.inner.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exclusive_session: self.inner.exclusive,
        }
    }

    fn start(&self, session: Session) -> Result<(), ProviderError> {
        let (wake_tx, wake_rx) = bounded(0);
        let mut st = lock(&self.inner.state);
        if st.thread.is_some() {
            return Err(ProviderError("started twice without a stop".into()));
        }
        st.stopped = false;
        st.token = session.fencing_token();
        st.wake = Some(wake_tx);
        self.tell(ClientEvent::Started {
            replica: self.inner.replica.clone(),
            token: session.fencing_token(),
        });
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name(format!("test-transport-{}", self.inner.replica))
            .spawn(move || me.run(session, wake_rx))
            .map_err(|e| ProviderError(format!("cannot spawn: {e}")))?;
        st.thread = Some(thread);
        Ok(())
    }

    fn stop(&self) {
        let (conn, thread, wake) = {
            let mut st = lock(&self.inner.state);
            st.stopped = true;
            (st.conn.take(), st.thread.take(), st.wake.take())
        };
        drop(wake);
        if let Some(mut conn) = conn {
            // The server answers `BYE` once it recorded the end; the reader then returns.
            let _ = conn.write_all(b"BYE\n");
        }
        if let Some(t) = thread {
            let _ = t.join();
            self.tell(ClientEvent::Stopped {
                replica: self.inner.replica.clone(),
            });
        }
    }

    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        let token = lock(&self.inner.state).token;
        Client::send_with(self.inner.addr, &self.inner.replica, token, chat, text)
    }
}
