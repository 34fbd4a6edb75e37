/* hosted.c: a hosted MCP server's session on this host (issue 24; the gateway's half is
 * gateway/hosted.c). The session's sandbox was made by sandbox_create; then:
 *
 *   sf.hosted_start  {sandbox_id, run, cwd?, idle_s?}  starts the server as a duplex exec
 *                    (driver.h `pipe`): its stdin takes our lines, its stdout lines come to
 *                    us as the agent reads them, its stderr is kept as the session's log
 *   sf.hosted_send   {sandbox_id, message, id?, token?, idle_s?} writes one JSON-RPC
 *                    message (a line); with `id` (the request's id, JSON text) the call is
 *                    answered with the server's response to it {message}; messages the
 *                    server sends meanwhile go out as progress chunks {mcp: line}; idle_s
 *                    sets a new idle timeout (a warm pool's server, started with a long one,
 *                    gets its session's at initialize)
 *   sf.hosted_listen {sandbox_id, wait_ms?}             the GET stream's half: what the
 *                    server sends that belongs to no request, as progress chunks, until
 *                    wait_ms passed (answered {})
 *
 * Server-to-client messages go to the request whose progressToken they name, else to the
 * oldest request waiting, else to the listener, else they wait (at most QUEUE_MAX).
 * A server that exits answers every waiting call (and every later one) with an error that
 * says so and carries the last lines of its stderr. A session idle for idle_s (no send, no
 * listen) is ended: its sandbox is killed. */
#include "worker.h"
#include "egress.h"
#include "sf_jobio.h"
#include "sf_log.h"
#include "sf_msg.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES (4u << 20)  /* one JSON-RPC message from the server */
#define OVER_KEEP 256              /* bytes kept of each end of a longer one */
#define ERRTAIL_MAX (16u * 1024)   /* the last stderr bytes kept (the crash's log lines) */
#define QUEUE_MAX 256              /* unrouted server messages held for the listener */
#define WAITS_MAX 256              /* requests waiting for their response, per session */
#define ENV_MAX 256
#define IDLE_DEFAULT_S 1800

typedef struct hwait {
    struct hwait *next;
    struct hsess *hs;
    wk_call *c;
    char id[260];                  /* the request's id as JSON text */
    char token[260];               /* its progressToken as JSON text, "" if none */
    struct event *timer;           /* its deadline */
} hwait;

typedef struct hsess {
    wk_ctx *ctx;
    char sandbox[SF_ID_MAX];
    int started;                   /* the exec runs */
    int ended;                     /* the exec answered: the server is gone */
    char *why_ended;               /* ...the sentence every later call gets */
    sf_buf line;                   /* stdout bytes of the line being read */
    int line_over;                 /* the current line is over LINE_MAX_BYTES: dropped */
    char over_head[OVER_KEEP + 1];  /* ...but its first and last bytes are kept, to find */
    char over_tail[OVER_KEEP + 1];  /* the request it answers ("id" comes first or last) */
    char errtail[ERRTAIL_MAX];
    size_t errlen;
    hwait *waits;                  /* oldest first */
    int nwaits;
    wk_call *listener;
    struct event *listen_timer;
    json_t *queue;                 /* array of lines (strings) */
    int64_t idle_ms, last_ms;
    struct event *idle;
} hsess;

static sf_map *sessions; /* sandbox id -> hsess */

static hsess *hs_get(const char *sandbox)
{
    return sessions ? sf_map_get(sessions, sandbox) : NULL;
}

static void wait_free(hwait *w)
{
    if (w->timer)
        event_free(w->timer);
    free(w);
}

static void wait_unlink(hsess *hs, hwait *w)
{
    for (hwait **p = &hs->waits; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            hs->nwaits--;
            return;
        }
}

static void listener_end(hsess *hs)
{
    wk_call *c = hs->listener;

    hs->listener = NULL;
    if (hs->listen_timer)
        evtimer_del(hs->listen_timer);
    if (c)
        wk_reply_result(c, json_object());
}

