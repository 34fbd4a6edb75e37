/* http1.c: the HTTP/1.1 leaf of the server (server.h). server.c hands it a connection
 * whose first bytes are not TLS nor the HTTP/2 preface (gw_h1_serve); it hands a request
 * with `Upgrade: h2c` on to HTTP/2 through gw_conn_serve (conn.h), never calling http2.c.
 *
 * A connection is a small state machine around one bufferevent:
 *
 *   READ ──(request complete)──▶ PENDING
 *   ▲  │                           │ gw_req_respond()
 *   │  └─(limit / syntax error)─┐  ▼
 *   └──(keep-alive, drained)── WRITE ──(close)──▶ LINGER
 *
 * READ feeds the input buffer to llhttp (strict), which pauses itself at the end of each
 * message, so at most one request per connection exists at a time and later pipelined
 * bytes simply stay in the input buffer (capped by a read high-water mark) until the
 * response has been written. Reading stays enabled while a request is PENDING so that
 * a client closing the connection is noticed at once (abort callback).
 *
 * Buffer budget: each connection's share of srv->buffered is (conn_account): the raw bytes
 * the parser took for the current request (req_bytes, kept until it is answered) plus the
 * input buffer or, while a Content-Length body is still due, the rest of that body,
 * whichever is larger (the input holds that body first, so the two overlap). conn_account()
 * re-syncs the share after every change (bytes read, drained, parsed, request ended) and
 * conn_free() returns it, so the total goes back to exactly 0. For a request with a body
 * the parser pauses after the head, so that the check runs with the head's bytes moved
 * from the input to req_bytes and the body's reservation known.
 */
#include "proto.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <llhttp.h>

#include "conn.h"
#include "req_int.h"
#include "sf_bev.h"
#include "sf_buf.h"
#include "sf_list.h"
#include "sf_log.h"
#include "sf_map.h"
#include "sf_msg.h"

#define GW_HTTP_MAX_TARGET    GW_REQ_MAX_TARGET
#define GW_HTTP_MAX_HEAD      (1u << 20)   /* response status line + headers */


enum conn_state {
    C_READ,    /* parsing a request */
    C_HEADCHECK, /* the head check decides whether the body may come */
    C_PENDING, /* the handler owns the request */
    C_STREAM,  /* the handler streams the response (chunked) */
    C_WRITE,   /* response queued, waiting for the output buffer to drain */
    C_LINGER,  /* write side shut down, discarding input until EOF or a timeout */
    C_DEAD,    /* being freed */
};

struct gw_conn {
    gw_http_server *srv;
    gw_conn *prev, *next;
    struct bufferevent *bev;
    struct event *linger_ev;
    llhttp_t parser;
    gw_req *cur;         /* request being parsed or pending */
    enum conn_state state;
    int err_status;      /* set by a parser callback that stops the parse */
    const char *err_msg;
    size_t hdr_bytes;
    unsigned keep_alive : 1, in_body : 1, peer_eof : 1, close_after : 1;
    unsigned head_paused : 1, want_continue : 1, h2c_upgrade : 1, tls : 1, head_checked : 1;
    unsigned parsing : 1;
    unsigned divert : 1;   /* the head matched the server's divert hook: hand it over */
    unsigned raw : 1;      /* a plain socket: answers are written to it at once (conn_flush) */
    gw_addr *addr;         /* the client address's counts (NULL once handed over) */
    struct event *deadline_ev; /* header / body deadline (408) */
    int deadline_kind;     /* 0 none, 1 headers, 2 body */
    int deadline_armed;    /* deadline_ev is pending, to fire at deadline_fire */
    uint64_t deadline_at, deadline_fire; /* monotonic ms */
    unsigned rd_full : 1;  /* raw: reading paused, the input holds GW_HTTP_INPUT_HIGH_WM */
    size_t rd_max;         /* raw: the largest read allowed now */
    struct event *rd_ev;   /* raw: the server's own reader (conn_rd_cb); NULL: the
                              bufferevent reads (TLS, or handed over) */
    struct timeval dispatched; /* (cached time) when the current request went to its handler */
    size_t req_bytes;      /* raw bytes parsed for the current request (budget) */
    size_t body_left;      /* Content-Length body bytes not parsed yet (not reserved) */
    size_t held;           /* this connection's share of srv->buffered */
    const char *exec_base; /* start of the bytes llhttp_execute() is parsing */
    char prev_tail;        /* the last byte parsed before exec_base */
    int peer_port;
    char peer[INET6_ADDRSTRLEN + 8];
    char err_text[128];    /* a formatted err_msg */
};

static void conn_read_cb(struct bufferevent *bev, void *arg);
static void conn_write_cb(struct bufferevent *bev, void *arg);
static void conn_event_cb(struct bufferevent *bev, short what, void *arg);
static void conn_parse(gw_conn *c);
static void conn_upgrade_h2c(gw_conn *c);
static void conn_divert(gw_conn *c);

static const char busy_msg[] = SF_MSG_HTTP_BUSY;

/* ------------------------------------------------------------------ helpers */

static void fmt_size(char *out, size_t outlen, size_t v)
{
    if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(out, outlen, "%zu MiB", v >> 20);
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(out, outlen, "%zu KiB", v >> 10);
    else
        snprintf(out, outlen, "%zu bytes", v);
}

/* The idle timeouts (idle_timeout_s) of a connection are set once: a read timeout counts
 * only while the client owes us a request (conn_event_cb ignores it while an answer is
 * due); setting them per request (three times) re-added both events each time. */
static void conn_timeouts(gw_conn *c, int rd, int wr)
{
    struct timeval tv = {(time_t)c->srv->lim.idle_timeout_s, 0};

    if (c->rd_ev) { /* the read timeout is the own reader's */
        if (!c->rd_full)
            event_add(c->rd_ev, rd ? &tv : NULL);
        bufferevent_set_timeouts(c->bev, NULL, wr ? &tv : NULL);
        return;
    }
    bufferevent_set_timeouts(c->bev, rd ? &tv : NULL, wr ? &tv : NULL);
}

/* ------------------------------------------------------------------ buffer budget */

/* Pipelined input waits in the input buffer while a request runs, at most
 * GW_HTTP_INPUT_HIGH_WM bytes. On a plain socket the server keeps that bound itself (a
 * read takes at most what is left below it; reading pauses when it is reached) instead of
 * libevent's read watermark, whose callback re-added the read event, with its timeout, at
 * every drain (three times per request). */
