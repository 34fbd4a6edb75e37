#include "sf_timers.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Every script: KEYS[1] the record, KEYS[2] the host's timers (sf_timers_due: only the
 * timers); ARGV[1] the sandbox id. The state changes must land even when Redis is full
 * (allow-oom: they replace fields and move a timer); a new sandbox's timers need room. */

/* ARGV: id, now, timeout_at, lifetime_at, idle_ms, auto_delete_s. */
static const char lua_start[] =
    "#!lua\n"
    "local st = redis.call('HGET', KEYS[1], 'state')\n"
    "if st ~= 'running' and st ~= 'creating' then return 0 end\n"
    "local now, idle, ad = tonumber(ARGV[2]), tonumber(ARGV[5]), tonumber(ARGV[6])\n"
    "redis.call('HSET', KEYS[1], 'timeout_at', ARGV[3], 'lifetime_at', ARGV[4], 'idle_ms', idle)\n"
    "if ad > 0 then redis.call('HSET', KEYS[1], 'auto_delete_seconds', ad) end\n"
    "redis.call('ZADD', KEYS[2], ARGV[3], 't:' .. ARGV[1])\n"
    "if idle > 0 then redis.call('ZADD', KEYS[2], now + idle, 'i:' .. ARGV[1]) end\n"
    "return 1\n";

/* ARGV: id, now. */
static const char lua_touch[] =
    "#!lua flags=allow-oom\n"
    "local idle = tonumber(redis.call('HGET', KEYS[1], 'idle_ms') or '0') or 0\n"
    "if idle <= 0 then return 0 end\n"
    "return redis.call('ZADD', KEYS[2], 'XX', tonumber(ARGV[2]) + idle, 'i:' .. ARGV[1])\n";

/* ARGV: id, now. */
static const char lua_paused[] =
    "#!lua flags=allow-oom\n"
    "if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'state', 'paused', 'paused_at', ARGV[2])\n"
    "redis.call('ZREM', KEYS[2], 'i:' .. ARGV[1])\n"
    "local ad = tonumber(redis.call('HGET', KEYS[1], 'auto_delete_seconds') or '0') or 0\n"
    "if ad > 0 then\n"
    "  redis.call('ZADD', KEYS[2], tonumber(ARGV[2]) + ad * 1000, 'd:' .. ARGV[1])\n"
    "end\n"
    "return 1\n";

/* ARGV: id, now. */
static const char lua_resumed[] =
    "#!lua flags=allow-oom\n"
    "if redis.call('HGET', KEYS[1], 'state') ~= 'paused' then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'state', 'running')\n"
    "redis.call('HDEL', KEYS[1], 'paused_at')\n"
    "redis.call('ZREM', KEYS[2], 'd:' .. ARGV[1])\n"
    "local idle = tonumber(redis.call('HGET', KEYS[1], 'idle_ms') or '0') or 0\n"
    "if idle > 0 then redis.call('ZADD', KEYS[2], tonumber(ARGV[2]) + idle, 'i:' .. ARGV[1]) end\n"
    "return 1\n";

/* KEYS: the timers. ARGV: now, max. */
static const char lua_due[] =
    "#!lua flags=allow-oom\n"
    "local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, "
    "tonumber(ARGV[2]))\n"
    "if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end\n"
    "return due\n";

/* KEYS: the record. ARGV: id, team, now, set metadata (1/0), metadata, timeout (s, -1 keep,
 * -2 reset), auto_delete (s, -1 keep, 0 none). The host's timers key follows from the
 * record's host. */
