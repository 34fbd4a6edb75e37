/* tpl_build.c: builds a team template on this host (sf.template_build, handed over by the
 * scheduler once sandbox_template_create was answered). The build is a sandbox: a jail
 * like any other (its own uid range, namespaces, seccomp, the template's shape as its
 * limits, no network) whose root is a copy of the `from` template's root filesystem on
 * its own disk (driver.h `build_from`: a loop image of that tree + disk_mib, so a build
 * that writes more than disk_mib gets ENOSPC and fails naming disk_mib), reserved on this
 * host and in the team's share like a sandbox (tb:<team>:<name> in the host's res,
 * tb:<name>@<host> in the team's; released when the build ends here, when this host
 * restarts, or by the reaper when it goes down). The run_steps run in order; start_cmd is
 * started and ready_cmd polled; then the tree is taken with the driver's `snapshot`, the
 * sandbox killed, the files given back to host ids and renamed into
 * state_dir/templates/team/<team>/<name>/rootfs. The record's status (building -> ready
 * or failed, with the failing step and its output) and a bounded log go to Redis as the
 * build goes (state/sf_templates.h). Nothing here answers a caller. */
#include "worker.h"
#include "tstore.h"
#include "tpl_start.h"
#include "safefs.h"
#include "snapfs.h"
#include "fs.h"
#include "template.h"
#include "sf_log.h"
#include "sf_store.h"
#include "sf_templates.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TB_PATH 4096
#define TB_STEP_TIMEOUT_MS 600000
#define TB_READY_MS 60000 /* ready_cmd must succeed within a minute of start_cmd */
#define TB_FULL_BYTES (1 << 20) /* a step failed with less than this free: the disk was full */


typedef struct tb {
    wk_ctx *ctx;
    char team[SF_ID_MAX], name[64], id[SF_ID_MAX];
    char job[SF_ID_MAX];      /* the record's job: the create that asked for this build */
    int lead;                 /* 1: this host writes the step and the log */
    json_t *args;
    char src[TB_PATH], dir[TB_PATH], tmp[TB_PATH];
    wk_limits lim;
    wk_sandbox *sb;
    size_t step, nsteps;
    size_t logged;            /* bytes of log written to Redis */
    int failed_step;          /* 1-based; 0: not a step */
    char error[2048];         /* "" while all goes well */
    int rc;
    int stopped;              /* the worker stopped: the record was written, nothing more */
    int pooled;               /* finish_work may be running: error and rc are the pool's */
    int reserved;             /* the host's and the team's reservations were written */
    int taken;                /* the snapshot of the built tree was asked for */
    struct tb *prev, *next;   /* the builds running here (wk_tpl_build_free_all) */
} tb;

static tb *builds;

static void tb_free(tb *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        builds = b->next;
    if (b->next)
        b->next->prev = b->prev;
    json_decref(b->args);
    free(b);
}

/* The record and log are this build's only while the record's job is its own (the
 * scripts sf_store_tpl_set, _log, _done in state/sf_store.c). */
static void rcall(tb *b, sf_redis_script *sc, int nkeys, int nargs, const char **argv)
{
    size_t lens[12];

    if (b->stopped)
        return;
    for (int i = 0; i < nkeys + nargs; i++)
        lens[i] = strlen(argv[i]);
    if (sf_redis_script_call(b->ctx->redis, sc, wk_redis_logged, NULL, nkeys, nargs, argv,
                             lens) < 0)
        sf_warn("msg=\"cannot write a template's record; Redis is down\" team=%s template=%s",
                b->team, b->name);
}

static void rset(tb *b, const char *field, const char *value)
{
    char key[256], now[24];
    const char *argv[] = {key, b->job, field, value, now};

    if (!b->lead)
        return;
    snprintf(key, sizeof(key), SF_RK_TEMPLATE, b->team, b->name);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    rcall(b, &sf_store_tpl_set, 1, 4, argv);
}

/* Appends to the build log (the lead host's build only), at most SF_TEMPLATE_LOG_MAX
 * bytes in all. */
