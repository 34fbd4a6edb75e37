/* templates.c: sandbox_template_list and sandbox_template_create, answered here from Redis
 * (state/sf_templates.h). A create is recorded (status building) on the host chosen to
 * build it, answered at once, and handed to that host as sf.template_build; the worker
 * writes the outcome into the record (worker/tpl_build.c). */
#include "sched.h"
#include "sf_log.h"
#include "sf_store.h"
#include "sf_templates.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The list and the create go through the store (state/sf_store.c: tpl_row, tpl_create),
 * each one slot: the live hosts are read one per call (hosts.c) and handed to the team's
 * script. */

static const char *elem(const redisReply *rep, size_t i)
{
    return i < rep->elements && rep->element[i]->type == REDIS_REPLY_STRING
               ? rep->element[i]->str
               : "";
}

static json_t *shape_json(json_t *o, long long vcpu_milli, long long mem, long long disk)
{
    json_object_set_new(o, "vcpu", json_integer(vcpu_milli >= 1000 ? vcpu_milli / 1000 : 1));
    json_object_set_new(o, "vcpu_milli", json_integer(vcpu_milli));
    json_object_set_new(o, "memory_mib", json_integer(mem));
    if (disk > 0)
        json_object_set_new(o, "disk_mib", json_integer(disk));
    return o;
}

static long long num(const char *s)
{
    return s && *s ? strtoll(s, NULL, 10) : 0;
}

/* A template job goes to several hosts (each builds its own copy; each removes its copy):
 * the call is handed to each as an internal message, also to hosts not heartbeating now
 * (a host reads its topic on from where it stopped). All but the last are sent on their
 * own; the last goes on the call's tracked path and ends the call (its offset then waits
 * for the answer sent before and this forward). lead: args.lead is true for
 * hosts[0] only. */
static void forward_all(sch_call *c, const char *const *hosts, size_t n, int lead)
{
    sf_buf b;

    for (size_t i = 0; i + 1 < n; i++) {
        if (lead)
            json_object_set_new(c->job.args, "lead", json_boolean(i == 0));
        snprintf(c->job.host, sizeof(c->job.host), "%s", hosts[i]);
        sf_buf_init(&b, SF_MSG_MAX);
        if (sf_job_encode(&c->job, &b) < 0 ||
            sch_hostmsg_produce(c->ctx, hosts[i], c->job.sandbox, b.p, b.len) < 0)
            sf_error("msg=\"cannot hand a template job to a host\" job=%s tool=%s host=%s",
                     c->job.id, c->job.tool, hosts[i]);
        sf_buf_fini(&b);
    }
    if (!n) {
        sch_call_done(c);
        return;
    }
    if (lead)
        json_object_set_new(c->job.args, "lead", json_boolean(n == 1));
    sch_call_forward(c, hosts[n - 1]);
}

/* ---- sandbox_template_list ------------------------------------------------------- */

/* What the built-ins are (worker/tpl/build-debian; the driver's busybox tree) */
#define SF_TPL_DEBIAN_DESC \
    "Debian 12 (bookworm): python and python3, pip and venv (pip install works as root), " \
    "node and npm, git, curl, wget, procps (ps, top, free), zip/unzip, gcc/make " \
    "(build-essential), ca-certificates. The default of sandbox_create."
#define SF_TPL_BASE_DESC \
    "A busybox user space for minimal jobs (sh, coreutils-like applets; no python, no " \
    "package manager); starts fastest. Known: busybox wget -T crashes (Debian's " \
    "busybox-static 1.35): use wget without -T there, or 'debian'."

/* doc: [debian status, [[name, status, from, vcpu_milli, memory_mib, disk_mib,
 * failed_step, error, created, updated, step, hosts, hosts ready]...]] (stolen). */
