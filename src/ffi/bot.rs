//! Bots from C: the builder (with C transports), the running bot's intake and stop,
//! and its metrics text.

use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::base::{
    BotmeshConfig, BotmeshContext, BotmeshError, BotmeshHandler, BotmeshOutcome, BotmeshSend,
    UserData, deliver_to, guard, str_arg,
};
use super::provider::{BotmeshProvider, CProvider, CSend};
use super::status::{
    BOTMESH_BACKEND, BOTMESH_CONFIG, BOTMESH_INVALID, BOTMESH_OK, BOTMESH_OUTCOME_DROPPED,
    BOTMESH_OUTCOME_DUPLICATE, BOTMESH_OUTCOME_FAILED, BOTMESH_OUTCOME_HANDLED, BOTMESH_PROVIDER,
};
use crate::{Bot, CoordinationConfig, Intake, Message, Outcome, Provider, StartError};

/// The most worker threads a bot may ask for from C.
const MAX_WORKERS: u32 = 1024;

/// The C handler, known to be non-NULL.
type HandlerFn = unsafe extern "C" fn(*const BotmeshContext<'_>, *mut c_void) -> c_int;

/// A bot not yet started (`botmesh_builder`): what `botmesh_builder_new` was given,
/// and the C transports added since.
#[derive(Debug)]
pub struct BotmeshBuilder {
    id: String,
    workers: usize,
    /// `None`: one process, no coordination.
    config: Option<CoordinationConfig>,
    handler: HandlerFn,
    send: BotmeshSend,
    on_outcome: BotmeshOutcome,
    user_data: UserData,
    /// In the order added: handlers reply through the first.
    providers: Vec<CProvider>,
}

/// A running bot (`botmesh_bot`). Intake stays usable after a stop (it refuses),
/// so that threads still delivering never touch freed memory before the host frees
/// the handle.
#[derive(Debug)]
pub struct BotmeshBot {
    intake: Intake,
    bot: Bot,
}

/// The longest replica id accepted from C (the header's "too long id"): ids name keys
/// and channels at the backend, and a pod name fits many times over.
const MAX_REPLICA_ID_BYTES: usize = 1024;

/// A new builder for a bot (replica `id`, `workers` threads) that runs `handler` for
/// each message and sends replies through `send` (or through the first C transport
/// added); the three callbacks get `user_data`. With `config` NULL the bot runs
/// alone (no coordination; every transport is started directly). Returns NULL with
/// `BOTMESH_INVALID` in `err` for a NULL or non-UTF-8 id, a NULL handler, or workers
/// outside 1 to 1024. Start it with `botmesh_builder_build`.
///
/// # Safety
/// `id` is a NUL-terminated string; `config` is NULL or from `botmesh_config_new`;
/// `err` is NULL or from `botmesh_error_new`. The callbacks and `user_data` must stay
/// usable from several threads at once until the bot is freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_builder_new(
    id: *const c_char,
    workers: u32,
    config: *const BotmeshConfig,
    handler: BotmeshHandler,
    send: BotmeshSend,
    on_outcome: BotmeshOutcome,
    user_data: *mut c_void,
    err: *mut BotmeshError,
) -> *mut BotmeshBuilder {
    let mut out = std::ptr::null_mut();
    guard(err, || {
        // SAFETY: per this function's contract.
        let id = unsafe { str_arg(id, "id") }?;
        if id.is_empty() {
            return Err((
                BOTMESH_INVALID,
                "id: empty; give each replica its own id".into(),
            ));
        }
        if id.len() > MAX_REPLICA_ID_BYTES {
            return Err((
                BOTMESH_INVALID,
                format!(
                    "id: {} bytes, over the {MAX_REPLICA_ID_BYTES}-byte maximum",
                    id.len()
                ),
            ));
        }
        let Some(handler) = handler else {
            return Err((BOTMESH_INVALID, "handler: NULL".into()));
        };
        if workers == 0 || workers > MAX_WORKERS {
            return Err((
                BOTMESH_INVALID,
                format!("workers: {workers}; use 1 to {MAX_WORKERS}"),
            ));
        }
        // SAFETY: per this function's contract.
        let config = (!config.is_null()).then(|| unsafe { (*config).config.clone() });
        out = Box::into_raw(Box::new(BotmeshBuilder {
            id: id.to_owned(),
            workers: workers as usize,
            config,
            handler,
            send,
            on_outcome,
            user_data: UserData(user_data),
            providers: Vec::new(),
        }));
        Ok(BOTMESH_OK)
    });
    out
}

