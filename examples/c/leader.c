/* A C transport with provider leadership: two replicas (bots) sharing one in-process
 * coordinator both register the exclusive transport "phone"; only the leader's is
 * started. Messages come in through the leader's session and are answered through its
 * send; the leader is stopped and the standby takes over with a greater fencing token.
 * Also prints the Prometheus metrics text and checks the errors of bad input.
 * Exit status 0 when all checks hold. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "botmesh.h"

#define REPLICAS 2
#define MESSAGES 10

/* One replica's transport: what its callbacks saw. */
struct phone {
    int index;
    botmesh_session *session; /* between start and stop */
    uint64_t token;
    int starts, stops, sent;
};

/* One replica's bot, for its handler. */
struct replica {
    botmesh_bot *bot;
    int stop_from_handler; /* status of botmesh_bot_stop called inside the handler */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static struct phone phones[REPLICAS];
static struct replica replicas[REPLICAS];
static int failures;

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAILED: %s\n", what);
        failures++;
    }
}

/* Waits until pred() holds (checked under the lock at every change), at most 10 s. */
static int wait_for(int (*pred)(void)) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    pthread_mutex_lock(&lock);
    int rc = 0;
    while (!pred() && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&changed, &lock, &deadline);
    int ok = pred();
    pthread_mutex_unlock(&lock);
    return ok;
}

static int total_starts(void) {
    int n = 0;
    for (int i = 0; i < REPLICAS; i++) n += phones[i].starts;
    return n;
}
static int one_started(void) { return total_starts() >= 1; }
static int two_started(void) { return total_starts() >= 2; }
static int total_sent(void) {
    int n = 0;
    for (int i = 0; i < REPLICAS; i++) n += phones[i].sent;
    return n;
}
static int all_answered(void) { return total_sent() >= MESSAGES; }
static int last_answered(void) { return total_sent() >= MESSAGES + 1; }

/* Runs on the leadership thread: a real transport would connect on its own thread. */
static int phone_start(botmesh_session *session, void *user_data) {
    struct phone *p = user_data;
    uint64_t token = botmesh_session_fencing_token(session);
    botmesh_session_report(session, BOTMESH_SESSION_OPEN, NULL, NULL);
    pthread_mutex_lock(&lock);
    p->session = session;
    p->token = token;
    p->starts++;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    printf("replica %d leads \"phone\" with token %llu\n", p->index, (unsigned long long)token);
    return 0;
}

static void phone_stop(void *user_data) {
    struct phone *p = user_data;
    pthread_mutex_lock(&lock);
    p->session = NULL;
    p->stops++;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

/* Runs on the worker threads. */
static int phone_send(const char *chat, const char *text, void *user_data) {
    struct phone *p = user_data;
    (void)chat;
    (void)text;
    pthread_mutex_lock(&lock);
    p->sent++;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    return 0;
}

static int handle(const botmesh_context *ctx, void *user_data) {
    struct replica *r = user_data;
    if (strcmp(botmesh_context_text(ctx), "stop yourself") == 0) {
        /* Refused: the stop would wait for this very handler. */
        r->stop_from_handler = botmesh_bot_stop(r->bot, NULL);
    }
    char reply[128];
    snprintf(reply, sizeof reply, "echo: %s", botmesh_context_text(ctx));
    return botmesh_context_reply(ctx, reply, NULL) == BOTMESH_OK ? 0 : 1;
}

static int failing_start(botmesh_session *session, void *user_data) {
    (void)session;
    (void)user_data;
    return 1;
}

static int leader_index(void) {
    int leader = -1;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < REPLICAS; i++)
        if (phones[i].session != NULL) leader = i;
    pthread_mutex_unlock(&lock);
    return leader;
}

static int gauge(botmesh_bot *bot, const char *line) {
    char *text = NULL;
    size_t len = 0;
    botmesh_error *err = botmesh_error_new();
    int found = 0;
    if (botmesh_bot_metrics_text(bot, &text, &len, err) == BOTMESH_OK) {
        found = strstr(text, line) != NULL && strlen(text) == len;
    } else {
        fprintf(stderr, "metrics: %s\n", botmesh_error_message(err));
    }
    botmesh_string_free(text);
    botmesh_error_free(err);
    return found;
}

