/* sf_snapshots.c: snapshot records (sf_snapshots.h). */
#include "sf_snapshots.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The record of ref (a name, or an id of one of the team's snapshots): shared by the
 * scripts below. KEYS[2] is the team's set; the record's key is its prefix + name. */
#define LUA_FIND                                                                              \
    "local function find(set, ref)\n"                                                         \
    "  local pre = string.sub(set, 1, #set - 5) .. 'snap:'\n"                                 \
    "  if redis.call('SISMEMBER', set, ref) == 1 then return pre .. ref, ref end\n"           \
    "  for _, n in ipairs(redis.call('SMEMBERS', set)) do\n"                                  \
    "    if redis.call('HGET', pre .. n, 'id') == ref then return pre .. n, n end\n"          \
    "  end\n"                                                                                 \
    "  return nil, nil\n"                                                                     \
    "end\n"

/* The bytes the team's ready snapshots hold, except name skip. */
#define LUA_USED                                                                              \
    "local function used(set, skip)\n"                                                        \
    "  local pre = string.sub(set, 1, #set - 5) .. 'snap:'\n"                                 \
    "  local sum = 0\n"                                                                       \
    "  for _, n in ipairs(redis.call('SMEMBERS', set)) do\n"                                  \
    "    if n ~= skip then sum = sum + (tonumber(redis.call('HGET', pre .. n, 'size')) or 0) end\n" \
    "  end\n"                                                                                 \
    "  return sum\n"                                                                          \
    "end\n"

/* KEYS: record, set. ARGV: max_n, max_bytes, then field/value pairs. */
static sf_redis_script reserve = SF_REDIS_SCRIPT(
    LUA_USED
    "if redis.call('EXISTS', KEYS[1]) == 1 then return {'taken'} end\n"
    "if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[1]) then return {'count'} end\n"
    "if used(KEYS[2], '') >= tonumber(ARGV[2]) then return {'bytes'} end\n"
    "redis.call('HSET', KEYS[1], unpack(ARGV, 3))\n"
    "redis.call('SADD', KEYS[2], redis.call('HGET', KEYS[1], 'name'))\n"
    "return {'ok'}\n");

/* KEYS: record, set. ARGV: id, size, max_bytes, now. */
static sf_redis_script finish = SF_REDIS_SCRIPT(
    LUA_USED
    "if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return {'gone'} end\n"
    "local name = redis.call('HGET', KEYS[1], 'name')\n"
    "if used(KEYS[2], name) + tonumber(ARGV[2]) > tonumber(ARGV[3]) then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  redis.call('SREM', KEYS[2], name)\n"
    "  return {'bytes'}\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'status', 'ready', 'size', ARGV[2], 'ready_at', ARGV[4])\n"
    "return {'ok'}\n");

/* KEYS: record, set. ARGV: id, name. */
static sf_redis_script drop = SF_REDIS_SCRIPT(
    "if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end\n"
    "redis.call('DEL', KEYS[1])\n"
    "redis.call('SREM', KEYS[2], ARGV[2])\n"
    "return 1\n");

/* KEYS: record, set. ARGV: id, name, stale_taking. */
static sf_redis_script check = SF_REDIS_SCRIPT(
    "local v = redis.call('HMGET', KEYS[1], 'id', 'status')\n"
    "if v[1] ~= ARGV[1] then return 0 end\n"
    "if v[2] == 'taking' and ARGV[3] == '1' then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  redis.call('SREM', KEYS[2], ARGV[2])\n"
    "  return 0\n"
    "end\n"
    "return 1\n");

/* KEYS: set. ARGV: ref. */
static sf_redis_script find_s = SF_REDIS_SCRIPT(
    LUA_FIND
    "local k = find(KEYS[1], ARGV[1])\n"
    "if not k then return {} end\n"
    "return redis.call('HGETALL', k)\n");

/* KEYS: set. */
static sf_redis_script list_s = SF_REDIS_SCRIPT(
    "local pre = string.sub(KEYS[1], 1, #KEYS[1] - 5) .. 'snap:'\n"
    "local names = redis.call('SMEMBERS', KEYS[1])\n"
    "table.sort(names)\n"
    "local out = {}\n"
    "for _, n in ipairs(names) do table.insert(out, redis.call('HGETALL', pre .. n)) end\n"
    "return out\n");

/* KEYS: set. ARGV: ref. */
static sf_redis_script delete_s = SF_REDIS_SCRIPT(
    LUA_FIND
    "local k, name = find(KEYS[1], ARGV[1])\n"
    "if not k then return {'none'} end\n"
    "local v = redis.call('HMGET', k, 'id', 'status', 'host')\n"
    "if v[2] == 'taking' then return {'taking'} end\n"
    "redis.call('DEL', k)\n"
    "redis.call('SREM', KEYS[1], name)\n"
    "return {'ok', v[1] or '', name, v[3] or ''}\n");

static int keys2(char rec[300], char set[160], const char *team, const char *name)
{
    if (snprintf(set, 160, SF_RK_TEAM_SNAPSHOTS, team) >= 160 ||
        (rec && snprintf(rec, 300, SF_RK_SNAPSHOT, team, name) >= 300))
        return -EINVAL;
    return 0;
}

