/* Every Lua script of the store (state/sf_store.c, state/lua/) against a real Redis: each starts
 * with "#!lua" (so a cluster refuses any key of another slot), its SHA1 is the one Redis
 * computes, and each does what its callers rely on, called by SHA with its keys declared,
 * also after Redis lost its scripts (SCRIPT FLUSH before each group): the records'
 * writes (started, touch, set, mark_killing, retire with reservations given back once and
 * tombstones bounded), the host sweeps (a worker's start-up, the reaper: its sandboxes lost,
 * its template builds failed), placement's
 * steps, heartbeats, timers, claim checks, secrets, API keys (a create and a revoke are one script each: all of a key or nothing,
 * the revoke tells the gateways), sessions, team templates (create,
 * row, delete), snapshots (through sf_snapshots.c) and the job guard; on a cluster of several
 * masters (the engines label) a slot moved under both clients: MOVED and ASK followed. Its own team and host names, so the stack's sandboxes are not touched. Runs
 * against the stack in SF_E2E_STATE (the e2e stack, and the cluster suite's one-node
 * Redis Cluster, where a key of another slot is an error). */
#include "check.h"
#include "sf_apikeys.h"
#include "sf_auth.h"
#include "sf_claim.h"
#include "sf_records.h"
#include "sf_secrets.h"
#include "sf_snapshots.h"
#include "sf_store.h"
#include "sf_timers.h"
#include "sf_util.h"

#include <errno.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char url[1024], team[32], host[32];
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

/* The async reply of one call: its type and integer, or its first two strings. */
typedef struct answer {
    int done, type;
    long long integer;
    size_t elements;
    char s0[256], s1[256];
} answer;

static void on_answer(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    answer *a = priv;

    a->done = 1;
    a->type = rep ? rep->type : -1;
    a->integer = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -999;
    if (rep && rep->type == REDIS_REPLY_STRING)
        snprintf(a->s0, sizeof(a->s0), "%s", rep->str);
    if (rep && rep->type == REDIS_REPLY_ARRAY) {
        a->elements = rep->elements;
        for (size_t i = 0; i < rep->elements && i < 2; i++)
            if (rep->element[i]->type == REDIS_REPLY_STRING)
                snprintf(i ? a->s1 : a->s0, sizeof(a->s0), "%s", rep->element[i]->str);
    }
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
    rep = sf_redis_sync_vcmd(sc, fmt, ap);
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

/* Runs script s by SHA on the blocking connection: nkeys keys, then args (NULL ends). */
static redisReply *run(sf_redis_script *s, int nkeys, ...)
{
    const char *argv[32];
    int n = 0;
    va_list ap;
    redisReply *rep;

    va_start(ap, nkeys);
    while (n < 32 && (argv[n] = va_arg(ap, const char *)))
        n++;
    va_end(ap);
    rep = sf_redis_script_sync(sc, s, nkeys, n - nkeys, argv, NULL);
    CHECK(rep, "redis connection lost");
    CHECK(rep->type != REDIS_REPLY_ERROR, "script error: %s", rep->str);
    return rep;
}

/* The reply's element i as text ("" when absent; integers printed). */
static const char *el(const redisReply *rep, size_t i)
{
    static char out[4][256];
    static int slot;
    char *o = out[slot++ % 4];

    o[0] = '\0';
    if (rep->type == REDIS_REPLY_ARRAY && i < rep->elements) {
        if (rep->element[i]->type == REDIS_REPLY_STRING)
            snprintf(o, 256, "%s", rep->element[i]->str);
        else if (rep->element[i]->type == REDIS_REPLY_INTEGER)
            snprintf(o, 256, "%lld", rep->element[i]->integer);
    }
    return o;
}

static void flush_scripts(void)
{
    { /* Redis lost its scripts (every master of a cluster): they load again */
        redisContext *m[16];
        int n = sf_redis_sync_masters(sc, m, 16);
        CHECK(n > 0, "the masters: %d", n);
        for (int i = 0; i < n; i++)
            freeReplyObject(redisCommand(m[i], "SCRIPT FLUSH"));
    }
}

static void call_done(answer *a, int rc, const char *what)
{
    CHECK(rc == 0, "%s: rc %d", what, rc);
    wait_for(a);
}

/* Every script: a "#!lua" line first (a cluster then refuses any key of another slot,
 * declared or not), and the SHA1 we call it by is the one Redis computes. */
static int test_all_scripts(void)
{
    int n = 0;

    for (sf_redis_script *const *s = sf_store_all; *s; s++, n++) {
        redisReply *rep = sf_redis_sync_cmd(sc, "SCRIPT LOAD %s", (*s)->src);
        CHECK(!strncmp((*s)->src, "#!lua", 5), "script %d has no #!lua line", n);
        CHECK(rep && rep->type == REDIS_REPLY_STRING, "SCRIPT LOAD %d failed: %s", n,
              rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        CHECK(!strcmp(rep->str, sf_redis_script_sha(*s)), "script %d: sha %s, Redis says %s", n,
              sf_redis_script_sha(*s), rep->str);
        freeReplyObject(rep);
    }
    CHECK(n >= 30, "only %d scripts listed", n);
    return n;
}

/* A record as placement leaves it: creating, on host, with its reservations (the team's
 * and the host's, each under the sandbox id). */
static void placed_on(const char *id, const char *h, const char *state)
{
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET sf:sb:{%s} id %s team %s host %s state %s "
                                     "metadata {\"k\":\"v\"} res_mem_mib 64 res_vcpu_milli 100",
                                 id, id, team, h, state));
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET sf:team:{%s}:res %s %s", team, id, "x 64 100 -"));
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET sf:host:{%s}:res %s %s", h, id, "64 100"));
    freeReplyObject(sf_redis_sync_cmd(sc, "SADD sf:team:{%s}:sandboxes %s", team, id));
    freeReplyObject(sf_redis_sync_cmd(sc, "SADD sf:host:{%s}:sandboxes %s", h, id));
}

static void placed(const char *id)
{
    placed_on(id, host, "creating");
}

static void test_lifecycle(void)
{
    char id[64];
    const char *kv[] = {"driver", "jail", "memory_mib", "64"};
    const char *md[] = {"metadata", "{\"k\":\"w\"}"};
    answer a;

    snprintf(id, sizeof(id), "sb_rectest%d", (int)getpid());
    placed(id);
    flush_scripts();

    a = (answer){0};
    call_done(&a, sf_records_started(ar, id, host, 4, kv, on_answer, &a), "started");
    CHECK(a.integer == 1, "started: %lld", a.integer);
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", id), "running"), "state after started");
    CHECK(!strcmp(get("HGET sf:sb:{%s} driver", id), "jail"), "fields after started");
    a = (answer){0}; /* another host's worker never starts it */
    call_done(&a, sf_records_started(ar, id, "otherhost", 0, NULL, on_answer, &a), "started");
    CHECK(a.integer == 0, "started elsewhere: %lld", a.integer);

    flush_scripts();
    a = (answer){0};
    call_done(&a, sf_records_touch(ar, id, 12345, on_answer, &a), "touch");
    CHECK(a.integer == 1 && !strcmp(get("HGET sf:sb:{%s} last_active", id), "12345"),
          "touch after SCRIPT FLUSH: %lld", a.integer);

    a = (answer){0};
    call_done(&a, sf_records_set(ar, id, 2, md, on_answer, &a), "set");
    CHECK(a.integer == 1 && !strcmp(get("HGET sf:sb:{%s} metadata", id), "{\"k\":\"w\"}"), "set");
    CHECK(sf_records_set(ar, id, 2, (const char *[]){"state", "x"}, on_answer, &a) == -EINVAL,
          "set refuses state");

    a = (answer){0};
    call_done(&a, sf_records_mark_killing(ar, id, on_answer, &a), "mark_killing");
    CHECK(a.integer == 1, "mark_killing: %lld", a.integer);
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", id), "killing"), "state killing");
    CHECK(!strcmp(get("SISMEMBER sf:team:{%s}:sandboxes %s", team, id), "0"), "left its team");
    CHECK(!strcmp(get("HEXISTS sf:team:{%s}:res %s", team, id), "0"), "team's part given back");
    CHECK(!strcmp(get("HEXISTS sf:host:{%s}:res %s", host, id), "1"), "host's kept until retired");

    freeReplyObject(sf_redis_sync_cmd(sc, "ZADD sf:host:{%s}:timers 1 t:%s", host, id));
    a = (answer){0};
    call_done(&a, sf_records_retire(ar, id, "lost", 1, on_answer, &a), "retire");
    CHECK(a.integer == 1, "retire: %lld", a.integer);
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", id), "killed"), "a killing record retires killed");
    CHECK(!strcmp(get("HGET sf:sb:{%s} metadata", id), ""), "tombstone keeps no metadata");
    CHECK(!strcmp(get("SISMEMBER sf:host:{%s}:sandboxes %s", host, id), "0"), "left its host");
    CHECK(!strcmp(get("HEXISTS sf:host:{%s}:res %s", host, id), "0"), "host's part given back");
    CHECK(atoi(get("TTL sf:sb:{%s}", id)) > 0, "tombstone expires");
    CHECK(!strcmp(get("ZSCORE sf:host:{%s}:timers t:%s", host, id), ""), "its timers went");
    CHECK(strcmp(get("ZSCORE sf:team:{%s}:retired %s", team, id), ""), "listed as retired");

    /* a retire cut short after the record's step: retiring again completes it */
    freeReplyObject(sf_redis_sync_cmd(sc, "SADD sf:host:{%s}:sandboxes %s", host, id));
    a = (answer){0}; /* only_live: a dead record stays as it is */
    call_done(&a, sf_records_retire(ar, id, "lost", 1, on_answer, &a), "retire again");
    CHECK(a.integer == 0 && !strcmp(get("HGET sf:sb:{%s} state", id), "killed"), "retire twice");
    CHECK(!strcmp(get("SISMEMBER sf:host:{%s}:sandboxes %s", host, id), "0"), "healed");

    a = (answer){0}; /* no such record: nothing happens, nothing is created */
    call_done(&a, sf_records_started(ar, "sb_rectest_none", host, 0, NULL, on_answer, &a), "none");
    CHECK(a.integer == 0 && !strcmp(get("EXISTS sf:sb:{sb_rectest_none}"), "0"), "no record");
    a = (answer){0};
    call_done(&a, sf_records_retire(ar, "sb_rectest_none", "lost", 0, on_answer, &a), "none");
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
        call_done(&a, sf_records_retire(ar, id, "killed", 0, on_answer, &a), "retire");
        CHECK(a.integer == 1, "retire %d: %lld", i, a.integer);
    }
    settle();
    CHECK(atoi(get("ZCARD sf:team:{%s}:retired", team)) <= SF_RETIRED_KEEP, "tombstones bounded");
    CHECK(!strcmp(get("EXISTS sf:sb:{%s}", first), "0"), "the oldest tombstone's record went");
    CHECK(!strcmp(get("EXISTS sf:sb:{%s}", id), "1"), "the newest stays");
    CHECK(!strcmp(get("HLEN sf:host:{%s}:res", host), "0"), "every reservation given back");
}

