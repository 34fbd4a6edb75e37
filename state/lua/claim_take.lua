#!lua flags=allow-oom
-- claim_take
--
-- Takes (reads and deletes) the claim: its bytes or nil. Frees: allow-oom.
local v = redis.call('GET', KEYS[3])
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[1], KEYS[3])
redis.call('HDEL', KEYS[2], KEYS[3])
return v
