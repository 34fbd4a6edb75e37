/* server.c: the gateway's HTTP server (server.h) above its protocol leaves: the listener
 * and accept, the connection caps (max_conns, max_conns_per_addr) with their refusals
 * (503, 429) and lingering close, sniffing (a connection's first bytes pick TLS, HTTP/2 or
 * HTTP/1) and the dispatch to the leaves (http1.c, http2.c, tls.c) through s->serve[],
 * which it fills; the leaves hand connections to each other through that table too
 * (gw_conn_serve), so no leaf names another. The per-address table, the byte budget and
 * the refusal counts, which the leaves share, are in conn.c, below them. */
#include "proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "conn.h"
#include "req_int.h"
#include "sf_bev.h"
#include "sf_list.h"
#include "sf_log.h"
#include "sf_util.h"

#define GW_HTTP_REFUSED_MAX 1024 /* refused connections lingering at once */

static const char h2_preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define H2_PREFACE_LEN (sizeof(h2_preface) - 1)

/* ------------------------------------------------------------------ sniffing */

/* A connection whose first bytes have not come yet. It counts as an HTTP/1 connection
 * (gw_http_server_conns) and owes its first request's head by t0_ms + header_timeout_ms,
 * as it did when HTTP/1 sniffed: the deadline goes with it to the leaf. */
struct gw_sniff {
    gw_http_server *s;
    gw_sniff *prev, *next;
    struct bufferevent *bev;
    gw_addr *addr;
    uint64_t t0_ms;
    int peer_port, tls;
    int header_timer;     /* the read timeout set is the header deadline (else idle) */
    char peer[INET6_ADDRSTRLEN + 8];
};

static void sniff_free(gw_sniff *x, int close)
{
    gw_http_server *s = x->s;

    SF_LIST_UNLINK(s->sniffing, x);
    s->nsniff--;
    if (close) {
        bufferevent_free(x->bev);
        gw_addr_release(s, x->addr);
    }
    free(x);
}

/* Hands x's connection to proto (ended here: the callee owns it). */
static void sniff_hand(gw_sniff *x, int proto, int refuse, const char *refuse_msg)
{
    gw_http_server *s = x->s;
    char peer[sizeof(x->peer)];
    gw_handover h = {.bev = x->bev, .peer = peer, .peer_port = x->peer_port, .tls = x->tls,
                     .addr = x->addr, .t0_ms = x->t0_ms, .refuse = refuse,
                     .refuse_msg = refuse_msg};

    memcpy(peer, x->peer, sizeof(peer));
    bufferevent_setcb(x->bev, NULL, NULL, NULL, NULL);
    sf_bev_no_timeouts(x->bev);
    sniff_free(x, 0);
    gw_conn_serve(s, proto, &h);
}

/* The first bytes: a TLS handshake record (when TLS is offered and this is not TLS yet),
 * the HTTP/2 client preface (HTTP/2, the takeover hook, or 505), or else HTTP/1. */
static void sniff_read_cb(struct bufferevent *bev, void *arg)
{
    gw_sniff *x = arg;
    gw_http_server *s = x->s;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n = evbuffer_get_length(in), m = n < H2_PREFACE_LEN ? n : H2_PREFACE_LEN;
    unsigned char *p;

    if (m == 0)
        return;
    p = evbuffer_pullup(in, (ev_ssize_t)m);
    if (p && p[0] == 0x16 && s->tls && !x->tls) {
        bufferevent_enable(bev, EV_READ | EV_WRITE); /* the TLS filter reads through it */
        sniff_hand(x, GW_PROTO_TLS, 0, NULL);
        return;
    }
    if (!p || memcmp(p, h2_preface, m) != 0) {
        sniff_hand(x, GW_PROTO_H1, 0, NULL);
        return;
    }
    if (m < H2_PREFACE_LEN)
        return; /* so far it looks like the preface: wait for the rest */
    if (s->h2) {
        sniff_hand(x, GW_PROTO_H2, 0, NULL);
        return;
    }
    if (s->takeover) {
        bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
        sf_bev_no_timeouts(bev);
        bufferevent_enable(bev, EV_READ | EV_WRITE);
        if (s->takeover(bev, x->peer, s->takeover_arg) == 0) {
            gw_addr_release(s, x->addr);
            sniff_free(x, 0);
            return;
        }
    }
    sniff_hand(x, GW_PROTO_H1, 505, "HTTP/2 is not served here: use HTTP/1.1");
}