static void conn_input_limit(gw_conn *c, size_t in)
{
    size_t room = in < GW_HTTP_INPUT_HIGH_WM ? GW_HTTP_INPUT_HIGH_WM - in : 0;

    if (!c->raw || !c->bev || c->state == C_LINGER || c->state == C_DEAD)
        return;
    if (room == 0) {
        if (!c->rd_full) {
            c->rd_full = 1;
            if (c->rd_ev)
                event_del(c->rd_ev);
            else
                bufferevent_disable(c->bev, EV_READ);
        }
        return;
    }
    if (c->rd_full) {
        c->rd_full = 0;
        if (c->rd_ev)
            conn_timeouts(c, 1, 1);
        else
            bufferevent_enable(c->bev, EV_READ);
    }
    c->rd_max = room < GW_HTTP_MAX_IO ? room : GW_HTTP_MAX_IO;
}

/* The bufferevent leaves this connection, or goes on alone (lingering close): it reads
 * again itself, as libevent has it by default. */
static void conn_input_unlimit(gw_conn *c)
{
    if (!c->raw || !c->bev)
        return;
    if (c->rd_ev) {
        event_free(c->rd_ev);
        c->rd_ev = NULL;
    }
    c->rd_full = 0;
    c->rd_max = GW_HTTP_MAX_IO;
    bufferevent_set_max_single_read(c->bev, GW_HTTP_MAX_IO);
    bufferevent_enable(c->bev, EV_READ);
}

/* Brings this connection's share of the server total up to date. */
static void conn_account(gw_conn *c)
{
    size_t in = c->bev ? evbuffer_get_length(bufferevent_get_input(c->bev)) : 0;
    size_t now = c->req_bytes + in; /* its share: only bytes that arrived */

    conn_input_limit(c, in);
    if (now > c->held)
        gw_budget_add(c->srv, c->addr, now - c->held);
    else
        gw_budget_sub(c->srv, c->addr, c->held - now);
    c->held = now;
}

static const char addr_busy_msg[] =
    "This client address holds too many connections or request bytes; retry in a moment.";

static int addr_over(const gw_conn *c)
{
    return c->addr && __atomic_load_n(&c->addr->buffered, __ATOMIC_RELAXED) >
                          c->srv->lim.max_buffered_per_addr;
}

/* ------------------------------------------------------------------ deadlines */

static void conn_error(gw_conn *c, int status, const char *msg);

static void conn_deadline_arm(gw_conn *c, uint64_t now, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};

    if (evtimer_add(c->deadline_ev, &tv) == 0) {
        c->deadline_armed = 1;
        c->deadline_fire = now + ms;
    }
}

static void conn_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_conn *c = arg;
    int kind = c->deadline_kind;
    uint64_t now;

    c->deadline_armed = 0;
    if (!kind)
        return;
    if ((now = sf_mono_ms()) < c->deadline_at) { /* a later deadline than the one armed */
        conn_deadline_arm(c, now, c->deadline_at - now);
        return;
    }
    c->deadline_kind = 0;
    if (c->state != C_READ && c->state != C_HEADCHECK)
        return;
    if (c->bev)
        evbuffer_drain(bufferevent_get_input(c->bev),
                       evbuffer_get_length(bufferevent_get_input(c->bev)));
    sf_info("msg=\"request too slow: 408\" peer=%s part=%s", c->peer,
            kind == 2 ? "body" : "headers");
    conn_error(c, 408, kind == 2 ? "request body not received in time; send it at once"
                                 : "request headers not received in time; send them at once");
}

/* Sets (kind 1 headers, 2 body; ms from now) or ends (kind 0) the deadline. The timer is
 * lazy: ending a deadline leaves it armed, and a new deadline later than the armed one
 * leaves it too; when it fires it arms itself again for a deadline that moved (two
 * evtimer changes per request were 5% of a request's instructions). */
static void conn_deadline(gw_conn *c, int kind, uint64_t ms)
{
    uint64_t now;

    c->deadline_kind = kind;
    if (!kind)
        return;
    if (!c->deadline_ev && !(c->deadline_ev = evtimer_new(c->srv->base, conn_deadline_cb, c))) {
        c->deadline_kind = 0;
        return;
    }
    now = sf_mono_ms();
    c->deadline_at = now + ms;
    if (!c->deadline_armed || c->deadline_at < c->deadline_fire)
        conn_deadline_arm(c, now, ms);
}

/* The current request is over (answered or rejected): its bytes are released. */
static void conn_release_req(gw_conn *c)
{
    c->req_bytes = 0;
    c->body_left = 0;
    conn_account(c);
}

/* The parser took n bytes from the input: they now belong to the current request. */
static void conn_consumed(gw_conn *c, size_t n)
{
    evbuffer_drain(bufferevent_get_input(c->bev), n);
    c->req_bytes += n;
    conn_account(c);
}

/* The user-facing reasons for refusing a request over the budget. */
static const char *budget_busy(gw_conn *c)
{
    sf_warn("msg=\"request refused: the buffer budget is used up\" peer=%s buffered=%zu "
            "max_buffered_bytes=%zu", c->peer, c->srv->buffered, c->srv->lim.max_buffered_bytes);
    return busy_msg;
}

static const char *budget_too_large(gw_conn *c)
{
    char size[32];

    fmt_size(size, sizeof(size), c->srv->lim.max_buffered_bytes);
    snprintf(c->err_text, sizeof(c->err_text),
             "request too large: headers and body together may not exceed %s", size);
    return c->err_text;
}

/* ------------------------------------------------------------------ requests */

static void h1_respond(gw_req *r, int status, const char *ctype, const char *const *headers,
                       const char *body, size_t len);
static int h1_stream_begin(gw_req *r, int status, const char *ctype, const char *const *headers);
static int h1_stream_write(gw_req *r, const char *data, size_t len);
static void h1_stream_end(gw_req *r);
static void h1_head_verdict(gw_req *r, int status, const char *msg);

static const gw_req_transport h1_transport = {
    .respond = h1_respond,
    .stream_begin = h1_stream_begin,
    .stream_write = h1_stream_write,
    .stream_end = h1_stream_end,
    .head_verdict = h1_head_verdict,
};

static gw_req *req_new(gw_conn *c)
{
    gw_req *r = gw_req_new(&h1_transport, c->srv, c, c->srv->lim.max_header_bytes,
                           c->srv->lim.max_body);

    if (r) {
        r->peer = c->peer;
        r->peer_port = c->peer_port;
        r->proto = c->tls ? "http/1.1+tls" : "http/1.1";
    }
    return r;
}

static void req_free(gw_req *r)
{
    gw_req_free(r);
}

/* ------------------------------------------------------------------ parser callbacks */

