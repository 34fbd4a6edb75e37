/* hosted.c: hosted MCP servers (issue 24). A team registers a server (`sandfleet servers
 * add`, through /v1/servers below); a client then speaks MCP to it at POST /mcp?name=NAME
 * (or /mcp/NAME) with the team's credentials. Each MCP session is one sandbox made from the
 * server's snapshot; the server runs in it over stdio, bridged by the worker
 * (worker/hosted.c) through the gateway's own jobs sf.hosted_start / _send / _listen.
 *
 *   initialize          sandbox_create (from_snapshot, the entry's egress and secrets),
 *                       sf.hosted_start, then the initialize itself through sf.hosted_send:
 *                       the server's own answer, with our Mcp-Session-Id
 *   a request           sf.hosted_send with its id: the response; what the server sends
 *                       meanwhile goes out first on the same SSE stream (client accepting it)
 *   a notification or
 *   a response          sf.hosted_send without id: 202
 *   GET                 an SSE stream fed by sf.hosted_listen, one after the other
 *   DELETE              sandbox_kill: 204
 *
 * Sessions live in Redis (sf_hosted.h): any gateway serves any session. Unknown or expired
 * session: 404 (the client initializes again); unknown server: 404 with a JSON-RPC error. */
#include "gateway.h"
#include "oauth.h"
#include "sf_oauth.h"
#include "sf_hosted.h"
#include "sf_log.h"
#include "sf_msg.h"
#include "sf_store.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 63
#define SERVER_BODY_MAX (64 * 1024)
#define NAME_RULE "Server names are 1-63 of a-z, 0-9, '-' and '_'."
#define NOT_REGISTERED                                                                         \
    "No server of that name is registered for your team; `sandfleet servers list` shows them."
#define TEST_URL_MAX 1024
#define TEST_ENTRY_MAX 255
#define TEST_FETCH_MS 300000 /* test mode: clone and install */
#define TEST_TEMPLATE "debian"

typedef struct hreq {
    gw_ctx *ctx;
    gw_req *req;              /* NULL once the client left */
    int busy;                 /* a Redis answer is awaited: it frees h when req is gone */
    gw_pending *pending;
    char team[SF_ID_MAX];
    char name[NAME_MAX_LEN + 1];
    char kname[NAME_MAX_LEN + 8]; /* its name in the session keys: NAME, or test.NAME */
    char sid[SF_ID_MAX];
    char sandbox[SF_ID_MAX];
    int test;                 /* test mode: repo_url and entrypoint, no registry entry */
    int warm;                 /* h->sandbox came from the warm pool */
    char repo[TEST_URL_MAX + 1];
    char entrypoint[TEST_ENTRY_MAX + 1];
    json_t *entry;            /* the server's registry hash as an object */
    json_t *msg;              /* the client's message */
    json_t *id;               /* its id (borrowed from msg), NULL for a notification */
    int sse_ok, streaming;
    int listen;               /* a GET stream */
    int64_t idle_s;
    char *answer;             /* the server's initialize answer, until Redis holds the session */
} hreq;

/* ---- answers ------------------------------------------------------------------------ */

static void h_free(hreq *h)
{
    if (h->pending)
        gw_jobs_cancel(h->ctx, h->pending);
    json_decref(h->entry);
    json_decref(h->msg);
    free(h->answer);
    free(h);
}

static void h_respond(hreq *h, int status, const char *const *headers, const char *ctype,
                      const char *body)
{
    if (!h->req)
        return;
    gw_req_set_abort_cb(h->req, NULL, NULL);
    if (h->streaming) {
        gw_req_stream_end(h->req);
    } else {
        gw_req_respond(h->req, status, ctype, headers, body, body ? strlen(body) : 0);
    }
    h->req = NULL;
}

/* A JSON-RPC error for the client's message (HTTP status http). */
static void h_error(hreq *h, int http, int code, const char *message)
{
    json_t *e = json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                          h->id ? h->id : json_null(), "error", "code", code, "message", message);
    char *text = e ? json_dumps(e, JSON_COMPACT) : NULL;

    if (h->streaming && h->req && text) {
        char *ev = NULL;
        if (asprintf(&ev, "event: message\ndata: %s\n\n", text) > 0)
            gw_req_stream_write(h->req, ev, strlen(ev));
        free(ev);
    }
    h_respond(h, http, NULL, "application/json", text ? text : "{}");
    free(text);
    json_decref(e);
}

static void sse_event(hreq *h, const char *line)
{
    char *ev = NULL;

    if (!h->req || !h->streaming)
        return;
    if (asprintf(&ev, "event: message\ndata: %s\n\n", line) > 0 &&
        gw_req_stream_write(h->req, ev, strlen(ev)) == -ENOBUFS) {
        sf_warn("msg=\"client reads the hosted stream too slowly; ending it\" server=%s",
                h->name);
        gw_req_set_abort_cb(h->req, NULL, NULL);
        gw_req_stream_end(h->req);
        h->req = NULL;
    }
    free(ev);
}

static int sse_begin(hreq *h, const char *const *headers)
{
    if (h->streaming)
        return 0;
    if (!h->req || !h->sse_ok || gw_req_stream_begin(h->req, 200, "text/event-stream", headers) < 0)
        return -1;
    h->streaming = 1;
    return 0;
}

static void on_abort(gw_req *req, void *arg)
{
    hreq *h = arg;

    (void)req;
    h->req = NULL;
    if (h->busy)
        return; /* the Redis callback frees it */
    h_free(h);
}

static const char *entry_str(const hreq *h, const char *k)
{
    return json_string_value(json_object_get(h->entry, k));
}

/* ---- jobs ------------------------------------------------------------------------- */

/* Publishes the gateway's job `tool` for this session (args stolen; sandbox "" = a new
 * one, then h->sandbox gets its id). 0, or answered (-1). */
static int h_submit(hreq *h, const char *tool, json_t *args, int progress, gw_job_cb cb,
                    gw_progress_cb pcb)
{
    gw_ctx *ctx = h->ctx;
    const sf_tool *t = sf_toolset_find(&ctx->tools, tool);
    sf_job job;
    int rc;

    if (!t || !args) {
        json_decref(args);
        h_error(h, 500, -32603, "This gateway lacks a tool it needs; deploy a matching build.");
        return -1;
    }
    if (ctx->kafka_down) {
        json_decref(args);
        h_error(h, 503, -32603, GW_MSG_QUEUE_DOWN);
        return -1;
    }
    sf_job_init(&job);
    snprintf(job.team, sizeof(job.team), "%s", h->team);
    snprintf(job.tool, sizeof(job.tool), "%s", tool);
    snprintf(job.trace, sizeof(job.trace), "%s", h->req ? gw_req_id(h->req) : "");
    if (t->sandbox == SF_SB_NEW) {
        sf_id_new(job.sandbox, "sb_");
        snprintf(h->sandbox, sizeof(h->sandbox), "%s", job.sandbox);
    } else {
        snprintf(job.sandbox, sizeof(job.sandbox), "%s", h->sandbox);
        if (!json_object_get(args, "sandbox_id"))
            json_object_set_new(args, "sandbox_id", json_string(h->sandbox));
    }
    job.args = args;
    job.progress = progress;
    rc = gw_jobs_submit(ctx, &job,
                        sf_tool_wait_ms(t, args, ctx->cfg.call_deadline_ms,
                                        ctx->cfg.exec_deadline_margin_ms) +
                            (t->sandbox == SF_SB_NEW ? ctx->cfg.template_wait_s * 1000 : 0),
                        cb, h, &h->pending);
    if (h->req && rc == 0)
        gw_req_set_job(h->req, job.id);
    sf_job_fini(&job);
    if (rc < 0) {
        h_error(h, 503, -32603, rc == -EDQUOT ? "Your team has too many calls in flight on this "
                                                "gateway; wait for some to finish, then retry."
                                              : GW_MSG_QUEUE_DOWN);
        return -1;
    }
    if (pcb)
        gw_jobs_on_progress(h->pending, pcb);
    return 0;
}

/* ---- sessions in Redis ------------------------------------------------------------ */

static void session_forget(gw_ctx *ctx, const char *team, const char *name, const char *sid)
{
    sf_redis_cmd(ctx->redis, NULL, NULL, "DEL " SF_RK_HSESS, sid);
    sf_redis_cmd(ctx->redis, NULL, NULL, "ZREM " SF_RK_TEAM_HSESS " %s", team, name, sid);
}

static void session_touch(hreq *h)
{
    int64_t until = sf_now_ms() + h->idle_s * 1000;

    sf_redis_cmd(h->ctx->redis, NULL, NULL, "EXPIRE " SF_RK_HSESS " %lld", h->sid,
                 (long long)h->idle_s);
    sf_redis_cmd(h->ctx->redis, NULL, NULL, "ZADD " SF_RK_TEAM_HSESS " XX %lld %s", h->team,
                 h->kname, (long long)until, h->sid);
}

/* A worker's error: the session is gone (404, the client starts again), the server
 * crashed (its log kept for `sandfleet servers logs`), or something else. */
