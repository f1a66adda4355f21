/* Two replicas (bots) sharing one in-process coordinator echo messages of three
 * chats; checks that every message was answered once, each chat in order, and that
 * bad input gets a clear error. Exit status 0 when all checks hold. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "botmesh.h"

#define CHATS 3
#define PER_CHAT 20

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int next_expected[CHATS];
static int replies;
static int out_of_order;

static int handle(const botmesh_context *ctx, void *user_data) {
    (void)user_data;
    const char *chat = botmesh_context_chat(ctx);
    int c = chat[5] - '0', n = 0;
    sscanf(botmesh_context_text(ctx), "msg %d", &n);
    pthread_mutex_lock(&lock);
    if (n != next_expected[c]) out_of_order++;
    next_expected[c] = n + 1;
    pthread_mutex_unlock(&lock);
    char reply[64];
    snprintf(reply, sizeof reply, "echo %d (token %llu)", n,
             (unsigned long long)botmesh_context_fencing_token(ctx));
    return botmesh_context_reply(ctx, reply, NULL) == BOTMESH_OK ? 0 : 1;
}

static int outcomes[4];

static void on_outcome(const char *chat, const char *message_id, int outcome,
                       const char *detail, void *user_data) {
    (void)chat;
    (void)message_id;
    (void)detail;
    (void)user_data;
    pthread_mutex_lock(&lock);
    if (outcome >= 0 && outcome < 4) outcomes[outcome]++;
    pthread_mutex_unlock(&lock);
}

static int send_text(const char *chat, const char *text, void *user_data) {
    (void)chat;
    (void)text;
    (void)user_data;
    pthread_mutex_lock(&lock);
    replies++;
    pthread_mutex_unlock(&lock);
    return 0;
}

int main(void) {
    int failures = 0;
    botmesh_error *err = botmesh_error_new();

    /* Bad input: the error names the field and the value. */
    botmesh_config *bad = botmesh_config_new("{\"coordinator\": {\"memory\": {}}, \"turnWaitMs\": -5}", err);
    if (bad != NULL || strstr(botmesh_error_message(err), "turnWaitMs") == NULL) {
        fprintf(stderr, "bad config not refused clearly: %s\n", botmesh_error_message(err));
        failures++;
    } else {
        printf("refused as expected: %s\n", botmesh_error_message(err));
    }

    botmesh_config *config = botmesh_config_new("{\"coordinator\": {\"memory\": {}}}", err);
    if (config == NULL) {
        fprintf(stderr, "config: %s\n", botmesh_error_message(err));
        return 2;
    }
    if (botmesh_bot_new("x", 0, config, handle, NULL, NULL, NULL, err) != NULL ||
        botmesh_error_status(err) != BOTMESH_INVALID) {
        fprintf(stderr, "zero workers not refused\n");
        failures++;
    }
    botmesh_bot *a = botmesh_bot_new("replica-a", 2, config, handle, send_text, on_outcome, NULL, err);
    botmesh_bot *b = botmesh_bot_new("replica-b", 2, config, handle, send_text, on_outcome, NULL, err);
    if (a == NULL || b == NULL) {
        fprintf(stderr, "bot: %s\n", botmesh_error_message(err));
        return 2;
    }
    for (int i = 0; i < PER_CHAT; i++) {
        for (int c = 0; c < CHATS; c++) {
            char chat[16], id[16], text[16];
            snprintf(chat, sizeof chat, "chat-%d", c);
            snprintf(id, sizeof id, "%d", i);
            snprintf(text, sizeof text, "msg %d", i);
            /* Like a load balancer: alternate replicas. */
            botmesh_status s = botmesh_bot_deliver((i + c) % 2 ? a : b, chat, id, text, err);
            if (s != BOTMESH_OK) {
                fprintf(stderr, "deliver: %d %s\n", s, botmesh_error_message(err));
                failures++;
            }
        }
    }
    /* A webhook retry of a message already taken in is a duplicate: refused at once
       (BOTMESH_DUPLICATE) once the first was handled, or taken in (BOTMESH_OK) while
       the first is in flight, and then ended with the duplicate outcome. Either way
       exactly one duplicate outcome is counted below. */
    botmesh_status retry = botmesh_bot_deliver(b, "chat-0", "0", "msg 0", err);
    if (retry != BOTMESH_DUPLICATE && retry != BOTMESH_OK) {
        fprintf(stderr, "duplicate not detected: %d\n", retry);
        failures++;
    }
    if (botmesh_bot_deliver(a, NULL, NULL, "x", err) != BOTMESH_INVALID) {
        fprintf(stderr, "NULL chat not refused\n");
        failures++;
    }
    /* Stop, then a late delivery is refused without touching freed memory; then free. */
    if (botmesh_bot_stop(a, err) != BOTMESH_OK || botmesh_bot_stop(b, err) != BOTMESH_OK) {
        fprintf(stderr, "stop: %s\n", botmesh_error_message(err));
        failures++;
    }
    if (botmesh_bot_deliver(a, "chat-0", NULL, "late", err) != BOTMESH_SHUTTING_DOWN) {
        fprintf(stderr, "delivery after stop not refused\n");
        failures++;
    }
    botmesh_bot_free(a);
    botmesh_bot_free(b);
    botmesh_config_free(config);
    botmesh_error_free(err);

    printf("replies=%d expected=%d out_of_order=%d handled=%d duplicates=%d\n", replies,
           CHATS * PER_CHAT, out_of_order, outcomes[BOTMESH_OUTCOME_HANDLED],
           outcomes[BOTMESH_OUTCOME_DUPLICATE]);
    if (replies != CHATS * PER_CHAT || out_of_order != 0 ||
        outcomes[BOTMESH_OUTCOME_HANDLED] != CHATS * PER_CHAT || outcomes[BOTMESH_OUTCOME_DUPLICATE] != 1)
        failures++;
    printf("{\"replies\":%d,\"out_of_order\":%d,\"ok\":%s}\n", replies, out_of_order,
           failures == 0 ? "true" : "false");
    return failures == 0 ? 0 : 1;
}