/* A worker's start-up (its sandboxes lost, creating ones kept) and the reaper. */
static void test_sweeps(void)
{
    char h[64], run_id[64], cre_id[64];
    long long n = -1;
    answer a = {0};

    snprintf(h, sizeof(h), "sweephost%d", (int)getpid());
    snprintf(run_id, sizeof(run_id), "sb_swr%d", (int)getpid());
    snprintf(cre_id, sizeof(cre_id), "sb_swc%d", (int)getpid());
    placed_on(run_id, h, "running");
    placed_on(cre_id, h, "creating");
    flush_scripts();
    CHECK(sf_records_retire_host_sync(sc, h, &n) == 0 && n == 1, "retire_host: %lld", n);
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", run_id), "lost"), "running -> lost");
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", cre_id), "creating"), "creating kept");
    CHECK(!strcmp(get("SMEMBERS sf:host:{%s}:sandboxes", h), ""), "set holds the creating one");
    CHECK(!strcmp(get("SISMEMBER sf:host:{%s}:sandboxes %s", h, cre_id), "1"), "creating listed");
    CHECK(!strcmp(get("HEXISTS sf:host:{%s}:res %s", h, run_id), "0"), "lost one released");

    /* two templates building there (one also ready elsewhere), listed by the host */
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET sf:team:{%s}:tpl:tb1 status building at:%s building "
                                     "at:elsewhere ready", team, h));
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET sf:team:{%s}:tpl:tb2 status building at:%s building",
                                 team, h));
    freeReplyObject(sf_redis_sync_cmd(sc, "SADD sf:host:{%s}:tpls %s%s %s%s", h, team, " tb1", team,
                                 " tb2"));
    /* silent for an hour: the reaper removes the host; its creating sandbox is lost too */
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET sf:host:{%s} capacity 1", h));
    freeReplyObject(sf_redis_sync_cmd(sc, "ZADD sf:hosts %lld %s", (long long)(sf_now_ms() - 3600000), h));
    flush_scripts();
    call_done(&a, sf_records_reap(ar, sf_now_ms(), 60000, on_answer, &a), "reap");
    CHECK(a.type == REDIS_REPLY_INTEGER, "reap reply type %d", a.type);
    for (int64_t until = sf_mono_ms() + 10000; sf_mono_ms() < until &&
         (strcmp(get("HGET sf:sb:{%s} state", cre_id), "lost") ||
          strcmp(get("EXISTS sf:host:{%s}", h), "0"));)
        settle(); /* (the scheduler's own reaper may be the one that got it) */
    CHECK(!strcmp(get("HGET sf:sb:{%s} state", cre_id), "lost"), "reaped: lost");
    CHECK(!strcmp(get("ZSCORE sf:hosts %s", h), ""), "the host left sf:hosts");
    CHECK(!strcmp(get("EXISTS sf:host:{%s}", h), "0"), "its hash went");
    CHECK(!strcmp(get("EXISTS sf:host:{%s}:sandboxes", h), "0"), "its set went");
    CHECK(!strcmp(get("EXISTS sf:host:{%s}:res", h), "0"), "its reservations went");
    for (int64_t until = sf_mono_ms() + 10000; sf_mono_ms() < until &&
         strcmp(get("EXISTS sf:host:{%s}:tpls", h), "0");)
        settle();
    CHECK(!strcmp(get("EXISTS sf:host:{%s}:tpls", h), "0"), "its templates' list went");
    CHECK(!strcmp(get("HGET sf:team:{%s}:tpl:tb1 at:%s", team, h), "failed") &&
          strstr(get("HGET sf:team:{%s}:tpl:tb1 err:%s", team, h), "went down while it built") &&
          !strcmp(get("HGET sf:team:{%s}:tpl:tb1 status", team), "ready"),
          "a build lost with its host, ready elsewhere: %s",
          get("HGET sf:team:{%s}:tpl:tb1 status", team));
    CHECK(!strcmp(get("HGET sf:team:{%s}:tpl:tb2 status", team), "failed") &&
          strstr(get("HGET sf:team:{%s}:tpl:tb2 error", team), "went down"),
          "built only there: failed, with why");
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL sf:team:{%s}:tpl:tb1 sf:team:{%s}:tpl:tb2", team, team));
}

