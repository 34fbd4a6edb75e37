/* server.h: the gateway's HTTP server on libevent bufferevents: HTTP/1.1 on llhttp (strict:
 * no obs-fold, no bare LF, no whitespace before a colon, no Content-Length beside
 * Transfer-Encoding), and, when enabled, HTTP/2 on nghttp2 (gw_http_server_enable_h2:
 * prior knowledge and `Upgrade: h2c`) and TLS with ALPN h2 / http/1.1
 * (gw_http_server_set_tls), all on the same port: the first bytes of a connection tell
 * which. Requests of every transport are the same gw_req (req.h).
 *
 * One event_base, no threads. Each connection handles one request at a time, in order:
 * the handler is called once per complete request (headers + full body); pipelined
 * requests wait in the input buffer until the previous response has been written.
 * The handler may answer at once or later from any other callback on the same event
 * base (gw_req_respond); if the client goes away first, the request's abort callback
 * runs and the request is freed.
 *
 * Framing the server owns: every response carries Content-Length (except 204/304),
 * `Connection: close` when the connection ends after it, Date, and
 * `Cache-Control: no-store` unless the handler sets its own Cache-Control.
 *
 * Errors the server answers by itself (JSON body {"error":"..."}, then it closes):
 *   400 malformed request, 413 body over max_body (from Content-Length before reading the
 *   body, or while a chunked body streams in; `Expect: 100-continue` gets the 413 at
 *   once), 414 request target over 65535 bytes, 417 unknown Expect, 431 headers over
 *   max_header_bytes, 503 too many connections or the buffer budget used up (below), 505 HTTP
 *   version other than 1.x. After such an answer the server stops reading requests,
 *   half-closes and discards what the client still sends for a few seconds, so that the
 *   client reads the answer instead of a reset.
 *
 * Hardening (before any authentication): a connection's first request line and headers must
 * arrive within header_timeout_ms in total (not an idle timer that each byte resets), and
 * a body within body_timeout_ms plus its size at body_min_rate, else 408; one client
 * address may hold max_conns_per_addr connections and max_buffered_per_addr request
 * bytes, else 429 with Retry-After; with a head check (gw_http_server_set_head_check) the
 * key is checked before any body byte is accepted.
 *
 * Buffer budget (max_buffered_bytes) caps the request bytes all connections together
 * hold, counted as received on the wire (head + body, chunk framing included): unparsed
 * input (pipelined requests too), the request being read, and requests the handler has
 * not answered yet. Parsed bytes belong to their request and are released when it is
 * answered, refused or aborted; discarded input is released at once. A request with a
 * body that takes the total over the budget gets 503 with `Retry-After: 1` (then the
 * close above), checked as its bytes arrive: nothing is reserved for bytes that have not
 * come, so declared sizes cannot use up the budget.
 * A request that could not fit even on an idle server gets 413 instead. Requests without
 * a body are never refused by the budget: their head is bounded by max_header_bytes.
 * Input already read is counted before it is checked, so the total can exceed the budget
 * by what sits unparsed in input buffers (at most 256 KiB per connection).
 */
#ifndef GW_HTTP_SERVER_H
#define GW_HTTP_SERVER_H

#include "req.h"

#include <stddef.h>

struct event_base;
struct bufferevent;

#define GW_HTTP_DEFAULT_MAX_BODY         (16u << 20) /* 16 MiB: the MCP request body limit */
#define GW_HTTP_DEFAULT_MAX_HEADER_BYTES (64u << 10) /* request line target + header fields */
#define GW_HTTP_DEFAULT_MAX_CONNS        1024u
#define GW_HTTP_DEFAULT_IDLE_TIMEOUT_S   60u
#define GW_HTTP_DEFAULT_MAX_BUFFERED     ((size_t)256 << 20) /* 256 MiB, all connections */
#define GW_HTTP_DEFAULT_MAX_CONNS_PER_ADDR 256u
#define GW_HTTP_DEFAULT_HEADER_TIMEOUT_MS 10000u
#define GW_HTTP_DEFAULT_BODY_TIMEOUT_MS   10000u
#define GW_HTTP_DEFAULT_BODY_MIN_RATE     (1u << 20) /* bytes/s a body must at least arrive at */

