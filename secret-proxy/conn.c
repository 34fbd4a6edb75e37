/* One sandbox connection through the proxy.
 *
 * Transparent (nftables redirected it; SO_ORIGINAL_DST is where it was going): the first
 * bytes say what it is. A TLS ClientHello: its SNI must resolve to the original address;
 * the TLS is terminated (deployment CA) when a secret bound to the sandbox may go to that
 * name, tunnelled otherwise. An HTTP request: every request's Host must resolve to the
 * original address. Anything else (or silence for sniff_timeout_ms): plain TCP judged by
 * the address alone.
 * Explicit (HTTP_PROXY): absolute-form requests (each judged and routed by its URL, whose
 * host must equal the Host header) and CONNECT host:port (judged by name, then sniffed like
 * a transparent connection whose SNI / Host must equal the CONNECT host).
 *
 * HTTP requests are parsed (llhttp, strict), judged one by one, and written out again with
 * placeholders swapped; responses are framed (to know when an upstream may be switched)
 * and relayed as they came. Each upstream connection is one network-log entry; each
 * refused request is one more. */
#include "proxy.h"
#include "sf_list.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <llhttp.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define HIGH_WATER (256 * 1024)
#define SNIFF_MAX (16 * 1024 + 5)
#define FIFO_MAX 64 /* requests in flight on one connection */

enum { ST_SNIFF, ST_HTTP, ST_TUNNEL, ST_CLOSING };

/* Reading a plain socket ourselves (see "reading" below). */
typedef struct sp_rd {
    struct event *ev;              /* NULL: the bufferevent reads */
    struct evbuffer_cb_entry *cbe; /* the input fell below HIGH_WATER: reading resumes */
    int want;                      /* the connection wants to read */
    int full;                      /* the input holds HIGH_WATER bytes (client side) */
    int ready;                     /* connected */
    int added;
} sp_rd;

struct sp_conn {
    sp_ctx *ctx;
    sp_sandbox *sb;
    sp_conn *next, *prev;
    int explicit_proxy;
    int state;
    struct bufferevent *cl, *up;
    sp_rd rd_cl, rd_up;       /* own reading of plain sockets */
    struct event *ev_sniff;
    struct event *ev_close;   /* terminated TLS: waits for the socket's output to drain */
    int64_t close_deadline;
    int shut;
    sp_rq *rq;
    /* where the connection goes */
    uint32_t dst_ip;          /* transparent: original destination; CONNECT: chosen address */
    int dst_port;
    int fixed;                /* bound to dst (transparent or CONNECT) */
    char name[SP_NAME_MAX];   /* SNI / CONNECT host ("" none) */
    int tls_term;             /* the client side is terminated TLS */
    /* the current upstream */
    char up_name[SP_NAME_MAX];
    uint32_t up_ip;
    int up_port;
    int up_connected;
    /* HTTP */
    llhttp_t req, rsp;
    sp_head head;
    int in_msg;               /* a request head has been accepted, its body may follow */
    int head_ready, msg_done; /* set by the parser callbacks (paused) */
    int awaiting;             /* a decision or upstream switch is under way */
    char method[24];
    char path_host[SP_NAME_MAX];
    int req_port;
    const char *path;
    int http_minor, chunked, upgrade, keepalive, client_done;
    int busy;                 /* inside http_process (no re-entry) */
    uint32_t want_ip;         /* the judged target of the request being decided */
    size_t head_left;         /* bytes of the current request head not yet parsed */
    int deferred;             /* a refusal waits for the responses owed before it */
    int def_status, def_port;
    uint32_t def_ip;
    char def_host[SP_NAME_MAX];
    const char *def_reason;
    uint8_t fifo[FIFO_MAX];   /* 1 = HEAD, for each request whose response is owed */
    int fifo_head, pending;
    sf_buf out;
    /* the current log entry */
    int64_t ts_ms;
    uint64_t up_b, down_b;
    int secret, foreign;
    const char *proto;
};

static llhttp_settings_t req_settings, rsp_settings;

/* Copies the string src into dst (cap bytes), cut to fit (no printf per request). */
static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);

    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Feeds n bytes to p: how many it took (all, or up to where it paused or failed). */
static size_t feed(llhttp_t *p, const char *at, size_t n, llhttp_errno_t *err)
{
    *err = llhttp_execute(p, at, n);
    if (*err == HPE_OK)
        return n;
    return llhttp_get_error_pos(p) ? (size_t)(llhttp_get_error_pos(p) - at) : 0;
}

static void switch_or_write(sp_conn *c, const char *name, uint32_t ip, int port);

static void conn_free(sp_conn *c);
static void http_process(sp_conn *c);
static void tunnel_start(sp_conn *c);

/* ---------- reading ---------- */

/* Plain sockets are read here, not by their bufferevents, which ask the kernel how many
 * bytes wait (ioctl FIONREAD) before every read and read at most 4 KiB: one system call
 * fewer per read. The bytes land in the bufferevent's input and its callbacks run as the
 * bufferevent runs them (read; EOF, error or idle timeout with reading stopped). TLS
 * sides and closing connections read through their bufferevents. */
static char rd_buf[64 * 1024]; /* one thread, one read at a time */

static sp_rd *rd_of(sp_conn *c, struct bufferevent *bev)
{
    if (bev == c->cl && c->rd_cl.ev)
        return &c->rd_cl;
    if (bev == c->up && c->rd_up.ev)
        return &c->rd_up;
    return NULL;
}

static void rd_update(sp_conn *c, sp_rd *rd)
{
    int on = rd->want && !rd->full && rd->ready;
    struct timeval t = {c->ctx->cfg.proxy_idle_timeout_ms / 1000,
                        (c->ctx->cfg.proxy_idle_timeout_ms % 1000) * 1000};

    if (on && !rd->added)
        rd->added = event_add(rd->ev, &t) == 0;
    else if (!on && rd->added) {
        event_del(rd->ev);
        rd->added = 0;
    }
}

/* bufferevent_enable / bufferevent_disable of EV_READ, whoever reads bev. */
static void read_set(sp_conn *c, struct bufferevent *bev, int on)
{
    sp_rd *rd = rd_of(c, bev);

    if (rd) {
        rd->want = on;
        rd_update(c, rd);
    } else if (on) {
        bufferevent_enable(bev, EV_READ);
    } else {
        bufferevent_disable(bev, EV_READ);
    }
}

