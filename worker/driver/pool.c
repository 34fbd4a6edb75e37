/* wk_pool: worker threads take items from a queue, run `work`, put the item on a
 * done list and wake the loop through an eventfd; the loop runs `done`. */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define POOL_THREADS_MAX 16

typedef struct item {
    struct item *next;
    wk_pool_fn work, done;
    void *arg;
} item;

struct wk_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *todo, **todo_tail;   /* FIFO */
    item *done, **done_tail;   /* FIFO */
    int stopping;
    int pending;               /* queued + running + done-not-yet-run (loop thread) */
    int nthreads;
    int want;                  /* threads to start at the first item */
    pthread_t threads[POOL_THREADS_MAX];
    int efd;
    struct event *ev;
};

static void *thread_main(void *arg)
{
    wk_pool *p = arg;
    uint64_t one = 1;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        item *it;
        while (!p->todo && !p->stopping)
            pthread_cond_wait(&p->cv, &p->mu);
        if (!p->todo)
            break;
        it = p->todo;
        p->todo = it->next;
        if (!p->todo)
            p->todo_tail = &p->todo;
        pthread_mutex_unlock(&p->mu);
        if (it->work)
            it->work(it->arg);
        pthread_mutex_lock(&p->mu);
        it->next = NULL;
        *p->done_tail = it;
        p->done_tail = &it->next;
        if (write(p->efd, &one, sizeof(one)) < 0) {
            /* the counter cannot overflow here; nothing else to do */
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Runs the done callbacks of finished items (loop thread). */
static void run_done(wk_pool *p)
{
    item *list;

    pthread_mutex_lock(&p->mu);
    list = p->done;
    p->done = NULL;
    p->done_tail = &p->done;
    pthread_mutex_unlock(&p->mu);
    while (list) {
        item *it = list;
        list = it->next;
        p->pending--;
        if (it->done)
            it->done(it->arg);
        free(it);
    }
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    wk_pool *p = arg;
    uint64_t n;

    if (read(fd, &n, sizeof(n)) < 0) {
        /* EAGAIN: a wake-up raced with an earlier read; the list is checked anyway */
    }
    run_done(p);
}

wk_pool *wk_pool_new(struct event_base *base, int nthreads)
{
    wk_pool *p;

    if (!base || nthreads < 1 || nthreads > POOL_THREADS_MAX || !(p = calloc(1, sizeof(*p))))
        return NULL;
    p->todo_tail = &p->todo;
    p->done_tail = &p->done;
    p->efd = -1;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0)
        goto fail_mu;
    if ((p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        !(p->ev = event_new(base, p->efd, EV_READ | EV_PERSIST, on_wake, p)) ||
        event_add(p->ev, NULL) < 0)
        goto fail;
    p->want = nthreads;
    return p;
fail:
    wk_pool_free(p);
    return NULL;
fail_mu:
    pthread_mutex_destroy(&p->mu);
    free(p);
    return NULL;
}

int wk_pool_run(wk_pool *p, wk_pool_fn work, wk_pool_fn done, void *arg)
{
    item *it;

    /* Threads start with the first item: until then the process stays single-threaded
     * (a driver's host_init may need that, e.g. to enter a mount namespace of its own). */
    for (; p->nthreads < p->want; p->nthreads++)
        if (pthread_create(&p->threads[p->nthreads], NULL, thread_main, p) != 0) {
            if (p->nthreads == 0)
                return -EAGAIN;
            p->want = p->nthreads;
            break;
        }
    if (!(it = calloc(1, sizeof(*it))))
        return -ENOMEM;
    it->work = work;
    it->done = done;
    it->arg = arg;
    pthread_mutex_lock(&p->mu);
    *p->todo_tail = it;
    p->todo_tail = &it->next;
    p->pending++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int wk_pool_pending(const wk_pool *p)
{
    return p ? p->pending : 0;
}

void wk_pool_free(wk_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1; /* threads finish the queue, then leave */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    /* done callbacks may queue more work: run it inline (the threads are gone) */
    for (;;) {
        item *it;
        run_done(p);
        pthread_mutex_lock(&p->mu);
        it = p->todo;
        if (it) {
            p->todo = it->next;
            if (!p->todo)
                p->todo_tail = &p->todo;
        }
        pthread_mutex_unlock(&p->mu);
        if (!it)
            break;
        if (it->work)
            it->work(it->arg);
        p->pending--;
        if (it->done)
            it->done(it->arg);
        free(it);
    }
    if (p->ev)
        event_free(p->ev);
    if (p->efd >= 0)
        close(p->efd);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
