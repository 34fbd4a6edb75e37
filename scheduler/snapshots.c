/* snapshots.c: the team's sandbox snapshots, answered from Redis (state/sf_snapshots.h):
 * sandbox_snapshot_list, sandbox_snapshot_delete (the record goes at once; the host that
 * holds the files removes them when it next looks, worker/snapshot.c), and the first half
 * of sandbox_create's from_snapshot: the snapshot is found (another team's is never), its
 * template, shape and host go into the create, which placement then pins to that host.
 * sandbox_snapshot itself runs on the sandbox's host (worker/snapshot.c). */
#include "sched.h"
#include "sf_log.h"
#include "sf_snapshots.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A flat HGETALL reply as a JSON object of strings (NULL: not an array). */
static json_t *rec_object(const redisReply *rep)
{
    json_t *o;

    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        return NULL;
    o = json_object();
    for (size_t i = 0; o && i + 1 < rep->elements; i += 2)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            rep->element[i + 1]->type == REDIS_REPLY_STRING)
            json_object_set_new(o, rep->element[i]->str,
                                json_stringn(rep->element[i + 1]->str, rep->element[i + 1]->len));
    return o;
}

static const char *field(const json_t *o, const char *k)
{
    const char *v = json_string_value(json_object_get(o, k));
    return v ? v : "";
}

static json_int_t num(const json_t *o, const char *k)
{
    return (json_int_t)strtoll(field(o, k), NULL, 10);
}

static void no_snapshot(sch_call *c, const char *ref)
{
    char text[256];

    snprintf(text, sizeof(text), "No snapshot named '%.63s' exists for your team; "
             "sandbox_snapshot_list shows your snapshots.", ref ? ref : "");
    sch_call_error(c, SF_ERR_NOT_FOUND, text);
}

static int redis_failed(sch_call *c, const redisReply *rep, const char *what)
{
    if (rep && rep->type != REDIS_REPLY_ERROR)
        return 0;
    if (sf_redis_is_oom(rep)) {
        sch_call_error(c, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return 1;
    }
    sf_error("msg=\"%s script failed\" job=%s err=\"%s\"", what, c->job.id,
             rep ? rep->str : "no reply");
    sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
    return 1;
}

/* ---- sandbox_snapshot_list --------------------------------------------------------- */

static void on_list(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    json_t *arr;

    (void)ac;
    if (redis_failed(c, rep, "snapshot list"))
        return;
    arr = json_array();
    for (size_t i = 0; arr && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        json_t *o = rec_object(rep->element[i]);
        if (!o || !json_object_size(o)) {
            json_decref(o);
            continue;
        }
        json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:s, s:I}", "name",
                                             field(o, "name"), "snapshot_id", field(o, "id"),
                                             "size", num(o, "size"), "status", field(o, "status"),
                                             "sandbox_id", field(o, "sandbox"), "template",
                                             field(o, "template"), "driver", field(o, "driver"),
                                             "created", num(o, "created")));
        json_decref(o);
    }
    sch_call_result(c, json_pack("{s:o}", "snapshots", arr ? arr : json_array()));
}

void sch_snap_list(sch_call *c)
{
    if (sf_snap_list(c->ctx->redis, c->job.team, on_list, c) < 0)
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

/* ---- sandbox_snapshot_delete ------------------------------------------------------- */

static void on_delete(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    const char *ref = json_string_value(json_object_get(c->job.args, "snapshot"));
    const char *verdict;
    char text[256];

    (void)ac;
    if (redis_failed(c, rep, "snapshot delete"))
        return;
    verdict = rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
                      rep->element[0]->type == REDIS_REPLY_STRING
                  ? rep->element[0]->str
                  : "";
    if (!strcmp(verdict, "ok") && rep->elements >= 4) {
        sf_info("msg=\"snapshot deleted\" job=%s team=%s snapshot=%s host=%s", c->job.id,
                c->job.team, rep->element[1]->str, rep->element[3]->str);
        sch_call_result(c, json_pack("{s:s, s:s, s:s}", "snapshot_id", rep->element[1]->str,
                                      "name", rep->element[2]->str, "status", "deleted"));
    } else if (!strcmp(verdict, "taking")) {
        snprintf(text, sizeof(text), "Snapshot '%.63s' is still being taken; delete it once "
                 "sandbox_snapshot answered.", ref ? ref : "");
        sch_call_error(c, SF_ERR_UNAVAILABLE, text);
    } else {
        no_snapshot(c, ref);
    }
}

void sch_snap_delete(sch_call *c)
{
    const char *ref = json_string_value(json_object_get(c->job.args, "snapshot"));

    if (!ref || sf_snap_delete(c->ctx->redis, c->job.team, ref, on_delete, c) < 0)
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

/* ---- sandbox_create from_snapshot -------------------------------------------------- */

static void on_found(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    json_t *a = c->job.args, *o, *l;
    const char *ref = json_string_value(json_object_get(a, "from_snapshot"));
    char text[256];
    static const char *const shape[] = {"memory_mib", "vcpu_milli", "disk_mib", "pids_max",
                                        "inodes"};

    (void)ac;
    if (redis_failed(c, rep, "snapshot find"))
        return;
    if (!(o = rec_object(rep)) || !json_object_size(o)) {
        json_decref(o);
        no_snapshot(c, ref);
        return;
    }
    if (strcmp(field(o, "status"), "ready") != 0 || !sf_id_valid(field(o, "host"))) {
        snprintf(text, sizeof(text), "Snapshot '%.63s' is still being taken; retry once "
                 "sandbox_snapshot answered.", ref ? ref : "");
        json_decref(o);
        sch_call_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    }
    /* its template (placement pins a team template's host too: the same host), its shape,
     * its id for the worker (the files are under that id on the host) */
    json_object_set_new(a, "from_template", json_string(field(o, "template")));
    json_object_set_new(a, "snapshot_id", json_string(field(o, "id")));
    l = json_object();
    for (size_t i = 0; l && i < SF_ARRAY_LEN(shape); i++)
        if (num(o, shape[i]) > 0)
            json_object_set_new(l, shape[i], json_integer(num(o, shape[i])));
    json_object_set_new(a, "limits", l);
    snprintf(c->pin, sizeof(c->pin), "%s", field(o, "host"));
    sf_debug("msg=\"create from a snapshot\" job=%s snapshot=%s host=%s", c->job.id,
             field(o, "id"), c->pin);
    json_decref(o);
    sch_place_create(c);
}

void sch_snap_place(sch_call *c)
{
    const char *ref = json_string_value(json_object_get(c->job.args, "from_snapshot"));

    if (json_object_get(c->job.args, "from_template")) {
        sch_call_error(c, SF_ERR_INVALID, "Give from_template or from_snapshot, not both: a "
                                           "sandbox from a snapshot has the snapshot's template.");
        return;
    }
    if (!ref || sf_snap_find(c->ctx->redis, c->job.team, ref, on_found, c) < 0)
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}
