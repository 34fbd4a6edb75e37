/* agent_relay.c: inside a microVM, the preview relay (docs/internals/ingress.md). The
 * worker's ingress cannot reach the guest's loopback from the sandbox's network namespace
 * (it holds the VM's tap), so the agent forks this listener on TCP port AGENT_RELAY_PORT
 * (49983: reserved, no preview may publish it). One connection: a line "<port>\n", then
 * a connect to the guest's 127.0.0.1:<port>; "OK\n" and bytes both ways (64 KiB held per
 * direction, half-close passed on) until both sides closed, or "ERR\n" and close. Each
 * connection runs in a child of its own, so a slow one stalls nothing else. From the host
 * side only the worker's marked sockets reach it (secret-proxy/netns.c); from inside the
 * guest it gives nothing its processes lack (they reach the loopback themselves). */
#include "agent_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define AGENT_RELAY_PORT 49983
#define RELAY_BUF 65536

/* The port line, at most 6 bytes with its newline, within 10 s. 1-65535 or -1. */
static int read_port(int c)
{
    char line[8];
    size_t n = 0;
    long v = 0;

    alarm(10);
    while (n < sizeof(line)) {
        ssize_t r = read(c, line + n, 1);
        if (r <= 0)
            break;
        if (line[n] == '\n') {
            alarm(0);
            if (n == 0)
                return -1;
            for (size_t i = 0; i < n; i++) {
                if (line[i] < '0' || line[i] > '9')
                    return -1;
                v = v * 10 + (line[i] - '0');
            }
            return v >= 1 && v <= 65535 && v != AGENT_RELAY_PORT ? (int)v : -1;
        }
        n++;
    }
    alarm(0);
    return -1;
}

typedef struct dir {
    int from, to;
    char buf[RELAY_BUF];
    size_t off, len;
    int eof, shut;
} dir;

static void pump(int a, int b)
{
    static dir d[2];
    struct pollfd p[2];

    d[0] = (dir){.from = a, .to = b};
    d[1] = (dir){.from = b, .to = a};
    while (!(d[0].shut && d[1].shut)) {
        /* one poll entry per fd: what it may read (its buffer is empty) and write */
        p[0] = (struct pollfd){.fd = a};
        p[1] = (struct pollfd){.fd = b};
        for (int i = 0; i < 2; i++) {
            struct pollfd *src = &p[i], *dst = &p[1 - i];
            if (!d[i].eof && d[i].len == 0)
                src->events |= POLLIN;
            if (d[i].len > 0)
                dst->events |= POLLOUT;
        }
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        for (int i = 0; i < 2; i++) {
            struct pollfd *src = &p[i], *dst = &p[1 - i];
            if (d[i].len > 0 && (dst->revents & (POLLOUT | POLLERR | POLLHUP))) {
                ssize_t w = write(d[i].to, d[i].buf + d[i].off, d[i].len);
                if (w < 0 && errno != EAGAIN && errno != EINTR)
                    return;
                if (w > 0) {
                    d[i].off += (size_t)w;
                    d[i].len -= (size_t)w;
                }
            } else if (d[i].len == 0 && !d[i].eof && (src->revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t r = read(d[i].from, d[i].buf, sizeof(d[i].buf));
                if (r < 0 && errno != EAGAIN && errno != EINTR)
                    return;
                if (r == 0)
                    d[i].eof = 1;
                if (r > 0) {
                    d[i].off = 0;
                    d[i].len = (size_t)r;
                }
            }
            if (d[i].eof && d[i].len == 0 && !d[i].shut) {
                shutdown(d[i].to, SHUT_WR);
                d[i].shut = 1;
            }
        }
    }
}

static void serve(int c)
{
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int port = read_port(c), s, one = 1;

    if (port < 0)
        _exit(0);
    to.sin_port = htons((uint16_t)port);
    s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&to, sizeof(to)) < 0) {
        (void)!write(c, "ERR\n", 4);
        _exit(0);
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (write(c, "OK\n", 3) != 3)
        _exit(0);
    pump(c, s);
    _exit(0);
}

void agent_relay_start(void)
{
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(AGENT_RELAY_PORT),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    int l, one = 1;
    pid_t pid = fork();

    if (pid != 0)
        return; /* the agent goes on (a failed fork: no previews in this VM) */
    /* the relay keeps nothing of the agent's (its virtio port above all) */
    for (int fd = 3; fd < 1024; fd++)
        close(fd);
    signal(SIGCHLD, SIG_IGN); /* children reaped by the kernel */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, SIG_DFL);
    if ((l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        _exit(1);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(l, (struct sockaddr *)&at, sizeof(at)) < 0 || listen(l, 128) < 0) {
        fprintf(stderr, "sandfleet-agent: the preview relay cannot listen on %d: %s\n",
                AGENT_RELAY_PORT, strerror(errno));
        _exit(1);
    }
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0)
            continue;
        if (fork() == 0) {
            close(l);
            serve(c);
        }
        close(c);
    }
}
