/* The preview ingress library (worker/ingress/) and its MACs (common/sf_pvtoken.c) on real
 * loopback sockets: the hop MAC against a vector computed with Python's hmac; a hop
 * admitted to a server (here a plain loopback listener standing in for the sandbox's
 * port: the namespace part is e2e.preview's), its bytes both ways and the half-close
 * passed on; replays, caps, a daemon that answers late (504) or after the client left;
 * back-pressure: a client that does not read holds the server's writes to a bound, not the
 * whole body. The local hop (a unix socket answering with the connected socket): the
 * socket passed and working, a relay's early bytes, refusals with no socket, a drop cutting
 * the passed socket, the count held until the unix connection closes, a folder with the
 * wrong mode or a link refused. The ingress runs on its own thread's loop, the clients
 * block on theirs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "ingress.h"
#include "sf_pvtoken.h"
#include "sf_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static const uint8_t KEY[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

/* ---- the stand-in for the sandbox's server: each connection runs `mode` on a thread ---- */

enum { SRV_ECHO_TILL_EOF, SRV_FLOOD, SRV_RELAY };
static int srv_fd, srv_port, srv_mode;
static atomic_llong srv_flood_written;
static atomic_int srv_accepted;

static void *srv_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[65536];
    ssize_t n;

    if (srv_mode == SRV_RELAY) {
        /* a relay as the qemu guest agent's: "<port>\n", then OK (port 8000) or ERR */
        char line[16];
        size_t k = 0;
        while (k < sizeof(line) - 1 && read(fd, line + k, 1) == 1 && line[k] != '\n')
            k++;
        line[k] = '\0';
        if (strcmp(line, "8000") != 0) {
            (void)!write(fd, "ERR\n", 4);
            close(fd);
            return NULL;
        }
        /* OK and the first bytes in one write: they go through too */
        (void)!write(fd, "OK\nhi:", 6);
        while ((n = read(fd, buf, sizeof(buf))) > 0)
            (void)!write(fd, buf, (size_t)n);
    } else if (srv_mode == SRV_ECHO_TILL_EOF) {
        /* reads everything until the client's FIN, then answers it all back and closes */
        size_t total = 0;
        char *all = malloc(1 << 20);
        while ((n = read(fd, buf, sizeof(buf))) > 0 && total + (size_t)n <= (1 << 20)) {
            memcpy(all + total, buf, (size_t)n);
            total += (size_t)n;
        }
        if (write(fd, "GOT:", 4) == 4 && write(fd, all, total) == (ssize_t)total)
            (void)0;
        free(all);
    } else {
        int sz = 65536;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
        memset(buf, 'x', sizeof(buf));
        while (atomic_load(&srv_flood_written) < (32 << 20) &&
               (n = write(fd, buf, sizeof(buf))) > 0)
            atomic_fetch_add(&srv_flood_written, n);
    }
    close(fd);
    return NULL;
}

static void *srv_main(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(srv_fd, NULL, NULL);
        pthread_t t;
        if (fd < 0)
            return NULL;
        atomic_fetch_add(&srv_accepted, 1);
        pthread_create(&t, NULL, srv_conn, (void *)(intptr_t)fd);
        pthread_detach(t);
    }
}

/* ---- the daemon's side ---- */

enum { D_ADMIT, D_HOLD, D_REFUSE_LATER };
static int d_mode;
static struct event_base *base;
static wk_ingress *ing;
static atomic_int d_opens;
static char d_last_id[64];

static int d_relay;

static void admit_now(wk_hop *h)
{
    wk_hop_target t = {.team = "team1", .relay = d_relay};
    struct sockaddr_in *sin = (struct sockaddr_in *)&t.addr;

    t.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sin->sin_family = AF_INET;
    sin->sin_port = htons((uint16_t)srv_port);
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    t.addrlen = sizeof(*sin);
    wk_ingress_admit(h, &t);
}

static void on_later(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    wk_ingress_refuse(arg, 404, "Gone meanwhile.");
}