/* A zero field means "use the default above". */
typedef struct gw_http_limits {
    size_t max_body;         /* request body bytes (after chunked decoding) */
    size_t max_header_bytes; /* bytes of request target + header names + values (+4 per header) */
    unsigned max_conns;      /* open HTTP/1 connections; more are answered 503 and closed */
    unsigned idle_timeout_s; /* no bytes from the client while we wait for a request, or no
                                progress writing a response: the connection is closed */
    size_t max_buffered_bytes; /* request bytes all connections together may hold (see the
                                  budget above); the default is raised when one request of
                                  max_body + max_header_bytes (+ 256 KiB) is larger */
    unsigned max_conns_per_addr;  /* open connections from one client address; more: 429 */
    size_t max_buffered_per_addr; /* request bytes one client address may hold; more: 429
                                     (default: a quarter of max_buffered_bytes, at least one
                                     largest request) */
    unsigned header_timeout_ms;   /* total time for a request line and headers: then 408 */
    unsigned body_timeout_ms;     /* total time for a body: this plus its size at */
    size_t body_min_rate;         /* body_min_rate bytes/s (chunked: max_body); then 408 */
    unsigned reuse_port;          /* 1: SO_REUSEPORT, so several servers (threads) share it */
} gw_http_limits;

/* Per-client-address counts (connections, buffered bytes) that several servers (one per
 * thread) share, so the per-address caps hold for the whole process. Thread-safe. */
typedef struct gw_addr_table gw_addr_table;
gw_addr_table *gw_addr_table_new(void);
void gw_addr_table_free(gw_addr_table *t); /* after every server that shares it */

typedef struct gw_http_server gw_http_server;

/* Hook for HTTP/2 with prior knowledge (h2c): when set, a new connection whose first 24
 * bytes are the HTTP/2 client preface "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" is handed over
 * before any HTTP/1 parsing. The callee gets the bufferevent with nothing consumed (the
 * preface is still in its input buffer), no callbacks and no timeouts set, and owns it
 * from then on when it returns 0. When it returns < 0 (or no hook is set), the HTTP/1
 * server answers 505 and closes. `peer` is the client address as for gw_req_peer().
 * gw_http_server_enable_h2() installs the built-in HTTP/2 server as this hook. */
typedef int (*gw_http_takeover_fn)(struct bufferevent *bev, const char *peer, void *arg);

/* Binds addr:port. addr: a numeric IPv4/IPv6 address, or NULL for all addresses ("::"
 * dual-stack, else "0.0.0.0"), or a host name such as "localhost" (resolved here with
 * getaddrinfo, which may block: call this at start-up, not from a callback); the first
 * address that binds is used. port 0 = any free port (see gw_http_server_port());
 * port -1 = no listener at all: connections only come in through gw_http_server_adopt().
 * lim NULL = defaults. Returns NULL with errno set on failure: EINVAL (arguments),
 * EADDRNOTAVAIL (address unknown), the bind error (EADDRINUSE, EACCES...), ENOMEM. */
gw_http_server *gw_http_server_new(struct event_base *base, const char *addr, int port,
                                   const gw_http_limits *lim, gw_http_handler handler,
                                   void *arg);
/* Closes the listener and every connection. Pending requests get their abort callback
 * first. Accepts NULL. Must not be called from inside a handler or abort callback. */
void gw_http_server_free(gw_http_server *srv);
/* Closes the listening socket (a draining gateway); open connections are served on. */
void gw_http_server_stop_accepting(gw_http_server *srv);
/* The bound port (useful with port 0), or -1 when there is no listener. */
int gw_http_server_port(const gw_http_server *srv);
/* Number of open HTTP/1 connections (taken-over ones are not counted). */
unsigned gw_http_server_conns(const gw_http_server *srv);
/* Request bytes counted against max_buffered_bytes right now; 0 whenever no connection
 * holds input or an unanswered request (always 0 with no connections). */
size_t gw_http_server_buffered(const gw_http_server *srv);
void gw_http_server_set_takeover(gw_http_server *srv, gw_http_takeover_fn fn, void *arg);
/* Counts client addresses in t (shared with other servers) instead of its own table; call
 * before the first connection. */
void gw_http_server_share_addrs(gw_http_server *srv, gw_addr_table *t);
/* Serves HTTP/2: connections starting with the client preface, HTTP/1.1 requests with
 * `Upgrade: h2c` + `HTTP2-Settings` and no body (answered 101, the request becomes
 * stream 1), and TLS connections whose ALPN chose h2. Other Upgrade requests are served
 * as plain HTTP/1.1. */
