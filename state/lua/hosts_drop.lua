#!lua flags=allow-oom
-- hosts_drop
--
-- KEYS: sf:hosts. ARGV: host, cutoff (ms). The host leaves the live hosts if its last
-- heartbeat is still older than cutoff: 1, else 0 (it came back).
local ts = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not ts or ts >= tonumber(ARGV[2]) then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])
