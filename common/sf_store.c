#include "sf_store.h"

#define S(name, src) sf_redis_script sf_store_##name = SF_REDIS_SCRIPT(src)
#define DEAD "local function dead(st) return st == 'killed' or st == 'failed' or st == 'lost' end\n"

/* ==== a sandbox's record: KEYS[1] = sf:sb:{<id>} ==================================== */

/* Retires it (killed, lost, failed): no metadata, `retired` = now, kept ttl seconds. With
 * only_live ('1'), a record already dead stays as it is and one being killed becomes
 * `killed`. Answers {1, team, host} (retired), {0, team, host} (already dead: the caller
 * still clears its team's and host's entries, which heals a retire cut short), {0} (no
 * record). */
S(rec_retire,
  "#!lua flags=allow-oom\n" DEAD
  "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
  "if not v[1] then return {0} end\n"
  "local state, only = ARGV[3], ARGV[4] == '1'\n"
  "if only and dead(v[3]) then return {0, v[1], v[2] or ''} end\n"
  "if only and v[3] == 'killing' then state = 'killed' end\n"
  "redis.call('HDEL', KEYS[1], 'metadata')\n"
  "redis.call('HSET', KEYS[1], 'state', state, 'retired', ARGV[1])\n"
  "redis.call('EXPIRE', KEYS[1], ARGV[2])\n"
  "return {1, v[1], v[2] or ''}\n");

/* A live record (creating, running, paused) becomes `killing`: {1, team, host}, else {0}. */
S(rec_killing,
  "#!lua flags=allow-oom\n"
  "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
  "if v[3] ~= 'creating' and v[3] ~= 'running' and v[3] ~= 'paused' then return {0} end\n"
  "redis.call('HSET', KEYS[1], 'state', 'killing')\n"
  "return {1, v[1], v[2] or ''}\n");

/* ARGV: the host it runs on, then field, value... state=running plus the fields, only
 * while the record exists, is live and names that host. 1, or 0. */
S(rec_started,
  "#!lua flags=allow-oom\n" DEAD
  "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
  "if not v[1] or dead(v[3]) or (v[2] and v[2] ~= ARGV[1]) then return 0 end\n"
  "redis.call('HSET', KEYS[1], 'state', 'running', unpack(ARGV, 2))\n"
  "return 1\n");

/* ARGV: now. last_active, if the record exists. 1, or 0. */
S(rec_touch,
  "#!lua flags=allow-oom\n"
  "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
  "redis.call('HSET', KEYS[1], 'last_active', ARGV[1])\n"
  "return 1\n");

/* ARGV: field, value, ... set while the record is live. 1, or 0. */
S(rec_set,
  "#!lua\n" DEAD
  "local st = redis.call('HGET', KEYS[1], 'state')\n"
  "if not st or dead(st) then return 0 end\n"
  "redis.call('HSET', KEYS[1], unpack(ARGV))\n"
  "return 1\n");

/* An old tombstone beyond its team's bound: deleted if still dead (not re-used). */
S(rec_drop_dead,
  "#!lua flags=allow-oom\n" DEAD
  "if dead(redis.call('HGET', KEYS[1], 'state')) then return redis.call('DEL', KEYS[1]) end\n"
  "return 0\n");

/* Placement's last step: the record. ARGV: id, team, host, name, template, metadata, now,
 * timeout_s, memory MiB, vCPU milli. A record of the team that is live answers
 * {'ok', its host} (the same create, redelivered); another {'conflict'}; a new one is
 * written `creating`: {'ok', host}. */
S(place_record,
  "#!lua\n" DEAD
  "local old = redis.call('HMGET', KEYS[1], 'team', 'host', 'state')\n"
  "if old[1] then\n"
  "  if old[1] == ARGV[2] and not dead(old[3]) then return {'ok', old[2] or ''} end\n"
  "  return {'conflict'}\n"
  "end\n"
  "redis.call('HSET', KEYS[1], 'id', ARGV[1], 'team', ARGV[2], 'host', ARGV[3], "
  "'state', 'creating', 'name', ARGV[4], 'template', ARGV[5], 'metadata', ARGV[6], "
  "'created', ARGV[7], 'last_active', ARGV[7], 'timeout_seconds', ARGV[8], "
  "'res_mem_mib', ARGV[9], 'res_vcpu_milli', ARGV[10])\n"
  "return {'ok', ARGV[3]}\n");

/* ==== a team: sf:team:{<team>}:* ===================================================== */

/* KEYS: the team's sandboxes, res, retired. ARGV: id, now, ttl (s), keep, tombstone
 * ('1'). The sandbox leaves the team's set and gives back the team's reservation (each
 * at most once: both are keyed by the id); with a tombstone it joins the team's retired
 * list, trimmed to ttl and keep: answers the ids dropped from it (the caller deletes their
 * records), else {}. */
S(team_release,
  "#!lua flags=allow-oom\n"
  "local id = ARGV[1]\n"
  "redis.call('SREM', KEYS[1], id)\n"
  "redis.call('HDEL', KEYS[2], id)\n"
  "if ARGV[5] ~= '1' then return {} end\n"
  "local now, ttl, keep = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
  "redis.call('ZADD', KEYS[3], now, id)\n"
  "redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - ttl * 1000)\n"
  "local out, over = {}, redis.call('ZCARD', KEYS[3]) - keep\n"
  "if over > 0 then\n"
  "  out = redis.call('ZRANGE', KEYS[3], 0, over - 1)\n"
  "  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)\n"
  "end\n"
  "redis.call('PEXPIRE', KEYS[3], ttl * 1000)\n"
  "return out\n");

/* Placement's team step. KEYS: the team's limits, sandboxes, res (id -> "<host> <mem>
 * <vcpu> <disk or ->"), the template's record (sf:team:{t}:tpl:<template>; unused for
 * 'base' and 'debian'). ARGV: id, template, sandbox limit, host share %, fleet share %,
 * memory MiB, vCPU milli, the live hosts as JSON [{h, cap, used, mem, vcpu, rmem, rvcpu,
 * deb, driver, sdeb (its driver runs 'debian')}] (mem, vcpu absent until the worker publishes them), excluded hosts (JSON
 * array: hosts that refused it in this placement), the host it must go to ('' = any: a
 * snapshot's host). The team's own limits override the
 * three defaults. Checks the team's limits and shares, picks the host (the fewest of the
 * team's sandboxes, then the most room; a team template's: one where it is ready;
 * 'debian': a host that has it) and reserves the team's part: {'ok', host, mem, vcpu, disk, new ('1': reserved now,
 * '0': this id held it already: the same host)}, or {'quota', limit}, {'share', what,
 * limit}, {'hostshare', pct}, {'notemplate'}, {'tplstatus', status}, {'pinned'},
 * {'nodebhost'} (no live host's driver runs 'debian'), {'nodebian'}, {'full'}, {'nohost'}. */
