/* store.c: the Redis side of the scheduler: placement, sandbox records, routing
 * checks. Each multi-key step is one Lua script, so it is atomic and one round trip. */
#include "sched.h"
#include "sf_log.h"
#include "sf_records.h"
#include "sf_timers.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One page of the team's live sandboxes, oldest first (created, then id). ARGV: team,
 * metadata filter (JSON object), cursor created, cursor id, limit. Only the page's
 * records are read whole. Returns JSON {items: [records], more: bool}. */
static const char lua_list[] =
    "#!lua flags=no-writes\n"
    "local team, ccur, icur, limit = ARGV[1], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])\n"
    "local filter = cjson.decode(ARGV[2])\n"
    "local rows = {}\n"
    "for _, id in ipairs(redis.call('SMEMBERS', 'sf:team:{' .. team .. '}:sandboxes')) do\n"
    "  local v = redis.call('HMGET', 'sf:sb:{' .. id .. '}', 'team', 'created', 'metadata')\n"
    "  local ok = v[1] == team\n"
    "  if ok and next(filter) ~= nil then\n"
    "    local md = cjson.decode(v[3] or '{}')\n"
    "    for k, want in pairs(filter) do if md[k] ~= want then ok = false end end\n"
    "  end\n"
    "  local c = tonumber(v[2]) or 0\n"
    "  if ok and (c > ccur or (c == ccur and id > icur)) then\n"
    "    table.insert(rows, {c = c, id = id})\n"
    "  end\n"
    "end\n"
    "table.sort(rows, function(a, b) return a.c < b.c or (a.c == b.c and a.id < b.id) end)\n"
    "local out = {}\n"
    "for i = 1, math.min(#rows, limit) do\n"
    "  local r = redis.call('HGETALL', 'sf:sb:{' .. rows[i].id .. '}')\n"
    "  local rec = {}\n"
    "  for j = 1, #r, 2 do rec[r[j]] = r[j + 1] end\n"
    "  out[i] = rec\n"
    "end\n"
    "return cjson.encode({items = out, more = #rows > limit})\n";

/* KEYS: the record, sf:hosts. ARGV: team, now, host_ttl. Returns {verdict, host}.
 * Called by SHA (sf_redis_script_call); both keys declared. */
static const char lua_route[] =
    "#!lua flags=no-writes\n"
    "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
    "if not v[1] or v[1] ~= ARGV[1] then return {'none', ''} end\n"
    "if v[3] == 'killed' or v[3] == 'failed' or v[3] == 'lost' then return {v[3], v[2]} end\n"
    "local ts = redis.call('ZSCORE', KEYS[2], v[2])\n"
    "if not ts or tonumber(ts) < tonumber(ARGV[2]) - tonumber(ARGV[3]) then\n"
    "  return {'stale', v[2]}\n"
    "end\n"
    "return {'ok', v[2]}\n";


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

/* A page's reply stays well inside one Kafka message (SF_MSG_MAX): records are added
 * while their JSON fits this budget, and the page ends early (with next_cursor) when the
 * next one would not. msgpack is never larger than compact JSON for these values. */
#define LIST_REPLY_BUDGET (768 * 1024)
#define LIST_LIMIT_DEFAULT 50

/* Cursor text: "<created ms>.<id>" of the last sandbox of the previous page. */
static int cursor_parse(const char *s, char created[24], char id[SF_ID_MAX])
{
    const char *dot = s ? strchr(s, '.') : NULL;
    int64_t ms;

    if (!dot || (size_t)(dot - s) >= 24 || strlen(dot + 1) >= SF_ID_MAX)
        return -EINVAL;
    memcpy(created, s, (size_t)(dot - s));
    created[dot - s] = '\0';
    snprintf(id, SF_ID_MAX, "%s", dot + 1);
    if (sf_parse_i64(created, 0, INT64_MAX, &ms) < 0 || !sf_id_valid(id))
        return -EINVAL;
    return 0;
}

