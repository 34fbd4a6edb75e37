/* list.c: sandbox_list (the team's sandboxes, filtered, in pages) and sandbox_info (one
 * sandbox's public view), read from the records in Redis. Every read touches one hash
 * slot (state/sf_store.h). */
#include "sched.h"
#include "sf_log.h"
#include "sf_timers.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void not_found(sch_call *c)
{
    char text[256];
    sch_call_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), c->job.sandbox));
}

static const char *status_of(const char *state)
{
    if (!state || !strcmp(state, "creating"))
        return "starting";
    if (!strcmp(state, "running"))
        return "active";
    return state; /* killed, failed, lost, paused */
}

static void iso_time(const char *ms_text, char out[32])
{
    int64_t ms = 0;
    time_t t;
    struct tm tm;

    if (!ms_text || sf_parse_i64(ms_text, 0, INT64_MAX, &ms) < 0) {
        out[0] = '\0';
        return;
    }
    t = (time_t)(ms / 1000);
    gmtime_r(&t, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Builds the public view of a record given as a JSON object of strings. */
static json_t *record_view(json_t *rec)
{
    const char *md_text = json_string_value(json_object_get(rec, "metadata"));
    json_t *md = md_text ? json_loads(md_text, 0, NULL) : NULL;
    json_t *v = json_object();
    char created[32], active[32];
    int64_t n;

    iso_time(json_string_value(json_object_get(rec, "created")), created);
    iso_time(json_string_value(json_object_get(rec, "last_active")), active);
    json_object_set(v, "id", json_object_get(rec, "id"));
    json_object_set_new(v, "name", json_string(json_string_value(json_object_get(rec, "name"))
                                                   ?: ""));
    json_object_set_new(v, "status",
                        json_string(status_of(json_string_value(json_object_get(rec, "state")))));
    json_object_set_new(v, "template",
                        json_string(json_string_value(json_object_get(rec, "template")) ?: "base"));
    json_object_set_new(v, "metadata", json_is_object(md) ? md : json_object());
    if (!json_is_object(md))
        json_decref(md);
    json_object_set_new(v, "created_at", json_string(created));
    json_object_set_new(v, "last_active_at", json_string(active));
    if (sf_parse_i64(json_string_value(json_object_get(rec, "timeout_seconds")), 1, INT64_MAX,
                     &n) == 0)
        json_object_set_new(v, "timeout_seconds", json_integer(n));
    return v;
}

/* A page's reply stays well inside one Kafka message (SF_MSG_MAX): records are added
 * while their JSON fits this budget, and the page ends early (with next_cursor) when the
 * next one would not. msgpack is never larger than compact JSON for these values. */
#define LIST_REPLY_BUDGET (768 * 1024)
#define LIST_LIMIT_DEFAULT 50

/* Cursor text: "<created ms>.<id>" of the last sandbox of the previous page. */
static int cursor_parse(const char *s, char created[24], char id[SF_ID_MAX])
{
    const char *dot = s ? strchr(s, '.') : NULL;
    int64_t ms;

    if (!dot || (size_t)(dot - s) >= 24 || strlen(dot + 1) >= SF_ID_MAX)
        return -EINVAL;
    memcpy(created, s, (size_t)(dot - s));
    created[dot - s] = '\0';
    snprintf(id, SF_ID_MAX, "%s", dot + 1);
    if (sf_parse_i64(created, 0, INT64_MAX, &ms) < 0 || !sf_id_valid(id))
        return -EINVAL;
    return 0;
}

/* sandbox_list: the team's set (its slot), then each member's record (one slot each, all
 * sent at once): team, created, metadata to filter and order them, then the page's
 * records whole. */
typedef struct list_op {
    sch_call *c;
    json_t *filter;         /* metadata filter (object), or NULL */
    char ccur[24], icur[SF_ID_MAX];
    size_t limit, pending;
    int failed, more;
    json_t *rows;           /* [{id, created}] that pass, then the page's records */
} list_op;

static void list_free(list_op *op)
{
    json_decref(op->filter);
    json_decref(op->rows);
    free(op);
}

static void list_fail(list_op *op, const redisReply *rep)
{
    sch_call *c = op->c;

    sf_error("msg=\"list read failed\" job=%s err=\"%s\"", c->job.id,
             rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
    list_free(op);
    sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

typedef struct list_one {
    list_op *op;
    char id[SF_ID_MAX];
    json_t *slot; /* the page's record goes here */
} list_one;

/* One read of a fan-out, its answer to go into slot: op->pending counts the reads out
 * (the sender holds one count itself). -1 (op->failed set) when it could not be sent. */
static int list_read(list_op *op, json_t *slot, const char *id, redisCallbackFn *cb,
                     const char *fmt)
{
    list_one *one = calloc(1, sizeof(*one));

    if (!one) {
        op->failed = 1;
        return -1;
    }
    one->op = op;
    one->slot = slot;
    snprintf(one->id, sizeof(one->id), "%s", id);
    op->pending++;
    if (sf_redis_cmd(op->c->ctx->redis, cb, one, fmt, one->id) < 0) {
        free(one);
        op->pending--;
        op->failed = 1;
        return -1;
    }
    return 0;
}

/* A read (or the sender) is done; the last one takes the next step, or fails the call. */
static void list_done(list_op *op, void (*next)(list_op *))
{
    if (--op->pending)
        return;
    if (op->failed)
        list_fail(op, NULL);
    else
        next(op);
}

static void list_answer(list_op *op)
{
    sch_call *c = op->c;
    json_t *out = json_array(), *res, *rec, *last = NULL;
    size_t i, bytes = 0;
    int more = op->more;

    json_array_foreach(op->rows, i, rec) {
        json_t *v;
        size_t n;
        if (!json_object_size(rec)) /* gone between the two reads */
            continue;
        v = record_view(rec);
        n = json_dumpb(v, NULL, 0, JSON_COMPACT) + 1;
        if (bytes + n > LIST_REPLY_BUDGET && json_array_size(out) > 0) {
            json_decref(v);
            more = 1;
            break;
        }
        bytes += n;
        json_array_append_new(out, v);
        last = rec;
    }
    res = json_pack("{s:o, s:I}", "sandboxes", out, "count", (json_int_t)json_array_size(out));
    if (more && last) {
        char cur[24 + SF_ID_MAX + 1];
        snprintf(cur, sizeof(cur), "%s.%s",
                 json_string_value(json_object_get(last, "created")) ?: "0",
                 json_string_value(json_object_get(last, "id")) ?: "");
        json_object_set_new(res, "next_cursor", json_string(cur));
    }
    list_free(op);
    sch_call_result(c, res);
}

static void on_list_record(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    list_one *one = priv;
    list_op *op = one->op;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        op->failed = 1;
    } else {
        for (size_t i = 0; i + 1 < rep->elements; i += 2)
            json_object_set_new(one->slot, rep->element[i]->str,
                                json_stringn(rep->element[i + 1]->str, rep->element[i + 1]->len));
        /* a record that changed team since the first read is not listed */
        if (strcmp(json_string_value(json_object_get(one->slot, "team")) ?: "", op->c->job.team))
            json_object_clear(one->slot);
    }
    free(one);
    list_done(op, list_answer);
}

static int row_cmp(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    json_int_t cx = json_integer_value(json_object_get(x, "c"));
    json_int_t cy = json_integer_value(json_object_get(y, "c"));

    if (cx != cy)
        return cx < cy ? -1 : 1;
    return strcmp(json_string_value(json_object_get(x, "id")),
                  json_string_value(json_object_get(y, "id")));
}

/* Every member's team, created and metadata have arrived: filter, order, page. */
static void list_page(list_op *op)
{
    size_t n = json_array_size(op->rows), keep = 0;
    json_t **v = n ? calloc(n, sizeof(*v)) : NULL, *page = json_array();

    if (n && !v) {
        json_decref(page);
        list_fail(op, NULL);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_array_get(op->rows, i);
        if (json_is_true(json_object_get(row, "ok")))
            v[keep++] = row;
    }
    if (keep)
        qsort(v, keep, sizeof(*v), row_cmp);
    op->more = keep > op->limit;
    for (size_t i = 0; i < keep && i < op->limit; i++)
        json_array_append_new(page, json_pack("{s:s}", "id",
                                              json_string_value(json_object_get(v[i], "id"))));
    free(v);
    json_decref(op->rows);
    op->rows = page;
    op->pending = 1;
    for (size_t i = 0; i < json_array_size(page); i++) {
        json_t *slot = json_array_get(page, i);
        char id[SF_ID_MAX];

        snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(slot, "id")));
        json_object_clear(slot);
        if (list_read(op, slot, id, on_list_record, "HGETALL " SF_RK_SANDBOX) < 0)
            break;
    }
    list_done(op, list_answer);
}

/* {team, created, metadata} of one member: does it pass the filter and the cursor? */
static void on_list_head(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    list_one *one = priv;
    list_op *op = one->op;
    json_int_t created;
    int ok;

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
        op->failed = 1;
    } else if (rep->element[0]->type == REDIS_REPLY_STRING &&
               !strcmp(rep->element[0]->str, op->c->job.team)) {
        created = rep->element[1]->type == REDIS_REPLY_STRING
                      ? strtoll(rep->element[1]->str, NULL, 10)
                      : 0;
        ok = created > strtoll(op->ccur, NULL, 10) ||
             (created == strtoll(op->ccur, NULL, 10) && strcmp(one->id, op->icur) > 0);
        if (ok && op->filter && json_object_size(op->filter)) {
            json_t *md = rep->element[2]->type == REDIS_REPLY_STRING
                             ? json_loads(rep->element[2]->str, 0, NULL)
                             : NULL;
            const char *k;
            json_t *want;
            json_object_foreach(op->filter, k, want) {
                if (!json_equal(json_object_get(md, k), want))
                    ok = 0;
            }
            json_decref(md);
        }
        json_object_set_new(one->slot, "c", json_integer(created));
        json_object_set_new(one->slot, "ok", json_boolean(ok));
    }
    free(one);
    list_done(op, list_page);
}

