#include "sf_map.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct map_ent {
    struct map_ent *next;
    void *val;
    char key[];
} map_ent;

struct sf_map {
    map_ent **slots;
    size_t nslots, len, max;
};

static uint64_t map_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

sf_map *sf_map_new(size_t max_entries)
{
    sf_map *m = calloc(1, sizeof(*m));

    if (!m)
        return NULL;
    m->nslots = 64;
    while (m->nslots < max_entries / 2 && m->nslots < (1u << 20))
        m->nslots *= 2;
    if (!(m->slots = calloc(m->nslots, sizeof(*m->slots)))) {
        free(m);
        return NULL;
    }
    m->max = max_entries;
    return m;
}

void sf_map_free(sf_map *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nslots; i++) {
        map_ent *e = m->slots[i], *n;
        for (; e; e = n) {
            n = e->next;
            free(e);
        }
    }
    free(m->slots);
    free(m);
}

static map_ent **map_find(const sf_map *m, const char *key)
{
    map_ent **pe = &m->slots[map_hash(key) & (m->nslots - 1)];
    for (; *pe; pe = &(*pe)->next)
        if (!strcmp((*pe)->key, key))
            return pe;
    return pe;
}

int sf_map_put(sf_map *m, const char *key, void *val)
{
    map_ent **pe = map_find(m, key), *e;
    size_t klen = strlen(key);

    if (*pe)
        return -EEXIST;
    if (m->len >= m->max)
        return -E2BIG;
    if (!(e = malloc(sizeof(*e) + klen + 1)))
        return -ENOMEM;
    memcpy(e->key, key, klen + 1);
    e->val = val;
    e->next = NULL;
    *pe = e;
    m->len++;
    return 0;
}

void *sf_map_get(const sf_map *m, const char *key)
{
    map_ent **pe = map_find(m, key);
    return *pe ? (*pe)->val : NULL;
}

void *sf_map_del(sf_map *m, const char *key)
{
    map_ent **pe = map_find(m, key), *e = *pe;
    void *val;

    if (!e)
        return NULL;
    *pe = e->next;
    val = e->val;
    free(e);
    m->len--;
    return val;
}

size_t sf_map_len(const sf_map *m)
{
    return m->len;
}

void sf_map_foreach(const sf_map *m, void (*fn)(const char *key, void *val, void *arg), void *arg)
{
    for (size_t i = 0; i < m->nslots; i++)
        for (map_ent *e = m->slots[i]; e; e = e->next)
            fn(e->key, e->val, arg);
}
