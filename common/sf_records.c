#include "sf_records.h"
#include "sf_timers.h"
#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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
    "local function release(key, host, tk, hk, whole)\n"                                       \
    "  local r = redis.call('HMGET', key, 'res_team', 'res_mem_mib', 'res_vcpu_milli')\n"      \
    "  local mem, vcpu = tonumber(r[2]) or 0, tonumber(r[3]) or 0\n"                           \
    "  if r[1] and host then\n"                                                                \
    "    dec(tk, 'n', 1, true) dec(tk, 'mem', mem, true) dec(tk, 'vcpu', vcpu, true)\n"        \
    "    dec(tk, 'n@' .. host, 1, true) dec(tk, 'mem@' .. host, mem, true)\n"                  \
    "    dec(tk, 'vcpu@' .. host, vcpu, true)\n"                                               \
    "    redis.call('HDEL', key, 'res_team')\n"                                                \
    "  end\n"                                                                                  \
    "  if whole and r[2] and host then\n"                                                      \
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
    "  release(key, v[2], 'sf:team:{' .. v[1] .. '}:res', v[2] and 'sf:host:{' .. v[2] .. '}', true)\n" \
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

/* The sweeps above (a host's restart, dead hosts) find their keys in Redis; the scripts
 * below declare every key they touch (KEYS), for a record whose team and host the caller
 * read first (owner_op below): if the record names another team or host by then, they
 * return -1 and the caller reads it again. */

/* KEYS: record, team's sandboxes, team's res, team's retired, host hash, host's sandboxes,
 * host's timers (sf_timers.h). ARGV: now, ttl, keep, id, state, only_live (1/0), team, host. Returns {1, ids of old
 * tombstones dropped from the team's retired list (the caller deletes their records)},
 * {0} (not retired), or {-1} (moved). */
static const char lua_retire[] =
    "#!lua flags=allow-oom\n" LUA_RELEASE
    "local NOW, TTL, KEEP = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])\n"
    "local id, state, only_live = ARGV[4], ARGV[5], ARGV[6] == '1'\n"
    "local function dead(st) return st == 'killed' or st == 'failed' or st == 'lost' end\n"
    "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
    "if not v[1] then return {0} end\n"
    "if v[1] ~= ARGV[7] or (v[2] or '') ~= ARGV[8] then return {-1} end\n"
    "if only_live and dead(v[3]) then return {0} end\n"
    "if only_live and v[3] == 'killing' then state = 'killed' end\n"
    "release(KEYS[1], v[2], KEYS[3], KEYS[5], true)\n"
    "redis.call('HDEL', KEYS[1], 'metadata')\n"
    "redis.call('HSET', KEYS[1], 'state', state, 'retired', NOW)\n"
    "redis.call('EXPIRE', KEYS[1], TTL)\n"
    "redis.call('SREM', KEYS[2], id)\n"
    "if v[2] then\n"
    "  redis.call('SREM', KEYS[6], id)\n"
    "  redis.call('ZREM', KEYS[7], 't:' .. id, 'i:' .. id, 'd:' .. id)\n"
    "end\n"
    "redis.call('ZADD', KEYS[4], NOW, id)\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', NOW - TTL * 1000)\n"
    "local out, over = {1}, redis.call('ZCARD', KEYS[4]) - KEEP\n"
    "if over > 0 then\n"
    "  for _, old in ipairs(redis.call('ZRANGE', KEYS[4], 0, over - 1)) do\n"
    "    table.insert(out, old)\n"
    "  end\n"
    "  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, over - 1)\n"
    "end\n"
    "redis.call('PEXPIRE', KEYS[4], TTL * 1000)\n"
    "return out\n";

/* KEYS: an old tombstone's record. Deleted if it is still dead (not re-used meanwhile). */
static const char lua_drop_dead[] =
    "#!lua flags=allow-oom\n"
    "local st = redis.call('HGET', KEYS[1], 'state')\n"
    "if st == 'killed' or st == 'failed' or st == 'lost' then return redis.call('DEL', KEYS[1]) end\n"
    "return 0\n";

/* KEYS: record, team's sandboxes, team's res. ARGV: id, team, host. A live record
 * (creating, running, paused) becomes `killing`: it leaves its team's set and gives back
 * its team's reservation at once; its host keeps the rest until the teardown ended
 * (retire). 1, 0 (not live), or -1 (moved). */
