/* conn.c: the per-address table and the refusal counts (see conn.h). */
#include "conn.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sf_map.h"
#include "sf_util.h"

struct gw_addr_table {
    pthread_mutex_t mu;
    sf_map *map;
};

gw_addr_table *gw_addr_table_new(void)
{
    gw_addr_table *t = calloc(1, sizeof(*t));

    if (!t)
        return NULL;
    if (!(t->map = sf_map_new(1u << 20)) || pthread_mutex_init(&t->mu, NULL) != 0) {
        sf_map_free(t->map);
        free(t);
        return NULL;
    }
    return t;
}

void gw_addr_table_free(gw_addr_table *t)
{
    if (!t)
        return;
    sf_map_free(t->map); /* empty: every connection released its address */
    pthread_mutex_destroy(&t->mu);
    free(t);
}

gw_addr *gw_addr_take(gw_http_server *s, const char *peer, unsigned max, int *full)
{
    gw_addr_table *t = s->addrs;
    gw_addr *a;

    *full = 0;
    pthread_mutex_lock(&t->mu);
    if (!(a = sf_map_get(t->map, peer ? peer : "unknown"))) {
        if ((a = calloc(1, sizeof(*a)))) {
            snprintf(a->key, sizeof(a->key), "%s", peer ? peer : "unknown");
            if (sf_map_put(t->map, a->key, a) < 0) {
                free(a);
                a = NULL;
            }
        }
    }
    if (a && a->conns >= max) {
        *full = a->conns == max ? 1 : 2;
        a = NULL;
    } else if (a) {
        a->conns++;
    }
    pthread_mutex_unlock(&t->mu);
    return a;
}

gw_addr *gw_addr_get(gw_http_server *s, const char *peer)
{
    int full;
    return gw_addr_take(s, peer, UINT32_MAX, &full);
}

void gw_addr_release(gw_http_server *s, gw_addr *a)
{
    gw_addr_table *t = s->addrs;

    if (!a)
        return;
    pthread_mutex_lock(&t->mu);
    if (a->conns > 0)
        a->conns--;
    if (a->conns == 0) {
        sf_map_del(t->map, a->key);
        free(a);
    }
    pthread_mutex_unlock(&t->mu);
}

void gw_http_count_refusal(gw_http_server *s, int status)
{
    static const int codes[] = {400, 408, 413, 429, 431, 503};
    for (size_t i = 0; i < SF_ARRAY_LEN(codes); i++)
        if (codes[i] == status)
            s->stats.refused[i]++;
}
