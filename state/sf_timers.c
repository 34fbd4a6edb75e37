#include "sf_timers.h"
#include "sf_store.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Each change is two single-slot steps (sf_store.h): the record (its state and fields,
 * the verdict), then the host's timers zset with what the record step decided. A timer
 * whose record step did not land fires and finds the record unchanged (the worker checks
 * the state); a timer step that did not land (Redis went away between) leaves the
 * sandbox without that timer until the next change or the worker's restart. */

enum { TM_START, TM_TOUCH, TM_PAUSED, TM_RESUMED, TM_UPDATE };

static redisReply tm_verdict[2] = {{.type = REDIS_REPLY_INTEGER, .integer = 0},
                                   {.type = REDIS_REPLY_INTEGER, .integer = 1}};

typedef struct tm_op {
    sf_redis *r;
    int kind, verdict;
    redisCallbackFn *cb;
    void *priv;
    char id[SF_ID_MAX], host[SF_ID_MAX];
    int64_t now, timeout_at, idle;
    char word[2][32]; /* sandbox_update's verdict and state */
} tm_op;

static void tm_done(tm_op *op, redisAsyncContext *ac, redisReply *err)
{
    if (err) {
        op->cb(ac, err, op->priv);
    } else if (op->kind == TM_UPDATE) {
        redisReply e[2] = {{.type = REDIS_REPLY_STRING, .str = op->word[0],
                            .len = strlen(op->word[0])},
                           {.type = REDIS_REPLY_STRING, .str = op->word[1],
                            .len = strlen(op->word[1])}};
        redisReply *ev[2] = {&e[0], &e[1]};
        redisReply out = {.type = REDIS_REPLY_ARRAY, .elements = 2, .element = ev};
        op->cb(ac, &out, op->priv);
    } else {
        op->cb(ac, &tm_verdict[op->verdict], op->priv);
    }
    free(op);
}

static void ignore(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac, (void)r, (void)priv;
}

static void on_timers_step(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;

    tm_done(priv, ac, !rep || rep->type == REDIS_REPLY_ERROR ? rep : NULL);
}

/* Applies n (op, member, score) triples to op's host's timers; then answers. */
static void timers_step(tm_op *op, redisAsyncContext *ac, sf_redis_script *s, size_t n,
                        const char *const *ops)
{
    const char *argv[1 + 3 * 8];
    size_t lens[SF_ARRAY_LEN(argv)];
    char key[128];
    int w = snprintf(key, sizeof(key), SF_RK_HOST_TIMERS, op->host);

    if (n == 0 || n > 8 || w < 0 || (size_t)w >= sizeof(key)) {
        tm_done(op, ac, NULL);
        return;
    }
    argv[0] = key;
    for (size_t i = 0; i < 3 * n; i++)
        argv[1 + i] = ops[i];
    for (size_t i = 0; i < 1 + 3 * n; i++)
        lens[i] = strlen(argv[i]);
    if (sf_redis_script_call(op->r, s, on_timers_step, op, 1, (int)(3 * n), argv, lens) < 0)
        tm_done(op, ac, NULL);
}

static int64_t int_at(const redisReply *rep, size_t i)
{
    if (i >= rep->elements)
        return 0;
    if (rep->element[i]->type == REDIS_REPLY_INTEGER)
        return rep->element[i]->integer;
    if (rep->element[i]->type == REDIS_REPLY_STRING)
        return strtoll(rep->element[i]->str, NULL, 10);
    return 0;
}

static void on_record_step(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tm_op *op = priv;
    char a[2][80], at[2][24];
    const char *ops[3 * 8];
    size_t n = 0;
    sf_redis_script *s = &sf_store_timers_set;

    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        tm_done(op, ac, rep);
        return;
    }
