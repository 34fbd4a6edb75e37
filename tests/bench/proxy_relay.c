/* sp_relay: the floor of any in-path relay, for tests/bench/proxy's reference rows. It
 * takes the secret-proxy's exact place: it enters a sandbox namespace (set up as the
 * worker does it, nftables redirecting every TCP connection to PORT), listens there on
 * 0.0.0.0:PORT, comes back to this host's namespace, and relays each accepted connection
 * to its original destination (SO_ORIGINAL_DST) over one upstream connection, parsing
 * nothing. One thread, like the proxy.
 *   epoll:   non-blocking sockets on one epoll; per ready socket one recv (64 KiB) and one
 *            send to its peer: the fewest system calls a user-space relay makes.
 *   splice:  the same, the bytes moved through a pipe per direction (splice in, splice out).
 *   uring:   io_uring: a recv posted on every socket, each completion posts the send to
 *            the peer (and, once sent, the next recv); all that is ready goes in and out in
 *            one io_uring_enter per loop turn (single issuer, deferred task work).
 *   sockmap: both sockets in a sockhash with a stream verdict program
 *            (proxy_relay.bpf.c) that redirects every segment to the peer inside the
 *            kernel; user space only accepts and connects.
 * With SP_RELAY_DST=IP:PORT every connection goes there instead (for a namespace without
 * the sandbox's nftables, where there is no original destination to ask for).
 * With SP_RELAY_TPROXY=1 the listener is transparent (IP_TRANSPARENT) and a connection's
 * destination is its local address (nftables tproxy in place of the NAT redirect).
 * Prints "ready" once listening; runs until SIGTERM/SIGINT.
 *   sp_relay NETNS_PATH PORT epoll|splice|uring|sockmap [BPF_OBJECT] */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef SP_RELAY_URING
#include <liburing.h>
#endif
#ifdef SP_RELAY_BPF
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#endif

#define MAX_FDS 65536

enum mode { M_EPOLL, M_SPLICE, M_URING, M_SOCKMAP };

typedef struct side {
    int peer;       /* the other socket's fd, -1 when free */
    int pipe[2];    /* splice: this socket's bytes on their way to the peer */
    size_t in_pipe; /* splice: bytes in that pipe */
} side;

static side sides[MAX_FDS];
static struct sockaddr_in fixed_dst; /* SP_RELAY_DST, when set */
static int tproxy;                   /* SP_RELAY_TPROXY=1: the listener is transparent */

/* The connection's destination: SP_RELAY_DST, or where the sandbox dialled. */
static int destination(int c, struct sockaddr_in *dst)
{
    socklen_t dl = sizeof(*dst);

    if (fixed_dst.sin_family) {
        *dst = fixed_dst;
        return 0;
    }
    if (tproxy) /* a TPROXY'd connection's local address is where the sandbox dialled */
        return getsockname(c, (struct sockaddr *)dst, &dl);
    return getsockopt(c, SOL_IP, SO_ORIGINAL_DST, dst, &dl);
}
static enum mode mode;
static int ep = -1, map_fd = -1;
static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void close_pair(int fd)
{
    int peer = sides[fd].peer;
    int fds[2] = {fd, peer};

    for (int i = 0; i < 2; i++) {
        int f = fds[i];
        if (f < 0 || f >= MAX_FDS)
            continue;
        if (sides[f].pipe[0] >= 0) {
            close(sides[f].pipe[0]);
            close(sides[f].pipe[1]);
        }
        sides[f] = (side){.peer = -1, .pipe = {-1, -1}};
        close(f);
    }
}

/* Writes all of buf to fd (non-blocking), waiting for room when it is full: responses
 * here are small, so this almost never waits. */
static int send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = send(fd, buf, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, 5000) <= 0)
                return -1;
            continue;
        }
        if (w <= 0)
            return -1;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

static int relay_recv(int fd)
{
    static char buf[65536];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);

    if (n < 0 && errno == EAGAIN)
        return 0;
    if (n <= 0)
        return -1;
    return send_all(sides[fd].peer, buf, (size_t)n);
}

