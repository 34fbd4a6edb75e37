/* preview.c: preview URLs (issue 22) on this host. sandbox_preview_url publishes one port
 * of a sandbox (its mode from the sandbox's preview_access, a fresh epoch) and answers its
 * URL; private ports get a link token signed with this host's key (common/sf_pvtoken.h).
 * The record holds preview_access and pv:<port> = "<access> <epoch>" for the gateways;
 * this worker's own table (wk_box.pv) is the authority its ingress (ingress/ingress.h)
 * admits hops by: the sandbox here and alive, the port published with the hop's epoch.
 * A hop to a paused sandbox resumes it and counts as activity. */
#include "worker.h"
#include "restart.h"
#include "ingress.h"
#include "netns.h"
#include "sf_log.h"
#include "sf_msg.h"
#include "sf_pvtoken.h"
#include "sf_records.h"
#include "sf_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* the namespace's rules let the ingress's marked sockets reach the relay (netns.h) */
_Static_assert(WK_PREVIEW_MARK == 0x53465056u && WK_PREVIEW_RELAY_PORT == 49983,
               "SP_NETNS_PREVIEW_MARK and SP_NETNS_PREVIEW_PORT (secret-proxy/netns.h) "
               "must follow WK_PREVIEW_MARK and WK_PREVIEW_RELAY_PORT");

static struct wk_pvport *pv_find(wk_box *b, unsigned port)
{
    for (int i = 0; i < b->pv_n; i++)
        if (b->pv[i].port == port)
            return &b->pv[i];
    return NULL;
}

/* Unique per publication on this host: the ms clock * 1000, past the last one. */
static uint64_t epoch_new(wk_ctx *ctx)
{
    uint64_t e = (uint64_t)sf_now_ms() * 1000;

    if (e <= ctx->pv_epoch_last)
        e = ctx->pv_epoch_last + 1;
    ctx->pv_epoch_last = e;
    return e;
}

static void reply_gone(wk_call *c)
{
    char text[256];

    snprintf(text, sizeof(text), SF_MSG_SANDBOX_KILLED_MEANWHILE_FMT, c->job.sandbox);
    wk_reply_error(c, SF_ERR_NOT_FOUND, text);
}

int wk_preview_access_arg(wk_box *b, const json_t *args)
{
    const char *a = json_string_value(json_object_get(args, "preview_access"));

    if (!a)
        return -1;
    b->pv_private = !strcmp(a, "private");
    return 0;
}

/* ---- sandbox_preview_url ---- */

typedef struct pv_op {
    wk_call *c;
    unsigned port;
    int priv;
    uint64_t epoch;
    int64_t exp_s;       /* private: the link's end (unix s) */
    char field[16], value[48];
    wk_preview_done_fn done; /* another tool's publication (wk_preview_publish), or NULL */
} pv_op;

static void on_published(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    pv_op *op = priv;
    wk_call *c = op->c;
    wk_ctx *ctx = c->ctx;
    char url[SF_PV_URL_MAX], token[SF_PV_TOKEN_MAX], at[32];
    json_t *res;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, SF_MSG_STORE_DOWN_NOTHING_CHANGED);
        goto out;
    }
    if (rep->integer != 1) {
        reply_gone(c);
        goto out;
    }
    if (op->priv && sf_pv_link_token(ctx->host_key, c->job.sandbox, op->port, op->epoch,
                                     op->exp_s, token, sizeof(token)) < 0) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        goto out;
    }
    /* (another tool's publication, op->done, gets the clean URL and builds its answer) */
    if (sf_pv_url(ctx->cfg.preview_scheme, ctx->cfg.preview_domain, c->job.sandbox, op->port,
                  op->priv && !op->done ? token : NULL, url, sizeof(url)) < 0) {
        wk_reply_error(c, SF_ERR_INTERNAL, "The preview URL is too long; set a shorter "
                       "preview_domain on the worker.");
        goto out;
    }
    if (op->done) {
        op->done(c, url, op->priv ? token : NULL, op->priv ? op->exp_s : 0);
        goto out;
    }
    res = json_pack("{s:s, s:i, s:s, s:s}", "sandbox_id", c->job.sandbox, "port", (int)op->port,
                    "url", url, "access", op->priv ? "private" : "public");
    if (res && op->priv) {
        time_t t = (time_t)op->exp_s;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(at, sizeof(at), "%Y-%m-%dT%H:%M:%SZ", &tm);
        json_object_set_new(res, "expires_at", json_string(at));
    }
    if (!res) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        goto out;
    }
    sf_info("msg=\"preview published\" sandbox=%s port=%u access=%s epoch=%" PRIu64,
            c->job.sandbox, op->port, op->priv ? "private" : "public", op->epoch);
    wk_reply_result(c, res);
