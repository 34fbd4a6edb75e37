#include "sf_records.h"
#include "sf_store.h"
#include "sf_timers.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_MAX 64

/* Each write is single-slot steps (sf_store.h): the record first (its state, the verdict),
 * then its team's keys, then its host's. The team's and host's steps are keyed by the
 * sandbox id (set members, reservation fields), so running them again is harmless: a
 * retire that Redis or the caller cut short between steps is completed by retiring the
 * record again (a dead record still gets them). */

static redisReply verdict_reply[2] = {{.type = REDIS_REPLY_INTEGER, .integer = 0},
                                      {.type = REDIS_REPLY_INTEGER, .integer = 1}};

static void ignore_reply(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac, (void)r, (void)priv;
}

static int keyf(char *buf, size_t n, const char *fmt, const char *part)
{
    int w = snprintf(buf, n, fmt, part);
    return w < 0 || (size_t)w >= n ? -ENAMETOOLONG : 0;
}

/* The reply of a record step: {verdict, team, host}. 0 and the parts, or -1. */
static int owner_of(const redisReply *rep, int *verdict, char team[SF_ID_MAX],
                    char host[SF_ID_MAX])
{
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER)
        return -1;
    *verdict = rep->element[0]->integer == 1;
    team[0] = host[0] = '\0';
    if (rep->elements >= 3 && rep->element[1]->type == REDIS_REPLY_STRING &&
        rep->element[1]->len < SF_ID_MAX && rep->element[2]->type == REDIS_REPLY_STRING &&
        rep->element[2]->len < SF_ID_MAX) {
        memcpy(team, rep->element[1]->str, rep->element[1]->len + 1);
        memcpy(host, rep->element[2]->str, rep->element[2]->len + 1);
    }
    return 0;
}

/* Arguments of the team step (team_release) and the host step (host_release). */
typedef struct steps_args {
    char k[3][160], now[24], ttl[24], keep[24];
    const char *argv[8];
    size_t lens[8];
} steps_args;

static int team_args(steps_args *a, const char *team, const char *id, int tomb)
{
    if (keyf(a->k[0], sizeof(a->k[0]), SF_RK_TEAM_SANDBOXES, team) < 0 ||
        keyf(a->k[1], sizeof(a->k[1]), SF_RK_TEAM_RES, team) < 0 ||
        keyf(a->k[2], sizeof(a->k[2]), SF_RK_TEAM_RETIRED, team) < 0)
        return -ENAMETOOLONG;
    snprintf(a->now, sizeof(a->now), "%lld", (long long)sf_now_ms());
    snprintf(a->ttl, sizeof(a->ttl), "%d", SF_RETIRED_TTL_S);
    snprintf(a->keep, sizeof(a->keep), "%d", SF_RETIRED_KEEP);
    const char *v[] = {a->k[0], a->k[1], a->k[2], id, a->now, a->ttl, a->keep, tomb ? "1" : "0"};
    for (size_t i = 0; i < SF_ARRAY_LEN(v); i++) {
        a->argv[i] = v[i];
        a->lens[i] = strlen(v[i]);
    }
    return 0;
}

static int host_args(steps_args *a, const char *host, const char *id)
{
    if (keyf(a->k[0], sizeof(a->k[0]), SF_RK_HOST_RES, host) < 0 ||
        keyf(a->k[1], sizeof(a->k[1]), SF_RK_HOST_SANDBOXES, host) < 0 ||
        keyf(a->k[2], sizeof(a->k[2]), SF_RK_HOST_TIMERS, host) < 0)
        return -ENAMETOOLONG;
    const char *v[] = {a->k[0], a->k[1], a->k[2], id};
    for (size_t i = 0; i < SF_ARRAY_LEN(v); i++) {
        a->argv[i] = v[i];
        a->lens[i] = strlen(v[i]);
    }
    return 0;
}

/* ---- retire and mark_killing (async) ---- */

enum { OP_RETIRE, OP_KILLING };

