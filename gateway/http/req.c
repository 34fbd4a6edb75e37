/* req.c: the protocol-neutral request (req.h): storage, accessors, the answer entry
 * points that forward to the transport that carries the request, and the router. */
#include "req_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sf_log.h"

#include <event2/buffer.h>

/* ------------------------------------------------------------------ storage */

/* Request ids name a request in logs and traces; they are not secrets. A getrandom() per
 * request was a system call on the hot path: each thread seeds a splitmix64 sequence once
 * (a bijection of its counter, so a thread never repeats an id; two gateways collide with
 * odds of about 1 in 36^12). */
static void request_id(char *out)
{
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    static _Thread_local uint64_t state;
    static _Thread_local int seeded;
    uint64_t z;

    if (!seeded) {
        if (sf_random(&state, sizeof(state)) < 0)
            state = sf_mono_us() ^ (uint64_t)(uintptr_t)&state;
        seeded = 1;
    }
    z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    memcpy(out, "req_", 4);
    for (size_t i = 0; i < 12; i++, z /= 36) /* 36^12 < 2^64 */
        out[4 + i] = alnum[z % 36];
    out[16] = '\0';
}

/* Requests are recycled per server (one per thread), their buffers kept: a request, its
 * header table, its buffers and their growth were ~10 allocations per request. A request
 * whose buffers grew large is freed instead, and at most GW_REQ_POOL wait. */
#if defined(__SANITIZE_ADDRESS__)
#define GW_REQ_POOL 0 /* ASan builds free every request, so a use after free is still caught */
#else
#define GW_REQ_POOL 64
#endif
#define GW_REQ_POOL_KEEP (16u << 10) /* a buffer larger than this is not kept */

static void req_release(gw_req *r)
{
    sf_buf_fini(&r->target);
    sf_buf_fini(&r->pq);
    sf_buf_fini(&r->hdrs);
    sf_buf_fini(&r->body);
    free(r->hv);
    free(r);
}

gw_req *gw_req_new(const gw_req_transport *tp, gw_http_server *srv, void *conn,
                   size_t max_header_bytes, size_t max_body)
{
    gw_req *r = srv ? srv->req_pool : NULL;
    sf_buf target, pq, hdrs, body;
    gw_hdr *hv = NULL;
    size_t caph = 0;

    if (r) { /* keep its buffers, clear the rest */
        srv->req_pool = r->pool_next;
        srv->nreq_pool--;
        target = r->target, pq = r->pq, hdrs = r->hdrs, body = r->body;
        hv = r->hv, caph = r->caph;
        memset(r, 0, sizeof(*r));
        r->target = target, r->pq = pq, r->hdrs = hdrs, r->body = body;
        r->hv = hv, r->caph = caph;
        sf_buf_reset(&r->target);
        sf_buf_reset(&r->pq);
        sf_buf_reset(&r->hdrs);
        sf_buf_reset(&r->body);
    } else if ((r = calloc(1, sizeof(*r)))) {
        sf_buf_init(&r->target, GW_REQ_MAX_TARGET);
        sf_buf_init(&r->pq, GW_REQ_MAX_TARGET + 2);
    } else {
        return NULL;
    }
    r->hdrs.max = max_header_bytes + 2 * GW_REQ_MAX_HEADERS + 2;
    r->body.max = max_body;
    r->tp = tp;
    r->srv = srv;
    r->conn = conn;
    r->method = "GET";
    r->proto = "http/1.1";
    r->minor = 1;
    r->peer = "unknown";
    r->t0_us = sf_mono_us();
    request_id(r->id);
    return r;
}

void gw_req_free(gw_req *r)
{
    if (!r)
        return;
#if GW_REQ_POOL > 0
    {
        gw_http_server *s = r->srv;

        if (s && s->nreq_pool < GW_REQ_POOL && r->target.cap <= GW_REQ_POOL_KEEP &&
            r->pq.cap <= GW_REQ_POOL_KEEP && r->hdrs.cap <= GW_REQ_POOL_KEEP &&
            r->body.cap <= GW_REQ_POOL_KEEP && r->caph <= 64) {
            r->pool_next = s->req_pool;
            s->req_pool = r;
            s->nreq_pool++;
            return;
        }
    }
#endif
    req_release(r);
}

void gw_req_pool_free(gw_http_server *s)
{
    while (s->req_pool) {
        gw_req *r = s->req_pool;
        s->req_pool = r->pool_next;
        req_release(r);
    }
    s->nreq_pool = 0;
}

