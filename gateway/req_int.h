/* req_int.h: what the transports (http1.c, http2.c) share about a request: its storage,
 * the operations each transport implements, and the server-wide state they both use.
 * Not for handlers: they see req.h only. */
#ifndef GW_REQ_INT_H
#define GW_REQ_INT_H

#include "http1.h"
#include "req.h"
#include "sf_buf.h"
#include "sf_util.h"

#include <stdint.h>
#include <time.h>

struct event_base;
struct evbuffer;
struct evconnlistener;
struct event;
struct bufferevent;

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

/* One client address: its open connections and buffered request bytes (per server). */
typedef struct gw_addr {
    unsigned conns;
    size_t buffered;
    char key[48];
} gw_addr;

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

/* The server, shared by the transports (http1.c owns the listener and HTTP/1
 * connections, http2.c its HTTP/2 connections, tls.c the TLS set-up). */
typedef struct gw_conn gw_conn;
typedef struct gw_h2_conn gw_h2_conn;
typedef struct ssl_ctx_st SSL_CTX;
typedef struct tls_pending tls_pending;

struct gw_http_server {
    struct event_base *base;
    struct evconnlistener *lis;
    struct event *accept_retry;
    gw_http_limits lim;
    gw_http_handler handler;
    void *arg;
    gw_http_takeover_fn takeover;
    void *takeover_arg;
    int h2;               /* HTTP/2 served: prior knowledge, Upgrade: h2c, ALPN h2 */
    SSL_CTX *tls;         /* TLS offered on the same port (NULL: none) */
    tls_pending *tls_pending; /* handshakes in flight */
    gw_conn *conns;
    unsigned nconns;
    gw_h2_conn *h2conns;
    unsigned nh2;
    struct gw_refused *refused; /* refused at accept, lingering (http1.c) */
    unsigned nrefused;
    size_t buffered;      /* request bytes held by all connections */
    gw_addr_table *addrs; /* client address -> gw_addr (maybe shared with other servers) */
    gw_addr_table *own_addrs;
    gw_http_head_check_fn head_check;
    void *head_check_arg;
    gw_http_challenge_fn challenge;
    void *challenge_arg;
    gw_http_observer_fn observer;
    void *observer_arg;
    gw_http_stats stats;
    int port;
    time_t date_sec;
    char date[40];
    gw_req *req_pool;     /* recycled requests (req.c) */
    sf_buf head;          /* HTTP/1 response heads are built here (http1.c) */
    unsigned nreq_pool;
};

/* http2.c: serves HTTP/2 on bev (the client preface not yet read; for an upgrade, req
 * is the HTTP/1.1 request that becomes stream 1 and settings its HTTP2-Settings). Owns
 * bev from the call on. 0 or -ENOMEM (bev freed). */
int gw_h2_serve(gw_http_server *s, struct bufferevent *bev, const char *peer, int peer_port,
                int tls, gw_addr *addr, gw_req *upgrade_req, const char *settings_b64);
void gw_h2_free_all(gw_http_server *s);
/* tls.c: the connection's first byte was a TLS handshake: terminate TLS on it and serve
 * what ALPN chose. Owns bev from the call on. */
void gw_tls_accept(gw_http_server *s, struct bufferevent *bev, const char *peer, int peer_port,
                   gw_addr *addr);
int gw_tls_ctx_new(gw_http_server *s, const char *cert, const char *key, char *why, size_t n);
void gw_tls_ctx_free(gw_http_server *s);
/* http1.c: serves HTTP/1 on an already connected bev (after TLS chose http/1.1). */
int gw_http1_start(gw_http_server *s, struct bufferevent *bev, const char *peer, int peer_port,
                   int tls, gw_addr *addr);
/* Client addresses (http1.c): take one connection's hold on an address (created when
 * new) and release it (freed when no connection is left). NULL on ENOMEM. */
gw_addr *gw_addr_get(gw_http_server *s, const char *peer);
void gw_addr_release(gw_http_server *s, gw_addr *a);
/* Moves n request bytes in (+) or out (-) of the server's and the address's counts. */
void gw_budget_add(gw_http_server *s, gw_addr *a, size_t n);
void gw_budget_sub(gw_http_server *s, gw_addr *a, size_t n);
/* Counts a request the server refused by itself. */
void gw_http_count_refusal(gw_http_server *s, int status);
/* Called by req.c when a request is answered (whole or end of stream) or aborted. */
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
