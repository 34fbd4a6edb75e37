/* mcp.c: MCP Streamable HTTP on /mcp: JSON-RPC framing; initialize, ping, tools/list,
 * tools/call, logging/setLevel, notifications/cancelled; sessions; answers as JSON, or as
 * an SSE stream when a call sends notifications (progress, log messages); the mapping of
 * job replies to CallToolResult; cancellation of running jobs (sf.cancel) when a client
 * cancels or goes away. It never knows which transport carried a request. */
#include "gateway.h"
#include "oauth.h"
#include "idem.h"
#include "session.h"
#include "tools.h"
#include "sf_claim.h"
#include "sf_jobio.h"
#include "sf_jsonrpc.h"
#include "sf_log.h"
#include "sf_oauth.h"
#include "sf_msg.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SERVER_VERSION "0.2.0"

static const char *const protocol_versions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                                 "2024-11-05"};
struct mcp_call {
    gw_ctx *ctx;
    gw_req *req;           /* NULL once the client is gone or answered */
    json_t *msg;           /* the JSON-RPC request */
    json_t *id;            /* its id (borrowed from msg) */
    gw_pending *pending;   /* the job we wait for */
    int busy;              /* a Redis operation is in flight: its callback frees the call */
    const char *protocol;  /* initialize: the version agreed (static) */
    uint64_t t0;
    char team[SF_ID_MAX];
    char tool[SF_ID_MAX];
    char sid[SF_ID_MAX];   /* the session ("" without one) */
    char job[SF_ID_MAX];
    int level;             /* the session's log level */
    int sse_ok;            /* the client accepts text/event-stream */
    int streaming;         /* the SSE answer has begun */
    json_t *progress_token; /* borrowed from msg; NULL: no progress wanted */
    double progress;       /* the last progress value sent */
    struct event *timer;   /* a gateway tool's next step, or the progress heartbeat */
    const gw_tool *run;    /* tools/call of a gateway tool: its handler */
    int step;
    char call_key[SF_ID_MAX + 80]; /* key in ctx->calls ("" when not registered) */
    const sf_tool *def;    /* tools/call: the tool */
    sf_job *held;          /* tools/call: the job while its large arguments go to Redis */
    char idem[GW_IDEM_RKEY_MAX];   /* Redis key of its idempotency record ("" without one) */
    sf_job *idem_job;              /* the job, while its idempotency record is looked up */
};

static void call_unregister(mcp_call *c)
{
    if (c->call_key[0] && c->ctx->calls && sf_map_get(c->ctx->calls, c->call_key) == c)
        sf_map_del(c->ctx->calls, c->call_key);
    c->call_key[0] = '\0';
}

static void call_free(mcp_call *c)
{
    call_unregister(c);
    if (c->idem_job) {
        sf_job_fini(c->idem_job);
        free(c->idem_job);
    }
    if (c->timer)
        event_free(c->timer);
    json_decref(c->msg);
    free(c);
}

/* snprintf(dst, size, "%s", src) without printf (size > 0). */
static void copy_str(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);

    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- HTTP answers ---- */

static void respond_raw(mcp_call *c, int status, const char *const *headers, const char *body)
{
    if (c->req)
        gw_req_respond(c->req, status, body ? "application/json" : NULL, headers, body,
                       body ? strlen(body) : 0);
    c->req = NULL;
}

/* One SSE event carrying a JSON-RPC message. A write that fails ends the stream (the client
 * is gone or does not read); the call then finishes without it. */
static void sse_send(mcp_call *c, const char *json)
{
    sf_buf b;

    if (!c->req || !c->streaming)
        return;
    sf_buf_init(&b, strlen(json) + 64);
    if (sf_buf_appendf(&b, "event: message\ndata: %s\n\n", json) == 0 &&
        gw_req_stream_write(c->req, b.p, b.len) == -ENOBUFS) {
        sf_warn("msg=\"client reads the stream too slowly; ending it\" job=%s", c->job);
        gw_req_stream_end(c->req);
        c->req = NULL;
    }
    sf_buf_fini(&b);
}

/* Starts the SSE answer (once): from here every message of this call is an event. */
static int sse_begin(mcp_call *c)
{
    if (c->streaming)
        return 0;
    if (!c->req || !c->sse_ok ||
        gw_req_stream_begin(c->req, 200, "text/event-stream", NULL) < 0)
        return -1;
    c->streaming = 1;
    return 0;
}

static void respond_json(mcp_call *c, int status, const char *const *headers, json_t *body)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;

    if (!text) { /* cannot happen with clean strings; still answer as JSON-RPC */
        char *id = c->id ? json_dumps(c->id, JSON_ENCODE_ANY) : NULL;
        if (asprintf(&text, "{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":-32603,"
                            "\"message\":\"Internal error: the answer could not be encoded.\"}}",
                     id ? id : "null") < 0)
            text = NULL;
        free(id);
        status = 500;
    }
    if (c->streaming) {
        sse_send(c, text ? text : "{}");
        if (c->req)
            gw_req_stream_end(c->req);
        c->req = NULL;
    } else {
        respond_raw(c, status, headers, text ? text : "{}");
    }
    free(text);
    json_decref(body);
}

