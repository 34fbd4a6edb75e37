/* The sandbox records' scripts (common/sf_records.c) against the e2e stack's real Redis:
 * each is called by SHA with every key it touches declared, and does what the worker and
 * the scheduler rely on: started, touch, set, mark_killing, retire (reservations given
 * back once, tombstones bounded per team, old ones deleted), also after Redis lost its
 * scripts (SCRIPT FLUSH). Its own team and host names, so the stack's sandboxes are not
 * touched. Runs against the e2e stack (SF_E2E_STATE/env). */
#include "sf_records.h"
#include "sf_util.h"

#include <errno.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                               \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static char url[1024], team[64], host[64];
static struct event_base *base;
static sf_redis *ar;
static redisContext *sc;

static void read_env(void)
{
    char path[4096], line[1024];
    const char *state = getenv("SF_E2E_STATE");
    FILE *f;

    CHECK(state, "SF_E2E_STATE is not set (run through ctest)");
    snprintf(path, sizeof(path), "%s/env", state);
    CHECK((f = fopen(path, "r")), "cannot open %s", path);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "SF_REDIS_URL=", 13)) {
            snprintf(url, sizeof(url), "%s", line + 13);
            url[strcspn(url, "\n")] = 0;
        }
    fclose(f);
    CHECK(url[0], "no SF_REDIS_URL in %s", path);
}

/* The async reply of one call: its type and integer. */
typedef struct answer {
    int done, type;
    long long integer;
} answer;

static void on_answer(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    answer *a = priv;

    a->done = 1;
    a->type = rep ? rep->type : -1;
    a->integer = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -999;
    if (rep && rep->type == REDIS_REPLY_ERROR)
        fprintf(stderr, "redis error: %s\n", rep->str);
}

static void wait_for(answer *a)
{
    int64_t until = sf_mono_ms() + 10000;

    while (!a->done && sf_mono_ms() < until)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK), usleep(1000);
    CHECK(a->done, "no answer within 10 s");
}

/* Lets the fire-and-forget deletes of old tombstones land. */
static void settle(void)
{
    int64_t until = sf_mono_ms() + 300;

    while (sf_mono_ms() < until)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK), usleep(1000);
}

static char *get(const char *fmt, ...)
{
    static char out[4][512];
    static int slot;
    char *o = out[slot++ % 4];
    va_list ap;
    redisReply *rep;

    va_start(ap, fmt);
    rep = redisvCommand(sc, fmt, ap);
    va_end(ap);
    CHECK(rep, "redis connection lost");
    if (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)
        snprintf(o, 512, "%s", rep->str);
    else if (rep->type == REDIS_REPLY_INTEGER)
        snprintf(o, 512, "%lld", rep->integer);
    else
        o[0] = '\0';
    freeReplyObject(rep);
    return o;
}

/* A record as placement writes it: creating, on host, with its reservations. */
static void placed(const char *id)
{
    freeReplyObject(redisCommand(sc, "HSET sf:sb:{%s} id %s team %s host %s state creating "
                                     "metadata {\"k\":\"v\"} res_team 1 res_mem_mib 64 "
                                     "res_vcpu_milli 100", id, id, team, host));
    freeReplyObject(redisCommand(sc, "HINCRBY sf:team:{%s}:res n 1", team));
    freeReplyObject(redisCommand(sc, "HINCRBY sf:team:{%s}:res mem 64", team));
    freeReplyObject(redisCommand(sc, "HINCRBY sf:team:{%s}:res n@%s 1", team, host));
    freeReplyObject(redisCommand(sc, "HINCRBY sf:host:{%s} res_count 1", host));
    freeReplyObject(redisCommand(sc, "HINCRBY sf:host:{%s} res_mem_mib 64", host));
    freeReplyObject(redisCommand(sc, "SADD sf:team:{%s}:sandboxes %s", team, id));
    freeReplyObject(redisCommand(sc, "SADD sf:host:{%s}:sandboxes %s", host, id));
}