S(place_team,
  "#!lua\n"
  "local id, tmpl = ARGV[1], ARGV[2]\n"
  "local mem, vcpu, disk = tonumber(ARGV[6]), tonumber(ARGV[7]), ''\n"
  "local held = redis.call('HGET', KEYS[3], id)\n"
  "if held then\n"
  "  local h, m, c, d = string.match(held, '^(%S+) (%d+) (%d+) (%S+)$')\n"
  "  if h then return {'ok', h, m, c, d == '-' and '' or d, '0'} end\n"
  "end\n"
  "local lim = redis.call('HMGET', KEYS[1], 'sandboxes', 'host_share_pct', 'fleet_share_pct')\n"
  "local limit = tonumber(lim[1]) or tonumber(ARGV[3])\n"
  "local hshare = tonumber(lim[2]) or tonumber(ARGV[4])\n"
  "local fshare = tonumber(lim[3]) or tonumber(ARGV[5])\n"
  "local tn, tmem, tvcpu, per = 0, 0, 0, {}\n"
  "local all = redis.call('HGETALL', KEYS[3])\n"
  "for i = 1, #all, 2 do\n"
  "  local h, m, c = string.match(all[i + 1], '^(%S+) (%d+) (%d+)')\n"
  "  if h then\n"
  "    tn, tmem, tvcpu = tn + 1, tmem + tonumber(m), tvcpu + tonumber(c)\n"
  "    local p = per[h] or {0, 0, 0}\n"
  "    p[1], p[2], p[3] = p[1] + 1, p[2] + tonumber(m), p[3] + tonumber(c)\n"
  "    per[h] = p\n"
  "  end\n"
  "end\n"
  "tn = math.max(redis.call('SCARD', KEYS[2]), tn)\n"
  "if tn >= limit then return {'quota', tostring(limit)} end\n"
  /* a team template: its shape, and the hosts where it is ready (at:<host>; a record from
   * before templates were built on several hosts: its one host); 'debian': a host that
   * has it */
  "local pin, needdeb, tkey = nil, tmpl == 'debian', nil\n"
  "if tmpl ~= 'base' and tmpl ~= 'debian' then\n"
  "  tkey = KEYS[4]\n"
  "  local t = redis.call('HMGET', tkey, 'status', 'host', 'memory_mib', 'vcpu_milli', "
  "'disk_mib')\n"
  "  if not t[1] then return {'notemplate'} end\n"
  "  if t[1] ~= 'ready' then return {'tplstatus', t[1]} end\n"
  "  mem, vcpu, disk = tonumber(t[3]) or mem, tonumber(t[4]) or vcpu, t[5] or ''\n"
  "  if redis.call('HEXISTS', tkey, 'at:' .. (t[2] or '')) == 0 then pin = t[2] end\n"
  "end\n"
  "if ARGV[10] and ARGV[10] ~= '' then pin = ARGV[10] end\n" /* from a snapshot: the host that holds it */
  "local function holds(h)\n"
  "  if pin then return h == pin end\n"
  "  return not tkey or redis.call('HGET', tkey, 'at:' .. h) == 'ready'\n"
  "end\n"
  "local live, skip = cjson.decode(ARGV[8]), {}\n"
  "for _, h in ipairs(cjson.decode(ARGV[9])) do skip[h] = true end\n"
  "if #live == 0 then return {'nohost'} end\n"
  "local hosts, fn, fmem, fvcpu, allmem, allvcpu, anydeb = {}, 0, 0, 0, true, true, false\n"
  "for _, e in ipairs(live) do\n"
  "  if e.sdeb then anydeb = true end\n"
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
  "  if not holds(e.h) or (needdeb and not (e.deb and e.sdeb)) or skip[e.h] then\n"
  "  elseif e.used < e.cap and (not e.mem or e.rmem + mem <= e.mem) and\n"
  "     (not e.vcpu or e.rvcpu + vcpu <= e.vcpu) then\n"
  "    fits = true\n"
  "    local p = per[e.h] or {0, 0, 0}\n"
  "    local n, m, c = p[1], p[2], p[3]\n"
  "    if n == 0 or (not over(n, 1, e.cap, hshare) and\n"
  "        (not e.mem or not over(m, mem, e.mem, hshare)) and\n"
  "        (not e.vcpu or not over(c, vcpu, e.vcpu, hshare))) then\n"
  "      local free = (e.cap - e.used) / e.cap\n"
  "      if e.mem and e.mem > 0 then free = math.min(free, (e.mem - e.rmem) / e.mem) end\n"
  "      if e.vcpu and e.vcpu > 0 then free = math.min(free, (e.vcpu - e.rvcpu) / e.vcpu) end\n"
  "      if not best or n < bn or (n == bn and free > bfree) then best, bn, bfree = e, n, free end\n"
  "    end\n"
  "  end\n"
  "end\n"
  "if not best then\n"
  "  if (pin or tkey) and not fits then return {'pinned'} end\n"
  "  if needdeb and not anydeb then return {'nodebhost'} end\n"
  "  if needdeb and not fits then return {'nodebian'} end\n"
  "  if fits then return {'hostshare', tostring(hshare)} end\n"
  "  return {'full'}\n"
  "end\n"
  "redis.call('HSET', KEYS[3], id, string.format('%s %d %d %s', best.h, mem, vcpu, "
  "disk == '' and '-' or disk))\n"
  "redis.call('SADD', KEYS[2], id)\n"
  "return {'ok', best.h, tostring(mem), tostring(vcpu), disk, '1'}\n");

/* ==== a host: sf:host:{<host>}* ====================================================== */

/* KEYS: the host's res, sandboxes, timers. ARGV: id. The sandbox leaves the host: its
 * reservation (once: keyed by the id), its set, its timers. 1 when a reservation went. */
S(host_release,
  "#!lua flags=allow-oom\n"
  "local id = ARGV[1]\n"
  "local n = redis.call('HDEL', KEYS[1], id)\n"
  "redis.call('SREM', KEYS[2], id)\n"
  "redis.call('ZREM', KEYS[3], 't:' .. id, 'i:' .. id, 'd:' .. id)\n"
  "return n\n");

/* KEYS: the host's hash, res. What placement reads of a host: {capacity, running, mem_mib,
 * vcpu_milli, tpl_debian, driver, ts ('' when absent), reserved count, MiB, vCPU milli,
 * disk_mib ('' when absent), caps ('' when absent: a worker from before them)}. */