/* Messages may quote what the client sent, cut anywhere: make them valid UTF-8. */
static json_t *clean_string(const char *s)
{
    size_t n;
    char *clean = sf_utf8_clean(s, strlen(s), &n);
    json_t *j = clean ? json_stringn(clean, n) : NULL;

    free(clean);
    return j ? j : json_string("(message not shown: invalid text)");
}

static void respond_rpc_result(mcp_call *c, json_t *result, const char *const *headers)
{
    respond_json(c, 200, headers,
                 json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", c->id ? c->id : json_null(),
                           "result", result));
}

/* v in decimal into out (>= 21 bytes), without printf. */
static void fmt_int(char *out, json_int_t v)
{
    char tmp[24], *p = tmp + sizeof(tmp);
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;

    *--p = '\0';
    do
        *--p = (char)('0' + u % 10);
    while ((u /= 10) > 0);
    if (v < 0)
        *--p = '-';
    memcpy(out, p, (size_t)(tmp + sizeof(tmp) - p));
}

/* A result that never changes, encoded once (result_text, alive while the gateway runs):
 * only the id is spliced in, and the result is sent without being copied. */
static void respond_fixed_n(mcp_call *c, const char *result_text, size_t result_len)
{
    static const char head[] = "{\"jsonrpc\":\"2.0\",\"id\":", mid[] = ",\"result\":", tail[] = "}";
    char idnum[32], *id = NULL;
    gw_piece pieces[5];

    if (!c->req)
        return;
    if (json_is_integer(c->id))
        fmt_int(idnum, json_integer_value(c->id));
    else if (!(id = c->id ? json_dumps(c->id, JSON_ENCODE_ANY | JSON_COMPACT) : NULL))
        snprintf(idnum, sizeof(idnum), "null");
    pieces[0] = (gw_piece){head, sizeof(head) - 1, 1};
    pieces[1] = (gw_piece){id ? id : idnum, strlen(id ? id : idnum), 0};
    pieces[2] = (gw_piece){mid, sizeof(mid) - 1, 1};
    pieces[3] = (gw_piece){result_text, result_len, 1};
    pieces[4] = (gw_piece){tail, 1, 1};
    gw_req_respond_pieces(c->req, 200, "application/json", NULL, pieces, 5);
    c->req = NULL;
    free(id);
}

static void respond_fixed(mcp_call *c, const char *result_text)
{
    respond_fixed_n(c, result_text, strlen(result_text));
}

static void respond_rpc_error_h(mcp_call *c, int http, const char *const *headers,
                                const char *message)
{
    respond_json(c, http, headers,
                 json_pack("{s:s, s:O, s:{s:i, s:o}}", "jsonrpc", "2.0", "id",
                           c->id ? c->id : json_null(), "error", "code", -32603, "message",
                           clean_string(message)));
}

static void respond_rpc_error(mcp_call *c, int http, int code, const char *message)
{
    respond_json(c, http, NULL,
                 json_pack("{s:s, s:O, s:{s:i, s:o}}", "jsonrpc", "2.0", "id",
                           c->id ? c->id : json_null(), "error", "code", code, "message",
                           clean_string(message)));
}

/* A tool-level error: the call worked, the tool says what to do next. */
static void respond_tool_error(mcp_call *c, const char *message)
{
    respond_rpc_result(c,
                       json_pack("{s:[{s:s, s:o}], s:b}", "content", "type", "text", "text",
                                 clean_string(message), "isError", 1),
                       NULL);
}

/* ---- notifications on the call's stream ---- */

static void notify(mcp_call *c, const char *method, json_t *params)
{
    json_t *n = json_pack("{s:s, s:s, s:o}", "jsonrpc", "2.0", "method", method, "params", params);
    char *text = n ? json_dumps(n, JSON_COMPACT) : NULL;

    if (text && sse_begin(c) == 0)
        sse_send(c, text);
    free(text);
    json_decref(n);
}

void gw_call_log(mcp_call *c, int level, const char *text)
{
    if (level < c->level || !c->sse_ok || !c->req)
        return;
    notify(c, "notifications/message",
           json_pack("{s:s, s:s, s:o}", "level", gw_session_level_name(level), "logger", "sandfleet",
                     "data", clean_string(text)));
}

void gw_call_progress(mcp_call *c, double progress, double total, const char *message)
{
    json_t *p;

    if (!c->progress_token || !c->sse_ok || !c->req)
        return;
    if (progress <= c->progress && c->progress > 0)
        progress = c->progress + 1; /* progress only grows */
    c->progress = progress;
    p = json_pack("{s:O, s:f}", "progressToken", c->progress_token, "progress", progress);
    if (total > 0)
        json_object_set_new(p, "total", json_real(total));
    if (message)
        json_object_set_new(p, "message", clean_string(message));
    notify(c, "notifications/progress", p);
}

static void call_done_log(mcp_call *c, int ok)
{
    sf_info("msg=\"call done\" tool=%s team=%s job=%s req=%s ok=%d us=%llu", c->tool, c->team,
            c->job[0] ? c->job : "-", c->req ? gw_req_id(c->req) : "-", ok,
            (unsigned long long)(sf_mono_us() - c->t0));
}

void gw_call_result(mcp_call *c, json_t *result)
{
    call_done_log(c, !json_is_true(json_object_get(result, "isError")));
    respond_rpc_result(c, result, NULL);
    call_free(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg);

void gw_call_later(mcp_call *c, int ms, int step)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

    c->step = step;
    if (!c->timer && !(c->timer = evtimer_new(c->ctx->d.base, on_timer, c)))
        return;
    evtimer_add(c->timer, &tv);
}

