/* call.c: the service every handler uses to finish a call: answer it (an error, a
 * result), answer it and go on ("reply then continue"), forward it to a host, or end it
 * without an answer. Below every handler; calls none of them. The answer-once flag, the
 * deadline and the offset are common/sf_call.h's, shared with the worker. */
#include "sched.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

sch_call *sch_call_new(sch_ctx *ctx, sf_job *job, sf_kafka_ticket tk)
{
    sch_call *c = calloc(1, sizeof(*c));

    if (!c || sf_call_init(&c->call, ctx->jobq, ctx->producer, &c->job, tk) < 0) {
        sf_error("msg=\"out of memory\" job=%s", job->id);
        free(c);
        sf_job_fini(job);
        sf_jobq_done(ctx->jobq, tk);
        return NULL;
    }
    c->ctx = ctx;
    c->job = *job;
    return c;
}

void sch_call_done(sch_call *c)
{
    sf_call_end(&c->call);
    sf_job_fini(&c->job);
    free(c);
}

static void answered(sch_call *c, int rc)
{
    if (rc < 0 && rc != -EALREADY)
        sf_error("msg=\"cannot produce\" job=%s topic=%s rc=%d", c->job.id, c->job.reply, rc);
}

static void error_answer(sch_call *c, const char *code, const char *message)
{
    if (c->call.silent) /* an internal message (sf.cancel): never answered */
        sf_debug("msg=\"internal job dropped\" job=%s tool=%s code=%s", c->job.id, c->job.tool,
                 code);
    else if (!c->call.answered)
        sf_info("msg=\"job failed\" job=%s tool=%s team=%s code=%s", c->job.id, c->job.tool,
                c->job.team, code);
    answered(c, sf_call_error(&c->call, code, message));
}

void sch_call_error(sch_call *c, const char *code, const char *message)
{
    error_answer(c, code, message);
    sch_call_done(c);
}

void sch_call_result_then(sch_call *c, json_t *result)
{
    if (!result)
        error_answer(c, SF_ERR_UNAVAILABLE, "The platform ran out of memory answering the "
                                             "call; retry in a few seconds.");
    else
        answered(c, sf_call_result(&c->call, result, NULL));
    json_decref(result);
}

void sch_call_result(sch_call *c, json_t *result)
{
    sch_call_result_then(c, result);
    sch_call_done(c);
}

void sch_call_forward(sch_call *c, const char *host)
{
    char topic[SF_TOPIC_MAX];
    rd_kafka_headers_t *h = NULL;
    sf_buf b;
    int rc;

    snprintf(c->job.host, sizeof(c->job.host), "%s", host);
    snprintf(topic, sizeof(topic), SF_TOPIC_HOST_PREFIX "%s", host);
    sf_debug("msg=\"forwarding\" job=%s tool=%s sandbox=%s host=%s", c->job.id, c->job.tool,
             c->job.sandbox, host);
    sf_buf_init(&b, SF_MSG_MAX);
    rc = sf_job_encode(&c->job, &b);
    if (rc == 0 && !(h = sch_hostmsg_headers(c->ctx, host, b.p, b.len)))
        rc = -ENOMEM;
    if (rc == 0 && (rc = sf_call_send(&c->call, topic, c->job.sandbox, b.p, b.len, h)) < 0)
        rd_kafka_headers_destroy(h);
    sf_buf_fini(&b);
    if (rc == 0) {
        sch_call_done(c); /* its offset moves once the forward is confirmed */
        return;
    }
    sf_error("msg=\"cannot produce\" job=%s topic=%s rc=%d", c->job.id, topic, rc);
    if (rc == -E2BIG) /* what the scheduler adds (host, limits) pushed it past the limit */
        sch_call_error(c, SF_ERR_INVALID, SF_MSG_ARGS_TOO_LARGE);
    else
        sch_call_error(c, SF_ERR_UNAVAILABLE, "The platform could not hand the call to the "
                       "sandbox's host; retry in a few seconds.");
}
