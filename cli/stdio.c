/* stdio.c: `sandfleet mcp-stdio [URL]` — a stdio MCP server that forwards every message
 * to a sandfleet gateway (MCP Streamable HTTP) with the key from SANDFLEET_API_KEY.
 *
 * One libevent loop: the client's newline-delimited JSON-RPC on stdin becomes one POST
 * each (libcurl multi, HTTP/2 over TLS when the gateway offers it, h2c with --http2);
 * answers come back as JSON or as an SSE stream whose messages (progress notifications,
 * then the response) are written to stdout as they arrive. A client's
 * notifications/cancelled is forwarded, and the cancelled call's HTTP exchange is dropped
 * after a grace period. A session the gateway forgot (404) is re-opened with the client's
 * own initialize and the call retried once. Every request gets exactly one answer: the
 * gateway's, or a JSON-RPC error whose message says what failed and what to do (also
 * printed on stderr). Buffers are bounded; a stdout the client does not read pauses the
 * transfers, and too many calls in flight pause reading stdin. */
#include "cli.h"
#include "sf_curl.h"
#include "sf_buf.h"
#include "sf_util.h"
#include "sse.h"

#include <errno.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define LINE_MAX_BYTES (32u << 20) /* one message from the client */
#define MSG_MAX (64u << 20)        /* one message (or SSE line/event) from the gateway */
#define READ_CHUNK 65536
#define OUT_HIGH (16u << 20)       /* stdout backlog that pauses the transfers */
#define MAX_INFLIGHT 64            /* client requests awaiting answers before stdin pauses */
#define CANCEL_GRACE_MS 2000       /* a cancelled call's exchange is dropped after this */
#define RESUME_MAX 3               /* SSE stream resumptions (Last-Event-ID) per call */
#define CONNECT_TIMEOUT_MS 10000
#define DEFAULT_TIMEOUT_S 900      /* longest exec (600 s) + the gateway's margin, and more */
#define RPC_BRIDGE_ERROR (-32000)

static const char usage[] =
    "usage: sandfleet mcp-stdio [URL] [--http2] [--cacert FILE] [--timeout SECONDS] [-v]\n"
    "  A stdio MCP server for clients that only start local servers (Claude Desktop, ...):\n"
    "  it forwards every message to the sandfleet gateway at URL.\n"
    "  URL      default: $SANDFLEET_URL, else SF_URL from $SF_HOME/env, else " CLI_DEFAULT_URL "\n"
    "  key      $SANDFLEET_API_KEY (create one with: sandfleet keys create --team NAME)\n"
    "  --http2  HTTP/2 without TLS (h2c prior knowledge); https:// URLs use HTTP/2 when the\n"
    "           gateway offers it (ALPN), HTTP/1.1 otherwise\n"
    "  --cacert FILE   trust this CA bundle for an https:// gateway\n"
    "  --timeout S     the longest one call may take (default 900)\n"
    "  -v       log each message's method and HTTP status on stderr\n";

enum kind {
    K_CLIENT,      /* a message from the client */
    K_REINIT,      /* our initialize, re-opening a session the gateway forgot */
    K_REINIT_NOTE, /* the notifications/initialized that follows it */
    K_GET,         /* the server-initiated SSE stream (GET) */
    K_DELETE,      /* ending the session at exit */
};

enum get_state { GET_CLOSED, GET_OPEN, GET_UNSUPPORTED, GET_WAITING };

typedef struct req req;

typedef struct bridge {
    struct event_base *base;
    sf_curl *http;
    struct event *in_ev, *out_ev, *sigint_ev, *sigterm_ev, *get_timer;
    struct evbuffer *out;
    sf_buf in;              /* bytes read from stdin, not yet handled */
    int discarding;         /* skipping the rest of an over-long line */
    int in_eof, in_paused, in_pollable, out_pollable;
    int in_flags, out_flags; /* the fds' flags before we made them non-blocking */
    const char *url, *key, *cacert;
    long http_version, timeout_ms;
    int verbose;
    char session[256];      /* Mcp-Session-Id, "" when none */
    char protocol[32];      /* the MCP version agreed at initialize */
    char *init_body;        /* the client's initialize request, to re-open a session */
    int init_running;       /* the client's initialize is on its way: hold the rest */
    int reinit_running, reinit_seq;
    enum get_state get;
    long get_backoff_ms;
    req *reqs;              /* exchanges in flight */
    req *waiting;           /* held until the session is re-opened */
    int inflight;           /* client requests without an answer yet */
    int npaused;            /* transfers paused by a full stdout */
    int stopping;           /* SIGTERM/SIGINT, or stdout closed */
    int out_closed;         /* stdout failed: nothing more is written */
    int warned_no_key;
} bridge;

struct req {
    bridge *b;
    enum kind kind;
    CURL *easy;
    struct curl_slist *hdrs;
    char *body;             /* what is POSTed (owned) */
    size_t body_len;
    json_t *id;             /* the request's id; NULL for notifications and responses */
    char method[96];
    int is_init;            /* the client's initialize */
    int mode;               /* 0 undecided, 1 a JSON body, 2 an SSE stream */
    sf_buf resp;            /* the JSON body */
    cli_sse sse;
    char sent_session[256]; /* the session this exchange was sent with */
    char new_session[256];  /* Mcp-Session-Id of the answer */
    char www_auth[512];
    char last_event_id[256];
    long retry_ms;
    int answered, cancelled, paused, resumes, retried, counted;
    char abort_why[300];    /* why a callback stopped the transfer */
    struct event *timer;    /* cancel grace, or the delay before resuming */
    char errbuf[CURL_ERROR_SIZE];
    req *next;
};

static void start(req *r);
static void finish(req *r);
static void maybe_exit(bridge *b);
static void open_get(bridge *b);
static void drain_lines(bridge *b);
static void stop(bridge *b);

