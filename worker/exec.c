/* exec.c: sandbox_exec: a command through the driver, its output streamed or capped,
 * its env (the create's, the call's, the secrets' placeholders). */
#include "worker.h"
#include "egress.h"
#include "sf_claim.h"
#include "sf_events.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_msg.h"
#include "sf_records.h"
#include "sf_tools.h"
#include "sf_trace.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define EXEC_CAP_BYTES 32768
#define EXEC_ENV_MAX 256

/* Output text for JSON: valid UTF-8, with a marker where the middle was cut. */
static json_t *stream_text(const char *p, size_t len, uint64_t total)
{
    char *clean;
    size_t clen;
    json_t *s;

    if (total > len) {
        char mark[96];
        sf_buf b;
        size_t head = len / 2;
        int n = snprintf(mark, sizeof(mark), "\n[... %llu bytes omitted ...]\n",
                         (unsigned long long)(total - len));
        sf_buf_init(&b, len + sizeof(mark));
        sf_buf_append(&b, p, head);
        sf_buf_append(&b, mark, (size_t)n);
        sf_buf_append(&b, p + head, len - head);
        clean = sf_utf8_clean(b.p ? b.p : "", b.len, &clen);
        sf_buf_fini(&b);
    } else {
        clean = sf_utf8_clean(p ? p : "", len, &clen);
    }
    s = clean ? json_stringn(clean, clen) : json_string("");
    free(clean);
    return s;
}

/* A chunk of a streamed exec's output (the agent bounds their rate and size): one
 * `progress` reply (schemas/envelope.md), for callers that asked for progress. */
static void on_exec_output(void *arg, int stream, const char *data, size_t len)
{
    wk_call *c = arg;
    size_t n = 0;
    char *text;
    json_t *chunk;

    if (c->cancelled || !(text = sf_utf8_clean(data, len, &n)))
        return;
    chunk = json_pack("{s:s, s:s%}", "stream", stream == 1 ? "stderr" : "stdout", "data", text, n);
    if (chunk && sf_jobio_progress(c->ctx->producer, &c->job, chunk) < 0)
        sf_debug("msg=\"cannot produce a progress reply\" job=%s", c->job.id);
    json_decref(chunk);
    free(text);
}