static void on_open(void *arg, wk_hop *h, const char *id, unsigned port, uint64_t epoch)
{
    struct timeval later = {0, 400 * 1000};

    (void)arg;
    (void)port;
    (void)epoch;
    snprintf(d_last_id, sizeof(d_last_id), "%s", id);
    atomic_fetch_add(&d_opens, 1);
    if (d_mode == D_ADMIT)
        admit_now(h);
    else if (d_mode == D_REFUSE_LATER)
        event_base_once(base, -1, EV_TIMEOUT, on_later, h, &later);
    else /* D_HOLD: answered when the test ends */
        event_base_once(base, -1, EV_TIMEOUT, on_later, h, &(struct timeval){2, 0});
}

static atomic_int loop_stop;
static atomic_int drop_req; /* the test thread asks the loop for wk_ingress_drop(drop_id) */
static char drop_id[64];

/* The loop is not thread-safe: the test thread asks it to stop through a flag it polls. */
static void on_poll_stop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    if (atomic_exchange(&drop_req, 0)) {
        wk_ingress_drop(ing, drop_id, 0);
        atomic_store(&drop_req, 2); /* done */
    }
    if (atomic_load(&loop_stop))
        event_base_loopbreak(base);
}

static void *loop_main(void *arg)
{
    struct event *ev = event_new(base, -1, EV_PERSIST, on_poll_stop, NULL);
    struct timeval tick = {0, 50 * 1000};

    (void)arg;
    event_add(ev, &tick);
    event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY);
    event_free(ev);
    return NULL;
}

static int ing_port;
static pthread_t loop_thread;
static char tmpdir[64], ldir[96];

static int setup(void **state)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    pthread_t t;
    char why[256];
    wk_ingress_cfg cfg = {
        .listen = "127.0.0.1:0", .host_key = KEY, .conns_max = 8, .conns_per_sandbox = 3,
        .line_timeout_ms = 1000, .open_timeout_ms = 200, .replay_max = 64,
        .buf_max = 64 * 1024, .open = on_open,
    };

    (void)state;
    signal(SIGPIPE, SIG_IGN); /* a server thread writing to a hop that was cut */
    assert_int_equal(sodium_init() >= 0, 1);
    srv_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(bind(srv_fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(srv_fd, 64), 0);
    getsockname(srv_fd, (struct sockaddr *)&sin, &len);
    srv_port = ntohs(sin.sin_port);
    pthread_create(&t, NULL, srv_main, NULL);
    pthread_detach(t);
    base = event_base_new();
    cfg.base = base;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sf-ingress-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    snprintf(ldir, sizeof(ldir), "%s/ingress", tmpdir);
    cfg.local_dir = ldir;
    assert_int_equal(wk_ingress_new(&cfg, &ing, why, sizeof(why)), 0);
    ing_port = atoi(strrchr(wk_ingress_addr(ing), ':') + 1);
    pthread_create(&loop_thread, NULL, loop_main, NULL);
    return 0;
}

/* ---- a client ---- */

/* rcvbuf: 0, or the socket's receive buffer (set before the handshake: shrinking it on an
 * established connection stalls the kernel's window, whatever the ingress does) */
static int dial_buf(int rcvbuf)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ing_port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {5, 0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (rcvbuf)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    return fd;
}

static int dial(void)
{
    return dial_buf(0);
}

static void line_for(char *out, size_t n, const char *id, unsigned port, int64_t iat)
{
    assert_int_equal(sf_pv_hop_line(KEY, id, port, 77, iat, out, n), 0);
}