static void job_error(hreq *h, const sf_reply *r, const char *what)
{
    char text[512];

    if (!r) {
        snprintf(text, sizeof(text), "The hosted MCP server '%s' did not answer %s in time; "
                 "retry, or check `sandfleet servers logs %s`.", h->name, what, h->name);
        h_error(h, h->streaming ? 200 : 504, -32603, text);
        return;
    }
    if (!strcmp(r->code, SF_ERR_NOT_FOUND) && h->sid[0]) {
        session_forget(h->ctx, h->team, h->kname, h->sid);
        h_error(h, 404, -32001, r->message ? r->message : "Session not found.");
        return;
    }
    if (!h->test && r->message && strstr(r->message, "hosted MCP server exited")) {
        const char *m = r->message;
        size_t len = strlen(m);
        if (len > SF_HOSTED_LOG_MAX)
            m += len - SF_HOSTED_LOG_MAX;
        sf_redis_cmd(h->ctx->redis, NULL, NULL, "SET " SF_RK_SRV_LOG " %s", h->team, h->name, m);
    }
    h_error(h, h->streaming ? 200 : 502, -32603, r->message ? r->message : "The call failed.");
}

/* ---- a request, a notification ---------------------------------------------------- */

static void on_progress(void *arg, const json_t *chunk)
{
    hreq *h = arg;
    const char *line = json_string_value(json_object_get(chunk, "mcp"));

    if (!line)
        return;
    if (!h->streaming && !h->listen) {
        char hdr[SF_ID_MAX];
        const char *headers[] = {"Mcp-Session-Id", hdr, NULL};
        snprintf(hdr, sizeof(hdr), "%s", h->sid);
        if (sse_begin(h, headers) < 0)
            return;
    }
    sse_event(h, line);
}

static void on_sent(void *arg, const sf_reply *r)
{
    hreq *h = arg;
    const char *line;
    char hdr[SF_ID_MAX];
    const char *headers[] = {"Mcp-Session-Id", hdr, NULL};

    h->pending = NULL;
    snprintf(hdr, sizeof(hdr), "%s", h->sid);
    if (!h->req) {
        h_free(h);
        return;
    }
    if (!r || r->kind != SF_REPLY_RESULT) {
        job_error(h, r, "the message");
        h_free(h);
        return;
    }
    if (!h->id) { /* a notification or a response: accepted */
        h_respond(h, 202, headers, NULL, NULL);
        h_free(h);
        return;
    }
    line = json_string_value(json_object_get(r->result, "message"));
    if (!line) {
        h_error(h, 502, -32603, "The hosted MCP server's answer was lost; retry.");
    } else if (h->streaming) {
        sse_event(h, line);
        h_respond(h, 200, NULL, NULL, NULL);
    } else {
        h_respond(h, 200, headers, "application/json", line);
    }
    h_free(h);
}

/* The client's message goes to the session's server. */
static void send_message(hreq *h)
{
    json_t *args, *token = NULL;
    char *text = json_dumps(h->msg, JSON_COMPACT), *idtext = NULL, *tok = NULL;
    json_t *params = json_object_get(h->msg, "params");

    if (json_is_object(params))
        token = json_object_get(json_object_get(params, "_meta"), "progressToken");
    if (h->id)
        idtext = json_dumps(h->id, JSON_COMPACT | JSON_ENCODE_ANY);
    if (token)
        tok = json_dumps(token, JSON_COMPACT | JSON_ENCODE_ANY);
    args = text ? json_pack("{s:s}", "message", text) : NULL;
    if (args && idtext && strlen(idtext) <= 256)
        json_object_set_new(args, "id", json_string(idtext));
    if (args && tok && strlen(tok) <= 256)
        json_object_set_new(args, "token", json_string(tok));
    free(text);
    free(idtext);
    free(tok);
    if (h_submit(h, SF_TOOL_HOSTED_SEND, args, h->id && h->sse_ok, on_sent,
                 h->id && h->sse_ok ? on_progress : NULL) < 0)
        h_free(h);
}

/* ---- initialize ------------------------------------------------------------------- */

static void ignore_reply(void *arg, const sf_reply *r)
{
    (void)arg, (void)r;
}

static void fire(gw_ctx *ctx, const char *team, const char *tool, const char *sandbox,
                 json_t *args);
static void create_sandbox(hreq *h);

/* A failed start: the sandbox goes (nobody will use it); text (if any) to the client, HTTP
 * status http. */
static void start_failed(hreq *h, int http, const char *text)
{
    fire(h->ctx, h->team, "sandbox_kill", h->sandbox, json_object());
    h->sid[0] = '\0';
    if (text)
        h_error(h, http, -32603, text);
}

static void on_init_stored(redisAsyncContext *ac, void *reply, void *priv)
{
    hreq *h = priv;
    redisReply *rep = reply;
    char hdr[SF_ID_MAX];
    const char *headers[] = {"Mcp-Session-Id", hdr, NULL};

    (void)ac;
    h->busy = 0;
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        if (h->req)
            h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
        return;
    }
    sf_info("msg=\"hosted session opened\" server=%s team=%s session=%s sandbox=%s", h->name,
            h->team, h->sid, h->sandbox);
    if (!h->req) {
        h_free(h);
        return;
    }
    snprintf(hdr, sizeof(hdr), "%s", h->sid);
    if (h->streaming) {
        sse_event(h, h->answer);
        h_respond(h, 200, NULL, NULL, NULL);
    } else {
        h_respond(h, 200, headers, "application/json", h->answer);
    }
    h_free(h);
}

static void on_init_answer(void *arg, const sf_reply *r)
{
    hreq *h = arg;
    const char *line;
    int64_t until = sf_now_ms() + h->idle_s * 1000;

    h->pending = NULL;
    if (h->warm && h->req && (!r || r->kind != SF_REPLY_RESULT)) {
        /* the pool's server is gone (it exited while it waited, its sandbox's lifetime ran
         * out, its host died): a fresh sandbox */
        sf_info("msg=\"warm pool: its server did not answer initialize; a new sandbox\" "
                "server=%s sandbox=%s why=\"%s\"", h->name, h->sandbox,
                r && r->message ? r->message : "no answer");
        fire(h->ctx, h->team, "sandbox_kill", h->sandbox, json_object());
        h->warm = 0;
        create_sandbox(h);
        return;
    }
    if (!r || r->kind != SF_REPLY_RESULT ||
        !(line = json_string_value(json_object_get(r->result, "message")))) {
        start_failed(h, 0, NULL); /* the sandbox goes: nobody will use it */
        if (h->req)
            job_error(h, r, "initialize");
        h_free(h);
        return;
    }
    /* The answer goes out once Redis holds the session: the client's next request may reach
     * another gateway thread (or process), whose own Redis connection must find it. */
    h->answer = strdup(line);
    sf_redis_cmd(h->ctx->redis, NULL, NULL, "HSET " SF_RK_HSESS " team %s name %s sandbox %s "
                 "idle_s %lld created %lld", h->sid, h->team, h->kname, h->sandbox,
                 (long long)h->idle_s, (long long)sf_now_ms());
    sf_redis_cmd(h->ctx->redis, NULL, NULL, "EXPIRE " SF_RK_HSESS " %lld", h->sid,
                 (long long)h->idle_s);
    h->busy = 1;
    if (!h->answer || sf_redis_cmd(h->ctx->redis, on_init_stored, h,
                                   "ZADD " SF_RK_TEAM_HSESS " %lld %s", h->team, h->kname,
                                   (long long)until, h->sid) < 0) {
        h->busy = 0;
        if (h->req)
            h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
    }
}

/* The client's initialize to the started server; a warm pool's server (started with the
 * pool's long idle timeout) gets the session's. */
static void send_initialize(hreq *h)
{
    json_t *args;
    char *text = json_dumps(h->msg, JSON_COMPACT);
    char *idtext = json_dumps(h->id, JSON_COMPACT | JSON_ENCODE_ANY);

    args = text && idtext ? json_pack("{s:s, s:s}", "message", text, "id", idtext) : NULL;
    if (args && h->warm)
        json_object_set_new(args, "idle_s", json_integer(h->idle_s));
    free(text);
    free(idtext);
    if (h_submit(h, SF_TOOL_HOSTED_SEND, args, 0, on_init_answer, NULL) < 0)
        h_free(h);
}

static void on_started(void *arg, const sf_reply *r)
{
    hreq *h = arg;

    h->pending = NULL;
    if (!r || r->kind != SF_REPLY_RESULT) {
        on_init_answer(h, r);
        return;
    }
    send_initialize(h);
}

/* "PORT/PATH" of --http, checked: 0, or -1. */
static int http_spec_ok(const char *v)
{
    char *end;
    long port = strtol(v, &end, 10);

    if (end == v || *v == '-' || *v == '+' || port < 1 || port > 65535 || *end != '/' ||
        strlen(end) > 128)
        return -1;
    for (const char *p = end; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '/' || *p == '-' || *p == '_' || *p == '.'))
            return -1;
    return 0;
}

