/* host.c: this host's heartbeat in Redis (liveness + capacity for placement). */
#include "worker.h"
#include "sf_log.h"

#include <stdio.h>

static void on_reply(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    if (rep && rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"heartbeat write failed\" err=\"%s\"", rep->str);
}

static void heartbeat(evutil_socket_t fd, short what, void *arg)
{
    wk_ctx *ctx = arg;
    char ts[24], cap[24], running[24], key[128];

    snprintf(ts, sizeof(ts), "%lld", (long long)sf_now_ms());
    snprintf(cap, sizeof(cap), "%lld", (long long)ctx->cfg.capacity);
    snprintf(running, sizeof(running), "%zu", sf_map_len(ctx->sandboxes));
    snprintf(key, sizeof(key), SF_RK_HOST, ctx->host_id);
    if (!sf_redis_connected(ctx->redis))
        return;
    sf_redis_cmd(ctx->redis, on_reply, NULL, "HSET %s id %s topic %s capacity %s running %s "
                 "driver %s ts %s", key, ctx->host_id, ctx->topic, cap, running,
                 ctx->cfg.driver, ts);
    sf_redis_cmd(ctx->redis, on_reply, NULL, "PEXPIRE %s %lld", key,
                 (long long)ctx->cfg.heartbeat_ms * 10);
    sf_redis_cmd(ctx->redis, on_reply, NULL, "ZADD " SF_RK_HOSTS " %s %s", ts, ctx->host_id);
}

int wk_host_start(wk_ctx *ctx)
{
    struct timeval tv = {ctx->cfg.heartbeat_ms / 1000, (ctx->cfg.heartbeat_ms % 1000) * 1000};

    if (!(ctx->ev_heartbeat = event_new(ctx->d.base, -1, EV_PERSIST, heartbeat, ctx)))
        return -1;
    event_add(ctx->ev_heartbeat, &tv);
    /* First beat as soon as Redis is connected: 50 ms from now. */
    event_active(ctx->ev_heartbeat, EV_TIMEOUT, 0);
    return 0;
}

void wk_host_stop(wk_ctx *ctx)
{
    if (ctx->ev_heartbeat) {
        event_free(ctx->ev_heartbeat);
        ctx->ev_heartbeat = NULL;
    }
    if (ctx->redis && sf_redis_connected(ctx->redis))
        sf_redis_cmd(ctx->redis, NULL, NULL, "ZREM " SF_RK_HOSTS " %s", ctx->host_id);
}
