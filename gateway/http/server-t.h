/* server-t.h: the HTTP server's types, shared by server.c, the connection layer (conn.c),
 * the protocol leaves (http1.c, http2.c, tls.c) and req.c. Types only: no function is
 * declared here, so every header of the folder can include it without a cycle.
 *
 * Layers, top to bottom (each calls only the ones below it; tests/layering checks it):
 *   server.c            listener, accept, refusals at accept, sniffing, dispatch
 *   http1.c http2.c tls.c   the protocol leaves; never call each other
 *   conn.c              per-address table, byte budget, refusal counts, hand-over
 *   req.c               the transport-agnostic request
 * A leaf that hands its connection to another protocol (Upgrade: h2c, ALPN) calls
 * gw_conn_serve() (conn.h), which goes through the server's table of leaves (serve[]),
 * filled by server.c: a leaf never names another leaf. */
#ifndef GW_SERVER_T_H
#define GW_SERVER_T_H

#include "server.h"
#include "sf_buf.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct event_base;
struct evconnlistener;
struct event;
struct bufferevent;

/* One client address: its open connections and buffered request bytes (counted for the
 * whole process when the table is shared). */
typedef struct gw_addr {
    unsigned conns;
    size_t buffered;
    char key[48];
} gw_addr;

/* Who may serve a connection (gw_conn_serve). GW_PROTO_SNIFF: server.c reads the first
 * bytes and picks one of the others (a TLS record, the HTTP/2 preface, else HTTP/1). */
enum { GW_PROTO_SNIFF, GW_PROTO_H1, GW_PROTO_H2, GW_PROTO_TLS, GW_PROTO_N };

/* A connection handed to a protocol: the callee owns bev (and the hold on addr) from the
 * call on, also when it fails (it frees them). */
typedef struct gw_handover {
    struct bufferevent *bev;
    const char *peer;         /* client address as for gw_req_peer(); copied by the callee */
    int peer_port;
    int tls;                  /* bev is a TLS filter */
    gw_addr *addr;            /* the address's counts, one connection held */
    uint64_t t0_ms;           /* (monotonic) accepted: its first request's head is due
                                 header_timeout_ms after this */
    struct gw_req *upgrade;   /* h2c: the HTTP/1.1 request that becomes stream 1 */
    const char *settings;     /* h2c: its HTTP2-Settings */
    int refuse;               /* HTTP/1: answer this status at once, then close (505) */
    const char *refuse_msg;
} gw_handover;
/* 0, or a negative errno (the connection is gone). */
typedef int (*gw_serve_fn)(struct gw_http_server *s, const gw_handover *h);

typedef struct gw_conn gw_conn;       /* http1.c */
typedef struct gw_h2_conn gw_h2_conn; /* http2.c */
typedef struct gw_sniff gw_sniff;     /* server.c */
typedef struct gw_refused gw_refused; /* server.c */
typedef struct ssl_ctx_st SSL_CTX;
typedef struct tls_pending tls_pending; /* tls.c */

struct gw_http_server {
    struct event_base *base;
    struct evconnlistener *lis;
    struct event *accept_retry;
    gw_http_limits lim;
    gw_http_handler handler;
    void *arg;
    gw_serve_fn serve[GW_PROTO_N]; /* the leaves (server.c fills it) */
    gw_http_takeover_fn takeover;
    void *takeover_arg;
    int h2;               /* HTTP/2 served: prior knowledge, Upgrade: h2c, ALPN h2 */
    SSL_CTX *tls;         /* TLS offered on the same port (NULL: none) */
    tls_pending *tls_pending; /* handshakes in flight */
    gw_sniff *sniffing;   /* connections whose first bytes have not come yet (server.c) */
    unsigned nsniff;
    gw_conn *conns;
    unsigned nconns;
    gw_h2_conn *h2conns;
    unsigned nh2;
    gw_refused *refused;  /* refused at accept, lingering (server.c) */
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
    gw_http_divert_match_fn divert_match; /* preview connections (server.h) */
    gw_http_divert_fn divert_take;
    void *divert_arg;
    gw_http_stats stats;
    int port;
    time_t date_sec;
    char date[40];
    struct gw_req *req_pool; /* recycled requests (req.c) */
    sf_buf head;          /* HTTP/1 response heads are built here (http1.c) */
    unsigned nreq_pool;
};

/* Pipelined input an HTTP/1 connection buffers while a request runs; the budget's
 * defaults leave room for it. */
#define GW_HTTP_INPUT_HIGH_WM (256u << 10)
/* The largest single read or write (libevent's default is 16 KiB). */
#define GW_HTTP_MAX_IO        (256u << 10)
/* Lingering close (HTTP/1 after a refusal, and connections refused at accept). */
#define GW_HTTP_LINGER_IDLE_S 2 /* gap between client bytes */
#define GW_HTTP_LINGER_MAX_S  5 /* total */

#endif