S(host_view,
  "#!lua flags=no-writes\n"
  "local v = redis.call('HMGET', KEYS[1], 'capacity', 'running', 'mem_mib', 'vcpu_milli', "
  "'tpl_debian', 'driver', 'ts', 'disk_mib', 'caps')\n"
  "local n, m, c = 0, 0, 0\n"
  "for _, e in ipairs(redis.call('HVALS', KEYS[2])) do\n"
  "  local a, b = string.match(e, '^(%d+) (%d+)')\n"
  "  if a then n, m, c = n + 1, m + tonumber(a), c + tonumber(b) end\n"
  "end\n"
  "for i = 1, 9 do v[i] = v[i] or '' end\n"
  "return {v[1], v[2], v[3], v[4], v[5], v[6], v[7], n, m, c, v[8], v[9]}\n");

/* Placement's host step. KEYS: the host's hash, res, sandboxes. ARGV: id, memory MiB,
 * vCPU milli, now, host_ttl. Re-checks what placement read: the host is live and the
 * sandbox fits; then reserves it there. {'ok', '1'} (reserved now), {'ok', '0'} (this id
 * held it already), {'again'} (it no longer fits or the host went silent). */
S(place_host,
  "#!lua\n"
  "local id, mem, vcpu = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])\n"
  "if redis.call('HEXISTS', KEYS[2], id) == 1 then return {'ok', '0'} end\n"
  "local v = redis.call('HMGET', KEYS[1], 'capacity', 'running', 'mem_mib', 'vcpu_milli', 'ts')\n"
  "local ts = tonumber(v[5])\n"
  "if not ts or ts < tonumber(ARGV[4]) - tonumber(ARGV[5]) then return {'again'} end\n"
  "local n, m, c = 0, 0, 0\n"
  "for _, e in ipairs(redis.call('HVALS', KEYS[2])) do\n"
  "  local a, b = string.match(e, '^(%d+) (%d+)')\n"
  "  if a then n, m, c = n + 1, m + tonumber(a), c + tonumber(b) end\n"
  "end\n"
  "if math.max(n, tonumber(v[2]) or 0) >= (tonumber(v[1]) or 0) or\n"
  "   (v[3] and m + mem > tonumber(v[3])) or (v[4] and c + vcpu > tonumber(v[4])) then\n"
  "  return {'again'}\n"
  "end\n"
  "redis.call('HSET', KEYS[2], id, string.format('%d %d', mem, vcpu))\n"
  "redis.call('SADD', KEYS[3], id)\n"
  "return {'ok', '1'}\n");

/* KEYS: the host's hash. ARGV: expire (ms), field, value... The worker's fields (never
 * res_*: checked by the caller) and the hash's expiry. */
S(host_beat,
  "#!lua flags=allow-oom\n"
  "if #ARGV > 1 then redis.call('HSET', KEYS[1], unpack(ARGV, 2)) end\n"
  "redis.call('PEXPIRE', KEYS[1], ARGV[1])\n"
  "return 1\n");

/* KEYS: sf:hosts. ARGV: host, now (ms). The host's last heartbeat (lands when Redis is
 * full: a full Redis must not make a live host look dead). */
S(hosts_beat,
  "#!lua flags=allow-oom\n"
  "return redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])\n");

/* KEYS: sf:hosts. ARGV: host, cutoff (ms). The host leaves the live hosts if its last
 * heartbeat is still older than cutoff: 1, else 0 (it came back). */
S(hosts_drop,
  "#!lua flags=allow-oom\n"
  "local ts = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))\n"
  "if not ts or ts >= tonumber(ARGV[2]) then return 0 end\n"
  "return redis.call('ZREM', KEYS[1], ARGV[1])\n");

/* ==== lifecycle timers: the record (KEYS[1]), then the host's timers ================= */

/* ARGV: now, timeout_at, lifetime_at, idle_ms, auto_delete_s. While it starts or runs, the
 * record's fields: 1 (the caller then sets t: and i:), else 0. A new sandbox's fields need
 * room: not allow-oom. */
S(tm_start,
  "#!lua\n"
  "local st = redis.call('HGET', KEYS[1], 'state')\n"
  "if st ~= 'running' and st ~= 'creating' then return 0 end\n"
  "local ad = tonumber(ARGV[5])\n"
  "redis.call('HSET', KEYS[1], 'timeout_at', ARGV[2], 'lifetime_at', ARGV[3], 'idle_ms', ARGV[4])\n"
  "if ad > 0 then redis.call('HSET', KEYS[1], 'auto_delete_seconds', ad) end\n"
  "return 1\n");

/* ARGV: now. running -> paused (paused_at): {1, auto_delete_seconds or 0}, else {0}. */
S(tm_paused,
  "#!lua flags=allow-oom\n"
  "if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return {0} end\n"
  "redis.call('HSET', KEYS[1], 'state', 'paused', 'paused_at', ARGV[1])\n"
  "return {1, tonumber(redis.call('HGET', KEYS[1], 'auto_delete_seconds') or '0') or 0}\n");

/* paused -> running: {1, idle_ms or 0}, else {0}. */
S(tm_resumed,
  "#!lua flags=allow-oom\n"
  "if redis.call('HGET', KEYS[1], 'state') ~= 'paused' then return {0} end\n"
  "redis.call('HSET', KEYS[1], 'state', 'running')\n"
  "redis.call('HDEL', KEYS[1], 'paused_at')\n"
  "return {1, tonumber(redis.call('HGET', KEYS[1], 'idle_ms') or '0') or 0}\n");

/* sandbox_update's record part. ARGV: id, team, now, set metadata (1/0), metadata, timeout
 * (s, -1 keep, -2 reset), auto_delete (s, -1 keep, 0 none). Answers {verdict, state, host,
 * then the timer changes for the host's timers as (op, member, score) triples: 'a' add,
 * 'r' remove}. verdict: 'ok', 'none' (no such sandbox of the team), 'starting', 'dead'. */
S(tm_update,
  "#!lua flags=allow-oom\n"
  "local id, now = ARGV[1], tonumber(ARGV[3])\n"
  "local v = redis.call('HMGET', KEYS[1], 'team', 'host', 'state', 'lifetime_at', "
  "'paused_at')\n"
  "if not v[1] or v[1] ~= ARGV[2] then return {'none', ''} end\n"
  "local st = v[3] or ''\n"
  "if st == 'creating' or not v[2] then return {'starting', st} end\n"
  "if st ~= 'running' and st ~= 'paused' then return {'dead', st} end\n"
  "local out = {'ok', st, v[2]}\n"
  "local function op(o, m, s) table.insert(out, o) table.insert(out, m) "
  "table.insert(out, tostring(s)) end\n"
  "if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'metadata', ARGV[5]) end\n"
  "local t, ad = tonumber(ARGV[6]), tonumber(ARGV[7])\n"
  "if t == -2 then\n"
  "  redis.call('HDEL', KEYS[1], 'timeout_seconds')\n"
  "  local at = tonumber(v[4])\n"
  "  if at then\n"
  "    redis.call('HSET', KEYS[1], 'timeout_at', at)\n"
  "    op('a', 't:' .. id, at)\n"
  "  end\n"
  "elseif t > 0 then\n"
  "  redis.call('HSET', KEYS[1], 'timeout_seconds', t, 'timeout_at', now + t * 1000)\n"
  "  op('a', 't:' .. id, now + t * 1000)\n"
  "end\n"
  "if ad == 0 then\n"
  "  redis.call('HDEL', KEYS[1], 'auto_delete_seconds')\n"
  "  op('r', 'd:' .. id, 0)\n"
  "elseif ad > 0 then\n"
  "  redis.call('HSET', KEYS[1], 'auto_delete_seconds', ad)\n"
  "  if st == 'paused' and tonumber(v[5]) then op('a', 'd:' .. id, tonumber(v[5]) + ad * 1000) end\n"
  "end\n"
  "return out\n");

