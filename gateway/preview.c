/* preview.c: a preview connection's life (docs/internals/preview.md). The HTTP server
 * diverts an HTTP/1 connection whose request names a preview (gw_http_server_set_divert);
 * from then on it is ours:
 *   LOOKUP   the sandbox's record in Redis (host, team, state, pv:<port>), then its host's
 *            ingress; a private port's link is checked (a link in the query is exchanged
 *            for a host-only cookie and a 302 to the clean URL)
 *   CONNECT  a hop: the signed hop line to the ingress, its answer line; over TCP, or (a
 *            worker on this machine: same boot id) over its unix socket, which answers with
 *            the connected socket into the sandbox itself (the local hop: no worker on the
 *            data path; that unix connection stays open while we relay, for the worker's
 *            counts and cut-offs, and takes our byte reports)
 *   RELAY    browser -> sandbox: each request head rewritten (X-Forwarded-*, no sf_token,
 *            no sf_preview cookie), bodies streamed (chunked ones re-chunked); after an
 *            Upgrade (WebSocket) the bytes pass as they are. sandbox -> browser: bytes as
 *            they are. Both ways bounded (RELAY_HIGH per direction) with back-pressure,
 *            and the team's bandwidth (preview_rate_team).
 *   ANSWER   a page of the gateway's own (preview_page.c), then a lingering close.
 * A connection's first request selects the preview; later requests on it must name the
 * same one (and, on a private port, carry a valid link), else the connection is closed. */
#include "preview.h"
#include "gateway.h"
#include "llhttp.h"
#include "sf_bev.h"
#include "sf_jobauth.h"
#include "sf_list.h"
#include "sf_log.h"
#include "sf_pvtoken.h"
#include "sf_splice.h"
#include "sf_store.h"
#include "sf_util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#define RELAY_HIGH (1u << 20)    /* bytes queued toward one side before reading pauses */
#define RELAY_LOW (256u << 10)   /* ...and resumes below this */
#define RELAY_CHUNK (64u << 10)  /* one step of the request parser */
#define RELAY_IO (256u << 10)    /* the largest single read or write */
#define RELAY_PIPE (1u << 20)    /* the splice's pipe (sandbox -> a plain-TCP browser) */
#define HEAD_MAX (64u << 10)     /* a request head we rewrite */
#define HOP_ANSWER_MAX 512
#define LOCAL_EARLY_MAX (64u << 10) /* bytes a relay sent behind its answer (local hop) */
#define LOCAL_DIRS 4             /* local-hop folders kept open per instance */
#define LINGER_S 2

/* What the pages say (each sentence once: tests/lint/messages.sh) */
static const char T_UNREACHABLE[] = "The preview could not be reached";
static const char T_TOO_MANY[] = "Too many preview connections";
static const char T_UNAVAILABLE[] = "The preview is unavailable";
static const char M_NO_REDIS[] = "The gateway cannot reach the platform's database right now; "
                                 "try again in a few seconds.";
static const char M_LOST_REDIS[] = "The gateway lost its connection to the platform's database; "
                                   "try again in a few seconds.";
static const char M_NOT_HOP[] = "The sandbox's host answered the preview hop with something "
                                "that is not the hop protocol; tell the platform's operator.";
static const char M_NO_MEM[] = "The gateway is out of memory; try again.";
static const char M_HOST_SLOW[] = "The sandbox's host did not answer in time; try again in a "
                                  "moment.";
static const char M_HOST_GONE[] = "The gateway could not reach the sandbox's host (its preview "
                                  "ingress); try again in a moment, or tell the platform's "
                                  "operator if it lasts.";

enum { S_LOOKUP, S_CONNECT, S_HOPWAIT, S_RELAY, S_ANSWER, S_DEAD };
enum { TOK_NONE, TOK_QUERY, TOK_HEADER, TOK_COOKIE };

typedef struct gw_preview {
    gw_ctx *ctx;
    char dom_host[256];
    struct pv_conn *conns;
    unsigned nconns;
    char boot_id[40];      /* this machine's (a worker with the same one is local) */
    struct {
        char dir[256];
        int fd;            /* O_PATH, opened without following a link; -1: free */
    } ldir[LOCAL_DIRS];
    unsigned ldir_next;
} gw_preview;

typedef struct pv_conn {
    gw_preview *pv;
    struct pv_conn *prev, *next;
    struct bufferevent *c; /* the browser */
    struct bufferevent *u; /* the hop to the ingress */
    sf_splice *down;       /* sandbox -> browser by splice(2) (a plain-TCP browser), else NULL */
    struct event *ev_cin;  /* ...and the browser read by us into cin (else its bufferevent) */
    struct evbuffer *cin;
    int cin_on;
    struct event *tick;    /* bandwidth: resume after a wait */
    void *hold;            /* the client address's hold (server.h) */
    int state, redis_pending, tls, peer_port, header_form, tok_src;
    int c_eof, u_eof, u_shut, raw_up, in_head, chunked, hdr_ok, waiting_bw;
    gw_pv_target t;
    char team[64], host[128], peer[64];
    char fwd_host[256];    /* the Host the browser used (X-Forwarded-Host) */
    uint64_t epoch;
    int priv;
    uint8_t key[32];       /* the sandbox's host key */
    char token[260];       /* the link presented with the first request */
    sf_buf first;          /* the first request's head, as the parser will see it */
    char *location;        /* the 302's target (a link exchanged) */
    gw_pv_team *te;
    int team_held;
    uint64_t n_up, n_down, n_req; /* not yet added to the team's counters */
    /* the local hop: its unix connection (kept while we relay), what it answered so far,
     * and the bytes not yet reported to the worker (in: to the sandbox, out: from it) */
    int lsock;
    struct event *ev_l;
    struct evbuffer *lin;
    int lfd;
    uint64_t l_in, l_out;
    /* the request parser (browser -> sandbox) */
    llhttp_t p;
    sf_buf h_target, h_fields; /* fields as name\0value\0 pairs */
    int h_in_value;
    sf_buf out;            /* a rewritten head */
} pv_conn;

static void conn_close(pv_conn *k);
static void conn_answer(pv_conn *k, int status, const char *title, const char *text,
                        const char *extra);
static void relay_up(pv_conn *k);
static void relay_down(pv_conn *k);

static const char *scheme_of(const pv_conn *k)
{
    return k->tls || !strcmp(k->pv->ctx->cfg.preview_scheme, "https") ? "https" : "http";
}

/* ------------------------------------------------------------------ naming a preview */

/* Which preview a request names: the Host form, else the header form. 1 and *t (ok set)
 * when it is a preview request at all, else 0. */
static int req_names(gw_preview *pv, const char *host, const char *hdr, gw_pv_target *t,
                     int *ok, const char **why, int *header_form)
{
    *header_form = 0;
    if (gw_pv_match_host(host, pv->dom_host, t, ok, why))
        return 1;
    if (hdr) {
        *header_form = 1;
        *ok = gw_pv_parse_label(hdr, strlen(hdr), t, why) == 0;
        return 1;
    }
    return 0;
}

static int divert_match(gw_req *req, void *arg)
{
    gw_pv_target t;
    int ok, hf;
    const char *why;

    return req_names(arg, gw_req_header(req, "Host"), gw_req_header(req, "X-Sandfleet-Preview"),
                     &t, &ok, &why, &hf);
}

/* ------------------------------------------------------------------ the request parser */

static int hdr_is(const char *name, const char *want)
{
    return !strcasecmp(name, want);
}

