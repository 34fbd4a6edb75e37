#include "sf_records.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define KV_MAX 64

/* Releases what placement (scheduler/place.c) reserved for record key of team on host,
 * each part once: the team's part (res_team in the record: sf:team:{t}:res n, mem, vcpu
 * and n@host, mem@host, vcpu@host) when the sandbox leaves its team (killing, or
 * retired), the host's part (res_mem_mib, res_vcpu_milli: the host's res_count,
 * res_mem_mib, res_vcpu_milli) when it is retired. Never below 0; a missing hash is never
 * created; the team's fields at 0 go. */
#define LUA_RELEASE                                                                            \
    "local function dec(key, field, by, drop)\n"                                               \
    "  if by <= 0 then return end\n"                                                           \
    "  local cur = tonumber(redis.call('HGET', key, field))\n"                                 \
    "  if not cur then return end\n"                                                           \
    "  if cur > by then redis.call('HINCRBY', key, field, -by)\n"                              \
    "  elseif drop then redis.call('HDEL', key, field)\n"                                      \
    "  else redis.call('HSET', key, field, 0) end\n"                                           \
    "end\n"                                                                                    \
    "local function release(key, team, host, whole)\n"                                         \
    "  local r = redis.call('HMGET', key, 'res_team', 'res_mem_mib', 'res_vcpu_milli')\n"      \
    "  local mem, vcpu = tonumber(r[2]) or 0, tonumber(r[3]) or 0\n"                           \
    "  if r[1] and host then\n"                                                                \
    "    local tk = 'sf:team:{' .. team .. '}:res'\n"                                          \
    "    dec(tk, 'n', 1, true) dec(tk, 'mem', mem, true) dec(tk, 'vcpu', vcpu, true)\n"        \
    "    dec(tk, 'n@' .. host, 1, true) dec(tk, 'mem@' .. host, mem, true)\n"                  \
    "    dec(tk, 'vcpu@' .. host, vcpu, true)\n"                                               \
    "    redis.call('HDEL', key, 'res_team')\n"                                                \
    "  end\n"                                                                                  \
    "  if whole and r[2] and host then\n"                                                      \
    "    local hk = 'sf:host:{' .. host .. '}'\n"                                              \
    "    dec(hk, 'res_count', 1, false) dec(hk, 'res_mem_mib', mem, false)\n"                  \
    "    dec(hk, 'res_vcpu_milli', vcpu, false)\n"                                             \
    "    redis.call('HDEL', key, 'res_mem_mib', 'res_vcpu_milli')\n"                           \
    "  end\n"                                                                                  \
    "end\n"

/* Shared by the retiring scripts. ARGV[1..3] = now ms, tombstone TTL s, tombstones kept
 * per team; a script's own arguments follow. Field names here are the ones placement
 * (scheduler/store.c) writes: res_* in the host's hash and the record, the team's res
 * hash (n, mem, vcpu, and n@host, mem@host, vcpu@host). */
