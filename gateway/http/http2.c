/* http2.c: the HTTP/2 leaf of the gateway's server (server.h), on nghttp2: connections
 * that start with the client preface (h2c prior knowledge; server.c sniffs it), HTTP/1.1
 * requests upgraded with `Upgrade: h2c`, and TLS connections whose ALPN chose h2 (both
 * handed over through gw_conn_serve). Each stream's request is a
 * gw_req (req.h) answered whole or streamed, like an HTTP/1 one.
 *
 * nghttp2 is driven with mem_recv / mem_send on a bufferevent: input is fed as it comes,
 * output is produced after each input batch and after each answer given from outside a
 * callback. A request with a body has its head checked (gw_http_server_set_head_check: the
 * key) before any of its body is accepted: the window updates that let a client send body
 * bytes are withheld until the check passes, so a connection holds at most the initial
 * connection window (64 KiB) of unchecked body, and a failed check answers (401) while the
 * body is still unsent. A request's header block and body count against the server's buffer budget
 * (bytes that arrived, never declared sizes) until it is answered; a body over max_body,
 * headers over max_header_bytes, or a full budget get 413 / 431 / 503 on that stream
 * only. A request still arriving has a total deadline as on HTTP/1 (headers within
 * header_timeout_ms; all of it within that plus body_timeout_ms plus its bytes at
 * body_min_rate): past it, 408 and the stream is reset. Connections without open
 * streams close after idle_timeout_s. A stream whose head the divert hook matches (preview
 * URLs) is relayed to the HTTP/1 leaf instead ("preview streams" below). */
#include "proto.h"

#include "conn.h"
#include "llhttp.h"
#include "req_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "sf_list.h"
#include "sf_log.h"
#include "sf_msg.h"

#define H2_MAX_STREAMS 128u
#define H2_OUT_HIGH_WM (256u << 10) /* stop producing frames while this much waits unsent */
#define H2_MAX_IO      (256u << 10) /* one read or write (libevent's default: 16 KiB) */
#define H2_FRAME       16384u      /* the DATA frame size a stream's body is cut for */
#define H2_SMALL_PIECE 512u        /* a referenced piece below this is copied (a chain each
                                      cost more than the copy) */
#define H2_PIPE_HIGH   (1u << 20)  /* a preview stream's answer bytes held before it stops
                                      reading its pipe */
#define H2_PIPE_LOW    (256u << 10) /* ...and reads again below this */
#define H2_PIPE_STEP   (64u << 10) /* one step of the answer's parser */
#define H2_PIPE_HEAD   (64u << 10) /* an answer's header fields */

typedef struct h2_stream h2_stream;

struct gw_h2_conn {
    gw_http_server *srv;
    gw_h2_conn *prev, *next;
    struct bufferevent *bev;
    nghttp2_session *ng;
    h2_stream *streams;
    unsigned nstreams;
    int in_recv;          /* inside nghttp2_session_mem_recv: no sending, no freeing */
    int dead;             /* to be freed once out of callbacks */
    int tls;
    int raw;              /* a plain socket: output is written to it at once (h2_flush) */
    int peer_port;
    gw_addr *addr;        /* the client address's counts */
    struct event *sweep;  /* checks the deadlines of requests still arriving */
    char peer[64];
};

struct h2_stream {
    gw_h2_conn *hc;
    h2_stream *prev, *next;
    int32_t id;
    gw_req *req;           /* NULL once answered (or never: refused) */
    struct evbuffer *out;  /* response body bytes not yet framed */
    size_t held;           /* bytes counted in the server budget */
    size_t unconsumed;     /* body bytes received while its head check runs (no window
                              update for them yet) */
    size_t hdr_bytes;
    int err;               /* status to refuse with once the request is complete */
    const char *err_msg;
    unsigned eof : 1, responded : 1, dispatched : 1, remote_done : 1;
    unsigned checked : 1;  /* its head check passed (or it needs none): body accepted */
    int64_t t0_ms;         /* monotonic: when its headers began */
    /* A preview stream (the divert hook matched its head): one HTTP/1.1 request with
     * Connection: close, written into a bufferevent pair whose other end the HTTP/1 leaf
     * serves (and diverts); the HTTP/1.1 answer read back is parsed into this stream. */
    struct bufferevent *pipe;
    llhttp_t rp;           /* the answer's parser */
    sf_buf rh;             /* its header fields as name\0value\0 */
    size_t up_unconsumed;  /* request body bytes whose stream window is not given back yet */
    unsigned bridged : 1, up_chunked : 1, up_done : 1, resp_nobody : 1, resp_begun : 1,
        resp_done : 1, pipe_paused : 1, pipe_eof : 1;
};

static void h2_respond(gw_req *r, int status, const char *ctype, const char *const *headers,
                       const char *body, size_t len);
static int h2_stream_begin(gw_req *r, int status, const char *ctype, const char *const *headers);
static int h2_stream_write(gw_req *r, const char *data, size_t len);
static void h2_stream_end(gw_req *r);
static void h2_head_verdict(gw_req *r, int status, const char *msg);

static const gw_req_transport h2_transport = {
    .respond = h2_respond,
    .stream_begin = h2_stream_begin,
    .stream_write = h2_stream_write,
    .stream_end = h2_stream_end,
    .head_verdict = h2_head_verdict,
};

static void h2_flush(gw_h2_conn *hc);
static void h2_conn_free(gw_h2_conn *hc);
static void bridge_close(h2_stream *st);

/* ------------------------------------------------------------------ streams */

static void stream_release(h2_stream *st)
{
    gw_budget_sub(st->hc->srv, st->hc->addr, st->held);
    st->held = 0;
}

static void stream_hold(h2_stream *st, size_t n)
{
    st->held += n;
    gw_budget_add(st->hc->srv, st->hc->addr, n);
}

/* Body bytes the stream (or the connection, once the stream is gone) is done with: the
 * client may send as many again (window updates are ours to send, see gw_h2_serve). */
static void body_consumed(gw_h2_conn *hc, int32_t id, size_t n)
{
    if (n > 0 && hc->ng)
        nghttp2_session_consume(hc->ng, id, n);
}

static void stream_consume_held_back(h2_stream *st)
{
    size_t n = st->unconsumed;

    st->unconsumed = 0;
    body_consumed(st->hc, st->id, n);
}

