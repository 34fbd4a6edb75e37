/* idem.h: idempotency keys (idem.c). A tools/call with _meta["sandfleet/idempotency_key"]
 * (GW_META_IDEMPOTENCY_KEY: 1-128 printable characters, scoped to the team) gets a job id
 * (and for sandbox_create a sandbox id) derived from the key, and its final answer is kept
 * 24 h in Redis (SF_RK_IDEM). A retry with the same key, on any gateway, gets the first
 * answer instead of running the call again: from Redis when the first call finished, else
 * by publishing the same job again, which the worker's job guard answers once. */
#ifndef GW_IDEM_H
#define GW_IDEM_H

#include "gateway.h"

#define GW_IDEM_RKEY_MAX (SF_ID_MAX + 64) /* the record's Redis key */

/* Derives job->id (and job->sandbox for sandbox_create: job->tool must be set) and the
 * record's Redis key (rkey, n >= GW_IDEM_RKEY_MAX) from team and the client's key. 0, or
 * -EINVAL with *why the user-facing sentence (the key is not 1-128 printable characters). */
int gw_idem_derive(const char *team, const json_t *key, sf_job *job, char *rkey, size_t n,
                   const char **why);
/* Looks up the record rkey of team's call (job id job, for the log): cb(arg, status, first)
 * once, with status 1 and the first call's answer (its large values fetched again, or an
 * error reply saying they are gone; valid during the callback), 0 (no record: the call is
 * new or still running), or -EIO (Redis is unreachable). May call cb before returning. */
typedef void (*gw_idem_cb)(void *arg, int status, const sf_reply *first);
void gw_idem_lookup(gw_ctx *ctx, const char *team, const char *rkey, const char *job,
                    gw_idem_cb cb, void *arg);
/* Keeps r, the final answer of job, under rkey for 24 h (failures are logged: a retry may
 * then run the call again). */
void gw_idem_store(gw_ctx *ctx, const char *rkey, const char *job, const sf_reply *r);

#endif