#define LUA_RETIRE                                                                             \
    "#!lua flags=allow-oom\n"                                                                  \
    "local NOW, TTL, KEEP = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])\n"         \
    "local function dead(st) return st == 'killed' or st == 'failed' or st == 'lost' end\n"    \
    LUA_RELEASE                                                                                \
    "local function retire(id, state, only_live)\n"                                            \
    "  local key = 'sf:sb:{' .. id .. '}'\n"                                                   \
    "  local v = redis.call('HMGET', key, 'team', 'host', 'state')\n"                          \
    "  if not v[1] then return 0 end\n"                                                        \
    "  if only_live and dead(v[3]) then return 0 end\n"                                        \
    "  if only_live and v[3] == 'killing' then state = 'killed' end\n"                         \
    "  release(key, v[1], v[2], true)\n"                                                       \
    "  redis.call('HDEL', key, 'metadata')\n"                                                  \
    "  redis.call('HSET', key, 'state', state, 'retired', NOW)\n"                              \
    "  redis.call('EXPIRE', key, TTL)\n"                                                       \
    "  redis.call('SREM', 'sf:team:{' .. v[1] .. '}:sandboxes', id)\n"                         \
    "  if v[2] then\n"                                                                      \
    "    redis.call('SREM', 'sf:host:{' .. v[2] .. '}:sandboxes', id)\n"                      \
    "    redis.call('ZREM', 'sf:host:{' .. v[2] .. '}:timers', 't:' .. id, 'i:' .. id, 'd:' .. id)\n" \
    "  end\n"                                                                                 \
    "  local z = 'sf:team:{' .. v[1] .. '}:retired'\n"                                         \
    "  redis.call('ZADD', z, NOW, id)\n"                                                       \
    "  redis.call('ZREMRANGEBYSCORE', z, '-inf', NOW - TTL * 1000)\n"                          \
    "  local over = redis.call('ZCARD', z) - KEEP\n"                                           \
    "  if over > 0 then\n"                                                                     \
    "    for _, old in ipairs(redis.call('ZRANGE', z, 0, over - 1)) do\n"                      \
    "      local ok = 'sf:sb:{' .. old .. '}'\n"                                               \
    "      if dead(redis.call('HGET', ok, 'state')) then redis.call('DEL', ok) end\n"          \
    "    end\n"                                                                                \
    "    redis.call('ZREMRANGEBYRANK', z, 0, over - 1)\n"                                      \
    "  end\n"                                                                                  \
    "  redis.call('PEXPIRE', z, TTL * 1000)\n"                                                 \
    "  return 1\n"                                                                             \
    "end\n"                                                                                    \
    "local function retire_host(h, keep_creating)\n"                                           \
    "  local n, hs = 0, 'sf:host:{' .. h .. '}:sandboxes'\n"                                   \
    "  for _, id in ipairs(redis.call('SMEMBERS', hs)) do\n"                                   \
    "    if not (keep_creating and\n"                                                         \
    "            redis.call('HGET', 'sf:sb:{' .. id .. '}', 'state') == 'creating') then\n"   \
    "      n = n + retire(id, 'lost', true)\n"                                                 \
    "      redis.call('SREM', hs, id)\n"                                                       \
    "    end\n"                                                                                \
    "  end\n"                                                                                  \
    "  if not keep_creating then redis.call('DEL', hs) end\n"                                  \
    "  return n\n"                                                                             \
    "end\n"

/* ARGV[4..6]: id, state, only_live (1/0). */
static const char lua_retire[] = LUA_RETIRE "return retire(ARGV[4], ARGV[5], ARGV[6] == '1')\n";

/* KEYS: the record. A live record (creating, running, paused) becomes `killing`: it
 * leaves its team's set and gives back its team's reservation at once; its host keeps
 * the rest until the teardown ended (retire). */
static const char lua_mark_killing[] =
    "#!lua flags=allow-oom\n" LUA_RELEASE
    "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
    "if v[3] ~= 'creating' and v[3] ~= 'running' and v[3] ~= 'paused' then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'state', 'killing')\n"
    "redis.call('SREM', 'sf:team:{' .. v[1] .. '}:sandboxes', ARGV[1])\n"
    "release(KEYS[1], v[1], v[2], false)\n"
    "return 1\n";

/* ARGV[4]: host. A record still `creating` stays: its create job may still be on its way to
 * the restarted worker, which then starts it (no orphan, no false `lost`). */
static const char lua_retire_host[] = LUA_RETIRE "return retire_host(ARGV[4], true)\n";

/* ARGV[4]: the cutoff (ms): hosts whose heartbeat is older are dead. */
static const char lua_reap[] =
    LUA_RETIRE
    "local dead_hosts = redis.call('ZRANGEBYSCORE', 'sf:hosts', '-inf', '(' .. ARGV[4])\n"
    "for _, h in ipairs(dead_hosts) do\n"
    "  retire_host(h, false)\n"
    "  redis.call('ZREM', 'sf:hosts', h)\n"
    "  redis.call('DEL', 'sf:host:{' .. h .. '}')\n"
    "end\n"
    "return #dead_hosts\n";