#define TIMER(o, kind, ms)                                                                     \
    do {                                                                                       \
        snprintf(a[n], sizeof(a[n]), "%c:%s", (kind), op->id);                                 \
        snprintf(at[n], sizeof(at[n]), "%lld", (long long)(ms));                               \
        ops[3 * n] = (o), ops[3 * n + 1] = a[n], ops[3 * n + 2] = at[n];                       \
        n++;                                                                                   \
    } while (0)
    switch (op->kind) {
    case TM_START: /* 1 or 0 */
        if (!(op->verdict = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1))
            break;
        s = &sf_store_timers_grow; /* a new sandbox's timers need room */
        TIMER("a", SF_TIMER_TIMEOUT, op->timeout_at);
        if (op->idle > 0)
            TIMER("a", SF_TIMER_IDLE, op->now + op->idle);
        break;
    case TM_TOUCH: /* idle_ms */
        op->verdict = 0;
        if (rep->type == REDIS_REPLY_STRING && (op->idle = strtoll(rep->str, NULL, 10)) > 0)
            TIMER("x", SF_TIMER_IDLE, op->now + op->idle);
        break;
    case TM_PAUSED: /* {1, auto_delete_s} or {0} */
    case TM_RESUMED: /* {1, idle_ms} or {0} */
        if (!(op->verdict = rep->type == REDIS_REPLY_ARRAY && int_at(rep, 0) == 1))
            break;
        if (op->kind == TM_PAUSED) {
            TIMER("r", SF_TIMER_IDLE, 0);
            if (int_at(rep, 1) > 0)
                TIMER("a", SF_TIMER_DELETE, op->now + int_at(rep, 1) * 1000);
        } else {
            TIMER("r", SF_TIMER_DELETE, 0);
            if (int_at(rep, 1) > 0)
                TIMER("a", SF_TIMER_IDLE, op->now + int_at(rep, 1));
        }
        break;
    default: /* TM_UPDATE: {verdict, state, host, (op, member, score)...} */
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 2) {
            tm_done(op, ac, rep);
            return;
        }
        for (size_t i = 0; i < 2; i++)
            snprintf(op->word[i], sizeof(op->word[i]), "%s",
                     rep->element[i]->type == REDIS_REPLY_STRING ? rep->element[i]->str : "");
        if (rep->elements >= 3 && rep->element[2]->type == REDIS_REPLY_STRING &&
            rep->element[2]->len < SF_ID_MAX)
            snprintf(op->host, sizeof(op->host), "%s", rep->element[2]->str);
        for (size_t i = 3; i + 2 < rep->elements && n < 8; i += 3, n++)
            for (size_t k = 0; k < 3; k++)
                ops[3 * n + k] = rep->element[i + k]->type == REDIS_REPLY_STRING
                                     ? rep->element[i + k]->str
                                     : "";
        /* (ops point into rep: used before this callback returns) */
        if (n && op->host[0]) {
            timers_step(op, ac, s, n, ops);
            return;
        }
        n = 0;
        break;
    }
#undef TIMER
    if (n)
        timers_step(op, ac, s, n, ops);
    else
        tm_done(op, ac, NULL);
}