/* sf_buf_append with the common case (room left) inline: header bytes arrive in many
 * small pieces. */
static inline int hdr_append(sf_buf *b, const char *at, size_t len)
{
    if (b->p && len < b->cap - b->len && len <= b->max - b->len) {
        memcpy(b->p + b->len, at, len);
        b->len += len;
        b->p[b->len] = '\0';
        return 0;
    }
    return sf_buf_append(b, at, len);
}

static int hdr_slot(gw_req *r)
{
    if (r->nh >= GW_REQ_MAX_HEADERS)
        return -E2BIG;
    if (r->nh == r->caph) {
        size_t ncap = r->caph ? r->caph * 2 : 16;
        gw_hdr *hv = realloc(r->hv, ncap * sizeof(*hv));
        if (!hv)
            return -ENOMEM;
        r->hv = hv;
        r->caph = ncap;
    }
    r->hv[r->nh].name_off = r->hdrs.len;
    r->hv[r->nh].val_off = 0;
    r->hv[r->nh].val_len = 0;
    r->nh++;
    return 0;
}

int gw_req_hdr_finish(gw_req *r)
{
    static const char nul[2] = {0, 0};
    int rc = 0;

    if (r->hstate == GW_H_FIELD) { /* a field without a value: empty value */
        rc = hdr_append(&r->hdrs, nul, 1);
        r->hv[r->nh - 1].val_off = r->hdrs.len;
        r->hv[r->nh - 1].val_len = 0;
        if (rc == 0)
            rc = hdr_append(&r->hdrs, nul, 1);
    } else if (r->hstate == GW_H_VALUE) {
        gw_hdr *h = &r->hv[r->nh - 1];
        rc = hdr_append(&r->hdrs, nul, 1);
        while (rc == 0 && h->val_len > 0 &&
               (r->hdrs.p[h->val_off + h->val_len - 1] == ' ' ||
                r->hdrs.p[h->val_off + h->val_len - 1] == '\t'))
            r->hdrs.p[h->val_off + --h->val_len] = '\0';
    }
    r->hstate = GW_H_NONE;
    return rc;
}

int gw_req_hdr_field(gw_req *r, const char *at, size_t len)
{
    int rc;

    if (r->hstate != GW_H_FIELD) {
        if ((rc = gw_req_hdr_finish(r)) < 0 || (rc = hdr_slot(r)) < 0)
            return rc;
        r->hstate = GW_H_FIELD;
    }
    return hdr_append(&r->hdrs, at, len);
}

int gw_req_hdr_value(gw_req *r, const char *at, size_t len)
{
    static const char nul = 0;
    int rc;

    if (r->hstate == GW_H_NONE)
        return -EINVAL;
    if (r->hstate == GW_H_FIELD) {
        if ((rc = hdr_append(&r->hdrs, &nul, 1)) < 0)
            return rc;
        r->hv[r->nh - 1].val_off = r->hdrs.len;
        r->hstate = GW_H_VALUE;
    }
    if ((rc = hdr_append(&r->hdrs, at, len)) < 0)
        return rc;
    r->hv[r->nh - 1].val_len += len;
    return 0;
}

int gw_req_add_header(gw_req *r, const char *name, size_t nlen, const char *value, size_t vlen)
{
    int rc;

    while (vlen > 0 && (*value == ' ' || *value == '\t')) {
        value++;
        vlen--;
    }
    if ((rc = gw_req_hdr_field(r, name, nlen)) < 0 ||
        (vlen > 0 ? (rc = gw_req_hdr_value(r, value, vlen)) : 0) < 0)
        return rc;
    return gw_req_hdr_finish(r);
}

