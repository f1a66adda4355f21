//! The turn as a plain distributed per-chat lock, without the bot runtime.
//!
//! Two replicas (threads here; processes with a shared backend) take turns on one chat.
//! Each grant's fencing token is greater than the last, and a crashed replica's chat
//! comes free once its lease lapses. SIGTERM or SIGINT stops it cleanly between two
//! turns: the turn just taken is released, both replicas shut down.
//!
//! ```sh
//! cargo run --example lock
//! ```

#[path = "common/signals.rs"]
mod signals;

use std::sync::Arc;
use std::time::{Duration, Instant};

use botmesh::DEFAULT_DEDUP_WINDOW;
use botmesh::{MemoryCoordinator, Replica};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ttl = Duration::from_millis(500);
    let coordinator = Arc::new(MemoryCoordinator::with_settings(ttl, DEFAULT_DEDUP_WINDOW));
    let a = Replica::start("a", coordinator.clone())?;
    let b = Replica::start("b", coordinator.clone())?;
    let stop = signals::flag_on_signal()?;
    let stopped = |a: Replica, b: Replica| {
        eprintln!("lock: signal: stopping cleanly");
        a.shutdown();
        b.shutdown();
        Ok(())
    };

    'rounds: for round in 0..3 {
        for r in [&a, &b] {
            if signals::raised(&stop) {
                break 'rounds;
            }
            let turn = r.acquire_timeout("chat-1", Duration::from_secs(5))?;
            println!(
                "round {round}: {} holds chat-1 with fencing token {} (previous holder: {:?})",
                turn.replica(),
                turn.fencing_token(),
                turn.previous().map(|p| p.replica.to_string())
            );
            turn.release()?;
        }
    }

    if signals::raised(&stop) {
        return stopped(a, b);
    }
    // Replica `a` takes the chat and crashes without releasing it.
    let held = a.acquire_timeout("chat-1", Duration::from_secs(5))?;
    let token = held.fencing_token();
    std::mem::forget(held);
    a.abort();
    let t0 = Instant::now();
    let turn = b.acquire_timeout("chat-1", Duration::from_secs(5))?;
    println!(
        "a crashed holding token {token}; b got chat-1 after {:?} (TTL {ttl:?}) with token {}",
        t0.elapsed(),
        turn.fencing_token()
    );
    turn.release()?;
    b.shutdown();
    Ok(())
}