/* KEYS: host hash, sf:hosts. ARGV: host, now, expire ms, field, value... */
static const char lua_heartbeat[] =
    "#!lua flags=allow-oom\n"
    "if #ARGV > 3 then redis.call('HSET', KEYS[1], unpack(ARGV, 4)) end\n"
    "redis.call('PEXPIRE', KEYS[1], ARGV[3])\n"
    "redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])\n"
    "return 1\n";

/* KEYS: the record. ARGV: id, host, field, value... */
static const char lua_started[] =
    "#!lua flags=allow-oom\n"
    "local v = redis.call('HMGET', KEYS[1], 'team', 'state')\n"
    "if not v[1] or v[2] == 'killed' or v[2] == 'failed' or v[2] == 'lost' then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'state', 'running', unpack(ARGV, 3))\n"
    "redis.call('SADD', 'sf:team:{' .. v[1] .. '}:sandboxes', ARGV[1])\n"
    "redis.call('SADD', 'sf:host:{' .. ARGV[2] .. '}:sandboxes', ARGV[1])\n"
    "return 1\n";

/* KEYS: the record. ARGV: now. */
static const char lua_touch[] =
    "#!lua flags=allow-oom\n"
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'last_active', ARGV[1])\n"
    "return 1\n";

/* KEYS: the record. ARGV: field, value, ... (set while the record is live). */
static const char lua_set[] =
    "local st = redis.call('HGET', KEYS[1], 'state')\n"
    "if not st or st == 'killed' or st == 'failed' or st == 'lost' then return 0 end\n"
    "redis.call('HSET', KEYS[1], unpack(ARGV))\n"
    "return 1\n";

/* "EVAL script 0 now ttl keep" + extra arguments. */
static int retiring(sf_redis *r, redisContext *sync, const char *script, int64_t now_ms,
                    int n, const char *const *extra, redisCallbackFn *cb, void *priv,
                    redisReply **out)
{
    const char *argv[10];
    char now[24], ttl[24], keep[24];
    int argc = 0;

    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(ttl, sizeof(ttl), "%d", SF_RETIRED_TTL_S);
    snprintf(keep, sizeof(keep), "%d", SF_RETIRED_KEEP);
    argv[argc++] = "EVAL";
    argv[argc++] = script;
    argv[argc++] = "0";
    argv[argc++] = now;
    argv[argc++] = ttl;
    argv[argc++] = keep;
    for (int i = 0; i < n; i++)
        argv[argc++] = extra[i];
    if (sync) {
        *out = redisCommandArgv(sync, argc, argv, NULL);
        return *out ? 0 : -EIO;
    }
    return sf_redis_cmdargv(r, cb, priv, argc, argv, NULL);
}

int sf_records_retire(sf_redis *r, const char *id, const char *state, int only_live,
                      redisCallbackFn *cb, void *priv)
{
    const char *extra[] = {id, state, only_live ? "1" : "0"};

    return retiring(r, NULL, lua_retire, sf_now_ms(), 3, extra, cb, priv, NULL);
}

int sf_records_mark_killing(sf_redis *r, const char *id, redisCallbackFn *cb, void *priv)
{
    char key[128];
    const char *argv[] = {"EVAL", lua_mark_killing, "1", key, id};

    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    return sf_redis_cmdargv(r, cb, priv, (int)SF_ARRAY_LEN(argv), argv, NULL);
}

int sf_records_retire_host_sync(redisContext *c, const char *host, long long *n)
{
    redisReply *rep = NULL;
    int rc = retiring(NULL, c, lua_retire_host, sf_now_ms(), 1, &host, NULL, NULL, &rep);

    if (rc == 0 && rep->type != REDIS_REPLY_INTEGER)
        rc = -EIO;
    if (rc == 0)
        *n = rep->integer;
    if (rep)
        freeReplyObject(rep);
    return rc;
}

int sf_records_reap(sf_redis *r, int64_t now_ms, int64_t dead_ms, redisCallbackFn *cb,
                    void *priv)
{
    char cutoff[24];
    const char *extra[] = {cutoff};

    snprintf(cutoff, sizeof(cutoff), "%lld", (long long)(now_ms - dead_ms));
    return retiring(r, NULL, lua_reap, now_ms, 1, extra, cb, priv, NULL);
}