static void progress(wk_call *c, const char *line)
{
    json_t *chunk;

    if (!c->job.progress)
        return;
    chunk = json_pack("{s:s}", "mcp", line);
    if (chunk && sf_jobio_progress(c->ctx->producer, &c->job, chunk) < 0)
        sf_debug("msg=\"cannot produce a progress reply\" job=%s", c->job.id);
    json_decref(chunk);
}

/* The last stderr lines (at most 4 KiB, whole lines), for the crash's sentence. */
static void errtail_copy(const hsess *hs, char *out, size_t n)
{
    size_t len = hs->errlen, start = len > 4096 ? len - 4096 : 0;
    const char *p = hs->errtail + start;
    char *nl;

    if (start && (nl = memchr(p, '\n', len - start)))
        p = nl + 1;
    snprintf(out, n, "%.*s", (int)(hs->errtail + len - p), p);
}

static void hs_free(hsess *hs)
{
    hwait *w;

    while ((w = hs->waits)) {
        hs->waits = w->next;
        wait_free(w);
    }
    if (hs->listen_timer)
        event_free(hs->listen_timer);
    if (hs->idle)
        event_free(hs->idle);
    sf_buf_fini(&hs->line);
    json_decref(hs->queue);
    free(hs->why_ended);
    free(hs);
}

/* Every waiting call and the listener get code/text (the server is gone). */
static void fail_all(hsess *hs, const char *code, const char *text)
{
    hwait *w;

    while ((w = hs->waits)) {
        hs->waits = w->next;
        hs->nwaits--;
        wk_reply_error(w->c, code, text);
        wait_free(w);
    }
    if (hs->listener) {
        wk_call *c = hs->listener;
        hs->listener = NULL;
        wk_reply_error(c, code, text);
    }
}

/* ---- the server's output ----------------------------------------------------------- */

/* One line of the server's stdout: a response goes to its request; anything else to the
 * request it names by progressToken, the oldest request, the listener, or the queue. */
/* The JSON value (a number or a string without escapes) at v as text into out: its
 * length, or 0. */
static size_t id_value(const char *v, char *out, size_t n)
{
    size_t len = *v == '"' ? strcspn(v + 1, "\"\\") + 2 : strspn(v, "-0123456789");

    if (len == 0 || len >= n || (*v == '"' && v[len - 1] != '"'))
        return 0;
    memcpy(out, v, len);
    out[len] = '\0';
    return len;
}

/* The top-level id of an over-long response from the bytes kept of its ends, as JSON text
 * into out: the last member (`,"id":N}`, the TypeScript SDK's order) or the first ones
 * (`{"jsonrpc":"2.0","id":N`, Python's). 0, or -1 when neither end shows it. */
static int over_id(const hsess *hs, char *out, size_t n)
{
    const char *p = NULL, *q, *v;
    size_t len;

    for (q = hs->over_tail; (q = strstr(q, "\"id\":")); q += 5)
        p = q;
    if (p) {
        v = p + 5 + strspn(p + 5, " ");
        if ((len = id_value(v, out, n)) && v[len + strspn(v + len, " ")] == '}' &&
            !v[len + strspn(v + len, " ") + 1 + strspn(v + len + strspn(v + len, " ") + 1, " \r")])
            return 0;
    }
    p = strstr(hs->over_head, "\"id\":");
    if (p && hs->over_head[0] == '{' && p - hs->over_head <= 48 &&
        strcspn(hs->over_head + 1, "{[") >= (size_t)(p - hs->over_head - 1) &&
        id_value(p + 5 + strspn(p + 5, " "), out, n))
        return 0;
    return -1;
}

/* A response over LINE_MAX_BYTES was dropped: the request it answers is told so at once. */
static void over_long(hsess *hs)
{
    char key[260];

    if (over_id(hs, key, sizeof(key)) < 0)
        return;
    for (hwait *w = hs->waits; w; w = w->next)
        if (!strcmp(w->id, key)) {
            wait_unlink(hs, w);
            wk_reply_error(w->c, SF_ERR_LIMIT, "The hosted MCP server's answer is over 4 MiB, "
                                               "the most one message may be; ask it for less "
                                               "(a page, a file or a URL).");
            wait_free(w);
            return;
        }
}

