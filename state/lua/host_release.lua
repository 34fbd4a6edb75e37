#!lua flags=allow-oom
-- host_release
--
-- KEYS: the host's res, sandboxes, timers. ARGV: id. The sandbox leaves the host: its
-- reservation (once: keyed by the id), its set, its timers. 1 when a reservation went.
local id = ARGV[1]
local n = redis.call('HDEL', KEYS[1], id)
redis.call('SREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], 't:' .. id, 'i:' .. id, 'd:' .. id)
return n