/* Everything until the ingress closes (at most n - 1 bytes), NUL-terminated. */
static size_t read_all(int fd, char *buf, size_t n)
{
    size_t got = 0;
    ssize_t r;

    while (got < n - 1 && (r = read(fd, buf + got, n - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    return got;
}

static void hop_mac_vector(void **state)
{
    char mac[SF_PV_MAC_HEX + 1], tok[SF_PV_TOKEN_MAX], msg[256], want[65], url[SF_PV_URL_MAX];
    uint8_t bin[32];
    char *f[8], *p;
    int n = 0;

    (void)state;
    sf_pv_hop_mac(KEY, "sb_test", 8000, 1765090000123001ull, 1765090000000, "0011223344556677", mac);
    assert_string_equal(mac, "2189ce1b08fe4bdd73b16bdcf8c1099cbfe3ea9c2e9c4c2cb4b06b6aa566af60");
    assert_int_equal(sf_pv_link_token(KEY, "sb_test", 8000, 1765090000123001ull, 1765093600, tok,
                                      sizeof(tok)), 0);
    for (f[n++] = tok; n < 8 && (p = strchr(f[n - 1], '.')); f[n++] = p + 1)
        *p = '\0';
    assert_int_equal(n, 7);
    assert_string_equal(f[0], "v1");
    assert_string_equal(f[1], "sb_test");
    assert_string_equal(f[4], "1765093600");
    assert_int_equal(strlen(f[5]), 16);
    snprintf(msg, sizeof(msg), "sandfleet-preview-link-v1\nsb_test\n8000\n1765090000123001\n"
             "1765093600\n%s", f[5]);
    crypto_auth_hmacsha256(bin, (const unsigned char *)msg, strlen(msg), KEY);
    sodium_bin2hex(want, sizeof(want), bin, 32);
    assert_string_equal(f[6], want);
    assert_int_equal(sf_pv_url("http", "preview.localhost:8080", "sb_ab1", 8000, NULL, url,
                               sizeof(url)), 0);
    assert_string_equal(url, "http://8000-sb-ab1.preview.localhost:8080/");
    assert_int_equal(sf_pv_url("https", "p.example.com", "sb_ab1", 3000, "v1.x", url,
                               sizeof(url)), 0);
    assert_string_equal(url, "https://3000-sb-ab1.p.example.com/?sf_token=v1.x");
    assert_non_null(sf_pv_port_refusal(3128, msg, sizeof(msg)));
    assert_non_null(sf_pv_port_refusal(3129, msg, sizeof(msg)));
    assert_non_null(sf_pv_port_refusal(49983, msg, sizeof(msg)));
    assert_non_null(sf_pv_port_refusal(1023, msg, sizeof(msg)));
    assert_non_null(sf_pv_port_refusal(65536, msg, sizeof(msg)));
    assert_null(sf_pv_port_refusal(8000, msg, sizeof(msg)));
}

static void pump_and_half_close(void **state)
{
    char line[600], buf[4096];
    int fd = dial();

    (void)state;
    d_mode = D_ADMIT;
    srv_mode = SRV_ECHO_TILL_EOF;
    line_for(line, sizeof(line), "sb_one", 8000, sf_now_ms());
    /* the line and the first bytes in one write: the bytes behind the line go through */
    strcat(line, "hello ");
    assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    assert_int_equal(write(fd, "world", 5), 5);
    shutdown(fd, SHUT_WR); /* the server answers only after our FIN reached it */
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 OK\nGOT:hello world");
    assert_string_equal(d_last_id, "sb_one");
    close(fd);
}

static void refusals(void **state)
{
    char line[600], buf[4096], bad[600];
    int fd;
    int64_t now = sf_now_ms();

    (void)state;
    d_mode = D_ADMIT;
    srv_mode = SRV_ECHO_TILL_EOF;
    /* replay: the same line twice */
    line_for(line, sizeof(line), "sb_two", 8000, now);
    fd = dial();
    assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    shutdown(fd, SHUT_WR);
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 OK\nGOT:");
    close(fd);
    fd = dial();
    assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 ERR 403 The hop was refused.\n");
    close(fd);
    /* too old, ahead, a bit flipped in the MAC, upper-case hex, two spaces */
    const int64_t iats[] = {now - 31000, now + 31000};
    for (size_t i = 0; i < 2; i++) {
        line_for(line, sizeof(line), "sb_two", 8000, iats[i]);
        fd = dial();
        assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
        read_all(fd, buf, sizeof(buf));
        assert_string_equal(buf, "SFHOP1 ERR 403 The hop was refused.\n");
        close(fd);
    }
    line_for(line, sizeof(line), "sb_two", 8000, now);
    snprintf(bad, sizeof(bad), "%s", line);
    bad[strlen(bad) - 2] = bad[strlen(bad) - 2] == '0' ? '1' : '0';
    fd = dial();
    assert_int_equal(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 ERR 403 The hop was refused.\n");
    close(fd);
    snprintf(bad, sizeof(bad), "%s", line);
    *strchr(bad, ' ') = '\0';
    fd = dial();
    dprintf(fd, "%s  %s", bad, bad + strlen(bad) + 1);
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 ERR 403 The hop was refused.\n");
    close(fd);
    /* a NUL inside the line */
    fd = dial();
    assert_int_equal(write(fd, "SFHOP1 \0x\n", 10), 10);
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 ERR 403 The hop was refused.\n");
    close(fd);
    /* silence: refused after line_timeout_ms */
    fd = dial();
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 ERR 403 The hop was refused.\n");
    close(fd);
}

static void caps_and_late_answers(void **state)
{
    char line[600], buf[4096];
    int fds[4];
    int opens;

    (void)state;
    /* the daemon holds three hops to one sandbox; the fourth is over its cap */
    d_mode = D_HOLD;
    opens = atomic_load(&d_opens);
    for (int i = 0; i < 3; i++) {
        fds[i] = dial();
        line_for(line, sizeof(line), "sb_cap", 8000, sf_now_ms());
        assert_int_equal(write(fds[i], line, strlen(line)), (ssize_t)strlen(line));
    }
    while (atomic_load(&d_opens) < opens + 3)
        usleep(1000);
    fds[3] = dial();
    line_for(line, sizeof(line), "sb_cap", 8000, sf_now_ms());
    assert_int_equal(write(fds[3], line, strlen(line)), (ssize_t)strlen(line));
    read_all(fds[3], buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 ERR 503 Sandbox sb_cap has 3 preview connections open, its "
                             "limit; retry when some closed.\n");
    close(fds[3]);
    /* the three held ones hear 504 after open_timeout_ms; the daemon answers them later */
    for (int i = 0; i < 3; i++) {
        read_all(fds[i], buf, sizeof(buf));
        assert_string_equal(buf, "SFHOP1 ERR 504 Sandbox sb_cap did not resume in time; retry "
                                 "in a few seconds.\n");
    }
    /* a client that leaves before the daemon answers */
    d_mode = D_REFUSE_LATER;
    fds[3] = dial();
    line_for(line, sizeof(line), "sb_gone", 8000, sf_now_ms());
    assert_int_equal(write(fds[3], line, strlen(line)), (ssize_t)strlen(line));
    usleep(50 * 1000);
    close(fds[3]);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    /* every hop ends once its answer came (the held ones after 2 s) */
    for (int i = 0; i < 400 && wk_ingress_open_hops(ing) > 0; i++)
        usleep(10 * 1000);
    assert_int_equal(wk_ingress_open_hops(ing), 0);
}

/* A refused client whose bytes the ingress did not read (an overlong line) reads the ERR
 * line and a clean end: the close lingers (FIN, the rest read and dropped) instead of
 * resetting the connection (e2e.preview 'an overlong line' saw ECONNRESET now and then). */
static void refusal_outlives_unread_bytes(void **state)
{
    static char big[65536];
    char buf[4096];
    size_t got = 0;
    ssize_t r = 0;
    int fd = dial();

    (void)state;
    memset(big, 'a', sizeof(big));
    memcpy(big, "SFHOP1 ", 7);
    assert_int_equal(write(fd, big, sizeof(big)), (ssize_t)sizeof(big));
    /* (the ingress reads the line's 512 bytes at most: the rest stays unread.) Not reading:
     * the hop ends by itself (at once before; after 1 s of linger now) */
    for (int i = 0; i < 500 && wk_ingress_open_hops(ing) > 0; i++)
        usleep(10 * 1000);
    assert_int_equal(wk_ingress_open_hops(ing), 0);
    /* the line, then a clean end (a reset: the line, then ECONNRESET, an error for the
     * client's library) */
    while (got < sizeof(buf) - 1 && (r = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    assert_string_equal(buf, "SFHOP1 ERR 403 The hop was refused.\n");
    assert_int_equal(r, 0);
    close(fd);
}

static void back_pressure(void **state)
{
    char line[600], buf[65536];
    int fd, sz = 16384;
    long long before, after;
    ssize_t n;
    size_t got = 0;

    (void)state;
    d_mode = D_ADMIT;
    srv_mode = SRV_FLOOD;
    atomic_store(&srv_flood_written, 0);
    fd = dial_buf(sz);
    line_for(line, sizeof(line), "sb_flood", 8000, sf_now_ms());
    assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    /* not reading: the server's writes stall once every buffer on the way is full */
    do {
        before = atomic_load(&srv_flood_written);
        usleep(300 * 1000);
        after = atomic_load(&srv_flood_written);
    } while (after != before);
    print_message("written while the client did not read: %lld bytes\n", after);
    assert_true(after < (12 << 20)); /* not the 32 MiB: socket buffers plus 2 x 64 KiB */
    /* reading on: every byte arrives */
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        got += (size_t)n;
    assert_int_equal(got, strlen("SFHOP1 OK\n") + (size_t)atomic_load(&srv_flood_written));
    close(fd);
}

static void relay(void **state)
{
    char line[600], buf[4096];
    int fd;

    (void)state;
    d_mode = D_ADMIT;
    d_relay = 1;
    srv_mode = SRV_RELAY;
    fd = dial();
    line_for(line, sizeof(line), "sb_vm", 8000, sf_now_ms());
    strcat(line, "ping");
    assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    shutdown(fd, SHUT_WR);
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 OK\nhi:ping");
    close(fd);
    fd = dial();
    line_for(line, sizeof(line), "sb_vm", 9000, sf_now_ms());
    assert_int_equal(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "SFHOP1 ERR 502 Nothing in sandbox sb_vm listens on port 9000 yet; "
                             "start the server with sandbox_exec.\n");
    close(fd);
    d_relay = 0;
}

/* ---- the local hop ---- */

static int local_dial(void)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    struct timeval tv = {5, 0};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", wk_ingress_local_path(ing));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    assert_int_equal(connect(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    return fd;
}

/* One hop over the local socket: the answer (everything of its first message, NUL-ended)
 * and the socket passed with it (-1: none). The unix connection is *conn (kept open). */
static int local_hop(const char *id, unsigned port, char *buf, size_t n, int *conn)
{
    char line[600], cbuf[CMSG_SPACE(sizeof(int) * 4)];
    struct iovec io = {buf, n - 1};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = sizeof(cbuf)};
    int fd = -1;
    ssize_t r;

    *conn = local_dial();
    line_for(line, sizeof(line), id, port, sf_now_ms());
    assert_int_equal(write(*conn, line, strlen(line)), (ssize_t)strlen(line));
    r = recvmsg(*conn, &m, MSG_CMSG_CLOEXEC);
    assert_true(r > 0);
    buf[r] = '\0';
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            assert_int_equal(c->cmsg_len, CMSG_LEN(sizeof(int))); /* one socket */
            memcpy(&fd, CMSG_DATA(c), sizeof(int));
        }
    if (fd >= 0) { /* (nonblocking as the worker made it: this client blocks, 5 s at most) */
        struct timeval tv = {5, 0};
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    return fd;
}

static void local_hop_passes_the_socket(void **state)
{
    char buf[4096];
    int conn, fd;

    (void)state;
    d_mode = D_ADMIT;
    srv_mode = SRV_ECHO_TILL_EOF;
    assert_non_null(strstr(wk_ingress_local_path(ing), "/ingress/ingress.sock"));
    fd = local_hop("sb_loc", 8000, buf, sizeof(buf), &conn);
    assert_string_equal(buf, "SFHOP1 OK 0\n");
    assert_true(fd >= 0);
    /* the socket reaches the server itself: no pump in between */
    assert_int_equal(write(fd, "hello", 5), 5);
    shutdown(fd, SHUT_WR);
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "GOT:hello");
    close(fd);
    close(conn);
    /* refusals: the TCP hop's lines, and no socket (here a daemon that answers after
     * open_timeout_ms: 504; then an altered line: 403) */
    d_mode = D_REFUSE_LATER;
    fd = local_hop("sb_loc", 8000, buf, sizeof(buf), &conn);
    assert_int_equal(fd, -1);
    assert_string_equal(buf, "SFHOP1 ERR 504 Sandbox sb_loc did not resume in time; retry in a "
                             "few seconds.\n");
    close(conn);
    d_mode = D_ADMIT;
    {
        char line[600];
        conn = local_dial();
        line_for(line, sizeof(line), "sb_loc", 8000, sf_now_ms());
        line[strlen(line) - 3] ^= 1; /* the MAC altered */
        assert_int_equal(write(conn, line, strlen(line)), (ssize_t)strlen(line));
        assert_int_equal(recv(conn, buf, sizeof(buf) - 1, 0) > 0, 1);
        assert_non_null(strstr(buf, "SFHOP1 ERR 403 The hop was refused.\n"));
        close(conn);
    }
}

static void local_relay_early_bytes(void **state)
{
    char buf[4096];
    int conn, fd;

    (void)state;
    d_mode = D_ADMIT;
    d_relay = 1;
    srv_mode = SRV_RELAY;
    fd = local_hop("sb_vm", 8000, buf, sizeof(buf), &conn);
    /* the relay's "OK\nhi:" came in one write: its "hi:" is passed along with the socket */
    assert_string_equal(buf, "SFHOP1 OK 3\nhi:");
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "ping", 4), 4);
    shutdown(fd, SHUT_WR);
    read_all(fd, buf, sizeof(buf));
    assert_string_equal(buf, "ping");
    close(fd);
    close(conn);
    fd = local_hop("sb_vm", 9000, buf, sizeof(buf), &conn);
    assert_int_equal(fd, -1);
    assert_string_equal(buf, "SFHOP1 ERR 502 Nothing in sandbox sb_vm listens on port 9000 yet; "
                             "start the server with sandbox_exec.\n");
    close(conn);
    d_relay = 0;
}

static void local_drop_cuts_the_socket(void **state)
{
    char buf[256];
    int conn, fd;
    struct pollfd p;
    ssize_t r;

    (void)state;
    d_mode = D_ADMIT;
    srv_mode = SRV_ECHO_TILL_EOF; /* the server waits for our FIN: the socket stays open */
    fd = local_hop("sb_drop", 8000, buf, sizeof(buf), &conn);
    assert_true(fd >= 0);
    p = (struct pollfd){.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 100), 0); /* open, quiet */
    snprintf(drop_id, sizeof(drop_id), "sb_drop");
    atomic_store(&drop_req, 1);
    /* the worker's shutdown() ends the socket we hold (its end, or a reset when the server
     * still wrote after it), and its end of the unix connection; at once, not at the 5 s
     * receive timeout (EAGAIN) */
    r = read(fd, buf, sizeof(buf));
    assert_true(r == 0 || (r < 0 && errno == ECONNRESET));
    assert_int_equal(read(conn, buf, sizeof(buf)), 0);
    assert_int_equal(atomic_load(&drop_req), 2);
    close(fd);
    close(conn);
}