static int on_message_begin(llhttp_t *p)
{
    pv_conn *k = p->data;

    sf_buf_reset(&k->h_target);
    sf_buf_reset(&k->h_fields);
    k->h_in_value = 0;
    k->in_head = 1;
    k->chunked = 0;
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n)
{
    pv_conn *k = p->data;

    return sf_buf_append(&k->h_target, at, n) < 0 ? -1 : 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
    pv_conn *k = p->data;

    if (!k->in_head) /* trailers: dropped */
        return 0;
    if (k->h_in_value && sf_buf_append(&k->h_fields, "", 1) < 0)
        return -1;
    k->h_in_value = 0;
    return sf_buf_append(&k->h_fields, at, n) < 0 ? -1 : 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
    pv_conn *k = p->data;

    if (!k->in_head)
        return 0;
    if (!k->h_in_value && sf_buf_append(&k->h_fields, "", 1) < 0)
        return -1;
    k->h_in_value = 1;
    return sf_buf_append(&k->h_fields, at, n) < 0 ? -1 : 0;
}

/* A local hop's bytes since the last report, to the worker (its team counters): one line
 * into a socket the worker keeps reading (kept for the next report when it does not fit);
 * every MiB moved and at the end (not per request: each line wakes the worker). */
static void local_report(pv_conn *k)
{
    char line[80];
    int n;

    if (k->lsock < 0 || (k->l_in == 0 && k->l_out == 0))
        return;
    n = snprintf(line, sizeof(line), "SFHOP1 BYTES %" PRIu64 " %" PRIu64 "\n", k->l_in,
                 k->l_out);
    if (send(k->lsock, line, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) == n)
        k->l_in = k->l_out = 0;
}

static void flush_counts(pv_conn *k)
{
    if (k->te && (k->n_req || k->n_up || k->n_down))
        gw_pv_team_count(k->te, k->n_req, k->n_up, k->n_down);
    if (k->lsock >= 0) {
        k->l_out += k->n_down;
        if (k->l_in + k->l_out >= (1u << 20)) /* (and at the end: local_end) */
            local_report(k);
    }
    k->n_req = k->n_up = k->n_down = 0;
}

/* The local hop's answer reader (its event and buffer) freed. */
static void local_reader_free(pv_conn *k)
{
    if (k->ev_l)
        event_free(k->ev_l);
    k->ev_l = NULL;
    if (k->lin)
        evbuffer_free(k->lin);
    k->lin = NULL;
}

/* The local hop's end: the last report, then its connection closes (the worker's count
 * of the hop ends with it). */
static void local_end(pv_conn *k)
{
    local_reader_free(k);
    if (k->lfd >= 0)
        close(k->lfd);
    k->lfd = -1;
    if (k->lsock >= 0) {
        local_report(k);
        close(k->lsock);
    }
    k->lsock = -1;
}

/* The link a request carries (query, header, or each sf_preview cookie): OK when one
 * checks. Returns the verdict of the best candidate. */
static int request_token_ok(pv_conn *k, const char *query, const char *hdr_tok,
                            const char *cookie)
{
    int64_t exp, now = (int64_t)time(NULL);
    int v = -1, best = -1;
    const char *s;
    size_t n;

    if ((s = gw_pv_query_token(query ? query : "", &n)))
        v = gw_pv_token_check(s, n, k->key, k->t.sandbox, k->t.port, k->epoch, now, &exp);
    if (v != GW_PV_TOK_OK && hdr_tok) {
        best = v;
        v = gw_pv_token_check(hdr_tok, strlen(hdr_tok), k->key, k->t.sandbox, k->t.port,
                              k->epoch, now, &exp);
    }
    for (size_t i = 0; v != GW_PV_TOK_OK && cookie && (s = gw_pv_cookie_at(cookie, i, &n)); i++) {
        if (best < 0)
            best = v;
        v = gw_pv_token_check(s, n, k->key, k->t.sandbox, k->t.port, k->epoch, now, &exp);
    }
    return v == GW_PV_TOK_OK ? v : (best >= 0 ? best : v);
}

/* The head is in: it must name this connection's preview (and carry a link on a private
 * port); then it goes to the sandbox rewritten. */
static int on_headers_complete(llhttp_t *p)
{
    pv_conn *k = p->data;
    const char *f = k->h_fields.p, *end, *host = NULL, *pvh = NULL, *pvtok = NULL;
    const char *cookie = NULL, *query, *why;
    gw_pv_target t;
    int ok = 0, hf;
    sf_buf *o = &k->out;

    if (p->method == HTTP_CONNECT)
        return -1;
    if ((k->h_in_value && sf_buf_append(&k->h_fields, "", 1) < 0) ||
        sf_buf_append(&k->h_target, "", 1) < 0)
        return -1;
    end = k->h_fields.p + k->h_fields.len;
    for (const char *q = f; q && q < end;) {
        const char *name = q, *val = q + strlen(q) + 1;

        if (val >= end)
            break;
        while (*val == ' ' || *val == '\t')
            val++;
        if (hdr_is(name, "Host") && !host)
            host = val;
        else if (hdr_is(name, "X-Sandfleet-Preview") && !pvh)
            pvh = val;
        else if (hdr_is(name, "X-Sandfleet-Preview-Token") && !pvtok)
            pvtok = val;
        else if (hdr_is(name, "Cookie") && !cookie)
            cookie = val;
        q = val + strlen(val) + 1;
    }
    /* the same preview as the connection's first request */
    if (!req_names(k->pv, host, pvh, &t, &ok, &why, &hf) || !ok ||
        strcmp(t.sandbox, k->t.sandbox) != 0 || t.port != k->t.port) {
        sf_info("msg=\"preview connection closed: a request named another preview\" "
                "sandbox=%s port=%u peer=%s", k->t.sandbox, k->t.port, k->peer);
        return -1;
    }
    query = strchr(k->h_target.p, '?');
    if (k->priv && request_token_ok(k, query ? query + 1 : "", pvtok, cookie) != GW_PV_TOK_OK) {
        sf_info("msg=\"preview connection closed: a request without a valid link\" sandbox=%s "
                "port=%u peer=%s", k->t.sandbox, k->t.port, k->peer);
        return -1;
    }
    sf_buf_reset(o);
    if (sf_buf_appendf(o, "%s ", llhttp_method_name((llhttp_method_t)p->method)) < 0 ||
        gw_pv_strip_token(k->h_target.p, o) < 0 ||
        sf_buf_appendf(o, " HTTP/1.%d\r\n", p->http_minor) < 0)
        return -1;
    for (const char *q = f; q < end;) {
        const char *name = q, *val = q + strlen(q) + 1;

        if (val >= end)
            break;
        q = val + strlen(val) + 1;
        while (*val == ' ' || *val == '\t')
            val++;
        if (hdr_is(name, "X-Forwarded-For") || hdr_is(name, "X-Forwarded-Proto") ||
            hdr_is(name, "X-Forwarded-Host") || hdr_is(name, "Forwarded") ||
            hdr_is(name, "X-Real-IP") || hdr_is(name, "X-Sandfleet-Preview") ||
            hdr_is(name, "X-Sandfleet-Preview-Token"))
            continue;
        if (hdr_is(name, "Cookie")) {
            size_t at = o->len;

            if (sf_buf_appendf(o, "%s: ", name) < 0 ||
                gw_pv_strip_cookie(val, strlen(val), o) < 0)
                return -1;
            if (o->len == at + strlen(name) + 2)
                o->len = at; /* nothing left */
            else if (sf_buf_append(o, "\r\n", 2) < 0)
                return -1;
            continue;
        }
        if (sf_buf_appendf(o, "%s: %s\r\n", name, val) < 0)
            return -1;
    }
    if (sf_buf_appendf(o, "X-Forwarded-For: %s\r\nX-Forwarded-Proto: %s\r\n", k->peer,
                       scheme_of(k)) < 0 ||
        (host && sf_buf_appendf(o, "X-Forwarded-Host: %s\r\n", host) < 0) ||
        sf_buf_append(o, "\r\n", 2) < 0)
        return -1;
    if (bufferevent_write(k->u, o->p, o->len) < 0)
        return -1;
    k->n_up += o->len;
    k->n_req++;
    k->chunked = (p->flags & F_CHUNKED) != 0;
    k->in_head = 0;
    if (k->pv->ctx->cfg.access_log) {
        size_t n = strcspn(k->h_target.p, "?"); /* never the query: it may hold a link */

        if (n > 512)
            n = 512;
        sf_info("msg=preview_access sandbox=%s port=%u method=%s path=%.*s peer=%s", k->t.sandbox,
                k->t.port, llhttp_method_name((llhttp_method_t)p->method), (int)n,
                k->h_target.p, k->peer);
    }
    flush_counts(k);
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
    pv_conn *k = p->data;
    struct evbuffer *o = bufferevent_get_output(k->u);

    if (k->chunked && evbuffer_add_printf(o, "%zx\r\n", n) < 0)
        return -1;
    if (evbuffer_add(o, at, n) < 0 || (k->chunked && evbuffer_add(o, "\r\n", 2) < 0))
        return -1;
    k->n_up += n;
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    pv_conn *k = p->data;

    if (k->chunked && bufferevent_write(k->u, "0\r\n\r\n", 5) < 0)
        return -1;
    k->chunked = 0;
    return 0;
}