/* The heartbeat and placement's steps (host view, team, host, record). */
static void test_placement(void)
{
    char h[64], now[24], old[24], k[6][160], id[3][64], err[128];
    char hosts[512];
    const char *kv[] = {"capacity", "2", "running", "0", "mem_mib", "256", "vcpu_milli", "1000",
                        "driver", "jail", "caps", "layers builds debian", "ts", now};
    redisReply *r;

    snprintf(h, sizeof(h), "plhost%d", (int)getpid());
    for (int i = 0; i < 3; i++)
        snprintf(id[i], sizeof(id[i]), "sb_pl%d_%d", (int)getpid(), i);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(old, sizeof(old), "%lld", (long long)sf_now_ms() - 3600000);
    flush_scripts();
    CHECK(sf_records_heartbeat_sync(sc, h, sf_now_ms(), 60000, SF_ARRAY_LEN(kv), kv, err,
                                    sizeof(err)) == 0, "heartbeat: %s", err);
    CHECK(strcmp(get("ZSCORE sf:hosts %s", h), ""), "the host is live");
    CHECK(!strcmp(get("HGET sf:host:{%s} capacity", h), "2") && atoi(get("PTTL sf:host:{%s}", h)) > 0,
          "the host's hash, expiring");
    CHECK(sf_records_heartbeat_sync(sc, h, 1, 1, 2, (const char *[]){"res_x", "1"}, err,
                                    sizeof(err)) == -EINVAL, "a worker never writes res_*");

    snprintf(k[0], sizeof(k[0]), "sf:host:{%s}", h);
    snprintf(k[1], sizeof(k[1]), "sf:host:{%s}:res", h);
    snprintf(k[2], sizeof(k[2]), "sf:host:{%s}:sandboxes", h);
    r = run(&sf_store_host_view, 2, k[0], k[1], NULL);
    CHECK(r->elements == 12 && !strcmp(el(r, 0), "2") && !strcmp(el(r, 5), "jail") &&
          !strcmp(el(r, 7), "0") && !strcmp(el(r, 11), "layers builds debian"),
          "host view (caps last)");
    freeReplyObject(r);

    /* the team's step: limits, the host, the team's part */
    snprintf(k[3], sizeof(k[3]), "sf:team:{%s}:limits", team);
    snprintf(k[4], sizeof(k[4]), "sf:team:{%s}:sandboxes", team);
    snprintf(k[5], sizeof(k[5]), "sf:team:{%s}:res", team);
    snprintf(hosts, sizeof(hosts), "[{\"h\":\"%s\",\"cap\":2,\"used\":0,\"mem\":256,\"vcpu\":1000,"
             "\"rmem\":0,\"rvcpu\":0,\"deb\":false,\"driver\":\"jail\",\"caps\":{\"layers\":true,"
             "\"builds\":true,\"debian\":true,\"snapshot_processes\":false}}]", h);
    {
        char tk[128];
        snprintf(tk, sizeof(tk), "sf:team:{%s}:tpl:base", team);
        r = run(&sf_store_place_team, 4, k[3], k[4], k[5], tk, id[0], "base", "8", "100", "100",
                "64", "100", hosts, "[]", NULL);
        CHECK(!strcmp(el(r, 0), "ok") && !strcmp(el(r, 1), h) && !strcmp(el(r, 5), "1"),
              "team step: %s %s", el(r, 0), el(r, 1));
        freeReplyObject(r);
        r = run(&sf_store_place_team, 4, k[3], k[4], k[5], tk, id[0], "base", "8", "100", "100",
                "64", "100", hosts, "[]", NULL);
        CHECK(!strcmp(el(r, 0), "ok") && !strcmp(el(r, 5), "0"), "the same id again: held");
        freeReplyObject(r);
        r = run(&sf_store_place_team, 4, k[3], k[4], k[5], tk, id[1], "base", "1", "100", "100",
                "64", "100", hosts, "[]", NULL);
        CHECK(!strcmp(el(r, 0), "quota") && !strcmp(el(r, 1), "1"), "quota: %s", el(r, 0));
        freeReplyObject(r);
        r = run(&sf_store_place_team, 4, k[3], k[4], k[5], tk, id[1], "base", "8", "100", "100",
                "64", "100", "[]", "[]", NULL);
        CHECK(!strcmp(el(r, 0), "nohost"), "no host: %s", el(r, 0));
        freeReplyObject(r);
        {
            char skip[96];
            snprintf(skip, sizeof(skip), "[\"%s\"]", h);
            r = run(&sf_store_place_team, 4, k[3], k[4], k[5], tk, id[1], "base", "8", "100",
                    "100", "64", "100", hosts, skip, NULL);
            CHECK(!strcmp(el(r, 0), "full"), "the only host refused it: %s", el(r, 0));
            freeReplyObject(r);
        }
        snprintf(tk, sizeof(tk), "sf:team:{%s}:tpl:nope", team);
        r = run(&sf_store_place_team, 4, k[3], k[4], k[5], tk, id[1], "nope", "8", "100", "100",
                "64", "100", hosts, "[]", NULL);
        CHECK(!strcmp(el(r, 0), "notemplate"), "no template: %s", el(r, 0));
        freeReplyObject(r);
        /* 'debian' goes by capability: a host whose driver does not run it (caps without
         * debian: a worker from before caps on qemu) is never chosen, whatever its
         * tpl_debian; one that runs it but has it not yet is 'nodebian' (placement waits
         * while it builds) */
        {
            char qh[2][320];
            for (int i = 0; i < 2; i++)
                snprintf(qh[i], sizeof(qh[i]), "[{\"h\":\"%s\",\"cap\":2,\"used\":0,"
                         "\"mem\":256,\"vcpu\":1000,\"rmem\":0,\"rvcpu\":0,\"deb\":%s,"
                         "\"driver\":\"qemu\",\"caps\":{\"debian\":%s}}]", h,
                         i ? "false" : "true", i ? "true" : "false");
            snprintf(tk, sizeof(tk), "sf:team:{%s}:tpl:debian", team);
            r = run(&sf_store_place_team, 4, k[3], k[4], k[5], tk, id[1], "debian", "8", "100",
                    "100", "64", "100", qh[0], "[]", NULL);
            CHECK(!strcmp(el(r, 0), "nodebhost"), "debian, no host runs it: %s", el(r, 0));
            freeReplyObject(r);
            r = run(&sf_store_place_team, 4, k[3], k[4], k[5], tk, id[1], "debian", "8", "100",
                    "100", "64", "100", qh[1], "[]", NULL);
            CHECK(!strcmp(el(r, 0), "nodebian"), "debian, not there yet: %s", el(r, 0));
            freeReplyObject(r);
        }
    }

    /* the host's step: re-checks room and liveness */
    for (int i = 0; i < 3; i++) {
        r = run(&sf_store_place_host, 3, k[0], k[1], k[2], id[i], "64", "100", now, "60000", NULL);
        CHECK(!strcmp(el(r, 0), i < 2 ? "ok" : "again"), "host step %d: %s", i, el(r, 0));
        freeReplyObject(r);
    }
    r = run(&sf_store_place_host, 3, k[0], k[1], k[2], id[0], "64", "100", now, "60000", NULL);
    CHECK(!strcmp(el(r, 0), "ok") && !strcmp(el(r, 1), "0"), "held already");
    freeReplyObject(r);
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET sf:host:{%s} ts %s", h, old));
    freeReplyObject(sf_redis_sync_cmd(sc, "HDEL sf:host:{%s}:res %s", h, id[1]));
    r = run(&sf_store_place_host, 3, k[0], k[1], k[2], id[1], "64", "100", now, "60000", NULL);
    CHECK(!strcmp(el(r, 0), "again"), "a silent host: again");
    freeReplyObject(r);
    r = run(&sf_store_host_view, 2, k[0], k[1], NULL);
    CHECK(!strcmp(el(r, 7), "1") && !strcmp(el(r, 8), "64") && !strcmp(el(r, 9), "100"),
          "view counts the reservation");
    freeReplyObject(r);

    /* the record */
    {
        char rk[128];
        snprintf(rk, sizeof(rk), "sf:sb:{%s}", id[0]);
        r = run(&sf_store_place_record, 1, rk, id[0], team, h, "n", "base", "{}", now, "0", "64",
                "100", NULL);
        CHECK(!strcmp(el(r, 0), "ok") && !strcmp(el(r, 1), h), "record written");
        freeReplyObject(r);
        CHECK(!strcmp(get("HGET %s state", rk), "creating"), "creating");
        r = run(&sf_store_place_record, 1, rk, id[0], team, "elsewhere", "n", "base", "{}", now,
                "0", "64", "100", NULL);
        CHECK(!strcmp(el(r, 0), "ok") && !strcmp(el(r, 1), h), "redelivered: its host");
        freeReplyObject(r);
        r = run(&sf_store_place_record, 1, rk, id[0], "otherteam", h, "n", "base", "{}", now,
                "0", "64", "100", NULL);
        CHECK(!strcmp(el(r, 0), "conflict"), "another team's id: conflict");
        freeReplyObject(r);
    }
    /* (clean up: its retire gives both parts back) */
    {
        answer a = {0};
        call_done(&a, sf_records_retire(ar, id[0], "killed", 0, on_answer, &a), "retire");
        CHECK(!strcmp(get("HEXISTS sf:team:{%s}:res %s", team, id[0]), "0") &&
              !strcmp(get("HEXISTS sf:host:{%s}:res %s", h, id[0]), "0"), "released");
    }
    r = run(&sf_store_hosts_drop, 1, "sf:hosts", h, old, NULL);
    CHECK(r->type == REDIS_REPLY_INTEGER && r->integer == 0, "hosts_drop: a live host stays");
    freeReplyObject(r);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms() + 1000);
    r = run(&sf_store_hosts_drop, 1, "sf:hosts", h, now, NULL);
    CHECK(r->type == REDIS_REPLY_INTEGER && r->integer == 1, "hosts_drop: older than the cutoff");
    freeReplyObject(r);
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL sf:host:{%s} sf:host:{%s}:res sf:host:{%s}:sandboxes",
                                 h, h, h));
}

