#!lua
-- place_host
--
-- Placement's host step. KEYS: the host's hash, res, sandboxes. ARGV: id, memory MiB,
-- vCPU milli, now, host_ttl. Re-checks what placement read: the host is live and the
-- sandbox fits; then reserves it there. {'ok', '1'} (reserved now), {'ok', '0'} (this id
-- held it already), {'again'} (it no longer fits or the host went silent).
local id, mem, vcpu = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('HEXISTS', KEYS[2], id) == 1 then return {'ok', '0'} end
local v = redis.call('HMGET', KEYS[1], 'capacity', 'running', 'mem_mib', 'vcpu_milli', 'ts')
local ts = tonumber(v[5])
if not ts or ts < tonumber(ARGV[4]) - tonumber(ARGV[5]) then return {'again'} end
local n, m, c = 0, 0, 0
for _, e in ipairs(redis.call('HVALS', KEYS[2])) do
  local a, b = string.match(e, '^(%d+) (%d+)')
  if a then n, m, c = n + 1, m + tonumber(a), c + tonumber(b) end
end
if math.max(n, tonumber(v[2]) or 0) >= (tonumber(v[1]) or 0) or
   (v[3] and m + mem > tonumber(v[3])) or (v[4] and c + vcpu > tonumber(v[4])) then
  return {'again'}
end
redis.call('HSET', KEYS[2], id, string.format('%d %d', mem, vcpu))
redis.call('SADD', KEYS[3], id)
return {'ok', '1'}
