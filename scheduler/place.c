/* place.c: sandbox_create: the shape a new sandbox gets, the team's limits and fair
 * share, the choice of host, and the reservation of the shape there; one Lua script, so
 * placement is atomic and one round trip. The worker applies the shape it finds in the
 * forwarded job's args.limits; retiring the record releases the reservation
 * (common/sf_records.c). */
#include "sched.h"
#include "sf_log.h"

#include <stdlib.h>
#include <string.h>

/* Placement: checks the team's limits and shares, picks a host, reserves the sandbox's
 * shape there and writes the record, atomically. ARGV: now, host_ttl, id, team, name,
 * template, metadata, timeout_s, team sandbox limit, host share %, fleet share %, memory
 * MiB, vCPU milli, the host to use ('' = any). The team's own limits (sf:team:{t}:limits: sandboxes, host_share_pct,
 * fleet_share_pct) override the last three defaults. Returns {verdict, ...}:
 * {'ok', host}, {'conflict'}, {'quota', limit}, {'share', what, limit}, {'hostshare', pct},
 * {'full'}, {'nohost'}. A host's capacity in memory and CPU counts only once its worker
 * publishes mem_mib / vcpu_milli; until then its count (capacity) bounds it. */
static const char lua_create[] =
    "#!lua\n" /* no allow-oom: a full Redis refuses it whole */
    "local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])\n"
    "local id, team = ARGV[3], ARGV[4]\n"
    "local mem, vcpu = tonumber(ARGV[12]), tonumber(ARGV[13])\n"
    "local sbkey = 'sf:sb:{' .. id .. '}'\n"
    "local old = redis.call('HMGET', sbkey, 'team', 'host', 'state')\n"
    "if old[1] then\n"
    "  if old[1] == team and old[3] ~= 'killed' and old[3] ~= 'failed' and old[3] ~= 'lost' then\n"
    "    return {'ok', old[2]}\n" /* the same create, redelivered */
    "  end\n"
    "  return {'conflict'}\n"
    "end\n"
    "local lim = redis.call('HMGET', 'sf:team:{' .. team .. '}:limits', 'sandboxes', "
    "'host_share_pct', 'fleet_share_pct')\n"
    "local limit = tonumber(lim[1]) or tonumber(ARGV[9])\n"
    "local hshare = tonumber(lim[2]) or tonumber(ARGV[10])\n"
    "local fshare = tonumber(lim[3]) or tonumber(ARGV[11])\n"
    "local teamkey = 'sf:team:{' .. team .. '}:sandboxes'\n"
    "local reskey = 'sf:team:{' .. team .. '}:res'\n"
    "local tr = redis.call('HMGET', reskey, 'n', 'mem', 'vcpu')\n"
    "local tn = math.max(redis.call('SCARD', teamkey), tonumber(tr[1]) or 0)\n"
    "local tmem, tvcpu = tonumber(tr[2]) or 0, tonumber(tr[3]) or 0\n"
    "if tn >= limit then return {'quota', tostring(limit)} end\n"
    /* a team template: its shape, and the hosts that hold it; 'debian': a host that has it */
    "local tmpl, pin, disk, tkey = ARGV[6], nil, '', nil\n"
    "local needdeb = tmpl == 'debian'\n"
    "if tmpl ~= 'base' and tmpl ~= 'debian' then\n"
    "  tkey = 'sf:team:{' .. team .. '}:tpl:' .. tmpl\n"
    "  local t = redis.call('HMGET', tkey, 'status', 'host', 'memory_mib', 'vcpu_milli', "
    "'disk_mib')\n"
    "  if not t[1] then return {'notemplate'} end\n"
    "  if t[1] ~= 'ready' then return {'tplstatus', t[1]} end\n"
    "  mem, vcpu, disk = tonumber(t[3]) or mem, tonumber(t[4]) or vcpu, t[5] or ''\n"
    /* on the hosts where it is ready (at:<host>); a record from before templates were
     * built on several hosts: on its one host */
    "  if redis.call('HEXISTS', tkey, 'at:' .. (t[2] or '')) == 0 then pin = t[2] end\n"
    "end\n"
    "local function holds(h)\n"
    "  if pin then return h == pin end\n"
    "  return not tkey or redis.call('HGET', tkey, 'at:' .. h) == 'ready'\n"
    "end\n"
    "if ARGV[14] ~= '' then pin = ARGV[14] end\n" /* from a snapshot: the host that holds it */
    "local live = redis.call('ZRANGEBYSCORE', 'sf:hosts', now - ttl, '+inf')\n"    "local anyjail = false\n"
    "if #live == 0 then return {'nohost'} end\n"
    "local hosts, fn, fmem, fvcpu, allmem, allvcpu = {}, 0, 0, 0, true, true\n"
    "for _, h in ipairs(live) do\n"
    "  local hk = 'sf:host:{' .. h .. '}'\n"
    "  local v = redis.call('HMGET', hk, 'capacity', 'running', 'mem_mib', 'vcpu_milli', "
    "'res_count', 'res_mem_mib', 'res_vcpu_milli', 'tpl_debian', 'driver')\n"
    "  local e = {h = h, key = hk, cap = tonumber(v[1]) or 0, mem = tonumber(v[3]), "
    "vcpu = tonumber(v[4]), deb = v[8] == '1'}\n"
    "  if v[9] == 'jail' then anyjail = true end\n"
    "  local rc = tonumber(v[5])\n"
    "  if rc then\n"
    "    e.rmem, e.rvcpu = tonumber(v[6]) or 0, tonumber(v[7]) or 0\n"
    "  else\n" /* a new host, or its hash expired while it was silent: count again */
    "    rc, e.rmem, e.rvcpu = 0, 0, 0\n"
    "    for _, sid in ipairs(redis.call('SMEMBERS', 'sf:host:{' .. h .. '}:sandboxes')) do\n"
    "      local r = redis.call('HMGET', 'sf:sb:{' .. sid .. '}', 'res_mem_mib', "
    "'res_vcpu_milli')\n"
    "      if r[1] then\n"
    "        rc, e.rmem, e.rvcpu = rc + 1, e.rmem + tonumber(r[1]), e.rvcpu + (tonumber(r[2]) or 0)\n"
    "      end\n"
    "    end\n"
    "    redis.call('HSET', hk, 'res_count', rc, 'res_mem_mib', e.rmem, 'res_vcpu_milli', "
    "e.rvcpu)\n"
    "  end\n"
    "  e.used = math.max(rc, tonumber(v[2]) or 0)\n"
    "  if e.cap > 0 then\n"
    "    fn = fn + e.cap\n"
    "    if e.mem then fmem = fmem + e.mem else allmem = false end\n"
    "    if e.vcpu then fvcpu = fvcpu + e.vcpu else allvcpu = false end\n"
    "    table.insert(hosts, e)\n"
    "  end\n"
    "end\n"
    "local function over(used, add, cap, pct) return (used + add) * 100 > cap * pct end\n"
    "if tn > 0 then\n" /* a team's first sandbox is never refused for its share */
    "  if over(tn, 1, fn, fshare) then\n"
    "    return {'share', 'sandboxes', tostring(math.floor(fn * fshare / 100))}\n"
    "  end\n"
    "  if allmem and fmem > 0 and over(tmem, mem, fmem, fshare) then\n"
    "    return {'share', 'memory', tostring(math.floor(fmem * fshare / 100))}\n"
    "  end\n"
    "  if allvcpu and fvcpu > 0 and over(tvcpu, vcpu, fvcpu, fshare) then\n"
    "    return {'share', 'vcpu', tostring(math.floor(fvcpu * fshare / 100))}\n"
    "  end\n"
    "end\n"
    "local best, bn, bfree, fits = nil, 0, 0, false\n"
    "for _, e in ipairs(hosts) do\n"
    "  if not holds(e.h) or (needdeb and not e.deb) then\n"
    "  elseif e.used < e.cap and (not e.mem or e.rmem + mem <= e.mem) and\n"
    "     (not e.vcpu or e.rvcpu + vcpu <= e.vcpu) then\n"
    "    fits = true\n"
    "    local th = redis.call('HMGET', reskey, 'n@' .. e.h, 'mem@' .. e.h, 'vcpu@' .. e.h)\n"
    "    local n, m, c = tonumber(th[1]) or 0, tonumber(th[2]) or 0, tonumber(th[3]) or 0\n"
    "    if n == 0 or (not over(n, 1, e.cap, hshare) and\n"
    "        (not e.mem or not over(m, mem, e.mem, hshare)) and\n"
    "        (not e.vcpu or not over(c, vcpu, e.vcpu, hshare))) then\n"
    /* spread: the host holding fewest of the team's sandboxes, then the most room left */
    "      local free = (e.cap - e.used) / e.cap\n"
    "      if e.mem and e.mem > 0 then free = math.min(free, (e.mem - e.rmem) / e.mem) end\n"
    "      if e.vcpu and e.vcpu > 0 then free = math.min(free, (e.vcpu - e.rvcpu) / e.vcpu) end\n"
    "      if not best or n < bn or (n == bn and free > bfree) then best, bn, bfree = e, n, free end\n"
    "    end\n"
    "  end\n"
    "end\n"
    "if not best then\n"
    "  if (pin or tkey) and not fits then return {'pinned'} end\n"
    "  if needdeb and not anyjail then return {'jailonly'} end\n"
    "  if needdeb and not fits then return {'nodebian'} end\n"
    "  if fits then return {'hostshare', tostring(hshare)} end\n"
    "  return {'full'}\n"
    "end\n"
    "redis.call('HSET', sbkey, 'id', id, 'team', team, 'host', best.h, 'state', 'creating', "
    "'name', ARGV[5], 'template', ARGV[6], 'metadata', ARGV[7], 'created', now, "
    "'last_active', now, 'timeout_seconds', ARGV[8], 'res_mem_mib', mem, 'res_vcpu_milli', vcpu, "
    "'res_team', 1)\n"
    "redis.call('SADD', teamkey, id)\n"
    "redis.call('SADD', 'sf:host:{' .. best.h .. '}:sandboxes', id)\n"
    "redis.call('HINCRBY', best.key, 'res_count', 1)\n"
    "redis.call('HINCRBY', best.key, 'res_mem_mib', mem)\n"
    "redis.call('HINCRBY', best.key, 'res_vcpu_milli', vcpu)\n"
    "redis.call('HINCRBY', reskey, 'n', 1)\n"
    "redis.call('HINCRBY', reskey, 'mem', mem)\n"
    "redis.call('HINCRBY', reskey, 'vcpu', vcpu)\n"
    "redis.call('HINCRBY', reskey, 'n@' .. best.h, 1)\n"
    "redis.call('HINCRBY', reskey, 'mem@' .. best.h, mem)\n"
    "redis.call('HINCRBY', reskey, 'vcpu@' .. best.h, vcpu)\n"
    "return {'ok', best.h, tostring(mem), tostring(vcpu), disk}\n";