static void test_timers(void)
{
    char id[64], h[64];
    int64_t now = sf_now_ms();
    answer a = {0};

    snprintf(id, sizeof(id), "sb_tm%d", (int)getpid());
    snprintf(h, sizeof(h), "tmhost%d", (int)getpid());
    placed_on(id, h, "running");
    flush_scripts();
    call_done(&a, sf_timers_start(ar, id, h, now, now + 60000, now + 90000, 5000, 0, on_answer, &a),
              "start");
    CHECK(a.integer == 1, "start: %lld", a.integer);
    CHECK(atoll(get("ZSCORE sf:host:{%s}:timers t:%s", h, id)) == now + 60000, "t: set");
    CHECK(atoll(get("ZSCORE sf:host:{%s}:timers i:%s", h, id)) == now + 5000, "i: set");
    CHECK(!strcmp(get("HGET sf:sb:{%s} lifetime_at", id), "") == 0, "lifetime_at");

    a = (answer){0};
    call_done(&a, sf_timers_touch(ar, id, h, now + 1000, on_answer, &a), "touch");
    CHECK(atoll(get("ZSCORE sf:host:{%s}:timers i:%s", h, id)) == now + 6000, "i: moved");

    freeReplyObject(sf_redis_sync_cmd(sc, "HSET sf:sb:{%s} auto_delete_seconds 30", id));
    a = (answer){0};
    call_done(&a, sf_timers_paused(ar, id, h, now + 2000, on_answer, &a), "paused");
    CHECK(a.integer == 1 && !strcmp(get("HGET sf:sb:{%s} state", id), "paused"), "paused");
    CHECK(!strcmp(get("ZSCORE sf:host:{%s}:timers i:%s", h, id), ""), "i: gone");
    CHECK(atoll(get("ZSCORE sf:host:{%s}:timers d:%s", h, id)) == now + 32000, "d: set");

    flush_scripts();
    a = (answer){0};
    call_done(&a, sf_timers_resumed(ar, id, h, now + 3000, on_answer, &a), "resumed");
    CHECK(a.integer == 1 && !strcmp(get("HGET sf:sb:{%s} state", id), "running"), "resumed");
    CHECK(!strcmp(get("ZSCORE sf:host:{%s}:timers d:%s", h, id), ""), "d: gone");
    CHECK(atoll(get("ZSCORE sf:host:{%s}:timers i:%s", h, id)) == now + 8000, "i: back");

    a = (answer){0};
    call_done(&a, sf_timers_update(ar, id, team, now, "{\"a\":1}", 100, 0, on_answer, &a),
              "update");
    CHECK(a.elements == 2 && !strcmp(a.s0, "ok") && !strcmp(a.s1, "running"), "update: %s %s",
          a.s0, a.s1);
    CHECK(atoll(get("ZSCORE sf:host:{%s}:timers t:%s", h, id)) == now + 100000, "t: moved");
    CHECK(!strcmp(get("HGET sf:sb:{%s} metadata", id), "{\"a\":1}"), "metadata");
    a = (answer){0};
    call_done(&a, sf_timers_update(ar, id, "otherteam", now, NULL, -1, -1, on_answer, &a),
              "update");
    CHECK(!strcmp(a.s0, "none"), "another team's: none");

    a = (answer){0};
    call_done(&a, sf_timers_due(ar, h, now + 200000, 10, on_answer, &a), "due");
    CHECK(a.elements == 2, "due: %zu", a.elements);
    CHECK(!strcmp(get("ZCARD sf:host:{%s}:timers", h), "0"), "popped");
    {
        answer b = {0};
        call_done(&b, sf_records_retire(ar, id, "killed", 0, on_answer, &b), "retire");
    }
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL sf:host:{%s}:sandboxes", h));
}

static void test_claims(void)
{
    char job[64];
    answer a = {0};

    snprintf(job, sizeof(job), "job_cc%d", (int)getpid());
    flush_scripts();
    call_done(&a, sf_claim_put(ar, team, job, 0, "data", "hello", 5, 100, on_answer, &a), "put");
    CHECK(a.elements == 2 && !strcmp(a.s0, "ok"), "put: %s", a.s0);
    a = (answer){0};
    call_done(&a, sf_claim_put(ar, team, job, 0, "big", "0123456789abcdef0123456789abcdef0123456789abcdef"
                                           "0123456789abcdef0123456789abcdef0123456789abcdef",
                                 96, 100, on_answer, &a),
              "put");
    CHECK(!strcmp(a.s0, "over"), "over the budget: %s", a.s0);
    a = (answer){0};
    call_done(&a, sf_claim_take(ar, team, job, 0, "data", on_answer, &a), "take");
    CHECK(a.type == REDIS_REPLY_STRING && !strcmp(a.s0, "hello"), "take: %s", a.s0);
    CHECK(!strcmp(get("HLEN sf:team:{%s}:ccb", team), "0"), "its size went");
}

static void test_secrets(void)
{
    uint8_t key[SF_SECRET_KEY_BYTES] = {1, 2, 3};
    sf_secret m;
    char why[256], name[64];

    sf_secret_init(&m);
    snprintf(name, sizeof(name), "RECTEST_%d", (int)getpid());
    snprintf(m.name, sizeof(m.name), "%s", name);
    snprintf(m.team, sizeof(m.team), "%s", team);
    m.hosts[0] = "api.example.test";
    m.hosts_n = 1;
    flush_scripts();
    CHECK(sf_secrets_create(sc, key, &m, (const uint8_t *)"v1", 2, why, sizeof(why)) == 0,
          "create: %s", why);
    CHECK(sf_secrets_create(sc, key, &m, (const uint8_t *)"v1", 2, why, sizeof(why)) == -EEXIST,
          "create twice");
    CHECK(sf_secrets_rotate(sc, key, &m, (const uint8_t *)"v2", 2, why, sizeof(why)) == 0,
          "rotate: %s", why);
    CHECK(!strcmp(get("HGET sf:team:{%s}:secret:%s version", team, name), "2"), "version 2");
    CHECK(sf_secrets_delete(sc, team, name, why, sizeof(why)) == 0, "delete: %s", why);
    CHECK(sf_secrets_delete(sc, team, name, why, sizeof(why)) == -ENOENT, "delete twice");
    CHECK(!strcmp(get("SISMEMBER sf:team:{%s}:secrets %s", team, name), "0"), "name gone");
    m.hosts_n = 0; /* (not owned) */
    sf_secret_fini(&m);
    freeReplyObject(sf_redis_sync_cmd(sc, "SREM sf:secrets:teams %s", team));
}

/* An API key's record, its id in the index and its producer credential: all there after a
 * create, none after a revoke; a create that Redis refuses part-way writes nothing (the
 * index made a string: the old three HSETs left a key that worked but that no one could
 * list or revoke); a revoke tells every gateway (SF_CH_GATEWAY) from inside its script. */