static h2_stream *stream_new(gw_h2_conn *hc, int32_t id)
{
    h2_stream *st = calloc(1, sizeof(*st));

    if (!st)
        return NULL;
    st->hc = hc;
    st->id = id;
    st->t0_ms = sf_mono_ms();
    sf_buf_init(&st->rh, H2_PIPE_HEAD);
    if (!(st->out = evbuffer_new()) ||
        !(st->req = gw_req_new(&h2_transport, hc->srv, st, hc->srv->lim.max_header_bytes,
                               hc->srv->lim.max_body))) {
        if (st->out)
            evbuffer_free(st->out);
        free(st);
        return NULL;
    }
    st->req->srv = hc->srv;
    st->req->peer = hc->peer;
    st->req->peer_port = hc->peer_port;
    st->req->proto = hc->tls ? "h2" : "h2c";
    st->req->minor = 1;
    SF_LIST_PUSH(hc->streams, st);
    hc->nstreams++;
    return st;
}

/* The stream is gone (closed, reset, or the connection ends): a request still waiting for
 * its answer is aborted. */
static void stream_free(h2_stream *st)
{
    gw_h2_conn *hc = st->hc;

    if (st->req) {
        gw_req_abort(st->req);
        gw_req_free(st->req);
        st->req = NULL;
    }
    bridge_close(st);
    sf_buf_fini(&st->rh);
    stream_release(st);
    if (st->unconsumed > 0 && hc->ng) /* the stream is closed: the connection's share */
        nghttp2_session_consume_connection(hc->ng, st->unconsumed);
    st->unconsumed = 0;
    evbuffer_free(st->out);
    SF_LIST_UNLINK(hc->streams, st);
    hc->nstreams--;
    if (hc->ng)
        nghttp2_session_set_stream_user_data(hc->ng, st->id, NULL);
    free(st);
}

/* A DATA frame's size: its bytes stay in st->out and are not copied into nghttp2's frame
 * buffer (NO_COPY): send_data_cb moves them to the output (chains move without a copy; a
 * fixed answer such as tools/list is a reference to its one encoding). */
static ssize_t data_read_cb(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *src, void *user)
{
    h2_stream *st = src->ptr;
    size_t n = evbuffer_get_length(st->out);

    if (n == 0 && !st->eof)
        return NGHTTP2_ERR_DEFERRED;
    if (n > length) { /* end the frame where a chain ends, so that chains move whole */
        struct evbuffer_iovec v[8];
        int k = evbuffer_peek(st->out, (ev_ssize_t)length, NULL, v, 8);
        size_t whole = 0;

        for (int i = 0; i < k && i < 8 && whole + v[i].iov_len <= length; i++)
            whole += v[i].iov_len;
        n = whole > 0 ? whole : length;
    }
    *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (st->eof && n == evbuffer_get_length(st->out))
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* A body for st->out: referenced pieces (a fixed answer such as tools/list) become
 * reference chains cut at every H2_FRAME bytes of the body, so that each DATA frame moves
 * whole chains (a frame that ended inside a chain copied its part: the 30 KB tools/list
 * was copied whole on h2c). */
static int h2_body_add(h2_stream *st, const gw_req *r, const char *body, size_t len)
{
    size_t off = 0;
    int rc = 0;

    if (body)
        return evbuffer_add(st->out, body, len);
    for (size_t i = 0; i < r->npieces && rc == 0; i++) {
        const gw_piece *pc = &r->pieces[i];

        if (!pc->ref || pc->n < H2_SMALL_PIECE) { /* small: into the current chain */
            rc = evbuffer_add(st->out, pc->p, pc->n);
            off += pc->n;
            continue;
        }
        for (size_t done = 0; done < pc->n && rc == 0;) {
            size_t cut = H2_FRAME - off % H2_FRAME, k = pc->n - done < cut ? pc->n - done : cut;

            rc = evbuffer_add_reference(st->out, pc->p + done, k, NULL, NULL);
            done += k;
            off += k;
        }
    }
    return rc;
}

/* Sends one DATA frame whose size data_read_cb gave: its header, then its bytes from the
 * stream's buffer (padding is never asked for: no select_padding callback). */
static int send_data_cb(nghttp2_session *ng, nghttp2_frame *frame, const uint8_t *framehd,
                        size_t length, nghttp2_data_source *src, void *user)
{
    static const uint8_t zeros[256];
    gw_h2_conn *hc = user;
    h2_stream *st = src->ptr;
    struct evbuffer *out = bufferevent_get_output(hc->bev);
    size_t pad = frame->data.padlen;
    uint8_t padlen = (uint8_t)(pad > 0 ? pad - 1 : 0);

    if (evbuffer_add(out, framehd, 9) < 0 || (pad > 0 && evbuffer_add(out, &padlen, 1) < 0) ||
        evbuffer_get_length(st->out) < length ||
        evbuffer_remove_buffer(st->out, out, length) != (int)length ||
        (pad > 1 && evbuffer_add(out, zeros, pad - 1) < 0))
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (st->pipe && st->pipe_paused && evbuffer_get_length(st->out) < H2_PIPE_LOW) {
        st->pipe_paused = 0; /* the client took enough: read the preview's answer again */
        bufferevent_enable(st->pipe, EV_READ);
        bufferevent_trigger(st->pipe, EV_READ, BEV_OPT_DEFER_CALLBACKS);
    }
    return 0;
}

/* Builds the header list; names are lower-cased into `store`. */
static int submit_head(h2_stream *st, int status, const char *ctype, const char *const *headers,
                       int has_body, int stream, size_t len, const char *rid)
{
    gw_http_server *s = st->hc->srv;
    nghttp2_nv nv[40];
    char status_s[24], len_s[24], names[32][64];
    size_t n = 0, nn = 0;
    int has_cc = 0;
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read_cb};

#define NV(nm, val)                                                                          \
    do {                                                                                     \
        nv[n].name = (uint8_t *)(nm);                                                        \
        nv[n].namelen = strlen(nm);                                                          \
        nv[n].value = (uint8_t *)(val);                                                      \
        nv[n].valuelen = strlen(val);                                                        \
        nv[n].flags = NGHTTP2_NV_FLAG_NONE;                                                  \
        n++;                                                                                 \
    } while (0)
    gw_fmt_uint(status_s, (size_t)(status >= 100 && status <= 999 ? status : 500));
    NV(":status", status_s);
    NV("date", gw_http_date(&s->date_sec, s->date));
    if (ctype && *ctype && gw_http_is_field_value(ctype))
        NV("content-type", ctype);
    for (size_t i = 0; headers && headers[i] && headers[i + 1] && n < 36 && nn < 32; i += 2) {
        const char *name = headers[i], *value = headers[i + 1];
        size_t l = strlen(name);

        if (!gw_http_is_token(name) || !gw_http_is_field_value(value) || gw_http_is_framing(name) ||
            l >= sizeof(names[0]))
            continue;
        for (size_t k = 0; k <= l; k++)
            names[nn][k] = (char)((name[k] >= 'A' && name[k] <= 'Z') ? name[k] + 32 : name[k]);
        if (!strcmp(names[nn], "cache-control"))
            has_cc = 1;
        NV(names[nn], value);
        nn++;
    }
    if (!has_cc)
        NV("cache-control", "no-store");
    if (rid) { /* unique per answer: never worth a place in the HPACK table, and nghttp2's
                * table groups entries by name, so each one indexed lengthened the chain every
                * later answer's lookup walked (18% of the gateway's CPU time on h2c) */
        NV("x-request-id", rid);
        nv[n - 1].flags = NGHTTP2_NV_FLAG_NO_INDEX;
    }
    if (!stream && status != 204 && status != 304) {
        gw_fmt_uint(len_s, len);
        NV("content-length", len_s);
    }
#undef NV
    return nghttp2_submit_response(st->hc->ng, st->id, nv, n, has_body ? &prd : NULL) == 0
               ? 0
               : -ENOMEM;
}