static const llhttp_settings_t parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ------------------------------------------------------------------ relay */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    pv_conn *k = arg;

    k->waiting_bw = 0;
    relay_up(k);
    if (k->state == S_RELAY)
        relay_down(k);
}

static size_t allowance(pv_conn *k, size_t want)
{
    unsigned wait = 0;
    size_t got;

    if (!k->pv->ctx->cfg.preview_rate_team || !k->te)
        return want;
    got = gw_pv_team_bytes(k->te, want, (uint64_t)k->pv->ctx->cfg.preview_rate_team,
                           (uint64_t)sf_mono_ms(), &wait);
    if (got == 0 && !k->waiting_bw) {
        struct timeval tv = {0, (suseconds_t)wait * 1000};

        if (!k->tick)
            k->tick = evtimer_new(k->pv->ctx->d.base, tick_cb, k);
        if (k->tick && evtimer_add(k->tick, &tv) == 0)
            k->waiting_bw = 1;
    }
    return got;
}

/* What the browser sent and the parser has not taken yet. */
static struct evbuffer *c_input(pv_conn *k)
{
    return k->cin ? k->cin : bufferevent_get_input(k->c);
}

/* Our reads of the browser go on while its unparsed bytes stay under RELAY_HIGH. */
static void cin_arm(pv_conn *k)
{
    int want = k->ev_cin && !k->c_eof && evbuffer_get_length(k->cin) < RELAY_HIGH;

    if (!k->ev_cin || want == k->cin_on)
        return;
    if (want)
        event_add(k->ev_cin, NULL);
    else
        event_del(k->ev_cin);
    k->cin_on = want;
}

static void cin_free(pv_conn *k)
{
    if (k->ev_cin)
        event_free(k->ev_cin);
    if (k->cin)
        evbuffer_free(k->cin);
    k->ev_cin = NULL;
    k->cin = NULL;
    k->cin_on = 0;
}

/* Both sides are done: the browser sent its end and the sandbox's end went out. */
static void maybe_done(pv_conn *k)
{
    if (k->state != S_RELAY)
        return;
    if (!k->down && k->u_eof && evbuffer_get_length(bufferevent_get_input(k->u)) == 0 &&
        evbuffer_get_length(bufferevent_get_output(k->c)) == 0) {
        conn_close(k);
        return;
    }
    if (k->c_eof && !k->u_shut && evbuffer_get_length(c_input(k)) == 0 &&
        evbuffer_get_length(bufferevent_get_output(k->u)) == 0) {
        k->u_shut = 1; /* the browser's half-close, passed on */
        shutdown(bufferevent_getfd(k->u), SHUT_WR);
    }
}

/* Writes what went to the hop now (a request head fits the socket at once): the
 * bufferevent's write interest, two epoll_ctl per request, only while the socket is full.
 * 0, or -1 when the hop failed. */
static int u_flush(pv_conn *k)
{
    struct evbuffer *out = bufferevent_get_output(k->u);
    int fd = bufferevent_getfd(k->u), n = 0;

    /* (a socket bufferevent's output is frozen at its start for anyone but itself) */
    evbuffer_unfreeze(out, 1);
    while (evbuffer_get_length(out) > 0 && (n = evbuffer_write(out, fd)) > 0)
        ;
    evbuffer_freeze(out, 1);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return -1;
    if (evbuffer_get_length(out) > 0)
        bufferevent_enable(k->u, EV_WRITE); /* u_write_cb: on with the rest */
    else
        bufferevent_disable(k->u, EV_WRITE);
    return 0;
}

/* browser -> sandbox */
static void relay_up(pv_conn *k)
{
    struct evbuffer *in, *out;
    size_t before, pending;

    if (k->state != S_RELAY)
        return;
    in = c_input(k);
    out = bufferevent_get_output(k->u);
again:
    before = evbuffer_get_length(in);
    while (evbuffer_get_length(in) > 0 && evbuffer_get_length(out) < RELAY_HIGH &&
           !k->waiting_bw) {
        size_t avail = evbuffer_get_length(in), want = avail < RELAY_CHUNK ? avail : RELAY_CHUNK;
        size_t n = allowance(k, want);

        if (n == 0)
            break;
        if (k->raw_up) {
            evbuffer_remove_buffer(in, out, n);
            k->n_up += n;
            continue;
        }
        {
            const char *base = (const char *)evbuffer_pullup(in, (ev_ssize_t)n);
            llhttp_errno_t e;
            size_t used = n;

            if (!base) {
                conn_close(k);
                return;
            }
            e = llhttp_execute(&k->p, base, n);
            if (e == HPE_PAUSED_UPGRADE) {
                used = (size_t)(llhttp_get_error_pos(&k->p) - base);
                k->raw_up = 1; /* a WebSocket (or other Upgrade): bytes as they are */
            } else if (e != HPE_OK) {
                if (e != HPE_USER && e != HPE_CB_HEADERS_COMPLETE)
                    sf_info("msg=\"preview request malformed; connection closed\" sandbox=%s "
                            "port=%u peer=%s err=\"%s\"", k->t.sandbox, k->t.port, k->peer,
                            llhttp_errno_name(e));
                conn_close(k);
                return;
            }
            evbuffer_drain(in, used);
        }
    }
    pending = evbuffer_get_length(out);
    if (u_flush(k) < 0) {
        conn_close(k);
        return;
    }
    /* the hop took all of it at once (its write interest is off again): the parser goes on
     * here, as nothing else would wake it while the browser's bytes wait in full buffers
     * (on while something moves: not when only the allowance stopped it) */
    if (evbuffer_get_length(in) > 0 && evbuffer_get_length(out) == 0 && !k->waiting_bw &&
        (evbuffer_get_length(in) < before || pending > 0))
        goto again;
    cin_arm(k);
    if (k->n_up + k->n_down > (1u << 20))
        flush_counts(k);
    maybe_done(k);
}

