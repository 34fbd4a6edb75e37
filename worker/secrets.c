/* secrets.c: sandbox_attach_secret and sandbox_detach_secret: a running sandbox's secret
 * bindings, changed through its egress (egress.h; the network rules: update.c). */
#include "worker.h"
#include "restart.h"
#include "egress.h"
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

/* ---- egress on a running sandbox: secret bindings (egress.h; rules: update.c) ---- */

static void reply_gone(wk_call *c)
{
    char text[256];

    snprintf(text, sizeof(text), SF_MSG_SANDBOX_KILLED_MEANWHILE_FMT, c->job.sandbox);
    wk_reply_error(c, SF_ERR_NOT_FOUND, text);
}

static void on_bindings_changed(void *arg, wk_box *b, int rc, const char *code, const char *why)
{
    wk_call *c = arg;
    json_t *r;

    if (!b) {
        reply_gone(c);
        return;
    }
    if (rc < 0) {
        wk_reply_error(c, code, why);
        return;
    }
    wk_restart_save(b); /* its bindings and placeholders outlive a worker restart */
    /* names only: never a value, never the placeholder (the sandbox's env holds it) */
    r = json_pack("{s:s, s:O, s:O}", "sandbox_id", b->id, "env_key",
                  json_object_get(c->job.args, "env_key"), "secrets", wk_egress_secrets(b->eg));
    if (r && json_object_get(c->job.args, "secret_name"))
        json_object_set(r, "secret_name", json_object_get(c->job.args, "secret_name"));
    wk_reply_result(c, r);
}

/* The sandbox's bindings with env_key set to name (NULL: removed). */
static json_t *bindings_with(const wk_box *b, const char *env_key, const char *name)
{
    const json_t *cur = wk_egress_secrets(b->eg);
    json_t *s = cur ? json_deep_copy(cur) : json_object();

    if (s && name)
        json_object_set_new(s, env_key, json_string(name));
    else if (s)
        json_object_del(s, env_key);
    return s;
}

static void do_attach_secret(wk_call *c, wk_box *b)
{
    const char *key = json_string_value(json_object_get(c->job.args, "env_key"));
    const char *name = json_string_value(json_object_get(c->job.args, "secret_name"));
    json_t *s = bindings_with(b, key, name);

    if (!s) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    if (json_object_size(s) > WK_EGRESS_BINDINGS_MAX) {
        json_decref(s);
        wk_reply_error(c, SF_ERR_INVALID, "A sandbox holds at most 32 secret bindings; detach one "
                                       "with sandbox_detach_secret first.");
        return;
    }
    wk_egress_change(c->ctx->egress, b, NULL, NULL, s, on_bindings_changed, c);
    json_decref(s);
}

static void do_detach_secret(wk_call *c, wk_box *b)
{
    const char *key = json_string_value(json_object_get(c->job.args, "env_key"));
    const json_t *cur = wk_egress_secrets(b->eg);
    char text[256];
    json_t *s;

    if (!cur || !json_object_get(cur, key)) {
        snprintf(text, sizeof(text), "No secret is bound to %s in sandbox '%s'; sandbox_info "
                 "lists its bindings.", key, b->id);
        wk_reply_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (!(s = bindings_with(b, key, NULL))) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    wk_egress_change(c->ctx->egress, b, NULL, NULL, s, on_bindings_changed, c);
    json_decref(s);
}

WK_HANDLERS({"sandbox_attach_secret", do_attach_secret},
            {"sandbox_detach_secret", do_detach_secret});
