/*
 * botmesh: run a chatbot as N replicas safely. C API (cargo feature `ffi`).
 *
 * Build the library:  cargo rustc --release --features ffi --crate-type cdylib --lib
 * Link:               cc app.c -Iinclude -Ltarget/release -lbotmesh
 *
 * Conventions:
 *  - Every object is an opaque pointer with a _free (or _shutdown) function; NULL is
 *    accepted there and ignored. A string the library allocates for the caller
 *    (botmesh_bot_metrics_text) is freed with botmesh_string_free.
 *  - Functions that can fail return a botmesh_status (or NULL) and fill a
 *    caller-owned botmesh_error when one is given (err may be NULL): its status and
 *    message are those of the last call given it (reset at the start of each call).
 *    The message pointer is valid until that error is given to another call or freed.
 *    Do not share one botmesh_error between threads (or with a handler).
 *  - Strings are NUL-terminated UTF-8. Strings passed to callbacks are valid until
 *    the callback returns.
 *  - No Rust panic crosses into C: it becomes BOTMESH_PANIC (or NULL).
 *  - The handler and send callbacks run on the bot's worker threads, possibly several
 *    at once: they and their user_data must be thread-safe. The outcome callback runs
 *    wherever a message ends: a worker, but also botmesh's lease-renewal, timer and
 *    subscriber threads, and inside botmesh_bot_deliver itself (a duplicate): keep it
 *    short and never take a lock in it that the caller of deliver may hold (a slow
 *    outcome callback on the renewal thread delays every lease's renewal). A C transport's
 *    start and stop run on other threads (see botmesh_provider). No callback may
 *    throw C++ exceptions or longjmp across the library (the process aborts).
 */
#ifndef BOTMESH_H
#define BOTMESH_H

#include <stddef.h>
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
#define BOTMESH_PROVIDER 8      /* a transport started at build (shared mode) failed to start */

typedef struct botmesh_error botmesh_error;
typedef struct botmesh_config botmesh_config;
typedef struct botmesh_bot botmesh_bot;
typedef struct botmesh_context botmesh_context;
typedef struct botmesh_builder botmesh_builder;
typedef struct botmesh_session botmesh_session;

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

/* Starts a bot with no C transport: replica `id`, `workers` threads (1 to 1024),
 * coordination from `config` (NULL: one process, no coordination); replies go to
 * `send`. `send` and `on_outcome` may be NULL. NULL on error; botmesh_error_status
 * tells BOTMESH_INVALID, BOTMESH_CONFIG or BOTMESH_BACKEND apart. The same as
 * botmesh_builder_new then botmesh_builder_build. */
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
 * valid, so intake threads may still call it), every message taken in ends, then the
 * transports stop (a leader stops its transport, then hands the leadership to a
 * standby at once), the workers stop. Callable from any thread; a second call waits
 * for the first and returns BOTMESH_OK. BOTMESH_INVALID from inside the bot's own
 * handler, outcome callback or transport start/stop (it would wait for itself). */
botmesh_status botmesh_bot_stop(const botmesh_bot *bot, botmesh_error *err);
/* Frees the bot (stopping it first if needed). No other thread may use it afterwards. */
void botmesh_bot_free(botmesh_bot *bot);
/* botmesh_bot_stop then botmesh_bot_free. */
void botmesh_bot_shutdown(botmesh_bot *bot);

/* The bot's metrics in the Prometheus text format 0.0.4: botmesh_..._total counters,
 * gauges, the botmesh_turn_wait_seconds histogram, and per exclusive transport
 * botmesh_leader_election_master_status{name="<provider id>"} (1 leading, 0 standby).
 * No label holds a chat id. On BOTMESH_OK *out is a NUL-terminated string the caller
 * frees with botmesh_string_free and *out_len (when out_len is not NULL) its length
 * in bytes without the NUL; on failure *out is NULL. Works before and after a stop;
 * safe from any thread. BOTMESH_INVALID for a NULL bot or out. */
botmesh_status botmesh_bot_metrics_text(const botmesh_bot *bot, char **out, size_t *out_len,
                                        botmesh_error *err);
/* Frees a string from botmesh_bot_metrics_text (NULL is ignored). */
void botmesh_string_free(char *s);