/* sandbox -> browser */
static void relay_down(pv_conn *k)
{
    struct evbuffer *in, *out;

    if (k->state != S_RELAY)
        return;
    if (k->down) { /* the splice moves them: on after a bandwidth wait */
        sf_splice_resume(k->down);
        return;
    }
    in = bufferevent_get_input(k->u);
    out = bufferevent_get_output(k->c);
    while (evbuffer_get_length(in) > 0 && evbuffer_get_length(out) < RELAY_HIGH &&
           !k->waiting_bw) {
        size_t avail = evbuffer_get_length(in);
        size_t n = allowance(k, avail < RELAY_HIGH ? avail : RELAY_HIGH);

        if (n == 0)
            break;
        evbuffer_remove_buffer(in, out, n);
        k->n_down += n;
    }
    if (k->n_up + k->n_down > (1u << 20))
        flush_counts(k);
    maybe_done(k);
}

static void c_read_cb(struct bufferevent *bev, void *arg)
{
    relay_up(arg);
}

static void c_write_cb(struct bufferevent *bev, void *arg)
{
    pv_conn *k = arg;

    if (k->state == S_ANSWER) {
        if (evbuffer_get_length(bufferevent_get_output(bev)) > 0)
            return;
        if (k->tls || k->c_eof) {
            conn_close(k);
            return;
        }
        /* linger: our side shut, the client's bytes read and dropped for a moment */
        {
            struct timeval tv = {LINGER_S, 0};

            shutdown(bufferevent_getfd(bev), SHUT_WR);
            evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
            bufferevent_set_timeouts(bev, &tv, NULL);
            bufferevent_enable(bev, EV_READ);
        }
        return;
    }
    relay_down(k);
}

static void u_write_cb(struct bufferevent *bev, void *arg)
{
    relay_up(arg);
}

static void c_event_cb(struct bufferevent *bev, short what, void *arg)
{
    pv_conn *k = arg;

    if (k->state == S_RELAY && (what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR)) {
        k->c_eof = 1; /* the browser may still read */
        relay_up(k);
        return;
    }
    conn_close(k);
}

static void c_answer_read_cb(struct bufferevent *bev, void *arg)
{
    evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
}

/* ------------------------------------------------------------------ the hop */

static size_t down_allow(void *arg, size_t want)
{
    return allowance(arg, want);
}

static void down_moved(void *arg, size_t n)
{
    pv_conn *k = arg;

    k->n_down += n;
    if (k->n_up + k->n_down > (1u << 20))
        flush_counts(k);
}

/* The sandbox's side ended and everything went out (or a side failed): the browser's
 * connection ends with it, as it would without the splice. */
static void down_done(void *arg, int err)
{
    pv_conn *k = arg;

    (void)err;
    k->u_eof = 1;
    conn_close(k);
}

/* A browser on plain TCP (not TLS, not an HTTP/2 stream's pipe) gets the sandbox's bytes
 * by splice(2): libevent 2.1 reads 4 KiB per wake-up. 0, or -1 (the bufferevents then). */
static int down_splice(pv_conn *k)
{
    sf_splice_cfg cfg = {.base = k->pv->ctx->d.base,
                         .src = bufferevent_getfd(k->u),
                         .dst = bufferevent_getfd(k->c),
                         .cap = RELAY_PIPE,
                         .allow = k->pv->ctx->cfg.preview_rate_team ? down_allow : NULL,
                         .moved = down_moved,
                         .done = down_done,
                         .arg = k};

    if (k->tls || bufferevent_pair_get_partner(k->c) || cfg.src < 0 || cfg.dst < 0)
        return -1;
    if (sf_splice_new(&cfg, &k->down) < 0)
        return -1;
    if (sf_splice_prepend(k->down, bufferevent_get_input(k->u)) < 0) {
        sf_splice_free(k->down);
        k->down = NULL;
        return -1;
    }
    bufferevent_disable(k->u, EV_READ); /* the splice reads it; the bufferevent writes */
    sf_splice_start(k->down);
    return 0;
}

/* The browser, readable: up to RELAY_IO now, in reads of 16 KiB and more (libevent 2.1's
 * are 4 KiB, each after a FIONREAD). */
static void c_in_cb(evutil_socket_t fd, short what, void *arg)
{
    pv_conn *k = arg;
    size_t got = 0, want = 16u << 10;

    (void)what;
    while (got < RELAY_IO && evbuffer_get_length(k->cin) < RELAY_HIGH) {
        struct evbuffer_iovec v[2];
        struct iovec io[2];
        int nv = evbuffer_reserve_space(k->cin, (ev_ssize_t)want, v, 2);
        ssize_t n;
        size_t left;

        if (nv < 0) {
            conn_close(k);
            return;
        }
        for (int i = 0; i < nv; i++) {
            io[i].iov_base = v[i].iov_base;
            io[i].iov_len = v[i].iov_len;
        }
        n = readv(fd, io, nv);
        if (n <= 0) {
            evbuffer_commit_space(k->cin, v, 0);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                break;
            if (n < 0) {
                conn_close(k);
                return;
            }
            k->c_eof = 1; /* the browser may still read */
            break;
        }
        left = (size_t)n;
        for (int i = 0; i < nv; i++) {
            v[i].iov_len = v[i].iov_len < left ? v[i].iov_len : left;
            left -= v[i].iov_len;
        }
        if (evbuffer_commit_space(k->cin, v, v[nv - 1].iov_len ? nv : 1) < 0) {
            conn_close(k);
            return;
        }
        got += (size_t)n;
        if ((size_t)n < want)
            break; /* drained (epoll says when there is more) */
        want = RELAY_CHUNK;
    }
    cin_arm(k);
    relay_up(k);
}

/* With the splice, the browser's bytes are read here too (one reader per socket). 0 or -1
 * (its bufferevent reads then). */
static int c_own_reads(pv_conn *k)
{
    if (!(k->cin = evbuffer_new()) ||
        !(k->ev_cin = event_new(k->pv->ctx->d.base, bufferevent_getfd(k->c), EV_READ | EV_PERSIST,
                                c_in_cb, k)) ||
        evbuffer_add_buffer(k->cin, bufferevent_get_input(k->c)) < 0) {
        cin_free(k);
        return -1;
    }
    bufferevent_disable(k->c, EV_READ | EV_WRITE);
    cin_arm(k);
    return 0;
}

static void hop_refused(pv_conn *k, const char *line);
static void relay_begin(pv_conn *k);

static void hop_answer(pv_conn *k)
{
    struct evbuffer *in = bufferevent_get_input(k->u);
    struct evbuffer_ptr eol = evbuffer_search(in, "\n", 1, NULL);
    char line[HOP_ANSWER_MAX + 1];
    size_t n;

    if (eol.pos < 0) {
        if (evbuffer_get_length(in) > HOP_ANSWER_MAX)
            conn_answer(k, 502, T_UNREACHABLE,
                        M_NOT_HOP, NULL);
        return;
    }
    n = (size_t)eol.pos;
    if (n > HOP_ANSWER_MAX) {
        conn_answer(k, 502, T_UNREACHABLE,
                    "The sandbox's host answered with an overlong line; tell the platform's "
                    "operator.", NULL);
        return;
    }
    evbuffer_remove(in, line, n + 1);
    line[n] = 0;
    if (n > 0 && line[n - 1] == '\r')
        line[n - 1] = 0;
    if (!strcmp(line, "SFHOP1 OK")) {
        relay_begin(k);
        return;
    }
    hop_refused(k, line);
}

