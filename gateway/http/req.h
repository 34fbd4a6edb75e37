/* gw_req: one HTTP request, the same object whatever carried it (HTTP/1.1, h2c, h2 over
 * TLS). A handler reads it with the accessors below and answers it once, either whole
 * (gw_req_respond) or as a stream (gw_req_stream_begin / _write / _end, e.g. SSE), from
 * the callback that got it or later from any other callback on the same event base. If
 * the client goes away first (connection closed, stream reset), the request's abort
 * callback runs and the request is freed; the handler never learns which transport it
 * was.
 *
 * Routes: gw_router maps "METHOD PATH" to a handler (exact path, or a prefix ending in
 * '/'), so that other parts (OAuth endpoints, preview URLs) add a route with one call. */
#ifndef GW_REQ_H
#define GW_REQ_H

#include <stddef.h>

typedef struct gw_req gw_req;

/* Called once per complete request (headers + full body). */
typedef void (*gw_http_handler)(gw_req *req, void *arg);
typedef void (*gw_req_abort_cb)(gw_req *req, void *arg);

/* "GET", "POST", "DELETE", "OPTIONS", "HEAD", ... (upper case, static storage). */
const char *gw_req_method(const gw_req *req);
/* The request target as sent ("/mcp?x=1"; for HTTP/2 the :path), NUL-terminated. */
const char *gw_req_target(const gw_req *req);
/* The path without query and fragment, not percent-decoded: "/mcp". "*" for
 * "OPTIONS *", "/" for an absolute-form target without a path. */
const char *gw_req_path(const gw_req *req);
/* The raw query string without '?', not decoded; "" when there is none. */
const char *gw_req_query(const gw_req *req);
/* The value of header `name` (case-insensitive), leading and trailing whitespace removed.
 * When the header occurs more than once this is the FIRST value (gw_req_header_at() sees
 * them all). NULL when absent. HTTP/2 pseudo-headers are not headers here. */
const char *gw_req_header(const gw_req *req, const char *name);
/* Header i in arrival order (0-based): 0 and sets *name, *value; -ENOENT past the end. */
int gw_req_header_at(const gw_req *req, size_t i, const char **name, const char **value);
/* The body; *len gets its length. Never NULL: an empty body is "" with length 0. Always
 * NUL-terminated (the NUL is not counted). */
const char *gw_req_body(const gw_req *req, size_t *len);
/* The client address ("127.0.0.1", "::1", or what the transport was given; "unknown"
 * when nothing) and port (0 if unknown). */
const char *gw_req_peer(const gw_req *req);
int gw_req_peer_port(const gw_req *req);
/* 1 for HTTP/1.1, 0 for HTTP/1.0 (HTTP/2 requests report 1). */
int gw_req_http_minor(const gw_req *req);
/* "http/1.1", "http/1.0", "h2c" or "h2" (TLS). */
const char *gw_req_protocol(const gw_req *req);
/* This request's id ("req_..."), for logs and the X-Request-Id response header. */
const char *gw_req_id(const gw_req *req);
/* A slot for the handler's own per-request state (NULL at first). */
void gw_req_set_data(gw_req *req, void *data);
void *gw_req_data(const gw_req *req);

/* Registers cb to run when the client goes away before the response is complete. When cb
 * returns the request is freed; it must not be responded to any more. cb NULL removes. */
void gw_req_set_abort_cb(gw_req *req, gw_req_abort_cb cb, void *arg);

/* Sends the one response to req and releases req (the pointer is invalid afterwards).
 * status 200..599 (anything else is sent as 500). content_type NULL = no Content-Type.
 * headers: NULL or a NULL-terminated list name, value, name, value, ...; names and
 * values containing CR, LF or NUL, and the framing headers Content-Length,
 * Transfer-Encoding, Date and Connection are dropped, except that "Connection: close"
 * makes an HTTP/1 server close after this response. The body is copied. For HEAD
 * requests, and for 204/304, no body is sent. */
void gw_req_respond(gw_req *req, int status, const char *content_type,
                    const char *const *headers, const char *body, size_t len);

/* The same with the body in pieces; a piece with `ref` set is sent from where it is, not
 * copied, so it must stay valid and unchanged while the server runs (static data, or data
 * built once at start, like an encoded tools/list). */
typedef struct gw_piece {
    const char *p;
    size_t n;
    int ref;
} gw_piece;
void gw_req_respond_pieces(gw_req *req, int status, const char *content_type,
                           const char *const *headers, const gw_piece *pieces, size_t npieces);

/* Streams the response: the head goes out now (no Content-Length; HTTP/1.1 uses chunked
 * encoding), each write sends one piece at once, end finishes the response and releases
 * req. 0, or -EPIPE (the client is gone: the abort callback has run or runs soon),
 * -ENOBUFS (the client reads too slowly: more than 1 MiB waits unsent), -EINVAL (not
 * streaming / already answered). */
int gw_req_stream_begin(gw_req *req, int status, const char *content_type,
                        const char *const *headers);
int gw_req_stream_write(gw_req *req, const char *data, size_t len);
void gw_req_stream_end(gw_req *req);
/* True once gw_req_stream_begin() succeeded. */
int gw_req_streaming(const gw_req *req);

/* The answer of a head check (server.h): status 0 lets the body in; otherwise the request
 * is refused with that status (401 adds WWW-Authenticate, 429/503 Retry-After) and msg. */
void gw_req_head_verdict(gw_req *req, int status, const char *msg);
/* Notes the job a request started, for the access log; "" when none. */
void gw_req_set_job(gw_req *req, const char *job);
const char *gw_req_job(const gw_req *req);
/* Microseconds since the request arrived. */
unsigned long long gw_req_elapsed_us(const gw_req *req);

/* ---- routing ---- */
typedef struct gw_router gw_router;
gw_router *gw_router_new(void);
void gw_router_free(gw_router *r);
/* method NULL = any method; path ending in '/' matches every path below it. Later routes
 * with the same method and path replace earlier ones. 0, -ENOMEM, -E2BIG (64 routes). */
int gw_router_add(gw_router *r, const char *method, const char *path, gw_http_handler fn,
                  void *arg);
/* Sets the handler for paths no route matches (default: 404 JSON). */
void gw_router_fallback(gw_router *r, gw_http_handler fn, void *arg);
/* A gw_http_handler: pass the router as its arg. A path known for other methods gets 405
 * with Allow. */
void gw_router_dispatch(gw_req *req, void *router);

#endif