static const char lua_update[] =
    "#!lua flags=allow-oom\n"
    "local id, now = ARGV[1], tonumber(ARGV[3])\n"
    "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state', 'lifetime_at', "
    "'paused_at')\n"
    "if not v[1] or v[1] ~= ARGV[2] then return {'none', ''} end\n"
    "local st = v[3] or ''\n"
    "if st == 'creating' or not v[2] then return {'starting', st} end\n"
    "if st ~= 'running' and st ~= 'paused' then return {'dead', st} end\n"
    "local z = 'sf:host:{' .. v[2] .. '}:timers'\n"
    "if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'metadata', ARGV[5]) end\n"
    "local t, ad = tonumber(ARGV[6]), tonumber(ARGV[7])\n"
    "if t == -2 then\n"
    "  redis.call('HDEL', KEYS[1], 'timeout_seconds')\n"
    "  local at = tonumber(v[4])\n"
    "  if at then\n"
    "    redis.call('HSET', KEYS[1], 'timeout_at', at)\n"
    "    redis.call('ZADD', z, at, 't:' .. id)\n"
    "  end\n"
    "elseif t > 0 then\n"
    "  redis.call('HSET', KEYS[1], 'timeout_seconds', t, 'timeout_at', now + t * 1000)\n"
    "  redis.call('ZADD', z, now + t * 1000, 't:' .. id)\n"
    "end\n"
    "if ad == 0 then\n"
    "  redis.call('HDEL', KEYS[1], 'auto_delete_seconds')\n"
    "  redis.call('ZREM', z, 'd:' .. id)\n"
    "elseif ad > 0 then\n"
    "  redis.call('HSET', KEYS[1], 'auto_delete_seconds', ad)\n"
    "  if st == 'paused' and tonumber(v[5]) then\n"
    "    redis.call('ZADD', z, tonumber(v[5]) + ad * 1000, 'd:' .. id)\n"
    "  end\n"
    "end\n"
    "return {'ok', st}\n";

typedef struct keyset {
    char rec[128];
    char timers[128];
} keyset;

static int keys_of(keyset *k, const char *id, const char *host)
{
    int a = snprintf(k->rec, sizeof(k->rec), SF_RK_SANDBOX, id ? id : "");
    int b = snprintf(k->timers, sizeof(k->timers), SF_RK_HOST_TIMERS, host ? host : "");

    if (a < 0 || (size_t)a >= sizeof(k->rec) || b < 0 || (size_t)b >= sizeof(k->timers))
        return -ENAMETOOLONG;
    return 0;
}

/* EVAL script 2 record timers id args... */
static int eval2(sf_redis *r, const char *script, const char *id, const char *host, int nargs,
                 const char *const *args, redisCallbackFn *cb, void *priv)
{
    const char *argv[16];
    keyset k;
    int argc = 0, rc;

    if (!id || !host || nargs > 8)
        return -EINVAL;
    if ((rc = keys_of(&k, id, host)) < 0)
        return rc;
    argv[argc++] = "EVAL";
    argv[argc++] = script;
    argv[argc++] = "2";
    argv[argc++] = k.rec;
    argv[argc++] = k.timers;
    argv[argc++] = id;
    for (int i = 0; i < nargs; i++)
        argv[argc++] = args[i];
    return sf_redis_cmdargv(r, cb, priv, argc, argv, NULL);
}

int sf_timers_start(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                    int64_t timeout_at, int64_t lifetime_at, int64_t idle_ms,
                    int64_t auto_delete_s, redisCallbackFn *cb, void *priv)
{
    char a[5][24];
    const char *args[] = {a[0], a[1], a[2], a[3], a[4]};

    snprintf(a[0], sizeof(a[0]), "%lld", (long long)now_ms);
    snprintf(a[1], sizeof(a[1]), "%lld", (long long)timeout_at);
    snprintf(a[2], sizeof(a[2]), "%lld", (long long)lifetime_at);
    snprintf(a[3], sizeof(a[3]), "%lld", (long long)(idle_ms > 0 ? idle_ms : 0));
    snprintf(a[4], sizeof(a[4]), "%lld", (long long)(auto_delete_s > 0 ? auto_delete_s : 0));
    return eval2(r, lua_start, id, host, 5, args, cb, priv);
}

static int eval_now(sf_redis *r, const char *script, const char *id, const char *host,
                    int64_t now_ms, redisCallbackFn *cb, void *priv)
{
    char now[24];
    const char *args[] = {now};

    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    return eval2(r, script, id, host, 1, args, cb, priv);
}

int sf_timers_touch(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                    redisCallbackFn *cb, void *priv)
{
    return eval_now(r, lua_touch, id, host, now_ms, cb, priv);
}

int sf_timers_paused(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                     redisCallbackFn *cb, void *priv)
{
    return eval_now(r, lua_paused, id, host, now_ms, cb, priv);
}

int sf_timers_resumed(sf_redis *r, const char *id, const char *host, int64_t now_ms,
                      redisCallbackFn *cb, void *priv)
{
    return eval_now(r, lua_resumed, id, host, now_ms, cb, priv);
}

int sf_timers_due(sf_redis *r, const char *host, int64_t now_ms, int max, redisCallbackFn *cb,
                  void *priv)
{
    char key[128], now[24], n[16];
    const char *argv[] = {"EVAL", lua_due, "1", key, now, n};
    int w = snprintf(key, sizeof(key), SF_RK_HOST_TIMERS, host ? host : "");

    if (!host || w < 0 || (size_t)w >= sizeof(key) || max < 1)
        return -EINVAL;
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(n, sizeof(n), "%d", max);
    return sf_redis_cmdargv(r, cb, priv, (int)SF_ARRAY_LEN(argv), argv, NULL);
}

