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
 * vcpu_milli, memory_mib, disk_mib, failed_step, error, created, updated, step, hosts,
 * hosts ready]...]]. */
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
    "      local nh, nr = 0, 0\n" /* hosts it was built on; ready there */
    "      for _, f in ipairs(redis.call('HKEYS', 'sf:team:{' .. team .. '}:tpl:' .. n)) do\n"
    "        if string.sub(f, 1, 3) == 'at:' then\n"
    "          nh = nh + 1\n"
    "          if redis.call('HGET', 'sf:team:{' .. team .. '}:tpl:' .. n, f) == 'ready' then "
    "nr = nr + 1 end\n"
    "        end\n"
    "      end\n"
    "      if nh == 0 then nh = 1; if v[1] == 'ready' then nr = 1 end end\n"
    "      table.insert(recs, {n, v[1], v[2] or '', v[3] or '', v[4] or '', v[5] or '', "
    "v[6] or '', v[7] or '', v[8] or '', v[9] or '', v[10] or '', tostring(nh), tostring(nr)})\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return cjson.encode({deb, recs})\n";

/* ARGV: now, host_ttl, team, name, from, job, vcpu_milli, memory_mib, disk_mib, run_steps
 * (JSON), start_cmd, ready_cmd, per-team limit. A team template is built on every live jail
 * host that can (one with 'debian' when from is debian; one where `from` is ready when it
 * is a team template): each holds its own copy, and placement uses the hosts that have it
 * ready. The lead (the host with the most room) writes the step and the log. Records
 * at:<host> = building for each. Returns {'ok', start, ready, lead, host...},
 * {'exists', status}, {'quota', n}, {'nofrom'}, {'fromstatus', status}, {'pinned'},
 * {'nodebian'}, {'nohost'}. */
static const char lua_create[] =
    "local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])\n"
    "local team, name, from, job = ARGV[3], ARGV[4], ARGV[5], ARGV[6]\n"
    "local key = 'sf:team:{' .. team .. '}:tpl:' .. name\n"
    "local set = 'sf:team:{' .. team .. '}:tpls'\n"
    "local old = redis.call('HMGET', key, 'status', 'job', 'host', 'start_cmd', 'ready_cmd')\n"
    "if old[1] then\n"
    "  if old[2] == job then\n" /* the same call, redelivered: to the same hosts again */
    "    local out = {'ok', old[4] or '', old[5] or '', old[3]}\n"
    "    local h = redis.call('HGETALL', key)\n"
    "    for i = 1, #h, 2 do\n"
    "      local at = string.sub(h[i], 1, 3) == 'at:' and string.sub(h[i], 4)\n"
    "      if at and at ~= old[3] then table.insert(out, at) end\n"
    "    end\n"
    "    return out\n"
    "  end\n"
    "  if old[1] ~= 'failed' then return {'exists', old[1]} end\n"
    "elseif redis.call('SCARD', set) >= tonumber(ARGV[13]) then\n"
    "  return {'quota', ARGV[13]}\n"
    "end\n"
    "local fkey, fhost, start, ready = nil, nil, ARGV[11], ARGV[12]\n"
    "if from ~= 'base' and from ~= 'debian' then\n"
    "  fkey = 'sf:team:{' .. team .. '}:tpl:' .. from\n"
    "  local f = redis.call('HMGET', fkey, 'status', 'host', 'start_cmd', 'ready_cmd')\n"
    "  if not f[1] then return {'nofrom'} end\n"
    "  if f[1] ~= 'ready' then return {'fromstatus', f[1]} end\n"
    /* a record from before templates were on several hosts: on its host only */
    "  if redis.call('HEXISTS', fkey, 'at:' .. (f[2] or '')) == 0 then fhost = f[2] end\n"
    /* its service is inherited unless the new template names its own */
    "  if start == '' and ready == '' then start, ready = f[3] or '', f[4] or '' end\n"
    "end\n"
    "local hosts, best, bfree, deb = {}, nil, -1, false\n"
    "for _, h in ipairs(redis.call('ZRANGEBYSCORE', 'sf:hosts', now - ttl, '+inf')) do\n"
    "  local v = redis.call('HMGET', 'sf:host:{' .. h .. '}', 'driver', 'capacity', 'running', "
    "'tpl_debian')\n"
    "  local ok = v[1] == 'jail'\n"
    "  if ok and fkey then\n"
    "    ok = (fhost and fhost == h) or (not fhost and redis.call('HGET', fkey, 'at:' .. h) == 'ready')\n"
    "  end\n"
    "  if ok and from == 'debian' and v[4] ~= '1' then ok, deb = false, true end\n"
    "  if ok then\n"
    "    table.insert(hosts, h)\n"
    "    local free = (tonumber(v[2]) or 0) - (tonumber(v[3]) or 0)\n"
    "    if free > bfree then best, bfree = h, free end\n"
    "  end\n"
    "end\n"
    "if not best then\n"
    "  if fkey then return {'pinned'} end\n"
    "  if deb then return {'nodebian'} end\n"
    "  return {'nohost'}\n"
    "end\n"
    "redis.call('DEL', key, key .. ':log')\n"
    "redis.call('HSET', key, 'name', name, 'team', team, 'from', from, 'status', 'building', "
    "'host', best, 'job', job, 'created', now, 'updated', now, 'vcpu_milli', ARGV[7], "
    "'memory_mib', ARGV[8], 'disk_mib', ARGV[9], 'run_steps', ARGV[10], 'start_cmd', start, "
    "'ready_cmd', ready)\n"
    "local out = {'ok', start, ready, best}\n"
    "for _, h in ipairs(hosts) do\n"
    "  redis.call('HSET', key, 'at:' .. h, 'building')\n"
    "  if h ~= best then table.insert(out, h) end\n"
    "end\n"
    "redis.call('SADD', set, name)\n"
    "return out\n";

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

