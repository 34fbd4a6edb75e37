/* store.c: the Redis side of the scheduler: placement, sandbox records, routing
 * checks. Each multi-key step is one Lua script, so it is atomic and one round trip. */
#include "sched.h"
#include "sf_log.h"
#include "sf_records.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ARGV: now, host_ttl, id, team, name, template, metadata, team_limit, timeout_s */
static const char lua_create[] =
    "local sbkey = 'sf:sb:{' .. ARGV[3] .. '}'\n"
    "local old = redis.call('HMGET', sbkey, 'team', 'host', 'state')\n"
    "if old[1] then\n"
    "  if old[1] == ARGV[4] and (old[3] == 'creating' or old[3] == 'running') then\n"
    "    return {'ok', old[2]}\n"  /* the same create, redelivered */
    "  end\n"
    "  return {'conflict', ''}\n"
    "end\n"
    "local teamkey = 'sf:team:{' .. ARGV[4] .. '}:sandboxes'\n"
    "if redis.call('SCARD', teamkey) >= tonumber(ARGV[8]) then return {'quota', ''} end\n"
    "local live = redis.call('ZRANGEBYSCORE', 'sf:hosts', tonumber(ARGV[1]) - tonumber(ARGV[2]), "
    "'+inf')\n"
    "local best, bestfree = nil, 0\n"
    "for _, h in ipairs(live) do\n"
    "  local v = redis.call('HMGET', 'sf:host:{' .. h .. '}', 'capacity', 'running')\n"
    "  local free = (tonumber(v[1]) or 0) - (tonumber(v[2]) or 0)\n"
    "  if free > bestfree then best, bestfree = h, free end\n"
    "end\n"
    "if not best then\n"
    "  if #live == 0 then return {'nohost', ''} end\n"
    "  return {'full', ''}\n"
    "end\n"
    "redis.call('HSET', sbkey, 'id', ARGV[3], 'team', ARGV[4], 'host', best, 'state', "
    "'creating', 'name', ARGV[5], 'template', ARGV[6], 'metadata', ARGV[7], 'created', ARGV[1], "
    "'last_active', ARGV[1], 'timeout_seconds', ARGV[9])\n"
    "redis.call('SADD', teamkey, ARGV[3])\n"
    "redis.call('SADD', 'sf:host:{' .. best .. '}:sandboxes', ARGV[3])\n"
    "redis.call('HINCRBY', 'sf:host:{' .. best .. '}', 'running', 1)\n"
    "return {'ok', best}\n";

/* ARGV: team, metadata filter (JSON object). Returns a JSON array of records. */
static const char lua_list[] =
    "local ids = redis.call('SMEMBERS', 'sf:team:{' .. ARGV[1] .. '}:sandboxes')\n"
    "local filter = cjson.decode(ARGV[2])\n"
    "local out = {}\n"
    "for _, id in ipairs(ids) do\n"
    "  local r = redis.call('HGETALL', 'sf:sb:{' .. id .. '}')\n"
    "  if #r > 0 then\n"
    "    local rec = {}\n"
    "    for i = 1, #r, 2 do rec[r[i]] = r[i + 1] end\n"
    "    local ok = rec.team == ARGV[1]\n"
    "    if ok and next(filter) ~= nil then\n"
    "      local md = cjson.decode(rec.metadata or '{}')\n"
    "      for k, v in pairs(filter) do if md[k] ~= v then ok = false end end\n"
    "    end\n"
    "    if ok then table.insert(out, rec) end\n"
    "  end\n"
    "end\n"
    "if #out == 0 then return '[]' end\n"
    "return cjson.encode(out)\n";

/* ARGV: sandbox, team, now, host_ttl. Returns {verdict, host}. */
static const char lua_route[] =
    "local v = redis.call('HMGET', 'sf:sb:{' .. ARGV[1] .. '}', 'team', 'host', 'state')\n"
    "if not v[1] or v[1] ~= ARGV[2] then return {'none', ''} end\n"
    "if v[3] == 'killed' or v[3] == 'failed' or v[3] == 'lost' then return {v[3], v[2]} end\n"
    "local ts = redis.call('ZSCORE', 'sf:hosts', v[2])\n"
    "if not ts or tonumber(ts) < tonumber(ARGV[3]) - tonumber(ARGV[4]) then\n"
    "  return {'stale', v[2]}\n"
    "end\n"
    "return {'ok', v[2]}\n";

static const char msg_redis_down[] =
    "The platform's state store is unreachable; retry in a few seconds.";

static void not_found(sch_call *c)
{
    char text[256];
    sch_reply_error(c, SF_ERR_NOT_FOUND, sf_msg_no_sandbox(text, sizeof(text), c->job.sandbox));
}

static const char *status_of(const char *state)
{
    if (!state || !strcmp(state, "creating"))
        return "starting";
    if (!strcmp(state, "running"))
        return "active";
    return state; /* killed, failed, lost, paused */
}

