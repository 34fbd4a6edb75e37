/* sf_records: the sandbox records' writes that the worker and the scheduler share, each
 * one atomic Redis script (schemas/redis-keys.md).
 *
 * Retiring a record (killed, lost, failed) takes it out of its team's and host's sets,
 * releases what placement reserved for it (the scheduler's res_* fields of its host and
 * its team's sf:team:{t}:res; a sandbox being killed gave back its team's part already),
 * and leaves a small tombstone (no metadata) so later calls
 * can say "was killed" / "was lost" instead of "no such sandbox". Tombstones are bounded
 * in time (SF_RETIRED_TTL_S) and in number per team (SF_RETIRED_KEEP, oldest dropped).
 *
 * Redis runs with maxmemory and noeviction: writes that grow memory are refused when it is
 * full. The writes here do not grow it (they overwrite fields of records that exist, or
 * free space), and must land even then, or a full Redis would stop kills, turn records
 * stale and let every host look dead: they run with allow-oom. A record that no longer
 * exists is never re-created by them.
 *
 * The writes of one record go by SHA with every key declared (schemas/redis-keys.md): those
 * whose keys follow from the record's team and host read them first. Scripts are kept per
 * process: call them from one thread (the event loop). */
#ifndef SF_RECORDS_H
#define SF_RECORDS_H

#include "sf_store.h" /* the key layout, the scripts */

#include <stddef.h>
#include <stdint.h>

#define SF_RETIRED_TTL_S 3600 /* a tombstone lives this long... */
#define SF_RETIRED_KEEP 100   /* ...and a team keeps at most this many */

/* Sets sandbox id's state (killed, lost, failed) and retires it as above; with only_live,
 * a record already killed/lost/failed is left as it is, and one being killed becomes
 * `killed` (its teardown is what the host lost). The reply is 1 when retired. */
int sf_records_retire(sf_redis *r, const char *id, const char *state, int only_live,
                      redisCallbackFn *cb, void *priv);
/* A live record (creating, running, paused) becomes `killing`, leaves its team's set and
 * gives back its team's reservation (no longer listed or counted against the team's
 * limits): its kill was answered and its teardown runs; the host's reservation stays
 * until the worker retires it (killed, lost) when that ended. */
int sf_records_mark_killing(sf_redis *r, const char *id, redisCallbackFn *cb, void *priv);
/* Every live sandbox placed on host becomes `lost` (the host restarted): blocking, for a
 * worker's start-up before it takes any job. 0 and the number retired in *n, or -EIO. */
int sf_records_retire_host_sync(redisContext *c, const char *host, long long *n);
/* The same, leaving the sandboxes keep(id, arg) says 1 for (a restarted worker took them
 * back: they run on). */
int sf_records_retire_host_except_sync(redisContext *c, const char *host,
                                       int (*keep)(const char *id, void *arg), void *arg,
                                       long long *n);
/* Hosts whose last heartbeat is older than dead_ms are removed, their sandboxes lost, the
 * template builds still running there failed (the host's :tpls, tpl_host_lost). The reply
 * is the number of hosts removed. */
int sf_records_reap(sf_redis *r, int64_t now_ms, int64_t dead_ms, redisCallbackFn *cb,
                    void *priv);

/* The worker's writes. kv: nkv strings, field then value (nkv even, at most 64). */
/* A heartbeat, blocking (the worker beats from its own thread and connection): the fields
 * into sf:host:{host} (never the scheduler's res_* fields: -EINVAL), the hash's expiry,
 * and host's score in sf:hosts. 0, -EIO (the connection broke: reconnect), or -EPROTO
 * with Redis's error in err. */
int sf_records_heartbeat_sync(redisContext *c, const char *host, int64_t now_ms,
                              int64_t expire_ms, size_t nkv, const char *const *kv, char *err,
                              size_t errlen);
/* A sandbox started: state=running plus the fields into its record, and back into its
 * team's and host's sets, only while the record exists and is live. The reply is 1, or 0
 * when the record was retired (or dropped) meanwhile. */
int sf_records_started(sf_redis *r, const char *id, const char *host, size_t nkv,
                       const char *const *kv, redisCallbackFn *cb, void *priv);
/* Fields of a live record (creating, running, paused; never state, team, host or res_*:
 * -EINVAL), e.g. a sandbox's egress rules after an update. The reply is 1, or 0 when the
 * record is gone or retired. */
int sf_records_set(sf_redis *r, const char *id, size_t nkv, const char *const *kv,
                   redisCallbackFn *cb, void *priv);
/* Deletes fields of a live record: only a preview port's `pv:<port>` (else -EINVAL; at
 * most 64). The reply is 1, or 0 when the record is gone or retired. Lands when Redis is
 * full. */
int sf_records_unset(sf_redis *r, const char *id, size_t n, const char *const *fields,
                     redisCallbackFn *cb, void *priv);
/* last_active = now_ms, if the record still exists. */
int sf_records_touch(sf_redis *r, const char *id, int64_t now_ms, redisCallbackFn *cb,
                     void *priv);

#endif
