/* dispatch.c: the dispatcher above the handlers: a job from the host topic is checked
 * (the scheduler's signature, its deadline), goes through the job guard and its claims
 * (call.c), then to the handler its tool registered (WK_HANDLERS), with its sandbox; a paused
 * sandbox is resumed first for tools that declare `resume`. The internal jobs (sf.cancel,
 * template builds) are handled here. */
#include "worker.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_tools.h"
#include "sf_msg.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* What this worker must handle: the tools that run on a sandbox's host, and the host's half
 * of the tools that make a sandbox (placed by the scheduler, started here). */
static int runs_here(const sf_tool *t)
{
    return (!t->internal || t->answered) && (t->runs == SF_RUNS_WORKER || t->sandbox == SF_SB_NEW);
}

int wk_jobs_check(const sf_toolset *tools, char *why, size_t whylen)
{
    size_t n;
    const sf_tool_handler *handlers = wk_handlers(&n);

    if (!handlers) {
        snprintf(why, whylen, "this worker registers more than %d tool handlers; raise "
                 "WK_HANDLERS_MAX (worker.h) and rebuild", WK_HANDLERS_MAX);
        return -E2BIG;
    }
    for (size_t i = 0; i < n; i++) {
        const sf_tool *t = sf_toolset_find(tools, handlers[i].name);
        if (!t || !runs_here(t)) {
            snprintf(why, whylen, "this worker handles %s, which the tool schemas do not declare "
                     "to run on a host; point schemas_dir at this build's schemas",
                     handlers[i].name);
            return -EINVAL;
        }
    }
    for (size_t i = 0; i < tools->n; i++)
        if (runs_here(&tools->tools[i]) &&
            !sf_tool_handler_find(handlers, n, tools->tools[i].name)) {
            snprintf(why, whylen, "tool %s declares runs: worker, but this worker has no handler "
                     "for it; deploy the matching build of every daemon", tools->tools[i].name);
            return -EINVAL;
        }
    return 0;
}

static void on_auto_resumed(wk_call *c, int rc, const char *why);

static void resumed_for_cancel(wk_call *c, int rc, const char *why)
{
    (void)c;
    if (rc < 0)
        sf_warn("msg=\"a paused sandbox could not be resumed for a cancel\" rc=%d why=\"%s\"",
                rc, why ? why : "");
}

/* sf.cancel (schemas/envelope.md): the running command of job args.job, of the same team, is
 * killed; that job then gets its one final reply (cancelled). The cancel is never
 * answered. */
static void do_cancel(wk_call *c)
{
    const char *target = json_string_value(json_object_get(c->job.args, "job"));
    wk_call *x = target ? sf_map_get(c->ctx->running, target) : NULL;
    wk_box *b;

    if (x && !x->cancelled && !strcmp(x->job.team, c->job.team) &&
        (b = sf_map_get(c->ctx->sandboxes, x->job.sandbox)) && b->sb &&
        b->state == WK_BOX_RUNNING) {
        x->cancelled = 1;
        if (b->paused || b->pausing) /* a frozen agent cannot kill anything */
            wk_box_resume(b, NULL, resumed_for_cancel);
        if (c->ctx->ops->exec_cancel(b->sb, x) < 0)
            sf_debug("msg=\"nothing to cancel\" job=%s", target);
        sf_info("msg=\"cancelling a call\" job=%s cancel=%s", target, c->job.id);
    } else {
        sf_debug("msg=\"cancel of a call not running here\" job=%s", target ? target : "");
    }
    wk_call_done(c);
}