int gw_req_split_target(gw_req *r)
{
    const char *t = r->target.p, *p, *q, *end;

    if (!t || r->target.len == 0)
        return -EINVAL;
    end = t + r->target.len;
    if (!strcmp(t, "*")) {
        p = t;
        q = end;
    } else if (t[0] == '/') {
        p = t;
        q = p + strcspn(p, "?#");
    } else {
        const char *s = strstr(t, "://");
        if (!s || s == t)
            return -EINVAL;
        for (const char *x = t; x < s; x++)
            if (!((*x >= 'a' && *x <= 'z') || (*x >= 'A' && *x <= 'Z') || *x == '+' || *x == '-' ||
                  *x == '.' || (x > t && *x >= '0' && *x <= '9')))
                return -EINVAL;
        s += 3;
        p = s + strcspn(s, "/?#");
        if (p == s) /* no authority */
            return -EINVAL;
        q = p + strcspn(p, "?#");
    }
    {
        static const char nul = '\0';
        const char *qs = q, *f = q;
        size_t plen;
        int rc;

        if (q < end && *q == '?') {
            qs = q + 1;
            f = qs + strcspn(qs, "#");
        }
        sf_buf_reset(&r->pq);
        plen = q == p ? 1 : (size_t)(q - p);
        if ((rc = sf_buf_append(&r->pq, q == p ? "/" : p, plen)) < 0 ||
            (rc = sf_buf_append(&r->pq, &nul, 1)) < 0 ||
            (rc = sf_buf_append(&r->pq, qs, (size_t)(f - qs))) < 0)
            return rc == -E2BIG ? -EINVAL : -ENOMEM;
        r->path = r->pq.p;
        r->query = r->pq.p + plen + 1;
    }
    return 0;
}

void gw_req_abort(gw_req *r)
{
    if (!r || r->aborting)
        return;
    if (r->dispatched)
        gw_http_observe(r, 0);
    if ((r->dispatched || r->in_headcheck) && r->abort_cb) {
        r->aborting = 1;
        r->abort_cb(r, r->abort_arg);
    }
}

void gw_http_observe(gw_req *r, int status)
{
    if (r->srv && r->srv->observer)
        r->srv->observer(r, status, r->srv->observer_arg);
}

void gw_req_head_verdict(gw_req *req, int status, const char *msg)
{
    if (!req || !req->in_headcheck)
        return;
    req->in_headcheck = 0;
    req->abort_cb = NULL;
    req->abort_arg = NULL;
    if (req->tp->head_verdict)
        req->tp->head_verdict(req, status, msg);
}

void gw_req_set_job(gw_req *req, const char *job)
{
    snprintf(req->job, sizeof(req->job), "%s", job ? job : "");
}

const char *gw_req_job(const gw_req *req)
{
    return req->job;
}

unsigned long long gw_req_elapsed_us(const gw_req *req)
{
    return (unsigned long long)(sf_mono_us() - req->t0_us);
}

/* ------------------------------------------------------------------ HTTP helpers */

int gw_http_is_token(const char *s)
{
    static const char extra[] = "!#$%&'*+-.^_`|~";
    if (!*s)
        return 0;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch && strchr(extra, ch))))
            return 0;
    }
    return 1;
}

int gw_http_is_field_value(const char *s)
{
    for (; *s; s++)
        if (*s == '\r' || *s == '\n')
            return 0;
    return 1;
}

int gw_http_has_token(const char *list, const char *tok)
{
    size_t n = strlen(tok);
    const char *p = list;

    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (strncasecmp(p, tok, n) == 0 &&
            (p[n] == '\0' || p[n] == ',' || p[n] == ' ' || p[n] == '\t'))
            return 1;
        while (*p && *p != ',')
            p++;
    }
    return 0;
}

int gw_http_is_framing(const char *name)
{
    static const char *const names[] = {"Content-Length", "Transfer-Encoding", "Date",
                                        "Connection", "Keep-Alive", "Upgrade",
                                        "Proxy-Connection"};
    for (size_t i = 0; i < SF_ARRAY_LEN(names); i++)
        if (!strcasecmp(name, names[i]))
            return 1;
    return 0;
}

const char *gw_fmt_uint_at(char *out, size_t v)
{
    char *p = out + 20;

    *p = '\0';
    do
        *--p = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    return p;
}

void gw_fmt_uint(char *out, size_t v)
{
    char tmp[24];
    const char *p = gw_fmt_uint_at(tmp, v);

    memmove(out, p, (size_t)(tmp + 21 - p));
}

const char *gw_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    default: return "Status";
    }
}

const char *gw_http_date(time_t *cache_sec, char *buf)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    struct tm tm;

    if (now != *cache_sec && gmtime_r(&now, &tm)) {
        snprintf(buf, 40, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7],
                 tm.tm_mday % 100, months[tm.tm_mon % 12], (tm.tm_year + 1900) % 10000,
                 tm.tm_hour % 100, tm.tm_min % 100, tm.tm_sec % 100);
        *cache_sec = now;
    }
    return buf;
}

