#!lua flags=allow-oom
-- timers_due
--
-- KEYS: the host's timers. ARGV: now, max. Pops what is due (each fires once).
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