static void rd_run(sp_conn *c, sp_rd *rd, struct bufferevent *bev, short what)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    bufferevent_data_cb readcb;
    bufferevent_event_cb eventcb;
    void *arg;
    size_t room = sizeof(rd_buf), have = evbuffer_get_length(in);
    ssize_t n = 0;

    bufferevent_getcb(bev, &readcb, NULL, &eventcb, &arg);
    if (!(what & EV_TIMEOUT)) {
        if (rd == &c->rd_cl) {
            if (have >= HIGH_WATER) {
                rd->full = 1; /* resumed by rd_drained */
                rd_update(c, rd);
                return;
            }
            room = HIGH_WATER - have < room ? HIGH_WATER - have : room;
        }
        n = recv(bufferevent_getfd(bev), rd_buf, room, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n > 0) {
            int rc;
            evbuffer_unfreeze(in, 0); /* the bufferevent keeps its input's end frozen */
            rc = evbuffer_add(in, rd_buf, (size_t)n);
            evbuffer_freeze(in, 0);
            if (rc < 0)
                n = -1;
            else if (readcb) {
                readcb(bev, arg); /* last: it may free c */
                return;
            } else
                return;
        }
    }
    rd->want = 0; /* as the bufferevent does: reading stops, then the event callback */
    rd_update(c, rd);
    if (eventcb)
        eventcb(bev, BEV_EVENT_READING | ((what & EV_TIMEOUT) ? BEV_EVENT_TIMEOUT
                                          : n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), arg);
}

static void rd_cl_cb(evutil_socket_t fd, short what, void *arg)
{
    sp_conn *c = arg;

    rd_run(c, &c->rd_cl, c->cl, what);
}

static void rd_up_cb(evutil_socket_t fd, short what, void *arg)
{
    sp_conn *c = arg;

    rd_run(c, &c->rd_up, c->up, what);
}

static void rd_drained(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
    sp_conn *c = arg;

    if (c->rd_cl.full && info->n_deleted && evbuffer_get_length(b) < HIGH_WATER) {
        c->rd_cl.full = 0;
        rd_update(c, &c->rd_cl);
    }
}

/* Starts reading bev (c->cl or c->up, a plain socket) here; 0 or -ENOMEM (then the
 * bufferevent reads, as before). */
static int rd_start(sp_conn *c, struct bufferevent *bev, int ready)
{
    sp_rd *rd = bev == c->cl ? &c->rd_cl : &c->rd_up;

    memset(rd, 0, sizeof(*rd));
    rd->ev = event_new(c->ctx->d.base, bufferevent_getfd(bev), EV_READ | EV_PERSIST,
                       bev == c->cl ? rd_cl_cb : rd_up_cb, c);
    if (!rd->ev)
        return -ENOMEM;
    if (bev == c->cl &&
        !(rd->cbe = evbuffer_add_cb(bufferevent_get_input(bev), rd_drained, c))) {
        event_free(rd->ev);
        rd->ev = NULL;
        return -ENOMEM;
    }
    rd->want = 1;
    rd->ready = ready;
    rd_update(c, rd);
    return 0;
}

/* Stops reading bev here; with give_back the bufferevent reads on if reading was on. */
static void rd_stop(sp_conn *c, struct bufferevent *bev, int give_back)
{
    sp_rd *rd = rd_of(c, bev);
    int want;

    if (!rd)
        return;
    want = rd->want;
    event_free(rd->ev);
    if (rd->cbe)
        evbuffer_remove_cb_entry(bufferevent_get_input(bev), rd->cbe);
    memset(rd, 0, sizeof(*rd));
    if (give_back && want)
        bufferevent_enable(bev, EV_READ);
}

/* ---------- logging ---------- */

static void ip_text(uint32_t ip, char buf[16])
{
    struct in_addr a = {htonl(ip)};
    inet_ntop(AF_INET, &a, buf, 16);
}

static void log_entry(sp_conn *c, const char *host, uint32_t ip, int port, const char *verdict,
                      const char *reason, uint64_t up, uint64_t down, int secret)
{
    char ipt[16] = "";
    sf_netlog_entry e = {.ts_ms = c->ts_ms, .host = host, .ip = ipt, .port = port,
                         .verdict = verdict, .proto = c->proto, .up = up, .down = down,
                         .secret = secret, .reason = reason};

    if (ip)
        ip_text(ip, ipt);
    if (!host || !*host)
        e.host = ipt;
    sp_netlog(c->ctx, c->sb->id, &e);
}

/* Ends the current upstream's entry (if any) and drops the upstream. */
static void upstream_end(sp_conn *c, const char *verdict, const char *reason)
{
    if (!c->up)
        return;
    if (!reason && c->foreign)
        reason = "a placeholder was sent unchanged (its secret may not go to that host, into "
                 "that header, or over plain HTTP)";
    log_entry(c, c->up_name, c->up_ip, c->up_port, verdict, reason ? reason : "", c->up_b,
              c->down_b, c->secret);
    rd_stop(c, c->up, 0);
    bufferevent_free(c->up);
    c->up = NULL;
    c->up_connected = 0;
    c->up_b = c->down_b = 0;
    c->secret = c->foreign = 0;
    c->ts_ms = sf_now_ms();
}

/* ---------- closing ---------- */

static void on_closing_event(struct bufferevent *bev, short what, void *arg);

static void on_discard(struct bufferevent *bev, void *arg)
{
    evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
}

/* The answer is out: half-close and read until the client closes (2 s at most), so that
 * unread request bytes do not turn our FIN into a reset that destroys the answer. */
static void on_flushed(struct bufferevent *bev, void *arg)
{
    sp_conn *c = arg;

    if (evbuffer_get_length(bufferevent_get_output(bev)) != 0)
        return;
    shutdown(bufferevent_getfd(bev), SHUT_WR);
    on_discard(bev, c);
    bufferevent_setcb(bev, on_discard, NULL, on_closing_event, c);
    bufferevent_set_timeouts(bev, &(struct timeval){2, 0}, NULL);
    bufferevent_enable(bev, EV_READ);
}

static void on_closing_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & BEV_EVENT_CONNECTED)
        return;
    conn_free(arg);
}

static size_t client_queued(sp_conn *c)
{
    struct bufferevent *u = bufferevent_get_underlying(c->cl);

    return evbuffer_get_length(bufferevent_get_output(c->cl)) +
           (u ? evbuffer_get_length(bufferevent_get_output(u)) : 0);
}

/* Terminated TLS: once the socket's output is empty, half-close and discard what the
 * sandbox still sends until it closes (as on_flushed does for plain connections). */
static void on_close_poll(evutil_socket_t unused, short what, void *arg)
{
    sp_conn *c = arg;
    struct bufferevent *u = bufferevent_get_underlying(c->cl);
    int fd = bufferevent_getfd(u ? u : c->cl);
    char buf[4096];
    ssize_t n;

    if (!c->shut) {
        if (client_queued(c) > 0 && sf_mono_ms() < c->close_deadline)
            return;
        shutdown(fd, SHUT_WR);
        c->shut = 1;
        c->close_deadline = sf_mono_ms() + 2000;
    }
    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
        ;
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) || sf_mono_ms() > c->close_deadline)
        conn_free(c);
}

