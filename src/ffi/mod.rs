//! The C ABI (feature `ffi`): bots, their configuration and their messages behind
//! opaque handles, for C and C++ hosts. The header is `include/botmesh.h`; build the
//! library with `cargo rustc --release --features ffi --crate-type cdylib`.
//!
//! Shape (after `rure`, regex's C API):
//!
//! - every object is an opaque pointer with a `_free` function (`NULL` is accepted and
//!   ignored);
//! - a function that can fail returns a `botmesh_status` and fills a caller-owned
//!   `botmesh_error` (which may be `NULL`) whose message `botmesh_error_message` reads;
//! - no panic crosses the boundary: each entry point catches it and returns
//!   `BOTMESH_PANIC` (or `NULL`);
//! - strings are NUL-terminated UTF-8; strings handed to a callback live until it
//!   returns.
//!
//! The handler runs on the bot's worker threads, so it and its `user_data` must be
//! safe to call from several threads at once.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::{
    Accepted, Bot, Context, CoordinationConfig, Intake, Message, Outcome, Provider, ProviderError,
    Reason, Session, StartError,
};

mod status;
pub use status::*;

/// An error message holder owned by the caller (`botmesh_error`): the status and
/// message of the last call that was given it.
#[derive(Debug)]
pub struct BotmeshError {
    message: CString,
    status: c_int,
}

/// The most worker threads a bot may ask for from C.
const MAX_WORKERS: u32 = 1024;