static int relay_splice(int fd)
{
    side *s = &sides[fd];
    ssize_t n = splice(fd, NULL, s->pipe[1], NULL, 65536, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);

    if (n < 0 && errno == EAGAIN)
        return 0;
    if (n <= 0)
        return -1;
    s->in_pipe += (size_t)n;
    while (s->in_pipe > 0) {
        ssize_t w = splice(s->pipe[0], NULL, s->peer, NULL, s->in_pipe,
                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = s->peer, .events = POLLOUT};
            if (poll(&p, 1, 5000) <= 0)
                return -1;
            continue;
        }
        if (w <= 0)
            return -1;
        s->in_pipe -= (size_t)w;
    }
    return 0;
}

#ifdef SP_RELAY_BPF
static int sockmap_setup(const char *obj_path)
{
    struct bpf_object *obj = bpf_object__open_file(obj_path, NULL);
    struct bpf_program *prog;
    int err;

    if (!obj || libbpf_get_error(obj)) {
        fprintf(stderr, "sp_relay: cannot open %s\n", obj_path);
        return -1;
    }
    if ((err = bpf_object__load(obj)) < 0) {
        fprintf(stderr, "sp_relay: loading %s failed: %s\n", obj_path, strerror(-err));
        return -1;
    }
    map_fd = bpf_object__find_map_fd_by_name(obj, "sp_pairs");
    prog = bpf_object__find_program_by_name(obj, "sp_relay_verdict");
    if (map_fd < 0 || !prog) {
        fprintf(stderr, "sp_relay: %s lacks sp_pairs or sp_relay_verdict\n", obj_path);
        return -1;
    }
    if (bpf_prog_attach(bpf_program__fd(prog), map_fd, BPF_SK_SKB_STREAM_VERDICT, 0) < 0) {
        fprintf(stderr, "sp_relay: attaching the verdict program failed: %s\n", strerror(errno));
        return -1;
    }
    return 0; /* the object stays loaded for the life of the process */
}

static int cookie(int fd, uint64_t *c)
{
    socklen_t l = sizeof(*c);
    return getsockopt(fd, SOL_SOCKET, SO_COOKIE, c, &l);
}

/* Each socket goes into the sockhash under its peer's cookie; then whatever arrived
 * before (the client's first request, usually) is passed on by hand once. */
static int sockmap_pair(int a, int b)
{
    uint64_t ca, cb, va = (uint64_t)a, vb = (uint64_t)b;

    if (cookie(a, &ca) < 0 || cookie(b, &cb) < 0 ||
        bpf_map_update_elem(map_fd, &cb, &va, BPF_ANY) < 0 ||
        bpf_map_update_elem(map_fd, &ca, &vb, BPF_ANY) < 0) {
        fprintf(stderr, "sp_relay: sockhash update failed: %s\n", strerror(errno));
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        int fd = i ? b : a;
        if (relay_recv(fd) < 0 && errno != EAGAIN)
            return -1;
    }
    return 0;
}
#endif

#ifdef SP_RELAY_URING
enum { U_ACCEPT, U_RECV, U_SEND };
#define U_BUF 65536
static struct io_uring ring;
static char *ubuf[MAX_FDS];  /* per socket: what it received, until its peer took it */
static size_t usent[MAX_FDS], ulen[MAX_FDS];
static int uring_pair(int c, int up);

static struct io_uring_sqe *u_sqe(void)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

    if (!sqe) { /* full: hand what is queued to the kernel first */
        io_uring_submit(&ring);
        sqe = io_uring_get_sqe(&ring);
    }
    return sqe;
}

static void u_post(int op, int fd)
{
    struct io_uring_sqe *sqe = u_sqe();

    if (!sqe)
        return;
    if (op == U_ACCEPT)
        io_uring_prep_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
    else if (op == U_RECV)
        io_uring_prep_recv(sqe, fd, ubuf[fd], U_BUF, 0);
    else
        io_uring_prep_send(sqe, sides[fd].peer, ubuf[fd] + usent[fd], ulen[fd] - usent[fd],
                           MSG_NOSIGNAL);
    io_uring_sqe_set_data64(sqe, (uint64_t)op << 32 | (uint32_t)fd);
}