/* ---- logging (stderr: the client shows or logs it) ---- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    fputs("sandfleet mcp-stdio: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

#define debug(b, ...)                                                                          \
    do {                                                                                       \
        if ((b)->verbose)                                                                      \
            say(__VA_ARGS__);                                                                  \
    } while (0)

/* ---- stdout ---- */

static void out_flush(bridge *b)
{
    while (evbuffer_get_length(b->out) > 0) {
        int n = evbuffer_write(b->out, STDOUT_FILENO);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (b->out_pollable)
                event_add(b->out_ev, NULL);
            return;
        }
        if (n <= 0) {
            if (errno == EINTR)
                continue;
            /* The client is gone. This may run inside a libcurl callback, so only mark it:
             * the loop ends and the clean-up after it frees the rest. */
            say("stdout is closed (%s); stopping.", n < 0 ? strerror(errno) : "no progress");
            evbuffer_drain(b->out, evbuffer_get_length(b->out));
            b->out_closed = 1;
            event_base_loopexit(b->base, NULL);
            return;
        }
    }
}

static void resume_transfers(bridge *b)
{
    if (b->npaused == 0 || evbuffer_get_length(b->out) > OUT_HIGH / 2)
        return;
    for (req *r = b->reqs; r; r = r->next)
        if (r->paused) {
            r->paused = 0;
            b->npaused--;
            curl_easy_pause(r->easy, CURLPAUSE_CONT); /* may deliver data right away */
        }
}

static void on_stdout_writable(evutil_socket_t fd, short what, void *arg)
{
    bridge *b = arg;

    out_flush(b);
    resume_transfers(b);
    maybe_exit(b);
}

/* Writes one message as one line: JSON text has no raw CR/LF outside whitespace, so
 * turning them into spaces keeps it the same JSON. */
static void emit(bridge *b, const char *p, size_t n)
{
    char *line;
    struct evbuffer_iovec v;

    if (b->out_closed)
        return;
    if (evbuffer_reserve_space(b->out, (ev_ssize_t)n + 1, &v, 1) < 1) {
        say("out of memory writing a message; it is lost.");
        return;
    }
    line = v.iov_base;
    for (size_t i = 0; i < n; i++)
        line[i] = (p[i] == '\n' || p[i] == '\r') ? ' ' : p[i];
    line[n] = '\n';
    v.iov_len = n + 1;
    evbuffer_commit_space(b->out, &v, 1);
    out_flush(b);
}

static void emit_json(bridge *b, json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT);

    if (text) {
        emit(b, text, strlen(text));
        free(text);
    }
    json_decref(msg);
}

static void emit_error(bridge *b, json_t *id, int code, const char *message, long http_status)
{
    json_t *err = json_pack("{s:i, s:s}", "code", code, "message", message);

    if (err && http_status > 0)
        json_object_set_new(err, "data", json_pack("{s:i}", "http_status", (int)http_status));
    if (err)
        emit_json(b, json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(),
                               "error", err));
}

/* The one answer of a client request that the gateway did not answer. */
static void answer_error(req *r, const char *message, long http_status)
{
    if (r->kind != K_CLIENT || !r->id || r->answered || r->cancelled)
        return;
    r->answered = 1;
    say("%s (%s)", message, r->method);
    emit_error(r->b, r->id, RPC_BRIDGE_ERROR, message, http_status);
}

/* ---- exchanges ---- */

static req *req_new(bridge *b, enum kind kind, const char *body, size_t len)
{
    req *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    r->b = b;
    r->kind = kind;
    r->retry_ms = -1;
    sf_buf_init(&r->resp, MSG_MAX);
    cli_sse_init(&r->sse, MSG_MAX);
    if (body && !(r->body = malloc(len + 1))) {
        sf_buf_fini(&r->resp);
        free(r);
        return NULL;
    }
    if (body) {
        memcpy(r->body, body, len);
        r->body[len] = '\0';
        r->body_len = len;
    }
    return r;
}

static void unlink_req(req **list, req *r)
{
    for (req **pp = list; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            r->next = NULL;
            return;
        }
}

/* Back to "not sent": for a retry or a resumption. */
static void req_reset(req *r)
{
    bridge *b = r->b;

    sf_curl_remove(b->http, r->easy);
    if (r->paused) {
        r->paused = 0;
        b->npaused--;
    }
    if (r->easy)
        curl_easy_cleanup(r->easy);
    r->easy = NULL;
    curl_slist_free_all(r->hdrs);
    r->hdrs = NULL;
    r->mode = 0;
    sf_buf_reset(&r->resp);
    cli_sse_fini(&r->sse);
    cli_sse_init(&r->sse, MSG_MAX);
    r->new_session[0] = r->www_auth[0] = r->abort_why[0] = r->errbuf[0] = '\0';
}

static void req_free(req *r)
{
    bridge *b;

    if (!r)
        return;
    b = r->b;
    unlink_req(&b->reqs, r);
    unlink_req(&b->waiting, r);
    req_reset(r);
    if (r->counted)
        b->inflight--;
    if (r->timer)
        event_free(r->timer);
    sf_buf_fini(&r->resp);
    cli_sse_fini(&r->sse);
    json_decref(r->id);
    free(r->body);
    free(r);
}

/* ---- what the gateway sends ---- */

static int same_id(json_t *a, json_t *b)
{
    return a && b && json_equal(a, b);
}

