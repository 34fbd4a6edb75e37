/* mcp_load: the MCP load client of tests/bench/fleet. CONNS keep-alive HTTP/1.1
 * connections on one epoll thread POST JSON-RPC bodies for SECS seconds, as fast as the
 * answers come or paced to RATE calls/s over all connections (0: unpaced). Connection i
 * sends line i % lines of BODIES to URL i % urls. An answer counts when its status is 200
 * and its body holds MATCH (e.g. "isError":false); anything else is an error. Latency runs
 * from a call's send to its whole answer. Prints one line:
 *   n=.. errors=.. secs=.. rps=.. p50_ms=.. p99_ms=..
 * usage: mcp_load SECS RATE CONNS KEY MATCH BODIES URL... */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CONNS_MAX 1024
#define LINES_MAX 256
#define LINE_MAX_BYTES 4096
#define IN_MAX (256 * 1024)
#define DRAIN_MS 30000

typedef struct conn {
    int fd;
    char *req;
    size_t req_len, sent;
    char in[IN_MAX];
    size_t in_len;
    long t_send;  /* µs; 0: idle */
    long wake_at; /* µs: its next send */
    int idle;     /* 1: waiting to send (wake_at set), 0: waiting for an answer or closed */
} conn;

static conn conns[CONNS_MAX];
static long *lat;
static size_t nlat, caplat;
static long errors;

static long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

/* "http://IP:PORT/path" */
static int parse_url(const char *url, struct sockaddr_in *sin, char *path, size_t pathlen)
{
    char ip[64];
    int port, n = 0;

    if (sscanf(url, "http://%63[0-9.]:%d%n", ip, &port, &n) != 2 || port <= 0 || port > 65535)
        return -1;
    memset(sin, 0, sizeof(*sin));
    sin->sin_family = AF_INET;
    sin->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, ip, &sin->sin_addr) != 1)
        return -1;
    snprintf(path, pathlen, "%s", url[n] ? url + n : "/");
    return 0;
}

static int c_open(conn *c, const struct sockaddr_in *sin, int ep)
{
    int one = 1;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};

    if ((c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        connect(c->fd, (const struct sockaddr *)sin, sizeof(*sin)) < 0)
        return -1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
}

/* Blocking write of the whole request (small; the socket buffer takes it at once). */
static int c_send(conn *c)
{
    c->sent = 0;
    while (c->sent < c->req_len) {
        ssize_t n = write(c->fd, c->req + c->sent, c->req_len - c->sent);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        c->sent += (size_t)n;
    }
    c->in_len = 0;
    c->t_send = now_us();
    return 0;
}

/* 1: a whole answer is in (ok says whether it counts), 0: more to read, -1: broken. */
static int c_answer(conn *c, const char *match, int *ok)
{
    char *end, *cl;
    long len = -1;
    size_t head;

    c->in[c->in_len] = '\0';
    if (!(end = strstr(c->in, "\r\n\r\n")))
        return c->in_len >= IN_MAX - 1 ? -1 : 0;
    head = (size_t)(end - c->in) + 4;
    for (cl = c->in; (cl = strchr(cl, '\n')) && cl < end; cl++)
        if (!strncasecmp(cl + 1, "content-length:", 15))
            len = strtol(cl + 16, NULL, 10);
    if (len < 0 || head + (size_t)len >= IN_MAX)
        return -1;
    if (c->in_len < head + (size_t)len)
        return 0;
    *ok = !strncmp(c->in, "HTTP/1.1 200", 12) && strstr(c->in + head, match) != NULL;
    return 1;
}

static void record(long us)
{
    if (nlat == caplat) {
        size_t cap = caplat ? caplat * 2 : 65536;
        long *n = realloc(lat, cap * sizeof(long));
        if (!n)
            return;
        lat = n;
        caplat = cap;
    }
    lat[nlat++] = us;
}

