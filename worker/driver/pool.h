/* wk_pool: a few threads for a driver's blocking work (mounts, clone + the agent's
 * first ping, QMP round trips...), so that nothing slow runs on the worker's event
 * loop. `work` runs on a pool thread; `done` then runs on the loop thread, in
 * completion order. Not for work that must be stoppable from outside (teardown
 * runs in child processes for that). */
#ifndef WK_POOL_H
#define WK_POOL_H

#include <event2/event.h>

typedef struct wk_pool wk_pool;

typedef void (*wk_pool_fn)(void *arg);

/* nthreads 1..16, started at the first wk_pool_run (so that the process is still
 * single-threaded until then). NULL when out of memory. */
wk_pool *wk_pool_new(struct event_base *base, int nthreads);
/* Queues work(arg) then done(arg) (either may be NULL); loop thread only (also from
 * a done callback, even during wk_pool_free). 0, -ENOMEM, or -EAGAIN when no
 * thread can start. */
int wk_pool_run(wk_pool *p, wk_pool_fn work, wk_pool_fn done, void *arg);
/* Items queued or running and not yet done (loop thread only). */
int wk_pool_pending(const wk_pool *p);
/* Finishes every queued item (their done callbacks run here, on the calling loop
 * thread), stops the threads, frees. NULL-safe. */
void wk_pool_free(wk_pool *p);

#endif
