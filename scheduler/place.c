/* place.c: sandbox_create: the shape a new sandbox gets, the team's limits and fair
 * share, the choice of host, and the reservation of the shape there. Single-slot steps
 * (state/sf_store.c), so it runs on Redis Cluster:
 *   1. read the live hosts (hosts.c: one call per host);
 *   2. the team's step (place_team): limits, shares and template checked, the host
 *      chosen, the team's part reserved under the sandbox id;
 *   3. the host's step (place_host): re-checks that the host is live and the sandbox fits
 *      (another scheduler may have filled it since step 1), reserves it there; if not, the
 *      team's part is given back and placement starts again without that host (at most
 *      PLACE_TRIES times, then "every host is at capacity");
 *   4. the record (place_record), `creating` on that host; a record that exists answers
 *      the same create redelivered (its host) or a conflict (the reservations go back).
 * Each reservation is keyed by the sandbox id, so a create redelivered after a crash
 * between steps finds and completes its own. The worker applies the shape it finds in
 * the forwarded job's args.limits; retiring the record releases the reservations
 * (state/sf_records.c). */
#include "sched.h"
#include "sf_log.h"
#include "sf_store.h"
#include "sf_templates.h"
#include "sf_timers.h"

#include <event2/event.h>

#include <stdlib.h>
#include <string.h>

/* args.limits of the forwarded create: the shape the worker applies (schemas/envelope.md). A
 * size of 0 in the config leaves that field to the worker's own default. */
static json_t *shape(const sch_cfg *cfg)
{
    json_t *l = json_object();

    json_object_set_new(l, "memory_mib", json_integer(cfg->sandbox_memory_mib));
    json_object_set_new(l, "vcpu_milli", json_integer(cfg->sandbox_vcpu_milli));
    json_object_set_new(l, "pids_max", json_integer(cfg->sandbox_pids_max));
    if (cfg->sandbox_disk_mib > 0)
        json_object_set_new(l, "disk_mib", json_integer(cfg->sandbox_disk_mib));
    if (cfg->sandbox_inodes > 0)
        json_object_set_new(l, "inodes", json_integer(cfg->sandbox_inodes));
    return l;
}

static const char *elem(const redisReply *rep, size_t i)
{
    return i < rep->elements && rep->element[i]->type == REDIS_REPLY_STRING
               ? rep->element[i]->str
               : "";
}

static const char what_to_do[] =
    "Kill sandboxes you no longer need (sandbox_list, then sandbox_kill), then retry";

