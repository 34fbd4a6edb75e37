#!lua flags=no-writes
-- tpl_row
--
-- KEYS: a team template. Its row for sandbox_template_list: {status, from, vcpu_milli,
-- memory_mib, disk_mib, failed_step, error, created, updated, step, hosts it was built
-- on, hosts where it is ready}, or {} when it is gone.
local v = redis.call('HMGET', KEYS[1], 'status', 'from', 'vcpu_milli', 'memory_mib', 'disk_mib', 'failed_step', 'error', 'created', 'updated', 'step')
if not v[1] then return {} end
local nh, nr = 0, 0
local h = redis.call('HGETALL', KEYS[1])
for i = 1, #h, 2 do
  if string.sub(h[i], 1, 3) == 'at:' then
    nh = nh + 1
    if h[i + 1] == 'ready' then nr = nr + 1 end
  end
end
if nh == 0 then nh = 1; if v[1] == 'ready' then nr = 1 end end
local out = {}
for i = 1, 10 do out[i] = v[i] or '' end
out[11], out[12] = tostring(nh), tostring(nr)
return out