/* Sends what is queued to the client, then closes. */
static void close_after_flush(sp_conn *c)
{
    upstream_end(c, "allowed", NULL);
    c->state = ST_CLOSING;
    if (c->ev_sniff)
        event_del(c->ev_sniff);
    sp_resolve_cancel(c->rq);
    c->rq = NULL;
    if (client_queued(c) == 0) {
        conn_free(c);
        return;
    }
    rd_stop(c, c->cl, 0);
    bufferevent_disable(c->cl, EV_READ);
    if (c->tls_term) { /* the filter hands its bytes on at once: watch the socket's side */
        c->close_deadline = sf_mono_ms() + 10000;
        bufferevent_setcb(c->cl, NULL, NULL, on_closing_event, c);
        if ((c->ev_close = event_new(c->ctx->d.base, -1, EV_PERSIST, on_close_poll, c)))
            event_add(c->ev_close, &(struct timeval){0, 5000});
        else
            conn_free(c);
        return;
    }
    bufferevent_setwatermark(c->cl, EV_WRITE, 0, 0);
    bufferevent_setcb(c->cl, NULL, on_flushed, on_closing_event, c);
    bufferevent_set_timeouts(c->cl, NULL, &(struct timeval){10, 0});
}

static void refuse(sp_conn *c, int status, const char *host, uint32_t ip, int port,
                   const char *reason)
{
    char body[600];

    if (c->state == ST_HTTP && c->pending > 0 && c->up && !c->deferred) {
        /* pipelined behind requests still being answered: answer in order */
        if (status != 502)
            log_entry(c, host, ip, port, "blocked", reason, 0, 0, 0);
        c->deferred = 1;
        c->def_status = status;
        c->def_ip = ip;
        c->def_port = port;
        c->def_reason = reason;
        snprintf(c->def_host, sizeof(c->def_host), "%s", host ? host : "");
        c->awaiting = 1;
        return;
    }
    const char *st = status == 403 ? "Forbidden" : status == 400 ? "Bad Request"
                   : status == 405 ? "Method Not Allowed"
                   : status == 431 ? "Request Header Fields Too Large"
                   : status == 502 ? "Bad Gateway" : "Service Unavailable";
    int n;

    if (status == 403) {
        char ipt[16] = "";
        if (ip)
            ip_text(ip, ipt);
        n = snprintf(body, sizeof(body), "sandfleet: egress to %s:%d is not allowed for this "
                     "sandbox (%s); add the host to allow_out with sandbox_update if it should "
                     "be reachable.\n", host && *host ? host : ipt, port, reason);
        if (!c->deferred)
            log_entry(c, host, ip, port, "blocked", reason, 0, 0, 0);
    } else {
        n = snprintf(body, sizeof(body), "sandfleet: the proxy refused this request: %s.\n",
                     reason);
        if (status != 502 && !c->deferred)
            log_entry(c, host, ip, port, "blocked", reason, 0, 0, 0);
    }
    if (n >= (int)sizeof(body))
        n = (int)sizeof(body) - 1;
    if (c->state != ST_SNIFF || c->explicit_proxy)
        evbuffer_add_printf(bufferevent_get_output(c->cl),
                            "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d"
                            "\r\nConnection: close\r\nX-Sandfleet-Proxy: refused\r\n\r\n%s",
                            status, st, n, body);
    close_after_flush(c);
}

/* Blocks a connection that never spoke HTTP (TLS, raw TCP): logged, closed. */
static void block_silent(sp_conn *c, const char *host, uint32_t ip, int port, const char *reason)
{
    log_entry(c, host, ip, port, "blocked", reason, 0, 0, 0);
    evbuffer_drain(bufferevent_get_input(c->cl), evbuffer_get_length(bufferevent_get_input(c->cl)));
    close_after_flush(c);
}

/* ---------- relaying with back-pressure ---------- */

static void on_drained(struct bufferevent *bev, void *arg);

/* Moved data into dst's output: stop reading src while dst is backed up. */
static void pressure(sp_conn *c, struct bufferevent *src, struct bufferevent *dst)
{
    if (evbuffer_get_length(bufferevent_get_output(dst)) >= HIGH_WATER) {
        read_set(c, src, 0);
        bufferevent_setwatermark(dst, EV_WRITE, HIGH_WATER / 2, HIGH_WATER);
    }
}

static void on_drained(struct bufferevent *bev, void *arg)
{
    sp_conn *c = arg;
    struct bufferevent *src = bev == c->cl ? c->up : c->cl;

    if (c->state == ST_CLOSING)
        return;
    bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
    if (src && !(c->state == ST_HTTP && src == c->cl && c->awaiting))
        read_set(c, src, 1);
}

/* ---------- writing ---------- */

/* The socket of bev when bytes for it may skip its output buffer: a plain (not TLS)
 * connected socket with nothing queued. Writing there at once spares arming and
 * disarming its write event, two epoll_ctl calls per write; -1 otherwise. */
static int direct_fd(sp_conn *c, struct bufferevent *bev)
{
    if (c->tls_term || c->state == ST_CLOSING || (bev == c->up && !c->up_connected) ||
        evbuffer_get_length(bufferevent_get_output(bev)) != 0)
        return -1;
    return bufferevent_getfd(bev);
}

/* Sends n bytes at p to bev: what the socket takes now goes at once, the rest is queued
 * (and so are errors: the bufferevent's own write reports them). */
static void put_mem(sp_conn *c, struct bufferevent *bev, const void *p, size_t n)
{
    int fd = direct_fd(c, bev);

    if (fd >= 0 && n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p = (const char *)p + w;
            n -= (size_t)w;
        }
    }
    if (n)
        bufferevent_write(bev, p, n);
}

/* Moves the first n bytes of src to bev, the same way. */
static void put_buf(sp_conn *c, struct bufferevent *bev, struct evbuffer *src, size_t n)
{
    int fd = direct_fd(c, bev);

    if (fd >= 0 && n) {
        int w = evbuffer_write_atmost(src, fd, (ev_ssize_t)n);
        if (w > 0)
            n -= (size_t)w;
    }
    if (n)
        evbuffer_remove_buffer(src, bufferevent_get_output(bev), n);
}

/* ---------- upstream ---------- */

static void on_up_read(struct bufferevent *bev, void *arg);
static void on_up_event(struct bufferevent *bev, short what, void *arg);

