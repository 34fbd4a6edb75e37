/* sf_splice: one direction of a byte relay between two stream sockets, moved by the
 * kernel (splice(2) through a pipe of its own: socket -> pipe -> socket, no copy into
 * user space), on a libevent loop. The preview relays use it (the worker's ingress both
 * ways, the gateway from the hop to a plain-TCP browser); docs/internals/preview.md.
 *
 * Why not bufferevents: libevent 2.1 reads at most 4 KiB per readiness event whatever
 * bufferevent_set_max_single_read says (EVBUFFER_MAX_READ), asks FIONREAD before each
 * read and adds and removes the write interest around every write; a 50 MB download
 * through two such relays took 13,000 wake-ups per relay.
 *
 * Behaviour: reads from src only when everything read before was written to dst (at most
 * `cap` bytes in flight, in the pipe: the back-pressure bound); writes at once after each
 * read and waits for dst's writability only when dst is full; yields to the loop after
 * 1 MiB in one turn. When src ends (its FIN) and everything is written, dst gets
 * shutdown(SHUT_WR) if cfg.shut_dst, then done(arg, 0). A read or write error (a reset, a
 * peer gone: EPIPE) ends it with done(arg, -errno). Both sockets must be ones splice(2)
 * takes (TCP, Unix stream; not a TLS-wrapped or a bufferevent pair's).
 *
 * Threading: the loop thread of cfg.base. Callbacks come from the loop, never from inside
 * a call of this API; done may free the splice. The process must ignore SIGPIPE (as
 * sf_daemon's daemons do): a write to a closed peer then fails with EPIPE. */
#ifndef SF_SPLICE_H
#define SF_SPLICE_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sf_splice sf_splice;

typedef struct sf_splice_cfg {
    struct event_base *base;
    int src, dst;      /* nonblocking stream sockets, not owned: close them after the free */
    size_t cap;        /* bytes in flight at most (the pipe is asked for this size: a
                          user over fs.pipe-user-pages-soft, or a size over
                          fs.pipe-max-size, gets the kernel's default, 64 KiB or less) */
    int shut_dst;      /* on src's end, shutdown(dst, SHUT_WR) once everything is written */
    /* optional: how many of `want` bytes may be read now (a bandwidth cap). 0 pauses the
     * splice until sf_splice_resume. */
    size_t (*allow)(void *arg, size_t want);
    /* optional: n bytes were written to dst (the byte counters; must not free the splice) */
    void (*moved)(void *arg, size_t n);
    /* src ended and all of it was written (0), or a failure (-errno: -ECONNRESET, -EPIPE,
     * ...). The splice does nothing more; the callee may free it. */
    void (*done)(void *arg, int err);
    void *arg;
} sf_splice_cfg;

/* A splice from cfg->src to cfg->dst; it starts with sf_splice_start. 0 and *out, or
 * -errno (-EMFILE: no pipe could be made; -ENOMEM). */
int sf_splice_new(const sf_splice_cfg *cfg, sf_splice **out);
/* Bytes that go to dst before anything read from src (what a line-reader read past its
 * line): buf's contents are moved in. Before sf_splice_start. 0 or -ENOMEM. */
int sf_splice_prepend(sf_splice *s, struct evbuffer *buf);
/* Starts moving (from the loop: the first step runs in the loop's next turn). */
void sf_splice_start(sf_splice *s);
/* After allow returned 0: tries again (from the loop's next turn). */
void sf_splice_resume(sf_splice *s);
/* Bytes read from src and not yet written to dst. */
size_t sf_splice_pending(const sf_splice *s);
/* Bytes written to dst so far (prepended ones included). */
uint64_t sf_splice_moved(const sf_splice *s);
/* Stops and frees it (its events and its pipe; not src or dst). NULL-safe. */
void sf_splice_free(sf_splice *s);

#endif
