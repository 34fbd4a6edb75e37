/* templates.c: sandbox_template_list and sandbox_template_create, answered here from Redis
 * (common/sf_templates.h). A create is recorded (status building) on the host chosen to
 * build it, answered at once, and handed to that host as sf.template_build; the worker
 * writes the outcome into the record (worker/tpl_build.c). */
#include "sched.h"
#include "sf_log.h"
#include "sf_templates.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ARGV: now, host_ttl, team, prefix. Returns JSON [debian status, [[name, status, from,
 * vcpu_milli, memory_mib, disk_mib, failed_step, error, created, updated, step]...]]. */
static const char lua_list[] =
    "local now, ttl, team, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]\n"
    "local deb = 'building'\n"
    "for _, h in ipairs(redis.call('ZRANGEBYSCORE', 'sf:hosts', now - ttl, '+inf')) do\n"
    "  if redis.call('HGET', 'sf:host:{' .. h .. '}', 'tpl_debian') == '1' then\n"
    "    deb = 'ready'\n"
    "    break\n"
    "  end\n"
    "end\n"
    "local names = redis.call('SMEMBERS', 'sf:team:{' .. team .. '}:tpls')\n"
    "table.sort(names)\n"
    "local recs = {}\n"
    "for _, n in ipairs(names) do\n"
    "  if string.sub(n, 1, #prefix) == prefix then\n"
    "    local v = redis.call('HMGET', 'sf:team:{' .. team .. '}:tpl:' .. n, 'status', 'from', "
    "'vcpu_milli', 'memory_mib', 'disk_mib', 'failed_step', 'error', 'created', 'updated', "
    "'step')\n"
    "    if v[1] then\n"
    "      table.insert(recs, {n, v[1], v[2] or '', v[3] or '', v[4] or '', v[5] or '', "
    "v[6] or '', v[7] or '', v[8] or '', v[9] or '', v[10] or ''})\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return cjson.encode({deb, recs})\n";

/* ARGV: now, host_ttl, team, name, from, job, vcpu_milli, memory_mib, disk_mib, run_steps
 * (JSON), start_cmd, ready_cmd, per-team limit. Picks the live jail host with the most
 * room (the host of `from` when it is a team template: a team template lives on the host
 * that built it; one that has 'debian' when from is debian) and records the template
 * there. Returns {'ok', host}, {'exists', status}, {'quota', n}, {'nofrom'},
 * {'fromstatus', status}, {'pinned', host}, {'nodebian'}, {'nohost'}. */
static const char lua_create[] =
    "local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])\n"
    "local team, name, from, job = ARGV[3], ARGV[4], ARGV[5], ARGV[6]\n"
    "local key = 'sf:team:{' .. team .. '}:tpl:' .. name\n"
    "local set = 'sf:team:{' .. team .. '}:tpls'\n"
    "local old = redis.call('HMGET', key, 'status', 'job', 'host')\n"
    "if old[1] then\n"
    "  if old[2] == job then return {'ok', old[3]} end\n" /* the same call, redelivered */
    "  if old[1] ~= 'failed' then return {'exists', old[1]} end\n"
    "elseif redis.call('SCARD', set) >= tonumber(ARGV[13]) then\n"
    "  return {'quota', ARGV[13]}\n"
    "end\n"
    "local pin = nil\n"
    "if from ~= 'base' and from ~= 'debian' then\n"
    "  local f = redis.call('HMGET', 'sf:team:{' .. team .. '}:tpl:' .. from, 'status', 'host')\n"
    "  if not f[1] then return {'nofrom'} end\n"
    "  if f[1] ~= 'ready' then return {'fromstatus', f[1]} end\n"
    "  pin = f[2]\n"
    "end\n"
    "local best, bfree, deb = nil, -1, false\n"
    "for _, h in ipairs(redis.call('ZRANGEBYSCORE', 'sf:hosts', now - ttl, '+inf')) do\n"
    "  local v = redis.call('HMGET', 'sf:host:{' .. h .. '}', 'driver', 'capacity', 'running', "
    "'tpl_debian')\n"
    "  if v[1] == 'jail' and (not pin or pin == h) then\n"
    "    if from ~= 'debian' or v[4] == '1' then\n"
    "      local free = (tonumber(v[2]) or 0) - (tonumber(v[3]) or 0)\n"
    "      if free > bfree then best, bfree = h, free end\n"
    "    else\n"
    "      deb = true\n"
    "    end\n"
    "  end\n"
    "end\n"
    "if not best then\n"
    "  if pin then return {'pinned', pin} end\n"
    "  if deb then return {'nodebian'} end\n"
    "  return {'nohost'}\n"
    "end\n"
    "redis.call('DEL', key, key .. ':log')\n"
    "redis.call('HSET', key, 'name', name, 'team', team, 'from', from, 'status', 'building', "
    "'host', best, 'job', job, 'created', now, 'updated', now, 'vcpu_milli', ARGV[7], "
    "'memory_mib', ARGV[8], 'disk_mib', ARGV[9], 'run_steps', ARGV[10], 'start_cmd', ARGV[11], "
    "'ready_cmd', ARGV[12])\n"
    "redis.call('SADD', set, name)\n"
    "return {'ok', best}\n";

