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

/* The host's capabilities, parsed once here from its heartbeat's caps (common/
 * sf_hostcaps.h): {"layers": true, "builds": false, ...}, every word present, as e.caps
 * for the scripts (state/lua) and sch_host_can. A worker from before caps published none:
 * then, and only then, its driver's name stands for them (the jail ran team templates,
 * built them and ran 'debian'; the qemu driver none of these). */
static json_t *caps_json(const char *caps, const char *driver)
{
    unsigned bits = *caps ? sf_hostcaps_parse(caps)
                          : !strcmp(driver, "jail") ? SF_HOSTCAP_LAYERS | SF_HOSTCAP_BUILDS |
                                                          SF_HOSTCAP_DEBIAN
                                                    : 0;
    json_t *o = json_object();

    for (unsigned b = 1; b & SF_HOSTCAP_ALL; b <<= 1)
        json_object_set_new(o, sf_hostcaps_word(b), json_boolean(bits & b));
    return o;
}

int sch_host_can(const json_t *host, unsigned cap)
{
    const char *w = sf_hostcaps_word(cap);

    return w && json_is_true(json_object_get(json_object_get(host, "caps"), w));
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
        json_object_set_new(e, "driver", json_string(str_at(rep, 5))); /* for messages */
        json_object_set_new(e, "caps", caps_json(str_at(rep, 11), str_at(rep, 5)));
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
