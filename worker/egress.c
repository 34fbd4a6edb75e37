/* egress.c: every sandbox's egress through this host's secret-proxy (egress.h). */
#include "egress.h"
#include "client.h"
#include "netns.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_msg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EG_CALL_MS 3000         /* one control call */
#define EG_PROBE_MS 1000        /* the proxy's status, this often */
#define EG_CA_MAX (64 * 1024)   /* the egress CA certificate (PEM) */
#define EG_FREE_WAIT_MS 5000    /* wk_egress_free waits this long for calls under way */

#define MSG_PROXY_DOWN                                                                         \
    "The host's egress proxy (sandfleet-secret-proxy) is not running; retry sandbox_create in " \
    "a few seconds."

#define MSG_PROXY_DOWN_CHANGE                                                                  \
    "The host's egress proxy (sandfleet-secret-proxy) is not running or still taking the "     \
    "sandbox back; nothing changed. Retry in a few seconds."

struct wk_egress {
    wk_ctx *ctx;
    char sock[108];
    wk_pool *fifo;              /* one thread: control calls in submission order */
    struct event *ev_probe;
    int probing;
    int up;                     /* the last probe was answered */
    int stopping;
    int inflight;               /* ops not yet freed */
    char instance[SF_ID_MAX];   /* the proxy's, from its status ("" = never seen) */
    char deflt[8];              /* its egress_default: deny | allow */
    sp_netns_opts ports;
    char *ca_pem;
    uint64_t serial;
};

struct wk_egbox {
    uint64_t serial;            /* tells this box from a later one with the same id */
    json_t *allow, *deny;       /* rules as applied (arrays) */
    json_t *secrets;            /* {ENV: secret name} as applied */
    json_t *env;                /* proxy + CA variables + placeholders (execs get them) */
    char *rec_allow, *rec_deny, *rec_secrets; /* the same as record fields (JSON text) */
    char deflt[8];
    char instance[SF_ID_MAX];   /* registered with this proxy instance ("" = not) */
    int netns;                  /* our own fd of its namespace, -1 */
    int registering;            /* a register is queued or under way */
    int changing;               /* an update (rules, bindings) is queued or under way */
    int attached;               /* the create's registration succeeded */
};

typedef struct eg_op eg_op;
typedef void (*eg_done_fn)(eg_op *op, wk_box *b);

struct eg_op {
    wk_egress *e;
    char sandbox[SF_ID_MAX];
    uint64_t serial;
    json_t *req;
    int netns;                  /* owned, sent with the request, -1 */
    int setup;                  /* prepare the namespace first (on the worker's pool) */
    int setup_failed;
    sp_netns_opts ports;
    int rc;                     /* < 0: no answer (not reachable, timed out, set-up failed) */
    json_t *reply;
    char why[512];
    char seen[SF_ID_MAX];       /* probe: the instance known when it was sent */
    char *ca;                   /* probe: the CA read when the instance is new */
    eg_done_fn done;
    wk_egress_cb cb;
    json_t *n_allow, *n_deny, *n_secrets; /* change: the new state (NULL = kept) */
    wk_egress_change_cb ccb;
    void *carg;
};

/* ---- ops: set-up on the pool, control calls on the FIFO thread ---------------- */

static eg_op *op_new(wk_egress *e, const char *sandbox, uint64_t serial, json_t *req,
                     eg_done_fn done)
{
    eg_op *op = calloc(1, sizeof(*op));

    if (!op) {
        json_decref(req);
        return NULL;
    }
    op->e = e;
    op->netns = -1;
    op->req = req;
    op->serial = serial;
    op->done = done;
    snprintf(op->sandbox, sizeof(op->sandbox), "%s", sandbox ? sandbox : "");
    e->inflight++;
    return op;
}

static void op_free(eg_op *op)
{
    if (op->netns >= 0)
        close(op->netns);
    json_decref(op->req);
    json_decref(op->reply);
    json_decref(op->n_allow);
    json_decref(op->n_deny);
    json_decref(op->n_secrets);
    free(op->ca);
    op->e->inflight--;
    free(op);
}