typedef struct owner_op {
    sf_redis *r;
    int kind, only_live, verdict;
    redisCallbackFn *cb;
    void *priv;
    char id[SF_ID_MAX], team[SF_ID_MAX], host[SF_ID_MAX], state[16];
} owner_op;

static void owner_done(owner_op *op, redisAsyncContext *ac, redisReply *rep)
{
    if (op->cb)
        op->cb(ac, rep, op->priv);
    free(op);
}

static void on_host_step(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    owner_op *op = priv;

    owner_done(op, ac, rep && rep->type == REDIS_REPLY_ERROR ? rep : &verdict_reply[op->verdict]);
}

static void on_team_step(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    owner_op *op = priv;
    steps_args a;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        owner_done(op, ac, rep);
        return;
    }
    for (size_t i = 0; i < rep->elements; i++) { /* old tombstones beyond the team's bound */
        char key[128];
        const char *argv[] = {key};
        size_t lens[1];
        if (rep->element[i]->type != REDIS_REPLY_STRING || rep->element[i]->len >= SF_ID_MAX)
            continue;
        lens[0] = (size_t)snprintf(key, sizeof(key), SF_RK_SANDBOX, rep->element[i]->str);
        sf_redis_script_call(op->r, &sf_store_rec_drop_dead, ignore_reply, NULL, 1, 0, argv,
                             lens);
    }
    if (op->kind == OP_KILLING || !op->host[0]) { /* the host keeps its part until retired */
        owner_done(op, ac, &verdict_reply[op->verdict]);
        return;
    }
    if (host_args(&a, op->host, op->id) < 0 ||
        sf_redis_script_call(op->r, &sf_store_host_release, on_host_step, op, 3, 1, a.argv,
                             a.lens) < 0)
        owner_done(op, ac, NULL);
}

static void on_record_step(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    owner_op *op = priv;
    steps_args a;

    if (owner_of(rep, &op->verdict, op->team, op->host) < 0) {
        owner_done(op, ac, rep); /* Redis is down, or refused it: the caller sees that */
        return;
    }
    if (!op->team[0] || (op->kind == OP_KILLING && !op->verdict)) {
        owner_done(op, ac, &verdict_reply[op->verdict]);
        return;
    }
    if (team_args(&a, op->team, op->id, op->kind == OP_RETIRE && op->verdict) < 0 ||
        sf_redis_script_call(op->r, &sf_store_team_release, on_team_step, op, 3, 5, a.argv,
                             a.lens) < 0)
        owner_done(op, ac, NULL);
}

/* 0 (cb answers), or -errno (cb not called). */
static int owner_begin(sf_redis *r, int kind, const char *id, const char *state, int only_live,
                       redisCallbackFn *cb, void *priv)
{
    char key[128], now[24], ttl[24];
    const char *argv[5];
    size_t lens[5];
    owner_op *op;
    int n = 0, rc;

    if (strlen(id) >= SF_ID_MAX)
        return -EINVAL;
    if (!(op = calloc(1, sizeof(*op))))
        return -ENOMEM;
    op->r = r;
    op->kind = kind;
    op->cb = cb;
    op->priv = priv;
    op->only_live = only_live;
    snprintf(op->id, sizeof(op->id), "%s", id);
    snprintf(op->state, sizeof(op->state), "%s", state ? state : "");
    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%d", SF_RETIRED_TTL_S);
    argv[n++] = key;
    if (kind == OP_RETIRE) {
        argv[n++] = now;
        argv[n++] = ttl;
        argv[n++] = op->state;
        argv[n++] = only_live ? "1" : "0";
    }
    for (int i = 0; i < n; i++)
        lens[i] = strlen(argv[i]);
    rc = sf_redis_script_call(r, kind == OP_RETIRE ? &sf_store_rec_retire : &sf_store_rec_killing,
                              on_record_step, op, 1, n - 1, argv, lens);
    if (rc < 0)
        free(op);
    return rc;
}

