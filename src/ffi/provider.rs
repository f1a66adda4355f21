//! C transports: a `botmesh_provider` (a struct of function pointers plus the host's
//! `user_data`) adapted to [`Provider`], so that the Rust runtime starts, stops and
//! gates it exactly as it does a Rust transport (leader election included); and the
//! `botmesh_session` a started transport delivers through and reports to.

use std::ffi::{CString, c_char, c_int, c_void};

use parking_lot::Mutex;

use super::base::{BotmeshError, BotmeshSend, UserData, deliver_to, guard, str_arg};
use super::status::{
    BOTMESH_INVALID, BOTMESH_OK, BOTMESH_SESSION_CLOSED, BOTMESH_SESSION_CONNECTING,
    BOTMESH_SESSION_FENCED, BOTMESH_SESSION_LOGGED_OUT, BOTMESH_SESSION_OPEN,
    BOTMESH_SESSION_REPLACED,
};
use crate::{Capabilities, CloseReason, Provider, ProviderError, Session, Status};

/// A C transport (`botmesh_provider`): the host fills it and hands it to
/// `botmesh_builder_add_provider`, which copies it. `start` and `stop` are required;
/// `send` may be NULL (the bot's own `send` callback is used then).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BotmeshProvider {
    /// Connects: returns 0 once the transport is starting (it runs on a thread of the
    /// host's own), anything else for a failed start.
    pub start:
        Option<unsafe extern "C" fn(session: *mut BotmeshSession, user_data: *mut c_void) -> c_int>,
    /// Disconnects; returns once nothing more is delivered through the session.
    pub stop: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    /// Sends a reply: returns 0 when sent.
    pub send: BotmeshSend,
}

/// A started transport's session (`botmesh_session`): where it delivers and reports,
/// valid from its `start` call until the matching `stop` returns.
#[derive(Debug)]
pub struct BotmeshSession {
    session: Session,
}

/// The session of a started C transport, freed after its `stop` returns.
struct SessionPtr(*mut BotmeshSession);
// SAFETY: the pointer is only passed to the host and freed by the adapter; the
// session itself (`Session`) is Send + Sync.
unsafe impl Send for SessionPtr {}

/// A [`Provider`] whose start, stop and send are the host's C callbacks.
pub(super) struct CProvider {
    id: String,
    exclusive: bool,
    callbacks: BotmeshProvider,
    user_data: UserData,
    /// The bot's `send`, for a transport that gives none of its own.
    bot_send: BotmeshSend,
    bot_data: UserData,
    /// The session between a successful `start` and its `stop`; `None` otherwise, so
    /// that `stop` is called exactly once after each successful `start` only.
    session: Mutex<Option<SessionPtr>>,
}

impl std::fmt::Debug for CProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CProvider")
            .field("id", &self.id)
            .field("exclusive", &self.exclusive)
            .finish_non_exhaustive()
    }
}

impl CProvider {
    /// Checks the host's callbacks; the error names what is missing.
    pub(super) fn new(
        id: String,
        exclusive: bool,
        callbacks: BotmeshProvider,
        user_data: *mut c_void,
        bot_send: BotmeshSend,
        bot_data: UserData,
    ) -> Result<CProvider, String> {
        if id.is_empty() {
            return Err("provider_id: empty; give the transport a stable id".into());
        }
        if callbacks.start.is_none() {
            return Err(format!("provider {id:?}: start is NULL"));
        }
        if callbacks.stop.is_none() {
            return Err(format!("provider {id:?}: stop is NULL"));
        }
        Ok(CProvider {
            id,
            exclusive,
            callbacks,
            user_data: UserData(user_data),
            bot_send,
            bot_data,
            session: Mutex::new(None),
        })
    }
}

/// Calls a C `send` with `chat` and `text`.
pub(super) fn call_send(
    send: BotmeshSend,
    data: UserData,
    chat: &str,
    text: &str,
) -> Result<(), ProviderError> {
    let Some(send) = send else {
        return Err(ProviderError("the host gave no send callback".into()));
    };
    let chat = CString::new(chat).map_err(|_| ProviderError("chat holds a NUL".into()))?;
    let text = CString::new(text).map_err(|_| ProviderError("text holds a NUL".into()))?;
    // SAFETY: the host's callback, called as the header documents.
    let rc = unsafe { send(chat.as_ptr(), text.as_ptr(), data.0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(ProviderError(format!("the host's send returned {rc}")))
    }
}

impl Provider for CProvider {
    fn id(&self) -> &str {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            exclusive_session: self.exclusive,
        }
    }

    fn start(&self, session: Session) -> Result<(), ProviderError> {
        let Some(start) = self.callbacks.start else {
            return Err(ProviderError(format!(
                "provider {:?}: start is NULL",
                self.id
            )));
        };
        // A stop that never came (cannot happen: the runtime pairs them) would leak
        // the old session; free it rather than keep two.
        self.free_session();
        let ptr = Box::into_raw(Box::new(BotmeshSession { session }));
        *self.session.lock() = Some(SessionPtr(ptr));
        // SAFETY: the host's callback, called as the header documents; `ptr` stays
        // valid until `stop` returns.
        let rc = unsafe { start(ptr, self.user_data.0) };
        if rc == 0 {
            return Ok(());
        }
        // A failed start gets no stop: its session ends here.
        self.free_session();
        Err(ProviderError(format!(
            "the C transport {:?}'s start returned {rc}",
            self.id
        )))
    }

    fn stop(&self) {
        if self.session.lock().is_none() {
            return; // never started, or its start failed
        }
        if let Some(stop) = self.callbacks.stop {
            // SAFETY: the host's callback, called as the header documents.
            unsafe { stop(self.user_data.0) };
        }
        self.free_session();
    }

    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        if self.callbacks.send.is_some() {
            call_send(self.callbacks.send, self.user_data, chat, text)
        } else {
            call_send(self.bot_send, self.bot_data, chat, text)
        }
    }
}