static const char *elem(const redisReply *rep, size_t i)
{
    return i < rep->elements && rep->element[i]->type == REDIS_REPLY_STRING
               ? rep->element[i]->str
               : "";
}

static json_t *shape_json(json_t *o, long long vcpu_milli, long long mem, long long disk)
{
    json_object_set_new(o, "vcpu", json_integer(vcpu_milli >= 1000 ? vcpu_milli / 1000 : 1));
    json_object_set_new(o, "vcpu_milli", json_integer(vcpu_milli));
    json_object_set_new(o, "memory_mib", json_integer(mem));
    if (disk > 0)
        json_object_set_new(o, "disk_mib", json_integer(disk));
    return o;
}

static long long num(const char *s)
{
    return s && *s ? strtoll(s, NULL, 10) : 0;
}

/* ---- sandbox_template_list ------------------------------------------------------- */

static void on_list(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    const sch_cfg *cfg = &c->ctx->cfg;
    const char *prefix = json_string_value(json_object_get(c->job.args, "name_prefix"));
    json_t *doc, *out, *recs, *rec;
    size_t i;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_STRING ||
        !(doc = json_loadb(rep->str, rep->len, 0, NULL))) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (!prefix)
        prefix = "";
    out = json_array();
    if (!strncmp("base", prefix, strlen(prefix)))
        json_array_append_new(out, shape_json(json_pack("{s:s, s:s, s:b}", "name", "base",
                                                         "status", "ready", "builtin", 1),
                                              cfg->sandbox_vcpu_milli, cfg->sandbox_memory_mib,
                                              cfg->sandbox_disk_mib));
    if (!strncmp("debian", prefix, strlen(prefix)))
        json_array_append_new(out, shape_json(json_pack("{s:s, s:s, s:b}", "name", "debian",
                                                         "status", json_string_value(
                                                             json_array_get(doc, 0)) ?: "building",
                                                         "builtin", 1),
                                              cfg->sandbox_vcpu_milli, cfg->sandbox_memory_mib,
                                              cfg->sandbox_disk_mib));
    recs = json_array_get(doc, 1); /* an empty Lua table encodes as {} */
    json_array_foreach(recs, i, rec) {
        const char *f[11];
        json_t *o;
        for (size_t k = 0; k < 11; k++)
            f[k] = json_string_value(json_array_get(rec, k)) ?: "";
        o = json_pack("{s:s, s:s, s:b, s:s}", "name", f[0], "status", f[1], "builtin", 0,
                      "from", f[2]);
        if (!o)
            continue;
        shape_json(o, num(f[3]), num(f[4]), num(f[5]));
        if (!strcmp(f[1], "failed")) {
            if (f[6][0])
                json_object_set_new(o, "failed_step", json_integer(num(f[6])));
            json_object_set_new(o, "error", json_string(f[7]));
        }
        if (!strcmp(f[1], "building") && f[10][0]) /* "copy", or "3/5": the step running */
            json_object_set_new(o, "step", json_string(f[10]));
        json_object_set_new(o, "created_ms", json_integer(num(f[8])));
        json_object_set_new(o, "updated_ms", json_integer(num(f[9])));
        json_array_append_new(out, o);
    }
    json_decref(doc);
    sch_reply_result(c, json_pack("{s:o, s:I}", "templates", out, "count",
                                  (json_int_t)json_array_size(out)));
}

