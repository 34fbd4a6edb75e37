/* kill.c: sandbox_kill, answered once the record says killing. */
#include "worker.h"
#include "sf_claim.h"
#include "sf_events.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_tools.h"
#include "sf_trace.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static void kill_answer(wk_call *c)
{
    wk_reply_result(c, json_pack("{s:s, s:s}", "id", c->job.sandbox, "status", "killed"));
}

static void on_kill_written(redisAsyncContext *ac, void *r, void *priv)
{
    wk_redis_logged(ac, r, NULL);
    kill_answer(priv);
}

/* Answered as soon as the record says `killing` (or `killed`, for a sandbox this host no
 * longer holds: b NULL), not when the teardown ends: a caller that lists its sandboxes
 * right after the answer no longer sees this one. The record's write is a read then a
 * script, so the answer waits for its callback rather than relying on Redis's order. */
static void do_kill(wk_call *c, wk_box *b)
{
    int rc;

    if (b)
        rc = wk_box_kill_then(b, "killed", on_kill_written, c);
    else if ((rc = sf_records_retire(c->ctx->redis, c->job.sandbox, "killed", 0,
                                     on_kill_written, c)) < 0)
        sf_warn("msg=\"cannot update the record; Redis is down\" sandbox=%s state=killed",
                c->job.sandbox);
    if (rc < 0)
        kill_answer(c); /* already being killed, or Redis is down: nothing to wait for */
}

WK_HANDLERS({"sandbox_kill", do_kill});