/* A request this server refuses by itself (never dispatched). */
static void stream_refuse(h2_stream *st, int status, const char *msg)
{
    gw_http_server *s = st->hc->srv;
    char json[512], challenge[768];
    static const char *const retry[] = {"Retry-After", "1", NULL};
    const char *www_auth[] = {"WWW-Authenticate",
                              "Bearer realm=\"sandfleet\", error=\"invalid_token\"", NULL};
    const char *const *extra = (status == 503 || status == 429) ? retry : NULL;
    int n;

    if (st->responded)
        return;
    st->responded = 1;
    gw_http_count_refusal(s, status);
    if (status == 401) { /* RFC 6750: the error code, and the sentence a person reads */
        int had_auth = st->req && gw_req_header(st->req, "Authorization") != NULL;

        if (st->req && s->challenge) {
            s->challenge(st->req, msg, challenge, sizeof(challenge), s->challenge_arg);
            www_auth[1] = challenge;
        }
        extra = www_auth;
        n = snprintf(json, sizeof(json), "{\"error\":\"%s\",\"error_description\":\"%s\"}",
                     had_auth ? "invalid_token" : "unauthorized", msg);
    } else {
        n = snprintf(json, sizeof(json), "{\"error\":\"%s\"}", msg);
    }
    if (n < 0 || (size_t)n >= sizeof(json))
        n = snprintf(json, sizeof(json), "{\"error\":\"%s\"}", gw_http_reason(status));
    if (st->req) {
        if (st->req->in_headcheck)
            gw_req_abort(st->req); /* the pending check forgets it */
        gw_req_free(st->req);
        st->req = NULL;
    }
    stream_release(st);
    stream_consume_held_back(st);
    evbuffer_add(st->out, json, (size_t)n);
    st->eof = 1;
    sf_debug("msg=\"rejected HTTP/2 request\" status=%d peer=%s reason=\"%s\"", status,
             st->hc->peer, msg);
    submit_head(st, status, "application/json", extra, 1, 0, (size_t)n, NULL);
}

static void stream_dispatch(h2_stream *st)
{
    gw_h2_conn *hc = st->hc;
    gw_req *r = st->req;

    if (st->dispatched || st->responded || !r || !st->checked)
        return;
    if (st->err) {
        stream_refuse(st, st->err, st->err_msg);
        return;
    }
    if (!r->target.p || !r->method || (!r->path && gw_req_split_target(r) < 0)) {
        stream_refuse(st, 400, SF_MSG_H2_NO_METHOD_PATH_WHY);
        return;
    }
    st->dispatched = 1;
    r->dispatched = 1;
    hc->srv->handler(r, hc->srv->arg);
}

/* ------------------------------------------------------------------ answers (h2 transport) */

static void after_answer(gw_h2_conn *hc)
{
    if (!hc->in_recv)
        h2_flush(hc);
}