static int conn_fail(gw_conn *c, int status, const char *msg)
{
    if (!c->err_status) {
        c->err_status = status;
        c->err_msg = msg;
    }
    return -1;
}

static int count_header_bytes(gw_conn *c, size_t n)
{
    c->hdr_bytes += n;
    if (c->hdr_bytes > c->srv->lim.max_header_bytes)
        return conn_fail(c, 431, NULL);
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    gw_conn *c = p->data;

    if (c->cur)
        return conn_fail(c, 500, SF_MSG_HTTP_STATE_ORDER_WHY);
    c->hdr_bytes = 0;
    c->in_body = 0;
    c->head_paused = 0;
    c->want_continue = 0;
    c->h2c_upgrade = 0;
    c->head_checked = 0;
    c->divert = 0;
    c->body_left = 0;
    c->cur = req_new(c);
    if (!c->cur)
        return conn_fail(c, 503, SF_MSG_SERVER_NOMEM_WHY);
    return 0;
}

static int on_method_complete(llhttp_t *p)
{
    /* "PRI" only starts the HTTP/2 preface, which the sniffer handled already */
    if (p->method == HTTP_PRI)
        return conn_fail(p->data, 400, "malformed HTTP request: PRI is not an HTTP/1 method");
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
    gw_conn *c = p->data;

    if (count_header_bytes(c, len) < 0)
        return -1;
    if (c->cur->target.len + len > GW_HTTP_MAX_TARGET)
        return conn_fail(c, 414, "request target too long: the limit is 65535 bytes");
    if (sf_buf_append(&c->cur->target, at, len) < 0)
        return conn_fail(c, 503, SF_MSG_SERVER_NOMEM_WHY);
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    gw_conn *c = p->data;
    gw_req *r = c->cur;
    int rc;

    if (c->in_body) /* trailer fields after a chunked body: counted, not kept */
        return count_header_bytes(c, len);
    if (r->hstate != GW_H_FIELD && count_header_bytes(c, 4) < 0) /* ": " and CRLF */
        return -1;
    if (count_header_bytes(c, len) < 0)
        return -1;
    rc = gw_req_hdr_field(r, at, len);
    if (rc == -ENOMEM)
        return conn_fail(c, 503, SF_MSG_SERVER_NOMEM_WHY);
    return rc < 0 ? conn_fail(c, 431, NULL) : 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    gw_conn *c = p->data;
    int rc;

    /* A value span right after a line end is a value continued on the next line (llhttp
     * accepts obs-fold even in strict mode). */
    if (len > 0 && (at[0] == ' ' || at[0] == '\t') &&
        (at > c->exec_base ? at[-1] : c->prev_tail) == '\n')
        return conn_fail(c, 400, "malformed HTTP request: obsolete line folding is not "
                                 "accepted; send each header on one line");
    if (c->in_body)
        return count_header_bytes(c, len);
    if (count_header_bytes(c, len) < 0)
        return -1;
    rc = gw_req_hdr_value(c->cur, at, len);
    if (rc == -EINVAL)
        return conn_fail(c, 400, "malformed HTTP request: header value without a name");
    if (rc == -ENOMEM)
        return conn_fail(c, 503, SF_MSG_SERVER_NOMEM_WHY);
    return rc < 0 ? conn_fail(c, 431, NULL) : 0;
}

/* An `Upgrade: h2c` we take: HTTP/2 served, h2c offered with its settings, no body. */
static int wants_h2c(gw_conn *c, gw_req *r, int has_body)
{
    const char *up = gw_req_header(r, "Upgrade"), *conn = gw_req_header(r, "Connection");
    const char *settings = gw_req_header(r, "HTTP2-Settings");

    return c->srv->h2 && !c->tls && !has_body && up && gw_http_has_token(up, "h2c") && conn &&
           gw_http_has_token(conn, "upgrade") && gw_http_has_token(conn, "http2-settings") &&
           settings;
}

static int on_headers_complete(llhttp_t *p)
{
    gw_conn *c = p->data;
    gw_req *r = c->cur;
    gw_http_server *s = c->srv;
    const char *expect;
    int has_body, rc;

    if (gw_req_hdr_finish(r) < 0)
        return conn_fail(c, 431, NULL);
    if (p->http_major != 1)
        return conn_fail(c, 505, "HTTP version not supported: use HTTP/1.1");
    r->minor = p->http_minor;
    r->proto = c->tls ? "http/1.1+tls" : (p->http_minor ? "http/1.1" : "http/1.0");
    r->method = llhttp_method_name((llhttp_method_t)p->method);
    r->head = p->method == HTTP_HEAD;
    if (p->method == HTTP_CONNECT)
        return conn_fail(c, 405, "CONNECT is not served here");
    rc = gw_req_split_target(r);
    if (rc == -ENOMEM)
        return conn_fail(c, 503, SF_MSG_SERVER_NOMEM_WHY);
    if (rc < 0)
        return conn_fail(c, 400, "malformed HTTP request: invalid request target");
    if (s->divert_match && s->divert_match(r, s->divert_arg)) {
        c->divert = 1; /* the rest of the connection is not ours (conn_divert) */
        return HPE_PAUSED;
    }
    has_body = (p->flags & F_CHUNKED) || ((p->flags & F_CONTENT_LENGTH) && p->content_length > 0);
    if ((p->flags & F_CONTENT_LENGTH) && !(p->flags & F_CHUNKED) &&
        p->content_length > (uint64_t)s->lim.max_body)
        return conn_fail(c, 413, NULL);
    if (p->upgrade) {
        /* Only h2c is taken; any other Upgrade is served as a plain HTTP/1.1 request. */
        c->h2c_upgrade = wants_h2c(c, r, has_body) ? 1 : 0;
        p->upgrade = 0;
    }
    c->keep_alive = llhttp_should_keep_alive(p) ? 1 : 0;
    expect = gw_req_header(r, "Expect");
    if (expect) {
        if (strcasecmp(expect, "100-continue") != 0)
            return conn_fail(c, 417, "unsupported Expect header: only 100-continue is understood");
        c->want_continue = has_body && r->minor >= 1;
    }
    c->in_body = 1;
    conn_deadline(c, 0, 0);
    if (has_body) { /* conn_body_start() checks the head and the budget, then reads on */
        uint64_t size = (p->flags & F_CHUNKED) ? s->lim.max_body : p->content_length;
        c->body_left = (p->flags & F_CHUNKED) ? 0 : (size_t)p->content_length;
        c->head_paused = 1;
        conn_deadline(c, 2, s->lim.body_timeout_ms + size * 1000 / s->lim.body_min_rate);
        return HPE_PAUSED;
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    gw_conn *c = p->data;
    gw_http_server *s = c->srv;
    int rc;

    /* Body bytes were counted in s->buffered when they were read (nothing is reserved):
     * refuse once this request alone, its address, or the total is over its budget. */
    if (p->flags & F_CHUNKED) {
        size_t own = c->req_bytes + (size_t)(at + len - c->exec_base);

        if (own > s->lim.max_buffered_bytes)
            return conn_fail(c, 413, budget_too_large(c));
    } else {
        c->body_left -= len < c->body_left ? len : c->body_left;
    }
    if (addr_over(c))
        return conn_fail(c, 429, addr_busy_msg);
    if (s->buffered > s->lim.max_buffered_bytes)
        return conn_fail(c, 503, budget_busy(c));
    rc = sf_buf_append(&c->cur->body, at, len);

    if (rc == -E2BIG)
        return conn_fail(c, 413, NULL);
    if (rc < 0)
        return conn_fail(c, 503, SF_MSG_SERVER_NOMEM_WHY);
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    /* Stop after each message: the next pipelined one waits for this response. */
    return HPE_PAUSED;
}

static const llhttp_settings_t gw_parser_settings = {
    .on_message_begin = on_message_begin,
    .on_method_complete = on_method_complete,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ------------------------------------------------------------------ responses */

/* Appends NUL-terminated strings (NULL ends the list): the head is assembled without
 * printf, which was the largest share of the gateway's own CPU time per answer. */
static int head_add(sf_buf *h, ...)
{
    va_list ap;
    int rc = 0;

    va_start(ap, h);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *)) {
        size_t n = strlen(s);

        if (h->p && n < h->cap - h->len && n <= h->max - h->len) { /* room: no call */
            memcpy(h->p + h->len, s, n);
            h->len += n;
            h->p[h->len] = '\0';
        } else {
            rc |= sf_buf_append(h, s, n);
        }
    }
    va_end(ap);
    return rc;
}


