/* procs.c: the process tools (sandbox_process_list, _kill, _logs). The agent, pid 1 of the
 * sandbox, does the work (driver.h's file operation with the WK_PROC_* ops: it reads the
 * sandbox's /proc, signals, keeps the logs of background commands); the worker checks
 * the arguments and words the answers. One agent request per call. */
#include "worker.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GRACE_DEFAULT_MS 5000
#define GRACE_MAX_MS 60000
#define TAIL_MAX (256u * 1024) /* the agent answers at most this much log per call */

typedef struct pcall {
    wk_call *c;
    wk_ctx *ctx;
    char sandbox[SF_ID_MAX];
    uint32_t pid;
    const char *signame;
} pcall;

static void pc_fail(pcall *p, const char *code, const char *message)
{
    wk_reply_error(p->c, code, message);
    free(p);
}

static pcall *pc_new(wk_call *c, wk_box *b)
{
    pcall *p = calloc(1, sizeof(*p));

    if (!p) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return NULL;
    }
    p->c = c;
    p->ctx = c->ctx;
    snprintf(p->sandbox, sizeof(p->sandbox), "%s", b->id);
    return p;
}

/* The pid argument; -1 (answered) when it is not a pid. */
static int take_pid(pcall *p)
{
    json_t *v = json_object_get(p->c->job.args, "pid");
    json_int_t n = json_integer_value(v);

    if (!json_is_integer(v) || n < 1 || n > INT32_MAX) {
        pc_fail(p, SF_ERR_INVALID, "Argument 'pid' must be a process id (an integer from 1), "
                                   "as sandbox_process_list or sandbox_exec background: true "
                                   "gave it.");
        return -1;
    }
    p->pid = (uint32_t)n;
    return 0;
}

static void pc_send(pcall *p, const wk_file_req *req, wk_file_cb cb)
{
    wk_box *b = sf_map_get(p->ctx->sandboxes, p->sandbox);
    char text[200];
    int rc;

    if (!b || b->state != WK_BOX_RUNNING) {
        snprintf(text, sizeof(text), SF_MSG_SANDBOX_KILLED_DURING_CALL_FMT, p->sandbox);
        pc_fail(p, SF_ERR_NOT_FOUND, text);
        return;
    }
    if ((rc = p->ctx->ops->file(b->sb, req, cb, p)) == 0)
        return;
    pc_fail(p, rc == -EBUSY ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE,
            rc == -EBUSY ? SF_MSG_TOO_MANY_CALLS
                         : "The sandbox did not accept the request; retry, or create a new "
                           "sandbox.");
}

/* The agent's error: its errno says whose fault. */
static void fail_agent(pcall *p, const wk_file_result *res)
{
    const char *code = res->err == ESRCH || res->err == ENOENT ? SF_ERR_NOT_FOUND
                       : res->err == EPERM                     ? SF_ERR_INVALID
                       : res->err == EBUSY                     ? SF_ERR_LIMIT
                                                               : SF_ERR_UNAVAILABLE;
    pc_fail(p, code, res->error);
}

static void done(pcall *p, json_t *r)
{
    wk_touch(p->ctx, p->sandbox);
    wk_reply_result(p->c, r);
    free(p);
}

/* ---- sandbox_process_list ------------------------------------------------ */

static const char *state_word(char s)
{
    switch (s) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "disk_sleep";
    case 'Z': return "zombie";
    case 'T': return "stopped";
    case 't': return "tracing_stop";
    case 'I': return "idle";
    case 'X': case 'x': return "dead";
    default: return "other";
    }
}

static json_t *iso_ms(uint64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    char buf[40];

    gmtime_r(&t, &tm);
    strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    return json_sprintf("%s.%03uZ", buf, (unsigned)(ms % 1000));
}

static void on_list(void *arg, const wk_file_result *res)
{
    pcall *p = arg;
    json_t *list, *r;

    if (res->error) {
        fail_agent(p, res);
        return;
    }
    list = json_array();
    for (size_t i = 0; i < res->n_procs; i++) {
        const sf_ap_proc *q = &res->procs[i];
        size_t n = 0;
        char *cmd = sf_utf8_clean(q->cmd, strlen(q->cmd), &n);
        json_array_append_new(list, json_pack("{s:I, s:s%, s:o, s:I, s:I, s:s}",
            "pid", (json_int_t)q->pid, "command", cmd ? cmd : "?", cmd ? n : (size_t)1,
            "started_at", iso_ms(q->start_ms), "cpu_ms", (json_int_t)q->cpu_ms,
            "rss_kib", (json_int_t)q->rss_kib, "state", state_word(q->state)));
        free(cmd);
    }
    r = json_pack("{s:o, s:I}", "processes", list, "count", (json_int_t)res->n_procs);
    if (res->more)
        json_object_set_new(r, "truncated", json_true());
    done(p, r);
}

