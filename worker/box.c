/* box.c: the sandboxes this host holds (wk_box): a call for one that is not here, and the
 * kill that ends one (its record, its event, the resources it held). */
#include "worker.h"
#include "restart.h"
#include "ingress.h"
#include "egress.h"
#include "sf_claim.h"
#include "sf_events.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_tools.h"
#include "sf_trace.h"
#include "sf_msg.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A job for a sandbox this worker does not hold: the record says why (killed moments
 * ago: its teardown just ended; or lost: the worker restarted since). */
static void on_not_here_state(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_call *c = priv;
    const char *st = rep && rep->type == REDIS_REPLY_STRING ? rep->str : "";
    char text[256];

    if (!strcmp(st, "killed") || !strcmp(st, "killing")) {
        if (!strcmp(st, "killing"))
            wk_record_retire(c->ctx, c->job.sandbox, "killed", 1);
        snprintf(text, sizeof(text),
                 SF_MSG_SANDBOX_KILLED_FMT, c->job.sandbox);
    } else if (!strcmp(st, "failed")) {
        snprintf(text, sizeof(text),
                 SF_MSG_SANDBOX_FAILED_FMT,
                 c->job.sandbox);
    } else {
        snprintf(text, sizeof(text),
                 "Sandbox '%s' is no longer running on its host (it was lost); create a new one "
                 "with sandbox_create.", c->job.sandbox);
        wk_record_retire(c->ctx, c->job.sandbox, "lost", 1);
    }
    wk_reply_error(c, SF_ERR_NOT_FOUND, text);
}

void wk_box_not_here(wk_call *c)
{
    if (sf_redis_cmd(c->ctx->redis, on_not_here_state, c, "HGET " SF_RK_SANDBOX " state",
                     c->job.sandbox) < 0)
        wk_reply_error(c, SF_ERR_UNAVAILABLE,
                    SF_MSG_STORE_DOWN);
}

void wk_box_release(wk_box *b)
{
    wk_ctx *ctx = b->ctx;

    sf_map_del(ctx->sandboxes, b->id);
    if (b->state != WK_BOX_CREATING)
        wk_restart_forget(ctx, b->id);
    ctx->used_mem_mib -= b->lim.memory_mib;
    ctx->used_vcpu_milli -= b->lim.vcpu_milli;
    ctx->used_disk_mib -= b->lim.disk_mib;
    atomic_store(&ctx->beat.running, (int)sf_map_len(ctx->sandboxes));
    json_decref(b->env);
    wk_egress_box_free(b->eg);
    free(b);
}

static void on_killed(void *arg, int rc)
{
    wk_box *b = arg;

    wk_record_retire(b->ctx, b->id, b->end_state, 0);
    wk_event(b->ctx, b->end_state, b->team, b->id, NULL);
    sf_info("msg=\"sandbox gone\" sandbox=%s state=%s teardown_rc=%d", b->id, b->end_state, rc);
    wk_box_release(b);
}

void wk_box_kill(wk_box *b, const char *end_state)
{
    wk_box_kill_then(b, end_state, NULL, NULL);
}

int wk_box_kill_then(wk_box *b, const char *end_state, redisCallbackFn *written, void *priv)
{
    wk_ctx *ctx = b->ctx;
    int rc;

    if (b->state == WK_BOX_KILLING)
        return -EALREADY;
    b->end_state = end_state;
    rc = sf_records_mark_killing(ctx->redis, b->id, written ? written : wk_redis_logged,
                                 written ? priv : NULL);
    if (rc < 0)
        sf_warn("msg=\"cannot mark the record killing; Redis is down\" sandbox=%s", b->id);
    wk_egress_detach(ctx->egress, b); /* its listeners and placeholders go at once */
    wk_ingress_drop(ctx->ingress, b->id, 0); /* and its previews */
    b->pv_n = 0;
    if (b->state == WK_BOX_CREATING) {
        b->state = WK_BOX_KILLING; /* on_created kills it when the driver answers */
        return rc;
    }
    b->state = WK_BOX_KILLING;
    ctx->ops->kill(b->sb, on_killed, b);
    return rc;
}