/* KEYS: the host's timers. ARGV: (op, member, score) triples: 'a' add, 'x' move one that
 * is there (ZADD XX), 'r' remove. Answers how many members changed. */
#define TIMERS_SET                                                                             \
    "local n = 0\n"                                                                            \
    "for i = 1, #ARGV, 3 do\n"                                                                 \
    "  local o, m, s = ARGV[i], ARGV[i + 1], ARGV[i + 2]\n"                                    \
    "  if o == 'r' then n = n + redis.call('ZREM', KEYS[1], m)\n"                              \
    "  elseif o == 'x' then n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', s, m)\n"           \
    "  else n = n + redis.call('ZADD', KEYS[1], 'CH', s, m) end\n"                             \
    "end\n"                                                                                    \
    "return n\n"
S(timers_set, "#!lua flags=allow-oom\n" TIMERS_SET);
S(timers_grow, "#!lua\n" TIMERS_SET);

/* KEYS: the host's timers. ARGV: now, max. Pops what is due (each fires once). */
S(timers_due,
  "#!lua flags=allow-oom\n"
  "local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, "
  "tonumber(ARGV[2]))\n"
  "if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end\n"
  "return due\n");

/* ==== claim checks: KEYS = the team's claims (zset), their sizes (hash), the claim ==== */

/* ARGV: data, now ms, ttl ms, budget. Expired claims leave the budget first; the
 * bookkeeping keys live as long as their newest claim could. {'ok', used} or
 * {'over', used}. Not allow-oom: a full Redis refuses it whole. */
S(claim_put,
  "#!lua\n"
  "local now, ttl, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
  "local n = string.len(ARGV[1])\n"
  "for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do\n"
  "  redis.call('HDEL', KEYS[2], k)\n"
  "end\n"
  "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
  "local used = 0\n"
  "for _, v in ipairs(redis.call('HVALS', KEYS[2])) do used = used + tonumber(v) end\n"
  "used = used - (tonumber(redis.call('HGET', KEYS[2], KEYS[3])) or 0)\n"
  "if used + n > budget then return {'over', used} end\n"
  "redis.call('SET', KEYS[3], ARGV[1], 'PX', ttl)\n"
  "redis.call('ZADD', KEYS[1], now + ttl, KEYS[3])\n"
  "redis.call('HSET', KEYS[2], KEYS[3], n)\n"
  "redis.call('PEXPIRE', KEYS[1], ttl)\n"
  "redis.call('PEXPIRE', KEYS[2], ttl)\n"
  "return {'ok', used + n}\n");

/* Takes (reads and deletes) the claim: its bytes or nil. Frees: allow-oom. */
S(claim_take,
  "#!lua flags=allow-oom\n"
  "local v = redis.call('GET', KEYS[3])\n"
  "redis.call('DEL', KEYS[3])\n"
  "redis.call('ZREM', KEYS[1], KEYS[3])\n"
  "redis.call('HDEL', KEYS[2], KEYS[3])\n"
  "return v\n");

/* ==== secrets: KEYS[1] sf:team:{t}:secret:<name>, KEYS[2] sf:team:{t}:secrets ========= */

/* ARGV: name, team, sealed value, hosts, header, format, now, version, the team's most,
 * any_header ('1'/'0'), allow_http ('1'/'0'). 1 created, 0 exists, -1 the team holds the
 * most. */
S(secret_create,
  "#!lua\n"
  "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end\n"
  "if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[9]) then return -1 end\n"
  "redis.call('HSET', KEYS[1], 'name', ARGV[1], 'team', ARGV[2], 'value', ARGV[3], "
  "'hosts', ARGV[4], 'header', ARGV[5], 'format', ARGV[6], 'created', ARGV[7], "
  "'updated', ARGV[7], 'version', ARGV[8], 'any_header', ARGV[10], 'allow_http', ARGV[11])\n"
  "redis.call('SADD', KEYS[2], ARGV[1])\n"
  "return 1\n");

/* ARGV: sealed value, now, hosts ('' keeps them). The new version, or 0 (none). */
S(secret_rotate,
  "#!lua\n"
  "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
  "redis.call('HSET', KEYS[1], 'value', ARGV[1], 'updated', ARGV[2])\n"
  "if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'hosts', ARGV[3]) end\n"
  "return redis.call('HINCRBY', KEYS[1], 'version', 1)\n");

/* ARGV: name. 1 deleted, 0 none. */
S(secret_delete,
  "#!lua flags=allow-oom\n"
  "local n = redis.call('DEL', KEYS[1])\n"
  "redis.call('SREM', KEYS[2], ARGV[1])\n"
  "return n\n");

/* ==== MCP sessions ==================================================================== */

/* KEYS: sf:mcpsess:{<sid>}. ARGV: team, protocol, now, ttl (s). A new session: 1. Not
 * allow-oom: a full Redis refuses it. */
S(sess_put,
  "#!lua\n"
  "redis.call('HSET', KEYS[1], 'team', ARGV[1], 'protocol', ARGV[2], 'created', ARGV[3])\n"
  "redis.call('EXPIRE', KEYS[1], ARGV[4])\n"
  "return 1\n");

/* KEYS: sf:team:{<team>}:sessions. ARGV: sid, now, ttl (s), the team's most. The new
 * session joins the team's; expired ones leave, and the least recently used beyond the
 * limit: answers their ids (the caller deletes their sessions). */
S(sess_team,
  "#!lua flags=allow-oom\n"
  "local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])\n"
  "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl * 1000)\n"
  "local over, out = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4]) + 1, {}\n"
  "if over > 0 then\n"
  "  out = redis.call('ZRANGE', KEYS[1], 0, over - 1)\n"
  "  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)\n"
  "end\n"
  "redis.call('ZADD', KEYS[1], now, ARGV[1])\n"
  "redis.call('PEXPIRE', KEYS[1], ttl * 1000)\n"
  "return out\n");