/* Starts op: the record step (script, or HGET idle_ms for a touch). */
static int tm_begin(sf_redis *r, int kind, const char *id, const char *host, int64_t now,
                    int nargs, const char *const *args, redisCallbackFn *cb, void *priv,
                    tm_op **out)
{
    static sf_redis_script *const script[] = {
        [TM_START] = &sf_store_tm_start, [TM_PAUSED] = &sf_store_tm_paused,
        [TM_RESUMED] = &sf_store_tm_resumed, [TM_UPDATE] = &sf_store_tm_update};
    const char *argv[1 + 8];
    size_t lens[1 + 8];
    char key[128];
    tm_op *op;
    int w, rc;

    if (!id || (kind != TM_UPDATE && !host) || nargs > 8 || strlen(id) >= SF_ID_MAX ||
        (host && strlen(host) >= SF_ID_MAX))
        return -EINVAL;
    w = snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    if (w < 0 || (size_t)w >= sizeof(key))
        return -ENAMETOOLONG;
    if (!(op = calloc(1, sizeof(*op))))
        return -ENOMEM;
    op->r = r;
    op->kind = kind;
    op->cb = cb ? cb : ignore;
    op->priv = priv;
    op->now = now;
    snprintf(op->id, sizeof(op->id), "%s", id);
    snprintf(op->host, sizeof(op->host), "%s", host ? host : "");
    if (out)
        *out = op;
    if (kind == TM_TOUCH) {
        rc = sf_redis_cmd(r, on_record_step, op, "HGET %s idle_ms", key);
    } else {
        argv[0] = key;
        for (int i = 0; i < nargs; i++)
            argv[1 + i] = args[i];
        for (int i = 0; i < 1 + nargs; i++)
            lens[i] = strlen(argv[i]);
        rc = sf_redis_script_call(r, script[kind], on_record_step, op, 1, nargs, argv, lens);
    }
    if (rc < 0)
        free(op);
    return rc;
}

int sf_timers_start(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                    int64_t timeout_at, int64_t lifetime_at, int64_t idle_ms,
                    int64_t auto_delete_s, redisCallbackFn *cb, void *priv)
{
    char a[5][24];
    const char *args[] = {a[0], a[1], a[2], a[3], a[4]};
    tm_op *op = NULL;
    int rc;

    idle_ms = idle_ms > 0 ? idle_ms : 0;
    snprintf(a[0], sizeof(a[0]), "%lld", (long long)now_ms);
    snprintf(a[1], sizeof(a[1]), "%lld", (long long)timeout_at);
    snprintf(a[2], sizeof(a[2]), "%lld", (long long)lifetime_at);
    snprintf(a[3], sizeof(a[3]), "%lld", (long long)idle_ms);
    snprintf(a[4], sizeof(a[4]), "%lld", (long long)(auto_delete_s > 0 ? auto_delete_s : 0));
    rc = tm_begin(r, TM_START, id, host, now_ms, 5, args, cb, priv, &op);
    if (rc == 0) { /* (the reply comes from the event loop, after this) */
        op->timeout_at = timeout_at;
        op->idle = idle_ms;
    }
    return rc;
}

static int now_op(sf_redis *r, int kind, const char *id, const char *host, int64_t now_ms,
                  redisCallbackFn *cb, void *priv)
{
    char now[24];
    const char *args[] = {now};

    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    return tm_begin(r, kind, id, host, now_ms, kind == TM_RESUMED ? 0 : 1, args, cb, priv, NULL);
}

int sf_timers_touch(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                    redisCallbackFn *cb, void *priv)
{
    return now_op(r, TM_TOUCH, id, host, now_ms, cb, priv);
}

int sf_timers_paused(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                     redisCallbackFn *cb, void *priv)
{
    return now_op(r, TM_PAUSED, id, host, now_ms, cb, priv);
}

int sf_timers_resumed(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                      redisCallbackFn *cb, void *priv)
{
    return now_op(r, TM_RESUMED, id, host, now_ms, cb, priv);
}

int sf_timers_due(sf_redis *r, const char *host, int64_t now_ms, int max, redisCallbackFn *cb,
                  void *priv)
{
    char key[128], now[24], n[16];
    const char *argv[] = {key, now, n};
    size_t lens[3];
    int w = snprintf(key, sizeof(key), SF_RK_HOST_TIMERS, host ? host : "");

    if (!host || w < 0 || (size_t)w >= sizeof(key) || max < 1)
        return -EINVAL;
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(n, sizeof(n), "%d", max);
    for (int i = 0; i < 3; i++)
        lens[i] = strlen(argv[i]);
    return sf_redis_script_call(r, &sf_store_timers_due, cb, priv, 1, 2, argv, lens);
}