static void dispatch(wk_call *c)
{
    wk_ctx *ctx = c->ctx;
    const sf_tool *t = c->tool;
    wk_handler_fn h = wk_handler_find(c->job.tool);
    char text[256];
    wk_box *b;

    if (t && t->internal && !t->answered) { /* sf.cancel, sf.template_build/_delete */
        if (!strcmp(c->job.tool, SF_TOOL_TEMPLATE_BUILD)) {
            wk_tpl_build(ctx, &c->job);
            wk_call_done(c);
        } else if (!strcmp(c->job.tool, SF_TOOL_TEMPLATE_DELETE)) {
            wk_tpl_delete(ctx, &c->job);
            wk_call_done(c);
        } else {
            do_cancel(c);
        }
        return;
    }
    if (!t || !h) {
        snprintf(text, sizeof(text), "Tool '%.64s' is not available on this host; retry after "
                 "the platform's upgrade finished.", c->job.tool);
        wk_reply_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (t->sandbox != SF_SB_EXISTING) {
        h(c, NULL);
        return;
    }
    b = sf_map_get(ctx->sandboxes, c->job.sandbox);
    if (b && strcmp(b->team, c->job.team) != 0) { /* the scheduler checked: never happens */
        sf_warn("msg=\"job for another team's sandbox refused\" job=%s sandbox=%s team=%s",
                c->job.id, c->job.sandbox, c->job.team);
        wk_reply_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), c->job.sandbox));
        return;
    }
    if (!strcmp(c->job.tool, "sandbox_kill")) { /* also a sandbox starting, dying or gone */
        h(c, b);
        return;
    }
    if (!b) {
        wk_box_not_here(c);
        return;
    }
    if (b->state == WK_BOX_KILLING) {
        snprintf(text, sizeof(text),
                 SF_MSG_SANDBOX_KILLED_FMT, b->id);
        wk_reply_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    if (b->state == WK_BOX_CREATING) {
        snprintf(text, sizeof(text), "Sandbox '%s' is still starting; retry in a moment.", b->id);
        wk_reply_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    }
    if (t->resume && (b->paused || b->pausing)) { /* the call goes on once it runs again */
        int rc = wk_box_resume(b, c, on_auto_resumed);
        if (rc < 0)
            on_auto_resumed(c, rc, NULL);
        return;
    }
    if (!c->on_box) {
        c->on_box = 1;
        b->calls++;
    }
    h(c, b);
}

static void on_auto_resumed(wk_call *c, int rc, const char *why)
{
    char text[320];
    wk_box *bx;

    if (rc < 0) {
        snprintf(text, sizeof(text), "%s", why ? why : SF_MSG_RESUME_FAILED);
        wk_reply_error(c, rc == -ESRCH ? SF_ERR_NOT_FOUND : SF_ERR_UNAVAILABLE, text);
        return;
    }
    if ((bx = sf_map_get(c->ctx->sandboxes, c->job.sandbox)) && (bx->paused || bx->pausing)) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, SF_MSG_RESUME_FAILED);
        return;
    }
    dispatch(c); /* looks the sandbox up again */
}

void wk_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why)
{
    sf_warn("msg=\"message rejected\" offset=%lld why=\"%s\"", (long long)msg->offset, why);
}

void wk_on_job(void *arg, sf_job *job, sf_kafka_ticket tk)
{
    wk_ctx *ctx = arg;
    wk_call *c = calloc(1, sizeof(*c));
    char text[400];
    int64_t latest;

    if (!c) {
        sf_job_fini(job);
        sf_jobq_done(ctx->jobq, tk);
        return;
    }
    c->ctx = ctx;
    c->job = *job;
    if (sf_call_init(&c->call, ctx->jobq, ctx->producer, &c->job, tk) < 0) {
        sf_job_fini(&c->job);
        free(c);
        sf_jobq_done(ctx->jobq, tk);
        return;
    }
    c->tool = sf_toolset_find(&ctx->tools, c->job.tool);
    if (wk_hostauth_check(ctx, &c->job, text, sizeof(text)) < 0) {
        wk_call_refuse_forged(c, text);
        return;
    }
    /* a producer chooses its deadline: it bounds how long the guard (and its reply) is kept */
    latest = sf_now_ms() + ctx->cfg.job_deadline_max_ms;
    if (c->job.deadline_ms > latest)
        c->job.deadline_ms = latest;
    if (ctx->stopping) {
        wk_call_refuse(c, SF_ERR_UNAVAILABLE, SF_MSG_HOST_STOPPING);
        return;
    }
    /* (a job past its deadline is refused after the guard: a repeat of a finished one
     * gets its answer again) */
    {
        const sf_tool *t = sf_toolset_find(&ctx->tools, c->job.tool);
        if (t && t->internal && !t->answered) { /* sf.cancel: no guard, never answered */
            dispatch(c);
            return;
        }
    }
    wk_call_begin(c, dispatch);
}
