/* host.c: this host's heartbeat in Redis (liveness + capacity for placement), and
 * the periodic check of which sandboxes the platform still knows.
 *
 * The heartbeat has its own thread and its own blocking Redis connection, so that
 * nothing on the event loop (a slow job, a stalled callback) can delay it: the
 * scheduler declares a host dead after host_dead_ms without one, and that would
 * lose every sandbox on it. It publishes the fields of schemas/redis-keys.md; `running` comes
 * from the loop through an atomic. */
#include "worker.h"
#include "tstore.h"
#include "sf_log.h"
#include "sf_records.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WK_VERSION "0.2.0"

static pthread_mutex_t beat_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t beat_cv;

/* One beat over the thread's connection: 0, or -1 when the connection is broken. It
 * lands even when Redis is at its maxmemory (sf_records): a full Redis must not make a
 * live host look dead. */
static int beat_once(wk_ctx *ctx, redisContext *conn)
{
    int64_t now = sf_now_ms();
    char caps[SF_HOSTCAPS_MAX], ts[24], cap[24], running[24], mem[24], vcpu[24], disk[24];
    char dused[24], err[256], pvbytes[4096], lhops[24];
    char tpl[2] = {ctx->tstore ? wk_tstore_debian_state(ctx->tstore) : '0', '\0'};
    char dsk[2] = {ctx->tstore ? wk_tstore_desktop_state(ctx->tstore) : '0', '\0'};
    const char *kv[] = {"id", ctx->host_id, "topic", ctx->topic, "driver", ctx->ops->name,
                        /* what its driver can do (driver.h WK_CAP_*, sf_hostcaps.h) */
                        "caps", caps,
                        "version", WK_VERSION, "ts", ts, "running", running, "capacity", cap,
                        "mem_mib", mem, "vcpu_milli", vcpu, "disk_mib", disk,
                        "disk_used_mib", dused,
                        /* 'debian' is on this host (placement prefers such hosts) */
                        "tpl_debian", tpl, "tpl_desktop", dsk,
                        /* where gateways hop to for previews (preview.c) */
                        "ingress", ctx->ingress_addr,
                        /* ...and on this machine (its boot): the local hop's socket */
                        "ingress_local", ctx->ingress_local, "boot_id", ctx->boot_id,
                        "ingress_local_hops", lhops,
                        /* bytes through it per team (preview.c) */
                        "ingress_bytes", pvbytes};
    int rc;

    sf_hostcaps_format(ctx->ops->caps, caps, sizeof(caps));
    wk_preview_beat_bytes(pvbytes, sizeof(pvbytes));
    snprintf(lhops, sizeof(lhops), "%llu", (unsigned long long)wk_preview_local_hops());
    snprintf(ts, sizeof(ts), "%lld", (long long)now);
    snprintf(cap, sizeof(cap), "%lld", (long long)ctx->capacity);
    snprintf(running, sizeof(running), "%d", atomic_load(&ctx->beat.running));
    snprintf(mem, sizeof(mem), "%llu", (unsigned long long)ctx->res.mem_mib);
    snprintf(vcpu, sizeof(vcpu), "%llu", (unsigned long long)ctx->res.vcpu_milli);
    snprintf(disk, sizeof(disk), "%llu", (unsigned long long)atomic_load(&ctx->beat.disk_mib));
    snprintf(dused, sizeof(dused), "%llu",
             (unsigned long long)atomic_load(&ctx->beat.disk_used_mib));
    rc = sf_records_heartbeat_sync(conn, ctx->host_id, now,
                                   ctx->cfg.heartbeat_ms * 10, SF_ARRAY_LEN(kv), kv, err,
                                   sizeof(err));
    if (rc == -EIO)
        return -1;
    if (rc < 0)
        sf_warn("msg=\"heartbeat write failed\" err=\"%s\"", rc == -EPROTO ? err : "bad field");
    return 0;
}