static void log_add(tb *b, const char *p, size_t n)
{
    char key[256], logkey[256], max[24], *text;

    if (!b->lead || b->logged >= SF_TEMPLATE_LOG_MAX || n == 0)
        return;
    if (n > SF_TEMPLATE_LOG_MAX - b->logged)
        n = SF_TEMPLATE_LOG_MAX - b->logged;
    if (!(text = strndup(p, n))) /* (a NUL in the output ends the piece) */
        return;
    b->logged += n;
    snprintf(key, sizeof(key), SF_RK_TEMPLATE, b->team, b->name);
    snprintf(logkey, sizeof(logkey), SF_RK_TEMPLATE_LOG, b->team, b->name);
    snprintf(max, sizeof(max), "%d", SF_TEMPLATE_LOG_MAX);
    rcall(b, &sf_store_tpl_log, 2, 3, (const char *[]){key, logkey, b->job, text, max});
    free(text);
}

static void log_str(tb *b, const char *s)
{
    log_add(b, s, strlen(s));
}

/* ---- the end: files back to host ids, into place; the record ---------------------- */

/* Inside a sandbox every template file belongs to an id it does not map (nobody), so only
 * the "other" bits count there: each file and directory gets for others what its owner
 * had to read and search (a step's 0600 file or 0700 directory stays usable in the
 * template's sandboxes, as it was for the build's root). Nothing gets write bits. */
static int open_up(int dir, const char *name, const struct stat *st, void *arg)
{
    mode_t m = st->st_mode & 07777, add = 0;

    (void)arg;
    if (S_ISLNK(st->st_mode) || !(S_ISREG(st->st_mode) || S_ISDIR(st->st_mode)))
        return 0;
    if (m & S_IRUSR)
        add |= S_IRGRP | S_IROTH;
    if (m & S_IXUSR)
        add |= S_IXGRP | S_IXOTH;
    /* through an fd of the entry (safefs.h): the built tree is the tenant's */
    if ((m | add) != m)
        return wk_sfs_chmod(dir, name, m | add, (uid_t)-1, (gid_t)-1, WK_SFS_AUTO);
    return 0;
}

/* The walk of open_up over the built tree at path. */
static int open_up_tree(const char *path)
{
    int fd = wk_sfs_root(path), rc;

    if (fd < 0)
        return fd;
    rc = wk_sfs_walk(fd, WK_SFS_DEPTH_MAX, open_up, NULL);
    close(fd);
    return rc;
}

/* service.json beside rootfs: the start_cmd and ready_cmd every sandbox of the template
 * runs (tstore.h); written before the tree is in place, so a template is never without it. */
static int write_service(tb *b)
{
    char path[TB_PATH + 32];
    json_t *j = json_object();
    int rc = 0;

    snprintf(path, sizeof(path), "%s/" WK_TSTORE_SERVICE, b->dir);
    if (!j)
        return -ENOMEM;
    if (json_object_get(b->args, "start_cmd"))
        json_object_set(j, "start_cmd", json_object_get(b->args, "start_cmd"));
    if (json_object_get(b->args, "ready_cmd"))
        json_object_set(j, "ready_cmd", json_object_get(b->args, "ready_cmd"));
    if (json_dump_file(j, path, JSON_COMPACT) < 0)
        rc = -EIO;
    json_decref(j);
    return rc;
}

/* b->tmp is the snapshot the driver took of the build sandbox (its upper: the whole root,
 * owned by the sandbox's ids, the uid in its meta). */
static void finish_work(void *arg)
{
    tb *b = arg;
    char final[TB_PATH + 16], tree[TB_PATH + 16], words[64], *end;
    unsigned long uid = 0;

    if (b->error[0]) {
        wk_rmtree(b->tmp);
        return;
    }
    snprintf(final, sizeof(final), "%s/rootfs", b->dir);
    snprintf(tree, sizeof(tree), "%s/upper", b->tmp);
    if ((b->rc = wk_snap_meta_read(b->tmp, "jail", words, sizeof(words))) == 0) {
        uid = strtoul(words, &end, 10);
        b->rc = *end || uid > UINT32_MAX ? -EINVAL : 0;
    }
    if (b->rc == 0 && (b->rc = wk_tree_shift(tree, (uint32_t)uid, 0)) == 0)
        b->rc = open_up_tree(tree);
    if (b->rc == 0)
        b->rc = write_service(b);
    /* (a redelivered job: the same build ran here before; the tree in place is kept, since
     * sandboxes may use it, and this copy goes) */
    if (b->rc == 0 && rename(tree, final) < 0)
        b->rc = errno == EEXIST || errno == ENOTEMPTY ? 0 : -errno;
    if (b->rc < 0)
        snprintf(b->error, sizeof(b->error), SF_MSG_TPL_STORE_FMT, strerror(-b->rc));
    wk_rmtree(b->tmp);
}