#define GW_HTTP_DIRECT_IOV  16          /* parts of an answer sent without the output buffer */
#define GW_HTTP_HEAD_KEEP   (16u << 10) /* a server keeps a head buffer up to this size */

/* On a plain socket with nothing queued, an answer goes out with one sendmsg from where
 * its parts are (the head, then the body or the handler's pieces), without the output
 * evbuffer (a chain allocated per part, and its write path); only what the socket does
 * not take now is queued there (referenced pieces by reference), for the write event,
 * which also reports a write error. 0, -ENOMEM, or 1 when the answer has too many parts
 * (the caller queues it). */
static int conn_send_direct(gw_conn *c, const sf_buf *h, const char *body, size_t len)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    const gw_req *r = c->cur;
    struct iovec iov[GW_HTTP_DIRECT_IOV];
    int ref[GW_HTTP_DIRECT_IOV];
    struct msghdr m;
    size_t k = 0;
    ssize_t sent;
    int rc = 0;

    iov[k] = (struct iovec){h->p, h->len};
    ref[k++] = 0;
    if (body && len > 0) {
        iov[k] = (struct iovec){(void *)body, len};
        ref[k++] = 0;
    } else if (!body && len > 0) {
        if (!r || r->npieces >= GW_HTTP_DIRECT_IOV)
            return 1;
        for (size_t i = 0; i < r->npieces; i++) {
            iov[k] = (struct iovec){(void *)r->pieces[i].p, r->pieces[i].n};
            ref[k++] = r->pieces[i].ref;
        }
    }
    memset(&m, 0, sizeof(m));
    m.msg_iov = iov;
    m.msg_iovlen = k;
    sent = sendmsg(bufferevent_getfd(c->bev), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0)
        sent = 0; /* EAGAIN, or an error that the write event reports */
    for (size_t i = 0; i < k && rc == 0; i++) {
        size_t skip = (size_t)sent < iov[i].iov_len ? (size_t)sent : iov[i].iov_len;
        const char *p = (const char *)iov[i].iov_base + skip;
        size_t n = iov[i].iov_len - skip;

        sent -= (ssize_t)skip;
        if (n > 0)
            rc = ref[i] ? evbuffer_add_reference(out, p, n, NULL, NULL) : evbuffer_add(out, p, n);
    }
    return rc < 0 ? -ENOMEM : 0;
}

/* Queues status line, headers and body (or sends them at once: conn_send_direct). *keep
 * may be cleared (handler asked to close, or out of memory). Returns 0, or -ENOMEM when
 * the output could not be queued whole. */
static int conn_write_response(gw_conn *c, int minor, int status, const char *ctype,
                               const char *const *headers, const char *body, size_t len,
                               int send_body, int *keep, int stream, const char *rid)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    int no_len = status == 204 || status == 304;
    int has_cc = 0, rc = 0;
    char num[24];
    sf_buf *hp = &c->srv->head, h;

    h = *hp; /* the server's head buffer, kept between answers */
    sf_buf_reset(&h);
    h.max = GW_HTTP_MAX_HEAD;
    if (status < 100 || status > 999)
        status = 500;
    rc |= head_add(&h, "HTTP/1.1 ", gw_fmt_uint_at(num, (size_t)status), " ", gw_http_reason(status),
                   "\r\nDate: ", gw_http_date(&c->srv->date_sec, c->srv->date), "\r\n", NULL);
    if (ctype && *ctype) {
        if (gw_http_is_field_value(ctype))
            rc |= head_add(&h, "Content-Type: ", ctype, "\r\n", NULL);
        else
            sf_warn("msg=\"dropped a Content-Type with CR/LF\" peer=%s", c->peer);
    }
    for (size_t i = 0; headers && headers[i] && headers[i + 1]; i += 2) {
        const char *name = headers[i], *value = headers[i + 1];

        if (!gw_http_is_token(name) || !gw_http_is_field_value(value)) {
            sf_warn("msg=\"dropped an invalid response header\" peer=%s", c->peer);
            continue;
        }
        if (strcasecmp(name, "Connection") == 0) {
            if (gw_http_has_token(value, "close"))
                *keep = 0;
            continue;
        }
        if (gw_http_is_framing(name))
            continue;
        if (strcasecmp(name, "Cache-Control") == 0)
            has_cc = 1;
        rc |= head_add(&h, name, ": ", value, "\r\n", NULL);
    }
    if (!has_cc)
        rc |= sf_buf_append(&h, "Cache-Control: no-store\r\n", 25);
    if (rid)
        rc |= head_add(&h, "X-Request-Id: ", rid, "\r\n", NULL);
    if (stream) {
        if (minor >= 1)
            rc |= sf_buf_append(&h, "Transfer-Encoding: chunked\r\n", 28);
        else
            *keep = 0; /* HTTP/1.0: the end of the body is the end of the connection */
    } else if (!no_len) {
        rc |= head_add(&h, "Content-Length: ", gw_fmt_uint_at(num, len), "\r\n", NULL);
    }
    if (!*keep)
        rc |= sf_buf_append(&h, "Connection: close\r\n", 19);
    else if (minor == 0)
        rc |= sf_buf_append(&h, "Connection: keep-alive\r\n", 24);
    rc |= sf_buf_append(&h, "\r\n", 2);

    if (rc != 0) {
        static const char fallback[] = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"
                                       "Connection: close\r\n\r\n";
        sf_error("msg=\"could not build the response head\" status=%d peer=%s", status, c->peer);
        sf_buf_fini(&h);
        *hp = h;
        *keep = 0;
        return evbuffer_add(out, fallback, sizeof(fallback) - 1) < 0 ? -ENOMEM : 0;
    }
    if (!send_body || no_len)
        len = 0;
    rc = 1;
    if (c->raw && !stream && evbuffer_get_length(out) == 0)
        rc = conn_send_direct(c, &h, body, len);
    if (rc == 1) {
        rc = evbuffer_add(out, h.p, h.len);
        if (rc == 0 && len > 0)
            rc = gw_body_add(out, c->cur, body, len);
    }
    if (h.cap > GW_HTTP_HEAD_KEEP)
        sf_buf_fini(&h);
    *hp = h;
    if (rc < 0) {
        *keep = 0;
        return -ENOMEM;
    }
    return 0;
}