static void *beat_main(void *arg)
{
    wk_ctx *ctx = arg;
    redisContext *rc = NULL;
    char why[256];
    int warned = 0;

    pthread_mutex_lock(&beat_mu);
    while (!atomic_load(&ctx->beat.stop)) {
        struct timespec until;

        pthread_mutex_unlock(&beat_mu);
        if (!rc && (rc = sf_redis_connect_sync(ctx->cfg.common.redis_url, why, sizeof(why)))) {
            struct timeval tv = {2, 0};
            redisSetTimeout(rc, tv); /* a hung Redis costs a beat, not the thread */
        }
        if (rc && beat_once(ctx, rc) < 0) {
            sf_redis_sync_free(rc);
            rc = NULL;
        }
        if (!rc && !warned++)
            sf_warn("msg=\"heartbeat cannot reach Redis; retrying\"");
        if (rc)
            warned = 0;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += ctx->cfg.heartbeat_ms / 1000;
        until.tv_nsec += (ctx->cfg.heartbeat_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&beat_mu);
        while (!atomic_load(&ctx->beat.stop) &&
               pthread_cond_timedwait(&beat_cv, &beat_mu, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&beat_mu);
    /* Leaving: placement stops choosing this host at once. */
    if (!rc)
        rc = sf_redis_connect_sync(ctx->cfg.common.redis_url, why, sizeof(why));
    if (rc) {
        redisReply *rep = sf_redis_sync_cmd(rc, "ZREM " SF_RK_HOSTS " %s", ctx->host_id);
        if (rep)
            freeReplyObject(rep);
        sf_redis_sync_free(rc);
    }
    return NULL;
}

/* The sandboxes this worker runs, as asked of Redis in one check. */
typedef struct box_check {
    wk_ctx *ctx;
    size_t n;
    char ids[][SF_ID_MAX];
} box_check;

static void collect_id(const char *key, void *val, void *arg)
{
    box_check *bc = arg;
    wk_box *b = val;
    if (b->state == WK_BOX_RUNNING)
        snprintf(bc->ids[bc->n++], SF_ID_MAX, "%s", key);
}

/* A sandbox that left this host's set while we still run it was given up by the platform
 * (the scheduler reaped this host during a Redis outage or a stall): nobody can reach or
 * kill it any more, so it goes. */
static void on_box_check(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    box_check *bc = priv;

    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == bc->n) {
        for (size_t i = 0; i < bc->n; i++) {
            wk_box *b;
            if (rep->element[i]->type != REDIS_REPLY_INTEGER || rep->element[i]->integer != 0 ||
                !(b = sf_map_get(bc->ctx->sandboxes, bc->ids[i])) || b->state != WK_BOX_RUNNING)
                continue;
            sf_warn("msg=\"sandbox given up by the platform; killing it\" sandbox=%s", b->id);
            wk_box_kill(b, "lost");
        }
    }
    free(bc);
}

static void collect_box(const char *key, void *val, void *arg)
{
    wk_box ***p = arg;
    *(*p)++ = val;
}

/* `sandfleet hosts drain HOST`: this host offers nothing more and every sandbox it runs is
 * killed, so that the worker can stop (an upgrade that keeps nothing, a host retired). */
static void on_drain(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    wk_ctx *ctx = priv;
    size_t n = sf_map_len(ctx->sandboxes);
    wk_box **all, **p;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_STRING || ctx->stopping)
        return;
    if (!ctx->draining)
        sf_warn("msg=\"host drained by the operator: no new sandboxes, every sandbox killed\" "
                "count=%zu", n);
    ctx->draining = 1;
    ctx->capacity = 0;
    if (n == 0 || !(all = calloc(n + 1, sizeof(*all))))
        return;
    p = all;
    sf_map_foreach(ctx->sandboxes, collect_box, &p);
    for (size_t i = 0; i < n; i++)
        if (all[i]->state == WK_BOX_RUNNING)
            wk_box_kill(all[i], "killed");
    free(all);
}

static void check_boxes(evutil_socket_t fd, short what, void *arg)
{
    wk_ctx *ctx = arg;
    size_t n = sf_map_len(ctx->sandboxes);
    box_check *bc;
    const char **argv;
    char key[128];

    wk_host_disk_publish(ctx);
    if (sf_redis_connected(ctx->redis)) {
        snprintf(key, sizeof(key), SF_RK_HOST_DRAIN, ctx->host_id);
        sf_redis_cmd(ctx->redis, on_drain, ctx, "GET %s", key);
    }
    if (n == 0 || !sf_redis_connected(ctx->redis) || !(bc = malloc(sizeof(*bc) + n * SF_ID_MAX)))
        return;
    if (!(argv = calloc(n + 2, sizeof(*argv)))) {
        free(bc);
        return;
    }
    bc->ctx = ctx;
    bc->n = 0;
    sf_map_foreach(ctx->sandboxes, collect_id, bc);
    snprintf(key, sizeof(key), SF_RK_HOST_SANDBOXES, ctx->host_id);
    argv[0] = "SMISMEMBER";
    argv[1] = key;
    for (size_t i = 0; i < bc->n; i++)
        argv[i + 2] = bc->ids[i];
    if (bc->n == 0 || sf_redis_cmdargv(ctx->redis, on_box_check, bc, (int)bc->n + 2, argv, NULL) < 0)
        free(bc);
    free(argv);
}

/* The disk this host offers and holds (sandboxes' disks and the snapshots stored here),
 * for the heartbeat thread. On the loop thread. */
void wk_host_disk_publish(wk_ctx *ctx)
{
    atomic_store(&ctx->beat.disk_mib, (unsigned long long)ctx->res.disk_mib);
    atomic_store(&ctx->beat.disk_used_mib,
                 (unsigned long long)(ctx->used_disk_mib + ctx->snap_disk_mib));
}

int wk_host_start(wk_ctx *ctx)
{
    struct timeval tv = {ctx->cfg.heartbeat_ms / 1000, (ctx->cfg.heartbeat_ms % 1000) * 1000};
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&beat_cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_store(&ctx->beat.stop, 0);
    atomic_store(&ctx->beat.running, (int)sf_map_len(ctx->sandboxes));
    wk_host_disk_publish(ctx);
    if (pthread_create(&ctx->beat_thread, NULL, beat_main, ctx) != 0)
        return -1;
    ctx->beat_started = 1;
    if (!(ctx->ev_check = event_new(ctx->d.base, -1, EV_PERSIST, check_boxes, ctx)))
        return -1;
    event_add(ctx->ev_check, &tv);
    return 0;
}

void wk_host_stop(wk_ctx *ctx)
{
    if (ctx->ev_check) {
        event_free(ctx->ev_check);
        ctx->ev_check = NULL;
    }
    if (ctx->beat_started) {
        pthread_mutex_lock(&beat_mu);
        atomic_store(&ctx->beat.stop, 1);
        pthread_cond_signal(&beat_cv);
        pthread_mutex_unlock(&beat_mu);
        pthread_join(ctx->beat_thread, NULL);
        ctx->beat_started = 0;
        pthread_cond_destroy(&beat_cv);
    }
}