/* One JSON-RPC message from the gateway (a JSON body, or one SSE event). */
static void server_message(req *r, const char *data, size_t len)
{
    bridge *b = r->b;
    json_error_t jerr;
    json_t *msg = json_loadb(data, len, 0, &jerr);
    int is_response;

    if (!msg) {
        char why[300];
        snprintf(why, sizeof(why), "The gateway sent a message that is not JSON (%s); retry, "
                 "and report it if it persists.", jerr.text);
        if (r->mode == 2)
            say("%s", why); /* one event of a stream: the stream goes on */
        else
            answer_error(r, why, 0);
        return;
    }
    is_response = json_is_object(msg) && !json_object_get(msg, "method") &&
                  (json_object_get(msg, "result") || json_object_get(msg, "error"));
    if (is_response && same_id(json_object_get(msg, "id"), r->id)) {
        json_t *pv = json_object_get(json_object_get(msg, "result"), "protocolVersion");
        if ((r->is_init || r->kind == K_REINIT) && json_is_string(pv))
            snprintf(b->protocol, sizeof(b->protocol), "%s", json_string_value(pv));
        if ((r->is_init || r->kind == K_REINIT) && json_object_get(msg, "result"))
            snprintf(b->session, sizeof(b->session), "%s", r->new_session);
        if (r->kind == K_REINIT || r->cancelled || r->answered) {
            r->answered = 1;
            json_decref(msg);
            return; /* ours, or the client gave up on it */
        }
        r->answered = 1;
    } else if (r->kind == K_REINIT) {
        json_decref(msg);
        return;
    }
    json_decref(msg);
    emit(b, data, len);
}

static int on_sse_event(void *arg, const char *type, const char *data, size_t len, const char *id)
{
    req *r = arg;

    snprintf(r->last_event_id, sizeof(r->last_event_id), "%s", id);
    if (r->sse.retry_ms >= 0)
        r->retry_ms = r->sse.retry_ms;
    if (strcmp(type, "message") != 0 || len == 0)
        return 0; /* other event types and empty (priming) events carry no JSON-RPC */
    server_message(r, data, len);
    return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    req *r = arg;
    bridge *b = r->b;
    size_t len = size * n;
    int rc;

    if (r->mode == 0) {
        long status = 0;
        char *ctype = NULL;
        curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_getinfo(r->easy, CURLINFO_CONTENT_TYPE, &ctype);
        r->mode = status == 200 && ctype && !strncasecmp(ctype, "text/event-stream", 17) ? 2 : 1;
    }
    if (r->mode == 2 && evbuffer_get_length(b->out) > OUT_HIGH) {
        if (!r->paused) {
            r->paused = 1;
            b->npaused++;
        }
        return CURL_WRITEFUNC_PAUSE; /* resume_transfers() lets it go on */
    }
    if (r->mode == 1)
        rc = sf_buf_append(&r->resp, p, len);
    else
        rc = cli_sse_feed(&r->sse, p, len, on_sse_event, r);
    if (rc == 0 && r->answered && r->resumes > 0)
        return 0; /* a resumed stream may stay open after the answer: done with it */
    if (rc < 0) {
        snprintf(r->abort_why, sizeof(r->abort_why),
                 "The gateway's answer is larger than this bridge accepts (%u MiB per message); "
                 "ask for less at once (e.g. smaller files or outputs).", MSG_MAX >> 20);
        return 0; /* aborts the transfer: on_done() answers */
    }
    return len;
}

static void header_value(const char *p, size_t n, const char *name, char *out, size_t outlen)
{
    size_t nl = strlen(name);

    if (n <= nl + 1 || strncasecmp(p, name, nl) != 0 || p[nl] != ':')
        return;
    p += nl + 1;
    n -= nl + 1;
    while (n > 0 && (*p == ' ' || *p == '\t')) {
        p++;
        n--;
    }
    while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == '\n' || p[n - 1] == ' '))
        n--;
    snprintf(out, outlen, "%.*s", (int)(n < outlen ? n : outlen - 1), p);
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    req *r = arg;
    size_t len = size * n;

    header_value(p, len, "Mcp-Session-Id", r->new_session, sizeof(r->new_session));
    header_value(p, len, "WWW-Authenticate", r->www_auth, sizeof(r->www_auth));
    return len;
}

/* A sentence from an error answer: a JSON-RPC error message, {"error": ...},
 * {"error_description": ...}, or WWW-Authenticate's error_description. */
static void error_text(req *r, json_t *body, char *out, size_t outlen)
{
    json_t *e = json_object_get(body, "error");
    const char *s = json_string_value(json_object_get(e, "message"));
    const char *d;

    if (!s)
        s = json_string_value(json_object_get(body, "error_description"));
    if (!s)
        s = json_string_value(e);
    if (s) {
        snprintf(out, outlen, "%s", s);
        return;
    }
    if ((d = strstr(r->www_auth, "error_description=\""))) {
        const char *end = strchr(d + 19, '"');
        snprintf(out, outlen, "%.*s", end ? (int)(end - d - 19) : 200, d + 19);
        return;
    }
    snprintf(out, outlen, "%s", "no explanation came with it");
}

/* "." unless the sentence has its end already. */
static const char *sentence_end(const char *s)
{
    size_t n = strlen(s);
    return n > 0 && (s[n - 1] == '.' || s[n - 1] == '!' || s[n - 1] == '?') ? "" : ".";
}