static void test_apikeys(void)
{
    char hash[SF_APIKEY_HASH_HEX], id[32], pid[32], hash2[SF_APIKEY_HASH_HEX], id2[32];
    char pid2[32], got[SF_APIKEY_HASH_HEX], why[256];
    sf_apikey_rec k = {.team = team, .name = "rectest", .created_ms = 1, .sealed = "sealed"};
    redisContext *sub;
    redisReply *rep;

    snprintf(hash, sizeof(hash), "%064x", (unsigned)getpid());
    snprintf(hash2, sizeof(hash2), "%063x1", (unsigned)getpid());
    snprintf(id, sizeof(id), "key_%.16s", hash);
    snprintf(id2, sizeof(id2), "key_rt%.12s", hash2 + 51);
    snprintf(pid, sizeof(pid), "prt%d", (int)getpid());
    snprintf(pid2, sizeof(pid2), "prt%d2", (int)getpid());
    flush_scripts();
    k.hash = hash, k.id = id, k.pid = pid;
    CHECK(sf_apikeys_create(sc, &k, why, sizeof(why)) == 0, "create: %s", why);
    CHECK(!strcmp(get("HGET " SF_RK_APIKEY " team", hash), team), "record's team");
    CHECK(!strcmp(get("HGET " SF_RK_APIKEY " pid", hash), pid), "record's pid");
    CHECK(!strcmp(get("HGET " SF_RK_APIKEY_IDS " %s", id), hash), "id index");
    CHECK(!strcmp(get("HGET " SF_RK_PRODUCER " key", pid), hash), "credential");
    CHECK(sf_apikeys_create(sc, &k, why, sizeof(why)) == -EEXIST, "create twice");

    /* Redis refuses the create part-way (the index is not a hash): nothing of it lands */
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL " SF_RK_APIKEY_IDS ":rtsaved"));
    CHECK(!strcmp(get("RENAME " SF_RK_APIKEY_IDS " " SF_RK_APIKEY_IDS ":rtsaved"), "OK"),
          "index set aside");
    freeReplyObject(sf_redis_sync_cmd(sc, "SET " SF_RK_APIKEY_IDS " not-a-hash"));
    k.hash = hash2, k.id = id2, k.pid = pid2;
    CHECK(sf_apikeys_create(sc, &k, why, sizeof(why)) == -EIO, "create on a broken index");
    CHECK(strstr(why, "WRONGTYPE"), "why: %s", why);
    CHECK(!strcmp(get("EXISTS " SF_RK_APIKEY, hash2), "0"), "no record of a refused create");
    CHECK(!strcmp(get("EXISTS " SF_RK_PRODUCER, pid2), "0"), "no credential of a refused create");
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL " SF_RK_APIKEY_IDS));
    CHECK(!strcmp(get("RENAME " SF_RK_APIKEY_IDS ":rtsaved " SF_RK_APIKEY_IDS), "OK"),
          "index back");

    /* a revoke whose key changed since it was read answers 'again' and deletes nothing */
    {
        char rec[128], pkey[128];
        const char *argv[8];

        snprintf(rec, sizeof(rec), SF_RK_APIKEY, hash);
        snprintf(pkey, sizeof(pkey), SF_RK_PRODUCER, pid2);
        argv[0] = SF_RK_APIKEY_IDS, argv[1] = rec, argv[2] = pkey, argv[3] = id;
        argv[4] = hash, argv[5] = pid2, argv[6] = SF_CH_GATEWAY, argv[7] = "key:x";
        rep = sf_redis_script_sync(sc, &sf_store_apikey_revoke, 3, 5, argv, NULL);
        CHECK(rep && rep->type == REDIS_REPLY_STRING && !strcmp(rep->str, "again"),
              "revoke with another pid: %s", rep && rep->str ? rep->str : "no reply");
        freeReplyObject(rep);
        CHECK(!strcmp(get("EXISTS " SF_RK_APIKEY, hash), "1"), "kept");
    }

    /* the revoke: all of it goes, and a gateway's subscription hears it */
    CHECK((sub = sf_redis_connect_sync(url, why, sizeof(why))), "subscriber: %s", why);
    rep = redisCommand(sub, "SUBSCRIBE " SF_CH_GATEWAY);
    CHECK(rep && rep->type == REDIS_REPLY_ARRAY, "subscribe");
    freeReplyObject(rep);
    CHECK(sf_apikeys_revoke(sc, id, got, sizeof(got), why, sizeof(why)) == 0, "revoke: %s", why);
    CHECK(!strcmp(got, hash), "revoked hash");
    CHECK(!strcmp(get("EXISTS " SF_RK_APIKEY, hash), "0"), "record gone");
    CHECK(!strcmp(get("HEXISTS " SF_RK_APIKEY_IDS " %s", id), "0"), "id gone");
    CHECK(!strcmp(get("EXISTS " SF_RK_PRODUCER, pid), "0"), "credential gone");
    {
        struct timeval tv = {10, 0};
        char want[128];
        void *r = NULL;

        redisSetTimeout(sub, tv); /* a bound, not a wait: the message is normally there */
        snprintf(want, sizeof(want), "key:%s", hash);
        for (int i = 0; i < 100; i++) { /* other tests' messages may come first */
            CHECK(redisGetReply(sub, &r) == REDIS_OK && r, "no message on " SF_CH_GATEWAY);
            rep = r;
            if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 3 &&
                rep->element[2]->type == REDIS_REPLY_STRING && !strcmp(rep->element[2]->str, want))
                break;
            freeReplyObject(rep);
            rep = NULL;
        }
        CHECK(rep, "the revoke's message did not come");
        freeReplyObject(rep);
    }
    sf_redis_sync_free(sub);
    CHECK(sf_apikeys_revoke(sc, id, got, sizeof(got), why, sizeof(why)) == -ENOENT,
          "revoke twice");
}

static void test_sessions(void)
{
    char z[160], k[3][160], sid[3][64], now[24];
    redisReply *r;

    snprintf(z, sizeof(z), "sf:team:{%s}:sessions", team);
    flush_scripts();
    for (int i = 0; i < 3; i++) {
        snprintf(sid[i], sizeof(sid[i]), "mcp_rt%d_%d", (int)getpid(), i);
        snprintf(k[i], sizeof(k[i]), "sf:mcpsess:{%s}", sid[i]);
        snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms() + i);
        freeReplyObject(run(&sf_store_sess_put, 1, k[i], team, "2025-06-18", now, "60", NULL));
        CHECK(!strcmp(get("HGET %s team", k[i]), team) && atoi(get("TTL %s", k[i])) > 0,
              "session %d", i);
        r = run(&sf_store_sess_team, 1, z, sid[i], now, "60", "2", NULL);
        CHECK(r->type == REDIS_REPLY_ARRAY && r->elements == (i == 2 ? 1u : 0u),
              "evicted at %d: %zu", i, r->elements);
        if (i == 2)
            CHECK(!strcmp(el(r, 0), sid[0]), "the least recently used goes: %s", el(r, 0));
        freeReplyObject(r);
    }
    CHECK(!strcmp(get("ZCARD %s", z), "2"), "the team's limit");
    for (int i = 0; i < 3; i++)
        freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s", k[i]));
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s", z));
}