static const char lua_mark_killing[] =
    "#!lua flags=allow-oom\n" LUA_RELEASE
    "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
    "if not v[1] then return 0 end\n"
    "if v[1] ~= ARGV[2] or (v[2] or '') ~= ARGV[3] then return -1 end\n"
    "if v[3] ~= 'creating' and v[3] ~= 'running' and v[3] ~= 'paused' then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'state', 'killing')\n"
    "redis.call('SREM', KEYS[2], ARGV[1])\n"
    "release(KEYS[1], v[2], KEYS[3], nil, false)\n"
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

/* KEYS: record, team's sandboxes, host's sandboxes. ARGV: id, team, host (the record's),
 * host (the one it runs on), field, value... 1, 0 (gone or retired), or -1 (moved). */
static const char lua_started[] =
    "#!lua flags=allow-oom\n"
    "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
    "if not v[1] or v[3] == 'killed' or v[3] == 'failed' or v[3] == 'lost' then return 0 end\n"
    "if v[1] ~= ARGV[2] or (v[2] or '') ~= ARGV[3] then return -1 end\n"
    "redis.call('HSET', KEYS[1], 'state', 'running', unpack(ARGV, 5))\n"
    "redis.call('SADD', KEYS[2], ARGV[1])\n"
    "redis.call('SADD', KEYS[3], ARGV[1])\n"
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

/* ---- scripts by SHA, every key declared ---- */

static sf_redis_script s_retire = SF_REDIS_SCRIPT(lua_retire);
static sf_redis_script s_drop_dead = SF_REDIS_SCRIPT(lua_drop_dead);
static sf_redis_script s_mark_killing = SF_REDIS_SCRIPT(lua_mark_killing);
static sf_redis_script s_started = SF_REDIS_SCRIPT(lua_started);
static sf_redis_script s_touch = SF_REDIS_SCRIPT(lua_touch);
static sf_redis_script s_set = SF_REDIS_SCRIPT(lua_set);

enum { OP_RETIRE, OP_KILLING, OP_STARTED };
#define OWNER_TRIES 3 /* a record that moves between the read and the script: read again */

/* A write whose keys follow from the record's team and host: those are read first
 * (HMGET), then the script runs with every key declared. */
typedef struct owner_op {
    sf_redis *r;
    int kind, tries;
    redisCallbackFn *cb;
    void *priv;
    char id[SF_ID_MAX], team[SF_ID_MAX], host[SF_ID_MAX], state[16];
    int only_live;
    size_t nkv;
    const char *kv[KV_MAX];
    char *kvdata; /* the copies kv points into */
} owner_op;

static void owner_op_free(owner_op *op)
{
    free(op->kvdata);
    free(op);
}

static void owner_read(owner_op *op);

static void owner_done(owner_op *op, redisAsyncContext *ac, redisReply *rep)
{
    if (op->cb)
        op->cb(ac, rep, op->priv);
    owner_op_free(op);
}

static void ignore_reply(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac, (void)r, (void)priv;
}

static void on_owner_script(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r, *verdict = rep;
    owner_op *op = priv;

    if (op->kind == OP_RETIRE && rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > 0)
        verdict = rep->element[0];
    if (verdict && verdict->type == REDIS_REPLY_INTEGER && verdict->integer == -1 &&
        ++op->tries < OWNER_TRIES) {
        owner_read(op); /* its team or host changed meanwhile */
        return;
    }
    if (op->kind == OP_RETIRE && verdict != rep) {
        for (size_t i = 1; i < rep->elements; i++) { /* old tombstones beyond the team's */
            char key[128];
            const char *argv[] = {key};
            size_t lens[1];
            if (rep->element[i]->type != REDIS_REPLY_STRING ||
                rep->element[i]->len >= SF_ID_MAX)
                continue;
            lens[0] = (size_t)snprintf(key, sizeof(key), SF_RK_SANDBOX, rep->element[i]->str);
            sf_redis_script_call(op->r, &s_drop_dead, ignore_reply, NULL, 1, 0, argv, lens);
        }
    }
    owner_done(op, ac, verdict);
}

