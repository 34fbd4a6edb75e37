#include "sf_records.h"

#include <errno.h>
#include <stdio.h>

/* retire(id, state): defined once, used by all three scripts. */
#define LUA_RETIRE                                                                             \
    "local function retire(id, state, only_live)\n"                                           \
    "  local key = 'sf:sb:{' .. id .. '}'\n"                                                   \
    "  local v = redis.call('HMGET', key, 'team', 'host', 'state')\n"                          \
    "  if not v[1] then return 0 end\n"                                                        \
    "  if only_live and v[3] ~= 'creating' and v[3] ~= 'running' and v[3] ~= 'paused' and\n"   \
    "     v[3] ~= 'killing' then\n"                                                              \
    "    return 0\n"                                                                           \
    "  end\n"                                                                                  \
    "  if only_live and v[3] == 'killing' then state = 'killed' end\n"                         \
    "  redis.call('HSET', key, 'state', state)\n"                                              \
    "  redis.call('EXPIRE', key, 3600)\n"                                                      \
    "  redis.call('SREM', 'sf:team:{' .. v[1] .. '}:sandboxes', id)\n"                         \
    "  if v[2] then redis.call('SREM', 'sf:host:{' .. v[2] .. '}:sandboxes', id) end\n"        \
    "  return 1\n"                                                                             \
    "end\n"                                                                                    \
    "local function retire_host(h)\n"                                                          \
    "  local n = 0\n"                                                                          \
    "  for _, id in ipairs(redis.call('SMEMBERS', 'sf:host:{' .. h .. '}:sandboxes')) do\n"    \
    "    n = n + retire(id, 'lost', true)\n"                                                   \
    "  end\n"                                                                                  \
    "  redis.call('DEL', 'sf:host:{' .. h .. '}:sandboxes')\n"                                 \
    "  return n\n"                                                                             \
    "end\n"

static const char lua_retire[] = LUA_RETIRE "return retire(ARGV[1], ARGV[2], ARGV[3] == '1')\n";

/* A killed sandbox leaves its team's set at once (not listed, not counted against the
 * team's quota), its host's set only when the teardown ended. */
static const char lua_mark_killing[] =
    "local key = 'sf:sb:{' .. ARGV[1] .. '}'\n"
    "local v = redis.call('HMGET', key, 'team', 'state')\n"
    "if v[2] == 'creating' or v[2] == 'running' or v[2] == 'paused' then\n"
    "  redis.call('HSET', key, 'state', 'killing')\n"
    "  redis.call('SREM', 'sf:team:{' .. v[1] .. '}:sandboxes', ARGV[1])\n"
    "  return 1\n"
    "end\n"
    "return 0\n";

static const char lua_retire_host[] = LUA_RETIRE "return retire_host(ARGV[1])\n";

static const char lua_reap[] =
    LUA_RETIRE
    "local dead = redis.call('ZRANGEBYSCORE', 'sf:hosts', '-inf', '(' .. ARGV[1])\n"
    "for _, h in ipairs(dead) do\n"
    "  retire_host(h)\n"
    "  redis.call('ZREM', 'sf:hosts', h)\n"
    "  redis.call('DEL', 'sf:host:{' .. h .. '}')\n"
    "end\n"
    "return #dead\n";

int sf_records_retire(sf_redis *r, const char *id, const char *state, int only_live,
                      redisCallbackFn *cb, void *priv)
{
    return sf_redis_cmd(r, cb, priv, "EVAL %s 0 %s %s %s", lua_retire, id, state,
                        only_live ? "1" : "0");
}

int sf_records_mark_killing(sf_redis *r, const char *id, redisCallbackFn *cb, void *priv)
{
    return sf_redis_cmd(r, cb, priv, "EVAL %s 0 %s", lua_mark_killing, id);
}

int sf_records_retire_host_sync(redisContext *c, const char *host, long long *n)
{
    redisReply *rep = redisCommand(c, "EVAL %s 0 %s", lua_retire_host, host);
    int rc = rep && rep->type == REDIS_REPLY_INTEGER ? 0 : -EIO;

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

    snprintf(cutoff, sizeof(cutoff), "%lld", (long long)(now_ms - dead_ms));
    return sf_redis_cmd(r, cb, priv, "EVAL %s 0 %s", lua_reap, cutoff);
}