static void on_line(hsess *hs, const char *text, size_t len)
{
    json_error_t jerr;
    json_t *m = json_loadb(text, len, JSON_DECODE_ANY, &jerr);
    json_t *id, *params;
    hwait *to = NULL;
    char *key = NULL;

    if (!json_is_object(m)) { /* not JSON-RPC: a server that prints to stdout; its log */
        json_decref(m);
        return;
    }
    id = json_object_get(m, "id");
    if (id && !json_object_get(m, "method") &&
        (json_object_get(m, "result") || json_object_get(m, "error"))) {
        key = json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY);
        for (hwait *w = hs->waits; key && w; w = w->next)
            if (!strcmp(w->id, key)) {
                wait_unlink(hs, w);
                wk_touch(hs->ctx, hs->sandbox);
                wk_reply_result(w->c, json_pack("{s:s%}", "message", text, len));
                wait_free(w);
                break;
            }
        free(key);
        json_decref(m);
        return; /* a response to nothing waiting: its request was abandoned */
    }
    params = json_object_get(m, "params");
    if (json_is_object(params) && json_object_get(params, "progressToken")) {
        key = json_dumps(json_object_get(params, "progressToken"), JSON_COMPACT | JSON_ENCODE_ANY);
        for (hwait *w = hs->waits; key && w && !to; w = w->next)
            if (w->token[0] && !strcmp(w->token, key))
                to = w;
        free(key);
    }
    for (hwait *w = hs->waits; !to && w; w = w->next)
        if (w->c->job.progress)
            to = w;
    json_decref(m);
    {
        char *line = strndup(text, len);
        if (!line)
            return;
        if (to)
            progress(to->c, line);
        else if (hs->listener && hs->listener->job.progress)
            progress(hs->listener, line);
        else {
            if (json_array_size(hs->queue) >= QUEUE_MAX) {
                sf_warn("msg=\"hosted server message dropped: nobody listens\" sandbox=%s",
                        hs->sandbox);
                json_array_remove(hs->queue, 0);
            }
            json_array_append_new(hs->queue, json_string_nocheck(line));
        }
        free(line);
    }
}

static void on_output(void *arg, int stream, const char *data, size_t len)
{
    hsess *hs = arg;

    if (stream == 1) { /* stderr: the log's tail */
        if (len >= ERRTAIL_MAX) {
            memcpy(hs->errtail, data + len - ERRTAIL_MAX, ERRTAIL_MAX);
            hs->errlen = ERRTAIL_MAX;
        } else {
            if (hs->errlen + len > ERRTAIL_MAX) {
                size_t drop = hs->errlen + len - ERRTAIL_MAX;
                memmove(hs->errtail, hs->errtail + drop, hs->errlen - drop);
                hs->errlen -= drop;
            }
            memcpy(hs->errtail + hs->errlen, data, len);
            hs->errlen += len;
        }
        return;
    }
    while (len) {
        const char *nl = memchr(data, '\n', len);
        size_t n = nl ? (size_t)(nl - data) : len;

        if (!hs->line_over && sf_buf_append(&hs->line, data, n) < 0) {
            sf_warn("msg=\"hosted server message over 4 MiB dropped\" sandbox=%s", hs->sandbox);
            hs->line_over = 1;
            if (hs->line.len) /* the line's first bytes (or this piece's, if it is the first) */
                snprintf(hs->over_head, sizeof(hs->over_head), "%.*s",
                         (int)(hs->line.len < OVER_KEEP ? hs->line.len : OVER_KEEP), hs->line.p);
            else
                snprintf(hs->over_head, sizeof(hs->over_head), "%.*s",
                         (int)(n < OVER_KEEP ? n : OVER_KEEP), data);
            hs->over_tail[0] = '\0';
            sf_buf_reset(&hs->line);
        }
        if (hs->line_over) { /* the last OVER_KEEP bytes so far */
            size_t have = strlen(hs->over_tail), add = n < OVER_KEEP ? n : OVER_KEEP;
            size_t keep = have + add > OVER_KEEP ? OVER_KEEP - add : have;
            memmove(hs->over_tail, hs->over_tail + have - keep, keep);
            memcpy(hs->over_tail + keep, data + n - add, add);
            hs->over_tail[keep + add] = '\0';
        }
        if (!nl)
            return;
        if (hs->line_over)
            over_long(hs);
        else if (hs->line.len)
            on_line(hs, hs->line.p, hs->line.len);
        sf_buf_reset(&hs->line);
        hs->line_over = 0;
        data = nl + 1;
        len -= n + 1;
    }
}