int sf_records_retire(sf_redis *r, const char *id, const char *state, int only_live,
                      redisCallbackFn *cb, void *priv)
{
    return owner_begin(r, OP_RETIRE, id, state, only_live, cb, priv);
}

int sf_records_mark_killing(sf_redis *r, const char *id, redisCallbackFn *cb, void *priv)
{
    return owner_begin(r, OP_KILLING, id, NULL, 0, cb, priv);
}

/* ---- blocking: a worker's start-up ---- */

/* A reply that is not an error: 0 (the caller frees it), or -EIO (freed). */
static int sync_ok(redisReply *rep)
{
    if (rep && rep->type != REDIS_REPLY_ERROR)
        return 0;
    if (rep)
        freeReplyObject(rep);
    return -EIO;
}

/* Retires id (lost, only while live) and clears it from host: 1 retired, 0, or -EIO. */
static int retire_lost_sync(redisContext *c, const char *host, const char *id)
{
    char key[128], now[24], ttl[24], team[SF_ID_MAX], rhost[SF_ID_MAX];
    const char *argv[] = {key, now, ttl, "lost", "1"};
    redisReply *rep;
    steps_args a;
    int verdict = 0, bad;

    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%d", SF_RETIRED_TTL_S);
    rep = sf_redis_script_sync(c, &sf_store_rec_retire, 1, 4, argv, NULL);
    if (sync_ok(rep) < 0)
        return -EIO;
    bad = owner_of(rep, &verdict, team, rhost);
    freeReplyObject(rep);
    if (bad)
        return -EIO;
    if (team[0] && team_args(&a, team, id, verdict) == 0) {
        if (sync_ok(rep = sf_redis_script_sync(c, &sf_store_team_release, 3, 5, a.argv, a.lens)) < 0)
            return -EIO;
        for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
            char old[128];
            const char *k[] = {old};
            if (rep->element[i]->type != REDIS_REPLY_STRING || rep->element[i]->len >= SF_ID_MAX)
                continue;
            snprintf(old, sizeof(old), SF_RK_SANDBOX, rep->element[i]->str);
            freeReplyObject(sf_redis_script_sync(c, &sf_store_rec_drop_dead, 1, 0, k, NULL));
        }
        freeReplyObject(rep);
    }
    if (rhost[0] && strcmp(rhost, host) != 0 && host_args(&a, rhost, id) == 0) {
        if (sync_ok(rep = sf_redis_script_sync(c, &sf_store_host_release, 3, 1, a.argv, a.lens)) < 0)
            return -EIO;
        freeReplyObject(rep);
    }
    if (host_args(&a, host, id) < 0 ||
        sync_ok(rep = sf_redis_script_sync(c, &sf_store_host_release, 3, 1, a.argv, a.lens)) < 0)
        return -EIO;
    freeReplyObject(rep);
    return verdict;
}

int sf_records_retire_host_sync(redisContext *c, const char *host, long long *n)
{
    return sf_records_retire_host_except_sync(c, host, NULL, NULL, n);
}

int sf_records_retire_host_except_sync(redisContext *c, const char *host,
                                       int (*keep)(const char *id, void *arg), void *arg,
                                       long long *n)
{
    redisReply *ids, *st;
    int rc = 0;

    *n = 0;
    if (sync_ok(ids = sf_redis_sync_cmd(c, "SMEMBERS " SF_RK_HOST_SANDBOXES, host)) < 0)
        return -EIO;
    for (size_t i = 0; rc >= 0 && ids->type == REDIS_REPLY_ARRAY && i < ids->elements; i++) {
        const char *id = ids->element[i]->str;
        int creating;
        if (ids->element[i]->type != REDIS_REPLY_STRING || ids->element[i]->len >= SF_ID_MAX)
            continue;
        if (keep && keep(id, arg))
            continue;
        if (sync_ok(st = sf_redis_sync_cmd(c, "HGET " SF_RK_SANDBOX " state", id)) < 0) {
            rc = -EIO;
            break;
        }
        /* A record still `creating` stays: its create job may still be on its way to the
         * restarted worker, which then starts it (no orphan, no false `lost`). */
        creating = st->type == REDIS_REPLY_STRING && !strcmp(st->str, "creating");
        freeReplyObject(st);
        if (!creating && (rc = retire_lost_sync(c, host, id)) > 0)
            (*n)++;
    }
    freeReplyObject(ids);
    return rc < 0 ? rc : 0;
}