/* The command the worker starts: run itself (stdio), or for an --http server the bridge
 * `sandfleet servers add` put in its image (cli/http-bridge.py), which starts run and relays
 * stdio lines to http://127.0.0.1:PORT/PATH. Allocated; NULL when out of memory. */
static char *http_run(const char *run, const char *http)
{
    char *out, *w;
    size_t n = 0;

    if (!http || http_spec_ok(http) < 0)
        return strdup(run);
    for (const char *p = run; *p; p++)
        n += *p == '\'' ? 4 : 1;
    out = malloc(strlen(http) + n + 64);
    if (!out)
        return NULL;
    w = out + sprintf(out, "exec python3 /root/.sandfleet/http-bridge.py %.*s %s '",
                      (int)strcspn(http, "/"), http, http + strcspn(http, "/"));
    for (const char *p = run; *p; p++)
        w = *p == '\'' ? stpcpy(w, "'\\''") : (*w++ = *p, w);
    strcpy(w, "'");
    return out;
}

/* The server starts in the session's sandbox (its image holds the code, or test mode's
 * fetch put it in /root/mcp). */
/* sf.hosted_start's arguments for the entry's server; NULL: no memory. */
static json_t *start_args(const json_t *entry, int64_t idle_s)
{
    const char *r = json_string_value(json_object_get(entry, "run"));
    const char *cwd = json_string_value(json_object_get(entry, "cwd"));
    char *run = http_run(r ? r : "", json_string_value(json_object_get(entry, "http")));
    json_t *args = run ? json_pack("{s:s, s:s, s:I}", "run", run, "cwd", cwd ? cwd : "/root/mcp",
                                   "idle_s", (json_int_t)idle_s)
                       : NULL;

    free(run);
    return args;
}

static void start_server(hreq *h)
{
    if (h_submit(h, SF_TOOL_HOSTED_START, start_args(h->entry, h->idle_s), 0, on_started,
                 NULL) < 0)
        h_free(h);
}

/* Test mode's fetch: the last lines of what it printed (at most n bytes, from a line start). */
static const char *tail_text(const char *s, size_t n)
{
    size_t len = s ? strlen(s) : 0;
    const char *p;

    if (!s)
        return "";
    if (len <= n)
        return s;
    p = s + len - n;
    return strchr(p, '\n') && strchr(p, '\n')[1] ? strchr(p, '\n') + 1 : p;
}

static void on_fetched(void *arg, const sf_reply *r)
{
    hreq *h = arg;
    char text[2600];
    long long code;

    h->pending = NULL;
    if (!h->req) {
        start_failed(h, 0, NULL);
        h_free(h);
        return;
    }
    if (!r || r->kind != SF_REPLY_RESULT) {
        snprintf(text, sizeof(text), "Test mode could not fetch %s: %s", h->repo,
                 r && r->message ? r->message : "the fetch did not finish in time; retry.");
        start_failed(h, 502, text);
        h_free(h);
        return;
    }
    code = json_integer_value(json_object_get(r->result, "exit_code"));
    if (code != 0) {
        const char *err = tail_text(json_string_value(json_object_get(r->result, "stderr")), 2000);
        if (code == 10)
            snprintf(text, sizeof(text), "Test mode could not fetch %s (git clone through your "
                     "team's egress rules): %s", h->repo, err);
        else if (code == 12)
            snprintf(text, sizeof(text), "The entrypoint '%s' is not a file inside the "
                     "repository %s; pass entrypoint= as a path within it (.py, .js or .mjs).",
                     h->entrypoint, h->repo);
        else
            snprintf(text, sizeof(text), "Test mode fetched %s but installing its "
                     "requirements.txt / package.json failed (exit %lld; through your team's "
                     "egress rules): %s", h->repo, code, err);
        start_failed(h, 502, text);
        h_free(h);
        return;
    }
    start_server(h);
}

/* Test mode: the sandbox clones the repository into /root/mcp through its egress proxy and
 * installs its requirements. The URL and entrypoint were checked (no quote, no shell
 * character) before they go, single-quoted, into the command. Exit 10: the clone failed,
 * 11: an install, 12: the entrypoint is no file inside the repository. */
static void test_fetch(hreq *h)
{
    char *cmd = NULL;

    if (asprintf(&cmd,
                 "rm -rf /root/mcp; "
                 "{ git clone -q --depth 1 -- '%s' /root/mcp 2>/tmp/sf-fetch.err || "
                 "{ rm -rf /root/mcp; git clone -q -- '%s' /root/mcp 2>/tmp/sf-fetch.err; }; } || "
                 "{ cat /tmp/sf-fetch.err >&2; exit 10; }; "
                 "cd /root/mcp || exit 10; "
                 "case \"$(realpath -e -- '%s' 2>/dev/null)\" in /root/mcp/*) ;; *) exit 12;; esac; "
                 "[ -f '%s' ] || exit 12; "
                 "if [ -f requirements.txt ]; then python3 -m venv /root/venv >&2 && "
                 "/root/venv/bin/pip install -q --disable-pip-version-check -r requirements.txt "
                 ">&2 || exit 11; fi; "
                 "if [ -f package.json ] && [ ! -d node_modules ]; then npm install -s "
                 "--omit=dev --no-audit --no-fund >&2 || exit 11; fi; exit 0",
                 h->repo, h->repo, h->entrypoint, h->entrypoint) < 0) {
        h_error(h, 503, -32603, "Out of memory; retry.");
        h_free(h);
        return;
    }
    if (h_submit(h, "sandbox_exec", json_pack("{s:s, s:i}", "command", cmd, "timeout_ms",
                                              TEST_FETCH_MS), 0, on_fetched, NULL) < 0)
        h_free(h);
    free(cmd);
}

static void on_created(void *arg, const sf_reply *r)
{
    hreq *h = arg;

    h->pending = NULL;
    if (!r || r->kind != SF_REPLY_RESULT) {
        char text[600];
        if (!h->req) {
            h_free(h);
            return;
        }
        snprintf(text, sizeof(text), "The hosted MCP server '%s' could not get a sandbox: %s",
                 h->name, r && r->message ? r->message : "no answer in time; retry.");
        h_error(h, r && !strcmp(r->code, SF_ERR_LIMIT) ? 429 : 503, -32603, text);
        h_free(h);
        return;
    }
    if (h->test)
        test_fetch(h);
    else
        start_server(h);
}

/* The entry's field k parsed as JSON (allow_out, secrets), or NULL. */
static json_t *entry_json(const json_t *entry, const char *k)
{
    const char *s = json_string_value(json_object_get(entry, k));
    return s ? json_loads(s, 0, NULL) : NULL;
}

/* sandbox_create's arguments for a server's sandbox: from its snapshot (test mode: the
 * 'debian' template), its egress rules and secrets; metadata names the server (kname) and
 * the session (or, for the warm pool, the registration it was made for). NULL: no memory. */
static json_t *create_args(const json_t *entry, int test, const char *name, const char *kname,
                           const char *mkey, const char *mval)
{
    const char *snap = json_string_value(json_object_get(entry, "snapshot"));
    json_t *args, *v = NULL;

    /* git, python3 and node: the 'debian' template (as `servers add`'s default) */
    args = json_pack("{s:s, s:s, s:{s:s, s:s}}", test ? "from_template" : "from_snapshot",
                     test ? TEST_TEMPLATE : snap ? snap : "", "name", name, "metadata",
                     "sandfleet_hosted", kname, mkey, mval);
    if (args && (v = entry_json(entry, "allow_out")) && json_array_size(v))
        json_object_set_new(args, "allow_out", v);
    else if (v)
        json_decref(v);
    v = NULL;
    if (args && (v = entry_json(entry, "secrets")) && json_object_size(v))
        json_object_set_new(args, "secrets", v);
    else if (v)
        json_decref(v);
    return args;
}

/* A gateway job nobody waits for (a kill on the way out, metadata): fire and forget. */
static void fire(gw_ctx *ctx, const char *team, const char *tool, const char *sandbox,
                 json_t *args)
{
    sf_job job;

    if (!args)
        return;
    sf_job_init(&job);
    snprintf(job.team, sizeof(job.team), "%s", team);
    snprintf(job.tool, sizeof(job.tool), "%s", tool);
    snprintf(job.sandbox, sizeof(job.sandbox), "%s", sandbox);
    json_object_set_new(args, "sandbox_id", json_string(sandbox));
    job.args = args;
    gw_jobs_submit(ctx, &job, ctx->cfg.call_deadline_ms, ignore_reply, NULL, NULL);
    sf_job_fini(&job);
}

static void create_sandbox(hreq *h)
{
    if (h_submit(h, "sandbox_create",
                 create_args(h->entry, h->test, h->name, h->kname, "session", h->sid), 0,
                 on_created, NULL) < 0)
        h_free(h);
}

/* ---- the warm pool ------------------------------------------------------------------
 * `--warm N`: N sandboxes per server made from its image ahead of time (the code in place;
 * the server starts at initialize), in the list sf:team:{T}:srv:NAME:warm as "GEN ID"
 * (GEN the entry's `created`: a sandbox of an older registration is stale). initialize
 * takes one (LPOP) and makes one in its place; POST /v1/servers/NAME/warm fills the pool
 * (`servers add` calls it) and says how much of it could be made. The sandboxes are the
 * team's own: its quota counts them. */