static void http_error(req *r, long status)
{
    bridge *b = r->b;
    json_t *body = r->resp.len ? json_loadb(r->resp.p, r->resp.len, 0, NULL) : NULL;
    json_t *err = json_object_get(body, "error");
    char text[600], why[1000];

    if (json_is_object(err) && json_is_integer(json_object_get(err, "code")) && r->id &&
        !r->answered && !r->cancelled && r->kind == K_CLIENT && status != 401) {
        /* a JSON-RPC error (400 parse error, 429 too many sessions, ...): the client's own */
        json_object_set(body, "id", r->id);
        r->answered = 1;
        error_text(r, body, text, sizeof(text));
        say("the gateway answered HTTP %ld: %s (%s)", status, text, r->method);
        emit_json(b, body);
        return;
    }
    error_text(r, body, text, sizeof(text));
    json_decref(body);
    if (status == 401 || status == 403)
        snprintf(why, sizeof(why), "The gateway refused the API key (HTTP %ld): %s%s Put a valid "
                 "key of your team in SANDFLEET_API_KEY, in this server's environment, and restart "
                 "the client.", status, text, sentence_end(text));
    else if (status >= 500)
        snprintf(why, sizeof(why), "The gateway failed (HTTP %ld): %s%s Retry in a few seconds, "
                 "and check its log if it persists.", status, text, sentence_end(text));
    else
        snprintf(why, sizeof(why), "The gateway refused the message (HTTP %ld): %s%s", status,
                 text, sentence_end(text));
    if (r->kind == K_CLIENT && r->id)
        answer_error(r, why, status);
    else
        say("%s (%s)", why, r->kind == K_CLIENT ? r->method : "session");
}

/* ---- session re-opening ---- */

/* Sends what was held while a session was being opened (or answers it with why). */
static void release_waiting(bridge *b, const char *why)
{
    req *w, *held = NULL;

    while ((w = b->waiting)) { /* oldest first */
        b->waiting = w->next;
        w->next = held;
        held = w;
    }
    while ((w = held)) {
        held = w->next;
        w->next = NULL;
        if (why) {
            answer_error(w, why, 0);
            finish(w);
        } else {
            start(w);
        }
    }
}

static void reinit_done(bridge *b, const char *why)
{
    b->reinit_running = 0;
    if (!why) {
        static const char note[] = "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}";
        req *n = req_new(b, K_REINIT_NOTE, note, sizeof(note) - 1);
        say("the gateway had lost the session; a new one is open.");
        if (n) {
            snprintf(n->method, sizeof(n->method), "notifications/initialized");
            start(n);
        }
    }
    release_waiting(b, why);
    if (!why && b->get == GET_CLOSED)
        open_get(b);
}

static void start_reinit(bridge *b)
{
    json_t *msg;
    char id[64];
    char *body;
    req *r;

    if (b->reinit_running)
        return;
    b->session[0] = '\0';
    msg = b->init_body ? json_loads(b->init_body, 0, NULL) : NULL;
    snprintf(id, sizeof(id), "sandfleet-mcp-stdio-reinit-%d", ++b->reinit_seq);
    if (msg)
        json_object_set_new(msg, "id", json_string(id));
    body = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    r = body ? req_new(b, K_REINIT, body, strlen(body)) : NULL;
    free(body);
    json_decref(msg);
    if (!r) {
        b->reinit_running = 1; /* reinit_done() clears it */
        reinit_done(b, "The gateway lost the MCP session and it could not be re-opened; restart "
                       "the client.");
        return;
    }
    r->id = json_string(id);
    snprintf(r->method, sizeof(r->method), "initialize");
    b->reinit_running = 1;
    start(r);
}

/* The gateway answered 404 to a message sent in a session: hold it, re-open, resend. */
static int retry_in_new_session(req *r, long status)
{
    bridge *b = r->b;

    if (status != 404 || !r->sent_session[0] || r->retried || !b->init_body ||
        (r->kind != K_CLIENT && r->kind != K_REINIT_NOTE && r->kind != K_GET))
        return 0;
    r->retried = 1;
    unlink_req(&b->reqs, r);
    req_reset(r);
    if (r->kind == K_GET) { /* reopened by reinit_done() */
        b->get = GET_CLOSED;
        req_free(r);
        start_reinit(b);
        return 1;
    }
    if (b->session[0] && strcmp(b->session, r->sent_session) != 0) {
        start(r); /* already re-opened by another call */
        return 1;
    }
    r->next = b->waiting;
    b->waiting = r;
    start_reinit(b);
    return 1;
}

/* ---- the server-initiated stream (GET) ---- */

static void on_get_timer(evutil_socket_t fd, short what, void *arg)
{
    bridge *b = arg;

    if (b->get == GET_WAITING)
        b->get = GET_CLOSED;
    open_get(b);
}

static void get_again_later(bridge *b, long ms)
{
    struct timeval tv;

    if (ms < 0) {
        ms = b->get_backoff_ms;
        b->get_backoff_ms = b->get_backoff_ms < 15000 ? b->get_backoff_ms * 2 : 30000;
    }
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    b->get = GET_WAITING;
    evtimer_add(b->get_timer, &tv);
}

static void open_get(bridge *b)
{
    req *r;

    if (b->get != GET_CLOSED || !b->session[0] || b->stopping || b->in_eof || !b->key ||
        b->reinit_running)
        return;
    if (!(r = req_new(b, K_GET, NULL, 0)))
        return;
    snprintf(r->method, sizeof(r->method), "GET stream");
    b->get = GET_OPEN;
    start(r);
}

static void get_done(req *r, CURLcode result, long status)
{
    bridge *b = r->b;
    long retry = r->retry_ms;

    if (result == CURLE_OK && status == 200 && r->mode == 2) {
        b->get_backoff_ms = 1000;
        debug(b, "the server stream ended; opening it again");
        b->get = GET_CLOSED;
        finish(r);
        get_again_later(b, retry >= 0 ? retry : 0);
        return;
    }
    if (result != CURLE_OK) { /* network: try again, slower each time */
        debug(b, "the server stream failed (%s); opening it again later", curl_easy_strerror(result));
        finish(r);
        get_again_later(b, -1);
        return;
    }
    if (retry_in_new_session(r, status))
        return;
    /* 405 (this gateway sends nothing unasked) or anything else: do without it */
    debug(b, "no server stream (HTTP %ld)", status);
    b->get = GET_UNSUPPORTED;
    finish(r);
}