/* Runs op's script with the team and host read from the record. */
static void owner_script(owner_op *op)
{
    char k[7][160], now[24], ttl[24], keep[24];
    const char *argv[7 + 8 + KV_MAX];
    size_t lens[SF_ARRAY_LEN(argv)];
    int nkeys = 0, nargs = 0, rc;

    snprintf(k[0], sizeof(k[0]), SF_RK_SANDBOX, op->id);
    snprintf(k[1], sizeof(k[1]), SF_RK_TEAM_SANDBOXES, op->team);
    switch (op->kind) {
    case OP_RETIRE:
        snprintf(k[2], sizeof(k[2]), SF_RK_TEAM_RES, op->team);
        snprintf(k[3], sizeof(k[3]), SF_RK_TEAM_RETIRED, op->team);
        snprintf(k[4], sizeof(k[4]), SF_RK_HOST, op->host);
        snprintf(k[5], sizeof(k[5]), SF_RK_HOST_SANDBOXES, op->host);
        snprintf(k[6], sizeof(k[6]), SF_RK_HOST_TIMERS, op->host);
        nkeys = 7;
        snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
        snprintf(ttl, sizeof(ttl), "%d", SF_RETIRED_TTL_S);
        snprintf(keep, sizeof(keep), "%d", SF_RETIRED_KEEP);
        argv[nkeys + nargs++] = now;
        argv[nkeys + nargs++] = ttl;
        argv[nkeys + nargs++] = keep;
        argv[nkeys + nargs++] = op->id;
        argv[nkeys + nargs++] = op->state;
        argv[nkeys + nargs++] = op->only_live ? "1" : "0";
        argv[nkeys + nargs++] = op->team;
        argv[nkeys + nargs++] = op->host;
        break;
    case OP_KILLING:
        snprintf(k[2], sizeof(k[2]), SF_RK_TEAM_RES, op->team);
        nkeys = 3;
        argv[nkeys + nargs++] = op->id;
        argv[nkeys + nargs++] = op->team;
        argv[nkeys + nargs++] = op->host;
        break;
    default: /* OP_STARTED: op->state holds nothing; the runner's host is kv's owner */
        snprintf(k[2], sizeof(k[2]), SF_RK_HOST_SANDBOXES, op->kv[0]);
        nkeys = 3;
        argv[nkeys + nargs++] = op->id;
        argv[nkeys + nargs++] = op->team;
        argv[nkeys + nargs++] = op->host;
        for (size_t i = 0; i < op->nkv; i++) /* kv[0]: the runner's host, then fields */
            argv[nkeys + nargs++] = op->kv[i];
        break;
    }
    for (int i = 0; i < nkeys; i++)
        argv[i] = k[i];
    for (int i = 0; i < nkeys + nargs; i++)
        lens[i] = strlen(argv[i]);
    rc = sf_redis_script_call(op->r,
                              op->kind == OP_RETIRE    ? &s_retire
                              : op->kind == OP_KILLING ? &s_mark_killing
                                                       : &s_started,
                              on_owner_script, op, nkeys, nargs, argv, lens);
    if (rc < 0)
        owner_done(op, NULL, NULL);
}

static void on_owner(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    owner_op *op = priv;
    static redisReply gone = {.type = REDIS_REPLY_INTEGER, .integer = 0};

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        owner_done(op, ac, rep); /* Redis is down, or refused it: the caller sees that */
        return;
    }
    if (rep->element[0]->type != REDIS_REPLY_STRING || rep->element[0]->len >= SF_ID_MAX) {
        owner_done(op, ac, &gone); /* no such record */
        return;
    }
    snprintf(op->team, sizeof(op->team), "%s", rep->element[0]->str);
    op->host[0] = '\0';
    if (rep->element[1]->type == REDIS_REPLY_STRING && rep->element[1]->len < SF_ID_MAX)
        snprintf(op->host, sizeof(op->host), "%s", rep->element[1]->str);
    owner_script(op);
}

static void owner_read(owner_op *op)
{
    if (sf_redis_cmd(op->r, on_owner, op, "HMGET " SF_RK_SANDBOX " team host", op->id) < 0)
        owner_done(op, NULL, NULL);
}