/* ---- tools/call ---- */

/* A result that carries its own MCP content (schemas/envelope.md, "Content fields"):
 * `_image_png` (base64) becomes an image item, `_text` a text item; both leave the
 * structuredContent. NULL when it has neither (the usual text-of-the-JSON answer). */
static json_t *own_content(json_t *result)
{
    json_t *img = json_object_get(result, "_image_png"), *txt = json_object_get(result, "_text");
    json_t *content;

    if (!json_is_string(img) && !json_is_string(txt))
        return NULL;
    content = json_array();
    if (json_is_string(img))
        json_array_append_new(content, json_pack("{s:s, s:O, s:s}", "type", "image", "data", img,
                                                 "mimeType", "image/png"));
    if (json_is_string(txt))
        json_array_append_new(content, json_pack("{s:s, s:O}", "type", "text", "text", txt));
    json_object_del(result, "_image_png");
    json_object_del(result, "_text");
    return content;
}

static void on_job_reply(void *arg, const sf_reply *r)
{
    mcp_call *c = arg;
    json_t *result;
    char *text;

    c->pending = NULL;
    if (r && c->idem[0])
        gw_idem_store(c->ctx, c->idem, c->job, r);
    if (!r) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "The call got no answer in time (%s); the platform may be busy. Check the "
                 "sandbox with sandbox_info, then retry.", c->tool);
        respond_tool_error(c, msg);
    } else if (r->kind == SF_REPLY_ERROR) {
        respond_tool_error(c, r->message ? r->message : "The call failed.");
    } else if ((result = own_content(r->result))) {
        result = json_pack("{s:o, s:O, s:b}", "content", result, "structuredContent", r->result,
                           "isError", 0);
        respond_rpc_result(c, result, NULL);
    } else {
        int timed_out = json_is_true(json_object_get(r->result, "timed_out"));
        text = json_dumps(r->result, JSON_COMPACT);
        if (timed_out) {
            char *t2 = NULL;
            if (asprintf(&t2, "The command timed out and was killed; raise timeout_ms (at most "
                              "600000) or run it in the background. %s", text ? text : "") < 0)
                t2 = NULL;
            free(text);
            text = t2;
        }
        result = json_pack("{s:[{s:s, s:s}], s:O, s:b}", "content", "type", "text", "text",
                           text ? text : "{}", "structuredContent", r->result, "isError",
                           timed_out);
        free(text);
        respond_rpc_result(c, result, NULL);
    }
    call_done_log(c, r && r->kind == SF_REPLY_RESULT);
    call_free(c);
}

/* A `progress` reply: an output chunk or a status message, as notifications/progress. */
static void on_job_progress(void *arg, const json_t *chunk)
{
    mcp_call *c = arg;
    const char *data = json_string_value(json_object_get(chunk, "data"));
    const char *msg = json_string_value(json_object_get(chunk, "message"));

    gw_call_progress(c, c->progress + 1, 0, data ? data : msg);
}

/* The heartbeat: a call with a progressToken hears from us at least this often. */
static void heartbeat(mcp_call *c)
{
    char msg[SF_ID_MAX + 64];

    snprintf(msg, sizeof(msg), "%s still running (%llu s)", c->tool,
             (unsigned long long)((sf_mono_us() - c->t0) / 1000000));
    gw_call_progress(c, c->progress + 1, 0, msg);
    gw_call_later(c, (int)c->ctx->cfg.progress_interval_ms, -1);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    mcp_call *c = arg;

    if (c->step < 0)
        heartbeat(c);
    else
        c->run->fn(c, c->step);
}