static void test_lifecycle(void)
{
    char id[64];
    const char *kv[] = {"driver", "jail", "memory_mib", "64"};
    const char *md[] = {"metadata", "{\"k\":\"w\"}"};
    answer a;

    snprintf(id, sizeof(id), "sb_rectest%d", (int)getpid());
    placed(id);

    a = (answer){0};
    CHECK(sf_records_started(ar, id, host, 4, kv, on_answer, &a) == 0, "started");
    wait_for(&a);
    CHECK(a.integer == 1, "started: %lld", a.integer);
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", id), "running"), "state after started");
    CHECK(!strcmp(get("HGET sf:sb:{%s} driver", id), "jail"), "fields after started");

    freeReplyObject(redisCommand(sc, "SCRIPT FLUSH")); /* Redis lost its scripts: they load again */
    a = (answer){0};
    CHECK(sf_records_touch(ar, id, 12345, on_answer, &a) == 0, "touch");
    wait_for(&a);
    CHECK(a.integer == 1 && !strcmp(get("HGET sf:sb:{%s} last_active", id), "12345"),
          "touch after SCRIPT FLUSH: %lld", a.integer);

    a = (answer){0};
    CHECK(sf_records_set(ar, id, 2, md, on_answer, &a) == 0, "set");
    wait_for(&a);
    CHECK(a.integer == 1 && !strcmp(get("HGET sf:sb:{%s} metadata", id), "{\"k\":\"w\"}"), "set");
    CHECK(sf_records_set(ar, id, 2, (const char *[]){"state", "x"}, on_answer, &a) == -EINVAL,
          "set refuses state");

    a = (answer){0};
    CHECK(sf_records_mark_killing(ar, id, on_answer, &a) == 0, "mark_killing");
    wait_for(&a);
    CHECK(a.integer == 1, "mark_killing: %lld", a.integer);
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", id), "killing"), "state killing");
    CHECK(!strcmp(get("SISMEMBER sf:team:{%s}:sandboxes %s", team, id), "0"), "left its team");
    CHECK(!strcmp(get("HGET sf:team:{%s}:res n", team), ""), "team's reservation given back");
    CHECK(!strcmp(get("HGET sf:host:{%s} res_count", host), "1"), "host's kept until retired");

    freeReplyObject(redisCommand(sc, "ZADD sf:host:{%s}:timers 1 t:%s", host, id));
    a = (answer){0};
    CHECK(sf_records_retire(ar, id, "lost", 1, on_answer, &a) == 0, "retire");
    wait_for(&a);
    CHECK(a.integer == 1, "retire: %lld", a.integer);
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", id), "killed"), "a killing record retires killed");
    CHECK(!strcmp(get("HGET sf:sb:{%s} metadata", id), ""), "tombstone keeps no metadata");
    CHECK(!strcmp(get("SISMEMBER sf:host:{%s}:sandboxes %s", host, id), "0"), "left its host");
    CHECK(!strcmp(get("HGET sf:host:{%s} res_count", host), "0"), "host's reservation back");
    CHECK(atoi(get("TTL sf:sb:{%s}", id)) > 0, "tombstone expires");
    CHECK(!strcmp(get("ZSCORE sf:host:{%s}:timers t:%s", host, id), ""), "its timers went");
    CHECK(strcmp(get("ZSCORE sf:team:{%s}:retired %s", team, id), ""), "listed as retired");

    a = (answer){0}; /* only_live: a dead record stays as it is */
    CHECK(sf_records_retire(ar, id, "lost", 1, on_answer, &a) == 0, "retire again");
    wait_for(&a);
    CHECK(a.integer == 0 && !strcmp(get("HGET sf:sb:{%s} state", id), "killed"), "retire twice");
    CHECK(!strcmp(get("HGET sf:host:{%s} res_count", host), "0"), "released once");

    a = (answer){0}; /* no such record: nothing happens, nothing is created */
    CHECK(sf_records_started(ar, "sb_rectest_none", host, 0, NULL, on_answer, &a) == 0, "none");
    wait_for(&a);
    CHECK(a.integer == 0 && !strcmp(get("EXISTS sf:sb:{sb_rectest_none}"), "0"), "no record");
}

/* More than SF_RETIRED_KEEP tombstones: the oldest go, list and records. */
static void test_tombstones_bounded(void)
{
    char first[64], id[64];
    int n = SF_RETIRED_KEEP + 3;

    for (int i = 0; i < n; i++) {
        answer a = {0};
        snprintf(id, sizeof(id), "sb_rt%d_%d", (int)getpid(), i);
        if (i == 0)
            snprintf(first, sizeof(first), "%s", id);
        placed(id);
        CHECK(sf_records_retire(ar, id, "killed", 0, on_answer, &a) == 0, "retire %d", i);
        wait_for(&a);
        CHECK(a.integer == 1, "retire %d: %lld", i, a.integer);
    }
    settle();
    CHECK(atoi(get("ZCARD sf:team:{%s}:retired", team)) <= SF_RETIRED_KEEP, "tombstones bounded");
    CHECK(!strcmp(get("EXISTS sf:sb:{%s}", first), "0"), "the oldest tombstone's record went");
    CHECK(!strcmp(get("EXISTS sf:sb:{%s}", id), "1"), "the newest stays");
}

int main(void)
{
    char why[256];

    read_env();
    snprintf(team, sizeof(team), "rectest%d", (int)getpid());
    snprintf(host, sizeof(host), "rechost%d", (int)getpid());
    CHECK((base = event_base_new()), "event base");
    CHECK((sc = sf_redis_connect_sync(url, why, sizeof(why))), "sync redis: %s", why);
    CHECK((ar = sf_redis_new(base, url, why, sizeof(why))), "async redis: %s", why);
    for (int64_t until = sf_mono_ms() + 5000; !sf_redis_connected(ar) && sf_mono_ms() < until;)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK), usleep(1000);
    CHECK(sf_redis_connected(ar), "async redis did not connect");
    test_lifecycle();
    test_tombstones_bounded();
    freeReplyObject(redisCommand(sc, "DEL sf:team:{%s}:res sf:team:{%s}:retired "
                                     "sf:team:{%s}:sandboxes sf:host:{%s} sf:host:{%s}:sandboxes "
                                     "sf:host:{%s}:timers",
                                 team, team, team, host, host, host));
    sf_redis_free(ar);
    redisFree(sc);
    event_base_free(base);
    printf("records: 2 passed, 0 failed\n");
    return 0;
}
