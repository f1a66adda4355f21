//! The renewal thread: one per replica, one coordinator call per tick.
//!
//! Every tick (TTL/3) the thread renews all leases the replica holds in a single
//! [`Coordinator::renew`](crate::Coordinator::renew) call, which also keeps the
//! replica's queued tickets alive (so they are not skipped) and is the slow safety
//! re-check: a waiter that missed its wake-up gets its grant from it, and a ticket the
//! backend lost is queued again. A lease the
//! coordinator refuses, or every lease when the coordinator has been unreachable for
//! longer than the TTL, is marked lost: the holder sees it in
//! [`Turn::is_lost`](crate::Turn::is_lost) and its release reports `lost`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::coordinator::{HeldLease, Ticket, Waiting};
use crate::metrics::{dec, inc};
use crate::replica::Inner;
use crate::turn::TurnState;

/// The renewal period for a TTL: a third of it, so two renewals may fail before the
/// lease lapses.
pub(crate) fn period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

pub(crate) fn renewal_loop(inner: &Arc<Inner>) {
    let period = period(inner.ttl);
    let mut last_ok = Instant::now();
    let mut next = Instant::now() + period;
    loop {
        {
            let mut stop = inner.stop.lock();
            while !*stop && Instant::now() < next {
                inner.stop_cv.wait_until(&mut stop, next);
            }
            if *stop {
                return;
            }
        }
        next = Instant::now() + period;
        renew_once(inner, &mut last_ok);
    }
}

fn renew_once(inner: &Arc<Inner>, last_ok: &mut Instant) {
    let held: Vec<Arc<TurnState>> = inner.held.lock().values().cloned().collect();
    let leases: Vec<HeldLease<'_>> = held.iter().map(|s| s.lease()).collect();
    let waiters = inner.placed_waiters();
    let tickets: Vec<Ticket> = waiters.iter().map(|w| inner.ticket(w.1)).collect();
    let waiting: Vec<Waiting<'_>> = waiters
        .iter()
        .zip(&tickets)
        .map(|((chat, _, id), ticket)| Waiting {
            chat,
            ticket,
            message_id: id.as_deref(),
        })
        .collect();
    let sent = Instant::now();
    match inner.coordinator.renew(&inner.id, &leases, &waiting) {
        Ok(renewal) => {
            *last_ok = Instant::now();
            for (state, kept) in held.iter().zip(renewal.held) {
                if kept {
                    state.renewed(sent, inner.ttl);
                } else {
                    mark_lost(inner, state, "renewal refused");
                }
            }
            inner.apply_recheck(&waiters, renewal.waiting);
            inner.bury_ghosts();
            inner.release_suspects();
        }
        Err(e) => {
            inc(&inner.metrics.backend_errors);
            log::warn!(target: "botmesh::lease", "renewal failed: {e}");
            if last_ok.elapsed() > inner.ttl {
                for state in &held {
                    mark_lost(
                        inner,
                        state,
                        "coordinator unreachable for longer than the TTL",
                    );
                }
            }
        }
    }
}

fn mark_lost(inner: &Inner, state: &TurnState, why: &str) {
    // A turn released while the renewal was in flight is not lost, just gone.
    if inner.held.lock().remove(&state.ticket.seq).is_none() {
        return;
    }
    let metered = !crate::replica::is_reserved(&state.chat);
    if metered {
        dec(&inner.metrics.held);
    }
    if !state.lost.swap(true, Ordering::AcqRel) {
        if metered {
            inc(&inner.metrics.lost);
        }
        log::warn!(
            target: "botmesh::lease",
            "turn on chat {:?} (token {}) lost: {why}",
            crate::replica::shown_chat(&state.chat),
            state.token
        );
    }
}