/* The build's part of this host and of the team's share (a sandbox's, as placement
 * counts it: state/sf_store.c place_team, place_host, host_view). */
static void reserve(tb *b, int on)
{
    wk_ctx *ctx = b->ctx;
    char hkey[160], tkey[160], hid[160], tid[160], hv[64], tv[200];

    if (!on && !b->reserved)
        return;
    snprintf(hkey, sizeof(hkey), SF_RK_HOST_RES, ctx->host_id);
    snprintf(tkey, sizeof(tkey), SF_RK_TEAM_RES, b->team);
    snprintf(hid, sizeof(hid), "tb:%s:%s", b->team, b->name);
    snprintf(tid, sizeof(tid), "tb:%s@%s", b->name, ctx->host_id);
    if (on) {
        snprintf(hv, sizeof(hv), "%u %u", b->lim.memory_mib, b->lim.vcpu_milli);
        snprintf(tv, sizeof(tv), "%s %u %u %u", ctx->host_id, b->lim.memory_mib,
                 b->lim.vcpu_milli, b->lim.disk_mib);
        b->reserved = sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "HSET %s %s %s", hkey,
                                   hid, hv) == 0 &&
                      sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "HSET %s %s %s", tkey,
                                   tid, tv) == 0;
        return;
    }
    sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "HDEL %s %s", hkey, hid);
    sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "HDEL %s %s", tkey, tid);
    b->reserved = 0;
}

static void finish_done(void *arg)
{
    tb *b = arg;
    char key[256], step[16], now[24];

    b->pooled = 0;
    snprintf(key, sizeof(key), SF_RK_TEMPLATE, b->team, b->name);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(step, sizeof(step), "%d", b->failed_step);
    /* the log's last line first: whoever sees the status finds the whole log */
    if (b->error[0]) {
        log_str(b, "== failed: ");
        log_str(b, b->error);
        log_str(b, "\n");
        rcall(b, &sf_store_tpl_done, 1, 7, (const char *[]){key, b->job, b->ctx->host_id, "failed",
              b->error, b->failed_step ? step : "", now, b->lead ? "1" : "0"});
        sf_info("msg=\"template build failed\" team=%s template=%s why=\"%s\"", b->team, b->name,
                b->error);
    } else {
        log_str(b, "== ready\n");
        rcall(b, &sf_store_tpl_done, 1, 7, (const char *[]){key, b->job, b->ctx->host_id, "ready", "",
              "", now, b->lead ? "1" : "0"});
        sf_info("msg=\"template ready\" team=%s template=%s", b->team, b->name);
    }
    reserve(b, 0);
    tb_free(b);
}

static void finish(tb *b);

static void on_killed(void *arg, int rc)
{
    tb *b = arg;
    (void)rc;
    b->sb = NULL;
    b->pooled = 1;
    if (wk_pool_run(b->ctx->pool, finish_work, finish_done, b) < 0) {
        b->pooled = 0;
        snprintf(b->error, sizeof(b->error), SF_MSG_HOST_NOMEM_BUILD);
        finish_done(b);
    }
}

static void fail(tb *b, int step, const char *fmt, const char *detail)
{
    if (!b->error[0]) {
        b->failed_step = step;
        snprintf(b->error, sizeof(b->error), fmt, detail);
    }
    finish(b);
}

static void on_taken(void *arg, int rc, uint64_t bytes, const char *why)
{
    tb *b = arg;

    (void)bytes;
    if (rc < 0 && !b->error[0])
        snprintf(b->error, sizeof(b->error), SF_MSG_TPL_STORE_FMT, why ? why : strerror(-rc));
    finish(b);
}

static void finish(tb *b)
{
    if (b->sb && !b->error[0] && !b->stopped && !b->taken) {
        /* the built tree, out of the build's disk (frozen while it is copied) */
        b->taken = 1;
        log_str(b, "== taking the built root filesystem\n");
        if (b->ctx->ops->snapshot && b->ctx->ops->snapshot(b->sb, b->tmp, on_taken, b) == 0)
            return;
        snprintf(b->error, sizeof(b->error), "The host could not store the built template; "
                 "build it again.");
    }
    if (b->sb) {
        wk_sandbox *sb = b->sb;
        b->ctx->ops->kill(sb, on_killed, b);
        return;
    }
    on_killed(b, 0);
}

