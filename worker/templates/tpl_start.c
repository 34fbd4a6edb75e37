/* tpl_start.c: a template's service in a sandbox (tpl_start.h). */
#include "tpl_start.h"
#include "egress.h"
#include "tstore.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TS_ENV_MAX 256
#define TS_READY_TIMEOUT_MS 10000 /* one run of ready_cmd */
#define TS_MARGIN_MS 1500         /* a box's create: answered this long before its deadline */
#define TS_BOX_WAIT_MAX_MS 300000 /* ...and never waits longer (a batch job's long deadline) */

/* The start: detached (setsid where the template has it), output to WK_START_LOG (a new
 * file of the sandbox's: one the template holds belongs to nobody there). */
static const char start_wrapper[] =
    "rm -f " WK_START_LOG "; : >" WK_START_LOG " || exit 1\n"
    "if command -v setsid >/dev/null 2>&1; then\n"
    "  setsid /bin/sh -c \"$SF_START_CMD\" >>" WK_START_LOG " 2>&1 </dev/null &\n"
    "else\n"
    "  nohup /bin/sh -c \"$SF_START_CMD\" >>" WK_START_LOG " 2>&1 </dev/null &\n"
    "fi";

typedef struct tstart {
    wk_ctx *ctx;
    wk_sandbox *sb;
    char *ready;
    char **env;               /* owned, NULL-terminated */
    size_t nenv;
    int64_t deadline_ms, began_ms;
    int tries;
    int (*gone)(void *arg);
    wk_tpl_start_cb cb;
    void *arg;
    struct event *kick;       /* the first step, from the loop */
    struct event *timer;      /* the next ready_cmd */
    int last_exit;
    char last[600];           /* ready_cmd's last output (cleaned) */
    char why[1800];
} tstart;

static void ts_free(tstart *t)
{
    if (!t)
        return;
    if (t->kick)
        event_free(t->kick);
    if (t->timer)
        event_free(t->timer);
    for (size_t i = 0; i < t->nenv; i++)
        free(t->env[i]);
    free(t->env);
    free(t->ready);
    free(t);
}

static void end(tstart *t, int rc, const char *why)
{
    wk_tpl_start_cb cb = t->cb;
    void *arg = t->arg;

    if (rc < 0)
        sf_debug("msg=\"template service not ready\" rc=%d why=\"%s\"", rc, why ? why : "");
    cb(arg, rc, why);
    ts_free(t);
}

/* The end of a command's output (stdout, then stderr) as one line of text. */
static void tail_text(const wk_exec_result *res, char *buf, size_t n)
{
    const char *parts[2] = {res->out, res->err};
    size_t lens[2] = {res->out_len, res->err_len}, len = 0, take;

    for (int i = 0; i < 2; i++) {
        take = lens[i] > (n - 1) / 2 ? (n - 1) / 2 : lens[i];
        if (take && len + take < n) {
            memcpy(buf + len, parts[i] + lens[i] - take, take);
            len += take;
        }
    }
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
        len--;
    buf[len] = '\0';
    for (size_t i = 0; i < len; i++) /* one line of text: no control bytes */
        if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
            buf[i] = ' ';
    if (!len)
        snprintf(buf, n, "(nothing)");
}

static int exec_cmd(tstart *t, const char *cmd, const char *const *env, uint32_t timeout_ms,
                    wk_exec_cb cb)
{
    wk_exec_req req = {.command = cmd, .env = env, .timeout_ms = timeout_ms, .cap_bytes = 4096};
    return t->ctx->ops->exec(t->sb, &req, cb, t);
}

static void on_log_tail(void *arg, const wk_exec_result *res)
{
    tstart *t = arg;
    char logtail[500] = "(unreadable)";

    if (!res->error)
        tail_text(res, logtail, sizeof(logtail));
    snprintf(t->why, sizeof(t->why), "ready_cmd (%.200s) did not succeed within %lld s of "
             "start_cmd (its last exit status %d, its output ending: %s; start_cmd's output "
             "in " WK_START_LOG " ending: %s)", t->ready,
             (long long)((sf_now_ms() - t->began_ms + 999) / 1000), t->last_exit, t->last,
             logtail);
    end(t, -ETIMEDOUT, t->why);
}