/* ---- the reaper: hosts silent for dead_ms ---- */

typedef struct reap_op {
    sf_redis *r;
    redisCallbackFn *cb;
    void *priv;
    char cutoff[24];
    char (*hosts)[SF_ID_MAX];
    size_t nhosts, hi;
    char (*ids)[SF_ID_MAX];
    size_t nids, ii;
    char (*tpls)[256];      /* the host's templates: "<team> <name>" */
    size_t ntpls, ti;
    long long removed;
} reap_op;

static void reap_host(reap_op *op);

static void reap_done(reap_op *op, redisAsyncContext *ac, redisReply *rep)
{
    redisReply n = {.type = REDIS_REPLY_INTEGER, .integer = op->removed};

    if (op->cb)
        op->cb(ac, rep ? rep : &n, op->priv);
    free(op->hosts);
    free(op->ids);
    free(op->tpls);
    free(op);
}

static void reap_next_host(reap_op *op)
{
    op->hi++;
    reap_host(op);
}

static void on_reap_retired(redisAsyncContext *ac, void *r, void *priv);
static void on_reap_tpl(redisAsyncContext *ac, void *r, void *priv);

/* The host's next template still building there (it failed with the host), or its keys
 * once all are done. */
static void reap_tpl(reap_op *op)
{
    const char *h = op->hosts[op->hi];
    char key[400], why[256], now[24];

    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(why, sizeof(why), "Host %s went down while it built this template; a failed "
             "template can be built again under its name.", h);
    while (op->ti < op->ntpls) {
        const char *e = op->tpls[op->ti++], *sp = strchr(e, ' ');
        char res[200];
        const char *argv[] = {key, res, h, why, now, sp ? sp + 1 : ""};
        size_t lens[6];

        if (!sp || snprintf(key, sizeof(key), "sf:team:{%.*s}:tpl:%s", (int)(sp - e), e,
                            sp + 1) >= (int)sizeof(key) ||
            snprintf(res, sizeof(res), "sf:team:{%.*s}:res", (int)(sp - e), e) >= /* SF_RK_TEAM_RES */
                (int)sizeof(res))
            continue;
        for (int i = 0; i < 6; i++)
            lens[i] = strlen(argv[i]);
        /* (and the build's part of the team's share: worker/tpl_build.c reserve()) */
        if (sf_redis_script_call(op->r, &sf_store_tpl_host_lost, on_reap_tpl, op, 2, 4, argv,
                                 lens) == 0)
            return;
    }
    sf_redis_cmd(op->r, NULL, NULL, "DEL " SF_RK_HOST " " SF_RK_HOST_SANDBOXES " " SF_RK_HOST_RES
                 " " SF_RK_HOST_TEMPLATES, h, h, h, h);
    reap_next_host(op);
}

static void on_reap_tpl(redisAsyncContext *ac, void *r, void *priv)
{
    reap_tpl(priv);
}

static void on_reap_tpls(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    reap_op *op = priv;

    free(op->tpls);
    op->tpls = NULL;
    op->ntpls = op->ti = 0;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements &&
        (op->tpls = calloc(rep->elements, sizeof(*op->tpls))))
        for (size_t i = 0; i < rep->elements; i++)
            if (rep->element[i]->type == REDIS_REPLY_STRING &&
                rep->element[i]->len < sizeof(*op->tpls))
                memcpy(op->tpls[op->ntpls++], rep->element[i]->str, rep->element[i]->len + 1);
    reap_tpl(op);
}