out:
    free(op);
}

static void publish(wk_call *c, wk_box *b, int64_t port, int64_t exp_in,
                    wk_preview_done_fn done);

static void do_preview_url(wk_call *c, wk_box *b)
{
    json_t *jp = json_object_get(c->job.args, "port");
    json_t *je = json_object_get(c->job.args, "expires_in_seconds");
    int64_t port = json_is_integer(jp) ? json_integer_value(jp) : -1, exp_in = 3600;
    const char *why;
    char buf[200];

    if (!json_is_integer(jp)) {
        wk_reply_error(c, SF_ERR_INVALID, "port must be an integer (1024-65535): the port your "
                       "server listens on inside the sandbox.");
        return;
    }
    if ((why = sf_pv_port_refusal(port, buf, sizeof(buf)))) {
        wk_reply_error(c, SF_ERR_INVALID, why);
        return;
    }
    if (je && !json_is_null(je)) {
        exp_in = json_is_integer(je) ? json_integer_value(je) : 0;
        if (exp_in < 1 || exp_in > SF_PV_EXPIRES_MAX) {
            wk_reply_error(c, SF_ERR_INVALID, "expires_in_seconds must be 1-604800 (a private "
                           "link's lifetime in seconds; default 3600).");
            return;
        }
    }
    publish(c, b, port, exp_in, NULL);
}

int wk_preview_publish(wk_call *c, wk_box *b, unsigned port, int64_t exp_in,
                       wk_preview_done_fn done)
{
    if (!done || port < SF_PV_PORT_MIN || exp_in < 1 || exp_in > SF_PV_EXPIRES_MAX)
        return -EINVAL;
    publish(c, b, port, exp_in, done);
    return 0;
}

static void publish(wk_call *c, wk_box *b, int64_t port, int64_t exp_in,
                    wk_preview_done_fn done)
{
    struct wk_pvport *pv;
    char buf[200];
    pv_op *op;
    const char *kv[2];

    if (!(pv = pv_find(b, (unsigned)port))) {
        if (b->pv_n >= WK_PV_MAX) {
            snprintf(buf, sizeof(buf), "Sandbox %s has %d published ports, the most; close one "
                     "with sandbox_update {preview_close: [port]} first.", b->id, WK_PV_MAX);
            wk_reply_error(c, SF_ERR_LIMIT, buf);
            return;
        }
        pv = &b->pv[b->pv_n++];
        pv->port = (uint16_t)port;
        pv->priv = (uint8_t)b->pv_private;
        pv->epoch = epoch_new(c->ctx);
        wk_restart_save(b); /* a worker restart keeps the publication */
    }
    if (!(op = calloc(1, sizeof(*op)))) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    op->c = c;
    op->port = pv->port;
    op->priv = pv->priv;
    op->epoch = pv->epoch;
    op->exp_s = sf_now_ms() / 1000 + exp_in;
    op->done = done;
    snprintf(op->field, sizeof(op->field), "pv:%u", op->port);
    snprintf(op->value, sizeof(op->value), "%s %" PRIu64, op->priv ? "private" : "public",
             op->epoch);
    kv[0] = op->field;
    kv[1] = op->value;
    /* written on every call: a call whose write was lost is repaired by the next */
    if (sf_records_set(c->ctx->redis, b->id, 2, kv, on_published, op) < 0) {
        free(op);
        wk_reply_error(c, SF_ERR_UNAVAILABLE, SF_MSG_STORE_DOWN_NOTHING_CHANGED);
    }
}

WK_HANDLERS({"sandbox_preview_url", do_preview_url});

/* ---- sandbox_update's preview fields ---- */

typedef struct upd_op {
    wk_call *c;
    void (*done)(wk_call *c);
    int left;     /* writes outstanding */
    int failed;   /* ...of which one found no store */
    int gone;     /* ...or no live record */
} upd_op;