static void on_exec_done(void *arg, const wk_exec_result *res)
{
    wk_call *c = arg;
    json_t *r;

    SF_TRACE(c->job.id, "exit", res->error ? -1 : (int64_t)res->duration_ms);
    sf_map_del(c->ctx->running, c->job.id);
    if (c->cancelled) { /* its caller left: the one final reply, which nobody shows */
        sf_info("msg=\"exec cancelled\" job=%s sandbox=%s", c->job.id, c->job.sandbox);
        wk_reply_error(c, SF_ERR_CANCELLED, "The call was cancelled by its caller.");
        return;
    }
    if (res->error) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, res->error);
        return;
    }
    if (res->still_running) { /* detached: the output so far; it runs on, followed by pid */
        char note[400];
        snprintf(note, sizeof(note), "The command is still running (after %u ms) as "
                 "background process %u; read its further output and, once it ends, its "
                 "exit_code with sandbox_process_logs (sandbox_id, pid: %u; pass next_offset "
                 "as offset to read on), or stop it with sandbox_process_kill.",
                 res->duration_ms, res->pid, res->pid);
        wk_touch(c->ctx, c->job.sandbox);
        r = json_object();
        json_object_set_new(r, "stdout", stream_text(res->out, res->out_len, res->out_total));
        json_object_set_new(r, "stderr", stream_text(res->err, res->err_len, res->err_total));
        json_object_set_new(r, "still_running", json_true());
        json_object_set_new(r, "pid", json_integer((json_int_t)res->pid));
        json_object_set_new(r, "truncated", json_boolean(res->truncated));
        json_object_set_new(r, "stdout_bytes", json_integer((json_int_t)res->out_total));
        json_object_set_new(r, "stderr_bytes", json_integer((json_int_t)res->err_total));
        json_object_set_new(r, "duration_ms", json_integer(res->duration_ms));
        json_object_set_new(r, "log", json_string("sandbox_process_logs"));
        json_object_set_new(r, "note", json_string(note));
        sf_debug("msg=\"exec detached\" job=%s sandbox=%s pid=%u ms=%u", c->job.id,
                 c->job.sandbox, res->pid, res->duration_ms);
        wk_reply_result(c, r);
        return;
    }
    if (res->pid) { /* background: it runs on, its output in its log */
        wk_touch(c->ctx, c->job.sandbox);
        wk_reply_result(c, json_pack("{s:I, s:b, s:s, s:s, s:i, s:s}", "pid",
                                     (json_int_t)res->pid, "background", 1, "stdout", "",
                                     "stderr", "", "exit_code", 0, "log",
                                     "sandbox_process_logs"));
        return;
    }
    r = json_object();
    json_object_set_new(r, "stdout", stream_text(res->out, res->out_len, res->out_total));
    json_object_set_new(r, "stderr", stream_text(res->err, res->err_len, res->err_total));
    if (res->oom_killed) {
        wk_box *b = sf_map_get(c->ctx->sandboxes, c->job.sandbox);
        char note[256];
        snprintf(note, sizeof(note), "%s[sandfleet] The sandbox reached its memory limit (%u MiB) "
                 "and the kernel killed a process of this command; use less memory.\n",
                 json_string_length(json_object_get(r, "stderr")) ? "\n" : "",
                 b ? b->lim.memory_mib : 0);
        json_object_set_new(r, "stderr", json_sprintf("%s%s",
                            json_string_value(json_object_get(r, "stderr")), note));
    }
    json_object_set_new(r, "exit_code", json_integer(res->exit_code));
    json_object_set_new(r, "truncated", json_boolean(res->truncated));
    json_object_set_new(r, "stdout_bytes", json_integer((json_int_t)res->out_total));
    json_object_set_new(r, "stderr_bytes", json_integer((json_int_t)res->err_total));
    json_object_set_new(r, "timed_out", json_boolean(res->timed_out));
    json_object_set_new(r, "duration_ms", json_integer(res->duration_ms));
    if (res->oom_killed)
        json_object_set_new(r, "oom_killed", json_true());
    wk_touch(c->ctx, c->job.sandbox);
    sf_debug("msg=\"exec done\" job=%s sandbox=%s exit=%d ms=%u", c->job.id, c->job.sandbox,
             res->exit_code, res->duration_ms);
    wk_reply_result(c, r);
}

/* Appends "K=V" strings of obj to env (owned copies in *store). */
static int env_add(json_t *obj, const char **env, size_t *n, char **store)
{
    const char *k;
    json_t *v;

    json_object_foreach(obj, k, v) {
        char *kv;
        if (!json_is_string(v))
            continue;
        if (*n >= EXEC_ENV_MAX || asprintf(&kv, "%s=%s", k, json_string_value(v)) < 0)
            return -1;
        store[*n] = kv;
        env[(*n)++] = kv;
    }
    return 0;
}

/* background and stdin (issue 20), detach (issue 27); -1 (answered) when one is
 * unusable. */
static int exec_extras(wk_call *c, wk_exec_req *req)
{
    json_t *in = json_object_get(c->job.args, "stdin"),
           *d = json_object_get(c->job.args, "detach_after_ms");
    int64_t detach = c->ctx->cfg.exec_detach_ms;

    req->background = json_is_true(json_object_get(c->job.args, "background"));
    if (d && (!json_is_integer(d) || json_integer_value(d) < 0 ||
              json_integer_value(d) > SF_EXEC_TIMEOUT_MAX_MS)) {
        wk_reply_error(c, SF_ERR_INVALID, "Argument 'detach_after_ms' must be an integer from "
                                          "0 (never: the call waits for the command) to "
                                          "600000 milliseconds.");
        return -1;
    }
    if (d)
        detach = json_integer_value(d);
    /* the call answers then, when it would wait longer */
    if (!req->background && detach > 0 && detach < (int64_t)req->timeout_ms)
        req->detach_ms = (uint32_t)detach;
    if (!in)
        return 0;
    if (!json_is_string(in) || json_string_length(in) > WK_EXEC_STDIN_MAX) {
        wk_reply_error(c, SF_ERR_INVALID, "Argument 'stdin' must be a UTF-8 string of at most "
                                          "8 MiB; pass larger input through a file "
                                          "(sandbox_files_write, then `cmd < file`).");
        return -1;
    }
    req->has_stdin = 1;
    req->stdin_data = json_string_value(in);
    req->stdin_len = json_string_length(in);
    return 0;
}