static void list_answer(sch_call *c, json_t *doc)
{
    const sch_cfg *cfg = &c->ctx->cfg;
    const char *prefix = json_string_value(json_object_get(c->job.args, "name_prefix"));
    json_t *out, *recs, *rec;
    size_t i;

    if (!prefix)
        prefix = "";
    out = json_array();
    if (!strncmp("base", prefix, strlen(prefix)))
        json_array_append_new(out, shape_json(json_pack("{s:s, s:s, s:b, s:b, s:s}", "name",
                                                         "base", "status", "ready", "builtin",
                                                         1, "default", 0, "description",
                                                         SF_TPL_BASE_DESC),
                                              cfg->sandbox_vcpu_milli, cfg->sandbox_memory_mib,
                                              cfg->sandbox_disk_mib));
    if (!strncmp("debian", prefix, strlen(prefix)))
        json_array_append_new(out, shape_json(json_pack("{s:s, s:s, s:b, s:b, s:s}", "name",
                                                         "debian",
                                                         "status", json_string_value(
                                                             json_array_get(doc, 0)) ?: "building",
                                                         "builtin", 1, "default", 1,
                                                         "description", SF_TPL_DEBIAN_DESC),
                                              cfg->sandbox_vcpu_milli, cfg->sandbox_memory_mib,
                                              cfg->sandbox_disk_mib));
    recs = json_array_get(doc, 1);
    json_array_foreach(recs, i, rec) {
        const char *f[13];
        json_t *o;
        for (size_t k = 0; k < 13; k++)
            f[k] = json_string_value(json_array_get(rec, k)) ?: "";
        o = json_pack("{s:s, s:s, s:b, s:s}", "name", f[0], "status", f[1], "builtin", 0,
                      "from", f[2]);
        if (!o)
            continue;
        shape_json(o, num(f[3]), num(f[4]), num(f[5]));
        if (!strcmp(f[1], "failed")) {
            if (f[6][0])
                json_object_set_new(o, "failed_step", json_integer(num(f[6])));
            json_object_set_new(o, "error", json_string(f[7]));
        }
        if (!strcmp(f[1], "building") && f[10][0]) /* "copy", or "3/5": the step running */
            json_object_set_new(o, "step", json_string(f[10]));
        json_object_set_new(o, "hosts", json_integer(num(f[11])));
        json_object_set_new(o, "hosts_ready", json_integer(num(f[12])));
        json_object_set_new(o, "created_ms", json_integer(num(f[8])));
        json_object_set_new(o, "updated_ms", json_integer(num(f[9])));
        json_array_append_new(out, o);
    }
    json_decref(doc);
    sch_call_result(c, json_pack("{s:o, s:I}", "templates", out, "count",
                                  (json_int_t)json_array_size(out)));
}

/* The list: the live hosts (is 'debian' ready on one?), the team's names (its slot),
 * then each template's row (tpl_row: the same slot, all sent at once). */
typedef struct tpl_list_op {
    sch_call *c;
    json_t *doc;
    size_t pending;
    int failed;
} tpl_list_op;

typedef struct tpl_one {
    tpl_list_op *op;
    json_t *row; /* [name] until its fields arrive */
} tpl_one;