typedef struct wfill wfill;

#define WARM_IDLE_S 86400 /* a pool's server waits this long (the sandbox's lifetime) */

typedef struct warm {
    gw_ctx *ctx;
    json_t *start;            /* sf.hosted_start's arguments */
    char team[SF_ID_MAX];
    char name[NAME_MAX_LEN + 1];
    char sandbox[SF_ID_MAX];
    char member[96];          /* "GEN ID" */
    long long max;
    wfill *fill;              /* the fill waiting for it, or NULL (a replenish) */
} warm;

struct wfill {
    struct sreq *s;           /* NULL once the client left */
    int pending, ok, fresh, want;
    char err[512];
};

static void fill_done(wfill *f);

static void warm_free(warm *w)
{
    json_decref(w->start);
    free(w);
}

static void on_warm_pushed(redisAsyncContext *ac, void *reply, void *priv)
{
    warm *w = priv;
    redisReply *rep = reply;
    char key[200];

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_INTEGER || rep->integer > w->max) {
        /* over the pool's size (replenishes raced) or Redis failed: not kept */
        snprintf(key, sizeof(key), SF_RK_SRV_WARM, w->team, w->name);
        sf_redis_cmd(w->ctx->redis, NULL, NULL, "LREM %s 1 %s", key, w->member);
        fire(w->ctx, w->team, "sandbox_kill", w->sandbox, json_object());
    } else if (w->fill) {
        w->fill->ok++;
    }
    if (w->fill && --w->fill->pending == 0)
        fill_done(w->fill);
    warm_free(w);
}

static void on_warm_started(void *arg, const sf_reply *r)
{
    warm *w = arg;

    if (!r || r->kind != SF_REPLY_RESULT) {
        const char *why = r && r->message ? r->message : "no answer in time";
        sf_warn("msg=\"warm pool: the server did not start\" server=%s team=%s why=\"%s\"",
                w->name, w->team, why);
        if (w->fill && !w->fill->err[0])
            snprintf(w->fill->err, sizeof(w->fill->err), "its server did not start: %s", why);
        fire(w->ctx, w->team, "sandbox_kill", w->sandbox, json_object());
        if (w->fill && --w->fill->pending == 0)
            fill_done(w->fill);
        warm_free(w);
        return;
    }
    snprintf(w->member + strlen(w->member), sizeof(w->member) - strlen(w->member), "%s",
             w->sandbox);
    if (sf_redis_cmd(w->ctx->redis, on_warm_pushed, w, "RPUSH " SF_RK_SRV_WARM " %s", w->team,
                     w->name, w->member) < 0)
        on_warm_pushed(NULL, NULL, w);
}

/* Submits the gateway's job tool on w's sandbox (args stolen); cb gets w. -1 when it could
 * not be sent. */
static int warm_submit(warm *w, const char *tool, json_t *args, gw_job_cb cb, int fresh)
{
    const sf_tool *t = sf_toolset_find(&w->ctx->tools, tool);
    sf_job job;
    int rc;

    if (!t || !args) {
        json_decref(args);
        return -1;
    }
    sf_job_init(&job);
    snprintf(job.team, sizeof(job.team), "%s", w->team);
    snprintf(job.tool, sizeof(job.tool), "%s", tool);
    if (fresh)
        sf_id_new(w->sandbox, "sb_");
    else
        json_object_set_new(args, "sandbox_id", json_string(w->sandbox));
    snprintf(job.sandbox, sizeof(job.sandbox), "%s", w->sandbox);
    job.args = args;
    rc = gw_jobs_submit(w->ctx, &job,
                        sf_tool_wait_ms(t, args, w->ctx->cfg.call_deadline_ms,
                                        w->ctx->cfg.exec_deadline_margin_ms) +
                            (fresh ? w->ctx->cfg.template_wait_s * 1000 : 0),
                        cb, w, NULL);
    sf_job_fini(&job);
    return rc < 0 ? -1 : 0;
}

static void on_warm_created(void *arg, const sf_reply *r)
{
    warm *w = arg;

    if (!r || r->kind != SF_REPLY_RESULT) {
        const char *why = r && r->message ? r->message : "no answer in time";
        sf_warn("msg=\"warm pool: a sandbox could not be made\" server=%s team=%s why=\"%s\"",
                w->name, w->team, why);
        if (w->fill && !w->fill->err[0])
            snprintf(w->fill->err, sizeof(w->fill->err), "%s", why);
        if (w->fill && --w->fill->pending == 0)
            fill_done(w->fill);
        warm_free(w);
        return;
    }
    /* the server starts now and waits for its client's initialize */
    if (warm_submit(w, SF_TOOL_HOSTED_START, w->start, on_warm_started, 0) < 0) {
        w->start = NULL;
        on_warm_started(w, NULL);
        return;
    }
    w->start = NULL;
}

/* One more sandbox for the pool of server name (entry: its registry hash). */
static void warm_create(gw_ctx *ctx, const char *team, const char *name, const json_t *entry,
                        wfill *fill)
{
    const char *gen = json_string_value(json_object_get(entry, "created"));
    const char *n = json_string_value(json_object_get(entry, "warm"));
    warm *w = calloc(1, sizeof(*w));

    if (!w || !gen || !(w->start = start_args(entry, WARM_IDLE_S))) {
        free(w);
        if (fill && --fill->pending == 0)
            fill_done(fill);
        return;
    }
    w->ctx = ctx;
    w->fill = fill;
    w->max = n ? strtoll(n, NULL, 10) : 0;
    snprintf(w->team, sizeof(w->team), "%s", team);
    snprintf(w->name, sizeof(w->name), "%s", name);
    snprintf(w->member, sizeof(w->member), "%s ", gen);
    if (warm_submit(w, "sandbox_create", create_args(entry, 0, name, name, "sandfleet_warm", gen),
                    on_warm_created, 1) < 0)
        on_warm_created(w, NULL);
}

static void on_warm_pop(redisAsyncContext *ac, void *reply, void *priv)
{
    hreq *h = priv;
    redisReply *rep = reply;
    const char *gen = entry_str(h, "created");
    const char *sp;

    (void)ac;
    h->busy = 0;
    if (!h->req) {
        if (rep && rep->type == REDIS_REPLY_STRING && (sp = strchr(rep->str, ' ')))
            fire(h->ctx, h->team, "sandbox_kill", sp + 1, json_object()); /* nobody takes it */
        h_free(h);
        return;
    }
    if (rep && rep->type == REDIS_REPLY_STRING && (sp = strchr(rep->str, ' ')) && gen &&
        (size_t)(sp - rep->str) == strlen(gen) && !strncmp(rep->str, gen, strlen(gen)) &&
        sf_id_valid(sp + 1)) {
        snprintf(h->sandbox, sizeof(h->sandbox), "%s", sp + 1);
        h->warm = 1;
        fire(h->ctx, h->team, "sandbox_update", h->sandbox,
             json_pack("{s:{s:s, s:s}}", "metadata", "sandfleet_hosted", h->kname, "session",
                       h->sid));
        warm_create(h->ctx, h->team, h->name, h->entry, NULL); /* one in its place */
        send_initialize(h); /* its server runs already */
        return;
    }
    if (rep && rep->type == REDIS_REPLY_STRING && (sp = strchr(rep->str, ' ')) && sf_id_valid(sp + 1))
        fire(h->ctx, h->team, "sandbox_kill", sp + 1, json_object()); /* an old registration's */
    else if (rep && rep->type == REDIS_REPLY_NIL)
        warm_create(h->ctx, h->team, h->name, h->entry, NULL); /* the pool ran dry: refill */
    create_sandbox(h);
}

static void on_count(redisAsyncContext *ac, void *reply, void *priv)
{
    hreq *h = priv;
    redisReply *rep = reply;
    const char *ms = entry_str(h, "max_sessions"), *wn = entry_str(h, "warm");
    long long cap = ms ? strtoll(ms, NULL, 10) : SF_HOSTED_SESSIONS_DEFAULT;
    char text[300];

    (void)ac;
    h->busy = 0;
    if (!h->req) {
        h_free(h);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
        return;
    }
    if (rep->integer >= cap) {
        snprintf(text, sizeof(text), "Your team holds %lld sessions of hosted MCP server '%s', "
                 "the most its registration allows (--max-sessions); end one (DELETE /mcp with its Mcp-Session-Id) or "
                 "wait for an idle one to be evicted.", (long long)rep->integer, h->name);
        h_error(h, 429, -32603, text);
        h_free(h);
        return;
    }
    sf_id_new(h->sid, "hs_");
    if (!h->test && wn && strtoll(wn, NULL, 10) > 0) {
        h->busy = 1;
        if (sf_redis_cmd(h->ctx->redis, on_warm_pop, h, "LPOP " SF_RK_SRV_WARM, h->team,
                         h->name) == 0)
            return;
        h->busy = 0;
    }
    create_sandbox(h);
}

