//! The long-polling session: one thread calling `getUpdates`, delivering each update
//! to the intake in order and confirming an update's offset only once the intake took
//! it, and the closing call that ends the session when the runtime stops it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use parking_lot::Mutex;
use serde_json::{Value, json};

use serde::Deserialize;

use super::api::{Update, to_message};
use super::http::{CallError, Client};
use super::retry::{Backoff, random};
use super::settings::TelegramConfig;
use crate::provider::{CloseReason, Session, Status};

/// What the poll thread and [`Running::stop`] share.
pub(crate) struct PollState {
    /// Set by `stop`: no update is delivered after it, no new poll is sent.
    stopped: AtomicBool,
    /// The offset to confirm next (`last accepted update_id + 1`); `None` until an
    /// update was accepted, so the first poll starts where Telegram's confirmed
    /// offset is (what an earlier leader confirmed).
    offset: Mutex<Option<i64>>,
    /// Held while the thread decides to send a poll, so that `stop` sees either a
    /// poll that was sent or none that will be.
    gate: Mutex<()>,
}

/// A running long-polling session.
pub(crate) struct Running {
    state: Arc<PollState>,
    /// Dropped by `stop`: wakes the thread from a back-off wait at once.
    wake: Option<Sender<()>>,
    /// Closed when the thread ends.
    done: Receiver<()>,
}

/// Starts the poll thread for `session`.
pub(crate) fn start(
    client: Arc<Client>,
    config: Arc<TelegramConfig>,
    session: Session,
) -> std::io::Result<Running> {
    let state = Arc::new(PollState {
        stopped: AtomicBool::new(false),
        offset: Mutex::new(None),
        gate: Mutex::new(()),
    });
    let (wake_tx, wake_rx) = bounded::<()>(0);
    let (done_tx, done_rx) = bounded::<()>(0);
    let poller = Poller {
        client,
        config,
        session,
        state: state.clone(),
        wake: wake_rx,
        _done: done_tx,
    };
    std::thread::Builder::new()
        .name("botmesh-telegram-poll".into())
        .spawn(move || poller.run())?;
    Ok(Running {
        state,
        wake: Some(wake_tx),
        done: done_rx,
    })
}

impl Running {
    /// Ends the session: no update is delivered after this returns (one whose
    /// `deliver` is under way may still be taken in; its offset is then not
    /// confirmed, and the next leader's copy is absorbed by the dedup window). Then a
    /// closing `getUpdates` with `timeout=0` confirms what was accepted and makes
    /// Telegram end this session's own long poll (it answers the older of two polls
    /// with `409`), so the next leader's first poll overlaps nothing. Bounded by the
    /// config's `stop_timeout` per closing call, at most 3 calls.
    pub(crate) fn stop(mut self, client: &Client, config: &TelegramConfig) {
        {
            let _gate = self.state.gate.lock();
            self.state.stopped.store(true, Ordering::SeqCst);
        }
        self.wake = None;
        for _ in 0..3 {
            let offset = *self.state.offset.lock();
            let body = poll_body(offset, 0, 1, config);
            match client.call::<Vec<Value>>("getUpdates", &body, config.stop_timeout) {
                Ok(_) => {}
                Err(e) => {
                    log::debug!(target: "botmesh::telegram", "closing poll: {e}");
                }
            }
            // The thread ends once its own poll returned (with the 409); one that
            // is inside `deliver` is not waited for past this.
            match self.done.recv_timeout(config.stop_timeout) {
                Err(RecvTimeoutError::Timeout) => continue,
                _ => return,
            }
        }
        log::warn!(target: "botmesh::telegram", "the poll thread did not end within 3 closing calls; left to end by itself");
    }
}

fn poll_body(offset: Option<i64>, timeout_s: u64, limit: u32, config: &TelegramConfig) -> Value {
    let mut body = json!({ "timeout": timeout_s, "limit": limit });
    if let Some(map) = body.as_object_mut() {
        if let Some(o) = offset {
            map.insert("offset".into(), json!(o));
        }
        if let Some(kinds) = &config.allowed_updates {
            map.insert("allowed_updates".into(), json!(kinds));
        }
    }
    body
}

struct Poller {
    client: Arc<Client>,
    config: Arc<TelegramConfig>,
    session: Session,
    state: Arc<PollState>,
    wake: Receiver<()>,
    /// Dropped when the thread ends: tells `stop`.
    _done: Sender<()>,
}

/// What the loop does after a failed poll.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AfterError {
    /// Report this status, wait this long, poll again.
    Retry(Option<CloseReason>, Duration),
}

/// What a failed `getUpdates` asks for (pure). `409`: another poller or a webhook is
/// active, reported `Replaced` (the runtime then checks the leadership and stops a
/// deposed leader) or, for a webhook, as what it is; `429` waits its `retry_after`;
/// `401`/`404` (a revoked or wrong token) report `LoggedOut`; the rest back off with
/// jitter.
pub(crate) fn after_poll_error(e: &CallError, backoff: &mut Backoff, random: u64) -> AfterError {
    match e {
        CallError::Api {
            code: 409,
            description,
            ..
        } => {
            let reason = if description.contains("webhook") {
                CloseReason::Other(format!("409: {description}"))
            } else {
                CloseReason::Replaced
            };
            AfterError::Retry(Some(reason), backoff.next(random))
        }
        CallError::Api {
            code: 429,
            retry_after,
            ..
        } => AfterError::Retry(None, retry_after.unwrap_or_else(|| backoff.next(random))),
        CallError::Api {
            code: 401 | 404, ..
        } => AfterError::Retry(Some(CloseReason::LoggedOut), backoff.next(random)),
        other => AfterError::Retry(
            Some(CloseReason::Other(other.to_string())),
            backoff.next(random),
        ),
    }
}