void gw_http_server_enable_h2(gw_http_server *srv);
/* Offers TLS on the same port (a connection whose first byte is a TLS handshake record)
 * with the PEM certificate chain and key given; ALPN offers h2 (when enabled) and
 * http/1.1. 0, or -EINVAL with why. */
int gw_http_server_set_tls(gw_http_server *srv, const char *cert_file, const char *key_file,
                           char *why, size_t whylen);
/* Open HTTP/2 connections. */
unsigned gw_http_server_h2_conns(const gw_http_server *srv);
/* Checks a request with a body from its head alone, before any of the body is accepted
 * (budget, 100 Continue): fn must call gw_req_head_verdict() once, now or later; until
 * then no body byte is read. A client that leaves first runs the request's abort callback
 * (set one to cancel a pending check). On HTTP/2 the stream's window updates wait for
 * the verdict (at most the 64 KiB connection window arrives before it). */
typedef void (*gw_http_head_check_fn)(gw_req *req, void *arg);
void gw_http_server_set_head_check(gw_http_server *srv, gw_http_head_check_fn fn, void *arg);
/* Builds the WWW-Authenticate value of a 401 the server sends by itself (a head check's
 * verdict), from the request and the verdict's message. Without one: a bare Bearer. */
typedef void (*gw_http_challenge_fn)(gw_req *req, const char *msg, char *out, size_t n, void *arg);
void gw_http_server_set_challenge(gw_http_server *srv, gw_http_challenge_fn fn, void *arg);

/* Diverting HTTP/1 connections (preview URLs, gateway/preview.c): match() sees every
 * HTTP/1 request head as soon as its headers are in (before the head check, the body and
 * any route), and every HTTP/2 stream's head when its HEADERS end: a matching stream is
 * relayed as one HTTP/1.1 request (Connection: close) through a bufferevent pair to the
 * HTTP/1 leaf, which diverts that (http2.c), so take() only ever gets HTTP/1 connections
 * (a pair end, whose fd is -1, for a stream). When match returns 1 the connection leaves
 * the HTTP server: take() gets the
 * bufferevent (no callbacks, no timeouts; its input holds what followed the head: the
 * body, pipelined requests), the head (req, readable only during the call; it is freed
 * after), and owns the bufferevent from then on. `hold` is the connection's hold on its
 * client address (max_conns_per_addr): pass it to gw_http_hold_release() when done. Both
 * run on the server's event base. */
typedef struct gw_http_divert {
    struct bufferevent *bev;
    gw_req *req;
    const char *peer;
    int peer_port;
    int tls;
    void *hold;
} gw_http_divert;
typedef int (*gw_http_divert_match_fn)(gw_req *req, void *arg);
typedef void (*gw_http_divert_fn)(const gw_http_divert *d, void *arg);
void gw_http_server_set_divert(gw_http_server *srv, gw_http_divert_match_fn match,
                               gw_http_divert_fn take, void *arg);
/* Releases a diverted connection's hold on its client address. Accepts NULL. */
void gw_http_hold_release(gw_http_server *srv, void *hold);

/* Counters of what the server refused by itself, for metrics. */
typedef struct gw_http_stats {
    unsigned long long refused[6]; /* 400, 408, 413, 429, 431, 503 (GW_REFUSE_*) */
} gw_http_stats;
enum { GW_REFUSE_400, GW_REFUSE_408, GW_REFUSE_413, GW_REFUSE_429, GW_REFUSE_431, GW_REFUSE_503 };
const gw_http_stats *gw_http_server_stats(const gw_http_server *srv);
/* Called once per request when its answer is queued (status) or it was aborted (status 0
 * = the client left), for access logs and metrics. */
typedef void (*gw_http_observer_fn)(gw_req *req, int status, void *arg);
void gw_http_server_set_observer(gw_http_server *srv, gw_http_observer_fn fn, void *arg);
/* Serves an already connected bufferevent (a socket bufferevent, or a filter such as
 * TLS after ALPN chose http/1.1); the server owns and frees it. peer may be NULL.
 * 0, or -ENOMEM / -EMFILE (over max_conns: bev is freed). */
int gw_http_server_adopt(gw_http_server *srv, struct bufferevent *bev, const char *peer);

#endif
