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
    if (op->status == 200 && op->has_session) /* sessions live while they are used */
        sf_redis_cmd(op->ctx->redis, NULL, NULL, "EXPIRE " SF_RK_SESSION " %lld", op->session_id,
                     (long long)op->ctx->cfg.session_ttl_s);
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

int gw_session_create(gw_ctx *ctx, const char *team, const char *protocol, char sid[SF_ID_MAX])
{
    char key[128];

    if (sf_id_new(sid, "mcp_") < 0)
        return -1;
    snprintf(key, sizeof(key), SF_RK_SESSION, sid);
    if (sf_redis_cmd(ctx->redis, NULL, NULL, "HSET %s team %s protocol %s created %lld", key, team,
                     protocol, (long long)sf_now_ms()) < 0 ||
        sf_redis_cmd(ctx->redis, NULL, NULL, "EXPIRE %s %lld", key,
                     (long long)ctx->cfg.session_ttl_s) < 0)
        return -1;
    return 0;
}

void gw_session_delete(gw_ctx *ctx, const char *sid)
{
    if (sf_id_valid(sid))
        sf_redis_cmd(ctx->redis, NULL, NULL, "DEL " SF_RK_SESSION, sid);
}