static void on_ready(void *arg, const wk_exec_result *res);

static void run_ready(evutil_socket_t fd, short what, void *arg)
{
    tstart *t = arg;
    int64_t left = t->deadline_ms - sf_now_ms();
    int rc;

    (void)fd;
    (void)what;
    if (t->gone && t->gone(t->arg)) {
        end(t, -ECANCELED, "the sandbox is being removed");
        return;
    }
    if (left < 100) { /* out of time: say why, with the end of the service's log */
        if (exec_cmd(t, "tail -c 400 " WK_START_LOG, NULL, 2000, on_log_tail) < 0)
            on_log_tail(t, &(wk_exec_result){.error = "gone"});
        return;
    }
    rc = exec_cmd(t, t->ready, (const char *const *)t->env,
                  (uint32_t)(left < TS_READY_TIMEOUT_MS ? left : TS_READY_TIMEOUT_MS), on_ready);
    if (rc < 0) {
        snprintf(t->why, sizeof(t->why), "ready_cmd could not be run in the sandbox (%s)",
                 strerror(-rc));
        end(t, -EIO, t->why);
    }
}

static void on_ready(void *arg, const wk_exec_result *res)
{
    tstart *t = arg;
    int64_t delay = 100LL << (t->tries < 4 ? t->tries : 4);
    struct timeval tv;

    if (res->error) {
        snprintf(t->why, sizeof(t->why), "ready_cmd could not run (%s)", res->error);
        end(t, -EIO, t->why);
        return;
    }
    if (res->exit_code == 0) {
        sf_debug("msg=\"template service ready\" tries=%d ms=%lld", t->tries + 1,
                 (long long)(sf_now_ms() - t->began_ms));
        end(t, 0, NULL);
        return;
    }
    t->last_exit = res->exit_code;
    tail_text(res, t->last, sizeof(t->last));
    t->tries++;
    if (delay > 1000)
        delay = 1000;
    tv.tv_sec = 0;
    tv.tv_usec = (suseconds_t)(delay * 1000);
    if (!t->timer && !(t->timer = evtimer_new(t->ctx->d.base, run_ready, t))) {
        end(t, -ENOMEM, "the host is out of memory");
        return;
    }
    evtimer_add(t->timer, &tv);
}

static void on_started(void *arg, const wk_exec_result *res)
{
    tstart *t = arg;

    if (res->error || res->exit_code != 0) {
        char out[400] = "";
        if (!res->error)
            tail_text(res, out, sizeof(out));
        snprintf(t->why, sizeof(t->why), SF_MSG_TPL_START_CMD_FMT,
                 res->error ? res->error : out);
        end(t, -EIO, t->why);
        return;
    }
    t->began_ms = sf_now_ms();
    if (!t->ready) {
        end(t, 0, NULL);
        return;
    }
    run_ready(-1, 0, t);
}

/* Runs the first step from the loop, so cb is never called inside wk_tpl_start. */
static void begin(evutil_socket_t fd, short what, void *arg)
{
    tstart *t = arg;
    const char *start = t->env[t->nenv - 1] + strlen("SF_START_CMD=");
    int rc;

    (void)fd;
    (void)what;
    if (!*start) { /* no start_cmd: only ready_cmd */
        on_started(t, &(wk_exec_result){.exit_code = 0});
        return;
    }
    rc = exec_cmd(t, start_wrapper, (const char *const *)t->env, 30000, on_started);
    if (rc < 0) {
        snprintf(t->why, sizeof(t->why), SF_MSG_TPL_START_CMD_FMT, strerror(-rc));
        end(t, -EIO, t->why);
    }
}