/* Answers a placement step's refusal (or error): everything but 'ok'. */
static void refuse(sch_call *c, redisReply *rep)
{
    const char *verdict;
    char text[512];

    if (sf_redis_is_oom(rep)) {
        sf_warn("msg=\"create refused: Redis is at its maxmemory\" job=%s team=%s", c->job.id,
                c->job.team);
        sch_call_error(c, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        sf_error("msg=\"create script failed\" job=%s err=\"%s\"", c->job.id,
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    verdict = elem(rep, 0);
    if (strcmp(verdict, "ok") != 0)
        sf_info("msg=\"create refused\" job=%s team=%s verdict=%s", c->job.id, c->job.team,
                verdict);
    if (!strcmp(verdict, "notemplate") || !strcmp(verdict, "tplstatus")) {
        const char *t = json_string_value(json_object_get(c->job.args, "from_template"));
        if (!strcmp(verdict, "notemplate"))
            snprintf(text, sizeof(text), "Template '%.64s' does not exist; use 'base', 'debian', "
                     "'desktop' or one of your templates (sandbox_template_list).", t ? t : "");
        else
            snprintf(text, sizeof(text), "Template '%.64s' is %s, not ready; wait until "
                     "sandbox_template_list shows it ready.", t ? t : "", elem(rep, 1));
        sch_call_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    if (!strcmp(verdict, "pinned") && c->pin[0]) {
        snprintf(text, sizeof(text), "The host that holds snapshot '%.64s' (%.64s) is not "
                 "responding or has no room; a snapshot starts only on its own host: retry in a "
                 "few seconds, or kill one of your sandboxes there.",
                 json_string_value(json_object_get(c->job.args, "from_snapshot")), c->pin);
        sch_call_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    }
    if (!strcmp(verdict, "pinned")) {
        const char *t = json_string_value(json_object_get(c->job.args, "from_template"));
        snprintf(text, sizeof(text), "No host that holds template '%.64s' has room or is "
                 "responding (a team template is built on the hosts that were up then; "
                 "sandbox_template_list shows on how many it is ready); retry in a few seconds, "
                 "or build it again to have it on today's hosts.", t ? t : "");
        sch_call_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    }
    if (!strcmp(verdict, "nodebhost")) {
        sch_call_error(c, SF_ERR_INVALID, "No live worker host here runs the 'debian' "
                       "template (their workers predate it); create from 'base', or ask the "
                       "operator to update the workers.");
        return;
    }
    if (!strcmp(verdict, "nodskhost")) {
        sch_call_error(c, SF_ERR_INVALID, "No live worker host here runs the 'desktop' "
                       "template: it needs a host with the jail driver (qemu hosts do not run "
                       "it); create from 'debian', or ask the operator for a jail host.");
        return;
    }
    if (!strcmp(verdict, "nodebian")) {
        /* (while a host builds it, placement waits: wait_template) */
        sch_call_error(c, SF_ERR_UNAVAILABLE, "The 'debian' template is on no live host with "
                       "room, and none is building it (a failed build's log: "
                       "templates_dir/debian/build.log on the host); retry in a few seconds, "
                       "or use from_template 'base'.");
        return;
    }
    if (!strcmp(verdict, "conflict")) {
        sch_call_error(c, SF_ERR_INVALID, "A sandbox with that id exists or existed; let the "
                                           "platform choose the id of a new sandbox.");
        return;
    }
    if (!strcmp(verdict, "quota")) {
        snprintf(text, sizeof(text), "Sandbox quota reached: your team may have %s sandboxes. "
                 "%s, or ask the operator for a higher limit.", elem(rep, 1), what_to_do);
        sch_call_error(c, SF_ERR_LIMIT, text);
    } else if (!strcmp(verdict, "share")) {
        const char *what = elem(rep, 1), *n = elem(rep, 2);
        char amount[96];
        if (!strcmp(what, "memory"))
            snprintf(amount, sizeof(amount), "%s MiB of sandbox memory", n);
        else if (!strcmp(what, "vcpu"))
            snprintf(amount, sizeof(amount), "%.1f vCPUs", strtod(n, NULL) / 1000.0);
        else
            snprintf(amount, sizeof(amount), "%s sandboxes", n);
        snprintf(text, sizeof(text), "Your team is using its fair share of the platform (at "
                 "most %s across all hosts, shared with other teams). %s.", amount, what_to_do);
        sch_call_error(c, SF_ERR_LIMIT, text);
    } else if (!strcmp(verdict, "hostshare")) {
        snprintf(text, sizeof(text), "Your team is using its fair share (%s%%) of every worker "
                 "host that has room. %s, or retry when more hosts join.", elem(rep, 1),
                 what_to_do);
        sch_call_error(c, SF_ERR_LIMIT, text);
    } else if (!strcmp(verdict, "full")) {
        sch_call_error(c, SF_ERR_UNAVAILABLE,
                       "Every worker host is at capacity. Kill a sandbox, or retry later.");
    } else {
        sch_call_error(c, SF_ERR_UNAVAILABLE,
                       "No worker host is available right now; retry in a few seconds.");
    }
}

#define PLACE_TRIES 3 /* hosts that filled up between the read and the reservation */
#define TPL_POLL_MS 2000  /* a create waiting for 'debian': placement again this often */
#define TPL_TYPICAL_S 240 /* how long building 'debian' usually takes (tpl/build-debian) */

typedef struct place_op {
    sch_call *c;
    int tries, team_new, host_new;
    json_t *skip; /* hosts that refused it in this placement */
    int deb_building;    /* the last read: a live host is building 'debian' */
    int64_t wait_from;   /* the first 'nodebian' while one builds (ms; 0: none yet) */
    struct event *wait;  /* placement again, TPL_POLL_MS later */
    char host[SF_ID_MAX], mem[24], vcpu[24], disk[24];
    char *md_text;
} place_op;

static void place_free(place_op *op)
{
    if (op->wait)
        event_free(op->wait);
    json_decref(op->skip);
    free(op->md_text);
    free(op);
}

static void ignore_reply(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac, (void)r, (void)priv;
}

/* Gives back what this placement reserved (fire and forget: each is keyed by the id). */
static void undo(place_op *op, int team, int host)
{
    sch_call *c = op->c;
    char k[3][160];
    const char *argv[8];
    size_t lens[8];

    if (team) {
        snprintf(k[0], sizeof(k[0]), SF_RK_TEAM_SANDBOXES, c->job.team);
        snprintf(k[1], sizeof(k[1]), SF_RK_TEAM_RES, c->job.team);
        snprintf(k[2], sizeof(k[2]), SF_RK_TEAM_RETIRED, c->job.team);
        const char *v[] = {k[0], k[1], k[2], c->job.sandbox, "0", "0", "0", "0"};
        for (int i = 0; i < 8; i++)
            argv[i] = v[i], lens[i] = strlen(v[i]);
        sf_redis_script_call(c->ctx->redis, &sf_store_team_release, ignore_reply, NULL, 3, 5,
                             argv, lens);
    }
    if (host) {
        snprintf(k[0], sizeof(k[0]), SF_RK_HOST_RES, op->host);
        snprintf(k[1], sizeof(k[1]), SF_RK_HOST_SANDBOXES, op->host);
        snprintf(k[2], sizeof(k[2]), SF_RK_HOST_TIMERS, op->host);
        const char *v[] = {k[0], k[1], k[2], c->job.sandbox};
        for (int i = 0; i < 4; i++)
            argv[i] = v[i], lens[i] = strlen(v[i]);
        sf_redis_script_call(c->ctx->redis, &sf_store_host_release, ignore_reply, NULL, 3, 1,
                             argv, lens);
    }
}

static void placed(place_op *op, const char *host)
{
    sch_call *c = op->c;
    json_t *l = shape(&c->ctx->cfg);

    /* a team template's shape (the team's step answers the one it reserved) */
    if (strtoll(op->mem, NULL, 10) > 0)
        json_object_set_new(l, "memory_mib", json_integer(strtoll(op->mem, NULL, 10)));
    if (strtoll(op->vcpu, NULL, 10) > 0)
        json_object_set_new(l, "vcpu_milli", json_integer(strtoll(op->vcpu, NULL, 10)));
    if (strtoll(op->disk, NULL, 10) > 0)
        json_object_set_new(l, "disk_mib", json_integer(strtoll(op->disk, NULL, 10)));
    if (!strcmp(json_string_value(json_object_get(c->job.args, "from_template")) ?: "", "desktop"))
        json_object_set_new(l, "pids_max", json_integer(c->ctx->cfg.desktop_pids_max));
    /* from a snapshot: the captured sandbox's shape (sch_snap_place) */
    if (json_is_object(json_object_get(c->job.args, "limits")))
        json_object_update(l, json_object_get(c->job.args, "limits"));
    json_object_set_new(c->job.args, "limits", l);
    /* the gateway gave sandbox_create template_wait_s more for a template being built: what
     * this create did not wait goes back, so the worker's own waits (a template's ready_cmd)
     * keep the usual deadline */
    if (!strcmp(c->job.tool, "sandbox_create")) {
        int64_t now = sf_now_ms(), spare = c->ctx->cfg.template_wait_s * 1000 -
                                           (op->wait_from ? now - op->wait_from : 0);
        if (spare > 0 && c->job.deadline_ms - spare > now + 5000)
            c->job.deadline_ms -= spare;
    }
    place_free(op);
    sch_call_forward(c, host);
}

static void place_read(place_op *op);

static void on_wait(evutil_socket_t fd, short what, void *priv)
{
    (void)fd, (void)what;
    place_read(priv);
}

/* 'nodebian' while a host builds it: 1 when placement is tried again later (up to
 * template_wait_s and the call's deadline), 0 when it is refused now (c answered). */
static int wait_template(place_op *op)
{
    sch_call *c = op->c;
    int64_t now = sf_now_ms(), until, left;
    struct timeval tv = {TPL_POLL_MS / 1000, (TPL_POLL_MS % 1000) * 1000};
    char text[320];

    if (!op->wait_from)
        op->wait_from = now;
    until = op->wait_from + c->ctx->cfg.template_wait_s * 1000;
    /* a caller that gets no progress beats cannot keep its request alive: it hears back
     * before common client timeouts (60 s), as a long sandbox_exec does */
    if (!c->job.progress && op->wait_from + c->ctx->cfg.template_wait_detach_ms < until)
        until = op->wait_from + c->ctx->cfg.template_wait_detach_ms;
    if (c->job.deadline_ms > 0 && c->job.deadline_ms - 2 * TPL_POLL_MS < until)
        until = c->job.deadline_ms - 2 * TPL_POLL_MS; /* answered before the caller gives up */
    if (now + TPL_POLL_MS < until) {
        if (!op->wait && !(op->wait = evtimer_new(c->ctx->d.base, on_wait, op)))
            return 0;
        json_array_clear(op->skip);
        op->tries = 0;
        evtimer_add(op->wait, &tv);
        return 1;
    }
    left = TPL_TYPICAL_S - (now - op->wait_from) / 1000;
    snprintf(text, sizeof(text), "The 'debian' template is still being built, about %lld s "
             "left (it is built once per host); retry sandbox_create then, or use "
             "from_template 'base' now.", (long long)(left < 30 ? 30 : left));
    place_free(op);
    sch_call_error(c, SF_ERR_UNAVAILABLE, text);
    return 1;
}

static void failed(place_op *op, redisReply *rep)
{
    sch_call *c = op->c;

    if (op->deb_building && rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
        !strcmp(elem(rep, 0), "nodebian") && wait_template(op))
        return;
    place_free(op);
    refuse(c, rep);
}

static int is_ok(const redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2 &&
           !strcmp(elem(rep, 0), "ok");
}

static void on_record(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    place_op *op = priv;
    char host[SF_ID_MAX];

    if (is_ok(rep)) {
        snprintf(host, sizeof(host), "%s", elem(rep, 1));
        if (strcmp(host, op->host) != 0) /* the same create, placed meanwhile elsewhere */
            undo(op, 0, op->host_new);
        placed(op, host);
        return;
    }
    undo(op, op->team_new, op->host_new); /* a conflict, or refused (Redis full) */
    failed(op, rep);
}

static void on_host(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    place_op *op = priv;
    sch_call *c = op->c;
    char key[128], now[24], to[24];
    const char *tmpl = json_string_value(json_object_get(c->job.args, "from_template"));
    const char *name = json_string_value(json_object_get(c->job.args, "name"));

    if (rep && rep->type == REDIS_REPLY_ARRAY && !strcmp(elem(rep, 0), "again")) {
        undo(op, 1, 0); /* (also a part an earlier try of this id held: it did not finish) */
        json_array_append_new(op->skip, json_string(op->host));
        if (++op->tries < PLACE_TRIES) {
            place_read(op);
            return;
        }
        {
            static redisReply full_e = {.type = REDIS_REPLY_STRING, .str = "full", .len = 4};
            redisReply *fe[] = {&full_e};
            redisReply full = {.type = REDIS_REPLY_ARRAY, .elements = 1, .element = fe};
            failed(op, &full);
        }
        return;
    }
    if (!is_ok(rep)) {
        undo(op, op->team_new, 0);
        failed(op, rep);
        return;
    }
    op->host_new = !strcmp(elem(rep, 1), "1");
    snprintf(key, sizeof(key), SF_RK_SANDBOX, c->job.sandbox);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(to, sizeof(to), "%lld",
             (long long)json_integer_value(json_object_get(c->job.args, "timeout_seconds")));
    {
        const char *argv[] = {key, c->job.sandbox, c->job.team, op->host, name ? name : "",
                              tmpl ? tmpl : "base", op->md_text ? op->md_text : "{}", now, to,
                              op->mem, op->vcpu};
        size_t lens[SF_ARRAY_LEN(argv)];
        for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
            lens[i] = strlen(argv[i]);
        if (sf_redis_script_call(c->ctx->redis, &sf_store_place_record, on_record, op, 1,
                                 (int)SF_ARRAY_LEN(argv) - 1, argv, lens) < 0) {
            undo(op, op->team_new, op->host_new);
            failed(op, NULL);
        }
    }
}

static void on_team(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    place_op *op = priv;
    sch_call *c = op->c;
    char k[3][160], now[24], ttl[24];

    if (!is_ok(rep) || rep->elements < 6 || !sf_id_valid(elem(rep, 1))) {
        failed(op, rep);
        return;
    }
    snprintf(op->host, sizeof(op->host), "%s", elem(rep, 1));
    snprintf(op->mem, sizeof(op->mem), "%s", elem(rep, 2));
    snprintf(op->vcpu, sizeof(op->vcpu), "%s", elem(rep, 3));
    snprintf(op->disk, sizeof(op->disk), "%s", elem(rep, 4));
    op->team_new = !strcmp(elem(rep, 5), "1");
    snprintf(k[0], sizeof(k[0]), SF_RK_HOST, op->host);
    snprintf(k[1], sizeof(k[1]), SF_RK_HOST_RES, op->host);
    snprintf(k[2], sizeof(k[2]), SF_RK_HOST_SANDBOXES, op->host);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%lld", (long long)c->ctx->cfg.host_ttl_ms);
    {
        const char *argv[] = {k[0], k[1], k[2], c->job.sandbox, op->mem, op->vcpu, now, ttl};
        size_t lens[SF_ARRAY_LEN(argv)];
        for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
            lens[i] = strlen(argv[i]);
        if (sf_redis_script_call(c->ctx->redis, &sf_store_place_host, on_host, op, 3, 5, argv,
                                 lens) < 0) {
            undo(op, op->team_new, 0);
            failed(op, NULL);
        }
    }
}

static void on_hosts(void *priv, json_t *hosts)
{
    place_op *op = priv;
    sch_call *c = op->c;
    const sch_cfg *cfg = &c->ctx->cfg;
    const char *tmpl = json_string_value(json_object_get(c->job.args, "from_template"));
    char k[4][200], num[5][24], *live, *skip;
    int rc;

    if (!hosts) {
        failed(op, NULL);
        return;
    }
    op->deb_building = 0;
    {
        size_t i;
        json_t *e;
        json_array_foreach(hosts, i, e)
            op->deb_building |= json_is_true(json_object_get(e, "debb"));
    }
    if (!tmpl) {
        /* the default: 'debian' when a live host's driver runs it (both drivers do:
         * their heartbeat's caps), else 'base' (and for a snapshot's create, whose tree is
         * its own); the worker gets the choice */
        size_t i;
        json_t *e;
        tmpl = "base";
        json_array_foreach(hosts, i, e)
            if (!c->pin[0] && !strcmp(cfg->default_template, "debian") &&
                sch_host_can(e, SF_HOSTCAP_DEBIAN))
                tmpl = "debian";
        json_object_set_new(c->job.args, "from_template", json_string(tmpl));
    }
    snprintf(k[0], sizeof(k[0]), SF_RK_TEAM_LIMITS, c->job.team);
    snprintf(k[1], sizeof(k[1]), SF_RK_TEAM_SANDBOXES, c->job.team);
    snprintf(k[2], sizeof(k[2]), SF_RK_TEAM_RES, c->job.team);
    snprintf(k[3], sizeof(k[3]), SF_RK_TEMPLATE, c->job.team, tmpl);
    snprintf(num[0], 24, "%lld", (long long)cfg->team_sandbox_limit);
    snprintf(num[1], 24, "%lld", (long long)cfg->team_host_share_pct);
    snprintf(num[2], 24, "%lld", (long long)cfg->team_fleet_share_pct);
    snprintf(num[3], 24, "%lld", (long long)cfg->sandbox_memory_mib);
    snprintf(num[4], 24, "%lld", (long long)cfg->sandbox_vcpu_milli);
    if (!strcmp(tmpl, "desktop")) {
        /* the desktop's own shape, or what the largest host that runs it can give */
        int64_t mem = cfg->desktop_memory_mib, most = 0;
        size_t i;
        json_t *e;
        json_array_foreach(hosts, i, e)
            if (sch_host_can(e, SF_HOSTCAP_DESKTOP) &&
                json_integer_value(json_object_get(e, "mem")) > most)
                most = json_integer_value(json_object_get(e, "mem"));
        if (most > 0 && most < mem)
            mem = most;
        snprintf(num[3], 24, "%lld", (long long)mem);
        snprintf(num[4], 24, "%lld", (long long)cfg->desktop_vcpu_milli);
    }
    if (c->pin[0]) { /* from a snapshot: its shape is reserved */
        json_t *l = json_object_get(c->job.args, "limits");
        if (json_integer_value(json_object_get(l, "memory_mib")) > 0)
            snprintf(num[3], 24, "%lld", (long long)json_integer_value(json_object_get(l, "memory_mib")));
        if (json_integer_value(json_object_get(l, "vcpu_milli")) > 0)
            snprintf(num[4], 24, "%lld", (long long)json_integer_value(json_object_get(l, "vcpu_milli")));
    }
    live = json_dumps(hosts, JSON_COMPACT);
    skip = json_dumps(op->skip, JSON_COMPACT);
    if (!live || !skip) {
        free(live);
        free(skip);
        failed(op, NULL);
        return;
    }
    {
        const char *argv[] = {k[0], k[1], k[2], k[3], c->job.sandbox, tmpl, num[0], num[1],
                              num[2], num[3], num[4], live, skip, c->pin};
        size_t lens[SF_ARRAY_LEN(argv)];
        for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
            lens[i] = strlen(argv[i]);
        rc = sf_redis_script_call(c->ctx->redis, &sf_store_place_team, on_team, op, 4, 10, argv,
                                  lens);
    }
    free(live);
    free(skip);
    if (rc < 0)
        failed(op, NULL);
}

static void place_read(place_op *op)
{
    if (sch_hosts_read(op->c->ctx, on_hosts, op) < 0)
        failed(op, NULL);
}

void sch_place_create(sch_call *c)
{
    json_t *md = json_object_get(c->job.args, "metadata");
    place_op *op;

    op = calloc(1, sizeof(*op));
    if (!op || !(op->skip = json_array())) {
        free(op);
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    op->c = c;
    op->md_text = json_is_object(md) ? json_dumps(md, JSON_COMPACT) : NULL;
    place_read(op);
}
