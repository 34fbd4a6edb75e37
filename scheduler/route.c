/* route.c: takes each job off sf.jobs, checks it, and hands it to the tool's handler. */
#include "sched.h"
#include "sf_jobauth.h"
#include "sf_jobio.h"
#include "sf_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The tools that run here (x-sandfleet.runs = scheduler), by name; every other tool runs on
 * the sandbox's host (runs = worker) and is routed there. */
typedef void (*sch_handler)(sch_call *c);
#define H(name, fn) {name, (void (*)(void))(fn)}
static const sf_tool_handler handlers[] = {
    H("sandbox_create", sch_place_create),
    H("sandbox_list", sch_store_list),
    H("sandbox_info", sch_store_info),
    H("secret_list", sch_egress_secret_list),
    H("sandbox_network_log", sch_egress_network_log),
    H("sandbox_template_list", sch_tpl_list),
    H("sandbox_template_create", sch_tpl_create),
    H("sandbox_snapshot_list", sch_snap_list),
    H("sandbox_snapshot_delete", sch_snap_delete),
    H("sandbox_template_delete", sch_tpl_delete),
};
#undef H

int sch_route_check(const sf_toolset *tools, char *why, size_t whylen)
{
    return sf_toolset_check_handlers(tools, SF_RUNS_SCHEDULER, handlers, SF_ARRAY_LEN(handlers),
                                     why, whylen);
}

static void call_free(sch_call *c)
{
    sf_job_fini(&c->job);
    free(c);
}

/* Sends b (encoded: rc) to topic, signed for host `host` when not NULL (auth.c); the job's
 * offset moves once Kafka confirmed it. Ends the call; -errno when nothing was sent. */
static int send_then_done(sch_call *c, const char *topic, const char *key, sf_buf *b, int rc,
                          const char *host)
{
    rd_kafka_headers_t *h = NULL;

    if (rc == 0 && host && !(h = sch_host_headers(c->ctx, host, b->p, b->len)))
        rc = -ENOMEM;
    if (rc == 0 && (rc = sf_jobq_send(c->ctx->jobq, c->ctx->producer, topic, key, b->p, b->len,
                                      h, c->ticket, c->job.id)) < 0)
        rd_kafka_headers_destroy(h);
    sf_buf_fini(b);
    if (rc < 0) {
        sf_error("msg=\"cannot produce\" job=%s topic=%s rc=%d", c->job.id, topic, rc);
        return rc;
    }
    call_free(c);
    return 0;
}

void sch_reply_error(sch_call *c, const char *code, const char *message)
{
    if (c->silent) { /* an internal message (sf.cancel): never answered */
        sf_debug("msg=\"internal job dropped\" job=%s tool=%s code=%s", c->job.id, c->job.tool,
                 code);
        sch_call_done(c);
        return;
    }
    sf_info("msg=\"job failed\" job=%s tool=%s team=%s code=%s", c->job.id, c->job.tool,
            c->job.team, code);
    {
        sf_buf b;
        sf_buf_init(&b, SF_MSG_MAX);
        if (send_then_done(c, c->job.reply, c->job.id, &b,
                           sf_jobio_encode_error(&c->job, code, message, &b), NULL) < 0)
            sch_call_done(c);
    }
}

void sch_reply_result(sch_call *c, json_t *result)
{
    sf_buf b;
    int rc;

    sf_buf_init(&b, SF_MSG_MAX);
    rc = sf_jobio_encode_result(&c->job, result, NULL, &b);
    json_decref(result);
    if (send_then_done(c, c->job.reply, c->job.id, &b, rc, NULL) < 0)
        sch_call_done(c);
}

void sch_forward(sch_call *c, const char *host)
{
    char topic[SF_TOPIC_MAX];
    sf_buf b;
    int rc;

    snprintf(c->job.host, sizeof(c->job.host), "%s", host);
    snprintf(topic, sizeof(topic), SF_TOPIC_HOST_PREFIX "%s", host);
    sf_debug("msg=\"forwarding\" job=%s tool=%s sandbox=%s host=%s", c->job.id, c->job.tool,
             c->job.sandbox, host);
    sf_buf_init(&b, SF_MSG_MAX);
    rc = sf_job_encode(&c->job, &b);
    if ((rc = send_then_done(c, topic, c->job.sandbox, &b, rc, host)) == 0)
        return; /* c is gone: its offset moves once the forward is confirmed */
    if (rc == -E2BIG) { /* what the scheduler adds (host, limits) pushed it past the limit */
        sch_reply_error(c, SF_ERR_INVALID, "The arguments are too large for one call (over "
                        "1 MiB encoded); put large inputs in a file in the sandbox first, in "
                        "smaller calls.");
        return;
    }
    if (rc < 0) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE,
                        "The platform could not hand the call to the sandbox's host; retry in a "
                        "few seconds.");
        return;
    }
}