int wk_tpl_start(wk_ctx *ctx, wk_sandbox *sb, const wk_tpl_start_req *req, wk_tpl_start_cb cb,
                 void *arg)
{
    tstart *t = calloc(1, sizeof(*t));
    size_t n = 0;
    struct timeval now = {0, 0};

    if (!t)
        return -ENOMEM;
    while (req->env && req->env[n] && n < TS_ENV_MAX - 1)
        n++;
    t->ctx = ctx;
    t->sb = sb;
    t->deadline_ms = req->deadline_ms;
    t->gone = req->gone;
    t->cb = cb;
    t->arg = arg;
    t->began_ms = sf_now_ms();
    t->last_exit = -1;
    snprintf(t->last, sizeof(t->last), "(none: no time was left to run it)");
    /* the environment, then SF_START_CMD last (begin finds it there) */
    if (!(t->env = calloc(n + 2, sizeof(char *))))
        goto oom;
    for (size_t i = 0; i < n; i++) {
        if (!(t->env[i] = strdup(req->env[i])))
            goto oom;
        t->nenv++;
    }
    if (asprintf(&t->env[t->nenv], "SF_START_CMD=%s", req->start_cmd ? req->start_cmd : "") < 0) {
        t->env[t->nenv] = NULL;
        goto oom;
    }
    t->nenv++;
    if ((req->ready_cmd && !(t->ready = strdup(req->ready_cmd))) ||
        !(t->kick = evtimer_new(ctx->d.base, begin, t)) || evtimer_add(t->kick, &now) < 0)
        goto oom;
    return 0;
oom:
    ts_free(t);
    return -ENOMEM;
}

/* ---- a sandbox being created ------------------------------------------------------- */

typedef struct boxstart {
    wk_box *b;
    void (*done)(wk_box *b, int rc, const char *why);
} boxstart;

static int box_gone(void *arg)
{
    boxstart *s = arg;
    return s->b->state == WK_BOX_KILLING || s->b->ctx->stopping;
}

static void box_done(void *arg, int rc, const char *why)
{
    boxstart *s = arg;
    wk_box *b = s->b;
    void (*done)(wk_box *b, int rc, const char *why) = s->done;

    free(s);
    done(b, rc == 0 && box_gone(&(boxstart){.b = b}) ? -ECANCELED : rc, why);
}

int wk_tpl_start_box(wk_box *b, void (*done)(wk_box *b, int rc, const char *why))
{
    wk_ctx *ctx = b->ctx;
    const json_t *args = b->create ? b->create->job.args : NULL;
    const char *tpl = json_string_value(json_object_get(args, "from_template"));
    char *start = NULL, *ready = NULL;
    const char *env[TS_ENV_MAX + 1];
    char *store[TS_ENV_MAX];
    json_t *all = NULL;
    size_t n = 0;
    const char *k;
    json_t *v;
    boxstart *s = NULL;
    wk_tpl_start_req req = {0};
    int rc = 1;

    if (!tpl || !ctx->tstore ||
        wk_tstore_service(ctx->tstore, b->team, tpl, &start, &ready) < 0 || (!start && !ready))
        goto out;
    /* the sandbox's environment, as every exec gets it: env_vars, then egress */
    rc = -ENOMEM;
    if (!(all = json_object()))
        goto out;
    if (b->env)
        json_object_update(all, b->env);
    if (b->eg)
        json_object_update(all, wk_egress_env(b->eg));
    json_object_foreach(all, k, v) {
        if (!json_is_string(v) || n == TS_ENV_MAX)
            continue;
        if (asprintf(&store[n], "%s=%s", k, json_string_value(v)) < 0)
            goto out;
        env[n] = store[n];
        n++;
    }
    env[n] = NULL;
    if (!(s = calloc(1, sizeof(*s))))
        goto out;
    s->b = b;
    s->done = done;
    req.start_cmd = start;
    req.ready_cmd = ready;
    req.env = env;
    req.deadline_ms = b->create->job.deadline_ms - TS_MARGIN_MS;
    if (req.deadline_ms > sf_now_ms() + TS_BOX_WAIT_MAX_MS)
        req.deadline_ms = sf_now_ms() + TS_BOX_WAIT_MAX_MS;
    req.gone = box_gone;
    if ((rc = wk_tpl_start(ctx, b->sb, &req, box_done, s)) == 0) {
        s = NULL;
        sf_info("msg=\"starting the template's service\" sandbox=%s template=%s", b->id, tpl);
    }
out:
    free(s);
    for (size_t i = 0; i < n; i++)
        free(store[i]);
    json_decref(all);
    free(start);
    free(ready);
    return rc;
}
