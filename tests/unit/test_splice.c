/* common/sf_splice.c on real loopback TCP connections: a -> (splice) -> b. The test drives
 * the loop itself (one turn at a time) and does the peers' I/O between turns on
 * nonblocking sockets: every byte in order with the counters right, prepended bytes
 * first, the half-close passed on while the other way still works, back-pressure (a peer
 * that does not read holds the writer to the socket buffers plus the pipe), a reset on
 * either side, and a bandwidth allowance that pauses and resumes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sf_splice.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct fx {
    struct event_base *base;
    struct event *tick;
    int a_peer, a, b, b_peer; /* a_peer writes into a; the splice moves a -> b; b_peer reads */
    sf_splice *s;
    int done, err;
    uint64_t counted;
    size_t allow_left;        /* the allowance left (SIZE_MAX: none) */
    size_t allow_asked;       /* ...and what was granted in all */
} fx;

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

static void nonblock(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* A connected loopback TCP pair. */
static void tcp_pair(int *x, int *y, int rcvbuf)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int l = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(l >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sin, &len), 0);
    *x = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf)
        setsockopt(*x, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    assert_int_equal(connect(*x, (struct sockaddr *)&sin, sizeof(sin)), 0);
    *y = accept(l, NULL, NULL);
    assert_true(*y >= 0);
    close(l);
    nonblock(*x);
    nonblock(*y);
}

static size_t allow(void *arg, size_t want)
{
    fx *f = arg;
    size_t n = want < f->allow_left ? want : f->allow_left;

    if (f->allow_left != SIZE_MAX)
        f->allow_left -= n;
    f->allow_asked += n;
    return n;
}

static void moved(void *arg, size_t n)
{
    ((fx *)arg)->counted += n;
}

static void done(void *arg, int err)
{
    fx *f = arg;

    f->done = 1;
    f->err = err;
}

/* rcvbuf: b_peer's receive buffer (0: the default); cap: the pipe's size */
static void fx_up(fx *f, int rcvbuf, size_t cap, int with_allow)
{
    struct timeval ms = {0, 1000};

    memset(f, 0, sizeof(*f));
    f->allow_left = SIZE_MAX;
    assert_non_null(f->base = event_base_new());
    /* a turn of the loop returns at least every millisecond */
    f->tick = event_new(f->base, -1, EV_PERSIST, on_tick, NULL);
    event_add(f->tick, &ms);
    tcp_pair(&f->a_peer, &f->a, 0);
    tcp_pair(&f->b_peer, &f->b, rcvbuf);
    sf_splice_cfg cfg = {.base = f->base, .src = f->a, .dst = f->b, .cap = cap, .shut_dst = 1,
                         .allow = with_allow ? allow : NULL, .moved = moved, .done = done,
                         .arg = f};
    assert_int_equal(sf_splice_new(&cfg, &f->s), 0);
}

static void fx_down(fx *f)
{
    sf_splice_free(f->s);
    close(f->a_peer);
    close(f->a);
    close(f->b);
    close(f->b_peer);
    event_free(f->tick);
    event_base_free(f->base);
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One turn of the loop; fails the test after 20 s (a bound, not a wait: every caller
 * loops on a condition) */
static void turn(fx *f, int64_t t0)
{
    event_base_loop(f->base, EVLOOP_ONCE);
    assert_true(now_ms() - t0 < 20000);
}

static void pattern(unsigned char *p, size_t n, size_t off)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((off + i) * 2654435761u >> 13);
}

/* Writes `total` bytes of the pattern into a_peer and reads them at b_peer. */
static void move_and_check(fx *f, size_t total, int close_after)
{
    static unsigned char w[1 << 16], r[1 << 16], want[1 << 16];
    size_t sent = 0, got = 0;
    int64_t t0 = now_ms();
    ssize_t n;

    while (got < total) {
        if (sent < total) {
            size_t k = total - sent < sizeof(w) ? total - sent : sizeof(w);

            pattern(w, k, sent);
            if ((n = write(f->a_peer, w, k)) > 0)
                sent += (size_t)n;
            if (sent == total && close_after)
                shutdown(f->a_peer, SHUT_WR);
        }
        while ((n = read(f->b_peer, r, sizeof(r))) > 0) {
            pattern(want, (size_t)n, got);
            assert_memory_equal(r, want, (size_t)n);
            got += (size_t)n;
        }
        assert_false(n == 0 && got < total); /* no early end */
        turn(f, t0);
    }
    assert_int_equal(got, total);
}

static void every_byte_in_order(void **state)
{
    fx f;

    (void)state;
    fx_up(&f, 0, 65536, 0);
    sf_splice_start(f.s);
    move_and_check(&f, 8u << 20, 0);
    assert_int_equal(f.counted, 8u << 20);
    assert_int_equal(sf_splice_moved(f.s), 8u << 20);
    assert_int_equal(f.done, 0); /* a has not ended */
    fx_down(&f);
}

