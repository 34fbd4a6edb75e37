/* Sandbox snapshots in Redis (schemas/redis-keys.md): the worker that takes one writes its
 * record (reserve, then finish or drop) and keeps its files; the scheduler finds one for
 * sandbox_create's from_snapshot (its host and shape), lists and deletes them. A snapshot
 * is known by its name (unique in its team) or its id (snp_...); another team's is never
 * found. Keys of one team share its hash tag; every script (state/sf_store.c) declares
 * them: a call that looks at all the team's snapshots (reserve, finish, find, list,
 * delete) first reads the team's set, then runs its script with every record declared
 * (again, at most 3 times, when the set changed in between).
 *
 * Library code: no logging. Functions return 0 or -errno (-ENOTCONN: Redis is down, cb not
 * called). */
#ifndef SF_SNAPSHOTS_H
#define SF_SNAPSHOTS_H

#include "sf_store.h" /* the key layout, the scripts */

#include <stdint.h>

/* What a snapshot record holds beside its name (the flat HGETALL order of
 * sf_snap_find / sf_snap_list is Redis's, field by field). */
typedef struct sf_snap_rec {
    const char *id, *name, *host, *driver, *template_name, *sandbox;
    uint32_t memory_mib, vcpu_milli, disk_mib, pids_max;
    uint64_t inodes;
} sf_snap_rec;

/* A snapshot is being taken (status taking): refused unless the team has fewer than
 * max_n snapshots holding less than max_bytes and the name is free. Reply: {'ok'},
 * {'taken'}, {'count'}, {'bytes'}. */
int sf_snap_reserve(sf_redis *r, const char *team, const sf_snap_rec *s, int64_t now_ms,
                    int64_t max_n, int64_t max_bytes, redisCallbackFn *cb, void *priv);
/* It was taken: size bytes; refused when the team's snapshots would then hold more than
 * max_bytes (the record goes). Reply: {'ok'}, {'bytes'}, {'gone'} (deleted meanwhile). */
int sf_snap_finish(sf_redis *r, const char *team, const char *name, const char *id,
                   uint64_t size, int64_t max_bytes, redisCallbackFn *cb, void *priv);
/* The record of name goes if it is still id's. Reply: 1 or 0. */
int sf_snap_drop(sf_redis *r, const char *team, const char *name, const char *id,
                 redisCallbackFn *cb, void *priv);
/* Does name still name id (its files are to be kept)? stale_taking: a record still
 * `taking` is dropped (its worker restarted). Reply: 1 keep, 0 gone. */
int sf_snap_check(sf_redis *r, const char *team, const char *name, const char *id,
                  int stale_taking, redisCallbackFn *cb, void *priv);
/* The team's snapshot named ref (a name or an id). Reply: its fields as a flat array
 * (HGETALL), empty when there is none. */
int sf_snap_find(sf_redis *r, const char *team, const char *ref, redisCallbackFn *cb,
                 void *priv);
/* Every snapshot of the team: an array of flat arrays (HGETALL), by name. */
int sf_snap_list(sf_redis *r, const char *team, redisCallbackFn *cb, void *priv);
/* Deletes the team's snapshot ref (a name or an id). Reply: {'ok', id, name, host},
 * {'none'}, {'taking'}. Its files go when its host next looks (sf_snap_check). */
int sf_snap_delete(sf_redis *r, const char *team, const char *ref, redisCallbackFn *cb,
                   void *priv);

#endif
