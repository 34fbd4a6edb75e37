/* Name resolution for decisions: libevent's evdns (hosts file first, then the
 * nameservers of resolv_conf, IPv4 only, no search domains), with a small cache so
 * that a sandbox's DNS answer and its next connection agree. */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_MAX 4096
#define TTL_MIN 5
#define TTL_DEFAULT 30

struct sp_resolver {
    struct event_base *base;
    struct evdns_base *dns;
    sf_map *cache; /* name -> cache_ent */
};

typedef struct cache_ent {
    sp_addrs a;
    int64_t expires_ms;
} cache_ent;

struct sp_rq {
    sp_resolver *r;
    struct event *ev;     /* answers known at once are delivered from the loop */
    sp_addrs a;
    int in_call;
    sp_resolve_cb cb;
    void *arg;
    int cancelled;
    char name[SP_NAME_MAX];
};

sp_resolver *sp_resolver_new(struct event_base *base, const char *resolv_conf,
                             const char *hosts_file, char *why, size_t whylen)
{
    sp_resolver *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    r->base = base;
    if (!(r->cache = sf_map_new(CACHE_MAX)) || !(r->dns = evdns_base_new(base, 0)))
        goto fail;
    if (resolv_conf && *resolv_conf &&
        evdns_base_resolv_conf_parse(r->dns, DNS_OPTION_NAMESERVERS | DNS_OPTION_MISC,
                                     resolv_conf) != 0) {
        snprintf(why, whylen, "Cannot read the resolver configuration %s; set resolv_conf to "
                 "a readable resolv.conf.", resolv_conf);
        goto fail;
    }
    if (hosts_file && *hosts_file && evdns_base_load_hosts(r->dns, hosts_file) != 0) {
        snprintf(why, whylen, "Cannot read the hosts file %s; set hosts_file to a readable "
                 "file or to an empty value.", hosts_file);
        goto fail;
    }
    return r;
fail:
    sp_resolver_free(r);
    return NULL;
}

static void free_ent(const char *key, void *val, void *arg)
{
    free(val);
}

void sp_resolver_free(sp_resolver *r)
{
    if (!r)
        return;
    if (r->dns)
        evdns_base_free(r->dns, 1); /* pending requests fail with DNS_ERR_SHUTDOWN */
    if (r->cache) {
        sf_map_foreach(r->cache, free_ent, NULL);
        sf_map_free(r->cache);
    }
    free(r);
}

int sp_addrs_has(const sp_addrs *a, uint32_t ip)
{
    for (int i = 0; i < a->n; i++)
        if (a->ip[i] == ip)
            return 1;
    return 0;
}

static void cache_put(sp_resolver *r, const char *name, const sp_addrs *a)
{
    cache_ent *e = sf_map_get(r->cache, name);

    if (!e) {
        if (sf_map_len(r->cache) >= CACHE_MAX) { /* full: start over */
            sf_map_foreach(r->cache, free_ent, NULL);
            sf_map_free(r->cache);
            if (!(r->cache = sf_map_new(CACHE_MAX)))
                abort();
        }
        if (!(e = malloc(sizeof(*e))) || sf_map_put(r->cache, name, e) < 0) {
            free(e);
            return;
        }
    }
    e->a = *a;
    e->expires_ms = sf_mono_ms() + (int64_t)a->ttl * 1000;
}

static void on_deferred(evutil_socket_t fd, short what, void *arg)
{
    sp_rq *rq = arg;

    if (!rq->cancelled)
        rq->cb(rq->arg, &rq->a);
    event_free(rq->ev);
    free(rq);
}

/* Delivers a to the caller from the event loop, never from inside sp_resolve(). */
static void deliver(sp_rq *rq, const sp_addrs *a)
{
    rq->a = *a;
    if (rq->in_call) {
        event_active(rq->ev, EV_TIMEOUT, 1);
        return;
    }
    event_free(rq->ev);
    if (!rq->cancelled)
        rq->cb(rq->arg, a);
    free(rq);
}

static void on_evdns(int result, struct evutil_addrinfo *res, void *arg)
{
    sp_rq *rq = arg;
    sp_addrs a = {.n = 0, .ttl = TTL_DEFAULT};

    if (result == 0 && res) {
        for (struct evutil_addrinfo *i = res; i && a.n < SP_IPS_MAX; i = i->ai_next)
            if (i->ai_family == AF_INET &&
                !sp_addrs_has(&a, ntohl(((struct sockaddr_in *)i->ai_addr)->sin_addr.s_addr)))
                a.ip[a.n++] = ntohl(((struct sockaddr_in *)i->ai_addr)->sin_addr.s_addr);
        if (a.n)
            cache_put(rq->r, rq->name, &a);
        else
            a.err = -ENOENT;
    } else if (result == EVUTIL_EAI_NONAME || result == EVUTIL_EAI_NODATA) {
        a.err = -ENOENT;
        a.ttl = TTL_MIN;
        cache_put(rq->r, rq->name, &a); /* negative answers are cached briefly too */
    } else {
        a.err = -EAGAIN;
    }
    if (res)
        evutil_freeaddrinfo(res);
    deliver(rq, &a);
}

sp_rq *sp_resolve(sp_resolver *r, const char *name, sp_resolve_cb cb, void *arg)
{
    struct evutil_addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct in_addr lit;
    cache_ent *e;
    sp_rq *rq = calloc(1, sizeof(*rq));
    sp_addrs a = {.n = 0, .ttl = TTL_MIN, .err = -ENOENT};

    if (!rq)
        return NULL;
    if (!(rq->ev = evtimer_new(r->base, on_deferred, rq))) {
        free(rq);
        return NULL;
    }
    rq->r = r;
    rq->cb = cb;
    rq->arg = arg;
    rq->in_call = 1;
    if (inet_pton(AF_INET, name, &lit) == 1) {
        a.ip[0] = ntohl(lit.s_addr);
        a.n = 1;
        a.err = 0;
        deliver(rq, &a);
    } else if ((e = sf_map_get(r->cache, name)) && e->expires_ms > sf_mono_ms()) {
        deliver(rq, &e->a);
    } else if (snprintf(rq->name, sizeof(rq->name), "%s", name) >= (int)sizeof(rq->name)) {
        deliver(rq, &a);
    } else {
        /* answered at once (hosts file, failure): on_evdns defers through rq->ev */
        evdns_getaddrinfo(r->dns, name, NULL, &hints, on_evdns, rq);
    }
    rq->in_call = 0;
    return rq;
}

int sp_resolve_peek(sp_resolver *r, const char *name, sp_addrs *a)
{
    struct in_addr lit;
    cache_ent *e;

    if (name[0] >= '0' && name[0] <= '9' && inet_pton(AF_INET, name, &lit) == 1) {
        memset(a, 0, sizeof(*a));
        a->ip[0] = ntohl(lit.s_addr);
        a->n = 1;
        a->ttl = TTL_MIN;
        return 0;
    }
    if ((e = sf_map_get(r->cache, name)) && e->expires_ms > sf_mono_ms() && e->a.n > 0) {
        *a = e->a;
        return 0;
    }
    return -ENOENT;
}

void sp_resolve_cancel(sp_rq *rq)
{
    if (rq)
        rq->cancelled = 1; /* evdns still calls back; rq is freed there */
}