thread_local! {
    /// Set while a C handler runs on this thread: stopping the bot from there would
    /// wait for the handler itself.
    static IN_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A configuration with its coordinator built once (`botmesh_config`): bots built from
/// one config share the coordinator (and so exclude each other).
#[derive(Debug)]
pub struct BotmeshConfig {
    config: CoordinationConfig,
}

/// A running bot (`botmesh_bot`). Intake stays usable after a stop (it refuses),
/// so that threads still delivering never touch freed memory before the host frees
/// the handle.
#[derive(Debug)]
pub struct BotmeshBot {
    intake: Intake,
    bot: parking_lot::Mutex<Option<Bot>>,
}

/// What a handler sees (`botmesh_context`), valid while the handler runs.
#[derive(Debug)]
pub struct BotmeshContext<'a> {
    ctx: &'a Context<'a>,
    chat: CString,
    text: CString,
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
#[derive(Clone, Copy)]
struct UserData(*mut c_void);
// SAFETY: the header documents that the handler, the send callback and their
// user_data are called from the bot's worker threads concurrently; the host vouches
// for it by passing them.
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
fn guard(err: *mut BotmeshError, f: impl FnOnce() -> Result<c_int, (c_int, String)>) -> c_int {
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
unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str, (c_int, String)> {
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

/// The C transport: replies go to the host's `send` callback.
struct CSend {
    send: BotmeshSend,
    user_data: UserData,
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
        let Some(send) = self.send else {
            return Err(ProviderError("the host gave no send callback".into()));
        };
        let chat = CString::new(chat).map_err(|_| ProviderError("chat holds a NUL".into()))?;
        let text = CString::new(text).map_err(|_| ProviderError("text holds a NUL".into()))?;
        // SAFETY: the host's callback, called as the header documents.
        let rc = unsafe { send(chat.as_ptr(), text.as_ptr(), self.user_data.0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(ProviderError(format!("the host's send returned {rc}")))
        }
    }
}

/// Starts a bot (replica `id`, `workers` threads) that runs `handler` for each
/// message and sends replies through `send`; both get `user_data`. With `config`
/// NULL the bot runs alone (no coordination). Returns NULL with the error in `err`
/// on bad arguments, a refused configuration, or an unreachable coordinator.
/// Stop and free it with `botmesh_bot_shutdown`.
///
/// # Safety
/// `id` is a NUL-terminated string; `config` is NULL or from `botmesh_config_new`;
/// `handler`, `send` and `user_data` may be called from several threads at once until
/// `botmesh_bot_shutdown` returns; `err` is NULL or from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_bot_new(
    id: *const c_char,
    workers: u32,
    config: *const BotmeshConfig,
    handler: BotmeshHandler,
    send: BotmeshSend,
    on_outcome: BotmeshOutcome,
    user_data: *mut c_void,
    err: *mut BotmeshError,
) -> *mut BotmeshBot {
    let mut out = std::ptr::null_mut();
    guard(err, || {
        // SAFETY: per this function's contract.
        let id = unsafe { str_arg(id, "id") }?;
        let Some(handler) = handler else {
            return Err((BOTMESH_INVALID, "handler: NULL".into()));
        };
        if workers == 0 || workers > MAX_WORKERS {
            return Err((
                BOTMESH_INVALID,
                format!("workers: {workers}; use 1 to {MAX_WORKERS}"),
            ));
        }
        let data = UserData(user_data);
        let mut builder = Bot::builder()
            .id(id)
            .workers(workers as usize)
            .provider(Arc::new(CSend {
                send,
                user_data: data,
            }))
            .handler(move |ctx| {
                let data = data;
                let message = ctx.message();
                let c = BotmeshContext {
                    ctx,
                    chat: CString::new(message.chat.as_str()).unwrap_or_default(),
                    text: CString::new(message.text.as_str()).unwrap_or_default(),
                };
                IN_HANDLER.with(|h| h.set(true));
                // SAFETY: the host's handler, called as the header documents.
                let rc = unsafe { handler(&c, data.0) };
                IN_HANDLER.with(|h| h.set(false));
                if rc == 0 {
                    Ok(())
                } else {
                    Err(format!("the C handler returned {rc}").into())
                }
            });
        if let Some(on_outcome) = on_outcome {
            builder = builder.on_outcome(move |m: &Message, o: &Outcome| {
                let data = data;
                let (code, detail) = match o {
                    Outcome::Handled { .. } => (BOTMESH_OUTCOME_HANDLED, String::new()),
                    Outcome::Failed(text) => (BOTMESH_OUTCOME_FAILED, text.clone()),
                    Outcome::Dropped(e) => (BOTMESH_OUTCOME_DROPPED, e.to_string()),
                    Outcome::Duplicate => (BOTMESH_OUTCOME_DUPLICATE, String::new()),
                };
                let chat = CString::new(m.chat.as_str()).unwrap_or_default();
                let id = m.id.as_deref().map(|i| CString::new(i).unwrap_or_default());
                let detail = CString::new(detail.replace('\0', " ")).unwrap_or_default();
                let id_ptr = id.as_ref().map_or(std::ptr::null(), |i| i.as_ptr());
                // SAFETY: the host's callback, called as the header documents.
                unsafe { on_outcome(chat.as_ptr(), id_ptr, code, detail.as_ptr(), data.0) };
            });
        }
        if !config.is_null() {
            // SAFETY: per this function's contract.
            builder = builder.coordination(unsafe { (*config).config.clone() });
        }
        let bot = builder.build().map_err(|e| match e {
            StartError::Config(e) => (BOTMESH_CONFIG, e.to_string()),
            other => (BOTMESH_BACKEND, other.to_string()),
        })?;
        out = Box::into_raw(Box::new(BotmeshBot {
            intake: bot.intake(),
            bot: parking_lot::Mutex::new(Some(bot)),
        }));
        Ok(BOTMESH_OK)
    });
    out
}

/// Takes a message in (chat, optional message id for duplicate suppression, text).
/// Returns `BOTMESH_OK` once it holds its place in its chat's queue (the handler runs
/// later, on a worker), `BOTMESH_DUPLICATE` when its id was handled recently (one still in flight is taken in),
/// `BOTMESH_BACKEND` or `BOTMESH_SHUTTING_DOWN` when it was not taken in (the caller
/// should let the platform retry), `BOTMESH_INVALID` for bad arguments.
///
/// # Safety
/// `bot` is from `botmesh_bot_new`; `chat` and `text` are NUL-terminated strings;
/// `message_id` is NULL or one; `err` is NULL or from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_bot_deliver(
    bot: *const BotmeshBot,
    chat: *const c_char,
    message_id: *const c_char,
    text: *const c_char,
    err: *mut BotmeshError,
) -> c_int {
    guard(err, || {
        if bot.is_null() {
            return Err((BOTMESH_INVALID, "bot: NULL".into()));
        }
        // SAFETY: per this function's contract.
        let (chat, text) = unsafe { (str_arg(chat, "chat")?, str_arg(text, "text")?) };
        let mut message = Message::new(chat, text);
        if !message_id.is_null() {
            // SAFETY: per this function's contract.
            message = message.with_id(unsafe { str_arg(message_id, "message_id") }?);
        }
        // SAFETY: per this function's contract (the handle lives until freed; after a
        // stop its intake refuses).
        let intake = unsafe { &(*bot).intake };
        match intake.deliver(message) {
            Ok(Accepted::Queued) => Ok(BOTMESH_OK),
            Ok(Accepted::Duplicate) => Ok(BOTMESH_DUPLICATE),
            Err(e) if e.reason == Reason::ShuttingDown => {
                Err((BOTMESH_SHUTTING_DOWN, e.to_string()))
            }
            Err(e) if e.reason == Reason::Invalid => Err((BOTMESH_INVALID, e.to_string())),
            Err(e) => Err((BOTMESH_BACKEND, e.to_string())),
        }
    })
}

/// Stops the bot cleanly: intake refuses from now on (`BOTMESH_SHUTTING_DOWN`),
/// every message taken in ends first, then the workers stop. The handle stays valid
/// (threads still delivering get `BOTMESH_SHUTTING_DOWN`) until `botmesh_bot_free`.
/// Returns `BOTMESH_INVALID` when called from a handler (it would wait for itself)
/// or with a NULL bot; stopping twice is `BOTMESH_OK`.
///
/// # Safety
/// `bot` is NULL or from `botmesh_bot_new` and not freed; `err` is NULL or from
/// `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_bot_stop(bot: *const BotmeshBot, err: *mut BotmeshError) -> c_int {
    guard(err, || {
        if bot.is_null() {
            return Err((BOTMESH_INVALID, "bot: NULL".into()));
        }
        if IN_HANDLER.with(std::cell::Cell::get) {
            return Err((
                BOTMESH_INVALID,
                "botmesh_bot_stop called from a handler: it would wait for that handler".into(),
            ));
        }
        // SAFETY: per this function's contract.
        let taken = unsafe { (*bot).bot.lock().take() };
        if let Some(b) = taken {
            b.shutdown();
        }
        Ok(BOTMESH_OK)
    })
}

/// Frees a bot, stopping it first if `botmesh_bot_stop` was not called. NULL is
/// ignored. No other thread may use the handle once this is called.
///
/// # Safety
/// `bot` is NULL or from `botmesh_bot_new`; it is not used afterwards; not called
/// from a handler.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_bot_free(bot: *mut BotmeshBot) {
    if bot.is_null() {
        return;
    }
    // SAFETY: per this function's contract.
    let bot = unsafe { Box::from_raw(bot) };
    let stopped = catch_unwind(AssertUnwindSafe(|| {
        if let Some(b) = bot.bot.lock().take() {
            b.shutdown();
        }
    }));
    if stopped.is_err() {
        log::error!(target: "botmesh::ffi", "a panic during shutdown was caught");
    }
}

/// `botmesh_bot_stop` then `botmesh_bot_free`, for a host whose own intake has
/// stopped.
///
/// # Safety
/// As `botmesh_bot_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_bot_shutdown(bot: *mut BotmeshBot) {
    // SAFETY: per this function's contract.
    unsafe { botmesh_bot_free(bot) }
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