impl CProvider {
    fn free_session(&self) {
        if let Some(SessionPtr(ptr)) = self.session.lock().take() {
            // SAFETY: from `Box::into_raw` in `start`; the host no longer uses it (its
            // stop returned, or its start failed).
            drop(unsafe { Box::from_raw(ptr) });
        }
    }
}

impl Drop for CProvider {
    fn drop(&mut self) {
        self.free_session();
    }
}

/// Replies go to the host's `send` callback: the transport of a bot that registered
/// no C transport of its own.
pub(super) struct CSend {
    pub(super) send: BotmeshSend,
    pub(super) user_data: UserData,
}

impl Provider for CSend {
    fn id(&self) -> &str {
        "c-host"
    }
    fn start(&self, _: Session) -> Result<(), ProviderError> {
        Ok(())
    }
    fn stop(&self) {}
    fn send(&self, chat: &str, text: &str) -> Result<(), ProviderError> {
        call_send(self.send, self.user_data, chat, text)
    }
}

/// Takes a message in through a started transport's session; the same arguments and
/// return codes as `botmesh_bot_deliver`.
///
/// # Safety
/// `session` is the pointer given to the transport's `start`, whose `stop` has not
/// returned; `chat` and `text` are NUL-terminated strings; `message_id` is NULL or
/// one; `err` is NULL or from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_session_deliver(
    session: *const BotmeshSession,
    chat: *const c_char,
    message_id: *const c_char,
    text: *const c_char,
    err: *mut BotmeshError,
) -> c_int {
    guard(err, || {
        if session.is_null() {
            return Err((BOTMESH_INVALID, "session: NULL".into()));
        }
        // SAFETY: per this function's contract.
        let intake = unsafe { (*session).session.intake() };
        // SAFETY: per this function's contract.
        unsafe { deliver_to(intake, chat, message_id, text) }
    })
}

/// Reports the transport's state: one of the `BOTMESH_SESSION_*` codes, with `detail`
/// (NULL or a short text, no secrets) saying why for `BOTMESH_SESSION_CLOSED`. Never
/// blocks. Returns `BOTMESH_INVALID` for an unknown code or a detail that is not UTF-8.
///
/// # Safety
/// As `botmesh_session_deliver`; `detail` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_session_report(
    session: *const BotmeshSession,
    status: c_int,
    detail: *const c_char,
    err: *mut BotmeshError,
) -> c_int {
    guard(err, || {
        if session.is_null() {
            return Err((BOTMESH_INVALID, "session: NULL".into()));
        }
        let status = match status {
            BOTMESH_SESSION_CONNECTING => Status::Connecting,
            BOTMESH_SESSION_OPEN => Status::Open,
            BOTMESH_SESSION_REPLACED => Status::Closed(CloseReason::Replaced),
            BOTMESH_SESSION_FENCED => Status::Closed(CloseReason::Fenced),
            BOTMESH_SESSION_LOGGED_OUT => Status::Closed(CloseReason::LoggedOut),
            BOTMESH_SESSION_CLOSED => {
                let why = if detail.is_null() {
                    "closed".to_owned()
                } else {
                    // SAFETY: per this function's contract.
                    unsafe { str_arg(detail, "detail") }?.to_owned()
                };
                Status::Closed(CloseReason::Other(why))
            }
            other => {
                return Err((
                    BOTMESH_INVALID,
                    format!(
                        "status: {other}; use BOTMESH_SESSION_CONNECTING ({BOTMESH_SESSION_CONNECTING}) \
                         to BOTMESH_SESSION_CLOSED ({BOTMESH_SESSION_CLOSED})"
                    ),
                ));
            }
        };
        // SAFETY: per this function's contract.
        unsafe { (*session).session.status() }.report(status);
        Ok(BOTMESH_OK)
    })
}

/// The fencing token of this leadership (Kleppmann 2016): at least 1 and greater
/// than every earlier leader's of this provider; 0 when the transport is not run
/// under a leadership (shared mode, or no coordination) or `session` is NULL.
///
/// # Safety
/// As `botmesh_session_deliver`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_session_fencing_token(session: *const BotmeshSession) -> u64 {
    if session.is_null() {
        return 0;
    }
    // SAFETY: per this function's contract.
    unsafe { (*session).session.fencing_token() }.unwrap_or(0)
}