/// Adds a C transport with id `provider_id` (the same on every replica: its
/// leadership lease is named after it). With `exclusive` non-zero and coordination
/// whose `providerSession` is `auto` (the default) or `leader`, only the replica that
/// holds the leadership starts it, and it is stopped when the leadership is lost or
/// the bot stops; otherwise every replica starts it when the bot is built. The
/// callbacks are copied; each gets `user_data`. Returns `BOTMESH_INVALID` for a NULL
/// builder or callbacks struct, an empty or non-UTF-8 id, or a NULL `start` or `stop`.
/// A repeated id is refused by `botmesh_builder_build` (`BOTMESH_CONFIG`).
///
/// # Safety
/// `builder` is from `botmesh_builder_new` and not yet built or freed;
/// `provider_id` is a NUL-terminated string; `provider` points to a filled
/// `botmesh_provider`; `err` is NULL or from `botmesh_error_new`. The callbacks and
/// `user_data` must stay usable, from the threads the header names, until the bot is
/// freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_builder_add_provider(
    builder: *mut BotmeshBuilder,
    provider_id: *const c_char,
    exclusive: c_int,
    provider: *const BotmeshProvider,
    user_data: *mut c_void,
    err: *mut BotmeshError,
) -> c_int {
    guard(err, || {
        if builder.is_null() {
            return Err((BOTMESH_INVALID, "builder: NULL".into()));
        }
        if provider.is_null() {
            return Err((BOTMESH_INVALID, "provider: NULL".into()));
        }
        // SAFETY: per this function's contract.
        let id = unsafe { str_arg(provider_id, "provider_id") }?;
        // SAFETY: per this function's contract.
        let (builder, callbacks) = unsafe { (&mut *builder, *provider) };
        let p = CProvider::new(
            id.to_owned(),
            exclusive != 0,
            callbacks,
            user_data,
            builder.send,
            builder.user_data,
        )
        .map_err(|e| (BOTMESH_INVALID, e))?;
        builder.providers.push(p);
        Ok(BOTMESH_OK)
    })
}

/// Frees a builder that was not built (NULL is ignored).
///
/// # Safety
/// `builder` is NULL or from `botmesh_builder_new`, not built, and not used
/// afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_builder_free(builder: *mut BotmeshBuilder) {
    if !builder.is_null() {
        // SAFETY: per this function's contract.
        drop(unsafe { Box::from_raw(builder) });
    }
}

/// Starts the bot and frees the builder (also on failure). Shared-mode transports
/// start here, on this thread; leader-mode ones begin campaigning. Returns NULL with
/// the error in `err`: `BOTMESH_CONFIG` for a refused configuration or a repeated
/// provider id, `BOTMESH_BACKEND` for an unreachable coordinator, `BOTMESH_PROVIDER`
/// for a shared-mode transport whose start failed (the transports started before it
/// are stopped again), `BOTMESH_INVALID` for a NULL builder.
///
/// # Safety
/// `builder` is from `botmesh_builder_new` and not used afterwards; `err` is NULL or
/// from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_builder_build(
    builder: *mut BotmeshBuilder,
    err: *mut BotmeshError,
) -> *mut BotmeshBot {
    let mut out = std::ptr::null_mut();
    guard(err, || {
        if builder.is_null() {
            return Err((BOTMESH_INVALID, "builder: NULL".into()));
        }
        // SAFETY: per this function's contract.
        let b = unsafe { Box::from_raw(builder) };
        let bot = build(*b)?;
        out = Box::into_raw(Box::new(BotmeshBot {
            intake: bot.intake(),
            bot,
        }));
        Ok(BOTMESH_OK)
    });
    out
}

fn build(b: BotmeshBuilder) -> Result<Bot, (c_int, String)> {
    let data = b.user_data;
    let handler = b.handler;
    let mut builder = Bot::builder()
        .id(b.id)
        .workers(b.workers)
        .handler(move |ctx| {
            let data = data;
            let message = ctx.message();
            let c = BotmeshContext {
                ctx,
                chat: CString::new(message.chat.as_str()).unwrap_or_default(),
                text: CString::new(message.text.as_str()).unwrap_or_default(),
            };
            // SAFETY: the host's handler, called as the header documents.
            let rc = unsafe { handler(&c, data.0) };
            if rc == 0 {
                Ok(())
            } else {
                Err(format!("the C handler returned {rc}").into())
            }
        });
    // Replies go through the first provider: the host's first C transport, or its
    // plain `send` when it registered none.
    if b.providers.is_empty() {
        builder = builder.provider(Arc::new(CSend {
            send: b.send,
            user_data: data,
        }));
    }
    for p in b.providers {
        builder = builder.provider(Arc::new(p) as Arc<dyn Provider>);
    }
    if let Some(on_outcome) = b.on_outcome {
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
    if let Some(config) = b.config {
        builder = builder.coordination(config);
    }
    builder.build().map_err(|e| match e {
        StartError::Config(e) => (BOTMESH_CONFIG, e.to_string()),
        StartError::Provider(e) => (BOTMESH_PROVIDER, format!("provider failed to start: {e}")),
        other => (BOTMESH_BACKEND, other.to_string()),
    })
}

/// Starts a bot with no C transport: `botmesh_builder_new` then
/// `botmesh_builder_build`. Returns NULL with the error in `err` on bad arguments, a
/// refused configuration, or an unreachable coordinator. Stop it with
/// `botmesh_bot_stop`, free it with `botmesh_bot_free`.
///
/// # Safety
/// As `botmesh_builder_new`.
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
    // SAFETY: per this function's contract.
    let builder = unsafe {
        botmesh_builder_new(
            id, workers, config, handler, send, on_outcome, user_data, err,
        )
    };
    if builder.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a builder just made, used once.
    unsafe { botmesh_builder_build(builder, err) }
}

