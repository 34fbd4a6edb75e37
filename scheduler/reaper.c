/* reaper.c: a timer (every host_ttl_ms) that removes hosts silent for host_dead_ms (their
 * sandboxes become lost: state/sf_records.c's reap script) and gives hosts that joined
 * the team templates they lack (tpl_join.c). */
#include "sched.h"
#include "sf_log.h"
#include "sf_records.h"

static void on_reaped(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;

    if (rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0)
        sf_warn("msg=\"dead hosts removed; their sandboxes are lost\" hosts=%lld",
                rep->integer);
    else if (rep && rep->type == REDIS_REPLY_ERROR)
        sf_error("msg=\"reaper script failed\" err=\"%s\"", rep->str);
}

static void reap(evutil_socket_t fd, short what, void *arg)
{
    sch_ctx *ctx = arg;

    if (sf_redis_connected(ctx->redis)) {
        sf_records_reap(ctx->redis, sf_now_ms(), ctx->cfg.host_dead_ms, on_reaped, NULL);
        sch_tpl_join(ctx); /* hosts that joined get the team templates */
    }
}

int sch_reaper_start(sch_ctx *ctx)
{
    struct timeval tv = {ctx->cfg.host_ttl_ms / 1000, (ctx->cfg.host_ttl_ms % 1000) * 1000};

    if (!(ctx->ev_reap = event_new(ctx->d.base, -1, EV_PERSIST, reap, ctx)))
        return -1;
    return event_add(ctx->ev_reap, &tv);
}
