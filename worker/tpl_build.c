/* tpl_build.c: builds a team template on this host (sf.template_build, handed over by the
 * scheduler once sandbox_template_create was answered). A copy of the `from` template's
 * root filesystem becomes the root of a build sandbox (a jail like any other: its own
 * uid range, namespaces, seccomp, limits of the template's shape, no network), where the
 * run_steps run in order; start_cmd is started and ready_cmd polled; then the sandbox is
 * killed, the files are given back to host ids and the tree is renamed into
 * state_dir/templates/team/<team>/<name>/rootfs. The record's status (building -> ready
 * or failed, with the failing step and its output) and a bounded log go to Redis as the
 * build goes (common/sf_templates.h). Nothing here answers a caller. */
#include "worker.h"
#include "tstore.h"
#include "sf_log.h"
#include "sf_templates.h"

#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TB_PATH 4096
#define TB_STEP_TIMEOUT_MS 600000
#define TB_READY_TRIES 60 /* ready_cmd: once a second, for a minute */

/* jail_int.h (the jail library) */
int wk_rmtree(const char *path);
int wk_mkdir_p(const char *path, mode_t mode);
int wk_template_path(const char *state_dir, char *buf, size_t n);

extern char **environ;

typedef struct tb {
    wk_ctx *ctx;
    char team[SF_ID_MAX], name[64], id[SF_ID_MAX];
    json_t *args;
    char src[TB_PATH], dir[TB_PATH], tmp[TB_PATH];
    wk_limits lim;
    wk_sandbox *sb;
    size_t step, nsteps;
    int ready_tries;
    size_t logged;            /* bytes of log written to Redis */
    int failed_step;          /* 1-based; 0: not a step */
    char error[2048];         /* "" while all goes well */
    int rc;
} tb;

static void tb_free(tb *b)
{
    json_decref(b->args);
    free(b);
}

static void rset(tb *b, const char *field, const char *value)
{
    char key[256];
    snprintf(key, sizeof(key), SF_RK_TEMPLATE, b->team, b->name);
    sf_redis_cmd(b->ctx->redis, wk_redis_logged, NULL, "HSET %s %s %s updated %lld", key, field,
                 value, (long long)sf_now_ms());
}

/* Appends to the build log, at most SF_TEMPLATE_LOG_MAX bytes in all. */
static void log_add(tb *b, const char *p, size_t n)
{
    char key[256];

    if (b->logged >= SF_TEMPLATE_LOG_MAX || n == 0)
        return;
    if (n > SF_TEMPLATE_LOG_MAX - b->logged)
        n = SF_TEMPLATE_LOG_MAX - b->logged;
    b->logged += n;
    snprintf(key, sizeof(key), SF_RK_TEMPLATE_LOG, b->team, b->name);
    sf_redis_cmd(b->ctx->redis, wk_redis_logged, NULL, "APPEND %s %b", key, p, n);
}

static void log_str(tb *b, const char *s)
{
    log_add(b, s, strlen(s));
}

/* ---- the end: files back to host ids, into place; the record ---------------------- */

static void finish_work(void *arg)
{
    tb *b = arg;
    char final[TB_PATH + 16];
    struct stat st;

    if (b->error[0] || stat(b->tmp, &st) < 0) {
        wk_rmtree(b->tmp);
        return;
    }
    snprintf(final, sizeof(final), "%s/rootfs", b->dir);
    if ((b->rc = wk_tree_shift(b->tmp, st.st_uid, 0)) < 0 ||
        (wk_rmtree(final), rename(b->tmp, final) < 0)) {
        if (b->rc == 0)
            b->rc = -errno;
        snprintf(b->error, sizeof(b->error), "The host could not store the built template "
                 "(%s); build it again.", strerror(-b->rc));
        wk_rmtree(b->tmp);
    }
}