/// Takes a message in (chat, optional message id for duplicate suppression, text).
/// Returns `BOTMESH_OK` once it holds its place in its chat's queue (the handler runs
/// later, on a worker), `BOTMESH_DUPLICATE` when its id was handled recently (one
/// still in flight is taken in), `BOTMESH_BACKEND` or `BOTMESH_SHUTTING_DOWN` when it
/// was not taken in (the caller should let the platform retry), `BOTMESH_INVALID` for
/// bad arguments.
///
/// # Safety
/// `bot` is from `botmesh_bot_new` or `botmesh_builder_build`; `chat` and `text` are
/// NUL-terminated strings; `message_id` is NULL or one; `err` is NULL or from
/// `botmesh_error_new`.
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
        // SAFETY: per this function's contract (the handle lives until freed; after a
        // stop its intake refuses).
        let intake = unsafe { &(*bot).intake };
        // SAFETY: per this function's contract.
        unsafe { deliver_to(intake, chat, message_id, text) }
    })
}

/// Stops the bot cleanly ([`Bot::stop`]): intake refuses from now on
/// (`BOTMESH_SHUTTING_DOWN`), every message taken in ends first, then the transports
/// stop (a leader stops its C transport, then hands its leadership to a standby at
/// once) and the workers stop. The handle stays valid (threads still delivering get
/// `BOTMESH_SHUTTING_DOWN`) until `botmesh_bot_free`. Returns `BOTMESH_INVALID` when
/// called from the bot's own handler, outcome callback or transport `start`/`stop`
/// (it would wait for itself) or with a NULL bot; stopping twice is `BOTMESH_OK`.
///
/// # Safety
/// `bot` is NULL or a live bot handle; `err` is NULL or from `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_bot_stop(bot: *const BotmeshBot, err: *mut BotmeshError) -> c_int {
    guard(err, || {
        if bot.is_null() {
            return Err((BOTMESH_INVALID, "bot: NULL".into()));
        }
        // SAFETY: per this function's contract.
        let bot = unsafe { &(*bot).bot };
        bot.stop()
            .map(|()| BOTMESH_OK)
            .map_err(|e| (BOTMESH_INVALID, format!("botmesh_bot_stop: {e}")))
    })
}

/// Frees a bot, stopping it first if `botmesh_bot_stop` was not called. NULL is
/// ignored. No other thread may use the handle once this is called.
///
/// # Safety
/// `bot` is NULL or a live bot handle; it is not used afterwards; not called from the
/// bot's own callbacks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_bot_free(bot: *mut BotmeshBot) {
    if bot.is_null() {
        return;
    }
    // SAFETY: per this function's contract.
    let bot = unsafe { Box::from_raw(bot) };
    if catch_unwind(AssertUnwindSafe(|| drop(bot))).is_err() {
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

/// The bot's metrics in the Prometheus text format 0.0.4 ([`Bot::metrics_text`]),
/// as a NUL-terminated string the caller frees with `botmesh_string_free`; its length
/// in bytes (without the NUL) goes to `out_len` unless that is NULL. Works before and
/// after a stop. Returns `BOTMESH_INVALID` (and `*out` NULL) for a NULL `bot` or
/// `out`.
///
/// # Safety
/// `bot` is NULL or a live bot handle; `out` is NULL or points to a `char *`;
/// `out_len` is NULL or points to a `size_t`; `err` is NULL or from
/// `botmesh_error_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_bot_metrics_text(
    bot: *const BotmeshBot,
    out: *mut *mut c_char,
    out_len: *mut usize,
    err: *mut BotmeshError,
) -> c_int {
    guard(err, || {
        if out.is_null() {
            return Err((BOTMESH_INVALID, "out: NULL".into()));
        }
        // SAFETY: per this function's contract.
        unsafe { *out = std::ptr::null_mut() };
        if bot.is_null() {
            return Err((BOTMESH_INVALID, "bot: NULL".into()));
        }
        // SAFETY: per this function's contract.
        let text = unsafe { &(*bot).bot }.metrics_text();
        let len = text.len();
        // The exposition quotes provider ids, which come from C strings: no NUL.
        let text = CString::new(text)
            .map_err(|_| (BOTMESH_INVALID, "metrics text: holds a NUL byte".to_owned()))?;
        // SAFETY: per this function's contract.
        unsafe {
            *out = text.into_raw();
            if !out_len.is_null() {
                *out_len = len;
            }
        }
        Ok(BOTMESH_OK)
    })
}

/// Frees a string the library allocated for the caller (`botmesh_bot_metrics_text`).
/// NULL is ignored.
///
/// # Safety
/// `s` is NULL or from `botmesh_bot_metrics_text`, not freed before, not used
/// afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn botmesh_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: per this function's contract.
        drop(unsafe { CString::from_raw(s) });
    }
}
