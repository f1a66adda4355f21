//! What every part of the C ABI shares: the error holder and the boundary guard,
//! string arguments, the host's `user_data`, configurations, the handler's context
//! and the delivery of one message.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::status::{
    BOTMESH_BACKEND, BOTMESH_CONFIG, BOTMESH_DUPLICATE, BOTMESH_INVALID, BOTMESH_OK, BOTMESH_PANIC,
    BOTMESH_SEND_FAILED, BOTMESH_SHUTTING_DOWN,
};
use crate::{Accepted, Context, CoordinationConfig, Intake, Message, Reason};

/// An error message holder owned by the caller (`botmesh_error`): the status and
/// message of the last call that was given it.
#[derive(Debug)]
pub struct BotmeshError {
    message: CString,
    status: c_int,
}

/// A configuration with its coordinator built once (`botmesh_config`): bots built from
/// one config share the coordinator (and so exclude each other).
#[derive(Debug)]
pub struct BotmeshConfig {
    pub(super) config: CoordinationConfig,
}

/// What a handler sees (`botmesh_context`), valid while the handler runs.
#[derive(Debug)]
pub struct BotmeshContext<'a> {
    pub(super) ctx: &'a Context<'a>,
    pub(super) chat: CString,
    pub(super) text: CString,
}

/// The C handler: returns 0 when the message was handled, anything else marks it
/// failed.
pub type BotmeshHandler =
    Option<unsafe extern "C" fn(ctx: *const BotmeshContext<'_>, user_data: *mut c_void) -> c_int>;
/// The C outcome callback: `(chat, message_id or NULL, outcome, detail, user_data)`.
pub type BotmeshOutcome = Option<
    unsafe extern "C" fn(
        chat: *const c_char,
        message_id: *const c_char,
        outcome: c_int,
        detail: *const c_char,
        user_data: *mut c_void,
    ),
>;
/// The C transport's send: returns 0 when the text was sent.
pub type BotmeshSend = Option<
    unsafe extern "C" fn(chat: *const c_char, text: *const c_char, user_data: *mut c_void) -> c_int,
>;

/// The host's `user_data`, which the host promises may be used from any thread.
#[derive(Clone, Copy, Debug)]
pub(super) struct UserData(pub(super) *mut c_void);
// SAFETY: the header documents which threads call each callback with its user_data
// (the handler, send and outcome callbacks from the worker threads concurrently, a C
// transport's start and stop from a leadership thread or the builder's and stopper's
// threads); the host vouches for it by passing them.
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}

fn set_error(err: *mut BotmeshError, status: c_int, message: &str) {
    if err.is_null() {
        return;
    }
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: a non-NULL `err` is a live `botmesh_error` from `botmesh_error_new`.
    unsafe {
        (*err).message = message;
        (*err).status = status;
    }
}

/// Runs `f`, turning a panic into `BOTMESH_PANIC` with a message. `err` is reset
/// first, so it never shows an older call's failure.
pub(super) fn guard(
    err: *mut BotmeshError,
    f: impl FnOnce() -> Result<c_int, (c_int, String)>,
) -> c_int {
    set_error(err, BOTMESH_OK, "");
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(status)) => {
            if let Some(e) = (!err.is_null()).then_some(err) {
                // SAFETY: as in `set_error`.
                unsafe { (*e).status = status };
            }
            status
        }
        Ok(Err((status, message))) => {
            set_error(err, status, &message);
            status
        }
        Err(panic) => {
            set_error(
                err,
                BOTMESH_PANIC,
                &crate::error::panic_text("botmesh", &panic),
            );
            BOTMESH_PANIC
        }
    }
}

/// A UTF-8 string from C, or an error naming `what`.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string live for `'a`.
pub(super) unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str, (c_int, String)> {
    if s.is_null() {
        return Err((BOTMESH_INVALID, format!("{what}: NULL")));
    }
    // SAFETY: per this function's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| (BOTMESH_INVALID, format!("{what}: not UTF-8")))
}

/// A new, empty error holder. Free it with `botmesh_error_free`.
#[unsafe(no_mangle)]
pub extern "C" fn botmesh_error_new() -> *mut BotmeshError {
    Box::into_raw(Box::new(BotmeshError {
        message: CString::default(),
        status: BOTMESH_OK,
    }))
}

/// The status of the last call that was given `err` (`BOTMESH_OK` when it
/// succeeded); for the constructors, which return only NULL on failure.
///
/// # Safety
/// `err` is NULL or from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_error_status(err: *const BotmeshError) -> c_int {
    if err.is_null() {
        return BOTMESH_OK;
    }
    // SAFETY: per this function's contract.
    unsafe { (*err).status }
}

/// The last message stored in `err` ("" when none); valid until the next call that
/// fills `err`, or its free.
///
/// # Safety
/// `err` is NULL or from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_error_message(err: *const BotmeshError) -> *const c_char {
    static EMPTY: &CStr = c"";
    if err.is_null() {
        return EMPTY.as_ptr();
    }
    // SAFETY: per this function's contract.
    unsafe { (*err).message.as_ptr() }
}

