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
 *    caller-owned botmesh_error when one is given (err may be NULL).
 *  - Strings are NUL-terminated UTF-8. Strings passed to callbacks are valid until
 *    the callback returns.
 *  - No Rust panic crosses into C: it becomes BOTMESH_PANIC (or NULL).
 *  - The handler and send callbacks run on the bot's worker threads, possibly
 *    several at once: they and their user_data must be thread-safe.
 */
#ifndef BOTMESH_H
#define BOTMESH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int botmesh_status;
#define BOTMESH_OK 0            /* done */
#define BOTMESH_INVALID 1       /* a NULL or non-UTF-8 argument, zero workers */
#define BOTMESH_CONFIG 2        /* configuration refused: the message names field and value */
#define BOTMESH_BACKEND 3       /* the coordinator could not be reached */
#define BOTMESH_SHUTTING_DOWN 4 /* the bot is stopping; nothing was taken in */
#define BOTMESH_DUPLICATE 5     /* the message id was seen recently (not an error) */
#define BOTMESH_SEND_FAILED 6   /* a reply was refused (lost turn) or the send failed */
#define BOTMESH_PANIC 7         /* Rust code panicked; caught at the boundary */

typedef struct botmesh_error botmesh_error;
typedef struct botmesh_config botmesh_config;
typedef struct botmesh_bot botmesh_bot;
typedef struct botmesh_context botmesh_context;

/* Runs once per message, under the chat's turn. Return 0 when handled. */
typedef int (*botmesh_handler)(const botmesh_context *ctx, void *user_data);
/* The transport: send text to a chat. Return 0 when sent. */
typedef int (*botmesh_send)(const char *chat, const char *text, void *user_data);

/* Errors: a holder the caller owns; the message is "" until a call fills it. */
botmesh_error *botmesh_error_new(void);
const char *botmesh_error_message(const botmesh_error *err);
void botmesh_error_free(botmesh_error *err);

/* A CoordinationConfig from JSON, e.g. {"coordinator": {"memory": {}}, "turnWaitMs": "2m"}
 * or {"coordinator": {"redis": {"url": "redis://127.0.0.1:6379/"}}}. Its coordinator
 * is built once: bots built from one config share it. NULL on error. */
botmesh_config *botmesh_config_new(const char *json, botmesh_error *err);
void botmesh_config_free(botmesh_config *config);

/* Starts a bot: replica `id`, `workers` threads (>= 1), coordination from `config`
 * (NULL: one process, no coordination). NULL on error. */
botmesh_bot *botmesh_bot_new(const char *id, uint32_t workers, const botmesh_config *config,
                             botmesh_handler handler, botmesh_send send, void *user_data,
                             botmesh_error *err);
/* Takes a message in; returns once it holds its place in its chat's queue (the
 * handler runs later, on a worker). message_id may be NULL (no duplicate
 * suppression). Safe to call from several threads at once. Returns BOTMESH_OK,
 * BOTMESH_DUPLICATE, BOTMESH_BACKEND or BOTMESH_SHUTTING_DOWN (not taken in: let the
 * platform retry), BOTMESH_INVALID, BOTMESH_PANIC. */
botmesh_status botmesh_bot_deliver(const botmesh_bot *bot, const char *chat,
                                   const char *message_id, const char *text,
                                   botmesh_error *err);
/* Clean stop (every message taken in ends first), then frees the bot. No other call
 * may use `bot` once this is called (stop your intake threads first); handlers still
 * running finish before it returns. */
void botmesh_bot_shutdown(botmesh_bot *bot);

/* Inside a handler. */
const char *botmesh_context_chat(const botmesh_context *ctx);
const char *botmesh_context_text(const botmesh_context *ctx);
uint64_t botmesh_context_fencing_token(const botmesh_context *ctx);
botmesh_status botmesh_context_reply(const botmesh_context *ctx, const char *text,
                                     botmesh_error *err);

#ifdef __cplusplus
}
#endif

#endif /* BOTMESH_H */