/* ---- steps ------------------------------------------------------------------------ */

static void run_next(tb *b);

/* Output for the log and the error: stdout then stderr, as the agent kept them. */
static void log_result(tb *b, const wk_exec_result *res)
{
    char tail[96];

    log_add(b, res->out, res->out_len);
    log_add(b, res->err, res->err_len);
    snprintf(tail, sizeof(tail), "-- exit %d%s\n", res->exit_code,
             res->timed_out ? SF_MSG_TPL_TIMED_OUT_WHY : "");
    log_str(b, tail);
}

static void output_tail(const wk_exec_result *res, char *buf, size_t n)
{
    size_t len = 0, take;
    const char *parts[2] = {res->out, res->err};
    size_t lens[2] = {res->out_len, res->err_len};

    buf[0] = '\0';
    for (int i = 0; i < 2; i++) { /* the last bytes of each stream */
        take = lens[i] > (n - 1) / 2 ? (n - 1) / 2 : lens[i];
        if (take && len + take < n) {
            memcpy(buf + len, parts[i] + lens[i] - take, take);
            len += take;
        }
    }
    buf[len] = '\0';
    for (size_t i = 0; i < len; i++) /* the record holds text: no NULs, no broken bytes */
        if ((unsigned char)buf[i] < 0x20 && buf[i] != '\n' && buf[i] != '\t')
            buf[i] = ' ';
}

/* A step that failed on a full disk: (almost) nothing left on the build's disk, or the
 * step said so. */
static int disk_full(tb *b, const wk_exec_result *res)
{
    static const char nospc[] = "No space left on device";
    int64_t left = b->ctx->ops->disk_free ? b->ctx->ops->disk_free(b->sb) : -1;

    return (left >= 0 && left < TB_FULL_BYTES) ||
           (res->out_len && memmem(res->out, res->out_len, nospc, sizeof(nospc) - 1)) ||
           (res->err_len && memmem(res->err, res->err_len, nospc, sizeof(nospc) - 1));
}

static void on_step(void *arg, const wk_exec_result *res)
{
    tb *b = arg;
    char detail[1600], msg[1800];
    const char *cmd = json_string_value(json_array_get(json_object_get(b->args, "run_steps"),
                                                       b->step));

    if (res->error) {
        snprintf(detail, sizeof(detail), "%s", res->error);
        b->step++;
        fail(b, (int)b->step, "Step could not run: %s", detail);
        return;
    }
    log_result(b, res);
    if (res->exit_code != 0 && disk_full(b, res)) {
        snprintf(msg, sizeof(msg), "Step %zu (%.120s) failed: the build wrote more than its "
                 "disk_mib (%u MiB); raise disk_mib or write less.", b->step + 1, cmd ? cmd : "",
                 b->lim.disk_mib);
        b->step++;
        fail(b, (int)b->step, "%s", msg);
        return;
    }
    if (res->exit_code != 0 && res->oom_killed) {
        snprintf(msg, sizeof(msg), "Step %zu (%.120s) failed: the build used more than its "
                 "memory_mib (%u MiB) and a process was killed; raise memory_mib or use less.",
                 b->step + 1, cmd ? cmd : "", b->lim.memory_mib);
        b->step++;
        fail(b, (int)b->step, "%s", msg);
        return;
    }
    if (res->exit_code != 0) {
        output_tail(res, detail, 1024);
        snprintf(msg, sizeof(msg), "Step %zu (%.120s) exited with %d%s; its output ends: %s",
                 b->step + 1, cmd ? cmd : "", res->exit_code,
                 res->timed_out ? SF_MSG_TPL_TIMED_OUT_WHY : "", detail);
        b->step++;
        fail(b, (int)b->step, "%s", msg);
        return;
    }
    b->step++;
    run_next(b);
}

static int exec_cmd(tb *b, const char *command, const char *const *env, wk_exec_cb cb,
                    uint32_t timeout_ms)
{
    wk_exec_req req = {.command = command, .env = env, .timeout_ms = timeout_ms,
                       .cap_bytes = 16384};
    return b->ctx->ops->exec(b->sb, &req, cb, b);
}

static void on_log_removed(void *arg, const wk_exec_result *res)
{
    (void)res;
    finish(arg);
}