int main(int argc, char **argv)
{
    static char lines[LINES_MAX][LINE_MAX_BYTES];
    struct sockaddr_in sins[16];
    char paths[16][256];
    int nlines = 0, nurls, secs, nconns, ep, busy = 0;
    double rate;
    long start, end, interval = 0, next_slot, last_done;
    const char *key, *match;
    FILE *f;

    if (argc < 8) {
        fprintf(stderr, "usage: mcp_load SECS RATE CONNS KEY MATCH BODIES URL...\n");
        return 2;
    }
    secs = atoi(argv[1]);
    rate = atof(argv[2]);
    nconns = atoi(argv[3]);
    key = argv[4];
    match = argv[5];
    nurls = argc - 7;
    if (secs <= 0 || rate < 0 || nconns <= 0 || nconns > CONNS_MAX || nurls > 16) {
        fprintf(stderr, "mcp_load: SECS > 0, RATE >= 0, 1-%d CONNS, at most 16 URLs\n", CONNS_MAX);
        return 2;
    }
    if (!(f = fopen(argv[6], "r"))) {
        fprintf(stderr, "mcp_load: cannot read %s\n", argv[6]);
        return 2;
    }
    while (nlines < LINES_MAX && fgets(lines[nlines], LINE_MAX_BYTES, f))
        if ((lines[nlines][strcspn(lines[nlines], "\n")] = '\0', lines[nlines][0]))
            nlines++;
    fclose(f);
    for (int i = 0; i < nurls; i++)
        if (parse_url(argv[7 + i], &sins[i], paths[i], sizeof(paths[i])) < 0) {
            fprintf(stderr, "mcp_load: %s is not http://IP:PORT/path\n", argv[7 + i]);
            return 2;
        }
    if (!nlines || (ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
        return 2;
    for (int i = 0; i < nconns; i++) {
        conn *c = &conns[i];
        const char *body = lines[i % nlines];
        int u = i % nurls;
        size_t cap = strlen(body) + strlen(key) + 512;
        if (!(c->req = malloc(cap)) || c_open(c, &sins[u], ep) < 0) {
            fprintf(stderr, "mcp_load: cannot connect to %s\n", argv[7 + u]);
            return 1;
        }
        c->req_len = (size_t)snprintf(c->req, cap,
                                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                                      "Content-Type: application/json\r\n"
                                      "Accept: application/json, text/event-stream\r\n"
                                      "Content-Length: %zu\r\n\r\n%s",
                                      paths[u], key, strlen(body), body);
    }
    start = now_us();
    end = start + secs * 1000000L;
    next_slot = start;
    if (rate > 0)
        interval = (long)(1e6 / rate);
    last_done = start;
    /* every connection starts idle: it takes a slot (paced) or sends at once */
    for (int i = 0; i < nconns; i++) {
        conns[i].idle = 1;
        conns[i].wake_at = interval ? 0 : start;
    }
    for (;;) {
        struct epoll_event evs[64];
        long now = now_us(), wait_ms = 100;
        int n;

        for (int i = 0; i < nconns; i++) {
            conn *c = &conns[i];
            if (!c->idle || c->fd < 0)
                continue;
            if (now >= end) {
                c->idle = 0;
                continue;
            }
            if (!c->wake_at) { /* paced: take the next slot */
                c->wake_at = next_slot > now ? next_slot : now;
                next_slot = c->wake_at + interval;
            }
            if (c->wake_at <= now) {
                c->idle = 0;
                if (c_send(c) < 0) {
                    errors++;
                    close(c->fd);
                    c->fd = -1;
                    continue;
                }
                busy++;
            } else if ((c->wake_at - now + 999) / 1000 < wait_ms) {
                wait_ms = (c->wake_at - now + 999) / 1000;
            }
        }
        if (now >= end && !busy)
            break;
        if (now >= end + DRAIN_MS * 1000L) {
            errors += busy; /* never answered */
            break;
        }
        n = epoll_wait(ep, evs, 64, (int)wait_ms);
        for (int i = 0; i < n; i++) {
            conn *c = evs[i].data.ptr;
            ssize_t r = read(c->fd, c->in + c->in_len, IN_MAX - 1 - c->in_len);
            int ok = 0, done;
            if (r <= 0 && !(r < 0 && (errno == EINTR || errno == EAGAIN))) {
                errors += c->t_send != 0;
                busy -= c->t_send != 0;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
                c->t_send = 0;
                continue;
            }
            if (r <= 0)
                continue;
            c->in_len += (size_t)r;
            if ((done = c_answer(c, match, &ok)) == 0)
                continue;
            last_done = now_us();
            if (done > 0 && ok)
                record(last_done - c->t_send);
            else
                errors++;
            busy--;
            c->t_send = 0;
            c->idle = 1; /* send again: at once, or (paced) in the next free slot */
            c->wake_at = interval ? 0 : now_us();
            if (done < 0) {
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
            }
        }
    }
    qsort(lat, nlat, sizeof(long), cmp_long);
    {
        double took = (double)((last_done > end ? last_done : end) - start) / 1e6;
        double p50 = nlat ? lat[nlat / 2] / 1000.0 : 0, p99 = nlat ? lat[nlat * 99 / 100] / 1000.0 : 0;
        printf("n=%zu errors=%ld secs=%.2f rps=%.1f p50_ms=%.2f p99_ms=%.2f\n", nlat, errors, took,
               (double)nlat / took, p50, p99);
    }
    return 0;
}
