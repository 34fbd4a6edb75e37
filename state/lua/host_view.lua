#!lua flags=no-writes
-- host_view
--
-- KEYS: the host's hash, res. What placement reads of a host: {capacity, running, mem_mib,
-- vcpu_milli, tpl_debian, driver, ts ('' when absent), reserved count, MiB, vCPU milli,
-- disk_mib ('' when absent), caps ('' when absent: a worker from before them)}.
local v = redis.call('HMGET', KEYS[1], 'capacity', 'running', 'mem_mib', 'vcpu_milli', 'tpl_debian', 'driver', 'ts', 'disk_mib', 'caps')
local n, m, c = 0, 0, 0
for _, e in ipairs(redis.call('HVALS', KEYS[2])) do
  local a, b = string.match(e, '^(%d+) (%d+)')
  if a then n, m, c = n + 1, m + tonumber(a), c + tonumber(b) end
end
for i = 1, 9 do v[i] = v[i] or '' end
return {v[1], v[2], v[3], v[4], v[5], v[6], v[7], n, m, c, v[8], v[9]}