/* ==== team templates: sf:team:{<team>}:tpl:* ========================================= */

/* KEYS: the template, its log, the team's names, the `from` template (unused for 'base'
 * and 'debian'). ARGV: team, name, from, job, now, vcpu_milli, memory_mib, disk_mib,
 * run_steps (JSON), start_cmd, ready_cmd, the team's most, the live hosts as JSON [{h,
 * driver, cap, running, deb}]. A team template is built on every live jail host that can
 * (one with 'debian' when from is debian; one where `from` is ready when it is a team
 * template): each holds its own copy, and placement uses the hosts that have it ready
 * (at:<host> = building for each). The lead (the host with the most room) writes the step
 * and the log. {'ok', start, ready, lead, host...}, {'exists', status}, {'quota', n},
 * {'nofrom'}, {'fromstatus', status}, {'pinned'}, {'nodebian'}, {'nohost'}. */
S(tpl_create,
  "#!lua\n"
  "local team, name, from, job, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]\n"
  "local old = redis.call('HMGET', KEYS[1], 'status', 'job', 'host', 'start_cmd', 'ready_cmd')\n"
  "if old[1] then\n"
  "  if old[2] == job then\n" /* the same call, redelivered: to the same hosts again */
  "    local out = {'ok', old[4] or '', old[5] or '', old[3]}\n"
  "    local h = redis.call('HGETALL', KEYS[1])\n"
  "    for i = 1, #h, 2 do\n"
  "      local at = string.sub(h[i], 1, 3) == 'at:' and string.sub(h[i], 4)\n"
  "      if at and at ~= old[3] then table.insert(out, at) end\n"
  "    end\n"
  "    return out\n"
  "  end\n"
  "  if old[1] ~= 'failed' then return {'exists', old[1]} end\n"
  "elseif redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[12]) then\n"
  "  return {'quota', ARGV[12]}\n"
  "end\n"
  "local fkey, fhost, start, ready = nil, nil, ARGV[10], ARGV[11]\n"
  "if from ~= 'base' and from ~= 'debian' then\n"
  "  fkey = KEYS[4]\n"
  "  local f = redis.call('HMGET', fkey, 'status', 'host', 'start_cmd', 'ready_cmd')\n"
  "  if not f[1] then return {'nofrom'} end\n"
  "  if f[1] ~= 'ready' then return {'fromstatus', f[1]} end\n"
  /* a record from before templates were on several hosts: on its host only */
  "  if redis.call('HEXISTS', fkey, 'at:' .. (f[2] or '')) == 0 then fhost = f[2] end\n"
  /* its service is inherited unless the new template names its own */
  "  if start == '' and ready == '' then start, ready = f[3] or '', f[4] or '' end\n"
  "end\n"
  "local hosts, best, bfree, deb = {}, nil, -1, false\n"
  "for _, e in ipairs(cjson.decode(ARGV[13])) do\n"
  "  local h = e.h\n"
  "  local ok = e.driver == 'jail'\n"
  "  if ok and fkey then\n"
  "    ok = (fhost and fhost == h) or (not fhost and redis.call('HGET', fkey, 'at:' .. h) == 'ready')\n"
  "  end\n"
  "  if ok and from == 'debian' and not e.deb then ok, deb = false, true end\n"
  "  if ok then\n"
  "    table.insert(hosts, h)\n"
  "    local free = e.cap - e.running\n"
  "    if free > bfree then best, bfree = h, free end\n"
  "  end\n"
  "end\n"
  "if not best then\n"
  "  if fkey then return {'pinned'} end\n"
  "  if deb then return {'nodebian'} end\n"
  "  return {'nohost'}\n"
  "end\n"
  "redis.call('DEL', KEYS[1], KEYS[2])\n"
  "redis.call('HSET', KEYS[1], 'name', name, 'team', team, 'from', from, 'status', "
  "'building', 'host', best, 'job', job, 'created', now, 'updated', now, 'vcpu_milli', "
  "ARGV[6], 'memory_mib', ARGV[7], 'disk_mib', ARGV[8], 'run_steps', ARGV[9], 'start_cmd', "
  "start, 'ready_cmd', ready)\n"
  "local out = {'ok', start, ready, best}\n"
  "for _, h in ipairs(hosts) do\n"
  "  redis.call('HSET', KEYS[1], 'at:' .. h, 'building')\n"
  "  if h ~= best then table.insert(out, h) end\n"
  "end\n"
  "redis.call('SADD', KEYS[3], name)\n"
  "return out\n");

/* KEYS: a team template. Its row for sandbox_template_list: {status, from, vcpu_milli,
 * memory_mib, disk_mib, failed_step, error, created, updated, step, hosts it was built
 * on, hosts where it is ready}, or {} when it is gone. */
S(tpl_row,
  "#!lua flags=no-writes\n"
  "local v = redis.call('HMGET', KEYS[1], 'status', 'from', 'vcpu_milli', 'memory_mib', "
  "'disk_mib', 'failed_step', 'error', 'created', 'updated', 'step')\n"
  "if not v[1] then return {} end\n"
  "local nh, nr = 0, 0\n"
  "local h = redis.call('HGETALL', KEYS[1])\n"
  "for i = 1, #h, 2 do\n"
  "  if string.sub(h[i], 1, 3) == 'at:' then\n"
  "    nh = nh + 1\n"
  "    if h[i + 1] == 'ready' then nr = nr + 1 end\n"
  "  end\n"
  "end\n"
  "if nh == 0 then nh = 1; if v[1] == 'ready' then nr = 1 end end\n"
  "local out = {}\n"
  "for i = 1, 10 do out[i] = v[i] or '' end\n"
  "out[11], out[12] = tostring(nh), tostring(nr)\n"
  "return out\n");

/* A build's writes (worker/tpl_build.c): the record and log are the build's only while
 * the record's job is its own, so a deleted template (or one built again under its name)
 * is never written by an old build. */

/* KEYS: a team template. ARGV: job, field, value, now. 1, or 0 (not that job's). */
S(tpl_set,
  "#!lua flags=allow-oom\n"
  "if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return 0 end\n"
  "redis.call('HSET', KEYS[1], ARGV[2], ARGV[3], 'updated', ARGV[4])\n"
  "return 1\n");

/* KEYS: a team template, its log. ARGV: job, text, max bytes. Appended while the log stays
 * within max bytes: its length, or 0. */
S(tpl_log,
  "#!lua\n"
  "if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return 0 end\n"
  "if redis.call('STRLEN', KEYS[2]) + #ARGV[2] > tonumber(ARGV[3]) then return 0 end\n"
  "return redis.call('APPEND', KEYS[2], ARGV[2])\n");

/* A template's status from every host's at:<host>: ready once a host has it, failed once
 * every host failed, else building. */