static void on_server_exit(void *arg, const wk_exec_result *res)
{
    hsess *hs = arg;
    char tail[4200], text[4600];

    hs->ended = 1;
    if (res->error) { /* killed (DELETE, idle, the sandbox's end) or the agent is gone */
        sf_map_del(sessions, hs->sandbox);
        fail_all(hs, SF_ERR_NOT_FOUND, "The hosted MCP server's session ended (its sandbox "
                                       "was removed); send initialize again for a new one.");
        hs_free(hs);
        return;
    }
    errtail_copy(hs, tail, sizeof(tail));
    snprintf(text, sizeof(text),
             "The hosted MCP server exited (status %d) before it answered; see `sandfleet "
             "servers logs` for its output, fix it and initialize a new session. Its last "
             "log lines:\n%s", res->exit_code, tail);
    free(hs->why_ended);
    hs->why_ended = strdup(text);
    sf_info("msg=\"hosted server exited\" sandbox=%s status=%d", hs->sandbox, res->exit_code);
    fail_all(hs, SF_ERR_UNAVAILABLE, text);
}

/* ---- idle ------------------------------------------------------------------------- */

static void on_idle(evutil_socket_t fd, short what, void *arg)
{
    hsess *hs = arg;
    int64_t now = sf_mono_ms(), left = hs->last_ms + hs->idle_ms - now;
    wk_box *b;

    (void)fd, (void)what;
    if (left > 0 || hs->nwaits) { /* an open GET stream is no activity */
        struct timeval tv = {(left > 0 ? left : hs->idle_ms) / 1000,
                             ((left > 0 ? left : hs->idle_ms) % 1000) * 1000};
        evtimer_add(hs->idle, &tv);
        return;
    }
    sf_info("msg=\"hosted session idle: its sandbox is killed\" sandbox=%s idle_s=%lld",
            hs->sandbox, (long long)(hs->idle_ms / 1000));
    if ((b = sf_map_get(hs->ctx->sandboxes, hs->sandbox)) && b->state == WK_BOX_RUNNING) {
        wk_box_kill(b, "killed"); /* its exec answers (on_server_exit frees hs) */
        return;
    }
    if (!hs->ended) /* the box went another way; its kill answers the exec */
        return;
    sf_map_del(sessions, hs->sandbox);
    hs_free(hs);
}

static void touch(hsess *hs)
{
    hs->last_ms = sf_mono_ms();
}

/* ---- the calls -------------------------------------------------------------------- */

static int env_add(json_t *obj, const char **env, size_t *n, char **store)
{
    const char *k;
    json_t *v;

    json_object_foreach(obj, k, v) {
        char *kv;
        if (!json_is_string(v))
            continue;
        if (*n >= ENV_MAX || asprintf(&kv, "%s=%s", k, json_string_value(v)) < 0)
            return -1;
        store[*n] = kv;
        env[(*n)++] = kv;
    }
    return 0;
}

