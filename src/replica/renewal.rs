//! The renewal thread: one per replica, one coordinator call per tick.
//!
//! Every tick (TTL/3) the thread renews all leases the replica holds in a single
//! [`Coordinator::renew`](crate::Coordinator::renew) call, which also keeps the
//! replica's queued tickets alive (so they are not skipped) and is the slow safety
//! re-check: a waiter that missed its wake-up gets its grant from it, and a ticket the
//! backend lost is queued again. A lease the coordinator refuses, or every lease when
//! the coordinator has been unreachable for longer than the TTL, is marked lost: the
//! holder sees it in [`Turn::is_lost`](crate::Turn::is_lost) and its release reports
//! `lost`.

use std::sync::Arc;
use std::time::Instant;

use super::client::Inner;
use super::lease::period;

/// Runs ticks until the replica stops. The wait between ticks is on the real clock
/// (it is a thread's sleep); the tick's judgements use the replica's clock.
pub(crate) fn renewal_loop(inner: &Arc<Inner>) {
    let period = period(inner.ttl);
    let mut last_ok = inner.now();
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
        inner.renew_once(&mut last_ok);
    }
}