/* A template job goes to several hosts (each builds its own copy; each removes its copy):
 * the call is handed to each as an internal message, also to hosts not heartbeating now
 * (a host reads its topic on from where it stopped). All but the last are sent on their
 * own; the last carries the job's offset and ends the call. lead: args.lead is true for
 * hosts[0] only. */
static void forward_all(sch_call *c, const char *const *hosts, size_t n, int lead)
{
    char topic[SF_TOPIC_MAX];
    sf_buf b;

    for (size_t i = 0; i + 1 < n; i++) {
        if (lead)
            json_object_set_new(c->job.args, "lead", json_boolean(i == 0));
        snprintf(c->job.host, sizeof(c->job.host), "%s", hosts[i]);
        snprintf(topic, sizeof(topic), SF_TOPIC_HOST_PREFIX "%s", hosts[i]);
        sf_buf_init(&b, SF_MSG_MAX);
        if (sf_job_encode(&c->job, &b) < 0 ||
            sf_kafka_produce(c->ctx->producer, topic, c->job.sandbox, b.p, b.len) < 0)
            sf_error("msg=\"cannot hand a template job to a host\" job=%s tool=%s host=%s",
                     c->job.id, c->job.tool, hosts[i]);
        sf_buf_fini(&b);
    }
    if (!n) {
        sch_call_done(c);
        return;
    }
    if (lead)
        json_object_set_new(c->job.args, "lead", json_boolean(n == 1));
    sch_forward(c, hosts[n - 1]);
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
        const char *f[13];
        json_t *o;
        for (size_t k = 0; k < 13; k++)
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
        json_object_set_new(o, "hosts", json_integer(num(f[11])));
        json_object_set_new(o, "hosts_ready", json_integer(num(f[12])));
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
        const char *hosts[64];
        size_t n = 0;
        for (size_t i = 3; i < rep->elements && n < SF_ARRAY_LEN(hosts); i++)
            if (sf_id_valid(elem(rep, i)))
                hosts[n++] = elem(rep, i);
        /* the service its sandboxes run: its own, or the one of `from` */
        if (*elem(rep, 1))
            json_object_set_new(c->job.args, "start_cmd", json_string(elem(rep, 1)));
        if (*elem(rep, 2))
            json_object_set_new(c->job.args, "ready_cmd", json_string(elem(rep, 2)));
        res = json_pack("{s:s, s:s, s:s, s:I}", "name", name, "status", "building", "from", from,
                        "hosts", (json_int_t)n);
        if (!res || sf_jobio_result(c->ctx->producer, &c->job, res) < 0)
            sf_error("msg=\"cannot produce reply\" job=%s topic=%s", c->job.id, c->job.reply);
        json_decref(res);
        sf_info("msg=\"template build placed\" job=%s team=%s template=%s from=%s lead=%s "
                "hosts=%zu", c->job.id, c->job.team, name, from, n ? hosts[0] : "", n);
        /* The build goes to every host as an internal message: the caller has its answer. */
        snprintf(c->job.tool, sizeof(c->job.tool), "%s", SF_TOOL_TEMPLATE_BUILD);
        c->job.deadline_ms = sf_now_ms() + 3600 * 1000LL;
        c->silent = 1;
        forward_all(c, hosts, n, 1);
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
        snprintf(text, sizeof(text), "No host that holds template '%s' is responding; retry "
                 "later, or build from 'base' or 'debian'.", from);
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

/* ---- sandbox_template_delete ----------------------------------------------------- */

/* KEYS: the record. ARGV: job. Marks it deleting (no new sandbox or build uses it from now
 * on; its status before is kept). Returns 'none' or 'ok'. */
static const char lua_del_mark[] =
    "local st = redis.call('HGET', KEYS[1], 'status')\n"
    "if not st then return 'none' end\n"
    "if st ~= 'deleting' then\n"
    "  redis.call('HSET', KEYS[1], 'status', 'deleting', 'before', st, 'deljob', ARGV[1])\n"
    "end\n"
    "return 'ok'\n";

/* KEYS: the record. ARGV: job. The delete was refused: the status it had again (ready
 * when a host has it ready, as a build that ended meanwhile counts). */
static const char lua_del_undo[] =
    "local v = redis.call('HMGET', KEYS[1], 'status', 'deljob', 'before')\n"
    "if v[1] ~= 'deleting' or v[2] ~= ARGV[1] then return 0 end\n"
    "local st = v[3] or 'ready'\n"
    "local h = redis.call('HGETALL', KEYS[1])\n"
    "for i = 1, #h, 2 do\n"
    "  if string.sub(h[i], 1, 3) == 'at:' and h[i + 1] == 'ready' then st = 'ready' end\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'status', st)\n"
    "redis.call('HDEL', KEYS[1], 'before', 'deljob')\n"
    "return 1\n";

/* KEYS: the record, its log, the team's set of names. ARGV: name. Deletes them; returns
 * the hosts that hold (or were building) it. */
static const char lua_del[] =
    "local hosts, seen = {}, {}\n"
    "local h = redis.call('HGETALL', KEYS[1])\n"
    "for i = 1, #h, 2 do\n"
    "  local host = nil\n"
    "  if h[i] == 'host' then host = h[i + 1] end\n"
    "  if string.sub(h[i], 1, 3) == 'at:' then host = string.sub(h[i], 4) end\n"
    "  if host and host ~= '' and not seen[host] then\n"
    "    seen[host] = true\n"
    "    table.insert(hosts, host)\n"
    "  end\n"
    "end\n"
    "redis.call('DEL', KEYS[1], KEYS[2])\n"
    "redis.call('SREM', KEYS[3], ARGV[1])\n"
    "return hosts\n";

static sf_redis_script del_mark_script = SF_REDIS_SCRIPT(lua_del_mark);
static sf_redis_script del_undo_script = SF_REDIS_SCRIPT(lua_del_undo);
static sf_redis_script del_script = SF_REDIS_SCRIPT(lua_del);

#define DEL_IDS_SHOWN 3

/* One delete: the call, and the count of the team's live sandboxes made from it. */
typedef struct tdel {
    sch_call *c;
    char name[64];
    char key[256], logkey[256], setkey[160];
    size_t pending;         /* record reads still out */
    int failed;             /* a read failed: Redis is down */
    size_t used;
    char ids[DEL_IDS_SHOWN][SF_ID_MAX];
} tdel;

static int del_call(tdel *d, sf_redis_script *s, redisCallbackFn *cb, int nkeys)
{
    const char *argv[4] = {d->key, d->logkey, d->setkey, NULL};
    size_t lens[4];

    argv[nkeys] = nkeys == 1 ? d->c->job.id : d->name;
    for (int i = 0; i <= nkeys; i++)
        lens[i] = strlen(argv[i]);
    return sf_redis_script_call(d->c->ctx->redis, s, cb, d, nkeys, 1, argv, lens);
}

static void del_fail(tdel *d, const char *code, const char *text)
{
    sch_reply_error(d->c, code, text);
    free(d);
}

static void on_deleted(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tdel *d = priv;
    sch_call *c = d->c;
    const char *hosts[64];
    size_t n = 0;
    json_t *res;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    for (size_t i = 0; i < rep->elements && n < SF_ARRAY_LEN(hosts); i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING && sf_id_valid(rep->element[i]->str))
            hosts[n++] = rep->element[i]->str;
    res = json_pack("{s:s, s:s, s:I}", "name", d->name, "status", "deleted", "hosts",
                    (json_int_t)n);
    if (!res || sf_jobio_result(c->ctx->producer, &c->job, res) < 0)
        sf_error("msg=\"cannot produce reply\" job=%s topic=%s", c->job.id, c->job.reply);
    json_decref(res);
    sf_info("msg=\"template deleted\" job=%s team=%s template=%s hosts=%zu", c->job.id,
            c->job.team, d->name, n);
    /* its hosts remove the files (the caller has its answer) */
    snprintf(c->job.tool, sizeof(c->job.tool), "%s", SF_TOOL_TEMPLATE_DELETE);
    c->job.deadline_ms = sf_now_ms() + 3600 * 1000LL;
    c->silent = 1;
    forward_all(c, hosts, n, 0);
    free(d);
}

static void on_undone(redisAsyncContext *ac, void *r, void *priv)
{
    tdel *d = priv;
    char text[512];
    int off;

    (void)ac;
    (void)r;
    off = snprintf(text, sizeof(text), "Template '%s' is used by %zu live sandbox%s (", d->name,
                   d->used, d->used == 1 ? "" : "es");
    for (size_t i = 0; i < d->used && i < DEL_IDS_SHOWN && off < (int)sizeof(text); i++)
        off += snprintf(text + off, sizeof(text) - (size_t)off, "%s%s", i ? ", " : "", d->ids[i]);
    if (off < (int)sizeof(text))
        snprintf(text + off, sizeof(text) - (size_t)off, "%s); kill %s with sandbox_kill, then "
                 "delete the template again.", d->used > DEL_IDS_SHOWN ? ", ..." : "",
                 d->used == 1 ? "it" : "them");
    del_fail(d, SF_ERR_INVALID, text);
}

static void on_undo_logged(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    (void)ac;
    (void)priv;
    if (!rep || rep->type == REDIS_REPLY_ERROR)
        sf_warn("msg=\"cannot undo a template's deleting mark; it stays 'deleting' until "
                "deleted again\" err=\"%s\"", rep ? rep->str : "no reply");
}

/* Every read answered: in use (the delete is undone and refused) or not (deleted). */
static void del_decide(tdel *d)
{
    if (d->failed) {
        if (del_call(d, &del_undo_script, on_undo_logged, 1) < 0)
            sf_warn("msg=\"cannot undo a template's deleting mark\" template=%s", d->name);
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (d->used) {
        if (del_call(d, &del_undo_script, on_undone, 1) < 0)
            on_undone(NULL, NULL, d);
        return;
    }
    if (del_call(d, &del_script, on_deleted, 3) < 0)
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}

/* One sandbox record: [template, state]. The team's set holds only live sandboxes. */
static void on_sandbox(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tdel *d = priv;
    const char *id = NULL;

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3)
        d->failed = 1;
    else if (rep->element[0]->type == REDIS_REPLY_STRING &&
             !strcmp(rep->element[0]->str, d->name) &&
             rep->element[2]->type == REDIS_REPLY_STRING) {
        id = rep->element[2]->str;
        if (d->used < DEL_IDS_SHOWN)
            snprintf(d->ids[d->used], SF_ID_MAX, "%s", id);
        d->used++;
    }
    if (--d->pending == 0)
        del_decide(d);
}

static void on_members(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tdel *d = priv;
    char key[128];

    (void)ac;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        d->failed = 1;
        del_decide(d);
        return;
    }
    d->pending = 1; /* held until every read is sent */
    for (size_t i = 0; i < rep->elements; i++) {
        if (rep->element[i]->type != REDIS_REPLY_STRING)
            continue;
        snprintf(key, sizeof(key), SF_RK_SANDBOX, rep->element[i]->str);
        d->pending++;
        if (sf_redis_cmd(d->c->ctx->redis, on_sandbox, d, "HMGET %s template state id", key) < 0) {
            d->pending--;
            d->failed = 1;
        }
    }
    if (--d->pending == 0)
        del_decide(d);
}

