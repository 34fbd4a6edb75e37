#include "sf_claim.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define RK_TEAM_CLAIMS "sf:team:{%s}:cc"       /* zset: claim key -> expiry (ms) */
#define RK_TEAM_CLAIM_BYTES "sf:team:{%s}:ccb" /* hash: claim key -> bytes */

/* KEYS: the team's zset, its sizes, the claim. ARGV: data, now ms, ttl ms, budget. Expired
 * claims leave the budget first; the bookkeeping keys live as long as their newest claim
 * could. Not allow-oom: a full Redis refuses it whole. */
static const char lua_put[] =
    "#!lua\n"
    "local now, ttl, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "local n = string.len(ARGV[1])\n"
    "for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do\n"
    "  redis.call('HDEL', KEYS[2], k)\n"
    "end\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "local used = 0\n"
    "for _, v in ipairs(redis.call('HVALS', KEYS[2])) do used = used + tonumber(v) end\n"
    "used = used - (tonumber(redis.call('HGET', KEYS[2], KEYS[3])) or 0)\n"
    "if used + n > budget then return {'over', used} end\n"
    "redis.call('SET', KEYS[3], ARGV[1], 'PX', ttl)\n"
    "redis.call('ZADD', KEYS[1], now + ttl, KEYS[3])\n"
    "redis.call('HSET', KEYS[2], KEYS[3], n)\n"
    "redis.call('PEXPIRE', KEYS[1], ttl)\n"
    "redis.call('PEXPIRE', KEYS[2], ttl)\n"
    "return {'ok', used + n}\n";

/* KEYS as above. Frees: allow-oom. Returns the claim's bytes or nil. */
static const char lua_take[] =
    "#!lua flags=allow-oom\n"
    "local v = redis.call('GET', KEYS[3])\n"
    "redis.call('DEL', KEYS[3])\n"
    "redis.call('ZREM', KEYS[1], KEYS[3])\n"
    "redis.call('HDEL', KEYS[2], KEYS[3])\n"
    "return v\n";

int sf_claim_key(char *buf, size_t n, const char *team, const char *job, int reply,
                 const char *field)
{
    int r = snprintf(buf, n, "sf:cc:{%s}:%s:%c:%s", team, job, reply ? 'r' : 'a', field);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

static int keys(char k[3][SF_CLAIM_KEY_MAX], const char *team, const char *job, int reply,
                const char *field)
{
    int a = snprintf(k[0], SF_CLAIM_KEY_MAX, RK_TEAM_CLAIMS, team);
    int b = snprintf(k[1], SF_CLAIM_KEY_MAX, RK_TEAM_CLAIM_BYTES, team);

    if (a < 0 || a >= SF_CLAIM_KEY_MAX || b < 0 || b >= SF_CLAIM_KEY_MAX)
        return -ENAMETOOLONG;
    return sf_claim_key(k[2], SF_CLAIM_KEY_MAX, team, job, reply, field);
}

int sf_claim_put(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                 const char *data, size_t len, int64_t budget, redisCallbackFn *cb, void *priv)
{
    char k[3][SF_CLAIM_KEY_MAX], now[24], ttl[24], bud[24];
    const char *argv[10];
    size_t argvlen[10];
    int rc;

    if ((rc = keys(k, team, job, reply, field)) < 0)
        return rc;
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%d", SF_CLAIM_TTL_MS);
    snprintf(bud, sizeof(bud), "%lld", (long long)budget);
    argv[0] = "EVAL";
    argv[1] = lua_put;
    argv[2] = "3";
    argv[3] = k[0];
    argv[4] = k[1];
    argv[5] = k[2];
    argv[6] = data;
    argv[7] = now;
    argv[8] = ttl;
    argv[9] = bud;
    for (int i = 0; i < 10; i++)
        argvlen[i] = strlen(argv[i]);
    argvlen[6] = len;
    return sf_redis_cmdargv(r, cb, priv, 10, argv, argvlen);
}

static int take(sf_redis *r, const char *team, const char *job, int reply, const char *field,
                redisCallbackFn *cb, void *priv)
{
    char k[3][SF_CLAIM_KEY_MAX];
    const char *argv[6];
    int rc;

    if ((rc = keys(k, team, job, reply, field)) < 0)
        return rc;
    argv[0] = "EVAL";
    argv[1] = lua_take;
    argv[2] = "3";
    argv[3] = k[0];
    argv[4] = k[1];
    argv[5] = k[2];
    return sf_redis_cmdargv(r, cb, priv, 6, argv, NULL);
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