static void do_start(wk_call *c, wk_box *b)
{
    json_t *a = c->job.args, *all = json_object();
    const char *env[ENV_MAX + 1];
    char *store[ENV_MAX];
    size_t n = 0;
    json_int_t idle = json_integer_value(json_object_get(a, "idle_s"));
    wk_exec_req req = {0};
    hsess *hs;
    int rc;

    if (hs_get(b->id)) {
        json_decref(all);
        wk_reply_error(c, SF_ERR_INVALID, "This sandbox runs a hosted MCP server already.");
        return;
    }
    if (!c->ctx->ops->exec_input) {
        json_decref(all);
        wk_reply_error(c, SF_ERR_UNAVAILABLE, "This host's driver cannot run hosted MCP "
                                              "servers yet; upgrade its worker.");
        return;
    }
    if (!sessions && !(sessions = sf_map_new(65536))) {
        json_decref(all);
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    if (b->env)
        json_object_update(all, b->env);
    if (b->eg)
        json_object_update(all, wk_egress_env(b->eg));
    if (!(hs = calloc(1, sizeof(*hs))) || env_add(all, env, &n, store) < 0) {
        for (size_t i = 0; i < n; i++)
            free(store[i]);
        json_decref(all);
        free(hs);
        wk_reply_error(c, SF_ERR_INVALID, SF_MSG_ENV_TOO_MANY);
        return;
    }
    json_decref(all);
    env[n] = NULL;
    hs->ctx = c->ctx;
    snprintf(hs->sandbox, sizeof(hs->sandbox), "%s", b->id);
    sf_buf_init(&hs->line, LINE_MAX_BYTES);
    hs->queue = json_array();
    hs->idle_ms = (idle > 0 ? idle : IDLE_DEFAULT_S) * 1000;
    touch(hs);
    req.command = json_string_value(json_object_get(a, "run"));
    req.cwd = json_string_value(json_object_get(a, "cwd"));
    req.env = env;
    req.cap_bytes = 4096;
    req.on_output = on_output;
    req.pipe = 1;
    rc = c->ctx->ops->exec(b->sb, &req, on_server_exit, hs);
    for (size_t i = 0; i < n; i++)
        free(store[i]);
    if (rc < 0 || !(hs->idle = evtimer_new(c->ctx->d.base, on_idle, hs)) ||
        sf_map_put(sessions, hs->sandbox, hs) < 0) {
        if (rc == 0) /* it runs: ending the sandbox ends it */
            sf_warn("msg=\"hosted session bookkeeping failed\" sandbox=%s", hs->sandbox);
        wk_reply_error(c, rc == -EBUSY ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE,
                       "The hosted MCP server could not be started in its sandbox; retry.");
        if (rc < 0)
            hs_free(hs);
        return;
    }
    {
        struct timeval tv = {hs->idle_ms / 1000, (hs->idle_ms % 1000) * 1000};
        evtimer_add(hs->idle, &tv);
    }
    hs->started = 1;
    sf_info("msg=\"hosted server started\" sandbox=%s job=%s", hs->sandbox, c->job.id);
    wk_reply_result(c, json_pack("{s:b}", "started", 1));
}

static void on_wait_deadline(evutil_socket_t fd, short what, void *arg)
{
    hwait *w = arg;
    hsess *hs = w->hs;

    (void)fd, (void)what;
    wait_unlink(hs, w);
    wk_reply_error(w->c, SF_ERR_TIMEOUT, "The hosted MCP server did not answer in time; "
                                         "retry, or check `sandfleet servers logs`.");
    wait_free(w);
}

/* The session of b's server, or NULL (c answered). activity: c counts as the client's use
 * (a message does; the GET stream's listen does not, or an open stream would keep an idle
 * session forever). */
static hsess *live_session(wk_call *c, wk_box *b, int activity)
{
    hsess *hs = hs_get(b->id);

    if (!hs) {
        wk_reply_error(c, SF_ERR_NOT_FOUND, "No hosted MCP server runs in this session's "
                                            "sandbox; send initialize again for a new "
                                            "session.");
        return NULL;
    }
    if (hs->why_ended) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, hs->why_ended);
        return NULL;
    }
    if (activity) {
        touch(hs);
        wk_touch(c->ctx, b->id);
    }
    return hs;
}