/// Frees an error holder (NULL is ignored).
///
/// # Safety
/// `err` is NULL or from `botmesh_error_new`, and is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_error_free(err: *mut BotmeshError) {
    if !err.is_null() {
        // SAFETY: per this function's contract.
        drop(unsafe { Box::from_raw(err) });
    }
}

/// Parses a `CoordinationConfig` from JSON (`{"coordinator": {"memory": {}}}`, the
/// same fields as in files) and builds its coordinator once. Returns NULL with the
/// error in `err` when the JSON is refused (the message names the field and the
/// value) or the coordinator cannot be reached. Free it with `botmesh_config_free`.
///
/// # Safety
/// `json` is a NUL-terminated string; `err` is NULL or from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_config_new(
    json: *const c_char,
    err: *mut BotmeshError,
) -> *mut BotmeshConfig {
    let mut out = std::ptr::null_mut();
    guard(err, || {
        // SAFETY: per this function's contract.
        let json = unsafe { str_arg(json, "json") }?;
        let config = CoordinationConfig::from_json_str(json)
            .map_err(|e| (BOTMESH_CONFIG, e.to_string()))?
            .shared()
            .map_err(|e| (BOTMESH_BACKEND, e.to_string()))?;
        out = Box::into_raw(Box::new(BotmeshConfig { config }));
        Ok(BOTMESH_OK)
    });
    out
}

/// Frees a config (NULL is ignored). Bots built from it keep their coordinator.
///
/// # Safety
/// `config` is NULL or from `botmesh_config_new`, and is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_config_free(config: *mut BotmeshConfig) {
    if !config.is_null() {
        // SAFETY: per this function's contract.
        drop(unsafe { Box::from_raw(config) });
    }
}

/// The message's chat id (valid while the handler runs).
///
/// # Safety
/// `ctx` is the pointer the handler was given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_context_chat(ctx: *const BotmeshContext<'_>) -> *const c_char {
    if ctx.is_null() {
        return c"".as_ptr();
    }
    // SAFETY: per this function's contract.
    unsafe { (*ctx).chat.as_ptr() }
}

/// The message's text (valid while the handler runs).
///
/// # Safety
/// `ctx` is the pointer the handler was given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_context_text(ctx: *const BotmeshContext<'_>) -> *const c_char {
    if ctx.is_null() {
        return c"".as_ptr();
    }
    // SAFETY: per this function's contract.
    unsafe { (*ctx).text.as_ptr() }
}

/// The fencing token of the turn the message runs under (Kleppmann 2016).
///
/// # Safety
/// `ctx` is the pointer the handler was given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_context_fencing_token(ctx: *const BotmeshContext<'_>) -> u64 {
    if ctx.is_null() {
        return 0;
    }
    // SAFETY: per this function's contract.
    unsafe { (*ctx).ctx.turn().fencing_token() }
}

/// Replies to the message's chat through the host's `send` callback. Returns
/// `BOTMESH_SEND_FAILED` (message in `err`) when the turn was lost, the callback
/// failed or was NULL; `BOTMESH_INVALID` for a text that is NULL or not UTF-8.
///
/// # Safety
/// `ctx` is the pointer the handler was given; `text` a NUL-terminated string; `err`
/// NULL or from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_context_reply(
    ctx: *const BotmeshContext<'_>,
    text: *const c_char,
    err: *mut BotmeshError,
) -> c_int {
    guard(err, || {
        if ctx.is_null() {
            return Err((BOTMESH_INVALID, "ctx: NULL".into()));
        }
        // SAFETY: per this function's contract.
        let text = unsafe { str_arg(text, "text") }?;
        // SAFETY: per this function's contract.
        let ctx = unsafe { &*ctx };
        ctx.ctx
            .reply(text)
            .map(|()| BOTMESH_OK)
            .map_err(|e| (BOTMESH_SEND_FAILED, e.to_string()))
    })
}

/// Takes `message_id`/`chat`/`text` in through `intake`, as a status code.
///
/// # Safety
/// `chat` and `text` are NUL-terminated strings; `message_id` is NULL or one.
pub(super) unsafe fn deliver_to(
    intake: &Intake,
    chat: *const c_char,
    message_id: *const c_char,
    text: *const c_char,
) -> Result<c_int, (c_int, String)> {
    // SAFETY: per this function's contract.
    let (chat, text) = unsafe { (str_arg(chat, "chat")?, str_arg(text, "text")?) };
    let mut message = Message::new(chat, text);
    if !message_id.is_null() {
        // SAFETY: per this function's contract.
        message = message.with_id(unsafe { str_arg(message_id, "message_id") }?);
    }
    match intake.deliver(message) {
        Ok(Accepted::Queued) => Ok(BOTMESH_OK),
        Ok(Accepted::Duplicate) => Ok(BOTMESH_DUPLICATE),
        Err(e) if e.reason == Reason::ShuttingDown => Err((BOTMESH_SHUTTING_DOWN, e.to_string())),
        Err(e) if e.reason == Reason::Invalid => Err((BOTMESH_INVALID, e.to_string())),
        Err(e) => Err((BOTMESH_BACKEND, e.to_string())),
    }
}