static void test_templates(void)
{
    char k[4][160], now[24];
    /* the hosts whose caps say builds get the template, never the one without (a qemu host) */
    const char *hosts = "[{\"h\":\"tplhost\",\"driver\":\"jail\",\"cap\":4,\"running\":1,"
                        "\"deb\":false,\"caps\":{\"builds\":true}},{\"h\":\"tplhost2\","
                        "\"driver\":\"jail\",\"cap\":4,\"running\":2,\"deb\":false,"
                        "\"caps\":{\"builds\":true}},{\"h\":\"vmhost\",\"driver\":\"qemu\","
                        "\"cap\":9,\"running\":0,\"deb\":true,\"caps\":{\"builds\":false,"
                        "\"debian\":true}}]";
    redisReply *r;

    snprintf(k[0], sizeof(k[0]), "sf:team:{%s}:tpl:t1", team);
    snprintf(k[1], sizeof(k[1]), "sf:team:{%s}:tpl:t1:log", team);
    snprintf(k[2], sizeof(k[2]), "sf:team:{%s}:tpls", team);
    snprintf(k[3], sizeof(k[3]), "sf:team:{%s}:tpl:base", team);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    flush_scripts();
#define TPL(job, from, hs)                                                                     \
    run(&sf_store_tpl_create, 4, k[0], k[1], k[2], k[3], team, "t1", from, job, now, "1000",   \
        "256", "0", "[]", "", "", "16", hs, NULL)
    r = TPL("j1", "base", hosts);
    CHECK(!strcmp(el(r, 0), "ok") && !strcmp(el(r, 3), "tplhost") && r->elements == 5 &&
          !strcmp(el(r, 4), "tplhost2"), "tpl create: %s, on every jail host", el(r, 0));
    freeReplyObject(r);
    r = run(&sf_store_tpl_row, 1, k[0], NULL);
    CHECK(r->elements == 12 && !strcmp(el(r, 0), "building") && !strcmp(el(r, 10), "2") &&
          !strcmp(el(r, 11), "0"), "tpl row: %s, built on %s", el(r, 0), el(r, 10));
    freeReplyObject(r);
    r = TPL("j1", "base", hosts);
    CHECK(!strcmp(el(r, 0), "ok"), "the same job again");
    freeReplyObject(r);
    r = TPL("j2", "base", hosts);
    CHECK(!strcmp(el(r, 0), "exists") && !strcmp(el(r, 1), "building"), "exists");
    freeReplyObject(r);
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET %s status failed", k[0]));
    r = TPL("j3", "debian", hosts);
    CHECK(!strcmp(el(r, 0), "nodebian"), "no host has debian: %s", el(r, 0));
    freeReplyObject(r);
    r = TPL("j3", "base", "[]");
    CHECK(!strcmp(el(r, 0), "nohost"), "no host: %s", el(r, 0));
    freeReplyObject(r);
    /* a build's writes: only while the job is its own; the status from every host's */
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s %s", k[0], k[1]));
    r = TPL("j4", "base", hosts);
    CHECK(!strcmp(el(r, 0), "ok"), "tpl create j4: %s", el(r, 0));
    freeReplyObject(r);
    flush_scripts();
    r = run(&sf_store_tpl_set, 1, k[0], "j4", "step", "1/2", now, NULL);
    CHECK(r->integer == 1 && !strcmp(get("HGET %s step", k[0]), "1/2"), "tpl set");
    freeReplyObject(r);
    r = run(&sf_store_tpl_set, 1, k[0], "old", "step", "9/9", now, NULL);
    CHECK(r->integer == 0 && !strcmp(get("HGET %s step", k[0]), "1/2"), "an old build's set");
    freeReplyObject(r);
    r = run(&sf_store_tpl_log, 2, k[0], k[1], "j4", "hello\n", "8", NULL);
    CHECK(r->integer == 6, "tpl log: %lld", r->integer);
    freeReplyObject(r);
    r = run(&sf_store_tpl_log, 2, k[0], k[1], "j4", "more\n", "8", NULL);
    CHECK(r->integer == 0 && !strcmp(get("GET %s", k[1]), "hello\n"), "the log's bound");
    freeReplyObject(r);
    r = run(&sf_store_tpl_done, 1, k[0], "j4", "tplhost", "failed", "step 1 failed", "1", now,
            "1", NULL);
    CHECK(r->integer == 1 && !strcmp(get("HGET %s status", k[0]), "building") &&
          !strcmp(get("HGET %s error", k[0]), "step 1 failed"), "one host of two failed");
    freeReplyObject(r);
    r = run(&sf_store_tpl_done, 1, k[0], "old", "tplhost2", "ready", "", "", now, "0", NULL);
    CHECK(r->integer == 0, "an old build's done");
    freeReplyObject(r);
    r = run(&sf_store_tpl_done, 1, k[0], "j4", "tplhost2", "ready", "", "", now, "0", NULL);
    CHECK(r->integer == 1 && !strcmp(get("HGET %s status", k[0]), "ready") &&
          !strcmp(get("HGET %s at:tplhost2", k[0]), "ready"), "ready once a host has it");
    freeReplyObject(r);
    /* a host that joined later: handed a ready template once, when its `from` is there */
    {
        char fk[160];
        snprintf(fk, sizeof(fk), "sf:team:{%s}:tpl:t0", team);
        flush_scripts();
        r = run(&sf_store_tpl_join, 2, k[0], k[3], "joinhost", "0", "base", NULL);
        CHECK(!strcmp(el(r, 0), "build") && !strcmp(el(r, 1), "j4") &&
              !strcmp(get("HGET %s at:joinhost", k[0]), "building"), "join: %s", el(r, 0));
        freeReplyObject(r);
        r = run(&sf_store_tpl_join, 2, k[0], k[3], "joinhost", "0", "base", NULL);
        CHECK(!strcmp(el(r, 0), "no"), "join again: the host has it");
        freeReplyObject(r);
        r = run(&sf_store_tpl_join, 2, k[0], k[3], "joinhost2", "0", "other", NULL);
        CHECK(!strcmp(el(r, 0), "no"), "join: its from changed meanwhile");
        freeReplyObject(r);
        freeReplyObject(sf_redis_sync_cmd(sc, "HSET %s from debian", k[0]));
        r = run(&sf_store_tpl_join, 2, k[0], k[3], "joinhost2", "0", "debian", NULL);
        CHECK(!strcmp(el(r, 0), "no"), "join: a host without debian");
        freeReplyObject(r);
        freeReplyObject(sf_redis_sync_cmd(sc, "HSET %s from t0", k[0]));
        freeReplyObject(sf_redis_sync_cmd(sc, "HSET %s status ready at:joinhost3 ready", fk));
        r = run(&sf_store_tpl_join, 2, k[0], fk, "joinhost2", "1", "t0", NULL);
        CHECK(!strcmp(el(r, 0), "no"), "join: its from is not ready there");
        freeReplyObject(r);
        r = run(&sf_store_tpl_join, 2, k[0], fk, "joinhost3", "0", "t0", NULL);
        CHECK(!strcmp(el(r, 0), "build"), "join: its from is ready there");
        freeReplyObject(r);
        freeReplyObject(sf_redis_sync_cmd(sc, "HSET %s status building", k[0]));
        r = run(&sf_store_tpl_join, 2, k[0], k[3], "joinhost4", "0", "t0", NULL);
        CHECK(!strcmp(el(r, 0), "no"), "join: not ready");
        freeReplyObject(r);
        freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s", fk));
    }
#undef TPL
    /* delete: mark (a second mark keeps the first status), undo by that job only, delete */
    freeReplyObject(sf_redis_sync_cmd(sc, "HSET %s status building at:tplhost ready host tplhost2", k[0]));
    freeReplyObject(sf_redis_sync_cmd(sc, "SET %s log", k[1]));
    freeReplyObject(sf_redis_sync_cmd(sc, "SADD %s t1", k[2]));
    flush_scripts();
    r = run(&sf_store_tpl_del_mark, 1, k[0], "d1", NULL);
    CHECK(r->type == REDIS_REPLY_STRING && !strcmp(r->str, "ok"), "del mark");
    freeReplyObject(r);
    freeReplyObject(run(&sf_store_tpl_del_mark, 1, k[0], "d2", NULL));
    CHECK(!strcmp(get("HGET %s status", k[0]), "deleting") &&
          !strcmp(get("HGET %s before", k[0]), "building"), "marked deleting, before kept");
    r = run(&sf_store_tpl_del_undo, 1, k[0], "d2", NULL);
    CHECK(r->integer == 0, "undo by another delete's job");
    freeReplyObject(r);
    r = run(&sf_store_tpl_del_undo, 1, k[0], "d1", NULL);
    CHECK(r->integer == 1 && !strcmp(get("HGET %s status", k[0]), "ready") &&
          !strcmp(get("HEXISTS %s before", k[0]), "0"), "undo: ready (a host has it ready)");
    freeReplyObject(r);
    r = run(&sf_store_tpl_del, 3, k[0], k[1], k[2], "t1", NULL);
    CHECK(r->type == REDIS_REPLY_ARRAY && r->elements == 4, "del: its 4 hosts (2 joined), %zu",
          r->elements);
    freeReplyObject(r);
    CHECK(!strcmp(get("EXISTS %s", k[0]), "0") && !strcmp(get("EXISTS %s", k[1]), "0") &&
          !strcmp(get("SISMEMBER %s t1", k[2]), "0"), "del: record, log and name gone");
    r = run(&sf_store_tpl_del_mark, 1, k[0], "d3", NULL);
    CHECK(r->type == REDIS_REPLY_STRING && !strcmp(r->str, "none"), "del mark of none");
    freeReplyObject(r);
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s %s %s", k[0], k[1], k[2]));
}

/* Snapshot records through sf_snapshots.c (each call reads the team's set, then runs its
 * script with every record declared): limits of count and bytes, a taken name, finish,
 * find by name and by id (never another team's), list, delete (not while taking), drop,
 * check; a script given a set whose member it was not told of answers 'again'. */