#define TPL_STATUS                                                                            \
    "local function tpl_status(k)\n"                                                          \
    "  local ready, failed, n = false, 0, 0\n"                                                \
    "  local h = redis.call('HGETALL', k)\n"                                                  \
    "  for i = 1, #h, 2 do\n"                                                                 \
    "    if string.sub(h[i], 1, 3) == 'at:' then\n"                                           \
    "      n = n + 1\n"                                                                       \
    "      if h[i + 1] == 'ready' then ready = true end\n"                                    \
    "      if h[i + 1] == 'failed' then failed = failed + 1 end\n"                            \
    "    end\n"                                                                               \
    "  end\n"                                                                                 \
    "  local st = 'building'\n"                                                               \
    "  if ready then st = 'ready' elseif failed == n then st = 'failed' end\n"                \
    "  redis.call('HSET', k, 'status', st)\n"                                                 \
    "  return st\n"                                                                           \
    "end\n"

/* KEYS: a team template. ARGV: job, host, ready|failed, error, failed_step, now, lead
 * (1/0). The host's at:<host> (and err:<host>); the status follows from every host's:
 * ready once a host has it, failed once every host failed (the lead's error first), else
 * building; left alone while a delete runs (deleting). 1, or 0 (not that job's). */
S(tpl_done,
  "#!lua flags=allow-oom\n" TPL_STATUS
  "local v = redis.call('HMGET', KEYS[1], 'job', 'status', 'error')\n"
  "if v[1] ~= ARGV[1] then return 0 end\n"
  "redis.call('HSET', KEYS[1], 'at:' .. ARGV[2], ARGV[3], 'updated', ARGV[6])\n"
  "if ARGV[3] == 'failed' then\n"
  "  redis.call('HSET', KEYS[1], 'err:' .. ARGV[2], ARGV[4])\n"
  "  if ARGV[7] == '1' or not v[3] then\n"
  "    redis.call('HSET', KEYS[1], 'error', ARGV[4], 'failed_step', ARGV[5])\n"
  "  end\n"
  "end\n"
  "if v[2] == 'deleting' then return 1 end\n"
  "tpl_status(KEYS[1])\n"
  "return 1\n");

/* KEYS: a team template, its `from` template (a key of the team's that does not exist when
 * from is a built-in). ARGV: host, deb ('1': the host has 'debian'), from. A host that
 * joined later: the template, ready, not at that host yet and built for several hosts (a
 * record with at:<host> fields), whose `from` is at that host (debian: the host has it; a
 * team template: ready there), becomes `building` there: {'build', job, run_steps,
 * start_cmd, ready_cmd, vcpu_milli, memory_mib, disk_mib}; else {'no'}. */
S(tpl_join,
  "#!lua\n"
  "local v = redis.call('HMGET', KEYS[1], 'status', 'job', 'from', 'run_steps', 'start_cmd', "
  "'ready_cmd', 'vcpu_milli', 'memory_mib', 'disk_mib')\n"
  "if v[1] ~= 'ready' or not v[2] or v[3] ~= ARGV[3] then return {'no'} end\n"
  "local at = 'at:' .. ARGV[1]\n"
  "if redis.call('HEXISTS', KEYS[1], at) == 1 then return {'no'} end\n"
  "local multi = false\n"
  "for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do\n"
  "  if string.sub(f, 1, 3) == 'at:' then multi = true end\n"
  "end\n"
  "if not multi then return {'no'} end\n"
  "if v[3] == 'debian' then\n"
  "  if ARGV[2] ~= '1' then return {'no'} end\n"
  "elseif v[3] ~= 'base' and redis.call('HGET', KEYS[2], at) ~= 'ready' then\n"
  "  return {'no'}\n"
  "end\n"
  "redis.call('HSET', KEYS[1], at, 'building')\n"
  "return {'build', v[2], v[4] or '[]', v[5] or '', v[6] or '', v[7] or '', v[8] or '', "
  "v[9] or ''}\n");

/* KEYS: a team template[, the team's res]. ARGV: host, why, now[, the template's name].
 * The host went down (the reaper): the build's part of the team's share there goes
 * (tb:<name>@<host>, worker/tpl_build.c); a build still `building` there is `failed` with
 * why (err:<host>; the template's error too when it has none), the status from every
 * host's as for tpl_done (left alone while a delete runs). 1, or 0 when it was not
 * building there. */
S(tpl_host_lost,
  "#!lua flags=allow-oom\n" TPL_STATUS
  "if KEYS[2] then redis.call('HDEL', KEYS[2], 'tb:' .. ARGV[4] .. '@' .. ARGV[1]) end\n"
  "local at = 'at:' .. ARGV[1]\n"
  "if redis.call('HGET', KEYS[1], at) ~= 'building' then return 0 end\n"
  "redis.call('HSET', KEYS[1], at, 'failed', 'err:' .. ARGV[1], ARGV[2], 'updated', ARGV[3])\n"
  "if not redis.call('HGET', KEYS[1], 'error') then redis.call('HSET', KEYS[1], 'error', ARGV[2]) end\n"
  "if redis.call('HGET', KEYS[1], 'status') ~= 'deleting' then tpl_status(KEYS[1]) end\n"
  "return 1\n");

/* KEYS: a team template. ARGV: the delete's job. Marks it `deleting` (no new sandbox or
 * build uses it from now on), its status before kept in `before`. 'none' or 'ok'. */
S(tpl_del_mark,
  "#!lua flags=allow-oom\n"
  "local st = redis.call('HGET', KEYS[1], 'status')\n"
  "if not st then return 'none' end\n"
  "if st ~= 'deleting' then\n"
  "  redis.call('HSET', KEYS[1], 'status', 'deleting', 'before', st, 'deljob', ARGV[1])\n"
  "end\n"
  "return 'ok'\n");

/* KEYS: a team template. ARGV: the delete's job. The delete was refused: the status it had
 * again (ready when a host has it ready: a build that ended meanwhile counts). 1, or 0
 * when it is not that delete's. */
S(tpl_del_undo,
  "#!lua flags=allow-oom\n"
  "local v = redis.call('HMGET', KEYS[1], 'status', 'deljob', 'before')\n"
  "if v[1] ~= 'deleting' or v[2] ~= ARGV[1] then return 0 end\n"
  "local st = v[3] or 'ready'\n"
  "local h = redis.call('HGETALL', KEYS[1])\n"
  "for i = 1, #h, 2 do\n"
  "  if string.sub(h[i], 1, 3) == 'at:' and h[i + 1] == 'ready' then st = 'ready' end\n"
  "end\n"
  "redis.call('HSET', KEYS[1], 'status', st)\n"
  "redis.call('HDEL', KEYS[1], 'before', 'deljob')\n"
  "return 1\n");

/* KEYS: a team template, its log, the team's :tpls. ARGV: its name. Deletes them; answers
 * the hosts that hold (or were building) it. */