/* The service check: start_cmd, then ready_cmd within a minute (tpl_start.h), as every
 * sandbox of the template will run them. */
static void on_service(void *arg, int rc, const char *why)
{
    tb *b = arg;

    if (rc < 0) {
        fail(b, 0, "The template's %s; fix start_cmd or ready_cmd and build it again.", why);
        return;
    }
    log_str(b, json_object_get(b->args, "ready_cmd") ? "== ready_cmd succeeded\n"
                                                     : "== start_cmd started\n");
    /* the check's log is not the template's: each sandbox writes its own */
    if (exec_cmd(b, "rm -f " WK_START_LOG, NULL, on_log_removed, 10000) < 0)
        finish(b);
}

static void run_next(tb *b)
{
    json_t *steps = json_object_get(b->args, "run_steps");
    const char *start = json_string_value(json_object_get(b->args, "start_cmd"));
    const char *ready = json_string_value(json_object_get(b->args, "ready_cmd"));
    char head[160];

    if (b->stopped) { /* the worker is stopping: no next step */
        finish(b);
        return;
    }
    if (b->step < b->nsteps) {
        const char *cmd = json_string_value(json_array_get(steps, b->step));
        snprintf(head, sizeof(head), "%zu/%zu", b->step + 1, b->nsteps);
        rset(b, "step", head);
        snprintf(head, sizeof(head), "== step %zu/%zu: ", b->step + 1, b->nsteps);
        log_str(b, head);
        log_str(b, cmd ? cmd : "");
        log_str(b, "\n");
        if (!cmd || exec_cmd(b, cmd, NULL, on_step, TB_STEP_TIMEOUT_MS) < 0)
            fail(b, (int)b->step + 1, "%s", "The step could not be started in the build "
                 "sandbox (is it over 1 MiB?); shorten it.");
        return;
    }
    if (start || ready) {
        wk_tpl_start_req req = {.start_cmd = start, .ready_cmd = ready,
                                .deadline_ms = sf_now_ms() + TB_READY_MS};
        log_str(b, start ? "== start_cmd\n" : "== ready_cmd\n");
        if (wk_tpl_start(b->ctx, b->sb, &req, on_service, b) < 0)
            fail(b, 0, "%s", SF_MSG_HOST_NOMEM_BUILD);
        return;
    }
    finish(b);
}

static void on_created(void *arg, wk_sandbox *sb, int rc, const char *why)
{
    tb *b = arg;

    if (rc < 0) {
        snprintf(b->error, sizeof(b->error), SF_MSG_TPL_BUILD_START_FMT,
                 why ? why : "driver error");
        finish_done(b);
        return;
    }
    b->sb = sb;
    log_str(b, "== build sandbox started\n");
    run_next(b);
}

/* ---- the build sandbox: a copy of `from` on its own disk (the driver makes it) -------- */

static void prep_work(void *arg)
{
    tb *b = arg;

    wk_rmtree(b->tmp); /* (a redelivered job's) */
    b->rc = wk_mkdir_p(b->dir, 0700);
}

static void prep_done(void *arg)
{
    tb *b = arg;
    wk_create_req req = {0};
    int rc;

    if (b->ctx->stopping) { /* the worker is stopping: its driver is going or gone */
        snprintf(b->error, sizeof(b->error), "The host shut down during the build; build the "
                 "template again.");
        finish_done(b);
        return;
    }
    if (b->rc < 0) {
        snprintf(b->error, sizeof(b->error), "The host could not make the template's directory "
                 "(%s); build it again later.", strerror(-b->rc));
        finish_done(b);
        return;
    }
    req.id = b->id;
    req.limits = b->lim;
    req.build_from = b->src;
    if ((rc = b->ctx->ops->create(b->ctx->drv, &req, on_created, b)) < 0) {
        snprintf(b->error, sizeof(b->error), SF_MSG_TPL_BUILD_START_FMT, strerror(-rc));
        finish_done(b);
    }
}