int sf_timers_set(sf_redis *r, const char *host, char kind, const char *id, int64_t at_ms,
                  redisCallbackFn *cb, void *priv)
{
    char key[128], at[24], member[80];
    const char *argv[] = {"ZADD", key, at, member};
    int w = snprintf(key, sizeof(key), SF_RK_HOST_TIMERS, host ? host : "");
    int m = snprintf(member, sizeof(member), "%c:%s", kind, id ? id : "");

    if (!host || !id || w < 0 || (size_t)w >= sizeof(key) || m < 0 || (size_t)m >= sizeof(member))
        return -EINVAL;
    snprintf(at, sizeof(at), "%lld", (long long)at_ms);
    return sf_redis_cmdargv(r, cb, priv, (int)SF_ARRAY_LEN(argv), argv, NULL);
}

int sf_timers_clear_host_sync(redisContext *c, const char *host)
{
    char key[128];
    redisReply *rep;
    int w = snprintf(key, sizeof(key), SF_RK_HOST_TIMERS, host ? host : "");
    const char *argv[] = {"DEL", key};

    if (!host || w < 0 || (size_t)w >= sizeof(key))
        return -EINVAL;
    if (!(rep = redisCommandArgv(c, 2, argv, NULL)))
        return -EIO;
    w = rep->type == REDIS_REPLY_ERROR ? -EPROTO : 0;
    freeReplyObject(rep);
    return w;
}

int sf_timers_update(sf_redis *r, const char *id, const char *team, int64_t now_ms,
                     const char *metadata, int64_t timeout_s, int64_t auto_delete_s,
                     redisCallbackFn *cb, void *priv)
{
    char key[128], now[24], t[24], ad[24];
    const char *argv[] = {"EVAL", lua_update, "1", key, id, team, now, metadata ? "1" : "0",
                          metadata ? metadata : "", t, ad};
    int w = snprintf(key, sizeof(key), SF_RK_SANDBOX, id ? id : "");

    if (!id || !team || w < 0 || (size_t)w >= sizeof(key))
        return -EINVAL;
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    snprintf(t, sizeof(t), "%lld", (long long)timeout_s);
    snprintf(ad, sizeof(ad), "%lld", (long long)auto_delete_s);
    return sf_redis_cmdargv(r, cb, priv, (int)SF_ARRAY_LEN(argv), argv, NULL);
}

/* A record's integer field (a string in Redis), or the fallback field, or 0. */
static int64_t field_i64(const json_t *rec, const char *name, const char *fallback)
{
    int64_t n = 0;

    if (sf_parse_i64(json_string_value(json_object_get(rec, name)), 0, INT64_MAX, &n) < 0 &&
        fallback)
        sf_parse_i64(json_string_value(json_object_get(rec, fallback)), 0, INT64_MAX, &n);
    return n;
}

static json_t *iso_ms(int64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    char out[32];

    gmtime_r(&t, &tm);
    strftime(out, sizeof(out), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(out);
}

void sf_timers_view(const json_t *rec, json_t *view)
{
    const char *st = json_string_value(json_object_get(rec, "state"));
    int64_t idle = field_i64(rec, "idle_ms", NULL), ad = field_i64(rec, "auto_delete_seconds", NULL);
    int64_t at = field_i64(rec, "timeout_at", NULL), paused = field_i64(rec, "paused_at", NULL);
    json_t *t;

    if (!view || !st || (strcmp(st, "running") && strcmp(st, "paused")))
        return;
    if (!(t = json_object()))
        return;
    if (at > 0)
        json_object_set_new(t, "timeout_at", iso_ms(at));
    if (!strcmp(st, "running") && idle > 0)
        json_object_set_new(t, "idle_pause_at", iso_ms(field_i64(rec, "last_active", "created") + idle));
    if (!strcmp(st, "paused") && paused > 0) {
        json_object_set_new(view, "paused_at", iso_ms(paused));
        if (ad > 0)
            json_object_set_new(t, "auto_delete_at", iso_ms(paused + ad * 1000));
    }
    if (ad > 0)
        json_object_set_new(view, "auto_delete_seconds", json_integer(ad));
    json_object_set_new(view, "timers", t);
}