/* The hop's refusal line (or anything else) as the browser's page. */
static void hop_refused(pv_conn *k, const char *line)
{
    if (!strncmp(line, "SFHOP1 ERR ", 11)) {
        char *end;
        long st = strtol(line + 11, &end, 10);
        const char *msg = *end == ' ' ? end + 1 : "The sandbox's host refused the preview.";
        const char *title = st == 404   ? "No such sandbox"
                            : st == 409 ? "Port not published"
                            : st == 502 ? "Nothing listens on this port yet"
                            : st == 503 ? T_TOO_MANY
                            : st == 504 ? "The sandbox did not wake up in time"
                            : st == 403 ? "The preview hop was refused"
                                        : T_UNREACHABLE;

        if (st == 409)
            st = 404;
        if (st < 400 || st > 599)
            st = 502;
        conn_answer(k, (int)st, title, msg, NULL);
        return;
    }
    conn_answer(k, 502, T_UNREACHABLE,
                M_NOT_HOP, NULL);
}

/* The hop said OK (k->u reaches the sandbox): the relay starts with the first head. */
static void relay_begin(pv_conn *k)
{
    k->state = S_RELAY;
    sf_bev_no_timeouts(k->u);
    /* large reads and writes (libevent's default is 16 KiB at a time) */
    bufferevent_set_max_single_read(k->u, RELAY_IO);
    bufferevent_set_max_single_write(k->u, RELAY_IO);
    bufferevent_set_max_single_read(k->c, RELAY_IO);
    bufferevent_set_max_single_write(k->c, RELAY_IO);
    bufferevent_setwatermark(k->u, EV_READ, 0, RELAY_HIGH);
    bufferevent_setwatermark(k->u, EV_WRITE, RELAY_LOW, 0);
    bufferevent_setwatermark(k->c, EV_READ, 0, RELAY_HIGH);
    bufferevent_setwatermark(k->c, EV_WRITE, RELAY_LOW, 0);
    bufferevent_setcb(k->c, c_read_cb, c_write_cb, c_event_cb, k);
    llhttp_init(&k->p, HTTP_REQUEST, &parser_settings);
    k->p.data = k;
    /* the first head, then what the browser sent after it */
    switch (llhttp_execute(&k->p, k->first.p, k->first.len)) {
    case HPE_OK:
        break;
    case HPE_PAUSED_UPGRADE: /* (a head with no body: nothing of it is left) */
        k->raw_up = 1;
        break;
    default:
        conn_close(k);
        return;
    }
    sf_buf_fini(&k->first);
    if (down_splice(k) < 0)
        bufferevent_enable(k->c, EV_READ | EV_WRITE);
    else if (c_own_reads(k) < 0)
        bufferevent_enable(k->c, EV_READ); /* its writes are the splice's */
    relay_up(k);
    if (k->state == S_RELAY)
        relay_down(k);
}

static void u_hop_read_cb(struct bufferevent *bev, void *arg)
{
    pv_conn *k = arg;

    if (k->state == S_HOPWAIT)
        hop_answer(k);
    else
        relay_down(k);
}

static void u_event_cb(struct bufferevent *bev, short what, void *arg)
{
    pv_conn *k = arg;

    if (what & BEV_EVENT_CONNECTED) {
        char line[HOP_ANSWER_MAX];
        int n = sf_pv_hop_line(k->key, k->t.sandbox, k->t.port, k->epoch, (int64_t)sf_now_ms(),
                               line, sizeof(line)), one = 1;

        /* no Nagle: a body that follows its head in a later write would wait for the
         * ingress's delayed ACK of the head (40 ms) */
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (n < 0 || bufferevent_write(bev, line, strlen(line)) < 0) {
            conn_answer(k, 502, T_UNREACHABLE,
                        "The gateway could not start the hop; try again.", NULL);
            return;
        }
        k->state = S_HOPWAIT;
        bufferevent_enable(bev, EV_READ);
        return;
    }
    if (k->state == S_CONNECT || k->state == S_HOPWAIT) {
        int timeout = (what & BEV_EVENT_TIMEOUT) != 0;

        sf_warn("msg=\"preview hop failed\" sandbox=%s port=%u host=%s state=%s what=0x%x",
                k->t.sandbox, k->t.port, k->host, k->state == S_CONNECT ? "connect" : "answer",
                (unsigned)what);
        conn_answer(k, timeout ? 504 : 502, T_UNREACHABLE, timeout ? M_HOST_SLOW : M_HOST_GONE,
                    NULL);
        return;
    }
    if (k->state == S_RELAY && (what & BEV_EVENT_EOF)) {
        k->u_eof = 1;
        relay_down(k);
        return;
    }
    conn_close(k);
}

static void hop_connect(pv_conn *k, const char *ingress)
{
    struct sockaddr_storage ss;
    int sl = sizeof(ss);
    int64_t ms = k->pv->ctx->cfg.preview_hop_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};

    if (evutil_parse_sockaddr_port(ingress, (struct sockaddr *)&ss, &sl) < 0) {
        conn_answer(k, 502, T_UNREACHABLE,
                    "The sandbox's host announced a preview ingress address the gateway cannot "
                    "read; tell the platform's operator.", NULL);
        return;
    }
    if (!(k->u = bufferevent_socket_new(k->pv->ctx->d.base, -1, BEV_OPT_CLOSE_ON_FREE))) {
        conn_answer(k, 503, "The gateway is busy", M_NO_MEM,
                    NULL);
        return;
    }
    bufferevent_setcb(k->u, u_hop_read_cb, u_write_cb, u_event_cb, k);
    bufferevent_set_timeouts(k->u, &tv, &tv);
    k->state = S_CONNECT;
    if (bufferevent_socket_connect(k->u, (struct sockaddr *)&ss, sl) < 0) {
        conn_answer(k, 502, T_UNREACHABLE,
                    "The gateway could not reach the sandbox's host (its preview ingress); try "
                    "again in a moment.", NULL);
        return;
    }
}

/* ------------------------------------------------------------- the local hop */

/* The folder of a worker's local socket, opened one component at a time without following
 * a link, and only if it is root's or ours and nobody else may write to it: -1 otherwise.
 * Kept open (LOCAL_DIRS per instance). */
