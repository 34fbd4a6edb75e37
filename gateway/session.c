/* session.c: MCP sessions (session.h): the per-instance cache, the record in Redis, its
 * TTL and LRU rank, recreation on the spot, create / delete / log level, and the MCP log
 * levels. */
#include "session.h"
#include "sf_log.h"
#include "sf_store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SESS_CACHE_MAX 262144
#define TOUCH_EVERY_MS 30000 /* a used session's TTL and LRU rank are refreshed this often */

/* Bumped (process-wide) whenever a session is deleted here: a session cached by any
 * thread before the bump is checked against Redis again, so a DELETE answered on one
 * thread is seen at once by the others (other processes learn it over pub/sub). */
static unsigned long sess_gen;

/* ------------------------------------------------------------------ log levels */

static const char *const log_levels[] = {"debug", "info", "notice", "warning", "error",
                                         "critical", "alert", "emergency"};

int gw_session_level_parse(const char *name)
{
    for (size_t i = 0; name && i < SF_ARRAY_LEN(log_levels); i++)
        if (!strcmp(name, log_levels[i]))
            return (int)i;
    return -1;
}

const char *gw_session_level_name(int level)
{
    return (level >= 0 && level < (int)SF_ARRAY_LEN(log_levels)) ? log_levels[level] : "info";
}

/* ------------------------------------------------------------------ cache */

static void free_entry(const char *key, void *val, void *arg)
{
    free(val);
}

void gw_session_cache_clear(gw_ctx *ctx)
{
    if (ctx->sess_cache)
        sf_map_foreach(ctx->sess_cache, free_entry, NULL);
    sf_map_free(ctx->sess_cache);
    ctx->sess_cache = sf_map_new(SESS_CACHE_MAX);
}

void gw_session_cache_free(gw_ctx *ctx)
{
    if (ctx->sess_cache)
        sf_map_foreach(ctx->sess_cache, free_entry, NULL);
    sf_map_free(ctx->sess_cache);
    ctx->sess_cache = NULL;
}

static gw_session *sess_cache_put(gw_ctx *ctx, const char *sid, const char *team,
                                  const char *protocol, int level)
{
    gw_session *s;

    if (!ctx->sess_cache)
        return NULL;
    if (!(s = sf_map_get(ctx->sess_cache, sid))) {
        if (sf_map_len(ctx->sess_cache) >= SESS_CACHE_MAX)
            gw_session_cache_clear(ctx);
        if (!ctx->sess_cache || !(s = calloc(1, sizeof(*s))))
            return NULL;
        if (sf_map_put(ctx->sess_cache, sid, s) < 0) {
            free(s);
            return NULL;
        }
    }
    snprintf(s->id, sizeof(s->id), "%s", sid);
    snprintf(s->team, sizeof(s->team), "%s", team);
    snprintf(s->protocol, sizeof(s->protocol), "%s", protocol);
    s->level = level;
    s->gen = __atomic_load_n(&sess_gen, __ATOMIC_ACQUIRE);
    return s;
}

gw_session *gw_session_known(gw_ctx *ctx, const char *sid)
{
    gw_session *s = ctx->sess_cache ? sf_map_get(ctx->sess_cache, sid) : NULL;

    if (s && s->gen != __atomic_load_n(&sess_gen, __ATOMIC_ACQUIRE))
        return NULL; /* a session was deleted since: ask Redis */
    return s;
}

void gw_session_forget(gw_ctx *ctx, const char *sid)
{
    if (ctx->sess_cache)
        free(sf_map_del(ctx->sess_cache, sid));
}

/* The session's TTL and its rank in the team's LRU set, at most every TOUCH_EVERY_MS. */
void gw_session_touch(gw_ctx *ctx, gw_session *s, int force)
{
    int64_t now = sf_mono_ms(), ttl = ctx->cfg.session_ttl_s;

    if (!force && now - s->touched_ms < TOUCH_EVERY_MS)
        return;
    s->touched_ms = now;
    sf_redis_cmd(ctx->redis, NULL, NULL, "EXPIRE " SF_RK_SESSION " %lld", s->id, (long long)ttl);
    sf_redis_cmd(ctx->redis, NULL, NULL, "ZADD " SF_RK_TEAM_SESSIONS " %lld %s", s->team,
                 (long long)sf_now_ms(), s->id);
    sf_redis_cmd(ctx->redis, NULL, NULL, "PEXPIRE " SF_RK_TEAM_SESSIONS " %lld", s->team,
                 (long long)ttl * 1000);
}

static const char *valid_protocol(const char *p)
{
    static const char *const versions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                           "2024-11-05"};
    for (size_t i = 0; p && i < SF_ARRAY_LEN(versions); i++)
        if (!strcmp(p, versions[i]))
            return versions[i];
    return versions[0];
}

/* ------------------------------------------------------------------ the record */

