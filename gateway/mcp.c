/* mcp.c: MCP Streamable HTTP (JSON responses) on POST /mcp: JSON-RPC framing,
 * initialize / ping / tools/list / tools/call, sessions, and the mapping of job
 * replies to CallToolResult. */
#include "gateway.h"
#include "sf_jobio.h"
#include "sf_jsonrpc.h"
#include "sf_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SERVER_VERSION "0.1.0"

static const char *const protocol_versions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                                 "2024-11-05"};

typedef struct mcp_call {
    gw_ctx *ctx;
    gw_req *req;           /* NULL once the client is gone */
    json_t *msg;           /* the JSON-RPC request */
    json_t *id;            /* its id (borrowed from msg) */
    gw_pending *pending;   /* the job we wait for */
    int busy;              /* a Redis operation is in flight: its callback frees the call */
    const char *protocol;  /* initialize: the version agreed (static) */
    uint64_t t0;
    char team[SF_ID_MAX];
    char tool[SF_ID_MAX];
} mcp_call;

static void call_free(mcp_call *c)
{
    json_decref(c->msg);
    free(c);
}

/* ---- HTTP answers ---- */

static void respond_raw(mcp_call *c, int status, const char *const *headers, const char *body)
{
    if (c->req)
        gw_req_respond(c->req, status, body ? "application/json" : NULL, headers, body,
                       body ? strlen(body) : 0);
    c->req = NULL;
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
    respond_raw(c, status, headers, text ? text : "{}");
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

/* ---- tools/call ---- */

static void on_job_reply(void *arg, const sf_reply *r)
{
    mcp_call *c = arg;
    json_t *result;
    char *text;

    c->pending = NULL;
    if (!r) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "The call got no answer in time (%s); the platform may be busy. Check the "
                 "sandbox with sandbox_info, then retry.", c->tool);
        respond_tool_error(c, msg);
    } else if (r->kind == SF_REPLY_ERROR) {
        respond_tool_error(c, r->message ? r->message : "The call failed.");
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
    sf_info("msg=\"call done\" tool=%s team=%s ok=%d us=%llu", c->tool, c->team,
            r && r->kind == SF_REPLY_RESULT, (unsigned long long)(sf_mono_us() - c->t0));
    call_free(c);
}

static int64_t call_wait_ms(const gw_ctx *ctx, const char *tool, json_t *args)
{
    if (!strcmp(tool, "sandbox_exec"))
        return sf_exec_timeout_ms(args) + ctx->cfg.exec_deadline_margin_ms;
    return ctx->cfg.call_deadline_ms;
}