/* args.limits of the forwarded create: the shape the worker applies (CONTRACTS.md). A
 * size of 0 in the config leaves that field to the worker's own default. */
static json_t *shape(const sch_cfg *cfg)
{
    json_t *l = json_object();

    json_object_set_new(l, "memory_mib", json_integer(cfg->sandbox_memory_mib));
    json_object_set_new(l, "vcpu_milli", json_integer(cfg->sandbox_vcpu_milli));
    json_object_set_new(l, "pids_max", json_integer(cfg->sandbox_pids_max));
    if (cfg->sandbox_disk_mib > 0)
        json_object_set_new(l, "disk_mib", json_integer(cfg->sandbox_disk_mib));
    if (cfg->sandbox_inodes > 0)
        json_object_set_new(l, "inodes", json_integer(cfg->sandbox_inodes));
    return l;
}

static const char *elem(const redisReply *rep, size_t i)
{
    return i < rep->elements && rep->element[i]->type == REDIS_REPLY_STRING
               ? rep->element[i]->str
               : "";
}

static const char what_to_do[] =
    "Kill sandboxes you no longer need (sandbox_list, then sandbox_kill), then retry";

static void on_create(redisAsyncContext *ac, void *r, void *priv)
{
    redisReply *rep = r;
    sch_call *c = priv;
    const char *verdict;
    char text[512];

    if (sf_redis_is_oom(rep)) {
        sf_warn("msg=\"create refused: Redis is at its maxmemory\" job=%s team=%s", c->job.id,
                c->job.team);
        sch_reply_error(c, SF_ERR_LIMIT, SF_MSG_PLATFORM_FULL);
        return;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        sf_error("msg=\"create script failed\" job=%s err=\"%s\"", c->job.id,
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
        return;
    }
    verdict = elem(rep, 0);
    if (strcmp(verdict, "ok") != 0)
        sf_info("msg=\"create refused\" job=%s team=%s verdict=%s", c->job.id, c->job.team,
                verdict);
    if (!strcmp(verdict, "ok")) {
        json_t *l = shape(&c->ctx->cfg);
        /* a team template's shape (the script answers the one it reserved) */
        if (strtoll(elem(rep, 2), NULL, 10) > 0)
            json_object_set_new(l, "memory_mib", json_integer(strtoll(elem(rep, 2), NULL, 10)));
        if (strtoll(elem(rep, 3), NULL, 10) > 0)
            json_object_set_new(l, "vcpu_milli", json_integer(strtoll(elem(rep, 3), NULL, 10)));
        if (strtoll(elem(rep, 4), NULL, 10) > 0)
            json_object_set_new(l, "disk_mib", json_integer(strtoll(elem(rep, 4), NULL, 10)));
        /* from a snapshot: the captured sandbox's shape (sch_snap_place) */
        if (json_is_object(json_object_get(c->job.args, "limits")))
            json_object_update(l, json_object_get(c->job.args, "limits"));
        json_object_set_new(c->job.args, "limits", l);
        sch_forward(c, elem(rep, 1));
        return;
    }
    if (!strcmp(verdict, "notemplate") || !strcmp(verdict, "tplstatus")) {
        const char *t = json_string_value(json_object_get(c->job.args, "from_template"));
        if (!strcmp(verdict, "notemplate"))
            snprintf(text, sizeof(text), "Template '%.64s' does not exist; use 'base', 'debian' "
                     "or one of your templates (sandbox_template_list).", t ? t : "");
        else
            snprintf(text, sizeof(text), "Template '%.64s' is %s, not ready; wait until "
                     "sandbox_template_list shows it ready.", t ? t : "", elem(rep, 1));
        sch_reply_error(c, SF_ERR_NOT_FOUND, text);
        return;
    }
    if (!strcmp(verdict, "pinned") && c->pin[0]) {
        snprintf(text, sizeof(text), "The host that holds snapshot '%.64s' (%.64s) is not "
                 "responding or has no room; a snapshot starts only on its own host: retry in a "
                 "few seconds, or kill one of your sandboxes there.",
                 json_string_value(json_object_get(c->job.args, "from_snapshot")), c->pin);
        sch_reply_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    }
    if (!strcmp(verdict, "pinned")) {
        const char *t = json_string_value(json_object_get(c->job.args, "from_template"));
        snprintf(text, sizeof(text), "No host that holds template '%.64s' has room or is "
                 "responding (a team template is built on the hosts that were up then; "
                 "sandbox_template_list shows on how many it is ready); retry in a few seconds, "
                 "or build it again to have it on today's hosts.", t ? t : "");
        sch_reply_error(c, SF_ERR_UNAVAILABLE, text);
        return;
    }
    if (!strcmp(verdict, "jailonly")) {
        sch_reply_error(c, SF_ERR_INVALID, "No host here runs the jail driver, and the qemu "
                        "driver runs only the 'base' template; create from 'base'.");
        return;
    }
    if (!strcmp(verdict, "nodebian")) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE, "The 'debian' template is still being built on "
                        "the hosts (a few minutes, once); retry sandbox_create in a minute.");
        return;
    }
    if (!strcmp(verdict, "conflict")) {
        sch_reply_error(c, SF_ERR_INVALID, "A sandbox with that id exists or existed; let the "
                                           "platform choose the id of a new sandbox.");
        return;
    }
    if (!strcmp(verdict, "quota")) {
        snprintf(text, sizeof(text), "Sandbox quota reached: your team may have %s sandboxes. "
                 "%s, or ask the operator for a higher limit.", elem(rep, 1), what_to_do);
        sch_reply_error(c, SF_ERR_LIMIT, text);
    } else if (!strcmp(verdict, "share")) {
        const char *what = elem(rep, 1), *n = elem(rep, 2);
        char amount[96];
        if (!strcmp(what, "memory"))
            snprintf(amount, sizeof(amount), "%s MiB of sandbox memory", n);
        else if (!strcmp(what, "vcpu"))
            snprintf(amount, sizeof(amount), "%.1f vCPUs", strtod(n, NULL) / 1000.0);
        else
            snprintf(amount, sizeof(amount), "%s sandboxes", n);
        snprintf(text, sizeof(text), "Your team is using its fair share of the platform (at "
                 "most %s across all hosts, shared with other teams). %s.", amount, what_to_do);
        sch_reply_error(c, SF_ERR_LIMIT, text);
    } else if (!strcmp(verdict, "hostshare")) {
        snprintf(text, sizeof(text), "Your team is using its fair share (%s%%) of every worker "
                 "host that has room. %s, or retry when more hosts join.", elem(rep, 1),
                 what_to_do);
        sch_reply_error(c, SF_ERR_LIMIT, text);
    } else if (!strcmp(verdict, "full")) {
        sch_reply_error(c, SF_ERR_UNAVAILABLE,
                        "Every worker host is at capacity. Kill a sandbox, or retry later.");
    } else {
        sch_reply_error(c, SF_ERR_UNAVAILABLE,
                        "No worker host is available right now; retry in a few seconds.");
    }
}

