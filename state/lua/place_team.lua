#!lua
-- place_team
--
-- Placement's team step. KEYS: the team's limits, sandboxes, res (id -> "<host> <mem>
-- <vcpu> <disk or ->"), the template's record (sf:team:{t}:tpl:<template>; unused for
-- 'base' and 'debian'). ARGV: id, template, sandbox limit, host share %, fleet share %,
-- memory MiB, vCPU milli, the live hosts as JSON [{h, cap, used, mem, vcpu, rmem, rvcpu,
-- deb, driver, caps {layers, builds, snapshot_processes, debian}}] (mem, vcpu absent
-- until the worker publishes them; caps: scheduler/hosts.c), excluded hosts (JSON
-- array: hosts that refused it in this placement), the host it must go to ('' = any: a
-- snapshot's host). The team's own limits override the
-- three defaults. Checks the team's limits and shares, picks the host (the fewest of the
-- team's sandboxes, then the most room; a team template's: one where it is ready;
-- 'debian': a host that has it; 'desktop': a host whose driver runs it) and reserves the team's part: {'ok', host, mem, vcpu, disk, new ('1': reserved now,
-- '0': this id held it already: the same host)}, or {'quota', limit}, {'share', what,
-- limit}, {'hostshare', pct}, {'notemplate'}, {'tplstatus', status}, {'pinned'},
-- {'nodebhost'} (no live host's driver runs 'debian'), {'nodebian'}, {'nodskhost'} (none
-- runs 'desktop'), {'full'}, {'nohost'}.
local id, tmpl = ARGV[1], ARGV[2]
local mem, vcpu, disk = tonumber(ARGV[6]), tonumber(ARGV[7]), ''
local held = redis.call('HGET', KEYS[3], id)
if held then
  local h, m, c, d = string.match(held, '^(%S+) (%d+) (%d+) (%S+)$')
  if h then return {'ok', h, m, c, d == '-' and '' or d, '0'} end
end
local lim = redis.call('HMGET', KEYS[1], 'sandboxes', 'host_share_pct', 'fleet_share_pct')
local limit = tonumber(lim[1]) or tonumber(ARGV[3])
local hshare = tonumber(lim[2]) or tonumber(ARGV[4])
local fshare = tonumber(lim[3]) or tonumber(ARGV[5])
local tn, tmem, tvcpu, per = 0, 0, 0, {}
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all, 2 do
  local h, m, c = string.match(all[i + 1], '^(%S+) (%d+) (%d+)')
  if h then
    tn, tmem, tvcpu = tn + 1, tmem + tonumber(m), tvcpu + tonumber(c)
    local p = per[h] or {0, 0, 0}
    p[1], p[2], p[3] = p[1] + 1, p[2] + tonumber(m), p[3] + tonumber(c)
    per[h] = p
  end
end
tn = math.max(redis.call('SCARD', KEYS[2]), tn)
if tn >= limit then return {'quota', tostring(limit)} end
-- a team template: its shape, and the hosts where it is ready (at:<host>; a record from
-- before templates were built on several hosts: its one host); 'debian': a host that
-- has it
local pin, needdeb, tkey = nil, tmpl == 'debian', nil
local needdsk = tmpl == 'desktop'
if tmpl ~= 'base' and tmpl ~= 'debian' and tmpl ~= 'desktop' then
  tkey = KEYS[4]
  local t = redis.call('HMGET', tkey, 'status', 'host', 'memory_mib', 'vcpu_milli', 'disk_mib')
  if not t[1] then return {'notemplate'} end
  if t[1] ~= 'ready' then return {'tplstatus', t[1]} end
  mem, vcpu, disk = tonumber(t[3]) or mem, tonumber(t[4]) or vcpu, t[5] or ''
  if redis.call('HEXISTS', tkey, 'at:' .. (t[2] or '')) == 0 then pin = t[2] end
end
if ARGV[10] and ARGV[10] ~= '' then pin = ARGV[10] end
local function holds(h) -- from a snapshot: the host that holds it
  if pin then return h == pin end
  return not tkey or redis.call('HGET', tkey, 'at:' .. h) == 'ready'
end
local live, skip = cjson.decode(ARGV[8]), {}
for _, h in ipairs(cjson.decode(ARGV[9])) do skip[h] = true end
if #live == 0 then return {'nohost'} end
local hosts, fn, fmem, fvcpu, allmem, allvcpu, anydeb = {}, 0, 0, 0, true, true, false
local anydsk = false
for _, e in ipairs(live) do
  if e.caps and e.caps.debian then anydeb = true end
  if e.caps and e.caps.desktop then anydsk = true end
  if e.cap > 0 then
    fn = fn + e.cap
    if e.mem then fmem = fmem + e.mem else allmem = false end
    if e.vcpu then fvcpu = fvcpu + e.vcpu else allvcpu = false end
    table.insert(hosts, e)
  end
end
local function over(used, add, cap, pct) return (used + add) * 100 > cap * pct end
if tn > 0 then
  if over(tn, 1, fn, fshare) then -- a team's first sandbox is never refused for its share
    return {'share', 'sandboxes', tostring(math.floor(fn * fshare / 100))}
  end
  if allmem and fmem > 0 and over(tmem, mem, fmem, fshare) then
    return {'share', 'memory', tostring(math.floor(fmem * fshare / 100))}
  end
  if allvcpu and fvcpu > 0 and over(tvcpu, vcpu, fvcpu, fshare) then
    return {'share', 'vcpu', tostring(math.floor(fvcpu * fshare / 100))}
  end
end
local best, bn, bfree, fits = nil, 0, 0, false
for _, e in ipairs(hosts) do
  if not holds(e.h) or (needdeb and not (e.deb and e.caps and e.caps.debian)) or skip[e.h] or
     (needdsk and not (e.caps and e.caps.desktop)) then
  elseif e.used < e.cap and (not e.mem or e.rmem + mem <= e.mem) and
     (not e.vcpu or e.rvcpu + vcpu <= e.vcpu) then
    fits = true
    local p = per[e.h] or {0, 0, 0}
    local n, m, c = p[1], p[2], p[3]
    if n == 0 or (not over(n, 1, e.cap, hshare) and
        (not e.mem or not over(m, mem, e.mem, hshare)) and
        (not e.vcpu or not over(c, vcpu, e.vcpu, hshare))) then
      local free = (e.cap - e.used) / e.cap
      if e.mem and e.mem > 0 then free = math.min(free, (e.mem - e.rmem) / e.mem) end
      if e.vcpu and e.vcpu > 0 then free = math.min(free, (e.vcpu - e.rvcpu) / e.vcpu) end
      if not best or n < bn or (n == bn and free > bfree) then best, bn, bfree = e, n, free end
    end
  end
end
if not best then
  if (pin or tkey) and not fits then return {'pinned'} end
  if needdeb and not anydeb then return {'nodebhost'} end
  if needdsk and not anydsk then return {'nodskhost'} end
  if needdeb and not fits then return {'nodebian'} end
  if fits then return {'hostshare', tostring(hshare)} end
  return {'full'}
end
redis.call('HSET', KEYS[3], id, string.format('%s %d %d %s', best.h, mem, vcpu, disk == '' and '-' or disk))
redis.call('SADD', KEYS[2], id)
return {'ok', best.h, tostring(mem), tostring(vcpu), disk, '1'}