static void do_exec(wk_call *c, wk_box *b)
{
    json_t *a = c->job.args, *all = json_object();
    const char *env[EXEC_ENV_MAX + 1];
    char *store[EXEC_ENV_MAX];
    size_t n = 0;
    int64_t timeout = sf_exec_timeout_ms(a);
    int64_t left = c->job.deadline_ms - sf_now_ms() - 200; /* the caller stops waiting then */
    wk_exec_req req = {0};
    int rc;

    if (timeout > left)
        timeout = left > 1 ? left : 1;
    /* one value per name: env_vars, then the egress variables (proxy, CA, placeholders),
     * then the call's own env */
    if (b->env)
        json_object_update(all, b->env);
    if (b->eg)
        json_object_update(all, wk_egress_env(b->eg));
    if (json_is_object(json_object_get(a, "env")))
        json_object_update(all, json_object_get(a, "env"));
    if (!all || env_add(all, env, &n, store) < 0) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        json_decref(all);
        wk_reply_error(c, SF_ERR_INVALID, SF_MSG_ENV_TOO_MANY);
        return;
    }
    json_decref(all);
    env[n] = NULL;
    req.command = json_string_value(json_object_get(a, "command"));
    req.cwd = json_string_value(json_object_get(a, "cwd"));
    req.env = env;
    req.timeout_ms = (uint32_t)timeout;
    req.cap_bytes = EXEC_CAP_BYTES;
    if (c->job.progress)
        req.on_output = on_exec_output;
    if (exec_extras(c, &req) < 0) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        return;
    }
    if (!req.command) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        wk_reply_error(c, SF_ERR_INVALID, "Argument 'command' is required.");
        return;
    }
    SF_TRACE(c->job.id, "exec", 0);
    rc = c->ctx->ops->exec(b->sb, &req, on_exec_done, c);
    if (rc == 0 && sf_map_put(c->ctx->running, c->job.id, c) < 0)
        sf_warn("msg=\"exec cannot be cancelled (out of memory)\" job=%s", c->job.id);
    for (size_t i = 0; i < n; i++)
        free(store[i]);
    if (rc == -EBUSY)
        wk_reply_error(c, SF_ERR_LIMIT, "64 commands are already running in this sandbox; wait for "
                                     "some to finish, then retry.");
    else if (rc == -E2BIG)
        wk_reply_error(c, SF_ERR_INVALID, "The command and its environment are too large (the limit "
                                       "is 1 MiB); write a script with a file and run that.");
    else if (rc == -EINVAL)
        wk_reply_error(c, SF_ERR_INVALID, "The command, cwd or environment could not be sent (too "
                                       "long, or containing NUL bytes); shorten them.");
    else if (rc == -ESRCH)
        wk_reply_error(c, SF_ERR_NOT_FOUND, "The sandbox is being killed; create a new one with "
                                         "sandbox_create.");
    else if (rc == -ESHUTDOWN) /* (the sandbox goes on for the next worker) */
        wk_reply_error(c, SF_ERR_UNAVAILABLE, SF_MSG_HOST_STOPPING);
    else if (rc < 0)
        wk_reply_error(c, SF_ERR_UNAVAILABLE,
                    "The sandbox did not accept the command; retry, or create a new sandbox.");
}

WK_HANDLERS({"sandbox_exec", do_exec});