static void test_snapshots(void)
{
    char set[160], other[64], ida[40], idb[40], idc[40];
    sf_snap_rec rec = {.host = host, .driver = "jail", .sandbox = "sb_x", .memory_mib = 64};
    answer a;
    redisReply *r;

#define SNAP(call, what) (memset(&a, 0, sizeof(a)), call_done(&a, (call), what))
    snprintf(set, sizeof(set), "sf:team:{%s}:snaps", team);
    snprintf(other, sizeof(other), "%sb", team);
    snprintf(ida, sizeof(ida), "snp_a%d", (int)getpid());
    snprintf(idb, sizeof(idb), "snp_b%d", (int)getpid());
    snprintf(idc, sizeof(idc), "snp_c%d", (int)getpid());
    flush_scripts();
    rec.id = ida, rec.name = "s1";
    SNAP(sf_snap_reserve(ar, team, &rec, 1, 2, 1000, on_answer, &a), "reserve s1");
    CHECK(!strcmp(a.s0, "ok"), "reserve: %s", a.s0);
    CHECK(!strcmp(get("HGET sf:team:{%s}:snap:s1 status", team), "taking"), "taking");
    SNAP(sf_snap_reserve(ar, team, &rec, 1, 2, 1000, on_answer, &a), "reserve s1 again");
    CHECK(!strcmp(a.s0, "taken"), "a taken name: %s", a.s0);
    SNAP(sf_snap_delete(ar, team, "s1", on_answer, &a), "delete while taking");
    CHECK(!strcmp(a.s0, "taking"), "delete while taking: %s", a.s0);
    SNAP(sf_snap_finish(ar, team, "s1", ida, 600, 1000, on_answer, &a), "finish s1");
    CHECK(!strcmp(a.s0, "ok") && !strcmp(get("HGET sf:team:{%s}:snap:s1 status", team), "ready"),
          "finish: %s", a.s0);
    rec.id = idb, rec.name = "s2";
    SNAP(sf_snap_reserve(ar, team, &rec, 1, 2, 1000, on_answer, &a), "reserve s2");
    CHECK(!strcmp(a.s0, "ok"), "reserve s2: %s", a.s0);
    rec.id = idc, rec.name = "s3";
    SNAP(sf_snap_reserve(ar, team, &rec, 1, 2, 1000, on_answer, &a), "reserve s3");
    CHECK(!strcmp(a.s0, "count"), "the count limit: %s", a.s0);
    SNAP(sf_snap_finish(ar, team, "s2", idb, 500, 1000, on_answer, &a), "finish s2");
    CHECK(!strcmp(a.s0, "bytes") && !strcmp(get("SISMEMBER %s s2", set), "0") &&
          !strcmp(get("EXISTS sf:team:{%s}:snap:s2", team), "0"), "the bytes limit at finish");
    SNAP(sf_snap_finish(ar, team, "s2", idb, 1, 1000, on_answer, &a), "finish s2 gone");
    CHECK(!strcmp(a.s0, "gone"), "finish of a record gone: %s", a.s0);
    SNAP(sf_snap_reserve(ar, team, &rec, 1, 5, 600, on_answer, &a), "reserve s3 bytes");
    CHECK(!strcmp(a.s0, "bytes"), "the bytes limit at reserve: %s", a.s0);
    flush_scripts();
    SNAP(sf_snap_find(ar, team, "s1", on_answer, &a), "find by name");
    CHECK(a.type == REDIS_REPLY_ARRAY && a.elements >= 20 && !strcmp(a.s1, ida), "find by name");
    SNAP(sf_snap_find(ar, team, ida, on_answer, &a), "find by id");
    CHECK(a.elements >= 20 && !strcmp(a.s1, ida), "find by id");
    SNAP(sf_snap_find(ar, other, ida, on_answer, &a), "find by another team");
    CHECK(a.type == REDIS_REPLY_ARRAY && a.elements == 0, "another team's is never found");
    SNAP(sf_snap_find(ar, team, "nope", on_answer, &a), "find none");
    CHECK(a.type == REDIS_REPLY_ARRAY && a.elements == 0, "find none");
    /* a script told of fewer records than the set holds: 'again' (sf_snapshots re-reads) */
    r = run(&sf_store_snap_find, 1, set, "s1", NULL);
    CHECK(!strcmp(el(r, 0), "again") && r->elements == 1, "undeclared member: %s", el(r, 0));
    freeReplyObject(r);
    rec.id = idc, rec.name = "s3";
    SNAP(sf_snap_reserve(ar, team, &rec, 1, 5, 1000, on_answer, &a), "reserve s3");
    CHECK(!strcmp(a.s0, "ok"), "reserve s3: %s", a.s0);
    SNAP(sf_snap_list(ar, team, on_answer, &a), "list");
    CHECK(a.type == REDIS_REPLY_ARRAY && a.elements == 2, "list: %zu", a.elements);
    SNAP(sf_snap_check(ar, team, "s3", idc, 0, on_answer, &a), "check");
    CHECK(a.integer == 1, "check keeps a snapshot being taken");
    SNAP(sf_snap_check(ar, team, "s3", idb, 0, on_answer, &a), "check other id");
    CHECK(a.integer == 0, "check: the name is another id's");
    SNAP(sf_snap_check(ar, team, "s3", idc, 1, on_answer, &a), "check stale");
    CHECK(a.integer == 0 && !strcmp(get("SISMEMBER %s s3", set), "0"), "a stale 'taking' goes");
    SNAP(sf_snap_reserve(ar, team, &rec, 1, 5, 1000, on_answer, &a), "reserve s3 again");
    SNAP(sf_snap_drop(ar, team, "s3", idb, on_answer, &a), "drop other id");
    CHECK(a.integer == 0, "drop: not that id's");
    SNAP(sf_snap_drop(ar, team, "s3", idc, on_answer, &a), "drop");
    CHECK(a.integer == 1 && !strcmp(get("EXISTS sf:team:{%s}:snap:s3", team), "0"), "dropped");
    SNAP(sf_snap_delete(ar, other, ida, on_answer, &a), "delete by another team");
    CHECK(!strcmp(a.s0, "none"), "another team cannot delete it: %s", a.s0);
    SNAP(sf_snap_delete(ar, team, ida, on_answer, &a), "delete by id");
    CHECK(!strcmp(a.s0, "ok") && !strcmp(a.s1, ida) && !strcmp(get("SCARD %s", set), "0") &&
          !strcmp(get("EXISTS sf:team:{%s}:snap:s1", team), "0"), "delete by id: %s", a.s0);
    SNAP(sf_snap_delete(ar, team, "s1", on_answer, &a), "delete again");
    CHECK(!strcmp(a.s0, "none"), "delete again: %s", a.s0);
#undef SNAP
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s", set));
}

static void test_guard(void)
{
    char k[128], gk[128], gkb[128], k2[128], k3[128], now[24], past[24];
    redisReply *r;

    snprintf(k, sizeof(k), "sf:job:{%s}:job_rg%d", team, (int)getpid());
    snprintf(k2, sizeof(k2), "sf:job:{%s}:job_rg%d_2", team, (int)getpid());
    snprintf(k3, sizeof(k3), "sf:job:{%s}:job_rg%d_3", team, (int)getpid());
    snprintf(gk, sizeof(gk), "sf:team:{%s}:gk", team);
    snprintf(gkb, sizeof(gkb), "sf:team:{%s}:gkb", team);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    flush_scripts();
#define BEGIN(key, inst, topic, budget, force) \
    run(&sf_store_guard_begin, 3, key, gk, gkb, "h1", inst, "60", topic, now, budget, force, NULL)
    r = BEGIN(k, "inst1", "topic1", "100", "0");
    CHECK(!strcmp(el(r, 0), "new"), "guard new: %s", el(r, 0));
    freeReplyObject(r);
    r = BEGIN(k, "inst1", "topic2", "100", "0");
    CHECK(!strcmp(el(r, 0), "running"), "guard running");
    freeReplyObject(r);
    r = BEGIN(k, "inst2", "topic1", "100", "0");
    CHECK(!strcmp(el(r, 0), "orphan") && !strcmp(el(r, 1), "h1"), "guard orphan");
    freeReplyObject(r);
    r = run(&sf_store_guard_done, 3, k, gk, gkb, "REPLY", "60", now, "100", "job1", NULL);
    CHECK(r->type == REDIS_REPLY_STRING && !strcmp(r->str, "topic2"), "done: the other topic");
    freeReplyObject(r);
    r = BEGIN(k, "inst3", "topic1", "100", "0");
    CHECK(!strcmp(el(r, 0), "done") && !strcmp(el(r, 1), "REPLY"), "done: the reply again");
    freeReplyObject(r);
    /* the team's budget of 8: 5 bytes kept, a 4-byte reply still kept (9); now a new job
     * is refused, a kill is not, and its reply is not kept */
    r = BEGIN(k2, "inst1", "topic1", "8", "0");
    CHECK(!strcmp(el(r, 0), "new"), "within budget: %s", el(r, 0));
    freeReplyObject(r);
    freeReplyObject(run(&sf_store_guard_done, 3, k2, gk, gkb, "ABCD", "60", now, "8", "job2", NULL));
    r = BEGIN(k2, "inst3", "topic1", "8", "0");
    CHECK(!strcmp(el(r, 0), "done") && !strcmp(el(r, 1), "ABCD"), "under budget: kept");
    freeReplyObject(r);
    r = BEGIN(k3, "inst1", "topic1", "8", "0");
    CHECK(!strcmp(el(r, 0), "full") && !strcmp(el(r, 1), "9"), "full: %s %s", el(r, 0), el(r, 1));
    freeReplyObject(r);
    r = BEGIN(k3, "inst1", "topic1", "8", "1");
    CHECK(!strcmp(el(r, 0), "new"), "a kill is never refused");
    freeReplyObject(r);
    freeReplyObject(run(&sf_store_guard_done, 3, k3, gk, gkb, "XY", "60", now, "8", "job4", NULL));
    r = BEGIN(k3, "inst3", "topic1", "8", "0");
    CHECK(!strcmp(el(r, 0), "done") && !strcmp(el(r, 1), ""), "at the budget: not kept");
    freeReplyObject(r);
    /* expired kept replies give their bytes back */
    snprintf(past, sizeof(past), "%lld", (long long)sf_now_ms() - 120000);
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s %s %s", gk, gkb, k2));
    freeReplyObject(run(&sf_store_guard_done, 3, k2, gk, gkb, "OLD", "60", past, "8", "job3", NULL));
    r = sf_redis_sync_cmd(sc, "GET %s", gkb);
    CHECK(r->type == REDIS_REPLY_STRING && !strcmp(r->str, "3"), "3 bytes counted");
    freeReplyObject(r);
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s", k3));
    r = BEGIN(k3, "inst1", "topic1", "3", "0");
    CHECK(!strcmp(el(r, 0), "new"), "expired replies were given back: %s", el(r, 0));
    freeReplyObject(r);
    r = sf_redis_sync_cmd(sc, "EXISTS %s", gkb);
    CHECK(r->type == REDIS_REPLY_INTEGER && r->integer == 0, "the counter went with them");
    freeReplyObject(r);
#undef BEGIN
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s %s %s %s %s", k, k2, k3, gk, gkb));
}

