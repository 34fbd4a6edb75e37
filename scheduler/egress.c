/* egress.c: the egress tools the scheduler answers from Redis (no sandbox is touched, a
 * paused one is not resumed): secret_list (the team's secrets, metadata only) and
 * sandbox_network_log (the sandbox's capped stream the secret-proxy writes). */
#include "sched.h"
#include "sf_netlog.h"
#include "sf_records.h"
#include "sf_secrets.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- secret_list ---------------------------------------------------------------- */

typedef struct sl_req sl_req;
typedef struct sl_slot {
    sl_req *req;
    size_t i;
} sl_slot;

struct sl_req {
    sch_call *c;
    json_t *items;           /* one slot per name, in name order (null until read) */
    sl_slot *slots;
    size_t pending;
    int failed;
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void sl_finish(sl_req *q)
{
    json_t *out;
    size_t i;
    json_t *v;

    if (q->failed) {
        sch_call_error(q->c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
    } else if ((out = json_array())) {
        json_array_foreach(q->items, i, v)
            if (json_is_object(v))
                json_array_append(out, v);
        sch_call_result(q->c, json_pack("{s:o, s:I}", "secrets", out, "count",
                                         (json_int_t)json_array_size(out)));
    } else {
        sch_call_error(q->c, SF_ERR_INTERNAL, SF_MSG_SCHED_NOMEM);
    }
    json_decref(q->items);
    free(q->slots);
    free(q);
}

static void on_secret(redisAsyncContext *ac, void *r, void *priv)
{
    sl_slot *s = priv;
    sl_req *q = s->req;
    redisReply *rep = r;
    sf_secret sec;

    sf_secret_init(&sec);
    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        q->failed = 1;
    else if (sf_secret_from_reply(rep, &sec, NULL) == 0 && !strcmp(sec.team, q->c->job.team))
        json_array_set_new(q->items, s->i, sf_secret_json(&sec)); /* metadata, never the value */
    /* else deleted meanwhile: left out */
    sf_secret_fini(&sec);
    if (--q->pending == 0)
        sl_finish(q);
}

static void on_secret_names(redisAsyncContext *ac, void *r, void *priv)
{
    sch_call *c = priv;
    redisReply *rep = r;
    const char **names = NULL;
    size_t n = 0;
    sl_req *q;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (!(q = calloc(1, sizeof(*q))) || !(q->items = json_array()) ||
        (rep->elements && (!(names = calloc(rep->elements, sizeof(*names))) ||
                           !(q->slots = calloc(rep->elements, sizeof(*q->slots)))))) {
        if (q) {
            json_decref(q->items);
            free(q->slots);
        }
        free(q);
        free(names);
        sch_call_error(c, SF_ERR_INTERNAL, SF_MSG_SCHED_NOMEM);
        return;
    }
    q->c = c;
    for (size_t i = 0; i < rep->elements && i < SF_SECRETS_TEAM_MAX; i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            sf_secret_name_valid(rep->element[i]->str))
            names[n++] = rep->element[i]->str;
    qsort(names, n, sizeof(*names), cmp_str);
    q->pending = 1; /* held until every read is sent */
    for (size_t i = 0; i < n; i++) {
        q->slots[i] = (sl_slot){q, i};
        json_array_append_new(q->items, json_null());
        if (sf_redis_cmd(c->ctx->redis, on_secret, &q->slots[i], "HGETALL " SF_RK_SECRET,
                         c->job.team, names[i]) < 0) {
            q->failed = 1;
            break;
        }
        q->pending++;
    }
    free(names);
    if (--q->pending == 0)
        sl_finish(q);
}

void sch_egress_secret_list(sch_call *c)
{
    if (sf_redis_cmd(c->ctx->redis, on_secret_names, c, "SMEMBERS " SF_RK_TEAM_SECRETS,
                     c->job.team) < 0)
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

/* ---- sandbox_network_log ---------------------------------------------------------- */

typedef struct nl_req {
    sch_call *c;
    int limit;
    char verdict[16];
} nl_req;

static void nl_fail(nl_req *q, const char *code, const char *text)
{
    sch_call_error(q->c, code, text);
    free(q);
}

static void on_log(redisAsyncContext *ac, void *r, void *priv)
{
    nl_req *q = priv;
    json_t *entries = NULL;

    if (sf_netlog_from_reply(r, q->limit, q->verdict, &entries) < 0) {
        nl_fail(q, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    sch_call_result(q->c, json_pack("{s:s, s:o, s:I}", "sandbox_id", q->c->job.sandbox,
                                     "entries", entries, "count",
                                     (json_int_t)json_array_size(entries)));
    free(q);
}

static void on_owner(redisAsyncContext *ac, void *r, void *priv)
{
    nl_req *q = priv;
    redisReply *rep = r;
    const char *team;
    char text[256];
    /* with a verdict filter the whole capped stream is read, else just the page */
    long count = q->verdict[0] ? SF_NETLOG_CAP_DEFAULT : q->limit;

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 1) {
        nl_fail(q, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    team = rep->element[0]->type == REDIS_REPLY_STRING ? rep->element[0]->str : NULL;
    if (!team || strcmp(team, q->c->job.team) != 0) {
        nl_fail(q, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), q->c->job.sandbox));
        return;
    }
    if (sf_redis_cmd(q->c->ctx->redis, on_log, q, "XREVRANGE " SF_RK_NETLOG " + - COUNT %ld",
                     q->c->job.sandbox, count) < 0)
        nl_fail(q, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

void sch_egress_network_log(sch_call *c)
{
    const json_t *a = c->job.args;
    const json_t *lim = json_object_get(a, "limit");
    const char *verdict = json_string_value(json_object_get(a, "verdict"));
    nl_req *q;
    char why[256];
    int limit;

    if (sf_netlog_args_check(json_is_integer(lim) ? json_integer_value(lim) : 0, verdict,
                             &limit, why, sizeof(why)) < 0) {
        sch_call_error(c, SF_ERR_INVALID, why);
        return;
    }
    if (!(q = calloc(1, sizeof(*q)))) {
        sch_call_error(c, SF_ERR_INTERNAL, SF_MSG_SCHED_NOMEM);
        return;
    }
    q->c = c;
    q->limit = limit;
    snprintf(q->verdict, sizeof(q->verdict), "%s", verdict ? verdict : "");
    if (sf_redis_cmd(c->ctx->redis, on_owner, q, "HMGET " SF_RK_SANDBOX " team",
                     c->job.sandbox) < 0)
        nl_fail(q, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}