static void on_upd_written(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    upd_op *op = priv;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_INTEGER)
        op->failed = 1;
    else if (rep->integer != 1)
        op->gone = 1;
    if (--op->left > 0)
        return;
    if (op->gone)
        reply_gone(op->c);
    else if (op->failed)
        wk_reply_error(op->c, SF_ERR_UNAVAILABLE, SF_MSG_STORE_DOWN_AFTER_CHANGE);
    else
        op->done(op->c);
    free(op);
}

void wk_preview_update(wk_call *c, wk_box *b, void (*done)(wk_call *c))
{
    json_t *close_ = json_object_get(c->job.args, "preview_close"), *v;
    const char *fields[64];
    char names[64][16];
    size_t nf = 0, i;
    upd_op *op;

    if (json_is_array(close_) && json_array_size(close_) > 64) {
        wk_reply_error(c, SF_ERR_INVALID, "preview_close takes at most 64 ports.");
        return;
    }
    json_array_foreach(close_, i, v) {
        int64_t p = json_integer_value(v);
        if (!json_is_integer(v) || p < 1 || p > 65535) {
            wk_reply_error(c, SF_ERR_INVALID, "preview_close must list port numbers (1-65535) "
                           "published with sandbox_preview_url.");
            return;
        }
    }
    if (!(op = calloc(1, sizeof(*op)))) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    op->c = c;
    op->done = done;
    wk_preview_access_arg(b, c->job.args); /* ports published from now on */
    json_array_foreach(close_, i, v) {
        unsigned p = (unsigned)json_integer_value(v);
        struct wk_pvport *pv = pv_find(b, p);
        /* closed here first: the ingress refuses its hops and drops those open, at once */
        if (pv) {
            *pv = b->pv[--b->pv_n];
            sf_info("msg=\"preview closed\" sandbox=%s port=%u", b->id, p);
        }
        wk_ingress_drop(c->ctx->ingress, b->id, p);
        /* every listed port's field goes (a close whose write was lost is repaired) */
        snprintf(names[nf], sizeof(names[nf]), "pv:%u", p);
        fields[nf] = names[nf];
        nf++;
    }
    wk_restart_save(b);
    if (json_object_get(c->job.args, "preview_access")) {
        const char *kv[] = {"preview_access", b->pv_private ? "private" : "public"};
        if (sf_records_set(c->ctx->redis, b->id, 2, kv, on_upd_written, op) == 0)
            op->left++;
        else
            op->failed = 1;
    }
    if (nf > 0) {
        if (sf_records_unset(c->ctx->redis, b->id, nf, fields, on_upd_written, op) == 0)
            op->left++;
        else
            op->failed = 1;
    }
    if (op->left == 0) { /* nothing was sent */
        if (op->failed)
            wk_reply_error(c, SF_ERR_UNAVAILABLE, SF_MSG_STORE_DOWN_NOTHING_CHANGED);
        else
            done(c);
        free(op);
    }
}

/* ---- the ingress: hops from gateways ---- */

typedef struct hop_wait {
    wk_ctx *ctx;
    wk_hop *h;
    char id[SF_ID_MAX];
    unsigned port;
    uint64_t epoch;
} hop_wait;

/* The sandbox's loopback port, through a socket made in its network namespace (the jail:
 * the port itself; a VM: the guest agent's relay, driver.h preview_addr). */
static void hop_connect(wk_ctx *ctx, wk_hop *h, wk_box *b, unsigned port)
{
    wk_hop_target t = {.fd = -1, .team = b->team};
    char why[200];
    int ns, rc;

    if (!ctx->ops->preview_addr) {
        snprintf(why, sizeof(why), "Previews of sandbox %s cannot be reached: this host's "
                 "isolation driver (%s) does not carry them; use another host.", b->id,
                 ctx->ops->name);
        wk_ingress_refuse(h, 502, why);
        return;
    }
    ns = ctx->ops->netns ? ctx->ops->netns(b->sb) : -ENOENT;
    if (ns < 0 ||
        (rc = ctx->ops->preview_addr(b->sb, (uint16_t)port, (struct sockaddr_in *)&t.addr,
                                     &t.relay)) < 0 ||
        (rc = wk_ingress_netns_socket(ns, t.relay ? WK_PREVIEW_MARK : 0, &t.fd)) < 0) {
        snprintf(why, sizeof(why), "Sandbox %s has no network to reach (error %d); retry, or "
                 "create a new sandbox.", b->id, ns < 0 ? -ns : -rc);
        wk_ingress_refuse(h, 502, why);
        return;
    }
    t.addrlen = sizeof(struct sockaddr_in);
    wk_ingress_admit(h, &t);
}

