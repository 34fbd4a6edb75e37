/* Tests for gateway/http/ (server.c, http1.c, req.c): a real server on 127.0.0.1 (port 0) and plain-socket
 * clients. Server and client share this thread: the client uses non-blocking sockets and
 * runs the event loop (EVLOOP_NONBLOCK) whenever it would wait, so every assertion runs
 * here, in order, and a deferred response or an abort is observed exactly when the
 * loop gets to it. Responses are read with llhttp in response mode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <llhttp.h>

#include "server.h"
#include "sf_log.h"

#define MIB (1u << 20)
#define WAIT_MS 5000

/* ------------------------------------------------------------------ server side */

typedef struct tctx {
    struct event_base *base;
    gw_http_server *srv;
    int port;
    int handled;      /* handler calls */
    int hang_pending; /* /hang requests waiting */
    int aborts;       /* abort callbacks */
    int takeovers;
    size_t last_body_len;
    gw_req *hung; /* the latest /hang request, until answered or aborted */
} tctx;

static tctx T;

typedef struct deferred {
    struct event *ev;
    gw_req *req;
    int ms;
} deferred;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void deferred_fire(evutil_socket_t fd, short what, void *arg)
{
    deferred *d = arg;
    char body[64];
    int n = snprintf(body, sizeof(body), "deferred %d %s", d->ms, gw_req_query(d->req));

    gw_req_respond(d->req, 200, "text/plain", NULL, body, (size_t)n);
    event_free(d->ev);
    free(d);
}

static void deferred_abort(gw_req *req, void *arg)
{
    deferred *d = arg;
    T.aborts++;
    event_free(d->ev);
    free(d);
}

static void hang_abort(gw_req *req, void *arg)
{
    assert_ptr_equal(arg, &T);
    assert_ptr_equal(gw_req_data(req), &T.hang_pending);
    T.hang_pending--;
    T.aborts++;
    if (T.hung == req)
        T.hung = NULL;
}

/* /stream: the head and "one" at once, "two" and the end from a timer ("?hold": never
 * ends, the client's close aborts it). */
static void stream_fire(evutil_socket_t fd, short what, void *arg)
{
    deferred *d = arg;

    assert_int_equal(gw_req_stream_write(d->req, "data: two\n\n", 11), 0);
    if (strcmp(gw_req_query(d->req), "hold") != 0) {
        gw_req_stream_end(d->req);
        event_free(d->ev);
        free(d);
    }
}

static void handler(gw_req *req, void *arg)
{
    tctx *t = arg;
    const char *path = gw_req_path(req);
    size_t blen;
    const char *body = gw_req_body(req, &blen);

    t->handled++;
    t->last_body_len = blen;
    if (strcmp(path, "/echo") == 0) {
        /* "<method> <path>?<query> <body>" */
        size_t cap = blen + 256;
        char *out = malloc(cap);
        int n = snprintf(out, cap, "%s %s?%s ", gw_req_method(req), path, gw_req_query(req));
        memcpy(out + n, body, blen);
        gw_req_respond(req, 200, "text/plain", NULL, out, (size_t)n + blen);
        free(out);
    } else if (strcmp(path, "/big") == 0) { /* "?N": N bytes of a..z, repeated */
        size_t n = (size_t)strtoul(gw_req_query(req), NULL, 10);
        char *out = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++)
            out[i] = (char)('a' + i % 26);
        gw_req_respond(req, 200, "text/plain", NULL, out, n);
        free(out);
    } else if (strcmp(path, "/hdr") == 0) { /* value of the header named in the query */
        const char *v = gw_req_header(req, gw_req_query(req));
        v = v ? v : "(none)";
        gw_req_respond(req, 200, "text/plain", NULL, v, strlen(v));
    } else if (strcmp(path, "/len") == 0) {
        char out[64];
        int n = snprintf(out, sizeof(out), "%zu", blen);
        gw_req_respond(req, 200, "text/plain", NULL, out, (size_t)n);
    } else if (strcmp(path, "/defer") == 0) {
        deferred *d = calloc(1, sizeof(*d));
        struct timeval tv;
        d->req = req;
        d->ms = (int)strtol(gw_req_query(req) + 3, NULL, 10); /* "ms=NN..." */
        tv.tv_sec = 0;
        tv.tv_usec = d->ms * 1000;
        d->ev = evtimer_new(t->base, deferred_fire, d);
        evtimer_add(d->ev, &tv);
        gw_req_set_abort_cb(req, deferred_abort, d);
    } else if (strcmp(path, "/stream") == 0) {
        static const char *const h[] = {"X-Stream", "1", NULL};
        deferred *d = calloc(1, sizeof(*d));
        struct timeval tv = {0, 20000};
        assert_false(gw_req_streaming(req));
        assert_int_equal(gw_req_stream_begin(req, 200, "text/event-stream", h), 0);
        assert_true(gw_req_streaming(req));
        assert_int_equal(gw_req_stream_write(req, "data: one\n\n", 11), 0);
        d->req = req;
        d->ev = evtimer_new(t->base, stream_fire, d);
        evtimer_add(d->ev, &tv);
        gw_req_set_abort_cb(req, deferred_abort, d);
    } else if (strcmp(path, "/hang") == 0) {
        t->hang_pending++;
        t->hung = req;
        gw_req_set_data(req, &t->hang_pending);
        gw_req_set_abort_cb(req, hang_abort, t);
    } else if (strcmp(path, "/headers") == 0) {
        static const char *const hdrs[] = {"X-One", "1",        "X-Bad", "a\r\nInjected: yes",
                                           "Bad Name", "x",     "Content-Length", "999",
                                           "Cache-Control", "max-age=5", "Connection", "close",
                                           NULL};
        gw_req_respond(req, 201, "application/json", hdrs, "{}", 2);
    } else if (strcmp(path, "/nocontent") == 0) {
        gw_req_respond(req, 204, NULL, NULL, "ignored", 7);
    } else if (strcmp(path, "/peer") == 0) {
        char out[128];
        int n = snprintf(out, sizeof(out), "%s %d", gw_req_peer(req), gw_req_peer_port(req) > 0);
        gw_req_respond(req, 200, "text/plain", NULL, out, (size_t)n);
    } else if (strcmp(path, "/allheaders") == 0) {
        char out[1024];
        size_t n = 0;
        const char *name, *value;
        for (size_t i = 0; gw_req_header_at(req, i, &name, &value) == 0; i++)
            n += (size_t)snprintf(out + n, sizeof(out) - n, "%s=%s;", name, value);
        gw_req_respond(req, 200, "text/plain", NULL, out, n);
    } else {
        gw_req_respond(req, 404, "application/json", NULL, "{\"error\":\"no such path\"}", 24);
    }
}

/* Set in a client thread: the helpers then only wait on their socket and never touch the
 * event loop, which belongs to the main thread. */
static _Thread_local int in_client_thread;

static void loop_once(void)
{
    if (!in_client_thread)
        event_base_loop(T.base, EVLOOP_NONBLOCK);
}

/* Runs the loop until *flag >= want or ms pass; returns whether it got there. */
static int loop_until(const int *flag, int want, int ms)
{
    int64_t end = now_ms() + ms;
    while (*flag < want && now_ms() < end) {
        loop_once();
        poll(NULL, 0, 1);
    }
    return *flag >= want;
}