static void initialize(hreq *h)
{
    int64_t now = sf_now_ms();

    /* the team's live sessions: expired ones leave first */
    sf_redis_cmd(h->ctx->redis, NULL, NULL, "ZREMRANGEBYSCORE " SF_RK_TEAM_HSESS " -inf %lld",
                 h->team, h->kname, (long long)now);
    h->busy = 1;
    if (sf_redis_cmd(h->ctx->redis, on_count, h, "ZCARD " SF_RK_TEAM_HSESS, h->team, h->kname) < 0) {
        h->busy = 0;
        h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
    }
}

/* ---- GET: the server's own stream -------------------------------------------------- */

static void listen_next(hreq *h);

static void on_listened(void *arg, const sf_reply *r)
{
    hreq *h = arg;

    h->pending = NULL;
    if (!h->req) {
        h_free(h);
        return;
    }
    if (r && r->kind == SF_REPLY_RESULT) {
        listen_next(h);
        return;
    }
    if (r && !strcmp(r->code, SF_ERR_NOT_FOUND))
        session_forget(h->ctx, h->team, h->kname, h->sid);
    h_respond(h, 200, NULL, NULL, NULL);
    h_free(h);
}

static void listen_next(hreq *h)
{
    if (h_submit(h, SF_TOOL_HOSTED_LISTEN, json_pack("{s:I}", "wait_ms", (json_int_t)25000), 1,
                 on_listened, on_progress) < 0)
        h_free(h);
}

/* ---- DELETE ----------------------------------------------------------------------- */

static void on_killed(void *arg, const sf_reply *r)
{
    hreq *h = arg;

    h->pending = NULL;
    sf_info("msg=\"hosted session deleted\" server=%s session=%s sandbox=%s ok=%d", h->name,
            h->sid, h->sandbox, r && r->kind == SF_REPLY_RESULT);
    h_respond(h, 204, NULL, NULL, NULL);
    h_free(h);
}

/* ---- the session, then the method ------------------------------------------------- */

static void on_session(redisAsyncContext *ac, void *reply, void *priv)
{
    hreq *h = priv;
    redisReply *rep = reply;
    const char *method;

    (void)ac;
    h->busy = 0;
    if (!h->req) {
        h_free(h);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 4) {
        h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
        return;
    }
    if (rep->element[0]->type != REDIS_REPLY_STRING || strcmp(rep->element[0]->str, h->team) ||
        rep->element[1]->type != REDIS_REPLY_STRING || strcmp(rep->element[1]->str, h->kname) ||
        rep->element[2]->type != REDIS_REPLY_STRING) {
        h_error(h, 404, -32001, "Session not found: it ended, was idle too long, or belongs to "
                                "another server or team; send initialize again without "
                                "Mcp-Session-Id.");
        h_free(h);
        return;
    }
    snprintf(h->sandbox, sizeof(h->sandbox), "%s", rep->element[2]->str);
    if (rep->element[3]->type == REDIS_REPLY_STRING)
        h->idle_s = strtoll(rep->element[3]->str, NULL, 10);
    if (h->idle_s <= 0)
        h->idle_s = SF_HOSTED_IDLE_DEFAULT_S;
    method = gw_req_method(h->req);
    if (!strcmp(method, "DELETE")) {
        session_forget(h->ctx, h->team, h->kname, h->sid);
        if (h_submit(h, "sandbox_kill", json_object(), 0, on_killed, NULL) < 0)
            h_free(h);
        return;
    }
    if (!strcmp(method, "GET")) { /* no activity: an open stream keeps no session alive */
        char hdr[SF_ID_MAX];
        const char *headers[] = {"Mcp-Session-Id", hdr, NULL};
        snprintf(hdr, sizeof(hdr), "%s", h->sid);
        h->sse_ok = 1;
        h->listen = 1;
        if (sse_begin(h, headers) < 0) {
            h_free(h);
            return;
        }
        listen_next(h);
        return;
    }
    session_touch(h);
    send_message(h);
}

static void after_entry(hreq *h);

static void on_entry(redisAsyncContext *ac, void *reply, void *priv)
{
    hreq *h = priv;
    redisReply *rep = reply;
    char text[300];

    (void)ac;
    h->busy = 0;
    if (!h->req) {
        h_free(h);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
        return;
    }
    if (rep->elements == 0) {
        snprintf(text, sizeof(text), "No MCP server named '%s' is registered for your team; "
                 "check the name (sandfleet servers list) or register it with `sandfleet "
                 "servers add %s`.", h->name, h->name);
        h_error(h, 404, -32601, text);
        h_free(h);
        return;
    }
    h->entry = json_object();
    for (size_t i = 0; i + 1 < rep->elements; i += 2)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            rep->element[i + 1]->type == REDIS_REPLY_STRING)
            json_object_set_new(h->entry, rep->element[i]->str,
                                json_string(rep->element[i + 1]->str));
    after_entry(h);
}

/* The entry is known (registered, or test mode's): initialize, or the session's message. */
static void after_entry(hreq *h)
{
    const char *sid, *idle = entry_str(h, "idle_s");

    h->idle_s = idle ? strtoll(idle, NULL, 10) : SF_HOSTED_IDLE_DEFAULT_S;
    if (h->idle_s <= 0)
        h->idle_s = SF_HOSTED_IDLE_DEFAULT_S;
    sid = gw_req_header(h->req, "Mcp-Session-Id");
    if (!sid) {
        const char *method = json_string_value(json_object_get(h->msg, "method"));
        if (strcmp(gw_req_method(h->req), "POST") != 0) {
            h_error(h, 400, -32600, "Send Mcp-Session-Id: GET and DELETE name a session.");
            h_free(h);
            return;
        }
        if (!method || strcmp(method, "initialize") != 0 || !h->id) {
            h_error(h, 400, -32600, "No session: send initialize first (without "
                                    "Mcp-Session-Id), then the Mcp-Session-Id it answers with.");
            h_free(h);
            return;
        }
        initialize(h);
        return;
    }
    if (!sf_id_valid(sid) || strncmp(sid, "hs_", 3) != 0) {
        h_error(h, 404, -32001, "Session not found: send initialize again without "
                                "Mcp-Session-Id.");
        h_free(h);
        return;
    }
    snprintf(h->sid, sizeof(h->sid), "%s", sid);
    h->busy = 1;
    if (sf_redis_cmd(h->ctx->redis, on_session, h, "HMGET " SF_RK_HSESS " team name sandbox idle_s",
                     h->sid) < 0) {
        h->busy = 0;
        h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
    }
}

/* Test mode's URL: https://HOST[:PORT]/PATH, at most 1024 bytes, no credentials, nothing a
 * shell or git would read as more than a URL. Its host into host. 0, or -1. */
static int test_url_ok(const char *url, char *host, size_t n)
{
    const char *a = url + 8;
    size_t len;

    if (strncmp(url, "https://", 8) || strlen(url) > TEST_URL_MAX)
        return -1;
    for (const char *p = url; *p; p++)
        if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f || strchr("'\"\\`$;&|<>(){}*![]", *p))
            return -1;
    len = strcspn(a, "/?#");
    if (len == 0 || memchr(a, '@', len))
        return -1;
    len = strcspn(a, ":/?#");
    if (len == 0 || len >= n)
        return -1;
    memcpy(host, a, len);
    host[len] = '\0';
    return 0;
}

/* Test mode's entrypoint: a relative path inside the repository to a .py, .js or .mjs file,
 * of letters, digits, '.', '_', '-' and '/', no '..' component, not starting with '-'. */