/* Writes what the output holds straight to a plain socket (one writev, no write event to
 * arm and disarm per answer); what the socket does not take now, and everything on a TLS
 * connection, is left to the bufferevent's write event (which also reports a write error).
 * 1 when the output is empty. */
static int conn_flush(gw_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);

    if (c->raw && evbuffer_get_length(out) > 0) {
        /* a socket bufferevent keeps its output's front frozen outside its own writes */
        evbuffer_unfreeze(out, 1);
        (void)evbuffer_write(out, bufferevent_getfd(c->bev));
        evbuffer_freeze(out, 1);
    }
    if (evbuffer_get_length(out) == 0)
        return 1;
    bufferevent_enable(c->bev, EV_WRITE);
    return 0;
}

static void conn_reset(gw_conn *c);

/* An answer was queued (state C_WRITE): send it. When it all went out at once inside the
 * parse loop (the handler answered synchronously) and the connection stays, the loop
 * parses the next pipelined request itself; otherwise conn_write_cb goes on, from the
 * event loop: once the bufferevent drained the rest, or deferred, so that no handler ever
 * runs inside another one's answer and a connection is never freed under its caller. */
static void conn_sent(gw_conn *c)
{
    if (!conn_flush(c))
        return;
    if (c->parsing && !c->close_after && c->state == C_WRITE)
        conn_reset(c);
    else
        bufferevent_trigger(c->bev, EV_WRITE, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* Answers a request the server rejects by itself, then closes. */
static void conn_error(gw_conn *c, int status, const char *msg)
{
    static const char *const retry_after[] = {"Retry-After", "1", NULL};
    static const char *const www_auth_bare[] = {
        "WWW-Authenticate", "Bearer realm=\"sandfleet\", error=\"invalid_token\"", NULL};
    char size[32], text[160], json[512], challenge[768];
    const char *www_auth_dyn[] = {"WWW-Authenticate", challenge, NULL};
    const char *const *www_auth = www_auth_bare;
    int keep = 0, minor = 1;

    int had_auth = c->cur && gw_req_header(c->cur, "Authorization") != NULL;

    if (status == 401 && c->cur && c->srv->challenge) {
        c->srv->challenge(c->cur, msg, challenge, sizeof(challenge), c->srv->challenge_arg);
        www_auth = www_auth_dyn;
    }

    if (!msg) {
        if (status == 413) {
            fmt_size(size, sizeof(size), c->srv->lim.max_body);
            snprintf(text, sizeof(text), "request body too large: the limit is %s", size);
        } else if (status == 431) {
            fmt_size(size, sizeof(size), c->srv->lim.max_header_bytes);
            snprintf(text, sizeof(text), "request headers too large: the limit is %s", size);
        } else {
            snprintf(text, sizeof(text), "%s", gw_http_reason(status));
        }
        msg = text;
    }
    if (c->cur) {
        minor = c->cur->minor;
        if (c->cur->in_headcheck)
            gw_req_abort(c->cur); /* the pending check forgets it */
        req_free(c->cur);
        c->cur = NULL;
    }
    conn_deadline(c, 0, 0);
    gw_http_count_refusal(c->srv, status);
    sf_debug("msg=\"rejected HTTP request\" status=%d peer=%s reason=\"%s\"", status, c->peer, msg);
    if (status == 401) /* RFC 6750: the error code, and the sentence a person reads */
        snprintf(json, sizeof(json), "{\"error\":\"%s\",\"error_description\":\"%s\"}",
                 had_auth ? "invalid_token" : "unauthorized", msg);
    else
        snprintf(json, sizeof(json), "{\"error\":\"%s\"}", msg);
    conn_release_req(c);
    /* every 503 and 429 the server sends by itself is worth retrying soon */
    conn_write_response(c, minor, status, "application/json",
                        (status == 503 || status == 429) ? retry_after
                        : status == 401                  ? www_auth
                                                         : NULL,
                        json, strlen(json), 1, &keep, 0, NULL);
    c->close_after = 1;
    c->state = C_WRITE;
    conn_sent(c);
}

static void conn_parse_error(gw_conn *c, llhttp_errno_t e)
{
    char msg[160];
    const char *reason = llhttp_get_error_reason(&c->parser);

    if (c->err_status) {
        conn_error(c, c->err_status, c->err_msg);
        return;
    }
    snprintf(msg, sizeof(msg), "malformed HTTP request: %s",
             reason && *reason ? reason : llhttp_errno_name(e));
    for (char *q = msg; *q; q++) /* the message goes into a JSON string */
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
            *q = '\'';
    conn_error(c, 400, msg);
}

/* ------------------------------------------------------------------ connection */

static void conn_free(gw_conn *c)
{
    gw_http_server *s;
    if (!c)
        return;
    s = c->srv;
    c->state = C_DEAD;
    if (c->cur) {
        gw_req *r = c->cur;
        gw_req_abort(r);
        c->cur = NULL;
        req_free(r);
    }
    gw_budget_sub(s, c->addr, c->held);
    c->held = 0;
    if (c->addr)
        gw_addr_release(s, c->addr);
    c->addr = NULL;
    if (c->deadline_ev)
        event_free(c->deadline_ev);
    if (c->linger_ev)
        event_free(c->linger_ev);
    if (c->rd_ev)
        event_free(c->rd_ev);
    if (c->bev && bufferevent_pair_get_partner(c->bev)) /* an HTTP/2 preview stream (http2.c) */
        bufferevent_flush(c->bev, EV_WRITE, BEV_FINISHED); /* hears the end */
    if (c->bev)
        bufferevent_free(c->bev);
    SF_LIST_UNLINK(s->conns, c);
    s->nconns--;
    assert(s->nconns + s->nh2 > 0 || s->buffered == 0);
    free(c);
}

/* The head of a request with a body is in (the parser paused after it, the head's bytes
 * are in req_bytes): refuse it if it does not fit the budget, else ask for the body. */
static void conn_body_start(gw_conn *c)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    gw_http_server *s = c->srv;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    int status = 0;
    const char *msg = NULL;

    c->head_paused = 0;
    llhttp_resume(&c->parser);
    if (c->req_bytes + c->body_left > s->lim.max_buffered_bytes) {
        status = 413;
        msg = budget_too_large(c);
    } else if (s->head_check && !c->head_checked) {
        /* the key is checked before any body byte is accepted */
        c->state = C_HEADCHECK;
        c->cur->in_headcheck = 1;
        s->head_check(c->cur, s->head_check_arg);
        return;
    } else if (addr_over(c)) {
        status = 429;
        msg = addr_busy_msg;
    } else if (s->buffered > s->lim.max_buffered_bytes) {
        status = 503;
        msg = budget_busy(c);
    } else if (c->want_continue && bufferevent_write(c->bev, cont, sizeof(cont) - 1) < 0) {
        status = 503;
        msg = SF_MSG_SERVER_NOMEM_WHY;
    } else if (c->want_continue) {
        conn_flush(c);
    }
    if (status) {
        evbuffer_drain(in, evbuffer_get_length(in));
        conn_error(c, status, msg);
    }
}

static void h1_head_verdict(gw_req *r, int status, const char *msg)
{
    gw_conn *c = r->conn;

    if (c->state != C_HEADCHECK || c->cur != r)
        return;
    if (status) {
        evbuffer_drain(bufferevent_get_input(c->bev),
                       evbuffer_get_length(bufferevent_get_input(c->bev)));
        conn_error(c, status, msg ? msg : gw_http_reason(status));
        return;
    }
    c->head_checked = 1;
    c->state = C_READ;
    conn_body_start(c);
    if (c->state == C_READ && !c->parsing)
        conn_parse(c); /* the check answered later: read the body that waited */
}

static void conn_dispatch(gw_conn *c)
{
    gw_req *r = c->cur;

    llhttp_resume(&c->parser);
    if (!r) {
        conn_error(c, 500, SF_MSG_HTTP_STATE_ORDER_WHY);
        return;
    }
    conn_deadline(c, 0, 0);
    r->dispatched = 1;
    c->state = C_PENDING;
    event_base_gettimeofday_cached(c->srv->base, &c->dispatched);
    c->srv->handler(r, c->srv->arg);
}

static int conn_parse_loop(gw_conn *c);

static void conn_parse(gw_conn *c)
{
    c->parsing = 1;
    if (conn_parse_loop(c) == 0) /* 1: c is gone (the h2c upgrade took the connection) */
        c->parsing = 0;
}

static int conn_parse_loop(gw_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);

    while (c->state == C_READ) {
        size_t avail = evbuffer_get_length(in), n;
        struct evbuffer_iovec v;
        llhttp_errno_t e;

        if (avail == 0)
            break;
        if (!c->cur && !c->deadline_kind) /* a request begins: its headers are due */
            conn_deadline(c, 1, c->srv->lim.header_timeout_ms);
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1 || v.iov_len == 0) {
            v.iov_len = avail < 16384 ? avail : 16384;
            v.iov_base = evbuffer_pullup(in, (ev_ssize_t)v.iov_len);
            if (!v.iov_base) {
                conn_error(c, 503, SF_MSG_SERVER_NOMEM_WHY);
                return 0;
            }
        }
        c->exec_base = v.iov_base;
        e = llhttp_execute(&c->parser, v.iov_base, v.iov_len);
        c->exec_base = NULL;
        n = v.iov_len;
        if (e != HPE_OK && llhttp_get_error_pos(&c->parser))
            n = (size_t)(llhttp_get_error_pos(&c->parser) - (const char *)v.iov_base);
        if (n > 0)
            c->prev_tail = ((const char *)v.iov_base)[n - 1];
        if (e == HPE_PAUSED) {
            conn_consumed(c, n);
            if (c->divert && c->cur) {
                conn_divert(c); /* c is gone: the divert hook owns the connection */
                return 1;
            } else if (c->head_paused) {
                conn_body_start(c);
            } else if (c->h2c_upgrade && c->cur) {
                conn_upgrade_h2c(c); /* c is gone: HTTP/2 owns the connection */
                return 1;
            } else {
                conn_dispatch(c);
            }
            continue;
        }
        if (e != HPE_OK) {
            evbuffer_drain(in, evbuffer_get_length(in));
            conn_parse_error(c, e);
            return 0;
        }
        conn_consumed(c, n);
    }
    return 0;
}