static int loop_until_conns(unsigned want, int ms)
{
    int64_t end = now_ms() + ms;
    while (gw_http_server_conns(T.srv) != want && now_ms() < end) {
        loop_once();
        poll(NULL, 0, 1);
    }
    return gw_http_server_conns(T.srv) == want;
}

static int loop_until_buffered(size_t want, int ms)
{
    int64_t end = now_ms() + ms;
    while (gw_http_server_buffered(T.srv) != want && now_ms() < end) {
        loop_once();
        poll(NULL, 0, 1);
    }
    return gw_http_server_buffered(T.srv) == want;
}

static void server_start(const gw_http_limits *lim)
{
    memset(&T, 0, sizeof(T));
    T.base = event_base_new();
    assert_non_null(T.base);
    T.srv = gw_http_server_new(T.base, "127.0.0.1", 0, lim, handler, &T);
    assert_non_null(T.srv);
    T.port = gw_http_server_port(T.srv);
    assert_true(T.port > 0);
}

static void server_stop(void)
{
    gw_http_server_free(T.srv);
    T.srv = NULL;
    loop_once();
    event_base_free(T.base);
    T.base = NULL;
}

static int setup(void **state)
{
    server_start(NULL);
    return 0;
}

static int teardown(void **state)
{
    server_stop();
    return 0;
}

/* ------------------------------------------------------------------ client side */

typedef struct resp {
    int status;
    int nh;
    char hn[32][64];
    char hv[32][512];
    char *body;
    size_t blen, bcap;
    int complete, head, last_value;
} resp;

typedef struct cli {
    int fd;
    char buf[65536];
    size_t off, len;
    llhttp_t p;
    int eof;
} cli;

static int r_field(llhttp_t *p, const char *at, size_t len)
{
    resp *r = p->data;
    if (r->nh == 0 || r->last_value) {
        if (r->nh == 32)
            return 0;
        r->nh++;
        r->last_value = 0;
    }
    {
        size_t room = 63 - strlen(r->hn[r->nh - 1]);
        strncat(r->hn[r->nh - 1], at, len < room ? len : room);
    }
    return 0;
}

static int r_value(llhttp_t *p, const char *at, size_t len)
{
    resp *r = p->data;
    size_t room = 511 - strlen(r->hv[r->nh - 1]);
    r->last_value = 1;
    strncat(r->hv[r->nh - 1], at, len < room ? len : room);
    return 0;
}

static int r_headers_done(llhttp_t *p)
{
    resp *r = p->data;
    r->status = p->status_code;
    return r->head ? 1 : 0;
}

static int r_body(llhttp_t *p, const char *at, size_t len)
{
    resp *r = p->data;
    if (r->blen + len + 1 > r->bcap) {
        r->bcap = (r->blen + len + 1) * 2;
        r->body = realloc(r->body, r->bcap);
    }
    memcpy(r->body + r->blen, at, len);
    r->blen += len;
    r->body[r->blen] = '\0';
    return 0;
}

static int r_done(llhttp_t *p)
{
    resp *r = p->data;
    r->complete = 1;
    return HPE_PAUSED;
}

static const llhttp_settings_t resp_settings = {
    .on_header_field = r_field,
    .on_header_value = r_value,
    .on_headers_complete = r_headers_done,
    .on_body = r_body,
    .on_message_complete = r_done,
};

static const char *rh(const resp *r, const char *name)
{
    for (int i = 0; i < r->nh; i++)
        if (strcasecmp(r->hn[i], name) == 0)
            return r->hv[i];
    return NULL;
}

static void resp_fini(resp *r)
{
    free(r->body);
    memset(r, 0, sizeof(*r));
}

static cli *cli_connect(void)
{
    struct sockaddr_in sa;
    cli *c = calloc(1, sizeof(*c));
    int64_t end = now_ms() + WAIT_MS;

    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    assert_true(c->fd >= 0);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)T.port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        struct pollfd pfd = {c->fd, POLLOUT, 0};
        int err = 0;
        socklen_t el = sizeof(err);
        assert_int_equal(errno, EINPROGRESS);
        while (poll(&pfd, 1, 0) == 0 && now_ms() < end) {
            loop_once();
            poll(NULL, 0, 1);
        }
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        assert_int_equal(err, 0);
    }
    return c;
}

static void cli_close(cli *c)
{
    if (!c)
        return;
    close(c->fd);
    free(c);
}

/* Sends everything, running the server loop while the socket is full. Returns 0, or
 * -errno when the server closed on us (expected after an early 413). */
static int cli_send(cli *c, const void *data, size_t len)
{
    const char *p = data;
    int64_t end = now_ms() + 4 * WAIT_MS;

    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -errno;
        if (now_ms() > end)
            return -ETIMEDOUT;
        loop_once();
        {
            struct pollfd pfd = {c->fd, POLLOUT, 0};
            poll(&pfd, 1, in_client_thread ? 100 : 1);
        }
    }
    loop_once();
    return 0;
}

static int cli_sends(cli *c, const char *s)
{
    return cli_send(c, s, strlen(s));
}

/* Reads more bytes into c->buf; 1 = got some, 0 = EOF, -1 = timeout, -errno. */
static int cli_fill(cli *c, int ms)
{
    int64_t end = now_ms() + ms;

    if (c->len == 0)
        c->off = 0;
    if (c->off + c->len == sizeof(c->buf)) {
        memmove(c->buf, c->buf + c->off, c->len);
        c->off = 0;
    }
    for (;;) {
        ssize_t n = recv(c->fd, c->buf + c->off + c->len, sizeof(c->buf) - c->off - c->len, 0);
        if (n > 0) {
            c->len += (size_t)n;
            return 1;
        }
        if (n == 0)
            return 0;
        if (errno != EAGAIN && errno != EINTR)
            return -errno;
        if (now_ms() > end)
            return -1;
        loop_once();
        {
            struct pollfd pfd = {c->fd, POLLIN, 0};
            poll(&pfd, 1, in_client_thread ? 100 : 1);
        }
    }
}

/* Reads one response (head = it answers a HEAD request). 0 or < 0. */
static int cli_read(cli *c, resp *r, int head)
{
    memset(r, 0, sizeof(*r));
    r->head = head;
    llhttp_init(&c->p, HTTP_RESPONSE, &resp_settings);
    c->p.data = r;
    for (;;) {
        if (c->len > 0) {
            llhttp_errno_t e = llhttp_execute(&c->p, c->buf + c->off, c->len);
            size_t n = c->len;
            if (e != HPE_OK && llhttp_get_error_pos(&c->p))
                n = (size_t)(llhttp_get_error_pos(&c->p) - (c->buf + c->off));
            c->off += n;
            c->len -= n;
            if (e == HPE_PAUSED)
                return 0;
            if (e != HPE_OK)
                return -EPROTO;
            continue;
        }
        switch (cli_fill(c, WAIT_MS)) {
        case 1:
            break;
        case 0:
            llhttp_finish(&c->p);
            return r->complete ? 0 : -ECONNRESET;
        default:
            return -ETIMEDOUT;
        }
    }
}

/* 1 when the server closed the connection (EOF or reset) within ms, with no bytes. */
static int cli_closed(cli *c, int ms)
{
    int rc;
    if (c->len > 0)
        return 0;
    rc = cli_fill(c, ms);
    return rc == 0 || rc == -ECONNRESET;
}