static int test_entry_ok(const char *e)
{
    size_t len = strlen(e);
    const char *dot = strrchr(e, '.');

    if (len == 0 || len > TEST_ENTRY_MAX || *e == '/' || *e == '-' || !dot ||
        (strcmp(dot, ".py") && strcmp(dot, ".js") && strcmp(dot, ".mjs")))
        return -1;
    for (const char *p = e; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-' || *p == '/'))
            return -1;
    for (const char *c = e; c; c = strchr(c, '/') ? strchr(c, '/') + 1 : NULL)
        if (!strncmp(c, "..", 2) && (c[2] == '/' || c[2] == '\0'))
            return -1;
    return 0;
}

static int is_ipv4(const char *host)
{
    return strspn(host, "0123456789.") == strlen(host);
}

static void on_test_mode(redisAsyncContext *ac, void *reply, void *priv)
{
    hreq *h = priv;
    redisReply *rep = reply;
    char host[256], *run = NULL;
    const char *ext;

    (void)ac;
    h->busy = 0;
    if (!h->req) {
        h_free(h);
        return;
    }
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
        return;
    }
    if (rep->type != REDIS_REPLY_STRING || strcmp(rep->str, "on")) {
        h_error(h, 403, -32600, "Test mode is off for your team: an operator turns it on with "
                                "`sandfleet teams limits TEAM --hosted-test-mode on`; or register "
                                "the server with `sandfleet servers add NAME`.");
        h_free(h);
        return;
    }
    if (!h->repo[0] || test_url_ok(h->repo, host, sizeof(host)) < 0) {
        h_error(h, 400, -32602, "Test mode needs repo_url=https://HOST/PATH (URL-encoded, at "
                                "most 1024 bytes, no credentials, quotes or spaces) and "
                                "entrypoint=FILE.");
        h_free(h);
        return;
    }
    if (test_entry_ok(h->entrypoint) < 0) {
        h_error(h, 400, -32602, "entrypoint= is the server's file inside the repository: a "
                                "relative path (no '..', not absolute) of letters, digits, '.', "
                                "'_', '-' and '/' ending in .py (run with python3) or .js/.mjs "
                                "(run with node), at most 255 bytes.");
        h_free(h);
        return;
    }
    ext = strrchr(h->entrypoint, '.');
    if (asprintf(&run, !strcmp(ext, ".py")
                           ? "[ -x /root/venv/bin/python3 ] && PATH=/root/venv/bin:$PATH; "
                             "exec python3 '%s'"
                           : "exec node '%s'",
                 h->entrypoint) < 0) {
        h_error(h, 503, -32603, "Out of memory; retry.");
        h_free(h);
        return;
    }
    h->entry = json_pack("{s:s, s:s}", "run", run, "cwd", "/root/mcp");
    free(run);
    /* a domain opens the repository's host through the egress proxy (whose rules still
     * refuse the platform's addresses whatever a name resolves to); an address or a bare
     * name stays under the default rules */
    if (h->entry && strchr(host, '.') && !is_ipv4(host)) {
        char list[300];
        snprintf(list, sizeof(list), "[\"%s\"]", host);
        json_object_set_new(h->entry, "allow_out", json_string(list));
    }
    if (!h->entry) {
        h_error(h, 503, -32603, "Out of memory; retry.");
        h_free(h);
        return;
    }
    after_entry(h);
}

static void on_auth(void *arg, int status, const char *team, gw_session *sess, const char *why)
{
    hreq *h = arg;

    (void)sess;
    h->busy = 0;
    if (!h->req) {
        h_free(h);
        return;
    }
    if (status == 401) {
        char challenge[768], *text = NULL;
        const char *hd[] = {"WWW-Authenticate", challenge, NULL};
        json_t *e;
        gw_oauth_challenge(h->ctx, h->req, why, challenge, sizeof(challenge));
        e = json_pack("{s:s, s:s}", "error", why ? "invalid_token" : "unauthorized",
                      "error_description", why ? why : GW_WHY_MISSING_CREDENTIALS);
        text = e ? json_dumps(e, JSON_COMPACT) : NULL;
        h_respond(h, 401, hd, "application/json", text ? text : "{\"error\":\"unauthorized\"}");
        free(text);
        json_decref(e);
        h_free(h);
        return;
    }
    if (status != 200) {
        h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
        return;
    }
    snprintf(h->team, sizeof(h->team), "%s", team);
    h->busy = 1;
    if (h->test ? sf_redis_cmd(h->ctx->redis, on_test_mode, h,
                               "HGET " SF_RK_TEAM_LIMITS " hosted_test_mode", h->team) < 0
                : sf_redis_cmd(h->ctx->redis, on_entry, h, "HGETALL " SF_RK_SRV, h->team,
                               h->name) < 0) {
        h->busy = 0;
        h_error(h, 503, -32603, SF_MSG_STORE_DOWN);
        h_free(h);
    }
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The query parameter key, percent-decoded ('+' a space) into out. 1 when there, 0 when
 * not, -1 when longer than n - 1 or badly encoded (a %00 too). */
static int query_param(const char *q, const char *key, char *out, size_t n)
{
    size_t kl = strlen(key), w = 0;

    for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
        if (strncmp(p, key, kl) || p[kl] != '=')
            continue;
        for (const char *v = p + kl + 1; *v && *v != '&'; v++) {
            int c = (unsigned char)*v;
            if (c == '%') {
                int hi = hexval(v[1]), lo = hi < 0 ? -1 : hexval(v[2]);
                if (lo < 0 || (hi == 0 && lo == 0))
                    return -1;
                c = hi * 16 + lo;
                v += 2;
            } else if (c == '+') {
                c = ' ';
            }
            if (w + 1 >= n)
                return -1;
            out[w++] = (char)c;
        }
        out[w] = '\0';
        return 1;
    }
    return 0;
}

/* NAME from /mcp/NAME or ?name=NAME; 0, or -1 when it is no server name. */
static int server_name(gw_req *req, char *out, size_t n)
{
    const char *path = gw_req_path(req), *q = gw_req_query(req), *v = NULL;
    size_t len = 0;

    if (!strncmp(path, "/mcp/", 5)) {
        v = path + 5;
        len = strlen(v);
    } else {
        for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL)
            if (!strncmp(p, "name=", 5)) {
                v = p + 5;
                len = strcspn(v, "&");
                break;
            }
    }
    if (!v || len == 0 || len >= n || len > NAME_MAX_LEN)
        return -1;
    for (size_t i = 0; i < len; i++)
        if (!((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9') || v[i] == '-' ||
              v[i] == '_'))
            return -1;
    memcpy(out, v, len);
    out[len] = '\0';
    return 0;
}

int gw_hosted_wanted(gw_req *req)
{
    const char *q = gw_req_query(req);

    return !strncmp(gw_req_path(req), "/mcp/", 5) ||
           (q && (!strncmp(q, "name=", 5) || strstr(q, "&name=")));
}

void gw_hosted_handle(gw_req *req, gw_ctx *ctx)
{
    const char *method = gw_req_method(req);
    const char *accept = gw_req_header(req, "Accept");
    char resource[300];
    const char *authz = gw_req_header(req, "Authorization");
    hreq *h;
    size_t len;
    const char *body;

    if (strcmp(method, "POST") && strcmp(method, "GET") && strcmp(method, "DELETE")) {
        static const char *const allow[] = {"Allow", "GET, POST, DELETE", NULL};
        gw_req_respond(req, 405, "application/json", allow,
                       "{\"error\":\"Use POST, GET (the server's stream) or DELETE.\"}", 55);
        return;
    }
    if (!(h = calloc(1, sizeof(*h)))) {
        gw_req_respond(req, 503, "application/json", NULL, SF_MSG_OOM_JSON,
                       strlen(SF_MSG_OOM_JSON));
        return;
    }
    h->ctx = ctx;
    h->req = req;
    h->sse_ok = accept && strstr(accept, "text/event-stream");
    gw_req_set_abort_cb(req, on_abort, h);
    if (server_name(req, h->name, sizeof(h->name)) < 0) {
        h_error(h, 404, -32601, "The server name must be 1-63 of a-z, 0-9, '-' and '_': "
                                "POST /mcp?name=NAME or /mcp/NAME.");
        h_free(h);
        return;
    }
    snprintf(h->kname, sizeof(h->kname), "%s", h->name);
    {
        const char *q = gw_req_query(req);
        char flag[8] = "";
        if (q && query_param(q, "test_mode", flag, sizeof(flag)) > 0 && !strcmp(flag, "true")) {
            h->test = 1;
            snprintf(h->kname, sizeof(h->kname), "test.%s", h->name);
            if (query_param(q, "repo_url", h->repo, sizeof(h->repo)) < 0 ||
                query_param(q, "entrypoint", h->entrypoint, sizeof(h->entrypoint)) < 0) {
                h_error(h, 400, -32602, "repo_url is at most 1024 bytes and entrypoint at most "
                                        "255, URL-encoded (no %00).");
                h_free(h);
                return;
            }
        }
    }
    if (!strcmp(method, "POST")) {
        json_error_t jerr;
        body = gw_req_body(req, &len);
        if (len > SF_HOSTED_MSG_MAX) {
            h_error(h, 413, -32600, "A message to a hosted MCP server is at most 256 KiB; send "
                                    "large data through a file or a URL.");
            h_free(h);
            return;
        }
        h->msg = json_loadb(body, len, 0, &jerr);
        if (!json_is_object(h->msg) ||
            !json_is_string(json_object_get(h->msg, "jsonrpc"))) {
            h_error(h, 400, -32700, "Send one JSON-RPC 2.0 message (a JSON object) per POST.");
            h_free(h);
            return;
        }
        h->id = json_object_get(h->msg, "id");
        if (h->id && !json_object_get(h->msg, "method")) /* a response to the server */
            h->id = NULL;
        if (h->id && !json_is_string(h->id) && !json_is_integer(h->id)) {
            h->id = NULL;
            h_error(h, 400, -32600, "A request's id must be a string or an integer.");
            h_free(h);
            return;
        }
    }
    h->busy = 1;
    resource[0] = '\0';
    if (authz && strstr(authz, SF_OAUTH_AT_PREFIX))
        gw_oauth_resource(ctx, req, resource, sizeof(resource));
    gw_auth_check(ctx, authz, NULL, NULL, resource, on_auth, h);
}

/* ---- the registry: /v1/servers -------------------------------------------------------- */

