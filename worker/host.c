/* host.c: this host's heartbeat in Redis (liveness + capacity for placement). */
#include "worker.h"
#include "sf_log.h"

#include <stdio.h>
#include <stdlib.h>

/* The sandboxes this worker runs, as asked of Redis in one heartbeat. */
typedef struct box_check {
    wk_ctx *ctx;
    size_t n;
    char ids[][SF_ID_MAX];
} box_check;

static void collect_id(const char *key, void *val, void *arg)
{
    box_check *bc = arg;
    snprintf(bc->ids[bc->n++], SF_ID_MAX, "%s", key);
}

/* A sandbox that left this host's set while we still run it was given up by the platform
 * (the scheduler reaped this host during a Redis outage or a stall): nobody can reach or
 * kill it any more, so it goes. */
static void on_box_check(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    box_check *bc = priv;

    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == bc->n) {
        for (size_t i = 0; i < bc->n; i++) {
            wk_box *b;
            if (rep->element[i]->type != REDIS_REPLY_INTEGER || rep->element[i]->integer != 0 ||
                !(b = sf_map_get(bc->ctx->sandboxes, bc->ids[i])))
                continue;
            sf_warn("msg=\"sandbox given up by the platform; killing it\" sandbox=%s", b->id);
            wk_box_destroy(b, "lost");
        }
    }
    free(bc);
}

static void check_boxes(wk_ctx *ctx)
{
    size_t n = sf_map_len(ctx->sandboxes);
    box_check *bc;
    const char **argv;
    char key[128];

    if (n == 0 || !(bc = malloc(sizeof(*bc) + n * SF_ID_MAX)))
        return;
    if (!(argv = calloc(n + 2, sizeof(*argv)))) {
        free(bc);
        return;
    }
    bc->ctx = ctx;
    bc->n = 0;
    sf_map_foreach(ctx->sandboxes, collect_id, bc);
    snprintf(key, sizeof(key), SF_RK_HOST_SANDBOXES, ctx->host_id);
    argv[0] = "SMISMEMBER";
    argv[1] = key;
    for (size_t i = 0; i < bc->n; i++)
        argv[i + 2] = bc->ids[i];
    if (sf_redis_cmdargv(ctx->redis, on_box_check, bc, (int)bc->n + 2, argv, NULL) < 0)
        free(bc);
    free(argv);
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
    sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "HSET %s id %s topic %s capacity %s running %s "
                 "driver %s ts %s", key, ctx->host_id, ctx->topic, cap, running,
                 ctx->cfg.driver, ts);
    sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "PEXPIRE %s %lld", key,
                 (long long)ctx->cfg.heartbeat_ms * 10);
    sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "ZADD " SF_RK_HOSTS " %s %s", ts, ctx->host_id);
    check_boxes(ctx);
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
