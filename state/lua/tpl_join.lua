#!lua
-- tpl_join
--
-- KEYS: a team template, its `from` template (a key of the team's that does not exist when
-- from is a built-in). ARGV: host, deb ('1': the host has 'debian'), from. A host that
-- joined later: the template, ready, not at that host yet and built for several hosts (a
-- record with at:<host> fields), whose `from` is at that host (debian: the host has it; a
-- team template: ready there), becomes `building` there: {'build', job, run_steps,
-- start_cmd, ready_cmd, vcpu_milli, memory_mib, disk_mib}; else {'no'}.
local v = redis.call('HMGET', KEYS[1], 'status', 'job', 'from', 'run_steps', 'start_cmd', 'ready_cmd', 'vcpu_milli', 'memory_mib', 'disk_mib')
if v[1] ~= 'ready' or not v[2] or v[3] ~= ARGV[3] then return {'no'} end
local at = 'at:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], at) == 1 then return {'no'} end
local multi = false
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 3) == 'at:' then multi = true end
end
if not multi then return {'no'} end
if v[3] == 'debian' then
  if ARGV[2] ~= '1' then return {'no'} end
elseif v[3] ~= 'base' and redis.call('HGET', KEYS[2], at) ~= 'ready' then
  return {'no'}
end
redis.call('HSET', KEYS[1], at, 'building')
return {'build', v[2], v[4] or '[]', v[5] or '', v[6] or '', v[7] or '', v[8] or '', v[9] or ''}