static int call(sf_redis *r, sf_redis_script *s, redisCallbackFn *cb, void *priv, int nkeys,
                int n, const char **argv)
{
    size_t lens[40];

    if (n > 40)
        return -EINVAL;
    for (int i = 0; i < n; i++)
        lens[i] = strlen(argv[i]);
    return sf_redis_script_call(r, s, cb, priv, nkeys, n - nkeys, argv, lens);
}

int sf_snap_reserve(sf_redis *r, const char *team, const sf_snap_rec *s, int64_t now_ms,
                    int64_t max_n, int64_t max_bytes, redisCallbackFn *cb, void *priv)
{
    char rec[300], set[160], num[8][24];
    const char *argv[40];
    int n = 0;

    if (keys2(rec, set, team, s->name) < 0)
        return -EINVAL;
    snprintf(num[0], 24, "%lld", (long long)max_n);
    snprintf(num[1], 24, "%lld", (long long)max_bytes);
    snprintf(num[2], 24, "%lld", (long long)now_ms);
    snprintf(num[3], 24, "%u", s->memory_mib);
    snprintf(num[4], 24, "%u", s->vcpu_milli);
    snprintf(num[5], 24, "%u", s->disk_mib);
    snprintf(num[6], 24, "%u", s->pids_max);
    snprintf(num[7], 24, "%llu", (unsigned long long)s->inodes);
    argv[n++] = rec;
    argv[n++] = set;
    argv[n++] = num[0];
    argv[n++] = num[1];
#define KV(k, v) (argv[n++] = (k), argv[n++] = (v))
    KV("id", s->id);
    KV("name", s->name);
    KV("team", team);
    KV("host", s->host);
    KV("driver", s->driver);
    KV("template", s->template_name ? s->template_name : "base");
    KV("sandbox", s->sandbox);
    KV("status", "taking");
    KV("size", "0");
    KV("created", num[2]);
    KV("memory_mib", num[3]);
    KV("vcpu_milli", num[4]);
    KV("disk_mib", num[5]);
    KV("pids_max", num[6]);
    KV("inodes", num[7]);
#undef KV
    return call(r, &reserve, cb, priv, 2, n, argv);
}

int sf_snap_finish(sf_redis *r, const char *team, const char *name, const char *id,
                   uint64_t size, int64_t max_bytes, redisCallbackFn *cb, void *priv)
{
    char rec[300], set[160], num[3][24];
    const char *argv[6];

    if (keys2(rec, set, team, name) < 0)
        return -EINVAL;
    snprintf(num[0], 24, "%llu", (unsigned long long)size);
    snprintf(num[1], 24, "%lld", (long long)max_bytes);
    snprintf(num[2], 24, "%lld", (long long)sf_now_ms());
    argv[0] = rec, argv[1] = set, argv[2] = id, argv[3] = num[0], argv[4] = num[1];
    argv[5] = num[2];
    return call(r, &finish, cb, priv, 2, 6, argv);
}

int sf_snap_drop(sf_redis *r, const char *team, const char *name, const char *id,
                 redisCallbackFn *cb, void *priv)
{
    char rec[300], set[160];
    const char *argv[4];

    if (keys2(rec, set, team, name) < 0)
        return -EINVAL;
    argv[0] = rec, argv[1] = set, argv[2] = id, argv[3] = name;
    return call(r, &drop, cb, priv, 2, 4, argv);
}

int sf_snap_check(sf_redis *r, const char *team, const char *name, const char *id,
                  int stale_taking, redisCallbackFn *cb, void *priv)
{
    char rec[300], set[160];
    const char *argv[5];

    if (keys2(rec, set, team, name) < 0)
        return -EINVAL;
    argv[0] = rec, argv[1] = set, argv[2] = id, argv[3] = name;
    argv[4] = stale_taking ? "1" : "0";
    return call(r, &check, cb, priv, 2, 5, argv);
}

int sf_snap_find(sf_redis *r, const char *team, const char *ref, redisCallbackFn *cb,
                 void *priv)
{
    char set[160];
    const char *argv[2];

    if (keys2(NULL, set, team, NULL) < 0)
        return -EINVAL;
    argv[0] = set, argv[1] = ref;
    return call(r, &find_s, cb, priv, 1, 2, argv);
}

int sf_snap_list(sf_redis *r, const char *team, redisCallbackFn *cb, void *priv)
{
    char set[160];
    const char *argv[1];

    if (keys2(NULL, set, team, NULL) < 0)
        return -EINVAL;
    argv[0] = set;
    return call(r, &list_s, cb, priv, 1, 1, argv);
}

int sf_snap_delete(sf_redis *r, const char *team, const char *ref, redisCallbackFn *cb,
                   void *priv)
{
    char set[160];
    const char *argv[2];

    if (keys2(NULL, set, team, NULL) < 0)
        return -EINVAL;
    argv[0] = set, argv[1] = ref;
    return call(r, &delete_s, cb, priv, 1, 2, argv);
}
