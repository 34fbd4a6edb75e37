/* Network log writes: one XADD per entry; the connection itself is never held up by the
 * log. An entry Redis cannot take (down, or full: maxmemory) is lost, counted
 * (`netlog_dropped` in the control socket's status) and logged. */
#include "proxy.h"
#include "sf_log.h"

#include <stdio.h>

static void on_logged(redisAsyncContext *ac, void *r, void *priv)
{
    sp_ctx *ctx = priv;
    redisReply *rep = r;

    if (rep && rep->type != REDIS_REPLY_ERROR)
        return;
    if (ctx->netlog_dropped++ % 1000 == 0) /* the first, then every 1000th */
        sf_warn("msg=\"network log entry lost\" err=\"%s\" dropped=%llu",
                rep ? rep->str : "Redis connection lost",
                (unsigned long long)ctx->netlog_dropped);
}

void sp_netlog(sp_ctx *ctx, const char *sandbox, const sf_netlog_entry *e)
{
    const char *argv[SF_NETLOG_ARGC];
    size_t argvlen[SF_NETLOG_ARGC];
    char key[128], nums[6][24];
    int argc;

    snprintf(key, sizeof(key), SF_RK_NETLOG, sandbox);
    argc = sf_netlog_argv(e, key, (long)ctx->cfg.netlog_cap, nums, argv, argvlen);
    if (sf_redis_cmdargv(ctx->redis, on_logged, ctx, argc, argv, argvlen) < 0)
        ctx->netlog_dropped++;
    sf_debug("msg=\"egress\" sandbox=%s host=%s ip=%s port=%d verdict=%s proto=%s up=%llu "
             "down=%llu secret=%d reason=\"%s\"", sandbox, e->host ? e->host : "",
             e->ip ? e->ip : "", e->port, e->verdict, e->proto ? e->proto : "",
             (unsigned long long)e->up, (unsigned long long)e->down, e->secret,
             e->reason ? e->reason : "");
}
