#!lua
-- tm_start
--
-- ARGV: now, timeout_at, lifetime_at, idle_ms, auto_delete_s. While it starts or runs, the
-- record's fields: 1 (the caller then sets t: and i:), else 0. A new sandbox's fields need
-- room: not allow-oom.
local st = redis.call('HGET', KEYS[1], 'state')
if st ~= 'running' and st ~= 'creating' then return 0 end
local ad = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'timeout_at', ARGV[2], 'lifetime_at', ARGV[3], 'idle_ms', ARGV[4])
if ad > 0 then redis.call('HSET', KEYS[1], 'auto_delete_seconds', ad) end
return 1
