/* sf_records: sandbox records leaving service, as atomic Redis scripts shared by the
 * worker (kill, lost) and the scheduler (dead hosts). A retired record keeps its state
 * for an hour so later calls can say "was killed" / "was lost" instead of "no such
 * sandbox"; it leaves its team's and its host's sets at once. */
#ifndef SF_RECORDS_H
#define SF_RECORDS_H

#include "sf_redis.h"

#include <stdint.h>

/* Sets sandbox id's state (killed, lost, failed) and takes it out of its sets; with
 * only_live, a record already killed/lost/failed is left as it is, and one being
 * killed becomes `killed` (its teardown is what the host lost). */
int sf_records_retire(sf_redis *r, const char *id, const char *state, int only_live,
                      redisCallbackFn *cb, void *priv);
/* A live record (creating, running, paused) becomes `killing` and leaves its team's set
 * (no longer listed or counted against the team's quota): its kill was answered and its
 * teardown runs; the worker retires it (killed, lost) when that ended. */
int sf_records_mark_killing(sf_redis *r, const char *id, redisCallbackFn *cb, void *priv);
/* Every live sandbox placed on host becomes `lost` (the host restarted): blocking, for a
 * worker's start-up before it takes any job. 0 and the number retired in *n, or -EIO. */
int sf_records_retire_host_sync(redisContext *c, const char *host, long long *n);
/* Hosts whose last heartbeat is older than dead_ms are removed, their sandboxes lost. The
 * reply is the number of hosts removed. */
int sf_records_reap(sf_redis *r, int64_t now_ms, int64_t dead_ms, redisCallbackFn *cb,
                    void *priv);

#endif