static void tools_call(mcp_call *c, json_t *params)
{
    gw_ctx *ctx = c->ctx;
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *args = json_object_get(params, "arguments");
    char why[512];
    sf_job job;
    int rc;

    if (!name) {
        respond_rpc_error(c, 200, -32602, "Invalid params: 'name' (the tool name) is required.");
        goto done;
    }
    if (!sf_toolset_find(&ctx->tools, name)) {
        snprintf(why, sizeof(why), "Unknown tool '%.64s'; call tools/list to see the tools.", name);
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
    sf_job_init(&job);
    snprintf(job.team, sizeof(job.team), "%s", c->team);
    snprintf(job.tool, sizeof(job.tool), "%s", name);
    snprintf(c->tool, sizeof(c->tool), "%s", name);
    job.args = args;
    if (!strcmp(name, "sandbox_create")) {
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
    rc = gw_jobs_submit(ctx, &job, call_wait_ms(ctx, name, args), on_job_reply, c, &c->pending);
    sf_debug("msg=\"call\" job=%s tool=%s team=%s sandbox=%s rc=%d", job.id, name, c->team,
             job.sandbox, rc);
    sf_job_fini(&job);
    if (rc == 0)
        return; /* on_job_reply answers */
    if (rc == -EMSGSIZE)
        snprintf(why, sizeof(why), "The arguments are too large for one call (over 1 MiB "
                 "encoded); put large inputs in a file in the sandbox first, in smaller calls.");
    else if (rc == -EDQUOT)
        snprintf(why, sizeof(why), "Your team has %lld calls in flight, the most this gateway "
                 "runs at once; wait for some to finish, then retry.",
                 (long long)ctx->cfg.max_pending_team);
    else
        snprintf(why, sizeof(why), "%s", rc == -E2BIG ? "Too many calls are in flight on this "
                 "gateway; retry in a few seconds." : "The job queue is unavailable; retry in a "
                 "few seconds.");
    respond_tool_error(c, why);
done:
    call_free(c);
}

/* ---- JSON-RPC methods ---- */

static void on_session(void *arg, int status, const char *sid)
{
    mcp_call *c = arg;
    const char *headers[3] = {"Mcp-Session-Id", sid, NULL};

    c->busy = 0;
    if (status == 429)
        respond_rpc_error(c, 429, -32000, "Your team has too many open MCP sessions; close idle "
                                          "clients (they end their sessions) or retry later.");
    else if (status != 200)
        respond_rpc_error(c, 503, -32603, "The session store is unavailable; retry shortly.");
    else
        respond_rpc_result(
            c,
            json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:s}", "protocolVersion",
                      c->protocol, "capabilities", "tools", "listChanged", 0, "serverInfo",
                      "name", "sandfleet", "title", "sandfleet sandboxes", "version",
                      SERVER_VERSION, "instructions",
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

/* c->msg was parsed and checked by sf_rpc_parse (c->id is its id). */
static void dispatch(mcp_call *c, const sf_rpc_msg *rpc)
{
    const char *method = rpc->method;
    json_t *params = rpc->params;

    if (rpc->kind != SF_RPC_REQUEST) { /* a notification, or a response to us */
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
        respond_rpc_result(c, json_object(), NULL);
    else if (!strcmp(method, "tools/list"))
        respond_rpc_result(c, json_incref(c->ctx->tools_list), NULL);
    else {
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
    gw_jobs_cancel(c->ctx, c->pending);
    call_free(c);
}

static void on_auth(void *arg, int status, const char *team)
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
        static const char *const h[] = {
            "WWW-Authenticate",
            "Bearer realm=\"sandfleet\", error=\"invalid_token\", error_description=\"Send a "
            "valid sandfleet API key as Authorization: Bearer sf_live_...\"",
            NULL};
        sf_info("msg=\"API key refused\" peer=%s authorization=%s", gw_req_peer(c->req),
                gw_req_header(c->req, "Authorization") ? "invalid" : "missing");
        respond_raw(c, 401, h,
                    "{\"error\":\"Missing or invalid API key: send Authorization: Bearer "
                    "sf_live_... (create one with: sandfleet keys create --team NAME).\"}");
        call_free(c);
        return;
    }
    if (status == 404) {
        respond_rpc_error(c, 404, -32001, "Session not found: it expired or was deleted; "
                                          "send initialize again without Mcp-Session-Id.");
        call_free(c);
        return;
    }
    if (status != 200) {
        respond_rpc_error(c, 503, -32603, "The platform's state store is unreachable; retry "
                                          "in a few seconds.");
        call_free(c);
        return;
    }
    snprintf(c->team, sizeof(c->team), "%s", team);
    if (!strcmp(gw_req_method(c->req), "DELETE")) {
        gw_session_delete(c->ctx, c->team, gw_req_header(c->req, "Mcp-Session-Id"));
        respond_raw(c, 204, NULL, NULL);
        call_free(c);
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
    dispatch(c, &rpc);
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

static void simple(gw_req *req, int status, const char *const *headers, const char *body)
{
    gw_req_respond(req, status, body ? "application/json" : NULL, headers, body,
                   body ? strlen(body) : 0);
}

static void health(gw_req *req, void *arg)
{
    gw_ctx *ctx = arg;
    int up = sf_redis_connected(ctx->redis);

    simple(req, up ? 200 : 503, NULL, up ? "{\"status\":\"ok\"}" : "{\"status\":\"redis unreachable\"}");
}

static void not_found(gw_req *req, void *arg)
{
    simple(req, 404, NULL, "{\"error\":\"Not found: the MCP endpoint is /mcp.\"}");
}

int gw_routes_add(gw_ctx *ctx)
{
    if (gw_router_add(ctx->router, NULL, "/mcp", gw_mcp_handle, ctx) < 0 ||
        gw_router_add(ctx->router, "GET", "/healthz", health, ctx) < 0)
        return -ENOMEM;
    gw_router_fallback(ctx->router, not_found, ctx);
    return 0;
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
    mcp_call *c;

    if (origin && !origin_allowed(ctx, origin)) {
        simple(req, 403, NULL, "{\"error\":\"Origin not allowed; add it to allowed_origins.\"}");
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
    if (!strcmp(method, "POST") && accept && !strcasestr(accept, "application/json") &&
        !strstr(accept, "*/*")) {
        simple(req, 406, NULL, "{\"error\":\"This server answers with application/json; accept "
                               "it (Accept: application/json, text/event-stream).\"}");
        return;
    }
    if (!strcmp(method, "POST") && ctype && !strcasestr(ctype, "application/json")) {
        simple(req, 415, NULL, "{\"error\":\"Send the JSON-RPC message as application/json.\"}");
        return;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
        simple(req, 503, NULL, "{\"error\":\"Out of memory; retry.\"}");
        return;
    }
    c->ctx = ctx;
    c->req = req;
    c->t0 = sf_mono_us();
    c->busy = 1;
    gw_req_set_abort_cb(req, on_abort, c);
    gw_auth_check(ctx, gw_req_header(req, "Authorization"), gw_req_header(req, "Mcp-Session-Id"),
                  on_auth, c);
}