static int upstream_open(sp_conn *c, const char *name, uint32_t ip, int port, int tls)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(ip)};
    struct event_base *base = c->ctx->d.base;
    struct timeval ct = {c->ctx->cfg.proxy_connect_timeout_ms / 1000,
                         (c->ctx->cfg.proxy_connect_timeout_ms % 1000) * 1000};

    snprintf(c->up_name, sizeof(c->up_name), "%s", name ? name : "");
    c->up_ip = ip;
    c->up_port = port;
    c->up_connected = 0;
    if (tls) {
        SSL *ssl = sp_tls_client(c->ctx->tls, name);
        if (!ssl)
            return -ENOMEM;
        c->up = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                               BEV_OPT_CLOSE_ON_FREE);
    } else {
        c->up = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    }
    if (!c->up)
        return -ENOMEM;
    llhttp_init(&c->rsp, HTTP_RESPONSE, &rsp_settings);
    c->rsp.data = c;
    bufferevent_setcb(c->up, on_up_read, on_drained, on_up_event, c);
    bufferevent_set_timeouts(c->up, NULL, &ct);
    if (bufferevent_socket_connect(c->up, (struct sockaddr *)&a, sizeof(a)) < 0) {
        bufferevent_free(c->up);
        c->up = NULL;
        return -ECONNREFUSED;
    }
    if (tls || rd_start(c, c->up, 0) < 0)
        bufferevent_enable(c->up, EV_READ | EV_WRITE);
    else
        bufferevent_enable(c->up, EV_WRITE);
    return 0;
}

static void set_idle(sp_conn *c, struct bufferevent *bev)
{
    struct timeval t = {c->ctx->cfg.proxy_idle_timeout_ms / 1000,
                        (c->ctx->cfg.proxy_idle_timeout_ms % 1000) * 1000};
    bufferevent_set_timeouts(bev, &t, &t);
}

static const char *ssl_reason(struct bufferevent *bev)
{
    unsigned long e = bufferevent_get_openssl_error(bev);
    static char buf[160];

    if (!e)
        return NULL;
    snprintf(buf, sizeof(buf), "TLS: %s", ERR_reason_error_string(e) ? ERR_reason_error_string(e)
                                                                       : "handshake failed");
    return buf;
}

static void on_up_event(struct bufferevent *bev, short what, void *arg)
{
    sp_conn *c = arg;

    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        struct bufferevent *u = bufferevent_get_underlying(bev);
        c->up_connected = 1;
        setsockopt(bufferevent_getfd(u ? u : bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        set_idle(c, bev);
        if (rd_of(c, bev)) {
            c->rd_up.ready = 1;
            rd_update(c, &c->rd_up);
        }
        return;
    }
    if (!c->up_connected) { /* connect or upstream TLS handshake failed */
        const char *why = (what & BEV_EVENT_TIMEOUT) ? "connection timed out"
                        : ssl_reason(bev) ? ssl_reason(bev) : "connection refused";
        upstream_end(c, "failed", why);
        if (c->state == ST_HTTP)
            refuse(c, 502, c->up_name, c->up_ip, c->up_port, why);
        else
            close_after_flush(c);
        return;
    }
    if (c->state == ST_HTTP && (what & BEV_EVENT_EOF)) {
        if (evbuffer_get_length(bufferevent_get_input(bev))) {
            on_up_read(bev, c);
            if (c->up != bev)
                return;
        }
        if (llhttp_finish(&c->rsp) == HPE_PAUSED) /* ends read-until-close */
            llhttp_resume(&c->rsp);
    }
    upstream_end(c, "allowed", NULL);
    if (c->state == ST_HTTP && c->pending == 0 && c->deferred)
        refuse(c, c->def_status, c->def_host, c->def_ip, c->def_port, c->def_reason);
    else if (c->state != ST_HTTP || c->pending > 0 || c->client_done)
        close_after_flush(c);
    else if (c->awaiting && !c->rq && c->want_ip)
        switch_or_write(c, c->path_host, c->want_ip, c->req_port);
}

/* ---------- client side ---------- */

static void on_cl_read(struct bufferevent *bev, void *arg);

static void on_cl_event(struct bufferevent *bev, short what, void *arg)
{
    sp_conn *c = arg;

    if (what & BEV_EVENT_EOF) {
        if (c->state == ST_TUNNEL && c->up) {
            /* half-close: let the upstream answer what it has; closed when it ends */
            read_set(c, c->cl, 0);
            c->client_done = 1;
            if (c->up_connected)
                shutdown(bufferevent_getfd(c->up), SHUT_WR);
            return;
        }
        if (c->state == ST_HTTP && c->pending > 0) {
            c->client_done = 1;
            read_set(c, c->cl, 0);
            return;
        }
    }
    conn_free(c);
}

static void on_sniff_timeout(evutil_socket_t fd, short what, void *arg);

void sp_conn_accept(sp_sandbox *sb, evutil_socket_t fd, int explicit_proxy)
{
    sp_ctx *ctx = sb->ctx;
    sp_conn *c;
    struct sockaddr_in dst;
    socklen_t dl = sizeof(dst);

    if (sb->dead || sb->conns_n >= ctx->cfg.proxy_max_conns || !(c = calloc(1, sizeof(*c)))) {
        sf_warn("msg=\"connection refused: too many\" sandbox=%s conns=%d", sb->id, sb->conns_n);
        close(fd);
        return;
    }
    if (!explicit_proxy) {
        if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &dst, &dl) < 0) {
            free(c);
            close(fd);
            return;
        }
        c->dst_ip = ntohl(dst.sin_addr.s_addr);
        c->dst_port = ntohs(dst.sin_port);
        c->fixed = 1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int)); /* we write whole answers */
    c->ctx = ctx;
    c->sb = sp_sandbox_ref(sb);
    c->explicit_proxy = explicit_proxy;
    c->ts_ms = sf_now_ms();
    c->proto = "tcp";
    sp_head_init(&c->head);
    sf_buf_init(&c->out, SP_HEAD_MAX * 2);
    SF_LIST_PUSH(sb->conns, c);
    sb->conns_n++;
    if (!(c->cl = bufferevent_socket_new(ctx->d.base, fd, BEV_OPT_CLOSE_ON_FREE))) {
        close(fd);
        conn_free(c);
        return;
    }
    bufferevent_setcb(c->cl, on_cl_read, on_drained, on_cl_event, c);
    bufferevent_setwatermark(c->cl, EV_READ, 0, HIGH_WATER); /* bounded while we decide */
    set_idle(c, c->cl);
    if (explicit_proxy) {
        c->state = ST_HTTP;
        c->proto = "http";
        llhttp_init(&c->req, HTTP_REQUEST, &req_settings);
        c->req.data = c;
    } else {
        struct timeval t = {ctx->cfg.proxy_sniff_timeout_ms / 1000,
                            (ctx->cfg.proxy_sniff_timeout_ms % 1000) * 1000};
        c->state = ST_SNIFF;
        if ((c->ev_sniff = evtimer_new(ctx->d.base, on_sniff_timeout, c)))
            evtimer_add(c->ev_sniff, &t);
    }
    if (rd_start(c, c->cl, 1) < 0)
        bufferevent_enable(c->cl, EV_READ | EV_WRITE);
    else
        bufferevent_enable(c->cl, EV_WRITE);
}