/* The response is out and the connection stays: ready for the next request. */
static void conn_reset(gw_conn *c)
{
    struct timeval now;

    llhttp_init(&c->parser, HTTP_REQUEST, &gw_parser_settings);
    c->parser.data = c;
    c->err_status = 0;
    c->err_msg = NULL;
    c->hdr_bytes = 0;
    c->in_body = 0;
    c->state = C_READ;
    /* the idle time starts now: after a request that took a while, the read timeout (which
     * counts from the client's last bytes) is set again */
    event_base_gettimeofday_cached(c->srv->base, &now);
    if (now.tv_sec - c->dispatched.tv_sec > 1 || now.tv_sec < c->dispatched.tv_sec)
        conn_timeouts(c, 1, 1);
}

/* ... and parse what the client sent meanwhile. */
static void conn_next(gw_conn *c)
{
    conn_reset(c);
    conn_parse(c);
}

static void conn_linger_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    conn_free(arg);
}

/* Shut our side down and read (and drop) whatever the client still sends for a moment,
 * so that closing with unread data does not reset the connection before the client
 * read our last response. */
static void conn_linger(gw_conn *c)
{
    struct timeval idle = {GW_HTTP_LINGER_IDLE_S, 0}, total = {GW_HTTP_LINGER_MAX_S, 0};
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    struct evbuffer *in = bufferevent_get_input(c->bev);

    c->state = C_LINGER;
    if (c->peer_eof || fd < 0) {
        conn_free(c);
        return;
    }
    c->linger_ev = evtimer_new(c->srv->base, conn_linger_timeout_cb, c);
    if (!c->linger_ev || evtimer_add(c->linger_ev, &total) < 0) {
        conn_free(c);
        return;
    }
    shutdown(fd, SHUT_WR);
    evbuffer_drain(in, evbuffer_get_length(in));
    conn_account(c);
    conn_input_unlimit(c);
    bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
    bufferevent_set_timeouts(c->bev, &idle, NULL);
    bufferevent_enable(c->bev, EV_READ);
}