static void tpl_list_end(tpl_list_op *op)
{
    sch_call *c = op->c;
    json_t *doc = op->doc, *recs = json_array_get(doc, 1), *keep = json_array(), *row;
    size_t i;

    if (op->failed) {
        json_decref(doc);
        json_decref(keep);
        free(op);
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    json_array_foreach(recs, i, row) {
        if (json_array_size(row) == 13) /* gone between the two reads: not listed */
            json_array_append(keep, row);
    }
    json_array_set_new(doc, 1, keep);
    free(op);
    list_answer(c, doc);
}

static void on_tpl_row(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tpl_one *one = priv;
    tpl_list_op *op = one->op;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        op->failed = 1;
    else if (rep->elements == 12)
        for (size_t k = 0; k < 12; k++)
            json_array_append_new(one->row, json_string(rep->element[k]->type ==
                                                                REDIS_REPLY_STRING
                                                            ? rep->element[k]->str
                                                            : ""));
    free(one);
    if (--op->pending == 0)
        tpl_list_end(op);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void on_tpl_names(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tpl_list_op *op = priv;
    sch_call *c = op->c;
    const char *prefix = json_string_value(json_object_get(c->job.args, "name_prefix")) ?: "";
    const char **names;
    size_t n = 0;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY ||
        !(names = calloc(rep->elements + 1, sizeof(*names)))) {
        op->failed = 1;
        tpl_list_end(op);
        return;
    }
    for (size_t i = 0; i < rep->elements; i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            !strncmp(rep->element[i]->str, prefix, strlen(prefix)))
            names[n++] = rep->element[i]->str;
    if (n)
        qsort(names, n, sizeof(*names), name_cmp);
    op->pending = 1;
    for (size_t i = 0; i < n; i++) {
        tpl_one *one = calloc(1, sizeof(*one));
        char key[256];
        const char *argv[] = {key};
        size_t lens[1];
        if (!one) {
            op->failed = 1;
            break;
        }
        lens[0] = (size_t)snprintf(key, sizeof(key), SF_RK_TEMPLATE, c->job.team, names[i]);
        one->op = op;
        one->row = json_pack("[s]", names[i]);
        json_array_append_new(json_array_get(op->doc, 1), one->row);
        op->pending++;
        if (lens[0] >= sizeof(key) ||
            sf_redis_script_call(c->ctx->redis, &sf_store_tpl_row, on_tpl_row, one, 1, 0, argv,
                                 lens) < 0) {
            free(one);
            op->pending--;
            op->failed = 1;
            break;
        }
    }
    free(names);
    if (--op->pending == 0)
        tpl_list_end(op);
}

static void on_tpl_hosts(void *priv, json_t *hosts)
{
    tpl_list_op *op = priv;
    sch_call *c = op->c;
    const char *deb = "building";
    json_t *h;
    size_t i;

    if (!hosts) {
        op->failed = 1;
        tpl_list_end(op);
        return;
    }
    json_array_foreach(hosts, i, h) {
        if (json_is_true(json_object_get(h, "deb")))
            deb = "ready";
    }
    json_array_set_new(op->doc, 0, json_string(deb));
    if (sf_redis_cmd(c->ctx->redis, on_tpl_names, op, "SMEMBERS " SF_RK_TEAM_TEMPLATES,
                     c->job.team) < 0) {
        op->failed = 1;
        tpl_list_end(op);
    }
}

void sch_tpl_list(sch_call *c)
{
    tpl_list_op *op = calloc(1, sizeof(*op));

    if (!op || !(op->doc = json_pack("[s, []]", "building"))) {
        free(op);
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    op->c = c;
    if (sch_hosts_read(c->ctx, on_tpl_hosts, op) < 0) {
        op->failed = 1;
        tpl_list_end(op);
    }
}

/* ---- sandbox_template_create ----------------------------------------------------- */

static void on_create(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    const char *name = json_string_value(json_object_get(c->job.args, "name"));
    const char *from = json_string_value(json_object_get(c->job.args, "from"));
    const char *verdict;
    char text[384];

    (void)ac;
    if (sf_redis_is_oom(rep)) {
        sch_call_error(c, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        sf_error("msg=\"template create script failed\" job=%s err=\"%s\"", c->job.id,
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    verdict = elem(rep, 0);
    if (!strcmp(verdict, "ok")) {
        const char *hosts[64];
        size_t n = 0;
        for (size_t i = 3; i < rep->elements && n < SF_ARRAY_LEN(hosts); i++)
            if (sf_id_valid(elem(rep, i)))
                hosts[n++] = elem(rep, i);
        /* the service its sandboxes run: its own, or the one of `from` */
        if (*elem(rep, 1))
            json_object_set_new(c->job.args, "start_cmd", json_string(elem(rep, 1)));
        if (*elem(rep, 2))
            json_object_set_new(c->job.args, "ready_cmd", json_string(elem(rep, 2)));
        /* the caller's answer now, on the call's tracked path: the offset moves once it
         * and the build's forward are confirmed */
        sch_call_result_then(c, json_pack("{s:s, s:s, s:s, s:I}", "name", name, "status",
                                          "building", "from", from, "hosts", (json_int_t)n));
        sf_info("msg=\"template build placed\" job=%s team=%s template=%s from=%s lead=%s "
                "hosts=%zu", c->job.id, c->job.team, name, from, n ? hosts[0] : "", n);
        /* each host lists it (the reaper fails a build its host took down with it) */
        snprintf(text, sizeof(text), "%s %s", c->job.team, name);
        for (size_t i = 0; i < n; i++)
            if (sf_redis_cmd(c->ctx->redis, NULL, NULL, "SADD " SF_RK_HOST_TEMPLATES " %s",
                             hosts[i], text) < 0)
                break; /* (Redis went down: the build goes on; a host lost is not seen) */
        /* The build goes to every host as an internal message: the caller has its answer. */
        snprintf(c->job.tool, sizeof(c->job.tool), "%s", SF_TOOL_TEMPLATE_BUILD);
        c->job.deadline_ms = sf_now_ms() + 3600 * 1000LL;
        c->call.silent = 1;
        forward_all(c, hosts, n, 1);
        return;
    }
    if (!strcmp(verdict, "exists"))
        snprintf(text, sizeof(text), "Your team already has a template named '%s' (%s); pick "
                 "another name (a failed one's name can be used again).", name, elem(rep, 1));
    else if (!strcmp(verdict, "quota"))
        snprintf(text, sizeof(text), "Your team holds its limit of %s templates; build into "
                 "the name of a failed one instead.", elem(rep, 1));
    else if (!strcmp(verdict, "nofrom"))
        snprintf(text, sizeof(text), "Template '%s' does not exist; use 'base', 'debian' or one "
                 "of yours (sandbox_template_list).", from);
    else if (!strcmp(verdict, "fromstatus"))
        snprintf(text, sizeof(text), "Template '%s' is %s, not ready; wait until "
                 "sandbox_template_list shows it ready, or build from another.", from,
                 elem(rep, 1));
    else if (!strcmp(verdict, "pinned"))
        snprintf(text, sizeof(text), "No host that holds template '%s' is responding; retry "
                 "later, or build from 'base' or 'debian'.", from);
    else if (!strcmp(verdict, "nodebian"))
        snprintf(text, sizeof(text), "The 'debian' template is still being built on the "
                 "hosts (a few minutes, once); retry in a minute.");
    else
        snprintf(text, sizeof(text), "No worker host that can build templates (jail driver) "
                 "is available; retry in a few seconds.");
    sch_call_error(c, !strcmp(verdict, "exists") || !strcmp(verdict, "nofrom") ||
                               !strcmp(verdict, "fromstatus")
                           ? SF_ERR_INVALID
                           : !strcmp(verdict, "quota") ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE,
                    text);
}

/* A build is a sandbox of the template's shape on each host that builds templates (caps builds; worker/templates/tpl_build.c): a
 * shape no live such host can give at all (its memory, CPU or disk, as it publishes them) is
 * refused now, with the most a host offers. 1 when refused (answered). */
static int shape_refused(sch_call *c, json_t *hosts)
{
    json_t *a = c->job.args, *e;
    long long mem = json_integer_value(json_object_get(a, "memory_mib"));
    long long vcpu = json_integer_value(json_object_get(a, "vcpu_milli"));
    long long disk = json_integer_value(json_object_get(a, "disk_mib"));
    long long bm = 0, bc = 0, bd = 0;
    int known = 0;
    char text[512];
    size_t i;

    json_array_foreach(hosts, i, e) {
        json_t *hm = json_object_get(e, "mem"), *hc = json_object_get(e, "vcpu"),
               *hd = json_object_get(e, "disk");
        if (!sch_host_can(e, SF_HOSTCAP_BUILDS))
            continue;
        if (!hm && !hc && !hd)
            return 0; /* a host that has not said yet: the build may fit there */
        known = 1;
        if ((!hm || mem <= json_integer_value(hm)) && (!hc || vcpu <= json_integer_value(hc)) &&
            (!hd || disk <= json_integer_value(hd)))
            return 0;
        if (hm && json_integer_value(hm) > bm)
            bm = json_integer_value(hm);
        if (hc && json_integer_value(hc) > bc)
            bc = json_integer_value(hc);
        if (hd && json_integer_value(hd) > bd)
            bd = json_integer_value(hd);
    }
    if (!known)
        return 0; /* no host that builds: the team's step says so */
    snprintf(text, sizeof(text), "No host can build a template of memory_mib %lld, vcpu %lld "
             "and disk_mib %lld: the largest a host offers is %lld MiB of memory, %lld vCPU "
             "(%lld milli) and %lld MiB of disk; ask for a smaller shape.", mem,
             vcpu >= 1000 ? vcpu / 1000 : 1, disk, bm, bc / 1000, bc, bd);
    sch_call_error(c, SF_ERR_LIMIT, text);
    return 1;
}

static void on_create_hosts(void *priv, json_t *hosts)
{
    sch_call *c = priv;
    json_t *a = c->job.args;
    const char *name = json_string_value(json_object_get(a, "name"));
    const char *from = json_string_value(json_object_get(a, "from"));
    json_t *steps = json_object_get(a, "run_steps");
    const char *start = json_string_value(json_object_get(a, "start_cmd"));
    const char *ready = json_string_value(json_object_get(a, "ready_cmd"));
    char k[4][256], num_s[5][24], *steps_s, *live;
    int rc = -1;

    if (!hosts) {
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (shape_refused(c, hosts))
        return;
    snprintf(k[0], sizeof(k[0]), SF_RK_TEMPLATE, c->job.team, name);
    snprintf(k[1], sizeof(k[1]), SF_RK_TEMPLATE_LOG, c->job.team, name);
    snprintf(k[2], sizeof(k[2]), SF_RK_TEAM_TEMPLATES, c->job.team);
    snprintf(k[3], sizeof(k[3]), SF_RK_TEMPLATE, c->job.team, from);
    snprintf(num_s[0], 24, "%lld", (long long)sf_now_ms());
    snprintf(num_s[1], 24, "%lld", (long long)json_integer_value(json_object_get(a, "vcpu_milli")));
    snprintf(num_s[2], 24, "%lld", (long long)json_integer_value(json_object_get(a, "memory_mib")));
    snprintf(num_s[3], 24, "%lld", (long long)json_integer_value(json_object_get(a, "disk_mib")));
    snprintf(num_s[4], 24, "%d", SF_TEMPLATES_PER_TEAM);
    steps_s = json_is_array(steps) ? json_dumps(steps, JSON_COMPACT) : NULL;
    live = json_dumps(hosts, JSON_COMPACT);
    if (live) {
        const char *argv[] = {k[0], k[1], k[2], k[3], c->job.team, name, from, c->job.id,
                              num_s[0], num_s[1], num_s[2], num_s[3], steps_s ? steps_s : "[]",
                              start ? start : "", ready ? ready : "", num_s[4], live};
        size_t lens[SF_ARRAY_LEN(argv)];
        for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
            lens[i] = strlen(argv[i]);
        rc = sf_redis_script_call(c->ctx->redis, &sf_store_tpl_create, on_create, c, 4,
                                  (int)SF_ARRAY_LEN(argv) - 4, argv, lens);
    }
    free(steps_s);
    free(live);
    if (rc < 0)
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

void sch_tpl_create(sch_call *c)
{
    const sch_cfg *cfg = &c->ctx->cfg;
    json_t *a = c->job.args;
    const char *name = json_string_value(json_object_get(a, "name"));
    const char *from = json_string_value(json_object_get(a, "from"));
    char text[256];
    long long vcpu = json_integer_value(json_object_get(a, "vcpu"));
    long long mem = json_integer_value(json_object_get(a, "memory_mib"));
    long long disk = json_integer_value(json_object_get(a, "disk_mib"));

    if (!name || !from) { /* the schema requires both */
        sch_call_error(c, SF_ERR_INVALID, "Arguments 'name' and 'from' are required.");
        return;
    }
    if (!strcmp(name, "base") || !strcmp(name, "debian") || !strcmp(name, "desktop")) {
        snprintf(text, sizeof(text), "'%s' is a built-in template's name; pick another name.",
                 name);
        sch_call_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (!strcmp(name, from)) {
        sch_call_error(c, SF_ERR_INVALID, "A template cannot be built from itself; name "
                       "another template in 'from'.");
        return;
    }
    /* The shape its sandboxes get: what the call says, else the platform's default. */
    vcpu = vcpu > 0 ? vcpu * 1000 : cfg->sandbox_vcpu_milli;
    mem = mem > 0 ? mem : cfg->sandbox_memory_mib;
    disk = disk > 0 ? disk : cfg->sandbox_disk_mib;
    json_object_set_new(a, "vcpu_milli", json_integer(vcpu));
    json_object_set_new(a, "memory_mib", json_integer(mem));
    json_object_set_new(a, "disk_mib", json_integer(disk));
    /* the hosts first (hosts.c), then the team's step with them (on_create_hosts) */
    if (sch_hosts_read(c->ctx, on_create_hosts, c) < 0)
        sch_call_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

/* ---- sandbox_template_delete ----------------------------------------------------- */

#define DEL_IDS_SHOWN 3

/* One delete: the call, and the count of the team's live sandboxes made from it. */
typedef struct tdel {
    sch_call *c;
    char name[64];
    char key[256], logkey[256], setkey[160];
    size_t pending;         /* record reads still out */
    int failed;             /* a read failed: Redis is down */
    size_t used;
    char ids[DEL_IDS_SHOWN][SF_ID_MAX];
} tdel;

static int del_call(tdel *d, sf_redis_script *s, redisCallbackFn *cb, int nkeys)
{
    const char *argv[4] = {d->key, d->logkey, d->setkey, NULL};
    size_t lens[4];

    argv[nkeys] = nkeys == 1 ? d->c->job.id : d->name;
    for (int i = 0; i <= nkeys; i++)
        lens[i] = strlen(argv[i]);
    return sf_redis_script_call(d->c->ctx->redis, s, cb, d, nkeys, 1, argv, lens);
}

static void del_fail(tdel *d, const char *code, const char *text)
{
    sch_call_error(d->c, code, text);
    free(d);
}

static void on_deleted(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tdel *d = priv;
    sch_call *c = d->c;
    const char *hosts[64];
    size_t n = 0;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    for (size_t i = 0; i < rep->elements && n < SF_ARRAY_LEN(hosts); i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING && sf_id_valid(rep->element[i]->str))
            hosts[n++] = rep->element[i]->str;
    sch_call_result_then(c, json_pack("{s:s, s:s, s:I}", "name", d->name, "status", "deleted",
                                      "hosts", (json_int_t)n));
    sf_info("msg=\"template deleted\" job=%s team=%s template=%s hosts=%zu", c->job.id,
            c->job.team, d->name, n);
    /* its hosts no longer list it, and remove the files (the caller has its answer) */
    {
        char member[384];
        snprintf(member, sizeof(member), "%s %s", c->job.team, d->name);
        for (size_t i = 0; i < n; i++)
            if (sf_redis_cmd(c->ctx->redis, NULL, NULL, "SREM " SF_RK_HOST_TEMPLATES " %s",
                             hosts[i], member) < 0)
                break;
    }
    snprintf(c->job.tool, sizeof(c->job.tool), "%s", SF_TOOL_TEMPLATE_DELETE);
    c->job.deadline_ms = sf_now_ms() + 3600 * 1000LL;
    c->call.silent = 1;
    forward_all(c, hosts, n, 0);
    free(d);
}

static void on_undone(redisAsyncContext *ac, void *r, void *priv)
{
    tdel *d = priv;
    char text[512];
    int off;

    (void)ac;
    (void)r;
    off = snprintf(text, sizeof(text), "Template '%s' is used by %zu live sandbox%s (", d->name,
                   d->used, d->used == 1 ? "" : "es");
    for (size_t i = 0; i < d->used && i < DEL_IDS_SHOWN && off < (int)sizeof(text); i++)
        off += snprintf(text + off, sizeof(text) - (size_t)off, "%s%s", i ? ", " : "", d->ids[i]);
    if (off < (int)sizeof(text))
        snprintf(text + off, sizeof(text) - (size_t)off, "%s); kill %s with sandbox_kill, then "
                 "delete the template again.", d->used > DEL_IDS_SHOWN ? ", ..." : "",
                 d->used == 1 ? "it" : "them");
    del_fail(d, SF_ERR_INVALID, text);
}

static void on_undo_logged(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    (void)ac;
    (void)priv;
    if (!rep || rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"cannot undo a template's deleting mark; it stays 'deleting' until "
                "deleted again\" err=\"%s\"", rep ? rep->str : "no reply");
}

/* Every read answered: in use (the delete is undone and refused) or not (deleted). */
static void del_decide(tdel *d)
{
    if (d->failed) {
        if (del_call(d, &sf_store_tpl_del_undo, on_undo_logged, 1) < 0)
            sf_warn("msg=\"cannot undo a template's deleting mark\" template=%s", d->name);
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (d->used) {
        if (del_call(d, &sf_store_tpl_del_undo, on_undone, 1) < 0)
            on_undone(NULL, NULL, d);
        return;
    }
    if (del_call(d, &sf_store_tpl_del, on_deleted, 3) < 0)
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

/* One sandbox record: [template, state]. The team's set holds only live sandboxes. */
static void on_sandbox(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tdel *d = priv;
    const char *id = NULL;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3)
        d->failed = 1;
    else if (rep->element[0]->type == REDIS_REPLY_STRING &&
             !strcmp(rep->element[0]->str, d->name) &&
             rep->element[2]->type == REDIS_REPLY_STRING) {
        id = rep->element[2]->str;
        if (d->used < DEL_IDS_SHOWN)
            snprintf(d->ids[d->used], SF_ID_MAX, "%s", id);
        d->used++;
    }
    if (--d->pending == 0)
        del_decide(d);
}

static void on_members(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tdel *d = priv;
    char key[128];

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        d->failed = 1;
        del_decide(d);
        return;
    }
    d->pending = 1; /* held until every read is sent */
    for (size_t i = 0; i < rep->elements; i++) {
        if (rep->element[i]->type != REDIS_REPLY_STRING)
            continue;
        snprintf(key, sizeof(key), SF_RK_SANDBOX, rep->element[i]->str);
        d->pending++;
        if (sf_redis_cmd(d->c->ctx->redis, on_sandbox, d, "HMGET %s template state id", key) < 0) {
            d->pending--;
            d->failed = 1;
        }
    }
    if (--d->pending == 0)
        del_decide(d);
}

static void on_marked(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tdel *d = priv;
    char text[256];

    (void)ac;
    if (sf_redis_is_oom(rep)) {
        del_fail(d, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_STRING) {
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (!strcmp(rep->str, "none")) {
        snprintf(text, sizeof(text), "Template '%s' does not exist; sandbox_template_list "
                 "shows your team's templates.", d->name);
        del_fail(d, SF_ERR_NOT_FOUND, text);
        return;
    }
    /* marked: no new sandbox starts from it; now count the live ones that did */
    snprintf(text, sizeof(text), SF_RK_TEAM_SANDBOXES, d->c->job.team);
    if (sf_redis_cmd(d->c->ctx->redis, on_members, d, "SMEMBERS %s", text) < 0) {
        d->failed = 1;
        del_decide(d);
    }
}

void sch_tpl_delete(sch_call *c)
{
    const char *name = json_string_value(json_object_get(c->job.args, "name"));
    char text[256];
    tdel *d;

    if (!name) { /* the schema requires it */
        sch_call_error(c, SF_ERR_INVALID, "Argument 'name' is required.");
        return;
    }
    if (!strcmp(name, "base") || !strcmp(name, "debian") || !strcmp(name, "desktop")) {
        snprintf(text, sizeof(text), "'%s' is a built-in template and cannot be deleted.", name);
        sch_call_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (!sf_id_valid(name) || !(d = calloc(1, sizeof(*d)))) {
        snprintf(text, sizeof(text), "Template '%.63s' does not exist; sandbox_template_list "
                 "shows your team's templates.", name);
        sch_call_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    d->c = c;
    snprintf(d->name, sizeof(d->name), "%s", name);
    snprintf(d->key, sizeof(d->key), SF_RK_TEMPLATE, c->job.team, name);
    snprintf(d->logkey, sizeof(d->logkey), SF_RK_TEMPLATE_LOG, c->job.team, name);
    snprintf(d->setkey, sizeof(d->setkey), SF_RK_TEAM_TEMPLATES, c->job.team);
    if (del_call(d, &sf_store_tpl_del_mark, on_marked, 1) < 0)
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}