static void h2_respond(gw_req *r, int status, const char *ctype, const char *const *headers,
                       const char *body, size_t len)
{
    h2_stream *st = r->conn;
    gw_h2_conn *hc = st->hc;
    int send_body = !r->head && status != 204 && status != 304 && len > 0;

    st->responded = 1;
    st->req = NULL;
    stream_release(st);
    if (send_body)
        h2_body_add(st, r, body, len);
    st->eof = 1;
    if (submit_head(st, status, ctype, headers, send_body, 0, len, r->id) < 0)
        nghttp2_submit_rst_stream(hc->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    gw_req_free(r);
    after_answer(hc);
}

static int h2_stream_begin(gw_req *r, int status, const char *ctype, const char *const *headers)
{
    h2_stream *st = r->conn;

    if (r->head) {
        h2_respond(r, status, ctype, headers, NULL, 0);
        return -EPIPE;
    }
    if (submit_head(st, status, ctype, headers, 1, 1, 0, r->id) < 0)
        return -ENOMEM;
    stream_release(st);
    after_answer(st->hc);
    return 0;
}

static int h2_stream_write(gw_req *r, const char *data, size_t len)
{
    h2_stream *st = r->conn;

    if (st->hc->dead)
        return -EPIPE;
    if (evbuffer_get_length(st->out) + len > GW_STREAM_MAX_UNSENT)
        return -ENOBUFS;
    if (evbuffer_add(st->out, data, len) < 0)
        return -ENOMEM;
    nghttp2_session_resume_data(st->hc->ng, st->id);
    after_answer(st->hc);
    return 0;
}

static void h2_stream_end(gw_req *r)
{
    h2_stream *st = r->conn;
    gw_h2_conn *hc = st->hc;

    st->eof = 1;
    st->responded = 1;
    st->req = NULL;
    gw_req_free(r);
    nghttp2_session_resume_data(hc->ng, st->id);
    after_answer(hc);
}

/* The head check's answer: the body held back so far is let in (and the client may send
 * the rest), or the request is refused while its body may still be unsent. */
static void h2_head_verdict(gw_req *r, int status, const char *msg)
{
    h2_stream *st = r->conn;
    gw_h2_conn *hc = st->hc;
    int nested = hc->in_recv;

    if (st->responded || st->req != r)
        return;
    hc->in_recv = 1; /* nothing is sent (so no stream is closed and freed) until the end */
    if (status) {
        stream_refuse(st, status, msg ? msg : gw_http_reason(status));
    } else {
        st->checked = 1;
        stream_consume_held_back(st);
        if (st->remote_done)
            stream_dispatch(st); /* st may be answered here, but stays until sent */
    }
    if (nested)
        return; /* the input loop sends */
    hc->in_recv = 0;
    if (hc->dead) {
        hc->dead = 0;
        h2_conn_free(hc);
        return;
    }
    h2_flush(hc);
}

/* ------------------------------------------------------------------ preview streams */

/* A stream whose head the divert hook matches (preview URLs, server.h) is not dispatched:
 * it becomes one HTTP/1.1 request (its head, then its body as it arrives: as it came with
 * content-length, else chunked; always Connection: close) written into a bufferevent pair
 * whose other end is served by the HTTP/1 leaf, which diverts it like any HTTP/1
 * connection. The HTTP/1.1 answer read back from the pair is parsed into this stream's
 * HEADERS and DATA. Both ways are bounded: a request body's stream window is given back
 * only as the pipe drains (the connection's at once, so one slow stream stalls no other),
 * and the pipe is not read while H2_PIPE_HIGH of the answer waits for the client's
 * window. Both pair ends defer their callbacks, so neither side runs inside the other. */

/* The pipe is done with (answer complete, stream gone): the other side hears an error,
 * as from a client that went away, and closes. */
static void bridge_close(h2_stream *st)
{
    struct bufferevent *p = st->pipe, *partner;

    if (!p)
        return;
    st->pipe = NULL;
    if ((partner = bufferevent_pair_get_partner(p)))
        bufferevent_trigger_event(partner, BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_READING,
                                  0);
    bufferevent_free(p);
    if (st->up_unconsumed > 0 && st->hc->ng)
        nghttp2_session_consume_stream(st->hc->ng, st->id, st->up_unconsumed);
    st->up_unconsumed = 0;
}

/* The answer could not be read whole: a page when nothing of it went out yet, else the
 * stream is reset. */
static void bridge_fail(h2_stream *st, const char *why)
{
    static const char msg[] = "The preview's answer could not be read; try again.\n";

    sf_debug("msg=\"preview stream failed\" peer=%s stream=%d why=\"%s\" begun=%d eof=%d",
             st->hc->peer, (int)st->id, why, (int)st->resp_begun, (int)st->pipe_eof);
    if (!st->resp_begun) {
        st->resp_begun = 1;
        evbuffer_drain(st->out, evbuffer_get_length(st->out));
        evbuffer_add(st->out, msg, sizeof(msg) - 1);
        st->eof = 1;
        if (submit_head(st, 502, "text/plain; charset=utf-8", NULL, 1, 0, sizeof(msg) - 1,
                        NULL) < 0)
            nghttp2_submit_rst_stream(st->hc->ng, NGHTTP2_FLAG_NONE, st->id,
                                      NGHTTP2_INTERNAL_ERROR);
    } else if (!st->resp_done) {
        nghttp2_submit_rst_stream(st->hc->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    }
    st->resp_done = 1;
    bridge_close(st);
}

/* Gives the client back the stream window of the body bytes that left the pipe. */
static void bridge_window(h2_stream *st)
{
    if (st->up_unconsumed == 0 ||
        (st->pipe && evbuffer_get_length(bufferevent_get_output(st->pipe)) > H2_PIPE_LOW))
        return;
    nghttp2_session_consume_stream(st->hc->ng, st->id, st->up_unconsumed);
    st->up_unconsumed = 0;
}

static int hop_hdr(const char *name, size_t n)
{
    static const char *const hop[] = {"connection", "keep-alive", "proxy-connection",
                                      "transfer-encoding", "upgrade", "te"};

    for (size_t i = 0; i < SF_ARRAY_LEN(hop); i++)
        if (strlen(hop[i]) == n && !strncasecmp(hop[i], name, n))
            return 1;
    return 0;
}

static int rp_begin(llhttp_t *p)
{
    h2_stream *st = p->data;

    sf_buf_reset(&st->rh);
    return 0;
}

/* (a name or value may come in several pieces; each ends with its _complete callback) */
static int rp_piece(llhttp_t *p, const char *at, size_t n)
{
    h2_stream *st = p->data;

    return sf_buf_append(&st->rh, at, n) < 0 ? -1 : 0;
}

static int rp_piece_end(llhttp_t *p)
{
    h2_stream *st = p->data;

    return sf_buf_append(&st->rh, "", 1) < 0 ? -1 : 0;
}

/* The answer's head: informational ones (1xx) are not passed on; the final one becomes
 * the stream's HEADERS (names lower-cased, the hop-by-hop fields dropped). */
static int rp_headers(llhttp_t *p)
{
    h2_stream *st = p->data;
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read_cb};
    nghttp2_nv *nv;
    char status_s[8];
    size_t n = 1, cap = 1;
    const char *f, *end;
    int rc;

    if (p->status_code < 200 || p->status_code > 999 || st->resp_begun)
        return p->status_code < 200 ? 0 : -1;
    end = st->rh.p + st->rh.len;
    for (f = st->rh.p; f && f < end; f += strlen(f) + 1)
        cap++;
    if (!(nv = calloc(cap, sizeof(*nv))))
        return -1;
    snprintf(status_s, sizeof(status_s), "%d", (int)p->status_code);
    nv[0] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status_s, 7, strlen(status_s),
                         NGHTTP2_NV_FLAG_NONE};
    for (f = st->rh.p; f && f < end && n < cap;) {
        char *name = (char *)f, *val = name + strlen(name) + 1;
        size_t nl = strlen(name);

        if (val >= end)
            break;
        f = val + strlen(val) + 1;
        while (*val == ' ' || *val == '\t')
            val++;
        if (nl == 0 || hop_hdr(name, nl))
            continue;
        for (size_t i = 0; i < nl; i++)
            if (name[i] >= 'A' && name[i] <= 'Z')
                name[i] = (char)(name[i] + 32);
        nv[n++] = (nghttp2_nv){(uint8_t *)name, (uint8_t *)val, nl, strlen(val),
                               NGHTTP2_NV_FLAG_NONE};
    }
    rc = nghttp2_submit_response(st->hc->ng, st->id, nv, n, &prd); /* (copies nv) */
    free(nv);
    if (rc != 0)
        return -1;
    st->resp_begun = 1;
    return st->resp_nobody ? 1 : 0; /* HEAD: no body follows */
}

