/* egress.c: every sandbox's way out, through this host's secret-proxy
 * (docs/internals/egress.md, schemas/secret-proxy-control.md).
 *
 * A sandbox's network namespace has no link to the host. At create, once the driver
 * answered, the worker prepares that namespace (sp_netns_setup: nftables sending every
 * TCP connection and DNS query to the proxy's listeners, nothing else out) and registers
 * it with the proxy (rules, secret bindings); only then is the create answered, so the
 * sandbox's first command already finds its way out there and nowhere else. The
 * sandbox's environment gets HTTP(S)_PROXY, the CA variables and one placeholder per
 * secret binding; the driver put the egress CA in its trust store (driver.h trust_pem).
 * Rule and binding changes are `update`s; kill unregisters.
 *
 * The proxy is probed every second (its `status`): while it is down creates are refused
 * with an actionable error; when it comes back as a new instance (restarted) every
 * sandbox is registered again with the placeholders it holds, so its environment stays
 * valid. Control calls run on one thread of their own, in order; the namespace set-up
 * on the worker's pool. Nothing here blocks the loop.
 *
 * With proxy_control_socket empty egress is off: sandboxes have no network at all, and
 * creates asking for allow_out, deny_out or secrets are refused. */
#ifndef WK_EGRESS_H
#define WK_EGRESS_H

#include "worker.h"

#include <jansson.h>

#define WK_EGRESS_BINDINGS_MAX 32 /* secrets bound to one sandbox (the proxy's SP_BINDINGS_MAX) */

typedef struct wk_egress wk_egress;
typedef struct wk_egbox wk_egbox;

/* Starts the link to the proxy at sock ("" = egress off); the first probe runs here
 * (blocking, at start-up). 0 or -ENOMEM. */
int wk_egress_new(wk_ctx *ctx, const char *sock, wk_egress **out);
/* At start-up, once the sandboxes of the previous run were taken back: drops what that
 * run registered for any other sandbox (blocking). */
void wk_egress_drop_others(wk_egress *e);
/* A sandbox's egress as its host-side record keeps it (restart.c), and back: *out with
 * the same rules, bindings and placeholders (NULL for a JSON null: no egress), registered
 * as the record says (a restarted proxy gets it again within a probe). netns: the
 * sandbox's namespace (dup'd). 0, -EINVAL (damaged, or egress is off now), -ENOMEM. */
json_t *wk_egress_box_dump(const wk_egbox *eb);
int wk_egress_box_load(wk_egress *e, const json_t *j, int netns, wk_egbox **out);
/* Stops probing, sends the unregisters still queued, frees. NULL-safe. */
void wk_egress_free(wk_egress *e);

/* A create's egress (args.allow_out, deny_out, secrets): *out is the sandbox's egress
 * state to keep in its box (NULL when egress is off). -1 when the create must be refused:
 * *code and *why say why (the proxy is down; egress off but rules asked for). */
int wk_egress_box_new(wk_egress *e, const json_t *args, wk_egbox **out, const char **code,
                      const char **why);
void wk_egress_box_free(wk_egbox *eb); /* NULL-safe */
/* The egress CA for the driver's create (NULL without egress). */
const char *wk_egress_trust_pem(const wk_egress *e, const wk_egbox *eb);

/* After the driver created b: its namespace prepared and registered; then
 * cb(b, 0, NULL, NULL), or cb(b, rc, code, why) with one actionable sentence. Always
 * later, on the loop. b must stay in ctx->sandboxes until then. */
typedef void (*wk_egress_cb)(wk_box *b, int rc, const char *code, const char *why);
void wk_egress_attach(wk_egress *e, wk_box *b, wk_egress_cb cb);
/* At kill: unregisters b (queued behind its other control calls). */
void wk_egress_detach(wk_egress *e, wk_box *b);

/* A change on a running sandbox that the proxy applied (or refused): cb(arg, b, 0, NULL,
 * NULL) once new connections follow it and the record shows it; else cb(arg, b, rc, code,
 * why) with one actionable sentence. b is NULL when the sandbox went away meanwhile.
 * Always later, on the loop. */
typedef void (*wk_egress_change_cb)(void *arg, wk_box *b, int rc, const char *code,
                                    const char *why);
/* Replaces b's rules (allow/deny: arrays, NULL = keep) and/or its secret bindings
 * (secrets: the complete new {ENV: secret name}, NULL = keep; a binding left out is
 * worthless from the answer on). Takes none of the references. One change at a time per
 * sandbox: a second one meanwhile is refused "retry in a moment". */
void wk_egress_change(wk_egress *e, wk_box *b, json_t *allow, json_t *deny, json_t *secrets,
                      wk_egress_change_cb cb, void *arg);
/* b's secret bindings as applied ({ENV: secret name}, borrowed), NULL without egress. */
const json_t *wk_egress_secrets(const wk_egbox *eb);
/* b's rules as sandbox_info shows them ({egress_default, allow_out, deny_out}; a new
 * reference; egress_default "none" without egress). NULL when out of memory. */
json_t *wk_egress_network(const wk_egbox *eb);

/* The sandbox's egress environment (proxy variables, CA variables, placeholders): an
 * object of strings, borrowed; NULL without egress. */
json_t *wk_egress_env(const wk_egbox *eb);
/* The record fields that show its egress (sandbox_info): field, value pairs into kv
 * (room for 8), valid while eb lives and unchanged. Returns how many strings. */
size_t wk_egress_record_kv(const wk_egbox *eb, const char **kv);

#endif
