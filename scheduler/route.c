/* route.c: takes each job off sf.jobs, checks it, and hands it to the tool's handler. */
#include "sched.h"
#include "sf_jobio.h"
#include "sf_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Tools the scheduler answers itself, and tools that go to the sandbox's host. */
static const char *const host_tools[] = {
    "sandbox_exec", "sandbox_kill", "sandbox_files_read", "sandbox_files_write",
    "sandbox_files_list", "sandbox_files_download_dir", "sandbox_pause", "sandbox_resume",
    "sandbox_preview_url", "sandbox_network_log", "sandbox_computer",
};

void sch_reply_error(sch_call *c, const char *code, const char *message)
{
    if (sf_jobio_error(c->ctx->producer, &c->job, code, message) < 0)
        sf_error("msg=\"cannot produce reply\" job=%s topic=%s", c->job.id, c->job.reply);
    sf_info("msg=\"job failed\" job=%s tool=%s team=%s code=%s", c->job.id, c->job.tool,
            c->job.team, code);
    sch_call_done(c);
}

void sch_reply_result(sch_call *c, json_t *result)
{
    if (sf_jobio_result(c->ctx->producer, &c->job, result) < 0)
        sf_error("msg=\"cannot produce reply\" job=%s topic=%s", c->job.id, c->job.reply);
    json_decref(result);
    sch_call_done(c);
}

void sch_forward(sch_call *c, const char *host)
{
    char topic[SF_TOPIC_MAX];
    sf_buf b;
    int rc;

    snprintf(c->job.host, sizeof(c->job.host), "%s", host);
    snprintf(topic, sizeof(topic), SF_TOPIC_HOST_PREFIX "%s", host);
    sf_buf_init(&b, SF_MSG_MAX);
    rc = sf_job_encode(&c->job, &b);
    if (rc == 0)
        rc = sf_kafka_produce(c->ctx->producer, topic, c->job.sandbox, b.p, b.len);
    sf_buf_fini(&b);
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
    sf_debug("msg=\"forwarded\" job=%s tool=%s sandbox=%s host=%s", c->job.id, c->job.tool,
             c->job.sandbox, host);
    sch_call_done(c);
}

void sch_call_done(sch_call *c)
{
    sf_jobq_done(c->ctx->jobq, c->ticket);
    sf_job_fini(&c->job);
    free(c);
}

static int is_host_tool(const char *tool)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(host_tools); i++)
        if (!strcmp(tool, host_tools[i]))
            return 1;
    return 0;
}

/* The sandbox a job acts on is args.sandbox_id; batch producers may leave the envelope's
 * `sandbox` empty, but may not make it disagree. A new sandbox gets its id here if the
 * producer did not choose one. -1 when the call was answered. */
static int bind_sandbox(sch_call *c)
{
    const char *sid = json_string_value(json_object_get(c->job.args, "sandbox_id"));
    char text[256];

    if (!strcmp(c->job.tool, "sandbox_create")) {
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
    char why[512];

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
    if (c->job.deadline_ms < sf_now_ms()) {
        sf_info("msg=\"job expired before it was routed\" job=%s tool=%s", c->job.id, c->job.tool);
        sch_reply_error(c, SF_ERR_TIMEOUT,
                        "The call waited in the queue past its deadline; retry it.");
        return;
    }
    if (sf_toolset_validate(&ctx->tools, c->job.tool, c->job.args, why, sizeof(why)) < 0) {
        sch_reply_error(c, SF_ERR_INVALID, why);
        return;
    }
    if (bind_sandbox(c) < 0)
        return;
    if (!strcmp(c->job.tool, "sandbox_create"))
        sch_place_create(c);
    else if (!strcmp(c->job.tool, "sandbox_list"))
        sch_store_list(c);
    else if (!strcmp(c->job.tool, "sandbox_info"))
        sch_store_info(c);
    else if (is_host_tool(c->job.tool)) {
        if (!c->job.sandbox[0])
            sch_reply_error(c, SF_ERR_INVALID, "Argument 'sandbox_id' is required.");
        else
            sch_store_route(c);
    } else {
        snprintf(why, sizeof(why), "Tool '%.64s' is not routed by this scheduler.", c->job.tool);
        sch_reply_error(c, SF_ERR_INTERNAL, why);
    }
}
