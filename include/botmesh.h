/*
 * botmesh: run a chatbot as N replicas safely. C API (cargo feature `ffi`).
 *
 * Build the library:  cargo rustc --release --features ffi --crate-type cdylib
 * Link:               cc app.c -Iinclude -Ltarget/release -lbotmesh
 *
 * Conventions:
 *  - Every object is an opaque pointer with a _free (or _shutdown) function; NULL is
 *    accepted there and ignored.
 *  - Functions that can fail return a botmesh_status (or NULL) and fill a
 *    caller-owned botmesh_error when one is given (err may be NULL): its status and
 *    message are those of the last call given it (reset at the start of each call).
 *    The message pointer is valid until that error is given to another call or freed.
 *    Do not share one botmesh_error between threads (or with a handler).
 *  - Strings are NUL-terminated UTF-8. Strings passed to callbacks are valid until
 *    the callback returns.
 *  - No Rust panic crosses into C: it becomes BOTMESH_PANIC (or NULL).
 *  - The handler, send and outcome callbacks run on the bot's worker threads, possibly
 *    several at once: they and their user_data must be thread-safe. They must not
 *    throw C++ exceptions or longjmp across the library (the process aborts).
 */
#ifndef BOTMESH_H
#define BOTMESH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status and outcome codes: the values come from src/ffi/status.rs; tests/ffi.rs fails
 * when a name or value here differs from it. */
typedef int botmesh_status;
#define BOTMESH_OK 0            /* done */
#define BOTMESH_INVALID 1       /* a NULL or non-UTF-8 argument, zero workers, an empty or too long id */
#define BOTMESH_CONFIG 2        /* configuration refused: the message names field and value */
#define BOTMESH_BACKEND 3       /* the coordinator could not be reached */
#define BOTMESH_SHUTTING_DOWN 4 /* the bot is stopping; nothing was taken in */
#define BOTMESH_DUPLICATE 5     /* the message id was handled recently (not an error) */
#define BOTMESH_SEND_FAILED 6   /* a reply was refused (lost turn) or the send failed */
#define BOTMESH_PANIC 7         /* Rust code panicked; caught at the boundary */

typedef struct botmesh_error botmesh_error;
typedef struct botmesh_config botmesh_config;
typedef struct botmesh_bot botmesh_bot;
typedef struct botmesh_context botmesh_context;

/* Runs once per message, under the chat's turn. Return 0 when handled; any other
 * value marks it failed (it is not run again: its id counts as seen). */
typedef int (*botmesh_handler)(const botmesh_context *ctx, void *user_data);
/* The transport: send text to a chat. Return 0 when sent. */
typedef int (*botmesh_send)(const char *chat, const char *text, void *user_data);
/* How each message taken in ended, once: outcome is one of the codes below; message_id
 * may be NULL; detail says why (empty when handled). */
typedef void (*botmesh_outcome)(const char *chat, const char *message_id, int outcome,
                                const char *detail, void *user_data);
#define BOTMESH_OUTCOME_HANDLED 0
#define BOTMESH_OUTCOME_FAILED 1    /* the handler returned non-zero */
#define BOTMESH_OUTCOME_DROPPED 2   /* not run: turn wait ran out, lease lost, backend down, stopping */
#define BOTMESH_OUTCOME_DUPLICATE 3

/* Errors: a holder the caller owns; the message is "" until a call fills it. */
botmesh_error *botmesh_error_new(void);
const char *botmesh_error_message(const botmesh_error *err);
/* The status of the last call given err (BOTMESH_OK when it succeeded). */
botmesh_status botmesh_error_status(const botmesh_error *err);
void botmesh_error_free(botmesh_error *err);

/* A CoordinationConfig from JSON, e.g. {"coordinator": {"memory": {}}, "turnWaitMs": "2m"}
 * or {"coordinator": {"redis": {"url": "redis://127.0.0.1:6379/"}}}. Its coordinator
 * is built once: bots built from one config share it. NULL on error. */
botmesh_config *botmesh_config_new(const char *json, botmesh_error *err);
void botmesh_config_free(botmesh_config *config);

/* Starts a bot: replica `id`, `workers` threads (1 to 1024), coordination from
 * `config` (NULL: one process, no coordination). `send` and `on_outcome` may be NULL.
 * NULL on error; botmesh_error_status tells BOTMESH_INVALID, BOTMESH_CONFIG or
 * BOTMESH_BACKEND apart. */
botmesh_bot *botmesh_bot_new(const char *id, uint32_t workers, const botmesh_config *config,
                             botmesh_handler handler, botmesh_send send,
                             botmesh_outcome on_outcome, void *user_data, botmesh_error *err);
/* Takes a message in; returns once it holds its place in its chat's queue (the
 * handler runs later, on a worker). message_id may be NULL (no duplicate
 * suppression). Safe to call from several threads at once. Returns BOTMESH_OK,
 * BOTMESH_DUPLICATE (the id was handled already; nothing more happens), BOTMESH_BACKEND
 * or BOTMESH_SHUTTING_DOWN (not taken in: let the platform retry), BOTMESH_INVALID,
 * BOTMESH_PANIC. A message whose id is still in flight on another delivery returns
 * BOTMESH_OK: it waits for that one and ends with BOTMESH_OUTCOME_DUPLICATE, or runs
 * if that one's replica died first. */
botmesh_status botmesh_bot_deliver(const botmesh_bot *bot, const char *chat,
                                   const char *message_id, const char *text,
                                   botmesh_error *err);
/* Clean stop: from now on deliver returns BOTMESH_SHUTTING_DOWN (the handle stays
 * valid, so intake threads may still call it), every message taken in ends, the
 * workers stop. BOTMESH_INVALID from inside a handler (it would wait for itself). */
botmesh_status botmesh_bot_stop(const botmesh_bot *bot, botmesh_error *err);
/* Frees the bot (stopping it first if needed). No other thread may use it afterwards. */
void botmesh_bot_free(botmesh_bot *bot);
/* botmesh_bot_stop then botmesh_bot_free. */
void botmesh_bot_shutdown(botmesh_bot *bot);

/* Inside a handler only: ctx and the strings are valid until the handler returns. */
const char *botmesh_context_chat(const botmesh_context *ctx);
const char *botmesh_context_text(const botmesh_context *ctx);
uint64_t botmesh_context_fencing_token(const botmesh_context *ctx);
botmesh_status botmesh_context_reply(const botmesh_context *ctx, const char *text,
                                     botmesh_error *err);

#ifdef __cplusplus
}
#endif

#endif /* BOTMESH_H */
