/* sf_splice: one direction of a relay, socket -> pipe -> socket (sf_splice.h). */
#include "sf_splice.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define TURN_MAX (1u << 20) /* bytes moved in one turn of the loop before yielding */

struct sf_splice {
    sf_splice_cfg cfg;
    int pr, pw;           /* the pipe */
    size_t cap;           /* its size */
    size_t inpipe;        /* bytes in it */
    struct evbuffer *pre; /* prepended bytes */
    struct event *ev_rd, *ev_wr, *ev_step;
    int rd_on, wr_on, started, eof, finished;
    uint64_t moved;
};

static void set_ev(struct event *ev, int *on, int want)
{
    if (want == *on)
        return;
    if (want)
        event_add(ev, NULL);
    else
        event_del(ev);
    *on = want;
}

static int again(int e)
{
    return e == EAGAIN || e == EWOULDBLOCK || e == EINTR;
}

static void count(sf_splice *s, size_t n)
{
    s->moved += n;
    if (s->cfg.moved)
        s->cfg.moved(s->cfg.arg, n);
}

/* The end (the callee may free s: nothing touches it after). */
static void finish(sf_splice *s, int err)
{
    set_ev(s->ev_rd, &s->rd_on, 0);
    set_ev(s->ev_wr, &s->wr_on, 0);
    event_del(s->ev_step);
    s->finished = 1;
    s->cfg.done(s->cfg.arg, err);
}

/* How much may be read now: the cap, under the allowance. With an allowance only what is
 * there is asked for (FIONREAD), so none is taken for bytes that never come; 0 and *eof
 * when src ended, 0 and *wait when nothing is there. */
static size_t want_now(sf_splice *s, int *eof, int *wait)
{
    int avail = 0;
    char c;
    ssize_t n;

    if (!s->cfg.allow)
        return s->cap;
    if (ioctl(s->cfg.src, FIONREAD, &avail) < 0 || avail <= 0) {
        n = recv(s->cfg.src, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) {
            *eof = 1;
            return 0;
        }
        if (n < 0 && again(errno)) {
            *wait = 1;
            return 0;
        }
        avail = 1; /* bytes came meanwhile, or an error the splice reports */
    }
    return s->cfg.allow(s->cfg.arg, (size_t)avail < s->cap ? (size_t)avail : s->cap);
}

static void step(sf_splice *s)
{
    size_t turn = 0;
    int want_rd = 0, want_wr = 0, short_read = 0;

    if (s->finished)
        return;
    for (;;) {
        int eof = 0, wait = 0;
        size_t want;
        ssize_t n;

        /* out: the prepended bytes, then the pipe */
        while (evbuffer_get_length(s->pre) > 0) {
            int w = evbuffer_write(s->pre, s->cfg.dst);

            if (w < 0 && !again(errno)) {
                finish(s, -errno);
                return;
            }
            if (w <= 0) {
                want_wr = 1;
                goto wait;
            }
            count(s, (size_t)w);
        }
        while (s->inpipe > 0) {
            n = splice(s->pr, NULL, s->cfg.dst, NULL, s->inpipe, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (n < 0 && !again(errno)) {
                finish(s, -errno);
                return;
            }
            if (n <= 0) {
                want_wr = 1;
                goto wait;
            }
            s->inpipe -= (size_t)n;
            count(s, (size_t)n);
        }
        if (s->eof) {
            if (s->cfg.shut_dst && shutdown(s->cfg.dst, SHUT_WR) < 0 && errno != ENOTCONN) {
                finish(s, -errno);
                return;
            }
            finish(s, 0);
            return;
        }
        if (short_read) { /* src is likely empty: epoll says when it is not (one read less) */
            want_rd = 1;
            goto wait;
        }
        if (turn >= TURN_MAX) { /* the others' turn; on in the next one */
            event_active(s->ev_step, EV_TIMEOUT, 0);
            goto wait;
        }
        /* in */
        want = want_now(s, &eof, &wait);
        if (eof) {
            s->eof = 1;
            continue;
        }
        if (wait) {
            want_rd = 1;
            goto wait;
        }
        if (want == 0)
            goto wait; /* the allowance: sf_splice_resume */
        n = splice(s->cfg.src, NULL, s->pw, NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n > 0) {
            s->inpipe = (size_t)n;
            turn += (size_t)n;
            short_read = (size_t)n < want;
        } else if (n == 0) {
            s->eof = 1;
        } else if (again(errno)) {
            want_rd = 1;
            goto wait;
        } else {
            finish(s, -errno);
            return;
        }
    }
wait:
    set_ev(s->ev_rd, &s->rd_on, want_rd);
    set_ev(s->ev_wr, &s->wr_on, want_wr);
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    step(arg);
}

int sf_splice_new(const sf_splice_cfg *cfg, sf_splice **out)
{
    sf_splice *s = calloc(1, sizeof(*s));
    int p[2], sz;

    if (!s)
        return -ENOMEM;
    s->cfg = *cfg;
    s->pr = s->pw = -1;
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0) {
        int e = errno;

        free(s);
        return -e;
    }
    s->pr = p[0];
    s->pw = p[1];
    if (cfg->cap > 0 && cfg->cap <= (1u << 30))
        (void)fcntl(s->pw, F_SETPIPE_SZ, (int)cfg->cap); /* over the limit: the default */
    sz = fcntl(s->pw, F_GETPIPE_SZ);
    s->cap = sz > 0 ? (size_t)sz : 65536;
    if (cfg->cap > 0 && cfg->cap < s->cap)
        s->cap = cfg->cap;
    if (!(s->pre = evbuffer_new()) ||
        !(s->ev_rd = event_new(cfg->base, cfg->src, EV_READ | EV_PERSIST, on_io, s)) ||
        !(s->ev_wr = event_new(cfg->base, cfg->dst, EV_WRITE | EV_PERSIST, on_io, s)) ||
        !(s->ev_step = event_new(cfg->base, -1, 0, on_io, s))) {
        sf_splice_free(s);
        return -ENOMEM;
    }
    *out = s;
    return 0;
}

int sf_splice_prepend(sf_splice *s, struct evbuffer *buf)
{
    return evbuffer_add_buffer(s->pre, buf) < 0 ? -ENOMEM : 0;
}

void sf_splice_start(sf_splice *s)
{
    s->started = 1;
    event_active(s->ev_step, EV_TIMEOUT, 0);
}

void sf_splice_resume(sf_splice *s)
{
    if (s->started && !s->finished)
        event_active(s->ev_step, EV_TIMEOUT, 0);
}

size_t sf_splice_pending(const sf_splice *s)
{
    return s->inpipe + evbuffer_get_length(s->pre);
}

uint64_t sf_splice_moved(const sf_splice *s)
{
    return s->moved;
}

void sf_splice_free(sf_splice *s)
{
    if (!s)
        return;
    if (s->ev_rd)
        event_free(s->ev_rd);
    if (s->ev_wr)
        event_free(s->ev_wr);
    if (s->ev_step)
        event_free(s->ev_step);
    if (s->pre)
        evbuffer_free(s->pre);
    if (s->pr >= 0)
        close(s->pr);
    if (s->pw >= 0)
        close(s->pw);
    free(s);
}