int gw_session_fetch(gw_ctx *ctx, const char *sid, redisCallbackFn *cb, void *arg)
{
    return sf_redis_cmd(ctx->redis, cb, arg, "HMGET " SF_RK_SESSION " team protocol deleted level",
                        sid) < 0 ? -EIO : 0;
}

static void copy_str(const redisReply *rep, char *dst, size_t n)
{
    if (rep && rep->type == REDIS_REPLY_STRING && rep->len < n) {
        memcpy(dst, rep->str, rep->len);
        dst[rep->len] = '\0';
    }
}

int gw_session_parse(const redisReply *rep, gw_session_rec *rec)
{
    memset(rec, 0, sizeof(*rec));
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 4)
        return -EIO;
    if (rep->element[0]->type == REDIS_REPLY_STRING) {
        rec->found = 1;
        copy_str(rep->element[0], rec->team, sizeof(rec->team));
        copy_str(rep->element[1], rec->protocol, sizeof(rec->protocol));
        rec->deleted = rep->element[2]->type == REDIS_REPLY_STRING;
        rec->level = GW_LOG_LEVEL_DEFAULT;
        if (rep->element[3]->type == REDIS_REPLY_STRING)
            rec->level = gw_session_level_parse(rep->element[3]->str);
        if (rec->level < 0)
            rec->level = GW_LOG_LEVEL_DEFAULT;
    }
    return 0;
}

int gw_session_resolve(gw_ctx *ctx, const char *sid, const char *team, const gw_session_rec *rec,
                       const char *protocol, gw_session **out)
{
    gw_session *s = NULL;

    if (rec->found && strcmp(team, rec->team) != 0)
        return 404; /* another team's session */
    if (rec->found && rec->deleted)
        return 404; /* deleted by its client: a tombstone */
    if (rec->found) {
        s = sess_cache_put(ctx, sid, team, rec->protocol, rec->level);
        if (s)
            gw_session_touch(ctx, s, 1);
    } else {
        /* Unknown here (expired, evicted): recreate it for this team. */
        const char *proto = valid_protocol(protocol);
        char now[24];

        snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
        sf_redis_cmd(ctx->redis, NULL, NULL,
                     "HSET " SF_RK_SESSION " team %s protocol %s created %s recreated 1", sid,
                     team, proto, now);
        s = sess_cache_put(ctx, sid, team, proto, GW_LOG_LEVEL_DEFAULT);
        if (s)
            gw_session_touch(ctx, s, 1);
        sf_info("msg=\"session recreated\" session=%s team=%s", sid, team);
    }
    if (!s)
        return 503;
    *out = s;
    return 200;
}

/* ------------------------------------------------------------------ create, delete, level */

/* A new session is two single-slot steps (common/sf_store.c): the session's hash
 * (sess_put; refused whole when Redis is full: 507), then the team's sessions zset
 * (sess_team), which answers the least recently used sessions beyond the team's limit;
 * each of those is deleted (its own slot). */
typedef struct session_op {
    gw_ctx *ctx;
    gw_session_cb cb;
    void *arg;
    char sid[SF_ID_MAX];
    char team[SF_ID_MAX];
    char protocol[16];
    char now[24], ttl[24];
} session_op;

static void session_answer(session_op *op, int ok, const redisReply *rep)
{
    gw_session *s = NULL;

    if (ok && (s = sess_cache_put(op->ctx, op->sid, op->team, op->protocol,
                                  GW_LOG_LEVEL_DEFAULT)))
        s->touched_ms = sf_mono_ms();
    op->cb(op->arg, s ? 200 : sf_redis_is_oom(rep) ? 507 : 503, s ? op->sid : NULL);
    free(op);
}

static void on_session_team(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    session_op *op = priv;
    size_t n = 0;

    if (rep && rep->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < rep->elements; i++)
            if (rep->element[i]->type == REDIS_REPLY_STRING && sf_id_valid(rep->element[i]->str) &&
                sf_redis_cmd(op->ctx->redis, NULL, NULL, "DEL " SF_RK_SESSION,
                             rep->element[i]->str) == 0)
                n++;
        if (n)
            sf_info("msg=\"sessions evicted (least recently used)\" team=%s n=%zu", op->team, n);
    }
    session_answer(op, rep && rep->type == REDIS_REPLY_ARRAY, rep);
}

static void on_session_created(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    session_op *op = priv;
    char key[128], limit[24];
    const char *argv[] = {key, op->sid, op->now, op->ttl, limit};
    size_t lens[SF_ARRAY_LEN(argv)];

    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        session_answer(op, 0, rep);
        return;
    }
    snprintf(key, sizeof(key), SF_RK_TEAM_SESSIONS, op->team);
    snprintf(limit, sizeof(limit), "%lld", (long long)op->ctx->cfg.max_sessions_team);
    for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    if (sf_redis_script_call(op->ctx->redis, &sf_store_sess_team, on_session_team, op, 1, 4,
                             argv, lens) < 0)
        session_answer(op, 0, NULL);
}