/* Nothing decisive came: the header deadline passed (HTTP/1 answers its 408), or the
 * connection was idle for idle_timeout_s (closed), or it ended. */
static void sniff_event_cb(struct bufferevent *bev, short what, void *arg)
{
    gw_sniff *x = arg;

    /* (which timer it was, not the clock: libevent may fire a millisecond early) */
    if ((what & BEV_EVENT_TIMEOUT) && x->header_timer) {
        struct evbuffer *in = bufferevent_get_input(bev);
        evbuffer_drain(in, evbuffer_get_length(in)); /* (a preface cut short) */
        sniff_hand(x, GW_PROTO_H1, 0, NULL); /* its deadline has passed: 408 */
        return;
    }
    sniff_free(x, 1);
}

static int sniff_start(gw_http_server *s, struct bufferevent *bev, const char *peer,
                       int peer_port, int tls, gw_addr *addr, uint64_t t0_ms)
{
    uint64_t idle = (uint64_t)s->lim.idle_timeout_s * 1000, ms;
    struct timeval tv;
    gw_sniff *x = calloc(1, sizeof(*x));

    if (!x) {
        bufferevent_free(bev);
        gw_addr_release(s, addr);
        return -ENOMEM;
    }
    x->s = s;
    x->bev = bev;
    x->addr = addr;
    x->t0_ms = t0_ms;
    x->peer_port = peer_port;
    x->tls = tls ? 1 : 0;
    snprintf(x->peer, sizeof(x->peer), "%s", peer ? peer : "unknown");
    SF_LIST_PUSH(s->sniffing, x);
    s->nsniff++;
    /* the header deadline counts from t0 (accept); TLS hands over with t0 now */
    x->header_timer = s->lim.header_timeout_ms <= idle;
    ms = x->header_timer ? s->lim.header_timeout_ms : idle;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    bufferevent_set_max_single_read(bev, GW_HTTP_MAX_IO);
    bufferevent_setcb(bev, sniff_read_cb, NULL, sniff_event_cb, x);
    bufferevent_set_timeouts(bev, &tv, NULL);
    if (bufferevent_enable(bev, EV_READ) < 0) {
        sniff_free(x, 1);
        return -ENOMEM;
    }
    if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
        sniff_read_cb(bev, x); /* bytes that came with an adopted bufferevent */
    return 0;
}

/* GW_PROTO_SNIFF in s->serve[]: TLS hands its connections back here after the handshake
 * (ALPN other than h2), so that the preface is recognised inside TLS too. */
static int sniff_serve(gw_http_server *s, const gw_handover *h)
{
    return sniff_start(s, h->bev, h->peer, h->peer_port, h->tls, h->addr,
                       h->t0_ms ? h->t0_ms : (uint64_t)sf_mono_ms());
}

/* ------------------------------------------------------------------ accept */

static void peer_name(const struct sockaddr *sa, char *out, size_t outlen, int *port)
{
    *port = 0;
    snprintf(out, outlen, "unknown");
    if (!sa)
        return;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in4->sin_addr, out, (socklen_t)outlen);
        *port = ntohs(in4->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) /* dual-stack listener: show IPv4 */
            inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], out, (socklen_t)outlen);
        else
            inet_ntop(AF_INET6, &in6->sin6_addr, out, (socklen_t)outlen);
        *port = ntohs(in6->sin6_port);
    } else if (sa->sa_family == AF_UNIX) {
        snprintf(out, outlen, "unix");
    }
}

/* Refuses a connection before any byte is read, with a fixed answer. */
/* A connection refused at accept (429, 503) closes the lingering way too (conn_linger):
 * closed at once with the client's request unread, or with its next bytes on the way, it
 * would be reset, and a client that had not read the refusal yet would see only the reset.
 * Our side is shut down and what the client still sends is read and dropped until it
 * closes, pauses GW_HTTP_LINGER_IDLE_S or GW_HTTP_LINGER_MAX_S passed; at most
 * GW_HTTP_REFUSED_MAX at once (past it they close at once). */
typedef struct gw_refused {
    gw_http_server *s;
    evutil_socket_t fd;
    struct event *ev;
    time_t until;
    struct gw_refused *prev, *next;
} gw_refused;