void sch_call_done(sch_call *c)
{
    sf_jobq_done(c->ctx->jobq, c->ticket);
    sf_job_fini(&c->job);
    free(c);
}

/* The sandbox a job acts on is args.sandbox_id; batch producers may leave the envelope's
 * `sandbox` empty, but may not make it disagree. A new sandbox gets its id here if the
 * producer did not choose one. -1 when the call was answered. */
static int bind_sandbox(sch_call *c, const sf_tool *t)
{
    const char *sid = json_string_value(json_object_get(c->job.args, "sandbox_id"));
    char text[256];

    if (t->sandbox == SF_SB_NEW) {
        if (!c->job.sandbox[0])
            sf_id_new(c->job.sandbox, "sb_");
        return 0;
    }
    if (!sid)
        return 0;
    if (!sf_id_valid(sid) || (c->job.sandbox[0] && strcmp(sid, c->job.sandbox) != 0)) {
        sch_reply_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), sid));
        return -1;
    }
    snprintf(c->job.sandbox, sizeof(c->job.sandbox), "%s", sid);
    return 0;
}

void sch_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why)
{
    sf_warn("msg=\"message rejected\" partition=%d offset=%lld why=\"%s\"", (int)msg->partition,
            (long long)msg->offset, why);
}

void sch_on_job(void *arg, sf_job *job, sf_kafka_ticket tk)
{
    sch_ctx *ctx = arg;
    sch_call *c = calloc(1, sizeof(*c));

    if (!c) {
        sf_error("msg=\"out of memory\" job=%s", job->id);
        sf_job_fini(job);
        sf_jobq_done(ctx->jobq, tk);
        return;
    }
    c->ctx = ctx;
    c->ticket = tk;
    c->job = *job;
    sf_debug("msg=\"job\" job=%s tool=%s team=%s sandbox=%s", c->job.id, c->job.tool, c->job.team,
             c->job.sandbox);
    sch_auth_job(c);
}

void sch_route_job(sch_call *c)
{
    sch_ctx *ctx = c->ctx;
    const sf_tool *t;
    char why[512];

    if (c->job.deadline_ms < sf_now_ms()) {
        sf_info("msg=\"job expired before it was routed\" job=%s tool=%s", c->job.id, c->job.tool);
        sch_reply_error(c, SF_ERR_TIMEOUT,
                        "The call waited in the queue past its deadline; retry it.");
        return;
    }
    t = sf_toolset_find(&ctx->tools, c->job.tool);
    if (t && t->internal && c->job.auth.state == 1 && strcmp(c->job.auth.key, SF_JOBAUTH_GATEWAY)) {
        snprintf(why, sizeof(why), "Tool '%.64s' is the platform's own; a producer cannot call "
                 "it.", c->job.tool);
        sch_reply_error(c, SF_ERR_INVALID, why);
        return;
    }
    c->silent = t && t->internal;
    if (sf_toolset_validate(&ctx->tools, c->job.tool, c->job.args, why, sizeof(why)) < 0) {
        sch_reply_error(c, SF_ERR_INVALID, why);
        return;
    }
    if (bind_sandbox(c, t) < 0)
        return;
    if (t->sandbox == SF_SB_EXISTING && !c->job.sandbox[0]) {
        sch_reply_error(c, SF_ERR_INVALID, "Argument 'sandbox_id' is required.");
        return;
    }
    switch (t->runs) {
    case SF_RUNS_SCHEDULER:
        ((sch_handler)sf_tool_handler_find(handlers, SF_ARRAY_LEN(handlers), t->name)->fn)(c);
        return;
    case SF_RUNS_WORKER:
        sch_store_route(c);
        return;
    case SF_RUNS_GATEWAY:
        break;
    }
    snprintf(why, sizeof(why), "Tool '%.64s' runs in the gateway only; call it over MCP.",
             c->job.tool);
    sch_reply_error(c, SF_ERR_INVALID, why);
}