int sf_timers_set(sf_redis *r, const char *host, char kind, const char *id, int64_t at_ms,
                  redisCallbackFn *cb, void *priv)
{
    char key[128], at[24], member[80];
    const char *argv[] = {"ZADD", key, at, member};
    int w = snprintf(key, sizeof(key), SF_RK_HOST_TIMERS, host ? host : "");
    int m = snprintf(member, sizeof(member), "%c:%s", kind, id ? id : "");

    if (!host || !id || w < 0 || (size_t)w >= sizeof(key) || m < 0 || (size_t)m >= sizeof(member))
        return -EINVAL;
    snprintf(at, sizeof(at), "%lld", (long long)at_ms);
    return sf_redis_cmdargv(r, cb, priv, (int)SF_ARRAY_LEN(argv), argv, NULL);
}

int sf_timers_clear_host_sync(redisContext *c, const char *host)
{
    char key[128];
    redisReply *rep;
    int w = snprintf(key, sizeof(key), SF_RK_HOST_TIMERS, host ? host : "");
    const char *argv[] = {"DEL", key};

    if (!host || w < 0 || (size_t)w >= sizeof(key))
        return -EINVAL;
    if (!(rep = sf_redis_sync_argv(c, 2, argv, NULL)))
        return -EIO;
    w = rep->type == REDIS_REPLY_ERROR ? -EPROTO : 0;
    freeReplyObject(rep);
    return w;
}

int sf_timers_update(sf_redis *r, const char *id, const char *team, int64_t now_ms,
                     const char *metadata, int64_t timeout_s, int64_t auto_delete_s,
                     redisCallbackFn *cb, void *priv)
{
    char now[24], t[24], ad[24];
    const char *args[] = {id, team, now, metadata ? "1" : "0", metadata ? metadata : "", t, ad};

    if (!id || !team)
        return -EINVAL;
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(t, sizeof(t), "%lld", (long long)timeout_s);
    snprintf(ad, sizeof(ad), "%lld", (long long)auto_delete_s);
    return tm_begin(r, TM_UPDATE, id, NULL, now_ms, 7, args, cb, priv, NULL);
}

/* A record's integer field (a string in Redis), or the fallback field, or 0. */
static int64_t field_i64(const json_t *rec, const char *name, const char *fallback)
{
    int64_t n = 0;

    if (sf_parse_i64(json_string_value(json_object_get(rec, name)), 0, INT64_MAX, &n) < 0 &&
        fallback)
        sf_parse_i64(json_string_value(json_object_get(rec, fallback)), 0, INT64_MAX, &n);
    return n;
}

static json_t *iso_ms(int64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    char out[32];

    gmtime_r(&t, &tm);
    strftime(out, sizeof(out), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(out);
}

void sf_timers_view(const json_t *rec, json_t *view)
{
    const char *st = json_string_value(json_object_get(rec, "state"));
    int64_t idle = field_i64(rec, "idle_ms", NULL), ad = field_i64(rec, "auto_delete_seconds", NULL);
    int64_t at = field_i64(rec, "timeout_at", NULL), paused = field_i64(rec, "paused_at", NULL);
    json_t *t;

    if (!view || !st || (strcmp(st, "running") && strcmp(st, "paused")))
        return;
    if (!(t = json_object()))
        return;
    if (at > 0)
        json_object_set_new(t, "timeout_at", iso_ms(at));
    if (!strcmp(st, "running") && idle > 0)
        json_object_set_new(t, "idle_pause_at", iso_ms(field_i64(rec, "last_active", "created") + idle));
    if (!strcmp(st, "paused") && paused > 0) {
        json_object_set_new(view, "paused_at", iso_ms(paused));
        if (ad > 0)
            json_object_set_new(t, "auto_delete_at", iso_ms(paused + ad * 1000));
    }
    if (ad > 0)
        json_object_set_new(view, "auto_delete_seconds", json_integer(ad));
    json_object_set_new(view, "timers", t);
}