static void conn_read_cb(struct bufferevent *bev, void *arg)
{
    gw_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    conn_account(c); /* count what was just read */
    switch (c->state) {
    case C_READ:
        conn_parse(c);
        break;
    case C_WRITE:
        if (c->close_after) { /* nothing more will be served: do not buffer it */
            evbuffer_drain(in, evbuffer_get_length(in));
            conn_account(c);
        }
        break;
    case C_LINGER:
        evbuffer_drain(in, evbuffer_get_length(in));
        conn_account(c);
        break;
    default: /* PENDING: pipelined bytes wait for their turn */
        break;
    }
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
    gw_conn *c = arg;

    if (evbuffer_get_length(bufferevent_get_output(bev)) > 0)
        return;
    if (c->raw) /* drained: the next answer is written at once again (conn_flush) */
        bufferevent_disable(bev, EV_WRITE);
    if (c->state != C_WRITE)
        return;
    if (c->close_after)
        conn_linger(c);
    else
        conn_next(c);
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
    gw_conn *c = arg;

    if (what & BEV_EVENT_CONNECTED)
        return;
    if ((what & BEV_EVENT_TIMEOUT) && (what & BEV_EVENT_READING) &&
        (c->state == C_PENDING || c->state == C_STREAM || c->state == C_WRITE)) {
        /* idle only counts while the client owes us a request: here it waits for us */
        if (!c->rd_full && !c->rd_ev)
            bufferevent_enable(bev, EV_READ);
        return;
    }
    if (c->state == C_WRITE && (what & BEV_EVENT_EOF) && (what & BEV_EVENT_READING) &&
        !(what & BEV_EVENT_ERROR)) {
        /* The client finished sending; it may still read what we write. */
        c->peer_eof = 1;
        c->close_after = 1;
        return;
    }
    if (c->state == C_PENDING)
        sf_debug("msg=\"client went away before the response\" peer=%s", c->peer);
    conn_free(c);
}

#define GW_HTTP_READ_CHUNK (16u << 10) /* what one read asks for (at most rd_max) */

/* The own reader of a plain socket: libevent's bufferevent asked the kernel how much was
 * readable (ioctl FIONREAD) before every read, a system call per request. Bytes go into
 * the bufferevent's input buffer as before; an end of stream, an error or the idle
 * timeout is reported as the bufferevent would (conn_event_cb), and reading stops. */
static void conn_rd_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    struct evbuffer_iovec v[2];
    size_t want = c->rd_max < GW_HTTP_READ_CHUNK ? c->rd_max : GW_HTTP_READ_CHUNK;
    int nv;
    ssize_t n;

    if (what & EV_TIMEOUT) {
        /* idle only counts while the client owes us a request (see conn_event_cb) */
        if (c->state == C_PENDING || c->state == C_STREAM || c->state == C_WRITE)
            return;
        event_del(c->rd_ev);
        conn_event_cb(c->bev, BEV_EVENT_READING | BEV_EVENT_TIMEOUT, c);
        return;
    }
    if (want == 0) { /* (conn_input_limit pauses reading first) */
        event_del(c->rd_ev);
        c->rd_full = 1;
        return;
    }
    evbuffer_unfreeze(in, 0); /* a socket bufferevent keeps its input's end frozen */
    if ((nv = evbuffer_reserve_space(in, (ev_ssize_t)want, v, 2)) < 1) {
        evbuffer_freeze(in, 0);
        event_del(c->rd_ev);
        conn_event_cb(c->bev, BEV_EVENT_READING | BEV_EVENT_ERROR, c);
        return;
    }
    if (v[0].iov_len >= want) {
        v[0].iov_len = want;
        nv = 1;
    } else if (nv > 1 && v[0].iov_len + v[1].iov_len > want) {
        v[1].iov_len = want - v[0].iov_len;
    }
    n = readv(fd, (struct iovec *)v, nv);
    if (n <= 0) {
        evbuffer_commit_space(in, v, 0);
        evbuffer_freeze(in, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        event_del(c->rd_ev);
        conn_event_cb(c->bev, BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), c);
        return;
    }
    if ((size_t)n <= v[0].iov_len) {
        v[0].iov_len = (size_t)n;
        nv = 1;
    } else {
        v[1].iov_len = (size_t)n - v[0].iov_len;
    }
    evbuffer_commit_space(in, v, nv);
    evbuffer_freeze(in, 0);
    conn_read_cb(c->bev, c);
}