/* ------------------------------------------------------------------ accessors */

const char *gw_req_method(const gw_req *req) { return req->method; }
const char *gw_req_target(const gw_req *req) { return req->target.p ? req->target.p : ""; }
const char *gw_req_path(const gw_req *req) { return req->path ? req->path : "/"; }
const char *gw_req_query(const gw_req *req) { return req->query ? req->query : ""; }
const char *gw_req_peer(const gw_req *req) { return req->peer; }
int gw_req_peer_port(const gw_req *req) { return req->peer_port; }
int gw_req_http_minor(const gw_req *req) { return req->minor; }
const char *gw_req_protocol(const gw_req *req) { return req->proto; }
const char *gw_req_id(const gw_req *req) { return req->id; }
void gw_req_set_data(gw_req *req, void *data) { req->data = data; }
void *gw_req_data(const gw_req *req) { return req->data; }
int gw_req_streaming(const gw_req *req) { return req->streaming; }

/* Names are compared by length first (a name's NUL ends it right before its value), which
 * leaves a strcasecmp only for names of the same length: lookups were ~56 strcasecmp per
 * MCP request. */
const char *gw_req_header(const gw_req *req, const char *name)
{
    size_t n = strlen(name);

    for (size_t i = 0; i < req->nh; i++) {
        const gw_hdr *h = &req->hv[i];
        if (h->val_off == h->name_off + n + 1 &&
            strcasecmp(req->hdrs.p + h->name_off, name) == 0)
            return req->hdrs.p + h->val_off;
    }
    return NULL;
}

int gw_req_header_at(const gw_req *req, size_t i, const char **name, const char **value)
{
    if (i >= req->nh || req->hstate != GW_H_NONE)
        return -ENOENT;
    *name = req->hdrs.p + req->hv[i].name_off;
    *value = req->hdrs.p + req->hv[i].val_off;
    return 0;
}

const char *gw_req_body(const gw_req *req, size_t *len)
{
    if (len)
        *len = req->body.len;
    return req->body.p ? req->body.p : "";
}

void gw_req_set_abort_cb(gw_req *req, gw_req_abort_cb cb, void *arg)
{
    req->abort_cb = cb;
    req->abort_arg = arg;
}

/* ------------------------------------------------------------------ answers */

static int answerable(gw_req *req, int streaming, const char *what)
{
    if (!req)
        return 0;
    if (req->aborting || !req->dispatched || req->streaming != streaming) {
        sf_error("msg=\"%s on a request that is aborted or not in that state; ignored\" "
                 "peer=%s", what, req->peer);
        return 0;
    }
    return 1;
}

void gw_req_respond(gw_req *req, int status, const char *content_type,
                    const char *const *headers, const char *body, size_t len)
{
    if (!answerable(req, 0, "gw_req_respond"))
        return;
    if (status < 200 || status > 599) {
        sf_error("msg=\"invalid response status; sending 500\" status=%d", status);
        status = 500;
    }
    if (!body)
        len = 0;
    req->status = status;
    gw_http_observe(req, status);
    req->tp->respond(req, status, content_type, headers, body, len);
}

void gw_req_respond_pieces(gw_req *req, int status, const char *content_type,
                           const char *const *headers, const gw_piece *pieces, size_t npieces)
{
    size_t total = 0;

    if (!answerable(req, 0, "gw_req_respond_pieces"))
        return;
    for (size_t i = 0; i < npieces; i++)
        total += pieces[i].n;
    req->status = status;
    req->pieces = pieces;
    req->npieces = npieces;
    gw_http_observe(req, status);
    req->tp->respond(req, status, content_type, headers, NULL, total);
}

int gw_body_add(struct evbuffer *out, const gw_req *req, const char *body, size_t len)
{
    int rc = 0;

    if (body)
        return evbuffer_add(out, body, len);
    for (size_t i = 0; req && i < req->npieces && rc == 0; i++)
        rc = req->pieces[i].ref ? evbuffer_add_reference(out, req->pieces[i].p, req->pieces[i].n,
                                                         NULL, NULL)
                                : evbuffer_add(out, req->pieces[i].p, req->pieces[i].n);
    return rc;
}

int gw_req_stream_begin(gw_req *req, int status, const char *content_type,
                        const char *const *headers)
{
    int rc;

    if (!answerable(req, 0, "gw_req_stream_begin"))
        return -EINVAL;
    if (status < 200 || status > 599 || status == 204 || status == 304)
        return -EINVAL;
    req->status = status;
    rc = req->tp->stream_begin(req, status, content_type, headers);
    if (rc == 0)
        req->streaming = 1;
    return rc;
}