static int local_dir_fd(gw_preview *pv, const char *dir)
{
    char comp[256];
    const char *p = dir, *slash;
    struct stat st;
    int fd, next;
    unsigned i;

    for (i = 0; i < LOCAL_DIRS; i++)
        if (pv->ldir[i].fd >= 0 && !strcmp(pv->ldir[i].dir, dir))
            return pv->ldir[i].fd;
    if (dir[0] != '/' || strlen(dir) >= sizeof(pv->ldir[0].dir) ||
        (fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -1;
    while (*p) {
        size_t n;

        while (*p == '/')
            p++;
        if (!*p)
            break;
        slash = strchr(p, '/');
        n = slash ? (size_t)(slash - p) : strlen(p);
        if (n >= sizeof(comp) || (n == 1 && p[0] == '.') || (n == 2 && !strncmp(p, "..", 2))) {
            close(fd);
            return -1;
        }
        memcpy(comp, p, n);
        comp[n] = 0;
        next = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        if (next < 0)
            return -1;
        fd = next;
        p += n;
    }
    if (fstat(fd, &st) < 0 || (st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & 022)) {
        close(fd);
        return -1;
    }
    i = pv->ldir_next++ % LOCAL_DIRS;
    if (pv->ldir[i].fd >= 0)
        close(pv->ldir[i].fd);
    pv->ldir[i].fd = fd;
    snprintf(pv->ldir[i].dir, sizeof(pv->ldir[i].dir), "%s", dir);
    return fd;
}

static void local_dir_forget(gw_preview *pv, int fd)
{
    for (unsigned i = 0; i < LOCAL_DIRS; i++)
        if (pv->ldir[i].fd == fd) {
            close(fd);
            pv->ldir[i].fd = -1;
        }
}

/* Bytes written to the sandbox (the local hop's "in"). */
static void u_out_counted(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
    pv_conn *k = arg;

    (void)b;
    k->l_in += info->n_deleted;
}

/* The worker answered OK with the socket (k->lfd) and n early bytes (in k->lin): it
 * becomes the hop's k->u, and the relay is the same as over TCP. */
static void local_ok(pv_conn *k)
{
    struct evbuffer *in;

    if (!(k->u = bufferevent_socket_new(k->pv->ctx->d.base, k->lfd, BEV_OPT_CLOSE_ON_FREE))) {
        conn_answer(k, 503, "The gateway is busy", M_NO_MEM, NULL);
        return;
    }
    k->lfd = -1;
    bufferevent_setcb(k->u, u_hop_read_cb, u_write_cb, u_event_cb, k);
    in = bufferevent_get_input(k->u);
    evbuffer_unfreeze(in, 0); /* (a socket bufferevent's input takes bytes from itself only) */
    evbuffer_add_buffer(in, k->lin);
    evbuffer_freeze(in, 0);
    if (!evbuffer_add_cb(bufferevent_get_output(k->u), u_out_counted, k)) {
        conn_answer(k, 503, "The gateway is busy", M_NO_MEM, NULL);
        return;
    }
    bufferevent_enable(k->u, EV_READ);
    /* from now on the worker's side only ends (a drop, the worker gone): the relay with it */
    event_del(k->ev_l);
    event_add(k->ev_l, NULL);
    relay_begin(k);
}

/* The local socket: the answer line (with the socket into the sandbox), later only its end. */
static void local_cb(evutil_socket_t fd, short what, void *arg)
{
    pv_conn *k = arg;
    struct evbuffer_ptr eol;
    char line[HOP_ANSWER_MAX + 1];
    size_t n;
    int eof = 0;

    if (k->state != S_HOPWAIT) { /* the worker ended the hop: cut (or said what it must not) */
        conn_close(k);
        return;
    }
    if (what & EV_TIMEOUT) {
        sf_warn("msg=\"preview hop failed\" sandbox=%s port=%u host=%s state=local-answer",
                k->t.sandbox, k->t.port, k->host);
        conn_answer(k, 504, T_UNREACHABLE, M_HOST_SLOW, NULL);
        return;
    }
    for (;;) {
        char b[16384];
        union {
            struct cmsghdr h;
            char c[CMSG_SPACE(sizeof(int) * 4)];
        } cm;
        struct iovec io = {b, sizeof(b)};
        struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cm.c,
                           .msg_controllen = sizeof(cm.c)};
        ssize_t r = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            eof = 1;
            break;
        }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                int got;

                memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                if (k->lfd < 0)
                    k->lfd = got;
                else
                    close(got); /* one socket per hop */
            }
        }
        if (r == 0) {
            eof = 1;
            break;
        }
        if (evbuffer_add(k->lin, b, (size_t)r) < 0 ||
            evbuffer_get_length(k->lin) > HOP_ANSWER_MAX + LOCAL_EARLY_MAX) {
            conn_answer(k, 502, T_UNREACHABLE, M_NOT_HOP, NULL);
            return;
        }
    }
    eol = evbuffer_search(k->lin, "\n", 1, NULL);
    if (eol.pos < 0 || (size_t)eol.pos > HOP_ANSWER_MAX) {
        if (eol.pos >= 0 || evbuffer_get_length(k->lin) > HOP_ANSWER_MAX)
            conn_answer(k, 502, T_UNREACHABLE, M_NOT_HOP, NULL);
        else if (eof)
            conn_answer(k, 502, T_UNREACHABLE, M_HOST_GONE, NULL);
        return;
    }
    n = (size_t)eol.pos;
    evbuffer_copyout(k->lin, line, n);
    line[n] = 0;
    if (!strncmp(line, "SFHOP1 OK ", 10)) {
        char *end;
        unsigned long early = strtoul(line + 10, &end, 10);

        if (*end || end == line + 10 || early > LOCAL_EARLY_MAX || k->lfd < 0) {
            conn_answer(k, 502, T_UNREACHABLE, M_NOT_HOP, NULL);
            return;
        }
        if (evbuffer_get_length(k->lin) < n + 1 + early) {
            if (eof)
                conn_answer(k, 502, T_UNREACHABLE, M_HOST_GONE, NULL);
            return; /* the rest comes */
        }
        evbuffer_drain(k->lin, n + 1);
        if (evbuffer_get_length(k->lin) > early) { /* nothing but reports' room after it */
            conn_answer(k, 502, T_UNREACHABLE, M_NOT_HOP, NULL);
            return;
        }
        local_ok(k);
        return;
    }
    hop_refused(k, line);
}

/* A hop over the worker's local socket at path: 0 (the answer comes to local_cb), or -1
 * when it cannot be made (the TCP hop then). */
