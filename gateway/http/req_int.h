/* req_int.h: what the protocol leaves (http1.c, http2.c) share about a request: its
 * storage, the operations each leaf implements, and req.c's helpers for building answers.
 * Not for handlers: they see req.h only. The server's types are in server-t.h. */
#ifndef GW_REQ_INT_H
#define GW_REQ_INT_H

#include "req.h"
#include "server-t.h"
#include "sf_buf.h"
#include "sf_util.h"

#include <stdint.h>
#include <time.h>

struct evbuffer;

#define GW_REQ_MAX_TARGET  65535u    /* request target bytes */
#define GW_REQ_MAX_HEADERS 256u      /* header fields per request */
#define GW_STREAM_MAX_UNSENT (1u << 20) /* streamed bytes waiting for a slow client */

typedef struct gw_hdr {
    size_t name_off, val_off, val_len;
} gw_hdr;

typedef struct gw_req_transport {
    void (*respond)(gw_req *r, int status, const char *ctype, const char *const *headers,
                    const char *body, size_t len);
    int (*stream_begin)(gw_req *r, int status, const char *ctype, const char *const *headers);
    int (*stream_write)(gw_req *r, const char *data, size_t len);
    void (*stream_end)(gw_req *r);
    void (*head_verdict)(gw_req *r, int status, const char *msg); /* NULL: no head checks */
} gw_req_transport;

enum { GW_H_NONE, GW_H_FIELD, GW_H_VALUE };

struct gw_req {
    const gw_req_transport *tp;
    struct gw_http_server *srv;
    void *conn;           /* the transport's connection (HTTP/1) or stream (HTTP/2) */
    const char *method;   /* static storage */
    const char *proto;    /* "http/1.1", "h2c", ... (static) */
    int minor;
    unsigned head : 1, dispatched : 1, aborting : 1, streaming : 1, in_headcheck : 1;
    int hstate;           /* GW_H_*: which header piece came last (HTTP/1 only) */
    sf_buf target;
    sf_buf pq;            /* path '\0' query: what path and query point into */
    char *path, *query;
    sf_buf hdrs;          /* name '\0' value '\0' ... */
    gw_hdr *hv;
    size_t nh, caph;
    sf_buf body;
    void *data;
    gw_req_abort_cb abort_cb;
    void *abort_arg;
    const char *peer;     /* the connection's, valid as long as the request */
    int peer_port;
    char id[32];
    char job[SF_ID_MAX];  /* the job it started, for the access log ("" none) */
    uint64_t t0_us;       /* monotonic: when it was created */
    int status;           /* the status answered (streams: when they began) */
    const gw_piece *pieces; /* gw_req_respond_pieces: the body, while respond runs */
    size_t npieces;
    gw_req *pool_next;    /* in its server's pool of recycled requests */
};

/* A request of srv (from its pool of recycled requests; srv may be NULL) with limits for
 * its header block and body. NULL on ENOMEM. gw_req_free puts it back in the pool (or
 * frees it); gw_req_pool_free frees the pool (with the server). */
gw_req *gw_req_new(const gw_req_transport *tp, gw_http_server *srv, void *conn,
                   size_t max_header_bytes, size_t max_body);
void gw_req_free(gw_req *r);
void gw_req_pool_free(gw_http_server *s);
/* HTTP/1 header pieces as the parser hands them over: 0, -E2BIG (too many or too large),
 * -EINVAL (a value with no name), -ENOMEM. finish ends the header being collected. */
int gw_req_hdr_field(gw_req *r, const char *at, size_t len);
int gw_req_hdr_value(gw_req *r, const char *at, size_t len);
int gw_req_hdr_finish(gw_req *r);
/* One whole header (HTTP/2). 0, -E2BIG, -ENOMEM. */
int gw_req_add_header(gw_req *r, const char *name, size_t nlen, const char *value, size_t vlen);
/* Splits r->target into path and query. 0, -EINVAL (not origin-, absolute- or asterisk
 * form), -ENOMEM. */
int gw_req_split_target(gw_req *r);
/* The client went away: runs the abort callback (if the request was dispatched). The
 * transport frees the request afterwards. */
void gw_req_abort(gw_req *r);

/* Called by req.c when a request is answered (whole or end of stream) or aborted: the
 * server's observer (access log, metrics). */
void gw_http_observe(gw_req *r, int status);

/* Appends a response body to out: body, or else req's pieces (referenced when asked). */
int gw_body_add(struct evbuffer *out, const gw_req *req, const char *body, size_t len);

/* Response-building helpers shared by the transports. */
int gw_http_is_token(const char *s);
int gw_http_is_field_value(const char *s);
int gw_http_has_token(const char *list, const char *tok);
/* True for the headers a handler may not set (framing, hop-by-hop). */
int gw_http_is_framing(const char *name);
const char *gw_http_reason(int status);
/* v in decimal without printf: in out (>= 21 bytes) at the returned position (_at), or
 * from out[0]. */
const char *gw_fmt_uint_at(char *out, size_t v);
void gw_fmt_uint(char *out, size_t v);
/* The IMF-fixdate for now, cached per second in buf (>= 40 bytes). */
const char *gw_http_date(time_t *cache_sec, char *buf);

#endif