/* The sandbox the hop may reach, or NULL once the hop was refused. */
static wk_box *hop_box(wk_ctx *ctx, wk_hop *h, const char *id, unsigned port, uint64_t epoch)
{
    wk_box *b = sf_map_get(ctx->sandboxes, id);
    struct wk_pvport *pv;
    char why[256];

    if (!b || b->state != WK_BOX_RUNNING) {
        snprintf(why, sizeof(why), "Sandbox %s is not running on this host; it may have been "
                 "killed.", id);
        wk_ingress_refuse(h, 404, why);
        return NULL;
    }
    if (!(pv = pv_find(b, port)) || pv->epoch != epoch) {
        snprintf(why, sizeof(why), "Port %u of sandbox %s is not published%s; publish it with "
                 "sandbox_preview_url.", port, id, pv ? " under this URL any more" : "");
        wk_ingress_refuse(h, 409, why);
        return NULL;
    }
    return b;
}

static void on_hop_resumed(void *arg, int rc, const char *why)
{
    hop_wait *w = arg;
    wk_box *b;
    char text[256];

    if (rc < 0) {
        snprintf(text, sizeof(text), "Sandbox %s could not be resumed: %s", w->id,
                 why ? why : "retry in a few seconds.");
        wk_ingress_refuse(w->h, rc == -ESRCH ? 404 : 504, text);
    } else if ((b = hop_box(w->ctx, w->h, w->id, w->port, w->epoch))) {
        hop_connect(w->ctx, w->h, b, w->port);
    }
    free(w);
}

static void on_hop(void *arg, wk_hop *h, const char *id, unsigned port, uint64_t epoch)
{
    wk_ctx *ctx = arg;
    wk_box *b = hop_box(ctx, h, id, port, epoch);
    hop_wait *w;
    int rc;

    if (!b)
        return;
    wk_touch(ctx, id); /* a preview request is activity: no idle pause meanwhile */
    if (!b->paused && !b->pausing) {
        hop_connect(ctx, h, b, port);
        return;
    }
    if (!(w = calloc(1, sizeof(*w)))) {
        wk_ingress_refuse(h, 503, SF_MSG_HOST_NOMEM);
        return;
    }
    *w = (hop_wait){.ctx = ctx, .h = h, .port = port, .epoch = epoch};
    snprintf(w->id, sizeof(w->id), "%s", id);
    sf_info("msg=\"preview resumes sandbox\" sandbox=%s port=%u", id, port);
    if ((rc = wk_box_resume_for(b, on_hop_resumed, w)) < 0) {
        char text[200];
        free(w);
        snprintf(text, sizeof(text), "Sandbox %s could not be resumed (error %d); retry in a "
                 "few seconds.", id, -rc);
        wk_ingress_refuse(h, rc == -ESRCH ? 404 : 504, text);
    }
}

/* ---- the teams' bytes, for the heartbeat (its own thread) ---- */

#define BYTES_TEAMS_MAX 64   /* teams in the heartbeat's ingress_bytes */
#define BYTES_TEXT_MAX 4096

static pthread_mutex_t bytes_mu = PTHREAD_MUTEX_INITIALIZER;
static char bytes_text[BYTES_TEXT_MAX] = "{}";
static uint64_t local_hops; /* (under bytes_mu) */
static struct event *ev_bytes;

static void add_team(void *arg, const char *team, uint64_t in, uint64_t out)
{
    json_t *o = arg;

    if (json_object_size(o) < BYTES_TEAMS_MAX)
        json_object_set_new(o, team, json_pack("{s:I, s:I}", "in", (json_int_t)in, "out",
                                               (json_int_t)out));
}

/* A sandbox with previews open is in use: no idle pause under a long stream (SSE, a
 * WebSocket). wk_touch writes the record at most once a second. The ids are copied first:
 * wk_touch must not run inside the ingress's walk. */
typedef struct touch_list {
    char (*ids)[SF_ID_MAX];
    size_t n, cap;
} touch_list;

static void collect_open(void *arg, const char *id)
{
    touch_list *l = arg;

    if (l->n < l->cap)
        snprintf(l->ids[l->n++], SF_ID_MAX, "%s", id);
}