static void local_counts_until_its_connection_closes(void **state)
{
    char buf[256];
    int conn[4], fd[4], i;

    (void)state;
    d_mode = D_ADMIT;
    srv_mode = SRV_ECHO_TILL_EOF;
    for (i = 0; i < 3; i++) { /* conns_per_sandbox 3 */
        fd[i] = local_hop("sb_cap", 8000, buf, sizeof(buf), &conn[i]);
        assert_string_equal(buf, "SFHOP1 OK 0\n");
    }
    fd[3] = local_hop("sb_cap", 8000, buf, sizeof(buf), &conn[3]);
    assert_int_equal(fd[3], -1);
    assert_string_equal(buf, "SFHOP1 ERR 503 Sandbox sb_cap has 3 preview connections open, its "
                             "limit; retry when some closed.\n");
    close(conn[3]);
    /* closing the passed socket alone keeps the count; closing the connection gives it back */
    close(fd[0]);
    fd[3] = local_hop("sb_cap", 8000, buf, sizeof(buf), &conn[3]);
    assert_int_equal(fd[3], -1);
    close(conn[3]);
    close(conn[0]);
    for (i = 0; i < 100; i++) { /* the ingress reads the end on its loop */
        fd[0] = local_hop("sb_cap", 8000, buf, sizeof(buf), &conn[0]);
        if (fd[0] >= 0)
            break;
        close(conn[0]);
        poll(NULL, 0, 50);
    }
    assert_string_equal(buf, "SFHOP1 OK 0\n");
    for (i = 0; i < 3; i++) {
        close(fd[i]);
        close(conn[i]);
    }
}