void gw_session_create(gw_ctx *ctx, const char *team, const char *protocol, gw_session_cb cb,
                       void *arg)
{
    session_op *op = calloc(1, sizeof(*op));
    char key[128];

    if (!op || sf_id_new(op->sid, "mcp_") < 0) {
        free(op);
        cb(arg, 503, NULL);
        return;
    }
    op->ctx = ctx;
    op->cb = cb;
    op->arg = arg;
    snprintf(op->team, sizeof(op->team), "%s", team);
    snprintf(op->protocol, sizeof(op->protocol), "%s", protocol);
    snprintf(op->now, sizeof(op->now), "%lld", (long long)sf_now_ms());
    snprintf(op->ttl, sizeof(op->ttl), "%lld", (long long)ctx->cfg.session_ttl_s);
    snprintf(key, sizeof(key), SF_RK_SESSION, op->sid);
    {
        const char *argv[] = {key, op->team, op->protocol, op->now, op->ttl};
        size_t lens[SF_ARRAY_LEN(argv)];
        for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
            lens[i] = strlen(argv[i]);
        if (sf_redis_script_call(ctx->redis, &sf_store_sess_put, on_session_created, op, 1, 4,
                                 argv, lens) < 0) {
            free(op);
            cb(arg, 503, NULL);
        }
    }
}

typedef struct delete_op {
    void (*cb)(void *arg, int ok);
    void *arg;
} delete_op;

static void on_deleted(redisAsyncContext *ac, void *r, void *priv)
{
    delete_op *op = priv;
    redisReply *rep = r;

    __atomic_fetch_add(&sess_gen, 1, __ATOMIC_RELEASE); /* after the tombstone is written */
    /* 1 written, 0 Redis unreachable, -1 Redis full (the tombstone was refused) */
    op->cb(op->arg, rep && rep->type == REDIS_REPLY_INTEGER ? 1 : sf_redis_is_oom(rep) ? -1 : 0);
    free(op);
}

/* The client ended it: a tombstone for the session lifetime, announced to every gateway;
 * cb runs once the tombstone is written. */
void gw_session_delete(gw_ctx *ctx, const char *team, const char *sid,
                       void (*cb)(void *arg, int ok), void *arg)
{
    delete_op *op;

    if (!sf_id_valid(sid) || !(op = calloc(1, sizeof(*op)))) {
        cb(arg, 0);
        return;
    }
    op->cb = cb;
    op->arg = arg;
    free(sf_map_del(ctx->sess_cache, sid));
    if (sf_redis_cmd(ctx->redis, on_deleted, op, "HSET " SF_RK_SESSION " team %s deleted 1", sid,
                     team) < 0) {
        free(op);
        cb(arg, 0);
        return;
    }
    sf_redis_cmd(ctx->redis, NULL, NULL, "EXPIRE " SF_RK_SESSION " %lld", sid,
                 (long long)ctx->cfg.session_ttl_s);
    sf_redis_cmd(ctx->redis, NULL, NULL, "ZREM " SF_RK_TEAM_SESSIONS " %s", team, sid);
    sf_redis_cmd(ctx->redis, NULL, NULL, "PUBLISH " SF_CH_GATEWAY " sess:%s", sid);
}

typedef struct level_op {
    void (*cb)(void *arg, int ok);
    void *arg;
    char sid[SF_ID_MAX];
} level_op;

static void on_level_set(redisAsyncContext *ac, void *r, void *priv)
{
    level_op *op = priv;
    redisReply *rep = r;
    int ok = rep && rep->type == REDIS_REPLY_INTEGER ? 1 : sf_redis_is_oom(rep) ? -1 : 0;

    if (ok < 0)
        sf_warn("msg=\"session log level not kept: Redis is full\" session=%s", op->sid);
    op->cb(op->arg, ok);
    free(op);
}

void gw_session_set_level(gw_ctx *ctx, gw_session *s, int level, void (*cb)(void *arg, int ok),
                          void *arg)
{
    level_op *op = calloc(1, sizeof(*op));

    if (!op) {
        cb(arg, 0);
        return;
    }
    op->cb = cb;
    op->arg = arg;
    snprintf(op->sid, sizeof(op->sid), "%s", s->id);
    s->level = level;
    if (sf_redis_cmd(ctx->redis, on_level_set, op, "HSET " SF_RK_SESSION " level %s", s->id,
                     gw_session_level_name(level)) < 0) {
        free(op);
        cb(arg, 0);
        return;
    }
    /* the other gateways (and threads) read it again from Redis */
    sf_redis_cmd(ctx->redis, NULL, NULL, "PUBLISH " SF_CH_GATEWAY " sess:%s", s->id);
}
