/* update.c: sandbox_update, one tool for everything a sandbox can change while it lives:
 * its network rules (allow_out, deny_out: applied by this host's secret-proxy, egress.h),
 * then its metadata and lifecycle (timeout_seconds, auto_delete_seconds: one script,
 * state/sf_timers.h). Rules go first, so input the proxy refuses changes nothing. The
 * sandbox is never resumed: a paused one stays paused (its schema declares no resume). */
#include "worker.h"
#include "restart.h"
#include "egress.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_timers.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MSG_REDIS_DOWN_AFTER_RULES                                                             \
    "The network rules changed, but the platform's state store is unreachable, so metadata " \
    "and timers did not; retry sandbox_update in a few seconds."

static int has_life(const json_t *args)
{
    return json_object_get(args, "metadata") || json_object_get(args, "timeout_seconds") ||
           json_object_get(args, "auto_delete_seconds");
}

static void reply_gone(wk_call *c)
{
    char text[256];

    snprintf(text, sizeof(text), SF_MSG_SANDBOX_KILLED_MEANWHILE_FMT, c->job.sandbox);
    wk_reply_error(c, SF_ERR_NOT_FOUND, text);
}

/* The answer: the sandbox as it is now (status, metadata, network, timers). */
static void on_view(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_call *c = priv;
    wk_box *b = sf_map_get(c->ctx->sandboxes, c->job.sandbox);
    const char *team, *st, *md_text;
    json_t *rec, *view, *md;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, SF_MSG_STORE_DOWN_AFTER_CHANGE);
        return;
    }
    if (!b || b->state != WK_BOX_RUNNING) {
        reply_gone(c);
        return;
    }
    if (!(rec = json_object())) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    for (size_t i = 0; i + 1 < rep->elements; i += 2)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            rep->element[i + 1]->type == REDIS_REPLY_STRING)
            json_object_set_new(rec, rep->element[i]->str,
                                json_stringn(rep->element[i + 1]->str, rep->element[i + 1]->len));
    team = json_string_value(json_object_get(rec, "team"));
    if (!team || strcmp(team, c->job.team) != 0) { /* retired and gone meanwhile */
        json_decref(rec);
        reply_gone(c);
        return;
    }
    st = json_string_value(json_object_get(rec, "state"));
    md_text = json_string_value(json_object_get(rec, "metadata"));
    md = md_text ? json_loads(md_text, 0, NULL) : NULL;
    if (!json_is_object(md)) {
        json_decref(md);
        md = json_object();
    }
    view = json_pack("{s:s, s:s, s:s, s:o, s:o}", "sandbox_id", b->id, "id", b->id, "status",
                     st && !strcmp(st, "running") ? "active" : st ? st : "active", "metadata", md,
                     "network", wk_egress_network(b->eg));
    sf_timers_view(rec, view);
    json_decref(rec);
    if (!view) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    wk_reply_result(c, view);
}

static void show(wk_call *c, const char *redis_down)
{
    if (sf_redis_cmd(c->ctx->redis, on_view, c, "HGETALL " SF_RK_SANDBOX, c->job.sandbox) < 0)
        wk_reply_error(c, SF_ERR_UNAVAILABLE, redis_down);
}

static void on_life_updated(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_call *c = priv;
    const char *verdict;
    char text[256];

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, json_object_get(c->job.args, "allow_out") ||
                       json_object_get(c->job.args, "deny_out") ? MSG_REDIS_DOWN_AFTER_RULES :
                       SF_MSG_STORE_DOWN_NOTHING_CHANGED);
        return;
    }
    verdict = rep->element[0]->str;
    if (!strcmp(verdict, "none")) {
        wk_reply_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), c->job.sandbox));
        return;
    }
    if (strcmp(verdict, "ok") != 0) { /* starting cannot be: this host answered its create */
        snprintf(text, sizeof(text), "Sandbox '%s' is no longer running (%s); create a new "
                 "one with sandbox_create.", c->job.sandbox,
                 rep->element[1]->type == REDIS_REPLY_STRING ? rep->element[1]->str : "gone");
        wk_reply_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    show(c, SF_MSG_STORE_DOWN_AFTER_CHANGE);
}

/* An optional nullable integer argument: keep (absent), null, or its value. */
static int64_t nullable(const json_t *args, const char *name, int64_t if_null)
{
    json_t *v = json_object_get(args, name);

    if (!v)
        return SF_TIMERS_KEEP;
    if (json_is_null(v))
        return if_null;
    return (int64_t)json_integer_value(v);
}

/* Metadata and timers (after the rules, if any). */
static void update_life(wk_call *c)
{
    json_t *md = json_object_get(c->job.args, "metadata");
    int rules = json_object_get(c->job.args, "allow_out") || json_object_get(c->job.args, "deny_out");
    char *md_text = NULL;
    int rc;

    if (!has_life(c->job.args)) {
        show(c, MSG_REDIS_DOWN_AFTER_RULES);
        return;
    }
    if (md && !(md_text = json_dumps(md, JSON_COMPACT))) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    rc = sf_timers_update(c->ctx->redis, c->job.sandbox, c->job.team, sf_now_ms(), md_text,
                          nullable(c->job.args, "timeout_seconds", SF_TIMERS_RESET),
                          nullable(c->job.args, "auto_delete_seconds", 0), on_life_updated, c);
    free(md_text);
    if (rc < 0)
        wk_reply_error(c, SF_ERR_UNAVAILABLE, rules ? MSG_REDIS_DOWN_AFTER_RULES :
                       SF_MSG_STORE_DOWN_NOTHING_CHANGED);
}

static void on_rules_changed(void *arg, wk_box *b, int rc, const char *code, const char *why)
{
    wk_call *c = arg;

    if (!b)
        reply_gone(c);
    else if (rc < 0)
        wk_reply_error(c, code, why);
    else {
        wk_restart_save(b); /* its rules outlive a worker restart */
        update_life(c);
    }
}

/* The rules, metadata and timers, after the preview fields (if any). */
static void update_rest(wk_call *c)
{
    wk_box *b = sf_map_get(c->ctx->sandboxes, c->job.sandbox);
    json_t *allow = json_object_get(c->job.args, "allow_out");
    json_t *deny = json_object_get(c->job.args, "deny_out");

    if (!b || b->state != WK_BOX_RUNNING)
        reply_gone(c);
    else if (allow || deny)
        wk_egress_change(c->ctx->egress, b, allow, deny, NULL, on_rules_changed, c);
    else
        update_life(c);
}

static void do_update(wk_call *c, wk_box *b)
{
    int preview = json_object_get(c->job.args, "preview_access") ||
                  json_object_get(c->job.args, "preview_close");

    if (!json_object_get(c->job.args, "allow_out") && !json_object_get(c->job.args, "deny_out") &&
        !has_life(c->job.args) && !preview) {
        wk_reply_error(c, SF_ERR_INVALID, "sandbox_update changes metadata, timeout_seconds, "
                       "auto_delete_seconds, allow_out, deny_out, preview_access and "
                       "preview_close: pass at least one of them.");
        return;
    }
    if (preview)
        wk_preview_update(c, b, update_rest); /* preview.c */
    else
        update_rest(c);
}

WK_HANDLERS({"sandbox_update", do_update});