static void iso_time(const char *ms_text, char out[32])
{
    int64_t ms = 0;
    time_t t;
    struct tm tm;

    if (!ms_text || sf_parse_i64(ms_text, 0, INT64_MAX, &ms) < 0) {
        out[0] = '\0';
        return;
    }
    t = (time_t)(ms / 1000);
    gmtime_r(&t, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Builds the public view of a record given as a JSON object of strings. */
static json_t *record_view(json_t *rec)
{
    const char *md_text = json_string_value(json_object_get(rec, "metadata"));
    json_t *md = md_text ? json_loads(md_text, 0, NULL) : NULL;
    json_t *v = json_object();
    char created[32], active[32];
    int64_t n;

    iso_time(json_string_value(json_object_get(rec, "created")), created);
    iso_time(json_string_value(json_object_get(rec, "last_active")), active);
    json_object_set(v, "id", json_object_get(rec, "id"));
    json_object_set_new(v, "name", json_string(json_string_value(json_object_get(rec, "name"))
                                                   ?: ""));
    json_object_set_new(v, "status",
                        json_string(status_of(json_string_value(json_object_get(rec, "state")))));
    json_object_set_new(v, "template",
                        json_string(json_string_value(json_object_get(rec, "template")) ?: "base"));
    json_object_set_new(v, "metadata", json_is_object(md) ? md : json_object());
    if (!json_is_object(md))
        json_decref(md);
    json_object_set_new(v, "created_at", json_string(created));
    json_object_set_new(v, "last_active_at", json_string(active));
    if (sf_parse_i64(json_string_value(json_object_get(rec, "timeout_seconds")), 1, INT64_MAX,
                     &n) == 0)
        json_object_set_new(v, "timeout_seconds", json_integer(n));
    return v;
}

static void on_create(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    const char *verdict, *host;

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        sf_error("msg=\"create script failed\" job=%s err=\"%s\"", c->job.id,
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        sch_reply_error(c, SF_ERR_UNAVAILABLE, msg_redis_down);
        return;
    }
    verdict = rep->element[0]->str;
    host = rep->element[1]->str;
    if (!strcmp(verdict, "ok"))
        sch_forward(c, host);
    else if (!strcmp(verdict, "conflict"))
        sch_reply_error(c, SF_ERR_INVALID, "A sandbox with that id exists or existed; let the "
                                           "platform choose the id of a new sandbox.");
    else if (!strcmp(verdict, "quota"))
        sch_reply_error(c, SF_ERR_LIMIT,
                        "Sandbox quota reached. Pause or kill a sandbox, or retry later.");
    else if (!strcmp(verdict, "full"))
        sch_reply_error(c, SF_ERR_UNAVAILABLE,
                        "Every worker host is at capacity. Kill a sandbox, or retry later.");
    else
        sch_reply_error(c, SF_ERR_UNAVAILABLE,
                        "No worker host is available right now; retry in a few seconds.");
}

void sch_store_create(sch_call *c)
{
    json_t *a = c->job.args;
    const char *name = json_string_value(json_object_get(a, "name"));
    const char *tmpl = json_string_value(json_object_get(a, "from_template"));
    json_t *md = json_object_get(a, "metadata");
    char now[24], ttl[24], limit[24], timeout[24], *md_text;
    int rc;

    if (tmpl && strcmp(tmpl, "base") != 0) {
        char text[256];
        snprintf(text, sizeof(text),
                 "Template '%.64s' does not exist; omit from_template to use 'base'.", tmpl);
        sch_reply_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    md_text = json_is_object(md) ? json_dumps(md, JSON_COMPACT) : NULL;
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%lld", (long long)c->ctx->cfg.host_ttl_ms);
    snprintf(limit, sizeof(limit), "%lld", (long long)c->ctx->cfg.team_sandbox_limit);
    snprintf(timeout, sizeof(timeout), "%lld",
             (long long)json_integer_value(json_object_get(a, "timeout_seconds")));
    rc = sf_redis_cmd(c->ctx->redis, on_create, c,
                      "EVAL %s 0 %s %s %s %s %s %s %s %s %s", lua_create, now, ttl,
                      c->job.sandbox, c->job.team, name ? name : "", "base",
                      md_text ? md_text : "{}", limit, timeout);
    free(md_text);
    if (rc < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, msg_redis_down);
}

static void on_list(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    json_t *arr, *out, *rec;
    size_t i;

    if (!rep || rep->type != REDIS_REPLY_STRING ||
        !(arr = json_loadb(rep->str, rep->len, 0, NULL))) {
        sf_error("msg=\"list script failed\" job=%s err=\"%s\"", c->job.id,
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        sch_reply_error(c, SF_ERR_UNAVAILABLE, msg_redis_down);
        return;
    }
    out = json_array();
    json_array_foreach(arr, i, rec) json_array_append_new(out, record_view(rec));
    json_decref(arr);
    sch_reply_result(c, json_pack("{s:o, s:i}", "sandboxes", out, "count", (int)i));
}

void sch_store_list(sch_call *c)
{
    json_t *md = json_object_get(c->job.args, "metadata");
    char *filter = json_is_object(md) ? json_dumps(md, JSON_COMPACT) : NULL;
    int rc = sf_redis_cmd(c->ctx->redis, on_list, c, "EVAL %s 0 %s %s", lua_list, c->job.team,
                          filter ? filter : "{}");

    free(filter);
    if (rc < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, msg_redis_down);
}

static void on_info(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    json_t *rec, *view;
    const char *team;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE, msg_redis_down);
        return;
    }
    rec = json_object();
    for (size_t i = 0; i + 1 < rep->elements; i += 2)
        json_object_set_new(rec, rep->element[i]->str,
                            json_stringn(rep->element[i + 1]->str, rep->element[i + 1]->len));
    team = json_string_value(json_object_get(rec, "team"));
    if (!team || strcmp(team, c->job.team) != 0) {
        json_decref(rec);
        not_found(c);
        return;
    }
    view = record_view(rec);
    {
        int64_t mem = 0, pids = 0;
        sf_parse_i64(json_string_value(json_object_get(rec, "memory_mib")), 0, INT64_MAX, &mem);
        sf_parse_i64(json_string_value(json_object_get(rec, "pids_max")), 0, INT64_MAX, &pids);
        json_object_set_new(view, "resources",
                            json_pack("{s:i, s:I, s:I}", "vcpu", 1, "memory_mib", (json_int_t)mem,
                                      "pids_max", (json_int_t)pids));
        json_object_set_new(view, "driver",
                            json_string(json_string_value(json_object_get(rec, "driver")) ?: ""));
        json_object_set_new(view, "network",
                            json_pack("{s:s}", "egress", "none (no network access yet)"));
    }
    json_decref(rec);
    sch_reply_result(c, view);
}

void sch_store_info(sch_call *c)
{
    if (!c->job.sandbox[0]) {
        sch_reply_error(c, SF_ERR_INVALID, "Argument 'sandbox_id' is required.");
        return;
    }
    if (sf_redis_cmd(c->ctx->redis, on_info, c, "HGETALL " SF_RK_SANDBOX, c->job.sandbox) < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, msg_redis_down);
}

static void on_route(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    const char *verdict;
    char text[256];

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE, msg_redis_down);
        return;
    }
    verdict = rep->element[0]->str;
    if (!strcmp(verdict, "ok")) {
        sch_forward(c, rep->element[1]->str);
        return;
    }
    if (!strcmp(verdict, "none")) {
        not_found(c);
        return;
    }
    if (!strcmp(verdict, "killed")) {
        if (!strcmp(c->job.tool, "sandbox_kill")) {
            sch_reply_result(c, json_pack("{s:s, s:s}", "id", c->job.sandbox, "status", "killed"));
            return;
        }
        snprintf(text, sizeof(text),
                 "Sandbox '%s' was killed; create a new one with sandbox_create.", c->job.sandbox);
    } else if (!strcmp(verdict, "failed")) {
        snprintf(text, sizeof(text),
                 "Sandbox '%s' failed to start; create a new one with sandbox_create.",
                 c->job.sandbox);
    } else if (!strcmp(verdict, "stale")) {
        snprintf(text, sizeof(text),
                 "The host of sandbox '%s' is not responding; retry in a few seconds, or create "
                 "a new sandbox with sandbox_create.", c->job.sandbox);
        sch_reply_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    } else {
        snprintf(text, sizeof(text),
                 "Sandbox '%s' was lost with its host; create a new one with sandbox_create.",
                 c->job.sandbox);
    }
    sch_reply_error(c, SF_ERR_NOT_FOUND, text);
}