void wk_tpl_build(wk_ctx *ctx, const sf_job *job)
{
    const json_t *a = job->args;
    const char *name = json_string_value(json_object_get(a, "name"));
    const char *from = json_string_value(json_object_get(a, "from"));
    char *layers[WK_LAYERS_MAX + 1] = {NULL};
    char why[384];
    tb *b;

    if (!name || !from || strlen(name) > 63 || !sf_id_valid(name))
        return; /* the scheduler validated it: never happens */
    if (!(b = calloc(1, sizeof(*b))))
        return;
    if ((b->next = builds))
        builds->prev = b;
    builds = b;
    b->ctx = ctx;
    b->args = json_deep_copy(a);
    snprintf(b->team, sizeof(b->team), "%s", job->team);
    snprintf(b->name, sizeof(b->name), "%s", name);
    snprintf(b->job, sizeof(b->job), "%s", job->id);
    /* the lead host writes the step and the log (a single host's build always does) */
    b->lead = !json_is_false(json_object_get(a, "lead"));
    sf_id_new(b->id, "tb_");
    b->lim.memory_mib = (uint64_t)json_integer_value(json_object_get(a, "memory_mib"));
    b->lim.vcpu_milli = (uint32_t)json_integer_value(json_object_get(a, "vcpu_milli"));
    b->lim.disk_mib = (uint64_t)json_integer_value(json_object_get(a, "disk_mib"));
    b->nsteps = json_array_size(json_object_get(a, "run_steps"));
    sf_info("msg=\"template build\" team=%s template=%s from=%s steps=%zu", b->team, b->name,
            from, b->nsteps);
    if (!(ctx->ops->caps & WK_CAP_BUILDS)) {
        snprintf(b->error, sizeof(b->error), "This host's %s driver cannot build templates; "
                 "ask the operator for a jail host.", ctx->ops->name);
        finish_done(b);
        return;
    }
    if (wk_tstore_layers(ctx->tstore, b->team, from, layers, why, sizeof(why)) < 0) {
        snprintf(b->error, sizeof(b->error), "%s", why);
        finish_done(b);
        return;
    }
    if (layers[0])
        snprintf(b->src, sizeof(b->src), "%s", layers[0]);
    else
        wk_template_path(ctx->cfg.state_dir, b->src, sizeof(b->src));
    wk_tstore_layers_free(layers);
    if (!b->args || wk_tstore_team_dir(ctx->tstore, b->team, b->name, b->dir, sizeof(b->dir)) < 0 ||
        snprintf(b->tmp, sizeof(b->tmp), "%s/rootfs.tmp-%d-%s", b->dir, (int)getpid(), b->id) >=
            (int)sizeof(b->tmp)) {
        snprintf(b->error, sizeof(b->error), "The template's path is too long on this host; "
                 "use a shorter name.");
        finish_done(b);
        return;
    }
    reserve(b, 1);
    rset(b, "step", "copy");
    if (wk_pool_run(ctx->pool, prep_work, prep_done, b) < 0) {
        snprintf(b->error, sizeof(b->error), SF_MSG_HOST_NOMEM_BUILD);
        finish_done(b);
    }
}

/* ---- sf.template_delete: the template's files on this host ----------------------- */

typedef struct tdel {
    char trash[TB_PATH];
} tdel;

static void del_work(void *arg)
{
    tdel *d = arg;
    int rc = wk_rmtree(d->trash);
    if (rc < 0)
        sf_warn("msg=\"cannot remove a deleted template's files\" dir=%s rc=%d", d->trash, rc);
}

static void del_done(void *arg)
{
    free(arg);
}

void wk_tpl_delete(wk_ctx *ctx, const sf_job *job)
{
    const char *name = json_string_value(json_object_get(job->args, "name"));
    char dir[TB_PATH], id[SF_ID_MAX];
    tdel *d;

    if (!name || strlen(name) > 63 || !sf_id_valid(name) ||
        wk_tstore_team_dir(ctx->tstore, job->team, name, dir, sizeof(dir)) < 0)
        return; /* the scheduler validated it: never happens */
    if (!(d = calloc(1, sizeof(*d))))
        return;
    /* out of the way at once (a build of the same name may start next; a build of this one
     * still running here loses its copy, which lives in this directory, and fails), then
     * removed on the pool */
    sf_id_new(id, "del_");
    if (wk_tstore_trash_path(ctx->tstore, id, d->trash, sizeof(d->trash)) < 0 ||
        rename(dir, d->trash) < 0) {
        if (errno != ENOENT)
            sf_warn("msg=\"cannot move a deleted template aside\" dir=%s errno=%d", dir, errno);
        free(d);
        return;
    }
    sf_info("msg=\"template deleted\" team=%s template=%s", job->team, name);
    if (wk_pool_run(ctx->pool, del_work, del_done, d) < 0)
        free(d); /* the next start removes the trash */
}

