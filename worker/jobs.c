/* jobs.c: one host's job handling: create, exec and kill against the driver. */
#include "worker.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_tools.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define EXEC_CAP_BYTES 32768
#define EXEC_ENV_MAX 256

typedef struct wk_call {
    wk_ctx *ctx;
    sf_job job;
    sf_kafka_ticket ticket;
} wk_call;

static void call_done(wk_call *c)
{
    sf_jobq_done(c->ctx->jobq, c->ticket);
    sf_job_fini(&c->job);
    free(c);
}

static void reply_error(wk_call *c, const char *code, const char *message)
{
    if (sf_jobio_error(c->ctx->producer, &c->job, code, message) < 0)
        sf_error("msg=\"cannot produce reply\" job=%s", c->job.id);
    sf_info("msg=\"job failed\" job=%s tool=%s sandbox=%s code=%s", c->job.id, c->job.tool,
            c->job.sandbox, code);
    call_done(c);
}

static void reply_result(wk_call *c, json_t *result)
{
    if (sf_jobio_result(c->ctx->producer, &c->job, result) < 0)
        sf_error("msg=\"cannot produce reply\" job=%s", c->job.id);
    json_decref(result);
    call_done(c);
}

/* For writes nobody waits on: an error is logged, nothing else. */
void wk_redis_logged(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    if (rep && rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"redis write failed\" err=\"%s\"", rep->str);
}

static void record_retire(wk_ctx *ctx, const char *id, const char *state, int only_live)
{
    if (sf_records_retire(ctx->redis, id, state, only_live, wk_redis_logged, NULL) < 0)
        sf_warn("msg=\"cannot update the record; Redis is down\" sandbox=%s state=%s", id, state);
}

/* A job answered without being run: a create that never ran leaves no record behind. */
static void refuse(wk_call *c, const char *code, const char *message)
{
    if (!strcmp(c->job.tool, "sandbox_create"))
        record_retire(c->ctx, c->job.sandbox, "failed", 0);
    reply_error(c, code, message);
}

static void not_here(wk_call *c)
{
    char text[256];
    snprintf(text, sizeof(text),
             "Sandbox '%s' is no longer running on its host (it was lost); create a new one "
             "with sandbox_create.", c->job.sandbox);
    record_retire(c->ctx, c->job.sandbox, "lost", 1);
    reply_error(c, SF_ERR_NOT_FOUND, text);
}

void wk_box_destroy(wk_box *b, const char *state)
{
    wk_ctx *ctx = b->ctx;

    sf_map_del(ctx->sandboxes, b->id);
    if (b->ev_timeout)
        event_free(b->ev_timeout);
    wk_sandbox_kill(b->sb);
    record_retire(ctx, b->id, state, 0);
    sf_info("msg=\"sandbox gone\" sandbox=%s state=%s", b->id, state);
    json_decref(b->env);
    free(b);
}

static void on_lifetime_over(evutil_socket_t fd, short what, void *arg)
{
    wk_box *b = arg;
    sf_info("msg=\"sandbox timeout reached\" sandbox=%s", b->id);
    wk_box_destroy(b, "killed");
}