static void request(cli *c, const char *req, resp *r, int expect_status, const char *expect_body)
{
    assert_int_equal(cli_sends(c, req), 0);
    assert_int_equal(cli_read(c, r, strncmp(req, "HEAD ", 5) == 0), 0);
    assert_int_equal(r->status, expect_status);
    if (expect_body)
        assert_string_equal(r->body ? r->body : "", expect_body);
}

/* ------------------------------------------------------------------ tests */

static void test_get_post(void **state)
{
    cli *c = cli_connect();
    resp r;
    char cl[32];

    request(c, "GET /echo?a=1&b=%20 HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo?a=1&b=%20 ");
    assert_string_equal(rh(&r, "Content-Length"), "20");
    assert_string_equal(rh(&r, "Content-Type"), "text/plain");
    assert_string_equal(rh(&r, "Cache-Control"), "no-store");
    assert_non_null(rh(&r, "Date"));
    assert_null(rh(&r, "Connection"));
    resp_fini(&r);

    request(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", &r, 200,
            "POST /echo? hello");
    snprintf(cl, sizeof(cl), "%zu", strlen("POST /echo? hello"));
    assert_string_equal(rh(&r, "Content-Length"), cl);
    resp_fini(&r);

    request(c, "DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "DELETE /echo? ");
    resp_fini(&r);
    request(c, "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", &r, 404, NULL);
    resp_fini(&r);
    /* absolute-form target */
    request(c, "GET http://example.com/echo?z HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo?z ");
    resp_fini(&r);
    /* header lookup is case-insensitive, value trimmed, first value wins */
    request(c, "GET /hdr?x-test HTTP/1.1\r\nHost: x\r\nX-TeSt:   some value  \r\nx-test: second\r\n\r\n",
            &r, 200, "some value");
    resp_fini(&r);
    request(c, "GET /hdr?x-missing HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "(none)");
    resp_fini(&r);
    request(c, "GET /hdr?x-empty HTTP/1.1\r\nHost: x\r\nX-Empty:\r\n\r\n", &r, 200, "");
    resp_fini(&r);
    request(c, "GET /allheaders HTTP/1.1\r\nHost: h\r\nA: 1\r\nA: 2\r\n\r\n", &r, 200,
            "Host=h;A=1;A=2;");
    resp_fini(&r);
    request(c, "GET /peer HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "127.0.0.1 1");
    resp_fini(&r);
    cli_close(c);
    assert_true(loop_until_conns(0, WAIT_MS));
}

static void test_stream(void **state)
{
    cli *c = cli_connect();
    resp r;

    /* HTTP/1.1: chunked, and the connection goes on */
    request(c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "data: one\n\ndata: two\n\n");
    assert_string_equal(rh(&r, "Transfer-Encoding"), "chunked");
    assert_string_equal(rh(&r, "Content-Type"), "text/event-stream");
    assert_string_equal(rh(&r, "X-Stream"), "1");
    assert_null(rh(&r, "Content-Length"));
    resp_fini(&r);
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    cli_close(c);

    /* HTTP/1.0: the body ends with the connection */
    c = cli_connect();
    assert_int_equal(cli_sends(c, "GET /stream HTTP/1.0\r\n\r\n"), 0);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "data: one\n\ndata: two\n\n");
    assert_string_equal(rh(&r, "Connection"), "close");
    resp_fini(&r);
    cli_close(c);

    /* a client that leaves mid-stream aborts the request */
    c = cli_connect();
    assert_int_equal(cli_sends(c, "GET /stream?hold HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
    while (c->len < 40 && cli_fill(c, WAIT_MS) == 1)
        ;
    cli_close(c);
    assert_true(loop_until(&T.aborts, 1, WAIT_MS));
    assert_true(loop_until_conns(0, WAIT_MS));
}

/* The router: exact paths, prefixes, 405 with Allow, fallback. */
static void routed(gw_req *req, void *arg)
{
    gw_req_respond(req, 200, "text/plain", NULL, arg, strlen(arg));
}

static void test_router(void **state)
{
    gw_router *rt = gw_router_new();
    cli *c;
    resp r;

    assert_non_null(rt);
    assert_int_equal(gw_router_add(rt, "POST", "/mcp", routed, "mcp-post"), 0);
    assert_int_equal(gw_router_add(rt, "DELETE", "/mcp", routed, "mcp-delete"), 0);
    assert_int_equal(gw_router_add(rt, NULL, "/preview/", routed, "preview"), 0);
    assert_int_equal(gw_router_add(rt, "GET", "/preview/special", routed, "special"), 0);
    gw_http_server_free(T.srv);
    T.srv = gw_http_server_new(T.base, "127.0.0.1", 0, NULL, gw_router_dispatch, rt);
    assert_non_null(T.srv);
    T.port = gw_http_server_port(T.srv);
    c = cli_connect();
    request(c, "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", &r, 200, "mcp-post");
    resp_fini(&r);
    request(c, "DELETE /mcp HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "mcp-delete");
    resp_fini(&r);
    request(c, "GET /mcp HTTP/1.1\r\nHost: x\r\n\r\n", &r, 405, NULL);
    assert_non_null(strstr(r.body, "use POST, DELETE"));
    assert_string_equal(rh(&r, "Allow"), "POST, DELETE");
    resp_fini(&r);
    request(c, "PUT /preview/a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", &r, 200, "preview");
    resp_fini(&r);
    request(c, "GET /preview/special HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "special");
    resp_fini(&r);
    request(c, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", &r, 404, "{\"error\":\"Not found.\"}");
    resp_fini(&r);
    gw_router_fallback(rt, routed, "fallback");
    request(c, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "fallback");
    resp_fini(&r);
    cli_close(c);
    gw_http_server_free(T.srv);
    T.srv = gw_http_server_new(T.base, "127.0.0.1", 0, NULL, handler, &T);
    gw_router_free(rt);
    gw_router_free(NULL);
}

static void expect_error(const char *req, int status, const char *body_part);

/* Total deadlines: headers and bodies must arrive in time, however they trickle. */
static void test_deadlines(void **state)
{
    gw_http_limits lim = {.header_timeout_ms = 300, .body_timeout_ms = 300, .body_min_rate = MIB};
    int64_t t0;
    cli *c;
    resp r;

    server_stop();
    server_start(&lim);
    /* half a head, then silence */
    expect_error("GET /echo HTTP/1.1\r\nHo", 408, "request headers not received in time");
    /* nothing at all, or a cut-short HTTP/2 preface: the deadline counts from accept, also
     * while the server sniffs the first bytes (server.c), and the answer is HTTP/1's 408 */
    expect_error("", 408, "request headers not received in time");
    expect_error("PRI * HTTP/2.0\r\n", 408, "request headers not received in time");
    /* a head trickling in a byte every 20 ms: the deadline is total, not reset per byte */
    c = cli_connect();
    t0 = now_ms();
    for (const char *p = "GET /echo HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
         *p && c->len == 0; p++) {
        cli_send(c, p, 1);
        cli_fill(c, 20);
    }
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 408);
    assert_true(now_ms() - t0 < 2000);
    resp_fini(&r);
    cli_close(c);
    /* a body that does not come */
    expect_error("POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc", 408,
                 "request body not received in time");
    /* an idle keep-alive connection is not a slow request: it gets no 408 */
    c = cli_connect();
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    assert_int_equal(cli_fill(c, 500), -1); /* nothing from the server for 500 ms */
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    cli_close(c);
    assert_int_equal(gw_http_server_stats(T.srv)->refused[GW_REFUSE_408], 5);
}

/* One client address: at most max_conns_per_addr connections (then 429 at once). */
static void test_addr_caps(void **state)
{
    gw_http_limits lim = {.max_conns_per_addr = 2};
    cli *a, *b, *c;
    resp r;

    server_stop();
    server_start(&lim);
    a = cli_connect();
    request(a, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, NULL);
    resp_fini(&r);
    b = cli_connect();
    request(b, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, NULL);
    resp_fini(&r);
    c = cli_connect();
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 429);
    assert_string_equal(rh(&r, "Retry-After"), "1");
    assert_non_null(strstr(r.body, "too many connections from your address"));
    resp_fini(&r);
    cli_close(c);
    cli_close(a);
    assert_true(loop_until_conns(1, WAIT_MS));
    c = cli_connect();
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, NULL);
    resp_fini(&r);
    cli_close(c);
    cli_close(b);
    assert_true(loop_until_conns(0, WAIT_MS));
}

/* The head check decides before any body byte is accepted. */
static int checks;
static struct event *check_ev;
static gw_req *check_req;

static void check_later(evutil_socket_t fd, short what, void *arg)
{
    gw_req *req = check_req;
    check_req = NULL;
    gw_req_head_verdict(req, 0, NULL);
}

static void check_abort(gw_req *req, void *arg)
{
    evtimer_del(check_ev);
    check_req = NULL;
    T.aborts++;
}

static void head_check(gw_req *req, void *arg)
{
    const char *key = gw_req_header(req, "X-Key");

    checks++;
    if (!key || strcmp(key, "good") != 0) {
        gw_req_head_verdict(req, 401, "missing or invalid key");
        return;
    }
    check_req = req; /* good: answered from a timer, as a Redis lookup would */
    gw_req_set_abort_cb(req, check_abort, NULL);
    {
        struct timeval tv = {0, strcmp(gw_req_path(req), "/slowcheck") ? 10000 : 500000};
        evtimer_add(check_ev, &tv);
    }
}

static void test_head_check(void **state)
{
    char head[160];
    cli *c;
    resp r;

    check_ev = evtimer_new(T.base, check_later, NULL);
    gw_http_server_set_head_check(T.srv, head_check, NULL);
    /* a bad key: 401 on the head alone; the 1 MiB it declared never counts */
    c = cli_connect();
    snprintf(head, sizeof(head), "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: %u\r\n\r\n", MIB);
    assert_int_equal(cli_sends(c, head), 0);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 401);
    assert_non_null(rh(&r, "WWW-Authenticate"));
    resp_fini(&r);
    assert_true(gw_http_server_buffered(T.srv) < 1024);
    cli_close(c);
    /* a good key: checked later, then the body is read */
    c = cli_connect();
    request(c, "POST /len HTTP/1.1\r\nHost: x\r\nX-Key: good\r\nContent-Length: 5\r\n\r\nhello", &r, 200,
            "5");
    resp_fini(&r);
    /* requests without a body are not checked here (their handler authenticates) */
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, NULL);
    resp_fini(&r);
    assert_int_equal(checks, 2);
    cli_close(c);
    /* a client that leaves while its check runs: the check is told, nothing leaks */
    c = cli_connect();
    assert_int_equal(cli_sends(c, "POST /slowcheck HTTP/1.1\r\nHost: x\r\nX-Key: good\r\n"
                                  "Content-Length: 5\r\n\r\n"), 0);
    assert_true(loop_until(&checks, 3, WAIT_MS));
    cli_close(c);
    assert_true(loop_until(&T.aborts, 1, WAIT_MS));
    assert_true(loop_until_conns(0, WAIT_MS));
    assert_int_equal(gw_http_server_buffered(T.srv), 0);
    event_free(check_ev);
    checks = 0;
}

static void test_split_packets(void **state)
{
    /* a request trickling in byte by byte parses the same */
    static const char req[] = "POST /echo?q=1 HTTP/1.1\r\nHost: x\r\nX-Long-Header-Name: "
                              "value\r\nContent-Length: 3\r\n\r\nabc";
    cli *c = cli_connect();
    resp r;

    for (size_t i = 0; i < sizeof(req) - 1; i++) {
        assert_int_equal(cli_send(c, req + i, 1), 0);
        loop_once();
    }
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "POST /echo?q=1 abc");
    resp_fini(&r);
    cli_close(c);
}

static void test_keepalive(void **state)
{
    cli *c = cli_connect();
    resp r;

    request(c, "GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo?n=1 ");
    resp_fini(&r);
    request(c, "GET /echo?n=2 HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo?n=2 ");
    resp_fini(&r);
    assert_int_equal(T.handled, 2);
    assert_int_equal(gw_http_server_conns(T.srv), 1);
    /* Connection: close is honoured */
    request(c, "GET /echo?n=3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &r, 200,
            "GET /echo?n=3 ");
    assert_string_equal(rh(&r, "Connection"), "close");
    resp_fini(&r);
    assert_true(cli_closed(c, WAIT_MS));
    cli_close(c);
    assert_true(loop_until_conns(0, WAIT_MS));
}

static void test_http10(void **state)
{
    cli *c = cli_connect();
    resp r;

    request(c, "GET /echo HTTP/1.0\r\n\r\n", &r, 200, "GET /echo? ");
    assert_string_equal(rh(&r, "Connection"), "close");
    resp_fini(&r);
    assert_true(cli_closed(c, WAIT_MS));
    cli_close(c);

    c = cli_connect();
    request(c, "GET /echo?1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r, 200, "GET /echo?1 ");
    assert_string_equal(rh(&r, "Connection"), "keep-alive");
    resp_fini(&r);
    request(c, "GET /echo?2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r, 200, "GET /echo?2 ");
    resp_fini(&r);
    cli_close(c);
}

static void test_pipelining(void **state)
{
    cli *c = cli_connect();
    resp r;

    /* The first answer is deferred; the two after it must still come out in order. */
    assert_int_equal(cli_sends(c, "GET /defer?ms=60&n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                                  "POST /echo?n=2 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
                                  "GET /echo?n=3 HTTP/1.1\r\nHost: x\r\n\r\n"),
                     0);
    assert_true(loop_until(&T.handled, 1, WAIT_MS));
    for (int i = 0; i < 20; i++)
        loop_once();
    assert_int_equal(T.handled, 1); /* one at a time: the others wait */
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_string_equal(r.body, "deferred 60 ms=60&n=1");
    resp_fini(&r);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_string_equal(r.body, "POST /echo?n=2 hi");
    resp_fini(&r);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_string_equal(r.body, "GET /echo?n=3 ");
    resp_fini(&r);
    assert_int_equal(T.handled, 3);
    cli_close(c);
}

/* Answers given at once are written at once; a burst of pipelined requests in one packet
 * is answered in order, each after the one before it. */
static void test_pipelined_burst(void **state)
{
    enum { N = 200 };
    cli *c = cli_connect();
    char *all = malloc(N * 64), want[64];
    size_t len = 0;
    resp r;

    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(all + len, 64, "GET /echo?%d HTTP/1.1\r\nHost: x\r\n\r\n", i);
    assert_int_equal(cli_send(c, all, len), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(cli_read(c, &r, 0), 0);
        assert_int_equal(r.status, 200);
        snprintf(want, sizeof(want), "GET /echo?%d ", i);
        assert_string_equal(r.body, want);
        resp_fini(&r);
    }
    assert_int_equal(T.handled, N);
    free(all);
    cli_close(c);
    assert_true(loop_until_conns(0, WAIT_MS));
}

/* An answer larger than the socket takes, to a client that does not read for a while: the
 * rest goes out with the write event, the pipelined request behind it waits for that, and
 * the connection then goes on writing answers at once. */
static void test_big_answer(void **state)
{
    const size_t n = 8 * MIB;
    cli *c = cli_connect();
    resp r;
    size_t bad = 0;

    assert_int_equal(cli_sends(c, "GET /big?8388608 HTTP/1.1\r\nHost: x\r\n\r\n"
                                  "GET /echo?after HTTP/1.1\r\nHost: x\r\n\r\n"),
                     0);
    assert_true(loop_until(&T.handled, 1, WAIT_MS));
    for (int i = 0; i < 20; i++)
        loop_once();
    assert_int_equal(T.handled, 1); /* 8 MiB do not fit in the sockets: the rest waits */
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.blen, n);
    for (size_t i = 0; i < n; i++)
        bad += r.body[i] != (char)('a' + i % 26);
    assert_int_equal(bad, 0);
    resp_fini(&r);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_string_equal(r.body, "GET /echo?after ");
    resp_fini(&r);
    request(c, "GET /echo?again HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo?again ");
    resp_fini(&r);
    cli_close(c);
    assert_true(loop_until_conns(0, WAIT_MS));
}

static void test_deferred(void **state)
{
    cli *c = cli_connect();
    resp r;
    int64_t t0 = now_ms();

    request(c, "GET /defer?ms=50 HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "deferred 50 ms=50");
    assert_true(now_ms() - t0 >= 45);
    resp_fini(&r);
    /* and the connection is still usable */
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    cli_close(c);
}

static void test_abort(void **state)
{
    cli *c = cli_connect();

    assert_int_equal(cli_sends(c, "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
    assert_true(loop_until(&T.hang_pending, 1, WAIT_MS));
    /* pipelined bytes behind a pending request do not stop the close from being seen */
    assert_int_equal(cli_sends(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
    cli_close(c);
    assert_true(loop_until(&T.aborts, 1, WAIT_MS));
    assert_int_equal(T.hang_pending, 0);
    assert_int_equal(T.handled, 1);
    assert_true(loop_until_conns(0, WAIT_MS));

    /* a deferred answer whose client left: the timer is cancelled by the abort callback */
    c = cli_connect();
    assert_int_equal(cli_sends(c, "GET /defer?ms=200 HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
    assert_true(loop_until(&T.handled, 2, WAIT_MS));
    cli_close(c);
    assert_true(loop_until(&T.aborts, 2, WAIT_MS));
    assert_true(loop_until_conns(0, WAIT_MS));
}

static void test_free_with_pending(void **state)
{
    cli *c = cli_connect();

    assert_int_equal(cli_sends(c, "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
    assert_true(loop_until(&T.hang_pending, 1, WAIT_MS));
    gw_http_server_free(T.srv);
    T.srv = NULL;
    assert_int_equal(T.aborts, 1);
    assert_int_equal(T.hang_pending, 0);
    assert_true(cli_closed(c, WAIT_MS));
    cli_close(c);
}

static void big_body_then_new_conn(int chunked, int expect)
{
    const size_t total = 20 * MIB;
    char head[256];
    char *chunk = malloc(MIB);
    cli *c = cli_connect();
    resp r;
    int rc = 0;

    memset(chunk, 'x', MIB);
    if (chunked)
        snprintf(head, sizeof(head), "POST /len HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    else
        snprintf(head, sizeof(head), "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n%s\r\n",
                 total, expect ? "Expect: 100-continue\r\n" : "");
    assert_int_equal(cli_sends(c, head), 0);
    if (!expect) {
        /* the server may answer and stop listening before all of it is sent */
        for (size_t sent = 0; sent < total && rc == 0; sent += MIB) {
            if (chunked) {
                char sz[32];
                snprintf(sz, sizeof(sz), "%x\r\n", MIB);
                rc = cli_sends(c, sz);
                if (rc == 0)
                    rc = cli_send(c, chunk, MIB);
                if (rc == 0)
                    rc = cli_sends(c, "\r\n");
            } else {
                rc = cli_send(c, chunk, MIB);
            }
        }
        if (rc == 0 && chunked)
            rc = cli_sends(c, "0\r\n\r\n");
    }
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 413);
    assert_string_equal(r.body, "{\"error\":\"request body too large: the limit is 16 MiB\"}");
    assert_string_equal(rh(&r, "Connection"), "close");
    assert_string_equal(rh(&r, "Content-Type"), "application/json");
    resp_fini(&r);
    assert_int_equal(T.handled, 0);
    cli_close(c);
    free(chunk);

    /* the server is fine and serves a new connection */
    c = cli_connect();
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    cli_close(c);
    assert_true(loop_until_conns(0, WAIT_MS));
}

static void test_body_too_large(void **state)
{
    big_body_then_new_conn(0, 0);
}

static void test_body_too_large_chunked(void **state)
{
    big_body_then_new_conn(1, 0);
}

static void test_body_too_large_expect(void **state)
{
    big_body_then_new_conn(0, 1);
}

static void test_body_at_limit(void **state)
{
    /* exactly max_body is accepted */
    gw_http_limits lim = {.max_body = 1000};
    char head[128], *body = malloc(1001);
    cli *c;
    resp r;

    server_stop();
    server_start(&lim);
    c = cli_connect();
    memset(body, 'y', 1001);
    snprintf(head, sizeof(head), "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n");
    assert_int_equal(cli_sends(c, head), 0);
    assert_int_equal(cli_send(c, body, 1000), 0);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "1000");
    resp_fini(&r);
    snprintf(head, sizeof(head), "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n");
    assert_int_equal(cli_sends(c, head), 0);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 413);
    assert_string_equal(r.body, "{\"error\":\"request body too large: the limit is 1000 bytes\"}");
    resp_fini(&r);
    cli_close(c);
    free(body);
}

static void test_chunked(void **state)
{
    cli *c = cli_connect();
    resp r;

    request(c,
            "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
            &r, 200, "POST /echo? hello world");
    resp_fini(&r);
    /* and the connection goes on */
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    cli_close(c);
}

static void expect_error(const char *req, int status, const char *body_part)
{
    cli *c = cli_connect();
    resp r;

    assert_int_equal(cli_sends(c, req), 0);
    assert_int_equal(cli_read(c, &r, 0), 0);
    if (r.status != status)
        fprintf(stderr, "request %s: got %d %s\n", req, r.status, r.body ? r.body : "");
    assert_int_equal(r.status, status);
    assert_string_equal(rh(&r, "Connection"), "close");
    assert_string_equal(rh(&r, "Content-Type"), "application/json");
    assert_non_null(r.body);
    assert_non_null(strstr(r.body, body_part));
    resp_fini(&r);
    assert_true(cli_closed(c, WAIT_MS));
    cli_close(c);
}

static void test_malformed(void **state)
{
    expect_error("GARBAGE\r\n\r\n", 400, "malformed HTTP request");
    expect_error("GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "malformed HTTP request");
    expect_error("GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400, "malformed HTTP request");
    expect_error("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
                 "malformed HTTP request");
    expect_error("GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "use HTTP/1.1");
    expect_error("GET / HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n\r\n", 417, "100-continue");
    /* strict parsing (llhttp strict): request smuggling vectors are refused */
    expect_error("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400,
                 "malformed HTTP request");
    expect_error("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 400, "line folding");
    expect_error("GET / HTTP/1.1\nHost: x\n\n", 400, "malformed HTTP request");
    expect_error("GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", 400, "malformed HTTP request");
    expect_error("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "0\r\n\r\n", 400, "malformed HTTP request");
    expect_error("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi", 400,
                 "malformed HTTP request");
    expect_error("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\nhi\r\n0\r\n\r\n", 400,
                 "malformed HTTP request");
    /* a good request after a bad one on another connection still works */
    {
        cli *c = cli_connect();
        resp r;
        request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
        resp_fini(&r);
        cli_close(c);
    }
    assert_int_equal(T.handled, 1);
}

static void test_headers_too_large(void **state)
{
    size_t n = 70 * 1024;
    char *req = malloc(n + 128);
    int off = snprintf(req, n + 128, "GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: ");

    memset(req + off, 'a', n);
    memcpy(req + off + n, "\r\n\r\n", 5);
    expect_error(req, 431, "request headers too large: the limit is 64 KiB");
    /* many small headers count too */
    off = snprintf(req, n + 128, "GET /echo HTTP/1.1\r\n");
    while ((size_t)off < n)
        off += snprintf(req + off, n + 128 - (size_t)off, "X-H: 1\r\n");
    memcpy(req + off, "\r\n", 3);
    expect_error(req, 431, "request headers too large");
    free(req);
}

static void test_headers_limit_custom(void **state)
{
    gw_http_limits lim = {.max_header_bytes = 1024};
    char req[2048], val[1400];
    cli *c;
    resp r;

    server_stop();
    server_start(&lim);
    memset(val, 'v', sizeof(val));
    val[800] = '\0';
    snprintf(req, sizeof(req), "GET /hdr?x-v HTTP/1.1\r\nHost: x\r\nX-V: %s\r\n\r\n", val);
    c = cli_connect();
    request(c, req, &r, 200, val);
    resp_fini(&r);
    cli_close(c);
    val[800] = 'v';
    val[1300] = '\0';
    snprintf(req, sizeof(req), "GET /hdr?x-v HTTP/1.1\r\nHost: x\r\nX-V: %s\r\n\r\n", val);
    expect_error(req, 431, "request headers too large: the limit is 1 KiB");
}

static void test_uri_too_long(void **state)
{
    gw_http_limits lim = {.max_header_bytes = 128 * 1024};
    size_t n = 70 * 1024;
    char *req = malloc(n + 64);
    int off;

    server_stop();
    server_start(&lim);
    off = snprintf(req, n + 64, "GET /");
    memset(req + off, 'u', n);
    memcpy(req + off + n, " HTTP/1.1\r\n\r\n", 14);
    expect_error(req, 414, "request target too long: the limit is 65535 bytes");
    free(req);
}

static void test_expect_continue(void **state)
{
    cli *c = cli_connect();
    resp r;

    assert_int_equal(cli_sends(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                  "Expect: 100-continue\r\n\r\n"),
                     0);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 100);
    resp_fini(&r);
    assert_int_equal(T.handled, 0);
    assert_int_equal(cli_sends(c, "hello"), 0);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "POST /echo? hello");
    resp_fini(&r);
    cli_close(c);
}

static void test_head(void **state)
{
    cli *c = cli_connect();
    resp r;

    request(c, "HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, NULL);
    assert_string_equal(rh(&r, "Content-Length"), "12"); /* the length of "HEAD /echo? " */
    assert_int_equal(r.blen, 0);
    resp_fini(&r);
    /* no stray body bytes: the next response parses cleanly */
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    request(c, "GET /nocontent HTTP/1.1\r\nHost: x\r\n\r\n", &r, 204, NULL);
    assert_null(rh(&r, "Content-Length"));
    assert_int_equal(r.blen, 0);
    resp_fini(&r);
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    cli_close(c);
}

static void test_response_headers(void **state)
{
    cli *c = cli_connect();
    resp r;

    request(c, "GET /headers HTTP/1.1\r\nHost: x\r\n\r\n", &r, 201, "{}");
    assert_string_equal(rh(&r, "X-One"), "1");
    assert_null(rh(&r, "X-Bad"));
    assert_null(rh(&r, "Injected"));
    assert_string_equal(rh(&r, "Content-Length"), "2");
    assert_string_equal(rh(&r, "Cache-Control"), "max-age=5");
    assert_string_equal(rh(&r, "Connection"), "close");
    resp_fini(&r);
    assert_true(cli_closed(c, WAIT_MS));
    cli_close(c);
}

static void test_idle_timeout(void **state)
{
    gw_http_limits lim = {.idle_timeout_s = 1};
    cli *c;
    resp r;
    int64_t t0;

    server_stop();
    server_start(&lim);
    c = cli_connect();
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    t0 = now_ms();
    assert_true(cli_closed(c, 4000));
    assert_true(now_ms() - t0 >= 900);
    cli_close(c);
    assert_true(loop_until_conns(0, WAIT_MS));

    /* a slow handler is not cut off by the idle timeout */
    c = cli_connect();
    request(c, "GET /defer?ms=1300 HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "deferred 1300 ms=1300");
    resp_fini(&r);
    cli_close(c);
}

static void test_max_conns(void **state)
{
    gw_http_limits lim = {.max_conns = 1};
    cli *a, *b;
    resp r;

    server_stop();
    server_start(&lim);
    a = cli_connect();
    request(a, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    b = cli_connect();
    assert_int_equal(cli_read(b, &r, 0), 0);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "too many connections"));
    resp_fini(&r);
    cli_close(b);
    cli_close(a);
    assert_true(loop_until_conns(0, WAIT_MS));
    b = cli_connect();
    request(b, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    cli_close(b);
}

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

static void takeover_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    if (evbuffer_get_length(in) >= 24 + 4) {
        bufferevent_write(bev, "h2ok", 4);
        evbuffer_drain(in, 28);
    }
}

static void takeover_event(struct bufferevent *bev, short what, void *arg)
{
    bufferevent_free(bev);
}

static int takeover(struct bufferevent *bev, const char *peer, void *arg)
{
    tctx *t = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    assert_string_equal(peer, "127.0.0.1");
    assert_true(evbuffer_get_length(in) >= 24);
    assert_memory_equal(evbuffer_pullup(in, 24), preface, 24);
    t->takeovers++;
    bufferevent_setcb(bev, takeover_read, NULL, takeover_event, t);
    takeover_read(bev, t);
    return 0;
}

static void test_h2_preface(void **state)
{
    cli *c = cli_connect();
    resp r;

    /* without a hook: 505 */
    assert_int_equal(cli_send(c, preface, 24), 0);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 505);
    resp_fini(&r);
    cli_close(c);

    /* with the hook: the bufferevent is handed over with the preface unread */
    gw_http_server_set_takeover(T.srv, takeover, &T);
    c = cli_connect();
    assert_int_equal(cli_send(c, preface, 10), 0); /* partial preface: wait */
    loop_once();
    assert_int_equal(cli_send(c, preface + 10, 14), 0);
    assert_int_equal(cli_sends(c, "abcd"), 0);
    assert_true(loop_until(&T.takeovers, 1, WAIT_MS));
    assert_int_equal(gw_http_server_conns(T.srv), 0);
    while (c->len < 4 && cli_fill(c, WAIT_MS) == 1)
        ;
    assert_int_equal(c->len, 4);
    assert_memory_equal(c->buf + c->off, "h2ok", 4);
    cli_close(c);
    loop_until_conns(0, 50);

    /* HTTP/1 still works with the hook set, also for a prefix of "PRI" */
    c = cli_connect();
    request(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    cli_close(c);
    expect_error("PRI / HTTP/1.1\r\n\r\n", 400, "malformed");
    /* let the taken-over connection see its EOF and free itself */
    for (int i = 0; i < 20; i++) {
        loop_once();
        poll(NULL, 0, 1);
    }
}

/* The same scenario with a client in its own thread (blocking waits, as a real client),
 * while the main thread only runs the event loop. Results are checked back here. */
typedef struct thread_client {
    int port;
    int big_status, big_closed, next_status;
    char big_body[128], next_body[64];
    atomic_int done;
} thread_client;

static void *client_thread(void *arg)
{
    thread_client *tc = arg;
    const size_t total = 20 * MIB;
    char head[128], *chunk = calloc(1, MIB);
    struct sockaddr_in sa;
    cli *c = calloc(1, sizeof(*c));
    resp r;
    int rc = 0;

    in_client_thread = 1;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)tc->port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && fcntl(c->fd, F_SETFL, O_NONBLOCK) == 0) {
        snprintf(head, sizeof(head), "PUT /len HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", total);
        rc = cli_sends(c, head);
        for (size_t sent = 0; sent < total && rc == 0; sent += MIB)
            rc = cli_send(c, chunk, MIB);
        if (cli_read(c, &r, 0) == 0) {
            tc->big_status = r.status;
            snprintf(tc->big_body, sizeof(tc->big_body), "%s", r.body ? r.body : "");
            tc->big_closed = cli_closed(c, WAIT_MS);
        }
        resp_fini(&r);
    }
    close(c->fd);
    memset(c, 0, sizeof(*c));
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && fcntl(c->fd, F_SETFL, O_NONBLOCK) == 0 &&
        cli_sends(c, "GET /defer?ms=50 HTTP/1.1\r\nHost: x\r\n\r\n") == 0 && cli_read(c, &r, 0) == 0) {
        tc->next_status = r.status;
        snprintf(tc->next_body, sizeof(tc->next_body), "%s", r.body ? r.body : "");
    }
    resp_fini(&r);
    cli_close(c);
    free(chunk);
    atomic_store(&tc->done, 1);
    return NULL;
}

static void test_threaded_client(void **state)
{
    thread_client tc;
    pthread_t th;
    int64_t end = now_ms() + 30000;

    memset(&tc, 0, sizeof(tc));
    tc.port = T.port;
    assert_int_equal(pthread_create(&th, NULL, client_thread, &tc), 0);
    while (!atomic_load(&tc.done) && now_ms() < end) {
        event_base_loop(T.base, EVLOOP_NONBLOCK);
        poll(NULL, 0, 1);
    }
    assert_true(atomic_load(&tc.done));
    pthread_join(th, NULL);
    assert_int_equal(tc.big_status, 413);
    assert_string_equal(tc.big_body, "{\"error\":\"request body too large: the limit is 16 MiB\"}");
    assert_true(tc.big_closed);
    assert_int_equal(tc.next_status, 200);
    assert_string_equal(tc.next_body, "deferred 50 ms=50");
    assert_int_equal(T.handled, 1);
    assert_true(loop_until_conns(0, WAIT_MS));
}

/* ---- buffer budget (max_buffered_bytes) */

#define BUSY_JSON "{\"error\":\"The server is busy with other large requests; retry in a moment.\"}"

/* Sends a chunked body of total bytes in 64 KiB chunks (the server may answer and stop
 * listening first: then the rest is dropped). */
static void send_chunked(cli *c, const char *target, size_t total)
{
    const size_t step = 64 * 1024;
    char head[256], sz[32], *chunk = malloc(step);
    int rc;

    memset(chunk, 'c', step);
    snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
             target);
    rc = cli_sends(c, head);
    for (size_t sent = 0; sent < total && rc == 0; sent += step) {
        size_t n = total - sent < step ? total - sent : step;
        snprintf(sz, sizeof(sz), "%zx\r\n", n);
        rc = cli_sends(c, sz);
        if (rc == 0)
            rc = cli_send(c, chunk, n);
        if (rc == 0)
            rc = cli_sends(c, "\r\n");
    }
    if (rc == 0)
        cli_sends(c, "0\r\n\r\n");
    free(chunk);
}

/* Sends "POST target" with a Content-Length body of len bytes; returns the head length. */
static size_t send_post(cli *c, const char *target, const char *body, size_t len)
{
    char head[256];
    int n = snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n",
                     target, len);

    assert_int_equal(cli_sends(c, head), 0);
    if (body)
        assert_int_equal(cli_send(c, body, len), 0);
    return (size_t)n;
}

/* Reads the server's own 503 for an exhausted budget, then sees the connection close. */
static void expect_busy(cli *c)
{
    resp r;

    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 503);
    assert_string_equal(rh(&r, "Retry-After"), "1");
    assert_string_equal(rh(&r, "Connection"), "close");
    assert_string_equal(rh(&r, "Content-Type"), "application/json");
    assert_string_equal(r.body, BUSY_JSON);
    resp_fini(&r);
    assert_true(cli_closed(c, WAIT_MS));
}

static void test_budget(void **state)
{
    gw_http_limits lim = {.max_body = 4 * MIB, .max_buffered_bytes = MIB};
    const size_t big = 700 * 1024;
    char *body = malloc(big);
    cli *a, *b, *d;
    resp r;
    size_t ahead;

    server_stop();
    server_start(&lim);
    memset(body, 'b', big);
    assert_int_equal(gw_http_server_buffered(T.srv), 0);

    /* A: 700 KiB handed to a handler that does not answer yet; all of it stays counted */
    a = cli_connect();
    ahead = send_post(a, "/hang", body, big);
    assert_true(loop_until(&T.hang_pending, 1, WAIT_MS));
    assert_int_equal(T.last_body_len, big);
    assert_int_equal(gw_http_server_buffered(T.srv), ahead + big);

    /* B: another 700 KiB does not fit. Nothing is reserved for bytes that have not come
     * (a declared size alone cannot use up the budget): B gets 100 Continue, then 503 as
     * its body arrives */
    b = cli_connect();
    assert_int_equal(cli_sends(b, "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 716800\r\n"
                                  "Expect: 100-continue\r\n\r\n"),
                     0);
    assert_int_equal(cli_read(b, &r, 0), 0);
    assert_int_equal(r.status, 100);
    resp_fini(&r);
    assert_true(gw_http_server_buffered(T.srv) < ahead + big + 1024); /* only B's head */
    assert_int_equal(cli_send(b, body, big), 0);
    expect_busy(b);
    cli_close(b);
    assert_true(loop_until_buffered(ahead + big, WAIT_MS)); /* B's bytes released */

    /* the same with the body sent right behind the head */
    b = cli_connect();
    send_post(b, "/len", body, big);
    expect_busy(b);
    cli_close(b);

    /* a chunked 700 KiB body is refused while it streams in */
    b = cli_connect();
    send_chunked(b, "/len", big);
    expect_busy(b);
    cli_close(b);
    assert_true(loop_until_buffered(ahead + big, WAIT_MS));
    assert_int_equal(T.handled, 1);

    /* other requests are still served meanwhile: no body, and a body that fits */
    d = cli_connect();
    request(d, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "GET /echo? ");
    resp_fini(&r);
    send_post(d, "/len", body, 200 * 1024);
    assert_int_equal(cli_read(d, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "204800");
    resp_fini(&r);
    assert_int_equal(gw_http_server_buffered(T.srv), ahead + big);

    /* A is answered: its bytes are released ... */
    assert_non_null(T.hung);
    gw_req_respond(T.hung, 200, "text/plain", NULL, "done", 4);
    T.hung = NULL;
    T.hang_pending--;
    assert_int_equal(gw_http_server_buffered(T.srv), 0);
    assert_int_equal(cli_read(a, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "done");
    resp_fini(&r);

    /* ... and a third 700 KiB request goes through */
    b = cli_connect();
    send_post(b, "/len", body, big);
    assert_int_equal(cli_read(b, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "716800");
    resp_fini(&r);
    cli_close(b);

    /* a pending request whose client leaves is released by the abort */
    ahead = send_post(a, "/hang", body, big);
    assert_true(loop_until(&T.hang_pending, 1, WAIT_MS));
    assert_int_equal(gw_http_server_buffered(T.srv), ahead + big);
    cli_close(a);
    assert_true(loop_until(&T.aborts, 1, WAIT_MS));

    cli_close(d);
    assert_true(loop_until_conns(0, WAIT_MS));
    assert_int_equal(gw_http_server_buffered(T.srv), 0);
    free(body);
}

static void test_budget_too_large_alone(void **state)
{
    /* a request that could not fit even on an idle server: 413, not "retry" */
    gw_http_limits lim = {.max_body = 4 * MIB, .max_buffered_bytes = MIB};
    cli *c;
    resp r;

    server_stop();
    server_start(&lim);
    expect_error("POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n", 413,
                 "request too large: headers and body together may not exceed 1 MiB");
    c = cli_connect();
    send_chunked(c, "/len", 2 * MIB);
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 413);
    assert_string_equal(r.body, "{\"error\":\"request too large: headers and body together may not "
                                "exceed 1 MiB\"}");
    assert_null(rh(&r, "Retry-After"));
    resp_fini(&r);
    cli_close(c);
    assert_int_equal(T.handled, 0);
    assert_true(loop_until_conns(0, WAIT_MS));
    assert_int_equal(gw_http_server_buffered(T.srv), 0);
}

static void test_budget_pipelined(void **state)
{
    /* bytes pipelined behind a pending request count: with them a 900 KiB body does not
     * fit the 1 MiB budget, without them it does */
    gw_http_limits lim = {.max_body = 4 * MIB, .max_buffered_bytes = MIB};
    static const char first[] = "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n";
    const size_t piped = 200 * 1024, big = 900 * 1024;
    char head[128], *body = malloc(big);
    size_t second;
    cli *p, *q;
    resp r;

    server_stop();
    server_start(&lim);
    memset(body, 'p', big);
    second = (size_t)snprintf(head, sizeof(head),
                              "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", piped);
    p = cli_connect();
    assert_int_equal(cli_sends(p, first), 0);
    assert_int_equal(cli_sends(p, head), 0);
    assert_int_equal(cli_send(p, body, piped), 0);
    assert_true(loop_until(&T.hang_pending, 1, WAIT_MS));
    assert_true(loop_until_buffered(sizeof(first) - 1 + second + piped, WAIT_MS));
    assert_int_equal(T.handled, 1);

    q = cli_connect();
    send_post(q, "/len", body, big);
    expect_busy(q);
    cli_close(q);
    assert_true(loop_until_buffered(sizeof(first) - 1 + second + piped, WAIT_MS));

    /* answering the first request lets the pipelined one run; then 900 KiB fits */
    gw_req_respond(T.hung, 200, "text/plain", NULL, "done", 4);
    T.hung = NULL;
    T.hang_pending--;
    assert_int_equal(cli_read(p, &r, 0), 0);
    assert_string_equal(r.body, "done");
    resp_fini(&r);
    assert_int_equal(cli_read(p, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "204800");
    resp_fini(&r);
    assert_int_equal(gw_http_server_buffered(T.srv), 0);
    q = cli_connect();
    send_post(q, "/len", body, big);
    assert_int_equal(cli_read(q, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "921600");
    resp_fini(&r);
    cli_close(q);
    cli_close(p);
    assert_true(loop_until_conns(0, WAIT_MS));
    assert_int_equal(gw_http_server_buffered(T.srv), 0);
    free(body);
}

static void adopt_pair(gw_http_server *srv, int *client_fd)
{
    int sv[2];
    struct bufferevent *bev;

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    bev = bufferevent_socket_new(T.base, sv[0], BEV_OPT_CLOSE_ON_FREE);
    assert_non_null(bev);
    assert_int_equal(gw_http_server_adopt(srv, bev, "10.1.2.3"), 0);
    *client_fd = sv[1];
}

static void test_adopt(void **state)
{
    cli *c = calloc(1, sizeof(*c));
    resp r;

    adopt_pair(T.srv, &c->fd);
    request(c, "GET /peer HTTP/1.1\r\nHost: x\r\n\r\n", &r, 200, "10.1.2.3 0");
    resp_fini(&r);
    cli_close(c);
    assert_true(loop_until_conns(0, WAIT_MS));
}

static void test_bad_args(void **state)
{
    assert_null(gw_http_server_new(NULL, "127.0.0.1", 0, NULL, handler, NULL));
    assert_null(gw_http_server_new(T.base, "127.0.0.1", 70000, NULL, handler, NULL));
    errno = 0;
    assert_null(gw_http_server_new(T.base, "127.0.0.1", -2, NULL, handler, NULL));
    assert_int_equal(errno, EINVAL);
    /* the port is taken */
    errno = 0;
    assert_null(gw_http_server_new(T.base, "127.0.0.1", T.port, NULL, handler, NULL));
    assert_int_equal(errno, EADDRINUSE);
    /* a host name from /etc/hosts */
    {
        gw_http_server *s = gw_http_server_new(T.base, "localhost", 0, NULL, handler, NULL);
        assert_non_null(s);
        assert_true(gw_http_server_port(s) > 0);
        gw_http_server_free(s);
    }
    gw_http_server_free(NULL);
    {
        gw_http_server *s = gw_http_server_new(T.base, NULL, -1, NULL, handler, NULL);
        assert_non_null(s);
        assert_int_equal(gw_http_server_port(s), -1);
        gw_http_server_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_get_post, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_packets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_router, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadlines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_addr_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_head_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keepalive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_http10, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_burst, setup, teardown),
        cmocka_unit_test_setup_teardown(test_big_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_with_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large_chunked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large_expect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_at_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_headers_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_headers_limit_custom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uri_too_long, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expect_continue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_head, setup, teardown),
        cmocka_unit_test_setup_teardown(test_response_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_conns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_h2_preface, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threaded_client, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_too_large_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_pipelined, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adopt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
    };

    signal(SIGPIPE, SIG_IGN);
    sf_log_init("test_http1", SF_LOG_WARN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
