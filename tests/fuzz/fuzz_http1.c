/* Fuzz harness for gateway/http/http1.c (through server.c).
 *
 * Each input is written, as a client would, into one end of a socketpair whose other end
 * the server adopts (gw_http_server_adopt), so the bytes take the server's real path:
 * bufferevent -> HTTP/2 preface sniffing -> http_parser -> limits -> handler ->
 * response / abort. The client then half-closes and the loop runs until the server has
 * dropped the connection; a connection that never goes away is reported as a hang.
 *
 * The handler answers by path: "/defer..." from a 0 ms timer, "/hang..." never (the
 * client's close aborts it), anything else at once. Small limits make the 413/431 paths
 * reachable with small inputs, and a buffer budget a little over max_body the budget's
 * 503 (pipelined requests behind a pending one) and its 413 (one request over the budget).
 * After each input the budget's count must be back to exactly 0.
 *
 * Built with -DSF_LIBFUZZER and -fsanitize=fuzzer it is a libFuzzer target; otherwise
 * tests/fuzz/replay.c gives it a main() that replays files (or directories), which is
 * how CTest runs the corpus in tests/fuzz/corpus/http1/. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "server.h"
#include "sf_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct event_base *base;
static gw_http_server *srv;

typedef struct deferred {
    struct event *ev;
    gw_req *req;
} deferred;

static void respond_echo(gw_req *req, int status)
{
    static const char *const hdrs[] = {"X-Fuzz", "1", "Connection", "keep-alive", NULL};
    char out[512];
    size_t blen, n = 0;
    const char *body = gw_req_body(req, &blen), *name, *value;

    n += (size_t)snprintf(out + n, sizeof(out) - n, "%s %s ? %s|", gw_req_method(req),
                          gw_req_path(req), gw_req_query(req));
    for (size_t i = 0; n < sizeof(out) && gw_req_header_at(req, i, &name, &value) == 0; i++)
        n += (size_t)snprintf(out + n, sizeof(out) - n, "%s=%s;", name, value);
    if (n > sizeof(out) - 1)
        n = sizeof(out) - 1;
    (void)gw_req_header(req, "content-type");
    (void)gw_req_target(req);
    (void)gw_req_peer(req);
    if (blen > 0 && (body[0] & 1))
        gw_req_respond(req, status, "text/plain", hdrs, body, blen);
    else
        gw_req_respond(req, status, NULL, NULL, out, n);
}

static void deferred_fire(evutil_socket_t fd, short what, void *arg)
{
    deferred *d = arg;
    respond_echo(d->req, 202);
    event_free(d->ev);
    free(d);
}

static void deferred_abort(gw_req *req, void *arg)
{
    deferred *d = arg;
    event_free(d->ev);
    free(d);
}

static void hang_abort(gw_req *req, void *arg)
{
}

static void handler(gw_req *req, void *arg)
{
    const char *path = gw_req_path(req);

    if (strncmp(path, "/defer", 6) == 0) {
        deferred *d = calloc(1, sizeof(*d));
        struct timeval zero = {0, 0};
        if (!d)
            abort();
        d->req = req;
        d->ev = evtimer_new(base, deferred_fire, d);
        if (!d->ev)
            abort();
        evtimer_add(d->ev, &zero);
        gw_req_set_abort_cb(req, deferred_abort, d);
    } else if (strncmp(path, "/hang", 5) == 0) {
        gw_req_set_abort_cb(req, hang_abort, NULL);
    } else if (strncmp(path, "/204", 4) == 0) {
        gw_req_respond(req, 204, NULL, NULL, NULL, 0);
    } else {
        respond_echo(req, 200);
    }
}

static int takeover(struct bufferevent *bev, const char *peer, void *arg)
{
    /* stands in for the HTTP/2 module: takes the connection and drops it */
    bufferevent_free(bev);
    return 0;
}

static void init_once(void)
{
    gw_http_limits lim = {.max_body = 4096, .max_header_bytes = 2048, .max_conns = 4,
                          .idle_timeout_s = 5, .max_buffered_bytes = 5120};
    if (base)
        return;
    signal(SIGPIPE, SIG_IGN);
    sf_log_init("fuzz_http1", SF_LOG_ERROR + 1); /* quiet */
    base = event_base_new();
    srv = base ? gw_http_server_new(base, NULL, -1, &lim, handler, NULL) : NULL;
    if (!srv)
        abort();
    gw_http_server_set_takeover(srv, takeover, NULL);
}

/* Runs the loop and reads (discards) the server's answers from the client end. */
static void pump(int cfd)
{
    char sink[16384];
    event_base_loop(base, EVLOOP_NONBLOCK);
    while (cfd >= 0 && recv(cfd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
        ;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct bufferevent *bev;
    int sv[2], i;
    size_t off = 0;

    init_once();
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    bev = bufferevent_socket_new(base, sv[0], BEV_OPT_CLOSE_ON_FREE);
    if (!bev || gw_http_server_adopt(srv, bev, "fuzz") < 0)
        abort();

    /* feed it all (the server may stop reading: then give up on the rest) */
    for (i = 0; off < size && i < 100000; i++) {
        ssize_t n = send(sv[1], data + off, size - off, MSG_NOSIGNAL);
        if (n > 0)
            off += (size_t)n;
        else if (n < 0 && errno != EAGAIN && errno != EINTR)
            break;
        pump(sv[1]);
    }
    shutdown(sv[1], SHUT_WR);
    for (i = 0; gw_http_server_conns(srv) > 0 && i < 100000; i++) {
        pump(sv[1]);
        if (i > 1000)
            poll(NULL, 0, 1);
    }
    close(sv[1]);
    for (i = 0; gw_http_server_conns(srv) > 0 && i < 1000; i++) {
        pump(-1);
        poll(NULL, 0, 1);
    }
    if (gw_http_server_conns(srv) > 0) {
        fprintf(stderr, "fuzz_http1: the connection did not close after the client left\n");
        abort();
    }
    if (gw_http_server_buffered(srv) != 0) {
        fprintf(stderr, "fuzz_http1: %zu request bytes still counted with no connection\n",
                gw_http_server_buffered(srv));
        abort();
    }
    /* let 0 ms timers of answered requests finish */
    pump(-1);
    return 0;
}

void sf_fuzz_cleanup(void);

/* Called by tests/fuzz/replay.c after the corpus ran. */
void sf_fuzz_cleanup(void)
{
    gw_http_server_free(srv);
    srv = NULL;
    event_base_free(base);
    base = NULL;
}