int main(void) {
    botmesh_error *err = botmesh_error_new();
    botmesh_config *config = botmesh_config_new("{\"coordinator\": {\"memory\": {}}}", err);
    if (config == NULL) {
        fprintf(stderr, "config: %s\n", botmesh_error_message(err));
        return 2;
    }
    botmesh_provider phone = {phone_start, phone_stop, phone_send};

    /* Bad input: clear errors. */
    botmesh_builder *bad = botmesh_builder_new("bad", 1, config, handle, NULL, NULL, NULL, err);
    botmesh_provider no_start = {NULL, phone_stop, NULL};
    check(botmesh_builder_add_provider(bad, "phone", 1, &no_start, NULL, err) == BOTMESH_INVALID &&
              strstr(botmesh_error_message(err), "start") != NULL,
          "a transport without start is refused, naming start");
    check(botmesh_builder_add_provider(bad, "", 1, &phone, NULL, err) == BOTMESH_INVALID,
          "an empty provider id is refused");
    botmesh_builder_free(bad);
    /* A shared-mode transport (no coordination) whose start fails fails the build. */
    botmesh_builder *alone = botmesh_builder_new("alone", 1, NULL, handle, NULL, NULL, NULL, err);
    botmesh_provider broken = {failing_start, phone_stop, NULL};
    botmesh_builder_add_provider(alone, "broken", 0, &broken, NULL, err);
    check(botmesh_builder_build(alone, err) == NULL && botmesh_error_status(err) == BOTMESH_PROVIDER,
          "a failed shared-mode start fails the build with BOTMESH_PROVIDER");
    printf("refused as expected: %s\n", botmesh_error_message(err));

    for (int i = 0; i < REPLICAS; i++) {
        char id[16];
        snprintf(id, sizeof id, "replica-%d", i);
        phones[i].index = i;
        botmesh_builder *b = botmesh_builder_new(id, 2, config, handle, NULL, NULL, &replicas[i], err);
        if (b == NULL || botmesh_builder_add_provider(b, "phone", 1, &phone, &phones[i], err) != BOTMESH_OK) {
            fprintf(stderr, "builder: %s\n", botmesh_error_message(err));
            return 2;
        }
        /* The bot pointer is written before any message can reach the handler. */
        replicas[i].bot = botmesh_builder_build(b, err);
        if (replicas[i].bot == NULL) {
            fprintf(stderr, "build: %s\n", botmesh_error_message(err));
            return 2;
        }
    }

    check(wait_for(one_started), "a leader starts its transport");
    int leader = leader_index();
    check(leader >= 0 && total_starts() == 1, "exactly one transport started");
    if (leader < 0) return 1;
    int standby = 1 - leader;
    check(gauge(replicas[leader].bot, "botmesh_leader_election_master_status{name=\"phone\"} 1"),
          "the leader's gauge is 1");
    check(gauge(replicas[standby].bot, "botmesh_leader_election_master_status{name=\"phone\"} 0"),
          "the standby's gauge is 0");
    check(botmesh_session_report(phones[leader].session, 42, NULL, err) == BOTMESH_INVALID,
          "an unknown session state is refused");
    printf("refused as expected: %s\n", botmesh_error_message(err));

    /* The transport delivers (here from the main thread, as a polling thread would). */
    for (int i = 0; i < MESSAGES; i++) {
        char chat[16], id[16], text[32];
        snprintf(chat, sizeof chat, "chat-%d", i % 3);
        snprintf(id, sizeof id, "%d", i);
        if (i == 0)
            snprintf(text, sizeof text, "stop yourself");
        else
            snprintf(text, sizeof text, "msg %d", i);
        check(botmesh_session_deliver(phones[leader].session, chat, id, text, err) == BOTMESH_OK,
              "the leader's session takes messages in");
    }
    check(wait_for(all_answered), "every message is answered through the leader's send");
    check(phones[leader].sent == MESSAGES && phones[standby].sent == 0,
          "replies went through the leader's transport only");
    check(replicas[leader].stop_from_handler == BOTMESH_INVALID,
          "botmesh_bot_stop from a handler is refused");

    /* A clean stop hands the leadership over at once. */
    uint64_t first_token = phones[leader].token;
    check(botmesh_bot_stop(replicas[leader].bot, err) == BOTMESH_OK, "the leader stops");
    check(phones[leader].stops == 1, "the leader's transport was stopped once");
    check(wait_for(two_started), "the standby starts its transport");
    check(phones[standby].starts == 1 && phones[standby].token > first_token,
          "the new leader's token is greater");
    check(botmesh_session_deliver(phones[standby].session, "chat-0", "last", "after failover", err) ==
              BOTMESH_OK,
          "the new leader's session takes messages in");
    check(wait_for(last_answered), "the new leader answers");

    char *text = NULL;
    size_t len = 0;
    if (botmesh_bot_metrics_text(replicas[standby].bot, &text, &len, err) == BOTMESH_OK) {
        /* The first lines and the leader gauge, as a scraper would see them. */
        const char *g = strstr(text, "botmesh_leader_election_master_status{");
        printf("metrics text: %zu bytes; %.*s\n", len, g ? (int)strcspn(g, "\n") : 0, g ? g : "");
    } else {
        check(0, botmesh_error_message(err));
    }
    botmesh_string_free(text);
    check(botmesh_bot_metrics_text(NULL, &text, &len, err) == BOTMESH_INVALID && text == NULL,
          "metrics of a NULL bot are refused");

    for (int i = 0; i < REPLICAS; i++) {
        check(botmesh_bot_stop(replicas[i].bot, err) == BOTMESH_OK, "stop (twice is fine)");
        botmesh_bot_free(replicas[i].bot);
    }
    check(total_starts() == 2 && phones[0].stops + phones[1].stops == 2,
          "every start was followed by one stop");
    botmesh_config_free(config);
    botmesh_error_free(err);
    printf("{\"starts\":%d,\"replies\":%d,\"ok\":%s}\n", total_starts(), total_sent(),
           failures == 0 ? "true" : "false");
    return failures == 0 ? 0 : 1;
}