static void do_create(wk_call *c)
{
    wk_ctx *ctx = c->ctx;
    json_t *a = c->job.args, *env = json_object_get(a, "env_vars");
    const char *name = json_string_value(json_object_get(a, "name"));
    json_int_t timeout_s = json_integer_value(json_object_get(a, "timeout_seconds"));
    const char *why = NULL;
    wk_box *b;
    char key[128], mem[24], pids[24];
    uint64_t t0 = sf_mono_us();
    int rc;

    if ((b = sf_map_get(ctx->sandboxes, c->job.sandbox))) { /* redelivered: it exists already */
        if (strcmp(b->team, c->job.team) != 0) {
            reply_error(c, SF_ERR_INVALID, "A sandbox with that id exists; let the platform "
                                           "choose the id of a new sandbox.");
            return;
        }
        reply_result(c, json_pack("{s:s, s:s, s:s}", "id", c->job.sandbox, "name", name ? name : "",
                                  "status", "active"));
        return;
    }
    if ((int64_t)sf_map_len(ctx->sandboxes) >= ctx->cfg.capacity) {
        record_retire(ctx, c->job.sandbox, "failed", 0);
        reply_error(c, SF_ERR_UNAVAILABLE,
                    "The chosen host is at capacity; retry sandbox_create in a few seconds.");
        return;
    }
    if (!(b = calloc(1, sizeof(*b)))) {
        reply_error(c, SF_ERR_INTERNAL, "The host is out of memory; retry later.");
        return;
    }
    b->ctx = ctx;
    snprintf(b->id, sizeof(b->id), "%s", c->job.sandbox);
    snprintf(b->team, sizeof(b->team), "%s", c->job.team);
    b->env = json_is_object(env) ? json_incref(env) : NULL;
    rc = wk_jail_create(ctx->d.base, &ctx->jail, b->id, &b->sb, &why);
    if (rc < 0) {
        char text[512];
        sf_error("msg=\"sandbox create failed\" sandbox=%s rc=%d why=\"%s\"", b->id, rc,
                 why ? why : "");
        snprintf(text, sizeof(text), "The sandbox could not be started (%s); retry "
                 "sandbox_create, and tell the operator if it keeps failing.",
                 why ? why : "driver error");
        json_decref(b->env);
        free(b);
        record_retire(ctx, c->job.sandbox, "failed", 0);
        reply_error(c, SF_ERR_INTERNAL, text);
        return;
    }
    sf_map_put(ctx->sandboxes, b->id, b);
    if (timeout_s > 0) {
        struct timeval tv = {(time_t)timeout_s, 0};
        b->ev_timeout = evtimer_new(ctx->d.base, on_lifetime_over, b);
        evtimer_add(b->ev_timeout, &tv);
    }
    snprintf(key, sizeof(key), SF_RK_SANDBOX, b->id);
    snprintf(mem, sizeof(mem), "%lld", (long long)ctx->cfg.memory_mib);
    snprintf(pids, sizeof(pids), "%lld", (long long)ctx->cfg.pids_max);
    sf_redis_cmd(ctx->redis, wk_redis_logged, NULL,
                 "HSET %s state running driver %s memory_mib %s pids_max %s", key,
                 ctx->cfg.driver, mem, pids);
    /* In its sets again, in case start-up reconciliation ran between placement and now. */
    sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "SADD " SF_RK_TEAM_SANDBOXES " %s", b->team,
                 b->id);
    sf_redis_cmd(ctx->redis, wk_redis_logged, NULL, "SADD " SF_RK_HOST_SANDBOXES " %s",
                 ctx->host_id, b->id);
    sf_info("msg=\"sandbox created\" sandbox=%s team=%s job=%s us=%llu", b->id, b->team,
            c->job.id, (unsigned long long)(sf_mono_us() - t0));
    reply_result(c, json_pack("{s:s, s:s, s:s}", "id", b->id, "name", name ? name : "", "status",
                              "active"));
}

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

static void on_exec_done(void *arg, const wk_exec_result *res)
{
    wk_call *c = arg;
    json_t *r;
    char key[128], now[24];

    if (res->error) {
        reply_error(c, SF_ERR_UNAVAILABLE, res->error);
        return;
    }
    r = json_object();
    json_object_set_new(r, "stdout", stream_text(res->out, res->out_len, res->out_total));
    json_object_set_new(r, "stderr", stream_text(res->err, res->err_len, res->err_total));
    json_object_set_new(r, "exit_code", json_integer(res->exit_code));
    json_object_set_new(r, "truncated", json_boolean(res->truncated));
    json_object_set_new(r, "stdout_bytes", json_integer((json_int_t)res->out_total));
    json_object_set_new(r, "stderr_bytes", json_integer((json_int_t)res->err_total));
    json_object_set_new(r, "timed_out", json_boolean(res->timed_out));
    json_object_set_new(r, "duration_ms", json_integer(res->duration_ms));
    snprintf(key, sizeof(key), SF_RK_SANDBOX, c->job.sandbox);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    sf_redis_cmd(c->ctx->redis, wk_redis_logged, NULL, "HSET %s last_active %s", key, now);
    sf_debug("msg=\"exec done\" job=%s sandbox=%s exit=%d ms=%u", c->job.id, c->job.sandbox,
             res->exit_code, res->duration_ms);
    reply_result(c, r);
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

static void do_exec(wk_call *c, wk_box *b)
{
    json_t *a = c->job.args;
    const char *env[EXEC_ENV_MAX + 1];
    char *store[EXEC_ENV_MAX];
    size_t n = 0;
    int64_t timeout = sf_exec_timeout_ms(a);
    int64_t left = c->job.deadline_ms - sf_now_ms() - 200; /* the caller stops waiting then */
    wk_exec_req req = {0};
    int rc;

    if (timeout > left)
        timeout = left > 1 ? left : 1;
    if ((b->env && env_add(b->env, env, &n, store) < 0) ||
        (json_is_object(json_object_get(a, "env")) &&
         env_add(json_object_get(a, "env"), env, &n, store) < 0)) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        reply_error(c, SF_ERR_INVALID, "Too many environment variables; pass at most 256.");
        return;
    }
    env[n] = NULL;
    req.command = json_string_value(json_object_get(a, "command"));
    req.cwd = json_string_value(json_object_get(a, "cwd"));
    req.env = env;
    req.timeout_ms = (uint32_t)timeout;
    req.cap_bytes = EXEC_CAP_BYTES;
    if (!req.command) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        reply_error(c, SF_ERR_INVALID, "Argument 'command' is required.");
        return;
    }
    rc = wk_sandbox_exec(b->sb, &req, on_exec_done, c);
    for (size_t i = 0; i < n; i++)
        free(store[i]);
    if (rc == -EBUSY)
        reply_error(c, SF_ERR_LIMIT, "64 commands are already running in this sandbox; wait for "
                                     "some to finish, then retry.");
    else if (rc == -E2BIG)
        reply_error(c, SF_ERR_INVALID, "The command and its environment are too large (the limit "
                                       "is 1 MiB); write a script with a file and run that.");
    else if (rc == -EINVAL)
        reply_error(c, SF_ERR_INVALID, "The command, cwd or environment could not be sent (too "
                                       "long, or containing NUL bytes); shorten them.");
    else if (rc == -ESRCH)
        reply_error(c, SF_ERR_NOT_FOUND, "The sandbox is being killed; create a new one with "
                                         "sandbox_create.");
    else if (rc < 0)
        reply_error(c, SF_ERR_UNAVAILABLE,
                    "The sandbox did not accept the command; retry, or create a new sandbox.");
}