static int rp_body(llhttp_t *p, const char *at, size_t n)
{
    h2_stream *st = p->data;

    if (evbuffer_add(st->out, at, n) < 0)
        return -1;
    nghttp2_session_resume_data(st->hc->ng, st->id);
    return 0;
}

static int rp_complete(llhttp_t *p)
{
    h2_stream *st = p->data;

    if (!st->resp_begun)
        return 0; /* an informational answer: the final one follows */
    st->resp_done = 1;
    st->eof = 1;
    nghttp2_session_resume_data(st->hc->ng, st->id);
    return HPE_PAUSED; /* nothing after it is read */
}

static const llhttp_settings_t rp_settings = {
    .on_message_begin = rp_begin,
    .on_header_field = rp_piece,
    .on_header_field_complete = rp_piece_end,
    .on_header_value = rp_piece,
    .on_header_value_complete = rp_piece_end,
    .on_headers_complete = rp_headers,
    .on_body = rp_body,
    .on_message_complete = rp_complete,
};

/* Reads what the pipe holds into the stream, as far as the client's window lets the
 * answer out; at the pipe's end the answer must be whole. */
static void bridge_pump(h2_stream *st)
{
    struct evbuffer *in;

    if (!st->pipe)
        return;
    in = bufferevent_get_input(st->pipe);
    while (!st->resp_done && evbuffer_get_length(in) > 0) {
        size_t n = evbuffer_get_length(in);
        const char *b;
        llhttp_errno_t e;

        if (evbuffer_get_length(st->out) >= H2_PIPE_HIGH) {
            st->pipe_paused = 1; /* send_data_cb reads on when the client took some */
            bufferevent_disable(st->pipe, EV_READ);
            return;
        }
        if (n > H2_PIPE_STEP)
            n = H2_PIPE_STEP;
        if (!(b = (const char *)evbuffer_pullup(in, (ev_ssize_t)n))) {
            bridge_fail(st, "out of memory");
            return;
        }
        e = llhttp_execute(&st->rp, b, n);
        if (e == HPE_PAUSED && st->resp_done)
            break;
        if (e != HPE_OK) {
            bridge_fail(st, llhttp_errno_name(e));
            return;
        }
        evbuffer_drain(in, n);
    }
    if (!st->resp_done && st->pipe_eof && evbuffer_get_length(in) == 0) {
        (void)llhttp_finish(&st->rp); /* a body that ends with the connection ends here */
        if (!st->resp_done) {
            bridge_fail(st, "the answer ended early"); /* ended before the answer did */
            return;
        }
    }
    if (st->resp_done)
        bridge_close(st);
}

static void pipe_read_cb(struct bufferevent *bev, void *arg)
{
    h2_stream *st = arg;
    gw_h2_conn *hc = st->hc;

    bridge_pump(st);
    h2_flush(hc); /* (may free hc and st) */
}

static void pipe_write_cb(struct bufferevent *bev, void *arg)
{
    h2_stream *st = arg;
    gw_h2_conn *hc = st->hc;

    bridge_window(st);
    h2_flush(hc);
}

static void pipe_event_cb(struct bufferevent *bev, short what, void *arg)
{
    h2_stream *st = arg;
    gw_h2_conn *hc = st->hc;

    st->pipe_eof = 1; /* the preview side closed: what it sent is all there is */
    bufferevent_disable(bev, EV_WRITE);
    if (!st->pipe_paused)
        bridge_pump(st);
    h2_flush(hc);
}

/* The request's body, as it arrives (held window: bridge_window). */
static void bridge_up(h2_stream *st, const uint8_t *data, size_t len)
{
    struct evbuffer *out;

    if (!st->pipe || st->up_done) {
        nghttp2_session_consume_stream(st->hc->ng, st->id, len);
        return;
    }
    out = bufferevent_get_output(st->pipe);
    if ((st->up_chunked && evbuffer_add_printf(out, "%zx\r\n", len) < 0) ||
        evbuffer_add(out, data, len) < 0 || (st->up_chunked && evbuffer_add(out, "\r\n", 2) < 0)) {
        bridge_fail(st, "out of memory");
        return;
    }
    st->up_unconsumed += len;
    bridge_window(st);
}

static void bridge_up_end(h2_stream *st)
{
    if (st->up_done)
        return;
    st->up_done = 1;
    if (st->pipe && st->up_chunked)
        evbuffer_add(bufferevent_get_output(st->pipe), "0\r\n\r\n", 5);
}

/* The head is in and names a preview: the stream becomes one HTTP/1.1 request on a pipe
 * to the HTTP/1 leaf. 0, or -1 when it was refused here. */