typedef struct sreq {
    gw_ctx *ctx;
    gw_req *req;
    int busy;
    char team[SF_ID_MAX];
    char name[NAME_MAX_LEN + 1];
    char sub[16];             /* "", "logs", "warm" */
    json_t *body;
    json_t *entry;            /* warm: the server's registry hash */
} sreq;

static void s_free(sreq *s)
{
    json_decref(s->body);
    json_decref(s->entry);
    free(s);
}

static void s_answer(sreq *s, int status, json_t *j)
{
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

    if (s->req) {
        gw_req_set_abort_cb(s->req, NULL, NULL);
        gw_req_respond(s->req, status, "application/json", NULL, text ? text : "{}",
                       text ? strlen(text) : 2);
        s->req = NULL;
    }
    free(text);
    json_decref(j);
}

static void s_error(sreq *s, int status, const char *msg)
{
    s_answer(s, status, json_pack("{s:s}", "error", msg));
}

static void s_abort(gw_req *req, void *arg)
{
    sreq *s = arg;

    (void)req;
    s->req = NULL;
    if (!s->busy)
        s_free(s);
}

static json_t *hash_object(const redisReply *rep)
{
    json_t *o = json_object();

    for (size_t i = 0; rep && i + 1 < rep->elements; i += 2)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            rep->element[i + 1]->type == REDIS_REPLY_STRING) {
            const char *k = rep->element[i]->str, *v = rep->element[i + 1]->str;
            json_t *parsed = NULL;
            if (!strcmp(k, "allow_out") || !strcmp(k, "secrets"))
                parsed = json_loads(v, 0, NULL);
            else if (!strcmp(k, "idle_s") || !strcmp(k, "max_sessions") || !strcmp(k, "warm") ||
                     !strcmp(k, "created") || !strcmp(k, "vcpu") || !strcmp(k, "memory_mib") ||
                     !strcmp(k, "disk_mib"))
                parsed = json_integer(strtoll(v, NULL, 10));
            json_object_set_new(o, k, parsed ? parsed : json_string(v));
        }
    return o;
}

static void s_done(redisAsyncContext *ac, void *reply, void *priv)
{
    sreq *s = priv;
    redisReply *rep = reply;
    const char *method;

    (void)ac;
    s->busy = 0;
    if (!s->req) {
        s_free(s);
        return;
    }
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        s_error(s, 503, SF_MSG_STORE_DOWN);
        s_free(s);
        return;
    }
    method = gw_req_method(s->req);
    if (!strcmp(method, "GET") && !s->name[0]) { /* list: SMEMBERS */
        json_t *names = json_array();
        for (size_t i = 0; i < rep->elements; i++)
            json_array_append_new(names, json_string(rep->element[i]->str));
        s_answer(s, 200, json_pack("{s:o}", "servers", names));
    } else if (!strcmp(method, "GET") && s->sub[0]) { /* logs */
        s_answer(s, 200, json_pack("{s:s, s:s}", "name", s->name, "log",
                                   rep->type == REDIS_REPLY_STRING ? rep->str : ""));
    } else if (!strcmp(method, "GET")) {
        if (rep->elements == 0)
            s_error(s, 404, NOT_REGISTERED);
        else
            s_answer(s, 200, hash_object(rep));
    } else if (!strcmp(method, "DELETE")) {
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 0)
            s_error(s, 404, "No server of that name is registered for your team.");
        else
            s_answer(s, 200, json_pack("{s:s, s:b}", "name", s->name, "removed", 1));
    } else { /* PUT: the script's answer */
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer < 0)
            s_error(s, 409, "Your team has 64 servers registered, the most it may; remove one "
                            "first (sandfleet servers remove NAME).");
        else
            s_answer(s, 200, json_pack("{s:s, s:s}", "name", s->name, "status", "registered"));
    }
    s_free(s);
}

/* ---- POST /v1/servers/NAME/warm: fill the warm pool -------------------------------- */

static void fill_done(wfill *f)
{
    sreq *s = f->s;
    int ready = f->fresh + f->ok;
    json_t *a;

    if (s) {
        a = json_pack("{s:s, s:i, s:i}", "name", s->name, "warm", f->want, "ready", ready);
        if (a && ready < f->want) {
            char text[800];
            snprintf(text, sizeof(text), "The warm pool of '%s' holds %d of %d sandboxes: %s "
                     "The other sessions start cold (each initialize makes one more for the "
                     "pool); free some of your team's sandboxes or lower --warm.",
                     s->name, ready, f->want, f->err[0] ? f->err : "they could not be made.");
            json_object_set_new(a, "error", json_string(text));
        }
        s->busy = 0;
        s_answer(s, 200, a);
        s_free(s);
    }
    free(f);
}

static void on_fill_list(redisAsyncContext *ac, void *reply, void *priv)
{
    sreq *s = priv;
    redisReply *rep = reply;
    const char *gen = json_string_value(json_object_get(s->entry, "created"));
    const char *wn = json_string_value(json_object_get(s->entry, "warm"));
    int want = wn ? (int)strtol(wn, NULL, 10) : 0, fresh = 0, need;
    char key[200];
    wfill *f;

    (void)ac;
    if (!s->req) {
        s->busy = 0;
        s_free(s);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        s->busy = 0;
        s_error(s, 503, SF_MSG_STORE_DOWN);
        s_free(s);
        return;
    }
    snprintf(key, sizeof(key), SF_RK_SRV_WARM, s->team, s->name);
    for (size_t i = 0; i < rep->elements; i++) {
        const char *m = rep->element[i]->type == REDIS_REPLY_STRING ? rep->element[i]->str : "";
        const char *sp = strchr(m, ' ');
        int current = sp && gen && (size_t)(sp - m) == strlen(gen) && !strncmp(m, gen, strlen(gen));
        if (current && fresh < want) {
            fresh++;
            continue;
        }
        /* an older registration's, or more than --warm now asks for */
        sf_redis_cmd(s->ctx->redis, NULL, NULL, "LREM %s 1 %s", key, m);
        if (sp && sf_id_valid(sp + 1))
            fire(s->ctx, s->team, "sandbox_kill", sp + 1, json_object());
    }
    need = want - fresh;
    if (!(f = calloc(1, sizeof(*f)))) {
        s->busy = 0;
        s_error(s, 503, "Out of memory; retry.");
        s_free(s);
        return;
    }
    f->s = s;
    f->want = want;
    f->fresh = fresh;
    f->pending = need;
    if (need <= 0) {
        fill_done(f);
        return;
    }
    for (int i = 0; i < need; i++)
        warm_create(s->ctx, s->team, s->name, s->entry, f);
}

static void on_fill_entry(redisAsyncContext *ac, void *reply, void *priv)
{
    sreq *s = priv;
    redisReply *rep = reply;

    (void)ac;
    if (!s->req || !rep || rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) {
        s->busy = 0;
        if (!rep || rep->type != REDIS_REPLY_ARRAY)
            s_error(s, 503, SF_MSG_STORE_DOWN);
        else
            s_error(s, 404, NOT_REGISTERED);
        s_free(s);
        return;
    }
    s->entry = json_object();
    for (size_t i = 0; i + 1 < rep->elements; i += 2)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            rep->element[i + 1]->type == REDIS_REPLY_STRING)
            json_object_set_new(s->entry, rep->element[i]->str,
                                json_string(rep->element[i + 1]->str));
    if (sf_redis_cmd(s->ctx->redis, on_fill_list, s, "LRANGE " SF_RK_SRV_WARM " 0 -1", s->team,
                     s->name) < 0) {
        s->busy = 0;
        s_error(s, 503, SF_MSG_STORE_DOWN);
        s_free(s);
    }
}