static void conn_free(sp_conn *c)
{
    sp_sandbox *sb = c->sb;

    if (c->up)
        upstream_end(c, "allowed", NULL);
    sp_resolve_cancel(c->rq);
    if (c->ev_sniff)
        event_free(c->ev_sniff);
    if (c->ev_close)
        event_free(c->ev_close);
    rd_stop(c, c->cl, 0);
    if (c->cl)
        bufferevent_free(c->cl);
    SF_LIST_UNLINK(sb->conns, c);
    sb->conns_n--;
    sp_head_fini(&c->head);
    sf_buf_fini(&c->out);
    free(c);
    sp_sandbox_unref(sb);
}

void sp_conn_close_all(sp_sandbox *sb)
{
    while (sb->conns)
        conn_free(sb->conns);
}

/* ---------- tunnels ---------- */

static void tunnel_start(sp_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->cl);

    c->state = ST_TUNNEL;
    if (evbuffer_get_length(in)) {
        c->up_b += evbuffer_get_length(in);
        put_buf(c, c->up, in, evbuffer_get_length(in));
    }
    read_set(c, c->cl, 1);
}

/* Connects to dst and tunnels (the sniffed bytes go first). */
static void tunnel_to(sp_conn *c, const char *name, uint32_t ip, int port)
{
    if (upstream_open(c, name, ip, port, 0) < 0) {
        log_entry(c, name, ip, port, "failed", "cannot connect", 0, 0, 0);
        close_after_flush(c);
        return;
    }
    tunnel_start(c);
}

/* ---------- TLS: terminate or tunnel ---------- */

static void on_term_event(struct bufferevent *bev, short what, void *arg)
{
    sp_conn *c = arg;

    if (what & BEV_EVENT_CONNECTED)
        return; /* the sandbox accepted our certificate */
    if (!(what & BEV_EVENT_EOF) && c->state == ST_HTTP && !c->in_msg && !c->pending) {
        const char *why = ssl_reason(bev);
        log_entry(c, c->name, c->dst_ip, c->dst_port, "failed",
                  why ? why : "TLS handshake with the sandbox failed", 0, 0, 0);
    }
    on_cl_event(bev, what, arg);
}

/* Terminates the client's TLS with a certificate for c->name; HTTP follows. */
static void terminate(sp_conn *c)
{
    SSL *ssl = sp_tls_server(c->ctx->tls, c->name);
    struct bufferevent *f;

    rd_stop(c, c->cl, 1); /* the TLS filter reads through the socket's bufferevent */
    if (!ssl || !(f = bufferevent_openssl_filter_new(c->ctx->d.base, c->cl, ssl,
                                                     BUFFEREVENT_SSL_ACCEPTING,
                                                     BEV_OPT_CLOSE_ON_FREE))) {
        if (ssl)
            SSL_free(ssl);
        log_entry(c, c->name, c->dst_ip, c->dst_port, "failed", "cannot mint a certificate", 0,
                  0, 0);
        close_after_flush(c);
        return;
    }
    c->cl = f; /* the filter owns the socket's bufferevent now */
    c->tls_term = 1;
    c->state = ST_HTTP;
    c->proto = "https";
    llhttp_init(&c->req, HTTP_REQUEST, &req_settings);
    c->req.data = c;
    bufferevent_setcb(f, on_cl_read, on_drained, on_term_event, c);
    bufferevent_setwatermark(f, EV_READ, 0, HIGH_WATER);
    set_idle(c, f);
    bufferevent_enable(f, EV_READ | EV_WRITE);
}

/* The connection's name and address are settled and allowed: TLS goes on. */
static void tls_allowed(sp_conn *c)
{
    if (c->name[0] && c->ctx->tls && sp_sandbox_has_secret_for(c->sb, c->name))
        terminate(c);
    else
        tunnel_to(c, c->name, c->dst_ip, c->dst_port);
}

static void on_sni_resolved(void *arg, const sp_addrs *a)
{
    sp_conn *c = arg;
    const char *reason;

    c->rq = NULL;
    if (!sp_addrs_has(a, c->dst_ip)) {
        block_silent(c, c->name, c->dst_ip, c->dst_port,
                     a->err ? "the TLS server name does not resolve"
                            : "the TLS server name does not match the destination address");
        return;
    }
    if (!sp_decide(&c->ctx->policy, c->sb->rules, c->name, c->dst_ip, &reason)) {
        block_silent(c, c->name, c->dst_ip, c->dst_port, reason);
        return;
    }
    tls_allowed(c);
}

static void sniffed_tls(sp_conn *c, const char *sni)
{
    const char *reason;

    c->proto = "tls";
    if (c->explicit_proxy) { /* after CONNECT: c->name is the CONNECT host, already allowed */
        if (*sni && strcasecmp(sni, c->name) != 0) {
            block_silent(c, sni, c->dst_ip, c->dst_port,
                         "the TLS server name does not match the CONNECT host");
            return;
        }
        tls_allowed(c);
        return;
    }
    if (!*sni) {
        if (!sp_decide(&c->ctx->policy, c->sb->rules, NULL, c->dst_ip, &reason)) {
            block_silent(c, NULL, c->dst_ip, c->dst_port, reason);
            return;
        }
        tunnel_to(c, NULL, c->dst_ip, c->dst_port);
        return;
    }
    snprintf(c->name, sizeof(c->name), "%s", sni);
    if (!sp_name_lookup_allowed(&c->ctx->policy, c->sb->rules, c->name)) {
        block_silent(c, c->name, c->dst_ip, c->dst_port, SP_REASON_NAME);
        return;
    }
    if (!(c->rq = sp_resolve(c->ctx->resolver, c->sb->rcache, c->name, on_sni_resolved, c)))
        close_after_flush(c); /* out of memory */
}

static void sniffed_raw(sp_conn *c)
{
    const char *reason;

    c->proto = "tcp";
    if (c->explicit_proxy) { /* after CONNECT: judged by name already */
        tunnel_to(c, c->name, c->dst_ip, c->dst_port);
        return;
    }
    if (!sp_decide(&c->ctx->policy, c->sb->rules, NULL, c->dst_ip, &reason)) {
        block_silent(c, NULL, c->dst_ip, c->dst_port, reason);
        return;
    }
    tunnel_to(c, NULL, c->dst_ip, c->dst_port);
}

static void on_sniff_timeout(evutil_socket_t fd, short what, void *arg)
{
    sp_conn *c = arg;

    if (c->state == ST_SNIFF && !c->rq)
        sniffed_raw(c); /* a protocol where the server speaks first */
}

static int looks_http(const unsigned char *p, size_t n)
{
    size_t i = 0;

    while (i < n && i < 16 && p[i] >= 'A' && p[i] <= 'Z')
        i++;
    return i > 0 && (i == n || (i < n && p[i] == ' '));
}

