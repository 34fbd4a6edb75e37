/* sf_claim: claim checks (docs/internals/job-guard.md). Kafka messages stay small: a large
 * string of a job's arguments (file content to write) or of a reply's result (a file read, a
 * ZIP) is stored in Redis under a short-lived key, and the envelope names the field in its
 * `claims` list instead (schemas/envelope.md). The key follows from the envelope, so a
 * message can only name claims of its own team and job:
 *
 *   sf:cc:{<team>}:<job id>:a:<arg>      an argument (written by the gateway or a batch
 *                                        producer, taken by the worker)
 *   sf:cc:{<team>}:<job id>:r:<field>    a result field (written by the worker, taken by
 *                                        the gateway)
 *
 * Every claim counts against its team's byte budget while it exists (sf:team:{<team>}:cc,
 * a zset of claim keys by expiry, and sf:team:{<team>}:ccb, their sizes): one team's large
 * files can never fill Redis for the others. A claim is taken (read and deleted, giving
 * its bytes back) once; one nobody takes expires with its TTL.
 *
 * Library code: no logging. Functions return 0 or -errno. */
#ifndef SF_CLAIM_H
#define SF_CLAIM_H

#include "sf_store.h" /* the key layout, the scripts */

#include <stddef.h>
#include <stdint.h>

#define SF_CLAIM_MIN (256 * 1024)     /* strings at least this long travel by claim check */
#define SF_CLAIM_TTL_MS (300 * 1000)  /* a claim nobody takes is gone after this */
#define SF_CLAIM_KEY_MAX 256

/* Writes the key of a claim (reply: 1 for a result field, 0 for an argument). */
int sf_claim_key(char *buf, size_t n, const char *team, const char *job, int reply,
                 const char *field);

/* Stores len bytes of data as a claim, if the team's claims stay within budget bytes.
 * cb's reply: an array {"ok", bytes in use} or {"over", bytes in use}; an OOM error when
 * Redis is full (sf_redis_is_oom). -ENOTCONN when Redis is down (cb not called). */
int sf_claim_put(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                 const char *data, size_t len, int64_t budget, redisCallbackFn *cb, void *priv);
/* Takes a claim: cb's reply is its bytes (a string), or nil when it is gone (expired or
 * taken already). */
int sf_claim_take(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                  redisCallbackFn *cb, void *priv);
/* Reads a claim and leaves it in place (it goes with its TTL, counted in the team's
 * budget until then): for an answer that may be asked for again (an idempotent call's).
 * cb's reply: its bytes (a string), or nil when it is gone. */
int sf_claim_read(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                  redisCallbackFn *cb, void *priv);
/* Drops a claim nobody will take (the call failed before it was sent). */
int sf_claim_drop(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                  redisCallbackFn *cb, void *priv);

/* The verdict of a put's reply: 1 stored, 0 over budget (*used: the bytes in use), -1
 * anything else (Redis down or full: check sf_redis_is_oom). */
int sf_claim_put_verdict(const redisReply *rep, long long *used);

#endif