static void on_list(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    json_t *page, *items, *out, *rec, *last = NULL;
    size_t i, bytes = 0;
    int more;

    if (!rep || rep->type != REDIS_REPLY_STRING ||
        !(page = json_loadb(rep->str, rep->len, 0, NULL))) {
        sf_error("msg=\"list script failed\" job=%s err=\"%s\"", c->job.id,
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    items = json_object_get(page, "items"); /* {} when empty: Lua cannot tell the two apart */
    more = json_is_true(json_object_get(page, "more"));
    out = json_array();
    json_array_foreach(items, i, rec) {
        json_t *v = record_view(rec);
        size_t n = json_dumpb(v, NULL, 0, JSON_COMPACT) + 1;
        if (bytes + n > LIST_REPLY_BUDGET && json_array_size(out) > 0) {
            json_decref(v);
            more = 1;
            break;
        }
        bytes += n;
        json_array_append_new(out, v);
        last = rec;
    }
    {
        json_t *res = json_pack("{s:o, s:I}", "sandboxes", out, "count",
                                (json_int_t)json_array_size(out));
        if (more && last) {
            char cur[24 + SF_ID_MAX + 1];
            snprintf(cur, sizeof(cur), "%s.%s",
                     json_string_value(json_object_get(last, "created")) ?: "0",
                     json_string_value(json_object_get(last, "id")) ?: "");
            json_object_set_new(res, "next_cursor", json_string(cur));
        }
        json_decref(page);
        sch_reply_result(c, res);
    }
}

void sch_store_list(sch_call *c)
{
    json_t *a = c->job.args, *md = json_object_get(a, "metadata");
    const char *cursor = json_string_value(json_object_get(a, "cursor"));
    json_int_t limit = json_integer_value(json_object_get(a, "limit"));
    char created[24] = "-1", id[SF_ID_MAX] = "", lim[24], *filter;
    int rc;

    if (cursor && cursor_parse(cursor, created, id) < 0) {
        sch_reply_error(c, SF_ERR_INVALID, "Argument 'cursor' is not a cursor sandbox_list "
                                           "gave; pass the next_cursor of the previous page, "
                                           "or omit it for the first page.");
        return;
    }
    snprintf(lim, sizeof(lim), "%lld", (long long)(limit > 0 ? limit : LIST_LIMIT_DEFAULT));
    filter = json_is_object(md) ? json_dumps(md, JSON_COMPACT) : NULL;
    rc = sf_redis_cmd(c->ctx->redis, on_list, c, "EVAL %s 0 %s %s %s %s %s", lua_list,
                      c->job.team, filter ? filter : "{}", created, id, lim);
    free(filter);
    if (rc < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

/* A record's integer field (a string in Redis), or the fallback field, or 0. */
static int64_t field_i64(json_t *rec, const char *name, const char *fallback)
{
    int64_t n = 0;

    if (sf_parse_i64(json_string_value(json_object_get(rec, name)), 0, INT64_MAX, &n) < 0 &&
        fallback)
        sf_parse_i64(json_string_value(json_object_get(rec, fallback)), 0, INT64_MAX, &n);
    return n;
}

/* A record field holding JSON (written by the worker), or an empty array / object. */
static json_t *json_field(json_t *rec, const char *name, int object)
{
    const char *text = json_string_value(json_object_get(rec, name));
    json_t *v = text ? json_loads(text, 0, NULL) : NULL;

    if (object ? json_is_object(v) : json_is_array(v))
        return v;
    json_decref(v);
    return object ? json_object() : json_array();
}

/* The sandbox's egress as its worker applied it: the default, allow_out, deny_out. */
static json_t *network_view(json_t *rec)
{
    const char *deflt = json_string_value(json_object_get(rec, "egress_default"));

    if (!deflt) /* a worker without an egress proxy: no network at all */
        return json_pack("{s:s, s:[], s:[]}", "egress_default", "none", "allow_out", "deny_out");
    return json_pack("{s:s, s:o, s:o}", "egress_default", deflt, "allow_out",
                     json_field(rec, "allow_out", 0), "deny_out", json_field(rec, "deny_out", 0));
}

static void on_info(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    json_t *rec, *view;
    const char *team;

    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
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
        /* What the worker applied, else what placement reserved. */
        int64_t mem = field_i64(rec, "memory_mib", "res_mem_mib");
        int64_t vcpu = field_i64(rec, "vcpu_milli", "res_vcpu_milli");
        json_t *res = json_object();
        json_object_set_new(res, "vcpu", json_real((double)vcpu / 1000.0));
        json_object_set_new(res, "memory_mib", json_integer(mem));
        json_object_set_new(res, "pids_max", json_integer(field_i64(rec, "pids_max", NULL)));
        if (json_object_get(rec, "disk_mib"))
            json_object_set_new(res, "disk_mib", json_integer(field_i64(rec, "disk_mib", NULL)));
        json_object_set_new(view, "resources", res);
        json_object_set_new(view, "driver",
                            json_string(json_string_value(json_object_get(rec, "driver")) ?: ""));
        json_object_set_new(view, "network", network_view(rec));
        json_object_set_new(view, "secrets", json_field(rec, "secrets", 1));
    }
    sf_timers_view(rec, view);
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
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

static void on_route(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    const char *verdict;
    char text[256];

    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
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

static sf_redis_script route_script = SF_REDIS_SCRIPT(lua_route);

void sch_store_route(sch_call *c)
{
    char key[128], now[24], ttl[24];
    const char *argv[] = {key, SF_RK_HOSTS, c->job.team, now, ttl};
    size_t lens[SF_ARRAY_LEN(argv)];

    snprintf(key, sizeof(key), SF_RK_SANDBOX, c->job.sandbox);
    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%lld", (long long)c->ctx->cfg.host_ttl_ms);
    for (size_t i = 0; i < SF_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    if (sf_redis_script_call(c->ctx->redis, &route_script, on_route, c, 2, 3, argv, lens) < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
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