impl Poller {
    fn stopped(&self) -> bool {
        self.state.stopped.load(Ordering::SeqCst)
    }

    /// Waits `d` unless stopped meanwhile; `false` when stopped.
    fn wait(&self, d: Duration) -> bool {
        match self.wake.recv_timeout(d) {
            Err(RecvTimeoutError::Timeout) => !self.stopped(),
            _ => false,
        }
    }

    fn run(self) {
        let status = self.session.status();
        status.report(Status::Connecting);
        let mut open = false;
        let mut backoff = Backoff::new(self.config.backoff_min, self.config.backoff_max);
        let timeout_s = self.config.poll_timeout.as_secs();
        loop {
            let body = {
                let _gate = self.state.gate.lock();
                if self.stopped() {
                    return;
                }
                poll_body(*self.state.offset.lock(), timeout_s, 100, &self.config)
            };
            let started = Instant::now();
            // Each update is read on its own: one this crate cannot read must not
            // make the whole batch fail, and with it every later poll.
            let got = self.client.call::<Vec<serde_json::Value>>(
                "getUpdates",
                &body,
                self.config.poll_timeout + self.config.request_timeout,
            );
            if self.stopped() {
                return; // what it brought is not delivered: the next leader gets it
            }
            match got {
                Ok(updates) => {
                    backoff.reset();
                    if !open {
                        open = true;
                        status.report(Status::Open);
                    }
                    if !self.deliver_all(updates, &mut backoff) {
                        return;
                    }
                }
                Err(e) => {
                    let AfterError::Retry(reason, wait) =
                        after_poll_error(&e, &mut backoff, random());
                    log::warn!(target: "botmesh::telegram", "getUpdates failed after {:?}: {e}; next poll in {wait:?}", started.elapsed());
                    if let Some(reason) = reason {
                        open = false;
                        status.report(Status::Closed(reason));
                    }
                    if !self.wait(wait) {
                        return;
                    }
                    if !open {
                        status.report(Status::Connecting);
                    }
                }
            }
        }
    }

    /// Delivers `updates` in order; stops at the first one the intake refuses (it and
    /// those after it are fetched again, after a back-off). `false` when stopped.
    fn deliver_all(&self, updates: Vec<serde_json::Value>, backoff: &mut Backoff) -> bool {
        for raw in updates {
            if self.stopped() {
                return false;
            }
            let update = match Update::deserialize(&raw) {
                Ok(update) => update,
                Err(e) => {
                    // Skipped and confirmed (it would come back forever otherwise),
                    // logged with its id so an operator can look it up.
                    let id = raw.get("update_id").and_then(serde_json::Value::as_i64);
                    log::warn!(target: "botmesh::telegram", "update {id:?} cannot be read ({e}); skipped");
                    if let Some(id) = id {
                        *self.state.offset.lock() = Some(id.saturating_add(1));
                    }
                    continue;
                }
            };
            let next = update.update_id.saturating_add(1);
            let Some(message) = to_message(&update) else {
                log::debug!(target: "botmesh::telegram", "update {} has no chat to answer; skipped", update.update_id);
                *self.state.offset.lock() = Some(next);
                continue;
            };
            match self.session.intake().deliver(message) {
                Ok(_) => *self.state.offset.lock() = Some(next),
                Err(e) => {
                    let wait = backoff.next(random());
                    log::warn!(target: "botmesh::telegram", "update {} not taken in ({e}); fetched again in {wait:?}", update.update_id);
                    return self.wait(wait);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_errors_map_to_reports_and_waits() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let api = |code, description: &str, retry_after| CallError::Api {
            code,
            description: description.into(),
            retry_after,
        };
        let conflict = api(
            409,
            "Conflict: terminated by other getUpdates request",
            None,
        );
        assert_eq!(
            after_poll_error(&conflict, &mut b, 0),
            AfterError::Retry(Some(CloseReason::Replaced), Duration::from_millis(50))
        );
        let hook = api(
            409,
            "Conflict: can't use getUpdates method while webhook is active",
            None,
        );
        assert!(matches!(
            after_poll_error(&hook, &mut b, 0),
            AfterError::Retry(Some(CloseReason::Other(_)), _)
        ));
        let limited = api(429, "Too Many Requests", Some(Duration::from_secs(7)));
        assert_eq!(
            after_poll_error(&limited, &mut b, 0),
            AfterError::Retry(None, Duration::from_secs(7))
        );
        assert!(matches!(
            after_poll_error(&api(401, "Unauthorized", None), &mut b, 0),
            AfterError::Retry(Some(CloseReason::LoggedOut), _)
        ));
    }
}