void sch_place_create(sch_call *c)
{
    const sch_cfg *cfg = &c->ctx->cfg;
    json_t *a = c->job.args;
    const char *name = json_string_value(json_object_get(a, "name"));
    const char *tmpl = json_string_value(json_object_get(a, "from_template"));
    json_t *md = json_object_get(a, "metadata");
    char num[8][24], *md_text;
    const char *argv[18];
    int argc = 0, rc;

    if (json_object_get(a, "from_snapshot") && !c->pin[0]) {
        sch_snap_place(c); /* finds the snapshot, then comes back here */
        return;
    }
    md_text = json_is_object(md) ? json_dumps(md, JSON_COMPACT) : NULL;
    snprintf(num[0], 24, "%lld", (long long)sf_now_ms());
    snprintf(num[1], 24, "%lld", (long long)cfg->host_ttl_ms);
    snprintf(num[2], 24, "%lld", (long long)json_integer_value(json_object_get(a, "timeout_seconds")));
    snprintf(num[3], 24, "%lld", (long long)cfg->team_sandbox_limit);
    snprintf(num[4], 24, "%lld", (long long)cfg->team_host_share_pct);
    snprintf(num[5], 24, "%lld", (long long)cfg->team_fleet_share_pct);
    snprintf(num[6], 24, "%lld", (long long)cfg->sandbox_memory_mib);
    snprintf(num[7], 24, "%lld", (long long)cfg->sandbox_vcpu_milli);
    if (c->pin[0]) { /* from a snapshot: its shape is reserved */
        json_t *l = json_object_get(a, "limits");
        if (json_integer_value(json_object_get(l, "memory_mib")) > 0)
            snprintf(num[6], 24, "%lld", (long long)json_integer_value(json_object_get(l, "memory_mib")));
        if (json_integer_value(json_object_get(l, "vcpu_milli")) > 0)
            snprintf(num[7], 24, "%lld", (long long)json_integer_value(json_object_get(l, "vcpu_milli")));
    }
    argv[argc++] = "EVAL";
    argv[argc++] = lua_create;
    argv[argc++] = "0";
    argv[argc++] = num[0];
    argv[argc++] = num[1];
    argv[argc++] = c->job.sandbox;
    argv[argc++] = c->job.team;
    argv[argc++] = name ? name : "";
    argv[argc++] = tmpl ? tmpl : "base";
    argv[argc++] = md_text ? md_text : "{}";
    for (int i = 2; i < 8; i++)
        argv[argc++] = num[i];
    argv[argc++] = c->pin;
    rc = sf_redis_cmdargv(c->ctx->redis, on_create, c, argc, argv, NULL);
    free(md_text);
    if (rc < 0)
        sch_reply_error(c, SF_ERR_UNAVAILABLE, SCH_MSG_REDIS_DOWN);
}
