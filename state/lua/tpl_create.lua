#!lua
-- tpl_create
--
-- KEYS: the template, its log, the team's names, the `from` template (unused for 'base'
-- and 'debian'). ARGV: team, name, from, job, now, vcpu_milli, memory_mib, disk_mib,
-- run_steps (JSON), start_cmd, ready_cmd, the team's most, the live hosts as JSON [{h,
-- driver, cap, running, deb, caps}]. A team template is built on every live host whose
-- driver builds templates (caps.builds) and that can
-- (one with 'debian' when from is debian; one where `from` is ready when it is a team
-- template): each holds its own copy, and placement uses the hosts that have it ready
-- (at:<host> = building for each). The lead (the host with the most room) writes the step
-- and the log. {'ok', start, ready, lead, host...}, {'exists', status}, {'quota', n},
-- {'nofrom'}, {'fromstatus', status}, {'pinned'}, {'nodebian'}, {'nohost'}.
local team, name, from, job, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local old = redis.call('HMGET', KEYS[1], 'status', 'job', 'host', 'start_cmd', 'ready_cmd')
if old[1] then
  if old[2] == job then
    local out = {'ok', old[4] or '', old[5] or '', old[3]} -- the same call, redelivered: to the same hosts again
    local h = redis.call('HGETALL', KEYS[1])
    for i = 1, #h, 2 do
      local at = string.sub(h[i], 1, 3) == 'at:' and string.sub(h[i], 4)
      if at and at ~= old[3] then table.insert(out, at) end
    end
    return out
  end
  if old[1] ~= 'failed' then return {'exists', old[1]} end
elseif redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[12]) then
  return {'quota', ARGV[12]}
end
local fkey, fhost, start, ready = nil, nil, ARGV[10], ARGV[11]
if from ~= 'base' and from ~= 'debian' then
  fkey = KEYS[4]
  local f = redis.call('HMGET', fkey, 'status', 'host', 'start_cmd', 'ready_cmd')
  if not f[1] then return {'nofrom'} end
  if f[1] ~= 'ready' then return {'fromstatus', f[1]} end
  -- a record from before templates were on several hosts: on its host only
  if redis.call('HEXISTS', fkey, 'at:' .. (f[2] or '')) == 0 then fhost = f[2] end
  -- its service is inherited unless the new template names its own
  if start == '' and ready == '' then start, ready = f[3] or '', f[4] or '' end
end
local hosts, best, bfree, deb = {}, nil, -1, false
for _, e in ipairs(cjson.decode(ARGV[13])) do
  local h = e.h
  local ok = e.caps and e.caps.builds
  if ok and fkey then
    ok = (fhost and fhost == h) or (not fhost and redis.call('HGET', fkey, 'at:' .. h) == 'ready')
  end
  if ok and from == 'debian' and not e.deb then ok, deb = false, true end
  if ok then
    table.insert(hosts, h)
    local free = e.cap - e.running
    if free > bfree then best, bfree = h, free end
  end
end
if not best then
  if fkey then return {'pinned'} end
  if deb then return {'nodebian'} end
  return {'nohost'}
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 'name', name, 'team', team, 'from', from, 'status', 'building', 'host', best, 'job', job, 'created', now, 'updated', now, 'vcpu_milli', ARGV[6], 'memory_mib', ARGV[7], 'disk_mib', ARGV[8], 'run_steps', ARGV[9], 'start_cmd', start, 'ready_cmd', ready)
local out = {'ok', start, ready, best}
for _, h in ipairs(hosts) do
  redis.call('HSET', KEYS[1], 'at:' .. h, 'building')
  if h ~= best then table.insert(out, h) end
end
redis.call('SADD', KEYS[3], name)
return out