void sch_store_route(sch_call *c)
{
    char now[24], ttl[24];

    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%lld", (long long)c->ctx->cfg.host_ttl_ms);
    if (sf_redis_cmd(c->ctx->redis, on_route, c, "EVAL %s 0 %s %s %s %s", lua_route,
                     c->job.sandbox, c->job.team, now, ttl) < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, msg_redis_down);
}

static void on_reaped(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;

    if (rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0)
        sf_warn("msg=\"dead hosts removed; their sandboxes are lost\" hosts=%lld",
                rep->integer);
    else if (rep && rep->type == REDIS_REPLY_ERROR)
        sf_error("msg=\"reaper script failed\" err=\"%s\"", rep->str);
}

static void reap(evutil_socket_t fd, short what, void *arg)
{
    sch_ctx *ctx = arg;

    if (sf_redis_connected(ctx->redis))
        sf_records_reap(ctx->redis, sf_now_ms(), ctx->cfg.host_dead_ms, on_reaped, NULL);
}

int sch_store_start_reaper(sch_ctx *ctx)
{
    struct timeval tv = {ctx->cfg.host_ttl_ms / 1000, (ctx->cfg.host_ttl_ms % 1000) * 1000};

    if (!(ctx->ev_reap = event_new(ctx->d.base, -1, EV_PERSIST, reap, ctx)))
        return -1;
    return event_add(ctx->ev_reap, &tv);
}