static void on_marked(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    tdel *d = priv;
    char text[256];

    (void)ac;
    if (sf_redis_is_oom(rep)) {
        del_fail(d, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_STRING) {
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    if (!strcmp(rep->str, "none")) {
        snprintf(text, sizeof(text), "Template '%s' does not exist; sandbox_template_list "
                 "shows your team's templates.", d->name);
        del_fail(d, SF_ERR_NOT_FOUND, text);
        return;
    }
    /* marked: no new sandbox starts from it; now count the live ones that did */
    snprintf(text, sizeof(text), SF_RK_TEAM_SANDBOXES, d->c->job.team);
    if (sf_redis_cmd(d->c->ctx->redis, on_members, d, "SMEMBERS %s", text) < 0) {
        d->failed = 1;
        del_decide(d);
    }
}

void sch_tpl_delete(sch_call *c)
{
    const char *name = json_string_value(json_object_get(c->job.args, "name"));
    char text[256];
    tdel *d;

    if (!name) { /* the schema requires it */
        sch_reply_error(c, SF_ERR_INVALID, "Argument 'name' is required.");
        return;
    }
    if (!strcmp(name, "base") || !strcmp(name, "debian")) {
        snprintf(text, sizeof(text), "'%s' is a built-in template and cannot be deleted.", name);
        sch_reply_error(c, SF_ERR_INVALID, text);
        return;
    }
    if (!sf_id_valid(name) || !(d = calloc(1, sizeof(*d)))) {
        snprintf(text, sizeof(text), "Template '%.63s' does not exist; sandbox_template_list "
                 "shows your team's templates.", name);
        sch_reply_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    d->c = c;
    snprintf(d->name, sizeof(d->name), "%s", name);
    snprintf(d->key, sizeof(d->key), SF_RK_TEMPLATE, c->job.team, name);
    snprintf(d->logkey, sizeof(d->logkey), SF_RK_TEMPLATE_LOG, c->job.team, name);
    snprintf(d->setkey, sizeof(d->setkey), SF_RK_TEAM_TEMPLATES, c->job.team);
    if (del_call(d, &del_mark_script, on_marked, 1) < 0)
        del_fail(d, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}