static int bridge_start(h2_stream *st, int end_stream)
{
    gw_h2_conn *hc = st->hc;
    gw_http_server *s = hc->srv;
    gw_req *r = st->req;
    struct bufferevent *pair[2] = {NULL, NULL};
    gw_handover ho = {0};
    const char *name, *value;
    int has_cl = 0, cookies = 0;
    sf_buf h;

    if (!r->target.p || r->target.len == 0 || !r->method) {
        stream_refuse(st, 400, SF_MSG_H2_NO_METHOD_PATH_WHY);
        return -1;
    }
    if (s->nconns + s->nh2 + s->nsniff >= s->lim.max_conns) {
        stream_refuse(st, 503, SF_MSG_HTTP_BUSY);
        return -1;
    }
    sf_buf_init(&h, s->lim.max_header_bytes + 4096);
    if (sf_buf_appendf(&h, "%s %.*s HTTP/1.1\r\n", r->method, (int)r->target.len, r->target.p) < 0)
        goto toolarge;
    for (size_t i = 0; gw_req_header_at(r, i, &name, &value) == 0; i++) {
        if (!strcasecmp(name, "cookie")) { /* joined into one (RFC 9113 8.2.3) */
            if (sf_buf_appendf(&h, cookies++ ? "; %s" : "cookie: %s", value) < 0)
                goto toolarge;
        }
    }
    if (cookies && sf_buf_append(&h, "\r\n", 2) < 0)
        goto toolarge;
    for (size_t i = 0; gw_req_header_at(r, i, &name, &value) == 0; i++) {
        if (!strcasecmp(name, "cookie") || hop_hdr(name, strlen(name)))
            continue;
        if (!strcasecmp(name, "content-length"))
            has_cl = 1;
        if (sf_buf_appendf(&h, "%s: %s\r\n", name, value) < 0)
            goto toolarge;
    }
    st->up_chunked = !end_stream && !has_cl;
    if ((st->up_chunked && sf_buf_appendf(&h, "transfer-encoding: chunked\r\n") < 0) ||
        sf_buf_appendf(&h, "connection: close\r\n\r\n") < 0)
        goto toolarge;
    if (bufferevent_pair_new(s->base, BEV_OPT_DEFER_CALLBACKS, pair) < 0 ||
        !(ho.addr = gw_addr_get(s, hc->peer))) {
        if (pair[0]) {
            bufferevent_free(pair[0]);
            bufferevent_free(pair[1]);
        }
        sf_buf_fini(&h);
        stream_refuse(st, 503, SF_MSG_SERVER_NOMEM_WHY);
        return -1;
    }
    ho.bev = pair[1];
    ho.peer = hc->peer;
    ho.peer_port = hc->peer_port;
    ho.tls = hc->tls;
    ho.t0_ms = (uint64_t)sf_mono_ms();
    if (gw_conn_serve(s, GW_PROTO_H1, &ho) < 0) { /* (it freed pair[1] and the hold) */
        bufferevent_free(pair[0]);
        sf_buf_fini(&h);
        stream_refuse(st, 503, SF_MSG_SERVER_NOMEM_WHY);
        return -1;
    }
    st->pipe = pair[0];
    bufferevent_setcb(st->pipe, pipe_read_cb, pipe_write_cb, pipe_event_cb, st);
    bufferevent_setwatermark(st->pipe, EV_READ, 0, H2_PIPE_LOW);
    bufferevent_setwatermark(st->pipe, EV_WRITE, H2_PIPE_LOW, 0);
    bufferevent_enable(st->pipe, EV_READ | EV_WRITE);
    llhttp_init(&st->rp, HTTP_RESPONSE, &rp_settings);
    st->rp.data = st;
    st->resp_nobody = r->head;
    st->bridged = 1;
    st->dispatched = 1;
    st->checked = 1;
    if (bufferevent_write(st->pipe, h.p, h.len) < 0) {
        sf_buf_fini(&h);
        bridge_fail(st, "out of memory");
        return -1;
    }
    sf_buf_fini(&h);
    st->req = NULL;
    gw_req_free(r);
    stream_release(st);
    if (end_stream)
        bridge_up_end(st);
    return 0;

toolarge:
    sf_buf_fini(&h);
    stream_refuse(st, 431, SF_MSG_HTTP_HEADERS_TOO_LARGE_WHY);
    return -1;
}

/* ------------------------------------------------------------------ nghttp2 callbacks */

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f, void *user)
{
    gw_h2_conn *hc = user;
    h2_stream *st;

    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    if (hc->nstreams >= H2_MAX_STREAMS)
        return nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, f->hd.stream_id,
                                         NGHTTP2_REFUSED_STREAM) == 0
                   ? 0
                   : NGHTTP2_ERR_CALLBACK_FAILURE;
    if (!(st = stream_new(hc, f->hd.stream_id)))
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(ng, f->hd.stream_id, st);
    return 0;
}

static const char *method_name(const uint8_t *v, size_t n)
{
    static const char *const known[] = {"GET", "POST", "DELETE", "PUT", "HEAD", "OPTIONS",
                                        "PATCH", "TRACE", "CONNECT"};
    for (size_t i = 0; i < SF_ARRAY_LEN(known); i++)
        if (strlen(known[i]) == n && !memcmp(known[i], v, n))
            return known[i];
    return NULL;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user)
{
    h2_stream *st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
    gw_req *r;
    int rc = 0;

    if (!st || !(r = st->req) || st->err)
        return 0;
    st->hdr_bytes += namelen + valuelen + 4;
    stream_hold(st, namelen + valuelen);
    if (st->hdr_bytes > st->hc->srv->lim.max_header_bytes) {
        st->err = 431;
        st->err_msg = SF_MSG_HTTP_HEADERS_TOO_LARGE_WHY;
        return 0;
    }
    if (namelen > 0 && name[0] == ':') {
        if (namelen == 7 && !memcmp(name, ":method", 7)) {
            r->method = method_name(value, valuelen);
            r->head = r->method && !strcmp(r->method, "HEAD");
            if (!r->method) {
                st->err = 501;
                st->err_msg = "unknown request method";
            }
        } else if (namelen == 10 && !memcmp(name, ":authority", 10)) {
            rc = gw_req_header(r, "host") ? 0 /* RFC 9113 8.3.1: Host wins */
                                          : gw_req_add_header(r, "host", 4, (const char *)value,
                                                              valuelen);
        } else if (namelen == 5 && !memcmp(name, ":path", 5)) {
            if (r->target.len > 0 || valuelen > GW_REQ_MAX_TARGET)
                rc = -E2BIG;
            else
                rc = sf_buf_append(&r->target, value, valuelen);
        }
    } else {
        rc = gw_req_add_header(r, (const char *)name, namelen, (const char *)value, valuelen);
    }
    if (rc == -ENOMEM)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (rc < 0) {
        st->err = 431;
        st->err_msg = SF_MSG_HTTP_HEADERS_TOO_LARGE_WHY;
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *user)
{
    h2_stream *st = nghttp2_session_get_stream_user_data(ng, id);
    gw_http_server *s;
    int rc;

    if (st && st->bridged) { /* a preview stream: the connection's window at once */
        if (len > 0) {
            nghttp2_session_consume_connection(ng, len);
            bridge_up(st, data, len);
        }
        return 0;
    }
    if (!st || !st->req || st->err || st->responded) {
        body_consumed(user, id, len); /* dropped */
        return 0;
    }
    s = st->hc->srv;
    if (st->held + len > s->lim.max_buffered_bytes) {
        st->err = 413;
        st->err_msg = "request too large";
    } else if (st->hc->addr && __atomic_load_n(&st->hc->addr->buffered, __ATOMIC_RELAXED) + len >
                                   s->lim.max_buffered_per_addr) {
        st->err = 429;
        st->err_msg = "This client address holds too many request bytes; retry in a moment.";
    } else if (s->buffered + len > s->lim.max_buffered_bytes) {
        st->err = 503;
        st->err_msg = SF_MSG_HTTP_BUSY;
    } else if ((rc = sf_buf_append(&st->req->body, data, len)) < 0) {
        st->err = rc == -E2BIG ? 413 : 503;
        st->err_msg = rc == -E2BIG ? "request body too large" : "the server is out of memory";
    } else {
        stream_hold(st, len);
        if (st->checked)
            body_consumed(st->hc, id, len);
        else
            st->unconsumed += len; /* no window update until the head check passes */
        return 0;
    }
    body_consumed(st->hc, id, len);
    stream_release(st);
    stream_refuse(st, st->err, st->err_msg); /* at once: the rest of the body is dropped */
    return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f, void *user)
{
    h2_stream *st;

    if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA)
        return 0;
    if (!(st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id)))
        return 0;
    if (f->hd.type == NGHTTP2_HEADERS && st->req && !st->err && !st->bridged && !st->checked &&
        !st->responded && st->hc->srv->divert_match &&
        st->hc->srv->divert_match(st->req, st->hc->srv->divert_arg)) {
        if (bridge_start(st, (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) < 0)
            return 0;
    }
    if (st->bridged) {
        if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) {
            st->remote_done = 1;
            bridge_up_end(st);
        }
        return 0;
    }
    if (f->hd.type == NGHTTP2_HEADERS && st->req && !st->err) {
        const char *cl = gw_req_header(st->req, "content-length");
        int64_t v;

        if (cl && sf_parse_i64(cl, 0, INT64_MAX, &v) == 0 &&
            (uint64_t)v > st->hc->srv->lim.max_body) {
            stream_refuse(st, 413, "request body too large");
            return 0;
        }
    }
    if (f->hd.type == NGHTTP2_HEADERS && !st->checked && !st->responded) {
        gw_http_server *s = st->hc->srv;

        if (st->req && !st->err && s->head_check && !(f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
            /* a body follows: its key is checked first (the verdict may come at once) */
            if (!st->req->target.p || !st->req->method || gw_req_split_target(st->req) < 0) {
                stream_refuse(st, 400, SF_MSG_H2_NO_METHOD_PATH_WHY);
                return 0;
            }
            st->req->in_headcheck = 1;
            s->head_check(st->req, s->head_check_arg);
        } else {
            st->checked = 1;
        }
    }
    if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        st->remote_done = 1;
        stream_dispatch(st);
    }
    return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *f, void *user)
{
    h2_stream *st;

    /* A refused request whose body still streams in: end the stream once answered. */
    if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) &&
        (f->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
        (st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id)) && !st->remote_done &&
        !st->dispatched)
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_NO_ERROR);
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code, void *user)
{
    h2_stream *st = nghttp2_session_get_stream_user_data(ng, id);

    if (st) {
        if (st->req && st->dispatched)
            sf_debug("msg=\"HTTP/2 stream closed before the response\" peer=%s stream=%d",
                     st->hc->peer, (int)id);
        stream_free(st);
    }
    return 0;
}