static void u_close(int fd)
{
    int peer = sides[fd].peer;

    if (peer >= 0) {
        shutdown(peer, SHUT_RDWR); /* its pending recv ends, and with it the peer's side */
        sides[peer].peer = -1;
    }
    sides[fd].peer = -1;
    free(ubuf[fd]);
    ubuf[fd] = NULL;
    close(fd);
}

static int uring_loop(int lfd)
{
    struct io_uring_params pr = {.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN};
    struct io_uring_cqe *cqe;
    unsigned head, seen;

    if (io_uring_queue_init_params(1024, &ring, &pr) < 0) {
        fprintf(stderr, "sp_relay: io_uring_queue_init failed\n");
        return 1;
    }
    u_post(U_ACCEPT, lfd);
    while (!stop) {
        if (io_uring_submit_and_wait(&ring, 1) < 0 && errno != EINTR)
            break;
        seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe)
        {
            int op = (int)(cqe->user_data >> 32), fd = (int)(uint32_t)cqe->user_data;
            seen++;
            if (op == U_ACCEPT) {
                if (cqe->res >= 0)
                    uring_pair(cqe->res, 0);
                u_post(U_ACCEPT, lfd);
            } else if (op == U_RECV) {
                if (cqe->res <= 0 || sides[fd].peer < 0) {
                    u_close(fd);
                    continue;
                }
                ulen[fd] = (size_t)cqe->res, usent[fd] = 0;
                u_post(U_SEND, fd);
            } else if (sides[fd].peer >= 0) { /* U_SEND of fd's bytes to its peer */
                if (cqe->res <= 0) {
                    continue; /* the peer is gone: fd's recv ends with the shutdown */
                }
                usent[fd] += (size_t)cqe->res;
                u_post(usent[fd] < ulen[fd] ? U_SEND : U_RECV, fd);
            }
        }
        io_uring_cq_advance(&ring, seen);
    }
    return 0;
}