static void local_folder_checked(void **state)
{
    char why[512], dir[128], target[128];
    wk_ingress *other = NULL;
    struct event_base *b2 = event_base_new();
    wk_ingress_cfg cfg = {
        .base = b2, .listen = "127.0.0.1:0", .host_key = KEY, .conns_max = 8,
        .conns_per_sandbox = 3, .line_timeout_ms = 1000, .open_timeout_ms = 200,
        .replay_max = 64, .buf_max = 64 * 1024, .open = on_open, .local_dir = dir,
    };

    (void)state;
    /* a folder others may enter */
    snprintf(dir, sizeof(dir), "%s/open", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_true(wk_ingress_new(&cfg, &other, why, sizeof(why)) < 0);
    assert_non_null(strstr(why, "must be the worker's own with mode 0700"));
    rmdir(dir);
    /* a link where the folder should be: never followed */
    snprintf(target, sizeof(target), "%s/real", tmpdir);
    assert_int_equal(mkdir(target, 0700), 0);
    snprintf(dir, sizeof(dir), "%s/link", tmpdir);
    assert_int_equal(symlink(target, dir), 0);
    assert_true(wk_ingress_new(&cfg, &other, why, sizeof(why)) < 0);
    assert_non_null(strstr(why, "cannot make its local-hop folder"));
    unlink(dir);
    rmdir(target);
    event_base_free(b2);
}

static int teardown(void **state)
{
    (void)state;
    atomic_store(&loop_stop, 1);
    pthread_join(loop_thread, NULL);
    wk_ingress_free(ing);
    event_base_free(base);
    close(srv_fd);
    rmdir(ldir);
    rmdir(tmpdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hop_mac_vector),
        cmocka_unit_test(pump_and_half_close),
        cmocka_unit_test(refusals),
        cmocka_unit_test(caps_and_late_answers),
        cmocka_unit_test(refusal_outlives_unread_bytes),
        cmocka_unit_test(back_pressure),
        cmocka_unit_test(relay),
        cmocka_unit_test(local_hop_passes_the_socket),
        cmocka_unit_test(local_relay_early_bytes),
        cmocka_unit_test(local_drop_cuts_the_socket),
        cmocka_unit_test(local_counts_until_its_connection_closes),
        cmocka_unit_test(local_folder_checked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