static void finish_done(void *arg)
{
    tb *b = arg;
    char key[256], step[16];

    snprintf(key, sizeof(key), SF_RK_TEMPLATE, b->team, b->name);
    /* the log's last line first: whoever sees the status finds the whole log */
    if (b->error[0]) {
        log_str(b, "== failed: ");
        log_str(b, b->error);
        log_str(b, "\n");
        snprintf(step, sizeof(step), "%d", b->failed_step);
        sf_redis_cmd(b->ctx->redis, wk_redis_logged, NULL,
                     "HSET %s status failed error %s failed_step %s updated %lld", key, b->error,
                     b->failed_step ? step : "", (long long)sf_now_ms());
        sf_info("msg=\"template build failed\" team=%s template=%s why=\"%s\"", b->team, b->name,
                b->error);
    } else {
        log_str(b, "== ready\n");
        sf_redis_cmd(b->ctx->redis, wk_redis_logged, NULL,
                     "HSET %s status ready updated %lld", key, (long long)sf_now_ms());
        sf_info("msg=\"template ready\" team=%s template=%s", b->team, b->name);
    }
    tb_free(b);
}

static void finish(tb *b);

static void on_killed(void *arg, int rc)
{
    tb *b = arg;
    (void)rc;
    b->sb = NULL;
    if (wk_pool_run(b->ctx->pool, finish_work, finish_done, b) < 0) {
        snprintf(b->error, sizeof(b->error), "The host is out of memory; build it again.");
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

static void finish(tb *b)
{
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
             res->timed_out ? " (timed out after 10 minutes)" : "");
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
    if (res->exit_code != 0) {
        output_tail(res, detail, 1024);
        snprintf(msg, sizeof(msg), "Step %zu (%.120s) exited with %d%s; its output ends: %s",
                 b->step + 1, cmd ? cmd : "", res->exit_code,
                 res->timed_out ? " (timed out after 10 minutes)" : "", detail);
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

static void on_ready(void *arg, const wk_exec_result *res);

static void retry_ready(evutil_socket_t fd, short what, void *arg)
{
    tb *b = arg;
    const char *ready = json_string_value(json_object_get(b->args, "ready_cmd"));
    (void)fd;
    (void)what;
    if (exec_cmd(b, ready, NULL, on_ready, 30000) < 0)
        fail(b, 0, "%s", "ready_cmd could not run in the build sandbox; build it again.");
}

static void on_ready(void *arg, const wk_exec_result *res)
{
    tb *b = arg;
    struct timeval sec = {1, 0};

    if (!res->error && res->exit_code == 0) {
        log_str(b, "== ready_cmd succeeded\n");
        finish(b);
        return;
    }
    if (res->error || ++b->ready_tries >= TB_READY_TRIES) {
        char detail[1100];
        if (!res->error)
            log_result(b, res);
        output_tail(res, detail, 1024);
        fail(b, 0, "ready_cmd did not succeed within 60 seconds of start_cmd; its last "
             "output: %s", res->error ? res->error : detail);
        return;
    }
    event_base_once(b->ctx->d.base, -1, EV_TIMEOUT, retry_ready, b, &sec);
}

static void on_started(void *arg, const wk_exec_result *res)
{
    tb *b = arg;
    const char *ready = json_string_value(json_object_get(b->args, "ready_cmd"));

    if (res->error || res->exit_code != 0) {
        fail(b, 0, "start_cmd could not be started: %s", res->error ? res->error : "the shell failed");
        return;
    }
    if (!ready) {
        finish(b);
        return;
    }
    log_str(b, "== ready_cmd\n");
    retry_ready(-1, 0, b);
}

static void run_next(tb *b)
{
    json_t *steps = json_object_get(b->args, "run_steps");
    const char *start = json_string_value(json_object_get(b->args, "start_cmd"));
    const char *ready = json_string_value(json_object_get(b->args, "ready_cmd"));
    char head[160];

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
    if (start) { /* in the background, its output in /tmp/sandfleet-start.log */
        static const char bg[] = "nohup /bin/sh -c \"$SF_START_CMD\" >/tmp/sandfleet-start.log "
                                 "2>&1 </dev/null &";
        char *env[2] = {NULL, NULL};
        int rc;
        log_str(b, "== start_cmd\n");
        if (asprintf(&env[0], "SF_START_CMD=%s", start) < 0) {
            fail(b, 0, "%s", "The host is out of memory; build it again.");
            return;
        }
        rc = exec_cmd(b, bg, (const char *const *)env, on_started, 30000);
        free(env[0]);
        if (rc < 0)
            fail(b, 0, "%s", "start_cmd could not be started in the build sandbox.");
        return;
    }
    if (ready) {
        log_str(b, "== ready_cmd\n");
        retry_ready(-1, 0, b);
        return;
    }
    finish(b);
}

static void on_created(void *arg, wk_sandbox *sb, int rc, const char *why)
{
    tb *b = arg;

    if (rc < 0) {
        wk_rmtree(b->tmp); /* on the loop: rare, and the tree is the copy's */
        snprintf(b->error, sizeof(b->error), "The build sandbox could not start (%s); build "
                 "it again.", why ? why : "driver error");
        finish_done(b);
        return;
    }
    b->sb = sb;
    log_str(b, "== build sandbox started\n");
    run_next(b);
}

/* ---- the copy of `from` ------------------------------------------------------------- */

static void copy_work(void *arg)
{
    tb *b = arg;
    char *argv[] = {"cp", "-a", b->src, b->tmp, NULL};
    int status = 0;
    pid_t pid;

    wk_rmtree(b->tmp);
    if ((b->rc = wk_mkdir_p(b->dir, 0700)) < 0)
        return;
    if ((b->rc = -posix_spawnp(&pid, "cp", NULL, NULL, argv, environ)) < 0)
        return;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        b->rc = -EIO;
        wk_rmtree(b->tmp);
    }
}

static void copy_done(void *arg)
{
    tb *b = arg;
    wk_create_req req = {0};
    int rc;

    if (b->rc < 0) {
        snprintf(b->error, sizeof(b->error), "The host could not copy template '%s' (disk "
                 "full?); build it again later.", json_string_value(json_object_get(b->args, "from")));
        finish_done(b);
        return;
    }
    log_str(b, "== copied the root filesystem\n");
    req.id = b->id;
    req.limits = b->lim;
    req.build_root = b->tmp;
    if ((rc = b->ctx->ops->create(b->ctx->drv, &req, on_created, b)) < 0) {
        wk_rmtree(b->tmp);
        snprintf(b->error, sizeof(b->error), "The build sandbox could not start (%s); build "
                 "it again.", strerror(-rc));
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
    b->ctx = ctx;
    b->args = json_deep_copy(a);
    snprintf(b->team, sizeof(b->team), "%s", job->team);
    snprintf(b->name, sizeof(b->name), "%s", name);
    sf_id_new(b->id, "tb_");
    b->lim.memory_mib = (uint64_t)json_integer_value(json_object_get(a, "memory_mib"));
    b->lim.vcpu_milli = (uint32_t)json_integer_value(json_object_get(a, "vcpu_milli"));
    b->lim.disk_mib = (uint64_t)json_integer_value(json_object_get(a, "disk_mib"));
    b->nsteps = json_array_size(json_object_get(a, "run_steps"));
    sf_info("msg=\"template build\" team=%s template=%s from=%s steps=%zu", b->team, b->name,
            from, b->nsteps);
    if (strcmp(ctx->ops->name, "jail") != 0) {
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
        snprintf(b->tmp, sizeof(b->tmp), "%s/rootfs.tmp-%d", b->dir, (int)getpid()) >=
            (int)sizeof(b->tmp)) {
        snprintf(b->error, sizeof(b->error), "The template's path is too long on this host; "
                 "use a shorter name.");
        finish_done(b);
        return;
    }
    rset(b, "step", "copy");
    if (wk_pool_run(ctx->pool, copy_work, copy_done, b) < 0) {
        snprintf(b->error, sizeof(b->error), "The host is out of memory; build it again.");
        finish_done(b);
    }
}