static void dispatch(wk_call *c)
{
    wk_ctx *ctx = c->ctx;
    wk_box *b;

    if (!strcmp(c->job.tool, "sandbox_create")) {
        do_create(c);
        return;
    }
    b = sf_map_get(ctx->sandboxes, c->job.sandbox);
    if (b && strcmp(b->team, c->job.team) != 0) { /* the scheduler checked: never happens */
        char text[256];
        sf_warn("msg=\"job for another team's sandbox refused\" job=%s sandbox=%s team=%s",
                c->job.id, c->job.sandbox, c->job.team);
        reply_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), c->job.sandbox));
        return;
    }
    if (!strcmp(c->job.tool, "sandbox_kill")) {
        if (b)
            wk_box_destroy(b, "killed");
        else
            record_retire(ctx, c->job.sandbox, "killed", 0);
        reply_result(c, json_pack("{s:s, s:s}", "id", c->job.sandbox, "status", "killed"));
        return;
    }
    if (!b) {
        not_here(c);
        return;
    }
    if (!strcmp(c->job.tool, "sandbox_exec")) {
        do_exec(c, b);
        return;
    }
    {
        char text[256];
        snprintf(text, sizeof(text), "Tool '%.64s' is not available on this host yet.",
                 c->job.tool);
        reply_error(c, SF_ERR_INVALID, text);
    }
}

static void on_guard(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_call *c = priv;

    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        refuse(c, SF_ERR_UNAVAILABLE,
               "The platform's state store is unreachable; retry in a few seconds.");
        return;
    }
    if (rep->type == REDIS_REPLY_NIL) { /* seen before: answered already */
        sf_info("msg=\"duplicate job skipped\" job=%s", c->job.id);
        call_done(c);
        return;
    }
    dispatch(c);
}

void wk_on_bad(void *arg, const rd_kafka_message_t *msg, const char *why)
{
    sf_warn("msg=\"message rejected\" offset=%lld why=\"%s\"", (long long)msg->offset, why);
}

void wk_on_job(void *arg, sf_job *job, sf_kafka_ticket tk)
{
    wk_ctx *ctx = arg;
    wk_call *c = calloc(1, sizeof(*c));
    char key[128];

    if (!c) {
        sf_job_fini(job);
        sf_jobq_done(ctx->jobq, tk);
        return;
    }
    c->ctx = ctx;
    c->ticket = tk;
    c->job = *job;
    if (ctx->stopping) {
        refuse(c, SF_ERR_UNAVAILABLE, "This host is shutting down; retry in a few seconds.");
        return;
    }
    if (c->job.deadline_ms < sf_now_ms()) {
        sf_info("msg=\"job expired in the queue\" job=%s tool=%s", c->job.id, c->job.tool);
        refuse(c, SF_ERR_TIMEOUT, "The call waited in the queue past its deadline; retry it.");
        return;
    }
    snprintf(key, sizeof(key), SF_RK_JOB, c->job.id);
    if (sf_redis_cmd(ctx->redis, on_guard, c, "SET %s %s NX EX 3600", key, ctx->host_id) < 0)
        refuse(c, SF_ERR_UNAVAILABLE,
               "The platform's state store is unreachable; retry in a few seconds.");
}