/* PUT /v1/servers/NAME: the entry, checked. -1 answered. */
static int s_put(sreq *s)
{
    static const char *const strs[] = {"run", "snapshot", "template", "cwd", "http", "setup",
                                       "source", "ref", "shape_template"};
    json_t *b = s->body, *v;
    const char *argv[64];
    char nums[7][24], *jallow = NULL, *jsec = NULL;
    char k1[200], k2[200];
    int argc = 0;

    if (!json_is_object(b) || !json_is_string(json_object_get(b, "run")) ||
        !json_is_string(json_object_get(b, "snapshot"))) {
        s_error(s, 400, "Send a JSON object with 'run' (the command) and 'snapshot' (the image "
                        "`sandfleet servers add` made).");
        return -1;
    }
    snprintf(k1, sizeof(k1), SF_RK_SRV, s->team, s->name);
    snprintf(k2, sizeof(k2), SF_RK_SRVS, s->team);
    /* EVAL: at most SF_HOSTED_SERVERS_MAX names, then the hash replaced whole */
    argv[argc++] = "EVAL";
    argv[argc++] = "if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 and "
                   "redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[2]) then return -1 end "
                   "redis.call('SADD', KEYS[2], ARGV[1]) redis.call('DEL', KEYS[1]) "
                   "redis.call('HSET', KEYS[1], unpack(ARGV, 3)) return 1";
    argv[argc++] = "2";
    argv[argc++] = k1;
    argv[argc++] = k2;
    argv[argc++] = s->name;
    snprintf(nums[0], sizeof(nums[0]), "%d", SF_HOSTED_SERVERS_MAX);
    argv[argc++] = nums[0];
    argv[argc++] = "name";
    argv[argc++] = s->name;
    argv[argc++] = "team";
    argv[argc++] = s->team;
    for (size_t i = 0; i < SF_ARRAY_LEN(strs); i++) {
        v = json_object_get(b, strs[i]);
        if (!v)
            continue;
        if (!json_is_string(v) || json_string_length(v) > 4096) {
            s_error(s, 400, "Server fields 'run', 'setup', 'cwd', 'http', 'template', 'snapshot', "
                            "'source', 'ref' and 'shape_template' are strings of at most 4096 "
                            "bytes.");
            return -1;
        }
        if (!strcmp(strs[i], "http") && http_spec_ok(json_string_value(v)) < 0) {
            s_error(s, 400, "http is PORT/PATH: a port 1-65535 and a path of letters, digits, "
                            "'/', '-', '_' and '.' (at most 128), e.g. 8000/mcp.");
            return -1;
        }
        argv[argc++] = strs[i];
        argv[argc++] = json_string_value(v);
    }
    {
        static const char *const ints[] = {"idle_s", "max_sessions", "warm", "vcpu",
                                           "memory_mib", "disk_mib"};
        static const json_int_t lo[] = {1, 1, 0, 1, 64, 64},
                                hi[] = {604800, 1000, 16, 8, 65536, 65536};
        for (size_t i = 0; i < SF_ARRAY_LEN(ints); i++) {
            v = json_object_get(b, ints[i]);
            if (!v)
                continue;
            if (!json_is_integer(v) || json_integer_value(v) < lo[i] ||
                json_integer_value(v) > hi[i]) {
                s_error(s, 400, "idle_s is 1-604800 seconds, max_sessions 1-1000, warm 0-16, "
                                "vcpu 1-8, memory_mib and disk_mib 64-65536.");
                return -1;
            }
            snprintf(nums[1 + i], sizeof(nums[1 + i]), "%lld",
                     (long long)json_integer_value(v));
            argv[argc++] = ints[i];
            argv[argc++] = nums[1 + i];
        }
    }
    if ((v = json_object_get(b, "allow_out"))) {
        if (!json_is_array(v) || json_array_size(v) > 64) {
            s_error(s, 400, "allow_out is a list of at most 64 hosts.");
            return -1;
        }
        jallow = json_dumps(v, JSON_COMPACT);
        argv[argc++] = "allow_out";
        argv[argc++] = jallow ? jallow : "[]";
    }
    if ((v = json_object_get(b, "secrets"))) {
        if (!json_is_object(v) || json_object_size(v) > 32) {
            free(jallow);
            s_error(s, 400, "secrets is an object ENV -> secret name (at most 32).");
            return -1;
        }
        jsec = json_dumps(v, JSON_COMPACT);
        argv[argc++] = "secrets";
        argv[argc++] = jsec ? jsec : "{}";
    }
    {
        static char created[24];
        snprintf(created, sizeof(created), "%lld", (long long)sf_now_ms());
        argv[argc++] = "created";
        argv[argc++] = created;
    }
    s->busy = 1;
    if (sf_redis_cmdargv(s->ctx->redis, s_done, s, argc, argv, NULL) < 0) {
        s->busy = 0;
        free(jallow);
        free(jsec);
        s_error(s, 503, SF_MSG_STORE_DOWN);
        return -1;
    }
    free(jallow);
    free(jsec);
    return 0;
}

static void s_on_auth(void *arg, int status, const char *team, gw_session *sess, const char *why)
{
    sreq *s = arg;
    const char *method;
    int rc = 0;

    (void)sess;
    s->busy = 0;
    if (!s->req) {
        s_free(s);
        return;
    }
    if (status != 200) {
        s_error(s, status == 401 ? 401 : 503,
                status == 401 ? (why ? why : GW_WHY_MISSING_CREDENTIALS) : SF_MSG_STORE_DOWN);
        s_free(s);
        return;
    }
    snprintf(s->team, sizeof(s->team), "%s", team);
    method = gw_req_method(s->req);
    s->busy = 1;
    if (!strcmp(method, "POST")) /* .../warm */
        rc = sf_redis_cmd(s->ctx->redis, on_fill_entry, s, "HGETALL " SF_RK_SRV, s->team,
                          s->name);
    else if (!strcmp(method, "GET") && !s->name[0])
        rc = sf_redis_cmd(s->ctx->redis, s_done, s, "SMEMBERS " SF_RK_SRVS, s->team);
    else if (!strcmp(method, "GET") && s->sub[0])
        rc = sf_redis_cmd(s->ctx->redis, s_done, s, "GET " SF_RK_SRV_LOG, s->team, s->name);
    else if (!strcmp(method, "GET"))
        rc = sf_redis_cmd(s->ctx->redis, s_done, s, "HGETALL " SF_RK_SRV, s->team, s->name);
    else if (!strcmp(method, "DELETE")) {
        sf_redis_cmd(s->ctx->redis, NULL, NULL, "DEL " SF_RK_SRV_LOG, s->team, s->name);
        sf_redis_cmd(s->ctx->redis, NULL, NULL, "DEL " SF_RK_SRV_WARM, s->team, s->name);
        sf_redis_cmd(s->ctx->redis, NULL, NULL, "SREM " SF_RK_SRVS " %s", s->team, s->name);
        rc = sf_redis_cmd(s->ctx->redis, s_done, s, "DEL " SF_RK_SRV, s->team, s->name);
    } else {
        s->busy = 0;
        if (s_put(s) < 0)
            s_free(s);
        return;
    }
    if (rc < 0) {
        s->busy = 0;
        s_error(s, 503, SF_MSG_STORE_DOWN);
        s_free(s);
    }
}

static void servers_handle(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    const char *path = gw_req_path(req), *method = gw_req_method(req), *rest;
    sreq *s;
    size_t len;
    const char *body;

    if (!(s = calloc(1, sizeof(*s)))) {
        gw_req_respond(req, 503, "application/json", NULL, SF_MSG_OOM_JSON,
                       strlen(SF_MSG_OOM_JSON));
        return;
    }
    s->ctx = ctx;
    s->req = req;
    gw_req_set_abort_cb(req, s_abort, s);
    rest = !strncmp(path, "/v1/servers/", 12) ? path + 12 : "";
    if (*rest) {
        size_t n = strcspn(rest, "/");
        if (n == 0 || n > NAME_MAX_LEN) {
            s_error(s, 404, NAME_RULE);
            s_free(s);
            return;
        }
        memcpy(s->name, rest, n);
        s->name[n] = '\0';
        for (size_t i = 0; i < n; i++)
            if (!((s->name[i] >= 'a' && s->name[i] <= 'z') ||
                  (s->name[i] >= '0' && s->name[i] <= '9') || s->name[i] == '-' ||
                  s->name[i] == '_')) {
                s_error(s, 400, NAME_RULE);
                s_free(s);
                return;
            }
        if (rest[n] == '/' && (!strcmp(rest + n + 1, "logs") || !strcmp(rest + n + 1, "warm")))
            snprintf(s->sub, sizeof(s->sub), "%s", rest + n + 1);
        else if (rest[n]) {
            s_error(s, 404, "Not found: /v1/servers/NAME, /v1/servers/NAME/logs or "
                            "/v1/servers/NAME/warm.");
            s_free(s);
            return;
        }
    }
    if (!strcmp(method, "PUT")) {
        body = gw_req_body(req, &len);
        if (len > SERVER_BODY_MAX) {
            s_error(s, 413, "A server's entry is at most 64 KiB of JSON; keep long setup steps "
                            "in a script uploaded with the code.");
            s_free(s);
            return;
        }
        if (!s->name[0] || s->sub[0] ||
            !(s->body = json_loadb(body, len, 0, NULL))) {
            s_error(s, 400, "PUT /v1/servers/NAME takes the server's entry as a JSON object (at "
                            "most 64 KiB).");
            s_free(s);
            return;
        }
    } else if (!strcmp(method, "POST") ? strcmp(s->sub, "warm") != 0
               : !strcmp(s->sub, "warm") ||
                     (strcmp(method, "GET") &&
                      !(!strcmp(method, "DELETE") && s->name[0] && !s->sub[0]))) {
        s_error(s, 405, "Use GET /v1/servers[/NAME[/logs]], PUT or DELETE /v1/servers/NAME, "
                        "POST /v1/servers/NAME/warm.");
        s_free(s);
        return;
    }
    s->busy = 1;
    gw_auth_check(ctx, gw_req_header(req, "Authorization"), NULL, NULL, "", s_on_auth, s);
}

int gw_hosted_routes(gw_ctx *ctx)
{
    if (gw_router_add(ctx->router, NULL, "/v1/servers", servers_handle, ctx) < 0 ||
        gw_router_add(ctx->router, NULL, "/v1/servers/", servers_handle, ctx) < 0)
        return -ENOMEM;
    return 0;
}