static void on_list_members(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    list_op *op = priv;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        list_fail(op, rep);
        return;
    }
    op->pending = 1;
    for (size_t i = 0; i < rep->elements; i++) {
        json_t *row;
        if (rep->element[i]->type != REDIS_REPLY_STRING || !sf_id_valid(rep->element[i]->str))
            continue;
        if (!(row = json_pack("{s:s}", "id", rep->element[i]->str))) {
            op->failed = 1;
            break;
        }
        json_array_append_new(op->rows, row);
        if (list_read(op, row, rep->element[i]->str, on_list_head,
                      "HMGET " SF_RK_SANDBOX " team created metadata") < 0)
            break;
    }
    list_done(op, list_page);
}

void sch_list_sandboxes(sch_call *c)
{
    json_t *a = c->job.args, *md = json_object_get(a, "metadata");
    const char *cursor = json_string_value(json_object_get(a, "cursor"));
    json_int_t limit = json_integer_value(json_object_get(a, "limit"));
    list_op *op;

    if (!(op = calloc(1, sizeof(*op))) || !(op->rows = json_array())) {
        free(op);
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    op->c = c;
    snprintf(op->ccur, sizeof(op->ccur), "-1");
    if (cursor && cursor_parse(cursor, op->ccur, op->icur) < 0) {
        list_free(op);
        sch_call_error(c, SF_ERR_INVALID, "Argument 'cursor' is not a cursor sandbox_list "
                                           "gave; pass the next_cursor of the previous page, "
                                           "or omit it for the first page.");
        return;
    }
    op->limit = (size_t)(limit > 0 ? limit : LIST_LIMIT_DEFAULT);
    op->filter = json_is_object(md) ? json_incref(md) : NULL;
    if (sf_redis_cmd(c->ctx->redis, on_list_members, op, "SMEMBERS " SF_RK_TEAM_SANDBOXES,
                     c->job.team) < 0) {
        list_free(op);
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
    }
}

/* A record's integer field (a string in Redis), or the fallback field, or 0. */
static int64_t field_i64(json_t *rec, const char *name, const char *fallback)
{
    int64_t n = 0;

    if (sf_parse_i64(json_string_value(json_object_get(rec, name)), 0, INT64_MAX, &n) < 0 &&
        fallback)
        sf_parse_i64(json_string_value(json_object_get(rec, fallback)), 0, INT64_MAX, &n);
    return n;
}

/* A record field holding JSON (written by the worker), or an empty array / object. */
static json_t *json_field(json_t *rec, const char *name, int object)
{
    const char *text = json_string_value(json_object_get(rec, name));
    json_t *v = text ? json_loads(text, 0, NULL) : NULL;

    if (object ? json_is_object(v) : json_is_array(v))
        return v;
    json_decref(v);
    return object ? json_object() : json_array();
}

/* The sandbox's egress as its worker applied it: the default, allow_out, deny_out. */
static json_t *network_view(json_t *rec)
{
    const char *deflt = json_string_value(json_object_get(rec, "egress_default"));

    if (!deflt) /* a worker without an egress proxy: no network at all */
        return json_pack("{s:s, s:[], s:[]}", "egress_default", "none", "allow_out", "deny_out");
    return json_pack("{s:s, s:o, s:o}", "egress_default", deflt, "allow_out",
                     json_field(rec, "allow_out", 0), "deny_out", json_field(rec, "deny_out", 0));
}

static void on_info(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    json_t *rec, *view;
    const char *team;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    rec = json_object();
    for (size_t i = 0; i + 1 < rep->elements; i += 2)
        json_object_set_new(rec, rep->element[i]->str,
                            json_stringn(rep->element[i + 1]->str, rep->element[i + 1]->len));
    team = json_string_value(json_object_get(rec, "team"));
    if (!team || strcmp(team, c->job.team) != 0) {
        json_decref(rec);
        not_found(c);
        return;
    }
    view = record_view(rec);
    {
        /* What the worker applied, else what placement reserved. */
        int64_t mem = field_i64(rec, "memory_mib", "res_mem_mib");
        int64_t vcpu = field_i64(rec, "vcpu_milli", "res_vcpu_milli");
        json_t *res = json_object();
        json_object_set_new(res, "vcpu", json_real((double)vcpu / 1000.0));
        json_object_set_new(res, "memory_mib", json_integer(mem));
        json_object_set_new(res, "pids_max", json_integer(field_i64(rec, "pids_max", NULL)));
        if (json_object_get(rec, "disk_mib"))
            json_object_set_new(res, "disk_mib", json_integer(field_i64(rec, "disk_mib", NULL)));
        json_object_set_new(view, "resources", res);
        json_object_set_new(view, "driver",
                            json_string(json_string_value(json_object_get(rec, "driver")) ?: ""));
        json_object_set_new(view, "network", network_view(rec));
        json_object_set_new(view, "secrets", json_field(rec, "secrets", 1));
    }
    sf_timers_view(rec, view);
    json_decref(rec);
    sch_call_result(c, view);
}

void sch_list_info(sch_call *c)
{
    if (!c->job.sandbox[0]) {
        sch_call_error(c, SF_ERR_INVALID, SF_MSG_ARG_SANDBOX_ID);
        return;
    }
    if (sf_redis_cmd(c->ctx->redis, on_info, c, "HGETALL " SF_RK_SANDBOX, c->job.sandbox) < 0)
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