static void refused_free(gw_refused *r)
{
    gw_http_server *s = r->s;

    SF_LIST_UNLINK(s->refused, r);
    s->nrefused--;
    event_free(r->ev);
    evutil_closesocket(r->fd);
    free(r);
}

static void refused_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_refused *r = arg;
    char buf[16384];
    ssize_t n = -1;

    if (what & EV_READ) /* at most 256 KiB a turn */
        for (int i = 0; i < 16 && (n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0; i++)
            ;
    if ((what & EV_TIMEOUT) || n == 0 ||
        (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
        time(NULL) >= r->until)
        refused_free(r);
}

static void refuse_conn(gw_http_server *s, evutil_socket_t fd, int status, const char *body)
{
    struct timeval idle = {GW_HTTP_LINGER_IDLE_S, 0};
    char msg[512];
    gw_refused *r = NULL;
    int n = snprintf(msg, sizeof(msg),
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"
                     "Retry-After: 1\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                     status, gw_http_reason(status), strlen(body), body);

    if (n > 0 && send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        sf_debug("msg=\"could not send the refusal\" err=\"%s\"", strerror(errno));
    if (s->nrefused >= GW_HTTP_REFUSED_MAX || shutdown(fd, SHUT_WR) < 0 ||
        !(r = calloc(1, sizeof(*r))) ||
        !(r->ev = event_new(s->base, fd, EV_READ | EV_PERSIST, refused_cb, r)) ||
        event_add(r->ev, &idle) < 0) {
        if (r && r->ev)
            event_free(r->ev);
        free(r);
        evutil_closesocket(fd);
        return;
    }
    r->s = s;
    r->fd = fd;
    r->until = time(NULL) + GW_HTTP_LINGER_MAX_S;
    SF_LIST_PUSH(s->refused, r);
    s->nrefused++;
}

static void srv_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                          int salen, void *arg)
{
    gw_http_server *s = arg;
    struct bufferevent *bev;
    char peer[INET6_ADDRSTRLEN + 8];
    int port, one = 1, full;
    gw_addr *addr;

    if (s->nconns + s->nh2 + s->nsniff >= s->lim.max_conns) {
        s->stats.refused[GW_REFUSE_503]++;
        sf_warn("msg=\"connection refused: max_conns reached\" max_conns=%u", s->lim.max_conns);
        refuse_conn(s, fd, 503, "{\"error\":\"the server has too many connections open; retry later\"}");
        return;
    }
    peer_name(salen > 0 ? sa : NULL, peer, sizeof(peer), &port);
    if (!(addr = gw_addr_take(s, peer, s->lim.max_conns_per_addr, &full))) {
        if (!full) {
            evutil_closesocket(fd);
            return;
        }
        s->stats.refused[GW_REFUSE_429]++;
        sf_debug("msg=\"connection refused: too many from one address\" peer=%s max=%u", peer,
                 s->lim.max_conns_per_addr);
        refuse_conn(s, fd, 429, "{\"error\":\"too many connections from your address; close some, "
                             "then retry\"}");
        return;
    }
    if (sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6))
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        evutil_closesocket(fd);
        gw_addr_release(s, addr);
        return;
    }
    sniff_start(s, bev, peer, port, 0, addr, (uint64_t)sf_mono_ms());
}

static void srv_accept_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_http_server *s = arg;
    if (s->lis)
        evconnlistener_enable(s->lis);
}

static void srv_accept_error_cb(struct evconnlistener *l, void *arg)
{
    gw_http_server *s = arg;
    struct timeval one = {1, 0};
    int err = EVUTIL_SOCKET_ERROR();

    /* Typically EMFILE/ENFILE: the pending connection would wake us up again at once. */
    sf_warn("msg=\"accept failed; pausing the listener for 1 s\" err=\"%s\"",
            evutil_socket_error_to_string(err));
    evconnlistener_disable(l);
    evtimer_add(s->accept_retry, &one);
}