static int local_connect(pv_conn *k, const char *path)
{
    gw_preview *pv = k->pv;
    const char *slash = strrchr(path, '/');
    char dir[256], line[HOP_ANSWER_MAX];
    struct sockaddr_un sun;
    struct stat st;
    int64_t ms = pv->ctx->cfg.preview_hop_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    int dfd, s, n;
    size_t len;

    if (!slash || slash == path || (size_t)(slash - path) >= sizeof(dir) || !slash[1] ||
        strlen(slash + 1) > 64)
        return -1;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = 0;
    if ((dfd = local_dir_fd(pv, dir)) < 0)
        return -1;
    if (fstatat(dfd, slash + 1, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode) ||
        (st.st_uid != 0 && st.st_uid != geteuid())) {
        local_dir_forget(pv, dfd); /* (opened again next time: a worker may come back) */
        return -1;
    }
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    snprintf(sun.sun_path, sizeof(sun.sun_path), "/proc/self/fd/%d/%s", dfd, slash + 1);
    if ((s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
        return -1;
    if (connect(s, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
        if (errno == ENOENT || errno == ECONNREFUSED)
            local_dir_forget(pv, dfd);
        close(s);
        return -1;
    }
    n = sf_pv_hop_line(k->key, k->t.sandbox, k->t.port, k->epoch, (int64_t)sf_now_ms(), line,
                       sizeof(line));
    len = n < 0 ? 0 : strlen(line);
    /* a new connection's socket takes one short line at once */
    if (n < 0 || send(s, line, len, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)len ||
        !(k->lin = evbuffer_new()) ||
        !(k->ev_l = event_new(pv->ctx->d.base, s, EV_READ | EV_PERSIST, local_cb, k)) ||
        event_add(k->ev_l, &tv) < 0) {
        close(s);
        local_reader_free(k);
        return -1;
    }
    k->lsock = s;
    k->state = S_HOPWAIT;
    return 0;
}

/* The one place a hop is made: the local one when the sandbox's host is this machine (its
 * boot id is ours) and its socket takes us, else TCP to its ingress. */
static void hop_make(pv_conn *k, const char *ingress, const char *local, const char *boot)
{
    gw_preview *pv = k->pv;

    if (pv->ctx->cfg.preview_local_hop && local[0] && pv->boot_id[0] &&
        !strcmp(boot, pv->boot_id) && local_connect(k, local) == 0)
        return;
    hop_connect(k, ingress);
}

/* ------------------------------------------------------------------ lookup */

static int reply_str(const redisReply *r, char *out, size_t n)
{
    if (!r || r->type != REDIS_REPLY_STRING || r->len == 0 || r->len >= n) {
        out[0] = 0;
        return -1;
    }
    memcpy(out, r->str, r->len);
    out[r->len] = 0;
    return 0;
}

static int lookup_pending_done(pv_conn *k)
{
    k->redis_pending--;
    if (k->state == S_DEAD) {
        if (k->redis_pending == 0)
            conn_close(k);
        return 1;
    }
    return 0;
}

static void on_host(redisAsyncContext *ac, void *reply, void *priv)
{
    pv_conn *k = priv;
    redisReply *r = reply;
    char ingress[128], local[256], boot[40];

    if (lookup_pending_done(k))
        return;
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 3) {
        conn_answer(k, 503, T_UNAVAILABLE,
                    M_LOST_REDIS, NULL);
        return;
    }
    reply_str(r->element[1], local, sizeof(local));
    reply_str(r->element[2], boot, sizeof(boot));
    if (reply_str(r->element[0], ingress, sizeof(ingress)) < 0) {
        conn_answer(k, 502, T_UNREACHABLE,
                    "The sandbox's host has no preview ingress (its worker is down or too old "
                    "for previews); try again in a moment.", NULL);
        return;
    }
    if (gw_pv_team_conn_take(k->te, (unsigned)k->pv->ctx->cfg.preview_max_conns_team) < 0) {
        conn_answer(k, 429, T_TOO_MANY,
                    "This team has as many preview connections open as the platform allows "
                    "(preview_max_conns_team); close some tabs or try again in a moment.",
                    "Retry-After: 1\r\n");
        return;
    }
    k->team_held = 1;
    hop_make(k, ingress, local, boot);
}

static void on_record(redisAsyncContext *ac, void *reply, void *priv)
{
    pv_conn *k = priv;
    redisReply *r = reply;
    char state[32], pvf[64], access[16];
    unsigned long long epoch = 0;
    gw_ctx *ctx = k->pv->ctx;
    char text[512];

    if (lookup_pending_done(k))
        return;
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 4) {
        conn_answer(k, 503, T_UNAVAILABLE,
                    M_LOST_REDIS, NULL);
        return;
    }
    reply_str(r->element[0], k->host, sizeof(k->host));
    reply_str(r->element[1], k->team, sizeof(k->team));
    reply_str(r->element[2], state, sizeof(state));
    reply_str(r->element[3], pvf, sizeof(pvf));
    if (!k->host[0] || !k->team[0] || !state[0] || !strcmp(state, "killed") ||
        !strcmp(state, "killing") || !strcmp(state, "failed") || !strcmp(state, "lost")) {
        snprintf(text, sizeof(text),
                 "There is no sandbox %s (it was never created, or it was killed). Create one "
                 "and ask for its URL with sandbox_preview_url.", k->t.sandbox);
        conn_answer(k, 404, "No such sandbox", text, NULL);
        return;
    }
    if (sscanf(pvf, "%15s %llu", access, &epoch) != 2 ||
        (strcmp(access, "public") != 0 && strcmp(access, "private") != 0)) {
        snprintf(text, sizeof(text),
                 "Port %u of sandbox %s is not published. Publish it with sandbox_preview_url "
                 "{sandbox_id: \"%s\", port: %u} and open the URL it gives.", k->t.port,
                 k->t.sandbox, k->t.sandbox, k->t.port);
        conn_answer(k, 404, "Port not published", text, NULL);
        return;
    }
    k->epoch = epoch;
    k->priv = !strcmp(access, "private");
    sf_host_job_key(ctx->auth_secret, k->host, k->key);
    if (!(k->te = gw_pv_team_get(ctx->pv_teams, k->team))) {
        conn_answer(k, 503, "The gateway is busy", "Too many teams use previews on this gateway "
                                                   "at once; try again later.", NULL);
        return;
    }
    if (k->priv) {
        int64_t exp = 0, now = (int64_t)time(NULL);
        int v = k->tok_src == TOK_NONE
                    ? -1
                    : gw_pv_token_check(k->token, strlen(k->token), k->key, k->t.sandbox,
                                        k->t.port, k->epoch, now, &exp);

        if (v != GW_PV_TOK_OK) {
            conn_answer(k, 403, "This preview is private", gw_pv_token_why(v), NULL);
            return;
        }
        if (k->tok_src == TOK_QUERY && !k->header_form) {
            /* the link is exchanged for a host-only cookie and the clean URL */
            char extra[600];

            snprintf(extra, sizeof(extra),
                     "Location: %s\r\nSet-Cookie: sf_preview=%s; Path=/; HttpOnly; "
                     "SameSite=Lax; Max-Age=%" PRId64 "%s\r\nReferrer-Policy: no-referrer\r\n",
                     k->location, k->token, exp - now,
                     !strcmp(scheme_of(k), "https") ? "; Secure" : "");
            conn_answer(k, 302, "Opening the preview",
                        "The link was accepted; your browser continues to the preview.", extra);
            return;
        }
    }
    if (sf_redis_cmd(ctx->redis, on_host, k, "HMGET " SF_RK_HOST " ingress ingress_local boot_id",
                     k->host) < 0) {
        conn_answer(k, 503, T_UNAVAILABLE,
                    M_NO_REDIS, NULL);
        return;
    }
    k->redis_pending++;
}

/* ------------------------------------------------------------------ connections */

static void conn_answer(pv_conn *k, int status, const char *title, const char *text,
                        const char *extra)
{
    sf_buf page;

    if (k->state == S_DEAD || k->state == S_ANSWER)
        return;
    sf_splice_free(k->down);
    k->down = NULL;
    cin_free(k);
    if (k->u) {
        bufferevent_free(k->u);
        k->u = NULL;
    }
    if (k->tick)
        evtimer_del(k->tick);
    local_end(k);
    sf_info("msg=preview_refused sandbox=%s port=%u status=%d peer=%s why=\"%s\"",
            k->t.sandbox[0] ? k->t.sandbox : "-", k->t.port, status, k->peer, title);
    sf_buf_init(&page, 64 << 10);
    k->state = S_ANSWER;
    bufferevent_setcb(k->c, c_answer_read_cb, c_write_cb, c_event_cb, k);
    if (gw_pv_page(&page, status, title, text, extra) < 0 ||
        bufferevent_write(k->c, page.p, page.len) < 0) {
        sf_buf_fini(&page);
        conn_close(k);
        return;
    }
    sf_buf_fini(&page);
    bufferevent_setwatermark(k->c, EV_WRITE, 0, 0);
    bufferevent_enable(k->c, EV_WRITE);
    bufferevent_disable(k->c, EV_READ);
}

static void conn_close(pv_conn *k)
{
    gw_preview *pv = k->pv;

    if (k->state != S_DEAD) {
        k->state = S_DEAD;
        SF_LIST_UNLINK(pv->conns, k);
        pv->nconns--;
        sf_splice_free(k->down); /* (its events before the bufferevents close the sockets) */
        k->down = NULL;
        cin_free(k);
        if (k->c && bufferevent_pair_get_partner(k->c)) /* an HTTP/2 stream (http2.c) */
            bufferevent_flush(k->c, EV_WRITE, BEV_FINISHED); /* hears the end */
        if (k->c)
            bufferevent_free(k->c);
        if (k->u)
            bufferevent_free(k->u);
        k->c = k->u = NULL;
        if (k->tick)
            event_free(k->tick);
        k->tick = NULL;
        flush_counts(k);
        local_end(k);
        if (k->team_held)
            gw_pv_team_conn_put(k->te);
        k->team_held = 0;
        gw_http_hold_release(pv->ctx->http, k->hold);
        k->hold = NULL;
    }
    if (k->redis_pending > 0)
        return; /* freed when its answer comes (lookup_pending_done) */
    sf_buf_fini(&k->first);
    sf_buf_fini(&k->h_target);
    sf_buf_fini(&k->h_fields);
    sf_buf_fini(&k->out);
    free(k->location);
    sodium_memzero(k->key, sizeof(k->key));
    sodium_memzero(k->token, sizeof(k->token));
    free(k);
}

/* The first request's head as it came, for the parser to read again in RELAY. */
static int first_head(pv_conn *k, gw_req *req)
{
    const char *name, *value;

    if (sf_buf_appendf(&k->first, "%s %s HTTP/1.%d\r\n", gw_req_method(req), gw_req_target(req),
                       gw_req_http_minor(req)) < 0)
        return -1;
    for (size_t i = 0; gw_req_header_at(req, i, &name, &value) == 0; i++)
        if (sf_buf_appendf(&k->first, "%s: %s\r\n", name, value) < 0)
            return -1;
    return sf_buf_append(&k->first, "\r\n", 2);
}

static void divert_take(const gw_http_divert *d, void *arg)
{
    gw_preview *pv = arg;
    gw_ctx *ctx = pv->ctx;
    gw_req *req = d->req;
    pv_conn *k = calloc(1, sizeof(*k));
    const char *why = NULL, *tok, *host = gw_req_header(req, "Host");
    int ok = 0;
    size_t tn = 0;

    if (!k) {
        bufferevent_free(d->bev);
        gw_http_hold_release(ctx->http, d->hold);
        return;
    }
    k->pv = pv;
    k->lsock = k->lfd = -1;
    k->c = d->bev;
    k->hold = d->hold;
    k->tls = d->tls;
    k->peer_port = d->peer_port;
    k->state = S_LOOKUP;
    snprintf(k->peer, sizeof(k->peer), "%s", d->peer ? d->peer : "unknown");
    snprintf(k->fwd_host, sizeof(k->fwd_host), "%s", host ? host : "");
    sf_buf_init(&k->first, HEAD_MAX + 4096);
    sf_buf_init(&k->h_target, HEAD_MAX);
    sf_buf_init(&k->h_fields, HEAD_MAX);
    sf_buf_init(&k->out, HEAD_MAX + 4096);
    SF_LIST_PUSH(pv->conns, k);
    pv->nconns++;
    bufferevent_setcb(k->c, c_answer_read_cb, c_write_cb, c_event_cb, k);
    req_names(pv, host, gw_req_header(req, "X-Sandfleet-Preview"), &k->t, &ok, &why,
              &k->header_form);
    if (!ok) {
        conn_answer(k, 404, "Not a preview address", why, NULL);
        return;
    }
    if (first_head(k, req) < 0) {
        conn_answer(k, 431, "Request too large",
                    "The request's headers are too large for a preview (64 KiB at most).", NULL);
        return;
    }
    if ((tok = gw_pv_query_token(gw_req_query(req), &tn))) {
        k->tok_src = TOK_QUERY;
    } else if ((tok = gw_req_header(req, "X-Sandfleet-Preview-Token"))) {
        k->tok_src = TOK_HEADER;
        tn = strlen(tok);
    } else if ((tok = gw_pv_cookie_at(gw_req_header(req, "Cookie"), 0, &tn))) {
        k->tok_src = TOK_COOKIE;
    }
    if (tok && tn < sizeof(k->token)) {
        memcpy(k->token, tok, tn);
        k->token[tn] = 0;
    } else if (tok) {
        k->token[0] = 0; /* too long: not one of ours (checked as malformed) */
        memcpy(k->token, "x", 2);
    }
    if (k->tok_src == TOK_QUERY) {
        sf_buf loc;

        sf_buf_init(&loc, 70000);
        if (gw_pv_strip_token(gw_req_target(req), &loc) < 0 || sf_buf_append(&loc, "", 1) < 0 ||
            strpbrk(loc.p, "\r\n") || !(k->location = strdup(loc.p[0] ? loc.p : "/"))) {
            sf_buf_fini(&loc);
            conn_answer(k, 400, "Bad request", "The preview's address could not be read.", NULL);
            return;
        }
        sf_buf_fini(&loc);
    }
    if (sf_redis_cmd(ctx->redis, on_record, k, "HMGET " SF_RK_SANDBOX " host team state pv:%u",
                     k->t.sandbox, k->t.port) < 0) {
        conn_answer(k, 503, T_UNAVAILABLE,
                    M_NO_REDIS, NULL);
        return;
    }
    k->redis_pending++;
}

/* ------------------------------------------------------------------ setup */

int gw_preview_start(gw_ctx *ctx, char *why, size_t n)
{
    gw_preview *pv = calloc(1, sizeof(*pv));

    if (!pv) {
        snprintf(why, n, "out of memory");
        return -1;
    }
    pv->ctx = ctx;
    for (unsigned i = 0; i < LOCAL_DIRS; i++)
        pv->ldir[i].fd = -1;
    sf_boot_id(pv->boot_id, sizeof(pv->boot_id));
    if (gw_pv_domain_host(ctx->cfg.preview_domain, pv->dom_host, sizeof(pv->dom_host)) < 0) {
        snprintf(why, n, "preview_domain \"%s\" is not a host name with an optional :port "
                 "(e.g. preview.example.com)", ctx->cfg.preview_domain);
        free(pv);
        return -1;
    }
    if (strcmp(ctx->cfg.preview_scheme, "http") != 0 &&
        strcmp(ctx->cfg.preview_scheme, "https") != 0) {
        snprintf(why, n, "preview_scheme must be http or https, not \"%s\"",
                 ctx->cfg.preview_scheme);
        free(pv);
        return -1;
    }
    ctx->preview = pv;
    /* HTTP/1 heads are diverted here; HTTP/2 streams too (http2.c relays each one as an
     * HTTP/1.1 request through a pipe to the HTTP/1 leaf, which diverts it), so TLS offers
     * preview hosts h2 like any other name */
    gw_http_server_set_divert(ctx->http, divert_match, divert_take, pv);
    return 0;
}

void gw_preview_stop(gw_ctx *ctx)
{
    gw_preview *pv = ctx->preview;

    if (!pv)
        return;
    while (pv->conns) {
        pv_conn *k = pv->conns;

        conn_close(k); /* (one waiting for Redis is freed by sf_redis_free's callbacks) */
    }
    for (unsigned i = 0; i < LOCAL_DIRS; i++)
        if (pv->ldir[i].fd >= 0)
            close(pv->ldir[i].fd);
    ctx->preview = NULL;
    free(pv);
}