/* ---- one exchange's end ---- */

static void on_resume_timer(evutil_socket_t fd, short what, void *arg)
{
    req *r = arg;

    unlink_req(&r->b->reqs, r);
    start(r);
}

/* An SSE answer ended before its response: resume with Last-Event-ID (a GET, as the
 * transport says) if the gateway gave event ids. */
static int resume_stream(req *r)
{
    bridge *b = r->b;
    struct timeval tv;
    long ms = r->retry_ms >= 0 ? r->retry_ms : 500;

    if (r->mode != 2 || !r->last_event_id[0] || r->resumes >= RESUME_MAX || r->cancelled ||
        b->stopping)
        return 0;
    if (r->timer)
        event_free(r->timer);
    if (!(r->timer = evtimer_new(b->base, on_resume_timer, r)))
        return 0;
    r->resumes++;
    req_reset(r); /* stays in b->reqs meanwhile: busy, and freed by stop() */
    debug(b, "resuming the answer stream of %s after event %s", r->method, r->last_event_id);
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    evtimer_add(r->timer, &tv);
    return 1;
}

/* The sentence for a request that got no HTTP answer: what failed, what to do. */
static void transport_error(const bridge *b, CURLcode result, const char *errbuf, char *why,
                            size_t whylen)
{
    const char *detail = errbuf[0] ? errbuf : curl_easy_strerror(result);

    switch (result) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
        snprintf(why, whylen, "Cannot reach the sandfleet gateway at %s (%s); start it (ops/run) "
                 "or fix the URL, then retry.", b->url, detail);
        break;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
        snprintf(why, whylen, "TLS with the sandfleet gateway at %s failed (%s); check its "
                 "certificate, or name the CA that signed it with --cacert FILE.", b->url, detail);
        break;
    default:
        if (b->http_version == CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE)
            snprintf(why, whylen, "The sandfleet gateway at %s did not answer over HTTP/2 without "
                     "TLS (%s); drop --http2 unless the gateway serves h2c.", b->url, detail);
        else
            snprintf(why, whylen, "The connection to the sandfleet gateway at %s broke (%s); "
                     "retry, and check the gateway's log if it persists.", b->url, detail);
    }
}

static void on_done(void *arg, CURLcode result)
{
    req *r = arg;
    bridge *b = r->b;
    long status = 0, version = 0;
    char why[600];

    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(r->easy, CURLINFO_HTTP_VERSION, &version);
    debug(b, "%s: HTTP%s %ld%s%s", r->method,
          version == CURL_HTTP_VERSION_2_0 ? "/2" : version == CURL_HTTP_VERSION_1_1 ? "/1.1" : "",
          status, result == CURLE_OK ? "" : ", ", result == CURLE_OK ? "" : curl_easy_strerror(result));
    if (r->kind == K_GET) {
        get_done(r, result, status);
        return;
    }
    if (r->kind == K_DELETE) {
        finish(r);
        return;
    }
    if (result != CURLE_OK) {
        if (r->answered || r->cancelled) {
            /* the answer came; how the connection ended does not matter */
        } else if (r->abort_why[0]) {
            answer_error(r, r->abort_why, 0);
        } else if (status == 200 && resume_stream(r)) {
            return;
        } else if (result == CURLE_OPERATION_TIMEDOUT && status != 0) {
            snprintf(why, sizeof(why), "The gateway did not answer within %ld s; check the "
                     "sandbox with sandbox_info, then retry.", b->timeout_ms / 1000);
            answer_error(r, why, 0);
        } else {
            transport_error(b, result, r->errbuf, why, sizeof(why));
            answer_error(r, why, 0);
            if (r->kind != K_CLIENT || !r->id)
                say("%s (%s)", why, r->method);
        }
    } else if (retry_in_new_session(r, status)) {
        return;
    } else if (status == 200 && r->mode != 2) {
        if (r->resp.len > 0)
            server_message(r, r->resp.p, r->resp.len);
        answer_error(r, "The gateway answered without a JSON-RPC response; retry.", status);
    } else if (status == 200) {
        if (!r->answered && r->id && resume_stream(r))
            return;
        answer_error(r, "The gateway ended the answer stream before the result; check the "
                        "sandbox with sandbox_info, then retry.", 0);
    } else if (status == 202 || status == 204) {
        answer_error(r, "The gateway accepted the request but sent no answer; retry.", status);
    } else {
        http_error(r, status);
    }
    if (r->kind == K_REINIT) {
        if (b->session[0] || r->answered) {
            reinit_done(b, NULL);
        } else {
            snprintf(why, sizeof(why), "The gateway lost the MCP session and re-opening it "
                     "failed (HTTP %ld); restart the client.", status);
            reinit_done(b, why);
        }
    }
    if (r->kind == K_CLIENT && r->is_init) {
        if (b->session[0])
            debug(b, "session %s (MCP %s)", b->session, b->protocol);
        b->init_running = 0;
        release_waiting(b, NULL); /* sent in the new session (or answered by the gateway) */
    }
    if (r->kind == K_CLIENT && !strcmp(r->method, "notifications/initialized") &&
        status >= 200 && status < 300)
        open_get(b);
    finish(r);
}

/* A call ended: lines held back by MAX_INFLIGHT go now, and reading goes on. */
static void wake_input(bridge *b)
{
    if (b->stopping || b->inflight >= MAX_INFLIGHT)
        return;
    if (b->in_eof) {
        if (b->in.len > 0)
            drain_lines(b);
        return;
    }
    if (b->in_paused) {
        b->in_paused = 0;
        if (b->in_pollable)
            event_add(b->in_ev, NULL);
        event_active(b->in_ev, EV_READ, 0); /* handles what is buffered, reads on */
    }
}