static void sniff(sp_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->cl);
    size_t n = evbuffer_get_length(in);
    unsigned char *p;
    char sni[SP_NAME_MAX];
    int rc;

    if (n == 0 || c->rq)
        return;
    p = evbuffer_pullup(in, (ev_ssize_t)(n < SNIFF_MAX ? n : SNIFF_MAX));
    if (p[0] == 0x16) {
        rc = sp_tls_sni(p, n < SNIFF_MAX ? n : SNIFF_MAX, sni);
        if (rc == -EAGAIN && n < SNIFF_MAX)
            return;
        event_del(c->ev_sniff);
        if (rc == 0) {
            sniffed_tls(c, sni);
            return;
        }
    } else if (looks_http(p, n < 16 ? n : 16)) {
        if (n < 17 && !memchr(p, ' ', n))
            return; /* wait for the whole method */
        event_del(c->ev_sniff);
        c->state = ST_HTTP;
        c->proto = "http";
        llhttp_init(&c->req, HTTP_REQUEST, &req_settings);
        c->req.data = c;
        http_process(c);
        return;
    }
    event_del(c->ev_sniff);
    sniffed_raw(c);
}

static void on_cl_read(struct bufferevent *bev, void *arg)
{
    sp_conn *c = arg;

    switch (c->state) {
    case ST_SNIFF:
        sniff(c);
        break;
    case ST_HTTP:
        http_process(c);
        break;
    case ST_TUNNEL:
        if (c->up) {
            size_t n = evbuffer_get_length(bufferevent_get_input(bev));
            c->up_b += n;
            put_buf(c, c->up, bufferevent_get_input(bev), n);
            pressure(c, c->cl, c->up);
        }
        break;
    default:
        evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
    }
}

/* A response is complete. 1 when the upstream (or the connection) went away. */
static int after_response(sp_conn *c)
{
    if (c->pending > 0)
        return 0;
    if (c->deferred) {
        refuse(c, c->def_status, c->def_host, c->def_ip, c->def_port, c->def_reason);
        return 1;
    }
    if (c->client_done) {
        close_after_flush(c);
        return 1;
    }
    if (c->awaiting && !c->rq && c->want_ip) { /* an upstream switch was waiting */
        switch_or_write(c, c->path_host, c->want_ip, c->req_port);
        return 1;
    }
    read_set(c, c->cl, 1);
    if (!c->busy && !c->awaiting)
        http_process(c);
    return c->state != ST_HTTP;
}

static void on_up_read(struct bufferevent *bev, void *arg)
{
    sp_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    if (c->state == ST_TUNNEL || c->state == ST_SNIFF) {
        size_t n = evbuffer_get_length(in);
        c->down_b += n;
        put_buf(c, c->cl, in, n);
        pressure(c, c->up, c->cl);
        return;
    }
    if (c->state != ST_HTTP)
        return;
    /* HTTP: frame the responses, relay the bytes as they are */
    while (evbuffer_get_length(in) && c->up == bev) {
        struct evbuffer_iovec v;
        llhttp_errno_t err;
        size_t used;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        used = feed(&c->rsp, v.iov_base, v.iov_len, &err);
        c->down_b += used;
        put_buf(c, c->cl, in, used);
        if (err != HPE_OK) {
            if (err == HPE_PAUSED) {
                llhttp_resume(&c->rsp);
                if (after_response(c))
                    return;
                continue;
            }
            /* the upstream broke HTTP (or spoke after "Connection: close"): stop here */
            evbuffer_drain(in, evbuffer_get_length(in));
            upstream_end(c, "allowed", NULL);
            close_after_flush(c);
            return;
        }
    }
    if (c->state == ST_HTTP && c->up)
        pressure(c, c->up, c->cl);
}

/* ---------- HTTP requests ---------- */

static void http_bad(sp_conn *c, int status, const char *why)
{
    refuse(c, status, c->path_host, 0, c->req_port, why);
}

static void write_head(sp_conn *c);
static void decide_request(sp_conn *c);
static void connect_established(sp_conn *c);

static void switch_or_write(sp_conn *c, const char *name, uint32_t ip, int port)
{
    if (c->up && (c->up_ip != ip || c->up_port != port || strcmp(c->up_name, name))) {
        if (c->pending > 0)
            return; /* resumed when the last owed response is complete */
        upstream_end(c, "allowed", NULL);
    }
    if (!c->up && upstream_open(c, name, ip, port, c->tls_term) < 0) {
        refuse(c, 502, name, ip, port, "cannot connect to the upstream");
        return;
    }
    write_head(c);
}

static void on_req_resolved(void *arg, const sp_addrs *a)
{
    sp_conn *c = arg;
    const char *host = c->path_host, *reason = "no such name";
    uint32_t ip = 0;
    int ok = 0;

    c->rq = NULL;
    if (c->fixed) {
        /* the destination is settled: the name must resolve to it */
        if (!sp_addrs_has(a, c->dst_ip)) {
            refuse(c, 403, host, c->dst_ip, c->req_port,
                   a->err ? "the Host header does not resolve"
                          : "the Host header does not match the destination address");
            return;
        }
        ip = c->dst_ip;
        ok = sp_decide(&c->ctx->policy, c->sb->rules, host, ip, &reason);
    } else {
        for (int i = 0; i < a->n && !ok; i++) {
            ip = a->ip[i];
            ok = sp_decide(&c->ctx->policy, c->sb->rules, host, ip, &reason);
        }
        if (a->n == 0) {
            const char *why = a->err == -EAGAIN ? "the name could not be resolved; retry"
                                                : "the name does not resolve";
            log_entry(c, host, 0, c->req_port, "failed", why, 0, 0, 0);
            refuse(c, 502, host, 0, c->req_port, why);
            return;
        }
    }
    if (!ok) {
        refuse(c, 403, host, ip, c->req_port, reason);
        return;
    }
    if (!strcmp(c->method, "CONNECT")) {
        c->dst_ip = ip;
        connect_established(c);
        return;
    }
    c->want_ip = ip;
    switch_or_write(c, host, ip, c->req_port);
}

static void write_head(sp_conn *c)
{
    int injected = 0, foreign = 0;

    sf_buf_reset(&c->out);
    if (sp_head_write(&c->out, c->method, c->path, c->http_minor, &c->head, c->sb, c->path_host,
                      c->tls_term, &injected, &foreign) < 0) {
        http_bad(c, 431, "the request head is too large");
        return;
    }
    if (foreign && c->ctx->cfg.proxy_refuse_unmatched) {
        sodium_memzero(c->out.p, c->out.len);
        refuse(c, 403, c->path_host, c->up_ip, c->req_port,
               "the request carries a secret placeholder where that secret may not go (another "
               "host, another header, or plain HTTP)");
        return;
    }
    if (foreign)
        sf_info("msg=\"placeholder sent unchanged: its secret may not go there\" "
                "sandbox=%s host=%s", c->sb->id, c->path_host);
    c->secret |= injected > 0;
    c->foreign |= foreign > 0;
    c->up_b += c->out.len;
    put_mem(c, c->up, c->out.p, c->out.len);
    if (injected)
        sodium_memzero(c->out.p, c->out.len);
    c->fifo[(c->fifo_head + c->pending) % FIFO_MAX] = !strcmp(c->method, "HEAD");
    c->pending++;
    c->awaiting = 0;
    c->want_ip = 0;
    if (c->upgrade) { /* WebSocket and friends: bytes both ways from here on */
        evbuffer_drain(bufferevent_get_input(c->cl), c->head_left);
        c->head_left = 0;
        tunnel_start(c);
        return;
    }
    llhttp_resume(&c->req);
    if (!c->busy)
        http_process(c);
}