static void do_send(wk_call *c, wk_box *b)
{
    json_t *a = c->job.args;
    const char *msg = json_string_value(json_object_get(a, "message"));
    const char *id = json_string_value(json_object_get(a, "id"));
    const char *token = json_string_value(json_object_get(a, "token"));
    size_t len = json_string_length(json_object_get(a, "message"));
    json_int_t idle = json_integer_value(json_object_get(a, "idle_s"));
    hsess *hs = live_session(c, b, 1);
    hwait *w = NULL;
    char *line;
    int rc;

    if (!hs)
        return;
    if (idle > 0 && hs->idle) { /* from now on */
        struct timeval tv = {(time_t)idle, 0};
        hs->idle_ms = idle * 1000;
        evtimer_del(hs->idle);
        evtimer_add(hs->idle, &tv);
    }
    if (!msg || memchr(msg, '\n', len)) {
        wk_reply_error(c, SF_ERR_INVALID, "A message to a hosted server is one line of JSON.");
        return;
    }
    if (id) {
        if (hs->nwaits >= WAITS_MAX) {
            wk_reply_error(c, SF_ERR_LIMIT, "256 requests already wait for this hosted MCP "
                                            "server; wait for some answers, then retry.");
            return;
        }
        for (hwait *x = hs->waits; x; x = x->next)
            if (!strcmp(x->id, id)) {
                wk_reply_error(c, SF_ERR_INVALID, "A request with this id is already "
                                                  "waiting in this session; use a new id.");
                return;
            }
        if (!(w = calloc(1, sizeof(*w))) ||
            !(w->timer = evtimer_new(c->ctx->d.base, on_wait_deadline, w))) {
            free(w);
            wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
            return;
        }
        w->hs = hs;
        w->c = c;
        snprintf(w->id, sizeof(w->id), "%s", id);
        snprintf(w->token, sizeof(w->token), "%s", token ? token : "");
    }
    if (!(line = malloc(len + 1))) {
        if (w)
            wait_free(w);
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    memcpy(line, msg, len);
    line[len] = '\n';
    rc = c->ctx->ops->exec_input(b->sb, hs, line, len + 1, 0);
    free(line);
    if (rc < 0) {
        if (w)
            wait_free(w);
        wk_reply_error(c, rc == -EAGAIN ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE,
                       rc == -EAGAIN ? "The hosted MCP server is not reading its input; retry "
                                       "once it answered what it has."
                                     : "The hosted MCP server is not running; send "
                                       "initialize again for a new session.");
        return;
    }
    if (!w) {
        wk_reply_result(c, json_pack("{s:b}", "sent", 1));
        return;
    }
    {
        hwait **p = &hs->waits;
        int64_t left = c->job.deadline_ms - sf_now_ms() - 200;
        struct timeval tv;

        if (left < 1)
            left = 1;
        tv.tv_sec = left / 1000;
        tv.tv_usec = (left % 1000) * 1000;
        evtimer_add(w->timer, &tv);
        while (*p)
            p = &(*p)->next;
        *p = w;
        hs->nwaits++;
    }
    /* what waited for someone to hear it */
    if (c->job.progress)
        while (json_array_size(hs->queue)) {
            progress(c, json_string_value(json_array_get(hs->queue, 0)));
            json_array_remove(hs->queue, 0);
        }
}

static void on_listen_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    listener_end(arg);
}

static void do_listen(wk_call *c, wk_box *b)
{
    hsess *hs = live_session(c, b, 0);
    int64_t left;
    struct timeval tv;

    if (!hs)
        return;
    listener_end(hs); /* one GET stream per session: a newer one replaces it */
    if (!hs->listen_timer && !(hs->listen_timer = evtimer_new(c->ctx->d.base, on_listen_timer, hs))) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    hs->listener = c;
    while (c->job.progress && json_array_size(hs->queue)) {
        progress(c, json_string_value(json_array_get(hs->queue, 0)));
        json_array_remove(hs->queue, 0);
    }
    left = c->job.deadline_ms - sf_now_ms() - 1000;
    if (left < 1)
        left = 1;
    tv.tv_sec = left / 1000;
    tv.tv_usec = (left % 1000) * 1000;
    evtimer_add(hs->listen_timer, &tv);
}

WK_HANDLERS({SF_TOOL_HOSTED_START, do_start}, {SF_TOOL_HOSTED_SEND, do_send},
            {SF_TOOL_HOSTED_LISTEN, do_listen});