gw_http_server *gw_http_server_new(struct event_base *base, const char *addr, int port,
                                   const gw_http_limits *lim, gw_http_handler handler, void *arg)
{
    gw_http_server *s;
    struct addrinfo hints, *res = NULL;
    char portstr[16];
    int err = 0, rc;

    if (!base || !handler || port < -1 || port > 65535) {
        errno = EINVAL;
        return NULL;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        errno = ENOMEM;
        return NULL;
    }
    s->base = base;
    s->handler = handler;
    s->arg = arg;
    s->port = -1;
    s->serve[GW_PROTO_SNIFF] = sniff_serve;
    s->serve[GW_PROTO_H1] = gw_h1_serve;
    s->serve[GW_PROTO_H2] = gw_h2_serve;
    s->serve[GW_PROTO_TLS] = gw_tls_serve;
    if (lim)
        s->lim = *lim;
    if (!s->lim.max_body)
        s->lim.max_body = GW_HTTP_DEFAULT_MAX_BODY;
    if (!s->lim.max_header_bytes)
        s->lim.max_header_bytes = GW_HTTP_DEFAULT_MAX_HEADER_BYTES;
    if (!s->lim.max_conns)
        s->lim.max_conns = GW_HTTP_DEFAULT_MAX_CONNS;
    if (!s->lim.idle_timeout_s)
        s->lim.idle_timeout_s = GW_HTTP_DEFAULT_IDLE_TIMEOUT_S;
    if (!s->lim.max_conns_per_addr)
        s->lim.max_conns_per_addr = GW_HTTP_DEFAULT_MAX_CONNS_PER_ADDR;
    if (!s->lim.header_timeout_ms)
        s->lim.header_timeout_ms = GW_HTTP_DEFAULT_HEADER_TIMEOUT_MS;
    if (!s->lim.body_timeout_ms)
        s->lim.body_timeout_ms = GW_HTTP_DEFAULT_BODY_TIMEOUT_MS;
    if (!s->lim.body_min_rate)
        s->lim.body_min_rate = GW_HTTP_DEFAULT_BODY_MIN_RATE;
    if (!(s->own_addrs = gw_addr_table_new())) {
        free(s);
        errno = ENOMEM;
        return NULL;
    }
    s->addrs = s->own_addrs;
    if (!s->lim.max_buffered_bytes) {
        /* room for one largest request, its head and a full input buffer */
        size_t one = s->lim.max_body + s->lim.max_header_bytes + GW_HTTP_INPUT_HIGH_WM;

        s->lim.max_buffered_bytes = GW_HTTP_DEFAULT_MAX_BUFFERED;
        if (one > s->lim.max_buffered_bytes && one > s->lim.max_body) /* (and no wrap) */
            s->lim.max_buffered_bytes = one;
    }
    if (!s->lim.max_buffered_per_addr) {
        size_t one = s->lim.max_body + s->lim.max_header_bytes + GW_HTTP_INPUT_HIGH_WM;
        s->lim.max_buffered_per_addr = s->lim.max_buffered_bytes / 4;
        if (s->lim.max_buffered_per_addr < one)
            s->lim.max_buffered_per_addr = one;
    }
    if (port < 0)
        return s;

    s->accept_retry = evtimer_new(base, srv_accept_retry_cb, s);
    if (!s->accept_retry) {
        err = ENOMEM;
        goto fail;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | AI_NUMERICHOST;
    snprintf(portstr, sizeof(portstr), "%d", port);
    rc = getaddrinfo(addr, portstr, &hints, &res);
    if (rc == EAI_NONAME && addr) { /* a host name such as "localhost": resolve it */
        hints.ai_flags &= ~AI_NUMERICHOST;
        rc = getaddrinfo(addr, portstr, &hints, &res);
    }
    if (rc != 0 || !res) {
        err = EADDRNOTAVAIL;
        goto fail;
    }
    /* With no address, prefer "::" (dual-stack on Linux) over "0.0.0.0". */
    for (int pass = addr ? 1 : 0; pass < 2 && !s->lis; pass++) {
        for (struct addrinfo *ai = res; ai && !s->lis; ai = ai->ai_next) {
            if (pass == 0 && ai->ai_family != AF_INET6)
                continue;
            s->lis = evconnlistener_new_bind(base, srv_accept_cb, s,
                                             LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC |
                                                 LEV_OPT_REUSEABLE |
                                                 (s->lim.reuse_port ? LEV_OPT_REUSEABLE_PORT : 0),
                                             1024, ai->ai_addr, (int)ai->ai_addrlen);
            if (!s->lis)
                err = errno ? errno : EADDRINUSE;
        }
    }
    freeaddrinfo(res);
    if (!s->lis)
        goto fail;
    evconnlistener_set_error_cb(s->lis, srv_accept_error_cb);
    {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (getsockname(evconnlistener_get_fd(s->lis), (struct sockaddr *)&ss, &sl) < 0) {
            err = errno;
            goto fail;
        }
        if (ss.ss_family == AF_INET)
            s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            s->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    return s;

fail:
    gw_http_server_free(s);
    errno = err ? err : EINVAL;
    return NULL;
}

void gw_http_server_stop_accepting(gw_http_server *srv)
{
    if (srv && srv->lis) {
        evconnlistener_free(srv->lis); /* closes the socket: new connections are refused */
        srv->lis = NULL;
    }
}

void gw_http_server_free(gw_http_server *srv)
{
    if (!srv)
        return;
    while (srv->sniffing)
        sniff_free(srv->sniffing, 1);
    gw_h1_free_all(srv);
    while (srv->refused)
        refused_free(srv->refused);
    gw_h2_free_all(srv);
    gw_tls_ctx_free(srv);
    gw_req_pool_free(srv);
    if (srv->lis)
        evconnlistener_free(srv->lis);
    if (srv->accept_retry)
        event_free(srv->accept_retry);
    gw_addr_table_free(srv->own_addrs);
    free(srv);
}

int gw_http_server_port(const gw_http_server *srv)
{
    return srv ? srv->port : -1;
}

unsigned gw_http_server_conns(const gw_http_server *srv)
{
    return srv ? srv->nconns + srv->nsniff : 0; /* (not sniffed yet: HTTP/1 so far) */
}

size_t gw_http_server_buffered(const gw_http_server *srv)
{
    return srv ? srv->buffered : 0;
}

void gw_http_server_set_takeover(gw_http_server *srv, gw_http_takeover_fn fn, void *arg)
{
    srv->takeover = fn;
    srv->takeover_arg = arg;
}

int gw_http_server_adopt(gw_http_server *srv, struct bufferevent *bev, const char *peer)
{
    if (!srv || !bev)
        return -EINVAL;
    gw_addr *addr;

    if (srv->nconns + srv->nh2 + srv->nsniff >= srv->lim.max_conns) {
        bufferevent_free(bev);
        return -EMFILE;
    }
    if (!(addr = gw_addr_get(srv, peer))) {
        bufferevent_free(bev);
        return -ENOMEM;
    }
    return sniff_start(srv, bev, peer, 0, 0, addr, (uint64_t)sf_mono_ms());
}

/* ------------------------------------------------------------------ settings */

void gw_http_server_enable_h2(gw_http_server *srv)
{
    srv->h2 = 1;
}

void gw_http_server_set_challenge(gw_http_server *srv, gw_http_challenge_fn fn, void *arg)
{
    srv->challenge = fn;
    srv->challenge_arg = arg;
}

void gw_http_server_set_head_check(gw_http_server *srv, gw_http_head_check_fn fn, void *arg)
{
    srv->head_check = fn;
    srv->head_check_arg = arg;
}

void gw_http_server_set_observer(gw_http_server *srv, gw_http_observer_fn fn, void *arg)
{
    srv->observer = fn;
    srv->observer_arg = arg;
}

void gw_http_server_set_divert(gw_http_server *srv, gw_http_divert_match_fn match,
                               gw_http_divert_fn take, void *arg)
{
    srv->divert_match = match;
    srv->divert_take = take;
    srv->divert_arg = arg;
}

void gw_http_hold_release(gw_http_server *srv, void *hold)
{
    gw_addr_release(srv, hold);
}

const gw_http_stats *gw_http_server_stats(const gw_http_server *srv)
{
    return &srv->stats;
}

void gw_http_server_share_addrs(gw_http_server *srv, gw_addr_table *t)
{
    if (t)
        srv->addrs = t;
}

int gw_http_server_set_tls(gw_http_server *srv, const char *cert_file, const char *key_file,
                           char *why, size_t whylen)
{
    return gw_tls_ctx_new(srv, cert_file, key_file, why, whylen);
}

unsigned gw_http_server_h2_conns(const gw_http_server *srv)
{
    return srv ? srv->nh2 : 0;
}
