/* create.c: sandbox_create on this host: the limits, the room, the template's layers or a
 * snapshot, the driver's create, then the egress, the template's service and the record. */
#include "worker.h"
#include "restart.h"
#include "egress.h"
#include "tpl_start.h"
#include "tstore.h"
#include "sf_claim.h"
#include "sf_events.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_tools.h"
#include "sf_trace.h"
#include "sf_msg.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static json_t *create_result(const wk_box *b, const char *name)
{
    return json_pack("{s:s, s:s, s:s}", "id", b->id, "name", name ? name : "", "status", "active");
}

/* The record says running (or Redis could not be asked: the sandbox runs, the periodic
 * check reconciles): the create is answered ok. A record that is no longer live (the
 * platform gave the sandbox up while it started: lost with its host's restart, or killed)
 * would leave an orphan: the sandbox goes and the create is answered with why. */
static void on_started(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_call *c = priv;
    wk_ctx *ctx = c->ctx;
    wk_box *b = sf_map_get(ctx->sandboxes, c->job.sandbox);
    const char *name = json_string_value(json_object_get(c->job.args, "name"));

    if (!b || b->state != WK_BOX_RUNNING ||
        (rep && rep->type == REDIS_REPLY_INTEGER && rep->integer <= 0)) {
        sf_warn("msg=\"sandbox given up while it started; removing it\" sandbox=%s job=%s",
                c->job.sandbox, c->job.id);
        if (b && b->state == WK_BOX_RUNNING)
            wk_box_kill(b, "failed");
        wk_reply_error(c, SF_ERR_UNAVAILABLE, "The sandbox was given up while it started (its host "
                                           "restarted, or it was killed); create a new one.");
        return;
    }
    if (rep && rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"redis write failed\" err=\"%s\"", rep->str);
    {
        json_t *x = json_pack("{s:s, s:i, s:i, s:i, s:i}", "driver", ctx->ops->name,
                              "memory_mib", (json_int_t)b->lim.memory_mib, "vcpu_milli",
                              (json_int_t)b->lim.vcpu_milli, "disk_mib",
                              (json_int_t)b->lim.disk_mib, "pids_max", (json_int_t)b->lim.pids_max);
        wk_event(ctx, "created", b->team, b->id, x);
        json_decref(x);
    }
    wk_life_started(b, c->job.args);
    wk_restart_save(b); /* a worker restart keeps it (restart.h) */
    sf_info("msg=\"sandbox created\" sandbox=%s team=%s job=%s", b->id, b->team, c->job.id);
    wk_reply_result(c, create_result(b, name));
}

/* The sandbox runs (and its egress is registered): it is answered as created. */
static void started(wk_box *b)
{
    wk_ctx *ctx = b->ctx;
    wk_call *c = b->create;
    char mem[24], pids[24], vcpu[24], disk[24];
    const char *kv[12 + 8];
    size_t n = 0;

    b->create = NULL;
    b->state = WK_BOX_RUNNING;
    ctx->ops->limits(b->sb, &b->lim); /* what the driver applied: the same, defaults filled in */
    snprintf(mem, sizeof(mem), "%u", b->lim.memory_mib);
    snprintf(vcpu, sizeof(vcpu), "%u", b->lim.vcpu_milli);
    snprintf(disk, sizeof(disk), "%u", b->lim.disk_mib);
    snprintf(pids, sizeof(pids), "%u", b->lim.pids_max);
    kv[n++] = "driver";
    kv[n++] = ctx->ops->name;
    kv[n++] = "memory_mib";
    kv[n++] = mem;
    kv[n++] = "vcpu_milli";
    kv[n++] = vcpu;
    kv[n++] = "disk_mib";
    kv[n++] = disk;
    kv[n++] = "pids_max";
    kv[n++] = pids;
    kv[n++] = "preview_access"; /* of ports published from now on (preview.c) */
    kv[n++] = b->pv_private ? "private" : "public";
    n += wk_egress_record_kv(b->eg, kv + n);
    /* state=running and back in its sets, only while the record is live (lands even
     * when Redis is full, never re-creates a record that is gone); answered then */
    if (sf_records_started(ctx->redis, b->id, ctx->host_id, n, kv, on_started, c) < 0)
        on_started(NULL, NULL, c);
}

/* A create that ended before the sandbox was answered as running: killed meanwhile
 * (that kill was answered), the worker stopping, or its egress refused. */