/* The exchange is over for good: free it, let stdin go on, maybe exit. */
static void finish(req *r)
{
    bridge *b = r->b;

    req_free(r);
    wake_input(b);
    maybe_exit(b);
}

/* ---- sending ---- */

static int add_header(req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_header(req *r, const char *fmt, ...)
{
    char line[1024];
    struct curl_slist *l;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (!(l = curl_slist_append(r->hdrs, line)))
        return -ENOMEM;
    r->hdrs = l;
    return 0;
}

static void start(req *r)
{
    bridge *b = r->b;
    CURL *e;
    int rc = 0;

    if ((b->reinit_running || b->init_running) && r->kind != K_REINIT && r->kind != K_DELETE &&
        !r->is_init) {
        r->next = b->waiting; /* sent once the session is open */
        b->waiting = r;
        return;
    }
    r->next = b->reqs;
    b->reqs = r;
    if (r->is_init)
        b->init_running = 1;
    if (r->kind != K_DELETE) /* a DELETE names the session it ends */
        snprintf(r->sent_session, sizeof(r->sent_session), "%s", r->is_init ? "" : b->session);
    if (!(r->easy = e = curl_easy_init()))
        goto fail;
    rc |= add_header(r, "Authorization: Bearer %s", b->key);
    if (r->kind == K_GET) {
        rc |= add_header(r, "Accept: text/event-stream");
        if (r->last_event_id[0])
            rc |= add_header(r, "Last-Event-ID: %s", r->last_event_id);
    } else if (r->kind != K_DELETE && r->resumes > 0) { /* resuming an answer stream */
        rc |= add_header(r, "Accept: text/event-stream");
        rc |= add_header(r, "Last-Event-ID: %s", r->last_event_id);
    } else if (r->kind != K_DELETE) {
        rc |= add_header(r, "Content-Type: application/json");
        rc |= add_header(r, "Accept: application/json, text/event-stream");
        rc |= add_header(r, "Expect:");
    }
    if (r->sent_session[0] && r->kind != K_REINIT)
        rc |= add_header(r, "Mcp-Session-Id: %s", r->sent_session);
    if (b->protocol[0] && !r->is_init && r->kind != K_REINIT)
        rc |= add_header(r, "MCP-Protocol-Version: %s", b->protocol);
    if (rc)
        goto fail;
    curl_easy_setopt(e, CURLOPT_URL, b->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "sandfleet-mcp-stdio/1");
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, b->http_version);
    if (b->http_version == CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE) {
        /* libcurl 7.88.1 (Debian 12) fails the second request on a reused h2c
         * prior-knowledge connection ("Error in the HTTP2 framing layer"), whatever the
         * server: one connection per request. HTTP/2 over TLS reuses and multiplexes. */
        curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
        curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
    }
    curl_easy_setopt(e, CURLOPT_PIPEWAIT, 1L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT_MS);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    if (b->cacert)
        curl_easy_setopt(e, CURLOPT_CAINFO, b->cacert);
    if (r->kind == K_GET) {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L); /* no overall timeout: it stays open */
    } else if (r->kind == K_DELETE) {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 2000L);
    } else if (r->resumes > 0) {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, b->timeout_ms);
    } else {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, b->timeout_ms);
    }
    if (sf_curl_add(b->http, e, on_done, r) < 0)
        goto fail;
    debug(b, "-> %s", r->method);
    return;
fail:
    answer_error(r, "The bridge could not start an HTTP request (out of memory?); retry.", 0);
    finish(r);
}

/* ---- cancellation ---- */

static void on_cancel_grace(evutil_socket_t fd, short what, void *arg)
{
    req *r = arg;

    debug(r->b, "dropping the cancelled %s", r->method);
    finish(r); /* no answer: the client cancelled it */
}

static void cancel_request(bridge *b, json_t *request_id)
{
    struct timeval tv = {CANCEL_GRACE_MS / 1000, (CANCEL_GRACE_MS % 1000) * 1000};

    for (req *r = b->waiting; r; r = r->next)
        if (r->kind == K_CLIENT && same_id(r->id, request_id)) {
            r->cancelled = 1;
            finish(r); /* never sent */
            return;
        }
    for (req *r = b->reqs; r; r = r->next)
        if (r->kind == K_CLIENT && same_id(r->id, request_id) && !r->cancelled) {
            r->cancelled = 1; /* its answer, should one come, is not relayed */
            if (r->timer)
                event_free(r->timer);
            if ((r->timer = evtimer_new(b->base, on_cancel_grace, r)))
                evtimer_add(r->timer, &tv);
            return;
        }
}

/* ---- what the client sends ---- */

static void client_message(bridge *b, const char *p, size_t n)
{
    json_error_t jerr;
    json_t *msg = json_loadb(p, n, 0, &jerr), *id;
    const char *method;
    req *r;

    if (!msg) {
        char why[300];
        snprintf(why, sizeof(why), "Parse error: the message is not JSON (%s).", jerr.text);
        say("%s", why);
        emit_error(b, NULL, -32700, why, 0);
        return;
    }
    method = json_string_value(json_object_get(msg, "method"));
    id = method ? json_object_get(msg, "id") : NULL;
    if (id && json_is_null(id))
        id = NULL;
    if (!b->key) {
        const char *why = "SANDFLEET_API_KEY is not set: put a sandfleet API key in this "
                          "server's environment (create one with: sandfleet keys create --team "
                          "NAME) and restart the client.";
        if (id)
            emit_error(b, id, RPC_BRIDGE_ERROR, why, 0);
        if (!b->warned_no_key++ || id)
            say("%s", why);
        json_decref(msg);
        return;
    }
    if (method && !strcmp(method, "notifications/cancelled"))
        cancel_request(b, json_object_get(json_object_get(msg, "params"), "requestId"));
    if (!(r = req_new(b, K_CLIENT, p, n))) {
        if (id)
            emit_error(b, id, RPC_BRIDGE_ERROR, "Out of memory in the bridge; retry.", 0);
        json_decref(msg);
        return;
    }
    snprintf(r->method, sizeof(r->method), "%s",
             method ? method : json_is_array(msg) ? "batch" : "response");
    if (id) {
        r->id = json_incref(id);
        r->counted = 1;
        b->inflight++;
    }
    if (method && !strcmp(method, "initialize") && id) {
        char *copy = strndup(p, n);
        if (copy) {
            free(b->init_body);
            b->init_body = copy;
        }
        r->is_init = 1;
        b->session[0] = b->protocol[0] = '\0';
    }
    json_decref(msg);
    start(r);
}