/* "EVAL script nkeys keys... args... kv..." */
static int eval_kv(sf_redis *r, const char *script, int nkeys, const char *const *keys,
                   int nargs, const char *const *args, size_t nkv, const char *const *kv,
                   redisCallbackFn *cb, void *priv)
{
    const char *argv[3 + 4 + 4 + KV_MAX];
    char nk[16];
    int argc = 0;

    if (nkv % 2 || nkv > KV_MAX || nkeys < 0 || nkeys > 4 || nargs < 0 || nargs > 4)
        return -EINVAL;
    snprintf(nk, sizeof(nk), "%d", nkeys);
    argv[argc++] = "EVAL";
    argv[argc++] = script;
    argv[argc++] = nk;
    for (int i = 0; i < nkeys; i++)
        argv[argc++] = keys[i];
    for (int i = 0; i < nargs; i++)
        argv[argc++] = args[i];
    for (size_t i = 0; i < nkv; i++)
        argv[argc++] = kv[i];
    return sf_redis_cmdargv(r, cb, priv, argc, argv, NULL);
}

int sf_records_heartbeat_sync(redisContext *c, const char *host, int64_t now_ms,
                              int64_t expire_ms, size_t nkv, const char *const *kv, char *err,
                              size_t errlen)
{
    const char *argv[3 + 2 + 3 + KV_MAX];
    char key[128], now[24], expire[24];
    redisReply *rep;
    int argc = 0, rc = 0;

    if (nkv % 2 || nkv > KV_MAX)
        return -EINVAL;
    for (size_t i = 0; i + 1 < nkv; i += 2)
        if (!strncmp(kv[i], "res_", 4)) /* the scheduler's reservations */
            return -EINVAL;
    snprintf(key, sizeof(key), SF_RK_HOST, host);
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(expire, sizeof(expire), "%lld", (long long)expire_ms);
    argv[argc++] = "EVAL";
    argv[argc++] = lua_heartbeat;
    argv[argc++] = "2";
    argv[argc++] = key;
    argv[argc++] = SF_RK_HOSTS;
    argv[argc++] = host;
    argv[argc++] = now;
    argv[argc++] = expire;
    for (size_t i = 0; i < nkv; i++)
        argv[argc++] = kv[i];
    if (!(rep = redisCommandArgv(c, argc, argv, NULL)))
        return -EIO;
    if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "%s", rep->str);
        rc = -EPROTO;
    }
    freeReplyObject(rep);
    return rc;
}

int sf_records_started(sf_redis *r, const char *id, const char *host, size_t nkv,
                       const char *const *kv, redisCallbackFn *cb, void *priv)
{
    char key[128];
    const char *keys[] = {key};
    const char *args[] = {id, host};

    for (size_t i = 0; i + 1 < nkv; i += 2)
        if (!strncmp(kv[i], "res_", 4) || !strcmp(kv[i], "state"))
            return -EINVAL;
    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    return eval_kv(r, lua_started, 1, keys, 2, args, nkv, kv, cb, priv);
}

int sf_records_touch(sf_redis *r, const char *id, int64_t now_ms, redisCallbackFn *cb,
                     void *priv)
{
    char key[128], now[24];
    const char *keys[] = {key};
    const char *args[] = {now};

    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    return eval_kv(r, lua_touch, 1, keys, 1, args, 0, NULL, cb, priv);
}

int sf_records_set(sf_redis *r, const char *id, size_t nkv, const char *const *kv,
                   redisCallbackFn *cb, void *priv)
{
    char key[128];
    const char *keys[] = {key};

    if (nkv == 0 || nkv % 2)
        return -EINVAL;
    for (size_t i = 0; i < nkv; i += 2)
        if (!strncmp(kv[i], "res_", 4) || !strcmp(kv[i], "state") || !strcmp(kv[i], "team") ||
            !strcmp(kv[i], "host"))
            return -EINVAL;
    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    return eval_kv(r, lua_set, 1, keys, 0, NULL, nkv, kv, cb, priv);
}