S(tpl_del,
  "#!lua flags=allow-oom\n"
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
  "return hosts\n");

/* ==== a team's snapshots: sf:team:{<team>}:snaps, :snap:<name> (common/sf_snapshots.c) ===
 * The scripts that look at every snapshot of the team (its count, the bytes they hold,
 * one found by id) get every record declared: KEYS[1] is the team's :snaps, then records
 * (the call's own first, then one per member of :snaps as the caller read it). A member
 * whose record was not declared (the set changed since it was read) answers {'again'}:
 * the caller reads the set again. SNAPS maps each declared record's name to its key (the
 * name from the key, never a key from a name), names = the members. */
#define SNAPS                                                                                 \
    "local pre = string.sub(KEYS[1], 1, #KEYS[1] - 5) .. 'snap:'\n"                           \
    "local rk = {}\n"                                                                         \
    "for i = 2, #KEYS do\n"                                                                   \
    "  if string.sub(KEYS[i], 1, #pre) == pre then rk[string.sub(KEYS[i], #pre + 1)] = KEYS[i] end\n" \
    "end\n"                                                                                   \
    "local names = redis.call('SMEMBERS', KEYS[1])\n"                                         \
    "for _, n in ipairs(names) do if not rk[n] then return {'again'} end end\n"               \
    "local function used(skip)\n"                                                             \
    "  local sum = 0\n"                                                                       \
    "  for _, n in ipairs(names) do\n"                                                        \
    "    if n ~= skip then sum = sum + (tonumber(redis.call('HGET', rk[n], 'size')) or 0) end\n" \
    "  end\n"                                                                                 \
    "  return sum\n"                                                                          \
    "end\n"                                                                                   \
    "local function find(ref)\n"                                                              \
    "  if rk[ref] and redis.call('SISMEMBER', KEYS[1], ref) == 1 then return ref end\n"       \
    "  for _, n in ipairs(names) do\n"                                                        \
    "    if redis.call('HGET', rk[n], 'id') == ref then return n end\n"                       \
    "  end\n"                                                                                 \
    "  return nil\n"                                                                          \
    "end\n"

/* KEYS: :snaps, the new record, the members' records. ARGV: max count, max bytes, then
 * the record's field/value pairs. Refused unless the name is free and the team holds fewer
 * than max count snapshots of less than max bytes: {'ok'}, {'taken'}, {'count'},
 * {'bytes'}. */
S(snap_reserve,
  "#!lua\n" SNAPS
  "if redis.call('EXISTS', KEYS[2]) == 1 then return {'taken'} end\n"
  "if #names >= tonumber(ARGV[1]) then return {'count'} end\n"
  "if used('') >= tonumber(ARGV[2]) then return {'bytes'} end\n"
  "redis.call('HSET', KEYS[2], unpack(ARGV, 3))\n"
  "redis.call('SADD', KEYS[1], string.sub(KEYS[2], #pre + 1))\n"
  "return {'ok'}\n");

/* KEYS: :snaps, the record, the members' records. ARGV: id, size, max bytes, now. Taken:
 * `ready` with its size, unless the team would then hold more than max bytes (the record
 * goes): {'ok'}, {'bytes'}, {'gone'} (it is not id's any more). */
S(snap_finish,
  "#!lua flags=allow-oom\n" SNAPS
  "if redis.call('HGET', KEYS[2], 'id') ~= ARGV[1] then return {'gone'} end\n"
  "local name = string.sub(KEYS[2], #pre + 1)\n"
  "if used(name) + tonumber(ARGV[2]) > tonumber(ARGV[3]) then\n"
  "  redis.call('DEL', KEYS[2])\n"
  "  redis.call('SREM', KEYS[1], name)\n"
  "  return {'bytes'}\n"
  "end\n"
  "redis.call('HSET', KEYS[2], 'status', 'ready', 'size', ARGV[2], 'ready_at', ARGV[4])\n"
  "return {'ok'}\n");

/* KEYS: :snaps and the members' records. ARGV: a name or an id. Its fields (HGETALL), or
 * {} when the team has none such. */
S(snap_find,
  "#!lua flags=no-writes\n" SNAPS
  "local n = find(ARGV[1])\n"
  "if not n then return {} end\n"
  "return redis.call('HGETALL', rk[n])\n");

/* KEYS: :snaps and the members' records. Each record's fields (HGETALL), by name. */
S(snap_list,
  "#!lua flags=no-writes\n" SNAPS
  "table.sort(names)\n"
  "local out = {}\n"
  "for _, n in ipairs(names) do table.insert(out, redis.call('HGETALL', rk[n])) end\n"
  "return out\n");

/* KEYS: :snaps and the members' records. ARGV: a name or an id. Deletes it unless it is
 * being taken: {'ok', id, name, host}, {'none'}, {'taking'}. */
S(snap_delete,
  "#!lua flags=allow-oom\n" SNAPS
  "local n = find(ARGV[1])\n"
  "if not n then return {'none'} end\n"
  "local v = redis.call('HMGET', rk[n], 'id', 'status', 'host')\n"
  "if v[2] == 'taking' then return {'taking'} end\n"
  "redis.call('DEL', rk[n])\n"
  "redis.call('SREM', KEYS[1], n)\n"
  "return {'ok', v[1] or '', n, v[3] or ''}\n");

/* KEYS: the record, :snaps. ARGV: id, name. The record goes if it is still id's: 1, or 0. */
S(snap_drop,
  "#!lua flags=allow-oom\n"
  "if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end\n"
  "redis.call('DEL', KEYS[1])\n"
  "redis.call('SREM', KEYS[2], ARGV[2])\n"
  "return 1\n");

/* KEYS: the record, :snaps. ARGV: id, name, stale_taking. Is the record still id's (its
 * files are kept)? With stale_taking ('1'), one still `taking` goes (its worker restarted).
 * 1 keep, 0 gone. */
S(snap_check,
  "#!lua flags=allow-oom\n"
  "local v = redis.call('HMGET', KEYS[1], 'id', 'status')\n"
  "if v[1] ~= ARGV[1] then return 0 end\n"
  "if v[2] == 'taking' and ARGV[3] == '1' then\n"
  "  redis.call('DEL', KEYS[1])\n"
  "  redis.call('SREM', KEYS[2], ARGV[2])\n"
  "  return 0\n"
  "end\n"
  "return 1\n");

/* ==== the job guard: KEYS[1] = sf:job:{<team>}:<id>, KEYS[2] sf:team:{<team>}:gk, KEYS[3]
 * sf:team:{<team>}:gkb (worker/jobs.c): one slot, the team's ============================ */

