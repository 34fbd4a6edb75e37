#include "sf_claim.h"
#include "sf_store.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>


/* The scripts (sf_store.c: claim_put, claim_take): KEYS = the team's claims (zset), their
 * sizes (hash), the claim: one slot, the team's. */

int sf_claim_key(char *buf, size_t n, const char *team, const char *job, int reply,
                 const char *field)
{
    int r = snprintf(buf, n, SF_RK_CLAIM, team, job, reply ? 'r' : 'a', field);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

static int keys(char k[3][SF_CLAIM_KEY_MAX], const char *team, const char *job, int reply,
                const char *field)
{
    int a = snprintf(k[0], SF_CLAIM_KEY_MAX, SF_RK_TEAM_CLAIMS, team);
    int b = snprintf(k[1], SF_CLAIM_KEY_MAX, SF_RK_TEAM_CLAIM_BYTES, team);

    if (a < 0 || a >= SF_CLAIM_KEY_MAX || b < 0 || b >= SF_CLAIM_KEY_MAX)
        return -ENAMETOOLONG;
    return sf_claim_key(k[2], SF_CLAIM_KEY_MAX, team, job, reply, field);
}

int sf_claim_put(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                 const char *data, size_t len, int64_t budget, redisCallbackFn *cb, void *priv)
{
    char k[3][SF_CLAIM_KEY_MAX], now[24], ttl[24], bud[24];
    const char *argv[7];
    size_t argvlen[7];
    int rc;

    if ((rc = keys(k, team, job, reply, field)) < 0)
        return rc;
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%d", SF_CLAIM_TTL_MS);
    snprintf(bud, sizeof(bud), "%lld", (long long)budget);
    argv[0] = k[0];
    argv[1] = k[1];
    argv[2] = k[2];
    argv[3] = data;
    argv[4] = now;
    argv[5] = ttl;
    argv[6] = bud;
    for (int i = 0; i < 7; i++)
        argvlen[i] = strlen(argv[i]);
    argvlen[3] = len;
    return sf_redis_script_call(r, &sf_store_claim_put, cb, priv, 3, 4, argv, argvlen);
}

static int take(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                redisCallbackFn *cb, void *priv)
{
    char k[3][SF_CLAIM_KEY_MAX];
    const char *argv[3];
    size_t lens[3];
    int rc;

    if ((rc = keys(k, team, job, reply, field)) < 0)
        return rc;
    for (int i = 0; i < 3; i++) {
        argv[i] = k[i];
        lens[i] = strlen(k[i]);
    }
    return sf_redis_script_call(r, &sf_store_claim_take, cb, priv, 3, 0, argv, lens);
}

int sf_claim_take(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                  redisCallbackFn *cb, void *priv)
{
    return take(r, team, job, reply, field, cb, priv);
}

int sf_claim_read(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                  redisCallbackFn *cb, void *priv)
{
    char k[SF_CLAIM_KEY_MAX];
    const char *argv[2] = {"GET", k};
    int rc;

    if ((rc = sf_claim_key(k, sizeof(k), team, job, reply, field)) < 0)
        return rc;
    return sf_redis_cmdargv(r, cb, priv, 2, argv, NULL);
}

int sf_claim_drop(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                  redisCallbackFn *cb, void *priv)
{
    return take(r, team, job, reply, field, cb, priv);
}

int sf_claim_put_verdict(const redisReply *rep, long long *used)
{
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING ||
        rep->element[1]->type != REDIS_REPLY_INTEGER)
        return -1;
    if (used)
        *used = rep->element[1]->integer;
    return !strcmp(rep->element[0]->str, "ok") ? 1 : 0;
}