int gw_req_stream_write(gw_req *req, const char *data, size_t len)
{
    if (!answerable(req, 1, "gw_req_stream_write"))
        return -EINVAL;
    if (len == 0)
        return 0;
    return req->tp->stream_write(req, data, len);
}

void gw_req_stream_end(gw_req *req)
{
    if (!answerable(req, 1, "gw_req_stream_end"))
        return;
    gw_http_observe(req, req->status);
    req->tp->stream_end(req);
}

/* ------------------------------------------------------------------ router */

#define GW_ROUTES_MAX 64

typedef struct gw_route {
    char *method, *path;
    size_t plen;          /* strlen(path) */
    gw_http_handler fn;
    void *arg;
} gw_route;

struct gw_router {
    gw_route routes[GW_ROUTES_MAX];
    size_t n;
    gw_http_handler fallback;
    void *fallback_arg;
};

gw_router *gw_router_new(void)
{
    return calloc(1, sizeof(gw_router));
}

void gw_router_free(gw_router *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        free(r->routes[i].method);
        free(r->routes[i].path);
    }
    free(r);
}

int gw_router_add(gw_router *r, const char *method, const char *path, gw_http_handler fn,
                  void *arg)
{
    gw_route *rt = NULL;

    for (size_t i = 0; i < r->n && !rt; i++)
        if (!strcmp(r->routes[i].path, path) &&
            ((!method && !r->routes[i].method) ||
             (method && r->routes[i].method && !strcmp(method, r->routes[i].method))))
            rt = &r->routes[i];
    if (!rt) {
        if (r->n >= GW_ROUTES_MAX)
            return -E2BIG;
        rt = &r->routes[r->n];
        memset(rt, 0, sizeof(*rt));
        rt->plen = strlen(path);
        if (!(rt->path = strdup(path)) || (method && !(rt->method = strdup(method)))) {
            free(rt->path);
            free(rt->method);
            memset(rt, 0, sizeof(*rt));
            return -ENOMEM;
        }
        r->n++;
    }
    rt->fn = fn;
    rt->arg = arg;
    return 0;
}

void gw_router_fallback(gw_router *r, gw_http_handler fn, void *arg)
{
    r->fallback = fn;
    r->fallback_arg = arg;
}

/* Lengths first: most routes are told apart without comparing bytes. */
static int path_match(const gw_route *rt, const char *path, size_t len)
{
    size_t n = rt->plen;

    if (n > 0 && rt->path[n - 1] == '/')
        return n <= len && !memcmp(rt->path, path, n);
    return n == len && !memcmp(rt->path, path, n);
}

void gw_router_dispatch(gw_req *req, void *router)
{
    gw_router *r = router;
    const char *path = gw_req_path(req), *method = gw_req_method(req);
    size_t plen = strlen(path);
    char allow[160] = "";
    size_t alen = 0;
    const gw_route *best = NULL;

    for (size_t i = 0; i < r->n; i++) {
        const gw_route *rt = &r->routes[i];
        if (!path_match(rt, path, plen))
            continue;
        if (!rt->method || !strcmp(rt->method, method) ||
            (!strcmp(method, "HEAD") && !strcmp(rt->method, "GET"))) {
            if (!best || rt->plen > best->plen ||
                (best->method == NULL && rt->method != NULL))
                best = rt;
        } else if (alen + strlen(rt->method) + 3 < sizeof(allow)) {
            alen += (size_t)snprintf(allow + alen, sizeof(allow) - alen, "%s%s",
                                     alen ? ", " : "", rt->method);
        }
    }
    if (best) {
        best->fn(req, best->arg);
    } else if (alen) {
        const char *const h[] = {"Allow", allow, NULL};
        char body[256];
        int n = snprintf(body, sizeof(body), "{\"error\":\"Method not allowed here; use %s.\"}",
                         allow);
        gw_req_respond(req, 405, "application/json", h, body, (size_t)n);
    } else if (r->fallback) {
        r->fallback(req, r->fallback_arg);
    } else {
        static const char nf[] = "{\"error\":\"Not found.\"}";
        gw_req_respond(req, 404, "application/json", NULL, nf, sizeof(nf) - 1);
    }
}