/* ARGV: host, instance, ttl (s), reply topic, now (ms), the team's budget (bytes), force
 * ('1': a kill, which frees room, is never refused). Returns {'new'}, {'full', bytes}
 * (the team's kept replies fill its budget: nothing written), {'running'} (this process
 * runs it: it answers; a second reply topic is kept in `also`), {'done', reply} or
 * {'orphan', host} (a worker process that is gone ran it). Kept replies that expired give
 * their bytes back here (at most 256 a call: cheap, and the rest on the next ones). */
S(guard_begin,
    "#!lua\n" /* no allow-oom: a full Redis refuses it whole */
    "local v = redis.call('HMGET', KEYS[1], 'state', 'host', 'inst', 'reply', 'topic')\n"
    "if not v[1] then\n"
    "  local now = tonumber(ARGV[5])\n"
    "  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)\n"
    "  if #gone > 0 then\n"
    "    local freed = 0\n"
    "    for _, m in ipairs(gone) do\n"
    "      freed = freed + (tonumber(string.match(m, ':(%d+)$')) or 0)\n"
    "      redis.call('ZREM', KEYS[2], m)\n"
    "    end\n"
    "    if redis.call('DECRBY', KEYS[3], freed) <= 0 then redis.call('DEL', KEYS[3]) end\n"
    "  end\n"
    "  local used = tonumber(redis.call('GET', KEYS[3]) or '0')\n"
    "  if ARGV[7] ~= '1' and used >= tonumber(ARGV[6]) then return {'full', used} end\n"
    "  redis.call('HSET', KEYS[1], 'state', 'running', 'host', ARGV[1], 'inst', ARGV[2], "
    "'topic', ARGV[4])\n"
    "  redis.call('EXPIRE', KEYS[1], ARGV[3])\n"
    "  return {'new'}\n"
    "end\n"
    "if v[1] == 'done' then return {'done', v[4] or ''} end\n"
    "if v[3] == ARGV[2] then\n"
    "  if v[5] ~= ARGV[4] then redis.call('HSET', KEYS[1], 'also', ARGV[4]) end\n"
    "  return {'running'}\n"
    "end\n"
    "return {'orphan', v[2] or ''}\n");

/* ARGV: reply (may be empty: too large to keep), ttl (s), now (ms), the team's budget
 * (bytes), job id. A reply is kept while the team is under its budget (so it overshoots by
 * at most one reply per job in flight, and then its new jobs are refused); at the budget
 * it is not kept (a repeat is told so). Returns the other reply topic a repeat of the job
 * named while it ran, or ''. */
S(guard_done,
    "#!lua\n" /* no allow-oom: as before, a full Redis refuses it */
    "local also = redis.call('HGET', KEYS[1], 'also')\n"
    "local reply, n, ttl = ARGV[1], string.len(ARGV[1]), tonumber(ARGV[2]) * 1000\n"
    "if n > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[4]) then\n"
    "  reply, n = '', 0\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'state', 'done', 'reply', reply)\n"
    "redis.call('EXPIRE', KEYS[1], ARGV[2])\n"
    "if n > 0 then\n"
    "  redis.call('ZADD', KEYS[2], tonumber(ARGV[3]) + ttl, ARGV[5] .. ':' .. n)\n"
    "  redis.call('INCRBY', KEYS[3], n)\n"
    "  for i = 2, 3 do\n"
    "    if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end\n"
    "  end\n"
    "end\n"
    "return also or ''\n");

/* ==== unauthenticated writes: KEYS[1] sf:oauth:{kind}:addr:<a>, KEYS[2] its live zset === */

/* ARGV: per minute (this address), most alive, now (ms), ttl (ms), member. Admits one more
 * entry: {'ok', 0}, or refuses it without writing: {'rate', s} (the address's minute is
 * used up; s until it ends) or {'full', s} (most alive; s until the oldest expires). */
S(oauth_admit,
    "#!lua\n" /* no allow-oom: a full Redis refuses it whole */
    "local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "local n = tonumber(redis.call('GET', KEYS[1]) or '0')\n"
    "if n >= tonumber(ARGV[1]) then\n"
    "  local left = redis.call('TTL', KEYS[1])\n"
    "  if left < 1 then left = 1 end\n"
    "  return {'rate', left}\n"
    "end\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)\n"
    "if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then\n"
    "  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')\n"
    "  local left = math.ceil((tonumber(first[2]) - now) / 1000)\n"
    "  if left < 1 then left = 1 end\n"
    "  return {'full', left}\n"
    "end\n"
    "if redis.call('INCR', KEYS[1]) == 1 then redis.call('EXPIRE', KEYS[1], 60) end\n"
    "redis.call('ZADD', KEYS[2], now + ttl, ARGV[5])\n"
    "redis.call('PEXPIRE', KEYS[2], ttl)\n"
    "return {'ok', 0}\n");

/* KEYS[1] the live zset; ARGV: member. It no longer counts (used, or consumed). Frees. */
S(oauth_used,
    "#!lua flags=allow-oom\n"
    "return redis.call('ZREM', KEYS[1], ARGV[1])\n");

/* Every script above, for the store's tests (NULL-terminated). */
sf_redis_script *const sf_store_all[] = {
    &sf_store_rec_retire,
    &sf_store_rec_killing,
    &sf_store_rec_started,
    &sf_store_rec_touch,
    &sf_store_rec_set,
    &sf_store_rec_drop_dead,
    &sf_store_place_record,
    &sf_store_team_release,
    &sf_store_place_team,
    &sf_store_host_release,
    &sf_store_host_view,
    &sf_store_place_host,
    &sf_store_host_beat,
    &sf_store_hosts_drop,
    &sf_store_hosts_beat,
    &sf_store_tm_start,
    &sf_store_tm_paused,
    &sf_store_tm_resumed,
    &sf_store_tm_update,
    &sf_store_timers_set,
    &sf_store_timers_grow,
    &sf_store_timers_due,
    &sf_store_claim_put,
    &sf_store_claim_take,
    &sf_store_secret_create,
    &sf_store_secret_rotate,
    &sf_store_secret_delete,
    &sf_store_sess_put,
    &sf_store_sess_team,
    &sf_store_tpl_create,
    &sf_store_tpl_row,
    &sf_store_tpl_set,
    &sf_store_tpl_log,
    &sf_store_tpl_done,
    &sf_store_tpl_host_lost,
    &sf_store_tpl_join,
    &sf_store_tpl_del_mark,
    &sf_store_tpl_del_undo,
    &sf_store_tpl_del,
    &sf_store_snap_reserve,
    &sf_store_snap_finish,
    &sf_store_snap_find,
    &sf_store_snap_list,
    &sf_store_snap_delete,
    &sf_store_snap_drop,
    &sf_store_snap_check,
    &sf_store_guard_begin,
    &sf_store_guard_done,
    &sf_store_oauth_admit,
    &sf_store_oauth_used,
    NULL,
};