static void procs_list(wk_call *c, wk_box *b)
{
    pcall *p = pc_new(c, b);
    wk_file_req req = {.op = WK_PROC_LIST};

    if (p)
        pc_send(p, &req, on_list);
}

/* ---- sandbox_process_kill ------------------------------------------------ */

static void on_kill(void *arg, const wk_file_result *res)
{
    pcall *p = arg;

    if (res->error) {
        fail_agent(p, res);
        return;
    }
    done(p, json_pack("{s:I, s:s, s:b, s:b}", "pid", (json_int_t)p->pid, "signal", p->signame,
                      "killed_after_grace", (int)res->size, "exited", 1));
}

static void procs_kill(wk_call *c, wk_box *b)
{
    static const struct { const char *name; uint32_t sig; } sigs[] = {
        {"TERM", 15}, {"KILL", 9}, {"INT", 2}, {"HUP", 1},
    };
    pcall *p = pc_new(c, b);
    json_t *a = c->job.args, *g = json_object_get(a, "grace_ms");
    const char *s = json_string_value(json_object_get(a, "signal"));
    wk_file_req req = {.op = WK_PROC_KILL, .sig = 0, .grace_ms = GRACE_DEFAULT_MS};

    if (!p || take_pid(p) < 0)
        return;
    for (size_t i = 0; i < SF_ARRAY_LEN(sigs); i++)
        if (!s || !strcmp(s, sigs[i].name)) {
            req.sig = sigs[i].sig;
            p->signame = sigs[i].name;
            break;
        }
    if (!req.sig) {
        pc_fail(p, SF_ERR_INVALID, "Argument 'signal' must be one of TERM, KILL, INT or HUP.");
        return;
    }
    if (g && (!json_is_integer(g) || json_integer_value(g) < 0 ||
              json_integer_value(g) > GRACE_MAX_MS)) {
        pc_fail(p, SF_ERR_INVALID, "Argument 'grace_ms' must be an integer from 0 to 60000 "
                                   "(milliseconds before KILL follows).");
        return;
    }
    if (g)
        req.grace_ms = (uint32_t)json_integer_value(g);
    req.pid = p->pid;
    pc_send(p, &req, on_kill);
}

/* ---- sandbox_process_logs ------------------------------------------------ */

static void on_logs(void *arg, const wk_file_result *res)
{
    pcall *p = arg;
    size_t n = 0;
    char *text;
    json_t *r;

    if (res->error) {
        fail_agent(p, res);
        return;
    }
    text = sf_utf8_clean(res->data ? res->data : "", res->data_len, &n);
    r = json_pack("{s:I, s:s%, s:I, s:I, s:b}", "pid", (json_int_t)p->pid, "data",
                  text ? text : "", text ? n : (size_t)0, "offset", (json_int_t)res->size,
                  "next_offset", (json_int_t)res->off, "exited", res->exited);
    free(text);
    if (res->exited)
        json_object_set_new(r, "exit_code", json_integer(res->exit_code));
    if (res->exited && res->timed_out) /* not timed_out: the logs call itself worked */
        json_object_set_new(r, "killed_at_timeout", json_true());
    done(p, r);
}

static void procs_logs(wk_call *c, wk_box *b)
{
    pcall *p = pc_new(c, b);
    json_t *a = c->job.args, *t = json_object_get(a, "tail_bytes"),
           *o = json_object_get(a, "offset");
    wk_file_req req = {.op = WK_PROC_LOGS};

    if (!p || take_pid(p) < 0)
        return;
    if (t && o) {
        pc_fail(p, SF_ERR_INVALID, "Pass either 'tail_bytes' (the last bytes) or 'offset' (from "
                                   "a next_offset), not both.");
        return;
    }
    if (t && (!json_is_integer(t) || json_integer_value(t) < 1 ||
              json_integer_value(t) > TAIL_MAX)) {
        pc_fail(p, SF_ERR_INVALID, "Argument 'tail_bytes' must be an integer from 1 to 262144; "
                                   "read more with 'offset' and next_offset.");
        return;
    }
    if (o && (!json_is_integer(o) || json_integer_value(o) < 0)) {
        pc_fail(p, SF_ERR_INVALID, "Argument 'offset' must be a byte offset (0, or a "
                                   "next_offset an earlier call returned).");
        return;
    }
    req.pid = p->pid;
    req.tail = t ? (uint32_t)json_integer_value(t) : 0;
    req.has_off = o != NULL;
    req.off = o ? (uint64_t)json_integer_value(o) : 0;
    if (req.off >= (uint64_t)1 << 62)
        req.off = ((uint64_t)1 << 62) - 1; /* past the end: nothing yet */
    pc_send(p, &req, on_logs);
}

WK_HANDLERS({"sandbox_process_list", procs_list}, {"sandbox_process_kill", procs_kill},
            {"sandbox_process_logs", procs_logs});
