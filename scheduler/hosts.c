/* hosts.c: what placement reads of the live hosts, one host (one hash slot) per call:
 * sf:hosts for the live ones, then each host's hash and reservations (sf_store_host_view),
 * all sent at once. The choice made from it is re-checked by the host's own step when
 * the sandbox is reserved there (place.c). */
#include "sched.h"
#include "sf_store.h"

#include <stdlib.h>
#include <string.h>

typedef struct hosts_read {
    sf_redis *r;
    sch_hosts_cb cb;
    void *priv;
    json_t *hosts;
    size_t pending;
    int failed;
} hosts_read;

typedef struct view_op {
    hosts_read *hr;
    json_t *e; /* the host's entry in hr->hosts */
} view_op;

static void finish(hosts_read *hr)
{
    if (hr->failed) {
        json_decref(hr->hosts);
        hr->hosts = NULL;
    }
    hr->cb(hr->priv, hr->hosts);
    json_decref(hr->hosts);
    free(hr);
}

static const char *str_at(const redisReply *rep, size_t i)
{
    return i < rep->elements && rep->element[i]->type == REDIS_REPLY_STRING
               ? rep->element[i]->str
               : "";
}

/* The host's heartbeat names cap in its caps (space-separated words). A worker from
 * before caps published none: its driver says it (only the jail ran 'debian' then). */
static int caps_has(const char *caps, const char *driver, const char *cap)
{
    size_t n = strlen(cap);

    if (!*caps)
        return !strcmp(cap, "debian") && !strcmp(driver, "jail");
    for (const char *p = caps; (p = strstr(p, cap)); p += n)
        if ((p == caps || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' '))
            return 1;
    return 0;
}

static json_int_t int_at(const redisReply *rep, size_t i)
{
    if (i < rep->elements && rep->element[i]->type == REDIS_REPLY_INTEGER)
        return rep->element[i]->integer;
    return strtoll(str_at(rep, i), NULL, 10);
}

/* {capacity, running, mem_mib, vcpu_milli, tpl_debian, driver, ts, n, mem, vcpu, disk_mib,
 * caps} */
static void on_view(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    view_op *v = priv;
    hosts_read *hr = v->hr;
    json_t *e = v->e;
    json_int_t running;

    (void)ac;
    free(v);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 12) {
        hr->failed = 1;
    } else {
        running = int_at(rep, 1);
        json_object_set_new(e, "cap", json_integer(int_at(rep, 0)));
        json_object_set_new(e, "running", json_integer(running));
        json_object_set_new(e, "used", json_integer(int_at(rep, 7) > running ? int_at(rep, 7)
                                                                             : running));
        if (*str_at(rep, 2))
            json_object_set_new(e, "mem", json_integer(int_at(rep, 2)));
        if (*str_at(rep, 3))
            json_object_set_new(e, "vcpu", json_integer(int_at(rep, 3)));
        if (*str_at(rep, 10))
            json_object_set_new(e, "disk", json_integer(int_at(rep, 10)));
        json_object_set_new(e, "deb", json_boolean(!strcmp(str_at(rep, 4), "1")));
        json_object_set_new(e, "debb", json_boolean(!strcmp(str_at(rep, 4), "b")));
        json_object_set_new(e, "driver", json_string(str_at(rep, 5)));
        /* its driver runs 'debian': the capability it publishes (a worker from before
         * capabilities: the jail did) */
        json_object_set_new(e, "sdeb", json_boolean(caps_has(str_at(rep, 11), str_at(rep, 5),
                                                                 "debian")));
        json_object_set_new(e, "rmem", json_integer(int_at(rep, 8)));
        json_object_set_new(e, "rvcpu", json_integer(int_at(rep, 9)));
    }
    if (--hr->pending == 0)
        finish(hr);
}

static void on_live(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    hosts_read *hr = priv;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        hr->failed = 1;
        finish(hr);
        return;
    }
    hr->pending = 1; /* until every view is sent */
    for (size_t i = 0; i < rep->elements; i++) {
        char k[2][160];
        const char *argv[] = {k[0], k[1]};
        size_t lens[2];
        view_op *v;
        const char *h = rep->element[i]->str;
        if (rep->element[i]->type != REDIS_REPLY_STRING || !sf_id_valid(h))
            continue;
        lens[0] = (size_t)snprintf(k[0], sizeof(k[0]), SF_RK_HOST, h);
        lens[1] = (size_t)snprintf(k[1], sizeof(k[1]), SF_RK_HOST_RES, h);
        if (!(v = calloc(1, sizeof(*v))) || !(v->e = json_pack("{s:s}", "h", h))) {
            free(v);
            hr->failed = 1;
            continue;
        }
        v->hr = hr;
        json_array_append_new(hr->hosts, v->e);
        hr->pending++;
        if (sf_redis_script_call(hr->r, &sf_store_host_view, on_view, v, 2, 0, argv, lens) < 0) {
            hr->failed = 1;
            hr->pending--;
            free(v);
        }
    }
    if (--hr->pending == 0)
        finish(hr);
}

int sch_hosts_read(sch_ctx *ctx, sch_hosts_cb cb, void *priv)
{
    hosts_read *hr = calloc(1, sizeof(*hr));

    if (!hr || !(hr->hosts = json_array())) {
        free(hr);
        return -ENOMEM;
    }
    hr->r = ctx->redis;
    hr->cb = cb;
    hr->priv = priv;
    if (sf_redis_cmd(ctx->redis, on_live, hr, "ZRANGEBYSCORE " SF_RK_HOSTS " %lld +inf",
                     (long long)(sf_now_ms() - ctx->cfg.host_ttl_ms)) < 0) {
        json_decref(hr->hosts);
        free(hr);
        return -ENOTCONN;
    }
    return 0;
}
