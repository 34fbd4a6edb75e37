/* pipeline.c: every job on sf.jobs, top to bottom: taken off the queue (a call,
 * call.c), its producer checked (auth.c: a verdict), its arguments validated against
 * the tool's schema, then routed: a tool that runs here goes to its handler, any other to
 * the host that owns its sandbox (route.c). Handlers finish the call through call.c. */
#include "sched.h"
#include "sf_jobauth.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <string.h>

/* sandbox_create: from a snapshot, the snapshot is found first (snapshots.c), which then
 * places it on the snapshot's host (place.c); else placed at once. */
static void create(sch_call *c)
{
    if (json_object_get(c->job.args, "from_snapshot"))
        sch_snap_place(c);
    else
        sch_place_create(c);
}

/* The tools that run here (x-sandfleet.runs = scheduler), by name; every other tool runs on
 * the sandbox's host (runs = worker) and is routed there. */
typedef void (*sch_handler)(sch_call *c);
#define H(name, fn) {name, (void (*)(void))(fn)}
static const sf_tool_handler handlers[] = {
    H("sandbox_create", create),
    H("sandbox_list", sch_list_sandboxes),
    H("sandbox_info", sch_list_info),
    H("secret_list", sch_egress_secret_list),
    H("sandbox_network_log", sch_egress_network_log),
    H("sandbox_template_list", sch_tpl_list),
    H("sandbox_template_create", sch_tpl_create),
    H("sandbox_snapshot_list", sch_snap_list),
    H("sandbox_snapshot_delete", sch_snap_delete),
    H("sandbox_template_delete", sch_tpl_delete),
};
#undef H

int sch_pipeline_check(const sf_toolset *tools, char *why, size_t whylen)
{
    return sf_toolset_check_handlers(tools, SF_RUNS_SCHEDULER, handlers, SF_ARRAY_LEN(handlers),
                                     why, whylen);
}

void sch_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why)
{
    (void)arg;
    sf_warn("msg=\"message rejected\" partition=%d offset=%lld why=\"%s\"", (int)msg->partition,
            (long long)msg->offset, why);
}

/* ---- 1. auth: a refused job is copied to sf.dead and answered `unauthenticated` ---- */

static void refuse(sch_call *c, const char *text)
{
    sf_buf b;

    sf_buf_init(&b, SF_MSG_MAX);
    if (sf_job_encode(&c->job, &b) == 0)
        sf_kafka_produce(c->ctx->producer, SF_TOPIC_DEAD, "unauthenticated", b.p, b.len);
    sf_buf_fini(&b);
    sf_warn("msg=\"job refused\" job=%s key=%s why=\"%s\"", c->job.id, c->job.auth.key, text);
    sch_call_error(c, SF_ERR_UNAUTH, text); /* told whatever tool it names: never silent */
}

/* ---- 2. validate: still wanted, callable by this producer, arguments as the schema
 * says, its sandbox bound. NULL when the call was answered. ---- */

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
        sch_call_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), sid));
        return -1;
    }
    snprintf(c->job.sandbox, sizeof(c->job.sandbox), "%s", sid);
    return 0;
}

static const sf_tool *validate(sch_call *c)
{
    const sf_tool *t;
    char why[512];

    if (sf_call_expired(&c->call, sf_now_ms())) {
        sf_info("msg=\"job expired before it was routed\" job=%s tool=%s", c->job.id, c->job.tool);
        sch_call_error(c, SF_ERR_TIMEOUT, SF_MSG_CALL_EXPIRED);
        return NULL;
    }
    t = sf_toolset_find(&c->ctx->tools, c->job.tool);
    if (t && t->internal && c->job.auth.state == 1 && strcmp(c->job.auth.key, SF_JOBAUTH_GATEWAY)) {
        snprintf(why, sizeof(why), "Tool '%.64s' is the platform's own; a producer cannot call "
                 "it.", c->job.tool);
        sch_call_error(c, SF_ERR_INVALID, why);
        return NULL;
    }
    c->call.silent = t && t->internal && !t->answered;
    if (sf_toolset_validate(&c->ctx->tools, c->job.tool, c->job.args, why, sizeof(why)) < 0) {
        sch_call_error(c, SF_ERR_INVALID, why);
        return NULL;
    }
    if (bind_sandbox(c, t) < 0)
        return NULL;
    if (t->sandbox == SF_SB_EXISTING && !c->job.sandbox[0]) {
        sch_call_error(c, SF_ERR_INVALID, SF_MSG_ARG_SANDBOX_ID);
        return NULL;
    }
    return t;
}

/* ---- 3. route: a handler here, or the sandbox's host ---- */

static void route(sch_call *c, const sf_tool *t)
{
    char why[512];

    switch (t->runs) {
    case SF_RUNS_SCHEDULER:
        ((sch_handler)sf_tool_handler_find(handlers, SF_ARRAY_LEN(handlers), t->name)->fn)(c);
        return;
    case SF_RUNS_WORKER:
        sch_route_to_owner(c);
        return;
    case SF_RUNS_GATEWAY:
        break;
    }
    snprintf(why, sizeof(why), "Tool '%.64s' runs in the gateway only; call it over MCP.",
             c->job.tool);
    sch_call_error(c, SF_ERR_INVALID, why);
}

static void on_auth(sch_call *c, int verdict, const char *text)
{
    const sf_tool *t;

    switch (verdict) {
    case SCH_AUTH_REFUSED:
        refuse(c, text);
        return;
    case SCH_AUTH_DOWN:
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if ((t = validate(c)))
        route(c, t);
}

void sch_on_job(void *arg, sf_job *job, sf_kafka_ticket tk)
{
    sch_call *c = sch_call_new(arg, job, tk);

    if (!c)
        return;
    sf_debug("msg=\"job\" job=%s tool=%s team=%s sandbox=%s", c->job.id, c->job.tool, c->job.team,
             c->job.sandbox);
    sch_auth_job(c, on_auth);
}
