//! A TCP proxy on loopback between the replicas and Redis that can misbehave on
//! command: delay every chunk by 0–5 ms (jitter), hold every byte for a while
//! (a blackhole: like a network partition TCP rides out, the bytes arrive once it
//! ends), or cut every open connection at once.
//!
//! Two threads per connection, one per direction, so a held or delayed direction
//! never holds the other; each keeps the order of its bytes.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The longest a chunk is delayed under jitter.
const MAX_JITTER_US: u64 = 5_000;
/// How often a held direction looks whether the blackhole ended: short against the
/// lease TTLs these runs use, so the end of a blackhole is felt at once.
const HOLD_POLL: Duration = Duration::from_millis(2);

struct Shared {
    upstream: u16,
    seed: u64,
    jitter: AtomicBool,
    blackhole: AtomicBool,
    stop: AtomicBool,
    next_id: AtomicU64,
    /// Every open connection: (client side, server side), so a cut can shut them.
    open: Mutex<HashMap<u64, (TcpStream, TcpStream)>>,
}

/// The proxy; stops (cutting what is open) when dropped.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    ///
    /// # Errors
    /// When no port can be bound or the accept thread not started.
    pub fn start(upstream: u16, seed: u64) -> Result<Proxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("cannot bind the proxy on loopback: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("cannot read the proxy's port: {e}"))?
            .port();
        let shared = Arc::new(Shared {
            upstream,
            seed,
            jitter: AtomicBool::new(false),
            blackhole: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        });
        let for_thread = shared.clone();
        std::thread::Builder::new()
            .name("chaos-proxy".into())
            .spawn(move || accept(&listener, &for_thread))
            .map_err(|e| format!("cannot start the proxy thread: {e}"))?;
        Ok(Proxy { port, shared })
    }

    /// The port it listens on (loopback).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Delays every chunk by 0–5 ms while on.
    pub fn set_jitter(&self, on: bool) {
        self.shared.jitter.store(on, Ordering::Release);
    }

    /// Holds every byte (and every new connection's upstream connect) while on.
    pub fn set_blackhole(&self, on: bool) {
        self.shared.blackhole.store(on, Ordering::Release);
    }

    /// Shuts every open connection, both ways; returns how many there were.
    pub fn cut_all(&self) -> usize {
        let open: Vec<(TcpStream, TcpStream)> =
            self.shared.open.lock().drain().map(|(_, v)| v).collect();
        for (client, server) in &open {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
        open.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.blackhole.store(false, Ordering::Release);
        // Wakes the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        self.cut_all();
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = client else { continue };
        let shared = shared.clone();
        // The upstream connect waits out a blackhole, so it runs off the accept loop.
        let _ = std::thread::Builder::new()
            .name("chaos-proxy-conn".into())
            .spawn(move || connect(client, &shared));
    }
}

fn hold(shared: &Shared) {
    while shared.blackhole.load(Ordering::Acquire) && !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(HOLD_POLL);
    }
}

fn connect(client: TcpStream, shared: &Arc<Shared>) {
    hold(shared);
    let Ok(server) = TcpStream::connect(("127.0.0.1", shared.upstream)) else {
        // Redis is down: the client sees its connection closed, as it would a refusal.
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = server.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let streams = (
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    );
    let (Ok(c_read), Ok(s_write), Ok(c_keep), Ok(s_keep)) = streams else {
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
        return;
    };
    shared.open.lock().insert(id, (c_keep, s_keep));
    let (s_read, c_write) = (server, client);
    let up = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("chaos-proxy-up".into())
            .spawn(move || pump(c_read, s_write, &shared, id.wrapping_mul(2)))
    };
    let shared_down = shared.clone();
    let down = std::thread::Builder::new()
        .name("chaos-proxy-down".into())
        .spawn(move || pump(s_read, c_write, &shared_down, id.wrapping_mul(2) + 1));
    if up.is_err() || down.is_err() {
        if let Some((c, s)) = shared.open.lock().remove(&id) {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
        return;
    }
    if let Ok(handle) = up {
        let _ = handle.join();
    }
    if let Ok(handle) = down {
        let _ = handle.join();
    }
    shared.open.lock().remove(&id);
}

/// Copies one direction until either side closes, then closes both.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared, stream: u64) {
    let mut rng = StdRng::seed_from_u64(shared.seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        hold(shared);
        if shared.jitter.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(rng.gen_range(0..=MAX_JITTER_US)));
        }
        let Some(chunk) = buf.get(..n) else { break };
        if to.write_all(chunk).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