/* 0 (cb answers), or -errno (cb not called). */
static int owner_begin(sf_redis *r, int kind, const char *id, const char *state, int only_live,
                       size_t nkv, const char *const *kv, redisCallbackFn *cb, void *priv)
{
    owner_op *op;
    size_t total = 0;

    if (strlen(id) >= SF_ID_MAX || nkv > KV_MAX)
        return -EINVAL;
    if (!sf_redis_connected(r))
        return -ENOTCONN;
    for (size_t i = 0; i < nkv; i++)
        total += strlen(kv[i]) + 1;
    if (!(op = calloc(1, sizeof(*op))) || !(op->kvdata = malloc(total ? total : 1))) {
        free(op);
        return -ENOMEM;
    }
    op->r = r;
    op->kind = kind;
    op->cb = cb;
    op->priv = priv;
    op->only_live = only_live;
    snprintf(op->id, sizeof(op->id), "%s", id);
    snprintf(op->state, sizeof(op->state), "%s", state ? state : "");
    for (size_t i = 0, off = 0; i < nkv; i++) {
        size_t n = strlen(kv[i]) + 1;
        memcpy(op->kvdata + off, kv[i], n);
        op->kv[i] = op->kvdata + off;
        off += n;
    }
    op->nkv = nkv;
    if (sf_redis_cmd(r, on_owner, op, "HMGET " SF_RK_SANDBOX " team host", op->id) < 0) {
        owner_op_free(op);
        return -ENOTCONN;
    }
    return 0;
}

int sf_records_retire(sf_redis *r, const char *id, const char *state, int only_live,
                      redisCallbackFn *cb, void *priv)
{
    return owner_begin(r, OP_RETIRE, id, state, only_live, 0, NULL, cb, priv);
}

int sf_records_mark_killing(sf_redis *r, const char *id, redisCallbackFn *cb, void *priv)
{
    return owner_begin(r, OP_KILLING, id, NULL, 0, 0, NULL, cb, priv);
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
    const char *all[1 + KV_MAX];

    if (nkv % 2 || nkv + 1 > KV_MAX)
        return -EINVAL;
    for (size_t i = 0; i + 1 < nkv; i += 2)
        if (!strncmp(kv[i], "res_", 4) || !strcmp(kv[i], "state"))
            return -EINVAL;
    all[0] = host; /* (owner_script: the runner's host, then the fields) */
    for (size_t i = 0; i < nkv; i++)
        all[1 + i] = kv[i];
    return owner_begin(r, OP_STARTED, id, NULL, 0, nkv + 1, all, cb, priv);
}

/* One key, then args (NUL-terminated strings). */
static int call_one_key(sf_redis *r, sf_redis_script *s, const char *key, size_t nargs,
                        const char *const *args, redisCallbackFn *cb, void *priv)
{
    const char *argv[1 + KV_MAX];
    size_t lens[1 + KV_MAX];

    if (nargs > KV_MAX)
        return -EINVAL;
    argv[0] = key;
    lens[0] = strlen(key);
    for (size_t i = 0; i < nargs; i++) {
        argv[1 + i] = args[i];
        lens[1 + i] = strlen(args[i]);
    }
    return sf_redis_script_call(r, s, cb ? cb : ignore_reply, priv, 1, (int)nargs, argv, lens);
}

int sf_records_touch(sf_redis *r, const char *id, int64_t now_ms, redisCallbackFn *cb,
                     void *priv)
{
    char key[128], now[24];
    const char *args[] = {now};

    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    return call_one_key(r, &s_touch, key, 1, args, cb, priv);
}

int sf_records_set(sf_redis *r, const char *id, size_t nkv, const char *const *kv,
                   redisCallbackFn *cb, void *priv)
{
    char key[128];

    if (nkv == 0 || nkv % 2)
        return -EINVAL;
    for (size_t i = 0; i < nkv; i += 2)
        if (!strncmp(kv[i], "res_", 4) || !strcmp(kv[i], "state") || !strcmp(kv[i], "team") ||
            !strcmp(kv[i], "host"))
            return -EINVAL;
    snprintf(key, sizeof(key), SF_RK_SANDBOX, id);
    return call_one_key(r, &s_set, key, nkv, kv, cb, priv);
}