/* 1 when the token tok is in the comma-separated list v (case-insensitive). */
static int has_token(const char *v, const char *tok)
{
    size_t n = strlen(tok);

    while (v && *v) {
        v += strspn(v, " \t,");
        size_t l = strcspn(v, ",");
        size_t e = l;
        while (e && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e == n && !strncasecmp(v, tok, n))
            return 1;
        v += l;
    }
    return 0;
}

/* Checks every request must pass whatever its target (no name resolved yet): one Host,
 * no TRACE, Upgrade only as a well-formed WebSocket handshake. 0, or refused (-1). */
static int request_hygiene(sp_conn *c)
{
    const char *up = NULL;
    int hosts = 0;

    for (int i = 0; i < c->head.n; i++) {
        if (!strcasecmp(c->head.hdrs[i].name, "host"))
            hosts++;
        else if (!strcasecmp(c->head.hdrs[i].name, "upgrade")) {
            if (up) {
                http_bad(c, 400, "a request may carry one Upgrade header");
                return -1;
            }
            up = c->head.hdrs[i].value;
        }
    }
    if (hosts > 1) {
        http_bad(c, 400, "a request must carry exactly one Host header");
        return -1;
    }
    if (!strcmp(c->method, "TRACE") || !strcmp(c->method, "TRACK")) {
        refuse(c, 405, c->path_host, 0, c->req_port, "TRACE is not allowed through the proxy "
               "(it would echo the request's headers back); use another method");
        return -1;
    }
    if (!up && !c->upgrade)
        return 0;
    if (!up || strcasecmp(up, "websocket") || strcmp(c->method, "GET") ||
        !has_token(sp_head_get(&c->head, "connection"), "upgrade") ||
        !sp_head_get(&c->head, "sec-websocket-key") ||
        !sp_head_get(&c->head, "sec-websocket-version")) {
        http_bad(c, 400, "Upgrade is accepted only for WebSocket: a GET with 'Upgrade: "
                 "websocket', 'Connection: Upgrade', Sec-WebSocket-Key and "
                 "Sec-WebSocket-Version");
        return -1;
    }
    return 0;
}

/* A whole request head is parsed: work out where it goes. */
static void decide_request(sp_conn *c)
{
    const char *host_hdr = sp_head_get(&c->head, "host"), *te;
    const char *url = c->head.url.p ? c->head.url.p : "";
    char hh[SP_NAME_MAX];
    int hp = 0, def_port = c->fixed ? c->dst_port : 80;
    sp_addrs known;

    c->awaiting = 1;
    c->req_port = def_port;
    copy_str(c->path_host, sizeof(c->path_host), c->name);
    if (request_hygiene(c) < 0)
        return;
    if ((te = sp_head_get(&c->head, "transfer-encoding")) &&
        (strcasecmp(te, "chunked") || sp_head_get(&c->head, "content-length"))) {
        http_bad(c, 400, "only 'Transfer-Encoding: chunked', without Content-Length, is "
                         "accepted");
        return;
    }
    if (!strcmp(c->method, "CONNECT")) {
        if (!c->explicit_proxy || c->fixed ||
            sp_hostport(url, strlen(url), c->path_host, &c->req_port, 443) < 0) {
            http_bad(c, 400, "CONNECT takes host:port and only on the proxy port");
            return;
        }
        c->proto = "tls";
        if (!sp_name_lookup_allowed(&c->ctx->policy, c->sb->rules, c->path_host)) {
            refuse(c, 403, c->path_host, 0, c->req_port, SP_REASON_NAME);
            return;
        }
        if (!(c->rq = sp_resolve(c->ctx->resolver, c->sb->rcache, c->path_host,
                                 on_req_resolved, c)))
            refuse(c, 503, c->path_host, 0, c->req_port, SF_MSG_PROXY_NOMEM_WHY);
        return;
    }
    if (!strncasecmp(url, "http://", 7)) {
        if (sp_url_split(url, c->path_host, &c->req_port, &c->path) < 0) {
            http_bad(c, 400, "the request URL is not a valid http:// URL");
            return;
        }
        if (!host_hdr) {
            http_bad(c, 400, "a request with an absolute URL needs a Host header naming the "
                             "URL's host");
            return;
        }
        if (c->fixed && (strcasecmp(c->path_host, c->name[0] ? c->name : c->path_host) ||
                         c->req_port != def_port)) {
            refuse(c, 403, c->path_host, c->dst_ip, c->req_port,
                   "the request URL does not match the connection's destination");
            return;
        }
    } else if (c->explicit_proxy && !c->fixed) {
        http_bad(c, 400, "requests to the proxy need an absolute http:// URL (use HTTP_PROXY) "
                         "or CONNECT");
        return;
    } else if (url[0] != '/' && strcmp(url, "*")) {
        http_bad(c, 400, "the request target must start with /");
        return;
    } else {
        c->path = url;
        if (!host_hdr || sp_hostport(host_hdr, strlen(host_hdr), c->path_host, &c->req_port,
                                     def_port) < 0) {
            http_bad(c, 400, "a valid Host header is required");
            return;
        }
        host_hdr = NULL; /* it named the target itself */
    }
    if (host_hdr) {
        if (sp_hostport(host_hdr, strlen(host_hdr), hh, &hp, c->req_port) < 0 ||
            strcmp(hh, c->path_host) || hp != c->req_port) {
            refuse(c, 403, c->path_host, 0, c->req_port,
                   "the Host header does not match the request URL");
            return;
        }
    }
    if (c->fixed && c->name[0] && strcmp(c->path_host, c->name)) {
        refuse(c, 403, c->path_host, c->dst_ip, c->req_port,
               c->tls_term ? "the Host header does not match the TLS server name"
                           : "the Host header does not match the CONNECT host");
        return;
    }
    if (c->fixed && c->req_port != c->dst_port) {
        refuse(c, 403, c->path_host, c->dst_ip, c->req_port,
               "the Host header's port does not match the destination port");
        return;
    }
    /* Known at once (keep-alive requests to the same host): judged now. Safe here: this
     * path answers or writes before it could close, so c outlives the call. */
    if (sp_resolve_peek(c->sb->rcache, c->path_host, &known) == 0) {
        on_req_resolved(c, &known);
        return;
    }
    if (!sp_name_lookup_allowed(&c->ctx->policy, c->sb->rules, c->path_host)) {
        refuse(c, 403, c->path_host, c->fixed ? c->dst_ip : 0, c->req_port, SP_REASON_NAME);
        return;
    }
    if (!(c->rq = sp_resolve(c->ctx->resolver, c->sb->rcache, c->path_host, on_req_resolved,
                             c)))
        refuse(c, 503, c->path_host, 0, c->req_port, SF_MSG_PROXY_NOMEM_WHY);
}

