/* sf_map: string key -> pointer hash map with a hard maximum of entries. Keys are
 * copied; values are the caller's. */
#ifndef SF_MAP_H
#define SF_MAP_H

#include <stddef.h>

typedef struct sf_map sf_map;

sf_map *sf_map_new(size_t max_entries);
void sf_map_free(sf_map *m); /* values are not freed */
/* 0, -EEXIST, -E2BIG (full) or -ENOMEM. */
int sf_map_put(sf_map *m, const char *key, void *val);
void *sf_map_get(const sf_map *m, const char *key);
/* Removes and returns the value (NULL if absent). */
void *sf_map_del(sf_map *m, const char *key);
size_t sf_map_len(const sf_map *m);
/* Calls fn for every entry; fn must not modify the map. */
void sf_map_foreach(const sf_map *m, void (*fn)(const char *key, void *val, void *arg), void *arg);

#endif
