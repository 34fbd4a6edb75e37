/* auth.c: bearer API keys (keyed BLAKE2b hashes in Redis) and MCP sessions, both
 * checked in one pipelined Redis round trip. */
#include "gateway.h"
#include "sf_auth.h"
#include "sf_log.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct auth_op {
    gw_ctx *ctx;
    gw_auth_cb cb;
    void *arg;
    int waiting;      /* replies still to come */
    int status;
    int has_session;
    char team[SF_ID_MAX];
    char session_team[SF_ID_MAX];
    char session_id[SF_ID_MAX];
} auth_op;

static void auth_finish(auth_op *op)
{
    if (op->status == 200 && op->has_session && strcmp(op->team, op->session_team) != 0)
        op->status = 404;
    if (op->status == 200 && op->has_session) { /* sessions live while they are used */
        int64_t ttl = op->ctx->cfg.session_ttl_s;
        sf_redis_cmd(op->ctx->redis, NULL, NULL, "EXPIRE " SF_RK_SESSION " %lld", op->session_id,
                     (long long)ttl);
        sf_redis_cmd(op->ctx->redis, NULL, NULL, "ZADD " SF_RK_TEAM_SESSIONS " XX %lld %s",
                     op->team, (long long)(sf_now_ms() + ttl * 1000), op->session_id);
        sf_redis_cmd(op->ctx->redis, NULL, NULL, "PEXPIRE " SF_RK_TEAM_SESSIONS " %lld", op->team,
                     (long long)ttl * 1000);
    }
    op->cb(op->arg, op->status, op->status == 200 ? op->team : NULL);
    free(op);
}

static void copy_reply(redisReply *rep, char *dst, size_t n, int *status, int missing_status)
{
    if (!rep) {
        *status = 503;
        return;
    }
    if (rep->type != REDIS_REPLY_STRING || rep->len == 0 || rep->len >= n) {
        if (*status == 200)
            *status = rep->type == REDIS_REPLY_ERROR ? 503 : missing_status;
        return;
    }
    memcpy(dst, rep->str, rep->len);
    dst[rep->len] = '\0';
}

static void on_key(redisAsyncContext *ac, void *r, void *priv)
{
    auth_op *op = priv;
    int st = 200;

    copy_reply(r, op->team, sizeof(op->team), &st, 401);
    if (st != 200)
        op->status = st; /* the key's verdict wins over the session's */
    if (--op->waiting == 0)
        auth_finish(op);
}

static void on_session(redisAsyncContext *ac, void *r, void *priv)
{
    auth_op *op = priv;
    int st = 200;

    copy_reply(r, op->session_team, sizeof(op->session_team), &st, 404);
    if (st != 200 && op->status == 200)
        op->status = st;
    if (--op->waiting == 0)
        auth_finish(op);
}

void gw_auth_check(gw_ctx *ctx, const char *authorization, const char *session_id, gw_auth_cb cb,
                   void *arg)
{
    char hash[SF_APIKEY_HASH_HEX];
    auth_op *op;

    if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0) {
        cb(arg, 401, NULL);
        return;
    }
    authorization += 7;
    while (*authorization == ' ')
        authorization++;
    if (sf_apikey_hash(ctx->auth_secret, authorization, hash) < 0) {
        cb(arg, 401, NULL);
        return;
    }
    if (session_id && !sf_id_valid(session_id)) {
        cb(arg, 404, NULL);
        return;
    }
    if (!(op = calloc(1, sizeof(*op)))) {
        cb(arg, 503, NULL);
        return;
    }
    op->ctx = ctx;
    op->cb = cb;
    op->arg = arg;
    op->status = 200;
    op->has_session = session_id != NULL;
    if (session_id)
        snprintf(op->session_id, sizeof(op->session_id), "%s", session_id);
    if (sf_redis_cmd(ctx->redis, on_key, op, "HGET " SF_RK_APIKEY " team", hash) < 0) {
        free(op);
        cb(arg, 503, NULL);
        return;
    }
    op->waiting = 1;
    if (session_id) {
        if (sf_redis_cmd(ctx->redis, on_session, op, "HGET " SF_RK_SESSION " team", session_id) < 0)
            op->status = 503;
        else
            op->waiting++;
    }
}

/* ARGV: sid, team, protocol, now ms, ttl s, team limit. 1 created, 0 team at its limit.
 * The team's zset holds each session's expiry, so expired ones drop out of the count. */
static const char lua_session_create[] =
    "local z = 'sf:team:{' .. ARGV[2] .. '}:sessions'\n"
    "local now, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "redis.call('ZREMRANGEBYSCORE', z, '-inf', now)\n"
    "if redis.call('ZCARD', z) >= tonumber(ARGV[6]) then return 0 end\n"
    "local key = 'sf:mcpsess:{' .. ARGV[1] .. '}'\n"
    "redis.call('HSET', key, 'team', ARGV[2], 'protocol', ARGV[3], 'created', ARGV[4])\n"
    "redis.call('EXPIRE', key, ttl)\n"
    "redis.call('ZADD', z, now + ttl * 1000, ARGV[1])\n"
    "redis.call('PEXPIRE', z, ttl * 1000)\n"
    "return 1\n";

typedef struct session_op {
    gw_session_cb cb;
    void *arg;
    char sid[SF_ID_MAX];
} session_op;

static void on_session_created(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    session_op *op = priv;
    int status = 503;

    if (rep && rep->type == REDIS_REPLY_INTEGER)
        status = rep->integer == 1 ? 200 : 429;
    op->cb(op->arg, status, status == 200 ? op->sid : NULL);
    free(op);
}

void gw_session_create(gw_ctx *ctx, const char *team, const char *protocol, gw_session_cb cb,
                       void *arg)
{
    session_op *op = calloc(1, sizeof(*op));
    char now[24], ttl[24], limit[24];

    if (!op || sf_id_new(op->sid, "mcp_") < 0) {
        free(op);
        cb(arg, 503, NULL);
        return;
    }
    op->cb = cb;
    op->arg = arg;
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ctx->cfg.session_ttl_s);
    snprintf(limit, sizeof(limit), "%lld", (long long)ctx->cfg.max_sessions_team);
    if (sf_redis_cmd(ctx->redis, on_session_created, op, "EVAL %s 0 %s %s %s %s %s %s",
                     lua_session_create, op->sid, team, protocol, now, ttl, limit) < 0) {
        free(op);
        cb(arg, 503, NULL);
    }
}

void gw_session_delete(gw_ctx *ctx, const char *team, const char *sid)
{
    if (!sf_id_valid(sid))
        return;
    sf_redis_cmd(ctx->redis, NULL, NULL, "DEL " SF_RK_SESSION, sid);
    sf_redis_cmd(ctx->redis, NULL, NULL, "ZREM " SF_RK_TEAM_SESSIONS " %s", team, sid);
}