/* Handles the complete lines in b->in while calls may be added. */
static void drain_lines(bridge *b)
{
    size_t used = 0;

    while (!b->stopping && b->inflight < MAX_INFLIGHT && used < b->in.len) {
        char *p = b->in.p + used, *nl = memchr(p, '\n', b->in.len - used);
        size_t n;

        if (!nl)
            break;
        n = (size_t)(nl - p);
        used += n + 1;
        if (b->discarding) { /* the tail of an over-long line */
            b->discarding = 0;
            continue;
        }
        while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        if (n > 0)
            client_message(b, p, n);
    }
    sf_buf_consume(&b->in, used);
    if (b->in.len > LINE_MAX_BYTES && !memchr(b->in.p, '\n', b->in.len)) {
        char why[200];
        snprintf(why, sizeof(why), "A message over %u MiB was dropped; send large contents in "
                 "smaller pieces.", LINE_MAX_BYTES >> 20);
        say("%s", why);
        emit_error(b, NULL, -32600, why, 0);
        sf_buf_reset(&b->in);
        b->discarding = 1;
    }
}

/* At the end of input, what nobody waits for goes: the server stream (nothing more is
 * asked, so nothing more is pushed) and cancelled calls. Calls in flight are finished. */
static void drop_at_eof(bridge *b)
{
    for (;;) {
        req *r = b->reqs;
        while (r && r->kind != K_GET && !r->cancelled)
            r = r->next;
        if (!r)
            return;
        if (r->kind == K_GET)
            b->get = GET_UNSUPPORTED;
        req_free(r);
    }
}

static void on_stdin(evutil_socket_t fd, short what, void *arg)
{
    bridge *b = arg;
    char chunk[READ_CHUNK];

    drain_lines(b);
    while (!b->stopping && !b->in_eof) {
        ssize_t n;

        if (b->inflight >= MAX_INFLIGHT || b->in.len > LINE_MAX_BYTES) {
            b->in_paused = 1; /* wake_input() goes on */
            if (b->in_pollable)
                event_del(b->in_ev);
            return;
        }
        n = read(STDIN_FILENO, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!b->in_pollable)
                event_active(b->in_ev, EV_READ, 0);
            return;
        }
        if (n <= 0) { /* end of input (or an error): what is left is the last message */
            if (n < 0)
                say("reading stdin failed (%s); finishing the calls in flight.", strerror(errno));
            if (b->in.len > 0 && !b->discarding && sf_buf_append(&b->in, "\n", 1) == 0)
                drain_lines(b);
            b->in_eof = 1;
            event_del(b->in_ev);
            if (b->get_timer)
                event_del(b->get_timer);
            drop_at_eof(b);
            maybe_exit(b);
            return;
        }
        if (b->discarding) { /* skip to the end of the over-long line */
            char *nl = memchr(chunk, '\n', (size_t)n);
            if (!nl)
                continue;
            b->discarding = 0;
            sf_buf_append(&b->in, nl + 1, (size_t)(chunk + n - nl - 1));
        } else if (sf_buf_append(&b->in, chunk, (size_t)n) < 0) {
            say("out of memory reading stdin; stopping.");
            stop(b);
            return;
        }
        drain_lines(b);
        if (!b->in_pollable) { /* a file: go on from the loop, so answers flow meanwhile */
            event_active(b->in_ev, EV_READ, 0);
            return;
        }
    }
}

/* ---- ending ---- */

static void maybe_exit(bridge *b)
{
    int busy = 0;

    if (!b->in_eof && !b->stopping)
        return;
    for (req *r = b->reqs; r; r = r->next)
        busy = 1;
    if (busy || b->waiting)
        return;
    if (b->in.len > 0 && !b->stopping)
        return; /* lines held back by MAX_INFLIGHT: wake_input() sends them */
    if (b->session[0] && b->key && !b->stopping) { /* end the session, politely */
        req *d = req_new(b, K_DELETE, NULL, 0);
        if (d) {
            snprintf(d->method, sizeof(d->method), "DELETE session");
            snprintf(d->sent_session, sizeof(d->sent_session), "%s", b->session);
            b->session[0] = '\0';
            start(d);
            return;
        }
        b->session[0] = '\0';
    }
    if (evbuffer_get_length(b->out) > 0 && b->out_pollable && !b->stopping)
        return; /* on_stdout_writable() comes back here */
    event_base_loopexit(b->base, NULL);
}

static void stop(bridge *b)
{
    req *r;

    if (b->stopping)
        return;
    b->stopping = 1;
    while ((r = b->reqs) || (r = b->waiting))
        req_free(r);
    if (b->in_ev)
        event_del(b->in_ev);
    if (b->base)
        event_base_loopexit(b->base, NULL);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    bridge *b = arg;

    say("stopping (signal %d).", (int)sig);
    stop(b);
}

/* ---- set-up ---- */

static void quiet_libevent(int severity, const char *msg)
{
    (void)severity; /* epoll refusing a regular file is expected: such fds are read directly */
    (void)msg;
}