/* Reads the CA certificate (bounded). NULL when unreadable. */
static char *read_ca(const char *path)
{
    char *buf = malloc(EG_CA_MAX + 1);
    size_t n = 0;
    int fd;

    if (!buf)
        return NULL;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        free(buf);
        return NULL;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, EG_CA_MAX + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n > EG_CA_MAX)
            break;
    }
    close(fd);
    if (n == 0 || n > EG_CA_MAX || !memmem(buf, n, "-----BEGIN CERTIFICATE-----", 27)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static void call_work(void *arg)
{
    eg_op *op = arg;
    const char *ca_file;

    if (op->rc < 0)
        return;
    op->rc = sp_client_call(op->e->sock, op->req, op->netns, EG_CALL_MS, &op->reply, op->why,
                            sizeof(op->why));
    /* a probe that meets a new instance reads its CA (the proxy made it at its start) */
    if (op->rc == 0 && !op->sandbox[0] && json_is_true(json_object_get(op->reply, "ok")) &&
        strcmp(op->seen, json_string_value(json_object_get(op->reply, "instance")) ?: "") &&
        (ca_file = json_string_value(json_object_get(op->reply, "ca_file"))))
        op->ca = read_ca(ca_file);
}

static void call_finished(void *arg)
{
    eg_op *op = arg;
    wk_ctx *ctx = op->e->ctx;
    wk_box *b = op->sandbox[0] ? sf_map_get(ctx->sandboxes, op->sandbox) : NULL;

    if (b && (!b->eg || b->eg->serial != op->serial))
        b = NULL; /* another sandbox with that id since */
    if (op->done)
        op->done(op, b);
    op_free(op);
}

static void on_deferred(evutil_socket_t fd, short what, void *arg)
{
    call_finished(arg);
}

/* Finishes op with an error, later on the loop (never inside the caller). */
static void op_fail_later(eg_op *op, int rc, const char *why)
{
    struct timeval now = {0, 0};

    op->rc = rc;
    snprintf(op->why, sizeof(op->why), "%s", why);
    if (event_base_once(op->e->ctx->d.base, -1, EV_TIMEOUT, on_deferred, op, &now) < 0) {
        sf_error("msg=\"egress call lost: out of memory\" sandbox=%s", op->sandbox);
        op_free(op);
    }
}

static void setup_work(void *arg)
{
    eg_op *op = arg;

    op->rc = sp_netns_setup(op->netns, &op->ports, op->why, sizeof(op->why));
    op->setup_failed = op->rc < 0;
}

static void setup_done(void *arg)
{
    eg_op *op = arg;

    if (op->rc < 0 || wk_pool_run(op->e->fifo, call_work, call_finished, op) < 0) {
        if (op->rc == 0) {
            op->rc = -ENOMEM;
            snprintf(op->why, sizeof(op->why), SF_MSG_HOST_NOMEM);
        }
        call_finished(op);
    }
}

/* Runs op (the namespace set-up if asked, then the call); op ends in call_finished. */
static void op_submit(eg_op *op)
{
    wk_egress *e = op->e;
    int rc;

    if (op->setup)
        rc = wk_pool_run(e->ctx->pool, setup_work, setup_done, op);
    else
        rc = wk_pool_run(e->fifo, call_work, call_finished, op);
    if (rc < 0)
        op_fail_later(op, rc, "The worker is out of memory or threads.");
}

/* ---- a sandbox's egress state --------------------------------------------------- */

static char *dump(const json_t *j)
{
    return json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
}

/* Recomputes the record texts after a change of rules or bindings. -ENOMEM. */
static int eb_texts(wk_egbox *eb)
{
    char *a = dump(eb->allow), *d = dump(eb->deny), *s = dump(eb->secrets);

    if (!a || !d || !s) {
        free(a);
        free(d);
        free(s);
        return -ENOMEM;
    }
    free(eb->rec_allow);
    free(eb->rec_deny);
    free(eb->rec_secrets);
    eb->rec_allow = a;
    eb->rec_deny = d;
    eb->rec_secrets = s;
    return 0;
}

void wk_egress_box_free(wk_egbox *eb)
{
    if (!eb)
        return;
    json_decref(eb->allow);
    json_decref(eb->deny);
    json_decref(eb->secrets);
    json_decref(eb->env);
    free(eb->rec_allow);
    free(eb->rec_deny);
    free(eb->rec_secrets);
    if (eb->netns >= 0)
        close(eb->netns);
    free(eb);
}

/* A copy of args[name] when it is an array (or object, for secrets), else an empty one. */
static json_t *arg_copy(const json_t *args, const char *name, int object)
{
    json_t *v = json_object_get(args, name);

    if (object)
        return json_is_object(v) ? json_deep_copy(v) : json_object();
    return json_is_array(v) ? json_deep_copy(v) : json_array();
}

int wk_egress_box_new(wk_egress *e, const json_t *args, wk_egbox **out, const char **code,
                      const char **why)
{
    int asked = json_array_size(json_object_get(args, "allow_out")) > 0 ||
                json_array_size(json_object_get(args, "deny_out")) > 0 ||
                json_object_size(json_object_get(args, "secrets")) > 0;
    wk_egbox *eb;

    *out = NULL;
    if (!e || !e->sock[0]) {
        if (!asked)
            return 0;
        *code = SF_ERR_INVALID;
        *why = "This host runs without an egress proxy, so its sandboxes have no network; "
               "create the sandbox without allow_out, deny_out and secrets, or ask the "
               "operator to set proxy_control_socket.";
        return -1;
    }
    if (!e->up || !e->ca_pem) {
        *code = SF_ERR_UNAVAILABLE;
        *why = MSG_PROXY_DOWN;
        return -1;
    }
    if (!(eb = calloc(1, sizeof(*eb)))) {
        *code = SF_ERR_INTERNAL;
        *why = SF_MSG_HOST_NOMEM;
        return -1;
    }
    eb->netns = -1;
    eb->serial = ++e->serial;
    snprintf(eb->deflt, sizeof(eb->deflt), "%s", e->deflt);
    eb->allow = arg_copy(args, "allow_out", 0);
    eb->deny = arg_copy(args, "deny_out", 0);
    eb->secrets = arg_copy(args, "secrets", 1);
    eb->env = json_object();
    if (!eb->allow || !eb->deny || !eb->secrets || !eb->env || eb_texts(eb) < 0) {
        wk_egress_box_free(eb);
        *code = SF_ERR_INTERNAL;
        *why = SF_MSG_HOST_NOMEM;
        return -1;
    }
    *out = eb;
    return 0;
}

const char *wk_egress_trust_pem(const wk_egress *e, const wk_egbox *eb)
{
    return e && eb ? e->ca_pem : NULL;
}

json_t *wk_egress_env(const wk_egbox *eb)
{
    return eb ? eb->env : NULL;
}

size_t wk_egress_record_kv(const wk_egbox *eb, const char **kv)
{
    size_t n = 0;

    if (!eb)
        return 0;
    kv[n++] = "egress_default";
    kv[n++] = eb->deflt;
    kv[n++] = "allow_out";
    kv[n++] = eb->rec_allow;
    kv[n++] = "deny_out";
    kv[n++] = eb->rec_deny;
    kv[n++] = "secrets";
    kv[n++] = eb->rec_secrets;
    return n;
}

/* A successful register/update reply: the instance, and the environment with its
 * placeholders. */
static void eb_apply(wk_egbox *eb, const json_t *reply)
{
    json_t *env = json_object(), *ca = sp_netns_ca_env();
    const char *k;
    json_t *v;

    if (!env || !ca) {
        json_decref(env);
        json_decref(ca);
        return; /* out of memory: the previous environment stays */
    }
    json_object_update(env, json_object_get(reply, "env"));
    json_object_update(env, ca);
    json_decref(ca);
    json_object_foreach(json_object_get(reply, "placeholders"), k, v)
        if (json_is_string(v))
            json_object_set(env, k, v);
    json_decref(eb->env);
    eb->env = env;
    snprintf(eb->instance, sizeof(eb->instance), "%s",
             json_string_value(json_object_get(reply, "instance")) ?: "?");
}

/* The register request for b, with the placeholders it holds when it has any. */
static json_t *register_req(const wk_egress *e, const wk_box *b)
{
    const wk_egbox *eb = b->eg;
    json_t *req = json_pack("{s:s, s:s, s:s, s:s, s:O, s:O, s:O}", "op", "register", "sandbox",
                            b->id, "team", b->team, "owner", e->ctx->host_id, "allow_out",
                            eb->allow, "deny_out", eb->deny, "secrets", eb->secrets);
    json_t *ph = json_object();
    const char *k;
    json_t *v;

    if (!req || !ph) {
        json_decref(req);
        json_decref(ph);
        return NULL;
    }
    json_object_foreach(eb->secrets, k, v) {
        json_t *token = json_object_get(eb->env, k);
        if (json_is_string(token))
            json_object_set(ph, k, token);
    }
    json_object_set_new(req, "placeholders", ph);
    return req;
}

/* "retry" in the proxy's own error: its secrets store is unreachable for the moment. */
static int transient(const char *err)
{
    return err && strstr(err, "retry");
}

/* ---- create: set-up and registration --------------------------------------------- */

static void attach_done(eg_op *op, wk_box *b)
{
    wk_egress *e = op->e;
    const char *err = json_string_value(json_object_get(op->reply, "error"));
    char text[600];

    if (!b)
        return; /* cannot happen: a creating box stays until its create is answered */
    b->eg->registering = 0;
    if (op->rc < 0 && op->setup_failed) {
        sf_error("msg=\"cannot prepare the sandbox's network namespace\" sandbox=%s why=\"%s\"",
                 b->id, op->why);
        snprintf(text, sizeof(text), "%s Tell the operator; retry sandbox_create.", op->why);
        op->cb(b, op->rc, SF_ERR_INTERNAL, text);
        return;
    }
    if (op->rc < 0) {
        sf_warn("msg=\"the egress proxy did not answer a registration\" sandbox=%s why=\"%s\"",
                b->id, op->why);
        e->up = 0;
        op->cb(b, op->rc, SF_ERR_UNAVAILABLE, MSG_PROXY_DOWN);
        return;
    }
    if (!json_is_true(json_object_get(op->reply, "ok"))) {
        snprintf(text, sizeof(text), "%s", err ? err : "The egress proxy refused the sandbox.");
        op->cb(b, -EINVAL, transient(err) ? SF_ERR_UNAVAILABLE : SF_ERR_INVALID, text);
        return;
    }
    eb_apply(b->eg, op->reply);
    b->eg->attached = 1;
    sf_info("msg=\"sandbox registered with the egress proxy\" sandbox=%s secrets=%zu",
            b->id, json_object_size(b->eg->secrets));
    op->cb(b, 0, NULL, NULL);
}

void wk_egress_attach(wk_egress *e, wk_box *b, wk_egress_cb cb)
{
    wk_egbox *eb = b->eg;
    int ns = e->ctx->ops->netns ? e->ctx->ops->netns(b->sb) : -ENOENT;
    eg_op *op = op_new(e, b->id, eb->serial, register_req(e, b), attach_done);

    if (!op) {
        /* nothing queued: answer through a minimal op-less path */
        sf_error("msg=\"cannot register the sandbox: out of memory\" sandbox=%s", b->id);
        cb(b, -ENOMEM, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    op->cb = cb;
    if (!op->req) {
        op_fail_later(op, -ENOMEM, SF_MSG_HOST_NOMEM);
        return;
    }
    if (ns < 0 || (eb->netns < 0 && (eb->netns = fcntl(ns, F_DUPFD_CLOEXEC, 0)) < 0) ||
        (op->netns = fcntl(eb->netns, F_DUPFD_CLOEXEC, 0)) < 0) {
        op->setup_failed = 1;
        op_fail_later(op, ns < 0 ? ns : -errno,
                      "The sandbox has no network namespace the worker could open.");
        return;
    }
    op->setup = 1;
    op->ports = e->ports;
    eb->registering = 1;
    op_submit(op);
}

static void unregister_done(eg_op *op, wk_box *b)
{
    if (op->rc < 0 || !json_is_true(json_object_get(op->reply, "ok")))
        sf_warn("msg=\"the egress proxy did not take an unregister; it drops the sandbox when it "
                "restarts\" sandbox=%s why=\"%s\"", op->sandbox,
                op->rc < 0 ? op->why : json_string_value(json_object_get(op->reply, "error")) ?: "");
}

void wk_egress_detach(wk_egress *e, wk_box *b)
{
    wk_egbox *eb = b->eg;
    eg_op *op;

    if (!e || !eb || (!eb->instance[0] && !eb->registering))
        return;
    eb->instance[0] = '\0';
    if (!(op = op_new(e, b->id, eb->serial,
                      json_pack("{s:s, s:s}", "op", "unregister", "sandbox", b->id),
                      unregister_done)))
        return;
    if (!op->req) {
        op_free(op);
        return;
    }
    op_submit(op);
}

static void record_egress(wk_egress *e, const wk_box *b)
{
    const char *kv[8];
    size_t n = wk_egress_record_kv(b->eg, kv);

    if (sf_records_set(e->ctx->redis, b->id, n, kv, wk_redis_logged, NULL) < 0)
        sf_warn("msg=\"cannot record the sandbox's egress; Redis is down\" sandbox=%s", b->id);
}

/* ---- changes on a running sandbox: rules, bindings ---------------------------------- */

const json_t *wk_egress_secrets(const wk_egbox *eb)
{
    return eb ? eb->secrets : NULL;
}

json_t *wk_egress_network(const wk_egbox *eb)
{
    if (!eb)
        return json_pack("{s:s, s:[], s:[]}", "egress_default", "none", "allow_out", "deny_out");
    return json_pack("{s:s, s:O, s:O}", "egress_default", eb->deflt, "allow_out", eb->allow,
                     "deny_out", eb->deny);
}

static void change_done(eg_op *op, wk_box *b)
{
    wk_egress *e = op->e;
    wk_egbox *eb = b ? b->eg : NULL;
    const char *err = json_string_value(json_object_get(op->reply, "error"));
    char text[600];

    if (!b) {
        op->ccb(op->carg, NULL, -ENOENT, SF_ERR_NOT_FOUND, NULL);
        return;
    }
    eb->changing = 0;
    if (op->rc < 0) {
        sf_warn("msg=\"the egress proxy did not answer an update\" sandbox=%s why=\"%s\"", b->id,
                op->why);
        e->up = 0;
        op->ccb(op->carg, b, op->rc, SF_ERR_UNAVAILABLE,
                "The host's egress proxy did not answer; nothing changed. Retry in a few "
                "seconds.");
        return;
    }
    if (!json_is_true(json_object_get(op->reply, "ok"))) {
        snprintf(text, sizeof(text), "%s", err ? err : "The egress proxy refused the change.");
        op->ccb(op->carg, b, -EINVAL, transient(err) ? SF_ERR_UNAVAILABLE : SF_ERR_INVALID, text);
        return;
    }
    if (op->n_allow) {
        json_decref(eb->allow);
        eb->allow = json_incref(op->n_allow);
    }
    if (op->n_deny) {
        json_decref(eb->deny);
        eb->deny = json_incref(op->n_deny);
    }
    if (op->n_secrets) {
        json_decref(eb->secrets);
        eb->secrets = json_incref(op->n_secrets);
    }
    eb_apply(eb, op->reply);
    if (eb_texts(eb) == 0)
        record_egress(e, b);
    sf_info("msg=\"sandbox egress changed\" sandbox=%s rules=%d secrets=%zu", b->id,
            op->n_allow || op->n_deny, json_object_size(eb->secrets));
    op->ccb(op->carg, b, 0, NULL, NULL);
}

void wk_egress_change(wk_egress *e, wk_box *b, json_t *allow, json_t *deny, json_t *secrets,
                      wk_egress_change_cb cb, void *arg)
{
    wk_egbox *eb = b->eg;
    json_t *req;
    eg_op *op;

    if (!e || !e->sock[0] || !eb) {
        cb(arg, b, -EINVAL, SF_ERR_INVALID,
           "This sandbox's host runs without an egress proxy, so it has no network to "
           "change; ask the operator to set proxy_control_socket.");
        return;
    }
    if (!e->up || !eb->attached || strcmp(eb->instance, e->instance) != 0) {
        cb(arg, b, -EAGAIN, SF_ERR_UNAVAILABLE, MSG_PROXY_DOWN_CHANGE);
        return;
    }
    if (eb->registering || eb->changing) {
        cb(arg, b, -EBUSY, SF_ERR_UNAVAILABLE,
           "Another change to this sandbox's network is under way; retry in a moment.");
        return;
    }
    req = json_pack("{s:s, s:s}", "op", "update", "sandbox", b->id);
    if (req && allow)
        json_object_set(req, "allow_out", allow);
    if (req && deny)
        json_object_set(req, "deny_out", deny);
    if (req && secrets)
        json_object_set(req, "secrets", secrets);
    if (!(op = op_new(e, b->id, eb->serial, req, change_done)) || !op->req) {
        if (op)
            op_free(op);
        cb(arg, b, -ENOMEM, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    op->n_allow = allow ? json_incref(allow) : NULL;
    op->n_deny = deny ? json_incref(deny) : NULL;
    op->n_secrets = secrets ? json_incref(secrets) : NULL;
    op->ccb = cb;
    op->carg = arg;
    eb->changing = 1;
    op_submit(op);
}

/* ---- the proxy restarted: registering every sandbox again ------------------------- */

static void reregister_done(eg_op *op, wk_box *b)
{
    wk_egress *e = op->e;
    const char *err = json_string_value(json_object_get(op->reply, "error"));

    if (!b)
        return; /* killed meanwhile: its unregister follows in the queue */
    b->eg->registering = 0;
    if (op->rc < 0) {
        e->up = 0; /* the next probe tries again */
        return;
    }
    if (!json_is_true(json_object_get(op->reply, "ok"))) {
        sf_warn("msg=\"the egress proxy refused to register a sandbox again\" sandbox=%s "
                "err=\"%s\"", b->id, err ? err : "");
        if (!transient(err) && json_object_size(b->eg->secrets) > 0) {
            /* a bound secret is gone: the sandbox keeps its rules, without its bindings */
            json_object_clear(b->eg->secrets);
            if (eb_texts(b->eg) == 0)
                record_egress(e, b);
            sf_warn("msg=\"sandbox re-registered without its secret bindings\" sandbox=%s",
                    b->id);
        }
        return; /* the next probe tries again */
    }
    eb_apply(b->eg, op->reply);
    sf_info("msg=\"sandbox registered again with the restarted egress proxy\" sandbox=%s",
            b->id);
}

static void reregister(wk_egress *e, wk_box *b)
{
    wk_egbox *eb = b->eg;
    eg_op *op;

    if (!(op = op_new(e, b->id, eb->serial, register_req(e, b), reregister_done)))
        return;
    if (!op->req || (op->netns = fcntl(eb->netns, F_DUPFD_CLOEXEC, 0)) < 0) {
        op_free(op);
        return;
    }
    eb->registering = 1;
    op_submit(op);
}

static void collect_box(const char *key, void *val, void *arg)
{
    wk_box ***p = arg;
    *(*p)++ = val;
}

static void reregister_all(wk_egress *e)
{
    size_t n = sf_map_len(e->ctx->sandboxes);
    wk_box **all = calloc(n + 1, sizeof(*all)), **p = all;

    if (!all)
        return;
    sf_map_foreach(e->ctx->sandboxes, collect_box, &p);
    for (size_t i = 0; i < n; i++) {
        wk_box *b = all[i];
        if (b->eg && b->eg->attached && !b->eg->registering && b->state == WK_BOX_RUNNING &&
            b->eg->netns >= 0 && strcmp(b->eg->instance, e->instance) != 0)
            reregister(e, b);
    }
    free(all);
}

/* ---- probing ---------------------------------------------------------------------- */

static void probe_apply(wk_egress *e, eg_op *op)
{
    const json_t *r = op->reply;
    const char *inst = json_string_value(json_object_get(r, "instance"));
    const char *deflt = json_string_value(json_object_get(r, "egress_default"));

    if (op->rc < 0 || !json_is_true(json_object_get(r, "ok")) || !inst) {
        if (e->up)
            sf_warn("msg=\"the egress proxy is down; creates are refused until it is back\" "
                    "socket=%s why=\"%s\"", e->sock, op->rc < 0 ? op->why : "bad status reply");
        e->up = 0;
        return;
    }
    if (strcmp(inst, e->instance) != 0) {
        if (!op->ca) {
            if (e->up || !e->instance[0])
                sf_warn("msg=\"cannot read the egress proxy's CA certificate\" file=%s",
                        json_string_value(json_object_get(r, "ca_file")) ?: "");
            e->up = 0;
            return;
        }
        free(e->ca_pem);
        e->ca_pem = op->ca;
        op->ca = NULL;
        sf_info("msg=\"egress proxy %s\" instance=%s default=%s", e->instance[0] ? "restarted"
                                                                                : "found",
                inst, deflt ? deflt : "?");
        snprintf(e->instance, sizeof(e->instance), "%s", inst);
    } else if (!e->up) {
        sf_info("msg=\"the egress proxy answers again\" instance=%s", inst);
    }
    snprintf(e->deflt, sizeof(e->deflt), "%s", deflt && !strcmp(deflt, "allow") ? "allow" : "deny");
    e->ports.http_port = (int)json_integer_value(json_object_get(r, "http_port"));
    e->ports.transparent_port = (int)json_integer_value(json_object_get(r, "transparent_port"));
    e->ports.dns_port = (int)json_integer_value(json_object_get(r, "dns_port"));
    if (e->ports.transparent_port <= 0 || e->ports.dns_port <= 0) {
        e->ports.transparent_port = 3129;
        e->ports.dns_port = 53;
    }
    e->up = 1;
    reregister_all(e);
}

static void probe_done(eg_op *op, wk_box *b)
{
    op->e->probing = 0;
    if (!op->e->stopping)
        probe_apply(op->e, op);
}

static eg_op *probe_op(wk_egress *e)
{
    eg_op *op = op_new(e, NULL, 0, json_pack("{s:s}", "op", "status"), probe_done);

    if (op && !op->req) {
        op_free(op);
        return NULL;
    }
    if (op)
        snprintf(op->seen, sizeof(op->seen), "%s", e->instance);
    return op;
}

static void on_probe(evutil_socket_t fd, short what, void *arg)
{
    wk_egress *e = arg;
    eg_op *op;

    if (e->probing || e->stopping || !(op = probe_op(e)))
        return;
    e->probing = 1;
    op_submit(op);
}

/* ---- start and stop --------------------------------------------------------------- */

int wk_egress_new(wk_ctx *ctx, const char *sock, wk_egress **out)
{
    struct timeval every = {EG_PROBE_MS / 1000, (EG_PROBE_MS % 1000) * 1000};
    wk_egress *e = calloc(1, sizeof(*e));
    eg_op *op;

    if (!e)
        return -ENOMEM;
    e->ctx = ctx;
    snprintf(e->deflt, sizeof(e->deflt), "deny");
    if (!sock || !sock[0]) {
        sf_warn("msg=\"egress is off (proxy_control_socket is empty): sandboxes get no "
                "network\"");
        *out = e;
        return 0;
    }
    if (strlen(sock) >= sizeof(e->sock)) {
        free(e);
        return -ENAMETOOLONG;
    }
    snprintf(e->sock, sizeof(e->sock), "%s", sock);
    if (!(e->fifo = wk_pool_new(ctx->d.base, 1)) ||
        !(e->ev_probe = event_new(ctx->d.base, -1, EV_PERSIST, on_probe, e))) {
        wk_pool_free(e->fifo);
        free(e);
        return -ENOMEM;
    }
    /* The first probe here, blocking (start-up): creates know at once whether the proxy
     * runs. Then what an earlier run of this worker registered goes (its sandboxes are). */
    if ((op = probe_op(e))) {
        call_work(op);
        probe_apply(e, op);
        op_free(op);
    }
    if (!e->up)
        sf_warn("msg=\"the egress proxy is not reachable yet; creates are refused until it "
                "answers\" socket=%s", e->sock);
    event_add(e->ev_probe, &every);
    *out = e;
    return 0;
}

void wk_egress_drop_others(wk_egress *e)
{
    json_t *req, *keep = json_array(), *rep = NULL;
    size_t n;
    wk_box **all, **p;
    char why[256];

    if (!e || !e->sock[0] || !e->up || !keep) {
        json_decref(keep);
        return;
    }
    n = sf_map_len(e->ctx->sandboxes);
    if (!(all = calloc(n + 1, sizeof(*all)))) {
        json_decref(keep);
        return;
    }
    p = all;
    sf_map_foreach(e->ctx->sandboxes, collect_box, &p);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(keep, json_string(all[i]->id));
    free(all);
    req = json_pack("{s:s, s:s, s:o}", "op", "unregister", "owner", e->ctx->host_id, "keep", keep);
    if (req && sp_client_call(e->sock, req, -1, EG_CALL_MS, &rep, why, sizeof(why)) == 0 &&
        json_integer_value(json_object_get(rep, "dropped")) > 0)
        sf_info("msg=\"dropped the registrations of this host's previous run\" count=%lld "
                "kept=%zu", (long long)json_integer_value(json_object_get(rep, "dropped")), n);
    json_decref(req);
    json_decref(rep);
}

json_t *wk_egress_box_dump(const wk_egbox *eb)
{
    if (!eb)
        return json_null();
    return json_pack("{s:s, s:O, s:O, s:O, s:O, s:s}", "default", eb->deflt, "allow", eb->allow,
                     "deny", eb->deny, "secrets", eb->secrets, "env", eb->env, "instance",
                     eb->instance);
}

int wk_egress_box_load(wk_egress *e, const json_t *j, int netns, wk_egbox **out)
{
    wk_egbox *eb;
    const char *inst = json_string_value(json_object_get(j, "instance"));
    const char *deflt = json_string_value(json_object_get(j, "default"));
    json_t *allow = json_object_get(j, "allow"), *deny = json_object_get(j, "deny");
    json_t *secrets = json_object_get(j, "secrets"), *env = json_object_get(j, "env");
    const char *k;
    json_t *v;

    *out = NULL;
    if (json_is_null(j) || !j)
        return 0;
    if (!e || !e->sock[0] || !json_is_array(allow) || !json_is_array(deny) ||
        !json_is_object(secrets) || !json_is_object(env) || !inst || !deflt ||
        json_object_size(secrets) > WK_EGRESS_BINDINGS_MAX || netns < 0)
        return -EINVAL;
    json_object_foreach(env, k, v)
        if (!json_is_string(v))
            return -EINVAL;
    if (!(eb = calloc(1, sizeof(*eb))))
        return -ENOMEM;
    eb->serial = ++e->serial;
    snprintf(eb->deflt, sizeof(eb->deflt), "%s", !strcmp(deflt, "allow") ? "allow" : "deny");
    snprintf(eb->instance, sizeof(eb->instance), "%s", inst);
    eb->allow = json_deep_copy(allow);
    eb->deny = json_deep_copy(deny);
    eb->secrets = json_deep_copy(secrets);
    eb->env = json_deep_copy(env);
    eb->attached = 1;
    if ((eb->netns = fcntl(netns, F_DUPFD_CLOEXEC, 0)) < 0 || !eb->allow || !eb->deny ||
        !eb->secrets || !eb->env || eb_texts(eb) < 0) {
        wk_egress_box_free(eb);
        return -ENOMEM;
    }
    *out = eb;
    return 0;
}

static void on_wait_tick(evutil_socket_t fd, short what, void *arg)
{
}

void wk_egress_free(wk_egress *e)
{
    struct timeval tick = {0, 50 * 1000};
    int64_t deadline = sf_mono_ms() + EG_FREE_WAIT_MS;
    struct event *ev;

    if (!e)
        return;
    e->stopping = 1;
    if (e->ev_probe)
        event_free(e->ev_probe);
    e->ev_probe = NULL;
    /* set-ups on the worker's pool still submit their calls here: wait for them */
    if (e->inflight > 0 && (ev = event_new(e->ctx->d.base, -1, EV_PERSIST, on_wait_tick, NULL))) {
        event_add(ev, &tick);
        while (e->inflight > 0 && sf_mono_ms() < deadline)
            event_base_loop(e->ctx->d.base, EVLOOP_ONCE);
        event_free(ev);
    }
    if (e->inflight > 0) {
        sf_warn("msg=\"egress calls still under way at exit\" count=%d", e->inflight);
        return; /* e stays: their callbacks still reach it */
    }
    wk_pool_free(e->fifo);
    free(e->ca_pem);
    free(e);
}