int gw_h1_serve(gw_http_server *s, const gw_handover *h)
{
    struct bufferevent *bev = h->bev;
    gw_addr *addr = h->addr;
    int tls = h->tls;
    uint64_t now, due;
    gw_conn *c = calloc(1, sizeof(*c));

    if (!c) {
        bufferevent_free(bev);
        if (addr)
            gw_addr_release(s, addr);
        return -ENOMEM;
    }
    c->srv = s;
    c->bev = bev;
    c->addr = addr;
    llhttp_init(&c->parser, HTTP_REQUEST, &gw_parser_settings);
    c->parser.data = c;
    snprintf(c->peer, sizeof(c->peer), "%s", h->peer ? h->peer : "unknown");
    c->peer_port = h->peer_port;
    c->tls = tls ? 1 : 0;
    c->raw = !tls && !bufferevent_get_underlying(bev) && bufferevent_getfd(bev) >= 0;
    c->state = C_READ;
    SF_LIST_PUSH(s->conns, c);
    s->nconns++;
    bufferevent_setcb(bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
    if (!c->raw) /* a plain socket keeps the bound itself (conn_input_limit) */
        bufferevent_setwatermark(bev, EV_READ, 0, GW_HTTP_INPUT_HIGH_WM);
    c->rd_max = GW_HTTP_MAX_IO;
    bufferevent_set_max_single_read(bev, GW_HTTP_MAX_IO);
    bufferevent_set_max_single_write(bev, GW_HTTP_MAX_IO);
    if (c->raw && !(c->rd_ev = event_new(s->base, bufferevent_getfd(bev), EV_READ | EV_PERSIST,
                                         conn_rd_cb, c))) {
        conn_free(c);
        return -ENOMEM;
    }
    conn_timeouts(c, 1, 1);
    /* a new connection owes us a request, counted from when it was accepted */
    now = sf_mono_ms();
    due = (h->t0_ms ? h->t0_ms : now) + s->lim.header_timeout_ms;
    conn_deadline(c, 1, due > now ? due - now : 0);
    /* a plain socket's write event is armed only when an answer did not go out at once
     * (a new bufferevent starts with writing enabled) */
    if (c->raw)
        bufferevent_disable(bev, EV_READ | EV_WRITE); /* the own reader reads */
    else if (bufferevent_enable(bev, EV_READ | EV_WRITE) < 0) {
        conn_free(c);
        return -ENOMEM;
    }
    if (h->refuse) { /* (the sniffer: a protocol not served here) */
        evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
        conn_error(c, h->refuse, h->refuse_msg);
        return 0;
    }
    if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
        conn_read_cb(bev, c); /* the first bytes, read by the sniffer (or came adopted) */
    return 0;
}

/* ------------------------------------------------------------------ answers (h1 transport) */

static void h1_respond(gw_req *req, int status, const char *content_type,
                       const char *const *headers, const char *body, size_t len)
{
    gw_conn *c = req->conn;
    int keep;

    if (c->cur != req || c->state != C_PENDING) {
        sf_error("msg=\"response to a request that is not pending; ignored\" peer=%s status=%d",
                 c->peer, status);
        return;
    }
    keep = c->keep_alive && !c->peer_eof;
    conn_write_response(c, req->minor, status, content_type, headers, body, len, !req->head, &keep,
                        0, req->id);
    c->cur = NULL;
    req_free(req);
    conn_release_req(c);
    c->close_after = !keep;
    c->state = C_WRITE;
    conn_sent(c);
}

static int h1_stream_begin(gw_req *req, int status, const char *ctype, const char *const *headers)
{
    gw_conn *c = req->conn;
    int keep = c->keep_alive && !c->peer_eof;

    if (c->cur != req || c->state != C_PENDING)
        return -EINVAL;
    if (req->head) { /* HEAD: the head alone is the whole answer */
        h1_respond(req, status, ctype, headers, NULL, 0);
        return -EPIPE;
    }
    if (conn_write_response(c, req->minor, status, ctype, headers, NULL, 0, 0, &keep, 1, req->id) < 0)
        return -ENOMEM;
    c->close_after = !keep;
    conn_release_req(c);
    c->state = C_STREAM;
    conn_flush(c);
    return 0;
}

static int h1_stream_write(gw_req *req, const char *data, size_t len)
{
    gw_conn *c = req->conn;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    char size[24];
    int n, rc = 0;

    if (c->state != C_STREAM || c->peer_eof)
        return -EPIPE;
    if (evbuffer_get_length(out) + len > GW_STREAM_MAX_UNSENT)
        return -ENOBUFS;
    if (req->minor >= 1) {
        n = snprintf(size, sizeof(size), "%zx\r\n", len);
        rc |= evbuffer_add(out, size, (size_t)n);
    }
    rc |= evbuffer_add(out, data, len);
    if (req->minor >= 1)
        rc |= evbuffer_add(out, "\r\n", 2);
    conn_flush(c);
    return rc ? -ENOMEM : 0;
}

static void h1_stream_end(gw_req *req)
{
    gw_conn *c = req->conn;

    if (c->state != C_STREAM)
        return;
    if (req->minor >= 1 && evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5) < 0)
        c->close_after = 1;
    c->cur = NULL;
    req_free(req);
    c->state = C_WRITE;
    conn_sent(c);
}

/* `Upgrade: h2c` taken: 101, then the connection and this request (stream 1) go to the
 * HTTP/2 server. */
static void conn_upgrade_h2c(gw_conn *c)
{
    static const char sw[] = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                             "Upgrade: h2c\r\n\r\n";
    gw_http_server *s = c->srv;
    struct bufferevent *bev = c->bev;
    gw_req *r = c->cur;
    char settings[256];
    const char *hs = gw_req_header(r, "HTTP2-Settings");

    if (!hs || strlen(hs) >= sizeof(settings)) {
        conn_error(c, 400, "malformed HTTP2-Settings header");
        return;
    }
    snprintf(settings, sizeof(settings), "%s", hs);
    if (bufferevent_write(bev, sw, sizeof(sw) - 1) < 0) {
        conn_error(c, 503, SF_MSG_SERVER_NOMEM_WHY);
        return;
    }
    c->cur = NULL;
    conn_release_req(c);
    conn_input_unlimit(c);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    sf_bev_no_timeouts(bev);
    bufferevent_setwatermark(bev, EV_READ, 0, 0);
    gw_budget_sub(s, c->addr, c->held);
    c->held = 0;
    c->bev = NULL;
    {
        char peer[sizeof(c->peer)];
        gw_handover h = {.bev = bev, .peer = peer, .peer_port = c->peer_port, .addr = c->addr,
                         .upgrade = r, .settings = settings};

        c->addr = NULL;
        memcpy(peer, c->peer, sizeof(peer));
        conn_free(c);
        gw_conn_serve(s, GW_PROTO_H2, &h);
    }
}

/* A head the divert hook took (server.h): the connection, with what followed the head
 * still in its input, leaves the server. */
static void conn_divert(gw_conn *c)
{
    gw_http_server *s = c->srv;
    struct bufferevent *bev = c->bev;
    gw_req *r = c->cur;
    char peer[sizeof(c->peer)];
    gw_http_divert d = {.bev = bev, .req = r, .peer = peer, .peer_port = c->peer_port,
                        .tls = c->tls, .hold = c->addr};

    c->cur = NULL;
    conn_release_req(c);
    conn_input_unlimit(c);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    sf_bev_no_timeouts(bev);
    bufferevent_setwatermark(bev, EV_READ, 0, 0);
    bufferevent_disable(bev, EV_READ | EV_WRITE);
    gw_budget_sub(s, c->addr, c->held);
    c->held = 0;
    c->bev = NULL;
    c->addr = NULL;
    memcpy(peer, c->peer, sizeof(peer));
    conn_free(c);
    s->divert_take(&d, s->divert_arg);
    req_free(r);
}

void gw_h1_free_all(gw_http_server *s)
{
    while (s->conns)
        conn_free(s->conns);
    sf_buf_fini(&s->head);
}