static void prepended_first_and_half_close(void **state)
{
    fx f;
    struct evbuffer *pre = evbuffer_new();
    char buf[64];
    size_t got = 0;
    ssize_t n;
    int64_t t0 = now_ms();

    (void)state;
    fx_up(&f, 0, 0, 0);
    evbuffer_add(pre, "first ", 6);
    assert_int_equal(sf_splice_prepend(f.s, pre), 0);
    assert_int_equal(evbuffer_get_length(pre), 0);
    evbuffer_free(pre);
    assert_int_equal(write(f.a_peer, "second", 6), 6);
    shutdown(f.a_peer, SHUT_WR);
    sf_splice_start(f.s);
    assert_int_equal(f.done, 0); /* never from inside a call */
    for (;;) {
        n = read(f.b_peer, buf + got, sizeof(buf) - 1 - got);
        if (n == 0)
            break; /* the FIN passed on */
        if (n > 0)
            got += (size_t)n;
        turn(&f, t0);
    }
    buf[got] = '\0';
    assert_string_equal(buf, "first second");
    assert_int_equal(f.done, 1);
    assert_int_equal(f.err, 0);
    assert_int_equal(f.counted, 12);
    /* the other way still works: b_peer -> b */
    assert_int_equal(write(f.b_peer, "back", 4), 4);
    while ((n = read(f.b, buf, sizeof(buf))) < 0 && errno == EAGAIN)
        turn(&f, t0);
    assert_int_equal(n, 4);
    fx_down(&f);
}

static void back_pressure(void **state)
{
    static unsigned char w[1 << 16];
    fx f;
    size_t sent = 0, last = (size_t)-1;
    int64_t t0 = now_ms();
    ssize_t n;

    (void)state;
    fx_up(&f, 16384, 65536, 0);
    /* fixed buffers on the way (no autotuning): the bound below is theirs plus the pipe */
    setsockopt(f.a_peer, SOL_SOCKET, SO_SNDBUF, &(int){65536}, sizeof(int));
    setsockopt(f.a, SOL_SOCKET, SO_RCVBUF, &(int){65536}, sizeof(int));
    setsockopt(f.b, SOL_SOCKET, SO_SNDBUF, &(int){65536}, sizeof(int));
    sf_splice_start(f.s);
    /* b_peer does not read: writing stalls once the buffers on the way are full */
    while (sent != last) {
        last = sent;
        for (int i = 0; i < 50; i++) {
            if ((n = write(f.a_peer, w, sizeof(w))) > 0)
                sent += (size_t)n;
            turn(&f, t0);
        }
    }
    print_message("written while nothing was read: %zu bytes\n", sent);
    assert_true(sent < (2u << 20)); /* socket buffers plus the pipe, not the writer's all */
    assert_true(sf_splice_pending(f.s) <= 65536);
    assert_int_equal(f.done, 0);
    fx_down(&f);
}

static void resets(void **state)
{
    fx f;
    struct linger lg = {1, 0};
    int64_t t0;

    (void)state;
    /* the reader resets: the splice ends with an error at its next write */
    fx_up(&f, 0, 0, 0);
    sf_splice_start(f.s);
    move_and_check(&f, 100000, 0);
    setsockopt(f.b_peer, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(f.b_peer);
    f.b_peer = socket(AF_INET, SOCK_STREAM, 0); /* (closed again by fx_down) */
    t0 = now_ms();
    while (!f.done) {
        static char junk[4096];

        (void)!write(f.a_peer, junk, sizeof(junk));
        turn(&f, t0);
    }
    assert_true(f.err == -ECONNRESET || f.err == -EPIPE);
    fx_down(&f);
    /* the writer resets: an error too, not a clean end */
    fx_up(&f, 0, 0, 0);
    sf_splice_start(f.s);
    move_and_check(&f, 1000, 0);
    setsockopt(f.a_peer, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(f.a_peer);
    f.a_peer = socket(AF_INET, SOCK_STREAM, 0);
    t0 = now_ms();
    while (!f.done)
        turn(&f, t0);
    assert_int_equal(f.err, -ECONNRESET);
    fx_down(&f);
}

static void allowance(void **state)
{
    fx f;
    char buf[8192];
    size_t got = 0;
    ssize_t n;
    int64_t t0 = now_ms();

    (void)state;
    fx_up(&f, 0, 0, 1);
    f.allow_left = 3000;
    memset(buf, 'x', sizeof(buf));
    assert_int_equal(write(f.a_peer, buf, 5000), 5000);
    sf_splice_start(f.s);
    /* 3000 pass, then it pauses */
    while (got < 3000) {
        if ((n = read(f.b_peer, buf, sizeof(buf))) > 0)
            got += (size_t)n;
        turn(&f, t0);
    }
    for (int i = 0; i < 20; i++)
        turn(&f, t0);
    assert_int_equal(read(f.b_peer, buf, sizeof(buf)), -1);
    assert_int_equal(f.counted, 3000);
    /* more allowance: the rest, and no more taken than came */
    f.allow_left = 1u << 20;
    sf_splice_resume(f.s);
    while (got < 5000) {
        if ((n = read(f.b_peer, buf, sizeof(buf))) > 0)
            got += (size_t)n;
        turn(&f, t0);
    }
    for (int i = 0; i < 20; i++)
        turn(&f, t0);
    assert_int_equal(got, 5000);
    assert_int_equal(f.allow_asked, 5000);
    /* the end passes while paused for want of bytes */
    shutdown(f.a_peer, SHUT_WR);
    while (!f.done)
        turn(&f, t0);
    assert_int_equal(f.err, 0);
    assert_int_equal(read(f.b_peer, buf, sizeof(buf)), 0);
    fx_down(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_byte_in_order),
        cmocka_unit_test(prepended_first_and_half_close),
        cmocka_unit_test(back_pressure),
        cmocka_unit_test(resets),
        cmocka_unit_test(allowance),
    };

    signal(SIGPIPE, SIG_IGN); /* as the daemons (sf_daemon): EPIPE instead */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