static int create_cut_short(wk_box *b)
{
    wk_ctx *ctx = b->ctx;
    wk_call *c = b->create;
    int was_killed = b->state == WK_BOX_KILLING;

    if (!was_killed && !ctx->stopping)
        return 0;
    b->create = NULL;
    b->state = WK_BOX_RUNNING;
    wk_box_kill(b, was_killed ? b->end_state : "failed");
    if (was_killed)
        wk_reply_error(c, SF_ERR_NOT_FOUND, "The sandbox was killed while it was starting; "
                                         "create a new one with sandbox_create.");
    else
        wk_reply_error(c, SF_ERR_UNAVAILABLE, SF_MSG_HOST_STOPPING);
    return 1;
}

typedef struct svc_failed {
    wk_call *c;
    const char *code;
    char text[2400];
} svc_failed;

static void on_svc_failed_written(redisAsyncContext *ac, void *r, void *priv)
{
    svc_failed *f = priv;

    wk_redis_logged(ac, r, NULL);
    wk_reply_error(f->c, f->code, f->text);
    free(f);
}

/* The template's service came up (or failed: the sandbox goes, and once its record says
 * so the create says why). */
static void on_service(wk_box *b, int rc, const char *why)
{
    wk_call *c = b->create;
    svc_failed *f;

    if (create_cut_short(b))
        return;
    if (rc < 0) {
        sf_info("msg=\"create failed: template service\" sandbox=%s rc=%d", b->id, rc);
        b->create = NULL;
        b->state = WK_BOX_RUNNING;
        if (!(f = calloc(1, sizeof(*f)))) {
            wk_box_kill(b, "failed");
            wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
            return;
        }
        f->c = c;
        f->code = rc == -ETIMEDOUT ? SF_ERR_INVALID : SF_ERR_UNAVAILABLE;
        snprintf(f->text, sizeof(f->text), "The sandbox's template did not start its service: "
                 "%s. The sandbox was removed; fix the template's start_cmd or ready_cmd "
                 "(delete it and build it again), or create from another template.",
                 why ? why : "no reason");
        if (wk_box_kill_then(b, "failed", on_svc_failed_written, f) < 0)
            on_svc_failed_written(NULL, NULL, f);
        return;
    }
    started(b);
}

/* The driver and the egress are ready: the template's service (tpl_start.h), if it has
 * one, then the create is answered. */
static void service_then_started(wk_box *b)
{
    int rc = wk_tpl_start_box(b, on_service);

    if (rc == 1)
        started(b); /* its template has none */
    else if (rc < 0)
        on_service(b, rc, "the host is out of memory; retry in a few seconds");
}

static void on_egress_ready(wk_box *b, int rc, const char *code, const char *why)
{
    wk_call *c = b->create;

    if (create_cut_short(b))
        return;
    if (rc < 0) {
        sf_info("msg=\"create refused by its egress\" sandbox=%s why=\"%s\"", b->id, why);
        b->create = NULL;
        b->state = WK_BOX_RUNNING;
        wk_box_kill(b, "failed");
        wk_reply_error(c, code, why);
        return;
    }
    service_then_started(b);
}

static void on_created(void *arg, wk_sandbox *sb, int rc, const char *why)
{
    wk_box *b = arg;
    wk_ctx *ctx = b->ctx;
    wk_call *c = b->create;

    wk_snap_unuse(ctx, b->snap_used);

    if (rc < 0) {
        char text[512];
        b->create = NULL;
        snprintf(text, sizeof(text), "The sandbox could not be started (%s); retry "
                 "sandbox_create, and tell the operator if it keeps failing.",
                 why ? why : "driver error");
        wk_record_retire(ctx, b->id, "failed", 0);
        wk_event(ctx, "failed", b->team, b->id, NULL);
        wk_box_release(b);
        wk_reply_error(c, SF_ERR_INTERNAL, text);
        return;
    }
    b->sb = sb;
    if (create_cut_short(b))
        return;
    if (b->eg) { /* its way out first: then the create is answered (state stays creating) */
        wk_egress_attach(ctx->egress, b, on_egress_ready);
        return;
    }
    service_then_started(b);
}

/* args.limits (set by the scheduler, schemas/envelope.md): missing fields take the worker's
 * defaults. -1 with why when a field is not a positive integer in range. */