/* The host's next sandbox, then its templates. */
static void reap_sandbox(reap_op *op)
{
    const char *h = op->hosts[op->hi];

    while (op->ii < op->nids) {
        if (sf_records_retire(op->r, op->ids[op->ii++], "lost", 1, on_reap_retired, op) == 0)
            return;
    }
    if (sf_redis_cmd(op->r, on_reap_tpls, op, "SMEMBERS " SF_RK_HOST_TEMPLATES, h) < 0)
        on_reap_tpls(NULL, NULL, op);
}

static void on_reap_retired(redisAsyncContext *ac, void *r, void *priv)
{
    reap_sandbox(priv);
}

static void on_reap_members(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    reap_op *op = priv;

    free(op->ids);
    op->ids = NULL;
    op->nids = op->ii = 0;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements &&
        (op->ids = calloc(rep->elements, sizeof(*op->ids))))
        for (size_t i = 0; i < rep->elements; i++)
            if (rep->element[i]->type == REDIS_REPLY_STRING && rep->element[i]->len < SF_ID_MAX)
                memcpy(op->ids[op->nids++], rep->element[i]->str, rep->element[i]->len + 1);
    reap_sandbox(op);
}

static void on_reap_dropped(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    reap_op *op = priv;

    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        reap_done(op, ac, rep);
        return;
    }
    if (rep->integer != 1) { /* it beat again meanwhile */
        reap_next_host(op);
        return;
    }
    op->removed++;
    if (sf_redis_cmd(op->r, on_reap_members, op, "SMEMBERS " SF_RK_HOST_SANDBOXES,
                     op->hosts[op->hi]) < 0)
        reap_done(op, NULL, NULL);
}

static void reap_host(reap_op *op)
{
    const char *argv[] = {SF_RK_HOSTS, op->hosts[op->hi], op->cutoff};
    size_t lens[3];

    if (op->hi >= op->nhosts) {
        reap_done(op, NULL, NULL);
        return;
    }
    for (int i = 0; i < 3; i++)
        lens[i] = strlen(argv[i]);
    if (sf_redis_script_call(op->r, &sf_store_hosts_drop, on_reap_dropped, op, 1, 2, argv,
                             lens) < 0)
        reap_done(op, NULL, NULL);
}

static void on_reap_list(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    reap_op *op = priv;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        reap_done(op, ac, rep);
        return;
    }
    if (rep->elements && !(op->hosts = calloc(rep->elements, sizeof(*op->hosts)))) {
        reap_done(op, ac, NULL);
        return;
    }
    for (size_t i = 0; i < rep->elements; i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING && rep->element[i]->len < SF_ID_MAX)
            memcpy(op->hosts[op->nhosts++], rep->element[i]->str, rep->element[i]->len + 1);
    reap_host(op);
}

int sf_records_reap(sf_redis *r, int64_t now_ms, int64_t dead_ms, redisCallbackFn *cb,
                    void *priv)
{
    reap_op *op = calloc(1, sizeof(*op));

    if (!op)
        return -ENOMEM;
    op->r = r;
    op->cb = cb;
    op->priv = priv;
    snprintf(op->cutoff, sizeof(op->cutoff), "%lld", (long long)(now_ms - dead_ms));
    if (sf_redis_cmd(r, on_reap_list, op, "ZRANGEBYSCORE " SF_RK_HOSTS " -inf (%s",
                     op->cutoff) < 0) {
        free(op);
        return -ENOTCONN;
    }
    return 0;
}

/* ---- the worker's writes ---- */

