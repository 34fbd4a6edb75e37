/* route.c: a call for a tool that runs on a host goes to the host that owns its sandbox:
 * the record says which (and whether the sandbox is still there), the host's heartbeat
 * whether it is live; then the call is forwarded (call.c), or answered why not. */
#include "sched.h"
#include "sf_store.h"
#include "sf_msg.h"

#include <stdlib.h>
#include <string.h>

static void not_found(sch_call *c)
{
    char text[256];
    sch_call_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), c->job.sandbox));
}

static void route_verdict(sch_call *c, const char *verdict, const char *host)
{
    char text[256];

    if (!strcmp(verdict, "ok")) {
        sch_call_forward(c, host);
        return;
    }
    if (!strcmp(verdict, "none")) {
        not_found(c);
        return;
    }
    if (!strcmp(verdict, "killed")) {
        if (!strcmp(c->job.tool, "sandbox_kill")) {
            sch_call_result(c, json_pack("{s:s, s:s}", "id", c->job.sandbox, "status", "killed"));
            return;
        }
        snprintf(text, sizeof(text),
                 SF_MSG_SANDBOX_KILLED_FMT, c->job.sandbox);
    } else if (!strcmp(verdict, "failed")) {
        snprintf(text, sizeof(text),
                 SF_MSG_SANDBOX_FAILED_FMT,
                 c->job.sandbox);
    } else if (!strcmp(verdict, "stale")) {
        snprintf(text, sizeof(text),
                 "The host of sandbox '%s' is not responding; retry in a few seconds, or create "
                 "a new sandbox with sandbox_create.", c->job.sandbox);
        sch_call_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    } else {
        snprintf(text, sizeof(text),
                 "Sandbox '%s' was lost with its host; create a new one with sandbox_create.",
                 c->job.sandbox);
    }
    sch_call_error(c, SF_ERR_NOT_FOUND, text);
}

/* Routing reads the record (its slot), then its host's heartbeat (sf:hosts): two reads,
 * each one slot; no write depends on them. */
typedef struct route_op {
    sch_call *c;
    char host[SF_ID_MAX];
} route_op;

static void on_route_host(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    route_op *op = priv;
    sch_call *c = op->c;
    char host[SF_ID_MAX];

    (void)ac;
    snprintf(host, sizeof(host), "%s", op->host);
    free(op);
    if (!rep || (rep->type != REDIS_REPLY_STRING && rep->type != REDIS_REPLY_NIL)) {
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (rep->type == REDIS_REPLY_NIL ||
        strtoll(rep->str, NULL, 10) < sf_now_ms() - c->ctx->cfg.host_ttl_ms)
        route_verdict(c, "stale", host);
    else
        route_verdict(c, "ok", host);
}

static void on_route_record(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    route_op *op = priv;
    sch_call *c = op->c;
    const char *team, *st;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
        free(op);
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    team = rep->element[0]->type == REDIS_REPLY_STRING ? rep->element[0]->str : NULL;
    st = rep->element[2]->type == REDIS_REPLY_STRING ? rep->element[2]->str : "";
    if (rep->element[1]->type == REDIS_REPLY_STRING && rep->element[1]->len < SF_ID_MAX)
        snprintf(op->host, sizeof(op->host), "%s", rep->element[1]->str);
    if (!team || strcmp(team, c->job.team) != 0 || !strcmp(st, "killed") ||
        !strcmp(st, "failed") || !strcmp(st, "lost") || !op->host[0]) {
        const char *v = !team || strcmp(team, c->job.team) ? "none" : op->host[0] ? st : "stale";
        free(op);
        route_verdict(c, v, "");
        return;
    }
    if (sf_redis_cmd(c->ctx->redis, on_route_host, op, "ZSCORE " SF_RK_HOSTS " %s", op->host) <
        0) {
        free(op);
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
    }
}

void sch_route_to_owner(sch_call *c)
{
    route_op *op = calloc(1, sizeof(*op));

    if (!op) {
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    op->c = c;
    if (sf_redis_cmd(c->ctx->redis, on_route_record, op, "HMGET " SF_RK_SANDBOX " team host state",
                     c->job.sandbox) < 0) {
        free(op);
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
    }
}