/* Pipes, sockets and terminals can be watched; regular files (and /dev/null) cannot. */
static int watchable(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode);
}

static int nonblocking(int fd, int *old)
{
    *old = fcntl(fd, F_GETFL);
    return *old < 0 ? -1 : fcntl(fd, F_SETFL, *old | O_NONBLOCK);
}

static int parse_args(bridge *b, int argc, char **argv)
{
    const char *t;
    int64_t secs = DEFAULT_TIMEOUT_S;

    b->url = NULL;
    b->http_version = CURL_HTTP_VERSION_2TLS;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--http2"))
            b->http_version = CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE;
        else if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose"))
            b->verbose = 1;
        else if ((!strcmp(argv[i], "--cacert") || !strcmp(argv[i], "--timeout") ||
                  !strcmp(argv[i], "--url")) && i + 1 < argc)
            i++; /* read below */
        else if (argv[i][0] != '-' && !b->url)
            b->url = argv[i];
        else {
            fprintf(stderr, "sandfleet mcp-stdio: unexpected argument '%s'.\n%s", argv[i], usage);
            return -EINVAL;
        }
    }
    if (cli_opt(argc, argv, "--url"))
        b->url = cli_opt(argc, argv, "--url");
    if (!b->url)
        b->url = cli_setting("SANDFLEET_URL", cli_setting("SF_URL", CLI_DEFAULT_URL));
    b->cacert = cli_opt(argc, argv, "--cacert");
    if ((t = cli_opt(argc, argv, "--timeout")) && sf_parse_i64(t, 1, 86400, &secs) < 0) {
        fprintf(stderr, "sandfleet mcp-stdio: --timeout takes seconds (1-86400).\n");
        return -EINVAL;
    }
    b->timeout_ms = (long)secs * 1000;
    if (strncmp(b->url, "http://", 7) != 0 && strncmp(b->url, "https://", 8) != 0) {
        fprintf(stderr, "sandfleet mcp-stdio: the gateway URL must start with http:// or "
                        "https:// (got '%s').\n", b->url);
        return -EINVAL;
    }
    b->key = getenv("SANDFLEET_API_KEY");
    if (b->key && !*b->key)
        b->key = NULL;
    return 0;
}

int cli_mcp_stdio(int argc, char **argv)
{
    bridge b;
    int rc = 1;

    if (cli_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return 0;
    }
    memset(&b, 0, sizeof(b));
    if (parse_args(&b, argc, argv) < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    sf_buf_init(&b.in, LINE_MAX_BYTES + 2 * READ_CHUNK);
    b.get_backoff_ms = 1000;
    b.in_flags = b.out_flags = -1;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || !(b.base = event_base_new()) ||
        !(b.http = sf_curl_new(b.base)) || !(b.out = evbuffer_new()) ||
        !(b.get_timer = evtimer_new(b.base, on_get_timer, &b)) ||
        !(b.sigint_ev = evsignal_new(b.base, SIGINT, on_signal, &b)) ||
        !(b.sigterm_ev = evsignal_new(b.base, SIGTERM, on_signal, &b))) {
        say("cannot start (out of memory).");
        goto out;
    }
    nonblocking(STDIN_FILENO, &b.in_flags);
    nonblocking(STDOUT_FILENO, &b.out_flags);
    /* Pipes and sockets are watched; a regular file (or /dev/null) cannot be, and never
     * blocks: it is read from the loop turn after turn. */
    b.in_ev = event_new(b.base, STDIN_FILENO, EV_READ | EV_PERSIST, on_stdin, &b);
    b.out_ev = event_new(b.base, STDOUT_FILENO, EV_WRITE, on_stdout_writable, &b);
    if (!b.in_ev || !b.out_ev)
        goto out;
    event_set_log_callback(quiet_libevent);
    b.in_pollable = watchable(STDIN_FILENO) && event_add(b.in_ev, NULL) == 0;
    if (!b.in_pollable) {
        event_free(b.in_ev);
        b.in_ev = event_new(b.base, -1, 0, on_stdin, &b);
        if (!b.in_ev)
            goto out;
        event_active(b.in_ev, EV_READ, 0);
    }
    b.out_pollable = watchable(STDOUT_FILENO) && event_add(b.out_ev, NULL) == 0;
    if (b.out_pollable)
        event_del(b.out_ev);
    evsignal_add(b.sigint_ev, NULL);
    evsignal_add(b.sigterm_ev, NULL);
    if (!b.key)
        say("SANDFLEET_API_KEY is not set: every call will be answered with an error saying so.");
    say("forwarding MCP on stdin/stdout to %s", b.url);
    event_base_dispatch(b.base);
    out_flush(&b);
    rc = 0;
out:
    stop(&b);
    if (b.in_flags >= 0)
        fcntl(STDIN_FILENO, F_SETFL, b.in_flags);
    if (b.out_flags >= 0) {
        fcntl(STDOUT_FILENO, F_SETFL, b.out_flags);
        while (b.out && !b.out_closed && evbuffer_get_length(b.out) > 0) /* blocking now */
            if (evbuffer_write(b.out, STDOUT_FILENO) <= 0 && errno != EINTR)
                break;
    }
    if (b.in_ev)
        event_free(b.in_ev);
    if (b.out_ev)
        event_free(b.out_ev);
    if (b.get_timer)
        event_free(b.get_timer);
    if (b.sigint_ev)
        event_free(b.sigint_ev);
    if (b.sigterm_ev)
        event_free(b.sigterm_ev);
    if (b.out)
        evbuffer_free(b.out);
    sf_curl_free(b.http);
    if (b.base)
        event_base_free(b.base);
    sf_buf_fini(&b.in);
    free(b.init_body);
    curl_global_cleanup();
    return rc;
}