/* The worker is stopping (SIGTERM, a drain): a host that leaves cleanly is not reaped, so
 * nobody else would end its builds, and their records would say `building` for ever. Each
 * build still running here is failed on this host now, with the reason (its own error
 * when it had failed already); the status follows from every host's as for any failure.
 * The writes go out with the worker's last Redis traffic; the build sandboxes are killed
 * with the host's others (host_fini) and their copies removed at the next start. */
void wk_tpl_build_stop_all(wk_ctx *ctx)
{
    char key[256], step[16], now[24], why[256];

    snprintf(why, sizeof(why), "Host %s was stopped while it built this template; a failed "
             "template can be built again under its name.", ctx->host_id);
    for (tb *b = builds; b; b = b->next) {
        /* (its own error once it failed, unless the pool may still be writing it) */
        const char *err = !b->pooled && b->error[0] ? b->error : why;
        if (b->stopped)
            continue;
        snprintf(key, sizeof(key), SF_RK_TEMPLATE, b->team, b->name);
        snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
        snprintf(step, sizeof(step), "%d", err == why ? 0 : b->failed_step);
        log_str(b, "== failed: ");
        log_str(b, err);
        log_str(b, "\n");
        rcall(b, &sf_store_tpl_done, 1, 7, (const char *[]){key, b->job, ctx->host_id, "failed",
              err, err != why && b->failed_step ? step : "", now, b->lead ? "1" : "0"});
        b->stopped = 1;
        reserve(b, 0);
        sf_info("msg=\"template build stopped with the worker\" team=%s template=%s", b->team,
                b->name);
    }
}

/* At start, before any job: a build this host's previous run had under way when it died
 * (kill -9, a crash: nothing wrote its end) is failed on this host, as the reaper does for a
 * host that stays down (a host back within host_dead_ms is never reaped). Its build job is
 * not run again (its offset went at once: builds are never answered). 0, or -EIO when the
 * connection broke. */
int wk_tpl_build_reconcile_sync(wk_ctx *ctx, redisContext *c)
{
    char key[400], why[256], now[24];
    redisReply *l, *rep;
    long n = 0;

    if (!(l = sf_redis_sync_cmd(c, "SMEMBERS " SF_RK_HOST_TEMPLATES, ctx->host_id)))
        return -EIO;
    snprintf(why, sizeof(why), "Host %s restarted while it built this template; a failed "
             "template can be built again under its name.", ctx->host_id);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    for (size_t i = 0; l->type == REDIS_REPLY_ARRAY && i < l->elements; i++) {
        const char *e = l->element[i]->str, *sp;
        char team[SF_ID_MAX];
        if (l->element[i]->type != REDIS_REPLY_STRING || !(sp = strchr(e, ' ')) ||
            (size_t)(sp - e) >= sizeof(team))
            continue;
        memcpy(team, e, (size_t)(sp - e));
        team[sp - e] = '\0';
        if (snprintf(key, sizeof(key), SF_RK_TEMPLATE, team, sp + 1) >= (int)sizeof(key))
            continue;
        if (!(rep = sf_redis_script_sync(c, &sf_store_tpl_host_lost, 1, 3,
                                         (const char *[]){key, ctx->host_id, why, now}, NULL))) {
            freeReplyObject(l);
            return -EIO;
        }
        n += rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
        freeReplyObject(rep);
        /* its reservations (reserve()), whatever its record says */
        if (!(rep = sf_redis_sync_cmd(c, "HDEL " SF_RK_HOST_RES " tb:%s:%s", ctx->host_id, team,
                                 sp + 1))) {
            freeReplyObject(l);
            return -EIO;
        }
        freeReplyObject(rep);
        if (!(rep = sf_redis_sync_cmd(c, "HDEL " SF_RK_TEAM_RES " tb:%s@%s", team, sp + 1,
                                 ctx->host_id))) {
            freeReplyObject(l);
            return -EIO;
        }
        freeReplyObject(rep);
    }
    freeReplyObject(l);
    if (n > 0)
        sf_info("msg=\"template builds of a previous run marked failed\" count=%ld", n);
    return 0;
}

void wk_tpl_build_free_all(void)
{
    while (builds)
        tb_free(builds);
}