static int parse_limits(const wk_ctx *ctx, const json_t *l, wk_limits *out, const char **why)
{
    static const struct {
        const char *name;
        json_int_t max;
    } f[] = {
        {"memory_mib", 1 << 22}, {"vcpu_milli", 1000000}, {"disk_mib", 1 << 24},
        {"pids_max", 4000000},   {"inodes", (json_int_t)1 << 32},
    };
    json_int_t v[SF_ARRAY_LEN(f)] = {ctx->cfg.memory_mib, ctx->cfg.vcpu_milli, ctx->cfg.disk_mib,
                                     ctx->cfg.pids_max, ctx->cfg.inodes};

    if (l && !json_is_object(l)) {
        *why = "args.limits must be an object (set by the scheduler).";
        return -1;
    }
    for (size_t i = 0; l && i < SF_ARRAY_LEN(f); i++) {
        json_t *j = json_object_get(l, f[i].name);
        if (!j)
            continue;
        if (!json_is_integer(j) || json_integer_value(j) < 1 || json_integer_value(j) > f[i].max) {
            *why = "args.limits has a field that is not a positive integer in range (set by the "
                   "scheduler); ask the operator to check its sandbox shapes.";
            return -1;
        }
        v[i] = json_integer_value(j);
    }
    out->memory_mib = (uint32_t)v[0];
    out->vcpu_milli = (uint32_t)v[1];
    out->disk_mib = (uint32_t)v[2];
    out->pids_max = (uint32_t)v[3];
    out->inodes = (uint64_t)v[4];
    return 0;
}

/* Which resource a sandbox of these limits would overfill beside what the host
 * holds already (starting, running and dying sandboxes), or NULL. */
static const char *no_room(const wk_ctx *ctx, const wk_limits *l)
{
    if ((int64_t)sf_map_len(ctx->sandboxes) >= ctx->capacity)
        return "sandbox slots";
    if (ctx->used_mem_mib + l->memory_mib > ctx->res.mem_mib)
        return "memory";
    if (ctx->used_vcpu_milli + l->vcpu_milli > ctx->res.vcpu_milli)
        return "CPU";
    if (ctx->used_disk_mib + ctx->snap_disk_mib + l->disk_mib > ctx->res.disk_mib)
        return "disk"; /* (the snapshots stored here take their part: snapshot.c) */
    return NULL;
}

/* The layers of the create's template on this host (tstore.h); -1 when c was answered. */
static int template_layers(wk_call *c, char *layers[WK_LAYERS_MAX + 1])
{
    const char *name = json_string_value(json_object_get(c->job.args, "from_template"));
    char text[384];
    int rc;

    if (!name || !strcmp(name, "base"))
        return 0;
    if (!strcmp(name, "debian") ? !(c->ctx->ops->caps & WK_CAP_DEBIAN)
                                : !(c->ctx->ops->caps & WK_CAP_LAYERS)) {
        snprintf(text, sizeof(text), "This host's %s driver runs only the %s; create from "
                 "one of them, or ask the operator for a jail host.", c->ctx->ops->name,
                 c->ctx->ops->caps & WK_CAP_DEBIAN ? "'base' and 'debian' templates"
                                                   : "'base' template");
        wk_call_refuse(c, SF_ERR_INVALID, text);
        return -1;
    }
    rc = wk_tstore_layers(c->ctx->tstore, c->job.team, name, layers, text, sizeof(text));
    if (rc < 0) {
        wk_call_refuse(c, rc == -EAGAIN ? SF_ERR_UNAVAILABLE : SF_ERR_NOT_FOUND, text);
        return -1;
    }
    return 0;
}