/* After CONNECT was judged: answer 200 and sniff what the sandbox sends. */
static void connect_established(sp_conn *c)
{
    evbuffer_drain(bufferevent_get_input(c->cl), c->head_left); /* the head's last byte */
    c->head_left = 0;
    evbuffer_add_printf(bufferevent_get_output(c->cl),
                        "HTTP/1.1 200 Connection established\r\n\r\n");
    c->state = ST_SNIFF;
    c->fixed = 1;
    c->awaiting = 0;
    snprintf(c->name, sizeof(c->name), "%s", c->path_host);
    c->dst_port = c->req_port;
    if (c->ev_sniff || (c->ev_sniff = evtimer_new(c->ctx->d.base, on_sniff_timeout, c))) {
        struct timeval t = {c->ctx->cfg.proxy_sniff_timeout_ms / 1000,
                            (c->ctx->cfg.proxy_sniff_timeout_ms % 1000) * 1000};
        evtimer_add(c->ev_sniff, &t);
    }
    sniff(c);
}

static void http_process_loop(sp_conn *c);

static void http_process(sp_conn *c)
{
    c->busy = 1;
    http_process_loop(c);
    if (c->state == ST_HTTP) {
        c->busy = 0;
        if (c->up)
            pressure(c, c->cl, c->up);
    }
}

static void http_process_loop(sp_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->cl);

    while (c->state == ST_HTTP && !c->awaiting && !c->client_done && evbuffer_get_length(in)) {
        struct evbuffer_iovec v;
        llhttp_errno_t err;
        size_t used;
        if (!c->in_msg) {
            struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
            size_t hl;
            const char *why;
            if (end.pos < 0) {
                if (evbuffer_get_length(in) > SP_HEAD_MAX)
                    http_bad(c, 431, SF_MSG_PROXY_HEAD_TOO_LARGE_WHY);
                return;
            }
            hl = (size_t)end.pos + 4;
            if (hl > SP_HEAD_MAX) {
                http_bad(c, 431, SF_MSG_PROXY_HEAD_TOO_LARGE_WHY);
                return;
            }
            if (sp_head_prescan((const char *)evbuffer_pullup(in, (ev_ssize_t)hl), hl, &why) <
                0) {
                http_bad(c, 400, why);
                return;
            }
            if (c->pending >= FIFO_MAX) {
                read_set(c, c->cl, 0); /* resumed as responses complete */
                return;
            }
            c->in_msg = 1;
            c->head_left = hl;
        }
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            return;
        used = feed(&c->req, v.iov_base, v.iov_len, &err);
        evbuffer_drain(in, used);
        c->head_left = used >= c->head_left ? 0 : c->head_left - used;
        if (err == HPE_PAUSED) {
            if (c->msg_done) {
                c->msg_done = 0;
                c->in_msg = 0;
                llhttp_resume(&c->req);
                continue;
            }
            if (c->head_ready) {
                c->head_ready = 0;
                if (c->head.too_big) {
                    http_bad(c, 431, "the request has too many or too large headers");
                    return;
                }
                decide_request(c);
            }
            continue;
        }
        if (err != HPE_OK) {
            http_bad(c, 400, llhttp_get_error_reason(&c->req) ? llhttp_get_error_reason(&c->req)
                                                               : "the request is not valid HTTP/1.1");
            return;
        }
    }
}

/* ---------- parser callbacks ---------- */

static int rq_begin(llhttp_t *p)
{
    sp_conn *c = p->data;

    sp_head_reset(&c->head);
    return 0;
}

static int rq_url(llhttp_t *p, const char *at, size_t n)
{
    sp_conn *c = p->data;

    if (sf_buf_append(&c->head.url, at, n) < 0)
        c->head.too_big = 1;
    return 0;
}

static int rq_field(llhttp_t *p, const char *at, size_t n)
{
    sp_head_field(&((sp_conn *)p->data)->head, at, n);
    return 0;
}

static int rq_value(llhttp_t *p, const char *at, size_t n)
{
    sp_head_value(&((sp_conn *)p->data)->head, at, n);
    return 0;
}

static int rq_headers_done(llhttp_t *p)
{
    sp_conn *c = p->data;

    sp_head_end(&c->head);
    copy_str(c->method, sizeof(c->method), llhttp_method_name((llhttp_method_t)p->method));
    c->http_minor = p->http_minor > 1 ? 1 : p->http_minor;
    c->chunked = (p->flags & F_CHUNKED) != 0;
    c->upgrade = llhttp_get_upgrade(p) && p->method != HTTP_CONNECT;
    c->keepalive = llhttp_should_keep_alive(p);
    c->head_ready = 1;
    return HPE_PAUSED;
}

static int rq_body(llhttp_t *p, const char *at, size_t n)
{
    sp_conn *c = p->data;

    if (!c->up)
        return 0;
    if (c->chunked)
        evbuffer_add_printf(bufferevent_get_output(c->up), "%zx\r\n", n);
    bufferevent_write(c->up, at, n);
    if (c->chunked)
        bufferevent_write(c->up, "\r\n", 2);
    c->up_b += n;
    return 0;
}

static int rq_done(llhttp_t *p)
{
    sp_conn *c = p->data;

    if (c->up && c->chunked)
        bufferevent_write(c->up, "0\r\n\r\n", 5);
    if (!c->keepalive)
        c->client_done = 1;
    c->msg_done = 1;
    return HPE_PAUSED;
}

static int rs_headers_done(llhttp_t *p)
{
    sp_conn *c = p->data;

    if (p->status_code / 100 == 1)
        return 0;
    return c->pending > 0 && c->fifo[c->fifo_head] ? 1 : 0; /* HEAD: no body */
}

static int rs_done(llhttp_t *p)
{
    sp_conn *c = p->data;

    if (p->status_code / 100 == 1 || c->pending == 0)
        return 0; /* interim response */
    c->fifo_head = (c->fifo_head + 1) % FIFO_MAX;
    c->pending--;
    return HPE_PAUSED; /* on_up_read acts on it (the upstream may go away) */
}

__attribute__((constructor)) static void settings_init(void)
{
    llhttp_settings_init(&req_settings);
    llhttp_settings_init(&rsp_settings);
    req_settings.on_message_begin = rq_begin;
    req_settings.on_url = rq_url;
    req_settings.on_header_field = rq_field;
    req_settings.on_header_value = rq_value;
    req_settings.on_headers_complete = rq_headers_done;
    req_settings.on_body = rq_body;
    req_settings.on_message_complete = rq_done;
    rsp_settings.on_headers_complete = rs_headers_done;
    rsp_settings.on_message_complete = rs_done;
}
