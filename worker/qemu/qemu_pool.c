/* The pool: VMs restored from the template ahead of time, under sb_dir/.pool-<pid>-<n>, so
 * that a create only pings one (qemu_vm.c hands it out). It refills one VM at a time in
 * the background; a VM that fails to come up makes it wait WK_QPOOL_RETRY_MS (a broken
 * template must not turn into a restore loop). */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "qemu_int.h"
#include "sf_log.h"

static void on_pool_timer(evutil_socket_t fd, short what, void *arg)
{
    wk_driver *d = arg;
    int ready = 0, filling = 0, rc;
    const char *why = NULL;
    char name[32];

    for (wk_sandbox *sb = d->vms; sb; sb = wk_qvm_next(sb)) {
        int st = wk_qvm_pool_state(sb);
        ready += st == 2;
        filling += st == 1;
    }
    /* One restore at a time: the pool fills in the background, never in a burst. */
    if (filling || ready >= (int)d->pool_target)
        return;
    /* The worker's pid in the name: its cgroup (sandfleet/<host>/pool-<pid>-<n>) never
     * meets another worker's of the same host_id (test runs side by side). */
    /* (a sandbox kept from an earlier run of the same pid may hold a name: the next one) */
    for (int tries = 0; tries < 64; tries++) {
        snprintf(name, sizeof(name), ".pool-%d-%u", (int)getpid(), ++d->pool_seq);
        if ((rc = wk_qvm_start_pooled(d, name, &why)) != -EEXIST)
            break;
    }
    if (rc < 0) {
        sf_warn("msg=\"cannot start a pool VM\" rc=%d why=\"%s\"", rc, why ? why : "");
        wk_qpool_kick(d, WK_QPOOL_RETRY_MS);
    }
}

void wk_qpool_kick(wk_driver *d, uint32_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};

    if (!d->pool_target || !d->ev_pool)
        return;
    if (ms == 0 || !evtimer_pending(d->ev_pool, NULL))
        evtimer_add(d->ev_pool, &tv);
}

int wk_qpool_start(wk_driver *d)
{
    if (!(d->ev_pool = evtimer_new(d->base, on_pool_timer, d)))
        return -ENOMEM;
    wk_qpool_kick(d, 0);
    return 0;
}

void wk_qpool_set(wk_driver *d, uint32_t target)
{
    d->pool_target = target;
    if (target == 0)
        for (wk_sandbox *sb = d->vms, *next; sb; sb = next) {
            next = wk_qvm_next(sb);
            wk_qvm_unpool(sb);
        }
    wk_qpool_kick(d, 0);
}

int wk_qpool_ready(const wk_driver *d)
{
    int n = 0;
    for (wk_sandbox *sb = d->vms; sb; sb = wk_qvm_next(sb))
        n += wk_qvm_pool_state(sb) == 2;
    return n;
}

void wk_qpool_stop(wk_driver *d)
{
    if (d->ev_pool)
        event_free(d->ev_pool);
    d->ev_pool = NULL;
    d->pool_target = 0;
}