/* A raw command on one node (no routing): its reply's string/status, an integer as text, or
 * "ERR:<message>"; "" for nil. */
static const char *on_node(redisContext *c, const char *fmt, ...)
{
    static char out[2][256];
    static int slot;
    char *o = out[slot++ % 2];
    va_list ap;
    redisReply *rep;

    va_start(ap, fmt);
    rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    CHECK(rep, "a node's connection was lost");
    if (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)
        snprintf(o, 256, "%s", rep->str);
    else if (rep->type == REDIS_REPLY_ERROR)
        snprintf(o, 256, "ERR:%s", rep->str);
    else if (rep->type == REDIS_REPLY_INTEGER)
        snprintf(o, 256, "%lld", rep->integer);
    else
        o[0] = 0;
    freeReplyObject(rep);
    return o;
}

static sf_redis_script incr_script = SF_REDIS_SCRIPT("#!lua\nreturn redis.call('INCR', KEYS[1])");

/* A slot handed to another master while both clients hold the old map (on a cluster of
 * several masters: the engines label): the old owner answers MOVED, and the async
 * client's command and script and the blocking client's command follow it to the new
 * owner. Then the slot half-way back (MIGRATING there, IMPORTING here): a key the owner
 * does not have is answered ASK and followed (ASKING first) by both clients; last the
 * slot is given back where it was. */
static void test_moved(void)
{
    redisContext *m[16];
    int n = sf_redis_sync_masters(sc, m, 16), a_i = -1, b_i;
    char key[64], key2[64], key3[64], tag[32], ida[64], idb[64];
    int slot = -1;
    answer a;

    CHECK(n > 0, "the masters: %d", n);
    if (n < 2) {
        printf("moved: %d master: no MOVED or ASK to follow here (the engines label has 3)\n", n);
        return;
    }
    /* a slot that holds no key yet, and its owner */
    for (int t = 0; t < 1000 && a_i < 0; t++) {
        snprintf(tag, sizeof(tag), "moved%d-%d", (int)getpid(), t);
        snprintf(key, sizeof(key), "sf:test:{%s}:a", tag);
        slot = sf_redis_slot(key, strlen(key));
        for (int i = 0; i < n; i++)
            if (strncmp(on_node(m[i], "EXISTS %s", key), "ERR:", 4) &&
                !strcmp(on_node(m[i], "CLUSTER COUNTKEYSINSLOT %d", slot), "0"))
                a_i = i;
    }
    CHECK(a_i >= 0, "no empty slot found");
    b_i = (a_i + 1) % n;
    snprintf(key2, sizeof(key2), "sf:test:{%s}:b", tag);
    snprintf(key3, sizeof(key3), "sf:test:{%s}:c", tag);
    snprintf(ida, sizeof(ida), "%s", on_node(m[a_i], "CLUSTER MYID"));
    snprintf(idb, sizeof(idb), "%s", on_node(m[b_i], "CLUSTER MYID"));
    /* the clients' maps are current: a command lands on A */
    a = (answer){0};
    call_done(&a, sf_redis_cmd(ar, on_answer, &a, "SET %s 1", key), "set before");
    CHECK(!strcmp(on_node(m[a_i], "GET %s", key), "1"), "the key is on its owner");
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s", key));

    /* the (empty) slot to B, told to every master; the clients are not told */
    CHECK(!strcmp(on_node(m[b_i], "CLUSTER SETSLOT %d NODE %s", slot, idb), "OK"), "setslot B");
    for (int i = 0; i < n; i++)
        if (i != b_i)
            CHECK(!strcmp(on_node(m[i], "CLUSTER SETSLOT %d NODE %s", slot, idb), "OK"),
                  "setslot on %d", i);
    CHECK(!strncmp(on_node(m[a_i], "GET %s", key), "ERR:MOVED", 9), "A answers MOVED");
    a = (answer){0};
    call_done(&a, sf_redis_cmd(ar, on_answer, &a, "SET %s 7", key), "async set after the move");
    CHECK(a.type == REDIS_REPLY_STATUS, "async SET followed MOVED: reply type %d", a.type);
    CHECK(!strcmp(on_node(m[b_i], "GET %s", key), "7"), "the async write is on B");
    CHECK(!strcmp(get("INCR %s", key2), "1"), "sync INCR followed MOVED");
    CHECK(!strcmp(on_node(m[b_i], "GET %s", key2), "1"), "the sync write is on B");
    {
        const char *argv[] = {key2};
        size_t lens[] = {strlen(key2)};
        a = (answer){0};
        call_done(&a, sf_redis_script_call(ar, &incr_script, on_answer, &a, 1, 0, argv, lens),
                  "script after the move");
        CHECK(a.integer == 2, "the script ran on B: %lld", a.integer);
    }
    /* empty it again (the async client's map is new now; the sync one's too) */
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s %s", key, key2));
    CHECK(!strcmp(on_node(m[b_i], "CLUSTER COUNTKEYSINSLOT %d", slot), "0"), "B's slot is empty");

    /* half-way back: B MIGRATING to A, A IMPORTING from B; a key B lacks is asked of A */
    CHECK(!strcmp(on_node(m[a_i], "CLUSTER SETSLOT %d IMPORTING %s", slot, idb), "OK"), "importing");
    CHECK(!strcmp(on_node(m[b_i], "CLUSTER SETSLOT %d MIGRATING %s", slot, ida), "OK"), "migrating");
    CHECK(!strncmp(on_node(m[b_i], "GET %s", key3), "ERR:ASK", 7), "B answers ASK");
    a = (answer){0};
    call_done(&a, sf_redis_cmd(ar, on_answer, &a, "SET %s 9", key3), "async set while migrating");
    CHECK(a.type == REDIS_REPLY_STATUS, "async SET followed ASK: reply type %d", a.type);
    freeReplyObject(redisCommand(m[a_i], "ASKING"));
    CHECK(!strcmp(on_node(m[a_i], "GET %s", key3), "9"), "the async write is on A");
    CHECK(!strcmp(get("SET %s 10", key), "OK"), "sync SET followed ASK");
    freeReplyObject(redisCommand(m[a_i], "ASKING"));
    CHECK(!strcmp(on_node(m[a_i], "GET %s", key), "10"), "the sync write is on A");
    /* the slot back to A (B holds none of its keys), on every master; then cleaned */
    CHECK(!strcmp(on_node(m[a_i], "CLUSTER SETSLOT %d NODE %s", slot, ida), "OK"), "back to A");
    for (int i = 0; i < n; i++)
        if (i != a_i)
            CHECK(!strcmp(on_node(m[i], "CLUSTER SETSLOT %d NODE %s", slot, ida), "OK"),
                  "back on %d", i);
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL %s %s", key, key3));
    a = (answer){0};
    call_done(&a, sf_redis_cmd(ar, on_answer, &a, "EXISTS %s", key3), "async after the move back");
    CHECK(a.integer == 0, "the async client follows the slot back");
    printf("moved: slot %d moved between 2 of %d masters: MOVED and ASK followed\n", slot, n);
}

int main(void)
{
    char why[256];
    int n;

    read_env();
    snprintf(team, sizeof(team), "rectest%d", (int)getpid());
    snprintf(host, sizeof(host), "rechost%d", (int)getpid());
    CHECK((base = event_base_new()), "event base");
    CHECK((sc = sf_redis_connect_sync(url, why, sizeof(why))), "sync redis: %s", why);
    CHECK((ar = sf_redis_new(base, url, why, sizeof(why))), "async redis: %s", why);
    for (int64_t until = sf_mono_ms() + 5000; !sf_redis_connected(ar) && sf_mono_ms() < until;)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK), usleep(1000);
    CHECK(sf_redis_connected(ar), "async redis did not connect");
    n = test_all_scripts();
    test_lifecycle();
    test_tombstones_bounded();
    test_sweeps();
    test_placement();
    test_timers();
    test_claims();
    test_secrets();
    test_apikeys();
    test_sessions();
    test_templates();
    test_snapshots();
    test_guard();
    test_moved();
    /* one slot per DEL */
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL sf:team:{%s}:res sf:team:{%s}:retired "
                                     "sf:team:{%s}:sandboxes", team, team, team));
    freeReplyObject(sf_redis_sync_cmd(sc, "DEL sf:host:{%s} sf:host:{%s}:sandboxes sf:host:{%s}:timers "
                                     "sf:host:{%s}:res", host, host, host, host));
    sf_redis_free(ar);
    sf_redis_sync_free(sc);
    event_base_free(base);
    printf("store: %d scripts; 14 groups passed, 0 failed\n", n);
    return 0;
}