/* ---- C transports and provider leadership ------------------------------------
 *
 * A transport (a platform connection: a socket, a long-polling loop) is a struct of
 * function pointers plus a user_data pointer, added to a builder:
 *
 *   botmesh_builder *b = botmesh_builder_new("pod-1", 4, config, handle, NULL, NULL, NULL, err);
 *   botmesh_provider phone = {phone_start, phone_stop, phone_send};
 *   botmesh_builder_add_provider(b, "phone", 1, &phone, &my_phone, err);
 *   botmesh_bot *bot = botmesh_builder_build(b, err);  // frees b
 *
 * An exclusive transport (one live session per account: WhatsApp Web, Telegram long
 * polling) is started only on the replica that holds the lease "provider:<id>" when
 * the config's providerSession is "auto" (the default) or "leader"; the other
 * replicas stand by and one of them starts it when the leader stops (at once),
 * crashes (within the lease TTL and one re-check) or steps down because the session
 * stayed closed for providerDownMs. A leader whose lease is lost stops it. A
 * non-exclusive transport (or providerSession "shared", or no config) is started on
 * every replica, in botmesh_builder_build.
 *
 * Threads:
 *  - start and stop of a leader-mode transport run on that transport's leadership
 *    thread (one per transport and bot, named botmesh-lead-<replica>-<id>); in shared
 *    mode start runs on the thread calling botmesh_builder_build and stop on the
 *    thread calling botmesh_bot_stop / botmesh_bot_free. For one transport they never
 *    overlap: each successful start (returned 0) is followed by exactly one stop
 *    before any next start; a failed start gets no stop.
 *  - send runs on the worker threads, possibly several at once (the bot refuses a
 *    reply through a leader-mode transport before calling send whenever this replica
 *    does not hold a live leadership).
 *  - botmesh_session_* may be called from any thread (the host's own polling thread)
 *    between start and the return of the matching stop.
 *  - start must return promptly: connect on a thread of your own. stop returns once
 *    nothing more is delivered through the session; when the leader's renewals fail
 *    it is called one renewal period (lease TTL / 3) before the lease could lapse, so
 *    it must return within that. It must not wait for a thread that is inside
 *    botmesh_session_deliver (that can block up to the coordinator's command timeout):
 *    tell that thread to drop what it delivers instead.
 *  - start and stop must not call botmesh_bot_stop (BOTMESH_INVALID) or
 *    botmesh_bot_free.
 */
typedef struct botmesh_provider {
    /* Connect. session is valid until the matching stop returns; deliver through it
     * and report its state. Return 0 when starting, anything else for a failed start
     * (in leader mode the leader then steps down after providerDownMs; in shared mode
     * botmesh_builder_build fails with BOTMESH_PROVIDER). Required. */
    int (*start)(botmesh_session *session, void *user_data);
    /* Disconnect; return once nothing more is delivered. Required. */
    void (*stop)(void *user_data);
    /* Send text to chat; return 0 when sent. May be NULL: the bot's send is used. */
    int (*send)(const char *chat, const char *text, void *user_data);
} botmesh_provider;

/* A builder: the same arguments as botmesh_bot_new. Replies go through the first
 * transport added (its send, or the bot's send when that is NULL), or through `send`
 * when none is added. NULL on error (BOTMESH_INVALID). */
botmesh_builder *botmesh_builder_new(const char *id, uint32_t workers,
                                     const botmesh_config *config, botmesh_handler handler,
                                     botmesh_send send, botmesh_outcome on_outcome,
                                     void *user_data, botmesh_error *err);
/* Adds a transport with a stable provider_id (the same on every replica) and
 * exclusive (non-zero: one live session across the replicas). The struct is copied;
 * its callbacks get user_data. BOTMESH_INVALID for an empty id or a NULL start or
 * stop. */
botmesh_status botmesh_builder_add_provider(botmesh_builder *builder, const char *provider_id,
                                            int exclusive, const botmesh_provider *provider,
                                            void *user_data, botmesh_error *err);
/* Starts the bot and frees the builder, also on failure. NULL on error:
 * BOTMESH_CONFIG (refused config, a provider id used twice), BOTMESH_BACKEND,
 * BOTMESH_PROVIDER (a shared-mode start failed; those started before are stopped). */
botmesh_bot *botmesh_builder_build(botmesh_builder *builder, botmesh_error *err);
/* Frees a builder that was not built. */
void botmesh_builder_free(botmesh_builder *builder);

/* Session states for botmesh_session_report: the values come from src/ffi/status.rs. */
#define BOTMESH_SESSION_CONNECTING 0 /* (re)connecting; does not end a closed period */
#define BOTMESH_SESSION_OPEN 1       /* live: messages flow */
#define BOTMESH_SESSION_REPLACED 2   /* closed: another session of the account connected */
#define BOTMESH_SESSION_FENCED 3     /* closed: the platform refused this fencing token */
#define BOTMESH_SESSION_LOGGED_OUT 4 /* closed: logged out, credentials revoked */
#define BOTMESH_SESSION_CLOSED 5     /* closed for another reason (detail says which) */

/* Takes a message in through the transport's session: the same arguments and return
 * codes as botmesh_bot_deliver. */
botmesh_status botmesh_session_deliver(const botmesh_session *session, const char *chat,
                                       const char *message_id, const char *text,
                                       botmesh_error *err);
/* Reports the session's state (one of the session states above; detail may be NULL,
 * a short text for BOTMESH_SESSION_CLOSED, no secrets). Report OPEN once messages flow: a
 * leader whose transport has not been open for providerDownMs steps down. Never
 * blocks. BOTMESH_INVALID for an unknown code. */
botmesh_status botmesh_session_report(const botmesh_session *session, int status,
                                      const char *detail, botmesh_error *err);
/* The fencing token of this leadership: at least 1, greater than every earlier
 * leader's of this transport; present it to the platform where it can refuse older
 * ones. 0 when the transport does not run under a leadership (shared mode). */
uint64_t botmesh_session_fencing_token(const botmesh_session *session);

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