int sf_records_heartbeat_sync(redisContext *c, const char *host, int64_t now_ms,
                              int64_t expire_ms, size_t nkv, const char *const *kv, char *err,
                              size_t errlen)
{
    const char *argv[2 + KV_MAX];
    char key[128], now[24], expire[24];
    redisReply *rep;
    int argc = 0, rc = 0;

    if (nkv % 2 || nkv > KV_MAX)
        return -EINVAL;
    for (size_t i = 0; i + 1 < nkv; i += 2)
        if (!strncmp(kv[i], "res_", 4)) /* (the scheduler's, before sf:host:{h}:res) */
            return -EINVAL;
    if (keyf(key, sizeof(key), SF_RK_HOST, host) < 0)
        return -EINVAL;
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(expire, sizeof(expire), "%lld", (long long)expire_ms);
    argv[argc++] = key;
    argv[argc++] = expire;
    for (size_t i = 0; i < nkv; i++)
        argv[argc++] = kv[i];
    /* the host's hash, then its score among the live hosts (another slot) */
    if (!(rep = sf_redis_script_sync(c, &sf_store_host_beat, 1, argc - 1, argv, NULL)))
        return -EIO;
    if (rep->type != REDIS_REPLY_ERROR) {
        const char *beat[] = {SF_RK_HOSTS, host, now};
        freeReplyObject(rep);
        if (!(rep = sf_redis_script_sync(c, &sf_store_hosts_beat, 1, 2, beat, NULL)))
            return -EIO;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "%s", rep->str);
        rc = -EPROTO;
    }
    freeReplyObject(rep);
    return rc;
}

/* One key, then args (NUL-terminated strings). */
static int call_one_key(sf_redis *r, sf_redis_script *s, const char *key, size_t nargs,
                        const char *const *args, redisCallbackFn *cb, void *priv)
{
    const char *argv[1 + KV_MAX];
    size_t lens[1 + KV_MAX];

    if (nargs > KV_MAX)
        return -EINVAL;
    argv[0] = key;
    lens[0] = strlen(key);
    for (size_t i = 0; i < nargs; i++) {
        argv[1 + i] = args[i];
        lens[1 + i] = strlen(args[i]);
    }
    return sf_redis_script_call(r, s, cb ? cb : ignore_reply, priv, 1, (int)nargs, argv, lens);
}

int sf_records_started(sf_redis *r, const char *id, const char *host, size_t nkv,
                       const char *const *kv, redisCallbackFn *cb, void *priv)
{
    const char *all[1 + KV_MAX];
    char key[128];

    if (nkv % 2 || nkv + 1 > KV_MAX || strlen(id) >= SF_ID_MAX)
        return -EINVAL;
    for (size_t i = 0; i + 1 < nkv; i += 2)
        if (!strncmp(kv[i], "res_", 4) || !strcmp(kv[i], "state"))
            return -EINVAL;
    all[0] = host;
    for (size_t i = 0; i < nkv; i++)
        all[1 + i] = kv[i];
    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    return call_one_key(r, &sf_store_rec_started, key, nkv + 1, all, cb, priv);
}

int sf_records_touch(sf_redis *r, const char *id, int64_t now_ms, redisCallbackFn *cb,
                     void *priv)
{
    char key[128], now[24];
    const char *args[] = {now};

    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    return call_one_key(r, &sf_store_rec_touch, key, 1, args, cb, priv);
}

int sf_records_set(sf_redis *r, const char *id, size_t nkv, const char *const *kv,
                   redisCallbackFn *cb, void *priv)
{
    char key[128];

    if (nkv == 0 || nkv % 2)
        return -EINVAL;
    for (size_t i = 0; i < nkv; i += 2)
        if (!strncmp(kv[i], "res_", 4) || !strcmp(kv[i], "state") || !strcmp(kv[i], "team") ||
            !strcmp(kv[i], "host"))
            return -EINVAL;
    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    return call_one_key(r, &sf_store_rec_set, key, nkv, kv, cb, priv);
}

int sf_records_unset(sf_redis *r, const char *id, size_t n, const char *const *fields,
                     redisCallbackFn *cb, void *priv)
{
    char key[128];

    if (n == 0)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(fields[i], "pv:", 3) != 0)
            return -EINVAL;
    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    return call_one_key(r, &sf_store_rec_unset, key, n, fields, cb, priv);
}