static void on_bytes_tick(evutil_socket_t fd, short what, void *arg)
{
    wk_ctx *ctx = arg;
    json_t *o;
    char *text;
    touch_list open_now = {.cap = wk_ingress_open_hops(ctx->ingress)};

    (void)fd;
    (void)what;
    if (open_now.cap > 0 && (open_now.ids = calloc(open_now.cap, SF_ID_MAX))) {
        wk_ingress_sandboxes(ctx->ingress, collect_open, &open_now);
        for (size_t i = 0; i < open_now.n; i++) {
            wk_box *b = sf_map_get(ctx->sandboxes, open_now.ids[i]);
            if (b && b->state == WK_BOX_RUNNING && !b->paused && !b->pausing)
                wk_touch(ctx, b->id);
        }
        free(open_now.ids);
    }
    if (!(o = json_object()))
        return;
    wk_ingress_teams(ctx->ingress, add_team, o);
    text = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    pthread_mutex_lock(&bytes_mu);
    if (text && strlen(text) < BYTES_TEXT_MAX)
        memcpy(bytes_text, text, strlen(text) + 1);
    local_hops = wk_ingress_local_hops(ctx->ingress);
    pthread_mutex_unlock(&bytes_mu);
    free(text);
}

uint64_t wk_preview_local_hops(void)
{
    uint64_t n;

    pthread_mutex_lock(&bytes_mu);
    n = local_hops;
    pthread_mutex_unlock(&bytes_mu);
    return n;
}

void wk_preview_beat_bytes(char *buf, size_t n)
{
    pthread_mutex_lock(&bytes_mu);
    snprintf(buf, n, "%s", bytes_text);
    pthread_mutex_unlock(&bytes_mu);
}

int wk_preview_start(wk_ctx *ctx)
{
    struct timeval tick = {ctx->cfg.heartbeat_ms / 1000, (ctx->cfg.heartbeat_ms % 1000) * 1000};
    wk_ingress_cfg cfg = {
        .base = ctx->d.base,
        .listen = ctx->cfg.ingress_listen,
        .host_key = ctx->host_key,
        .conns_max = (uint32_t)ctx->cfg.ingress_conns,
        .conns_per_sandbox = (uint32_t)ctx->cfg.ingress_conns_per_sandbox,
        .line_timeout_ms = 5000,
        .open_timeout_ms = 30000,
        .replay_max = 65536,
        .buf_max = 1024 * 1024, /* each direction's pipe (a 256 KiB one: 1.5x the CPU per MB) */
        .open = on_hop,
        .arg = ctx,
    };
    char why[512], ldir[PATH_MAX];

    if (ctx->cfg.ingress_local) {
        snprintf(ldir, sizeof(ldir), "%s/ingress", ctx->cfg.state_dir);
        cfg.local_dir = ldir;
    }
    if (cfg.local_dir && wk_ingress_new(&cfg, &ctx->ingress, why, sizeof(why)) < 0) {
        /* the local hop is a shortcut: without it gateways take the TCP hop */
        sf_warn("msg=\"%s\"", why);
        cfg.local_dir = NULL;
    }
    if (!ctx->ingress && wk_ingress_new(&cfg, &ctx->ingress, why, sizeof(why)) < 0) {
        sf_error("msg=\"%s\"", why);
        return -1;
    }
    snprintf(ctx->ingress_addr, sizeof(ctx->ingress_addr), "%s", wk_ingress_addr(ctx->ingress));
    snprintf(ctx->ingress_local, sizeof(ctx->ingress_local), "%s",
             wk_ingress_local_path(ctx->ingress));
    sf_boot_id(ctx->boot_id, sizeof(ctx->boot_id));
    if (!(ev_bytes = event_new(ctx->d.base, -1, EV_PERSIST, on_bytes_tick, ctx)) ||
        event_add(ev_bytes, &tick) < 0) {
        sf_error("msg=\"cannot start the preview byte counters\"");
        return -1;
    }
    sf_info("msg=\"preview ingress listening\" addr=%s local=%s", ctx->ingress_addr,
            ctx->ingress_local[0] ? ctx->ingress_local : "-");
    return 0;
}

void wk_preview_stop(wk_ctx *ctx)
{
    if (ev_bytes)
        event_free(ev_bytes);
    ev_bytes = NULL;
    wk_ingress_free(ctx->ingress);
    ctx->ingress = NULL;
}