static void do_create(wk_call *c)
{
    wk_ctx *ctx = c->ctx;
    json_t *a = c->job.args, *env = json_object_get(a, "env_vars");
    const char *name = json_string_value(json_object_get(a, "name"));
    const char *why = NULL, *full, *code = NULL;
    char text[256];
    wk_create_req req = {0};
    char *layers[WK_LAYERS_MAX + 1] = {NULL};
    wk_egbox *eg = NULL;
    char snap_dir[4200];
    const char *snap_id = NULL;
    wk_box *b;
    int rc;

    if ((b = sf_map_get(ctx->sandboxes, c->job.sandbox))) { /* redelivered: it exists already */
        if (strcmp(b->team, c->job.team) != 0 || b->state != WK_BOX_RUNNING) {
            wk_reply_error(c, SF_ERR_INVALID, "A sandbox with that id exists; let the platform "
                                           "choose the id of a new sandbox.");
            return;
        }
        wk_reply_result(c, create_result(b, name));
        return;
    }
    if (parse_limits(ctx, json_object_get(a, "limits"), &req.limits, &why) < 0) {
        wk_call_refuse(c, SF_ERR_INVALID, why);
        return;
    }
    if ((rc = template_layers(c, layers)) < 0)
        return;
    req.template = json_string_value(json_object_get(a, "from_template"));
    snap_id = json_string_value(json_object_get(a, "snapshot_id")); /* from_snapshot */
    if (snap_id && wk_snap_use(ctx, snap_id, snap_dir, sizeof(snap_dir), &why) < 0) {
        wk_tstore_layers_free(layers);
        wk_call_refuse(c, SF_ERR_NOT_FOUND, why);
        return;
    }
    req.snapshot = snap_id ? snap_dir : NULL;
    req.layers = layers[0] ? (const char *const *)layers : NULL;
    if (wk_egress_box_new(ctx->egress, a, &eg, &code, &why) < 0) {
        wk_tstore_layers_free(layers);
        wk_snap_unuse(ctx, snap_id);
        wk_call_refuse(c, code, why);
        return;
    }
    if ((full = no_room(ctx, &req.limits))) {
        wk_tstore_layers_free(layers);
        wk_egress_box_free(eg);
        wk_snap_unuse(ctx, snap_id);
        sf_info("msg=\"create refused: host full\" sandbox=%s resource=\"%s\"", c->job.sandbox, full);
        snprintf(text, sizeof(text), SF_MSG_HOST_NO_ROOM_FMT, full);
        wk_call_refuse(c, SF_ERR_UNAVAILABLE, text);
        return;
    }
    if (!(b = calloc(1, sizeof(*b)))) {
        wk_tstore_layers_free(layers);
        wk_egress_box_free(eg);
        wk_snap_unuse(ctx, snap_id);
        wk_call_refuse(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    b->ctx = ctx;
    b->eg = eg;
    b->state = WK_BOX_CREATING;
    b->lim = req.limits;
    b->create = c;
    snprintf(b->id, sizeof(b->id), "%s", c->job.sandbox);
    snprintf(b->team, sizeof(b->team), "%s", c->job.team);
    snprintf(b->template_name, sizeof(b->template_name), "%s", req.template ? req.template : "base");
    snprintf(b->snap_used, sizeof(b->snap_used), "%s", snap_id ? snap_id : "");
    b->env = json_is_object(env) ? json_incref(env) : NULL;
    if (!strcmp(b->template_name, "desktop")) {
        /* every command (and the template's service) finds the display */
        json_t *e = b->env ? json_deep_copy(b->env) : json_object();
        if (e && !json_object_get(e, "DISPLAY"))
            json_object_set_new(e, "DISPLAY", json_string(":0"));
        json_decref(b->env);
        b->env = e;
    }
    wk_preview_access_arg(b, c->job.args); /* preview.c; public unless asked */
    if (sf_map_put(ctx->sandboxes, b->id, b) < 0) {
        wk_snap_unuse(ctx, snap_id);
        wk_tstore_layers_free(layers);
        json_decref(b->env);
        wk_egress_box_free(b->eg);
        free(b);
        wk_call_refuse(c, SF_ERR_UNAVAILABLE, SF_MSG_HOST_AT_CAPACITY);
        return;
    }
    ctx->used_mem_mib += b->lim.memory_mib;
    ctx->used_vcpu_milli += b->lim.vcpu_milli;
    ctx->used_disk_mib += b->lim.disk_mib;
    atomic_store(&ctx->beat.running, (int)sf_map_len(ctx->sandboxes));
    req.id = b->id;
    req.trust_pem = wk_egress_trust_pem(ctx->egress, b->eg);
    rc = ctx->ops->create(ctx->drv, &req, on_created, b); /* the driver copies the layers */
    wk_tstore_layers_free(layers);
    if (rc < 0) {
        b->create = NULL;
        wk_box_release(b);
        wk_snap_unuse(ctx, snap_id);
        if (snap_id && (rc == -ESTALE || rc == -ENOENT)) {
            wk_call_refuse(c, SF_ERR_NOT_FOUND, "The snapshot no longer fits this host (its files are "
                   "gone, or its template was rebuilt since); delete it with "
                   "sandbox_snapshot_delete and take a new one.");
            return;
        }
        if (rc == -ENOTSUP) {
            snprintf(text, sizeof(text), "This host's %s driver runs only the 'base' and "
                     "'debian' templates; create from one of them, or ask the operator for a "
                     "jail host.", ctx->ops->name);
            wk_call_refuse(c, SF_ERR_INVALID, text);
            return;
        }
        wk_call_refuse(c, rc == -EINVAL ? SF_ERR_INVALID : SF_ERR_INTERNAL,
               rc == -EINVAL ? "The sandbox's limits are out of range for this host; ask the "
                               "operator to check the scheduler's sandbox shapes."
                             : "The host could not start a sandbox now; retry sandbox_create in "
                               "a few seconds.");
    }
}

static void create_handler(wk_call *c, wk_box *b)
{
    (void)b;
    do_create(c);
}

WK_HANDLERS({"sandbox_create", create_handler});