void sch_tpl_list(sch_call *c)
{
    const char *prefix = json_string_value(json_object_get(c->job.args, "name_prefix"));
    char now[24], ttl[24];
    const char *argv[] = {"EVAL", lua_list, "0", now, ttl, c->job.team, prefix ? prefix : ""};

    snprintf(now, sizeof(now), "%lld", (long long)sf_now_ms());
    snprintf(ttl, sizeof(ttl), "%lld", (long long)c->ctx->cfg.host_ttl_ms);
    if (sf_redis_cmdargv(c->ctx->redis, on_list, c, SF_ARRAY_LEN(argv), argv, NULL) < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

/* ---- sandbox_template_create ----------------------------------------------------- */

static void on_create(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    const char *name = json_string_value(json_object_get(c->job.args, "name"));
    const char *from = json_string_value(json_object_get(c->job.args, "from"));
    const char *verdict;
    char text[384];
    json_t *res;

    (void)ac;
    if (sf_redis_is_oom(rep)) {
        sch_reply_error(c, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        sf_error("msg=\"template create script failed\" job=%s err=\"%s\"", c->job.id,
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    verdict = elem(rep, 0);
    if (!strcmp(verdict, "ok")) {
        char host[SF_ID_MAX];
        snprintf(host, sizeof(host), "%s", elem(rep, 1));
        res = json_pack("{s:s, s:s, s:s}", "name", name, "status", "building", "from", from);
        if (!res || sf_jobio_result(c->ctx->producer, &c->job, res) < 0)
            sf_error("msg=\"cannot produce reply\" job=%s topic=%s", c->job.id, c->job.reply);
        json_decref(res);
        sf_info("msg=\"template build placed\" job=%s team=%s template=%s from=%s host=%s",
                c->job.id, c->job.team, name, from, host);
        /* The build goes to its host as an internal message: the caller has its answer. */
        snprintf(c->job.tool, sizeof(c->job.tool), "%s", SF_TOOL_TEMPLATE_BUILD);
        c->job.deadline_ms = sf_now_ms() + 3600 * 1000LL;
        c->silent = 1;
        sch_forward(c, host);
        return;
    }
    if (!strcmp(verdict, "exists"))
        snprintf(text, sizeof(text), "Your team already has a template named '%s' (%s); pick "
                 "another name (a failed one's name can be used again).", name, elem(rep, 1));
    else if (!strcmp(verdict, "quota"))
        snprintf(text, sizeof(text), "Your team holds its limit of %s templates; build into "
                 "the name of a failed one instead.", elem(rep, 1));
    else if (!strcmp(verdict, "nofrom"))
        snprintf(text, sizeof(text), "Template '%s' does not exist; use 'base', 'debian' or one "
                 "of yours (sandbox_template_list).", from);
    else if (!strcmp(verdict, "fromstatus"))
        snprintf(text, sizeof(text), "Template '%s' is %s, not ready; wait until "
                 "sandbox_template_list shows it ready, or build from another.", from,
                 elem(rep, 1));
    else if (!strcmp(verdict, "pinned"))
        snprintf(text, sizeof(text), "The host that holds template '%s' is not responding; "
                 "retry later, or build from 'base' or 'debian'.", from);
    else if (!strcmp(verdict, "nodebian"))
        snprintf(text, sizeof(text), "The 'debian' template is still being built on the "
                 "hosts (a few minutes, once); retry in a minute.");
    else
        snprintf(text, sizeof(text), "No worker host that can build templates (jail driver) "
                 "is available; retry in a few seconds.");
    sch_reply_error(c, !strcmp(verdict, "exists") || !strcmp(verdict, "nofrom") ||
                               !strcmp(verdict, "fromstatus")
                           ? SF_ERR_INVALID
                           : !strcmp(verdict, "quota") ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE,
                    text);
}

void sch_tpl_create(sch_call *c)
{
    const sch_cfg *cfg = &c->ctx->cfg;
    json_t *a = c->job.args;
    const char *name = json_string_value(json_object_get(a, "name"));
    const char *from = json_string_value(json_object_get(a, "from"));
    json_t *steps = json_object_get(a, "run_steps");
    const char *start = json_string_value(json_object_get(a, "start_cmd"));
    const char *ready = json_string_value(json_object_get(a, "ready_cmd"));
    char num_s[7][24], text[256], *steps_s;
    long long vcpu = json_integer_value(json_object_get(a, "vcpu"));
    long long mem = json_integer_value(json_object_get(a, "memory_mib"));
    long long disk = json_integer_value(json_object_get(a, "disk_mib"));
    const char *argv[16];
    int argc = 0, rc;

    if (!name || !from) { /* the schema requires both */
        sch_reply_error(c, SF_ERR_INVALID, "Arguments 'name' and 'from' are required.");
        return;
    }
    if (!strcmp(name, "base") || !strcmp(name, "debian")) {
        snprintf(text, sizeof(text), "'%s' is a built-in template's name; pick another name.",
                 name);
        sch_reply_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (!strcmp(name, from)) {
        sch_reply_error(c, SF_ERR_INVALID, "A template cannot be built from itself; name "
                        "another template in 'from'.");
        return;
    }
    /* The shape its sandboxes get: what the call says, else the platform's default. */
    vcpu = vcpu > 0 ? vcpu * 1000 : cfg->sandbox_vcpu_milli;
    mem = mem > 0 ? mem : cfg->sandbox_memory_mib;
    disk = disk > 0 ? disk : cfg->sandbox_disk_mib;
    json_object_set_new(a, "vcpu_milli", json_integer(vcpu));
    json_object_set_new(a, "memory_mib", json_integer(mem));
    json_object_set_new(a, "disk_mib", json_integer(disk));
    steps_s = json_is_array(steps) ? json_dumps(steps, JSON_COMPACT) : NULL;
    snprintf(num_s[0], 24, "%lld", (long long)sf_now_ms());
    snprintf(num_s[1], 24, "%lld", (long long)cfg->host_ttl_ms);
    snprintf(num_s[2], 24, "%lld", vcpu);
    snprintf(num_s[3], 24, "%lld", mem);
    snprintf(num_s[4], 24, "%lld", disk);
    snprintf(num_s[5], 24, "%d", SF_TEMPLATES_PER_TEAM);
    argv[argc++] = "EVAL";
    argv[argc++] = lua_create;
    argv[argc++] = "0";
    argv[argc++] = num_s[0];
    argv[argc++] = num_s[1];
    argv[argc++] = c->job.team;
    argv[argc++] = name;
    argv[argc++] = from;
    argv[argc++] = c->job.id;
    argv[argc++] = num_s[2];
    argv[argc++] = num_s[3];
    argv[argc++] = num_s[4];
    argv[argc++] = steps_s ? steps_s : "[]";
    argv[argc++] = start ? start : "";
    argv[argc++] = ready ? ready : "";
    argv[argc++] = num_s[5];
    rc = sf_redis_cmdargv(c->ctx->redis, on_create, c, argc, argv, NULL);
    free(steps_s);
    if (rc < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}