/* Requests still arriving have total deadlines, as on HTTP/1: headers within
 * header_timeout_ms, the whole request within that plus body_timeout_ms plus the bytes
 * so far at body_min_rate; past it the stream gets 408 and is reset. */
static void h2_sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_h2_conn *hc = arg;
    const gw_http_limits *l = &hc->srv->lim;
    int64_t now = sf_mono_ms();
    int refused = 0;

    for (h2_stream *st = hc->streams; st; st = st->next) {
        int64_t due = st->t0_ms + l->header_timeout_ms + l->body_timeout_ms +
                      (int64_t)(st->held * 1000 / l->body_min_rate);
        if (st->dispatched || st->responded || !st->req || now <= due)
            continue;
        sf_info("msg=\"request too slow: 408\" peer=%s stream=%d proto=h2", hc->peer, (int)st->id);
        stream_refuse(st, 408, "request not received in time; send it at once");
        refused = 1;
    }
    if (refused)
        h2_flush(hc);
}

/* ------------------------------------------------------------------ connection */

static void h2_conn_free(gw_h2_conn *hc)
{
    gw_http_server *s;

    if (!hc)
        return;
    if (hc->in_recv) {
        hc->dead = 1;
        return;
    }
    s = hc->srv;
    hc->dead = 1;
    if (hc->sweep)
        event_free(hc->sweep);
    hc->sweep = NULL;
    while (hc->streams)
        stream_free(hc->streams);
    if (hc->ng)
        nghttp2_session_del(hc->ng);
    hc->ng = NULL;
    if (hc->bev)
        bufferevent_free(hc->bev);
    gw_addr_release(s, hc->addr);
    hc->addr = NULL;
    SF_LIST_UNLINK(s->h2conns, hc);
    s->nh2--;
    free(hc);
}

/* Produces frames into the output and, on a plain socket, writes them at once (one writev
 * per batch, no write event armed and disarmed per answer); what the socket does not take
 * now, and everything on TLS, goes out with the bufferevent's write event. */
static void h2_flush(gw_h2_conn *hc)
{
    struct evbuffer *out = bufferevent_get_output(hc->bev);
    int full;

    do {
        full = 0;
        while (!(full = evbuffer_get_length(out) >= H2_OUT_HIGH_WM)) {
            const uint8_t *data;
            ssize_t n = nghttp2_session_mem_send(hc->ng, &data);

            if (n < 0) {
                h2_conn_free(hc);
                return;
            }
            if (n == 0)
                break;
            if (evbuffer_add(out, data, (size_t)n) < 0) {
                h2_conn_free(hc);
                return;
            }
        }
        if (!hc->raw || evbuffer_get_length(out) == 0)
            break;
        /* a socket bufferevent keeps its output's front frozen outside its own writes */
        evbuffer_unfreeze(out, 1);
        (void)evbuffer_write(out, bufferevent_getfd(hc->bev)); /* errors: the write event */
        evbuffer_freeze(out, 1);
    } while (full && evbuffer_get_length(out) == 0);
    if (hc->raw && evbuffer_get_length(out) > 0)
        bufferevent_enable(hc->bev, EV_WRITE);
    if (evbuffer_get_length(out) == 0 && !nghttp2_session_want_read(hc->ng) &&
        !nghttp2_session_want_write(hc->ng))
        h2_conn_free(hc);
}

static void h2_read_cb(struct bufferevent *bev, void *arg)
{
    gw_h2_conn *hc = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n;

    while ((n = evbuffer_get_length(in)) > 0 && !hc->dead) {
        struct evbuffer_iovec v;
        ssize_t used;

        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        hc->in_recv = 1;
        used = nghttp2_session_mem_recv(hc->ng, v.iov_base, v.iov_len);
        hc->in_recv = 0;
        if (used < 0) {
            sf_debug("msg=\"HTTP/2 protocol error\" peer=%s err=\"%s\"", hc->peer,
                     nghttp2_strerror((int)used));
            evbuffer_drain(in, n);
            hc->dead = 1;
            break;
        }
        evbuffer_drain(in, (size_t)used);
    }
    if (hc->dead) {
        hc->dead = 0;
        /* let nghttp2 say goodbye (GOAWAY) if it wants to, then close */
        h2_conn_free(hc);
        return;
    }
    h2_flush(hc);
}