static int uring_pair(int c, int up_unused)
{
    struct sockaddr_in dst;
    int one = 1, up;

    (void)up_unused;
    if (c >= MAX_FDS || destination(c, &dst) < 0) {
        close(c);
        return -1;
    }
    up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (up < 0 || up >= MAX_FDS || connect(up, (struct sockaddr *)&dst, sizeof(dst)) < 0) {
        if (up >= 0)
            close(up);
        close(c);
        return -1;
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sides[c] = (side){.peer = up, .pipe = {-1, -1}};
    sides[up] = (side){.peer = c, .pipe = {-1, -1}};
    ubuf[c] = malloc(U_BUF);
    ubuf[up] = malloc(U_BUF);
    u_post(U_RECV, c);
    u_post(U_RECV, up);
    return 0;
}
#endif

static int accept_one(int lfd)
{
    struct sockaddr_in dst;
    int one = 1, up = -1;
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

    if (c < 0)
        return 0;
    if (c >= MAX_FDS || destination(c, &dst) < 0)
        goto fail;
    /* we are in this host's namespace again: the upstream connection goes out from here */
    up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (up < 0 || up >= MAX_FDS || connect(up, (struct sockaddr *)&dst, sizeof(dst)) < 0)
        goto fail;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(c, F_SETFL, O_NONBLOCK);
    fcntl(up, F_SETFL, O_NONBLOCK);
    sides[c] = (side){.peer = up, .pipe = {-1, -1}};
    sides[up] = (side){.peer = c, .pipe = {-1, -1}};
    if (mode == M_SPLICE && (pipe2(sides[c].pipe, O_NONBLOCK | O_CLOEXEC) < 0 ||
                             pipe2(sides[up].pipe, O_NONBLOCK | O_CLOEXEC) < 0)) {
        close_pair(c);
        return 0;
    }
#ifdef SP_RELAY_BPF
    if (mode == M_SOCKMAP) {
        if (sockmap_pair(c, up) < 0) {
            close_pair(c);
            return 0;
        }
        /* the kernel relays; user space only hears of the end (EPOLLRDHUP) */
        struct epoll_event ev = {.events = EPOLLRDHUP, .data.fd = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
        ev.data.fd = up;
        epoll_ctl(ep, EPOLL_CTL_ADD, up, &ev);
        return 0;
    }
#endif
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    ev.data.fd = up;
    epoll_ctl(ep, EPOLL_CTL_ADD, up, &ev);
    return 0;
fail:
    if (up >= 0)
        close(up);
    close(c);
    return 0;
}

int main(int argc, char **argv)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    int one = 1, lfd, host_ns, sb_ns;
    struct epoll_event evs[64];

    if (argc < 4) {
        fprintf(stderr, "usage: sp_relay NETNS_PATH PORT epoll|splice|uring|sockmap [BPF_OBJECT]\n");
        return 2;
    }
    for (int i = 0; i < MAX_FDS; i++)
        sides[i] = (side){.peer = -1, .pipe = {-1, -1}};
    if (!strcmp(argv[3], "epoll"))
        mode = M_EPOLL;
    else if (!strcmp(argv[3], "splice"))
        mode = M_SPLICE;
    else if (!strcmp(argv[3], "uring"))
        mode = M_URING;
    else if (!strcmp(argv[3], "sockmap"))
        mode = M_SOCKMAP;
    else {
        fprintf(stderr, "sp_relay: unknown mode %s (epoll, splice, uring or sockmap)\n", argv[3]);
        return 2;
    }
    if (mode == M_SOCKMAP) {
#ifdef SP_RELAY_BPF
        if (sockmap_setup(argc > 4 ? argv[4] : SP_RELAY_BPF) < 0)
            return 1;
#else
        fprintf(stderr, "sp_relay: built without the BPF relay (needs clang and libbpf-dev)\n");
        return 1;
#endif
    }
    const char *fd_env = getenv("SP_RELAY_DST");
    if (fd_env && *fd_env) {
        char ip[64];
        const char *colon = strrchr(fd_env, ':');
        size_t il = colon ? (size_t)(colon - fd_env) : 0;
        if (!colon || il >= sizeof(ip)) {
            fprintf(stderr, "sp_relay: SP_RELAY_DST must be IP:PORT\n");
            return 2;
        }
        memcpy(ip, fd_env, il);
        ip[il] = '\0';
        fixed_dst.sin_family = AF_INET;
        fixed_dst.sin_port = htons((uint16_t)atoi(colon + 1));
        if (inet_pton(AF_INET, ip, &fixed_dst.sin_addr) != 1) {
            fprintf(stderr, "sp_relay: SP_RELAY_DST must be IP:PORT\n");
            return 2;
        }
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    host_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    sb_ns = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (host_ns < 0 || sb_ns < 0 || setns(sb_ns, CLONE_NEWNET) < 0) {
        fprintf(stderr, "sp_relay: cannot enter %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    a.sin_port = htons((uint16_t)atoi(argv[2]));
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    tproxy = getenv("SP_RELAY_TPROXY") && !strcmp(getenv("SP_RELAY_TPROXY"), "1");
    if (tproxy && setsockopt(lfd, SOL_IP, IP_TRANSPARENT, &one, sizeof(one)) < 0) {
        fprintf(stderr, "sp_relay: IP_TRANSPARENT: %s\n", strerror(errno));
        return 1;
    }
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 128) < 0 ||
        setns(host_ns, CLONE_NEWNET) < 0) {
        fprintf(stderr, "sp_relay: cannot listen on port %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    if (mode == M_URING) {
#ifdef SP_RELAY_URING
        fcntl(lfd, F_SETFL, 0); /* io_uring waits for it */
        return uring_loop(lfd);
#else
        fprintf(stderr, "sp_relay: built without io_uring (needs liburing-dev)\n");
        return 1;
#endif
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
    while (!stop) {
        int n = epoll_wait(ep, evs, 64, 1000);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                accept_one(lfd);
                continue;
            }
            if (sides[fd].peer < 0)
                continue; /* closed with its peer earlier in this batch */
            if (mode == M_SOCKMAP) {
                if (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                    close_pair(fd);
                continue;
            }
            if ((mode == M_SPLICE ? relay_splice(fd) : relay_recv(fd)) < 0)
                close_pair(fd);
        }
    }
    return 0;
}