/* Remembers the call under its session and request id, for notifications/cancelled. */
static void call_register(mcp_call *c)
{
    char *id = c->id ? json_dumps(c->id, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;

    if (c->sid[0] && id && strlen(id) < 64 && c->ctx->calls) {
        snprintf(c->call_key, sizeof(c->call_key), "%s|%s", c->sid, id);
        if (sf_map_put(c->ctx->calls, c->call_key, c) < 0)
            c->call_key[0] = '\0';
    }
    free(id);
}

static void submit(mcp_call *c, sf_job *job);
static void hand_over(mcp_call *c, sf_job *job);
static void on_claims_stored(void *arg, int status);

/* ---- idempotency keys: _meta["sandfleet/idempotency_key"] ---- */

/* The record of the call's key: the first call's answer, or none (the call is new, or
 * still running: its job id comes from the key, so publishing it again reaches the same
 * job, and the worker's job guard answers it once, to every caller). */
static void on_idem_lookup(void *arg, int status, const sf_reply *first)
{
    mcp_call *c = arg;
    sf_job *job = c->idem_job;

    c->busy = 0;
    c->idem_job = NULL;
    if (!c->req) {
        sf_job_fini(job);
        free(job);
        call_free(c);
        return;
    }
    if (status == 1) {
        snprintf(c->job, sizeof(c->job), "%s", job->id);
        sf_job_fini(job);
        free(job);
        c->idem[0] = '\0'; /* stored already */
        on_job_reply(c, first);
        return;
    }
    if (status < 0) {
        sf_job_fini(job);
        free(job);
        respond_tool_error(c, "The platform's state store is unreachable; retry in a few "
                              "seconds (with the same idempotency key).");
        call_free(c);
        return;
    }
    hand_over(c, job);
    free(job);
}

static void idem_begin(mcp_call *c, sf_job *job, json_t *key)
{
    const char *why;

    if (gw_idem_derive(c->team, key, job, c->idem, sizeof(c->idem), &why) < 0) {
        sf_job_fini(job);
        respond_tool_error(c, why);
        call_free(c);
        return;
    }
    if (!(c->idem_job = malloc(sizeof(*job)))) {
        sf_job_fini(job);
        respond_tool_error(c, "Out of memory; retry.");
        call_free(c);
        return;
    }
    *c->idem_job = *job; /* taken over */
    c->busy = 1;
    gw_idem_lookup(c->ctx, c->team, c->idem, job->id, on_idem_lookup, c);
}

static void tools_call(mcp_call *c, json_t *params)
{
    gw_ctx *ctx = c->ctx;
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *args = json_object_get(params, "arguments");
    json_t *token = json_object_get(json_object_get(params, "_meta"), "progressToken");
    const sf_tool *tool;
    json_t *idem;
    char why[512];
    sf_job job;

    if (!name) {
        respond_rpc_error(c, 200, -32602, "Invalid params: 'name' (the tool name) is required.");
        goto done;
    }
    if (ctx->kafka_down) {
        static const char *const h[] = {"Retry-After", "2", NULL};
        respond_rpc_error_h(c, 503, h, GW_MSG_QUEUE_DOWN);
        goto done;
    }
    if (ctx->draining) {
        static const char *const h[] = {"Retry-After", "1", NULL};
        respond_rpc_error_h(c, 503, h, "This gateway is shutting down; retry the call (another "
                                       "gateway takes it).");
        goto done;
    }
    if (token && (json_is_string(token) || json_is_integer(token)))
        c->progress_token = token;
    if (!(tool = sf_toolset_find(&ctx->tools, name)) || tool->internal) {
        snprintf(why, sizeof(why), SF_MSG_UNKNOWN_TOOL_FMT, name);
        respond_rpc_error(c, 200, -32602, why);
        goto done;
    }
    if (args && !json_is_object(args)) {
        respond_tool_error(c, "The arguments must be a JSON object.");
        goto done;
    }
    args = args ? json_incref(args) : json_object();
    if (sf_toolset_validate(&ctx->tools, name, args, why, sizeof(why)) < 0) {
        json_decref(args);
        respond_tool_error(c, why);
        goto done;
    }
    if (tool->runs == SF_RUNS_GATEWAY) { /* runs here: its handler (tools.h) */
        json_decref(args);
        if (!(c->run = gw_tool_find(name))) { /* (checked at start-up) */
            respond_rpc_error(c, 200, -32603, "Internal error: this gateway has no handler "
                                              "for the tool; deploy a matching build.");
            goto done;
        }
        snprintf(c->tool, sizeof(c->tool), "%s", name);
        call_register(c);
        c->run->fn(c, 0);
        return;
    }
    sf_job_init(&job);
    snprintf(job.team, sizeof(job.team), "%s", c->team);
    snprintf(job.tool, sizeof(job.tool), "%s", name);
    snprintf(job.trace, sizeof(job.trace), "%s", c->req ? gw_req_id(c->req) : "");
    snprintf(c->tool, sizeof(c->tool), "%s", name);
    job.args = args;
    job.progress = c->progress_token && c->sse_ok;
    if (tool->sandbox == SF_SB_NEW) {
        sf_id_new(job.sandbox, "sb_");
    } else if (json_is_string(json_object_get(args, "sandbox_id"))) {
        const char *sid = json_string_value(json_object_get(args, "sandbox_id"));
        if (!sf_id_valid(sid)) {
            sf_job_fini(&job);
            respond_tool_error(c, sf_msg_no_sandbox(why, sizeof(why), sid));
            goto done;
        }
        snprintf(job.sandbox, sizeof(job.sandbox), "%s", sid);
    }
    c->def = tool;
    idem = json_object_get(json_object_get(params, "_meta"), GW_META_IDEMPOTENCY_KEY);
    if (idem) {
        idem_begin(c, &job, idem);
        return;
    }
    hand_over(c, &job);
    return;
done:
    call_free(c);
}

/* Hands the job's large arguments to Redis (claims), then submits it; the job's contents
 * are taken over; ends c on failure. */
static void hand_over(mcp_call *c, sf_job *job)
{
    int rc;

    if (!(c->held = malloc(sizeof(*c->held)))) {
        sf_job_fini(job);
        respond_tool_error(c, SF_MSG_SERVER_NOMEM);
        call_free(c);
        return;
    }
    *c->held = *job;
    rc = gw_jobs_claim_args(c->ctx, c->held, c->def, on_claims_stored, c);
    if (rc == 1) { /* on_claims_stored goes on */
        c->busy = 1;
        return;
    }
    *job = *c->held;
    free(c->held);
    c->held = NULL;
    if (rc < 0) {
        sf_job_fini(job);
        respond_tool_error(c, SF_MSG_STORE_DOWN_LARGE_ARGS);
        call_free(c);
        return;
    }
    submit(c, job);
}

/* Sends the job (claims stored, if any) and waits for its answer; ends c on failure. */
static void submit(mcp_call *c, sf_job *job)
{
    gw_ctx *ctx = c->ctx;
    const sf_tool *tool = c->def;
    char why[512];
    int rc;

    rc = gw_jobs_submit(ctx, job,
                        sf_tool_wait_ms(tool, job->args, ctx->cfg.call_deadline_ms,
                                        ctx->cfg.exec_deadline_margin_ms) +
                            /* the scheduler may wait for 'debian' to be built (place.c) */
                            (!strcmp(tool->name, "sandbox_create")
                                 ? ctx->cfg.template_wait_s * 1000 : 0),
                        on_job_reply, c, &c->pending);
    snprintf(c->job, sizeof(c->job), "%s", job->id);
    if (c->req)
        gw_req_set_job(c->req, job->id);
    if (rc == -EDQUOT || rc == -E2BIG)
        GW_COUNT(ctx->metrics.calls_refused);
    sf_debug("msg=\"call\" job=%s tool=%s team=%s sandbox=%s req=%s rc=%d", job->id,
             tool->name, c->team, job->sandbox, job->trace, rc);
    if (rc < 0)
        gw_jobs_claims_drop(ctx, job);
    sf_job_fini(job);
    if (rc == 0) { /* on_job_reply answers */
        if (c->idem[0])
            gw_jobs_keep_claims(c->pending);
        call_register(c);
        if (c->progress_token && c->sse_ok) {
            gw_jobs_on_progress(c->pending, on_job_progress);
            if (sse_begin(c) == 0) {
                snprintf(why, sizeof(why), "job %s started: %s", c->job, tool->name);
                gw_call_log(c, GW_LOG_DEBUG, why);
                gw_call_progress(c, 0, 0, "started");
            }
            gw_call_later(c, (int)ctx->cfg.progress_interval_ms, -1);
        }
        return;
    }
    if (rc == -EMSGSIZE)
        snprintf(why, sizeof(why), SF_MSG_ARGS_TOO_LARGE);
    else if (rc == -EALREADY)
        snprintf(why, sizeof(why), "A call with this idempotency key is already waiting on "
                 "this gateway; wait for its answer instead of sending it again.");
    else if (rc == -EDQUOT)
        snprintf(why, sizeof(why), "Your team has %lld calls in flight, the most this gateway "
                 "runs at once; wait for some to finish, then retry.",
                 (long long)ctx->cfg.max_pending_team);
    else
        snprintf(why, sizeof(why), "%s", rc == -E2BIG ? "Too many calls are in flight on this "
                 "gateway; retry in a few seconds." : "The job queue is unavailable; retry in a "
                 "few seconds.");
    respond_tool_error(c, why);
    call_free(c);
}

/* The large arguments are in Redis (or could not be put there). */
static void on_claims_stored(void *arg, int status)
{
    mcp_call *c = arg;
    sf_job *job = c->held;
    char why[320];

    c->busy = 0;
    c->held = NULL;
    if (!c->req) { /* the client left meanwhile */
        if (status == 0)
            gw_jobs_claims_drop(c->ctx, job);
        sf_job_fini(job);
        free(job);
        call_free(c);
        return;
    }
    if (status < 0) {
        if (status == -ENOSPC)
            snprintf(why, sizeof(why), "%s", SF_MSG_PLATFORM_FULL);
        else if (status == -EDQUOT)
            snprintf(why, sizeof(why), SF_MSG_TEAM_FILES_FULL_FMT,
                     (long long)c->ctx->cfg.claim_team_mib);
        else
            snprintf(why, sizeof(why), SF_MSG_STORE_DOWN_LARGE_ARGS);
        sf_job_fini(job);
        free(job);
        respond_tool_error(c, why);
        call_free(c);
        return;
    }
    submit(c, job);
    free(job);
}

/* The call ends without an answer (cancelled by its client, or the client is gone): its
 * job, if any, is told to stop. */
static void call_cancel(mcp_call *c, const char *why)
{
    sf_info("msg=\"call ends unanswered\" why=%s tool=%s team=%s job=%s", why, c->tool, c->team,
            c->job[0] ? c->job : "-");
    if (c->pending)
        gw_jobs_abandon(c->ctx, c->pending);
    c->pending = NULL;
    if (c->req) {
        if (c->streaming)
            gw_req_stream_end(c->req);
        else
            gw_req_respond(c->req, 202, NULL, NULL, NULL, 0);
        c->req = NULL;
    }
    call_free(c);
}

/* A cancellation looked for on another instance (event-loop thread) of this process. */
typedef struct cancel_msg {
    gw_ctx *ctx;
    char key[SF_ID_MAX + 80];
    char team[SF_ID_MAX];
} cancel_msg;

static int cancel_here(gw_ctx *ctx, const char *key, const char *team)
{
    mcp_call *target = ctx->calls ? sf_map_get(ctx->calls, key) : NULL;

    if (!target || strcmp(target->team, team) != 0)
        return 0;
    call_cancel(target, "cancelled");
    return 1;
}

static void cancel_on_peer(evutil_socket_t fd, short what, void *arg)
{
    cancel_msg *m = arg;

    cancel_here(m->ctx, m->key, m->team);
    free(m);
}

/* notifications/cancelled: the call it names (same session) gets no answer, on whichever
 * thread of this gateway runs it. */
static void cancelled(mcp_call *c, json_t *params)
{
    json_t *rid = json_object_get(params, "requestId");
    char *id = rid ? json_dumps(rid, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    char key[SF_ID_MAX + 80];
    gw_ctx *ctx = c->ctx;

    if (!id || !c->sid[0] || strlen(id) >= 64) {
        free(id);
        return;
    }
    snprintf(key, sizeof(key), "%s|%s", c->sid, id);
    free(id);
    if (cancel_here(ctx, key, c->team))
        return;
    for (int i = 0; i < ctx->npeers; i++) {
        cancel_msg *m;
        struct timeval now = {0, 0};

        if (&ctx->peers[i] == ctx || !(m = calloc(1, sizeof(*m))))
            continue;
        m->ctx = &ctx->peers[i];
        snprintf(m->key, sizeof(m->key), "%s", key);
        snprintf(m->team, sizeof(m->team), "%s", c->team);
        if (event_base_once(m->ctx->d.base, -1, EV_TIMEOUT, cancel_on_peer, m, &now) < 0)
            free(m);
    }
}

/* ---- JSON-RPC methods ---- */

static void on_session(void *arg, int status, const char *sid)
{
    mcp_call *c = arg;
    const char *headers[3] = {"Mcp-Session-Id", sid, NULL};

    c->busy = 0;
    if (status == 507)
        respond_rpc_error(c, 507, -32603, SF_MSG_PLATFORM_FULL);
    else if (status != 200)
        respond_rpc_error(c, 503, -32603, SF_MSG_STORE_DOWN);
    else
        respond_rpc_result(
            c,
            json_pack("{s:s, s:{s:{s:b}, s:{}}, s:{s:s, s:s, s:s}, s:s}", "protocolVersion",
                      c->protocol, "capabilities", "tools", "listChanged", 0, "logging",
                      "serverInfo", "name", "sandfleet", "title", "sandfleet sandboxes",
                      "version", SERVER_VERSION, "instructions",
                      "Create a sandbox with sandbox_create, then pass its id to sandbox_exec "
                      "and the other tools. Kill it with sandbox_kill when done."),
            headers);
    call_free(c); /* responded, or the client is gone */
}

/* Negotiates the version and opens a session; answers (and frees c) when Redis has. */
static void initialize(mcp_call *c, json_t *params)
{
    const char *want = json_string_value(json_object_get(params, "protocolVersion"));

    c->protocol = protocol_versions[0];
    for (size_t i = 0; want && i < SF_ARRAY_LEN(protocol_versions); i++)
        if (!strcmp(want, protocol_versions[i]))
            c->protocol = protocol_versions[i];
    c->busy = 1;
    gw_session_create(c->ctx, c->team, c->protocol, on_session, c);
}

static void on_level_set(void *arg, int ok)
{
    mcp_call *c = arg;

    c->busy = 0;
    if (ok > 0)
        respond_fixed(c, "{}");
    else if (ok < 0)
        respond_rpc_error(c, 507, -32603, SF_MSG_PLATFORM_FULL);
    else
        respond_rpc_error(c, 503, -32603, SF_MSG_STORE_DOWN);
    call_free(c); /* responded, or the client is gone */
}

/* Answers (and frees c) once the level is kept. */
static void set_level(mcp_call *c, json_t *params, gw_session *s)
{
    int level = gw_session_level_parse(json_string_value(json_object_get(params, "level")));

    if (level < 0) {
        respond_rpc_error(c, 200, -32602, "Invalid params: 'level' must be one of debug, info, "
                                          "notice, warning, error, critical, alert, emergency.");
        call_free(c);
        return;
    }
    if (!s) {
        respond_fixed(c, "{}");
        call_free(c);
        return;
    }
    c->busy = 1;
    gw_session_set_level(c->ctx, s, level, on_level_set, c);
}

/* c->msg was parsed and checked by sf_rpc_parse (c->id is its id). */
static void dispatch(mcp_call *c, const sf_rpc_msg *rpc, gw_session *s)
{
    const char *method = rpc->method;
    json_t *params = rpc->params;

    if (rpc->kind != SF_RPC_REQUEST) { /* a notification, or a response to us */
        if (rpc->kind == SF_RPC_NOTIFICATION && !strcmp(method, "notifications/cancelled"))
            cancelled(c, params);
        respond_raw(c, 202, NULL, NULL);
        call_free(c);
        return;
    }
    if (!strcmp(method, "tools/call")) {
        tools_call(c, params);
        return;
    }
    if (!strcmp(method, "initialize")) {
        initialize(c, params);
        return;
    }
    if (!strcmp(method, "ping"))
        respond_fixed(c, "{}");
    else if (!strcmp(method, "tools/list"))
        respond_fixed_n(c, c->ctx->tools_list_text, c->ctx->tools_list_len); /* 30 KB */
    else if (!strcmp(method, "logging/setLevel")) {
        set_level(c, params, s);
        return;
    } else {
        char why[160];
        snprintf(why, sizeof(why), "Method not found: '%.64s'.", method);
        respond_rpc_error(c, 200, -32601, why);
    }
    call_free(c);
}

/* ---- HTTP entry ---- */

static void on_abort(gw_req *req, void *arg)
{
    mcp_call *c = arg;

    c->req = NULL;
    if (c->busy)
        return; /* the Redis callback frees it */
    if (c->pending && c->idem[0]) {
        /* the client may retry with its key: the job runs on, its answer is kept */
        sf_info("msg=\"client gone; its idempotent call runs on\" job=%s", c->job);
        if (c->timer) {
            event_free(c->timer);
            c->timer = NULL;
        }
        return;
    }
    if (c->pending || c->timer) {
        call_cancel(c, "client_gone");
        return;
    }
    call_free(c);
}

static void on_deleted(void *arg, int ok)
{
    mcp_call *c = arg;

    c->busy = 0;
    if (ok > 0)
        respond_raw(c, 204, NULL, NULL);
    else if (ok < 0)
        respond_rpc_error(c, 507, -32603, SF_MSG_PLATFORM_FULL);
    else
        respond_rpc_error(c, 503, -32603, SF_MSG_STORE_DOWN);
    call_free(c);
}

static void on_auth(void *arg, int status, const char *team, gw_session *sess,
                    const char *why_401)
{
    mcp_call *c = arg;
    sf_rpc_msg rpc;
    char why[256];
    const char *body;
    size_t len;
    int rc;

    c->busy = 0;
    if (!c->req) {
        call_free(c);
        return;
    }
    if (status == 401) {
        char challenge[768];
        const char *h[] = {"WWW-Authenticate", challenge, NULL};
        json_t *answer;
        char *text;

        GW_COUNT(c->ctx->metrics.unauthorized);
        gw_oauth_challenge(c->ctx, c->req, why_401, challenge, sizeof(challenge));
        sf_info("msg=\"credentials refused\" peer=%s authorization=%s req=%s", gw_req_peer(c->req),
                why_401 ? "invalid" : "missing", gw_req_id(c->req));
        /* the body says what the header says, for clients that show bodies */
        answer = json_pack("{s:s, s:s}", "error", why_401 ? "invalid_token" : "unauthorized",
                           "error_description",
                           why_401 ? why_401 : GW_WHY_MISSING_CREDENTIALS);
        text = answer ? json_dumps(answer, JSON_COMPACT) : NULL;
        respond_raw(c, 401, h, text ? text : "{\"error\":\"unauthorized\"}");
        free(text);
        json_decref(answer);
        call_free(c);
        return;
    }
    if (status == 404) {
        respond_rpc_error(c, 404, -32001, "Session not found: it was deleted, or belongs to "
                                          "another team; send initialize again without "
                                          "Mcp-Session-Id.");
        call_free(c);
        return;
    }
    if (status != 200) {
        respond_rpc_error(c, 503, -32603, SF_MSG_STORE_DOWN);
        call_free(c);
        return;
    }
    copy_str(c->team, sizeof(c->team), team);
    if (sess) {
        copy_str(c->sid, sizeof(c->sid), sess->id);
        c->level = sess->level;
    }
    if (!strcmp(gw_req_method(c->req), "DELETE")) {
        c->busy = 1; /* answered when the tombstone is written */
        gw_session_delete(c->ctx, c->team, gw_req_header(c->req, "Mcp-Session-Id"), on_deleted, c);
        return;
    }
    body = gw_req_body(c->req, &len);
    rc = sf_rpc_parse(body, len, &rpc, why, sizeof(why));
    c->msg = rpc.msg; /* the call owns the message from here */
    c->id = rpc.id;
    if (rc < 0) {
        respond_rpc_error(c, rc == SF_RPC_INVALID_PARAMS ? 200 : 400, rc, why);
        call_free(c);
        return;
    }
    dispatch(c, &rpc, sess);
}

static int origin_allowed(const gw_ctx *ctx, const char *origin)
{
    static const char *const local[] = {"http://localhost", "http://127.0.0.1", "http://[::1]",
                                        "https://localhost", "https://127.0.0.1"};
    size_t n = strlen(origin);
    const char *p = ctx->cfg.allowed_origins;

    for (size_t i = 0; i < SF_ARRAY_LEN(local); i++) {
        size_t l = strlen(local[i]);
        if (!strncmp(origin, local[i], l) && (origin[l] == '\0' || origin[l] == ':'))
            return 1;
    }
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t l = comma ? (size_t)(comma - p) : strlen(p);
        if (l == n && !strncmp(p, origin, n))
            return 1;
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

/* strcasestr(hay, needle) != NULL for a short lowercase needle: glibc's two-way search
 * sets up a factorization per call, which cost more than the match itself here. */
static int ci_contains(const char *hay, const char *needle)
{
    size_t n = strlen(needle);

    for (; *hay; hay++)
        if ((*hay | 0x20) == needle[0] && !strncasecmp(hay, needle, n))
            return 1;
    return 0;
}

static void simple(gw_req *req, int status, const char *const *headers, const char *body)
{
    gw_req_respond(req, status, body ? "application/json" : NULL, headers, body,
                   body ? strlen(body) : 0);
}

static void not_found(gw_req *req, void *arg)
{
    simple(req, 404, NULL, "{\"error\":\"Not found: the MCP endpoint is /mcp.\"}");
}

int gw_routes_add(gw_ctx *ctx)
{
    if (gw_router_add(ctx->router, NULL, "/mcp", gw_mcp_handle, ctx) < 0 ||
        gw_router_add(ctx->router, NULL, "/mcp/", gw_mcp_handle, ctx) < 0 || /* /mcp/NAME */
        gw_hosted_routes(ctx) < 0 || gw_metrics_routes(ctx) < 0 || gw_oauth_routes(ctx) < 0)
        return -ENOMEM;
    gw_router_fallback(ctx->router, not_found, ctx);
    return 0;
}

/* The resource an OAuth access token must name (RFC 8707); an API key names none, so the
 * hot path of a key formats no URL. */
static const char *token_resource(gw_ctx *ctx, gw_req *req, char *buf, size_t n)
{
    const char *a = gw_req_header(req, "Authorization");

    if (!a || !strstr(a, SF_OAUTH_AT_PREFIX))
        return "";
    gw_oauth_resource(ctx, req, buf, n);
    return buf;
}

/* ---- the head check: the key before any body ---- */

typedef struct head_op {
    gw_ctx *ctx;
    gw_req *req; /* NULL once the client left */
} head_op;

static void head_abort(gw_req *req, void *arg)
{
    ((head_op *)arg)->req = NULL; /* the key lookup finishes alone */
}

static void head_checked(void *arg, int status, const char *team, gw_session *sess,
                         const char *why_401)
{
    head_op *op = arg;

    if (op->req) {
        if (status == 401)
            GW_COUNT(op->ctx->metrics.unauthorized);
        /* the transport adds WWW-Authenticate (gw_oauth_challenge_fn) */
        gw_req_head_verdict(op->req, status == 200 ? 0 : status,
                            status == 401 ? (why_401 ? why_401 : GW_WHY_MISSING_CREDENTIALS)
                                          : SF_MSG_STORE_DOWN);
    }
    free(op);
}

void gw_mcp_head_check(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    char resource[300];
    head_op *op;

    if (strcmp(gw_req_path(req), "/mcp") != 0 && strncmp(gw_req_path(req), "/mcp/", 5) != 0) {
        gw_req_head_verdict(req, 0, NULL);
        return;
    }
    if (!(op = calloc(1, sizeof(*op)))) {
        gw_req_head_verdict(req, 503, SF_MSG_SERVER_NOMEM);
        return;
    }
    op->ctx = ctx;
    op->req = req;
    gw_req_set_abort_cb(req, head_abort, op);
    gw_auth_check(ctx, gw_req_header(req, "Authorization"), NULL, NULL,
                  token_resource(ctx, req, resource, sizeof(resource)), head_checked, op);
}

void gw_mcp_handle(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    const char *method = gw_req_method(req);
    const char *origin = gw_req_header(req, "Origin");
    const char *pv = gw_req_header(req, "MCP-Protocol-Version");
    const char *ctype = gw_req_header(req, "Content-Type");
    const char *accept = gw_req_header(req, "Accept");
    static const char *const allow[] = {"Allow", "POST, DELETE", NULL};
    char resource[300];
    mcp_call *c;

    if (origin && !origin_allowed(ctx, origin)) {
        simple(req, 403, NULL, "{\"error\":\"Origin not allowed; add it to allowed_origins.\"}");
        return;
    }
    if (gw_hosted_wanted(req)) { /* a team's own MCP server (hosted.c) */
        gw_hosted_handle(req, ctx);
        return;
    }
    if (!strcmp(method, "GET") || !strcmp(method, "HEAD")) {
        simple(req, 405, allow, "{\"error\":\"This server sends no server-initiated stream; "
                                "POST JSON-RPC messages to /mcp.\"}");
        return;
    }
    if (!strcmp(method, "DELETE") && !sf_id_valid(gw_req_header(req, "Mcp-Session-Id"))) {
        simple(req, 400, NULL, "{\"error\":\"DELETE ends a session: send its Mcp-Session-Id.\"}");
        return;
    }
    if (strcmp(method, "POST") != 0 && strcmp(method, "DELETE") != 0) {
        simple(req, 405, allow, "{\"error\":\"Use POST (or DELETE to end a session).\"}");
        return;
    }
    if (pv) {
        int ok = 0;
        for (size_t i = 0; i < SF_ARRAY_LEN(protocol_versions); i++)
            ok |= !strcmp(pv, protocol_versions[i]);
        if (!ok) {
            simple(req, 400, NULL, "{\"error\":\"Unsupported MCP-Protocol-Version; this server "
                                   "speaks 2025-11-25, 2025-06-18, 2025-03-26 and 2024-11-05.\"}");
            return;
        }
    }
    if (!strcmp(method, "POST") && accept && !ci_contains(accept, "application/json") &&
        !strstr(accept, "*/*")) {
        simple(req, 406, NULL, "{\"error\":\"This server answers with application/json; accept "
                               "it (Accept: application/json, text/event-stream).\"}");
        return;
    }
    if (!strcmp(method, "POST") && ctype && !ci_contains(ctype, "application/json")) {
        simple(req, 415, NULL, "{\"error\":\"Send the JSON-RPC message as application/json.\"}");
        return;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
        simple(req, 503, NULL, SF_MSG_OOM_JSON);
        return;
    }
    c->ctx = ctx;
    c->req = req;
    c->t0 = sf_mono_us();
    c->busy = 1;
    c->level = GW_LOG_LEVEL_DEFAULT;
    c->sse_ok = accept && ci_contains(accept, "text/event-stream");
    gw_req_set_abort_cb(req, on_abort, c);
    gw_auth_check(ctx, gw_req_header(req, "Authorization"), gw_req_header(req, "Mcp-Session-Id"),
                  pv, token_resource(ctx, req, resource, sizeof(resource)), on_auth, c);
}