static void h2_write_cb(struct bufferevent *bev, void *arg)
{
    gw_h2_conn *hc = arg;

    if (hc->raw && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        bufferevent_disable(bev, EV_WRITE); /* drained: h2_flush writes at once again */
    h2_flush(hc);
}

static void h2_event_cb(struct bufferevent *bev, short what, void *arg)
{
    gw_h2_conn *hc = arg;

    if ((what & BEV_EVENT_TIMEOUT) && (what & BEV_EVENT_READING) && hc->nstreams > 0) {
        bufferevent_enable(bev, EV_READ); /* idle only counts without open streams */
        return;
    }
    h2_conn_free(hc);
}

/* base64url (RFC 4648 §5, no padding) of HTTP2-Settings. -EINVAL on a bad character. */
static int b64url_decode(const char *in, uint8_t *out, size_t cap, size_t *outlen)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;

    for (; *in && *in != '='; in++) {
        int v;
        char ch = *in;
        if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
        else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
        else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
        else if (ch == '-' || ch == '+') v = 62;
        else if (ch == '_' || ch == '/') v = 63;
        else return -EINVAL;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= cap)
                return -EINVAL;
            out[n++] = (uint8_t)(acc >> bits);
        }
    }
    *outlen = n;
    return 0;
}

int gw_h2_serve(gw_http_server *s, const gw_handover *h)
{
    struct bufferevent *bev = h->bev;
    const char *peer = h->peer, *settings_b64 = h->settings;
    int peer_port = h->peer_port, tls = h->tls;
    gw_addr *addr = h->addr;
    gw_req *upgrade_req = h->upgrade;
    nghttp2_session_callbacks *cbs = NULL;
    nghttp2_option *opt = NULL;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, H2_MAX_STREAMS},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 20},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)s->lim.max_header_bytes},
    };
    gw_h2_conn *hc = calloc(1, sizeof(*hc));
    struct timeval idle = {(time_t)s->lim.idle_timeout_s, 0};

    if (!hc || nghttp2_session_callbacks_new(&cbs) != 0 || nghttp2_option_new(&opt) != 0)
        goto fail;
    /* window updates follow what the server accepted (body_consumed), so that a request's
     * body waits for its head check */
    nghttp2_option_set_no_auto_window_update(opt, 1);
    hc->srv = s;
    hc->bev = bev;
    hc->addr = addr;
    addr = NULL; /* released with hc from here */
    hc->tls = tls;
    hc->peer_port = peer_port;
    snprintf(hc->peer, sizeof(hc->peer), "%s", peer ? peer : "unknown");
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_send_data_callback(cbs, send_data_cb);
    if (nghttp2_session_server_new2(&hc->ng, cbs, hc, opt) != 0)
        goto fail;
    nghttp2_session_callbacks_del(cbs);
    cbs = NULL;
    if (opt)
        nghttp2_option_del(opt);
    opt = NULL;
    SF_LIST_PUSH(s->h2conns, hc);
    s->nh2++;
    if (nghttp2_submit_settings(hc->ng, NGHTTP2_FLAG_NONE, iv, SF_ARRAY_LEN(iv)) != 0) {
        h2_conn_free(hc);
        if (upgrade_req)
            gw_req_free(upgrade_req);
        return -ENOMEM;
    }
    if (upgrade_req) { /* the HTTP/1.1 request becomes stream 1, half-closed (remote) */
        uint8_t payload[192];
        size_t plen = 0;
        h2_stream *st = calloc(1, sizeof(*st));

        if (!st || !(st->out = evbuffer_new()) ||
            b64url_decode(settings_b64, payload, sizeof(payload), &plen) < 0 ||
            nghttp2_session_upgrade2(hc->ng, payload, plen, upgrade_req->head, st) != 0) {
            if (st && st->out)
                evbuffer_free(st->out);
            free(st);
            gw_req_free(upgrade_req);
            h2_conn_free(hc);
            return -EINVAL;
        }
        st->hc = hc;
        st->id = 1;
        st->req = upgrade_req;
        st->remote_done = 1;
        st->checked = 1; /* no body */
        upgrade_req->tp = &h2_transport;
        upgrade_req->srv = s;
        upgrade_req->conn = st;
        upgrade_req->proto = "h2c";
        upgrade_req->peer = hc->peer;
        SF_LIST_PUSH(hc->streams, st);
        hc->nstreams++;
        st->dispatched = 1;
        upgrade_req->dispatched = 1;
    }
    bufferevent_setcb(bev, h2_read_cb, h2_write_cb, h2_event_cb, hc);
    bufferevent_set_timeouts(bev, &idle, &idle);
    bufferevent_set_max_single_read(bev, H2_MAX_IO);
    bufferevent_set_max_single_write(bev, H2_MAX_IO);
    if ((hc->sweep = event_new(s->base, -1, EV_PERSIST, h2_sweep_cb, hc))) {
        struct timeval half = {0, 250000};
        event_add(hc->sweep, &half);
    }
    hc->raw = !tls && !bufferevent_get_underlying(bev) && bufferevent_getfd(bev) >= 0;
    if (hc->raw) /* armed only when output did not go out at once */
        bufferevent_disable(bev, EV_WRITE);
    bufferevent_enable(bev, hc->raw ? EV_READ : EV_READ | EV_WRITE);
    if (upgrade_req) {
        h2_stream *st = hc->streams;
        hc->in_recv = 1; /* the handler may answer at once: send after it */
        s->handler(st->req, s->arg);
        hc->in_recv = 0;
        if (hc->dead) {
            hc->dead = 0;
            h2_conn_free(hc);
            return 0;
        }
    }
    if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
        h2_read_cb(bev, hc); /* the preface (and more) came with the connection; flushes */
    else
        h2_flush(hc);
    return 0;

fail:
    if (cbs)
        nghttp2_session_callbacks_del(cbs);
    if (opt)
        nghttp2_option_del(opt);
    if (hc && hc->addr)
        gw_addr_release(s, hc->addr);
    else if (addr)
        gw_addr_release(s, addr);
    free(hc);
    bufferevent_free(bev);
    if (upgrade_req)
        gw_req_free(upgrade_req);
    return -ENOMEM;
}

void gw_h2_free_all(gw_http_server *s)
{
    while (s->h2conns)
        h2_conn_free(s->h2conns);
}
