/* Name resolution for decisions: libevent's evdns (hosts file first, then the
 * nameservers of resolv_conf, IPv4 only, no search domains), with a cache per sandbox so
 * that a sandbox's DNS answer and its next connection agree. Each sandbox's cache and
 * lookups in flight are bounded (SP_CACHE_PER_SANDBOX, SP_LOOKUPS_PER_SANDBOX); a sandbox
 * that fills its cache drops its own entries, never another's. */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TTL_MIN 5
#define TTL_DEFAULT 30

struct sp_resolver {
    struct event_base *base;
    struct evdns_base *dns;
};

struct sp_rcache {
    sf_map *map;    /* name -> cache_ent */
    int inflight;   /* lookups sent upstream and not answered yet */
    int refs;       /* the sandbox and each lookup in flight */
};

typedef struct cache_ent {
    sp_addrs a;
    int64_t expires_ms;
} cache_ent;

struct sp_rq {
    sp_resolver *r;
    sp_rcache *c;         /* held while the lookup is upstream */
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
    if (!(r->dns = evdns_base_new(base, 0)))
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
    free(r);
}

sp_rcache *sp_rcache_new(void)
{
    sp_rcache *c = calloc(1, sizeof(*c));

    if (c && !(c->map = sf_map_new(SP_CACHE_PER_SANDBOX))) {
        free(c);
        return NULL;
    }
    if (c)
        c->refs = 1;
    return c;
}

void sp_rcache_unref(sp_rcache *c)
{
    if (!c || --c->refs > 0)
        return;
    sf_map_foreach(c->map, free_ent, NULL);
    sf_map_free(c->map);
    free(c);
}

size_t sp_rcache_len(const sp_rcache *c)
{
    return sf_map_len(c->map);
}

int sp_rcache_inflight(const sp_rcache *c)
{
    return c->inflight;
}

typedef struct expired {
    const char *keys[SP_CACHE_PER_SANDBOX];
    size_t n;
    int64_t now;
} expired;

static void find_expired(const char *key, void *val, void *arg)
{
    expired *x = arg;
    const cache_ent *e = val;

    if (e->expires_ms <= x->now && x->n < SP_CACHE_PER_SANDBOX)
        x->keys[x->n++] = key;
}

int sp_addrs_has(const sp_addrs *a, uint32_t ip)
{
    for (int i = 0; i < a->n; i++)
        if (a->ip[i] == ip)
            return 1;
    return 0;
}

/* Full (the sandbox's own entries only): the expired ones go; none expired, all go. */
static void cache_make_room(sp_rcache *c)
{
    static expired x; /* one thread: too large for the stack of a callback */

    x.n = 0;
    x.now = sf_mono_ms();
    sf_map_foreach(c->map, find_expired, &x);
    if (x.n == 0) {
        sf_map_foreach(c->map, free_ent, NULL);
        sf_map_free(c->map);
        if (!(c->map = sf_map_new(SP_CACHE_PER_SANDBOX)))
            abort();
        return;
    }
    for (size_t i = 0; i < x.n; i++) {
        char key[SP_NAME_MAX];
        snprintf(key, sizeof(key), "%s", x.keys[i]); /* the map owns (and frees) the key */
        free(sf_map_del(c->map, key));
    }
}

static void cache_put(sp_rcache *c, const char *name, const sp_addrs *a)
{
    cache_ent *e = sf_map_get(c->map, name);

    if (!e) {
        if (sf_map_len(c->map) >= SP_CACHE_PER_SANDBOX)
            cache_make_room(c);
        if (!(e = malloc(sizeof(*e))) || sf_map_put(c->map, name, e) < 0) {
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
    sp_rcache *c = rq->c;
    sp_addrs a = {.n = 0, .ttl = TTL_DEFAULT};

    if (result == 0 && res) {
        for (struct evutil_addrinfo *i = res; i && a.n < SP_IPS_MAX; i = i->ai_next)
            if (i->ai_family == AF_INET &&
                !sp_addrs_has(&a, ntohl(((struct sockaddr_in *)i->ai_addr)->sin_addr.s_addr)))
                a.ip[a.n++] = ntohl(((struct sockaddr_in *)i->ai_addr)->sin_addr.s_addr);
        if (a.n)
            cache_put(c, rq->name, &a);
        else
            a.err = -ENOENT;
    } else if (result == EVUTIL_EAI_NONAME || result == EVUTIL_EAI_NODATA) {
        a.err = -ENOENT;
        a.ttl = TTL_MIN;
        cache_put(c, rq->name, &a); /* negative answers are cached briefly too */
    } else {
        a.err = -EAGAIN;
    }
    if (res)
        evutil_freeaddrinfo(res);
    rq->c = NULL;
    c->inflight--;
    deliver(rq, &a);
    sp_rcache_unref(c);
}

sp_rq *sp_resolve(sp_resolver *r, sp_rcache *c, const char *name, sp_resolve_cb cb, void *arg)
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
    } else if ((e = sf_map_get(c->map, name)) && e->expires_ms > sf_mono_ms()) {
        deliver(rq, &e->a);
    } else if (snprintf(rq->name, sizeof(rq->name), "%s", name) >= (int)sizeof(rq->name)) {
        deliver(rq, &a);
    } else if (c->inflight >= SP_LOOKUPS_PER_SANDBOX) {
        a.err = -EAGAIN; /* this sandbox has enough lookups upstream: it may retry */
        deliver(rq, &a);
    } else {
        /* answered at once (hosts file, failure): on_evdns defers through rq->ev */
        rq->c = c;
        c->refs++;
        c->inflight++;
        evdns_getaddrinfo(r->dns, name, NULL, &hints, on_evdns, rq);
    }
    rq->in_call = 0;
    return rq;
}

int sp_resolve_peek(sp_rcache *c, const char *name, sp_addrs *a)
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
    if ((e = sf_map_get(c->map, name)) && e->expires_ms > sf_mono_ms() && e->a.n > 0) {
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
